/* The streaming probe (bench/stream.h): K and V read once and widened to f32,
   each vector fed to g FMAs, nothing else. A kernel of the same arithmetic
   that reads in the same order does more than this loop per element, so the
   loop's rate is the reference its rate is set beside (bench/stream.lua
   times both in one run); it is not a bound on other orders. */
#include "stream.h"
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

/* Keys per chunk, and how far ahead each line is prefetched (into L1) along
   the order the blocks are read in: the fastest of 0, 2 and 4 KiB in a sweep
   on the 2-core Xeon (bf16, g 0-8). */
enum { STREAM_CHUNK = 256, STREAM_AHEAD = 4096 };

/* The vector the f32 probe takes: 16 lanes with AVX-512, else 8 with AVX2
   (FMA and F16C); the independent accumulator chains it keeps (12 of the 32
   zmm registers; 8 of the 16 ymm ones, the FMA's latency times its two
   pipes on Zen 3); and what a line of 64 bytes widens to (line_vectors). */
#if defined(__AVX512F__)
#define STREAM_F32 1
#define FV(name) _mm512_##name   /* the intrinsic of this vector width */
typedef __m512 fvec;
enum { STREAM_ACCS = 12 };
static inline __attribute__((always_inline)) float fv_total(fvec a) { return _mm512_reduce_add_ps(a); }

/* The 64 bytes of dtype dt at p as f32 vectors in x (f32: 1; f16, bf16: 2;
   int8 codes, dt 3: 4), their count; one part a line (line_parts). */
static inline __attribute__((always_inline)) int line_parts(int dt) { (void)dt; return 1; }
static inline __attribute__((always_inline)) int line_vectors(const char *p, int dt, int part, fvec *x) {
  (void)part;
  if (dt == 0) { x[0] = _mm512_loadu_ps((const float *)p); return 1; }
  if (dt == 3) {
    for (int u = 0; u < 4; u++)
      x[u] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 16 * u))));
    return 4;
  }
  for (int u = 0; u < 2; u++) {
    __m256i h = _mm256_loadu_si256((const __m256i *)(p + 32 * u));
    x[u] = dt == 1 ? _mm512_cvtph_ps(h) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  return 2;
}
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define STREAM_F32 1
#define STREAM_Q_MEMORY 1   /* the multipliers as the FMAs' memory operands (stream_block) */
#define FV(name) _mm256_##name
typedef __m256 fvec;
enum { STREAM_ACCS = 8 };
static inline __attribute__((always_inline)) float fv_total(fvec a) {
  __m128 t = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  t = _mm_add_ps(t, _mm_movehl_ps(t, t));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

/* The 64 bytes of dtype dt at p as f32 vectors in x, their count: f32 2; f16
   4 (vcvtph2ps of 16 bytes each); bf16 4, each 32 bytes split as the
   kernels read them (the even elements shifted up, the odd ones masked);
   int8 codes (dt 3) in four parts of 16 bytes (line_parts: 2 vectors and
   their FMAs at a time, within the 16 registers), each vector 8 bytes
   sign-extended and converted. */
static inline __attribute__((always_inline)) int line_parts(int dt) { return dt == 3 ? 4 : 1; }
static inline __attribute__((always_inline)) int line_vectors(const char *p, int dt, int part, fvec *x) {
  if (dt == 3) {
    for (int u = 0; u < 2; u++)
      x[u] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 16 * part + 8 * u))));
    return 2;
  }
  if (dt == 0) {
    for (int u = 0; u < 2; u++) x[u] = _mm256_loadu_ps((const float *)p + 8 * u);
    return 2;
  }
  if (dt == 1) {
    for (int u = 0; u < 4; u++) x[u] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * u)));
    return 4;
  }
  const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
  for (int u = 0; u < 2; u++) {
    __m256i h = _mm256_loadu_si256((const __m256i *)(p + 32 * u));
    x[2 * u] = _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
    x[2 * u + 1] = _mm256_castsi256_ps(_mm256_and_si256(h, hi));
  }
  return 4;
}
#endif

#if defined(STREAM_F32)
static inline __attribute__((always_inline)) fvec fv_zero(void) { return FV(setzero_ps)(); }
static inline __attribute__((always_inline)) fvec fv_set(float x) { return FV(set1_ps)(x); }
static inline __attribute__((always_inline)) fvec fv_add(fvec a, fvec b) { return FV(add_ps)(a, b); }
static inline __attribute__((always_inline)) fvec fv_fma(fvec a, fvec b, fvec c) { return FV(fmadd_ps)(a, b, c); }

static volatile float stream_sink;

/* What one probe call reads: K and V (int8: and their row scales ks, vs),
   keys rows of D elements per head. */
typedef struct { const char *k, *v; const float *ks, *vs; long keys; int D; } stream_job;

/* One thread's share of a call: heads [h0, h1), returning its sum. */
typedef double (*stream_fn)(const stream_job *, long h0, long h1);

/* fn over heads split across threads (0 = all), its sums added into *sum. */
static int run_heads(stream_fn fn, const stream_job *j, long heads, int threads, double *sum) {
  if (threads <= 0) threads = omp_get_max_threads();
  double total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    long t = omp_get_thread_num(), nt = omp_get_num_threads();
    long h0 = heads * t / nt, h1 = heads * (t + 1) / nt;
    if (h1 > h0) total += fn(j, h0, h1);
  }
  stream_sink = (float)total;
  if (sum) *sum = total;
  return 0;
}

/* Prefetch (into L1) the line STREAM_AHEAD bytes past offset off of a block
   of n bytes at p, running on into next, the block read after it. */
static inline __attribute__((always_inline)) void prefetch_ahead(const char *p, const char *next, long off, long n) {
  long ahead = off + STREAM_AHEAD;
  _mm_prefetch(ahead < n ? p + ahead : next + (ahead - n), _MM_HINT_T0);
}

/* n bytes of one stream at p (whole 64-byte lines): every vector widened and
   fed to G FMAs (G = 0: one add) into acc, chain (vector * G + j) mod
   STREAM_ACCS; the lookahead runs on into next, the block read after this one. */
static inline __attribute__((always_inline)) void stream_block(const char *p, const char *next, long n, int dt,
                                                              int G, fvec *acc, const fvec *q) {
  for (long off = 0; off < n; off += 64) {
    prefetch_ahead(p, next, off, n);
    for (int part = 0; part < line_parts(dt); part++) {
      fvec x[4];
      int per_part = line_vectors(p + off, dt, part, x);
#pragma GCC unroll 4
      for (int u = 0; u < per_part; u++) {
        /* AVX2: each vector's FMAs read the multipliers from memory, as the
           AVX2 kernels read q: the compiler may not keep them in registers
           across vectors, where it spilled accumulators (the probe's G = 8
           at 42% of the bandwidth on the Zen 3 VM, 57% without the spills) */
        const fvec *qv = q;
#if defined(STREAM_Q_MEMORY)
        __asm__("" : "+r"(qv));
#endif
        if (G == 0) acc[u] = fv_add(acc[u], x[u]);
#pragma GCC unroll 16
        for (int j = 0; j < G; j++) {
          int c = ((part * per_part + u) * G + j) % STREAM_ACCS;
          acc[c] = fv_fma(x[u], qv[j], acc[c]);
        }
      }
    }
  }
}

/* The sum of cnt scales at s (the int8 rows' scales, read once as a kernel reads them). */
static inline __attribute__((always_inline)) double scale_sum(const float *s, long cnt) {
  double t = 0;
  for (long i = 0; i < cnt; i++) t += s[i];
  return t;
}

/* One thread's heads [h0, h1): chunks of K then V, as a kernel walks them
   (int8 codes, dt 3: each chunk's codes, then its rows' scales). */
static inline __attribute__((always_inline)) double stream_heads(const stream_job *j, long h0, long h1, int dt,
                                                                int G) {
  const char *k = j->k, *v = j->v;
  const long keys = j->keys, row = (long)j->D * (dt == 0 ? 4 : dt == 3 ? 1 : 2), per_head = keys * row;
  double scales = 0;
  fvec acc[STREAM_ACCS], q[16];
  for (int c = 0; c < STREAM_ACCS; c++) acc[c] = fv_zero();
  for (int i = 0; i < 16; i++) q[i] = fv_set(1.0f / (float)(i + 2));   /* the g multipliers */
  for (long h = h0; h < h1; h++) {
    for (long s = 0; s < keys; s += STREAM_CHUNK) {
      long n = (keys - s < STREAM_CHUNK ? keys - s : STREAM_CHUNK) * row;
      const char *kc = k + h * per_head + s * row, *vc = v + h * per_head + s * row;
      /* after V: the next chunk's K (the next head's first one at a head's end) */
      stream_block(kc, vc, n, dt, G, acc, q);
      if (dt == 3) scales += scale_sum(j->ks + h * keys + s, n / row);
      stream_block(vc, kc + n, n, dt, G, acc, q);
      if (dt == 3) scales += scale_sum(j->vs + h * keys + s, n / row);
    }
  }
  fvec t = acc[0];
  for (int c = 1; c < STREAM_ACCS; c++) t = fv_add(t, acc[c]);
  return fv_total(t) + scales;
}

/* The body for one (dtype, g): each a constant, so the loops unroll. */
#define STREAM_BODY(DT, G) \
  static double body_##DT##_##G(const stream_job *j, long h0, long h1) { return stream_heads(j, h0, h1, DT, G); }
#define STREAM_BODIES(DT) STREAM_BODY(DT, 0) STREAM_BODY(DT, 1) STREAM_BODY(DT, 2) STREAM_BODY(DT, 4) \
  STREAM_BODY(DT, 8) STREAM_BODY(DT, 16)
STREAM_BODIES(0)
STREAM_BODIES(1)
STREAM_BODIES(2)
STREAM_BODIES(3)

/* The table of bodies: [dtype, 3 for int8 codes][index of g in 0, 1, 2, 4, 8, 16]. */
static const stream_fn BODIES[4][6] = {
  { body_0_0, body_0_1, body_0_2, body_0_4, body_0_8, body_0_16 },
  { body_1_0, body_1_1, body_1_2, body_1_4, body_1_8, body_1_16 },
  { body_2_0, body_2_1, body_2_2, body_2_4, body_2_8, body_2_16 },
  { body_3_0, body_3_1, body_3_2, body_3_4, body_3_8, body_3_16 },
};

/* The body for dtype (3: int8 codes) and g, or NULL. */
static stream_fn body_for(int dtype, int g) {
  static const int GS[6] = { 0, 1, 2, 4, 8, 16 };
  if (dtype < 0 || dtype > 3) return 0;
  for (int i = 0; i < 6; i++)
    if (GS[i] == g) return BODIES[dtype][i];
  return 0;
}

int fdb_stream_fma(const void *k, const void *v, long heads, long keys, int head_dim, int dtype, int g,
                   int threads, double *sum) {
  stream_fn fn = dtype == 3 ? 0 : body_for(dtype, g);
  if (!fn || heads < 1 || keys < 1 || head_dim < 32 || head_dim % 32) return -1;
  stream_job j = { (const char *)k, (const char *)v, 0, 0, keys, head_dim };
  return run_heads(fn, &j, heads, threads, sum);
}

int fdb_stream_fma_i8(const void *k, const void *v, const float *ks, const float *vs, long heads, long keys,
                      int head_dim, int g, int threads, double *sum) {
  stream_fn fn = body_for(3, g);
  if (!fn || !ks || !vs || heads < 1 || keys < 1 || head_dim < 64 || head_dim % 64) return -1;
  stream_job j = { (const char *)k, (const char *)v, ks, vs, keys, head_dim };
  return run_heads(fn, &j, heads, threads, sum);
}
#else
int fdb_stream_fma(const void *k, const void *v, long heads, long keys, int head_dim, int dtype, int g,
                   int threads, double *sum) {
  (void)k; (void)v; (void)heads; (void)keys; (void)head_dim; (void)dtype; (void)g; (void)threads; (void)sum;
  return -1;
}

int fdb_stream_fma_i8(const void *k, const void *v, const float *ks, const float *vs, long heads, long keys,
                      int head_dim, int g, int threads, double *sum) {
  (void)k; (void)v; (void)ks; (void)vs; (void)heads; (void)keys; (void)head_dim; (void)g; (void)threads; (void)sum;
  return -1;
}
#endif

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
/* n bytes of int8 codes at p (whole 64-byte lines): every vector fed to N
   vpdpbusd times ones (N = 0: one vpsadbw into 64-bit sums) into acc; the
   lookahead runs on into next, as stream_block's. */
static inline __attribute__((always_inline)) void dot_block(const char *p, const char *next, long n, int N,
                                                           __m512i *acc) {
  const __m512i ones = _mm512_set1_epi8(1), zero = _mm512_setzero_si512();
  for (long off = 0; off < n; off += 64) {
    prefetch_ahead(p, next, off, n);
    __m512i x = _mm512_loadu_si512((const void *)(p + off));
    if (N == 0) acc[0] = _mm512_add_epi64(acc[0], _mm512_sad_epu8(x, zero));
#pragma GCC unroll 48
    for (int j = 0; j < N; j++) acc[j % STREAM_ACCS] = _mm512_dpbusd_epi32(acc[j % STREAM_ACCS], x, ones);
  }
}

/* cnt scales at s added to the f32 chain *f, 16 at a time (the last ones masked). */
static inline __attribute__((always_inline)) void scale_block(const float *s, long cnt, __m512 *f) {
  for (long i = 0; i < cnt; i += 16) {
    __mmask16 m = cnt - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (cnt - i)) - 1);
    *f = _mm512_add_ps(*f, _mm512_maskz_loadu_ps(m, s + i));
  }
}

/* The sum of every lane of the chains: int32 lanes (N > 0) or 64-bit ones. */
static double dot_total(const __m512i *acc, int N) {
  double t = 0;
  for (int c = 0; c < STREAM_ACCS; c++) {
    if (N == 0) { t += (double)_mm512_reduce_add_epi64(acc[c]); continue; }
    __m512i lo = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(acc[c]));
    __m512i hi = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(acc[c], 1));
    t += (double)_mm512_reduce_add_epi64(_mm512_add_epi64(lo, hi));
  }
  return t;
}

/* One thread's heads [h0, h1): per chunk K codes, K scales, V codes, V scales;
   returns max(N, 1) x the codes' byte sum plus the scales' sum. */
static inline __attribute__((always_inline)) double dot_heads(const stream_job *j, long h0, long h1, int N) {
  const char *k = j->k, *v = j->v;
  const float *ks = j->ks, *vs = j->vs;
  const long keys = j->keys, D = j->D;
  __m512i acc[STREAM_ACCS];
  __m512 f = _mm512_setzero_ps();
  for (int c = 0; c < STREAM_ACCS; c++) acc[c] = _mm512_setzero_si512();
  for (long h = h0; h < h1; h++) {
    for (long s = 0; s < keys; s += STREAM_CHUNK) {
      long rows = keys - s < STREAM_CHUNK ? keys - s : STREAM_CHUNK, n = rows * D, at = h * keys + s;
      const char *kc = k + at * D, *vc = v + at * D;
      for (long o = 0; o < rows * 4; o += 64) {   /* this chunk's scales, for their reads below */
        _mm_prefetch((const char *)(ks + at) + o, _MM_HINT_T0);
        _mm_prefetch((const char *)(vs + at) + o, _MM_HINT_T0);
      }
      dot_block(kc, vc, n, N, acc);
      scale_block(ks + at, rows, &f);
      dot_block(vc, kc + n, n, N, acc);
      scale_block(vs + at, rows, &f);
    }
  }
  return dot_total(acc, N) + (double)_mm512_reduce_add_ps(f);
}

/* The body for one n: a constant, so the loops unroll. */
#define DOT_BODY(N) \
  static double dot_##N(const stream_job *j, long h0, long h1) { return dot_heads(j, h0, h1, N); }
DOT_BODY(0) DOT_BODY(2) DOT_BODY(3) DOT_BODY(4) DOT_BODY(6) DOT_BODY(8) DOT_BODY(12) DOT_BODY(16) DOT_BODY(24)
DOT_BODY(32) DOT_BODY(48)

/* The body for n (0 or G x P, G in 1..16 by powers of 2, P in 2, 3), or NULL. */
static stream_fn dot_for(int n) {
  static const struct { int n; stream_fn fn; } T[] = {
    { 0, dot_0 }, { 2, dot_2 }, { 3, dot_3 }, { 4, dot_4 }, { 6, dot_6 }, { 8, dot_8 }, { 12, dot_12 },
    { 16, dot_16 }, { 24, dot_24 }, { 32, dot_32 }, { 48, dot_48 },
  };
  for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
    if (T[i].n == n) return T[i].fn;
  return 0;
}

int fdb_stream_dot(const void *k, const void *v, const float *ks, const float *vs, long heads, long keys,
                   int head_dim, int n, int threads, double *sum) {
  stream_fn fn = dot_for(n);
  if (!fn || heads < 1 || keys < 1 || head_dim < 64 || head_dim % 64 || !__builtin_cpu_supports("avx512vnni"))
    return -1;
  stream_job j = { (const char *)k, (const char *)v, ks, vs, keys, head_dim };
  return run_heads(fn, &j, heads, threads, sum);
}
#else
int fdb_stream_dot(const void *k, const void *v, const float *ks, const float *vs, long heads, long keys,
                   int head_dim, int n, int threads, double *sum) {
  (void)k; (void)v; (void)ks; (void)vs; (void)heads; (void)keys; (void)head_dim; (void)n; (void)threads; (void)sum;
  return -1;
}
#endif
