/* Read bandwidth by a vectorized sum (AVX-512 or AVX2 intrinsics chosen at
   compile time, plain loop otherwise) and cache flushing. Threads are not
   pinned (nor are the library's pool threads): both see the same scheduler. */
#include "bw.h"
#include "util.h"
#include <errno.h>
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Sink that keeps sums observable so the compiler cannot drop them. */
static volatile double fdb_sink;

double fdb_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int fdb_max_threads(void) { return omp_get_max_threads(); }

#if defined(__AVX512F__)
const char *fdb_bw_kernel(void) { return "avx512"; }
/* Sum n floats (n a multiple of 64, 64-byte aligned) with 4 zmm accumulators. */
static double sum_block(const float *p, size_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < n; i += 64) {
    a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}
#elif defined(__AVX2__)
const char *fdb_bw_kernel(void) { return "avx2"; }
/* Sum n floats (n a multiple of 64, 64-byte aligned) with 4 ymm accumulators. */
static double sum_block(const float *p, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < n; i += 64) {
    a0 = _mm256_add_ps(a0, _mm256_add_ps(_mm256_load_ps(p + i), _mm256_load_ps(p + i + 8)));
    a1 = _mm256_add_ps(a1, _mm256_add_ps(_mm256_load_ps(p + i + 16), _mm256_load_ps(p + i + 24)));
    a2 = _mm256_add_ps(a2, _mm256_add_ps(_mm256_load_ps(p + i + 32), _mm256_load_ps(p + i + 40)));
    a3 = _mm256_add_ps(a3, _mm256_add_ps(_mm256_load_ps(p + i + 48), _mm256_load_ps(p + i + 56)));
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  float t[8];
  _mm256_storeu_ps(t, s);
  return (double)t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}
#else
const char *fdb_bw_kernel(void) { return "scalar"; }
/* Sum n floats with 16 independent lanes (a loop gcc vectorizes). */
static double sum_block(const float *p, size_t n) {
  float acc[16] = {0};
  for (size_t i = 0; i < n; i += 16)
    for (int l = 0; l < 16; l++) acc[l] += p[i + l];
  double s = 0;
  for (int l = 0; l < 16; l++) s += acc[l];
  return s;
}
#endif

/* One timed repetition: every thread sums its slice `passes` times; seconds. */
static double timed_sum(const float *buf, size_t n, int threads, int passes) {
  double t0 = fdb_now(), total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    size_t per = n / (size_t)nt / 64 * 64;
    for (int r = 0; r < passes; r++) total += sum_block(buf + (size_t)t * per, per);
  }
  double dt = fdb_now() - t0;
  fdb_sink = total;
  return dt;
}

#if defined(__AVX512F__) || defined(__FMA__)
#if defined(__AVX512F__)
typedef __m512 fdb_vec;
#define FDB_LANES 16
#define FDB_SET1 _mm512_set1_ps
#define FDB_REDUCE _mm512_reduce_add_ps
#else
typedef __m256 fdb_vec;
#define FDB_LANES 8
#define FDB_SET1 _mm256_set1_ps
static float FDB_REDUCE(__m256 v) { float t[8]; _mm256_storeu_ps(t, v); return t[0] + t[7]; }
#endif
/* One chain step in asm, so the compiler neither fuses nor reorders the chains. */
#define FDB_FMA(a) __asm__ volatile("vfmadd132ps %1, %2, %0" : "+v"(a) : "v"(x), "v"(y))

/* `iters` rounds of 12 independent FMAs per thread; seconds. */
static double timed_fma(int threads, long iters) {
  double t0 = fdb_now(), total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    fdb_vec x = FDB_SET1(0.999f), y = FDB_SET1(0.001f);
    fdb_vec a0 = FDB_SET1(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0,
            a10 = a0, a11 = a0;
    for (long i = 0; i < iters; i++) {
      FDB_FMA(a0); FDB_FMA(a1); FDB_FMA(a2); FDB_FMA(a3); FDB_FMA(a4); FDB_FMA(a5);
      FDB_FMA(a6); FDB_FMA(a7); FDB_FMA(a8); FDB_FMA(a9); FDB_FMA(a10); FDB_FMA(a11);
    }
    total = FDB_REDUCE(a0) + FDB_REDUCE(a5) + FDB_REDUCE(a11);
  }
  double dt = fdb_now() - t0;
  fdb_sink = total;
  return dt;
}

double fdb_fma_gfmas(int threads, int reps) {
  if (threads <= 0) threads = omp_get_max_threads();
  const long iters = 4000000;                  /* about 15 ms per repetition at 3.5 GHz */
  double best = 1e30;
  timed_fma(threads, iters / 8);                /* warm-up: threads started, clocks up */
  for (int r = 0; r < reps; r++) {
    double dt = timed_fma(threads, iters);
    if (dt < best) best = dt;
  }
  return (double)iters * 12 * FDB_LANES * threads / best * 1e-9;
}
#else
double fdb_fma_gfmas(int threads, int reps) { (void)threads; (void)reps; return 0; }
#endif

/* The dot-product probes: AVX512-BF16 vdpbf16ps (32 bf16 multiply-adds per zmm
   instruction into 16 f32 sums) and AVX512-VNNI vpdpbusd (64 u8 x s8
   multiply-adds per zmm instruction into 16 int32 sums), 12 independent
   accumulator chains per thread like the FMA probe. Each body is compiled for
   its target only (function attribute, asm chain steps) and run only where
   CPUID and XGETBV say the CPU and the OS have it; elsewhere the rate is -1. */
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* 1 when CPUID reports leaf/subleaf register bit (reg 0 eax .. 3 edx). */
static int cpuid_bit(unsigned leaf, unsigned sub, int reg, int bit) {
  unsigned r[4] = { 0, 0, 0, 0 };
  if (__get_cpuid_max(0, NULL) < leaf) return 0;
  __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
  return (int)((r[reg] >> bit) & 1u);
}

/* AVX-512F with the zmm state saved by the OS (XCR0 bits 1, 2, 5, 6, 7). */
static int has_avx512_state(void) {
  if (!cpuid_bit(1, 0, 2, 27) || !cpuid_bit(7, 0, 1, 16)) return 0;   /* OSXSAVE, AVX512F */
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  (void)hi;
  return (lo & 0xe6u) == 0xe6u;
}

int fdb_has_bf16_dot(void) { return has_avx512_state() && cpuid_bit(7, 1, 0, 5); }    /* AVX512_BF16 */
int fdb_has_int8_dot(void) { return has_avx512_state() && cpuid_bit(7, 0, 2, 11); }   /* AVX512_VNNI */

#define FDB_DOT(ins, a) __asm__ volatile(ins " %2, %1, %0" : "+v"(a) : "v"(x), "v"(y))
#define FDB_DOT12(ins)                                                                  \
  for (long i = 0; i < iters; i++) {                                                    \
    FDB_DOT(ins, a0); FDB_DOT(ins, a1); FDB_DOT(ins, a2); FDB_DOT(ins, a3);             \
    FDB_DOT(ins, a4); FDB_DOT(ins, a5); FDB_DOT(ins, a6); FDB_DOT(ins, a7);             \
    FDB_DOT(ins, a8); FDB_DOT(ins, a9); FDB_DOT(ins, a10); FDB_DOT(ins, a11);           \
  }

/* One thread's `iters` rounds of 12 vdpbf16ps; a sum of the accumulators. */
__attribute__((target("avx512f"), noinline)) static double bf16_body(long iters) {
  __m512i x = _mm512_set1_epi32(0x3a833a83), y = x;            /* bf16 pairs of ~0.001 */
  __m512 a0 = _mm512_set1_ps(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0,
         a9 = a0, a10 = a0, a11 = a0;
  FDB_DOT12("vdpbf16ps")
  return _mm512_reduce_add_ps(a0) + _mm512_reduce_add_ps(a5) + _mm512_reduce_add_ps(a11);
}

/* One thread's `iters` rounds of 12 vpdpbusd; a sum of the accumulators. */
__attribute__((target("avx512f"), noinline)) static double int8_body(long iters) {
  __m512i x = _mm512_set1_epi32(0x01010101), y = x;
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0,
          a8 = a0, a9 = a0, a10 = a0, a11 = a0;
  FDB_DOT12("vpdpbusd")
  return (double)_mm512_reduce_add_epi32(a0) + _mm512_reduce_add_epi32(a5) + _mm512_reduce_add_epi32(a11);
}

/* Seconds for `threads` threads each running body(iters). */
static double timed_body(int threads, long iters, double (*body)(long)) {
  double t0 = fdb_now(), total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  total += body(iters);
  double dt = fdb_now() - t0;
  fdb_sink = total;
  return dt;
}

/* Best-of-reps rate in G multiply-adds/s of body, `per_ins` multiply-adds per instruction. */
static double body_rate(int threads, int reps, double (*body)(long), int per_ins) {
  if (threads <= 0) threads = omp_get_max_threads();
  const long iters = 4000000;
  double best = 1e30;
  timed_body(threads, iters / 8, body);        /* warm-up: threads started, clocks up */
  for (int r = 0; r < reps; r++) {
    double dt = timed_body(threads, iters, body);
    if (dt < best) best = dt;
  }
  return (double)iters * 12 * per_ins * threads / best * 1e-9;
}

int fdb_has_int16_madd(void) { return __builtin_cpu_supports("avx2") != 0; }

/* One vpmaddwd of x and y into t and its vpaddd into chain a (the AVX2 MSD
   scores' step, gen/simd.lua msd16_group). */
#define FDB_MADD(a) __asm__ volatile("vpmaddwd %3, %2, %1\n\tvpaddd %1, %0, %0" : "+x"(a), "=&x"(t) : "x"(x), "x"(y))

/* One thread's `iters` rounds of 12 (vpmaddwd, vpaddd) pairs; a sum of the accumulators. */
__attribute__((target("avx2"), noinline)) static double int16_body(long iters) {
  __m256i x = _mm256_set1_epi16(3), y = x, t;
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0,
          a9 = a0, a10 = a0, a11 = a0;
  for (long i = 0; i < iters; i++) {
    FDB_MADD(a0); FDB_MADD(a1); FDB_MADD(a2); FDB_MADD(a3); FDB_MADD(a4); FDB_MADD(a5);
    FDB_MADD(a6); FDB_MADD(a7); FDB_MADD(a8); FDB_MADD(a9); FDB_MADD(a10); FDB_MADD(a11);
  }
  __m256i s = _mm256_add_epi32(_mm256_add_epi32(a0, a5), a11);
  return (double)_mm256_extract_epi32(s, 0);
}

double fdb_int16_gmadds(int threads, int reps) {
  return fdb_has_int16_madd() ? body_rate(threads, reps, int16_body, 16) : -1;
}

double fdb_bf16_gdots(int threads, int reps) {
  return fdb_has_bf16_dot() ? body_rate(threads, reps, bf16_body, 32) : -1;
}
double fdb_int8_gdots(int threads, int reps) {
  return fdb_has_int8_dot() ? body_rate(threads, reps, int8_body, 64) : -1;
}
#else
int fdb_has_bf16_dot(void) { return 0; }
int fdb_has_int8_dot(void) { return 0; }
double fdb_bf16_gdots(int threads, int reps) { (void)threads; (void)reps; return -1; }
double fdb_int8_gdots(int threads, int reps) { (void)threads; (void)reps; return -1; }
int fdb_has_int16_madd(void) { return 0; }
double fdb_int16_gmadds(int threads, int reps) { (void)threads; (void)reps; return -1; }
#endif

/* f32 lanes of the FMA probe's vector (16 zmm, 8 ymm, 0 without FMA). */
int fdb_fma_lanes(void) {
#if defined(__AVX512F__)
  return 16;
#elif defined(__FMA__)
  return 8;
#else
  return 0;
#endif
}

/* Fill the buffer from the threads that will read it (first touch). */
static void first_touch(float *buf, size_t n, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (size_t i = 0; i < n; i++) buf[i] = (float)(i & 7) * 0.125f;
}

/* n floats cut to a whole number of 64-float blocks per thread. */
static size_t whole_blocks(size_t n, int threads) {
  size_t per = 64u * (size_t)threads;
  return n / per * per;
}

double fdb_read_bw_gbs(size_t bytes, int threads, int reps) {
  if (threads <= 0) threads = omp_get_max_threads();
  size_t n = whole_blocks(bytes / sizeof(float), threads);
  if (n == 0 || reps < 1) return 0;
  float *buf = fdb_alloc(n * sizeof(float));
  if (!buf) return 0;
  first_touch(buf, n, threads);
  double one = timed_sum(buf, n, threads, 1);    /* warm-up, and the pass count */
  int passes = one >= 0.02 ? 1 : (int)(0.02 / (one > 1e-7 ? one : 1e-7)) + 1;
  double best = 1e30;
  for (int r = 0; r < reps; r++) {
    double dt = timed_sum(buf, n, threads, passes) / passes;
    if (dt < best) best = dt;
  }
  free(buf);
  return (double)(n * sizeof(float)) / best * 1e-9;
}

/* One timed read pass over a buffer of fdb_flush_bytes() with `threads`
   threads, in GB/s: the bandwidth sample taken next to each cold call. The
   buffer is allocated and first-touched on the first call (`threads` reading
   it thereafter) and kept until exit; 0 when it cannot be allocated. */
double fdb_call_bw_gbs(int threads) {
  static float *buf;
  static size_t n;
  if (threads <= 0) threads = omp_get_max_threads();
  if (!buf) {
    n = fdb_flush_bytes() / sizeof(float);
    buf = fdb_alloc(n * sizeof(float));
    if (!buf) return 0;
    first_touch(buf, n, threads);
  }
  size_t m = whole_blocks(n, threads);
  double dt = timed_sum(buf, m, threads, 1);
  return dt > 0 ? (double)(m * sizeof(float)) / dt * 1e-9 : 0;
}

/* Size in bytes of the highest cache level in sysfs ("32768K"), or 0. */
static size_t sysfs_llc(void) {
  size_t best = 0;
  int best_level = 0;
  for (int i = 0; i < 16; i++) {
    char path[96], buf[32];
    int level = 0;
    size_t kb = 0;
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
    FILE *f = fopen(path, "r");
    if (!f) break;
    if (fscanf(f, "%d", &level) != 1) level = 0;
    fclose(f);
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
    if (!(f = fopen(path, "r"))) continue;
    if (fgets(buf, sizeof buf, f)) kb = strtoull(buf, NULL, 10) * (strchr(buf, 'M') ? 1024 : 1);
    fclose(f);
    if (level >= best_level && kb) { best_level = level; best = kb * 1024; }
  }
  return best;
}

/* Last-level cache bytes: sysfs (sysconf over-reports under some hypervisors),
   then sysconf, else 32 MiB. */
static size_t llc_bytes(void) {
  size_t s = sysfs_llc();
  if (s) return s;
  long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  long c = l3 > 0 ? l3 : l2;
  return c > 0 ? (size_t)c : (size_t)32 << 20;
}

/* Size of the last-level cache in bytes (sysfs first). */
size_t fdb_llc_bytes(void) { return llc_bytes(); }

/* $FDB_FLUSH_MIB as a whole positive number of MiB, or 0 when unset or not one. */
static size_t flush_mib_env(void) {
  const char *e = getenv("FDB_FLUSH_MIB");
  char *end;
  if (!e || *e < '1' || *e > '9') return 0;
  errno = 0;
  unsigned long long mib = strtoull(e, &end, 10);
  return errno || *end || mib > (SIZE_MAX >> 20) ? 0 : (size_t)mib;
}

size_t fdb_flush_bytes(void) {
  size_t mib = flush_mib_env();
  if (mib) return mib << 20;
  size_t b = 4 * llc_bytes(), lo = (size_t)128 << 20, hi = (size_t)1 << 30;
  return b < lo ? lo : b > hi ? hi : b;
}

/* 1 when $FDB_FLUSH is "write" (the flush dirties every line), else 0. */
static int flush_writes(void) {
  const char *e = getenv("FDB_FLUSH");
  return e && strcmp(e, "write") == 0;
}

int fdb_flush_caches(void) {
  static uint64_t *buf;
  static size_t n;
  static int writes;
  if (!buf) {
    n = fdb_flush_bytes() / sizeof(uint64_t);
    buf = fdb_alloc(n * sizeof(uint64_t));
    if (!buf) return -1;
    writes = flush_writes();
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) buf[i] = i;  /* written once, by the threads that read it */
  }
  size_t lines = n / 8;
  if (writes) {                                  /* one write per 64-byte line dirties it */
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < lines; i++) buf[i * 8] += i;
    return 0;
  }
  uint64_t sum = 0;                              /* one read per line: clean lines */
#pragma omp parallel for schedule(static) reduction(+ : sum)
  for (size_t i = 0; i < lines; i++) sum += buf[i * 8];
  fdb_sink = (double)sum;
  return 0;
}
