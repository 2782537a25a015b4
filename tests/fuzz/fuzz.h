/* Helpers shared by the libFuzzer targets of tests/fuzz/: an invariant that
   aborts (libFuzzer then saves the input as a crash) and input as a C string. */
#ifndef FD_FUZZ_H
#define FD_FUZZ_H
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Report a broken invariant and abort (the input is saved as crash-*). */
static inline void fuzz_fail(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static inline void fuzz_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("INVARIANT BROKEN - ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  abort();
}

/* The first at most cap bytes of data as a NUL-terminated string in out[cap + 1]
   (an embedded NUL ends it early, as it would for any C caller). */
static inline void fuzz_string(const uint8_t *data, size_t size, char *out, size_t cap) {
  size_t n = size < cap ? size : cap;
  memcpy(out, data, n);
  out[n] = 0;
}

#endif
