/* Machine read bandwidth, cache flush and a clock for the benchmark. */
#ifndef FDB_BW_H
#define FDB_BW_H
#include <stddef.h>

/* Monotonic time in seconds. */
double fdb_now(void);

/* Best-of-reps read bandwidth in GB/s (1e9 bytes/s) of a vectorized sum over a
   buffer of `bytes` split over `threads` OpenMP threads (0 = all). Small
   buffers are summed several times per repetition so each one lasts >= ~20 ms. */
double fdb_read_bw_gbs(size_t bytes, int threads, int reps);

/* Peak f32 fused multiply-add rate in G FMAs/s (1e9 multiply-adds per second)
   over `threads` OpenMP threads (0 = all): 12 independent vfmadd chains per
   thread in registers, best of reps; 0 where the build has no FMA. */
double fdb_fma_gfmas(int threads, int reps);

/* f32 lanes per instruction of the FMA probe (16 zmm, 8 ymm; 0 without FMA). */
int fdb_fma_lanes(void);

/* 1 when CPUID (and XGETBV: the OS saves the zmm state) says the CPU has
   AVX512-BF16 (vdpbf16ps) / AVX512-VNNI (vpdpbusd); else 0. */
int fdb_has_bf16_dot(void);
int fdb_has_int8_dot(void);

/* Peak bf16 dot-product rate in G multiply-adds/s over `threads` OpenMP
   threads (0 = all): 12 independent vdpbf16ps zmm chains per thread, 32
   multiply-adds per instruction, best of reps; -1 (absent) without AVX512-BF16. */
double fdb_bf16_gdots(int threads, int reps);

/* Peak int8 dot-product rate in G multiply-adds/s: 12 independent vpdpbusd zmm
   chains per thread, 64 multiply-adds per instruction, best of reps; -1
   (absent) without AVX512-VNNI. */
double fdb_int8_gdots(int threads, int reps);

/* 1 when the CPU has AVX2 (vpmaddwd on ymm); else 0. */
int fdb_has_int16_madd(void);

/* Peak int16 multiply-add rate in G multiply-adds/s as the AVX2 MSD scores
   run them: 12 independent chains per thread of vpmaddwd (16 int16
   products summed in pairs) and the vpaddd that accumulates it, 16
   multiply-adds per pair, best of reps; -1 (absent) without AVX2. */
double fdb_int16_gmadds(int threads, int reps);

/* Evict the caches of every core: all threads read one word of every line
   of a buffer of 4x the last-level cache (allocated and written once, kept
   until exit), so the caches hold its clean lines. The tuner's flush
   (tuner/sys.lua) is this one. With $FDB_FLUSH=write (read at the first
   call) they write one word per line instead: dirty lines, which a measured
   call then also pays to write back. 0, or -1 when the buffer cannot be
   allocated (nothing flushed). */
int fdb_flush_caches(void);

/* One timed read pass, in GB/s, over a buffer of fdb_flush_bytes() (allocated
   and first-touched once, kept until exit) with `threads` threads (0 = all):
   the bandwidth sample the benchmark takes next to each cold call; 0 when
   the buffer cannot be allocated. */
double fdb_call_bw_gbs(int threads);

/* Size of the last-level cache in bytes (sysfs, else sysconf, else 32 MiB). */
size_t fdb_llc_bytes(void);

/* Bytes of the flush buffer: $FDB_FLUSH_MIB MiB when that is a positive whole
   number (where the LLC size is misreported), else 4x the LLC size, at least
   128 MiB, at most 1 GiB. */
size_t fdb_flush_bytes(void);

/* Threads OpenMP uses by default (online cores unless OMP_NUM_THREADS). */
int fdb_max_threads(void);

/* Library compile facts: "avx512", "avx2" or "scalar" sum kernel. */
const char *fdb_bw_kernel(void);

#endif
