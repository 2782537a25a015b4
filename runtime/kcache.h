/* The kernel cache: tiling key -> compiled kernel, filled on first use,
   reference-counted by the plans that use each kernel, optionally bounded. */
#ifndef FD_KCACHE_H
#define FD_KCACHE_H
#include "fd_abi.h"
#include <stddef.h>

typedef struct fd_kcache fd_kcache;

/* A cache compiling with backend (0 tcc, 1 cc; cc falls back to tcc, with
   fd_kcache_warning, when no compiler runs or cache_dir cannot be used),
   holding at most max_kernels kernels (0 = no bound): the least recently
   used kernel with no reference is evicted to make room;
   kernels with references are never evicted, so the count may exceed the
   bound while live plans use more kernels than that. */
fd_kcache *fd_kcache_create(int backend, const char *cache_dir, int max_kernels);
/* The kernel of key with one more reference, generated and compiled on first
   use (adding the time to *compile_ms and one to *compiled); NULL with err.
   Thread-safe. */
const fd_kernel_desc *fd_kcache_get(fd_kcache *c, const char *key, double *compile_ms, int *compiled,
                                    char *err, size_t errlen);
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
/* Free every compiled kernel. */
void fd_kcache_destroy(fd_kcache *c);

#endif
