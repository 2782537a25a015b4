-- history.lua: issue 18's bound rows over every committed `make bench` run of
-- one machine (`make bench-history`). Each commit that changed
-- results/bench/<machine>.tsv holds one run; its TSV is read back from git.
-- At each target of tuner/shapes/bench.lua (today's shape set), the planner's
-- kernel (variant tcc), cold, at the run's most threads, gives its GB/s, the
-- bandwidth sampled at its calls, its % of that and of the roof, and the
-- verdict of bench/roof.lua bound_met. Runs from before the per-call columns
-- existed are counted but give no figures. Writes
-- <out>/history-<machine>.md and, where gnuplot is installed, .svg and .png:
-- % call bw against the bandwidth at the calls, one panel per bound row.
--   luajit bench/history.lua MACHINE [OUT_DIR [PLOT_DIR]]
-- Pure Lua (lua5.4 and LuaJIT) beside git; tests/test_history.lua checks it
-- on a scratch repository.
package.path = "gen/?.lua;./?.lua;" .. package.path
local roof = require("bench.roof")
local stats = require("tuner.stats")
local klen = require("bench.report").klen   -- "16k", "2k": the bench report's names
local M = {}

-- The output of a shell command, or nil when it fails.
local function capture(cmd)
  local f = assert(io.popen(cmd))
  local out = f:read("*a")
  local ok = f:close()
  return ok and out or nil
end

-- Split text into its lines.
local function lines_of(text)
  local t = {}
  for l in (text .. "\n"):gmatch("([^\n]*)\n") do t[#t + 1] = l end
  return t
end

-- Split a line on tabs, keeping empty fields.
local function fields(line)
  local t = {}
  for f in (line .. "\t"):gmatch("([^\t]*)\t") do t[#t + 1] = f end
  return t
end

-- A bench TSV as { commit, date, rows }: the run's commit and date from its
-- banner line, each data row a table keyed by the column line's names.
function M.parse_tsv(text)
  local lines = lines_of(text)
  local banner = lines[1] or ""
  local run = { commit = banner:match("commit ([%w%-]+);"),
                date = banner:match("(%d%d%d%d%-%d%d%-%d%d %d%d:%d%d) UTC"), rows = {} }
  local cols = fields(lines[2] or "")
  for i = 3, #lines do
    if lines[i] ~= "" then
      local r = {}
      for j, v in ipairs(fields(lines[i])) do r[cols[j] or j] = v end
      run.rows[#run.rows + 1] = r
    end
  end
  return run
end

-- The bound rows of a shape set: { shape, len, pct } per target length.
function M.targets(shapes)
  local t = {}
  for _, s in ipairs(shapes) do
    for _, n in ipairs(s.target and s.target.at or {}) do
      t[#t + 1] = { shape = s.name, len = n, pct = s.target.pct }
    end
  end
  return t
end

-- The row of one target in a run: variant tcc, cold, the most threads.
local function target_row(run, tg)
  local best
  for _, r in ipairs(run.rows) do
    if r.kind == "run" and r.shape == tg.shape and tonumber(r.kv_len) == tg.len and r.variant == "tcc"
        and r.cache == "cold" and (not best or (tonumber(r.threads) or 0) > (tonumber(best.threads) or 0)) then
      best = r
    end
  end
  return best
end

-- A run's figures at each target (index as targets), nil where the run has
-- no such row or no per-call fraction.
function M.run_bounds(run, targets)
  local out = {}
  for i, tg in ipairs(targets) do
    local r = target_row(run, tg)
    local pct = r and tonumber(r.pct_call_bw)
    if pct then
      local pct_roof, ceiling, call_bw = tonumber(r.pct_call_roof), tonumber(r.ceiling_gbs), tonumber(r.call_bw_gbs)
      out[i] = { gbs = tonumber(r.gbs), call_bw = call_bw, pct_bw = pct, pct_roof = pct_roof,
                 capped = roof.capped(ceiling, call_bw),
                 met = roof.bound_met(tg.pct, pct, pct_roof, ceiling, call_bw) }
    end
  end
  return out
end

-- Every run in the git history of repo's results/bench/<machine>.tsv, newest
-- first, each with the commit that holds it (in_commit) and its bounds. The
-- history follows renames (the slug gained its isa in 2026-11): each commit's
-- file is read at the path it had there, and a commit that only renamed the
-- file (the text of the run after it) is not a run of its own.
function M.runs(repo, machine, targets)
  local path = ("results/bench/%s.tsv"):format(machine)
  local log = capture(("git -C '%s' log --follow --name-only --format=@%%H -- '%s'"):format(repo, path))
  if not log then error(("history: git log failed in %s"):format(repo)) end
  local runs, newer = {}, nil
  for h, at in log:gmatch("@(%x+)%s+([^\n]+)") do
    local text = capture(("git -C '%s' show '%s:%s' 2>/dev/null"):format(repo, h, at))
    if text and text ~= newer then
      local run = M.parse_tsv(text)
      run.in_commit = h:sub(1, 7)
      run.bounds = M.run_bounds(run, targets)
      runs[#runs + 1] = run
    elseif text and #runs > 0 then
      runs[#runs].in_commit = h:sub(1, 7)              -- the same run, committed here first
    end
    newer = text
  end
  return runs
end

-- The split between the memory's two levels (tuner/stats.lua level_split).
M.level_split = stats.level_split

-- Per target: runs with figures, runs met, and the same split by the level of
-- the bandwidth at the calls (M.level_split over every figure: at or below
-- it "slow", above it "fast").
function M.summary(runs, targets)
  local all = {}
  for _, run in ipairs(runs) do
    for i = 1, #targets do
      local b = run.bounds[i]
      if b and b.call_bw then all[#all + 1] = b.call_bw end
    end
  end
  local split = M.level_split(all)
  local out = {}
  for i, tg in ipairs(targets) do
    local s = { n = 0, met = 0, slow = 0, slow_met = 0, fast = 0, fast_met = 0, pcts = {} }
    for _, run in ipairs(runs) do
      local b = run.bounds[i]
      if b then
        s.n, s.pcts[#s.pcts + 1] = s.n + 1, b.pct_bw
        if b.met then s.met = s.met + 1 end
        local lvl = (split and b.call_bw and b.call_bw > split) and "fast" or "slow"
        s[lvl] = s[lvl] + 1
        if b.met then s[lvl .. "_met"] = s[lvl .. "_met"] + 1 end
      end
    end
    s.median = stats.median(s.pcts)
    out[i] = s
  end
  return out, split
end

-- The runs and targets restricted to the targets with figures in some run
-- (each run's bounds re-indexed to match), and the names of the others.
function M.measured(runs, targets)
  local keep, idx, none = {}, {}, {}
  for i, tg in ipairs(targets) do
    local any = false
    for _, run in ipairs(runs) do any = any or run.bounds[i] ~= nil end
    if any then keep[#keep + 1], idx[#idx + 1] = tg, i else none[#none + 1] = tg.shape .. " " .. klen(tg.len) end
  end
  local sub = {}
  for r, run in ipairs(runs) do
    sub[r] = { commit = run.commit, in_commit = run.in_commit, date = run.date, bounds = {} }
    for k, i in ipairs(idx) do sub[r].bounds[k] = run.bounds[i] end
  end
  return sub, keep, none
end

-- The report's Markdown text (runs and targets as M.measured gives them;
-- none: the names of the targets left out).
function M.markdown(machine, runs, targets, none, chart)
  local sum, split = M.summary(runs, targets)
  local with = 0
  for _, run in ipairs(runs) do if next(run.bounds) then with = with + 1 end end
  none = none or {}
  local L = {}
  local function add(s) L[#L + 1] = s end
  add(("# flashdecode: issue 18's bounds over the committed runs: %s"):format(machine))
  add("")
  add(("- Made by `make bench-history` from the git history of `results/bench/%s.tsv`: %d committed runs, %d of them with the per-call bandwidth columns (the others predate them)"):format(machine, #runs, with))
  add("- Each row: the planner's kernel (variant tcc), cold, at the run's most threads, at a target of today's `tuner/shapes/bench.lua`; % call bw = the median over its calls of the call's GB/s / the bandwidth sampled just before it; met by bench/roof.lua `bound_met` (the target's % of the call bandwidth, or "
    .. roof.ROOF_PCT .. "% of the call roof where the compute ceiling of the run is below the bandwidth at the calls)")
  add(("- Slow / fast: the runs whose calls for that row met a sampled bandwidth at or below / above %s GB/s, the middle of the widest gap between the bandwidths at the calls of every figure here (the shared machine's memory moves between two levels)"):format(split and ("%.1f"):format(split) or "-"))
  if #none > 0 then add("- Targets without figures in any run (not measured by full runs): " .. table.concat(none, ", ")) end
  add("")
  add("| shape | kv_len | target | runs | met | median % call bw | slow: met / runs | fast: met / runs |")
  add("|---|---|---|---|---|---|---|---|")
  for i, tg in ipairs(targets) do
    local s = sum[i]
    add(("| %s | %s | %d%% | %d | %d | %s | %d / %d | %d / %d |"):format(tg.shape, klen(tg.len), tg.pct, s.n, s.met,
      s.median and ("%.0f"):format(s.median) or "-", s.slow_met, s.slow, s.fast_met, s.fast))
  end
  add("")
  if chart then
    add(("![%% call bw against the bandwidth at the calls, per bound row](%s)"):format(chart))
    add("")
  end
  add("## Every run, newest first")
  add("")
  add("Each cell: % call bw (bandwidth at the calls, GB/s), and the % of the call roof where the run's compute ceiling is below that bandwidth; **bold** where the bound is met.")
  add("")
  local head, rule = { "run at", "committed in", "date" }, { "---", "---", "---" }
  for _, tg in ipairs(targets) do
    head[#head + 1] = ("%s %s (%d%%)"):format(tg.shape, klen(tg.len), tg.pct)
    rule[#rule + 1] = "---"
  end
  add("| " .. table.concat(head, " | ") .. " |")
  add("| " .. table.concat(rule, " | ") .. " |")
  for _, run in ipairs(runs) do
    if next(run.bounds) then
      local cells = { "`" .. (run.commit or "?") .. "`", "`" .. run.in_commit .. "`", run.date or "-" }
      for i = 1, #targets do
        local b = run.bounds[i]
        local c = b and ("%.0f (%.1f)%s"):format(b.pct_bw, b.call_bw or 0,
          b.capped and b.pct_roof and ("; %.0f%% of roof"):format(b.pct_roof) or "") or "-"
        cells[#cells + 1] = b and b.met and ("**" .. c .. "**") or c
      end
      add("| " .. table.concat(cells, " | ") .. " |")
    end
  end
  return table.concat(L, "\n") .. "\n"
end

-- Write the chart's data and gnuplot script under dir; returns the script's path.
function M.plot_script(dir, out_base, runs, targets)
  local data = dir .. "/history.dat"
  local f = assert(io.open(data, "w"))
  for i, tg in ipairs(targets) do
    f:write(("# %s %s\n"):format(tg.shape, klen(tg.len)))
    for _, run in ipairs(runs) do
      local b = run.bounds[i]
      if b and b.call_bw then f:write(("%.3f\t%.3f\n"):format(b.call_bw, b.pct_bw)) end
    end
    f:write("\n\n")
  end
  f:close()
  local cols = 4
  local rows = math.ceil(#targets / cols)
  local body = {}
  for i, tg in ipairs(targets) do
    body[#body + 1] = ("set title '%s %s'\nset xlabel 'bandwidth at the calls, GB/s'\nset ylabel '%% call bw'\n"
      .. "set xrange [30:100]\nset yrange [0:120]\nplot '%s' index %d using 1:2 with points pt 7 ps 0.8 lc rgb '#1f77b4' notitle, "
      .. "%d with lines lc rgb '#d62728' dt 2 title 'target %d%%'"):format(tg.shape, klen(tg.len), data, i - 1, tg.pct, tg.pct)
  end
  local script = dir .. "/history.gp"
  local g = assert(io.open(script, "w"))
  for _, t in ipairs({ { "svg", "svg size 1400,700 dynamic", ".svg" }, { "png", "pngcairo size 1400,700", ".png" } }) do
    g:write(("set terminal %s\nset output '%s%s'\nset multiplot layout %d,%d\nset key bottom right\nset grid\n%s\nunset multiplot\n")
      :format(t[2], out_base, t[3], rows, cols, table.concat(body, "\n")))
  end
  g:close()
  return script
end

-- Command line: the report (and its chart where gnuplot is installed).
function M.main(machine, out_dir, plot_dir)
  assert(machine, "usage: luajit bench/history.lua MACHINE [OUT_DIR [PLOT_DIR]]")
  out_dir, plot_dir = out_dir or "results/bench", plot_dir or "build/bench/history"
  local all = M.targets(dofile("tuner/shapes/bench.lua"))
  local runs, targets, none = M.measured(M.runs(".", machine, all), all)
  local base = ("%s/history-%s"):format(out_dir, machine)
  local chart
  if capture("command -v gnuplot >/dev/null 2>&1 && echo yes") == "yes\n" then
    os.execute(("mkdir -p '%s'"):format(plot_dir))
    local script = M.plot_script(plot_dir, base, runs, targets)
    local ok = os.execute(("gnuplot '%s'"):format(script))
    if ok == true or ok == 0 then chart = ("history-%s.svg"):format(machine) end   -- Lua 5.4 / LuaJIT
  end
  local f = assert(io.open(base .. ".md", "w"))
  f:write(M.markdown(machine, runs, targets, none, chart))
  f:close()
  print(("bench-history: wrote %s.md (%d runs)%s"):format(base, #runs, chart and " and its chart" or ""))
end

-- Run as a script (not required as bench.history): the command line.
if ... ~= "bench.history" and arg and arg[0] and arg[0]:match("bench/history%.lua$") then M.main(arg[1], arg[2], arg[3]) end
return M
