/* Merge of split partials (m, l, acc): exact and associative. A split with
   no visible key (m = -inf, l = 0; empty or fully masked) weighs 0: its acc
   is 0, or NaN where a masked key's V held NaN, which stays NaN as in the
   unsplit kernel; a NaN l poisons the head; a head none of whose splits has a
   visible key gives exactly 0 and lse -inf. A learned sink logit (a->sink)
   joins the denominator here, once per head whatever the split count: one
   more state with m = the logit, l = one weight, acc = 0. */
void fd_k$(KEY)_merge(const fd_merge_args *a) {
  $(OUTT) *out = ($(OUTT) *)a->out;
  const float ninf = fd_ninf();
  float acc[$(D)];
  int h, s, d;
@ if ISA > 0 then
  /* the splits' weighted sums and the normalized row by SIMD statements
     (every merged row has at least one split: the first sets acc; the row
     is stored as the decode epilogue stores it: templates/store_row.c.tpl) */
  fd_asm_args aa;
  aa.consts = &fd_simd_c;
  aa.ptr = acc;
@ end
  for (h = 0; h < a->n_heads; h++) {
    float m = ninf, base, l = 0.0f, inv, sink = a->sink ? a->sink[h % a->tok_heads] : ninf;
    for (s = 0; s < a->n_splits; s++) {
      const float *r = a->part + s * a->split_stride + (fd_i64)h * $(REC);
      if (r[$(D)] > m) m = r[$(D)];
    }
    if (sink > m) m = sink;
    base = m == ninf ? 0.0f : m;
@ if ISA == 0 then
    for (d = 0; d < $(D); d++) acc[d] = 0.0f;
@ end
    if (a->sink) l = $(("%.9g"):format(2 ^ -P_SHIFT))f * fd_expf(sink - base);   /* e^(sink - m) 2^-$(P_SHIFT) */
    for (s = 0; s < a->n_splits; s++) {
      const float *r = a->part + s * a->split_stride + (fd_i64)h * $(REC);
      float wgt = fd_expf(r[$(D)] - base);
      l += r[$(D + 1)] * wgt;
@ if ISA > 0 then
      aa.src = r;
      aa.in = &wgt;
      if (s == 0) {
$(simd_merge_first())
      } else {
$(simd_merge_add())
      }
@ else
      for (d = 0; d < $(D); d++) acc[d] += r[d] * wgt;
@ end
    }
    {
      fd_i64 tok = h / a->tok_heads, o = tok * a->tok_stride + (fd_i64)(h % a->tok_heads) * $(D);
@ include("store_row.c.tpl", { ROW = "acc", AT = "o" })
      if (a->lse) a->lse[tok * a->lse_tok_stride + h % a->tok_heads] = l == 0.0f ? ninf : m + fd_log_sum(l);
    }
  }
}
