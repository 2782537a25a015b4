-- The shared facts (gen/facts.lua): the shape signature and fit check read
-- back and refused, the ISA records consistent, the fd_asm_args offsets, the
-- generated Python module current, and no hand-kept copy left in the tree
-- ("keep in sync" comments, isa digit tests).
package.path = "tests/?.lua;gen/?.lua;" .. package.path
local T = require("check")
local facts = require("facts")
local key = require("key")
local simd = require("simd")

local llama = { batch = 1, n_q_heads = 32, n_kv_heads = 8, head_dim = 128, q_dtype = 2, kv_dtype = 2,
                out_dtype = 2, mask_mode = 0, layout = 0 }
local LLAMA_SIG = "b1.hq32.hkv8.d128.qbf16.kvbf16.obf16.causal.bhsd"

-- A copy of t with the given fields changed.
local function with(t, changes)
  local c = {}
  for k, v in pairs(t) do c[k] = v end
  for k, v in pairs(changes) do c[k] = v end
  return c
end

-- Signature: written, read back, and every enum value of every enum field round-trips.
T.eq(facts.signature(llama), LLAMA_SIG, "signature of llama3-8b")
local back = facts.parse_signature(LLAMA_SIG)
for _, f in ipairs(facts.SIGNATURE) do
  T.eq(back and back[f[2]], llama[f[2]] or ((f.omit or f.flag) and 0 or nil), "signature reads back " .. f[2])
end
-- An optional field (q_len): left out at 0 and 1, written and read back above, refused when written at 1.
local q4 = with(llama, { q_len = 4 })
T.eq(facts.signature(q4), LLAMA_SIG .. ".t4", "q_len 4 is written")
T.eq((facts.parse_signature(LLAMA_SIG .. ".t4") or {}).q_len, 4, "q_len 4 reads back")
T.eq(facts.signature(with(llama, { q_len = 1 })), LLAMA_SIG, "q_len 1 is left out")
T.eq(facts.parse_signature(LLAMA_SIG .. ".t1"), nil, "q_len written at 1 is not canonical: refused")
T.eq(facts.parse_signature(LLAMA_SIG .. ".t4.x"), nil, "text after the last field is refused")
for _, f in ipairs(facts.SIGNATURE) do
  if f[3] then
    local bad = 0
    for v = 0, #facts[f[3]] do
      local s = with(llama, { [f[2]] = v })
      local sig = facts.signature(s)
      local io_only = f.io and not facts[f[3]][v].io
      if io_only then bad = bad + (sig == nil and 0 or 1)
      else bad = bad + ((sig and facts.parse_signature(sig) or {})[f[2]] == v and 0 or 1) end
    end
    T.eq(bad, 0, "every value of " .. f[2] .. " round-trips (or is refused for q/out)")
  end
end

-- The tokens of what changes a kernel's cost: window, softcap (only that it is
-- on: read back as SIGNATURE_ON), one per feature bit the executed shape keeps.
local feat = with(llama, { q_len = 4, window = 4096, softcap = 50, features = 1 + 2 })
local FEAT_SIG = LLAMA_SIG .. ".t4.w4096.softcap.alibi.sink_logits"
T.eq(facts.signature(feat), FEAT_SIG, "window, softcap and feature bits are written in order")
local fb = facts.parse_signature(FEAT_SIG) or {}
T.ok(fb.window == 4096 and fb.softcap == facts.SIGNATURE_ON and fb.features == 3 and fb.q_len == 4,
     "window, softcap placeholder and feature bits read back")
T.eq(facts.signature(fb), FEAT_SIG, "the placeholder softcap signs the same")
T.eq(facts.signature(with(llama, { window = 0, softcap = 0, features = 0, sink_tokens = 4 })), LLAMA_SIG,
     "a plain shape's signature is unchanged (sink_tokens is not part of it)")
for _, f in ipairs(facts.features) do
  local sig = facts.signature(with(llama, { features = f.bit }))
  if f.cleared then T.eq(sig, nil, "feature " .. f.name .. ": no token (the executed shape clears it)")
  else T.eq((facts.parse_signature(sig or "") or {}).features, f.bit, "feature " .. f.name .. " round-trips: " .. tostring(sig)) end
end
T.eq(facts.signature(with(llama, { features = 64 })), nil, "an unknown feature bit has no signature")
T.ok(facts.signature_has_features(fb) and not facts.signature_has_features(back), "feature tokens tell feature rows")
for _, bad in ipairs {
  LLAMA_SIG .. ".alibi.alibi", LLAMA_SIG .. ".sink_logits.alibi", LLAMA_SIG .. ".softcap.w4096",
  LLAMA_SIG .. ".w4096.t4", LLAMA_SIG .. ".softcap.softcap", LLAMA_SIG .. ".shared_kv", LLAMA_SIG .. ".rope",
  LLAMA_SIG .. ".w0", LLAMA_SIG .. ".w04096", LLAMA_SIG .. ".w", LLAMA_SIG .. ".softcap50", LLAMA_SIG .. ".alibi.",
  LLAMA_SIG .. "..alibi", LLAMA_SIG .. ".Alibi",
} do
  T.ok(facts.parse_signature(bad) == nil, "signature refused: " .. bad)
end

-- Signatures that are not one in canonical form are refused.
for _, bad in ipairs {
  LLAMA_SIG .. "x", LLAMA_SIG .. ".", "b01" .. LLAMA_SIG:sub(3), LLAMA_SIG:gsub("qbf16", "qfp8"),
  LLAMA_SIG:gsub("hkv8", "hkv7"), LLAMA_SIG:gsub("d128", "d1000"), LLAMA_SIG:gsub("d128", "d0"),
  LLAMA_SIG:gsub("causal", "causel"), LLAMA_SIG:gsub("%.bhsd", ""), "b1234567890" .. LLAMA_SIG:sub(3), "",
} do
  T.ok(facts.parse_signature(bad) == nil, "signature refused: " .. bad)
end

-- The fit check: each shared field, flags and the tile.
local plain = key.decode("10256128042002220")
T.ok(facts.misfit(plain, llama) == nil, "llama's AVX-512 key fits its shape")
for _, n in ipairs(facts.FIT_SAME) do
  local s = with(llama, { [n] = llama[n] == 0 and 1 or 0 })
  local why = facts.misfit(plain, s)
  T.ok(why and why:find(n, 1, true), "a different " .. n .. " misfits", why)
end
T.ok((facts.misfit(with(plain, { flags = facts.FLAG_LSE }), llama) or ""):find("flags"), "an lse key misfits a row")
T.ok((facts.misfit(with(plain, { group_tile = 3 }), llama) or ""):find("group tile 3"), "tile 3 misfits G 4")
T.ok(facts.misfit(with(plain, { isa = 0 }), llama) == nil, "the isa is no part of the fit")

-- ISA records: every vector record is complete and its fallback chain ends at portable C.
for isa = 0, #facts.isas do
  local r = facts.isas[isa]
  T.ok(r.name and r.enum and r.text and r.max_tile >= 1 and r.max_tile <= facts.MAX_TILE, "isa " .. isa .. " record")
  if isa > 0 then
    T.ok(r.W >= 8 and r.W % 4 == 0 and r.reg and r.nregs >= 16 and r.short, "isa " .. isa .. " vector geometry")
    T.ok(r.fallback >= 0 and r.fallback <= #facts.isas and r.fallback ~= isa, "isa " .. isa .. " falls back to another record")
    for _, n in ipairs(r.cpuid) do T.ok(facts.CPUID[n] ~= nil, "isa " .. isa .. " CPUID bit of " .. n) end
    T.eq(simd.vector(isa), true, "isa " .. isa .. " runs the micro-kernels")
  end
  for g in pairs(r.groups) do
    local known = false
    for _, n in ipairs(facts.GROUPS) do known = known or n == g end
    T.ok(known, ("isa %d group %s is one of GROUPS"):format(isa, g))
  end
  if r.head_lane_tile then
    T.eq(simd.head_lanes(isa, { T = r.head_lane_tile, QUANT = false }), true, "isa " .. isa .. " head-lane tile")
    T.eq(simd.head_lanes(isa, { T = r.head_lane_tile, QUANT = true }), false, "isa " .. isa .. " no head lanes for int8/fp8")
  end
end
T.eq(facts.isas[0].fallback, -1, "portable C is the last fallback")
-- One chain: every record's chain ends at portable C, and no two share a rank.
local ranks = {}
for isa = 0, #facts.isas do
  local d, steps = isa, 0
  while d > 0 and steps <= #facts.isas do d, steps = facts.isas[d].fallback, steps + 1 end
  T.eq(d, 0, "isa " .. isa .. "'s fallback chain ends at portable C")
  local r = facts.isa_rank(isa)
  T.ok(ranks[r] == nil, ("isa %d's rank %d is its own"):format(isa, r))
  ranks[r] = isa
  T.eq(facts.isa_within(facts.isas[isa].fallback >= 0 and facts.isas[isa].fallback or 0, isa), true,
       "isa " .. isa .. " may use its fallback")
end
T.eq(table.concat(facts.isas_upto(3), ","), "0,1,2,4,3", "AVX-512+BF16+VNNI has AVX-512+VNNI below it")
T.eq(table.concat(facts.isas_upto(4), ","), "0,1,2,4", "AVX-512+VNNI has no bf16 dot products")
T.eq(simd.vector(0), false, "portable C runs no micro-kernel")
T.eq(key.by_name.isa.max, #facts.isas, "the key's isa field spans the records")
T.eq(key.by_name.kv_dtype.max, #facts.dtypes, "the key's kv_dtype field spans the dtypes")

-- The float dtypes' codes (float_bits: sign, nonfinite, NaN bits, bias, largest finite, +Inf, quiet NaN):
-- IEEE f32, f16, bf16; fp8 e4m3 (no infinity, 0x7f NaN); fp8 e5m2, the upper byte of an f16.
local FLOAT_BITS = {
  f32 = { 0x80000000, 0x7f800000, 0x7fffff, 127, 0x7f7fffff, 0x7f800000, 0x7fc00000 },
  f16 = { 0x8000, 0x7c00, 0x3ff, 15, 0x7bff, 0x7c00, 0x7e00 },
  bf16 = { 0x8000, 0x7f80, 0x7f, 127, 0x7f7f, 0x7f80, 0x7fc0 },
  fp8 = { 0x80, 0x7f, 0x7f, 7, 0x7e, nil, 0x7f },
  e5m2 = { 0x80, 0x7c, 0x3, 15, 0x7b, 0x7c, 0x7e },
}
for d = 0, #facts.dtypes do
  local t, w = facts.float_bits(d), FLOAT_BITS[facts.dtypes[d].name]
  local got = t and { t.sign, t.nonfinite, t.man, t.bias, t.max, t.inf, t.nan }
  T.eq(got and table.concat(got, ",", 1, 5) .. "," .. tostring(t.inf) .. "," .. t.nan,
       w and table.concat(w, ",", 1, 5) .. "," .. tostring(w[6]) .. "," .. w[7], "float_bits of " .. facts.dtypes[d].name)
end
T.eq(facts.value(facts.dtypes, "e5m2"), 5, "fp8 e5m2 is fd_dtype 5, after e4m3")
T.eq(facts.dtypes[5].enum, "FD_FP8_E5M2", "fp8 e5m2's C name")

-- The template parameters come from the records.
local gen = require("generate")
for isa = 1, #facts.isas do
  local p = gen.params(("1025612804%d002220"):format(isa))
  T.eq(p.W, facts.isas[isa].W, "generate: isa " .. isa .. " W from its record")
  T.eq(p.ISA_NAME, facts.isas[isa].short, "generate: isa " .. isa .. " name from its record")
end

-- fd_asm_args: field i at 8 i, as gen/simd.lua reads it.
for i, f in ipairs(facts.ASM_ARGS) do T.eq(simd.ARG[f[2]], (i - 1) * 8, "fd_asm_args." .. f[2] .. " offset") end

-- A shell command's output.
local function sh(cmd)
  local p = io.popen(cmd)
  local out = p:read("*a")
  p:close()
  return out
end

-- python/flashdecode/_facts.py is what gen/build.lua writes now.
local tmp = os.tmpname()
os.remove(tmp)
sh("lua5.4 gen/build.lua python " .. tmp)
local want, have = io.open(tmp):read("*a"), io.open("python/flashdecode/_facts.py"):read("*a")
os.remove(tmp)
T.eq(have, want, "python/flashdecode/_facts.py is current (make regenerates it)")

-- No hand-kept copy left: no "keep in sync" comment, no isa digit test outside gen/facts.lua.
T.eq(sh("grep -rnil 'keep in sync\\|kept in sync' gen runtime templates tuner"), "", "no 'keep in sync' comment left")
T.eq(sh("grep -rn 'isa ==\\|ISA ==\\|ISA==\\|isa==' gen runtime | grep -v '^gen/facts.lua'"), "",
     "no isa == comparison in gen/ and runtime/")
T.done()
