/* The only file that knows libtcc: in-memory compilation of generated C.
   libtcc keeps global state, so every call holds one mutex. */
#include "jit.h"
#include <libtcc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef FD_TCC_VERSION
#define FD_TCC_VERSION "unknown"
#endif

struct fd_jit_unit { TCCState *tcc; };

static pthread_mutex_t tcc_lock = PTHREAD_MUTEX_INITIALIZER;

typedef struct { char *buf; size_t len, used; } msg_sink;

/* libtcc error callback: append one message to the sink. */
static void on_tcc_error(void *opaque, const char *msg) {
  msg_sink *s = opaque;
  if (!s->buf || s->len == 0) return;
  int n = snprintf(s->buf + s->used, s->len - s->used, "%s%s", s->used ? "\n" : "", msg);
  if (n > 0) s->used += (size_t)n < s->len - s->used ? (size_t)n : s->len - s->used - 1;
}

/* The tcc version string of the build. */
const char *fd_jit_version(void) { return FD_TCC_VERSION; }

/* Compile src and look up symbol; see jit.h. */
int fd_jit_compile(const char *src, const char *symbol, fd_jit_unit **unit, void **addr,
                   char *err, size_t errlen) {
  msg_sink sink = { err, errlen, 0 };
  if (err && errlen) err[0] = 0;
  fd_jit_unit *u = calloc(1, sizeof *u);
  if (!u) { snprintf(err, errlen, "out of memory"); return -1; }
  pthread_mutex_lock(&tcc_lock);
  u->tcc = tcc_new();
  int rc = -1;
  if (u->tcc) {
    tcc_set_error_func(u->tcc, &sink, on_tcc_error);   /* first, before anything can fail */
    tcc_set_options(u->tcc, "-nostdlib");
    if (tcc_set_output_type(u->tcc, TCC_OUTPUT_MEMORY) == 0 &&
        tcc_compile_string(u->tcc, src) == 0 &&
        tcc_relocate(u->tcc, TCC_RELOCATE_AUTO) >= 0) {
      *addr = tcc_get_symbol(u->tcc, symbol);
      if (*addr) rc = 0;
      else snprintf(err, errlen, "tcc: symbol %s not found in the generated source", symbol);
    }
    if (rc != 0) { tcc_delete(u->tcc); u->tcc = NULL; }
  } else {
    snprintf(err, errlen, "tcc: tcc_new failed");
  }
  pthread_mutex_unlock(&tcc_lock);
  if (rc != 0) { free(u); return -1; }
  *unit = u;
  return 0;
}

/* Free a compiled unit. */
void fd_jit_free(fd_jit_unit *u) {
  if (!u) return;
  pthread_mutex_lock(&tcc_lock);
  tcc_delete(u->tcc);
  pthread_mutex_unlock(&tcc_lock);
  free(u);
}
