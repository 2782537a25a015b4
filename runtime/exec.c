/* The executor: checks the arguments, picks the bucket from the actual
   lengths, lays out work items (b, kv head, split) balanced by length, runs
   them on the pool and merges split partials. The item and merge rules are
   templates/items.h.tpl's, which the exported header's fdt_run shares. The
   last worker to finish a (b, kv head) merges it (default); FD_MERGE=pass at
   plan time selects a second parallel pass instead (measured equal within
   noise, see README). It never plans or compiles. */
#include "internal.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Threads that reserve the item they run next (task); those past it take items one at a time. */
#define RESERVE_MAX 64

typedef struct run_state {
  const fd_plan *p;
  const fd_args *a;
  const fd_bucket *b;
  int n_items;
  atomic_int next;
  atomic_int bad;                  /* check_inputs: the lowest item holding a refused value */
  int threads;                     /* the main pass's threads */
  atomic_int reserved[RESERVE_MAX];  /* thread t's next item, or -1 (task) */
} run_state;

/* The paged layout's block table: every entry of a page holding a valid key
   of its row in 0..pool_pages - 1 (templates/items.h.tpl). */
static int check_block_table(const fd_plan *p, const fd_args *a) {
  const fd_shape *s = &p->shape;
  if (!a->block_table) return fd_fail(p->ctx, FD_EINVAL, "args.block_table is NULL but the shape's layout is FD_PAGED");
  int b;
  int64_t i;
  if (!fd_bad_page(a->block_table, s->batch, s->mask_mode == FD_CAUSAL, a->cur_pos, s->kv_len, p->new_kv ? p->q_len : 0,
                   p->q_len, s->window, s->sink_tokens, s->page_size, s->pool_pages, &b, &i))
    return FD_OK;
  return fd_fail(p->ctx, FD_EINVAL, "args.block_table[b=%d, page=%lld] is %d, outside 0..%lld (shape.pool_pages - 1)", b,
                 (long long)i, (int)a->block_table[b * fd_table_pages(s->kv_len, s->page_size) + i],
                 (long long)s->pool_pages - 1);
}

/* FD_BEAMS: beam_src (and, paged, the block-table entries it leads to) for
   every cached key a row visits (templates/items.h.tpl, fd_bad_beam: its
   window's ranges; FD_NEW_KV's new keys are the row's own). */
static int check_beams(const fd_plan *p, const fd_args *a) {
  const fd_shape *sh = &p->shape;
  if (!a->beam_src) return fd_fail(p->ctx, FD_EINVAL, "args.beam_src is NULL but the shape's features set FD_BEAMS");
  int paged = sh->layout == FD_PAGED, b;
  if (paged && !a->block_table)
    return fd_fail(p->ctx, FD_EINVAL, "args.block_table is NULL but the shape's layout is FD_PAGED");
  int64_t s;
  int bad = fd_bad_beam(a->beam_src, paged ? a->block_table : NULL, sh->batch, sh->mask_mode == FD_CAUSAL, a->cur_pos,
                        sh->kv_len, p->new_kv ? p->q_len : 0, p->q_len, sh->window, sh->sink_tokens, sh->page_size,
                        sh->pool_pages, &b, &s);
  if (!bad) return FD_OK;
  int32_t r = a->beam_src[(size_t)b * sh->kv_len + s];
  if (bad == 1)
    return fd_fail(p->ctx, FD_EINVAL, "args.beam_src[b=%d, key=%lld] is %d, outside 0..%d (shape.batch - 1)", b,
                   (long long)s, (int)r, sh->batch - 1);
  int64_t page = s / sh->page_size;
  return fd_fail(p->ctx, FD_EINVAL, "args.block_table[b=%d, page=%lld] is %d, outside 0..%lld (shape.pool_pages - 1); "
                 "key %lld of row %d reads it through args.beam_src", (int)r, (long long)page,
                 (int)a->block_table[r * fd_table_pages(sh->kv_len, sh->page_size) + page],
                 (long long)sh->pool_pages - 1, (long long)s, b);
}

/* Check the arguments before anything is written; FD_OK or an error naming the field. */
static int check_args(const fd_plan *p, const fd_args *a) {
  const fd_ctx *ctx = p->ctx;
  const fd_shape *s = &p->shape;
  if (!a) return fd_fail(ctx, FD_EINVAL, "args is NULL");
  if (!a->q) return fd_fail(ctx, FD_EINVAL, "args.q is NULL");
  if (!a->k) return fd_fail(ctx, FD_EINVAL, "args.k is NULL");
  if (!a->v) return fd_fail(ctx, FD_EINVAL, "args.v is NULL");
  if (!a->out) return fd_fail(ctx, FD_EINVAL, "args.out is NULL");
  if (s->mask_mode == FD_MASK && !a->mask) return fd_fail(ctx, FD_EINVAL, "args.mask is NULL but the shape's mask_mode is FD_MASK");
  if (p->k_per_channel && !a->k_scale)
    return fd_fail(ctx, FD_EINVAL, "args.k_scale is NULL but the shape's features set FD_K_PER_CHANNEL (k_scale "
                   "[B, Hkv, D], one float per channel)");
  if (fd_dtype_quant[s->kv_dtype] && (!a->k_scale || !a->v_scale))
    return fd_fail(ctx, FD_EINVAL, "args.%s is NULL but kv_dtype %s needs per-row scales",
                   a->k_scale ? "v_scale" : "k_scale", fd_dtype_texts[s->kv_dtype]);
  if (fd_dtype_block[s->kv_dtype] > 1 && (a->k_scale || a->v_scale))
    return fd_fail(ctx, FD_EINVAL, "args.%s is set but kv_dtype %s keeps its scales in its blocks; pass NULL",
                   a->k_scale ? "k_scale" : "v_scale", fd_dtype_texts[s->kv_dtype]);
  if (!isfinite(a->scale)) return fd_fail(ctx, FD_EINVAL, "args.scale is not finite");
  if (s->mask_mode == FD_CAUSAL) {
    if (!a->cur_pos) return fd_fail(ctx, FD_EINVAL, "args.cur_pos is NULL but the shape's mask_mode is FD_CAUSAL");
    int64_t last = s->kv_len - 1 + (p->new_kv ? p->q_len : 0);   /* FD_NEW_KV: the cache may be full */
    for (int b = 0; b < s->batch; b++)
      if (a->cur_pos[b] < p->q_len - 1 || a->cur_pos[b] > last)
        return fd_fail(ctx, FD_EINVAL, "args.cur_pos[%d] is %d, outside %d..%lld (q_len - 1 .. kv_len - 1%s)", b,
                       (int)a->cur_pos[b], p->q_len - 1, (long long)last, p->new_kv ? " + q_len" : "");
  }
  if (p->alibi && !a->alibi_slopes)
    return fd_fail(ctx, FD_EINVAL, "args.alibi_slopes is NULL but the shape's features set FD_ALIBI");
  for (int h = 0; p->alibi && h < s->n_q_heads; h++)
    if (!isfinite(a->alibi_slopes[h]))
      return fd_fail(ctx, FD_EINVAL, "args.alibi_slopes[%d] is %g; ALiBi slopes must be finite", h,
                     (double)a->alibi_slopes[h]);
  if (p->sink_logits && !a->sink_logits)
    return fd_fail(ctx, FD_EINVAL, "args.sink_logits is NULL but the shape's features set FD_SINK_LOGITS");
  if (p->new_kv && (!a->k_new || !a->v_new))
    return fd_fail(ctx, FD_EINVAL, "args.%s is NULL but the shape's features set FD_NEW_KV", a->k_new ? "v_new" : "k_new");
  if (p->beams) return check_beams(p, a);
  return s->layout == FD_PAGED ? check_block_table(p, a) : FD_OK;
}

/* The window ranges of row b's cached keys: its tokens sit after them, and
   with FD_NEW_KV after the q_len new keys too (templates/items.h.tpl). */
static fd_window row_window(const fd_plan *p, int b) {
  return fd_window_of(p->row_len[b] + (p->new_kv ? p->q_len : 0), p->q_len, p->shape.window, p->shape.sink_tokens);
}

/* Row lengths, the keys each row visits (its window's), rows by descending
   keys and the bucket of the longest (the rules of templates/items.h.tpl,
   shared with the exported header). */
static const fd_bucket *measure_rows(fd_plan *p, const fd_args *a) {
  const fd_shape *s = &p->shape;
  for (int b = 0; b < s->batch; b++) {  /* FD_NEW_KV: the cached keys, before the q_len new ones */
    p->row_len[b] = fd_valid_len(s->mask_mode == FD_CAUSAL, a->cur_pos, b, s->kv_len) - (p->new_kv ? p->q_len : 0);
    fd_window wd = row_window(p, b);
    p->row_first[b] = wd.first;
    p->row_sink[b] = wd.sink;
    p->row_keys[b] = p->row_len[b] - wd.first;
  }
  int64_t longest = fd_order_rows(s->batch, p->row_keys, p->row_order);
  const fd_bucket *bk = &p->buckets[0];
  while (bk->max_len < longest) bk++;
  return bk;
}

/* Lay out the work items (templates/items.h.tpl: longest rows first, splits
   in proportion to length, or at fixed key counts in deterministic mode)
   and count each (b, kv head)'s splits to merge. */
static int layout_items(fd_plan *p, const fd_bucket *bk) {
  const fd_shape *s = &p->shape;
  int n = fd_layout_items(s->batch, s->n_kv_heads, p->row_keys, p->row_first, s->window ? p->row_sink : NULL,
                          p->row_order, bk->splits, p->forced_splits, p->split_keys, bk->threads,
                          p->new_kv ? p->q_len : 0, p->row_splits, p->items);
  for (int b = 0; b < s->batch; b++)
    for (int j = 0; j < s->n_kv_heads; j++)
      atomic_store_explicit(&p->remaining[(size_t)b * s->n_kv_heads + j], p->row_splits[b], memory_order_relaxed);
  return n;
}

/* The K/V geometry of shape s: rows in the dtype's stride units (block dtypes: bytes). */
static fd_kv_geometry kv_geometry(const fd_shape *s) {
  size_t unit = fd_kv_unit(s->kv_dtype);
  fd_kv_geometry g = { s->layout, s->n_kv_heads, (int)(fd_kv_bytes(s->kv_dtype, (size_t)s->head_dim) / unit),
                       s->page_size, s->kv_len, unit };
  return g;
}

/* Fill the parts of a kernel call that depend only on (b, j). */
static void fill_work(const fd_plan *p, const fd_args *a, int b, int j, fd_work *w) {
  const fd_shape *s = &p->shape;
  size_t D = (size_t)s->head_dim;
  size_t h0 = fd_token_rows(s->n_q_heads, p->G, p->q_len, s->head_dim, s->kv_len, b, j, p->row_len[b], w);
  w->q = (const char *)a->q + h0 * D * fd_dtype_size(s->q_dtype);
  fd_kv_geometry g = kv_geometry(s);
  if (p->beams) fd_beam_rows(&g, a->k, a->v, a->k_scale, a->v_scale, a->block_table, a->beam_src, p->k_per_channel, b, j, w);
  else fd_kv_rows(&g, a->k, a->v, a->k_scale, a->v_scale, a->block_table, b, j, w);
  if (p->k_per_channel && !p->beams) w->k_scale = a->k_scale + ((size_t)b * s->n_kv_heads + j) * D;   /* [B, Hkv, D] */
  w->mask = a->mask ? a->mask + h0 * (size_t)s->kv_len : NULL;
  w->mask_stride = s->kv_len;
  w->scale = a->scale != 0 ? a->scale : (float)(1.0 / sqrt((double)s->head_dim));
  w->out = (char *)a->out + h0 * D * fd_dtype_size(s->out_dtype);
  w->lse = a->lse ? a->lse + h0 : NULL;
  /* FD_NEW_KV: every token sees every cached key; token t sits at row_len + t (ALiBi's position) */
  if (p->new_kv) w->tok_end0 = p->row_len[b] + 1;
  if (p->alibi) w->alibi = a->alibi_slopes + (size_t)j * p->G;
  w->softcap = s->softcap;
  if (s->window) {                               /* the keys below a later token's window start */
    fd_window wd = row_window(p, b);
    w->win_lo = wd.cut_lo;
    w->win_hi0 = wd.cut_hi0;
  }
}

/* Point w at the new keys of (b, j) (FD_NEW_KV: k_new/v_new [B, q_len, Hkv, D],
   keys [0, q_len) of their own split): token t sees new keys 0..t; with a
   window (new key k sits at position row_len + k, token t at row_len + t)
   not the keys [0, t + 1 - window) below its start, unless they are sinks. */
static void new_rows(const fd_plan *p, const fd_args *a, int b, int j, fd_work *w) {
  const fd_shape *s = &p->shape;
  size_t row0 = ((size_t)b * p->q_len * s->n_kv_heads + j) * s->head_dim * fd_dtype_size(s->kv_dtype);
  w->k = (const char *)a->k_new + row0;
  w->v = (const char *)a->v_new + row0;
  w->kv_stride = (int64_t)s->n_kv_heads * s->head_dim;
  w->k_scale = w->v_scale = NULL;
  w->pages = NULL;
  w->beam_src = NULL;
  w->tok_end0 = 1;
  if (s->window) {
    w->win_lo = s->sink_tokens > p->row_len[b] ? s->sink_tokens - p->row_len[b] : 0;
    w->win_hi0 = 1 - s->window;
  }
}

/* Merge the partials of (b, j) into out and lse (with the heads' learned sink logits). */
static void merge_row(const fd_plan *p, const fd_args *a, const fd_bucket *bk, int b, int j, const fd_work *w) {
  size_t row = (size_t)b * p->shape.n_kv_heads + j;
  const float *sink = p->sink_logits ? a->sink_logits + (size_t)j * p->G : NULL;
  fd_merge_partials(bk->split, fd_partial(p->partials, row, p->max_splits, 0, p->heads, p->rec), p->row_splits[b],
                    p->rec, w, sink);
}

/* Point w's next_k and next_v at the first K and V rows (key begin) of item
   nx, the one this thread runs next, so that the kernel's last chunk
   prefetches them instead of the rows past its end (another item's). Dense
   layouts only: paged and beam rows, FD_NEW_KV's own split and no next item
   (nx NULL) keep them 0 (fd_kv_rows). */
void fd_exec_next_rows(const fd_plan *p, const fd_args *a, const fd_item *nx, fd_work *w) {
  const fd_shape *s = &p->shape;
  if (!nx || s->layout == FD_PAGED || p->beams || (p->new_kv && nx->s == p->row_splits[nx->b] - 1)) return;
  fd_kv_geometry g = kv_geometry(s);
  fd_work n;
  fd_kv_rows(&g, a->k, a->v, NULL, NULL, NULL, nx->b, nx->j, &n);
  size_t off = (size_t)nx->begin * (size_t)n.kv_stride * g.elem_bytes;
  w->next_k = (const char *)n.k + off;
  w->next_v = (const char *)n.v + off;
}

/* Run one work item on thread tid; nx: the item the thread runs next, or NULL. */
static void run_item(run_state *rs, const fd_item *it, const fd_item *nx, int tid) {
  fd_plan *p = (fd_plan *)rs->p;
  const fd_bucket *bk = rs->b;
  fd_work w;
  fill_work(p, rs->a, it->b, it->j, &w);
  fd_exec_next_rows(p, rs->a, nx, &w);
  w.begin = it->begin; w.end = it->end;
  float *scratch = p->thread_scratch + (size_t)tid * p->thread_scratch_floats;
  w.qbuf = scratch;
  size_t row = (size_t)it->b * p->shape.n_kv_heads + it->j;
  int S = p->row_splits[it->b], merged = fd_row_merged(S, p->sink_logits);
  w.state = !merged ? scratch + p->qbuf_floats
                    : fd_partial(p->partials, row, p->max_splits, it->s, p->heads, p->rec);
  const fd_kernel_desc *k = fd_item_kernel(bk->plain, bk->with_lse, bk->split, merged, rs->a->lse != NULL);
  if (p->new_kv && it->s == S - 1) {          /* the new tokens' keys: their own split, bshd strides */
    new_rows(p, rs->a, it->b, it->j, &w);
    k = bk->new_kv;
  }
  k->run(&w);
  if (merged && !p->merge_in_pass && atomic_fetch_sub_explicit(&p->remaining[row], 1, memory_order_acq_rel) == 1)
    merge_row(p, rs->a, bk, it->b, it->j, &w);
}

/* Merge the split row (b, j) numbered i, if it was split. */
static void merge_item(run_state *rs, int i, int tid) {
  (void)tid;
  int b = i / rs->p->shape.n_kv_heads, j = i % rs->p->shape.n_kv_heads;
  if (!fd_row_merged(rs->p->row_splits[b], rs->p->sink_logits)) return;
  fd_work w;
  fill_work(rs->p, rs->a, b, j, &w);
  merge_row(rs->p, rs->a, rs->b, b, j, &w);
}

/* Take indices from the shared counter until none are left, applying one to each. */
static void drain(run_state *rs, int tid, void (*one)(run_state *rs, int i, int tid)) {
  for (;;) {
    int i = atomic_fetch_add_explicit(&rs->next, 1, memory_order_relaxed);
    if (i >= rs->n_items) return;
    one(rs, i, tid);
  }
}

/* Second-pass pool task (FD_MERGE=pass): merge the split rows. */
static void merge_task(void *arg, int tid) { drain(arg, tid, merge_item); }

/* Keys of item i. */
static int64_t item_keys(const run_state *rs, int i) { return rs->p->items[i].end - rs->p->items[i].begin; }

/* Take another thread's reserved item longer than `than` keys (than < 0:
   any), the longest; -1 when there is none. A reservation leaves its slot
   once (compare-exchange), so no item runs twice. */
static int steal_item(run_state *rs, int tid, int64_t than) {
  for (;;) {
    int best = -1, slot = -1;
    for (int t = 0; t < rs->threads && t < RESERVE_MAX; t++) {
      int r = atomic_load_explicit(&rs->reserved[t], memory_order_acquire);
      if (t != tid && r >= 0 && item_keys(rs, r) > than && (best < 0 || item_keys(rs, r) > item_keys(rs, best))) {
        best = r;
        slot = t;
      }
    }
    if (best < 0) return -1;
    if (atomic_compare_exchange_strong(&rs->reserved[slot], &best, -1)) return best;
  }
}

/* The next item of thread tid: the one it reserved; else another thread's
   reserved item longer than the counter's next (items come longest first,
   so its owner would start it only after its current item while this thread
   ran shorter ones); else one from the counter; else, the counter spent,
   any reserved item; -1 when none is left. */
static int take_item(run_state *rs, int tid) {
  if (tid < RESERVE_MAX) {
    int r = atomic_exchange_explicit(&rs->reserved[tid], -1, memory_order_acq_rel);
    if (r >= 0) return r;
  }
  int c = atomic_load_explicit(&rs->next, memory_order_relaxed);
  int s = c < rs->n_items ? steal_item(rs, tid, item_keys(rs, c)) : -1;
  if (s >= 0) return s;
  int i = atomic_fetch_add_explicit(&rs->next, 1, memory_order_relaxed);
  if (i < rs->n_items) return i;
  return steal_item(rs, tid, -1);
}

/* Reserve thread tid's next item from the counter (its first rows are the
   prefetch target of the current item's last chunk: fd_exec_next_rows); NULL
   when the counter is spent or tid has no slot. */
static const fd_item *reserve_next(run_state *rs, int tid) {
  if (tid >= RESERVE_MAX) return NULL;
  int i = atomic_fetch_add_explicit(&rs->next, 1, memory_order_relaxed);
  if (i >= rs->n_items) return NULL;
  atomic_store_explicit(&rs->reserved[tid], i, memory_order_release);
  return &rs->p->items[i];
}

/* Pool task: run work items until none are left, each with the item its
   thread reserved to run next (which an idle thread may still take). */
static void task(void *arg, int tid) {
  run_state *rs = arg;
  for (int i; (i = take_item(rs, tid)) >= 0;) {
    const fd_item *nx = reserve_next(rs, tid);
    run_item(rs, &rs->p->items[i], nx, tid);
  }
}

/* ---- fd_config.check_inputs: NaN and infinities refused before anything is written ---- */

/* Inputs are checked by their dtype's NaN and infinity bits (fd_dtype_nonfinite,
   gen/facts.lua); a mask element is one more kind: f32 where -Inf is allowed (it masks a key). */
#define MASK_DTYPE FD_DTYPE_COUNT
/* The K/V of a block dtype kv (q8_0, q4_0) are checked by their blocks' f16
   scales (the codes are integers): kind BLOCK_KIND + kv, one element per block,
   counted in bytes (the rows' stride unit). */
#define BLOCK_KIND (FD_DTYPE_COUNT + 1)

/* Index of the first of n blocks of kind at p whose f16 scale is NaN or infinite, or -1. */
static int64_t first_bad_block(int kind, const void *p, int64_t n) {
  size_t bb = fd_dtype_block_bytes[kind - BLOCK_KIND];
  const uint8_t *b = p;
  for (int64_t i = 0; i < n; i++)
    if ((b[(size_t)i * bb + 1] & 0x7c) == 0x7c) return i;
  return -1;
}

/* first_bad_uN(p, n, e): index of the first of n elements whose bits hold all
   of e (a NaN or an infinity), or -1. Blocks of 64 elements take a min
   reduction of (bits & e) ^ e, which compilers vectorize at -O2 (a constant
   trip count); the element by element search starts at the block of a hit. */
#define FIRST_BAD(name, T)                                                        \
  static int64_t name(const T *p, int64_t n, T e) {                               \
    int64_t i = 0;                                                                \
    for (; i + 64 <= n; i += 64) {                                                \
      T m = (T)~(T)0;                                                             \
      for (int k = 0; k < 64; k++) {                                              \
        T v = (T)((p[i + k] & e) ^ e);                                            \
        m = v < m ? v : m;                                                        \
      }                                                                           \
      if (!m) break;                                                              \
    }                                                                             \
    for (; i < n; i++) if ((p[i] & e) == e) return i;                             \
    return -1;                                                                    \
  }
FIRST_BAD(first_bad_u32, uint32_t)
FIRST_BAD(first_bad_u16, uint16_t)
FIRST_BAD(first_bad_u8, uint8_t)

/* Bytes per element of a checked input's dtype. */
static size_t in_size(int dtype) { return dtype >= BLOCK_KIND ? 1 : dtype == MASK_DTYPE ? 4 : fd_dtype_size(dtype); }

/* Bits of element i of dtype at p. */
static uint32_t elem_bits(int dtype, const void *p, int64_t i) {
  size_t size = in_size(dtype);
  if (dtype >= BLOCK_KIND) {                     /* block i's f16 scale, little-endian */
    const uint8_t *b = (const uint8_t *)p + (size_t)i * fd_dtype_block_bytes[dtype - BLOCK_KIND];
    return (uint32_t)b[0] | (uint32_t)b[1] << 8;
  }
  if (size == 4) return ((const uint32_t *)p)[i];
  if (size == 2) return ((const uint16_t *)p)[i];
  return ((const uint8_t *)p)[i];
}

/* Index of the first refused element among the n of dtype at p, or -1. */
static int64_t first_bad(int dtype, const void *p, int64_t n) {
  if (dtype == MASK_DTYPE) {                     /* NaN or +Inf; -Inf masks the key */
    for (int64_t from = 0;;) {
      int64_t i = first_bad_u32((const uint32_t *)p + from, n - from, 0x7f800000u);
      if (i < 0) return -1;
      if (((const uint32_t *)p)[from + i] != 0xff800000u) return from + i;
      from += i + 1;
    }
  }
  if (dtype >= BLOCK_KIND) return first_bad_block(dtype, p, n);
  uint32_t e = fd_dtype_nonfinite[dtype].nonfinite;
  if (!e) return -1;
  if (in_size(dtype) == 4) return first_bad_u32(p, n, e);
  if (in_size(dtype) == 2) return first_bad_u16(p, n, (uint16_t)e);
  return first_bad_u8(p, n, (uint8_t)e);
}

/* "NaN", "+Inf" or "-Inf": what refused element i of dtype at p is. */
static const char *bad_name(int dtype, const void *p, int64_t i) {
  int t = dtype == MASK_DTYPE ? FD_F32 : dtype >= BLOCK_KIND ? FD_F16 : dtype;
  uint32_t u = elem_bits(dtype, p, i);
  if (u & fd_dtype_nonfinite[t].nan) return "NaN";
  return u & fd_dtype_nonfinite[t].sign ? "-Inf" : "+Inf";
}

/* rows x len elements of one input for one (b, kv head), rows stride elements
   apart, in blocks of page_rows rows (0: one block) page_stride elements
   apart: row i is row i % page_rows of block pages[i / page_rows] (paged
   K/V), or of block i / page_rows (pages NULL: q and mask rows in tokens).
   Rows [sink, lo) are not read (a window's keys past the sinks, before its
   start; lo = sink = 0: every row). src (FD_BEAMS; NULL: none): row i lies
   in batch row src[i]'s rows, src_stride elements (paged: block-table
   entries) after batch row 0's, which base and pages give. */
typedef struct in_rows {
  const void *base; int dtype; int64_t rows, len, stride;
  const int32_t *pages; int64_t page_rows, page_stride;
  int64_t lo, sink;
  const int *src; int64_t src_stride;
} in_rows;

/* The address of row i of r. */
static const char *row_at(const in_rows *r, int64_t i) {
  int64_t from = r->src ? r->src[i] * r->src_stride : 0;   /* beams: the source row's rows */
  const int32_t *pages = r->pages ? r->pages + from : NULL;
  int64_t e = i * r->stride + (pages ? 0 : from);
  if (r->page_rows)
    e = (pages ? pages[i / r->page_rows] : i / r->page_rows) * r->page_stride + i % r->page_rows * r->stride;
  return (const char *)r->base + (size_t)e * in_size(r->dtype);
}

/* How many rows from row i on lie contiguously (one scan): to the end of the
   page or of the rows, and (beams) of the run of one source row. */
static int64_t contiguous_rows(const in_rows *r, int64_t i) {
  if (r->stride != r->len) return 1;
  int64_t left = r->rows - i, in_page = r->page_rows ? r->page_rows - i % r->page_rows : left, n = 1;
  if (in_page < left) left = in_page;
  if (!r->src) return left;
  while (n < left && r->src[i + n] == r->src[i]) n++;
  return n;
}

/* The inputs in the order they are checked and reported, and how their elements are named. */
enum { IN_Q, IN_K, IN_KSCALE, IN_V, IN_VSCALE, IN_MASK, IN_KNEW, IN_VNEW, IN_COUNT };
static const char *const IN_NAME[] = { "q", "k", "k_scale", "v", "v_scale", "mask", "k_new", "v_new" };

/* Input t of (b, kv head) w with n keys read; 0 when the run reads none of it. */
static int input_rows(const fd_plan *p, const fd_work *w, int t, int64_t n, in_rows *r) {
  const fd_shape *s = &p->shape;
  int64_t D = s->head_dim;
  int quant = fd_dtype_quant[s->kv_dtype];
  int64_t ps = s->layout == FD_PAGED ? s->page_size : 0;
  int bn = fd_dtype_block[s->kv_dtype];
  if (bn > 1 && (t == IN_K || t == IN_V)) {     /* a block dtype's scales, one per block */
    *r = (in_rows){ t == IN_K ? w->k : w->v, BLOCK_KIND + s->kv_dtype, n, D / bn, w->kv_stride, w->pages, ps,
                    w->page_stride };
    return 1;
  }
  switch (t) {
  case IN_Q: *r = (in_rows){ w->q, s->q_dtype, p->heads, D, D, NULL, p->G, w->tok_stride }; return 1;
  case IN_K: *r = (in_rows){ w->k, s->kv_dtype, n, D, w->kv_stride, w->pages, ps, w->page_stride }; return 1;
  case IN_V: *r = (in_rows){ w->v, s->kv_dtype, n, D, w->kv_stride, w->pages, ps, w->page_stride }; return 1;
  case IN_KSCALE:
    if (p->k_per_channel) { *r = (in_rows){ w->k_scale, FD_F32, 1, D, D, NULL, 0, 0 }; return 1; }   /* [D] */
    *r = (in_rows){ w->k_scale, FD_F32, n, 1, w->scale_stride, w->pages, ps, w->scale_page_stride }; return quant;
  case IN_VSCALE: *r = (in_rows){ w->v_scale, FD_F32, n, 1, w->scale_stride, w->pages, ps, w->scale_page_stride }; return quant;
  default: *r = (in_rows){ w->mask, MASK_DTYPE, p->heads, n, w->mask_stride, NULL, p->G, w->mask_tok_stride };
    return s->mask_mode == FD_MASK;
  }
}

/* The first refused element of r in its rows [0, sink) and [lo, rows): its row and column; 0 when there is none. */
static int scan_rows(const in_rows *r, int64_t *row, int64_t *col) {
  for (int part = 0; part < 2; part++) {
    int64_t to = part ? r->rows : r->sink;
    for (int64_t i = part ? r->lo : 0, whole; i < to; i += whole) {
      whole = contiguous_rows(r, i);
      if (whole > to - i) whole = to - i;
      int64_t k = first_bad(r->dtype, row_at(r, i), whole * r->len);
      if (k >= 0) { *row = i + k / r->len; *col = k % r->len; return 1; }
    }
  }
  return 0;
}

/* Refuse the element (row, col) of input t of (b, j), naming it: with
   beams, in the cache row its key is read from, and the row reading it. */
static int refuse(const fd_plan *p, const in_rows *r, int t, int b, int j, int64_t row, int64_t col) {
  const char *what = bad_name(r->dtype, row_at(r, row), col);
  char via[96] = "";
  if (r->src) {
    snprintf(via, sizeof via, "%s (row %d reads it through args.beam_src)", what, b);
    what = via;
    b = r->src[row];
  }
  long long h = (long long)j * p->G + row % p->G;
  char tok[32] = "";
  if (p->q_len > 1) snprintf(tok, sizeof tok, "token=%lld, ", (long long)(row / p->G));
  if (t == IN_Q) return fd_fail(p->ctx, FD_EINVAL, "args.q[b=%d, %shead=%lld, d=%lld] is %s", b, tok, h, (long long)col, what);
  if (t == IN_MASK)
    return fd_fail(p->ctx, FD_EINVAL, "args.mask[b=%d, %shead=%lld, key=%lld] is %s", b, tok, h, (long long)col, what);
  if (t == IN_KSCALE && p->k_per_channel)
    return fd_fail(p->ctx, FD_EINVAL, "args.k_scale[b=%d, kv_head=%d, d=%lld] is %s", b, j, (long long)col, what);
  if (t == IN_KNEW || t == IN_VNEW)
    return fd_fail(p->ctx, FD_EINVAL, "args.%s[b=%d, token=%lld, kv_head=%d, d=%lld] is %s", IN_NAME[t], b,
                   (long long)row, j, (long long)col, what);
  if (t == IN_KSCALE || t == IN_VSCALE)
    return fd_fail(p->ctx, FD_EINVAL, "args.%s[b=%d, kv_head=%d, key=%lld] is %s", IN_NAME[t], b, j, (long long)row, what);
  if (r->dtype >= BLOCK_KIND) {
    long long bn = fd_dtype_block[r->dtype - BLOCK_KIND];
    return fd_fail(p->ctx, FD_EINVAL, "args.%s[b=%d, kv_head=%d, key=%lld, d=%lld..%lld]: the block's %s scale is %s",
                   IN_NAME[t], b, j, (long long)row, col * bn, col * bn + bn - 1, fd_dtype_texts[r->dtype - BLOCK_KIND],
                   what);
  }
  return fd_fail(p->ctx, FD_EINVAL, "args.%s[b=%d, kv_head=%d, key=%lld, d=%lld] is %s", IN_NAME[t], b, j,
                 (long long)row, (long long)col, what);
}

/* FD_BEAMS: K, V and their scales r of (b, kv head) w with n keys read
   through w's beam_src: each key's row in its source row (per-channel K
   scales: the source row's head_dim scales for every key). */
static void beam_input(const fd_plan *p, const fd_work *w, int t, int64_t n, in_rows *r) {
  int scales = t == IN_KSCALE || t == IN_VSCALE;
  r->src = w->beam_src;
  r->src_stride = r->pages ? w->beam_stride : scales ? w->beam_scale_stride : w->beam_stride;
  if (t == IN_KSCALE && p->k_per_channel) {
    *r = (in_rows){ w->k_scale, FD_F32, n, p->shape.head_dim, 0, NULL, 0, 0 };
    r->src = w->beam_src;
    r->src_stride = w->beam_kch_stride;
  }
}

/* Check item i, one input t of one (b, kv head j) in report order: its rows; 0 when the run reads none. */
static int item_rows(const run_state *rs, int i, in_rows *r, int *t, int *b, int *j) {
  const fd_shape *s = &rs->p->shape;
  fd_work w;
  *t = i / (s->batch * s->n_kv_heads);
  *b = i / s->n_kv_heads % s->batch;
  *j = i % s->n_kv_heads;
  fill_work(rs->p, rs->a, *b, *j, &w);
  if (*t == IN_KNEW || *t == IN_VNEW) {           /* FD_NEW_KV: the q_len new keys, every one read */
    if (!rs->p->new_kv) return 0;
    new_rows(rs->p, rs->a, *b, *j, &w);
    *r = (in_rows){ *t == IN_KNEW ? w.k : w.v, s->kv_dtype, rs->p->q_len, s->head_dim, w.kv_stride, NULL, 0, 0 };
    return 1;
  }
  int read = input_rows(rs->p, &w, *t, rs->p->row_len[*b], r);
  if (rs->p->beams && *t != IN_Q && *t != IN_MASK) beam_input(rs->p, &w, *t, rs->p->row_len[*b], r);
  int keyed = !(rs->p->k_per_channel && !rs->p->beams && *t == IN_KSCALE);   /* rows are keys */
  if (s->window && keyed && *t != IN_Q && *t != IN_MASK) {   /* K, V and scales: the window's ranges only */
    r->lo = rs->p->row_first[*b];
    r->sink = rs->p->row_sink[*b];
  }
  return read;
}

/* Scan check item i; a refused value lowers rs->bad to i unless a lower item holds one. */
static void check_item(run_state *rs, int i, int tid) {
  (void)tid;
  in_rows r;
  int t, b, j, cur = atomic_load_explicit(&rs->bad, memory_order_relaxed);
  int64_t row, col;
  if (i > cur || !item_rows(rs, i, &r, &t, &b, &j) || !scan_rows(&r, &row, &col)) return;
  while (i < cur && !atomic_compare_exchange_weak(&rs->bad, &cur, i)) {}
}

/* Pool task of check_inputs: scan items until none are left. */
static void check_task(void *arg, int tid) { drain(arg, tid, check_item); }

/* fd_config.check_inputs: every value the run reads (q; K, V, their scales and
   the mask for the keys of rs->p->row_len, with a window those of its
   ranges: the sinks and the main range; FD_NEW_KV's k_new and v_new),
   scanned on the pool, one item per input and (b, kv head); FD_EINVAL naming
   the first NaN or infinity in the order q, k, k_scale, v, v_scale, mask,
   k_new, v_new, each in index order (-Inf allowed in the mask). The caller's thread writes the message. */
static int check_inputs(run_state *rs) {
  const fd_shape *s = &rs->p->shape;
  int n = IN_COUNT * s->batch * s->n_kv_heads, threads = rs->b->threads < n ? rs->b->threads : n;
  rs->n_items = n;
  atomic_store(&rs->next, 0);
  atomic_store(&rs->bad, n);
  fd_pool_run(rs->p->ctx->pool, threads, check_task, rs);
  atomic_store(&rs->next, 0);
  int i = atomic_load(&rs->bad), t, b, j;
  in_rows r;
  int64_t row, col;
  if (i == n || !item_rows(rs, i, &r, &t, &b, &j) || !scan_rows(&r, &row, &col)) return FD_OK;
  return refuse(rs->p, &r, t, b, j, row, col);
}

/* Internal (tests, internal.h): the work items fd_run would run for a on cp,
   laid out in the plan's scratch without running them; their count, or the
   code fd_run returns for bad arguments. */
int fd_exec_items(const fd_plan *cp, const fd_args *a, const fd_item **items) {
  if (!cp) return fd_fail(NULL, FD_EINVAL, "plan is NULL");
  fd_plan *p = (fd_plan *)cp;
  int rc = check_args(p, a);
  if (rc) return rc;
  pthread_mutex_lock(&p->ctx->run_lock);
  int n = layout_items(p, measure_rows(p, a));
  pthread_mutex_unlock(&p->ctx->run_lock);
  *items = p->items;
  return n;
}

/* Run a plan; nothing is written to out or lse unless it returns FD_OK. */
int fd_run(const fd_plan *cp, const fd_args *a) {
  if (!cp) return fd_fail(NULL, FD_EINVAL, "plan is NULL");
  fd_plan *p = (fd_plan *)cp;      /* scratch is the plan's own; runs are serialized below */
  fd_ctx *ctx = p->ctx;
  int rc = check_args(p, a);
  if (rc) return rc;
  pthread_mutex_lock(&ctx->run_lock);
  if (atomic_load(&ctx->destroyed)) {
    pthread_mutex_unlock(&ctx->run_lock);
    return fd_fail(ctx, FD_EDESTROYED, "the plan's context was destroyed (fd_destroy); destroy the plan too");
  }
  run_state rs = { p, a, measure_rows(p, a), 0, 0, 0 };
  if (ctx->check_inputs && (rc = check_inputs(&rs)) != FD_OK) {
    pthread_mutex_unlock(&ctx->run_lock);
    return rc;
  }
  rs.n_items = layout_items(p, rs.b);
  int threads = rs.b->threads < rs.n_items ? rs.b->threads : rs.n_items;
  rs.threads = threads;
  for (int t = 0; t < RESERVE_MAX; t++) atomic_init(&rs.reserved[t], -1);
  fd_pool_run(ctx->pool, threads, task, &rs);
  if (p->merge_in_pass) {
    atomic_store(&rs.next, 0);
    rs.n_items = p->shape.batch * p->shape.n_kv_heads;
    fd_pool_run(ctx->pool, threads, merge_task, &rs);
  }
  pthread_mutex_unlock(&ctx->run_lock);
  fd_clear_error(ctx);
  return FD_OK;
}
