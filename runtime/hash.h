/* The library's one string hash: 64-bit FNV-1a (the templates hash, the cc
   backend's shared-object names, the kernel cache's tables, the check line
   of a kept source). */
#ifndef FD_HASH_H
#define FD_HASH_H
#include <stddef.h>
#include <stdint.h>

#define FD_FNV_START 1469598103934665603ull

/* h extended by FNV-1a over the n bytes at p (start from FD_FNV_START). */
static inline uint64_t fd_fnv1a(uint64_t h, const void *p, size_t n) {
  const unsigned char *s = p;
  for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
  return h;
}

#endif
