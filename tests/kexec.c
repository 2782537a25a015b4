/* Serial mini-executor for the kernel tests; see kexec.h. */
#include "kexec.h"
#include "jit.h"
#include "cpu.h"
#include "internal.h"
#include "key.h"
#include "luagen.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_KERNELS 4096
static struct { char key[FD_KEY_BUFSZ]; const fd_kernel_desc *desc; fd_jit_unit *unit; } cache[MAX_KERNELS];
static int n_cached;
static fd_gen *gen;

/* The descriptor of a key's kernel, compiled once. */
const fd_kernel_desc *kx_kernel(const char *key, char *err, size_t errlen) {
  for (int i = 0; i < n_cached; i++) if (!strcmp(cache[i].key, key)) return cache[i].desc;
  if (!gen && !(gen = fd_gen_new(err, errlen))) return NULL;
  if (n_cached == MAX_KERNELS) { snprintf(err, errlen, "kernel cache full"); return NULL; }
  char *src, sym[64];
  if (fd_gen_source(gen, key, &src, err, errlen)) return NULL;
  snprintf(sym, sizeof sym, "fd_k%s_desc", key);
  void *addr;
  int rc = fd_jit_compile(src, sym, &cache[n_cached].unit, &addr, err, errlen);
  free(src);
  if (rc) return NULL;
  snprintf(cache[n_cached].key, FD_KEY_BUFSZ, "%s", key);
  cache[n_cached].desc = addr;
  return cache[n_cached++].desc;
}

/* Free every compiled kernel and the generator. */
void kx_cleanup(void) {
  for (int i = 0; i < n_cached; i++) fd_jit_free(cache[i].unit);
  n_cached = 0;
  fd_gen_free(gen);
  gen = NULL;
}

/* The key of a kernel for problem p with cfg and flags (the planner's encoder). */
static void key_for(const kproblem *p, const kconfig *cfg, int flags, char key[FD_KEY_BUFSZ]) {
  const ref_problem *r = &p->ref;
  fd_shape s = { r->B, r->Hq, r->Hkv, r->D, r->S, (fd_dtype)p->q_dtype, (fd_dtype)p->kv_dtype,
                 (fd_dtype)p->out_dtype, (fd_mask_mode)r->mask_mode, (fd_layout)r->layout, 0 };
  char err[128];
  if (fd_kernel_key(&s, cfg->chunk, cfg->tile, cfg->isa, flags, key, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    abort();
  }
}

/* Run problem p per (b, kv head), split into cfg->splits ranges and merged. */
int kx_run(const kproblem *p, const kconfig *cfg, float *out, float *lse, char *err, size_t errlen) {
  const ref_problem *r = &p->ref;
  int G = r->Hq / r->Hkv, S = cfg->splits;
  char key1[FD_KEY_BUFSZ], keys[FD_KEY_BUFSZ];
  key_for(p, cfg, cfg->lse ? 2 : 0, key1);
  key_for(p, cfg, 1, keys);
  const fd_kernel_desc *k1 = kx_kernel(key1, err, errlen);
  const fd_kernel_desc *ks = S > 1 ? kx_kernel(keys, err, errlen) : k1;
  if (!k1 || !ks) return -1;
  int rec = ks->state_floats;
  size_t osz = t_dtype_size(p->out_dtype);
  float *qbuf = malloc(sizeof(float) * G * r->D);
  float *part = malloc(sizeof(float) * (size_t)S * G * rec);
  float *shuf = malloc(sizeof(float) * (size_t)S * G * rec);
  void *obuf = malloc(osz * G * r->D);
  int *order = malloc(sizeof(int) * S);
  for (int b = 0; b < r->B; b++)
    for (int j = 0; j < r->Hkv; j++) {
      int64_t n = r->mask_mode == 0 ? (int64_t)r->cur_pos[b] + 1 : r->S;
      int64_t row0 = ref_kv_offset(r, b, j, 0);
      fd_work w = { 0 };
      w.q = (const char *)p->q + ((size_t)b * r->Hq + (size_t)j * G) * r->D * t_dtype_size(p->q_dtype);
      w.k = (const char *)p->k + t_kv_bytes(p->kv_dtype, (size_t)row0);
      w.v = (const char *)p->v + t_kv_bytes(p->kv_dtype, (size_t)row0);
      w.kv_stride = t_kv_units(p->kv_dtype, r->layout == 0 ? r->D : (int64_t)r->Hkv * r->D);
      if (p->k_scale) {
        w.k_scale = p->k_scale + row0 / r->D;
        w.v_scale = p->v_scale + row0 / r->D;
        w.scale_stride = r->layout == 0 ? 1 : r->Hkv;
      }
      w.mask = r->mask ? r->mask + ((int64_t)b * r->Hq + (int64_t)j * G) * r->S : NULL;
      w.mask_stride = r->S;
      w.n_heads = G; w.scale = (float)r->scale; w.qbuf = qbuf;
      w.q_len = 1; w.tok_heads = G;                      /* one query token */
      float *lrow = lse + (size_t)b * r->Hq + (size_t)j * G;
      if (S == 1) {
        w.begin = 0; w.end = n; w.state = part; w.out = obuf; w.lse = cfg->lse ? lrow : NULL;
        k1->run(&w);
      } else {
        for (int s = 0; s < S; s++) {
          w.begin = n * s / S; w.end = n * (s + 1) / S; w.state = part + (size_t)s * G * rec;
          ks->run(&w);
        }
        /* a shuffled order: a stride-7 walk when 7 is coprime to S, else reversed */
        for (int s = 0; s < S; s++) order[s] = !cfg->shuffle ? s : S % 7 ? (s * 7 + 3) % S : S - 1 - s;
        for (int s = 0; s < S; s++)
          memcpy(shuf + (size_t)s * G * rec, part + (size_t)order[s] * G * rec, sizeof(float) * G * rec);
        fd_merge_args m = { shuf, (fd_i64)G * rec, S, G, obuf, cfg->lse ? lrow : NULL, G, 0, 0 };
        ks->merge(&m);
      }
      for (int i = 0; i < G * r->D; i++)
        out[((size_t)b * r->Hq + (size_t)j * G) * r->D + i] = t_load(p->out_dtype, obuf, i);
    }
  free(qbuf); free(part); free(shuf); free(obuf); free(order);
  return 0;
}

/* Allocate a paged pool for p (tests/kexec.h). */
void kx_pool_alloc(kx_pool *pl, const kproblem *p, int64_t pages, int page_size, int64_t table_len) {
  size_t rowb = t_kv_bytes(p->kv_dtype, (size_t)p->ref.D), n = (size_t)pages * p->ref.Hkv * page_size;
  pl->pages = pages;
  pl->k = calloc(n, rowb);
  pl->v = calloc(n, rowb);
  pl->ks = p->k_scale ? calloc(n, sizeof(float)) : NULL;
  pl->vs = p->v_scale ? calloc(n, sizeof(float)) : NULL;
  pl->table = malloc(sizeof(int32_t) * (size_t)table_len);
}

/* Copy page i of p's batch row b into pool page pg (tests/kexec.h). */
void kx_pool_copy(kx_pool *pl, const kproblem *p, int b, int64_t i, int64_t pg, int page_size) {
  const ref_problem *r = &p->ref;
  size_t rowb = t_kv_bytes(p->kv_dtype, (size_t)r->D);
  for (int j = 0; j < r->Hkv; j++)
    for (int64_t s = 0; s < page_size && i * page_size + s < r->S; s++) {
      size_t from = (size_t)((b * r->Hkv + j) * r->S + i * page_size + s), to = (size_t)((pg * r->Hkv + j) * page_size + s);
      memcpy((char *)pl->k + to * rowb, (const char *)p->k + from * rowb, rowb);
      memcpy((char *)pl->v + to * rowb, (const char *)p->v + from * rowb, rowb);
      if (pl->ks) pl->ks[to] = p->k_scale[from];
      if (pl->vs) pl->vs[to] = p->v_scale[from];
    }
}

/* Free a pool (tests/kexec.h). */
void kx_pool_free(kx_pool *pl) { free(pl->k); free(pl->v); free(pl->ks); free(pl->vs); free(pl->table); }

/* Channel d's factor: 1/30 .. 33 geometrically over the channels (see kexec.h). */
float kx_channel_factor(int d, int D) { return (float)(pow(1000.0, (double)d / (D - 1)) / 30.0); }

/* Per-channel K scales for p's first S keys of nbj rows (see kexec.h). */
void kx_per_channel(kproblem *p, int nbj, int64_t S, float *kch) {
  int D = p->ref.D;
  int64_t stride = p->ref.S;
  for (int bj = 0; bj < nbj; bj++)
    for (int d = 0; d < D; d++) {
      float m = 0, f = kx_channel_factor(d, D), *sc = &kch[bj * D + d];
      for (int64_t i = 0; i < S; i++) m = fmaxf(m, fabsf(p->kf[((size_t)bj * stride + i) * D + d] * f));
      *sc = m / t_quant_max(p->kv_dtype);
      for (int64_t i = 0; i < S; i++) {
        size_t at = ((size_t)bj * stride + i) * D + d;
        p->kf[at] = t_store(p->kv_dtype, p->k, at, p->kf[at] * f / *sc) * *sc;
      }
    }
}

/* Whether position p sees key k (causal, window, sinks). */
int kx_visible(int64_t p, int64_t k, int window, int sinks) {
  return k <= p && (window == 0 || k > p - window || k < sinks);
}

/* The reference of token t (see kexec.h). */
void kx_token_reference(ref_problem rt, const float *qf, const int32_t *cur_pos, int q_len, int t, int window,
                        int sinks, double *rout, double *rlse) {
  size_t qrow = (size_t)rt.Hq * rt.D, mrow = (size_t)rt.Hq * (size_t)rt.S;
  float *q = malloc(sizeof(float) * (size_t)rt.B * qrow), *mask = NULL;
  for (int b = 0; b < rt.B; b++) memcpy(q + b * qrow, qf + (size_t)(b * q_len + t) * qrow, sizeof(float) * qrow);
  if (rt.mask_mode == FD_CAUSAL) {
    mask = malloc(sizeof(float) * (size_t)rt.B * mrow);
    for (int b = 0; b < rt.B; b++) {
      int64_t p = cur_pos[b] - q_len + 1 + t;
      for (int h = 0; h < rt.Hq; h++)
        for (int64_t k = 0; k < rt.S; k++)
          mask[b * mrow + (size_t)h * (size_t)rt.S + (size_t)k] = kx_visible(p, k, window, sinks) ? 0.0f : -INFINITY;
    }
    rt.mask = mask;
    rt.mask_mode = FD_MASK;
  }
  rt.q = q;
  ref_attention(&rt, rout, rlse);
  free(q); free(mask);
}

/* The present isa record without pair dot products (neither bf16 nor int8)
   of the highest rank: the CPU's best, stepped down its fallback chain past
   the records with them (AVX-512, else AVX2, else portable C 0). */
int kx_plain_isa(void) {
  int isa = fd_cpu_max_isa();
  while (fd_isa_table[isa].bf16 || fd_isa_table[isa].vnni) isa = fd_isa_table[isa].fallback;
  return isa;
}

/* The present isa record with int8 dot products of the highest rank, or -1. */
int kx_msd_isa(void) {
  int best = -1;
  for (int isa = 0; isa < FD_ISA_COUNT; isa++)
    if (fd_isa_table[isa].vnni && fd_cpu_has_isa(isa) && (best < 0 || fd_isa_table[isa].rank > fd_isa_table[best].rank))
      best = isa;
  return best;
}
