/* The vanilla (unfused) baseline; see vanilla.h. Dot products keep 16
   independent lanes so gcc -O3 vectorizes them without -ffast-math. */
#include "vanilla.h"
#include "dtype.h"
#include <math.h>
#include <omp.h>
#include <stdint.h>

#define LANES 16
#define MAX_D 1024

/* Identity "conversion" of an f32 element; an int8 code as a float (its row scale applied by the caller). */
static inline float f32_id(float x) { return x; }
static inline float i8_id(int8_t x) { return (float)x; }

/* dot_<name>: q . row; axpy_<name>: acc += p * row; rows stored as T, read via CONV. */
#define ROW_OPS(name, T, CONV)                                                   \
  static float dot_##name(const float *q, const T *k, int D) {                  \
    float acc[LANES] = {0}, s = 0;                                              \
    int d = 0;                                                                  \
    for (; d + LANES <= D; d += LANES)                                          \
      for (int l = 0; l < LANES; l++) acc[l] += q[d + l] * CONV(k[d + l]);      \
    for (; d < D; d++) s += q[d] * CONV(k[d]);                                  \
    for (int l = 0; l < LANES; l++) s += acc[l];                                \
    return s;                                                                   \
  }                                                                             \
  static void axpy_##name(float *acc, float p, const T *v, int D) {             \
    for (int d = 0; d < D; d++) acc[d] += p * CONV(v[d]);                       \
  }
ROW_OPS(f32, float, f32_id)
ROW_OPS(f16, uint16_t, fdb_f16_to_f32)
ROW_OPS(bf16, uint16_t, fdb_bf16_to_f32)
ROW_OPS(i8, int8_t, i8_id)

/* ggml's block rows (llama.cpp's q8_0 / q4_0 KV cache; sizes in dtype.h),
   decoded here on their own: an f16 scale then int8 codes (q8_0) or nibbles,
   element j low in byte j and j + 16 high, less 8 (q4_0). */

/* The 32 values of block blk of a row of kv dtype kd at r, into x. */
static void block_values(int kd, const uint8_t *r, int blk, float *x) {
  const uint8_t *b = r + (size_t)blk * fdb_block_bytes(kd);
  float d = fdb_f16_to_f32((uint16_t)(b[0] | b[1] << 8));
  for (int j = 0; j < FDB_QK; j++)
    x[j] = d * (float)(kd == FD_Q8_0 ? (int8_t)b[2 + j] : (j < FDB_QK / 2 ? b[2 + j] & 15 : b[2 + j - FDB_QK / 2] >> 4) - 8);
}

/* q . row and acc += p * row for a block row. */
static float dot_blocks(int kd, const float *q, const uint8_t *k, int D) {
  float x[FDB_QK], acc[FDB_QK] = {0}, s = 0;
  for (int blk = 0; blk < D / FDB_QK; blk++) {
    block_values(kd, k, blk, x);
    for (int j = 0; j < FDB_QK; j++) acc[j] += q[blk * FDB_QK + j] * x[j];
  }
  for (int j = 0; j < FDB_QK; j++) s += acc[j];
  return s;
}
static void axpy_blocks(int kd, float *acc, float p, const uint8_t *v, int D) {
  float x[FDB_QK];
  for (int blk = 0; blk < D / FDB_QK; blk++) {
    block_values(kd, v, blk, x);
    for (int j = 0; j < FDB_QK; j++) acc[blk * FDB_QK + j] += p * x[j];
  }
}

/* Byte offset of a block row at element offset o. */
static inline size_t block_off(int kd, int64_t o) { return (size_t)o / FDB_QK * fdb_block_bytes(kd); }

/* Element offset of K/V row (b, j, i) in the shape's layout. */
static inline int64_t row_off(const fd_shape *s, int b, int j, int64_t i) {
  if (s->layout == FD_BSHD) return (((int64_t)b * s->kv_len + i) * s->n_kv_heads + j) * s->head_dim;
  return (((int64_t)b * s->n_kv_heads + j) * s->kv_len + i) * s->head_dim;
}

/* Pass 1: scores[i] = scale * q . K[i] (+ mask) for the n valid keys. */
static void qk_pass(const fd_shape *s, const fd_args *a, int b, int j, const float *q,
                    float scale, const float *mask, int64_t n, float *sc) {
  int D = s->head_dim;
  for (int64_t i = 0; i < n; i++) {
    int64_t o = row_off(s, b, j, i);
    float x = s->kv_dtype >= FD_Q8_0  ? dot_blocks(s->kv_dtype, q, (const uint8_t *)a->k + block_off(s->kv_dtype, o), D)
              : s->kv_dtype == FD_I8  ? a->k_scale[o / D] * dot_i8(q, (const int8_t *)a->k + o, D)
              : s->kv_dtype == FD_F32 ? dot_f32(q, (const float *)a->k + o, D)
              : s->kv_dtype == FD_F16 ? dot_f16(q, (const uint16_t *)a->k + o, D)
                                      : dot_bf16(q, (const uint16_t *)a->k + o, D);
    sc[i] = scale * x + (mask ? mask[i] : 0.0f);
  }
}

/* Pass 2: softmax in place; returns the log-sum-exp (-inf when all masked). */
static float softmax_pass(float *sc, int64_t n) {
  float m = -INFINITY, l = 0;
  for (int64_t i = 0; i < n; i++) m = sc[i] > m ? sc[i] : m;
  if (m == -INFINITY) return -INFINITY;
  for (int64_t i = 0; i < n; i++) { sc[i] = expf(sc[i] - m); l += sc[i]; }
  float inv = 1.0f / l;
  for (int64_t i = 0; i < n; i++) sc[i] *= inv;
  return m + logf(l);
}

/* Pass 3: acc = sum_i p[i] V[i]. */
static void pv_pass(const fd_shape *s, const fd_args *a, int b, int j, const float *p,
                    int64_t n, float *acc) {
  int D = s->head_dim;
  for (int d = 0; d < D; d++) acc[d] = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t o = row_off(s, b, j, i);
    if (s->kv_dtype >= FD_Q8_0) axpy_blocks(s->kv_dtype, acc, p[i], (const uint8_t *)a->v + block_off(s->kv_dtype, o), D);
    else if (s->kv_dtype == FD_I8) axpy_i8(acc, p[i] * a->v_scale[o / D], (const int8_t *)a->v + o, D);
    else if (s->kv_dtype == FD_F32) axpy_f32(acc, p[i], (const float *)a->v + o, D);
    else if (s->kv_dtype == FD_F16) axpy_f16(acc, p[i], (const uint16_t *)a->v + o, D);
    else axpy_bf16(acc, p[i], (const uint16_t *)a->v + o, D);
  }
}

/* One (b, h): convert q, the three passes, store out and lse. */
static void one_head(const fd_shape *s, const fd_args *a, int b, int h, float scale, float *sc) {
  int D = s->head_dim, j = h / (s->n_q_heads / s->n_kv_heads);
  int64_t bh = (int64_t)b * s->n_q_heads + h, n = s->kv_len;
  float q[MAX_D], acc[MAX_D];
  if (s->mask_mode == FD_CAUSAL) n = a->cur_pos[b] + 1 < n ? a->cur_pos[b] + 1 : n;
  for (int d = 0; d < D; d++) q[d] = fdb_load(s->q_dtype, a->q, (size_t)(bh * D + d));
  const float *mask = s->mask_mode == FD_MASK ? a->mask + bh * s->kv_len : 0;
  qk_pass(s, a, b, j, q, scale, mask, n, sc);
  float lse = softmax_pass(sc, n);
  if (lse == -INFINITY) n = 0;
  pv_pass(s, a, b, j, sc, n, acc);
  for (int d = 0; d < D; d++) fdb_store(s->out_dtype, a->out, (size_t)(bh * D + d), acc[d]);
  if (a->lse) a->lse[bh] = lse;
}

size_t fdb_vanilla_scores_bytes(const fd_shape *s) {
  return (size_t)s->batch * (size_t)s->n_q_heads * (size_t)s->kv_len * sizeof(float);
}

int fdb_vanilla(const fd_shape *s, const fd_args *a, int threads, float *scores) {
  if (s->q_dtype > FD_BF16 || s->out_dtype > FD_BF16) return -1;
  if (s->kv_dtype > FD_BF16 && s->kv_dtype != FD_I8 && s->kv_dtype != FD_Q8_0 && s->kv_dtype != FD_Q4_0) return -1;
  if (s->kv_dtype == FD_I8 && (!a->k_scale || !a->v_scale || (s->features & FD_K_PER_CHANNEL))) return -1;
  if (s->kv_dtype >= FD_Q8_0 && s->head_dim % FDB_QK) return -1;
  if (s->layout > FD_BSHD || s->head_dim > MAX_D || s->head_dim < 1) return -1;
  if (s->n_kv_heads < 1 || s->n_q_heads % s->n_kv_heads) return -1;
  if (s->q_len > 1) return -1;                     /* one query token per row only */
  if (threads <= 0) threads = omp_get_max_threads();
  float scale = a->scale != 0 ? a->scale : 1.0f / sqrtf((float)s->head_dim);
  int nbh = s->batch * s->n_q_heads;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (int bh = 0; bh < nbh; bh++)
    one_head(s, a, bh / s->n_q_heads, bh % s->n_q_heads, scale, scores + (int64_t)bh * s->kv_len);
  return 0;
}
