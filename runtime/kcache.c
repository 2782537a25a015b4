/* Kernel cache by tiling key, in two levels. The process-wide store holds each
   compiled kernel once per (backend, cc cache_dir, key), shared by every context,
   reference-counted by the context caches that hold it, and keeps up to
   FD_SPARE_KERNELS kernels no context holds (least recently released evicted
   first), so a new context compiles nothing a former one compiled. Each
   context's cache (fd_kcache) maps keys to store kernels with its own plan
   references and its own max_kernels LRU bound, as before the store existed.
   Locks, always taken in this order: a context's c->m, then build_lock (the
   one embedded Lua generator and compilation; libtcc serializes compiles
   anyway), then store_lock (the store's table, held briefly, never while
   compiling). Lookups happen at plan time, never in fd_run. The tcc backend
   also keeps generated sources on disk when a cache directory is configured
   (fd_config.cache_dir or $FD_CACHE_DIR): src-<build hash>-<key>.c, so a new
   process skips the Lua generator for keys an earlier one generated. */
#include "kcache.h"
#include "cc.h"
#include "hash.h"
#include "jit.h"
#include "luagen.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define STORE_SLOTS 1024          /* hash chains of the store (a power of two) */
#define N_RECORDS 1024            /* compile records kept for fd_kcache_records */

/* A compiled kernel of the process-wide store. */
typedef struct unit {
  char *id;                 /* "backend|cache_dir|key" */
  const fd_kernel_desc *desc;
  fd_jit_unit *jit;
  fd_cc_unit *cc;
  int refs;                 /* context caches holding it */
  unsigned long long used;  /* the store's clock when the last context let go */
  struct unit *next;        /* hash chain */
} unit;

static pthread_mutex_t build_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t store_lock = PTHREAD_MUTEX_INITIALIZER;
static fd_gen *shared_gen;                    /* build_lock */
static unit *store[STORE_SLOTS];              /* store_lock, as the fields below */
static size_t store_spare;                    /* units no context holds */
static unsigned long long store_clock;
static fd_kcache_record records[N_RECORDS];   /* build_lock */
static int n_records;
static double gen_start_ms;

/* One key of a context cache: a store unit and the plan references on it. */
typedef struct entry {
  char key[24];
  unit *u;
  int refs;                 /* references held by plans (and plans being created) */
  unsigned long long used;  /* the cache's clock at the last fd_kcache_get */
  struct entry *next;       /* hash chain */
} entry;

struct fd_kcache {
  pthread_mutex_t m;
  int backend;
  char *cache_dir;
  char *src_dir;            /* tcc: where generated sources are kept (NULL: nowhere) */
  entry **slot;             /* hash table of chains, n_slots a power of two */
  size_t n_slots, n, max;   /* max: the bound, 0 = none */
  unsigned long long clock;
  char warning[1200];       /* why the cc backend fell back to tcc ("" if it did not) */
};

/* FNV-1a of a string. */
static size_t key_hash(const char *s) { return (size_t)fd_fnv1a(FD_FNV_START, s, strlen(s)); }

/* Monotonic milliseconds. */
static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* ---- the process-wide store ---- */

/* The store link that holds id (or its chain's end); store_lock held. */
static unit **store_find(const char *id) {
  unit **l = &store[key_hash(id) & (STORE_SLOTS - 1)];
  while (*l && strcmp((*l)->id, id)) l = &(*l)->next;
  return l;
}

/* Free a unit's compiled code and the unit. */
static void unit_free(unit *u) {
  fd_jit_free(u->jit);
  fd_cc_free(u->cc);
  free(u->id);
  free(u);
}

/* Take a context's reference on u; store_lock held. */
static void unit_ref(unit *u) {
  if (u->refs++ == 0) store_spare--;
}

/* Evict the least recently released unit no context holds; store_lock held. */
static void store_evict_one(void) {
  unit **victim = NULL;
  for (size_t i = 0; i < STORE_SLOTS; i++)
    for (unit **l = &store[i]; *l; l = &(*l)->next)
      if ((*l)->refs == 0 && (!victim || (*l)->used < (*victim)->used)) victim = l;
  if (!victim) return;
  unit *u = *victim;
  *victim = u->next;
  store_spare--;
  unit_free(u);
}

/* Give back a context's reference on u; the store keeps it as a spare. */
static void unit_release(unit *u) {
  pthread_mutex_lock(&store_lock);
  if (--u->refs == 0) { store_spare++; u->used = ++store_clock; }
  while (store_spare > FD_SPARE_KERNELS) store_evict_one();
  pthread_mutex_unlock(&store_lock);
}

/* The store unit of id with a new reference, or NULL. */
static unit *store_take(const char *id) {
  pthread_mutex_lock(&store_lock);
  unit *u = *store_find(id);
  if (u) unit_ref(u);
  pthread_mutex_unlock(&store_lock);
  return u;
}

/* Generate key's source with the shared generator, with #line directives or
   without; build_lock held. */
static char *generate_locked(const char *key, int lines, char *err, size_t errlen) {
  if (!shared_gen) {
    double t0 = now_ms();
    if (!(shared_gen = fd_gen_new(err, errlen))) return NULL;
    gen_start_ms = now_ms() - t0;
  }
  char *src;
  return fd_gen_source_lines(shared_gen, key, lines, &src, err, errlen) ? NULL : src;
}

/* Record one compile's breakdown (bytes of `.byte` text counted by line); build_lock held. */
static void record(const char *key, const char *src, int from_disk, double gen_ms, double cc_ms) {
  if (n_records >= N_RECORDS) return;
  fd_kcache_record *r = &records[n_records++];
  r->from_disk = from_disk;
  snprintf(r->key, sizeof r->key, "%s", key);
  r->gen_ms = gen_ms;
  r->compile_ms = cc_ms;
  r->src_bytes = strlen(src);
  r->byte_text = 0;
  for (const char *p = strstr(src, ".byte "); p; p = strstr(p + 1, ".byte ")) {
    const char *e = strchr(p, '"');
    r->byte_text += e ? (size_t)(e - p) : strlen(p);
  }
}

/* The path of key's kept source in dir. */
static void src_path(char *buf, size_t len, const char *dir, const char *key) {
  snprintf(buf, len, "%s/src-%s-%s.c", dir, fd_gen_template_hash(), key);
}

/* The line that ends a kept source: FNV-1a of every byte before it, so that
   a file edited, cut short or mixed up since it was written is not compiled
   (it is generated and written again). A check against accidents, not an
   attacker: one who can write the directory can write this line too. */
#define KEPT_CHECK "\n/* flashdecode kept source: FNV-1a of the text above %016llx */\n"
#define KEPT_CHECK_LEN (sizeof KEPT_CHECK - 1 + 16 - 7)   /* %016llx: 16 digits for its 7 characters */

/* The check line of the n bytes at src into line (KEPT_CHECK_LEN + 1 bytes). */
static void kept_check(char *line, const char *src, size_t n) {
  snprintf(line, KEPT_CHECK_LEN + 1, KEPT_CHECK, (unsigned long long)fd_fnv1a(FD_FNV_START, src, n));
}

/* Key's source kept in dir (malloc'd, without its check line), or NULL when
   there is none or its check line does not match it. */
static char *src_read(const char *dir, const char *key) {
  char path[1200], line[KEPT_CHECK_LEN + 1];
  src_path(path, sizeof path, dir, key);
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *src = NULL;
  long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
  if (n > (long)KEPT_CHECK_LEN && fseek(f, 0, SEEK_SET) == 0 && (src = malloc((size_t)n + 1)) &&
      fread(src, 1, (size_t)n, f) == (size_t)n) {
    size_t body = (size_t)n - KEPT_CHECK_LEN;
    kept_check(line, src, body);
    if (memcmp(src + body, line, KEPT_CHECK_LEN) == 0) src[body] = 0;
    else { free(src); src = NULL; }
  } else { free(src); src = NULL; }
  fclose(f);
  return src;
}

/* Keep key's source in dir with its check line (written aside, then renamed:
   readers never see half a file). */
static void src_write(const char *dir, const char *key, const char *src) {
  char path[1200], tmp[1300];
  src_path(path, sizeof path, dir, key);
  snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f) return;
  char line[KEPT_CHECK_LEN + 1];
  kept_check(line, src, strlen(src));
  int ok = fputs(src, f) >= 0 && fputs(line, f) >= 0;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, path) != 0) unlink(tmp);
}

/* Compile src for backend into u (0, or -1 with err). */
static int compile_src(unit *u, int backend, const char *cache_dir, const char *key, const char *src,
                       void **addr, char *err, size_t errlen) {
  char sym[64];
  snprintf(sym, sizeof sym, "fd_k%s_desc", key);
  return backend == 1 ? fd_cc_compile(src, key, cache_dir, sym, &u->cc, addr, err, errlen)
                      : fd_jit_compile(src, sym, &u->jit, addr, err, errlen);
}

/* Generate (or read from src_dir) and compile key into a new unit (NULL with
   err); a kept source that does not compile is generated again. Sources are
   generated without #line directives; one that does not compile is generated
   and compiled again with them, so the error names template lines. Under
   $FD_CC_DEBUG a cc kernel is generated with them from the start (and no kept
   source is read or written), so its debug lines name the templates. build_lock held. */
static unit *unit_compile(int backend, const char *cache_dir, const char *src_dir, const char *key,
                          const char *id, char *err, size_t errlen) {
  unit *u = calloc(1, sizeof *u);
  if (!u || !(u->id = strdup(id))) { free(u); snprintf(err, errlen, "out of memory"); return NULL; }
  double t0 = now_ms();
  int debug = backend == 1 && fd_cc_debug();
  char *src = src_dir && !debug ? src_read(src_dir, key) : NULL;
  int from_disk = src != NULL, rc = -1;
  void *addr = NULL;
  double t1 = now_ms();
  if (src && (rc = compile_src(u, backend, cache_dir, key, src, &addr, err, errlen)) != 0) {
    free(src);
    src = NULL;
    from_disk = 0;
    t0 = t1 = now_ms();
  }
  for (int lines = debug; !src && lines < 2; lines++) {   /* a failure again with #line, for its message */
    if (!(src = generate_locked(key, lines, err, errlen))) { unit_free(u); return NULL; }
    t1 = now_ms();
    rc = compile_src(u, backend, cache_dir, key, src, &addr, err, errlen);
    if (rc == 0 && src_dir && !lines) src_write(src_dir, key, src);
    if (rc != 0 && lines == 0) { free(src); src = NULL; }
  }
  if (rc == 0) record(key, src, from_disk, t1 - t0, now_ms() - t1);
  free(src);
  if (rc) { unit_free(u); return NULL; }
  u->desc = addr;
  if (u->desc->abi_version != FD_ABI_VERSION) {
    snprintf(err, errlen, "kernel %s has ABI %d, the library %d", key, u->desc->abi_version, FD_ABI_VERSION);
    unit_free(u);
    return NULL;
  }
  return u;
}

/* The store unit of key for c's backend with a new reference, compiled once
   per process (adding to *compile_ms and *compiled when this call compiled). */
static unit *store_get(const fd_kcache *c, const char *key, double *compile_ms, int *compiled,
                       char *err, size_t errlen) {
  char id[1200];
  snprintf(id, sizeof id, "%d|%s|%s", c->backend, c->backend == 1 && c->cache_dir ? c->cache_dir : "", key);
  unit *u = store_take(id);
  if (u) return u;
  pthread_mutex_lock(&build_lock);
  if (!(u = store_take(id))) {                 /* another context may have built it meanwhile */
    double t0 = now_ms();
    u = unit_compile(c->backend, c->cache_dir, c->src_dir, key, id, err, errlen);
    if (compile_ms) *compile_ms += now_ms() - t0;
    if (u) {
      if (compiled) (*compiled)++;
      pthread_mutex_lock(&store_lock);
      unit **l = store_find(id);
      *l = u;
      u->refs = 1;
      pthread_mutex_unlock(&store_lock);
    }
  }
  pthread_mutex_unlock(&build_lock);
  return u;
}

/* The compile records so far (at most max into out); their count. */
int fd_kcache_records(fd_kcache_record *out, int max, double *start_ms) {
  pthread_mutex_lock(&build_lock);
  int n = n_records < max ? n_records : max;
  memcpy(out, records, (size_t)n * sizeof *out);
  if (start_ms) *start_ms = gen_start_ms;
  pthread_mutex_unlock(&build_lock);
  return n;
}

/* ---- a context's cache ---- */

/* The tcc backend's source directory: cache_dir, else $FD_CACHE_DIR, when it
   can be created and written; else none (sources are then never kept). */
static void choose_src_dir(fd_kcache *c) {
  const char *dir = c->cache_dir ? c->cache_dir : getenv("FD_CACHE_DIR");
  char why[1024];
  if (dir && *dir && fd_cc_check_dir(dir, why, sizeof why) == 0) c->src_dir = strdup(dir);
}

/* Choose the backend: cc falls back to tcc, with c->warning, when no compiler
   runs or its cache directory cannot be created or written. */
static void choose_backend(fd_kcache *c, int backend) {
  char why[1024];
  c->backend = backend;
  if (backend != 1) { choose_src_dir(c); return; }
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

/* Give an entry's unit back to the store and free the entry. */
static void free_entry(entry *e) {
  unit_release(e->u);
  free(e);
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

/* A new entry of c for key holding store unit u (NULL, giving u back, on ENOMEM). */
static entry *add_locked(fd_kcache *c, const char *key, unit *u, char *err, size_t errlen) {
  entry *e = calloc(1, sizeof *e);
  if (!e) { unit_release(u); snprintf(err, errlen, "out of memory"); return NULL; }
  snprintf(e->key, sizeof e->key, "%s", key);
  e->u = u;
  entry **l = find_locked(c, key);             /* a trim may have unlinked the chain's end */
  *l = e;
  c->n++;
  grow_locked(c);
  return e;
}

/* The kernel of key with one more reference, from the store on first use. */
const fd_kernel_desc *fd_kcache_get(fd_kcache *c, const char *key, double *compile_ms, int *compiled,
                                    char *err, size_t errlen) {
  pthread_mutex_lock(&c->m);
  entry *e = *find_locked(c, key);
  if (!e) {
    if (c->max) trim_locked(c, c->max - 1);   /* room for the new one */
    unit *u = store_get(c, key, compile_ms, compiled, err, errlen);
    e = u ? add_locked(c, key, u, err, errlen) : NULL;
  }
  if (e) { e->refs++; e->used = ++c->clock; }
  pthread_mutex_unlock(&c->m);
  return e ? e->u->desc : NULL;
}

/* Give back one reference to d (from fd_kcache_get); NULL is ignored. */
void fd_kcache_put(fd_kcache *c, const fd_kernel_desc *d) {
  if (!d) return;
  pthread_mutex_lock(&c->m);
  entry *e = *find_locked(c, d->key);
  if (e && e->u->desc == d && e->refs > 0) e->refs--;
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

/* The generated source of key (from the shared generator). */
char *fd_kcache_source(fd_kcache *c, const char *key, char *err, size_t errlen) {
  (void)c;
  pthread_mutex_lock(&build_lock);
  char *src = generate_locked(key, 1, err, errlen);
  pthread_mutex_unlock(&build_lock);
  return src;
}

/* Give every kernel back to the store and free the cache. */
void fd_kcache_destroy(fd_kcache *c) {
  if (!c) return;
  for (size_t i = 0; i < c->n_slots; i++)
    for (entry *e = c->slot[i], *next; e; e = next) { next = e->next; free_entry(e); }
  pthread_mutex_destroy(&c->m);
  free(c->slot);
  free(c->cache_dir);
  free(c->src_dir);
  free(c);
}
