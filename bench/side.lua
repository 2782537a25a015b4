-- What the side benchmarks (bench/paged.lua, bench/uneven.lua,
-- bench/features.lua) share: the run's identity, the context their plans come
-- from, aligned buffers and the q/K/V problem, bandwidth samples, timed
-- runners, first calls, paired ratios and the report's small formatters. Each
-- takes the benchmark's name ("paged", "uneven", "features") where it shows in
-- a file or message.
local ffi = require("ffi")
local fd = require("flashdecode")
local fdb = require("bench.lib")
local machine = require("tuner.machine")
local report = require("bench.report")
local measure = require("bench.measure")
local stats = require("tuner.stats")
local sys = require("tuner.sys")
local space = require("space")

local M = {}

-- $k, or d when it is unset or empty.
M.env = sys.env

-- The settings every side benchmark shares (out, plot_dir, backend and the
-- bandwidth samples' size and repetitions, from $FDB_OUT, $FDB_PLOT_DIR,
-- $FDB_BACKEND and quick), with the benchmark's own fields added.
function M.config(root, quick, own)
  local cfg = {
    out = M.env("FDB_OUT", root .. "/results/bench"),
    plot_dir = M.env("FDB_PLOT_DIR", root .. "/build/bench"),
    backend = M.env("FDB_BACKEND", "tcc"),
    bw_bytes = 512 * 2 ^ 20, bw_reps = quick and 3 or 5,
  }
  for k, v in pairs(own) do cfg[k] = v end
  return cfg
end

-- The run's identity: machine, commit, date, library build, load; its
-- report is named <name>-<machine>[-quick].
function M.run_info(name, root, quick)
  local m = machine.info()
  return { machine = m, commit = machine.commit(root), date = os.date("!%Y-%m-%d %H:%M UTC"),
           build = fd.build_info(), threads = m.cores, name = name .. "-" .. m.slug .. (quick and "-quick" or ""),
           load_start = machine.sh("cat /proc/loadavg"), flush = tonumber(fdb.fdb_flush_bytes()),
           bw_kernel = ffi.string(fdb.fdb_bw_kernel()), hugepages = fdb.fdb_hugepages() ~= 0,
           cmd = M.env("FDB_CMD", (quick and "QUICK=1 " or "") .. "luajit bench/" .. name .. ".lua") }
end

-- One all-threads read bandwidth sample of bytes, appended to bw.
function M.sample_bw(info, bw, when, reps, bytes)
  bw[#bw + 1] = { when = when, gbs = fdb.fdb_read_bw_gbs(bytes, info.threads, reps) }
end

-- The best and the median of the bandwidth samples bw (load only lowers them).
function M.bw_summary(bw)
  local t = {}
  for i, s in ipairs(bw) do t[i] = s.gbs end
  table.sort(t)
  return t[#t], stats.median(t)
end

-- Issue 18's bound rows of the shape set at path: each shape with a target
-- (and keep(s), when given), at each length of its target; quick: only those
-- among its quick lengths. Rows { name, shape, len, target = its pct }.
function M.bound_rows(path, quick, keep)
  local rows = {}
  for _, s in ipairs(space.load_shapes(path)) do
    local quick_len = {}
    for _, len in ipairs(s.quick or {}) do quick_len[len] = true end
    if s.target and (not keep or keep(s)) then
      for _, len in ipairs(s.target.at) do
        if not quick or quick_len[len] then rows[#rows + 1] = { name = s.name, shape = s, len = len, target = s.target.pct } end
      end
    end
  end
  return rows
end

-- The context every plan comes from: the tuned table ($FDB_TABLE or the
-- machine's) when it loads, else the heuristic; info records which.
function M.context(info, backend)
  local tbl = M.env("FDB_TABLE", nil) or machine.tuned_table(info.machine.slug)
  local ok, ctx = pcall(fd.create, { threads = info.threads, backend = backend, table = tbl })
  info.table = ok and tbl or nil
  if ok and tbl and fd.errmsg(ctx) ~= "" then info.table_note, info.table = fd.errmsg(ctx), nil end
  if not ok then
    info.table_note = tbl and tostring(ctx)
    ctx = fd.create { threads = info.threads, backend = backend }
  end
  info.backend = fd.ctx_info(ctx).backend == 1 and "cc" or "tcc"
  return ctx
end

-- A buffer of bytes (64-byte aligned, huge pages as the bench asks), kept in list.
function M.alloc(name, list, bytes)
  local p = fdb.fdb_alloc(math.max(bytes, 64))
  if p == nil then error(("bench-%s: out of memory allocating %.0f MiB"):format(name, bytes / 2 ^ 20), 0) end
  list[#list + 1] = p
  return p
end

-- A runner of fd_run(plan, args) that appends each call's seconds to
-- v.times; a failure is an error with the context's message.
function M.timed_runner(ctx, plan, args, v)
  local lib, now = fd.load(), fdb.fdb_now
  return function()
    local t0 = now()
    local rc = lib.fd_run(plan, args)
    v.times[#v.times + 1] = now() - t0
    if rc ~= 0 then error(("fd_run: %s (code %d)"):format(fd.errmsg(ctx), rc), 0) end
  end
end

-- The first call of every variant with a runner v.fn, timed: the slowest
-- sets every v.first_s (the same repetitions for all: paired rounds); a
-- failure sets v.status. Then after(v) for each (if given), and v.times emptied.
function M.first_calls(vs, after)
  local first = 0
  for _, v in ipairs(vs) do
    if v.fn then
      local t0 = fdb.fdb_now()
      local ok, err = pcall(v.fn)
      first = math.max(first, fdb.fdb_now() - t0)
      if not ok then v.status = tostring(err) end
    end
  end
  for _, v in ipairs(vs) do
    v.first_s = first
    if after then after(v) end
    v.times = {}
  end
end

-- Paired figures of v against ref from their per-round times v[field] and
-- ref[field] (default "times"): the median of per-round ratios with its 95%
-- sign-test interval (v.ratio_paired, v.ratio_lo, v.ratio_hi), and the ratio
-- of the cold medians (v.ratio). Nothing when either lacks times or stats.
function M.paired(v, ref, field)
  local a, b = v[field or "times"], ref[field or "times"]
  if not (a and b and v.cold and ref.cold) then return end
  local ratios = {}
  for i = 1, math.min(#a, #b) do ratios[i] = a[i] / b[i] end
  v.ratio_lo, v.ratio_paired, v.ratio_hi = stats.interval(ratios)
  v.ratio = v.cold.median / ref.cold.median
end

-- A paired ratio with its interval: "1.004 [0.936, 1.104]", or "failed".
function M.ci(v)
  if not v.ratio_paired then return "failed" end
  return ("%s [%s, %s]"):format(M.num(v.ratio_paired, 3), M.num(v.ratio_lo, 3), M.num(v.ratio_hi, 3))
end

-- v's paired ratio inverted and times scale, with its interval, digits
-- decimals and unit: "15.2x [14.0, 16.4]" (a speedup), "94% [91, 97]" (a
-- share); "-" without a paired ratio.
function M.inverse_ci(v, scale, digits, unit)
  if not v.ratio_paired then return "-" end
  local n = M.num
  return ("%s%s [%s, %s]"):format(n(scale / v.ratio_paired, digits), unit, n(scale / v.ratio_hi, digits),
                                  n(scale / v.ratio_lo, digits))
end

-- The cells median ms, q1–q3 ms, GB/s and "% of bw (best / median)" of a
-- variant's cold stats c reading bytes; and the GB/s.
function M.time_cells(c, bytes, bw_best, bw_med)
  local g = bytes / (c.median * 1e-3) * 1e-9
  return { M.num(c.median, 3), ("%s–%s"):format(M.num(c.q1, 3), M.num(c.q3, 3)), M.num(g, 1),
           ("%s%% / %s%%"):format(M.num(g / bw_best * 100, 0), M.num(g / bw_med * 100, 0)) }, g
end

-- The problem of shape s (a table of fd_shape fields) at kv_len len in
-- buffers kept in list: q, K, V (BHSD, random in [-1, 1], seeds 1, 2, 3;
-- int8 and block K and V as bench/measure.lua's fill_kv) and
-- cur_pos = len - 1 for every row; nq, nkv their element counts.
function M.buffers(name, s, len, list)
  local b = { nq = s.batch * s.n_q_heads * s.head_dim, nkv = s.batch * s.n_kv_heads * len * s.head_dim }
  b.q = M.alloc(name, list, b.nq * M.esize(s.q_dtype))
  b.k, b.v = M.alloc(name, list, b.nkv * M.esize(s.kv_dtype)), M.alloc(name, list, b.nkv * M.esize(s.kv_dtype))
  fdb.fdb_fill(b.q, b.nq, fd.enum("dtype", s.q_dtype), 1, -1, 1)
  measure.fill_kv(b, s, b.nkv, function(bytes) return M.alloc(name, list, bytes) end)
  b.cur_pos = ffi.cast("int32_t *", M.alloc(name, list, 4 * s.batch))
  for i = 0, s.batch - 1 do b.cur_pos[i] = len - 1 end
  return b
end

-- Bytes of one element of dtype name.
function M.esize(name) return fd.DTYPE_SIZE[fd.enum("dtype", name)] end

-- x with d decimals (2), "-" for nil, NaN and infinity.
function M.num(x, d)
  if x == nil or x ~= x or x == math.huge then return "-" end
  return ("%." .. (d or 2) .. "f"):format(x)
end

-- The bandwidth samples of res as one line.
function M.bw_line(res)
  local t = {}
  for _, s in ipairs(res.bw) do t[#t + 1] = ("%s %.1f"):format(s.when, s.gbs) end
  return table.concat(t, ", ")
end

-- The gnuplot script dir/ratio.gp drawing body as out/name.svg and .png;
-- returns its path and the svg's name.
function M.chart_script(dir, out, name, body)
  local text = {}
  for _, t in ipairs { { "svg size 900,480 dynamic enhanced font 'sans,11' background rgb 'white'", "svg" },
                       { "pngcairo size 900,480 enhanced font 'sans,10' background rgb 'white'", "png" } } do
    text[#text + 1] = ("set terminal %s\nset output '%s/%s.%s'\n%s\n"):format(t[1], out, name, t[2], body)
  end
  local gp = dir .. "/ratio.gp"
  report.write_file(gp, table.concat(text) .. "set output\n")
  return gp, name .. ".svg"
end

-- path relative to the repository root when under it.
function M.relative(root, path)
  return path:sub(1, #root + 1) == root .. "/" and path:sub(#root + 2) or path
end

-- Where the plans came from, in words: the tuned table, or the heuristic (and why).
function M.plans_from(root, i)
  return i.table and ("the tuned table `" .. M.relative(root, i.table) .. "`")
    or ("the heuristic" .. (i.table_note and (" (tuned table refused: " .. i.table_note .. ")") or ""))
end

-- The report's first two lines (one string) of run info i: command, commit,
-- date, run time; CPU and build.
function M.run_lines(i)
  return ("- Made by `%s`; commit `%s`; %s; run time %.0f s\n"):format(i.cmd, i.commit, i.date, i.seconds)
    .. ("- CPU: %s, %d online cores; %d threads; flashdecode %s (%s backend), templates `%s`"):format(i.machine.model,
      i.threads, i.threads, i.build.version, i.backend, i.build.templates_hash)
end

-- The report's load-average line of run info i.
function M.load_line(i)
  return ("- Load average at start `%s`, at end `%s` (other processes on the machine make timings noisy)"):format(
    i.load_start, i.load_end)
end

-- Finish a side benchmark's run (name as in "bench-paged"): the bandwidth
-- summary, the run time and load, the report written to out (markdown(res,
-- chart)) with its chart (chart_script(res) -> gnuplot script, chart path;
-- drawn unless FDB_PLOT=0), both said on stderr; then the sanity failures
-- (a list of sentences, none for a benchmark without checks) said, and the
-- process ended with 1 if there are any.
function M.finish(name, out, info, res, t0, chart_script, markdown, bad)
  res.bw_best, res.bw_median = M.bw_summary(res.bw)
  info.seconds, info.load_end = fdb.fdb_now() - t0, machine.sh("cat /proc/loadavg")
  local gp, chart = chart_script(res)
  local md = report.write_file(("%s/%s.md"):format(out, info.name), markdown(res, chart))
  if M.env("FDB_PLOT", "1") ~= "0" then require("bench.plot").run { gp } end
  io.stderr:write(("%s: wrote %s\n%s: %.0f s\n"):format(name, md, name, info.seconds))
  if bad and #bad > 0 then
    io.stderr:write(name, ": sanity check failed:\n  ", table.concat(bad, "\n  "), "\n")
    os.exit(1)
  end
end

return M
