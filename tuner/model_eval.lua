-- The cost model on shapes left out of its fit (issue 20, item 3): for every
-- shape of the tables, fit the model (tuner/model.lua) on the log without
-- that shape's measurements, take the planner's decision from it for each of
-- the shape's rows (tuner/model.lua decide: the model's best move only when
-- it predicts it MODEL_MARGIN plus its class's margin faster than the
-- heuristic's configuration, the margins calibrated without the shape too), then
-- time the model's pick, the tuned pick (the row) and the heuristic's
-- configuration interleaved in paired rounds (cold cache; each round runs the
-- distinct ones back to back, the order rotating) and give the 95% sign-test
-- intervals of the median per-round ratios model/tuned and model/heuristic
-- (tuner/stats.lua). A row is "within 5% of tuned" when its median ratio
-- model/tuned is at most 1.05, and "not worse than the heuristic beyond the
-- noise" when its model/heuristic interval does not lie wholly above 1.
--   luajit tuner/model_eval.lua [-o REPORT.md] [TABLE...]
-- Defaults: results/tuned/<machine>.tsv and <machine>-unseen.tsv (when
-- present), the log results/tuned/<machine>.log (MODEL_EVAL_LOG), the report
-- results/tuned/model-<machine>.md. MODEL_EVAL_ROUNDS: rounds per row
-- (default about 0.6 s of measuring per row, 7 to 21); MODEL_EVAL_MAX_BUCKET:
-- skip rows of larger buckets; MODEL_EVAL_SHAPES: the shape sets rows are
-- looked up in by name (default tuner/shapes/default.lua and unseen.lua).
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
local model = require("tuner.model")
local progress = require("tuner.progress")
local files = require("files")

local nolog = { get = function() return nil end, put = function() end }

-- Shape-set entries by name from the files that exist.
local function shapes_by_name(list)
  local t = {}
  for path in list:gmatch("[^:]+") do
    if files.read(path) then for _, s in ipairs(space.load_shapes(path)) do t[s.name] = s end end
  end
  return t
end

-- Time the distinct configurations of cfgs (name -> config) for rounds rounds
-- on job j, interleaved (order rotating each round); times[name][round].
local function rounds_of(j, cfgs, rounds, bar)
  local names = {}
  for n in pairs(cfgs) do names[#names + 1] = n end
  table.sort(names)
  local times = {}
  for _, n in ipairs(names) do times[n] = {} end
  for r = 1, rounds do
    for k = 0, #names - 1 do
      local n = names[(r + k - 1) % #names + 1]
      local rec = measure.measure(j, cfgs[n], "eval", 1, r == 1)
      if not rec.ok then error(("%s: %s"):format(n, rec.err), 0) end
      times[n][r] = rec.median_us
    end
    if bar then bar:draw(r, rounds) end
  end
  return times
end

-- Per-round ratios a/b.
local function ratios(a, b)
  local out = {}
  for i = 1, #a do out[i] = a[i] / b[i] end
  return out
end

-- Evaluate one row with the model fitted without its shape; a result record.
local function eval_row(ctx, info, r, s, m, o, bar)
  local len = workload.row_len(s, r.bucket)
  local w = workload.new(s, len)
  local j = { ctx = ctx, w = w, len = len, keys = w:keys(len), bucket = r.bucket, sig = r.shape, name = r.name,
              cache = "cold", log = nolog }
  local f = key.decode(r.key)
  local t = { chunk = f.chunk, tile = f.group_tile, isa = f.isa, splits = r.splits, threads = r.threads }
  local h = measure.heuristic(j)
  local ns = facts.parse_signature(r.shape)
  local pick, from_model = h, false
  if m then pick, from_model = model.decide(m, ns, math.min(r.bucket, len), info.max_isa, info.threads, h) end
  local cfgs = {}
  for _, c in ipairs { pick, t, h } do cfgs[measure.config_name(c)] = c end
  local res = { r = r, len = len, m = pick, t = t, h = h, from_model = from_model }
  local ok, err = pcall(function()
    local probe = measure.measure(j, pick, "probe", 1, true)
    local cost = (probe.ok and probe.median_us * 1e-6 or 0) + 0.01
    local n = 0
    for _ in pairs(cfgs) do n = n + 1 end
    local rounds = o.rounds or math.max(7, math.min(21, math.ceil(0.6 / (cost * n))))
    local times = rounds_of(j, cfgs, rounds, bar)
    local tm, tt, th = times[measure.config_name(pick)], times[measure.config_name(t)], times[measure.config_name(h)]
    res.vs_tuned, res.vs_heur = stats.decide(ratios(tm, tt)), stats.decide(ratios(tm, th))
    res.rounds, res.mm, res.mt, res.mh = rounds, stats.median(tm), stats.median(tt), stats.median(th)
  end)
  if not ok then res.err = tostring(err) end
  measure.release(j)
  w:free()
  res.within5 = res.vs_tuned and res.vs_tuned.med <= 1.05
  res.not_worse = res.vs_heur and res.vs_heur.lo <= 1
  return res
end

-- The report's Markdown.
local function report(results, o, secs, fit)
  local out = { "# The cost model on shapes left out of its fit", "",
    ("`luajit tuner/model_eval.lua` (make tune-model-eval) on %s, %s; log %s. For each shape: the model "
     .. "fitted on the log without that shape's measurements, the planner's decision from it (the model's best move when "
     .. "it predicts it %.0f%% faster than the heuristic's configuration beyond its class's margin, else the heuristic's), then the model's "
     .. "pick, the tuned pick (the table's row) and the heuristic's configuration timed interleaved in paired rounds "
     .. "(cold cache, one process); ratios are medians of per-round ratios with 95%% sign-test intervals "
     .. "(tuner/stats.lua). %.0f s."):format(machine.info().slug,
      table.concat(o.tables, ", "), o.log, 100 * (1 - math.exp(-facts.MODEL_MARGIN)), secs), "",
    fit, "",
    "| shape | bucket | model pick | tuned | heuristic | model/tuned | model/heuristic | within 5% of tuned | not worse than heuristic |",
    "|---|---|---|---|---|---|---|---|---|" }
  local w5, nw, n = 0, 0, 0
  for _, x in ipairs(results) do
    local mc = measure.config_name(x.m) .. (x.from_model and "" or " (heuristic kept)")
    if x.err then
      out[#out + 1] = ("| %s | %d | %s | %s | %s | failed: %s | | | |"):format(x.r.name, x.r.bucket, mc,
        measure.config_name(x.t), measure.config_name(x.h), x.err:gsub("|", "/"))
    else
      n = n + 1
      if x.within5 then w5 = w5 + 1 end
      if x.not_worse then nw = nw + 1 end
      out[#out + 1] = ("| %s | %d | %s | %s | %s | %.3f %s | %.3f %s | %s | %s |"):format(x.r.name, x.r.bucket, mc,
        measure.config_name(x.t), measure.config_name(x.h), x.vs_tuned.med, stats.ci_text(x.vs_tuned), x.vs_heur.med,
        stats.ci_text(x.vs_heur), x.within5 and "yes" or "no", x.not_worse and "yes" or "no")
    end
  end
  out[#out + 1] = ""
  out[#out + 1] = ("Within 5%% of the tuned pick: %d of %d rows; not worse than the heuristic beyond the noise: %d of %d."):format(
    w5, n, nw, n)
  return table.concat(out, "\n") .. "\n", w5, nw, n
end

local function main(a)
  local name = machine.info().slug
  local o = { tables = {}, out = ("%s/results/tuned/model-%s.md"):format(root, name),
              log = sys.env("MODEL_EVAL_LOG", ("%s/results/tuned/%s.log"):format(root, name)),
              rounds = tonumber(sys.env("MODEL_EVAL_ROUNDS", "")),
              max_bucket = tonumber(sys.env("MODEL_EVAL_MAX_BUCKET", "")) }
  local i = 1
  while a[i] do
    if a[i] == "-o" then o.out = a[i + 1]; i = i + 2 else o.tables[#o.tables + 1] = a[i]; i = i + 1 end
  end
  if #o.tables == 0 then
    for _, p in ipairs { ("%s/results/tuned/%s.tsv"):format(root, name), ("%s/results/tuned/%s-unseen.tsv"):format(root, name) } do
      if files.read(p) then o.tables[#o.tables + 1] = p end
    end
  end
  local shapes = shapes_by_name(sys.env("MODEL_EVAL_SHAPES", root .. "/tuner/shapes/default.lua:" .. root
    .. "/tuner/shapes/unseen.lua"))
  local rows = {}
  for _, p in ipairs(o.tables) do
    for _, r in ipairs(tuned.load(p).rows) do
      if not o.max_bucket or r.bucket <= o.max_bucket then rows[#rows + 1] = r end
    end
  end
  local obs = model.observations(o.log)
  local full, loso = model.fit_calibrated(obs)
  local fit = table.concat(model.report(full, loso), "\n    ")
  fit = "Fit on the whole log:\n\n    " .. fit
  local ctx = fd.create {}
  local info = fd.ctx_info(ctx)
  local models, results, t0, cpu0 = {}, {}, sys.now(), sys.cpu_sample()
  local bar = progress.new(#rows)
  for k, r in ipairs(rows) do
    bar:job(k, r.name, r.bucket, r.bucket)
    if not models[r.shape] then
      local okf, m = pcall(model.fit_calibrated, model.without(obs, r.shape))   -- margins from the other shapes only
      models[r.shape] = okf and m or false     -- no other shape measured: the heuristic's configuration
    end
    results[k] = eval_row(ctx, info, r, workload.row_shape(r, shapes), models[r.shape], o, bar)
  end
  bar:done()
  local cores = machine.info().cores
  fit = fit .. ("\n\nOther processes kept %.2f of the %d cores busy during the measurements (noisy above 0.2)."):format(
    sys.others_cores(cpu0, sys.cpu_sample(), cores), cores)
  local text, w5, nw, n = report(results, o, sys.now() - t0, fit)
  files.write_if_changed(o.out, text)
  io.write(text)
  print(("report %s"):format(o.out))
  print(("%d of %d rows within 5%% of tuned; %d of %d not worse than the heuristic beyond the noise"):format(w5, n, nw, n))
end

local ok, err = pcall(main, arg)
if not ok then io.stderr:write(tostring(err), "\n"); os.exit(1) end
