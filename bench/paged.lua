-- `make bench-paged`: the paged KV layout (FD_PAGED) against dense BHSD at the
-- same length, with the same plan, cold cache, all cores, interleaved in one
-- run, next to the machine's read bandwidth sampled in the same run.
-- Per row: dense, then paged at page sizes 16, 64, 256, 1024; pages scattered
-- over the pool (a coprime-stride permutation: no two neighbouring pages of a
-- sequence adjacent). Each paged plan is forced to the dense plan's chunk,
-- group tile, splits, threads and ISA (fd_plan_opts), so both run the same
-- tiling; paged out is compared with dense out bit for bit (memcmp) once per
-- variant. Writes results/bench/paged-<machine>[-quick].md and a chart of the
-- paged/dense time ratio against the page size (.svg, .png). Never asserts a time.
--   QUICK=1        a short run (the 16k row only, fewer repetitions), "-quick" files
--   FDB_BACKEND    tcc (default) or cc
--   FDB_TABLE      tuned table the dense plans come from (default results/tuned/<machine>.tsv if present)
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
pcall(ffi.cdef, "int memcmp(const void *a, const void *b, size_t n);")

local env = side.env
local QUICK = env("QUICK", "0") ~= "0"
local K = 1024
local CFG = side.config(root, QUICK, {
  quick = QUICK,
  target_s = QUICK and 0.1 or 3.0,        -- timed seconds per variant of a row
  rmin = QUICK and 7 or 31, rmax = QUICK and 9 or 101,
  page_sizes = { 16, 64, 256, 1024 },
  limit = 1.05,                            -- the issue's bound on paged/dense at page_size >= 64
})

-- The pieces shared with the other side benchmark (bench/side.lua), bound to this one.
local function run_info() return side.run_info("paged", root, QUICK) end
local function sample_bw(info, bw, when, reps) side.sample_bw(info, bw, when, reps, CFG.bw_bytes) end
local function context(info) return side.context(info, CFG.backend) end
local function alloc(list, bytes) return side.alloc("paged", list, bytes) end
local esize, num, bw_line, md_table = side.esize, side.num, side.bw_line, report.md_table

-- Llama-3.1-8B decode in bf16 (B=1, Hq=32, Hkv=8, D=128).
local LLAMA = { batch = 1, n_q_heads = 32, n_kv_heads = 8, head_dim = 128, q_dtype = "bf16",
                kv_dtype = "bf16", out_dtype = "bf16", mask_mode = "causal" }
-- The same heads batched: 8 sequences (GQA, 4 query heads per kv head).
local GQA_B8 = { batch = 8, n_q_heads = 32, n_kv_heads = 8, head_dim = 128, q_dtype = "bf16",
                 kv_dtype = "bf16", out_dtype = "bf16", mask_mode = "causal" }
-- The measured rows: a shape at one length (every batch row holds len keys).
local ROWS = {
  { name = "llama3.1-8b-bf16", shape = LLAMA, len = 16 * K, quick = true },
  { name = "llama3.1-8b-bf16", shape = LLAMA, len = 64 * K },
  { name = "gqa-b8-bf16", shape = GQA_B8, len = 4 * K },
}

-- The rows of this run (QUICK: those marked quick).
local function rows_of_run()
  local out = {}
  for _, r in ipairs(ROWS) do if r.quick or not QUICK then out[#out + 1] = r end end
  return out
end

-- The dense BHSD problem of row r: q, K, V (random, fixed seeds), cur_pos = len - 1.
local function dense_buffers(r, keep) return side.buffers("paged", r.shape, r.len, keep) end

-- The greatest common divisor of a and b.
local function gcd(a, b)
  while b ~= 0 do a, b = b, a % b end
  return a
end

-- A stride coprime to n near n times the golden ratio's inverse, never 1 or
-- n - 1 (which would keep neighbours adjacent) when n > 4.
local function coprime_step(n)
  if n <= 4 then return 1 end
  local step = math.floor(n * 0.618)
  while gcd(step, n) ~= 1 or step == 1 or step == n - 1 do step = step + 1 end
  return step
end

-- The paged pools of page size ps holding the dense problem's keys: sequence
-- page i of batch row b at pool page (b * per_row + i) * step mod pool_pages;
-- its block table [batch, per_row].
local function paged_pool(r, b, ps, keep)
  local s, n = r.shape, r.len
  local per_row = math.ceil(n / ps)
  local g = { ps = ps, per_row = per_row, pool_pages = s.batch * per_row }
  local row_bytes = s.head_dim * esize(s.kv_dtype)
  local pool_bytes = g.pool_pages * s.n_kv_heads * ps * row_bytes
  g.k, g.v = alloc(keep, pool_bytes), alloc(keep, pool_bytes)
  g.table = ffi.cast("int32_t *", alloc(keep, 4 * g.pool_pages))
  g.step = coprime_step(g.pool_pages)
  for i = 0, g.pool_pages - 1 do g.table[i] = i * g.step % g.pool_pages end
  for bi = 0, s.batch - 1 do
    for i = 0, per_row - 1 do
      local keys = math.min(ps, n - i * ps)
      for j = 0, s.n_kv_heads - 1 do
        local src = ((bi * s.n_kv_heads + j) * n + i * ps) * row_bytes
        local dst = ((g.table[bi * per_row + i] * s.n_kv_heads + j) * ps) * row_bytes
        ffi.copy(ffi.cast("char *", g.k) + dst, ffi.cast("char *", b.k) + src, keys * row_bytes)
        ffi.copy(ffi.cast("char *", g.v) + dst, ffi.cast("char *", b.v) + src, keys * row_bytes)
      end
    end
  end
  return g
end

-- The fd_shape of row r: dense BHSD, or paged pool g.
local function shape_of(r, g)
  local t = { kv_len = r.len, layout = g and "paged" or "bhsd", page_size = g and g.ps or 0,
              pool_pages = g and g.pool_pages or 0 }
  for k, v in pairs(r.shape) do t[k] = v end
  return fd.shape(t)
end

-- The plan choices to force on paged plans, from the dense plan's info.
local function forced_opts(pi)
  return { chunk = pi.chunk, group_tile = pi.group_tile, splits = pi.splits, threads = pi.threads,
           isa = fd.ISA_NAMES[pi.isa] }
end

-- A variant of row r (g nil: dense): its plan, args, out buffer and a runner
-- that records the time of each fd_run call in v.times.
local function variant(ctx, r, b, g, opts, keep)
  local s = r.shape
  local v = { name = g and ("paged " .. g.ps) or "dense", ps = g and g.ps, g = g, status = "ok", times = {} }
  v.out_bytes = b.nq * esize(s.out_dtype)
  v.out = alloc(keep, v.out_bytes)
  v.plan = fd.plan(ctx, shape_of(r, g), opts)
  v.info = fd.plan_info(v.plan, r.len, ctx)
  v.args = fd.args { q = b.q, k = g and g.k or b.k, v = g and g.v or b.v, cur_pos = b.cur_pos, out = v.out,
                     block_table = g and g.table or nil }
  v.fn = side.timed_runner(ctx, v.plan, v.args, v)
  return v
end

-- Which of the forced choices a paged plan does not have ("" when all match).
local function plan_mismatch(dense, paged)
  local bad = {}
  for _, k in ipairs { "chunk", "group_tile", "splits", "threads", "isa" } do
    if dense[k] ~= paged[k] then bad[#bad + 1] = ("%s %s vs %s"):format(k, tostring(paged[k]), tostring(dense[k])) end
  end
  return table.concat(bad, ", ")
end

-- First call of every variant (timed: it sets the repetitions), then each
-- paged out against dense out, bit for bit.
local function first_calls(vs)
  side.first_calls(vs, function(v)
    if v.g and v.status == "ok" and vs[1].status == "ok" then v.equal = ffi.C.memcmp(v.out, vs[1].out, v.out_bytes) == 0 end
  end)
end

-- Measure one row: buffers, plans, first calls, interleaved cold timing.
local function bench_row(ctx, r, info, progress)
  local keep = {}
  progress:step(("%s %s: buffers"):format(r.name, report.klen(r.len)))
  local b = dense_buffers(r, keep)
  local dense = variant(ctx, r, b, nil, nil, keep)
  local vs, opts = { dense }, forced_opts(dense.info)
  for _, ps in ipairs(CFG.page_sizes) do
    progress:step(("%s %s: pool of page size %d"):format(r.name, report.klen(r.len), ps))
    local ok, v = pcall(variant, ctx, r, b, paged_pool(r, b, ps, keep), opts, keep)
    if ok then v.mismatch = plan_mismatch(dense.info, v.info) else v = { name = "paged " .. ps, ps = ps, status = tostring(v) } end
    vs[#vs + 1] = v
  end
  first_calls(vs)
  progress:step(("%s %s: timing %d variants"):format(r.name, report.klen(r.len), #vs))
  M.time_interleaved(vs, CFG, true)
  for _, v in ipairs(vs) do
    v.bytes = M.kv_bytes(r.shape, r.len)
    if v ~= dense then side.paired(v, dense) end
    v.plan, v.args, v.g = nil, nil, v.g and { ps = v.g.ps, pool_pages = v.g.pool_pages, step = v.g.step }
  end
  for _, p in ipairs(keep) do ffi.C.free(p) end
  collectgarbage()
  return { row = r, variants = vs, plan = dense.info }
end

-- The verdict of a paged variant: within the limit at page_size >= 64, or by how much it is slower.
local function verdict(v)
  if not v.ps or not v.ratio then return "" end
  if v.ps < 64 then return "(not bound)" end
  return v.ratio <= CFG.limit and "ok" or ("**%.1f%% slower**"):format((v.ratio - 1) * 100)
end

-- The table cells of one variant.
local function cells(v, bw_best, bw_med)
  if not v.cold then return { v.ps and tostring(v.ps) or "dense", "failed: " .. tostring(v.status):gsub("|", "/"), "", "", "", "", "", "", "", "" } end
  local t = side.time_cells(v.cold, v.bytes, bw_best, bw_med)
  return { v.ps and tostring(v.ps) or "dense", t[1], t[2], t[3], t[4], v.ratio and num(v.ratio, 3) or "1",
           v.ratio and side.ci(v) or "", v.ps and (v.equal and "yes" or "**NO**") or "(reference)", tostring(v.cold.n),
           verdict(v) }
end

-- The section of one measured row: its shape, forced plan and table.
local function row_section(res, x)
  local r, s, pi = x.row, x.row.shape, x.plan
  local L = { ("## %s at %s"):format(r.name, report.klen(r.len)), "",
    ("B=%d Hq=%d Hkv=%d D=%d, q/kv/out %s/%s/%s, causal, every row %d keys; KV read per run %.0f MiB. "
      .. "Plan (dense, forced on every paged plan): key `%s`%s, chunk %d, group tile %d, splits %d, threads %d, isa %s%s.")
      :format(s.batch, s.n_q_heads, s.n_kv_heads, s.head_dim, s.q_dtype, s.kv_dtype, s.out_dtype, r.len,
        M.kv_bytes(s, r.len) / 2 ^ 20, pi.key, pi.split_key ~= "" and (" + split `" .. pi.split_key .. "`") or "",
        pi.chunk, pi.group_tile, pi.splits, pi.threads, fd.ISA_NAMES[pi.isa], pi.from_table and " (tuned table)" or " (heuristic)"),
    "" }
  local rows = {}
  for _, v in ipairs(x.variants) do rows[#rows + 1] = cells(v, res.bw_best, res.bw_median) end
  L[#L + 1] = md_table({ "page size", "median ms", "q1–q3 ms", "GB/s", "% of bw (best / median)",
    "ratio to dense", "paired ratio [95% CI]", "bits equal", "n", "≤ 1.05?" }, rows)
  for _, v in ipairs(x.variants) do
    if v.mismatch and v.mismatch ~= "" then L[#L + 1] = ("\nNote: paged %d plan differs: %s"):format(v.ps, v.mismatch) end
  end
  local pools = {}
  for _, v in ipairs(x.variants) do
    if v.g and v.info then pools[#pools + 1] = ("%d: %d pages, stride %d, key `%s`"):format(v.ps, v.g.pool_pages, v.g.step, v.info.key) end
  end
  L[#L + 1] = "\nPools (page size: pages, permutation stride, kernel key): " .. table.concat(pools, "; ") .. "."
  return table.concat(L, "\n")
end

-- The summary: per row, the ratio to dense at each page size and the verdict at page_size >= 64.
local function summary(res)
  local head, rows = { "shape", "kv_len", "dense GB/s (% of best bw)" }, {}
  for _, ps in ipairs(CFG.page_sizes) do head[#head + 1] = ("paged %d / dense"):format(ps) end
  head[#head + 1] = "paged within 5% at page_size >= 64"
  for _, x in ipairs(res.rows) do
    local d, worst = x.variants[1], 0
    local g = d.cold and d.bytes / (d.cold.median * 1e-3) * 1e-9
    local row = { x.row.name, report.klen(x.row.len), g and ("%s (%s%%)"):format(num(g, 1), num(g / res.bw_best * 100, 0)) or "-" }
    for k = 2, #x.variants do
      local v = x.variants[k]
      row[#row + 1] = v.ratio and num(v.ratio, 3) or "failed"
      if v.ps >= 64 then worst = math.max(worst, v.ratio or math.huge) end
    end
    row[#row + 1] = worst <= CFG.limit and "yes" or worst == math.huge and "**no**: a paged plan failed"
      or ("**no**: worst %s"):format(num(worst, 3))
    rows[#rows + 1] = row
  end
  return "## Summary\n\nCold median time of paged over dense, same plan (the issue's bound: at most 1.05 at page_size >= 64).\n\n"
    .. md_table(head, rows) .. "\n"
end

-- The Markdown report.
local function markdown(res, chart)
  local i = res.info
  local L = {
    ("# flashdecode paged KV benchmark: %s%s"):format(i.machine.slug, QUICK and " (QUICK)" or ""), "",
    side.run_lines(i),
    ("- Dense plans from %s; each paged plan forced (fd_plan_opts) to the dense plan's chunk, group tile, splits, threads and ISA (read back with fd_plan_info), so dense and paged run the same tiling")
      :format(side.plans_from(root, i)),
    ("- Read bandwidth (%s sum, %d MiB, all threads), sampled at the start, after each row and at the end: best **%.1f GB/s**, median %.1f GB/s (%s)")
      :format(i.bw_kernel, CFG.bw_bytes / 2 ^ 20, res.bw_best, res.bw_median, bw_line(res)),
    ("- Cold cache: before every timed call all threads read one word of each line of a %d MiB buffer (clean lines, as the tuner's flush leaves them); the variants of a row are timed round-robin (dense, 16, 64, 256, 1024, dense, ...), %d to %d rounds, so load from elsewhere hits them alike; buffers of 4 MiB and more ask for huge pages: %s")
      :format(i.flush / 2 ^ 20, CFG.rmin, CFG.rmax, i.hugepages and "yes" or "no"),
    "- Pages scattered: sequence page i of batch row b sits at pool page (b·per_row + i)·stride mod pool_pages, the stride coprime to the pool size and neither 1 nor pool_pages − 1, so no two neighbouring pages are adjacent",
    "- Columns: median and quartiles of the cold fd_run times; GB/s of the K and V bytes read once; that as a share of the best and of the median bandwidth sample; ratio to dense = paged median / dense median; paired ratio = median over rounds of paged/dense of the same round, with its 95% sign-test interval; bits equal = paged out memcmp dense out after the first call; n = rounds",
    side.load_line(i), "", summary(res) }
  for _, x in ipairs(res.rows) do L[#L + 1] = row_section(res, x) .. "\n" end
  if chart then L[#L + 1] = ("## Chart\n\n![paged/dense time ratio against page size](%s)\n"):format(chart) end
  return table.concat(L, "\n")
end

-- The chart's data (page size, ratio, interval) per row and its gnuplot script.
local function chart_script(res)
  local dir, name = CFG.plot_dir .. "/" .. res.info.name, res.info.name
  local data, clauses = {}, {}
  for k, x in ipairs(res.rows) do
    local pts = {}
    for _, v in ipairs(x.variants) do
      if v.ratio then pts[#pts + 1] = ("%d\t%.6g\t%.6g\t%.6g"):format(v.ps, v.ratio, v.ratio_lo, math.min(v.ratio_hi, 9)) end
    end
    data[#data + 1] = ("# %s %s\n%s\n\n\n"):format(x.row.name, report.klen(x.row.len), table.concat(pts, "\n"))
    clauses[#clauses + 1] = ("'%s/ratio.dat' index %d using 1:2:3:4 with yerrorlines lw 2 pt 7 title '%s %s'")
      :format(dir, k - 1, x.row.name, report.klen(x.row.len))
  end
  report.write_file(dir .. "/ratio.dat", table.concat(data))
  clauses[#clauses + 1] = ("%g with lines lw 2 dt 2 lc rgb 'red' title 'limit %g'"):format(CFG.limit, CFG.limit)
  clauses[#clauses + 1] = "1 with lines lw 1 lc rgb 'black' notitle"
  local body = table.concat({ "set grid", "set key outside right top font ',9'", "set logscale x 2",
    "set xrange [11:1500]", "set xtics (16, 64, 256, 1024)",
    ("set title 'paged / dense cold time, same plan (%s, %s)'"):format(res.info.machine.slug, res.info.commit),
    "set xlabel 'page size (keys)'", "set ylabel 'time ratio paged / dense (bars: 95% CI of paired ratio)'",
    "plot " .. table.concat(clauses, ", \\\n  ") }, "\n")
  return side.chart_script(dir, CFG.out, name, body)
end

-- Main: bandwidth, every row, bandwidth again, report and chart.
local function main()
  local info = run_info()
  local ctx = context(info)
  local rows = rows_of_run()
  local progress = M.progress(2 + #rows * (2 + #CFG.page_sizes))
  local t0 = fdb.fdb_now()
  local res = { info = info, bw = {}, rows = {} }
  progress:step("bandwidth")
  sample_bw(info, res.bw, "start", CFG.bw_reps)
  for _, r in ipairs(rows) do
    res.rows[#res.rows + 1] = bench_row(ctx, r, info, progress)
    sample_bw(info, res.bw, ("after %s %s"):format(r.name, report.klen(r.len)), 3)
  end
  progress:step("bandwidth")
  sample_bw(info, res.bw, "end", CFG.bw_reps)
  progress:done()
  side.finish("bench-paged", CFG.out, info, res, t0, chart_script, markdown)
end

main()
