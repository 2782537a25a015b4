/* Tiling key encoding over the field table generated from gen/key.lua. */
#include "key.h"
#include <stdint.h>
#include <stdio.h>

/* Encode field values into a decimal key string; see key.h. */
int fd_key_encode(const int v[FD_KF_COUNT], char out[FD_KEY_BUFSZ], char *err, size_t errlen) {
  uint64_t k = 0;
  for (int f = 0; f < FD_KF_COUNT; f++) {
    const fd_key_field *d = &fd_key_fields[f];
    if (v[f] < d->min || v[f] > d->max) {
      snprintf(err, errlen, "key field %s: %d is out of range %d..%d", d->name, v[f], d->min, d->max);
      return -1;
    }
    uint64_t p = 1;
    for (int i = 0; i < d->pos; i++) p *= 10;
    k += (uint64_t)v[f] * p;
  }
  snprintf(out, FD_KEY_BUFSZ, "%llu", (unsigned long long)k);
  return 0;
}
