-- The roofline of a decode-attention run (bench/report.lua's roofline table),
-- in one place: which arithmetic a kernel uses, its compute ceiling in GB/s of
-- KV read and the roof min(ceiling, read bandwidth). Pure Lua (lua5.4 and
-- LuaJIT; tests/test_roof.lua checks it with known numbers).
--
-- Each K element feeds G score multiply-adds and each V element G P.V
-- multiply-adds, G = Hq / Hkv * q_len (query rows per K/V row). At r_scores and
-- r_pv multiply-adds per second, one (K, V) element pair takes
-- G / r_scores + G / r_pv seconds, so the kernel cannot read faster than
--     ceiling = 2 * element_bytes / (G / r_scores + G / r_pv)
-- (element_bytes the KV dtype's real size: 1 for int8 and fp8). r_pv is the
-- f32 FMA rate; r_scores is the bf16 dot-product rate when the kernel's ISA
-- record (gen/facts.lua isas[].groups) has the "bf16" group and q and K are
-- bf16, else the f32 FMA rate; a key with MSD planes (digit 19) computes
-- int8 scores at planes int8 products per multiply-add (r_scores = int8 rate /
-- planes), and run.pv names P.V's arithmetic where it is not f32 FMA. The rates are measured at the probe's vector
-- width (`lanes` f32 lanes); a kernel of an ISA with W lanes is credited
-- rate * W / lanes (same instruction rate, fewer lanes: portable C W = 1 under
-- tcc; the cc backend's gcc vectorizes portable C, so there it gets the full width).
local facts = require("facts")
local stats = require("tuner.stats")

local M = {}

-- The ISA record of a digit or name, or nil (vanilla, unknown).
function M.isa_record(isa)
  if type(isa) == "number" then return facts.isas[isa] end
  if type(isa) == "string" then
    local d = facts.value(facts.isas, isa)
    return d and facts.isas[d]
  end
  return nil
end

-- A dtype's name from a name or an enum value.
local function dtype_name(dt)
  if type(dt) == "number" then return facts.dtypes[dt] and facts.dtypes[dt].name end
  return dt
end

-- Bytes per KV element of a dtype (name or enum value).
function M.element_bytes(dt)
  local d = facts.value(facts.dtypes, dtype_name(dt))
  return d and facts.elem_bytes(d) or error("roof: unknown dtype " .. tostring(dt), 2)
end

-- The arithmetic of the scores of a run: "bf16" (vdpbf16ps) when the ISA record
-- has the bf16 group and q and K are bf16, else "fma" (f32 FMA).
function M.scores_arith(isa, q_dtype, kv_dtype)
  local rec = M.isa_record(isa)
  if rec and rec.groups and rec.groups.bf16 and dtype_name(q_dtype) == "bf16" and dtype_name(kv_dtype) == "bf16" then
    return "bf16"
  end
  return "fma"
end

-- The arithmetic of a kernel from its tiling key (digit string or nil), as
-- the generator decides it (gen/generate.lua params, gen/simd.lua): { scores
-- = "bf16" (vdpbf16ps), "int8" (MSD planes), "int16" (AVX2's MSD: one int16
-- plane of q by vpmaddwd) or "fma", planes = the planes
-- digit, pv = "bf16" (fast precision: key digit precision) or nil (f32
-- FMA; int8 V too: its P.V is f32 over the dequantized V)
-- }; nil for a key the generator does not take.
function M.kernel_arith(key_text)
  if not key_text then return nil end
  local ok, p = pcall(function() return require("generate").params(tostring(key_text)) end)
  if not ok or not p then return nil end
  local planes = p.FIELDS.planes or 0
  local int8 = planes > 0 and require("facts").isas[p.FIELDS.isa].groups.vnni
  return { scores = int8 and "int8" or planes > 0 and "int16" or p.DPBF16 and "bf16" or "fma", planes = planes,
           pv = (p.FIELDS.precision or 0) > 0 and "bf16" or nil }
end

-- The arithmetic kinds: the rate they run at (rates[rate]) and their name.
local ARITH = { fma = { rate = "fma", label = "f32 FMA" }, bf16 = { rate = "bf16", label = "bf16 dot" },
                int8 = { rate = "int8", label = "int8 dot" }, int16 = { rate = "int16", label = "int16 madd" } }
M.ARITH = ARITH

-- The arithmetic of a run's P.V: run.pv ("bf16", "int8") when given and its
-- rate measured, else "fma".
local function pv_arith(run, rates)
  local a = run.pv and ARITH[run.pv]
  if a and rates[a.rate] and rates[a.rate] > 0 then return run.pv end
  return "fma"
end

-- A kind's name with its plane count (MSD: each plane is one pass of int8 products).
local function arith_label(kind, planes)
  return ARITH[kind].label .. (kind == "int8" and planes > 1 and (" x" .. planes) or "")
end

-- G of a run or shape { n_q_heads, n_kv_heads, q_len (default 1) }: the query
-- rows per K/V row, so the multiply-adds each K element (and each V element) owes.
function M.group(run)
  return run.n_q_heads / run.n_kv_heads * math.max(1, run.q_len or 1)
end

-- The compute ceiling of a run. run: { n_q_heads, n_kv_heads, q_len (default
-- 1), q_dtype, kv_dtype, isa (digit or name; nil: the probe's full width, f32
-- FMA), backend ("tcc", "cc", ...), scores (the kernel's own scores
-- arithmetic, M.kernel_arith; nil: M.scores_arith's guess), planes (the key's MSD plane count: int8
-- scores at planes int8 multiply-adds per product), pv ("fma" default,
-- "bf16", "int8": P.V's arithmetic) }; rates: { fma, bf16, int8, int16 (nil:
-- absent), lanes (default 16) } in G multiply-adds/s. Returns { gbs = ceiling
-- GB/s, G, esz, scores = "bf16" | "int8" | "fma", pv, r_scores, r_pv, label
-- (e.g. "f32 FMA", "bf16 dot + f32 FMA", "int8 dot x3 + f32 FMA") }, or nil
-- without an FMA rate.
function M.ceiling(run, rates)
  if not rates.fma or rates.fma <= 0 then return nil end
  local G = M.group(run)
  local esz = M.element_bytes(run.kv_dtype)
  local rec = M.isa_record(run.isa)
  local lanes = rates.lanes or 16
  local W = rec and rec.W
  if W == 1 and run.backend == "cc" then W = nil end      -- gcc vectorizes portable C: the probe's width
  local scale = W and math.min(W, lanes) / lanes or 1
  local planes = run.planes or 0
  local scores = run.scores or M.scores_arith(run.isa, run.q_dtype, run.kv_dtype)
  if planes > 0 and scores ~= "int16" then scores = "int8" end   -- (int16: one plane, one pass)
  if scores ~= "fma" and not (rates[ARITH[scores].rate] and rates[ARITH[scores].rate] > 0) then scores = "fma" end
  local pv = pv_arith(run, rates)
  local per = function(kind) return kind == "int8" and math.max(planes, 1) or 1 end
  local r_scores = rates[ARITH[scores].rate] * scale / per(scores)
  local r_pv = rates[ARITH[pv].rate] * scale / per(pv)
  local gbs = 2 * esz / (G / r_scores + G / r_pv)
  local label = arith_label(scores, planes) .. (pv ~= scores and (" + " .. arith_label(pv, planes)) or "")
  return { gbs = gbs, G = G, esz = esz, scores = scores, pv = pv, r_scores = r_scores, r_pv = r_pv, label = label,
           scores_label = arith_label(scores, planes), pv_label = arith_label(pv, planes) }
end

-- The roof of a run at read bandwidth bw (GB/s): { roof = min(ceiling, bw),
-- bound = "memory" or the ceiling's label, ceiling = M.ceiling's table }; with
-- no FMA rate the roof is bw, bound "memory".
function M.roof(run, rates, bw)
  local c = M.ceiling(run, rates)
  if not c or c.gbs >= bw then return { roof = bw, bound = "memory", ceiling = c } end
  return { roof = c.gbs, bound = c.label, ceiling = c }
end

-- The median over a run's cold calls of the GB/s of each call over the read
-- bandwidth sampled just before it (with a ceiling: over min(ceiling, that
-- sample)), so each call is held to the bandwidth the machine had at that
-- moment. bytes: KV bytes one call reads; secs[i], bws[i]: call i's seconds
-- and its sample in GB/s. Returns the fraction (1 = at that bandwidth), the
-- number of calls and the lower and upper quartiles of the calls' fractions
-- (nearest rank: how far the calls spread), or nil when no call has a
-- positive time and sample.
function M.call_fraction(bytes, secs, bws, ceiling)
  local fr = {}
  for i = 1, math.min(#secs, #bws) do
    local t, bw = secs[i], bws[i]
    if t and bw and t > 0 and bw > 0 then
      local cap = (ceiling and ceiling > 0) and math.min(ceiling, bw) or bw
      fr[#fr + 1] = bytes / t * 1e-9 / cap
    end
  end
  if #fr == 0 then return nil end
  return stats.median(fr), #fr, stats.quantile(fr, 0.25), stats.quantile(fr, 0.75)
end

-- Issue 18's bounds are met at this % of the roof where the compute ceiling
-- measured in the run is below the bandwidth at the kernel's calls.
M.ROOF_PCT = 85

-- Whether a compute ceiling (GB/s) caps a kernel below the bandwidth at its
-- calls (call_bw, GB/s): both known and the ceiling lower.
function M.capped(ceiling, call_bw)
  return ceiling ~= nil and call_bw ~= nil and ceiling < call_bw
end

-- Whether a kernel row meets its bound of target_pct % of the bandwidth
-- sampled at its calls (pct_bw, the median over its calls), or, where its
-- ceiling (GB/s) is below that bandwidth (call_bw, GB/s), ROOF_PCT % of the
-- roof at its calls (pct_roof). False without a per-call fraction.
function M.bound_met(target_pct, pct_bw, pct_roof, ceiling, call_bw)
  if not pct_bw then return false end
  if pct_bw >= target_pct then return true end
  return M.capped(ceiling, call_bw) and pct_roof ~= nil and pct_roof >= M.ROOF_PCT or false
end

return M
