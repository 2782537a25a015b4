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

/* Constant rows, 16 lanes of 4 bytes each, little-endian: gen/simd.lua's
   CONST_FLOATS (as the f32 nearest to each literal) then CONST_INTS, one
   string literal per row (and the literal's NUL after the last). */
static const unsigned char fd_simd_c[$(#CONST_ROWS * 64 + 1)] __attribute__((aligned(64))) =
@ for _, row in ipairs(CONST_ROWS) do
  "$(row[2])"   /* $(row[1]) */
@ end
  ;

/* Vector registers the asm statements clobber, for compilers that allocate
   them (tcc keeps no value in a vector register across statements). */
#if defined(__TINYC__)
#define FD_VCLOBBER
#elif defined(__AVX512F__)
#define FD_VCLOBBER , $(xmm_list(0, 31)), "k1", "k2"
#else
#define FD_VCLOBBER , $(xmm_list(0, 15))
#endif

#endif /* FD_SIMD_PRELUDE */
