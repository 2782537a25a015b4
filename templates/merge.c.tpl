/* Merge of split partials (m, l, acc): exact and associative; splits with
   m = -inf (empty or fully masked ranges) are the identity. */
void fd_k$(KEY)_merge(const fd_merge_args *a) {
  $(OUTT) *out = ($(OUTT) *)a->out;
  const float ninf = fd_ninf();
  float acc[$(D)];
  int h, s, d;
  for (h = 0; h < a->n_heads; h++) {
    float m = ninf, l = 0.0f, inv;
    for (s = 0; s < a->n_splits; s++) {
      const float *r = a->part + s * a->split_stride + (fd_i64)h * $(REC);
      if (r[$(D)] > m) m = r[$(D)];
    }
    for (d = 0; d < $(D); d++) acc[d] = 0.0f;
    if (m != ninf) {
      for (s = 0; s < a->n_splits; s++) {
        const float *r = a->part + s * a->split_stride + (fd_i64)h * $(REC);
        float wgt;
        if (r[$(D)] == ninf) continue;
        wgt = fd_expf(r[$(D)] - m);
        l += r[$(D + 1)] * wgt;
        for (d = 0; d < $(D); d++) acc[d] += r[d] * wgt;
      }
    }
    inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (d = 0; d < $(D); d++) fd_store_$(OUT_NAME)(out, (fd_i64)h * $(D) + d, acc[d] * inv);
    if (a->lse) a->lse[h] = l > 0.0f ? m + fd_logf(l) : ninf;
  }
}
