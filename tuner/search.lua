-- The search for one (shape, bucket) job, within a time budget:
--   1. the heuristic's configuration, quick (1 repetition) -> the run's cost;
--   2. quick pass over the kernels (chunk x group tile x ISA) at the
--      heuristic's splits and threads, nearest the heuristic first (and the
--      previous bucket's ranking of the same shape), as many as the budget allows;
--   3. quick pass over splits x threads for the best two kernels;
--   4. refine the best few (warm-up + several repetitions, median);
--   5. verify: the refined winner and the heuristic interleaved in paired
--      rounds, added in batches until tuner/stats.lua decides (win, lose, tie)
--      or the rounds cap is reached; the winner is kept only when the whole
--      confidence interval of its median per-round ratio to the heuristic lies
--      below 1 (within each bandwidth level when the rounds show a switch) and
--      its median time is not the higher, else the heuristic's configuration is.
-- The budget is spent on a virtual clock: each measurement, timed now or read
-- back from the log, costs its runs' medians plus a cache flush each, so a
-- resumed run takes exactly the decisions of the interrupted one.
local space = require("space")
local measure = require("tuner.measure")
local sys = require("tuner.sys")

local M = {}
M.REFINE_S = 0.25        -- timed seconds aimed at per refined configuration
M.VERIFY_S = 0.6         -- seconds aimed at per configuration in verification: the rounds cap (7 to 31)
M.MIN_ROUNDS = 6         -- the fewest rounds with a 95% sign-test interval (tuner/stats.lua)
M.LONG_S = 0.05          -- quick runs longer than this skip the warm-up (a run that long is its own)
M.FLUSH_S = 0.01         -- the virtual cost of a cache flush (and a plan), seconds

-- Integer clamp.
local function clamp(x, lo, hi) return math.max(lo, math.min(hi, x)) end

-- Split counts to try: 1, the heuristic's, powers of two up to 8 items per
-- thread (no piece shorter than 128 keys), and the count that fills the threads.
function M.split_choices(items, threads, len, h)
  local most = math.max(1, math.min(math.floor(8 * threads / items), math.floor(len / 128)))
  local out, seen = {}, {}
  local function add(s) if s >= 1 and s <= math.max(most, h) and not seen[s] then seen[s] = true; out[#out + 1] = s end end
  add(1); add(h); add(math.ceil(threads / items))
  local p = 2
  while p <= most do add(p); p = p * 2 end
  table.sort(out)
  return out
end

-- Thread counts to try: powers of two below the context's, and the context's.
function M.thread_choices(threads)
  local out, p = {}, 1
  while p < threads do out[#out + 1] = p; p = p * 2 end
  out[#out + 1] = threads
  return out
end

-- Index of v in list (nil when absent).
local function index_of(list, v)
  for i, x in ipairs(list) do if x == v then return i end end
end

-- Every kernel (chunk, tile, isa) of the shape, nearest the heuristic first;
-- kernels the prior ranking names come before the others, in its order.
function M.kernels(G, max_isa, h, prior)
  local tiles, out = space.tiles(G), {}
  for isa = 0, max_isa do
    for ci, chunk in ipairs(space.CHUNKS) do
      for ti, tile in ipairs(tiles) do
        local dist = math.abs(ci - (index_of(space.CHUNKS, h.chunk) or 3)) + math.abs(ti - (index_of(tiles, h.tile) or 1))
                     + math.abs(isa - h.isa)
        local k = { chunk = chunk, tile = tile, isa = isa }
        local name = ("c%d.t%d.i%d"):format(chunk, tile, isa)
        k.order = prior and prior[name] or (1000 + dist * 100 + #out)
        k.name = name
        out[#out + 1] = k
      end
    end
  end
  table.sort(out, function(a, b) return a.order < b.order end)
  return out
end

-- The kernel name of a config (as in kernels()).
local function kernel_name(c) return ("c%d.t%d.i%d"):format(c.chunk, c.tile, c.isa) end

-- A config from a kernel and a decomposition.
local function config(k, splits, threads)
  return { chunk = k.chunk, tile = k.tile, isa = k.isa, splits = splits, threads = threads }
end

-- The job's search state: measured records by config name, and the virtual clock.
local function state(j, budget)
  return { j = j, spent = 0, budget = budget, quick = {}, refined = {}, n = 0 }
end

-- Seconds left of the job's budget.
local function left(st) return st.budget - st.spent end

-- Measure config c at stage (see measure.measure), charging the virtual clock.
local function timed(st, c, stage, reps, warmup)
  local r = measure.measure(st.j, c, stage, reps, warmup)
  local run = r.ok and r.median_us * 1e-6 or 0
  st.spent = st.spent + (reps + (warmup and 1 or 0)) * (run + M.FLUSH_S)
  st.n = st.n + 1
  if st.j.progress then st.j.progress(st) end
  return r
end

-- Quick-measure config c once (warm-up only for short runs); records kept by name.
local function quick(st, c, warm)
  local name = measure.config_name(c)
  if st.quick[name] then return st.quick[name] end
  local r = timed(st, c, "quick", 1, warm)
  st.quick[name] = r
  return r
end

-- The ok records of a name -> record map, fastest first.
local function ranked(map)
  local out = {}
  for _, r in pairs(map) do if r.ok then out[#out + 1] = r end end
  table.sort(out, function(a, b)
    if a.median_us ~= b.median_us then return a.median_us < b.median_us end
    return a.config < b.config
  end)
  return out
end
M.ranked = ranked

-- Phase 2: the kernels at the heuristic's decomposition, as many as the budget allows.
local function kernel_pass(st, h, cost, warm, prior)
  local j = st.j
  local ks = M.kernels(j.G, j.max_isa, h, prior)
  local n_max = math.max(3, math.floor(0.45 * st.budget / cost))
  st.planned = st.planned + math.min(#ks, n_max) - 1
  for i, k in ipairs(ks) do
    if i > n_max or (i > 3 and left(st) < 0.55 * st.budget) then break end
    quick(st, config(k, h.splits, h.threads), warm)
  end
end

-- Phase 3: splits x threads for the best two kernels so far.
local function decomposition_pass(st, h, cost, warm)
  local j = st.j
  local splits = M.split_choices(j.items, j.threads, j.len, h.splits)
  local threads = M.thread_choices(j.threads)
  local best = ranked(st.quick)
  st.planned = st.planned + math.min(#best, 2) * (#splits * #threads - 1)
  for i = 1, math.min(#best, 2) do
    for _, s in ipairs(splits) do
      for _, t in ipairs(threads) do
        if left(st) < 0.4 * st.budget and i > 1 then return end
        if left(st) < 0.3 * st.budget then return end
        quick(st, config(best[i].c, s, t), warm)
      end
    end
  end
end

-- Phase 4: refine the best few quick configurations (warm-up + reps, median).
local function refine(st, cost)
  local reps = clamp(math.ceil(M.REFINE_S / cost), 3, 9)
  local best = ranked(st.quick)
  local n = clamp(math.floor(0.3 * math.max(left(st), 0) / (cost * (reps + 1))), 1, 3)
  st.planned = st.planned + math.min(n, #best)
  for i = 1, math.min(n, #best) do
    local r = timed(st, best[i].c, "ref", reps, true)
    st.refined[r.config] = r
  end
  return ranked(st.refined)[1]
end

-- The rounds cap of verification: about VERIFY_S per configuration (7 to 31
-- rounds), fewer when the job's budget is short (never below MIN_ROUNDS).
local function rounds_cap(st, cost)
  local rounds = clamp(math.ceil(M.VERIFY_S / cost), 7, 31)
  if left(st) < 2 * rounds * cost then
    rounds = clamp(math.floor(math.max(left(st), 0) / (2 * cost)), M.MIN_ROUNDS, rounds)
  end
  return rounds
end

-- Phase 5: winner w and heuristic h interleaved, back to back in each round
-- (alternating which goes first), in batches until stats decides; the
-- decision (measure.compare: interval of the median ratio w/h, medians ma, mb).
local function verify(st, w, h, cost)
  local cap = rounds_cap(st, cost)
  st.planned = st.planned + 2 * cap
  local d, err = measure.compare({ max = cap }, function(which, r)
    return timed(st, which == "a" and w or h, "v" .. r, 1, r == 1)
  end)
  if d then st.planned = st.planned - 2 * (cap - d.rounds); d.cap = cap end
  return d, err
end

-- The search proper (see M.tune).
local function search(j, budget, prior)
  local st = state(j, budget)
  st.planned = 1
  local okh, h = pcall(measure.heuristic, j)
  if not okh then return nil, "the heuristic's plan failed: " .. tostring(h) end
  local hq = quick(st, h, true)
  if not hq.ok then return nil, "the heuristic's configuration failed: " .. tostring(hq.err) end
  local cost = hq.median_us * 1e-6 + M.FLUSH_S
  local warm = cost < M.LONG_S
  kernel_pass(st, h, cost, warm, prior)
  decomposition_pass(st, h, cost, warm)
  local best = refine(st, cost)
  local hname = measure.config_name(h)
  local res = { h = h, quick = st.quick, n = st.n, spent = st.spent }
  if not best or best.config == hname then
    local hr = st.refined[hname] or hq
    res.c, res.key, res.median_us, res.heuristic_us = h, hr.key, hr.median_us, hr.median_us
    return res
  end
  local d, err = verify(st, best.c, h, cost)
  if not d then return nil, "verification failed: " .. tostring(err) end
  local win = d.decision == "win" and d.ma <= d.mb
  res.c, res.key = win and best.c or h, win and best.key or hq.key
  res.median_us, res.heuristic_us, res.challenger = win and d.ma or d.mb, d.mb, { c = best.c, median_us = d.ma }
  res.decision, res.win, res.spent = d, win, st.spent
  if j.log.decision then j.log:decision(M.decision_record(j, best.c, h, d, win)) end
  return res
end

-- The log record of verification decision d: challenger c against heuristic h, kept or not.
function M.decision_record(j, c, h, d, win)
  return { shape = j.sig, bucket = j.bucket, len = j.len, cache = j.cache, challenger = measure.config_name(c),
           heuristic = measure.config_name(h), d = d, kept = win and "challenger" or "heuristic", name = j.name }
end

-- Tune job j (see tune.lua) within budget seconds; prior ranks kernels by name.
-- Returns { c, key, median_us, heuristic_us, h, quick, spent, decision (the
-- verification's, stats.decide's fields; nil when the heuristic had no
-- challenger), win } or nil and why.
function M.tune(j, budget, prior)
  local res, why = search(j, budget, prior)
  measure.release(j)
  return res, why
end

-- The ranking of kernels in a job's quick results (for the next bucket's prior).
function M.prior_of(quick_map)
  local prior, n = {}, 0
  for _, r in ipairs(ranked(quick_map)) do
    local k = kernel_name(r.c)
    if not prior[k] then n = n + 1; prior[k] = n end
  end
  return prior
end

return M
