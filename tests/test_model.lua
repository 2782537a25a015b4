-- The cost model (tuner/model.lua): the fit recovers known coefficients from
-- a synthetic tuning log (a per-job constant added, which the fit must take
-- out), the ranking and the planner's margin rule, and the model lines of a
-- tuned table round-tripping through gen/export.lua's parser, which refuses a
-- malformed model naming its line. Pure Lua: runs on lua5.4 and LuaJIT.
package.path = "tests/?.lua;./?.lua;./gen/?.lua;" .. package.path
local T = require("check")
local model = require("tuner.model")
local facts = require("facts")
local tlog = require("tuner.log")
local export = require("export")
-- tuner/tuned.lua's format (it needs LuaJIT's FFI through tuner/sys.lua): rows, model lines, end.
local tuned = {}
function tuned.row_line(r)
  return table.concat({ r.shape, r.bucket, r.key, r.splits, r.threads, "1.0", "1.000", "1.0", r.name, "-" }, "\t")
end
function tuned.format(header, rows, m)
  local out = { header }
  for _, r in ipairs(rows) do out[#out + 1] = tuned.row_line(r) .. "\n" end
  if m then for _, l in ipairs(model.lines(m)) do out[#out + 1] = l .. "\n" end end
  out[#out + 1] = ("end\t%d\n"):format(#rows)
  return table.concat(out)
end

local nf = #facts.MODEL_FEATURES
-- Known coefficients: distinct, of both signs.
local truth = {}
for i = 1, nf do truth[i] = ((i * 37) % 11 - 5) / 10 end

-- A synthetic log: shapes of varied G, D, dtype, batch, q_len, layout; every
-- configuration of a small grid per job; time = exp(truth . features + the job's constant).
local shapes = {
  "b1.hq32.hkv8.d128.qbf16.kvbf16.obf16.causal.bhsd", "b1.hq4.hkv1.d64.qf32.kvf16.of32.causal.bhsd",
  "b4.hq16.hkv16.d64.qf32.kvf32.of32.mask.bshd", "b2.hq24.hkv4.d96.qf16.kvi8.of16.causal.paged",
  "b8.hq8.hkv1.d256.qf32.kvbf16.of32.causal.bhsd.t4", "b1.hq12.hkv2.d128.qf32.kvf32.of32.full.bhsd.t2",
  "b3.hq6.hkv3.d80.qf16.kvf16.of16.causal.bshd.t3", "b16.hq32.hkv2.d32.qf32.kvfp8.of32.causal.paged",
  "b2.hq2.hkv1.d48.qbf16.kvbf16.obf16.mask.bhsd.t8",
}
local lines, nobs = { tlog.COMMENT }, 0
for si, sig in ipairs(shapes) do
  local s = assert(facts.parse_signature(sig), sig)
  local G = s.n_q_heads / s.n_kv_heads
  for _, len in ipairs { 200, 1024, 5000 } do
    local job_const = si * 0.7 + len / 1000
    for _, isa in ipairs { 0, 1, 2, 3, 4 } do
      for _, chunk in ipairs { 32, 64, 128, 256, 512 } do
        for tile = 1, G do
          if G % tile == 0 and tile <= facts.isas[isa].max_tile then
            for _, splits in ipairs { 1, 2, 3, 8 } do
              for _, threads in ipairs { 1, 2, 4 } do
                local c = { chunk = chunk, tile = tile, isa = isa, splits = splits, threads = threads }
                local x = model.features(s, len, c)
                local y = job_const
                for i = 1, nf do y = y + truth[i] * x[i] end
                local us = math.exp(y)
                lines[#lines + 1] = table.concat({ "build1", sig, 1024, len, "cold", "quick", model.config_text(c), "-",
                  "ok", ("%.17g"):format(us), ("%.17g"):format(us), "synthetic" }, "\t")
                nobs = nobs + 1
              end
            end
          end
        end
      end
    end
  end
end
-- a warm-cache line and a failed line are no part of the fit
lines[#lines + 1] = table.concat({ "build1", shapes[1], 1024, 1024, "warm", "quick", "c64.t4.s1.p1.i2", "-", "ok", "1.0",
  "1.0", "synthetic" }, "\t")
lines[#lines + 1] = table.concat({ "build1", shapes[1], 1024, 1024, "cold", "quick", "c64.t4.s1.p1.i2", "-",
  "failed: no", "-", "-", "synthetic" }, "\t")
-- a feature signature's line (window, softcap, ALiBi) is no part of the fit either
for _, tok in ipairs { ".w4096", ".softcap", ".alibi" } do
  lines[#lines + 1] = table.concat({ "build1", shapes[1] .. tok, 4096, 32768, "cold", "quick", "c64.t4.s1.p1.i2", "-",
    "ok", "1.0", "1.0", "synthetic" }, "\t")
end
local path = os.tmpname()
local fh = assert(io.open(path, "wb"))
fh:write(table.concat(lines, "\n"), "\n")
fh:close()

-- tlog.format writes times with one decimal; this log keeps full precision, so
-- the fit sees the exact synthetic times.
local obs = model.observations(path)
T.ok(#obs == nobs, ("the cold, ok lines are the observations: %d (want %d)"):format(#obs, nobs))
local m = model.fit(obs, 1e-12)
local worst, at = 0, 0
for i = 1, nf do
  local d = math.abs(m.coef[i] - truth[i])
  if d > worst then worst, at = d, i end
end
T.ok(worst < 1e-6, ("the fit recovers every coefficient (worst %s off by %.3g)"):format(facts.MODEL_FEATURES[math.max(at, 1)][1], worst))
T.ok(m.r2 > 0.999999, ("R^2 of an exact model is 1 (%.9f)"):format(m.r2))
T.ok(m.limits.chunk_min == 32 and m.limits.chunk_max == 512 and m.limits.splits_max == 8 and m.limits.threads_max == 4
  and m.limits.items_max == 8 * 64, "limits: the measured ranges of chunk, splits, threads and split items per thread")
local m2 = model.fit(model.observations(path), 1e-12)
local same = true
for i = 1, nf do same = same and m2.coef[i] == m.coef[i] end
T.ok(same, "the same log gives bit-identical coefficients")
-- the default ridge moves coefficients only along what the data hardly
-- determines: its predictions stay those of the truth
local md = model.fit(model.observations(path))
T.ok(md.r2 > 0.999, ("the default ridge predicts as well (R^2 %.6f)"):format(md.r2))

-- Ranking: the best candidate is the lowest score, ties in enumeration order, all valid.
local s = facts.parse_signature(shapes[1])
local top = model.rank(m, s, 4096, 2, 4, 5)
T.ok(#top == 5, "rank returns k candidates")
local ok_order = true
for i = 2, #top do ok_order = ok_order and top[i - 1].score <= top[i].score end
T.ok(ok_order, "rank sorts by score")
local all = model.candidates(m, s, 4096, 2, 4)
local best = math.huge
for _, c in ipairs(all) do
  best = math.min(best, model.score(m, model.features(s, 4096, c)))
  T.ok(c.chunk <= facts.MAX_CHUNK and 4 % c.tile == 0 and c.isa <= 2 and c.splits <= 8 and c.threads <= 4 and
    (c.splits == 1 or 8 * c.splits <= m.limits.items_max * c.threads), "candidate valid")
end
T.ok(top[1].score == best, "the first is the best of every candidate")
local h = { chunk = 256, tile = 4, isa = 2, splits = 1, threads = 4 }
-- decide's rule by brute force: the lowest score plus the move's margin (the
-- sum of the margin_* of the classes moved) among candidates within splits_up x
-- h's splits, taken when more than MODEL_MARGIN below h's score.
local function brute(mm, hh)
  local best, bp = nil, math.huge
  for _, c in ipairs(model.candidates(mm, s, 4096, 2, 4)) do
    if c.splits <= hh.splits * (4096 <= mm.limits.splits_up_len and mm.limits.splits_up or 1) then
      local g = 0
      if c.chunk ~= hh.chunk or c.tile ~= hh.tile or c.isa ~= hh.isa then g = g + mm.limits.margin_kernel end
      if c.splits ~= hh.splits then g = g + mm.limits.margin_splits end
      if c.threads ~= hh.threads then g = g + mm.limits.margin_threads end
      local p = model.score(mm, model.features(s, 4096, c)) + g
      if p < bp then best, bp = c, p end
    end
  end
  local hs = model.score(mm, model.features(s, 4096, hh))
  return bp < hs - facts.MODEL_MARGIN and model.config_text(best) or model.config_text(hh)
end
T.ok(m.limits.splits_up == 1 and m.limits.splits_up_len == 0 and m.limits.margin_kernel == 0,
  "a log without decisions: splits_up 1, splits_up_len 0, margins 0")
local pick, from_model = model.decide(m, s, 4096, 2, 4, h)
T.ok(model.config_text(pick) == brute(m, h) and from_model == (model.config_text(pick) ~= model.config_text(h)),
  "decide: the best within splits_up x the heuristic's splits, when more than MODEL_MARGIN better: " .. model.config_text(pick))
T.ok(pick.splits <= h.splits, "splits_up 1: no more splits than the heuristic's")
local mm = { coef = m.coef, limits = {} }
for k, v in pairs(m.limits) do mm.limits[k] = v end
mm.limits.splits_up, mm.limits.splits_up_len, mm.limits.margin_kernel = 8, 4096, 0.2
local p3 = model.decide(mm, s, 4096, 2, 4, h)
T.ok(model.config_text(p3) == brute(mm, h), "decide with a kernel margin and splits_up 8: " .. model.config_text(p3))
T.ok(p3.chunk == h.chunk and p3.tile == h.tile and p3.isa == h.isa or
  model.score(mm, model.features(s, 4096, p3)) + 0.2 < model.score(mm, model.features(s, 4096, h)) - facts.MODEL_MARGIN,
  "a kernel move only when it beats the kernel margin too")
T.ok(p3.splits > h.splits, "splits_up 8 up to splits_up_len: more splits than the heuristic's allowed (and taken here)")
mm.limits.splits_up_len = 4095
local p3b = model.decide(mm, s, 4096, 2, 4, h)
T.ok(model.config_text(p3b) == brute(mm, h) and p3b.splits <= h.splits, "beyond splits_up_len: no more splits than the heuristic's")
mm.limits.splits_up_len = 4096
-- splits_up and splits_up_len from the log's kept winners that raised the splits
local withd = model.observations(path)
withd.decisions = { { sig = shapes[1], shape = s, len = 3000, c = { splits = 4 }, h = { splits = 1 }, kept = true },
                    { sig = shapes[1], shape = s, len = 9000, c = { splits = 16 }, h = { splits = 1 }, kept = false },
                    { sig = shapes[1], shape = s, len = 5000, c = { splits = 1 }, h = { splits = 2 }, kept = true },
                    -- kept once at 7000 but rejected twice there (other builds): a fluke, not counted
                    { sig = shapes[1], shape = s, len = 7000, c = { splits = 8 }, h = { splits = 1 }, kept = true },
                    { sig = shapes[1], shape = s, len = 7000, c = { splits = 8 }, h = { splits = 1 }, kept = false },
                    { sig = shapes[1], shape = s, len = 7000, c = { splits = 2 }, h = { splits = 1 }, kept = false },
                    -- kept once, rejected once at 8000 on another shape: no majority, not counted
                    { sig = shapes[2], shape = s, len = 8000, c = { splits = 8 }, h = { splits = 1 }, kept = true },
                    { sig = shapes[2], shape = s, len = 8000, c = { splits = 4 }, h = { splits = 1 }, kept = false } }
local md2 = model.fit(withd, 1e-12)
T.ok(md2.limits.splits_up == 4 and md2.limits.splits_up_len == 3000, ("splits_up %g, splits_up_len %g: from the kept winner that raised the splits where most such verifications kept theirs"):format(md2.limits.splits_up, md2.limits.splits_up_len))
table.insert(withd.decisions, { sig = shapes[1], shape = s, len = 7000, c = { splits = 4 }, h = { splits = 1 }, kept = true })
table.insert(withd.decisions, { sig = shapes[1], shape = s, len = 7000, c = { splits = 2 }, h = { splits = 1 }, kept = true })
local md3 = model.fit(withd, 1e-12)
T.ok(md3.limits.splits_up == 8 and md3.limits.splits_up_len == 7000, ("splits_up %g, splits_up_len %g: kept in 3 of 5 verifications at 7000 counts"):format(md3.limits.splits_up, md3.limits.splits_up_len))
mm.limits.margin_kernel, mm.limits.margin_splits, mm.limits.margin_threads = 1e3, 1e3, 1e3
local p4, fm4 = model.decide(mm, s, 4096, 2, 4, h)
T.ok(not fm4 and p4 == h, "margins no prediction beats keep the heuristic's configuration")
mm.limits.margin_kernel, mm.limits.margin_splits, mm.limits.margin_threads, mm.limits.len_max = 0, 0, 0, 4095
local p5, fm5 = model.decide(mm, s, 4096, 2, 4, h)
T.ok(not fm5 and p5 == h, "a length beyond len_max keeps the heuristic's configuration")
T.ok(m.limits.len_max == 5000, "len_max: the longest measured length")
T.ok(m.limits.G_min == 1 and m.limits.G_max == 16 and m.limits.D_min == 32 and m.limits.D_max == 256 and m.limits.kvb_min == 1
  and m.limits.kvb_max == 4 and m.limits.rows_min == 1 and m.limits.rows_max == 64 and m.limits.q_min == 1 and m.limits.q_max == 8,
  "the shape variables' measured ranges")
mm.limits.len_max = 1e9
T.ok(model.covers(mm, s, 4096), "a shape inside the ranges is covered")
-- kv_dtypes: the sum of 2^kv_dtype over the fit's shapes; another KV dtype is not covered
local seen = {}
for _, o in ipairs(obs) do seen[o.shape.kv_dtype] = true end
local want = 0
for dt in pairs(seen) do want = want + 2 ^ dt end
T.ok(m.limits.kv_dtypes == want and want > 0, ("kv_dtypes: the measured KV dtypes (%g)"):format(m.limits.kv_dtypes))
local kd = mm.limits.kv_dtypes
mm.limits.kv_dtypes = kd - 2 ^ s.kv_dtype
local p7, fm7 = model.decide(mm, s, 4096, 2, 4, h)
T.ok(not model.covers(mm, s, 4096) and not fm7 and p7 == h, "a KV dtype the fit never measured keeps the heuristic's configuration")
mm.limits.kv_dtypes = kd
for _, n in ipairs(facts.MODEL_SHAPE_VARS) do
  local lo, hi = mm.limits[n .. "_min"], mm.limits[n .. "_max"]
  mm.limits[n .. "_min"] = model.vars(s, 4096, h)[n] + 0.5
  local p6, fm6 = model.decide(mm, s, 4096, 2, 4, h)
  T.ok(not model.covers(mm, s, 4096) and not fm6 and p6 == h, "a shape below " .. n .. "_min keeps the heuristic's configuration")
  mm.limits[n .. "_min"], mm.limits[n .. "_max"] = lo, model.vars(s, 4096, h)[n] - 0.5
  T.ok(not model.covers(mm, s, 4096), "a shape above " .. n .. "_max is not covered")
  mm.limits[n .. "_max"] = hi
end
-- calibrate: per class the quantile of measured minus predicted among the moves predicted better
local pairs_ = {}
for i = 1, 20 do pairs_[#pairs_ + 1] = { k = true, s = false, t = false, pred = -0.1, act = -0.1 + i / 100 } end
for i = 1, 3 do pairs_[#pairs_ + 1] = { k = false, s = true, t = false, pred = -0.2, act = 0.1 * i } end
pairs_[#pairs_ + 1] = { k = false, s = false, t = true, pred = 0.5, act = 0.0 }   -- predicted worse: no part of it
local _, info = model.calibrate({ limits = {} }, pairs_, 0.75)
T.ok(math.abs(info.kernel.margin - 0.15) < 1e-12 and info.kernel.n == 20, ("kernel margin: the 0.75 quantile 0.15 (%g)"):format(info.kernel.margin))
T.ok(info.splits.n == 3 and info.threads.n == 0 and info.splits.margin == info.threads.margin and info.splits.margin > 0,
  "classes with fewer than CAL_MIN_PAIRS moves take the quantile over all moves")
local flat = { coef = {}, limits = m.limits }
for i = 1, nf do flat.coef[i] = 0 end
local p2, fm2 = model.decide(flat, s, 4096, 2, 4, h)
T.ok(not fm2 and p2 == h, "a flat model keeps the heuristic's configuration")

-- Table round trip: rows, then the model lines, then the end line.
local header = "flashdecode tuned table 2\nlibrary\tx\ntemplates\tx\ntcc\tx\ncpu\tx\nfeatures\tx\n" .. export.COLUMNS .. "\n"
local rows = { { shape = shapes[1], bucket = 1024, key = "10256128042002220", splits = 1, threads = 2, median_us = 1,
                 gbps = 1, heuristic_us = 1, name = "r" } }
local text = tuned.format(header, rows, m)
local t = export.parse(text, "t.tsv")
same = t.model ~= nil
for i = 1, nf do same = same and t.model.coef[i] == m.coef[i] end
for _, n in ipairs(facts.MODEL_LIMITS) do same = same and t.model.limits[n] == m.limits[n] end
T.ok(same and #t.rows == 1, "the model lines round-trip exactly (%.17g)")
T.ok(export.parse(tuned.format(header, rows), "t.tsv").model == nil, "a table without model lines has no model")

-- Malformed model lines: refused, naming the line.
local function refused(mutate, want, name)
  local ok, err = pcall(export.parse, mutate(text), "t.tsv")
  T.ok(not ok and tostring(err):find(want, 1, true) ~= nil, name .. ": " .. tostring(err))
end
local first = 9   -- header 7 lines, one row, then the model
refused(function(x) return (x:gsub("model\tchunk2\t[^\n]*", "model\tchunk2\tnan")) end, "is not a finite number", "a NaN value")
refused(function(x) return (x:gsub("model\tchunk2\t[^\n]*", "model\tchunk2\t1e")) end, "t.tsv:" .. (first + 7) .. ":", "a cut exponent names its line")
refused(function(x) return (x:gsub("model\tchunk2\t", "model\tchunk3\t")) end, "model name 'chunk3'", "an unknown name")
refused(function(x) return (x:gsub("model\tchunk2\t[^\n]*\n", "")) end, "no coefficient for feature chunk2", "a missing feature")
refused(function(x) return (x:gsub("(model\tchunk\t[^\n]*\n)", "%1%1")) end, "given twice", "a repeated name")
refused(function(x) return (x:gsub("(model\tthreads_max\t[^\n]*\n)", "%1" .. tuned.row_line(rows[1]) .. "\n")) end,
  "a row after the model lines", "a row after the model")
refused(function(x) return (x:gsub("model\tisa_c\t([^\n]*)", "model\tisa_c\t%1\textra")) end, "has 4 fields", "a fourth field")

os.remove(path)
T.done()
