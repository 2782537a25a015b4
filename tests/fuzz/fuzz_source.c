/* libFuzzer target: fd_kernel_source (a key in, the embedded Lua generator's
   C source or a refusal out), on one context kept across inputs.
   Input '#' then 11 bytes: one byte per key field, taken modulo the field's
   range (so most inputs are valid keys and reach the templates); any other
   input: the bytes as the key string.
   Invariants:
   - a refusal leaves a message in fd_errmsg; for a key that decodes, the
     message names one of the key's fields;
   - a source comes only for a key that decodes in C (fd_table_decode_key,
     after the leading zeros the generator ignores), and it defines that
     key's descriptor fd_k<key>_desc and has balanced braces. */
#include "fuzz.h"
#include "flashdecode.h"
#include "key.h"
#include "table.h"

/* The context every input uses (created once: the Lua generator is kept warm). */
static fd_ctx *context(void) {
  static fd_ctx *ctx;
  if (!ctx && !(ctx = fd_create(&(fd_config){ .threads = 1 }))) fuzz_fail("fd_create: %s", fd_errmsg(NULL));
  return ctx;
}

/* A key from one byte per field, each taken into the field's range. */
static void key_from_bytes(const uint8_t *b, char *key) {
  int v[FD_KF_COUNT];
  char err[256];
  for (int f = 0; f < FD_KF_COUNT; f++) {
    const fd_key_field *d = &fd_key_fields[f];
    v[f] = d->min + b[f] % (d->max - d->min + 1);
  }
  if (fd_key_encode(v, key, err, sizeof err)) fuzz_fail("in-range values do not encode: %s", err);
}

/* Does msg name one of the tiling key's fields? */
static int names_a_field(const char *msg) {
  for (int f = 0; f < FD_KF_COUNT; f++)
    if (strstr(msg, fd_key_fields[f].name)) return 1;
  return 0;
}

/* Are the braces of src balanced (never closing more than opened)? */
static int balanced(const char *src) {
  long depth = 0;
  for (const char *p = src; *p && depth >= 0; p++) depth += (*p == '{') - (*p == '}');
  return depth == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char key[65];
  if (size >= 1 + FD_KF_COUNT && data[0] == '#') key_from_bytes(data + 1, key);
  else fuzz_string(data, size, key, 64);
  fd_ctx *ctx = context();
  const char *canon = key;
  while (canon[0] == '0' && canon[1]) canon++;
  int v[FD_KF_COUNT];
  char why[512];
  int decodes = fd_table_decode_key(canon, v, why, sizeof why) == 0;
  char *src = fd_kernel_source(ctx, key);
  if (!src) {
    const char *msg = fd_errmsg(ctx);
    if (!msg[0]) fuzz_fail("fd_kernel_source('%s') refused without a message", key);
    if (decodes && !names_a_field(msg)) fuzz_fail("fd_kernel_source('%s') refused naming no key field: %s", key, msg);
    return 0;
  }
  if (!decodes) fuzz_fail("fd_kernel_source('%s') gave a source but the key does not decode: %s", key, why);
  char sym[96];
  snprintf(sym, sizeof sym, "fd_k%s_desc", canon);
  if (!strstr(src, sym)) fuzz_fail("the source of '%s' does not define %s", key, sym);
  if (!balanced(src)) fuzz_fail("the source of '%s' has unbalanced braces", key);
  free(src);
  return 0;
}
