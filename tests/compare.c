/* Output checks shared by the C tests: kernel or API output against the reference. */
#include "compare.h"
#include "tcheck.h"

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
