-- The inputs of one shape for timing: buffers sized for its longest length,
-- filled with a constant pattern (timing only; correctness is the tests'),
-- and the fd_shape / fd_args of a measured length.
local ffi = require("ffi")
local fd = require("flashdecode")
local space = require("space")
local facts = require("facts")
local sys = require("tuner.sys")

local M = {}
M.__index = M

-- A zeroed buffer of at least bytes (64-byte aligned), kept in w.ptrs.
local function get(w, bytes)
  bytes = math.ceil(math.max(bytes, 64) / 64) * 64
  local p = ffi.C.aligned_alloc(64, bytes)
  if p == nil then error(("tune: out of memory allocating %.0f MiB"):format(bytes / 2 ^ 20), 0) end
  ffi.fill(p, bytes, 0)
  w.ptrs[#w.ptrs + 1] = p
  return p
end

-- The features the workload runs: ALiBi slopes and sink logits it fills,
-- shared_kv needs no input of its own; the others (new_kv, k_per_channel,
-- beams) need inputs it does not make.
local FILLED = { alibi = true, sink_logits = true, shared_kv = true }

-- The name of the first feature set in bits that the workload cannot run, or nil.
local function unfilled(bits)
  for _, f in ipairs(facts.features) do
    if math.floor(bits / f.bit) % 2 == 1 and not FILLED[f.name] then return f.name end
  end
end

-- Has numeric shape n feature name set?
local function has(n, name)
  for _, f in ipairs(facts.features) do
    if f.name == name then return math.floor((n.features or 0) / f.bit) % 2 == 1 end
  end
  return false
end

-- The ALiBi slopes of n heads (Press et al.: for a power of two n, 2^(-8 i / n),
-- i = 1..n; else those of the power of two below, then every other one of the
-- next power of two's).
function M.alibi_slopes(n)
  local p = 1
  while p * 2 <= n do p = p * 2 end
  local out = {}
  for i = 1, p do out[#out + 1] = 2 ^ (-8 * i / p) end
  for i = 1, 2 * (n - p), 2 do out[#out + 1] = 2 ^ (-4 * i / p) end
  return out
end

-- The keys a row of valid length len visits, whose bucket fd_run takes: with
-- a window its main range (the window and the q_len - 1 keys of the later
-- tokens; sinks not counted), as templates/items.h.tpl fd_window_of and
-- runtime/exec.c measure_rows count them (fd_plan_info_get too).
function M.visited_keys(n, len)
  local w, q = n.window or 0, math.max(1, n.q_len or 0)
  if w <= 0 then return len end
  local first = math.max(0, len - q - w + 1)
  if (n.sink_tokens or 0) >= first then first = 0 end
  return math.max(1, len - first)
end

-- The tuned-table bucket of shape-set entry s at length len: that of the keys it visits.
function M.bucket(s, len) return sys.bucket(M.visited_keys(space.numeric(s), len)) end

-- KV bytes one run of numeric shape n at length len reads: K and V rows of
-- every (batch, kv head) over the keys it visits (a window's sinks too), in
-- real bytes (q8_0 / q4_0: their blocks).
function M.bytes(n, len)
  local keys = M.visited_keys(n, len)
  if (n.window or 0) > 0 and keys < len then keys = keys + math.min(n.sink_tokens or 0, len - keys) end
  return 2 * n.batch * n.n_kv_heads * keys * facts.kv_bytes(n.kv_dtype, n.head_dim)
end

-- Buffers for shape set entry s at valid lengths up to cap.
function M.new(s, cap)
  local n = space.numeric(s)
  local missing = unfilled(n.features)
  if missing then error(("tune: shape %s: feature %s needs inputs the tuner does not make"):format(s.name, missing), 0) end
  local w = setmetatable({ s = s, n = n, cap = cap, ptrs = {} }, M)
  local ds = fd.DTYPE_SIZE
  local nq = n.batch * math.max(1, n.q_len or 0) * n.n_q_heads * n.head_dim
  local rows = n.batch * n.n_kv_heads * cap
  if facts.layouts[n.layout].paged then rows = w:paged_pool() end
  local kvb = rows * facts.kv_bytes(n.kv_dtype, n.head_dim)   -- real bytes (q8_0 / q4_0: blocks)
  w.q, w.out = get(w, nq * ds[n.q_dtype]), get(w, nq * 4)
  w.k, w.v = get(w, kvb), get(w, kvb)
  -- 0x3c bytes: f16 1.06, bf16 0.011, and finite q8_0 / q4_0 block scales (f16 0x3c3c)
  ffi.fill(w.q, nq * ds[n.q_dtype], 0x3c)
  ffi.fill(w.k, kvb, 0x3c)
  ffi.fill(w.v, kvb, 0x3c)
  w.cur_pos = ffi.cast("int32_t *", get(w, 4 * n.batch))
  local heads = n.batch * math.max(1, n.q_len or 0) * n.n_q_heads   -- query rows of every token
  if s.lse then w.lse = ffi.cast("float *", get(w, 4 * heads)) end
  if n.mask_mode == 1 then w.mask = ffi.cast("float *", get(w, 4 * heads * cap)) end
  if facts.dtypes[n.kv_dtype].quant then   -- per-row scales (int8, fp8; block dtypes keep theirs)
    w.k_scale, w.v_scale = ffi.cast("float *", get(w, 4 * rows)), ffi.cast("float *", get(w, 4 * rows))
    for i = 0, rows - 1 do w.k_scale[i], w.v_scale[i] = 0.01, 0.01 end
  end
  if has(n, "alibi") then
    w.alibi = ffi.cast("float *", get(w, 4 * n.n_q_heads))
    for i, x in ipairs(M.alibi_slopes(n.n_q_heads)) do w.alibi[i - 1] = x end
  end
  if has(n, "sink_logits") then w.sink_logits = ffi.cast("float *", get(w, 4 * n.n_q_heads)) end   -- logits 0
  return w
end

-- The paged layout's pool for lengths up to cap: ceil(cap / page_size) pages
-- per batch row, scattered over the pool (page i of the batch's sequence
-- order sits at pool page i * step mod pool_pages, step coprime to it, so no
-- two neighbours are adjacent as in a long-running engine); its K/V rows.
function M:paged_pool()
  local n = self.n
  self.per_row = math.ceil(self.cap / n.page_size)
  self.pool_pages = n.batch * self.per_row
  local step = 7919
  while self.pool_pages % step == 0 do step = step + 2 end
  self.pages = {}
  for i = 0, self.pool_pages - 1 do self.pages[i] = i * step % self.pool_pages end
  self.table = ffi.cast("int32_t *", get(self, 4 * self.pool_pages))
  return self.pool_pages * n.n_kv_heads * n.page_size
end

-- The fd_shape measured at length len (the cache capacity is len).
function M:shape(len)
  local t = {}
  for k, v in pairs(self.n) do t[k] = v end
  t.kv_len = len
  t.pool_pages = self.pool_pages
  return fd.shape(t)
end

-- fd_args for length len: every batch row holds len valid keys (paged: the
-- block table of rows of ceil(len / page_size) pages, from the pool's order).
function M:args(len)
  for b = 0, self.n.batch - 1 do self.cur_pos[b] = len - 1 end
  if self.table then
    local per = math.ceil(len / self.n.page_size)
    for b = 0, self.n.batch - 1 do
      for i = 0, per - 1 do self.table[b * per + i] = self.pages[b * self.per_row + i] end
    end
  end
  return fd.args { q = self.q, k = self.k, v = self.v, cur_pos = self.cur_pos, mask = self.mask,
                   k_scale = self.k_scale, v_scale = self.v_scale, out = self.out, lse = self.lse,
                   block_table = self.table, alibi_slopes = self.alibi, sink_logits = self.sink_logits }
end

-- KV bytes one run at length len reads (M.bytes).
function M:kv_bytes(len) return M.bytes(self.n, len) end

-- The keys a row of length len visits (M.visited_keys).
function M:keys(len) return M.visited_keys(self.n, len) end

-- Free the buffers.
function M:free()
  for _, p in ipairs(self.ptrs) do ffi.C.free(p) end
  self.ptrs = {}
end

-- The shape-set entry of tuned-table row r (tuner/tuned.lua): its name's in
-- shapes (name -> entry) when the signature agrees, else one rebuilt from
-- the fields of the row's shape signature (gen/facts.lua).
function M.row_shape(r, shapes)
  local s = shapes[r.name]
  if s then
    local n = space.numeric(s)
    n.kv_len = 1
    if sys.signature(fd.shape(n)) == r.shape then return s end
  end
  s = { name = r.name, kv_len = { r.bucket } }
  for _, f in ipairs(facts.signature_fields()) do s[f[1]] = r.s[f[1]] end
  return s
end

-- The length measured for a row of bucket: entry s's longest length whose
-- visited keys fall in the bucket (M.bucket), else the bucket.
function M.row_len(s, bucket)
  local best
  for _, n in ipairs(s.kv_len) do
    if M.bucket(s, n) == bucket and (not best or n > best) then best = n end
  end
  return best or bucket
end

return M
