/* A serial mini-executor for kernel tests: generates, JIT-compiles and calls
   kernels directly (no planner, no threads), with forced splits. */
#ifndef FD_TEST_KEXEC_H
#define FD_TEST_KEXEC_H
#include "fd_abi.h"
#include "ref.h"

/* A problem with its storage buffers; ref holds the f32 values the reference sees. */
typedef struct kproblem {
  ref_problem ref;
  int q_dtype, kv_dtype, out_dtype;
  void *q, *k, *v;            /* storage dtype buffers */
  float *qf, *kf, *vf, *mask;
  float *k_scale, *v_scale;   /* int8/fp8: one per K/V row, laid out as K without D */
  int32_t *cur_pos;
} kproblem;

/* Kernel choice for one run. */
typedef struct kconfig {
  int chunk, tile, splits;
  int shuffle;                /* merge partials in a shuffled split order */
  int lse;                    /* request lse */
  int isa;                    /* the key's isa digit */
} kconfig;

/* Allocate and fill a random problem (seeded); mask mode gets some -inf entries. */
void kp_init(kproblem *p, int B, int Hq, int Hkv, int D, int64_t S, int q_dt, int kv_dt,
             int out_dt, int mask_mode, int layout, uint64_t seed);
void kp_free(kproblem *p);
/* Re-store q/k/v element values from qf/kf/vf after a test edits them. */
void kp_sync(kproblem *p);
/* The descriptor of a key's kernel, generated and compiled once (NULL + message on error). */
const fd_kernel_desc *kx_kernel(const char *key, char *err, size_t errlen);
/* Run the problem with cfg into out [B,Hq,D] f32 values and lse [B,Hq]; -1 with err. */
int kx_run(const kproblem *p, const kconfig *cfg, float *out, float *lse, char *err, size_t errlen);
/* Free every compiled kernel. */
void kx_cleanup(void);
#endif
