/* The exported header against the JIT path. Built twice from this file:
     - AOT (default): only the exported header (FDT_HEADER), gcc -O2, no
       library: `test_export_aot OUT` runs every table row and the default
       row on deterministic inputs and writes the results to OUT;
     - JIT (-DFDT_JIT, linked with libflashdecode.a): `test_export_jit TABLE
       OUT` runs the same problems through fd_create(.table = TABLE) and
       fd_run, checks the planner used each row's key, and compares with OUT
       within f32 rounding (and one unit of a 16-bit output dtype).
   Each row runs at a length inside its bucket, batch rows of uneven lengths. */
#include FDT_HEADER
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef FDT_JIT
#include "flashdecode.h"
#endif

/* One problem: shape, longest length, buffers. */
typedef struct prob {
  fdt_shape s;
  int64_t L;
  void *q, *k, *v, *out;
  float *mask, *ks, *vs, *lse;
  int32_t *pos;
  size_t nq, nkv, nrows, nmask, nh;
} prob;

/* xorshift32 step. */
static uint32_t rnd(uint32_t *x) {
  *x ^= *x << 13; *x ^= *x >> 17; *x ^= *x << 5;
  return *x;
}

/* f32 -> f16 bits for values k/128 with |k| <= 128 (exact: normal or zero). */
static uint16_t to_f16(float f) {
  union { float f; uint32_t u; } b = { f };
  uint32_t sign = (b.u >> 16) & 0x8000u, e = (b.u >> 23) & 0xffu, m = b.u & 0x7fffffu;
  if (e == 0) return (uint16_t)sign;
  return (uint16_t)(sign | ((e - 112u) << 10) | (m >> 13));
}

/* f16 bits -> f32 (normal, zero, inf). */
static float from_f16(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  union { uint32_t u; float f; } b;
  if (e == 0 && m == 0) b.u = sign;
  else if (e == 0) { float f = ldexpf((float)m, -24); return sign ? -f : f; }
  else if (e == 31) b.u = sign | 0x7f800000u | (m << 13);
  else b.u = sign | ((e + 112u) << 23) | (m << 13);
  return b.f;
}

/* Element i of a buffer of dtype dt as float (q/out dtypes). */
static float load(int dt, const void *p, size_t i) {
  if (dt == FDT_F32) return ((const float *)p)[i];
  if (dt == FDT_F16) return from_f16(((const uint16_t *)p)[i]);
  union { uint32_t u; float f; } b = { (uint32_t)((const uint16_t *)p)[i] << 16 };
  return b.f;
}

/* Fill n elements of dtype dt from seed: k/128 values, int8 or fp8 codes. */
static void fill(void *p, int dt, size_t n, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    uint32_t r = rnd(&x);
    float f = (float)((int)(r % 257) - 128) / 128.0f;
    union { float f; uint32_t u; } b = { f };
    if (dt == FDT_F32) ((float *)p)[i] = f;
    else if (dt == FDT_F16) ((uint16_t *)p)[i] = to_f16(f);
    else if (dt == FDT_BF16) ((uint16_t *)p)[i] = (uint16_t)(b.u >> 16);
    else if (dt == FDT_I8) ((int8_t *)p)[i] = (int8_t)((int)(r % 255) - 127);
    else ((uint8_t *)p)[i] = (uint8_t)((r & 0x80u) | (r % 0x60u));   /* fp8: finite, |x| < 32 */
  }
}

/* A problem of shape s with longest length L (uneven batch rows), seeded. */
static void make(prob *p, const fdt_shape *s, int64_t L, uint32_t seed) {
  memset(p, 0, sizeof *p);
  p->s = *s;
  p->L = L;
  if (s->mask_mode != FDT_CAUSAL) p->s.kv_len = L;
  p->nh = (size_t)s->batch * s->n_q_heads;
  p->nq = p->nh * s->head_dim;
  p->nrows = (size_t)s->batch * s->n_kv_heads * p->s.kv_len;
  p->nkv = p->nrows * s->head_dim;
  p->nmask = p->nh * p->s.kv_len;
  p->q = malloc(p->nq * 4); p->out = calloc(p->nq, 4);
  p->k = malloc(p->nkv * 4); p->v = malloc(p->nkv * 4);
  p->lse = calloc(p->nh, 4); p->pos = malloc(4 * s->batch);
  fill(p->q, s->q_dtype, p->nq, seed);
  fill(p->k, s->kv_dtype, p->nkv, seed + 1);
  fill(p->v, s->kv_dtype, p->nkv, seed + 2);
  for (int b = 0; b < s->batch; b++) p->pos[b] = (int32_t)(L - 1 - (b ? (int64_t)(b * 7919u) % (L / 2 + 1) : 0));
  if (s->kv_dtype >= FDT_I8) {
    p->ks = malloc(p->nrows * 4); p->vs = malloc(p->nrows * 4);
    for (size_t i = 0; i < p->nrows; i++) { p->ks[i] = 0.004f + 0.001f * (float)(i % 7); p->vs[i] = 0.003f + 0.001f * (float)(i % 5); }
  }
  if (s->mask_mode == FDT_MASK) {
    p->mask = malloc(p->nmask * 4);
    uint32_t x = seed + 3;
    for (size_t i = 0; i < p->nmask; i++) { uint32_t r = rnd(&x); p->mask[i] = r % 13 == 0 ? -INFINITY : -(float)(r % 100) / 50.0f; }
  }
}

/* Free a problem's buffers. */
static void unmake(prob *p) {
  free(p->q); free(p->out); free(p->k); free(p->v); free(p->lse); free(p->pos); free(p->ks); free(p->vs); free(p->mask);
}

/* The length a row runs at: inside its bucket, above half of it. */
static int64_t row_length(int64_t bucket) { return bucket >= 8 ? bucket - bucket / 8 : bucket; }

/* The shape of table row r (capacity: its bucket). */
static fdt_shape row_shape(const fdt_row *r) {
  fdt_shape s = { r->batch, r->n_q_heads, r->n_kv_heads, r->head_dim, r->bucket, r->q_dtype, r->kv_dtype,
                  r->out_dtype, r->mask_mode, r->layout };
  return s;
}

/* A shape the default row's kernels serve and no table row was tuned for. */
static fdt_shape default_shape(void) {
  const fd_kernel_desc *d = fdt_default_row.plain;
  fdt_shape s = { 3, 3, 1, d->head_dim, 700, d->q_dtype, d->kv_dtype, d->out_dtype, d->mask_mode, d->layout };
  return s;
}

/* Does case i ask for lse (the lse kernel or the merge's lse) or not (the plain kernel)? */
static int lse_on(int i) { return i % 4 < 2; }

/* Cases: every table row, then the default row. */
static int n_cases(void) { return FDT_N_ROWS + 1; }

/* Case i: its row, shape and longest length. */
static const fdt_row *case_of(int i, fdt_shape *s, int64_t *L) {
  if (i < FDT_N_ROWS) { *s = row_shape(&fdt_rows[i]); *L = row_length(fdt_rows[i].bucket); return &fdt_rows[i]; }
  *s = default_shape();
  *L = 600;
  return &fdt_default_row;
}

#ifndef FDT_JIT
/* A parallel-for that runs the items in reverse order (order must not matter). */
static void reverse_for(void *user, int n, fdt_body body, void *ctx) {
  ++*(int *)user;
  for (int i = n - 1; i >= 0; i--) body(ctx, i);
}

/* Run one case with the exported executor; append out (as float) and lse to f. */
static int aot_case(int i, FILE *f) {
  fdt_shape s;
  int64_t L;
  const fdt_row *row = case_of(i, &s, &L);
  prob p;
  make(&p, &s, L, 100u + (uint32_t)i);
  fdt_args a = { p.q, p.k, p.v, p.pos, p.mask, p.ks, p.vs, 0, p.out, lse_on(i) ? p.lse : NULL };
  size_t n = fdt_scratch_bytes(&p.s);
  void *scratch = malloc(n);
  int calls = 0;
  const fdt_row *got = fdt_lookup(&p.s, L);
  int rc = i % 2 ? fdt_run(&p.s, &a, scratch, n, reverse_for, &calls) : fdt_run(&p.s, &a, scratch, n, NULL, NULL);
  if (!rc && i % 2 && calls == 0) rc = 99;
  fprintf(stderr, "case %d: %s bucket %lld key %s (lookup: %s), rc %d\n", i, row->name, (long long)row->bucket,
          row->key, got == row ? "its row" : got == &fdt_default_row ? "default row" : "another row", rc);
  for (size_t e = 0; e < p.nq; e++) { float x = load(s.out_dtype, p.out, e); fwrite(&x, 4, 1, f); }
  fwrite(p.lse, 4, p.nh, f);
  free(scratch);
  unmake(&p);
  return rc;
}

/* Refusals: scratch too small, a shape no kernel serves, a bad cur_pos; 0 when all hold. */
static int error_cases(void) {
  fdt_shape s;
  int64_t L;
  case_of(0, &s, &L);
  prob p;
  make(&p, &s, L, 7);
  fdt_args a = { p.q, p.k, p.v, p.pos, p.mask, p.ks, p.vs, 0, p.out, NULL };
  size_t n = fdt_scratch_bytes(&p.s);
  void *scratch = malloc(n);
  int bad = 0;
  bad += fdt_run(&p.s, &a, scratch, 64, NULL, NULL) != FDT_ENOMEM;
  fdt_shape odd = p.s;
  odd.head_dim = 1000 + p.s.head_dim;   /* no kernel of any header has this head_dim */
  bad += fdt_scratch_bytes(&odd) != 0 || fdt_run(&odd, &a, scratch, n, NULL, NULL) != FDT_EUNSUPPORTED;
  if (s.mask_mode == FDT_CAUSAL) {
    p.pos[0] = (int32_t)p.s.kv_len;
    bad += fdt_run(&p.s, &a, scratch, n, NULL, NULL) != FDT_EINVAL;
  }
  fprintf(stderr, "refusals: %s\n", bad ? "FAILED" : "ok");
  free(scratch);
  unmake(&p);
  return bad;
}

int main(int argc, char **argv) {
  if (argc != 2) { fprintf(stderr, "usage: %s OUT\n", argv[0]); return 2; }
  if (error_cases()) return 1;
  FILE *f = fopen(argv[1], "wb");
  if (!f) { perror(argv[1]); return 1; }
  int bad = 0;
  for (int i = 0; i < n_cases(); i++) bad += aot_case(i, f) != 0;
  fclose(f);
  fprintf(stderr, "%d cases, %d failed\n", n_cases(), bad);
  return bad != 0;
}
#else
static int pass, fail;

/* Record a check. */
static void check(int ok, const char *what, int i) {
  if (ok) pass++;
  else { fail++; printf("FAIL - case %d: %s\n", i, what); }
}

/* Compare one case's JIT results with the AOT ones read from f. */
static void compare(int i, const prob *p, FILE *f) {
  double scale = 0, worst = 0, lworst = 0;
  float *aot = malloc(p->nq * 4), *alse = malloc(p->nh * 4);
  int ok = fread(aot, 4, p->nq, f) == p->nq && fread(alse, 4, p->nh, f) == p->nh;
  check(ok, "AOT results missing", i);
  double ulp = p->s.out_dtype == FDT_BF16 ? 1.0 / 128 : p->s.out_dtype == FDT_F16 ? 1.0 / 1024 : 0;
  for (size_t e = 0; ok && e < p->nq; e++) scale = fmax(scale, fabs(load(p->s.out_dtype, p->out, e)));
  for (size_t e = 0; ok && e < p->nq; e++) {
    double j = load(p->s.out_dtype, p->out, e), a = aot[e];
    double tol = 1e-5 * (scale > 0 ? scale : 1) + ulp * fmax(fabs(a), fabs(j));
    if (!(fabs(a - j) <= tol)) worst = fmax(worst, isnan(a - j) ? INFINITY : fabs(a - j) / tol);
  }
  for (size_t h = 0; ok && lse_on(i) && h < p->nh; h++) {
    double j = p->lse[h], a = alse[h];
    if (!(j == a || fabs(a - j) <= 1e-5 * fmax(1, fabs(j)))) lworst = fmax(lworst, fabs(a - j));
  }
  char why[160];
  snprintf(why, sizeof why, "out differs from the JIT (worst %.3g x tolerance, output scale %.3g)", worst, scale);
  check(ok && worst == 0, why, i);
  snprintf(why, sizeof why, "lse differs from the JIT (worst %.3g)", lworst);
  check(ok && lworst == 0, why, i);
  free(aot); free(alse);
}

/* Run one case through the library (the table's row for row cases). */
static void jit_case(int i, const char *table, FILE *f) {
  fdt_shape s;
  int64_t L;
  const fdt_row *row = case_of(i, &s, &L);
  prob p;
  make(&p, &s, L, 100u + (uint32_t)i);
  fd_ctx *ctx = fd_create(&(fd_config){ .table = table });
  check(ctx && !fd_errmsg(ctx)[0], "the table was refused", i);
  if (ctx && fd_errmsg(ctx)[0]) printf("  %s\n", fd_errmsg(ctx));
  fd_shape fs = { p.s.batch, p.s.n_q_heads, p.s.n_kv_heads, p.s.head_dim, p.s.kv_len, (fd_dtype)p.s.q_dtype,
                  (fd_dtype)p.s.kv_dtype, (fd_dtype)p.s.out_dtype, (fd_mask_mode)p.s.mask_mode, (fd_layout)p.s.layout, 0 };
  fd_plan *plan = NULL;
  fd_plan_info info = { 0 };
  int rc = fd_plan_create(ctx, &fs, &plan);
  if (!rc) rc = fd_plan_info_get(plan, L, &info);
  if (row != &fdt_default_row) check(!rc && info.from_table && !strcmp(info.key, row->key), "the planner did not use the row's key", i);
  fd_args a = { p.q, p.k, p.v, p.pos, p.mask, p.ks, p.vs, NULL, 0, p.out, lse_on(i) ? p.lse : NULL };
  if (!rc) rc = fd_run(plan, &a);
  check(rc == 0, "plan or run failed", i);
  if (rc) printf("  %s\n", fd_errmsg(ctx));
  printf("case %d: %s bucket %lld key %s: JIT key %s splits %d\n", i, row->name, (long long)row->bucket, row->key,
         info.key, info.splits);
  compare(i, &p, f);
  fd_plan_destroy(plan);
  fd_destroy(ctx);
  unmake(&p);
}

int main(int argc, char **argv) {
  if (argc != 3) { fprintf(stderr, "usage: %s TABLE AOT_OUT\n", argv[0]); return 2; }
  FILE *f = fopen(argv[2], "rb");
  if (!f) { perror(argv[2]); return 1; }
  for (int i = 0; i < n_cases(); i++) jit_case(i, argv[1], f);
  fclose(f);
  printf("%d passed, %d failed\n", pass, fail);
  return fail != 0;
}
#endif
