-- The benchmark's report: results/bench/<name>.tsv (every figure, one row per
-- measurement) and results/bench/<name>.md (tables, method, charts).
local roofline_rule = require("bench.roof")
local facts = require("facts")
local stats = require("tuner.stats")

local M = {}

local MiB = 2 ^ 20

-- Achieved GB/s of a row for a cache state, and its share of the DRAM bandwidth.
function M.gbs(row, cache, bw_all)
  local st = row[cache]
  if not st or not st.median then return nil end
  local g = row.bytes / (st.median * 1e-3) * 1e-9
  return g, bw_all and g / bw_all * 100 or nil
end

-- Least-squares fit of cold median ms against KV bytes for one variant of a
-- shape: { gbs = marginal GB/s (1/slope), ms0 = intercept, n }.
function M.fit(runs, shape, variant)
  local xs, ys = {}, {}
  for _, r in ipairs(runs) do
    if r.shape == shape and r.variant == variant and r.cold then
      xs[#xs + 1], ys[#ys + 1] = r.bytes, r.cold.median
    end
  end
  local n = #xs
  if n < 2 then return nil end
  local mx, my = 0, 0
  for i = 1, n do mx, my = mx + xs[i] / n, my + ys[i] / n end
  local sxy, sxx = 0, 0
  for i = 1, n do sxy, sxx = sxy + (xs[i] - mx) * (ys[i] - my), sxx + (xs[i] - mx) ^ 2 end
  if sxx == 0 or sxy <= 0 then return nil end
  local slope = sxy / sxx                              -- ms per byte
  return { gbs = 1 / (slope * 1e-3) * 1e-9, ms0 = my - slope * mx, n = n }
end

-- A number with d decimals (two more below 1 when d is 1), or "-".
local function f(x, d)
  if x == nil or x ~= x then return "-" end
  if d == 1 and math.abs(x) < 1 then d = 3 end
  return ("%." .. (d or 2) .. "f"):format(x)
end

-- A time in ms with 3 significant digits.
local function ms(x)
  if x == nil then return "-" end
  return x >= 100 and ("%.0f"):format(x) or x >= 10 and ("%.1f"):format(x) or x >= 1 and ("%.2f"):format(x)
    or ("%.3f"):format(x)
end

-- A length as "16k" when a multiple of 1024.
local function klen(n) return n % 1024 == 0 and ("%dk"):format(math.floor(n / 1024)) or tostring(n) end
M.klen = klen

local COLS = { "kind", "shape", "kv_len", "capacity", "variant", "backend", "isa", "cache", "threads", "reps",
  "median_ms", "q1_ms", "q3_ms", "min_ms", "max_ms", "kv_bytes", "gbs", "pct_bw", "speedup_vs_vanilla",
  "plan_ms", "first_run_ms", "compile_ms", "key", "split_key", "chunk", "group_tile", "splits",
  "from_table", "max_abs_diff_vs_vanilla", "status", "when", "gmacs", "ceiling_gbs", "roof_gbs", "pct_roof", "bound",
  "call_bw_gbs", "pct_call_bw", "pct_call_roof" }

-- One TSV line from a table keyed by column name ("-" for missing).
local function tsv_line(t)
  local out = {}
  for i, c in ipairs(COLS) do
    local v = t[c]
    if type(v) == "number" then v = (v == math.floor(v) and math.abs(v) < 1e15) and ("%d"):format(v) or ("%.6g"):format(v) end
    if type(v) == "boolean" then v = v and 1 or 0 end
    out[i] = v == nil and "-" or tostring(v):gsub("[\t\n]", " ")
  end
  return table.concat(out, "\t")
end

-- TSV columns of a measurement row for one cache state.
local function run_cols(kind, r, cache, bw_all, info)
  local st = r[cache] or {}
  local cs = (cache == "cold" and info) and M.call_shares(r, info) or {}
  local g, pct = M.gbs(r, cache, bw_all)
  return { kind = kind, shape = r.shape, kv_len = r.len, capacity = r.cap or r.len, variant = r.variant,
    backend = r.backend, isa = r.isa, cache = cache, threads = r.threads, reps = r.reps,
    median_ms = st.median, q1_ms = st.q1, q3_ms = st.q3, min_ms = st.min, max_ms = st.max, kv_bytes = r.bytes,
    gbs = g, pct_bw = pct, speedup_vs_vanilla = r["speedup_" .. cache], plan_ms = r.plan_ms,
    first_run_ms = r.first_ms, compile_ms = r.compile_ms, key = r.key, split_key = r.split_key ~= "" and r.split_key or nil,
    chunk = r.chunk, group_tile = r.group_tile, splits = r.splits, from_table = r.from_table,
    max_abs_diff_vs_vanilla = r.diff, status = r.status,
    ceiling_gbs = r.roof and r.roof.ceiling and r.roof.ceiling.gbs, roof_gbs = r.roof and r.roof.roof,
    pct_roof = g and r.roof and g / r.roof.roof * 100, bound = r.roof and r.roof.bound,
    call_bw_gbs = cs.bw, pct_call_bw = cs.pct_bw, pct_call_roof = cs.pct_roof }
end

-- The measured rates for a thread count ({ fma, bf16, int8, lanes }; the
-- all-thread ones for counts not measured) and the read bandwidth it is held to.
local function rates_for(i, threads)
  return (i.rates and (i.rates[threads] or i.rates[i.threads])) or { fma = i.fma_all },
         threads == 1 and i.bw_one or i.bw_all
end

-- Set row.roof (bench/roof.lua: roof, bound, ceiling) of every run and thread
-- row from its shape, its kernel's ISA and the rates and bandwidth of its
-- thread count.
function M.annotate(res)
  local i, by = res.info, {}
  for _, sh in ipairs(res.shapes) do by[sh.shape.name] = sh.shape end
  local function one(r)
    local s = by[r.shape]
    local rates, bw = rates_for(i, r.threads)
    if s and bw then
      local k = roofline_rule.kernel_arith(r.key) or {}
      r.roof = roofline_rule.roof({ n_q_heads = s.n_q_heads, n_kv_heads = s.n_kv_heads, q_len = s.q_len,
        q_dtype = s.q_dtype, kv_dtype = s.kv_dtype, isa = r.isa, backend = r.backend, scores = k.scores,
        planes = k.planes, pv = k.pv }, rates, bw)
    end
  end
  for _, r in ipairs(res.runs) do one(r) end
  for _, r in ipairs(res.threads or {}) do one(r) end
end

-- The arithmetic rates of a run: label, probe name and the instruction's multiply-adds.
local RATES = {
  { key = "fma", shape = "f32-fma", what = "f32 FMA", ins = "vfmadd132ps" },
  { key = "bf16", shape = "bf16-dot", what = "bf16 dot", ins = "vdpbf16ps", has = "has_bf16", feature = "AVX512-BF16" },
  { key = "int8", shape = "int8-dot", what = "int8 dot", ins = "vpdpbusd", has = "has_int8", feature = "AVX512-VNNI" },
  { key = "int16", shape = "int16-madd", what = "int16 madd", ins = "vpmaddwd", has = "has_int16", feature = "AVX2" },
}
M.RATES = RATES

-- The TSV text: metadata comments, a header, bandwidth, runs and thread rows.
function M.tsv(res)
  local i, L = res.info, {}
  L[#L + 1] = ("# flashdecode bench %s; cpu %s (%d cores); commit %s; %s; flashdecode %s templates %s tcc %s")
    :format(i.name, i.machine.model, i.threads, i.commit, i.date, i.build.version, i.build.templates_hash, i.build.tcc_version)
  L[#L + 1] = table.concat(COLS, "\t")
  for _, b in ipairs(res.bw) do
    L[#L + 1] = tsv_line { kind = "bandwidth", shape = ("read-sum-%dMiB"):format(b.bytes / MiB), variant = i.bw_kernel,
      threads = b.threads, reps = i.cfg.bw_reps, kv_bytes = b.bytes, gbs = b.gbs, cache = b.resident and "resident" or "dram",
      when = b.when, status = "ok" }
  end
  for _, k in ipairs(RATES) do
    for t, rt in pairs(i.rates or {}) do
      L[#L + 1] = tsv_line { kind = "rate", shape = k.shape, variant = ("%s x12 chains, %d f32 lanes"):format(k.ins, rt.lanes or 0),
        threads = t, reps = i.rate_reps, gmacs = rt[k.key], when = "best of start, end",
        status = rt[k.key] and "ok" or ("absent (no %s)"):format(k.feature or "FMA") }
    end
  end
  for _, r in ipairs(res.runs) do
    for _, c in ipairs { "cold", "warm" } do L[#L + 1] = tsv_line(run_cols("run", r, c, i.bw_all, i)) end
  end
  for _, r in ipairs(res.threads) do L[#L + 1] = tsv_line(run_cols("threads", r, "cold", i.bw_all)) end
  return table.concat(L, "\n") .. "\n"
end

-- A Markdown table from a header list and rows of cells.
local function md_table(head, rows)
  local L = { "| " .. table.concat(head, " | ") .. " |", "|" .. ("---|"):rep(#head) }
  for _, r in ipairs(rows) do L[#L + 1] = "| " .. table.concat(r, " | ") .. " |" end
  return table.concat(L, "\n")
end
M.md_table = md_table

-- A shape's one-line description.
local function describe(s)
  return ("B=%d Hq=%d Hkv=%d D=%d, q/kv/out %s/%s/%s, %s, %s"):format(s.batch, s.n_q_heads, s.n_kv_heads,
    s.head_dim, s.q_dtype, s.kv_dtype, s.out_dtype, s.mask_mode or "causal", s.layout or "bhsd")
end

-- The headline: each shape at its longest length, cold cache, every variant.
local function headline(res)
  local vs, head = {}, { "shape", "kv_len" }
  for _, v in ipairs(res.variants) do vs[#vs + 1] = v.name head[#head + 1] = v.name end
  local rows = {}
  for _, sh in ipairs(res.shapes) do
    local n = sh.lens[#sh.lens]
    local row = { sh.shape.name, klen(n) }
    for _, r in ipairs(sh.runs) do
      if r.len == n then
        local g, p = M.gbs(r, "cold", res.info.bw_all)
        local cell = g and ("%s GB/s (%s%%)"):format(f(g, 1), f(p, 0)) or "failed"
        if g and not r.variant:match("^vanilla") and r.speedup_cold then cell = cell .. (", %s×"):format(f(r.speedup_cold)) end
        for j, name in ipairs(vs) do if name == r.variant then row[2 + j] = cell end end
      end
    end
    for j = 1, #vs do row[2 + j] = row[2 + j] or "-" end
    rows[#rows + 1] = row
  end
  return md_table(head, rows)
end

-- A kernel's ISA name from a run row (the key digit after planning).
local function isa_name(r)
  if type(r.isa) == "number" then return facts.isas[r.isa] and facts.isas[r.isa].name or tostring(r.isa) end
  return tostring(r.isa or "-")
end

-- The roofline of each shape at its longest length, every variant (cold): the
-- compute ceiling of the arithmetic its kernel uses (bench/roof.lua), the roof
-- min(ceiling, read bandwidth), and the kernel against both.
local function roofline(res)
  local i, rows = res.info, {}
  if not i.fma_all or i.fma_all <= 0 then return nil end
  for _, sh in ipairs(res.shapes) do
    local s, n = sh.shape, sh.lens[#sh.lens]
    for _, r in ipairs(sh.runs) do
      if r.len == n and r.roof then
        local g = M.gbs(r, "cold", i.bw_all)
        local c = r.roof.ceiling
        local cb = M.call_shares(r, i)
        rows[#rows + 1] = { s.name, klen(n), c and f(c.G, 0) or "-", r.variant, isa_name(r), f(r.threads, 0),
          c and f(c.gbs, 1) or "-", c and c.scores_label or "-", c and c.pv_label or "-", f(r.roof.roof, 1),
          r.roof.bound, g and f(g, 1) or "failed", g and f(g / i.bw_all * 100, 0) or "-",
          g and i.bw_all_median and f(g / i.bw_all_median * 100, 0) or "-", g and f(g / r.roof.roof * 100, 0) or "-",
          f(cb.bw, 1), f(cb.pct_bw, 0), f(cb.pct_roof, 0) }
      end
    end
  end
  return md_table({ "shape", "kv_len", "G", "variant", "isa", "threads", "ceiling GB/s", "scores by", "P·V by", "roof GB/s",
    "bound", "GB/s", "% best bw", "% median bw", "% roof", "bw at its calls GB/s", "% call bw", "% call roof" }, rows)
end

-- A row against the bandwidth sampled just before each of its cold calls
-- (bench/roof.lua call_fraction): { bw = median sample GB/s, pct_bw, pct_roof
-- (over min(ceiling, sample)), n }; empty for rows without samples or run at
-- another thread count than the samples'.
function M.call_shares(r, i)
  if not r.call_bw or #r.call_bw == 0 or r.threads ~= i.threads then return {} end
  local c = r.roof and r.roof.ceiling
  local fb, n, q1, q3 = roofline_rule.call_fraction(r.bytes, r.call_s, r.call_bw)
  local fr = roofline_rule.call_fraction(r.bytes, r.call_s, r.call_bw, c and c.gbs)
  return { bw = stats.median(r.call_bw), pct_bw = fb and fb * 100, pct_roof = fr and fr * 100, n = n,
           q1 = q1 and q1 * 100, q3 = q3 and q3 * 100 }
end

-- Issue 18's bounds (the shape set's `target` fields): the planner's kernel
-- (variant "tcc"), cold, at each target length, against the bandwidth
-- sampled next to each call; met when at least pct % of it, or at least 85 %
-- of min(ceiling, sample) where a measured compute ceiling is what bounds it
-- (bench/roof.lua bound_met and ROOF_PCT).
local function targets(res)
  local i, rows = res.info, {}
  for _, sh in ipairs(res.shapes) do
    local t = sh.shape.target
    for _, n in ipairs(t and t.at or {}) do
      for _, r in ipairs(sh.runs) do
        if r.len == n and r.variant == "tcc" then
          local g = M.gbs(r, "cold", i.bw_all)
          local cb = M.call_shares(r, i)
          local c = r.roof and r.roof.ceiling
          local met = roofline_rule.bound_met(t.pct, cb.pct_bw, cb.pct_roof, c and c.gbs, cb.bw)
          rows[#rows + 1] = { sh.shape.name, klen(n), ("%d%%"):format(t.pct), g and f(g, 1) or "failed",
            g and f(g / i.bw_all * 100, 0) or "-", g and i.bw_all_median and f(g / i.bw_all_median * 100, 0) or "-",
            f(cb.bw, 1), f(cb.pct_bw, 0), cb.q1 and ("%s-%s"):format(f(cb.q1, 0), f(cb.q3, 0)) or "-",
            c and f(c.gbs, 1) or "-", f(cb.pct_roof, 0),
            cb.pct_bw and (met and "met" or "not met") or "-", cb.n and tostring(cb.n) or "-" }
        end
      end
    end
  end
  if #rows == 0 then return nil end
  return md_table({ "shape", "kv_len", "target", "GB/s", "% best bw", "% median bw", "bw at its calls GB/s",
    "% call bw", "its calls' quartiles %", "ceiling GB/s", "% call roof", "verdict", "calls" }, rows)
end

-- "X G/s with N threads, Y with 1" for one rate, or why it is absent.
local function rate_text(i, k)
  local all, one = i.rates and i.rates[i.threads] or {}, i.rates and i.rates[1] or {}
  if not all[k.key] then
    return ("%s (`%s`): absent (%s)"):format(k.what, k.ins, k.feature and ("the CPU has no " .. k.feature)
      or "the benchmark build has no FMA")
  end
  return ("%s (`%s`): **%s G/s with %d threads**, %s with 1"):format(k.what, k.ins, f(all[k.key], 0), i.threads,
    f(one[k.key], 0))
end

-- The plan table of one shape (plan creation, compile time, what runs).
local function plan_table(sh)
  local rows = {}
  for _, r in ipairs(sh.runs) do
    if not r.variant:match("^vanilla") and r.status then
      rows[#rows + 1] = { klen(r.len), r.variant, r.status == "ok" and ms(r.plan_ms) or "-",
        r.status == "ok" and ms(r.first_ms) or "-", r.compile_ms and ms(r.compile_ms) or "-",
        r.key and ("`%s`"):format(r.key) or "-", r.split_key and r.split_key ~= "" and ("`%s`"):format(r.split_key) or "-",
        f(r.chunk, 0), f(r.group_tile, 0), f(r.splits, 0), f(r.pthreads, 0), r.from_table and "yes" or "no",
        r.status == "ok" and "ok" or r.status:sub(1, 120) }
    end
  end
  return md_table({ "kv_len", "variant", "plan ms", "first run ms", "compile ms", "key", "split key", "chunk",
    "tile", "splits", "threads", "table", "status" }, rows)
end

-- The results table of one shape: every length x variant x cache state.
local function result_table(sh, bw_all)
  local rows = {}
  for _, r in ipairs(sh.runs) do
    for _, c in ipairs { "cold", "warm" } do
      local st = r[c]
      if st then
        local g, p = M.gbs(r, c, bw_all)
        rows[#rows + 1] = { klen(r.len), f(r.bytes / MiB, 1), r.variant, c, ms(st.median),
          ("%s–%s (IQR %s–%s)"):format(ms(st.min), ms(st.max), ms(st.q1), ms(st.q3)), tostring(st.n),
          f(g, 1), f(p, 0), r["speedup_" .. c] and f(r["speedup_" .. c]) .. "×" or "-",
          r.diff and ("%.2g"):format(r.diff) or "-" }
      elseif c == "cold" then
        rows[#rows + 1] = { klen(r.len), f(r.bytes / MiB, 1), r.variant, "-", "failed: " .. tostring(r.status):sub(1, 100),
          "-", "-", "-", "-", "-", "-" }
      end
    end
  end
  return md_table({ "kv_len", "KV MiB", "variant", "cache", "median ms", "min–max ms", "reps", "GB/s", "% bw",
    "vs vanilla", "max abs diff vs vanilla" }, rows)
end

-- The slope table: marginal GB/s of time against kv_len for each shape and variant.
local function slope_table(res)
  local rows = {}
  for _, sh in ipairs(res.shapes) do
    for _, v in ipairs(res.variants) do
      local fit = M.fit(res.runs, sh.shape.name, v.name)
      if fit then
        rows[#rows + 1] = { sh.shape.name, v.name, tostring(fit.n), f(fit.gbs, 1),
          f(fit.gbs / res.info.bw_all * 100, 0), ms(fit.ms0) }
      end
    end
  end
  if #rows == 0 then return "_(no shape with two or more lengths in this run)_" end
  return md_table({ "shape", "variant", "points", "slope GB/s", "% bw", "intercept ms" }, rows)
end

-- The thread scaling table.
local function thread_table(res)
  if #res.threads == 0 then return "_(not measured in this run)_" end
  local rows, one = {}, {}
  for _, r in ipairs(res.threads) do
    if r.threads == 1 and r.cold then one[r.variant] = r.cold.median end
  end
  for _, r in ipairs(res.threads) do
    local g, p = M.gbs(r, "cold", res.info.bw_all)
    rows[#rows + 1] = { r.shape, klen(r.len), r.variant, tostring(r.threads), r.cold and ms(r.cold.median) or "failed",
      f(g, 1), f(p, 0), r.cold and one[r.variant] and f(one[r.variant] / r.cold.median) .. "×" or "-" }
  end
  return md_table({ "shape", "kv_len", "variant", "threads", "cold median ms", "GB/s", "% bw", "vs 1 thread" }, rows)
end

-- The Markdown report.
function M.md(res, charts)
  local i, L = res.info, {}
  local function add(s) L[#L + 1] = s end
  add(("# flashdecode benchmark: %s%s"):format(i.machine.slug, i.quick and " (QUICK run)" or ""))
  add("")
  add(("- CPU: %s, %d online cores; LLC %d MiB"):format(i.machine.model, i.threads, i.llc / MiB))
  add(("- Commit: `%s`; date: %s; flashdecode %s, templates `%s`, tcc %s"):format(i.commit, i.date,
    i.build.version, i.build.templates_hash, i.build.tcc_version))
  add(("- Read bandwidth (%s sum, %d MiB buffer, best over the run: %d repetitions at the start and at the end, 3 after each shape): **%s GB/s with %d threads** (median of the %d samples %s GB/s), %s GB/s with 1 thread; LLC-resident (%d MiB): %s GB/s with %d threads")
    :format(i.bw_kernel, i.cfg.bw_bytes / MiB, i.cfg.bw_reps, f(i.bw_all, 1), i.threads, i.bw_all_n or 0,
      f(i.bw_all_median, 1), f(i.bw_one, 1), i.llc / 2 / MiB, f(i.bw_llc, 1), i.threads))
  local rt = {}
  for _, k in ipairs(RATES) do rt[#rt + 1] = rate_text(i, k) end
  add(("- Arithmetic peaks (G multiply-adds/s, 12 independent register chains per thread, best of %d at the start and at the end of the run, the higher kept): %s")
    :format(i.rate_reps or 5, table.concat(rt, "; ")))
  local bwrows = {}
  for _, b in ipairs(res.bw) do
    bwrows[#bwrows + 1] = { b.when, ("%d MiB"):format(b.bytes / MiB), b.resident and "LLC" or "DRAM", tostring(b.threads), f(b.gbs, 1) }
  end
  add(("- Memory: buffers of 4 MiB and more (KV cache, bandwidth and flush buffers alike) %s; THP mode `%s`")
    :format(i.hugepages and "ask for transparent huge pages (madvise)" or "use 4 KiB pages (FDB_HUGEPAGES=0)", i.thp))
  add(("- Planner: %s"):format(i.table and ("tuned table `" .. i.table:gsub("^.*/results/", "results/") .. "`"
    .. (i.table_refused and " (refused: heuristic used, see the notes)" or ""))
    or "no tuned table for this machine (results/tuned/" .. i.machine.slug .. ".tsv): heuristic"))
  add(("- Shape set: `%s`; run time %.0f s; raw data: [%s.tsv](%s.tsv)"):format(i.shapes_path:gsub("^.*/tuner/", "tuner/"),
    i.seconds, i.name, i.name))
  add(("- Load average (/proc/loadavg) at start: `%s`; at end: `%s` (other processes on the machine make timings noisy)")
    :format(i.load_start or "?", i.load_end or "?"))
  for _, n in ipairs(res.notes) do add("- Note: " .. n) end
  add("")
  add("## Headline: longest length per shape, cold cache")
  add("")
  add("GB/s of KV read (valid part of K and V, once), % of the all-threads read bandwidth, and speedup over vanilla.")
  add("")
  add(headline(res))
  add("")
  local tg = targets(res)
  if tg then
    add("## Against the bandwidth of the moment: the bounds of issue 18")
    add("")
    add(("The read bandwidth of a shared machine moves between levels during a run (the samples below: best %s, median %s GB/s), so before every cold call the benchmark reads a %d MiB buffer once with all threads and keeps that sample beside the call's time. %% call bw = median over the calls of (the call's GB/s / the sample just before it), with the lower and upper quartiles of those per-call fractions beside it (nearest rank; a wide range means the calls split between levels); %% call roof = the same over min(compute ceiling, that sample) (bench/roof.lua). The kernel is the planner's (variant tcc: tuned table, else heuristic). A bound is met at pct %% of the call bandwidth, or at %d %% of the call roof where the compute ceiling measured in this run is below the sampled bandwidth.")
      :format(f(i.bw_all, 1), f(i.bw_all_median, 1), i.flush / MiB, roofline_rule.ROOF_PCT))
    add("")
    add(tg)
    add("")
  end
  local roof = roofline(res)
  if roof then
    add("## Roofline: memory or multiply-adds")
    add("")
    local rt2 = {}
    for _, k in ipairs(RATES) do rt2[#rt2 + 1] = rate_text(i, k) end
    add(("Peak rates measured in this run (12 independent chains per thread): %s. Every K element feeds G = Hq/Hkv·q_len score multiply-adds and every V element G P·V multiply-adds, so one (K, V) element pair takes at least G/r_scores + G/r_pv and the kernels cannot read the cache faster than the compute ceiling 2·element_bytes / (G/r_scores + G/r_pv) (int8 and fp8 KV in their real byte). r_scores is the bf16 dot rate when the kernel's ISA record has the bf16 group and q and K are bf16, the int8 dot rate over the plane count for a key with MSD planes (int8 K), the int16 madd rate (a `vpmaddwd` and the `vpaddd` that adds it up: 16 multiply-adds) for an AVX2 key with MSD planes (one int16 plane of q), else the f32 FMA rate (\"scores by\"); r_pv is the f32 FMA rate unless the kernel's key says otherwise (\"P·V by\"). A kernel of an ISA with fewer f32 lanes than the probe (%d) is credited the rate times its lanes over the probe's (portable C under tcc: one lane; under cc gcc vectorizes it: the probe's width); vanilla is counted at the probe's width. Above 100%% of the roof means a rate was measured low (load from elsewhere during the probes) or the kernel does fewer multiply-adds than counted. The roof is min(ceiling, best read bandwidth of the run) at the run's thread count (1-thread plans: the 1-thread rates and bandwidth); \"bound\" names what sets it. On a shared machine the read bandwidth can move between levels during a run (see the samples below): each kernel is compared with the best sample, with the median one and (%% call bw, %% call roof) with the sample taken just before each of its calls.")
      :format(table.concat(rt2, "; "), i.rates and i.rates[i.threads] and i.rates[i.threads].lanes or 16))
    add("")
    add(roof)
    add("")
  end
  if i.peers then
    add("## Peers")
    add("")
    add(i.peers)
    add("")
  end
  add("## Read bandwidth")
  add("")
  add(md_table({ "when", "buffer", "from", "threads", "GB/s" }, bwrows))
  add("")
  add("## Variants")
  add("")
  local rows = {}
  for _, v in ipairs(res.variants) do
    rows[#rows + 1] = { v.name, v.backend, v.isa, v.vanilla and
      "unfused: scores = qK^T over the whole length into a buffer, softmax, PV; K and V read once per query head; OpenMP over (b, h)"
      or v.fast and "planner's choice with fd_config.precision = FD_PRECISION_FAST: bf16 softmax weights in P·V (vdpbf16ps) where the kernel serves it (bf16 V, isa 3), 2 MSD planes instead of 3 for int8 K, else the same kernel as tcc"
      or (v.opts and "ISA forced (chunk, tile and splits still from the tuned table when it has the shape)" or "planner's choice: tuned table, else heuristic") }
  end
  add(md_table({ "variant", "backend", "isa", "what" }, rows))
  add("")
  add("## Charts")
  add("")
  for _, c in ipairs(charts) do add(("![%s](%s)  \n[SVG](%s) · [PNG](%s)"):format(c.title, c.svg, c.svg, c.png)) add("") end
  add("## Time against kv_len (slope = marginal bandwidth)")
  add("")
  add(slope_table(res))
  add("")
  add("## Time against threads (cold cache)")
  add("")
  add(thread_table(res))
  add("")
  add("## Results by shape")
  for _, sh in ipairs(res.shapes) do
    add("")
    add(("### %s"):format(sh.shape.name))
    add("")
    add(describe(sh.shape) .. (sh.cap and (", capacity %s, cur_pos = kv_len - 1 for every row"):format(klen(sh.cap)) or ""))
    add("")
    add(plan_table(sh))
    add("")
    add(result_table(sh, i.bw_all))
  end
  add("")
  add("## Method")
  add("")
  add(([[- One process, one machine: the bandwidth, every flashdecode variant and the vanilla baseline are measured in the same run.
- Bandwidth: a vectorized sum (%s) over a %d MiB buffer split between threads (OpenMP, not pinned), best of %d repetitions at the start and the end of the run and 3 after each shape (the best of all is the reference); the same over an LLC-resident buffer.
- KV bytes = B·Hkv·n_valid·D·2·sizeof(kv), the valid part of K and V read once (q8_0 and q4_0: their real block bytes, 34 and 18 per 32 values; int8: D codes and a 4-byte scale per row); GB/s = KV bytes / median time; %% bw = that over the all-threads read bandwidth (above 100%% means the data came from cache).
- Cold: all threads read one word of each line of a %d MiB buffer (4× the LLC) before each repetition (clean lines, as the tuner's flush leaves them; FDB_FLUSH=write dirties them instead), after one read pass of all threads over a buffer of the same size timed as the bandwidth sample of that call (%% call bw); warm: no flush, after one untimed call. Repetitions of all variants of a point are interleaved round-robin (all read the same K and V), so load from other processes hits every variant alike.
- Each fd_run uses a plan created once per shape (capacity = the longest length; plan and first-run times listed separately). Repetitions: adaptive, %d to %d, about %.2f s of timing per point and cache state; median and min–max/IQR reported.
- Vanilla: plain C, gcc -O3 -march=native -fopenmp, f32 accumulation, dtypes converted in C; its output is the reference for "max abs diff".
- Threads are not pinned; OMP_WAIT_POLICY=passive so idle OpenMP threads do not compete with flashdecode's pool. The benchmark never asserts a time.]])
    :format(i.bw_kernel, i.cfg.bw_bytes / MiB, i.cfg.bw_reps, i.flush / MiB, i.cfg.rmin, i.cfg.rmax, i.cfg.target_s))
  return table.concat(L, "\n") .. "\n"
end

-- Write a file, creating its folder.
local function write(path, text)
  os.execute(("mkdir -p '%s'"):format(path:match("^(.*)/[^/]*$")))
  local fh = assert(io.open(path, "wb"))
  fh:write(text)
  fh:close()
  return path
end
M.write_file = write

-- The peers section: the summary of `make bench-peers`' report for this machine
-- (results/peers/<slug>.md beside the bench report's folder), or nil when there is none.
local function peers_section(out, slug)
  local fh = io.open(("%s/../peers/%s.md"):format(out, slug), "rb")
  if not fh then return nil end
  local text = fh:read("*a")
  fh:close()
  local made = text:match("\n\n(`make bench%-peers`[^\n]-UTC)")
  local summary = text:match("## Summary\n\n(.-)\n\n## ")
  if not summary then return nil end
  return ("From [../peers/%s.md](../peers/%s.md) (%s, a separate run), flashdecode against ggml's `flash_attn_ext` on the same buffers, interleaved:\n\n%s")
    :format(slug, slug, made or "see the report for its commit", summary)
end

-- Write the TSV and the Markdown report; returns their paths.
function M.write(res, cfg, charts)
  res.info.peers = peers_section(cfg.out, res.info.machine.slug)
  M.annotate(res)
  local base = cfg.out .. "/" .. res.info.name
  return { write(base .. ".tsv", M.tsv(res)), write(base .. ".md", M.md(res, charts or {})) }
end

return M
