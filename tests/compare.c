/* Output checks shared by the C tests: kernel or API output against the reference. */
#include "compare.h"
#include "tcheck.h"
#include <math.h>

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

/* Compare kernel output with the reference: out within tolerance, lse within 1e-5 relative,
   identical -inf for rows with no valid key, never NaN. Returns the max relative error. */
double t_compare(const kproblem *p, const float *out, const float *lse, const double *rout,
                      const double *rlse, int check_lse, const char *name) {
  const ref_problem *r = &p->ref;
  size_t n = (size_t)r->B * r->Hq * r->D;
  double scale = max_abs_d(rout, n), err = 0;
  if (scale == 0) scale = 1;
  int nan = 0;
  for (size_t i = 0; i < n; i++) {
    if (isnan(out[i])) nan = 1;
    double e = fabs(out[i] - rout[i]) / scale;
    if (e > err) err = e;
  }
  t_check(!nan, "%s: no NaN in out", name);
  t_check(err <= t_tolerance(p), "%s: max error %.3g > tolerance %.3g", name, err, t_tolerance(p));
  if (!check_lse) return err;
  double lerr = 0;
  int lbad = 0;
  for (size_t i = 0; i < (size_t)r->B * r->Hq; i++) {
    if (isinf(rlse[i]) || isinf(lse[i])) { if (rlse[i] != lse[i]) lbad = 1; continue; }
    double e = fabs(lse[i] - rlse[i]) / fmax(1.0, fabs(rlse[i]));
    if (isnan(lse[i]) || e > lerr) lerr = isnan(lse[i]) ? INFINITY : e;
  }
  t_check(!lbad && lerr <= 1e-5, "%s: lse error %.3g%s", name, lerr, lbad ? " (-inf mismatch)" : "");
  return err;
}

