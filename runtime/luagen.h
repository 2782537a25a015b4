/* The generator run inside the library: embedded Lua 5.4 over embedded gen/ and templates/. */
#ifndef FD_LUAGEN_H
#define FD_LUAGEN_H
#include <stddef.h>

typedef struct fd_gen fd_gen;

/* Start a generator; NULL with err filled on failure. Not thread-safe: one user at a time. */
fd_gen *fd_gen_new(char *err, size_t errlen);
/* Generate the C source of key into a malloc'd string; -1 with the generator's error. */
int fd_gen_source(fd_gen *g, const char *key, char **src, char *err, size_t errlen);
/* A hash of every embedded template and generator module (identifies a build's kernels). */
const char *fd_gen_template_hash(void);
void fd_gen_free(fd_gen *g);

#endif
