/* fdmpi-bench: one decode step with the KV cache sharded over the MPI ranks.
     mpirun -np 4 build/fdmpi-bench SHAPE [--kv-len N] [--reps N] [--threads N] [--shapes FILE] [--seed N]
                                          [--no-compare]  (no single-process run: rank 0 need not hold the whole cache)
     build/fdmpi-bench --machine      (this machine's name, for results/mpi/<machine>.md)
   SHAPE is a name of the shape set (tuner/shapes/default.lua) or an inline spec
   as `fdgen run` takes it. The keys 0 .. kv_len - 1 of every row are split in
   contiguous shards of ceil(kv_len / np); causal rows query the last key. It
   prints per-rank attention time, validation and merge time of both combine
   strategies (result on every rank and on rank 0), the bytes each rank sends,
   and the largest difference from fd_run over the whole cache in one process.
   Every timed call starts after each rank has read a 64 MiB buffer (caches
   cold for its shard, as for one layer of a real model) and an MPI_Barrier. */
#include "flashdecode_mpi.h"
#include "fdmpi_data.h"
#include "luagen.h"
#include "ref.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { N_VARIANTS = 4, FLUSH_BYTES = 64 << 20 };
static int rank, np;
static unsigned char *flush_buf;   /* FLUSH_BYTES read before every timed call */

/* Command-line options. */
typedef struct opts {
  const char *shape, *shapes;
  int64_t kv_len;
  int reps, threads, no_compare;
  uint64_t seed;
} opts;

/* A combine strategy and a root, as timed. */
static const struct { int combine, root; const char *name; } VARIANT[N_VARIANTS] = {
  { FDMPI_COMBINE_REDUCE, FDMPI_ALL, "reduce (MPI_Allreduce, user op), all ranks" },
  { FDMPI_COMBINE_REDUCE, 0, "reduce (MPI_Reduce, user op), root 0" },
  { FDMPI_COMBINE_GATHER, FDMPI_ALL, "gather (MPI_Allgather + fd_merge_states), all ranks" },
  { FDMPI_COMBINE_GATHER, 0, "gather (MPI_Gather + fd_merge_states), root 0" },
};

/* Per-rank medians, gathered to rank 0 (seconds). */
typedef struct medians {
  double attn, keys, check[N_VARIANTS], merge[N_VARIANTS], step[N_VARIANTS], alone[N_VARIANTS];
} medians;

/* This rank's shard and everything one step needs. */
typedef struct bench {
  fd_shape shape;               /* this rank's: kv_len = its shard's keys (at least 1) */
  fd_ctx *ctx;
  fd_plan *plan;
  void *q, *k, *v;
  float *mask, *out, *lse;
  int32_t *pos;
  int64_t *off, *n, total, rows;
} bench;

/* Parse the options; 0 on success, else a usage message on rank 0. */
static int parse(int argc, char **argv, opts *o) {
  *o = (opts){ .shapes = "tuner/shapes/default.lua", .reps = 20, .seed = 1 };
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--kv-len") && v) o->kv_len = atoll(argv[++i]);
    else if (!strcmp(a, "--reps") && v) o->reps = atoi(argv[++i]);
    else if (!strcmp(a, "--threads") && v) o->threads = atoi(argv[++i]);
    else if (!strcmp(a, "--shapes") && v) o->shapes = argv[++i];
    else if (!strcmp(a, "--seed") && v) o->seed = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(a, "--no-compare")) o->no_compare = 1;
    else if (a[0] != '-' && !o->shape) o->shape = a;
    else o->shape = NULL, i = argc;
  }
  if (o->shape && o->reps > 0) return 0;
  if (rank == 0)
    fprintf(stderr, "usage: mpirun -np N fdmpi-bench SHAPE [--kv-len N] [--reps N] [--threads N] [--shapes FILE] "
                    "[--seed N] [--no-compare]\n  SHAPE: a name in the shape set (default tuner/shapes/default.lua) or an inline "
                    "spec batch=1,n_q_heads=8,...\n");
  return 1;
}

/* The shape to run (out_dtype forced to f32: fdmpi merges f32 states), global kv_len in s->kv_len. */
static int load_shape(const opts *o, fd_shape *s, char *name, size_t name_len) {
  fd_gen_shape *sh = NULL;
  int n = 0;
  char err[2048];
  int inline_spec = strchr(o->shape, '=') != NULL;
  if (fd_gen_shapes(inline_spec ? o->shape : o->shapes, inline_spec ? NULL : o->shape, &sh, &n, err, sizeof err) || n < 1) {
    if (rank == 0) fprintf(stderr, "fdmpi-bench: %s\n", n < 1 && !err[0] ? "no such shape" : err);
    free(sh);
    return 1;
  }
  *s = sh[0].shape;
  snprintf(name, name_len, "%s", inline_spec ? "inline" : sh[0].name);
  free(sh);
  if (o->kv_len > 0) s->kv_len = o->kv_len;
  s->out_dtype = FD_F32;
  return 0;
}

/* Rank r's shard of keys: [r * per, min(total, (r + 1) * per)). */
static void shard_range(int64_t total, int r, int64_t *off, int64_t *n) {
  int64_t per = (total + np - 1) / np, lo = (int64_t)r * per, hi = lo + per < total ? lo + per : total;
  *off = lo < total ? lo : total;
  *n = hi > lo ? hi - lo : 0;
}

/* Allocate and fill this rank's shard, create its context and plan; 0 on success. */
static int bench_init(bench *b, const fd_shape *g, const opts *o) {
  memset(b, 0, sizeof *b);
  int B = g->batch;
  b->total = g->kv_len;
  b->off = calloc((size_t)B, 8); b->n = calloc((size_t)B, 8); b->pos = calloc((size_t)B, 4);
  int64_t off, n;
  shard_range(b->total, rank, &off, &n);
  for (int i = 0; i < B; i++) { b->off[i] = off; b->n[i] = n; b->pos[i] = (int32_t)(b->total - 1); }
  b->shape = *g;
  b->shape.kv_len = n > 0 ? n : 1;
  b->rows = (int64_t)B * g->n_q_heads;
  size_t kv = (size_t)B * g->n_kv_heads * b->shape.kv_len * g->head_dim * t_dtype_size(g->kv_dtype);
  b->q = malloc((size_t)b->rows * g->head_dim * 4);
  b->k = calloc(kv, 1); b->v = calloc(kv, 1);
  b->mask = g->mask_mode == FD_MASK ? calloc((size_t)(b->rows * b->shape.kv_len), 4) : NULL;
  b->out = malloc(sizeof(float) * (size_t)(b->rows * g->head_dim));
  b->lse = malloc(sizeof(float) * (size_t)b->rows);
  fdd_fill_q(&b->shape, o->seed, b->q, NULL);
  fdd_fill_kv(&b->shape, o->seed, b->off, b->n, b->k, b->v, NULL, NULL);
  if (b->mask) fdd_fill_mask(&b->shape, o->seed, b->off, b->n, b->mask);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int threads = o->threads > 0 ? o->threads : cores / np > 1 ? (int)(cores / np) : 1;
  b->ctx = fd_create(&(fd_config){ .threads = threads });
  if (!b->ctx || fd_plan_create(b->ctx, &b->shape, &b->plan)) {
    fprintf(stderr, "fdmpi-bench: rank %d: %s\n", rank, b->ctx ? fd_errmsg(b->ctx) : fd_errmsg(NULL));
    return 1;
  }
  return 0;
}

/* Free a bench. */
static void bench_free(bench *b) {
  fd_plan_destroy(b->plan);
  fd_destroy(b->ctx);
  free(b->off); free(b->n); free(b->pos); free(b->q); free(b->k); free(b->v); free(b->mask);
  free(b->out); free(b->lse);
}

/* Read the flush buffer (evicts this rank's shard from the caches). */
static void flush_caches(void) {
  volatile unsigned s = 0;
  for (size_t i = 0; i < FLUSH_BYTES; i += 64) s += flush_buf[i];
}

/* One timed fdmpi_run of a variant after a barrier (and a cache flush unless alone); the wall time in *step.
   alone: to time the combine by itself, each rank of a causal shape attends one key per row (global key
   = its rank: non-empty states, so the merge does its arithmetic), trusted (no validation), warm caches. */
static int timed_step(bench *b, int v, int alone, fdmpi_stats *st, double *step) {
  if (!alone) flush_caches();
  int B = b->shape.batch, causal = b->shape.mask_mode == FD_CAUSAL;
  int64_t *one = malloc(sizeof(int64_t) * 2 * (size_t)B), *at = one + B;
  int32_t *last = malloc(sizeof(int32_t) * (size_t)B);
  for (int i = 0; i < B; i++) { one[i] = 1; at[i] = rank; last[i] = np - 1; }
  alone = alone && causal;
  fd_args a = { .q = b->q, .k = b->k, .v = b->v, .cur_pos = alone ? last : b->pos, .mask = b->mask, .out = b->out,
                .lse = b->lse };
  fdmpi_shard sh = { .shape = &b->shape, .ctx = b->ctx, .key_offset = alone ? at : b->off, .n_keys = alone ? one : b->n,
                     .combine = (fdmpi_combine)VARIANT[v].combine, .stats = st, .trusted = alone };
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  int rc = fdmpi_run(b->plan, &a, &sh, MPI_COMM_WORLD, VARIANT[v].root);
  *step = MPI_Wtime() - t0;
  free(one);
  free(last);
  if (rc && rank == 0) fprintf(stderr, "fdmpi-bench: %s\n", fdmpi_errmsg());
  return rc;
}

/* Median of n values (sorts them). */
static double median(double *x, int n) {
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && x[j - 1] > x[j]; j--) { double t = x[j]; x[j] = x[j - 1]; x[j - 1] = t; }
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* The timed loop: reps rounds of every variant, interleaved; this rank's medians. */
static int time_variants(bench *b, int reps, medians *m) {
  double *x = malloc(sizeof(double) * (size_t)reps * (1 + 4 * N_VARIANTS)), step;
  double *attn = x, *chk = x + reps, *mrg = chk + reps * N_VARIANTS, *stp = mrg + reps * N_VARIANTS;
  double *aln = stp + reps * N_VARIANTS;
  fdmpi_stats st;
  int rc = 0;
  for (int v = 0; v < N_VARIANTS && !rc; v++) rc = timed_step(b, v, 0, &st, &step);   /* warm-up: JIT, pages */
  for (int r = 0; r < reps && !rc; r++)
    for (int v = 0; v < N_VARIANTS && !rc; v++) {
      rc = timed_step(b, v, 0, &st, &step);
      if (v == 0) attn[r] = st.attn_s;
      chk[v * reps + r] = st.check_s;
      mrg[v * reps + r] = st.merge_s;
      stp[v * reps + r] = step;
    }
  for (int r = 0; r < reps && !rc; r++)
    for (int v = 0; v < N_VARIANTS && !rc; v++) {
      rc = timed_step(b, v, 1, &st, &step);
      aln[v * reps + r] = st.merge_s;
    }
  if (!rc) {
    m->attn = median(attn, reps);
    m->keys = (double)b->n[0];
    for (int v = 0; v < N_VARIANTS; v++) {
      m->check[v] = median(chk + v * reps, reps);
      m->merge[v] = median(mrg + v * reps, reps);
      m->step[v] = median(stp + v * reps, reps);
      m->alone[v] = median(aln + v * reps, reps);
    }
  }
  free(x);
  return rc;
}

/* KV bytes a rank reads for keys keys. */
static double kv_bytes(const fd_shape *s, double keys) {
  return 2.0 * s->batch * s->n_kv_heads * keys * s->head_dim * (double)t_dtype_size(s->kv_dtype);
}

/* Rank 0: fd_run over the whole cache in one process (all cores); its median time and
   its largest difference from each variant's result (diff[v]). */
static double single_process(const fd_shape *g, const opts *o, const float *const res[], double *diff) {
  fd_shape s = *g;
  int64_t *z = calloc((size_t)s.batch, 8), *tot = calloc((size_t)s.batch, 8);
  int32_t *pos = calloc((size_t)s.batch, 4);
  for (int i = 0; i < s.batch; i++) { tot[i] = s.kv_len; pos[i] = (int32_t)(s.kv_len - 1); }
  size_t kv = (size_t)s.batch * s.n_kv_heads * s.kv_len * s.head_dim * t_dtype_size(s.kv_dtype);
  int64_t rows = (int64_t)s.batch * s.n_q_heads;
  void *q = malloc((size_t)rows * s.head_dim * 4), *k = malloc(kv), *v = malloc(kv);
  float *mask = s.mask_mode == FD_MASK ? malloc(sizeof(float) * (size_t)(rows * s.kv_len)) : NULL;
  float *out = malloc(sizeof(float) * (size_t)(rows * s.head_dim));
  fdd_fill_q(&s, o->seed, q, NULL);
  fdd_fill_kv(&s, o->seed, z, tot, k, v, NULL, NULL);
  if (mask) fdd_fill_mask(&s, o->seed, z, tot, mask);
  fd_ctx *ctx = fd_create(NULL);
  fd_plan *plan = NULL;
  double t = NAN, *x = malloc(sizeof(double) * (size_t)o->reps);
  fd_args a = { .q = q, .k = k, .v = v, .cur_pos = pos, .mask = mask, .out = out };
  if (ctx && !fd_plan_create(ctx, &s, &plan) && !fd_run(plan, &a)) {
    for (int r = 0; r < o->reps; r++) {
      flush_caches();
      double t0 = MPI_Wtime();
      fd_run(plan, &a);
      x[r] = MPI_Wtime() - t0;
    }
    t = median(x, o->reps);
    for (int i = 0; i < N_VARIANTS; i++) {
      diff[i] = 0;
      for (int64_t j = 0; j < rows * s.head_dim; j++) diff[i] = fmax(diff[i], fabs(res[i][j] - out[j]));
    }
  } else fprintf(stderr, "fdmpi-bench: single process: %s\n", ctx ? fd_errmsg(ctx) : fd_errmsg(NULL));
  fd_plan_destroy(plan);
  fd_destroy(ctx);
  free(z); free(tot); free(pos); free(q); free(k); free(v); free(mask); free(out); free(x);
  return t;
}

/* Rank 0 keeps each variant's result (run once more, untimed) for the comparison. */
static int keep_results(bench *b, float *res[]) {
  fdmpi_stats st;
  double step;
  for (int v = 0; v < N_VARIANTS; v++) {
    if (timed_step(b, v, 0, &st, &step)) return 1;
    if (rank == 0) memcpy(res[v], b->out, sizeof(float) * (size_t)(b->rows * b->shape.head_dim));
  }
  return 0;
}

/* Bytes one rank sends in a variant's combine (algorithm model, state s bytes): tree reduce and
   gather: s from each non-root rank; recursive-doubling allreduce: ceil(log2 np) x s; allgather: (np - 1) x s. */
static double bytes_sent(int v, double s) {
  int lg = 0;
  while ((1 << lg) < np) lg++;
  if (VARIANT[v].root != FDMPI_ALL) return np > 1 ? s : 0;
  return VARIANT[v].combine == FDMPI_COMBINE_REDUCE ? lg * s : (np - 1) * s;
}

/* Print the report (rank 0). */
static void report(const char *name, const fd_shape *g, const opts *o, int threads, const medians *all,
                   double single_s, const double *diff) {
  static const char *DT[] = { "f32", "f16", "bf16", "i8", "fp8", "e5m2" }, *MODE[] = { "causal", "mask", "full" };
  double state = 4.0 * g->batch * g->n_q_heads * (g->head_dim + 1), total_kv = kv_bytes(g, (double)g->kv_len);
  printf("### %s, np %d\n\nB=%d Hq=%d Hkv=%d D=%d, q %s, KV %s, out f32, %s, %lld keys per row (%.1f MiB of KV) over %d "
         "ranks, %d fd_run thread(s) per rank; median of %d steps, each after a 64 MiB cache flush and a barrier.\n\n",
         name, np, g->batch, g->n_q_heads, g->n_kv_heads, g->head_dim, DT[g->q_dtype], DT[g->kv_dtype],
         MODE[g->mask_mode], (long long)g->kv_len, total_kv / (1 << 20), np, threads, o->reps);
  printf("| rank | keys | attention ms | KV GB/s |\n|---|---|---|---|\n");
  for (int r = 0; r < np; r++)
    printf("| %d | %.0f | %.3f | %.1f |\n", r, all[r].keys, 1e3 * all[r].attn, kv_bytes(g, all[r].keys) / all[r].attn / 1e9);
  printf("\nState per rank: B x Hq x (D + 1) floats = %.0f bytes. Times: the largest of the ranks' medians. In the "
         "step: validation (includes waiting for the slowest rank's attention) and merge after it, cold caches. "
         "Merge alone: the combine by itself, warm, no validation, each rank attending one key per row first "
         "(causal shapes).\n\n", state);
  printf("| combine | validation us | merge us | step ms | merge alone us | bytes sent per rank (model) | "
         "max abs diff vs 1 process |\n|---|---|---|---|---|---|---|\n");
  for (int v = 0; v < N_VARIANTS; v++) {
    double chk = 0, mrg = 0, stp = 0, aln = 0;
    for (int r = 0; r < np; r++) {
      chk = fmax(chk, all[r].check[v]); mrg = fmax(mrg, all[r].merge[v]); stp = fmax(stp, all[r].step[v]);
      aln = fmax(aln, all[r].alone[v]);
    }
    char d[32] = "not run";
    if (!isnan(diff[v])) snprintf(d, sizeof d, "%.3g", diff[v]);
    printf("| %s | %.1f | %.1f | %.3f | %.1f | %.0f | %s |\n", VARIANT[v].name, 1e6 * chk, 1e6 * mrg, 1e3 * stp,
           1e6 * aln, bytes_sent(v, state), d);
  }
  if (isnan(single_s)) printf("\nNo single-process run (--no-compare).\n\n");
  else
    printf("\nOne process, fd_run over all %lld keys with every core: %.3f ms (%.1f GB/s), measured on rank 0 while the "
           "other ranks wait in MPI_Barrier.\n\n", (long long)g->kv_len, 1e3 * single_s, total_kv / single_s / 1e9);
}

int main(int argc, char **argv) {
  if (argc == 2 && !strcmp(argv[1], "--machine")) {   /* the results file name, without MPI */
    printf("%s\n", fd_machine_name());
    return 0;
  }
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &np);
  opts o;
  fd_shape g;
  char name[64];
  bench b;
  flush_buf = malloc(FLUSH_BYTES);
  memset(flush_buf, 1, FLUSH_BYTES);
  int rc = parse(argc, argv, &o) || load_shape(&o, &g, name, sizeof name);
  if (!rc) rc = bench_init(&b, &g, &o);
  MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rc) { MPI_Finalize(); return 2; }
  medians m = { 0 }, *all = rank == 0 ? calloc((size_t)np, sizeof *all) : NULL;
  float *res[N_VARIANTS] = { 0 };
  for (int v = 0; rank == 0 && v < N_VARIANTS; v++) res[v] = malloc(sizeof(float) * (size_t)(b.rows * g.head_dim));
  rc = time_variants(&b, o.reps, &m) || keep_results(&b, res);
  MPI_Gather(&m, sizeof m, MPI_BYTE, all, sizeof m, MPI_BYTE, 0, MPI_COMM_WORLD);
  int threads = fd_ctx_threads(b.ctx);
  bench_free(&b);
  double diff[N_VARIANTS] = { NAN, NAN, NAN, NAN }, single = NAN;
  if (!rc && rank == 0 && !o.no_compare) single = single_process(&g, &o, (const float *const *)res, diff);
  MPI_Barrier(MPI_COMM_WORLD);
  if (!rc && rank == 0) report(name, &g, &o, threads, all, single, diff);
  for (int v = 0; v < N_VARIANTS; v++) free(res[v]);
  free(all);
  free(flush_buf);
  MPI_Finalize();
  return rc ? 1 : 0;
}
