/* Paged KV (layout FD_PAGED) through the public API, against the
   double-precision reference: every isa this CPU runs, every KV dtype (q and
   out dtypes rotated), every mask mode, page sizes 16, 64, 256 and 1024,
   unsplit and 3 splits (which start mid-page), chunks of 96 keys (pieces that
   cross pages at odd offsets) and 256 (several pages per chunk), group tiles
   1, 4 and 16 (the staged, direct and head-lane kernels; 8 where an isa's
   tiles stop below 16: AVX2's P.V in passes of 4 heads). Pages sit in a
   shuffled pool order; every byte of the pools that is not a valid key is a
   NaN pattern, so a read of the wrong page or slot shows. A paged run gives
   the bits of the dense run over the same keys with the same plan. Then the
   refusals: block-table entries, page_size, pool_pages, the appended fields,
   each naming the field with out untouched; and check_inputs over pages. */
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
#define S 1100                 /* kv_len: 2 pages of 1024, the second partial */
#define SPARE 3                /* unused pool pages, NaN filled */

static const int PAGE_SIZES[] = { 16, 64, 256, 1024 };

/* The fd_shape of p in a layout (paged: g's page size and pool). */
static fd_shape shape_of(const kproblem *p, const kp_pages *g) {
  const ref_problem *r = &p->ref;
  fd_shape s = { B, r->Hq, HKV, r->D, S, p->q_dtype, p->kv_dtype, p->out_dtype, r->mask_mode, FD_BHSD, 0 };
  if (g) { s.layout = FD_PAGED; s.page_size = g->page_size; s.pool_pages = g->pool_pages; }
  return s;
}

/* The arguments of p (paged: g's pools and table) writing out and lse. */
static fd_args args_of(const kproblem *p, const kp_pages *g, void *out, float *lse) {
  fd_args a = { p->q, p->k, p->v, p->cur_pos, p->mask, p->k_scale, p->v_scale, NULL, 0, out, lse };
  if (g) {
    a.k = g->k; a.v = g->v; a.block_table = g->table;
    if (p->k_scale) { a.k_scale = g->k_scale; a.v_scale = g->v_scale; }
  }
  return a;
}

/* Plan with opts and run p (paged when g); FD_OK or the code, message checked by the caller. */
static int plan_run(fd_ctx *ctx, const kproblem *p, const kp_pages *g, const fd_plan_opts *o, void *out, float *lse) {
  fd_shape s = shape_of(p, g);
  fd_args a = args_of(p, g, out, lse);
  return t_plan_run(ctx, &s, o, &a);
}

/* One case: paged against the reference, and against the dense run bit for bit. */
static void run_case(fd_ctx *ctx, int isa, int kd, int mode, int ps, int splits, int idx) {
  int G = idx % 4 == 3 && !fd_dtype_quant[kd] ? 16 : 4, D = idx % 2 ? 128 : 64;
  int tile = G == 16 ? (fd_isa_table[isa].max_tile >= 16 ? 16 : 8) : idx % 3 == 0 ? 1 : 4;
  int chunk = idx % 2 ? 96 : 256, qd = idx % 3, od = idx / 3 % 3;
  if (D % fd_isa_table[isa].width || tile > fd_isa_table[isa].max_tile) return;
  char name[256];
  snprintf(name, sizeof name, "isa%d kv%s q%s out%s %s page%d splits%d chunk%d G%d tile%d D%d", isa, fd_dtype_names[kd],
           fd_dtype_names[qd], fd_dtype_names[od], fd_mask_mode_names[mode], ps, splits, chunk, G, tile, D);
  kproblem p;
  kp_init(&p, B, HKV * G, HKV, D, S, qd, kd, od, mode, FD_BHSD, 3000 + (uint64_t)idx);
  p.cur_pos[1] = (int32_t)(2 * ps + ps / 2 < S ? 2 * ps + ps / 2 : S - 7);   /* ends mid-page */
  p.cur_pos[2] = 0;                                                         /* one key */
  kp_pages g;
  kp_page(&p, ps, SPARE, 77 + (uint64_t)idx, &g);
  size_t n = (size_t)B * p.ref.Hq * D, osz = t_dtype_size(od);
  char *out = malloc(n * osz), *dout = malloc(n * osz);
  float *lse = malloc(sizeof(float) * B * p.ref.Hq), *dlse = malloc(sizeof(float) * B * p.ref.Hq);
  float *outf = malloc(n * sizeof(float));
  double *rout = malloc(n * sizeof(double)), *rlse = malloc(sizeof(double) * B * p.ref.Hq);
  fd_plan_opts o = { chunk, tile, splits, 2, isa + 1 };
  int rc = plan_run(ctx, &p, &g, &o, out, lse);
  if (t_check(rc == 0, "%s: paged run: %s", name, fd_errmsg(ctx))) {
    ref_attention(&p.ref, rout, rlse);
    for (size_t i = 0; i < n; i++) outf[i] = t_load(od, out, i);
    t_compare(&p, outf, lse, rout, rlse, 1, name);
    rc = plan_run(ctx, &p, NULL, &o, dout, dlse);
    if (t_check(rc == 0, "%s: dense run: %s", name, fd_errmsg(ctx)))
      t_check(!memcmp(out, dout, n * osz) && !memcmp(lse, dlse, sizeof(float) * B * p.ref.Hq),
              "%s: paged and dense outputs differ in their bits", name);
  }
  free(out); free(dout); free(lse); free(dlse); free(outf); free(rout); free(rlse);
  kp_pages_free(&g);
  kp_free(&p);
}

/* Every isa, KV dtype, mask mode, page size and split setting. */
static void sweep(void) {
  int idx = 0;
  for (int isa = 0; isa < FD_ISA_COUNT; isa++) if (fd_cpu_has_isa(isa)) {
    fd_config cfg = { .threads = 2, .isa_limit = isa + 1 };
    fd_ctx *ctx = fd_create(&cfg);
    for (int kd = 0; kd < FD_DTYPE_COUNT; kd++)
      for (int mode = 0; mode < FD_MASK_MODE_COUNT; mode++)
        for (int pi = 0; pi < 4; pi++)
          for (int sp = 0; sp < 2; sp++) run_case(ctx, isa, kd, mode, PAGE_SIZES[pi], sp ? 3 : 1, idx++);
    fd_destroy(ctx);
  }
}

/* A refused plan: code FD_EINVAL (or want) and a message naming field. */
static void plan_refused(fd_ctx *ctx, const fd_shape *s, int want, const char *field, const char *name) {
  fd_plan *plan = NULL;
  int rc = fd_plan_create(ctx, s, &plan);
  t_check(rc == want && strstr(fd_errmsg(ctx), field) && !plan, "%s: rc %d (want %d), message \"%s\" should name %s",
          name, rc, want, fd_errmsg(ctx), field);
  fd_plan_destroy(plan);
}

/* A refused run: FD_EINVAL, the message names field, out untouched. */
static void run_refused(fd_ctx *ctx, const kproblem *p, const kp_pages *g, const char *field, const char *name) {
  fd_shape s = shape_of(p, g);
  fd_plan *plan = NULL;
  size_t n = (size_t)B * p->ref.Hq * p->ref.D;
  float *out = malloc(n * 4), *lse = malloc(sizeof(float) * B * p->ref.Hq);
  memset(out, 0x5a, n * 4);
  fd_args a = args_of(p, g, out, lse);
  int rc = fd_plan_create(ctx, &s, &plan);
  if (!rc) rc = fd_run(plan, &a);
  int untouched = 1;
  for (size_t i = 0; i < n * 4; i++) untouched &= ((unsigned char *)out)[i] == 0x5a;
  t_check(rc == FD_EINVAL && strstr(fd_errmsg(ctx), field) && untouched,
          "%s: rc %d, message \"%s\" should name %s, out %s", name, rc, fd_errmsg(ctx), field,
          untouched ? "untouched" : "written");
  fd_plan_destroy(plan);
  free(out); free(lse);
}

/* Bad paged shapes and block tables, and the appended fields this build refuses. */
static void refusals(void) {
  fd_ctx *ctx = fd_create(&(fd_config){ .threads = 2 });
  kproblem p;
  kp_init(&p, B, 8, HKV, 64, S, FD_F32, FD_F16, FD_F32, FD_CAUSAL, FD_BHSD, 99);
  kp_pages g;
  kp_page(&p, 64, SPARE, 5, &g);
  fd_shape s = shape_of(&p, &g);
  static const int bad_sizes[] = { 0, 3, 8, 48, 2048 };
  for (int i = 0; i < 5; i++) {
    fd_shape t = s;
    t.page_size = bad_sizes[i];
    char name[64];
    snprintf(name, sizeof name, "page_size %d refused", bad_sizes[i]);
    plan_refused(ctx, &t, FD_EINVAL, "shape.page_size", name);
  }
  fd_shape t = s;
  t.pool_pages = 0;
  plan_refused(ctx, &t, FD_EINVAL, "shape.pool_pages", "pool_pages 0 refused");
  static const int bad_qlens[] = { -1, 17 };
  for (int i = 0; i < 2; i++) {
    t = s;
    t.q_len = bad_qlens[i];
    plan_refused(ctx, &t, FD_EINVAL, "shape.q_len", "q_len out of range refused");
  }
  t = s; t.features = FD_BEAMS | FD_SHARED_KV;   /* FD_BEAMS with FD_NEW_KV: served (test_kpc_beams, paged too) */
  plan_refused(ctx, &t, FD_EINVAL, "FD_BEAMS with FD_SHARED_KV", "FD_BEAMS with FD_SHARED_KV refused");
  t = s; t.features = 1u << 12;
  plan_refused(ctx, &t, FD_EINVAL, "shape.features", "unknown feature bit refused");
  t = s; t.softcap = -1;
  plan_refused(ctx, &t, FD_EINVAL, "shape.softcap", "negative softcap refused");
  int32_t *slot = &g.table[1 * g.per_row + 1], keep = *slot;     /* row 1 holds keys in its page 1 */
  *slot = (int32_t)g.pool_pages;
  run_refused(ctx, &p, &g, "args.block_table[b=1, page=1]", "block-table entry = pool_pages refused");
  *slot = -1;
  run_refused(ctx, &p, &g, "args.block_table[b=1, page=1]", "negative block-table entry refused");
  *slot = keep;
  int32_t *table = g.table;
  g.table = NULL;
  run_refused(ctx, &p, &g, "args.block_table", "NULL block table refused");
  g.table = table;
  fd_destroy(ctx);
  /* check_inputs reads the keys through the pages: a NaN in row 1's key 70 is named; the NaN pages are not read */
  ctx = fd_create(&(fd_config){ .threads = 2, .check_inputs = 1 });
  size_t pos = ((size_t)g.table[1 * g.per_row + 1] * HKV + 1) * 64 + 6, row = 64 * 2;
  uint16_t keepk;
  memcpy(&keepk, (char *)g.k + pos * row + 3 * 2, 2);
  float *out = malloc(sizeof(float) * B * 8 * 64), *lse = malloc(sizeof(float) * B * 8);
  t_check(plan_run(ctx, &p, &g, &(fd_plan_opts){ 0 }, out, lse) == FD_OK,
          "check_inputs accepts the paged cache (NaN only outside its valid keys): %s", fd_errmsg(ctx));
  free(out); free(lse);
  memcpy((char *)g.k + pos * row + 3 * 2, &(uint16_t){ 0x7e00 }, 2);
  run_refused(ctx, &p, &g, "args.k[b=1, kv_head=1, key=70, d=3] is NaN", "check_inputs names a NaN key in a page");
  memcpy((char *)g.k + pos * row + 3 * 2, &keepk, 2);
  kp_pages_free(&g);
  kp_free(&p);
  fd_destroy(ctx);
}

int main(void) {
  sweep();
  refusals();
  return t_done();
}
