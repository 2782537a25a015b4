-- Tiling key: round trip of every value of every field (int8 KV in the base, so
-- that per-channel K scales are valid), refusal of bad keys.
package.path = "tests/?.lua;gen/?.lua;" .. package.path
local T = require("check")
local key = require("key")

local base = { layout = 0, q_dtype = 0, kv_dtype = 3, out_dtype = 0, mask_mode = 0, flags = 0,
               isa = 0, group_tile = 4, head_dim = 128, chunk = 256, template = 1, k_per_channel = 0, beams = 0,
               planes = 0, precision = 0 }

-- A copy of base with one field changed.
local function with(field, v)
  local t = {}
  for k, x in pairs(base) do t[k] = x end
  t[field] = v
  return t
end

-- Every value of every field survives encode -> decode, alone and with others set.
for _, f in ipairs(key.fields) do
  local values = {}
  if f.max - f.min <= 99 then
    for v = f.min, f.max do values[#values + 1] = v end
  else
    values = { f.min, f.min + 1, 7, 64, 80, 96, 128, 256, f.max - 1, f.max }
    for v = 100, f.max, 97 do values[#values + 1] = v end
  end
  local bad = 0
  for _, v in ipairs(values) do
    -- MSD planes: 2 or 3 (1 is refused below), on the isa with int8 dot products
    local t = with(f.name, v)
    if f.name == "planes" and v > 0 then t.isa = 3 end
    -- fast precision: bf16 V on the isa with bf16 dot products
    if f.name == "precision" and v > 0 then t.isa, t.kv_dtype = 3, 2 end
    if not (f.name == "planes" and v == 1) then
      local ok, k = pcall(key.encode, t)
      if not ok then bad = bad + 1; T.ok(false, "encode " .. f.name .. "=" .. v, k)
      else
        local d = key.decode(k)
        for _, g in ipairs(key.fields) do
          local want = t[g.name]
          if d[g.name] ~= want then bad = bad + 1 end
        end
        T.eq(key.encode(d), k, ("re-encode %s=%d"):format(f.name, v))
      end
    end
  end
  T.eq(bad, 0, "round trip of every value of " .. f.name)
end

-- The DESIGN.md example.
local ex = "10256128040002220"
local d = key.decode(ex)
T.ok(d.chunk == 256 and d.head_dim == 128 and d.group_tile == 4 and d.kv_dtype == 2 and d.q_dtype == 2
     and d.out_dtype == 2 and d.layout == 0 and d.isa == 0 and d.flags == 0 and d.mask_mode == 0, "decode example key")
T.eq(key.encode { chunk = 256, head_dim = 128, group_tile = 4, q_dtype = "bf16", kv_dtype = "bf16",
                  out_dtype = "bf16" }, ex, "encode example by names")
T.ok(key.describe(ex):find("chunk 256, head_dim 128, group tile 4", 1, true) ~= nil, "describe in words")
T.eq(key.decode("0" .. ex).key, ex, "leading zeros are accepted and dropped")
if math.type then T.eq(key.decode(10256128040002220).key, ex, "Lua 5.4 integer key") end
T.eq(key.encode(with("chunk", 9999)), "19999128040000300", "largest chunk")
local top = with("precision", 1)
top.isa, top.kv_dtype = 3, 2
T.ok(#key.encode(top) == key.DIGITS, "keys with the top digit set have key.DIGITS digits")
T.ok(#key.encode(base) == key.by_name.template.pos + 1, "keys without feature digits end at the template digit")

-- The feature digits: per-channel K only with int8/fp8 K, in encode and decode; describe names both.
T.raises("field k_per_channel: per.channel K scales need int8/fp8 K", "per-channel K with f16 KV refused", key.encode,
         { head_dim = 64, chunk = 64, kv_dtype = "f16", k_per_channel = 1 })
T.raises("field k_per_channel", "a key with per-channel K and f32 KV does not decode", key.decode, "110064064040000000")
local kb = key.encode { head_dim = 64, chunk = 64, kv_dtype = "i8", k_per_channel = 1, beams = 1 }
T.eq(kb, "1110064064010000300", "per-channel K and beams digits 17 and 18")
T.ok(key.describe(kb):find("K scales per channel, beams", 1, true) ~= nil, "describe names both feature digits")
T.raises("field planes: MSD planes with per.channel K scales and beams", "planes with per-channel K and beams refused",
         key.encode, { head_dim = 64, chunk = 64, kv_dtype = "i8", k_per_channel = 1, beams = 1, planes = 3, isa = 3 })
T.ok(#key.encode { head_dim = 64, chunk = 64, kv_dtype = "i8", k_per_channel = 1, planes = 3, isa = 3 } == key.DIGITS - 1,
     "planes with per-channel K alone encode")

-- Each kind of bad key is refused with the field named.
T.raises("at most " .. key.DIGITS, "too many digits", key.decode, "1" .. key.encode(top))

-- The planes digit (MSD int8 scores): 2 or 3, int8 K, an isa with the vnni group; refused with the field named.
T.eq(key.encode { head_dim = 64, chunk = 64, kv_dtype = "i8", isa = "avx512bf16", planes = 3 }, "30010064064013000300",
     "planes digit 19")
T.raises("field planes: 1 plane is not served", "one plane", key.encode,
         { head_dim = 64, chunk = 64, kv_dtype = "i8", isa = 3, planes = 1 })
T.raises("field planes: MSD planes need int8 K, not kv_dtype fp8", "fp8 K", key.encode,
         { head_dim = 64, chunk = 64, kv_dtype = "fp8", isa = 3, planes = 3 })
T.raises("field planes: MSD planes need an isa with int8 dot products %(vpdpbusd%), not isa avx512", "isa avx512",
         key.encode, { head_dim = 64, chunk = 64, kv_dtype = "i8", isa = 2, planes = 2 })
T.raises("field planes", "a key with planes and f16 K does not decode", key.decode, "30010064064013000100")
-- AVX2 (the msd16 group): 2 planes as one int16 plane of q, group tiles 2 to 8, head_dim a multiple of 16.
local k16 = key.encode { head_dim = 128, chunk = 256, kv_dtype = "i8", isa = "avx2", group_tile = 4, planes = 2 }
T.eq(k16, "20010256128041000300", "avx2, 2 planes")
T.ok(key.describe(k16):find("MSD scores in one int16 plane", 1, true) ~= nil, "describe names the int16 plane",
     key.describe(k16))
T.eq(key.decode(key.encode { head_dim = 48, chunk = 64, kv_dtype = "i8", isa = 1, group_tile = 3, planes = 2 }).planes, 2,
     "avx2, tile 3, head_dim 48")
T.raises("field planes: isa avx2 serves 2 planes only %(q as one int16 plane, vpmaddwd%), not 3", "avx2, 3 planes",
         key.encode, { head_dim = 128, chunk = 64, kv_dtype = "i8", isa = 1, group_tile = 4, planes = 3 })
for _, t in ipairs { 2, 5, 8 } do
  T.eq(key.decode(key.encode { head_dim = 64, chunk = 64, kv_dtype = "i8", isa = 1, group_tile = t, planes = 2 }).group_tile,
       t, "avx2, 2 planes, tile " .. t)
end
T.raises("field planes: isa avx2 serves planes with group tiles 2 to 8 and head_dim a multiple of 16, not tile 1, head_dim 128",
         "avx2, tile 1", key.encode, { head_dim = 128, chunk = 64, kv_dtype = "i8", isa = 1, group_tile = 1, planes = 2 })
T.raises("not tile 9, head_dim 64", "avx2, tile 9", key.encode,
         { head_dim = 64, chunk = 64, kv_dtype = "i8", isa = 1, group_tile = 9, planes = 2 })
T.raises("not tile 4, head_dim 72", "avx2, head_dim 72", key.encode,
         { head_dim = 72, chunk = 64, kv_dtype = "i8", isa = 1, group_tile = 4, planes = 2 })
T.raises("field planes: MSD planes need an isa with int8 dot products %(vpdpbusd%), not isa c", "portable C",
         key.encode, { head_dim = 64, chunk = 64, kv_dtype = "i8", isa = 0, planes = 2 })
T.ok(key.describe("30010064064013000300"):find("MSD scores in 3 int8 planes", 1, true) ~= nil, "describe names the planes")

-- The precision digit (fast precision, bf16 weights in P.V): bf16 V, an isa
-- with the bf16 group, any tile (the head-lane tile too); refused with the
-- field named.
T.eq(key.encode { head_dim = 128, chunk = 256, kv_dtype = "bf16", q_dtype = "bf16", isa = "avx512bf16", group_tile = 4,
                  precision = 1 }, "100010256128043000220", "precision digit 20 (21-digit keys)")
T.raises("field precision: fast precision %(bf16 weights%) needs bf16 V, not kv_dtype f16", "f16 V", key.encode,
         { head_dim = 64, chunk = 64, kv_dtype = "f16", isa = 3, precision = 1 })
T.raises("field precision: fast precision needs an isa with bf16 dot products %(vdpbf16ps%), not isa avx512", "isa avx512",
         key.encode, { head_dim = 64, chunk = 64, kv_dtype = "bf16", isa = 2, precision = 1 })
T.eq(key.encode { head_dim = 64, chunk = 64, kv_dtype = "bf16", q_dtype = "bf16", isa = 3, group_tile = 16,
                  precision = 1 }, "100010064064163000220", "precision 1 with the head-lane tile 16")
T.raises("field precision", "a key with precision 1 and f16 V does not decode", key.decode, "100010064064043000100")
T.raises("field precision: 2 is out of range", "precision 2", key.encode,
         { head_dim = 64, chunk = 64, kv_dtype = "bf16", isa = 3, precision = 2 })
T.ok(key.describe("100010256128043000200"):find("fast precision (bf16 weights)", 1, true) ~= nil,
     "describe names fast precision")
T.raises("not a decimal key", "letters", key.decode, "10256x28040002220")
T.raises("not a decimal key", "empty", key.decode, "")
T.raises("not a decimal key", "negative", key.decode, "-10256128040002220")
T.raises("field head_dim", "head_dim 0", key.decode, "10256000040002220")
T.raises("field chunk", "chunk 0", key.decode, "10000128040002220")
T.raises("field group_tile", "group tile 0", key.decode, "10256128000002220")
T.raises("field q_dtype", "q dtype digit out of range", key.decode, "10256128040002250")
T.raises("field kv_dtype", "kv dtype digit out of range", key.decode, "10256128040002920")
T.raises("field out_dtype", "out dtype digit out of range", key.decode, "10256128040005220")
T.raises("field mask_mode", "mask mode digit out of range", key.decode, "10256128040032220")
T.raises("field layout", "layout digit out of range", key.decode, "10256128040002223")
T.raises("field isa", "isa digit out of range", key.decode, "10256128049002220")
T.raises("field flags", "reserved flag bit", key.decode, "10256128040402220")
T.raises("field template", "template 0", key.decode, "256128040002220")
T.raises("field template", "template 2", key.decode, "20256128040002220")
T.raises("field head_dim", "encode head_dim 0", key.encode, with("head_dim", 0))
T.raises("field chunk", "encode chunk 0", key.encode, with("chunk", 0))
T.raises("field chunk", "encode chunk 10000", key.encode, with("chunk", 10000))
T.raises("field group_tile", "encode group tile 0", key.encode, with("group_tile", 0))
T.raises("field group_tile", "encode group tile 100", key.encode, with("group_tile", 100))
T.raises("field kv_dtype", "encode unknown dtype name", key.encode, with("kv_dtype", "f64"))
T.raises("field head_dim is required", "encode without head_dim", key.encode, { chunk = 64 })
T.raises("unknown field 'colour'", "encode unknown field", key.encode, with("colour", 1))
T.raises("decimal strings", "float key refused", key.decode, 1.5)
T.done()
