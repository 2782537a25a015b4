/* Cascade attention: a system prompt's K/V (the shared prefix) is read once
   for the whole batch with FD_SHARED_KV, each row's own continuation (its
   suffix) with a plain causal plan, and fd_merge_states joins the two
   partial results exactly. Checked against a double-precision loop over the
   concatenation [prefix, suffix]. Build with pkg-config only:
     cc -O2 cascade.c $(pkg-config --cflags --libs flashdecode) -lm -o cascade
   Prints the max error and exits 1 when it exceeds f32 rounding. */
#include <flashdecode.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum { B = 4, HQ = 8, HKV = 2, D = 64, P = 300, L = 100 };   /* P prefix keys, up to L suffix keys */

/* Uniform in [-1, 1) from a small LCG. */
static float rnd(uint32_t *s) {
  *s = *s * 1664525u + 1013904223u;
  return (float)((*s >> 8) / 8388608.0 - 1.0);
}

/* Attention of one query over n1 prefix keys then n2 suffix keys, in double. */
static void reference(const float *q, const float *k1, const float *v1, int n1, const float *k2, const float *v2, int n2,
                      double *out) {
  double s[P + L], m = -INFINITY, l = 0;
  for (int i = 0; i < n1 + n2; i++) {
    const float *k = i < n1 ? k1 + (size_t)i * D : k2 + (size_t)(i - n1) * D;
    double dot = 0;
    for (int d = 0; d < D; d++) dot += (double)q[d] * k[d];
    s[i] = dot / sqrt((double)D);
    if (s[i] > m) m = s[i];
  }
  for (int d = 0; d < D; d++) out[d] = 0;
  for (int i = 0; i < n1 + n2; i++) {
    const float *v = i < n1 ? v1 + (size_t)i * D : v2 + (size_t)(i - n1) * D;
    double p = exp(s[i] - m);
    l += p;
    for (int d = 0; d < D; d++) out[d] += p * v[d];
  }
  for (int d = 0; d < D; d++) out[d] /= l;
}

/* Plan and run one shape; 0 or prints why. */
static int attend(fd_ctx *ctx, const fd_shape *s, const fd_args *a) {
  fd_plan *plan;
  if (fd_plan_create(ctx, s, &plan) || fd_run(plan, a)) { fprintf(stderr, "flashdecode: %s\n", fd_errmsg(ctx)); return 1; }
  fd_plan_destroy(plan);
  return 0;
}

int main(void) {
  static float q[B * HQ * D], kp[HKV * P * D], vp[HKV * P * D], ks[B * HKV * L * D], vs[B * HKV * L * D];
  static float o1[B * HQ * D], o2[B * HQ * D], out[B * HQ * D], l1[B * HQ], l2[B * HQ], lse[B * HQ];
  uint32_t seed = 7;
  for (size_t i = 0; i < sizeof q / 4; i++) q[i] = rnd(&seed);
  for (size_t i = 0; i < sizeof kp / 4; i++) { kp[i] = rnd(&seed); vp[i] = rnd(&seed); }
  for (size_t i = 0; i < sizeof ks / 4; i++) { ks[i] = rnd(&seed); vs[i] = rnd(&seed); }
  int32_t pos[B] = { L - 1, 40, 7, 0 };              /* each row's last suffix key */

  fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2 });
  if (!ctx) { fprintf(stderr, "fd_create: %s\n", fd_errmsg(NULL)); return 1; }
  /* 1. the prefix, once for every row: K/V [1, HKV, P, D], full mode, lse kept */
  fd_shape prefix = { .batch = B, .n_q_heads = HQ, .n_kv_heads = HKV, .head_dim = D, .kv_len = P,
                      .q_dtype = FD_F32, .kv_dtype = FD_F32, .out_dtype = FD_F32, .mask_mode = FD_FULL,
                      .layout = FD_BHSD, .features = FD_SHARED_KV };
  fd_args a1 = { .q = q, .k = kp, .v = vp, .out = o1, .lse = l1 };
  /* 2. each row's suffix: K/V [B, HKV, L, D], causal up to pos[b] */
  fd_shape suffix = prefix;
  suffix.kv_len = L; suffix.mask_mode = FD_CAUSAL; suffix.features = 0;
  fd_args a2 = { .q = q, .k = ks, .v = vs, .cur_pos = pos, .out = o2, .lse = l2 };
  /* 3. the merge of the two partial states */
  const float *outs[2] = { o1, o2 }, *lses[2] = { l1, l2 };
  if (attend(ctx, &prefix, &a1) || attend(ctx, &suffix, &a2) ||
      fd_merge_states(2, outs, lses, B * HQ, D, out, lse)) { fd_destroy(ctx); return 1; }

  double worst = 0, ref[D];
  for (int b = 0; b < B; b++)
    for (int h = 0; h < HQ; h++) {
      int j = h / (HQ / HKV);
      reference(q + ((size_t)b * HQ + h) * D, kp + (size_t)j * P * D, vp + (size_t)j * P * D, P,
                ks + ((size_t)b * HKV + j) * L * D, vs + ((size_t)b * HKV + j) * L * D, pos[b] + 1, ref);
      for (int d = 0; d < D; d++) {
        double e = fabs(out[((size_t)b * HQ + h) * D + d] - ref[d]);
        if (e > worst) worst = e;
      }
    }
  fd_destroy(ctx);
  printf("cascade attention (shared prefix %d keys, suffixes up to %d, batch %d): max error %.3g\n", P, L, B, worst);
  return worst < 1e-5 ? 0 : 1;
}
