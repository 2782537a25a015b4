-- Re-measure a tuned table with the tuner's statistics (tuner/stats.lua): for
-- each row, the row's configuration and the heuristic's, back to back in
-- paired rounds (cold cache) added in batches until the 95% interval of the
-- median ratio tuned/heuristic decides: win (below 1), lose (above 1), tie
-- (inside 1 +- 2%), or more (the rounds cap was reached first). A row fails
-- when its interval lies wholly above VERIFY_LIMIT (default 1: slower than the
-- heuristic beyond the noise), unless its median is within VERIFY_MIN_US
-- microseconds of the heuristic's (default 5); a row the table records as a
-- win (ratio_ci) and now re-measured as a win is "confirmed". VERIFY_STRICT=1:
-- a row other than the heuristic's own fails unless re-measured as a win (the
-- tuner's own acceptance rule).
--   luajit tuner/verify.lua TABLE [SHAPES.lua]
-- Environment: VERIFY_LIMIT, VERIFY_MIN_US, VERIFY_ROUNDS (the rounds cap;
-- default about 0.5 s per configuration, 7 to 31 rounds), VERIFY_MAX_BUCKET
-- (skip rows of larger buckets).
-- Prints one line per row and "N passed, N failed"; exits 1 on a failure.
local root = (debug.getinfo(1, "S").source:gsub("^@", "")):match("^(.*)/tuner/[^/]*$") or "."
package.path = ("%s/?.lua;%s/gen/?.lua;%s/lua/?.lua;"):format(root, root, root) .. package.path
local fd = require("flashdecode")
local machine = require("tuner.machine")
local key = require("key")
local facts = require("facts")
local space = require("space")
local sys = require("tuner.sys")
local tuned = require("tuner.tuned")
local measure = require("tuner.measure")
local workload = require("tuner.workload")
local stats = require("tuner.stats")

-- A log that keeps nothing (verification always measures).
local nolog = { get = function() return nil end, put = function() end }

-- The shape-set entry (by name) of each row, for lse and the symbolic fields.
local function shapes_by_name(path)
  local t = {}
  for _, s in ipairs(space.load_shapes(path)) do t[s.name] = s end
  return t
end

-- The row's config against the heuristic, interleaved in paired rounds
-- until decided or the cap (as the tuner's verification): the decision of
-- measure.compare (ma, mb: the medians in microseconds).
local function compare(j, c, h, rounds)
  local d, err = measure.compare({ max = rounds }, function(which, r)
    return measure.measure(j, which == "a" and c or h, "verify", 1, r == 1)
  end)
  if not d then error(err, 0) end
  d.cap = rounds
  return d
end

-- Rounds cap for a row: about 0.5 s per configuration (a first run gives the cost), 7 to 31.
local function rounds_for(j, c)
  local r = measure.measure(j, c, "probe", 1, true)
  local cost = (r.ok and r.median_us * 1e-6 or 0) + 0.01
  return math.max(7, math.min(31, math.ceil(0.5 / cost)))
end

-- Does decision d pass? Strict: only a win. Else: unless its interval lies
-- wholly above the limit and its median is more than slack microseconds slower.
local function passes(d, o)
  if o.strict then return d.decision == "win" end
  return d.lo <= o.limit or d.ma <= d.mb + o.slack
end

-- Verify one row; true when it passes (a line printed either way).
local function verify_row(ctx, r, shapes, o)
  local s = workload.row_shape(r, shapes)
  local len = workload.row_len(s, r.bucket)
  local w = workload.new(s, len)
  local j = { ctx = ctx, w = w, len = len, keys = w:keys(len), bucket = r.bucket, sig = r.shape, name = r.name,
              cache = "cold", log = nolog }
  local f = key.decode(r.key)
  local c = { chunk = f.chunk, tile = f.group_tile, isa = f.isa, splits = r.splits, threads = r.threads }
  local h = measure.heuristic(j)
  local good, line
  if measure.config_name(h) == measure.config_name(c) then
    good, line = true, ("the heuristic's own configuration %s"):format(measure.config_name(c))
  else
    local ok, d = pcall(compare, j, c, h, o.rounds or rounds_for(j, c))
    good = ok and passes(d, o)
    line = ok and ("tuned %9.1f us  heuristic %9.1f us  %s  (table: %s)"):format(d.ma, d.mb, stats.describe(d),
                                                                            r.ratio_ci) or tostring(d)
    if ok and d.decision == "win" and r.ci_hi then o.confirmed = o.confirmed + 1 end
  end
  measure.release(j)
  w:free()
  print(("%s %-20s %7d  %s"):format(good and "ok  " or "FAIL", r.name, r.bucket, line))
  return good
end

-- Verify every row (up to o.max_bucket); returns passed, failed.
local function verify(t, shapes, o)
  local ctx = fd.create {}
  local pass, fail = 0, 0
  for _, r in ipairs(t.rows) do
    if not o.max_bucket or r.bucket <= o.max_bucket then
      if verify_row(ctx, r, shapes, o) then pass = pass + 1 else fail = fail + 1 end
    end
  end
  return pass, fail
end

-- Main: `verify.lua TABLE [SHAPES]`.
local function main(a)
  if not a[1] then io.stderr:write("usage: luajit tuner/verify.lua TABLE [SHAPES.lua]\n"); os.exit(2) end
  local t, cpu0 = tuned.load(a[1]), sys.cpu_sample()
  local shapes = shapes_by_name(a[2] or (root .. "/tuner/shapes/default.lua"))
  local o = { limit = tonumber(sys.env("VERIFY_LIMIT", "1")), rounds = tonumber(sys.env("VERIFY_ROUNDS", "")),
              max_bucket = tonumber(sys.env("VERIFY_MAX_BUCKET", "")), slack = tonumber(sys.env("VERIFY_MIN_US", "5")),
              strict = sys.env("VERIFY_STRICT", "0") ~= "0", confirmed = 0, wins = 0 }
  for _, r in ipairs(t.rows) do if r.ci_hi and (not o.max_bucket or r.bucket <= o.max_bucket) then o.wins = o.wins + 1 end end
  local p, f = verify(t, shapes, o)
  local cores = machine.info().cores
  print(("other processes kept %.2f of the %d cores busy meanwhile"):format(sys.others_cores(cpu0, sys.cpu_sample(), cores), cores))
  print(("%d of the %d rows the table records as wins re-measured as wins (interval below 1)"):format(o.confirmed, o.wins))
  print(("%d passed, %d failed"):format(p, f))
  os.exit(f == 0 and 0 or 1)
end

local ok, err = pcall(main, arg)
if not ok then io.stderr:write(tostring(err), "\n"); os.exit(1) end
