-- levels.lua: a cold two-builds A/B (bench/builds.c with FDB_ROUNDS_TSV,
-- `make bench-builds MODE=cold`) split by the memory's level. On a shared
-- machine the read bandwidth moves between levels within seconds, and a
-- kernel change can win at one and lose at the other; each round's ratio
-- B/A is kept with the bandwidth sampled before it. The split is
-- tuner/stats.lua level_split over every round's sample of the file (none:
-- one level). Per shape, the rounds, the median read GB/s, A and B us, and
-- the median B/A with its quartiles: over all rounds, then at each level.
--   lua bench/levels.lua ROUNDS_TSV
-- Pure Lua (lua5.4 and LuaJIT); tests/test_levels.lua checks it.
package.path = "./?.lua;" .. package.path
local stats = require("tuner.stats")

local M = {}

local COLUMNS = { "shape", "round", "read_gbs", "a_us", "b_us" }

-- The rounds of a rounds TSV's text: its banner (the "# " line) and a list
-- of { shape, read, a, b }; nil and a sentence naming the line on a bad one.
function M.parse(text)
  local banner, rounds, header = nil, {}, false
  local n = 0
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    n = n + 1
    if line == "" then   -- (a blank line, or the end)
    elseif line:sub(1, 2) == "# " then banner = banner or line:sub(3)
    elseif not header then
      if line ~= table.concat(COLUMNS, "\t") then
        return nil, ("line %d: the columns are not %s"):format(n, table.concat(COLUMNS, ", "))
      end
      header = true
    else
      local shape, read, a, b = line:match("^([^\t]+)\t%d+\t([%d.]+)\t([%d.]+)\t([%d.]+)$")
      read, a, b = tonumber(read), tonumber(a), tonumber(b)
      if not (read and a and b and a > 0 and b > 0) then
        return nil, ("line %d: not a round (shape, round, read GB/s, A us, B us)"):format(n)
      end
      rounds[#rounds + 1] = { shape = shape, read = read, a = a, b = b }
    end
  end
  if not header then return nil, "no column line" end
  return { banner = banner, rounds = rounds }
end

-- The figures of a list of rounds: n, median read GB/s, A and B us, B/A median and quartiles.
local function figures(rounds)
  local read, a, b, r = {}, {}, {}, {}
  for i, x in ipairs(rounds) do read[i], a[i], b[i], r[i] = x.read, x.a, x.b, x.b / x.a end
  return { n = #rounds, read = stats.median(read), a = stats.median(a), b = stats.median(b), ratio = stats.median(r),
           q1 = stats.quantile(r, 0.25), q3 = stats.quantile(r, 0.75) }
end

-- Per shape in order of appearance: { shape, all, slow, fast } (slow and fast:
-- the figures of the rounds at or below / above split, nil when split is nil
-- or the level has no round), and split.
function M.table(run)
  local reads, order, by = {}, {}, {}
  for i, x in ipairs(run.rounds) do
    reads[i] = x.read
    if not by[x.shape] then order[#order + 1], by[x.shape] = x.shape, {} end
    table.insert(by[x.shape], x)
  end
  local split = stats.level_split(reads)
  local out = {}
  for _, shape in ipairs(order) do
    local row, slow, fast = { shape = shape, all = figures(by[shape]) }, {}, {}
    if split then
      for _, x in ipairs(by[shape]) do table.insert(x.read > split and fast or slow, x) end
      row.slow = #slow > 0 and figures(slow) or nil
      row.fast = #fast > 0 and figures(fast) or nil
    end
    out[#out + 1] = row
  end
  return out, split
end

-- One table line of figures f at level name.
local function line(shape, name, f)
  return ("| %s | %s | %d | %.1f | %.1f | %.1f | %.3f | %.3f-%.3f |"):format(shape, name, f.n, f.read, f.a, f.b, f.ratio,
    f.q1, f.q3)
end

-- The Markdown report of a parsed run.
function M.markdown(run)
  local rows, split = M.table(run)
  local out = { "# Two builds, cold, by memory level", "" }
  if run.banner then out[#out + 1] = "- " .. run.banner end
  out[#out + 1] = split and ("- Levels: slow at or below %.1f GB/s, fast above (the middle of the widest gap between the "
    .. "read bandwidths sampled before the rounds, tuner/stats.lua level_split)"):format(split)
    or "- One memory level: no gap between the sampled read bandwidths splits them (tuner/stats.lua level_split)"
  out[#out + 1] = "- B/A: the median of the per-round ratios, with quartiles; A us, B us: medians of the rounds"
  out[#out + 1] = ""
  out[#out + 1] = "| shape | level | rounds | read GB/s | A us | B us | B/A | quartiles |"
  out[#out + 1] = "|---|---|---|---|---|---|---|---|"
  for _, r in ipairs(rows) do
    out[#out + 1] = line(r.shape, "all", r.all)
    if r.slow then out[#out + 1] = line(r.shape, "slow", r.slow) end
    if r.fast then out[#out + 1] = line(r.shape, "fast", r.fast) end
  end
  return table.concat(out, "\n") .. "\n"
end

-- Command line: the report of one rounds file on stdout; exit 1 when it cannot be read or parsed.
function M.main(path)
  if not path then io.stderr:write("usage: lua bench/levels.lua ROUNDS_TSV\n"); os.exit(2) end
  local f = io.open(path, "r")
  if not f then io.stderr:write(("levels: %s: cannot read it\n"):format(path)); os.exit(1) end
  local run, err = M.parse(f:read("*a"))
  f:close()
  if not run then io.stderr:write(("levels: %s: %s\n"):format(path, err)); os.exit(1) end
  io.write(M.markdown(run))
end

-- Run as a script (not required as bench.levels): the command line.
if ... ~= "bench.levels" and arg and arg[0] and arg[0]:match("bench/levels%.lua$") then M.main(arg[1]) end
return M
