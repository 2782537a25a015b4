/* The tuned table's cost model in C (issue 20, item 3): its model lines load
   to the exact coefficients written; a malformed model (a value that is not a
   finite decimal, an unknown, repeated or missing name, a row after the
   model) refuses the table whole naming the line; the planner asks the model
   only when the table has no row for the shape and length and nothing is
   forced or deterministic (fd_plan_info.from_table 2), keeps the heuristic's
   configuration when the model predicts no clear gain, and the plan made from
   the model's pick computes what the double-precision reference does. */
#include "compare.h"
#include "flashdecode.h"
#include "internal.h"
#include "kexec.h"
#include "table.h"
#include "tcheck.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The model's values by name (0 for a feature not named): prefers chunk 32
   (chunk +1), tile 1 (tiles -0.5), no portable C (isa_c +5), one split
   (splits +1), the most threads (threads -1); limits chunk 32..64, splits 8, threads 2. */
static const char *override_name;   /* a name whose value override_value replaces (NULL: none) */
static double override_value;
static double value_of(const char *name) {
  if (override_name && !strcmp(name, override_name)) return override_value;
  static const struct { const char *name; double v; } V[] = {
    { "chunk", 1.0 }, { "tiles", -0.5 }, { "isa_c", 5.0 }, { "splits", 1.0 }, { "threads", -1.0 },
    { "short", -1.2345678901234567e-05 }, { "chunk_min", 32 }, { "chunk_max", 64 }, { "splits_max", 8 },
    { "threads_max", 2 }, { "items_max", 4 }, { "splits_up", 8 }, { "splits_up_len", 1e6 }, { "len_max", 1e6 }, { "G_min", 1 }, { "G_max", 16 }, { "D_min", 32 },
    { "D_max", 256 }, { "kvb_min", 1 }, { "kvb_max", 4 }, { "rows_min", 1 }, { "rows_max", 64 }, { "q_min", 1 }, { "q_max", 8 },
    { "kv_dtypes", 255 },
  };
  for (size_t i = 0; i < sizeof V / sizeof *V; i++) if (!strcmp(V[i].name, name)) return V[i].v;
  return 0;
}

/* Table text into buf: this build's header, a row for s at bucket 2048 (chunk 32, tile 2, splits 3, isa 0) when
   row, then the model lines (when model), with line skip (0-based among the model lines) left out and extra
   appended after them; returns buf. */
static char *table_text(char *buf, size_t n, const fd_shape *s, int row, int model, int skip, const char *extra) {
  char head[4096], sig[256], key[32], err[256];
  fd_tuned_table_header(head, sizeof head);
  fd_shape_signature(s, sig, sizeof sig);
  fd_kernel_key(s, 32, 2, 0, 0, key, err, sizeof err);
  size_t k = (size_t)snprintf(buf, n, "%s", head);
  if (row) k += (size_t)snprintf(buf + k, n - k, "%s\t2048\t%s\t3\t2\t10.0\t1.000\t12.0\trow\t-\n", sig, key);
  for (int i = 0; model && i < FD_MODEL_NFEATURES + FD_MODEL_NLIMITS; i++) {
    const char *name = i < FD_MODEL_NFEATURES ? fd_model_feature_names[i] : fd_model_limit_names[i - FD_MODEL_NFEATURES];
    if (i != skip) k += (size_t)snprintf(buf + k, n - k, "model\t%s\t%.17g\n", name, value_of(name));
  }
  k += (size_t)snprintf(buf + k, n - k, "%send\t%d\n", extra, row);
  return buf;
}

/* Write text to a temporary file; its path (static buffer). */
static const char *temp_file(const char *text) {
  static char path[64];
  snprintf(path, sizeof path, "/tmp/fd_model_XXXXXX");
  int fd = mkstemp(path);
  size_t n = strlen(text);
  if (fd < 0 || write(fd, text, n) != (ssize_t)n) abort();
  close(fd);
  return path;
}

static const fd_shape SHAPE = { 1, 4, 1, 64, 2048, FD_F32, FD_F16, FD_F32, FD_CAUSAL, FD_BHSD, 0 };

/* The loader: exact coefficients and limits; a table without model lines has none. */
static void load_exact(void) {
  char text[16384], note[512];
  table_text(text, sizeof text, &SHAPE, 1, 1, -1, "");
  fd_table *t = fd_table_parse("m.tsv", text, strlen(text), note, sizeof note);
  if (!t_check(t != NULL, "a table with a model loads: %s", note)) return;
  int same = t->model.present;
  for (int i = 0; i < FD_MODEL_NFEATURES; i++) same &= t->model.coef[i] == value_of(fd_model_feature_names[i]);
  for (int i = 0; i < FD_MODEL_NLIMITS; i++) same &= t->model.limit[i] == value_of(fd_model_limit_names[i]);
  t_check(same && t->n == 1, "the model's coefficients and limits are the values written (%%.17g), the row kept");
  fd_table_free(t);
  table_text(text, sizeof text, &SHAPE, 1, 0, -1, "");
  t = fd_table_parse("m.tsv", text, strlen(text), note, sizeof note);
  t_check(t && !t->model.present, "a table without model lines has no model: %s", note);
  fd_table_free(t);
}

/* A malformed model refuses the table, the note naming line and why. */
static void refusals(void) {
  char head[4096];
  int hl = 0;
  fd_tuned_table_header(head, sizeof head);
  for (const char *p = head; *p; p++) hl += *p == '\n';
  static const struct { const char *name, *extra; int skip, line_after_header; const char *want; } C[] = {
    { "a NaN value", "model\tisa_c\tnan\n", 0, 0, "model value 'nan' is not a finite number" },
    { "a cut exponent", "model\tisa_c\t1e\n", 0, 0, "model value '1e' is not a finite number" },
    { "an infinite value", "model\tisa_c\t1e999\n", 0, 0, "model value '1e999' is not a finite number" },
    { "an unknown name", "model\tchunk3\t1\n", -1, 0, "model name 'chunk3' is not a feature or limit" },
    { "a repeated name", "model\tchunk\t1\n", -1, 0, "model name 'chunk' is given twice" },
    { "a missing feature", "", 1, 1, "the model has no coefficient for feature isa_avx2" },
    { "a missing limit", "", FD_MODEL_NFEATURES + 2, 1, "the model has no limit splits_max" },
    { "a fourth field", "model\tisa_c\t1\tx\n", 0, 0, "a model line has more than 3 fields" },
    { "a row after the model", "ROW", -1, 0, "a row after the model lines" },
  };
  for (size_t i = 0; i < sizeof C / sizeof *C; i++) {
    char text[16384], note[512], want[64], extra[512];
    snprintf(extra, sizeof extra, "%s", C[i].extra);
    if (!strcmp(extra, "ROW")) {   /* the first row line again, after the model */
      char rows[16384];
      table_text(rows, sizeof rows, &SHAPE, 1, 0, -1, "");
      const char *r = rows;
      for (int l = 0; l < hl; l++) r = strchr(r, '\n') + 1;
      snprintf(extra, sizeof extra, "%.*s", (int)(strchr(r, '\n') - r + 1), r);
    }
    table_text(text, sizeof text, &SHAPE, 1, 1, C[i].skip, extra);
    int lines = FD_MODEL_NFEATURES + FD_MODEL_NLIMITS - (C[i].skip >= 0);
    /* the bad line: the extra one (after the header, the row and the model lines), or the end line */
    snprintf(want, sizeof want, "line %d:", hl + 1 + lines + 1);
    fd_table *t = fd_table_parse("m.tsv", text, strlen(text), note, sizeof note);
    t_check(!t && strstr(note, C[i].want) && strstr(note, want), "%s: refused naming %s: '%s'", C[i].name, want, note);
    fd_table_free(t);
  }
}

/* The plan of s (kv_len len) in c with opts o: its info at len; 0, or -1. */
static int info_of(fd_ctx *c, fd_shape s, int64_t len, fd_plan_opts o, fd_plan_info *info) {
  s.kv_len = len;
  fd_plan *p;
  if (fd_plan_create_opts(c, &s, &o, &p)) return -1;
  int rc = fd_plan_info_get(p, len, info);
  fd_plan_destroy(p);
  return rc;
}


/* A table whose model has limit or margin `name` set to value plans shape
   other like a context without a table: the heuristic's configuration (its
   kernel only when kernel_only), from_table 2. */
static void keeps_heuristic(const fd_shape *other, const char *name, double value, int kernel_only, const char *what) {
  char text[16384];
  fd_plan_info i, h;
  override_name = name, override_value = value;
  const char *path = temp_file(table_text(text, sizeof text, &SHAPE, 1, 1, -1, ""));
  override_name = NULL;
  fd_ctx *c = fd_create(&(fd_config){ .threads = 2, .table = path });
  fd_ctx *plain = fd_create(&(fd_config){ .threads = 2 });
  int rc = !c || !plain || info_of(c, *other, 3000, (fd_plan_opts){ 0 }, &i) ||
           info_of(plain, *other, 3000, (fd_plan_opts){ 0 }, &h);
  t_check(!rc && i.from_table == 2 && !strcmp(i.key, h.key) && (kernel_only || (i.splits == h.splits && i.threads == h.threads)),
          "%s: %s/%d vs %s/%d", what, i.key, i.splits, h.key, h.splits);
  fd_destroy(c);
  fd_destroy(plain);
  unlink(path);
}
/* A windowed softcap shape's own row (signature .w2000.softcap, bucket 2048):
   the planner takes it at kv_len 30000 (the window leaves 2000 keys), and
   neither the plain shape nor the window alone reads it. */
static void feature_rows(void) {
  char text[16384];
  fd_shape win = SHAPE;
  win.window = 2000;
  win.softcap = 50.0f;
  const char *path = temp_file(table_text(text, sizeof text, &win, 1, 1, -1, ""));
  fd_ctx *c = fd_create(&(fd_config){ .threads = 2, .table = path });
  fd_plan_info i;
  int rc = !c || info_of(c, win, 30000, (fd_plan_opts){ 0 }, &i);
  t_check(!rc && i.from_table == 1 && i.chunk == 32 && i.group_tile == 2 && i.splits == 3,
          "a windowed softcap shape over 30000 keys takes its row of bucket 2048: from_table %d chunk %d tile %d splits %d",
          i.from_table, i.chunk, i.group_tile, i.splits);
  rc = !c || info_of(c, SHAPE, 2000, (fd_plan_opts){ 0 }, &i);
  t_check(!rc && i.from_table == 2, "the plain shape does not read the feature row: from_table %d", i.from_table);
  fd_shape alone = win;
  alone.softcap = 0;
  rc = !c || info_of(c, alone, 30000, (fd_plan_opts){ 0 }, &i);
  t_check(!rc && i.from_table == 2, "the window without softcap does not read it: from_table %d", i.from_table);
  fd_destroy(c);
  unlink(path);
}

/* The planner: a row first, the model where no row fits, forced options and deterministic mode over both. */
static void planner(void) {
  char text[16384];
  const char *path = temp_file(table_text(text, sizeof text, &SHAPE, 1, 1, -1, ""));
  fd_ctx *c = fd_create(&(fd_config){ .threads = 2, .table = path });
  fd_ctx *det = fd_create(&(fd_config){ .threads = 2, .table = path, .deterministic = 1 });
  if (!t_check(c && det && !fd_errmsg(c)[0], "contexts over a table with a model: '%s'", c ? fd_errmsg(c) : fd_errmsg(NULL)))
    return;
  int want_isa = fd_ctx_max_isa(c) >= 1 ? 1 : 0;   /* isa_c penalized; AVX2 and AVX-512 tie: the first enumerated */
  fd_plan_info i;
  int rc;
  rc = info_of(c, SHAPE, 2000, (fd_plan_opts){ 0 }, &i);
  t_check(!rc && i.from_table == 1 && i.chunk == 32 && i.group_tile == 2 &&
          i.splits == 3, "the row wins where it fits: from_table %d chunk %d tile %d splits %d", i.from_table, i.chunk,
          i.group_tile, i.splits);
  rc = info_of(c, SHAPE, 500, (fd_plan_opts){ 0 }, &i);
  t_check(!rc && i.from_table == 2 && i.chunk == 32 && i.group_tile == 1 &&
          i.splits == 1 && i.threads == 2 && i.isa == want_isa,
          "no row for bucket 512: the model's pick (from_table %d chunk %d tile %d splits %d threads %d isa %d; want 2, "
          "32, 1, 1, 2, %d)", i.from_table, i.chunk, i.group_tile, i.splits, i.threads, i.isa, want_isa);
  fd_shape other = SHAPE;
  other.batch = 2;                      /* another signature: no row at all */
  rc = info_of(c, other, 3000, (fd_plan_opts){ 0 }, &i);
  t_check(!rc && i.from_table == 2 && i.chunk == 32,
          "an unseen shape gets the model: from_table %d chunk %d", i.from_table, i.chunk);
  /* feature shapes without rows of their own: the model's decision for their plain shape (README "Shapes the
     table never saw"); a windowed one at the bucket of the keys its window leaves */
  fd_plan_info plain_i;
  fd_shape soft = other, win = other;
  soft.softcap = 30.0f;
  soft.features = FD_ALIBI;
  rc = info_of(c, other, 3000, (fd_plan_opts){ 0 }, &plain_i) || info_of(c, soft, 3000, (fd_plan_opts){ 0 }, &i);
  t_check(!rc && i.from_table == 2 && !strcmp(i.key, plain_i.key) && i.splits == plain_i.splits &&
          i.threads == plain_i.threads, "a softcap + ALiBi shape gets its plain shape's model decision: %s/%d vs %s/%d",
          i.key, i.splits, plain_i.key, plain_i.splits);
  win.window = 1024;
  rc = info_of(c, other, 1024, (fd_plan_opts){ 0 }, &plain_i) || info_of(c, win, 30000, (fd_plan_opts){ 0 }, &i);
  t_check(!rc && i.from_table == 2 && !strcmp(i.key, plain_i.key) && i.splits == plain_i.splits &&
          i.threads == plain_i.threads, "a window of 1024 over 30000 keys gets the plain shape's decision at 1024: "
          "%s/%d vs %s/%d", i.key, i.splits, plain_i.key, plain_i.splits);
  rc = info_of(c, other, 3000, (fd_plan_opts){ .chunk = 128 }, &i);
  t_check(!rc && i.from_table == 0 && i.chunk == 128,
          "a forced chunk wins over the model: from_table %d chunk %d", i.from_table, i.chunk);
  rc = info_of(c, other, 3000, (fd_plan_opts){ .isa = FD_ISA_C }, &i);
  t_check(!rc && i.from_table == 0 && i.isa == 0,
          "a forced isa leaves the heuristic in charge: from_table %d isa %d", i.from_table, i.isa);
  rc = info_of(det, other, 3000, (fd_plan_opts){ 0 }, &i);
  t_check(!rc && i.from_table == 0,
          "a deterministic context uses no model: from_table %d", i.from_table);
  fd_destroy(c);
  fd_destroy(det);
  unlink(path);
  feature_rows();
  /* a model that predicts no gain over the heuristic's configuration keeps it (from_table 2, heuristic's choices) */
  table_text(text, sizeof text, &SHAPE, 1, 0, -1, "");
  char *end = strstr(text, "end\t");
  size_t k = (size_t)(end - text);
  for (int j = 0; j < FD_MODEL_NFEATURES + FD_MODEL_NLIMITS; j++)
    k += (size_t)snprintf(text + k, sizeof text - k, "model\t%s\t%s\n",
                          j < FD_MODEL_NFEATURES ? fd_model_feature_names[j] : fd_model_limit_names[j - FD_MODEL_NFEATURES],
                          j < FD_MODEL_NFEATURES || (j >= FD_MODEL_NFEATURES + FD_MODEL_MARGIN_KERNEL &&
                                                     j <= FD_MODEL_NFEATURES + FD_MODEL_MARGIN_THREADS) ? "0"
                          : j == FD_MODEL_NFEATURES + FD_MODEL_CHUNK_MIN ? "32"
                          : j == FD_MODEL_NFEATURES + FD_MODEL_KV_DTYPES ? "255"
                          : j >= FD_MODEL_NFEATURES + FD_MODEL_G_MIN && strstr(fd_model_limit_names[j - FD_MODEL_NFEATURES], "_min") ? "1"
                          : "4096");
  snprintf(text + k, sizeof text - k, "end\t1\n");
  path = temp_file(text);
  c = fd_create(&(fd_config){ .threads = 2, .table = path });
  fd_ctx *plain = fd_create(&(fd_config){ .threads = 2 });
  fd_plan_info h;
  rc = !c || !plain || info_of(c, other, 3000, (fd_plan_opts){ 0 }, &i) || info_of(plain, other, 3000, (fd_plan_opts){ 0 }, &h);
  t_check(!rc && i.from_table == 2 && !strcmp(i.key, h.key) && i.splits == h.splits && i.threads == h.threads,
          "a flat model keeps the heuristic's configuration: %s/%d vs %s/%d", i.key, i.splits, h.key, h.splits);
  fd_destroy(c);
  fd_destroy(plain);
  unlink(path);
  /* a shape outside the model's measured range (its kv bytes above kvb_max) keeps the heuristic's configuration */
  keeps_heuristic(&other, "kvb_max", 1, 0, "kv bytes outside the measured range keep the heuristic's configuration");
  /* a model whose fit measured every KV dtype but the shape's keeps the heuristic's configuration */
  keeps_heuristic(&other, "kv_dtypes", 255 - (1 << other.kv_dtype), 0,
                  "a KV dtype the fit never measured keeps the heuristic's configuration");
  /* a kernel margin no prediction beats keeps the heuristic's kernel */
  keeps_heuristic(&other, "margin_kernel", 1e3, 1, "a kernel margin of 1e3 keeps the heuristic's kernel");
}

/* The model's pick runs and matches the double-precision reference. */
static void correct(void) {
  char text[16384];
  const char *path = temp_file(table_text(text, sizeof text, &SHAPE, 1, 1, -1, ""));
  fd_ctx *c = fd_create(&(fd_config){ .threads = 2, .table = path });
  kproblem kp;
  kp_init(&kp, 3, 4, 1, 64, 700, 0, 1, 0, 0, 0, 41);   /* b3: a signature without a row */
  fd_shape s = { 3, 4, 1, 64, 700, FD_F32, FD_F16, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  float out[3 * 4 * 64], lse[12];
  double rout[3 * 4 * 64], rlse[12];
  fd_plan *p;
  fd_plan_info info;
  if (t_check(c && fd_plan_create(c, &s, &p) == 0, "model plan: %s", fd_errmsg(c))) {
    fd_plan_info_get(p, 700, &info);
    t_check(info.from_table == 2 && info.chunk == 32, "the plan is the model's (from_table %d chunk %d)", info.from_table,
            info.chunk);
    fd_args a = { kp.q, kp.k, kp.v, kp.cur_pos, NULL, NULL, NULL, NULL, 0, out, lse };
    if (t_check(fd_run(p, &a) == 0, "model plan run: %s", fd_errmsg(c))) {
      ref_attention(&kp.ref, rout, rlse);
      t_compare(&kp, out, lse, rout, rlse, 1, "the model's pick vs the double reference");
    }
    fd_plan_destroy(p);
  }
  kp_free(&kp);
  fd_destroy(c);
  unlink(path);
}

int main(void) {
  load_exact();
  refusals();
  planner();
  correct();
  kx_cleanup();
  return t_done();
}
