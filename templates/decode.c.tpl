/* Decode kernel: the n_heads query heads of one (batch, kv head) against keys
   [begin, end), chunk by chunk: scores of the whole chunk, max, exp, sum, then
   the P.V pass, with an online softmax across chunks. Group tile $(T): that
   many query heads share each pass over a K/V row. */
void fd_k$(KEY)(const fd_work *w) {
  const $(KVT) *kbase = (const $(KVT) *)w->k;
  const $(KVT) *vbase = (const $(KVT) *)w->v;
  const fd_i64 kvs = $(STRIDE);
  const fd_i64 end = w->end;
@ if PAGED then
  /* paged layout: key i in page pages[i >> page_shift], slot i & pmask */
  const int *pages = w->pages;
  const fd_i64 pmask = ((fd_i64)1 << w->page_shift) - 1;
@   if ISA > 0 then
  fd_i64 po, pm;
@   end
@ end
@ if BEAMS == 1 then
  /* beams: key i of this row is read from batch row bsrc[i]'s cache (fd_work.beam_src) */
  const int *bsrc = w->beam_src;
@   if ISA > 0 and not PAGED then
  fd_i64 po, pm;
@   end
@ end
@ if K_PER_CHANNEL == 1 and ISA > 0 then
  /* K scales per channel are folded into q: the scores kernel scales each row by 1 */
  const float kone = 1.0f;
@ end
  const int nh = w->n_heads;
  float *qbuf = w->qbuf, *state = w->state;
@ if BEAMS == 1 and K_PER_CHANNEL == 1 then
  /* beams with per-channel K: qraw holds the scaled q, qbuf a tile's q times
     the channel scales of source row qrow (-1: none yet) */
  float *qraw = qbuf + (fd_i64)nh * $(D);
  fd_i64 qrow;
@ end
  const float ninf = fd_ninf();
@ if ISA > 0 then
  /* score rows and staged K rows on 64-byte boundaries: whole cache lines per vector.
     stage is not cleared: a staged row past a chunk's end only feeds the score
     lane of its own (nonexistent) key, and those lanes are set to -inf below. */
  float sc_raw[$(T * SCW + 16)], stage_raw[$(W * D + 16)];
  float *sc = (float *)(((unsigned long long)sc_raw + 63) & ~63ull);
  float *stage = (float *)(((unsigned long long)stage_raw + 63) & ~63ull);
@   if PV_BSCALE then
  /* a P.V piece's weights times their keys' block scales: a row per head and ggml block */
  float bw_raw[$(pv_row(T) + 16)];
  float *bw = (float *)(((unsigned long long)bw_raw + 63) & ~63ull);
@   end
  /* the logit softcap's 1 / softcap and softcap, once per call */
  float cap[2];
  cap[0] = w->softcap > 0 ? 1.0f / w->softcap : 0.0f;
  cap[1] = w->softcap;
@ else
  float sc[$(T * SCW)];
@ end
@ if NEED_BITS then
  fd_bits cv;
@ end
@ if NEED_HU then
  fd_u32 hu;
@ end
  fd_i64 c, n;
@ if not HL or MASK or MASK_MODE == 0 then
  fd_i64 i;
@ end
  const int th = w->tok_heads;
  int h, d, tp;
  (void)h; (void)d;   /* kernels whose per-call work is all statements use neither */
@ if ISA > 0 and not HL and not DPBF16 then
  int tk;
@ end
  /* q in f32, pre-scaled; state records start empty (m = -inf, l = 0). */
@ if ISA > 0 then
  {
    fd_asm_args aa;
    float scale = w->scale;
    aa.consts = &fd_simd_c;
    aa.in = &scale;
@   if HL and DPBF16 then
    /* head-lane tiles with vdpbf16ps: q pair columns, the 32-bit word
       qbuf[tile][j][t] = raw bf16 q[tile * T + t][2j] | q[..][2j + 1] << 16 */
    (void)aa;
    for (tp = 0; tp < nh; tp += $(T)) {
      const fd_u16 *qs = (const fd_u16 *)w->q + (fd_i64)(tp / th) * w->tok_stride + (fd_i64)(tp % th) * $(D);
      fd_u32 *qd = (fd_u32 *)(qbuf + tp * $(D));
      for (h = 0; h < $(T); h++)
        for (d = 0; d < $(D); d += 2)
          qd[d / 2 * $(T) + h] = (fd_u32)qs[h * $(D) + d] | (fd_u32)qs[h * $(D) + d + 1] << 16;
    }
@   elseif HL then
    /* head-lane tiles: q columns, qbuf[tile][d][t] = q[tile * T + t][d] */
    for (tp = 0; tp < nh; tp += $(T)) {
      aa.src = (const $(QT) *)w->q + (fd_i64)(tp / th) * w->tok_stride + (fd_i64)(tp % th) * $(D);
      aa.ptr = stage;
      aa.n = $(T * D);
$(simd_qload())
@     if Q_COLUMNS then
      aa.src = stage;
      aa.ptr = qbuf + tp * $(D);
$(simd_q_columns())
@     else
      for (h = 0; h < $(T); h++)
        for (d = 0; d < $(D); d++) qbuf[tp * $(D) + d * $(T) + h] = stage[h * $(D) + d];
@     end
    }
@   elseif DPBF16 then
    /* vdpbf16ps scores read q as bf16 pairs: each head's row of qbuf holds its
       raw bf16 q (unscaled: the scores kernel scales its sums) */
    (void)aa;
    for (h = 0; h < nh; h++) {
      const $(QT) *qs = (const $(QT) *)w->q + (fd_i64)(h / th) * w->tok_stride + (fd_i64)(h % th) * $(D);
      $(QT) *qd = ($(QT) *)(qbuf + h * $(D));
      for (d = 0; d < $(D); d++) qd[d] = qs[d];
    }
@   else
    for (tk = 0; tk < w->q_len; tk++) {
      aa.src = (const $(QT) *)w->q + tk * w->tok_stride;
      aa.ptr = qbuf + (fd_i64)tk * th * $(D);
      aa.n = (fd_i64)th * $(D);
$(simd_qload())
    }
@     if K_PER_CHANNEL == 1 and BEAMS == 1 then
    /* per-channel K with beams: the scaled q kept, folded per source row below */
    for (h = 0; h < nh * $(D); h++) qraw[h] = qbuf[h];
@     elseif K_PER_CHANNEL == 1 then
    /* per-channel K scales (k_scale [D] of this row and kv head) folded into q */
    for (h = 0; h < nh; h++)
      for (d = 0; d < $(D); d++) qbuf[h * $(D) + d] *= w->k_scale[d];
@     end
@     if Q_SPLIT and not QLOAD_SPLIT then
    /* bf16 K is read as even and odd elements of pairs of d-blocks ($(SPLIT_PAIR)
       elements): q alike (bf16 q: qload stores it so, gen/simd.lua qload_split) */
    for (h = 0; h < nh; h++)
      for (d = 0; d + $(SPLIT_PAIR) <= $(D); d += $(SPLIT_PAIR)) {
        float *qr = qbuf + h * $(D) + d;
        int e;
        for (e = 0; e < $(SPLIT_PAIR); e++) stage[e] = qr[e];
        for (e = 0; e < $(SPLIT_PAIR) / 2; e++) {
          qr[e] = stage[2 * e];
          qr[$(SPLIT_PAIR) / 2 + e] = stage[2 * e + 1];
        }
      }
@     end
@     if PLANES > 0 then
    /* MSD scores (gen/simd.lua scores_msd): each head's f32 q (scaled, any K
       scales folded) becomes $(PLANES) int8 planes in its own q row, q ~= s (q0 +
       q1 2^-7 + q2 2^-14), s = max |q| / 127: the planes (D bytes each), then
       per plane -128 sum(plane) (int32) and its scale s 2^-7j (f32). A
       non-finite q gives NaN scales: NaN scores, as the f32 kernel's. */
    aa.ptr = qbuf;
    aa.n = nh;
    aa.stage = stage;
$(simd_q_planes())
@     end
@   end
  }
@ else
  {
    for (h = 0; h < nh; h++) {
      const $(QT) *q = (const $(QT) *)w->q + (fd_i64)(h / th) * w->tok_stride + (fd_i64)(h % th) * $(D);
      for (d = 0; d < $(D); d++) {
        float x;
        $(load(Q_DTYPE, "x", "q[d]"))
@   if K_PER_CHANNEL == 1 and BEAMS == 1 then
        qraw[h * $(D) + d] = x * w->scale;
@   else
        qbuf[h * $(D) + d] = x * w->scale$(K_PER_CHANNEL == 1 and " * w->k_scale[d]" or "");
@   end
      }
    }
  }
@ end
@ if ISA > 0 then
  {
    fd_asm_args aa;
    aa.consts = &fd_simd_c;
    aa.ptr = state;
    aa.n = nh;
$(simd_init_records())
  }
@ else
  for (h = 0; h < nh; h++) {
    float *st = state + (fd_i64)h * $(REC);
    for (d = 0; d < $(D); d++) st[d] = 0.0f;
    st[$(D)] = ninf;
    st[$(D + 1)] = 0.0f;
  }
@ end
  for (c = w->begin; c < end; c += $(CHUNK)) {
    n = end - c < $(CHUNK) ? end - c : $(CHUNK);
    for (tp = 0; tp < nh; tp += $(T)) {
@ for t = 0, T - 1 do
@   if ISA == 0 or t == 0 then
      const float *q$(t) = qbuf + (tp + $(t)) * $(D);
@   end
@   if not HL or t == 0 then
      float *FD_RESTRICT st$(t) = state + (fd_i64)(tp + $(t)) * $(REC);
@   end
@   if MASK then
      const float *mrow$(t) = w->mask + (fd_i64)((tp + $(t)) / th) * w->mask_tok_stride
                              + (fd_i64)((tp + $(t)) % th) * w->mask_stride + c;
@   end
@ end
@ if BEAMS == 1 and K_PER_CHANNEL == 1 then
      qrow = -1;                       /* this tile's q holds no source row's channel scales yet */
@ end
@ if ISA > 0 then
      /* $(ISA_NAME) micro-kernels (gen/simd.lua): scores, max, exp, P.V. */
      {
        fd_asm_args aa;
@   if not HL then
        fd_i64 npad = (n + $(W - 1)) / $(W) * $(W);
@   end
        aa.consts = &fd_simd_c;
        aa.stage = stage;
        aa.ptr = (float *)q0;
        aa.stride = kvs * (fd_i64)sizeof(*kbase);
@   if QUANT then
        aa.scl_stride = $(K_PER_CHANNEL == 1 and "0" or PAGED and "4" or "w->scale_stride * 4");
@   else
        aa.scl = $(DPBF16 and "&w->scale" or "0");
        aa.scl_stride = 0;
@   end
@   if BEAMS == 1 then
        /* beams: the chunk in pieces, each a run of keys read from one source
           row (and, paged, one page), scored into its place in the score rows */
        for (po = 0; po < n; po += pm) {
$(beam_piece("          "))
@     if K_PER_CHANNEL == 1 then
$(kch_fold("          ", "r"))
@     end
          aa.src = kp;
          aa.pf = vp;
          aa.sc = sc + po$(HL and (" * " .. T) or "");
          aa.n = pm;
@     if QUANT then
          aa.scl = $(K_PER_CHANNEL == 1 and "&kone" or "ksp");
@     end
@     if AHEAD_ROWS > 0 then
          if (pm > $(AHEAD_ROWS)) {
            aa.n = pm - $(AHEAD_ROWS);
$(simd_scores())
            aa.src = (const $(KVT) *)aa.src + aa.n * kvs;
            aa.pf = (const $(KVT) *)aa.pf + aa.n * kvs;
            aa.sc += aa.n;
@     if QUANT then
            aa.scl = (const float *)((const char *)aa.scl + aa.n * aa.scl_stride);
@     end
            aa.n = $(AHEAD_ROWS);
          }
$(simd_scores_tail())
@     else
$(simd_scores())
@     end
        }
@   elseif PAGED then
        /* the chunk page by page: each piece is a run of rows of one page,
           scored into its place in the chunk's score rows (a piece's padding
           lanes are overwritten by the next piece or by the padding below) */
        for (po = 0; po < n; po += pm) {
          fd_i64 slot = (c + po) & pmask, pg = (fd_i64)pages[(c + po) >> w->page_shift];
          pm = n - po < pmask + 1 - slot ? n - po : pmask + 1 - slot;
          aa.src = kbase + pg * w->page_stride + slot * kvs;
          aa.pf = vbase + pg * w->page_stride + slot * kvs;
          aa.sc = sc + po$(HL and (" * " .. T) or "");
          aa.n = pm;
@     if QUANT then
          aa.scl = $(K_PER_CHANNEL == 1 and "&kone" or "w->k_scale + pg * w->scale_page_stride + slot");
@     end
@     if AHEAD_ROWS > 0 then
          /* the scores kernel prefetches $(AHEAD_ROWS) rows ahead: all but the
             piece's last $(AHEAD_ROWS) rows with it, those without (past the
             piece lie another page's rows) */
          if (pm > $(AHEAD_ROWS)) {
            aa.n = pm - $(AHEAD_ROWS);
$(simd_scores())
            aa.src = (const $(KVT) *)aa.src + aa.n * kvs;
            aa.pf = (const $(KVT) *)aa.pf + aa.n * kvs;
            aa.sc += aa.n;
@     if QUANT then
            aa.scl = (const float *)((const char *)aa.scl + aa.n * aa.scl_stride);
@     end
            aa.n = $(AHEAD_ROWS);
          }
$(simd_scores_tail())
@     else
$(simd_scores())
@     end
        }
@   else
        aa.src = kbase + c * kvs;
        aa.pf = vbase + c * kvs;
        aa.sc = sc;
        aa.n = n;
@     if QUANT then
        aa.scl = $(K_PER_CHANNEL == 1 and "&kone" or "w->k_scale + c * w->scale_stride");
@     end
$(simd_scores())
@   end
        /* the logit softcap, after the scale and before the mask and bias:
           each head's keys to a whole vector, not its row's spare vector;
           the lanes past the keys 0 first (they become -inf below): stale
           values there (a chunk's tiny weights) made subnormal sums */
        if (w->softcap > 0) {
@     if not HL then
          for (i = n; i < npad; i++) {
@       for t = 0, T - 1 do
            sc[$(t * SCW) + i] = 0.0f;
@       end
          }
@     end
          aa.ptr = sc;
          aa.n = $(HL and "n * " .. T or "npad");
          aa.in = cap;
$(simd_softcap())
        }
@   if MASK then
@     for t = 0, T - 1 do
@       if HL then
        for (i = 0; i < n; i++) sc[i * $(T) + $(t)] += mrow$(t)[i];
@       else
        for (i = 0; i < n; i++) sc[$(t * SCW) + i] += mrow$(t)[i];
@       end
@     end
@   end
@   if MASK_MODE == 0 then
        /* ALiBi: each score gains its head's slope x (key - the token's position) */
        if (w->alibi) {
          float slope[$(T)], k0 = (float)(c - (w->tok_end0 - 1 + tp / th));
@     for t = 0, T - 1 do
          slope[$(t)] = w->alibi[(tp + $(t)) % th];
@     end
          aa.ptr = sc;
          aa.n = $(HL and "n * " .. T or "npad");
          aa.in = slope;
          aa.out = &k0;
$(simd_alibi())
        }
        /* several tokens: the tile's token sees the keys below tok_end0 + its
           index, and with a window not those in [win_lo, win_hi0 + its index) */
        if (w->q_len > 1) {
          fd_i64 lim = w->tok_end0 + tp / th - c, lo = w->win_lo - c, hi = w->win_hi0 + tp / th - c;
          for (i = lim < 0 ? 0 : lim; i < n; i++) {
@     for t = 0, T - 1 do
            sc[$(HL and ("i * " .. T .. " + " .. t) or (t * SCW .. " + i"))] = ninf;
@     end
          }
          for (i = lo < 0 ? 0 : lo; i < hi && i < n; i++) {
@     for t = 0, T - 1 do
            sc[$(HL and ("i * " .. T .. " + " .. t) or (t * SCW .. " + i"))] = ninf;
@     end
          }
        }
@   end
        /* one max, one rescale and one exp statement for all T heads (score
           rows padded with -inf to whole vectors; head-lane tiles: lane t is
           head t); a head whose keys are all masked takes base 0, so its p are 0 */
@   if HL then
        /* head-lane tiles: the records' maxima gathered by the max statement,
           whose out holds the new then the old maxima; the rescale of every
           record where one grew (gen/simd.lua grow_lanes); the sums added */
        {
          float hm[$(2 * T)], hw[$(2 * T)], hs[$(T)];
          aa.ptr = sc;
          aa.n = n * $(T);
          aa.in = st0 + $(D);
          aa.out = hm;
$(simd_max())
          aa.ptr = st0;
          aa.in = hm;
          aa.out = hw;
$(simd_grow_lanes())
          aa.ptr = sc;
          aa.in = hw;
          aa.out = hs;
$(simd_exp())
          aa.ptr = st0;
          aa.in = hs;
$(simd_sums_lanes())
        }
@   else
        {
          float hm[$(T)], hb[$(T)], hs[$(T)], hc[$(T)];
          int grew = 0;
@     for t = 0, T - 1 do
          hm[$(t)] = st$(t)[$(D)];
          for (i = n; i < npad; i++) sc[$(t * SCW) + i] = ninf;
@     end
          aa.ptr = sc;
          aa.n = npad;
          aa.in = hm;
          aa.out = hm;
$(simd_max())
@     for t = 0, T - 1 do
          hb[$(t)] = hm[$(t)] == ninf ? 0.0f : hm[$(t)];
          hc[$(t)] = 1.0f;
          if (hm[$(t)] != ninf && st$(t)[$(D)] != hm[$(t)]) {
            hc[$(t)] = fd_expf(st$(t)[$(D)] - hm[$(t)]);
            st$(t)[$(D)] = hm[$(t)];
            st$(t)[$(D + 1)] *= hc[$(t)];
            grew = 1;
          }
@     end
          if (grew) {
            aa.ptr = st0;
            aa.in = hc;
$(simd_scale_records())
          }
          aa.ptr = sc;
          aa.in = hb;
          aa.out = hs;
$(simd_exp())
@     for t = 0, T - 1 do
          st$(t)[$(D + 1)] += hs[$(t)];
@     end
@     if PRECISION == 1 then
          /* fast precision: each head's weights rounded to bf16 in place (the
             f32 sums above stay the denominators); P.V pairs keys by vdpbf16ps */
          aa.ptr = sc;
$(simd_pround())
@     end
        }
@   end
@   if QUANT and K_PER_CHANNEL == 1 then
        aa.scl_stride = $(PAGED and "4" or "w->scale_stride * 4");
@   end
@   if BEAMS == 1 then
        /* P.V piece by piece (runs of one source row), in key order as dense */
        for (po = 0; po < n; po += pm) {
          fd_i64 nk = c + po + $(CHUNK);
$(beam_piece("          "))
@     include("pv_piece.c.tpl", { IND = "          ", PIECE = true, N = "pm", VROW = "vp", SCL = "vsp",
@       PF = "nk < end ? " .. row("kbase", "nk") .. " : vp", PF_V = "nk < end ? " .. row("vbase", "nk") .. " : vp" })
        }
@   elseif PAGED then
        /* P.V page by page, in key order as dense (the same sums) */
        for (po = 0; po < n; po += pm) {
          fd_i64 slot = (c + po) & pmask, pg = (fd_i64)pages[(c + po) >> w->page_shift], nk = c + po + $(CHUNK);
          const $(KVT) *vseg = vbase + pg * w->page_stride + slot * kvs;
          pm = n - po < pmask + 1 - slot ? n - po : pmask + 1 - slot;
@     include("pv_piece.c.tpl", { IND = "          ", PIECE = true, N = "pm", VROW = "vseg",
@       SCL = "w->v_scale + pg * w->scale_page_stride + slot",
@       PF = "nk < end ? " .. row("kbase", "nk") .. " : vseg", PF_V = "nk < end ? " .. row("vbase", "nk") .. " : vseg" })
        }
@   elseif PV_KB > 0 then
        /* P.V in blocks of $(PV_KB) keys, all passes over one block before the
           next: its V rows stay in L1 between passes (gen/simd.lua pv_key_block) */
        {
          fd_i64 po, pm;
          for (po = 0; po < n; po += pm) {
            pm = n - po < $(PV_KB) ? n - po : $(PV_KB);
@     include("pv_piece.c.tpl", { IND = "            ", PIECE = true, N = "pm", VROW = "(vbase + (c + po) * kvs)",
@       SCL = "w->v_scale + (c + po) * w->scale_stride",
@       PF = next_rows("kbase", "w->next_k", "po"), PF_V = next_rows("vbase", "w->next_v", "po") })
          }
        }
@   else
@     include("pv_piece.c.tpl", { IND = "        ", PIECE = false, N = "n", VROW = "(vbase + c * kvs)",
@       SCL = "w->v_scale + c * w->scale_stride",
@       PF = next_rows("kbase", "w->next_k"), PF_V = next_rows("vbase", "w->next_v") })
@   end
      }
@ else
      /* Scores of the chunk: each K row is loaded once for the whole tile. */
      for (i = 0; i < n; i++) {
        const $(KVT) *kr = $(row("kbase", "c + i"));
        float x;
@ for t = 0, T - 1 do
        float $(acc_list(t)) ;
@ end
@ if BEAMS == 1 and K_PER_CHANNEL == 1 then
$(kch_fold("        ", "bsrc[c + i]"))
@ end
#if defined(__OPTIMIZE__)
        /* optimizing compilers: 16 independent lane sums they can vectorize */
        {
          float $(lane_decls());
          int u;
          for (d = 0; d + 16 <= $(D); d += 16)
            for (u = 0; u < 16; u++) {
              $(load(KV_DTYPE, "x", "kr[d + u]")) $(lane_terms("u", "d + u"))
            }
          for (; d < $(D); d++) {
            $(load(KV_DTYPE, "x", "kr[d]")) $(lane_terms("0", "d"))
          }
$(lane_reduce("          "))
        }
#else
@ if DB < D then
        for (d = 0; d < $(D); d += $(DB)) {
@ end
@ for j = 0, DB - 1 do
        $(load(KV_DTYPE, "x", "kr[" .. dix(j) .. "]")) $(dot_terms(j))
@ end
@ if DB < D then
        }
@ end
#endif
@ if QUANT and K_PER_CHANNEL == 0 then
        x = $(srow("w->k_scale", "c + i"));
@ end
@ for t = 0, T - 1 do
        sc[$(t * CHUNK) + i] = ($(acc_sum(t)))$(QUANT and K_PER_CHANNEL == 0 and " * x" or "");
@ end
        /* the logit softcap, after the scale and before the mask and bias */
        if (w->softcap > 0) {
@ for t = 0, T - 1 do
          sc[$(t * CHUNK) + i] = fd_softcap(sc[$(t * CHUNK) + i], w->softcap);
@ end
        }
@ if MASK then
@   for t = 0, T - 1 do
        sc[$(t * CHUNK) + i] += mrow$(t)[i];
@   end
@ end
      }
@ if MASK_MODE == 0 then
      /* ALiBi: each score gains its head's slope x (key - the token's position) */
      if (w->alibi) {
        fd_i64 qp = w->tok_end0 - 1 + tp / th;
@   for t = 0, T - 1 do
        for (i = 0; i < n; i++) sc[$(t * CHUNK) + i] += w->alibi[(tp + $(t)) % th] * (float)(c + i - qp);
@   end
      }
      /* several tokens: the tile's token sees the keys below tok_end0 + its
         index, and with a window not those in [win_lo, win_hi0 + its index) */
      if (w->q_len > 1) {
        fd_i64 lim = w->tok_end0 + tp / th - c, lo = w->win_lo - c, hi = w->win_hi0 + tp / th - c;
        for (i = lim < 0 ? 0 : lim; i < n; i++) {
@   for t = 0, T - 1 do
          sc[$(t * CHUNK) + i] = ninf;
@   end
        }
        for (i = lo < 0 ? 0 : lo; i < hi && i < n; i++) {
@   for t = 0, T - 1 do
          sc[$(t * CHUNK) + i] = ninf;
@   end
        }
      }
@ end
      /* Online softmax over the chunk, one query head at a time: weights
         e^(s - m) 2^-$(P_SHIFT) (gen/simd.lua). A head whose keys so far are all
         masked keeps m = -inf and takes base 0, so its weights are 0; a NaN
         score gives a NaN weight whatever m is, so NaN reaches l and acc. */
@ for t = 0, T - 1 do
      {
        float *s = sc + $(t * CHUNK), mx = st$(t)[$(D)], base, sum = 0.0f, x, p, et, er;
        fd_bits eb; int en;
        for (i = 0; i < n; i++) if (s[i] > mx) mx = s[i];
        base = mx == ninf ? 0.0f : mx;
        if (st$(t)[$(D)] != mx) fd_rescale(st$(t), $(D), mx);
        for (i = 0; i < n; i++) {
          x = s[i] - base;
          if (x >= $(P_MIN_X).0f) {
$(exp_body("x", "p", "            ", P_BIAS))
          } else p = x != x ? x : 0.0f;      /* below the cutoff or -inf: 0; NaN stays */
          s[i] = p;
          sum += p;
        }
        st$(t)[$(D + 1)] += sum;
      }
@ end
      /* P.V: each V row is loaded once for the whole tile. */
      for (i = 0; i < n; i++) {
        const $(KVT) *vr = $(row("vbase", "c + i"));
        float x$(p_decls());
#if defined(__OPTIMIZE__)
        for (d = 0; d < $(D); d++) {
          $(load(KV_DTYPE, "x", "vr[d]")) $(pv_terms_loop())
        }
#else
@ if DB < D then
        for (d = 0; d < $(D); d += $(DB)) {
@ end
@ for j = 0, DB - 1 do
        $(load(KV_DTYPE, "x", "vr[" .. dix(j) .. "]")) $(pv_terms(j))
@ end
@ if DB < D then
        }
@ end
#endif
      }
@ end
    }
  }
@ if not SPLIT then
  /* Epilogue: normalize (templates/store_row.c.tpl). A head with no visible
     key (l = 0: all masked) gives exactly 0 and lse -inf; a NaN l (a NaN or
     +Inf score) gives NaN. */
  {
    $(OUTT) *out = ($(OUTT) *)w->out;
    for (h = 0; h < nh; h++) {
      float *st = state + (fd_i64)h * $(REC);
      float l = st[$(D + 1)], inv;
      const fd_i64 o = (fd_i64)(h / th) * w->tok_stride + (fd_i64)(h % th) * $(D);
@   if ISA > 0 then
      fd_asm_args aa;
      aa.consts = &fd_simd_c;
@   end
@   include("store_row.c.tpl", { ROW = "st", AT = "o" })
@   if LSE then
      w->lse[(fd_i64)(h / th) * w->lse_tok_stride + h % th] = l == 0.0f ? ninf : st[$(D)] + fd_log_sum(l);
@   end
    }
  }
@ end
}
