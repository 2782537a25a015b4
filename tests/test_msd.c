/* MSD int8 scores (the key's planes digit, fd_plan_opts.planes: q split
   into 2 or 3 int8 planes, scores by vpdpbusd; P.V in f32 over the
   dequantized V, the weights times the v scales first, gen/simd.lua pscale)
   through the public API, against the double-precision reference
   (tools/fdgen/ref.c):
   - the output error per plane count (f32 q and out, -1 = the f32 kernel,
     printed; the f32 kernel and 3 planes within 1e-5), and every sweep case
     held to 1e-5 (3 planes) or 1e-3 (2 planes) beside its out dtype's rounding;
   - the last partial chunk with V and v_scale ending at an inaccessible
     page (no read past the last row), chunks 64 and 4096;
   - the score error per plane count: each query head sees exactly one key
     (an additive mask), so its lse is that key's score; the largest error of
     the lse against the reference's, relative to the largest |score|, for
     the f32 FMA kernel (planes 0) and 2 and 3 planes, per-row and
     per-channel K scales (printed; 3 planes must stay within 1e-5);
   - the outputs of every mask mode (causal with q_len 1 and 3, a window with
     sinks, mask, full), the layouts (bhsd, bshd, paged), odd groups (tiles
     1, 3, 5, 7), head_dims 48, 64, 80, 96 (partial transpose blocks, rows
     copied in 32/16-byte pieces) and 128,
     unsplit and 3 splits, per-row and per-channel K scales, 2 and 3 planes;
     each plan's key must carry the planes digit;
   - the refusals: a sentence naming opts.planes, nothing run.
   Runs on the best record with int8 dot products this CPU has (isa digit 3,
   AVX-512+BF16+VNNI, or 4, AVX-512+VNNI); without one only the refusals run.
   First, on AVX2 (the msd16 group: 2 planes as one int16 plane of q, scores
   by vpmaddwd; gen/facts.lua msd16_fits), on any CPU that has it: the output
   and score errors against the f32 kernel's (printed; within 1e-3 and 1e-4),
   the guarded V and K tails, the sweep (every mode, layout, tiles 2 to 8,
   head_dims 48-128, splits, both K scale modes) under tcc and cc, FAST
   taking it where it serves and nowhere else, and its refusals. */
#include "compare.h"
#include "internal.h"
#include "cpu.h"
#include "tcheck.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define NB 3
#define HKV 2
#define S_CAP 200
#define PAGE 16
#define PER_ROW ((S_CAP + PAGE - 1) / PAGE)
/* The isa digit the MSD kernels run on (kx_msd_isa), -1 without one. */
static int msd_isa = -1;
/* the planes digit's place in a key (gen/facts.lua) */
#define PLANES_POS ((size_t)fd_key_fields[FD_KF_PLANES].pos)

/* One case: K/V and positions from kp, q [NB, q_len, Hq, D] from qp; kch the
   per-channel K scales [NB, HKV, D] or NULL. */
typedef struct mcase {
  kproblem kp, qp;
  int q_len, mode, window, sinks, layout;
  float *kch;
} mcase;

/* Re-quantize K (bhsd) with one scale per (row, kv head, channel) (kx_per_channel). */
static void per_channel(mcase *c) {
  c->kch = malloc(sizeof(float) * NB * HKV * c->kp.ref.D);
  kx_per_channel(&c->kp, NB * HKV, c->kp.ref.S, c->kch);
}

/* Build a case (layout FD_BHSD or FD_BSHD; paged cases are built dense and pooled). */
static void make(mcase *c, int layout, int Hq, int D, int qd, int od, int mode, int q_len, int window, int sinks,
                 int kpc, uint64_t seed) {
  memset(c, 0, sizeof *c);
  c->q_len = q_len; c->mode = mode; c->window = window; c->sinks = sinks; c->layout = layout;
  kp_init(&c->kp, NB, Hq, HKV, D, S_CAP, qd, FD_I8, od, mode, layout, seed);
  kp_init(&c->qp, NB * q_len, Hq, HKV, D, 1, qd, FD_I8, od, FD_FULL, FD_BHSD, seed + 1);
  c->kp.cur_pos[0] = S_CAP - 1;
  c->kp.cur_pos[1] = q_len - 1;
  c->kp.cur_pos[2] = q_len - 1 + (S_CAP - q_len) / 2;
  if (kpc) per_channel(c);
}

static void unmake(mcase *c) { kp_free(&c->kp); kp_free(&c->qp); free(c->kch); }

/* The reference of token t (tests/kexec.c kx_token_reference). */
static void reference(const void *cv, int t, double *rout, double *rlse) {
  const mcase *c = cv;
  kx_token_reference(c->kp.ref, c->qp.qf, c->kp.cur_pos, c->q_len, t, c->window, c->sinks, rout, rlse);
}

/* The K/V and scales of a bhsd case as a pool: row b's page i at pool page
   i * NB + (b + i) % NB (rows interleaved), and its block table. */
typedef kx_pool pool;   /* tests/kexec.h */

static void make_pool(const mcase *c, pool *pl) {
  kx_pool_alloc(pl, &c->kp, NB * PER_ROW, PAGE, NB * PER_ROW);
  for (int b = 0; b < NB; b++)
    for (int64_t i = 0; i < PER_ROW; i++) {
      int64_t pg = i * NB + (b + i) % NB;
      pl->table[b * PER_ROW + i] = (int32_t)pg;
      kx_pool_copy(pl, &c->kp, b, i, pg, PAGE);
    }
}

static void free_pool(pool *pl) { kx_pool_free(pl); }

/* The case's shape (paged: from the pool). */
static fd_shape shape_of(const mcase *c, int paged) {
  const ref_problem *r = &c->kp.ref;
  fd_shape s = { NB, r->Hq, HKV, r->D, S_CAP, c->kp.q_dtype, FD_I8, c->kp.out_dtype, c->mode,
                 paged ? FD_PAGED : c->layout, paged ? PAGE : 0 };
  s.q_len = c->q_len;
  s.window = c->window;
  s.sink_tokens = c->sinks;
  s.features = c->kch ? FD_K_PER_CHANNEL : 0;
  s.pool_pages = paged ? NB * PER_ROW : 0;
  return s;
}

/* The case's arguments (dense, or paged from pl) writing out and lse. */
static fd_args args_of(const mcase *c, const pool *pl, void *out, float *lse) {
  fd_args a = { c->qp.q, pl ? pl->k : c->kp.k, pl ? pl->v : c->kp.v, c->kp.cur_pos, c->kp.mask,
                pl ? pl->ks : c->kp.k_scale, pl ? pl->vs : c->kp.v_scale, pl ? pl->table : NULL, 0, out, lse };
  if (c->kch) a.k_scale = c->kch;
  return a;
}

/* Plan s with o, check its key carries the planes digit (digit PLANES_POS,
   gen/facts.lua), run a once; FD_OK or the failing call's code. */
static int run_planes(fd_ctx *ctx, const fd_shape *s, const fd_plan_opts *o, const fd_args *a, const char *name) {
  fd_plan *plan = NULL;
  int rc = fd_plan_create_opts(ctx, s, o, &plan);
  if (rc) return rc;
  fd_plan_info info;
  rc = fd_plan_info_get(plan, s->kv_len, &info);
  size_t len = strlen(info.key);
  int digit = len > PLANES_POS ? info.key[len - 1 - PLANES_POS] - '0' : 0, want = o->planes > 0 ? o->planes : 0;
  t_check(!rc && digit == want, "%s: key %s has planes digit %d", name, info.key, want);
  rc = fd_run(plan, a);
  fd_plan_destroy(plan);
  return rc;
}

/* The lse tolerance of a plane count (relative to max(1, |lse|)): the
   suite's KP_LSE_TOL for 3 planes; 2 planes carry q to about 2^-15 of its
   largest element, scores to a few 1e-5 (score_errors prints the figure). */
static double lse_tol(int planes) { return planes == 2 ? 1e-3 : KP_LSE_TOL; }

/* The output tolerance of a plane count: the out dtype's rounding (as
   t_tolerance) plus 1e-5 for 3 planes and the f32 kernel (scores and the MSD
   P.V's weight planes within a few 1e-7), 1e-3 for 2 planes (weights to about
   2^-15 of the chunk's largest; output_errors prints the figures). */
static double out_tol(const kproblem *p, int planes) { return t_tolerance(p) - 2e-3 + (planes == 2 ? 1e-3 : 1e-5); }

/* The largest output error (relative to the largest |reference output|) of
   the f32-output tokens compared since it was last cleared. */
static double g_out_err;

/* t_compare_tokens with the lse held to lse_tol(planes): out [B, q_len, Hq, D]
   and lse [B, q_len, Hq] token by token against reference(c, t, ...). */
static void compare_tokens(const mcase *c, int planes, const void *out, const float *lse, const char *name) {
  const kproblem *p = &c->kp;
  const ref_problem *r = &p->ref;
  size_t n = (size_t)r->B * r->Hq * r->D, qrow = (size_t)r->Hq * r->D;
  double *rout = malloc(n * sizeof(double)), *rlse = malloc(sizeof(double) * r->B * r->Hq);
  float *got = malloc(n * sizeof(float)), *glse = malloc(sizeof(float) * r->B * r->Hq);
  for (int t = 0; t < c->q_len; t++) {
    reference(c, t, rout, rlse);
    for (int b = 0; b < r->B; b++) {
      size_t at = (size_t)(b * c->q_len + t);
      for (size_t i = 0; i < qrow; i++) got[b * qrow + i] = t_load(p->out_dtype, out, at * qrow + i);
      memcpy(glse + (size_t)b * r->Hq, lse + at * r->Hq, sizeof(float) * r->Hq);
    }
    kp_error e = kp_errors(p, got, glse, rout, rlse);
    t_check(!e.nan && e.out <= out_tol(p, planes), "%s token %d: max error %.3g (tolerance %.3g)%s", name, t, e.out,
            out_tol(p, planes), e.nan ? ", NaN" : "");
    if (p->out_dtype == FD_F32) g_out_err = fmax(g_out_err, e.nan ? INFINITY : e.out);
    t_check(!e.lse_inf && e.lse <= lse_tol(planes), "%s token %d: lse error %.3g > %.3g%s", name, t, e.lse,
            lse_tol(planes), e.lse_inf ? " (-inf mismatch)" : "");
  }
  free(rout); free(rlse); free(got); free(glse);
}

/* One case against the reference on msd_isa with planes, each layout it takes
   (bhsd cases also paged; bshd cases as they are). */
static void run_case(fd_ctx *ctx, int planes, int layout, int D, int tile, int mode, int q_len, int kpc, int splits,
                     int idx) {
  int chunk = idx % 2 ? 96 : 64, qd = idx % 3, od = idx / 3 % 3;
  int window = q_len > 1 && idx % 4 == 1 ? 20 : 0, sinks = window ? 2 : 0;
  mcase c;
  make(&c, layout, HKV * tile, D, qd, od, mode, q_len, window, sinks, kpc, 900 + (uint64_t)idx);
  size_t n = (size_t)NB * q_len * HKV * tile * D;
  void *out = malloc(n * t_dtype_size(od));
  float *lse = malloc(sizeof(float) * NB * q_len * HKV * tile);
  fd_plan_opts o = { chunk, tile, splits, 2, msd_isa + 1, planes };
  for (int paged = 0; paged <= (layout == FD_BHSD); paged++) {
    char name[256];
    snprintf(name, sizeof name, "planes %d q%s out%s %s %s q_len %d window %d%s splits %d chunk %d D %d tile %d", planes,
             fd_dtype_names[qd], fd_dtype_names[od], fd_mask_mode_names[mode], paged ? "paged" : fd_layout_names[layout],
             q_len, window, kpc ? " k per channel" : "", splits, chunk, D, tile);
    pool pl = { 0 };
    if (paged) make_pool(&c, &pl);
    fd_shape s = shape_of(&c, paged);
    fd_args a = args_of(&c, paged ? &pl : NULL, out, lse);
    int rc = run_planes(ctx, &s, &o, &a, name);
    if (t_check(rc == 0, "%s: run: %s", name, fd_errmsg(ctx)))
      compare_tokens(&c, planes, out, lse, name);
    if (paged) free_pool(&pl);
  }
  free(out); free(lse);
  unmake(&c);
}

/* The mode and q_len of variant m: causal q_len 1, causal q_len 3, mask, full. */
static void mode_of(int m, int *mode, int *q_len) {
  static const int MODES[4] = { FD_CAUSAL, FD_CAUSAL, FD_MASK, FD_FULL };
  *mode = MODES[m];
  *q_len = m == 1 ? 3 : 1;
}

/* Every mode variant x layout x plane count, the tiles, head_dims, splits and
   K scale modes in turn; every every-th case (the cc backend: 4, its compiles are slow). */
static void sweep(fd_ctx *ctx, int every) {
  static const int TILES[4] = { 1, 3, 5, 7 }, DS[5] = { 64, 96, 128, 48, 80 };
  int idx = 0, mode, q_len;
  for (int planes = 2; planes <= 3; planes++)
    for (int m = 0; m < 4; m++)
      for (int layout = FD_BHSD; layout <= FD_BSHD; layout++)
        for (int v = 0; v < 4; v++) {
          mode_of(m, &mode, &q_len);
          int kpc = layout == FD_BHSD && v % 2, tile = TILES[(v + m + planes) % 4], D = DS[(v + 2 * m + 3 * planes) % 5];
          if (idx % every == 0) run_case(ctx, planes, layout, D, tile, mode, q_len, kpc, v / 2 ? 3 : 1, idx);
          idx++;
        }
  /* a group of 16 (the heads in two sub-tiles of 10 / 15 accumulators) */
  run_case(ctx, 3, FD_BHSD, 128, 16, FD_CAUSAL, 1, 0, 1, idx++);
  run_case(ctx, 2, FD_BHSD, 64, 16, FD_MASK, 1, 1, 3, idx++);
}

/* The largest output error (f32 out) at planes over 4 cases (causal D 128,
   mask D 80 with per-channel K and 3 splits, bshd D 48 with q_len 3, full D 64
   with 3 splits) at group tiles tiles[0..3]. */
static double out_error(fd_ctx *ctx, int planes, const int tiles[4]) {
  g_out_err = 0;
  run_case(ctx, planes, FD_BHSD, 128, tiles[0], FD_CAUSAL, 1, 0, 1, 0);
  run_case(ctx, planes, FD_BHSD, 80, tiles[1], FD_MASK, 1, 1, 3, 9);
  run_case(ctx, planes, FD_BSHD, 48, tiles[2], FD_CAUSAL, 3, 0, 1, 45);
  run_case(ctx, planes, FD_BHSD, 64, tiles[3], FD_FULL, 1, 0, 3, 63);
  return g_out_err;
}

/* The output error per plane count (-1: the f32 scores and P.V over the
   dequantized V; 3 and 2: MSD scores, the f32 P.V) over the same cases (f32 q and
   out, both K scale modes, bhsd/paged/bshd, head_dims 128/80/48, windows,
   splits 1 and 3), printed; the f32 kernel and 3 planes within 1e-5. */
static void output_errors(fd_ctx *ctx, const char *backend) {
  static const int PL[3] = { -1, 3, 2 }, TILES[4] = { 4, 3, 5, 16 };
  double e[3];
  for (int i = 0; i < 3; i++) e[i] = out_error(ctx, PL[i], TILES);
  printf("%s: MSD output error vs the double reference (relative to the largest |output|): f32 scores and P.V %.3g, "
         "3 planes %.3g, 2 planes %.3g\n", backend, e[0], e[1], e[2]);
  t_check(e[0] <= 1e-5 && e[1] <= 1e-5, "f32 and 3-plane outputs within 1e-5 (%.3g, %.3g)", e[0], e[1]);
  t_check(e[2] <= 1e-3 && e[2] > e[1], "2-plane outputs within 1e-3 and coarser than 3 planes (%.3g vs %.3g)", e[2],
          e[1]);
}

/* The last partial chunk (203 keys: at chunk 64 the last holds 11) with V
   and v_scale (guard_k: K and k_scale too) ending at an inaccessible page, G
   query heads (at most 8) a group tile: no byte past the last row or scale is
   read (pscale's masked tail, the direct scores' partial groups); against
   the reference. */
static void guard_tail(fd_ctx *ctx, int planes, int chunk, int guard_k, int G) {
  enum { D = 80, S = 203, MAX_G = 8 };
  if (!t_check(G >= 1 && G <= MAX_G, "guard_tail: G %d outside 1..%d", G, MAX_G)) return;
  kproblem kp;
  kp_init(&kp, 1, G, 1, D, S, FD_F32, FD_I8, FD_F32, FD_CAUSAL, FD_BHSD, 777);
  kp.cur_pos[0] = S - 1;
  void *vmap, *smap, *kmap = NULL, *ksmap = NULL;
  size_t vlen, slen, klen = 0, kslen = 0;
  void *v = t_guarded(kp.v, (size_t)S * D, &vmap, &vlen);
  float *vs = t_guarded(kp.v_scale, sizeof(float) * S, &smap, &slen);
  void *k = guard_k ? t_guarded(kp.k, (size_t)S * D, &kmap, &klen) : kp.k;
  float *ks = guard_k ? t_guarded(kp.k_scale, sizeof(float) * S, &ksmap, &kslen) : kp.k_scale;
  if (!t_check(v && vs && k && ks, "guarded V (and K) copies")) { kp_free(&kp); return; }
  float out[MAX_G * D], lse[MAX_G];
  double rout[MAX_G * D], rlse[MAX_G];
  fd_shape s = { 1, G, 1, D, S, FD_F32, FD_I8, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  fd_args a = { kp.q, k, v, kp.cur_pos, NULL, ks, vs, NULL, 0, out, lse };
  fd_plan_opts o = { chunk, G, 1, 1, msd_isa + 1, planes };
  char name[128];
  snprintf(name, sizeof name, "guarded V%s tail, planes %d, chunk %d, tile %d, isa %s", guard_k ? " and K" : "", planes,
           chunk, G, fd_isa_table[msd_isa].name);
  int rc = run_planes(ctx, &s, &o, &a, name);
  if (t_check(rc == 0, "%s: run: %s", name, fd_errmsg(ctx))) {
    ref_attention(&kp.ref, rout, rlse);
    kp_error e = kp_errors(&kp, out, lse, rout, rlse);
    t_check(!e.nan && e.out <= out_tol(&kp, planes), "%s: max error %.3g", name, e.out);
  }
  munmap(vmap, vlen);
  munmap(smap, slen);
  if (kmap) munmap(kmap, klen);
  if (ksmap) munmap(ksmap, kslen);
  kp_free(&kp);
}

/* Largest |lse - score| over the heads relative to the largest |score|:
   planes (0 = the f32 kernel) on one key per head (mask mode: key
   (h * 37 + b * 11 + shift) % S visible only). kpc: per-channel K scales. */
static double score_error(fd_ctx *ctx, int planes, int kpc, int D) {
  const int G = 4, S = 160;
  double worst = 0, top = 0;
  for (int shift = 0; shift < 8; shift++) {
    mcase c;
    memset(&c, 0, sizeof c);
    c.q_len = 1; c.mode = FD_MASK; c.layout = FD_BHSD;
    kp_init(&c.kp, NB, HKV * G, HKV, D, S, FD_F32, FD_I8, FD_F32, FD_MASK, FD_BHSD, 4242);
    kp_init(&c.qp, NB, HKV * G, HKV, D, 1, FD_F32, FD_I8, FD_F32, FD_FULL, FD_BHSD, 4243);
    if (kpc) {
      c.kch = malloc(sizeof(float) * NB * HKV * D);
      kx_per_channel(&c.kp, NB * HKV, S, c.kch);
    }
    for (size_t i = 0; i < (size_t)NB * HKV * G * D; i++) {   /* scores of tens: the lse's own rounding stays small */
      c.qp.qf[i] *= 6.0f;
      ((float *)c.qp.q)[i] = c.qp.qf[i];
    }
    for (int b = 0; b < NB; b++)
      for (int h = 0; h < HKV * G; h++)
        for (int k = 0; k < S; k++)
          c.kp.mask[((size_t)b * HKV * G + h) * S + k] = k == (h * 37 + b * 11 + shift * 5) % S ? 0.0f : -INFINITY;
    for (int b = 0; b < NB; b++) c.kp.cur_pos[b] = S - 1;
    float out[NB * HKV * 4 * 128], lse[NB * HKV * 4];
    double rout[NB * HKV * 4 * 128], rlse[NB * HKV * 4];
    fd_shape s = { NB, HKV * G, HKV, D, S, FD_F32, FD_I8, FD_F32, FD_MASK, FD_BHSD, 0 };
    s.features = kpc ? FD_K_PER_CHANNEL : 0;
    fd_args a = { c.qp.q, c.kp.k, c.kp.v, c.kp.cur_pos, c.kp.mask, c.kp.k_scale, c.kp.v_scale, NULL, 0, out, lse };
    if (kpc) a.k_scale = c.kch;
    fd_plan_opts o = { 64, G, 1, 1, msd_isa + 1, planes ? planes : -1 };
    char name[96];
    snprintf(name, sizeof name, "score error, planes %d%s, shift %d", planes, kpc ? ", per-channel K" : "", shift);
    int rc = run_planes(ctx, &s, &o, &a, name);
    t_check(rc == 0, "%s: run: %s", name, fd_errmsg(ctx));
    reference(&c, 0, rout, rlse);
    for (int i = 0; i < NB * HKV * G; i++) {
      worst = fmax(worst, fabs(lse[i] - rlse[i]));
      top = fmax(top, fabs(rlse[i]));
      if (lse[i] != lse[i]) worst = INFINITY;
    }
    unmake(&c);
  }
  return worst / top;
}

/* The score error per plane count (f32 kernel, 3 planes, 2 planes), per-row and per-channel K scales. */
static void score_errors(fd_ctx *ctx, const char *backend) {
  for (int kpc = 0; kpc <= 1; kpc++)
    for (int D = 64; D <= 128; D += 64) {
      double e0 = score_error(ctx, 0, kpc, D), e3 = score_error(ctx, 3, kpc, D), e2 = score_error(ctx, 2, kpc, D);
      printf("%s: MSD score error vs the double reference (%s K scales, head_dim %d): f32 FMA %.3g, 3 planes %.3g, "
             "2 planes %.3g (relative to the largest |score|)\n", backend, kpc ? "per-channel" : "per-row", D, e0, e3, e2);
      t_check(e0 <= 1e-6, "f32 scores within 1e-6 (%.3g)", e0);
      t_check(e3 <= 1e-5, "3-plane MSD scores within 1e-5 of the reference (%.3g, %s K scales, D %d)", e3,
              kpc ? "per-channel" : "per-row", D);
      t_check(e2 <= 1e-3 && e2 > e3, "2-plane MSD scores within 1e-3 and coarser than 3 planes (%.3g vs %.3g)", e2, e3);
    }
}

/* A plan that must be refused with code rc and a message holding want. */
static void refused(fd_ctx *ctx, fd_shape s, fd_plan_opts o, int rc, const char *want, const char *name) {
  fd_plan *plan = NULL;
  int got = fd_plan_create_opts(ctx, &s, &o, &plan);
  t_check(got == rc && strstr(fd_errmsg(ctx), want) != NULL && !plan, "refusal %s: rc %d (want %d), message '%s' (want '%s')",
          name, got, rc, fd_errmsg(ctx), want);
  fd_plan_destroy(plan);
}

/* The planes digit of the key planned for kv dtype kd and head_dim D with
   opts o on a context limited to isa_limit (an FD_ISA_* value). */
static int planned_planes(int isa_limit, int kd, int D, fd_plan_opts o) {
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2, .isa_limit = isa_limit });
  fd_shape s = { 1, 8, 2, D, 4096, FD_F32, kd, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  fd_plan *plan = NULL;
  fd_plan_info info = { 0 };
  int rc = fd_plan_create_opts(ctx, &s, &o, &plan);
  if (!rc) rc = fd_plan_info_get(plan, 4096, &info);
  t_check(rc == 0, "plan for the heuristic's planes: %s", fd_errmsg(ctx));
  fd_plan_destroy(plan);
  fd_destroy(ctx);
  size_t len = strlen(info.key);
  return len > PLANES_POS ? info.key[len - 1 - PLANES_POS] - '0' : 0;
}

/* The heuristic: FD_H_PLANES for int8 K on an isa with int8 dots (where the planes fit), 0
   elsewhere; opts.planes -1 turns it off, 2 forces 2; a forced isa without
   int8 dot products takes none. */
static void heuristic(void) {
  int want = msd_isa >= 0 ? FD_H_PLANES : 0, p;
  p = planned_planes(FD_ISA_AUTO, FD_I8, 128, (fd_plan_opts){ 0 });
  t_check(p == want, "int8 K: planes %d (want %d)", p, want);
  p = planned_planes(FD_ISA_AUTO, FD_FP8_E4M3, 128, (fd_plan_opts){ 0 });
  t_check(p == 0, "fp8 K: planes %d", p);
  p = planned_planes(FD_ISA_AUTO, FD_F16, 128, (fd_plan_opts){ 0 });
  t_check(p == 0, "f16 K: planes %d", p);
  int plain = kx_plain_isa();                    /* AVX-512, else AVX2: no int8 dot products */
  p = planned_planes(plain + 1, FD_I8, 128, (fd_plan_opts){ 0 });
  t_check(p == 0, "isa_limit %s: planes %d", fd_isa_table[plain].name, p);
  p = planned_planes(FD_ISA_AUTO, FD_I8, 128, (fd_plan_opts){ .isa = plain + 1 });
  t_check(p == 0, "forced isa %s: planes %d", fd_isa_table[plain].name, p);
  p = planned_planes(FD_ISA_AUTO, FD_I8, 128, (fd_plan_opts){ .planes = -1 });
  t_check(p == 0, "planes -1: %d", p);
  if (msd_isa >= 0) {
    p = planned_planes(FD_ISA_AUTO, FD_I8, 128, (fd_plan_opts){ .planes = 2 });
    t_check(p == 2, "planes 2 forced: %d", p);
  }
  p = planned_planes(FD_ISA_AUTO, FD_I8, 20, (fd_plan_opts){ 0 });
  t_check(p == 0, "head_dim 20 (no vector kernel): %d", p);
}

/* opts.planes refusals: a bad count, a KV dtype or isa without MSD, per-channel K with beams. */
static void refusals(void) {
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2 });
  fd_shape s = { NB, 8, HKV, 64, S_CAP, FD_F32, FD_I8, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  refused(ctx, s, (fd_plan_opts){ .planes = 1 }, FD_EINVAL, "opts.planes 1 is not 0 (planner's choice), -1 (off), 2 or 3",
          "one plane");
  refused(ctx, s, (fd_plan_opts){ .planes = 4 }, FD_EINVAL, "opts.planes 4 is not 0", "four planes");
  refused(ctx, s, (fd_plan_opts){ .planes = -2 }, FD_EINVAL, "opts.planes -2 is not 0", "planes -2");
  s.kv_dtype = FD_F16;
  refused(ctx, s, (fd_plan_opts){ .planes = 3 }, FD_EUNSUPPORTED, "opts.planes 3 needs int8 K", "f16 K");
  s.kv_dtype = FD_FP8_E4M3;
  refused(ctx, s, (fd_plan_opts){ .planes = 2 }, FD_EUNSUPPORTED, "not kv_dtype fp8", "fp8 K");
  s.kv_dtype = FD_I8;
  int plain = kx_plain_isa();                    /* AVX-512, else AVX2 (else C, refused below as well) */
  char want[160];
  if (fd_isa_table[plain].msd16)                 /* AVX2: 2 planes only, as one int16 plane (msd16) */
    snprintf(want, sizeof want, "opts.planes 3 on isa %s (one int16 plane of q) needs 2 planes", fd_isa_table[plain].name);
  else
    snprintf(want, sizeof want, "needs an isa with int8 dot products (avx512vnni, avx512bf16), not isa %s",
             fd_isa_table[plain].name);
  refused(ctx, s, (fd_plan_opts){ .planes = 3, .isa = plain + 1 }, FD_EUNSUPPORTED, want, fd_isa_table[plain].name);
  refused(ctx, s, (fd_plan_opts){ .planes = 3, .isa = FD_ISA_C }, FD_EUNSUPPORTED, "not isa c", "portable C");
  s.features = FD_K_PER_CHANNEL | FD_BEAMS;
  /* plan.c checks the dtype, then the context's isa, then the features: on a
     CPU without int8 dot products the isa is refused first */
  refused(ctx, s, (fd_plan_opts){ .planes = 3 }, FD_EUNSUPPORTED,
          msd_isa >= 0 ? "with shape.features FD_K_PER_CHANNEL and FD_BEAMS"
          : fd_isa_table[fd_cpu_max_isa()].msd16 ? "(one int16 plane of q) needs 2 planes"
                                   : "needs an isa with int8 dot products (avx512vnni, avx512bf16), not isa",
          "per-channel K + beams");
  fd_destroy(ctx);
}

/* The present isa record with the msd16 group and no int8 dot products
   (AVX2: 2 planes as one int16 plane of q, vpmaddwd), or -1. */
static int msd16_record(void) {
  for (int isa = 0; isa < FD_ISA_COUNT; isa++)
    if (fd_isa_table[isa].msd16 && !fd_isa_table[isa].vnni && fd_cpu_has_isa(isa)) return isa;
  return -1;
}

/* The int16 plane's cases (msd_isa the msd16 record): every mode variant x
   layout, tiles 2 to 8 (groups of 4, 2 and 1 keys), head_dims 48-128
   (multiples of 16: gen/facts.lua msd16_fits), 1 and 3 splits, per-row and
   per-channel K scales, 2 planes; every every-th case. */
static void sweep16(fd_ctx *ctx, int every) {
  static const int DS[5] = { 64, 96, 128, 48, 80 };
  int idx = 0, mode, q_len;
  for (int m = 0; m < 4; m++)
    for (int layout = FD_BHSD; layout <= FD_BSHD; layout++)
      for (int v = 0; v < 4; v++) {
        mode_of(m, &mode, &q_len);
        int kpc = layout == FD_BHSD && v % 2, tile = 2 + (v + 2 * m + 3 * layout) % 7, D = DS[(v + 2 * m + layout) % 5];
        if (idx % every == 0) run_case(ctx, 2, layout, D, tile, mode, q_len, kpc, v / 2 ? 3 : 1, idx);
        idx++;
      }
}

/* The int16 plane's output and score errors against the f32 kernel's on the
   same cases (printed; within the 2-plane bounds and coarser than f32). */
static void errors16(fd_ctx *ctx, const char *backend) {
  static const int TILES[4] = { 4, 2, 8, 5 };   /* the int16 plane's tiles (gen/facts.lua msd16_fits) */
  double e[2] = { out_error(ctx, -1, TILES), out_error(ctx, 2, TILES) };
  printf("%s: %s int16 plane output error vs the double reference (relative to the largest |output|): f32 scores %.3g, "
         "one int16 plane %.3g\n", backend, fd_isa_table[msd_isa].name, e[0], e[1]);
  t_check(e[0] <= 1e-5 && e[1] <= 1e-3 && e[1] > e[0], "int16-plane outputs within 1e-3 and coarser than f32 (%.3g vs %.3g)",
          e[1], e[0]);
  for (int kpc = 0; kpc <= 1; kpc++)
    for (int D = 64; D <= 128; D += 64) {
      double e0 = score_error(ctx, 0, kpc, D), e2 = score_error(ctx, 2, kpc, D);
      printf("%s: %s score error vs the double reference (%s K scales, head_dim %d): f32 FMA %.3g, one int16 plane %.3g "
             "(relative to the largest |score|)\n", backend, fd_isa_table[msd_isa].name, kpc ? "per-channel" : "per-row",
             D, e0, e2);
      t_check(e2 <= 1e-4 && e2 > e0, "int16-plane scores within 1e-4 and coarser than f32 (%.3g vs %.3g)", e2, e0);
    }
}

/* The planes digit planned for int8 K, Hq query heads over 2 kv heads and
   head_dim D with opts o on a FAST context limited to isa_limit. */
static int fast_planes(int isa_limit, int Hq, int D, fd_plan_opts o) {
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2, .isa_limit = isa_limit, .precision = FD_PRECISION_FAST });
  fd_shape s = { 1, Hq, 2, D, 4096, FD_F32, FD_I8, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  fd_plan *plan = NULL;
  fd_plan_info info = { 0 };
  int rc = fd_plan_create_opts(ctx, &s, &o, &plan);
  if (!rc) rc = fd_plan_info_get(plan, 4096, &info);
  t_check(rc == 0, "FAST plan, Hq %d, D %d: %s", Hq, D, fd_errmsg(ctx));
  fd_plan_destroy(plan);
  fd_destroy(ctx);
  size_t len = strlen(info.key);
  return len > PLANES_POS ? info.key[len - 1 - PLANES_POS] - '0' : 0;
}

/* The planner and the refusals on the msd16 record (limit l = its FD_ISA_*):
   FAST takes 2 planes where the int16 plane serves (tiles 2 to 8, head_dim
   a multiple of 16), none elsewhere or with opts.planes -1; the default
   precision none; forced counts and fast precision refused where it cannot
   serve, naming the field. */
static void plans16(int isa) {
  int l = isa + 1, p;
  p = fast_planes(l, 8, 128, (fd_plan_opts){ 0 });
  t_check(p == 2, "FAST, G 4, D 128: planes %d (want 2)", p);
  p = fast_planes(l, 6, 64, (fd_plan_opts){ 0 });
  t_check(p == 2, "FAST, G 3, D 64: planes %d (want 2)", p);
  p = fast_planes(l, 8, 72, (fd_plan_opts){ 0 });
  t_check(p == 0, "FAST, head_dim 72: planes %d (want 0)", p);
  p = fast_planes(l, 4, 128, (fd_plan_opts){ 0 });
  t_check(p == 2, "FAST, G 2 (tile 2): planes %d (want 2)", p);
  p = fast_planes(l, 16, 128, (fd_plan_opts){ 0 });
  t_check(p == 2, "FAST, G 8 (tile 8): planes %d (want 2)", p);
  p = fast_planes(l, 2, 128, (fd_plan_opts){ 0 });
  t_check(p == 0, "FAST, G 1 (tile 1): planes %d (want 0)", p);
  p = fast_planes(l, 8, 128, (fd_plan_opts){ .group_tile = 1 });
  t_check(p == 0, "FAST, forced tile 1: planes %d (want 0)", p);
  p = fast_planes(l, 24, 128, (fd_plan_opts){ .group_tile = 12 });
  t_check(p == 0, "FAST, forced tile 12: planes %d (want 0)", p);
  p = fast_planes(l, 8, 128, (fd_plan_opts){ .planes = -1 });
  t_check(p == 0, "FAST, opts.planes -1: planes %d (want 0)", p);
  p = planned_planes(l, FD_I8, 128, (fd_plan_opts){ 0 });
  t_check(p == 0, "default precision on %s: planes %d (want 0)", fd_isa_table[isa].name, p);
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2, .isa_limit = l });
  fd_shape s = { NB, 8, HKV, 64, S_CAP, FD_F32, FD_I8, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  char want[200];
  snprintf(want, sizeof want, "opts.planes 3 on isa %s (one int16 plane of q) needs 2 planes", fd_isa_table[isa].name);
  refused(ctx, s, (fd_plan_opts){ .planes = 3 }, FD_EUNSUPPORTED, want, "int16 plane, 3 planes");
  refused(ctx, s, (fd_plan_opts){ .planes = 2, .group_tile = 1 }, FD_EUNSUPPORTED, "not group tile 1, head_dim 64",
          "int16 plane, tile 1");
  s.head_dim = 72;
  refused(ctx, s, (fd_plan_opts){ .planes = 2 }, FD_EUNSUPPORTED, "not group tile 4, head_dim 72", "int16 plane, D 72");
  refused(ctx, s, (fd_plan_opts){ .precision = 1 }, FD_EUNSUPPORTED, "takes one int16 plane of q, which needs group "
          "tiles 2 to 8 and shape.head_dim a multiple of 16 (not group tile 4, head_dim 72)", "int16 plane, fast, D 72");
  s.head_dim = 64;
  refused(ctx, s, (fd_plan_opts){ .precision = 1, .planes = -1 }, FD_EUNSUPPORTED, "takes 2 MSD planes, but opts.planes "
          "-1 forces f32 FMA scores", "int16 plane, fast, planes -1");
  s.features = FD_K_PER_CHANNEL | FD_BEAMS;
  refused(ctx, s, (fd_plan_opts){ .precision = 1 }, FD_EUNSUPPORTED, "and not FD_K_PER_CHANNEL with FD_BEAMS",
          "int16 plane, fast, per-channel K + beams");
  fd_destroy(ctx);
}

/* Run body on a cc-backend context whose kernel cache is a temporary
   directory (or $FD_TEST_CACHE_DIR), removed after. */
static void on_cc(void (*body)(fd_ctx *ctx)) {
  char tmp[] = "/tmp/fd_msd_XXXXXX";
  const char *dir = getenv("FD_TEST_CACHE_DIR");
  if (!dir) dir = mkdtemp(tmp);
  if (t_check(dir != NULL, "temporary cache_dir")) {
    fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2, .backend = FD_BACKEND_CC, .cache_dir = dir });
    t_check(fd_ctx_backend(ctx) == FD_BACKEND_CC, "cc backend in use (%s)", fd_errmsg(ctx));
    body(ctx);
    fd_destroy(ctx);
  }
  if (dir == tmp) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) printf("note: could not remove %s\n", tmp);
  }
}

/* The int8-dot (VNNI) checks under the cc backend: the errors, every 4th sweep case. */
static void cc_vnni(fd_ctx *ctx) {
  score_errors(ctx, "cc");
  output_errors(ctx, "cc");
  sweep(ctx, 4);
}

/* The int16 plane's checks under the cc backend: the errors, every 4th sweep case. */
static void cc_int16(fd_ctx *ctx) {
  errors16(ctx, "cc");
  sweep16(ctx, 4);
}

/* AVX2's int16 plane (the msd16 record, run here on any CPU that has it):
   the errors, the guarded tails (V, and K read in 16-byte pieces), the
   sweep under tcc and (every 4th case) the cc backend, the plans. */
static void msd16(void) {
  int isa = msd16_record(), saved = msd_isa;
  if (isa < 0) { printf("skipped the int16-plane MSD kernels: no AVX2\n"); return; }
  msd_isa = isa;
  printf("MSD kernels on isa %d (%s): 2 planes as one int16 plane\n", isa, fd_isa_table[isa].text);
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2 });
  errors16(ctx, "tcc");
  for (int G = 2; G <= 8; G *= 2) guard_tail(ctx, 2, 64, 1, G);   /* groups of 4, 2 and 1 keys */
  guard_tail(ctx, 2, 4096, 1, 4);
  sweep16(ctx, 1);
  fd_destroy(ctx);
  on_cc(cc_int16);
  plans16(isa);
  msd_isa = saved;
}

int main(void) {
  msd16();
  msd_isa = kx_msd_isa();
  if (msd_isa < 0) {
    printf("skipped the MSD kernels: this CPU has no AVX512-VNNI (isa digit %d at most)\n", fd_cpu_max_isa());
  } else {
    printf("MSD kernels on isa %d (%s)\n", msd_isa, fd_isa_table[msd_isa].text);
    fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2 });
    score_errors(ctx, "tcc");
    output_errors(ctx, "tcc");
    guard_tail(ctx, 3, 64, 0, 4);
    guard_tail(ctx, 2, 64, 0, 4);
    guard_tail(ctx, 2, 4096, 0, 4);
    sweep(ctx, 1);
    fd_destroy(ctx);
    on_cc(cc_vnni);
  }
  refusals();
  heuristic();
  return t_done();
}
