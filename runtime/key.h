/* Tiling keys in C: encoding from field values (the layout comes from gen/key.lua). */
#ifndef FD_KEY_H
#define FD_KEY_H
#include <stddef.h>
#include "fd_keydefs.h"

#define FD_KEY_BUFSZ 24

/* Encode v[FD_KF_*] into a decimal key in out; -1 with err naming the field if out of range. */
int fd_key_encode(const int v[FD_KF_COUNT], char out[FD_KEY_BUFSZ], char *err, size_t errlen);

#endif
