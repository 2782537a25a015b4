/* The generator run inside the library: embedded Lua 5.4 over embedded gen/ and templates/. */
#ifndef FD_LUAGEN_H
#define FD_LUAGEN_H
#include "flashdecode.h"
#include <stddef.h>

typedef struct fd_gen fd_gen;

/* Start a generator; NULL with err filled on failure. Not thread-safe: one user at a time. */
fd_gen *fd_gen_new(char *err, size_t errlen);
/* Generate the C source of key into a malloc'd string; -1 with the generator's error. */
int fd_gen_source(fd_gen *g, const char *key, char **src, char *err, size_t errlen);
/* The same, without #line directives when lines is 0 (the same code, less text to compile). */
int fd_gen_source_lines(fd_gen *g, const char *key, int lines, char **src, char *err, size_t errlen);
/* A hash of every embedded template and generator module (identifies a build's kernels). */
const char *fd_gen_template_hash(void);
void fd_gen_free(fd_gen *g);

/* One shape of a shape set, with its kv lengths. */
typedef struct fd_gen_shape {
  char name[64];
  fd_shape shape;           /* kv_len = the largest of kv_lens */
  int64_t kv_lens[32];
  int n_lens, lse;
} fd_gen_shape;

/* Shapes of a shape-set file, or one inline spec "batch=1,n_q_heads=8,...,kv_len=1024:4096"
   (spec contains '='); only the shape called name when name is not NULL. malloc'd array. */
int fd_gen_shapes(const char *file_or_spec, const char *name, fd_gen_shape **out, int *n, char *err, size_t errlen);
/* Run the embedded generator CLI (gen/fdgen.lua) with argv; returns its exit status. */
int fd_gen_cli(int argc, char **argv);

#endif
