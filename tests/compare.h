/* Output checks shared by the C tests. */
#ifndef FD_TEST_COMPARE_H
#define FD_TEST_COMPARE_H
#include "kexec.h"

/* Largest |x| of a double array. */
double max_abs_d(const double *x, size_t n);
/* Allowed error relative to output scale for a problem's dtypes. */
double t_tolerance(const kproblem *p);
/* Check out/lse against the reference (records checks); returns the max relative error. */
double t_compare(const kproblem *p, const float *out, const float *lse, const double *rout,
                 const double *rlse, int check_lse, const char *name);
#endif
