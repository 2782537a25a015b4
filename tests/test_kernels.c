/* Generated kernels, compiled by tcc and called directly, against the
   double-precision reference: mask modes, layouts, head_dims, groups, dtypes,
   chunk sizes, edge lengths, split counts and merge order. */
#include "compare.h"
#include "kexec.h"
#include "tcheck.h"
#include "cpu.h"
#include "key.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static int isa;                /* the isa digit under test */

/* Whether the isa has a variant for head_dim D and tile T: its record's
   vector divides D and it holds T heads (gen/facts.lua through fd_keydefs.h). */
static int has_variant(int D, int T) {
  return D % fd_isa_table[isa].width == 0 && T <= fd_isa_table[isa].max_tile;
}

#define DT fd_dtype_names
#define MODE fd_mask_mode_names
#define LAYOUT fd_layout_names

/* Run problem p (named in failures) at chunk, tile and splits against the
   reference, then free it. */
static void run_problem(kproblem *p, const char *name, int chunk, int tile, int splits) {
  char err[4096];
  size_t n = (size_t)p->ref.B * p->ref.Hq * p->ref.D, nl = (size_t)p->ref.B * p->ref.Hq;
  double *rout = malloc(n * sizeof(double)), *rlse = malloc(nl * sizeof(double));
  float *out = malloc(n * 4), *lse = malloc(nl * 4);
  ref_attention(&p->ref, rout, rlse);
  kconfig cfg = { chunk, tile, splits, splits > 2, 1, isa };
  if (t_check(kx_run(p, &cfg, out, lse, err, sizeof err) == 0, "%s: run: %s", name, err))
    t_compare(p, out, lse, rout, rlse, 1, name);
  free(rout); free(rlse); free(out); free(lse);
  kp_free(p);
}

/* The name of one configuration, for failures. */
static void case_name(char *name, size_t size, int B, int Hq, int Hkv, int D, int64_t S, int qd, int kd, int od,
                      int mode, int layout, int chunk, int tile, int splits) {
  snprintf(name, size, "isa%d B%d Hq%d Hkv%d D%d S%lld q%s kv%s out%s %s %s chunk%d tile%d splits%d",
           isa, B, Hq, Hkv, D, (long long)S, DT[qd], DT[kd], DT[od], MODE[mode], LAYOUT[layout], chunk, tile, splits);
}

/* Run one configuration against the reference. */
static void run_case(int B, int Hq, int Hkv, int D, int64_t S, int qd, int kd, int od, int mode,
                     int layout, int chunk, int tile, int splits, uint64_t seed) {
  char name[256];
  if (!has_variant(D, tile)) return;
  case_name(name, sizeof name, B, Hq, Hkv, D, S, qd, kd, od, mode, layout, chunk, tile, splits);
  kproblem p;
  kp_init(&p, B, Hq, Hkv, D, S, qd, kd, od, mode, layout, seed);
  run_problem(&p, name, chunk, tile, splits);
}

/* Mask modes x layouts x head_dims x groups, dtypes rotated, chunks that do and do not divide. */
static void sweep_shapes(void) {
  static const int dims[] = { 64, 128, 256, 80, 96 }, groups[] = { 1, 4, 7, 8, 16 };
  int idx = 0;
  for (int mode = 0; mode < 3; mode++)
    for (int layout = 0; layout < 2; layout++)
      for (int di = 0; di < 5; di++)
        for (int gi = 0; gi < 5; gi++, idx++) {
          int G = groups[gi], combo = idx % 27;
          int tile = idx % 2 ? G : (G % 4 == 0 ? 4 : 1);
          int64_t S = idx % 3 == 0 ? 256 : 300;          /* chunk 64 divides 256, not 300 */
          run_case(2, 2 * G, 2, dims[di], S, combo / 9, combo / 3 % 3, combo % 3, mode, layout,
                   idx % 4 ? 64 : 32, tile, idx % 3 ? 1 : 3, 1000 + idx);
        }
}

/* Head dims past 256 in tiles 1-3: AVX-512's P.V passes then hold up to 27
   accumulators beside the weights (registers 24-27 too), and passes start at
   odd d-blocks (bf16 pieces split across passes); every dtype of q, K/V and
   out across the cases, split and unsplit. */
static void sweep_wide(void) {
  static const int dims[] = { 512, 432 };
  for (int c = 0; c < 12; c++) {
    int tile = 1 + c % 3;
    run_case(2, 2 * tile, 2, dims[c / 3 % 2], c % 2 ? 300 : 256, c % 3, (c + c / 3) % 3, (c + 2) % 3, c % 3, c / 6,
             64, tile, c % 4 ? 1 : 3, 6000 + c);
  }
}

/* bf16 q and K in every row-major tile of the direct scores kernel (2-12
   heads: vdpbf16ps where the isa has it, 4 or 8 keys per row group as the
   tile allows), head_dims multiples of 32, both layouts, every mask mode,
   chunks that do and do not divide the keys, split and unsplit. */
static void sweep_bf16_tiles(void) {
  static const int dims[] = { 64, 128, 96, 256 };
  for (int tile = 2; tile <= 12; tile++)
    for (int c = 0; c < 2; c++) {
      int i = 2 * tile + c;
      run_case(2, 2 * tile, 2, dims[i % 4], c ? 300 : 256, 2, 2, i % 3, i % 3, c, c ? 64 : 32, tile, c ? 3 : 1,
               7000 + (uint64_t)i);
    }
}

/* Every q x kv x out dtype combination on one GQA shape. */
static void sweep_dtypes(void) {
  for (int c = 0; c < 27; c++)
    run_case(2, 8, 2, 128, 200, c / 9, c / 3 % 3, c % 3, c % 3, c % 2, 64, 4, 1 + c % 2, 2000 + c);
}

/* Every KV dtype with per-row scales (int8, fp8 e4m3, fp8 e5m2), both layouts, split and unsplit. */
static void sweep_quantized(void) {
  for (int k = 0; k < t_quant_count(); k++)
    for (int c = 0; c < 8; c++)
      run_case(2, 8, 2, c % 2 ? 96 : 128, 150, c % 3, t_quant_dtype(k), (c + 1) % 3, c % 3, c / 2 % 2, 64,
               c % 4 ? 4 : 2, 1 + 2 * (c % 2), 2500 + 8 * k + c);
}

/* Every one of the 256 codes of each fp8 KV dtype (the quantized dtypes that
   have NaN codes: e4m3, e5m2) decoded by the kernels, against the
   reference's decoding (t_load), bit for bit: one key per batch row, scales 1
   and the softmax scale 1, so each head's out is its V row exactly (p = 1)
   and its lse its score exactly. V holds code d in column d (subnormals,
   the largest, zero and -0, infinities and NaN: out NaN or that infinity in
   that column only); K holds the finite codes the same way (the others as
   0), and head h of batch row b reads column 16 b + h through a one-hot q,
   so lse[b, h] is K's decoded code there. */
static void fp8_codes(void) {
  enum { NB = 16, NH = 16, D = 256 };
  for (int kd = 0; kd < FD_DTYPE_COUNT; kd++) {
    if (!fd_dtype_quant[kd] || !fd_dtype_nonfinite[kd].nonfinite || t_dtype_size(kd) != 1) continue;
    kproblem p;
    kp_init(&p, NB, NH, 1, D, 1, 0, kd, 0, 2, 0, 4400 + (uint64_t)kd);
    p.ref.scale = 1.0;
    uint8_t *k = p.k, *v = p.v;
    for (int b = 0; b < NB; b++) {
      p.k_scale[b] = p.v_scale[b] = 1.0f;
      for (int d = 0; d < D; d++) {
        v[b * D + d] = (uint8_t)d;
        k[b * D + d] = isfinite(t_load(kd, v, (size_t)d)) ? (uint8_t)d : 0;
        for (int h = 0; h < NH; h++) p.qf[((size_t)b * NH + h) * D + d] = d == NH * b + h ? 1.0f : 0.0f;
      }
    }
    memcpy(p.q, p.qf, sizeof(float) * NB * NH * D);
    float *out = malloc(sizeof(float) * NB * NH * D), lse[NB * NH];
    char err[4096];
    if (t_check(kx_run(&p, &(kconfig){ 16, 4, 1, 0, 1, isa }, out, lse, err, sizeof err) == 0,
                "isa%d %s codes: run: %s", isa, DT[kd], err)) {
      int bad = -1, lbad = -1;
      for (int i = 0; i < NB * NH * D && bad < 0; i++) {
        float want = t_load(kd, v, (size_t)(i % D));
        if (isnan(want) ? !isnan(out[i]) : out[i] != want) bad = i;
      }
      for (int i = 0; i < NB * NH && lbad < 0; i++)
        if (lse[i] != t_load(kd, k, (size_t)i)) lbad = i;
      t_check(bad < 0, "isa%d %s V code 0x%02x (head %d): out %.9g, the reference decodes %.9g", isa, DT[kd],
              bad < 0 ? 0 : bad % D, bad < 0 ? 0 : bad / D, bad < 0 ? 0 : out[bad],
              bad < 0 ? 0 : t_load(kd, v, (size_t)(bad % D)));
      t_check(lbad < 0, "isa%d %s K code 0x%02x: lse %.9g, the reference decodes %.9g", isa, DT[kd],
              lbad < 0 ? 0 : k[lbad], lbad < 0 ? 0 : lse[lbad], lbad < 0 ? 0 : t_load(kd, k, (size_t)lbad));
    }
    free(out);
    kp_free(&p);
  }
}

/* Every block KV dtype (ggml q8_0, q4_0): mask modes, both layouts, head_dims
   multiples of 32 (AVX-512 vectors start mid-block at 16; 96: an odd count
   of them), group tiles 1 and 2..8 (staged kernel) and 16 (AVX-512's
   head-lane kernel), chunks that do and do not divide, split and unsplit. */
static void sweep_blocks(void) {
  static const int dims[] = { 32, 64, 96, 128, 256 }, tiles[] = { 1, 2, 4, 8, 16 };
  for (int kd = 0; kd < FD_DTYPE_COUNT; kd++) {
    if (fd_dtype_block[kd] == 1) continue;
    for (int c = 0; c < 20; c++)
      run_case(2, 32, 2, dims[c % 5], c % 3 ? 150 : 64, c % 3, kd, (c + 1) % 3, c % 3, c / 2 % 2, c % 4 ? 64 : 32,
               tiles[(c + c / 5) % 5], c % 2 ? 3 : 1, 2700 + 20 * (uint64_t)kd + (uint64_t)c);
  }
}

/* The f16 scales of the block test: the smallest subnormal, the smallest
   normal, 0.1, 1, 255.875 and the largest finite 65504, and negative ones. */
static const uint16_t BLOCK_SCALES[] = { 0x0001, 0x0400, 0x2e66, 0x3c00, 0x5bff, 0x7bff, 0xbc00, 0x8001 };

/* Fill one row of D / 32 blocks of block dtype kd for batch row b: block i's
   scale BLOCK_SCALES[(b + i) % 8] and codes that cover every code across
   the row (q8_0: 32 i + j as a byte, -128 and 127 included; q4_0: nibbles
   (j + i + b) % 16, 0 and 15 included, in both halves). */
static void block_row(int kd, uint8_t *row, int D, int b) {
  size_t bb = t_kv_bytes(kd, 32);
  for (int i = 0; i < D / 32; i++) {
    uint8_t *blk = row + i * bb;
    uint16_t h = BLOCK_SCALES[(b + i) % 8];
    blk[0] = (uint8_t)(h & 255); blk[1] = (uint8_t)(h >> 8);
    for (int j = 0; j < 32; j++) {
      if (kd == FD_Q8_0) { blk[2 + j] = (uint8_t)(32 * i + j); continue; }
      int nib = (j + i + b) % 16;
      if (j < 16) blk[2 + j] = (uint8_t)nib;
      else blk[2 + j - 16] |= (uint8_t)(nib << 4);
    }
  }
}

/* Every code of each block dtype with extreme f16 scales, decoded by the
   kernels bit for bit against the reference's decoding (t_load): as
   fp8_codes, one key per batch row and the softmax scale 1, so each head's
   out is its V row exactly and, with a one-hot q on column 16 b + h, its
   lse is K's decoded element there (every product of an f16 scale and a
   code is exact in f32). */
static void block_codes(void) {
  enum { NB = 16, NH = 16, D = 256 };
  for (int kd = 0; kd < FD_DTYPE_COUNT; kd++) {
    if (fd_dtype_block[kd] == 1) continue;
    kproblem p;
    kp_init(&p, NB, NH, 1, D, 1, 0, kd, 0, 2, 0, 4500 + (uint64_t)kd);
    p.ref.scale = 1.0;
    size_t rb = t_kv_bytes(kd, D);
    for (int b = 0; b < NB; b++) {
      block_row(kd, (uint8_t *)p.k + b * rb, D, b);
      block_row(kd, (uint8_t *)p.v + b * rb, D, b + 3);
      for (int h = 0; h < NH; h++)
        for (int d = 0; d < D; d++) p.qf[((size_t)b * NH + h) * D + d] = d == NH * b + h ? 1.0f : 0.0f;
    }
    memcpy(p.q, p.qf, sizeof(float) * NB * NH * D);
    kp_decode_kv(&p);
    float *out = malloc(sizeof(float) * NB * NH * D), lse[NB * NH];
    char err[4096];
    for (int tile = 1; tile <= 16; tile *= 4) {
      if (!has_variant(D, tile)) continue;
      if (!t_check(kx_run(&p, &(kconfig){ 16, tile, 1, 0, 1, isa }, out, lse, err, sizeof err) == 0,
                   "isa%d %s codes tile %d: run: %s", isa, DT[kd], tile, err)) continue;
      int bad = -1, lbad = -1;
      for (int i = 0; i < NB * NH * D && bad < 0; i++)
        if (out[i] != p.vf[(size_t)i / (NH * D) * D + (size_t)i % D]) bad = i;
      for (int i = 0; i < NB * NH && lbad < 0; i++)
        if (lse[i] != p.kf[(size_t)i / NH * D + (size_t)i]) lbad = i;
      t_check(bad < 0, "isa%d %s tile %d: V[b=%d][%d]: out %.9g, the reference decodes %.9g", isa, DT[kd], tile,
              bad < 0 ? 0 : bad / (NH * D), bad < 0 ? 0 : bad % D, bad < 0 ? 0 : out[bad],
              bad < 0 ? 0 : p.vf[(size_t)bad / (NH * D) * D + (size_t)bad % D]);
      t_check(lbad < 0, "isa%d %s tile %d: K[b=%d][%d]: lse %.9g, the reference decodes %.9g", isa, DT[kd], tile,
              lbad < 0 ? 0 : lbad / NH, lbad < 0 ? 0 : lbad, lbad < 0 ? 0 : lse[lbad],
              lbad < 0 ? 0 : p.kf[(size_t)lbad / NH * D + (size_t)lbad]);
    }
    free(out);
    kp_free(&p);
  }
}

/* Short lengths: one key, cur_pos 0, lengths below and at a chunk. */
static void edge_lengths(void) {
  run_case(1, 4, 1, 64, 1, 0, 0, 0, 0, 0, 64, 4, 1, 3001);       /* kv_len 1 */
  run_case(1, 4, 1, 64, 1, 0, 1, 0, 2, 1, 64, 2, 1, 3002);
  run_case(1, 4, 1, 64, 1, 0, 2, 0, 1, 0, 64, 1, 2, 3003);
  run_case(1, 4, 1, 128, 64, 0, 0, 0, 2, 0, 64, 4, 1, 3004);     /* exactly one chunk */
  run_case(1, 4, 1, 128, 65, 0, 0, 0, 2, 0, 64, 4, 1, 3005);     /* one chunk and one key */
  run_case(1, 4, 1, 128, 63, 0, 0, 0, 2, 1, 64, 4, 1, 3006);
  run_case(3, 4, 1, 7, 33, 0, 0, 0, 0, 0, 16, 4, 1, 3007);       /* tiny odd head_dim */
  /* cur_pos 0 in every batch row */
  kproblem p;
  kp_init(&p, 3, 8, 2, 128, 50, 0, 1, 0, 0, 0, 3008);
  for (int b = 0; b < 3; b++) p.cur_pos[b] = 0;
  double rout[3 * 8 * 128], rlse[24];
  float out[3 * 8 * 128], lse[24];
  char err[4096];
  ref_attention(&p.ref, rout, rlse);
  kconfig cfg = { 64, 4, 1, 0, 1, isa };
  if (t_check(kx_run(&p, &cfg, out, lse, err, sizeof err) == 0, "cur_pos 0: run: %s", err))
    t_compare(&p, out, lse, rout, rlse, 1, "cur_pos 0 everywhere");
  kp_free(&p);
}

/* Run p with cfg and compare with the reference; out/lse returned for further checks. */
static void run_and_compare(kproblem *p, kconfig cfg, float *out, float *lse, const char *name) {
  size_t n = (size_t)p->ref.B * p->ref.Hq * p->ref.D;
  double *rout = malloc(n * sizeof(double)), *rlse = malloc((size_t)p->ref.B * p->ref.Hq * sizeof(double));
  char err[4096];
  ref_attention(&p->ref, rout, rlse);
  if (t_check(kx_run(p, &cfg, out, lse, err, sizeof err) == 0, "%s: run: %s", name, err))
    t_compare(p, out, lse, rout, rlse, cfg.lse, name);
  free(rout); free(rlse);
}

/* K and V ending where an inaccessible page begins, the last chunk partial
   (203 keys), 16 heads a tile: no kernel reads a row past the last (the
   head-lane bf16 scores read whole groups of 16 rows in place and stage only
   the short last group). */
static void guarded_tail(void) {
  static const int chunks[] = { 64, 256 }, kvd[] = { FD_BF16, FD_F16 };
  const int D = 64, S = 203, G = 16;
  if (!has_variant(D, G)) return;
  for (int i = 0; i < 4; i++) {
    char name[96];
    snprintf(name, sizeof name, "isa%d guarded K/V tail, kv %s, chunk %d", isa, DT[kvd[i / 2]], chunks[i % 2]);
    kproblem p;
    kp_init(&p, 1, G, 1, D, S, FD_BF16, kvd[i / 2], FD_F32, FD_CAUSAL, FD_BHSD, 9100 + (uint64_t)i);
    size_t bytes = (size_t)S * D * 2, klen, vlen;
    void *kmap, *vmap, *k = p.k, *v = p.v;
    p.k = t_guarded(k, bytes, &kmap, &klen);
    p.v = t_guarded(v, bytes, &vmap, &vlen);
    float out[16 * 64], lse[16];
    if (t_check(p.k && p.v, "%s: guarded copies", name))
      run_and_compare(&p, (kconfig){ chunks[i % 2], G, 1, 0, 1, isa }, out, lse, name);
    if (p.k) munmap(kmap, klen);
    if (p.v) munmap(vmap, vlen);
    p.k = k, p.v = v;
    kp_free(&p);
  }
}

/* Split counts 1..100 and more splits than keys, in order and shuffled, match the
   unsplit kernel within f32 rounding (and the reference). */
static void merge_splits(void) {
  static const int counts[] = { 1, 2, 3, 7, 32, 100, 51, 200 };
  kproblem p;
  kp_init(&p, 2, 8, 2, 64, 50, 0, 0, 0, 2, 0, 4001);
  size_t n = 2 * 8 * 64;
  float base[2 * 8 * 64], blse[16], out[2 * 8 * 64], lse[16];
  run_and_compare(&p, (kconfig){ 16, 4, 1, 0, 1, isa }, base, blse, "merge: unsplit");
  for (int c = 0; c < 8; c++)
    for (int sh = 0; sh < 2; sh++) {
      char name[96];
      snprintf(name, sizeof name, "isa%d merge: %d splits of 50 keys%s", isa, counts[c], sh ? ", shuffled" : "");
      run_and_compare(&p, (kconfig){ 16, 4, counts[c], sh, 1, isa }, out, lse, name);
      double d = 0, dl = 0;
      for (size_t i = 0; i < n; i++) d = fmax(d, fabs(out[i] - base[i]));
      for (int i = 0; i < 16; i++) dl = fmax(dl, fabs(lse[i] - blse[i]));
      t_check(d <= 2e-6 && dl <= 2e-6, "%s: differs from unsplit by %.3g (lse %.3g)", name, d, dl);
    }
  kp_free(&p);
}

/* A row whose keys are all masked gives out 0 and lse -inf (no NaN), split or not;
   a row masked in all but one split still gets the right answer. */
static void masked_rows(void) {
  for (int splits = 1; splits <= 4; splits += 3) {
    kproblem p;
    kp_init(&p, 2, 4, 1, 64, 40, 0, 2, 0, 1, 0, 4100 + splits);
    for (int i = 0; i < 40; i++) {
      p.mask[(0 * 4 + 1) * 40 + i] = -INFINITY;                     /* (b0, h1): all masked */
      if (i < 30) p.mask[(1 * 4 + 2) * 40 + i] = -INFINITY;         /* (b1, h2): last split only */
    }
    float out[2 * 4 * 64], lse[8];
    char name[64];
    snprintf(name, sizeof name, "isa%d all-masked row, %d split(s)", isa, splits);
    run_and_compare(&p, (kconfig){ 16, 2, splits, 1, 1, isa }, out, lse, name);
    int zero = 1;
    for (int d = 0; d < 64; d++) zero &= out[1 * 64 + d] == 0.0f;
    t_check(zero && isinf(lse[1]) && lse[1] < 0, "%s: out exactly 0 and lse -inf", name);
    kp_free(&p);
  }
}

/* A score of 200 in one split does not overflow the merge (e^200 > FLT_MAX). */
static void huge_logit(void) {
  for (int where = 0; where < 3; where++) {
    kproblem p;
    kp_init(&p, 1, 4, 1, 64, 60, 0, 0, 0, 2, 0, 4200 + where);
    int row = where * 20 + 5;                       /* in split 0, 1 or 2 of 3 */
    double qq = 0;
    for (int d = 0; d < 64; d++) qq += (double)p.qf[d] * p.qf[d];
    for (int d = 0; d < 64; d++) p.kf[row * 64 + d] = (float)(p.qf[d] * 200.0 / (p.ref.scale * qq));
    kp_sync(&p);
    float out[4 * 64], lse[4];
    char name[64];
    snprintf(name, sizeof name, "isa%d score 200 in split %d of 3", isa, where);
    run_and_compare(&p, (kconfig){ 16, 4, 3, 0, 1, isa }, out, lse, name);
    t_check(fabs(lse[0] - 200) < 1e-3, "%s: lse %g is about 200", name, lse[0]);
    kp_free(&p);
  }
}

/* A score of 200 for one head at each key of a running-max chain and of the
   remainder (head-lane tiles: the max of a chunk's keys in 4 chains, keys
   mod 4, then one at a time): a missed maximum overflows e^(s - m). */
static void huge_logit_lanes(void) {
  static const int rows[] = { 0, 1, 2, 3, 61, 64, 65, 66, 67, 69 };
  int tile = fd_isa_table[isa].head_lane_tile;
  if (tile == 0) return;                          /* no head-lane tiles on this isa */
  for (size_t w = 0; w < sizeof rows / sizeof *rows; w++) {
    kproblem p;
    int row = rows[w], head = (int)w % tile;
    kp_init(&p, 1, tile, 1, 64, 70, 0, 0, 0, 2, 0, 4250 + w);
    const float *q = p.qf + head * 64;
    double qq = 0;
    for (int d = 0; d < 64; d++) qq += (double)q[d] * q[d];
    for (int d = 0; d < 64; d++) p.kf[row * 64 + d] = (float)(q[d] * 200.0 / (p.ref.scale * qq));
    kp_sync(&p);
    float out[32 * 64], lse[32];
    char name[64];
    snprintf(name, sizeof name, "isa%d tile %d: score 200 at key %d, head %d", isa, tile, row, head);
    run_and_compare(&p, (kconfig){ 64, tile, 1, 0, 1, isa }, out, lse, name);
    t_check(fabs(lse[head] - 200) < 1e-3, "%s: lse %g is about 200", name, lse[head]);
    kp_free(&p);
  }
}

/* The softmax's exp, tight: in each (row, head) one key scores c, c swept
   over [-40, 40], the key 16 before it (a chunk of 16 apart: a positive c
   grows the max, so the first chunk is rescaled by e^(0 - c)) scores 0, the
   15 between -1000 (weight 0); V is 1 on the c key's first element, 0
   elsewhere. So out[0] = e^c / (1 + e^c) and lse = log(1 + e^c), and their
   errors are the exp's (weights, rescale factors; with 2 splits the merge's
   factors) against the row's largest weight 1: within 1.5e-7 (the exp's own
   error is 8.1e-8 at most, gen/simd.lua EXP2_COEFS). */
static void exp_accuracy(void) {
  enum { B = 8, H = 16, D = 64, S = 17, n = B * H };
  double worst_out = 0, worst_lse = 0;
  int tiles[] = { 1, fd_isa_table[isa].head_lane_tile ? fd_isa_table[isa].head_lane_tile : 4 };
  for (int c = 0; c < 4; c++) {
    int tile = tiles[c % 2], splits = 1 + c / 2;
    if (!has_variant(D, tile)) continue;
    kproblem p;
    kp_init(&p, B, H, 1, D, S, 0, 0, 0, 2, 0, 4280 + (uint64_t)c);
    memset(p.kf, 0, sizeof(float) * B * S * D);
    memset(p.vf, 0, sizeof(float) * B * S * D);
    for (int b = 0; b < B; b++) {
      for (int i = 1; i < 16; i++) p.kf[(b * S + i) * D + 1] = (float)(-1000 / p.ref.scale);
      p.kf[(b * S + 16) * D] = (float)(1 / p.ref.scale);
      p.vf[(b * S + 16) * D] = 1;
      for (int h = 0; h < H; h++) {
        float *q = p.qf + (b * H + h) * D;
        memset(q, 0, sizeof(float) * D);
        q[0] = (float)(-40 + 80.0 * (b * H + h) / (n - 1));
        q[1] = 1;
      }
    }
    kp_sync(&p);
    float out[n * D], lse[n];
    double rout[n * D], rlse[n], eo = 0, el = 0;
    char name[96], err[4096];
    snprintf(name, sizeof name, "isa%d exp accuracy, tile %d, %d split(s)", isa, tile, splits);
    ref_attention(&p.ref, rout, rlse);
    kconfig cfg = { 16, tile, splits, 0, 1, isa };
    if (t_check(kx_run(&p, &cfg, out, lse, err, sizeof err) == 0, "%s: run: %s", name, err)) {
      for (int i = 0; i < n; i++) {
        eo = fmax(eo, fabs(out[i * D] - rout[i * D]));
        el = fmax(el, fabs(lse[i] - rlse[i]) - 1.2e-7 * fabs(rlse[i]));   /* less lse's own f32 rounding */
      }
      t_check(eo <= 1.5e-7 && el <= 1.5e-7, "%s: out error %.3g, lse error %.3g (bound 1.5e-7)", name, eo, el);
      worst_out = fmax(worst_out, eo), worst_lse = fmax(worst_lse, el);
    }
    kp_free(&p);
  }
  printf("note: isa %d: the exp's out error %.3g, lse error %.3g (bound 1.5e-7)\n", isa, worst_out, worst_lse);
}

/* Output rounding, bit for bit: with one key the output row is exactly its V
   row (p = 1, l = 1), so an f16 or bf16 output must equal the test's own
   round-to-nearest-even encoding of each V value: ties, f16 subnormals and
   overflow, bf16 overflow, infinities and NaN (a -0 row comes out +0: the sum starts at +0). */
static void output_rounding(void) {
  static const float hard[] = {
    1.00390625f, 1.01171875f, 1.0039063f, -1.01171875f,           /* bf16 ties to even, and just above */
    1.00048828125f, 1.00146484375f, 65519.0f, 65520.0f, -70000.0f, /* f16 ties, largest finite, overflow */
    1e-7f, 2.98023224e-8f, 8.9406967e-8f, -6.0e-5f,                /* f16 subnormals, half-ulp ties */
    3.4e38f, -1.5e-5f, INFINITY, -INFINITY, NAN,
  };
  const int D = 32, nh = sizeof hard / sizeof *hard;
  for (int od = 1; od <= 2; od++) {
    kproblem p;
    kp_init(&p, 1, 1, 1, D, 1, 0, 0, od, 2, 0, 4300 + od);
    for (int d = 0; d < nh; d++) p.vf[d] = hard[d];
    uint32_t nan_ones = 0x7fffffffu;                               /* bf16 rounding would carry into the sign */
    memcpy(&p.vf[nh], &nan_ones, 4);
    kp_sync(&p);
    float out[32], lse[1];
    char err[4096];
    if (!t_check(kx_run(&p, &(kconfig){ 16, 1, 1, 0, 1, isa }, out, lse, err, sizeof err) == 0,
                 "isa%d out %s rounding: run: %s", isa, DT[od], err)) { kp_free(&p); continue; }
    int bad = -1;
    for (int d = 0; d < D && bad < 0; d++) {
      float v = p.vf[d], want = od == 1 ? t_f16_to_f32(t_f32_to_f16(v)) : t_bf16_to_f32(t_f32_to_bf16(v));
      if (isnan(want) ? !isnan(out[d]) : memcmp(&want, &out[d], 4) != 0) bad = d;
    }
    t_check(bad < 0, "isa%d out %s rounding of V[%d] = %.9g: got %.9g", isa, DT[od], bad, bad < 0 ? 0 : p.vf[bad],
            bad < 0 ? 0 : out[bad]);
    kp_free(&p);
  }
}

/* The test-data encoders against known bit patterns (the reference only ever sees round trips). */
static void conversions(void) {
  static const struct { float x; uint16_t f16, bf16; } h[] = {
    { 1.0f, 0x3c00, 0x3f80 }, { -2.0f, 0xc000, 0xc000 }, { 65504.0f, 0x7bff, 0x4780 },
    { 0.1f, 0x2e66, 0x3dcd }, { 5.9604645e-8f, 0x0001, 0x3380 }, { 1e6f, 0x7c00, 0x4974 },
  };
  for (size_t i = 0; i < sizeof h / sizeof *h; i++)
    t_check(t_f32_to_f16(h[i].x) == h[i].f16 && t_f32_to_bf16(h[i].x) == h[i].bf16,
            "encode %g: f16 %04x (want %04x), bf16 %04x (want %04x)", h[i].x, t_f32_to_f16(h[i].x), h[i].f16,
            t_f32_to_bf16(h[i].x), h[i].bf16);
  static const struct { float x; uint8_t e4m3; } e[] = {
    { 1.0f, 0x38 }, { 448.0f, 0x7e }, { 1000.0f, 0x7e }, { 0.001953125f, 0x01 }, { -1.5f, 0xbc }, { 0.0f, 0x00 },
  };
  for (size_t i = 0; i < sizeof e / sizeof *e; i++)
    t_check(t_f32_to_e4m3(e[i].x) == e[i].e4m3 && (e[i].x > 448 || t_e4m3_to_f32(e[i].e4m3) == e[i].x),
            "e4m3 %g: %02x (want %02x)", e[i].x, t_f32_to_e4m3(e[i].x), e[i].e4m3);
  /* e5m2: nearest even, the largest 57344, infinity from the rounding boundary 61440 on, subnormals to 2^-16 */
  static const struct { float x; uint8_t e5m2; } f[] = {
    { 1.0f, 0x3c }, { 1.25f, 0x3d }, { 1.125f, 0x3c }, { 1.375f, 0x3e }, { -1.5f, 0xbe }, { 0.0f, 0x00 },
    { -0.0f, 0x80 }, { 57344.0f, 0x7b }, { 61439.0f, 0x7b }, { 61440.0f, 0x7c }, { -1e6f, 0xfc },
    { INFINITY, 0x7c }, { 0x1p-14f, 0x04 }, { 0x1p-16f, 0x01 }, { 0x1p-17f, 0x00 }, { 0x3p-17f, 0x02 },
    { 0x1.8p-15f, 0x03 }, { -0x1p-16f, 0x81 }, { NAN, 0x7e },
  };
  for (size_t i = 0; i < sizeof f / sizeof *f; i++)
    t_check(t_f32_to_e5m2(f[i].x) == f[i].e5m2, "e5m2 %g: %02x (want %02x)", f[i].x, t_f32_to_e5m2(f[i].x), f[i].e5m2);
  /* every e5m2 code is the f16 whose upper byte it is, and round-trips (NaN codes to the quiet NaN) */
  int bad = -1;
  for (int c = 0; c < 256 && bad < 0; c++) {
    float x = t_e5m2_to_f32((uint8_t)c), h = t_f16_to_f32((uint16_t)(c << 8));
    int back = t_f32_to_e5m2(x), nan = (c & 0x7f) > 0x7c;
    if (nan ? !isnan(x) || !isnan(h) || back != (c & 0x80 ? 0xfe : 0x7e) : memcmp(&x, &h, 4) || back != c) bad = c;
  }
  t_check(bad < 0, "e5m2 code 0x%02x: %g, as f16 %g, back to 0x%02x", bad < 0 ? 0 : bad,
          bad < 0 ? 0 : t_e5m2_to_f32((uint8_t)bad), bad < 0 ? 0 : t_f16_to_f32((uint16_t)(bad << 8)),
          bad < 0 ? 0 : t_f32_to_e5m2(t_e5m2_to_f32((uint8_t)bad)));
}

/* The tuner's longest chunks (gen/space.lua: up to FD_MAX_CHUNK 4096) with
   the largest group tile 16 (8 where the isa holds no 16: sc[] is tile *
   chunk floats on the stack), over lengths of one partial and several chunks. */
static void long_chunks(void) {
  static const int chunks[] = { 1024, 2048, 4096 };
  for (int c = 0; c < 3; c++)
    for (int tile = 16; tile >= 8; tile -= 8) {
      run_case(1, 16, 1, 128, 5000, 2, 2, 2, 0, 0, chunks[c], tile, 1, 5000 + c * 10 + tile);
      run_case(2, 32, 2, 64, 9000, 0, 1, 0, 2, 1, chunks[c], tile, 3, 5100 + c * 10 + tile);
    }
}

/* Chunks past 128 keys, whose AVX2 P.V runs in blocks of 128 keys (gen/simd.lua
   pv_key_block): lengths ending in a partial block and chunks of 200 (one
   whole block and one partial), bf16, f16, int8 (each block's v scales from
   its first key) and q8_0 V, tiles 1, 4 and 8, both layouts, split and unsplit. */
static void pv_key_blocks(void) {
  static const int kvd[] = { FD_BF16, FD_F16, FD_I8, FD_Q8_0 }, tiles[] = { 1, 4, 8 };
  for (int c = 0; c < 12; c++)
    run_case(2, 16, 2, c % 3 == 2 ? 64 : 128, c % 2 ? 777 : 1000, c % 3, kvd[c % 4], (c + 1) % 3, c % 3, c / 2 % 2,
             c % 3 ? 512 : 200, tiles[c % 3], c % 4 < 2 ? 1 : 3, 9100 + (uint64_t)c);
  /* int8 rows whose magnitudes (so whose v scales) differ 1 to 8 times from
     key to key: a block that read another key's scale would show */
  for (int c = 0; c < 6; c++) {
    char name[256];
    int D = c % 2 ? 64 : 128, tile = tiles[c % 3], chunk = c < 3 ? 512 : 200;
    int64_t S = c % 2 ? 777 : 1000;
    if (!has_variant(D, tile)) continue;
    case_name(name, sizeof name, 2, 16, 2, D, S, FD_BF16, FD_I8, FD_F32, c % 3, c % 2, chunk, tile, 1 + c % 2 * 2);
    strcat(name, " (row scales 1-8x)");
    kproblem p;
    kp_init(&p, 2, 16, 2, D, S, FD_BF16, FD_I8, FD_F32, c % 3, c % 2, 9200 + (uint64_t)c);
    for (size_t row = 0; row < (size_t)2 * 2 * (size_t)S; row++)
      for (int d = 0; d < D; d++) {
        p.kf[row * (size_t)D + (size_t)d] *= (float)(1 + (row * 5 + 3) % 8);
        p.vf[row * (size_t)D + (size_t)d] *= (float)(1 + (row * 3 + 1) % 8);
      }
    kp_sync(&p);
    run_problem(&p, name, chunk, tile, 1 + c % 2 * 2);
  }
}

int main(void) {
  conversions();
  for (isa = 0; isa < FD_ISA_COUNT; isa++) {
    if (!fd_cpu_has_isa(isa)) { printf("note: this CPU lacks isa %d: its kernels are not run here\n", isa); continue; }
    sweep_shapes();
    sweep_dtypes();
  sweep_bf16_tiles();
    sweep_wide();
    sweep_quantized();
    fp8_codes();
    sweep_blocks();
    pv_key_blocks();
    block_codes();
    edge_lengths();
    guarded_tail();
    merge_splits();
    masked_rows();
    huge_logit();
    huge_logit_lanes();
    exp_accuracy();
    output_rounding();
    long_chunks();
  }
  printf("note: head_dim 7 has no SIMD variant (not a multiple of the vector); portable C covers it\n");
  kx_cleanup();
  return t_done();
}
