/* The planner: validates a shape, decides chunk size, group tile, split count
   and threads per kv-length bucket (tuned table row or heuristic), compiles
   the keys it needs and sizes the scratch fd_run uses. It never runs kernels. */
#include "internal.h"
#include "cpu.h"
#include "key.h"
#include "model.h"
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Heuristic constants (see docs/DESIGN.md "Planner"); measured on the portable-C kernels. */
#define H_CHUNK FD_H_CHUNK           /* keys per chunk, portable C (gen/facts.lua) */
#define H_CHUNK_SIMD FD_H_CHUNK_SIMD /* keys per chunk, vector ISAs (gen/facts.lua) */
#define H_MAX_TILE 8            /* largest group tile the heuristic picks */
#define H_MIN_SPLIT_KEYS 512    /* do not split a row into pieces shorter than this */


/* The smallest power of two >= len; 1 for len < 1, and INT64_MAX for len above
   2^62 (no larger power of two fits int64_t), so never below len. */
int64_t fd_length_bucket(int64_t len) {
  if (len > (INT64_C(1) << 62)) return INT64_MAX;
  int64_t b = 1;
  while (b < len) b <<= 1;
  return b;
}

/* The int value of signature field f of shape s (fd_shape's enums are int-sized). */
static int *sig_value(const fd_shape *s, const fd_sig_field *f) {
  return (int *)((char *)s + f->offset);
}

/* The shape the plan executes: with FD_SHARED_KV the batch rows attend one
   K/V sequence, so they join the head group as tokens of one row (each K/V
   row is then read once for all batch x n_q_heads query rows); q, out, lse
   and the mask [B, q_len, Hq, ...] are already that row's tokens. */
static fd_shape exec_shape(const fd_shape *s) {
  fd_shape e = *s;
  if (s->features & FD_SHARED_KV) {
    e.q_len = s->batch * (s->q_len > 1 ? s->q_len : 1);
    e.batch = 1;
    e.features &= ~(unsigned)FD_SHARED_KV;
  }
  return e;
}

/* Is flag token f (FD_SIG_ON, FD_SIG_BIT) on in s: the float above 0, or the feature bit set? */
static int sig_flag_on(const fd_shape *s, const fd_sig_field *f) {
  const char *at = (const char *)s + f->offset;
  if (f->kind == FD_SIG_BIT) return (*(const unsigned *)at & f->bit) != 0;
  return *(const float *)at > 0;
}

/* Turn flag token f on in s: its feature bit, or the placeholder FD_SIGNATURE_ON. */
static void sig_flag_set(fd_shape *s, const fd_sig_field *f) {
  char *at = (char *)s + f->offset;
  if (f->kind == FD_SIG_BIT) *(unsigned *)at |= f->bit;
  else *(float *)at = FD_SIGNATURE_ON;
}

/* Append token i (f's prefix, then value text when not NULL) at buf + *n; -1 when it does not fit. */
static int sig_put(char *buf, size_t size, size_t *n, int i, const char *prefix, const char *text, int v) {
  int w = text ? snprintf(buf + *n, size - *n, "%s%s%s", i ? "." : "", prefix, text)
               : snprintf(buf + *n, size - *n, "%s%s%d", i ? "." : "", prefix, v);
  if (w < 0 || (size_t)w >= size - *n) return -1;
  *n += (size_t)w;
  return 0;
}

/* Canonical text of a shape, as in tuned tables: the tokens of fd_sig_fields
   (gen/facts.lua SIGNATURE) of the shape it executes joined by '.'; -1 when
   an enum field is unknown or a feature bit has no token. */
int fd_shape_signature(const fd_shape *shape, char *buf, size_t size) {
  fd_shape e = exec_shape(shape);
  const fd_shape *s = &e;
  size_t n = 0;
  if (size) buf[0] = 0;
  if (s->features & ~FD_SIG_FEATURE_BITS) return -1;
  for (int i = 0; i < FD_SIG_FIELDS; i++) {
    const fd_sig_field *f = &fd_sig_fields[i];
    int rc = 0;
    if (f->kind != FD_SIG_VALUE) {
      if (sig_flag_on(s, f)) rc = sig_put(buf, size, &n, i, f->prefix, "", 0);
    } else {
      int v = *sig_value(s, f);
      if (v <= f->omit) continue;
      if (f->names && (v < 0 || v >= f->count)) return -1;
      rc = sig_put(buf, size, &n, i, f->prefix, f->names ? f->names[v] : NULL, v);
    }
    if (rc) return -1;
  }
  return (int)n;
}

/* Read one value token's value at *p (advanced past it): a name of
   f->names, or 1 to 9 digits; 0, or -1 when it is neither. */
static int sig_read(const fd_sig_field *f, const char **p, int *v) {
  size_t len = strcspn(*p, ".");
  if (f->names) {
    for (int i = 0; i < f->count; i++)
      if (strlen(f->names[i]) == len && !strncmp(f->names[i], *p, len)) { *v = i; *p += len; return 0; }
    return -1;
  }
  if (len < 1 || len > 9 || strspn(*p, "0123456789") < len) return -1;
  *v = atoi(*p);
  *p += len;
  return 0;
}

/* Is the token at p (up to '.' or the end) field f's: its prefix then a
   value (a value token), or exactly its prefix (a flag)? */
static int sig_token_is(const fd_sig_field *f, const char *p) {
  size_t len = strcspn(p, "."), pl = strlen(f->prefix);
  if (strncmp(p, f->prefix, pl)) return 0;
  return f->kind == FD_SIG_VALUE ? len > pl || f->omit < 0 : len == pl;
}

/* Parse a shape signature: tokens read back in order (an optional one that
   is not there stays 0), then the signature written again must be the same
   text (canonical form: no duplicate, misplaced or unknown token, nothing
   after it). A softcap token gives softcap FD_SIGNATURE_ON. */
int fd_shape_parse(const char *sig, fd_shape *s) {
  char again[256];
  const char *p = sig;
  memset(s, 0, sizeof *s);
  for (int i = 0; i < FD_SIG_FIELDS; i++) {
    const fd_sig_field *f = &fd_sig_fields[i];
    int optional = f->omit >= 0 || f->kind != FD_SIG_VALUE;
    if (i && optional && (p[0] != '.' || !sig_token_is(f, p + 1))) continue;   /* left out: 0 */
    if (i && *p++ != '.') return -1;
    if (!sig_token_is(f, p)) return -1;
    p += strlen(f->prefix);
    if (f->kind != FD_SIG_VALUE) sig_flag_set(s, f);
    else if (sig_read(f, &p, sig_value(s, f))) return -1;
  }
  if (s->batch < 1 || s->n_q_heads < 1 || s->n_kv_heads < 1 || s->n_q_heads % s->n_kv_heads || s->head_dim < 1 ||
      s->head_dim > FD_HEAD_DIM_MAX)
    return -1;
  return fd_shape_signature(s, again, sizeof again) < 0 || strcmp(again, sig) ? -1 : 0;
}

/* Encode the key of a kernel for shape s: the key fields a shape fixes (the
   fit check's, fd_fit_same from gen/facts.lua), then the planner's choices. */
int fd_kernel_key(const fd_shape *s, int chunk, int tile, int isa, int flags, char *key, char *err, size_t errlen) {
  return fd_kernel_key_planes(s, chunk, tile, isa, flags, 0, key, err, errlen);
}

/* fd_kernel_key with the planes digit; see internal.h. */
int fd_kernel_key_planes(const fd_shape *s, int chunk, int tile, int isa, int flags, int planes, char *key, char *err,
                         size_t errlen) {
  return fd_kernel_key_ext(s, chunk, tile, isa, flags, planes, 0, key, err, errlen);
}

/* Whether fast precision serves shape s on isa: bf16 V and a record with
   the bf16 group (every tile); the rule of gen/key.lua precision_misfit. */
int fd_precision_fits(const fd_shape *s, int isa) {
  return s->kv_dtype == FD_BF16 && fd_isa_table[isa].bf16;
}

/* fd_kernel_key with the planes and precision digits; see internal.h. */
int fd_kernel_key_ext(const fd_shape *s, int chunk, int tile, int isa, int flags, int planes, int precision, char *key,
                      char *err, size_t errlen) {
  int v[FD_KF_COUNT] = { 0 };
  v[FD_KF_PLANES] = planes;
  v[FD_KF_PRECISION] = precision;
  for (int i = 0; i < FD_FIT_SAME; i++) v[fd_fit_same[i].field] = *(const int *)((const char *)s + fd_fit_same[i].offset);
  for (int i = 0; i < FD_FEATURE_DIGITS; i++) v[fd_feature_digits[i].field] = (s->features & fd_feature_digits[i].bit) != 0;
  v[FD_KF_FLAGS] = flags; v[FD_KF_ISA] = isa; v[FD_KF_GROUP_TILE] = tile;
  v[FD_KF_CHUNK] = chunk; v[FD_KF_TEMPLATE] = 1;
  return fd_key_encode(v, key, err, errlen);
}

/* The paged layout's fields: page_size a power of two in range, pool_pages >= 1. */
static int check_paged(const fd_ctx *ctx, const fd_shape *s) {
  if (s->layout != FD_PAGED) return FD_OK;
  int ps = s->page_size;
  if (ps < FD_PAGE_SIZE_MIN || ps > FD_PAGE_SIZE_MAX || (ps & (ps - 1)))
    return fd_fail(ctx, FD_EINVAL, "shape.page_size is %d; the paged layout needs a power of two %d..%d", ps,
                   FD_PAGE_SIZE_MIN, FD_PAGE_SIZE_MAX);
  if (s->pool_pages < 1)
    return fd_fail(ctx, FD_EINVAL, "shape.pool_pages is %lld; the paged layout needs at least 1", (long long)s->pool_pages);
  if (s->pool_pages > INT32_MAX)
    return fd_fail(ctx, FD_EINVAL, "shape.pool_pages is %lld; block-table entries are int32 (at most %d pages)",
                   (long long)s->pool_pages, INT32_MAX);
  return FD_OK;
}

/* FD_K_PER_CHANNEL and FD_BEAMS against the rest of the shape: K scales per
   channel need int8/fp8 K; beams choose among the batch's own cache rows, which
   FD_SHARED_KV's one sequence does not have. */
static int check_kv_features(const fd_ctx *ctx, const fd_shape *s) {
  if ((s->features & FD_K_PER_CHANNEL) && !fd_dtype_quant[s->kv_dtype])
    return fd_fail(ctx, FD_EINVAL, "shape.features sets FD_K_PER_CHANNEL with kv_dtype %s; per-channel K scales "
                   "(k_scale [B, Hkv, D]) need int8, fp8 e4m3 or fp8 e5m2 K", fd_dtype_texts[s->kv_dtype]);
  if ((s->features & FD_BEAMS) && (s->features & FD_SHARED_KV))
    return fd_fail(ctx, FD_EINVAL, "shape.features sets FD_BEAMS with FD_SHARED_KV; a shared sequence is one cache "
                   "row, beam_src has no other rows to read from");
  return FD_OK;
}

/* The appended fields this build does not serve yet: bad values FD_EINVAL, set ones FD_EUNSUPPORTED. */
static int check_features(const fd_ctx *ctx, const fd_shape *s) {
  if (s->q_len < 0 || s->q_len > FD_Q_LEN_MAX)
    return fd_fail(ctx, FD_EINVAL, "shape.q_len is %d; it must be 0..%d (0 and 1: one query token)", s->q_len, FD_Q_LEN_MAX);
  if (s->window < 0) return fd_fail(ctx, FD_EINVAL, "shape.window is %d; it must be at least 0", s->window);
  if (s->sink_tokens < 0) return fd_fail(ctx, FD_EINVAL, "shape.sink_tokens is %d; it must be at least 0", s->sink_tokens);
  if (!(s->softcap >= 0) || isinf(s->softcap))
    return fd_fail(ctx, FD_EINVAL, "shape.softcap is %g; it must be finite and at least 0", (double)s->softcap);
  if (s->features >> FD_FEATURE_COUNT)
    return fd_fail(ctx, FD_EINVAL, "shape.features 0x%x has unknown bits (known: 0x%x)", s->features,
                   (1u << FD_FEATURE_COUNT) - 1);
  if (s->sink_tokens && !s->window)
    return fd_fail(ctx, FD_EINVAL, "shape.sink_tokens is %d without a window; sink tokens stay visible beside a "
                   "sliding window (set shape.window)", s->sink_tokens);
  if (s->window && s->sink_tokens > s->window)
    return fd_fail(ctx, FD_EINVAL, "shape.sink_tokens is %d, more than shape.window %d; the sink tokens are the first "
                   "keys kept visible beside the window, at most as many as it", s->sink_tokens, s->window);
  if (s->window && s->mask_mode != FD_CAUSAL)
    return fd_fail(ctx, FD_EINVAL, "shape.window %d with mask_mode %s; a sliding window needs positions (FD_CAUSAL)",
                   s->window, fd_mask_mode_names[s->mask_mode]);
  for (int i = 0; i < FD_FEATURE_COUNT; i++)
    if (s->features & ~FD_FEATURES_SERVED & (1u << i))
      return fd_fail(ctx, FD_EUNSUPPORTED, "shape.features sets %s, which this build does not support yet", fd_feature_names[i]);
  if ((s->features & FD_ALIBI) && s->mask_mode != FD_CAUSAL)
    return fd_fail(ctx, FD_EINVAL, "shape.features sets FD_ALIBI with mask_mode %s; ALiBi's bias needs positions "
                   "(FD_CAUSAL)", fd_mask_mode_names[s->mask_mode]);
  if ((s->features & FD_NEW_KV) && s->mask_mode != FD_CAUSAL)
    return fd_fail(ctx, FD_EINVAL, "shape.features sets FD_NEW_KV with mask_mode %s; the new tokens' keys need "
                   "positions (FD_CAUSAL)", fd_mask_mode_names[s->mask_mode]);
  if ((s->features & FD_NEW_KV) && fd_dtype_quant[s->kv_dtype])
    return fd_fail(ctx, FD_EINVAL, "shape.features sets FD_NEW_KV with kv_dtype %s; k_new and v_new are f32, f16 or "
                   "bf16 (no scales)", fd_dtype_names[s->kv_dtype]);
  int rc = check_kv_features(ctx, s);
  if (rc) return rc;
  if ((s->features & FD_SHARED_KV) && s->mask_mode == FD_CAUSAL)
    return fd_fail(ctx, FD_EINVAL, "shape.features sets FD_SHARED_KV with mask_mode FD_CAUSAL; a shared sequence needs "
                   "FD_FULL or FD_MASK (its rows have no positions of their own)");
  if (fd_dtype_block[s->kv_dtype] > 1 && s->head_dim % fd_dtype_block[s->kv_dtype])
    return fd_fail(ctx, FD_EINVAL, "shape.head_dim is %d; kv_dtype %s stores rows of %d-element blocks, so head_dim "
                   "must be a multiple of %d", s->head_dim, fd_dtype_texts[s->kv_dtype], fd_dtype_block[s->kv_dtype],
                   fd_dtype_block[s->kv_dtype]);
  if ((s->features & FD_NEW_KV) && fd_dtype_block[s->kv_dtype] > 1)
    return fd_fail(ctx, FD_EINVAL, "shape.features sets FD_NEW_KV with kv_dtype %s; k_new and v_new are f32, f16 or "
                   "bf16 (no blocks)", fd_dtype_names[s->kv_dtype]);
  return FD_OK;
}

/* Check every field of a shape; FD_OK or an error naming the field. */
static int check_shape(const fd_ctx *ctx, const fd_shape *s) {
  if (!s) return fd_fail(ctx, FD_EINVAL, "shape is NULL");
  if (s->batch < 1) return fd_fail(ctx, FD_EINVAL, "shape.batch is %d; it must be at least 1", s->batch);
  if (s->n_q_heads < 1) return fd_fail(ctx, FD_EINVAL, "shape.n_q_heads is %d; it must be at least 1", s->n_q_heads);
  if (s->n_kv_heads < 1) return fd_fail(ctx, FD_EINVAL, "shape.n_kv_heads is %d; it must be at least 1", s->n_kv_heads);
  if (s->n_q_heads % s->n_kv_heads)
    return fd_fail(ctx, FD_EINVAL, "shape.n_q_heads (%d) is not a multiple of shape.n_kv_heads (%d)", s->n_q_heads, s->n_kv_heads);
  if (s->head_dim < FD_HEAD_DIM_MIN || s->head_dim > FD_HEAD_DIM_MAX)
    return fd_fail(ctx, FD_EINVAL, "shape.head_dim is %d; it must be %d..%d (the tiling key's field)", s->head_dim,
                   FD_HEAD_DIM_MIN, FD_HEAD_DIM_MAX);
  if (s->kv_len < 1) return fd_fail(ctx, FD_EINVAL, "shape.kv_len is %lld; it must be at least 1", (long long)s->kv_len);
  if (s->kv_len > (INT64_C(1) << (FD_MAX_BUCKETS - 1)))
    return fd_fail(ctx, FD_EINVAL, "shape.kv_len %lld is too large: above 2^%d, the planner's largest length bucket",
                   (long long)s->kv_len, FD_MAX_BUCKETS - 1);
  if ((int64_t)s->batch * s->n_q_heads > INT_MAX)
    return fd_fail(ctx, FD_EINVAL, "shape.batch x shape.n_q_heads (%d x %d) is above INT_MAX", s->batch, s->n_q_heads);
  for (int i = 0; i < FD_SIG_FIELDS; i++) {   /* the enum fields of the signature */
    const fd_sig_field *f = &fd_sig_fields[i];
    int v = *sig_value(s, f);
    if (f->names && (v < 0 || v >= f->count)) {
      char list[256] = "";
      for (int k = 0; k < f->count; k++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k ? ", " : "", f->names[k]);
      return fd_fail(ctx, FD_EINVAL, "shape.%s %d is unknown (one of %s)", f->field, v, list);
    }
  }
  int rc = check_paged(ctx, s);
  if (rc == FD_OK) rc = check_features(ctx, s);
  if (rc != FD_OK) return rc;
  if (s->mask_mode == FD_CAUSAL && s->kv_len > (int64_t)INT32_MAX + 1)
    return fd_fail(ctx, FD_EINVAL, "shape.kv_len %lld is too large for int32 cur_pos positions", (long long)s->kv_len);
  /* every element index (and the mask's) must fit int64 and every byte count size_t */
  double elems = (double)s->batch * s->n_kv_heads * (double)s->kv_len * s->head_dim;
  if (s->layout == FD_PAGED) elems = (double)s->pool_pages * s->n_kv_heads * (double)s->page_size * s->head_dim;
  double mask = (double)s->batch * (s->q_len > 1 ? s->q_len : 1) * s->n_q_heads * (double)s->kv_len;
  if (elems * 4 > 9.0e18 || mask * 4 > 9.0e18)
    return fd_fail(ctx, FD_EINVAL, "shape.kv_len %lld is too large: the cache would have more than 2^63 bytes", (long long)s->kv_len);
  return FD_OK;
}

static int heuristic_tile(int G, int isa, fd_dtype kv);

/* Whether isa takes MSD planes only as one int16 plane of q (the msd16 group
   without int8 dot products: AVX2; gen/facts.lua msd16_fits). */
static int msd16_isa(int isa) { return fd_isa_table[isa].msd16 && !fd_isa_table[isa].vnni; }

/* Whether the int16 plane serves group tile and head_dim D (gen/facts.lua msd16_fits). */
static int msd16_fits(int tile, int D) {
  return tile >= FD_MSD16_TILE_LO && tile <= FD_MSD16_TILE_HI && D % FD_MSD16_D == 0;
}

/* The group tile opts o gives shape s on isa: forced, else the heuristic's. */
static int opts_tile(const fd_shape *s, const fd_plan_opts *o, int isa) {
  return o->group_tile ? o->group_tile : heuristic_tile(s->n_q_heads / s->n_kv_heads, isa, s->kv_dtype);
}

/* Whether fast precision takes FD_FAST_PLANES planes as one int16 plane for
   shape s on isa at group tile: int8 K and V on an msd16 isa, a tile and
   head_dim it serves, not both per-channel K and beams (planes_misfit). */
static int fast_msd16(const fd_shape *s, int isa, int tile) {
  if (s->kv_dtype != FD_I8 || !msd16_isa(isa) || !msd16_fits(tile, s->head_dim)) return 0;
  return !((s->features & FD_K_PER_CHANNEL) && (s->features & FD_BEAMS));
}

/* The heuristic planes digit (MSD int8 scores) for isa: FD_H_PLANES for int8
   K on a record with int8 dot products where the planes fit a head's q row
   (gen/generate.lua: planes x D + 8 planes <= 4 D) and not both per-channel
   K and beams, else 0 (f32 FMA scores). */
static int heuristic_planes(const fd_shape *s, int isa) {
  int n = FD_H_PLANES, D = s->head_dim;
  if (!n || s->kv_dtype != FD_I8 || !fd_isa_table[isa].vnni || n * D + 8 * n > 4 * D) return 0;
  if ((s->features & FD_K_PER_CHANNEL) && (s->features & FD_BEAMS)) return 0;   /* planes_misfit */
  return n;
}

/* opts.planes: 0 (planner's choice), -1 (off), or 2 or 3 with int8 K and an
   isa with int8 dot products (the forced one, else the context's highest;
   gen/key.lua planes_misfit). */
static int check_planes(const fd_ctx *ctx, const fd_shape *s, const fd_plan_opts *o) {
  if (o->planes == 0 || o->planes == -1) return FD_OK;
  if (o->planes != 2 && o->planes != 3)
    return fd_fail(ctx, FD_EINVAL, "opts.planes %d is not 0 (planner's choice), -1 (off), 2 or 3", o->planes);
  if (s->kv_dtype != FD_I8)
    return fd_fail(ctx, FD_EUNSUPPORTED, "opts.planes %d needs int8 K (MSD scores), not kv_dtype %s", o->planes,
                   fd_dtype_names[s->kv_dtype]);
  int isa = o->isa ? o->isa - 1 : ctx->max_isa;
  if (msd16_isa(isa)) {
    int tile = opts_tile(s, o, isa);
    if (o->planes != FD_FAST_PLANES || !msd16_fits(tile, s->head_dim))
      return fd_fail(ctx, FD_EUNSUPPORTED, "opts.planes %d on isa %s (one int16 plane of q) needs %d planes, group tiles "
                     "%d to %d and shape.head_dim a multiple of %d, not group tile %d, head_dim %d", o->planes,
                     fd_isa_table[isa].name, FD_FAST_PLANES, FD_MSD16_TILE_LO, FD_MSD16_TILE_HI, FD_MSD16_D, tile,
                     s->head_dim);
  } else if (!fd_isa_table[isa].vnni)
    return fd_fail(ctx, FD_EUNSUPPORTED, "opts.planes %d needs an isa with int8 dot products (avx512vnni, avx512bf16), not isa %s",
                   o->planes, fd_isa_table[isa].name);
  if ((s->features & FD_K_PER_CHANNEL) && (s->features & FD_BEAMS))
    return fd_fail(ctx, FD_EUNSUPPORTED, "opts.planes %d with shape.features FD_K_PER_CHANNEL and FD_BEAMS is not "
                   "served: q is refolded per source row of the beams, in f32 (gen/key.lua planes_misfit)", o->planes);
  return FD_OK;
}

/* opts.precision 1 on int8 K and V: fast precision takes FD_FAST_PLANES MSD
   planes, so it needs an isa with int8 dot products and a shape that takes
   planes (heuristic_planes), or an msd16 isa (AVX2) and a group tile and
   head_dim its int16 plane serves (fast_msd16), and no other count forced by
   opts.planes. */
static int check_fast_planes(const fd_ctx *ctx, const fd_shape *s, const fd_plan_opts *o, int isa) {
  int m16 = msd16_isa(isa);
  if (!m16 && !fd_isa_table[isa].vnni)
    return fd_fail(ctx, FD_EUNSUPPORTED, "opts.precision 1 on int8 K and V (%d MSD planes) needs an isa with int8 dot "
                   "products (avx512vnni, avx512bf16), not isa %s", FD_FAST_PLANES, fd_isa_table[isa].name);
  if (o->planes && o->planes != FD_FAST_PLANES)
    return fd_fail(ctx, FD_EUNSUPPORTED, "opts.precision 1 on int8 K and V takes %d MSD planes, but opts.planes %d "
                   "forces %s", FD_FAST_PLANES, o->planes, o->planes < 0 ? "f32 FMA scores" : "another count");
  int tile = opts_tile(s, o, isa);
  if (m16 && !fast_msd16(s, isa, tile))
    return fd_fail(ctx, FD_EUNSUPPORTED, "opts.precision 1 on int8 K and V on isa %s takes one int16 plane of q, which "
                   "needs group tiles %d to %d and shape.head_dim a multiple of %d (not group tile %d, head_dim %d), "
                   "and not FD_K_PER_CHANNEL with FD_BEAMS", fd_isa_table[isa].name, FD_MSD16_TILE_LO,
                   FD_MSD16_TILE_HI, FD_MSD16_D, tile, s->head_dim);
  if (!m16 && !o->planes && !heuristic_planes(s, isa))
    return fd_fail(ctx, FD_EUNSUPPORTED, "opts.precision 1 on int8 K and V needs MSD planes, which this shape does not "
                   "take (shape.head_dim %d too small for %d planes of q, or FD_K_PER_CHANNEL with FD_BEAMS)",
                   s->head_dim, FD_H_PLANES);
  return FD_OK;
}

/* opts.precision: 0 (the context's config.precision), -1 (off), or 1 with
   bf16 V and an isa with bf16 dot products (gen/key.lua precision_misfit),
   or with int8 K and V where MSD planes serve (check_fast_planes). */
static int check_precision(const fd_ctx *ctx, const fd_shape *s, const fd_plan_opts *o) {
  if (o->precision == 0 || o->precision == -1) return FD_OK;
  if (o->precision != 1)
    return fd_fail(ctx, FD_EINVAL, "opts.precision %d is not 0 (the context's config.precision), -1 (off) or 1 (fast)",
                   o->precision);
  int isa = o->isa ? o->isa - 1 : ctx->max_isa;
  if (s->kv_dtype == FD_I8) return check_fast_planes(ctx, s, o, isa);
  if (s->kv_dtype != FD_BF16)
    return fd_fail(ctx, FD_EUNSUPPORTED, "opts.precision 1 needs bf16 V (bf16 weights) or int8 K and V (%d MSD planes), "
                   "not kv_dtype %s", FD_FAST_PLANES, fd_dtype_names[s->kv_dtype]);
  if (!fd_isa_table[isa].bf16)
    return fd_fail(ctx, FD_EUNSUPPORTED, "opts.precision 1 needs an isa with bf16 dot products (avx512bf16), not isa %s",
                   fd_isa_table[isa].name);
  return FD_OK;
}

/* Check forced options against the shape and context. */
static int check_opts(const fd_ctx *ctx, const fd_shape *s, const fd_plan_opts *o) {
  int G = s->n_q_heads / s->n_kv_heads;
  if (o->chunk < 0 || o->chunk > FD_MAX_CHUNK)
    return fd_fail(ctx, FD_EINVAL, "opts.chunk %d is outside 1..%d (0 = planner's choice)", o->chunk, FD_MAX_CHUNK);
  if (o->group_tile < 0 || o->group_tile > FD_MAX_TILE || (o->group_tile && G % o->group_tile))
    return fd_fail(ctx, FD_EINVAL, "opts.group_tile %d does not divide the %d query heads per kv head (or exceeds %d)",
                   o->group_tile, G, FD_MAX_TILE);
  if (o->splits < 0) return fd_fail(ctx, FD_EINVAL, "opts.splits %d is negative", o->splits);
  int64_t splits = o->splits < s->kv_len ? o->splits : s->kv_len, rows = (int64_t)s->batch * s->n_kv_heads;
  if (splits > 1 && rows * splits > FD_MAX_SPLIT_ITEMS)
    return fd_fail(ctx, FD_EINVAL, "opts.splits %d gives %lld split work items (batch x n_kv_heads x splits, splits at most "
                   "kv_len), above FD_MAX_SPLIT_ITEMS (%d)", o->splits, (long long)(rows * splits), FD_MAX_SPLIT_ITEMS);
  if (o->splits && ctx->deterministic)
    return fd_fail(ctx, FD_EINVAL, "opts.splits %d is forced but the context is deterministic (config.deterministic): "
                   "its rows split every FD_DETERMINISTIC_SPLIT_KEYS keys", o->splits);
  if (o->threads > FD_MAX_THREADS)
    return fd_fail(ctx, FD_EINVAL, "opts.threads %d is above FD_MAX_THREADS (%d)", o->threads, FD_MAX_THREADS);
  if (o->threads < 0 || o->threads > ctx->threads)
    return fd_fail(ctx, FD_EINVAL, "opts.threads %d is outside 0..%d (the context's threads)", o->threads, ctx->threads);
  if (o->isa < 0 || o->isa > FD_ISA_COUNT)
    return fd_fail(ctx, FD_EINVAL, "opts.isa %d is unknown (FD_ISA_C, FD_ISA_AVX2, FD_ISA_AVX512, FD_ISA_AVX512_BF16, FD_ISA_AVX512_VNNI or 0)", o->isa);
  if (o->isa && !fd_isa_within(o->isa - 1, ctx->max_isa))
    return fd_fail(ctx, FD_EUNSUPPORTED, "opts.isa %d is not available in this context (isa digit %d, %s, at most)", o->isa, ctx->max_isa,
                   fd_isa_table[ctx->max_isa].text);
  int rc = check_planes(ctx, s, o);
  return rc ? rc : check_precision(ctx, s, o);
}

/* The largest divisor of G up to H_MAX_TILE: a row-major group tile. */
static int row_major_tile(int G) {
  for (int t = G < H_MAX_TILE ? G : H_MAX_TILE; t > 1; t--) if (G % t == 0) return t;
  return 1;
}

/* The heuristic group tile: the isa's head-lane tile where its head-lane
   kernel serves (G a multiple of it, no int8/fp8 scales: the rule of
   head_lanes in gen/simd.lua, both from gen/facts.lua's isa records), else the
   largest divisor of G up to H_MAX_TILE. */
static int heuristic_tile(int G, int isa, fd_dtype kv) {
  int hl = fd_isa_table[isa].head_lane_tile;
  if (hl && G % hl == 0 && !fd_dtype_quant[kv]) return hl;
  return row_major_tile(G);
}

/* The heuristic isa of shape s in a context of best isa max: max, except that
   on a CPU whose f32 FMAs outrun its bf16 dot products (fma_bf16: Intel's,
   fd_cpu_intel) a shape of bf16 q and K without fast precision takes the
   fallback of a record with bf16 dot products (the same kernels, f32 FMA
   scores). `make bench-isa` on a 16-core Intel Xeon with AVX512-BF16
   (results/bench/isa-intel-xeon-16c-avx512bf16.md): the vdpbf16ps kernels took 1.27x
   the FMA kernels' time on Falcon-40B bf16 (head-lane tile) and 1.14x on the
   MQA batch (tile 8) at 1 thread, 1.16x and 1.07x at 16; on a Zen 5 EPYC
   they gained 1.19x on the MQA batch (gen/simd.lua M.dpbf16). A tuned
   table's rows and cost model choose the isa by measurement on every CPU. */
int fd_heuristic_isa(const fd_shape *s, int max, int fast, int fma_bf16) {
  if (!fma_bf16 || fast || !fd_isa_table[max].bf16) return max;
  if (s->q_dtype != FD_BF16 || s->kv_dtype != FD_BF16) return max;
  return fd_isa_table[max].fallback >= 0 ? fd_isa_table[max].fallback : max;
}

/* The heuristic split count for rows of up to len keys: none when the
   (batch, kv head) items fill the threads, else enough to fill them, but no
   piece shorter than H_MIN_SPLIT_KEYS. */
static int heuristic_splits(const fd_shape *s, int threads, int64_t len) {
  int64_t items = (int64_t)s->batch * s->n_kv_heads;
  if (items >= threads) return 1;
  int64_t want = (threads + items - 1) / items, most = len / H_MIN_SPLIT_KEYS;
  if (want > most) want = most;
  return want < 1 ? 1 : (int)want;
}

/* Deterministic mode's keys per split for shape s: FD_DETERMINISTIC_SPLIT_KEYS,
   doubled while batch x n_kv_heads x ceil(kv_len / K) split items would pass
   FD_MAX_SPLIT_ITEMS (a fact of the shape, never of the threads or lengths). */
static int64_t det_split_keys(const fd_shape *s) {
  int64_t K = FD_DETERMINISTIC_SPLIT_KEYS, rows = (int64_t)s->batch * s->n_kv_heads;
  while (K < s->kv_len && rows * ((s->kv_len + K - 1) / K) > FD_MAX_SPLIT_ITEMS) K <<= 1;
  return K;
}

/* The bucket's split count for rows of up to len keys when no table row
   decides: forced, else deterministic mode's (the splits of a row of len
   keys: it sizes the scratch), else the heuristic's for b's threads. */
static int bucket_splits(const fd_plan *p, const fd_plan_opts *o, const fd_bucket *b, int64_t len) {
  if (o->splits) return o->splits;
  if (p->split_keys) return fd_row_splits(0, 0, p->split_keys, len, len, 0);
  return heuristic_splits(&p->shape, b->threads, len);
}

/* Whether isa and planes serve fast precision for shape s: int8 K and
   V with MSD planes on an isa with int8 dot products (fast_digits lowers
   them to FD_FAST_PLANES) or as AVX2's int16 plane (fast_digits sets them),
   else fd_precision_fits. */
static int serves_fast(const fd_shape *s, int isa, int planes) {
  if (s->kv_dtype == FD_I8) return (fd_isa_table[isa].vnni || msd16_isa(isa)) && planes > 0;
  return fd_precision_fits(s, isa);
}

/* Whether a tuned row's key serves fast precision for shape s (a key that
   does not decode does not; adopt_table_key would ignore it anyway). */
static int row_serves_fast(const fd_shape *s, const fd_table_row *row) {
  int v[FD_KF_COUNT];
  char why[256];
  if (fd_table_decode_key(row->key, v, why, sizeof why)) return 0;
  return serves_fast(s, v[FD_KF_ISA], v[FD_KF_PLANES]);
}

/* Decide one bucket: table row (unless chunk, tile, splits or threads are
   forced; a forced isa keeps the row's other choices), then, when the table
   has no row for it and nothing is forced, the table's cost model (the best
   of its candidates: runtime/model.c; from_table 2), then forced options,
   then the heuristic. A deterministic context uses neither: every bucket
   gets the same chunk, tile and isa, none chosen from the threads. */
static void decide_bucket(const fd_plan *p, const char *sig, const fd_plan_opts *o, fd_bucket *b) {
  const fd_ctx *ctx = p->ctx;
  const fd_table_row *row = o->chunk || o->group_tile || o->splits || o->threads || o->planes || p->split_keys ? NULL
                            : fd_table_find(ctx->table, sig, b->max_len);
  int must_fast = o->precision == 1;   /* forced: served, or refused after compiling (plan_buckets) */
  if (row && must_fast && !row_serves_fast(&p->shape, row)) row = NULL;
  int max = ctx->max_isa;
  int fast = p->fast && (must_fast || fd_precision_fits(&p->shape, max));   /* fast precision serves on max */
  b->isa = o->isa ? o->isa - 1 : fd_heuristic_isa(&p->shape, max, fast, fd_cpu_intel());
  b->chunk = o->chunk ? o->chunk : fd_isa_table[b->isa].width > 1 ? H_CHUNK_SIMD : H_CHUNK;
  b->tile_forced = o->group_tile != 0;
  b->tile = o->group_tile ? o->group_tile : heuristic_tile(p->G, b->isa, p->shape.kv_dtype);
  b->threads = o->threads ? o->threads : ctx->threads;
  b->forced_isa = o->isa != 0;
  b->planes = o->planes > 0 ? o->planes : o->planes < 0 ? 0 : heuristic_planes(&p->shape, b->isa);
  int64_t len = b->max_len < p->shape.kv_len ? b->max_len : p->shape.kv_len;
  b->splits = bucket_splits(p, o, b, len);
  b->from_table = 0;
  if (row) {   /* the loader bounded its splits by the bucket; the kv_len may be shorter */
    b->from_table = 1;
    b->splits = fd_bucket_splits(row->splits, b->max_len, p->shape.kv_len);   /* as the exported header */
    b->threads = row->threads < ctx->threads ? row->threads : ctx->threads;
    return;
  }
  fd_model_pick pick;
  int forced = o->chunk || o->group_tile || o->splits || o->threads || o->isa || o->planes || must_fast || p->split_keys;
  if (!forced && ctx->table && ctx->table->model.present) {
    b->from_table = 2;   /* the model decides: its pick (fd_model_decide), or the heuristic's */
    fd_model_pick h = { b->chunk, b->tile, b->isa, b->splits, b->threads, 0 };
    if (fd_model_decide(&ctx->table->model, &p->shape, len, ctx->max_isa, ctx->threads, &h, &pick)) {
      /* valid by construction: chunk <= FD_MAX_CHUNK, tile divides G, isa <= max, splits bounded */
      b->chunk = pick.chunk; b->tile = pick.tile; b->isa = pick.isa;
      b->splits = pick.splits; b->threads = pick.threads;
    }
  }
  if (!o->planes) b->planes = heuristic_planes(&p->shape, b->isa);   /* the model's isa */
}

/* Fast precision where wanted and the bucket's final isa and tile serve it
   (a tuned row's key, precision 0 and FD_H_PLANES planes, takes it like the
   features): the precision digit returned, 1 for bf16 V (fd_precision_fits);
   for int8 K and V the planes digit lowered to FD_FAST_PLANES unless
   opts.planes forced a count (0 stays 0: no MSD, except on an msd16 isa
   (AVX2) at a tile and head_dim its int16 plane serves: FD_FAST_PLANES). */
static int fast_digits(const fd_plan *p, fd_bucket *b) {
  if (!p->fast) return 0;
  if (!p->forced_planes && b->planes > FD_FAST_PLANES) b->planes = FD_FAST_PLANES;
  if (!p->forced_planes && !b->planes && fast_msd16(&p->shape, b->isa, b->tile)) b->planes = FD_FAST_PLANES;
  return fd_precision_fits(&p->shape, b->isa);
}

/* Compile the three variants (plain, lse, split) of a bucket's chunk, tile and isa. */
static int compile_variants(fd_plan *p, fd_bucket *b, char *err, size_t errlen) {
  char key[FD_KEY_BUFSZ];
  const fd_kernel_desc **slot[] = { &b->plain, &b->with_lse, &b->split };
  _Static_assert(FD_VARIANTS == 3, "fd_bucket has one slot per variant of gen/facts.lua");
  fd_ctx_put_kernels(p->ctx, b, 1);            /* what an earlier attempt for this bucket took */
  int prec = fast_digits(p, b);
  for (int i = 0; i < FD_VARIANTS; i++) {
    if (fd_kernel_key_ext(&p->shape, b->chunk, b->tile, b->isa, fd_variant_flags[i], b->planes, prec, key, err, errlen))
      return FD_EINVAL;
    char why[3000];
    *slot[i] = fd_kcache_get(p->ctx->kernels, key, &p->compile_ms, &p->kernels_compiled, why, sizeof why);
    if (!*slot[i]) { snprintf(err, errlen, "kernel %s: %s", key, why); return FD_ECOMPILE; }
  }
  if (!p->new_kv) return FD_OK;
  fd_shape rows = p->shape;                     /* k_new/v_new [B, q_len, Hkv, D]: bshd strides */
  rows.layout = FD_BSHD;
  rows.features &= ~FD_BEAMS;                   /* the new keys are the row's own */
  if (fd_kernel_key_ext(&rows, b->chunk, b->tile, b->isa, FD_FLAG_SPLIT, b->planes, prec, key, err, errlen)) return FD_EINVAL;
  char why[3000];
  b->new_kv = fd_kcache_get(p->ctx->kernels, key, &p->compile_ms, &p->kernels_compiled, why, sizeof why);
  if (!b->new_kv) { snprintf(err, errlen, "kernel %s: %s", key, why); return FD_ECOMPILE; }
  return FD_OK;
}

/* Compile a bucket's kernels; an isa the planner chose falls back to its
   record's fallback isa when the shape has no variant there (e.g. head_dim not
   a multiple of the vector), and a forced isa that cannot run a table row's
   tile (above its record's max_tile: AVX2 holds at most 12 heads) takes the
   heuristic tile. */
static int compile_bucket(fd_plan *p, fd_bucket *b) {
  char err[4096];
  for (;;) {
    if (b->forced_isa && b->from_table && b->tile > fd_isa_table[b->isa].max_tile)
      b->tile = heuristic_tile(p->G, b->isa, p->shape.kv_dtype);
    int rc = compile_variants(p, b, err, sizeof err);
    if (rc == FD_OK) return FD_OK;
    int fallback_tile = heuristic_tile(p->G, b->isa, p->shape.kv_dtype);
    if (rc == FD_ECOMPILE && b->forced_isa && b->from_table && b->tile != fallback_tile) {
      b->tile = fallback_tile;
      continue;
    }
    int lower = fd_isa_table[b->isa].fallback;
    if (rc != FD_ECOMPILE || b->forced_isa || lower < 0) return fd_fail(p->ctx, rc, "%s", err);
    b->isa = lower;
    if (!fd_isa_table[lower].vnni) b->planes = 0;   /* the lower record has no int8 dot products */
    if (!b->tile_forced && b->from_table != 1) b->tile = heuristic_tile(p->G, b->isa, p->shape.kv_dtype);
  }
}

/* The isa a bucket runs a tuned row of isa on: the row's, unless the plan
   wants fast precision for bf16 V and the context's best isa serves it
   while the row's does not (the tuner times the default precision, where an
   FMA isa can win by a hair; its chunk, tile and splits are kept). */
static int row_isa(const fd_plan *p, int isa) {
  int max = p->ctx->max_isa;
  if (p->fast && !fd_precision_fits(&p->shape, isa) && fd_precision_fits(&p->shape, max)) return max;
  return isa;
}

/* Use a table row's key: compile it, then take chunk, tile and isa from its
   descriptor (the isa through row_isa). A key that does not fit the shape
   (fd_table_key_fits, which the loader already enforced), whose isa this CPU
   lacks or that does not compile leaves the heuristic in charge. */
static int adopt_table_key(fd_plan *p, const char *sig, fd_bucket *b) {
  const fd_table_row *row = fd_table_find(p->ctx->table, sig, b->max_len);
  char err[4096];
  int v[FD_KF_COUNT];
  const fd_shape *s = &p->shape;
  int usable = !fd_table_key_fits(row->key, s, v, err, sizeof err) && fd_isa_within(v[FD_KF_ISA], p->ctx->max_isa);
  const fd_kernel_desc *d = usable ? fd_kcache_get(p->ctx->kernels, row->key, &p->compile_ms, &p->kernels_compiled,
                                                   err, sizeof err) : NULL;
  if (!d) {
    int64_t len = b->max_len < s->kv_len ? b->max_len : s->kv_len;
    b->from_table = 0;   /* a row that does not fit this shape or build is ignored whole */
    b->threads = p->ctx->threads;
    b->splits = heuristic_splits(s, b->threads, len);
    return FD_OK;
  }
  b->chunk = d->chunk; b->tile = d->group_tile;
  if (!b->forced_isa) b->isa = row_isa(p, d->isa);   /* a forced isa keeps the row's chunk, tile and splits */
  b->planes = b->forced_isa ? heuristic_planes(s, b->isa) : d->planes;   /* a forced isa takes the heuristic's */
  fd_kcache_put(p->ctx->kernels, d);     /* compile_bucket takes the bucket's kernels itself */
  return FD_OK;
}

/* n floats on a 64-byte boundary (free() releases them), or NULL. */
static float *aligned_floats(size_t n) {
  void *mem = NULL;
  return posix_memalign(&mem, 64, n * sizeof(float) + 64) ? NULL : mem;
}

/* Allocate the scratch fd_run uses, sized for the largest bucket. */
static int alloc_scratch(fd_plan *p) {
  const fd_shape *s = &p->shape;
  size_t rows = (size_t)s->batch * s->n_kv_heads;
  /* 64-byte aligned, in whole multiples of 16 floats, so SIMD kernels touch whole cache lines */
  /* FD_BEAMS with FD_K_PER_CHANNEL: a second q buffer, the scaled q before a source row's channel scales */
  int copies = 1 + (p->beams && p->k_per_channel);
  p->qbuf_floats = ((size_t)p->heads * s->head_dim * copies + 15) / 16 * 16;
  p->thread_scratch_floats = p->qbuf_floats + (size_t)p->heads * p->rec;
  p->partials = aligned_floats(rows * p->max_splits * p->heads * p->rec);
  p->thread_scratch = aligned_floats(p->thread_scratch_floats * p->max_threads);
  p->remaining = malloc(sizeof(atomic_int) * rows);
  p->row_splits = malloc(sizeof(int) * s->batch);
  p->row_order = malloc(sizeof(int) * s->batch);
  p->row_len = malloc(sizeof(int64_t) * s->batch);
  p->row_keys = malloc(sizeof(int64_t) * s->batch * 3);
  p->row_first = p->row_keys + s->batch;
  p->row_sink = p->row_first + s->batch;
  p->items = malloc(sizeof(fd_item) * rows * p->max_splits);
  if (!p->partials || !p->thread_scratch || !p->remaining || !p->row_splits || !p->row_order || !p->row_len || !p->row_keys || !p->items)
    return fd_fail(p->ctx, FD_ENOMEM, "out of memory for the plan's scratch (%zu split rows)", rows * p->max_splits);
  return FD_OK;
}

/* Free a plan's memory and give back its kernels (not its context). */
static void free_plan(fd_plan *p) {
  fd_ctx_put_kernels(p->ctx, p->buckets, p->n_buckets);
  free(p->partials); free(p->thread_scratch); free(p->remaining);
  free(p->row_splits); free(p->row_order); free(p->row_len); free(p->row_keys); free(p->items);
  free(p);
}

/* opts.precision 1 forced: the bucket's compiled kernels must serve it (a
   fallback isa may not); refused naming the field, never dropped silently. */
static int check_fast_served(fd_plan *p, const fd_bucket *b) {
  if (serves_fast(&p->shape, b->isa, b->planes)) return FD_OK;
  return fd_fail(p->ctx, FD_EUNSUPPORTED, "opts.precision 1 is not served for rows of up to %lld keys: their kernel %s "
                 "(isa %s, group tile %d, %d MSD planes) has no fast-precision variant", (long long)b->max_len,
                 b->plain->key, fd_isa_table[b->isa].name, b->tile, b->planes);
}

/* Build every bucket of the plan. */
static int plan_buckets(fd_plan *p, const fd_plan_opts *o) {
  char sig[192];
  fd_shape_signature(&p->shape, sig, sizeof sig);
  int64_t top = fd_length_bucket(p->shape.kv_len);
  p->n_buckets = 0;
  for (int64_t len = 1; ; len <<= 1) {
    fd_bucket *b = &p->buckets[p->n_buckets++];
    memset(b, 0, sizeof *b);
    b->max_len = len;
    decide_bucket(p, sig, o, b);
    if (b->from_table == 1) adopt_table_key(p, sig, b);
    int rc = compile_bucket(p, b);
    if (!rc && o->precision == 1) rc = check_fast_served(p, b);
    if (rc) return rc;
    if (b->splits > p->max_splits) p->max_splits = b->splits;
    if (b->threads > p->max_threads) p->max_threads = b->threads;
    if (len >= top) break;
  }
  if (p->split_keys)   /* deterministic mode: the splits of the longest row, whatever the buckets say */
    p->max_splits = fd_row_splits(0, 0, p->split_keys, p->shape.kv_len, p->shape.kv_len, 0);
  else if (p->max_threads > p->max_splits)     /* a row cut for balance: at most one split per thread (items.h.tpl) */
    p->max_splits = p->max_threads;
  p->max_splits += p->new_kv;                   /* the new keys' split */
  p->max_splits += p->shape.window > 0 && p->shape.sink_tokens > 0;   /* the sink split */
  p->rec = p->buckets[0].plain->state_floats;
  return FD_OK;
}

/* Create a plan with some choices forced (ctx referenced by the caller). */
static int create_plan(fd_ctx *ctx, const fd_shape *shape, const fd_plan_opts *opts, fd_plan **out) {
  fd_plan_opts o = { 0 };
  if (opts) o = *opts;
  int rc = check_shape(ctx, shape);
  if (!rc) rc = check_opts(ctx, shape, &o);
  if (rc) return rc;
  if (o.splits > shape->kv_len) o.splits = (int)shape->kv_len;   /* more splits than keys: one key each */
  opts = &o;
  fd_plan *p = calloc(1, sizeof *p);
  if (!p) return fd_fail(ctx, FD_ENOMEM, "out of memory for a plan");
  p->ctx = ctx;
  p->shape = exec_shape(shape);
  p->G = p->shape.n_q_heads / p->shape.n_kv_heads;
  p->q_len = p->shape.q_len > 1 ? p->shape.q_len : 1;
  p->heads = p->G * p->q_len;
  p->new_kv = (p->shape.features & FD_NEW_KV) != 0;
  p->sink_logits = (p->shape.features & FD_SINK_LOGITS) != 0;
  p->alibi = (p->shape.features & FD_ALIBI) != 0;
  p->k_per_channel = (p->shape.features & FD_K_PER_CHANNEL) != 0;
  p->beams = (p->shape.features & FD_BEAMS) != 0;
  p->forced_splits = opts->splits;
  p->forced_planes = opts->planes;
  p->fast = opts->precision > 0 || (opts->precision == 0 && ctx->precision == FD_PRECISION_FAST);
  p->split_keys = ctx->deterministic ? det_split_keys(&p->shape) : 0;
  const char *merge = getenv("FD_MERGE");
  p->merge_in_pass = merge && !strcmp(merge, "pass");
  p->max_splits = p->max_threads = 1;
  rc = plan_buckets(p, opts);
  if (!rc) rc = alloc_scratch(p);
  if (!rc && atomic_load(&ctx->destroyed))
    rc = fd_fail(ctx, FD_EDESTROYED, "the context was destroyed (fd_destroy) while the plan was created");
  if (rc) { free_plan(p); return rc; }
  fd_clear_error(ctx);
  *out = p;
  return FD_OK;
}

/* Create a plan with some choices forced; the plan holds a reference to ctx. */
int fd_plan_create_opts(fd_ctx *ctx, const fd_shape *shape, const fd_plan_opts *opts, fd_plan **out) {
  if (!ctx) return fd_fail(NULL, FD_EINVAL, "ctx is NULL");
  if (!out) return fd_fail(ctx, FD_EINVAL, "plan (the output pointer) is NULL");
  *out = NULL;
  int rc = fd_ctx_acquire(ctx);
  if (rc) return rc;
  rc = create_plan(ctx, shape, opts, out);
  if (rc) fd_ctx_release(ctx);
  return rc;
}

/* Create a plan with every choice left to the planner. */
int fd_plan_create(fd_ctx *ctx, const fd_shape *shape, fd_plan **plan) {
  return fd_plan_create_opts(ctx, shape, NULL, plan);
}

/* The keys a row of valid length len visits, whose bucket fd_run takes
   (exec.c measure_rows): with a window, its main range (the window and the
   q_len - 1 keys of the later tokens; sinks not counted), FD_NEW_KV's new
   keys not counted. */
static int64_t visited_keys(const fd_plan *p, int64_t len) {
  fd_window wd = fd_window_of(len, p->q_len, p->shape.window, p->shape.sink_tokens);
  int64_t keys = len - (p->new_kv ? p->q_len : 0) - wd.first;
  return keys > 1 ? keys : 1;
}

/* What the plan runs when the longest valid length is kv_len (a windowed
   shape: the bucket of the keys its window leaves, as fd_run). */
int fd_plan_info_get(const fd_plan *p, int64_t kv_len, fd_plan_info *info) {
  if (!p || !info) return fd_fail(p ? p->ctx : NULL, FD_EINVAL, "plan or info is NULL");
  if (kv_len < 1 || kv_len > p->shape.kv_len)
    return fd_fail(p->ctx, FD_EINVAL, "kv_len %lld is outside 1..%lld", (long long)kv_len, (long long)p->shape.kv_len);
  const fd_bucket *b = &p->buckets[0];
  int64_t keys = visited_keys(p, kv_len);
  while (b->max_len < keys) b++;
  memset(info, 0, sizeof *info);
  snprintf(info->key, sizeof info->key, "%s", b->plain->key);
  if (b->splits > 1) snprintf(info->split_key, sizeof info->split_key, "%s", b->split->key);
  info->chunk = b->chunk; info->group_tile = b->tile; info->splits = b->splits;
  info->threads = b->threads; info->isa = b->isa; info->from_table = b->from_table;
  info->compile_ms = p->compile_ms;
  info->kernels_compiled = p->kernels_compiled;
  return FD_OK;
}

/* Destroy a plan; the last reference to a destroyed context frees the context. */
void fd_plan_destroy(fd_plan *p) {
  if (!p) return;
  fd_ctx *ctx = p->ctx;
  free_plan(p);
  fd_ctx_release(ctx);
}
