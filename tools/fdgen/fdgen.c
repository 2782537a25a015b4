/* fdgen: the command line on libflashdecode. Every subcommand is one row of
   COMMANDS below, and the help is generated from the rows and from OPTIONS:
   `key`, `source`, `gen` and `export` run the embedded generator
   (gen/fdgen.lua, which holds their help); `run` plans and runs one shape on
   random inputs and checks it against the double-precision reference; `bench`
   times planning, JIT and fd_run over a shape set; `predict` shows a tuned
   table's cost model's ranking for a shape; `machine` names this machine.
   Usage errors exit 2, failures 1. */
#include "flashdecode.h"
#include "kcache.h"
#include "key.h"
#include "luagen.h"
#include "table.h"
#include "problem.h"
#include <errno.h>
#include <stdarg.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *DEFAULT_SHAPES = "tuner/shapes/default.lua";

/* Monotonic milliseconds. */
static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* A C subcommand's parsed arguments (0 = the planner's or the default choice). */
typedef struct run_opts {
  const char *shape, *shapes, *report, *arg, *table;   /* arg: the positional argument */
  int64_t kv_len;
  int splits, chunk, tile, threads, backend, reps, seed;
  int precision;                /* fd_config.precision: 0 default, 1 FD_PRECISION_FAST */
} run_opts;

struct command;
typedef int (*handler)(const struct command *c, const run_opts *o);

/* One subcommand. Rows with lua set are the embedded generator's: fdgen passes
   their arguments to gen/fdgen.lua, whose table holds their usage and help. */
typedef struct command {
  const char *name;
  int lua;
  unsigned bit;                 /* a C command's bit in option.cmds */
  const char *args;             /* usage after the name */
  const char *arg;              /* the positional argument's name, or NULL for none */
  const char *summary, *about, *example;
  handler run;
} command;

enum { C_RUN = 1, C_BENCH = 2, C_MACHINE = 4, C_HELP = 8, C_PREDICT = 16 };

/* One --name VALUE option: the commands taking it, where and how it is stored. */
typedef struct option {
  const char *name, *value, *help;
  unsigned cmds, required;      /* bits of the commands taking it / requiring it */
  char kind;                    /* 's' string, 'i' int, 'l' int64, 'b' backend */
  size_t off;
  long long lo, hi;             /* integer range */
} option;

#define OFF(f) offsetof(run_opts, f)
static const option OPTIONS[] = {
  { "--shape", "NAME|SPEC", "a shape of the shape set, or an inline spec batch=1,n_q_heads=8,...,kv_len=N",
    C_RUN | C_PREDICT, C_RUN | C_PREDICT, 's', OFF(shape), 0, 0 },
  { "--shapes", "FILE", "the shape set NAME is taken from (default tuner/shapes/default.lua)",
    C_RUN | C_PREDICT, 0, 's', OFF(shapes), 0, 0 },
  { "--table", "TABLE", "the tuned table whose cost model ranks the configurations", C_PREDICT, C_PREDICT, 's',
    OFF(table), 0, 0 },
  { "-o", "REPORT", "write the report to REPORT instead of stdout", C_BENCH, 0, 's', OFF(report), 0, 0 },
  { "--kv-len", "N", "kv length (default: the shape's largest)", C_RUN | C_PREDICT, 0, 'l', OFF(kv_len), 1, INT32_MAX },
  { "--splits", "N", "kv splits (default: the planner's choice)", C_RUN | C_BENCH, 0, 'i', OFF(splits), 0, INT_MAX },
  { "--chunk", "N", "kv chunk (default: the planner's choice)", C_RUN | C_BENCH, 0, 'i', OFF(chunk), 0, INT_MAX },
  { "--tile", "N", "group tile, query heads per kernel call (default: the planner's)", C_RUN | C_BENCH, 0, 'i',
    OFF(tile), 0, INT_MAX },
  { "--threads", "N", "worker threads (default: one per core)", C_RUN | C_BENCH | C_PREDICT, 0, 'i', OFF(threads), 0, INT_MAX },
  { "--backend", "tcc|cc", "compile kernels with libtcc (default) or the system C compiler", C_RUN, 0, 'b',
    OFF(backend), 0, 0 },
  { "--precision", "0|1", "fd_config.precision: 0 default (f32 weights), 1 fast (bf16 weights in P.V, 2 MSD planes for int8, where served)",
    C_RUN | C_BENCH, 0, 'i', OFF(precision), 0, 1 },
  { "--seed", "N", "seed of the random inputs (default 1)", C_RUN, 0, 'i', OFF(seed), 0, INT_MAX },
  { "--reps", "N", "timed runs per length; the median is reported (default 7)", C_BENCH, 0, 'i', OFF(reps), 1, 32 },
};
#define N_OPTIONS (int)(sizeof OPTIONS / sizeof OPTIONS[0])

static int cmd_run(const command *c, const run_opts *o);
static int cmd_bench(const command *c, const run_opts *o);
static int cmd_machine(const command *c, const run_opts *o);
static int cmd_predict(const command *c, const run_opts *o);
static int cmd_help(const command *c, const run_opts *o);

static const command COMMANDS[] = {
  { .name = "key", .lua = 1 },
  { .name = "source", .lua = 1 },
  { .name = "gen", .lua = 1 },
  { .name = "export", .lua = 1 },
  { .name = "run", .bit = C_RUN, .args = "--shape NAME|SPEC [options]",
    .summary = "plan and run one shape on random inputs, checked against the double-precision reference",
    .about = "Plans the shape (NAME from the shape set, or an inline spec), prints the kernel keys, the\n"
             "planner's choices and the planning and JIT times, runs it once on random inputs and prints\n"
             "its time, KV bandwidth and error against the double-precision reference (exit 1 when over\n"
             "the tolerance of its dtypes). A paged shape (layout=paged, page_size=N) runs on its rows\n"
             "copied into pages in a shuffled pool order, a pool of every row's pages unless the shape\n"
             "gives pool_pages (at least that many). The shape set file is looked up from the current\n"
             "directory.",
    .example = "fdgen run --shape llama3-8b-tp8 --kv-len 4096 --splits 4\n"
               "  fdgen run --shape batch=1,n_q_heads=32,n_kv_heads=8,head_dim=128,kv_dtype=bf16,kv_len=8192\n"
               "  fdgen run --shape batch=4,n_q_heads=32,n_kv_heads=8,head_dim=128,kv_dtype=bf16,layout=paged,page_size=16,kv_len=4096",
    .run = cmd_run },
  { .name = "bench", .bit = C_BENCH, .args = "[SHAPES.lua] [options]", .arg = "SHAPES.lua",
    .summary = "time planning, JIT and fd_run over every shape and length of a shape set",
    .about = "For every shape and kv length of SHAPES.lua (default tuner/shapes/default.lua), in a fresh\n"
             "context: plan time, kernels compiled and JIT time per key, the key and splits chosen, and\n"
             "the median fd_run time and KV bandwidth (warm cache), as a Markdown table.",
    .example = "fdgen bench tuner/shapes/default.lua -o plan.md --reps 5", .run = cmd_bench },
  { .name = "predict", .bit = C_PREDICT, .args = "--table TABLE --shape NAME|SPEC [options]",
    .summary = "show a tuned table's cost model's best configurations for a shape",
    .about = "Ranks the configurations the planner may take (chunk, group tile, isa, splits, threads) for the\n"
             "shape at its kv length by the cost model TABLE carries (README: the cost model), prints the best\n"
             "five with the predicted time relative to the heuristic's configuration, and what the planner\n"
             "takes with TABLE (a row, the model, or the heuristic).",
    .example = "fdgen predict --table results/tuned/amd-epyc-2c-avx512bf16.tsv --shape batch=2,n_q_heads=32,n_kv_heads=8,"
               "head_dim=128,kv_dtype=bf16,kv_len=8192", .run = cmd_predict },
  { .name = "machine", .bit = C_MACHINE, .args = "",
    .summary = "print this machine's name (the name of its tuned table)",
    .about = "Prints the CPU model and core count as one word, the name results/tuned/ files carry.",
    .example = "fdgen machine", .run = cmd_machine },
  { .name = "help", .bit = C_HELP, .args = "[COMMAND]", .arg = "COMMAND",
    .summary = "print the list of commands, or one command's help",
    .about = "`fdgen COMMAND --help` (or -h) prints the same as `fdgen help COMMAND`.",
    .example = "fdgen help run", .run = cmd_help },
};
#define N_COMMANDS (int)(sizeof COMMANDS / sizeof COMMANDS[0])

/* The command called name, or NULL. */
static const command *find_command(const char *name) {
  for (int i = 0; i < N_COMMANDS; i++) if (!strcmp(COMMANDS[i].name, name)) return &COMMANDS[i];
  return NULL;
}

/* Write C command c's usage line and options to f. */
static void write_usage(FILE *f, const command *c) {
  fprintf(f, "usage: fdgen %s%s%s\noptions:\n", c->name, c->args[0] ? " " : "", c->args);
  char left[64];
  for (int i = 0; i < N_OPTIONS; i++) {
    if (!(OPTIONS[i].cmds & c->bit)) continue;
    snprintf(left, sizeof left, "%s %s", OPTIONS[i].name, OPTIONS[i].value);
    fprintf(f, "  %-22s %s%s\n", left, OPTIONS[i].help, OPTIONS[i].required & c->bit ? " (required)" : "");
  }
  fprintf(f, "  %-22s %s\n", "-h, --help", "print this help");
}

/* Print the list of commands and an example on stdout (the generator's rows print their summaries). */
static void write_overview(void) {
  printf("usage: fdgen COMMAND [ARGS...]\n\nflashdecode's command line. Commands:\n");
  for (int i = 0; i < N_COMMANDS; i++) {
    printf("  %-9s ", COMMANDS[i].name);
    if (COMMANDS[i].lua) fd_gen_cli(4, (char *[]){ "fdgen", "help", "--summary", (char *)COMMANDS[i].name, NULL });
    else printf("%s\n", COMMANDS[i].summary);
  }
  printf("\n`fdgen help COMMAND` or `fdgen COMMAND --help` describes one.\n\n"
         "example:\n  fdgen run --shape llama3-8b-tp8 --kv-len 4096\n");
}

/* The short usage on stderr (the generator prints its summaries on stdout only). */
static void write_overview_err(void) {
  fprintf(stderr, "usage: fdgen COMMAND [ARGS...]   (COMMAND:");
  for (int i = 0; i < N_COMMANDS; i++) fprintf(stderr, " %s", COMMANDS[i].name);
  fprintf(stderr, ")\n`fdgen help` describes every command, `fdgen help COMMAND` one.\n");
}

/* A usage error: one line, then c's usage (or the short usage) on stderr; returns 2. */
__attribute__((format(printf, 2, 3))) static int usage_error(const command *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "fdgen: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  if (c) write_usage(stderr, c);
  else write_overview_err();
  return 2;
}

/* Print c's full help on stdout; returns 0. */
static int print_help(const command *c) {
  if (c->lua) return fd_gen_cli(3, (char *[]){ "fdgen", "help", (char *)c->name, NULL });
  write_usage(stdout, c);
  printf("\n%s\n\nexample:\n  %s\n", c->about, c->example);
  return 0;
}

/* Store v into the field of o that option p names; -1 when v is not a valid value. */
static int set_option(const option *p, const char *v, run_opts *o) {
  char *field = (char *)o + p->off, *end;
  if (p->kind == 's') { *(const char **)(void *)field = v; return 0; }
  if (p->kind == 'b') {
    if (strcmp(v, "tcc") && strcmp(v, "cc")) return -1;
    *(int *)(void *)field = !strcmp(v, "cc");
    return 0;
  }
  errno = 0;
  long long n = strtoll(v, &end, 10);
  if (errno || end == v || *end || n < p->lo || n > p->hi) return -1;
  if (p->kind == 'l') *(int64_t *)(void *)field = n;
  else *(int *)(void *)field = (int)n;
  return 0;
}

/* The option called name that c takes, or NULL. */
static const option *find_option(const command *c, const char *name) {
  for (int i = 0; i < N_OPTIONS; i++)
    if ((OPTIONS[i].cmds & c->bit) && !strcmp(OPTIONS[i].name, name)) return &OPTIONS[i];
  return NULL;
}

/* One option and its value at argv[*i] into o; 0, or 2 after a usage error. */
static int take_option(const command *c, int argc, char **argv, int *i, run_opts *o, unsigned *seen) {
  const option *p = find_option(c, argv[*i]);
  if (!p) return usage_error(c, "%s: unknown option '%s'", c->name, argv[*i]);
  if (*i + 1 >= argc) return usage_error(c, "%s: option %s needs a value", c->name, argv[*i]);
  if (set_option(p, argv[*i + 1], o)) {
    if (p->kind == 'b') return usage_error(c, "%s: %s '%s' is not tcc or cc", c->name, p->name, argv[*i + 1]);
    return usage_error(c, "%s: %s '%s' is not an integer in %lld..%lld", c->name, p->name, argv[*i + 1], p->lo,
                       p->hi);
  }
  *seen |= 1u << (p - OPTIONS);
  ++*i;
  return 0;
}

/* Parse a C command's arguments into o: -1 to go on, 0 after printing help, 2 after a usage error. */
static int parse_args(const command *c, int argc, char **argv, run_opts *o) {
  unsigned seen = 0;
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    int rc;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) return print_help(c);
    if (a[0] == '-' && a[1]) { if ((rc = take_option(c, argc, argv, &i, o, &seen))) return rc; continue; }
    if (!c->arg || o->arg) return usage_error(c, "%s: unexpected argument '%s'", c->name, a);
    o->arg = a;
  }
  for (int i = 0; i < N_OPTIONS; i++)
    if ((OPTIONS[i].required & c->bit) && !(seen & 1u << i))
      return usage_error(c, "%s: option %s %s is required", c->name, OPTIONS[i].name, OPTIONS[i].value);
  return -1;
}

/* Describe a shape on one line. */
static void print_shape(FILE *f, const char *name, const fd_shape *s) {
  fprintf(f, "%s: B=%d Hq=%d Hkv=%d D=%d q=%s kv=%s out=%s %s %s, kv_len %lld\n", name, s->batch, s->n_q_heads,
          s->n_kv_heads, s->head_dim, fd_dtype_names[s->q_dtype], fd_dtype_names[s->kv_dtype], fd_dtype_names[s->out_dtype],
          fd_mask_mode_names[s->mask_mode], fd_layout_names[s->layout], (long long)s->kv_len);
}

/* KV bytes a run reads: the valid rows of K and V once. */
static double kv_bytes(const fd_shape *s, const int32_t *cur_pos) {
  double rows = 0;
  for (int b = 0; b < s->batch; b++) rows += s->mask_mode == FD_CAUSAL ? cur_pos[b] + 1.0 : (double)s->kv_len;
  return 2.0 * rows * s->n_kv_heads * (double)t_kv_bytes(s->kv_dtype, (size_t)s->head_dim);
}

/* The plan's keys, choices and planning/JIT times, on stdout. */
static void print_plan(const fd_ctx *ctx, const fd_plan_info *info, double plan_ms) {
  printf("backend %s, threads %d\nkey        %s\nsplit key  %s\nchunk %d, group tile %d, splits %d\n",
         fd_ctx_backend(ctx) ? "cc" : "tcc", info->threads, info->key, info->split_key[0] ? info->split_key : "-",
         info->chunk, info->group_tile, info->splits);
  printf("plan %.1f ms, of which JIT %.1f ms for %d kernels (%.2f ms per key)\n", plan_ms, info->compile_ms,
         info->kernels_compiled, info->kernels_compiled ? info->compile_ms / info->kernels_compiled : 0.0);
}

/* The pages a row of paged shape s fills at its kv_len. */
static int64_t pages_per_row(const fd_shape *s) { return (s->kv_len + s->page_size - 1) / s->page_size; }

/* The pages all of paged shape s's rows fill: the smallest pool that holds them. */
static int64_t rows_pages(const fd_shape *s) { return s->batch * pages_per_row(s); }

/* Run plan once on a random problem and compare with the reference; 0 when within tolerance.
   A paged shape runs on the problem's rows copied into shuffled pages (kp_page),
   the pool's pages past those its rows fill left unused. */
static int run_checked(fd_ctx *ctx, fd_plan *plan, const fd_shape *s, unsigned seed) {
  kproblem p;
  int paged = s->layout == FD_PAGED;
  kp_init(&p, s->batch, s->n_q_heads, s->n_kv_heads, s->head_dim, s->kv_len, s->q_dtype, s->kv_dtype, s->out_dtype,
          s->mask_mode, paged ? FD_BHSD : s->layout, seed);
  for (int b = 0; b < s->batch; b++) p.cur_pos[b] = (int32_t)(s->kv_len - 1);
  size_t nout = (size_t)s->batch * s->n_q_heads * s->head_dim, nl = (size_t)s->batch * s->n_q_heads;
  void *out = malloc(nout * 4);
  float *outf = malloc(nout * 4), *lse = malloc(nl * 4);
  double *rout = malloc(nout * 8), *rlse = malloc(nl * 8);
  fd_args a = { p.q, p.k, p.v, p.cur_pos, p.mask, p.k_scale, p.v_scale, NULL, 0, out, lse };
  kp_pages g;
  if (paged) {
    kp_page(&p, s->page_size, s->pool_pages - rows_pages(s), seed, &g);
    a.k = g.k; a.v = g.v; a.block_table = g.table;
    if (p.k_scale) { a.k_scale = g.k_scale; a.v_scale = g.v_scale; }
  }
  double t0 = now_ms();
  int rc = fd_run(plan, &a), ok = 0;
  double run_ms = now_ms() - t0;
  if (rc) fprintf(stderr, "fdgen run: %s\n", fd_errmsg(ctx));
  else {
    printf("run %.3f ms (first call), KV read %.2f GB/s\n", run_ms, kv_bytes(s, p.cur_pos) / run_ms / 1e6);
    ref_attention(&p.ref, rout, rlse);
    for (size_t i = 0; i < nout; i++) outf[i] = t_load(s->out_dtype, out, i);
    kp_error e = kp_errors(&p, outf, lse, rout, rlse);
    ok = kp_error_ok(&p, &e, 1);
    printf("max error %.3g relative to output scale %.3g (tolerance %.3g), lse %.3g%s%s: %s\n", e.out,
           max_abs_d(rout, nout), t_tolerance(&p), e.lse, e.nan ? ", NaN in the output" : "",
           e.lse_inf ? ", -inf lse rows differ" : "", ok ? "ok" : "FAIL");
  }
  free(out); free(outf); free(lse); free(rout); free(rlse);
  if (paged) kp_pages_free(&g);
  kp_free(&p);
  return ok ? 0 : 1;
}

/* `fdgen run`: one shape, random inputs, one run checked against the reference. */
static int cmd_run(const command *c, const run_opts *o) {
  fd_gen_shape *sh;
  int n;
  char err[4096];
  int inline_spec = strchr(o->shape, '=') != NULL;
  const char *src = inline_spec ? o->shape : o->shapes ? o->shapes : DEFAULT_SHAPES;
  if (fd_gen_shapes(src, inline_spec ? NULL : o->shape, &sh, &n, err, sizeof err)) {
    fprintf(stderr, "fdgen %s: %s\n", c->name, err);
    return 2;
  }
  fd_shape s = sh[0].shape;
  if (o->kv_len) s.kv_len = o->kv_len;
  print_shape(stdout, sh[0].name, &s);
  free(sh);
  if (s.layout == FD_PAGED && s.page_size > 0) {   /* (a bad page_size: the planner's error) */
    int64_t need = rows_pages(&s);
    if (s.pool_pages == 0) s.pool_pages = need;     /* a pool of every row's pages */
    else if (s.pool_pages < need) {
      fprintf(stderr, "fdgen run: shape.pool_pages %lld holds fewer pages than the %lld that batch x "
              "ceil(kv_len / page_size) fill\n", (long long)s.pool_pages, (long long)need);
      return 2;
    }
  }
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = o->threads, .backend = (fd_backend)o->backend,
                                         .precision = o->precision });
  if (!ctx) { fprintf(stderr, "fdgen run: %s\n", fd_errmsg(NULL)); return 1; }
  fd_plan *plan = NULL;
  fd_plan_opts po = { o->chunk, o->tile, o->splits, o->threads, 0 };
  double t0 = now_ms();
  int rc = 1;
  if (fd_plan_create_opts(ctx, &s, &po, &plan)) fprintf(stderr, "fdgen run: %s\n", fd_errmsg(ctx));
  else {
    double plan_ms = now_ms() - t0;
    fd_plan_info info;
    fd_plan_info_get(plan, s.kv_len, &info);
    print_plan(ctx, &info, plan_ms);
    rc = run_checked(ctx, plan, &s, (unsigned)o->seed);
  }
  fd_plan_destroy(plan);
  fd_destroy(ctx);
  return rc;
}

/* Median of n doubles (sorts them). */
static double median(double *x, int n) {
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && x[j] < x[j - 1]; j--) { double t = x[j]; x[j] = x[j - 1]; x[j - 1] = t; }
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* Paged shape s (at its kv_len): a pool of just the pages its rows need, in
   order (set in s), and their block table; *nkv the pool's elements. NULL
   for the other layouts. */
static int32_t *paged_identity(fd_shape *s, size_t *nkv) {
  if (s->layout != FD_PAGED) return NULL;
  s->pool_pages = rows_pages(s);
  *nkv = (size_t)s->pool_pages * s->n_kv_heads * (size_t)s->page_size * s->head_dim;
  int32_t *table = malloc(sizeof(int32_t) * (size_t)s->pool_pages);
  for (int64_t i = 0; table && i < s->pool_pages; i++) table[i] = (int32_t)i;
  return table;
}

/* Time plan creation and fd_run of one shape at one length in a fresh context; one report row.
   *key_ms: the plan's milliseconds per kernel it compiled (-1: it compiled none). */
static void bench_one(FILE *rep, const fd_gen_shape *g, int64_t len, const run_opts *o, double *key_ms) {
  fd_shape s = g->shape;
  s.kv_len = len;
  size_t nkv = (size_t)s.batch * s.n_kv_heads * (size_t)len * s.head_dim;
  int32_t *table = paged_identity(&s, &nkv);
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = o->threads, .precision = o->precision });
  fd_plan *plan;
  double t0 = now_ms();
  fd_plan_opts po = { o->chunk, o->tile, o->splits, o->threads, 0 };
  if (!ctx || fd_plan_create_opts(ctx, &s, &po, &plan)) {
    fprintf(rep, "| %s | %lld | failed: %s |\n", g->name, (long long)len, fd_errmsg(ctx));
    *key_ms = -1;
    fd_destroy(ctx);
    free(table);
    return;
  }
  double plan_ms = now_ms() - t0;
  fd_plan_info info;
  fd_plan_info_get(plan, len, &info);
  *key_ms = info.kernels_compiled ? plan_ms / info.kernels_compiled : -1;
  size_t kvb = t_kv_bytes(s.kv_dtype, nkv);            /* q8_0 / q4_0: 34 or 18 bytes per 32 elements */
  size_t nq = (size_t)s.batch * (s.q_len > 1 ? s.q_len : 1) * s.n_q_heads * s.head_dim;
  void *k = malloc(kvb), *v = malloc(kvb), *q = malloc(nq * 4), *out = malloc(nq * 4);
  float *mask = s.mask_mode == FD_MASK ? calloc((size_t)s.batch * (s.q_len > 1 ? s.q_len : 1) * s.n_q_heads * len, 4) : NULL;
  float *scales = fd_dtype_quant[s.kv_dtype] ? malloc(nkv / s.head_dim * 4) : NULL;
  int32_t *pos = malloc(sizeof(int32_t) * s.batch);
  memset(k, 0x3c, kvb); memset(v, 0x3c, kvb); memset(q, 0x3c, nq * 4);
  for (size_t i = 0; scales && i < nkv / s.head_dim; i++) scales[i] = 0.01f;
  for (int b = 0; b < s.batch; b++) pos[b] = (int32_t)(len - 1);
  fd_args a = { q, k, v, pos, mask, scales, scales, table, 0, out, NULL };
  float *heads = calloc((size_t)s.n_q_heads, 4);        /* FD_ALIBI slopes, FD_SINK_LOGITS logits: 0 */
  if (s.features & FD_ALIBI) a.alibi_slopes = heads;
  if (s.features & FD_SINK_LOGITS) a.sink_logits = heads;
  double t[32];
  int reps = o->reps ? o->reps : 7;
  fd_run(plan, &a);                                  /* warm-up */
  for (int r = 0; r < reps; r++) { t0 = now_ms(); fd_run(plan, &a); t[r] = now_ms() - t0; }
  double med = median(t, reps);
  fprintf(rep, "| %s | %lld | %.1f | %d | %.2f | %s | %d | %.3f | %.2f |\n", g->name, (long long)len, plan_ms,
          info.kernels_compiled, info.kernels_compiled ? info.compile_ms / info.kernels_compiled : 0.0, info.key,
          info.splits, med, kv_bytes(&s, pos) / med / 1e6);
  fflush(rep);
  free(k); free(v); free(q); free(out); free(mask); free(scales); free(pos); free(table); free(heads);
  fd_plan_destroy(plan);
  fd_destroy(ctx);
}

/* Sort x and write "median (q1-q3)" of its n values into buf. */
static const char *quartiles(double *x, int n, char *buf, size_t len) {
  if (n == 0) { snprintf(buf, len, "-"); return buf; }
  double m = median(x, n);
  snprintf(buf, len, "%.2f (%.2f-%.2f)", m, x[n / 4], x[3 * n / 4]);
  return buf;
}

/* The JIT section of the report: per compiled key, cold-context plan time and
   its breakdown (generator, compiler, source size) from the kernel store's
   records, then a second context planning the first shape again. */
static void bench_jit(FILE *rep, const double *key_ms, int n_rows, const fd_gen_shape *first, const run_opts *o) {
  static fd_kcache_record r[512];
  static double x[5][512];
  double start_ms = 0;
  int n = fd_kcache_records(r, 512, &start_ms), m = 0;
  for (int i = 0; i < n_rows; i++) if (key_ms[i] >= 0) x[4][m++] = key_ms[i];
  for (int i = 0; i < n; i++) {
    x[0][i] = r[i].gen_ms + r[i].compile_ms; x[1][i] = r[i].gen_ms; x[2][i] = r[i].compile_ms;
    x[3][i] = r[i].src_bytes / 1024.0;
  }
  size_t src = 0, bytes = 0;
  int disk = 0;
  for (int i = 0; i < n; i++) { src += r[i].src_bytes; bytes += r[i].byte_text; disk += r[i].from_disk; }
  char b[5][64];
  fprintf(rep, "\n## JIT per key (%d keys compiled, process-wide kernel store; %d sources read from the "
               "cache directory, %s)\n\n"
               "| per key | median (q1-q3) |\n|---|---|\n"
               "| cold-context plan ms / compiled key (%d plans) | %s |\n| generate + compile ms | %s |\n"
               "| generate ms (embedded Lua, or reading a kept source) | %s |\n| compile ms (tcc) | %s |\n"
               "| source KB | %s |\n\n",
          n, disk, getenv("FD_CACHE_DIR") ? "$FD_CACHE_DIR set" : "none kept: $FD_CACHE_DIR unset", m,
          quartiles(x[4], m, b[4], 64), quartiles(x[0], n, b[0], 64), quartiles(x[1], n, b[1], 64),
          quartiles(x[2], n, b[2], 64), quartiles(x[3], n, b[3], 64));
  fprintf(rep, "`.byte` text: %.0f%% of the generated source. Starting the embedded generator "
               "(once per process, inside the first key's time): %.2f ms.\n", src ? 100.0 * bytes / src : 0.0, start_ms);
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = o->threads });
  fd_shape s = first->shape;
  s.kv_len = first->kv_lens[0];
  fd_plan *plan;
  fd_plan_info info = { 0 };
  double t0 = now_ms();
  int ok = ctx && !fd_plan_create(ctx, &s, &plan);
  double ms = now_ms() - t0;
  if (ok) { fd_plan_info_get(plan, s.kv_len, &info); fd_plan_destroy(plan); }
  fprintf(rep, "A second context planning %s kv_len %lld: %s, %d kernels compiled, %.2f ms.\n", first->name,
          (long long)s.kv_len, ok ? "ok" : fd_errmsg(ctx), info.kernels_compiled, ms);
  fd_destroy(ctx);
}

/* `fdgen bench`: plan time, JIT time per key and fd_run time over a shape set (warm cache). */
static int cmd_bench(const command *c, const run_opts *o) {
  fd_gen_shape *sh;
  int n;
  char err[4096];
  const char *src = o->arg ? o->arg : DEFAULT_SHAPES;
  if (fd_gen_shapes(src, NULL, &sh, &n, err, sizeof err)) { fprintf(stderr, "fdgen %s: %s\n", c->name, err); return 2; }
  FILE *rep = o->report ? fopen(o->report, "w") : stdout;
  if (!rep) { fprintf(stderr, "fdgen bench: -o %s: cannot write the report\n", o->report); free(sh); return 1; }
  fprintf(rep, "# Planning, JIT and fd_run times (`fdgen bench %s`)\n\nmachine %s (%s), %d threads, tcc backend, "
          "portable-C kernels, warm cache, median of %d runs after one warm-up.\n\n", src, fd_machine_name(),
          "see results/bench for bandwidth", o->threads, o->reps ? o->reps : 7);
  fprintf(rep, "| shape | kv_len | plan ms | kernels JIT | JIT ms/key | key | splits | fd_run ms | KV GB/s |\n"
               "|---|---|---|---|---|---|---|---|---|\n");
  double key_ms[512];
  int rows = 0;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < sh[i].n_lens && rows < 512; j++) {
      if (rep != stdout) fprintf(stderr, "fdgen bench: %s kv_len %lld\n", sh[i].name, (long long)sh[i].kv_lens[j]);
      bench_one(rep, &sh[i], sh[i].kv_lens[j], o, &key_ms[rows++]);
    }
  if (n > 0) bench_jit(rep, key_ms, rows, &sh[0], o);
  if (rep != stdout) fclose(rep);
  free(sh);
  return 0;
}

/* The plan's choice for s at its kv_len in a context of table (NULL: none) and threads; 0 or 1 on failure. */
static int planned(const char *table, int threads, const fd_shape *s, fd_plan_info *info) {
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = threads, .table = table });
  fd_plan *plan = NULL;
  int rc = !ctx || fd_plan_create(ctx, s, &plan) || fd_plan_info_get(plan, s->kv_len, info);
  if (rc) fprintf(stderr, "fdgen predict: %s\n", fd_errmsg(ctx));
  fd_plan_destroy(plan);
  fd_destroy(ctx);
  return rc;
}

/* `fdgen predict`: the cost model's five best configurations for a shape, against the heuristic. */
static int cmd_predict(const command *c, const run_opts *o) {
  fd_gen_shape *sh;
  int n;
  char err[4096];
  int inline_spec = strchr(o->shape, '=') != NULL;
  const char *src = inline_spec ? o->shape : o->shapes ? o->shapes : DEFAULT_SHAPES;
  if (fd_gen_shapes(src, inline_spec ? NULL : o->shape, &sh, &n, err, sizeof err)) {
    fprintf(stderr, "fdgen %s: %s\n", c->name, err);
    return 2;
  }
  fd_shape s = sh[0].shape;
  if (o->kv_len) s.kv_len = o->kv_len;
  if (s.layout == FD_PAGED && s.pool_pages < 1 && s.page_size > 0)   /* a pool of every row's pages */
    s.pool_pages = rows_pages(&s);
  print_shape(stdout, sh[0].name, &s);
  free(sh);
  fd_table *t = fd_table_load(o->table, err, sizeof err);
  if (!t) { fprintf(stderr, "fdgen predict: %s\n", err); return 1; }
  int rc = 1;
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = o->threads });
  fd_plan_info h, with;
  if (!t->model.present) fprintf(stderr, "fdgen predict: %s carries no cost model (no model lines)\n", o->table);
  else if (ctx && !planned(NULL, o->threads, &s, &h) && !planned(o->table, o->threads, &s, &with)) {
    int threads = fd_ctx_threads(ctx), max_isa = fd_ctx_max_isa(ctx);
    int64_t len = fd_length_bucket(s.kv_len) < s.kv_len ? fd_length_bucket(s.kv_len) : s.kv_len;
    fd_model_pick best[5], hp = { h.chunk, h.group_tile, h.isa, h.splits, h.threads, 0 };
    int k = fd_model_rank(&t->model, &s, len, max_isa, threads, best, 5);
    double hs = fd_model_score(&t->model, &s, len, &hp);
    printf("cost model of %s, max isa %d, threads %d, length %lld\n", o->table, max_isa, threads, (long long)len);
    printf("rank  config              score       predicted time / heuristic's\n");
    for (int i = 0; i < k; i++)
      printf("%4d  c%d.t%d.s%d.p%d.i%d%*s %10.6f  %.3f\n", i + 1, best[i].chunk, best[i].tile, best[i].splits,
             best[i].threads, best[i].isa, 4, "", best[i].score, exp(best[i].score - hs));
    printf("heur  c%d.t%d.s%d.p%d.i%d%*s %10.6f  1.000\n", hp.chunk, hp.tile, hp.splits, hp.threads, hp.isa, 4, "", hs);
    fd_model_pick pick;
    int mine = fd_model_decide(&t->model, &s, len, max_isa, threads, &hp, &pick);
    if (!mine) pick = hp;
    printf("the planner takes the best of score plus its move's margin (kernel %.3f, splits %.3f, threads %.3f; "
           "splits at most %g x the heuristic's) when that predicts it %.0f%% faster than the heuristic's\n",
           t->model.limit[FD_MODEL_MARGIN_KERNEL], t->model.limit[FD_MODEL_MARGIN_SPLITS],
           t->model.limit[FD_MODEL_MARGIN_THREADS], t->model.limit[FD_MODEL_SPLITS_UP], 100 * (1 - exp(-FD_MODEL_MARGIN)));
    printf("decision  c%d.t%d.s%d.p%d.i%d %s\n", pick.chunk, pick.tile, pick.splits, pick.threads, pick.isa,
           mine ? "model" : "heuristic");
    printf("the planner with this table: c%d.t%d.s%d.p%d.i%d (%s)\n", with.chunk, with.group_tile, with.splits,
           with.threads, with.isa, with.from_table == 1 ? "its row" : with.from_table == 2 ? "the cost model" : "the heuristic");
    rc = 0;
  }
  fd_destroy(ctx);
  fd_table_free(t);
  return rc;
}

/* `fdgen machine`: this machine's name (the tuned table's file name). */
static int cmd_machine(const command *c, const run_opts *o) {
  (void)c; (void)o;
  printf("%s\n", fd_machine_name());
  return 0;
}

/* `fdgen help [COMMAND]`. */
static int cmd_help(const command *c, const run_opts *o) {
  (void)c;
  if (!o->arg) { write_overview(); return 0; }
  const command *t = find_command(o->arg);
  if (!t) return usage_error(NULL, "help: unknown command '%s'", o->arg);
  return print_help(t);
}

int main(int argc, char **argv) {
  if (argc < 2) return usage_error(NULL, "no command given");
  if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) { write_overview(); return 0; }
  const command *c = find_command(argv[1]);
  if (!c) return usage_error(NULL, "unknown command '%s'", argv[1]);
  if (c->lua) return fd_gen_cli(argc, argv);
  run_opts o = { .seed = 1 };
  int rc = parse_args(c, argc, argv, &o);
  return rc >= 0 ? rc : c->run(c, &o);
}
