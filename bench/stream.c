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
enum { STREAM_CHUNK = 256, STREAM_AHEAD = 4096, STREAM_ACCS = 12 };

static volatile float stream_sink;

#if defined(__AVX512F__)
/* Element i*16.. of a row of dtype dt at p as 16 f32 lanes. */
static inline __attribute__((always_inline)) __m512 widen(const char *p, int dt, long i) {
  if (dt == 0) return _mm512_loadu_ps((const float *)p + i);
  __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
  if (dt == 1) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* n bytes of one stream at p (whole 64-byte lines): every vector widened and
   fed to G FMAs (G = 0: one add) into acc, chain (vector * G + j) mod 12;
   the lookahead runs on into next, the block read after this one. */
static inline __attribute__((always_inline)) void stream_block(const char *p, const char *next, long n, int dt,
                                                              int G, __m512 *acc, const __m512 *q) {
  const int per_line = dt == 0 ? 1 : 2;
  for (long off = 0; off < n; off += 64) {
    long ahead = off + STREAM_AHEAD;
    _mm_prefetch(ahead < n ? p + ahead : next + (ahead - n), _MM_HINT_T0);
    for (int u = 0; u < per_line; u++) {
      __m512 x = widen(p + off, dt, 16 * u);
      if (G == 0) acc[u] = _mm512_add_ps(acc[u], x);
      for (int j = 0; j < G; j++) {
        int c = (u * G + j) % STREAM_ACCS;
        acc[c] = _mm512_fmadd_ps(x, q[j], acc[c]);
      }
    }
  }
}

/* One thread's heads [h0, h1): chunks of K then V, as a kernel walks them. */
static inline __attribute__((always_inline)) float stream_heads(const char *k, const char *v, long h0, long h1,
                                                               long keys, int D, int dt, int G) {
  const long row = (long)D * (dt == 0 ? 4 : 2), per_head = keys * row;
  __m512 acc[STREAM_ACCS], q[16];
  for (int c = 0; c < STREAM_ACCS; c++) acc[c] = _mm512_setzero_ps();
  for (int j = 0; j < 16; j++) q[j] = _mm512_set1_ps(1.0f / (float)(j + 2));   /* the g multipliers */
  for (long h = h0; h < h1; h++) {
    for (long s = 0; s < keys; s += STREAM_CHUNK) {
      long n = (keys - s < STREAM_CHUNK ? keys - s : STREAM_CHUNK) * row;
      const char *kc = k + h * per_head + s * row, *vc = v + h * per_head + s * row;
      /* after V: the next chunk's K (the next head's first one at a head's end) */
      stream_block(kc, vc, n, dt, G, acc, q);
      stream_block(vc, kc + n, n, dt, G, acc, q);
    }
  }
  __m512 t = acc[0];
  for (int c = 1; c < STREAM_ACCS; c++) t = _mm512_add_ps(t, acc[c]);
  return _mm512_reduce_add_ps(t);
}

/* The body for one (dtype, g): each a constant, so the loops unroll. */
#define STREAM_BODY(DT, G) \
  static float body_##DT##_##G(const char *k, const char *v, long h0, long h1, long keys, int D) { \
    return stream_heads(k, v, h0, h1, keys, D, DT, G); }
#define STREAM_BODIES(DT) STREAM_BODY(DT, 0) STREAM_BODY(DT, 1) STREAM_BODY(DT, 2) STREAM_BODY(DT, 4) \
  STREAM_BODY(DT, 8) STREAM_BODY(DT, 16)
STREAM_BODIES(0)
STREAM_BODIES(1)
STREAM_BODIES(2)

typedef float (*stream_fn)(const char *, const char *, long, long, long, int);

/* The table of bodies: [dtype][index of g in 0, 1, 2, 4, 8, 16]. */
static const stream_fn BODIES[3][6] = {
  { body_0_0, body_0_1, body_0_2, body_0_4, body_0_8, body_0_16 },
  { body_1_0, body_1_1, body_1_2, body_1_4, body_1_8, body_1_16 },
  { body_2_0, body_2_1, body_2_2, body_2_4, body_2_8, body_2_16 },
};

/* The body for dtype and g, or NULL. */
static stream_fn body_for(int dtype, int g) {
  static const int GS[6] = { 0, 1, 2, 4, 8, 16 };
  if (dtype < 0 || dtype > 2) return 0;
  for (int i = 0; i < 6; i++)
    if (GS[i] == g) return BODIES[dtype][i];
  return 0;
}

int fdb_stream_fma(const void *k, const void *v, long heads, long keys, int head_dim, int dtype, int g,
                   int threads, double *sum) {
  stream_fn fn = body_for(dtype, g);
  if (!fn || heads < 1 || keys < 1 || head_dim < 32 || head_dim % 32) return -1;
  if (threads <= 0) threads = omp_get_max_threads();
  double total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    long t = omp_get_thread_num(), nt = omp_get_num_threads();
    long h0 = heads * t / nt, h1 = heads * (t + 1) / nt;
    if (h1 > h0) total += fn((const char *)k, (const char *)v, h0, h1, keys, head_dim);
  }
  stream_sink = (float)total;
  if (sum) *sum = total;
  return 0;
}
#else
int fdb_stream_fma(const void *k, const void *v, long heads, long keys, int head_dim, int dtype, int g,
                   int threads, double *sum) {
  (void)k; (void)v; (void)heads; (void)keys; (void)head_dim; (void)dtype; (void)g; (void)threads; (void)sum;
  return -1;
}
#endif
