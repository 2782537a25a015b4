/* The exported header against the JIT path. Built twice from this file:
     - AOT (default): only the exported header (FDT_HEADER), gcc -O2, no
       library: `test_export_aot OUT` runs every table row and the default
       row on deterministic inputs and writes the results to OUT;
     - JIT (-DFDT_JIT, linked with libflashdecode.a): `test_export_jit TABLE
       OUT` runs the same problems through fd_create(.table = TABLE) and
       fd_run, checks the planner used each row's key, and compares with OUT
       within f32 rounding (and one unit of a 16-bit output dtype), and with
       the double reference (tools/fdgen/ref.c) where it models the case;
       `test_export_jit --refusals` gives the same bad shapes and arguments
       to fdt_run and to fd_plan_create + fd_run, case by case: the same
       code, the same field named, nothing written to out or lse by either;
     - JIT with internals (-DFDT_JIT -DFDT_INTERNAL, linked with
       libfd_internal.a): `test_export_int --uneven TABLE` runs batches of 5
       rows of uneven lengths (1, 17, 300, 1000, 4096 per 4096 keys of each
       row's bucket, and mirrored) through fdt_run and fd_run and checks the
       same work items, item by item (fdt_work_items, fd_exec_items), and
       the same out and lse, bit for bit; each case again with softcap
       0.25 (small, so that it shows on these small logits), with learned
       sink logits (FD_SINK_LOGITS), and causal ones with ALiBi (the
       standard slopes), a sliding window with 4 sink tokens and a window
       alone (the items then tile each row's visible keys: sinks, then the
       window; paged rows with the pages outside them freed, -1 in the
       block table), bit for bit too, and out differing from the plain run's.
   Each row runs at a length inside its bucket, batch rows of uneven lengths,
   and must find its own row (fdt_lookup): a window, softcap or feature row
   beside the plain row of the same shape and bucket (their signature tokens). */
#include FDT_HEADER
#include <ctype.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef FDT_JIT
#include "flashdecode.h"
#include "ref.h"
#endif

/* One problem: shape, longest length, buffers. */
typedef struct prob {
  fdt_shape s;
  int64_t L;
  void *q, *k, *v, *out;
  float *mask, *ks, *vs, *lse;
  float *slopes, *sinks;    /* FD_ALIBI slopes and FD_SINK_LOGITS logits of a feature row's shape, or NULL */
  int32_t *pos, *table;     /* table: the paged layout's block table */
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

/* Fill the n / 32 blocks of n elements of a block dtype (q8_0, q4_0) from the
   generator state x, every byte of them: a small positive f16 scale, then
   random codes. */
static void fill_blocks(uint8_t *p, int dt, size_t n, uint32_t *x) {
  size_t bytes = fdt_dtype_block_bytes[dt];
  for (size_t b = 0; b < n / fdt_dtype_block[dt]; b++) {
    uint16_t d = to_f16(0.004f + 0.001f * (float)(b % 7));
    p[b * bytes] = (uint8_t)d;
    p[b * bytes + 1] = (uint8_t)(d >> 8);
    for (size_t j = 2; j < bytes; j++) p[b * bytes + j] = (uint8_t)rnd(x);
  }
}

/* Fill n elements of dtype dt from seed: k/128 values, int8 or fp8 (e4m3,
   e5m2) codes, or whole q8_0/q4_0 blocks (fill_blocks). */
static void fill(void *p, int dt, size_t n, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  if (fdt_dtype_block[dt] > 1) { fill_blocks(p, dt, n, &x); return; }
  for (size_t i = 0; i < n; i++) {
    uint32_t r = rnd(&x);
    float f = (float)((int)(r % 257) - 128) / 128.0f;
    union { float f; uint32_t u; } b = { f };
    if (dt == FDT_F32) ((float *)p)[i] = f;
    else if (dt == FDT_F16) ((uint16_t *)p)[i] = to_f16(f);
    else if (dt == FDT_BF16) ((uint16_t *)p)[i] = (uint16_t)(b.u >> 16);
    else if (dt == FDT_I8) ((int8_t *)p)[i] = (int8_t)((int)(r % 255) - 127);
    else ((uint8_t *)p)[i] = (uint8_t)((r & 0x80u) | (r % 0x60u));   /* fp8: finite, |x| < 32 (e4m3), <= 448 (e5m2) */
  }
}

/* A problem of shape s with longest length L (uneven batch rows), seeded. */
static void make(prob *p, const fdt_shape *s, int64_t L, uint32_t seed) {
  memset(p, 0, sizeof *p);
  p->s = *s;
  p->L = L;
  if (s->mask_mode != FDT_CAUSAL) p->s.kv_len = L;
  p->nh = (size_t)s->batch * (s->q_len > 1 ? s->q_len : 1) * s->n_q_heads;   /* query rows of every token */
  p->nq = p->nh * s->head_dim;
  p->nrows = (size_t)s->batch * s->n_kv_heads * p->s.kv_len;
  if (s->layout == FDT_PAGED) {             /* pages of 64 keys in reverse pool order */
    int64_t per_row = (p->s.kv_len + 63) / 64;
    p->s.page_size = 64;
    p->s.pool_pages = s->batch * per_row;
    p->nrows = (size_t)p->s.pool_pages * s->n_kv_heads * 64;
    p->table = malloc(sizeof(int32_t) * (size_t)p->s.pool_pages);
    for (int64_t i = 0; i < p->s.pool_pages; i++) p->table[i] = (int32_t)(p->s.pool_pages - 1 - i);
  }
  p->nkv = p->nrows * s->head_dim;
  p->nmask = p->nh * p->s.kv_len;
  p->q = malloc(p->nq * 4); p->out = calloc(p->nq, 4);
  p->k = calloc(p->nkv, 4); p->v = calloc(p->nkv, 4);   /* zeroed: the AOT and JIT processes see the same bytes */
  p->lse = calloc(p->nh, 4); p->pos = malloc(4 * s->batch);
  fill(p->q, s->q_dtype, p->nq, seed);
  fill(p->k, s->kv_dtype, p->nkv, seed + 1);
  fill(p->v, s->kv_dtype, p->nkv, seed + 2);
  for (int b = 0; b < s->batch; b++) p->pos[b] = (int32_t)(L - 1 - (b ? (int64_t)(b * 7919u) % (L / 2 + 1) : 0));
  if (fdt_dtype_quant[s->kv_dtype]) {
    p->ks = malloc(p->nrows * 4); p->vs = malloc(p->nrows * 4);
    for (size_t i = 0; i < p->nrows; i++) { p->ks[i] = 0.004f + 0.001f * (float)(i % 7); p->vs[i] = 0.003f + 0.001f * (float)(i % 5); }
  }
  if (s->features & 3u) {   /* FD_ALIBI (1): slopes 2^(-8 (h + 1) / Hq); FD_SINK_LOGITS (2): logits h / Hq - 0.5 */
    p->slopes = malloc(4 * (size_t)s->n_q_heads); p->sinks = malloc(4 * (size_t)s->n_q_heads);
    for (int h = 0; h < s->n_q_heads; h++) {
      p->slopes[h] = exp2f(-8.0f * (float)(h + 1) / (float)s->n_q_heads);
      p->sinks[h] = (float)h / (float)s->n_q_heads - 0.5f;
    }
    if (!(s->features & 1u)) { free(p->slopes); p->slopes = NULL; }
    if (!(s->features & 2u)) { free(p->sinks); p->sinks = NULL; }
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
  free(p->table); free(p->slopes); free(p->sinks);
}

/* The length a row runs at: inside its bucket, above half of it. */
static int64_t row_length(int64_t bucket) { return bucket >= 8 ? bucket - bucket / 8 : bucket; }

/* The shape of table row r (capacity: its bucket; a windowed row's window
   leaves the keys of its bucket; a softcap row caps at 30, which signs as
   the row's placeholder does). */
static fdt_shape row_shape(const fdt_row *r) {
  fdt_shape s = { .batch = r->batch, .n_q_heads = r->n_q_heads, .n_kv_heads = r->n_kv_heads, .head_dim = r->head_dim,
                  .kv_len = r->bucket, .q_dtype = r->q_dtype, .kv_dtype = r->kv_dtype, .out_dtype = r->out_dtype,
                  .mask_mode = r->mask_mode, .layout = r->layout, .q_len = r->q_len, .window = r->window,
                  .softcap = r->softcap ? 30.0f : 0.0f, .features = r->features };
  return s;
}

/* A shape the default row's kernels serve and no table row was tuned for. */
static fdt_shape default_shape(void) {
  const fd_kernel_desc *d = fdt_default_row.plain;
  fdt_shape s = { .batch = 3, .n_q_heads = 3, .n_kv_heads = 1, .head_dim = d->head_dim, .kv_len = 700,
                  .q_dtype = d->q_dtype, .kv_dtype = d->kv_dtype, .out_dtype = d->out_dtype,
                  .mask_mode = d->mask_mode, .layout = d->layout };
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
  fdt_args a = { p.q, p.k, p.v, p.pos, p.mask, p.ks, p.vs, p.table, 0, p.out, lse_on(i) ? p.lse : NULL, p.slopes, p.sinks, NULL, NULL,
                 NULL };
  size_t n = fdt_scratch_bytes(&p.s);
  void *scratch = malloc(n);
  int calls = 0;
  const fdt_row *got = fdt_lookup(&p.s, L);
  int rc = i % 2 ? fdt_run(&p.s, &a, scratch, n, reverse_for, &calls) : fdt_run(&p.s, &a, scratch, n, NULL, NULL);
  if (!rc && i % 2 && calls == 0) rc = 99;
  if (!rc && row != &fdt_default_row && got != row) rc = 98;   /* a row's own shape must find that row */
  fprintf(stderr, "case %d: %s bucket %lld key %s (lookup: %s), rc %d\n", i, row->name, (long long)row->bucket,
          row->key, got == row ? "its row" : got == &fdt_default_row ? "default row" : "another row", rc);
  for (size_t e = 0; e < p.nq; e++) { float x = load(s.out_dtype, p.out, e); fwrite(&x, 4, 1, f); }
  fwrite(p.lse, 4, p.nh, f);
  free(scratch);
  unmake(&p);
  return rc;
}

/* A head_dim in 1..999 (valid) that no kernel of this header serves for s, or 0. */
static int unserved_head_dim(const fdt_shape *s) {
  fdt_shape t = *s;
  for (t.head_dim = 999; t.head_dim >= 1; t.head_dim--)
    if (!fdt_lookup(&t, 1)) return t.head_dim;
  return 0;
}

/* Refusals: scratch too small, a shape no kernel serves, a bad cur_pos; 0 when all hold. */
static int error_cases(void) {
  fdt_shape s;
  int64_t L;
  case_of(0, &s, &L);
  prob p;
  make(&p, &s, L, 7);
  fdt_args a = { p.q, p.k, p.v, p.pos, p.mask, p.ks, p.vs, p.table, 0, p.out, NULL, NULL, NULL, NULL, NULL, NULL };
  size_t n = fdt_scratch_bytes(&p.s);
  void *scratch = malloc(n);
  int bad = 0;
  bad += fdt_run(&p.s, &a, scratch, 64, NULL, NULL) != FDT_ENOMEM;
  fdt_shape odd = p.s;
  odd.head_dim = unserved_head_dim(&p.s);   /* valid, but no kernel of this header has it */
  bad += odd.head_dim == 0 || fdt_scratch_bytes(&odd) != 0 || fdt_run(&odd, &a, scratch, n, NULL, NULL) != FDT_EUNSUPPORTED;
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

/* K/V element e of a problem's buffer kv (scales sc for int8/fp8; q8_0/q4_0 blocks) as float. */
static float kv_value(const prob *p, const void *kv, const float *sc, size_t e) {
  int dt = p->s.kv_dtype, D = p->s.head_dim;
  const uint8_t *u = kv;
  if (dt <= FDT_BF16) return load(dt, kv, e);
  if (dt == FDT_I8) return (float)((const int8_t *)kv)[e] * sc[e / (size_t)D];
  if (dt == FDT_FP8_E4M3) return t_e4m3_to_f32(u[e]) * sc[e / (size_t)D];
  if (dt == FDT_FP8_E5M2) return t_e5m2_to_f32(u[e]) * sc[e / (size_t)D];
  const uint8_t *blk = u + e / 32 * fdt_dtype_block_bytes[dt];
  float d = from_f16((uint16_t)(blk[0] | blk[1] << 8));
  int j = (int)(e % 32);
  if (dt == FDT_Q8_0) return d * (float)(int8_t)blk[2 + j];
  return d * (float)((j < 16 ? blk[2 + j] & 15 : blk[2 + j - 16] >> 4) - 8);
}

/* Can the double reference (tools/fdgen/ref.c) model case p: one query token,
   no window or feature bits (softcap it models)? */
static int ref_models(const prob *p) { return p->s.q_len <= 1 && p->s.window == 0 && p->s.features == 0; }

/* The case's K or V (kv, scales sc) as dense BHSD floats (paged: gathered through the block table). */
static float *dense_kv(const prob *p, const void *kv, const float *sc) {
  int B = p->s.batch, Hkv = p->s.n_kv_heads, D = p->s.head_dim;
  int64_t S = p->s.kv_len, per_row = (S + 63) / 64;
  float *out = malloc(sizeof(float) * (size_t)B * Hkv * (size_t)S * D);
  for (int b = 0; b < B; b++)
    for (int j = 0; j < Hkv; j++)
      for (int64_t i = 0; i < S; i++) {
        int64_t row = p->s.layout == FDT_BSHD ? ((int64_t)b * S + i) * Hkv + j
                    : p->s.layout == FDT_PAGED ? ((int64_t)p->table[b * per_row + i / 64] * Hkv + j) * 64 + i % 64
                    : ((int64_t)b * Hkv + j) * S + i;
        for (int d = 0; d < D; d++)
          out[(((size_t)b * Hkv + j) * S + i) * D + d] = kv_value(p, kv, sc, (size_t)row * D + d);
      }
  return out;
}

/* The JIT's out and lse of case i against the double reference (those the
   reference models; the AOT results equal the JIT's within compare's
   tolerance): f32 rounding relative to the output's scale, and one unit of
   a 16-bit output dtype. */
static void ref_compare(int i, const prob *p) {
  if (!ref_models(p)) return;
  size_t nq = p->nq, nh = p->nh;
  float *q = malloc(nq * 4), *k = dense_kv(p, p->k, p->ks), *v = dense_kv(p, p->v, p->vs);
  double *ro = malloc(nq * 8), *rl = malloc(nh * 8), scale = 0, worst = 0, lworst = 0;
  for (size_t e = 0; e < nq; e++) q[e] = load(p->s.q_dtype, p->q, e);
  ref_problem r = { .B = p->s.batch, .Hq = p->s.n_q_heads, .Hkv = p->s.n_kv_heads, .D = p->s.head_dim, .S = p->s.kv_len,
                    .mask_mode = p->s.mask_mode, .layout = 0, .q = q, .k = k, .v = v, .cur_pos = p->pos, .mask = p->mask,
                    .scale = 1.0 / sqrt((double)p->s.head_dim), .softcap = p->s.softcap };
  ref_attention(&r, ro, rl);
  double ulp = p->s.out_dtype == FDT_BF16 ? 1.0 / 128 : p->s.out_dtype == FDT_F16 ? 1.0 / 1024 : 0;
  for (size_t e = 0; e < nq; e++) scale = fmax(scale, fabs(ro[e]));
  for (size_t e = 0; e < nq; e++) {
    double got = load(p->s.out_dtype, p->out, e), tol = 1e-5 * (scale > 0 ? scale : 1) + ulp * fabs(ro[e]);
    if (!(fabs(got - ro[e]) <= tol)) worst = fmax(worst, isnan(got) ? INFINITY : fabs(got - ro[e]) / tol);
  }
  for (size_t h = 0; lse_on(i) && h < nh; h++)
    if (!(rl[h] == p->lse[h] || fabs(rl[h] - p->lse[h]) <= 1e-5 * fmax(1, fabs(rl[h]))))
      lworst = fmax(lworst, fabs(rl[h] - p->lse[h]));
  char why[160];
  snprintf(why, sizeof why, "out differs from the double reference (worst %.3g x tolerance, scale %.3g)", worst, scale);
  check(worst == 0, why, i);
  snprintf(why, sizeof why, "lse differs from the double reference (worst %.3g)", lworst);
  check(lworst == 0, why, i);
  free(q); free(k); free(v); free(ro); free(rl);
}

/* libflashdecode's shape for header shape s: the same fields (gen/facts.lua SHAPE_FIELDS). */
static fd_shape to_fd_shape(const fdt_shape *s) {
  _Static_assert(sizeof(fd_shape) == sizeof(fdt_shape), "fdt_shape mirrors fd_shape");
  fd_shape fs;
  memcpy(&fs, s, sizeof fs);
  return fs;
}

/* libflashdecode's arguments for header arguments a. */
static fd_args to_fd_args(const fdt_args *a) {
  fd_args fa = { .q = a->q, .k = a->k, .v = a->v, .cur_pos = a->cur_pos, .mask = a->mask, .k_scale = a->k_scale,
                 .v_scale = a->v_scale, .block_table = a->block_table, .scale = a->scale, .out = a->out, .lse = a->lse,
                 .alibi_slopes = a->alibi_slopes, .sink_logits = a->sink_logits, .beam_src = a->beam_src };
  return fa;
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
  fd_shape fs = to_fd_shape(&p.s);
  fd_plan *plan = NULL;
  fd_plan_info info = { 0 };
  int rc = fd_plan_create(ctx, &fs, &plan);
  if (!rc) rc = fd_plan_info_get(plan, L, &info);
  if (row != &fdt_default_row) check(!rc && info.from_table && !strcmp(info.key, row->key), "the planner did not use the row's key", i);
  fdt_args ta = { p.q, p.k, p.v, p.pos, p.mask, p.ks, p.vs, p.table, 0, p.out, lse_on(i) ? p.lse : NULL, p.slopes, p.sinks, NULL, NULL,
                  NULL };
  fd_args a = to_fd_args(&ta);
  if (!rc) rc = fd_run(plan, &a);
  check(rc == 0, "plan or run failed", i);
  if (rc) printf("  %s\n", fd_errmsg(ctx));
  printf("case %d: %s bucket %lld key %s: JIT key %s splits %d\n", i, row->name, (long long)row->bucket, row->key,
         info.key, info.splits);
  compare(i, &p, f);
  ref_compare(i, &p);
  fd_plan_destroy(plan);
  fd_destroy(ctx);
  unmake(&p);
}

/* ---- Refusals: fdt_run against fd_plan_create + fd_run, case by case ---- */

/* The problem a refusal case starts from: one the table's rows have when they can. */
enum { BASE_CAUSAL, BASE_MASK, BASE_FULL_FP8, BASE_E5M2, BASE_Q4_0, N_BASES };

/* What one change to a valid problem does. */
enum { M_NONE, M_SHAPE_NULL, M_ARGS_NULL, M_SHAPE_INT, M_KV_LEN, M_ARG_NULL, M_SCALE, M_POS, M_ARG_SET, M_BEAM };

/* One change: kind, the field's offset (or the cur_pos index, -1 = the last), the value. */
typedef struct mutation { int kind; long off; int64_t i; float f; } mutation;
#define AT_KV_LEN INT64_MAX   /* an M_POS value: the shape's kv_len */

/* A refusal case: a name, its base, up to two changes (the first refused
   field must win); controls (ok = 1) must be refused by neither. */
typedef struct refusal { const char *name; int base, ok; mutation m[2]; } refusal;

#define SHAPE_INT(field, v) { M_SHAPE_INT, (long)offsetof(fdt_shape, field), v, 0 }
#define ARG_NULL(field) { M_ARG_NULL, (long)offsetof(fdt_args, field), 0, 0 }
#define ARG_SET(field) { M_ARG_SET, (long)offsetof(fdt_args, field), 0, 0 }   /* a pointer the run must not need */
#define KV_LEN(v) { M_KV_LEN, 0, v, 0 }
#define SCALE(v) { M_SCALE, 0, 0, v }
#define NO_CHANGE { M_NONE, 0, 0, 0 }
#define POS(index, v) { M_POS, index, v, 0 }
#define BEAM(index, v) { M_BEAM, index, v, 0 }   /* beam_src[index] = v (the base's entries are 0: valid) */

static const refusal REFUSALS[] = {
  { "valid causal problem (control)", BASE_CAUSAL, 1, { NO_CHANGE } },
  { "valid mask problem (control)", BASE_MASK, 1, { NO_CHANGE } },
  { "valid full fp8 problem (control)", BASE_FULL_FP8, 1, { NO_CHANGE } },
  { "valid fp8 e5m2 problem (control)", BASE_E5M2, 1, { NO_CHANGE } },
  { "scale 0.5 (control)", BASE_CAUSAL, 1, { SCALE(0.5f) } },
  { "cur_pos[last] kv_len - 1 (control)", BASE_CAUSAL, 1, { POS(-1, 39) } },
  { "shape NULL", BASE_CAUSAL, 0, { { M_SHAPE_NULL, 0, 0, 0 } } },
  { "batch 0", BASE_CAUSAL, 0, { SHAPE_INT(batch, 0) } },
  { "batch -3", BASE_MASK, 0, { SHAPE_INT(batch, -3) } },
  { "n_q_heads 0", BASE_CAUSAL, 0, { SHAPE_INT(n_q_heads, 0) } },
  { "n_kv_heads 0", BASE_CAUSAL, 0, { SHAPE_INT(n_kv_heads, 0) } },
  { "n_kv_heads -2", BASE_FULL_FP8, 0, { SHAPE_INT(n_kv_heads, -2) } },
  { "n_q_heads not a multiple of n_kv_heads", BASE_MASK, 0, { SHAPE_INT(n_q_heads, 7) } },
  { "head_dim 0", BASE_CAUSAL, 0, { SHAPE_INT(head_dim, 0) } },
  { "head_dim 1000", BASE_CAUSAL, 0, { SHAPE_INT(head_dim, 1000) } },
  { "kv_len 0", BASE_CAUSAL, 0, { KV_LEN(0) } },
  { "kv_len -5", BASE_FULL_FP8, 0, { KV_LEN(-5) } },
  { "q_dtype 3", BASE_CAUSAL, 0, { SHAPE_INT(q_dtype, 3) } },
  { "q_dtype -1", BASE_CAUSAL, 0, { SHAPE_INT(q_dtype, -1) } },
  { "kv_dtype 6 (one past FDT_FP8_E5M2)", BASE_MASK, 0, { SHAPE_INT(kv_dtype, FDT_FP8_E5M2 + 1) } },
  { "kv_dtype -1", BASE_E5M2, 0, { SHAPE_INT(kv_dtype, -1) } },
  { "out_dtype FDT_FP8_E5M2", BASE_E5M2, 0, { SHAPE_INT(out_dtype, FDT_FP8_E5M2) } },
  { "out_dtype 3", BASE_CAUSAL, 0, { SHAPE_INT(out_dtype, 3) } },
  { "mask_mode 3", BASE_CAUSAL, 0, { SHAPE_INT(mask_mode, 3) } },
  { "layout 3", BASE_CAUSAL, 0, { SHAPE_INT(layout, 3) } },
  { "layout paged, page_size 0", BASE_MASK, 0, { SHAPE_INT(layout, FDT_PAGED) } },
  { "layout paged, page_size 48", BASE_MASK, 0, { SHAPE_INT(layout, FDT_PAGED), SHAPE_INT(page_size, 48) } },
  { "q_len 17", BASE_CAUSAL, 0, { SHAPE_INT(q_len, 17) } },
  { "FD_SHARED_KV with causal positions", BASE_CAUSAL, 0, { SHAPE_INT(features, 8) } },
  { "features bit 64 (unknown)", BASE_MASK, 0, { SHAPE_INT(features, 64) } },
  { "FD_ALIBI in full mode", BASE_FULL_FP8, 0, { SHAPE_INT(features, 1) } },
  { "args.alibi_slopes NULL with FD_ALIBI", BASE_CAUSAL, 0, { SHAPE_INT(features, 1) } },
  { "FD_SINK_LOGITS with args.sink_logits (control)", BASE_CAUSAL, 1, { SHAPE_INT(features, 2) } },
  { "FD_SINK_LOGITS in mask mode (control)", BASE_MASK, 1, { SHAPE_INT(features, 2) } },
  { "args.sink_logits NULL with FD_SINK_LOGITS", BASE_CAUSAL, 0, { SHAPE_INT(features, 2), ARG_NULL(sink_logits) } },
  { "args.sink_logits NULL with FD_SINK_LOGITS (full fp8)", BASE_FULL_FP8, 0,
    { SHAPE_INT(features, 2), ARG_NULL(sink_logits) } },
  { "window 8 (control)", BASE_CAUSAL, 1, { SHAPE_INT(window, 8) } },
  { "window 8 with 3 sink tokens (control)", BASE_CAUSAL, 1, { SHAPE_INT(window, 8), SHAPE_INT(sink_tokens, 3) } },
  { "window 64 with 50 sink tokens (sinks past the cache: control)", BASE_E5M2, 1,
    { SHAPE_INT(window, 64), SHAPE_INT(sink_tokens, 50) } },
  { "window 1 with 50 sink tokens (more sinks than the window)", BASE_E5M2, 0,
    { SHAPE_INT(window, 1), SHAPE_INT(sink_tokens, 50) } },
  { "window -1", BASE_CAUSAL, 0, { SHAPE_INT(window, -1) } },
  { "sink_tokens -2 with a window", BASE_CAUSAL, 0, { SHAPE_INT(window, 4), SHAPE_INT(sink_tokens, -2) } },
  { "sink_tokens 4 without a window", BASE_CAUSAL, 0, { SHAPE_INT(sink_tokens, 4) } },
  { "window 16 in mask mode", BASE_MASK, 0, { SHAPE_INT(window, 16) } },
  { "window 16 in full mode", BASE_FULL_FP8, 0, { SHAPE_INT(window, 16) } },
  { "order: shape.window -1 before shape.sink_tokens -1", BASE_CAUSAL, 0,
    { SHAPE_INT(sink_tokens, -1), SHAPE_INT(window, -1) } },
  { "order: shape.sink_tokens before args.cur_pos", BASE_CAUSAL, 0, { POS(0, -1), SHAPE_INT(sink_tokens, 2) } },
  { "order: args.alibi_slopes before args.sink_logits", BASE_CAUSAL, 0,
    { SHAPE_INT(features, 3), ARG_NULL(sink_logits) } },
  { "window with cur_pos[last] kv_len", BASE_CAUSAL, 0, { SHAPE_INT(window, 8), POS(-1, AT_KV_LEN) } },
  { "q_len 4 with cur_pos[0] 2 (token 0 before position 0)", BASE_CAUSAL, 0, { SHAPE_INT(q_len, 4), POS(0, 2) } },
  { "causal kv_len 2^31 + 1", BASE_CAUSAL, 0, { KV_LEN(((int64_t)1 << 31) + 1) } },
  { "kv_len 2^60", BASE_FULL_FP8, 0, { KV_LEN((int64_t)1 << 60) } },
  { "kv_len 2^47 + 1 (above the largest bucket)", BASE_FULL_FP8, 0, { KV_LEN(((int64_t)1 << 47) + 1) } },
  { "batch 2^20 x kv_len 2^40 (more than 2^63 bytes)", BASE_FULL_FP8, 0,
    { KV_LEN((int64_t)1 << 40), SHAPE_INT(batch, 1 << 20) } },
  { "batch x n_q_heads above INT_MAX", BASE_CAUSAL, 0, { SHAPE_INT(batch, 1 << 30) } },
  { "order: shape.kv_len (2^50) before shape.q_dtype", BASE_MASK, 0, { SHAPE_INT(q_dtype, 7), KV_LEN((int64_t)1 << 50) } },
  { "args NULL", BASE_CAUSAL, 0, { { M_ARGS_NULL, 0, 0, 0 } } },
  { "args.q NULL", BASE_CAUSAL, 0, { ARG_NULL(q) } },
  { "args.k NULL", BASE_MASK, 0, { ARG_NULL(k) } },
  { "args.v NULL", BASE_FULL_FP8, 0, { ARG_NULL(v) } },
  { "args.out NULL", BASE_CAUSAL, 0, { ARG_NULL(out) } },
  { "args.mask NULL in mask mode", BASE_MASK, 0, { ARG_NULL(mask) } },
  { "args.k_scale NULL with int8/fp8 K", BASE_MASK, 0, { ARG_NULL(k_scale) } },
  { "args.v_scale NULL with int8/fp8 V", BASE_FULL_FP8, 0, { ARG_NULL(v_scale) } },
  { "args.k_scale NULL with fp8 e5m2 K", BASE_E5M2, 0, { ARG_NULL(k_scale) } },
  { "args.v_scale NULL with fp8 e5m2 V", BASE_E5M2, 0, { ARG_NULL(v_scale) } },
  { "valid q4_0 blocks problem (control)", BASE_Q4_0, 1, { NO_CHANGE } },
  { "args.k_scale set with q4_0 blocks", BASE_Q4_0, 0, { ARG_SET(k_scale) } },
  { "args.v_scale set with q4_0 blocks", BASE_Q4_0, 0, { ARG_SET(v_scale) } },
  { "head_dim 48 with q4_0 blocks", BASE_Q4_0, 0, { SHAPE_INT(head_dim, 48) } },
  { "q_dtype FDT_Q8_0", BASE_Q4_0, 0, { SHAPE_INT(q_dtype, FDT_Q8_0) } },
  { "args.scale NaN", BASE_CAUSAL, 0, { SCALE(NAN) } },
  { "args.scale +Inf", BASE_CAUSAL, 0, { SCALE(INFINITY) } },
  { "args.scale -Inf", BASE_MASK, 0, { SCALE(-INFINITY) } },
  { "args.scale NaN (full fp8)", BASE_FULL_FP8, 0, { SCALE(NAN) } },
  { "args.cur_pos NULL", BASE_CAUSAL, 0, { ARG_NULL(cur_pos) } },
  { "args.cur_pos[0] -1", BASE_CAUSAL, 0, { POS(0, -1) } },
  { "args.cur_pos[last] kv_len", BASE_CAUSAL, 0, { POS(-1, AT_KV_LEN) } },
  { "args.cur_pos[last] INT32_MIN", BASE_CAUSAL, 0, { POS(-1, INT32_MIN) } },
  { "args.cur_pos[0] INT32_MAX", BASE_CAUSAL, 0, { POS(0, INT32_MAX) } },
  { "order: shape.batch before args NULL", BASE_CAUSAL, 0, { SHAPE_INT(batch, 0), { M_ARGS_NULL, 0, 0, 0 } } },
  { "order: args.q before args.scale", BASE_CAUSAL, 0, { SCALE(NAN), ARG_NULL(q) } },
  { "order: args.mask before args.k_scale", BASE_MASK, 0, { ARG_NULL(k_scale), ARG_NULL(mask) } },
  { "order: args.scale before args.cur_pos", BASE_CAUSAL, 0, { POS(0, -1), SCALE(INFINITY) } },
  { "order: shape.head_dim before shape.kv_len", BASE_CAUSAL, 0, { KV_LEN(0), SHAPE_INT(head_dim, 0) } },
  { "FD_BEAMS (control)", BASE_CAUSAL, 1, { SHAPE_INT(features, 32) } },
  { "FD_BEAMS in mask mode (control)", BASE_MASK, 1, { SHAPE_INT(features, 32) } },
  { "FD_K_PER_CHANNEL with int8 K (control)", BASE_MASK, 1, { SHAPE_INT(features, 16) } },
  { "FD_K_PER_CHANNEL and FD_BEAMS (control)", BASE_MASK, 1, { SHAPE_INT(features, 48) } },
  { "FD_K_PER_CHANNEL with q4_0 blocks", BASE_Q4_0, 0, { SHAPE_INT(features, 16) } },
  { "FD_BEAMS with FD_SHARED_KV", BASE_MASK, 0, { SHAPE_INT(features, 40) } },
  { "args.beam_src NULL with FD_BEAMS", BASE_CAUSAL, 0, { SHAPE_INT(features, 32), ARG_NULL(beam_src) } },
  { "args.beam_src[0] -1", BASE_CAUSAL, 0, { SHAPE_INT(features, 32), BEAM(0, -1) } },
  { "args.beam_src[0] 1000 (above the batch)", BASE_MASK, 0, { SHAPE_INT(features, 32), BEAM(0, 1000) } },
  { "args.k_scale NULL with FD_K_PER_CHANNEL", BASE_MASK, 0, { SHAPE_INT(features, 16), ARG_NULL(k_scale) } },
  { "order: args.sink_logits before args.beam_src", BASE_CAUSAL, 0,
    { SHAPE_INT(features, 34), ARG_NULL(sink_logits) } },
};

/* Does table row r have what base kind needs? */
static int row_is(const fdt_row *r, int kind) {
  if (kind == BASE_CAUSAL) return r->mask_mode == FDT_CAUSAL;
  if (kind == BASE_MASK) return r->mask_mode == FDT_MASK && fdt_dtype_quant[r->kv_dtype];
  if (kind == BASE_E5M2) return r->kv_dtype == FDT_FP8_E5M2;
  if (kind == BASE_Q4_0) return r->kv_dtype == FDT_Q4_0;
  return r->mask_mode == FDT_FULL && fdt_dtype_quant[r->kv_dtype];
}

/* The base shape of a kind: the first table row of that kind (a shape this
   header runs), else a small synthetic one. */
static fdt_shape base_shape(int kind) {
  static const fdt_shape SYNTH[N_BASES] = {
    { .batch = 2, .n_q_heads = 4, .n_kv_heads = 2, .head_dim = 64, .kv_len = 40, .q_dtype = FDT_F32, .kv_dtype = FDT_F16, .out_dtype = FDT_F32, .mask_mode = FDT_CAUSAL, .layout = FDT_BHSD },
    { .batch = 2, .n_q_heads = 8, .n_kv_heads = 2, .head_dim = 32, .kv_len = 40, .q_dtype = FDT_BF16, .kv_dtype = FDT_I8, .out_dtype = FDT_BF16, .mask_mode = FDT_MASK, .layout = FDT_BSHD },
    { .batch = 3, .n_q_heads = 6, .n_kv_heads = 3, .head_dim = 80, .kv_len = 40, .q_dtype = FDT_F16, .kv_dtype = FDT_FP8_E4M3, .out_dtype = FDT_F16, .mask_mode = FDT_FULL, .layout = FDT_BHSD },
    { .batch = 2, .n_q_heads = 8, .n_kv_heads = 2, .head_dim = 32, .kv_len = 40, .q_dtype = FDT_F32, .kv_dtype = FDT_FP8_E5M2, .out_dtype = FDT_BF16, .mask_mode = FDT_CAUSAL, .layout = FDT_BSHD },
    { .batch = 2, .n_q_heads = 8, .n_kv_heads = 2, .head_dim = 64, .kv_len = 40, .q_dtype = FDT_F16, .kv_dtype = FDT_Q4_0, .out_dtype = FDT_F32, .mask_mode = FDT_CAUSAL, .layout = FDT_BSHD },
  };
  for (int i = 0; i < FDT_N_ROWS; i++)
    if (row_is(&fdt_rows[i], kind)) {
      fdt_shape s = row_shape(&fdt_rows[i]);
      s.kv_len = 40;
      return s;
    }
  return SYNTH[kind];
}

/* Apply change m to shape s, arguments a (and their cur_pos), or to the NULL flags. */
static void mutate(const mutation *m, fdt_shape *s, fdt_args *a, int32_t *pos, int32_t *src, int *no_shape,
                   int *no_args) {
  switch (m->kind) {
  case M_SHAPE_NULL: *no_shape = 1; break;
  case M_ARGS_NULL: *no_args = 1; break;
  case M_SHAPE_INT: { int v = (int)m->i; memcpy((char *)s + m->off, &v, sizeof v); break; }
  case M_KV_LEN: s->kv_len = m->i; break;
  case M_ARG_NULL: memset((char *)a + m->off, 0, sizeof(void *)); break;
  case M_ARG_SET: { static float scales[1]; float *p = scales; memcpy((char *)a + m->off, &p, sizeof p); break; }
  case M_SCALE: a->scale = m->f; break;
  case M_POS: pos[m->off < 0 ? s->batch - 1 : m->off] = (int32_t)(m->i == AT_KV_LEN ? s->kv_len : m->i); break;
  case M_BEAM: src[m->off] = (int32_t)m->i; break;
  default: break;
  }
}

/* The field a message names: its leading run of [a-z_.]. */
static void field_of(const char *msg, char *out, size_t n) {
  size_t k = 0;
  while (msg && k + 1 < n && (islower((unsigned char)msg[k]) || msg[k] == '_' || msg[k] == '.')) { out[k] = msg[k]; k++; }
  out[k] = 0;
}

/* Fill out and lse with a sentinel byte. */
static void poison(prob *p) {
  memset(p->out, 0x5a, p->nq * fdt_dtype_size(p->s.out_dtype));
  memset(p->lse, 0x5a, p->nh * sizeof(float));
}

/* Are out and lse still all sentinel bytes? */
static int untouched(const prob *p) {
  const unsigned char *o = p->out, *l = (const unsigned char *)p->lse;
  for (size_t i = 0; i < p->nq * fdt_dtype_size(p->s.out_dtype); i++) if (o[i] != 0x5a) return 0;
  for (size_t i = 0; i < p->nh * sizeof(float); i++) if (l[i] != 0x5a) return 0;
  return 1;
}

/* The library's answer: fd_plan_create's refusal, else fd_run's; its message in msg. */
static int library_rc(fd_ctx *ctx, const fdt_shape *s, const fdt_args *a, char *msg, size_t n) {
  fd_shape fs = s ? to_fd_shape(s) : (fd_shape){ 0 };
  fd_args fa = a ? to_fd_args(a) : (fd_args){ 0 };
  fd_plan *plan = NULL;
  int rc = fd_plan_create(ctx, s ? &fs : NULL, &plan);
  if (!rc) rc = fd_run(plan, a ? &fa : NULL);
  snprintf(msg, n, "%s", rc ? fd_errmsg(ctx) : "");
  fd_plan_destroy(plan);
  return rc;
}

/* Does case r change the shape (so that its buffers no longer fit it)? */
static int changes_shape(const refusal *r) {
  for (int k = 0; k < 2; k++)
    if (r->m[k].kind == M_SHAPE_NULL || r->m[k].kind == M_SHAPE_INT || r->m[k].kind == M_KV_LEN) return 1;
  return 0;
}

/* What each side answered for one case. */
typedef struct answers {
  int frc, trc, vrc, f_clean, t_clean;   /* library, fdt_run, fdt_validate codes; out and lse untouched */
  char msg[1024];                        /* fd_errmsg */
  const char *why;                       /* fdt_validate's sentence */
} answers;

/* Compare the answers of case i: a control is refused by neither; a refusal
   gets the same code from all three, the same field named, nothing written. */
static void judge(int i, const answers *x) {
  const refusal *r = &REFUSALS[i];
  char what[1400], ff[64], tf[64];
  field_of(x->msg, ff, sizeof ff);
  field_of(x->why, tf, sizeof tf);
  if (r->ok) {
    snprintf(what, sizeof what, "%s: fd_plan_create + fd_run gives %d (%s), fdt_validate %d (%s)", r->name, x->frc, x->msg,
             x->vrc, x->why ? x->why : "");
    check(x->frc == 0 && x->vrc == 0, what, i);
    return;
  }
  snprintf(what, sizeof what, "%s: codes: fd_plan_create + fd_run %d, fdt_run %d, fdt_validate %d", r->name, x->frc, x->trc, x->vrc);
  check(x->frc != 0 && x->trc == x->frc && x->vrc == x->frc, what, i);
  snprintf(what, sizeof what, "%s: fields: library '%s' (%s), header '%s' (%s)", r->name, ff, x->msg, tf, x->why ? x->why : "(none)");
  check(ff[0] && !strcmp(ff, tf), what, i);
  snprintf(what, sizeof what, "%s: fdt_run wrote to out or lse", r->name);
  check(x->t_clean, what, i);
  snprintf(what, sizeof what, "%s: fd_run wrote to out or lse", r->name);
  check(x->f_clean, what, i);
}

/* One case: the base problem, its changes, then the header and the library
   on it. fdt_run gets real scratch only when the shape still fits the
   buffers (a header that wrongly accepts a shape then stops at FDT_ENOMEM
   instead of reading past them). */
static void refusal_case(fd_ctx *ctx, int i) {
  const refusal *r = &REFUSALS[i];
  printf("case %d: %s\n", i, r->name);   /* names the case if a wrong acceptance crashes */
  fflush(stdout);
  fdt_shape base = base_shape(r->base);
  prob p;
  make(&p, &base, base.kv_len, 500u + (uint32_t)i);
  fdt_shape s = p.s;
  float *logits = calloc((size_t)base.n_q_heads, sizeof(float));   /* learned sink logits 0: valid */
  int32_t *src = calloc((size_t)base.batch * (size_t)base.kv_len, sizeof(int32_t));   /* beams: every row row 0's */
  size_t nch = (size_t)base.batch * base.n_kv_heads * base.head_dim;
  float *kch = malloc(nch * sizeof(float));                        /* FD_K_PER_CHANNEL: [B, Hkv, D] */
  for (size_t c = 0; c < nch; c++) kch[c] = 0.004f + 0.001f * (float)(c % 3);
  fdt_args a = { p.q, p.k, p.v, p.pos, p.mask, p.ks, p.vs, p.table, 0, p.out, p.lse, NULL, logits, NULL, NULL, src };
  int no_shape = 0, no_args = 0;
  for (int k = 0; k < 2; k++) mutate(&r->m[k], &s, &a, p.pos, src, &no_shape, &no_args);
  if ((s.features & FD_K_PER_CHANNEL) && a.k_scale == p.ks) a.k_scale = kch;
  const fdt_shape *sp = no_shape ? NULL : &s;
  const fdt_args *ap = no_args ? NULL : &a;
  size_t n = changes_shape(r) ? 0 : fdt_scratch_bytes(&p.s);
  void *scratch = n ? malloc(n) : NULL;
  answers x = { 0 };
  poison(&p);
  x.trc = fdt_run(sp, ap, scratch, n, NULL, NULL);
  x.vrc = fdt_validate(sp, ap, &x.why);
  x.t_clean = untouched(&p);
  poison(&p);
  x.frc = library_rc(ctx, sp, ap, x.msg, sizeof x.msg);
  x.f_clean = untouched(&p);
  judge(i, &x);
  free(scratch);
  free(logits); free(src); free(kch);
  unmake(&p);
}

/* FD_K_PER_CHANNEL and FD_BEAMS (and both): the header accepts the shape as
   the library plans it; a row serves it only with the kernels of its feature
   digits (fdgen export --features), else fdt_scratch_bytes is 0. */
static void header_features(fd_ctx *ctx) {
  static const unsigned BITS[3] = { 16, 32, 48 };
  for (int i = 0; i < 3; i++) {
    fdt_shape s = base_shape(BASE_MASK);
    s.features = BITS[i];
    const char *why = NULL;
    fd_shape fs = to_fd_shape(&s);
    fd_plan *plan = NULL;
    int hrc = fdt_check_shape(&s, &why), lrc = fd_plan_create(ctx, &fs, &plan);
    const fdt_row *r = fdt_lookup(&s, s.kv_len);
    int carried = r && fdt_kernel(r, &s, 0) != NULL;
    char what[600];
    snprintf(what, sizeof what, "features %u: header %d (%s), library plan %d (%s), kernels carried %d, scratch %zu",
             BITS[i], hrc, why ? why : "", lrc, lrc ? fd_errmsg(ctx) : "planned", carried, fdt_scratch_bytes(&s));
    check(hrc == FDT_OK && lrc == 0 && (r ? carried : fdt_scratch_bytes(&s) == 0), what, -1);
    fd_plan_destroy(plan);
  }
}

static int refusals(void) {
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2 });
  if (!ctx) { printf("FAIL - fd_create: %s\n", fd_errmsg(NULL)); return 1; }
  header_features(ctx);
  for (int i = 0; i < (int)(sizeof REFUSALS / sizeof REFUSALS[0]); i++) refusal_case(ctx, i);
  fd_destroy(ctx);
  printf("%d passed, %d failed\n", pass, fail);
  return fail != 0;
}

#ifdef FDT_INTERNAL
/* ---- Uneven batches: fdt_run against fd_run, item by item and bit for bit ---- */

/* libflashdecode's work items (runtime/exec.c; internal, from libfd_internal.a). */
int fd_exec_items(const fd_plan *p, const fd_args *a, const fd_item **items);

/* Batch row lengths of the uneven cases per 4096 keys of the row's bucket; pattern 1 mirrors them. */
static const int64_t UNEVEN[5] = { 1, 17, 300, 1000, 4096 };

/* Valid keys of batch row b (0..4) in pattern k for a row of bucket bk: at least 1. */
static int64_t uneven_len(int k, int b, int64_t bk) {
  int64_t x = UNEVEN[k ? 4 - b : b] * bk / 4096;
  return x < 1 ? 1 : x;
}

/* Valid keys of batch row b of problem p. */
static int64_t valid_len(const prob *p, int b) {
  return p->s.mask_mode == FDT_CAUSAL ? (int64_t)p->pos[b] + 1 : p->s.kv_len;
}

/* The first key a causal row of len keys visits past its sinks under the
   shape's window (docs/DESIGN.md: token 0 at len - q_len sees keys from
   len - q_len - window + 1; sinks that reach it make one range from 0). */
static int64_t window_start(const prob *p, int64_t len) {
  int64_t q = p->s.q_len > 1 ? p->s.q_len : 1, ws = len - q - p->s.window + 1;
  if (!p->s.window || ws <= p->s.sink_tokens) return 0;
  return ws;
}

/* Do items x[0..n) tile the visible keys of every (b, kv head) once, splits
   in order: [0, len), or with a window its sinks [0, sink_tokens) then
   [window start, len)? */
static int items_tile(const prob *p, const fd_item *x, int n) {
  int rows = p->s.batch * p->s.n_kv_heads, ok = 1;
  int64_t *next = calloc((size_t)rows, sizeof *next);
  int *split = calloc((size_t)rows, sizeof *split);
  for (int i = 0; i < n && ok; i++) {
    int r = x[i].b * p->s.n_kv_heads + x[i].j;
    int64_t ws = window_start(p, valid_len(p, x[i].b));
    if (ws > 0 && next[r] == (p->s.sink_tokens > 0 ? p->s.sink_tokens : 0) && split[r] == (p->s.sink_tokens > 0))
      next[r] = ws;                       /* past the sink split (or at the start): the window */
    ok = x[i].b >= 0 && x[i].b < p->s.batch && x[i].j >= 0 && x[i].j < p->s.n_kv_heads && x[i].s == split[r]++ &&
         x[i].begin == next[r] && x[i].end >= x[i].begin;
    if (ok) next[r] = x[i].end;
  }
  for (int r = 0; r < rows && ok; r++) ok = next[r] == valid_len(p, r / p->s.n_kv_heads);
  free(next); free(split);
  return ok;
}

/* Paged and windowed: set the block-table entry of every page that holds no
   key a row's tokens see to -1 (an engine frees them; neither executor may
   read them). */
static void free_pages(prob *p) {
  int64_t per_row = (p->s.kv_len + 63) / 64;
  for (int b = 0; p->s.layout == FDT_PAGED && p->s.window && b < p->s.batch; b++) {
    int64_t len = valid_len(p, b), ws = window_start(p, len);
    for (int64_t i = 0; i < per_row; i++) {
      int64_t lo = i * 64, hi = lo + 64;
      int seen = (lo < p->s.sink_tokens || ws == 0 || hi > ws) && lo < len;
      if (!seen) p->table[b * per_row + i] = -1;
    }
  }
}

/* Are the item lists x[0..nx) and y[0..ny) the same? why: the first difference. */
static int same_items(const fd_item *x, int nx, const fd_item *y, int ny, char *why, size_t n) {
  snprintf(why, n, "header %d items, exec.c %d", nx, ny);
  for (int i = 0; i < nx && i < ny; i++)
    if (x[i].b != y[i].b || x[i].j != y[i].j || x[i].s != y[i].s || x[i].begin != y[i].begin || x[i].end != y[i].end) {
      snprintf(why, n, "item %d: header (b %d, kv head %d, split %d, keys %lld..%lld), exec.c (b %d, kv head %d, "
               "split %d, keys %lld..%lld)", i, x[i].b, x[i].j, x[i].s, (long long)x[i].begin, (long long)x[i].end,
               y[i].b, y[i].j, y[i].s, (long long)y[i].begin, (long long)y[i].end);
      return 0;
    }
  return nx == ny && nx > 0;
}

/* Do the items give batch rows different split counts (the rule under test is exercised)? */
static int splits_vary(const prob *p, const fd_item *x, int n) {
  int most = 0, least = 1 << 30;
  for (int b = 0; b < p->s.batch; b++) {
    int c = 0;
    for (int i = 0; i < n; i++) c += x[i].b == b && x[i].j == 0;
    most = c > most ? c : most;
    least = c < least ? c : least;
  }
  return most > least;
}

/* The variants of an uneven case: plain, the logit softcap, learned sink
   logits; then the causal ones: ALiBi, a window with sink tokens, a window
   alone (window: 3/4 of the bucket, so that the longest row's visible keys
   stay in the row's bucket: the planner and fdt_lookup then pick that row);
   then, where the header carries their kernels (fdgen export --features),
   beams (every 7 keys the next batch row's cache), per-channel K scales
   (int8/fp8 rows) and both. Each variant's shape signs with tokens of its
   own (.softcap, .alibi, .w768, .k_per_channel, .beams): the table holds a
   row for it beside the plain one, with the same key. */
enum { V_PLAIN, V_SOFTCAP, V_SINK_LOGITS, V_ALIBI, V_WINDOW_SINKS, V_WINDOW, V_BEAMS, V_KPC, V_KPC_BEAMS, N_VARIANTS };
static const char *const VARIANT_NAMES[N_VARIANTS] = { "plain", "softcap 0.25", "sink logits", "ALiBi",
                                                       "window + 4 sinks", "window", "beams", "per-channel K",
                                                       "per-channel K + beams" };
/* The feature bits of variant v. */
static unsigned variant_features(int v) {
  return (v == V_BEAMS || v == V_KPC_BEAMS ? FD_BEAMS : 0u) | (v == V_KPC || v == V_KPC_BEAMS ? FD_K_PER_CHANNEL : 0u);
}

/* Does variant v apply to table row i: causal ones to causal rows; the
   feature ones where the header carries the row's kernels for them. */
static int variant_applies(int i, int v) {
  const fdt_row *row = &fdt_rows[i];
  if (v >= V_ALIBI && v <= V_WINDOW) return row->mask_mode == FDT_CAUSAL;
  if (v < V_BEAMS) return 1;
  fdt_shape s = row_shape(row);
  s.features = variant_features(v);
  return fdt_check_shape(&s, NULL) == FDT_OK && fdt_kernel(row, &s, 0) != NULL;
}

/* One uneven case (number c, data from seed): table row i, length pattern k,
   lse on or off, variant v (not plain: its out must differ from *plain, the
   plain run's out, which a plain case sets). */
static void uneven_case(fd_ctx *ctx, int c, uint32_t seed, int i, int k, int with_lse, int v, void **plain) {
  const fdt_row *row = &fdt_rows[i];
  fdt_shape s = row_shape(row);
  prob p;
  if (v == V_SOFTCAP) s.softcap = 0.25f;
  if (v == V_ALIBI) s.features |= FD_ALIBI;
  if (v == V_SINK_LOGITS) s.features |= FD_SINK_LOGITS;
  if (v == V_WINDOW_SINKS || v == V_WINDOW) s.window = (int)(row->bucket - row->bucket / 4);   /* keys stay in the bucket */
  if (v == V_WINDOW_SINKS) s.sink_tokens = 4;
  s.features |= variant_features(v);
  make(&p, &s, row->bucket, seed);
  size_t nsrc = (size_t)s.batch * (size_t)p.s.kv_len, nch = (size_t)s.batch * s.n_kv_heads * s.head_dim;
  int32_t *src = malloc(nsrc * sizeof(int32_t));
  float *kch = malloc(nch * sizeof(float));
  for (size_t e = 0; e < nsrc; e++) src[e] = (int32_t)((e / (size_t)p.s.kv_len + e % (size_t)p.s.kv_len / 7) % (size_t)s.batch);
  for (size_t e = 0; e < nch; e++) kch[e] = 0.002f + 0.0005f * (float)((e * 7 + e / (size_t)s.head_dim) % 11);
  float *slopes = malloc(sizeof(float) * (size_t)s.n_q_heads), *logits = malloc(sizeof(float) * (size_t)s.n_q_heads);
  for (int h = 0; h < s.n_q_heads; h++) slopes[h] = (float)exp2(-8.0 * (h + 1) / s.n_q_heads);
  for (int h = 0; h < s.n_q_heads; h++) logits[h] = h % 3 == 1 ? -INFINITY : (float)(h % 5) - 1.5f;   /* -inf: no sink */
  for (int b = 0; s.mask_mode == FDT_CAUSAL && b < s.batch; b++) {   /* at least q_len keys: every token sees one */
    int64_t len = uneven_len(k, b, row->bucket), least = s.q_len > 1 ? s.q_len : 1;
    p.pos[b] = (int32_t)((len > least ? len : least) - 1);
  }
  free_pages(&p);
  fdt_args ta = { p.q, p.k, p.v, p.pos, p.mask, (s.features & FD_K_PER_CHANNEL) ? kch : p.ks, p.vs, p.table, 0, p.out,
                  with_lse ? p.lse : NULL, v == V_ALIBI ? slopes : NULL, v == V_SINK_LOGITS ? logits : NULL, NULL, NULL,
                  (s.features & FD_BEAMS) ? src : NULL };
  fd_args fa = to_fd_args(&ta);
  fd_shape fs = to_fd_shape(&p.s);
  size_t n = fdt_scratch_bytes(&p.s), ob = p.nq * fdt_dtype_size(s.out_dtype);
  void *scratch = malloc(n), *hout = malloc(ob);
  float *hlse = malloc(p.nh * sizeof(float));
  const fd_item *hi = NULL, *li = NULL;
  fd_plan *plan = NULL;
  fd_plan_info info = { 0 };
  char why[512];
  printf("case %d: %s, %s lengths, lse %s, %s\n", c, row->name, k ? "mirrored" : "rising",
         with_lse ? "on" : "off", VARIANT_NAMES[v]);
  int nh = fdt_work_items(&p.s, &ta, scratch, n, &hi);
  int rc = fd_plan_create(ctx, &fs, &plan);
  if (!rc) rc = fd_plan_info_get(plan, row->bucket, &info);
  const fd_kernel_desc *want = fdt_kernel(row, &p.s, 0);   /* the row's key with the shape's feature digits */
  check(!rc && info.from_table && want && !strcmp(info.key, want->key), "the planner did not use the row's key", c);
  int nl = rc ? rc : fd_exec_items(plan, &fa, &li);
  check(same_items(hi, nh, li, nl, why, sizeof why), why, c);
  check(nh > 0 && items_tile(&p, hi, nh), "the header's items do not tile each row's keys once, in split order", c);
  check(row->splits < 2 || s.mask_mode != FDT_CAUSAL || (nh > 0 && splits_vary(&p, hi, nh)),
        "a split causal row gave every batch row the same split count", c);
  memset(p.lse, 0, p.nh * sizeof(float));
  int hrc = fdt_run(&p.s, &ta, scratch, n, NULL, NULL);
  memcpy(hout, p.out, ob);
  memcpy(hlse, p.lse, p.nh * sizeof(float));
  memset(p.out, 0, ob);
  memset(p.lse, 0, p.nh * sizeof(float));
  int lrc = rc ? rc : fd_run(plan, &fa);
  check(hrc == 0 && lrc == 0, "fdt_run or fd_run failed", c);
  check(!memcmp(hout, p.out, ob), "out differs between fdt_run and fd_run (bit for bit)", c);
  check(!memcmp(hlse, p.lse, p.nh * sizeof(float)), "lse differs between fdt_run and fd_run (bit for bit)", c);
  if (v == V_PLAIN) {
    free(*plain);
    *plain = malloc(ob);
    memcpy(*plain, hout, ob);
  } else {
    check(*plain && memcmp(*plain, hout, ob), "the variant left out as the plain run's", c);
  }
  fd_plan_destroy(plan);
  free(scratch); free(hout); free(hlse); free(slopes); free(logits); free(src); free(kch);
  unmake(&p);
}

/* Every table row of the header on uneven batches; causal rows in both patterns. */
static int uneven(const char *table) {
  fd_ctx *ctx = fd_create(&(fd_config){ .table = table });
  if (!ctx || fd_errmsg(ctx)[0]) { printf("FAIL - fd_create: %s\n", fd_errmsg(ctx)); fd_destroy(ctx); return 1; }
  int c = 0;
  uint32_t seed = 900;
  void *plain = NULL;
  for (int i = 0; i < FDT_N_ROWS; i++)   /* the plain rows; their variants run on the variants' rows */
    for (int k = 0; k < (fdt_rows[i].mask_mode == FDT_CAUSAL ? 2 : 1) * !(fdt_rows[i].window || fdt_rows[i].softcap ||
                                                                        fdt_rows[i].features); k++)
      for (int with_lse = 0; with_lse < 2; with_lse++, seed++)
        for (int v = 0; v < N_VARIANTS; v++)
          if (variant_applies(i, v)) uneven_case(ctx, c++, seed, i, k, with_lse, v, &plain);
  free(plain);
  fd_destroy(ctx);
  printf("%d passed, %d failed\n", pass, fail);
  return fail != 0 || c == 0;
}
#endif

int main(int argc, char **argv) {
  if (argc == 2 && !strcmp(argv[1], "--refusals")) return refusals();
#ifdef FDT_INTERNAL
  if (argc == 3 && !strcmp(argv[1], "--uneven")) return uneven(argv[2]);
#endif
  if (argc != 3) { fprintf(stderr, "usage: %s TABLE AOT_OUT | --refusals\n", argv[0]); return 2; }
  FILE *f = fopen(argv[2], "rb");
  if (!f) { perror(argv[2]); return 1; }
  for (int i = 0; i < n_cases(); i++) jit_case(i, argv[1], f);
  fclose(f);
  printf("%d passed, %d failed\n", pass, fail);
  return fail != 0;
}
#endif
