/* Output checks shared by the C tests: kernel or API output against the reference. */
#include "compare.h"
#include "fd_keydefs.h"
#include "tcheck.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Compare kernel output with the reference (kp_errors): out within tolerance, lse within
   KP_LSE_TOL relative, identical -inf for rows with no valid key, never NaN. Returns the
   max relative error. */
double t_compare(const kproblem *p, const float *out, const float *lse, const double *rout,
                 const double *rlse, int check_lse, const char *name) {
  kp_error e = kp_errors(p, out, check_lse ? lse : NULL, rout, rlse);
  t_check(!e.nan, "%s: no NaN in out", name);
  t_check(e.out <= t_tolerance(p), "%s: max error %.3g > tolerance %.3g", name, e.out, t_tolerance(p));
  if (check_lse)
    t_check(!e.lse_inf && e.lse <= KP_LSE_TOL, "%s: lse error %.3g%s", name, e.lse,
            e.lse_inf ? " (-inf mismatch)" : "");
  return e.out;
}

/* Check a run of q_len tokens per row (out [B, q_len, Hq, D] in p's out
   dtype, lse [B, q_len, Hq]) token by token against reference(c, t, ...):
   p's reference for token t, out [B, Hq, D] and lse [B, Hq] in double. */
void t_compare_tokens(const kproblem *p, int q_len, const void *out, const float *lse,
                      void (*reference)(const void *c, int t, double *rout, double *rlse), const void *c,
                      const char *name) {
  const ref_problem *r = &p->ref;
  size_t n = (size_t)r->B * r->Hq * r->D, qrow = (size_t)r->Hq * r->D;
  double *rout = malloc(n * sizeof(double)), *rlse = malloc(sizeof(double) * r->B * r->Hq);
  float *got = malloc(n * sizeof(float)), *glse = malloc(sizeof(float) * r->B * r->Hq);
  for (int t = 0; t < q_len; t++) {
    reference(c, t, rout, rlse);
    for (int b = 0; b < r->B; b++) {
      size_t at = (size_t)(b * q_len + t);
      for (size_t i = 0; i < qrow; i++) got[b * qrow + i] = t_load(p->out_dtype, out, at * qrow + i);
      memcpy(glse + (size_t)b * r->Hq, lse + at * r->Hq, sizeof(float) * r->Hq);
    }
    char tname[320];
    snprintf(tname, sizeof tname, "%s token %d", name, t);
    t_compare(p, got, glse, rout, rlse, 1, tname);
  }
  free(rout); free(rlse); free(got); free(glse);
}

/* How many KV dtypes carry per-row scales. */
int t_quant_count(void) {
  int n = 0;
  for (int d = 0; d < FD_DTYPE_COUNT; d++) n += fd_dtype_quant[d];
  return n;
}

/* The (i mod t_quant_count())-th KV dtype with per-row scales, in value order. */
int t_quant_dtype(int i) {
  int k = i % t_quant_count();
  for (int d = 0; d < FD_DTYPE_COUNT; d++)
    if (fd_dtype_quant[d] && k-- == 0) return d;
  return -1;
}

/* Plan s with o, run a once, destroy the plan; FD_OK or the failing call's code. */
int t_plan_run(fd_ctx *ctx, const fd_shape *s, const fd_plan_opts *o, const fd_args *a) {
  fd_plan *plan = NULL;
  int rc = fd_plan_create_opts(ctx, s, o, &plan);
  if (!rc) rc = fd_run(plan, a);
  fd_plan_destroy(plan);
  return rc;
}

void *t_guarded(const void *src, size_t n, void **map, size_t *maplen) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE), body = (n + pg - 1) / pg * pg;
  *maplen = body + pg;
  *map = mmap(NULL, *maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (*map == MAP_FAILED) return NULL;
  mprotect((char *)*map + body, pg, PROT_NONE);
  char *dst = (char *)*map + body - n;
  memcpy(dst, src, n);
  return dst;
}
