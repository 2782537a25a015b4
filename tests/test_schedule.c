/* The executor's work items on uneven batches (templates/items.h.tpl): a
   batch of 8 rows, one 64k row and seven 1k rows, and the mirror (seven 64k
   rows, one 1k), for a one-kv-head shape (the Llama-3.1-8B tp8 shard) and a
   GQA shape with 8 kv heads, with 1, 2 and 4 threads: every (row, kv head)'s
   keys are covered exactly once by its splits in order; no item holds more
   than the batch's keys per thread (or FD_MIN_ITEM_KEYS), so a long row among
   short ones is cut for balance; uniform batches keep the bucket's splits;
   and the output of the uneven batch matches the double reference. */
#include "compare.h"
#include "internal.h"
#include "tcheck.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define B 8
#define CAP 65536

/* The lengths of a pattern: 0 one long row + seven short, 1 the mirror, 2 uniform. */
static int64_t pattern_len(int pattern, int b) {
  if (pattern == 2) return CAP / 2;
  int long_row = pattern == 0 ? b == 0 : b != 7;
  return long_row ? CAP : 1024;
}

static const char *const PATTERN[] = { "one 64k + seven 1k", "seven 64k + one 1k", "uniform 32k" };

/* Check the items of one plan run: coverage, order and the item bound. */
static void check_items(const fd_item *items, int n, int Hkv, const int32_t *pos, int threads, const char *name) {
  int64_t total = 0, most = 0;
  for (int b = 0; b < B; b++) total += pos[b] + 1;
  int64_t bound = total * Hkv / threads;
  if (bound < FD_MIN_ITEM_KEYS) bound = FD_MIN_ITEM_KEYS;
  int ok = 1;
  for (int b = 0; b < B; b++)
    for (int j = 0; j < Hkv; j++) {
      int64_t next = 0;
      int s_next = 0;
      for (int k = 0; k < n; k++) {
        if (items[k].b != b || items[k].j != j) continue;
        ok &= items[k].s == s_next++ && items[k].begin == next && items[k].end >= items[k].begin;
        next = items[k].end;
        if (items[k].end - items[k].begin > most) most = items[k].end - items[k].begin;
      }
      ok &= next == pos[b] + 1;
    }
  t_check(ok, "%s: every (row, kv head)'s keys covered once by its splits in order", name);
  t_check(most <= bound + 1, "%s: the largest item has %lld keys, above the bound %lld", name, (long long)most,
          (long long)bound);
}

/* Run plan on random data of shape s (one long row, seven short) against the double reference. */
static void against_reference(fd_ctx *ctx, fd_plan *plan, const fd_shape *s, const char *name) {
  kproblem p;
  kp_init(&p, B, s->n_q_heads, s->n_kv_heads, s->head_dim, CAP, FD_F32, FD_BF16, FD_F32, FD_CAUSAL, FD_BHSD, 61);
  for (int b = 0; b < B; b++) p.cur_pos[b] = (int32_t)(pattern_len(0, b) - 1);
  size_t n = (size_t)B * s->n_q_heads * s->head_dim;
  float *out = malloc(n * 4), *lse = malloc(sizeof(float) * B * s->n_q_heads);
  fd_args a = { p.q, p.k, p.v, p.cur_pos, NULL, NULL, NULL, NULL, 0, out, lse };
  if (t_check(fd_run(plan, &a) == 0, "%s: run: %s", name, fd_errmsg(ctx))) {
    double *rout = malloc(n * sizeof(double)), *rlse = malloc(sizeof(double) * B * s->n_q_heads);
    ref_attention(&p.ref, rout, rlse);
    t_compare(&p, out, lse, rout, rlse, 1, name);
    free(rout); free(rlse);
  }
  free(out); free(lse);
  kp_free(&p);
}

/* One shape and pattern with a context of threads: the items (no data is
   read: the arrays are placeholders), then, for one long row among short
   ones with one kv head and 2 threads, the output against the reference. */
static void run_case(int Hq, int Hkv, int pattern, int threads) {
  char name[160];
  snprintf(name, sizeof name, "Hq %d Hkv %d, %s, %d threads", Hq, Hkv, PATTERN[pattern], threads);
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = threads });
  static float placeholder[64];
  int32_t pos[B];
  for (int b = 0; b < B; b++) pos[b] = (int32_t)(pattern_len(pattern, b) - 1);
  fd_shape s = { B, Hq, Hkv, 64, CAP, FD_F32, FD_BF16, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  fd_args a = { placeholder, placeholder, placeholder, pos, NULL, NULL, NULL, NULL, 0, placeholder, NULL };
  fd_plan *plan = NULL;
  const fd_item *items = NULL;
  int count = fd_plan_create(ctx, &s, &plan) ? -1 : fd_exec_items(plan, &a, &items);
  if (t_check(count > 0, "%s: items: %s", name, fd_errmsg(ctx))) {
    check_items(items, count, Hkv, pos, threads, name);
    if (pattern == 0 && Hkv == 1 && threads > 1) {
      int long_splits = 0;
      for (int k = 0; k < count; k++) long_splits += items[k].b == 0;
      t_check(long_splits >= threads, "%s: the 64k row is cut into %d items for %d threads", name, long_splits, threads);
    }
    if (pattern == 2) {
      fd_plan_info info;
      fd_plan_info_get(plan, CAP / 2, &info);
      t_check(count == B * Hkv * info.splits, "%s: a uniform batch keeps the bucket's %d splits (%d items)", name,
              info.splits, count);
    }
    if (pattern == 0 && Hkv == 1 && threads == 2) against_reference(ctx, plan, &s, name);
  }
  fd_plan_destroy(plan);
  fd_destroy(ctx);
}

/* fd_exec_next_rows (what a kernel's last chunk prefetches: the first K and
   V rows of its thread's next item): key begin of (b, j) in BHSD and BSHD,
   nothing (0) for paged rows and without a next item. */
static void check_next_rows(fd_layout layout) {
  enum { HKV = 8, D = 64, ELEM = 2 };                  /* bf16 K/V */
  static char k[16], v[16];                          /* base addresses only: nothing is read */
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2 });
  fd_shape s = { .batch = B, .n_q_heads = 32, .n_kv_heads = HKV, .head_dim = D, .kv_len = CAP, .q_dtype = FD_F32,
                 .kv_dtype = FD_BF16, .out_dtype = FD_F32, .mask_mode = FD_CAUSAL, .layout = layout, .page_size = 64,
                 .pool_pages = 4 };
  fd_args a = { NULL, k, v };
  fd_plan *plan = NULL;
  if (!t_check(fd_plan_create(ctx, &s, &plan) == 0, "next rows, layout %d: plan: %s", (int)layout, fd_errmsg(ctx))) {
    fd_destroy(ctx);
    return;
  }
  const fd_item nx = { 5, 3, 0, 1000, 2000 };
  fd_work w = { 0 };
  fd_exec_next_rows(plan, &a, &nx, &w);
  size_t row = layout == FD_BHSD ? ((size_t)5 * HKV + 3) * CAP + 1000 : ((size_t)5 * CAP + 1000) * HKV + 3;
  if (layout == FD_PAGED) {
    t_check(w.next_k == NULL && w.next_v == NULL, "paged rows: no next rows (the kernel prefetches as before)");
  } else {
    t_check(w.next_k == k + row * D * ELEM && w.next_v == v + row * D * ELEM,
            "layout %d: the next item's rows are key 1000 of (b 5, kv head 3): K +%td, V +%td, want +%zu", (int)layout,
            (const char *)w.next_k - k, (const char *)w.next_v - v, row * D * ELEM);
  }
  fd_work none = { 0 };
  fd_exec_next_rows(plan, &a, NULL, &none);
  t_check(none.next_k == NULL && none.next_v == NULL, "layout %d: no next item, no next rows", (int)layout);
  fd_plan_destroy(plan);
  fd_destroy(ctx);
}

int main(void) {
  static const int threads[] = { 1, 2, 4 };
  check_next_rows(FD_BHSD);
  check_next_rows(FD_BSHD);
  check_next_rows(FD_PAGED);
  for (int pattern = 0; pattern < 3; pattern++)
    for (int t = 0; t < 3; t++) {
      run_case(4, 1, pattern, threads[t]);
      run_case(32, 8, pattern, threads[t]);
    }
  return t_done();
}
