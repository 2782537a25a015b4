-- `make tune`: tune a shape set on this machine, per shape and kv-length
-- bucket, and write the tuned table and its log; print a summary.
--   luajit tuner/tune.lua [SHAPES.lua]
-- Environment:
--   SHAPES=file         shape set (default tuner/shapes/default.lua)
--   QUICK=1             a short run: lengths up to 4096, a smaller budget
--   TUNE_BUDGET=s       seconds of measuring for the whole run (default 330, QUICK 40)
--   TUNE_TABLE=path     the table (default results/tuned/<machine>[-<set>][-quick].tsv);
--                       the log is the same path with .log
--   TUNE_HEADER=path    the exported header (default results/<machine>/flashdecode_tuned[-<set>][-quick].h,
--                       or the table's path with .h when TUNE_TABLE is given); TUNE_HEADER=0: no export
--   FDGEN=path          the fdgen command that exports (default build/fdgen)
--   TUNE_CACHE=warm     warm-cache timing (default cold: caches flushed before each repetition)
--   FD_TUNE_STOP_AFTER=N  stop (exit 3) after N new measurements: resume by running again
--   TUNE_PROGRESS=0|1   force the progress bar off or on (default: when stderr is a terminal)
local root = (debug.getinfo(1, "S").source:gsub("^@", "")):match("^(.*)/tuner/[^/]*$") or "."
local home = root == "." and "" or (root .. "/")   -- prefix of paths under the repository
package.path = ("%s/?.lua;%s/gen/?.lua;%s/lua/?.lua;"):format(root, root, root) .. package.path
local fd = require("flashdecode")
local machine = require("tuner.machine")
local space = require("space")
local sys = require("tuner.sys")
local tlog = require("tuner.log")
local tuned = require("tuner.tuned")
local search = require("tuner.search")
local measure = require("tuner.measure")
local workload = require("tuner.workload")
local progress = require("tuner.progress")
local stats = require("tuner.stats")

-- Run settings from the environment and arguments.
local function settings(a)
  local quick = sys.env("QUICK", "0") ~= "0"
  local shapes = a[1] or sys.env("SHAPES", home .. "tuner/shapes/default.lua")
  local machine = sys.machine()
  local set = shapes:match("([^/]*)%.lua$") or "shapes"
  local name = machine .. (set ~= "default" and ("-" .. set) or "") .. (quick and "-quick" or "")
  local suffix = name:sub(#machine + 1)
  local tbl = sys.env("TUNE_TABLE", home .. "results/tuned/" .. name .. ".tsv")
  local hdr = sys.env("TUNE_HEADER", os.getenv("TUNE_TABLE") and (tbl:gsub("%.tsv$", "") .. ".h")
                      or (("%sresults/%s/flashdecode_tuned%s.h"):format(home, machine, suffix)))
  local cache = sys.env("TUNE_CACHE", "cold")
  if cache ~= "cold" and cache ~= "warm" then error("tune: TUNE_CACHE must be cold or warm, not " .. cache, 0) end
  local tp = sys.env("TUNE_PROGRESS", nil)
  return { quick = quick, shapes = shapes, machine = machine, table = tbl, log = (tbl:gsub("%.tsv$", "")) .. ".log",
           header = hdr ~= "0" and hdr or nil, fdgen = sys.env("FDGEN", home .. "build/fdgen"),
           budget = tonumber(sys.env("TUNE_BUDGET", quick and "40" or "330")), cache = cache,
           stop_after = tonumber(sys.env("FD_TUNE_STOP_AFTER", "0")), progress = tp and tp ~= "0" or nil }
end

-- The jobs: one per distinct (shape signature, bucket) in shape-set order,
-- at the longest length of the shape in that bucket; the bucket is that of
-- the keys the length visits (a windowed shape: its window's, whatever the
-- cache length), as the planner's (workload.bucket).
local function jobs_of(shapes, cfg)
  local jobs, seen = {}, {}
  for _, s in ipairs(shapes) do
    local n = space.numeric(s)
    local all, lens, byb = { unpack(s.kv_len) }, {}, {}
    table.sort(all)
    for _, len in ipairs(all) do
      if not cfg.quick or len <= 4096 or #lens == 0 then lens[#lens + 1] = len end
    end
    for _, len in ipairs(lens) do byb[workload.bucket(s, len)] = len end
    n.kv_len = 1
    local sig = sys.signature(fd.shape(n))
    for _, len in ipairs(lens) do
      local b = workload.bucket(s, len)
      if byb[b] == len and not seen[sig .. "@" .. b] then
        seen[sig .. "@" .. b] = true
        jobs[#jobs + 1] = { s = s, name = s.name, sig = sig, bucket = b, len = len, keys = workload.visited_keys(n, len),
                            bytes = workload.bytes(n, len) }
      end
    end
  end
  return jobs
end

-- The build id of log lines (tuner/log.lua build_id): this library build on this CPU.
local function build_id()
  local b = fd.build_info()
  return tlog.build_id(b.version, b.templates_hash, b.tcc_version, machine.cpu_id())
end

-- Seconds of budget for job i: the rest, shared by the square root of KV bytes.
local function job_budget(jobs, i, left)
  local total = 0
  for k = i, #jobs do total = total + math.sqrt(jobs[k].bytes) end
  return math.max(left, 0) * math.sqrt(jobs[i].bytes) / total
end

-- Fill job j's run context: buffers, context facts, log, stop hook, progress.
local function prepare(j, w, ctx, log, cfg, bar)
  local info = fd.ctx_info(ctx)
  j.w, j.ctx, j.log, j.cache, j.threads, j.max_isa = w, ctx, log, cfg.cache, info.threads, info.max_isa
  j.G, j.D = w.n.n_q_heads / w.n.n_kv_heads, w.n.head_dim
  j.items = w.n.batch * w.n.n_kv_heads
  j.on_measure = function()
    if cfg.stop_after > 0 and log.written >= cfg.stop_after then
      bar:done()
      io.stderr:write(("tune: stopped after %d measurements (FD_TUNE_STOP_AFTER); run again to resume\n"):format(log.written))
      log:close()
      os.exit(3)
    end
  end
  j.progress = function(st) bar:draw(st.n, st.planned, search.ranked(st.quick)[1]) end
end

-- The table row of a tuned job; ratio_ci: the kept winner's interval against
-- the heuristic, "-" when the row is the heuristic's own configuration.
local function row_of(j, res)
  return { shape = j.sig, bucket = j.bucket, key = res.key, splits = res.c.splits, threads = res.c.threads,
           median_us = res.median_us, gbps = j.bytes / (res.median_us * 1e3), heuristic_us = res.heuristic_us,
           name = j.name, ratio_ci = res.win and stats.ci_text(res.decision) or "-" }
end

-- Tune every job; rows of the table in job order. The budget is shared on the
-- search's virtual clock (deterministic on resume); past 1.25x the budget in
-- real time, cache flushes left out, the remaining jobs get the least search.
local function run_jobs(jobs, cfg, ctx, log)
  local bar = progress.new(#jobs, cfg.progress)
  local t0, f0, spent, rows, priors, results, cap, work = sys.now(), sys.flush_s, 0, {}, {}, {}, {}, {}
  for _, j in ipairs(jobs) do cap[j.s] = math.max(cap[j.s] or 0, j.len) end
  for i, j in ipairs(jobs) do
    work[j.s] = work[j.s] or workload.new(j.s, cap[j.s])
    prepare(j, work[j.s], ctx, log, cfg, bar)
    bar:job(i, j.name, j.len, j.bucket)
    local late, cpu0 = sys.now() - t0 - (sys.flush_s - f0) > 1.25 * cfg.budget, sys.cpu_sample()
    local res, why = search.tune(j, late and 0 or job_budget(jobs, i, cfg.budget - spent), priors[j.s])
    results[i] = res or { failed = why }
    results[i].others = sys.others_cores(cpu0, sys.cpu_sample(), cfg.cores)
    if res then
      spent = spent + res.spent
      priors[j.s] = search.prior_of(res.quick)
      rows[#rows + 1] = row_of(j, res)
    end
  end
  bar:done()
  for _, w in pairs(work) do w:free() end
  return rows, results, sys.now() - t0
end

-- "chunk/tile/splits/threads/isa" of a config.
local function cfg_text(c)
  return ("%d/%d/%d/%d/%s"):format(c.chunk, c.tile, c.splits, c.threads, fd.ISA_NAMES[c.isa] or c.isa)
end

-- The verification columns of a result: the challenger, its interval against
-- the heuristic, and the decision (verdict, rounds of the cap, why it stopped,
-- level switch, what was kept).
local function decision_text(r)
  local d = r.decision
  if not d then return "-", "-", "heuristic ranked first: no challenger" end
  local s = ("%s, %d/%d rounds"):format(d.decision, d.rounds, d.cap or d.rounds)
  if d.stop ~= "decided" then s = s .. " (" .. d.stop .. ")" end
  if d.switch then s = s .. (", level switch %.2fx"):format(d.switch.ratio) end
  return cfg_text(r.challenger.c), stats.ci_text(d), s .. (r.win and "; winner kept" or "; heuristic kept")
end

-- What the search of a result covered: "34/120 kernels (8 pruned), 12 decomp., 50 configs".
local function coverage_text(r)
  local c = r.coverage
  if not c then return "-" end
  return ("%d/%d kernels (%d pruned), %d decomp., %d configs"):format(c.kernels, c.space, c.pruned, c.decompositions,
                                                                      c.configs)
end

-- Print the summary table.
local function summary(jobs, results, cfg, secs, log)
  print(("tuned %d shape/bucket pairs of %s in %.0f s (%d measurements, %d reused from the log), %.0f s of it flushing the caches"):format(
    #jobs, cfg.shapes:match("[^/]*$"), secs, log.written, log.reused, sys.flush_s))
  local others = sys.others_cores(cfg.cpu0, sys.cpu_sample(), cfg.cores)
  print(("other processes kept %.2f of the %d cores busy during the run (column 'busy': during each row)%s"):format(
    others, cfg.cores, others > 0.2 and ";\nthe timings are noisy: run again on a quiet machine for a cleaner table" or ""))
  print(("%-20s %7s %7s  %-22s %-22s %9s %7s %9s %8s %5s  %-22s %-12s %s"):format("shape", "len", "bucket",
    "chosen c/t/s/p/isa", "heuristic", "ms", "GB/s", "heur. ms", "speedup", "busy", "challenger", "ratio 95% CI",
    "decision"))
  local covered = {}
  for i, j in ipairs(jobs) do
    local r = results[i]
    if r.failed then
      print(("%-20s %7d %7d  failed: %s"):format(j.name, j.len, j.bucket, r.failed))
    else
      local ch, ci, dec = decision_text(r)
      print(("%-20s %7d %7d  %-22s %-22s %9.2f %7.2f %9.2f %7.2fx %5.2f  %-22s %-12s %s"):format(j.name, j.len,
        j.bucket, cfg_text(r.c), cfg_text(r.h), r.median_us / 1e3, j.bytes / (r.median_us * 1e3), r.heuristic_us / 1e3,
        r.heuristic_us / r.median_us, r.others, ch, ci, dec))
      covered[#covered + 1] = ("%-20s %7d  searched %s"):format(j.name, j.len, coverage_text(r))
    end
  end
  print("search coverage per row (kernels measured of the space's, pruned ones in the log's #pruned lines):")
  for _, l in ipairs(covered) do print(l) end
  print("ratio 95% CI: the challenger's time over the heuristic's, a sign-test interval of the median per-round\n"
    .. "ratio (tuner/stats.lua); the challenger is kept only when the whole interval lies below 1")
  print(("table  %s (%s)\nlog    %s"):format(cfg.table, cfg.written and "written" or "unchanged", cfg.log))
  if cfg.header then print(("header %s (%s)"):format(cfg.header, cfg.exported)) end
end

-- Export the table to the header with `fdgen export`; "written" or "unchanged".
local function export_header(cfg)
  local q = sys.quote
  local cmd = ("%s export %s -o %s"):format(q(cfg.fdgen), q(cfg.table), q(cfg.header))
  local p = io.popen(cmd .. " 2>&1; echo \"exit $?\"")
  local out = p:read("*a")
  p:close()
  if not out:match("exit 0\n$") then error(("tune: %s failed:\n%s"):format(cmd, out), 0) end
  return out:find("(written)", 1, true) and "written" or "unchanged"
end

-- The cost model (tuner/model.lua) fitted on the whole log (every build's
-- cold measurements), its margins calibrated leave-one-shape-out, and its report lines; nil model (and a report line
-- saying why) when it cannot be fitted: the table is then written without one.
local function fit_model(path)
  local model_lib = require("tuner.model")
  local ok, obs = pcall(model_lib.observations, path)
  local ok2, model, loso = ok, nil, nil
  if ok then ok2, model, loso = pcall(model_lib.fit_calibrated, obs) end
  if not ok or not ok2 then return nil, { "cost model: not fitted: " .. tostring(ok and model or obs) } end
  return model, model_lib.report(model, loso)
end

-- Main: load shapes, tune, write the table, print the summary.
local function main(a)
  local cfg = settings(a)
  cfg.cpu0, cfg.cores = sys.cpu_sample(), machine.info().cores
  local shapes = space.load_shapes(cfg.shapes)
  local jobs = jobs_of(shapes, cfg)
  local ctx = fd.create {}
  require("files").mkdir(sys.dirname(cfg.log))
  local log = tlog.open(cfg.log, build_id())
  if log.old > 0 then
    io.stderr:write(("tune: %s: %d measurements of this build on record; they are not repeated\n"):format(cfg.log, log.old))
  end
  local rows, results, secs = run_jobs(jobs, cfg, ctx, log)
  log:close()
  local model, fit_report = fit_model(cfg.log)
  cfg.written = tuned.write(cfg.table, sys.table_header(), rows, model)
  if cfg.header then cfg.exported = export_header(cfg) end
  summary(jobs, results, cfg, secs, log)
  for _, l in ipairs(fit_report) do print(l) end
  for _, r in ipairs(results) do if r.failed then os.exit(1) end end
end

local ok, err = pcall(main, arg)
if not ok then io.stderr:write(tostring(err), "\n"); os.exit(1) end
