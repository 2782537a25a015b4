/* Output checks shared by the C tests (max_abs_d, t_tolerance and the error
   measure itself are tools/fdgen/problem.h's, which fdgen run uses too). */
#ifndef FD_TEST_COMPARE_H
#define FD_TEST_COMPARE_H
#include "kexec.h"
#include "flashdecode.h"

/* Check out/lse against the reference (records checks); returns the max relative error. */
double t_compare(const kproblem *p, const float *out, const float *lse, const double *rout,
                 const double *rlse, int check_lse, const char *name);
/* Check a run of q_len tokens per row (out [B, q_len, Hq, D], lse [B, q_len, Hq])
   token by token against reference(c, t, rout, rlse), p's reference of token t. */
void t_compare_tokens(const kproblem *p, int q_len, const void *out, const float *lse,
                      void (*reference)(const void *c, int t, double *rout, double *rlse), const void *c,
                      const char *name);
/* The KV dtypes with per-row scales (fd_dtype_quant: int8, fp8 e4m3, fp8 e5m2), in
   value order: how many, and the i-th of them, i taken modulo their count. */
int t_quant_count(void);
int t_quant_dtype(int i);
/* Plan shape s with opts o on ctx, run it once with a, destroy the plan;
   FD_OK or the failing call's code (its message in fd_errmsg(ctx)). */
int t_plan_run(fd_ctx *ctx, const fd_shape *s, const fd_plan_opts *o, const fd_args *a);
/* A copy of n bytes of src that ends where an inaccessible page begins (*map,
   *maplen: the mapping to munmap), so that a read past its end faults; NULL
   when the mapping fails. */
void *t_guarded(const void *src, size_t n, void **map, size_t *maplen);
#endif
