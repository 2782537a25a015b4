/* The kernel cache: tiling key -> compiled kernel, filled on first use,
   reference-counted by the plans that use each kernel, optionally bounded.
   Compiled kernels live in one process-wide store shared by every context:
   a key is generated and compiled once per process (per backend and cc
   cache_dir), and a context's cache holds references into the store. */
#ifndef FD_KCACHE_H
#define FD_KCACHE_H
#include "fd_abi.h"
#include <stddef.h>

typedef struct fd_kcache fd_kcache;

/* Kernels no context holds that the process-wide store keeps for the next
   context (least recently released evicted first); max_kernels bounds what
   one context holds, so a process holds at most the contexts' kernels plus these. */
#define FD_SPARE_KERNELS 64

/* One compile's breakdown (fd_kcache_records). */
typedef struct fd_kcache_record {
  char key[24];
  double gen_ms, compile_ms;   /* the embedded Lua generator; tcc or cc */
  size_t src_bytes, byte_text; /* the generated source, and its `.byte ...` text */
  int from_disk;               /* the source was read from the cache directory (gen_ms: the read) */
} fd_kcache_record;

/* A context's cache compiling with backend (0 tcc, 1 cc; cc falls back to tcc, with
   fd_kcache_warning, when no compiler runs or cache_dir cannot be used; tcc
   keeps generated sources in cache_dir, else $FD_CACHE_DIR, when one is set),
   holding at most max_kernels kernels (0 = no bound): the least recently
   used kernel with no reference is evicted to make room;
   kernels with references are never evicted, so the count may exceed the
   bound while live plans use more kernels than that. */
fd_kcache *fd_kcache_create(int backend, const char *cache_dir, int max_kernels);
/* The kernel of key with one more reference, generated and compiled on first
   use in the process (adding the time to *compile_ms and one to *compiled
   only when this call compiled it); NULL with err.
   Thread-safe. */
const fd_kernel_desc *fd_kcache_get(fd_kcache *c, const char *key, double *compile_ms, int *compiled,
                                    char *err, size_t errlen);
/* The process's first compiles (up to max, oldest first) into out; their count.
   *start_ms (if not NULL): the one-time start of the embedded generator. */
int fd_kcache_records(fd_kcache_record *out, int max, double *start_ms);
/* Give back a reference taken by fd_kcache_get (NULL: nothing). */
void fd_kcache_put(fd_kcache *c, const fd_kernel_desc *d);
/* Evict every kernel nobody references. */
void fd_kcache_trim(fd_kcache *c);
/* The number of kernels cached now (for tests). */
size_t fd_kcache_count(fd_kcache *c);
/* The generated C source of key (malloc'd); NULL with err. */
char *fd_kcache_source(fd_kcache *c, const char *key, char *err, size_t errlen);
/* The backend actually in use, and why cc fell back to tcc ("" if it did not). */
int fd_kcache_backend(const fd_kcache *c);
const char *fd_kcache_warning(const fd_kcache *c);
/* Give the cache's kernels back to the store and free the cache. */
void fd_kcache_destroy(fd_kcache *c);

#endif
