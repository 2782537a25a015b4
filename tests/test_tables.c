/* Upper bounds and tuned tables refused whole (issue 13, findings 3 and 4):
   threads, splits and split work items are bounded and refused with a message
   naming the field; fd_length_bucket never answers below its argument; a
   table with a duplicated row, a key that does not decode or does not fit its
   row's shape, a value the planner may not take, a name empty or too long to
   keep whole, a ratio_ci that is not "-" or lo..hi (issue 20), bytes after
   its end line or a NUL byte is refused whole, its note naming the line and
   why; a table of the former format (magic 1, nine columns) too. */
#include "compare.h"
#include "flashdecode.h"
#include "kexec.h"
#include "table.h"
#include "tcheck.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static fd_ctx *ctx;

/* fd_length_bucket: the smallest power of two >= len, never below len. */
static void length_buckets(void) {
  static const struct { int64_t len, want; } c[] = {
    { INT64_MAX, INT64_MAX }, { (INT64_C(1) << 62) + 1, INT64_MAX }, { INT64_C(1) << 62, INT64_C(1) << 62 },
    { (INT64_C(1) << 62) - 1, INT64_C(1) << 62 }, { 1000, 1024 }, { 1, 1 }, { 0, 1 }, { -5, 1 },
  };
  for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
    int64_t got = fd_length_bucket(c[i].len);
    t_check(got == c[i].want && (got >= c[i].len), "fd_length_bucket(%lld) is %lld (want %lld)", (long long)c[i].len,
            (long long)got, (long long)c[i].want);
  }
}

/* Expect fd_plan_create_opts to fail with FD_EINVAL and a message containing want. */
static void plan_refused(fd_shape s, fd_plan_opts o, const char *want, const char *name) {
  fd_plan *p = (fd_plan *)0x1;
  int rc = fd_plan_create_opts(ctx, &s, &o, &p);
  t_check(rc == FD_EINVAL && strstr(fd_errmsg(ctx), want) && p == NULL, "%s: rc %d, message '%s' (want '%s')", name, rc,
          fd_errmsg(ctx), want);
  if (rc == 0) fd_plan_destroy(p);
}

/* Thread bounds: fd_config.threads and fd_plan_opts.threads above FD_MAX_THREADS. */
static void thread_bounds(void) {
  fd_ctx *c = fd_create(&(fd_config){ .threads = FD_MAX_THREADS + 1 });
  t_check(!c && strstr(fd_errmsg(NULL), "config.threads 1025"), "config.threads 1025 refused: '%s'", fd_errmsg(NULL));
  fd_destroy(c);
  fd_shape s = { 1, 4, 1, 64, 256, FD_F32, FD_F32, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  plan_refused(s, (fd_plan_opts){ .threads = 5000 }, "opts.threads 5000 is above FD_MAX_THREADS",
               "opts.threads 5000 refused");
}

/* Forced splits above kv_len run as kv_len splits and match the reference. */
static void splits_rounded(void) {
  kproblem kp;
  kp_init(&kp, 2, 8, 2, 64, 100, 0, 0, 0, 0, 0, 31);
  fd_shape s = { 2, 8, 2, 64, 100, FD_F32, FD_F32, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  float out[2 * 8 * 64], lse[16];
  double rout[2 * 8 * 64], rlse[16];
  fd_plan *p;
  fd_plan_info info = { 0 };
  if (t_check(fd_plan_create_opts(ctx, &s, &(fd_plan_opts){ .splits = 20000 }, &p) == 0, "splits 20000: plan: %s",
              fd_errmsg(ctx))) {
    fd_plan_info_get(p, 100, &info);
    t_check(info.splits == 100, "opts.splits 20000 on kv_len 100 is rounded down to 100 (got %d)", info.splits);
    fd_args a = { kp.q, kp.k, kp.v, kp.cur_pos, NULL, NULL, NULL, NULL, 0, out, lse };
    if (t_check(fd_run(p, &a) == 0, "splits 20000: run: %s", fd_errmsg(ctx))) {
      ref_attention(&kp.ref, rout, rlse);
      t_compare(&kp, out, lse, rout, rlse, 1, "opts.splits 20000 on kv_len 100 vs reference");
    }
    fd_plan_destroy(p);
  }
  kp_free(&kp);
}

/* Split work items (batch x n_kv_heads x splits) above FD_MAX_SPLIT_ITEMS are refused; at the bound accepted. */
static void split_items_bound(void) {
  fd_shape s = { 64, 8, 8, 64, 4096, FD_F32, FD_F16, FD_F32, FD_FULL, FD_BHSD, 0 };
  plan_refused(s, (fd_plan_opts){ .splits = 64 }, "opts.splits 64 gives 32768 split work items",
               "512 rows x 64 splits refused (FD_MAX_SPLIT_ITEMS)");
  fd_plan *p;
  int rc = fd_plan_create_opts(ctx, &s, &(fd_plan_opts){ .splits = FD_MAX_SPLIT_ITEMS / 512 }, &p);
  if (t_check(rc == 0, "512 rows x 32 splits (the bound) accepted: %s", fd_errmsg(ctx))) fd_plan_destroy(p);
}

/* A kv_len above the planner's largest length bucket is refused, not a crash
   (run in a child: before the bound it overran the plan's bucket array). */
static void kv_len_bound(void) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    fd_shape s = { 1, 1, 1, 16, INT64_C(1) << 56, FD_F32, FD_F32, FD_F32, FD_FULL, FD_BHSD, 0 };
    fd_plan *p = NULL;
    int rc = fd_plan_create(ctx, &s, &p);
    _exit(rc == FD_EINVAL && strstr(fd_errmsg(ctx), "largest length bucket") ? 0 : 1);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  t_check(pid > 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "kv_len 2^56 refused naming the largest length bucket "
          "(child %s %d)", WIFSIGNALED(st) ? "signal" : "exit", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
}

/* Write n bytes of text to a temporary file, '\x01' written as a NUL byte; returns its path (static buffer). */
static const char *temp_file(const char *text) {
  static char path[64];
  char buf[16384];
  size_t n = strlen(text);
  if (n > sizeof buf) abort();
  for (size_t i = 0; i < n; i++) buf[i] = text[i] == '\x01' ? 0 : text[i];
  snprintf(path, sizeof path, "/tmp/fd_tables_XXXXXX");
  int fd = mkstemp(path);
  if (fd < 0 || write(fd, buf, n) != (ssize_t)n) abort();
  close(fd);
  return path;
}

/* A context over table text: is the table used (its row: chunk 32, tile 2, splits 3), and does fd_errmsg say want? */
static void table_case(const char *text, int accept, const char *want, const char *name) {
  const char *path = temp_file(text);
  fd_ctx *c = fd_create(&(fd_config){ .threads = 2, .table = path });
  if (!t_check(c != NULL, "%s: context still created", name)) return;
  const char *msg = fd_errmsg(c);
  t_check(accept ? msg[0] == 0 : strstr(msg, want) && strstr(msg, path) && strstr(msg, "refused"),
          "%s: message '%s' (want '%s')", name, msg, accept ? "" : want);
  fd_shape s = { 1, 4, 1, 64, 2048, FD_F32, FD_F16, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  fd_plan *p;
  fd_plan_info info = { 0 };
  if (t_check(fd_plan_create(c, &s, &p) == 0, "%s: plan: %s", name, fd_errmsg(c))) {
    fd_plan_info_get(p, 2000, &info);
    t_check(info.from_table == accept && (accept ? info.splits == 3 && info.chunk == 32 && info.group_tile == 2
                                                 : info.splits != 3 && info.chunk != 32),
            "%s: from_table %d splits %d chunk %d tile %d", name, info.from_table, info.splits, info.chunk,
            info.group_tile);
    fd_plan_destroy(p);
  }
  fd_destroy(c);
  unlink(path);
}

/* One table case: a row after the good one (row 0: none), the end line, then a trailer. */
typedef struct tcase {
  const char *name;
  int row;                                       /* add the row below as line 9 */
  const char *shape, *bucket, *key, *splits, *threads, *last;   /* NULL: the good row's field */
  const char *trailer;                           /* after the end line; '\x01' is a NUL byte */
  int accept;
  const char *want;                              /* a fragment of the refusal note */
  const char *ci;                                /* the row's ratio_ci; NULL: the good row's */
} tcase;

#define NAME63 "0123456789012345678901234567890123456789012345678901234567890ab"   /* 63 bytes */
#define GOOD_KEY "10032064020000100"             /* chunk 32, head_dim 64, tile 2, kv f16, causal */
#define GOOD_CI "0.912..0.951"
#define NO_CI "\003"                            /* ci: no ratio_ci column (a row of the former format) */
/* Append a row of the table's fields to buf (at most n bytes in all). */
static void add_row(char *buf, size_t n, const char *shape, const char *bucket, const char *key, const char *splits,
                    const char *threads, const char *last, const char *ci) {
  size_t l = strlen(buf);
  snprintf(buf + l, n - l, "%s\t%s\t%s\t%s\t%s\t100.0\t1.5\t120.0\t%s%s%s\n", shape, bucket, key, splits, threads, last,
           strcmp(ci, NO_CI) ? "\t" : "", strcmp(ci, NO_CI) ? ci : "");
}

/* The text of case c: header head, the good row for sig (line 8), c's row, the end line, c's trailer. */
static void case_text(char *buf, size_t n, const char *head, const char *sig, const tcase *c) {
  snprintf(buf, n, "%s", head);
  add_row(buf, n, sig, "2048", GOOD_KEY, "3", "2", "t", GOOD_CI);
#define OR(f, d) (c->f ? c->f : (d))
  if (c->row) add_row(buf, n, OR(shape, sig), OR(bucket, "2048"), OR(key, GOOD_KEY), OR(splits, "3"), OR(threads, "2"),
                      OR(last, "t"), OR(ci, GOOD_CI));
#undef OR
  size_t l = strlen(buf);
  snprintf(buf + l, n - l, "end\t%d\n%s", 1 + c->row, c->trailer ? c->trailer : "");
}

static const tcase CASES[] = {
  { "valid table accepted", 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, "" },
  { "valid table with a second bucket accepted", 1, NULL, "1024", NULL, "1", NULL, NULL, NULL, 1, "" },
  { "duplicated row", 1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, "line 9: duplicates line 8" },
  { "duplicated row, other values", 1, NULL, NULL, NULL, "1", "1", NULL, NULL, 0, "line 9: duplicates line 8" },
  { "key: chunk digits 0", 1, NULL, "1024", "10000064020000100", NULL, NULL, NULL, NULL, 0,
    "line 9: key 10000064020000100 does not decode: field chunk (digits 12-15) is 0" },
  { "key: template digit 2", 1, NULL, "1024", "20032064020000100", NULL, NULL, NULL, NULL, 0, "field template (digits 16-16) is 2" },
  { "key: group_tile digits 00", 1, NULL, "1024", "10032064000000100", NULL, NULL, NULL, NULL, 0, "field group_tile (digits 7-8) is 0" },
  { "key: head_dim digits 000", 1, NULL, "1024", "10032000020000100", NULL, NULL, NULL, NULL, 0, "field head_dim (digits 9-11) is 0" },
  { "key: isa digit 9", 1, NULL, "1024", "10032064029000100", NULL, NULL, NULL, NULL, 0, "field isa (digits 6-6) is 9" },
  { "key: flags digit 9", 1, NULL, "1024", "10032064020900100", NULL, NULL, NULL, NULL, 0, "field flags (digits 5-5) is 9" },
  { "key: kv_dtype digit 8", 1, NULL, "1024", "10032064020000800", NULL, NULL, NULL, NULL, 0, "field kv_dtype (digits 2-2) is 8" },
  { "key: layout digit 3", 1, NULL, "1024", "10032064020000103", NULL, NULL, NULL, NULL, 0, "field layout (digits 0-0) is 3" },
  { "key: 14 digits (template 0)", 1, NULL, "1024", "32064020000100", NULL, NULL, NULL, NULL, 0, "field template (digits 16-16) is 0" },
  { "key: a leading zero", 1, NULL, "1024", "010032064020000100", NULL, NULL, NULL, NULL, 0, "has a leading zero" },
  { "key: 22 digits", 1, NULL, "1024", "1010032064020000100000", NULL, NULL, NULL, NULL, 0, "is not 1 to 21 decimal digits" },
  { "key: k_per_channel digit 2", 1, NULL, "1024", "210032064020000100", NULL, NULL, NULL, NULL, 0,
    "field k_per_channel (digits 17-17) is 2" },
  { "key: beams digit 5", 1, NULL, "1024", "5010032064020000100", NULL, NULL, NULL, NULL, 0,
    "field beams (digits 18-18) is 5" },
  { "key: chunk 5000 above the planner's", 1, NULL, "1024", "15000064020000100", NULL, NULL, NULL, NULL, 0,
    "line 9: key 15000064020000100: chunk 5000 is above 4096" },
  { "key: group_tile 3 does not divide 4", 1, NULL, "1024", "10032064030000100", NULL, NULL, NULL, NULL, 0,
    "group_tile 3 does not divide the shape's 4 query heads" },
  { "key: head_dim 128 on a d64 shape", 1, NULL, "1024", "10032128020000100", NULL, NULL, NULL, NULL, 0,
    "line 9: key 10032128020000100 does not fit the row's shape: head_dim is 128, the shape has 64" },
  { "key: head_dim 128 on a d120 shape (fuzz finding)", 1, "b1.hq32.hkv8.d120.qbf16.kvbf16.obf16.causal.bhsd", "1024",
    "10256128042002220", "1", NULL, NULL, NULL, 0,
    "line 9: key 10256128042002220 does not fit the row's shape: head_dim is 128, the shape has 120" },
  { "key: q_dtype f16 on a q f32 shape", 1, NULL, "1024", "10032064020000110", NULL, NULL, NULL, NULL, 0,
    "line 9: key 10032064020000110 does not fit the row's shape: q_dtype is 1, the shape has 0" },
  { "key: kv_dtype f32 on a kv f16 shape", 1, NULL, "1024", "10032064020000000", NULL, NULL, NULL, NULL, 0,
    "does not fit the row's shape: kv_dtype is 0, the shape has 1" },
  { "key: out_dtype f16 on an out f32 shape", 1, NULL, "1024", "10032064020001100", NULL, NULL, NULL, NULL, 0,
    "does not fit the row's shape: out_dtype is 1, the shape has 0" },
  { "key: mask mode on a causal shape", 1, NULL, "1024", "10032064020010100", NULL, NULL, NULL, NULL, 0,
    "does not fit the row's shape: mask_mode is 1, the shape has 0" },
  { "key: layout bshd on a bhsd shape", 1, NULL, "1024", "10032064020000101", NULL, NULL, NULL, NULL, 0,
    "does not fit the row's shape: layout is 1, the shape has 0" },
  { "key: split flag (not the plain key)", 1, NULL, "1024", "10032064020100100", NULL, NULL, NULL, NULL, 0,
    "does not fit the row's shape: flags is 1, the shape has 0" },
  { "key: an isa this CPU may lack is no misfit", 1, NULL, "1024", "10032064022000100", NULL, NULL, NULL, NULL, 1, "" },
  { "name of 63 bytes accepted", 1, NULL, "1024", NULL, NULL, NULL, NAME63, NULL, 1, "" },
  { "name of 64 bytes", 1, NULL, "1024", NULL, NULL, NULL, NAME63 "x", NULL, 0, "line 9: name '0123456789" },
  { "name of 64 bytes: its size", 1, NULL, "1024", NULL, NULL, NULL, NAME63 "x", NULL, 0, "is 64 bytes, not 1 to 63" },
  { "empty name", 1, NULL, "1024", NULL, NULL, NULL, "", NULL, 0, "line 9: name '' is 0 bytes, not 1 to 63" },
  { "splits 2e9", 1, NULL, "1024", NULL, "2000000000", NULL, NULL, NULL, 0, "line 9: splits '2000000000' is not an integer in 1..1024" },
  { "splits above the bucket", 1, NULL, "1024", NULL, "1025", NULL, NULL, NULL, 0, "splits '1025' is not an integer in 1..1024" },
  { "splits beyond int", 1, NULL, "1024", NULL, "4294967299", NULL, NULL, NULL, 0, "splits '4294967299'" },
  { "split items above FD_MAX_SPLIT_ITEMS", 1, "b64.hq8.hkv8.d64.qf32.kvf16.of32.causal.bhsd", "4096",
    "10032064010000100", "64", NULL, NULL, NULL, 0, "splits '64' is not an integer in 1..32" },
  { "threads above FD_MAX_THREADS", 1, NULL, "1024", NULL, NULL, "5000", NULL, NULL, 0, "line 9: threads '5000' is not an integer in 1..1024" },
  { "threads beyond int", 1, NULL, "1024", NULL, NULL, "4294967298", NULL, NULL, 0, "threads '4294967298'" },
  { "bucket not a power of two", 1, NULL, "2000", NULL, NULL, NULL, NULL, NULL, 0, "line 9: bucket 2000 is not a power of two" },
  { "shape not a signature", 1, "b1.hq4.hkv1.d64.qf32.kvf16.of32.causal.bhsd.x", NULL, NULL, NULL, NULL, NULL, NULL, 0,
    "line 9: shape 'b1.hq4.hkv1.d64.qf32.kvf16.of32.causal.bhsd.x' is not a shape signature" },
  { "eleven fields", 1, NULL, "1024", NULL, NULL, NULL, NULL, NULL, 0, "line 9: has more than 10 fields", "-\tx" },
  { "nine fields (the former format)", 1, NULL, "1024", NULL, NULL, NULL, NULL, NULL, 0, "line 9: has 9 fields, want 10", NO_CI },
  { "ratio_ci '-' (the heuristic's row) accepted", 1, NULL, "1024", NULL, NULL, NULL, NULL, NULL, 1, "", "-" },
  { "ratio_ci 1..1 accepted", 1, NULL, "1024", NULL, NULL, NULL, NULL, NULL, 1, "", "1..1" },
  { "ratio_ci 1.250..12.500 accepted", 1, NULL, "1024", NULL, NULL, NULL, NULL, NULL, 1, "", "1.250..12.500" },
  { "ratio_ci empty", 1, NULL, "1024", NULL, NULL, NULL, NULL, NULL, 0, "line 9: ratio_ci '' is not '-' or lo..hi", "" },
  { "ratio_ci one number", 1, NULL, "1024", NULL, NULL, NULL, NULL, NULL, 0, "ratio_ci '0.95' is not", "0.95" },
  { "ratio_ci lo above hi", 1, NULL, "1024", NULL, NULL, NULL, NULL, NULL, 0, "ratio_ci '0.951..0.912' is not", "0.951..0.912" },
  { "ratio_ci lo 0", 1, NULL, "1024", NULL, NULL, NULL, NULL, NULL, 0, "ratio_ci '0..0.9' is not", "0..0.9" },
  { "ratio_ci negative", 1, NULL, "1024", NULL, NULL, NULL, NULL, NULL, 0, "ratio_ci '-0.9..0.95' is not", "-0.9..0.95" },
  { "ratio_ci three dots", 1, NULL, "1024", NULL, NULL, NULL, NULL, NULL, 0, "ratio_ci '0...95' is not", "0...95" },
  { "ratio_ci trailing dot", 1, NULL, "1024", NULL, NULL, NULL, NULL, NULL, 0, "ratio_ci '0.9..1.' is not", "0.9..1." },
  { "ratio_ci exponent", 1, NULL, "1024", NULL, NULL, NULL, NULL, NULL, 0, "ratio_ci '9e-1..1' is not", "9e-1..1" },
  { "ratio_ci nan", 1, NULL, "1024", NULL, NULL, NULL, NULL, NULL, 0, "ratio_ci 'nan..inf' is not", "nan..inf" },
  { "ratio_ci trailing text", 1, NULL, "1024", NULL, NULL, NULL, NULL, NULL, 0, "ratio_ci '0.9..0.95x' is not", "0.9..0.95x" },
  { "ratio_ci of 64-byte numbers", 1, NULL, "1024", NULL, NULL, NULL, NULL, NULL, 0, "is not '-' or lo..hi",
    "1.000000000000000000000000000000000000000000000000000000000000000..2" },
  { "bytes after the end line", 0, NULL, NULL, NULL, NULL, NULL, NULL, "junk\n", 0, "line 10: bytes after the end line" },
  { "a blank line after the end line", 0, NULL, NULL, NULL, NULL, NULL, NULL, "\n", 0, "line 10: bytes after the end line" },
  { "NUL byte then garbage after the end line", 0, NULL, NULL, NULL, NULL, NULL, NULL, "\x01garbage", 0, "line 10: a NUL byte" },
  { "NUL byte in a row", 1, NULL, "1024", NULL, NULL, NULL, "t\x01x", NULL, 0, "line 9: a NUL byte" },
};

/* A whole table of the former format (magic 1, no ratio_ci column) is refused at its magic line. */
static void former_format(const char *head, const char *sig) {
  char old[4096], text[16384];
  const char *rest = strchr(head, '\n'), *cols = strstr(head, "\tratio_ci\n");
  if (!t_check(rest && cols && !strncmp(head, "flashdecode tuned table 2\n", 26), "header: magic 2 and a ratio_ci column"))
    return;
  snprintf(old, sizeof old, "flashdecode tuned table 1%.*s\n", (int)(cols - rest), rest);
  snprintf(text, sizeof text, "%s%s\t2048\t%s\t3\t2\t100.0\t1.5\t120.0\tt\nend\t1\n", old, sig, GOOD_KEY);
  table_case(text, 0, "line 1 (flashdecode tuned table 2) is 'flashdecode tuned table 1'", "a table of the former format");
}

/* The tokens of what changes a kernel's cost (gen/facts.lua SIGNATURE): the
   window, softcap (only that it is on: read back as FD_SIGNATURE_ON) and the
   feature bits the executed shape keeps, in order; a plain shape's signature
   unchanged; duplicate, misplaced and unknown tokens refused. */
static void feature_signatures(void) {
  fd_shape s = { 1, 32, 8, 128, 32768, FD_BF16, FD_BF16, FD_BF16, FD_CAUSAL, FD_BHSD, 0 }, back, again;
  const char *plain = "b1.hq32.hkv8.d128.qbf16.kvbf16.obf16.causal.bhsd";
  char sig[256], bad[300];
  s.sink_tokens = 4;   /* not part of the signature */
  fd_shape_signature(&s, sig, sizeof sig);
  t_check(!strcmp(sig, plain), "a plain shape's signature is unchanged: %s", sig);
  s.q_len = 2; s.window = 4096; s.softcap = 50.0f; s.features = FD_ALIBI | FD_SINK_LOGITS | FD_SHARED_KV;
  s.mask_mode = FD_FULL;   /* FD_SHARED_KV: the executed shape (b1, t = batch x q_len) without the bit */
  s.batch = 2;
  fd_shape_signature(&s, sig, sizeof sig);
  t_check(!strcmp(sig, "b1.hq32.hkv8.d128.qbf16.kvbf16.obf16.full.bhsd.t4.w4096.softcap.alibi.sink_logits"),
          "window, softcap and the kept feature bits are written in order: %s", sig);
  t_check(!fd_shape_parse(sig, &back) && back.window == 4096 && back.softcap == FD_SIGNATURE_ON && back.q_len == 4 &&
          back.features == (FD_ALIBI | FD_SINK_LOGITS) && back.sink_tokens == 0, "they read back (softcap: the placeholder)");
  fd_shape_signature(&back, bad, sizeof bad);
  t_check(!strcmp(bad, sig), "the parsed shape signs the same: %s", bad);
  for (int i = 0; i < FD_FEATURE_COUNT; i++) {
    fd_shape one = { 1, 4, 1, 64, 2048, FD_F32, FD_F16, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
    one.features = 1u << i;
    if (one.features == FD_SHARED_KV) continue;
    int n = fd_shape_signature(&one, sig, sizeof sig);
    t_check(n > 0 && !fd_shape_parse(sig, &again) && again.features == one.features,
            "feature %s round-trips: %s", fd_feature_names[i], sig);
  }
  s.features = 1u << FD_FEATURE_COUNT;
  t_check(fd_shape_signature(&s, sig, sizeof sig) < 0, "an unknown feature bit has no signature");
  static const char *const BAD[] = { ".alibi.alibi", ".sink_logits.alibi", ".softcap.w4096", ".w4096.t4",
    ".softcap.softcap", ".shared_kv", ".rope", ".w0", ".w04096", ".w", ".softcap50", ".alibi.", "..alibi", ".Alibi",
    ".alibix", ".w4096x" };
  for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
    snprintf(bad, sizeof bad, "%s%s", plain, BAD[i]);
    t_check(fd_shape_parse(bad, &back) != 0, "malformed signature refused: %s", bad);
  }
}

/* Signatures with the optional q_len field (gen/facts.lua omit): written
   only above 1, read back, refused when not canonical. */
static void signatures(void) {
  fd_shape s = { 1, 4, 1, 64, 2048, FD_F32, FD_F16, FD_F32, FD_CAUSAL, FD_PAGED, 16 }, back;
  char sig[256], bad[300];
  s.q_len = 4;
  fd_shape_signature(&s, sig, sizeof sig);
  t_check(!strcmp(sig, "b1.hq4.hkv1.d64.qf32.kvf16.of32.causal.paged.t4"), "q_len 4 is written: %s", sig);
  t_check(!fd_shape_parse(sig, &back) && back.q_len == 4 && back.layout == FD_PAGED, "q_len 4 reads back");
  s.q_len = 1;
  fd_shape_signature(&s, sig, sizeof sig);
  t_check(!strstr(sig, ".t") && !fd_shape_parse(sig, &back) && back.q_len == 0, "q_len 1 is left out: %s", sig);
  snprintf(bad, sizeof bad, "%s.t1", sig);
  t_check(fd_shape_parse(bad, &back) != 0, "q_len written at 1 is refused (not canonical)");
  snprintf(bad, sizeof bad, "%s.t4.x", sig);
  t_check(fd_shape_parse(bad, &back) != 0, "text after the last field is refused");
  feature_signatures();
}

/* Every table case. */
static void tables(void) {
  char head[4096], sig[256], text[16384];
  fd_tuned_table_header(head, sizeof head);
  fd_shape s = { 1, 4, 1, 64, 2048, FD_F32, FD_F16, FD_F32, FD_CAUSAL, FD_BHSD, 0 };
  fd_shape_signature(&s, sig, sizeof sig);
  for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
    case_text(text, sizeof text, head, sig, &CASES[i]);
    table_case(text, CASES[i].accept, CASES[i].want, CASES[i].name);
  }
  former_format(head, sig);
}

int main(void) {
  ctx = fd_create(&(fd_config){ .threads = 2 });
  if (!t_check(ctx != NULL, "fd_create: %s", fd_errmsg(NULL))) return t_done();
  length_buckets();
  thread_bounds();
  splits_rounded();
  split_items_bound();
  kv_len_bound();
  tables();
  signatures();
  fd_destroy(ctx);
  kx_cleanup();
  return t_done();
}
