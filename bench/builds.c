/* Two builds of the library, one plan: the kernels of two builds timed in one
   process, interleaved (the order alternates each round), for A/B runs of a
   kernel change. Both libflashdecode.so files are dlopen'ed with their own
   symbols (RTLD_LOCAL | RTLD_DEEPBIND); A plans each row with its heuristic
   (no tuned table: a table belongs to one build), B is forced to A's chunk,
   group tile, splits, threads and isa (fd_plan_create_opts; planes and
   precision each build's default), so with equal keys only the kernels'
   code differs. Rows: issue 18's bound shapes (bf16 q
   and out, causal, BHSD), MHA-32 over f16 KV, the memory-bound control
   (each K and V row read once: a change can gain on the grouped rows, whose
   heads read K again from the cache, and lose here), and Llama over ggml's
   q8_0 and q4_0 blocks (llama.cpp's quantized KV caches), warm at lengths whose
   K and V fit a 32 MiB last-level cache (the memory's level moves on a shared machine: warm, the
   ratio resolves a few percent), or cold at the bound lengths with the
   caches flushed before each call (fdb_flush_caches). Prints a Markdown
   table: each row's keys, median microseconds per call of A and B, and the
   median of the per-round ratios B/A with its quartiles; cold, also the
   median of the read bandwidth sampled before each round (fdb_call_bw_gbs,
   all cores: the level of the moment on a shared machine). It asserts no
   speed; it fails only when a library, a plan, a call or the rounds file fails.
     builds LIB_A LIB_B [ROUNDS [warm|cold]]   (`make bench-builds REV=...`)
   Environment, to reproduce one A/B of a kernel change at a chosen plan:
     FDB_ROWS    the rows to run, names separated by commas (default: all)
     FDB_BATCH   every row's batch instead of its own
     FDB_LEN     every row's kv_len instead of its warm or cold one
     FDB_CHUNK, FDB_TILE, FDB_SPLITS, FDB_ISA (a key's isa digit): A's plan
                 forced to them (fd_plan_opts) instead of its heuristic's;
                 FDB_TILE only on the rows whose group (Hq / Hkv) it divides
     FDB_THREADS both contexts' threads (default: all online cores): a
                 machine of more cores at the VMs' 2 threads
     FDB_ROUNDS_TSV a file that takes every round (cold only): shape, round,
                 read GB/s, A us, B us (bench/levels.lua splits the ratios by
                 memory level)
   A malformed value or an unknown row name is refused (exit 2). */
#include "bw.h"
#include "flashdecode.h"
#include "util.h"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { REPS = 5 };

/* One row: its name and shape (kv bf16, int8 with row scales, q8_0 or q4_0), warm and cold lengths. */
typedef struct row { const char *name; int batch, hq, hkv, d; fd_dtype kv; long warm_len, cold_len; } row;
static const row ROWS[] = {
  { "llama3-8b-bf16", 1, 32, 8, 128, FD_BF16, 4096, 65536 },
  { "mqa-b8-bf16", 8, 8, 1, 128, FD_BF16, 4096, 16384 },
  { "falcon-40b-bf16", 4, 128, 8, 64, FD_BF16, 2048, 2048 },
  { "llama3-8b-int8", 1, 32, 8, 128, FD_I8, 4096, 16384 },
  { "gemma2-9b-int8", 1, 16, 8, 256, FD_I8, 4096, 16384 },
  { "qwen2.5-7b-int8", 1, 28, 4, 128, FD_I8, 4096, 16384 },
  { "mqa-b8-int8", 8, 8, 1, 128, FD_I8, 4096, 16384 },
  { "mha-32-f16", 1, 32, 32, 128, FD_F16, 4096, 16384 },
  { "llama3-8b-q8_0", 1, 32, 8, 128, FD_Q8_0, 4096, 16384 },
  { "llama3-8b-q4_0", 1, 32, 8, 128, FD_Q4_0, 4096, 16384 },
};

/* The library calls the tool makes, from one build. */
typedef struct lib {
  fd_ctx *(*create)(const fd_config *);
  void (*destroy)(fd_ctx *);
  int (*plan_opts)(fd_ctx *, const fd_shape *, const fd_plan_opts *, fd_plan **);
  int (*info)(const fd_plan *, int64_t, fd_plan_info *);
  int (*run)(const fd_plan *, const fd_args *);
  void (*plan_destroy)(fd_plan *);
  const char *(*errmsg)(const fd_ctx *);
  fd_ctx *ctx;
} lib;

/* The overrides read from the environment (0: none; isa -1: none). */
typedef struct overrides { const char *rows; long batch, len, chunk, tile, splits, isa, threads; } overrides;
static overrides OV = { NULL, 0, 0, 0, 0, 0, -1, 0 };

/* Open the build at path and a context of all cores (FDB_THREADS: that many); 1 on failure (said on stderr). */
static int open_lib(const char *path, lib *l) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (!h) { fprintf(stderr, "builds: %s\n", dlerror()); return 1; }
  void *f[7] = { dlsym(h, "fd_create"), dlsym(h, "fd_destroy"), dlsym(h, "fd_plan_create_opts"),
                 dlsym(h, "fd_plan_info_get"), dlsym(h, "fd_run"), dlsym(h, "fd_plan_destroy"), dlsym(h, "fd_errmsg") };
  for (int i = 0; i < 7; i++)
    if (!f[i]) { fprintf(stderr, "builds: %s lacks a symbol the tool calls\n", path); return 1; }
  memcpy(&l->create, &f[0], sizeof f[0]); memcpy(&l->destroy, &f[1], sizeof f[1]);
  memcpy(&l->plan_opts, &f[2], sizeof f[2]); memcpy(&l->info, &f[3], sizeof f[3]);
  memcpy(&l->run, &f[4], sizeof f[4]); memcpy(&l->plan_destroy, &f[5], sizeof f[5]);
  memcpy(&l->errmsg, &f[6], sizeof f[6]);
  fd_config cfg = { .threads = (int)OV.threads };
  l->ctx = l->create(&cfg);
  if (!l->ctx) { fprintf(stderr, "builds: %s: no context\n", path); return 1; }
  return 0;
}

/* Read integer variable name into *v when set: 0, or 1 (said) when it is not
   an integer in [lo, hi]. */
static int env_long(const char *name, long lo, long hi, long *v) {
  const char *e = getenv(name);
  if (!e || !*e) return 0;
  char *end;
  long x = strtol(e, &end, 10);
  if (*end || x < lo || x > hi) {
    fprintf(stderr, "builds: %s='%s': want an integer from %ld to %ld\n", name, e, lo, hi);
    return 1;
  }
  *v = x;
  return 0;
}

/* The next name of the comma-separated list at *p (its length in *len), *p
   moved past it and its comma; NULL at the list's end. */
static const char *next_name(const char **p, size_t *len) {
  const char *s = *p, *comma = strchr(s, ',');
  if (!*s) return NULL;
  *len = comma ? (size_t)(comma - s) : strlen(s);
  *p = s + *len + (comma != NULL);
  return s;
}

/* Whether name is the first len bytes at s. */
static int same_name(const char *s, size_t len, const char *name) {
  return strlen(name) == len && strncmp(s, name, len) == 0;
}

/* Whether row name is among the comma-separated names of FDB_ROWS (all when unset). */
static int row_selected(const char *name) {
  if (!OV.rows) return 1;
  size_t len;
  for (const char *p = OV.rows, *s; (s = next_name(&p, &len));)
    if (same_name(s, len, name)) return 1;
  return 0;
}

/* Read the overrides; 1 (said, with the row names) on a malformed one. */
static int read_overrides(size_t nrows, const char *const *names) {
  if (env_long("FDB_BATCH", 1, 1 << 16, &OV.batch) || env_long("FDB_LEN", 1, 1L << 30, &OV.len) ||
      env_long("FDB_CHUNK", 1, 1 << 20, &OV.chunk) || env_long("FDB_TILE", 1, 1024, &OV.tile) ||
      env_long("FDB_SPLITS", 1, 1 << 16, &OV.splits) || env_long("FDB_ISA", 0, 9, &OV.isa) ||
      env_long("FDB_THREADS", 1, FD_MAX_THREADS, &OV.threads))
    return 1;
  const char *rows = getenv("FDB_ROWS");
  if (!rows || !*rows) return 0;
  OV.rows = rows;
  size_t len, i;
  for (const char *p = rows, *s; (s = next_name(&p, &len));) {   /* every listed name must be a row */
    for (i = 0; i < nrows && !same_name(s, len, names[i]); i++) {}
    if (i == nrows) {
      fprintf(stderr, "builds: FDB_ROWS: no row '%.*s'; the rows:", (int)len, s);
      for (i = 0; i < nrows; i++) fprintf(stderr, " %s", names[i]);
      fprintf(stderr, "\n");
      return 1;
    }
  }
  return 0;
}

/* Microseconds per call of plan p: REPS calls (cold: each after a flush), the median. */
static double time_us(const lib *l, const fd_plan *p, const fd_args *a, int cold, int *rc) {
  double t[REPS];
  for (int i = 0; i < REPS; i++) {
    if (cold && fdb_flush_caches()) *rc = 1;
    double s = fdb_now();
    if (l->run(p, a)) *rc = 1;
    t[i] = (fdb_now() - s) * 1e6;
  }
  qsort(t, REPS, sizeof *t, fdb_by_value);
  return t[REPS / 2];
}

/* Plan s in A with its heuristic (or the overrides) and in B with A's chunk,
   group tile, splits, threads and isa (planes and precision: each build's
   default); their keys into ka and kb (equal keys: the same kernel parameters). */
static int plan_both(lib *A, lib *B, const fd_shape *s, fd_plan **pa, fd_plan **pb, char *ka, char *kb) {
  int group = s->n_q_heads / s->n_kv_heads;   /* FDB_TILE where it divides the group, else the heuristic's */
  int tile = OV.tile && group % OV.tile == 0 ? (int)OV.tile : 0;
  fd_plan_opts forced = { .chunk = (int)OV.chunk, .group_tile = tile, .splits = (int)OV.splits, .isa = (int)OV.isa + 1 };
  fd_plan_info ia, ib;
  if (A->plan_opts(A->ctx, s, &forced, pa) || A->info(*pa, s->kv_len, &ia)) {
    fprintf(stderr, "builds: plan A: %s\n", A->errmsg(A->ctx));
    return 1;
  }
  /* fd_plan_info.isa is the key's digit; fd_plan_opts.isa the FD_ISA_ enum, digit + 1 */
  fd_plan_opts o = { .chunk = ia.chunk, .group_tile = ia.group_tile, .splits = ia.splits, .threads = ia.threads,
                     .isa = ia.isa + 1 };
  if (B->plan_opts(B->ctx, s, &o, pb) || B->info(*pb, s->kv_len, &ib)) {
    fprintf(stderr, "builds: plan B with A's choices: %s\n", B->errmsg(B->ctx));
    return 1;
  }
  snprintf(ka, 24, "%s", ia.key);
  snprintf(kb, 24, "%s", ib.key);
  return 0;
}

/* Time row r in both builds, rounds rounds (cold: the read bandwidth sampled
   before each, each round written to tsv when given); print its table line. */
static int run_row(lib *A, lib *B, const row *r, int rounds, int cold, FILE *tsv) {
  long len = OV.len ? OV.len : cold ? r->cold_len : r->warm_len;
  int batch = OV.batch ? (int)OV.batch : r->batch;
  fd_shape s = { .batch = batch, .n_q_heads = r->hq, .n_kv_heads = r->hkv, .head_dim = r->d, .kv_len = len,
                 .q_dtype = FD_BF16, .kv_dtype = r->kv, .out_dtype = FD_BF16, .mask_mode = FD_CAUSAL, .layout = FD_BHSD };
  fdb_rowbufs m;
  fd_plan *pa = NULL, *pb = NULL;
  char ka[24] = "", kb[24] = "";
  double *ta = malloc(sizeof *ta * rounds), *tb = malloc(sizeof *tb * rounds), *ratio = malloc(sizeof *ratio * rounds);
  double *bw = malloc(sizeof *bw * rounds);
  int rc = fdb_rowbufs_fill(&m, batch, r->hq, r->hkv, r->d, len, (int)r->kv);
  rc = rc || !ta || !tb || !ratio || !bw || plan_both(A, B, &s, &pa, &pb, ka, kb);
  fd_args a = { .q = m.q, .k = m.k, .v = m.v, .k_scale = m.ks, .v_scale = m.vs, .cur_pos = m.pos, .out = m.out };
  for (int i = 0; !rc && i < 3; i++) { time_us(A, pa, &a, 0, &rc); time_us(B, pb, &a, 0, &rc); }   /* warm-up */
  for (int i = 0; !rc && i < rounds; i++) {
    int b_first = i & 1;
    bw[i] = cold ? fdb_call_bw_gbs(0) : 0;   /* warm: no pass, it would evict the rows */
    double x = b_first ? time_us(B, pb, &a, cold, &rc) : time_us(A, pa, &a, cold, &rc);
    double y = b_first ? time_us(A, pa, &a, cold, &rc) : time_us(B, pb, &a, cold, &rc);
    ta[i] = b_first ? y : x;
    tb[i] = b_first ? x : y;
    ratio[i] = tb[i] / ta[i];
    if (tsv && fprintf(tsv, "%s\t%d\t%.2f\t%.1f\t%.1f\n", r->name, i, bw[i], ta[i], tb[i]) < 0) rc = 1;
  }
  if (!rc) {
    qsort(ta, rounds, sizeof *ta, fdb_by_value); qsort(tb, rounds, sizeof *tb, fdb_by_value);
    qsort(ratio, rounds, sizeof *ratio, fdb_by_value); qsort(bw, rounds, sizeof *bw, fdb_by_value);
    char bws[16] = "-";
    if (cold) snprintf(bws, sizeof bws, "%.1f", bw[rounds / 2]);
    printf("| %s | %d | %ld | `%s` | `%s` | %.1f | %.1f | %.3f | %.3f-%.3f | %s |\n", r->name, batch, len, ka, kb,
           ta[rounds / 2], tb[rounds / 2], ratio[rounds / 2], ratio[rounds / 4], ratio[3 * rounds / 4], bws);
    fflush(stdout);
  } else {
    fprintf(stderr, "builds: row %s failed\n", r->name);
  }
  if (pa) A->plan_destroy(pa);
  if (pb) B->plan_destroy(pb);
  fdb_rowbufs_free(&m); free(ta); free(tb); free(ratio); free(bw);
  return rc;
}

int main(int argc, char **argv) {
  fdb_passive_openmp(argv, "builds");
  int rounds = argc > 3 ? atoi(argv[3]) : 101, cold = argc > 4 && strcmp(argv[4], "cold") == 0;
  if (argc < 3 || rounds < 1 || (argc > 4 && !cold && strcmp(argv[4], "warm") != 0)) {
    fprintf(stderr, "usage: builds LIB_A LIB_B [ROUNDS [warm|cold]]\n");
    return 2;
  }
  const char *names[sizeof ROWS / sizeof *ROWS];
  for (size_t i = 0; i < sizeof ROWS / sizeof *ROWS; i++) names[i] = ROWS[i].name;
  if (read_overrides(sizeof ROWS / sizeof *ROWS, names)) return 2;
  const char *tsv_path = getenv("FDB_ROUNDS_TSV");
  FILE *tsv = NULL;
  if (tsv_path && *tsv_path) {
    if (!cold) { fprintf(stderr, "builds: FDB_ROUNDS_TSV takes the rounds of a cold run\n"); return 2; }
    if (!(tsv = fopen(tsv_path, "w"))) { fprintf(stderr, "builds: FDB_ROUNDS_TSV=%s: cannot write it\n", tsv_path); return 2; }
    fprintf(tsv, "# builds rounds: A %s, B %s, %d rounds, cold\nshape\tround\tread_gbs\ta_us\tb_us\n", argv[1], argv[2],
            rounds);
  }
  lib A, B;
  if (open_lib(argv[1], &A) || open_lib(argv[2], &B)) { if (tsv) fclose(tsv); return 1; }
  char threads[48] = "all cores";
  if (OV.threads) snprintf(threads, sizeof threads, "%ld thread(s) (FDB_THREADS)", OV.threads);
  printf("A: `%s`; B: `%s`; %d rounds, %s, %d calls per timing (the median), %s\n\n", argv[1], argv[2],
         rounds, cold ? "cold (caches flushed before each call)" : "warm", REPS, threads);
  printf("| shape | batch | kv_len | key A | key B | A us | B us | B/A median | B/A quartiles | read GB/s |\n");
  printf("|---|---|---|---|---|---|---|---|---|---|\n");
  int rc = 0;
  for (size_t i = 0; i < sizeof ROWS / sizeof *ROWS; i++)
    if (row_selected(ROWS[i].name)) rc |= run_row(&A, &B, &ROWS[i], rounds, cold, tsv);
  if (tsv && fclose(tsv)) { fprintf(stderr, "builds: FDB_ROUNDS_TSV=%s: write failed\n", tsv_path); rc = 1; }
  A.destroy(A.ctx);
  B.destroy(B.ctx);
  return rc;
}
