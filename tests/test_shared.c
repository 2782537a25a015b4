/* Shared KV (fd_shape.features FD_SHARED_KV) through the public API, against
   the double-precision reference: cascade attention, a shared prefix attended
   once by every batch row (full mode), each row's own suffix (causal), and
   fd_merge_states of the two, equal to attention over the concatenation;
   a shared sequence in mask mode equal to the same keys copied into every
   row; every isa this CPU runs, every KV dtype (int8 and fp8 with their row
   scales), unsplit and 3 splits, and
   the refusal of a shared sequence with causal positions. */
#include "compare.h"
#include "internal.h"
#include "cpu.h"
#include "tcheck.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define B 3
#define HKV 2
#define P 500                  /* the shared prefix */
#define L 200                  /* suffix capacity */

static const int LENS[B] = { L, 57, 1 };   /* each row's suffix keys */

/* Plan s with opts and run a; FD_OK or the code. */
static int plan_run(fd_ctx *ctx, const fd_shape *s, const fd_plan_opts *o, const fd_args *a) {
  fd_plan *plan = NULL;
  int rc = fd_plan_create_opts(ctx, s, o, &plan);
  if (!rc) rc = fd_run(plan, a);
  fd_plan_destroy(plan);
  return rc;
}

/* Rows [B, Hkv, P + L, D] of prefix (batch 1) then suffix (batch B) values. */
static float *concat(const float *prefix, const float *suffix, int D) {
  float *c = malloc(sizeof(float) * B * HKV * (P + L) * (size_t)D);
  for (int b = 0; b < B; b++)
    for (int j = 0; j < HKV; j++) {
      float *row = c + ((size_t)b * HKV + j) * (P + L) * D;
      memcpy(row, prefix + (size_t)j * P * D, sizeof(float) * P * D);
      memcpy(row + (size_t)P * D, suffix + ((size_t)b * HKV + j) * L * D, sizeof(float) * L * D);
    }
  return c;
}

/* Cascade: prefix once (shared, full) + suffixes (causal) + merge vs the concatenation. */
static void cascade(fd_ctx *ctx, int isa, int kd, int splits, int G, int idx) {
  int D = idx % 2 ? 128 : 64, Hq = HKV * G, qd = idx % 3;
  if (D % fd_isa_table[isa].width || G > fd_isa_table[isa].max_tile) return;
  char name[200];
  snprintf(name, sizeof name, "cascade isa%d kv%s q%s splits%d G%d D%d", isa, fd_dtype_names[kd], fd_dtype_names[qd],
           splits, G, D);
  kproblem pre, suf;
  kp_init(&pre, 1, Hq, HKV, D, P, qd, kd, FD_F32, FD_FULL, FD_BHSD, 40 + (uint64_t)idx);
  kp_init(&suf, B, Hq, HKV, D, L, qd, kd, FD_F32, FD_CAUSAL, FD_BHSD, 80 + (uint64_t)idx);
  for (int b = 0; b < B; b++) suf.cur_pos[b] = LENS[b] - 1;
  size_t n = (size_t)B * Hq * D, rows = (size_t)B * Hq;
  float *o1 = malloc(n * 4), *o2 = malloc(n * 4), *out = malloc(n * 4);
  float *l1 = malloc(rows * 4), *l2 = malloc(rows * 4), *lse = malloc(rows * 4);
  fd_plan_opts o = { 64, G, splits, 2, isa + 1 };
  fd_shape sp = { B, Hq, HKV, D, P, qd, kd, FD_F32, FD_FULL, FD_BHSD, 0 };
  sp.features = FD_SHARED_KV;
  fd_args ap = { suf.q, pre.k, pre.v, NULL, NULL, pre.k_scale, pre.v_scale, NULL, 0, o1, l1 };
  fd_shape ss = { B, Hq, HKV, D, L, qd, kd, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  fd_args as = { suf.q, suf.k, suf.v, suf.cur_pos, NULL, suf.k_scale, suf.v_scale, NULL, 0, o2, l2 };
  int rc = plan_run(ctx, &sp, &o, &ap);
  if (!rc) rc = plan_run(ctx, &ss, &o, &as);
  const float *outs[2] = { o1, o2 }, *lses[2] = { l1, l2 };
  if (!rc) rc = fd_merge_states(2, outs, lses, (int64_t)rows, D, out, lse);
  if (t_check(rc == 0, "%s: runs and merge: %s", name, fd_errmsg(ctx))) {
    float *kc = concat(pre.kf, suf.kf, D), *vc = concat(pre.vf, suf.vf, D);
    int32_t pos[B];
    for (int b = 0; b < B; b++) pos[b] = P + LENS[b] - 1;
    ref_problem r = suf.ref;
    r.S = P + L; r.k = kc; r.v = vc; r.cur_pos = pos;
    double *rout = malloc(n * sizeof(double)), *rlse = malloc(rows * sizeof(double));
    ref_attention(&r, rout, rlse);
    t_compare(&suf, out, lse, rout, rlse, 1, name);
    free(kc); free(vc); free(rout); free(rlse);
  }
  free(o1); free(o2); free(out); free(l1); free(l2); free(lse);
  kp_free(&pre); kp_free(&suf);
}

/* A shared sequence in mask mode (a mask per row) equals its keys copied into every row. */
static void shared_mask(fd_ctx *ctx, int isa, int splits, int idx) {
  int D = 64, G = 4, Hq = HKV * G;
  char name[160];
  snprintf(name, sizeof name, "shared mask mode isa%d splits%d", isa, splits);
  kproblem pre, all;
  kp_init(&pre, 1, Hq, HKV, D, P, FD_BF16, FD_BF16, FD_F32, FD_MASK, FD_BHSD, 200 + (uint64_t)idx);
  kp_init(&all, B, Hq, HKV, D, P, FD_BF16, FD_BF16, FD_F32, FD_MASK, FD_BHSD, 300 + (uint64_t)idx);
  size_t kv = (size_t)HKV * P * D;
  for (int b = 0; b < B; b++) {                 /* every row holds the shared keys */
    memcpy(all.kf + b * kv, pre.kf, kv * sizeof(float));
    memcpy(all.vf + b * kv, pre.vf, kv * sizeof(float));
  }
  kp_sync(&all);
  size_t n = (size_t)B * Hq * D;
  float *out = malloc(n * 4), *lse = malloc(sizeof(float) * B * Hq);
  fd_shape s = { B, Hq, HKV, D, P, FD_BF16, FD_BF16, FD_F32, FD_MASK, FD_BHSD, 0 };
  s.features = FD_SHARED_KV;
  fd_args a = { all.q, pre.k, pre.v, NULL, all.mask, NULL, NULL, NULL, 0, out, lse };
  int rc = plan_run(ctx, &s, &(fd_plan_opts){ 0, 0, splits, 2, isa + 1 }, &a);
  if (t_check(rc == 0, "%s: run: %s", name, fd_errmsg(ctx))) {
    double *rout = malloc(n * sizeof(double)), *rlse = malloc(sizeof(double) * B * Hq);
    ref_attention(&all.ref, rout, rlse);
    t_compare(&all, out, lse, rout, rlse, 1, name);
    free(rout); free(rlse);
  }
  free(out); free(lse);
  kp_free(&pre); kp_free(&all);
}

/* FD_SHARED_KV with causal positions is refused naming shape.features. */
static void refusal(fd_ctx *ctx) {
  fd_shape s = { B, 8, HKV, 64, P, FD_F32, FD_F32, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  s.features = FD_SHARED_KV;
  fd_plan *plan = NULL;
  int rc = fd_plan_create(ctx, &s, &plan);
  t_check(rc == FD_EINVAL && strstr(fd_errmsg(ctx), "shape.features") && !plan,
          "FD_SHARED_KV with FD_CAUSAL refused naming shape.features: rc %d, \"%s\"", rc, fd_errmsg(ctx));
  fd_plan_destroy(plan);
}

int main(void) {
  int idx = 0;
  for (int isa = 0; isa < FD_ISA_COUNT; isa++) if (fd_cpu_has_isa(isa)) {
    fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2, .isa_limit = isa + 1 });
    for (int kd = 0; kd < FD_DTYPE_COUNT; kd++)
      for (int sp = 0; sp < 2; sp++)
        for (int g = 0; g < 2; g++) cascade(ctx, isa, kd, sp ? 3 : 1, g ? 16 : 4, idx++);
    for (int sp = 0; sp < 2; sp++) shared_mask(ctx, isa, sp ? 3 : 1, idx++);
    if (isa == 0) refusal(ctx);
    fd_destroy(ctx);
  }
  return t_done();
}
