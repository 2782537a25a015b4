/* The cc backend: the system C compiler into a disk cache, then dlopen. */
#ifndef FD_CC_H
#define FD_CC_H
#include <stddef.h>

typedef struct fd_cc_unit fd_cc_unit;

/* The compiler's identity ("gcc (Debian 12.2.0-14) 12.2.0"), or NULL when none runs. */
const char *fd_cc_version(void);
/* Compile src (the kernel of key) into cache_dir, or reuse the cached library
   of the same key, source hash and compiler; return symbol's address. */
int fd_cc_compile(const char *src, const char *key, const char *cache_dir, const char *symbol,
                  fd_cc_unit **unit, void **addr, char *err, size_t errlen);
void fd_cc_free(fd_cc_unit *unit);
/* Whether dir (NULL: the default) can hold the cache (created if missing);
   0, or -1 with the reason in why. */
int fd_cc_check_dir(const char *dir, char *why, size_t whylen);
/* Whether $FD_CC_DEBUG asks for #line directives and -g in cc kernels. */
int fd_cc_debug(void);
/* The cache directory a NULL config value means. */
const char *fd_cc_default_dir(void);

#endif
