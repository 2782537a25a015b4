-- SIMD micro-kernels for the vector ISA records of gen/facts.lua (AVX2+FMA+F16C:
-- 8 lanes, 16 registers; AVX-512 F/BW/VL: 16 lanes, 32 registers), asking the
-- records' capabilities (width, registers, instruction groups), emitted as inline asm
-- statements whose vector instructions are `.byte` lines from gen/x86.lua
-- (tcc's assembler knows no AVX) and whose loop control is plain AT&T
-- general-purpose code (which tcc and gas both assemble).
--
-- Every statement reads its inputs from one fd_asm_args struct (see
-- templates/simd_prelude.c.tpl), declares the caller-saved registers it
-- touches clobbered (vector registers through FD_VCLOBBER, empty under tcc,
-- which keeps no values in vector registers across statements), saves and
-- restores the callee-saved ones it uses (save_regs) and ends with vzeroupper.
-- Statements, each for the whole group tile of T heads:
--   qload         q (f32/f16/bf16) times the scale -> f32 rows
--   init_records  empty state records (acc 0, m -inf, l 0) for the call's heads
--   q_columns     a head-lane tile's f32 q rows as columns (16 x 16 transposes)
--   q_planes      MSD: each head's f32 q row as int8 planes, their biases and scales
--   scores        q tile . K rows of the chunk -> score rows (row-major
--                 sc[t][i], or key-major sc[i][t] for head-lane tiles)
--   max           running max of every head's scores, starting at in[t]
--   scale_records the online-softmax rescale of the tile's accumulators
--   exp           p = e^(s - in[t]) 2^-P_SHIFT in place, out[t] = sum of p
--   pv            acc[t][d0..] += sum_i p_t[i] V[i][d0..] for one block of d
--   pscale        int8/fp8 V: the weights times their keys' v scales first
--   pround        fast precision: the weights rounded to bf16 in place
--   pv_dpbf16     pv of fast precision: bf16 weight pairs by vdpbf16ps
--   store_out     one head's normalized output row, rounded to the out dtype
--   merge_first,  the split merge's weighted sum of one head's split rows:
--   merge_add     acc = r * w for the first split, acc += r * w for the rest
local x86 = require("x86")
local facts = require("facts")
local M = {}

-- fd_asm_args field offsets: the struct templates/simd_prelude.c.tpl writes
-- from gen/facts.lua ASM_ARGS (build/fd_keydefs.h asserts them with offsetof).
local ARG = facts.asm_arg_offsets()
ARG.inp = ARG["in"]
M.ARG = ARG
-- Softmax weights are p = e^(s - m) * 2^-P_SHIFT, every kernel and ISA alike
-- (the exp polynomial's coefficients here, the exponent bias in portable C):
-- the accumulators sum_i p_i V_i then stay below 2^-P_SHIFT * keys * FLT_MAX,
-- so V values up to FLT_MAX give the reference's finite mean instead of an
-- overflow that depended on the split count; lse adds P_SHIFT ln 2 back. The
-- scaling is exact (a power of two) and costs nothing. Weights of arguments
-- below P_MIN_X are 0, and so are the factors e^(old - new) of a grown max
-- (fd_expf's cutoff, the same constant): a weight or factor below e^-40
-- (4e-18 of the row's largest) changes no f32 sum even over 2^31 keys, and
-- the smallest weight (2^-89.7) times any |V| from 2^-36 stays a normal
-- float, so P.V and the rescale make no subnormal sums. Intel cores take a
-- microcode assist on each subnormal result: with e^-64 as the cutoff ALiBi
-- (whose early keys weigh least) ran 1.309x plain decode's time on the Xeon
-- CI ran on, 1.072x with -40
-- (results/bench/features-intel-xeon-2c-avx512vnni.md).
M.P_SHIFT, M.P_MIN_X = 32, -40

-- How far a head-lane tile's maxima may grow before its records are
-- rescaled (M.grow_lanes): a record's m is then its exp base, within
-- GROW_SLACK below the largest score seen, so weights reach e^GROW_SLACK
-- 2^-P_SHIFT < 2^(1 - P_SHIFT) and P_SHIFT's bound on the accumulators holds
-- for keys < 2^31. On random scores the running max then stops costing a
-- rescale of all 16 records (64 multiplies at head_dim 64) after its first
-- chunks: Falcon-40B bf16's rescale share was 3.8-4.2%
-- (results/bench/phases-amd-epyc-2c-avx512bf16.md).
M.GROW_SLACK = 0.6875

-- e^x as 2^t, t = x log2(e): n = round(t), f = t - n (exact, in [-1/2, 1/2]),
-- 2^f by this degree-6 polynomial (coefficients of f^0 .. f^6, fitted for
-- the least relative error on [-1/2, 1/2]: 1.9e-9, 7.9e-8 evaluated in f32
-- by Horner's rule with FMAs), times 2^n. Rounding t costs e^x a relative
-- error up to about |x| 2^-24 (the rounding of x = s - m costs as much); as
-- e^x |x| <= 1/e, that is below 2.2e-8 of the row's largest weight (1). Over
-- x in [-40, 0] the largest error is 8.1e-8 of 1 (in C without FMA
-- contraction; 6.5e-8 with it), against 6.3e-8 (4.6e-8) of the Cody-Waite
-- reduction and degree-7 polynomial before, which took 3 more FMA-pipe
-- operations a vector. The SIMD statements (exp_core) and portable C
-- (gen/generate.lua exp_body) both read the coefficients here.
M.EXP2_COEFS = { "1.0f", "6.931471825e-01f", "2.402264625e-01f", "5.550329015e-02f", "9.618489072e-03f",
                 "1.339990413e-03f", "1.534574112e-04f" }
-- log2(e), the exp's argument scale, for both.
M.LOG2E = "1.44269504088896341f"

-- A polynomial coefficient scaled by 2^-P_SHIFT, as a C constant expression.
local function coef(c) return ("(%s * 0x1p-%df)"):format(c, M.P_SHIFT) end

-- Constant rows of fd_simd_c, 16 lanes (64 bytes) each: the float rows, then
-- the integer rows. templates/simd_prelude.c.tpl writes the struct from
-- these lists, so names, order and values live only here.
M.CONST_FLOATS = {
  { "log2e", M.LOG2E }, { "grow_slack", ("%gf"):format(M.GROW_SLACK) },
  -- (the exp's coefficient rows e<top> .. e0 go here, below)
  { "min_x", ("%d.0f"):format(M.P_MIN_X) }, { "two120", "1.329227995784916e+36f" },
  -- softcap's tanh: the odd polynomial below tanh_small, the exponent limit above it
  { "t4", "-5.70498872745e-3f" }, { "t3", "2.06390887954e-2f" }, { "t2", "-5.37397155531e-2f" },
  { "t1", "1.33314422036e-1f" }, { "t0", "-3.33332819422e-1f" }, { "tanh_small", "0.625f" },
  { "tanh_zmax", "40.0f" }, { "p_shift", ("%d.0f"):format(M.P_SHIFT) }, { "one_f", "1.0f" }, { "two_f", "2.0f" },
  -- ALiBi's key offsets: lane i holds i (a row of distinct lanes); the two vector widths
  { "iota", (function() local t = {} for i = 0, 15 do t[#t + 1] = i .. ".0f" end return t end)() },
  { "eight_f", "8.0f" }, { "sixteen_f", "16.0f" },
  { "i16max_f", "32767.0f" },                                       -- AVX2 MSD: the int16 plane's range
}
-- The exp's coefficient rows after log2e, highest power first: e<k> holds
-- the coefficient of f^k (M.EXP2_COEFS[k + 1]), scaled.
for k = 0, #M.EXP2_COEFS - 1 do table.insert(M.CONST_FLOATS, 2, { "e" .. k, coef(M.EXP2_COEFS[k + 1]) }) end
-- A row of 16 integer lanes, lane i (0-based) holding f(i).
local function int_lanes(f) local t = {} for i = 0, 15 do t[i + 1] = f(i) end return t end
M.CONST_INTS = {
  { "i127", 127 }, { "qnan", 0x7fc00000 },
  { "fp8_bits", 0x87f00000 }, { "fp8_nan", 0xfe000000 },             -- fp8 e4m3 sign and magnitude, NaN
  { "one", 1 }, { "bf16_half", 0x7fff }, { "bf16_quiet", 0x40 },   -- f32 -> bf16 rounding
  { "hi16", 0xffff0000 },                                           -- odd bf16 of a pair
  { "abs", 0x7fffffff }, { "sign", 0x80000000 },                    -- f32 magnitude, sign
  { "nibble", 0x0f },                                               -- q4_0's low nibble
  { "x80", 0x80808080 },                                            -- int8 -> u8 (+128) for vpdpbusd
  { "ninf", 0xff800000 },                                           -- an empty record's running max
  -- vpermi2ps indices over two 16-lane tables (0..15 the first, 16..31 the
  -- second) between natural order (lanes d, d + 16) and the split order of a
  -- 32-element bf16 piece (even d, odd d): bf16 P.V (M.pv_split)
  { "even_idx", int_lanes(function(i) return 2 * i end) }, { "odd_idx", int_lanes(function(i) return 2 * i + 1 end) },
  { "lo_idx", int_lanes(function(i) return (i % 2) * 16 + math.floor(i / 2) end) },
  { "hi_idx", int_lanes(function(i) return (i % 2) * 16 + 8 + math.floor(i / 2) end) },
}
local C = {}
for i, row in ipairs(M.CONST_FLOATS) do C[row[1]] = (i - 1) * 64 end
for i, row in ipairs(M.CONST_INTS) do C[row[1]] = (#M.CONST_FLOATS + i - 1) * 64 end

-- The value of a CONST_FLOATS literal: "1.5f", "-64.0f" or coef()'s "(c * 0x1p-Nf)".
local function literal_value(text)
  local c, n = text:match("^%(([^ ]+)f %* 0x1p%-(%d+)f%)$")
  if c then return assert(tonumber(c), text) * 2 ^ -tonumber(n) end
  return assert(tonumber((text:gsub("f$", ""))), text)
end

-- The f32 bits of the nearest float to double d (normal range, round to
-- nearest even). d is the decimal literal rounded to double (53 bits); a d
-- within 2^-28 of an f32 ulp from a midpoint could round differently from
-- the literal itself (as a C compiler reads it), so that is an error.
function M.f32_bits(d, what)
  local sign = 0
  if d < 0 or (d == 0 and 1 / d < 0) then sign, d = 2 ^ 31, -d end
  if d == 0 then return sign end
  local e, m = 0, d
  while m >= 2 do m, e = m / 2, e + 1 end
  while m < 1 do m, e = m * 2, e - 1 end
  if e < -126 or e > 127 then error(("simd: constant %s is not a normal f32"):format(what), 0) end
  local f = (m - 1) * 2 ^ 23
  local fl = math.floor(f)
  local r = f - fl
  if math.abs(r - 0.5) < 2 ^ -28 then error(("simd: constant %s is too close to an f32 rounding tie"):format(what), 0) end
  if r > 0.5 then fl = fl + 1 end
  if fl == 2 ^ 23 then fl, e = 0, e + 1 end
  return sign + (e + 127) * 2 ^ 23 + fl
end

-- "\xNN" escapes of the 4 little-endian bytes of a 32-bit pattern.
local function le_escapes(u)
  local t = {}
  for i = 1, 4 do t[i] = ("\\x%02x"):format(u % 256); u = math.floor(u / 256) end
  return table.concat(t)
end

-- The rows of fd_simd_c as { name, text }: text is the row's 64 bytes as C
-- string-literal escapes (one literal token per row: far faster for a C
-- compiler than 16 float expressions). Made once.
local const_rows
function M.const_rows()
  if const_rows then return const_rows end
  const_rows = {}
  local function add(name, lanes)
    local t = {}
    for i = 1, 16 do t[i] = le_escapes(lanes[i]) end
    const_rows[#const_rows + 1] = { name, table.concat(t) }
  end
  for _, row in ipairs(M.CONST_FLOATS) do
    local lanes = {}
    for i = 1, 16 do
      local text = type(row[2]) == "table" and row[2][i] or row[2]
      lanes[i] = M.f32_bits(literal_value(text), row[1] .. " (" .. text .. ")")
    end
    add(row[1], lanes)
  end
  for _, row in ipairs(M.CONST_INTS) do
    local lanes = {}
    for i = 1, 16 do lanes[i] = type(row[2]) == "table" and row[2][i] or row[2] end
    add(row[1], lanes)
  end
  return const_rows
end

-- Vector geometry and capabilities of an isa: its gen/facts.lua record.
local GEOM = facts.isas
local ELEM = {}                        -- bytes per KV element
for d = 0, #facts.dtypes do ELEM[d] = facts.dtypes[d].size end

-- The memory operand of K/V element e of a row whose pointer base sits at
-- element e0's storage (0 if nil): e - e0 elements on, or for a block dtype
-- (q8_0, q4_0) the block of e, counted from e0's block, with field elem =
-- e's place in its block for the block loads (a vector never spans blocks).
local function kv_mem(p, base, e, e0)
  local n, bytes = facts.dtype_block(p.KV_DTYPE)
  e0 = e0 or 0
  if n == 1 then return { base = base, disp = e ~= e0 and (e - e0) * bytes or nil } end
  return { base = base, disp = (math.floor(e / n) - math.floor(e0 / n)) * bytes, elem = e % n }
end

-- The ggml blocks of a K/V row (q8_0, q4_0).
local function row_blocks(p) return math.floor(p.D / facts.dtype_block(p.KV_DTYPE)) end

-- Bytes [from, to) of a K/V row that hold elements [e0, e1) (whole blocks).
local function kv_span(p, e0, e1)
  local n, bytes = facts.dtype_block(p.KV_DTYPE)
  return math.floor(e0 / n) * bytes, math.ceil(e1 / n) * bytes
end

-- Whether isa runs these micro-kernels (a vector record), not portable C.
function M.vector(isa)
  return GEOM[isa].W > 1
end

-- Whether a record has the EVEX (AVX-512 F) forms: opmask registers,
-- embedded broadcast, vpandd/vpord, 256-bit extracts.
local function evex(g) return g.groups.avx512f == true end

-- Refuse, with the field named, what the micro-kernels cannot do.
function M.check(isa, D, T, fail)
  local g = GEOM[isa]
  if D % g.W ~= 0 then fail("head_dim", ("%d is not a multiple of the %s vector (%d floats)"):format(D, g.short, g.W)) end
  if T > g.max_tile then
    fail("group_tile", ("%d exceeds the %d %s can hold in registers"):format(T, g.max_tile, g.short))
  end
end

-- A buffer of assembler lines for one asm statement (b.x: the record has EVEX
-- forms) of kernel parameters p (p.ANNOTATE false: no instruction comments).
local function new_block(isa, p)
  local annotate = p.ANNOTATE ~= false
  local b = { lines = {}, g = GEOM[isa], isa = isa, x = evex(GEOM[isa]), annotate = annotate }
  -- the integer and/or of the isa's vectors (EVEX names the element size)
  b.pand, b.por = b.x and "vpandd" or "vpand", b.x and "vpord" or "vpor"
  -- A vector instruction: its bytes, with the Intel text as a comment.
  function b.v(mn, ...)
    b.lines[#b.lines + 1] = annotate and { x86.line_text(mn, ...) } or { bytes = x86.bytes_cached(mn, ...) }
  end
  -- A general-purpose instruction or label in AT&T syntax (assembled by the compiler).
  function b.gp(text) b.lines[#b.lines + 1] = { (text:gsub("%%(%a)", "%%%%%1")), nil } end
  -- Vector register n of the isa's width (xmm/ymm for narrower views).
  function b.r(n, kind) return (kind or b.g.reg) .. n end
  return b
end

-- Memory operand helper.
local function mem(base, disp, index, scale, bcst, mask)
  return { base = base, disp = disp ~= 0 and disp or nil, index = index, scale = index and scale or nil, bcst = bcst,
           mask = mask }
end

-- Tiles of at least this many heads prefetch the other stream into L2 (V rows
-- while computing scores; the next chunk's K rows during P.V, each d-block
-- pass its own lines, so no pass leaves memory idle): their compute is long
-- enough for memory to idle otherwise. Into L1 (prefetcht0) a phase ahead
-- evicts the rows in use and measured slower on the Xeon, faster for V on the
-- Zen 5 (the isa record's other_hint, gen/facts.lua); tiles 1 and 2 are bandwidth
-- bound without it. Measured with the cycle counts of each phase (rdtsc around
-- the statements, cold, 2 threads): without the spread, P.V's second pass and
-- the softmax left memory idle and the next scores pass stalled.
M.PREFETCH_MIN_TILE = 4

-- Prefetch one row of the other stream (pointer reg), or only its cache lines
-- that hold bytes [from, to), and advance the pointer by the row stride: V
-- (reg r14, the scores pass) by the isa record's other_hint, K (the P.V
-- pass) into L2.
local function prefetch_row(b, p, reg, from, to)
  if p.T < M.PREFETCH_MIN_TILE then return end
  from, to = from or 0, to or facts.kv_bytes(p.KV_DTYPE, p.D)
  local hint = reg == "r14" and b.g.other_hint or "prefetcht1"
  for line = math.floor(from / 64), math.ceil(to / 64) - 1 do
    b.gp(("%s %d(%%%s)"):format(hint, line * 64, reg))
  end
  b.gp(("add %%r8, %%%s"):format(reg))
end

-- Whether the P.V pass also prefetches the next chunk's V rows into L2 (r9,
-- pf_v): head-lane tiles, whose P.V (four passes of 16 FMAs a key at head_dim
-- 64) is the longest stretch of the chunk; K of the next chunk alone left
-- memory idle there. Measured on the Zen 5 VM (Falcon-40B bf16, cold, the
-- same plans): 0.949x the time at chunk 1024, 0.945x at 128; on row-major
-- tiles (Llama bf16 and int8, the MQA batch) 1.07-1.13x, so not for them.
function M.pv_next_v(isa, p)
  return M.head_lanes(isa, p) and p.T >= M.PREFETCH_MIN_TILE
end

-- The next chunk's prefetches of a head-lane P.V pass (block of M.pv_blocks):
-- the K lines (rax) and V lines (r9) of a row, alternating, dealt out evenly
-- over the passes by their d-blocks (at head_dim 64 bf16 in 4 passes, one line
-- a pass), each pointer then advanced by the row stride. Against each pass
-- prefetching the K and V lines of its own d range (the K line taken twice):
-- 0.963x-0.986x the time, Falcon-40B bf16 cold, chunks 64 to 1024.
local function prefetch_next_rows(b, p, block)
  local NCH, lines = math.floor(p.D / b.g.W), math.ceil(facts.kv_bytes(p.KV_DTYPE, p.D) / 64)
  local items = {}
  for line = 0, lines - 1 do
    items[#items + 1] = { "rax", line }
    items[#items + 1] = { "r9", line }
  end
  -- d-block units: each head group's passes cover NCH of them
  local units, u0 = NCH * math.floor(p.T / block[4]), math.floor(block[3] / block[4]) * NCH + block[1]
  local first, last = math.floor(u0 * #items / units), math.floor((u0 + block[2]) * #items / units)
  for k = first + 1, last do b.gp(("prefetcht1 %d(%%%s)"):format(items[k][2] * 64, items[k][1])) end
  b.gp("add %r8, %rax")
  b.gp("add %r8, %r9")
end

-- The loads of W elements of each dtype (by name) at m into vector register
-- dst as f32, each function(b, dst, m, tmp) (tmp: a scratch register).
local LOAD_KV = {
  f32 = function(b, dst, m) b.v("vmovups", dst, m) end,
  f16 = function(b, dst, m) b.v("vcvtph2ps", dst, m) end,
  bf16 = function(b, dst, m) b.v("vpmovzxwd", dst, m); b.v("vpslld", dst, dst, 16) end,
  i8 = function(b, dst, m) b.v("vpmovsxbd", dst, m); b.v("vcvtdq2ps", dst, dst) end,
  -- fp8 e4m3: the byte sign-extended and shifted puts its magnitude bits in
  -- f32 place and its sign in bit 31; rebias by 2^120. The NaN codes 0x7f
  -- and 0xff are the ones whose magnitude bits, shifted to the top, are all
  -- set (an integer compare: the FMA pipes are the busy ones).
  fp8 = function(b, dst, m, tmp)
    b.v("vpmovsxbd", dst, m)
    b.v("vpslld", dst, dst, 20)
    b.v("vpslld", tmp, dst, 5)
    b.v("vpcmpeqd", b.x and "k1" or tmp, tmp, mem("r11", C.fp8_nan))  -- AVX2: all ones, a NaN
    b.v(b.pand, dst, dst, mem("r11", C.fp8_bits))
    b.v("vmulps", dst, dst, mem("r11", C.two120))
    if b.x then b.v("vpord", dst .. "{k1}", dst, mem("r11", C.qnan))
    else b.v("vpor", dst, dst, tmp) end
  end,
  -- fp8 e5m2: each byte is the upper byte of an f16 (subnormals, infinities
  -- and NaN included): bytes zero-extended to words in the lower half of dst,
  -- shifted up by 8, converted as f16.
  e5m2 = function(b, dst, m)
    local half = (dst:gsub("^%a+", b.g.W == 16 and "ymm" or "xmm"))
    b.v("vpmovzxbw", half, m)
    b.v("vpsllw", half, half, 8)
    b.v("vcvtph2ps", dst, half)
  end,
}

-- ggml blocks (q8_0, q4_0; m from kv_mem: m.disp the block, m.elem the first
-- element's place in it): codes(b, dst, m, codes_at) puts the W elements'
-- codes as f32 in dst (codes_at: the block's codes, 2 bytes in, past its
-- f16 scale), which is then multiplied by the scale: vcvtph2ps widens the
-- block's first 8 bytes into tmp's low lane, vbroadcastss spreads lane 0.
-- mode "codes": no scale (the P.V of block-scaled weights, M.pv_bscale);
-- "ready": tmp holds the block's scale already (a loop over the vectors of
-- one block converts it at the first). s8 (q4_0, or nil): a register that
-- takes 8 times the scale with it, so (c - 8) s is one fused c s - 8 s (the
-- same bits for a finite s: 8 s is exact, both round once; an infinite s makes
-- the row's score NaN either way) where a subtract and a multiply were two.
-- Llama q4_0 (tile 4) against the subtract: 0.970x the time warm and 0.959x
-- cold on the Zen 3 VM (AVX2; results/bench/builds-fold-amd-epyc-2c-avx2.md),
-- 0.979x warm on the device's Xeon (AVX-512; builds-bscale-evex-intel-xeon-16c-avx512bf16.md).
local function block_load(codes)
  return function(b, dst, m, tmp, mode, s8)
    local disp = m.disp or 0
    codes(b, dst, m, disp + 2, s8 and mode ~= "codes")
    if mode == "codes" then return end
    if mode ~= "ready" then
      local low = (tmp:gsub("^%a+", "xmm"))
      b.v("vcvtph2ps", low, mem(m.base, disp, m.index, m.scale))
      b.v("vbroadcastss", tmp, low)
      if s8 then b.v("vmulps", s8, tmp, b.eight and b.r(b.eight) or mem("r11", C.eight_f)) end
    end
    if s8 then b.v("vfmsub132ps", dst, s8, tmp) else b.v("vmulps", dst, dst, tmp) end
  end
end
-- q8_0: W signed bytes from code elem. q4_0: W bytes from byte elem % 16, their
-- low nibbles for elements 0..15 of a block, the high ones for 16..31, minus 8
-- (folded: the scale's multiply subtracts it, block_load's s8).
LOAD_KV.q8_0 = block_load(function(b, dst, m, at)
  b.v("vpmovsxbd", dst, mem(m.base, at + m.elem, m.index, m.scale))
  b.v("vcvtdq2ps", dst, dst)
end)
-- The constants come from r11 (fd_simd_c), or from registers b.nibble and
-- b.eight where a kernel keeps them there (block_consts).
LOAD_KV.q4_0 = block_load(function(b, dst, m, at, folded)
  b.v("vpmovzxbd", dst, mem(m.base, at + m.elem % 16, m.index, m.scale))
  if m.elem < 16 then b.v(b.pand, dst, dst, b.nibble and b.r(b.nibble) or mem("r11", C.nibble))
  else b.v("vpsrld", dst, dst, 4) end
  b.v("vcvtdq2ps", dst, dst)
  if not folded then b.v("vsubps", dst, dst, b.eight and b.r(b.eight) or mem("r11", C.eight_f)) end
end)

-- Vector registers a block dtype's loads need beside the destination: the
-- scale's scratch, and for q4_0 its two constants (nibble mask, 8.0).
local function block_regs(p)
  if not p.BLOCKS then return 0 end
  return facts.dtypes[p.KV_DTYPE].name == "q4_0" and 3 or 1
end

-- Keep a block dtype's constants in registers from `first` on (scratch,
-- then nibble mask and 8.0) for kernels whose r11 holds a row pointer: gp,
-- a free general-purpose register, is pointed at fd_simd_c (rax: the args).
-- Returns the scratch register's name, or nil for other dtypes.
local function block_consts(b, p, first, gp)
  if not p.BLOCKS then return nil end
  if block_regs(p) == 3 then
    b.gp(("mov %d(%%rax), %%%s"):format(ARG.consts, gp))
    b.nibble, b.eight = first + 1, first + 2
    b.v("vmovups", b.r(b.nibble), mem(gp, C.nibble))
    b.v("vmovups", b.r(b.eight), mem(gp, C.eight_f))
  end
  return b.r(first)
end

-- Load W elements of dtype at m into vector register dst as f32 (tmp: a
-- scratch register; mode, s8: a block dtype's scale handling, block_load).
local function load_kv(b, dtype, dst, m, tmp, mode, s8)
  local name = facts.dtypes[dtype].name
  assert(LOAD_KV[name], "simd: no load for dtype " .. name)(b, dst, m, tmp, mode, s8)
end

-- Whether a q4_0 load folds its "minus 8" into the scale's multiply given a
-- register for 8 times the scale (block_load's s8).
local function folds_eight(p) return p.BLOCKS and facts.dtypes[p.KV_DTYPE].name == "q4_0" end

-- The block_load mode of d-block c in a loop over one row's d-blocks that
-- keeps the scale register: convert at a block's first vector, reuse at the
-- others; nil (convert each) for other dtypes. On the Zen 3 VM, the AVX2
-- scores of Llama q8_0 and q4_0 (tile 4):
-- results/bench/builds-bscale-amd-epyc-2c-avx2.md.
local function scale_mode(b, p, c)
  if not p.BLOCKS then return nil end
  local bn = facts.dtype_block(p.KV_DTYPE)
  return (c * b.g.W) % bn ~= 0 and "ready" or nil
end

-- Horizontal reduction of vector register n (op vaddps or vmaxps) into its
-- lowest lane, using scratch register s.
local function reduce(b, n, s, op)
  local scalar = op == "vaddps" and "vaddss" or "vmaxss"
  if b.x then
    b.v("vextractf64x4", b.r(s, "ymm"), b.r(n, "zmm"), 1)
    b.v(op, b.r(n, "ymm"), b.r(n, "ymm"), b.r(s, "ymm"))
    b.v("vextractf32x4", b.r(s, "xmm"), b.r(n, "ymm"), 1)
  else
    b.v("vextractf128", b.r(s, "xmm"), b.r(n, "ymm"), 1)
  end
  b.v(op, b.r(n, "xmm"), b.r(n, "xmm"), b.r(s, "xmm"))
  b.v("vpermilps", b.r(s, "xmm"), b.r(n, "xmm"), 0x4e)
  b.v(op, b.r(n, "xmm"), b.r(n, "xmm"), b.r(s, "xmm"))
  b.v("vpermilps", b.r(s, "xmm"), b.r(n, "xmm"), 0xb1)
  b.v(scalar, b.r(n, "xmm"), b.r(n, "xmm"), b.r(s, "xmm"))
end

-- The accumulator slot of key k in a group, chosen so the reduction tree
-- leaves the sums in key order (16 lanes: the identity; 8 lanes: a 2x4 transpose).
local function slot_of(isa, k)
  local W = GEOM[isa].W
  if W == 16 then return k end
  return math.floor(W / 4) * (k % 4) + math.floor(k / 4)
end

-- One tree level: pairs (A, B) of registers -> A = shuffle(A,B,lo) + shuffle(A,B,hi).
local function tree_level(b, mn, pairs, imm_lo, imm_hi, tmp)
  for _, pr in ipairs(pairs) do
    local A, B = b.r(pr[1]), b.r(pr[2])
    b.v(mn, tmp, A, B, imm_lo)
    b.v(mn, A, A, B, imm_hi)
    b.v("vaddps", A, A, tmp)
  end
end

-- Pairs of registers first..first+count-1 at distance step, as {a, a + step}.
local function pairs_of(count, step)
  local t = {}
  for a = 0, count - 1, 2 * step do t[#t + 1] = { a, a + step } end
  return t
end

-- Reduce W accumulators (registers 0..W-1) to one vector of W sums in register 0.
-- AVX-512 takes the in-lane shuffles (vshufps) at the two wide levels (24 of
-- the 30 shuffles) and the 128-bit-lane ones (vshuff64x2, which share the
-- Zen 5's FMA and dot-product pipes) at the two narrow ones.
local function tree(b, tmp)
  tmp = b.r(tmp)
  if b.x then
    tree_level(b, "vshufps", pairs_of(16, 1), 0x44, 0xEE, tmp)
    tree_level(b, "vshufps", pairs_of(16, 2), 0x88, 0xDD, tmp)
    tree_level(b, "vshuff64x2", pairs_of(16, 4), 0x44, 0xEE, tmp)
    tree_level(b, "vshuff64x2", pairs_of(16, 8), 0x88, 0xDD, tmp)
  else
    tree_level(b, "vperm2f128", pairs_of(8, 1), 0x20, 0x31, tmp)
    tree_level(b, "vshufps", pairs_of(8, 2), 0x44, 0xEE, tmp)
    tree_level(b, "vshufps", pairs_of(8, 4), 0x88, 0xDD, tmp)
  end
end

-- Dword transposes of W registers (W rows of W lanes), as register pairs per
-- stage: { op_lo, op_hi, imms, distance, block }: 16 lanes (AVX-512: the MSD
-- K columns, q columns) and 8 (AVX2: the direct scores' key blocks);
-- simulated on labels below, so a change of a network cannot put rows or
-- columns out of place.
local TRANSPOSES = {
  [16] = {
    { "vunpcklps", "vunpckhps", nil, 1, 2 },   -- pairs (i, i + 1), blocks of 2
    { "vshufps", "vshufps", { 0x44, 0xEE }, 2, 4 },
    { "vshuff64x2", "vshuff64x2", { 0x88, 0xDD }, 4, 8 },
    { "vshuff64x2", "vshuff64x2", { 0x88, 0xDD }, 8, 16 },
  },
  [8] = {
    { "vunpcklps", "vunpckhps", nil, 1, 2 },
    { "vshufps", "vshufps", { 0x44, 0xEE }, 2, 4 },
    { "vperm2f128", "vperm2f128", { 0x20, 0x31 }, 4, 8 },
  },
}

-- The lanes of op (with imm) applied to label vectors a and b (8 or 16 lanes each).
local function sim_op(op, imm, a, b)
  local r = {}
  for L = 0, math.floor(#a / 4) - 1 do
    local A, B = {}, {}
    for i = 0, 3 do A[i], B[i] = a[4 * L + i + 1], b[4 * L + i + 1] end
    if op == "vunpcklps" then r[#r + 1], r[#r + 2], r[#r + 3], r[#r + 4] = A[0], B[0], A[1], B[1]
    elseif op == "vunpckhps" then r[#r + 1], r[#r + 2], r[#r + 3], r[#r + 4] = A[2], B[2], A[3], B[3]
    elseif op == "vshufps" then
      local s = function(x, k) return x[math.floor(imm / 4 ^ k) % 4] end
      r[#r + 1], r[#r + 2], r[#r + 3], r[#r + 4] = s(A, 0), s(A, 1), s(B, 2), s(B, 3)
    elseif op == "vperm2f128" then   -- piece L: imm's nibble L picks a.lo, a.hi, b.lo or b.hi
      local sel = math.floor(imm / 16 ^ L) % 4
      local src = sel >= 2 and b or a
      for i = 1, 4 do r[#r + 1] = src[4 * (sel % 2) + i] end
    else   -- vshuff64x2: a 128-bit piece of a for the low two, of b for the high two
      local src, sel = L < 2 and a or b, math.floor(imm / 4 ^ L) % 4
      for i = 1, 4 do r[#r + 1] = src[4 * sel + i] end
    end
  end
  return r
end

-- Emit (b given) or simulate (b nil) the transpose of n logical registers
-- L[0..n-1] (phys register numbers, spare: a free one); returns L and spare
-- after it (each pair's low result lands in the spare, the high one in place).
local function transpose_pass(b, n, L, spare, vals)
  for _, st in ipairs(TRANSPOSES[n]) do
    local lo_op, hi_op, imm, dist, blk = st[1], st[2], st[3], st[4], st[5]
    for base = 0, n - 1, blk do
      for k = 0, dist - 1 do
        local x, y = base + k, base + k + dist
        if b then
          if imm then
            b.v(lo_op, b.r(spare), b.r(L[x]), b.r(L[y]), imm[1])
            b.v(hi_op, b.r(L[y]), b.r(L[x]), b.r(L[y]), imm[2])
          else
            b.v(lo_op, b.r(spare), b.r(L[x]), b.r(L[y]))
            b.v(hi_op, b.r(L[y]), b.r(L[x]), b.r(L[y]))
          end
        else
          local lo = sim_op(lo_op, imm and imm[1], vals[x], vals[y])
          vals[y] = sim_op(hi_op, imm and imm[2], vals[x], vals[y])
          vals[x] = lo
        end
        L[x], spare = spare, L[x]
      end
    end
  end
  return L, spare
end

-- The column (dword of the rows) each output register of the n x n transpose holds.
local function transpose_columns(n)
  local vals, L = {}, {}
  for i = 0, n - 1 do                  -- input register i holds row i, lane l its dword l
    vals[i], L[i] = {}, i
    for l = 0, n - 1 do vals[i][l + 1] = { row = i, col = l } end
  end
  transpose_pass(nil, n, L, n, vals)
  local cols = {}
  for k = 0, n - 1 do
    for l = 0, n - 1 do
      local v = vals[k][l + 1]
      assert(v.row == l and v.col == vals[k][1].col,
        ("simd: the %d x %d transpose does not put row i in lane i"):format(n, n))
    end
    cols[k] = vals[k][1].col
  end
  return cols
end
local TRANSPOSE_COLS = { [16] = transpose_columns(16), [8] = transpose_columns(8) }

-- Save the callee-saved registers a block uses, below the red zone.
local function save_regs(b)
  b.gp("sub $128, %rsp")
  b.gp("push %rbx")
  b.gp("push %r12")
  b.gp("push %r13")
  b.gp("push %r14")
end

-- Restore what save_regs saved.
local function restore_regs(b)
  b.gp("pop %r14")
  b.gp("pop %r13")
  b.gp("pop %r12")
  b.gp("pop %rbx")
  b.gp("add $128, %rsp")
end

-- The register each fd_asm_args field is loaded into.
local ARG_REG = { src = "rsi", ptr = "rdi", sc = "rdx", n = "rcx", stride = "r8", scl = "r9", scl_stride = "r10",
                  consts = "r11", stage = "rbx", pf = "r14", pf_v = "r9" }

-- Point rax at the block's fd_asm_args and load the named fields into their
-- registers (ARG_REG); with save, first push the callee-saved ones (save_regs).
local function prologue(b, fields, save)
  b.gp("mov %0, %rax")
  if save then save_regs(b) end
  for _, f in ipairs(fields) do b.gp(("mov %d(%%rax), %%%s"):format(ARG[f], ARG_REG[f])) end
end

-- Convert the group's rows (count in r12) from K into the f32 staging block at
-- rbx, row stride D floats; int8/fp8 rows are scaled by their k_scale here;
-- raw: the rows' bytes copied unconverted (bf16 for the dpbf16 kernels).
local function stage_rows(b, p, raw)
  local W, NCH, esz = b.g.W, math.floor(p.D / b.g.W), ELEM[p.KV_DTYPE]
  local v0, tmp, sreg = b.x and 19 or 11, b.x and 21 or 13, b.x and 22 or 14
  b.gp("mov %rbx, %r13")
  b.gp("5:")
  if p.QUANT and not b.x then b.v("vbroadcastss", b.r(sreg), mem("r9", 0)) end
  for c = 0, raw and math.floor(p.D * esz / 64) - 1 or -1 do
    b.v("vmovups", b.r(v0 + c % 2), mem("rsi", c * 64))
    b.v("vmovups", mem("r13", c * 64), b.r(v0 + c % 2))
  end
  for c = 0, raw and -1 or NCH - 1 do
    local vr = b.r(v0 + c % 2)
    load_kv(b, p.KV_DTYPE, vr, kv_mem(p, "rsi", c * W), b.r(tmp), scale_mode(b, p, c),
            folds_eight(p) and b.r(sreg) or nil)   -- (sreg: int8/fp8's scale, free for q4_0)
    if p.QUANT then
      if b.x then b.v("vmulps", vr, vr, mem("r9", 0, nil, nil, true))
      else b.v("vmulps", vr, vr, b.r(sreg)) end
    end
    b.v("vmovups", mem("r13", c * W * 4), vr)
  end
  prefetch_row(b, p, "r14")
  b.gp("add %r8, %rsi")
  b.gp(("add $%d, %%r13"):format(p.D * 4))
  if p.QUANT then b.gp("add %r10, %r9") end
  b.gp("dec %r12")
  b.gp("jnz 5b")
end

-- Stage the next min(count, rcx) rows (count in r12) and take them from rcx.
local function stage_group(b, p, count, raw)
  b.gp(("mov $%d, %%r12"):format(count))
  b.gp("cmp %r12, %rcx")
  b.gp("cmovb %rcx, %r12")
  b.gp("sub %r12, %rcx")
  stage_rows(b, p, raw)
end

-- End a staged kernel's group loop (label 1, while rows remain in rcx) and its statement.
local function close_group_loop(b)
  b.gp("test %rcx, %rcx")
  b.gp("jnz 1b")
  b.gp("9:")
  restore_regs(b)
  return M.statement(b)
end

-- Dot products of one head (q at rax) with the W staged rows, reduced into
-- key order and stored at r12.
local function head_dots(b, p)
  local W, NCH = b.g.W, math.floor(p.D / b.g.W)
  local q0, tmp = b.x and 17 or 9, b.x and 16 or 8
  for c = 0, NCH - 1 do
    local qr = b.r(q0 + c % 2)
    b.v("vmovups", qr, mem("rax", c * W * 4))
    for k = 0, W - 1 do
      local m = mem("rbx", k * p.D * 4 + c * W * 4)
      b.v(c == 0 and "vmulps" or "vfmadd231ps", b.r(slot_of(b.isa, k)), qr, m)
    end
  end
  tree(b, tmp)
  b.v("vmovups", mem("r12", 0), b.r(0))
end

-- Rows per group of the direct scores kernel, or nil where the staged one
-- serves (one head, int8/fp8 scaling but direct_scaled, AVX2 tiles wider
-- than its 8 lanes). AVX2 tile 1 as direct groups of 8 keys (q in
-- registers), on the Zen 3 VM: with the tile forced to 1 on the grouped
-- shapes (K read again from the cache by each head), Llama bf16 0.894x the
-- time warm and 0.941x cold, the MQA batch 0.835x and 0.861x; but MHA-32 16k
-- cold, each K row read once from memory, 1.188x (f16) and 1.177x (bf16):
-- the staged kernel's row-by-row reads stream better, so it keeps tile 1.
function M.direct_rows(isa, p)
  local W = GEOM[isa].W
  if M.direct_scaled(isa, p) then return math.floor(W / p.T) end
  if p.T == 1 or p.QUANT or p.T > W then return nil end
  return math.floor(W / p.T)
end

-- Whether the direct scores kernel serves int8 K with row scales (AVX2 tiles
-- of 2 to 8 heads, groups of 8 / T keys; the int16 plane of q, M.msd, too):
-- the rows converted unscaled, the reduced group times its keys' scales
-- (scaled_group), where the staged kernel scaled every element. Tiles 2 and
-- 5-8 against the staged kernel on the Zen 3 VM (make bench-builds, the f32
-- FMA scores): warm, Gemma-2-9B int8 (tile 2, D 256) 0.833x the time,
-- Qwen2.5-7B int8 (7) 0.977x, the MQA batch int8 (8) 0.977x; cold 0.96-0.97x
-- on Qwen, 0.988x on the MQA batch, Gemma within its spread (0.97-1.02x).
function M.direct_scaled(isa, p)
  return not evex(GEOM[isa]) and M.vector(isa) and facts.dtypes[p.KV_DTYPE].name == "i8"
    and p.T >= 2 and p.T <= GEOM[isa].W
end

-- Point r15 at the scale of the group's row r (r15 row r - 1's, r13 the
-- stride), or at row 0's (r12) past the n keys (rcx).
local function next_scale_row(b, r)
  b.gp("lea (%r15,%r13), %r15")
  b.gp(("cmp $%d, %%rcx"):format(r))
  b.gp("cmovbe %r12, %r15")
end

-- Multiply the reduced group (register 0, lane h R + r: head h, key r; R = 1,
-- 2 or 4) by its keys' scales (r12 row 0's, r13 the stride; a row past the n
-- keys takes row 0's), built in register 1 as s0 broadcast, (s0 s1 s0 s1 |
-- s0 s1 s0 s1) or (s0 s1 s2 s3 | s0 s1 s2 s3); then r12 to the next group's.
local function scaled_group(b, R)
  local x = function(i) return b.r(i, "xmm") end
  if R == 1 then
    b.v("vbroadcastss", b.r(1), mem("r12", 0))
  else
    b.gp("mov %r12, %r15")
    b.v("vmovss", x(1), mem("r12", 0))
    for r = 1, R - 1 do
      next_scale_row(b, r)
      b.v("vmovss", x(r + 1), mem("r15", 0))
    end
    b.v("vunpcklps", x(1), x(1), x(2))
    if R == 2 then b.v("vshufps", x(1), x(1), x(1), 0x44)
    else
      b.v("vunpcklps", x(3), x(3), x(4))
      b.v("vshufps", x(1), x(1), x(3), 0x44)
    end
    b.v("vinsertf128", b.r(1), b.r(1), x(1), 1)
  end
  b.v("vmulps", b.r(0), b.r(0), b.r(1))
  b.gp(R == 1 and "add %r13, %r12" or ("lea (%%r12,%%r13,%d), %%r12"):format(R))
end

-- Pointer registers of rows 1..R-1 of a direct group (row 0 is rsi).
local ROW_PTR = { "r9", "r10", "r11", "r12", "r13", "r14", "r15" }

-- The direct scores kernel also prefetches its own K rows into L1 at least
-- this many rows ahead: a power of two of whole groups (an index scale).
-- Measured +13-17% on Llama f16/bf16 64k and the MQA batch, cold, 2 threads
-- (the same distance of 4 or 16 rows did as well; the staged and head-lane
-- kernels, compute bound, gained nothing).
M.K_ROWS_AHEAD = 8

-- Prefetch into L1 the rows of the group `ahead` groups past the current one
-- (rax holds a group's byte stride; the rows are rsi and ROW_PTR).
local function prefetch_group_ahead(b, p, R, ahead)
  for r = 0, R - 1 do
    for line = 0, math.ceil(facts.kv_bytes(p.KV_DTYPE, p.D) / 64) - 1 do
      b.gp(("prefetcht0 %d(%%%s,%%rax,%d)"):format(line * 64, r == 0 and "rsi" or ROW_PTR[r], ahead))
    end
  end
end

-- Whether the direct scores kernel reads bf16 K a pair of d-blocks (2W
-- elements: 64 bytes on AVX-512, 32 on AVX2) at a time, split into its even
-- elements (shifted up) and odd ones (masked) instead of widening each half:
-- two vector operations per 2W elements where the widening load takes four
-- (AVX2: vpmovzxwd and vpslld per W) or two with a memory source (AVX-512).
-- Up to 12 heads (AVX-512: register 29 holds the mask; AVX2: the register
-- after q's: direct_regs). q is permuted to match: within each 2W
-- elements, the even ones first (templates/decode.c.tpl); an odd last
-- d-block keeps the widening load. On the Zen 3 VM (AVX2), warm, the scores
-- loop alone took 0.81x the time of the widening loads (a C model of it, not
-- kept); the kernels of tile 4 0.96-0.97x the time (the MQA batch bf16,
-- Falcon-40B bf16, Llama bf16), cold 0.96-0.97x and Llama 64k 0.99x.
function M.bf16_split(isa, p)
  return M.vector(isa) and facts.dtypes[p.KV_DTYPE].name == "bf16"
    and M.direct_rows(isa, p) ~= nil and p.T <= 12 and not M.dpbf16(isa, p)
end

-- The elements of a split pair of d-blocks (2W): q's permutation block.
function M.split_pair(isa) return 2 * GEOM[isa].W end

-- Whether the direct scores kernel keeps each head's q d-block in a register
-- (q_in_regs), and the register holding the split's mask (nil without the
-- split): AVX-512 register 29 (q in 16..27); AVX2 the first one after the
-- accumulators and q, before the two K registers. AVX2 keeps q in registers
-- only where each q vector serves 4 or more keys (tile 2), else reads
-- it as each FMA's memory source, one macro-op where a load and a register
-- FMA were two. On the Zen 3 VM, warm, against q in registers at tile 4:
-- Falcon-40B bf16 0.941x the time, the MQA batch 0.981x, Llama 0.991x (the
-- staged int8 control 1.026x); against q from memory at tile 2 (4 keys a
-- group: 12 loads per 8 FMAs), q in registers took 0.962x and 0.978x.
local function direct_regs(isa, p, split)
  local g, T = GEOM[isa], p.T
  local q_reused = evex(g) or math.floor(g.W / T) >= 4      -- AVX2: by 4 or more keys
  local regs = g.W + T + 2 + block_regs(p) + (split and not evex(g) and 1 or 0)
  local q_in_regs = q_reused and regs <= g.nregs
  if not split then return q_in_regs, nil end
  if evex(g) then return q_in_regs, 29 end
  return q_in_regs, g.W + (q_in_regs and T or 0) + block_regs(p)
end

-- Whether the scores kernel takes bf16 pair dot products (vdpbf16ps, a record
-- with the bf16 group): q and K bf16, whole 32-element d-blocks; head-lane
-- tiles, or direct tiles of 2 to 12 heads (q in registers 16..27, the scale
-- in 29). On the Zen 5 VM, warm (K/V in the L3), against the split-load FMA
-- scores on the same isa: 2 heads 0.89x the time, 3 0.87x, 4 0.92x (Llama
-- bf16 4k), 6 0.84x, 7 0.83x; cold at 39 GB/s, Llama bf16 16k and 64k
-- 1.00-1.04x (memory bound there: the faster scores leave V's prefetch less
-- lead). An earlier `make bench` (another VM) had Llama 64k at 0.90x the
-- GB/s with it. The isa digit keeps both: isa 2 and 4 take the FMA scores,
-- so the tuner picks per shape and length. The products of two
-- bf16 values are exact in f32; q is read unscaled as bf16 (each head's row of
-- the q buffer holds its raw bf16 values, templates/decode.c.tpl) and each
-- group's scores are multiplied by the scale after the reduction.
function M.dpbf16(isa, p)
  local g = GEOM[isa]
  return g.groups.bf16 == true and facts.dtypes[p.KV_DTYPE].name == "bf16" and facts.dtypes[p.Q_DTYPE].name == "bf16"
    and p.D % 32 == 0 and (M.head_lanes(isa, p) or M.direct_rows(isa, p) ~= nil and p.T >= 2 and p.T <= 12)
end

-- One 32-element d-block c of the dpbf16 scores: K rows into registers, then
-- one vdpbf16ps per (row, head) into its accumulator.
local function dpbf16_block(b, p, R, c, kreg, qbase, q_in_regs)
  local T = p.T
  if q_in_regs then
    for h = 0, T - 1 do b.v("vmovups", b.r(qbase + h), mem("rdi", h * p.D * 4 + c * 64)) end
  end
  for r = 0, R - 1 do
    local kr = b.r(kreg + r % 2)
    b.v("vmovups", kr, mem(r == 0 and "rsi" or ROW_PTR[r], c * 64))
    for h = 0, T - 1 do
      local q = q_in_regs and b.r(qbase + h) or mem("rdi", h * p.D * 4 + c * 64)
      b.v("vdpbf16ps", b.r(slot_of(b.isa, h * R + r)), q, kr)
    end
  end
end

-- Load d-block c of a K row at base as f32 into register kr (mask: the
-- register of the split loads' hi16 mask, M.bf16_split, or nil: no split;
-- raw: a register that keeps the pair's bytes from the even block's load for
-- the odd one's mask, or nil: the odd block reads them again).
local function load_k_block(b, p, mask, kr, base, c, tmp, raw, mode, s8)
  local W, NCH = b.g.W, math.floor(p.D / b.g.W)
  local pair = mem(base, math.floor(c / 2) * W * 4)
  if not mask or c >= NCH - NCH % 2 then
    load_kv(b, p.KV_DTYPE, kr, kv_mem(p, base, c * W), tmp, mode, s8)
  elseif c % 2 == 0 and b.x then
    b.v("vpslld", kr, pair, 16)
  elseif c % 2 == 0 then                       -- VEX shifts take no memory source
    b.v("vmovups", raw or kr, pair)
    b.v("vpslld", kr, raw or kr, 16)
  else
    b.v(b.pand, kr, b.r(mask), raw or pair)
  end
end

-- Point row r's register at row r of the group, or at row r-1 past the n
-- remaining keys (rcx), so a short group re-reads its last row.
local function row_pointers(b, R)
  for r = 1, R - 1 do
    local prev, cur = r == 1 and "rsi" or ROW_PTR[r - 1], ROW_PTR[r]
    b.gp(("lea (%%%s,%%r8), %%%s"):format(prev, cur))
    b.gp(("cmp $%d, %%rcx"):format(r))
    b.gp(("cmovbe %%%s, %%%s"):format(prev, cur))
  end
end

-- Whether a direct group stores its pairs of lanes by masked moves (AVX-512,
-- R = 2: tiles of 6 to 8 heads): k1 selects the low pair of a 128-bit piece,
-- k2 the high one.
local function pair_stores(b, R) return b.x and R == 2 end

-- Whether a direct group of one key (AVX2, R = 1: tiles of 5 to 8 heads)
-- puts its reduced vector (lane h: head h's score) in the stage, and every W
-- keys one W x W transpose stores each head's W scores as a whole vector of
-- its row (key_block_store), where each key took T lane moves (vmovss,
-- vextractps: a shuffle and a store each) beside the FMAs. On the Zen 3
-- VM, at tile 8 (results/bench/builds-key-blocks-amd-epyc-2c-avx2.md):
-- Falcon-40B bf16 0.950x the time warm and 0.956x cold, the MQA batch bf16
-- 0.974x and 0.977x. (A C model of Falcon's loop from L1: 0.905x; 0.85x
-- with key-major score rows, which every statement after the scores would
-- have to read.)
local function key_blocks(b, R) return not b.x and R == 1 end

-- The W key vectors at the stage (rbx) transposed into head rows (registers
-- 0 .. W-1 and spare), each of the tile's heads' W scores stored at its row (rdx).
local function key_block_store(b, p, spare)
  local W, L = b.g.W, {}
  assert(p.D >= W, "simd: the stage (W x D floats) holds no W x W key block")
  for i = 0, W - 1 do
    L[i] = i
    b.v("vmovups", b.r(i), mem("rbx", i * W * 4))
  end
  L = transpose_pass(b, W, L, spare)
  for k = 0, W - 1 do
    local t = TRANSPOSE_COLS[W][k]
    if t < p.T then b.v("vmovups", mem("rdx", t * p.CHUNKP * 4), b.r(L[k])) end
  end
end

-- The end of a key_blocks group: its vector to stage slot r9; every W keys,
-- and after the last, the block's stores (key_block_store) and rdx to the
-- next block's; back to label 1 while keys remain.
local function key_block_next(b, p, spare)
  local W = b.g.W
  b.v("vmovups", mem("rbx", 0, "r9", 1), b.r(0))
  b.gp(("add $%d, %%r9"):format(W * 4))
  b.gp("add %rax, %rsi")
  b.gp("sub $1, %rcx")
  b.gp("jle 8f")
  b.gp(("cmp $%d, %%r9"):format(W * W * 4))
  b.gp("jne 1b")
  b.gp("8:")
  key_block_store(b, p, spare)
  b.gp(("add $%d, %%rdx"):format(W * 4))
  b.gp("xor %r9, %r9")
  b.gp("test %rcx, %rcx")
  b.gp("jg 1b")
end

-- Whether a direct group stores each head's lanes by lane moves (AVX2, R =
-- 2: tiles of 3 and 4 heads), not through the scratch at rbx.
local function lane_stores(b, R) return not b.x and R == 2 end

-- Lane-move store of head h's pair of lanes (lane_stores) from their 128-bit
-- piece: the low piece is register 0's, the high one is extracted once into
-- register 1 (the tree leaves both free); vmovlps/vmovhps.
local function vex_lane_store(b, p, h)
  local lane = h * 2
  local piece = math.floor(lane / 4)
  local x = b.r(piece, "xmm")
  if piece == 1 and lane % 4 == 0 then b.v("vextractf128", x, b.r(0), 1) end
  b.v(lane % 4 == 0 and "vmovlps" or "vmovhps", mem("rdx", h * p.CHUNKP * 4), x)
end

-- Store head h's R lanes of the reduced vector (register 0) at its score row:
-- whole 128/256-bit pieces where they fit, pairs by a masked move of their
-- piece (in register 1, pair_stores), pairs on AVX2 by lane moves
-- (vex_lane_store), else through the scratch at rbx.
local function store_lanes(b, p, h, R)
  if lane_stores(b, R) then return vex_lane_store(b, p, h) end
  local m, bytes, z = mem("rdx", h * p.CHUNKP * 4), R * 4, b.r(0)
  if pair_stores(b, R) then
    local piece, high = math.floor(h / 2), h % 2 == 1
    if piece > 0 and not high then b.v("vextractf32x4", b.r(1, "xmm"), z, piece) end
    local at = mem("rdx", h * p.CHUNKP * 4 - (high and 8 or 0))
    at.mask = high and "k2" or "k1"
    b.v("vmovups", at, b.r(piece > 0 and 1 or 0, "xmm"))
    return
  end
  if bytes == 16 or bytes == 32 then
    if h == 0 then b.v("vmovups", m, b.r(0, bytes == 16 and "xmm" or "ymm"))
    elseif bytes == 32 then b.v("vextractf64x4", m, z, h)
    elseif b.x then b.v("vextractf32x4", m, z, h)
    else b.v("vextractf128", m, z, h) end
    return
  end
  for i = 0, R - 1 do
    b.gp(("movl %d(%%rbx), %%eax"):format((h * R + i) * 4))
    b.gp(("movl %%eax, %d(%%rdx)"):format(h * p.CHUNKP * 4 + i * 4))
  end
end

-- AVX2 MSD scores (the planes digit on a record with the msd16 group,
-- gen/facts.lua msd16_fits: tiles of 2 to 8 heads, groups of R = 8 / T keys
-- (direct_rows), head_dim a multiple of 16): each head's q row holds one
-- int16 plane Q (q ~= s Q, M.q_planes) and its scale s after the plane
-- (byte 2 D); each 16-element piece of a K row is widened to int16 once
-- (vpmovsxbw) and multiplied with every head's piece of Q by vpmaddwd (16
-- products summed in pairs into 8 exact int32 lanes), added up in int32
-- (below 2^31: gen/facts.lua); the sums are converted to f32 and reduced as
-- the f32 scores are, then times the keys' row scales (scaled_group) and the
-- heads' s (MSD16_QSCALE).
-- In a standalone loop of Llama's scores (4 heads, 2 keys a group, K from
-- L1) on the Zen 3 VM: 36 cycles a key against the f32 FMA scores' 61.
local MSD16_QSCALE, MSD16_TMPS = 13, { 8, 9, 10, 11, 12 }

-- Register MSD16_QSCALE = the tile's q scales in the reduced group's lanes
-- (lane h R + r: head h's, key r; R keys a group), register 8 scratch.
local function msd16_scales(b, p, R)
  local at = function(h) return mem("rdi", h * 4 * p.D + 2 * p.D) end
  local qs = b.r(MSD16_QSCALE)
  b.v("vbroadcastss", qs, at(0))
  for h = 1, p.T - 1 do
    b.v("vbroadcastss", b.r(8), at(h))
    b.v("vblendps", qs, qs, b.r(8), math.floor((2 ^ R - 1) * 2 ^ (h * R)))
  end
end

-- The int32 sums of a group of R keys (rows rsi and ROW_PTR) times the
-- tile's int16 planes, in the accumulators of the f32 scores (slot_of),
-- converted to f32 there.
local function msd16_group(b, p, R, kreg)
  local n = 0
  for c = 0, p.D / 16 - 1 do
    for r = 0, R - 1 do
      local kr = b.r(kreg + r % 2)
      b.v("vpmovsxbw", kr, mem(r == 0 and "rsi" or ROW_PTR[r], c * 16))
      for h = 0, p.T - 1 do
        local acc, q = b.r(slot_of(b.isa, h * R + r)), mem("rdi", h * 4 * p.D + c * 32)
        if c == 0 then b.v("vpmaddwd", acc, kr, q)
        else
          local tmp = b.r(MSD16_TMPS[n % #MSD16_TMPS + 1])
          n = n + 1
          b.v("vpmaddwd", tmp, kr, q)
          b.v("vpaddd", acc, acc, tmp)
        end
      end
    end
  end
  for k = 0, R * p.T - 1 do
    local acc = b.r(slot_of(b.isa, k))
    b.v("vcvtdq2ps", acc, acc)
  end
end

-- Scores without staging: groups of R keys times the T heads (R*T <= W
-- accumulators, one per key and head), K converted once per row into a
-- register, q read once per d-block; one shuffle tree reduces the group
-- (AVX2 groups of one key: stored W keys at a time, key_blocks).
local function scores_direct(isa, p, R)
  local b = new_block(isa, p)
  local W, NCH, esz, T = b.g.W, math.floor(p.D / b.g.W), ELEM[p.KV_DTYPE], p.T
  local kreg = GEOM[isa].nregs - 2
  local qbase = W
  local dp = M.dpbf16(isa, p)
  local q_in_regs, mask = direct_regs(isa, p, M.bf16_split(isa, p))
  -- AVX2 split loads: R registers below the K ones keep each row's pair
  -- for its odd block where they are free (above the mask), one load per
  -- pair instead of two. On the Zen 3 VM, warm, tile 4, against the odd
  -- block's second load: Llama bf16 0.965-0.968x the time, the MQA batch
  -- 0.968-0.974x, Falcon-40B bf16 0.985-0.996x; cold, the MQA batch 0.979x,
  -- Falcon 0.986x, Llama 64k 1.000x. (The same in the P.V, the scratch
  -- holding the pair: Falcon 0.985x but Llama and the MQA batch 1.03x.)
  local raw_regs = mask and not b.x and kreg - R > mask and kreg - R or nil
  prologue(b, { "src", "ptr", "sc", "n", "stride", "stage" }, true)
  b.gp("push %r15")
  local scaled = M.direct_scaled(isa, p)
  if scaled then
    b.gp(("mov %d(%%rax), %%r12"):format(ARG.scl))
    b.gp(("mov %d(%%rax), %%r13"):format(ARG.scl_stride))
  end
  local btmp = block_consts(b, p, W + (q_in_regs and T or 0), "r15")   -- r15: a row pointer from label 1 on
  -- block dtypes: each row's block scale in a register of its own (row 0
  -- btmp, the others the free ones below the K registers) where they fit,
  -- converted at a block's first d-block only (scale_mode); q4_0 also 8
  -- times it in a register per row, the next free ones (block_load's s8)
  local srow, s8row
  if btmp then
    local free = W + (q_in_regs and T or 0) + block_regs(p)
    if R == 1 or kreg - free >= R - 1 then
      srow = function(r) return r == 0 and btmp or b.r(free + r - 1) end
      if folds_eight(p) and kreg - free >= 2 * R - 1 then s8row = function(r) return b.r(free + R - 1 + r) end end
    end
  end
  local pf = R <= 5 and p.T >= M.PREFETCH_MIN_TILE
  if pf then b.gp(("mov %d(%%rax), %%r14"):format(ARG.pf)) end
  if pair_stores(b, R) then
    b.gp("mov $3, %r11d")
    b.v("kmovw", "k1", "r11d")
    b.gp("mov $12, %r11d")
    b.v("kmovw", "k2", "r11d")
  end
  if mask then
    b.gp(("mov %d(%%rax), %%r11"):format(ARG.consts))
    b.v("vmovups", b.r(mask), mem("r11", C.hi16))
  elseif dp then
    b.gp(("mov %d(%%rax), %%r11"):format(ARG.scl))
    b.v("vbroadcastss", b.r(29), mem("r11", 0))
  end
  local m16 = M.msd(isa, p)   -- AVX2 MSD: q one int16 plane, K widened to int16 (msd16_group)
  if m16 then msd16_scales(b, p, R) end
  b.gp(("imul $%d, %%r8, %%rax"):format(R))
  if key_blocks(b, R) then b.gp("xor %r9, %r9") end
  b.gp("test %rcx, %rcx")
  b.gp("jle 9f")
  b.gp("1:")
  row_pointers(b, R)
  if pf then
    for _ = 1, R do prefetch_row(b, p, "r14") end
    -- (NO_AHEAD: the variant paged kernels call on the last AHEAD rows of a
    -- page piece, whose rows ahead would be another page's or head's)
    local ahead = 1
    while ahead * R < M.K_ROWS_AHEAD do ahead = ahead * 2 end
    if not p.NO_AHEAD then prefetch_group_ahead(b, p, R, ahead) end
  end
  for c = 0, (dp or m16) and -1 or NCH - 1 do
    if q_in_regs then
      for h = 0, T - 1 do b.v("vmovups", b.r(qbase + h), mem("rdi", (h * p.D + c * W) * 4)) end
    end
    for r = 0, R - 1 do
      local kr = b.r(kreg + r % 2)
      local stmp, smode = btmp, nil
      if srow then stmp, smode = srow(r), scale_mode(b, p, c) end
      load_k_block(b, p, mask, kr, r == 0 and "rsi" or ROW_PTR[r], c, stmp, raw_regs and b.r(raw_regs + r), smode,
                   s8row and s8row(r))
      for h = 0, T - 1 do
        local acc = b.r(slot_of(isa, h * R + r))
        local q = q_in_regs and b.r(qbase + h) or mem("rdi", (h * p.D + c * W) * 4)
        if c == 0 then b.v("vmulps", acc, kr, q) else b.v("vfmadd231ps", acc, kr, q) end
      end
    end
  end
  for L = dp and 0 or R * T, W - 1 do
    local z = b.r(slot_of(isa, L), "xmm")
    b.v("vxorps", z, z, z)
  end
  for c = 0, dp and math.floor(p.D / 32) - 1 or -1 do dpbf16_block(b, p, R, c, kreg, qbase, q_in_regs) end
  if m16 then msd16_group(b, p, R, kreg) end
  tree(b, kreg)
  if scaled then scaled_group(b, R) end
  if dp then b.v("vmulps", b.r(0), b.r(0), b.r(29)) end
  if m16 then b.v("vmulps", b.r(0), b.r(0), b.r(MSD16_QSCALE)) end
  if key_blocks(b, R) then
    key_block_next(b, p, kreg)
  else
    local scratch = R * 4 ~= 16 and R * 4 ~= 32 and not pair_stores(b, R) and not lane_stores(b, R)
    if scratch then   -- the scalar moves go through eax
      b.v("vmovups", mem("rbx", 0), b.r(0))
      b.gp("push %rax")
    end
    for h = 0, T - 1 do store_lanes(b, p, h, R) end
    if scratch then b.gp("pop %rax") end
    b.gp("add %rax, %rsi")
    b.gp(("add $%d, %%rdx"):format(R * 4))
    b.gp(("sub $%d, %%rcx"):format(R))
    b.gp("jg 1b")
  end
  b.gp("9:")
  b.gp("pop %r15")
  restore_regs(b)
  return M.statement(b)
end

-- Rows the direct scores kernel prefetches ahead of the current group (0:
-- it prefetches none): its lookahead, M.K_ROWS_AHEAD rounded up to whole
-- groups (a power of two of them).
function M.ahead_rows(isa, p)
  local R = not M.head_lanes(isa, p) and M.direct_rows(isa, p)
  if not R or R > 5 or p.T < M.PREFETCH_MIN_TILE then return 0 end
  local ahead = 1
  while ahead * R < M.K_ROWS_AHEAD do ahead = ahead * 2 end
  return ahead * R
end

-- Whether a tile is a head-lane tile: AVX-512 with T = 16 (one zmm of heads).
-- Scores, max, exp and the P.V weights then keep one lane per head: scores
-- are key-major (sc[i * 16 + t]), which needs no reduction tree, and one
-- vector op serves every head of the softmax. Not for int8/fp8 (their per-key
-- scales stay in the staged kernel). Measured slower for 8 heads in ymm (AVX2
-- or AVX-512, one broadcast load per 8-lane FMA) than the direct kernel.
function M.head_lanes(isa, p)
  return GEOM[isa].head_lane_tile == p.T and not p.QUANT
end

-- Keys per group of the head-lane scores kernel, and q columns per d-block:
-- 8 and 16 with f32 FMAs; 16 and 8 with vdpbf16ps, whose 6-cycle latency
-- (Zen 5) needs 12 or more independent accumulators to issue 2 per cycle
-- (8 chains: 5.7 G/s per core, 16: 8.6 G/s, measured).
local function hl_group(dp)
  if dp then return 16, 8 end
  return 8, 16
end

-- Whether the head-lane dpbf16 scores read a whole group's K rows in place
-- (broadcast from the rows, no staging copy): AVX-512 with vdpbf16ps; a group
-- short of 16 rows (the chunk's tail) is still staged, so no row past n is read.
function M.hl_direct(isa, p)
  return M.head_lanes(isa, p) and M.dpbf16(isa, p)
end

-- Row r of a direct head-lane group: rows 3k .. 3k + 2 from base k (rsi,
-- then HL_BASES[k], each 3 rows past the last) and 0, 1 or 2 strides (r8).
local HL_BASES = { "r9", "r10", "r12", "r13", "r15" }
local function hl_row(r, disp)
  local k, j = math.floor(r / 3), r % 3
  return mem(k == 0 and "rsi" or HL_BASES[k], disp, j > 0 and "r8" or nil, j > 0 and j or nil, true)
end

-- The group's dot products: acc[r] (register r) += q column (registers KG ..)
-- times row r's K at d, the row's operand from at(r, byte offset) (a
-- broadcast); then the scale (dp) and the stores of the KG score vectors.
local function hl_dots(b, p, KG, QC, dp, at, between)
  local T = p.T
  for r = 0, KG - 1 do
    local z = b.r(r, "xmm")
    b.v("vxorps", z, z, z)
  end
  local step = dp and 2 or 1   -- d-steps per q column register
  local steps = math.ceil(p.D / (QC * step))
  for d0 = 0, p.D - 1, QC * step do
    if between then between(math.floor(d0 / (QC * step)), steps) end
    for j = 0, QC - 1 do b.v("vmovups", b.r(KG + j), mem("rdi", (math.floor(d0 / step) + j) * T * 4)) end
    for j = 0, QC - 1 do
      for r = 0, KG - 1 do
        if dp then b.v("vdpbf16ps", b.r(r), b.r(KG + j), at(r, (d0 + 2 * j) * 2))
        else b.v("vfmadd231ps", b.r(r), b.r(KG + j), at(r, (d0 + j) * 4)) end
      end
    end
  end
  for r = 0, KG - 1 do
    if dp then b.v("vmulps", b.r(r), b.r(r), b.r(KG + QC)) end
    b.v("vmovups", mem("rdx", r * T * 4), b.r(r))
  end
  b.gp(("add $%d, %%rdx"):format(KG * T * 4))
end

-- A direct group of 16 rows (M.hl_direct): the row bases, the V prefetch of
-- its 16 keys, the dot products from the rows in place, rsi past the group.
local function hl_direct_group(b, p, KG, QC)
  local prev = "rsi"
  for _, base in ipairs(HL_BASES) do
    b.gp(("lea (%%%s,%%rax), %%%s"):format(prev, base))
    prev = base
  end
  -- the V prefetches of the group's rows spread over its d-steps
  local function prefetches(step, steps)
    local from, to = math.floor(step * KG / steps), math.floor((step + 1) * KG / steps)
    for _ = from + 1, to do prefetch_row(b, p, "r14") end
  end
  hl_dots(b, p, KG, QC, true, hl_row, prefetches)
  b.gp("lea (%r15,%r8), %rsi")
  b.gp(("sub $%d, %%rcx"):format(KG))
end

-- Head-lane scores: KG K rows (hl_group) are staged as f32 (or, with
-- dpbf16, a whole group read in place: M.hl_direct), then for each d
-- acc[r] += q column d (the 16 heads' q[t][d]) * K[r][d] broadcast from the
-- stage; acc[r] is the score vector of key r, stored at sc[(i + r) * 16].
-- A short last group leaves stale staged rows; their rows of sc are never read.
-- With dpbf16 (M.dpbf16), the rows are staged as raw bf16 and each q column
-- register holds the pairs (q[t][2j], q[t][2j+1]) of the 16 heads: one
-- vdpbf16ps with K[r][2j..2j+1] broadcast adds two d-steps; the scale follows.
-- (The direct groups keep 3 row strides in rax.)
local function scores_hl(isa, p)
  local b = new_block(isa, p)
  local dp, direct = M.dpbf16(isa, p), M.hl_direct(isa, p)
  local KG, QC = hl_group(dp)
  prologue(b, dp and { "src", "ptr", "sc", "n", "stride", "scl", "consts", "stage", "pf" }
                 or { "src", "ptr", "sc", "n", "stride", "consts", "stage", "pf" }, true)
  if dp then b.v("vbroadcastss", b.r(KG + QC), mem("r9", 0)) end
  if direct then
    b.gp("push %r15")
    b.gp("imul $3, %r8, %rax")
  end
  b.gp("test %rcx, %rcx")
  b.gp("jz 9f")
  b.gp("1:")
  if direct then
    b.gp(("cmp $%d, %%rcx"):format(KG))
    b.gp("jb 3f")
    hl_direct_group(b, p, KG, QC)
    b.gp("jmp 4f")
    b.gp("3:")
  end
  stage_group(b, p, KG, dp)
  hl_dots(b, p, KG, QC, dp, function(r, disp)
    return mem("rbx", r * p.D * 4 + disp, nil, nil, true)
  end)
  if not direct then return close_group_loop(b) end
  b.gp("4:")
  b.gp("test %rcx, %rcx")
  b.gp("jnz 1b")
  b.gp("9:")
  b.gp("pop %r15")
  restore_regs(b)
  return M.statement(b)
end

-- MSD scores (the key's planes digit, M.msd): groups of 16 int8 K rows are
-- staged as u8 (xor 0x80: k + 128), their row scales beside them, then
-- transposed by dwords so that vector c holds bytes 4c..4c+3 of the 16 rows
-- (lane i: key i). Each head's q is held as int8 planes (templates/decode.c.tpl:
-- q ~= s (q0 + q1 2^-7 + q2 2^-14)); one vpdpbusd per (dword c, head, plane)
-- adds 4 products of every key, the plane's dword broadcast. Each int32 sum
-- starts at the plane's -128 sum(plane) (the +128 taken back), so the sums are
-- exact; they are converted to f32, recombined with the plane scales and
-- multiplied by the rows' scales. Lanes past n hold scores of stale rows.
-- Stage: rows at 0 (16 D bytes), the transposed dwords at 16 D, scales at 32 D.
-- Per head, at q + h 4D bytes: planes (D bytes each), then P int32 biases,
-- then P f32 scales.
M.MSD_ACCS = 30     -- int32 accumulators (z0..z29); z30, z31 hold K dwords

-- Whether key fields p take MSD scores: the planes digit (gen/key.lua checks the rest).
function M.msd(isa, p)
  return (p.PLANES or 0) > 0
end


-- 16 x 16 dword transposes of nblk blocks: block blk's 16 rows loaded from
-- row_at(i, blk) (memory operands), and its output column col (16 blk + the
-- column an output register holds) stored at col_at(col) where col < ncols.
local function transpose_blocks(b, nblk, row_at, col_at, ncols)
  for blk = 0, nblk - 1 do
    local L = {}
    for i = 0, 15 do
      L[i] = i
      b.v("vmovups", b.r(i), row_at(i, blk))
    end
    L = transpose_pass(b, 16, L, 16)
    for k = 0, 15 do
      local col = 16 * blk + TRANSPOSE_COLS[16][k]
      if col < ncols then b.v("vmovups", col_at(col), b.r(L[k])) end
    end
  end
end

-- Whether qload's f32 rows of a head-lane tile are transposed by q_columns:
-- 16 heads of 16 lanes (else the template's C loop does it).
function M.q_columns_simd(isa, p)
  return p.HL == true and GEOM[isa].W == 16 and p.T == 16
end

-- Head-lane q columns (M.q_columns_simd): the T = 16 f32 rows of D floats at
-- src into ptr[d][t] = src[t][d], by 16 x 16 transposes.
function M.q_columns(isa, p)
  local b = new_block(isa, p)
  prologue(b, { "src", "ptr" })
  transpose_blocks(b, p.D / 16, function(i, blk) return mem("rsi", i * p.D * 4 + 64 * blk) end,
    function(col) return mem("rdi", 64 * col) end, p.D)
  return M.statement(b)
end

-- Stage the group's rows (count in r12) as u8 at rbx and their scales at
-- rbx + 32 D (register 30 holds 0x80 bytes), prefetching the other stream.
local function msd_stage(b, p)
  local D = p.D
  b.v("vmovups", b.r(30), mem("r11", C.x80))
  b.gp("mov %rbx, %r13")
  b.gp(("lea %d(%%rbx), %%rax"):format(32 * D))
  b.gp("5:")
  local o = 0
  while o < D do
    local len = D - o >= 64 and 64 or D - o >= 32 and 32 or 16
    local kind = len == 64 and "zmm" or len == 32 and "ymm" or "xmm"
    b.v("vpxord", b.r(16, kind), b.r(30, kind), mem("rsi", o))
    b.v("vmovups", mem("r13", o), b.r(16, kind))
    o = o + len
  end
  b.v("vmovss", b.r(17, "xmm"), mem("r9", 0))
  b.v("vmovss", mem("rax", 0), b.r(17, "xmm"))
  b.gp("add $4, %rax")
  prefetch_row(b, p, "r14")
  b.gp("add %r8, %rsi")
  b.gp(("add $%d, %%r13"):format(D))
  b.gp("add %r10, %r9")
  b.gp("dec %r12")
  b.gp("jnz 5b")
end

-- Transpose the staged rows by dwords into rbx + 16 D: vector c = dword c of the 16 rows.
local function msd_transpose(b, p)
  local D, nd = p.D, p.D / 4
  transpose_blocks(b, math.ceil(nd / 16), function(i, blk) return mem("rbx", i * D + 64 * blk) end,
    function(col) return mem("rbx", 16 * D + 64 * col) end, nd)
end

-- Start the int32 sums acc(h, j) of heads [h0, h1) at their planes' biases.
local function msd_sums_init(b, p, acc, h0, h1)
  for h = h0, h1 - 1 do
    for j = 0, p.PLANES - 1 do b.v("vpbroadcastd", acc(h, j), mem("rdi", h * 4 * p.D + p.PLANES * p.D + 4 * j)) end
  end
end

-- One dword column c of the group (register kz, u8) into the sums of heads [h0, h1).
local function msd_column(b, p, acc, h0, h1, kz, c)
  for h = h0, h1 - 1 do
    for j = 0, p.PLANES - 1 do
      b.v("vpdpbusd", acc(h, j), kz, mem("rdi", h * 4 * p.D + j * p.D + 4 * c, nil, nil, true))
    end
  end
end

-- The sums of heads [h0, h1) recombined into f32 scores with the plane
-- scales, times the group's row scales (rbx + 32 D), stored at their score rows.
local function msd_recombine(b, p, acc, h0, h1)
  local D, P = p.D, p.PLANES
  for h = h0, h1 - 1 do
    local a0, sc = acc(h, 0), h * 4 * D + P * D + 4 * P
    b.v("vcvtdq2ps", a0, a0)
    b.v("vmulps", a0, a0, mem("rdi", sc, nil, nil, true))
    for j = 1, P - 1 do
      b.v("vcvtdq2ps", acc(h, j), acc(h, j))
      b.v("vfmadd231ps", a0, acc(h, j), mem("rdi", sc + 4 * j, nil, nil, true))
    end
    b.v("vmulps", a0, a0, mem("rbx", 32 * D))
    b.v("vmovups", mem("rdx", h * p.CHUNKP * 4), a0)
  end
end

-- The int32 sums of heads [h0, h1) over the staged group, recombined per head
-- into f32 scores times the row scales and stored at their score rows.
local function msd_heads(b, p, h0, h1)
  local D, P = p.D, p.PLANES
  local function acc(h, j) return b.r((h - h0) * P + j) end
  msd_sums_init(b, p, acc, h0, h1)
  for c = 0, D / 4 - 1 do
    local kz = b.r(30 + c % 2)
    b.v("vmovups", kz, mem("rbx", 16 * D + 64 * c))
    msd_column(b, p, acc, h0, h1, kz, c)
  end
  msd_recombine(b, p, acc, h0, h1)
end

-- Whether the MSD scores take a whole group of 16 keys straight from the
-- cache (msd_direct_group): rows of whole 64-byte pieces (D a multiple of
-- 64: no read past a row) and the tile's T x P int32 sums in z17..z29,
-- beside the 16 rows and the spare of a transpose (z0..z16) and 0x80 (z30).
local function msd_direct(p) return p.D % 64 == 0 and p.T * p.PLANES <= 13 end

-- The 16 row scales of a whole group (r9, r10 bytes apart) at rbx + 32 D:
-- one vector move where they are contiguous (r10 = 4), else one at a time.
local function msd_group_scales(b, p)
  b.gp("cmp $4, %r10")
  b.gp("jne 7f")
  b.v("vmovups", "zmm31", mem("r9", 0))
  b.v("vmovups", mem("rbx", 32 * p.D), "zmm31")
  b.gp("add $64, %r9")
  b.gp("jmp 8f")
  b.gp("7:")
  b.gp(("lea %d(%%rbx), %%rax"):format(32 * p.D))
  b.gp("mov $16, %r12")
  b.gp("6:")
  b.v("vmovss", "xmm31", mem("r9", 0))
  b.v("vmovss", mem("rax", 0), "xmm31")
  b.gp("add $4, %rax")
  b.gp("add %r10, %r9")
  b.gp("dec %r12")
  b.gp("jnz 6b")
  b.gp("8:")
end

-- MSD scores of a whole group of 16 rows at rsi (r8 bytes apart) without
-- staging: each 64-byte piece of the 16 rows is loaded into z0..z15 made u8
-- (xor 0x80 in the load: a byte's xor moves with it through the transpose)
-- and transposed by dwords in registers (transpose_pass), each dword column
-- dotted with every head's planes there; the sums are recombined as
-- msd_heads does. The same int32 sums, in the same order,
-- as the staged path. rsi ends 16 rows on, r14 (the other stream) too.
local function msd_direct_group(b, p)
  local P, T = p.PLANES, p.T
  local function acc(h, j) return b.r(17 + h * P + j) end
  msd_group_scales(b, p)
  msd_sums_init(b, p, acc, 0, T)
  for blk = 0, p.D / 64 - 1 do
    b.gp("mov %rsi, %rax")
    local L = {}
    for i = 0, 15 do
      L[i] = i
      b.v("vpxord", b.r(i), b.r(30), mem("rax", 64 * blk))
      b.gp("add %r8, %rax")
    end
    L = transpose_pass(b, 16, L, 16)
    for k = 0, 15 do msd_column(b, p, acc, 0, T, b.r(L[k]), 16 * blk + TRANSPOSE_COLS[16][k]) end
  end
  b.gp("mov %rax, %rsi")
  for _ = 1, 16 do prefetch_row(b, p, "r14") end
  msd_recombine(b, p, acc, 0, T)
end

-- The MSD scores statement (see above): per group of 16 keys, stage, transpose,
-- then the heads in sub-tiles of MSD_ACCS / planes; whole groups straight
-- from the cache where msd_direct (D 128, 4 heads, 3 planes: 39 vector
-- instructions per key instead of 47, no staged rows and no transposed
-- copy), the last short group staged.
local function scores_msd(isa, p)
  local b = new_block(isa, p)
  prologue(b, { "src", "ptr", "sc", "n", "stride", "scl", "scl_stride", "consts", "stage", "pf" }, true)
  b.gp("test %rcx, %rcx")
  b.gp("jz 9f")
  b.gp("1:")
  if msd_direct(p) then
    b.gp("cmp $16, %rcx")
    b.gp("jb 2f")
    b.v("vmovups", b.r(30), mem("r11", C.x80))
    msd_direct_group(b, p)
    b.gp("sub $16, %rcx")
    b.gp("add $64, %rdx")
    b.gp("jmp 4f")
    b.gp("2:")
  end
  b.gp("mov $16, %r12")
  b.gp("cmp %r12, %rcx")
  b.gp("cmovb %rcx, %r12")
  b.gp("sub %r12, %rcx")
  msd_stage(b, p)
  msd_transpose(b, p)
  local HT = math.floor(M.MSD_ACCS / p.PLANES)
  for h0 = 0, p.T - 1, HT do msd_heads(b, p, h0, math.min(p.T, h0 + HT)) end
  b.gp("add $64, %rdx")
  b.gp("4:")
  return close_group_loop(b)
end

-- Scores of one tile pass over the chunk's n keys: the direct kernel where it
-- applies; else groups of W keys are staged as f32, then each head's W dot
-- products are accumulated in W registers and reduced together by a shuffle
-- tree (no per-key horizontal sums). Lanes past n hold scores of stale staged
-- rows (or repeated last rows); the caller pads them.
function M.scores(isa, p)
  if M.msd(isa, p) and evex(GEOM[isa]) then return scores_msd(isa, p) end
  if M.head_lanes(isa, p) then return scores_hl(isa, p) end
  local R = M.direct_rows(isa, p)
  if R then return scores_direct(isa, p, R) end
  local b = new_block(isa, p)
  local W = b.g.W
  prologue(b, { "src", "ptr", "sc", "n", "stride", "scl", "scl_stride", "consts", "stage", "pf" }, true)
  b.gp("test %rcx, %rcx")
  b.gp("jz 9f")
  b.gp("1:")
  stage_group(b, p, W)
  b.gp("mov %rdi, %rax")
  b.gp("mov %rdx, %r12")
  b.gp(("mov $%d, %%r13"):format(p.T))
  b.gp("6:")
  head_dots(b, p)
  b.gp(("add $%d, %%rax"):format(p.D * 4))
  b.gp(("add $%d, %%r12"):format(p.CHUNKP * 4))
  b.gp("dec %r13")
  b.gp("jnz 6b")
  b.gp(("add $%d, %%rdx"):format(W * 4))
  return close_group_loop(b)
end

-- The score rows of a softmax statement, each as (offset in bytes from ptr,
-- lane of *in and *out): the T padded rows of a row-major tile, or the one
-- key-major row of a head-lane tile (its lanes are the heads).
local function softmax_rows(isa, p)
  if M.head_lanes(isa, p) then return { 0 } end
  local rows = {}
  for t = 0, p.T - 1 do rows[#rows + 1] = t * p.CHUNKP * 4 end
  return rows
end

-- Head t's value of a per-head vector at (rsi) into register n: a broadcast of
-- lane t, or the whole T-float vector of a head-lane tile.
local function head_value(b, hl, n, t)
  if hl then b.v("vmovups", b.r(n), mem("rsi", 0)) else b.v("vbroadcastss", b.r(n), mem("rsi", t * 4)) end
end

-- Store the result of register n for head t at (rdx): its reduced lowest lane
-- (op vmaxps or vaddps, scratch s), or the whole vector of a head-lane tile.
local function head_result(b, hl, n, t, s, op)
  if hl then b.v("vmovups", mem("rdx", 0), b.r(n)); return end
  reduce(b, n, s, op)
  b.v("vmovss", mem("rdx", t * 4), b.r(n, "xmm"))
end

-- A softmax statement: pre(b, hl) once (when given), then for each score row
-- (softmax_rows, or rows: their count; the code once, in a run-time loop)
-- start(b, hl, 0), step(b) on every vector of the row (at r9; n floats,
-- counted in r10), then finish(b, hl, 0); rsi points at the row's in, rdx
-- at its out (a head's lane: each row moves them on by one float).
local function softmax_statement(isa, p, fields, start, step, finish, rows, pre)
  local hl = M.head_lanes(isa, p)
  local b = new_block(isa, p)
  rows = rows or softmax_rows(isa, p)
  prologue(b, fields)
  b.gp(("mov %d(%%rax), %%rsi"):format(ARG.inp))
  b.gp(("mov %d(%%rax), %%rdx"):format(ARG.out))
  if pre then pre(b, hl) end
  -- the rows (CHUNKP floats apart) in a run-time loop over one copy of the
  -- code, counted in rax: in, out and the row advance a head each time
  if #rows > 1 then
    b.gp(("mov $%d, %%rax"):format(#rows))
    b.gp("2:")
  end
  start(b, hl, 0)
  b.gp("mov %rdi, %r9")
  b.gp("mov %rcx, %r10")
  b.gp("1:")
  step(b)
  b.gp(("add $%d, %%r9"):format(b.g.W * 4))
  b.gp(("sub $%d, %%r10"):format(b.g.W))
  b.gp("jnz 1b")
  finish(b, hl, 0)
  if #rows > 1 then
    b.gp("add $4, %rsi")
    b.gp("add $4, %rdx")
    b.gp(("add $%d, %%rdi"):format(p.CHUNKP * 4))
    b.gp("dec %rax")
    b.gp("jnz 2b")
  end
  return M.statement(b)
end

-- Accumulators of the head-lane running max: one vmaxps chain each, so a
-- chunk's keys wait on a quarter of the vmaxps latencies of one chain.
M.MAX_CHAINS = 4

-- The end of a loop over a tile's state records: rdi to the next record,
-- the counter register down by one, and back to label while it is not 0.
local function next_record(b, p, counter, label)
  b.gp(("add $%d, %%rdi"):format(p.REC * 4))
  b.gp(("dec %%%s"):format(counter))
  b.gp("jnz " .. label)
end

-- The D accumulators of the state record at rdi times vector register f,
-- in place, through registers r0 and r0 + 1.
local function scale_row(b, p, f, r0)
  for c = 0, p.D / b.g.W - 1 do
    local a, m = b.r(r0 + c % 2), mem("rdi", c * b.g.W * 4)
    b.v("vmulps", a, b.r(f), m)
    b.v("vmovups", m, a)
  end
end

-- The T floats of the tile's records at (rsi) + off bytes, head t's REC
-- floats after head t - 1's, into lanes 0..T-1 of register n, through the T
-- floats at (rdx) + at.
local function records_lanes(b, p, off, n, at)
  for t = 0, p.T - 1 do
    b.v("vmovss", b.r(n, "xmm"), mem("rsi", off + t * p.REC * 4))
    b.v("vmovss", mem("rdx", at + t * 4), b.r(n, "xmm"))
  end
  b.v("vmovups", b.r(n), mem("rdx", at))
end

-- Running max of a head-lane tile's key-major row (n floats, a multiple of
-- W: one vector per key, its lanes the heads), from the maxima in the tile's
-- records (in: head 0's m, the heads REC floats apart): out[0..T-1] the new
-- maxima, out[T..2T-1] the old. M.MAX_CHAINS chains over runs of that many
-- keys, the rest on chain 0.
local function max_lanes(isa, p)
  local b = new_block(isa, p)
  local W, K = b.g.W, M.MAX_CHAINS
  prologue(b, { "ptr", "n" })
  b.gp(("mov %d(%%rax), %%rsi"):format(ARG.inp))
  b.gp(("mov %d(%%rax), %%rdx"):format(ARG.out))
  records_lanes(b, p, 0, 0, W * 4)
  for k = 1, K - 1 do b.v("vmovaps", b.r(k), b.r(0)) end
  b.gp(("cmp $%d, %%rcx"):format(K * W))
  b.gp("jb 2f")
  b.gp("1:")
  for k = 0, K - 1 do b.v("vmaxps", b.r(k), b.r(k), mem("rdi", k * W * 4)) end
  b.gp(("add $%d, %%rdi"):format(K * W * 4))
  b.gp(("sub $%d, %%rcx"):format(K * W))
  b.gp(("cmp $%d, %%rcx"):format(K * W))
  b.gp("jae 1b")
  b.gp("2:")
  b.gp("test %rcx, %rcx")
  b.gp("jz 4f")
  b.gp("3:")
  b.v("vmaxps", b.r(0), b.r(0), mem("rdi", 0))
  b.gp(("add $%d, %%rdi"):format(W * 4))
  b.gp(("sub $%d, %%rcx"):format(W))
  b.gp("jnz 3b")
  b.gp("4:")
  for k = 1, K - 1 do b.v("vmaxps", b.r(0), b.r(0), b.r(k)) end
  b.v("vmovups", mem("rdx", 0), b.r(0))
  return M.statement(b)
end

-- Running max of each head's padded score row (n floats, a multiple of W), from
-- in[t] into out[t]. Head-lane tiles: one key-major row of n floats, in and out
-- T-float vectors.
function M.max(isa, p)
  if M.head_lanes(isa, p) then return max_lanes(isa, p) end
  return softmax_statement(isa, p, { "ptr", "n" },
    function(b, hl, t) head_value(b, hl, 0, t) end,
    function(b) b.v("vmaxps", b.r(0), b.r(0), mem("r9", 0)) end,
    function(b, hl, t) head_result(b, hl, 0, t, 1, "vmaxps") end)
end

-- The exp's core (M.EXP2_COEFS) on register x, clobbered: register n =
-- round(x log2 e), register p = 2^f 2^-P_SHIFT, f = x log2 e - n; the caller
-- scales p by 2^n.
local function exp_core(b, x, n, p)
  local r = b.r
  b.v("vmulps", r(x), r(x), mem("r11", C.log2e))
  b.v(evex(GEOM[b.isa]) and "vrndscaleps" or "vroundps", r(n), r(x), 8)
  b.v("vsubps", r(x), r(x), r(n))
  local top = #M.EXP2_COEFS - 1
  b.v("vmovups", r(p), mem("r11", C["e" .. top]))
  for i = top - 1, 0, -1 do b.v("vfmadd213ps", r(p), r(x), mem("r11", C["e" .. i])) end
end

-- A head-lane tile's exp bases at out (rdx): the lanes of register src, 0
-- where -inf (a head whose keys are all masked keeps weights 0); register 2 scratch.
local function store_bases(b, src)
  b.v("vcmpps", "k1", b.r(src), mem("r11", C.ninf), 4)      -- NEQ_UQ: not -inf
  b.v("vmovaps", b.r(2) .. "{k1}{z}", b.r(src))
  b.v("vmovups", mem("rdx", 0), b.r(2))
end

-- The online-softmax step of a head-lane tile after its max statement (in:
-- its out, the new maxima then the old; ptr: the tile's records). Where no
-- head's max grew past its record's m + GROW_SLACK, nothing changes and
-- out[0..T-1] = each record's m (the exp bases; 0 where -inf: a head whose
-- keys are all masked keeps weights 0). Else out[0..T-1] = each head's new
-- max (0 where -inf) and every head's record takes m = its new max, l and acc
-- times c, out[T..2T-1] = c = e^(old - new) (0 below min_x, P_MIN_X, and for
-- an old -inf, NaN for NaN, 1 where it did not grow), as portable C's fd_expf
-- with the softmax's polynomial.
function M.grow_lanes(isa, p)
  local b = new_block(isa, p)
  local r, W = b.r, b.g.W
  prologue(b, { "ptr", "consts" })
  b.gp(("mov %d(%%rax), %%rsi"):format(ARG.inp))
  b.gp(("mov %d(%%rax), %%rdx"):format(ARG.out))
  b.v("vmovups", r(0), mem("rsi", 0))                       -- 0: new max
  b.v("vmovups", r(1), mem("rsi", W * 4))                   -- 1: old max
  b.v("vaddps", r(2), r(1), mem("r11", C.grow_slack))
  b.v("vcmpps", "k1", r(0), r(2), 0x16)                     -- NLE_UQ: new > old + slack, or NaN
  b.v("kortestw", "k1", "k1")
  b.gp("jnz 5f")
  store_bases(b, 1)                                         -- the records' m
  b.gp("jmp 9f")
  b.gp("5:")
  store_bases(b, 0)                                         -- the new maxima
  b.v("vcmpps", "k1", r(1), r(0), 4)                        -- grew (both -inf: no)
  b.v("kmovw", "r8d", "k1")
  b.v("vsubps", r(3), r(1), r(0))                           -- 3: x = old - new
  b.v("vcmpps", "k1", r(3), mem("r11", C.min_x), 0x15)      -- NLT_UQ: min_x <= x, or NaN
  exp_core(b, 3, 4, 5)                                      -- 4: n, 5: e^x * 2^-P_SHIFT / 2^n
  b.v("vaddps", r(4), r(4), mem("r11", C.p_shift))
  b.v("vscalefps", r(5) .. "{k1}{z}", r(5), r(4))          -- 0 below min_x (masked: no underflow)
  b.v("kmovw", "k1", "r8d")
  b.v("vmovups", r(6), mem("r11", C.one_f))
  b.v("vmovaps", r(6) .. "{k1}", r(5))                      -- 6: c
  b.v("vmovups", mem("rdx", W * 4), r(6))
  b.gp(("mov $%d, %%rax"):format(p.T))
  b.gp("2:")
  b.v("vmovss", r(2, "xmm"), mem("rsi", 0))
  b.v("vmovss", mem("rdi", p.D * 4), r(2, "xmm"))
  b.v("vbroadcastss", r(2), mem("rdx", W * 4))
  b.v("vmulss", r(3, "xmm"), r(2, "xmm"), mem("rdi", (p.D + 1) * 4))
  b.v("vmovss", mem("rdi", (p.D + 1) * 4), r(3, "xmm"))
  scale_row(b, p, 2, 4)
  b.gp("add $4, %rsi")
  b.gp("add $4, %rdx")
  next_record(b, p, "rax", "2b")
  b.gp("9:")
  return M.statement(b)
end

-- A head-lane tile's sums of weights into its records: l of head t (at ptr
-- + t REC + D + 1 floats) += in[t].
function M.sums_lanes(isa, p)
  local b = new_block(isa, p)
  prologue(b, { "ptr" })
  b.gp(("mov %d(%%rax), %%rsi"):format(ARG.inp))
  for t = 0, p.T - 1 do
    local l = mem("rdi", (t * p.REC + p.D + 1) * 4)
    b.v("vmovss", b.r(t % 4, "xmm"), mem("rsi", t * 4))
    b.v("vaddss", b.r(t % 4, "xmm"), b.r(t % 4, "xmm"), l)
    b.v("vmovss", l, b.r(t % 4, "xmm"))
  end
  return M.statement(b)
end

-- p = e^x * 2^-P_SHIFT in place for the vector at r9, x = (it - register 1),
-- added to register 2 (register 8 holds min_x). Arguments below P_MIN_X (and
-- -inf) give exactly 0, NaN gives NaN: exp_core, scaled by 2^n.
local function exp_step(b)
  local r, isa = b.r, b.isa
  b.v("vmovups", r(3), mem("r9", 0))                       -- 3: x
  b.v("vsubps", r(3), r(3), r(1))
  -- keep x >= min_x and NaN (predicate NLT_UQ: not less than, or unordered)
  if evex(GEOM[isa]) then b.v("vcmpps", "k1", r(3), mem("r11", C.min_x), 0x15)
  else b.v("vcmpps", r(7), r(3), mem("r11", C.min_x), 0x15) end
  b.v("vmaxps", r(3), r(8), r(3))                          -- a NaN x, the second operand, passes
  exp_core(b, 3, 4, 5)                                     -- 4: n, 5: p
  if evex(GEOM[isa]) then
    b.v("vscalefps", r(5) .. "{k1}{z}", r(5), r(4))       -- 0 below min_x (masked: no underflow)
  else
    b.v("vcvtps2dq", r(6), r(4))
    b.v("vpaddd", r(6), r(6), mem("r11", C.i127))
    b.v("vpslld", r(6), r(6), 23)
    b.v("vmulps", r(5), r(5), r(6))
    b.v("vandps", r(5), r(5), r(7))
  end
  b.v("vmovups", mem("r9", 0), r(5))
  b.v("vaddps", r(2), r(2), r(5))
end

-- p = e^(s - in[t]) * 2^-P_SHIFT in place over each head's padded row, out[t]
-- = sum of its p. Head-lane tiles: one key-major row, in and out T-float vectors.
function M.exp(isa, p)
  return softmax_statement(isa, p, { "ptr", "n", "consts" },
    function(b, hl, t)
      head_value(b, hl, 1, t)                                   -- 1: max
      b.v("vxorps", b.r(2, "xmm"), b.r(2, "xmm"), b.r(2, "xmm"))  -- 2: sum
      b.v("vmovups", b.r(8), mem("r11", C.min_x))               -- 8: min_x
    end,
    exp_step,
    function(b, hl, t) head_result(b, hl, 2, t, 3, "vaddps") end)
end

-- softcap x tanh(x / softcap) in place for the vector at r9 (register 10:
-- 1 / softcap, 11: softcap): for |y| < tanh_small the odd polynomial
-- y + y^3 P(y^2), else 1 - 2 / (e^(2|y|) + 1) with 2|y| at most tanh_zmax
-- (tanh is 1 in float long before), the sign of y put back; ~1e-7 relative.
-- NaN stays NaN (vminps passes its second operand; the compare is false).
-- e^z is the softmax's polynomial (scaled by 2^-P_SHIFT) times 2^(n + P_SHIFT).
local function softcap_step(b)
  local r, x = b.r, b.x
  local pand, por = x and "vpandd" or "vandps", x and "vpord" or "vorps"
  b.v("vmovups", r(0), mem("r9", 0))
  b.v("vmulps", r(0), r(0), r(10))                          -- 0: y
  b.v(pand, r(1), r(0), mem("r11", C.abs))                  -- 1: a = |y|
  b.v("vaddps", r(2), r(1), r(1))
  b.v("vmovups", r(3), mem("r11", C.tanh_zmax))
  b.v("vminps", r(2), r(3), r(2))                           -- 2: z = min(2a, zmax), NaN kept
  exp_core(b, 2, 3, 4)                                      -- 3: n, 4: e^z 2^-P_SHIFT / 2^n
  b.v("vaddps", r(3), r(3), mem("r11", C.p_shift))
  if x then
    b.v("vscalefps", r(4), r(4), r(3))
  else
    b.v("vcvtps2dq", r(5), r(3))
    b.v("vpaddd", r(5), r(5), mem("r11", C.i127))
    b.v("vpslld", r(5), r(5), 23)
    b.v("vmulps", r(4), r(4), r(5))
  end
  b.v("vaddps", r(4), r(4), mem("r11", C.one_f))
  b.v("vmovups", r(5), mem("r11", C.two_f))
  b.v("vdivps", r(5), r(5), r(4))
  b.v("vmovups", r(4), mem("r11", C.one_f))
  b.v("vsubps", r(4), r(4), r(5))                           -- 4: 1 - 2 / (e^z + 1)
  b.v("vmulps", r(5), r(1), r(1))                           -- 5: a^2
  b.v("vmovups", r(6), mem("r11", C.t4))
  for _, c in ipairs { "t3", "t2", "t1", "t0" } do b.v("vfmadd213ps", r(6), r(5), mem("r11", C[c])) end
  b.v("vmulps", r(6), r(6), r(5))
  b.v("vfmadd213ps", r(6), r(1), r(1))                      -- 6: a + a^3 P(a^2)
  if x then
    b.v("vcmpps", "k1", r(1), mem("r11", C.tanh_small), 1)  -- a < tanh_small: the polynomial
    b.v("vmovaps", r(4) .. "{k1}", r(6))
  else
    b.v("vcmpps", r(7), r(1), mem("r11", C.tanh_small), 1)
    b.v("vandps", r(6), r(6), r(7))
    b.v("vandnps", r(7), r(7), r(4))
    b.v("vorps", r(4), r(6), r(7))
  end
  b.v(pand, r(0), r(0), mem("r11", C.sign))
  b.v(por, r(4), r(4), r(0))
  b.v("vmulps", r(4), r(4), r(11))
  b.v("vmovups", mem("r9", 0), r(4))
end

-- The logit softcap in place over each head's score row (n floats, its keys
-- to a whole vector, a multiple of W; the lanes past the keys are set to -inf
-- after; head-lane tiles: one key-major row); in[0] = 1 / softcap, in[1] =
-- softcap, broadcast once before the rows. Not the rows' spare vectors:
-- stale tiny weights there made subnormal sums (a microcode assist each on
-- Intel cores).
function M.softcap(isa, p)
  return softmax_statement(isa, p, { "ptr", "n", "consts" }, function() end, softcap_step, function() end, nil,
    function(b)   -- once, before the rows: in holds 1 / softcap and softcap
      b.v("vbroadcastss", b.r(10), mem("rsi", 0))
      b.v("vbroadcastss", b.r(11), mem("rsi", 4))
    end)
end

-- ALiBi in place over each head's padded score row (n floats, a multiple of
-- W): score of key i += in[t] x (*out + i), *out the first key's offset from
-- the token's position (exact integers in float), the product rounded
-- before the sum as the reference rounds it. Head-lane tiles: one key-major
-- row, in the T slopes, one key (offset) per vector.
function M.alibi(isa, p)
  local hl = M.head_lanes(isa, p)
  return softmax_statement(isa, p, { "ptr", "n", "consts" },
    function(b)
      if hl then b.v("vmovups", b.r(1), mem("rsi", 0)) else b.v("vbroadcastss", b.r(1), mem("rsi", 0)) end
      b.v("vmovaps", b.r(2), b.r(4))
    end,
    function(b)
      b.v("vmulps", b.r(3), b.r(1), b.r(2))
      b.v("vaddps", b.r(3), b.r(3), mem("r9", 0))
      b.v("vmovups", mem("r9", 0), b.r(3))
      b.v("vaddps", b.r(2), b.r(2), mem("r11", hl and C.one_f or b.g.W == 16 and C.sixteen_f or C.eight_f))
    end,
    function() end, nil,
    function(b)   -- register 4: the first vector's key offsets, for every head
      b.v("vbroadcastss", b.r(4), mem("rdx", 0))
      if not hl then b.v("vaddps", b.r(4), b.r(4), mem("r11", C.iota)) end
    end)
end

-- Whether qload leaves q in the split scores' order itself (M.bf16_split with
-- bf16 q: a pair's 32-bit word holds an even and an odd element), else the
-- template permutes the f32 rows after it.
function M.qload_split(isa, p)
  return M.bf16_split(isa, p) and facts.dtypes[p.Q_DTYPE].name == "bf16"
end

-- qload of M.qload_split: per head (n / D of them), each whole 2W elements
-- as their W even ones then their W odd ones (an odd last W kept in order),
-- times the scale at *in.
local function qload_split(b, p)
  local W = b.g.W
  prologue(b, { "src", "ptr", "n", "consts" })
  b.gp(("mov %d(%%rax), %%rdx"):format(ARG.inp))
  b.v("vbroadcastss", b.r(1), mem("rdx", 0))
  b.gp("1:")
  local d = 0
  while d + 2 * W <= p.D do
    b.v("vmovups", b.r(0), mem("rsi", 2 * d))
    b.v("vpslld", b.r(2), b.r(0), 16)                       -- even elements
    b.v(b.pand, b.r(0), b.r(0), mem("r11", C.hi16))   -- odd elements
    b.v("vmulps", b.r(2), b.r(2), b.r(1))
    b.v("vmulps", b.r(0), b.r(0), b.r(1))
    b.v("vmovups", mem("rdi", 4 * d), b.r(2))
    b.v("vmovups", mem("rdi", 4 * d + 4 * W), b.r(0))
    d = d + 2 * W
  end
  if d < p.D then
    load_kv(b, p.Q_DTYPE, b.r(0), mem("rsi", 2 * d))
    b.v("vmulps", b.r(0), b.r(0), b.r(1))
    b.v("vmovups", mem("rdi", 4 * d), b.r(0))
  end
  b.gp(("add $%d, %%rsi"):format(2 * p.D))
  b.gp(("add $%d, %%rdi"):format(4 * p.D))
  b.gp(("sub $%d, %%rcx"):format(p.D))
  b.gp("jnz 1b")
  return M.statement(b)
end

-- q times the softmax scale as f32: n elements (a multiple of W) of the q
-- dtype at src into ptr, the scale at *in (M.qload_split: in the split order).
function M.qload(isa, p)
  local b = new_block(isa, p)
  if M.qload_split(isa, p) then return qload_split(b, p) end
  local W, qsize = b.g.W, ELEM[p.Q_DTYPE]
  prologue(b, { "src", "ptr", "n" })
  b.gp(("mov %d(%%rax), %%rdx"):format(ARG.inp))
  b.v("vbroadcastss", b.r(1), mem("rdx", 0))
  b.gp("1:")
  load_kv(b, p.Q_DTYPE, b.r(0), mem("rsi", 0))
  b.v("vmulps", b.r(0), b.r(0), b.r(1))
  b.v("vmovups", mem("rdi", 0), b.r(0))
  b.gp(("add $%d, %%rsi"):format(W * qsize))
  b.gp(("add $%d, %%rdi"):format(W * 4))
  b.gp(("sub $%d, %%rcx"):format(W))
  b.gp("jnz 1b")
  return M.statement(b)
end

-- f32 lanes of register x to bf16 bits in the low 16 bits of each lane of
-- register r, rounded to nearest even, NaN kept quiet (fd_f32_to_bf16); t: scratch.
local function to_bf16(b, x, r, t)
  local pand, por = b.pand, b.por
  b.v("vpsrld", t, x, 16)
  b.v(pand, r, t, mem("r11", C.one))
  b.v("vpaddd", r, r, x)
  b.v("vpaddd", r, r, mem("r11", C.bf16_half))
  b.v("vpsrld", r, r, 16)
  b.v(por, t, t, mem("r11", C.bf16_quiet))
  if b.x then
    b.v("vcmpps", "k1", x, x, 3)                 -- unordered: NaN lanes
    b.v("vmovaps", r .. "{k1}", t)
  else
    local m = b.r(4)
    b.v("vcmpps", m, x, x, 3)
    b.v("vandps", t, t, m)
    b.v("vandnps", r, m, r)
    b.v("vorps", r, r, t)
  end
end

-- The normalized output row of one head: out[d] = st[d] * *in for the n
-- (head_dim) floats at ptr, stored as the out dtype (f32, f16 or bf16).
function M.store_out(isa, p)
  local b = new_block(isa, p)
  local W, osize, dt = b.g.W, ELEM[p.OUT_DTYPE], p.OUT_DTYPE
  prologue(b, { "ptr", "n", "consts" })
  b.gp(("mov %d(%%rax), %%rsi"):format(ARG.inp))
  b.gp(("mov %d(%%rax), %%rdx"):format(ARG.out))
  b.v("vbroadcastss", b.r(1), mem("rsi", 0))
  b.gp("1:")
  b.v("vmulps", b.r(0), b.r(1), mem("rdi", 0))
  if dt == 0 then b.v("vmovups", mem("rdx", 0), b.r(0))
  elseif dt == 1 then b.v("vcvtps2ph", mem("rdx", 0), b.r(0), 0)   -- round to nearest even
  else
    to_bf16(b, b.r(0), b.r(3), b.r(2))
    if evex(GEOM[isa]) then b.v("vpmovdw", mem("rdx", 0), b.r(3))
    else
      b.v("vpackusdw", b.r(3), b.r(3), b.r(3))
      b.v("vpermq", b.r(3), b.r(3), 0x08)
      b.v("vmovups", mem("rdx", 0), b.r(3, "xmm"))
    end
  end
  b.gp("add $" .. W * 4 .. ", %rdi")
  b.gp("add $" .. W * osize .. ", %rdx")
  b.gp(("sub $%d, %%rcx"):format(W))
  b.gp("jnz 1b")
  return M.statement(b)
end

-- One split's term of the merge of a head's partial states (the kernel's
-- _merge, templates/merge.c.tpl): acc[d] = r[d] * w (first) or acc[d] += r[d]
-- * w over the D floats, acc at ptr, r at src, w at in; one multiply or FMA
-- a vector (NaN and infinities in r give what r[d] * w gives).
local function merge_term(isa, p, first)
  local b = new_block(isa, p)
  local W = b.g.W
  prologue(b, { "src", "ptr" })
  b.gp(("mov %d(%%rax), %%rdx"):format(ARG.inp))
  b.v("vbroadcastss", b.r(0), mem("rdx", 0))
  for c = 0, p.D / W - 1 do
    local r = b.r(1 + c % 4)
    b.v("vmovups", r, mem("rsi", c * W * 4))
    if first then b.v("vmulps", r, r, b.r(0)) else b.v("vfmadd213ps", r, b.r(0), mem("rdi", c * W * 4)) end
    b.v("vmovups", mem("rdi", c * W * 4), r)
  end
  return M.statement(b)
end

-- The first split's term of a head's merge: acc = r * w (merge_term).
function M.merge_first(isa, p) return merge_term(isa, p, true) end

-- A later split's term of a head's merge: acc += r * w (merge_term).
function M.merge_add(isa, p) return merge_term(isa, p, false) end

-- Empty state records: for each of n heads, the D floats at ptr + h * REC
-- floats set to 0, then m = -inf and l = 0 (the two floats after them).
function M.init_records(isa, p)
  local b = new_block(isa, p)
  local W = b.g.W
  prologue(b, { "ptr", "n", "consts" })
  b.v(b.x and "vpxord" or "vpxor", b.r(0), b.r(0), b.r(0))
  b.v("vmovss", b.r(1, "xmm"), mem("r11", C.ninf))
  b.gp("test %rcx, %rcx")
  b.gp("jz 9f")
  b.gp("1:")
  for c = 0, p.D / W - 1 do b.v("vmovups", mem("rdi", c * W * 4), b.r(0)) end
  b.v("vmovss", mem("rdi", p.D * 4), b.r(1, "xmm"))
  b.v("vmovss", mem("rdi", (p.D + 1) * 4), b.r(0, "xmm"))
  next_record(b, p, "rcx", "1b")
  b.gp("9:")
  return M.statement(b)
end

-- Online-softmax rescale of a tile's accumulators: the D floats of head t's
-- state record (ptr + t * REC floats) times *in[t], for every head of the
-- tile (one head's code in a run-time loop over the T heads, counted in rax).
function M.scale_records(isa, p)
  local b = new_block(isa, p)
  local W = b.g.W
  prologue(b, { "ptr" })
  b.gp(("mov %d(%%rax), %%rsi"):format(ARG.inp))
  b.gp(("mov $%d, %%rax"):format(p.T))
  b.gp("2:")
  b.v("vbroadcastss", b.r(2), mem("rsi", 0))
  scale_row(b, p, 2, 0)
  b.gp("add $4, %rsi")
  next_record(b, p, "rax", "2b")
  return M.statement(b)
end

-- AVX2 register plan of the P.V pass: 16 registers hold T*cb accumulators,
-- the p_t broadcasts (T of them, or one reused), two V registers and, for
-- int8/fp8, one scratch (scale broadcast and fp8 decoding).
local function avx2_pv_plan(T, quant)
  local budget = 16 - 2 - (quant and 1 or 0)
  local cb = math.floor((budget - T) / T)
  if cb >= 1 then return cb, true end
  return math.max(1, math.floor((budget - 1) / T)), false
end

-- AVX-512 register plan of the P.V pass: registers 0..27 hold T*cb
-- accumulators and, where that leaves cb >= 2, the T weight broadcasts of the
-- key (one load per head and key, not per head and d-block); 28-31 hold the V
-- vectors, a scratch and hi16 (M.pv_split). Else 24 accumulators and the
-- weights broadcast by each FMA from memory. Returns cb, whether preloaded.
-- (With the split loads: 0.95-1.00x the old time, warm, tiles 4, 7 and 8;
-- the same library against itself 0.99x.)
local function evex_pv_plan(T)
  local cb = math.floor((28 - T) / T)
  if cb >= 2 then return cb, true end
  return math.max(1, math.floor(24 / T)), false
end

-- Heads per P.V pass of an AVX2 row-major tile too wide for its weights in
-- registers beside one d-block of accumulators (tiles of 8 heads and more;
-- 7 with int8/fp8 V): the pass's weights preloaded, two d-blocks a pass
-- (bf16 V split), where each FMA took its own broadcast. On the Zen 3 VM,
-- tile 8, against one pass of 8 heads: the MQA batch bf16 0.922x the time
-- warm and 0.933x cold, Falcon-40B bf16 0.929x and 0.928x (tile-4 rows,
-- unchanged, 0.986-1.001x).
M.AVX2_PV_HEADS = 4

-- Heads per P.V pass, or nil where one pass holds all the tile's heads: on
-- AVX2, M.AVX2_PV_HEADS where a tile is too wide for its weights in
-- registers (above); on AVX-512, half the heads of a head-lane tile with f32
-- weights: AVX-512 cannot hold its 16 heads' broadcast weights beside two
-- d-blocks of accumulators (evex_pv_plan), so each pass takes half the heads
-- with their weights in registers (two d-blocks a pass, four passes at
-- head_dim 64 as before).
-- Against one pass of all 16 heads, each FMA broadcasting its weight from
-- memory: a stand-alone loop of Falcon-40B's P.V on the Zen 5 VM (32 keys in
-- L1; a scratch microbenchmark, not kept) 7.5 ns a key, the 64 FMAs' peak,
-- against 8.0; Falcon-40B bf16 (chunk 32) 0.937x the time warm and 0.945x
-- cold, f16 0.925x warm (two builds of the library timed interleaved in one
-- process, as bench/builds.c does).
local function pv_heads(isa, p)
  if not evex(GEOM[isa]) then
    return not select(2, avx2_pv_plan(p.T, p.QUANT or p.BLOCKS)) and M.AVX2_PV_HEADS or nil
  end
  if not M.head_lanes(isa, p) or p.PRECISION == 1 then return nil end
  if select(2, evex_pv_plan(p.T)) then return nil end
  return math.floor(p.T / 2)
end

-- The passes of P.V: {first d-block, d-blocks, first head, heads} sized to
-- the registers (pv_heads: a head-lane tile's heads in two halves, an AVX2
-- wide tile's in passes of M.AVX2_PV_HEADS; the last pass takes the rest).
function M.pv_blocks(isa, p)
  local g, T = GEOM[isa], p.T
  local NCH = math.floor(p.D / g.W)
  local nt = pv_heads(isa, p) or T
  local blocks = {}
  for t0 = 0, T - 1, nt do
    local heads = math.min(nt, T - t0)
    local cb = evex(GEOM[isa]) and evex_pv_plan(heads) or avx2_pv_plan(heads, p.QUANT or p.BLOCKS)
    if cb > NCH then cb = NCH end
    for c0 = 0, NCH - 1, cb do blocks[#blocks + 1] = { c0, math.min(cb, NCH - c0), t0, heads } end
  end
  return blocks
end

-- Keys per P.V block of a dense chunk (0: the whole chunk in each pass): AVX2
-- chunks longer than M.AVX2_PV_KEYS take P.V a block at a time, every pass
-- over a block before the next, so the block's V rows stay in L1 between the
-- passes (2 to 16 of them) where a whole chunk's were read again from L2 by
-- each. On the Zen 3 VM, against whole-chunk passes (bench-builds, results/
-- bench/builds-pv-blocks-amd-epyc-2c-avx2.md): chunk 256, cold, Llama bf16
-- 0.986x the time, int8 0.980x, the MQA batch and Falcon-40B bf16 (tile 8)
-- 0.994x; warm 0.979x, 0.995x, 1.003x, 1.004x; chunk 512, warm, 0.978x,
-- 0.980x, 0.985x, 1.001x (blocks of 64 keys did no better). Each block
-- reloads its passes' accumulators (and splits the bf16 pairs again), so
-- short chunks keep whole passes.
M.AVX2_PV_KEYS = 128
function M.pv_key_block(isa, p)
  if evex(GEOM[isa]) or not M.vector(isa) or p.PAGED or p.BEAMS == 1 then return 0 end
  return p.CHUNK > M.AVX2_PV_KEYS and M.AVX2_PV_KEYS or 0
end

-- Whether the P.V pass loads bf16 V split: each 2W-element piece of a V row
-- (d-blocks c, c + 1, c even, both in one pass) read as two vectors, the even
-- elements (vpslld 16 of the piece) and the odd ones (the integer and with
-- hi16, held in the last register), where the widening load takes two
-- instructions per W elements; the pass's two accumulators of each head hold
-- the piece in that order (split_pairs on entry and exit, 5 to 7 more
-- instructions per head and piece, each saving 1 or 2 per key and piece: a
-- chunk of at least 8 keys per head). AVX-512 with 32 registers; AVX2 where
-- the register plan leaves one free beside the weights (tiles 3 and 4, and
-- the 4-head passes of wider tiles: pv_heads), which also takes a vpand for a
-- vpmovzxwd on the shuffle pipes.
function M.pv_split(isa, p, heads)
  local g, T = GEOM[isa], heads or p.T
  if facts.dtypes[p.KV_DTYPE].name ~= "bf16" or p.CHUNKP < 8 * T then return false end
  if evex(g) then return g.nregs >= 32 end
  local cb, preload = avx2_pv_plan(T, false)
  return preload and cb >= 2 and T * cb + T + 3 <= g.nregs
end

-- The paired d-blocks of a P.V pass (block {c0, cb}) with split loads: role[k]
-- for its k-th d-block, "even" (its pair's first: c0 + k even, the next one in
-- the pass), "odd" (the second) or nil (a widening load).
local function split_roles(isa, p, block)
  local role = {}
  if not M.pv_split(isa, p, block[4]) then return role end
  for k = 0, block[2] - 2 do
    if (block[1] + k) % 2 == 0 then role[k], role[k + 1] = "even", "odd" end
  end
  return role
end

-- AVX2 form of split_pairs for one pair (accumulators a, c; records ra, rc;
-- registers s0, s1 scratch): in-lane shuffles of the even (0x88) and odd
-- (0xDD) elements, then vpermq 0xD8 puts the 64-bit pieces in order; back,
-- unpack the pairs and join the 128-bit halves.
local function split_pair_vex(b, a, c, ra, rc, s0, s1, entering)
  if entering then
    b.v("vmovups", s0, ra)
    b.v("vshufps", a, s0, rc, 0x88)
    b.v("vshufps", c, s0, rc, 0xDD)
    b.v("vpermq", a, a, 0xD8)
    b.v("vpermq", c, c, 0xD8)
  else
    b.v("vunpcklps", s0, a, c)
    b.v("vunpckhps", s1, a, c)
    b.v("vperm2f128", a, s0, s1, 0x20)
    b.v("vperm2f128", c, s0, s1, 0x31)
    b.v("vmovups", ra, a)
    b.v("vmovups", rc, c)
  end
end

-- Move a pass's split pairs between natural and split order: the pair's two
-- accumulators (of head t, at acc(t, k)) to split order from the record at
-- rec(t, k) (entering), or back into it (leaving); the V registers (28, 29 on
-- AVX-512, vreg and the next on AVX2) scratch (outside the key loop).
local function split_pairs(b, T, cb, role, acc, rec, entering, vreg)
  for k = 0, cb - 1 do
    if role[k] == "even" then
      for t = 0, T - 1 do
        local a, c = acc(t, k), acc(t, k + 1)
        if not b.x then
          split_pair_vex(b, a, c, rec(t, k), rec(t, k + 1), b.r(vreg), b.r(vreg + 1), entering)
        elseif entering then
          b.v("vmovups", a, mem("r11", C.even_idx))
          b.v("vmovups", c, mem("r11", C.odd_idx))
          b.v("vmovups", b.r(28), rec(t, k))
          b.v("vpermi2ps", a, b.r(28), rec(t, k + 1))
          b.v("vpermi2ps", c, b.r(28), rec(t, k + 1))
        else
          b.v("vmovups", b.r(28), mem("r11", C.lo_idx))
          b.v("vmovups", b.r(29), mem("r11", C.hi_idx))
          b.v("vpermi2ps", b.r(28), a, c)
          b.v("vpermi2ps", b.r(29), a, c)
          b.v("vmovups", rec(t, k), b.r(28))
          b.v("vmovups", rec(t, k + 1), b.r(29))
        end
      end
    end
  end
end

-- Whether the P.V loop takes two keys an iteration (AVX2 row-major tiles of
-- unscaled V: f32, f16, bf16): the pointer updates and the loop's branch once
-- a pair. On the Zen 3 VM, warm, tile 4, against one key an iteration:
-- Falcon-40B bf16 0.980x the time, the MQA batch 0.987x, Llama bf16 0.995x
-- (the int8 control 1.003x).
function M.pv_pairs(isa, p)
  return not evex(GEOM[isa]) and not (p.QUANT and not M.pv_prescale(isa, p))
    and not (p.BLOCKS and not M.pv_bscale(isa, p)) and not M.head_lanes(isa, p)
end

-- Head t's softmax weights in the score buffer, in floats from head 0's: a
-- lane of each key-major row in a head-lane tile, else its own row (CHUNKP
-- floats apart). A P.V pass over some heads starts at its first head's
-- (templates/pv_piece.c.tpl), and M.pv and M.pv_dpbf16 read head t's weights there.
function M.weight_row(isa, p, t)
  return M.head_lanes(isa, p) and t or t * p.CHUNKP
end

-- P.V for one pass (M.pv_blocks): acc[t][c0*W ..] += sum over keys of
-- p_t[i] * V[i][...] for the pass's heads t (ptr and sc at its first head's).
function M.pv(isa, p, block)
  local b = new_block(isa, p)
  local W, T, cb = b.g.W, block[4], block[2]
  local nacc = T * cb
  local role = split_roles(isa, p, block)
  local prescaled = M.pv_prescale(isa, p)
  local bscaled = M.pv_bscale(isa, p)
  local acc = function(t, k) return b.r(t * cb + k) end
  local rec = function(t, k) return mem("rdi", (t * p.REC + k * W) * 4) end
  local hl = M.head_lanes(isa, p)
  -- head t's weights (of the ggml block jb: block-scaled rows) in bytes from the pass's first head's
  local p_at = function(t, jb)
    if bscaled then return M.bscale_row_of(isa, p, t, jb) * 4 end
    return M.weight_row(isa, p, t) * 4
  end
  local bn = facts.dtype_block(p.KV_DTYPE)
  local block_of = function(k) return bscaled and math.floor((block[1] + k) * W / bn) or 0 end
  local preload, preg, vreg, tmp = false, nil, 28, 30
  if evex(GEOM[isa]) then
    preload, preg = select(2, evex_pv_plan(T)), nacc
  else
    local scratch = p.QUANT or p.BLOCKS
    local _, fits = avx2_pv_plan(T, scratch)
    preload = fits and nacc + T + 2 + (scratch and 1 or 0) <= 16
    preg = nacc
    vreg = nacc + (preload and T or 1)
    tmp = vreg + 2
  end
  local next_v = M.pv_next_v(isa, p)
  assert(not (next_v and p.QUANT), "pv: r9 holds either the V scales or the next chunk's V")
  prologue(b, { "src", "ptr", "sc", "n", "stride", next_v and "pf_v" or "scl", "scl_stride", "consts" })
  if p.T >= M.PREFETCH_MIN_TILE then b.gp(("mov %d(%%rax), %%rax"):format(ARG.pf)) end
  for t = 0, T - 1 do
    for k = 0, cb - 1 do
      if not role[k] then b.v("vmovups", acc(t, k), rec(t, k)) end
    end
  end
  split_pairs(b, T, cb, role, acc, rec, true, vreg)
  local hi16 = b.r(b.g.nregs - 1)
  if next(role) then b.v("vmovups", hi16, mem("r11", C.hi16)) end
  -- one key's work: its weights, then each d-block's V vector and FMAs; key
  -- j of an unrolled pair reads its V row at rsi + j strides, weights j on
  local function key(j)
    local wt = function(t, bcast, jb) return mem("rdx", p_at(t, jb) + j * 4, nil, nil, bcast) end
    local loaded
    for k = 0, cb - 1 do
      local jb = block_of(k)
      if preload and loaded ~= jb then   -- the key's weights (again where a block-scaled pass enters a new block)
        for t = 0, T - 1 do b.v("vbroadcastss", b.r(preg + t), wt(t, false, jb)) end
        loaded = jb
      end
      local vr = b.r(vreg + k % 2)
      local m = kv_mem(p, "rsi", (block[1] + k - (role[k] == "odd" and 1 or 0)) * W, block[1] * W)
      if j > 0 then m.index, m.scale = "r8", 1 end
      if role[k] == "even" and b.x then b.v("vpslld", vr, m, 16)
      elseif role[k] == "even" then                -- VEX shifts take no memory source
        b.v("vmovups", vr, m)
        b.v("vpslld", vr, vr, 16)
      elseif role[k] == "odd" then b.v(b.pand, vr, hi16, m)
      else load_kv(b, p.KV_DTYPE, vr, m, b.r(tmp), bscaled and "codes" or nil) end
      if p.QUANT and not prescaled then
        if evex(GEOM[isa]) then b.v("vmulps", vr, vr, mem("r9", 0, nil, nil, true))
        else b.v("vbroadcastss", b.r(tmp), mem("r9", 0)); b.v("vmulps", vr, vr, b.r(tmp)) end
      end
      for t = 0, T - 1 do
        local acc = b.r(t * cb + k)
        if preload then
          b.v("vfmadd231ps", acc, vr, b.r(preg + t))
        elseif evex(GEOM[isa]) then
          b.v("vfmadd231ps", acc, vr, wt(t, true, jb))
        else
          b.v("vbroadcastss", b.r(preg), wt(t, false, jb))
          b.v("vfmadd231ps", acc, vr, b.r(preg))
        end
      end
    end
  end
  -- each block prefetches the next chunk's K lines of its own d range (a
  -- head-lane tile: its share of the next chunk's K and V lines), so
  -- prefetches are spread over the whole P.V pass
  local function prefetch()
    if next_v then prefetch_next_rows(b, p, block)
    elseif block[3] == 0 then   -- (a later pass of other heads: the first one's lines)
      prefetch_row(b, p, "rax", kv_span(p, block[1] * W, (block[1] + cb) * W))
    end
  end
  b.gp("test %rcx, %rcx")
  b.gp("jz 2f")
  if M.pv_pairs(isa, p) then
    b.gp("cmp $1, %rcx")
    b.gp("je 3f")
    b.gp("1:")
    key(0)
    key(1)
    prefetch()
    prefetch()
    b.gp("lea (%rsi,%r8,2), %rsi")
    b.gp("add $8, %rdx")
    b.gp("sub $2, %rcx")
    b.gp("cmp $1, %rcx")
    b.gp("ja 1b")
    b.gp("jb 2f")
    b.gp("3:")
    key(0)
  else
    b.gp("1:")
    key(0)
    prefetch()
    b.gp("add %r8, %rsi")
    b.gp(("add $%d, %%rdx"):format(hl and p.T * 4 or 4))
    if p.QUANT and not prescaled then b.gp("add %r10, %r9") end
    b.gp("dec %rcx")
    b.gp("jnz 1b")
  end
  b.gp("2:")
  for t = 0, T - 1 do
    for k = 0, cb - 1 do
      if not role[k] then b.v("vmovups", rec(t, k), acc(t, k)) end
    end
  end
  split_pairs(b, T, cb, role, acc, rec, false, vreg)
  return M.statement(b)
end

-- Whether the f32 P.V over int8/fp8 V takes its weights already multiplied
-- by their keys' v scales (M.pscale, once per call) instead of one multiply
-- per V vector: row-major tiles (AVX-512: 8 multiplies a key at head_dim 128
-- become T per 16 keys; AVX2: 16 broadcasts and 16 multiplies become T per 8
-- keys). Measured on the Zen 5 VM, warm, the same plans: Llama int8 (tile 4)
-- 0.93x the time, the MQA batch int8 (tile 8) 0.94x, MHA int8 (tile 1)
-- 0.90x; on the Zen 3 VM (AVX2), Llama int8 (tile 4) 0.920x.
function M.pv_prescale(isa, p)
  return M.vector(isa) and p.QUANT and not M.head_lanes(isa, p)
end

-- The vector loop of M.pscale on AVX2 (label 7, rcx keys left): 8 keys a
-- step while 8 or more remain, then the one-key loop (5) takes the rest.
local function pscale_ymm(b, p)
  local s, W = b.r(15), b.g.W
  b.gp(("cmp $%d, %%rcx"):format(W))
  b.gp("jb 5f")
  b.v("vmovups", s, mem("r9", 0))
  b.gp(("prefetcht0 %d(%%r9)"):format(p.CHUNK * 4))   -- the next chunk's scales (dense rows)
  for t = 0, p.T - 1 do
    local r = b.r(t % 15)
    b.v("vmulps", r, s, mem("rdx", t * p.CHUNKP * 4))
    b.v("vmovups", mem("rdx", t * p.CHUNKP * 4), r)
  end
  b.gp(("add $%d, %%rdx"):format(W * 4))
  b.gp(("add $%d, %%r9"):format(W * 4))
  b.gp(("sub $%d, %%rcx"):format(W))
  b.gp("jnz 7b")
end

-- The vector loop of M.pscale on AVX-512 (label 7): 16 keys a step, the last
-- ones masked (k1 from the keys left).
local function pscale_zmm(b, p)
  b.gp("mov $0xffff, %r11d")
  b.gp("cmp $16, %rcx")
  b.gp("jae 6f")
  b.gp("mov $1, %r11d")
  b.gp("shl %cl, %r11d")
  b.gp("dec %r11d")
  b.gp("6:")
  b.v("kmovw", "k1", "r11d")
  b.v("vmovups", "zmm31{k1}{z}", mem("r9", 0))
  b.gp(("prefetcht0 %d(%%r9)"):format(p.CHUNK * 4))   -- the next chunk's scales (dense rows)
  for t = 0, p.T - 1 do
    local r = b.r(t % 30)
    b.v("vmulps", r .. "{k1}{z}", b.r(31), mem("rdx", t * p.CHUNKP * 4))
    b.v("vmovups", mem("rdx", t * p.CHUNKP * 4, nil, nil, nil, "k1"), r)
  end
  b.gp("add $64, %rdx")
  b.gp("add $64, %r9")
  b.gp("sub $16, %rcx")
  b.gp("jg 7b")
end

-- The weights of n keys (T row-major rows of CHUNKP floats at sc) each
-- multiplied in place by its key's v scale (scl, scl_stride bytes apart):
-- a vector of keys a step where the scales are contiguous (scl_stride 4:
-- bhsd and paged rows; AVX-512 16 keys, the last ones masked, no weight or
-- scale past the n-th read or written; AVX2 8 keys, the rest one at a time),
-- else one key at a time (bshd). The vector loop prefetches the scales a
-- chunk ahead, the next chunk's in a dense row (cold, perf samples of Llama
-- int8 16k in this statement: 6.2% without, 1.2% with).
function M.pscale(isa, p)
  local b = new_block(isa, p)
  local x = b.x and "xmm31" or b.r(15, "xmm")
  prologue(b, { "sc", "n", "scl", "scl_stride" })
  b.gp("test %rcx, %rcx")
  b.gp("jz 2f")
  b.gp("cmp $4, %r10")
  b.gp("jne 5f")
  b.gp("7:")
  if b.x then pscale_zmm(b, p) else pscale_ymm(b, p) end
  b.gp("jmp 2f")
  b.gp("5:")
  b.v("vmovss", x, mem("r9", 0))
  for t = 0, p.T - 1 do
    b.v("vmulss", "xmm0", x, mem("rdx", t * p.CHUNKP * 4))
    b.v("vmovss", mem("rdx", t * p.CHUNKP * 4), "xmm0")
  end
  b.gp("add $4, %rdx")
  b.gp("add %r10, %r9")
  b.gp("dec %rcx")
  b.gp("jnz 5b")
  b.gp("2:")
  return M.statement(b)
end

-- Whether the P.V over ggml block V (q8_0, q4_0) takes its weights already
-- multiplied by their keys' block scales (M.bscale, once per P.V piece: one
-- row per head and block) instead of a scale conversion, broadcast and
-- multiply per V vector (on AVX2 at tile 4: 6 of the 14 vector instructions
-- of a key's pass): row-major tiles, f32 weights, where the rows fit
-- BSCALE_MAX floats. M.bscale runs 8 keys a step on AVX-512 too, in the VEX
-- registers (ymm0-15). On the device's 16-core Xeon (AVX-512 with BF16, 2
-- threads, warm), with the scores' change (scale_mode) ported too: Llama
-- q8_0 0.870x the time, q4_0 0.856x (results/bench/builds-bscale-evex-intel-
-- xeon-16c-avx512bf16.md; AVX2: builds-bscale-amd-epyc-2c-avx2.md).
M.BSCALE_MAX = 32768
function M.pv_bscale(isa, p)
  if not (M.vector(isa) and p.BLOCKS) or M.head_lanes(isa, p) or p.PRECISION == 1 then
    return false
  end
  return p.T * row_blocks(p) * p.CHUNKP <= M.BSCALE_MAX
end

-- Row of head t's weights times the scales of ggml block jb in the
-- block-scaled weights (floats from head 0's row of block 0): rows of CHUNKP
-- floats, a head's blocks together, a P.V piece's keys from its first.
function M.bscale_row_of(isa, p, t, jb)
  return (t * row_blocks(p) + jb) * p.CHUNKP
end

-- The gather of 8 keys' f16 scales of up to 4 ggml blocks (first jb0, bb
-- bytes each; rows r8 bytes apart from rsi; r9 = rsi + 4 r8, r10 = 3 r8):
-- block jb0 + g's into the words of register 12 + g, interleaved so the
-- blocks' insert chains overlap, then widened to f32 in place.
local function bscale_gather(b, jb0, nb, bb)
  local at = { { "rsi" }, { "rsi", "r8", 1 }, { "rsi", "r8", 2 }, { "rsi", "r10", 1 },
               { "r9" }, { "r9", "r8", 1 }, { "r9", "r8", 2 }, { "r9", "r10", 1 } }
  for i, a in ipairs(at) do
    for g = 0, nb - 1 do
      local x = "xmm" .. (12 + g)
      b.v("vpinsrw", x, x, mem(a[1], (jb0 + g) * bb, a[2], a[3]), i - 1)
    end
  end
  for g = 0, nb - 1 do b.v("vcvtph2ps", "ymm" .. (12 + g), "xmm" .. (12 + g)) end
end

-- The block-scaled weights of a P.V piece (M.pv_bscale): for n keys (V rows
-- from src, stride bytes apart), every head t of the tile and ggml block jb,
-- ptr's row (M.bscale_row_of) takes the weight at sc's row t times the
-- key's scale of block jb; 8 keys a step, the rest one at a time.
function M.bscale(isa, p)
  local b = new_block(isa, p)
  local bb = select(2, facts.dtype_block(p.KV_DTYPE))
  local NB = row_blocks(p)
  prologue(b, { "src", "ptr", "sc", "n", "stride" })
  b.gp("lea (%r8,%r8,2), %r10")
  b.gp("test %rcx, %rcx")
  b.gp("jz 2f")
  b.gp("cmp $8, %rcx")
  b.gp("jb 5f")
  b.gp("7:")
  b.gp("lea (%rsi,%r8,4), %r9")
  for jb0 = 0, NB - 1, 4 do
    local nb = math.min(4, NB - jb0)
    bscale_gather(b, jb0, nb, bb)
    for t = 0, p.T - 1 do
      for g = 0, nb - 1 do
        local r = "ymm" .. (t * nb + g) % 12
        b.v("vmulps", r, "ymm" .. (12 + g), mem("rdx", M.weight_row(isa, p, t) * 4))
        b.v("vmovups", mem("rdi", M.bscale_row_of(isa, p, t, jb0 + g) * 4), r)
      end
    end
  end
  b.gp("add $32, %rdx")
  b.gp("add $32, %rdi")
  b.gp("lea (%rsi,%r8,8), %rsi")
  b.gp("sub $8, %rcx")
  b.gp("cmp $8, %rcx")
  b.gp("jae 7b")
  b.gp("test %rcx, %rcx")
  b.gp("jz 2f")
  b.gp("5:")
  for jb = 0, NB - 1 do
    b.v("vpinsrw", "xmm15", "xmm15", mem("rsi", jb * bb), 0)
    b.v("vcvtph2ps", "xmm15", "xmm15")
    for t = 0, p.T - 1 do
      b.v("vmulss", "xmm0", "xmm15", mem("rdx", M.weight_row(isa, p, t) * 4))
      b.v("vmovss", mem("rdi", M.bscale_row_of(isa, p, t, jb) * 4), "xmm0")
    end
  end
  b.gp("add $4, %rdx")
  b.gp("add $4, %rdi")
  b.gp("add %r8, %rsi")
  b.gp("dec %rcx")
  b.gp("jnz 5b")
  b.gp("2:")
  return M.statement(b)
end

-- Fast precision (the key's precision digit): each head's padded row of
-- softmax weights (n floats at ptr, rows CHUNKP floats apart) rounded to bf16
-- in place (vcvtneps2bf16, round to nearest even): row t's bf16 weights fill
-- the first 2 n bytes of its row, so the weights of keys s and s + 1 are one
-- dword at byte 2 s of the row (pv_dpbf16 broadcasts it). Each 64-byte read
-- precedes the 32-byte write that overlaps it. Head-lane tiles (key-major
-- rows of T = W weights) pair rows instead: pround_pairs.
function M.pround(isa, p)
  if M.head_lanes(isa, p) then return M.pround_pairs(isa, p) end
  local b = new_block(isa, p)
  prologue(b, { "ptr", "n" })
  b.gp("shr $4, %rcx")
  b.gp("jz 2f")
  for t = 0, p.T - 1 do
    b.gp(("lea %d(%%rdi), %%r9"):format(t * p.CHUNKP * 4))
    b.gp("mov %r9, %r10")
    b.gp("mov %rcx, %rdx")
    b.gp(("%d:"):format(3 + t % 2))
    b.v("vmovups", b.r(0), mem("r9", 0))
    b.v("vcvtneps2bf16", b.r(0, "ymm"), b.r(0))
    b.v("vmovups", mem("r10", 0), b.r(0, "ymm"))
    b.gp("add $64, %r9")
    b.gp("add $32, %r10")
    b.gp("dec %rdx")
    b.gp(("jnz %db"):format(3 + t % 2))
  end
  b.gp("2:")
  return M.statement(b)
end

-- Fast precision of a head-lane tile: the key-major weight rows (row i: the
-- T = W heads' f32 weights of key i) of n keys at ptr, in pairs (2j, 2j + 1)
-- rounded to bf16 and interleaved by word into one row of T dwords at row j
-- (dword t: p[2j][t] | p[2j+1][t] << 16), in place: pair row j is written
-- after rows 2j and 2j + 1 are read, and lies below row 2j + 2. An odd n
-- reads row n (a later piece's row or a stale one inside the score buffer,
-- never written) into the upper words of its last pair row, which
-- pv_dpbf16's odd last key clears. The template calls it per P.V piece, so
-- pairs start at each piece's first key (pieces start at odd keys).
function M.pround_pairs(isa, p)
  local b = new_block(isa, p)
  local RB = p.T * 4
  assert(p.T == b.g.W and b.g.groups.bf16, "simd: pround_pairs needs a head-lane tile of W heads and the bf16 group")
  prologue(b, { "ptr", "n" })
  b.gp("add $1, %rcx")
  b.gp("shr $1, %rcx")
  b.gp("jz 2f")
  b.gp("mov %rdi, %r10")
  b.gp("1:")
  for k = 0, 1 do
    b.v("vmovups", b.r(k), mem("rdi", k * RB))
    b.v("vcvtneps2bf16", b.r(k, "ymm"), b.r(k))
    b.v("vpmovzxwd", b.r(k), b.r(k, "ymm"))
  end
  b.v("vpslld", b.r(1), b.r(1), 16)
  b.v("vpord", b.r(0), b.r(0), b.r(1))
  b.v("vmovups", mem("r10", 0), b.r(0))
  b.gp(("add $%d, %%rdi"):format(2 * RB))
  b.gp(("add $%d, %%r10"):format(RB))
  b.gp("dec %rcx")
  b.gp("jnz 1b")
  b.gp("2:")
  return M.statement(b)
end

-- P.V of fast precision for one d-block: keys in pairs (s, s + 1), each
-- 16-element piece of V rows s and s + 1 interleaved by word into one
-- register (vpmovzxwd both, the second shifted up 16 and or-ed in: dword d
-- holds V[s][d] | V[s+1][d] << 16), then per head one vdpbf16ps with the
-- head's bf16 weight pair (pround) as an embedded {1to16} broadcast. An odd
-- last key goes alone: its V row widened (upper words 0), its weight word
-- with the next word cleared (vpandnd with hi16: past a piece lie a later
-- piece's weight or, after a chunk of a multiple of 16 keys, stale f32 bits that
-- may read as a NaN), so no V row past the n given is read and no word past
-- the piece's weights counts. Head-lane tiles take head t's pair as dword t
-- of the pair's row (pround_pairs). The weights' f32 sums (the exp
-- statement's) stay the softmax denominators.
function M.pv_dpbf16(isa, p, block)
  local b = new_block(isa, p)
  local W, T, cb = b.g.W, p.T, block[2]
  assert(b.g.groups.bf16, "simd: pv_dpbf16 needs the bf16 group")
  local hl = M.head_lanes(isa, p)
  -- head t's weight pair: in its row (bytes 2 s), or dword t of the pair's row
  local row = function(t) return M.weight_row(isa, p, t) * 4 end
  prologue(b, { "src", "ptr", "sc", "n", "stride", "consts" })
  if p.T >= M.PREFETCH_MIN_TILE then b.gp(("mov %d(%%rax), %%rax"):format(ARG.pf)) end
  for t = 0, T - 1 do
    for k = 0, cb - 1 do b.v("vmovups", b.r(t * cb + k), mem("rdi", (t * p.REC + k * W) * 4)) end
  end
  -- the weight pair of each head (tail: its first word alone, in register 26; 27 holds hi16)
  local function heads(k, vr, tail)
    for t = 0, T - 1 do
      local w = mem("rdx", row(t), nil, nil, true)
      if tail then b.v("vpandnd", b.r(26), b.r(27), w); w = b.r(26) end
      b.v("vdpbf16ps", b.r(t * cb + k), vr, w)
    end
  end
  local span0, span1 = kv_span(p, block[1] * W, (block[1] + cb) * W)
  b.gp("cmp $2, %rcx")
  b.gp("jb 3f")
  b.gp("1:")
  for k = 0, cb - 1 do
    local a, c = b.r(28 + 2 * (k % 2)), b.r(29 + 2 * (k % 2))
    b.v("vpmovzxwd", a, mem("rsi", k * W * 2))
    b.v("vpmovzxwd", c, mem("rsi", k * W * 2, "r8", 1))
    b.v("vpslld", c, c, 16)
    b.v("vpord", a, a, c)
    heads(k, a)
  end
  prefetch_row(b, p, "rax", span0, span1)
  prefetch_row(b, p, "rax", span0, span1)
  b.gp("lea (%rsi,%r8,2), %rsi")
  b.gp(("add $%d, %%rdx"):format(hl and T * 4 or 4))
  b.gp("sub $2, %rcx")
  b.gp("cmp $2, %rcx")
  b.gp("jae 1b")
  b.gp("3:")
  b.gp("test %rcx, %rcx")
  b.gp("jz 2f")
  b.v("vmovups", b.r(27), mem("r11", C.hi16))
  for k = 0, cb - 1 do
    local a = b.r(28 + 2 * (k % 2))
    b.v("vpmovzxwd", a, mem("rsi", k * W * 2))
    heads(k, a, true)
  end
  prefetch_row(b, p, "rax", span0, span1)
  b.gp("2:")
  for t = 0, T - 1 do
    for k = 0, cb - 1 do b.v("vmovups", mem("rdi", (t * p.REC + k * W) * 4), b.r(t * cb + k)) end
  end
  return M.statement(b)
end

-- Registers 31 = 128.0 and 30 = 0, for the MSD planes.
local function planes_consts(b)
  b.v("vmovups", "zmm31", mem("r11", C.sixteen_f))
  b.v("vmulps", "zmm31", "zmm31", mem("r11", C.eight_f))    -- 128.0
  b.v("vpxord", "zmm30", "zmm30", "zmm30")
end

-- MSD planes of P from max (xmm8) and 0 or NaN (xmm9): zmm12 = 127 / max
-- (capped: inf for 0), the plane scales max / 127 2^-7j (NaN for a NaN xmm9)
-- stored at scale(j), plane sums zmm14.. zeroed (registers 31: 128.0).
local function planes_scales(b, P, scale)
  b.v("vsubss", "xmm11", "xmm31", mem("r11", C.one_f))        -- 127
  b.v("vdivss", "xmm12", "xmm11", "xmm8")                      -- 127 / max (inf for 0: capped)
  b.v("vminss", "xmm12", "xmm12", mem("r11", C.two120))
  b.v("vbroadcastss", "zmm12", "xmm12")
  b.v("vdivss", "xmm13", "xmm8", "xmm11")                      -- sigma
  b.v("vaddss", "xmm13", "xmm13", "xmm9")                      -- NaN for a non-finite value
  for j = 0, P - 1 do
    b.v("vmovss", scale(j), "xmm13")
    b.v("vdivss", "xmm13", "xmm13", "xmm31")
    b.v("vpxord", b.r(14 + j), b.r(14 + j), b.r(14 + j))
  end
end

-- The P planes of zmm0 (values times 127 / max): plane j's 16 bytes at
-- plane(j), its values added to zmm14 + j; each remainder times 128 is the next.
local function planes_split(b, P, plane)
  for j = 0, P - 1 do
    b.v("vcvtps2dq", "zmm1", "zmm0")
    b.v("vpmovdb", plane(j), "zmm1")
    b.v("vcvtdq2ps", "zmm1", "zmm1")
    b.v("vaddps", b.r(14 + j), b.r(14 + j), "zmm1")
    if j < P - 1 then
      b.v("vsubps", "zmm0", "zmm0", "zmm1")
      b.v("vmulps", "zmm0", "zmm0", "zmm31")
    end
  end
end

-- Each plane's bias, -128 sum(plane) from zmm14 + j, stored as int32 at bias(j).
local function planes_biases(b, P, bias)
  for j = 0, P - 1 do
    local x = b.r(14 + j, "xmm")
    reduce(b, 14 + j, 10, "vaddps")
    b.v("vmulss", x, x, "xmm31")
    b.v("vsubss", x, "xmm30", x)
    b.v("vcvtps2dq", x, x)
    b.v("vmovss", bias(j), x)
  end
end

-- AVX2 MSD q (M.msd on a record with the msd16 group): for each of n heads,
-- its f32 q row at ptr + h D floats (scaled, any K scales folded) becomes in
-- place one int16 plane Q = q 32767 / max |q| rounded to nearest (even), D
-- int16 in element order (vpackssdw, then vpermq to undo its lane
-- interleave), then the plane's scale s = max |q| / 32767 (f32) at byte 2 D,
-- so q ~= s Q. Each 16 floats are read before their 32 plane bytes are
-- written below them. A non-finite q gives a NaN scale (NaN scores, as the
-- f32 kernel's); an all-zero row the scale 0.
local function q_plane16(isa, p)
  local b = new_block(isa, p)
  local D = p.D
  prologue(b, { "ptr", "n", "consts" }, true)
  b.v("vmovups", b.r(15), mem("r11", C.abs))
  b.gp("test %rcx, %rcx")
  b.gp("jz 9f")
  b.gp("1:")
  b.v("vxorps", b.r(8), b.r(8), b.r(8))                        -- max |q|
  b.v("vxorps", b.r(9), b.r(9), b.r(9))                        -- sum of q - q: 0, or NaN
  b.gp("xor %r12, %r12")
  b.gp("2:")
  b.v("vmovups", b.r(0), mem("rdi", 0, "r12", 1))
  b.v("vsubps", b.r(1), b.r(0), b.r(0))
  b.v("vaddps", b.r(9), b.r(9), b.r(1))
  b.v("vandps", b.r(0), b.r(0), b.r(15))
  b.v("vmaxps", b.r(8), b.r(8), b.r(0))
  b.gp("add $32, %r12")
  b.gp(("cmp $%d, %%r12"):format(4 * D))
  b.gp("jb 2b")
  reduce(b, 8, 10, "vmaxps")
  reduce(b, 9, 10, "vaddps")
  b.v("vmovss", "xmm11", mem("r11", C.i16max_f))
  b.v("vdivss", "xmm12", "xmm11", "xmm8")                      -- 32767 / max (inf for 0: capped)
  b.v("vminss", "xmm12", "xmm12", mem("r11", C.two120))
  b.v("vbroadcastss", b.r(12), "xmm12")
  b.v("vdivss", "xmm13", "xmm8", "xmm11")                      -- s
  b.v("vaddss", "xmm13", "xmm13", "xmm9")                      -- NaN for a non-finite value
  b.gp("xor %r12, %r12")
  b.gp("xor %r9, %r9")
  b.gp("3:")
  b.v("vmulps", b.r(0), b.r(12), mem("rdi", 0, "r12", 1))
  b.v("vmulps", b.r(1), b.r(12), mem("rdi", 32, "r12", 1))
  b.v("vcvtps2dq", b.r(0), b.r(0))
  b.v("vcvtps2dq", b.r(1), b.r(1))
  b.v("vpackssdw", b.r(0), b.r(0), b.r(1))
  b.v("vpermq", b.r(0), b.r(0), 0xD8)
  b.v("vmovups", mem("rdi", 0, "r9", 1), b.r(0))
  b.gp("add $64, %r12")
  b.gp("add $32, %r9")
  b.gp(("cmp $%d, %%r12"):format(4 * D))
  b.gp("jb 3b")
  b.v("vmovss", mem("rdi", 2 * D), "xmm13")
  b.gp(("add $%d, %%rdi"):format(4 * D))
  b.gp("dec %rcx")
  b.gp("jnz 1b")
  b.gp("9:")
  restore_regs(b)
  return M.statement(b)
end

-- MSD q planes (M.msd): for each of n heads, its f32 q row at ptr + h D
-- floats (scaled, any K scales folded) becomes P int8 planes in place, the
-- s = max |q| / 127, q / s rounded to nearest
-- (even), the remainder times 128 for the next plane (f32: exact after the
-- first product), so q ~= s (q0 + q1 2^-7 + q2 2^-14); after the P planes (D
-- bytes each), per plane -128 sum(plane) (int32), then its scale s 2^-7j
-- (f32). A non-finite q gives NaN scales (NaN scores, as the f32 kernel's).
-- The row is staged at stage first: the planes overwrite it.
function M.q_planes(isa, p)
  if not evex(GEOM[isa]) then return q_plane16(isa, p) end
  local b = new_block(isa, p)
  local D, P = p.D, p.PLANES
  prologue(b, { "ptr", "n", "consts", "stage" }, true)
  planes_consts(b)
  b.v("vmovups", "zmm29", mem("r11", C.abs))
  b.gp("test %rcx, %rcx")
  b.gp("jz 9f")
  b.gp("1:")
  b.v("vpxord", "zmm8", "zmm8", "zmm8")                         -- max |q|
  b.v("vpxord", "zmm9", "zmm9", "zmm9")                         -- sum of q - q: 0, or NaN
  b.gp("xor %r12, %r12")
  b.gp("2:")
  b.v("vmovups", "zmm0", mem("rdi", 0, "r12", 1))
  b.v("vmovups", mem("rbx", 0, "r12", 1), "zmm0")
  b.v("vsubps", "zmm1", "zmm0", "zmm0")
  b.v("vaddps", "zmm9", "zmm9", "zmm1")
  b.v("vpandd", "zmm0", "zmm0", "zmm29")
  b.v("vmaxps", "zmm8", "zmm8", "zmm0")
  b.gp("add $64, %r12")
  b.gp(("cmp $%d, %%r12"):format(4 * D))
  b.gp("jb 2b")
  reduce(b, 8, 10, "vmaxps")
  reduce(b, 9, 10, "vaddps")
  planes_scales(b, P, function(j) return mem("rdi", P * D + 4 * P + 4 * j) end)
  b.gp("xor %r12, %r12")
  b.gp("xor %r9, %r9")
  b.gp("3:")
  b.v("vmulps", "zmm0", "zmm12", mem("rbx", 0, "r12", 1))
  planes_split(b, P, function(j) return mem("rdi", j * D, "r9", 1) end)
  b.gp("add $64, %r12")
  b.gp("add $16, %r9")
  b.gp(("cmp $%d, %%r12"):format(4 * D))
  b.gp("jb 3b")
  planes_biases(b, P, function(j) return mem("rdi", P * D + 4 * j) end)
  b.gp(("add $%d, %%rdi"):format(4 * D))
  b.gp("dec %rcx")
  b.gp("jnz 1b")
  b.gp("9:")
  restore_regs(b)
  return M.statement(b)
end

local unpack = table.unpack or unpack   -- Lua 5.4 or LuaJIT

-- A run of vector instructions' bytes (those between two general-purpose
-- instructions) as `.quad` words of eight bytes, little-endian, then a
-- `.long` word and a `.byte` line for the rest: the same bytes in an eighth
-- of the tokens for the compiler's assembler to parse (unannotated sources:
-- the JIT's).
local HEX = {}
for i = 0, 255 do HEX[i] = ("%02x"):format(i) end

local function packed(bytes)
  local out, n8, n4 = {}, #bytes - #bytes % 8, #bytes - #bytes % 4
  local words = {}
  for i = 1, n8, 8 do
    local b0, b1, b2, b3, b4, b5, b6, b7 = bytes:byte(i, i + 7)
    words[#words + 1] = "0x" .. HEX[b7] .. HEX[b6] .. HEX[b5] .. HEX[b4] .. HEX[b3] .. HEX[b2] .. HEX[b1] .. HEX[b0]
  end
  if #words > 0 then out[1] = ".quad " .. table.concat(words, ",") end
  if n4 > n8 then
    local b0, b1, b2, b3 = bytes:byte(n8 + 1, n8 + 4)
    out[#out + 1] = ".long 0x" .. HEX[b3] .. HEX[b2] .. HEX[b1] .. HEX[b0]
  end
  if n4 < #bytes then out[#out + 1] = x86.byte_line(bytes:sub(n4 + 1)) end
  return out
end

-- The asm text lines of a block and its closing vzeroupper, each {text,
-- comment}: one per instruction when annotated, else with the runs of
-- vector bytes packed.
local function asm_lines(b)
  if b.annotate then
    local lines = { unpack(b.lines) }
    lines[#lines + 1] = { x86.line("vzeroupper"), "vzeroupper" }
    return lines
  end
  local out, run = {}, {}
  local function flush()
    for _, l in ipairs(#run > 0 and packed(table.concat(run)) or {}) do out[#out + 1] = { l } end
    run = {}
  end
  for _, l in ipairs(b.lines) do
    if l.bytes then run[#run + 1] = l.bytes else flush(); out[#out + 1] = l end
  end
  run[#run + 1] = x86.bytes_cached("vzeroupper")
  flush()
  return out
end

-- The C asm statement of a block: one string line per instruction (or per
-- packed run of them).
function M.statement(b, ind)
  ind = ind or "        "
  local out = { ind .. "__asm__ __volatile__(" }
  for _, l in ipairs(asm_lines(b)) do
    out[#out + 1] = ('%s  "%s\\n\\t"%s'):format(ind, l[1], l[2] and ("  /* " .. l[2] .. " */") or "")
  end
  out[#out + 1] = ind .. '  : : "r"(&aa) : "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11", "memory", "cc" FD_VCLOBBER);'
  return table.concat(out, "\n")
end

-- Blocks depend only on these parameters (a new key digit a micro-kernel
-- reads belongs here: the planes digit did); memoize them, since a kernel emits
-- max and exp once per head and a plan compiles three variants of one kernel.
-- The memo is emptied when it reaches MEMO_MAX blocks, so a long-running
-- process that generates many kernels does not grow without bound.
local MEMO_MAX = 256
local memo, memo_n = {}, 0
local MEMOIZED = { "scores", "max", "exp", "softcap", "alibi", "pv", "pv_dpbf16", "pround", "qload", "store_out",
                   "scale_records", "grow_lanes", "sums_lanes", "merge_first", "merge_add" }
for _, name in ipairs(MEMOIZED) do
  local build = M[name]
  M[name] = function(isa, p, blk)
    local k = table.concat({ name, isa, p.D, p.T, p.CHUNKP, p.KV_DTYPE, p.Q_DTYPE, p.OUT_DTYPE, tostring(p.QUANT), p.REC,
                             tostring(p.NO_AHEAD), tostring(p.ANNOTATE), p.PLANES or 0, p.PRECISION or 0,
                             blk and table.concat(blk, ",") or "" }, ":")
    if not memo[k] then
      if memo_n >= MEMO_MAX then memo, memo_n = {}, 0 end
      memo[k], memo_n = build(isa, p, blk), memo_n + 1
    end
    return memo[k]
  end
end

return M
