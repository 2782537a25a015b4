/* Non-finite inputs through the public API against the double-precision
   reference (tools/fdgen/ref.c): NaN, +Inf and -Inf in q, K, V and the mask,
   for each ISA this CPU has (forced through fd_plan_opts.isa), 1, 4 and more
   splits than keys, the tcc and the cc backend; f16/bf16/fp8 (e4m3, e5m2)
   codes and int8/fp8 scales; V values near FLT_MAX; and
   fd_config.check_inputs, which refuses them with the element named and
   writes nothing. */
#include "flashdecode.h"
#include "fd_keydefs.h"
#include "kexec.h"
#include "tcheck.h"
#include "cpu.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xmmintrin.h>

enum { AT_Q, AT_K, AT_V, AT_MASK, AT_KSCALE, AT_VSCALE };
static const char *AT[] = { "q", "K", "V", "mask", "k_scale", "v_scale" };
#define DT fd_dtype_names
/* The name of fd_plan_opts.isa value isa (0: auto), from its ISA record (gen/facts.lua). */
static const char *isa_name(int isa) { return isa ? fd_isa_table[isa - 1].text : "auto"; }

/* A test shape: the problem's dimensions and the group tile to force (0: the planner's). */
typedef struct nf_shape { const char *name; int B, Hq, Hkv, D, tile; } nf_shape;
static const nf_shape SHAPES[] = {
  { "gqa tile 4", 2, 8, 2, 64, 4 },
  { "gqa tile 1", 2, 8, 2, 64, 1 },          /* the staged scores kernel */
  { "head-lane 16", 1, 16, 1, 64, 16 },      /* AVX-512 head-lane kernel */
};
#define S_LEN 40
#define CHUNK 16                              /* three chunks per unsplit row */

/* Where a case puts its value: q (b, h, d), K/V (b, j, key, d), mask (b, h, key);
   positions are taken modulo the shape's sizes. */
static const int POS_Q[3] = { 0, 1, 3 }, POS_K[4] = { 1, 0, 17, 5 }, POS_V[4] = { 1, 1, 9, 7 }, POS_M[3] = { 0, 5, 20 };

/* The flat element index of a case's position in its tensor, for problem p. */
static size_t pos_index(const kproblem *p, int at) {
  const ref_problem *r = &p->ref;
  int B = r->B, Hq = r->Hq, Hkv = r->Hkv;
  if (at == AT_Q) return ((size_t)(POS_Q[0] % B) * Hq + POS_Q[1] % Hq) * r->D + POS_Q[2];
  if (at == AT_MASK) return ((size_t)(POS_M[0] % B) * Hq + POS_M[1] % Hq) * r->S + POS_M[2];
  const int *P = at == AT_K || at == AT_KSCALE ? POS_K : POS_V;
  size_t row = (size_t)ref_kv_offset(r, P[0] % B, P[1] % Hkv, P[2]) / r->D;
  return at >= AT_KSCALE ? row : row * r->D + P[3];
}

/* A random problem in mask mode whose mask leaves the keys the cases touch visible. */
static void make_problem(kproblem *p, const nf_shape *s, int kv_dtype, int mode, uint64_t seed) {
  kp_init(p, s->B, s->Hq, s->Hkv, s->D, S_LEN, 0, kv_dtype, 0, mode, 0, seed);
  if (mode != 1) return;
  for (int bh = 0; bh < s->B * s->Hq; bh++) {
    p->mask[(size_t)bh * S_LEN + POS_K[2]] = 0.5f;
    p->mask[(size_t)bh * S_LEN + POS_V[2]] = -0.5f;
    p->mask[(size_t)bh * S_LEN + POS_M[2]] = 0.25f;
  }
}

/* Put value x at the case's position: in the f32 values the reference reads and
   in the storage buffers (f16/bf16/fp8 by their own encoding: the e4m3 NaN
   code, e5m2's infinity and NaN codes; int8 and fp8 rows keep their scales; a
   scale makes its whole row x times the stored codes). */
static void inject(kproblem *p, int at, float x) {
  size_t i = pos_index(p, at);
  int D = p->ref.D;
  if (at == AT_Q) { p->qf[i] = t_store(p->q_dtype, p->q, i, x); return; }
  if (at == AT_MASK) { p->mask[i] = x; return; }
  if (at == AT_KSCALE || at == AT_VSCALE) {
    float *sc = at == AT_KSCALE ? p->k_scale : p->v_scale, *vals = at == AT_KSCALE ? p->kf : p->vf;
    const void *buf = at == AT_KSCALE ? p->k : p->v;
    sc[i] = x;
    for (int d = 0; d < D; d++) vals[i * D + d] = t_load(p->kv_dtype, buf, i * D + d) * x;
    return;
  }
  float *vals = at == AT_K ? p->kf : p->vf;
  void *buf = at == AT_K ? p->k : p->v;
  if (t_block(p->kv_dtype) > 1) {     /* a block dtype: x becomes the f16 scale of the block holding i */
    uint8_t *blk = (uint8_t *)buf + t_kv_bytes(p->kv_dtype, i - i % 32);
    uint16_t h = t_f32_to_f16(x);
    blk[0] = (uint8_t)(h & 255); blk[1] = (uint8_t)(h >> 8);
    kp_decode_kv(p);
    return;
  }
  if (fd_dtype_quant[p->kv_dtype]) {  /* fp8: the NaN or infinity code; the row's scale stays */
    vals[i] = t_store(p->kv_dtype, buf, i, x) * (at == AT_K ? p->k_scale : p->v_scale)[i / D];
    return;
  }
  vals[i] = t_store(p->kv_dtype, buf, i, x);
}

/* Plan and run p with opts on ctx; out and lse as f32 values. Returns 0 or the failing code. */
static int api_run(fd_ctx *ctx, const kproblem *p, const fd_plan_opts *o, float *out, float *lse, const char *name) {
  const ref_problem *r = &p->ref;
  size_t n = (size_t)r->B * r->Hq * r->D;
  fd_shape s = { r->B, r->Hq, r->Hkv, r->D, r->S, (fd_dtype)p->q_dtype, (fd_dtype)p->kv_dtype,
                 (fd_dtype)p->out_dtype, (fd_mask_mode)r->mask_mode, (fd_layout)r->layout, 0 };
  void *obuf = malloc(n * t_dtype_size(p->out_dtype));
  fd_args a = { p->q, p->k, p->v, p->cur_pos, p->mask, p->k_scale, p->v_scale, NULL, 0, obuf, lse };
  fd_plan *plan = NULL;
  int rc = fd_plan_create_opts(ctx, &s, o, &plan);
  if (t_check(rc == 0, "%s: plan: %s", name, fd_errmsg(ctx))) {
    rc = fd_run(plan, &a);
    t_check(rc == 0, "%s: run: %s", name, fd_errmsg(ctx));
    fd_plan_destroy(plan);
  }
  for (size_t i = 0; i < n; i++) out[i] = t_load(p->out_dtype, obuf, i);
  free(obuf);
  return rc;
}

/* Whether x matches the reference value want: NaN for NaN, the same infinity,
   else within tol (absolute, the caller scales it). */
static int same(double x, double want, double tol) {
  if (isnan(want)) return isnan(x);
  if (isinf(want)) return x == want;
  return !isnan(x) && fabs(x - want) <= tol;
}

/* Compare out and lse with the reference element by element (NaN, infinities,
   finite values within the problem's tolerance); one check each, naming the first mismatch. */
static void compare_nf(const kproblem *p, const float *out, const float *lse, const double *rout, const double *rlse,
                       const char *name) {
  const ref_problem *r = &p->ref;
  size_t n = (size_t)r->B * r->Hq * r->D, nl = (size_t)r->B * r->Hq, bad = n, lbad = nl;
  double scale = 0;
  for (size_t i = 0; i < n; i++) if (isfinite(rout[i]) && fabs(rout[i]) > scale) scale = fabs(rout[i]);
  double tol = t_tolerance(p) * (scale > 0 ? scale : 1);
  for (size_t i = 0; i < n && bad == n; i++) if (!same(out[i], rout[i], tol)) bad = i;
  for (size_t i = 0; i < nl && lbad == nl; i++) if (!same(lse[i], rlse[i], 1e-5 * fmax(1, fabs(rlse[i])))) lbad = i;
  t_check(bad == n, "%s: out[b=%zu, h=%zu, d=%zu] = %g, reference %g", name, bad / r->D / r->Hq, bad / r->D % r->Hq,
          bad % r->D, bad < n ? out[bad] : 0.0, bad < n ? rout[bad] : 0.0);
  t_check(lbad == nl, "%s: lse[b=%zu, h=%zu] = %g, reference %g", name, lbad / r->Hq, lbad % r->Hq,
          lbad < nl ? lse[lbad] : 0.0, lbad < nl ? rlse[lbad] : 0.0);
}

/* What a case must give in head (b, h): NaN out and lse; x (or NaN) in one
   column of out; every column of out non-finite; or finite, as without the value. */
enum { E_SAME, E_NAN_HEAD, E_COL, E_ROW };

/* The expected effect of value x at `at` on head (b, h) (mask mode, the touched keys visible):
   NaN or +-Inf in q, a NaN or +Inf score (K, k_scale, mask) poisons the head; a
   -Inf score drops the key; a non-finite V element poisons its column, a
   non-finite v_scale every column, in each head of its kv head. */
static int expected(const kproblem *p, int at, float x, int b, int h) {
  const ref_problem *r = &p->ref;
  int G = r->Hq / r->Hkv;
  if (at == AT_Q) return b == POS_Q[0] % r->B && h == POS_Q[1] % r->Hq ? E_NAN_HEAD : E_SAME;
  if (at == AT_MASK) return b == POS_M[0] % r->B && h == POS_M[1] % r->Hq && !(x < 0) ? E_NAN_HEAD : E_SAME;
  const int *P = at == AT_K || at == AT_KSCALE ? POS_K : POS_V;
  if (b != P[0] % r->B || h / G != P[1] % r->Hkv) return E_SAME;
  if (at == AT_V) return E_COL;
  if (at == AT_VSCALE) return E_ROW;
  if (isnan(x) || at == AT_KSCALE) return E_NAN_HEAD;
  float qd = p->qf[((size_t)b * r->Hq + h) * r->D + P[3]];        /* q[d] * (+-Inf): the key's score */
  return qd * x > 0 || qd == 0 ? E_NAN_HEAD : E_SAME;
}

/* Whether the reference's head (o, l) shows effect e of value x in column col. */
static int shows(const double *o, double l, int D, int e, float x, int col) {
  int nan_all = isnan(l), fin = isfinite(l), nonfin = isfinite(l);
  for (int d = 0; d < D; d++) {
    nan_all &= isnan(o[d]) != 0;
    fin &= isfinite(o[d]) || (e == E_COL && d == col);
    nonfin &= !isfinite(o[d]);
  }
  if (e == E_NAN_HEAD) return nan_all;
  if (e == E_COL) return fin && (isnan(x) ? isnan(o[col]) : o[col] == x);
  if (e == E_ROW) return nonfin;
  return fin;
}

/* Check the reference itself gives what the semantics say (a wrong reference would hide a kernel bug). */
static void check_expectation(const kproblem *p, int at, float x, const double *rout, const double *rlse,
                              const char *name) {
  static const char *WHAT[] = { "finite", "NaN", "x in one column", "non-finite in every column" };
  const ref_problem *r = &p->ref;
  int col = (at == AT_V ? POS_V : POS_K)[3], bad = -1;
  for (int bh = 0; bh < r->B * r->Hq && bad < 0; bh++)
    if (!shows(rout + (size_t)bh * r->D, rlse[bh], r->D, expected(p, at, x, bh / r->Hq, bh % r->Hq), x, col)) bad = bh;
  t_check(bad < 0, "%s: the reference's head (b=%d, h=%d) is not %s", name, bad / r->Hq, bad % r->Hq,
          bad < 0 ? "" : WHAT[expected(p, at, x, bad / r->Hq, bad % r->Hq)]);
}

/* One case on one plan configuration: inject, run through the API, compare with the reference. */
static void run_case(fd_ctx *ctx, const nf_shape *s, int kv_dtype, int at, float x, const fd_plan_opts *o,
                     const char *tag) {
  char name[256];
  snprintf(name, sizeof name, "%s: %s kv %s, %s = %g, isa %s, %d splits", tag, s->name, DT[kv_dtype], AT[at], x,
           isa_name(o->isa), o->splits);
  kproblem p;
  make_problem(&p, s, kv_dtype, 1, 7000 + at);
  inject(&p, at, x);
  size_t n = (size_t)s->B * s->Hq * s->D, nl = (size_t)s->B * s->Hq;
  float *out = malloc(n * 4), *lse = malloc(nl * 4);
  double *rout = malloc(n * 8), *rlse = malloc(nl * 8);
  ref_attention(&p.ref, rout, rlse);
  check_expectation(&p, at, x, rout, rlse, name);
  if (api_run(ctx, &p, o, out, lse, name) == 0) compare_nf(&p, out, lse, rout, rlse, name);
  free(out); free(lse); free(rout); free(rlse);
  kp_free(&p);
}

static const float VALUES[] = { NAN, INFINITY, -INFINITY };
static const int SPLITS[] = { 1, 4, 64 };      /* 64 > 40 keys: some splits are empty */

/* The highest FD_ISA_* this context may use, and whether forcing isa on shape s can run. */
static int isa_fits(fd_ctx *ctx, int isa, const nf_shape *s) {
  if (!fd_isa_within(isa - 1, fd_ctx_max_isa(ctx))) return 0;
  return !(isa == FD_ISA_AVX2 && s->tile > 12);
}

/* q, K, V, mask x NaN/+Inf/-Inf, f32 KV, for every shape, ISA and split count on ctx. */
static void f32_matrix(fd_ctx *ctx, int n_shapes, const char *tag) {
  for (int si = 0; si < n_shapes; si++)
    for (int isa = FD_ISA_C; isa < FD_ISA_C + FD_ISA_COUNT; isa++) {
      if (!isa_fits(ctx, isa, &SHAPES[si])) continue;
      for (int sp = 0; sp < 3; sp++)
        for (int at = AT_Q; at <= AT_MASK; at++)
          for (int v = 0; v < 3; v++) {
            fd_plan_opts o = { CHUNK, SHAPES[si].tile, SPLITS[sp], 0, isa };
            run_case(ctx, &SHAPES[si], 0, at, VALUES[v], &o, tag);
          }
    }
}

/* The 16-bit and 8-bit KV encodings: NaN and +-Inf codes in K and V (f16,
   bf16, fp8 e5m2), the fp8 e4m3 NaN code, NaN and +Inf int8/fp8 row scales;
   NaN and +-Inf q over int8 K (on isa 3 the MSD scores split q into planes). */
static void dtype_cases(fd_ctx *ctx) {
  static const struct { int dt, at; float x; } C[] = {
    { FD_F16, AT_K, NAN }, { FD_F16, AT_K, INFINITY }, { FD_F16, AT_V, NAN }, { FD_F16, AT_V, -INFINITY },
    { FD_BF16, AT_K, NAN }, { FD_BF16, AT_K, -INFINITY }, { FD_BF16, AT_V, NAN }, { FD_BF16, AT_V, INFINITY },
    { FD_FP8_E4M3, AT_K, NAN }, { FD_FP8_E4M3, AT_V, NAN }, { FD_FP8_E4M3, AT_KSCALE, NAN },
    { FD_FP8_E4M3, AT_VSCALE, INFINITY }, { FD_I8, AT_KSCALE, NAN }, { FD_I8, AT_VSCALE, NAN },
    { FD_I8, AT_Q, NAN }, { FD_I8, AT_Q, INFINITY }, { FD_I8, AT_Q, -INFINITY },   /* MSD: q's planes */
    { FD_FP8_E5M2, AT_K, NAN }, { FD_FP8_E5M2, AT_K, INFINITY }, { FD_FP8_E5M2, AT_K, -INFINITY },
    { FD_FP8_E5M2, AT_V, NAN }, { FD_FP8_E5M2, AT_V, INFINITY }, { FD_FP8_E5M2, AT_V, -INFINITY },
    { FD_FP8_E5M2, AT_KSCALE, NAN }, { FD_FP8_E5M2, AT_VSCALE, INFINITY },
  };
  for (int isa = FD_ISA_C; isa < FD_ISA_C + FD_ISA_COUNT; isa++) {
    if (!isa_fits(ctx, isa, &SHAPES[0])) continue;
    for (size_t c = 0; c < sizeof C / sizeof *C; c++)
      for (int sp = 0; sp < 2; sp++) {
        int quant = fd_dtype_quant[C[c].dt];
        fd_plan_opts o = { CHUNK, quant ? 1 : 4, SPLITS[sp], 0, isa };
        run_case(ctx, &SHAPES[quant], C[c].dt, C[c].at, C[c].x, &o, "dtype");
      }
  }
}

static void each_config(fd_ctx *ctx, kproblem *p, const char *tag,
                        void (*what)(const kproblem *p, const float *out, const float *lse, const char *name));

/* The block dtypes (q8_0, q4_0): a NaN or infinite f16 block scale in K (the
   scores of the kv head's query heads NaN: products of codes 0, and of both
   signs, with the infinity) or in V (that block's 32 columns non-finite), on
   the staged and head-lane kernels, every ISA and split count, against the
   reference, which must show the effect (a test that cannot fail otherwise). */
static void block_cases(fd_ctx *ctx) {
  static const struct { int dt, at; float x; } C[] = {
    { FD_Q8_0, AT_K, INFINITY }, { FD_Q8_0, AT_V, NAN }, { FD_Q4_0, AT_K, NAN }, { FD_Q4_0, AT_V, -INFINITY },
    { FD_Q8_0, AT_V, INFINITY }, { FD_Q4_0, AT_K, -INFINITY },
  };
  for (size_t c = 0; c < sizeof C / sizeof *C; c++) {
    kproblem p;
    char tag[128];
    const nf_shape *sh = &SHAPES[c % 3];
    make_problem(&p, sh, C[c].dt, 1, 7600 + c);
    inject(&p, C[c].at, C[c].x);
    snprintf(tag, sizeof tag, "block scale: %s kv %s, %s = %g", sh->name, DT[C[c].dt], AT[C[c].at], C[c].x);
    const int *P = C[c].at == AT_K ? POS_K : POS_V;
    size_t n = (size_t)sh->B * sh->Hq * sh->D, nl = (size_t)sh->B * sh->Hq;
    size_t bh = (size_t)(P[0] % sh->B) * sh->Hq + (size_t)(P[1] % sh->Hkv) * (sh->Hq / sh->Hkv);
    double *rout = malloc(n * 8), *rlse = malloc(nl * 8);
    ref_attention(&p.ref, rout, rlse);
    int shown = C[c].at == AT_K ? isnan(rlse[bh]) : !isfinite(rout[bh * sh->D + P[3]]) && isfinite(rlse[bh]);
    t_check(shown, "%s: the reference's head %zu shows the bad scale", tag, bh);
    free(rout); free(rlse);
    each_config(ctx, &p, tag, NULL);
    kp_free(&p);
  }
}

/* Plan, run and compare p with the reference on every ISA and split count; `what`
   then checks the outputs further. */
static void each_config(fd_ctx *ctx, kproblem *p, const char *tag,
                        void (*what)(const kproblem *p, const float *out, const float *lse, const char *name)) {
  const ref_problem *r = &p->ref;
  size_t n = (size_t)r->B * r->Hq * r->D, nl = (size_t)r->B * r->Hq;
  float *out = malloc(n * 4), *lse = malloc(nl * 4);
  double *rout = malloc(n * 8), *rlse = malloc(nl * 8);
  ref_attention(r, rout, rlse);
  for (int isa = FD_ISA_C; isa < FD_ISA_C + FD_ISA_COUNT; isa++) {
    if (!fd_isa_within(isa - 1, fd_ctx_max_isa(ctx))) continue;
    for (int sp = 0; sp < 3; sp++) {
      char name[192];
      snprintf(name, sizeof name, "%s, isa %s, %d splits", tag, isa_name(isa), SPLITS[sp]);
      fd_plan_opts o = { CHUNK, 0, SPLITS[sp], 0, isa };
      if (api_run(ctx, p, &o, out, lse, name)) continue;
      compare_nf(p, out, lse, rout, rlse, name);
      if (what) what(p, out, lse, name);
    }
  }
  free(out); free(lse); free(rout); free(rlse);
}

/* Head (b=0, h=1) is fully masked: out exactly 0 and lse -inf. */
static void head1_empty(const kproblem *p, const float *out, const float *lse, const char *name) {
  int zero = 1;
  for (int d = 0; d < p->ref.D; d++) zero &= out[p->ref.D + d] == 0.0f;
  t_check(zero && lse[1] == -INFINITY, "%s: fully masked head: out 0 (got %g) and lse -inf (got %g)", name,
          out[p->ref.D], lse[1]);
}

/* Every out and lse value finite. */
static void all_finite(const kproblem *p, const float *out, const float *lse, const char *name) {
  const ref_problem *r = &p->ref;
  size_t bad = 0;
  for (size_t i = 0; i < (size_t)r->B * r->Hq * r->D; i++) bad += !isfinite(out[i]);
  for (size_t i = 0; i < (size_t)r->B * r->Hq; i++) bad += !isfinite(lse[i]);
  t_check(bad == 0, "%s: %zu values of out and lse not finite", name, bad);
}

/* -Inf in the mask keeps its meaning: a fully masked head gives 0 and -inf even
   when its keys' V hold NaN or Inf; a masked key's NaN V still poisons its column
   (0 x NaN, as IEEE, the reference and PyTorch give); keys past cur_pos are
   never read, whatever they hold. */
static void masking(fd_ctx *ctx) {
  kproblem p;
  make_problem(&p, &SHAPES[0], 0, 1, 7100);
  for (int i = 0; i < S_LEN; i++) p.mask[1 * S_LEN + i] = -INFINITY;       /* (b0, h1): all masked */
  p.vf[ref_kv_offset(&p.ref, 0, 0, 33) + 2] = NAN;                          /* V of its kv head */
  p.vf[ref_kv_offset(&p.ref, 0, 0, 35) + 4] = INFINITY;
  kp_sync(&p);
  each_config(ctx, &p, "masking: fully masked head, NaN and Inf V", head1_empty);
  kp_free(&p);
  make_problem(&p, &SHAPES[0], 0, 1, 7101);
  for (int h = 0; h < 8; h++) p.mask[(size_t)(8 + h) * S_LEN + 3] = -INFINITY;     /* b1, key 3 masked */
  p.vf[ref_kv_offset(&p.ref, 1, 1, 3) + 6] = NAN;
  kp_sync(&p);
  each_config(ctx, &p, "masking: masked key with NaN V", NULL);
  kp_free(&p);
  kp_init(&p, 2, 8, 2, 64, S_LEN, 0, 0, 0, 0, 0, 7102);                  /* causal */
  p.cur_pos[0] = 20; p.cur_pos[1] = 5;
  for (int j = 0; j < 2; j++)
    for (int key = 21; key < S_LEN; key++) {
      p.kf[ref_kv_offset(&p.ref, 0, j, key)] = NAN;
      p.vf[ref_kv_offset(&p.ref, 0, j, key) + 1] = INFINITY;
    }
  kp_sync(&p);
  each_config(ctx, &p, "causal: NaN and Inf past cur_pos are not read", all_finite);
  kp_free(&p);
}

/* V values near FLT_MAX (f32 KV): the weighted mean is finite, so out is the
   reference's finite value (the f32 accumulation must not overflow), the same
   for every split count; all the same sign and of random signs. */
static void huge_values(fd_ctx *ctx) {
  for (int sign = 0; sign < 2; sign++) {
    kproblem p;
    make_problem(&p, &SHAPES[0], 0, 2, 7200 + sign);
    uint64_t st = 99;
    for (size_t i = 0; i < (size_t)2 * 2 * S_LEN * 64; i++)
      p.vf[i] = sign ? t_rand(&st, -1, 1) * 3.4e38f : t_rand(&st, 3.0e38f, 3.4e38f);
    kp_sync(&p);
    each_config(ctx, &p, sign ? "V of random sign up to 3.4e38" : "V in 3e38..3.4e38", all_finite);
    kp_free(&p);
  }
}

/* The head-lane tile's lazy rescale (gen/simd.lua GROW_SLACK): a mask ramp
   raises every head's scores 0.04 a key, so each chunk's max grows by about
   0.64, within the slack, and the records keep their m as the exp base while
   the weights exceed 2^-P_SHIFT; V near FLT_MAX, so the accumulators carry
   the largest values they can. out is the reference's, every isa and split. */
static void rising_scores(fd_ctx *ctx) {
  const nf_shape *s = &SHAPES[2];
  kproblem p;
  make_problem(&p, s, 0, 1, 7300);
  for (int bh = 0; bh < s->B * s->Hq; bh++)
    for (int key = 0; key < S_LEN; key++) p.mask[(size_t)bh * S_LEN + key] = 0.04f * (float)key;
  uint64_t st = 98;
  for (size_t i = 0; i < (size_t)s->B * s->Hkv * S_LEN * s->D; i++) p.vf[i] = t_rand(&st, 3.0e38f, 3.4e38f);
  kp_sync(&p);
  each_config(ctx, &p, "head-lane, scores rising within the rescale slack, V in 3e38..3.4e38", all_finite);
  kp_free(&p);
}

/* ---- no subnormal sums ---- */

#define MXCSR_DE 0x02                /* an operand was subnormal */
#define MXCSR_UE 0x10                /* a result underflowed (tiny and inexact) */
#define MXCSR_FLAGS 0x3f

/* Run p (f32, B 1) with softcap on a one-thread context, so the kernel runs
   in this thread, on isa and splits; out within the reference's tolerance,
   and the MXCSR flags the run raised (the sticky flags cleared before it). */
static unsigned flags_of_run(fd_ctx *ctx1, kproblem *p, float softcap, int isa, int splits, const char *name) {
  const ref_problem *r = &p->ref;
  size_t n = (size_t)r->B * r->Hq * r->D;
  fd_shape s = { r->B, r->Hq, r->Hkv, r->D, r->S, FD_F32, FD_F32, FD_F32, (fd_mask_mode)r->mask_mode, FD_BHSD, 0 };
  s.softcap = softcap;
  p->ref.softcap = softcap;
  float *out = calloc(n, sizeof *out), lse[64];
  double *rout = malloc(n * sizeof *rout), rlse[64];
  fd_args a = { p->q, p->k, p->v, p->cur_pos, p->mask, NULL, NULL, NULL, 0, out, lse };
  fd_plan *plan = NULL;
  unsigned raised = 0;
  if (t_check(fd_plan_create_opts(ctx1, &s, &(fd_plan_opts){ .isa = isa, .splits = splits }, &plan) == 0,
              "%s: plan: %s", name, fd_errmsg(ctx1))) {
    _mm_setcsr(_mm_getcsr() & ~MXCSR_FLAGS);
    int rc = fd_run(plan, &a);
    raised = _mm_getcsr() & MXCSR_FLAGS;
    t_check(rc == 0, "%s: run: %s", name, fd_errmsg(ctx1));
    fd_plan_destroy(plan);
    ref_attention(&p->ref, rout, rlse);
    kp_error e = kp_errors(p, out, lse, rout, rlse);
    t_check(!e.nan && e.out <= t_tolerance(p), "%s: error %.3g of the largest |output|", name, e.out);
  }
  free(out); free(rout);
  return raised;
}

/* Scores spanning far more than the cutoff P_MIN_X (-40): an ALiBi-like ramp
   in the mask (key i of S gains -(S - 1 - i), so each chunk's early keys
   weigh least and every chunk raises the max) and softcap 50 over scores of
   up to +-300 (weights down to e^-100). Weights and grown-max factors below
   e^-40 are 0, so no sum in P.V or the rescale is subnormal: the run raises
   neither the underflow nor the subnormal-operand flag (each subnormal result
   costs Intel cores a microcode assist), on every isa, with and without splits. */
static void no_subnormal_sums(void) {
  fd_ctx *ctx1 = fd_create(&(fd_config){ .threads = 1 });
  if (!t_check(ctx1 != NULL, "one-thread context: %s", fd_errmsg(NULL))) return;
  for (int c = 0; c < 2; c++) {
    kproblem p;
    kp_init(&p, 1, 4, 1, 64, 512, FD_F32, FD_F32, FD_F32, c ? FD_CAUSAL : FD_MASK, FD_BHSD, 7300 + c);
    if (c) {
      p.cur_pos[0] = 511;
      for (size_t i = 0; i < (size_t)4 * 64; i++) p.qf[i] *= 40.0f;
    } else {
      for (int h = 0; h < 4; h++)
        for (int i = 0; i < 512; i++) p.mask[h * 512 + i] = -(float)(511 - i);
    }
    kp_sync(&p);
    for (int isa = FD_ISA_C; isa < FD_ISA_C + FD_ISA_COUNT; isa++) {
      if (!fd_isa_within(isa - 1, fd_ctx_max_isa(ctx1))) continue;
      for (int splits = 1; splits <= 3; splits += 2) {
        char name[160];
        snprintf(name, sizeof name, "%s, isa %s, splits %d", c ? "softcap 50 over scores to +-300" : "mask ramp -511..0",
                 isa_name(isa), splits);
        unsigned raised = flags_of_run(ctx1, &p, c ? 50.0f : 0.0f, isa, splits, name);
        t_check(!(raised & (MXCSR_UE | MXCSR_DE)), "%s: no subnormal sums (MXCSR flags raised 0x%02x: underflow %d, "
                "subnormal operand %d)", name, raised, !!(raised & MXCSR_UE), !!(raised & MXCSR_DE));
      }
    }
    kp_free(&p);
  }
  fd_destroy(ctx1);
}

/* ---- fd_config.check_inputs ---- */

/* A refused run of p with a sliding window (window, sinks; 0: none): code
   FD_EINVAL, message msg, out and lse untouched; msg NULL: accepted. */
static void refused_window(fd_ctx *ctx, const kproblem *p, int window, int sinks, const char *msg, const char *name) {
  const ref_problem *r = &p->ref;
  size_t nb = (size_t)r->B * r->Hq * r->D * t_dtype_size(p->out_dtype), nl = (size_t)r->B * r->Hq * 4;
  fd_shape s = { r->B, r->Hq, r->Hkv, r->D, r->S, (fd_dtype)p->q_dtype, (fd_dtype)p->kv_dtype,
                 (fd_dtype)p->out_dtype, (fd_mask_mode)r->mask_mode, (fd_layout)r->layout, 0 };
  s.window = window;
  s.sink_tokens = sinks;
  unsigned char *out = malloc(nb), *lse = malloc(nl);
  memset(out, 0xa5, nb); memset(lse, 0xa5, nl);
  fd_args a = { p->q, p->k, p->v, p->cur_pos, p->mask, p->k_scale, p->v_scale, NULL, 0, out, (float *)lse };
  fd_plan *plan;
  if (!t_check(fd_plan_create(ctx, &s, &plan) == 0, "%s: plan: %s", name, fd_errmsg(ctx))) { free(out); free(lse); return; }
  int rc = fd_run(plan, &a), untouched = 1;
  const char *got = rc ? fd_errmsg(ctx) : "(accepted)";
  for (size_t i = 0; i < nb; i++) untouched &= out[i] == 0xa5;
  for (size_t i = 0; i < nl; i++) untouched &= lse[i] == 0xa5;
  if (!msg) t_check(rc == 0, "%s: accepted (got %d: %s)", name, rc, got);
  else t_check(rc == FD_EINVAL && !strcmp(got, msg) && untouched, "%s: want FD_EINVAL \"%s\", got %d \"%s\"%s", name,
               msg, rc, got, untouched ? "" : ", out or lse written");
  fd_plan_destroy(plan);
  free(out); free(lse);
}

/* A refused run: code FD_EINVAL, message msg, out and lse untouched. */
static void refused(fd_ctx *ctx, const kproblem *p, const char *msg, const char *name) {
  refused_window(ctx, p, 0, 0, msg, name);
}

/* check_inputs with a sliding window of 8 keys and 2 sinks (causal BHSD f32,
   row 1 at position 39: it reads keys 0..1 and 32..39): non-finite K and V
   outside them pass (an engine may have freed those keys), inside them they
   are named; the same keys without a window, or with a wider window or more
   sinks, are refused. */
static void check_inputs_window(fd_ctx *ctx) {
  kproblem p;
  kp_init(&p, 2, 8, 2, 64, S_LEN, 0, 0, 0, 0, 0, 7600);                   /* causal, f32 K/V, BHSD */
  p.cur_pos[0] = 5; p.cur_pos[1] = 39;
  p.kf[ref_kv_offset(&p.ref, 1, 0, 20) + 2] = NAN;                        /* between the sinks and the window */
  p.vf[ref_kv_offset(&p.ref, 1, 1, 31) + 0] = INFINITY;                   /* just below the window */
  p.kf[ref_kv_offset(&p.ref, 1, 1, 2) + 9] = -INFINITY;                   /* just past the sinks */
  kp_sync(&p);
  refused_window(ctx, &p, 8, 2, NULL, "check_inputs: window 8 + 2 sinks: non-finite keys outside them pass");
  refused_window(ctx, &p, 0, 0, "args.k[b=1, kv_head=0, key=20, d=2] is NaN", "check_inputs: the same keys, no window");
  refused_window(ctx, &p, 9, 0, "args.v[b=1, kv_head=1, key=31, d=0] is +Inf",
                 "check_inputs: window 9 reaches key 31 (keys 2 and 20 not read)");
  refused_window(ctx, &p, 8, 3, "args.k[b=1, kv_head=1, key=2, d=9] is -Inf", "check_inputs: 3 sinks reach key 2");
  p.vf[ref_kv_offset(&p.ref, 1, 1, 1) + 5] = -INFINITY;                   /* a sink */
  p.kf[ref_kv_offset(&p.ref, 1, 0, 33) + 7] = INFINITY;                   /* in the window */
  kp_sync(&p);
  refused_window(ctx, &p, 8, 2, "args.k[b=1, kv_head=0, key=33, d=7] is +Inf", "check_inputs: window: K before V");
  p.kf[ref_kv_offset(&p.ref, 1, 0, 33) + 7] = 1;
  kp_sync(&p);
  refused_window(ctx, &p, 8, 2, "args.v[b=1, kv_head=1, key=1, d=5] is -Inf", "check_inputs: window: a sink's V is read");
  kp_free(&p);
}

/* One FD_NEW_KV run of p (q_len 1, causal) with k_new / v_new [B, 1, Hkv, D]
   f32 and a window (0: none): FD_EINVAL with msg and out untouched, or
   accepted (msg NULL). */
static void new_kv_run(fd_ctx *ctx, const kproblem *p, const float *kn, const float *vn, int window, const char *msg,
                       const char *name) {
  const ref_problem *r = &p->ref;
  size_t nb = (size_t)r->B * r->Hq * r->D * 4;
  fd_shape s = { r->B, r->Hq, r->Hkv, r->D, r->S, FD_F32, FD_F32, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  s.features = FD_NEW_KV;
  s.window = window;
  unsigned char *out = malloc(nb);
  memset(out, 0xa5, nb);
  fd_args a = { p->q, p->k, p->v, p->cur_pos, NULL, NULL, NULL, NULL, 0, out, NULL };
  a.k_new = kn;
  a.v_new = vn;
  fd_plan *plan = NULL;
  int rc = fd_plan_create(ctx, &s, &plan), untouched = 1;
  if (!rc) rc = fd_run(plan, &a);
  const char *got = rc ? fd_errmsg(ctx) : "(accepted)";
  for (size_t i = 0; i < nb; i++) untouched &= out[i] == 0xa5;
  if (!msg) t_check(rc == 0, "%s: accepted (got %d: %s)", name, rc, got);
  else t_check(rc == FD_EINVAL && !strcmp(got, msg) && untouched, "%s: want FD_EINVAL \"%s\", got %d \"%s\"%s", name,
               msg, rc, got, untouched ? "" : ", out written");
  fd_plan_destroy(plan);
  free(out);
}

/* check_inputs reads FD_NEW_KV's k_new and v_new after the cache (q_len 1:
   one new key per row and kv head), with and without a window. */
static void check_inputs_new_kv(fd_ctx *ctx) {
  kproblem p;
  kp_init(&p, 2, 8, 2, 64, S_LEN, 0, 0, 0, 0, 0, 7700);                   /* causal f32 BHSD */
  p.cur_pos[0] = 12; p.cur_pos[1] = S_LEN;                                /* 12 cached keys; a full cache */
  size_t n = (size_t)2 * 2 * 64;
  float *kn = calloc(n, sizeof(float)), *vn = calloc(n, sizeof(float));
  new_kv_run(ctx, &p, kn, vn, 0, NULL, "check_inputs: FD_NEW_KV, finite k_new / v_new");
  vn[(1 * 2 + 1) * 64 + 3] = NAN;
  new_kv_run(ctx, &p, kn, vn, 0, "args.v_new[b=1, token=0, kv_head=1, d=3] is NaN", "check_inputs: a NaN in v_new");
  kn[(0 * 2 + 1) * 64 + 60] = -INFINITY;
  new_kv_run(ctx, &p, kn, vn, 5, "args.k_new[b=0, token=0, kv_head=1, d=60] is -Inf",
             "check_inputs: k_new before v_new, window 5");
  p.kf[ref_kv_offset(&p.ref, 1, 0, 3) + 1] = NAN;                         /* a cached key outside a window of 5 */
  kp_sync(&p);
  new_kv_run(ctx, &p, kn, vn, 5, "args.k_new[b=0, token=0, kv_head=1, d=60] is -Inf",
             "check_inputs: FD_NEW_KV, window 5: cached key 3 not read");
  new_kv_run(ctx, &p, kn, vn, 0, "args.k[b=1, kv_head=0, key=3, d=1] is NaN", "check_inputs: the cache before k_new");
  free(kn); free(vn);
  kp_free(&p);
}

/* check_inputs refuses each kind of non-finite input with the element named;
   -inf in the mask, NaN past cur_pos and finite values pass. */
static void check_inputs(void) {
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2, .check_inputs = 1 });
  if (!t_check(ctx != NULL, "check_inputs context: %s", fd_errmsg(NULL))) return;
  static const struct { int dt, mode, at; float x; const char *msg; } C[] = {
    { 0, 1, AT_Q, NAN, "args.q[b=0, head=1, d=3] is NaN" },
    { 1, 1, AT_K, INFINITY, "args.k[b=1, kv_head=0, key=17, d=5] is +Inf" },
    { 2, 1, AT_K, -INFINITY, "args.k[b=1, kv_head=0, key=17, d=5] is -Inf" },
    { 0, 1, AT_V, NAN, "args.v[b=1, kv_head=1, key=9, d=7] is NaN" },
    { 2, 1, AT_V, INFINITY, "args.v[b=1, kv_head=1, key=9, d=7] is +Inf" },
    { 4, 1, AT_K, NAN, "args.k[b=1, kv_head=0, key=17, d=5] is NaN" },
    { 4, 2, AT_KSCALE, INFINITY, "args.k_scale[b=1, kv_head=0, key=17] is +Inf" },
    { 3, 2, AT_VSCALE, NAN, "args.v_scale[b=1, kv_head=1, key=9] is NaN" },
    { 5, 1, AT_K, -INFINITY, "args.k[b=1, kv_head=0, key=17, d=5] is -Inf" },
    { 5, 1, AT_V, NAN, "args.v[b=1, kv_head=1, key=9, d=7] is NaN" },
    { 5, 2, AT_V, INFINITY, "args.v[b=1, kv_head=1, key=9, d=7] is +Inf" },
    { 5, 2, AT_KSCALE, NAN, "args.k_scale[b=1, kv_head=0, key=17] is NaN" },
    { 0, 1, AT_MASK, NAN, "args.mask[b=0, head=5, key=20] is NaN" },
    { 0, 1, AT_MASK, INFINITY, "args.mask[b=0, head=5, key=20] is +Inf" },
    { 0, 1, AT_MASK, -INFINITY, NULL },
    { 1, 2, AT_Q, -INFINITY, "args.q[b=0, head=1, d=3] is -Inf" },
    { FD_Q8_0, 1, AT_K, INFINITY, "args.k[b=1, kv_head=0, key=17, d=0..31]: the block's q8_0 scale is +Inf" },
    { FD_Q4_0, 2, AT_V, NAN, "args.v[b=1, kv_head=1, key=9, d=0..31]: the block's q4_0 scale is NaN" },
    { FD_Q4_0, 1, AT_K, -INFINITY, "args.k[b=1, kv_head=0, key=17, d=0..31]: the block's q4_0 scale is -Inf" },
  };
  for (size_t c = 0; c < sizeof C / sizeof *C; c++) {
    kproblem p;
    char name[128];
    snprintf(name, sizeof name, "check_inputs: kv %s, %s = %g", DT[C[c].dt], AT[C[c].at], C[c].x);
    make_problem(&p, &SHAPES[0], C[c].dt, C[c].mode, 7300 + c);
    refused(ctx, &p, NULL, "check_inputs: finite inputs");
    inject(&p, C[c].at, C[c].x);
    refused(ctx, &p, C[c].msg, name);
    kp_free(&p);
  }
  /* the first bad element in index order (q, then K, V, scales, mask), and only keys that are read */
  kproblem p;
  kp_init(&p, 2, 8, 2, 64, S_LEN, 0, 0, 0, 0, 1, 7400);                   /* causal, BSHD */
  p.cur_pos[0] = 10; p.cur_pos[1] = 39;
  p.kf[ref_kv_offset(&p.ref, 0, 1, 11) + 4] = NAN;                        /* past cur_pos[0]: not read */
  p.vf[ref_kv_offset(&p.ref, 1, 1, 39) + 63] = -INFINITY;
  p.vf[ref_kv_offset(&p.ref, 1, 0, 39) + 1] = NAN;
  kp_sync(&p);
  refused(ctx, &p, "args.v[b=1, kv_head=0, key=39, d=1] is NaN", "check_inputs: first bad V, BSHD, past cur_pos skipped");
  p.kf[ref_kv_offset(&p.ref, 0, 1, 10) + 4] = INFINITY;
  kp_sync(&p);
  refused(ctx, &p, "args.k[b=0, kv_head=1, key=10, d=4] is +Inf", "check_inputs: K before V");
  kp_free(&p);
  check_inputs_window(ctx);
  check_inputs_new_kv(ctx);
  fd_destroy(ctx);
  /* off by default: the same input runs and gives NaN */
  ctx = fd_create(&(fd_config){ .threads = 1 });
  make_problem(&p, &SHAPES[0], 0, 1, 7500);
  inject(&p, AT_Q, NAN);
  refused(ctx, &p, NULL, "check_inputs off by default");
  kp_free(&p);
  fd_destroy(ctx);
}

int main(void) {
  fd_ctx *tcc = fd_create(&(fd_config){ .threads = 2 });
  if (!t_check(tcc != NULL, "tcc context: %s", fd_errmsg(NULL))) return t_done();
  char tmp[] = "/tmp/fd_nonfinite_XXXXXX", *dir = getenv("FD_TEST_CACHE_DIR");
  if (!dir) dir = mkdtemp(tmp);
  fd_ctx *cc = fd_create(&(fd_config){ .threads = 2, .backend = FD_BACKEND_CC, .cache_dir = dir });
  t_check(cc && fd_ctx_backend(cc) == FD_BACKEND_CC, "cc backend in use (a compiler is installed): %s",
          cc ? "fell back to tcc" : fd_errmsg(NULL));
  f32_matrix(tcc, 3, "tcc");
  if (cc) f32_matrix(cc, 1, "cc");
  dtype_cases(tcc);
  block_cases(tcc);
  masking(tcc);
  huge_values(tcc);
  if (cc) huge_values(cc);
  rising_scores(tcc);
  if (cc) rising_scores(cc);
  no_subnormal_sums();
  check_inputs();
  fd_destroy(tcc);
  fd_destroy(cc);
  if (dir == tmp) {                  /* our own cache directory: its files, then itself */
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) printf("note: could not remove %s\n", tmp);
  }
  kx_cleanup();
  return t_done();
}
