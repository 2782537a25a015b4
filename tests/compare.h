/* Output checks shared by the C tests (max_abs_d, t_tolerance and the error
   measure itself are tools/fdgen/problem.h's, which fdgen run uses too). */
#ifndef FD_TEST_COMPARE_H
#define FD_TEST_COMPARE_H
#include "kexec.h"

/* Check out/lse against the reference (records checks); returns the max relative error. */
double t_compare(const kproblem *p, const float *out, const float *lse, const double *rout,
                 const double *rlse, int check_lse, const char *name);
#endif
