-- The facts shared by the generator, the runtime, the tuner and the bindings,
-- each stated once here (docs/DESIGN.md "One source per fact"). gen/build.lua
-- keydefs writes them into build/fd_keydefs.h for C (with _Static_asserts
-- against runtime/flashdecode.h's enums), gen/build.lua python into
-- python/flashdecode/_facts.py (make runs both; tests/test_facts.lua checks it);
-- gen/ and tuner/ require this module; lua/flashdecode.lua loads it from the
-- tree or from its install copy (flashdecode_facts.lua). Plain Lua 5.1 code,
-- so LuaJIT loads it too.
local M = {}

-- Element types, by fd_dtype value. text: the name in messages; size: bytes;
-- quant: int8/fp8 codes times a per-row f32 scale; io: also a q/out dtype;
-- bits: converted through the f32 bit-cast temporary (f16, bf16, fp8); hu:
-- through the 16-bit one too; float: a binary floating-point code (man:
-- stored mantissa bits; inf: an all-ones exponent is infinity or NaN, as
-- IEEE; else only the all-ones magnitude is NaN, e4m3's "fn" form), which
-- float_bits describes.
M.dtypes = {
  [0] = { name = "f32", enum = "FD_F32", text = "f32", size = 4, storage = "float", io = true,
          float = { man = 23, inf = true } },
  { name = "f16", enum = "FD_F16", text = "f16", size = 2, storage = "fd_u16", io = true, bits = true, hu = true,
    float = { man = 10, inf = true } },
  { name = "bf16", enum = "FD_BF16", text = "bf16", size = 2, storage = "fd_u16", io = true, bits = true,
    float = { man = 7, inf = true } },
  { name = "i8", enum = "FD_I8", text = "int8", size = 1, storage = "signed char", quant = true },
  { name = "fp8", enum = "FD_FP8_E4M3", text = "fp8 e4m3", size = 1, storage = "unsigned char", quant = true,
    bits = true, hu = true, float = { man = 3, inf = false } },
  -- fp8 e5m2: the upper byte of an f16 (bias 15, infinities, largest 57344)
  { name = "e5m2", enum = "FD_FP8_E5M2", text = "fp8 e5m2", size = 1, storage = "unsigned char", quant = true,
    bits = true, hu = true, float = { man = 2, inf = true } },
  -- ggml's block formats (llama.cpp's q8_0 / q4_0 KV cache types): no per-element
  -- size; block: n elements in bytes bytes, an f16 scale d first, then the codes
  -- (q8_0: int8 j -> d * qs[j]; q4_0: nibbles, low ones elements 0..15, high
  -- ones 16..31, -> d * (nibble - 8)). A row is head_dim / n blocks; strides
  -- count bytes (storage unsigned char). KV dtypes only, no row scales.
  { name = "q8_0", enum = "FD_Q8_0", text = "q8_0", storage = "unsigned char", bits = true, hu = true,
    block = { n = 32, bytes = 34 } },
  { name = "q4_0", enum = "FD_Q4_0", text = "q4_0", storage = "unsigned char", bits = true, hu = true,
    block = { n = 32, bytes = 18 } },
}
M.mask_modes = {
  [0] = { name = "causal", enum = "FD_CAUSAL", text = "causal" },
  { name = "mask", enum = "FD_MASK", text = "additive mask" },
  { name = "full", enum = "FD_FULL", text = "full" },
}
M.layouts = {
  [0] = { name = "bhsd", enum = "FD_BHSD" },
  { name = "bshd", enum = "FD_BSHD" },
  { name = "paged", enum = "FD_PAGED", paged = true },   -- pools [pool_pages, Hkv, page_size, D] + block table
}

-- fd_shape.features bits (docs/DESIGN.md "What serving engines need"), by
-- bit value; served: the library serves the bit (else FD_EUNSUPPORTED).
M.features = {
  { name = "alibi", enum = "FD_ALIBI", bit = 1, served = true },
  { name = "sink_logits", enum = "FD_SINK_LOGITS", bit = 2, served = true },
  { name = "new_kv", enum = "FD_NEW_KV", bit = 4, served = true },
  -- cleared: the planner's executed shape clears the bit (exec_shape joins the
  -- rows into one), so the shape signature has no token for it
  { name = "shared_kv", enum = "FD_SHARED_KV", bit = 8, served = true, cleared = true },
  { name = "k_per_channel", enum = "FD_K_PER_CHANNEL", bit = 16, served = true },
  { name = "beams", enum = "FD_BEAMS", bit = 32, served = true },
}

-- ISA capability records, by tiling-key isa digit (fd_plan_opts.isa - 1).
-- W: f32 lanes per vector; reg, nregs: the vector register file; max_tile:
-- the most heads a group tile may hold in registers; head_lane_tile: the tile
-- of the head-lane kernels (one lane per head), if any; fallback: the digit a
-- shape without a variant here steps down to (-1: none); groups: instruction
-- groups the micro-kernels may use; cpuid: the CPU features it needs (names
-- as in tuned-table headers), xcr0: the register state the OS must save;
-- other_hint: the prefetch instruction by which the scores pass of a tile of
-- at least gen/simd.lua PREFETCH_MIN_TILE heads fetches the V rows it is about
-- to need (the other stream, one phase ahead), measured per record.
-- Adding an ISA variant is one record here plus its micro-kernels. The
-- records form one chain by fallback (3 -> 4 -> 2 -> 1 -> 0), so a record's
-- rank (its depth on the chain: M.isa_rank) orders them by what they need:
-- a CPU with a record has every record of lower rank, and "at most isa d"
-- (fd_config.isa_limit, $FD_MAX_ISA, a context's best) means rank at most
-- d's, not digit at most d.
M.isas = {
  [0] = { name = "c", enum = "FD_ISA_C", text = "portable C", W = 1, nregs = 0, max_tile = 99, fallback = -1,
          groups = {}, cpuid = {}, xcr0 = 0 },
  { name = "avx2", enum = "FD_ISA_AVX2", text = "AVX2+FMA+F16C", short = "AVX2", W = 8, reg = "ymm", nregs = 16,
    max_tile = 12, fallback = 0, groups = { fma = true, f16c = true, msd16 = true }, other_hint = "prefetcht1",
    cpuid = { "avx2", "fma", "f16c" }, xcr0 = 0x6 },
  { name = "avx512", enum = "FD_ISA_AVX512", text = "AVX-512", short = "AVX-512", W = 16, reg = "zmm", nregs = 32,
    max_tile = 32, head_lane_tile = 16, fallback = 1, other_hint = "prefetcht1",
    groups = { fma = true, f16c = true, avx512f = true, avx512bw = true, avx512vl = true },
    cpuid = { "avx512f", "avx512bw", "avx512vl" }, xcr0 = 0xe6 },
  -- AVX-512 with the pair dot products: vdpbf16ps (AVX512-BF16) scores bf16 q
  -- against bf16 K with exact products; vpdpbusd (AVX512-VNNI) is reserved for
  -- the int8 kernels. cpuid lists what it adds to its fallback's features.
  -- Its V prefetch goes into L1 (prefetcht0): on the Zen 5 EPYC, the only
  -- machine of this record measured, the cold calls of the bound shapes took
  -- 0.935x and 0.947x (Llama bf16 64k), 0.898x and 0.973x (the MQA batch),
  -- 0.888x and 0.895x (Falcon-40B) and 0.954x and 0.971x (int8) the time of
  -- prefetcht1 (two runs of `make bench-builds MODE=cold ROUNDS=31`); warm
  -- (K/V in the L3) 0.996-1.029x. The other records keep L2:
  -- on the Xeon (AVX-512+VNNI) into L1 measured slower.
  { name = "avx512bf16", enum = "FD_ISA_AVX512_BF16", text = "AVX-512+BF16+VNNI", short = "AVX-512-BF16", W = 16,
    reg = "zmm", nregs = 32, max_tile = 32, head_lane_tile = 16, fallback = 4, other_hint = "prefetcht0",
    groups = { fma = true, f16c = true, avx512f = true, avx512bw = true, avx512vl = true, bf16 = true, vnni = true },
    cpuid = { "avx512_bf16" }, xcr0 = 0xe6 },
  -- AVX-512 with vpdpbusd (AVX512-VNNI) but no bf16 dot products (Ice Lake and
  -- Cascade Lake servers): the int8 kernels' MSD planes; bf16 q and K take the
  -- f32 FMA scores of AVX-512. Digit 4 although it ranks below digit 3.
  { name = "avx512vnni", enum = "FD_ISA_AVX512_VNNI", text = "AVX-512+VNNI", short = "AVX-512-VNNI", W = 16,
    reg = "zmm", nregs = 32, max_tile = 32, head_lane_tile = 16, fallback = 2, other_hint = "prefetcht1",
    groups = { fma = true, f16c = true, avx512f = true, avx512bw = true, avx512vl = true, vnni = true },
    cpuid = { "avx512_vnni" }, xcr0 = 0xe6 },
}

-- The rank of isa digit d: its depth on the fallback chain (portable C 0).
function M.isa_rank(d)
  local n = 0
  while M.isas[d].fallback >= 0 do d, n = M.isas[d].fallback, n + 1 end
  return n
end

-- Whether isa digit d ranks at most max_isa (a context of best digit max_isa may use it).
function M.isa_within(d, max_isa)
  return M.isa_rank(d) <= M.isa_rank(max_isa)
end

-- The isa digits of rank at most max_isa's, lowest rank first.
function M.isas_upto(max_isa)
  local out = {}
  for d = 0, #M.isas do if M.isa_within(d, max_isa) then out[#out + 1] = d end end
  table.sort(out, function(a, b) return M.isa_rank(a) < M.isa_rank(b) end)
  return out
end
-- The instruction groups a record may name, in this order in generated C.
-- msd16: MSD scores by int16 pair products (vpmaddwd, AVX2): 2 planes only,
-- held as one int16 plane of q (M.msd16_fits).
M.GROUPS = { "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "bf16", "vnni", "msd16" }
-- Where CPUID reports each feature: leaf, subleaf, register (0 eax .. 3 edx), bit.
M.CPUID = {
  avx2 = { 7, 0, 1, 5 }, fma = { 1, 0, 2, 12 }, f16c = { 1, 0, 2, 29 },
  avx512f = { 7, 0, 1, 16 }, avx512bw = { 7, 0, 1, 30 }, avx512vl = { 7, 0, 1, 31 },
  avx512_bf16 = { 7, 1, 0, 5 }, avx512_vnni = { 7, 0, 2, 11 },
}

-- Key flag bits and the three kernels the planner compiles per bucket, in
-- the order of fd_bucket's plain, with_lse and split slots.
M.FLAG_SPLIT, M.FLAG_LSE, M.FLAG_RESERVED = 1, 2, 4
M.variants = { { name = "plain", flags = 0 }, { name = "lse", flags = 2 }, { name = "split", flags = 1 } }

-- Limits: MAX_CHUNK bounds sc[] (group_tile * chunk floats on the stack);
-- the others are the key fields' ranges (gen/key.lua takes them from here).
M.MAX_CHUNK = 4096
M.MAX_TILE = 99
M.HEAD_DIM_MIN, M.HEAD_DIM_MAX = 1, 999
-- Paged layout: page_size a power of two in this range (keys per pool page).
M.PAGE_SIZE_MIN, M.PAGE_SIZE_MAX = 16, 1024
-- Query tokens per row (fd_shape.q_len; 0 means 1).
M.Q_LEN_MAX = 16
-- The planner heuristic's keys per chunk: portable C, and the vector ISAs (the
-- tuner picked 256-512 on most shapes); the exported header's default row
-- takes the first.
M.H_CHUNK, M.H_CHUNK_SIMD = 128, 256
-- The planner heuristic's MSD planes (key digit planes) for int8 K on an isa
-- with the vnni group (0: f32 FMA scores there too). So the tuner's isa digit
-- chooses between f32 FMA scores (isa 2) and MSD (isa 3 or 4) for int8 K.
M.H_PLANES = 3

-- Whether n MSD planes of head_dim D fit a head's q row (4 D bytes: the
-- planes, n int32 biases, n f32 scales); runtime/plan.c heuristic_planes
-- states the same bound in C.
function M.planes_fit(n, D)
  return n * D + 8 * n <= 4 * D
end

-- MSD scores on a record with the msd16 group (AVX2, no int8 dot products):
-- q as one int16 plane, Q = round(q 32767 / max |q|) (the bits of 2 int8
-- planes and one more), each vpmaddwd the products of 16 K elements widened
-- to int16, summed exactly in int32 (|Q k| < 2^22, D <= 999: below 2^31),
-- in the direct scores (groups of 8 / tile keys, tiles of MSD16_TILES[1] to
-- MSD16_TILES[2] heads: one key's heads fill the 8 accumulators at most)
-- over whole 16-element pieces of a row (head_dim a multiple of MSD16_D).
-- Only the planes digit 2 (2 int8 planes' accuracy, fast precision's) takes it.
M.MSD16_TILES = { 2, 8 }
M.MSD16_D = 16
function M.msd16_fits(tile, D)
  return tile >= M.MSD16_TILES[1] and tile <= M.MSD16_TILES[2] and D % M.MSD16_D == 0
end

-- The tuned table: magic line, identity lines (name TAB value), columns.
-- ratio_ci: the row's 95% interval of its median time ratio to the heuristic
-- ("0.912..0.951", tuner/stats.lua), "-" for the heuristic's own configuration.
M.TABLE_MAGIC = "flashdecode tuned table 2"
M.TABLE_IDENTITY = { "library", "templates", "tcc", "cpu", "features" }
M.TABLE_COLUMNS = { "shape", "bucket", "key", "splits", "threads", "median_us", "gbps", "heuristic_us", "name",
                    "ratio_ci" }

-- The cost model (tuner/model.lua fits it, runtime/model.c evaluates it): a
-- linear model of log(time) within one measured job (the job's own mean taken
-- out, so only the configuration's terms and their products with the shape's
-- matter), written into the tuned table as lines "model" TAB name TAB value
-- before the end line. MODEL_VARS: the inputs, each a double: G query heads
-- per kv head, D head_dim, kvb kv element bytes, rows batch x n_kv_heads, len
-- keys, q query tokens (at least 1), paged 1 for the paged layout, then the
-- configuration: chunk, tile, isa digit, splits, threads. MODEL_FEATURES: name
-- and expression, in the subset of syntax C and Lua share (+ - * / and the
-- functions ln, max, eq: 1 when equal else 0); gen/build.lua turns them into
-- fd_model_features() in fd_keydefs.h, M.model_features() compiles the same
-- text for Lua: one definition. MODEL_LIMITS: the range of the fitted
-- measurements the planner keeps its candidates inside (no extrapolation).
M.MODEL_LINE = "model"
M.MODEL_VARS = { "G", "D", "kvb", "rows", "len", "q", "paged", "chunk", "tile", "isa", "splits", "threads" }
M.MODEL_FEATURES = {
  { "isa_c", "eq(isa, 0)" }, { "isa_avx2", "eq(isa, 1)" },
  { "isa_c_g", "eq(isa, 0) * ln(G)" }, { "isa_avx2_g", "eq(isa, 1) * ln(G)" },
  { "isa_c_d", "eq(isa, 0) * ln(D)" }, { "isa_avx2_d", "eq(isa, 1) * ln(D)" },
  { "chunk", "ln(chunk)" }, { "chunk2", "ln(chunk) * ln(chunk)" },
  { "chunk_g", "ln(chunk) * ln(G)" }, { "chunk_len", "ln(chunk) * ln(len)" }, { "chunk_d", "ln(chunk) * ln(D)" },
  { "chunk_c", "ln(chunk) * eq(isa, 0)" }, { "chunk_avx2", "ln(chunk) * eq(isa, 1)" },
  { "chunk_kvb", "ln(chunk) * kvb" }, { "chunk_rows", "ln(chunk) * ln(rows)" },
  { "chunk_q", "ln(chunk) * ln(q)" }, { "chunk_paged", "ln(chunk) * paged" },
  { "tiles", "ln(G / tile)" }, { "tiles2", "ln(G / tile) * ln(G / tile)" },
  { "tiles_c", "ln(G / tile) * eq(isa, 0)" }, { "tiles_avx2", "ln(G / tile) * eq(isa, 1)" },
  { "tiles_d", "ln(G / tile) * ln(D)" }, { "tiles_q", "ln(G / tile) * ln(q)" },
  { "tile_lane", "eq(tile, 16) * (eq(isa, 2) + eq(isa, 4))" }, { "isa_dp", "eq(isa, 3)" },
  { "idle", "ln(max(1, threads / (rows * splits)))" },
  { "threads", "ln(threads)" }, { "threads_rows", "ln(threads) * ln(rows)" }, { "threads_len", "ln(threads) * ln(len)" },
  { "splits", "ln(splits)" }, { "splits_len", "ln(splits) * ln(len)" }, { "splits_rows", "ln(splits) * ln(rows)" },
  { "short", "ln(max(1, chunk * splits / len))" },
  { "isa_vnni", "eq(isa, 4)" },
}
-- items_max: the most split work items per thread (batch x n_kv_heads x
-- splits / threads) among the measurements with splits > 1; a candidate with
-- more splits than one must stay within it (the log holds no evidence beyond).
-- splits_up, splits_up_len: the largest factor by which a winner the log's
-- paired verification kept multiplied the heuristic's splits (1 when none
-- did), and the longest length such a winner had (0 when none); the
-- planner's decision takes no more splits than the heuristic's times
-- splits_up, and no more than the heuristic's beyond splits_up_len.
-- margin_kernel, margin_splits, margin_threads: what a move off the
-- heuristic's configuration must gain, in predicted log time, beyond
-- MODEL_MARGIN: the largest over the classes it moves (the kernel: chunk,
-- tile or isa; the splits; the threads); tuner/model.lua calibrate sets each
-- from the model's own leave-one-shape-out errors on the log's verified moves
-- of that class, so the planner leaves the heuristic only where the predicted
-- gain exceeds what the fit gets wrong for that kind of move.
-- len_max and <var>_min, <var>_max of the shape's G, D, kvb, rows, q: the
-- measured range; the planner's decision keeps the heuristic's configuration
-- for a shape or length outside it (the products with the shape's terms
-- would extrapolate).
M.MODEL_SHAPE_VARS = { "G", "D", "kvb", "rows", "q" }
-- kv_dtypes: the sum of 2^kv_dtype over the KV dtypes measured; a shape of
-- another KV dtype keeps the heuristic (its kernels' arithmetic, e.g. MSD or
-- block dequantization, is no term of the fit).
M.MODEL_LIMITS = { "chunk_min", "chunk_max", "splits_max", "threads_max", "items_max", "len_max", "splits_up",
                   "splits_up_len", "margin_kernel", "margin_splits", "margin_threads", "kv_dtypes" }
for _, v in ipairs(M.MODEL_SHAPE_VARS) do
  M.MODEL_LIMITS[#M.MODEL_LIMITS + 1] = v .. "_min"
  M.MODEL_LIMITS[#M.MODEL_LIMITS + 1] = v .. "_max"
end
-- The planner takes the model's best only when it predicts it at least this
-- much faster than the heuristic's configuration (a log-time difference:
-- 0.03 is 3%), else the heuristic's configuration, so a near tie of the model
-- never moves the planner off the heuristic.
M.MODEL_MARGIN = 0.03

-- The cost model's features as a Lua function of a table of MODEL_VARS:
-- returns the list of feature values (MODEL_FEATURES' order).
function M.model_features()
  local env = { ln = math.log, max = math.max, eq = function(a, b) return a == b and 1 or 0 end }
  local body = {}
  for i, f in ipairs(M.MODEL_FEATURES) do body[i] = f[2] end
  local src = "local v = ...\nlocal " .. table.concat(M.MODEL_VARS, ", ") .. " = "
  for i, n in ipairs(M.MODEL_VARS) do src = src .. (i > 1 and ", " or "") .. "v." .. n end
  src = src .. "\nreturn { " .. table.concat(body, ", ") .. " }"
  return assert(load(src, "=MODEL_FEATURES", "t", env))
end

-- A MODEL_FEATURES expression as C over struct pointer v (fd_model_vars *).
function M.model_c_expr(e)
  local known = {}
  for _, n in ipairs(M.MODEL_VARS) do known[n] = "v->" .. n end
  known.ln, known.max, known.eq = "log", "fmax", "fd_model_eq"
  return (e:gsub("[%a_][%w_]*", function(id) return assert(known[id], "MODEL_FEATURES: unknown name " .. id) end))
end

-- The shape signature (tuned tables' shape column): tokens joined by '.', in
-- this order. A value token is its prefix then the fd_shape field's value (an
-- integer, or the name of its enum value); one with `omit = v` is left out
-- when the value is at most v (so q_len 0 and 1 write nothing, window 0
-- nothing). A flag token (`flag`) is its text alone, written when the field
-- is on: `on`, a float above 0 (softcap: only that it is on is recorded, so a
-- parsed signature holds SIGNATURE_ON, a positive placeholder that signs the
-- same); `bit`, that bit of fd_shape.features (one token per feature bit the
-- executed shape keeps, by bit value). So the tokens are what changes a
-- kernel's cost: a softcap, ALiBi or windowed shape has rows of its own, and
-- a plain shape's signature has none of them. sink_tokens is not part of it.
-- runtime/plan.c (from fd_keydefs.h), gen/export.lua and the tuner read this.
M.SIGNATURE_ON = 1
M.SIGNATURE = {
  { "b", "batch" }, { "hq", "n_q_heads" }, { "hkv", "n_kv_heads" }, { "d", "head_dim" },
  { "q", "q_dtype", "dtypes", io = true }, { "kv", "kv_dtype", "dtypes" }, { "o", "out_dtype", "dtypes", io = true },
  { "", "mask_mode", "mask_modes" }, { "", "layout", "layouts" },
  { "t", "q_len", omit = 1 }, { "w", "window", omit = 0 },
  { "softcap", "softcap", flag = true, on = true },
}
for _, f in ipairs(M.features) do
  if not f.cleared then M.SIGNATURE[#M.SIGNATURE + 1] = { f.name, "features", flag = true, bit = f.bit } end
end

-- The fd_asm_args struct of the SIMD asm statements (templates/simd_prelude.c.tpl
-- writes it from this list; gen/simd.lua takes the offsets): C type, name,
-- comment; every field 8 bytes, so field i is at offset 8 i (asserted in C).
M.ASM_ARGS = {
  { "const void *", "src", "K or V row 0 of the chunk (+ head_dim offset)" },
  { "float *", "ptr", "q tile, score row or accumulator records" },
  { "float *", "sc", "scores of the tile's first head" },
  { "fd_i64 ", "n", "keys, or padded scores" },
  { "fd_i64 ", "stride", "bytes from one K/V row to the next" },
  { "const float *", "scl", "per-row scale of row 0 (int8/fp8)" },
  { "fd_i64 ", "scl_stride", "bytes from one row's scale to the next" },
  { "const void *", "consts", "fd_simd_c" },
  { "const float *", "in", "running max in" },
  { "float *", "out", "max or sum out" },
  { "float *", "stage", "f32 staging block of one group of K rows" },
  { "const void *", "pf", "rows to prefetch meanwhile (V of this chunk, K of the next)" },
  { "const void *", "pf_v", "V rows of the next chunk (the head-lane P.V prefetches them)" },
}

-- The names of an enum table's values, by value ({ [0] = "f32", ... }), up to max.
function M.names(t, max)
  local out = {}
  for i = 0, max or #t do out[i] = t[i].name end
  return out
end

-- The value of name in enum table t, or nil.
function M.value(t, name)
  for i = 0, #t do if t[i].name == name then return i end end
  return nil
end

-- The bit fields of float dtype d's codes (nil for an integer dtype), as
-- integers: sign; nonfinite, the bits all set in a NaN or an infinity; man,
-- the bits of which one set makes such a code NaN; bias; max, the largest
-- finite code; inf, the +infinity code (nil: none); nan, the quiet +NaN code.
function M.float_bits(d)
  local f = M.dtypes[d].float
  if not f then return nil end
  local bits = 8 * M.dtypes[d].size
  local sign, one = math.floor(2 ^ (bits - 1)), math.floor(2 ^ f.man)
  local t = { sign = sign, bias = math.floor(2 ^ (bits - 2 - f.man)) - 1 }
  if f.inf then
    t.nonfinite, t.man, t.inf = sign - one, one - 1, sign - one
    t.max, t.nan = t.inf - 1, t.inf + math.floor(one / 2)
  else
    t.nonfinite, t.man, t.nan = sign - 1, sign - 1, sign - 1
    t.max = sign - 2
  end
  return t
end

-- Elements per storage block of dtype d and the block's bytes: (1, size)
-- for a per-element dtype, (32, 34) for q8_0, (32, 18) for q4_0.
function M.dtype_block(d)
  local t = M.dtypes[d]
  if t.block then return t.block.n, t.block.bytes end
  return 1, t.size
end

-- Bytes of n elements of dtype d (n a multiple of its block: a K/V row of head_dim n).
function M.kv_bytes(d, n)
  local bn, bb = M.dtype_block(d)
  return math.floor(n / bn) * bb
end

-- Bytes per element of dtype d, fractional for a block dtype (q8_0 34/32).
function M.elem_bytes(d)
  local bn, bb = M.dtype_block(d)
  return bb / bn
end

-- The largest dtype value a q or out array may take.
function M.io_dtype_max()
  local n = 0
  for i = 0, #M.dtypes do if M.dtypes[i].io then n = i end end
  return n
end

-- The sum of the feature bits whose record satisfies pred.
function M.feature_bits(pred)
  local m = 0
  for _, f in ipairs(M.features) do if pred(f) then m = m + f.bit end end
  return m
end

-- The byte offset of each fd_asm_args field, by name.
function M.asm_arg_offsets()
  local t = {}
  for i, f in ipairs(M.ASM_ARGS) do t[f[2]] = (i - 1) * 8 end
  return t
end

-- The C declaration of fd_asm_args field i, with its offset in a comment
-- (i64: the 64-bit integer type, default fd_i64).
function M.asm_arg_line(i, i64)
  local f = M.ASM_ARGS[i]
  local ctype = i64 and f[1] == "fd_i64 " and i64 .. " " or f[1]
  return ("  %-26s/* %2d: %s */"):format(ctype .. f[2] .. ";", (i - 1) * 8, f[3])
end

-- The fd_asm_args typedef as C text (name and the 64-bit integer type as given,
-- else fd_asm_args and fd_i64).
function M.asm_args_c(name, i64)
  name = name or "fd_asm_args"
  local out = { "typedef struct " .. name .. " {" }
  for i = 1, #M.ASM_ARGS do out[#out + 1] = M.asm_arg_line(i, i64) end
  out[#out + 1] = "} " .. name .. ";"
  return table.concat(out, "\n")
end

-- Is bit set in the non-negative integer v (Lua 5.1 arithmetic, no bit library)?
local function has_bit(v, bit) return math.floor(v / bit) % 2 == 1 end

-- The feature bits that have a signature token.
function M.signature_feature_bits()
  local m = 0
  for _, f in ipairs(M.SIGNATURE) do if f.bit then m = m + f.bit end end
  return m
end

-- Is flag token f on in shape s (numeric fields; missing ones are 0)?
local function flag_on(f, s)
  local v = s[f[2]] or 0
  if f.bit then return has_bit(v, f.bit) end
  return v > 0
end

-- The signature text of shape s (numeric fields: the shape the planner
-- executes), or nil when a field is unknown or a feature bit has no token.
function M.signature(s)
  local parts, rest = {}, s.features or 0
  for _, f in ipairs(M.SIGNATURE) do
    local v = s[f[2]]
    if f.flag then
      if flag_on(f, s) then
        parts[#parts + 1] = f[1]
        if f.bit then rest = rest - f.bit end
      end
    elseif not (f.omit and (v or 0) <= f.omit) then
      if f[3] then
        local e = M[f[3]][v]
        if not e or (f.io and not e.io) then return nil end
        v = e.name
      end
      parts[#parts + 1] = f[1] .. v
    end
  end
  if rest ~= 0 then return nil end
  return table.concat(parts, ".")
end

-- Does token text belong to signature field f: its prefix then a value (a
-- value field), or exactly its text (a flag)?
local function token_of(f, text)
  if f.flag then return text == f[1] end
  return #text > #f[1] and text:sub(1, #f[1]) == f[1]
end

-- The value of token text of value field f (its prefix taken off), or nil.
local function token_value(f, text)
  local v = text:sub(#f[1] + 1)
  if f[3] then return M.value(M[f[3]], v) end
  return #v <= 9 and v:match("^[1-9]%d*$") and tonumber(v) or nil
end

-- A shape signature read back into numeric fields, or nil when it is not one
-- in canonical form (written again, it must give the same text): duplicate,
-- misplaced or unknown tokens are refused. A flag field's value: the sum of
-- its bits (features), SIGNATURE_ON when on (softcap), else 0.
function M.parse_signature(sig)
  local toks = {}
  for t in (sig .. "."):gmatch("([^.]*)%.") do toks[#toks + 1] = t end
  local s, i = {}, 1
  for n, f in ipairs(M.SIGNATURE) do
    local optional = n > 1 and (f.omit or f.flag)
    if f.flag or f.omit then s[f[2]] = s[f[2]] or 0 end
    local t = toks[i]
    if t and token_of(f, t) then
      if f.flag then s[f[2]] = f.bit and s[f[2]] + f.bit or M.SIGNATURE_ON
      else
        s[f[2]] = token_value(f, t)
        if s[f[2]] == nil then return nil end
      end
      i = i + 1
    elseif not optional then
      return nil
    end
  end
  if i ~= #toks + 1 or s.n_q_heads % s.n_kv_heads ~= 0 or s.head_dim > M.HEAD_DIM_MAX or M.signature(s) ~= sig then return nil end
  return s
end

-- The fd_shape fields the signature records, once each in token order:
-- { name, kind }, kind "value" (the field's integer), "on" (1 when the float
-- is above 0, else 0: softcap) or "bits" (the feature bits that have tokens).
function M.signature_fields()
  local out, seen = {}, {}
  for _, f in ipairs(M.SIGNATURE) do
    if not seen[f[2]] then
      seen[f[2]] = true
      out[#out + 1] = { f[2], f.bit and "bits" or f.on and "on" or "value" }
    end
  end
  return out
end

-- Does parsed signature s (numeric fields) carry a token beyond the plain
-- shape's: a window, softcap or feature bit (the cost model fits only rows without)?
function M.signature_has_features(s)
  return (s.window or 0) > 0 or (s.softcap or 0) > 0 or (s.features or 0) ~= 0
end

-- Why decoded key fields f cannot serve shape s, or nil when they can.
function M.misfit(f, s)
  for _, n in ipairs(M.FIT_SAME) do
    if f[n] ~= s[n] then return ("its %s is %s but the shape's is %s"):format(n, f[n], s[n]) end
  end
  if f.flags ~= 0 then return ("its flags digit is %d; a row holds the plain key (flags 0)"):format(f.flags) end
  local G = s.n_q_heads / s.n_kv_heads
  if G % f.group_tile ~= 0 then
    return ("its group tile %d does not divide the shape's %d query heads per kv head"):format(f.group_tile, G)
  end
  return nil
end

-- fd_shape's fields in the order of runtime/flashdecode.h (gen/build.lua
-- asserts each offset there): C kind (int, i64, float, unsigned; enums are
-- int), and the enum table of an enum field. Bindings build their mirrors
-- from this list; a new fd_shape field is one line here plus its line there.
M.SHAPE_FIELDS = {
  { "batch", "int" }, { "n_q_heads", "int" }, { "n_kv_heads", "int" }, { "head_dim", "int" },
  { "kv_len", "i64" }, { "q_dtype", "int", "dtypes" }, { "kv_dtype", "int", "dtypes" },
  { "out_dtype", "int", "dtypes" }, { "mask_mode", "int", "mask_modes" }, { "layout", "int", "layouts" },
  { "page_size", "int" }, { "q_len", "int" }, { "pool_pages", "i64" }, { "window", "int" },
  { "sink_tokens", "int" }, { "softcap", "float" }, { "features", "unsigned" },
}
M.C_KIND_SIZE = { int = 4, i64 = 8, float = 4, unsigned = 4 }

-- The byte offset of each fd_shape field (natural alignment, x86-64 ABI) and the struct's size.
function M.shape_layout()
  local off, at, align = 0, {}, 1
  for _, f in ipairs(M.SHAPE_FIELDS) do
    local sz = M.C_KIND_SIZE[f[2]]
    off = math.ceil(off / sz) * sz
    at[f[1]] = off
    off = off + sz
    if sz > align then align = sz end
  end
  return at, math.ceil(off / align) * align
end

-- The tiling key's fields (docs/DESIGN.md "Tiling key"), least significant
-- first: name, first digit, digits, range, value names (enums); required:
-- no default (the others default to their least value). shape = true:
-- the field is the fd_shape field of that name, copied into the key by the
-- planner and compared by the fit check (FIT_SAME below); the others are the
-- planner's choices. cname: the field's name in fd_kernel_desc when the
-- name is a C++ keyword. gen/key.lua encodes and decodes with this table,
-- gen/build.lua turns it into fd_keydefs.h, templates see each field as its
-- upper-case name (gen/generate.lua), and fd_kernel_desc holds each one.
M.KEY_FIELDS = {
  { name = "layout",     pos = 0,  width = 1, min = 0, max = #M.layouts, names = M.names(M.layouts), shape = true },
  { name = "q_dtype",    pos = 1,  width = 1, min = 0, max = M.io_dtype_max(), names = M.names(M.dtypes, M.io_dtype_max()),
    shape = true },
  { name = "kv_dtype",   pos = 2,  width = 1, min = 0, max = #M.dtypes, names = M.names(M.dtypes), shape = true },
  { name = "out_dtype",  pos = 3,  width = 1, min = 0, max = M.io_dtype_max(), names = M.names(M.dtypes, M.io_dtype_max()),
    shape = true },
  { name = "mask_mode",  pos = 4,  width = 1, min = 0, max = #M.mask_modes, names = M.names(M.mask_modes), shape = true },
  { name = "flags",      pos = 5,  width = 1, min = 0, max = M.FLAG_SPLIT + M.FLAG_LSE },
  { name = "isa",        pos = 6,  width = 1, min = 0, max = #M.isas, names = M.names(M.isas) },
  { name = "group_tile", pos = 7,  width = 2, min = 1, max = M.MAX_TILE },
  { name = "head_dim",   pos = 9,  width = 3, min = M.HEAD_DIM_MIN, max = M.HEAD_DIM_MAX, shape = true, required = true },
  { name = "chunk",      pos = 12, width = 4, min = 1, max = 9999, required = true },
  { name = "template",   pos = 16, width = 1, min = 1, max = 1, cname = "template_id" },
  -- feature digits: 1 when the shape's features set the bit (the planner's
  -- fd_kernel_key, from fd_feature_digits); K scales per channel (KIVI, k_scale
  -- [B, Hkv, D] folded into q), keys through a beam indirection (beam_src)
  { name = "k_per_channel", pos = 17, width = 1, min = 0, max = 1, feature = 16 },
  { name = "beams",      pos = 18, width = 1, min = 0, max = 1, feature = 32 },
  -- MSD scores (the IFA seed's "AntiQuant MSD"): int8 K against q split per
  -- head into this many int8 planes, q ~= s (q0 + q1 2^-7 + q2 2^-14), each
  -- plane times K (+128 as u8) in int32 by vpdpbusd; 0 = off (f32 FMA
  -- scores), else 2 or 3; int8 K on a record with the vnni group only
  -- (gen/key.lua check_fields, gen/simd.lua scores_msd)
  { name = "planes",     pos = 19, width = 1, min = 0, max = 3 },
  -- fast precision (fd_config.precision FD_PRECISION_FAST): P.V with the
  -- softmax weights rounded to bf16, key pairs by vdpbf16ps; 0 = f32 weights;
  -- bf16 V on a record with the bf16 group, row-major tiles only
  -- (gen/key.lua precision_misfit, gen/simd.lua pv_dpbf16)
  { name = "precision",  pos = 20, width = 1, min = 0, max = 1 },
}
-- Digits of a key: past the most significant field.
M.KEY_DIGITS = 0
for _, f in ipairs(M.KEY_FIELDS) do M.KEY_DIGITS = math.max(M.KEY_DIGITS, f.pos + f.width) end

-- The fit check: a tuned row's key serves a shape when the key fields the
-- shape fixes (shape = true above) equal the shape's, its flags are 0 (a row
-- holds the plain key) and its group tile divides the query heads per kv
-- head. Its isa is no part of the fit.
M.FIT_SAME = {}
for _, f in ipairs(M.KEY_FIELDS) do if f.shape then M.FIT_SAME[#M.FIT_SAME + 1] = f.name end end

return M
