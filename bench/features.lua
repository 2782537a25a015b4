-- `make bench-features`: the shape features of issue 16 against plain decode
-- on Llama-3.1-8B (B=1, Hq=32, Hkv=8, D=128, bf16, causal) at kv_len 64k,
-- cur_pos = kv_len - 1: a 4096-key sliding window (without and with 4 sink
-- tokens), ALiBi, softcap 50 and learned sink logits. Every variant is its own
-- fd_plan_create (the planner's choice, the tuned table when it loads: a
-- window's run takes the bucket of its visible keys, so its plan differs);
-- cold cache, all cores, round-robin in one run, paired ratios to plain with
-- the 95% sign-test interval, next to the machine's read bandwidth sampled in
-- the same run. A variant the build refuses (FD_EUNSUPPORTED) is reported as
-- not served and the run goes on. Writes results/bench/features-<machine>[-quick].md
-- and a chart of each variant's time relative to plain (.svg, .png). Never
-- asserts a time; fails only when an output holds a NaN or a served run fails.
--   QUICK=1        fewer rounds, "-quick" files
--   FDB_BACKEND    tcc (default) or cc
--   FDB_TABLE      tuned table the plans come from (default results/tuned/<machine>.tsv if present)
--   FDB_OUT        output folder (default results/bench); FDB_PLOT=0: no gnuplot
--   FDB_PLOT_DIR   where the gnuplot script and data go (default build/bench)
--   FDB_CMD        the command line written into the report (set by bench/bench.mk)
local root = (debug.getinfo(1, "S").source:gsub("^@", "")):match("^(.*)/bench/[^/]*$") or "."
package.path = ("%s/?.lua;%s/gen/?.lua;%s/lua/?.lua;"):format(root, root, root) .. package.path
local ffi = require("ffi")
local fd = require("flashdecode")
local fdb = require("bench.lib")
local report = require("bench.report")
local M = require("bench.measure")
local side = require("bench.side")

local env = side.env
local QUICK = env("QUICK", "0") ~= "0"
local CFG = side.config(root, QUICK, {
  target_s = math.huge, rmin = 3,           -- every variant runs rmax rounds (bench/measure.lua reps_for)
  rmax = QUICK and 11 or 101,
  len = 64 * 1024,                          -- kv_len, every key valid (cur_pos = len - 1)
  speedup = 10,                             -- the issue's bound: a 4096 window at least 10x faster than plain
  limit = 1.10,                             -- the issue's bound: softcap and ALiBi within 10% of plain
})

-- Llama-3.1-8B decode in bf16.
local LLAMA = { batch = 1, n_q_heads = 32, n_kv_heads = 8, head_dim = 128, q_dtype = "bf16",
                kv_dtype = "bf16", out_dtype = "bf16", mask_mode = "causal" }
-- The variants: the fd_shape fields each adds, the fd_args array it needs,
-- and the issue's bound it answers to (speedup over plain, or within 10%).
local VARIANTS = {
  { name = "plain" },
  { name = "window 4096", shape = { window = 4096 }, bound = "speedup" },
  { name = "window 4096 + 4 sinks", shape = { window = 4096, sink_tokens = 4 }, bound = "speedup" },
  { name = "ALiBi", shape = { features = { "alibi" } }, arg = "alibi_slopes", bound = "within" },
  { name = "softcap 50", shape = { softcap = 50 }, bound = "within" },
  { name = "sink logits", shape = { features = { "sink_logits" } }, arg = "sink_logits" },
}

-- The keys a run visits with window w and s sink tokens over n valid keys (one
-- query token, the rule of templates/items.h.tpl), and those of the main range.
local function visited(n, w, s)
  w, s = w or 0, s or 0
  local first = w > 0 and math.max(n - w, 0) or 0
  if s >= first then return n, n end       -- the sinks reach the window: one range from key 0
  return n - first + s, n - first
end

-- q, K, V (random, fixed seeds), cur_pos = len - 1, ALiBi slopes 2^(-8(h+1)/Hq) and sink logits 0.5 (h mod 5).
local function buffers(s, keep)
  local b = side.buffers("features", s, CFG.len, keep)
  b.alibi_slopes = ffi.cast("float *", side.alloc("features", keep, 4 * s.n_q_heads))
  b.sink_logits = ffi.cast("float *", side.alloc("features", keep, 4 * s.n_q_heads))
  for h = 0, s.n_q_heads - 1 do
    b.alibi_slopes[h], b.sink_logits[h] = 2 ^ (-8 * (h + 1) / s.n_q_heads), 0.5 * (h % 5)
  end
  return b
end

-- Variant spec planned on ctx with its runner, or refused: status
-- "not served" (FD_EUNSUPPORTED) or "failed", why = the library's message.
local function variant(ctx, spec, b, keep)
  local v = { name = spec.name, spec = spec, status = "ok", times = {} }
  local t = { kv_len = CFG.len }
  for k, x in pairs(LLAMA) do t[k] = x end
  for k, x in pairs(spec.shape or {}) do t[k] = x end
  local ok, plan = pcall(fd.plan, ctx, fd.shape(t))
  if not ok then
    v.status = fd.error_code(plan) == fd.codes.EUNSUPPORTED and "not served" or "failed"
    v.why = fd.errmsg(ctx) ~= "" and fd.errmsg(ctx) or tostring(plan)
    return v
  end
  local main
  v.keys, main = visited(CFG.len, t.window, t.sink_tokens)
  v.bytes, v.plan = M.kv_bytes(LLAMA, v.keys), plan
  v.info = fd.plan_info(plan, main, ctx)
  v.out = side.alloc("features", keep, b.nq * side.esize(LLAMA.out_dtype))
  local a = { q = b.q, k = b.k, v = b.v, cur_pos = b.cur_pos, out = v.out }
  if spec.arg then a[spec.arg] = b[spec.arg] end
  v.args = fd.args(a)
  v.fn = side.timed_runner(ctx, plan, v.args, v)
  return v
end

-- Measure every variant: buffers, plans, first calls (with the NaN check), interleaved cold timing.
local function bench_variants(ctx, progress)
  local keep, vs = {}, {}
  progress:step("buffers")
  local b = buffers(LLAMA, keep)
  for _, spec in ipairs(VARIANTS) do
    progress:step("plan " .. spec.name)
    vs[#vs + 1] = variant(ctx, spec, b, keep)
  end
  side.first_calls(vs, function(v)
    if v.status ~= "ok" or not v.out then return end
    local m = fdb.fdb_max_abs(v.out, fd.enum("dtype", LLAMA.out_dtype), b.nq)
    v.finite = m == m and m < math.huge
  end)
  progress:step(("timing %d variants"):format(#vs))
  M.time_interleaved(vs, CFG, true)
  for k = 2, #vs do side.paired(vs[k], vs[1]) end
  for _, v in ipairs(vs) do v.plan, v.args, v.out = nil, nil, nil end
  for _, p in ipairs(keep) do ffi.C.free(p) end
  collectgarbage()
  return vs
end

-- Why a variant was not measured: "not served by this build: <message>" or "failed: <message>".
local function refusal(v)
  local why = v.why or tostring(v.status)
  return (((v.status == "not served" and "not served by this build: " or "failed: ") .. why):gsub("|", "/"))
end

-- A variant's time against plain as a speedup: "15.2x [14.0, 16.4]" (paired, inverted interval).
local function speedup(v) return side.inverse_ci(v, 1, 1, "x") end

-- Whether variant v meets its bound: "yes", "yes (CI crosses)", "**no**", or why it was not measured.
local function holds(v)
  if v.status == "not served" then return "not served by this build" end
  if not v.ratio_paired then return "failed" end
  local ok, sure
  if v.spec.bound == "speedup" then
    ok, sure = 1 / v.ratio_paired >= CFG.speedup, 1 / v.ratio_hi >= CFG.speedup
  else
    ok, sure = v.ratio_paired <= CFG.limit, v.ratio_hi <= CFG.limit
  end
  return ok and (sure and "yes" or "yes (CI crosses the bound)") or "**no**"
end

-- The summary: the issue's bounds, one row per variant that answers to one.
local function summary(vs)
  local rows = {}
  for _, v in ipairs(vs) do
    local bd = v.spec.bound
    if bd then
      local measured = not v.cold and refusal(v) or bd == "speedup" and speedup(v) or side.ci(v)
      rows[#rows + 1] = { v.name, bd == "speedup" and ("≥ %dx faster than plain"):format(CFG.speedup)
        or ("within %d%% of plain's time"):format(math.floor((CFG.limit - 1) * 100 + 0.5)), measured, holds(v) }
    end
  end
  return "## Summary\n\nThe issue's bounds against plain decode at 64k (cold time, median of paired per-round ratios "
    .. "with the 95% sign-test interval; a speedup is plain / variant).\n\n"
    .. report.md_table({ "variant", "bound", "measured (paired) [95% CI]", "holds" }, rows) .. "\n"
end

-- The table cells of one variant.
local function cells(v, bw_best, bw_med)
  if not v.cold then return { v.name, refusal(v), "", "", "", "", "", "", "", "", "", "", "", "" } end
  local i, t = v.info, side.time_cells(v.cold, v.bytes, bw_best, bw_med)
  return { v.name, "`" .. i.key .. "`", tostring(i.chunk), tostring(i.splits), tostring(v.keys),
           side.num(v.bytes / 2 ^ 20, 1), t[1], t[2], t[3], t[4], v.ratio and side.num(v.ratio, 3) or "1",
           v.ratio and side.ci(v) or "(reference)", v.finite and "yes" or "**NO**", tostring(v.cold.n) }
end

-- The Markdown report.
local function markdown(res, chart)
  local i = res.info
  local rows = {}
  for _, v in ipairs(res.variants) do rows[#rows + 1] = cells(v, res.bw_best, res.bw_median) end
  local L = {
    ("# flashdecode shape-features benchmark: %s%s"):format(i.machine.slug, QUICK and " (QUICK)" or ""), "",
    side.run_lines(i),
    ("- Llama-3.1-8B decode: B=1 Hq=32 Hkv=8 D=128, q/kv/out bf16, causal, kv_len %s, cur_pos = %d; the cache holds %.0f MiB of K and V")
      :format(report.klen(CFG.len), CFG.len - 1, M.kv_bytes(LLAMA, CFG.len) / 2 ^ 20),
    ("- Variants: plain; shape.window = 4096 with sink_tokens 0 and 4; FD_ALIBI with slopes 2^(-8(h+1)/32); shape.softcap = 50; FD_SINK_LOGITS with logits 0.5·(h mod 5). Each plan is its own fd_plan_create (the planner's choice) from %s; key, chunk and splits are fd_plan_info's for the bucket the run takes (a window's: its 4096 visible keys)")
      :format(side.plans_from(root, i)),
    ("- Read bandwidth (%s sum, %d MiB, all threads), sampled at the start, after the variants and at the end: best **%.1f GB/s**, median %.1f GB/s (%s)")
      :format(i.bw_kernel, CFG.bw_bytes / 2 ^ 20, res.bw_best, res.bw_median, side.bw_line(res)),
    ("- Cold cache: before every timed call all threads read one word of each line of a %d MiB buffer (clean lines, as the tuner's flush leaves them); the variants are timed round-robin (plain, window, ..., plain, ...), %d rounds, so load from elsewhere hits them alike; buffers of 4 MiB and more ask for huge pages: %s")
      :format(i.flush / 2 ^ 20, CFG.rmax, i.hugepages and "yes" or "no"),
    "- Columns: keys read = the keys a run visits (a window: its 4096 keys plus the sinks outside it), KV MiB = their K and V bytes; median and quartiles of the cold fd_run times; GB/s of those bytes read once; that as a share of the best and of the median bandwidth sample; ratio to plain = median / plain's median; paired ratio = median over rounds of variant/plain of the same round, with its 95% sign-test interval (the summary's speedup is its inverse); finite out = no NaN or infinity in out after the first call; n = rounds",
    side.load_line(i), "", summary(res.variants),
    "## Variants\n",
    report.md_table({ "variant", "key", "chunk", "splits", "keys read", "KV MiB", "median ms", "q1–q3 ms", "GB/s",
      "% of bw (best / median)", "ratio to plain", "paired ratio [95% CI]", "finite out", "n" }, rows), "" }
  if chart then L[#L + 1] = ("## Chart\n\n![time per variant relative to plain](%s)\n"):format(chart) end
  return table.concat(L, "\n")
end

-- The chart's data (variant index, paired ratio, interval) and its gnuplot script.
local function chart_script(res)
  local dir, name = CFG.plot_dir .. "/" .. res.info.name, res.info.name
  local pts, tics = {}, {}
  for k, v in ipairs(res.variants) do
    tics[k] = ('"%s" %d'):format(v.why and (v.name .. " (not served)") or v.name, k)
    if v.ratio_paired then pts[#pts + 1] = ("%d\t%.6g\t%.6g\t%.6g"):format(k, v.ratio_paired, v.ratio_lo, v.ratio_hi) end
  end
  report.write_file(dir .. "/ratio.dat", "# variant\tpaired ratio\tlo\thi\n" .. table.concat(pts, "\n") .. "\n")
  local body = table.concat({ "set grid", "set key inside right center box opaque font ',9'", "set logscale y",
    ("set xrange [0.5:%d.5]"):format(#tics), "set xtics (" .. table.concat(tics, ", ") .. ") rotate by -20 font ',9'",
    "set yrange [0.02:2]", "set ytics (0.02, 0.05, 0.1, 0.2, 0.5, 1, 2)",
    ("set title 'variant / plain cold time, Llama-3.1-8B bf16 at 64k (%s, %s)'"):format(res.info.machine.slug, res.info.commit),
    "set ylabel 'time ratio to plain (bars: 95% CI of paired ratio)'",
    ("plot '%s/ratio.dat' using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 1.3 title 'variant / plain', \\\n  "):format(dir)
      .. ("%g with lines lw 2 dt 2 lc rgb 'red' title 'bound %g (softcap, ALiBi)', \\\n  "):format(CFG.limit, CFG.limit)
      .. ("%g with lines lw 2 dt 3 lc rgb 'blue' title '%dx faster (window)', \\\n  "):format(1 / CFG.speedup, CFG.speedup)
      .. "1 with lines lw 1 lc rgb 'black' title 'plain'" }, "\n")
  return side.chart_script(dir, CFG.out, name, body)
end

-- The sanity failures of a run (NaN outputs, served runs that failed) as lines.
local function failures(vs)
  local bad = {}
  for _, v in ipairs(vs) do
    if v.status ~= "not served" and (v.status ~= "ok" or not v.finite) then
      bad[#bad + 1] = ("%s: %s"):format(v.name, v.why or (v.status ~= "ok" and v.status) or "NaN or infinity in out")
    end
  end
  return bad
end

-- Main: bandwidth, the variants, bandwidth again, report and chart.
local function main()
  local info = side.run_info("features", root, QUICK)
  local ctx = side.context(info, CFG.backend)
  local progress = M.progress(4 + #VARIANTS)
  local t0 = fdb.fdb_now()
  local res = { info = info, bw = {} }
  progress:step("bandwidth")
  side.sample_bw(info, res.bw, "start", CFG.bw_reps, CFG.bw_bytes)
  res.variants = bench_variants(ctx, progress)
  side.sample_bw(info, res.bw, "after the variants", 3, CFG.bw_bytes)
  progress:step("bandwidth")
  side.sample_bw(info, res.bw, "end", CFG.bw_reps, CFG.bw_bytes)
  progress:done()
  side.finish("bench-features", CFG.out, info, res, t0, chart_script, markdown, failures(res.variants))
end

main()
