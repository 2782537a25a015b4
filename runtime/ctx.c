/* Contexts: configuration, thread pool, kernel cache and tuned table. */
#include "internal.h"
#include "cpu.h"
#include "jit.h"
#include "luagen.h"
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* The highest isa digit allowed by cfg, the CPU and $FD_MAX_ISA; -1 if cfg asks for more than the CPU has. */
static int isa_allowed(const fd_config *cfg) {
  int best = fd_cpu_max_isa();
  const char *env = getenv("FD_MAX_ISA");
  if (env && *env >= '0' && *env <= '2' && !env[1] && *env - '0' < best) best = *env - '0';
  if (cfg->isa_limit == FD_ISA_AUTO) return best;
  return cfg->isa_limit - 1 <= fd_cpu_max_isa() ? cfg->isa_limit - 1 : -1;
}

/* Create a context; NULL with fd_errmsg(NULL) on failure. */
fd_ctx *fd_create(const fd_config *cfg) {
  fd_config dflt = { 0 };
  if (!cfg) cfg = &dflt;
  if (cfg->threads < 0) { fd_fail(NULL, FD_EINVAL, "config.threads %d is negative (0 = all online cores)", cfg->threads); return NULL; }
  if (cfg->backend != FD_BACKEND_TCC && cfg->backend != FD_BACKEND_CC) {
    fd_fail(NULL, FD_EINVAL, "config.backend %d is unknown (FD_BACKEND_TCC or FD_BACKEND_CC)", (int)cfg->backend);
    return NULL;
  }
  if (cfg->isa_limit < 0 || cfg->isa_limit > FD_ISA_AVX512) { fd_fail(NULL, FD_EINVAL, "config.isa_limit %d is unknown", cfg->isa_limit); return NULL; }
  int isa = isa_allowed(cfg);
  if (isa < 0) { fd_fail(NULL, FD_EUNSUPPORTED, "config.isa_limit %d asks for an ISA this CPU lacks (%s)", cfg->isa_limit, fd_cpu_features()); return NULL; }
  fd_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) { fd_fail(NULL, FD_ENOMEM, "out of memory for a context"); return NULL; }
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  ctx->threads = cfg->threads ? cfg->threads : (int)(cores > 0 ? cores : 1);
  ctx->max_isa = isa;
  pthread_mutex_init(&ctx->lock, NULL);
  pthread_mutex_init(&ctx->run_lock, NULL);
  ctx->pool = fd_pool_create(ctx->threads);
  ctx->kernels = fd_kcache_create(cfg->backend, cfg->cache_dir);
  ctx->backend = ctx->kernels ? (fd_backend)fd_kcache_backend(ctx->kernels) : cfg->backend;
  if (!ctx->pool || !ctx->kernels) { fd_fail(NULL, FD_ESYS, "cannot start the thread pool or kernel cache"); fd_ctx_free(ctx); return NULL; }
  if (cfg->table) ctx->table = fd_table_load(cfg->table, ctx->table_note, sizeof ctx->table_note);
  fd_clear_error(ctx);
  return ctx;
}

/* Free everything a context owns. */
void fd_ctx_free(fd_ctx *ctx) {
  fd_pool_destroy(ctx->pool);
  fd_kcache_destroy(ctx->kernels);
  fd_table_free(ctx->table);
  pthread_mutex_destroy(&ctx->lock);
  pthread_mutex_destroy(&ctx->run_lock);
  free(ctx);
}

/* End a context: its pool and kernels go now; plans still alive keep the
   struct until the last fd_plan_destroy, and fd_run on them fails. */
void fd_destroy(fd_ctx *ctx) {
  if (!ctx) return;
  pthread_mutex_lock(&ctx->run_lock);          /* wait for a run in progress */
  atomic_store(&ctx->destroyed, 1);
  fd_pool_destroy(ctx->pool);
  ctx->pool = NULL;
  fd_kcache_destroy(ctx->kernels);
  ctx->kernels = NULL;
  pthread_mutex_unlock(&ctx->run_lock);
  pthread_mutex_lock(&ctx->lock);
  ctx->released = 1;
  int last = ctx->n_plans == 0;
  pthread_mutex_unlock(&ctx->lock);
  if (last) fd_ctx_free(ctx);
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
  if (atomic_load(&ctx->destroyed)) { fd_fail(ctx, FD_EDESTROYED, "the context was destroyed"); return NULL; }
  char *src = fd_kcache_source(ctx->kernels, key, err, sizeof err);
  if (!src) fd_fail(ctx, FD_ECOMPILE, "%s", err);
  return src;
}
