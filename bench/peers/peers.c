/* `make bench-peers` harness: flashdecode's fd_run and ggml's ggml_flash_attn_ext
   (llama.cpp's CPU flash attention) timed side by side on the same inputs, for
   one shape and kv length per invocation, at each requested thread count.
   - Same values: q, K and V are filled once; ggml reads our BHSD K/V buffers
     in place (its [D, S, Hkv, B] tensor is the same memory), q in f32 (ggml's
     q type), and for int8 KV a q8_0 copy whose blocks carry our row scale
     (an f16 value) and our int8 codes, so both dequantize to the same numbers.
     Every conversion happens before timing: no KV copy in a timed call.
   - Causal with cur_pos = kv_len - 1 (every key valid), so ggml runs unmasked.
   - Cold cache: a buffer of 4x the LLC is written before every timed call;
     rounds interleave the two libraries and alternate their order.
   - Both outputs are compared with a double-precision reference
     (tools/fdgen/ref.c) and the largest absolute error is printed.
   - Each library uses its own persistent thread pool: flashdecode one context
     per thread count (the tuned table given by table=), ggml one threadpool per
     thread count with polling off (poll = 0: otherwise its workers spin for
     ~100 ms after each graph and take a core from the next measurement) and,
     unless pin=0, its threads pinned one per core (ggml's strict CPU
     placement; the caller's pin is set and undone around each call, untimed).
   Usage: fdpeers name=N batch=B hq=H hkv=H d=D len=S q=f16 kv=f16 out=f16
          [threads=2,1] [target=0.5] [rmin=5] [rmax=31] [table=path] [peer=0|1] [pin=0|1]
   dtypes f32 f16 bf16, kv also int8. Output: tab-separated lines on stdout
   (machine, shape, bw, plan, time, err, note); see bench/peers/peers.lua which reads them. */
#include "bw.h"
#include "dtype.h"
#include "flashdecode.h"
#include "ref.h"
#include "util.h"
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef FDP_GGML
#include "ggml-cpu.h"
#include "ggml.h"
#endif

enum { DT_F32 = 0, DT_F16 = 1, DT_BF16 = 2, DT_I8 = 3, MAX_THREADS = 8, MAX_IMPL = 2 };

/* One invocation's settings. */
typedef struct cfg {
  char name[64], table[1024];
  int B, Hq, Hkv, D, qdt, kvdt, odt, peer, pin, rmin, rmax, nthreads, threads[MAX_THREADS];
  long long S;
  double target_s;
} cfg;

/* A ggml q8_0 block: one f16 scale and 32 int8 codes (ggml-common.h's layout). */
typedef struct q8_block { uint16_t d; int8_t qs[32]; } q8_block;
_Static_assert(sizeof(q8_block) == 34, "q8_0 block is 34 bytes");

/* The problem's buffers, shared by both libraries and the reference. */
typedef struct inputs {
  void *q, *k, *v;           /* ours: q in q dtype, K/V [B,Hkv,S,D] in kv dtype (int8 codes) */
  float *q32, *ks, *vs;      /* q as f32 (ggml); int8 row scales [B,Hkv,S] */
  q8_block *gk, *gv;         /* int8 only: the same values as ggml q8_0 */
  double *ref, ref_max;      /* [B,Hq,D] double-precision output and its largest |value| */
  int32_t *cur_pos;
  size_t nq, nkv, rows;      /* elements of q, of K, and K rows */
} inputs;

/* One timed implementation: a call (with optional untimed steps before and after
   it), its output and its timings. */
typedef struct impl {
  const char *name;
  int (*call)(void *arg);
  void (*before)(void *arg), (*after)(void *arg);
  void *arg;
  const void *out;
  int out_dt;
  double kv_bytes, first_s, *t;
  int n;
} impl;

/* Print a note line "note<TAB>prefix msg", tabs and newlines in msg made spaces. */
static void note(const char *prefix, const char *msg) {
  printf("note\t%s", prefix);
  for (const char *p = msg; *p; p++) putchar(*p == '\t' || *p == '\n' ? ' ' : *p);
  putchar('\n');
}

/* Print a note line and exit with status 2 (bad usage or setup failure). */
static void die(const char *what) {
  note("error: ", what);
  fprintf(stderr, "fdpeers: %s\n", what);
  exit(2);
}

/* dtype index of a name ("f32" "f16" "bf16", "int8" where allowed), or -1. */
static int dtype_of(const char *s, int allow_int8) {
  static const char *const names[] = { "f32", "f16", "bf16", "int8" };
  for (int i = 0; i < 3 + allow_int8; i++) if (!strcmp(s, names[i])) return i;
  return -1;
}

/* Parse "a,b,c" thread counts into c->threads. */
static void parse_threads(cfg *c, const char *s) {
  c->nthreads = 0;
  for (char *e; *s && c->nthreads < MAX_THREADS; s = *e ? e + 1 : e) {
    long t = strtol(s, &e, 10);
    if (t < 1 || t > 1024 || (*e && *e != ',')) die("threads= must be a comma list of counts 1..1024");
    c->threads[c->nthreads++] = (int)t;
  }
}

/* Set one key=value option; dies naming the key on a bad one. */
static void set_opt(cfg *c, const char *key, const char *val) {
  struct { const char *k; int *dst; int lo, hi; } ints[] = {
    { "batch", &c->B, 1, 4096 }, { "hq", &c->Hq, 1, 4096 }, { "hkv", &c->Hkv, 1, 4096 },
    { "d", &c->D, 1, 1024 }, { "rmin", &c->rmin, 1, 10000 }, { "rmax", &c->rmax, 1, 10000 },
    { "peer", &c->peer, 0, 1 }, { "pin", &c->pin, 0, 1 } };
  struct { const char *k; int *dst; int int8; } dts[] = {
    { "q", &c->qdt, 0 }, { "kv", &c->kvdt, 1 }, { "out", &c->odt, 0 } };
  char msg[160];
  for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
    if (strcmp(key, ints[i].k)) continue;
    char *e;
    long x = strtol(val, &e, 10);
    snprintf(msg, sizeof msg, "%s=%s: want an integer %d..%d", key, val, ints[i].lo, ints[i].hi);
    if (*e || x < ints[i].lo || x > ints[i].hi) die(msg);
    *ints[i].dst = (int)x;
    return;
  }
  for (size_t i = 0; i < sizeof dts / sizeof *dts; i++) {
    if (strcmp(key, dts[i].k)) continue;
    snprintf(msg, sizeof msg, "%s=%s: want f32, f16, bf16%s", key, val, dts[i].int8 ? " or int8" : "");
    if ((*dts[i].dst = dtype_of(val, dts[i].int8)) < 0) die(msg);
    return;
  }
  if (!strcmp(key, "name")) snprintf(c->name, sizeof c->name, "%s", val);
  else if (!strcmp(key, "table")) snprintf(c->table, sizeof c->table, "%s", val);
  else if (!strcmp(key, "threads")) parse_threads(c, val);
  else if (!strcmp(key, "len")) c->S = atoll(val);
  else if (!strcmp(key, "target")) c->target_s = atof(val);
  else { snprintf(msg, sizeof msg, "unknown option %s", key); die(msg); }
}

/* Settings from argv (key=value words), checked for consistency. */
static cfg parse_args(int argc, char **argv) {
  cfg c = { .name = "shape", .B = 1, .Hq = 32, .Hkv = 8, .D = 128, .S = 16384, .qdt = 1, .kvdt = 1, .odt = 1,
            .peer = 1, .pin = 1, .rmin = 5, .rmax = 31, .nthreads = 1, .threads = { 2 }, .target_s = 0.5 };
  for (int i = 1; i < argc; i++) {
    char key[32];
    const char *eq = strchr(argv[i], '=');
    if (!eq || eq - argv[i] >= (long)sizeof key) die("arguments are key=value words (see the file's header)");
    snprintf(key, sizeof key, "%.*s", (int)(eq - argv[i]), argv[i]);
    set_opt(&c, key, eq + 1);
  }
  if (c.Hq % c.Hkv) die("hq must be a multiple of hkv");
  if (c.S < 1 || c.S > ((long long)1 << 30)) die("len must be 1..2^30");
  if (c.kvdt == DT_I8 && c.D % 32) die("kv=int8 needs d a multiple of 32 (ggml q8_0 blocks)");
  if (c.rmin > c.rmax) die("rmin must be <= rmax");
  return c;
}

/* Memory from fdb_alloc, or exit naming what failed. */
static void *must_alloc(size_t bytes, const char *what) {
  void *p = fdb_alloc(bytes ? bytes : 64);
  if (!p) die(what);
  return p;
}

/* Bytes per stored element of dtype (int8 codes: 1). */
static size_t dt_size(int dt) { return dt == DT_I8 ? 1 : fdb_dtype_size(dt); }

/* An f32 value rounded to the nearest f16 (so it is exact as a q8_0 scale). */
static float to_f16_value(float x) { return fdb_f16_to_f32(fdb_f32_to_f16(x)); }

/* int8 codes in -127..127 from uniform values, and f16-exact row scales. */
static void fill_int8(int8_t *codes, float *scales, size_t n, size_t rows, uint64_t seed) {
  float *tmp = must_alloc(n * sizeof(float), "out of memory (int8 fill)");
  fdb_fill(tmp, n, DT_F32, seed, -1.0f, 1.0f);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) codes[i] = (int8_t)lrintf(tmp[i] * 127.0f);
  free(tmp);
  fdb_fill(scales, rows, DT_F32, seed + 100, 0.5f / 127, 1.5f / 127);
  for (size_t r = 0; r < rows; r++) scales[r] = to_f16_value(scales[r]);
}

/* The same int8 values as q8_0 blocks: each block takes its row's scale. */
static q8_block *to_q8_0(const int8_t *codes, const float *scales, size_t rows, int D) {
  size_t per_row = (size_t)D / 32;
  q8_block *b = must_alloc(rows * per_row * sizeof(q8_block), "out of memory (q8_0 copy)");
#pragma omp parallel for schedule(static)
  for (size_t r = 0; r < rows; r++)
    for (size_t j = 0; j < per_row; j++) {
      b[r * per_row + j].d = fdb_f32_to_f16(scales[r]);
      memcpy(b[r * per_row + j].qs, codes + r * (size_t)D + j * 32, 32);
    }
  return b;
}

/* Element i of K or V as a float (int8: code x row scale). */
static float kv_value(const cfg *c, const void *buf, const float *scales, size_t i) {
  if (c->kvdt == DT_I8) return (float)((const int8_t *)buf)[i] * scales[i / (size_t)c->D];
  return fdb_load(c->kvdt, buf, i);
}

/* Reference output of kv head (b, j): its G query heads, in double, into in->ref. */
static void ref_head(const cfg *c, inputs *in, int b, int j, float *k32, float *v32) {
  int G = c->Hq / c->Hkv;
  size_t base = ((size_t)b * c->Hkv + j) * (size_t)c->S * c->D, n = (size_t)c->S * c->D;
  float q32[G * c->D];
  for (size_t i = 0; i < n; i++) {
    k32[i] = kv_value(c, in->k, in->ks, base + i);
    v32[i] = kv_value(c, in->v, in->vs, base + i);
  }
  size_t qoff = ((size_t)b * c->Hq + (size_t)j * G) * c->D;
  for (int i = 0; i < G * c->D; i++) q32[i] = in->q32[qoff + i];
  int32_t pos = (int32_t)(c->S - 1);
  double lse[G];
  ref_problem p = { .B = 1, .Hq = G, .Hkv = 1, .D = c->D, .S = c->S, .mask_mode = 0, .layout = 0,
                    .q = q32, .k = k32, .v = v32, .cur_pos = &pos, .scale = 1.0 / sqrt((double)c->D) };
  ref_attention(&p, in->ref + qoff, lse);
}

/* The double-precision reference of every (b, kv head), in parallel. */
static void reference(const cfg *c, inputs *in) {
  in->ref = malloc(in->nq * sizeof(double));
  if (!in->ref) die("out of memory (reference)");
  int heads = c->B * c->Hkv, fail = 0;
#pragma omp parallel reduction(| : fail)
  {
    size_t n = (size_t)c->S * c->D;
    float *k32 = malloc(n * sizeof(float)), *v32 = malloc(n * sizeof(float));
    fail = !k32 || !v32;
#pragma omp for schedule(dynamic)
    for (int h = 0; h < heads; h++) if (!fail) ref_head(c, in, h / c->Hkv, h % c->Hkv, k32, v32);
    free(k32);
    free(v32);
  }
  if (fail) die("out of memory (reference K/V)");
  in->ref_max = 0;
  for (size_t i = 0; i < in->nq; i++) in->ref_max = fmax(in->ref_max, fabs(in->ref[i]));
}

/* Fill q, K and V (seeds 1, 2, 3, values in [-1, 1)) and the peers' views of them. */
static inputs make_inputs(const cfg *c) {
  inputs in = { 0 };
  in.nq = (size_t)c->B * c->Hq * c->D;
  in.rows = (size_t)c->B * c->Hkv * (size_t)c->S;
  in.nkv = in.rows * c->D;
  in.q = must_alloc(in.nq * fdb_dtype_size(c->qdt), "out of memory (q)");
  in.q32 = must_alloc(in.nq * sizeof(float), "out of memory (q f32)");
  in.k = must_alloc(in.nkv * dt_size(c->kvdt), "out of memory (K)");
  in.v = must_alloc(in.nkv * dt_size(c->kvdt), "out of memory (V)");
  in.cur_pos = must_alloc((size_t)c->B * sizeof(int32_t), "out of memory (cur_pos)");
  for (int b = 0; b < c->B; b++) in.cur_pos[b] = (int32_t)(c->S - 1);
  fdb_fill(in.q, in.nq, c->qdt, 1, -1.0f, 1.0f);
  for (size_t i = 0; i < in.nq; i++) in.q32[i] = fdb_load(c->qdt, in.q, i);
  if (c->kvdt == DT_I8) {
    in.ks = must_alloc(in.rows * sizeof(float), "out of memory (k_scale)");
    in.vs = must_alloc(in.rows * sizeof(float), "out of memory (v_scale)");
    fill_int8(in.k, in.ks, in.nkv, in.rows, 2);
    fill_int8(in.v, in.vs, in.nkv, in.rows, 3);
    in.gk = to_q8_0(in.k, in.ks, in.rows, c->D);
    in.gv = to_q8_0(in.v, in.vs, in.rows, c->D);
  } else {
    fdb_fill(in.k, in.nkv, c->kvdt, 2, -1.0f, 1.0f);
    fdb_fill(in.v, in.nkv, c->kvdt, 3, -1.0f, 1.0f);
  }
  reference(c, &in);
  return in;
}

/* ---- flashdecode ---- */

/* A context, plan and arguments for one thread count. */
typedef struct fd_side { fd_ctx *ctx; fd_plan *plan; fd_args args; void *out; } fd_side;

/* One timed flashdecode call. */
static int fd_call(void *arg) { fd_side *s = arg; return fd_run(s->plan, &s->args); }

/* Context (tuned table when given), plan and args at `threads`; prints its plan line. */
static void fd_setup(fd_side *s, const cfg *c, const inputs *in, int threads) {
  fd_config fc = { .threads = threads, .table = c->table[0] ? c->table : NULL };
  char msg[1200];
  if (!(s->ctx = fd_create(&fc))) { snprintf(msg, sizeof msg, "fd_create: %s", fd_errmsg(NULL)); die(msg); }
  if (c->table[0] && fd_errmsg(s->ctx)[0]) note("table: ", fd_errmsg(s->ctx));
  fd_shape sh = { .batch = c->B, .n_q_heads = c->Hq, .n_kv_heads = c->Hkv, .head_dim = c->D, .kv_len = c->S,
                  .q_dtype = c->qdt, .kv_dtype = c->kvdt, .out_dtype = c->odt, .mask_mode = FD_CAUSAL,
                  .layout = FD_BHSD };
  if (fd_plan_create(s->ctx, &sh, &s->plan)) {
    snprintf(msg, sizeof msg, "fd_plan_create: %s", fd_errmsg(s->ctx));
    die(msg);
  }
  s->out = must_alloc(in->nq * fdb_dtype_size(c->odt), "out of memory (out)");
  s->args = (fd_args){ .q = in->q, .k = in->k, .v = in->v, .cur_pos = in->cur_pos, .k_scale = in->ks,
                       .v_scale = in->vs, .out = s->out };
  fd_plan_info pi;
  if (fd_plan_info_get(s->plan, c->S, &pi) == 0)
    printf("plan\t%d\t%s\t%d\t%d\t%d\t%d\t%d\n", threads, pi.key, pi.chunk, pi.group_tile, pi.splits, pi.threads,
           pi.from_table);
}

/* Free a flashdecode side. */
static void fd_teardown(fd_side *s) {
  fd_plan_destroy(s->plan);
  fd_destroy(s->ctx);
  free(s->out);
}

/* KV bytes flashdecode reads: K and V rows, plus the int8 row scales. */
static double fd_kv_bytes(const cfg *c, const inputs *in) {
  return 2.0 * (double)in->nkv * (double)dt_size(c->kvdt) + (c->kvdt == DT_I8 ? 2.0 * (double)in->rows * 4 : 0);
}

/* ---- ggml ---- */
#ifdef FDP_GGML
/* The graph (built once) and one threadpool + plan per thread count. */
typedef struct gg_side {
  struct ggml_context *ctx;
  struct ggml_cgraph *gf;
  struct ggml_cplan plan;
  struct ggml_threadpool *tp;
  void *work;
  float *out;
  int pinned;
  cpu_set_t pin, all;       /* the caller's cpu during ggml calls, and its usual set */
} gg_side;

/* One timed ggml call. */
static int gg_call(void *arg) {
  gg_side *s = arg;
  return ggml_graph_compute(s->gf, &s->plan) == GGML_STATUS_SUCCESS ? 0 : -1;
}

/* ggml's K/V tensor type for our kv dtype. */
static enum ggml_type gg_type(int kvdt) {
  static const enum ggml_type t[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0 };
  return t[kvdt];
}

/* A tensor of ggml_flash_attn_ext's input over caller memory (no copy). */
static struct ggml_tensor *gg_view(struct ggml_context *ctx, enum ggml_type t, const cfg *c, int64_t rows_dim,
                                   int heads, void *data) {
  struct ggml_tensor *x = ggml_new_tensor_4d(ctx, t, c->D, rows_dim, heads, c->B);
  x->data = data;
  return x;
}

/* q [D, 1, Hq, B] f32, K/V [D, S, Hkv, B], out [D, Hq, 1, B] f32: the graph of one op. */
static void gg_build(gg_side *s, const cfg *c, const inputs *in) {
  struct ggml_init_params ip = { .mem_size = 16 * ggml_tensor_overhead() + ggml_graph_overhead() + 4096,
                                 .mem_buffer = NULL, .no_alloc = true };
  if (!(s->ctx = ggml_init(ip))) die("ggml_init failed");
  enum ggml_type t = gg_type(c->kvdt);
  int i8 = c->kvdt == DT_I8;
  struct ggml_tensor *q = gg_view(s->ctx, GGML_TYPE_F32, c, 1, c->Hq, in->q32);
  struct ggml_tensor *k = gg_view(s->ctx, t, c, c->S, c->Hkv, i8 ? (void *)in->gk : in->k);
  struct ggml_tensor *v = gg_view(s->ctx, t, c, c->S, c->Hkv, i8 ? (void *)in->gv : in->v);
  size_t want = i8 ? in->rows * (size_t)(c->D / 32) * sizeof(q8_block) : in->nkv * dt_size(c->kvdt);
  if (ggml_nbytes(k) != want) die("ggml's K tensor size differs from our K buffer (q8_0 block layout?)");
  struct ggml_tensor *o = ggml_flash_attn_ext(s->ctx, q, k, v, NULL, 1.0f / sqrtf((float)c->D), 0.0f, 0.0f);
  if (ggml_nbytes(o) != in->nq * sizeof(float)) die("ggml output size is not B*Hq*D floats");
  s->out = must_alloc(in->nq * sizeof(float), "out of memory (ggml out)");
  o->data = s->out;
  s->gf = ggml_new_graph(s->ctx);
  ggml_build_forward_expand(s->gf, o);
}

/* Before a ggml call (untimed): the caller onto its pinned cpu. */
static void gg_before(void *arg) {
  gg_side *s = arg;
  if (s->pinned) pthread_setaffinity_np(pthread_self(), sizeof s->pin, &s->pin);
}

/* After a ggml call (untimed): the caller back on every cpu it had. */
static void gg_after(void *arg) {
  gg_side *s = arg;
  if (s->pinned) pthread_setaffinity_np(pthread_self(), sizeof s->all, &s->all);
}

/* Strict placement on the first `threads` cpus the process may use; returns 0
   when there are fewer. ggml_threadpool_new pins the calling thread for good:
   its cpu is kept for gg_before and the caller's own set restored. */
static int gg_pin_params(gg_side *s, struct ggml_threadpool_params *tpp, int threads) {
  if (pthread_getaffinity_np(pthread_self(), sizeof s->all, &s->all)) return 0;
  int n = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE && cpu < GGML_MAX_N_THREADS && n < threads; cpu++)
    if (CPU_ISSET(cpu, &s->all)) tpp->cpumask[cpu] = true, n++;
  if (n < threads) {
    memset(tpp->cpumask, 0, sizeof tpp->cpumask);
    return 0;
  }
  tpp->strict_cpu = true;
  return 1;
}

/* A threadpool (polling off; pinned unless pin=0) and a plan with its work buffer at `threads`. */
static void gg_setup(gg_side *s, const cfg *c, int threads) {
  struct ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
  tpp.poll = 0;
  s->pinned = c->pin && gg_pin_params(s, &tpp, threads);
  if (!(s->tp = ggml_threadpool_new(&tpp))) die("ggml_threadpool_new failed");
  if (s->pinned) {
    pthread_getaffinity_np(pthread_self(), sizeof s->pin, &s->pin);
    gg_after(s);
  }
  s->plan = ggml_graph_plan(s->gf, threads, s->tp);
  s->work = s->plan.work_size ? must_alloc(s->plan.work_size, "out of memory (ggml work)") : NULL;
  s->plan.work_data = s->work;
}

/* Free a thread count's threadpool and work buffer (the graph stays). */
static void gg_teardown(gg_side *s) {
  ggml_threadpool_free(s->tp);
  free(s->work);
}

/* KV bytes ggml reads: K and V in its type (q8_0: 34 bytes per 32 values). */
static double gg_kv_bytes(const cfg *c, const inputs *in) {
  return 2.0 * (double)ggml_row_size(gg_type(c->kvdt), c->D) * (double)in->rows;
}
#endif

/* ---- timing and checking ---- */

/* Quantile p of n sorted values (linear interpolation). */
static double quantile(const double *t, int n, double p) {
  double x = (n - 1) * p;
  int i = (int)x, j = i + 1 < n ? i + 1 : i;
  return t[i] + (t[j] - t[i]) * (x - i);
}

/* Comparison for qsort over doubles. */
static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* One cold call: flush every cache, then time the call (seconds; dies on failure). */
static double cold_call(impl *im) {
  if (fdb_flush_caches()) die("out of memory for the cache flush buffer");
  if (im->before) im->before(im->arg);
  double t0 = fdb_now();
  int rc = im->call(im->arg);
  double dt = fdb_now() - t0;
  if (im->after) im->after(im->arg);
  if (rc) {
    char msg[200];
    snprintf(msg, sizeof msg, "%s: the call failed", im->name);
    die(msg);
  }
  return dt;
}

/* Interleaved cold rounds; the first impl leads in even rounds, the last in odd ones. */
static void time_rounds(impl *im, int n, int reps) {
  for (int r = 0; r < reps; r++)
    for (int i = 0; i < n; i++) {
      impl *x = &im[r % 2 ? n - 1 - i : i];
      x->t[x->n++] = cold_call(x);
    }
}

/* Repetitions so the slowest impl runs about target_s, within rmin..rmax. */
static int reps_for(const cfg *c, const impl *im, int n) {
  double slow = 1e-6;
  for (int i = 0; i < n; i++) slow = fmax(slow, im[i].first_s);
  int r = (int)ceil(c->target_s / slow);
  return r < c->rmin ? c->rmin : r > c->rmax ? c->rmax : r;
}

/* Largest |out - ref| of an impl's output (NaN if any output is NaN). */
static double max_err(const impl *im, const inputs *in) {
  double m = 0;
  for (size_t i = 0; i < in->nq; i++) {
    double d = fabs((double)fdb_load(im->out_dt, im->out, i) - in->ref[i]);
    if (d != d) return NAN;
    m = fmax(m, d);
  }
  return m;
}

/* Print an impl's time and error lines (milliseconds). */
static void report_impl(impl *im, int threads, const inputs *in) {
  qsort(im->t, (size_t)im->n, sizeof(double), cmp_double);
  printf("time\t%s\t%d\t%.6f\t%.6f\t%.6f\t%.6f\t%d\t%.0f\n", im->name, threads, 1e3 * quantile(im->t, im->n, 0.5),
         1e3 * quantile(im->t, im->n, 0.25), 1e3 * quantile(im->t, im->n, 0.75), 1e3 * im->t[0], im->n,
         im->kv_bytes);
  printf("err\t%s\t%d\t%.6g\t%.6g\n", im->name, threads, max_err(im, in), in->ref_max);
}

/* Warm-up (one cold call each, also checked), interleaved rounds, report. */
static void measure(const cfg *c, impl *im, int n, int threads, const inputs *in) {
  for (int i = 0; i < n; i++) im[i].first_s = cold_call(&im[i]);
  int reps = reps_for(c, im, n);
  for (int i = 0; i < n; i++) {
    im[i].t = malloc((size_t)reps * sizeof(double));
    if (!im[i].t) die("out of memory (timings)");
    im[i].n = 0;
  }
  time_rounds(im, n, reps);
  for (int i = 0; i < n; i++) {
    report_impl(&im[i], threads, in);
    free(im[i].t);
  }
}

/* Read bandwidth of a 512 MiB buffer at each thread count (best of 5), printed. */
static void bandwidth(const cfg *c) {
  for (int i = 0; i < c->nthreads; i++)
    printf("bw\t%d\t%.3f\n", c->threads[i], fdb_read_bw_gbs((size_t)512 << 20, c->threads[i], 5));
  fflush(stdout);
}

/* Both libraries at one thread count. */
static void run_threads(const cfg *c, const inputs *in, int threads, void *gg) {
  fd_side fs;
  fd_setup(&fs, c, in, threads);
  impl im[MAX_IMPL] = { { .name = "flashdecode", .call = fd_call, .arg = &fs, .out = fs.out, .out_dt = c->odt,
                          .kv_bytes = fd_kv_bytes(c, in) } };
  int n = 1;
#ifdef FDP_GGML
  gg_side *gs = gg;
  if (gs) {
    gg_setup(gs, c, threads);
    im[n++] = (impl){ .name = "ggml", .call = gg_call, .before = gg_before, .after = gg_after, .arg = gs,
                      .out = gs->out, .out_dt = DT_F32, .kv_bytes = gg_kv_bytes(c, in) };
  }
#else
  (void)gg;
#endif
  measure(c, im, n, threads, in);
#ifdef FDP_GGML
  if (gs) gg_teardown(gs);
#endif
  fd_teardown(&fs);
  fflush(stdout);
}

int main(int argc, char **argv) {
  cfg c = parse_args(argc, argv);
  printf("machine\t%s\n", fd_machine_name());
  printf("shape\t%s\t%d\t%d\t%d\t%d\t%lld\n", c.name, c.B, c.Hq, c.Hkv, c.D, c.S);
  bandwidth(&c);
  inputs in = make_inputs(&c);
  void *gg = NULL;
#ifdef FDP_GGML
  gg_side gs = { 0 };
  if (c.peer) {
    ggml_cpu_init();
    gg_build(&gs, &c, &in);
    gg = &gs;
  }
#else
  if (c.peer) note("", "this harness was built without ggml");
#endif
  for (int i = 0; i < c.nthreads; i++) run_threads(&c, &in, c.threads[i], gg);
#ifdef FDP_GGML
  if (gg) ggml_free(gs.ctx);
#endif
  return 0;
}
