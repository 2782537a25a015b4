/* Random problems in every storage dtype and their error against the reference; see problem.h. */
#include "problem.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Allocate and fill a random problem. */
void kp_init(kproblem *p, int B, int Hq, int Hkv, int D, int64_t S, int q_dt, int kv_dt,
             int out_dt, int mask_mode, int layout, uint64_t seed) {
  memset(p, 0, sizeof *p);
  uint64_t st = seed * 0x9e3779b97f4a7c15ull + 1;
  size_t nq = (size_t)B * Hq * D, nkv = (size_t)B * Hkv * S * D;
  p->q_dtype = q_dt; p->kv_dtype = kv_dt; p->out_dtype = out_dt;
  p->qf = malloc(nq * 4); p->kf = malloc(nkv * 4); p->vf = malloc(nkv * 4);
  p->q = malloc(nq * t_dtype_size(q_dt));
  p->k = malloc(t_kv_bytes(kv_dt, nkv)); p->v = malloc(t_kv_bytes(kv_dt, nkv));
  p->cur_pos = malloc(sizeof(int32_t) * B);
  if (t_quant_max(kv_dt) > 0) { p->k_scale = malloc(4 * nkv / D); p->v_scale = malloc(4 * nkv / D); }
  for (size_t i = 0; i < nq; i++) p->qf[i] = t_rand(&st, -1, 1);
  for (size_t i = 0; i < nkv; i++) { p->kf[i] = t_rand(&st, -1, 1); p->vf[i] = t_rand(&st, -1, 1); }
  for (int b = 0; b < B; b++) p->cur_pos[b] = (int32_t)(b == 0 ? S - 1 : (int64_t)(t_rand(&st, 0, 1) * S) % S);
  if (mask_mode == 1) {
    size_t nm = (size_t)B * Hq * S;
    p->mask = malloc(nm * 4);
    for (size_t i = 0; i < nm; i++) {
      float r = t_rand(&st, 0, 1);
      p->mask[i] = r < 0.2f ? -INFINITY : t_rand(&st, -2, 2);
    }
  }
  ref_problem r = { B, Hq, Hkv, D, S, mask_mode, layout, p->qf, p->kf, p->vf, p->cur_pos, p->mask,
                    1.0 / sqrt((double)D) };
  p->ref = r;
  kp_sync(p);
}

/* Quantize one row of n values with a per-row scale: the row's largest |x| maps to
   t_quant_max (int8 127, e4m3 448, e5m2 57344). */
static void quantize_row(int dtype, void *buf, float *vals, size_t off, int n, float *scale) {
  float m = 0;
  for (int d = 0; d < n; d++) m = fmaxf(m, fabsf(vals[off + d]));
  *scale = m > 0 ? m / t_quant_max(dtype) : 1.0f;
  for (int d = 0; d < n; d++)
    vals[off + d] = t_store(dtype, buf, off + d, vals[off + d] / *scale) * *scale;
}

/* Round the f32 values to their storage dtypes (the reference then sees the stored values). */
void kp_sync(kproblem *p) {
  const ref_problem *r = &p->ref;
  size_t nq = (size_t)r->B * r->Hq * r->D, nkv = (size_t)r->B * r->Hkv * r->S * r->D;
  for (size_t i = 0; i < nq; i++) p->qf[i] = t_store(p->q_dtype, p->q, i, p->qf[i]);
  if (t_quant_max(p->kv_dtype) > 0) {
    for (size_t row = 0; row < nkv / r->D; row++) {
      quantize_row(p->kv_dtype, p->k, p->kf, row * r->D, r->D, &p->k_scale[row]);
      quantize_row(p->kv_dtype, p->v, p->vf, row * r->D, r->D, &p->v_scale[row]);
    }
    return;
  }
  if (t_block(p->kv_dtype) > 1) {
    for (size_t blk = 0; blk < nkv / 32; blk++) {
      t_store_block(p->kv_dtype, p->k, blk, p->kf + blk * 32);
      t_store_block(p->kv_dtype, p->v, blk, p->vf + blk * 32);
    }
    return;
  }
  for (size_t i = 0; i < nkv; i++) {
    p->kf[i] = t_store(p->kv_dtype, p->k, i, p->kf[i]);
    p->vf[i] = t_store(p->kv_dtype, p->v, i, p->vf[i]);
  }
}

/* The reference's K and V from the stored codes (tests that write codes directly). */
void kp_decode_kv(kproblem *p) {
  const ref_problem *r = &p->ref;
  size_t nkv = (size_t)r->B * r->Hkv * r->S * r->D;
  for (size_t i = 0; i < nkv; i++) {
    p->kf[i] = t_load(p->kv_dtype, p->k, i) * (p->k_scale ? p->k_scale[i / r->D] : 1.0f);
    p->vf[i] = t_load(p->kv_dtype, p->v, i) * (p->v_scale ? p->v_scale[i / r->D] : 1.0f);
  }
}

/* Free a problem's buffers. */
void kp_free(kproblem *p) {
  free(p->q); free(p->k); free(p->v); free(p->qf); free(p->kf); free(p->vf);
  free(p->mask); free(p->cur_pos); free(p->k_scale); free(p->v_scale);
}

/* Largest |x| of a double array (the output scale errors are relative to). */
double max_abs_d(const double *x, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) if (fabs(x[i]) > m) m = fabs(x[i]);
  return m;
}

/* Allowed error relative to output scale: 1e-5 for f32 KV, 2e-3 for f16/bf16 KV,
   plus one unit in the last place of a 16-bit output dtype. */
double t_tolerance(const kproblem *p) {
  double t = p->kv_dtype == 0 ? 1e-5 : 2e-3;
  if (p->out_dtype == 1) t += ldexp(1, -10);
  if (p->out_dtype == 2) t += ldexp(1, -7);
  return t;
}

/* Largest lse error of the rows; -inf rows must match exactly (sets *inf_bad otherwise). */
static double lse_error(size_t n, const float *lse, const double *rlse, int *inf_bad) {
  double err = 0;
  for (size_t i = 0; i < n; i++) {
    if (isinf(rlse[i]) || isinf(lse[i])) { if (rlse[i] != lse[i]) *inf_bad = 1; continue; }
    double e = fabs(lse[i] - rlse[i]) / fmax(1.0, fabs(rlse[i]));
    if (isnan(lse[i]) || e > err) err = isnan(lse[i]) ? INFINITY : e;
  }
  return err;
}

/* Output error relative to the reference's scale, NaN noted; then the lse error. */
kp_error kp_errors(const kproblem *p, const float *out, const float *lse, const double *rout,
                   const double *rlse) {
  const ref_problem *r = &p->ref;
  size_t n = (size_t)r->B * r->Hq * r->D;
  double scale = max_abs_d(rout, n);
  kp_error e = { 0, 0, 0, 0 };
  if (scale == 0) scale = 1;
  for (size_t i = 0; i < n; i++) {
    if (isnan(out[i])) e.nan = 1;
    e.out = fmax(e.out, fabs(out[i] - rout[i]) / scale);
  }
  if (lse) e.lse = lse_error((size_t)r->B * r->Hq, lse, rlse, &e.lse_inf);
  return e;
}

/* Within tolerance: out error, no NaN, and the lse when checked. */
int kp_error_ok(const kproblem *p, const kp_error *e, int check_lse) {
  int out_ok = !e->nan && e->out <= t_tolerance(p);
  return out_ok && (!check_lse || (!e->lse_inf && e->lse <= KP_LSE_TOL));
}

/* A random permutation of 0..n-1 (xorshift seeded). */
static int32_t *shuffled(int64_t n, uint64_t seed) {
  int32_t *a = malloc(sizeof(int32_t) * (size_t)n);
  for (int64_t i = 0; i < n; i++) a[i] = (int32_t)i;
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)(t_rand(&seed, 0, 1) * (float)(i + 1)) % (i + 1);
    int32_t t = a[i]; a[i] = a[j]; a[j] = t;
  }
  return a;
}

/* Copy p's valid rows into shuffled pages; see problem.h. */
void kp_page(const kproblem *p, int page_size, int64_t spare, uint64_t seed, kp_pages *g) {
  const ref_problem *r = &p->ref;
  size_t row = t_kv_bytes(p->kv_dtype, (size_t)r->D);
  g->page_size = page_size;
  g->per_row = (r->S + page_size - 1) / page_size;
  g->pool_pages = r->B * g->per_row + spare;
  size_t rows = (size_t)g->pool_pages * r->Hkv * page_size;
  g->k = malloc(rows * row); g->v = malloc(rows * row);
  g->k_scale = malloc(rows * 4); g->v_scale = malloc(rows * 4);
  memset(g->k, 0xff, rows * row); memset(g->v, 0xff, rows * row);
  memset(g->k_scale, 0xff, rows * 4); memset(g->v_scale, 0xff, rows * 4);
  g->table = malloc(sizeof(int32_t) * (size_t)r->B * (size_t)g->per_row);
  int32_t *perm = shuffled(g->pool_pages, seed);
  for (int b = 0; b < r->B; b++)
    for (int64_t pg = 0; pg < g->per_row; pg++)
      g->table[b * g->per_row + pg] = pg * page_size < ref_valid_keys(&p->ref, b) ? perm[b * g->per_row + pg] : -1;
  for (int b = 0; b < r->B; b++)
    for (int j = 0; j < r->Hkv; j++)
      for (int64_t s = 0; s < ref_valid_keys(&p->ref, b); s++) {
        int64_t dense = ((int64_t)b * r->Hkv + j) * r->S + s;
        int64_t pool = ((int64_t)g->table[b * g->per_row + s / page_size] * r->Hkv + j) * page_size + s % page_size;
        memcpy((char *)g->k + pool * row, (const char *)p->k + dense * row, row);
        memcpy((char *)g->v + pool * row, (const char *)p->v + dense * row, row);
        if (p->k_scale) { g->k_scale[pool] = p->k_scale[dense]; g->v_scale[pool] = p->v_scale[dense]; }
      }
  free(perm);
}

/* Free what kp_page allocated. */
void kp_pages_free(kp_pages *g) { free(g->k); free(g->v); free(g->k_scale); free(g->v_scale); free(g->table); }
