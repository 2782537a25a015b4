/* A GQA bf16 decode step through the installed library, checked against a
   double-precision loop. Build with pkg-config only:
     cc -O2 c_decode.c $(pkg-config --cflags --libs flashdecode) -o c_decode
   Prints the max error and exits 1 when it exceeds bf16 output rounding. */
#include <flashdecode.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { B = 1, HQ = 8, HKV = 2, D = 64, S = 300 };

/* f32 -> bf16, round to nearest even. */
static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* bf16 -> f32 (exact). */
static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Uniform in [-1, 1) from a small LCG, rounded to bf16. */
static uint16_t rnd(uint32_t *s) {
  *s = *s * 1664525u + 1013904223u;
  return to_bf16((float)((*s >> 8) / 8388608.0 - 1.0));
}

/* Causal attention of one query head over keys 0..pos, in double. */
static void reference(const uint16_t *q, const uint16_t *k, const uint16_t *v, int pos, double *out) {
  double s[S], m = -INFINITY, l = 0;
  for (int i = 0; i <= pos; i++) {
    double dot = 0;
    for (int d = 0; d < D; d++) dot += (double)from_bf16(q[d]) * from_bf16(k[(size_t)i * D + d]);
    s[i] = dot / sqrt((double)D);
    if (s[i] > m) m = s[i];
  }
  for (int d = 0; d < D; d++) out[d] = 0;
  for (int i = 0; i <= pos; i++) {
    double p = exp(s[i] - m);
    l += p;
    for (int d = 0; d < D; d++) out[d] += p * from_bf16(v[(size_t)i * D + d]);
  }
  for (int d = 0; d < D; d++) out[d] /= l;
}

int main(void) {
  static uint16_t q[B * HQ * D], k[B * HKV * S * D], v[B * HKV * S * D], out[B * HQ * D];
  uint32_t seed = 42;
  for (size_t i = 0; i < sizeof q / 2; i++) q[i] = rnd(&seed);
  for (size_t i = 0; i < sizeof k / 2; i++) { k[i] = rnd(&seed); v[i] = rnd(&seed); }
  int32_t cur_pos[B] = { S - 1 };

  fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2 });
  if (!ctx) { fprintf(stderr, "fd_create: %s\n", fd_errmsg(NULL)); return 1; }
  fd_shape shape = { .batch = B, .n_q_heads = HQ, .n_kv_heads = HKV, .head_dim = D, .kv_len = S,
                     .q_dtype = FD_BF16, .kv_dtype = FD_BF16, .out_dtype = FD_BF16,
                     .mask_mode = FD_CAUSAL, .layout = FD_BHSD };
  fd_plan *plan;
  if (fd_plan_create(ctx, &shape, &plan)) { fprintf(stderr, "plan: %s\n", fd_errmsg(ctx)); return 1; }
  fd_args args = { .q = q, .k = k, .v = v, .cur_pos = cur_pos, .out = out };
  if (fd_run(plan, &args)) { fprintf(stderr, "run: %s\n", fd_errmsg(ctx)); return 1; }

  double worst = 0, ref[D];
  for (int h = 0; h < HQ; h++) {
    int j = h / (HQ / HKV);
    reference(q + h * D, k + (size_t)j * S * D, v + (size_t)j * S * D, cur_pos[0], ref);
    for (int d = 0; d < D; d++) {
      double e = fabs(from_bf16(out[h * D + d]) - ref[d]) / (fabs(ref[d]) + 1e-3);
      if (e > worst) worst = e;
    }
  }
  fd_plan_destroy(plan);
  fd_destroy(ctx);
  printf("flashdecode %s: GQA bf16 decode, %d heads over %d keys, max relative error %.2e\n",
         FD_VERSION, HQ, S, worst);
  return worst < 1.0 / 128 ? 0 : 1;
}
