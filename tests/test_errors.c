/* Bad input gets a clear error and nothing is lost: every refusal names its
   field and leaves out untouched; tuned tables are refused whole; plans of a
   destroyed context fail cleanly; concurrent runs match serial runs; indexing
   is 64-bit. */
#include "compare.h"
#include "fd_keydefs.h"
#include "flashdecode.h"
#include "kexec.h"
#include "tcheck.h"
#include "cpu.h"
#include "internal.h"
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static fd_ctx *ctx;

/* Expect fd_plan_create to fail with code and a message containing want. */
static void plan_refused(fd_shape s, const fd_plan_opts *o, int code, const char *want, const char *name) {
  fd_plan *p = (fd_plan *)0x1;
  int rc = fd_plan_create_opts(ctx, &s, o, &p);
  t_check(rc == code && strstr(fd_errmsg(ctx), want) && p == NULL, "%s: rc %d, message '%s' (want %d, '%s')",
          name, rc, fd_errmsg(ctx), code, want);
  if (rc == 0) fd_plan_destroy(p);
}

/* Every bad shape and option field. */
static void bad_shapes(void) {
  const fd_shape ok = { 2, 8, 2, 64, 128, FD_F32, FD_F16, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  fd_shape s;
#define BAD(field, value, code, want) s = ok; s.field = value; plan_refused(s, NULL, code, want, "shape." #field " = " #value)
  BAD(batch, 0, FD_EINVAL, "shape.batch");
  BAD(n_q_heads, 0, FD_EINVAL, "shape.n_q_heads");
  BAD(n_kv_heads, 0, FD_EINVAL, "shape.n_kv_heads");
  BAD(n_q_heads, 7, FD_EINVAL, "not a multiple of shape.n_kv_heads");
  BAD(head_dim, 0, FD_EINVAL, "shape.head_dim");
  BAD(head_dim, -3, FD_EINVAL, "shape.head_dim");
  BAD(head_dim, 1000, FD_EINVAL, "shape.head_dim");
  BAD(kv_len, 0, FD_EINVAL, "shape.kv_len");
  BAD(kv_len, -5, FD_EINVAL, "shape.kv_len");
  BAD(kv_len, (int64_t)1 << 40, FD_EINVAL, "int32 cur_pos");
  BAD(q_dtype, (fd_dtype)7, FD_EINVAL, "shape.q_dtype");
  BAD(q_dtype, FD_I8, FD_EINVAL, "shape.q_dtype");
  BAD(q_dtype, FD_FP8_E5M2, FD_EINVAL, "shape.q_dtype");
  BAD(kv_dtype, (fd_dtype)9, FD_EINVAL, "shape.kv_dtype");
  BAD(kv_dtype, (fd_dtype)(FD_Q4_0 + 1), FD_EINVAL, "shape.kv_dtype");
  BAD(kv_dtype, (fd_dtype)-1, FD_EINVAL, "shape.kv_dtype");
  BAD(out_dtype, FD_FP8_E4M3, FD_EINVAL, "shape.out_dtype");
  BAD(out_dtype, FD_FP8_E5M2, FD_EINVAL, "shape.out_dtype");
  BAD(mask_mode, (fd_mask_mode)3, FD_EINVAL, "shape.mask_mode");
  BAD(layout, (fd_layout)5, FD_EINVAL, "shape.layout");
  BAD(layout, FD_PAGED, FD_EINVAL, "shape.page_size");      /* page_size 0 */
  BAD(q_dtype, FD_Q8_0, FD_EINVAL, "shape.q_dtype");
  BAD(out_dtype, FD_Q4_0, FD_EINVAL, "shape.out_dtype");
#undef BAD
  /* the block dtypes: head_dim a multiple of their 32-element blocks; no k_new / v_new */
  static const struct { fd_dtype kv; int head_dim; unsigned features; const char *want; } blocks[] = {
    { FD_Q4_0, 48, 0, "shape.head_dim is 48; kv_dtype q4_0 stores rows of 32-element blocks" },
    { FD_Q8_0, 80, 0, "shape.head_dim is 80; kv_dtype q8_0" },
    { FD_Q4_0, 16, 0, "shape.head_dim is 16" },
    { FD_Q8_0, 64, FD_NEW_KV, "shape.features sets FD_NEW_KV with kv_dtype q8_0" },
  };
  for (size_t i = 0; i < sizeof blocks / sizeof *blocks; i++) {
    char name[96];
    s = ok; s.kv_dtype = blocks[i].kv; s.head_dim = blocks[i].head_dim; s.features = blocks[i].features;
    snprintf(name, sizeof name, "kv %s head_dim %d features 0x%x", fd_dtype_names[s.kv_dtype], s.head_dim, s.features);
    plan_refused(s, NULL, FD_EINVAL, blocks[i].want, name);
  }
  s = ok; s.mask_mode = FD_FULL; s.kv_len = (int64_t)1 << 61;
  plan_refused(s, NULL, FD_EINVAL, "too large", "kv_len beyond 2^63 bytes");
  plan_refused(ok, &(fd_plan_opts){ .chunk = -1 }, FD_EINVAL, "opts.chunk", "opts.chunk -1");
  plan_refused(ok, &(fd_plan_opts){ .chunk = 5000 }, FD_EINVAL, "opts.chunk", "opts.chunk 5000");
  plan_refused(ok, &(fd_plan_opts){ .group_tile = 3 }, FD_EINVAL, "opts.group_tile", "opts.group_tile 3 of 4");
  plan_refused(ok, &(fd_plan_opts){ .splits = -2 }, FD_EINVAL, "opts.splits", "opts.splits -2");
  plan_refused(ok, &(fd_plan_opts){ .threads = 99 }, FD_EINVAL, "opts.threads", "opts.threads 99");
  plan_refused(ok, &(fd_plan_opts){ .isa = 9 }, FD_EINVAL, "opts.isa", "opts.isa 9");
  fd_plan *p;
  t_check(fd_plan_create(ctx, NULL, &p) == FD_EINVAL && strstr(fd_errmsg(ctx), "shape is NULL"), "NULL shape");
  t_check(fd_plan_create(ctx, &ok, NULL) == FD_EINVAL && strstr(fd_errmsg(ctx), "output pointer"), "NULL plan pointer");
  t_check(fd_plan_create(NULL, &ok, &p) == FD_EINVAL && strstr(fd_errmsg(NULL), "ctx is NULL"), "NULL ctx");
}

/* Bad configurations refuse to create a context, saying why. */
static void bad_configs(void) {
  t_check(!fd_create(&(fd_config){ .threads = -1 }) && strstr(fd_errmsg(NULL), "config.threads"), "config.threads -1");
  t_check(!fd_create(&(fd_config){ .backend = (fd_backend)7 }) && strstr(fd_errmsg(NULL), "config.backend"), "config.backend 7");
  t_check(!fd_create(&(fd_config){ .isa_limit = 9 }) && strstr(fd_errmsg(NULL), "config.isa_limit"), "config.isa_limit 9");
}

#define SENTINEL 0xAB
/* True if every byte of buf is the sentinel. */
static int untouched(const void *buf, size_t n) {
  for (size_t i = 0; i < n; i++) if (((const unsigned char *)buf)[i] != SENTINEL) return 0;
  return 1;
}

/* Expect fd_run to fail with code, naming want, and write nothing to out or lse. */
static void run_refused(const fd_plan *p, fd_args a, int code, const char *want, const char *name) {
  float out[2 * 8 * 64], lse[16];
  memset(out, SENTINEL, sizeof out); memset(lse, SENTINEL, sizeof lse);
  if (a.out) a.out = out;
  a.lse = lse;
  int rc = fd_run(p, &a);
  t_check(rc == code && strstr(fd_errmsg(ctx), want), "%s: rc %d, message '%s' (want %d, '%s')", name, rc,
          fd_errmsg(ctx), code, want);
  t_check(untouched(out, sizeof out) && untouched(lse, sizeof lse), "%s: out and lse untouched", name);
}

/* A quantized KV dtype run without one of its row scales: FD_EINVAL naming it, out untouched. */
static void missing_scales(fd_dtype kv) {
  kproblem kp;
  kp_init(&kp, 2, 8, 2, 64, 100, 0, kv, 0, 2, 0, 9);
  fd_shape s = { 2, 8, 2, 64, 100, FD_F32, kv, FD_F32, FD_FULL, FD_BHSD, 0 };
  fd_plan *p;
  char name[64];
  if (!t_check(fd_plan_create(ctx, &s, &p) == 0, "kv %s plan: %s", fd_dtype_names[kv], fd_errmsg(ctx))) return;
  const fd_args ok = { kp.q, kp.k, kp.v, NULL, NULL, kp.k_scale, kp.v_scale, NULL, 0, (void *)1, NULL };
  fd_args a = ok;
  a.k_scale = NULL;
  snprintf(name, sizeof name, "kv %s, args.k_scale = NULL", fd_dtype_names[kv]);
  run_refused(p, a, FD_EINVAL, "args.k_scale is NULL", name);
  a = ok;
  a.v_scale = NULL;
  snprintf(name, sizeof name, "kv %s, args.v_scale = NULL", fd_dtype_names[kv]);
  run_refused(p, a, FD_EINVAL, "args.v_scale is NULL", name);
  fd_plan_destroy(p);
  kp_free(&kp);
}

/* A block KV dtype (scales in its blocks) run with a row scale: FD_EINVAL naming it, out untouched. */
static void block_scales(fd_dtype kv) {
  kproblem kp;
  kp_init(&kp, 2, 8, 2, 64, 100, 0, kv, 0, 2, 0, 10);
  fd_shape s = { 2, 8, 2, 64, 100, FD_F32, kv, FD_F32, FD_FULL, FD_BHSD, 0 };
  fd_plan *p;
  float scales[2 * 2 * 100];
  char name[64];
  if (!t_check(fd_plan_create(ctx, &s, &p) == 0, "kv %s plan: %s", fd_dtype_names[kv], fd_errmsg(ctx))) return;
  const fd_args ok = { kp.q, kp.k, kp.v, NULL, NULL, NULL, NULL, NULL, 0, (void *)1, NULL };
  fd_args a = ok;
  a.k_scale = scales;
  snprintf(name, sizeof name, "kv %s, args.k_scale set", fd_dtype_names[kv]);
  run_refused(p, a, FD_EINVAL, "args.k_scale is set but kv_dtype", name);
  a = ok;
  a.v_scale = scales;
  snprintf(name, sizeof name, "kv %s, args.v_scale set", fd_dtype_names[kv]);
  run_refused(p, a, FD_EINVAL, "args.v_scale is set but kv_dtype", name);
  float out[2 * 8 * 64];
  a = ok;
  a.out = out;
  t_check(fd_run(p, &a) == FD_OK, "kv %s without row scales runs: %s", fd_dtype_names[kv], fd_errmsg(ctx));
  fd_plan_destroy(p);
  kp_free(&kp);
}

/* Every bad argument of fd_run, per mask mode and dtype that needs it. */
static void bad_args(void) {
  for (int k = 0; k < t_quant_count(); k++) missing_scales((fd_dtype)t_quant_dtype(k));
  block_scales(FD_Q8_0);
  block_scales(FD_Q4_0);
  kproblem kp;
  kp_init(&kp, 2, 8, 2, 64, 100, 0, 3, 0, 1, 0, 7);    /* int8 KV, mask mode */
  fd_shape s = { 2, 8, 2, 64, 100, FD_F32, FD_I8, FD_F32, FD_MASK, FD_BHSD, 0 };
  fd_plan *pm, *pc;
  if (!t_check(fd_plan_create(ctx, &s, &pm) == 0, "mask plan: %s", fd_errmsg(ctx))) return;
  s.mask_mode = FD_CAUSAL;
  if (!t_check(fd_plan_create(ctx, &s, &pc) == 0, "causal plan: %s", fd_errmsg(ctx))) return;
  const fd_args ok = { kp.q, kp.k, kp.v, kp.cur_pos, kp.mask, kp.k_scale, kp.v_scale, NULL, 0, (void *)1, NULL };
  fd_args a;
#define BADARG(plan, field, value, code, want) a = ok; a.field = value; run_refused(plan, a, code, want, "args." #field " = " #value)
  BADARG(pm, q, NULL, FD_EINVAL, "args.q");
  BADARG(pm, k, NULL, FD_EINVAL, "args.k");
  BADARG(pm, v, NULL, FD_EINVAL, "args.v");
  BADARG(pm, out, NULL, FD_EINVAL, "args.out");
  BADARG(pm, mask, NULL, FD_EINVAL, "args.mask");
  BADARG(pm, k_scale, NULL, FD_EINVAL, "args.k_scale");
  BADARG(pm, v_scale, NULL, FD_EINVAL, "args.v_scale");
  BADARG(pm, scale, NAN, FD_EINVAL, "args.scale");
  BADARG(pm, scale, INFINITY, FD_EINVAL, "args.scale");
  BADARG(pc, cur_pos, NULL, FD_EINVAL, "args.cur_pos");
  int32_t neg[2] = { 5, -1 }, big[2] = { 100, 3 };
  BADARG(pc, cur_pos, neg, FD_EINVAL, "args.cur_pos[1] is -1");
  BADARG(pc, cur_pos, big, FD_EINVAL, "args.cur_pos[0] is 100");
#undef BADARG
  run_refused(NULL, ok, FD_EINVAL, "", "NULL plan");
  t_check(fd_run(pm, NULL) == FD_EINVAL && strstr(fd_errmsg(ctx), "args is NULL"), "NULL args");
  fd_plan_destroy(pm);
  fd_plan_destroy(pc);
  kp_free(&kp);
}

/* A plan used after its context is destroyed fails with FD_EDESTROYED and writes nothing. */
static void destroyed_context(void) {
  fd_ctx *c = fd_create(&(fd_config){ .threads = 2 });
  kproblem kp;
  kp_init(&kp, 2, 8, 2, 64, 100, 0, 0, 0, 2, 0, 8);
  fd_shape s = { 2, 8, 2, 64, 100, FD_F32, FD_F32, FD_F32, FD_FULL, FD_BHSD, 0 };
  fd_plan *p;
  if (!t_check(c && fd_plan_create(c, &s, &p) == 0, "plan before destroy")) return;
  fd_args a = { kp.q, kp.k, kp.v, NULL, NULL, NULL, NULL, NULL, 0, (void *)1, NULL };
  fd_destroy(c);
  fd_ctx *saved = ctx;
  ctx = c;                                  /* run_refused reads fd_errmsg(ctx) */
  run_refused(p, a, FD_EDESTROYED, "destroyed", "run after fd_destroy");
  ctx = saved;
  fd_plan_destroy(p);                       /* frees the context too (checked by ASan) */
  t_check(1, "plan destroyed after its context");
  kp_free(&kp);
}

/* Write text to a temporary file; returns its path (static buffer). */
static const char *temp_file(const char *text) {
  static char path[64];
  snprintf(path, sizeof path, "/tmp/fd_table_XXXXXX");
  int fd = mkstemp(path);
  if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text)) abort();
  close(fd);
  return path;
}

/* A context from table text: is the table used, and what does fd_errmsg say? */
static void table_case(const char *text, int accept, const char *want, const char *name) {
  const char *path = text ? temp_file(text) : "/nonexistent/table.tsv";
  fd_ctx *c = fd_create(&(fd_config){ .threads = 2, .table = path });
  if (!t_check(c != NULL, "%s: context still created", name)) return;
  t_check(accept || !*want ? fd_errmsg(c)[0] == 0 : strstr(fd_errmsg(c), want) != NULL, "%s: message '%s' (want '%s')",
          name, fd_errmsg(c), accept ? "" : want);
  fd_shape s = { 1, 4, 1, 64, 2048, FD_F32, FD_F16, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  fd_plan *p;
  fd_plan_info info = { 0 };
  if (t_check(fd_plan_create(c, &s, &p) == 0, "%s: plan", name)) {
    fd_plan_info_get(p, 2000, &info);
    t_check(info.from_table == accept && (accept ? info.splits == 3 && info.chunk == 32 && info.group_tile == 2
                                                 : info.splits != 3 && info.chunk != 32),
            "%s: from_table %d splits %d chunk %d tile %d", name, info.from_table, info.splits, info.chunk, info.group_tile);
    fd_plan_destroy(p);
  }
  fd_destroy(c);
  if (text) unlink(path);
}

/* Table text: header head and one row of signature sig (bucket 2048, splits 3,
   threads 2) for key, then the end line. */
static void table_text(char *buf, size_t n, const char *head, const char *sig, const char *key) {
  snprintf(buf, n, "%s%s\t2048\t%s\t3\t2\t100.0\t1.5\t120.0\tt\t-\nend\t1\n", head, sig, key);
}

/* Plan shape s with the isa forced in a context over table text: the plan
   keeps the row (chunk 32, splits 3) and uses isa want_isa with tile want_tile. */
static void forced_isa_case(const char *text, fd_shape s, int forced, int want_isa, int want_tile, const char *name) {
  const char *path = temp_file(text);
  fd_ctx *c = fd_create(&(fd_config){ .threads = 2, .table = path });
  fd_plan *p;
  fd_plan_info info = { 0 };
  int rc = c ? fd_plan_create_opts(c, &s, &(fd_plan_opts){ .isa = forced }, &p) : -1;
  if (t_check(rc == 0, "%s: plan (%s)", name, c ? fd_errmsg(c) : "no context")) {
    fd_plan_info_get(p, 2000, &info);
    fd_plan_destroy(p);
    t_check(info.from_table && info.isa == want_isa && info.chunk == 32 && info.group_tile == want_tile &&
            info.splits == 3, "%s (from_table %d isa %d chunk %d tile %d splits %d)", name, info.from_table,
            info.isa, info.chunk, info.group_tile, info.splits);
  }
  fd_destroy(c);
  unlink(path);
}

/* A table row with an AVX-512 tile of 16 and a plan forced to AVX2 (which holds
   at most 12 heads): the plan takes the heuristic tile and keeps the row's
   chunk and splits instead of failing to compile. */
static void forced_isa_narrower_tile(const char *head) {
  if (fd_cpu_max_isa() < 2) { printf("note: this CPU lacks AVX-512: the table-tile-16 + forced-AVX2 check skipped\n"); return; }
  fd_shape s = { 1, 16, 1, 64, 2048, FD_F32, FD_F16, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  char sig[256], table[8192];
  fd_shape_signature(&s, sig, sizeof sig);
  table_text(table, sizeof table, head, sig, "10032064162000100");
  forced_isa_case(table, s, FD_ISA_AVX2, 1, 8, "table tile 16 + forced AVX2 takes the heuristic tile");
}

/* Tuned tables: a good one is used; unreadable, truncated, foreign or malformed ones are refused whole. */
static void tuned_tables(void) {
  char head[4096], sig[256], good[8192], text[8192];
  fd_tuned_table_header(head, sizeof head);
  fd_shape s = { 1, 4, 1, 64, 2048, FD_F32, FD_F16, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  fd_shape_signature(&s, sig, sizeof sig);
  const char *key = "10032064020000100";   /* chunk 32, D 64, tile 2, kv f16, causal */
  table_text(good, sizeof good, head, sig, key);
  table_case(good, 1, "", "good table");
  {   /* forcing only the isa keeps the row's chunk, tile and splits (row: the best isa here) */
    char simd_key[24], simd_table[8192];
    snprintf(simd_key, sizeof simd_key, "%s", key);
    simd_key[10] = (char)('0' + fd_cpu_max_isa());                 /* digit 6, the isa */
    table_text(simd_table, sizeof simd_table, head, sig, simd_key);
    forced_isa_case(simd_table, s, FD_ISA_C, 0, 2, "forced isa keeps the table row");
  }
  forced_isa_narrower_tile(head);
  table_case(NULL, 0, "cannot open", "unreadable table");
  snprintf(text, sizeof text, "%.*s", (int)(strlen(good) - 6), good);
  table_case(text, 0, "truncated", "table without its end line");
  snprintf(text, sizeof text, "%.*s", (int)(strlen(head) / 2), head);
  table_case(text, 0, "truncated", "table cut in its header");
  snprintf(text, sizeof text, "%s", good);
  char *cpu = strstr(text, "\ncpu\t") + 5;
  memcpy(cpu, "Other", 5);
  table_case(text, 0, "line 5 (cpu)", "table from another CPU");
  snprintf(text, sizeof text, "%s", good);
  memcpy(strstr(text, "\ntemplates\t") + 11, "0000", 4);
  table_case(text, 0, "(templates)", "table from another build");
  table_text(text, sizeof text, head, sig, "10032064020010100");
  table_case(text, 0, "line 8: key 10032064020010100 does not fit the row's shape: mask_mode is 1, the shape has 0",
             "table row whose key does not fit the shape refuses the table");
  snprintf(text, sizeof text, "%s%s\t2048\t%s\t0\t2\t100.0\t1.5\t120.0\tt\t-\nend\t1\n", head, sig, key);
  table_case(text, 0, "splits '0'", "table row with 0 splits");
  snprintf(text, sizeof text, "%s%s\t2048\t%s\t3\t2\n", head, sig, key);
  table_case(text, 0, "fields", "table row missing fields");
  snprintf(text, sizeof text, "%s%s\t2048\t%s\t3\t2\t100.0\t1.5\t120.0\tt\t-\nend\t2\n", head, sig, key);
  table_case(text, 0, "end line", "table whose end line counts wrong");
  /* a count with leading zeros (found by fuzz_table: "end\t" and 400 digits
     of 1) is not the writer's text: refused, so the text a table loads from
     is the one it writes */
  snprintf(text, sizeof text, "%s%s\t2048\t%s\t3\t2\t100.0\t1.5\t120.0\tt\t-\nend\t01\n", head, sig, key);
  table_case(text, 0, "the end line does not close 1 rows", "table whose end line counts with a leading zero");
  snprintf(text, sizeof text, "%s%s\t2048\t%s\t3\t2\t100.0\t1.5\t120.0\tt\t-\nend\t1\n", head, sig, key);
  table_case(text, 1, "", "the same table with its count as written loads");
}

typedef struct { const fd_plan *p; const fd_args *a; int rounds, failures; } runner;

/* Thread body: run a plan repeatedly. */
static void *run_loop(void *arg) {
  runner *r = arg;
  for (int i = 0; i < r->rounds; i++) r->failures += fd_run(r->p, r->a) != 0;
  return NULL;
}

/* Two threads running two plans of one context at once give the serial results. */
static void concurrent_runs(void) {
  fd_ctx *c = fd_create(&(fd_config){ .threads = 2 });
  kproblem k1, k2;
  kp_init(&k1, 2, 8, 2, 64, 700, 0, 1, 0, 0, 0, 11);
  kp_init(&k2, 1, 4, 4, 128, 900, 2, 2, 2, 2, 1, 12);
  fd_shape s1 = { 2, 8, 2, 64, 700, FD_F32, FD_F16, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  fd_shape s2 = { 1, 4, 4, 128, 900, FD_BF16, FD_BF16, FD_BF16, FD_FULL, FD_BSHD, 0 };
  fd_plan *p1, *p2;
  if (!t_check(fd_plan_create_opts(c, &s1, &(fd_plan_opts){ .splits = 3 }, &p1) == 0 &&
               fd_plan_create(c, &s2, &p2) == 0, "concurrent: plans")) return;
  float o1[2 * 8 * 64], l1[16], r1[2 * 8 * 64], rl1[16];
  uint16_t o2[4 * 128], r2[4 * 128];
  fd_args a1 = { k1.q, k1.k, k1.v, k1.cur_pos, NULL, NULL, NULL, NULL, 0, r1, rl1 };
  fd_args a2 = { k2.q, k2.k, k2.v, NULL, NULL, NULL, NULL, NULL, 0, r2, NULL };
  fd_run(p1, &a1);
  fd_run(p2, &a2);                           /* serial reference results */
  a1.out = o1; a1.lse = l1; a2.out = o2;
  runner t1 = { p1, &a1, 200, 0 }, t2 = { p2, &a2, 200, 0 };
  pthread_t th1, th2;
  pthread_create(&th1, NULL, run_loop, &t1);
  pthread_create(&th2, NULL, run_loop, &t2);
  pthread_join(th1, NULL);
  pthread_join(th2, NULL);
  t_check(t1.failures == 0 && t2.failures == 0, "concurrent runs all succeed");
  t_check(!memcmp(o1, r1, sizeof o1) && !memcmp(l1, rl1, sizeof l1) && !memcmp(o2, r2, sizeof o2),
          "concurrent runs give the serial results bit for bit");
  fd_plan_destroy(p1); fd_plan_destroy(p2); fd_destroy(c);
  kp_free(&k1); kp_free(&k2);
}

/* A cache of more than 2^31 elements: batch row 1 starts past element 2^31. */
static void big_cache(void) {
  const int B = 2, D = 64;
  const int64_t S = ((int64_t)1 << 25) + 1, n = (int64_t)B * S * D;       /* 2^32 + 128 elements */
  uint16_t *k = mmap(NULL, (size_t)n * 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  uint16_t *v = mmap(NULL, (size_t)n * 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (!t_check(k != MAP_FAILED && v != MAP_FAILED, "map 2 x 8 GiB of address space")) return;
  kproblem small;                            /* the same keys, compact, for the reference */
  kp_init(&small, B, 4, 1, D, 40, 0, 1, 0, 0, 0, 13);
  small.cur_pos[0] = 30; small.cur_pos[1] = 39;
  for (int b = 0; b < B; b++)
    for (int64_t i = 0; i < 40; i++)
      for (int d = 0; d < D; d++) {
        k[((int64_t)b * S + i) * D + d] = ((uint16_t *)small.k)[((int64_t)b * 40 + i) * D + d];
        v[((int64_t)b * S + i) * D + d] = ((uint16_t *)small.v)[((int64_t)b * 40 + i) * D + d];
      }
  fd_shape s = { B, 4, 1, D, S, FD_F32, FD_F16, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  fd_plan *p;
  float out[2 * 4 * 64], lse[8];
  double rout[2 * 4 * 64], rlse[8];
  if (t_check(fd_plan_create(ctx, &s, &p) == 0, "big cache: plan: %s", fd_errmsg(ctx))) {
    fd_args a = { small.q, k, v, small.cur_pos, NULL, NULL, NULL, NULL, 0, out, lse };
    if (t_check(fd_run(p, &a) == 0, "big cache: run: %s", fd_errmsg(ctx))) {
      ref_attention(&small.ref, rout, rlse);
      t_compare(&small, out, lse, rout, rlse, 1, "cache of 2^32 elements, row 1 past 2^31");
    }
    fd_plan_destroy(p);
  }
  munmap(k, (size_t)n * 2); munmap(v, (size_t)n * 2);
  kp_free(&small);
}

/* The isa a plan uses for shape s in context c (-1 when planning fails). */
static int plan_isa(fd_ctx *c, fd_shape s, int forced) {
  fd_plan *p;
  fd_plan_info info;
  if (fd_plan_create_opts(c, &s, &(fd_plan_opts){ .isa = forced }, &p)) return -1;
  fd_plan_info_get(p, s.kv_len, &info);
  fd_plan_destroy(p);
  return info.isa;
}

/* The heuristic tile of 16 query heads per kv head: 16 (the head-lane kernel)
   on AVX-512, 8 when head_dim 72 sends the plan to AVX2 (which holds 12 heads
   at most), 8 for int8 and fp8 K/V (no head-lane kernel). */
static void heuristic_tiles(void) {
  static const struct { int D; fd_dtype kv; int isa, tile; } c[] = {
    { 64, FD_F16, 2, 16 }, { 72, FD_F16, 1, 8 }, { 64, FD_I8, 2, 8 }, { 64, FD_FP8_E5M2, 2, 8 },
  };
  for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
    fd_shape s = { 2, 32, 2, c[i].D, 300, FD_F32, c[i].kv, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
    fd_plan *p;
    fd_plan_info info = { 0 };
    if (!t_check(fd_plan_create(ctx, &s, &p) == 0, "G 16, D %d: plan: %s", c[i].D, fd_errmsg(ctx))) continue;
    fd_plan_info_get(p, 300, &info);
    int want = c[i].isa == 2 ? fd_cpu_max_isa() : c[i].isa;   /* AVX-512 or the best record above it */
    t_check(info.isa == want && info.group_tile == c[i].tile, "G 16, D %d, kv %d: isa %d tile %d (want %d, %d)",
            c[i].D, c[i].kv, info.isa, info.group_tile, want, c[i].tile);
    fd_plan_destroy(p);
  }
}

/* ISA choice: the best the CPU has by default, lowered by config or $FD_MAX_ISA,
   forced per plan, and a lower one when a head_dim has no vector variant. */
static void isa_choice(void) {
  int best = fd_cpu_max_isa();
  fd_shape s = { 1, 8, 2, 128, 300, FD_F32, FD_F16, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  printf("note: this CPU's best isa digit is %d\n", best);
  t_check(plan_isa(ctx, s, 0) == best, "default plan uses isa %d (got %d)", best, plan_isa(ctx, s, 0));
  fd_ctx *c = fd_create(&(fd_config){ .threads = 1, .isa_limit = FD_ISA_C });
  t_check(c && fd_ctx_max_isa(c) == 0 && plan_isa(c, s, 0) == 0, "config.isa_limit FD_ISA_C gives portable C");
  fd_destroy(c);
  setenv("FD_MAX_ISA", "0", 1);
  c = fd_create(&(fd_config){ .threads = 1 });
  t_check(c && fd_ctx_max_isa(c) == 0, "FD_MAX_ISA=0 lowers the context to portable C");
  fd_destroy(c);
  unsetenv("FD_MAX_ISA");
  if (best >= 1) {
    t_check(plan_isa(ctx, s, FD_ISA_AVX2) == 1, "opts.isa FD_ISA_AVX2 is honoured");
    t_check(plan_isa(ctx, s, FD_ISA_C) == 0, "opts.isa FD_ISA_C is honoured");
    fd_shape odd = s;
    odd.head_dim = 7;
    t_check(plan_isa(ctx, odd, 0) == 0, "head_dim 7 falls back to portable C");
  }
  if (best >= 2) {
    fd_shape d72 = s;
    d72.head_dim = 72;
    t_check(plan_isa(ctx, d72, 0) == 1, "head_dim 72 falls back from AVX-512 to AVX2");
    plan_refused(d72, &(fd_plan_opts){ .isa = FD_ISA_AVX512 }, FD_ECOMPILE, "field head_dim: 72 is not a multiple",
                 "forced AVX-512 with head_dim 72 is refused, naming the field");
    heuristic_tiles();
  } else {
    printf("note: this CPU lacks AVX-512: forced-AVX-512 checks skipped\n");
    t_check(!fd_create(&(fd_config){ .isa_limit = FD_ISA_AVX512 }) && strstr(fd_errmsg(NULL), "lacks"),
            "config.isa_limit above the CPU is refused");
  }
}

/* The ISA records' order by what they need (one fallback chain): AVX-512+VNNI
   (digit 4) ranks between AVX-512 and AVX-512+BF16+VNNI (digit 3). A context
   limited to AVX-512+VNNI refuses a forced isa 3; a CPU with VNNI but no BF16
   is limited to it by default and refuses isa_limit AVX-512+BF16. */
static void isa_ranks(void) {
  static const struct { int isa, max, within; } c[] = {
    { 4, 3, 1 }, { 3, 4, 0 }, { 2, 4, 1 }, { 4, 2, 0 }, { 3, 3, 1 }, { 0, 4, 1 }, { 1, 0, 0 }, { 5, 4, 0 }, { 2, -1, 0 },
  };
  for (size_t i = 0; i < sizeof c / sizeof *c; i++)
    t_check(fd_isa_within(c[i].isa, c[i].max) == c[i].within, "fd_isa_within(%d, %d) is %d", c[i].isa, c[i].max,
            c[i].within);
  t_check(!fd_cpu_has_isa(3) || fd_cpu_has_isa(4), "a CPU with isa 3 has isa 4 (its fallback)");
  for (int isa = 0; isa < FD_ISA_COUNT; isa++)
    t_check(fd_cpu_has_isa(isa) == fd_isa_within(isa, fd_cpu_max_isa()),
            "isa %d: present exactly when it ranks at most the best (%d)", isa, fd_cpu_max_isa());
  fd_shape s = { 1, 8, 2, 128, 300, FD_F32, FD_I8, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  if (!fd_cpu_has_isa(4)) { printf("note: this CPU lacks AVX-512+VNNI: its context checks skipped\n"); return; }
  fd_ctx *c4 = fd_create(&(fd_config){ .threads = 1, .isa_limit = FD_ISA_AVX512_VNNI });
  t_check(c4 && fd_ctx_max_isa(c4) == 4, "config.isa_limit FD_ISA_AVX512_VNNI: best isa 4");
  fd_plan *p = NULL;
  int rc = c4 ? fd_plan_create_opts(c4, &s, &(fd_plan_opts){ .isa = FD_ISA_AVX512_BF16 }, &p) : -1;
  t_check(rc == FD_EUNSUPPORTED && !p && strstr(fd_errmsg(c4), "not available in this context"),
          "isa_limit AVX-512+VNNI refuses a forced AVX-512+BF16 (rc %d: %s)", rc, c4 ? fd_errmsg(c4) : "");
  t_check(c4 && plan_isa(c4, s, FD_ISA_AVX512) == 2, "isa_limit AVX-512+VNNI allows a forced AVX-512");
  fd_destroy(c4);
  setenv("FD_MAX_ISA", "4", 1);
  c4 = fd_create(&(fd_config){ .threads = 1 });
  t_check(c4 && fd_ctx_max_isa(c4) == 4, "FD_MAX_ISA=4: best isa 4 (got %d)", c4 ? fd_ctx_max_isa(c4) : -1);
  fd_destroy(c4);
  setenv("FD_MAX_ISA", "3", 1);
  c4 = fd_create(&(fd_config){ .threads = 1 });
  t_check(c4 && fd_ctx_max_isa(c4) == (fd_cpu_has_isa(3) ? 3 : 4), "FD_MAX_ISA=3 raises no context above its CPU");
  fd_destroy(c4);
  unsetenv("FD_MAX_ISA");
  if (!fd_cpu_has_isa(3)) {
    t_check(fd_cpu_max_isa() == 4, "VNNI without BF16: the best isa is 4");
    t_check(!fd_create(&(fd_config){ .isa_limit = FD_ISA_AVX512_BF16 }) && strstr(fd_errmsg(NULL), "lacks"),
            "VNNI without BF16: config.isa_limit FD_ISA_AVX512_BF16 is refused");
  }
}

/* The heuristic isa (fd_heuristic_isa): a record with bf16 dot products gives
   way to its fallback (f32 FMA scores) for bf16 q and K on a CPU whose FMAs
   are faster (Intel's), unless fast precision would serve; then, on a CPU with
   AVX512-BF16, the plans' isa digits say the same. */
static void heuristic_isas(void) {
  static const struct { fd_dtype q, kv; int max, fast, fma_bf16, want; } c[] = {
    { FD_BF16, FD_BF16, 3, 0, 1, 4 }, { FD_BF16, FD_BF16, 3, 0, 0, 3 }, { FD_BF16, FD_BF16, 3, 1, 1, 3 },
    { FD_F32, FD_BF16, 3, 0, 1, 3 },  { FD_BF16, FD_F16, 3, 0, 1, 3 },  { FD_BF16, FD_I8, 3, 0, 1, 3 },
    { FD_BF16, FD_BF16, 4, 0, 1, 4 }, { FD_BF16, FD_BF16, 2, 0, 1, 2 }, { FD_BF16, FD_BF16, 0, 0, 1, 0 },
  };
  for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
    fd_shape s = { 1, 32, 8, 128, 300, c[i].q, c[i].kv, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
    int got = fd_heuristic_isa(&s, c[i].max, c[i].fast, c[i].fma_bf16);
    t_check(got == c[i].want, "heuristic isa: q %d kv %d, best %d, fast %d, fma_bf16 %d: %d (want %d)", c[i].q, c[i].kv,
            c[i].max, c[i].fast, c[i].fma_bf16, got, c[i].want);
  }
  char line[256], vendor[64] = "";
  FILE *f = fopen("/proc/cpuinfo", "r");
  while (f && !vendor[0] && fgets(line, sizeof line, f))
    if (!strncmp(line, "vendor_id", 9) && strchr(line, ':')) sscanf(strchr(line, ':') + 1, "%63s", vendor);
  if (f) fclose(f);
  if (vendor[0])
    t_check(fd_cpu_intel() == !strcmp(vendor, "GenuineIntel"), "fd_cpu_intel() %d for /proc/cpuinfo's vendor_id %s",
            fd_cpu_intel(), vendor);
  if (!fd_cpu_has_isa(3)) { printf("note: this CPU lacks AVX512-BF16: the heuristic isa's plan checks skipped\n"); return; }
  int fma = fd_cpu_intel() ? 4 : 3;
  fd_shape hl = { 1, 64, 4, 64, 300, FD_BF16, FD_BF16, FD_BF16, FD_CAUSAL, FD_BHSD, 0 };   /* tile 16 */
  fd_shape g4 = { 1, 16, 4, 64, 300, FD_BF16, FD_BF16, FD_BF16, FD_CAUSAL, FD_BHSD, 0 };   /* tile 4 */
  t_check(plan_isa(ctx, hl, 0) == fma, "bf16 q and K, head-lane tile: isa %d (want %d)", plan_isa(ctx, hl, 0), fma);
  t_check(plan_isa(ctx, hl, FD_ISA_AVX512_BF16) == 3, "a forced FD_ISA_AVX512_BF16 is honoured");
  fd_ctx *fast = fd_create(&(fd_config){ .threads = 1, .precision = FD_PRECISION_FAST });
  t_check(fast && plan_isa(fast, g4, 0) == 3, "fast precision served (tile 4): isa 3");
  t_check(fast && plan_isa(fast, hl, 0) == 3, "fast precision served (head-lane tile 16): isa 3");
  fd_destroy(fast);
}

/* Machine slugs (fd_machine_slug, fd_machine_name's rule): brand strings as
   CPUs give them, the corner cases, the isa suffix, and a buffer too short. */
static void machine_slugs(void) {
  static const struct { const char *model; long cores; const char *isa, *slug; } c[] = {
    { "AMD EPYC", 2, "avx512bf16", "amd-epyc-2c-avx512bf16" },
    { "AMD EPYC", 2, "avx2", "amd-epyc-2c-avx2" },
    { "Intel(R) Xeon(R) Processor", 2, "avx512vnni", "intel-xeon-2c-avx512vnni" },
    { "AMD EPYC 9654 96-Core Processor", 16, NULL, "amd-epyc-9654-16c" },
    { "Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz", 12, "", "intel-core-i7-8700-12c" },
    { "Intel(R) Xeon(R) Platinum 8592+", 4, "avx512bf16", "intel-xeon-platinum-8592-4c-avx512bf16" },
    { "  AMD Ryzen 9 7950X 16-Core Processor  ", 32, "avx512bf16", "amd-ryzen-9-7950x-32c-avx512bf16" },
    { "Coprocessor 8-Cores", 1, "c", "coprocessor-8-cores-1c-c" },
    { "", 2, "avx2", "cpu-2c-avx2" },
    { "(R) CPU @ 2.0GHz", 8, NULL, "cpu-8c" },
  };
  char out[64];
  for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
    int r = fd_machine_slug(c[i].model, c[i].cores, c[i].isa, out, sizeof out);
    t_check(r == 0 && strcmp(out, c[i].slug) == 0, "machine slug of '%s' on %ld cores, isa %s: '%s' (want '%s')",
            c[i].model, c[i].cores, c[i].isa ? c[i].isa : "NULL", r == 0 ? out : "(failed)", c[i].slug);
  }
  t_check(fd_machine_slug("AMD EPYC", 2, "avx2", out, 16) == -1 && fd_machine_slug("AMD EPYC", 2, "avx2", out, 17) == 0,
          "machine slug: 'amd-epyc-2c-avx2' needs 17 bytes (refused in 16)");
  char want[64];
  snprintf(want, sizeof want, "-%s", fd_isa_table[fd_cpu_max_isa()].name);
  t_check(fd_machine_slug(fd_cpu_model(), sysconf(_SC_NPROCESSORS_ONLN), fd_isa_table[fd_cpu_max_isa()].name, out,
                          sizeof out) == 0 && strcmp(out, fd_machine_name()) == 0 &&
          strlen(out) > strlen(want) && strcmp(out + strlen(out) - strlen(want), want) == 0,
          "fd_machine_name '%s' is the slug of this CPU's model '%s' and ends in its best isa '%s'", fd_machine_name(),
          fd_cpu_model(), want);
}

int main(void) {
  machine_slugs();
  ctx = fd_create(&(fd_config){ .threads = 2 });
  if (!t_check(ctx != NULL, "fd_create: %s", fd_errmsg(NULL))) return t_done();
  bad_configs();
  bad_shapes();
  bad_args();
  destroyed_context();
  tuned_tables();
  concurrent_runs();
  big_cache();
  isa_choice();
  isa_ranks();
  heuristic_isas();
  fd_destroy(ctx);
  kx_cleanup();
  return t_done();
}
