-- The generator: a tiling key -> the C source of one translation unit that
-- defines kernel fd_k<key> (and fd_k<key>_merge for split kernels) and the
-- descriptor fd_k<key>_desc. Only this module knows the templates.
local key = require("key")
local template = require("template")
local simd = require("simd")
local facts = require("facts")

local M = {}
M.ABI_VERSION = 12         -- bump when templates/abi.h.tpl changes (12: fd_work.next_k, next_v)
M.UNROLL_BUDGET = 1024     -- unrolled (head_dim x group tile) statements per loop body
M.MAX_CHUNK = facts.MAX_CHUNK
local DT = facts.dtypes
local F16_LOAD = "hu = %s; cv.u = ((hu & 0x7fffu) << 13) | ((((hu & 0x7c00u) + 0x400u) & 0x8000u) * 0xe000u);"
  .. " cv.f *= 5.192296858534828e+33f; cv.u |= (hu & 0x8000u) << 16; %s = cv.f;"

-- fp8 e4m3: exponent and mantissa moved into f32 place, rebiased by 2^120; 0x7f is NaN.
local FP8_LOAD = "hu = %s; cv.u = (hu & 0x7fu) << 20; cv.f *= 1.329227995784916e+36f; cv.u |= (hu & 0x80u) << 24;"
  .. " if ((hu & 0x7fu) == 0x7fu) cv.u |= 0x7fc00000u; %s = cv.f;"

-- C statement(s) that load element src of each storage dtype (by name) into
-- float dst (int8 and fp8 without their row scale, which the kernel applies
-- per row). fp8 e5m2 is the upper byte of an f16 and loads as that f16.
local LOADS = {
  f32 = function(dst, src) return ("%s = %s;"):format(dst, src) end,
  f16 = function(dst, src) return F16_LOAD:format(src, dst) end,
  bf16 = function(dst, src) return ("cv.u = (fd_u32)%s << 16; %s = cv.f;"):format(src, dst) end,
  i8 = function(dst, src) return ("%s = (float)%s;"):format(dst, src) end,
  fp8 = function(dst, src) return FP8_LOAD:format(src, dst) end,
  e5m2 = function(dst, src) return F16_LOAD:format(("(fd_u32)%s << 8"):format(src), dst) end,
}

-- C statements that load element idx of a row at base of a block dtype (ggml
-- q8_0 / q4_0, gen/facts.lua) into float dst: the block's f16 scale (through
-- hu and cv, as f16 loads) times its code. src is "base[idx]".
local function block_load(code)
  return function(dst, src, name)
    local base, idx = src:match("^(.-)%[(.*)%]$")
    local n, bytes = facts.dtype_block(assert(facts.value(DT, name)))
    local blk = ("((const unsigned char *)%s + ((%s) / %d) * %d)"):format(base, idx, n, bytes)
    return ("{ const unsigned char *bk = %s; int j = (int)((%s) %% %d); "):format(blk, idx, n)
      .. F16_LOAD:format("(fd_u32)bk[0] | (fd_u32)bk[1] << 8", dst) .. (" %s *= %s; }"):format(dst, code(n))
  end
end
-- The code of element j of a block of n at bk: q8_0 a signed byte, q4_0 the
-- low nibble of byte j (j < n / 2) or the high one of byte j - n / 2, less 8.
LOADS.q8_0 = block_load(function() return "(float)(signed char)bk[2 + j]" end)
LOADS.q4_0 = block_load(function(n)
  return ("(float)((j < %d ? bk[2 + j] & 15 : bk[2 + j - %d] >> 4) - 8)"):format(n / 2, n / 2)
end)

-- C statement(s) that load element src of storage dtype into float dst.
local function load(dtype, dst, src)
  return assert(LOADS[DT[dtype].name], "gen: no C load for dtype " .. DT[dtype].name)(dst, src, DT[dtype].name)
end

-- C statements of the exp (simd.EXP2_COEFS): p = e^x * 2^(bias - 127) for x <= 0 above
-- the caller's cutoff (-87 for bias 127, so that 2^n stays a normal float),
-- using locals eb (fd_bits), et, er (float), en (int) of the enclosing block.
-- Softmax weights take bias 127 - simd.P_SHIFT (see there): exact and free.
-- positive: for 0 <= x <= 40 instead (n rounded up from et + 0.5).
local function exp_body(x, p, ind, bias, positive)
  local horner = "er * " .. simd.EXP2_COEFS[#simd.EXP2_COEFS]
  for i = #simd.EXP2_COEFS - 1, 2, -1 do horner = ("er * (%s + %s)"):format(simd.EXP2_COEFS[i], horner) end
  horner = ("%s + %s"):format(simd.EXP2_COEFS[1], horner)
  local lines = {
    ("et = %s * %s;"):format(x, simd.LOG2E),
    positive and "en = (int)(et + 0.5f);" or "en = (int)(et - 0.5f);",
    "er = et - (float)en;",
    ("%s = %s;"):format(p, horner),
    ("eb.u = (fd_u32)(en + %d) << 23;"):format(bias or 127),
    ("%s = %s * eb.f;"):format(p, p),
  }
  return ind .. table.concat(lines, "\n" .. ind)
end

-- The largest divisor of n that is at most cap (at least 1).
local function divisor_at_most(n, cap)
  for d = math.min(n, cap), 1, -1 do if n % d == 0 then return d end end
  return 1
end

-- Refuse, with the field named, a decoded key this template cannot generate.
local function check_supported(f)
  local function no(field, why)
    error(("gen: key %s: field %s: %s"):format(f.key, field, why), 0)
  end
  if facts.layouts[f.layout].reserved then
    no("layout", ("%s is not supported by template 1 yet"):format(facts.layouts[f.layout].name))
  end
  local bn = facts.dtype_block(f.kv_dtype)
  if f.head_dim % bn ~= 0 then
    no("head_dim", ("%d is not a multiple of kv_dtype %s's %d-element blocks"):format(f.head_dim, DT[f.kv_dtype].text, bn))
  end
  if simd.vector(f.isa) then simd.check(f.isa, f.head_dim, f.group_tile, no) end
  if f.k_per_channel == 1 and not DT[f.kv_dtype].quant then
    no("k_per_channel", ("per-channel K scales need int8/fp8 K, not %s"):format(DT[f.kv_dtype].text))
  end
  if f.planes > 0 and not facts.planes_fit(f.planes, f.head_dim) then
    no("planes", ("%d planes of head_dim %d do not fit a head's q buffer (4 x head_dim bytes)"):format(f.planes,
      f.head_dim))
  end
  if f.chunk > M.MAX_CHUNK then no("chunk", ("%d exceeds %d"):format(f.chunk, M.MAX_CHUNK)) end
  if key.has_flag(f.flags, facts.FLAG_SPLIT) and key.has_flag(f.flags, facts.FLAG_LSE) then
    no("flags", ("split kernels leave lse to the merge: use flag %d or %d, not %d"):format(facts.FLAG_SPLIT,
      facts.FLAG_LSE, facts.FLAG_SPLIT + facts.FLAG_LSE))
  end
end

-- The parameters of SIMD kernels: geometry, constants and the asm blocks.
local function add_simd(p)
  local caps = facts.isas[p.ISA]
  p.W = caps.W
  p.ISA_NAME = caps.short
  -- one vector of slack: the direct scores kernel writes whole groups of rows
  p.SCW = math.ceil(p.CHUNK / p.W) * p.W + p.W
  p.CHUNKP = p.SCW
  p.KV_SIZE = DT[p.KV_DTYPE].size
  p.CONST_ROWS = simd.const_rows()
  -- byte offset of the storage block holding element e of a K/V row
  p.kv_off = function(e)
    local n, bytes = facts.dtype_block(p.KV_DTYPE)
    return math.floor(e / n) * bytes
  end
  p.ASM_ARGS, p.asm_arg_line = facts.ASM_ARGS, facts.asm_arg_line
  p.xmm_list = function(a, b)
    local t = {}
    for i = a, b do t[#t + 1] = ('"xmm%d"'):format(i) end
    return table.concat(t, ", ")
  end
  p.HL = simd.head_lanes(p.ISA, p)
  p.Q_SPLIT = simd.bf16_split(p.ISA, p)
  p.QLOAD_SPLIT = simd.qload_split(p.ISA, p)
  p.SPLIT_PAIR = p.Q_SPLIT and simd.split_pair(p.ISA) or 0
  p.DPBF16 = simd.dpbf16(p.ISA, p)
  p.PV_BLOCKS = simd.pv_blocks(p.ISA, p)
  p.simd_scores = function() return simd.scores(p.ISA, p) end
  -- paged kernels: the scores of a piece's last AHEAD_ROWS rows without the lookahead
  p.AHEAD_ROWS = simd.ahead_rows(p.ISA, p)
  p.simd_scores_tail = function()
    local q = setmetatable({ NO_AHEAD = true }, { __index = p })
    return simd.scores(p.ISA, q)
  end
  p.simd_max = function() return simd.max(p.ISA, p) end
  p.simd_exp = function() return simd.exp(p.ISA, p) end
  p.simd_grow_lanes = function() return simd.grow_lanes(p.ISA, p) end
  p.simd_sums_lanes = function() return simd.sums_lanes(p.ISA, p) end
  -- P.V: keys per block of a dense chunk (0: whole passes), head t's weight row
  p.PV_KB = simd.pv_key_block(p.ISA, p)
  p.weight_row = function(t) return simd.weight_row(p.ISA, p, t) end
  -- fast precision (key digit precision): bf16 weights in place, then P.V by key pairs
  p.simd_pv = function(blk) return (p.PRECISION == 1 and simd.pv_dpbf16 or simd.pv)(p.ISA, p, blk) end
  p.simd_pround = function() return simd.pround(p.ISA, p) end
  -- the f32 P.V over int8/fp8 V: the weights times the v scales first (gen/simd.lua pv_prescale)
  p.PV_PRESCALE = simd.pv_prescale(p.ISA, p)
  p.PV_NEXT_V = simd.pv_next_v(p.ISA, p)
  p.simd_pscale = function() return simd.pscale(p.ISA, p) end
  -- the P.V over ggml block V: the weights times each block's scales first, one
  -- row per head and block (gen/simd.lua pv_bscale); a pass over heads from t reads them there
  p.PV_BSCALE = simd.pv_bscale(p.ISA, p)
  p.simd_bscale = function() return simd.bscale(p.ISA, p) end
  p.pv_row = function(t) return p.PV_BSCALE and simd.bscale_row_of(p.ISA, p, t, 0) or simd.weight_row(p.ISA, p, t) end
  p.simd_qload = function() return simd.qload(p.ISA, p) end
  p.simd_store_out = function() return simd.store_out(p.ISA, p) end
  p.simd_merge_first = function() return simd.merge_first(p.ISA, p) end
  p.simd_merge_add = function() return simd.merge_add(p.ISA, p) end
  p.simd_scale_records = function() return simd.scale_records(p.ISA, p) end
  p.simd_init_records = function() return simd.init_records(p.ISA, p) end
  p.Q_COLUMNS = simd.q_columns_simd(p.ISA, p)
  p.simd_q_columns = function() return simd.q_columns(p.ISA, p) end
  p.simd_q_planes = function() return simd.q_planes(p.ISA, p) end
  p.simd_softcap = function() return simd.softcap(p.ISA, p) end
  p.simd_alibi = function() return simd.alibi(p.ISA, p) end
end

-- Beams (the key's beams digit): key idx of the row is read from batch row
-- bsrc[idx]'s cache. Dense: that row's K/V (and scales) start beam_stride
-- (beam_scale_stride) elements after batch row 0's; paged: its block table
-- starts beam_stride entries after row 0's (templates/abi.h.tpl). Replaces
-- p.row and p.srow, and adds p.beam_piece for the SIMD piece loops.
local function add_beams(p)
  local row, srow = p.row, p.srow
  local function table_of(idx) return ("(pages + (fd_i64)bsrc[%s] * w->beam_stride)"):format(idx) end
  p.row = function(base, idx)
    if not p.PAGED then return ("%s + (fd_i64)bsrc[%s] * w->beam_stride + (%s) * kvs"):format(base, idx, idx) end
    return (row(base, idx):gsub("pages%[", table_of(idx) .. "[", 1))
  end
  p.srow = function(arr, idx)
    if not p.PAGED then
      return ("%s[(fd_i64)bsrc[%s] * w->beam_scale_stride + (%s) * w->scale_stride]"):format(arr, idx, idx)
    end
    return (srow(arr, idx):gsub("pages%[", table_of(idx) .. "[", 1))
  end
  -- C lines of one piece at key c + po: pm keys from one source row (and
  -- page), their first K/V rows kp, vp and (int8/fp8) scales ksp, vsp.
  p.beam_piece = function(ind)
    local l = { "const fd_i64 key = c + po, r = bsrc[key];", "fd_i64 lim = n - po;" }
    if p.PAGED then
      l[#l + 1] = "const fd_i64 slot = key & pmask, pg = (fd_i64)(pages + r * w->beam_stride)[key >> w->page_shift];"
      l[#l + 1] = "const fd_i64 off = pg * w->page_stride + slot * kvs;"
      l[#l + 1] = "if (lim > pmask + 1 - slot) lim = pmask + 1 - slot;"
    else
      l[#l + 1] = "const fd_i64 off = r * w->beam_stride + key * kvs;"
    end
    l[#l + 1] = ("const %s *kp = kbase + off, *vp = vbase + off;"):format(p.KVT)
    if p.QUANT then
      local so = p.PAGED and "pg * w->scale_page_stride + slot" or "r * w->beam_scale_stride + key * w->scale_stride"
      if p.K_PER_CHANNEL ~= 1 then l[#l + 1] = ("const float *ksp = w->k_scale + %s;"):format(so) end
      l[#l + 1] = ("const float *vsp = w->v_scale + %s;"):format(so)
      l[#l + 1] = p.K_PER_CHANNEL ~= 1 and "(void)ksp; (void)vsp;" or "(void)vsp;"
    end
    l[#l + 1] = "for (pm = 1; pm < lim && bsrc[key + pm] == r; pm++) {}"
    l[#l + 1] = "(void)kp; (void)vp;"
    return ind .. table.concat(l, "\n" .. ind)
  end
  -- C lines (per-channel K) that fold source row r's channel scales (row 0's
  -- at w->k_scale, row r's beam_kch_stride floats later) into the tile's q
  -- (heads tp .. tp + T - 1) unless they hold them already.
  p.kch_fold = function(ind, r)
    local l = {
      ("if ((fd_i64)(%s) != qrow) {"):format(r),
      ("  const float *ks = w->k_scale + (fd_i64)(%s) * w->beam_kch_stride;"):format(r),
      ("  for (h = tp; h < tp + %d; h++)"):format(p.T),
      ("    for (d = 0; d < %d; d++) qbuf[h * %d + d] = qraw[h * %d + d] * ks[d];"):format(p.D, p.D, p.D),
      ("  qrow = %s;"):format(r),
      "}",
    }
    return ind .. table.concat(l, "\n" .. ind)
  end
end

-- The template parameters of a key: sizes, types and code-emitting helpers.
function M.params(k)
  local f = key.decode(k)
  check_supported(f)
  local D, T = f.head_dim, f.group_tile
  local A = T >= 4 and 1 or math.ceil(4 / T)        -- independent accumulators per head
  local DB = D * T <= M.UNROLL_BUDGET and D or divisor_at_most(D, math.max(1, math.floor(M.UNROLL_BUDGET / T)))
  local p = {
    KEY = f.key, DESC = key.describe(f.key), TEMPLATE = f.template, ABI_VERSION = M.ABI_VERSION,
    D = D, T = T, CHUNK = f.chunk, SCW = f.chunk, DB = DB, A = A, REC = math.ceil((D + 2) / 16) * 16,
    ISA = f.isa, FLAGS = f.flags, MASK_MODE = f.mask_mode, LAYOUT = f.layout,
    Q_DTYPE = f.q_dtype, KV_DTYPE = f.kv_dtype, OUT_DTYPE = f.out_dtype,
    QT = DT[f.q_dtype].storage, KVT = DT[f.kv_dtype].storage, OUTT = DT[f.out_dtype].storage,
    OUT_NAME = DT[f.out_dtype].name,
    MASK = f.mask_mode == 1, SPLIT = key.has_flag(f.flags, facts.FLAG_SPLIT), LSE = key.has_flag(f.flags, facts.FLAG_LSE),
    PAGED = facts.layouts[f.layout].paged or false,
    STRIDE = facts.layouts[f.layout].name == "bshd" and "w->kv_stride"
      or tostring(DT[f.kv_dtype].block and facts.kv_bytes(f.kv_dtype, D) or D),
    -- the bit-cast temporaries serve q conversion, and K/V loads of portable kernels
    NEED_BITS = not simd.vector(f.isa) and (DT[f.q_dtype].bits or DT[f.kv_dtype].bits) or false,
    NEED_HU = not simd.vector(f.isa) and (DT[f.q_dtype].hu or DT[f.kv_dtype].hu) or false,
    QUANT = DT[f.kv_dtype].quant or false,
    -- a block dtype (q8_0, q4_0): rows of blocks in bytes, each block's own f16 scale
    BLOCKS = DT[f.kv_dtype].block ~= nil,
    load = load, exp_body = exp_body,
    -- softmax weights: e^(s - m) * 2^-P_SHIFT, zero below P_MIN_X (see gen/simd.lua)
    P_SHIFT = simd.P_SHIFT, P_MIN_X = simd.P_MIN_X, P_BIAS = 127 - simd.P_SHIFT,
  }
  -- every key field as its upper-case name too (a new field reaches the
  -- templates without a line here), and all of them for the descriptor
  for _, kf in ipairs(facts.KEY_FIELDS) do
    local name = kf.name:upper()
    if p[name] == nil then p[name] = f[kf.name] end
  end
  p.KEY_FIELDS, p.FIELDS = facts.KEY_FIELDS, f
  if simd.vector(f.isa) then add_simd(p) end
  -- C expressions of K/V row idx from base (kbase or vbase) and of its scale in
  -- arr (w->k_scale or w->v_scale): dense rows are kvs apart; a paged row sits
  -- in page pages[idx >> page_shift] at slot idx & pmask (templates/abi.h.tpl).
  p.row = function(base, idx)
    if not p.PAGED then return ("%s + (%s) * kvs"):format(base, idx) end
    return ("%s + (fd_i64)pages[(%s) >> w->page_shift] * w->page_stride + ((%s) & pmask) * kvs"):format(base, idx, idx)
  end
  p.srow = function(arr, idx)
    if not p.PAGED then return ("%s[(%s) * w->scale_stride]"):format(arr, idx) end
    return ("%s[(fd_i64)pages[(%s) >> w->page_shift] * w->scale_page_stride + ((%s) & pmask)]"):format(arr, idx, idx)
  end
  -- What a dense P.V pass prefetches (pv_piece.c.tpl's PF, PF_V): the next
  -- chunk's rows from base, or, in the item's last chunk, the first rows of
  -- the item its thread runs next (nxt: w->next_k or w->next_v) where it has one.
  -- (off: from that row on, a P.V key block's, pv_key_block)
  p.next_rows = function(base, nxt, off)
    local at = off and ("(const void *)((const %s *)%s + %s * kvs)"):format(p.KVT, nxt, off) or nxt
    return ("c + %d < end || !%s ? (const void *)(%s + (c + %d%s) * kvs) : %s")
      :format(p.CHUNK, nxt, base, p.CHUNK, off and (" + " .. off) or "", at)
  end
  if f.beams == 1 then add_beams(p) end
  -- Index expression of element j of the current head_dim block.
  p.dix = function(j) return DB < D and ("d + " .. j) or tostring(j) end
  p.acc_list = function(t)
    local a = {}
    for i = 0, A - 1 do a[#a + 1] = ("s%d_%d = 0.0f"):format(t, i) end
    return table.concat(a, ", ")
  end
  p.acc_sum = function(t)
    local a = {}
    for i = 0, A - 1 do a[#a + 1] = ("s%d_%d"):format(t, i) end
    return table.concat(a, " + ")
  end
  p.dot_terms = function(j)
    local a = {}
    for t = 0, T - 1 do a[#a + 1] = ("s%d_%d += q%d[%s] * x;"):format(t, j % A, t, p.dix(j)) end
    return table.concat(a, " ")
  end
  -- Loop form (optimizing compilers): 16 lane sums per head, L<t>[16].
  p.lane_decls = function()
    local a = {}
    for t = 0, T - 1 do a[#a + 1] = ("L%d[16] = { 0 }"):format(t) end
    return table.concat(a, ", ")
  end
  p.lane_terms = function(lane, ix)
    local a = {}
    for t = 0, T - 1 do a[#a + 1] = ("L%d[%s] += q%d[%s] * x;"):format(t, lane, t, ix) end
    return table.concat(a, " ")
  end
  p.lane_reduce = function(ind)
    local a = {}
    for t = 0, T - 1 do
      a[#a + 1] = ("%sfor (u = 0; u < 8; u++) L%d[u] += L%d[u + 8];"):format(ind, t, t)
      a[#a + 1] = ("%sfor (u = 0; u < 4; u++) L%d[u] += L%d[u + 4];"):format(ind, t, t)
      a[#a + 1] = ("%ss%d_0 = (L%d[0] + L%d[2]) + (L%d[1] + L%d[3]);"):format(ind, t, t, t, t, t)
    end
    return table.concat(a, "\n")
  end
  p.pv_terms_loop = function()
    local a = {}
    for t = 0, T - 1 do a[#a + 1] = ("st%d[d] += p%d * x;"):format(t, t) end
    return table.concat(a, " ")
  end
  p.p_decls = function()
    local a, vs = {}, ""
    if DT[f.kv_dtype].quant then a[1] = ", vsc = " .. p.srow("w->v_scale", "c + i"); vs = " * vsc" end
    for t = 0, T - 1 do a[#a + 1] = (", p%d = sc[%d + i]%s"):format(t, t * f.chunk, vs) end
    return table.concat(a)
  end
  p.pv_terms = function(j)
    local a = {}
    for t = 0, T - 1 do a[#a + 1] = ("st%d[%s] += p%d * x;"):format(t, p.dix(j), t) end
    return table.concat(a, " ")
  end
  return p
end

-- Read a template from the templates/ directory next to gen/.
local function default_reader(dir)
  return function(name)
    local fh, err = io.open(dir .. "/" .. name, "rb")
    if not fh then return nil, err end
    local s = fh:read("*a"); fh:close()
    return s
  end
end

-- A generator over templates read by opts.read (default: opts.dir or "templates");
-- opts.line_directives = false leaves out #line, opts.annotate = false the
-- instructions' Intel text beside their bytes (the JIT's sources: less to parse).
function M.new(opts)
  opts = opts or {}
  local eng = template.new { read = opts.read or default_reader(opts.dir or "templates"),
                             line_directives = opts.line_directives }
  local g = {}
  -- The C source of the translation unit for key k.
  function g.source(k)
    local p = M.params(k)
    p.ANNOTATE = opts.annotate ~= false
    return eng:render("unit.c.tpl", p, "templates/")
  end
  -- The kernel ABI header alone (for the runtime's build).
  function g.abi_header()
    return eng:render("abi.h.tpl", { ABI_VERSION = M.ABI_VERSION, KEY_FIELDS = facts.KEY_FIELDS }, "templates/")
  end
  return g
end

return M
