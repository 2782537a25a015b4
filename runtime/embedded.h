/* Generator modules and templates compiled into the library (build/embedded.c). */
#ifndef FD_EMBEDDED_H
#define FD_EMBEDDED_H
#include <stddef.h>
typedef struct fd_embedded_file { const char *name; size_t len; const char *text; } fd_embedded_file;
extern const fd_embedded_file fd_embedded_files[];   /* ends with a NULL name */
#endif
