/* libflashdecode through its public API only, against the double-precision
   reference: dtypes, mask modes, layouts, head_dims, groups, uneven cur_pos,
   forced splits, thread counts and both backends. Bad input lives in
   test_errors.c. */
#include "compare.h"
#include "fd_keydefs.h"
#include "flashdecode.h"
#include "kexec.h"
#include "tcheck.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DT fd_dtype_names
#define MODE fd_mask_mode_names
static fd_ctx *ctx_tcc[5], *ctx_cc;   /* tcc contexts with 1..4 threads; one cc context */

/* The fd_shape and fd_args of a test problem. */
static void api_views(const kproblem *p, fd_shape *s, fd_args *a, void *out, float *lse) {
  const ref_problem *r = &p->ref;
  fd_shape sh = { r->B, r->Hq, r->Hkv, r->D, r->S, (fd_dtype)p->q_dtype, (fd_dtype)p->kv_dtype,
                  (fd_dtype)p->out_dtype, (fd_mask_mode)r->mask_mode, (fd_layout)r->layout, 0 };
  fd_args ar = { p->q, p->k, p->v, p->cur_pos, p->mask, p->k_scale, p->v_scale, NULL, 0, out, lse };
  *s = sh;
  *a = ar;
}

/* Plan and run p through the API with opts; compare with the reference. */
static void api_case(fd_ctx *ctx, kproblem *p, const fd_plan_opts *o, int want_lse, const char *name) {
  const ref_problem *r = &p->ref;
  size_t n = (size_t)r->B * r->Hq * r->D, nl = (size_t)r->B * r->Hq;
  void *out = malloc(n * t_dtype_size(p->out_dtype));
  float *outf = malloc(n * 4), *lse = malloc(nl * 4);
  double *rout = malloc(n * 8), *rlse = malloc(nl * 8);
  fd_shape s;
  fd_args a;
  api_views(p, &s, &a, out, want_lse ? lse : NULL);
  fd_plan *plan = NULL;
  int rc = fd_plan_create_opts(ctx, &s, o, &plan);
  if (t_check(rc == 0, "%s: plan: %s", name, fd_errmsg(ctx))) {
    rc = fd_run(plan, &a);
    if (t_check(rc == 0, "%s: run: %s", name, fd_errmsg(ctx))) {
      ref_attention(r, rout, rlse);
      for (size_t i = 0; i < n; i++) outf[i] = t_load(p->out_dtype, out, i);
      t_compare(p, outf, lse, rout, rlse, want_lse, name);
    }
    fd_plan_destroy(plan);
  }
  free(out); free(outf); free(lse); free(rout); free(rlse);
}

/* One generated problem run through the API; cur_pos has 0 and kv_len-1 when B >= 2. */
static void run(fd_ctx *ctx, int B, int Hq, int Hkv, int D, int64_t S, int qd, int kd, int od, int mode,
                int layout, fd_plan_opts o, int lse, uint64_t seed, const char *tag) {
  char name[256];
  snprintf(name, sizeof name, "%s: B%d Hq%d Hkv%d D%d S%lld q%s kv%s out%s %s %s chunk%d tile%d splits%d threads%d",
           tag, B, Hq, Hkv, D, (long long)S, DT[qd], DT[kd], DT[od], MODE[mode], layout ? "bshd" : "bhsd",
           o.chunk, o.group_tile, o.splits, fd_ctx_threads(ctx));
  kproblem p;
  kp_init(&p, B, Hq, Hkv, D, S, qd, kd, od, mode, layout, seed);
  if (B >= 2) p.cur_pos[1] = 0;
  api_case(ctx, &p, &o, lse, name);
  kp_free(&p);
}

/* Every q x kv x out dtype (and the KV dtypes with row scales: int8, fp8 e4m3, e5m2), planner's choices. */
static void dtypes(void) {
  for (int c = 0; c < 27; c++)
    run(ctx_tcc[2], 3, 8, 2, 128, 300, c / 9, c / 3 % 3, c % 3, c % 3, c % 2, (fd_plan_opts){ 0 }, c % 2, 100 + c, "dtypes");
  for (int c = 0; c < 3 * t_quant_count(); c++)
    run(ctx_tcc[2], 2, 8, 2, 64, 200, c % 3, t_quant_dtype(c / 3), (c + 1) % 3, (c + c / 3) % 3, c % 2,
        (fd_plan_opts){ 0 }, 1, 150 + c, "quantized");
}

/* Mask modes x layouts x head_dims x groups, with forced splits and thread counts cycling. */
static void shapes(void) {
  static const int dims[] = { 64, 80, 96, 128, 256 }, groups[] = { 1, 4, 7, 8, 16 };
  static const int splits[] = { 0, 1, 2, 3, 7, 400 };
  int idx = 0;
  for (int mode = 0; mode < 3; mode++)
    for (int layout = 0; layout < 2; layout++)
      for (int di = 0; di < 5; di++)
        for (int gi = 0; gi < 5; gi++, idx++) {
          int G = groups[gi], combo = idx * 7 % 27;
          fd_plan_opts o = { idx % 3 ? 0 : 32, idx % 2 ? G : 0, splits[idx % 6], 0, 0 };
          run(ctx_tcc[1 + idx % 4], 2, 2 * G, 2, dims[di], idx % 4 ? 150 : 64, combo / 9, combo / 3 % 3,
              combo % 3, mode, layout, o, idx % 2, 200 + idx, "shapes");
        }
}

/* Uneven batch lengths with planner-chosen (length-balanced) splits, and one plan
   serving a growing cache across length buckets. */
static void uneven_and_growing(void) {
  kproblem p;
  kp_init(&p, 6, 8, 2, 64, 3000, 0, 1, 0, 0, 0, 300);
  int32_t pos[6] = { 2999, 0, 17, 1500, 2998, 640 };
  memcpy(p.cur_pos, pos, sizeof pos);
  api_case(ctx_tcc[4], &p, &(fd_plan_opts){ 0 }, 1, "uneven cur_pos 0..kv_len-1, 4 threads");
  api_case(ctx_tcc[3], &p, &(fd_plan_opts){ 0, 0, 0, 0, 0 }, 0, "uneven cur_pos, 3 threads");
  kp_free(&p);
  /* a growing cache: one plan, lengths in different buckets */
  kp_init(&p, 1, 4, 1, 64, 5000, 0, 2, 0, 0, 0, 301);
  fd_shape s;
  fd_args a;
  float out[4 * 64], outf[4 * 64], lse[4];
  double rout[4 * 64], rlse[4];
  api_views(&p, &s, &a, out, lse);
  fd_plan *plan;
  if (!t_check(fd_plan_create(ctx_tcc[2], &s, &plan) == 0, "growing: plan: %s", fd_errmsg(ctx_tcc[2]))) return;
  static const int32_t steps[] = { 0, 1, 2, 63, 64, 65, 1000, 1023, 1024, 4095, 4096, 4999 };
  for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) {
    char name[64];
    snprintf(name, sizeof name, "growing cache, cur_pos %d", steps[i]);
    p.cur_pos[0] = steps[i];
    if (!t_check(fd_run(plan, &a) == 0, "%s: %s", name, fd_errmsg(ctx_tcc[2]))) continue;
    ref_attention(&p.ref, rout, rlse);
    memcpy(outf, out, sizeof out);
    t_compare(&p, outf, lse, rout, rlse, 1, name);
  }
  fd_plan_destroy(plan);
  kp_free(&p);
}

/* The cc backend on a spread of configurations. */
static void cc_backend(void) {
  if (!t_check(ctx_cc != NULL, "cc context: %s", fd_errmsg(NULL))) return;
  for (int c = 0; c < 12; c++) {
    fd_plan_opts o = { c % 2 ? 64 : 0, c % 3 ? 0 : 2, c % 4, 0, 0 };
    int kd = (c + 1) % FD_DTYPE_COUNT;   /* head_dim 80 where the KV dtype has no 32-element blocks */
    run(ctx_cc, 2, 8, 2, c % 3 && fd_dtype_block[kd] == 1 ? 128 : fd_dtype_block[kd] > 1 ? 96 : 80, 333, c % 3, kd,
        (c + 2) % 3, c % 3, c % 2, o, c % 2,
        400 + c, "cc");
  }
}

int main(void) {
  for (int t = 1; t <= 4; t++) {
    ctx_tcc[t] = fd_create(&(fd_config){ .threads = t });
    if (!t_check(ctx_tcc[t] != NULL, "fd_create with %d threads: %s", t, fd_errmsg(NULL))) return t_done();
  }
  ctx_tcc[0] = ctx_tcc[2];
  const char *dir = getenv("FD_TEST_CACHE_DIR");
  ctx_cc = fd_create(&(fd_config){ .threads = 2, .backend = FD_BACKEND_CC, .cache_dir = dir ? dir : "build/test-cache" });
  t_check(!ctx_cc || fd_ctx_backend(ctx_cc) == FD_BACKEND_CC, "cc backend in use (a compiler is installed)");
  dtypes();
  shapes();
  uneven_and_growing();
  cc_backend();
  setenv("FD_MERGE", "pass", 1);        /* the second-pass merge gives the same results */
  for (int c = 0; c < 6; c++)
    run(ctx_tcc[1 + c % 4], 3, 8, 2, 64, 257, c % 3, c % 3, c % 3, c % 3, c % 2, (fd_plan_opts){ 0, 0, 1 + c * 3, 0, 0 },
        c % 2, 500 + c, "merge pass");
  unsetenv("FD_MERGE");
  for (int t = 1; t <= 4; t++) fd_destroy(ctx_tcc[t]);
  fd_destroy(ctx_cc);
  kx_cleanup();
  return t_done();
}
