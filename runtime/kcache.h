/* The kernel cache: tiling key -> compiled kernel, filled on first use. */
#ifndef FD_KCACHE_H
#define FD_KCACHE_H
#include "fd_abi.h"
#include <stddef.h>

typedef struct fd_kcache fd_kcache;

/* A cache compiling with backend (0 tcc, 1 cc; cc falls back to tcc with a warning). */
fd_kcache *fd_kcache_create(int backend, const char *cache_dir);
/* The kernel of key, generated and compiled on first use (adding the time to
   *compile_ms and one to *compiled); NULL with err. Thread-safe. */
const fd_kernel_desc *fd_kcache_get(fd_kcache *c, const char *key, double *compile_ms, int *compiled,
                                    char *err, size_t errlen);
/* The generated C source of key (malloc'd); NULL with err. */
char *fd_kcache_source(fd_kcache *c, const char *key, char *err, size_t errlen);
/* The backend actually in use (cc falls back to tcc when no compiler runs). */
int fd_kcache_backend(const fd_kcache *c);
/* Free every compiled kernel. */
void fd_kcache_destroy(fd_kcache *c);

#endif
