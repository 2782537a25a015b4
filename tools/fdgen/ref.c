/* Reference decode attention in double precision (the straightforward
   two-pass softmax), and the storage-dtype conversions of fdgen run and the tests. */
#include "ref.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Element offset of K/V row (b, j, i) for a layout. */
int64_t ref_kv_offset(const ref_problem *p, int b, int j, int64_t i) {
  if (p->layout == 0) return (((int64_t)b * p->Hkv + j) * p->S + i) * p->D;
  return (((int64_t)b * p->S + i) * p->Hkv + j) * p->D;
}

/* The K (or V: kv 1) row key i of batch row b reads: its own, or through
   the beam indirection its beam_src entry names; a new token's key (from
   new_from[b] on) from k_new / v_new. */
static const float *ref_key_row(const ref_problem *p, int kv, int b, int j, int64_t i) {
  if (p->new_from && i >= p->new_from[b]) return (kv ? p->v_new : p->k_new) + ref_kv_offset(p, b, j, i);
  int src = p->beam_src ? p->beam_src[(int64_t)b * p->S + i] : b;
  return (kv ? p->v : p->k) + ref_kv_offset(p, src, j, i);
}

/* The keys row b attends to: cur_pos + 1 when causal, else all S. */
int64_t ref_valid_keys(const ref_problem *p, int b) {
  return p->mask_mode == 0 ? (int64_t)p->cur_pos[b] + 1 : p->S;
}

/* One query row (b, h): scores, softmax and output in double. */
static void ref_row(const ref_problem *p, int b, int h, double *s, double *out, double *lse) {
  int G = p->Hq / p->Hkv, j = h / G;
  const float *q = p->q + ((int64_t)b * p->Hq + h) * p->D;
  int64_t n = ref_valid_keys(p, b);
  double m = -INFINITY;
  for (int64_t i = 0; i < n; i++) {
    const float *k = ref_key_row(p, 0, b, j, i);
    double dot = 0;
    for (int d = 0; d < p->D; d++) dot += (double)q[d] * k[d];
    s[i] = p->scale * dot;
    if (p->softcap > 0) s[i] = p->softcap * tanh(s[i] / p->softcap);
    if (p->mask_mode == 1) s[i] += p->mask[((int64_t)b * p->Hq + h) * p->S + i];
    if (s[i] > m || isnan(s[i])) m = s[i];   /* a NaN score makes m NaN, and so out and lse (IEEE) */
  }
  for (int d = 0; d < p->D; d++) out[d] = 0;
  if (m == -INFINITY) { *lse = -INFINITY; return; }
  double l = 0;
  for (int64_t i = 0; i < n; i++) {
    double e = exp(s[i] - m);
    const float *v = ref_key_row(p, 1, b, j, i);
    l += e;
    for (int d = 0; d < p->D; d++) out[d] += e * v[d];
  }
  for (int d = 0; d < p->D; d++) out[d] /= l;
  *lse = m + log(l);
}

/* The whole problem, row by row. */
void ref_attention(const ref_problem *p, double *out, double *lse) {
  double *s = malloc(sizeof(double) * (size_t)(p->S > 0 ? p->S : 1));
  for (int b = 0; b < p->B; b++)
    for (int h = 0; h < p->Hq; h++)
      ref_row(p, b, h, s, out + ((int64_t)b * p->Hq + h) * p->D, lse + (int64_t)b * p->Hq + h);
  free(s);
}

/* Round x to a float with `bits` mantissa bits (incl. the implicit one) and
   exponent range [emin, emax], nearest even, as a double. */
static double round_to_format(double x, int bits, int emin, int emax) {
  if (isnan(x) || isinf(x) || x == 0) return x;
  int e;
  frexp(x, &e);                       /* x = f * 2^e, 0.5 <= |f| < 1 */
  int exp = e - 1;                    /* x = 1.f * 2^exp */
  if (exp < emin) exp = emin;         /* subnormal: fixed quantum */
  double quantum = ldexp(1.0, exp - (bits - 1));
  double r = nearbyint(x / quantum) * quantum;   /* default rounding: nearest even */
  double maxv = ldexp(2.0 - ldexp(1.0, -(bits - 1)), emax);
  if (fabs(r) > maxv) return x > 0 ? INFINITY : -INFINITY;
  return r;
}

/* Exponent and mantissa bits of a non-negative value already rounded to a
   format with man_bits stored mantissa bits and minimum normal exponent emin. */
static unsigned minifloat_bits(double r, int man_bits, int emin) {
  if (r == 0) return 0;
  int e;
  frexp(r, &e);
  int exp = e - 1, bias = 1 - emin;
  if (exp < emin) return (unsigned)(r / ldexp(1.0, emin - man_bits));          /* subnormal */
  return (unsigned)(exp + bias) << man_bits | (unsigned)((r / ldexp(1.0, exp) - 1.0) * ldexp(1.0, man_bits));
}

/* f32 -> the bits of an IEEE-style binary format (man_bits mantissa bits,
   exp_bits exponent bits, the top exponent for infinity and NaN) by value:
   nearest even, infinity past the rounding boundary above the largest
   finite value; sign, exponent and mantissa computed with frexp. */
static unsigned ieee_bits(float x, int man_bits, int exp_bits) {
  int emax = (1 << (exp_bits - 1)) - 1;
  unsigned sign = signbit(x) ? 1u << (man_bits + exp_bits) : 0, top = ((1u << exp_bits) - 1) << man_bits;
  if (isnan(x)) return sign | top | 1u << (man_bits - 1);
  double r = fabs(round_to_format(x, man_bits + 1, 1 - emax, emax));
  if (isinf(r)) return sign | top;
  return sign | minifloat_bits(r, man_bits, 1 - emax);
}

/* The bits h of an IEEE-style binary format -> f32 by value (the top
   exponent: infinity, or NaN with a mantissa). */
static float ieee_value(unsigned h, int man_bits, int exp_bits) {
  int emax = (1 << (exp_bits - 1)) - 1;
  unsigned exp = (h >> man_bits) & ((1u << exp_bits) - 1), man = h & ((1u << man_bits) - 1);
  double v;
  if (exp == (1u << exp_bits) - 1) v = man ? NAN : INFINITY;
  else if (exp == 0) v = ldexp(man, 1 - emax - man_bits);
  else v = ldexp((1u << man_bits) + man, (int)exp - emax - man_bits);
  return (float)((h >> (man_bits + exp_bits)) & 1 ? -v : v);
}

/* f32 -> f16 bits by value. */
uint16_t t_f32_to_f16(float x) { return (uint16_t)ieee_bits(x, 10, 5); }

/* f16 bits -> f32 by value. */
float t_f16_to_f32(uint16_t h) { return ieee_value(h, 10, 5); }

/* f32 -> bf16 bits: round the value to 8 mantissa bits, then take the top half. */
uint16_t t_f32_to_bf16(float x) {
  uint32_t u;
  if (isnan(x)) return signbit(x) ? 0xffc0 : 0x7fc0;
  float r = (float)round_to_format(x, 8, -126, 127);
  memcpy(&u, &r, 4);
  return (uint16_t)(u >> 16);
}

/* bf16 bits -> f32. */
float t_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* f32 -> fp8 e4m3 bits by value (saturating at 448). */
uint8_t t_f32_to_e4m3(float x) {
  uint8_t sign = signbit(x) ? 0x80 : 0;
  if (isnan(x)) return sign | 0x7f;
  double r = fabs(round_to_format(x, 4, -6, 8));
  return sign | (uint8_t)minifloat_bits(r > 448 ? 448 : r, 3, -6);
}

/* fp8 e4m3 bits -> f32 by value. */
float t_e4m3_to_f32(uint8_t b) {
  int exp = (b >> 3) & 15, man = b & 7;
  double v;
  if ((b & 0x7f) == 0x7f) v = NAN;
  else if (exp == 0) v = ldexp(man, -9);
  else v = ldexp(8 + man, exp - 10);
  return (float)((b & 0x80) ? -v : v);
}

/* f32 -> fp8 e5m2 bits by value: nearest even; infinity only past the
   rounding boundary above 57344 (from 61440 on), as IEEE rounding gives. */
uint8_t t_f32_to_e5m2(float x) { return (uint8_t)ieee_bits(x, 2, 5); }

/* fp8 e5m2 bits -> f32 by value (exponent 31: infinity, or NaN with a mantissa). */
float t_e5m2_to_f32(uint8_t b) { return ieee_value(b, 2, 5); }

/* Per dtype, by value (f32, f16, bf16, int8, fp8 e4m3, fp8 e5m2, q8_0, q4_0):
   bytes per element (0: a block dtype), the value a row scale maps a row's
   largest |x| to (the largest finite code; 0: no row scales), and elements
   and bytes per storage block (ggml q8_0: an f16 scale and 32 int8, 34 bytes;
   q4_0: an f16 scale and 16 bytes of nibbles, 18 bytes). */
static const struct { size_t size; float quant_max; int block, block_bytes; } DTYPE[] = {
  { 4, 0, 1, 4 }, { 2, 0, 1, 2 }, { 2, 0, 1, 2 }, { 1, 127.0f, 1, 1 }, { 1, 448.0f, 1, 1 }, { 1, 57344.0f, 1, 1 },
  { 0, 0, 32, 34 }, { 0, 0, 32, 18 },
};

/* Bytes per element of a dtype (0 for a block dtype: t_kv_bytes). */
size_t t_dtype_size(int dtype) { return DTYPE[dtype].size; }

/* Elements per storage block: 32 for q8_0 and q4_0, else 1. */
int t_block(int dtype) { return DTYPE[dtype].block; }

/* Bytes of n elements of a dtype (n a multiple of its block). */
size_t t_kv_bytes(int dtype, size_t n) { return n / (size_t)DTYPE[dtype].block * (size_t)DTYPE[dtype].block_bytes; }

/* n elements in the kernels' K/V stride units: elements, or bytes for a block dtype. */
int64_t t_kv_units(int dtype, int64_t n) { return DTYPE[dtype].block > 1 ? (int64_t)t_kv_bytes(dtype, (size_t)n) : n; }

/* Element j of the ggml block at b, in double: its little-endian f16 scale
   times the code (q8_0: signed byte j; q4_0: nibble j of the low nibbles for
   j < 16, else nibble j - 16 of the high ones, offset by 8). */
static double block_value(int dtype, const uint8_t *b, int j) {
  double d = t_f16_to_f32((uint16_t)(b[0] + 256 * b[1]));
  if (dtype == 6) return d * (double)(int8_t)b[2 + j];
  int nib = j < 16 ? b[2 + j] % 16 : b[2 + j - 16] / 16;
  return d * (double)(nib - 8);
}

/* Quantize 32 values x of block blk of dtype (6 q8_0, 7 q4_0) into buf: the
   scale is the largest |x| over the largest code (127, 7) rounded to f16, the
   codes x / scale rounded to nearest and clamped; x becomes the stored values. */
void t_store_block(int dtype, void *buf, size_t blk, float *x) {
  uint8_t *b = (uint8_t *)buf + blk * t_kv_bytes(dtype, 32);
  double m = 0, top = dtype == 6 ? 127 : 7;
  for (int j = 0; j < 32; j++) m = fmax(m, fabs(x[j]));
  uint16_t h = t_f32_to_f16((float)(m / top));
  double d = t_f16_to_f32(h);
  b[0] = (uint8_t)(h & 255); b[1] = (uint8_t)(h >> 8);
  if (dtype == 7) memset(b + 2, 0, 16);
  for (int j = 0; j < 32; j++) {
    double c = d > 0 ? nearbyint(x[j] / d) : 0;
    c = fmin(fmax(c, dtype == 6 ? -128 : -8), top);
    if (dtype == 6) b[2 + j] = (uint8_t)(int8_t)c;
    else b[2 + j % 16] |= (uint8_t)((int)c + 8) << (j < 16 ? 0 : 4);
  }
  for (int j = 0; j < 32; j++) x[j] = (float)block_value(dtype, b, j);
}

/* The value a quantized dtype's row scale maps a row's largest |x| to; 0 for the others. */
float t_quant_max(int dtype) { return DTYPE[dtype].quant_max; }

/* Store x rounded to dtype; return the stored value. */
float t_store(int dtype, void *buf, size_t i, float x) {
  if (dtype == 0) { ((float *)buf)[i] = x; return x; }
  if (dtype == 3) {
    float r = nearbyintf(x < -127 ? -127 : x > 127 ? 127 : x);
    ((int8_t *)buf)[i] = (int8_t)r;
    return r;
  }
  if (dtype == 4) { ((uint8_t *)buf)[i] = t_f32_to_e4m3(x); return t_e4m3_to_f32(((uint8_t *)buf)[i]); }
  if (dtype == 5) { ((uint8_t *)buf)[i] = t_f32_to_e5m2(x); return t_e5m2_to_f32(((uint8_t *)buf)[i]); }
  uint16_t h = dtype == 1 ? t_f32_to_f16(x) : t_f32_to_bf16(x);
  ((uint16_t *)buf)[i] = h;
  return dtype == 1 ? t_f16_to_f32(h) : t_bf16_to_f32(h);
}

/* Load element i of dtype as f32. */
float t_load(int dtype, const void *buf, size_t i) {
  if (dtype == 0) return ((const float *)buf)[i];
  if (DTYPE[dtype].block > 1)
    return (float)block_value(dtype, (const uint8_t *)buf + t_kv_bytes(dtype, i - i % 32), (int)(i % 32));
  if (dtype == 3) return ((const int8_t *)buf)[i];
  if (dtype == 4) return t_e4m3_to_f32(((const uint8_t *)buf)[i]);
  if (dtype == 5) return t_e5m2_to_f32(((const uint8_t *)buf)[i]);
  uint16_t h = ((const uint16_t *)buf)[i];
  return dtype == 1 ? t_f16_to_f32(h) : t_bf16_to_f32(h);
}

/* xorshift64* uniform in [lo, hi). */
float t_rand(uint64_t *st, float lo, float hi) {
  *st ^= *st >> 12; *st ^= *st << 25; *st ^= *st >> 27;
  uint64_t r = *st * 2685821657736338717ull;
  return lo + (hi - lo) * (float)((r >> 40) * (1.0 / 16777216.0));
}
