/* fdgen: the command line on libflashdecode. `key`, `source` and `gen` run the
   embedded generator; `run` plans and runs one shape on random inputs and
   checks it against the double-precision reference; `bench` times planning,
   JIT and fd_run over a shape set. */
#include "flashdecode.h"
#include "internal.h"
#include "compare.h"
#include "kexec.h"
#include "luagen.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *DT[] = { "f32", "f16", "bf16", "i8", "fp8" };
static const char *MODE[] = { "causal", "mask", "full" };
static const char *LAYOUT[] = { "bhsd", "bshd", "paged" };

/* Monotonic milliseconds. */
static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

typedef struct run_opts {
  const char *shape, *shapes, *report;
  int64_t kv_len;
  int splits, chunk, tile, threads, backend, reps;
  unsigned seed;
} run_opts;

/* Parse --name value options into o; -1 on an unknown or incomplete option. */
static int parse_opts(int argc, char **argv, int first, run_opts *o) {
  for (int i = first; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "-o") && v) { o->report = v; i++; continue; }
    if (a[0] != '-' && !o->shapes) { o->shapes = a; continue; }
    if (!v) { fprintf(stderr, "fdgen: option %s needs a value\n", a); return -1; }
    i++;
    if (!strcmp(a, "--shape")) o->shape = v;
    else if (!strcmp(a, "--shapes")) o->shapes = v;
    else if (!strcmp(a, "--kv-len")) o->kv_len = atoll(v);
    else if (!strcmp(a, "--splits")) o->splits = atoi(v);
    else if (!strcmp(a, "--chunk")) o->chunk = atoi(v);
    else if (!strcmp(a, "--tile")) o->tile = atoi(v);
    else if (!strcmp(a, "--threads")) o->threads = atoi(v);
    else if (!strcmp(a, "--reps")) o->reps = atoi(v);
    else if (!strcmp(a, "--seed")) o->seed = (unsigned)atoi(v);
    else if (!strcmp(a, "--backend") && (!strcmp(v, "tcc") || !strcmp(v, "cc"))) o->backend = !strcmp(v, "cc");
    else { fprintf(stderr, "fdgen: unknown option %s %s\n", a, v); return -1; }
  }
  return 0;
}

/* Describe a shape on one line. */
static void print_shape(FILE *f, const char *name, const fd_shape *s) {
  fprintf(f, "%s: B=%d Hq=%d Hkv=%d D=%d q=%s kv=%s out=%s %s %s, kv_len %lld\n", name, s->batch, s->n_q_heads,
          s->n_kv_heads, s->head_dim, DT[s->q_dtype], DT[s->kv_dtype], DT[s->out_dtype], MODE[s->mask_mode],
          LAYOUT[s->layout], (long long)s->kv_len);
}

/* KV bytes a run reads: the valid rows of K and V once. */
static double kv_bytes(const fd_shape *s, const int32_t *cur_pos) {
  double rows = 0;
  for (int b = 0; b < s->batch; b++) rows += s->mask_mode == FD_CAUSAL ? cur_pos[b] + 1.0 : (double)s->kv_len;
  return 2.0 * rows * s->n_kv_heads * s->head_dim * (double)fd_dtype_size(s->kv_dtype);
}

/* `fdgen run`: one shape, random inputs, one checked run. */
static int cmd_run(const run_opts *o) {
  fd_gen_shape *sh;
  int n;
  char err[4096];
  const char *src = o->shape && strchr(o->shape, '=') ? o->shape : o->shapes;
  if (!o->shape) { fprintf(stderr, "fdgen run: --shape NAME or --shape batch=...,kv_len=N is required\n"); return 2; }
  if (fd_gen_shapes(src, strchr(o->shape, '=') ? NULL : o->shape, &sh, &n, err, sizeof err)) {
    fprintf(stderr, "fdgen run: %s\n", err);
    return 2;
  }
  fd_shape s = sh[0].shape;
  if (o->kv_len) s.kv_len = o->kv_len;
  print_shape(stdout, sh[0].name, &s);
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = o->threads, .backend = (fd_backend)o->backend });
  if (!ctx) { fprintf(stderr, "fdgen run: %s\n", fd_errmsg(NULL)); return 1; }
  fd_plan *plan;
  fd_plan_opts po = { o->chunk, o->tile, o->splits, o->threads, 0 };
  double t0 = now_ms();
  if (fd_plan_create_opts(ctx, &s, &po, &plan)) { fprintf(stderr, "fdgen run: %s\n", fd_errmsg(ctx)); return 1; }
  double plan_ms = now_ms() - t0;
  fd_plan_info info;
  fd_plan_info_get(plan, s.kv_len, &info);
  printf("backend %s, threads %d\nkey        %s\nsplit key  %s\nchunk %d, group tile %d, splits %d\n",
         fd_ctx_backend(ctx) ? "cc" : "tcc", info.threads, info.key, info.split_key[0] ? info.split_key : "-",
         info.chunk, info.group_tile, info.splits);
  printf("plan %.1f ms, of which JIT %.1f ms for %d kernels (%.2f ms per key)\n", plan_ms, info.compile_ms,
         info.kernels_compiled, info.kernels_compiled ? info.compile_ms / info.kernels_compiled : 0.0);
  kproblem p;
  kp_init(&p, s.batch, s.n_q_heads, s.n_kv_heads, s.head_dim, s.kv_len, s.q_dtype, s.kv_dtype, s.out_dtype,
          s.mask_mode, s.layout, o->seed);
  for (int b = 0; b < s.batch; b++) p.cur_pos[b] = (int32_t)(s.kv_len - 1);
  size_t nout = (size_t)s.batch * s.n_q_heads * s.head_dim, nl = (size_t)s.batch * s.n_q_heads;
  void *out = malloc(nout * 4);
  float *outf = malloc(nout * 4), *lse = malloc(nl * 4);
  double *rout = malloc(nout * 8), *rlse = malloc(nl * 8);
  fd_args a = { p.q, p.k, p.v, p.cur_pos, p.mask, p.k_scale, p.v_scale, NULL, 0, out, lse };
  t0 = now_ms();
  int rc = fd_run(plan, &a);
  double run_ms = now_ms() - t0;
  if (rc) { fprintf(stderr, "fdgen run: %s\n", fd_errmsg(ctx)); return 1; }
  printf("run %.3f ms (first call), KV read %.2f GB/s\n", run_ms, kv_bytes(&s, p.cur_pos) / run_ms / 1e6);
  ref_attention(&p.ref, rout, rlse);
  double scale = 0, e = 0, le = 0;
  for (size_t i = 0; i < nout; i++) scale = fmax(scale, fabs(rout[i]));
  for (size_t i = 0; i < nout; i++) e = fmax(e, fabs(t_load(s.out_dtype, out, i) - rout[i]) / (scale ? scale : 1));
  for (size_t i = 0; i < nl; i++) le = fmax(le, fabs(lse[i] - rlse[i]) / fmax(1, fabs(rlse[i])));
  double tol = t_tolerance(&p);
  printf("max error %.3g relative to output scale %.3g (tolerance %.3g), lse %.3g: %s\n", e, scale, tol, le,
         e <= tol && le <= 1e-5 ? "ok" : "FAIL");
  free(out); free(outf); free(lse); free(rout); free(rlse); free(sh);
  kp_free(&p);
  fd_plan_destroy(plan);
  fd_destroy(ctx);
  kx_cleanup();
  return e <= tol && le <= 1e-5 ? 0 : 1;
}

/* Median of n doubles (sorts them). */
static double median(double *x, int n) {
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && x[j] < x[j - 1]; j--) { double t = x[j]; x[j] = x[j - 1]; x[j - 1] = t; }
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* Time plan creation and fd_run of one shape at one length in a fresh context; one report row. */
static void bench_one(FILE *rep, const fd_gen_shape *g, int64_t len, const run_opts *o) {
  fd_shape s = g->shape;
  s.kv_len = len;
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = o->threads });
  fd_plan *plan;
  double t0 = now_ms();
  fd_plan_opts po = { o->chunk, o->tile, o->splits, o->threads, 0 };
  if (!ctx || fd_plan_create_opts(ctx, &s, &po, &plan)) { fprintf(rep, "| %s | %lld | failed: %s |\n", g->name, (long long)len, fd_errmsg(ctx)); return; }
  double plan_ms = now_ms() - t0;
  fd_plan_info info;
  fd_plan_info_get(plan, len, &info);
  size_t nkv = (size_t)s.batch * s.n_kv_heads * (size_t)len * s.head_dim;
  size_t nq = (size_t)s.batch * s.n_q_heads * s.head_dim;
  void *k = malloc(nkv * fd_dtype_size(s.kv_dtype)), *v = malloc(nkv * fd_dtype_size(s.kv_dtype)), *q = malloc(nq * 4), *out = malloc(nq * 4);
  float *mask = s.mask_mode == FD_MASK ? calloc((size_t)s.batch * s.n_q_heads * len, 4) : NULL;
  float *scales = s.kv_dtype >= FD_I8 ? malloc(nkv / s.head_dim * 4) : NULL;
  int32_t *pos = malloc(sizeof(int32_t) * s.batch);
  memset(k, 0x3c, nkv * fd_dtype_size(s.kv_dtype)); memset(v, 0x3c, nkv * fd_dtype_size(s.kv_dtype)); memset(q, 0x3c, nq * 4);
  for (size_t i = 0; scales && i < nkv / s.head_dim; i++) scales[i] = 0.01f;
  for (int b = 0; b < s.batch; b++) pos[b] = (int32_t)(len - 1);
  fd_args a = { q, k, v, pos, mask, scales, scales, NULL, 0, out, NULL };
  double t[32];
  int reps = o->reps ? o->reps : 7;
  fd_run(plan, &a);                                  /* warm-up */
  for (int r = 0; r < reps; r++) { t0 = now_ms(); fd_run(plan, &a); t[r] = now_ms() - t0; }
  double med = median(t, reps);
  fprintf(rep, "| %s | %lld | %.1f | %d | %.2f | %s | %d | %.3f | %.2f |\n", g->name, (long long)len, plan_ms,
          info.kernels_compiled, info.kernels_compiled ? info.compile_ms / info.kernels_compiled : 0.0, info.key,
          info.splits, med, kv_bytes(&s, pos) / med / 1e6);
  fflush(rep);
  free(k); free(v); free(q); free(out); free(mask); free(scales); free(pos);
  fd_plan_destroy(plan);
  fd_destroy(ctx);
}

/* `fdgen bench`: plan time, JIT time per key and fd_run time over a shape set (warm cache). */
static int cmd_bench(const run_opts *o) {
  fd_gen_shape *sh;
  int n;
  char err[4096];
  const char *src = o->shapes ? o->shapes : "tuner/shapes/default.lua";
  if (fd_gen_shapes(src, NULL, &sh, &n, err, sizeof err)) { fprintf(stderr, "fdgen bench: %s\n", err); return 2; }
  FILE *rep = o->report ? fopen(o->report, "w") : stdout;
  if (!rep) { fprintf(stderr, "fdgen bench: cannot write %s\n", o->report); return 1; }
  fprintf(rep, "# Planning, JIT and fd_run times (`fdgen bench %s`)\n\nmachine %s (%s), %d threads, tcc backend, "
          "portable-C kernels, warm cache, median of %d runs after one warm-up.\n\n", src, fd_machine_name(),
          "see results/bench for bandwidth", o->threads, o->reps ? o->reps : 7);
  fprintf(rep, "| shape | kv_len | plan ms | kernels JIT | JIT ms/key | key | splits | fd_run ms | KV GB/s |\n"
               "|---|---|---|---|---|---|---|---|---|\n");
  for (int i = 0; i < n; i++)
    for (int j = 0; j < sh[i].n_lens; j++) {
      if (rep != stdout) fprintf(stderr, "fdgen bench: %s kv_len %lld\n", sh[i].name, (long long)sh[i].kv_lens[j]);
      bench_one(rep, &sh[i], sh[i].kv_lens[j], o);
    }
  if (rep != stdout) fclose(rep);
  free(sh);
  return 0;
}

/* Print usage (the Lua CLI prints the full list). */
static int usage(void) {
  char *argv[] = { "fdgen", NULL };
  fd_gen_cli(1, argv);
  return 2;
}

int main(int argc, char **argv) {
  if (argc < 2) return usage();
  if (!strcmp(argv[1], "key") || !strcmp(argv[1], "source") || !strcmp(argv[1], "gen")) return fd_gen_cli(argc, argv);
  if (!strcmp(argv[1], "export")) return fd_gen_cli(argc, argv);
  if (!strcmp(argv[1], "machine")) { printf("%s\n", fd_machine_name()); return 0; }
  run_opts o = { 0 };
  o.seed = 1;
  if (!strcmp(argv[1], "run") || !strcmp(argv[1], "bench")) {
    if (parse_opts(argc, argv, 2, &o)) return 2;
    if (!o.shapes && argv[1][0] == 'r') o.shapes = "tuner/shapes/default.lua";
    return argv[1][0] == 'r' ? cmd_run(&o) : cmd_bench(&o);
  }
  return usage();
}
