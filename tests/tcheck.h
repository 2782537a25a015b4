/* Minimal C test reporter: "FAIL - name: why" per failure, "N passed, N failed" at the end. */
#ifndef FD_TCHECK_H
#define FD_TCHECK_H
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int t_passed, t_failed;

/* Record one check; on failure print the formatted reason. Returns cond. */
static inline int t_check(int cond, const char *fmt, ...) {
  if (cond) { t_passed++; if (getenv("FD_VERBOSE")) { va_list a; va_start(a, fmt); printf("ok - "); vprintf(fmt, a); printf("\n"); va_end(a); } return 1; }
  t_failed++;
  va_list a; va_start(a, fmt);
  printf("FAIL - "); vprintf(fmt, a); printf("\n");
  va_end(a);
  fflush(stdout);
  return 0;
}

/* Print the closing line; the process exit status. */
static inline int t_done(void) {
  printf("%d passed, %d failed\n", t_passed, t_failed);
  return t_failed ? 1 : 0;
}
#endif
