-- `make bench-peers`: flashdecode against ggml's ggml_flash_attn_ext (llama.cpp's
-- CPU flash attention) on the same inputs. Runs the C harness bench/peers/peers.c
-- once per shape and kv length (both libraries, each thread count, interleaved
-- cold rounds), then writes results/peers/<machine>[-quick].{md,tsv} and a
-- gnuplot script for the ratio chart (<name>-ratio.svg/.png). Never asserts a time.
--   QUICK=1          the shapes' quick lengths, all cores only, fewer repetitions
--   SHAPES=path      another shape file (default bench/peers/shapes.lua)
--   FDP_HARNESS      the harness (default build/peers/fdpeers); FDP_STATUS its ggml.status
--   FDP_TABLE        tuned table (default results/tuned/<machine>.tsv if present)
--   FDP_OUT          output folder (default results/peers); FDP_PLOT_DIR gnuplot files
--   FDP_PLOT=0       write the gnuplot script but do not run it
--   FDP_COMMAND      the command line quoted in the report (default "make bench-peers")
local root = (debug.getinfo(1, "S").source:gsub("^@", "")):match("^(.*)/bench/peers/[^/]*$") or "."
package.path = ("%s/?.lua;%s/gen/?.lua;%s/lua/?.lua;"):format(root, root, root) .. package.path
local machine = require("tuner.machine")
local klen = require("bench.report").klen

local env = function(k, d) local v = os.getenv(k) return (v and v ~= "") and v or d end
local QUICK = env("QUICK", "0") ~= "0"
local HARNESS = env("FDP_HARNESS", root .. "/build/peers/fdpeers")
local CFG = {
  shapes = env("SHAPES", root .. "/bench/peers/shapes.lua"),
  status = env("FDP_STATUS", (HARNESS:match("^(.*)/[^/]*$") or ".") .. "/ggml.status"),
  out = env("FDP_OUT", root .. "/results/peers"),
  plot_dir = env("FDP_PLOT_DIR", root .. "/build/peers/plot"),
  target = QUICK and 0.2 or 1.5, rmin = QUICK and 5 or 11, rmax = QUICK and 15 or 61,
  tol = 0.10,                  -- an output agrees when max |out - ref| <= tol * max |ref|
}

local sh = machine.sh

-- Write a whole file (dies naming it on failure).
local function write_file(path, text)
  local f = assert(io.open(path, "w"), "bench-peers: cannot write " .. path)
  f:write(text)
  f:close()
end

-- The ggml build's status file as a table (status = "ok" | "unavailable", why, versions, flags).
local function peer_status()
  local f = io.open(CFG.status)
  if not f then return { status = "unavailable", why = "no " .. CFG.status .. " (bench/peers/build_ggml.sh did not run)" } end
  local t = {}
  for line in f:lines() do
    local k, v = line:match("^([%w_]+)\t(.*)$")
    if k then t[k] = v end
  end
  f:close()
  return t
end

-- Run identity: machine, commit, date, load, thread counts, peer, table.
local function run_info()
  local m = machine.info()
  local commit = machine.commit(root)
  local threads = (QUICK or m.cores == 1) and { m.cores } or { m.cores, 1 }
  return { machine = m, commit = commit, date = os.date("!%Y-%m-%d %H:%M UTC"), load_start = sh("cat /proc/loadavg"),
           threads = threads, name = m.slug .. (QUICK and "-quick" or ""), peer = peer_status(),
           table = env("FDP_TABLE", nil) or machine.tuned_table(m.slug), cc = sh("cc --version | head -1"),
           command = env("FDP_COMMAND", "make bench-peers" .. (QUICK and " QUICK=1" or "")) }
end

-- The harness command line for one shape and length.
local function harness_cmd(info, s, len)
  local a = { HARNESS, "name=" .. s.name, "batch=" .. s.batch, "hq=" .. s.n_q_heads, "hkv=" .. s.n_kv_heads,
              "d=" .. s.head_dim, "len=" .. len, "q=" .. s.q_dtype, "kv=" .. s.kv_dtype, "out=" .. s.out_dtype,
              "threads=" .. table.concat(info.threads, ","), "target=" .. CFG.target, "rmin=" .. CFG.rmin,
              "rmax=" .. CFG.rmax, "peer=" .. (info.peer.status == "ok" and 1 or 0) }
  if info.table then a[#a + 1] = "table=" .. info.table end
  for i, w in ipairs(a) do a[i] = "'" .. w:gsub("'", "'\\''") .. "'" end
  return table.concat(a, " ")
end

-- Parse the harness's lines into one point: bandwidth samples, plans, times, errors, notes.
local function parse(text, point, bw)
  for line in text:gmatch("[^\n]+") do
    local f = {}
    for w in (line .. "\t"):gmatch("([^\t]*)\t") do f[#f + 1] = w end
    local kind, t = f[1], tonumber(f[2]) or tonumber(f[3])
    if kind == "bw" then
      bw[#bw + 1] = { threads = tonumber(f[2]), gbs = tonumber(f[3]) }
    elseif kind == "plan" then
      point.plans[t] = { key = f[3], chunk = f[4], tile = f[5], splits = f[6], threads = f[7], from_table = f[8] == "1" }
    elseif kind == "time" then
      point.times[f[2] .. "/" .. f[3]] = { median = tonumber(f[4]), q1 = tonumber(f[5]), q3 = tonumber(f[6]),
                                           min = tonumber(f[7]), n = tonumber(f[8]), bytes = tonumber(f[9]) }
    elseif kind == "err" then
      point.errs[f[2] .. "/" .. f[3]] = { err = tonumber(f[4]), ref = tonumber(f[5]) }
    elseif kind == "note" then
      point.notes[f[2]] = true
    end
  end
end

-- Run every shape and length through the harness; returns points and bandwidth samples.
local function run_all(info, shapes)
  local points, bw, todo = {}, {}, 0
  for _, s in ipairs(shapes) do todo = todo + #(QUICK and (s.quick or { s.kv_len[1] }) or s.kv_len) end
  for _, s in ipairs(shapes) do
    for _, len in ipairs(QUICK and (s.quick or { s.kv_len[1] }) or s.kv_len) do
      local p = { shape = s, len = len, plans = {}, times = {}, errs = {}, notes = {} }
      io.stderr:write(("bench-peers: [%d/%d] %s %s\n"):format(#points + 1, todo, s.name, klen(len)))
      local h = io.popen(harness_cmd(info, s, len) .. " 2>&1; echo \"exit\t$?\"")
      local out = h:read("*a")
      h:close()
      parse(out, p, bw)
      local rc = tonumber(out:match("exit\t(%d+)%s*$"))
      if rc ~= 0 then p.notes[("the harness failed (exit %s): %s"):format(rc, out:gsub("%s+", " "):sub(-300))] = true end
      points[#points + 1] = p
    end
  end
  return points, bw
end

-- Best and median of the bandwidth samples of a thread count.
local function bw_stats(bw, threads)
  local v = {}
  for _, b in ipairs(bw) do if b.threads == threads and b.gbs then v[#v + 1] = b.gbs end end
  table.sort(v)
  if #v == 0 then return nil end
  return { best = v[#v], median = (v[math.floor((#v + 1) / 2)] + v[math.ceil((#v + 1) / 2)]) / 2, n = #v }
end

-- A time in ms with 3 significant digits ("-" when missing).
local function ms(x)
  if not x then return "-" end
  return x >= 100 and ("%.0f"):format(x) or x >= 10 and ("%.1f"):format(x) or x >= 1 and ("%.2f"):format(x)
    or ("%.3f"):format(x)
end

-- Cell "median (q1-q3)" of a timing.
local function time_cell(t)
  return t and ("%s (%s-%s)"):format(ms(t.median), ms(t.q1), ms(t.q3)) or "-"
end

-- KV GB/s of a timing and its share of the best and the median bandwidth sample.
local function gbs_cell(t, b)
  if not t then return "-", nil end
  local g = t.bytes / (t.median * 1e-3) * 1e-9
  if not b then return ("%.1f"):format(g), g end
  return ("%.1f (%.0f%%; %.0f%%)"):format(g, g / b.best * 100, g / b.median * 100), g
end

-- "0.04% ok" : an error as a share of max |ref|, and whether it is within tolerance.
local function err_cell(e)
  if not e or not e.err then return "-" end
  if e.err ~= e.err then return "NaN, disagrees" end
  local rel = e.ref > 0 and e.err / e.ref or e.err
  return ("%.2g%%%s"):format(rel * 100, rel <= CFG.tol and "" or " **disagrees**")
end

-- The KV storage of a shape for each library.
local function kv_cell(s)
  if s.kv_dtype == "int8" then return "int8 / q8_0" end
  return s.kv_dtype
end

-- The report's rows: one per point and thread count, with everything computed.
local function rows_of(info, points, bw)
  local rows = {}
  for _, p in ipairs(points) do
    for _, t in ipairs(info.threads) do
      local fd, gg = p.times["flashdecode/" .. t], p.times["ggml/" .. t]
      local b = bw_stats(bw, t)
      local r = { p = p, threads = t, fd = fd, gg = gg, bw = b, plan = p.plans[t],
                  fd_err = p.errs["flashdecode/" .. t], gg_err = p.errs["ggml/" .. t] }
      r.fd_cell, r.fd_gbs = gbs_cell(fd, b)
      r.gg_cell, r.gg_gbs = gbs_cell(gg, b)
      r.ratio = fd and gg and gg.median / fd.median or nil
      r.ratio_min = fd and gg and gg.min / fd.min or nil
      rows[#rows + 1] = r
    end
  end
  return rows
end

-- Geometric mean, min and max of the median ratios at a thread count, the
-- geometric mean of the ratios of the fastest calls, and the rows ggml wins.
local function summary(rows, threads)
  local n, lsum, lmin, lo, hi, wins = 0, 0, 0, nil, nil, {}
  for _, r in ipairs(rows) do
    if r.threads == threads and r.ratio then
      n, lsum, lmin = n + 1, lsum + math.log(r.ratio), lmin + math.log(r.ratio_min)
      if not lo or r.ratio < lo.ratio then lo = r end
      if not hi or r.ratio > hi.ratio then hi = r end
      if r.ratio < 1 then wins[#wins + 1] = ("%s %s (%.2fx)"):format(r.p.shape.name, klen(r.p.len), r.ratio) end
    end
  end
  if n == 0 then return nil end
  return { n = n, gmean = math.exp(lsum / n), gmean_min = math.exp(lmin / n), lo = lo, hi = hi, wins = wins }
end

-- Lines of the results table.
local function table_lines(rows)
  local L = { "| shape | kv_len | KV (ours / ggml) | threads | flashdecode ms (q1-q3) | GB/s (% best; % median bw) " ..
              "| ggml ms (q1-q3) | GB/s (% best; % median bw) | ggml / ours: median; fastest | max error ours; ggml | flashdecode plan |",
              "|---|---|---|---|---|---|---|---|---|---|---|" }
  for _, r in ipairs(rows) do
    local pl = r.plan and ("chunk %s, tile %s, splits %s%s"):format(r.plan.chunk, r.plan.tile, r.plan.splits,
      r.plan.from_table and ", table" or ", heuristic") or "-"
    L[#L + 1] = ("| %s | %s | %s | %d | %s | %s | %s | %s | %s | %s; %s | %s |"):format(r.p.shape.name,
      klen(r.p.len), kv_cell(r.p.shape), r.threads, time_cell(r.fd), r.fd_cell, time_cell(r.gg), r.gg_cell,
      r.ratio and ("**%.2fx**; %.2fx"):format(r.ratio, r.ratio_min) or "-", err_cell(r.fd_err), err_cell(r.gg_err), pl)
  end
  return L
end

-- The ratio chart: data and gnuplot script in the plot folder, SVG and PNG next to
-- the report. Per shape and length: the median ratio of each thread count (solid)
-- and the ratio of the fastest calls (light).
local function write_chart(info, rows)
  os.execute(("mkdir -p '%s'"):format(CFG.plot_dir))
  local data, labels = {}, {}
  for _, r in ipairs(rows) do
    local key = r.p.shape.name .. " " .. klen(r.p.len)
    if not labels[key] then labels[#labels + 1], labels[key] = key, {} end
    labels[key][r.threads] = r
  end
  local function num(x) return x and ("%.4f"):format(x) or "NaN" end
  local top = 2
  for _, r in ipairs(rows) do top = math.max(top, r.ratio or 0, r.ratio_min or 0) end
  for _, k in ipairs(labels) do
    local cols = { '"' .. k .. '"' }
    for _, t in ipairs(info.threads) do
      local r = labels[k][t] or {}
      cols[#cols + 1], cols[#cols + 2] = num(r.ratio), num(r.ratio_min)
    end
    data[#data + 1] = table.concat(cols, "\t")
  end
  local dat = ("%s/%s-ratio.dat"):format(CFG.plot_dir, info.name)
  write_file(dat, table.concat(data, "\n") .. "\n")
  local plots, colors = {}, { { "#1f5fa8", "#9cc0e8" }, { "#c0504d", "#efb3b1" } }
  for i, t in ipairs(info.threads) do
    local c, th = colors[(i - 1) % 2 + 1], ("%d thread%s"):format(t, t > 1 and "s" or "")
    plots[#plots + 1] = ("'%s' using %d:xtic(1) title '%s, median' lc rgb '%s'"):format(dat, 2 * i, th, c[1])
    plots[#plots + 1] = ("'' using %d title '%s, fastest call' lc rgb '%s'"):format(2 * i + 1, th, c[2])
  end
  local body = table.concat({
    "set title 'ggml flash\\_attn\\_ext time / flashdecode time, cold cache (above 1: flashdecode is faster)'",
    "set style data histograms", "set style histogram clustered gap 1", "set style fill solid 0.9 border -1",
    "set logscale y 2", "set ylabel 'ggml time / flashdecode time'",
    ("set yrange [0.25:%g]"):format(2 ^ math.ceil(math.log(top * 1.05) / math.log(2))),
    "set xtics rotate by -40 left font ',9' nomirror", "set grid ytics", "set key outside top center horizontal",
    "set bmargin 9", "set rmargin 6",
    "set arrow from graph 0, first 1 to graph 1, first 1 nohead lw 2 lc rgb 'black' front",
    "plot " .. table.concat(plots, ", ") }, "\n")
  local w = math.max(1000, 60 * #labels)
  local out = ("%s/%s-ratio"):format(CFG.out, info.name)
  local gp = ("%s/%s-ratio.gp"):format(CFG.plot_dir, info.name)
  write_file(gp, table.concat({
    ("set terminal svg size %d,560 dynamic enhanced font 'sans,11' background rgb 'white'"):format(w),
    ("set output '%s.svg'"):format(out), body,
    ("set terminal pngcairo size %d,560 enhanced font 'sans,10' background rgb 'white'"):format(w),
    ("set output '%s.png'"):format(out), "replot", "unset output" }, "\n") .. "\n")
  return gp, info.name .. "-ratio"
end

-- Header lines: identity, load, peer, table, bandwidth.
local function header_lines(info, bw)
  local pr = info.peer
  local L = { ("# flashdecode and ggml's flash attention side by side: %s"):format(info.name), "",
    ("`%s`, commit `%s`, %s, %.0f s. Machine: %s, %d cores. Load average (1, 5, 15 min) at the start %s, at the end %s "
      .. "(the machine is shared: other work ran during the measurements; both libraries are timed in the same "
      .. "interleaved rounds, so their ratio is the robust figure)."):format(info.command, info.commit, info.date,
      info.seconds, info.machine.model, info.machine.cores, info.load_start:match("^(%S+ %S+ %S+)") or "?",
      info.load_end:match("^(%S+ %S+ %S+)") or "?"), "" }
  if pr.status == "ok" then
    L[#L + 1] = ("Peer: **ggml %s** (`ggml_flash_attn_ext`, CPU backend) from the source distribution of "
      .. "llama-cpp-python %s on PyPI (`vendor/llama.cpp/ggml`), built on this machine by bench/peers/build_ggml.sh "
      .. "with cmake: `%s`, %s; its own threadpool (no OpenMP), polling off, one thread pinned per core.")
      :format(pr.ggml or "?", pr.llama_cpp_python or "?", pr.flags or "?", pr.compiler or "?")
  else
    L[#L + 1] = ("**peer unavailable: %s** (only flashdecode was measured)."):format(pr.why or "unknown reason")
  end
  L[#L + 1] = ""
  L[#L + 1] = ("flashdecode: tcc backend, %s."):format(info.table and
    ("tuned table `%s`%s"):format(info.table:gsub("^" .. root:gsub("%p", "%%%0") .. "/", ""),
      info.table_note and (": **refused** (%s), so every plan is the heuristic's"):format(info.table_note) or "")
    or "no tuned table for this machine (heuristic plans)")
  L[#L + 1] = ""
  local parts = {}
  for _, t in ipairs(info.threads) do
    local b = bw_stats(bw, t)
    if b then parts[#parts + 1] = ("%d thread%s: best %.1f GB/s, median %.1f GB/s"):format(t, t > 1 and "s" or "", b.best, b.median) end
  end
  L[#L + 1] = ("Read bandwidth measured in the same run (bench/bw.c: a sum over 512 MiB, best of 5, by each "
    .. "shape's process before its timings; %d sample(s) per thread count): %s. The percentages below are of the "
    .. "best and of the median sample of the row's thread count."):format(math.floor(#bw / math.max(1, #info.threads)),
    table.concat(parts, "; "))
  return L
end

-- The closing sections: summary, method, ggml's paths, onnxruntime.
local function text_lines(info, rows)
  local L = { "", "## Summary", "" }
  if info.peer.status ~= "ok" then L[#L + 1] = "No ratio: the peer was unavailable." end
  for _, t in ipairs(info.threads) do
    local s = summary(rows, t)
    if s then
      L[#L + 1] = ("- %d thread%s: ggml takes **%.2fx** flashdecode's median time (geometric mean over %d rows; "
        .. "%.2fx for the fastest calls), from %.2fx (%s %s) to %.2fx (%s %s); %s."):format(t, t > 1 and "s" or "",
        s.gmean, s.n, s.gmean_min, s.lo.ratio,
        s.lo.p.shape.name, klen(s.lo.p.len), s.hi.ratio, s.hi.p.shape.name, klen(s.hi.p.len),
        #s.wins == 0 and "ggml is faster on no row" or "ggml is faster on " .. table.concat(s.wins, ", "))
    end
  end
  return L
end

-- Notes the harness printed, per shape (deduplicated), and the shapes' own notes.
local function note_lines(points)
  local L, seen = {}, {}
  for _, p in ipairs(points) do
    for n in pairs(p.notes) do
      if not n:match("^table: ") and not seen[n] then seen[n] = true L[#L + 1] = ("- %s %s: %s"):format(p.shape.name, klen(p.len), n) end
    end
    if p.shape.peer_note and not seen[p.shape.peer_note] then
      seen[p.shape.peer_note] = true
      L[#L + 1] = ("- %s: %s."):format(p.shape.name, p.shape.peer_note)
    end
  end
  return L
end

-- The method and what the numbers mean: the static text of bench/peers/method.md.
local function method_lines()
  local f = io.open(root .. "/bench/peers/method.md")
  local t = f and f:read("*a") or ""
  if f then f:close() end
  return { t }
end

-- The TSV of every row.
local function write_tsv(info, rows)
  local L = { table.concat({ "shape", "kv_len", "batch", "n_q_heads", "n_kv_heads", "head_dim", "q_dtype", "kv_dtype",
    "out_dtype", "threads", "impl", "median_ms", "q1_ms", "q3_ms", "min_ms", "reps", "kv_bytes", "gbs", "pct_bw_best",
    "pct_bw_median", "ratio_ggml_over_ours", "ratio_of_min", "max_abs_err", "max_abs_ref", "key", "splits", "from_table" }, "\t") }
  for _, r in ipairs(rows) do
    local s = r.p.shape
    for _, im in ipairs { { "flashdecode", r.fd, r.fd_gbs, r.fd_err }, { "ggml", r.gg, r.gg_gbs, r.gg_err } } do
      local t, g, e = im[2], im[3], im[4]
      if t then
        L[#L + 1] = table.concat({ s.name, r.p.len, s.batch, s.n_q_heads, s.n_kv_heads, s.head_dim, s.q_dtype,
          s.kv_dtype, s.out_dtype, r.threads, im[1], t.median, t.q1, t.q3, t.min, t.n, t.bytes, ("%.3f"):format(g),
          r.bw and ("%.1f"):format(g / r.bw.best * 100) or "-", r.bw and ("%.1f"):format(g / r.bw.median * 100) or "-",
          r.ratio and ("%.4f"):format(r.ratio) or "-", r.ratio_min and ("%.4f"):format(r.ratio_min) or "-", e and e.err or "-", e and e.ref or "-",
          im[1] == "flashdecode" and r.plan and r.plan.key or "-", im[1] == "flashdecode" and r.plan and r.plan.splits or "-",
          im[1] == "flashdecode" and r.plan and (r.plan.from_table and 1 or 0) or "-" }, "\t")
      end
    end
  end
  local path = ("%s/%s.tsv"):format(CFG.out, info.name)
  write_file(path, table.concat(L, "\n") .. "\n")
  return path
end

-- The table note shared by all points (a refused table), if any.
local function table_note(points)
  for _, p in ipairs(points) do
    for n in pairs(p.notes) do
      local why = n:match("^table: (.*)$")
      if why then return why end
    end
  end
end

-- Main: run, then report, TSV and chart.
local function main()
  local info = run_info()
  local shapes = assert(loadfile(CFG.shapes))(root)
  if info.peer.status ~= "ok" then
    io.stderr:write(("bench-peers: peer unavailable: %s; measuring flashdecode only\n"):format(info.peer.why or "?"))
  end
  local t0 = os.time()
  local points, bw = run_all(info, shapes)
  info.seconds, info.load_end = os.time() - t0, sh("cat /proc/loadavg")
  info.table_note = table_note(points)
  local rows = rows_of(info, points, bw)
  os.execute(("mkdir -p '%s'"):format(CFG.out))
  local any_ratio = false
  for _, r in ipairs(rows) do any_ratio = any_ratio or r.ratio ~= nil end
  local gp, chart
  if any_ratio then gp, chart = write_chart(info, rows) end
  local L = header_lines(info, bw)
  for _, l in ipairs(text_lines(info, rows)) do L[#L + 1] = l end
  L[#L + 1] = ""
  L[#L + 1] = "## Results"
  L[#L + 1] = ""
  for _, l in ipairs(table_lines(rows)) do L[#L + 1] = l end
  if chart then
    L[#L + 1] = ""
    L[#L + 1] = ("![ggml / flashdecode time per shape](%s.svg)"):format(chart)
  end
  local notes = note_lines(points)
  if #notes > 0 then
    L[#L + 1] = ""
    L[#L + 1] = "Notes:"
    L[#L + 1] = ""
    for _, l in ipairs(notes) do L[#L + 1] = l end
  end
  L[#L + 1] = ""
  for _, l in ipairs(method_lines()) do L[#L + 1] = l end
  local md = ("%s/%s.md"):format(CFG.out, info.name)
  write_file(md, table.concat(L, "\n"):gsub("\n+$", "") .. "\n")
  local tsv = write_tsv(info, rows)
  if gp and env("FDP_PLOT", "1") ~= "0" then
    local ok = os.execute(("gnuplot '%s'"):format(gp))          -- LuaJIT: 0; Lua 5.4: true
    if ok ~= 0 and ok ~= true then io.stderr:write("bench-peers: gnuplot failed on ", gp, "\n") end
  end
  for _, f in ipairs { md, tsv } do io.stderr:write("bench-peers: wrote ", f, "\n") end
  io.stderr:write(("bench-peers: %d s\n"):format(info.seconds))
end

main()
