/* libFuzzer target: the tiling key on the C side, decoder (fd_table_decode_key,
   runtime/table.c) and encoder (fd_key_encode, runtime/key.c).
   Input '#' then 2 bytes per field: the FD_KF_COUNT field values (int16) to encode;
   any other input: the bytes as a key string to decode.
   Invariants, against an independent reading of the layout (fd_key_fields):
   - decode succeeds exactly when the key is 1..FD_KEY_DIGITS digits with every digit
     group in its range and no leading zero, gives those groups, and
     re-encodes to the same string;
   - a refusal says why, naming the key;
   - encode succeeds exactly when every value is in its range, its key (up to
     the template digit at least, no leading zero) decodes
     back to the values; a refusal names the first field out of range. */
#include "fuzz.h"
#include "key.h"
#include "table.h"

/* The reference reading: 1 when key is 1..FD_KEY_DIGITS digits, no leading zero, every group in range (groups in v). */
static int reference_decode(const char *key, int v[FD_KF_COUNT]) {
  size_t len = strlen(key);
  if (len == 0 || len > FD_KEY_DIGITS || key[0] == '0') return 0;
  for (size_t i = 0; i < len; i++) if (key[i] < '0' || key[i] > '9') return 0;
  int ok = 1;
  for (int f = 0; f < FD_KF_COUNT; f++) {
    const fd_key_field *d = &fd_key_fields[f];
    int x = 0;
    for (int w = d->width - 1; w >= 0; w--) {      /* digit pos + w counted from the right */
      size_t from_right = (size_t)(d->pos + w);
      x = x * 10 + (from_right < len ? key[len - 1 - from_right] - '0' : 0);
    }
    v[f] = x;
    ok &= x >= d->min && x <= d->max;
  }
  return ok;
}

/* Decode key and check it against the reference and the encoder. */
static void decode_case(const char *key) {
  int v[FD_KF_COUNT], r[FD_KF_COUNT];
  char why[512] = "", back[FD_KEY_BUFSZ], err[256];
  int rc = fd_table_decode_key(key, v, why, sizeof why);
  int ref = reference_decode(key, r);
  if ((rc == 0) != ref) fuzz_fail("decode '%s' returned %d, the reference says %s (%s)", key, rc, ref ? "valid" : "invalid", why);
  if (rc) {
    if (!why[0] || !strstr(why, "key")) fuzz_fail("decode '%s' refused without naming the key: '%s'", key, why);
    return;
  }
  for (int f = 0; f < FD_KF_COUNT; f++)
    if (v[f] != r[f]) fuzz_fail("decode '%s': field %s is %d, the reference %d", key, fd_key_fields[f].name, v[f], r[f]);
  if (fd_key_encode(v, back, err, sizeof err)) fuzz_fail("decoded '%s' does not re-encode: %s", key, err);
  if (strcmp(back, key)) fuzz_fail("decode '%s' then encode gives '%s'", key, back);
}

/* Encode values and check the result decodes back, or the refusal names the first bad field. */
static void encode_case(const int v[FD_KF_COUNT]) {
  char key[FD_KEY_BUFSZ], err[256] = "", why[512] = "";
  int first_bad = -1, back[FD_KF_COUNT];
  for (int f = FD_KF_COUNT - 1; f >= 0; f--)
    if (v[f] < fd_key_fields[f].min || v[f] > fd_key_fields[f].max) first_bad = f;
  int rc = fd_key_encode(v, key, err, sizeof err);
  if (first_bad >= 0) {
    char want[64];
    snprintf(want, sizeof want, "field %s:", fd_key_fields[first_bad].name);
    if (!rc || !strstr(err, want)) fuzz_fail("encode with %s = %d out of range: rc %d, '%s'", fd_key_fields[first_bad].name,
                                              v[first_bad], rc, err);
    return;
  }
  if (rc) fuzz_fail("encode of in-range values refused: %s", err);
  size_t len = strlen(key), least = (size_t)fd_key_fields[FD_KF_TEMPLATE].pos + 1;   /* template is at least 1 */
  if (len < least || len > FD_KEY_DIGITS || key[0] == '0')   /* the feature digits above it may be 0 */
    fuzz_fail("encode gave '%s', not %zu..%d digits without a leading zero", key, least, FD_KEY_DIGITS);
  if (fd_table_decode_key(key, back, why, sizeof why)) fuzz_fail("encoded '%s' does not decode: %s", key, why);
  for (int f = 0; f < FD_KF_COUNT; f++)
    if (back[f] != v[f]) fuzz_fail("'%s': field %s encoded %d, decodes %d", key, fd_key_fields[f].name, v[f], back[f]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size >= 1 + 2 * FD_KF_COUNT && data[0] == '#') {
    int v[FD_KF_COUNT];
    for (int f = 0; f < FD_KF_COUNT; f++) v[f] = (int16_t)(data[1 + 2 * f] | data[2 + 2 * f] << 8);
    encode_case(v);
    return 0;
  }
  char key[65];
  fuzz_string(data, size, key, 64);
  decode_case(key);
  return 0;
}
