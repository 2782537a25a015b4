/* The process-wide kernel store: a second context compiles nothing for keys a
   first one compiled (and still runs them correctly against the double
   reference), contexts planning the same new shape at once compile each key
   once, a context's max_kernels bound stays its own, and the store keeps at
   most FD_SPARE_KERNELS kernels no context holds (the oldest are recompiled).
   Sources kept in a cache_dir are read back by the next process, and one that
   was edited, cut short or emptied since is generated and written again. */
#include "flashdecode.h"
#include "internal.h"          /* FD_SPARE_KERNELS, fd_kcache_count, fd_kcache_records */
#include "problem.h"
#include "tcheck.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#define RACERS 4               /* contexts planning one new shape at the same time */

/* A small portable-C shape: head_dim d, chunk c (distinct keys for distinct (d, c)). */
static fd_shape small_shape(int d, fd_plan_opts *o, int c) {
  *o = (fd_plan_opts){ .chunk = c, .isa = FD_ISA_C };
  return (fd_shape){ 1, 2, 1, d, 40, FD_F32, FD_F32, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
}

/* Plan s in a fresh context, run it on a random problem, compare with the
   reference; the plan's kernels_compiled (-1 when planning failed, -2 when the
   output is wrong). */
static int plan_fresh_in(const fd_shape *s, const fd_plan_opts *o, int max_kernels, const char *cache_dir) {
  fd_ctx *c = fd_create(&(fd_config){ .threads = 2, .max_kernels = max_kernels, .cache_dir = cache_dir });
  fd_plan *p;
  if (!c || fd_plan_create_opts(c, s, o, &p)) { fd_destroy(c); return -1; }
  fd_plan_info info;
  fd_plan_info_get(p, s->kv_len, &info);
  kproblem k;
  kp_init(&k, s->batch, s->n_q_heads, s->n_kv_heads, s->head_dim, s->kv_len, s->q_dtype, s->kv_dtype, s->out_dtype,
          s->mask_mode, s->layout, 7);
  size_t nout = (size_t)s->batch * s->n_q_heads * s->head_dim, nl = (size_t)s->batch * s->n_q_heads;
  float *out = malloc(nout * 4), *lse = malloc(nl * 4);
  double *rout = malloc(nout * 8), *rlse = malloc(nl * 8);
  fd_args a = { k.q, k.k, k.v, k.cur_pos, k.mask, k.k_scale, k.v_scale, NULL, 0, out, lse };
  int ok = fd_run(p, &a) == 0;
  ref_attention(&k.ref, rout, rlse);
  kp_error e = kp_errors(&k, out, lse, rout, rlse);
  ok = ok && kp_error_ok(&k, &e, 1);
  free(out); free(lse); free(rout); free(rlse);
  kp_free(&k);
  fd_plan_destroy(p);
  fd_destroy(c);
  return ok ? info.kernels_compiled : -2;
}

/* plan_fresh_in with no cache directory. */
static int plan_fresh(const fd_shape *s, const fd_plan_opts *o, int max_kernels) {
  return plan_fresh_in(s, o, max_kernels, NULL);
}

/* In a child process (a store of its own), plan a fresh shape with dir as
   the tcc cache_dir and check it against the reference: 10 + the number of
   sources read from dir, or 1 when planning failed or the output was wrong. */
static int kept_child(const char *dir) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    fd_plan_opts o;
    fd_shape s = small_shape(7, &o, 3);
    int compiled = plan_fresh_in(&s, &o, 0, dir), disk = 0;
    fd_kcache_record r[8];
    int n = fd_kcache_records(r, 8, NULL);
    for (int i = 0; i < n; i++) disk += r[i].from_disk;
    _exit(compiled == 3 ? 10 + disk : 1);
  }
  int st = 0;
  return pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

/* The kept sources in dir (up to max paths into path); their count, and how
   many end with the check line. */
static int kept_files(const char *dir, char path[][512], int max, int *checked) {
  DIR *d = opendir(dir);
  int n = 0;
  *checked = 0;
  for (struct dirent *e; d && (e = readdir(d));) {
    if (strncmp(e->d_name, "src-", 4) || n >= max) continue;
    snprintf(path[n], 512, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path[n++], "rb");
    char tail[80] = "";
    if (f && fseek(f, -74, SEEK_END) == 0 && fread(tail, 1, 74, f) == 74)
      *checked += strstr(tail, "/* flashdecode kept source: FNV-1a of the text above ") == tail + 1;
    if (f) fclose(f);
  }
  if (d) closedir(d);
  return n;
}

/* Change the kept source at path: 0 a byte of its banner, 1 a line appended
   after the check line, 2 cut to half its length. */
static void spoil(const char *path, int how) {
  FILE *f = fopen(path, how == 1 ? "ab" : "r+b");
  if (!f) return;
  long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : 0;
  if (how == 0 && fseek(f, 3, SEEK_SET) == 0) fputc('#', f);
  if (how == 1) fputs("/* edited */\n", f);
  fclose(f);
  if (how == 2 && truncate(path, n / 2) != 0) perror(path);
}

/* Kept sources: written with their check line, read back by the next process,
   and each spoiled one generated and written again. Runs before any context:
   the children fork from a process without worker threads. */
static void kept_sources(void) {
  char dir[] = "/tmp/fd_kept_XXXXXX", path[8][512];
  if (!t_check(mkdtemp(dir) != NULL, "kept sources: a temporary directory")) return;
  int first = kept_child(dir), checked, n = kept_files(dir, path, 8, &checked);
  t_check(first == 10, "kept sources: the first process reads none (status %d: 10 + sources read)", first);
  t_check(n == 3 && checked == 3, "kept sources: 3 kept, each ending with its check line (%d kept, %d checked)", n, checked);
  int second = kept_child(dir);
  t_check(second == 13, "kept sources: a second process reads all 3 and runs them right (status %d)", second);
  for (int i = 0; i < n; i++) spoil(path[i], i % 3);
  int third = kept_child(dir);
  t_check(third == 10, "kept sources: a banner byte changed, a line appended, a file cut short: "
          "all 3 generated again, right (status %d)", third);
  n = kept_files(dir, path, 8, &checked);
  int fourth = kept_child(dir);
  t_check(checked == 3 && fourth == 13, "kept sources: written again with their check lines (%d of 3), then read "
          "(status %d)", checked, fourth);
  for (int i = 0; i < n; i++) unlink(path[i]);
  rmdir(dir);
}

/* A second context compiles nothing for keys a first one compiled. */
static void second_context(void) {
  fd_plan_opts o;
  fd_shape s = small_shape(3, &o, 1);
  int first = plan_fresh(&s, &o, 0), second = plan_fresh(&s, &o, 0), bounded = plan_fresh(&s, &o, 2);
  t_check(first == 3, "second context: the first context compiles 3 kernels (%d)", first);
  t_check(second == 0, "second context: a second context compiles nothing (%d)", second);
  t_check(bounded == 0, "second context: a context with max_kernels 2 reuses them too (%d)", bounded);
}

typedef struct racer { fd_shape s; fd_plan_opts o; int compiled; } racer;

/* One racing thread: plan the shared new shape in its own context. */
static void *race(void *arg) {
  racer *r = arg;
  r->compiled = plan_fresh(&r->s, &r->o, 0);
  return NULL;
}

/* RACERS contexts planning the same new shape at once compile each key once. */
static void concurrent_contexts(void) {
  racer r[RACERS];
  pthread_t th[RACERS];
  int total = 0, failed = 0;
  for (int i = 0; i < RACERS; i++) { r[i].s = small_shape(5, &r[i].o, 2); pthread_create(&th[i], NULL, race, &r[i]); }
  for (int i = 0; i < RACERS; i++) {
    pthread_join(th[i], NULL);
    failed += r[i].compiled < 0;
    total += r[i].compiled > 0 ? r[i].compiled : 0;
  }
  t_check(failed == 0, "concurrent contexts: %d of %d plans failed or gave wrong results", failed, RACERS);
  t_check(total == 3, "concurrent contexts: 3 kernels compiled in all, not %d", total);
}

/* Kernels no context holds: the store keeps the newest FD_SPARE_KERNELS. */
static void spare_bound(void) {
  int n = FD_SPARE_KERNELS / 3 + 4, failed = 0, compiled;
  fd_plan_opts o;
  for (int i = 0; i < n; i++) {
    fd_shape s = small_shape(1, &o, 1 + i);
    failed += plan_fresh(&s, &o, 0) != 3;
  }
  t_check(failed == 0, "spare bound: %d of %d new plans did not compile 3 kernels", failed, n);
  fd_shape s = small_shape(1, &o, n);
  compiled = plan_fresh(&s, &o, 0);
  t_check(compiled == 0, "spare bound: the newest plan's kernels kept (%d compiled)", compiled);
  s = small_shape(1, &o, 1);
  compiled = plan_fresh(&s, &o, 0);
  t_check(compiled == 3, "spare bound: the oldest plan's kernels evicted (%d compiled)", compiled);
}

/* Every compile so far left a breakdown record with its source's sizes. */
static void records(void) {
  fd_kcache_record r[64];
  double start = -1;
  int n = fd_kcache_records(r, 64, &start), bad = 0;
  for (int i = 0; i < n; i++) bad += r[i].src_bytes == 0 || r[i].gen_ms < 0 || r[i].compile_ms <= 0;
  t_check(n >= 6 && bad == 0 && start > 0, "records: %d compile records, %d implausible, generator start %.2f ms", n, bad, start);
}

int main(void) {
  kept_sources();
  second_context();
  concurrent_contexts();
  records();
  spare_bound();
  return t_done();
}
