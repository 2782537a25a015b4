/* Two plans of one shape that differ in one choice, timed cold and
   interleaved in one process (the order alternates each round; before each
   call the caches are flushed as the benchmark's and the tuner's are:
   fdb_flush_caches), at 1 thread and at all cores. Prints a Markdown
   report: each plan's key, median ms and GB/s, and the median of the
   per-round ratios B/A with its quartiles, and the median of the read
   bandwidth sampled once per round (fdb_call_bw_gbs, the row's threads),
   the level of the moment on a shared machine. It asserts no speed; it fails
   only when a plan or a call fails.
     ab isa [ISA_A ISA_B [ROUNDS]]   `make bench-isa`: the bf16 grouped shapes
                                     of issue 18, fd_plan_opts.isa A and B
                                     (default 0 = the planner's choice, and
                                     FD_ISA_AVX512_BF16)
     ab precision [ROUNDS [TABLE]]   `make bench-fast`: Llama-3.1-8B int8 KV
                                     and bf16, int8 KV at groups of 2, 7, 8
                                     and 16 heads (Gemma-2-9B, Qwen2.5-7B,
                                     the MQA batch, Falcon-40B), the MQA
                                     batch and Falcon-40B bf16 on a context with
                                     FD_PRECISION_FAST and the tuned table
                                     TABLE (none: the heuristic), A with
                                     fd_plan_opts.precision -1 (the default
                                     precision), B 0 (fast where a kernel
                                     serves it)
   Each key is followed by where its plan came from: the table's row, its
   cost model, or the heuristic. OpenMP (the flush and the bandwidth pass)
   must not spin beside flashdecode's pool: without OMP_WAIT_POLICY=passive
   the tool sets it and runs itself again (libgomp reads it when it loads). */
#include "bw.h"
#include "flashdecode.h"
#include "util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { CALLS = 3 };

/* One row: its name and shape (bf16 q and out, causal, BHSD; kv bf16 or int8 with row scales). */
typedef struct ab_row { const char *name; int batch, hq, hkv, d; long len; fd_dtype kv; } ab_row;
static const ab_row ISA_ROWS[] = {
  { "falcon-40b-bf16", 32, 128, 8, 64, 2048, FD_BF16 },
  { "mqa-b8-bf16", 8, 8, 1, 128, 16384, FD_BF16 },
  { "llama3-8b-bf16", 1, 32, 8, 128, 65536, FD_BF16 },
};
static const ab_row PRECISION_ROWS[] = {
  { "llama3-8b-int8", 1, 32, 8, 128, 16384, FD_I8 },
  { "llama3-8b-int8", 1, 32, 8, 128, 65536, FD_I8 },
  { "gemma2-9b-int8", 1, 16, 8, 256, 16384, FD_I8 },     /* G 2 */
  { "qwen2.5-7b-int8", 1, 28, 4, 128, 16384, FD_I8 },    /* G 7 */
  { "mqa-b8-int8", 8, 8, 1, 128, 16384, FD_I8 },         /* G 8 */
  { "falcon-40b-int8", 32, 128, 8, 64, 2048, FD_I8 },    /* G 16 */
  { "llama3-8b-bf16", 1, 32, 8, 128, 16384, FD_BF16 },
  { "mqa-b8-bf16", 8, 8, 1, 128, 16384, FD_BF16 },
  { "falcon-40b-bf16", 32, 128, 8, 64, 2048, FD_BF16 },
};

/* One axis: its rows, what A and B force besides the threads, the context's precision and table. */
typedef struct ab_axis {
  const ab_row *rows;
  size_t n_rows;
  fd_plan_opts a, b;
  int precision;
  const char *table;
} ab_axis;

/* Where a plan came from (fd_plan_info.from_table). */
static const char *const FROM[3] = { "heuristic", "table row", "table model" };

/* The median ms of CALLS cold calls of plan p. */
static double cold_ms(const fd_plan *p, const fd_args *a, int *rc) {
  double t[CALLS];
  for (int i = 0; i < CALLS; i++) {
    if (fdb_flush_caches()) *rc = 1;
    double s = fdb_now();
    if (fd_run(p, a)) *rc = 1;
    t[i] = (fdb_now() - s) * 1e3;
  }
  qsort(t, CALLS, sizeof *t, fdb_by_value);
  return t[CALLS / 2];
}

/* Plan shape s with o at threads threads into *p (all the context's: not
   forced, so that a tuned row can serve); its key and origin into key. */
static int plan_with(fd_ctx *c, const fd_shape *s, fd_plan_opts o, int threads, fd_plan **p, char *key) {
  fd_plan_info info;
  o.threads = threads < fd_ctx_threads(c) ? threads : 0;
  if (fd_plan_create_opts(c, s, &o, p) || fd_plan_info_get(*p, s->kv_len, &info)) {
    fprintf(stderr, "ab: plan (isa %d, precision %d): %s\n", o.isa, o.precision, fd_errmsg(c));
    return 1;
  }
  snprintf(key, 48, "`%s` (%s)", info.key, FROM[info.from_table]);
  return 0;
}

/* The row's K/V bytes: 2 per element for bf16; int8 codes and a 4-byte scale per row. */
static size_t kv_bytes(const ab_row *r, size_t elems, size_t rows) {
  return r->kv == FD_I8 ? elems + 4 * rows : 2 * elems;
}

/* Time row r at threads threads, rounds rounds; print its table line. */
static int run_row(fd_ctx *c, const ab_row *r, const ab_axis *ax, int threads, int rounds) {
  fd_shape s = { .batch = r->batch, .n_q_heads = r->hq, .n_kv_heads = r->hkv, .head_dim = r->d, .kv_len = r->len,
                 .q_dtype = FD_BF16, .kv_dtype = r->kv, .out_dtype = FD_BF16, .mask_mode = FD_CAUSAL, .layout = FD_BHSD };
  size_t rows = (size_t)r->batch * r->hkv * r->len, kv = rows * r->d;
  fdb_rowbufs m;
  int rc = fdb_rowbufs_fill(&m, r->batch, r->hq, r->hkv, r->d, r->len, (int)r->kv);
  double *ta = malloc(sizeof *ta * rounds), *tb = malloc(sizeof *tb * rounds), *ratio = malloc(sizeof *ratio * rounds);
  double *bw = malloc(sizeof *bw * rounds);
  fd_plan *pa = NULL, *pb = NULL;
  char ka[48], kb[48];
  rc = rc || !ta || !tb || !ratio || !bw;
  if (!rc) rc = plan_with(c, &s, ax->a, threads, &pa, ka) || plan_with(c, &s, ax->b, threads, &pb, kb);
  fd_args a = { .q = m.q, .k = m.k, .v = m.v, .k_scale = m.ks, .v_scale = m.vs, .cur_pos = m.pos, .out = m.out };
  for (int i = 0; !rc && i < rounds; i++) {
    int b_first = i & 1;
    bw[i] = fdb_call_bw_gbs(threads);
    double x = cold_ms(b_first ? pb : pa, &a, &rc), y = cold_ms(b_first ? pa : pb, &a, &rc);
    ta[i] = b_first ? y : x;
    tb[i] = b_first ? x : y;
    ratio[i] = tb[i] / ta[i];
  }
  if (!rc) {
    qsort(ta, rounds, sizeof *ta, fdb_by_value); qsort(tb, rounds, sizeof *tb, fdb_by_value);
    qsort(ratio, rounds, sizeof *ratio, fdb_by_value); qsort(bw, rounds, sizeof *bw, fdb_by_value);
    double gb = 2.0 * kv_bytes(r, kv, rows) / 1e9;
    printf("| %s | %ld | %d | %.1f | %s | %.3f | %.1f | %s | %.3f | %.1f | %.3f | %.3f-%.3f |\n", r->name, r->len, threads, bw[rounds / 2], ka,
           ta[rounds / 2], gb / ta[rounds / 2] * 1e3, kb, tb[rounds / 2], gb / tb[rounds / 2] * 1e3, ratio[rounds / 2],
           ratio[rounds / 4], ratio[3 * rounds / 4]);
    fflush(stdout);
  }
  fd_plan_destroy(pa); fd_plan_destroy(pb);
  fdb_rowbufs_free(&m); free(ta); free(tb); free(ratio); free(bw);
  return rc;
}

/* The CPU's model name from /proc/cpuinfo into buf ("unknown" where absent). */
static const char *cpu_model(char *buf, size_t n) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[256];
  snprintf(buf, n, "unknown");
  while (f && fgets(line, sizeof line, f)) {
    char *colon = strchr(line, ':');
    if (strncmp(line, "model name", 10) || !colon) continue;
    snprintf(buf, n, "%s", colon + 2);
    buf[strcspn(buf, "\n")] = 0;
    break;
  }
  if (f) fclose(f);
  return buf;
}

/* The axis named by argv[1] with its arguments into *ax and *rounds; 0, or 2 with a message. */
static int parse_axis(int argc, char **argv, ab_axis *ax, int *rounds) {
  const char *axis = argc > 1 ? argv[1] : "";
  memset(ax, 0, sizeof *ax);
  if (!strcmp(axis, "isa")) {
    ax->rows = ISA_ROWS; ax->n_rows = sizeof ISA_ROWS / sizeof *ISA_ROWS;
    ax->a.isa = argc > 2 ? atoi(argv[2]) : 0;
    ax->b.isa = argc > 3 ? atoi(argv[3]) : FD_ISA_AVX512_BF16;
    *rounds = argc > 4 ? atoi(argv[4]) : 11;
  } else if (!strcmp(axis, "precision")) {
    ax->rows = PRECISION_ROWS; ax->n_rows = sizeof PRECISION_ROWS / sizeof *PRECISION_ROWS;
    ax->a.precision = -1;
    ax->precision = FD_PRECISION_FAST;
    *rounds = argc > 2 ? atoi(argv[2]) : 11;
    ax->table = argc > 3 && argv[3][0] ? argv[3] : NULL;
  } else {
    fprintf(stderr, "ab: the first argument '%s' is not an axis: isa [ISA_A ISA_B [ROUNDS]] or precision [ROUNDS [TABLE]]\n",
            axis);
    return 2;
  }
  if (*rounds < 1) { fprintf(stderr, "ab: ROUNDS %d is not positive\n", *rounds); return 2; }
  return 0;
}

/* The report's header: machine, CPU, what A and B are, the method. */
static void print_header(const char *axis, const ab_axis *ax, long cores, int rounds) {
  char model[128];
  printf("# %s A/B: %s\n\n- CPU: %s, %ld online cores; flashdecode templates `%s`\n", axis, fd_machine_name(),
         cpu_model(model, sizeof model), cores, fd_build_templates_hash());
  if (ax->rows == ISA_ROWS)
    printf("- A: opts.isa %d (0 = the planner's choice), B: opts.isa %d; each plan's chunk, tile and splits the planner's\n",
           ax->a.isa, ax->b.isa);
  else
    printf("- A: opts.precision -1 (the default: f32 softmax weights, 3 MSD planes for int8 K), B: opts.precision 0 "
           "on a context with FD_PRECISION_FAST (fast precision where a kernel serves it: 2 MSD planes for int8, bf16 "
           "weights for bf16 V on AVX512-BF16, else the same kernel as A); each plan's chunk, tile, isa and splits the "
           "planner's, from the tuned table %s%s%s\n", ax->table ? "`" : "", ax->table ? ax->table : "(none: the heuristic)",
           ax->table ? "`" : "");
  printf("- Method: bf16 q and out, causal, K and V as the shape says (int8: per-row f32 scales, GB/s in the real "
         "bytes); per round %d cold calls of each plan (before each call all threads read one word per line of %zu "
         "MiB: fdb_flush_caches), the order alternating per round, %d rounds; ms = median of the rounds' medians; B/A = "
         "median of the per-round ratios, with quartiles; read GB/s = median of one read pass over the flush buffer "
         "per round (fdb_call_bw_gbs) with the row's threads\n\n", CALLS, fdb_flush_bytes() >> 20, rounds);
  printf("| shape | kv_len | threads | read GB/s | key A | ms A | GB/s A | key B | ms B | GB/s B | B/A | quartiles |\n");
  printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
}

int main(int argc, char **argv) {
  fdb_passive_openmp(argv, "ab");
  ab_axis ax;
  int rounds;
  if (parse_axis(argc, argv, &ax, &rounds)) return 2;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  fd_ctx *c = fd_create(&(fd_config){ .threads = (int)cores, .precision = ax.precision, .table = ax.table });
  if (!c) { fprintf(stderr, "ab: %s\n", fd_errmsg(NULL)); return 1; }
  if (ax.table && fd_errmsg(c)[0]) fprintf(stderr, "ab: %s\n", fd_errmsg(c));
  print_header(argv[1], &ax, cores, rounds);
  int rc = 0, counts[2] = { 1, (int)cores };
  for (int t = 0; t < 2 && !rc; t++)
    for (size_t r = 0; r < ax.n_rows && !rc; r++)
      rc = run_row(c, &ax.rows[r], &ax, counts[t], rounds);
  fd_destroy(c);
  return rc;
}
