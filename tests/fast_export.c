/* The exported header's fast-precision kernels (tests/test_fast_export.sh):
   FDT_HEADER holds one row whose key has precision digit 1 (bf16 V, isa 3);
   fdt_run on random bf16 q/K/V (Hq 8 or HQ, Hkv 2, D 128, causal, rows of 1000,
   777 and 1 keys) against a double reference computed here, within
   FAST_TOL of the largest |output|; prints the error. Exit 0 on success. */
#include FDT_HEADER
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define B 3
#ifndef HQ
#define HQ 8      /* -DHQ=32: 16 query heads per kv head, the head-lane tile */
#endif
#define HKV 2
#define D 128
#define S 1024
#define FAST_TOL 8e-3

/* bf16 bits of x (round to nearest even) and back. */
static uint16_t to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
static double from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}

/* A uniform value in [-1, 1) from state s. */
static float rnd(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((*s >> 40) / (double)(1 << 24) * 2.0 - 1.0);
}

int main(void) {
  size_t nq = (size_t)B * HQ * D, nkv = (size_t)B * HKV * S * D;
  uint16_t *q = malloc(nq * 2), *k = malloc(nkv * 2), *v = malloc(nkv * 2);
  float *out = malloc(nq * 4);
  double *ref = malloc(nq * sizeof(double)), *w = malloc(S * sizeof(double));
  uint64_t seed = 12345;
  for (size_t i = 0; i < nq; i++) q[i] = to_bf16(rnd(&seed) * 2.0f);
  for (size_t i = 0; i < nkv; i++) { k[i] = to_bf16(rnd(&seed)); v[i] = to_bf16(rnd(&seed)); }
  int32_t pos[B] = { 999, 776, 0 };
  fdt_shape s = { .batch = B, .n_q_heads = HQ, .n_kv_heads = HKV, .head_dim = D, .kv_len = S, .q_dtype = FDT_BF16,
                  .kv_dtype = FDT_BF16, .out_dtype = FDT_F32, .mask_mode = FDT_CAUSAL, .layout = FDT_BHSD };
  size_t n = fdt_scratch_bytes(&s);
  void *scratch = malloc(n ? n : 1);
  fdt_args a = { .q = q, .k = k, .v = v, .cur_pos = pos, .out = out, .lse = NULL };
  int rc = n ? fdt_run(&s, &a, scratch, n, NULL, NULL) : -1;
  if (rc) { printf("FAIL - fdt_run: %d (scratch %zu)\n", rc, n); return 1; }
  const fdt_row *r = fdt_lookup(&s, S);
  double top = 0, err = 0;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < HQ; h++) {
      const uint16_t *qr = q + ((size_t)b * HQ + h) * D;
      const uint16_t *kb = k + ((size_t)b * HKV + h / (HQ / HKV)) * S * D, *vb = v + ((size_t)b * HKV + h / (HQ / HKV)) * S * D;
      double m = -INFINITY, l = 0;
      for (int j = 0; j <= pos[b]; j++) {
        double x = 0;
        for (int d = 0; d < D; d++) x += from_bf16(qr[d]) * from_bf16(kb[(size_t)j * D + d]);
        w[j] = x / sqrt((double)D);
        if (w[j] > m) m = w[j];
      }
      for (int j = 0; j <= pos[b]; j++) { w[j] = exp(w[j] - m); l += w[j]; }
      for (int d = 0; d < D; d++) {
        double o = 0;
        for (int j = 0; j <= pos[b]; j++) o += w[j] * from_bf16(vb[(size_t)j * D + d]);
        ref[((size_t)b * HQ + h) * D + d] = o / l;
        top = fmax(top, fabs(o / l));
      }
    }
  for (size_t i = 0; i < nq; i++) err = fmax(err, isnan(out[i]) ? INFINITY : fabs(out[i] - ref[i]));
  err /= top;
  printf("exported header, row key %s: fast-precision error %.3g of the largest |output| (tolerance %.3g)\n",
         r ? r->key : "(none)", err, FAST_TOL);
  int ok = r && strlen(r->key) == 21 && r->key[0] == '1' && err <= FAST_TOL && err > 1e-5;
  if (!ok) printf("FAIL - the row's key must carry precision 1 and the error lie in (1e-5, %.3g]\n", FAST_TOL);
  free(q); free(k); free(v); free(out); free(ref); free(w); free(scratch);
  return !ok;
}
