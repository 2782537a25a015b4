/* Deterministic, position-addressed decode problems; see fdmpi_data.h. */
#include "fdmpi_data.h"
#include "ref.h"
#include <math.h>

enum { T_Q = 1, T_K, T_V, T_MASK };

/* The splitmix64 finalizer. */
static uint64_t mix(uint64_t h) {
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

/* A 64-bit hash of (seed, tensor, b, head, key, d). */
static uint64_t element_hash(uint64_t seed, int tensor, int64_t b, int64_t h, int64_t key, int64_t d) {
  uint64_t x = mix(seed + 0x9e3779b97f4a7c15ull * (uint64_t)tensor);
  x = mix(x ^ (uint64_t)b);
  x = mix(x ^ (uint64_t)h * 0x100000001b3ull);
  x = mix(x ^ (uint64_t)key);
  return mix(x ^ (uint64_t)d * 0xc2b2ae3d27d4eb4full);
}

/* Uniform in [-1, 1) from a hash. */
static float unit(uint64_t h) { return (float)((double)(h >> 40) * 0x1p-23 - 1.0); }

/* See fdmpi_data.h. */
void fdd_fill_q(const fd_shape *s, uint64_t seed, void *q, float *qf) {
  int64_t i = 0;
  for (int b = 0; b < s->batch; b++)
    for (int h = 0; h < s->n_q_heads; h++)
      for (int d = 0; d < s->head_dim; d++, i++) {
        float x = t_store(s->q_dtype, q, (size_t)i, unit(element_hash(seed, T_Q, b, h, 0, d)));
        if (qf) qf[i] = x;
      }
}

/* See fdmpi_data.h. */
void fdd_fill_kv(const fd_shape *s, uint64_t seed, const int64_t *key0, const int64_t *n, void *k, void *v,
                 float *kf, float *vf) {
  ref_problem geo = { .B = s->batch, .Hkv = s->n_kv_heads, .D = s->head_dim, .S = s->kv_len, .layout = s->layout };
  for (int b = 0; b < s->batch; b++)
    for (int j = 0; j < s->n_kv_heads; j++)
      for (int64_t i = 0; i < n[b]; i++) {
        int64_t at = ref_kv_offset(&geo, b, j, i);
        for (int d = 0; d < s->head_dim; d++) {
          float x = t_store(s->kv_dtype, k, (size_t)(at + d), unit(element_hash(seed, T_K, b, j, key0[b] + i, d)));
          float y = t_store(s->kv_dtype, v, (size_t)(at + d), unit(element_hash(seed, T_V, b, j, key0[b] + i, d)));
          if (kf) kf[at + d] = x;
          if (vf) vf[at + d] = y;
        }
      }
}

/* See fdmpi_data.h. */
void fdd_fill_mask(const fd_shape *s, uint64_t seed, const int64_t *key0, const int64_t *n, float *mask) {
  for (int b = 0; b < s->batch; b++)
    for (int h = 0; h < s->n_q_heads; h++)
      for (int64_t i = 0; i < n[b]; i++) {
        int64_t key = key0[b] + i;
        uint64_t x = element_hash(seed, T_MASK, b, h, key, 0);
        int masked = x % 5 == 0 || (b == s->batch - 1 && key < FDD_MASKED_PREFIX);
        mask[((int64_t)b * s->n_q_heads + h) * s->kv_len + i] = masked ? -INFINITY : 2 * unit(mix(x));
      }
}
