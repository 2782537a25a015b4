-- Timing one configuration: a plan forced to it (fd_plan_create_opts), a
-- warm-up run, then repetitions each preceded by a cache flush (cold, the
-- default: in a model every layer's KV cache is cold) or not (warm); the
-- median. A failing configuration (compile or run error) is a record with
-- ok = false, never an error. Every record goes through the log first.
local fd = require("flashdecode")
local sys = require("tuner.sys")
local stats = require("tuner.stats")

local M = {}

-- The config's text form: c<chunk>.t<tile>.s<splits>.p<threads>.i<isa digit>.
function M.config_name(c)
  return ("c%d.t%d.s%d.p%d.i%d"):format(c.chunk, c.tile, c.splits, c.threads, c.isa)
end

-- fd_plan_opts fields forcing config c.
local function opts_of(c)
  return { chunk = c.chunk, group_tile = c.tile, splits = c.splits, threads = c.threads, isa = c.isa + 1 }
end

-- x rounded to 0.1 (what the log keeps, so a resumed run computes the same).
local function tenth(x) return tonumber(("%.1f"):format(x)) end

-- Run fn reps times (flushing the caches first unless warm); times in microseconds.
local function time_reps(fn, reps, warm)
  local t = {}
  for r = 1, reps do
    if not warm then sys.flush() end
    local t0 = sys.now()
    fn()
    t[r] = tenth((sys.now() - t0) * 1e6)
  end
  return t
end

-- The plan of config c for job j: made once per job and kept (j.plans) so
-- that repeated measurements run on warm plan memory; nil and why on failure.
local function plan_of(j, c)
  local name = M.config_name(c)
  j.plans = j.plans or {}
  if j.plans[name] then return j.plans[name] end
  local ok, plan = pcall(fd.plan, j.ctx, j.w:shape(j.len), opts_of(c))
  if not ok then return nil, tostring(plan) end
  j.plans[name] = { plan = plan, key = fd.plan_info(plan, j.len, j.ctx).key }
  return j.plans[name]
end

-- Destroy the plans a job kept.
function M.release(j)
  for _, p in pairs(j.plans or {}) do fd.plan_destroy(p.plan) end
  j.plans = {}
end

-- Time config c on job j ({ ctx, w, len, cache }): warm-up when asked, then
-- reps timed runs; returns { ok, err, median_us, times, key }.
local function run_config(j, c, reps, warmup)
  local lib = fd.load()
  local p, why = plan_of(j, c)
  if not p then return { ok = false, err = why, times = {} } end
  local args = j.w:args(j.len)
  if j.cache ~= "warm" then sys.flush_ready() end   -- outside the pcall: no library or flush buffer is no config's failure
  local function fn()
    local rc = lib.fd_run(p.plan, args)
    if rc ~= 0 then error(("fd_run: %s (code %d)"):format(fd.errmsg(j.ctx), tonumber(rc)), 0) end
  end
  local ok, r = pcall(function()
    if warmup then fn() end
    return time_reps(fn, reps, j.cache == "warm")
  end)
  if not ok then return { ok = false, err = tostring(r), times = {}, key = p.key } end
  return { ok = true, times = r, median_us = tenth(stats.median(r)), key = p.key }
end

-- The measurement of config c at stage on job j: from the log when there,
-- else timed (reps repetitions, warm-up when asked) and appended to it.
function M.measure(j, c, stage, reps, warmup)
  local rec = { shape = j.sig, bucket = j.bucket, len = j.len, cache = j.cache, stage = stage,
                config = M.config_name(c), name = j.name }
  local hit = j.log:get(rec)
  if hit then hit.c = c return hit, true end
  local r = run_config(j, c, reps, warmup)
  if not r.ok and tostring(r.err):find("interrupted!", 1, true) then error(r.err, 0) end   -- Ctrl-C: not a failure
  for k, v in pairs(r) do rec[k] = v end
  j.log:put(rec)
  rec.c = c
  if j.on_measure then j.on_measure(rec) end
  return rec, false
end

-- The heuristic's configuration at job j: what fd_plan_create picks with no table.
function M.heuristic(j)
  local plan = fd.plan(j.ctx, j.w:shape(j.len))
  local i = fd.plan_info(plan, j.len, j.ctx)
  fd.plan_destroy(plan)
  return { chunk = i.chunk, tile = i.group_tile, splits = i.splits, threads = i.threads, isa = i.isa }
end

-- Two configurations, a (the candidate) and b (the incumbent), timed back to
-- back in rounds, alternating which runs first, added in batches until
-- tuner/stats.lua decides (stats.sequential; opts: its first, batch, max,
-- more); run(which, round) times one ("a" or "b") and returns a record.
-- Returns the decision (its ratios a/b per round, paired so that load hitting
-- both alike cancels) with ma and mb, the medians of a's and b's times, or
-- nil and the error.
function M.compare(opts, run)
  local ta, tb = {}, {}
  local d, err = stats.sequential(function(r)
    local order = r % 2 == 1 and { { "a", ta }, { "b", tb } } or { { "b", tb }, { "a", ta } }
    for _, p in ipairs(order) do
      local rec = run(p[1], r)
      if not rec.ok then return nil, rec.err end
      p[2][r] = rec.median_us
    end
    return ta[r] / tb[r], tb[r]
  end, opts)
  if not d then return nil, err end
  d.ma, d.mb = stats.median(ta), stats.median(tb)
  return d
end

return M
