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
   len / longest, rounded up, at least 1, so that every item costs about the same. */
static inline int fd_row_splits(int splits, int forced, int64_t split_keys, int64_t len, int64_t longest) {
  int S = split_keys ? (int)((len + split_keys - 1) / split_keys)
          : forced ? forced : (int)((splits * len + longest - 1) / longest);
  return S < 1 ? 1 : S;
}

/* First key of split sp (0..S) of a row of len keys cut in S: sp K with
   split_keys K > 0 (deterministic mode: fixed boundaries), else len sp / S;
   len for sp = S, so split sp covers [begin(sp), begin(sp + 1)). */
static inline int64_t fd_split_begin(int64_t len, int S, int64_t split_keys, int sp) {
  if (sp >= S) return len;
  return split_keys ? split_keys * sp : len * sp / S;
}

/* Lay out the items: rows in order (longest first), then kv heads, then
   splits (fd_row_splits, fd_split_begin; split_keys 0 outside deterministic
   mode). Sets row_splits[b]; returns the number of items. */
static inline int fd_layout_items(int batch, int n_kv_heads, const int64_t *len, const int *order, int splits,
                                  int forced, int64_t split_keys, int *row_splits, fd_item *items) {
  int64_t longest = len[order[0]];
  int n = 0;
  for (int r = 0; r < batch; r++) {
    int b = order[r], S = fd_row_splits(splits, forced, split_keys, len[b], longest);
    row_splits[b] = S;
    for (int j = 0; j < n_kv_heads; j++)
      for (int sp = 0; sp < S; sp++) {
        fd_item *it = &items[n++];
        it->b = b; it->j = j; it->s = sp;
        it->begin = fd_split_begin(len[b], S, split_keys, sp);
        it->end = fd_split_begin(len[b], S, split_keys, sp + 1);
      }
  }
  return n;
}

/* The kernel of an item of a row cut in S: the split kernel (its partials
   merged after), else the lse kernel when lse is asked for, else the plain one. */
static inline const fd_kernel_desc *fd_item_kernel(const fd_kernel_desc *plain, const fd_kernel_desc *lse,
                                                   const fd_kernel_desc *split, int S, int want_lse) {
  return S > 1 ? split : want_lse ? lse : plain;
}

/* The partial record of split s of (batch row, kv head) number row, in
   partials laid out [row][max_splits][G heads][rec floats]. */
static inline float *fd_partial(float *partials, size_t row, int max_splits, int s, int G, int rec) {
  return partials + ((row * (size_t)max_splits + (size_t)s) * (size_t)G * (size_t)rec);
}

/* Merge the S partials of one (batch row, kv head) from part, splits in
   order 0..S-1, into out and lse (NULL: none) with the split kernel's merge. */
static inline void fd_merge_partials(const fd_kernel_desc *split, const float *part, int S, int G, int rec, void *out,
                                     float *lse) {
  fd_merge_args m;
  m.part = part;
  m.split_stride = (fd_i64)G * rec;
  m.n_splits = S;
  m.n_heads = G;
  m.out = out;
  m.lse = lse;
  split->merge(&m);
}

#endif /* FD_ITEMS_H */
