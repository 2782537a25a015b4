/* A serial mini-executor for kernel tests: generates, JIT-compiles and calls
   kernels directly (no planner, no threads), with forced splits. */
#ifndef FD_TEST_KEXEC_H
#define FD_TEST_KEXEC_H
#include "fd_abi.h"
#include "problem.h"   /* tools/fdgen: kproblem, kp_init, the reference */

/* Kernel choice for one run. */
typedef struct kconfig {
  int chunk, tile, splits;
  int shuffle;                /* merge partials in a shuffled split order */
  int lse;                    /* request lse */
  int isa;                    /* the key's isa digit */
} kconfig;

/* The descriptor of a key's kernel, generated and compiled once (NULL + message on error). */
const fd_kernel_desc *kx_kernel(const char *key, char *err, size_t errlen);
/* Run the problem with cfg into out [B,Hq,D] f32 values and lse [B,Hq]; -1 with err. */
int kx_run(const kproblem *p, const kconfig *cfg, float *out, float *lse, char *err, size_t errlen);
/* Free every compiled kernel. */
void kx_cleanup(void);
#endif
