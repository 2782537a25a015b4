-- The tuning log: append-only plain text, one line per measurement, flushed
-- as it is written, so an interrupted run resumes where it stopped. Fields
-- (tab-separated):
--   build shape bucket len cache stage config key status median_us times_us name
-- build names the library build (a measurement of another build is never
-- reused); stage is quick, ref (refined) or v<round> (verification); status
-- is "ok" or "failed: <why>"; times_us is a comma list. Lines starting with
-- '#' are comments.
local M = {}
M.FIELDS = { "build", "shape", "bucket", "len", "cache", "stage", "config", "key", "status", "median_us", "times_us", "name" }
M.COMMENT = "# flashdecode tuning log: " .. table.concat(M.FIELDS, " ") .. "\n"

-- A text field with tabs and newlines replaced.
local function clean(s) return (tostring(s):gsub("[\t\r\n]", " ")) end

-- The identity of a measurement (what resuming matches on).
local function id_of(r)
  return table.concat({ r.build, r.shape, r.bucket, r.len, r.cache, r.stage, r.config }, "\t")
end

-- One record as a log line.
function M.format(r)
  local times = {}
  for i, t in ipairs(r.times or {}) do times[i] = ("%.1f"):format(t) end
  return table.concat({ clean(r.build), clean(r.shape), ("%d"):format(r.bucket), ("%d"):format(r.len), r.cache, r.stage,
    r.config, r.key or "-", r.ok and "ok" or ("failed: " .. clean(r.err or "?")),
    r.ok and ("%.1f"):format(r.median_us) or "-", #times > 0 and table.concat(times, ",") or "-", clean(r.name) }, "\t")
end

-- A log line as a record, or nil and why.
function M.parse(line)
  local f = {}
  for x in (line .. "\t"):gmatch("([^\t]*)\t") do f[#f + 1] = x end
  if #f ~= #M.FIELDS then return nil, ("has %d fields, want %d"):format(#f, #M.FIELDS) end
  local r = {}
  for i, name in ipairs(M.FIELDS) do r[name] = f[i] end
  r.bucket, r.len = tonumber(r.bucket), tonumber(r.len)
  r.ok = r.status == "ok"
  r.err = not r.ok and r.status:gsub("^failed: ", "") or nil
  r.median_us = tonumber(r.median_us)
  r.times = {}
  for t in r.times_us:gmatch("[^,]+") do r.times[#r.times + 1] = tonumber(t) end
  if not r.bucket or not r.len or (r.ok and (not r.median_us or #r.times == 0)) then return nil, "has a malformed number" end
  return r
end

-- Open the log at path for build: read the measurements already there (a
-- malformed line, e.g. one cut by an interruption, is skipped with a
-- warning naming it), then append.
function M.open(path, build)
  local L = { path = path, build = build, index = {}, reused = 0, written = 0, old = 0 }
  local fh = io.open(path, "rb")
  if fh then
    local n = 0
    for line in fh:lines() do
      n = n + 1
      if line ~= "" and line:sub(1, 1) ~= "#" then
        local r, why = M.parse(line)
        if not r then io.stderr:write(("tune: %s:%d: skipped: %s\n"):format(path, n, why))
        elseif r.build == build then L.index[id_of(r)] = r; L.old = L.old + 1 end
      end
    end
    fh:close()
  end
  local new = not fh
  L.fh = assert(io.open(path, "ab"))
  if new then L.fh:write(M.COMMENT) end
  setmetatable(L, { __index = M })
  return L
end

-- The logged record for measurement r (fields of id_of), or nil.
function M:get(r)
  r.build = self.build
  local hit = self.index[id_of(r)]
  if hit then self.reused = self.reused + 1 end
  return hit
end

-- Append record r (flushed now) and index it.
function M:put(r)
  r.build = self.build
  self.fh:write(M.format(r), "\n")
  self.fh:flush()
  self.index[id_of(r)] = r
  self.written = self.written + 1
end

-- Close the log.
function M:close() if self.fh then self.fh:close(); self.fh = nil end end

return M
