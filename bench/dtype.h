/* Storage dtype conversions in plain C (f32, f16, bf16), shared by the bench
   library and its check. Branch-free so gcc -O3 can vectorize loops over them.
   Assumes no flush-to-zero (no -ffast-math): f16 subnormals go through a
   float multiply that must keep denormal inputs. */
#ifndef FDB_DTYPE_H
#define FDB_DTYPE_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "flashdecode.h"

/* ggml's blocks (llama.cpp's q8_0 / q4_0 KV cache): FDB_QK elements each, an
   f16 scale then the codes, FDB_Q8_BYTES or FDB_Q4_BYTES bytes. */
enum { FDB_QK = 32, FDB_Q8_BYTES = 34, FDB_Q4_BYTES = 18 };

/* The bytes of one block of fd_dtype kd: q8_0's or q4_0's, 0 for the others. */
static inline int fdb_block_bytes(int kd) { return kd == FD_Q8_0 ? FDB_Q8_BYTES : kd == FD_Q4_0 ? FDB_Q4_BYTES : 0; }

/* The bits of a float, and a float from bits. */
static inline uint32_t fdb_fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float fdb_bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* f16 bits -> f32: shift into a float's place, rescale by 2^112, fix inf/nan. */
static inline float fdb_f16_to_f32(uint16_t h) {
  uint32_t mag = (uint32_t)(h & 0x7fffu) << 13;
  float f = fdb_bitsf(mag) * 0x1p112f;
  uint32_t u = fdb_fbits(f) | ((h & 0x7c00u) == 0x7c00u ? 0x7f800000u : 0u);
  return fdb_bitsf(u | (uint32_t)(h & 0x8000u) << 16);
}

/* bf16 bits -> f32: the top half of a float. */
static inline float fdb_bf16_to_f32(uint16_t h) { return fdb_bitsf((uint32_t)h << 16); }

/* f32 -> bf16 bits, round to nearest even; NaN stays a quiet NaN. */
static inline uint16_t fdb_f32_to_bf16(float f) {
  uint32_t u = fdb_fbits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* f32 -> f16 bits, round to nearest even, overflow to inf, subnormals kept. */
static inline uint16_t fdb_f32_to_f16(float f) {
  uint32_t u = fdb_fbits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);      /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);     /* rounds past 65504 */
  if (a < 0x38800000u) {                                       /* f16 subnormal or zero */
    float r = fdb_bitsf(a) + 0.5f;                             /* 2^-24 ulp lands in the low bits */
    return (uint16_t)(sign | (fdb_fbits(r) - 0x3f000000u));
  }
  a += 0xc8000fffu + ((a >> 13) & 1u);                         /* rebias (-112 << 23) and round */
  return (uint16_t)(sign | (a >> 13));
}

/* Element i of a buffer of dtype (0 f32, 1 f16, 2 bf16) as f32. */
static inline float fdb_load(int dtype, const void *buf, size_t i) {
  if (dtype == 1) return fdb_f16_to_f32(((const uint16_t *)buf)[i]);
  if (dtype == 2) return fdb_bf16_to_f32(((const uint16_t *)buf)[i]);
  return ((const float *)buf)[i];
}

/* Store x at element i of a buffer of dtype. */
static inline void fdb_store(int dtype, void *buf, size_t i, float x) {
  if (dtype == 1) ((uint16_t *)buf)[i] = fdb_f32_to_f16(x);
  else if (dtype == 2) ((uint16_t *)buf)[i] = fdb_f32_to_bf16(x);
  else ((float *)buf)[i] = x;
}

/* Bytes per element of dtype 0..2. */
static inline size_t fdb_dtype_size(int dtype) { return dtype == 0 ? 4 : 2; }

#endif
