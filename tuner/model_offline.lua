-- The cost model's planner decision judged offline, on measurements already
-- logged (no timing): for every row of the tuned tables, fit the model on the
-- tuning log without the row's shape, take the planner's decision
-- (tuner/model.lua decide), and look the decision up among the measurements
-- of the table's build for that shape and bucket (the tuning logs and the
-- sweep's log, which times every configuration of its rows once). A
-- configuration's ratio to the heuristic is the median, over the log's jobs
-- (one stage of one row: quick, ref, v<round>, s<round>) that timed both, of
-- its time over the heuristic's in the same job. A decision not measured for
-- the row is "unmeasured".
--   luajit tuner/model_offline.lua [--fit LOG] [--truth LOG]... [TABLE...]
-- Defaults: results/tuned/<machine>.log fitted; truth from it,
-- <machine>-unseen.log and sweep-<machine>.log; tables <machine>.tsv and
-- <machine>-unseen.tsv.
local root = (debug.getinfo(1, "S").source:gsub("^@", "")):match("^(.*)/tuner/[^/]*$") or "."
package.path = ("%s/?.lua;%s/gen/?.lua;%s/lua/?.lua;"):format(root, root, root) .. package.path
local facts = require("facts")
local key = require("key")
local tlog = require("tuner.log")
local model = require("tuner.model")
local files = require("files")
local export = require("export")

local M = {}

-- The median of a list (sorted copy).
local function median(list)
  local s = {}
  for i, v in ipairs(list) do s[i] = v end
  table.sort(s)
  local n = #s
  if n == 0 then return nil end
  return n % 2 == 1 and s[(n + 1) / 2] or (s[n / 2] + s[n / 2 + 1]) / 2
end

-- Measurements of build in the logs of paths, by "shape\tbucket": { jobs = { stage -> { config -> us } }, first = config of the first quick line }.
function M.truth(paths, build)
  local rows = {}
  for _, path in ipairs(paths) do
    local fh = io.open(path, "rb")
    if fh then
      for line in fh:lines() do
        if line:sub(1, 1) ~= "#" and line ~= "" then
          local r = tlog.parse(line)
          if r and r.ok and tlog.of_build(r.build, build) and r.cache == "cold" then
            local k = r.shape .. "\t" .. r.bucket
            local row = rows[k] or { jobs = {} }
            rows[k] = row
            local job = path .. "\t" .. r.stage
            row.jobs[job] = row.jobs[job] or {}
            row.jobs[job][r.config] = r.median_us
            if r.stage == "quick" and not row.first and not path:match("sweep") then row.first = r.config end
          end
        end
      end
      fh:close()
    end
  end
  return rows
end

-- The ratio config/heuristic for a row's measurements (median over the jobs that timed both) and the job count.
function M.ratio(row, config, h)
  if config == h then return 1, math.huge end
  local rs = {}
  for _, job in pairs(row.jobs) do
    if job[config] and job[h] then rs[#rs + 1] = job[config] / job[h] end
  end
  return median(rs), #rs
end

-- The configuration text of a table row.
local function row_config(r)
  local f = key.decode(r.key)
  return model.config_text { chunk = f.chunk, tile = f.group_tile, isa = f.isa, splits = r.splits, threads = r.threads }
end

-- Evaluate the decisions on every row of tables; opts: fit (log path), truth (paths), max_isa, threads, decide (function).
function M.evaluate(opts)
  local obs = opts.obs or model.observations(opts.fit)
  local out, models = {}, {}
  for _, tpath in ipairs(opts.tables) do
    local text = assert(files.read(tpath), tpath)
    local t = export.parse(text:gsub("\n" .. facts.MODEL_LINE .. "\t[^\n]*", ""), tpath)   -- its rows; the model is refitted
    local id = t.identity
    local truth = M.truth(opts.truth, tlog.build_id(id.library, id.templates, id.tcc))
    for _, r in ipairs(t.rows) do
      local row = truth[r.shape .. "\t" .. r.bucket]
      if not models[r.shape] then
        local rest = model.without(obs, r.shape)
        models[r.shape] = (opts.fitter or model.fit_calibrated)(rest)
      end
      local s = facts.parse_signature(r.shape)
      local h = row and row.first and model.parse_config(row.first)
      local res = { name = r.name, bucket = r.bucket, tuned = row_config(r) }
      if h then
        local pick = (opts.decide or model.decide)(models[r.shape], s, math.min(r.bucket, r.bucket), opts.max_isa or 3,
          opts.threads or 2, h)
        res.h, res.pick = row.first, model.config_text(pick)
        res.vs_h, res.n = M.ratio(row, res.pick, res.h)
        res.t_vs_h = M.ratio(row, res.tuned, res.h)
      end
      out[#out + 1] = res
    end
  end
  return out
end

-- The evaluation as text lines with a summary.
function M.lines(res)
  local out, n, worse, w5, unm = {}, 0, 0, 0, 0
  for _, x in ipairs(res) do
    local vt = x.vs_h and x.t_vs_h and x.vs_h / x.t_vs_h
    out[#out + 1] = ("%-18s %7d  pick %-20s tuned %-20s heur %-20s  pick/heur %s  pick/tuned %s"):format(x.name, x.bucket,
      x.pick or "?", x.tuned, x.h or "?", x.vs_h and ("%.3f"):format(x.vs_h) or "unmeasured",
      vt and ("%.3f"):format(vt) or "-")
    if x.pick then
      n = n + 1
      if not x.vs_h then unm = unm + 1 end
      if x.vs_h and x.vs_h > 1.05 then worse = worse + 1 end
      if vt and vt <= 1.05 then w5 = w5 + 1 end
    end
  end
  out[#out + 1] = ("rows %d: pick within 5%% of tuned (logged) %d, worse than the heuristic by more than 5%% %d, unmeasured %d"):format(
    n, w5, worse, unm)
  return out
end

local function main(a)
  local slug = require("tuner.machine").info().slug
  local dir = root .. "/results/tuned/"
  local opts = { fit = dir .. slug .. ".log", truth = {}, tables = {} }
  local i = 1
  while a[i] do
    if a[i] == "--fit" then opts.fit = a[i + 1]; i = i + 2
    elseif a[i] == "--truth" then opts.truth[#opts.truth + 1] = a[i + 1]; i = i + 2
    else opts.tables[#opts.tables + 1] = a[i]; i = i + 1 end
  end
  if #opts.truth == 0 then opts.truth = { dir .. slug .. ".log", dir .. slug .. "-unseen.log", dir .. "sweep-" .. slug .. ".log" } end
  if #opts.tables == 0 then opts.tables = { dir .. slug .. ".tsv", dir .. slug .. "-unseen.tsv" } end
  for _, l in ipairs(M.lines(M.evaluate(opts))) do print(l) end
end

if arg and arg[0] and arg[0]:match("model_offline%.lua$") then main(arg) end
return M
