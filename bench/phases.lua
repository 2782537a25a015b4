-- `make bench-phases`: where issue 18's bound rows spend their time, by the
-- template statement each sample ran in. Each row runs in a child process
-- (`luajit bench/phases.lua --child N`) under `perf record -e cpu-clock`:
-- the child plans its shape with the cc backend under $FD_CC_DEBUG (kernels
-- with #line back to the templates, built with -g: the same machine code),
-- fills its buffers, warms up, and then samples cold fd_run calls on all
-- cores: before each call it flushes the caches with perf paused, then tells
-- perf (its control FIFO) to sample the call alone. `perf report
-- --sort dso,srcline` then names, for every sample, the template line whose
-- inline assembly or C it was in (bench/profile.lua): scores, max, exp, P·V...
-- The kernel's statements are the same bytes under tcc; the C around them is
-- gcc's here (tcc's is slower: the tcc rows of `make bench`).
-- Writes results/bench/phases-<machine>[-quick].md and a chart of the shares
-- (.svg, .png). Never asserts a time; fails when perf cannot sample, a child
-- fails, or a row has no sample in its kernel.
--   QUICK=1        the rows at the shapes' quick lengths, 0.5 s of calls each (else 2 s), "-quick" files
--   FDB_WARM=1     warm calls back to back, no flush (K and V in the caches as far as they
--                  fit: where the time goes without memory's share), "phases-warm" files
--   SHAPES         the shape set (default tuner/shapes/bench.lua): its shapes with a target
--   FDB_TABLE      tuned table the plans come from (default results/tuned/<machine>.tsv if present)
--   FDB_OUT        output folder (default results/bench); FDB_PLOT=0: no gnuplot
--   FDB_PLOT_DIR   where perf's data, the gnuplot script and data go (default build/bench)
--   FDB_CMD        the command line written into the report (set by bench/bench.mk)
--   PERF           the perf command (default perf); FDB_PERF_HZ its sampling rate (default 999 per
--                  second: perf's own work slows a 2-core machine's calls by ~13% at 4999)
local root = (debug.getinfo(1, "S").source:gsub("^@", "")):match("^(.*)/bench/[^/]*$") or "."
package.path = ("%s/?.lua;%s/gen/?.lua;%s/lua/?.lua;"):format(root, root, root) .. package.path
local ffi = require("ffi")
local fd = require("flashdecode")
local fdb = require("bench.lib")
local report = require("bench.report")
local M = require("bench.measure")
local side = require("bench.side")
local profile = require("bench.profile")
local sys = require("tuner.sys")

local env = side.env
local QUICK = env("QUICK", "0") ~= "0"
local WARM = env("FDB_WARM", "0") ~= "0"
local NAME = WARM and "phases-warm" or "phases"
local CFG = side.config(root, QUICK, {
  seconds = QUICK and 0.5 or 2, hz = tonumber(env("FDB_PERF_HZ", "999")), perf = env("PERF", "perf"),
  shapes = env("SHAPES", root .. "/tuner/shapes/bench.lua"),
})
CFG.work = CFG.plot_dir .. "/phases"

-- The rows: issue 18's bound rows of the set (side.bound_rows).
local function bound_rows(path) return side.bound_rows(path, QUICK) end

-- Write line to the perf control FIFO and wait for its ack.
local function perf_control(line)
  local ctl = assert(io.open(os.getenv("FDB_PERF_CTL"), "w"))
  ctl:write(line, "\n")
  ctl:close()
  local ack = assert(io.open(os.getenv("FDB_PERF_ACK"), "r"))
  ack:read(4)
  ack:close()
end

-- The child: row n planned (cc backend), its buffers and 3 warm-up calls;
-- then cold calls (caches flushed, perf paused) with perf sampling each call
-- alone, until the calls add up to CFG.seconds (or 60 s have passed); prints
-- one line "key K splits S threads H calls N median_ms M".
local function child(n)
  local row = assert(bound_rows(CFG.shapes)[n], "no row " .. n)
  local info = side.run_info(NAME, root, QUICK)
  local ctx = side.context(info, "cc")
  if info.backend ~= "cc" then error("the cc backend is not available (no C compiler?)", 0) end
  local keep, s = {}, row.shape
  local b = side.buffers("phases", s, row.len, keep)
  local plan = fd.plan(ctx, M.fd_shape(s, row.len))
  local pi = fd.plan_info(plan, row.len, ctx)
  local out = side.alloc("phases", keep, b.nq * side.esize(s.out_dtype))
  local args = fd.args { q = b.q, k = b.k, v = b.v, k_scale = b.k_scale, v_scale = b.v_scale, cur_pos = b.cur_pos, out = out }
  local lib, now = fd.load(), fdb.fdb_now
  for _ = 1, 3 do
    if lib.fd_run(plan, args) ~= 0 then error("fd_run: " .. fd.errmsg(ctx), 0) end
  end
  local times, sum, start = {}, 0, now()
  repeat
    if not WARM and fdb.fdb_flush_caches() ~= 0 then error("out of memory for the cache flush buffer", 0) end
    perf_control("enable")
    local t0 = now()
    local rc = lib.fd_run(plan, args)
    local t = now() - t0
    perf_control("disable")
    if rc ~= 0 then error("fd_run: " .. fd.errmsg(ctx), 0) end
    times[#times + 1], sum = t, sum + t
  until sum >= CFG.seconds or now() - start >= 60
  table.sort(times)
  io.write(("key %s splits %d threads %d calls %d median_ms %.6f\n"):format(pi.key, pi.splits, info.threads, #times,
    times[math.floor((#times + 1) / 2)] * 1e3))
end

-- Run cmd; its stdout, or an error naming what and the exit status.
local function capture(what, cmd)
  local p = assert(io.popen(cmd, "r"))
  local text = p:read("*a")
  local ok, _, code = p:close()
  if not ok then error(("%s failed (exit %s): %s"):format(what, tostring(code), cmd), 0) end
  return text
end

local q = sys.quote

-- Whether perf can sample this process's children: nil, or why not.
local function perf_missing()
  local cmd = ("%s record -q -e cpu-clock -o /dev/null -- true >/dev/null 2>&1"):format(CFG.perf)
  local ok = os.execute(cmd)
  if ok == true or ok == 0 then return nil end
  return ("`%s record -e cpu-clock` does not run here: install perf (Debian: linux-perf; scripts/deps.sh does)"
    .. " and allow sampling (/proc/sys/kernel/perf_event_paranoid <= 2)"):format(CFG.perf)
end

-- Profile row n: perf record around the child, then perf report by source line.
local function profile_row(n, row, progress)
  progress:step(("%s %s"):format(row.name, report.klen(row.len)))
  local base = ("%s/%d"):format(CFG.work, n)
  os.remove(base .. ".ctl"); os.remove(base .. ".ack")
  capture("mkfifo", ("mkfifo %s %s"):format(q(base .. ".ctl"), q(base .. ".ack")))
  local cmd = ("FD_CC_DEBUG=1 FD_CACHE_DIR=%s FDB_PERF_CTL=%s FDB_PERF_ACK=%s %s record -q -e cpu-clock -F %d -D -1 "
    .. "--control=fifo:%s,%s -o %s -- %s %s --child %d"):format(q(CFG.work .. "/cache"), q(base .. ".ctl"), q(base .. ".ack"),
    CFG.perf, CFG.hz, q(base .. ".ctl"), q(base .. ".ack"), q(base .. ".data"), q(env("LUAJIT", "luajit")),
    q(root .. "/bench/phases.lua"), n)
  local r = { row = row }
  local ok, out = pcall(capture, "the profiled child", cmd)
  os.remove(base .. ".ctl"); os.remove(base .. ".ack")
  if not ok then r.status = out; return r end
  local key, splits, threads, calls, ms = out:match("key (%d+) splits (%d+) threads (%d+) calls (%d+) median_ms ([%d.]+)")
  if not key then r.status = "the child said: " .. out; return r end
  r.key, r.splits, r.threads, r.calls, r.call_ms = key, tonumber(splits), tonumber(threads), tonumber(calls), tonumber(ms)
  local rep = capture("perf report", ("%s report -i %s --stdio -q --no-children -t '\t' -F overhead,sample,dso,srcline 2>/dev/null")
    :format(CFG.perf, q(base .. ".data")))
  r.profile = profile.aggregate(rep, profile.template_reader(root .. "/templates"))
  local s = row.shape
  r.gbs = M.kv_bytes(s, row.len) / (r.call_ms * 1e-3) * 1e-9
  -- ns per key of one kv head per thread: the call's thread-time over its keys
  r.ns_per_key = r.call_ms * 1e6 * r.threads / (s.batch * s.n_kv_heads * row.len)
  local in_kernel = 0
  for id, pct in pairs(r.profile.shares) do
    if id ~= "executor" and id ~= "outside" then in_kernel = in_kernel + pct end
  end
  r.status = in_kernel > 0 and "ok" or "no sample in the kernel (perf could not read its lines?)"
  return r
end

-- "12.3" for a share, "" when absent or below 0.05.
local function share_cell(pct) return pct and pct >= 0.05 and ("%.1f"):format(pct) or "" end

-- The phases any row has, in the report's order.
local function phase_columns(rows)
  local seen, cols = {}, {}
  for _, r in ipairs(rows) do
    for _, id in ipairs(r.profile and r.profile.order or {}) do
      if not seen[id] then seen[id] = true; cols[#cols + 1] = id end
    end
  end
  return profile.sort(cols)
end

-- The kernel's hottest C lines of a row: "decode.c.tpl:359 0.5%, ...".
local function c_lines(r)
  local t = {}
  for i = 1, math.min(3, #r.profile.c_lines) do
    local c = r.profile.c_lines[i]
    t[#t + 1] = ("%s %.1f%%"):format(c[1], c[2])
  end
  return #t > 0 and table.concat(t, ", ") or "-"
end

-- The Markdown report.
local function markdown(res, chart)
  local i, cols = res.info, phase_columns(res.rows)
  local head = { "shape", "kv_len", "key", "splits", "calls", "samples", "ms / call", "GB/s", "ns / key / thread" }
  for _, id in ipairs(cols) do head[#head + 1] = profile.label(id) .. " %" end
  local rows, notes = {}, {}
  for _, r in ipairs(res.rows) do
    local t = { r.row.name, report.klen(r.row.len) }
    if r.status == "ok" then
      for _, c in ipairs { "`" .. r.key .. "`", tostring(r.splits), tostring(r.calls), tostring(r.profile.samples), side.num(r.call_ms, 3), side.num(r.gbs, 1), side.num(r.ns_per_key, 2) } do t[#t + 1] = c end
      for _, id in ipairs(cols) do t[#t + 1] = share_cell(r.profile.shares[id]) end
      notes[#notes + 1] = ("- %s %s: the kernel's C, hottest template lines: %s"):format(r.row.name, report.klen(r.row.len), c_lines(r))
    else
      t[#t + 1] = "failed: " .. tostring(r.status):gsub("|", "/")
      for _ = 4, #head do t[#t + 1] = "" end
    end
    rows[#rows + 1] = t
  end
  local L = {
    ("# flashdecode phase profile: %s%s%s"):format(i.machine.slug, QUICK and " (QUICK)" or "", WARM and ", warm" or ""), "",
    side.run_lines(i),
    ("- Rows: the shapes of `%s` with issue 18's target, at the target's lengths, causal, cur_pos = kv_len - 1; each kernel is the planner's plan from %s, built by the cc backend under `FD_CC_DEBUG=1` (#line back to the templates, -g)")
      :format(side.relative(root, CFG.shapes), side.plans_from(root, i)),
    ("- Method: each row in its own process, `perf record -e cpu-clock -F %d` over %s `fd_run` calls on %d threads until they add up to %g s: %s, and perf samples the call alone (its control FIFO); the planning, compiling, buffer fill and 3 warm-up calls are not sampled. `perf report --sort dso,srcline` names each sample's template line; a share is the %% of the samples. A share counts time, stalls included: a phase waiting on memory is charged for the wait. ms / call = the median call (perf's own work on these cores makes it a few %% slower than `make bench`'s); GB/s = KV bytes / that")
      :format(CFG.hz, WARM and "warm" or "cold", i.threads, CFG.seconds, WARM
        and "the calls back to back, no flush (`FDB_WARM=1`: K and V in the caches as far as they fit), perf paused between them"
        or ("before each call the caches are flushed (%d MiB read) with perf paused"):format(i.flush / 2 ^ 20)),
    "- Phases: a template statement's inline assembly (`$(simd_NAME())` in templates/decode.c.tpl; bench/profile.lua names them); kernel's C = the template's C between them (loops, pointers, the softmax bookkeeping); executor = libflashdecode (work items, the thread pool, merging splits); outside = everything else (libc, the OS, LuaJIT). ns / key / thread = the call's time x threads / (batch x kv heads x kv_len): the thread-time one key of one kv head costs; times a phase's share, that phase's",
    "- The statements are the same machine code under tcc (the default backend); the C between them is gcc's here; calls = the calls sampled, samples = perf's samples of them",
    ("- Read bandwidth sampled at the end (%s sum, 256 MiB, all threads): %.1f GB/s"):format(i.bw_kernel, res.bw_best),
    side.load_line(i), "",
    report.md_table(head, rows), "" }
  for _, n in ipairs(notes) do L[#L + 1] = n end
  if chart then L[#L + 1] = ("\n## Chart\n\n![share of the samples by phase, per row](%s)\n"):format(chart) end
  return table.concat(L, "\n")
end

-- The chart's data (one line per row: the share of each phase) and its gnuplot script.
local function chart_script(res)
  local dir, name, cols = CFG.plot_dir .. "/" .. res.info.name, res.info.name, phase_columns(res.rows)
  local head = { "# row" }
  for _, id in ipairs(cols) do head[#head + 1] = profile.label(id) end
  local lines = { table.concat(head, "\t") }
  for _, r in ipairs(res.rows) do
    local t = { ('"%s %s"'):format(r.row.name, report.klen(r.row.len)) }
    for _, id in ipairs(cols) do t[#t + 1] = ("%.3f"):format(r.profile and r.profile.shares[id] or 0) end
    lines[#lines + 1] = table.concat(t, "\t")
  end
  report.write_file(dir .. "/shares.dat", table.concat(lines, "\n") .. "\n")
  local plots = {}
  for k, id in ipairs(cols) do
    plots[#plots + 1] = ("%s using %d%s title '%s' lc rgb '%s'"):format(k == 1 and ("'%s/shares.dat'"):format(dir) or "''",
      k + 1, k == 1 and ":xtic(1)" or "", (profile.label(id):gsub("'", "")), profile.color(id))
  end
  local body = table.concat({ "set grid ytics", "set key outside right top vertical font ',9'",
    "set style data histograms", "set style histogram rowstacked", "set style fill solid 0.9 border -1",
    "set boxwidth 0.7", "set xtics rotate by -20 font ',9'", "set yrange [0:100]",
    ("set title 'share of the samples by template statement (%s, %s)'"):format(res.info.machine.slug, res.info.commit),
    "set ylabel '% of the samples'", "plot " .. table.concat(plots, ", ") }, "\n")
  return side.chart_script(dir, CFG.out, name, body)
end

-- The failures of a run as lines.
local function failures(rows)
  local bad = {}
  for _, r in ipairs(rows) do
    if r.status ~= "ok" then bad[#bad + 1] = ("%s %s: %s"):format(r.row.name, report.klen(r.row.len), r.status) end
  end
  return bad
end

-- Main: the rows, each profiled in a child; report and chart.
local function main()
  if arg[1] == "--child" then return child(tonumber(arg[2])) end
  local why = perf_missing()
  if why then io.stderr:write("bench-phases: ", why, "\n"); os.exit(1) end
  local info = side.run_info(NAME, root, QUICK)
  side.context(info, "cc")
  capture("mkdir", ("mkdir -p %s"):format(q(CFG.work)))
  local todo = bound_rows(CFG.shapes)
  local progress = M.progress(#todo)
  local t0 = fdb.fdb_now()
  local res = { info = info, bw = {}, rows = {} }
  for n, row in ipairs(todo) do
    local r = profile_row(n, row, progress)
    res.rows[#res.rows + 1] = r
  end
  progress:done()
  side.sample_bw(info, res.bw, "end", 3, 256 * 2 ^ 20)
  side.finish("bench-phases", CFG.out, info, res, t0, chart_script, markdown, failures(res.rows))
end

main()
