/* Helpers for the benchmark drivers: random fill, comparison, buffers, and
   their OpenMP wait policy. */
#ifndef FDB_UTIL_H
#define FDB_UTIL_H
#include <stddef.h>
#include <stdint.h>

/* Fill n elements of dtype (0 f32, 1 f16, 2 bf16) with uniform values in
   [lo, hi), a hash of (seed, index): the same content for any thread count. */
void fdb_fill(void *buf, size_t n, int dtype, uint64_t seed, float lo, float hi);

/* Fill n ggml blocks of block_bytes bytes each (q8_0: 34, q4_0: 18): an f16
   scale uniform in [0.005, 0.02), then random code bytes (every int8 code,
   every pair of nibbles), a hash of (seed, index) as fdb_fill. */
void fdb_fill_blocks(void *buf, size_t n, int block_bytes, uint64_t seed);

/* Fill n int8 codes with every value -128..127, a hash of (seed, index) as fdb_fill. */
void fdb_fill_i8(void *buf, size_t n, uint64_t seed);

/* Largest |a[i] - b[i]| over n elements of dtypes adt and bdt (NaN if any is NaN). */
double fdb_max_abs_diff(const void *a, int adt, const void *b, int bdt, size_t n);

/* Largest |a[i]| over n elements of dtype. */
double fdb_max_abs(const void *a, int dt, size_t n);

/* Zeroed memory, first touched by all OpenMP threads; free() it. 64-byte
   aligned; from 4 MiB up 2 MiB aligned with transparent huge pages requested
   (madvise), unless fdb_hugepages() is 0. */
void *fdb_alloc(size_t bytes);

/* 1 unless $FDB_HUGEPAGES is "0": large buffers (KV cache, bandwidth and flush
   buffers alike) ask for transparent huge pages, as a serving engine would;
   under virtualization 4 KiB pages cost a large share of the read bandwidth. */
int fdb_hugepages(void);

/* Ascending doubles, for qsort. */
int fdb_by_value(const void *a, const void *b);

/* The buffers of a decode call with bf16 q and out: q and out [batch, hq, d],
   K and V [batch, hkv, len, d] bf16, int8 with one float scale per row (ks,
   vs; NULL for the others) or ggml q8_0 / q4_0 blocks, every row's position
   len - 1. */
typedef struct fdb_rowbufs { void *q, *k, *v, *out; float *ks, *vs; int32_t *pos; } fdb_rowbufs;

/* Allocate and fill m (zeroed first) for those sizes, K/V of kv_dtype (an
   fd_dtype: FD_BF16, FD_I8, FD_Q8_0 or FD_Q4_0): fixed seeds, so two tools
   fill alike; 1 on failure (fdb_rowbufs_free still frees what was allocated). */
int fdb_rowbufs_fill(fdb_rowbufs *m, int batch, int hq, int hkv, int d, long len, int kv_dtype);

/* Free what fdb_rowbufs_fill allocated. */
void fdb_rowbufs_free(fdb_rowbufs *m);

/* Run this program again with OMP_WAIT_POLICY=passive unless it is set so:
   idle OpenMP threads spinning after the flush took the pool's cores (the
   kernels ran up to 2x slower on 2 cores). Returns only on failure (said on
   stderr under name). */
void fdb_passive_openmp(char **argv, const char *name);

#endif
