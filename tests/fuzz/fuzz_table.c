/* libFuzzer target: the tuned-table loader (runtime/table.c), in memory
   (fd_table_parse) and from a file (fd_table_load on a memfd).
   Input: a whole table when it starts with the magic line, else the part
   after the header (rows and end line), which gets this build's header
   prepended so that mutations reach the rows.
   Invariants:
   - the file and the in-memory loaders agree: the same verdict, note and rows;
   - refused <=> a note, which names the file;
   - a loaded table: no NUL byte, its last line is "end <n>" with n its row
     count; every row is its line of the text, unaltered (shape, bucket, key,
     name); its shape is a canonical signature, its bucket a power of two, its
     key decodes (and re-encodes to itself), fits the shape as the Lua loader
     demands (head_dim, dtypes, mask mode, layout, flags 0), has a chunk the
     planner takes and a group tile dividing the shape's group; splits and
     threads are in the planner's bounds; no two rows share a shape and bucket;
     a cost model (model lines) loads with every value finite, and identically from both. */
#include "fuzz.h"
#include "internal.h"
#include "table.h"
#include <math.h>
#include <sys/mman.h>
#include <unistd.h>

static const char MAGIC[] = "flashdecode tuned table";

/* This build's table header (computed once). */
static const char *header(size_t *len) {
  static char h[4096];
  static size_t n;
  if (!n) n = (size_t)fd_tuned_table_header(h, sizeof h);
  *len = n;
  return h;
}

/* Line number line (from 1) of text, copied into out (NUL-terminated), or "" if absent. */
static void line_at(const char *text, size_t len, int line, char *out, size_t cap) {
  const char *p = text, *end = text + len;
  for (int l = 1; l < line && p < end; l++) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    p = nl ? nl + 1 : end;
  }
  const char *nl = p < end ? memchr(p, '\n', (size_t)(end - p)) : NULL;
  size_t n = (size_t)((nl ? nl : end) - p);
  if (n >= cap) n = cap - 1;
  memcpy(out, p, n);
  out[n] = 0;
}

/* The text ends with "end\t<digits>\n" counting n rows. */
static void check_end_line(const char *text, size_t len, size_t n) {
  if (len < 6 || text[len - 1] != '\n') fuzz_fail("a loaded table does not end with a newline");
  size_t s = len - 1;
  while (s > 0 && text[s - 1] != '\n') s--;
  char last[64];
  size_t ll = len - 1 - s < sizeof last - 1 ? len - 1 - s : sizeof last - 1;
  memcpy(last, text + s, ll);
  last[ll] = 0;
  char *e;
  if (strncmp(last, "end\t", 4) || last[4] < '0' || last[4] > '9' || strtoull(last + 4, &e, 10) != n || *e)
    fuzz_fail("a loaded table of %zu rows ends with '%s'", n, last);
}

/* Row r of t is its line of text, unaltered, with a canonical shape and a key that fits it. */
static void check_row(const fd_table *t, const fd_table_row *r, const char *text, size_t len) {
  char line[16384], sig[256], why[512], back[FD_KEY_BUFSZ], err[256];
  line_at(text, len, r->line, line, sizeof line);
  char *f[9];
  int k = 0;
  for (char *p = line; k < 9 && p; k++) {   /* the line's tab-separated fields */
    f[k] = p;
    p = strchr(p, '\t');
    if (p) *p++ = 0;
  }
  if (k != 9 || strcmp(f[0], r->shape) || strtoll(f[1], NULL, 10) != r->bucket || strcmp(f[2], r->key) ||
      strcmp(f[8], r->name))
    fuzz_fail("line %d: loaded as shape '%s', bucket %lld, key '%s', name '%s' from fields '%s' '%s' '%s' '%s'", r->line,
              r->shape, (long long)r->bucket, r->key, r->name, f[0], k > 1 ? f[1] : "", k > 2 ? f[2] : "", k > 8 ? f[8] : "");
  fd_shape s;
  if (fd_shape_parse(r->shape, &s) || fd_shape_signature(&s, sig, sizeof sig) < 0 || strcmp(sig, r->shape))
    fuzz_fail("line %d: shape '%s' is not a canonical signature", r->line, r->shape);
  if (r->bucket < 1 || (r->bucket & (r->bucket - 1))) fuzz_fail("line %d: bucket %lld", r->line, (long long)r->bucket);
  int v[FD_KF_COUNT];
  if (fd_table_decode_key(r->key, v, why, sizeof why)) fuzz_fail("line %d: key %s loaded but does not decode: %s", r->line, r->key, why);
  if (fd_key_encode(v, back, err, sizeof err) || strcmp(back, r->key)) fuzz_fail("line %d: key %s re-encodes to %s", r->line, r->key, back);
  int fit[][2] = { { v[FD_KF_HEAD_DIM], s.head_dim }, { v[FD_KF_Q_DTYPE], (int)s.q_dtype }, { v[FD_KF_KV_DTYPE], (int)s.kv_dtype },
                   { v[FD_KF_OUT_DTYPE], (int)s.out_dtype }, { v[FD_KF_MASK_MODE], (int)s.mask_mode },
                   { v[FD_KF_LAYOUT], (int)s.layout }, { v[FD_KF_FLAGS], 0 } };
  for (size_t i = 0; i < sizeof fit / sizeof fit[0]; i++)   /* as the Lua loader (gen/export.lua) demands */
    if (fit[i][0] != fit[i][1]) fuzz_fail("line %d: key %s does not fit shape %s (or is not a plain key)", r->line, r->key, r->shape);
  int G = s.n_q_heads / s.n_kv_heads;
  if (v[FD_KF_CHUNK] > FD_MAX_CHUNK || G % v[FD_KF_GROUP_TILE])
    fuzz_fail("line %d: key %s: chunk %d or group tile %d the planner cannot take (G %d)", r->line, r->key,
              v[FD_KF_CHUNK], v[FD_KF_GROUP_TILE], G);
  long long rows = (long long)s.batch * s.n_kv_heads;
  if (r->splits < 1 || r->splits > r->bucket || (r->splits > 1 && rows * r->splits > FD_MAX_SPLIT_ITEMS))
    fuzz_fail("line %d: splits %d out of bounds (bucket %lld, %lld rows)", r->line, r->splits, (long long)r->bucket, rows);
  if (r->threads < 1 || r->threads > FD_MAX_THREADS) fuzz_fail("line %d: threads %d", r->line, r->threads);
  if (fd_table_find(t, r->shape, r->bucket) != r) fuzz_fail("line %d: another row has shape %s, bucket %lld", r->line, r->shape, (long long)r->bucket);
}

/* A loaded cost model (its model lines): every coefficient and limit finite, a line per name in the text. */
static void check_model(const fd_table *t, const char *text, size_t len) {
  if (!t->model.present) {
    for (size_t i = 0; i + 6 <= len; i++)
      if ((i == 0 || text[i - 1] == '\n') && !memcmp(text + i, FD_MODEL_LINE "\t", 6)) fuzz_fail("model lines loaded as no model");
    return;
  }
  for (int i = 0; i < FD_MODEL_NFEATURES; i++)
    if (!isfinite(t->model.coef[i])) fuzz_fail("model coefficient %s is %g", fd_model_feature_names[i], t->model.coef[i]);
  for (int i = 0; i < FD_MODEL_NLIMITS; i++)
    if (!isfinite(t->model.limit[i])) fuzz_fail("model limit %s is %g", fd_model_limit_names[i], t->model.limit[i]);
}

/* Every invariant of a loaded table. */
static void check_table(const fd_table *t, const char *text, size_t len) {
  if (memchr(text, 0, len)) fuzz_fail("a table with a NUL byte loaded");
  check_end_line(text, len, t->n);
  for (size_t i = 0; i < t->n; i++) check_row(t, &t->rows[i], text, len);
  check_model(t, text, len);
}

/* The file loader on the same bytes (a memfd named path), checked against the in-memory one. */
static void check_file_loader(const char *path, int fd, const char *text, size_t len, const fd_table *t, const char *note) {
  if (ftruncate(fd, 0) || pwrite(fd, text, len, 0) != (ssize_t)len) fuzz_fail("memfd write failed");
  char fnote[1024];
  fd_table *ft = fd_table_load(path, fnote, sizeof fnote);
  if (!ft != !t || strcmp(fnote, note)) fuzz_fail("fd_table_load says '%s', fd_table_parse '%s'", fnote, note);
  if (ft && (ft->n != t->n || (t->n && memcmp(ft->rows, t->rows, t->n * sizeof *t->rows))))
    fuzz_fail("fd_table_load and fd_table_parse loaded different rows");
  if (ft && memcmp(&ft->model, &t->model, sizeof t->model)) fuzz_fail("fd_table_load and fd_table_parse loaded different models");
  fd_table_free(ft);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int fd = -1;
  static char path[64];
  if (fd < 0) {
    fd = memfd_create("fuzz_table", 0);
    if (fd < 0) fuzz_fail("memfd_create failed");
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  }
  size_t hl, len;
  const char *h = header(&hl);
  int whole = size >= sizeof MAGIC - 1 && !memcmp(data, MAGIC, sizeof MAGIC - 1);
  len = whole ? size : hl + size;
  char *text = malloc(len ? len : 1);
  if (!whole) memcpy(text, h, hl);
  if (size) memcpy(text + (whole ? 0 : hl), data, size);
  char note[1024] = "x";
  fd_table *t = fd_table_parse(path, text, len, note, sizeof note);
  char prefix[128];
  snprintf(prefix, sizeof prefix, "tuned table %s: ", path);
  if (t && note[0]) fuzz_fail("a table loaded with the note '%s'", note);
  if (!t && strncmp(note, prefix, strlen(prefix))) fuzz_fail("a refusal's note does not name the file: '%s'", note);
  if (t) check_table(t, text, len);
  check_file_loader(path, fd, text, len, t, note);
  fd_table_free(t);
  free(text);
  return 0;
}
