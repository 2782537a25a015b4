/* flashdecode: decode-phase attention (flash-decode) for CPUs, with kernels
   generated per shape and compiled at run time. See docs/DESIGN.md and README.md.

   Per batch row b and query head h (kv head j = h / G, G = n_q_heads / n_kv_heads):
     s_i = scale * q[b,h].K[b,j,i] (+ mask[b,h,i]),  out = softmax(s) V,  lse = log sum exp s
   over the valid keys: 0..cur_pos[b] (causal) or all kv_len keys (mask, full).

   Thread safety: a context may be used from several threads at once (plans are
   created and run concurrently; runs of one context share its thread pool and
   take turns; one plan may be run from several threads).
   Lifetime: a context lives while its handle or a plan of it does. fd_destroy
   may race fd_plan_create(_opts), fd_kernel_source and fd_run on the same
   context: each of them either completes as if before the destroy (a plan so
   created is valid, its runs then fail) or fails with FD_EDESTROYED, writing
   nothing. After fd_destroy the thread pool is stopped (once a run in
   progress ends) and kernels no plan holds are freed; fd_run on the plans
   left fails with FD_EDESTROYED, fd_plan_info_get still answers, and the
   last fd_plan_destroy frees the rest.
   Caller misuse, undefined behaviour: fd_destroy twice on one context,
   fd_plan_destroy twice on one plan or while the plan runs, and a call with
   a context that starts after fd_destroy of it returned with no plan left
   (fd_plan_create*, fd_kernel_source and fd_destroy look the context up and
   fail with FD_EDESTROYED or do nothing, unless a new context got the same
   address; fd_ctx_threads, fd_ctx_backend, fd_ctx_max_isa and fd_errmsg
   read freed memory). */
#ifndef FLASHDECODE_H
#define FLASHDECODE_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FD_VERSION "0.1.0"
/* Upper bounds, refused above with FD_EINVAL (tuned-table rows: the table is
   refused whole): fd_config.threads and fd_plan_opts.threads (and a table
   row's threads) at most FD_MAX_THREADS; a split plan (splits > 1) at most
   FD_MAX_SPLIT_ITEMS split work items, batch x n_kv_heads x splits, which
   bounds its scratch (that many records of group x (head_dim + 2) floats). */
#define FD_MAX_THREADS 1024
#define FD_MAX_SPLIT_ITEMS 16384
/* fd_config.deterministic: keys per split, K. Split s of a row covers keys
   [s K, min((s + 1) K, len)). K is doubled (a fact of the shape alone) while
   batch x n_kv_heads x ceil(kv_len / K) would pass FD_MAX_SPLIT_ITEMS. */
#define FD_DETERMINISTIC_SPLIT_KEYS 4096

/* The functions declared in this header are the only symbols libflashdecode
   exports: the library is compiled with hidden visibility by default. */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

/* Return codes: 0 or one of these. Every failure leaves a message in fd_errmsg. */
enum {
  FD_OK = 0,
  FD_EINVAL = -1,        /* a bad argument; the message names the field */
  FD_ENOMEM = -2,
  FD_ECOMPILE = -3,      /* generation or compilation of a kernel failed */
  FD_EUNSUPPORTED = -4,  /* a valid request this build cannot serve */
  FD_ETABLE = -5,        /* a tuned table was refused (the heuristic is used instead) */
  FD_EDESTROYED = -6,    /* the plan's context was destroyed */
  FD_ESYS = -7           /* a system call failed */
};

/* Enum values are the tiling-key digits. KV dtypes: f32, f16, bf16; FD_I8, FD_FP8_E4M3 (bias 7,
   no infinity, largest 448) and FD_FP8_E5M2 (bias 15, the upper byte of an f16: infinities,
   subnormals, largest 57344) times a per-row float scale (fd_args.k_scale, v_scale); FD_Q8_0 and
   FD_Q4_0, ggml's 32-element blocks (llama.cpp's q8_0 / q4_0 KV cache types): each block an f16
   scale d then the codes, q8_0 { f16 d; int8 qs[32]; } (34 bytes, value j = d * qs[j]), q4_0
   { f16 d; uint8 qs[16]; } (18 bytes, value j = d * ((qs[j] & 15) - 8) for j < 16, d * ((qs[j - 16]
   >> 4) - 8) above); a K/V row is head_dim / 32 blocks (head_dim a multiple of 32), the scales
   live in the blocks (k_scale and v_scale must be NULL). q and out: f32, f16, bf16. */
typedef enum fd_dtype { FD_F32 = 0, FD_F16 = 1, FD_BF16 = 2, FD_I8 = 3, FD_FP8_E4M3 = 4, FD_FP8_E5M2 = 5,
                        FD_Q8_0 = 6, FD_Q4_0 = 7 } fd_dtype;
typedef enum fd_mask_mode { FD_CAUSAL = 0, FD_MASK = 1, FD_FULL = 2 } fd_mask_mode;
typedef enum fd_layout { FD_BHSD = 0, FD_BSHD = 1, FD_PAGED = 2 } fd_layout;
typedef enum fd_backend { FD_BACKEND_TCC = 0, FD_BACKEND_CC = 1 } fd_backend;
/* ISA choices for fd_config.isa_limit and fd_plan_opts.isa: the tiling-key isa
   digit plus one, so that 0 (a zeroed struct) means "best available". By what
   they need they rank C < AVX2 < AVX512 < AVX512_VNNI < AVX512_BF16 (which
   has VNNI too): "at most" and "highest" below follow that order. */
enum { FD_ISA_AUTO = 0, FD_ISA_C = 1, FD_ISA_AVX2 = 2, FD_ISA_AVX512 = 3, FD_ISA_AVX512_BF16 = 4, FD_ISA_AVX512_VNNI = 5 };
/* fd_shape.features bits (docs/DESIGN.md "What serving engines need"). This
   build serves all six and their combinations but FD_BEAMS with FD_SHARED_KV
   (FD_EINVAL). FD_BEAMS with FD_K_PER_CHANNEL: key s uses the channel scales
   of its source row beam_src[b * kv_len + s]; with FD_NEW_KV: beam_src indexes
   the cached keys only, the new keys are the row's own; with check_inputs:
   the rows the keys read through beam_src are checked. */
enum { FD_ALIBI = 1, FD_SINK_LOGITS = 2, FD_NEW_KV = 4, FD_SHARED_KV = 8, FD_K_PER_CHANNEL = 16, FD_BEAMS = 32 };

typedef struct fd_config {
  int threads;              /* worker threads, at most FD_MAX_THREADS; 0 = all online cores (at most FD_MAX_THREADS) */
  fd_backend backend;       /* FD_BACKEND_TCC (default, embedded) or FD_BACKEND_CC (system compiler) */
  const char *table;        /* tuned table to plan from; NULL = heuristic only */
  const char *cache_dir;    /* cc backend cache, and (tcc, when set here or by $FD_CACHE_DIR) generated
                               sources keyed by key + build hash; NULL = $FD_CACHE_DIR, else $XDG_CACHE_HOME/flashdecode,
                               else ~/.cache/flashdecode. Created if missing; when no compiler runs or
                               it cannot be created or written, the context uses tcc and fd_errmsg(ctx)
                               says why (also on stderr) */
  int isa_limit;            /* FD_ISA_AUTO: best supported (lowered by $FD_MAX_ISA=0|1|2|3|4, a key digit);
                               FD_ISA_C / FD_ISA_AVX2 / FD_ISA_AVX512 / FD_ISA_AVX512_VNNI / FD_ISA_AVX512_BF16:
                               the highest allowed */
  int max_kernels;          /* kernel-cache bound; 0 = none: the least recently used kernel no live
                               plan uses is evicted (recompiled on next use); in-use ones never are */
  int check_inputs;         /* 1: fd_run first reads every q, K, V, scale and mask value the run will use and
                               refuses a NaN or an infinity (mask: NaN or +Inf; -Inf masks a key) with
                               FD_EINVAL naming the first one; it reads the cache once more. 0 (default): no check;
                               see "Non-finite values" below for what such inputs give */
  int deterministic;        /* 1: batch-invariant results: the out and lse bits of a batch row depend only on
                               its own inputs and length, the same for any thread count, any other rows (their
                               lengths, the batch size) and any run, within one backend and ISA. Every length
                               bucket uses one kernel key (the heuristic chunk and tile; a tuned table is not
                               used), a row is split at fixed multiples of FD_DETERMINISTIC_SPLIT_KEYS keys and
                               its splits merged in order; fd_plan_opts.splits is refused. 0 (default): splits
                               follow the threads and the batch's longest row (faster on uneven batches) */
  int precision;            /* FD_PRECISION_DEFAULT (0): f32 softmax weights. FD_PRECISION_FAST (1): P.V takes the
                               weights rounded to bf16, two keys per vdpbf16ps, where a kernel can serve it (bf16 V,
                               FD_ISA_AVX512_BF16); int8 K with MSD planes takes 2 planes of q instead of 3, and
                               int8 K and V on FD_ISA_AVX2 (group tiles 2 to 8, head_dim a multiple of 16) one
                               int16 plane of q (2 planes' digit) instead of f32 FMA scores; other shapes run at the default
                               precision (a permission, not a demand). README "Fast precision" has the errors */
} fd_config;

/* fd_config.precision */
enum { FD_PRECISION_DEFAULT = 0, FD_PRECISION_FAST = 1 };

typedef struct fd_shape {
  int batch, n_q_heads, n_kv_heads, head_dim;
  int64_t kv_len;           /* cache capacity along S */
  fd_dtype q_dtype, kv_dtype, out_dtype;
  fd_mask_mode mask_mode;
  fd_layout layout;
  int page_size;            /* FD_PAGED: keys per pool page, a power of two 16..1024; ignored otherwise */
  /* Appended fields (zero keeps the behaviour above); see docs/DESIGN.md. */
  int q_len;                /* query tokens per row: 0 or 1, or 2..16 (q/out [B, q_len, Hq, D], causal among them) */
  int64_t pool_pages;       /* FD_PAGED: pages in each of the K and V pools, at least 1; ignored otherwise */
  int window;               /* causal: a query at position p sees keys p-window+1..p; 0 = none */
  int sink_tokens;          /* with a window, keys 0..sink_tokens-1 stay visible */
  float softcap;            /* logit softcap: 0 none, else s = softcap x tanh(s / softcap) after the scale */
  unsigned features;        /* FD_ALIBI, FD_SINK_LOGITS, ... bits (the enum above says which are served) */
} fd_shape;

typedef struct fd_args {
  const void *q;            /* [B, Hq, D] q_dtype ([B, q_len, Hq, D] with q_len > 1) */
  const void *k, *v;        /* [B, Hkv, S, D] (BHSD) or [B, S, Hkv, D] (BSHD), kv_dtype; FD_PAGED: pools
                               [pool_pages, Hkv, page_size, D], key s of row b in page block_table[b][s / page_size]
                               at slot s % page_size */
  const int32_t *cur_pos;   /* [B], causal: the query's position, 0 <= cur_pos[b] < kv_len */
  const float *mask;        /* [B, Hq, kv_len] additive, mask mode; -inf masks a key out */
  const float *k_scale, *v_scale;  /* int8/fp8 (e4m3, e5m2): one float per K/V row, laid out as K without D
                                      (FD_PAGED: [pool_pages, Hkv, page_size]); FD_K_PER_CHANNEL: k_scale
                                      is [B, Hkv, D], one float per K channel (v_scale stays per row) */
  const int32_t *block_table;      /* FD_PAGED: [B, ceil(kv_len / page_size)] pool page indices; the entries of
                                      pages that hold a row's valid keys must be 0..pool_pages - 1 (checked) */
  float scale;              /* 0 = 1/sqrt(head_dim) */
  void *out;                /* [B, Hq, D] out_dtype ([B, q_len, Hq, D] with q_len > 1) */
  float *lse;               /* [B, Hq] ([B, q_len, Hq]) natural-log sum-exp, or NULL */
  /* Appended fields for the shape's features (docs/DESIGN.md). */
  const float *alibi_slopes;       /* FD_ALIBI: [Hq] */
  const float *sink_logits;        /* FD_SINK_LOGITS: [Hq] */
  const void *k_new, *v_new;       /* FD_NEW_KV: [B, q_len, Hkv, D] kv_dtype */
  const int32_t *beam_src;         /* FD_BEAMS: [B, kv_len]; key s of row b is read from cache row
                                      beam_src[b * kv_len + s], 0..B-1 (checked for the keys a row visits) */
} fd_args;

/* Non-finite values: IEEE arithmetic, as the double-precision reference (and
   PyTorch) give them, the same under every ISA, split count and backend. For
   head (b, h) over the keys it reads (0..cur_pos[b] causal, all kv_len else):
   - A score s_i = scale q.K_i (+ mask_i) that is NaN or +Inf (a NaN in q, K
     or k_scale; a +-Inf in q or K whose product is +Inf, or 0 x Inf; mask NaN
     or +Inf): out[b, h] and lse[b, h] are NaN. A -Inf score (mask -Inf, a
     -Inf product) drops the key; -Inf in the mask does not hide a NaN score.
   - NaN or +-Inf in V or v_scale of a key: NaN, or that infinity, in those
     columns of out for every head of its kv head; lse is unaffected. A key of
     weight 0 (masked, or e^(s_i - max) below e^-64) gives NaN there (0 x Inf).
   - A head with no visible key (every score -Inf): out exactly 0 and lse
     -inf, never NaN, whatever its keys' V hold.
   - Finite V up to FLT_MAX: the weighted mean, rounded; the f32 accumulators
     do not overflow (weights are scaled by 2^-32), so out is Inf only where
     the mean rounds past the out dtype's largest value.
   - fp8 e4m3 codes 0x7f and 0xff are NaN; fp8 e5m2 codes 0x7c and 0xfc are
     +-Inf, 0x7d-0x7f and 0xfd-0xff NaN (as the f16 they are the upper byte
     of); int8 codes are always finite.
   fd_config.check_inputs = 1 refuses all of these (except -Inf in the mask)
   with FD_EINVAL, e.g. "args.k[b=0, kv_head=1, key=17, d=3] is NaN": inputs
   in the order q, k, k_scale, v, v_scale, mask, each in index order. */

typedef struct fd_ctx fd_ctx;
typedef struct fd_plan fd_plan;

fd_ctx *fd_create(const fd_config *cfg);            /* NULL cfg: defaults; NULL result: see fd_errmsg(NULL) */
void fd_destroy(fd_ctx *ctx);
int fd_plan_create(fd_ctx *ctx, const fd_shape *shape, fd_plan **plan);
int fd_run(const fd_plan *plan, const fd_args *args);
void fd_plan_destroy(fd_plan *plan);
const char *fd_errmsg(const fd_ctx *ctx);           /* why the calling thread's last call failed */

/* Merge n partial results of the same queries over disjoint key sets (cascade
   attention, context parallelism): outs[i] [rows, head_dim] f32 (normalized),
   lses[i] [rows] (natural log). A state with lse -inf is empty and merges as
   the identity; all empty: out 0, lse -inf. A NaN lse gives NaN out and lse.
   lse may be NULL (not wanted). n >= 1, rows >= 0, head_dim >= 1; out may be
   one of outs[] only when n is 1. Errors: FD_EINVAL, message in fd_errmsg(NULL). */
int fd_merge_states(int n, const float *const outs[], const float *const lses[],
                    int64_t rows, int head_dim, float *out, float *lse);

/* ---- Additions for tools and tuning (not in the minimal API) ---- */

/* Force parts of a plan; 0 leaves a field to the planner (a zeroed struct forces nothing). */
typedef struct fd_plan_opts {
  int chunk;                /* keys per chunk */
  int group_tile;           /* query heads per pass over K/V; must divide n_q_heads / n_kv_heads */
  int splits;               /* splits of every (batch, kv head) range; above kv_len it is rounded down to
                               kv_len; batch x n_kv_heads x splits at most FD_MAX_SPLIT_ITEMS */
  int threads;              /* at most the context's threads (so at most FD_MAX_THREADS) */
  int isa;                  /* FD_ISA_C, FD_ISA_AVX2, FD_ISA_AVX512, FD_ISA_AVX512_VNNI or FD_ISA_AVX512_BF16 */
  int planes;               /* MSD int8 scores (the key's planes digit): 2 or 3 int8 planes of q through
                               vpdpbusd, int8 K on FD_ISA_AVX512_VNNI or _BF16; on FD_ISA_AVX2 2 only, as one
                               int16 plane of q through vpmaddwd, at group tiles 2 to 8 and head_dims that are
                               multiples of 16; -1 off (f32 FMA scores); 0 the planner's choice (a tuned
                               row's, else FD_H_PLANES for int8 K on an isa with int8 dot products) */
  int precision;            /* fast precision (the key's precision digit for bf16 V, 2 MSD planes for int8 K and
                               V): 0 the context's config.precision (where a kernel can serve it), -1 off, 1
                               forced: FD_EUNSUPPORTED where it cannot apply (V neither bf16 nor int8; bf16: an
                               isa without bf16 dot products, group tile 16; int8: an isa without int8 dot
                               products or AVX2's int16 plane, on AVX2 a group tile other than 3 and 4 or a
                               head_dim not a multiple of 16, opts.planes -1 or 3, a shape without MSD
                               planes); forced, the planner passes over a tuned row that cannot serve it */
} fd_plan_opts;

int fd_plan_create_opts(fd_ctx *ctx, const fd_shape *shape, const fd_plan_opts *opts, fd_plan **plan);

/* What a plan runs for a given longest valid length (a windowed shape: the
   bucket of the keys its window leaves, as fd_run takes it). */
typedef struct fd_plan_info {
  char key[24];             /* tiling key of the main kernel */
  char split_key[24];       /* tiling key of the split kernel ("" when unsplit) */
  int chunk, group_tile, splits, threads;
  int isa;                  /* the key's isa digit: 0 portable C, 1 AVX2, 2 AVX-512 */
  int from_table;           /* 1 when a tuned-table row chose it, 2 when the table's cost model did
                               (no row for the shape and length; README "the cost model") */
  int kernels_compiled;     /* kernels this plan generated and compiled (not already cached) */
  double compile_ms;        /* time spent generating and compiling them */
} fd_plan_info;
int fd_plan_info_get(const fd_plan *plan, int64_t kv_len, fd_plan_info *info);

/* Context facts: its threads, the backend in use (cc falls back to tcc), the best isa digit it may use (of the highest rank: FD_ISA_AUTO's order above). */
int fd_ctx_threads(const fd_ctx *ctx);
int fd_ctx_backend(const fd_ctx *ctx);
int fd_ctx_max_isa(const fd_ctx *ctx);
/* A short name for this machine, for result file names: the CPU model as a slug
   (lowercased, without the clock, (R), (TM), Processor, CPU and "N-Core"), the
   online core count and the best ISA the CPU and OS support (the key's isa
   name), e.g. "amd-epyc-2c-avx512bf16", "amd-epyc-2c-avx2", "intel-xeon-2c-avx512vnni". */
const char *fd_machine_name(void);
/* Identification of this build, for tuned tables: template hash and tcc version. */
const char *fd_build_templates_hash(void);
const char *fd_build_tcc_version(void);
/* Tuned tables (plain text, see README): the header this build on this machine
   writes and accepts, the canonical text of a shape in table rows (an
   FD_SHARED_KV shape reads as the one row it executes: batch 1, q_len =
   batch x q_len; a window, softcap and feature bits add tokens: ".w4096",
   ".softcap", ".alibi"; the length in characters, or -1 when it does not
   fit size or a field is out of range), and the
   kv-length bucket a length falls in: the smallest power of two >= len, 1 for
   len < 1, and INT64_MAX for len above 2^62 (never below len). */
int fd_tuned_table_header(char *buf, size_t size);
int fd_shape_signature(const fd_shape *shape, char *buf, size_t size);
int64_t fd_length_bucket(int64_t len);
/* The C source of a key's kernel (malloc'd, free() it), or NULL with the message in fd_errmsg(ctx). */
char *fd_kernel_source(fd_ctx *ctx, const char *key);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif
#ifdef __cplusplus
}
#endif
#endif
