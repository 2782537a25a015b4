/* Contexts: configuration, thread pool, kernel cache and tuned table. */
#include "internal.h"
#include "cpu.h"
#include "jit.h"
#include "luagen.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The best isa digit (highest rank) allowed by cfg, the CPU and $FD_MAX_ISA; -1 if cfg asks for more than the CPU has. */
static int isa_allowed(const fd_config *cfg) {
  int best = fd_cpu_max_isa();
  const char *env = getenv("FD_MAX_ISA");
  if (env && *env >= '0' && *env < '0' + FD_ISA_COUNT && !env[1] && fd_isa_within(*env - '0', best)) best = *env - '0';
  if (cfg->isa_limit == FD_ISA_AUTO) return best;
  return fd_isa_within(cfg->isa_limit - 1, fd_cpu_max_isa()) ? cfg->isa_limit - 1 : -1;
}

static void fd_ctx_free(fd_ctx *ctx);

/* Every context not yet freed, under one lock with their reference counts. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static fd_ctx *registry;

/* The registry link holding ctx, or NULL when ctx is not there (registry lock held). */
static fd_ctx **registry_find(const fd_ctx *ctx) {
  fd_ctx **l = &registry;
  while (*l && *l != ctx) l = &(*l)->next_live;
  return *l ? l : NULL;
}

/* Take a reference for a call or a plan, unless ctx was destroyed. */
int fd_ctx_acquire(fd_ctx *ctx) {
  pthread_mutex_lock(&registry_lock);
  int ok = registry_find(ctx) && !atomic_load(&ctx->destroyed);
  if (ok) ctx->refs++;
  pthread_mutex_unlock(&registry_lock);
  return ok ? FD_OK : fd_fail(ctx, FD_EDESTROYED, "the context was destroyed (fd_destroy)");
}

/* Drop a reference; the last one unlinks ctx from the registry and frees it. */
void fd_ctx_release(fd_ctx *ctx) {
  pthread_mutex_lock(&registry_lock);
  int last = --ctx->refs == 0;
  if (last) { fd_ctx **l = registry_find(ctx); *l = ctx->next_live; }
  pthread_mutex_unlock(&registry_lock);
  if (last) fd_ctx_free(ctx);
}

/* Give back the kernels a plan's buckets took from the cache. */
void fd_ctx_put_kernels(fd_ctx *ctx, fd_bucket *b, int n_buckets) {
  for (int i = 0; i < n_buckets; i++) {
    fd_kcache_put(ctx->kernels, b[i].plain);
    fd_kcache_put(ctx->kernels, b[i].with_lse);
    fd_kcache_put(ctx->kernels, b[i].split);
    if (b[i].new_kv) fd_kcache_put(ctx->kernels, b[i].new_kv);
    b[i].plain = b[i].with_lse = b[i].split = b[i].new_kv = NULL;
  }
}

/* The context's standing note: the cc backend's fallback warning, then why a table was refused. */
static void add_note(fd_ctx *ctx, const char *note) {
  size_t n = strlen(ctx->table_note);
  if (*note) snprintf(ctx->table_note + n, sizeof ctx->table_note - n, "%s%s", n ? "; " : "", note);
}

/* Create a context; NULL with fd_errmsg(NULL) on failure. */
fd_ctx *fd_create(const fd_config *cfg) {
  fd_config dflt = { 0 };
  if (!cfg) cfg = &dflt;
  if (cfg->threads < 0 || cfg->threads > FD_MAX_THREADS) {
    fd_fail(NULL, FD_EINVAL, "config.threads %d is outside 0..%d (FD_MAX_THREADS; 0 = all online cores)", cfg->threads, FD_MAX_THREADS);
    return NULL;
  }
  if (cfg->backend != FD_BACKEND_TCC && cfg->backend != FD_BACKEND_CC) {
    fd_fail(NULL, FD_EINVAL, "config.backend %d is unknown (FD_BACKEND_TCC or FD_BACKEND_CC)", (int)cfg->backend);
    return NULL;
  }
  if (cfg->isa_limit < 0 || cfg->isa_limit > FD_ISA_COUNT) { fd_fail(NULL, FD_EINVAL, "config.isa_limit %d is unknown", cfg->isa_limit); return NULL; }
  if (cfg->deterministic != 0 && cfg->deterministic != 1) {
    fd_fail(NULL, FD_EINVAL, "config.deterministic %d is not 0 (default) or 1 (batch-invariant results)", cfg->deterministic);
    return NULL;
  }
  if (cfg->precision != FD_PRECISION_DEFAULT && cfg->precision != FD_PRECISION_FAST) {
    fd_fail(NULL, FD_EINVAL, "config.precision %d is not FD_PRECISION_DEFAULT (0) or FD_PRECISION_FAST (1)", cfg->precision);
    return NULL;
  }
  if (cfg->max_kernels < 0) { fd_fail(NULL, FD_EINVAL, "config.max_kernels %d is negative (0 = no bound)", cfg->max_kernels); return NULL; }
  int isa = isa_allowed(cfg);
  if (isa < 0) { fd_fail(NULL, FD_EUNSUPPORTED, "config.isa_limit %d asks for an ISA this CPU lacks (%s)", cfg->isa_limit, fd_cpu_features()); return NULL; }
  fd_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) { fd_fail(NULL, FD_ENOMEM, "out of memory for a context"); return NULL; }
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  ctx->threads = cfg->threads ? cfg->threads : cores < 1 ? 1 : cores > FD_MAX_THREADS ? FD_MAX_THREADS : (int)cores;
  ctx->max_isa = isa;
  ctx->check_inputs = cfg->check_inputs != 0;
  ctx->deterministic = cfg->deterministic;
  ctx->precision = cfg->precision;
  pthread_mutex_init(&ctx->run_lock, NULL);
  ctx->pool = fd_pool_create(ctx->threads);
  ctx->kernels = fd_kcache_create(cfg->backend, cfg->cache_dir, cfg->max_kernels);
  ctx->backend = ctx->kernels ? (fd_backend)fd_kcache_backend(ctx->kernels) : cfg->backend;
  if (!ctx->pool || !ctx->kernels) { fd_fail(NULL, FD_ESYS, "cannot start the thread pool or kernel cache"); fd_ctx_free(ctx); return NULL; }
  add_note(ctx, fd_kcache_warning(ctx->kernels));
  if (cfg->table) {
    char note[sizeof ctx->table_note];
    ctx->table = fd_table_load(cfg->table, note, sizeof note);
    add_note(ctx, note);
  }
  ctx->refs = 1;                               /* the caller's handle */
  pthread_mutex_lock(&registry_lock);
  ctx->next_live = registry;
  registry = ctx;
  pthread_mutex_unlock(&registry_lock);
  fd_clear_error(ctx);
  return ctx;
}

/* Free everything a context owns (its last reference is gone). */
static void fd_ctx_free(fd_ctx *ctx) {
  fd_pool_destroy(ctx->pool);
  fd_kcache_destroy(ctx->kernels);
  fd_table_free(ctx->table);
  pthread_mutex_destroy(&ctx->run_lock);
  free(ctx);
}

/* End a context: new plans and runs are refused from now on, the pool stops
   once a run in progress ends and kernels no plan holds are freed; the
   struct and the rest go with the last reference (plans, calls in progress).
   A context already destroyed or unknown is left alone. */
void fd_destroy(fd_ctx *ctx) {
  if (!ctx) return;
  pthread_mutex_lock(&registry_lock);
  int mine = registry_find(ctx) && !atomic_exchange(&ctx->destroyed, 1);
  pthread_mutex_unlock(&registry_lock);
  if (!mine) return;
  pthread_mutex_lock(&ctx->run_lock);          /* wait for a run in progress */
  fd_pool_destroy(ctx->pool);
  ctx->pool = NULL;
  pthread_mutex_unlock(&ctx->run_lock);
  fd_kcache_trim(ctx->kernels);
  fd_ctx_release(ctx);
}

/* Context facts. */
int fd_ctx_threads(const fd_ctx *ctx) { return ctx ? ctx->threads : 0; }
int fd_ctx_backend(const fd_ctx *ctx) { return ctx ? (int)ctx->backend : -1; }
int fd_ctx_max_isa(const fd_ctx *ctx) { return ctx ? ctx->max_isa : -1; }
const char *fd_build_templates_hash(void) { return fd_gen_template_hash(); }
const char *fd_build_tcc_version(void) { return fd_jit_version(); }

/* The generated source of a key (malloc'd). */
char *fd_kernel_source(fd_ctx *ctx, const char *key) {
  char err[4096];
  if (!ctx || !key) { fd_fail(ctx, FD_EINVAL, "ctx or key is NULL"); return NULL; }
  if (fd_ctx_acquire(ctx)) return NULL;
  char *src = fd_kcache_source(ctx->kernels, key, err, sizeof err);
  if (!src) fd_fail(ctx, FD_ECOMPILE, "%s", err);
  fd_ctx_release(ctx);
  return src;
}
