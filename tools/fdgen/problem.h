/* Random decode-attention problems in every storage dtype, and how far an output is
   from the double-precision reference: `fdgen run` and the C tests use both. */
#ifndef FD_TOOL_PROBLEM_H
#define FD_TOOL_PROBLEM_H
#include "ref.h"

/* A problem with its storage buffers; ref holds the f32 values the reference sees. */
typedef struct kproblem {
  ref_problem ref;
  int q_dtype, kv_dtype, out_dtype;
  void *q, *k, *v;            /* storage dtype buffers */
  float *qf, *kf, *vf, *mask;
  float *k_scale, *v_scale;   /* int8/fp8 (e4m3, e5m2): one per K/V row, laid out as K without D */
  int32_t *cur_pos;
} kproblem;

/* Allocate and fill a random problem (seeded); mask mode gets some -inf entries. */
void kp_init(kproblem *p, int B, int Hq, int Hkv, int D, int64_t S, int q_dt, int kv_dt,
             int out_dt, int mask_mode, int layout, uint64_t seed);
void kp_free(kproblem *p);
/* Re-store q/k/v element values from qf/kf/vf after a test edits them. */
void kp_sync(kproblem *p);
/* Set kf/vf from the stored K/V codes (and row scales): tests that write codes directly. */
void kp_decode_kv(kproblem *p);

/* A problem's K/V rows in pages (FD_PAGED): pools of pool_pages pages of
   page_size rows for each kv head, and the block table [B][per_row]. */
typedef struct kp_pages {
  void *k, *v;
  float *k_scale, *v_scale;   /* row scales (int8/fp8), else unused */
  int32_t *table;             /* -1 for a page past its row's valid keys (never read) */
  int64_t pool_pages, per_row;
  int page_size;
} kp_pages;

/* Copy the valid K/V rows (and scales) of BHSD problem p (causal: cur_pos + 1
   keys a row, else all S) into pages of page_size rows in a shuffled pool
   order (seeded) with `spare` pool pages no row uses; every pool byte that
   holds no valid key is 0xff (a NaN for the float dtypes), so a read of the
   wrong page or slot shows. */
void kp_page(const kproblem *p, int page_size, int64_t spare, uint64_t seed, kp_pages *g);
void kp_pages_free(kp_pages *g);

/* Largest |x| of a double array. */
double max_abs_d(const double *x, size_t n);
/* Allowed error relative to output scale for a problem's dtypes. */
double t_tolerance(const kproblem *p);
/* Allowed lse error relative to max(1, |reference lse|). */
#define KP_LSE_TOL 1e-5

/* How far an output [B,Hq,D] (f32 values) and lse [B,Hq] are from the reference's. */
typedef struct kp_error {
  double out;                 /* max |out - ref| / max |ref| (1 when the reference is all 0) */
  double lse;                 /* max |lse - ref| / max(1, |ref|), INFINITY for a NaN; 0 without lse */
  int nan;                    /* out holds a NaN */
  int lse_inf;                /* lse and the reference disagree on which rows are -inf */
} kp_error;

/* Measure out (and lse unless NULL) against the reference rout, rlse. */
kp_error kp_errors(const kproblem *p, const float *out, const float *lse, const double *rout,
                   const double *rlse);
/* Whether e is within tolerance: out, no NaN, and the lse too when check_lse. */
int kp_error_ok(const kproblem *p, const kp_error *e, int check_lse);
#endif
