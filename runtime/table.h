/* Tuned tables: plain text, refused whole when from another machine or build. */
#ifndef FD_TABLE_H
#define FD_TABLE_H
#include <stddef.h>
#include <stdint.h>

typedef struct fd_table_row {
  char shape[192];          /* fd_shape_signature text */
  int64_t bucket;           /* kv-length bucket upper bound */
  char key[24];             /* winning tiling key */
  int splits, threads;
  double median_us, gbps, heuristic_us;
  char name[64];            /* the shape's name in its shape set */
} fd_table_row;

typedef struct fd_table { fd_table_row *rows; size_t n; } fd_table;

/* Load path; NULL with a sentence saying why in note (the table is refused whole). */
fd_table *fd_table_load(const char *path, char *note, size_t notelen);
/* The row for a shape signature and bucket, or NULL. */
const fd_table_row *fd_table_find(const fd_table *t, const char *shape, int64_t bucket);
void fd_table_free(fd_table *t);

#endif
