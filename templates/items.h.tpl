/* The work items of a run, written once: libflashdecode's executor
   (runtime/exec.c, through runtime/internal.h's #include of this file) and
   the exported header's fdt_run (`fdgen export` renders this file into it)
   cut a batch into the same kernel calls, give each split the same keys and
   merge the same partials in the same order. Plain C with no template
   escapes and no #include: the includer provides <stdint.h>, <stddef.h> and
   the kernel ABI (fd_work, fd_merge_args, fd_kernel_desc). */
#ifndef FD_ITEMS_H
#define FD_ITEMS_H

/* One work item: keys [begin, end) of (batch row b, kv head j), split s of its row. */
typedef struct fd_item { int b, j, s; int64_t begin, end; } fd_item;

/* The splits of a length bucket from its tuned row's: at most one per key of
   the bucket's longest row (its max_len, or kv_len when that is shorter). */
static inline int fd_bucket_splits(int row_splits, int64_t max_len, int64_t kv_len) {
  int64_t len = max_len < kv_len ? max_len : kv_len;
  return row_splits < len ? row_splits : (int)len;
}

/* Valid keys of batch row b: cur_pos[b] + 1 when causal, else kv_len. */
static inline int64_t fd_valid_len(int causal, const int32_t *cur_pos, int b, int64_t kv_len) {
  return causal ? (int64_t)cur_pos[b] + 1 : kv_len;
}

/* The keys a causal row visits under a sliding window (fd_shape.window > 0,
   docs/DESIGN.md): token t of q_len sits at len - q_len + t and sees keys
   ws0 + t .. its position, ws0 = len - q_len - window + 1, plus the sink
   tokens 0..sink_tokens - 1. The row's main range is [first, len) and its
   sink split [0, sink) (sink 0: none; sinks that reach the window join it
   in one range from 0); token t also hides the keys [cut_lo, cut_hi0 + t)
   of the main range, which only q_len > 1 leaves (empty for token 0, and for
   every token without a window). */
typedef struct fd_window { int64_t first, sink, cut_lo, cut_hi0; } fd_window;

/* The window ranges of a row whose last token sees the keys below len. */
static inline fd_window fd_window_of(int64_t len, int q_len, int window, int sink_tokens) {
  fd_window r = { 0, 0, 0, -(int64_t)q_len };
  if (window <= 0) return r;
  int64_t ws0 = len - q_len - window + 1, f = ws0 > 0 ? ws0 : 0;
  r.cut_lo = sink_tokens > f ? sink_tokens : f;
  r.cut_hi0 = ws0;
  if (sink_tokens < f) { r.first = f; r.sink = sink_tokens; }
  return r;
}

/* Pages per block-table row of the paged layout: ceil(kv_len / page_size). */
static inline int64_t fd_table_pages(int64_t kv_len, int page_size) { return (kv_len + page_size - 1) / page_size; }

/* The paged layout's block table [batch][fd_table_pages] checked where it
   holds keys the run visits (causal: 0..cur_pos[b], else all kv_len; the
   last not_cached of them are not in the cache: FD_NEW_KV's new tokens,
   whose positions the window counts; with a window, its ranges: the pages
   engines free outside it are not read): 1 with the row and page of the first entry outside
   0..pool_pages - 1, else 0. */
static inline int fd_bad_page(const int32_t *table, int batch, int causal, const int32_t *cur_pos, int64_t kv_len,
                              int64_t not_cached, int q_len, int window, int sink_tokens, int page_size,
                              int64_t pool_pages, int *bad_b, int64_t *bad_page) {
  int64_t per_row = fd_table_pages(kv_len, page_size);
  for (int b = 0; b < batch; b++) {
    int64_t len = fd_valid_len(causal, cur_pos, b, kv_len) - not_cached;
    fd_window wd = fd_window_of(len + not_cached, q_len, window, sink_tokens);
    int64_t sink_pages = fd_table_pages(wd.sink, page_size), pages = fd_table_pages(len, page_size);
    for (int64_t i = 0; i < pages; i++) {
      int32_t e = table[b * per_row + i];
      if (i >= sink_pages && i < wd.first / page_size) continue;
      if (e < 0 || e >= pool_pages) { *bad_b = b; *bad_page = i; return 1; }
    }
  }
  return 0;
}

/* FD_BEAMS: beam_src [batch][kv_len] checked for every cached key a row
   visits (as fd_bad_page: the last not_cached keys are FD_NEW_KV's new
   ones, the row's own; with a window, its ranges), row by row in key order:
   1 when the first bad key's entry is outside 0..batch - 1; 2 when, paged
   (table not NULL), the block-table entry its source row's page holds is
   outside 0..pool_pages - 1; its row and key in *bad_b, *bad_key; else 0. */
static inline int fd_bad_beam(const int32_t *beam_src, const int32_t *table, int batch, int causal,
                              const int32_t *cur_pos, int64_t kv_len, int64_t not_cached, int q_len, int window,
                              int sink_tokens, int page_size, int64_t pool_pages, int *bad_b, int64_t *bad_key) {
  for (int b = 0; b < batch; b++) {
    int64_t len = fd_valid_len(causal, cur_pos, b, kv_len) - not_cached;
    fd_window wd = fd_window_of(len + not_cached, q_len, window, sink_tokens);
    for (int64_t k = 0; k < len; k++) {
      if (k == wd.sink && k < wd.first && (k = wd.first) >= len) break;   /* past the sinks: the window */
      int32_t r = beam_src[(size_t)b * (size_t)kv_len + (size_t)k], e;
      *bad_b = b;
      *bad_key = k;
      if (r < 0 || r >= batch) return 1;
      if (!table) continue;
      e = table[r * fd_table_pages(kv_len, page_size) + k / page_size];
      if (e < 0 || e >= pool_pages) return 2;
    }
  }
  return 0;
}

/* The geometry of a layout (the key's layout digit: 0 BHSD, 1 BSHD, 2 paged). */
typedef struct fd_kv_geometry {
  int layout, n_kv_heads, head_dim, page_size;
  int64_t kv_len;
  size_t elem_bytes;        /* of the KV dtype */
} fd_kv_geometry;

/* The K/V rows of (batch row b, kv head j) in w: row 0 of K, V and their
   scales (NULL stays NULL), the row strides and, paged, row b's block table
   and the pool strides (templates/abi.h.tpl). */
static inline void fd_kv_rows(const fd_kv_geometry *g, const void *k, const void *v, const float *k_scale,
                              const float *v_scale, const int32_t *table, int b, int j, fd_work *w) {
  int64_t row0;
  w->pages = 0;
  w->page_stride = w->scale_page_stride = 0;
  w->page_shift = 0;
  if (g->layout == 2) {
    row0 = (int64_t)j * g->page_size;
    w->pages = table + b * fd_table_pages(g->kv_len, g->page_size);
    w->scale_page_stride = (int64_t)g->n_kv_heads * g->page_size;
    w->page_stride = w->scale_page_stride * g->head_dim;
    while ((1 << w->page_shift) < g->page_size) w->page_shift++;
  } else if (g->layout == 0) {
    row0 = ((int64_t)b * g->n_kv_heads + j) * g->kv_len;
  } else {
    row0 = (int64_t)b * g->kv_len * g->n_kv_heads + j;
  }
  w->k = (const char *)k + (size_t)row0 * (size_t)g->head_dim * g->elem_bytes;
  w->v = (const char *)v + (size_t)row0 * (size_t)g->head_dim * g->elem_bytes;
  w->kv_stride = g->layout == 1 ? (int64_t)g->n_kv_heads * g->head_dim : (int64_t)g->head_dim;
  w->scale_stride = g->layout == 1 ? g->n_kv_heads : 1;
  w->k_scale = k_scale ? k_scale + row0 : 0;
  w->v_scale = v_scale ? v_scale + row0 : 0;
  w->next_k = w->next_v = 0;
}

/* FD_BEAMS: the K/V rows of batch row b, kv head j in w: batch row 0's of
   kv head j (fd_kv_rows) with the strides to row r's, and row b's entries
   of beam_src [B, kv_len] (templates/abi.h.tpl). k_channel (FD_K_PER_CHANNEL,
   a per-element dtype): k_scale holds channel scales [B, Hkv, head_dim],
   each key's those of its source row. */
static inline void fd_beam_rows(const fd_kv_geometry *g, const void *k, const void *v, const float *k_scale,
                                const float *v_scale, const int32_t *table, const int32_t *beam_src, int k_channel,
                                int b, int j, fd_work *w) {
  fd_kv_rows(g, k, v, k_channel ? 0 : k_scale, v_scale, table, 0, j, w);
  w->beam_src = beam_src + (size_t)b * (size_t)g->kv_len;
  w->beam_scale_stride = (int64_t)g->n_kv_heads * g->kv_len;
  w->beam_stride = g->layout == 2 ? fd_table_pages(g->kv_len, g->page_size) : w->beam_scale_stride * g->head_dim;
  if (!k_channel) return;
  w->k_scale = k_scale + (size_t)j * (size_t)g->head_dim;
  w->beam_kch_stride = (int64_t)g->n_kv_heads * g->head_dim;
}

/* The query tokens of (batch row b, kv head j) in w, for n_q_heads query
   heads of G per kv head, q_len tokens per row (at least 1) and row b's
   valid keys len (causal: its last token's): n_heads = G x q_len rows in
   tokens of G, the token strides of q/out ([B, q_len, Hq, D]), lse and the
   mask ([B, q_len, Hq, kv_len]), and token 0's key limit, len - q_len + 1.
   Returns the index of row b's token 0, head j * G, in [B, q_len, Hq]. */
static inline size_t fd_token_rows(int n_q_heads, int G, int q_len, int head_dim, int64_t kv_len, int b, int j,
                                   int64_t len, fd_work *w) {
  w->q_len = q_len;
  w->tok_heads = G;
  w->n_heads = G * q_len;
  w->tok_stride = (int64_t)n_q_heads * head_dim;
  w->lse_tok_stride = n_q_heads;
  w->mask_tok_stride = (int64_t)n_q_heads * kv_len;
  w->tok_end0 = len - q_len + 1;
  w->win_lo = 0;
  w->win_hi0 = -(fd_i64)q_len;
  w->alibi = 0;
  w->softcap = 0;
  w->beam_src = 0;
  w->beam_stride = w->beam_scale_stride = w->beam_kch_stride = 0;
  return ((size_t)b * (size_t)q_len * (size_t)n_q_heads) + (size_t)j * (size_t)G;
}

/* order[0..batch) = the batch rows by descending length, equal lengths in
   index order (insertion sort: lengths often come ordered); the longest. */
static inline int64_t fd_order_rows(int batch, const int64_t *len, int *order) {
  for (int b = 0; b < batch; b++) order[b] = b;
  for (int i = 1; i < batch; i++)
    for (int k = i; k > 0 && len[order[k]] > len[order[k - 1]]; k--) {
      int t = order[k]; order[k] = order[k - 1]; order[k - 1] = t;
    }
  return len[order[0]];
}

/* Splits of a row of len keys. Deterministic mode (split_keys K > 0): one
   per K keys, ceil(len / K), whatever the other rows and the threads. Else
   forced ones (nonzero) for every row, else the bucket's splits scaled by
   len / longest, rounded up, at least 1, so that every item costs about the
   same, and at least ceil(len / item_keys) (item_keys 0: no such bound). */
static inline int fd_row_splits(int splits, int forced, int64_t split_keys, int64_t len, int64_t longest,
                                int64_t item_keys) {
  int S = split_keys ? (int)((len + split_keys - 1) / split_keys)
          : forced ? forced : longest < 1 ? 1 : (int)((splits * len + longest - 1) / longest);
  if (!split_keys && !forced && item_keys > 0 && (len + item_keys - 1) / item_keys > S)
    S = (int)((len + item_keys - 1) / item_keys);
  return S < 1 ? 1 : S;
}

/* Below this many keys an item is never cut for balance (a split's merge
   and a second thread cost more than they save on short rows). */
#define FD_MIN_ITEM_KEYS 4096

/* The most keys an item of a batch takes: the batch's keys (every row, every
   kv head) per thread, at least FD_MIN_ITEM_KEYS. A row much longer than the
   others (one 64k row among 1k rows) is then cut into as many items as the
   threads need to share it, where the bucket's split count would leave it
   whole; uniform batches keep the bucket's splits (their rows are never
   longer than this). At most ceil(threads / n_kv_heads) splits follow. */
static inline int64_t fd_item_keys(int batch, int n_kv_heads, const int64_t *len, int threads) {
  int64_t total = 0;
  for (int b = 0; b < batch; b++) total += len[b];
  total *= n_kv_heads;
  int64_t per_thread = (total + threads - 1) / (threads > 0 ? threads : 1);
  return per_thread < FD_MIN_ITEM_KEYS ? FD_MIN_ITEM_KEYS : per_thread;
}

/* First key of split sp (0..S) of a row of len keys cut in S: sp K with
   split_keys K > 0 (deterministic mode: fixed boundaries), else len sp / S;
   len for sp = S, so split sp covers [begin(sp), begin(sp + 1)). */
static inline int64_t fd_split_begin(int64_t len, int S, int64_t split_keys, int sp) {
  if (sp >= S) return len;
  return split_keys ? split_keys * sp : len * sp / S;
}

/* Lay out the items: rows in order (longest first), then kv heads, then
   splits: with a window (sink non-NULL) and sink[b] > 0 first the sink
   split, keys [0, sink[b]); then the row's len[b] keys from first[b] (NULL:
   0), cut by fd_row_splits with fd_item_keys for the bucket's threads and
   fd_split_begin (split_keys 0 outside deterministic mode); with
   new_keys > 0 (FD_NEW_KV: the q_len new tokens' keys) one more split last,
   keys [0, new_keys) of the new rows. Sets row_splits[b] (all splits);
   returns the number of items. */
static inline int fd_layout_items(int batch, int n_kv_heads, const int64_t *len, const int64_t *first,
                                  const int64_t *sink, const int *order, int splits, int forced, int64_t split_keys,
                                  int threads, int new_keys, int *row_splits, fd_item *items) {
  int64_t longest = len[order[0]], item_keys = fd_item_keys(batch, n_kv_heads, len, threads);
  int n = 0;
  for (int r = 0; r < batch; r++) {
    int b = order[r], S = fd_row_splits(splits, forced, split_keys, len[b], longest, item_keys);
    int lead = sink && sink[b] > 0;
    int64_t f = first ? first[b] : 0;
    row_splits[b] = lead + S + (new_keys > 0);
    for (int j = 0; j < n_kv_heads; j++)
      for (int sp = 0; sp < row_splits[b]; sp++) {
        fd_item *it = &items[n++];
        int k = sp - lead;
        it->b = b; it->j = j; it->s = sp;
        it->begin = k < 0 ? 0 : k < S ? f + fd_split_begin(len[b], S, split_keys, k) : 0;
        it->end = k < 0 ? sink[b] : k < S ? f + fd_split_begin(len[b], S, split_keys, k + 1) : new_keys;
      }
  }
  return n;
}

/* Whether a row cut in S goes through the merge: when it was split, or when
   learned sink logits (FD_SINK_LOGITS) join its denominator there, once. */
static inline int fd_row_merged(int S, int sink_logits) { return S > 1 || sink_logits; }

/* The kernel of an item of a row: the split kernel when the row is merged
   (its partials merged after), else the lse kernel when lse is asked for,
   else the plain one. */
static inline const fd_kernel_desc *fd_item_kernel(const fd_kernel_desc *plain, const fd_kernel_desc *lse,
                                                   const fd_kernel_desc *split, int merged, int want_lse) {
  return merged ? split : want_lse ? lse : plain;
}

/* The partial record of split s of (batch row, kv head) number row, in
   partials laid out [row][max_splits][G heads][rec floats]. */
static inline float *fd_partial(float *partials, size_t row, int max_splits, int s, int G, int rec) {
  return partials + ((row * (size_t)max_splits + (size_t)s) * (size_t)G * (size_t)rec);
}

/* Merge the S partials of one (batch row, kv head) from part, splits in
   order 0..S-1, into the out and lse (NULL: none) of its kernel call w (its
   heads and tokens) with the split kernel's merge; sink: the learned sink
   logits of its tok_heads heads, or NULL. */
static inline void fd_merge_partials(const fd_kernel_desc *split, const float *part, int S, int rec, const fd_work *w,
                                     const float *sink) {
  fd_merge_args m;
  m.part = part;
  m.split_stride = (fd_i64)w->n_heads * rec;
  m.n_splits = S;
  m.n_heads = w->n_heads;
  m.out = w->out;
  m.lse = w->lse;
  m.tok_heads = w->tok_heads;
  m.tok_stride = w->tok_stride;
  m.lse_tok_stride = w->lse_tok_stride;
  m.sink = sink;
  split->merge(&m);
}

#endif /* FD_ITEMS_H */
