/* Deterministic decode problems for the MPI test and benchmark: every element is
   a function of (seed, tensor, indices), so a rank fills its own shard of the
   keys without generating the others, and any rank can rebuild the whole cache
   for a reference. Values are uniform in [-1, 1), stored in the shape's dtypes
   (f32, f16, bf16); the f32 copies hold the stored values. */
#ifndef FDMPI_DATA_H
#define FDMPI_DATA_H
#include "flashdecode.h"
#include <stdint.h>

/* Keys below this position of the last batch row are masked (-inf) in fdd_fill_mask. */
#define FDD_MASKED_PREFIX 16

/* q [B, Hq, D] in shape->q_dtype; qf [B, Hq, D] the stored values (NULL: not wanted). */
void fdd_fill_q(const fd_shape *s, uint64_t seed, void *q, float *qf);
/* K and V of row b's global keys key0[b] .. key0[b] + n[b] - 1 into slots 0 .. n[b] - 1 of
   buffers of capacity shape->kv_len in shape->layout and kv_dtype; kf/vf the stored values (or NULL). */
void fdd_fill_kv(const fd_shape *s, uint64_t seed, const int64_t *key0, const int64_t *n, void *k, void *v,
                 float *kf, float *vf);
/* The additive mask [B, Hq, kv_len] of the same keys: uniform in [-2, 2), -inf for about one key in five
   and for keys below FDD_MASKED_PREFIX of the last row. */
void fdd_fill_mask(const fd_shape *s, uint64_t seed, const int64_t *key0, const int64_t *n, float *mask);
#endif
