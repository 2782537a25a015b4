/* `make bench-isa`: two plans of one shape that differ only in the isa (A: the
   planner's own choice, or a forced one; B: forced), timed cold and
   interleaved in one process (the order alternates each round; before each
   call the caches are flushed as the benchmark's and the tuner's are:
   fdb_flush_caches), for the bf16 grouped shapes of
   issue 18 at 1 thread and at all cores. Prints a Markdown report: each
   plan's key, median ms and GB/s, and the median of the per-round ratios
   B/A with its quartiles. It asserts no speed; it fails only when a plan or
   a call fails.
     isa_ab [ISA_A ISA_B [ROUNDS]]   fd_plan_opts.isa values (default 0 = the
                                     planner's choice, and FD_ISA_AVX512_BF16) */
#include "bw.h"
#include "flashdecode.h"
#include "util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { CALLS = 3 };

/* One row: its name and shape (bf16 q, K, V and out, causal, BHSD). */
typedef struct { const char *name; int batch, hq, hkv, d; long len; } isa_row;
static const isa_row ROWS[] = {
  { "falcon-40b-bf16", 32, 128, 8, 64, 2048 },
  { "mqa-b8-bf16", 8, 8, 1, 128, 16384 },
  { "llama3-8b-bf16", 1, 32, 8, 128, 65536 },
};

/* Ascending doubles, for qsort. */
static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The median ms of CALLS cold calls of plan p. */
static double cold_ms(const fd_plan *p, const fd_args *a, int *rc) {
  double t[CALLS];
  for (int i = 0; i < CALLS; i++) {
    if (fdb_flush_caches()) *rc = 1;
    double s = fdb_now();
    if (fd_run(p, a)) *rc = 1;
    t[i] = (fdb_now() - s) * 1e3;
  }
  qsort(t, CALLS, sizeof *t, by_value);
  return t[CALLS / 2];
}

/* Plan shape s with the isa forced (0: the planner's choice) into *p; its key into key. */
static int plan_isa(fd_ctx *c, const fd_shape *s, int isa, int threads, fd_plan **p, char *key) {
  fd_plan_opts o = { .isa = isa, .threads = threads };
  fd_plan_info info;
  if (fd_plan_create_opts(c, s, &o, p) || fd_plan_info_get(*p, s->kv_len, &info)) {
    fprintf(stderr, "isa_ab: plan with isa %d: %s\n", isa, fd_errmsg(c));
    return 1;
  }
  snprintf(key, 24, "%s", info.key);
  return 0;
}

/* Time row r at threads threads, rounds rounds; print its table line. */
static int run_row(fd_ctx *c, const isa_row *r, int isa_a, int isa_b, int threads, int rounds) {
  fd_shape s = { .batch = r->batch, .n_q_heads = r->hq, .n_kv_heads = r->hkv, .head_dim = r->d, .kv_len = r->len,
                 .q_dtype = FD_BF16, .kv_dtype = FD_BF16, .out_dtype = FD_BF16, .mask_mode = FD_CAUSAL, .layout = FD_BHSD };
  size_t kv = (size_t)r->batch * r->hkv * r->len * r->d, qn = (size_t)r->batch * r->hq * r->d;
  void *k = fdb_alloc(2 * kv), *v = fdb_alloc(2 * kv), *q = fdb_alloc(2 * qn), *out = fdb_alloc(2 * qn);
  int32_t *pos = malloc(sizeof *pos * r->batch);
  double *ta = malloc(sizeof *ta * rounds), *tb = malloc(sizeof *tb * rounds), *ratio = malloc(sizeof *ratio * rounds);
  fd_plan *pa = NULL, *pb = NULL;
  char ka[24], kb[24];
  int rc = !k || !v || !q || !out || !pos || !ta || !tb || !ratio;
  if (!rc) {
    fdb_fill(k, kv, 2, 1, -1, 1); fdb_fill(v, kv, 2, 2, -1, 1); fdb_fill(q, qn, 2, 3, -1, 1);
    for (int b = 0; b < r->batch; b++) pos[b] = (int32_t)(r->len - 1);
    rc = plan_isa(c, &s, isa_a, threads, &pa, ka) || plan_isa(c, &s, isa_b, threads, &pb, kb);
  }
  fd_args a = { .q = q, .k = k, .v = v, .cur_pos = pos, .out = out };
  for (int i = 0; !rc && i < rounds; i++) {
    int b_first = i & 1;
    double x = cold_ms(b_first ? pb : pa, &a, &rc), y = cold_ms(b_first ? pa : pb, &a, &rc);
    ta[i] = b_first ? y : x;
    tb[i] = b_first ? x : y;
    ratio[i] = tb[i] / ta[i];
  }
  if (!rc) {
    qsort(ta, rounds, sizeof *ta, by_value); qsort(tb, rounds, sizeof *tb, by_value);
    qsort(ratio, rounds, sizeof *ratio, by_value);
    double gb = 4.0 * kv / 1e9;
    printf("| %s | %ld | %d | `%s` | %.3f | %.1f | `%s` | %.3f | %.1f | %.3f | %.3f-%.3f |\n", r->name, r->len, threads, ka,
           ta[rounds / 2], gb / ta[rounds / 2] * 1e3, kb, tb[rounds / 2], gb / tb[rounds / 2] * 1e3, ratio[rounds / 2],
           ratio[rounds / 4], ratio[3 * rounds / 4]);
    fflush(stdout);
  }
  fd_plan_destroy(pa); fd_plan_destroy(pb);
  free(k); free(v); free(q); free(out); free(pos); free(ta); free(tb); free(ratio);
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

int main(int argc, char **argv) {
  int isa_a = argc > 1 ? atoi(argv[1]) : 0, isa_b = argc > 2 ? atoi(argv[2]) : FD_ISA_AVX512_BF16;
  int rounds = argc > 3 ? atoi(argv[3]) : 11;
  if (rounds < 1) { fprintf(stderr, "isa_ab: ROUNDS %d is not positive\n", rounds); return 2; }
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  fd_ctx *c = fd_create(&(fd_config){ .threads = (int)cores });
  if (!c) { fprintf(stderr, "isa_ab: %s\n", fd_errmsg(NULL)); return 1; }
  char model[128];
  printf("# isa A/B: %s\n\n- CPU: %s, %ld online cores; flashdecode templates `%s`\n", fd_machine_name(),
         cpu_model(model, sizeof model), cores, fd_build_templates_hash());
  printf("- A: opts.isa %d (0 = the planner's choice), B: opts.isa %d; each plan's chunk, tile and splits the planner's\n",
         isa_a, isa_b);
  printf("- Method: bf16 q, K, V and out, causal; per round %d cold calls of each plan (before each call all threads "
         "read one word per line of %zu MiB: fdb_flush_caches), the order alternating per round, %d rounds; ms = median "
         "of the rounds' medians; B/A = median of the per-round ratios, with quartiles\n\n", CALLS, fdb_flush_bytes() >> 20,
         rounds);
  printf("| shape | kv_len | threads | key A | ms A | GB/s A | key B | ms B | GB/s B | B/A | quartiles |\n");
  printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  int rc = 0, counts[2] = { 1, (int)cores };
  for (int t = 0; t < 2 && !rc; t++)
    for (size_t r = 0; r < sizeof ROWS / sizeof *ROWS && !rc; r++)
      rc = run_row(c, &ROWS[r], isa_a, isa_b, counts[t], rounds);
  fd_destroy(c);
  return rc;
}
