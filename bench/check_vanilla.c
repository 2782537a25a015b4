/* bench-check: the vanilla baseline against a double-precision loop on small
   problems (every dtype, mask mode, layout), the dtype conversions, and the
   streaming probe's coverage (each element read once) and refusals. */
#include "dtype.h"
#include "stream.h"
#include "util.h"
#include "vanilla.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int fails, checks;

/* Count a check; print it when it fails. */
static void expect(int ok, const char *what) {
  checks++;
  if (!ok) { fails++; fprintf(stderr, "FAIL: %s\n", what); }
}

/* Every f16 bit pattern against the compiler's _Float16 both ways. */
static void check_f16(void) {
  int bad = 0;
  for (uint32_t h = 0; h < 65536; h++) {
    _Float16 x; uint16_t hh = (uint16_t)h;
    memcpy(&x, &hh, 2);
    float f = fdb_f16_to_f32(hh), g = (float)x;
    if (!(f == g || (f != f && g != g))) bad++;
    if (f == f && fdb_f32_to_f16(f) != hh) bad++;
  }
  for (uint32_t u = 0; u < 0xffffffffu - 4093; u += 4093) {   /* f32 -> f16 rounding */
    float f = fdb_bitsf(u);
    _Float16 x = (_Float16)f; uint16_t ref, got = fdb_f32_to_f16(f);
    memcpy(&ref, &x, 2);
    if (f == f && got != ref) bad++;
  }
  expect(bad == 0, "f16 conversions match _Float16");
}

/* bf16: round to nearest even of sampled floats against a double computation. */
static void check_bf16(void) {
  int bad = 0;
  for (uint32_t u = 0; u < 0x7f7f0000u; u += 997) {
    float f = fdb_bitsf(u), back = fdb_bf16_to_f32(fdb_f32_to_bf16(f));
    float lo = fdb_bitsf(u & 0xffff0000u), hi = fdb_bitsf((u & 0xffff0000u) + 0x10000u);
    double dl = (double)f - lo, dh = (double)hi - f;
    float want = dl < dh ? lo : dh < dl ? hi : ((u >> 16) & 1 ? hi : lo);
    if (back != want) bad++;
  }
  expect(bad == 0, "bf16 rounding to nearest even");
}

/* Double-precision attention of one problem; out [B,Hq,D], lse [B,Hq]. */
static void ref(const fd_shape *s, const fd_args *a, double *out, double *lse) {
  int D = s->head_dim, G = s->n_q_heads / s->n_kv_heads;
  double scale = 1.0 / sqrt((double)D);
  for (int b = 0; b < s->batch; b++)
    for (int h = 0; h < s->n_q_heads; h++) {
      int j = h / G;
      int64_t bh = (int64_t)b * s->n_q_heads + h, n = s->kv_len;
      if (s->mask_mode == FD_CAUSAL) n = a->cur_pos[b] + 1;
      double *sc = malloc(sizeof(double) * (size_t)(n ? n : 1)), m = -INFINITY, l = 0;
      for (int64_t i = 0; i < n; i++) {
        int64_t o = s->layout == FD_BSHD ? ((b * s->kv_len + i) * s->n_kv_heads + j) * D
                                         : ((b * s->n_kv_heads + j) * s->kv_len + i) * D;
        double x = 0;
        for (int d = 0; d < D; d++)
          x += (double)fdb_load(s->q_dtype, a->q, (size_t)(bh * D + d)) * fdb_load(s->kv_dtype, a->k, (size_t)(o + d));
        sc[i] = x * scale + (s->mask_mode == FD_MASK ? a->mask[bh * s->kv_len + i] : 0);
        if (sc[i] > m) m = sc[i];
      }
      for (int d = 0; d < D; d++) out[bh * D + d] = 0;
      for (int64_t i = 0; i < n && m > -INFINITY; i++) {
        int64_t o = s->layout == FD_BSHD ? ((b * s->kv_len + i) * s->n_kv_heads + j) * D
                                         : ((b * s->n_kv_heads + j) * s->kv_len + i) * D;
        double p = exp(sc[i] - m);
        l += p;
        for (int d = 0; d < D; d++) out[bh * D + d] += p * fdb_load(s->kv_dtype, a->v, (size_t)(o + d));
      }
      for (int d = 0; d < D && l > 0; d++) out[bh * D + d] /= l;
      lse[bh] = l > 0 ? m + log(l) : -INFINITY;
      free(sc);
    }
}

/* Run one configuration through vanilla and the reference; compare. */
static void check_case(int B, int Hq, int Hkv, int D, int S, int qdt, int kvdt, int odt, int mm, int lay) {
  fd_shape s = { .batch = B, .n_q_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .kv_len = S, .q_dtype = qdt,
                 .kv_dtype = kvdt, .out_dtype = odt, .mask_mode = mm, .layout = lay };
  size_t nq = (size_t)B * Hq * D, nkv = (size_t)B * Hkv * S * D, nm = (size_t)B * Hq * S;
  void *q = malloc(nq * 4), *k = malloc(nkv * 4), *v = malloc(nkv * 4), *out = malloc(nq * 4);
  float *mask = malloc(nm * 4), *lse = malloc((size_t)B * Hq * 4), *sc = malloc(fdb_vanilla_scores_bytes(&s));
  int32_t cur[8];
  double *ro = malloc(nq * 8), *rl = malloc((size_t)B * Hq * 8);
  fdb_fill(q, nq, qdt, 1, -1, 1); fdb_fill(k, nkv, kvdt, 2, -1, 1); fdb_fill(v, nkv, kvdt, 3, -1, 1);
  fdb_fill(mask, nm, 0, 4, -2, 2);
  for (size_t i = 0; i < nm; i += 3) mask[i] = -INFINITY;
  for (int i = 0; i < S; i++) mask[i] = -INFINITY;           /* row (0,0) fully masked */
  for (int b = 0; b < B; b++) cur[b] = (b * 7 + 3) % S;
  cur[0] = 0;
  fd_args a = { .q = q, .k = k, .v = v, .cur_pos = cur, .mask = mask, .out = out, .lse = lse };
  expect(fdb_vanilla(&s, &a, 2, sc) == 0, "vanilla accepts the shape");
  ref(&s, &a, ro, rl);
  double tol = odt == 0 ? 1e-5 : odt == 1 ? 2e-3 : 1.6e-2, bad = 0;
  for (size_t i = 0; i < nq; i++) {
    double d = fabs(fdb_load(odt, out, i) - ro[i]);
    if (!(d <= tol * (1 + fabs(ro[i])))) bad++;
  }
  for (int i = 0; i < B * Hq; i++)
    if (!(rl[i] == lse[i] || fabs(rl[i] - lse[i]) <= 1e-4 * (1 + fabs(rl[i])))) bad++;
  char what[160];
  snprintf(what, sizeof what, "vanilla B%d Hq%d Hkv%d D%d S%d dtypes %d%d%d mask %d layout %d", B, Hq, Hkv, D, S,
           qdt, kvdt, odt, mm, lay);
  expect(bad == 0, what);
  free(q); free(k); free(v); free(out); free(mask); free(lse); free(sc); free(ro); free(rl);
}

/* int8 K/V with per-row scales: vanilla against the reference over the dequantized rows (f32). */
static void check_i8(int B, int Hq, int Hkv, int D, int S, int lay) {
  fd_shape s = {.batch = B, .n_q_heads = Hq, .n_kv_heads = Hkv, .head_dim = D, .kv_len = S, .q_dtype = FD_BF16,
                .kv_dtype = FD_I8, .out_dtype = FD_F32, .mask_mode = FD_CAUSAL, .layout = lay}, sf = s;
  size_t nq = (size_t)B * Hq * D, rows = (size_t)B * Hkv * S, nkv = rows * D;
  int8_t *k = malloc(nkv), *v = malloc(nkv);
  float *kf = malloc(nkv * 4), *vf = malloc(nkv * 4), *ks = malloc(rows * 4), *vs = malloc(rows * 4);
  void *q = malloc(nq * 4), *out = malloc(nq * 4);
  float *lse = malloc((size_t)B * Hq * 4), *sc = malloc(fdb_vanilla_scores_bytes(&s));
  double *ro = malloc(nq * 8), *rl = malloc((size_t)B * Hq * 8);
  int32_t cur[8];
  fdb_fill(q, nq, FD_BF16, 5, -1, 1);
  for (size_t r = 0; r < rows; r++) { ks[r] = 0.01f + 0.001f * (float)(r % 7); vs[r] = 0.02f - 0.001f * (float)(r % 5); }
  for (size_t i = 0; i < nkv; i++) {
    k[i] = (int8_t)((i * 37 + 11) % 255 - 127); v[i] = (int8_t)((i * 53 + 5) % 255 - 127);
    kf[i] = ks[i / (size_t)D] * k[i]; vf[i] = vs[i / (size_t)D] * v[i];
  }
  for (int b = 0; b < B; b++) cur[b] = (b * 5 + S - 1) % S;
  fd_args a = {.q = q, .k = k, .v = v, .cur_pos = cur, .k_scale = ks, .v_scale = vs, .out = out, .lse = lse};
  fd_args af = {.q = q, .k = kf, .v = vf, .cur_pos = cur};
  sf.kv_dtype = FD_F32;
  expect(fdb_vanilla(&s, &a, 2, sc) == 0, "vanilla accepts int8 K/V with per-row scales");
  ref(&sf, &af, ro, rl);
  int bad = 0;
  for (size_t i = 0; i < nq; i++)
    if (!(fabs(((float *)out)[i] - ro[i]) <= 1e-5 * (1 + fabs(ro[i])))) bad++;
  for (int i = 0; i < B * Hq; i++)
    if (!(fabs(rl[i] - lse[i]) <= 1e-4 * (1 + fabs(rl[i])))) bad++;
  expect(bad == 0, lay ? "vanilla int8 K/V (bshd) against the dequantized reference"
                       : "vanilla int8 K/V (bhsd) against the dequantized reference");
  free(k); free(v); free(kf); free(vf); free(ks); free(vs); free(q); free(out); free(lse); free(sc); free(ro); free(rl);
}

/* The streaming probe over K = 1 and V = 2 (heads x keys x D, a partial last
   chunk, heads split unevenly over 2 threads): its sum is 3 heads keys D
   times the multipliers' sum when every element is read once (within 1e-4:
   f32 sums; one line missed or read twice is 1.9e-4 of it); bad g, dtype
   and head_dim are refused. A build without AVX-512 or AVX2 (with FMA and
   F16C) refuses everything. */
static void check_stream(void) {
  const long H = 3, S = 300;
  const int D = 32, GS[6] = { 0, 1, 2, 4, 8, 16 };
  size_t n = (size_t)H * S * D;
  uint16_t *k = malloc(n * 4), *v = malloc(n * 4);
  for (int dt = 0; dt < 3; dt++) {
    for (size_t i = 0; i < n; i++) {
      if (dt == 0) { ((float *)k)[i] = 1.0f; ((float *)v)[i] = 2.0f; }
      else { k[i] = dt == 1 ? 0x3c00 : 0x3f80; v[i] = 0x4000; }   /* 1 and 2 (f16 and bf16 alike) */
    }
    for (int i = 0; i < 6; i++) {
      double m = GS[i] ? 0 : 1, sum = -1;
      for (int j = 0; j < GS[i]; j++) m += 1.0 / (j + 2);
      int rc = fdb_stream_fma(k, v, H, S, D, dt, GS[i], 2, &sum);
      char what[112];
      double want = 3.0 * (double)n * m;
      snprintf(what, sizeof what, "streaming probe dtype %d g %d reads each element once (relative error %.1e)", dt,
               GS[i], fabs(sum - want) / want);
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
      expect(rc == 0 && fabs(sum - want) <= 1e-4 * want, what);
#else
      expect(rc == -1, "streaming probe refused without AVX-512 or AVX2");
#endif
    }
  }
  expect(fdb_stream_fma(k, v, H, S, D, 0, 3, 2, NULL) == -1, "streaming probe refuses g 3");
  expect(fdb_stream_fma(k, v, H, S, D, 3, 4, 2, NULL) == -1, "streaming probe refuses dtype 3");
  expect(fdb_stream_fma(k, v, H, S, 48, 0, 4, 2, NULL) == -1, "streaming probe refuses head_dim 48");
  expect(fdb_stream_fma(k, v, 0, S, D, 0, 4, 2, NULL) == -1, "streaming probe refuses 0 heads");
  free(k); free(v);
}

/* The widening int8 probe over codes K = 1 and V = 2 with scales 0.5 and
   0.25 (heads x keys x D, a partial last chunk, heads split unevenly over 2
   threads): its sum is 3 heads keys D times the multipliers' sum plus 0.75
   heads keys when every code and scale is read once (within 1e-4: f32
   sums); bad g and head_dim, no scales and no heads are refused. A build
   without AVX-512 or AVX2 (with FMA and F16C) refuses everything. */
static void check_stream_i8(void) {
  const long H = 3, S = 300;
  const int D = 64, GS[6] = { 0, 1, 2, 4, 8, 16 };
  size_t n = (size_t)H * S * D;
  int8_t *k = malloc(n), *v = malloc(n);
  float *ks = malloc(H * S * sizeof(float)), *vs = malloc(H * S * sizeof(float));
  for (size_t i = 0; i < n; i++) { k[i] = 1; v[i] = 2; }
  for (long i = 0; i < H * S; i++) { ks[i] = 0.5f; vs[i] = 0.25f; }
  for (int i = 0; i < 6; i++) {
    double m = GS[i] ? 0 : 1, sum = -1;
    for (int j = 0; j < GS[i]; j++) m += 1.0 / (j + 2);
    double want = 3.0 * (double)n * m + 0.75 * (double)(H * S);
    int rc = fdb_stream_fma_i8(k, v, ks, vs, H, S, D, GS[i], 2, &sum);
    char what[112];
    snprintf(what, sizeof what, "widening int8 probe g %d reads each code and scale once (relative error %.1e)",
             GS[i], fabs(sum - want) / want);
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
    expect(rc == 0 && fabs(sum - want) <= 1e-4 * want, what);
#else
    expect(rc == -1, "widening int8 probe refused without AVX-512 or AVX2");
#endif
  }
  expect(fdb_stream_fma_i8(k, v, ks, vs, H, S, D, 3, 2, NULL) == -1, "widening int8 probe refuses g 3");
  expect(fdb_stream_fma_i8(k, v, ks, vs, H, S, 32, 4, 2, NULL) == -1, "widening int8 probe refuses head_dim 32");
  expect(fdb_stream_fma_i8(k, v, NULL, vs, H, S, D, 4, 2, NULL) == -1, "widening int8 probe refuses no K scales");
  expect(fdb_stream_fma_i8(k, v, ks, vs, 0, S, D, 4, 2, NULL) == -1, "widening int8 probe refuses 0 heads");
  free(k); free(v); free(ks); free(vs);
}

/* The int8 probe over codes K = 1 and V = 2 with scales 0.5 and 0.25 (heads
   x keys x D, a partial last chunk, heads split unevenly over 2 threads): its
   sum is max(n, 1) x 3 heads keys D plus 0.75 heads keys when every code and
   scale is read once (exact: small integers and quarters; one line missed
   or read twice moves it by 64 or more); bad n and head_dim are refused. A
   build or CPU without AVX512-VNNI refuses everything. */
static void check_stream_dot(void) {
  const long H = 3, S = 300;
  const int D = 64, NS[11] = { 0, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48 };
  size_t n = (size_t)H * S * D;
  int8_t *k = malloc(n), *v = malloc(n);
  float *ks = malloc(H * S * sizeof(float)), *vs = malloc(H * S * sizeof(float));
  for (size_t i = 0; i < n; i++) { k[i] = 1; v[i] = 2; }
  for (long i = 0; i < H * S; i++) { ks[i] = 0.5f; vs[i] = 0.25f; }
#if defined(__AVX512VNNI__)
  int served = __builtin_cpu_supports("avx512vnni");
#else
  int served = 0;
#endif
  for (int i = 0; i < 11; i++) {
    double sum = -1, want = (NS[i] ? NS[i] : 1) * 3.0 * (double)n + 0.75 * (double)(H * S);
    int rc = fdb_stream_dot(k, v, ks, vs, H, S, D, NS[i], 2, &sum);
    char what[112];
    snprintf(what, sizeof what, "int8 streaming probe n %d reads each code and scale once (sum %.0f, want %.0f)",
             NS[i], sum, want);
    if (served) expect(rc == 0 && fabs(sum - want) <= 1e-9 * want, what);
    else expect(rc == -1, "int8 streaming probe refused without AVX512-VNNI");
  }
  expect(fdb_stream_dot(k, v, ks, vs, H, S, D, 5, 2, NULL) == -1, "int8 streaming probe refuses n 5");
  expect(fdb_stream_dot(k, v, ks, vs, H, S, 96, 4, 2, NULL) == -1, "int8 streaming probe refuses head_dim 96");
  expect(fdb_stream_dot(k, v, ks, vs, H, 0, D, 4, 2, NULL) == -1, "int8 streaming probe refuses 0 keys");
  free(k); free(v); free(ks); free(vs);
}

int main(void) {
  check_stream();
  check_stream_i8();
  check_stream_dot();
  check_f16();
  check_bf16();
  for (int dt = 0; dt < 27; dt++)
    for (int mm = 0; mm < 3; mm++)
      for (int lay = 0; lay < 2; lay++) check_case(3, 8, 2, 40, 37, dt % 3, dt / 3 % 3, dt / 9, mm, lay);
  check_case(2, 4, 4, 128, 300, 2, 2, 2, 0, 0);
  check_case(1, 32, 1, 7, 5, 0, 1, 0, 2, 1);
  check_i8(2, 8, 2, 64, 50, 0);
  check_i8(2, 8, 2, 64, 50, 1);
  printf("bench-check: %d passed, %d failed\n", checks - fails, fails);
  return fails != 0;
}
