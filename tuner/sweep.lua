-- `make tune-sweep`: the exhaustive sweep that judges the tuner. For each
-- (shape, length) row of a shape set it times every configuration of the
-- space that plans (tuner/search.lua's kernels: every chunk x tile x isa,
-- then every kernel x splits x threads), then re-measures the best few, the
-- tuned table's pick and the heuristic's configuration interleaved in paired
-- rounds, and writes a markdown report: the exhaustive best, the ratios
-- tuned/best and tuned/heuristic with the 95% sign-test interval of the
-- median per-round ratio (tuner/stats.lua, as the tuner's verification).
--   1. every kernel once at the heuristic's splits and threads (quick);
--   2. kernels slower than SWEEP_PRUNE x the fastest there are pruned (logged
--      as "#pruned" lines with the ratio), as are kernels that failed;
--   3. every remaining kernel x split count x thread count (quick);
--   4. the SWEEP_TOP fastest, the tuned pick and the heuristic, one run each
--      per round in a rotating order, SWEEP_ROUNDS rounds, spread over
--      SWEEP_PROCS processes run one after another (each its own bandwidth
--      level: the rounds of process k are k/n of them; the first process also
--      runs steps 1-3, the others reuse them from the log);
--   5. the exhaustive best is the lowest median over the odd rounds, and
--      tuned/best is judged on the even rounds: picking the least of several
--      noisy medians and judging the ratio on the same rounds would favour the
--      best by the luck of its rounds (the winner's curse). The ratio over all
--      rounds is reported beside it.
-- Measurements go through a tuning log (tuner/log.lua): a stopped sweep run
-- again measures only what is missing.
--   luajit tuner/sweep.lua [SHAPES.lua]
-- Environment:
--   SHAPES=file        the shape set (default tuner/shapes/unseen.lua)
--   SWEEP_TABLE=path   the tuned table judged (default results/tuned/<machine>-<set>.tsv);
--                      missing or refused: the heuristic stands in, and the report says so
--   SWEEP_REPORT=path  the report (default results/tuned/sweep-<machine>[-<set>].md); its log: .log
--   SWEEP_TOP=n        configurations of the sweep re-measured (default 5)
--   SWEEP_ROUNDS=n     paired rounds (default 63: 32 choose the best, 31 judge it; at least 12)
--   SWEEP_PRUNE=x      prune kernels slower than x times the fastest in step 1 (default 2; 0: none)
--   SWEEP_PROCS=n      processes the paired rounds are spread over (default 3; 1: this one only)
--   FD_TUNE_STOP_AFTER=N, TUNE_PROGRESS=0|1   as for tuner/tune.lua
local root = (debug.getinfo(1, "S").source:gsub("^@", "")):match("^(.*)/tuner/[^/]*$") or "."
local home = root == "." and "" or (root .. "/")
package.path = ("%s/?.lua;%s/gen/?.lua;%s/lua/?.lua;"):format(root, root, root) .. package.path
local fd = require("flashdecode")
local key = require("key")
local space = require("space")
local files = require("files")
local tmachine = require("tuner.machine")
local sys = require("tuner.sys")
local tlog = require("tuner.log")
local tuned = require("tuner.tuned")
local search = require("tuner.search")
local measure = require("tuner.measure")
local workload = require("tuner.workload")
local progress = require("tuner.progress")
local stats = require("tuner.stats")

local WITHIN = 1.03      -- "within 3%": the median ratio tuned/best at most this

-- Run settings from the environment and arguments.
local function settings(a)
  local shapes = a[1] or sys.env("SHAPES", home .. "tuner/shapes/unseen.lua")
  local machine = sys.machine()
  local set = shapes:match("([^/]*)%.lua$") or "shapes"
  local report = sys.env("SWEEP_REPORT", ("%sresults/tuned/sweep-%s%s.md"):format(home, machine,
                                           set ~= "unseen" and ("-" .. set) or ""))
  local num = function(k, d)
    local v = tonumber(sys.env(k, d))
    if not v or v < 0 then error(("sweep: %s must be a number >= 0, not '%s'"):format(k, sys.env(k, d)), 0) end
    return v
  end
  local tp = sys.env("TUNE_PROGRESS", nil)
  return { shapes = shapes, machine = machine, report = report, log = report:gsub("%.md$", "") .. ".log",
           table = sys.env("SWEEP_TABLE", ("%sresults/tuned/%s-%s.tsv"):format(home, machine, set)),
           top = num("SWEEP_TOP", "5"), rounds = math.max(12, num("SWEEP_ROUNDS", "63")), prune = num("SWEEP_PRUNE", "2"),
           stop_after = num("FD_TUNE_STOP_AFTER", "0"), progress = tp and tp ~= "0" or nil,
           procs = math.max(1, math.floor(num("SWEEP_PROCS", "3"))), upto = tonumber(os.getenv("SWEEP_ROUNDS_UPTO") or "") }
end

-- The rows: one per (shape, length) of the set.
local function rows_of(shapes)
  local rows = {}
  for _, s in ipairs(shapes) do
    for _, len in ipairs(s.kv_len) do rows[#rows + 1] = { s = s, len = len } end
  end
  return rows
end

-- The build id of log lines (tuner/log.lua build_id): this library build on this CPU.
local function build_id()
  local b = fd.build_info()
  return tlog.build_id(b.version, b.templates_hash, b.tcc_version, tmachine.cpu_id())
end

-- The tuned table's rows, or nil and why not.
local function load_table(path)
  if not files.read(path) then return nil, path .. " is missing" end
  local ok, t = pcall(tuned.load, path)
  if not ok then return nil, tostring(t) end
  return t
end

-- The tuned pick for job j from table t (nil and why when none).
local function tuned_pick(t, why, j)
  if not t then return nil, why end
  for _, r in ipairs(t.rows) do
    if r.shape == j.sig and r.bucket == j.bucket then
      local f = key.decode(r.key)
      return { chunk = f.chunk, tile = f.group_tile, isa = f.isa, splits = r.splits, threads = r.threads }
    end
  end
  return nil, "the table has no row for this shape and bucket"
end

-- The job of a row: buffers, context facts, log and stop hook (as tune.lua's).
local function job_of(row, ctx, log, cfg)
  local n = space.numeric(row.s)
  n.kv_len = 1
  local w = workload.new(row.s, row.len)
  local info = fd.ctx_info(ctx)
  local j = { s = row.s, name = row.s.name, len = row.len, bucket = workload.bucket(row.s, row.len),
              keys = w:keys(row.len), sig = sys.signature(fd.shape(n)),
              w = w, ctx = ctx, log = log, cache = "cold", threads = info.threads, max_isa = info.max_isa,
              G = n.n_q_heads / n.n_kv_heads, D = n.head_dim, items = n.batch * n.n_kv_heads }
  j.on_measure = function()
    if cfg.stop_after > 0 and log.written >= cfg.stop_after then
      io.stderr:write(("\nsweep: stopped after %d measurements (FD_TUNE_STOP_AFTER); run again to resume\n"):format(
        log.written))
      log:close()
      os.exit(3)
    end
  end
  return j
end

-- Log a pruned item of job j.
local function prune(j, what, why)
  j.log:note("pruned", { shape = j.sig, bucket = j.bucket, len = j.len, cache = j.cache, what = what, why = why,
                         name = j.name })
end

-- Steps 1-2: every kernel at decomposition h; the kernels kept (fast enough, ran).
local function kernel_step(j, h, cfg, st)
  local ks, pruned = search.kernels(j, h, nil)
  for _, p in ipairs(pruned) do prune(j, p.name, p.why) end
  st.space, st.pruned, st.planned = #ks + #pruned, #pruned, st.done + #ks
  local rec, best = {}, math.huge
  for _, k in ipairs(ks) do
    rec[k.name] = st.quick(k, h.splits, h.threads)
    if rec[k.name].ok then best = math.min(best, rec[k.name].median_us) end
  end
  local kept = {}
  for _, k in ipairs(ks) do
    local r = rec[k.name]
    if not r.ok then prune(j, k.name, "failed at the heuristic's decomposition: " .. tostring(r.err))
    elseif cfg.prune > 0 and r.median_us > cfg.prune * best then
      prune(j, k.name, ("%.2fx the fastest kernel at the heuristic's decomposition s%d.p%d (SWEEP_PRUNE %.2f)"):format(
        r.median_us / best, h.splits, h.threads, cfg.prune))
    else kept[#kept + 1] = k end
  end
  st.pruned = st.pruned + #ks - #kept
  return kept
end

-- Step 3: every kept kernel x splits x threads.
local function decomposition_step(j, h, kept, st)
  local splits, threads = search.split_choices(j.items, j.threads, j.len, h.splits), search.thread_choices(j.threads)
  st.planned = st.done + #kept * #splits * #threads
  for _, k in ipairs(kept) do
    for _, s in ipairs(splits) do
      for _, t in ipairs(threads) do st.quick(k, s, t) end
    end
  end
end

-- Step 4: configs cs (name -> config) in rounds, rotating the order; times per name.
local function rounds(j, cs, cfg, st)
  local names = {}
  for name in pairs(cs) do names[#names + 1] = name end
  table.sort(names)
  local times = {}
  for _, n in ipairs(names) do times[n] = {} end
  local last = math.min(cfg.rounds, cfg.upto or cfg.rounds)   -- a part's process stops at its last round
  st.planned = st.done + last * #names
  for r = 1, last do
    for i = 1, #names do
      local n = names[(i + r - 2) % #names + 1]
      local rec = measure.measure(j, cs[n], "s" .. r, 1, r == 1)
      if not rec.ok then error(("sweep: %s: %s failed in round %d: %s"):format(j.name, n, r, tostring(rec.err)), 0) end
      times[n][r] = rec.median_us
      st.tick()
    end
  end
  return times
end

-- The decision on per-round ratios a/b (times lists), as the tuner's verification.
local function ratio(ta, tb)
  local q = {}
  for r = 1, #ta do q[r] = ta[r] / tb[r] end
  local d = stats.decide(q, { base = tb })
  d.rounds = #q
  return d
end

-- The odd (which 1) or even (which 0) rounds of times ts.
local function rounds_of(ts, which)
  local out = {}
  for r = 1, #ts do if r % 2 == which then out[#out + 1] = ts[r] end end
  return out
end

-- Sweep one row; its report record.
local function sweep_row(j, cfg, bar, tbl, tbl_why)
  local st = { quick = nil, done = 0, planned = 1, all = {} }
  st.tick = function() st.done = st.done + 1; bar:draw(st.done, st.planned, search.ranked(st.all)[1]) end
  local h = measure.heuristic(j)
  local warm = true
  st.quick = function(k, s, t)
    local c = { chunk = k.chunk, tile = k.tile, isa = k.isa, splits = s, threads = t }
    local name = measure.config_name(c)
    if not st.all[name] then st.all[name] = measure.measure(j, c, "quick", 1, warm); st.tick() end
    return st.all[name]
  end
  local hq = st.quick(h, h.splits, h.threads)
  if not hq.ok then error(("sweep: %s: the heuristic's configuration failed: %s"):format(j.name, tostring(hq.err)), 0) end
  warm = hq.median_us * 1e-6 < search.LONG_S
  local kept = kernel_step(j, h, cfg, st)
  decomposition_step(j, h, kept, st)
  local top, cs = search.ranked(st.all), {}
  for i = 1, math.min(cfg.top, #top) do cs[top[i].config] = top[i].c end
  local t, why = tuned_pick(tbl, tbl_why, j)
  t = t or h
  cs[measure.config_name(t)], cs[measure.config_name(h)] = t, h
  local times = rounds(j, cs, cfg, st)
  if cfg.upto then return nil end   -- a part's process: its rounds are in the log
  local best, bm = nil, math.huge
  for n, ts in pairs(times) do
    local m = stats.median(rounds_of(ts, 1))
    if m < bm or (m == bm and n < best) then best, bm = n, m end
  end
  local tn, hn = measure.config_name(t), measure.config_name(h)
  return { j = j, swept = #top, pruned = st.pruned, space = st.space, best = cs[best], best_us = stats.median(times[best]),
           tuned = t, tuned_us = stats.median(times[tn]), tuned_note = why, h = h, h_us = stats.median(times[hn]),
           vs_best = ratio(rounds_of(times[tn], 0), rounds_of(times[best], 0)),
           vs_best_all = ratio(times[tn], times[best]), vs_h = ratio(times[tn], times[hn]) }
end

-- "chunk/tile/splits/threads/isa" of a config.
local function cfg_text(c)
  return ("%d/%d/%d/%d/%s"):format(c.chunk, c.tile, c.splits, c.threads, fd.ISA_NAMES[c.isa] or c.isa)
end

-- The report's table line of result r.
local function report_line(r)
  local within = r.vs_best.med <= WITHIN
  local not_slower = r.vs_h.decision ~= "lose"
  return ("| %s | %d | %d (%d kernels pruned) | %s %.3f ms | %s %.3f ms%s | %s %.3f ms | %.3f [%s] | %.3f | %.3f [%s] | %s | %s |"):format(
    r.j.name, r.j.len, r.swept, r.pruned, cfg_text(r.best), r.best_us / 1e3, cfg_text(r.tuned), r.tuned_us / 1e3,
    r.tuned_note and " (heuristic: no table pick)" or "", cfg_text(r.h), r.h_us / 1e3, r.vs_best.med,
    stats.ci_text(r.vs_best), r.vs_best_all.med, r.vs_h.med, stats.ci_text(r.vs_h), within and "yes" or "no", not_slower and "yes" or "no"),
    within, not_slower
end

-- The report text: header, table, totals and notes.
local function report(cfg, results, secs, tbl_why)
  local out = { ("# Exhaustive sweep on %s\n"):format(cfg.machine),
    ("Shape set `%s`, tuned table `%s`%s. Every configuration that plans was timed once (cold cache), the "):format(
      cfg.shapes:match("[^/]*$"), cfg.table:match("[^/]*$"), tbl_why and (" (not used: " .. tbl_why .. ")") or "")
    .. ("best %d of the sweep, the tuned pick and the heuristic then %d times in paired rounds (rotating order). "):format(
      cfg.top, cfg.rounds)
    .. "Ratios: median per-round ratio and its 95% sign-test interval (tuner/stats.lua). "
    .. "The exhaustive best is the lowest median over the odd rounds; tuned/best is judged on the even rounds "
    .. "(held out: the best's own lucky rounds do not judge it), and given over all rounds beside it. "
    .. ("Within 3%%: median tuned/best (held out) <= %.2f. Not slower: the tuned/heuristic interval does not lie wholly above 1. "):format(WITHIN)
    .. ("Runtime %.0f s.\n"):format(secs),
    "| row | len | configs swept | exhaustive best c/t/s/p/isa | tuned pick | heuristic | tuned/best, held out [95% CI] "
      .. "| tuned/best, all rounds | tuned/heuristic [95% CI] | within 3% | not slower than heuristic |",
    "|---|---|---|---|---|---|---|---|---|---|---|" }
  local nw, ns = 0, 0
  for _, r in ipairs(results) do
    local line, w, s = report_line(r)
    out[#out + 1] = line
    nw, ns = nw + (w and 1 or 0), ns + (s and 1 or 0)
  end
  out[#out + 1] = ("\nWithin 3%% of the exhaustive best on %d of %d rows; never slower than the heuristic beyond the "
    .. "interval on %d of %d.\n"):format(nw, #results, ns, #results)
  return table.concat(out, "\n")
end

-- The measurement lines of build in the log at path (0 when none).
local function log_lines(path, build)
  local fh, n = io.open(path, "rb"), 0
  if not fh then return 0 end
  local prefix = build .. "\t"
  for line in fh:lines() do if line:sub(1, #prefix) == prefix then n = n + 1 end end
  fh:close()
  return n
end

-- Steps 1-4 in SWEEP_PROCS processes one after another (each a fresh
-- process: its own bandwidth level): process k of n runs the rounds up to
-- k x SWEEP_ROUNDS / n through the log (SWEEP_ROUNDS_UPTO), this one the rest
-- from it; a part that fails or stops (exit 3) ends the sweep with its status.
local function run_parts(cfg)
  for k = 1, cfg.procs - 1 do
    local upto = math.floor(k * cfg.rounds / cfg.procs)
    if upto >= 1 then
      local q = sys.quote
      local cmd = ("SWEEP_ROUNDS_UPTO=%d SWEEP_REPORT=%s SWEEP_TABLE=%s %s %s %s"):format(upto, q(cfg.report), q(cfg.table),
        q(arg[-1] or "luajit"), q(arg[0]), q(cfg.shapes))
      local ok, how, code = os.execute(cmd)
      local rc = type(ok) == "number" and ok / 256 or (ok and 0 or code)
      if rc ~= 0 then
        io.stderr:write(("sweep: the process of rounds 1..%d ended with status %s\n"):format(upto, tostring(rc or how)))
        os.exit(rc == 3 and 3 or 1)
      end
    end
  end
end

-- Main: sweep every row, write and print the report.
local function main(a)
  local cfg = settings(a)
  local t_start, before = sys.now(), log_lines(cfg.log, build_id())
  if not cfg.upto and cfg.procs > 1 then run_parts(cfg) end
  local rows = rows_of(space.load_shapes(cfg.shapes))
  local tbl, tbl_why = load_table(cfg.table)
  if tbl_why then io.stderr:write(("sweep: tuned table not used (%s): the heuristic stands in for the tuned pick\n"):format(tbl_why)) end
  files.mkdir(sys.dirname(cfg.log))
  local log = tlog.open(cfg.log, build_id())
  local ctx, bar, results = fd.create {}, progress.new(#rows, cfg.progress), {}
  for i, row in ipairs(rows) do
    local j = job_of(row, ctx, log, cfg)
    bar:job(i, j.name, j.len, j.bucket)
    results[i] = sweep_row(j, cfg, bar, tbl, tbl_why)
    measure.release(j)
    j.w:free()
  end
  bar:done()
  log:close()
  if cfg.upto then return end
  local text = report(cfg, results, sys.now() - t_start, tbl_why)
  files.write_if_changed(cfg.report, text)
  print(text)
  local written = cfg.procs > 1 and log_lines(cfg.log, build_id()) - before or log.written   -- every process's
  print(("report %s\nlog    %s (%d measurements, %d reused)\nsweep took %.0f s"):format(cfg.report, cfg.log,
    written, cfg.procs > 1 and before or log.reused, sys.now() - t_start))
end

local ok, err = pcall(main, arg)
if not ok then io.stderr:write(tostring(err), "\n"); os.exit(1) end
