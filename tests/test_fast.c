/* Fast precision (fd_config.precision FD_PRECISION_FAST) through the public
   API, against the double-precision reference (tools/fdgen/ref.c), in its
   two arms: bf16 V (key digit precision: the softmax weights rounded to
   bf16 and two keys per vdpbf16ps in P.V) and int8 K and V (the planes
   digit FD_FAST_PLANES, 2 MSD planes of q and of the weights, instead of
   FD_H_PLANES); for each arm:
   - the outputs of every mask mode (causal with q_len 1 and 3, a window with
     sinks, mask, full), the layouts (bhsd, bshd, paged; windows start
     chunks and pages at odd keys), odd groups (tiles 1, 3, 5, 7, and 4, 8
     and the head-lane 16),
     head_dims 48, 64, 80, 96, 128, unsplit and 3 splits, f32/f16/bf16 q and
     out, a third of them through beam_src (runs of 1..40 keys from random
     rows: P.V pieces start at odd keys), within the arm's tolerance of the
     largest |output| (FAST_TOL, FAST_I8_TOL; the default kernels' own
     tolerance is t_tolerance); each plan's key must carry the arm's digit;
   - the largest error of each mode on Llama-3.1-8B's group (4 heads, D 128)
     at 4096 keys, printed (README "Fast precision");
   - a tuned row's int8 key (3 planes) takes the int8 arm on a FAST context
     (its chunk and tile kept, planes 2);
   - FAST on a shape it cannot serve (f16 V; an isa without
     int8 dot products or AVX2's int16 plane) plans the default key and runs it; opts.precision -1
     turns it off, a forced opts.planes keeps its count;
   - the refusals: config.precision 2 / -1 (no context), opts.precision 2, and
     opts.precision 1 where it cannot apply, each naming the field.
   The bf16 arm needs AVX512-BF16 (isa digit 3), the int8 arm AVX512-VNNI
   (digit 3 or 4); without them only the refusals and plans run. */
#include "compare.h"
#include "internal.h"
#include "cpu.h"
#include "tcheck.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NB 3
#define HKV 2
#define S_CAP 200
#define PAGE 16
#define PER_ROW ((S_CAP + PAGE - 1) / PAGE)
#define ISA3 3
/* bf16 weights: each weight within 2^-9 relative, the output within 2^-9 of
   the largest |V| (here below 4x the largest |output|), plus out rounding */
#define FAST_TOL 8e-3
/* 2 MSD planes: q and the weights to about 2^-15 of their largest element
   (tests/test_msd.c holds its 2-plane outputs and lse to 1e-3 likewise) */
#define FAST_I8_TOL 1e-3

/* The isa digit of the best record with int8 dot products this CPU has, -1 without one. */
static int msd_isa = -1;
/* The largest error of a sweep's cases (printed: the margin below FAST_TOL). */
static double sweep_worst;

/* One case: K/V and positions from kp, q [NB, q_len, Hq, D] from qp; src
   the beam_src [NB, S_CAP] (FD_BEAMS) or NULL. */
typedef struct fcase {
  kproblem kp, qp;
  int q_len, mode, window, sinks, layout;
  int32_t *src;
} fcase;

/* beam_src of runs of 1..40 keys (odd ones too: P.V pieces start at odd keys) from random rows. */
static void beam_runs(fcase *c, uint64_t seed) {
  uint64_t st = seed * 31 + 7;
  c->src = malloc(sizeof(int32_t) * NB * S_CAP);
  for (int b = 0; b < NB; b++) {
    int32_t cur = b;
    for (int64_t i = 0, left = 0; i < S_CAP; i++, left--) {
      if (left <= 0) {
        left = 1 + (int64_t)t_rand(&st, 0, 40);
        cur = (int32_t)t_rand(&st, 0, NB);
      }
      c->src[b * S_CAP + i] = cur;
    }
  }
}

/* Build a case of K/V dtype kd, bf16 or int8 with row scales (layout FD_BHSD
   or FD_BSHD; paged cases are built dense and pooled). */
static void make(fcase *c, int kd, int layout, int Hq, int D, int qd, int od, int mode, int q_len, int window, int sinks,
                 uint64_t seed) {
  memset(c, 0, sizeof *c);
  c->q_len = q_len; c->mode = mode; c->window = window; c->sinks = sinks; c->layout = layout;
  kp_init(&c->kp, NB, Hq, HKV, D, S_CAP, qd, kd, od, mode, layout, seed);
  kp_init(&c->qp, NB * q_len, Hq, HKV, D, 1, qd, kd, od, FD_FULL, FD_BHSD, seed + 1);
  c->kp.cur_pos[0] = S_CAP - 1;
  c->kp.cur_pos[1] = q_len - 1;
  c->kp.cur_pos[2] = q_len - 1 + (S_CAP - q_len) / 2;
}

static void unmake(fcase *c) { kp_free(&c->kp); kp_free(&c->qp); free(c->src); }

/* The reference of token t through the case's beam_src (tests/kexec.c kx_token_reference). */
static void reference(const fcase *c, int t, double *rout, double *rlse) {
  ref_problem rt = c->kp.ref;
  rt.beam_src = c->src;
  kx_token_reference(rt, c->qp.qf, c->kp.cur_pos, c->q_len, t, c->window, c->sinks, rout, rlse);
}

/* The K/V of a bhsd case as a pool: row b's page i at pool page i * NB + (b + i) % NB, and its block table. */
typedef kx_pool pool;   /* tests/kexec.h */

static void make_pool(const fcase *c, pool *pl) {
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
static fd_shape shape_of(const fcase *c, int paged) {
  const ref_problem *r = &c->kp.ref;
  fd_shape s = { NB, r->Hq, HKV, r->D, S_CAP, c->kp.q_dtype, c->kp.kv_dtype, c->kp.out_dtype, c->mode,
                 paged ? FD_PAGED : c->layout, paged ? PAGE : 0 };
  s.q_len = c->q_len;
  s.window = c->window;
  s.sink_tokens = c->sinks;
  s.pool_pages = paged ? NB * PER_ROW : 0;
  s.features = c->src ? FD_BEAMS : 0;
  return s;
}

/* The case's arguments (dense, or paged from pl) writing out and lse. */
static fd_args args_of(const fcase *c, const pool *pl, void *out, float *lse) {
  fd_args a = { c->qp.q, pl ? pl->k : c->kp.k, pl ? pl->v : c->kp.v, c->kp.cur_pos, c->kp.mask,
                pl ? pl->ks : c->kp.k_scale, pl ? pl->vs : c->kp.v_scale, pl ? pl->table : NULL, 0, out, lse };
  a.beam_src = c->src;
  return a;
}

/* Digit field (FD_KF_*) of a key (its place from gen/facts.lua, counted from the right). */
static int key_digit(const char *key, int field) {
  size_t len = strlen(key), pos = (size_t)fd_key_fields[field].pos;
  return len > pos ? key[len - 1 - pos] - '0' : 0;
}

/* The digits fast precision sets on a kernel of kv dtype kd: precision 1
   for bf16 V, planes FD_FAST_PLANES for int8 (fast) or FD_H_PLANES (not). */
typedef struct arm_digits { int precision, planes; } arm_digits;
static arm_digits arm_want(int kd, int fast) {
  if (kd == FD_I8) return (arm_digits){ 0, fast ? FD_FAST_PLANES : FD_H_PLANES };
  return (arm_digits){ fast, 0 };
}

/* Plan s with o, check its key's precision and planes digits are want's, run a once; FD_OK or the failing call's code. */
static int run_fast(fd_ctx *ctx, const fd_shape *s, const fd_plan_opts *o, const fd_args *a, arm_digits want,
                    const char *name) {
  fd_plan *plan = NULL;
  int rc = fd_plan_create_opts(ctx, s, o, &plan);
  if (rc) return rc;
  fd_plan_info info;
  rc = fd_plan_info_get(plan, s->kv_len, &info);
  t_check(!rc && key_digit(info.key, FD_KF_PRECISION) == want.precision && key_digit(info.key, FD_KF_PLANES) == want.planes,
          "%s: key %s has precision digit %d and planes digit %d", name, info.key, want.precision, want.planes);
  rc = fd_run(plan, a);
  fd_plan_destroy(plan);
  return rc;
}

/* The largest output error of out [B, q_len, Hq, D] over the tokens against
   reference(c, t), relative to the largest |output| (kp_errors); NaN: inf. */
static double token_error(const fcase *c, const void *out, const float *lse, double *lse_err) {
  const kproblem *p = &c->kp;
  const ref_problem *r = &p->ref;
  size_t n = (size_t)r->B * r->Hq * r->D, qrow = (size_t)r->Hq * r->D;
  double *rout = malloc(n * sizeof(double)), *rlse = malloc(sizeof(double) * r->B * r->Hq), worst = 0;
  float *got = malloc(n * sizeof(float)), *glse = malloc(sizeof(float) * r->B * r->Hq);
  *lse_err = 0;
  for (int t = 0; t < c->q_len; t++) {
    reference(c, t, rout, rlse);
    for (int b = 0; b < r->B; b++) {
      size_t at = (size_t)(b * c->q_len + t);
      for (size_t i = 0; i < qrow; i++) got[b * qrow + i] = t_load(p->out_dtype, out, at * qrow + i);
      memcpy(glse + (size_t)b * r->Hq, lse + at * r->Hq, sizeof(float) * r->Hq);
    }
    kp_error e = kp_errors(p, got, glse, rout, rlse);
    worst = fmax(worst, e.nan ? INFINITY : e.out);
    *lse_err = fmax(*lse_err, e.lse_inf ? INFINITY : e.lse);
  }
  free(rout); free(rlse); free(got); free(glse);
  return worst;
}

/* The isa digit an arm's kernels run on: 3 for bf16 V, the best record
   with int8 dot products for int8. */
static int arm_isa(int kd) { return kd == FD_I8 ? msd_isa : ISA3; }

/* The output and lse tolerances of an arm beside t_tolerance: bf16 weights
   leave the scores and sums exact (lse to KP_LSE_TOL); 2 planes round both. */
static double arm_tol(int kd) { return kd == FD_I8 ? FAST_I8_TOL : FAST_TOL; }
static double arm_lse_tol(int kd) { return kd == FD_I8 ? FAST_I8_TOL : KP_LSE_TOL; }

/* One case of K/V dtype kd against the reference on the arm's isa with fast
   precision, each layout it takes (bhsd cases also paged; bshd cases as they are). */
static void run_case(fd_ctx *ctx, int kd, int layout, int D, int tile, int mode, int q_len, int splits, int beams,
                     int idx) {
  int chunk = idx % 2 ? 96 : 64, qd = idx % 3, od = idx / 3 % 3;
  int window = q_len > 1 && idx % 4 == 1 ? 21 : 0, sinks = window ? 3 : 0;
  fcase c;
  make(&c, kd, layout, HKV * tile, D, qd, od, mode, q_len, window, sinks, 700 + (uint64_t)idx);
  if (beams) beam_runs(&c, 800 + (uint64_t)idx);
  size_t n = (size_t)NB * q_len * HKV * tile * D;
  void *out = malloc(n * t_dtype_size(od));
  float *lse = malloc(sizeof(float) * NB * q_len * HKV * tile);
  fd_plan_opts o = { chunk, tile, splits, 2, arm_isa(kd) + 1, 0, getenv("FAST_OFF") ? -1 : 0 };
  for (int paged = 0; paged <= (layout == FD_BHSD); paged++) {
    char name[256];
    snprintf(name, sizeof name, "fast %s q%s out%s %s %s q_len %d window %d%s splits %d chunk %d D %d tile %d",
             fd_dtype_names[kd], fd_dtype_names[qd], fd_dtype_names[od], fd_mask_mode_names[mode],
             paged ? "paged" : fd_layout_names[layout], q_len, window, beams ? " beams" : "", splits, chunk, D, tile);
    pool pl = { 0 };
    if (paged) make_pool(&c, &pl);
    fd_shape s = shape_of(&c, paged);
    fd_args a = args_of(&c, paged ? &pl : NULL, out, lse);
    int rc = run_fast(ctx, &s, &o, &a, arm_want(kd, o.precision >= 0), name);
    if (t_check(rc == 0, "%s: run: %s", name, fd_errmsg(ctx))) {
      double le, e = token_error(&c, out, lse, &le), tol = arm_tol(kd) + t_tolerance(&c.kp);
      t_check(e <= tol, "%s: max error %.3g (tolerance %.3g)", name, e, tol);
      sweep_worst = fmax(sweep_worst, e);
      t_check(le <= arm_lse_tol(kd), "%s: lse error %.3g > %.3g", name, le, arm_lse_tol(kd));
    }
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

/* Every mode variant x layout, the tiles, head_dims and splits in turn, K/V
   dtype kd; every every-th case (the cc backend: 4, its compiles are slow). */
static void sweep(fd_ctx *ctx, int kd, int every) {
  static const int TILES[6] = { 1, 3, 5, 7, 4, 8 }, DS[5] = { 64, 96, 128, 48, 80 };
  int idx = 0, mode, q_len;
  sweep_worst = 0;
  for (int m = 0; m < 4; m++)
    for (int layout = FD_BHSD; layout <= FD_BSHD; layout++)
      for (int v = 0; v < 6; v++) {
        mode_of(m, &mode, &q_len);
        int tile = TILES[(v + m) % 6], D = DS[(v + 2 * m) % 5];
        if (idx % every == 0) run_case(ctx, kd, layout, D, tile, mode, q_len, v % 2 ? 3 : 1, v % 3 == 2, idx);
        idx++;
      }
  /* the head-lane tile (16 heads): dense and paged, causal q_len 3 with a
     window and sinks (case 49: idx % 4 == 1), 3 splits, with and without
     beam_src (P.V pieces, whose key pairs start at each piece's first key) */
  for (int beams = 0; beams <= 1; beams++)
    run_case(ctx, kd, FD_BHSD, beams ? 128 : 64, 16, FD_CAUSAL, 3, 3, beams, 49);
  printf("fast precision sweep, %s K/V (every %d-th case): largest error %.3g of the largest |output| (f16/bf16 out "
         "rounding included; tolerance %.3g plus the out dtype's)\n", fd_dtype_names[kd], every, sweep_worst, arm_tol(kd));
}

/* The largest output error of Llama-3.1-8B's group (4 query heads per kv
   head, D 128, bf16 q, K/V dtype kd (bf16, or int8 with row scales), f32
   out) at 4096 keys, causal, on the arm's isa with precision
   opts.precision (-1 default, 1 fast), relative to the largest |output|. */
static double llama_error(fd_ctx *ctx, int kd, int precision) {
  const int G = 4, D = 128, S = 4096, B = 1, H = 2;
  kproblem kp;
  kp_init(&kp, B, H * G, H, D, S, FD_BF16, kd, FD_F32, FD_CAUSAL, FD_BHSD, 31337);
  kp.cur_pos[0] = S - 1;
  float *out = malloc(sizeof(float) * B * H * G * D), lse[8];
  double *rout = malloc(sizeof(double) * B * H * G * D), rlse[8];
  fd_shape s = { B, H * G, H, D, S, FD_BF16, kd, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  fd_args a = { kp.q, kp.k, kp.v, kp.cur_pos, NULL, kp.k_scale, kp.v_scale, NULL, 0, out, lse };
  fd_plan_opts o = { 0 };
  o.isa = arm_isa(kd) + 1;
  o.precision = precision;
  int rc = run_fast(ctx, &s, &o, &a, arm_want(kd, precision > 0), precision > 0 ? "llama fast" : "llama default");
  t_check(rc == 0, "llama run: %s", fd_errmsg(ctx));
  ref_attention(&kp.ref, rout, rlse);
  kp_error e = kp_errors(&kp, out, lse, rout, rlse);
  free(out); free(rout);
  kp_free(&kp);
  return e.nan ? INFINITY : e.out;
}

/* The error of each mode for K/V dtype kd, printed (README "Fast precision"). */
static void mode_errors(fd_ctx *ctx, int kd, const char *backend) {
  double e0 = llama_error(ctx, kd, -1), e1 = llama_error(ctx, kd, 1);
  printf("%s: Llama-3.1-8B group (4 heads, D 128, bf16 q, %s K/V, causal, 4096 keys) max error vs the double "
         "reference, relative to the largest |output|: default %.3g, fast %.3g\n", backend, fd_dtype_names[kd], e0, e1);
  t_check(e0 <= 1e-5, "default precision within 1e-5 (%.3g)", e0);
  t_check(e1 <= arm_tol(kd) && e1 >= e0, "fast precision within %.3g and not below the default (%.3g vs %.3g)",
          arm_tol(kd), e1, e0);
}

/* Digit field (FD_KF_*) of the key planned for kv dtype kd with group tile
   G (n_q_heads / n_kv_heads) and opts o on a context with precision prec. */
static int planned(int prec, int kd, int G, fd_plan_opts o, int field) {
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2, .precision = prec });
  fd_shape s = { 1, 2 * G, 2, 128, 4096, FD_BF16, kd, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  fd_plan *plan = NULL;
  fd_plan_info info = { 0 };
  int rc = fd_plan_create_opts(ctx, &s, &o, &plan);
  if (!rc) rc = fd_plan_info_get(plan, 4096, &info);
  t_check(rc == 0, "plan: %s", fd_errmsg(ctx));
  fd_plan_destroy(plan);
  fd_destroy(ctx);
  return key_digit(info.key, field);
}

/* FAST is a permission: bf16 V on isa 3 takes it (the head-lane tile of 16
   heads too); f16 V, a context at the default or opts.precision -1 do not. */
static void permission(void) {
  int want = fd_cpu_has_isa(ISA3), p;
  p = planned(FD_PRECISION_FAST, FD_BF16, 4, (fd_plan_opts){ 0 }, FD_KF_PRECISION);
  t_check(p == want, "FAST, bf16 V, 4 heads: precision %d (want %d)", p, want);
  p = planned(FD_PRECISION_DEFAULT, FD_BF16, 4, (fd_plan_opts){ 0 }, FD_KF_PRECISION);
  t_check(p == 0, "default context: precision %d", p);
  p = planned(FD_PRECISION_FAST, FD_F16, 4, (fd_plan_opts){ 0 }, FD_KF_PRECISION);
  t_check(p == 0, "FAST, f16 V: precision %d (the default kernel)", p);
  p = planned(FD_PRECISION_FAST, FD_BF16, 16, (fd_plan_opts){ 0 }, FD_KF_PRECISION);
  t_check(p == want, "FAST, 16 heads (head-lane tile): precision %d (want %d)", p, want);
  p = planned(FD_PRECISION_FAST, FD_BF16, 4, (fd_plan_opts){ .precision = -1 }, FD_KF_PRECISION);
  t_check(p == 0, "FAST, opts.precision -1: precision %d", p);
  int plain = kx_plain_isa();                    /* AVX-512, else AVX2: no bf16 dot products */
  p = planned(FD_PRECISION_FAST, FD_BF16, 4, (fd_plan_opts){ .isa = plain + 1 }, FD_KF_PRECISION);
  t_check(p == 0, "FAST, forced isa %s: precision %d", fd_isa_table[plain].name, p);
  if (want) {
    p = planned(FD_PRECISION_DEFAULT, FD_BF16, 4, (fd_plan_opts){ .precision = 1 }, FD_KF_PRECISION);
    t_check(p == 1, "default context, opts.precision 1: precision %d", p);
  }
}

/* The int8 arm: FAST takes FD_FAST_PLANES planes where the planes digit
   would be FD_H_PLANES (on the best record with int8 dot products); the
   precision digit stays 0; a default context, opts.precision -1 and a forced
   opts.planes keep theirs; AVX2 (the msd16 group) takes FD_FAST_PLANES as one
   int16 plane of q (tile 4 here; tests/test_msd.c checks its kernels), an
   isa with neither int8 dot products nor msd16 has none. */
static void int8_permission(void) {
  int on = msd_isa >= 0, isa = msd_isa + 1, p;   /* without one, isa 0: the planner's (no planes) */
  int plain = kx_plain_isa(), int16 = fd_isa_table[plain].msd16;   /* AVX2: 2 planes as one int16 plane */
  int fast_want = on || (int16 && plain == fd_cpu_max_isa()) ? FD_FAST_PLANES : 0;
  p = planned(FD_PRECISION_FAST, FD_I8, 4, (fd_plan_opts){ .isa = isa }, FD_KF_PLANES);
  t_check(p == fast_want, "FAST, int8: planes %d (want %d)", p, fast_want);
  p = planned(FD_PRECISION_FAST, FD_I8, 4, (fd_plan_opts){ .isa = isa }, FD_KF_PRECISION);
  t_check(p == 0, "FAST, int8: precision digit %d", p);
  p = planned(FD_PRECISION_DEFAULT, FD_I8, 4, (fd_plan_opts){ .isa = isa }, FD_KF_PLANES);
  t_check(p == (on ? FD_H_PLANES : 0), "default context, int8: planes %d", p);
  p = planned(FD_PRECISION_FAST, FD_I8, 4, (fd_plan_opts){ .isa = isa, .precision = -1 }, FD_KF_PLANES);
  t_check(p == (on ? FD_H_PLANES : 0), "FAST, int8, opts.precision -1: planes %d", p);
  p = planned(FD_PRECISION_FAST, FD_I8, 4, (fd_plan_opts){ .isa = plain + 1 }, FD_KF_PLANES);
  t_check(p == (int16 ? FD_FAST_PLANES : 0), "FAST, int8, forced isa %s: planes %d (want %d)", fd_isa_table[plain].name,
          p, int16 ? FD_FAST_PLANES : 0);
  if (on) {
    p = planned(FD_PRECISION_FAST, FD_I8, 4, (fd_plan_opts){ .isa = isa, .planes = 3 }, FD_KF_PLANES);
    t_check(p == 3, "FAST, int8, opts.planes 3: planes %d", p);
    p = planned(FD_PRECISION_DEFAULT, FD_I8, 4, (fd_plan_opts){ .isa = isa, .precision = 1 }, FD_KF_PLANES);
    t_check(p == FD_FAST_PLANES, "default context, int8, opts.precision 1: planes %d", p);
  }
}

/* Write a tuned table with one row for shape s (bucket 4096, splits 1,
   threads 2) into path (a mkstemp template): the key of chunk 64, tile 4,
   isa digit isa and planes digit planes, also into key; 0 on success. */
static int write_table(const fd_shape *s, int isa, int planes, char *key, char *path) {
  char head[4096], sig[256], text[8192], err[256];
  if (!t_check(fd_kernel_key_ext(s, 64, 4, isa, 0, planes, 0, key, err, sizeof err) == 0, "row key: %s", err)) return -1;
  fd_tuned_table_header(head, sizeof head);
  fd_shape_signature(s, sig, sizeof sig);
  snprintf(text, sizeof text, "%s%s\t4096\t%s\t1\t2\t100.0\t1.5\t120.0\tint8-row\t-\nend\t1\n", head, sig, key);
  int fd = mkstemp(path);
  if (!t_check(fd >= 0 && write(fd, text, strlen(text)) == (ssize_t)strlen(text), "table file %s", path)) return -1;
  close(fd);
  return 0;
}

/* Plan shape s with opts o on a context of threads 2, precision prec and
   table path; the info of its 4096-key bucket (key "" when refused). */
static fd_plan_info table_plan(const fd_shape *s, int prec, const char *path, fd_plan_opts o) {
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2, .precision = prec, .table = path });
  t_check(!fd_errmsg(ctx)[0], "int8 table accepted: '%s'", fd_errmsg(ctx));
  fd_plan *plan = NULL;
  fd_plan_info info = { 0 };
  int rc = fd_plan_create_opts(ctx, s, &o, &plan);
  if (!rc) rc = fd_plan_info_get(plan, 4096, &info);
  t_check(!rc, "plan from the int8 table: %s", fd_errmsg(ctx));
  fd_plan_destroy(plan);
  fd_destroy(ctx);
  return info;
}

/* A tuned int8 row on the MSD isa (chunk 64, tile 4, 3 planes): a default
   context runs it as it is, a FAST one with its chunk and tile and
   FD_FAST_PLANES planes. */
static void int8_table_row(void) {
  fd_shape s = { 1, 8, 2, 128, 4096, FD_BF16, FD_I8, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  char key[FD_KEY_BUFSZ], path[] = "/tmp/fd_fast_table_XXXXXX";
  if (write_table(&s, msd_isa, FD_H_PLANES, key, path)) return;
  for (int prec = FD_PRECISION_DEFAULT; prec <= FD_PRECISION_FAST; prec++) {
    fd_plan_info info = table_plan(&s, prec, path, (fd_plan_opts){ 0 });
    int want = prec ? FD_FAST_PLANES : FD_H_PLANES;
    t_check(info.from_table == 1 && info.chunk == 64 && info.group_tile == 4 &&
            key_digit(info.key, FD_KF_PLANES) == want && key_digit(info.key, FD_KF_PRECISION) == 0,
            "%s context, int8 table row %s: key %s from_table %d chunk %d (want planes %d, the row's chunk 64)",
            prec ? "FAST" : "default", key, info.key, info.from_table, info.chunk, want);
  }
  unlink(path);
}

/* A tuned int8 row on isa 2 (AVX-512 without int8 dot products, no planes):
   a FAST context runs it as it is (fast precision where a kernel serves it),
   but opts.precision 1 is forced: the planner passes over the row and its
   heuristic plan takes the MSD isa with FD_FAST_PLANES planes. */
static void int8_row_forced_fast(void) {
  fd_shape s = { 1, 8, 2, 128, 4096, FD_BF16, FD_I8, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  char key[FD_KEY_BUFSZ], path[] = "/tmp/fd_fast_table_XXXXXX";
  int isa2 = FD_ISA_AVX512 - 1;
  if (write_table(&s, isa2, 0, key, path)) return;
  fd_plan_info ctx_fast = table_plan(&s, FD_PRECISION_FAST, path, (fd_plan_opts){ 0 });
  t_check(ctx_fast.from_table == 1 && key_digit(ctx_fast.key, FD_KF_ISA) == isa2 &&
          key_digit(ctx_fast.key, FD_KF_PLANES) == 0, "FAST context, isa-2 int8 row %s: key %s from_table %d (want the row)",
          key, ctx_fast.key, ctx_fast.from_table);
  for (int prec = FD_PRECISION_DEFAULT; prec <= FD_PRECISION_FAST; prec++) {
    fd_plan_info info = table_plan(&s, prec, path, (fd_plan_opts){ .precision = 1 });
    t_check(info.from_table == 0 && key_digit(info.key, FD_KF_ISA) == msd_isa &&
            key_digit(info.key, FD_KF_PLANES) == FD_FAST_PLANES,
            "%s context, opts.precision 1 over the isa-2 int8 row %s: key %s from_table %d (want isa %d, %d planes, "
            "not the row)", prec ? "FAST" : "default", key, info.key, info.from_table, msd_isa, FD_FAST_PLANES);
  }
  unlink(path);
}

/* A tuned bf16 row on isa 2 (f32 FMA P.V; chunk 64, tile 4): a default
   context runs it as it is; a FAST one (this CPU has AVX512-BF16) takes
   isa 3 and the precision digit with the row's chunk, tile and splits (the
   tuner times the default precision only). */
static void bf16_row_takes_fast_isa(void) {
  fd_shape s = { 1, 8, 2, 128, 4096, FD_BF16, FD_BF16, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  char key[FD_KEY_BUFSZ], path[] = "/tmp/fd_fast_table_XXXXXX";
  int isa2 = FD_ISA_AVX512 - 1;
  if (write_table(&s, isa2, 0, key, path)) return;
  for (int prec = FD_PRECISION_DEFAULT; prec <= FD_PRECISION_FAST; prec++) {
    fd_plan_info info = table_plan(&s, prec, path, (fd_plan_opts){ 0 });
    int up = prec;
    t_check(info.from_table == 1 && info.chunk == 64 && info.group_tile == 4 &&
            key_digit(info.key, FD_KF_ISA) == (up ? ISA3 : isa2) && key_digit(info.key, FD_KF_PRECISION) == up,
            "%s context, bf16 isa-2 table row %s: key %s from_table %d chunk %d tile %d (want isa %d, precision %d, "
            "the row's chunk 64 and tile 4)", prec ? "FAST" : "default", key, info.key, info.from_table, info.chunk,
            info.group_tile, up ? ISA3 : isa2, up);
  }
  unlink(path);
}

/* A FAST context on an f16 V shape runs the default kernel: its output
   within the default tolerance of the reference. */
static void f16_runs_default(void) {
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2, .precision = FD_PRECISION_FAST });
  kproblem kp;
  kp_init(&kp, NB, 8, HKV, 64, S_CAP, FD_F32, FD_F16, FD_F32, FD_CAUSAL, FD_BHSD, 555);
  float out[NB * 8 * 64], lse[NB * 8];
  double rout[NB * 8 * 64], rlse[NB * 8];
  fd_shape s = { NB, 8, HKV, 64, S_CAP, FD_F32, FD_F16, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  fd_args a = { kp.q, kp.k, kp.v, kp.cur_pos, NULL, NULL, NULL, NULL, 0, out, lse };
  fd_plan_opts o = { 0 };
  int rc = run_fast(ctx, &s, &o, &a, arm_want(FD_F16, 0), "FAST context, f16 V");
  t_check(rc == 0, "f16 V run: %s", fd_errmsg(ctx));
  ref_attention(&kp.ref, rout, rlse);
  kp_error e = kp_errors(&kp, out, lse, rout, rlse);
  t_check(!e.nan && e.out <= t_tolerance(&kp), "FAST context, f16 V: the default kernel's error %.3g", e.out);
  kp_free(&kp);
  fd_destroy(ctx);
}

/* A plan that must be refused with code rc and a message holding want. */
static void refused(fd_ctx *ctx, fd_shape s, fd_plan_opts o, int rc, const char *want, const char *name) {
  fd_plan *plan = NULL;
  int got = fd_plan_create_opts(ctx, &s, &o, &plan);
  t_check(got == rc && strstr(fd_errmsg(ctx), want) != NULL && !plan, "refusal %s: rc %d (want %d), message '%s' (want '%s')",
          name, got, rc, fd_errmsg(ctx), want);
  fd_plan_destroy(plan);
}

/* config.precision and opts.precision refusals; a refused run leaves out untouched. */
static void refusals(void) {
  for (int bad = -1; bad <= 2; bad += 3) {
    fd_ctx *none = fd_create(&(fd_config){ .threads = 2, .precision = bad });
    t_check(!none && strstr(fd_errmsg(NULL), "config.precision") != NULL,
            "config.precision %d refused naming config.precision: '%s'", bad, fd_errmsg(NULL));
    fd_destroy(none);
  }
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2 });
  fd_shape s = { NB, 8, HKV, 64, S_CAP, FD_F32, FD_BF16, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  refused(ctx, s, (fd_plan_opts){ .precision = 2 }, FD_EINVAL, "opts.precision 2 is not 0", "precision 2");
  refused(ctx, s, (fd_plan_opts){ .precision = -2 }, FD_EINVAL, "opts.precision -2 is not 0", "precision -2");
  int plain = kx_plain_isa();                    /* AVX-512, else AVX2 (else C, refused below as well) */
  const char *pname = fd_isa_table[plain].name;
  char want[200];
  snprintf(want, sizeof want, "opts.precision 1 needs an isa with bf16 dot products (avx512bf16), not isa %s", pname);
  refused(ctx, s, (fd_plan_opts){ .precision = 1, .isa = plain + 1 }, FD_EUNSUPPORTED, want, pname);
  refused(ctx, s, (fd_plan_opts){ .precision = 1, .isa = FD_ISA_C }, FD_EUNSUPPORTED, "not isa c", "portable C");
  s.kv_dtype = FD_F16;
  refused(ctx, s, (fd_plan_opts){ .precision = 1 }, FD_EUNSUPPORTED, "opts.precision 1 needs bf16 V (bf16 weights) or "
          "int8 K and V (2 MSD planes), not kv_dtype f16", "f16 V");
  s.kv_dtype = FD_I8;
  if (fd_isa_table[plain].msd16) {               /* AVX2: one int16 plane of q, at tiles 2 to 8, head_dim 16k */
    s.head_dim = 72;
    snprintf(want, sizeof want, "opts.precision 1 on int8 K and V on isa %s takes one int16 plane of q, which needs "
             "group tiles 2 to 8 and shape.head_dim a multiple of 16 (not group tile 4, head_dim 72)", pname);
    refused(ctx, s, (fd_plan_opts){ .precision = 1, .isa = plain + 1 }, FD_EUNSUPPORTED, want, "int8, plain isa, D 72");
    s.head_dim = 64;
  } else {
    snprintf(want, sizeof want, "opts.precision 1 on int8 K and V (2 MSD planes) needs an isa with int8 dot products "
             "(avx512vnni, avx512bf16), not isa %s", pname);
    refused(ctx, s, (fd_plan_opts){ .precision = 1, .isa = plain + 1 }, FD_EUNSUPPORTED, want, "int8, plain isa");
  }
  if (msd_isa >= 0) {
    refused(ctx, s, (fd_plan_opts){ .precision = 1, .planes = -1 }, FD_EUNSUPPORTED, "opts.precision 1 on int8 K and V "
            "takes 2 MSD planes, but opts.planes -1 forces f32 FMA scores", "int8, planes -1");
    refused(ctx, s, (fd_plan_opts){ .precision = 1, .planes = 3 }, FD_EUNSUPPORTED, "but opts.planes 3 forces another count",
            "int8, planes 3");
    s.head_dim = 16;
    refused(ctx, s, (fd_plan_opts){ .precision = 1 }, FD_EUNSUPPORTED, "opts.precision 1 on int8 K and V needs MSD planes, "
            "which this shape does not take (shape.head_dim 16", "int8, head_dim 16");
  }
  fd_destroy(ctx);
}

/* One arm's kernels (K/V dtype kd): the mode errors and the sweep under tcc, then under the cc backend. */
static void arm_kernels(int kd) {
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2, .precision = FD_PRECISION_FAST });
  mode_errors(ctx, kd, "tcc");
  sweep(ctx, kd, 1);
  fd_destroy(ctx);
  char tmp[] = "/tmp/fd_fast_XXXXXX";
  const char *dir = getenv("FD_TEST_CACHE_DIR");
  if (!dir) dir = mkdtemp(tmp);
  if (t_check(dir != NULL, "temporary cache_dir")) {
    ctx = fd_create(&(fd_config){ .threads = 2, .backend = FD_BACKEND_CC, .cache_dir = dir, .precision = FD_PRECISION_FAST });
    t_check(fd_ctx_backend(ctx) == FD_BACKEND_CC, "cc backend in use (%s)", fd_errmsg(ctx));
    mode_errors(ctx, kd, "cc");
    sweep(ctx, kd, 4);
    fd_destroy(ctx);
  }
  if (dir == tmp) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) printf("note: could not remove %s\n", tmp);
  }
}

int main(void) {
  msd_isa = kx_msd_isa();
  refusals();
  permission();
  int8_permission();
  if (msd_isa >= 0) {
    int8_table_row();
    int8_row_forced_fast();
    arm_kernels(FD_I8);
  }
  else printf("skipped the int8 fast-precision kernels: this CPU has no AVX512-VNNI (isa digit %d at most)\n",
              fd_cpu_max_isa());
  if (!fd_cpu_has_isa(ISA3)) {
    printf("skipped the bf16 fast-precision kernels: this CPU has no AVX512-BF16 (isa digit %d at most)\n",
           fd_cpu_max_isa());
    return t_done();
  }
  f16_runs_default();
  bf16_row_takes_fast_isa();
  arm_kernels(FD_BF16);
  return t_done();
}
