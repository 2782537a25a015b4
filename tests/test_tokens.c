/* Several query tokens per row (fd_shape.q_len 1..16) through the public
   API, against the double-precision reference run once per token: every isa
   this CPU runs, KV dtypes rotated with the q and out dtypes, every mask
   mode, unsplit and 3 splits, group tiles 4 and 16 (direct and head-lane
   kernels), rows whose first token sits at position 0 (it sees one key),
   rows that end at kv_len - 1, and a row in between. Causal: token t of row
   b sits at cur_pos[b] - q_len + 1 + t and sees the keys up to it; mask
   mode: the mask is [B, q_len, Hq, kv_len]. Then the refusals: cur_pos
   below q_len - 1, q_len out of range, out untouched. */
#include "compare.h"
#include "internal.h"
#include "cpu.h"
#include "tcheck.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define B 3
#define HKV 2
#define S_CAP 300

static const int Q_LENS[] = { 1, 2, 3, 4, 7, 16 };
#define N_Q_LENS (int)(sizeof Q_LENS / sizeof Q_LENS[0])

/* The inputs of one case: K/V, positions and a [B, Hq, S_CAP] mask from kp; q
   [B, q_len, Hq, D] from qp (a problem of B x q_len rows); mask [B, q_len, Hq, S_CAP]. */
typedef struct tokens { kproblem kp, qp; int q_len, window, sinks, alibi; float *mask; } tokens;

/* Build a case: K/V of kv dtype kd, q of qd, out od, mode; positions: row 0
   ends at S_CAP - 1, row 1 starts at 0 (its last token at q_len - 1), row 2 between. */
static void make(tokens *c, int Hq, int D, int qd, int kd, int od, int mode, int q_len, uint64_t seed) {
  c->q_len = q_len;
  c->window = c->sinks = c->alibi = 0;
  kp_init(&c->kp, B, Hq, HKV, D, S_CAP, qd, kd, od, mode, FD_BHSD, seed);
  kp_init(&c->qp, B * q_len, Hq, HKV, D, 1, qd, kd, od, FD_FULL, FD_BHSD, seed + 1);
  c->kp.cur_pos[0] = S_CAP - 1;
  c->kp.cur_pos[1] = q_len - 1;
  c->kp.cur_pos[2] = q_len - 1 + (S_CAP - q_len) / 2;
  c->mask = NULL;
  if (mode != FD_MASK) return;
  size_t row = (size_t)Hq * S_CAP;
  c->mask = malloc(sizeof(float) * B * q_len * row);
  for (int b = 0; b < B; b++)               /* token t: the kp mask of heads rotated by t */
    for (int t = 0; t < q_len; t++)
      for (int h = 0; h < Hq; h++)
        memcpy(c->mask + ((size_t)(b * q_len + t) * Hq + h) * S_CAP, c->kp.mask + ((size_t)b * Hq + (h + t) % Hq) * S_CAP,
               sizeof(float) * S_CAP);
}

static void unmake(tokens *c) { kp_free(&c->kp); kp_free(&c->qp); free(c->mask); }

/* The ALiBi slope of head h of Hq (the ALiBi paper's 2^(-8(h+1)/Hq)). */
static float alibi_slope(int h, int Hq) { return (float)exp2(-8.0 * (h + 1) / Hq); }

/* The mask [B, Hq, S] of a causal case with a window or ALiBi: where position
   pos[b] sees key k (k <= pos, and with a window k > pos - window or
   k < sinks) 0, or ALiBi's slope x (k - pos) rounded to float as the kernels
   round it; -inf elsewhere. */
static float *window_mask(const tokens *c, const ref_problem *r, const int32_t *pos) {
  float *m = malloc(sizeof(float) * (size_t)B * r->Hq * r->S);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < r->Hq; h++)
      for (int64_t k = 0; k < r->S; k++) {
        int seen = k <= pos[b] && (!c->window || k > pos[b] - c->window || k < c->sinks);
        float bias = c->alibi ? (float)((double)alibi_slope(h, r->Hq) * (double)(k - pos[b])) : 0.0f;
        m[((size_t)b * r->Hq + h) * r->S + k] = seen ? bias : -INFINITY;
      }
  return m;
}

/* The reference of token t: out [B, Hq, D] and lse [B, Hq] in double. */
static void reference(const void *cv, int t, double *rout, double *rlse) {
  const tokens *c = cv;
  const ref_problem *r = &c->kp.ref;
  size_t qrow = (size_t)r->Hq * r->D, mrow = (size_t)r->Hq * S_CAP;
  float *q = malloc(sizeof(float) * B * qrow), *mask = c->mask ? malloc(sizeof(float) * B * mrow) : NULL;
  int32_t pos[B];
  for (int b = 0; b < B; b++) {
    memcpy(q + b * qrow, c->qp.qf + (size_t)(b * c->q_len + t) * qrow, sizeof(float) * qrow);
    if (mask) memcpy(mask + b * mrow, c->mask + (size_t)(b * c->q_len + t) * mrow, sizeof(float) * mrow);
    pos[b] = c->kp.cur_pos[b] - c->q_len + 1 + t;
  }
  ref_problem rt = *r;
  rt.q = q;
  rt.mask = mask;
  rt.cur_pos = pos;
  if (c->window || c->alibi) {              /* the window's keys and ALiBi's bias by an additive mask */
    free(mask);
    rt.mask = mask = window_mask(c, r, pos);
    rt.mask_mode = FD_MASK;
  }
  ref_attention(&rt, rout, rlse);
  free(q); free(mask);
}

/* Plan with opts and run case c into out and lse; FD_OK or the code. */
static int plan_run(fd_ctx *ctx, const tokens *c, const fd_plan_opts *o, void *out, float *lse) {
  const ref_problem *r = &c->kp.ref;
  fd_shape s = { B, r->Hq, HKV, r->D, S_CAP, c->kp.q_dtype, c->kp.kv_dtype, c->kp.out_dtype, r->mask_mode, FD_BHSD, 0 };
  s.q_len = c->q_len;
  fd_args a = { c->qp.q, c->kp.k, c->kp.v, c->kp.cur_pos, c->mask, c->kp.k_scale, c->kp.v_scale, NULL, 0, out, lse };
  return t_plan_run(ctx, &s, o, &a);
}

/* Check every token of a run against its reference (tests/compare.c). */
static void compare_tokens(const tokens *c, const void *out, const float *lse, const char *name) {
  t_compare_tokens(&c->kp, c->q_len, out, lse, reference, c, name);
}

/* One case against the reference. */
static void run_case(fd_ctx *ctx, int isa, int kd, int mode, int q_len, int splits, int idx) {
  int G = idx % 3 == 2 && !fd_dtype_quant[kd] ? 16 : 4, tile = G == 16 ? 16 : 4, D = idx % 2 ? 128 : 64;
  int chunk = idx % 2 ? 96 : 64, qd = idx % 3, od = idx / 3 % 3;
  if (D % fd_isa_table[isa].width || tile > fd_isa_table[isa].max_tile) return;
  char name[256];
  snprintf(name, sizeof name, "isa%d kv%s q%s out%s %s q_len %d splits%d chunk%d G%d D%d", isa, fd_dtype_names[kd],
           fd_dtype_names[qd], fd_dtype_names[od], fd_mask_mode_names[mode], q_len, splits, chunk, G, D);
  tokens c;
  make(&c, HKV * G, D, qd, kd, od, mode, q_len, 500 + (uint64_t)idx);
  size_t n = (size_t)B * q_len * HKV * G * D;
  void *out = malloc(n * t_dtype_size(od));
  float *lse = malloc(sizeof(float) * B * q_len * HKV * G);
  fd_plan_opts o = { chunk, tile, splits, 2, isa + 1 };
  int rc = plan_run(ctx, &c, &o, out, lse);
  if (t_check(rc == 0, "%s: run: %s", name, fd_errmsg(ctx))) compare_tokens(&c, out, lse, name);
  free(out); free(lse);
  unmake(&c);
}

/* Every isa, KV dtype, mask mode, token count and split setting. */
static void sweep(void) {
  int idx = 0;
  for (int isa = 0; isa < FD_ISA_COUNT; isa++) if (fd_cpu_has_isa(isa)) {
    fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2, .isa_limit = isa + 1 });
    for (int kd = 0; kd < FD_DTYPE_COUNT; kd++)
      for (int mode = 0; mode < FD_MASK_MODE_COUNT; mode++)
        for (int qi = 0; qi < N_Q_LENS; qi++)
          for (int sp = 0; sp < 2; sp++) run_case(ctx, isa, kd, mode, Q_LENS[qi], sp ? 3 : 1, idx++);
    fd_destroy(ctx);
  }
}

/* FD_NEW_KV: the cache holds C = cur_pos - q_len + 1 keys, the q_len new
   tokens' K/V come in k_new/v_new [B, q_len, Hkv, D]; token t sees the C
   cached keys and new keys 0..t. Checked per token against the reference
   over each row's concatenation [cache[0..C), new[0..q_len)]: C = 0 (empty
   cache: only the new tokens), C in the middle, C = S_CAP (a full cache).
   With a sliding window (window, sinks; 0: none) token t at position C + t
   sees the keys from C + t - window + 1 and the sinks, cached or new: the
   reference masks the concatenation. Every other case adds ALiBi (the
   standard slopes): key k of the concatenation sits at position k. */
static void new_kv_case(fd_ctx *ctx, int isa, int kd, int q_len, int splits, int window, int sinks, int idx) {
  int G = 4, D = idx % 2 ? 128 : 64, Hq = HKV * G, qd = idx % 3, od = idx / 3 % 3;
  if (D % fd_isa_table[isa].width) return;
  char name[200];
  int alibi = idx / 2 % 2;
  snprintf(name, sizeof name, "FD_NEW_KV isa%d kv%s q_len %d splits%d D%d window %d sinks %d%s", isa, fd_dtype_names[kd],
           q_len, splits, D, window, sinks, alibi ? " alibi" : "");
  tokens c;
  make(&c, Hq, D, qd, kd, od, FD_CAUSAL, q_len, 900 + (uint64_t)idx);
  c.window = window;
  c.sinks = sinks;
  c.alibi = alibi;
  float slopes[64];
  for (int h = 0; h < Hq; h++) slopes[h] = alibi_slope(h, Hq);
  kproblem nk;                                  /* k_new, v_new: [B, q_len, Hkv, D] (bshd rows of q_len keys) */
  kp_init(&nk, B, Hq, HKV, D, q_len, qd, kd, od, FD_FULL, FD_BSHD, 950 + (uint64_t)idx);
  int32_t *pos = c.kp.cur_pos;
  pos[0] = q_len - 1;                           /* C = 0 */
  pos[1] = S_CAP + q_len - 1;                       /* C = S_CAP: a full cache */
  pos[2] = S_CAP / 2 + q_len - 1;
  size_t n = (size_t)B * q_len * Hq * D;
  void *out = malloc(n * t_dtype_size(od));
  float *lse = malloc(sizeof(float) * B * q_len * Hq);
  fd_shape s = { B, Hq, HKV, D, S_CAP, qd, kd, od, FD_CAUSAL, FD_BHSD, 0 };
  s.q_len = q_len;
  s.features = FD_NEW_KV;
  s.window = window;
  s.sink_tokens = sinks;
  s.features |= alibi ? FD_ALIBI : 0;
  fd_args a = { c.qp.q, c.kp.k, c.kp.v, pos, NULL, NULL, NULL, NULL, 0, out, lse };
  a.alibi_slopes = slopes;
  a.k_new = nk.k;
  a.v_new = nk.v;
  fd_plan *plan = NULL;
  int rc = fd_plan_create_opts(ctx, &s, &(fd_plan_opts){ 64, G, splits, 2, isa + 1 }, &plan);
  if (!rc) rc = fd_run(plan, &a);
  fd_plan_destroy(plan);
  if (t_check(rc == 0, "%s: run: %s", name, fd_errmsg(ctx))) {
    int64_t cat = S_CAP + q_len;                    /* the reference's keys: row b's cache then its new keys */
    float *kc = calloc((size_t)B * HKV * cat * D, sizeof(float)), *vc = calloc((size_t)B * HKV * cat * D, sizeof(float));
    for (int b = 0; b < B; b++)
      for (int j = 0; j < HKV; j++)
        for (int64_t i = 0; i < pos[b] + 1; i++) {
          int64_t C = pos[b] - q_len + 1;
          const float *ks = i < C ? c.kp.kf + (((size_t)b * HKV + j) * S_CAP + i) * D : nk.kf + (((size_t)b * q_len + (i - C)) * HKV + j) * D;
          const float *vs = i < C ? c.kp.vf + (((size_t)b * HKV + j) * S_CAP + i) * D : nk.vf + (((size_t)b * q_len + (i - C)) * HKV + j) * D;
          memcpy(kc + (((size_t)b * HKV + j) * cat + i) * D, ks, sizeof(float) * D);
          memcpy(vc + (((size_t)b * HKV + j) * cat + i) * D, vs, sizeof(float) * D);
        }
    float *kf = c.kp.kf, *vf = c.kp.vf;
    c.kp.ref.k = kc; c.kp.ref.v = vc; c.kp.ref.S = cat;
    compare_tokens(&c, out, lse, name);
    c.kp.ref.k = kf; c.kp.ref.v = vf; c.kp.ref.S = S_CAP;
    free(kc); free(vc);
  }
  free(out); free(lse);
  kp_free(&nk);
  unmake(&c);
}

/* FD_NEW_KV over every isa, KV dtype f32/f16/bf16, q_len 1, 4 and 7, split
   and not; without a window, then (window, sinks): 1 key, 3 keys with 2
   sinks (new keys hidden from later tokens, and sinks past an empty cache),
   6 with 1 sink, 64 with 4 (the window starts in the cache), wider than the
   cache. */
static void new_kv_sweep(void) {
  int idx = 0;
  static const int qlens[] = { 1, 4, 7 }, windows[][2] = { { 0, 0 }, { 1, 0 }, { 3, 2 }, { 6, 1 }, { 64, 4 }, { 1000, 0 } };
  for (int isa = 0; isa < FD_ISA_COUNT; isa++) if (fd_cpu_has_isa(isa)) {
    fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2, .isa_limit = isa + 1 });
    for (int kd = 0; kd <= FD_BF16; kd++)
      for (int qi = 0; qi < 3; qi++)
        for (int wi = 0; wi < 6; wi++)
          for (int sp = 0; sp < 2; sp++)
            new_kv_case(ctx, isa, kd, qlens[qi], sp ? 3 : 1, windows[wi][0], windows[wi][1], idx++);
    fd_destroy(ctx);
  }
}

/* cur_pos below q_len - 1 and q_len out of range are refused, out untouched. */
static void refusals(void) {
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2 });
  tokens c;
  make(&c, 8, 64, FD_F32, FD_F16, FD_F32, FD_CAUSAL, 4, 9);
  size_t n = (size_t)B * 4 * 8 * 64;
  float *out = malloc(n * 4), *lse = malloc(sizeof(float) * B * 4 * 8);
  memset(out, 0x5a, n * 4);
  c.kp.cur_pos[1] = 2;                                   /* token 0 would sit at -1 */
  int rc = plan_run(ctx, &c, &(fd_plan_opts){ 0 }, out, lse), untouched = 1;
  for (size_t i = 0; i < n * 4; i++) untouched &= ((unsigned char *)out)[i] == 0x5a;
  t_check(rc == FD_EINVAL && strstr(fd_errmsg(ctx), "args.cur_pos[1] is 2, outside 3..") && untouched,
          "cur_pos below q_len - 1 refused, out untouched: rc %d, \"%s\"", rc, fd_errmsg(ctx));
  c.kp.cur_pos[1] = 3;
  t_check(plan_run(ctx, &c, &(fd_plan_opts){ 0 }, out, lse) == FD_OK, "cur_pos q_len - 1 accepted: %s", fd_errmsg(ctx));
  static const int bad[] = { -1, 17 };
  for (int i = 0; i < 2; i++) {
    c.q_len = bad[i];
    rc = plan_run(ctx, &c, &(fd_plan_opts){ 0 }, out, lse);
    t_check(rc == FD_EINVAL && strstr(fd_errmsg(ctx), "shape.q_len"), "q_len %d refused naming shape.q_len: rc %d, \"%s\"",
            bad[i], rc, fd_errmsg(ctx));
  }
  c.q_len = 4;
  fd_shape s = { B, 8, HKV, 64, S_CAP, FD_F32, FD_F16, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  s.q_len = 4;
  s.features = FD_NEW_KV;
  fd_args a = { c.qp.q, c.kp.k, c.kp.v, c.kp.cur_pos, NULL, NULL, NULL, NULL, 0, out, lse };
  fd_plan *plan = NULL;
  memset(out, 0x5a, n * 4);
  rc = fd_plan_create(ctx, &s, &plan);
  if (!rc) rc = fd_run(plan, &a);
  untouched = 1;
  for (size_t i = 0; i < n * 4; i++) untouched &= ((unsigned char *)out)[i] == 0x5a;
  t_check(rc == FD_EINVAL && strstr(fd_errmsg(ctx), "args.k_new") && untouched,
          "FD_NEW_KV without k_new refused naming args.k_new, out untouched: rc %d, \"%s\"", rc, fd_errmsg(ctx));
  fd_plan_destroy(plan);
  plan = NULL;
  s.mask_mode = FD_FULL;
  rc = fd_plan_create(ctx, &s, &plan);
  t_check(rc == FD_EINVAL && strstr(fd_errmsg(ctx), "FD_NEW_KV"), "FD_NEW_KV without positions (full mode) refused: \"%s\"",
          fd_errmsg(ctx));
  fd_plan_destroy(plan);
  s.mask_mode = FD_CAUSAL;
  for (int k = 0; k < t_quant_count(); k++) {      /* k_new / v_new carry no row scales */
    plan = NULL;
    s.kv_dtype = (fd_dtype)t_quant_dtype(k);
    rc = fd_plan_create(ctx, &s, &plan);
    t_check(rc == FD_EINVAL && strstr(fd_errmsg(ctx), "shape.features sets FD_NEW_KV with kv_dtype") && !plan,
            "FD_NEW_KV with kv_dtype %s refused naming shape.features: \"%s\"", fd_dtype_names[s.kv_dtype],
            fd_errmsg(ctx));
    fd_plan_destroy(plan);
  }
  free(out); free(lse);
  unmake(&c);
  fd_destroy(ctx);
}

int main(void) {
  sweep();
  new_kv_sweep();
  refusals();
  return t_done();
}
