/* fdmpi_run: attend the local shard with fd_run, validate collectively, then
   combine the partial states across ranks (see flashdecode_mpi.h). */
#include "flashdecode_mpi.h"
#include "fd_keydefs.h"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MSG_LEN = 512, SIG_LEN = 128 };
static _Thread_local char errbuf[1024];
static const char *const MODE_NAME[] = { "FD_CAUSAL", "FD_MASK", "FD_FULL" };
static const char *const DTYPE_NAME[] = { "FD_F32", "FD_F16", "FD_BF16", "FD_I8", "FD_FP8_E4M3", "FD_FP8_E5M2" };
static const char *const COMBINE_NAME[] = { "default", "reduce", "gather" };

/* How fd_run visits a row's keys here: over the shard viewed from local slot
   shift (K, V and scales start shift keys later), at view cur_pos pos. */
typedef struct span { int64_t shift, pos; } span;

/* One call's working state. */
typedef struct call {
  const fd_plan *plan;
  const fd_args *args;
  const fdmpi_shard *sh;
  const fd_shape *s;
  MPI_Comm comm;
  int root, rank, np, combine, receives;
  int64_t rows;                 /* B x Hq */
  int D;
  float *state;                 /* this rank's state: out [rows, D] then lse [rows] */
  float *recv;                  /* receivers: the combined records, or every rank's state */
  int32_t *pos;                 /* [B] view cur_pos handed to fd_run in a pass */
  float *no_sink;               /* FD_SINK_LOGITS: [Hq] -inf, fd_run's sink logits (the combine adds the real ones once) */
  unsigned char *in_pass;       /* [B] rows whose keys the current pass attends */
  span *spans;                  /* [B][2] each row's spans (a window range and the sinks may need two) */
  unsigned char *n_spans;       /* [B] 0 (no attended key here), 1 or 2 */
  int64_t *shifts;              /* [2B] the passes: distinct span shifts, ascending */
  int code;                     /* local failure (0: none), with msg */
  char msg[MSG_LEN];
} call;

/* What every rank must agree on, gathered from each rank (40 bytes). */
typedef struct head {
  int32_t code, root, combine, pad;
  uint64_t shape_hash, q_hash;
  uint32_t scale_bits, pad2;
  uint64_t extra_hash;          /* args.alibi_slopes and args.sink_logits, when the features use them */
} head;

/* Per row and rank: the shard's first global key, its key count, the global cur_pos (-1: not causal). */
typedef struct row_rec { int64_t off, n, pos; } row_rec;

/* Leave a message for fdmpi_errmsg and return code. */
static int fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(int code, const char *fmt, ...) {
  va_list a;
  va_start(a, fmt);
  vsnprintf(errbuf, sizeof errbuf, fmt, a);
  va_end(a);
  return code;
}

/* Record a local failure (the first one) in the call; returns code. */
static int local_fail(call *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int local_fail(call *c, int code, const char *fmt, ...) {
  if (c->code) return c->code;
  va_list a;
  va_start(a, fmt);
  vsnprintf(c->msg, sizeof c->msg, fmt, a);
  va_end(a);
  c->code = code;
  return code;
}

/* An MPI return code turned into FDMPI_EMPI with MPI's own text. */
static int mpi_fail(int mrc, const char *what) {
  char s[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(mrc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "error %d", mrc);
  return fail(FDMPI_EMPI, "fdmpi_run: %s failed: %s", what, s);
}

/* See flashdecode_mpi.h. */
const char *fdmpi_errmsg(void) { return errbuf; }

/* 64-bit hash of a byte string, eight bytes per step (splitmix64 finalizer). */
static uint64_t hash_bytes(const void *p, size_t n, uint64_t h) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i += 8) {
    uint64_t w = 0;
    memcpy(&w, b + i, n - i < 8 ? n - i : 8);
    h ^= w + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  }
  return h ^ (h >> 31) ^ n;
}

/* Checks that need no other rank and no collective: the communicator and MPI itself. */
static int comm_check(MPI_Comm comm) {
  int init = 0, fin = 0, inter = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) return fail(FD_EINVAL, "fdmpi_run: MPI is %s", fin ? "finalized" : "not initialized (call MPI_Init first)");
  if (comm == MPI_COMM_NULL) return fail(FD_EINVAL, "fdmpi_run: comm is MPI_COMM_NULL");
  if (MPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS) return fail(FD_EINVAL, "fdmpi_run: comm is not a valid communicator");
  if (inter) return fail(FD_EINVAL, "fdmpi_run: comm is an inter-communicator; an intra-communicator is needed");
  return 0;
}

/* Local checks of the plan, args and shard (the message names the field). */
static int check_pointers(call *c) {
  const fdmpi_shard *sh = c->sh;
  const fd_args *a = c->args;
  if (!c->plan) return local_fail(c, FD_EINVAL, "plan is NULL");
  if (!a) return local_fail(c, FD_EINVAL, "args is NULL");
  if (!sh) return local_fail(c, FD_EINVAL, "shard is NULL");
  if (!sh->shape) return local_fail(c, FD_EINVAL, "shard.shape is NULL");
  if (!sh->key_offset) return local_fail(c, FD_EINVAL, "shard.key_offset is NULL");
  if (!sh->n_keys) return local_fail(c, FD_EINVAL, "shard.n_keys is NULL");
  if (!a->q) return local_fail(c, FD_EINVAL, "args.q is NULL");
  if (c->receives && !a->out) return local_fail(c, FD_EINVAL, "args.out is NULL on a rank that receives the result");
  if (sh->shape->mask_mode == FD_CAUSAL && !a->cur_pos)
    return local_fail(c, FD_EINVAL, "args.cur_pos is NULL but the shape's mask_mode is FD_CAUSAL");
  if ((sh->shape->features & FD_ALIBI) && !a->alibi_slopes)
    return local_fail(c, FD_EINVAL, "args.alibi_slopes is NULL but the shape's features set FD_ALIBI");
  if ((sh->shape->features & FD_SINK_LOGITS) && !a->sink_logits)
    return local_fail(c, FD_EINVAL, "args.sink_logits is NULL but the shape's features set FD_SINK_LOGITS");
  return 0;
}

/* Local checks of the shape's fields fdmpi_run depends on. */
static int check_shape(call *c) {
  const fd_shape *s = c->s;
  if (s->batch < 1 || s->n_q_heads < 1 || s->head_dim < 1 || s->kv_len < 1)
    return local_fail(c, FD_EINVAL, "shard.shape: batch, n_q_heads, head_dim and kv_len must be at least 1 "
                      "(they are %d, %d, %d, %lld)", s->batch, s->n_q_heads, s->head_dim, (long long)s->kv_len);
  if (s->mask_mode > FD_FULL) return local_fail(c, FD_EINVAL, "shard.shape.mask_mode is %d", (int)s->mask_mode);
  if (s->q_len > 1)
    return local_fail(c, FD_EUNSUPPORTED, "shard.shape.q_len is %d; fdmpi_run serves one query token per row", s->q_len);
  if (s->features & (FD_K_PER_CHANNEL | FD_BEAMS))
    return local_fail(c, FD_EUNSUPPORTED, "shard.shape.features sets %s; fdmpi_run does not serve it yet",
                      s->features & FD_BEAMS ? "FD_BEAMS" : "FD_K_PER_CHANNEL");
  if (s->features & FD_NEW_KV)
    return local_fail(c, FD_EUNSUPPORTED, "shard.shape.features sets FD_NEW_KV; fdmpi_run does not serve it yet "
                      "(every rank's fd_run would attend args.k_new, and the new key belongs to one shard)");
  if (s->window && s->layout == FD_PAGED)
    return local_fail(c, FD_EUNSUPPORTED, "shard.shape.layout is FD_PAGED with window %d; fdmpi_run attends a "
                      "window that starts inside a shard through a view of the shard from the window's first key, "
                      "which a paged cache cannot give (use FD_BHSD or FD_BSHD)", s->window);
  if (s->q_dtype > FD_BF16) return local_fail(c, FD_EINVAL, "shard.shape.q_dtype is %d", (int)s->q_dtype);
  if ((int64_t)s->batch * s->n_q_heads * (s->head_dim + 1) > INT32_MAX)
    return local_fail(c, FD_EINVAL, "shard.shape: batch x n_q_heads x (head_dim + 1) is above INT32_MAX, the largest "
                      "MPI count");
  if (s->out_dtype != FD_F32)
    return local_fail(c, FD_EINVAL, "shard.shape.out_dtype is %s; fdmpi_run needs FD_F32 (partial states are merged "
                      "in f32; convert the merged out afterwards)",
                      (unsigned)s->out_dtype < sizeof DTYPE_NAME / sizeof *DTYPE_NAME ? DTYPE_NAME[s->out_dtype] : "not a dtype");
  return 0;
}

/* Local checks of each row's shard against the capacity and the mask mode. */
static int check_rows_local(call *c) {
  const fd_shape *s = c->s;
  for (int b = 0; b < s->batch; b++) {
    int64_t off = c->sh->key_offset[b], n = c->sh->n_keys[b];
    if (off < 0) return local_fail(c, FD_EINVAL, "shard.key_offset[%d] is %lld; it must be >= 0", b, (long long)off);
    if (n < 0 || n > s->kv_len)
      return local_fail(c, FD_EINVAL, "shard.n_keys[%d] is %lld, outside 0..%lld (shape.kv_len)", b, (long long)n,
                        (long long)s->kv_len);
    if (off > INT32_MAX - n)
      return local_fail(c, FD_EINVAL, "shard.key_offset[%d] + n_keys[%d] is %lld, past the int32 positions of cur_pos",
                        b, b, (long long)(off + n));
    if (s->mask_mode != FD_CAUSAL && n != 0 && n != s->kv_len)
      return local_fail(c, FD_EINVAL, "shard.n_keys[%d] is %lld; with mask_mode %s fd_run attends every slot, so it "
                        "must be 0 or shape.kv_len (%lld)", b, (long long)n, MODE_NAME[s->mask_mode],
                        (long long)s->kv_len);
    if (s->mask_mode == FD_CAUSAL && c->args->cur_pos[b] < 0)
      return local_fail(c, FD_EINVAL, "args.cur_pos[%d] is %d; it must be >= 0", b, (int)c->args->cur_pos[b]);
  }
  return 0;
}

/* The local checks without which this rank cannot size or name its collective (root, pointers, shape, combine). */
static int check_call(call *c) {
  if (c->root != FDMPI_ALL && (c->root < 0 || c->root >= c->np))
    return local_fail(c, FD_EINVAL, "root is %d; it must be FDMPI_ALL or a rank 0..%d", c->root, c->np - 1);
  if (check_pointers(c) || check_shape(c)) return c->code;
  if (c->sh->combine > FDMPI_COMBINE_GATHER)
    return local_fail(c, FD_EINVAL, "shard.combine is %d", (int)c->sh->combine);
  return 0;
}

/* The set [a0, a1) u [b0, b1) (a0 <= b0) as sorted disjoint non-empty ranges r[2i] .. r[2i + 1] - 1: their count. */
static int join_ranges(int64_t a0, int64_t a1, int64_t b0, int64_t b1, int64_t *r) {
  int n = 0;
  if (a1 > a0) { r[0] = a0; r[1] = a1; n = 1; }
  if (b1 <= b0) return n;
  if (n && b0 <= r[1]) { r[1] = b1 > r[1] ? b1 : r[1]; return 1; }
  r[2 * n] = b0;
  r[2 * n + 1] = b1;
  return n + 1;
}

/* x clamped to lo .. hi. */
static int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : x > hi ? hi : x; }

/* The keys fd_run visits in a causal row at cur_pos pos: the sinks 0 .. sink_tokens - 1 and the window
   pos - window + 1 .. pos (without a window: 0 .. pos), as ranges (join_ranges). */
static int run_keys(const fd_shape *s, int64_t pos, int64_t *r) {
  int64_t w0 = s->window ? pos - s->window + 1 : 0, sinks = s->window ? s->sink_tokens : 0;
  return join_ranges(0, sinks < pos + 1 ? sinks : pos + 1, w0 > 0 ? w0 : 0, pos + 1, r);
}

/* The local slots row b attends on this rank, as ranges: all it holds (full, mask) or, causal, those the
   global sinks and window (counted back from the global cur_pos) leave visible, up to cur_pos. */
static int visible_ranges(const call *c, int b, int64_t *r) {
  const fd_shape *s = c->s;
  int64_t off = c->sh->key_offset[b], n = c->sh->n_keys[b];
  if (s->mask_mode != FD_CAUSAL) return join_ranges(0, 0, 0, n, r);
  int64_t end = (int64_t)c->args->cur_pos[b] + 1, w0 = s->window ? end - s->window : 0;
  int64_t sinks = s->window && s->sink_tokens < end ? s->sink_tokens : s->window ? end : 0;
  return join_ranges(0, clamp64(sinks - off, 0, n), clamp64(w0 - off, 0, n), clamp64(end - off, 0, n), r);
}

/* How row b's visible keys are run (sp[0..1]): one span from slot 0 when fd_run visits exactly them there
   (always without a window); else one per range: a range from slot 0 (the sinks, or keys the window
   covers) from slot 0, a window range that starts later from its first key (shorter than the window,
   so fd_run's sinks and window there cover it whole). Returns the span count. */
static int row_spans(const call *c, int b, span *sp) {
  int64_t v[4], u[4];
  int n = visible_ranges(c, b, v);
  if (n == 0) return 0;
  int64_t last = v[2 * n - 1] - 1;
  if (run_keys(c->s, last, u) == n && !memcmp(u, v, sizeof(int64_t) * 2 * (size_t)n)) {
    sp[0] = (span){ 0, last };
    return 1;
  }
  for (int i = 0; i < n; i++) sp[i] = (span){ v[2 * i], v[2 * i + 1] - 1 - v[2 * i] };
  return n;
}

/* Floats of one rank's state: out [rows, D], lse [rows], then the status slot (0 ok, 1 failed). */
static int64_t state_floats(const call *c) { return c->rows * (c->D + 1) + 1; }

/* Free what alloc_buffers allocated (NULL pointers after). */
static void free_buffers(call *c) {
  free(c->state); free(c->pos); free(c->in_pass); free(c->no_sink); free(c->spans); free(c->n_spans); free(c->shifts);
  c->state = NULL; c->pos = NULL; c->in_pass = NULL; c->no_sink = NULL; c->spans = NULL; c->n_spans = NULL;
  c->shifts = NULL;
}

/* Allocate the state and the receive buffer (every rank's state for GATHER; rows + 1 records for REDUCE)
   and the per-row pass tables. */
static int alloc_buffers(call *c) {
  int64_t state = state_floats(c);
  int64_t recv = !c->receives ? 0 : c->combine == FDMPI_COMBINE_GATHER ? state * c->np : (c->rows + 1) * (c->D + 1);
  size_t B = (size_t)c->s->batch;
  c->state = malloc(sizeof(float) * (size_t)(state + recv));
  c->pos = malloc(sizeof(int32_t) * B);
  c->in_pass = malloc(B);
  c->no_sink = malloc(sizeof(float) * (size_t)c->s->n_q_heads);
  c->spans = malloc(sizeof(span) * 2 * B);
  c->n_spans = malloc(B);
  c->shifts = malloc(sizeof(int64_t) * 2 * B);
  if (!c->state || !c->pos || !c->in_pass || !c->no_sink || !c->spans || !c->n_spans || !c->shifts) {
    free_buffers(c);
    return local_fail(c, FD_ENOMEM, "cannot allocate %lld bytes of state", (long long)(4 * (state + recv)));
  }
  c->recv = recv ? c->state + state : NULL;
  c->state[state - 1] = 0;
  for (int h = 0; h < c->s->n_q_heads; h++) c->no_sink[h] = -INFINITY;
  return 0;
}

/* ALiBi: fd_run biased a row's scores by slope x (view key - view cur_pos); the
   true bias is slope x (global key - global cur_pos), larger by slope x
   (key_offset + shift + view cur_pos - cur_pos) for every key of the pass: out
   is unchanged, lse shifts by that much (0 where the view ends at cur_pos). */
static void alibi_shift(const call *c, int64_t shift, float *lse) {
  const float *slope = c->args->alibi_slopes;
  for (int b = 0; b < c->s->batch; b++) {
    double d = (double)(c->sh->key_offset[b] + shift + c->pos[b] - c->args->cur_pos[b]);
    for (int h = 0; h < c->s->n_q_heads && c->in_pass[b]; h++) {
      float *l = &lse[(int64_t)b * c->s->n_q_heads + h];
      *l = (float)((double)*l + (double)slope[h] * d);
    }
  }
}

/* Every row's spans into c->spans, and the distinct shifts, ascending, into c->shifts: their count (the passes). */
static int plan_passes(call *c) {
  int n = 0;
  for (int b = 0; b < c->s->batch; b++) {
    c->n_spans[b] = (unsigned char)row_spans(c, b, &c->spans[2 * b]);
    for (int i = 0; i < c->n_spans[b]; i++) {
      int64_t x = c->spans[2 * b + i].shift;
      int j = n;
      while (j > 0 && c->shifts[j - 1] > x) j--;
      if (j > 0 && c->shifts[j - 1] == x) continue;
      memmove(&c->shifts[j + 1], &c->shifts[j], sizeof(int64_t) * (size_t)(n - j));
      c->shifts[j] = x;
      n++;
    }
  }
  return n;
}

/* fd_args a viewed from local slot shift of every row: K, V and their per-row scales start shift keys later
   (FD_BHSD: shift rows of head_dim further; FD_BSHD: shift x n_kv_heads). */
static void view_from(const call *c, int64_t shift, fd_args *a) {
  const fd_shape *s = c->s;
  int64_t step = shift * (s->layout == FD_BSHD ? s->n_kv_heads : 1);   /* K/V rows */
  size_t row = (size_t)s->head_dim / fd_dtype_block[s->kv_dtype] * fd_dtype_block_bytes[s->kv_dtype];
  a->k = (const char *)a->k + step * (int64_t)row;
  a->v = (const char *)a->v + step * (int64_t)row;
  if (a->k_scale) a->k_scale += step;
  if (a->v_scale) a->v_scale += step;
}

/* One pass: fd_run from local slot shift into out / lse for the rows with a span of that shift (the
   others run at cur_pos 0 and are dropped by the caller). */
static int run_pass(call *c, int64_t shift, float *out, float *lse) {
  for (int b = 0; b < c->s->batch; b++) {
    c->in_pass[b] = 0;
    c->pos[b] = 0;
    for (int i = 0; i < c->n_spans[b]; i++)
      if (c->spans[2 * b + i].shift == shift) { c->in_pass[b] = 1; c->pos[b] = (int32_t)c->spans[2 * b + i].pos; }
  }
  fd_args a = *c->args;
  if (c->s->mask_mode == FD_CAUSAL) a.cur_pos = c->pos;
  if (c->s->features & FD_SINK_LOGITS) a.sink_logits = c->no_sink;   /* the combine adds them once */
  view_from(c, shift, &a);
  a.out = out;
  a.lse = lse;
  int rc = fd_run(c->plan, &a);
  if (rc) return local_fail(c, rc, "fd_run: %s", c->sh->ctx ? fd_errmsg(c->sh->ctx) : "failed (shard.ctx not given)");
  if (c->s->features & FD_ALIBI) alibi_shift(c, shift, lse);
  return 0;
}

/* Rows outside the pass in out / lse: out 0, lse -inf (the empty state). */
static void empty_others(const call *c, float *out, float *lse) {
  int hq = c->s->n_q_heads;
  for (int b = 0; b < c->s->batch; b++) {
    if (c->in_pass[b]) continue;
    memset(out + (int64_t)b * hq * c->D, 0, sizeof(float) * (size_t)hq * c->D);
    for (int h = 0; h < hq; h++) lse[(int64_t)b * hq + h] = -INFINITY;
  }
}

/* Merge the pass's rows of (out, lse) into the state, row by row with fd_merge_states (tmp: Hq x (D + 1)). */
static int merge_pass(call *c, const float *out, const float *lse, float *tmp) {
  int hq = c->s->n_q_heads;
  float *so = c->state, *sl = c->state + c->rows * c->D;
  for (int b = 0; b < c->s->batch; b++) {
    if (!c->in_pass[b]) continue;
    int64_t o = (int64_t)b * hq * c->D, l = (int64_t)b * hq;
    const float *outs[2] = { so + o, out + o }, *lses[2] = { sl + l, lse + l };
    if (fd_merge_states(2, outs, lses, hq, c->D, tmp, tmp + (int64_t)hq * c->D))
      return local_fail(c, FD_EINVAL, "fd_merge_states: %s", fd_errmsg(NULL));
    memcpy(so + o, tmp, sizeof(float) * (size_t)hq * c->D);
    memcpy(sl + l, tmp + (int64_t)hq * c->D, sizeof(float) * (size_t)hq);
  }
  return 0;
}

/* The local partial state: one fd_run pass per distinct span shift (one, from slot 0, unless a window
   range starts inside the shard where fd_run's own window or sinks would not end it), the first into
   c->state, the others merged into it; rows with no attended key here: out 0, lse -inf. */
static int attend_local(call *c) {
  float *out = c->state, *lse = c->state + c->rows * c->D;
  int n = plan_passes(c);
  if (n == 0) {
    memset(c->in_pass, 0, (size_t)c->s->batch);
    empty_others(c, out, lse);
    return 0;
  }
  if (run_pass(c, c->shifts[0], out, lse)) return c->code;
  empty_others(c, out, lse);
  if (n == 1) return 0;
  int64_t hq = c->s->n_q_heads;
  float *more = malloc(sizeof(float) * (size_t)((c->rows + hq) * (c->D + 1)));
  if (!more) return local_fail(c, FD_ENOMEM, "cannot allocate %lld bytes for a second pass",
                               (long long)(4 * (c->rows + hq) * (c->D + 1)));
  float *mout = more, *mlse = more + c->rows * c->D, *tmp = mlse + c->rows;
  for (int i = 1; i < n && !c->code; i++)
    if (!run_pass(c, c->shifts[i], mout, mlse)) merge_pass(c, mout, mlse, tmp);
  free(more);
  return c->code;
}

/* This rank's entry of the head exchange. */
static head make_head(const call *c) {
  head h = { .code = c->code, .root = c->root };
  if (c->code) return h;
  char sig[SIG_LEN];
  const fd_shape *s = c->s;
  size_t qbytes = (size_t)c->rows * c->D * (s->q_dtype == FD_F32 ? 4 : 2);
  h.combine = c->combine;
  h.shape_hash = fd_shape_signature(s, sig, sizeof sig) < 0 ? 1 : hash_bytes(sig, strlen(sig), 7);
  h.q_hash = hash_bytes(c->args->q, qbytes, 11);
  memcpy(&h.scale_bits, &c->args->scale, 4);
  size_t hq = sizeof(float) * (size_t)s->n_q_heads;
  if (s->features & FD_ALIBI) h.extra_hash = hash_bytes(c->args->alibi_slopes, hq, 13);
  if (s->features & FD_SINK_LOGITS) h.extra_hash ^= hash_bytes(c->args->sink_logits, hq, 17);
  return h;
}

/* Broadcast a text of MSG_LEN bytes from rank `from` (the error path only). */
static int bcast_text(call *c, char *text, int from) {
  int mrc = MPI_Bcast(text, MSG_LEN, MPI_CHAR, from, c->comm);
  text[MSG_LEN - 1] = 0;
  return mrc == MPI_SUCCESS ? 0 : mpi_fail(mrc, "MPI_Bcast");
}

/* A local failure on some rank: every rank returns the lowest failing rank's code and message. */
static int report_local_failure(call *c, const head *hs) {
  int first = -1, count = 0;
  for (int r = 0; r < c->np; r++)
    if (hs[r].code) { count++; if (first < 0) first = r; }
  char text[MSG_LEN];
  memcpy(text, c->msg, MSG_LEN);
  int rc = bcast_text(c, text, first);
  if (rc) return rc;
  if (count > 1) return fail(hs[first].code, "fdmpi_run: rank %d: %s (and %d other ranks failed)", first, text, count - 1);
  return fail(hs[first].code, "fdmpi_run: rank %d: %s", first, text);
}

/* Two ranks' shapes differ: name both signatures. */
static int report_shape_mismatch(call *c, int r) {
  char a[MSG_LEN] = "", b[MSG_LEN] = "";
  if (fd_shape_signature(c->s, a, sizeof a) < 0) snprintf(a, sizeof a, "an invalid shape");
  memcpy(b, a, sizeof b);
  int rc = bcast_text(c, a, 0);
  if (!rc) rc = bcast_text(c, b, r);
  if (rc) return rc;
  return fail(FD_EINVAL, "fdmpi_run: shard.shape differs across ranks: rank 0 has %s, rank %d has %s "
              "(only kv_len may differ)", a, r, b);
}

/* The first field of the head rank r disagrees with rank 0 on, checked in this order. */
static int report_disagreement(call *c, const head *hs, int r) {
  const head *h0 = &hs[0], *h = &hs[r];
  if (h->shape_hash != h0->shape_hash) return report_shape_mismatch(c, r);
  if (h->root != h0->root)
    return fail(FD_EINVAL, "fdmpi_run: root differs across ranks: rank 0 passed %d, rank %d passed %d", h0->root, r, h->root);
  if (h->combine != h0->combine)
    return fail(FD_EINVAL, "fdmpi_run: shard.combine differs across ranks: rank 0 uses %s, rank %d uses %s",
                COMBINE_NAME[h0->combine], r, COMBINE_NAME[h->combine]);
  if (h->scale_bits != h0->scale_bits) {
    float s0, s1;
    memcpy(&s0, &h0->scale_bits, 4);
    memcpy(&s1, &h->scale_bits, 4);
    return fail(FD_EINVAL, "fdmpi_run: args.scale differs across ranks: rank 0 has %g, rank %d has %g", s0, r, s1);
  }
  if (h->extra_hash != h0->extra_hash)
    return fail(FD_EINVAL, "fdmpi_run: args.alibi_slopes or args.sink_logits differ across ranks (rank 0 and rank %d "
                "hold different values)", r);
  return fail(FD_EINVAL, "fdmpi_run: args.q differs across ranks (rank 0 and rank %d hold different queries)", r);
}

/* Collective: exchange heads; a local failure anywhere or any disagreement fails every rank alike. */
static int agree(call *c, head *hs) {
  head mine = make_head(c);
  int mrc = MPI_Allgather(&mine, sizeof mine, MPI_BYTE, hs, sizeof mine, MPI_BYTE, c->comm);
  if (mrc != MPI_SUCCESS) return mpi_fail(mrc, "MPI_Allgather");
  for (int r = 0; r < c->np; r++)
    if (hs[r].code) return report_local_failure(c, hs);
  for (int r = 1; r < c->np; r++)
    if (memcmp(&hs[r].shape_hash, &hs[0].shape_hash, 2 * sizeof(uint64_t)) || hs[r].root != hs[0].root ||
        hs[r].combine != hs[0].combine || hs[r].scale_bits != hs[0].scale_bits || hs[r].extra_hash != hs[0].extra_hash)
      return report_disagreement(c, hs, r);
  c->combine = hs[0].combine;
  return 0;
}

/* Row b's shard entries sorted by first key (then rank): insertion order of ranks idx[0..m). */
static int sorted_shards(const row_rec *all, int np, int B, int b, int *idx) {
  int m = 0;
  for (int r = 0; r < np; r++) {
    const row_rec *e = &all[(int64_t)r * B + b];
    if (e->n == 0) continue;
    int i = m++;
    while (i > 0 && all[(int64_t)idx[i - 1] * B + b].off > e->off) { idx[i] = idx[i - 1]; i--; }
    idx[i] = r;
  }
  return m;
}

/* The tiling check of row b over every rank's (off, n, pos): same cur_pos, no overlap, no gap, reaches cur_pos. */
static int check_row(const call *c, const row_rec *all, int b, int *idx) {
  int B = c->s->batch, np = c->np;
  const row_rec *r0 = &all[b];
  for (int r = 1; r < np; r++)
    if (all[(int64_t)r * B + b].pos != r0->pos)
      return fail(FD_EINVAL, "fdmpi_run: args.cur_pos[%d] differs across ranks: rank 0 has %lld, rank %d has %lld", b,
                  (long long)r0->pos, r, (long long)all[(int64_t)r * B + b].pos);
  int m = sorted_shards(all, np, B, b, idx), prev = -1;
  int64_t next = 0;                               /* the end of the shards so far, in key order */
  for (int i = 0; i < m; prev = idx[i++]) {
    const row_rec *e = &all[(int64_t)idx[i] * B + b];
    if (e->off < next)
      return fail(FD_EINVAL, "fdmpi_run: shards overlap in row %d: rank %d holds keys %lld..%lld and rank %d holds "
                  "keys %lld..%lld", b, prev, (long long)all[(int64_t)prev * B + b].off, (long long)next - 1, idx[i],
                  (long long)e->off, (long long)(e->off + e->n - 1));
    if (e->off > next)
      return fail(FD_EINVAL, "fdmpi_run: gap in row %d: keys %lld..%lld are on no rank (rank %d's shard starts at %lld)",
                  b, (long long)next, (long long)e->off - 1, idx[i], (long long)e->off);
    next = e->off + e->n;
  }
  if (r0->pos >= next)
    return fail(FD_EINVAL, "fdmpi_run: row %d: args.cur_pos[%d] is %lld but the shards end at key %lld (keys %lld..%lld "
                "are on no rank)", b, b, (long long)r0->pos, (long long)next - 1, (long long)next, (long long)r0->pos);
  return 0;
}

/* Collective: gather every rank's (offset, count, cur_pos) per row and check the tiling, identically everywhere. */
static int check_shards(call *c) {
  int B = c->s->batch, rc = 0;
  row_rec *mine = malloc(sizeof(row_rec) * (size_t)B * (size_t)(c->np + 1));
  int *idx = malloc(sizeof(int) * (size_t)c->np);
  if (!mine || !idx) { free(mine); free(idx); return fail(FD_ENOMEM, "fdmpi_run: cannot allocate the shard table"); }
  row_rec *all = mine + B;
  for (int b = 0; b < B; b++)
    mine[b] = (row_rec){ c->sh->key_offset[b], c->sh->n_keys[b],
                         c->s->mask_mode == FD_CAUSAL ? (int64_t)c->args->cur_pos[b] : -1 };
  int mrc = MPI_Allgather(mine, (int)(sizeof(row_rec) * B), MPI_BYTE, all, (int)(sizeof(row_rec) * B), MPI_BYTE, c->comm);
  if (mrc != MPI_SUCCESS) rc = mpi_fail(mrc, "MPI_Allgather");
  for (int b = 0; !rc && b < B; b++) rc = check_row(c, all, b, idx);
  free(mine);
  free(idx);
  return rc;
}

/* The merge of state a into state b, records (lse, out[d]), symmetric in a and b, in double. */
static void merge_pair(const float *a, float *b, int d_len) {
  float la = a[0], lb = b[0];
  if (isnan(la) || isnan(lb)) {
    for (int d = 0; d <= d_len; d++) b[d] = NAN;
    return;
  }
  if (la == -INFINITY) return;                      /* an empty state is the identity */
  if (lb == -INFINITY) { memcpy(b, a, sizeof(float) * (size_t)(d_len + 1)); return; }
  float m = la > lb ? la : lb;
  double wa = m == INFINITY ? la == INFINITY : exp((double)la - m);
  double wb = m == INFINITY ? lb == INFINITY : exp((double)lb - m);
  double l = wa + wb;
  for (int d = 1; d <= d_len; d++) b[d] = (float)((wa * a[d] + wb * b[d]) / l);
  b[0] = (float)(m + log(l));
}

/* The user MPI_Op: merge len records of the datatype (D + 1 contiguous floats) of in into inout. */
static void merge_op(void *in, void *inout, int *len, MPI_Datatype *dt) {
  int size = 0;
  MPI_Type_size(*dt, &size);
  int d_len = size / (int)sizeof(float) - 1;
  for (int i = 0; i < *len; i++)
    merge_pair((const float *)in + (int64_t)i * (d_len + 1), (float *)inout + (int64_t)i * (d_len + 1), d_len);
}

/* Records (lse, out[D]) from the state layout (out block, lse block), or back into args.out / args.lse. */
static void pack_records(const call *c, float *rec, int unpack) {
  const fd_args *a = c->args;
  for (int64_t r = 0; r < c->rows; r++) {
    float *x = rec + r * (c->D + 1);
    if (!unpack) {
      x[0] = c->state[c->rows * c->D + r];
      memcpy(x + 1, c->state + r * c->D, sizeof(float) * (size_t)c->D);
      continue;
    }
    memcpy((float *)a->out + r * c->D, x + 1, sizeof(float) * (size_t)c->D);
    if (a->lse) a->lse[r] = x[0];
  }
}

/* A failure on some rank, seen in the status slots (trusted mode): this rank's own failure, or FDMPI_EREMOTE. */
static int remote_failure(const call *c, int who) {
  if (c->code) return fail(c->code, "fdmpi_run: rank %d: %s", c->rank, c->msg);
  if (who < 0) return fail(FDMPI_EREMOTE, "fdmpi_run: a rank failed (shard.trusted: its message is on that rank)");
  return fail(FDMPI_EREMOTE, "fdmpi_run: rank %d failed (shard.trusted: its message is on that rank)", who);
}

/* FD_SINK_LOGITS: merge each head's learned sink logit into the records, once
   for the whole communicator (rank 0 calls it): a state of lse = the logit and
   out 0 (the sink has no value row), built in sink (D + 1 floats of zeros). */
static void add_sinks(const call *c, float *rec, float *sink) {
  for (int64_t r = 0; r < c->rows; r++) {
    sink[0] = c->args->sink_logits[r % c->s->n_q_heads];
    merge_pair(sink, rec + r * (c->D + 1), c->D);
  }
}

/* Combine by MPI_Reduce / MPI_Allreduce over records with the merge operator; one more record carries
   the status (lse NaN: some rank failed; the merge keeps a NaN). */
static int combine_reduce(call *c) {
  int64_t n = (c->rows + 1) * (c->D + 1);
  float *send = calloc((size_t)(n + c->D + 1), sizeof(float));   /* the records, then a sink record */
  if (!send) return fail(FD_ENOMEM, "fdmpi_run: cannot allocate %lld bytes of records", (long long)(4 * n));
  pack_records(c, send, 0);
  if ((c->s->features & FD_SINK_LOGITS) && c->rank == 0 && !c->code) add_sinks(c, send, send + n);
  send[c->rows * (c->D + 1)] = c->code ? NAN : -INFINITY;
  MPI_Datatype rec;
  MPI_Op op;
  MPI_Type_contiguous(c->D + 1, MPI_FLOAT, &rec);
  MPI_Type_commit(&rec);
  MPI_Op_create(merge_op, 1, &op);
  int mrc = c->root == FDMPI_ALL ? MPI_Allreduce(send, c->recv, (int)c->rows + 1, rec, op, c->comm)
                                 : MPI_Reduce(send, c->recv, (int)c->rows + 1, rec, op, c->root, c->comm);
  MPI_Op_free(&op);
  MPI_Type_free(&rec);
  free(send);
  if (mrc != MPI_SUCCESS) return mpi_fail(mrc, c->root == FDMPI_ALL ? "MPI_Allreduce" : "MPI_Reduce");
  if (!c->receives) return c->code ? remote_failure(c, c->rank) : 0;
  if (c->code || isnan(c->recv[c->rows * (c->D + 1)])) return remote_failure(c, -1);
  pack_records(c, c->recv, 1);
  return 0;
}

/* Combine by MPI_Gather / MPI_Allgather of the states (each with its status slot), then fd_merge_states
   in rank order. */
static int combine_gather(call *c) {
  int n = (int)state_floats(c);
  c->state[n - 1] = c->code != 0;
  int mrc = c->root == FDMPI_ALL ? MPI_Allgather(c->state, n, MPI_FLOAT, c->recv, n, MPI_FLOAT, c->comm)
                                 : MPI_Gather(c->state, n, MPI_FLOAT, c->recv, n, MPI_FLOAT, c->root, c->comm);
  if (mrc != MPI_SUCCESS) return mpi_fail(mrc, c->root == FDMPI_ALL ? "MPI_Allgather" : "MPI_Gather");
  if (!c->receives) return c->code ? remote_failure(c, c->rank) : 0;
  for (int r = 0; r < c->np; r++)
    if (c->recv[(int64_t)r * n + n - 1] != 0) return remote_failure(c, r);
  int sinks = (c->s->features & FD_SINK_LOGITS) != 0, m = c->np + sinks;
  const float **outs = malloc(sizeof(float *) * 2 * (size_t)m), **lses = outs + m;
  float *sink = sinks ? calloc((size_t)(c->rows * (c->D + 1)), sizeof(float)) : NULL;
  if (!outs || (sinks && !sink)) { free(outs); free(sink); return fail(FD_ENOMEM, "fdmpi_run: cannot allocate the merge table"); }
  for (int r = 0; r < c->np; r++) {
    outs[r] = c->recv + (int64_t)r * n;
    lses[r] = outs[r] + c->rows * c->D;
  }
  if (sinks) {                         /* the learned sink logits: one more state, lse the logit, out 0 */
    for (int64_t r = 0; r < c->rows; r++) sink[c->rows * c->D + r] = c->args->sink_logits[r % c->s->n_q_heads];
    outs[c->np] = sink;
    lses[c->np] = sink + c->rows * c->D;
  }
  int rc = fd_merge_states(m, outs, lses, c->rows, c->D, c->args->out, c->args->lse);
  free(outs);
  free(sink);
  return rc ? fail(rc, "fdmpi_run: fd_merge_states: %s", fd_errmsg(NULL)) : 0;
}

/* The default strategy: gather while a receiver gets at most FDMPI_GATHER_MAX_BYTES of other ranks' states,
   reduce above (the same on every rank: np and the shape agree). */
static int default_combine(const call *c) {
  double others = (double)(c->np - 1) * 4.0 * (double)state_floats(c);
  return others <= FDMPI_GATHER_MAX_BYTES ? FDMPI_COMBINE_GATHER : FDMPI_COMBINE_REDUCE;
}

/* Size the call from the shard once the local checks passed. */
static void size_call(call *c) {
  c->s = c->sh->shape;
  c->rows = (int64_t)c->s->batch * c->s->n_q_heads;
  c->D = c->s->head_dim;
  c->combine = c->sh->combine ? (int)c->sh->combine : default_combine(c);
}

/* Everything before the collectives: local checks, buffers (c->state: this rank can join the combine)
   and the local attention. */
static void prepare(call *c, double *t_attn) {
  c->s = c->sh ? c->sh->shape : NULL;
  if (check_call(c)) return;
  size_call(c);
  if (alloc_buffers(c)) return;
  double t0 = MPI_Wtime();
  if (!check_rows_local(c)) attend_local(c);
  *t_attn = MPI_Wtime() - t0;
  if (c->code) memset(c->state, 0, sizeof(float) * (size_t)state_floats(c));   /* sent, then dropped (trusted) */
}

/* Validated mode: the two collectives that make every rank fail alike or pass alike. */
static int validate(call *c) {
  head *hs = malloc(sizeof(head) * (size_t)c->np);
  if (!hs) return fail(FD_ENOMEM, "fdmpi_run: cannot allocate %d heads", c->np);
  int rc = agree(c, hs);
  free(hs);
  return rc ? rc : check_shards(c);
}

/* See flashdecode_mpi.h. */
int fdmpi_run(const fd_plan *plan, const fd_args *args, const fdmpi_shard *shard, MPI_Comm comm, int root) {
  errbuf[0] = 0;
  int rc = comm_check(comm);
  if (rc) return rc;
  call c = { .plan = plan, .args = args, .sh = shard, .comm = comm, .root = root };
  MPI_Comm_rank(comm, &c.rank);
  MPI_Comm_size(comm, &c.np);
  c.receives = root == FDMPI_ALL || root == c.rank;
  double t_attn = 0, t0, t1;
  prepare(&c, &t_attn);
  int trusted = shard && shard->trusted;
  t0 = MPI_Wtime();
  if (!trusted) rc = validate(&c);
  else if (!c.state) rc = fail(c.code, "fdmpi_run: rank %d: %s", c.rank, c.msg);   /* cannot join: see the header */
  t1 = MPI_Wtime();
  if (!rc) rc = c.combine == FDMPI_COMBINE_REDUCE ? combine_reduce(&c) : combine_gather(&c);
  if (!rc && shard->stats)
    *shard->stats = (fdmpi_stats){ t_attn, t1 - t0, MPI_Wtime() - t1, 4 * c.rows * (c.D + 1), c.combine };
  free_buffers(&c);
  return rc;
}
