/* Library internals shared by the runtime's files (not installed). */
#ifndef FD_INTERNAL_H
#define FD_INTERNAL_H
#include "flashdecode.h"
#include "fd_abi.h"
#include "kcache.h"
#include "pool.h"
#include "table.h"
#include <pthread.h>
#include <stdatomic.h>

#define FD_MAX_BUCKETS 48
/* FD_MAX_CHUNK, FD_MAX_TILE, the enum names, dtype sizes, flag bits and ISA
   records come from gen/facts.lua through fd_keydefs.h (table.h includes it). */

/* A context lives while references to it remain: one for the caller's handle
   (dropped by fd_destroy), one per live plan and one per call in progress
   (fd_plan_create*, fd_kernel_source); the last one frees it. Every context
   not yet freed is in a global registry, so a call that races fd_destroy
   finds out under the registry's lock whether it may take a reference. */
struct fd_ctx {
  int threads, max_isa;
  int check_inputs;                /* fd_config.check_inputs: fd_run refuses NaN and infinities (exec.c) */
  int deterministic;               /* fd_config.deterministic: plans split rows at fixed key counts (plan.c) */
  int precision;                   /* fd_config.precision: FD_PRECISION_FAST lets kernels take bf16 weights or 2 MSD
                                      planes (plan.c fast_digits) */
  fd_backend backend;
  fd_pool *pool;                   /* NULL once destroyed */
  fd_kcache *kernels;              /* kept until the last reference: plans hold kernels in it */
  fd_table *table;                 /* NULL: none, or refused */
  pthread_mutex_t run_lock;        /* one fd_run at a time owns the pool */
  int refs;                        /* references (registry lock) */
  fd_ctx *next_live;               /* registry chain (registry lock) */
  atomic_int destroyed;            /* fd_destroy was called: new plans and runs are refused */
  char table_note[1024];           /* why a table was refused, and the cc backend's fallback warning ("" if none) */
};

/* The configuration of one kv-length bucket: lengths up to max_len. */
typedef struct fd_bucket {
  int64_t max_len;
  int chunk, tile, splits, threads, isa, forced_isa, from_table, tile_forced;
  int planes;                      /* the key's planes digit (MSD int8 scores), 0 = off */
  const fd_kernel_desc *plain, *with_lse, *split;
  const fd_kernel_desc *new_kv;    /* FD_NEW_KV: the split kernel over k_new/v_new rows (bshd strides), else NULL */
} fd_bucket;

/* fd_item and the work-item rules fd_run shares with the exported header's fdt_run. */
#include "../templates/items.h.tpl"

struct fd_plan {
  fd_ctx *ctx;
  fd_shape shape;
  int G, rec, n_buckets, forced_splits, max_splits, max_threads;
  int forced_planes;               /* opts.planes: nonzero keeps fast precision off the planes digit (plan.c fast_digits) */
  int q_len;                       /* query tokens per row (shape.q_len, at least 1) */
  int heads;                       /* query rows per kernel call: G x q_len */
  int new_kv;                      /* FD_NEW_KV: each (row, kv head) gets one more split, its new keys */
  int sink_logits;                 /* FD_SINK_LOGITS: every row goes through the merge, which adds them once */
  int alibi;                       /* FD_ALIBI: kernels add slope x (key - position) to the scores */
  int k_per_channel;               /* FD_K_PER_CHANNEL: k_scale [B, Hkv, D], folded into q by the kernels */
  int beams;                       /* FD_BEAMS: key s of row b from cache row beam_src[b * kv_len + s] */
  int fast;                        /* fast precision wanted (opts.precision, else config.precision): kernels that can
                                      serve it take key digit precision 1 (bf16 V) or FD_FAST_PLANES MSD planes
                                      (int8 K and V; plan.c fast_digits) */
  int64_t split_keys;              /* deterministic context: keys per split (items.h.tpl); 0: default mode */
  int merge_in_pass;               /* FD_MERGE=pass: merge in a second pass, not by the last worker */
  fd_bucket buckets[FD_MAX_BUCKETS];
  double compile_ms;
  int kernels_compiled;
  /* scratch, sized at plan time so fd_run never allocates */
  float *partials;                 /* [B*Hkv][max_splits][G][rec] */
  float *thread_scratch;           /* per thread: qbuf G*D, state G*rec */
  size_t thread_scratch_floats;
  size_t qbuf_floats;              /* a thread's query buffer, the start of its scratch (templates/abi.h.tpl) */
  atomic_int *remaining;           /* [B*Hkv] splits still running */
  int *row_splits;                 /* [B] */
  int *row_order;                  /* [B] rows by descending length */
  int64_t *row_len;                /* [B] keys below the last token's limit (causal: cur_pos + 1) */
  int64_t *row_keys, *row_first, *row_sink; /* [B] the main range's keys and first key, the sink split's keys */
  fd_item *items;                  /* [B*Hkv*max_splits] */
};

/* Record an error for ctx (and the calling thread) and return code. */
int fd_fail(const fd_ctx *ctx, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Clear the calling thread's error for ctx. */
void fd_clear_error(const fd_ctx *ctx);
/* Take a reference to ctx for a call in progress or a new plan: FD_OK, or
   FD_EDESTROYED (with the message) when ctx was destroyed or is unknown; the
   check and the reference are atomic with respect to fd_destroy. */
int fd_ctx_acquire(fd_ctx *ctx);
/* Drop a reference; the last one frees the context. */
void fd_ctx_release(fd_ctx *ctx);
/* Give back the kernel references of a plan's buckets (each slot once per get). */
void fd_ctx_put_kernels(fd_ctx *ctx, fd_bucket *b, int n_buckets);
/* Bytes per element of a dtype. */
size_t fd_dtype_size(int dtype);
size_t fd_kv_bytes(int dtype, size_t n);
size_t fd_kv_unit(int dtype);
/* Internal (tests): the work items fd_run would run for a on p, laid out in
   p's scratch without running them (*items valid until p's next run); their
   count, or an error code as fd_run's. Defined in exec.c. */
int fd_exec_items(const fd_plan *p, const fd_args *a, const fd_item **items);
/* Point w->next_k, next_v at item nx's first K and V rows (the prefetch
   target of the kernel's last chunk); unchanged (0) for paged and beam rows,
   FD_NEW_KV's own split and nx NULL (runtime/exec.c). */
void fd_exec_next_rows(const fd_plan *p, const fd_args *a, const fd_item *nx, fd_work *w);
/* Encode the key of a kernel; -1 with err on a field out of range. */
int fd_kernel_key(const fd_shape *s, int chunk, int tile, int isa, int flags, char *key, char *err, size_t errlen);
/* fd_kernel_key with the planes digit (MSD int8 scores) and the precision digit set. */
int fd_kernel_key_ext(const fd_shape *s, int chunk, int tile, int isa, int flags, int planes, int precision, char *key,
                      char *err, size_t errlen);
/* The heuristic isa of shape s in a context of best isa max (plan.c). */
int fd_heuristic_isa(const fd_shape *s, int max, int fast, int fma_bf16);
/* Fast precision's MSD plane count for int8 K and V: q and the softmax
   weights in 2 int8 planes instead of FD_H_PLANES (plan.c fast_digits;
   README "Fast precision" has the errors). */
enum { FD_FAST_PLANES = 2 };
/* Whether a kernel of shape s and isa can take fast precision's digit, bf16
   weights (gen/key.lua precision_misfit). */
int fd_precision_fits(const fd_shape *s, int isa);
/* fd_kernel_key with the planes digit (MSD int8 scores) set. */
int fd_kernel_key_planes(const fd_shape *s, int chunk, int tile, int isa, int flags, int planes, char *key, char *err,
                         size_t errlen);

#endif
