-- The generator and `fdgen`: variants of a shape set, index, rewrite-only-on-change,
-- descriptor and banner in the source, refusals with the field named.
package.path = "tests/?.lua;gen/?.lua;" .. package.path
local T = require("check")
local generate = require("generate")
local space = require("space")
local files = require("files")
local facts = require("facts")
-- The interpreter running this file runs the generator's subprocesses too;
-- LuaJIT with its JIT compiler off: Debian 12's LuaJIT 2.1.0-beta3 crashed
-- (SIGSEGV inside luajit) in 2 of 550 `fdgen gen` runs of the tiny set below
-- with the JIT on, 0 of 600 with -joff (README, "The generator").
local interp = (arg[-1] or "lua5.4") .. (jit and " -joff" or "")

-- Run a shell command; return its combined output and whether it succeeded.
local function sh(cmd)
  local p = io.popen(cmd .. " 2>&1; echo \"rc=$?\"")
  local out = p:read("*a"); p:close()
  local rc = tonumber(out:match("rc=(%d+)%s*$"))
  return out:gsub("rc=%d+%s*$", ""), rc == 0
end

local g = generate.new()
local k = "10064064020001110"
local src = g.source(k)
T.ok(src:find("do not edit", 1, true), "banner says generated, do not edit")
T.ok(src:find("const fd_kernel_desc fd_k" .. k .. "_desc", 1, true), "descriptor beside the kernel")
T.ok(src:find("void fd_k" .. k .. "(const fd_work *w)", 1, true), "kernel symbol is fd_k<key>")
T.ok(src:find('#line %d+ "templates/decode.c.tpl"'), "#line directives back to the template")
T.ok(not src:find("fd_k" .. k .. "_merge", 1, true), "no merge in an unsplit kernel")
T.ok(g.source("10064064020101110"):find("fd_k10064064020101110_merge", 1, true), "split kernel has its merge")
T.eq(g.source(k), src, "generation is deterministic")
do -- the merge of split partials: SIMD statements on a vector isa, the C loops on portable C
  local function merge_of(key)
    local m = g.source(key)
    return m:sub(m:find("_merge(const fd_merge_args *a) {", 1, true), -1)
  end
  local m512, mc = merge_of("10064064022101110"), merge_of("10064064020101110")
  T.eq(select(2, m512:gsub("vfmadd213ps zmm", "")), 4, "AVX-512 merge: one FMA a vector of head_dim 64 for a later split")
  T.eq(select(2, m512:gsub("vmulps zmm%d+, zmm%d+, zmm0 ", "")), 4, "  ... a multiply a vector for the first split")
  T.ok(m512:find("vcvtps2ph", 1, true) and not m512:find("fd_store_f16(", 1, true),
       "  ... and the row stored by the store_out statement")
  T.ok(mc:find("acc[d] += r[d] * wgt;", 1, true) and mc:find("fd_store_f16(out", 1, true), "portable C merge keeps its loops")
end
T.ok(g.source("10064064022001110"):find(".byte 0x62", 1, true), "AVX-512 kernel carries EVEX .byte lines")
T.ok(g.source("10064064021001110"):find(".byte 0xc", 1, true), "AVX2 kernel carries VEX .byte lines")
do -- the JIT's form: no #line, no instruction text; the same code otherwise
  local kv = "10064064022001110"
  local full = generate.new { line_directives = false }.source(kv)
  local plain = generate.new { line_directives = false, annotate = false }.source(kv)
  T.ok(full:find('\\n\\t"  /%* v'), "annotated source has each instruction's text beside its bytes")
  T.ok(not plain:find('\\n\\t"  /%*'), "annotate = false leaves the instruction text out")
  -- the text with each run of vector bytes (.byte lines, or the .long words
  -- the unannotated form packs them into) as one line of its bytes
  local function canon(src)
    local out, run = {}, {}
    local function flush()
      if #run > 0 then out[#out + 1] = "bytes " .. table.concat(run, ",") end
      run = {}
    end
    for line in (src .. "\n"):gmatch("([^\n]*)\n") do
      local dir, list = line:match('^%s*"%.(%a+) ([^"]-)\\n\\t"')
      if dir == "byte" then
        for h in list:gmatch("0x(%x+)") do run[#run + 1] = h end
      elseif dir == "long" or dir == "quad" then
        for h in list:gmatch("0x(%x+)") do
          for i = #h - 1, 1, -2 do run[#run + 1] = h:sub(i, i + 1) end
        end
      else
        flush()
        out[#out + 1] = line
      end
    end
    flush()
    return table.concat(out, "\n")
  end
  local stripped = full:gsub('(\\n\\t")  /%*[^\n]-%*/\n', "%1\n")
  T.ok(plain:find('"%.quad 0x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x%x[,\\]'), "annotate = false packs runs of vector bytes into .quad words")
  T.eq(canon(plain), canon(stripped), "and nothing else: the same source and bytes without the comments")
end
do -- the constant rows: exact f32 bits of their literals, one 64-byte string literal each
  local simd = require("simd")
  T.eq(simd.f32_bits(1.0, "one"), 0x3f800000, "f32 bits of 1")
  T.eq(simd.f32_bits(-64.0, "min_x"), 0xc2800000, "f32 bits of -64")
  T.eq(simd.f32_bits(1.44269504088896341, "log2e"), 0x3fb8aa3b, "f32 bits of log2(e), rounded to nearest")
  T.eq(simd.f32_bits(1.534574112e-4 * 2 ^ -32, "e6"), 0x2920e969, "f32 bits of a coefficient scaled by 2^-32")
  T.eq(simd.f32_bits(1 + 2 ^ -23 + 2 ^ -24 + 2 ^ -40, "above a tie"), 0x3f800002, "rounds up above a tie")
  T.raises("too close to an f32 rounding tie", "a literal at an f32 tie is refused", simd.f32_bits, 1 + 2 ^ -24, "tie")
  T.raises("is not a normal f32", "a constant outside the normal f32 range is refused", simd.f32_bits, 2 ^ 200, "huge")
  local rows = simd.const_rows()
  T.eq(#rows, #simd.CONST_FLOATS + #simd.CONST_INTS, "one row per constant")
  local bad = 0
  for _, r in ipairs(rows) do if #r[2] ~= 64 * 4 or not r[2]:match("^[\\x%x]+$") then bad = bad + 1 end end
  T.eq(bad, 0, "every row is 64 escaped bytes")
  T.ok(src:find(("fd_simd_c[%d]"):format(#rows * 64 + 1), 1, true) == nil, "the C kernel has no constant table")
  T.ok(g.source("10064064022001110"):find(rows[1][2], 1, true), "an AVX-512 source carries the first row")
end
T.raises("field head_dim: 72 is not a multiple of the AVX%-512 vector", "AVX-512 refuses head_dim 72",
         g.source, "10064072022001110")
T.raises("field group_tile: 16 exceeds", "AVX2 refuses group tile 16", g.source, "10064064161001110")
T.raises("field group_tile: 33 exceeds the 32 AVX%-512", "AVX-512 refuses group tile 33", g.source, "10064064332001110")
T.ok(g.source("10064064322001110"):find(".byte 0x62", 1, true), "AVX-512 takes group tile 32")
T.eq(table.concat(space.isas(72, 4), ","), "0,1", "isas of head_dim 72")
T.ok(g.source("10064064020001310"):find("signed char", 1, true), "int8 KV kernel generated")
T.ok(g.source("10064064020001410"):find("unsigned char", 1, true), "fp8 KV kernel generated")
T.ok(g.source("10064064020001510"):find("hu = (fd_u32)kr[d] << 8;", 1, true), "fp8 e5m2 KV: C loads the f16 of each byte")
for isa = 1, 2 do
  local src = g.source(("1006406402%d001510"):format(isa))
  T.ok(src:find("vpmovzxbw", 1, true) and src:find("vpsllw", 1, true) and src:find("vcvtph2ps", 1, true),
       "fp8 e5m2 KV: isa " .. isa .. " widens bytes to the f16 words they top, then converts")
end
T.ok(g.source("10064064020001112"):find("pages[(c + i) >> w->page_shift]", 1, true), "paged C kernel reads rows through the block table")
T.ok(g.source("10064064022001112"):find("for (po = 0; po < n; po += pm)", 1, true), "paged AVX-512 kernel walks a chunk page by page")
T.ok(not g.source("10064064022001110"):find("pages = w->pages", 1, true), "dense kernels hold no paged code")
-- int8 K and V with MSD planes: MSD scores (vpdpbusd), the f32 P.V
local two, three, plain = g.source("20010256128043000300"), g.source("30010256128043000300"), g.source("10256128043000300")
T.ok(two:find("vpdpbusd", 1, true) and three:find("vpdpbusd", 1, true), "planes 2 and 3: MSD scores")
T.ok(not two:find("vpunpcklbw", 1, true) and not three:find("vpunpcklbw", 1, true), "planes 2 and 3: no V transposed for P.V")
T.ok(not plain:find("vpdpbusd", 1, true), "planes 0: f32 scores and P.V")
-- the f32 P.V over int8/fp8 V takes the weights times the v scales
-- (gen/simd.lua pscale: on AVX-512 one masked multiply per head and 16 keys,
-- on AVX2 one multiply per head and 8 keys) instead of a multiply per V vector
local function count(src, pat) return select(2, src:gsub(pat, "")) end
T.eq(count(three, "ptr %[r9%]{1to16}"), 0, "planes 3, isa 3: P.V multiplies no V vector by its scale")
T.eq(count(three, "vmulps zmm%d+{k1}{z}, zmm31"), 4, "planes 3, isa 3, tile 4: the weights of 4 heads times the v scales")
local avx2 = g.source("10256128041000300")
T.eq(count(avx2, "vbroadcastss ymm%d+, dword ptr %[r9%]"), 0, "int8 V on AVX2: P.V multiplies no V vector by its scale")
T.eq(count(avx2, "vmulps ymm%d+, ymm15, ymmword ptr %[rdx"), 4, "int8 V on AVX2, tile 4: the weights of 4 heads times the v scales")
-- AVX2 tiles of 8 heads: P.V in passes of 4 heads (gen/simd.lua
-- AVX2_PV_HEADS), their weights in registers and bf16 V read split; the
-- second pass starts at head 4's weight row: dense (whole passes at chunk
-- 128, P.V blocks at 256) and paged
local wide, wide_paged = g.source("10256128081002220"), g.source("10256128081002222")
T.ok(g.source("10128128081002220"):find("aa.sc = sc + 544;", 1, true), "AVX2 tile 8, chunk 128: P.V's second pass starts at head 4's weight row")
T.ok(wide:find("aa.sc = sc + po + 1056;", 1, true), "AVX2 tile 8, P.V blocks: a block's second pass at head 4's weight row")
T.ok(wide_paged:find("aa.sc = sc + po + 1056;", 1, true), "AVX2 tile 8, paged: a page piece's second pass at head 4's weight row")
T.ok(count(wide, "vpand ymm%d+, ymm15, ymmword ptr %[rsi") > 0, "AVX2 tile 8: passes of 4 heads read bf16 V split")
-- AVX2 tiles of 5 to 8 heads: each key's reduced scores go to the stage, and
-- every 8 keys one 8 x 8 transpose stores a whole vector per head's row
-- (gen/simd.lua key_blocks), no lane moves; tile 7 stores 7 rows
local seven = g.source("10256128071001110")
T.eq(count(wide, "vmovups ymmword ptr %[rbx%+r9%*1%], ymm0"), 1, "AVX2 tile 8: a key's scores to its stage slot")
T.eq(count(wide, "vmovups ymmword ptr %[rdx[^%]]*%], ymm%d+"), 8, "AVX2 tile 8: 8 score rows stored a key block at a time")
T.eq(count(seven, "vmovups ymmword ptr %[rdx[^%]]*%], ymm%d+"), 7, "AVX2 tile 7: 7 score rows stored a key block at a time")
T.eq(count(wide, "vextractps") + count(seven, "vextractps"), 0, "AVX2 tiles 7 and 8: no lane moves")
-- AVX2 chunks past 128 keys: P.V in blocks of 128 keys (gen/simd.lua
-- pv_key_block), each block's passes prefetching the next chunk's rows from
-- its own; chunks of 128, paged kernels and AVX-512 keep whole passes
T.ok(g.source("10512128041002220"):find("pm = n - po < 128 ? n - po : 128;", 1, true), "AVX2 chunk 512: P.V in blocks of 128 keys")
T.ok(g.source("10512128041002220"):find("(kbase + (c + 512 + po) * kvs)", 1, true), "AVX2 chunk 512: a block prefetches the next chunk's rows from its own")
T.ok(not g.source("10128128041002220"):find("P.V in blocks", 1, true), "AVX2 chunk 128: whole P.V passes")
T.ok(not wide_paged:find("P.V in blocks", 1, true), "AVX2 paged: P.V by pages, no blocks")
T.ok(not g.source("10512128042002220"):find("P.V in blocks", 1, true), "AVX-512 chunk 512: whole P.V passes")
-- int8 K on AVX2, tile 4: the direct scores, each group of 2 keys times their
-- two scales after the reduction (gen/simd.lua scaled_group), no staging
T.eq(count(avx2, "vinsertf128 ymm1, ymm1, xmm1, 1 "), 1, "int8 K on AVX2, tile 4: the reduced group times its keys' scales")
T.eq(count(avx2, "vmovups ymmword ptr %[r13"), 0, "int8 K on AVX2, tile 4: no K row staged")
-- the scores pass's V prefetch (tiles of at least PREFETCH_MIN_TILE heads)
-- by the isa record's other_hint (gen/facts.lua), the P.V's K prefetch into L2
local hints = {}
for _, isa in ipairs { 3, 4, 2, 1 } do
  local s = g.source(("1025612804%d002220"):format(isa))
  local used = {}
  for hint, reg in s:gmatch("(prefetcht%d) %d+%(%%%%(%w+)%)") do used[#used + 1] = reg .. ":" .. hint end
  table.sort(used)
  local uniq = {}
  for i, u in ipairs(used) do if u ~= used[i - 1] then uniq[#uniq + 1] = u end end
  hints[isa] = table.concat(uniq, " ")
end
T.eq(hints[3], "r14:prefetcht0 rax:prefetcht1", "isa 3, tile 4: V prefetched into L1 by the scores pass, K into L2 by P.V")
T.eq(hints[4], "r14:prefetcht1 rax:prefetcht1", "isa 4, tile 4: V and K into L2")
T.eq(hints[2], "r14:prefetcht1 rax:prefetcht1", "isa 2, tile 4: V and K into L2")
T.eq(hints[1], "r14:prefetcht1 rax:prefetcht1", "isa 1, tile 4: V and K into L2")
-- head-lane tiles: the P.V passes also prefetch the next chunk's V rows into
-- L2 (r9 from pf_v), each cache line of a row once; row-major tiles do not
local hl, hl_paged = g.source("11024064163002220"), g.source("11024064163002222")
T.eq(count(hl, "prefetcht1 %d+%(%%%%r9%)"), 2, "head-lane, head_dim 64 bf16: the P.V prefetches the 2 lines of the next chunk's V row")
T.eq(count(hl, "prefetcht1 %d+%(%%%%rax%)"), 2, "head-lane, head_dim 64 bf16: and each of its K row's 2 lines once")
T.ok(hl:find("aa.pf_v = c + 1024 < end || !w->next_v ? (const void *)(vbase + (c + 1024) * kvs) : w->next_v;", 1, true),
  "dense head-lane kernel: pf_v is the next chunk's V, in the last chunk the thread's next item's first V rows")
T.ok(hl:find("aa.pf = c + 1024 < end || !w->next_k ? (const void *)(kbase + (c + 1024) * kvs) : w->next_k;", 1, true),
  "dense kernel: pf is the next chunk's K, in the last chunk the thread's next item's first K rows")
T.ok(hl_paged:find("aa.pf_v = nk < end ? vbase + (fd_i64)pages[(nk) >> w->page_shift]", 1, true),
  "paged head-lane kernel: pf_v is the next chunk's V row through the block table")
T.eq(count(g.source("10256128043002220"), "%%%%r9%)"), 0, "row-major tile 4: no next-chunk V prefetch")
-- head-lane bf16 scores: whole groups of 16 K rows read in place (16 row
-- operands, 32 dot products each at head_dim 64), the short last group staged
local rows = {}
for operand in hl:gmatch("vdpbf16ps zmm%d+, zmm%d+, dword ptr %[([%w%*+]+)%]") do
  operand = operand:gsub("%+%d+$", "")
  rows[operand] = (rows[operand] or 0) + 1
end
local in_place, distinct = 0, 0
for operand, n in pairs(rows) do
  if operand ~= "rbx" then in_place, distinct = in_place + n, distinct + 1 end
end
T.eq(rows.rbx, 512, "head-lane scores: the staged tail group's 512 dot products")
T.ok(in_place == 512 and distinct == 16, ("head-lane scores: 512 dot products from 16 rows in place (%d from %d)"):format(in_place, distinct))
T.raises("field flags", "split + lse refused", g.source, "10064064020301110")
T.raises("field head_dim", "malformed key refused", g.source, "10064000020001110")

-- Shape sets: candidates and validation.
T.eq(table.concat(space.tiles(16), ","), "1,2,4,8,16", "tiles of G=16")
T.eq(table.concat(space.tiles(7), ","), "1,7", "tiles of G=7")
local shapes_ok = space.load_shapes("tuner/shapes/default.lua")
T.ok(#shapes_ok >= 10, "default shape set loads")
local tmp = os.tmpname()
os.remove(tmp)
files.mkdir(tmp)
local function write(name, text) local fh = assert(io.open(tmp .. "/" .. name, "w")); fh:write(text); fh:close() end
write("bad.lua", "return { { name = 'x', batch = 1, n_q_heads = 6, n_kv_heads = 4, head_dim = 64, kv_len = {8} } }")
T.raises("shape x: field n_q_heads: must be a multiple", "bad shape refused naming the field",
         space.load_shapes, tmp .. "/bad.lua")
write("bad2.lua", "return { { name = 'y', batch = 1, n_q_heads = 4, n_kv_heads = 4, head_dim = 64, kv_len = {8}, kv_dtype = 'f64' } }")
T.raises("shape y: field kv_dtype", "bad dtype in a shape refused", space.load_shapes, tmp .. "/bad2.lua")

-- Inline specs: every field of fd_shape, features joined by +, an unknown
-- field or a token without = refused naming it.
local sp = space.parse_spec("batch=2,n_q_heads=8,n_kv_heads=2,head_dim=64,kv_dtype=bf16,softcap=30," ..
                            "features=alibi+sink_logits,window=100,kv_len=300:1000")
T.ok(sp.kv_dtype == "bf16" and sp.softcap == 30 and sp.window == 100 and #sp.kv_len == 2 and
     space.feature_bits(sp.features) == space.feature_bits { "alibi", "sink_logits" }, "an inline spec with features")
T.raises("field kv_dtpe is unknown", "a misspelt field refused naming it", space.parse_spec,
         "batch=1,n_q_heads=8,n_kv_heads=2,head_dim=64,kv_dtpe=bf16,kv_len=300")
T.raises('"head_dim" is not field=value', "a token without = refused", space.parse_spec,
         "batch=1,n_q_heads=8,n_kv_heads=2,head_dim,kv_len=300")
T.raises("field features: unknown feature alibbi", "an unknown feature refused", space.parse_spec,
         "batch=1,n_q_heads=8,n_kv_heads=2,head_dim=64,features=alibi+alibbi,kv_len=300")

-- fdgen gen: files, index, unchanged files not rewritten.
write("tiny.lua", "return { { name = 't', batch = 1, n_q_heads = 4, n_kv_heads = 2, head_dim = 32, kv_len = {64}," ..
      " kv_dtype = 'f16' } }")
local out, ok = sh(interp .. " gen/fdgen.lua gen " .. tmp .. "/tiny.lua -o " .. tmp .. "/out")
local n = #space.CHUNKS * 2 * 2 * (#facts.isas + 1)   -- chunks x tiles {1,2} x flag sets x isa records
T.ok(ok and out:find(n .. " variants", 1, true) and out:find("(" .. n .. " rewritten)", 1, true), "fdgen gen writes " .. n .. " variants", out)
local index = files.read(tmp .. "/out/index.tsv") or ""
T.eq(select(2, index:gsub("\n", "")), n + 1, "index lists every variant")
local ksorted, prev = true, ""
for key in index:gmatch("\n(%d+)\t") do ksorted = ksorted and key > prev; prev = key end
T.ok(ksorted, "index in a deterministic (sorted) order")
out, ok = sh(interp .. " gen/fdgen.lua gen " .. tmp .. "/tiny.lua -o " .. tmp .. "/out")
T.ok(ok and out:find("(0 rewritten)", 1, true), "second run rewrites nothing", out)
out, ok = sh(interp .. " gen/fdgen.lua key encode head_dim=128 chunk=256 group_tile=4 q_dtype=bf16 kv_dtype=bf16 out_dtype=bf16")
T.ok(ok and out:find("^10256128040002220"), "fdgen key encode", out)
out, ok = sh(interp .. " gen/fdgen.lua key decode 10256128040002220")
T.ok(ok and out:find("head_dim%s+128") and out:find("group tile 4", 1, true), "fdgen key decode", out)
out, ok = sh(interp .. " gen/fdgen.lua key decode 10256000040002220")
T.ok(not ok and out:find("field head_dim", 1, true), "fdgen key decode refuses a bad key", out)
out, ok = sh(interp .. " gen/fdgen.lua source 10032032020001010")
T.ok(ok and out:find("fd_k10032032020001010_desc", 1, true), "fdgen source")
os.execute("rm -rf '" .. tmp .. "'")
T.done()
