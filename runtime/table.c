/* Tuned table reader. Format (tab-separated):
     flashdecode tuned table 1
     library <v> / templates <hash> / tcc <v> / cpu <model> / features <list>
     columns shape bucket key splits threads median_us gbps heuristic_us name
     <one row per shape and bucket>
     end <number of rows>
   Any difference in the header, a malformed row or a missing or wrong end line
   refuses the whole table. */
#include "table.h"
#include "cpu.h"
#include "flashdecode.h"
#include "jit.h"
#include "luagen.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAGIC "flashdecode tuned table 1"
static const char *COLUMNS = "columns\tshape\tbucket\tkey\tsplits\tthreads\tmedian_us\tgbps\theuristic_us\tname";

/* The header this build writes and accepts: magic, identity lines, columns. */
int fd_tuned_table_header(char *buf, size_t size) {
  int n = snprintf(buf, size, "%s\nlibrary\t%s\ntemplates\t%s\ntcc\t%s\ncpu\t%s\nfeatures\t%s\n%s\n",
                   MAGIC, FD_VERSION, fd_gen_template_hash(), fd_jit_version(), fd_cpu_model(),
                   fd_cpu_features(), COLUMNS);
  return n < 0 || (size_t)n >= size ? -1 : n;
}

/* Read a whole file into a NUL-terminated buffer. */
static char *slurp(const char *path, char *note, size_t notelen) {
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
  return buf;
}

/* Compare the file's header with ours line by line; 0 or -1 with the field named. */
static int check_header(const char *path, char **cursor, char *note, size_t notelen) {
  char want[4096];
  fd_tuned_table_header(want, sizeof want);
  char *w = want;
  for (int line = 1; *w; line++) {
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
  return 0;
}

/* Parse one row; 0 or -1 with the reason in why. */
static int parse_row(char *line, fd_table_row *r, char *why, size_t n) {
  char *f[9];
  int k = 0;
  for (char *p = line; k < 9; k++) {
    f[k] = p;
    char *t = strchr(p, '\t');
    if (!t) { k++; break; }
    *t = 0;
    p = t + 1;
  }
  if (k != 9) { snprintf(why, n, "has %d fields, want 9", k); return -1; }
  char *end;
  memset(r, 0, sizeof *r);
  snprintf(r->shape, sizeof r->shape, "%s", f[0]);
  r->bucket = strtoll(f[1], &end, 10);
  if (*end || r->bucket < 1) { snprintf(why, n, "bucket '%s' is not a positive integer", f[1]); return -1; }
  if (strspn(f[2], "0123456789") != strlen(f[2]) || strlen(f[2]) == 0 || strlen(f[2]) > 17) {
    snprintf(why, n, "key '%s' is not a tiling key", f[2]); return -1;
  }
  snprintf(r->key, sizeof r->key, "%s", f[2]);
  r->splits = (int)strtol(f[3], &end, 10);
  if (*end || r->splits < 1) { snprintf(why, n, "splits '%s' is not a positive integer", f[3]); return -1; }
  r->threads = (int)strtol(f[4], &end, 10);
  if (*end || r->threads < 1) { snprintf(why, n, "threads '%s' is not a positive integer", f[4]); return -1; }
  double *num[] = { &r->median_us, &r->gbps, &r->heuristic_us };
  for (int i = 0; i < 3; i++) {
    *num[i] = strtod(f[5 + i], &end);
    if (*end || end == f[5 + i]) { snprintf(why, n, "field %d '%s' is not a number", 6 + i, f[5 + i]); return -1; }
  }
  snprintf(r->name, sizeof r->name, "%s", f[8]);
  return 0;
}

/* Parse rows up to the end line. */
static int parse_rows(const char *path, char *p, int first_line, fd_table *t, char *note, size_t notelen) {
  size_t cap = 0;
  for (int line = first_line; *p; line++) {
    char *e = strchr(p, '\n');
    if (!e) break;
    *e = 0;
    if (!strncmp(p, "end\t", 4)) {
      char *end;
      long long n = strtoll(p + 4, &end, 10);
      if (*end || n != (long long)t->n || e[1]) {
        snprintf(note, notelen, "tuned table %s: refused: line %d: the end line does not close %zu rows; using the heuristic", path, line, t->n);
        return -1;
      }
      return 0;
    }
    if (t->n == cap) {
      fd_table_row *r = realloc(t->rows, (cap = cap ? 2 * cap : 64) * sizeof *r);
      if (!r) { snprintf(note, notelen, "tuned table %s: out of memory", path); return -1; }
      t->rows = r;
    }
    char why[256];
    if (parse_row(p, &t->rows[t->n], why, sizeof why)) {
      snprintf(note, notelen, "tuned table %s: refused: line %d: %s; using the heuristic", path, line, why);
      return -1;
    }
    t->n++;
    p = e + 1;
  }
  snprintf(note, notelen, "tuned table %s: refused: truncated (no end line); using the heuristic", path);
  return -1;
}

/* Load a table, all or nothing. */
fd_table *fd_table_load(const char *path, char *note, size_t notelen) {
  char *buf = slurp(path, note, notelen);
  if (!buf) return NULL;
  char *p = buf;
  fd_table *t = calloc(1, sizeof *t);
  int rc = !t || check_header(path, &p, note, notelen) || parse_rows(path, p, 8, t, note, notelen);
  free(buf);
  if (rc) { fd_table_free(t); return NULL; }
  note[0] = 0;
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
