/* The executor: checks the arguments, picks the bucket from the actual
   lengths, lays out work items (b, kv head, split) balanced by length, runs
   them on the pool and merges split partials. The last worker to finish a
   (b, kv head) merges it (default); FD_MERGE=pass at plan time selects a
   second parallel pass instead (measured equal within noise, see README). It
   never plans or compiles. */
#include "internal.h"
#include <math.h>
#include <stdlib.h>

typedef struct run_state {
  const fd_plan *p;
  const fd_args *a;
  const fd_bucket *b;
  int n_items;
  atomic_int next;
} run_state;

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
  if (s->kv_dtype >= FD_I8 && (!a->k_scale || !a->v_scale))
    return fd_fail(ctx, FD_EINVAL, "args.%s is NULL but kv_dtype %s needs per-row scales",
                   a->k_scale ? "v_scale" : "k_scale", s->kv_dtype == FD_I8 ? "int8" : "fp8");
  if (!isfinite(a->scale)) return fd_fail(ctx, FD_EINVAL, "args.scale is not finite");
  if (s->mask_mode != FD_CAUSAL) return FD_OK;
  if (!a->cur_pos) return fd_fail(ctx, FD_EINVAL, "args.cur_pos is NULL but the shape's mask_mode is FD_CAUSAL");
  for (int b = 0; b < s->batch; b++)
    if (a->cur_pos[b] < 0 || a->cur_pos[b] >= s->kv_len)
      return fd_fail(ctx, FD_EINVAL, "args.cur_pos[%d] is %d, outside 0..%lld (kv_len - 1)", b, (int)a->cur_pos[b],
                     (long long)s->kv_len - 1);
  return FD_OK;
}

/* Row lengths, the bucket of the longest, and rows sorted by descending length. */
static const fd_bucket *measure_rows(fd_plan *p, const fd_args *a) {
  const fd_shape *s = &p->shape;
  int64_t longest = 0;
  for (int b = 0; b < s->batch; b++) {
    p->row_len[b] = s->mask_mode == FD_CAUSAL ? (int64_t)a->cur_pos[b] + 1 : s->kv_len;
    if (p->row_len[b] > longest) longest = p->row_len[b];
    p->row_order[b] = b;
  }
  if (s->mask_mode == FD_CAUSAL)   /* insertion sort: lengths are often already ordered */
    for (int i = 1; i < s->batch; i++)
      for (int j = i; j > 0 && p->row_len[p->row_order[j]] > p->row_len[p->row_order[j - 1]]; j--) {
        int t = p->row_order[j]; p->row_order[j] = p->row_order[j - 1]; p->row_order[j - 1] = t;
      }
  const fd_bucket *bk = &p->buckets[0];
  while (bk->max_len < longest) bk++;
  return bk;
}

/* Lay out the work items, longest rows first; each row gets splits in
   proportion to its length so items cost about the same. */
static int layout_items(fd_plan *p, const fd_bucket *bk) {
  const fd_shape *s = &p->shape;
  int64_t longest = p->row_len[p->row_order[0]];
  int n = 0;
  for (int r = 0; r < s->batch; r++) {
    int b = p->row_order[r];
    int64_t len = p->row_len[b];
    int S = p->forced_splits ? p->forced_splits : (int)((bk->splits * len + longest - 1) / longest);
    if (S < 1) S = 1;
    p->row_splits[b] = S;
    for (int j = 0; j < s->n_kv_heads; j++) {
      atomic_store_explicit(&p->remaining[(size_t)b * s->n_kv_heads + j], S, memory_order_relaxed);
      for (int sp = 0; sp < S; sp++) {
        fd_item *it = &p->items[n++];
        it->b = b; it->j = j; it->s = sp;
        it->begin = len * sp / S; it->end = len * (sp + 1) / S;
      }
    }
  }
  return n;
}

/* Fill the parts of a kernel call that depend only on (b, j). */
static void fill_work(const fd_plan *p, const fd_args *a, int b, int j, fd_work *w) {
  const fd_shape *s = &p->shape;
  size_t kvsz = fd_dtype_size(s->kv_dtype), D = (size_t)s->head_dim;
  size_t h0 = (size_t)b * s->n_q_heads + (size_t)j * p->G;
  int64_t row0 = s->layout == FD_BHSD ? ((int64_t)b * s->n_kv_heads + j) * s->kv_len
                                      : (int64_t)b * s->kv_len * s->n_kv_heads + j;
  w->q = (const char *)a->q + h0 * D * fd_dtype_size(s->q_dtype);
  w->k = (const char *)a->k + (size_t)row0 * D * kvsz;
  w->v = (const char *)a->v + (size_t)row0 * D * kvsz;
  w->kv_stride = s->layout == FD_BHSD ? (int64_t)D : (int64_t)s->n_kv_heads * (int64_t)D;
  w->scale_stride = s->layout == FD_BHSD ? 1 : s->n_kv_heads;
  w->k_scale = a->k_scale ? a->k_scale + row0 : NULL;
  w->v_scale = a->v_scale ? a->v_scale + row0 : NULL;
  w->mask = a->mask ? a->mask + h0 * (size_t)s->kv_len : NULL;
  w->mask_stride = s->kv_len;
  w->n_heads = p->G;
  w->scale = a->scale != 0 ? a->scale : (float)(1.0 / sqrt((double)s->head_dim));
  w->out = (char *)a->out + h0 * D * fd_dtype_size(s->out_dtype);
  w->lse = a->lse ? a->lse + h0 : NULL;
}

/* Merge the partials of (b, j) into out and lse. */
static void merge_row(const fd_plan *p, const fd_args *a, const fd_bucket *bk, int b, int j, const fd_work *w) {
  size_t row = (size_t)b * p->shape.n_kv_heads + j;
  fd_merge_args m;
  m.part = p->partials + row * p->max_splits * p->G * p->rec;
  m.split_stride = (fd_i64)p->G * p->rec;
  m.n_splits = p->row_splits[b];
  m.n_heads = p->G;
  m.out = w->out;
  m.lse = a->lse ? w->lse : NULL;
  bk->split->merge(&m);
}

/* Run one work item on thread tid. */
static void run_item(run_state *rs, const fd_item *it, int tid) {
  fd_plan *p = (fd_plan *)rs->p;
  const fd_bucket *bk = rs->b;
  fd_work w;
  fill_work(p, rs->a, it->b, it->j, &w);
  w.begin = it->begin; w.end = it->end;
  float *scratch = p->thread_scratch + (size_t)tid * p->thread_scratch_floats;
  w.qbuf = scratch;
  size_t row = (size_t)it->b * p->shape.n_kv_heads + it->j;
  if (p->row_splits[it->b] == 1) {
    w.state = scratch + ((size_t)p->G * p->shape.head_dim + 15) / 16 * 16;
    (rs->a->lse ? bk->with_lse : bk->plain)->run(&w);
    return;
  }
  w.state = p->partials + (row * p->max_splits + it->s) * p->G * p->rec;
  bk->split->run(&w);
  if (!p->merge_in_pass && atomic_fetch_sub_explicit(&p->remaining[row], 1, memory_order_acq_rel) == 1)
    merge_row(p, rs->a, bk, it->b, it->j, &w);
}

/* Merge the split row (b, j) numbered i, if it was split. */
static void merge_item(run_state *rs, int i, int tid) {
  (void)tid;
  int b = i / rs->p->shape.n_kv_heads, j = i % rs->p->shape.n_kv_heads;
  if (rs->p->row_splits[b] == 1) return;
  fd_work w;
  fill_work(rs->p, rs->a, b, j, &w);
  merge_row(rs->p, rs->a, rs->b, b, j, &w);
}

/* Run work item i. */
static void work_item(run_state *rs, int i, int tid) { run_item(rs, &rs->p->items[i], tid); }

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

/* Pool task: run work items until none are left. */
static void task(void *arg, int tid) { drain(arg, tid, work_item); }

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
  run_state rs = { p, a, measure_rows(p, a), 0, 0 };
  rs.n_items = layout_items(p, rs.b);
  int threads = rs.b->threads < rs.n_items ? rs.b->threads : rs.n_items;
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
