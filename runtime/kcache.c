/* Kernel cache by tiling key. One mutex guards the table, the embedded Lua
   generator and compilation (libtcc serializes compiles anyway); lookups
   happen at plan time, never in fd_run. Each fd_kcache_get takes a reference
   that fd_kcache_put gives back (plans hold their kernels this way); with a
   bound, the least recently used kernels nobody references are evicted. */
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
  int refs;                 /* references held by plans (and plans being created) */
  unsigned long long used;  /* the cache's clock at the last fd_kcache_get */
  struct entry *next;       /* hash chain */
} entry;

struct fd_kcache {
  pthread_mutex_t m;
  int backend;
  char *cache_dir;
  fd_gen *gen;
  entry **slot;             /* hash table of chains, n_slots a power of two */
  size_t n_slots, n, max;   /* max: the bound, 0 = none */
  unsigned long long clock;
  char warning[1200];       /* why the cc backend fell back to tcc ("" if it did not) */
};

/* FNV-1a of a key. */
static size_t key_hash(const char *s) {
  size_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

/* Choose the backend: cc falls back to tcc, with c->warning, when no compiler
   runs or its cache directory cannot be created or written. */
static void choose_backend(fd_kcache *c, int backend) {
  char why[1024];
  c->backend = backend;
  if (backend != 1) return;
  if (!fd_cc_version()) snprintf(why, sizeof why, "no C compiler found");
  else if (fd_cc_check_dir(c->cache_dir, why, sizeof why) == 0) return;
  snprintf(c->warning, sizeof c->warning, "warning: cc backend: %s; using tcc", why);
  fprintf(stderr, "flashdecode: %s\n", c->warning);
  c->backend = 0;
}

/* Create an empty cache; see kcache.h. */
fd_kcache *fd_kcache_create(int backend, const char *cache_dir, int max_kernels) {
  fd_kcache *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->n_slots = 64;
  c->slot = calloc(c->n_slots, sizeof *c->slot);
  c->cache_dir = cache_dir ? strdup(cache_dir) : NULL;
  if (!c->slot || (cache_dir && !c->cache_dir)) { free(c->slot); free(c->cache_dir); free(c); return NULL; }
  pthread_mutex_init(&c->m, NULL);
  c->max = max_kernels > 0 ? (size_t)max_kernels : 0;
  choose_backend(c, backend);
  return c;
}

/* The backend in use. */
int fd_kcache_backend(const fd_kcache *c) { return c->backend; }

/* Why cc fell back to tcc, or "". */
const char *fd_kcache_warning(const fd_kcache *c) { return c->warning; }

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

/* Free one entry's compiled code and the entry. */
static void free_entry(entry *e) {
  fd_jit_free(e->jit);
  fd_cc_free(e->cc);
  free(e);
}

/* Generate and compile key into a new entry (NULL with err). */
static entry *compile_locked(fd_kcache *c, const char *key, char *err, size_t errlen) {
  entry *e = calloc(1, sizeof *e);
  if (!e) { snprintf(err, errlen, "out of memory"); return NULL; }
  char *src = generate_locked(c, key, err, errlen);
  if (!src) { free(e); return NULL; }
  char sym[64];
  void *addr = NULL;
  snprintf(sym, sizeof sym, "fd_k%s_desc", key);
  int rc = c->backend == 1 ? fd_cc_compile(src, key, c->cache_dir, sym, &e->cc, &addr, err, errlen)
                           : fd_jit_compile(src, sym, &e->jit, &addr, err, errlen);
  free(src);
  if (rc) { free(e); return NULL; }
  e->desc = addr;
  snprintf(e->key, sizeof e->key, "%s", key);
  if (e->desc->abi_version != FD_ABI_VERSION) {
    snprintf(err, errlen, "kernel %s has ABI %d, the library %d", key, e->desc->abi_version, FD_ABI_VERSION);
    free_entry(e);
    return NULL;
  }
  return e;
}

/* The chain link that holds key (or the chain's end). */
static entry **find_locked(fd_kcache *c, const char *key) {
  entry **l = &c->slot[key_hash(key) & (c->n_slots - 1)];
  while (*l && strcmp((*l)->key, key)) l = &(*l)->next;
  return l;
}

/* Double the hash table when chains get long (keeps the old one on ENOMEM). */
static void grow_locked(fd_kcache *c) {
  if (c->n < 2 * c->n_slots) return;
  size_t n_slots = 2 * c->n_slots;
  entry **slot = calloc(n_slots, sizeof *slot);
  if (!slot) return;
  for (size_t i = 0; i < c->n_slots; i++)
    for (entry *e = c->slot[i], *next; e; e = next) {
      next = e->next;
      size_t h = key_hash(e->key) & (n_slots - 1);
      e->next = slot[h];
      slot[h] = e;
    }
  free(c->slot);
  c->slot = slot;
  c->n_slots = n_slots;
}

/* Evict the least recently used unreferenced kernel; 0 if there is none. */
static int evict_one_locked(fd_kcache *c) {
  entry **victim = NULL;
  for (size_t i = 0; i < c->n_slots; i++)
    for (entry **l = &c->slot[i]; *l; l = &(*l)->next)
      if ((*l)->refs == 0 && (!victim || (*l)->used < (*victim)->used)) victim = l;
  if (!victim) return 0;
  entry *e = *victim;
  *victim = e->next;
  c->n--;
  free_entry(e);
  return 1;
}

/* Evict unreferenced kernels, oldest first, until at most keep remain. */
static void trim_locked(fd_kcache *c, size_t keep) {
  while (c->n > keep && evict_one_locked(c)) {}
}

/* The kernel of key with one more reference, compiled on first use. */
const fd_kernel_desc *fd_kcache_get(fd_kcache *c, const char *key, double *compile_ms, int *compiled,
                                    char *err, size_t errlen) {
  pthread_mutex_lock(&c->m);
  entry **l = find_locked(c, key), *e = *l;
  if (!e) {
    if (c->max) trim_locked(c, c->max - 1);   /* room for the new one */
    double t0 = now_ms();
    e = compile_locked(c, key, err, errlen);
    if (compile_ms) *compile_ms += now_ms() - t0;
    if (e) {
      if (compiled) (*compiled)++;
      l = find_locked(c, key);                 /* the trim may have unlinked the chain's end */
      *l = e;
      c->n++;
      grow_locked(c);
    }
  }
  if (e) { e->refs++; e->used = ++c->clock; }
  pthread_mutex_unlock(&c->m);
  return e ? e->desc : NULL;
}

/* Give back one reference to d (from fd_kcache_get); NULL is ignored. */
void fd_kcache_put(fd_kcache *c, const fd_kernel_desc *d) {
  if (!d) return;
  pthread_mutex_lock(&c->m);
  entry *e = *find_locked(c, d->key);
  if (e && e->desc == d && e->refs > 0) e->refs--;
  if (c->max) trim_locked(c, c->max);          /* kernels freed by plans leave a cache above its bound */
  pthread_mutex_unlock(&c->m);
}

/* Evict every kernel nobody references. */
void fd_kcache_trim(fd_kcache *c) {
  pthread_mutex_lock(&c->m);
  trim_locked(c, 0);
  pthread_mutex_unlock(&c->m);
}

/* The number of cached kernels. */
size_t fd_kcache_count(fd_kcache *c) {
  pthread_mutex_lock(&c->m);
  size_t n = c->n;
  pthread_mutex_unlock(&c->m);
  return n;
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
  for (size_t i = 0; i < c->n_slots; i++)
    for (entry *e = c->slot[i], *next; e; e = next) { next = e->next; free_entry(e); }
  fd_gen_free(c->gen);
  pthread_mutex_destroy(&c->m);
  free(c->slot);
  free(c->cache_dir);
  free(c);
}
