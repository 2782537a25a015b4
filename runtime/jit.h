/* The tcc backend: compile generated C in memory with libtcc. */
#ifndef FD_JIT_H
#define FD_JIT_H
#include <stddef.h>

typedef struct fd_jit_unit fd_jit_unit;   /* kept alive while its symbols are used */

/* Compile src in memory and return the address of symbol. On failure returns
   -1 and writes tcc's messages (file:line from the #line directives) to err. */
int fd_jit_compile(const char *src, const char *symbol, fd_jit_unit **unit, void **addr,
                   char *err, size_t errlen);
/* Free a compiled unit (its code becomes invalid). */
void fd_jit_free(fd_jit_unit *unit);
/* The libtcc version the library was built with, e.g. "0.9.27". */
const char *fd_jit_version(void);

#endif
