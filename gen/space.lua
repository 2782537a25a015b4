-- The candidate space: which variants a shape may use. The tuner searches it,
-- `fdgen gen` writes all of it, and the planner's heuristic picks inside it.
local key = require("key")
local simd = require("simd")
local facts = require("facts")
local M = {}

-- Keys per chunk the tuner may try, up to facts.MAX_CHUNK (sc[] holds
-- group_tile * chunk floats on the stack: 256 KiB at tile 16, chunk 4096).
M.CHUNKS = { 32, 64, 128, 256, 512, 1024, 2048, 4096 }
M.SHORT_CHUNKS = { 16 }                -- tried for MHA (G = 1) too: one score row per chunk is cheap
M.MAX_TILE = 16                        -- largest group tile generated
assert(M.CHUNKS[#M.CHUNKS] <= facts.MAX_CHUNK, "space: a chunk above facts.MAX_CHUNK")

-- The chunks worth trying for G query heads per kv head, shortest first.
function M.chunks(G)
  local out = {}
  if G == 1 then for _, c in ipairs(M.SHORT_CHUNKS) do out[#out + 1] = c end end
  for _, c in ipairs(M.CHUNKS) do out[#out + 1] = c end
  return out
end

-- Group tiles for G query heads per kv head: divisors of G up to MAX_TILE.
function M.tiles(G)
  local t = {}
  for d = 1, math.min(G, M.MAX_TILE) do if G % d == 0 then t[#t + 1] = d end end
  return t
end

-- The shape fields given by name (dtypes, mask mode, layout): the enum fields
-- of the shape signature (gen/facts.lua).
M.ENUM_FIELDS = {}
for _, f in ipairs(facts.SIGNATURE) do if f[3] then M.ENUM_FIELDS[#M.ENUM_FIELDS + 1] = f[2] end end

local REQUIRED = { "name", "batch", "n_q_heads", "n_kv_heads", "head_dim", "kv_len" }

-- Check one shape of a shape set; errors name the shape and the field.
function M.check_shape(s, where)
  local function bad(field, why)
    error(("%s: shape %s: field %s: %s"):format(where, tostring(s.name or "?"), field, why), 0)
  end
  for _, f in ipairs(REQUIRED) do if s[f] == nil then bad(f, "is required") end end
  for _, f in ipairs { "batch", "n_q_heads", "n_kv_heads", "head_dim" } do
    if type(s[f]) ~= "number" or s[f] < 1 or s[f] ~= math.floor(s[f]) then bad(f, "must be a positive integer") end
  end
  if s.n_q_heads % s.n_kv_heads ~= 0 then bad("n_q_heads", "must be a multiple of n_kv_heads") end
  if type(s.kv_len) ~= "table" or #s.kv_len == 0 then bad("kv_len", "must be a non-empty list") end
  for _, f in ipairs(M.ENUM_FIELDS) do
    local ok, err = pcall(key.encode, { head_dim = 1, chunk = 1, [f] = s[f] })
    if not ok then bad(f, err:gsub("^key: field %S+: ", "")) end
  end
  for _, f in ipairs { "window", "sink_tokens" } do
    if s[f] ~= nil and (type(s[f]) ~= "number" or s[f] < 0 or s[f] ~= math.floor(s[f])) then
      bad(f, "must be a non-negative integer")
    end
  end
  if s.softcap ~= nil and (type(s.softcap) ~= "number" or not (s.softcap >= 0) or s.softcap == math.huge) then
    bad("softcap", "must be a finite number, at least 0")
  end
  local ok, why = pcall(M.feature_bits, s.features)
  if not ok then bad("features", why) end
  if s.layout == "paged" or s.layout == facts.value(facts.layouts, "paged") then
    local ps, pow = s.page_size, facts.PAGE_SIZE_MIN
    while type(ps) == "number" and pow < ps do pow = pow * 2 end
    if ps ~= pow or ps > facts.PAGE_SIZE_MAX then
      bad("page_size", ("the paged layout needs a power of two %d..%d"):format(facts.PAGE_SIZE_MIN, facts.PAGE_SIZE_MAX))
    end
  end
end

-- Load a shape set file (a Lua chunk returning a list of shapes).
function M.load_shapes(path)
  local chunk, err = loadfile(path)
  if not chunk then error(err, 0) end
  local shapes = chunk()
  if type(shapes) ~= "table" then error(path .. ": error: a shape set returns a list of shapes", 0) end
  for i, s in ipairs(shapes) do M.check_shape(s, ("%s: entry %d"):format(path, i)) end
  return shapes
end

-- The key fields a shape fixes: those of the fit check (gen/facts.lua FIT_SAME).
function M.shape_fields(s)
  local t = {}
  for _, n in ipairs(facts.FIT_SAME) do t[n] = s[n] end
  return t
end

-- The fd_shape.features bits of a shape set's features field: nil (0), a
-- number, or a list of feature names (gen/facts.lua features) and numbers;
-- raises naming an unknown one.
function M.feature_bits(v)
  if v == nil then return 0 end
  if type(v) ~= "table" then v = { v } end
  local bits, seen = 0, {}
  for _, x in ipairs(v) do
    local b = type(x) == "number" and x or nil
    for _, f in ipairs(facts.features) do if f.name == x then b = f.bit end end
    if not b or b < 0 or b ~= math.floor(b) or b >= 2 * facts.features[#facts.features].bit then
      local names = {}
      for _, f in ipairs(facts.features) do names[#names + 1] = f.name end
      error(("unknown feature %s (one of %s)"):format(tostring(x), table.concat(names, ", ")), 0)
    end
    for _, f in ipairs(facts.features) do   -- each bit once, whether named or in a number
      if math.floor(b / f.bit) % 2 == 1 and not seen[f.bit] then seen[f.bit] = true; bits = bits + f.bit end
    end
  end
  return bits
end

-- A shape with its symbolic fields (dtypes, mask mode, layout) as key
-- digits and its features as fd_shape.features bits.
function M.numeric(s)
  local t = {}
  for k, v in pairs(s) do t[k] = v end
  for _, f in ipairs(M.ENUM_FIELDS) do
    t[f] = key.decode(key.encode { head_dim = 1, chunk = 1, [f] = s[f] })[f]
  end
  t.features = M.feature_bits(s.features)
  return t
end

-- The fields an inline spec may set: fd_shape's (gen/facts.lua SHAPE_FIELDS) and lse.
local function spec_fields()
  local out = {}
  for _, f in ipairs(facts.SHAPE_FIELDS) do out[#out + 1] = f[1] end
  out[#out + 1] = "lse"
  return out
end

-- The list of a spec value split at sep, numbers as numbers.
local function spec_list(v, sep)
  local out = {}
  for x in v:gmatch("[^" .. sep .. "]+") do out[#out + 1] = tonumber(x) or x end
  return out
end

-- Parse an inline shape "batch=1,n_q_heads=32,...,kv_len=1024:4096" into a
-- checked shape (features=alibi+sink_logits: names joined by +); a token
-- that is not field=value or an unknown field is refused naming it.
function M.parse_spec(spec)
  local s, known = { name = "inline" }, spec_fields()
  for tok in spec:gmatch("[^,]+") do
    local k, v = tok:match("^([%w_]+)=(.+)$")
    if not k then error(("--shape: %q is not field=value"):format(tok), 0) end
    local ok = false
    for _, f in ipairs(known) do ok = ok or f == k end
    if not ok then error(("--shape: field %s is unknown (one of %s)"):format(k, table.concat(known, ", ")), 0) end
    if k == "kv_len" then s.kv_len = spec_list(v, ":")
    elseif k == "features" then s.features = spec_list(v, "+")
    else s[k] = tonumber(v) or v end
  end
  M.check_shape(s, "--shape")
  return s
end

-- The isa digits with a kernel for head_dim D and group tile T (gen/simd.lua
-- decides; portable C always has one).
function M.isas(D, T)
  local out = { 0 }
  for isa = 1, #facts.isas do
    if pcall(simd.check, isa, D, T, function(f, why) error(f .. ": " .. why, 0) end) then out[#out + 1] = isa end
  end
  return out
end

-- The planes digits (MSD int8 scores) a shape's key may take on isa with
-- group tile: 0, and 2 and 3 where the key codec allows them (int8 K, an isa
-- with the vnni group, or 2 on one with the msd16 group at the tiles and
-- head_dims it serves) and they fit the head_dim.
function M.planes(s, isa, tile)
  local out, n = { 0 }, M.numeric(s)
  for _, p in ipairs { 2, 3 } do
    local f = { kv_dtype = n.kv_dtype, isa = isa, planes = p, group_tile = tile, head_dim = s.head_dim }
    if not key.planes_misfit(f) and facts.planes_fit(p, s.head_dim) then
      out[#out + 1] = p
    end
  end
  return out
end

-- Every key the tuner may try for a shape, in a deterministic order.
function M.variants(s)
  local out, G = {}, s.n_q_heads / s.n_kv_heads
  local flag_sets = { s.lse and key.FLAG_LSE or 0, key.FLAG_SPLIT }
  for _, chunk in ipairs(M.chunks(G)) do
    for _, tile in ipairs(M.tiles(G)) do
      for _, isa in ipairs(M.isas(s.head_dim, tile)) do
        for _, planes in ipairs(M.planes(s, isa, tile)) do
          for _, flags in ipairs(flag_sets) do
            local f = M.shape_fields(s)
            f.chunk, f.group_tile, f.flags, f.isa, f.planes = chunk, tile, flags, isa, planes
            out[#out + 1] = key.encode(f)
          end
        end
      end
    end
  end
  return out
end

return M
