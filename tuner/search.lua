-- The search for one (shape, bucket) job, within a time budget:
--   1. the heuristic's configuration, quick (1 repetition) -> the run's cost;
--   2. quick passes over the kernels (chunk x group tile x ISA, gen/space.lua:
--      chunks 32..4096 and 16 for MHA, every divisor tile up to 16, every isa
--      up to the context's) at the heuristic's splits and threads, coarse to
--      fine: (a) every other chunk from the heuristic's and the smallest
--      chunk (an odd number of steps from 256: only a neighbour of 64 could
--      reach it, and on the Zen 3 it won Llama f16 by 7-13% in one tune and
--      was never timed in the next), every tile and isa, nearest the
--      heuristic first (the previous bucket's best three of the
--      same shape before them); then the chunk row of the fastest so far
--      (its tile and isa) timed once more, each keeping its faster time
--      (stage c), so one slow spell cannot hide the best chunk from (b) the
--      neighbours (one chunk, tile or isa step) of the best three so far; as
--      many as the budget allows. Kernels that cannot run or repeat another's
--      work are pruned, each logged ("#pruned" lines, tuner/log.lua) with
--      why; then the RECHECK fastest
--      kernels re-timed in RECHECK_ROUNDS interleaved rounds (stages k<round>),
--      each keeping its fastest time, so a kernel timed once in a slow spell
--      is not ranked behind slower ones timed after the bandwidth rose;
--   3. quick pass over splits (up to 16) x threads for the best two kernels;
--   4. refine up to MAX_FINALISTS (the fastest, the fastest at another splits x
--      threads, then the next fastest) interleaved (several rounds, each timing every
--      finalist once in a rotating order): the lowest median per-round ratio
--      to the quick best wins, so a bandwidth level switch cannot pick it;
--   5. verify: the refined winner (then, when it does not win and the budget
--      allows, the runner-up in rounds of its own) and the heuristic interleaved in paired
--      rounds, added in batches until tuner/stats.lua decides (win, lose, tie)
--      or the rounds cap is reached (a winner whose median ratio is at most
--      EXTEND_BELOW goes on to EXTEND_ROUNDS while the budget lasts); the
--      winner is kept only when the whole
--      confidence interval of its median per-round ratio to the heuristic lies
--      below 1 (within each bandwidth level when the rounds show a switch) and
--      its median time is not the higher, else the heuristic's configuration is.
-- The budget is spent on a virtual clock: each measurement, timed now or read
-- back from the log, costs its runs' medians plus a cache flush each, so a
-- resumed run takes exactly the decisions of the interrupted one.
local space = require("space")
local measure = require("tuner.measure")
local facts = require("facts")
local stats = require("tuner.stats")

local M = {}
M.REFINE_S = 0.25        -- timed seconds aimed at per refined configuration
M.VERIFY_S = 0.6         -- seconds aimed at per configuration in verification: the rounds cap (7 to 31)
M.MIN_ROUNDS = 6         -- the fewest rounds with a 95% sign-test interval (tuner/stats.lua)
M.EXTEND_BELOW = 0.97    -- verification past its cap: a winner with a median ratio at most this
M.EXTEND_ROUNDS = 63     -- goes on to this many rounds while the job's budget lasts
M.LONG_S = 0.05          -- quick runs longer than this skip the warm-up (a run that long is its own)
M.FLUSH_S = 0.01         -- the virtual cost of a cache flush (and a plan), seconds
M.MAX_SPLITS = 16        -- the most splits tried
M.ITEMS_PER_THREAD = 16  -- the most work items (kv rows x splits) per thread tried
M.FINE_BEST = 3          -- the fine pass measures the neighbours of this many best kernels
M.RECHECK = 6            -- the quick pass's fastest kernels re-timed before the splits pass
M.RECHECK_ROUNDS = 2     -- in this many interleaved rounds (stages k1, k2)
M.MAX_FINALISTS = 5      -- the most finalists refined (fewer when the budget's 30% holds fewer rounds of them)
M.isas_of = nil          -- isa digits with a kernel for (head_dim, tile): gen/space.lua's unless set (tests)

-- Integer clamp.
local function clamp(x, lo, hi) return math.max(lo, math.min(hi, x)) end

-- Split counts to try: 1, the heuristic's, powers of two up to MAX_SPLITS
-- and ITEMS_PER_THREAD work items per thread (no piece shorter than 128
-- keys), and the count that fills the threads.
function M.split_choices(items, threads, len, h)
  local most = math.max(1, math.min(M.MAX_SPLITS, math.floor(M.ITEMS_PER_THREAD * threads / items), math.floor(len / 128)))
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

-- The kernel name of chunk, tile and isa.
local function kname(chunk, tile, isa) return ("c%d.t%d.i%d"):format(chunk, tile, isa) end

-- Why kernel (chunk, tile, isa) is left out for head_dim D at length len
-- (nil when it is searched): a chunk at least twice the length does the
-- work of the half one; an isa above the context's or without a kernel for
-- (D, tile) cannot run.
function M.prune_reason(chunk, tile, isa, D, len, max_isa, isas_of)
  if not facts.isa_within(isa, max_isa) then return ("isa %d above the context's %d"):format(isa, max_isa) end
  if not index_of(isas_of(D, tile), isa) then
    return ("isa %d has no kernel for head_dim %d, group tile %d (gen/simd.lua)"):format(isa, D, tile)
  end
  if chunk >= 2 * len then return ("chunk %d >= 2 x the length %d: one chunk of %d holds every key"):format(chunk, len, chunk / 2) end
end

-- Steps between isa digits a and b on the fallback chain (their ranks, not
-- their digits: digit 4 ranks between 2 and 3).
local function isa_steps(a, b) return math.abs(facts.isa_rank(a) - facts.isa_rank(b)) end

-- Every kernel (chunk, tile, isa) of the shape, nearest the heuristic first;
-- kernels the prior ranking names come before the others, in its order.
-- j: { G, max_isa, D, len }. Returns the kernels searched and those pruned
-- ({ name, why }); coarse = true on the kernels of the coarse pass: every
-- other chunk from the heuristic's and the smallest (every tile and isa).
function M.kernels(j, h, prior)
  local chunks, tiles, out, pruned = space.chunks(j.G), space.tiles(j.G), {}, {}
  local hc = index_of(chunks, h.chunk) or 3
  for isa = 0, #facts.isas do
    for ci, chunk in ipairs(chunks) do
      for ti, tile in ipairs(tiles) do
        local name = kname(chunk, tile, isa)
        local why = M.prune_reason(chunk, tile, isa, j.D, j.keys or j.len, j.max_isa, M.isas_of or space.isas)
        if why then
          if facts.isa_within(isa, j.max_isa) then pruned[#pruned + 1] = { name = name, why = why } end
        else
          local dist = math.abs(ci - hc) + math.abs(ti - (index_of(tiles, h.tile) or 1)) + isa_steps(isa, h.isa)
          local k = { chunk = chunk, tile = tile, isa = isa, name = name, ci = ci, ti = ti,
                      coarse = (ci - hc) % 2 == 0 or ci == 1 or (prior and prior[name] and prior[name] <= 3) or false }
          k.order = prior and prior[name] or (1000 + dist * 100 + #out)
          out[#out + 1] = k
        end
      end
    end
  end
  table.sort(out, function(a, b) return a.order < b.order end)
  return out, pruned
end

-- The kernels of list ks next to kernel k: the chunk or the tile one step
-- off (same isa), or the isa one step off on the fallback chain (same
-- chunk and tile).
function M.neighbours(ks, k)
  local out = {}
  for _, o in ipairs(ks) do
    local dc, dt, di = math.abs(o.ci - k.ci), math.abs(o.ti - k.ti), isa_steps(o.isa, k.isa)
    if dc + dt + di == 1 then out[#out + 1] = o end
  end
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

-- Round r of interleaved timing: config_of(i) for i = 1..n, each once, in an
-- order rotated by r (the warm-up in round 1), so that a bandwidth level
-- switch hits them alike; each record to put(i, record).
local function rotating_round(st, n, config_of, stage, r, put)
  for k = 0, n - 1 do
    local i = (r + k - 1) % n + 1
    put(i, timed(st, config_of(i), stage .. r, 1, r == 1))
  end
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

-- The quick records at decomposition h, fastest first.
local function records_at(st, h)
  local out = {}
  for _, r in ipairs(ranked(st.quick)) do
    if r.c.splits == h.splits and r.c.threads == h.threads then out[#out + 1] = r end
  end
  return out
end

-- The measured kernels at decomposition h, fastest first (names of kernels()).
local function best_kernels(st, h)
  local out = {}
  for i, r in ipairs(records_at(st, h)) do out[i] = kernel_name(r.c) end
  return out
end

-- Log why each pruned kernel ({ name, why }) was left out.
local function log_pruned(j, pruned)
  if not j.log.note then return end
  for _, p in ipairs(pruned) do
    j.log:note("pruned", { shape = j.sig, bucket = j.bucket, len = j.len, cache = j.cache, what = p.name,
                           why = p.why, name = j.name })
  end
end

-- A copy of quick record rec timed faster (t_us) in a re-time: its
-- median_us that time, quick_us its first quick time.
local function faster_record(rec, t_us)
  local copy = {}
  for f, v in pairs(rec) do copy[f] = v end
  copy.quick_us, copy.median_us = rec.quick_us or rec.median_us, t_us
  return copy
end

-- Phase 2a: the chunk row of the coarse pass's fastest kernel re-timed once
-- each (stage c: its other kernels at the same tile and isa, at decomposition
-- h), a record keeping its fastest time, so that the fine pass starts from
-- the right chunk. A chunk moves a kernel's time by a few %, a slow spell of
-- a shared machine by more: in the tune at 936b23b, Falcon-40B bf16's chunk 64
-- was timed once at 9204 us against about 5300, so the fine pass never
-- measured its neighbours and the heuristic's chunk 256 was kept (1.04-1.06x
-- the time of chunks 32 and 64, cold, measured after). Stops before it would
-- leave under 55% of the job's budget.
local function retime_row(st, h, cost, warm)
  local recs = records_at(st, h)
  local best = recs[1]
  for i = 2, #recs do
    local r = recs[i]
    if r.c.tile == best.c.tile and r.c.isa == best.c.isa then
      if left(st) - cost < 0.55 * st.budget then return end
      st.planned = st.planned + 1
      local t = timed(st, r.c, "c", 1, warm)
      if t.ok and t.median_us < r.median_us then st.quick[r.config] = faster_record(r, t.median_us) end
    end
  end
end

-- Phase 2: the kernels at the heuristic's decomposition, coarse, the best
-- one's chunk row re-timed (retime_row), then fine, as many as the budget allows.
local function kernel_pass(st, h, cost, warm, prior)
  local j = st.j
  local ks, pruned = M.kernels(j, h, prior)
  st.space, st.pruned = #ks + #pruned, #pruned
  log_pruned(j, pruned)
  local n_max, n = math.max(3, math.floor(0.45 * st.budget / cost)), 0
  local coarse, byname = {}, {}
  for _, k in ipairs(ks) do
    byname[k.name] = k
    if k.coarse then coarse[#coarse + 1] = k end
  end
  st.planned = st.planned + math.min(#coarse, n_max) - 1
  for i, k in ipairs(coarse) do
    if i > n_max or (i > 3 and left(st) < 0.6 * st.budget) then break end
    quick(st, config(k, h.splits, h.threads), warm)
    n = i
  end
  retime_row(st, h, cost, warm)
  for i, name in ipairs(best_kernels(st, h)) do
    if i > M.FINE_BEST or not byname[name] then break end
    for _, o in ipairs(M.neighbours(ks, byname[name])) do
      if n >= n_max or left(st) < 0.55 * st.budget then return end
      local c = config(o, h.splits, h.threads)
      if not st.quick[measure.config_name(c)] then st.planned = st.planned + 1; n = n + 1; quick(st, c, warm) end
    end
  end
end

-- Phase 2b: the RECHECK fastest kernels at decomposition h re-timed in up to
-- RECHECK_ROUNDS interleaved rounds (stage k<round>, a rotating order, the
-- warm-up in the first), while the budget keeps 40% after a round; a quick
-- record whose kernel ran faster becomes a copy with that time (quick_us:
-- the first). The quick pass runs its kernels one after another: when the
-- read bandwidth changes level during it, a kernel timed once before the
-- change ranks behind slower ones timed after it, and never reaches the
-- refinement. A slow spell only adds time, so the fastest time stands.
local function recheck(st, h, cost)
  local recs = records_at(st, h)
  local n = math.min(#recs, M.RECHECK)
  if n < 2 then return end
  local best = {}
  for i = 1, n do best[i] = recs[i].median_us end
  for r = 1, M.RECHECK_ROUNDS do
    if left(st) - n * cost < 0.4 * st.budget then break end
    st.planned = st.planned + n
    rotating_round(st, n, function(i) return recs[i].c end, "k", r, function(i, t)
      if t.ok and t.median_us < best[i] then best[i] = t.median_us end
    end)
  end
  for i = 1, n do
    if best[i] < recs[i].median_us then st.quick[recs[i].config] = faster_record(recs[i], best[i]) end
  end
end

M.recheck = recheck   -- for tests
M.kernel_pass = kernel_pass

-- What the search measured: kernels (of the space and pruned), decompositions
-- (splits x threads) and configurations.
local function coverage(st)
  local ks, ds, nk, nd, nc = {}, {}, 0, 0, 0
  for _, r in pairs(st.quick) do
    nc = nc + 1
    local k, d = kernel_name(r.c), r.c.splits .. "x" .. r.c.threads
    if not ks[k] then ks[k] = true; nk = nk + 1 end
    if not ds[d] then ds[d] = true; nd = nd + 1 end
  end
  return { kernels = nk, space = st.space or 0, pruned = st.pruned or 0, decompositions = nd, configs = nc }
end
M.coverage_of = coverage

-- Log the coverage cv of job j.
local function log_coverage(j, cv)
  if not j.log.note then return end
  local r = { shape = j.sig, bucket = j.bucket, len = j.len, cache = j.cache, name = j.name }
  for k, v in pairs(cv) do r[k] = v end
  j.log:note("coverage", r)
end

-- Phase 3: splits x threads for the best two kernels so far.
local function decomposition_pass(st, h, cost, warm)
  local j = st.j
  local splits = M.split_choices(j.items, j.threads, j.keys or j.len, h.splits)
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

-- The refined record of finalist c from its per-round records (nil when one failed).
local function refined_record(c, recs)
  local times = {}
  for r, rec in ipairs(recs) do
    if not rec.ok then return { ok = false, c = c, config = rec.config, err = rec.err } end
    times[r] = rec.median_us
  end
  return { ok = true, c = c, config = recs[1].config, key = recs[1].key, median_us = stats.median(times), times = times }
end

-- The median per-round ratio of times a over times b.
local function median_ratio(a, b)
  local q = {}
  for r = 1, #a do q[r] = a[r] / b[r] end
  return stats.median(q)
end

-- The n finalists of the refinement from the quick records, fastest first:
-- the fastest, the fastest at another decomposition (splits x threads) when
-- there is one, then the rest in quick order. Single quick runs rank the
-- split counts of one kernel no better than the kernels (a run can fall in
-- either bandwidth level), so the decomposition pass's best gets its rounds.
function M.finalists(best, n)
  local out, taken = {}, {}
  local function take(i) if i and not taken[i] and #out < n then taken[i] = true; out[#out + 1] = best[i] end end
  take(best[1] and 1)
  if n >= 2 and best[1] then
    for i = 2, #best do
      if best[i].c.splits ~= best[1].c.splits or best[i].c.threads ~= best[1].c.threads then take(i); break end
    end
  end
  for i = 2, #best do take(i) end
  table.sort(out, function(a, b) return (index_of(best, a) or 0) < (index_of(best, b) or 0) end)
  return out
end

-- Phase 4: refine the best few quick configurations interleaved: reps
-- rounds (stage r<round>), each timing every finalist once in a rotating
-- order (warm-up in the first), so a bandwidth level switch hits all of them
-- alike; the winner is the finalist with the lowest median per-round ratio to
-- the quick best (the quick order breaks ties).
local function refine(st, cost)
  local reps = clamp(math.ceil(M.REFINE_S / cost), 3, 9)
  local all = ranked(st.quick)
  local n = math.min(clamp(math.floor(0.3 * math.max(left(st), 0) / (cost * (reps + 1))), 1, M.MAX_FINALISTS), #all)
  local best = M.finalists(all, n)
  st.planned = st.planned + n * reps
  local recs = {}
  for i = 1, n do recs[i] = {} end
  for r = 1, reps do
    rotating_round(st, n, function(i) return best[i].c end, "r", r, function(i, rec) recs[i][r] = rec end)
  end
  local order = {}
  for i = 1, n do
    local rec = refined_record(best[i].c, recs[i])
    st.refined[measure.config_name(best[i].c)] = rec
    local q = rec.ok and st.refined[measure.config_name(best[1].c)].ok and median_ratio(rec.times, st.refined[measure.config_name(best[1].c)].times)
    if rec.ok then order[#order + 1] = { rec = rec, q = q or 1, i = i } end
  end
  table.sort(order, function(a, b) if a.q ~= b.q then return a.q < b.q end return a.i < b.i end)
  for i, o in ipairs(order) do order[i] = o.rec end
  return order[1], order
end

M.refine = refine   -- for tests

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
local function verify(st, w, h, cost, stage)
  local cap = rounds_cap(st, cost)
  st.planned = st.planned + 2 * cap
  local extend = { max = math.max(cap, M.EXTEND_ROUNDS), below = M.EXTEND_BELOW,
                   ok = function() return left(st) >= 2 * cost * 8 end }
  local d, err = measure.compare({ max = cap, extend = extend }, function(which, r)
    return timed(st, which == "a" and w or h, stage .. r, 1, r == 1)
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
  recheck(st, h, cost)
  decomposition_pass(st, h, cost, warm)
  local res_cov = coverage(st)
  log_coverage(j, res_cov)
  local best, finalists = refine(st, cost)
  local hname = measure.config_name(h)
  local res = { h = h, quick = st.quick, n = st.n, spent = st.spent, coverage = res_cov }
  if not best or best.config == hname then
    local hr = st.refined[hname] or hq
    res.c, res.key, res.median_us, res.heuristic_us = h, hr.key, hr.median_us, hr.median_us
    return res
  end
  local d, err = verify(st, best.c, h, cost, "v")
  if not d then return nil, "verification failed: " .. tostring(err) end
  local win = d.decision == "win" and d.ma <= d.mb
  local second = finalists[2]
  if not win and second and second.config ~= hname and left(st) >= 2 * cost * rounds_cap(st, cost) then
    if j.log.decision then j.log:decision(M.decision_record(j, best.c, h, d, false)) end
    best = second      -- the runner-up of the refinement, in rounds of its own (stage w)
    d, err = verify(st, best.c, h, cost, "w")
    if not d then return nil, "verification failed: " .. tostring(err) end
    win = d.decision == "win" and d.ma <= d.mb
  end
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
