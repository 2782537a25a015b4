-- Gnuplot charts of the benchmark: data and scripts under build/bench/<name>/,
-- charts (SVG and PNG) next to the report in results/bench/.
--   <name>-gbs:     achieved GB/s against kv_len (log x), one panel per sweep shape
--   <name>-time:    cold median time against kv_len (log-log), with the bandwidth floor
--   <name>-threads: cold median time against threads
local report = require("bench.report")
local M = {}

-- Sweep shapes of a run: marked `sweep` and measured at two or more lengths.
local function sweep_shapes(res)
  local out = {}
  for _, sh in ipairs(res.shapes) do
    if sh.shape.sweep and #sh.lens >= 2 then out[#out + 1] = sh end
  end
  return out
end

-- Data blocks (gnuplot `index`) of one shape: per variant and cache, "len value".
local function blocks(sh, variants, caches, value)
  local text, series = {}, {}
  for _, v in ipairs(variants) do
    for _, c in ipairs(caches) do
      local pts = {}
      for _, r in ipairs(sh.runs) do
        local y = r.variant == v.name and value(r, c)
        if y then pts[#pts + 1] = ("%d\t%.6g"):format(r.len, y) end
      end
      if #pts > 0 then
        text[#text + 1] = ("# %s %s\n%s\n\n\n"):format(v.name, c, table.concat(pts, "\n"))
        series[#series + 1] = { variant = v.name, cache = c, vi = #series }
      end
    end
  end
  return table.concat(text), series
end

-- gnuplot xtics for a list of lengths ("1k" 1024, ...).
local function xtics(lens)
  local t = {}
  for _, n in ipairs(lens) do t[#t + 1] = ('"%s" %d'):format(report.klen(n), n) end
  return "set xtics (" .. table.concat(t, ", ") .. ")"
end

-- A color per variant name, stable across charts.
local function color_of(variants)
  local palette = { "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2" }
  local c = {}
  for i, v in ipairs(variants) do c[v.name] = v.vanilla and "#555555" or palette[(i - 1) % #palette + 1] end
  return c
end

-- The plot clause of one series in a data file: titled by variant when cold
-- (or alone), untitled when warm (the style legend says dashed = warm).
local function series_clause(file, s, colors)
  return ("'%s' index %d using 1:2 with linespoints lw 2 pt %d lc rgb '%s' dt %d %s")
    :format(file, s.vi, s.cache == "cold" and 7 or 6, colors[s.variant], s.cache == "cold" and 1 or 2,
      s.cache == "warm" and "notitle" or ("title '%s'"):format(s.variant))
end

-- Legend entries explaining the line styles of cold and warm series.
local STYLE_KEYS = "NaN with linespoints lw 2 pt 7 lc rgb 'black' dt 1 title 'cold (solid)', "
  .. "NaN with linespoints lw 2 pt 6 lc rgb 'black' dt 2 title 'warm (dashed)'"

-- A script rendering body twice: SVG then PNG, both of w x h pixels.
local function two_terminals(out, w, h, body)
  return table.concat({
    ("set terminal svg size %d,%d dynamic enhanced font 'sans,11' background rgb 'white'"):format(w, h),
    ("set output '%s.svg'"):format(out), body, "unset multiplot",
    ("set terminal pngcairo size %d,%d enhanced font 'sans,10' background rgb 'white'"):format(w, h),
    ("set output '%s.png'"):format(out), body, "unset multiplot", "set output", "" }, "\n")
end

-- Common settings of a panel.
local function panel_head(title, xlabel, ylabel)
  return table.concat({ "reset", "set grid", "set key outside right top vertical font ',9' spacing 1.1",
    ("set title '%s'"):format(title:gsub("'", "")), ("set xlabel '%s'"):format(xlabel),
    ("set ylabel '%s'"):format(ylabel) }, "\n")
end

-- Panels of the GB/s chart.
local function gbs_body(res, dir, colors)
  local body, bw = {}, res.info.bw_all
  for _, sh in ipairs(sweep_shapes(res)) do
    local file = ("%s/gbs-%s.dat"):format(dir, sh.shape.name)
    local text, series = blocks(sh, res.variants, { "cold", "warm" }, function(r, c) return (report.gbs(r, c)) end)
    report.write_file(file, text)
    local clauses = {}
    for _, s in ipairs(series) do clauses[#clauses + 1] = series_clause(file, s, colors) end
    clauses[#clauses + 1] = STYLE_KEYS
    clauses[#clauses + 1] = ("%.4g with lines lw 2 lc rgb 'black' dt 3 title 'read bw, %d thr. (%.1f GB/s)'")
      :format(bw, res.info.threads, bw)
    body[#body + 1] = panel_head(sh.shape.name .. ": achieved KV GB/s", "kv\\_len (valid keys)", "GB/s")
      .. ("\nset logscale x 2\nset xrange [%g:%g]\nset yrange [0:*]\n"):format(sh.lens[1] / 1.4, sh.lens[#sh.lens] * 1.4)
      .. xtics(sh.lens) .. "\nplot " .. table.concat(clauses, ", \\\n  ")
  end
  return body
end

-- Panels of the time chart, with the floor: KV bytes / read bandwidth.
local function time_body(res, dir, colors)
  local body, bw = {}, res.info.bw_all
  for _, sh in ipairs(sweep_shapes(res)) do
    local file = ("%s/time-%s.dat"):format(dir, sh.shape.name)
    local text, series = blocks(sh, res.variants, { "cold" }, function(r, c) return r[c] and r[c].median end)
    report.write_file(file, text)
    local per_key = sh.runs[1] and sh.runs[1].bytes / sh.runs[1].len or 0
    local clauses = {}
    for _, s in ipairs(series) do clauses[#clauses + 1] = series_clause(file, s, colors) end
    clauses[#clauses + 1] = ("%.6g*x with lines lw 2 lc rgb 'black' dt 3 title 'floor: KV / %.1f GB/s'")
      :format(per_key / (bw * 1e9) * 1e3, bw)
    body[#body + 1] = panel_head(sh.shape.name .. ": cold median time (log-log: slope 1 = linear)",
        "kv\\_len (valid keys)", "ms")
      .. ("\nset logscale xy\nset xrange [%g:%g]\n"):format(sh.lens[1] / 1.4, sh.lens[#sh.lens] * 1.4)
      .. xtics(sh.lens) .. "\nplot " .. table.concat(clauses, ", \\\n  ")
  end
  return body
end

-- The thread scaling panel.
local function threads_body(res, dir, colors)
  if #res.threads == 0 then return {} end
  local file, text, clauses, vi = dir .. "/threads.dat", {}, {}, 0
  for _, v in ipairs(res.variants) do
    local pts = {}
    for _, r in ipairs(res.threads) do
      if r.variant == v.name and r.cold then pts[#pts + 1] = ("%d\t%.6g"):format(r.threads, r.cold.median) end
    end
    if #pts > 0 then
      text[#text + 1] = ("# %s\n%s\n\n\n"):format(v.name, table.concat(pts, "\n"))
      clauses[#clauses + 1] = ("'%s' index %d using 1:2 with linespoints lw 2 pt 7 lc rgb '%s' title '%s'")
        :format(file, vi, colors[v.name], v.name)
      vi = vi + 1
    end
  end
  report.write_file(file, table.concat(text))
  local r1 = res.threads[1]
  return { panel_head(("%s at %s: cold median time (log y)"):format(r1.shape, report.klen(r1.len)), "threads", "ms")
    .. ("\nset xrange [0.5:%g]\nset xtics 1\nset logscale y\n"):format(res.info.threads + 0.5)
    .. "plot " .. table.concat(clauses, ", \\\n  ") }
end

-- Write every chart script; returns the script paths and the charts for the report.
function M.write(res, cfg)
  local name = res.info.name
  local dir = cfg.plot_dir .. "/" .. name
  local colors, scripts, charts = color_of(res.variants), {}, {}
  local kinds = { { "gbs", "achieved GB/s against kv_len", gbs_body }, { "time", "time against kv_len", time_body },
                  { "threads", "time against threads", threads_body } }
  for _, k in ipairs(kinds) do
    local panels = k[3](res, dir, colors)
    if #panels > 0 then
      local cols = math.min(#panels, 2)
      local rows = math.ceil(#panels / cols)
      local body = ("set multiplot layout %d,%d\n"):format(rows, cols) .. table.concat(panels, "\n")
      local out = ("%s/%s-%s"):format(cfg.out, name, k[1])
      local gp = ("%s/%s.gp"):format(dir, k[1])
      report.write_file(gp, two_terminals(out, 760 * cols, 420 * rows, body))
      scripts[#scripts + 1] = gp
      charts[#charts + 1] = { title = k[2], svg = ("%s-%s.svg"):format(name, k[1]), png = ("%s-%s.png"):format(name, k[1]) }
    end
  end
  report.write_file(cfg.plot_dir .. "/plots.list", table.concat(scripts, "\n") .. "\n")
  return scripts, charts
end

-- Run gnuplot on each script; a failure is reported, not raised.
function M.run(scripts)
  for _, gp in ipairs(scripts) do
    local ok = os.execute(("gnuplot '%s'"):format(gp))
    if ok ~= 0 and ok ~= true then io.stderr:write("bench: gnuplot failed on ", gp, "\n") end
  end
end

return M
