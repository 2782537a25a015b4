/* The streaming probe: the least work a kernel with f32 FMAs does on a KV
   cache, to set beside the kernel in one run (bench/stream.lua). */
#ifndef FDB_STREAM_H
#define FDB_STREAM_H

/* Read heads x keys rows of head_dim elements of dtype (0 f32, 1 f16, 2
   bf16) at k and at v once, in a decode kernel's order (per head: chunks of
   256 keys, K then V), each row widened to f32 and every 16-lane vector fed
   to g FMAs (g = 0: one add), into 12 independent accumulator chains, with
   a prefetch 4 KiB ahead along that order; heads split over `threads` OpenMP
   threads (0 = all). g is 0, 1, 2, 4, 8 or 16; head_dim a multiple of 32.
   *sum (when sum is not NULL) gets the sum of every accumulator: every
   element times the sum of the g multipliers 1/2, 1/3, ..., 1/(g+1) (g = 0:
   times 1), so a check can see each element was read once. Returns 0; -1
   for another g, dtype or head_dim, no heads or keys, or in a build without
   AVX-512 (nothing read). */
int fdb_stream_fma(const void *k, const void *v, long heads, long keys, int head_dim, int dtype, int g,
                   int threads, double *sum);

#endif
