/* Tiling key encoding over the field table generated from gen/key.lua. */
#include "key.h"
#include <stdint.h>
#include <string.h>
#include <stdio.h>

/* Encode field values into a decimal key string; see key.h. The digits are
   written one by one: a 20-digit key may exceed 2^64. */
int fd_key_encode(const int v[FD_KF_COUNT], char out[FD_KEY_BUFSZ], char *err, size_t errlen) {
  char d[FD_KEY_DIGITS];
  memset(d, '0', sizeof d);
  for (int f = 0; f < FD_KF_COUNT; f++) {
    const fd_key_field *k = &fd_key_fields[f];
    if (v[f] < k->min || v[f] > k->max) {
      snprintf(err, errlen, "key field %s: %d is out of range %d..%d", k->name, v[f], k->min, k->max);
      return -1;
    }
    for (int i = 0, x = v[f]; i < k->width; i++, x /= 10) d[FD_KEY_DIGITS - 1 - k->pos - i] = (char)('0' + x % 10);
  }
  int first = 0;
  while (first < FD_KEY_DIGITS - 1 && d[first] == '0') first++;
  snprintf(out, FD_KEY_BUFSZ, "%.*s", FD_KEY_DIGITS - first, d + first);
  return 0;
}
