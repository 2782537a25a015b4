/* Per-channel K scales (FD_K_PER_CHANNEL, KIVI / IFA antiquant mode 2) and
   beam-search cache indirection (FD_BEAMS, TensorRT-LLM) through the public
   API, against the double-precision reference (tools/fdgen/ref.c, which reads
   key i of row b from row beam_src[b * S + i]) run once per query token with
   an additive mask that leaves exactly the keys the token sees.
   Per-channel cases: int8, fp8 e4m3 and fp8 e5m2 K whose channels are
   scaled by factors from 1/30 to 33 (1000x apart) before they are quantized
   with one scale per (row, kv head, channel); V keeps one scale per row.
   Beam cases: every KV dtype (q8_0 and q4_0 blocks too), beam_src
   patterns: each row its own (identity), every row reading the next row,
   runs of 1 to 40 keys from random rows (the row itself among them), and a
   new row every key; with per-channel K (each key its source row's channel
   scales) and with FD_NEW_KV (the new keys the row's own: the reference's
   new_from). Per-channel K also with FD_SHARED_KV (every row attends row
   0's sequence) in mask and full mode. Each for every isa this CPU runs, unsplit and 3 splits, causal with
   q_len 1 and 3 (and a sliding window with sinks), mask and full modes, dense
   (BHSD) and the paged layout (pages of the rows interleaved in the pool).
   Then the refusals: a sentence naming the field, out untouched; and
   config.check_inputs through beam_src (the rows keys read). */
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
#define S_CAP 200
#define PAGE 16
#define PER_ROW ((S_CAP + PAGE - 1) / PAGE)

/* One case: K/V and positions from kp, q [NB, q_len, Hq, D] from qp; kch the
   per-channel K scales [NB, HKV, D] (kpc), src the beam_src [NB, S_CAP] (beams). */
typedef struct bcase {
  kproblem kp, qp;
  int q_len, mode, window, sinks, pattern, shared;
  float *kch;
  int32_t *src;
  /* FD_NEW_KV: k_new/v_new [NB, q_len, HKV, D] in nk; the reference's cat
     keys per row: the caches kc/vc, the new keys knc/vnc at their positions
     from new_from[b] on (tools/fdgen/ref.h), beam_src [NB, cat] */
  int new_kv;
  kproblem nk;
  int64_t cat;
  float *kc, *vc, *knc, *vnc;
  int32_t *src_cat, *new_from;
} bcase;

/* Re-quantize K with one scale per (row, kv head, channel) (kx_per_channel). */
static void per_channel(bcase *c) {
  c->kch = malloc(sizeof(float) * NB * HKV * c->kp.ref.D);
  kx_per_channel(&c->kp, NB * HKV, S_CAP, c->kch);
}

/* beam_src of pattern: 0 each row its own, 1 the next row's, 2 runs of 1..40
   keys from random rows, 3 a new row every key. */
static void beam_pattern(bcase *c, uint64_t seed) {
  uint64_t st = seed * 31 + 7;
  c->src = malloc(sizeof(int32_t) * NB * S_CAP);
  for (int b = 0; b < NB; b++) {
    int32_t cur = b;
    for (int64_t i = 0, left = 0; i < S_CAP; i++, left--) {
      if (c->pattern == 2 && left <= 0) {
        left = 1 + (int64_t)t_rand(&st, 0, 40);
        cur = (int32_t)t_rand(&st, 0, NB);
      }
      c->src[b * S_CAP + i] = c->pattern == 0 ? b : c->pattern == 1 ? (b + 1) % NB
                              : c->pattern == 2 ? cur : (int32_t)((b + i) % NB);
    }
  }
}

/* Build a case (kpc: per-channel K scales; pattern < 0: no beams). */
static void make(bcase *c, int Hq, int D, int qd, int kd, int od, int mode, int q_len, int window, int sinks, int kpc,
                 int pattern, uint64_t seed) {
  memset(c, 0, sizeof *c);
  c->q_len = q_len; c->mode = mode; c->window = window; c->sinks = sinks; c->pattern = pattern;
  kp_init(&c->kp, NB, Hq, HKV, D, S_CAP, qd, kd, od, mode, FD_BHSD, seed);
  kp_init(&c->qp, NB * q_len, Hq, HKV, D, 1, qd, kd, od, FD_FULL, FD_BHSD, seed + 1);
  c->kp.cur_pos[0] = S_CAP - 1;
  c->kp.cur_pos[1] = q_len - 1;
  c->kp.cur_pos[2] = q_len - 1 + (S_CAP - q_len) / 2;
  if (kpc) per_channel(c);
  if (pattern >= 0) beam_pattern(c, seed);
}

/* FD_NEW_KV (causal): row 0's cache full (C = S_CAP keys), row 1's empty,
   row 2's half full, each followed by its q_len new keys from nk; the
   reference reads the concatenation, the new keys from the row itself. */
static void with_new_kv(bcase *c, uint64_t seed) {
  const ref_problem *r = &c->kp.ref;
  int q_len = c->q_len, D = r->D;
  int32_t *pos = c->kp.cur_pos;
  c->new_kv = 1;
  kp_init(&c->nk, NB, r->Hq, HKV, D, q_len, c->kp.q_dtype, c->kp.kv_dtype, c->kp.out_dtype, FD_FULL, FD_BSHD, seed);
  pos[0] = S_CAP + q_len - 1;
  pos[1] = q_len - 1;
  pos[2] = S_CAP / 2 + q_len - 1;
  c->cat = S_CAP + q_len;
  size_t n = (size_t)NB * HKV * c->cat * D;
  c->kc = calloc(n, sizeof(float));
  c->vc = calloc(n, sizeof(float));
  c->knc = calloc(n, sizeof(float));
  c->vnc = calloc(n, sizeof(float));
  c->src_cat = calloc((size_t)NB * c->cat, sizeof(int32_t));
  c->new_from = malloc(sizeof(int32_t) * NB);
  for (int b = 0; b < NB; b++) {
    int64_t C = pos[b] - q_len + 1;
    c->new_from[b] = (int32_t)C;
    for (int64_t i = 0; i < S_CAP; i++) c->src_cat[b * c->cat + i] = c->src ? c->src[b * S_CAP + i] : b;
    for (int j = 0; j < HKV; j++) {
      for (int64_t i = 0; i < S_CAP; i++) {        /* the cache of row b (the reference follows beam_src) */
        size_t to = (((size_t)b * HKV + j) * c->cat + i) * D, from = (((size_t)b * HKV + j) * S_CAP + i) * D;
        memcpy(c->kc + to, c->kp.kf + from, sizeof(float) * D);
        memcpy(c->vc + to, c->kp.vf + from, sizeof(float) * D);
      }
      for (int t = 0; t < q_len; t++) {             /* new key t at position C + t */
        size_t to = (((size_t)b * HKV + j) * c->cat + C + t) * D, from = (((size_t)b * q_len + t) * HKV + j) * D;
        memcpy(c->knc + to, c->nk.kf + from, sizeof(float) * D);
        memcpy(c->vnc + to, c->nk.vf + from, sizeof(float) * D);
      }
    }
  }
}

/* FD_SHARED_KV: every row's K/V (values, codes and scales) become row 0's,
   so the reference attends the one sequence from every row. */
static void share_row0(bcase *c) {
  kproblem *p = &c->kp;
  const ref_problem *r = &p->ref;
  size_t row = (size_t)HKV * S_CAP * r->D, esz = t_dtype_size(p->kv_dtype), D = (size_t)r->D;
  c->shared = 1;
  for (int b = 1; b < NB; b++) {
    memcpy(p->kf + b * row, p->kf, row * sizeof(float));
    memcpy(p->vf + b * row, p->vf, row * sizeof(float));
    memcpy((char *)p->k + b * row * esz, p->k, row * esz);
    memcpy((char *)p->v + b * row * esz, p->v, row * esz);
    if (p->v_scale) memcpy(p->v_scale + b * row / D, p->v_scale, row / D * sizeof(float));
    if (c->kch) memcpy(c->kch + b * HKV * D, c->kch, HKV * D * sizeof(float));
  }
}

static void unmake(bcase *c) {
  kp_free(&c->kp); kp_free(&c->qp); free(c->kch); free(c->src);
  if (c->new_kv) kp_free(&c->nk);
  free(c->kc); free(c->vc); free(c->knc); free(c->vnc); free(c->src_cat); free(c->new_from);
}

/* The reference of token t (tests/kexec.c kx_token_reference): the cache,
   then with FD_NEW_KV the new keys (the concatenation), through beam_src. */
static void reference(const void *cv, int t, double *rout, double *rlse) {
  const bcase *c = cv;
  ref_problem rt = c->kp.ref;
  if (c->new_kv) {                             /* the concatenation: the cache, then the new keys */
    rt.S = c->cat; rt.k = c->kc; rt.v = c->vc; rt.k_new = c->knc; rt.v_new = c->vnc; rt.new_from = c->new_from;
  }
  rt.beam_src = c->new_kv ? (c->src ? c->src_cat : NULL) : c->src;
  kx_token_reference(rt, c->qp.qf, c->kp.cur_pos, c->q_len, t, c->window, c->sinks, rout, rlse);
}

/* The K/V (and V scales, and per-row K scales without kpc) of c as a pool
   (tests/kexec.h): row b's page i at pool page i * NB + (b + i) % NB (rows
   interleaved), its block table. */
typedef kx_pool pool;

static void make_pool(const bcase *c, pool *pl) {
  kx_pool_alloc(pl, &c->kp, NB * PER_ROW, PAGE, NB * PER_ROW);
  for (int b = 0; b < NB; b++)
    for (int64_t i = 0; i < PER_ROW; i++) {
      int64_t pg = i * NB + (b + i) % NB;
      pl->table[b * PER_ROW + i] = (int32_t)pg;
      kx_pool_copy(pl, &c->kp, b, i, pg, PAGE);
    }
}

/* The case's shape. */
static fd_shape shape_of(const bcase *c, int paged) {
  const ref_problem *r = &c->kp.ref;
  fd_shape s = { NB, r->Hq, HKV, r->D, S_CAP, c->kp.q_dtype, c->kp.kv_dtype, c->kp.out_dtype, c->mode,
                 paged ? FD_PAGED : FD_BHSD, paged ? PAGE : 0 };
  s.q_len = c->q_len;
  s.window = c->window;
  s.sink_tokens = c->sinks;
  s.features = (c->kch ? FD_K_PER_CHANNEL : 0) | (c->src ? FD_BEAMS : 0) | (c->shared ? FD_SHARED_KV : 0)
               | (c->new_kv ? FD_NEW_KV : 0);
  s.pool_pages = paged ? NB * PER_ROW : 0;
  return s;
}

/* The case's arguments (dense, or paged from pl) writing out and lse. */
static fd_args args_of(const bcase *c, const pool *pl, void *out, float *lse) {
  fd_args a = { c->qp.q, pl ? pl->k : c->kp.k, pl ? pl->v : c->kp.v, c->kp.cur_pos, c->kp.mask,
                pl ? pl->ks : c->kp.k_scale, pl ? pl->vs : c->kp.v_scale, pl ? pl->table : NULL, 0, out, lse };
  if (c->kch) a.k_scale = c->kch;
  a.beam_src = c->src;
  if (c->new_kv) { a.k_new = c->nk.k; a.v_new = c->nk.v; }
  return a;
}

/* One case against the reference, dense and paged, on ctx's isa with splits. */
static void run_case(fd_ctx *ctx, int isa, int kd, int mode, int q_len, int kpc, int pattern, int splits, int tile,
                     int shared, int new_kv, int idx) {
  int D = idx % 2 ? 128 : 64, chunk = idx % 2 ? 96 : 64, qd = idx % 3, od = idx / 3 % 3;
  int window = q_len > 1 && idx % 4 == 1 ? 20 : 0, sinks = window ? 2 : 0;
  if (D % fd_isa_table[isa].width || tile > fd_isa_table[isa].max_tile) return;
  bcase c;
  make(&c, HKV * tile, D, qd, kd, od, mode, q_len, window, sinks, kpc, pattern, 700 + (uint64_t)idx);
  if (shared) share_row0(&c);
  if (new_kv) with_new_kv(&c, 800 + (uint64_t)idx);
  size_t n = (size_t)NB * q_len * HKV * tile * D;
  void *out = malloc(n * t_dtype_size(od));
  float *lse = malloc(sizeof(float) * NB * q_len * HKV * tile);
  fd_plan_opts o = { chunk, tile, splits, 2, isa + 1 };
  for (int paged = 0; paged <= 1; paged++) {
    char name[256];
    snprintf(name, sizeof name, "isa%d kv%s q%s out%s %s %s q_len %d window %d%s%s%s beams %d splits%d chunk%d D%d tile%d",
             isa, fd_dtype_names[kd], fd_dtype_names[qd], fd_dtype_names[od], fd_mask_mode_names[mode],
             paged ? "paged" : "bhsd", q_len, window, kpc ? " k per channel" : "", shared ? " shared kv" : "",
             new_kv ? " new kv" : "", pattern, splits, chunk, D, tile);
    pool pl;
    if (paged) make_pool(&c, &pl);
    fd_shape s = shape_of(&c, paged);
    fd_args a = args_of(&c, paged ? &pl : NULL, out, lse);
    int rc = t_plan_run(ctx, &s, &o, &a);
    if (t_check(rc == 0, "%s: run: %s", name, fd_errmsg(ctx)))
      t_compare_tokens(&c.kp, q_len, out, lse, reference, &c, name);
    if (paged) kx_pool_free(&pl);
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

/* Every isa: per-channel K (each quantized dtype; in mask and full mode also
   with FD_SHARED_KV, k_scale [1, Hkv, D]), beams (each KV dtype, block
   dtypes included, the patterns in turn; the per-element non-quantized and
   the block dtypes also with head-lane tiles of 16 heads where the isa holds
   them), beams with per-channel K (each quantized dtype: every source row's
   channel scales), beams with FD_NEW_KV (causal; f32/f16/bf16: the new keys
   the row's own), each in every mode variant, unsplit and 3 splits. */
static void sweep(void) {
  int idx = 0, mode, q_len;
  for (int isa = 0; isa < FD_ISA_COUNT; isa++) if (fd_cpu_has_isa(isa)) {
    fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2, .isa_limit = isa + 1 });
    for (int m = 0; m < 4; m++)
      for (int sp = 0; sp < 2; sp++) {
        int splits = sp ? 3 : 1;
        mode_of(m, &mode, &q_len);
        for (int qi = 0; qi < t_quant_count(); qi++) {
          int kd = t_quant_dtype(qi);
          run_case(ctx, isa, kd, mode, q_len, 1, -1, splits, 4, 0, 0, idx++);
          if (mode != FD_CAUSAL) run_case(ctx, isa, kd, mode, q_len, 1, -1, splits, 4, 1, 0, idx++);
          int pat = (idx + qi) % 4;
          run_case(ctx, isa, kd, mode, q_len, 1, pat, splits, 4, 0, 0, idx++);   /* beams, per-channel K */
        }
        for (int kd = 0; kd < FD_DTYPE_COUNT; kd++) {
          int pat = (idx + kd) % 4;
          run_case(ctx, isa, kd, mode, q_len, 0, pat, splits, 4, 0, 0, idx++);
          if (!fd_dtype_quant[kd]) run_case(ctx, isa, kd, mode, q_len, 0, 2, splits, 16, 0, 0, idx++);   /* head lanes */
          if (mode == FD_CAUSAL && kd <= FD_BF16) run_case(ctx, isa, kd, mode, q_len, 0, (pat + sp + kd) % 4, splits, 4, 0, 1, idx++);
        }
      }
    fd_destroy(ctx);
  }
}

/* A shape that must be refused at plan time with code rc and a message holding want. */
static void refused(fd_ctx *ctx, fd_shape s, int rc, const char *want, const char *name) {
  fd_plan *plan = NULL;
  int got = fd_plan_create(ctx, &s, &plan);
  t_check(got == rc && strstr(fd_errmsg(ctx), want) != NULL, "refusal %s: rc %d (want %d), message '%s' (want '%s')",
          name, got, rc, fd_errmsg(ctx), want);
  fd_plan_destroy(plan);
}

/* Run case c (paged from pl or dense) with its arguments changed by edit
   (NULL: none); want NULL: must run, else FD_EINVAL with a message holding
   want, out and lse untouched. */
static void run_refused(fd_ctx *ctx, bcase *c, const pool *pl, void (*edit)(fd_args *a), const char *want,
                        const char *name) {
  const ref_problem *r = &c->kp.ref;
  size_t n = (size_t)NB * c->q_len * r->Hq * r->D * t_dtype_size(c->kp.out_dtype), nl = sizeof(float) * NB * c->q_len * r->Hq;
  unsigned char *out = malloc(n), *lse = malloc(nl);
  memset(out, 0x5a, n);
  memset(lse, 0x5a, nl);
  fd_shape s = shape_of(c, pl != NULL);
  fd_args a = args_of(c, pl, out, (float *)lse);
  if (edit) edit(&a);
  fd_plan *plan = NULL;
  int rc = fd_plan_create(ctx, &s, &plan), run = rc ? rc : fd_run(plan, &a);
  size_t i = 0, k = 0;
  while (i < n && out[i] == 0x5a) i++;
  while (k < nl && lse[k] == 0x5a) k++;
  if (!want) t_check(run == 0, "control %s: %s", name, fd_errmsg(ctx));
  else
    t_check(rc == 0 && run == FD_EINVAL && strstr(fd_errmsg(ctx), want) && i == n && k == nl,
            "refusal %s: plan %d, run %d, '%s' (want '%s'), out untouched %d, lse untouched %d", name, rc, run,
            fd_errmsg(ctx), want, i == n, k == nl);
  fd_plan_destroy(plan);
  free(out); free(lse);
}

static void no_k_scale(fd_args *a) { a->k_scale = NULL; }
static void no_beam_src(fd_args *a) { a->beam_src = NULL; }

/* Every row b reads row (b + 1) % NB's keys (row 1 with from_self its own): row
   0 reads row 1's keys 0..S_CAP - 1, row 1 (cur_pos 0) key 0, row 2 row 0's
   keys 0..S_CAP / 2. */
static void next_rows(bcase *c, int from_self) {
  for (int b = 0; b < NB; b++)
    for (int64_t i = 0; i < S_CAP; i++) c->src[b * S_CAP + i] = from_self && b == 1 ? 1 : (b + 1) % NB;
  c->kp.cur_pos[2] = S_CAP / 2;
}

/* f16 element (b, kv head j, key, d) of K buffer k ([NB, HKV, S_CAP, D]) set to NaN. */
static void f16_nan(void *k, int b, int j, int64_t key, int d, int D) {
  ((uint16_t *)k)[(((size_t)b * HKV + j) * S_CAP + (size_t)key) * D + d] = 0x7e00;
}

/* config.check_inputs with FD_BEAMS checks the K/V rows (and scales) each
   key is read from, through beam_src: a NaN in a row no key reads passes, one
   a key reads is refused naming the cache row and the row reading it; dense
   and paged; per-row V scales and per-channel K scales of source rows alike. */
static void check_beams_inputs(fd_ctx *ctx) {
  bcase c;
  pool pl;
  make(&c, 8, 64, FD_F32, FD_F16, FD_F32, FD_CAUSAL, 1, 0, 0, 0, 1, 91);
  next_rows(&c, 0);
  run_refused(ctx, &c, NULL, NULL, NULL, "check_inputs beams, valid");
  f16_nan(c.kp.k, 0, 1, 150, 3, 64);           /* row 0's key 150: row 0 reads row 1, row 2 stops at key 100 */
  run_refused(ctx, &c, NULL, NULL, NULL, "check_inputs beams, a NaN in a row no key reads");
  f16_nan(c.kp.k, 0, 1, 50, 3, 64);            /* row 0's key 50: row 2 reads it */
  run_refused(ctx, &c, NULL, NULL, "args.k[b=0, kv_head=1, key=50, d=3] is NaN (row 2 reads it through args.beam_src)",
              "check_inputs beams, a NaN in K a key reads");
  make_pool(&c, &pl);
  run_refused(ctx, &c, &pl, NULL, "args.k[b=0, kv_head=1, key=50, d=3] is NaN (row 2 reads it through args.beam_src)",
              "check_inputs paged beams, a NaN in K a key reads");
  kx_pool_free(&pl);
  unmake(&c);
  make(&c, 8, 64, FD_F32, FD_I8, FD_F32, FD_CAUSAL, 1, 0, 0, 1, 1, 92);
  next_rows(&c, 1);                            /* row 2's rows are read by no key */
  c.kch[(2 * HKV + 0) * 64 + 7] = NAN;
  c.kp.v_scale[(2 * HKV + 1) * S_CAP + 0] = NAN;
  run_refused(ctx, &c, NULL, NULL, NULL, "check_inputs beams, NaN scales of a row no key reads");
  c.kp.v_scale[(0 * HKV + 1) * S_CAP + 60] = NAN;
  run_refused(ctx, &c, NULL, NULL, "args.v_scale[b=0, kv_head=1, key=60] is NaN (row 2 reads it through args.beam_src)",
              "check_inputs beams, a NaN V scale a key reads");
  c.kp.v_scale[(0 * HKV + 1) * S_CAP + 60] = 1.0f;
  c.kch[(1 * HKV + 1) * 64 + 5] = NAN;
  run_refused(ctx, &c, NULL, NULL, "args.k_scale[b=1, kv_head=1, d=5] is NaN (row 0 reads it through args.beam_src)",
              "check_inputs beams, a NaN channel scale of a source row");
  unmake(&c);
}

/* Bad shapes and arguments of both features, each named, nothing written;
   and the controls next to them (an entry past a row's valid keys is not read). */
static void refusals(void) {
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2 });
  fd_shape base = { NB, 8, HKV, 64, S_CAP, FD_F32, FD_I8, FD_F32, FD_CAUSAL, FD_BHSD, 0 }, s;
  for (int kd = FD_F32; kd <= FD_BF16; kd++) {
    char name[64];
    snprintf(name, sizeof name, "FD_K_PER_CHANNEL with %s KV", fd_dtype_names[kd]);
    s = base; s.kv_dtype = kd; s.features = FD_K_PER_CHANNEL;
    refused(ctx, s, FD_EINVAL, "FD_K_PER_CHANNEL with kv_dtype", name);
  }
  s = base; s.features = FD_BEAMS | FD_SHARED_KV; s.mask_mode = FD_FULL;
  refused(ctx, s, FD_EINVAL, "FD_BEAMS with FD_SHARED_KV", "beams with a shared sequence");
  bcase c;
  make(&c, 8, 64, FD_F32, FD_I8, FD_F32, FD_CAUSAL, 1, 0, 0, 1, -1, 97);
  run_refused(ctx, &c, NULL, NULL, NULL, "per-channel K, valid");
  run_refused(ctx, &c, NULL, no_k_scale, "args.k_scale is NULL but the shape's features set FD_K_PER_CHANNEL",
              "per-channel K without k_scale");
  unmake(&c);
  make(&c, 8, 64, FD_F32, FD_I8, FD_F32, FD_CAUSAL, 1, 0, 0, 0, 2, 99);
  run_refused(ctx, &c, NULL, NULL, NULL, "beams, valid");
  run_refused(ctx, &c, NULL, no_beam_src, "args.beam_src is NULL", "beams without beam_src");
  int32_t keep = c.src[0 * S_CAP + 5];
  c.src[0 * S_CAP + 5] = NB;
  run_refused(ctx, &c, NULL, NULL, "args.beam_src[b=0, key=5] is 3, outside 0..2", "beam_src entry = batch");
  c.src[0 * S_CAP + 5] = -1;
  run_refused(ctx, &c, NULL, NULL, "args.beam_src[b=0, key=5] is -1", "beam_src entry -1");
  c.src[0 * S_CAP + 5] = keep;
  c.src[1 * S_CAP + S_CAP - 1] = 77;           /* row 1's last valid key is q_len - 1 = 0: not read */
  run_refused(ctx, &c, NULL, NULL, NULL, "beam_src entry past the valid keys");
  pool pl;
  make_pool(&c, &pl);
  run_refused(ctx, &c, &pl, NULL, NULL, "paged beams, valid");
  c.src[2 * S_CAP + 3] = 0;                    /* row 2 key 3 read from row 0's page 0 */
  int32_t kp = pl.table[0];
  pl.table[0] = NB * PER_ROW;
  run_refused(ctx, &c, &pl, NULL, "args.block_table[b=0, page=0] is 39, outside 0..38 (shape.pool_pages - 1); key 3 of "
              "row 2 reads it", "paged beams, a bad page read through beam_src");
  pl.table[0] = kp;
  for (int b = 0; b < NB; b++)                 /* no key of page 0 from row 1: its page 0 is not read */
    for (int64_t i = 0; i < PAGE; i++) c.src[b * S_CAP + i] = 0;
  pl.table[1 * PER_ROW + 0] = -1;
  run_refused(ctx, &c, &pl, NULL, NULL, "paged beams, a bad page no key reads");
  kx_pool_free(&pl);
  unmake(&c);
  fd_destroy(ctx);
  ctx = fd_create(&(fd_config){ .threads = 2, .check_inputs = 1 });
  check_beams_inputs(ctx);
  make(&c, 8, 64, FD_F32, FD_FP8_E4M3, FD_F32, FD_CAUSAL, 1, 0, 0, 1, -1, 98);
  c.kch[(0 * HKV + 1) * 64 + 5] = NAN;
  run_refused(ctx, &c, NULL, NULL, "args.k_scale[b=0, kv_head=1, d=5] is NaN", "check_inputs: a NaN channel scale");
  unmake(&c);
  make(&c, 8, 64, FD_F32, FD_I8, FD_F32, FD_CAUSAL, 1, 20, 0, 1, -1, 96);   /* a window past key 0, no sinks */
  c.kch[(0 * HKV + 1) * 64 + 5] = NAN;
  run_refused(ctx, &c, NULL, NULL, "args.k_scale[b=0, kv_head=1, d=5] is NaN",
              "check_inputs: a NaN channel scale with a sliding window");
  unmake(&c);
  fd_destroy(ctx);
}

int main(void) {
  sweep();
  refusals();
  return t_done();
}
