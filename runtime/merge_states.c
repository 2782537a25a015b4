/* fd_merge_states: the exact merge of partial attention results over disjoint
   key sets (cascade attention, context parallelism). Each state is a
   normalized out row and its lse; the merge weighs each by exp(lse_i - max). */
#include "internal.h"
#include <math.h>

/* Refuse bad arguments with a message naming the field; 0 when all are usable. */
static int merge_args_check(int n, const float *const outs[], const float *const lses[], int64_t rows,
                            int head_dim, const float *out) {
  if (n < 1) return fd_fail(NULL, FD_EINVAL, "fd_merge_states: n is %d; at least one state is needed", n);
  if (!outs) return fd_fail(NULL, FD_EINVAL, "fd_merge_states: outs is NULL");
  if (!lses) return fd_fail(NULL, FD_EINVAL, "fd_merge_states: lses is NULL");
  if (!out) return fd_fail(NULL, FD_EINVAL, "fd_merge_states: out is NULL");
  if (rows < 0) return fd_fail(NULL, FD_EINVAL, "fd_merge_states: rows is %lld; it must be >= 0", (long long)rows);
  if (head_dim < 1) return fd_fail(NULL, FD_EINVAL, "fd_merge_states: head_dim is %d; it must be >= 1", head_dim);
  for (int i = 0; i < n; i++) {
    if (!outs[i]) return fd_fail(NULL, FD_EINVAL, "fd_merge_states: outs[%d] is NULL", i);
    if (!lses[i]) return fd_fail(NULL, FD_EINVAL, "fd_merge_states: lses[%d] is NULL", i);
  }
  return 0;
}

/* The weight exp(lse - m) of a state against the largest lse m (a state at +inf
   weighs 1 when m is +inf; an empty state, lse -inf, weighs 0). */
static double state_weight(float lse, float m) {
  if (lse == -INFINITY) return 0;
  if (m == INFINITY) return lse == INFINITY;
  return exp((double)lse - m);
}

/* Merge one row: weights exp(lse_i - m) over the non-empty states (NaN propagates). */
static void merge_row(int n, const float *const outs[], const float *const lses[], int64_t r, int d_len,
                      float *out, float *lse) {
  float m = -INFINITY;
  int nan = 0;
  for (int i = 0; i < n; i++) {
    float x = lses[i][r];
    if (isnan(x)) nan = 1;
    else if (x > m) m = x;
  }
  float *o = out + r * d_len;
  if (nan || m == -INFINITY) {             /* NaN in, NaN out; all empty: out 0, lse -inf */
    for (int d = 0; d < d_len; d++) o[d] = nan ? NAN : 0.0f;
    if (lse) lse[r] = nan ? NAN : -INFINITY;
    return;
  }
  double l = 0;
  for (int i = 0; i < n; i++) l += state_weight(lses[i][r], m);
  for (int d = 0; d < d_len; d++) o[d] = 0;
  for (int i = 0; i < n; i++) {
    double w = state_weight(lses[i][r], m);
    if (w == 0) continue;                  /* an empty state is the identity */
    const float *x = outs[i] + r * d_len;
    float c = (float)(w / l);
    for (int d = 0; d < d_len; d++) o[d] += c * x[d];
  }
  if (lse) lse[r] = (float)(m + log(l));
}

/* See flashdecode.h. */
int fd_merge_states(int n, const float *const outs[], const float *const lses[], int64_t rows, int head_dim,
                    float *out, float *lse) {
  int rc = merge_args_check(n, outs, lses, rows, head_dim, out);
  if (rc) return rc;
  for (int64_t r = 0; r < rows; r++) merge_row(n, outs, lses, r, head_dim, out, lse);
  return 0;
}
