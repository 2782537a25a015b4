/* Tuned table reader. Format (tab-separated; magic, identity names and columns
   from gen/facts.lua through fd_keydefs.h, shared with gen/export.lua):
     flashdecode tuned table 2
     library <v> / templates <hash> / tcc <v> / cpu <model> / features <list>
     columns shape bucket key splits threads median_us gbps heuristic_us name ratio_ci
     <one row per shape and bucket>
     [model <name> <value>: the cost model (tuner/model.lua), optional, after the rows:
      every feature of gen/facts.lua MODEL_FEATURES and limit of MODEL_LIMITS once]
     end <number of rows>
   All or nothing (FFTW's rule): any difference in the header, a NUL byte, a
   malformed row (a shape that is not a signature, a bucket that is not a power
   of two, a key that does not decode or does not fit its row's shape, splits,
   threads or chunk outside what the planner takes, a name empty or too long
   for fd_table_row.name, a ratio_ci that is not "-" or "lo..hi"), two rows for one shape and bucket, a
   model line with an unknown or repeated name or a value that is not a finite
   decimal, a row after a model line, a model missing a name, a
   missing or wrong end line or any byte after it refuses the whole table, and
   the note names the line and why. */
#include "table.h"
#include "cpu.h"
#include "internal.h"
#include "jit.h"
#include "luagen.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The header this build writes and accepts: magic, identity lines, columns. */
int fd_tuned_table_header(char *buf, size_t size) {
  const char *value[] = { FD_VERSION, fd_gen_template_hash(), fd_jit_version(), fd_cpu_model(), fd_cpu_features() };
  _Static_assert(sizeof value / sizeof *value == FD_TABLE_NIDENT, "one value per identity line of gen/facts.lua");
  int n = snprintf(buf, size, "%s\n", FD_TABLE_MAGIC);
  for (int i = 0; i < FD_TABLE_NIDENT && n >= 0 && (size_t)n < size; i++)
    n += snprintf(buf + n, size - (size_t)n, "%s\t%s\n", fd_table_identity[i], value[i]);
  if (n >= 0 && (size_t)n < size) n += snprintf(buf + n, size - (size_t)n, "%s\n", FD_TABLE_COLUMNS);
  return n < 0 || (size_t)n >= size ? -1 : n;
}

/* Write the refusal note: the file, the line (0: none) and why; returns -1. */
static int refuse(char *note, size_t notelen, const char *path, int line, const char *why) {
  if (line > 0) snprintf(note, notelen, "tuned table %s: refused: line %d: %s; using the heuristic", path, line, why);
  else snprintf(note, notelen, "tuned table %s: refused: %s; using the heuristic", path, why);
  return -1;
}

/* Read a whole file into a NUL-terminated buffer; its length (NULs included) in *len. */
static char *slurp(const char *path, size_t *len, char *note, size_t notelen) {
  FILE *f = fopen(path, "rb");
  if (!f) { snprintf(note, notelen, "tuned table %s: cannot open: %s; using the heuristic", path, strerror(errno)); return NULL; }
  size_t cap = 1 << 16, n = 0;
  char *buf = malloc(cap);
  for (size_t got; buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0;) {
    n += got;
    if (n + 1 == cap) { char *b = realloc(buf, cap *= 2); if (!b) { free(buf); buf = NULL; } else buf = b; }
  }
  int bad = ferror(f);
  fclose(f);
  if (!buf || bad) { free(buf); snprintf(note, notelen, "tuned table %s: cannot read; using the heuristic", path); return NULL; }
  buf[n] = 0;
  *len = n;
  return buf;
}

/* The line (from 1) that byte offset at of text falls in. */
static int line_of(const char *text, size_t at) {
  int line = 1;
  for (size_t i = 0; i < at; i++) line += text[i] == '\n';
  return line;
}

/* Compare the file's header with ours line by line; its line count, or -1 with the field named. */
static int check_header(const char *path, char **cursor, char *note, size_t notelen) {
  char want[4096];
  fd_tuned_table_header(want, sizeof want);
  char *w = want;
  int line = 1;
  for (; *w; line++) {
    char *we = strchr(w, '\n'), *ge = strchr(*cursor, '\n');
    if (!ge) {
      snprintf(note, notelen, "tuned table %s: refused: truncated in its header (line %d); using the heuristic", path, line);
      return -1;
    }
    size_t wl = (size_t)(we - w), gl = (size_t)(ge - *cursor);
    if (wl != gl || strncmp(w, *cursor, wl) != 0) {
      const char *tab = memchr(w, '\t', wl);
      size_t fl = tab ? (size_t)(tab - w) : wl;
      snprintf(note, notelen, "tuned table %s: refused: line %d (%.*s) is '%.*s' but this build and machine have '%.*s'; "
               "using the heuristic", path, line, (int)fl, w, (int)(gl > 120 ? 120 : gl), *cursor, (int)wl, w);
      return -1;
    }
    w = we + 1;
    *cursor = ge + 1;
  }
  return line - 1;
}

/* Decode a key's digit groups; see table.h. */
int fd_table_decode_key(const char *key, int v[FD_KF_COUNT], char *why, size_t n) {
  size_t len = strlen(key);
  if (len == 0 || len > FD_KEY_DIGITS || strspn(key, "0123456789") != len) {
    snprintf(why, n, "key '%.40s' is not 1 to %d decimal digits", key, FD_KEY_DIGITS);
    return -1;
  }
  if (key[0] == '0') {                         /* canonical: the kernel's symbol is fd_k<key> */
    snprintf(why, n, "key '%.40s' has a leading zero", key);
    return -1;
  }
  char d[FD_KEY_DIGITS];                       /* the key left-padded with zeros */
  memset(d, '0', FD_KEY_DIGITS - len);
  memcpy(d + FD_KEY_DIGITS - len, key, len);
  for (int f = 0; f < FD_KF_COUNT; f++) {
    const fd_key_field *k = &fd_key_fields[f];
    int x = 0;
    for (int i = 0; i < k->width; i++) x = x * 10 + d[FD_KEY_DIGITS - k->pos - k->width + i] - '0';
    if (x < k->min || x > k->max) {
      snprintf(why, n, "key %s does not decode: field %s (digits %d-%d) is %d, outside %d..%d", key, k->name,
               k->pos, k->pos + k->width - 1, x, k->min, k->max);
      return -1;
    }
    v[f] = x;
  }
  return 0;
}

/* A decimal field (digits only) in lo..hi; 0, or -1 with why naming the field (and hint). */
static int parse_int(const char *name, const char *text, long long lo, long long hi, const char *hint,
                     long long *out, char *why, size_t n) {
  char *end = NULL;
  errno = 0;
  long long v = text[0] >= '0' && text[0] <= '9' ? strtoll(text, &end, 10) : 0;
  if (!end || *end || errno || v < lo || v > hi) {
    snprintf(why, n, "%s '%.40s' is not an integer in %lld..%lld%s", name, text, lo, hi, hint);
    return -1;
  }
  *out = v;
  return 0;
}

/* Decode key into v and check that it fits shape s; see table.h. The fields
   it must share with the shape: fd_fit_same (gen/facts.lua FIT_SAME, which
   gen/export.lua's misfit reads too), and flags 0. */
int fd_table_key_fits(const char *key, const fd_shape *s, int v[FD_KF_COUNT], char *why, size_t n) {
  if (fd_table_decode_key(key, v, why, n)) return -1;
  for (int i = 0; i < FD_FIT_SAME; i++) {
    int f = fd_fit_same[i].field, want = *(const int *)((const char *)s + fd_fit_same[i].offset);
    if (v[f] != want) {
      snprintf(why, n, "key %s does not fit the row's shape: %s is %d, the shape has %d", key, fd_key_fields[f].name,
               v[f], want);
      return -1;
    }
  }
  if (v[FD_KF_FLAGS] != 0) {                     /* a row holds the plain key: no split or lse flag */
    snprintf(why, n, "key %s does not fit the row's shape: flags is %d, the shape has 0 (a row holds the plain key)",
             key, v[FD_KF_FLAGS]);
    return -1;
  }
  int G = s->n_q_heads / s->n_kv_heads;
  if (G % v[FD_KF_GROUP_TILE]) {
    snprintf(why, n, "key %s does not fit the row's shape: group_tile %d does not divide the shape's %d query heads "
             "per kv head", key, v[FD_KF_GROUP_TILE], G);
    return -1;
  }
  return 0;
}

/* Check a row's key against its shape: it fits (fd_table_key_fits) and its
   chunk is one the planner takes. */
static int check_key(const char *key, const fd_shape *s, char *why, size_t n) {
  int v[FD_KF_COUNT];
  if (fd_table_key_fits(key, s, v, why, n)) return -1;
  if (v[FD_KF_CHUNK] > FD_MAX_CHUNK) {
    snprintf(why, n, "key %s: chunk %d is above %d, the largest the planner takes", key, v[FD_KF_CHUNK], FD_MAX_CHUNK);
    return -1;
  }
  return 0;
}

/* Split a line at tabs into at most max fields; the field count. */
static int split_fields(char *line, char **f, int max) {
  int k = 0;
  for (char *p = line; k < max; k++) {
    f[k] = p;
    char *t = strchr(p, '\t');
    if (!t) return k + 1;
    *t = 0;
    p = t + 1;
  }
  return max + 1;                                /* more tabs than fields */
}

/* The most splits a row of shape s and bucket may take: the bucket's length,
   and FD_MAX_SPLIT_ITEMS split work items over its batch x kv-head rows. */
static long long max_splits(const fd_shape *s, int64_t bucket) {
  long long rows = (long long)s->batch * s->n_kv_heads;
  long long most = rows >= FD_MAX_SPLIT_ITEMS ? 1 : FD_MAX_SPLIT_ITEMS / rows;
  return most < bucket ? most : bucket;
}

/* A decimal without sign or exponent ("0.912", "1") in [p, end); 0 and its value, or -1. */
static int parse_decimal(const char *p, const char *end, double *out) {
  size_t n = (size_t)(end - p), a = strspn(p, "0123456789");
  if (a == 0 || a > n) return -1;
  if (a < n && (p[a] != '.' || a + 1 == n || a + 1 + strspn(p + a + 1, "0123456789") != n)) return -1;
  char buf[64];
  if (n >= sizeof buf) return -1;
  memcpy(buf, p, n);
  buf[n] = 0;
  *out = strtod(buf, NULL);
  return *out < HUGE_VAL ? 0 : -1;
}

/* The ratio_ci field (the row's interval against the heuristic, tuner/stats.lua):
   "-" or "lo..hi", two decimals with 0 < lo <= hi; 0, or -1 with why. */
static int check_ratio_ci(const char *v, char *why, size_t n) {
  const char *dots = strstr(v, "..");
  double lo, hi;
  if (!strcmp(v, "-") ||
      (dots && !parse_decimal(v, dots, &lo) && !parse_decimal(dots + 2, v + strlen(v), &hi) && lo > 0 && lo <= hi))
    return 0;
  snprintf(why, n, "ratio_ci '%.40s' is not '-' or lo..hi (decimals, 0 < lo <= hi)", v);
  return -1;
}

/* Parse one row; 0 or -1 with the reason in why. */
static int parse_row(char *line, fd_table_row *r, char *why, size_t n) {
  char *f[FD_TABLE_NCOLS];
  int k = split_fields(line, f, FD_TABLE_NCOLS);
  if (k != FD_TABLE_NCOLS) {
    snprintf(why, n, "has %s%d fields, want %d", k > FD_TABLE_NCOLS ? "more than " : "",
             k > FD_TABLE_NCOLS ? FD_TABLE_NCOLS : k, FD_TABLE_NCOLS);
    return -1;
  }
  _Static_assert(FD_TABLE_NCOLS == 10, "parse_row reads the 10 columns of gen/facts.lua TABLE_COLUMNS");
  memset(r, 0, sizeof *r);
  fd_shape s;
  if (strlen(f[0]) >= sizeof r->shape || fd_shape_parse(f[0], &s)) {
    snprintf(why, n, "shape '%.80s' is not a shape signature", f[0]);
    return -1;
  }
  snprintf(r->shape, sizeof r->shape, "%s", f[0]);
  long long bucket, splits, threads;
  if (parse_int("bucket", f[1], 1, INT64_C(1) << 62, "", &bucket, why, n)) return -1;
  if (bucket & (bucket - 1)) { snprintf(why, n, "bucket %lld is not a power of two", bucket); return -1; }
  r->bucket = bucket;
  if (check_key(f[2], &s, why, n)) return -1;
  snprintf(r->key, sizeof r->key, "%s", f[2]);
  if (parse_int("splits", f[3], 1, max_splits(&s, r->bucket),
                " (at most the bucket, and FD_MAX_SPLIT_ITEMS over batch x n_kv_heads)", &splits, why, n) ||
      parse_int("threads", f[4], 1, FD_MAX_THREADS, " (FD_MAX_THREADS)", &threads, why, n))
    return -1;
  r->splits = (int)splits;
  r->threads = (int)threads;
  double *num[] = { &r->median_us, &r->gbps, &r->heuristic_us };
  for (int i = 0; i < 3; i++) {
    char *end;
    *num[i] = strtod(f[5 + i], &end);
    if (*end || end == f[5 + i]) { snprintf(why, n, "field %d '%.40s' is not a number", 6 + i, f[5 + i]); return -1; }
  }
  size_t namelen = strlen(f[8]);
  if (namelen == 0 || namelen >= sizeof r->name) {   /* never cut short: the row is taken as written or not at all */
    snprintf(why, n, "name '%.40s%s' is %zu bytes, not 1 to %zu", f[8], namelen > 40 ? "..." : "", namelen,
             sizeof r->name - 1);
    return -1;
  }
  memcpy(r->name, f[8], namelen + 1);
  return check_ratio_ci(f[9], why, n);
}

/* The end line "end\t<n>" at line: it counts t's rows, in the digits the
   writer gives (no leading zero: one text per table), and nothing follows it. */
static int check_end(const char *path, const char *text, const char *after, int line, const fd_table *t,
                     char *note, size_t notelen) {
  char *end, why[128];
  errno = 0;
  long long n = strtoll(text + 4, &end, 10);
  int leading_zero = text[4] == '0' && text[5] != 0;
  if (text[4] < '0' || text[4] > '9' || *end || errno || leading_zero || n != (long long)t->n) {
    snprintf(why, sizeof why, "the end line does not close %zu rows", t->n);
    return refuse(note, notelen, path, line, why);
  }
  if (*after) return refuse(note, notelen, path, line + 1, "bytes after the end line");
  return 0;
}

/* Add one zeroed row slot to t; NULL when out of memory. */
static fd_table_row *grow(fd_table *t, size_t *cap) {
  if (t->n == *cap) {
    size_t want = *cap ? 2 * *cap : 64;
    fd_table_row *r = realloc(t->rows, want * sizeof *r);
    if (!r) return NULL;
    t->rows = r;
    *cap = want;
  }
  return &t->rows[t->n];
}

/* One model line's name and value into m (seen[] marks names given); 0, or -1 with why. */
static int parse_model_line(char *line, fd_model *m, char *seen, char *why, size_t n) {
  char *f[3];
  int k = split_fields(line, f, 3);
  if (k != 3) {
    snprintf(why, n, "a model line has %s%d fields, want 3 (model, name, value)", k > 3 ? "more than " : "", k > 3 ? 3 : k);
    return -1;
  }
  int idx = -1;
  for (int i = 0; i < FD_MODEL_NFEATURES + FD_MODEL_NLIMITS && idx < 0; i++)
    if (!strcmp(f[1], i < FD_MODEL_NFEATURES ? fd_model_feature_names[i] : fd_model_limit_names[i - FD_MODEL_NFEATURES]))
      idx = i;
  if (idx < 0) { snprintf(why, n, "model name '%.40s' is not a feature or limit of gen/facts.lua", f[1]); return -1; }
  if (seen[idx]) { snprintf(why, n, "model name '%s' is given twice", f[1]); return -1; }
  /* [-]digits[.digits][e[+-]digits], finite: gen/export.lua model_value */
  const char *v = f[2];
  size_t i = *v == '-', a = strspn(v + i, "0123456789");
  int ok = a > 0 && strlen(v) < 64;
  i += a;
  if (ok && v[i] == '.') { size_t b = strspn(v + i + 1, "0123456789"); ok = b > 0; i += 1 + b; }
  if (ok && (v[i] == 'e' || v[i] == 'E')) {
    i += 1 + (v[i + 1] == '+' || v[i + 1] == '-');
    size_t b = strspn(v + i, "0123456789");
    ok = b > 0;
    i += b;
  }
  double x = ok && !v[i] ? strtod(v, NULL) : NAN;
  if (!isfinite(x)) { snprintf(why, n, "model value '%.40s' is not a finite number", v); return -1; }
  seen[idx] = 1;
  if (idx < FD_MODEL_NFEATURES) m->coef[idx] = x;
  else m->limit[idx - FD_MODEL_NFEATURES] = x;
  m->present = 1;
  return 0;
}

/* A model with every name given, 0; else -1 with why naming the first missing. */
static int check_model(const fd_model *m, const char *seen, char *why, size_t n) {
  if (!m->present) return 0;
  for (int i = 0; i < FD_MODEL_NFEATURES + FD_MODEL_NLIMITS; i++)
    if (!seen[i]) {
      snprintf(why, n, "the model has no %s %s", i < FD_MODEL_NFEATURES ? "coefficient for feature" : "limit",
               i < FD_MODEL_NFEATURES ? fd_model_feature_names[i] : fd_model_limit_names[i - FD_MODEL_NFEATURES]);
      return -1;
    }
  return 0;
}

/* Parse rows (then the model's lines) up to the end line. */
static int parse_rows(const char *path, char *p, int first_line, fd_table *t, char *note, size_t notelen) {
  size_t cap = 0;
  char seen[FD_MODEL_NFEATURES + FD_MODEL_NLIMITS] = { 0 };
  for (int line = first_line; *p; line++) {
    char *e = strchr(p, '\n');
    if (!e) break;
    *e = 0;
    if (!strncmp(p, "end\t", 4)) {
      char why[256];
      if (check_model(&t->model, seen, why, sizeof why)) return refuse(note, notelen, path, line, why);
      return check_end(path, p, e + 1, line, t, note, notelen);
    }
    if (!strncmp(p, FD_MODEL_LINE "\t", sizeof FD_MODEL_LINE)) {
      char why[256];
      if (parse_model_line(p, &t->model, seen, why, sizeof why)) return refuse(note, notelen, path, line, why);
      p = e + 1;
      continue;
    }
    if (t->model.present) return refuse(note, notelen, path, line, "a row after the model lines");
    fd_table_row *r = grow(t, &cap);
    if (!r) return refuse(note, notelen, path, line, "out of memory");
    char why[512];
    if (parse_row(p, r, why, sizeof why)) return refuse(note, notelen, path, line, why);
    r->line = line;
    t->n++;
    p = e + 1;
  }
  return refuse(note, notelen, path, 0, "truncated (no end line)");
}

/* Order rows by shape, bucket, then line. */
static int row_order(const void *a, const void *b) {
  const fd_table_row *x = *(fd_table_row *const *)a, *y = *(fd_table_row *const *)b;
  int c = strcmp(x->shape, y->shape);
  if (c) return c;
  if (x->bucket != y->bucket) return x->bucket < y->bucket ? -1 : 1;
  return x->line - y->line;
}

/* Refuse a table with two rows for one shape and bucket, naming the first repeated line. */
static int check_duplicates(const char *path, const fd_table *t, char *note, size_t notelen) {
  fd_table_row **by = malloc((t->n ? t->n : 1) * sizeof *by);
  if (!by) return refuse(note, notelen, path, 0, "out of memory");
  for (size_t i = 0; i < t->n; i++) by[i] = &t->rows[i];
  qsort(by, t->n, sizeof *by, row_order);
  const fd_table_row *dup = NULL, *first = NULL;
  for (size_t i = 1; i < t->n; i++)
    if (!strcmp(by[i]->shape, by[i - 1]->shape) && by[i]->bucket == by[i - 1]->bucket && (!dup || by[i]->line < dup->line))
      dup = by[i], first = by[i - 1];
  free(by);
  if (!dup) return 0;
  char why[400];
  snprintf(why, sizeof why, "duplicates line %d (shape %s, bucket %lld)", first->line, dup->shape, (long long)dup->bucket);
  return refuse(note, notelen, path, dup->line, why);
}

/* Parse a table's text, all or nothing; see table.h. */
fd_table *fd_table_parse(const char *path, const char *text, size_t len, char *note, size_t notelen) {
  const char *nul = memchr(text, 0, len);
  if (nul) { refuse(note, notelen, path, line_of(text, (size_t)(nul - text)), "a NUL byte"); return NULL; }
  char *buf = malloc(len + 1);
  fd_table *t = calloc(1, sizeof *t);
  if (!buf || !t) {
    free(buf); free(t);
    refuse(note, notelen, path, 0, "out of memory");
    return NULL;
  }
  memcpy(buf, text, len);
  buf[len] = 0;
  char *p = buf;
  int head = check_header(path, &p, note, notelen);
  int rc = head < 0 || parse_rows(path, p, head + 1, t, note, notelen) || check_duplicates(path, t, note, notelen);
  free(buf);
  if (rc) { fd_table_free(t); return NULL; }
  note[0] = 0;
  return t;
}

/* Load a table, all or nothing. */
fd_table *fd_table_load(const char *path, char *note, size_t notelen) {
  size_t len = 0;
  char *buf = slurp(path, &len, note, notelen);
  if (!buf) return NULL;
  fd_table *t = fd_table_parse(path, buf, len, note, notelen);
  free(buf);
  return t;
}

/* The row for shape and bucket. */
const fd_table_row *fd_table_find(const fd_table *t, const char *shape, int64_t bucket) {
  for (size_t i = 0; t && i < t->n; i++)
    if (t->rows[i].bucket == bucket && !strcmp(t->rows[i].shape, shape)) return &t->rows[i];
  return NULL;
}

/* Free a table. */
void fd_table_free(fd_table *t) {
  if (!t) return;
  free(t->rows);
  free(t);
}
