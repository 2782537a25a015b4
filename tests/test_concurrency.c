/* Concurrency and lifetime (issue 13): one plan run from several threads,
   plans created concurrently (with and without a kernel-cache bound),
   fd_destroy racing plan creation and runs, the cc backend falling back to
   tcc when its cache directory cannot be used, and the kernel-cache bound
   (config.max_kernels) over thousands of distinct plans with RSS flat. Every
   plan's serial result is checked once against the double-precision
   reference; concurrent runs must then reproduce it bit for bit, and a
   refused run must leave out and lse untouched. Built normally, under
   ThreadSanitizer (tests/tsan.mk) and under ASan+UBSan. */
#include "flashdecode.h"
#include "internal.h"          /* fd_kcache_count: the number of kernels a context holds */
#include "ref.h"
#include "tcheck.h"
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1            /* slower, and RSS is the sanitizer's: fewer bound plans, no RSS check */
#else
#define SANITIZED 0
#endif

#define ITERS 100              /* iterations of each concurrency scenario */
#define THREADS 4              /* caller threads per scenario */
#define SENTINEL 0x5a
#define BOUND 64               /* max_kernels of the bound test */
#define RSS_MARGIN_KB 2048     /* allowed RSS growth between 10% and 100% of the bound test's plans */

/* A problem: shape, forced options, f32 inputs, and a serial run's out and lse. */
typedef struct problem {
  fd_shape s;
  fd_plan_opts o;
  float *q, *k, *v, *out, *lse;
  int32_t *cur_pos;
  size_t n_out, n_lse;
} problem;

/* The shapes the concurrency scenarios use (f32 throughout). */
static const struct { fd_shape s; fd_plan_opts o; } SHAPES[] = {
  { { 2, 8, 2, 64, 300, FD_F32, FD_F32, FD_F32, FD_CAUSAL, FD_BHSD, 0 }, { .splits = 3 } },
  { { 1, 4, 4, 32, 200, FD_F32, FD_F32, FD_F32, FD_FULL, FD_BSHD, 0 }, { 0 } },
  { { 2, 4, 1, 16, 150, FD_F32, FD_F32, FD_F32, FD_CAUSAL, FD_BHSD, 0 }, { .splits = 2 } },
  { { 1, 2, 1, 48, 100, FD_F32, FD_F32, FD_F32, FD_FULL, FD_BHSD, 0 }, { .splits = 2 } },
};
#define N_SHAPES (int)(sizeof SHAPES / sizeof SHAPES[0])
static problem probs[N_SHAPES];

/* n random floats in [-1, 1). */
static float *rand_floats(size_t n, uint64_t *st) {
  float *x = malloc(n * sizeof *x);
  for (size_t i = 0; i < n; i++) x[i] = t_rand(st, -1, 1);
  return x;
}

/* Allocate p's inputs for shape s (random, seeded) and its result buffers. */
static void problem_alloc(problem *p, fd_shape s, fd_plan_opts o, uint64_t seed) {
  memset(p, 0, sizeof *p);
  p->s = s; p->o = o;
  size_t kv = (size_t)s.batch * s.n_kv_heads * (size_t)s.kv_len * s.head_dim;
  p->n_lse = (size_t)s.batch * s.n_q_heads;
  p->n_out = p->n_lse * s.head_dim;
  p->q = rand_floats(p->n_out, &seed);
  p->k = rand_floats(kv, &seed);
  p->v = rand_floats(kv, &seed);
  p->cur_pos = malloc(sizeof(int32_t) * s.batch);
  for (int b = 0; b < s.batch; b++) p->cur_pos[b] = (int32_t)(s.kv_len - 1 - 37 * b % s.kv_len);
  p->out = malloc(p->n_out * sizeof(float));
  p->lse = malloc(p->n_lse * sizeof(float));
}

/* Free p's buffers. */
static void problem_free(problem *p) {
  free(p->q); free(p->k); free(p->v); free(p->cur_pos); free(p->out); free(p->lse);
}

/* fd_args for p writing to out and lse. */
static fd_args args_of(const problem *p, void *out, float *lse) {
  fd_args a = { 0 };
  a.q = p->q; a.k = p->k; a.v = p->v; a.cur_pos = p->cur_pos; a.out = out; a.lse = lse;
  return a;
}

/* Largest error of out/lse against the double reference of p (out/lse of the problem's size). */
static double ref_error(const problem *p, const float *out, const float *lse) {
  ref_problem r = { p->s.batch, p->s.n_q_heads, p->s.n_kv_heads, p->s.head_dim, p->s.kv_len,
                    (int)p->s.mask_mode, (int)p->s.layout, p->q, p->k, p->v, p->cur_pos, NULL,
                    1.0 / sqrt((double)p->s.head_dim) };
  double *ro = malloc(p->n_out * sizeof *ro), *rl = malloc(p->n_lse * sizeof *rl), err = 0;
  ref_attention(&r, ro, rl);
  for (size_t i = 0; i < p->n_out; i++) err = fmax(err, fabs(out[i] - ro[i]));
  for (size_t i = 0; i < p->n_lse; i++) err = fmax(err, fabs(lse[i] - rl[i]) / fmax(1, fabs(rl[i])));
  free(ro); free(rl);
  return err;
}

/* Plan and run p serially in c, keep the results, check them against the reference. */
static void problem_expect(problem *p, fd_ctx *c, const char *name) {
  fd_plan *plan;
  int rc = fd_plan_create_opts(c, &p->s, &p->o, &plan);
  if (!t_check(rc == 0, "%s: plan: %s", name, fd_errmsg(c))) return;
  fd_args a = args_of(p, p->out, p->lse);
  rc = fd_run(plan, &a);
  double err = rc ? INFINITY : ref_error(p, p->out, p->lse);
  t_check(err < 1e-4, "%s: serial run against the double reference: rc %d, error %.3g", name, rc, err);
  fd_plan_destroy(plan);
}

enum { RUN_OK, RUN_REFUSED, RUN_BAD };

/* Whether n bytes of buf still hold the sentinel. */
static int untouched(const void *buf, size_t n) {
  for (size_t i = 0; i < n; i++) if (((const unsigned char *)buf)[i] != SENTINEL) return 0;
  return 1;
}

/* Run plan on p: RUN_OK when it gives the serial results bit for bit,
   RUN_REFUSED when it fails with FD_EDESTROYED and writes nothing, else RUN_BAD. */
static int run_outcome(const fd_plan *plan, const problem *p) {
  float *out = malloc(p->n_out * sizeof *out), *lse = malloc(p->n_lse * sizeof *lse);
  memset(out, SENTINEL, p->n_out * sizeof *out);
  memset(lse, SENTINEL, p->n_lse * sizeof *lse);
  fd_args a = args_of(p, out, lse);
  int rc = fd_run(plan, &a), r = RUN_BAD;
  if (rc == 0 && !memcmp(out, p->out, p->n_out * sizeof *out) && !memcmp(lse, p->lse, p->n_lse * sizeof *lse)) r = RUN_OK;
  if (rc == FD_EDESTROYED && untouched(out, p->n_out * sizeof *out) && untouched(lse, p->n_lse * sizeof *lse)) r = RUN_REFUSED;
  free(out); free(lse);
  return r;
}

/* A thread's work and tallies. */
typedef struct worker {
  fd_ctx *c;
  const fd_plan *plan;       /* a shared plan, or NULL */
  int which;                 /* the problem it plans or runs */
  int rounds;
  int runs[3];               /* outcomes: RUN_OK, RUN_REFUSED, RUN_BAD */
  int created, refused_early, refused_late, other_rc;
} worker;

/* Run the shared plan `rounds` times. */
static void *run_rounds(void *arg) {
  worker *w = arg;
  for (int i = 0; i < w->rounds; i++) w->runs[run_outcome(w->plan, &probs[w->which])]++;
  return NULL;
}

/* Run the shared plan until a run is not RUN_OK (its context destroyed). */
static void *run_until_refused(void *arg) {
  worker *w = arg;
  for (int o = RUN_OK; o == RUN_OK; ) w->runs[o = run_outcome(w->plan, &probs[w->which])]++;
  return NULL;
}

/* Create a plan, run it 3 times, destroy it; `rounds` times or until refused. */
static void *create_run_destroy(void *arg) {
  worker *w = arg;
  const problem *p = &probs[w->which];
  for (int i = 0; i < w->rounds; i++) {
    fd_plan *plan = NULL;
    int rc = fd_plan_create_opts(w->c, &p->s, &p->o, &plan);
    if (rc == FD_EDESTROYED && plan == NULL) {   /* fd_errmsg reads only this thread's message here */
      if (strstr(fd_errmsg(w->c), "while the plan was created")) w->refused_late++;
      else w->refused_early++;
      return NULL;
    }
    if (rc) { w->other_rc++; return NULL; }
    w->created++;
    for (int r = 0; r < 3; r++) w->runs[run_outcome(plan, p)]++;
    fd_plan_destroy(plan);
  }
  return NULL;
}

/* Start n threads on fn over w[0..n-1] and join them. */
static void run_threads(void *(*fn)(void *), worker *w, int n) {
  pthread_t t[THREADS];
  for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, fn, &w[i]);
  for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
}

/* Sum the tallies of n workers into *sum. */
static void add_tallies(worker *sum, const worker *w, int n) {
  for (int i = 0; i < n; i++) {
    for (int o = 0; o < 3; o++) sum->runs[o] += w[i].runs[o];
    sum->created += w[i].created; sum->other_rc += w[i].other_rc;
    sum->refused_early += w[i].refused_early; sum->refused_late += w[i].refused_late;
  }
}

/* THREADS threads run plans of one context (a pool of 3 threads) ITERS times
   each: three share a plan of 12 work items, one runs a plan of 2 (so the
   pool's jobs alternate between 3 and 2 threads). */
static void shared_plan(void) {
  fd_ctx *c = fd_create(&(fd_config){ .threads = 3 });
  fd_plan *plan, *small;
  if (!t_check(c && fd_plan_create_opts(c, &probs[0].s, &probs[0].o, &plan) == 0 &&
               fd_plan_create_opts(c, &probs[3].s, &probs[3].o, &small) == 0, "shared plan: create")) return;
  worker w[THREADS] = { 0 }, sum = { 0 };
  for (int i = 0; i < THREADS; i++) w[i] = (worker){ .plan = i ? plan : small, .which = i ? 0 : 3, .rounds = ITERS };
  run_threads(run_rounds, w, THREADS);
  add_tallies(&sum, w, THREADS);
  t_check(sum.runs[RUN_OK] == THREADS * ITERS, "shared plan: %d of %d runs from %d threads give the serial results bit for bit",
          sum.runs[RUN_OK], THREADS * ITERS, THREADS);
  fd_plan_destroy(plan);
  fd_plan_destroy(small);
  fd_destroy(c);
}

/* ITERS times, THREADS threads create plans of two shapes at once (pairs
   share kernels), run and destroy them: odd iterations in one context bounded
   to 4 kernels (each iteration's 6 keys evict the last one's, so compiles
   race evictions), even ones in an unbounded context made fresh every 10. */
static void concurrent_creation(void) {
  worker sum = { 0 };
  int contexts = 0, over_bound = 0;
  fd_ctx *bounded = fd_create(&(fd_config){ .threads = 2, .max_kernels = 4 }), *fresh = NULL;
  for (int it = 0; it < ITERS; it++) {
    if (it % 10 == 0) { fd_destroy(fresh); fresh = fd_create(&(fd_config){ .threads = 2 }); contexts += fresh != NULL; }
    fd_ctx *c = it % 2 ? bounded : fresh;
    if (!c) continue;
    worker w[THREADS];
    for (int i = 0; i < THREADS; i++) w[i] = (worker){ .c = c, .which = (it / 2 + i / 2) % N_SHAPES, .rounds = 2 };
    run_threads(create_run_destroy, w, THREADS);
    add_tallies(&sum, w, THREADS);
    over_bound += c == bounded && fd_kcache_count(c->kernels) > 4;
  }
  fd_destroy(fresh);
  fd_destroy(bounded);
  int want = ITERS * THREADS * 2;
  t_check(bounded && contexts == ITERS / 10 && sum.created == want && sum.other_rc + sum.refused_early + sum.refused_late == 0,
          "concurrent creation: %d of %d plans created (%d refused, %d other errors)", sum.created, want,
          sum.refused_early + sum.refused_late, sum.other_rc);
  t_check(sum.runs[RUN_OK] == 3 * want && sum.runs[RUN_BAD] == 0,
          "concurrent creation: %d of %d runs give the serial results bit for bit", sum.runs[RUN_OK], 3 * want);
  t_check(over_bound == 0, "concurrent creation: the bounded context held more than 4 kernels after %d iterations", over_bound);
}

/* Microseconds to create a plan of p in a fresh context (generator start and compiles included). */
static double create_time_us(const problem *p) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  fd_ctx *c = fd_create(&(fd_config){ .threads = 2 });
  fd_plan *plan = NULL;
  if (c) fd_plan_create_opts(c, &p->s, &p->o, &plan);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  fd_plan_destroy(plan);
  fd_destroy(c);
  return (t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) / 1e3;
}

/* ITERS times: fd_destroy after 0 to 4 (sanitized: 2) times a creation's
   time while 2 threads create, run and destroy plans and (every other
   iteration) 2 threads run a plan made before. */
static void destroy_racing(void) {
  worker sum = { 0 };
  int unfinished = 0, info_bad = 0;
  uint64_t st = 99;
  double span = create_time_us(&probs[1]) * (SANITIZED ? 2 : 4);   /* destroy before, during or after creations */
  for (int it = 0; it < ITERS; it++) {
    fd_ctx *c = fd_create(&(fd_config){ .threads = 2 });
    if (!t_check(c != NULL, "destroy racing: context %d", it)) return;
    fd_plan *kept = NULL;
    int n = 2;
    worker w[THREADS];
    w[0] = (worker){ .c = c, .which = 1, .rounds = 1 << 30 };
    w[1] = (worker){ .c = c, .which = 2 + it % 2, .rounds = 1 << 30 };
    if (it % 2 == 0 && fd_plan_create_opts(c, &probs[0].s, &probs[0].o, &kept) == 0) {
      w[2] = w[3] = (worker){ .c = c, .plan = kept, .which = 0 };
      n = 4;
    }
    pthread_t t[THREADS];
    for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, i < 2 ? create_run_destroy : run_until_refused, &w[i]);
    usleep((useconds_t)t_rand(&st, 0, (float)span));
    fd_destroy(c);
    for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
    for (int i = 2; i < n; i++) unfinished += w[i].runs[RUN_REFUSED] != 1;
    fd_plan_info info = { 0 };
    info_bad += kept && (fd_plan_info_get(kept, probs[0].s.kv_len, &info) || !info.key[0]);
    add_tallies(&sum, w, n);
    fd_plan_destroy(kept);                       /* frees the context when it is the last reference */
  }
  printf("destroy racing (destroy after 0-%.0f us): %d plans created, %d creations refused at entry and %d in flight, %d runs ok, %d refused\n",
         span, sum.created, sum.refused_early, sum.refused_late, sum.runs[RUN_OK], sum.runs[RUN_REFUSED]);
  t_check(sum.runs[RUN_BAD] == 0, "destroy racing: %d runs wrote something or failed otherwise", sum.runs[RUN_BAD]);
  t_check(sum.other_rc == 0, "destroy racing: %d creations failed with a code other than FD_EDESTROYED", sum.other_rc);
  t_check(sum.refused_early + sum.refused_late == 2 * ITERS, "destroy racing: %d of %d creating threads stopped by FD_EDESTROYED",
          sum.refused_early + sum.refused_late, 2 * ITERS);
  t_check(unfinished == 0, "destroy racing: %d running threads did not end with one FD_EDESTROYED", unfinished);
  t_check(info_bad == 0, "destroy racing: fd_plan_info_get failed %d times on a plan of a destroyed context", info_bad);
}

/* A cc context whose cache_dir cannot be used runs on tcc, says why in fd_errmsg, and plans and runs. */
static void cc_fallback_case(const char *dir, const char *name) {
  fd_ctx *c = fd_create(&(fd_config){ .threads = 2, .backend = FD_BACKEND_CC, .cache_dir = dir });
  if (!t_check(c != NULL, "cc fallback, %s: fd_create: %s", name, fd_errmsg(NULL))) return;
  const char *msg = fd_errmsg(c);
  t_check(fd_ctx_backend(c) == FD_BACKEND_TCC && strstr(msg, "cc backend") && strstr(msg, dir) && strstr(msg, "using tcc"),
          "cc fallback, %s: backend %d, fd_errmsg '%s'", name, fd_ctx_backend(c), msg);
  fd_plan *plan;
  int rc = fd_plan_create_opts(c, &probs[1].s, &probs[1].o, &plan);
  if (t_check(rc == 0, "cc fallback, %s: plan rc %d: %s", name, rc, fd_errmsg(c))) {
    t_check(run_outcome(plan, &probs[1]) == RUN_OK, "cc fallback, %s: the run gives the tcc results", name);
    fd_plan_destroy(plan);
  }
  t_check(strstr(fd_errmsg(c), "using tcc") != NULL, "cc fallback, %s: the warning stays after a successful call", name);
  fd_destroy(c);
}

/* Each cache_dir the cc backend cannot use; a usable one keeps cc. */
static void cc_fallback(void) {
  char file[] = "/tmp/fd-conc-file-XXXXXX", under[64], dir[] = "/tmp/fd-conc-dir-XXXXXX";
  int fd = mkstemp(file);
  if (!t_check(fd >= 0 && mkdtemp(dir), "cc fallback: temporary file and directory")) return;
  close(fd);
  snprintf(under, sizeof under, "%s/sub", file);
  cc_fallback_case(file, "a regular file");
  cc_fallback_case(under, "a path under a regular file");
  cc_fallback_case("/proc/fd-conc-cache", "a directory that cannot be made (procfs)");
  cc_fallback_case("/proc/self", "a directory that cannot be written (procfs)");
  fd_ctx *c = fd_create(&(fd_config){ .threads = 1, .backend = FD_BACKEND_CC, .cache_dir = dir });
  t_check(c && fd_ctx_backend(c) == FD_BACKEND_CC && !*fd_errmsg(c), "cc with a usable cache_dir: backend %d, '%s'",
          c ? fd_ctx_backend(c) : -1, c ? fd_errmsg(c) : fd_errmsg(NULL));
  fd_destroy(c);
  unlink(file);
  rmdir(dir);
}

/* Resident set size in KiB. */
static long rss_kb(void) {
  long pages = 0, resident = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f && fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  if (f) fclose(f);
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

/* The i-th distinct plan of the bound test: head_dim 1..5, chunk 1.. (portable C, one kv head). */
static void bound_shape(int i, fd_shape *s, fd_plan_opts *o) {
  *s = (fd_shape){ 1, 1, 1, 1 + i % 5, 8, FD_F32, FD_F32, FD_F32, FD_FULL, FD_BHSD, 0 };
  *o = (fd_plan_opts){ .chunk = 1 + i / 5, .isa = FD_ISA_C };
}

/* Plan, run against the reference and (unless keep) destroy the i-th bound plan; 0 on success. */
static int bound_plan(fd_ctx *c, problem *small, int i, fd_plan **keep, int *compiled) {
  fd_shape s; fd_plan_opts o; fd_plan *p; fd_plan_info info = { 0 };
  bound_shape(i, &s, &o);
  if (fd_plan_create_opts(c, &s, &o, &p)) return -1;
  const problem *pr = &small[s.head_dim - 1];
  float out[5], lse[1];
  fd_args a = args_of(pr, out, lse);
  int bad = fd_run(p, &a) || ref_error(pr, out, lse) > 1e-4 || fd_plan_info_get(p, 8, &info);
  if (compiled) *compiled = info.kernels_compiled;
  if (keep) *keep = p; else fd_plan_destroy(p);
  return bad ? -1 : 0;
}

/* n distinct plans, one at a time, under max_kernels BOUND: the cache never
   holds more than BOUND kernels, RSS stays flat, a plan kept alive keeps its
   kernels, the oldest keys are recompiled and the newest still cached. */
static void kernel_bound(int n) {
  fd_ctx *c = fd_create(&(fd_config){ .threads = 1, .max_kernels = BOUND });
  if (!t_check(c != NULL, "bound: context")) return;
  problem small[5];
  for (int d = 1; d <= 5; d++)
    problem_alloc(&small[d - 1], (fd_shape){ 1, 1, 1, d, 8, FD_F32, FD_F32, FD_F32, FD_FULL, FD_BHSD, 0 }, (fd_plan_opts){ 0 }, 50 + d);
  fd_plan *kept = NULL;
  int failed = bound_plan(c, small, 5 * 4000, &kept, NULL) != 0, compiled = -1;
  size_t most = 0;
  long rss_early = 0;
  double t0 = clock();
  for (int i = 0; i < n; i++) {
    failed += bound_plan(c, small, i, NULL, NULL) != 0;
    size_t k = fd_kcache_count(c->kernels);
    if (k > most) most = k;
    if (i + 1 == n / 10) rss_early = rss_kb();
  }
  long rss_late = rss_kb();
  printf("bound: %d plans in %.1f s CPU, at most %zu kernels cached, RSS %ld KiB after %d plans, %ld KiB after %d\n",
         n, (clock() - t0) / CLOCKS_PER_SEC, most, rss_early, n / 10, rss_late, n);
  t_check(failed == 0, "bound: %d of %d plans failed or gave wrong results", failed, n + 1);
  t_check(most <= BOUND, "bound: at most %zu kernels cached (max_kernels %d)", most, BOUND);
  if (!SANITIZED)
    t_check(rss_late - rss_early <= RSS_MARGIN_KB, "bound: RSS grew %ld KiB from %d to %d plans (allowed %d)",
            rss_late - rss_early, n / 10, n, RSS_MARGIN_KB);
  const problem *pk = &small[kept ? kept->shape.head_dim - 1 : 0];
  float out[5], lse[1];
  fd_args a = args_of(pk, out, lse);
  t_check(kept && fd_run(kept, &a) == 0 && ref_error(pk, out, lse) < 1e-4, "bound: a plan kept alive still runs correctly");
  fd_plan_destroy(kept);
  t_check(bound_plan(c, small, 0, NULL, &compiled) == 0 && compiled == 3, "bound: the oldest plan's 3 kernels were evicted and recompiled (%d)", compiled);
  t_check(bound_plan(c, small, n - 1, NULL, &compiled) == 0 && compiled == 0, "bound: the newest plan's kernels are still cached (%d compiled)", compiled);
  fd_destroy(c);
  for (int d = 0; d < 5; d++) problem_free(&small[d]);
}

/* A negative bound is refused, naming the field. */
static void bad_bound(void) {
  fd_ctx *c = fd_create(&(fd_config){ .max_kernels = -1 });
  t_check(!c && strstr(fd_errmsg(NULL), "config.max_kernels"), "config.max_kernels -1 refused: '%s'", fd_errmsg(NULL));
  fd_destroy(c);
}

int main(int argc, char **argv) {
  int n_bound = argc > 1 ? atoi(argv[1]) : SANITIZED ? 300 : 5000;
  fd_ctx *c = fd_create(&(fd_config){ .threads = 2 });
  if (!t_check(c != NULL, "setup context: %s", fd_errmsg(NULL))) return t_done();
  for (int i = 0; i < N_SHAPES; i++) {
    char name[32];
    snprintf(name, sizeof name, "shape %d", i);
    problem_alloc(&probs[i], SHAPES[i].s, SHAPES[i].o, 1000 + i);
    problem_expect(&probs[i], c, name);
  }
  fd_destroy(c);
  bad_bound();
  shared_plan();
  concurrent_creation();
  destroy_racing();
  cc_fallback();
  kernel_bound(n_bound);
  for (int i = 0; i < N_SHAPES; i++) problem_free(&probs[i]);
  return t_done();
}
