/* Shared by the SIMD (isa 1 and 2) kernels: the argument block of their asm
   statements and the constant rows they read. */
#ifndef FD_SIMD_PRELUDE
#define FD_SIMD_PRELUDE

/* Arguments of one micro-kernel asm statement, from gen/facts.lua ASM_ARGS
   (gen/simd.lua reads the offsets there; build/fd_keydefs.h asserts them). */
typedef struct fd_asm_args {
@ for i = 1, #ASM_ARGS do
$(asm_arg_line(i))
@ end
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
