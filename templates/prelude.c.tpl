/* Helpers shared by every kernel of a translation unit (or exported header). */
#ifndef FD_PRELUDE
#define FD_PRELUDE

/* restrict where the compiler is C99 or later (tcc and gcc both are). */
#define FD_RESTRICT restrict

/* -inf without math.h or a division by zero. */
static inline float fd_ninf(void) { fd_bits b; b.u = 0xff800000u; return b.f; }

/* A quiet NaN without math.h. */
static inline float fd_nan(void) { fd_bits b; b.u = 0x7fc00000u; return b.f; }

/* e^x for x <= 0 (the ratio of two running maxima), ~1e-7 relative; 0 below
   $(P_MIN_X) (P_MIN_X, as the weights: no subnormal rescale) and for -inf; NaN
   for NaN (and for x > 0, which only a NaN score leads to). */
static inline float fd_expf(float x) {
  fd_bits eb; float et, er, p; int en;
  if (x < $(P_MIN_X).0f) return 0.0f;
  if (!(x <= 0.0f)) return fd_nan();
$(exp_body("x", "p", "    "))
  return p;
}

/* The logit softcap: cap x tanh(x / cap) for cap > 0, ~1e-7 relative: for
   |y| < 0.625 the odd polynomial y + y^3 P(y^2), else 1 - 2 / (e^(2|y|) + 1)
   with 2|y| at most 40 (tanh is 1 in float long before); NaN stays NaN. The
   SIMD kernels use the same formulas (gen/simd.lua softcap_step). */
static inline float fd_softcap(float x, float cap) {
  fd_bits eb; float et, er, p, t, z, y = x / cap, a = y < 0.0f ? -y : y;
  int en;
  if (a != a) return x;
  if (a < 0.625f) {
    z = a * a;
    t = a + a * z * ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z
                      + 1.33314422036e-1f) * z - 3.33332819422e-1f);
  } else {
    z = 2.0f * a < 40.0f ? 2.0f * a : 40.0f;
$(exp_body("z", "p", "    ", nil, true))
    t = 1.0f - 2.0f / (p + 1.0f);
  }
  return (y < 0.0f ? -t : t) * cap;
}

/* Online softmax: move a head's state record (acc[0..D), max, sum) to the larger running max mx. */
static inline void fd_rescale(float *st, int D, float mx) {
  float corr = fd_expf(st[D] - mx);
  int d;
  for (d = 0; d < D; d++) st[d] *= corr;
  st[D] = mx;
  st[D + 1] *= corr;
}

/* ln(l 2^P_SHIFT) of a softmax denominator l > 0 summed from weights scaled
   by 2^-P_SHIFT (gen/simd.lua), in double internally; NaN for NaN. */
static inline float fd_log_sum(float x) {
  fd_bits b; int e; double m, s, s2;
  if (x != x) return x;
  b.f = x;
  e = (int)((b.u >> 23) & 0xffu) - 127 + $(P_SHIFT);
  b.u = (b.u & 0x7fffffu) | 0x3f800000u;
  m = b.f;
  if (m > 1.4142135623730951) { m *= 0.5; e += 1; }
  s = (m - 1.0) / (m + 1.0); s2 = s * s;
  return (float)(e * 0.6931471805599453 +
                 2.0 * s * (1.0 + s2 * (1.0 / 3 + s2 * (1.0 / 5 + s2 * (1.0 / 7 + s2 * (1.0 / 9 + s2 / 11))))));
}

/* f32 -> bf16 bits, round to nearest even, NaN kept quiet. */
static inline fd_u16 fd_f32_to_bf16(float f) {
  fd_bits b; b.f = f;
  if ((b.u & 0x7fffffffu) > 0x7f800000u) return (fd_u16)((b.u >> 16) | 0x40u);
  return (fd_u16)((b.u + 0x7fffu + ((b.u >> 16) & 1u)) >> 16);
}

/* f32 -> f16 bits, round to nearest even, with subnormals, overflow to inf, NaN. */
static inline fd_u16 fd_f32_to_f16(float f) {
  fd_bits b; fd_u32 sign, u;
  b.f = f; sign = (b.u >> 16) & 0x8000u; u = b.u & 0x7fffffffu;
  if (u >= 0x7f800000u) return (fd_u16)(sign | (u > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (u >= 0x477ff000u) return (fd_u16)(sign | 0x7c00u);
  if (u < 0x38800000u) { b.u = u; b.f += 0.5f; return (fd_u16)(sign | (b.u - 0x3f000000u)); }
  u += 0xc8000fffu + ((u >> 13) & 1u);
  return (fd_u16)(sign | (u >> 13));
}

/* Store an f32 value as out dtype 0 f32, 1 f16, 2 bf16 at p[i]. */
static inline void fd_store_f32(float *p, fd_i64 i, float x) { p[i] = x; }
static inline void fd_store_f16(fd_u16 *p, fd_i64 i, float x) { p[i] = fd_f32_to_f16(x); }
static inline void fd_store_bf16(fd_u16 *p, fd_i64 i, float x) { p[i] = fd_f32_to_bf16(x); }

#endif /* FD_PRELUDE */
