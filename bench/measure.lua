-- Measurement for tuner/bench.lua: buffers, plans, cold/warm timing, thread
-- scaling, statistics and the progress bar.
local ffi = require("ffi")
local fd = require("flashdecode")
local fdb = require("bench.lib")
local facts = require("facts")
pcall(ffi.cdef, "int isatty(int fd);")

local M = {}
local now = fdb.fdb_now

-- Quantile p of a sorted list (linear interpolation).
local function quantile(t, p)
  local x = 1 + (#t - 1) * p
  local i = math.floor(x)
  local j = math.min(i + 1, #t)
  return t[i] + (t[j] - t[i]) * (x - i)
end

-- Median, quartiles, min and max of a list of seconds, in milliseconds.
function M.stats(ts)
  local t = {}
  for i, x in ipairs(ts) do t[i] = x * 1e3 end
  table.sort(t)
  return { median = quantile(t, 0.5), q1 = quantile(t, 0.25), q3 = quantile(t, 0.75),
           min = t[1], max = t[#t], n = #t }
end

-- A progress bar on stderr when it is a terminal; silent otherwise.
function M.progress(total)
  local tty = ffi.C.isatty(2) == 1
  local p = { n = 0, total = math.max(total, 1), t0 = now() }
  function p:step(label)
    self.n = self.n + 1
    if not tty then return end
    local f = math.min(self.n / self.total, 1)
    local w = 30
    local el = now() - self.t0
    local eta = self.n > 1 and el / (self.n - 1) * (self.total - self.n + 1) or 0
    io.stderr:write(("\r\27[K[%s%s] %3d%% %4.0fs left  %s"):format(("#"):rep(math.floor(f * w)),
      ("."):rep(w - math.floor(f * w)), math.floor(f * 100), eta, label:sub(1, 60)))
  end
  function p:done() if tty then io.stderr:write("\r\27[K") end end
  return p
end

-- Repetitions for a run whose first call took first_s seconds.
local function reps_for(first_s, cfg)
  local r = math.ceil(cfg.target_s / math.max(first_s, 1e-6))
  local rmin = first_s > 0.5 and 3 or cfg.rmin          -- bound the slowest points
  return math.max(rmin, math.min(cfg.rmax, r))
end

-- Time the rows' runners interleaved, round-robin (so load from elsewhere hits
-- every variant alike): cold (caches flushed before each call), then warm (one
-- untimed call each, then back to back; all variants read the same K and V).
-- With bw_threads, each cold call is preceded by a read-bandwidth sample of
-- that many threads (fdb_call_bw_gbs), kept in row.call_bw beside the call's
-- seconds in row.call_s: the bandwidth the machine had at that moment.
-- Sets row.cold, row.warm (stats in ms) and row.reps; a failure sets row.status.
function M.time_interleaved(rows, cfg, cold_only, bw_threads)
  local live, maxr = {}, 0
  for _, r in ipairs(rows) do
    if r.fn then
      r.reps, r.t_cold, r.t_warm = reps_for(r.first_s, cfg), {}, {}
      if bw_threads then r.call_bw, r.call_s = {}, {} end
      live[#live + 1], maxr = r, math.max(maxr, reps_for(r.first_s, cfg))
    end
  end
  local function call(r, list, flush)
    if r.status ~= "ok" then return end
    local bw = flush and bw_threads and fdb.fdb_call_bw_gbs(bw_threads)
    if flush and fdb.fdb_flush_caches() ~= 0 then error("bench: out of memory for the cache flush buffer", 0) end
    local t0 = now()
    local ok, err = pcall(r.fn)
    if not ok then r.status = tostring(err) return end
    list[#list + 1] = now() - t0
    if bw and bw > 0 then r.call_bw[#r.call_bw + 1], r.call_s[#r.call_s + 1] = bw, list[#list] end
  end
  for i = 1, maxr do
    for _, r in ipairs(live) do if i <= r.reps then call(r, r.t_cold, true) end end
  end
  if not cold_only then
    for _, r in ipairs(live) do call(r, {}, false) end
    for i = 1, maxr do
      for _, r in ipairs(live) do if i <= r.reps then call(r, r.t_warm, false) end end
    end
  end
  for _, r in ipairs(live) do
    if r.status == "ok" then
      r.cold = M.stats(r.t_cold)
      r.warm = not cold_only and M.stats(r.t_warm) or nil
    end
    r.fn, r.t_cold, r.t_warm = nil, nil, nil
  end
end

-- Element counts and byte sizes of a shape's buffers at capacity cap.
local function sizes(s, cap)
  local ds = fd.DTYPE_SIZE
  local rows = s.batch * math.max(1, s.q_len or 0) * s.n_q_heads   -- query rows of every token
  local sz = { nq = rows * s.head_dim, nkv = s.batch * s.n_kv_heads * cap * s.head_dim, nmask = rows * cap }
  sz.q = sz.nq * ds[fd.enum("dtype", s.q_dtype)]
  sz.kv = sz.nkv * ds[fd.enum("dtype", s.kv_dtype)]
  sz.out = sz.nq * ds[fd.enum("dtype", s.out_dtype)]
  return sz
end

-- The int8 K and V of b (nkv codes each): random codes, and per-row scales
-- 0.01 in b.k_scale and b.v_scale from get(bytes) (an allocator).
local function fill_i8(b, nkv, head_dim, get)
  fdb.fdb_fill_i8(b.k, nkv, 2)
  fdb.fdb_fill_i8(b.v, nkv, 3)
  local rows = nkv / head_dim
  b.k_scale, b.v_scale = ffi.cast("float *", get(4 * rows)), ffi.cast("float *", get(4 * rows))
  for i = 0, rows - 1 do b.k_scale[i], b.v_scale[i] = 0.01, 0.01 end
end

-- K and V of b (nkv elements each, of shape s's kv dtype) filled with small
-- random values: q8_0 / q4_0 random blocks (gen/facts.lua sizes), int8 codes
-- with per-row scales from get(bytes) (an allocator), else values in [-1, 1].
function M.fill_kv(b, s, nkv, get)
  local kd = fd.enum("dtype", s.kv_dtype)
  local bn, bb = facts.dtype_block(kd)
  if bn > 1 then
    fdb.fdb_fill_blocks(b.k, nkv / bn, bb, 2)
    fdb.fdb_fill_blocks(b.v, nkv / bn, bb, 3)
  elseif s.kv_dtype == "i8" then
    fill_i8(b, nkv, s.head_dim, get)
  elseif facts.dtypes[kd].quant then
    error(("bench: kv_dtype %s is not filled by the benchmark (f32/f16/bf16, i8, q8_0, q4_0)"):format(s.kv_dtype), 0)
  else
    fdb.fdb_fill(b.k, nkv, kd, 2, -1, 1)
    fdb.fdb_fill(b.v, nkv, kd, 3, -1, 1)
  end
end

-- Buffers for shape s at capacity cap, filled with small random values.
local function alloc_buffers(s, cap)
  local sz, b = sizes(s, cap), { ptrs = {} }
  local function get(bytes)
    local p = fdb.fdb_alloc(math.max(bytes, 64))
    if p == nil then error(("bench: out of memory allocating %.0f MiB"):format(bytes / 2 ^ 20), 0) end
    b.ptrs[#b.ptrs + 1] = p
    return p
  end
  b.q, b.k, b.v = get(sz.q), get(sz.kv), get(sz.kv)
  b.out, b.out_ref = get(sz.out), get(sz.out)
  b.cur_pos = ffi.cast("int32_t *", get(4 * s.batch))
  fdb.fdb_fill(b.q, sz.nq, fd.enum("dtype", s.q_dtype), 1, -1, 1)
  M.fill_kv(b, s, sz.nkv, get)
  if s.mask_mode == "mask" then
    b.mask = ffi.cast("float *", get(4 * sz.nmask))
    fdb.fdb_fill(b.mask, sz.nmask, 0, 4, -1, 0)
  end
  b.scores = ffi.cast("float *", get(4 * sz.nmask))
  b.sz = sz
  return b
end

-- Free every buffer of alloc_buffers.
local function free_buffers(b)
  for _, p in ipairs(b.ptrs) do ffi.C.free(p) end
end

-- The fd_shape of s (a shape-set entry) with capacity cap.
function M.fd_shape(s, cap)
  local t = {}
  for k, v in pairs(s) do t[k] = v end
  t.kv_len = cap
  return fd.shape(t)
end

-- Plans of every fd variant for one shape (timed); failures kept as messages.
local function make_plans(vs, shape, extra_opts)
  local plans = {}
  for _, v in ipairs(vs) do
    if not v.vanilla then
      local opts = nil
      if v.opts or extra_opts then
        opts = {}
        for k, x in pairs(v.opts or {}) do opts[k] = x end
        for k, x in pairs(extra_opts or {}) do opts[k] = x end
      end
      local t0 = now()
      local ok, plan = pcall(fd.plan, v.ctx, shape, opts)
      plans[v.name] = ok and { plan = plan, ms = (now() - t0) * 1e3 } or { err = tostring(plan) }
    end
  end
  return plans
end

-- A runner (a function of no arguments) for variant v at the current buffers.
local function runner(v, plan, shape, b, threads)
  local out = v.vanilla and b.out_ref or b.out
  local args = fd.args { q = b.q, k = b.k, v = b.v, cur_pos = b.cur_pos, mask = b.mask, out = out,
                         k_scale = b.k_scale, v_scale = b.v_scale }
  if v.vanilla then
    return function()
      if fdb.fdb_vanilla(shape, args, threads, b.scores) ~= 0 then error("vanilla: unsupported shape", 0) end
    end
  end
  local lib = fd.load()
  return function()
    local rc = lib.fd_run(plan, args)
    if rc ~= 0 then error(("fd_run: %s (code %d)"):format(fd.errmsg(v.ctx), rc), 0) end
  end
end

-- KV bytes read once over the valid length n: B*Hkv*n*D*2*sizeof(kv), plus
-- the per-row scales of int8/fp8 K and V (4 bytes per row each).
function M.kv_bytes(s, n)
  local kd = fd.enum("dtype", s.kv_dtype)
  local row = s.head_dim * fd.DTYPE_SIZE[kd] + (facts.dtypes[kd].quant and 4 or 0)
  return s.batch * s.n_kv_heads * n * 2 * row
end

-- Variant v at valid length n: its runner and first call (timed), its plan
-- facts, and its output against vanilla's. Timing comes later (interleaved).
local function first_call(s, n, cap, v, pl, shape, b, info)
  local row = { shape = s.name, len = n, cap = cap, variant = v.name, backend = v.backend, isa = v.isa,
                bytes = M.kv_bytes(s, n), threads = info.threads }
  if pl and pl.err then row.status = pl.err return row end
  local ok, err = pcall(function()
    local fn = runner(v, pl and pl.plan, shape, b, info.threads)
    local t0 = now(); fn(); row.first_s = now() - t0
    row.first_ms = row.first_s * 1e3
    if pl then
      row.plan_ms = pl.ms
      local pi = fd.plan_info(pl.plan, n, v.ctx)
      for k, x in pairs(pi) do row[k] = x end
      row.pthreads, row.threads = pi.threads, pi.threads
      local odt = fd.enum("dtype", s.out_dtype)
      row.diff = fdb.fdb_max_abs_diff(b.out, odt, b.out_ref, odt, b.sz.nq)
    end
    row.fn = fn
  end)
  row.status = ok and "ok" or tostring(err)
  return row
end

-- The variants with vanilla first (its output is the reference of the others).
local function vanilla_first(vs)
  local out = {}
  for _, v in ipairs(vs) do if v.vanilla then out[#out + 1] = v end end
  for _, v in ipairs(vs) do if not v.vanilla then out[#out + 1] = v end end
  return out
end

-- Every length x variant of one shape; then its thread scaling when asked.
function M.bench_shape(s, lens, vs, info, cfg, progress)
  local causal = (s.mask_mode or "causal") == "causal"
  local cap = 0
  for _, n in ipairs(lens) do cap = math.max(cap, n) end
  local res = { shape = s, lens = lens, runs = {}, plans = {}, cap = causal and cap or nil }
  local b = alloc_buffers(s, cap)
  local shape, plans
  for _, n in ipairs(lens) do
    if not plans or not causal then
      shape = M.fd_shape(s, causal and cap or n)
      plans = make_plans(vs, shape)
      res.plans[#res.plans + 1] = { cap = causal and cap or n, plans = plans }
    end
    for i = 0, s.batch - 1 do b.cur_pos[i] = n - 1 end
    local ref, rows = nil, {}                         -- ref: this length's vanilla row
    for _, v in ipairs(vanilla_first(vs)) do
      progress:step(("%s %d %s"):format(s.name, n, v.name))
      local row = first_call(s, n, causal and cap or n, v, plans[v.name], shape, b, info)
      if v.vanilla then ref = row end
      rows[#rows + 1], res.runs[#res.runs + 1] = row, row
    end
    progress:step(("%s %d: timing %d variants"):format(s.name, n, #rows))
    M.time_interleaved(rows, cfg, false, info.threads)
    for _, row in ipairs(res.runs) do
      if row.len == n and ref and ref.cold and row.cold then
        row.speedup_cold = ref.cold.median / row.cold.median
        row.speedup_warm = ref.warm.median / row.warm.median
      end
    end
  end
  local at = s[cfg.quick and "quick_threads_at" or "threads_at"]
  if at then res.threads = M.thread_scaling(s, at, vs, info, cfg, progress) end
  free_buffers(b)
  collectgarbage()
  return res
end

-- Cold time of every variant at valid length n with 1..N threads (plans forced
-- to t threads, so the planner's table is not consulted for them).
function M.thread_scaling(s, n, vs, info, cfg, progress)
  local b = alloc_buffers(s, n)
  local shape = M.fd_shape(s, n)
  for i = 0, s.batch - 1 do b.cur_pos[i] = n - 1 end
  local out = {}
  for t = 1, info.threads do
    local plans = make_plans(vs, shape, { threads = t })
    local rows = {}
    for _, v in ipairs(vanilla_first(vs)) do
      progress:step(("%s %d %s %d thread(s)"):format(s.name, n, v.name, t))
      local row = first_call(s, n, n, v, plans[v.name], shape, b, { threads = t })
      row.threads = t
      rows[#rows + 1], out[#out + 1] = row, row
    end
    progress:step(("%s %d: timing %d thread(s)"):format(s.name, n, t))
    M.time_interleaved(rows, cfg, true)
  end
  free_buffers(b)
  return out
end

return M
