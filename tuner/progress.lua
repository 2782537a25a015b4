-- The tuner's progress bar on stderr: job i/n, shape and bucket,
-- configurations done/planned and the best so far; silent when stderr is not
-- a terminal.
local sys = require("tuner.sys")

local M = {}
M.__index = M

-- A progress bar over n_jobs jobs (enabled = nil: when stderr is a terminal).
function M.new(n_jobs, enabled)
  if enabled == nil then enabled = sys.stderr_tty() end
  return setmetatable({ n = n_jobs, i = 0, on = enabled, t0 = sys.now() }, M)
end

-- Start job i (shape name, measured length, bucket).
function M:job(i, name, len, bucket)
  self.i, self.name, self.len, self.bucket = i, name, len, bucket
  self:draw(0, 1, nil)
end

-- Redraw: done of planned configurations, best = { config, median_us } or nil.
function M:draw(done, planned, best)
  if not self.on then return end
  local w, f = 24, math.min(((self.i - 1) + math.min(done / math.max(planned, 1), 1)) / self.n, 1)
  local fill = math.floor(f * w)
  local b = best and ("best %s %.2f ms"):format(best.config, best.median_us / 1e3) or ""
  io.stderr:write(("\r\27[K[%s%s] %d/%d %s len %d bucket %d: %d/%d configs %s  %.0fs"):format(("#"):rep(fill),
    ("."):rep(w - fill), self.i, self.n, self.name or "", self.len or 0, self.bucket or 0, done, math.max(planned, done),
    b, sys.now() - self.t0))
end

-- Clear the bar.
function M:done()
  if self.on then io.stderr:write("\r\27[K") end
end

return M
