-- `make bench`: flashdecode (each backend and ISA) against the machine's read
-- bandwidth and a vanilla unfused baseline, cold and warm cache, in one run.
-- Writes results/bench/<machine>[-quick].{md,tsv} and gnuplot scripts whose
-- charts go next to them. Never asserts a time.
--   QUICK=1        a short run (fewer lengths and repetitions), "-quick" files
--   SHAPES=path    another shape set (default tuner/shapes/bench.lua)
--   FDB_VARIANTS   comma list of variant names to run (e.g. "tcc,vanilla")
--   FDB_BACKENDS   comma list of backends (default "tcc,cc")
--   FDB_TABLE      tuned table to plan from (default results/tuned/<machine>.tsv if present)
--   FDB_OUT        output folder (default results/bench); FDB_PLOT=0: no gnuplot
--   FDB_PLOT_DIR   where the gnuplot scripts and data go (default build/bench)
local root = (debug.getinfo(1, "S").source:gsub("^@", "")):match("^(.*)/tuner/[^/]*$") or "."
package.path = ("%s/?.lua;%s/gen/?.lua;%s/lua/?.lua;"):format(root, root, root) .. package.path
local ffi = require("ffi")
local fd = require("flashdecode")
local machine = require("tuner.machine")
local fdb = require("bench.lib")
local space = require("space")
local facts = require("facts")
local report = require("bench.report")
local plot = require("bench.plot")
local M = require("bench.measure")

local env = function(k, d) local v = os.getenv(k) return (v and v ~= "") and v or d end
local QUICK = env("QUICK", "0") ~= "0"
local CFG = {
  quick = QUICK,
  shapes = env("SHAPES", root .. "/tuner/shapes/bench.lua"),
  out = env("FDB_OUT", root .. "/results/bench"),
  plot_dir = env("FDB_PLOT_DIR", root .. "/build/bench"),
  bw_bytes = 512 * 2 ^ 20, bw_reps = QUICK and 3 or 7,
  target_s = QUICK and 0.06 or 0.8,       -- timed seconds per (point, variant, cache state)
  rmin = QUICK and 3 or 5, rmax = QUICK and 7 or 31,
}

-- A set from a comma list, or nil when the variable is unset.
local function env_set(k)
  local v = env(k, nil)
  if not v then return nil end
  local s = {}
  for w in v:gmatch("[^,%s]+") do s[w] = true end
  return s
end

local sh = machine.sh

-- The run's identity: machine, commit (+ "-dirty"), date, library build.
local function run_info()
  local m = machine.info()
  local commit = machine.commit(root)
  local b = fd.build_info()
  return { load_start = sh("cat /proc/loadavg"), machine = m, commit = commit, date = os.date("!%Y-%m-%d %H:%M UTC"), build = b,
           threads = m.cores, quick = QUICK, name = m.slug .. (QUICK and "-quick" or ""),
           bw_kernel = ffi.string(fdb.fdb_bw_kernel()), llc = tonumber(fdb.fdb_llc_bytes()),
           flush = tonumber(fdb.fdb_flush_bytes()), cfg = CFG, hugepages = fdb.fdb_hugepages() ~= 0,
           thp = sh("cat /sys/kernel/mm/transparent_hugepage/enabled") }
end

-- Read bandwidth (GB/s) of a DRAM-sized buffer and an LLC-resident one, with 1
-- and N threads; measured at the start and at the end of the run (`when`).
local function bandwidth(info, progress, when)
  local bw, N = {}, info.threads
  local small = math.floor(info.llc / 2)
  for _, t in ipairs(N > 1 and { 1, N } or { 1 }) do
    for _, b in ipairs { CFG.bw_bytes, small } do
      progress:step(("bandwidth %d MiB, %d thread(s)"):format(b / 2 ^ 20, t))
      bw[#bw + 1] = { bytes = b, threads = t, gbs = fdb.fdb_read_bw_gbs(b, t, CFG.bw_reps),
                      resident = b < info.llc, when = when }
    end
  end
  return bw
end

-- The figures kernels are compared to: the best of all measurements of the run
-- (start, after each shape, end), since load from elsewhere only lowers them.
local function best_bandwidth(info, bw)
  local function best(old, x) return math.max(old or 0, x) end
  local all = {}
  for _, r in ipairs(bw) do if not r.resident and r.threads == info.threads then all[#all + 1] = r.gbs end end
  table.sort(all)
  info.bw_all_median = #all > 0 and (all[math.floor((#all + 1) / 2)] + all[math.ceil((#all + 1) / 2)]) / 2 or nil
  info.bw_all_n = #all
  for _, r in ipairs(bw) do
    if not r.resident and r.threads == info.threads then info.bw_all = best(info.bw_all, r.gbs) end
    if not r.resident and r.threads == 1 then info.bw_one = best(info.bw_one, r.gbs) end
    if r.resident and r.threads == info.threads then info.bw_llc = best(info.bw_llc, r.gbs) end
  end
end

-- The arithmetic peaks of the roofline, with all threads and with 1 (G
-- multiply-adds/s, 12 independent register chains per thread, best of 5):
-- f32 FMA, bf16 dot products (vdpbf16ps) and int8 dot products (vpdpbusd);
-- a dot rate the CPU lacks (CPUID) is nil: absent, not 0.
-- Measured at the start and at the end of the run; the higher of the two is
-- kept (load from elsewhere only lowers them), like the bandwidth.
-- info.rates[threads] = { fma, bf16, int8, int16, lanes }; info.fma_all, fma_one kept.
local function arithmetic_rates(info, progress, when)
  local function rate(x) x = tonumber(x) return x and x > 0 and x or nil end
  local function best(a, b) return (a and b) and math.max(a, b) or a or b end
  info.rates, info.rate_reps = info.rates or {}, 5
  for _, t in ipairs(info.threads > 1 and { info.threads, 1 } or { 1 }) do
    progress:step(("arithmetic peaks, %d thread(s), %s"):format(t, when))
    local old = info.rates[t] or {}
    info.rates[t] = { fma = best(old.fma, rate(fdb.fdb_fma_gfmas(t, info.rate_reps))),
                      bf16 = best(old.bf16, rate(fdb.fdb_bf16_gdots(t, info.rate_reps))),
                      int8 = best(old.int8, rate(fdb.fdb_int8_gdots(t, info.rate_reps))),
                      int16 = best(old.int16, rate(fdb.fdb_int16_gmadds(t, info.rate_reps))),
                      lanes = tonumber(fdb.fdb_fma_lanes()) }
  end
  info.has_bf16, info.has_int8 = fdb.fdb_has_bf16_dot() ~= 0, fdb.fdb_has_int8_dot() ~= 0
  info.has_int16 = fdb.fdb_has_int16_madd() ~= 0
  info.fma_all, info.fma_one = info.rates[info.threads].fma, info.rates[1].fma
end

-- Contexts and variants: per backend the planner's own choice (tuned table or
-- heuristic) and each ISA forced (portable C first); then vanilla. Failures
-- become notes.
local function variants(info)
  local table_path = env("FDB_TABLE", nil) or machine.tuned_table(info.machine.slug)
  info.table = table_path
  local vs, notes, only = {}, {}, env_set("FDB_VARIANTS")
  local backends = env("FDB_BACKENDS", "tcc,cc")
  for be in backends:gmatch("[^,%s]+") do
    local ok, ctx = pcall(fd.create, { threads = info.threads, backend = be, table = table_path })
    if not ok and table_path then
      notes[#notes + 1] = ("%s: tuned table %s refused (%s); heuristic used"):format(be, table_path, ctx)
      ok, ctx = pcall(fd.create, { threads = info.threads, backend = be })
    end
    local ci = ok and fd.ctx_info(ctx)
    if ok and table_path and fd.errmsg(ctx) ~= "" then    -- a refused table leaves its reason
      notes[#notes + 1] = ("%s backend: %s"):format(be, fd.errmsg(ctx))
      info.table_refused = true
    end
    if not ok then
      notes[#notes + 1] = ("%s backend: fd_create failed: %s"):format(be, ctx)
    elseif ci.backend and ci.backend ~= fd.enum("backend", be) then
      local why = fd.errmsg(ctx)
      notes[#notes + 1] = ("%s backend unavailable here (the context fell back to backend %d%s); not run")
        :format(be, ci.backend, why ~= "" and ": " .. why or "")
    else
      vs[#vs + 1] = { name = be, backend = be, ctx = ctx, opts = nil, isa = "auto" }
      for _, isa in ipairs(facts.isas_upto(ci.max_isa or 0)) do
        local n = fd.ISA_NAMES[isa]
        vs[#vs + 1] = { name = be .. "/" .. n, backend = be, ctx = ctx, opts = { isa = n }, isa = n }
      end
      if be == "tcc" then   -- the planner's choice under fd_config.precision = FD_PRECISION_FAST (bf16 P.V weights, 2 MSD planes for int8)
        local okf, fctx = pcall(fd.create, { threads = info.threads, backend = be, table = table_path, precision = 1 })
        if okf then vs[#vs + 1] = { name = "tcc/fast", backend = be, ctx = fctx, opts = nil, isa = "auto", fast = true }
        else notes[#notes + 1] = ("tcc/fast: fd_create failed: %s"):format(fctx) end
      end
    end
  end
  vs[#vs + 1] = { name = "vanilla", backend = "vanilla", vanilla = true, isa = "gcc -O3 -march=native" }
  local kept = {}
  for _, v in ipairs(vs) do if not only or only[v.name] then kept[#kept + 1] = v end end
  return kept, notes
end

-- The lengths this run measures for a shape.
local function lengths(s) return QUICK and (s.quick or { s.kv_len[1] }) or s.kv_len end

-- Count the progress steps of the whole run.
local function count_steps(shapes, vs, N)
  local n = 12
  for _, s in ipairs(shapes) do
    n = n + #lengths(s) * (#vs + 1)
    if s[QUICK and "quick_threads_at" or "threads_at"] then n = n + N * (#vs + 1) end
  end
  return n
end

-- Main: bandwidth, every shape x length x variant, thread scaling, report.
local function main()
  local info = run_info()
  local shapes = space.load_shapes(CFG.shapes)
  info.shapes_path = CFG.shapes
  local vs, notes = variants(info)
  local progress = M.progress(count_steps(shapes, vs, info.threads))
  local t0 = fdb.fdb_now()
  local res = { info = info, notes = notes, variants = vs, shapes = {}, runs = {}, threads = {} }
  res.bw = bandwidth(info, progress, "start")
  best_bandwidth(info, res.bw)
  arithmetic_rates(info, progress, "start")
  for _, s in ipairs(shapes) do
    local r = M.bench_shape(s, lengths(s), vs, info, CFG, progress)
    res.shapes[#res.shapes + 1] = r
    for _, x in ipairs(r.runs) do res.runs[#res.runs + 1] = x end
    for _, x in ipairs(r.threads or {}) do res.threads[#res.threads + 1] = x end
    res.bw[#res.bw + 1] = { bytes = CFG.bw_bytes, threads = info.threads, when = "after " .. s.name,
                            gbs = fdb.fdb_read_bw_gbs(CFG.bw_bytes, info.threads, 3), resident = false }
  end
  for _, r in ipairs(bandwidth(info, progress, "end")) do res.bw[#res.bw + 1] = r end
  arithmetic_rates(info, progress, "end")
  best_bandwidth(info, res.bw)
  progress:done()
  info.seconds = fdb.fdb_now() - t0
  info.load_end = sh("cat /proc/loadavg")
  local scripts, charts = plot.write(res, CFG)
  local files = report.write(res, CFG, charts)
  if env("FDB_PLOT", "1") ~= "0" then plot.run(scripts) end
  for _, f in ipairs(files) do io.stderr:write("bench: wrote ", f, "\n") end
  io.stderr:write(("bench: %.0f s\n"):format(info.seconds))
end

main()
