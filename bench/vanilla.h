/* The vanilla baseline: unfused decode attention in plain C (scores = q K^T
   over the whole valid length into a buffer, softmax, then P V), one pass over
   K and V per QUERY head, parallel over (b, h) with OpenMP. What a user writes
   before reaching for a fused kernel. Takes the library's fd_shape / fd_args. */
#ifndef FDB_VANILLA_H
#define FDB_VANILLA_H
#include <stddef.h>
#include "flashdecode.h"

/* Bytes of the scores buffer fdb_vanilla needs: B * Hq * kv_len floats. */
size_t fdb_vanilla_scores_bytes(const fd_shape *s);

/* out (and lse when non-NULL) for the shape; q/out dtypes f32/f16/bf16, KV
   those, int8 with per-row scales (k_scale, v_scale) and q8_0/q4_0; layouts BHSD
   and BSHD, mask modes causal/mask/full, scale 0 = 1/sqrt(D). threads 0 = all.
   A row with no valid key gives out 0 and lse -inf. Returns 0, or -1 for an
   unsupported shape (other dtypes, paged layout, head_dim > 1024). */
int fdb_vanilla(const fd_shape *s, const fd_args *a, int threads, float *scores);

#endif
