/* Shared by the SIMD (isa 1 and 2) kernels: the argument block of their asm
   statements and the constant rows they read. */
#ifndef FD_SIMD_PRELUDE
#define FD_SIMD_PRELUDE

/* Arguments of one micro-kernel asm statement; field offsets are fixed in
   gen/simd.lua (ARG): keep in sync. */
typedef struct fd_asm_args {
  const void *src;          /*  0: K or V row 0 of the chunk (+ head_dim offset) */
  float *ptr;               /*  8: q tile, score row or accumulator records */
  float *sc;                /* 16: scores of the tile's first head */
  fd_i64 n;                 /* 24: keys, or padded scores */
  fd_i64 stride;            /* 32: bytes from one K/V row to the next */
  const float *scl;         /* 40: per-row scale of row 0 (int8/fp8) */
  fd_i64 scl_stride;        /* 48: bytes from one row's scale to the next */
  const void *consts;       /* 56: fd_simd_c */
  const float *in;          /* 64: running max in */
  float *out;               /* 72: max or sum out */
  float *stage;             /* 80: f32 staging block of one group of K rows */
  const void *pf;           /* 88: rows to prefetch meanwhile (V of this chunk, K of the next) */
} fd_asm_args;

/* Constant rows, 16 lanes each, from gen/simd.lua's CONST_FLOATS and CONST_INTS. */
static const struct { float f[$(#CONST_FLOATS)][16]; fd_u32 u[$(#CONST_INTS)][16]; } fd_simd_c = {
  {
@ for _, row in ipairs(CONST_FLOATS) do
    { $(lanes(row[2])) },   /* $(row[1]) */
@ end
  },
  {
@ for _, row in ipairs(CONST_INTS) do
    { $(lanes(row[2])) },   /* $(row[1]) */
@ end
  }
};

/* Vector registers the asm statements clobber, for compilers that allocate
   them (tcc keeps no value in a vector register across statements). */
#if defined(__TINYC__)
#define FD_VCLOBBER
#elif defined(__AVX512F__)
#define FD_VCLOBBER , $(xmm_list(0, 31)), "k1"
#else
#define FD_VCLOBBER , $(xmm_list(0, 15))
#endif

#endif /* FD_SIMD_PRELUDE */
