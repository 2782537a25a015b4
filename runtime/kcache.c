/* Kernel cache by tiling key. One mutex guards the table, the embedded Lua
   generator and compilation (libtcc serializes compiles anyway); lookups
   happen at plan time, never in fd_run. */
#include "kcache.h"
#include "cc.h"
#include "jit.h"
#include "luagen.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct entry {
  char key[24];
  const fd_kernel_desc *desc;
  fd_jit_unit *jit;
  fd_cc_unit *cc;
} entry;

struct fd_kcache {
  pthread_mutex_t m;
  int backend;
  char *cache_dir;
  fd_gen *gen;
  entry *e;
  size_t n, cap;
};

/* Create an empty cache; the cc backend falls back to tcc when no compiler runs. */
fd_kcache *fd_kcache_create(int backend, const char *cache_dir) {
  fd_kcache *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  pthread_mutex_init(&c->m, NULL);
  c->backend = backend;
  if (backend == 1 && !fd_cc_version()) {
    fprintf(stderr, "flashdecode: warning: cc backend: no C compiler found; using tcc\n");
    c->backend = 0;
  }
  c->cache_dir = cache_dir ? strdup(cache_dir) : NULL;
  return c;
}

/* The backend in use. */
int fd_kcache_backend(const fd_kcache *c) { return c->backend; }

/* Monotonic milliseconds. */
static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Generate source under the lock (the Lua state is single-threaded). */
static char *generate_locked(fd_kcache *c, const char *key, char *err, size_t errlen) {
  if (!c->gen && !(c->gen = fd_gen_new(err, errlen))) return NULL;
  char *src;
  return fd_gen_source(c->gen, key, &src, err, errlen) ? NULL : src;
}

/* Generate and compile key into a new entry; -1 with err. */
static int compile_locked(fd_kcache *c, const char *key, entry *out, char *err, size_t errlen) {
  char *src = generate_locked(c, key, err, errlen);
  if (!src) return -1;
  char sym[64];
  void *addr = NULL;
  snprintf(sym, sizeof sym, "fd_k%s_desc", key);
  memset(out, 0, sizeof *out);
  int rc = c->backend == 1 ? fd_cc_compile(src, key, c->cache_dir, sym, &out->cc, &addr, err, errlen)
                           : fd_jit_compile(src, sym, &out->jit, &addr, err, errlen);
  free(src);
  if (rc) return -1;
  out->desc = addr;
  snprintf(out->key, sizeof out->key, "%s", key);
  if (out->desc->abi_version != FD_ABI_VERSION) {
    snprintf(err, errlen, "kernel %s has ABI %d, the library %d", key, out->desc->abi_version, FD_ABI_VERSION);
    fd_jit_free(out->jit); fd_cc_free(out->cc);
    return -1;
  }
  return 0;
}

/* The kernel of key, compiled on first use. */
const fd_kernel_desc *fd_kcache_get(fd_kcache *c, const char *key, double *compile_ms, int *compiled,
                                    char *err, size_t errlen) {
  const fd_kernel_desc *d = NULL;
  pthread_mutex_lock(&c->m);
  for (size_t i = 0; i < c->n && !d; i++) if (!strcmp(c->e[i].key, key)) d = c->e[i].desc;
  if (!d && c->n == c->cap) {
    size_t cap = c->cap ? 2 * c->cap : 32;
    entry *e = realloc(c->e, cap * sizeof *e);
    if (e) { c->e = e; c->cap = cap; }
  }
  if (!d && c->n < c->cap) {
    double t0 = now_ms();
    if (compile_locked(c, key, &c->e[c->n], err, errlen) == 0) d = c->e[c->n++].desc;
    if (compile_ms) *compile_ms += now_ms() - t0;
    if (compiled && d) (*compiled)++;
  } else if (!d) {
    snprintf(err, errlen, "out of memory");
  }
  pthread_mutex_unlock(&c->m);
  return d;
}

/* The generated source of key. */
char *fd_kcache_source(fd_kcache *c, const char *key, char *err, size_t errlen) {
  pthread_mutex_lock(&c->m);
  char *src = generate_locked(c, key, err, errlen);
  pthread_mutex_unlock(&c->m);
  return src;
}

/* Free every kernel, the generator and the cache. */
void fd_kcache_destroy(fd_kcache *c) {
  if (!c) return;
  for (size_t i = 0; i < c->n; i++) { fd_jit_free(c->e[i].jit); fd_cc_free(c->e[i].cc); }
  fd_gen_free(c->gen);
  pthread_mutex_destroy(&c->m);
  free(c->e);
  free(c->cache_dir);
  free(c);
}
