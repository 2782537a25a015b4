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

/* A paged pool of a BHSD problem's K/V rows (and per-row scales when the
   problem has them): pool [pages, Hkv, page_size, row], and a block table. */
typedef struct kx_pool { void *k, *v; float *ks, *vs; int32_t *table; int64_t pages; } kx_pool;
/* Allocate pl for p: `pages` pool pages of page_size rows, a block table of
   table_len entries (filled by the caller). */
void kx_pool_alloc(kx_pool *pl, const kproblem *p, int64_t pages, int page_size, int64_t table_len);
/* Copy the keys [i * page_size, (i + 1) * page_size) of p's batch row b (every
   kv head, those below p's S) into pool page pg. */
void kx_pool_copy(kx_pool *pl, const kproblem *p, int b, int64_t i, int64_t pg, int page_size);
void kx_pool_free(kx_pool *pl);

/* Channel d's factor of the per-channel K tests: 1/30 .. 33 geometrically
   over D channels (1000x apart). */
float kx_channel_factor(int d, int D);
/* Re-quantize p's K (BHSD, the first S keys of each of nbj (batch, kv head)
   rows) with one scale per (row, kv head, channel): channel d scaled by
   kx_channel_factor, its largest |x| mapped to the dtype's largest code;
   kch [nbj, D] gets the scales, kf the stored values times them. */
void kx_per_channel(kproblem *p, int nbj, int64_t S, float *kch);

/* Whether position p sees key k: causal, within the last `window` keys (0:
   all) or one of the first `sinks`. */
int kx_visible(int64_t p, int64_t k, int window, int sinks);
/* The reference of token t of a case of q_len tokens: rt (K/V, S, beams, new
   keys as the case has them) with token t's q rows from qf [B, q_len, Hq, D];
   a causal rt as mask mode, 0 on the keys that position cur_pos[b] - q_len +
   1 + t sees (kx_visible) and -inf elsewhere; mask and full modes as they are. */
void kx_token_reference(ref_problem rt, const float *qf, const int32_t *cur_pos, int q_len, int t, int window,
                        int sinks, double *rout, double *rlse);
/* The isa digit of the present record with int8 dot products (MSD) of the
   highest rank, or -1 where this CPU has none. */
int kx_msd_isa(void);
/* The present isa digit without pair dot products of the highest rank: the
   one to force where a test needs an isa without them (AVX-512, else AVX2,
   else portable C 0). */
int kx_plain_isa(void);
#endif
