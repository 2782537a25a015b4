-- The tuned table (results/tuned/<machine>.tsv): write it, and load it back
-- refusing it whole when its header is not this build's and machine's
-- (fd_tuned_table_header) or anything in it is malformed. The text format is
-- parsed by gen/export.lua, which `fdgen export` uses too.
--   luajit tuner/tuned.lua check TABLE     load TABLE as the tuner would; exit 1 with the reason
local M = {}
local modname = ...

-- Set up package.path from this file's location (when run or required by path).
local function setup()
  local src = debug.getinfo(1, "S").source:gsub("^@", "")
  local root = src:match("^(.*)/tuner/[^/]*$") or "."
  package.path = ("%s/?.lua;%s/gen/?.lua;%s/lua/?.lua;"):format(root, root, root) .. package.path
end
setup()
local export = require("export")
local sys = require("tuner.sys")
local files = require("files")

-- A text field with tabs and newlines replaced.
local function clean(s) return (tostring(s):gsub("[\t\r\n]", " ")) end

-- One row line: shape bucket key splits threads median_us gbps heuristic_us
-- name ratio_ci (the winner's interval against the heuristic, "-" for the heuristic's own row).
function M.row_line(r)
  return table.concat({ r.shape, ("%d"):format(r.bucket), r.key, ("%d"):format(r.splits), ("%d"):format(r.threads),
    ("%.1f"):format(r.median_us), ("%.3f"):format(r.gbps), ("%.1f"):format(r.heuristic_us), clean(r.name),
    r.ratio_ci or "-" }, "\t")
end

-- The full text of a table of rows under header (fd_tuned_table_header()),
-- with the cost model's lines (tuner/model.lua) after the rows when given.
function M.format(header, rows, model)
  local out = { header }
  for _, r in ipairs(rows) do out[#out + 1] = M.row_line(r) .. "\n" end
  if model then for _, l in ipairs(require("tuner.model").lines(model)) do out[#out + 1] = l .. "\n" end end
  out[#out + 1] = ("end\t%d\n"):format(#rows)
  return table.concat(out)
end

-- Write the table (and model, when given) to path when its content changes; true when written.
function M.write(path, header, rows, model)
  files.mkdir(sys.dirname(path))
  return files.write_if_changed(path, M.format(header, rows, model))
end

-- Compare a table's header with ours line by line; raises naming the line and field.
function M.check_header(path, got, want)
  local gl, n = {}, 0
  for l in got:gmatch("([^\n]*)\n") do gl[#gl + 1] = l end
  for l in want:gmatch("([^\n]*)\n") do
    n = n + 1
    if gl[n] ~= l then
      local field = l:match("^(%w+)\t") or l
      error(("%s:%d: refused: %s is '%s' but this build and machine have '%s'"):format(
        path, n, field, (gl[n] or ""):gsub("^%w+\t", ""), l:gsub("^%w+\t", "")), 0)
    end
  end
end

-- Load a table: rows (as gen/export.lua parses them) or an error naming file and line.
function M.load(path)
  local text = files.read(path)
  if not text then error(("%s: cannot read the tuned table"):format(path), 0) end
  local t = export.parse(text, path)
  M.check_header(path, t.header, sys.table_header())
  return t
end

-- Command line: `check TABLE`.
local function main(a)
  if a[1] ~= "check" or not a[2] then
    io.stderr:write("usage: luajit tuner/tuned.lua check TABLE\n")
    os.exit(2)
  end
  local ok, t = pcall(M.load, a[2])
  if not ok then io.stderr:write(tostring(t), "\n"); os.exit(1) end
  print(("%s: %d rows, accepted"):format(a[2], #t.rows))
end

if modname ~= "tuner.tuned" and arg and arg[0] and arg[0]:match("tuned%.lua$") then main(arg) end
return M
