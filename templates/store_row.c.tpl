@ -- A head's row normalized and stored (the decode epilogue and the merge of
@ -- splits, templates/decode.c.tpl and merge.c.tpl): ROW (D floats) times
@ -- 1 / l into out at element offset AT, by the store_out statement (aa
@ -- declared, its consts set) or C; a row with l = 0 (no visible key) is
@ -- exactly 0, even where a masked key's V held NaN.
      if (l == 0.0f) {
        for (d = 0; d < $(D); d++) $(ROW)[d] = 0.0f;
        inv = 0.0f;
      } else inv = 1.0f / l;
@ if ISA > 0 then
      aa.ptr = $(ROW);
      aa.n = $(D);
      aa.in = &inv;
      aa.out = (float *)(out + $(AT));
$(simd_store_out())
@ else
      for (d = 0; d < $(D); d++) fd_store_$(OUT_NAME)(out, $(AT) + d, $(ROW)[d] * inv);
@ end
