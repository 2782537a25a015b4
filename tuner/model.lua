-- The cost model: a linear model of log(time) fitted on the tuning log's
-- measurements, which ranks configurations for a shape the table has no row
-- for. Its features are gen/facts.lua MODEL_FEATURES (C evaluates the same
-- text: runtime/model.c). Each measured job (build, shape, bucket, length,
-- stage: one batch of configurations timed together) has its own mean taken
-- out of log(time) and of every feature, so the fit explains only how the
-- configuration moves the time within a job, never how jobs differ. Ridge
-- least squares (a small penalty on each standardized feature), solved here:
-- the same log gives the same coefficients. The planner's decision (M.decide)
-- leaves the heuristic's configuration only for a move whose predicted gain
-- beats the margin of its class, calibrated on the model's own
-- leave-one-shape-out errors (M.calibrate).
--   luajit tuner/model.lua fit LOG [TABLE]       fit on LOG (cold cache), print the fit report
--                                                (R^2, leave-one-shape-out ranking), write the
--                                                model into TABLE when given
--   luajit tuner/model.lua predict TABLE SPEC [--threads N] [--max-isa I] [--top K] [--heuristic CONFIG]
--                                                the model's top configurations for inline shape SPEC;
--                                                with the heuristic's CONFIG (c256.t4.s1.p2.i3), also
--                                                the planner's decision (M.decide)
local M = {}
local modname = ...

local function setup()
  local src = debug.getinfo(1, "S").source:gsub("^@", "")
  local root = src:match("^(.*)/tuner/[^/]*$") or "."
  package.path = ("%s/?.lua;%s/gen/?.lua;%s/lua/?.lua;"):format(root, root, root) .. package.path
  return root
end
local ROOT = setup()
local facts = require("facts")
local tlog = require("tuner.log")
local stats = require("tuner.stats")

M.LAMBDA = 1e-3            -- ridge penalty per standardized feature (times the rows)
M.CHUNKS = {}              -- the chunks the planner may take: 32 .. MAX_CHUNK, powers of two
do local c = 32; while c <= facts.MAX_CHUNK do M.CHUNKS[#M.CHUNKS + 1] = c; c = c * 2 end end
M.MAX_TILE = 16            -- the largest group tile a candidate takes (gen/space.lua)
M.MAX_SPLITS = 16          -- the most splits a candidate takes
local features_of = facts.model_features()

-- FD_MAX_SPLIT_ITEMS from runtime/flashdecode.h (the planner's bound on split work items).
local function max_split_items()
  local fh = io.open(ROOT .. "/runtime/flashdecode.h", "r")
  local text = fh and fh:read("*a") or ""
  if fh then fh:close() end
  return tonumber(text:match("#define FD_MAX_SPLIT_ITEMS (%d+)")) or error("model: FD_MAX_SPLIT_ITEMS not found", 0)
end
M.MAX_SPLIT_ITEMS = max_split_items()

-- The model inputs (gen/facts.lua MODEL_VARS) of shape s (numeric fields, as
-- facts.parse_signature returns) at len keys for configuration c.
function M.vars(s, len, c)
  return { G = s.n_q_heads / s.n_kv_heads, D = s.head_dim, kvb = facts.elem_bytes(s.kv_dtype),
           rows = s.batch * s.n_kv_heads, len = len, q = math.max(1, s.q_len or 0),
           paged = facts.layouts[s.layout].paged and 1 or 0, chunk = c.chunk, tile = c.tile, isa = c.isa,
           splits = c.splits, threads = c.threads }
end

-- The features of shape s at len for configuration c.
function M.features(s, len, c) return features_of(M.vars(s, len, c)) end

-- A log config "c256.t4.s1.p2.i2" as { chunk, tile, splits, threads, isa }, or nil.
function M.parse_config(text)
  local c, t, s, p, i = text:match("^c(%d+)%.t(%d+)%.s(%d+)%.p(%d+)%.i(%d+)$")
  if not c then return nil end
  return { chunk = tonumber(c), tile = tonumber(t), splits = tonumber(s), threads = tonumber(p), isa = tonumber(i) }
end

-- A configuration as the log writes it.
function M.config_text(c) return ("c%d.t%d.s%d.p%d.i%d"):format(c.chunk, c.tile, c.splits, c.threads, c.isa) end

-- The cold-cache measurements of log path as observations { job, shape, sig,
-- len, config, c, y = log(median_us), x = features }, in file order; skip(sig)
-- true leaves a shape out. Rows of feature signatures (a window, softcap or
-- feature bit: facts.signature_has_features) are no part of the fit: the
-- model's inputs do not see them (a windowed row's len is its cache length,
-- not the keys it visits), so a feature shape without a row of its own is
-- ranked as its plain shape (README "Shapes the table never saw").
function M.observations(path, skip)
  local fh = assert(io.open(path, "rb"))
  local out = { decisions = {} }
  for line in fh:lines() do
    if line:sub(1, 10) == "#decision\t" then
      local d = M.parse_decision(line)
      if d and not (skip and skip(d.sig)) then out.decisions[#out.decisions + 1] = d end
    elseif line ~= "" and line:sub(1, 1) ~= "#" then
      local r = tlog.parse(line)
      local c = r and r.ok and r.cache == "cold" and r.median_us and r.median_us > 0 and M.parse_config(r.config)
      local s = c and facts.parse_signature(r.shape)
      if s and not facts.signature_has_features(s) and not (skip and skip(r.shape)) then
        out[#out + 1] = { job = table.concat({ r.build, r.shape, r.bucket, r.len, r.stage }, "\t"), sig = r.shape,
                          shape = s, len = r.len, bucket = r.bucket, stage = r.stage, build = r.build, config = r.config,
                          c = c, y = math.log(r.median_us), x = M.features(s, r.len, c), us = r.median_us }
      end
    end
  end
  fh:close()
  return out
end

-- A "#decision" line of the log (tuner/log.lua DECISION_FIELDS) as { sig,
-- shape, len, c (challenger), h (heuristic), act = log of the median paired
-- ratio challenger/heuristic }, or nil (warm cache, a malformed line, a
-- feature signature's).
function M.parse_decision(line)
  local f = {}
  for x in (line .. "\t"):gmatch("([^\t]*)\t") do f[#f + 1] = x end
  if #f ~= #tlog.DECISION_FIELDS + 1 or f[6] ~= "cold" then return nil end
  local c, h, med, len = M.parse_config(f[7]), M.parse_config(f[8]), tonumber(f[12]), tonumber(f[5])
  local s = c and h and med and med > 0 and len and facts.parse_signature(f[3])
  if not s or facts.signature_has_features(s) then return nil end   -- feature rows: no part of the fit
  return { sig = f[3], shape = s, len = len, c = c, h = h, act = math.log(med), kept = f[17] == "challenger" }
end

-- The observations obs (and their decisions) without shape sig's.
function M.without(obs, sig)
  local rest = { decisions = {} }
  for _, o in ipairs(obs) do if o.sig ~= sig then rest[#rest + 1] = o end end
  for _, d in ipairs(obs.decisions or {}) do if d.sig ~= sig then rest.decisions[#rest.decisions + 1] = d end end
  return rest
end

-- Solve A x = b (A n x n, symmetric positive definite after the ridge) by
-- Gaussian elimination with partial pivoting; A and b are overwritten.
local function solve(A, b, n)
  for k = 1, n do
    local p = k
    for i = k + 1, n do if math.abs(A[i][k]) > math.abs(A[p][k]) then p = i end end
    A[k], A[p], b[k], b[p] = A[p], A[k], b[p], b[k]
    local piv = A[k][k]
    if math.abs(piv) < 1e-300 then error("model: singular normal equations", 0) end
    for i = k + 1, n do
      local f = A[i][k] / piv
      if f ~= 0 then
        for j = k, n do A[i][j] = A[i][j] - f * A[k][j] end
        b[i] = b[i] - f * b[k]
      end
    end
  end
  local x = {}
  for k = n, 1, -1 do
    local s = b[k]
    for j = k + 1, n do s = s - A[k][j] * x[j] end
    x[k] = s / A[k][k]
  end
  return x
end

-- Observations with their job's mean taken out of y and x (new fields dy, dx).
local function demean(obs)
  local nf = #facts.MODEL_FEATURES
  local sum = {}
  for _, o in ipairs(obs) do
    local g = sum[o.job]
    if not g then g = { n = 0, y = 0, x = {} }; for j = 1, nf do g.x[j] = 0 end; sum[o.job] = g end
    g.n, g.y = g.n + 1, g.y + o.y
    for j = 1, nf do g.x[j] = g.x[j] + o.x[j] end
  end
  for _, o in ipairs(obs) do
    local g = sum[o.job]
    o.dy, o.dx = o.y - g.y / g.n, {}
    for j = 1, nf do o.dx[j] = o.x[j] - g.x[j] / g.n end
  end
end

-- The decisions that raised the splits and were kept, only at a shape and
-- length where most of the log's verifications that raised the splits kept
-- the challenger (over the builds the log holds): one lucky verification of
-- eight splits at 64k among five that rejected such moves taught the model
-- to take eight splits at 64k on a shape where they lose 5%.
local function split_winners(decisions)
  local votes = {}
  for _, d in ipairs(decisions or {}) do
    if d.c.splits > d.h.splits then
      local k = d.sig .. "\t" .. d.len
      local v = votes[k] or { kept = 0, n = 0 }
      v.n, v.kept, votes[k] = v.n + 1, v.kept + (d.kept and 1 or 0), v
    end
  end
  local out = {}
  for _, d in ipairs(decisions or {}) do
    local v = d.c.splits > d.h.splits and votes[d.sig .. "\t" .. d.len]
    if v and d.kept and 2 * v.kept > v.n then out[#out + 1] = d end
  end
  return out
end

-- Fit the model on observations obs: { coef (by feature index), limits (by
-- MODEL_LIMITS name), n, jobs, r2 (within jobs) }.
function M.fit(obs, lambda)
  lambda = lambda or M.LAMBDA
  local nf = #facts.MODEL_FEATURES
  demean(obs)
  local A, b = {}, {}
  for i = 1, nf do A[i] = {}; b[i] = 0; for j = 1, nf do A[i][j] = 0 end end
  local jobs, sst = {}, 0
  local lim = { chunk_min = math.huge, chunk_max = 0, splits_max = 0, threads_max = 0, items_max = 0,
                margin_kernel = 0, margin_splits = 0, margin_threads = 0, splits_up = 1, splits_up_len = 0, len_max = 0,
                kv_dtypes = 0 }   -- margins: M.calibrate
  for _, o in ipairs(obs) do
    local x = o.dx
    for i = 1, nf do
      local xi = x[i]
      if xi ~= 0 then
        local Ai = A[i]
        for j = i, nf do Ai[j] = Ai[j] + xi * x[j] end
        b[i] = b[i] + xi * o.dy
      end
    end
    sst = sst + o.dy * o.dy
    jobs[o.job] = true
    lim.chunk_min, lim.chunk_max = math.min(lim.chunk_min, o.c.chunk), math.max(lim.chunk_max, o.c.chunk)
    lim.splits_max, lim.threads_max = math.max(lim.splits_max, o.c.splits), math.max(lim.threads_max, o.c.threads)
    lim.len_max = math.max(lim.len_max, o.len)
    if not M.has_kv_dtype(lim, o.shape.kv_dtype) then lim.kv_dtypes = lim.kv_dtypes + 2 ^ o.shape.kv_dtype end
    local v = M.vars(o.shape, o.len, o.c)
    for _, n in ipairs(facts.MODEL_SHAPE_VARS) do
      lim[n .. "_min"], lim[n .. "_max"] = math.min(lim[n .. "_min"] or math.huge, v[n]), math.max(lim[n .. "_max"] or 0, v[n])
    end
    if o.c.splits > 1 then
      lim.items_max = math.max(lim.items_max, math.ceil(o.shape.batch * o.shape.n_kv_heads * o.c.splits / o.c.threads))
    end
  end
  for _, d in ipairs(split_winners(obs.decisions)) do   -- splits_up: the most a verified winner multiplied the heuristic's splits by
    lim.splits_up, lim.splits_up_len = math.max(lim.splits_up, math.floor(d.c.splits / d.h.splits)), math.max(lim.splits_up_len, d.len)
  end
  if #obs == 0 then error("model: no cold-cache measurements to fit", 0) end
  for i = 1, nf do for j = 1, i - 1 do A[i][j] = A[j][i] end end
  local n = #obs
  for i = 1, nf do A[i][i] = A[i][i] + lambda * (A[i][i] + 1e-9 * n) end   -- ridge on the standardized feature
  local coef = solve(A, b, nf)
  local sse = 0
  for _, o in ipairs(obs) do
    local p = 0
    for j = 1, nf do p = p + coef[j] * o.dx[j] end
    sse = sse + (o.dy - p) ^ 2
  end
  local njobs = 0
  for _ in pairs(jobs) do njobs = njobs + 1 end
  return { coef = coef, limits = lim, n = n, jobs = njobs, r2 = sst > 0 and 1 - sse / sst or 0 }
end

-- The model's score (predicted log time, up to the job's constant) of features x.
function M.score(model, x)
  local s = 0
  for j = 1, #facts.MODEL_FEATURES do s = s + model.coef[j] * x[j] end
  return s
end

-- Every candidate configuration for shape s at len keys, in the order
-- runtime/model.c enumerates them: isa digits 0.. ranking at most max_isa, chunks of M.CHUNKS within
-- the model's limits, tiles dividing G (up to M.MAX_TILE and the isa's
-- max_tile), splits 1..the bound, threads 1..the bound; more than one split
-- only within items_max split items per thread.
function M.candidates(model, s, len, max_isa, threads)
  local out, G, rows = {}, s.n_q_heads / s.n_kv_heads, s.batch * s.n_kv_heads
  local L = model.limits
  local smax = math.min(M.MAX_SPLITS, L.splits_max, len, rows >= M.MAX_SPLIT_ITEMS and 1 or math.floor(M.MAX_SPLIT_ITEMS / rows))
  local tmax = math.min(threads, L.threads_max)
  -- the tiles, splits and threads of one isa and chunk
  local function add(isa, chunk)
    for tile = 1, math.min(G, M.MAX_TILE, facts.isas[isa].max_tile) do
      if G % tile == 0 then
        for splits = 1, math.max(1, smax) do
          for th = 1, math.max(1, tmax) do
            if splits == 1 or rows * splits <= L.items_max * th then
              out[#out + 1] = { chunk = chunk, tile = tile, isa = isa, splits = splits, threads = th }
            end
          end
        end
      end
    end
  end
  for isa = 0, #facts.isas do
    if facts.isa_within(isa, max_isa) then
      for _, chunk in ipairs(M.CHUNKS) do
        if chunk >= L.chunk_min and chunk <= L.chunk_max then add(isa, chunk) end
      end
    end
  end
  return out
end

-- The k best candidates (lowest score first; ties keep the enumeration order), each with .score.
function M.rank(model, s, len, max_isa, threads, k)
  local best = {}
  for _, c in ipairs(M.candidates(model, s, len, max_isa, threads)) do
    c.score = M.score(model, M.features(s, len, c))
    local i = #best + 1
    while i > 1 and c.score < best[i - 1].score do i = i - 1 end
    if i <= k then table.insert(best, i, c); if #best > k then best[#best] = nil end end
  end
  return best
end

-- The move classes of c from h: the kernel (chunk, tile or isa), the splits, the threads (each true when it differs).
function M.moves(c, h)
  return c.chunk ~= h.chunk or c.tile ~= h.tile or c.isa ~= h.isa, c.splits ~= h.splits, c.threads ~= h.threads
end

-- The margin (log time) a move from h to c must beat: the sum of the
-- model's margin_kernel, margin_splits and margin_threads over the classes it
-- moves (runtime/model.c takes the same sum): the model's error on each
-- class is a term of its own in the predicted change, so a move of several
-- classes can be overrated by each; 0 for h itself.
function M.margin(model, c, h)
  local L, m = model.limits, 0
  local k, sp, th = M.moves(c, h)
  if k then m = m + L.margin_kernel end
  if sp then m = m + L.margin_splits end
  if th then m = m + L.margin_threads end
  return m
end

-- The planner's decision (runtime/plan.c decide_bucket, runtime/model.c
-- fd_model_decide) for s at len given the heuristic's configuration h: the
-- candidate with the lowest score plus its margin from h (M.margin; ties keep
-- the enumeration order), taken when that is more than MODEL_MARGIN below h's
-- score, else h (h too outside the measured range: M.covers); returns the
-- configuration (with .score) and whether it is the model's.
-- Whether limits L's kv_dtypes holds KV dtype digit dt.
function M.has_kv_dtype(L, dt) return math.floor((L.kv_dtypes or 0) / 2 ^ dt) % 2 == 1 end

-- Whether shape s at len lies inside the model's measured range (len_max, a
-- measured KV dtype, the shape variables' min and max).
function M.covers(model, s, len)
  local L, v = model.limits, M.vars(s, len, { chunk = 1, tile = 1, isa = 0, splits = 1, threads = 1 })
  if len > L.len_max or not M.has_kv_dtype(L, s.kv_dtype) then return false end
  for _, n in ipairs(facts.MODEL_SHAPE_VARS) do
    if v[n] < L[n .. "_min"] or v[n] > L[n .. "_max"] then return false end
  end
  return true
end

function M.decide(model, s, len, max_isa, threads, h)
  if not M.covers(model, s, len) then return h, false end   -- beyond the measured shapes and lengths
  local best, bp = nil, math.huge
  for _, c in ipairs(M.candidates(model, s, len, max_isa, threads)) do
    if c.splits <= h.splits * (len <= model.limits.splits_up_len and model.limits.splits_up or 1) then
      c.score = M.score(model, M.features(s, len, c))
      local p = c.score + M.margin(model, c, h)
      if p < bp then best, bp = c, p end
    end
  end
  if best and bp < M.score(model, M.features(s, len, h)) - facts.MODEL_MARGIN then return best, true end
  return h, false
end

-- The model as table lines: "model" TAB name TAB value, features then limits.
function M.lines(model)
  local out = {}
  for i, f in ipairs(facts.MODEL_FEATURES) do
    out[#out + 1] = ("%s\t%s\t%.17g"):format(facts.MODEL_LINE, f[1], model.coef[i])
  end
  for _, n in ipairs(facts.MODEL_LIMITS) do
    out[#out + 1] = ("%s\t%s\t%.17g"):format(facts.MODEL_LINE, n, model.limits[n])
  end
  return out
end

-- A model from the values of its lines by name (gen/export.lua's, which the table parser uses); raises why.
function M.from_fields(fields) return require("export").model_from_fields(fields) end

-- Append to pairs the left-out shape sig's verified moves (the log's
-- decisions: challenger against heuristic in paired rounds) as judged by
-- model fitted without it: the move classes (M.moves), the predicted log-time
-- change and the measured one (the log of the median paired ratio).
local function add_pairs(pairs, model, decisions, sig)
  for _, d in ipairs(decisions or {}) do
    if d.sig == sig then
      local k, sp, th = M.moves(d.c, d.h)
      local pred = M.score(model, M.features(d.shape, d.len, d.c)) - M.score(model, M.features(d.shape, d.len, d.h))
      pairs[#pairs + 1] = { k = k, s = sp, t = th, pred = pred, act = d.act }
    end
  end
end

-- Append to pairs the moves of a quick job's list from its heuristic (its
-- first measurement, search.lua's phase 1) to each other configuration there,
-- as add_pairs does for verified moves (single quick measurements).
local function add_quick_pairs(pairs, model, list)
  local h = list[1]
  local hs = M.score(model, h.x)
  for i = 2, #list do
    local o = list[i]
    local k, sp, th = M.moves(o.c, h.c)
    pairs[#pairs + 1] = { k = k, s = sp, t = th, pred = M.score(model, o.x) - hs, act = o.y - h.y }
  end
end

M.CAL_QUANTILE = 0.9       -- the quantile of a move class's optimism (measured minus predicted change) its margin takes
M.CAL_MIN_PAIRS = 10       -- fewer moves of a class than this: its margin is the quantile over every class's moves

-- Set model's margins (MODEL_LIMITS margin_*) from leave-one-shape-out
-- verified moves (M.loso's pairs): for each class, among the moves that move
-- it and that the model predicts more than MODEL_MARGIN faster, the
-- CAL_QUANTILE of the measured minus the predicted log-time change (how much
-- the model overrates such a move), at least 0; a class with fewer than
-- CAL_MIN_PAIRS such moves takes the quantile over all moves. Returns model
-- and per class { n, margin }.
function M.calibrate(model, pairs, q)
  q = q or M.CAL_QUANTILE
  local by, any = { kernel = {}, splits = {}, threads = {} }, {}
  for _, p in ipairs(pairs) do
    if p.pred < -facts.MODEL_MARGIN then
      local e = p.act - p.pred
      any[#any + 1] = e
      if p.k then table.insert(by.kernel, e) end
      if p.s then table.insert(by.splits, e) end
      if p.t then table.insert(by.threads, e) end
    end
  end
  local fallback = math.max(0, stats.quantile(any, q) or 0)
  local info = {}
  for _, cls in ipairs { "kernel", "splits", "threads" } do
    local list = by[cls]
    local m = #list >= M.CAL_MIN_PAIRS and math.max(0, stats.quantile(list, q)) or fallback
    model.limits["margin_" .. cls] = m
    info[cls] = { n = #list, margin = m }
  end
  return model, info
end

-- Leave-one-shape-out ranking quality on the quick jobs of obs: per shape,
-- fit without it, then in each of its quick jobs (at least 5 configurations)
-- rank the measured configurations by the model: the measured time of its
-- first over the job's best, and the same for the heuristic (the job's first
-- measurement, search.lua's phase 1). Returns per-shape and overall figures.
function M.loso(path, lambda)
  local all = type(path) == "table" and path or M.observations(path)
  local shapes, order = {}, {}
  for _, o in ipairs(all) do if not shapes[o.sig] then shapes[o.sig] = {}; order[#order + 1] = o.sig end end
  local out = { shapes = {}, pairs = {}, qpairs = {} }
  local regrets, hregrets = {}, {}
  for _, sig in ipairs(order) do
    local rest = M.without(all, sig)
    if #rest == 0 then goto next_shape end            -- a log of one shape: nothing to fit without it
    local model = M.fit(rest, lambda)
    add_pairs(out.pairs, model, all.decisions, sig)
    local jobs, jorder = {}, {}
    for _, o in ipairs(all) do
      if o.sig == sig and o.stage == "quick" then
        if not jobs[o.job] then jobs[o.job] = {}; jorder[#jorder + 1] = o.job end
        table.insert(jobs[o.job], o)
      end
    end
    local rs, hs = {}, {}
    for _, j in ipairs(jorder) do
      local list = jobs[j]
      if #list >= 5 then
        local best, pick, ps = math.huge, nil, math.huge
        for _, o in ipairs(list) do
          best = math.min(best, o.us)
          local sc = M.score(model, o.x)
          if sc < ps then ps, pick = sc, o end
        end
        rs[#rs + 1], hs[#hs + 1] = pick.us / best, list[1].us / best
        add_quick_pairs(out.qpairs, model, list)
      end
    end
    table.sort(rs); table.sort(hs)
    for _, r in ipairs(rs) do regrets[#regrets + 1] = r end
    for _, r in ipairs(hs) do hregrets[#hregrets + 1] = r end
    out.shapes[#out.shapes + 1] = { sig = sig, jobs = #rs, median = rs[math.ceil(#rs / 2)], hmedian = hs[math.ceil(#hs / 2)],
                                    within5 = 0, r2 = model.r2 }
    for _, r in ipairs(rs) do if r <= 1.05 then out.shapes[#out.shapes].within5 = out.shapes[#out.shapes].within5 + 1 end end
    ::next_shape::
  end
  table.sort(regrets); table.sort(hregrets)
  local w5, hw5 = 0, 0
  for _, r in ipairs(regrets) do if r <= 1.05 then w5 = w5 + 1 end end
  for _, r in ipairs(hregrets) do if r <= 1.05 then hw5 = hw5 + 1 end end
  out.jobs, out.within5, out.hwithin5 = #regrets, w5, hw5
  out.median, out.hmedian = regrets[math.ceil(#regrets / 2)], hregrets[math.ceil(#hregrets / 2)]
  return out
end

-- The model the table carries: fitted on obs, its margins calibrated on the
-- log's verified moves of the shapes left out in turn (M.loso's pairs: the
-- paired-round medians of the tuner's decisions; the quick jobs' single runs
-- (qpairs) are too noisy: their 0.9 quantiles of 0.3-0.4 would block every
-- move); returns the model, the leave-one-shape-out figures and the margins'
-- per-class info.
function M.fit_calibrated(obs, lambda)
  local model = M.fit(obs, lambda)
  local loso = M.loso(obs, lambda)
  local _, info = M.calibrate(model, loso.pairs)
  return model, loso, info
end

-- The fit report as text lines.
function M.report(model, loso)
  local L = model.limits
  local out = { ("cost model: %d measurements in %d jobs, %d features; R^2 within jobs %.3f"):format(model.n, model.jobs,
    #facts.MODEL_FEATURES, model.r2),
    ("margins (the %.2f quantile of leave-one-shape-out overrating per move class): kernel %.3f, splits %.3f, threads "
     .. "%.3f; splits at most %d x the heuristic's; lengths up to %d"):format(M.CAL_QUANTILE, L.margin_kernel,
     L.margin_splits, L.margin_threads, L.splits_up, L.len_max) }
  if loso then
    out[#out + 1] = ("leave-one-shape-out on %d quick jobs: the model's first of the measured configurations is within 5%% "
      .. "of the job's best in %d (median %.3fx the best); the heuristic in %d (median %.3fx)"):format(loso.jobs,
      loso.within5, loso.median or 0, loso.hwithin5, loso.hmedian or 0)
    for _, s in ipairs(loso.shapes) do
      out[#out + 1] = ("  %-52s %4d jobs  model %.3fx  heuristic %.3fx  within 5%%: %d"):format(s.sig, s.jobs,
        s.median or 0, s.hmedian or 0, s.within5)
    end
  end
  return out
end

-- Write model into the tuned table at path (its model lines, valid or not, replaced); true when changed.
function M.write_into(path, model)
  local tuned = require("tuner.tuned")
  local files = require("files")
  local text = assert(files.read(path), path .. ": cannot read")
  local t = require("export").parse(text:gsub("\n" .. facts.MODEL_LINE .. "\t[^\n]*", ""), path)   -- the old model replaced
  return files.write_if_changed(path, tuned.format(t.header, t.rows, model))
end

local function main(a)
  local function usage()
    io.stderr:write("usage: luajit tuner/model.lua fit LOG [TABLE] | predict TABLE SPEC [--threads N] [--max-isa I] [--top K] [--heuristic CONFIG]\n")
    os.exit(2)
  end
  if a[1] == "fit" and a[2] then
    local model, loso = M.fit_calibrated(M.observations(a[2]))
    for _, l in ipairs(M.report(model, loso)) do print(l) end
    if a[3] then print(("%s: model %s"):format(a[3], M.write_into(a[3], model) and "written" or "unchanged")) end
  elseif a[1] == "predict" and a[2] and a[3] then
    local opt = { threads = 2, ["max-isa"] = 2, top = 5 }
    local h
    for i = 4, #a, 2 do
      local k = a[i]:match("^%-%-(.*)$")
      if k == "heuristic" then h = M.parse_config(a[i + 1] or "") or usage(); goto next_opt end
      if not k or not opt[k] or not tonumber(a[i + 1]) then usage() end
      opt[k] = tonumber(a[i + 1])
      ::next_opt::
    end
    local t = require("export").parse(assert(require("files").read(a[2]), a[2] .. ": cannot read"), a[2])
    if not t.model then io.stderr:write(a[2] .. ": the table carries no cost model\n"); os.exit(1) end
    local space = require("space")
    local s = space.numeric(space.parse_spec(a[3]))
    local lens = s.kv_len
    for _, len in ipairs(lens) do
      local b = 1
      while b < len do b = b * 2 end
      for i, c in ipairs(M.rank(t.model, s, math.min(b, len), opt["max-isa"], opt.threads, opt.top)) do
        print(("%d\t%d\t%s\t%.6f"):format(len, i, M.config_text(c), c.score))
      end
      if h then
        local pick, mine = M.decide(t.model, s, math.min(b, len), opt["max-isa"], opt.threads, h)
        print(("%d\tdecision\t%s\t%s"):format(len, M.config_text(pick), mine and "model" or "heuristic"))
      end
    end
  else usage() end
end

if modname ~= "tuner.model" and arg and arg[0] and arg[0]:match("model%.lua$") then main(arg) end
return M
