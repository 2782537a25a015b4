/* The C test reporter's counters and output. */
#include "tcheck.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int passed, failed;

/* Record one check. */
int t_check(int cond, const char *fmt, ...) {
  va_list a;
  if (cond) {
    passed++;
    if (getenv("FD_VERBOSE")) { va_start(a, fmt); printf("ok - "); vprintf(fmt, a); printf("\n"); va_end(a); }
    return 1;
  }
  failed++;
  va_start(a, fmt);
  printf("FAIL - "); vprintf(fmt, a); printf("\n");
  va_end(a);
  fflush(stdout);
  return 0;
}

/* Print the closing line. */
int t_done(void) {
  printf("%d passed, %d failed\n", passed, failed);
  fflush(stdout);
  return failed ? 1 : 0;
}
