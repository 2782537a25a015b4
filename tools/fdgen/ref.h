/* Reference decode attention in double precision, and the storage-dtype conversions
   `fdgen run` and the C tests check kernels with. */
#ifndef FD_TOOL_REF_H
#define FD_TOOL_REF_H
#include <stddef.h>
#include <stdint.h>

/* One decode-attention problem in f32 values (already rounded to the storage dtypes). */
typedef struct ref_problem {
  int B, Hq, Hkv, D;
  int64_t S;                  /* kv_len */
  int mask_mode, layout;      /* 0 causal, 1 mask, 2 full; 0 BHSD, 1 BSHD */
  const float *q;             /* [B, Hq, D] */
  const float *k, *v;         /* [B, Hkv, S, D] or [B, S, Hkv, D] */
  const int32_t *cur_pos;     /* [B] (causal) */
  const float *mask;          /* [B, Hq, S] (mask mode) */
  double scale;
  double softcap;             /* 0: none; else s = softcap tanh(s / softcap) after the scale, before the mask */
  const int32_t *beam_src;    /* NULL, or [B, S] (FD_BEAMS): key i of row b is row beam_src[b * S + i]'s key i */
  const int32_t *new_from;    /* NULL, or [B] (FD_NEW_KV): keys i >= new_from[b] of row b are its new tokens'
                                 keys, read from k_new/v_new at (b, i) (laid out as k), never through beam_src */
  const float *k_new, *v_new;
} ref_problem;

/* out [B, Hq, D] and lse [B, Hq] in double; a row with no valid key gives 0 and -inf. */
void ref_attention(const ref_problem *p, double *out, double *lse);

/* Element offset of K/V row (b, j, i) for a layout. */
int64_t ref_kv_offset(const ref_problem *p, int b, int j, int64_t i);
/* The keys row b attends to: cur_pos + 1 when causal, else all S. */
int64_t ref_valid_keys(const ref_problem *p, int b);

/* Storage conversions written independently of the kernels' (frexp/ldexp based). */
uint16_t t_f32_to_f16(float x);
float t_f16_to_f32(uint16_t h);
uint16_t t_f32_to_bf16(float x);
float t_bf16_to_f32(uint16_t h);
/* fp8 e4m3 (bias 7, max 448, 0x7f NaN) by value. */
uint8_t t_f32_to_e4m3(float x);
float t_e4m3_to_f32(uint8_t b);
/* fp8 e5m2 (bias 15, max 57344, the upper byte of an f16: 0x7c Inf, 0x7d-0x7f NaN) by value;
   round to nearest even, Inf from 61440 on. */
uint8_t t_f32_to_e5m2(float x);
float t_e5m2_to_f32(uint8_t b);
/* Bytes per element of dtype 0 f32, 1 f16, 2 bf16, 3 int8, 4 fp8 e4m3, 5 fp8 e5m2
   (0 for the block dtypes 6 q8_0, 7 q4_0: t_kv_bytes). */
size_t t_dtype_size(int dtype);
/* Elements per storage block: 32 for q8_0 and q4_0 (ggml's blocks), else 1. */
int t_block(int dtype);
/* Bytes of n elements of a dtype (n a multiple of its block): q8_0 34 and q4_0
   18 per 32 elements. */
size_t t_kv_bytes(int dtype, size_t n);
/* n elements in the kernels' K/V stride units: elements, or bytes for a block dtype. */
int64_t t_kv_units(int dtype, int64_t n);
/* Quantize the 32 values x into block blk of a block dtype (its scale from the
   largest |x|); x becomes the values stored. Element i of the blocks loads
   through t_load, decoded in double. */
void t_store_block(int dtype, void *buf, size_t blk, float *x);
/* The value a row's largest |x| is scaled to for a quantized dtype (int8 127, e4m3 448,
   e5m2 57344); 0: the dtype has no row scales. */
float t_quant_max(int dtype);
/* Store x rounded to dtype at element i; returns the value actually stored
   (int8: x rounded to an integer in -127..127; fp8: x rounded to e4m3 or e5m2). */
float t_store(int dtype, void *buf, size_t i, float x);
/* Load element i of dtype as f32. */
float t_load(int dtype, const void *buf, size_t i);
/* Uniform random in [lo, hi) from a caller-owned xorshift state. */
float t_rand(uint64_t *state, float lo, float hi);

#endif
