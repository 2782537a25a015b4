/* fd_config.deterministic = 1 (batch-invariant results): one batch row of a
   Llama-3.1-8B tensor-parallel shard (GQA 8/2, head_dim 128, bf16 q and KV,
   f32 out so that no rounding to bf16 hides a difference) at lengths
   1, 100, 5000 and 20000 gives the same out and lse bits with 1, 2, 3, 4 and 7
   threads, alone or inside batches with shorter and longer rows, run after
   run, on each backend (tcc; cc in a temporary cache_dir); those results and
   the default mode's are within f32 rounding of the double reference and of
   each other. Also the item layout (splits at multiples of
   FD_DETERMINISTIC_SPLIT_KEYS, each key once), the plan facts, a tuned table
   left unused and the two refusals deterministic mode adds. */
#include "compare.h"
#include "internal.h"
#include "tcheck.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HQ 8
#define HKV 2
#define D 128
#define CAP 20480                      /* kv_len (capacity) of every plan */
#define NOUT (HQ * D)                  /* out elements of one batch row */
#define N_LENS 4
#define N_THREADS 5
#define N_BATCHES 4
#define REPEATS 2

static const int64_t LENS[N_LENS] = { 1, 100, 5000, 20000 };
static const int THREADS[N_THREADS] = { 1, 2, 3, 4, 7 };

/* A batch holding the tested row at index at (its len slot 0), other rows of the lengths given. */
typedef struct batch_spec { int B, at; int64_t len[4]; const char *name; } batch_spec;
static const batch_spec BATCHES[N_BATCHES] = {
  { 1, 0, { 0 }, "alone" },
  { 3, 0, { 0, 7, 20479 }, "first of 3 (7, 20479 keys)" },
  { 4, 3, { 20300, 3000, 9000, 0 }, "last of 4 (20300, 3000, 9000 keys)" },
  { 2, 1, { 20479, 0 }, "second of 2 (20479 keys)" },
};

/* One row's result: out (f32) and lse. */
typedef struct row_result { float out[NOUT]; float lse[HQ]; } row_result;

static kproblem batches[N_BATCHES];    /* each with the tested row (batches[0] is the row alone) */

/* The batch problems: random rows, then the row of batches[0] copied to index at. */
static void make_batches(void) {
  for (int i = 0; i < N_BATCHES; i++) {
    const batch_spec *bs = &BATCHES[i];
    kproblem *p = &batches[i];
    kp_init(p, bs->B, HQ, HKV, D, CAP, FD_BF16, FD_BF16, FD_F32, FD_CAUSAL, FD_BHSD, 700 + (uint64_t)i);
    if (i == 0) continue;
    size_t kv = (size_t)HKV * CAP * D;
    memcpy(p->qf + (size_t)bs->at * NOUT, batches[0].qf, NOUT * sizeof(float));
    memcpy(p->kf + bs->at * kv, batches[0].kf, kv * sizeof(float));
    memcpy(p->vf + bs->at * kv, batches[0].vf, kv * sizeof(float));
    kp_sync(p);
  }
}

/* Set the batch's lengths with the tested row at len keys. */
static void set_lengths(kproblem *p, const batch_spec *bs, int64_t len) {
  for (int b = 0; b < bs->B; b++) p->cur_pos[b] = (int32_t)((b == bs->at ? len : bs->len[b]) - 1);
}

/* The fd_shape of batch problem p. */
static fd_shape shape_of(const kproblem *p) {
  return (fd_shape){ p->ref.B, HQ, HKV, D, CAP, FD_BF16, FD_BF16, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
}

/* Run batch i with the tested row at len keys on ctx; its row into r (lse
   unless no_lse). 0 on success, else the check recorded why. */
static int run_row(fd_ctx *ctx, int i, int64_t len, int no_lse, row_result *r, const char *name) {
  const batch_spec *bs = &BATCHES[i];
  kproblem *p = &batches[i];
  set_lengths(p, bs, len);
  fd_shape s = shape_of(p);
  float *out = malloc((size_t)bs->B * NOUT * sizeof(float));
  float *lse = malloc((size_t)bs->B * HQ * sizeof(float));
  fd_args a = { p->q, p->k, p->v, p->cur_pos, NULL, NULL, NULL, NULL, 0, out, no_lse ? NULL : lse };
  fd_plan *plan = NULL;
  int rc = fd_plan_create(ctx, &s, &plan);
  if (!rc) rc = fd_run(plan, &a);
  t_check(rc == 0, "%s: plan and run: %s", name, fd_errmsg(ctx));
  if (!rc) {
    memcpy(r->out, out + (size_t)bs->at * NOUT, sizeof r->out);
    if (!no_lse) memcpy(r->lse, lse + (size_t)bs->at * HQ, sizeof r->lse);
  }
  fd_plan_destroy(plan);
  free(out); free(lse);
  return rc;
}

/* Check that r has the bits of want (out always, lse when with_lse), naming the first difference. */
static void same_bits(const row_result *r, const row_result *want, int with_lse, const char *name) {
  for (int i = 0; i < NOUT; i++)
    if (memcmp(&r->out[i], &want->out[i], sizeof(float))) {
      t_check(0, "%s: out[%d] %.9g, baseline %.9g", name, i, r->out[i], want->out[i]);
      return;
    }
  for (int h = 0; with_lse && h < HQ; h++)
    if (memcmp(&r->lse[h], &want->lse[h], sizeof(float))) {
      t_check(0, "%s: lse[%d] %.9g, baseline %.9g", name, h, r->lse[h], want->lse[h]);
      return;
    }
  t_check(1, "%s", name);
}

/* The double reference of the row alone at len keys. */
static void reference(int64_t len, double *rout, double *rlse) {
  set_lengths(&batches[0], &BATCHES[0], len);
  ref_attention(&batches[0].ref, rout, rlse);
}

/* Check r against the double reference of the row at len keys. */
static void against_reference(const row_result *r, int64_t len, const char *name) {
  double rout[NOUT], rlse[HQ];
  reference(len, rout, rlse);
  t_compare(&batches[0], r->out, r->lse, rout, rlse, 1, name);
}

/* The default mode against deterministic mode's bits: out within the
   problem's tolerance of the reference's scale, lse within KP_LSE_TOL. */
static void near_deterministic(const row_result *def, const row_result *det, int64_t len, const char *name) {
  double rout[NOUT], rlse[HQ], most = 0, scale;
  reference(len, rout, rlse);
  scale = max_abs_d(rout, NOUT);
  for (int i = 0; i < NOUT; i++) {
    double d = fabs((double)def->out[i] - det->out[i]);
    if (d > most) most = d;
  }
  t_check(most <= t_tolerance(&batches[0]) * (scale > 0 ? scale : 1), "%s: out differs by %.3g (reference scale %.3g)",
          name, most, scale);
  for (int h = 0; h < HQ; h++)
    if (!t_check(fabs((double)def->lse[h] - det->lse[h]) <= KP_LSE_TOL * fmax(1, fabs(det->lse[h])),
                 "%s: lse[%d] %.9g vs %.9g", name, h, def->lse[h], det->lse[h]))
      return;
}

/* One backend: every length x thread count x batch x repeat against the
   first result (1 thread, alone), which the reference checks. base[len] gets it. */
static void backend_matrix(fd_backend be, const char *cache_dir, const char *tag, row_result base[N_LENS]) {
  char name[256];
  for (int t = 0; t < N_THREADS; t++) {
    fd_ctx *ctx = fd_create(&(fd_config){ .threads = THREADS[t], .backend = be, .cache_dir = cache_dir, .deterministic = 1 });
    if (!t_check(ctx != NULL, "%s: context with %d threads: %s", tag, THREADS[t], fd_errmsg(NULL))) continue;
    t_check(fd_ctx_backend(ctx) == (int)be, "%s: backend %d in use (%s)", tag, (int)be, fd_errmsg(ctx));
    for (int l = 0; l < N_LENS; l++)
      for (int i = 0; i < N_BATCHES; i++)
        for (int rep = 0; rep < REPEATS; rep++) {
          row_result r;
          snprintf(name, sizeof name, "%s deterministic: len %lld, %d threads, %s, run %d", tag, (long long)LENS[l],
                   THREADS[t], BATCHES[i].name, rep + 1);
          if (run_row(ctx, i, LENS[l], 0, &r, name)) continue;
          if (t == 0 && i == 0 && rep == 0) { base[l] = r; against_reference(&r, LENS[l], name); }
          else same_bits(&r, &base[l], 1, name);
        }
    fd_destroy(ctx);
  }
}

/* The default mode (tcc, 2 and 7 threads, alone and in a batch): within f32
   rounding of the reference and of deterministic mode's result; and a
   deterministic run without lse keeps the out bits. */
static void default_mode(const row_result base[N_LENS]) {
  static const int threads[] = { 2, 7 };
  char name[256];
  for (int t = 0; t < 2; t++) {
    fd_ctx *ctx = fd_create(&(fd_config){ .threads = threads[t] });
    if (!t_check(ctx != NULL, "default context: %s", fd_errmsg(NULL))) continue;
    for (int l = 0; l < N_LENS; l++)
      for (int i = 0; i < N_BATCHES; i += 2) {
        row_result r;
        snprintf(name, sizeof name, "default mode: len %lld, %d threads, %s", (long long)LENS[l], threads[t],
                 BATCHES[i].name);
        if (run_row(ctx, i, LENS[l], 0, &r, name)) continue;
        against_reference(&r, LENS[l], name);
        near_deterministic(&r, &base[l], LENS[l], name);
      }
    fd_destroy(ctx);
  }
  fd_ctx *det = fd_create(&(fd_config){ .threads = 2, .deterministic = 1 });
  for (int l = 0; det && l < N_LENS; l++) {
    row_result r;
    snprintf(name, sizeof name, "deterministic without lse: len %lld, out bits kept", (long long)LENS[l]);
    if (!run_row(det, 0, LENS[l], 1, &r, name)) same_bits(&r, &base[l], 0, name);
  }
  fd_destroy(det);
}

/* The items of a deterministic plan for batch i: each row's splits at
   multiples of FD_DETERMINISTIC_SPLIT_KEYS, in order, covering its keys once. */
static void item_layout(fd_ctx *ctx, int i, int64_t len) {
  const batch_spec *bs = &BATCHES[i];
  kproblem *p = &batches[i];
  set_lengths(p, bs, len);
  fd_shape s = shape_of(p);
  fd_args a = { p->q, p->k, p->v, p->cur_pos, NULL, NULL, NULL, NULL, 0, p->q, NULL };
  fd_plan *plan = NULL;
  const fd_item *items = NULL;
  int n = fd_plan_create(ctx, &s, &plan) ? -1 : fd_exec_items(plan, &a, &items);
  if (!t_check(n > 0, "items, %s, len %lld: %s", bs->name, (long long)len, fd_errmsg(ctx))) { fd_plan_destroy(plan); return; }
  for (int b = 0; b < bs->B; b++)
    for (int j = 0; j < HKV; j++) {
      int64_t want = p->cur_pos[b] + 1, next = 0;
      int s_next = 0, ok = 1;
      for (int k = 0; k < n; k++) {
        if (items[k].b != b || items[k].j != j) continue;
        ok &= items[k].s == s_next++ && items[k].begin == next && items[k].end > items[k].begin &&
              items[k].begin % FD_DETERMINISTIC_SPLIT_KEYS == 0 &&
              items[k].end - items[k].begin <= FD_DETERMINISTIC_SPLIT_KEYS;
        next = items[k].end;
      }
      t_check(ok && next == want && s_next == (want + FD_DETERMINISTIC_SPLIT_KEYS - 1) / FD_DETERMINISTIC_SPLIT_KEYS,
              "items, %s, len %lld: row %d kv head %d: %d splits ending at %lld (want %lld keys, every %d)", bs->name,
              (long long)len, b, j, s_next, (long long)next, (long long)want, FD_DETERMINISTIC_SPLIT_KEYS);
    }
  fd_plan_destroy(plan);
}

/* Plan facts: one key for every length, splits ceil(len / K) whatever the threads. */
static void plan_facts(fd_ctx *ctx, const char *tag, char key[24]) {
  fd_shape s = shape_of(&batches[2]);
  fd_plan *plan = NULL;
  if (!t_check(!fd_plan_create(ctx, &s, &plan), "%s: plan: %s", tag, fd_errmsg(ctx))) return;
  for (int l = 0; l < N_LENS; l++) {
    fd_plan_info info;
    fd_plan_info_get(plan, LENS[l], &info);
    int want = (int)((LENS[l] + FD_DETERMINISTIC_SPLIT_KEYS - 1) / FD_DETERMINISTIC_SPLIT_KEYS);
    if (!*key) snprintf(key, 24, "%s", info.key);
    t_check(info.splits == want && !strcmp(info.key, key) && !info.from_table,
            "%s: len %lld: splits %d (want %d), key %s (want %s), from_table %d", tag, (long long)LENS[l], info.splits,
            want, info.key, key, info.from_table);
  }
  fd_plan_destroy(plan);
}

/* The refusals: config.deterministic outside 0..1, forced splits in a deterministic context. */
static void refusals(fd_ctx *det) {
  fd_ctx *bad = fd_create(&(fd_config){ .deterministic = 2 });
  t_check(!bad && strstr(fd_errmsg(NULL), "config.deterministic"), "deterministic = 2 refused naming the field: '%s'",
          fd_errmsg(NULL));
  fd_destroy(bad);
  fd_shape s = shape_of(&batches[0]);
  fd_plan *plan = NULL;
  int rc = fd_plan_create_opts(det, &s, &(fd_plan_opts){ .splits = 2 }, &plan);
  t_check(rc == FD_EINVAL && !plan && strstr(fd_errmsg(det), "opts.splits"), "forced splits refused: rc %d, '%s'", rc,
          fd_errmsg(det));
}

/* A tuned table with a row for the row alone at 20000 keys (chunk 64, 3
   splits, 1 thread): the default mode takes it, deterministic mode ignores it
   (the same key and bits as without a table). */
static void table_ignored(const row_result base[N_LENS]) {
  char path[] = "/tmp/fd_determinism_table_XXXXXX", head[2048], sig[192], key[24] = "";
  fd_shape s = shape_of(&batches[0]);
  fd_ctx *plain = fd_create(&(fd_config){ .threads = 2, .deterministic = 1 });
  plan_facts(plain, "deterministic, no table", key);
  fd_destroy(plain);
  int fd = mkstemp(path);
  FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
  if (!t_check(f && *key, "table file and key")) return;
  fd_tuned_table_header(head, sizeof head);
  fd_shape_signature(&s, sig, sizeof sig);
  fprintf(f, "%s%s\t%lld\t%.1s0064%s\t3\t1\t100.0\t1.0\t100.0\tt\t-\nend\t1\n", head, sig,
          (long long)fd_length_bucket(LENS[3]), key, key + 5);
  fclose(f);
  for (int det = 0; det < 2; det++) {
    fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2, .table = path, .deterministic = det });
    fd_plan *plan = NULL;
    fd_plan_info info = { 0 };
    if (ctx && !fd_plan_create(ctx, &s, &plan)) fd_plan_info_get(plan, LENS[3], &info);
    fd_plan_destroy(plan);
    if (det) t_check(!info.from_table && !strcmp(info.key, key), "deterministic ignores the table: from_table %d key %s (want %s)",
                     info.from_table, info.key, key);
    else t_check(info.from_table && info.chunk == 64 && info.splits == 3, "default mode takes the table: from_table %d chunk %d "
                 "splits %d (%s)", info.from_table, info.chunk, info.splits, ctx ? fd_errmsg(ctx) : fd_errmsg(NULL));
    row_result r;
    if (det && ctx && !run_row(ctx, 0, LENS[3], 0, &r, "deterministic with a table"))
      same_bits(&r, &base[3], 1, "deterministic with a table: the bits without one");
    fd_destroy(ctx);
  }
  unlink(path);
}

/* Layout, facts and refusals on tcc contexts of 1 and 7 threads. */
static void structure(void) {
  char key[24] = "";
  for (int t = 0; t < N_THREADS; t += N_THREADS - 1) {
    fd_ctx *ctx = fd_create(&(fd_config){ .threads = THREADS[t], .deterministic = 1 });
    if (!t_check(ctx != NULL, "context: %s", fd_errmsg(NULL))) continue;
    char tag[64];
    snprintf(tag, sizeof tag, "plan facts, %d threads", THREADS[t]);
    plan_facts(ctx, tag, key);
    for (int l = 0; l < N_LENS; l++)
      for (int i = 0; i < N_BATCHES; i++) item_layout(ctx, i, LENS[l]);
    refusals(ctx);
    fd_destroy(ctx);
  }
}

int main(void) {
  static row_result base_tcc[N_LENS], base_cc[N_LENS];
  make_batches();
  backend_matrix(FD_BACKEND_TCC, NULL, "tcc", base_tcc);
  default_mode(base_tcc);
  table_ignored(base_tcc);
  char tmp[] = "/tmp/fd_determinism_XXXXXX";
  const char *dir = getenv("FD_TEST_CACHE_DIR");
  if (!dir) dir = mkdtemp(tmp);
  if (t_check(dir != NULL, "temporary cache_dir")) backend_matrix(FD_BACKEND_CC, dir, "cc", base_cc);
  structure();
  if (dir == tmp) {                  /* our own cache directory: its files, then itself */
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) printf("note: could not remove %s\n", tmp);
  }
  for (int i = 0; i < N_BATCHES; i++) kp_free(&batches[i]);
  return t_done();
}
