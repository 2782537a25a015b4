-- The benchmark's roofline rule (bench/roof.lua) with known numbers: the
-- compute ceiling 2 * element_bytes / (G / r_scores + G / r_pv), the bf16 dot
-- rate only for an ISA record with the bf16 group and bf16 q and K, int8 KV in
-- its real bytes, q_len in G, the ISA's lane width, an absent rate, and the
-- roof min(ceiling, bandwidth) with what bounds it. Pure Lua: lua5.4 and LuaJIT.
package.path = "tests/?.lua;gen/?.lua;./?.lua;" .. package.path
local T = require("check")
local facts = require("facts")
local roof = require("bench.roof")

local function near(got, want, name)
  return T.ok(got ~= nil and math.abs(got - want) <= 1e-9 * math.abs(want), name,
              ("got %s, want %s"):format(tostring(got), tostring(want)))
end

-- An ISA record with the bf16 group: the generator's own when it has one, else
-- a test record appended to the facts for this process only.
local bf16_isa, added
for d = 0, #facts.isas do
  if facts.isas[d].groups.bf16 then bf16_isa = facts.isas[d].name break end
end
if not bf16_isa then
  added = #facts.isas + 1
  facts.isas[added] = { name = "test_bf16", W = 16, groups = { fma = true, bf16 = true } }
  bf16_isa = "test_bf16"
end

local rates = { fma = 100, bf16 = 300, int8 = 600, lanes = 16 }
local function llama(dt, extra)
  local r = { n_q_heads = 32, n_kv_heads = 8, q_dtype = dt, kv_dtype = dt, isa = "avx512" }
  for k, v in pairs(extra or {}) do r[k] = v end
  return r
end

-- f32 FMA for scores and P.V: 2 * 2 / (4/100 + 4/100) = 50 GB/s.
local c = roof.ceiling(llama("bf16"), rates)
near(c.gbs, 50, "bf16 on avx512 (no bf16 group): f32 FMA ceiling 50")
T.eq(c.scores, "fma", "avx512: scores by f32 FMA")
T.eq(c.G, 4, "Llama G = 4")
-- bf16 dot scores: 2 * 2 / (4/300 + 4/100) = 75 GB/s.
c = roof.ceiling(llama("bf16", { isa = bf16_isa }), rates)
near(c.gbs, 75, "bf16 q and K on a bf16 record: ceiling 75")
T.eq(c.label, "bf16 dot + f32 FMA", "bf16 record: label")
near(c.r_scores, 300, "r_scores = bf16 rate")
near(c.r_pv, 100, "r_pv = f32 FMA rate")
-- The key digit works as well as the name.
near(roof.ceiling(llama("bf16", { isa = facts.value(facts.isas, bf16_isa) }), rates).gbs, 75, "isa by digit")
-- dtypes as enum values (2 = bf16).
near(roof.ceiling(llama(facts.value(facts.dtypes, "bf16"), { isa = bf16_isa }), rates).gbs, 75, "dtype by enum value")
-- bf16 K with f32 q, or f16 everything, on the bf16 record: f32 FMA.
near(roof.ceiling(llama("bf16", { isa = bf16_isa, q_dtype = "f32" }), rates).gbs, 50, "f32 q: f32 FMA")
near(roof.ceiling(llama("f16", { isa = bf16_isa }), rates).gbs, 50, "f16: f32 FMA")
-- The bf16 rate absent (no AVX512-BF16 here): f32 FMA, not 0.
near(roof.ceiling(llama("bf16", { isa = bf16_isa }), { fma = 100, lanes = 16 }).gbs, 50, "bf16 rate absent: f32 FMA")
-- int8 and fp8 KV in their real bytes: 2 * 1 / (8/100) = 25.
near(roof.ceiling(llama("i8", { q_dtype = "f32" }), rates).gbs, 25, "int8 KV: 1 byte")
near(roof.ceiling(llama("fp8", { q_dtype = "f32" }), rates).gbs, 25, "fp8 KV: 1 byte")
near(roof.ceiling(llama("f32"), rates).gbs, 100, "f32 KV: 4 bytes")
-- Falcon-40B (G = 16): 2 * 2 / (32/100) = 12.5; q_len 4 multiplies G.
near(roof.ceiling({ n_q_heads = 128, n_kv_heads = 8, q_dtype = "f16", kv_dtype = "f16", isa = "avx512" }, rates).gbs,
     12.5, "Falcon G = 16: 12.5")
c = roof.ceiling(llama("bf16", { q_len = 4 }), rates)
T.eq(c.G, 16, "q_len 4: G = 16")
near(c.gbs, 12.5, "q_len 4: 12.5")
-- Lane width: AVX2 (8 of 16 lanes) half, portable C (1 lane) a sixteenth.
near(roof.ceiling(llama("f16", { isa = "avx2" }), rates).gbs, 25, "avx2: half the lanes")
near(roof.ceiling(llama("f16", { isa = "c" }), rates).gbs, 50 / 16, "portable C: one lane")
near(roof.ceiling(llama("f16", { isa = "c", backend = "tcc" }), rates).gbs, 50 / 16, "portable C under tcc: one lane")
near(roof.ceiling(llama("f16", { isa = "c", backend = "cc" }), rates).gbs, 50, "portable C under cc (gcc vectorizes): full width")
near(roof.ceiling(llama("f16", { isa = "avx2", backend = "cc" }), rates).gbs, 25, "avx2 under cc: half the lanes")
near(roof.ceiling(llama("f16", { isa = "avx2" }), { fma = 100, lanes = 8 }).gbs, 50, "ymm probe: avx2 at full rate")
near(roof.ceiling(llama("f16", { isa = "gcc -O3" }), rates).gbs, 50, "unknown isa: probe width")
-- No FMA rate: no ceiling, the roof is the bandwidth.
T.eq(roof.ceiling(llama("f16"), { fma = 0 }), nil, "no FMA rate: no ceiling")
local r = roof.roof(llama("f16"), { fma = 0 }, 40)
T.ok(r.roof == 40 and r.bound == "memory", "no FMA rate: memory roof")
-- The roof: min(ceiling, bandwidth) and what bounds it.
r = roof.roof(llama("f16"), rates, 60)
T.ok(r.roof == 50 and r.bound == "f32 FMA", "bw 60 > ceiling 50: f32 FMA bound", r.bound)
r = roof.roof(llama("f16"), rates, 40)
T.ok(r.roof == 40 and r.bound == "memory", "bw 40 < ceiling 50: memory bound", r.bound)
r = roof.roof(llama("bf16", { isa = bf16_isa }), rates, 80)
T.ok(math.abs(r.roof - 75) < 1e-9 and r.bound == "bf16 dot + f32 FMA", "bw 80 > bf16 ceiling 75", r.bound)

-- MSD int8 scores (the key's planes digit): planes int8 products per multiply-add.
c = roof.ceiling(llama("i8", { planes = 3 }), rates)
near(c.gbs, 2 / (4 / 200 + 4 / 100), "int8 KV, 3 planes: scores at 600/3, P.V f32 FMA")
T.eq(c.label, "int8 dot x3 + f32 FMA", "3 planes: label")
T.eq(c.scores_label, "int8 dot x3", "3 planes: the scores' label")
near(roof.ceiling(llama("i8", { planes = 2 }), rates).r_scores, 300, "2 planes: 600/2")
near(roof.ceiling(llama("i8", { planes = 3 }), { fma = 100, lanes = 16 }).gbs, 25, "int8 rate absent: f32 FMA")
-- AVX2's MSD (one int16 plane of q, vpmaddwd): scores at the int16 madd rate, one pass whatever the planes digit.
c = roof.ceiling(llama("i8", { planes = 2, scores = "int16", isa = 1 }), { fma = 100, int16 = 160, lanes = 16 })
near(c.r_scores, 160 * 8 / 16, "int16 plane: the int16 rate at AVX2's 8 of the probe's 16 lanes")
T.eq(c.label, "int16 madd + f32 FMA", "int16 plane: label")
near(roof.ceiling(llama("i8", { planes = 2, scores = "int16", isa = 1 }), { fma = 100, lanes = 16 }).r_scores, 50,
     "int16 rate absent: f32 FMA")
-- P.V's arithmetic: int8 with the planes (MSD weights), bf16 (fast precision).
c = roof.ceiling(llama("i8", { planes = 3, pv = "int8" }), rates)
near(c.gbs, 2 / (8 / 200), "int8 scores and P.V, 3 planes")
T.eq(c.label, "int8 dot x3", "both int8: one label")
c = roof.ceiling(llama("bf16", { isa = bf16_isa, pv = "bf16" }), rates)
near(c.gbs, 4 / (8 / 300), "bf16 scores and P.V")
T.eq(c.pv, "bf16", "P.V by bf16 dot")
near(roof.ceiling(llama("bf16", { isa = bf16_isa, pv = "bf16" }), { fma = 100, lanes = 16 }).gbs, 50,
     "P.V bf16 without its rate: f32 FMA")

-- The kernel's own arithmetic from its key (the generator's rule): Llama bf16
-- on isa 3 with tiles of 2-12 heads scores by bf16 dot, one head (no direct
-- rows) and isa 4 (no bf16 dots) by f32 FMA; a planes digit by int8 dot; a
-- kernel scoring by FMA on a bf16 record gets the f32 FMA ceiling, not the
-- bf16 one.
local isa3 = facts.value(facts.isas, "avx512bf16")
if isa3 then
  T.eq(roof.kernel_arith("10256128043002220").scores, "bf16", "bf16, tile 4, isa 3: scores by bf16 dot")
  T.eq(roof.kernel_arith("10256128013002220").scores, "fma", "bf16, tile 1, isa 3: scores by f32 FMA")
  T.eq(roof.kernel_arith("10256128044002220").scores, "fma", "bf16, tile 4, isa 4: scores by f32 FMA")
  T.eq(roof.kernel_arith("10256128083002220").scores, "bf16", "bf16, tile 8, isa 3: scores by bf16 dot")
  local k = roof.kernel_arith("30010256128043002320")
  T.ok(k.scores == "int8" and k.planes == 3 and k.pv == nil, "int8 K/V, planes 3: scores by int8 dot, P.V by f32 FMA")
  k = roof.kernel_arith("20010256128043002320")
  T.ok(k.scores == "int8" and k.planes == 2 and k.pv == nil, "int8 K/V, planes 2: scores by int8 dot, P.V by f32 FMA")
  k = roof.kernel_arith("20010256128041002320")
  T.ok(k.scores == "int16" and k.planes == 2 and k.pv == nil, "int8 K/V, planes 2 on avx2: scores by int16 madd")
  near(roof.ceiling(llama("bf16", { isa = isa3, scores = "fma" }), rates).gbs, 50, "the kernel's FMA scores on isa 3: 50")
  T.eq(roof.kernel_arith("10256128043002220").pv, nil, "default precision: P.V by f32 FMA")
  T.eq(roof.kernel_arith("100010256128043002220").pv, "bf16", "precision digit 1: P.V by bf16 dot")
end
T.eq(roof.kernel_arith("not a key"), nil, "a bad key: nil")
T.eq(roof.kernel_arith(nil), nil, "no key: nil")

-- Each call held to the bandwidth sampled just before it: 1 GB per call at
-- 0.05, 0.04, 0.025 s is 20, 25, 40 GB/s against samples 40, 50, 50: halves
-- and 0.8, median 0.5; a 30 GB/s ceiling caps the samples: 0.667, 0.833,
-- 1.333, median 0.833; bad pairs are skipped; no pair gives nil.
local fr, n, q1, q3 = roof.call_fraction(1e9, { 0.05, 0.04, 0.025 }, { 40, 50, 50 })
near(fr, 0.5, "call fraction: median of 0.5, 0.5, 0.8")
T.eq(n, 3, "call fraction: 3 calls")
near(q1, 0.5, "call fraction: lower quartile (nearest rank) 0.5")
near(q3, 0.8, "call fraction: upper quartile (nearest rank) 0.8")
near(roof.call_fraction(1e9, { 0.05, 0.04, 0.025 }, { 40, 50, 50 }, 30), 2.5 / 3, "call fraction under a 30 GB/s ceiling")
near(roof.call_fraction(1e9, { 0.05, 0, 0.025 }, { 40, 50, 0 }), 0.5, "call fraction skips a zero time and a zero sample")
near(roof.call_fraction(1e9, { 0.05, 0.025 }, { 40, 50 }), (0.5 + 0.8) / 2, "call fraction: even count, mean of the middle two")
T.eq(roof.call_fraction(1e9, {}, {}), nil, "call fraction: no calls, nil")

-- Issue 18's verdict: the target's % of the call bandwidth, or ROOF_PCT % of
-- the roof where the ceiling is below the bandwidth at the calls.
T.eq(roof.ROOF_PCT, 85, "bound: the roof's share")
T.eq(roof.bound_met(80, 80, 80, 200, 50), true, "bound: the target's share of the bandwidth")
T.eq(roof.bound_met(80, 79.9, 99, 200, 50), false, "bound: below it, not capped: not met whatever the roof share")
T.eq(roof.bound_met(70, 40, 85, 44, 77), true, "bound: capped by the ceiling, 85% of the roof")
T.eq(roof.bound_met(70, 40, 84.9, 44, 77), false, "bound: capped, below 85% of the roof")
T.eq(roof.bound_met(70, nil, 90, 44, 77), false, "bound: no per-call fraction, not met")
T.eq(roof.bound_met(70, 40, nil, 44, 77), false, "bound: capped without a roof share, not met")
T.eq(roof.bound_met(70, 40, 90, nil, 77), false, "bound: no ceiling, not capped")

if added then facts.isas[added] = nil end
T.done()
