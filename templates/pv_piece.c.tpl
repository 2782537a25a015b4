@ -- One P.V pass over a run of the chunk's keys (templates/decode.c.tpl: the
@ -- whole chunk, or a page or beam piece at po): IND the indent, N its keys,
@ -- VROW its first V row, PF and PF_V the next chunk's K and V rows to
@ -- prefetch, SCL its first v scale (int8/fp8). A piece's weights start at
@ -- its first key's (bf16 pairs of fast precision: 2 bytes a key); block-scaled
@ -- weights (PV_BSCALE) at bw, a piece's first key at the rows' start.
@ local sc_at = not PIECE and "sc" or PRECISION == 1 and not HL and "(float *)((char *)sc + 2 * po)"
@   or "sc + po" .. (HL and (" * " .. T) or "")
$(IND)aa.sc = $(sc_at);
$(IND)aa.n = $(N);
$(IND)aa.pf = $(PF);
@ if PV_NEXT_V then
$(IND)aa.pf_v = $(PF_V);   /* the head-lane P.V prefetches the next chunk's V too */
@ end
@ if QUANT then
$(IND)aa.scl = $(SCL);
@ end
@ if PV_PRESCALE then
$(IND)/* the weights times their keys' v scales, so P.V multiplies no V vector */
$(simd_pscale())
@ end
@ if PRECISION == 1 and HL then
$(IND)/* fast precision, head-lane: the weights rounded to bf16 in key pairs from the run's first key */
$(IND)aa.ptr = aa.sc;
$(simd_pround())
@ end
@ if PV_BSCALE then
$(IND)/* the weights times their keys' block scales, a row per head and block, so P.V multiplies no V vector */
$(IND)aa.src = (const char *)$(VROW);
$(IND)aa.ptr = bw;
$(simd_bscale())
$(IND)aa.sc = bw;
@   sc_at = "bw"
@ end
@ for _, blk in ipairs(PV_BLOCKS) do
@   if blk[4] < T then -- a pass over some of the tile's heads: their weights and records
$(IND)aa.sc = $(sc_at) + $(pv_row(blk[3]));
@   end
$(IND)aa.src = (const char *)$(VROW) + $(kv_off(blk[1] * W));
$(IND)aa.ptr = st0 + $(blk[3] * REC + blk[1] * W);
$(simd_pv(blk))
@ end
