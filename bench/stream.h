/* The streaming probe: the least work a kernel with f32 FMAs does on a KV
   cache, to set beside the kernel in one run (bench/stream.lua). */
#ifndef FDB_STREAM_H
#define FDB_STREAM_H

/* Read heads x keys rows of head_dim elements of dtype (0 f32, 1 f16, 2
   bf16) at k and at v once, in a decode kernel's order (per head: chunks of
   256 keys, K then V), each row widened to f32 and every vector (16 lanes
   with AVX-512, else 8 with AVX2; bf16 split into its even and odd elements
   there, as the AVX2 kernels read it) fed to g FMAs (g = 0: one add), into
   12 independent accumulator chains (AVX2: 8), with a prefetch 4 KiB ahead
   along that order; heads split over `threads` OpenMP threads (0 = all). g
   is 0, 1, 2, 4, 8 or 16; head_dim a multiple of 32. *sum (when sum is not
   NULL) gets the sum of every accumulator: every element times the sum of
   the g multipliers 1/2, 1/3, ..., 1/(g+1) (g = 0: times 1), so a check can
   see each element was read once. Returns 0; -1 for another g, dtype or
   head_dim, no heads or keys, or in a build without AVX-512 or AVX2 with
   FMA and F16C (nothing read). */
int fdb_stream_fma(const void *k, const void *v, long heads, long keys, int head_dim, int dtype, int g,
                   int threads, double *sum);

/* The int8 form of the same loop, for a kernel that widens int8 codes to f32
   (no MSD planes): heads x keys rows of head_dim int8 codes at k and at v,
   and one f32 scale per row at ks and vs ([heads][keys]), read once in the
   same order (per chunk of 256 keys: K codes, K scales, V codes, V scales),
   every code sign-extended to f32 and each vector fed to g FMAs (g = 0: one
   add), each scale added once. *sum gets the codes' sum times that of the
   g multipliers, plus the scales' sum. g as above; head_dim a multiple of
   64. Returns 0; -1 for another g or head_dim, no heads, keys or scales, or
   in a build without AVX-512 or AVX2 with FMA and F16C (nothing read). */
int fdb_stream_fma_i8(const void *k, const void *v, const float *ks, const float *vs, long heads, long keys,
                      int head_dim, int g, int threads, double *sum);

/* The int8 form, for an MSD kernel's arithmetic: heads x keys rows of
   head_dim int8 codes at k and at v, and one f32 scale per row at ks and vs
   ([heads][keys]), read once in the same order (per chunk of 256 keys: K
   codes, K scales, V codes, V scales), every 64-byte vector of codes fed to
   n int8 dot products (vpdpbusd, the codes as its unsigned bytes times a
   vector of ones: n = G query heads x the key's planes) into 12 chains, or
   with n = 0 to one byte sum (vpsadbw); each 16 scales to one f32 add.
   *sum gets max(n, 1) x the sum of the codes as unsigned bytes plus the sum
   of the scales (the int32 chains wrap beyond 2^31: a check keeps them
   small). n is 0 or G x P for G in 1, 2, 4, 8, 16 and P in 2, 3; head_dim
   a multiple of 64. Returns 0; -1 for another n or head_dim, no heads or
   keys, or without AVX512-VNNI (in the build or the CPU; nothing read). */
int fdb_stream_dot(const void *k, const void *v, const float *ks, const float *vs, long heads, long keys,
                   int head_dim, int n, int threads, double *sum);

#endif
