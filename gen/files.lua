-- File helpers for generated output: write only when content changes.
local M = {}

-- Read a whole file, or nil.
function M.read(path)
  local fh = io.open(path, "rb")
  if not fh then return nil end
  local s = fh:read("*a"); fh:close()
  return s
end

-- Write content to path unless it already holds exactly that; true if written.
function M.write_if_changed(path, content)
  if M.read(path) == content then return false end
  local tmp = path .. ".tmp"
  local fh = assert(io.open(tmp, "wb"))
  fh:write(content); fh:close()
  assert(os.rename(tmp, path))
  return true
end

-- Create a directory (and parents).
function M.mkdir(dir)
  os.execute(("mkdir -p '%s'"):format(dir:gsub("'", "'\\''")))
end

return M
