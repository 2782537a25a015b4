/* fd_merge_states against attention over the union of the key sets, in double:
   1, 2, 7 and 100 states in shuffled order, empty states, a logit of 200,
   NaN propagation, and every refusal (message naming the field, out untouched). */
#include "flashdecode.h"
#include "tcheck.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { D = 16, ROWS = 3, KEYS_PER_STATE = 5 };

/* Uniform in [-1, 1). */
static double urand(void) { return rand() / (RAND_MAX + 1.0) * 2 - 1; }

/* Softmax-weighted sum of values v[k][D] with scores s[k] over n keys, in double; lse returned. */
static double attend(int n, const double *s, const double (*v)[D], double *out) {
  double m = -INFINITY, l = 0;
  for (int i = 0; i < n; i++) m = s[i] > m ? s[i] : m;
  for (int d = 0; d < D; d++) out[d] = 0;
  if (n == 0) return -INFINITY;
  for (int i = 0; i < n; i++) {
    double p = exp(s[i] - m);
    l += p;
    for (int d = 0; d < D; d++) out[d] += p * v[i][d];
  }
  for (int d = 0; d < D; d++) out[d] /= l;
  return m + log(l);
}

/* n states over disjoint key sets (state i empty when empty_mask has bit i % 31), merged in a
   shuffled order, against attention over all keys; big puts one score at 200. */
static void merge_case(int n, unsigned empty_mask, int big, const char *name) {
  int total = n * KEYS_PER_STATE;
  double (*s)[ROWS] = calloc((size_t)total, sizeof *s);
  double (*v)[ROWS][D] = calloc((size_t)total, sizeof *v);
  float *outs = malloc(sizeof(float) * n * ROWS * D), *lses = malloc(sizeof(float) * n * ROWS);
  const float **op = malloc(sizeof(float *) * n), **lp = malloc(sizeof(float *) * n);
  int *order = malloc(sizeof(int) * n);
  for (int i = 0; i < n; i++) order[i] = i;
  for (int i = n - 1; i > 0; i--) { int j = rand() % (i + 1), t = order[i]; order[i] = order[j]; order[j] = t; }
  for (int k = 0; k < total; k++)
    for (int r = 0; r < ROWS; r++) {
      s[k][r] = 4 * urand();
      for (int d = 0; d < D; d++) v[k][r][d] = urand();
    }
  if (big) s[total / 2][0] = 200;
  double worst = 0, lse_err = 0;
  for (int r = 0; r < ROWS; r++)                 /* the partial state of each key set, in double */
    for (int i = 0; i < n; i++) {
      int empty = (empty_mask >> (i % 31)) & 1, c = 0;
      double ps[KEYS_PER_STATE], pv[KEYS_PER_STATE][D], part[D];
      for (int k = i * KEYS_PER_STATE; !empty && k < (i + 1) * KEYS_PER_STATE; k++, c++) {
        ps[c] = s[k][r];
        memcpy(pv[c], v[k][r], sizeof pv[c]);
      }
      lses[i * ROWS + r] = (float)attend(c, ps, (const double (*)[D])pv, part);
      for (int d = 0; d < D; d++) outs[(i * ROWS + r) * D + d] = (float)part[d];
    }
  for (int i = 0; i < n; i++) { op[i] = outs + order[i] * ROWS * D; lp[i] = lses + order[i] * ROWS; }
  float out[ROWS * D], lse[ROWS];
  int rc = fd_merge_states(n, op, lp, ROWS, D, out, lse);
  t_check(rc == 0, "%s: rc %d (%s)", name, rc, fd_errmsg(NULL));
  for (int r = 0; r < ROWS; r++) {                /* the reference over the union of non-empty sets */
    double sc[total], vv[total][D], ref[D];
    int used = 0;
    for (int i = 0; i < n; i++)
      if (!((empty_mask >> (i % 31)) & 1))
        for (int k = i * KEYS_PER_STATE; k < (i + 1) * KEYS_PER_STATE; k++) {
          sc[used] = s[k][r];
          memcpy(vv[used++], v[k][r], sizeof vv[0]);
        }
    double l = attend(used, sc, (const double (*)[D])vv, ref);
    if (used == 0) {
      int ok = lse[r] == -INFINITY;
      for (int d = 0; d < D; d++) ok &= out[r * D + d] == 0.0f;
      t_check(ok, "%s: all-empty row %d gives out 0, lse -inf (lse %g)", name, r, lse[r]);
      continue;
    }
    for (int d = 0; d < D; d++) worst = fmax(worst, fabs(out[r * D + d] - ref[d]));
    lse_err = fmax(lse_err, fabs(lse[r] - l) / fmax(1, fabs(l)));
  }
  t_check(worst < 2e-6 && lse_err < 2e-6 && !isnan(worst), "%s: max error %.3g, lse error %.3g", name, worst, lse_err);
  free(s); free(v); free(outs); free(lses); free(op); free(lp); free(order);
}

/* A NaN lse or out value in one state makes that row NaN, other rows exact. */
static void nan_case(void) {
  float a[2 * D], b[2 * D], la[2] = { 0.5f, NAN }, lb[2] = { 1.0f, 2.0f }, out[2 * D], lse[2];
  for (int d = 0; d < 2 * D; d++) { a[d] = 1; b[d] = 3; }
  const float *o[2] = { a, b }, *l[2] = { la, lb };
  int rc = fd_merge_states(2, o, l, 2, D, out, lse);
  double w = exp(0.5 - 1.0), want = (w * 1 + 3) / (w + 1);
  t_check(rc == 0 && fabs(out[0] - want) < 1e-6 && isnan(out[D]) && isnan(lse[1]) && !isnan(lse[0]),
          "NaN lse gives a NaN row only (rc %d, out %g want %g, row 1 %g)", rc, out[0], want, out[D]);
}

/* Each refusal names its field and leaves out untouched. */
static void refusals(void) {
  float a[D] = { 0 }, la[1] = { 0 }, out[D], lse[1];
  const float *o[1] = { a }, *l[1] = { la }, *onull[1] = { NULL };
  struct { int n; const float *const *o, *const *l; long long rows; int hd; float *out; const char *want; } c[] = {
    { 0, o, l, 1, D, out, "n is 0" },        { -1, o, l, 1, D, out, "n is -1" },
    { 1, NULL, l, 1, D, out, "outs is NULL" }, { 1, o, NULL, 1, D, out, "lses is NULL" },
    { 1, o, l, 1, D, NULL, "out is NULL" },  { 1, onull, l, 1, D, out, "outs[0] is NULL" },
    { 1, o, onull, 1, D, out, "lses[0] is NULL" }, { 1, o, l, 1, 0, out, "head_dim is 0" },
    { 1, o, l, -1, D, out, "rows is -1" },
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
    for (int d = 0; d < D; d++) out[d] = 7;
    int rc = fd_merge_states(c[i].n, c[i].o, c[i].l, c[i].rows, c[i].hd, c[i].out, lse);
    int untouched = 1;
    for (int d = 0; d < D; d++) untouched &= out[d] == 7;
    t_check(rc == FD_EINVAL && strstr(fd_errmsg(NULL), c[i].want) && untouched,
            "refusal '%s': rc %d, message '%s', out untouched %d", c[i].want, rc, fd_errmsg(NULL), untouched);
  }
}

int main(void) {
  srand(7);
  const int counts[] = { 1, 2, 7, 100 };
  for (size_t i = 0; i < 4; i++) {
    char name[64];
    snprintf(name, sizeof name, "%d states", counts[i]);
    merge_case(counts[i], 0, 0, name);
    snprintf(name, sizeof name, "%d states, a logit of 200", counts[i]);
    merge_case(counts[i], 0, 1, name);
    snprintf(name, sizeof name, "%d states, some empty", counts[i]);
    merge_case(counts[i], 0x12u, 0, name);
  }
  merge_case(3, 0x7fffffffu, 0, "3 states, all empty");
  merge_case(1, 1u, 0, "1 empty state");
  nan_case();
  refusals();
  return t_done();
}
