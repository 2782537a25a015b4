/* Error messages: per calling thread, so concurrent users of one context each
   read why their own last call failed. */
#include "internal.h"
#include <stdarg.h>
#include <stdio.h>

static _Thread_local struct { const fd_ctx *ctx; char msg[2048]; } last;

/* Record an error for ctx and return code. */
int fd_fail(const fd_ctx *ctx, int code, const char *fmt, ...) {
  va_list a;
  va_start(a, fmt);
  vsnprintf(last.msg, sizeof last.msg, fmt, a);
  va_end(a);
  last.ctx = ctx;
  return code;
}

/* Forget the calling thread's error for ctx. */
void fd_clear_error(const fd_ctx *ctx) {
  if (last.ctx == ctx) last.msg[0] = 0;
}

/* Why the calling thread's last call on ctx failed ("" if it did not). */
const char *fd_errmsg(const fd_ctx *ctx) {
  if (last.ctx == ctx && last.msg[0]) return last.msg;
  if (ctx && ctx->table_note[0]) return ctx->table_note;
  return "";
}

/* Bytes per element of a dtype. */
size_t fd_dtype_size(int dtype) {
  return dtype >= 0 && dtype < FD_DTYPE_COUNT ? fd_dtype_sizes[dtype] : 0;
}

/* Bytes of n elements of a KV dtype (n a multiple of its block: gen/facts.lua kv_bytes). */
size_t fd_kv_bytes(int dtype, size_t n) { return n / fd_dtype_block[dtype] * fd_dtype_block_bytes[dtype]; }

/* The unit K/V strides count in: the element size, or 1 (bytes) for a block dtype. */
size_t fd_kv_unit(int dtype) { return fd_dtype_block[dtype] > 1 ? 1 : fd_dtype_sizes[dtype]; }
