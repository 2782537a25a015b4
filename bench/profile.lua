-- Where a kernel's time goes, from `perf report --sort dso,srcline` of a cc
-- kernel built under $FD_CC_DEBUG (#line back to the templates, -g): each
-- sample's source line names the template statement it ran in. A line
-- "decode.c.tpl@294:1" is inside the inline assembly that template line 294
-- emits (`$(simd_scores())`: the phase "scores"); "decode.c.tpl:359" is the
-- template's own C; other objects are the executor (libflashdecode) or
-- outside (libc, the OS, the driver). Pure Lua (lua5.4 and LuaJIT): used by
-- bench/phases.lua, tested by tests/test_profile.lua.
local M = {}

-- The phases in report order, with their words and chart colours; a
-- statement of a template not named here shows under its own name, after these.
M.PHASES = {
  { id = "qload", label = "q load", color = "#9e9ac8" },
  { id = "q_columns", label = "q columns", color = "#54278f" },
  { id = "init_records", label = "state init", color = "#fdbf6f" },
  { id = "q_planes", label = "q planes (MSD)", color = "#cab2d6" },
  { id = "scores", label = "scores (K staged, q·K)", color = "#1b9e77" },
  { id = "softcap", label = "softcap", color = "#66a61e" },
  { id = "alibi", label = "ALiBi", color = "#a6761d" },
  { id = "max", label = "running max", color = "#7570b3" },
  { id = "scale_records", label = "rescale", color = "#e6ab02" },
  { id = "grow_lanes", label = "rescale (head lanes)", color = "#bf5b17" },
  { id = "exp", label = "exp and sums", color = "#ffd92f" },
  { id = "sums_lanes", label = "sums (head lanes)", color = "#f0027f" },
  { id = "pscale", label = "weights x v scales", color = "#80b1d3" },
  { id = "bscale", label = "weights x block scales", color = "#fb8072" },
  { id = "pv", label = "P·V", color = "#e41a1c" },
  { id = "store_out", label = "output", color = "#000000" },
  { id = "exp_body", label = "scalar exp", color = "#984ea3" },
  { id = "kernel_c", label = "kernel's C", color = "#a6cee3" },
  { id = "executor", label = "executor", color = "#b2df8a" },
  { id = "outside", label = "outside", color = "#bdbdbd" },
}
local ORDER = {}
for i, p in ipairs(M.PHASES) do ORDER[p.id] = i end

-- The label of phase id (its own name when not in M.PHASES).
function M.label(id)
  local i = ORDER[id]
  return i and M.PHASES[i].label or id
end

-- Sort a list of phase ids into report order (M.PHASES, then others by name).
function M.sort(ids)
  table.sort(ids, function(a, b)
    local x, y = ORDER[a] or (#M.PHASES + 1), ORDER[b] or (#M.PHASES + 1)
    if x ~= y then return x < y end
    return a < b
  end)
  return ids
end

-- The chart colour of phase id (grey for one not in M.PHASES).
function M.color(id)
  local i = ORDER[id]
  return i and M.PHASES[i].color or "#666666"
end

-- One line of `perf report --stdio -q -t '\t' -F overhead,sample,dso,srcline`
-- as its sample count, object and source line; nil for any other line.
function M.parse_line(line)
  local n, dso, src = line:match("^%s*[%d.]+%%%s*\t%s*(%d+)%s*\t%s*([^\t]-)%s*\t%s*(.-)%s*$")
  if not n then return nil end
  return tonumber(n), dso, src
end

-- The statement template file:line emits: NAME of its `$(simd_NAME(` or
-- `$(NAME(`, or "file@line" when the line holds none. read(file) gives the
-- template's lines.
local function statement(read, file, line)
  local lines = read(file)
  local name = lines and lines[line] and lines[line]:match("%$%(([%w_]+)%(")
  return name and name:gsub("^simd_", "") or ("%s@%d"):format(file, line)
end

-- The phase of one sample's object and source line (read(file) gives a
-- template's lines), and for the kernel's C the template line ("decode.c.tpl:359").
function M.classify(dso, src, read)
  if dso:match("^fd_k%d+%-") then
    local file, line = src:match("^([%w_.]+%.tpl)@(%d+):%d+$")
    if file then return statement(read, file, tonumber(line)) end
    local cfile, cline = src:match("^([%w_.]+%.tpl):(%d+)$")
    if cfile then return "kernel_c", ("%s:%s"):format(cfile, cline) end
    return "kernel_c", "?"
  end
  if dso:match("^libflashdecode") then return "executor" end
  return "outside"
end

-- The shares of a perf report's lines (text) by phase, in % of their
-- samples: { shares = { id = % }, order = { ids, the report's order },
-- c_lines = { the kernel's C lines, hottest first, { where, % } }, samples =
-- the lines' samples }.
function M.aggregate(text, read)
  local counts, c, total = {}, {}, 0
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    local n, dso, src = M.parse_line(line)
    if n then
      local id, where = M.classify(dso, src, read)
      counts[id] = (counts[id] or 0) + n
      if where then c[where] = (c[where] or 0) + n end
      total = total + n
    end
  end
  local order, shares = {}, {}
  for id, n in pairs(counts) do
    order[#order + 1] = id
    shares[id] = n / total * 100
  end
  M.sort(order)
  local c_lines = {}
  for where, n in pairs(c) do c_lines[#c_lines + 1] = { where, n / total * 100 } end
  table.sort(c_lines, function(a, b) return a[2] > b[2] or (a[2] == b[2] and a[1] < b[1]) end)
  return { shares = shares, order = order, c_lines = c_lines, samples = total }
end

-- A reader of template files under dir (lines, cached; nil when absent).
function M.template_reader(dir)
  local cache = {}
  return function(file)
    if cache[file] == nil then
      local f = io.open(dir .. "/" .. file, "r")
      local lines = false
      if f then
        lines = {}
        for l in f:lines() do lines[#lines + 1] = l end
        f:close()
      end
      cache[file] = lines
    end
    return cache[file] or nil
  end
end

return M
