/* Helpers of the benchmark drivers; see util.h. */
#include "util.h"
#include "dtype.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* splitmix64 finalizer: a well-mixed hash of x. */
static inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void fdb_fill(void *buf, size_t n, int dtype, uint64_t seed, float lo, float hi) {
  uint64_t base = mix64(seed);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) {
    float u = (float)(mix64(base ^ i) >> 40) * 0x1p-24f;
    fdb_store(dtype, buf, i, lo + (hi - lo) * u);
  }
}

void fdb_fill_i8(void *buf, size_t n, uint64_t seed) {
  uint64_t base = mix64(seed);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) ((int8_t *)buf)[i] = (int8_t)(mix64(base ^ i) >> 56);
}

void fdb_fill_blocks(void *buf, size_t n, int block_bytes, uint64_t seed) {
  uint64_t base = mix64(seed);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) {
    uint8_t *b = (uint8_t *)buf + i * (size_t)block_bytes;
    uint64_t h = mix64(base ^ i);
    uint16_t d = fdb_f32_to_f16(0.005f + 0.015f * (float)(h >> 40) * 0x1p-24f);
    b[0] = (uint8_t)(d & 255); b[1] = (uint8_t)(d >> 8);
    for (int j = 2; j < block_bytes; j++, h >>= 8) {
      if (j % 8 == 2) h = mix64(base ^ i ^ ((uint64_t)j << 48));
      b[j] = (uint8_t)h;
    }
  }
}

double fdb_max_abs_diff(const void *a, int adt, const void *b, int bdt, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)fdb_load(adt, a, i) - (double)fdb_load(bdt, b, i));
    if (d != d) return NAN;
    if (d > m) m = d;
  }
  return m;
}

double fdb_max_abs(const void *a, int dt, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) {
    double x = fabs((double)fdb_load(dt, a, i));
    if (x != x) return NAN;
    if (x > m) m = x;
  }
  return m;
}

int fdb_hugepages(void) {
  const char *e = getenv("FDB_HUGEPAGES");
  return !(e && e[0] == '0');
}

void *fdb_alloc(size_t bytes) {
  size_t align = bytes >= ((size_t)4 << 20) ? (size_t)2 << 20 : 64;
  size_t n = (bytes + align - 1) / align * align;
  unsigned char *p = aligned_alloc(align, n ? n : align);
  if (!p) return NULL;
  if (align > 64 && fdb_hugepages()) madvise(p, n, MADV_HUGEPAGE);   /* a hint; failure is fine */
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i += 4096) for (size_t j = i; j < i + 4096 && j < n; j++) p[j] = 0;
  return p;
}

/* Ascending doubles, for qsort. */
int fdb_by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Allocate and fill the buffers of a decode call (util.h). */
int fdb_rowbufs_fill(fdb_rowbufs *m, int batch, int hq, int hkv, int d, long len, int kv_dtype) {
  int i8 = kv_dtype == FD_I8, block = fdb_block_bytes(kv_dtype);
  size_t rows = (size_t)batch * hkv * len, kv = rows * d, qn = (size_t)batch * hq * d;
  size_t kv_bytes = block ? kv / FDB_QK * block : i8 ? kv : 2 * kv;
  *m = (fdb_rowbufs){ .k = fdb_alloc(kv_bytes), .v = fdb_alloc(kv_bytes), .q = fdb_alloc(2 * qn),
                      .out = fdb_alloc(2 * qn), .ks = i8 ? fdb_alloc(4 * rows) : NULL,
                      .vs = i8 ? fdb_alloc(4 * rows) : NULL, .pos = malloc(sizeof *m->pos * batch) };
  if (!m->k || !m->v || !m->q || !m->out || !m->pos || (i8 && (!m->ks || !m->vs))) return 1;
  if (i8) {
    fdb_fill_i8(m->k, kv, 1); fdb_fill_i8(m->v, kv, 2);
    fdb_fill(m->ks, rows, 0, 4, 0.005f, 0.02f); fdb_fill(m->vs, rows, 0, 5, 0.005f, 0.02f);
  } else if (block) {
    fdb_fill_blocks(m->k, kv / FDB_QK, block, 1); fdb_fill_blocks(m->v, kv / FDB_QK, block, 2);
  } else {
    fdb_fill(m->k, kv, 2, 1, -1, 1); fdb_fill(m->v, kv, 2, 2, -1, 1);
  }
  fdb_fill(m->q, qn, 2, 3, -1, 1);
  for (int b = 0; b < batch; b++) m->pos[b] = (int32_t)(len - 1);
  return 0;
}

/* Free what fdb_rowbufs_fill allocated. */
void fdb_rowbufs_free(fdb_rowbufs *m) {
  free(m->k); free(m->v); free(m->q); free(m->out); free(m->ks); free(m->vs); free(m->pos);
}

/* Run this program again with OMP_WAIT_POLICY=passive unless it is set so (util.h). */
void fdb_passive_openmp(char **argv, const char *name) {
  const char *w = getenv("OMP_WAIT_POLICY");
  if (w && !strcmp(w, "passive")) return;
  setenv("OMP_WAIT_POLICY", "passive", 1);
  execv("/proc/self/exe", argv);
  fprintf(stderr, "%s: run again with OMP_WAIT_POLICY=passive: %s\n", name, strerror(errno));
}
