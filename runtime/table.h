/* Tuned tables: plain text, refused whole when from another machine or build,
   or when any byte of them is not what the planner may take (FFTW's rule). */
#ifndef FD_TABLE_H
#define FD_TABLE_H
#include "flashdecode.h"
#include "key.h"
#include "model.h"
#include <stddef.h>
#include <stdint.h>

typedef struct fd_table_row {
  char shape[192];          /* fd_shape_signature text */
  int64_t bucket;           /* kv-length bucket upper bound (a power of two) */
  char key[24];             /* winning tiling key */
  int splits, threads;
  double median_us, gbps, heuristic_us;
  char name[64];            /* the shape's name in its shape set (1 to 63 bytes, else the table is refused) */
  int line;                 /* the row's line in its file */
} fd_table_row;

typedef struct fd_table {
  fd_table_row *rows;
  size_t n;
  fd_model model;          /* the cost model's lines, when the table has them (model.present) */
} fd_table;

/* Load path; NULL with a sentence saying why in note (the table is refused whole). */
fd_table *fd_table_load(const char *path, char *note, size_t notelen);
/* Load a table from text of len bytes (NULs included) read from path (for
   messages); NULL with the reason in note. For the loader and its fuzzer. */
fd_table *fd_table_parse(const char *path, const char *text, size_t len, char *note, size_t notelen);
/* The row for a shape signature and bucket, or NULL. */
const fd_table_row *fd_table_find(const fd_table *t, const char *shape, int64_t bucket);
void fd_table_free(fd_table *t);

/* Decode a tiling key's digit groups into v[FD_KF_*]: 1 to 17 decimal digits,
   every group in its range; 0, or -1 with why naming the field. */
int fd_table_decode_key(const char *key, int v[FD_KF_COUNT], char *why, size_t n);
/* Decode key into v (as fd_table_decode_key) and check that it fits shape s:
   the same head_dim, dtypes, mask mode and layout, flags 0 (a row holds the
   plain key) and a group tile dividing the shape's query heads per kv head.
   Its isa is not part of the fit: a table may name an isa this CPU lacks (the
   planner then uses the heuristic). The one fit check: the loader refuses a
   table with a row that fails it, the planner checks it before adopting a
   row. 0, or -1 with why naming the key and the field. */
int fd_table_key_fits(const char *key, const fd_shape *s, int v[FD_KF_COUNT], char *why, size_t n);
/* Parse a shape signature (the inverse of fd_shape_signature, kv_len,
   page_size, pool_pages and sink_tokens left 0; a softcap token gives the
   placeholder FD_SIGNATURE_ON, which signs the same); 0, or -1 when sig is
   not one in canonical form. */
int fd_shape_parse(const char *sig, fd_shape *s);

#endif
