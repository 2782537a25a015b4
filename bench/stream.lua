-- `make bench-stream`: each of issue 18's bound rows beside the streaming
-- probe (bench/stream.c) on the same K and V buffers, cold cache, all cores,
-- round-robin in one run, each call preceded by a read-bandwidth sample. The
-- probe reads the cache once in a kernel's order, widens every element to
-- f32 and feeds it to G FMAs (G = query heads per kv head, the multiply-adds
-- a kernel owes each K element; V owes the same), nothing else; for int8 KV
-- it reads the per-row scales too, and for MSD kernels feeds every 64 codes
-- to G x P int8 dot products (P = the kernel key's planes), for the others
-- widens the codes to f32 for G FMAs as those kernels do. "stream" is the same
-- loop with one add per vector instead. Where the machine cannot overlap
-- arithmetic with its reads, the probe falls below the read bandwidth, and
-- the kernel (which also keeps a softmax) below the probe: kernel / probe is
-- the share of that loop's rate the kernel reaches.
-- Writes results/bench/stream-<machine>[-quick].md and a chart of GB/s per
-- row (.svg, .png). Never asserts a time; fails only when a call fails or an
-- output holds a NaN (a sanity check).
--   QUICK=1        fewer rounds, the rows at the shapes' quick lengths, "-quick" files
--   SHAPES         the shape set (default tuner/shapes/bench.lua): its shapes with a target
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
local roof = require("bench.roof")
local key = require("key")

local env = side.env
local QUICK = env("QUICK", "0") ~= "0"
local CFG = side.config(root, QUICK, {
  target_s = math.huge, rmin = 3,           -- every variant runs rmax rounds (bench/measure.lua reps_for)
  rmax = QUICK and 7 or 31,
  shapes = env("SHAPES", root .. "/tuner/shapes/bench.lua"),
})

-- The measured rows: the bound rows (side.bound_rows) with a KV dtype the
-- probe reads (its arithmetic: f32 FMAs; int8: dots or FMAs over the
-- widened codes, by the kernel's planes, probe_work).
local PROBE_DTYPES = { f32 = "fma", f16 = "fma", bf16 = "fma", i8 = "int8" }
local function measured_rows(path)
  return side.bound_rows(path, QUICK, function(s) return PROBE_DTYPES[s.kv_dtype] ~= nil end)
end

-- The status of the probe's variants where it refuses: a build without
-- AVX-512 or AVX2 (AVX512-VNNI for int8 dots), or a G (G x P) it has no body
-- for; or an int8 row without a kernel (its planes unknown).
local UNSERVED = "not measured: the probe needs AVX-512 or AVX2 (int8 dots: AVX512-VNNI) and G in 1, 2, 4, 8, 16 (int8 dots: P 2 or 3)"
local NO_KERNEL = "not measured: no kernel planned (its MSD planes unknown)"
local NOT_MEASURED = { [UNSERVED] = true, [NO_KERNEL] = true }

-- Probe n of the row over heads x keys of its buffers b (arith: "fma",
-- "dot", or "widen" for int8 codes widened to f32): 0 when it ran.
local function probe(row, b, heads, keys, n, arith, threads)
  local s = row.shape
  if arith == "dot" then
    return fdb.fdb_stream_dot(b.k, b.v, b.k_scale, b.v_scale, heads, keys, s.head_dim, n, threads, nil)
  elseif arith == "widen" then
    return fdb.fdb_stream_fma_i8(b.k, b.v, b.k_scale, b.v_scale, heads, keys, s.head_dim, n, threads, nil)
  end
  return fdb.fdb_stream_fma(b.k, b.v, heads, keys, s.head_dim, fd.enum("dtype", s.kv_dtype), n, threads, nil)
end

-- A runner of the probe over the row's K and V (n multiply-adds per vector) appending its seconds to v.times.
local function probe_runner(row, b, n, arith, threads, v)
  local s, now = row.shape, fdb.fdb_now
  return function()
    local t0 = now()
    local rc = probe(row, b, s.batch * s.n_kv_heads, row.len, n, arith, threads)
    v.times[#v.times + 1] = now() - t0
    if rc ~= 0 then error(("the probe refused n %d, dtype %s"):format(n, s.kv_dtype), 0) end
  end
end

-- The probe's multiply-adds per vector for the row's kernel (key, or nil when
-- not planned), their arithmetic and label: G FMAs; for int8 with MSD
-- planes, G x P dots; for int8 without, G FMAs over the widened codes; or
-- nil, the label and why the probe does not run (int8 without a key).
local function probe_work(row, G, kkey)
  if PROBE_DTYPES[row.shape.kv_dtype] == "fma" then return G, "fma", ("stream + %d FMAs"):format(G) end
  if not kkey then return nil, nil, "stream + int8 dots", NO_KERNEL end
  local P = key.decode(kkey).planes
  if P == 0 then return G, "widen", ("stream + %d FMAs (int8 widened)"):format(G) end
  return G * P, "dot", ("stream + %d int8 dots (%d x %d planes)"):format(G * P, G, P)
end

-- The three variants of a row: the planner's kernel, the probe with its arithmetic, the probe with none.
local function variants(ctx, row, b, keep, threads)
  local s = row.shape
  local G = roof.group(s)
  local k = { name = "kernel", status = "ok", times = {} }
  local ok, plan = pcall(function() return fd.plan(ctx, M.fd_shape(s, row.len)) end)
  if ok then
    k.info = fd.plan_info(plan, row.len, ctx)
    k.out = side.alloc("stream", keep, b.nq * side.esize(s.out_dtype))
    k.plan, k.args = plan, fd.args { q = b.q, k = b.k, v = b.v, k_scale = b.k_scale, v_scale = b.v_scale,
                                      cur_pos = b.cur_pos, out = k.out }
    k.fn = side.timed_runner(ctx, plan, k.args, k)
  else
    k.status = "plan: " .. tostring(plan)
  end
  -- the probe on one key of one head: refused without AVX-512 or AVX2 (int8: VNNI) or for another n
  local n, arith, label, why = probe_work(row, G, k.info and k.info.key)
  local served = n and probe(row, b, 1, 1, n, arith, 1) == 0
  local p = { name = label, status = served and "ok" or why or UNSERVED, times = {} }
  local z = { name = "stream", status = p.status, times = {} }
  if served then p.fn, z.fn = probe_runner(row, b, n, arith, threads, p), probe_runner(row, b, 0, arith, threads, z) end
  return { k, p, z }, G
end

-- Measure one row: buffers, plan, first calls (NaN check on out), interleaved cold timing.
local function bench_row(ctx, row, info, progress)
  local keep = {}
  progress:step(("%s %s"):format(row.name, report.klen(row.len)))
  local b = side.buffers("stream", row.shape, row.len, keep)
  local vs, G = variants(ctx, row, b, keep, info.threads)
  local k = vs[1]
  side.first_calls(vs, function(v)
    if v == k and v.status == "ok" then
      local m = fdb.fdb_max_abs(k.out, fd.enum("dtype", row.shape.out_dtype), b.nq)
      k.finite = m == m and m < math.huge
    end
  end)
  M.time_interleaved(vs, CFG, true, info.threads)
  local r = { row = row, G = G, vs = vs, bytes = M.kv_bytes(row.shape, row.len), key = k.info and k.info.key or "-" }
  -- each variant's median share of the bandwidth sampled before its calls
  for _, v in ipairs(vs) do v.share = v.call_s and roof.call_fraction(r.bytes, v.call_s, v.call_bw) end
  side.paired(k, vs[2])
  k.plan, k.args, k.out = nil, nil, nil
  for _, p in ipairs(keep) do ffi.C.free(p) end
  collectgarbage()
  return r
end

-- GB/s of a variant's median cold time over bytes, or nil.
local function gbs(v, bytes) return v.cold and bytes / (v.cold.median * 1e-3) * 1e-9 end

-- "23.4 (71%)": GB/s and the median share of the bandwidth sampled before each call.
local function rate_cell(v, bytes)
  if NOT_MEASURED[v.status] then return v.status end
  if not v.cold then return v.status ~= "ok" and (("failed: " .. tostring(v.status)):gsub("|", "/")) or "-" end
  return ("%s (%s%%)"):format(side.num(gbs(v, bytes), 1), side.num(v.share and v.share * 100, 0))
end

-- The kernel as a share of the probe: "94% [91, 97]" (paired per-round ratios, 95% interval).
local function of_probe(k) return side.inverse_ci(k, 100, 0, "%") end

-- The table row of one measured row.
local function cells(r)
  local k, p, z = r.vs[1], r.vs[2], r.vs[3]
  return { r.row.name, report.klen(r.row.len), tostring(r.G), "`" .. r.key .. "`", side.num(r.bytes / 2 ^ 20, 0),
           p.name:gsub("^stream %+ ", ""), rate_cell(z, r.bytes), rate_cell(p, r.bytes), rate_cell(k, r.bytes), of_probe(k),
           ("%d%%"):format(r.row.target), k.finite and "yes" or "**NO**", tostring(k.cold and k.cold.n or 0) }
end

-- The Markdown report.
local function markdown(res, chart)
  local i = res.info
  local rows = {}
  for _, r in ipairs(res.rows) do rows[#rows + 1] = cells(r) end
  local L = {
    ("# flashdecode streaming-probe benchmark: %s%s"):format(i.machine.slug, QUICK and " (QUICK)" or ""), "",
    side.run_lines(i),
    ("- Rows: the shapes of `%s` with issue 18's target and an f32, f16, bf16 or int8 KV cache, at the target's lengths, causal, cur_pos = kv_len - 1; each kernel is the planner's plan from %s")
      :format(side.relative(root, CFG.shapes), side.plans_from(root, i)),
    "- `stream`: `fdb_stream_fma` with one add per vector: every K and V row read once in a kernel's order (per batch row and kv head, chunks of 256 keys, K then V), widened to f32, prefetched 4 KiB ahead. `stream + G FMAs`: the same loop with each vector (16 lanes with AVX-512; 8 with AVX2, bf16 split into its even and odd elements as the AVX2 kernels read it) fed to G FMAs instead (12 independent accumulator chains; AVX2: 8, each FMA reading its multiplier from memory as the AVX2 kernels read q): the multiply-adds a kernel owes each K and each V element (G query heads per kv head), and nothing else, no scores stored, no softmax. int8 KV: the codes read the same way, the per-row scales read after each chunk's codes, and for a kernel with MSD planes (`fdb_stream_dot`) every 64 codes fed to G x P int8 dot products (`vpdpbusd`, P = the planes of the kernel's key: an MSD kernel owes each K and each V vector that many), `stream` a byte sum (`vpsadbw`) instead; for a kernel without planes (`fdb_stream_fma_i8`) every code sign-extended to f32 and fed to G FMAs as above; the GB/s count the codes and the scales",
    ("- Read bandwidth (%s sum, %d MiB, all threads), sampled at the start and at the end: best **%.1f GB/s**, median %.1f GB/s (%s); before every timed call one more pass over the flush buffer (`fdb_call_bw_gbs`): the %% in each cell is the median over calls of GB/s / that sample")
      :format(i.bw_kernel, CFG.bw_bytes / 2 ^ 20, res.bw_best, res.bw_median, side.bw_line(res)),
    ("- Cold cache: before every timed call all threads read one word of each line of a %d MiB buffer; kernel, probe and stream are timed round-robin, %d rounds; buffers of 4 MiB and more ask for huge pages: %s")
      :format(i.flush / 2 ^ 20, CFG.rmax, i.hugepages and "yes" or "no"),
    "- Columns: GB/s of the KV bytes (K and V of every valid key, once) over the median cold time, with the median % of the bandwidth sampled before each call; kernel / probe = 1 / the median over rounds of kernel time / probe time of the same round, with its 95% sign-test interval; target = issue 18's bound in % of the bandwidth; finite out = no NaN or infinity in the kernel's out after its first call; n = rounds",
    side.load_line(i), "",
    report.md_table({ "shape", "kv_len", "G", "kernel key", "KV MiB", "probe's arithmetic per vector", "stream GB/s (% bw)", "stream + arithmetic GB/s (% bw)",
      "kernel GB/s (% bw)", "kernel / probe [95% CI]", "target", "finite out", "n" }, rows), "" }
  if chart then L[#L + 1] = ("## Chart\n\n![GB/s of stream, probe and kernel per row](%s)\n"):format(chart) end
  return table.concat(L, "\n")
end

-- The chart's data (one line per row: stream, probe, kernel GB/s) and its gnuplot script.
local function chart_script(res)
  local dir, name = CFG.plot_dir .. "/" .. res.info.name, res.info.name
  local lines = { "# row\tstream\tstream+arithmetic\tkernel" }
  for _, r in ipairs(res.rows) do
    local g = {}
    for k = 3, 1, -1 do g[#g + 1] = ("%.4g"):format(gbs(r.vs[k], r.bytes) or 0) end
    lines[#lines + 1] = ('"%s %s (G=%d)"\t%s'):format(r.row.name, report.klen(r.row.len), r.G, table.concat(g, "\t"))
  end
  report.write_file(dir .. "/gbs.dat", table.concat(lines, "\n") .. "\n")
  local body = table.concat({ "set grid ytics", "set key inside top right vertical opaque box font ',9'",
    "set style data histograms", "set style histogram clustered gap 1", "set style fill solid 0.85 border -1",
    "set xtics rotate by -20 font ',9'", ("set yrange [0:%.4g]"):format(res.bw_best * 1.3),
    ("set title 'cold GB/s of the KV read: stream, stream + G FMAs (int8: G x P dots), kernel (%s, %s)'"):format(res.info.machine.slug, res.info.commit),
    "set ylabel 'GB/s (KV bytes / median cold time)'",
    ("set arrow from graph 0, first %.4g to graph 1, first %.4g nohead lw 2 dt 2 lc rgb 'black'"):format(res.bw_median, res.bw_median),
    ("set label 'median bandwidth sample %.1f GB/s' at graph 0.01, first %.4g offset 0,0.6 font ',9'"):format(res.bw_median, res.bw_median),
    ("plot '%s/gbs.dat' using 2:xtic(1) title 'stream' lc rgb '#8da0cb', '' using 3 title 'stream + G FMAs (int8: G x P dots)' lc rgb '#66c2a5', '' using 4 title 'kernel' lc rgb '#fc8d62'"):format(dir) }, "\n")
  return side.chart_script(dir, CFG.out, name, body)
end

-- The sanity failures of a run (failed calls, NaN outputs) as lines.
local function failures(rows)
  local bad = {}
  for _, r in ipairs(rows) do
    for _, v in ipairs(r.vs) do
      if v.status ~= "ok" and not NOT_MEASURED[v.status] then bad[#bad + 1] = ("%s %s %s: %s"):format(r.row.name, report.klen(r.row.len), v.name, v.status) end
    end
    if r.vs[1].status == "ok" and not r.vs[1].finite then
      bad[#bad + 1] = ("%s %s kernel: NaN or infinity in out"):format(r.row.name, report.klen(r.row.len))
    end
  end
  return bad
end

-- Main: bandwidth, the rows, bandwidth again, report and chart.
local function main()
  local info = side.run_info("stream", root, QUICK)
  local ctx = side.context(info, CFG.backend)
  local todo = measured_rows(CFG.shapes)
  local progress = M.progress(2 + #todo)
  local t0 = fdb.fdb_now()
  local res = { info = info, bw = {}, rows = {} }
  progress:step("bandwidth")
  side.sample_bw(info, res.bw, "start", CFG.bw_reps, CFG.bw_bytes)
  for _, row in ipairs(todo) do res.rows[#res.rows + 1] = bench_row(ctx, row, info, progress) end
  progress:step("bandwidth")
  side.sample_bw(info, res.bw, "end", CFG.bw_reps, CFG.bw_bytes)
  progress:done()
  side.finish("bench-stream", CFG.out, info, res, t0, chart_script, markdown, failures(res.rows))
end

main()
