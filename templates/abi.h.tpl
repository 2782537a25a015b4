/* The kernel ABI shared by generated kernels and the runtime; rendered into
   every generated translation unit and into the runtime's build/fd_abi.h, so
   both sides read one definition. No #include: tcc compiles it bare. */
#ifndef FD_ABI_H
#define FD_ABI_H
#define FD_ABI_VERSION $(ABI_VERSION)

typedef long long fd_i64;
typedef unsigned int fd_u32;
typedef unsigned short fd_u16;
typedef union { fd_u32 u; float f; } fd_bits;

/* One call of a decode kernel: the G query heads of one (batch, kv head)
   against keys [begin, end). State records hold acc[head_dim], m, l. */
typedef struct fd_work {
  const void *q;            /* n_heads query rows of head_dim elements, contiguous */
  const void *k, *v;        /* key and value row 0 of this (batch, kv head) */
  fd_i64 kv_stride;         /* elements from one key row to the next */
  const float *k_scale, *v_scale;  /* int8/fp8: scale of row 0; row i at [i * scale_stride] */
  fd_i64 scale_stride;
  const float *mask;        /* additive mask of the first query head at key 0, or 0 */
  fd_i64 mask_stride;       /* elements from one query head's mask row to the next */
  fd_i64 begin, end;        /* the key range [begin, end), begin <= end */
  int n_heads;              /* query heads per kv head, a multiple of the group tile */
  float scale;              /* softmax scale applied to q.k */
  float *qbuf;              /* scratch of n_heads * head_dim floats */
  float *state;             /* n_heads records of state_floats floats */
  void *out;                /* n_heads output rows (kernels without the split flag) */
  float *lse;               /* n_heads floats or 0 (kernels with the lse flag) */
  /* Paged layout (key layout digit 2) only; 0 otherwise. k, v, k_scale and
     v_scale then point at this kv head's rows in pool page 0, and key i sits
     in page pages[i >> page_shift] at slot i & (2^page_shift - 1). */
  const int *pages;         /* this batch row's block table */
  fd_i64 page_stride;       /* elements from one pool page to the next (n_kv_heads x page_size x head_dim) */
  fd_i64 scale_page_stride; /* int8/fp8 scales from one pool page to the next (n_kv_heads x page_size) */
  int page_shift;           /* log2(page_size) */
  /* Query tokens (fd_shape.q_len; 1 when it is 0 or 1): the n_heads query
     rows are q_len tokens of tok_heads rows each, token-major; token t's
     rows of q and out start t * tok_stride elements after token 0's, its
     lse t * lse_tok_stride, its mask rows t * mask_tok_stride. Causal:
     token t sees the keys below tok_end0 + t. A sliding window (causal,
     q_len > 1): token t does not see the keys [win_lo, win_hi0 + t), empty
     for every token when win_hi0 + q_len - 1 <= win_lo (no window). */
  int q_len, tok_heads;
  fd_i64 tok_stride, lse_tok_stride, mask_tok_stride, tok_end0;
  fd_i64 win_lo, win_hi0;
  /* ALiBi (causal): the slopes of the tok_heads heads, or 0; a score of
     token t gains slope x (key - the token's position, tok_end0 - 1 + t). */
  const float *alibi;
  /* Logit softcap: a score s becomes softcap x tanh(s / softcap) after the
     scale, before the mask and the ALiBi bias; 0: none. */
  float softcap;
  /* Beams (the key's beams digit) only; 0 otherwise: key i is read from the
     cache of batch row beam_src[i] (this row's entries of fd_args.beam_src).
     k, v, k_scale and v_scale then point at batch row 0's rows of this kv
     head: dense, row r's start beam_stride (scales beam_scale_stride)
     elements later; paged, pages is row 0's block table and row r's starts
     beam_stride entries later. With the k_per_channel digit, k_scale is
     instead the head_dim channel scales of batch row 0 (kv head j), row r's
     beam_kch_stride floats later: key i's are those of its source row,
     folded into the query per run of keys from one source row, and qbuf then
     holds 2 x n_heads x head_dim floats (the folded q, then the scaled q). */
  const int *beam_src;
  fd_i64 beam_stride, beam_scale_stride, beam_kch_stride;
  /* The first K and V rows (key begin) of the work item this thread runs
     next, or 0: the last chunk prefetches them instead of the rows past its
     end, which belong to another item (dense layouts; 0 for paged and beam
     items, which prefetch as before). */
  const void *next_k, *next_v;
} fd_work;

/* Merge of split partials: split s, head g is the record at
   part + s * split_stride + g * state_floats. */
typedef struct fd_merge_args {
  const float *part;
  fd_i64 split_stride;
  int n_splits, n_heads;
  void *out;                /* n_heads output rows, in tokens of tok_heads (fd_work) */
  float *lse;               /* n_heads floats or 0 */
  int tok_heads;
  fd_i64 tok_stride, lse_tok_stride;
  const float *sink;        /* FD_SINK_LOGITS: the learned logit of each of the tok_heads heads, or 0 */
} fd_merge_args;

/* What the generator knows about a kernel, so no consumer re-parses its key. */
typedef struct fd_kernel_desc {
  const char *key;          /* the decimal tiling key, also the symbol fd_k<key> */
  /* the key's fields (gen/facts.lua KEY_FIELDS), least significant first */
@ for _, f in ipairs(KEY_FIELDS) do
  int $(f.cname or f.name);
@ end
  int state_floats;         /* floats per head in a state record (acc, m, l, padding) */
  int abi_version;
  void (*run)(const fd_work *w);
  void (*merge)(const fd_merge_args *a);   /* 0 unless the split flag is set */
} fd_kernel_desc;

#endif /* FD_ABI_H */
