/* Sliding window and sink tokens (fd_shape.window, sink_tokens) and learned
   sink logits (FD_SINK_LOGITS) through the public API, against the
   double-precision reference run once per token with an additive mask that
   leaves exactly the visible keys: token t at position p sees keys
   p - window + 1 .. p and 0 .. sink_tokens - 1 (docs/DESIGN.md); a sink
   logit joins each head's denominator once: out x e^lse / (e^lse + e^sink),
   lse = log(e^lse + e^sink), with every split count. Every second case sets
   sink logits (one of them -inf, one of them 12), with and without a window.
   Every other pair of cases sets ALiBi (FD_ALIBI, the standard slopes
   2^(-8(h+1)/Hq)): the reference's mask then holds slope x (key - position),
   rounded to float as the kernels round it, on the visible keys.
   Every eighth of the cases rotates the logit softcap through 0, 30 and 50
   (the reference applies softcap x tanh(s / softcap) after the scale and
   before that mask), half of the capped ones with a softmax scale of 10, so
   that capped logits reach both of the kernels' tanh formulas. Capped cases
   put q and K on a grid of 1/16 (on_grid): every float dot product is then
   exact, so the error measured is the softcap's and the softmax's. Then
   softcap in every mask mode with scales up to 900 (logits up to about 1e4).
   Every isa this CPU runs, KV dtypes rotated with the q and out dtypes,
   q_len 1, 3 and 4, unsplit and 3 splits, windows of 1 key to wider than the
   cache, sinks inside the window, beside it and none; rows whose first token
   is at position 0, at the end of the cache and in between; the paged layout
   with the block-table entries of pages outside the window set to -1 (an
   engine frees them). Then: the work items of a 4096-key window over a 128k
   cache visit 4096 + sinks keys per (row, kv head), each once; and the
   refusals, out untouched. */
#include "compare.h"
#include "internal.h"
#include "cpu.h"
#include "tcheck.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NB 3
#define HKV 2
#define S_CAP 300
#define PAGE 16

static const int Q_LENS[] = { 1, 3, 4 };
#define N_Q_LENS (int)(sizeof Q_LENS / sizeof Q_LENS[0])
/* (window, sink_tokens): one key, short with a sink beside it, sinks inside
   the window (one range), medium with sinks, wider than the cache. */
static const int WINDOWS[][2] = { { 1, 0 }, { 7, 2 }, { 40, 20 }, { 64, 5 }, { 1000, 3 }, { 100, 0 }, { 0, 0 } };
#define N_WINDOWS (int)(sizeof WINDOWS / sizeof WINDOWS[0])

/* One case: K/V and positions from kp (causal), q [NB, q_len, Hq, D] from qp. */
typedef struct wcase { kproblem kp, qp; int q_len, window, sinks; float *logit, *slope, softcap; double scale; } wcase;

/* Build a case; positions: row 0 ends at S_CAP - 1, row 1 starts at 0, row 2 between. */
static void make(wcase *c, int Hq, int D, int qd, int kd, int od, int q_len, int window, int sinks, int logits,
                 int alibi, uint64_t seed) {
  c->q_len = q_len; c->window = window; c->sinks = sinks;
  c->logit = c->slope = NULL;
  c->softcap = 0;
  c->scale = 0;
  if (alibi) {
    c->slope = malloc(sizeof(float) * Hq);
    for (int h = 0; h < Hq; h++) c->slope[h] = (float)exp2(-8.0 * (h + 1) / Hq);
  }
  if (logits) {                          /* [Hq]: -inf (no sink), 12 (it dominates), the rest in [-1, 4) */
    uint64_t st = seed * 7 + 1;
    c->logit = malloc(sizeof(float) * Hq);
    for (int h = 0; h < Hq; h++) c->logit[h] = h == 1 ? -INFINITY : h == 2 ? 12.0f : t_rand(&st, -1.0f, 4.0f);
  }
  kp_init(&c->kp, NB, Hq, HKV, D, S_CAP, qd, kd, od, FD_CAUSAL, FD_BHSD, seed);
  kp_init(&c->qp, NB * q_len, Hq, HKV, D, 1, qd, kd, od, FD_FULL, FD_BHSD, seed + 1);
  c->kp.cur_pos[0] = S_CAP - 1;
  c->kp.cur_pos[1] = q_len - 1;
  c->kp.cur_pos[2] = q_len - 1 + (S_CAP - q_len) / 2;
}

/* Round q and K values to multiples of 1/16 and store them again: products
   and sums of up to 128 terms, also times a scale of few bits, stay exact. */
static void on_grid(kproblem *p) {
  const ref_problem *r = &p->ref;
  size_t nq = (size_t)r->B * r->Hq * r->D, nk = (size_t)r->B * r->Hkv * r->S * r->D;
  for (size_t i = 0; i < nq; i++) p->qf[i] = roundf(p->qf[i] * 16) / 16;
  for (size_t i = 0; i < nk; i++) p->kf[i] = roundf(p->kf[i] * 16) / 16;
  kp_sync(p);
}

static void unmake(wcase *c) { kp_free(&c->kp); kp_free(&c->qp); free(c->logit); free(c->slope); }

/* Whether token position p sees key k. */
static int visible(const wcase *c, int64_t p, int64_t k) {
  return k <= p && (c->window == 0 || k > p - c->window || k < c->sinks);
}

/* The reference of token t: mask mode with 0 on the visible keys, -inf elsewhere. */
static void reference(const void *cv, int t, double *rout, double *rlse) {
  const wcase *c = cv;
  const ref_problem *r = &c->kp.ref;
  size_t qrow = (size_t)r->Hq * r->D, mrow = (size_t)r->Hq * S_CAP;
  float *q = malloc(sizeof(float) * NB * qrow), *mask = malloc(sizeof(float) * NB * mrow);
  for (int b = 0; b < NB; b++) {
    memcpy(q + b * qrow, c->qp.qf + (size_t)(b * c->q_len + t) * qrow, sizeof(float) * qrow);
    int64_t p = c->kp.cur_pos[b] - c->q_len + 1 + t;
    for (int h = 0; h < r->Hq; h++)
      for (int64_t k = 0; k < S_CAP; k++)
        mask[b * mrow + (size_t)h * S_CAP + k] = !visible(c, p, k) ? -INFINITY
                                                 : c->slope ? (float)((double)c->slope[h] * (double)(k - p)) : 0.0f;
  }
  ref_problem rt = *r;
  rt.q = q;
  rt.mask = mask;
  rt.mask_mode = FD_MASK;
  rt.softcap = c->softcap;
  if (c->scale) rt.scale = c->scale;
  ref_attention(&rt, rout, rlse);
  for (int b = 0; b < NB && c->logit; b++)  /* the sink logit in the denominator */
    for (int h = 0; h < r->Hq; h++) {
      double l = rlse[b * r->Hq + h], s = c->logit[h], top = l > s ? l : s;
      double all = top == -INFINITY ? -INFINITY : top + log(exp(l - top) + exp(s - top));
      for (int d = 0; d < r->D; d++) rout[((size_t)b * r->Hq + h) * r->D + d] *= all == -INFINITY ? 0.0 : exp(l - all);
      rlse[b * r->Hq + h] = all;
    }
  free(q); free(mask);
}

/* The K/V (and scales) of c as a paged pool (tests/kexec.h), row b's page i
   at pool page b * per_row + i, and its block table with -1 for every page
   holding no key a token of its row sees. */
typedef kx_pool pool;

static void make_pool(const wcase *c, pool *pl) {
  int64_t per_row = (S_CAP + PAGE - 1) / PAGE;
  kx_pool_alloc(pl, &c->kp, NB * per_row, PAGE, NB * per_row);
  for (int b = 0; b < NB; b++)
    for (int64_t i = 0; i < per_row; i++) {
      int64_t pg = b * per_row + i, first = c->kp.cur_pos[b] - c->q_len + 1, used = 0;
      for (int64_t k = i * PAGE; k < (i + 1) * PAGE && k < S_CAP; k++)
        for (int64_t p = first; p <= c->kp.cur_pos[b]; p++) used |= visible(c, p, k);
      pl->table[pg] = used ? (int32_t)pg : -1;
      kx_pool_copy(pl, &c->kp, b, i, pg, PAGE);
    }
}

/* The case's shape. */
static fd_shape shape_of(const wcase *c, int paged) {
  const ref_problem *r = &c->kp.ref;
  fd_shape s = { NB, r->Hq, HKV, r->D, S_CAP, c->kp.q_dtype, c->kp.kv_dtype, c->kp.out_dtype, FD_CAUSAL,
                 paged ? FD_PAGED : FD_BHSD, paged ? PAGE : 0 };
  s.q_len = c->q_len;
  s.window = c->window;
  s.sink_tokens = c->sinks;
  s.softcap = c->softcap;
  s.features = (c->logit ? FD_SINK_LOGITS : 0) | (c->slope ? FD_ALIBI : 0);
  s.pool_pages = paged ? NB * ((S_CAP + PAGE - 1) / PAGE) : 0;
  return s;
}

/* Plan with opts and run case c (dense, or paged from pl) into out and lse; FD_OK or the code. */
static int plan_run(fd_ctx *ctx, const wcase *c, const pool *pl, const fd_plan_opts *o, void *out, float *lse) {
  fd_shape s = shape_of(c, pl != NULL);
  fd_args a = { c->qp.q, pl ? pl->k : c->kp.k, pl ? pl->v : c->kp.v, c->kp.cur_pos, NULL,
                pl ? pl->ks : c->kp.k_scale, pl ? pl->vs : c->kp.v_scale, pl ? pl->table : NULL, 0, out, lse };
  a.sink_logits = c->logit;
  a.alibi_slopes = c->slope;
  a.scale = (float)c->scale;
  return t_plan_run(ctx, &s, o, &a);
}

/* Check every token of a run against its reference (tests/compare.c). */
static void compare_tokens(const wcase *c, const void *out, const float *lse, const char *name) {
  t_compare_tokens(&c->kp, c->q_len, out, lse, reference, c, name);
}

/* One case against the reference, dense and (every third) paged. */
static void run_case(fd_ctx *ctx, int isa, int kd, int q_len, int wi, int splits, int idx) {
  int D = idx % 2 ? 128 : 64, chunk = idx % 2 ? 96 : 64, qd = idx % 3, od = idx / 3 % 3;
  if (D % fd_isa_table[isa].width) return;
  wcase c;
  make(&c, HKV * 4, D, qd, kd, od, q_len, WINDOWS[wi][0], WINDOWS[wi][1], idx / 2 % 2, idx / 4 % 2,
       900 + (uint64_t)idx);
  static const float CAPS[3] = { 0, 30, 50 };
  c.softcap = CAPS[idx / 8 % 3];
  c.scale = c.softcap && idx / 24 % 2 ? 10.0 : 0.0;
  if (c.softcap) { on_grid(&c.kp); on_grid(&c.qp); }
  size_t n = (size_t)NB * q_len * HKV * 4 * D;
  void *out = malloc(n * t_dtype_size(od));
  float *lse = malloc(sizeof(float) * NB * q_len * HKV * 4);
  fd_plan_opts o = { chunk, 4, splits, 2, isa + 1 };
  for (int paged = 0; paged <= (idx % 3 == 0); paged++) {
    char name[256];
    snprintf(name, sizeof name, "isa%d kv%s q%s out%s %s q_len %d window %d sinks %d%s splits%d chunk%d D%d", isa,
             fd_dtype_names[kd], fd_dtype_names[qd], fd_dtype_names[od], paged ? "paged" : "bhsd", q_len, c.window,
             c.sinks, c.logit ? " sink logits" : "", splits, chunk, D);
    if (c.slope) strncat(name, " alibi", sizeof name - strlen(name) - 1);
    if (c.softcap)
      snprintf(name + strlen(name), sizeof name - strlen(name), " softcap %g scale %g", (double)c.softcap, c.scale);
    pool pl;
    if (paged) make_pool(&c, &pl);
    int rc = plan_run(ctx, &c, paged ? &pl : NULL, &o, out, lse);
    if (t_check(rc == 0, "%s: run: %s", name, fd_errmsg(ctx))) compare_tokens(&c, out, lse, name);
    if (paged) kx_pool_free(&pl);
  }
  free(out); free(lse);
  unmake(&c);
}

/* Every isa, KV dtype, token count, window and split setting. */
static void sweep(void) {
  int idx = 0;
  for (int isa = 0; isa < FD_ISA_COUNT; isa++) if (fd_cpu_has_isa(isa)) {
    fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2, .isa_limit = isa + 1 });
    for (int kd = 0; kd < FD_DTYPE_COUNT; kd++)
      for (int qi = 0; qi < N_Q_LENS; qi++)
        for (int wi = 0; wi < N_WINDOWS; wi++)
          for (int sp = 0; sp < 2; sp++) run_case(ctx, isa, kd, Q_LENS[qi], wi, sp ? 3 : 1, idx++);
    fd_destroy(ctx);
  }
}

/* One case of softcap_modes: variant v picks the softcap (30, 50), the scale
   (default, 10, 900) and the splits (1, 3); idx the sizes, dtypes and data. */
static void softcap_case(fd_ctx *ctx, int isa, int kd, int mode, int v, int idx) {
  static const double SCALES[3] = { 0, 10, 900 };
  int D = idx % 2 ? 128 : 64, qd = idx % 3, od = idx / 3 % 3, splits = v % 2 ? 3 : 1;
  float cap = v / 2 % 2 ? 50.0f : 30.0f;
  double scale = SCALES[v / 4];
  if (D % fd_isa_table[isa].width) return;
  kproblem kp;
  kp_init(&kp, NB, HKV * 4, HKV, D, S_CAP, qd, kd, od, mode, FD_BHSD, 4000 + (uint64_t)idx);
  on_grid(&kp);
  fd_shape s = { NB, HKV * 4, HKV, D, S_CAP, qd, kd, od, mode, FD_BHSD, 0 };
  s.softcap = cap;
  size_t n = (size_t)NB * HKV * 4 * D;
  void *out = malloc(n * t_dtype_size(od));
  float *lse = malloc(sizeof(float) * NB * HKV * 4), *got = malloc(sizeof(float) * n);
  double *rout = malloc(sizeof(double) * n), *rlse = malloc(sizeof(double) * NB * HKV * 4);
  fd_args a = { kp.q, kp.k, kp.v, kp.cur_pos, kp.mask, kp.k_scale, kp.v_scale, NULL, (float)scale, out, lse };
  fd_plan_opts o = { 64, 4, splits, 2, isa + 1 };
  char name[200];
  snprintf(name, sizeof name, "isa%d kv%s q%s out%s %s softcap %g scale %g splits%d D%d", isa, fd_dtype_names[kd],
           fd_dtype_names[qd], fd_dtype_names[od], fd_mask_mode_names[mode], (double)cap, scale, splits, D);
  int rc = t_plan_run(ctx, &s, &o, &a);
  if (t_check(rc == 0, "%s: run: %s", name, fd_errmsg(ctx))) {
    ref_problem rt = kp.ref;
    rt.softcap = cap;
    if (scale) rt.scale = scale;
    ref_attention(&rt, rout, rlse);
    for (size_t i = 0; i < n; i++) got[i] = t_load(od, out, i);
    t_compare(&kp, got, lse, rout, rlse, 1, name);
  }
  free(out); free(lse); free(got); free(rout); free(rlse);
  kp_free(&kp);
}

/* Softcap 30 and 50 in every mask mode (q_len 1) with the default scale, 10
   and 900 (logits up to about 1e4, capped to the softcap without NaN or
   inf), every isa and KV dtype, unsplit and 3 splits, q and K on the grid of
   on_grid, against the reference with the same softcap. */
static void softcap_modes(void) {
  int idx = 0;
  for (int isa = 0; isa < FD_ISA_COUNT; isa++) if (fd_cpu_has_isa(isa)) {
    fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2, .isa_limit = isa + 1 });
    for (int kd = 0; kd < FD_DTYPE_COUNT; kd++)
      for (int mode = FD_CAUSAL; mode <= FD_FULL; mode++)
        for (int v = 0; v < 12; v++, idx++) softcap_case(ctx, isa, kd, mode, v, idx);
    fd_destroy(ctx);
  }
}

/* The softcap's own accuracy: one key (kv_len 1, K = e_0, f32) and 1024 query
   heads whose q[0] sweeps -200..200 on a grid of 1/64 plus 0, +-1e4, +-1e30
   and +-inf, scale 1: each head's lse is then softcap(q[0]) alone (the one
   weight is exact), checked against cap x tanh(q[0] / cap) in double to 1e-6
   relative, for softcap 30 and 50 and every isa. */
static void softcap_accuracy(void) {
  enum { NQ = 1024, D = 64 };
  static const float EXTREMES[7] = { 0.0f, 1e4f, -1e4f, 1e30f, -1e30f, INFINITY, -INFINITY };
  float *q = calloc((size_t)NQ * D, sizeof(float)), k[D] = { 1.0f }, v[D] = { 0 }, *out = malloc(sizeof(float) * NQ * D);
  float lse[NQ];
  int32_t pos[1] = { 0 };
  for (int h = 0; h < NQ; h++)
    q[(size_t)h * D] = h < 7 ? EXTREMES[h] : roundf((-200.0f + 400.0f * (float)(h - 7) / (NQ - 8)) * 64) / 64;
  for (int isa = 0; isa < FD_ISA_COUNT; isa++) if (fd_cpu_has_isa(isa))
    for (int ci = 0; ci < 2; ci++) {
      float cap = ci ? 50.0f : 30.0f;
      fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2, .isa_limit = isa + 1 });
      fd_shape s = { 1, NQ, 1, D, 1, FD_F32, FD_F32, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
      s.softcap = cap;
      fd_args a = { q, k, v, pos, NULL, NULL, NULL, NULL, 1.0f, out, lse };
      fd_plan *plan = NULL;
      int rc = fd_plan_create(ctx, &s, &plan);
      if (!rc) rc = fd_run(plan, &a);
      double worst = 0;
      int at = 0;
      for (int h = 0; rc == 0 && h < NQ; h++) {
        double x = q[(size_t)h * D], want = cap * tanh(x / cap), err = fabs(lse[h] - want) / fmax(fabs(want), 1e-30);
        if (!(err <= worst)) { worst = err; at = h; }
      }
      t_check(rc == 0 && worst <= 1e-6, "softcap %g accuracy, isa%d: worst relative error %.3g at q %g (lse %.9g, want "
              "%.9g): %s", (double)cap, isa, worst, (double)q[(size_t)at * D], (double)lse[at],
              cap * tanh(q[(size_t)at * D] / cap), rc ? fd_errmsg(ctx) : "ran");
      fd_plan_destroy(plan);
      fd_destroy(ctx);
    }
  free(q); free(out);
}

/* The items of a 4096-key window with 4 sinks over a 128k cache: per (row,
   kv head) every visible key once, in order, and no other. */
static void items_visit_the_window(void) {
  const int64_t S = 131072;
  const int W = 4096, SINKS = 4, HK = 8;
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2 });
  fd_shape s = { 2, 32, HK, 128, S, FD_BF16, FD_BF16, FD_BF16, FD_CAUSAL, FD_BHSD, 0 };
  s.window = W;
  s.sink_tokens = SINKS;
  int32_t pos[2] = { (int32_t)(S - 1), 100000 };
  float dummy[1];                  /* laid out only: no K, V, q or out element is read */
  fd_args a = { dummy, dummy, dummy, pos, NULL, NULL, NULL, NULL, 0, dummy, NULL };
  fd_plan *plan = NULL;
  const fd_item *items = NULL;
  int rc = fd_plan_create(ctx, &s, &plan), n = rc ? 0 : fd_exec_items(plan, &a, &items);
  t_check(rc == 0 && n > 0, "window items: plan and layout: %s", fd_errmsg(ctx));
  for (int b = 0; b < 2; b++)
    for (int j = 0; j < HK; j++) {
      int64_t next = 0, keys = 0, ws = pos[b] - W + 1;
      int ok = 1;
      for (int i = 0; i < n; i++) {
        if (items[i].b != b || items[i].j != j) continue;
        if (items[i].begin != next) ok = 0;
        keys += items[i].end - items[i].begin;
        next = items[i].end == SINKS ? ws : items[i].end;
      }
      t_check(ok && next == pos[b] + 1 && keys == W + SINKS,
              "window items: row %d kv head %d visits %lld keys ending at %lld (want %d, the window and the sinks, "
              "each once, ending at %d)", b, j, (long long)keys, (long long)next, W + SINKS, pos[b] + 1);
    }
  fd_plan_destroy(plan);
  fd_destroy(ctx);
}

/* fd_config.check_inputs with a window over a paged cache whose pages
   outside the window are freed (block-table entries -1): the scan reads the
   window's and the sinks' pages only, and the run matches the reference. */
static void check_inputs_paged(void) {
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2, .check_inputs = 1 });
  for (int wi = 0; wi < 2; wi++) {
    static const int W[2][2] = { { 7, 2 }, { 64, 5 } };
    wcase c;
    make(&c, HKV * 4, 64, FD_F32, FD_BF16, FD_F32, 3, W[wi][0], W[wi][1], 1, 1, 7700 + (uint64_t)wi);
    size_t n = (size_t)NB * 3 * HKV * 4 * 64;
    float *out = malloc(sizeof(float) * n), *lse = malloc(sizeof(float) * NB * 3 * HKV * 4);
    pool pl;
    make_pool(&c, &pl);
    char name[128];
    snprintf(name, sizeof name, "check_inputs, paged, window %d sinks %d, freed pages -1", c.window, c.sinks);
    int rc = plan_run(ctx, &c, &pl, &(fd_plan_opts){ 64, 4, 3, 2, 0 }, out, lse);
    if (t_check(rc == 0, "%s: run: %s", name, fd_errmsg(ctx))) compare_tokens(&c, out, lse, name);
    kx_pool_free(&pl);
    free(out); free(lse);
    unmake(&c);
  }
  fd_destroy(ctx);
}

/* A shape that must be refused with code rc and a message holding want; nothing written. */
static void refused(fd_ctx *ctx, fd_shape s, int rc, const char *want, const char *name) {
  fd_plan *plan = NULL;
  int got = fd_plan_create(ctx, &s, &plan);
  t_check(got == rc && strstr(fd_errmsg(ctx), want) != NULL, "refusal %s: rc %d (want %d), message '%s' (want '%s')",
          name, got, rc, fd_errmsg(ctx), want);
  fd_plan_destroy(plan);
}

/* A run of shape s (8 heads, D 64, 256 keys, f32) with ALiBi slopes
   (or NULL) refused at fd_run with a message holding want, out untouched. */
static void run_refused(fd_ctx *ctx, fd_shape s, const float *slopes, const char *want, const char *name) {
  fd_plan *plan = NULL;
  static float q[8 * 64], kv[2 * 256 * 64], out[8 * 64];
  int32_t pos[1] = { 100 };
  memset(out, 0x5a, sizeof out);
  fd_args a = { q, kv, kv, pos, NULL, NULL, NULL, NULL, 0, out, NULL };
  a.alibi_slopes = slopes;
  int rc = fd_plan_create(ctx, &s, &plan), run = rc ? rc : fd_run(plan, &a);
  unsigned char *o = (unsigned char *)out;
  size_t i = 0;
  while (i < sizeof out && o[i] == 0x5a) i++;
  t_check(rc == 0 && run == FD_EINVAL && strstr(fd_errmsg(ctx), want) && i == sizeof out,
          "refusal %s: plan %d, run %d, '%s' (want '%s'), out untouched %d", name, rc, run, fd_errmsg(ctx), want,
          i == sizeof out);
  fd_plan_destroy(plan);
}

/* Bad window settings, each named. */
static void refusals(void) {
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2 });
  fd_shape base = { 1, 8, 2, 64, 256, FD_F32, FD_F32, FD_F32, FD_CAUSAL, FD_BHSD, 0 }, s;
  s = base; s.window = -1;
  refused(ctx, s, FD_EINVAL, "shape.window", "negative window");
  s = base; s.sink_tokens = 4;
  refused(ctx, s, FD_EINVAL, "shape.sink_tokens is 4 without a window", "sinks without a window");
  s.window = 3;
  refused(ctx, s, FD_EINVAL, "shape.sink_tokens is 4, more than shape.window 3", "more sinks than the window");
  s.window = 4;
  refused(ctx, s, 0, "", "as many sinks as the window (accepted)");
  s.window = 0;
  s = base; s.window = 16; s.mask_mode = FD_FULL;
  refused(ctx, s, FD_EINVAL, "needs positions (FD_CAUSAL)", "window in full mode");
  s = base; s.softcap = -1;
  refused(ctx, s, FD_EINVAL, "shape.softcap is -1", "negative softcap");
  s = base; s.softcap = NAN;
  refused(ctx, s, FD_EINVAL, "shape.softcap is nan", "NaN softcap");
  s = base; s.softcap = INFINITY;
  refused(ctx, s, FD_EINVAL, "shape.softcap is inf", "infinite softcap");
  s = base; s.features = FD_ALIBI; s.mask_mode = FD_FULL;
  refused(ctx, s, FD_EINVAL, "FD_ALIBI with mask_mode", "ALiBi in full mode");
  s = base; s.features = FD_SINK_LOGITS;
  run_refused(ctx, s, NULL, "args.sink_logits is NULL", "sink logits without args.sink_logits");
  float slopes[8] = { 0.5f, 0.25f, 0.125f, 0.0625f, 0.03125f, 0.015625f, 0.0078125f, 0.00390625f };
  s = base; s.features = FD_ALIBI;
  run_refused(ctx, s, NULL, "args.alibi_slopes is NULL", "ALiBi without args.alibi_slopes");
  slopes[5] = NAN;
  run_refused(ctx, s, slopes, "args.alibi_slopes[5] is nan", "ALiBi slope NaN");
  slopes[5] = INFINITY;
  run_refused(ctx, s, slopes, "args.alibi_slopes[5] is inf", "ALiBi slope inf");
  fd_destroy(ctx);
}

int main(void) {
  sweep();
  softcap_modes();
  softcap_accuracy();
  items_visit_the_window();
  check_inputs_paged();
  refusals();
  return t_done();
}
