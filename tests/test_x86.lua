-- Test of gen/x86.lua: every operand form of every row of the encoder's opcode
-- table is assembled by the GNU assembler and compared byte for byte, then the
-- refusals are checked. Run from the repo root with lua5.4 or luajit.
package.path = "tests/?.lua;gen/?.lua;" .. package.path
local T = require("check")
local x86 = require("x86")

local floor = math.floor

---------------------------------------------------------------------------
-- Helpers

-- os.execute success on Lua 5.4 (true) and LuaJIT without 5.2 compat (0).
local function run(cmd)
  local r = os.execute(cmd)
  return r == true or r == 0
end

-- Read a whole file (binary), or nil.
local function slurp(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

-- Escape Lua pattern magic characters.
local function esc(s) return (s:gsub("[%^%$%(%)%%%.%[%]%*%+%-%?]", "%%%0")) end

local VEC = { [128] = "xmm", [256] = "ymm", [512] = "zmm" }
local R32 = { [0] = "eax", "ecx", "edx", "ebx", "esp", "ebp", "esi", "edi",
              "r8d", "r9d", "r10d", "r11d", "r12d", "r13d", "r14d", "r15d" }
local GPR64 = { "rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi",
                "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15" }

-- Register class a kind accepts: "vec", "k", "r32", or nil (memory/imm only).
local function kind_class(kind)
  if kind == "K" or kind == "KM16" then return "k" end
  if kind == "R32" or kind == "RM32" then return "r32" end
  if kind == "M" or kind == "M64" or kind == "M32" or kind == "M16" or kind == "I" then return nil end
  return "vec"
end

-- Does a kind accept memory?
local function kind_has_mem(kind)
  return kind:find("M") ~= nil and kind ~= "V"
end

-- Register name of number n for kind at vector length L.
local function reg_name(kind, L, n)
  local c = kind_class(kind)
  if c == "k" then return "k" .. n end
  if c == "r32" then return R32[n] end
  local bits = 128
  if kind == "V" or kind == "VM" then bits = L
  elseif kind == "HM" or kind == "H" then bits = math.max(128, L / 2) end
  return VEC[bits] .. n
end

-- Register numbers to sweep for a kind (full or a sample).
local function reg_range(kind, evex, full)
  local c = kind_class(kind)
  local top = (c == "k") and 7 or (c == "vec" and evex) and 31 or 15
  local t = {}
  if full then
    for n = 0, top do t[#t + 1] = n end
  else
    for _, n in ipairs({ 0, 5, 8, 13, 16, 31 }) do if n <= top then t[#t + 1] = n end end
    if c == "k" then t = { 0, 3, 7 } end
  end
  return t
end

-- EVEX disp8 scale, restated here from the SDM tuple tables.
local function disp8_n(row, L, bcst)
  local elem = row.w == 1 and 8 or 4
  local t = row.tuple
  if t == "fv" then return bcst and elem or L / 8 end
  if t == "hvm" then return L / 16 end
  if t == "qvm" then return L / 32 end
  if t == "t1s" then return elem end
  if t == "t4" then return 4 * elem end
  return 1
end

-- Memory operands exercising every ModRM/SIB/displacement path.
local MEMS = {
  { base = "rax" }, { base = "rdi", disp = 1 }, { base = "rsi", disp = -128 },
  { base = "rdx", disp = 127 }, { base = "rcx", disp = 128 }, { base = "rbx", disp = -129 },
  { base = "rax", disp = 0x12345678 }, { base = "rdi", disp = -2147483648 },
  { base = "rsi", disp = 2147483647 },
  { base = "rsp" }, { base = "rsp", disp = 8 }, { base = "r12" }, { base = "r12", disp = -256 },
  { base = "rbp" }, { base = "rbp", disp = 16 }, { base = "r13" }, { base = "r13", disp = 4096 },
  { base = "rdi", index = "rcx", scale = 1 }, { base = "rdi", index = "rcx", scale = 2, disp = 64 },
  { base = "rdi", index = "rcx", scale = 4, disp = -64 },
  { base = "rdi", index = "rcx", scale = 8, disp = 1024 },
  { base = "rbp", index = "rax", scale = 2 }, { base = "r13", index = "r12", scale = 4 },
  { base = "rsp", index = "rbp", scale = 8, disp = 32 }, { base = "r12", index = "r13", scale = 1, disp = -1 },
  { index = "rcx", scale = 4, disp = 64 }, { index = "r11", scale = 8 },
  { index = "rdx", scale = 1, disp = -32 }, { disp = 4096 }, { disp = 0 },
}
for i = 8, 15 do
  MEMS[#MEMS + 1] = { base = "r" .. i, disp = (i - 8) * 16 }
  MEMS[#MEMS + 1] = { base = GPR64[i - 7], index = "r" .. i, scale = ({ 1, 2, 4, 8 })[i % 4 + 1], disp = 8 }
end
local FEW_MEMS = { { base = "rax" }, { base = "r13" }, { base = "rsp", disp = 8 },
                   { base = "r9", index = "r14", scale = 8, disp = -128 } }

-- Copy a memory table, overriding fields.
local function mem(m, extra)
  local t = {}
  for k, v in pairs(m) do t[k] = v end
  for k, v in pairs(extra or {}) do t[k] = v end
  return t
end

---------------------------------------------------------------------------
-- Case generation

local HAS_VEX = {}
for _, row in ipairs(x86.rows) do if row.vex then HAS_VEX[row.mn] = true end end

local cases = {}

-- Does this operand list need EVEX by itself (so no {evex} prefix is needed)?
local function needs_evex(ops)
  for _, o in ipairs(ops) do
    if type(o) == "string" then
      local n = tonumber(o:match("^[xyz]mm(%d+)") or "0")
      if n >= 16 or o:find("zmm") or o:find("{") then return true end
    elseif type(o) == "table" and (o.bcst or o.mask) then
      return true
    end
  end
  return false
end

-- Record one case; EVEX cases of mnemonics with a VEX form get {evex} when needed.
local function add(row, evex, ops)
  local mn = row.mn
  if evex and HAS_VEX[mn] and not needs_evex(ops) then mn = "{evex} " .. mn end
  cases[#cases + 1] = { mn = mn, ops = ops }
end

-- Default operands of a row at length L (register i gets number i).
local function defaults(row, L)
  local ops = {}
  for i, k in ipairs(row.kinds) do
    if k == "I" then ops[i] = 5
    elseif kind_class(k) then ops[i] = reg_name(k, L, i)
    else ops[i] = mem({ base = "rdi", index = "rcx", scale = 4, disp = 64 }) end
  end
  return ops
end

-- Copy of ops with position p replaced by v.
local function with(ops, p, v)
  local t = {}
  for i = 1, #ops do t[i] = ops[i] end
  t[p] = v
  return t
end

-- Position of the memory-capable operand of a row, or nil.
local function mem_pos(row)
  for i, k in ipairs(row.kinds) do if kind_has_mem(k) then return i end end
end

-- All cases for one row in one encoding at vector length L.
local function gen(row, evex, L, primary)
  local base = defaults(row, L)
  local n = #row.kinds
  add(row, evex, base)
  -- every register number in every register position
  for p, k in ipairs(row.kinds) do
    if kind_class(k) then
      for _, r in ipairs(reg_range(k, evex, primary)) do add(row, evex, with(base, p, reg_name(k, L, r))) end
    end
  end
  -- all register positions at the same number
  for _, r in ipairs({ 0, 7, 8, 15, 16, 31 }) do
    local ops = {}
    for i, k in ipairs(row.kinds) do
      local c = kind_class(k)
      if c and (c ~= "vec" or evex or r < 16) then ops[i] = reg_name(k, L, c == "k" and r % 8 or r % 16 + (c == "vec" and r - r % 16 or 0))
      else ops[i] = base[i] end
    end
    if not (r >= 16 and not evex) then add(row, evex, ops) end
  end
  -- memory forms
  local mp = mem_pos(row)
  if mp then
    for _, m in ipairs(primary and MEMS or FEW_MEMS) do add(row, evex, with(base, mp, mem(m))) end
    -- high registers elsewhere with an extended base/index
    local hi = {}
    for i, k in ipairs(row.kinds) do
      local c = kind_class(k)
      hi[i] = c and reg_name(k, L, c == "k" and 7 or (c == "vec" and evex) and 31 or 15) or base[i]
    end
    add(row, evex, with(hi, mp, { base = "r15", index = "r14", scale = 8, disp = 200 }))
    if evex then
      local bc = { false }
      if row.bcst then bc[2] = true end
      for _, b in ipairs(bc) do
        local N = disp8_n(row, L, b)
        for _, d in ipairs({ 0, N, -N, N * 127, N * 128, -N * 128, -N * 129, N + 1, N * 64 + 2 }) do
          add(row, evex, with(base, mp, { base = "rdx", disp = d, bcst = b or nil }))
        end
        if b then
          add(row, evex, with(base, mp, { base = "r13", index = "r12", scale = 4, bcst = true }))
          add(row, evex, with(base, mp, { index = "rax", scale = 8, disp = 64, bcst = true }))
        end
      end
    end
  end
  -- write masks on the destination
  if evex and not row.nomask then
    local dest_mem = type(base[1]) == "table"
    for kk = 1, 7 do
      if primary or kk == 1 or kk == 7 then
        if dest_mem then
          add(row, evex, with(base, 1, mem(base[1], { mask = "k" .. kk })))
        else
          add(row, evex, with(base, 1, base[1] .. "{k" .. kk .. "}"))
          if not row.nozero then add(row, evex, with(base, 1, base[1] .. "{k" .. kk .. "}{z}")) end
        end
      end
    end
    -- masked with a memory source or store
    if mp and mp ~= 1 and not dest_mem then
      local z = row.nozero and "" or "{z}"
      add(row, evex, with(with(base, 1, base[1] .. "{k3}" .. z), mp, { base = "rsi", disp = 256 }))
    end
  end
  -- immediates
  if row.kinds[n] == "I" and primary then
    for _, v in ipairs({ 0, 1, 127, 128, 255, -1, -128 }) do add(row, evex, with(base, n, v)) end
  end
end

-- Rows that differ from an earlier row only in the opcode byte take the same
-- encoding paths, so only the first row of each shape gets the full sweep.
local seen_shape = {}
for _, row in ipairs(x86.rows) do
  local shape = table.concat({ row.map, row.w, table.concat(row.roles),
    table.concat(row.kinds, ","), tostring(row.scalar), tostring(row.lbit), row.tuple,
    tostring(row.bcst), tostring(row.swap), tostring(row.nomask), tostring(row.nozero),
    tostring(row.ext), tostring(row.vex), tostring(row.evex),
    tostring(row.lens[128]), tostring(row.lens[256]), tostring(row.lens[512]) }, "|")
  local first = not seen_shape[shape]
  seen_shape[shape] = true
  for _, evex in ipairs({ false, true }) do
    if (evex and row.evex) or (not evex and row.vex) then
      local lens = {}
      for _, L in ipairs({ 128, 256, 512 }) do
        if row.lens[L] and (evex or L < 512) then lens[#lens + 1] = L end
      end
      for i, L in ipairs(lens) do gen(row, evex, L, first and i == #lens) end
    end
  end
end

-- A few cases the generic sweep does not produce: table-form masks, defaults.
local extra = {
  { mn = "vaddps", ops = { { reg = "zmm1", mask = "k2", zero = true }, "zmm2", "zmm3" } },
  { mn = "vaddps", ops = { { reg = "xmm1", mask = "k2" }, "xmm2", "xmm3" } },
  { mn = "vpslld", ops = { "xmm0", { base = "rax" }, 3 } },
  { mn = "vpslld", ops = { "ymm17", "ymm1", 3 } },
  { mn = "vmovups", ops = { "xmm16", "xmm8" } },
  { mn = "vmovaps", ops = { "ymm8", "ymm8" } },
  { mn = "VADDPS", ops = { "XMM1", "Xmm2", "xmm3" } },
}
for _, c in ipairs(extra) do cases[#cases + 1] = c end

---------------------------------------------------------------------------
-- Assemble with GNU as and compare

T.ok(run("as --version >/dev/null 2>&1"), "GNU as is installed", "as not found (install binutils)")
T.ok(run("objcopy --version >/dev/null 2>&1"), "objcopy is installed", "objcopy not found (install binutils)")

local tmp = os.tmpname()
local SRC, OBJ, BIN, ERR = tmp .. ".s", tmp .. ".o", tmp .. ".bin", tmp .. ".err"

-- Encode and format every case; cases the encoder refuses fail here.
local texts, got = {}, {}
for i, c in ipairs(cases) do
  local ok1, txt = pcall(x86.text, c.mn, (table.unpack or unpack)(c.ops))
  local ok2, bytes = pcall(x86.encode, c.mn, (table.unpack or unpack)(c.ops))
  if ok1 and ok2 then
    texts[i], got[i] = txt, bytes
  else
    T.ok(false, "encode " .. c.mn, ok1 and bytes or txt)
  end
end

-- The memoized encoder gives the same bytes, whichever displacements of a
-- form it met first. Twice, in both orders, so
-- each case meets forms first kept by other displacements.
for pass = 1, 2 do
  local differ, n = {}, #cases
  for j = 1, n do
    local i = pass == 1 and j or n + 1 - j
    local c = cases[i]
    if got[i] then
      local ok, bytes = pcall(x86.bytes_cached, c.mn, (table.unpack or unpack)(c.ops))
      if not ok or bytes ~= got[i] then differ[#differ + 1] = texts[i] end
    end
  end
  T.eq(#differ, 0, ("bytes_cached equals encode on every case (pass %d)"):format(pass), differ[1])
end

-- Assemble the listed cases into 16-byte slots: length byte, then the instruction.
local function assemble(list)
  local lines = { ".intel_syntax noprefix", ".text" }
  local line_of = {}
  for _, i in ipairs(list) do
    lines[#lines + 1] = ".balign 16, 0xcc"
    lines[#lines + 1] = ".byte 2f-1f"
    lines[#lines + 1] = "1: " .. texts[i]
    line_of[#lines] = i
    lines[#lines + 1] = "2:"
  end
  lines[#lines + 1] = ".balign 16, 0xcc"
  local f = assert(io.open(SRC, "w"))
  f:write(table.concat(lines, "\n"), "\n")
  f:close()
  os.remove(OBJ); os.remove(BIN)
  local ok = run(("as --64 -o %s %s 2>%s"):format(OBJ, SRC, ERR)) and
             run(("objcopy -O binary --only-section=.text %s %s 2>>%s"):format(OBJ, BIN, ERR))
  local bad = {}
  for l, msg in (slurp(ERR) or ""):gmatch(":(%d+): Error: ([^\n]*)") do
    local i = line_of[tonumber(l)]
    if i then bad[i] = msg end
  end
  return ok, bad
end

local list = {}
for i = 1, #cases do if texts[i] then list[#list + 1] = i end end
local ok, bad = assemble(list)
if not ok and next(bad) then
  -- report the lines GNU as refused, then assemble the rest
  local keep = {}
  for _, i in ipairs(list) do
    if bad[i] then T.ok(false, "as accepts: " .. texts[i], bad[i]) else keep[#keep + 1] = i end
  end
  list = keep
  ok, bad = assemble(list)
end
if T.ok(ok, "assembling " .. #list .. " instructions", slurp(ERR)) then
  local bin = slurp(BIN) or ""
  T.eq(#bin, 16 * #list, "object size is one 16-byte slot per instruction")
  for s, i in ipairs(list) do
    local off = (s - 1) * 16
    local len = bin:byte(off + 1) or 0
    local want = bin:sub(off + 2, off + 1 + len)
    T.ok(got[i] == want, texts[i], ("as %s, x86 %s"):format(x86.hex(want), x86.hex(got[i])))
  end
end
for _, p in ipairs({ SRC, OBJ, BIN, ERR, tmp }) do os.remove(p) end

---------------------------------------------------------------------------
-- Refusals: each raises "x86: MNEMONIC: ..." naming the operand

local function refuses(want, mn, ...)
  T.raises("^" .. esc("x86: " .. want), "refuses " .. mn .. " (" .. want .. ")", x86.encode, mn, ...)
end
local R = { base = "rax" }
refuses("unknown instruction 'vfoops'", "vfoops", "xmm0", "xmm1")
refuses("vroundps: operand 1 (zmm0): zmm needs EVEX", "vroundps", "zmm0", "zmm1", 0)
refuses("vpand: operand 2 (ymm1): expected xmm register", "vpand", "xmm0", "ymm1", "xmm2")
refuses("vpand: operand 1 (zmm0): zmm needs EVEX and vpand has no EVEX form", "vpand", "zmm0", "zmm1", "zmm2")
refuses("vhaddps: operand 3 (xmm16): registers 16-31 need EVEX", "vhaddps", "xmm0", "xmm1", "xmm16")
refuses("vhaddps: operand 1 (xmm0{k1}): masking needs EVEX", "vhaddps", "xmm0{k1}", "xmm1", "xmm2")
refuses("kmovw: operand 1 (k1{k2}): masking needs EVEX", "kmovw", "k1{k2}", "k3")
refuses("vmovd: operand 1 (xmm0{k1}): write-masking not supported", "vmovd", "xmm0{k1}", "eax")
refuses("vmovhlps: operand 1 (xmm17{k1}): write-masking not supported", "vmovhlps", "xmm17{k1}", "xmm1", "xmm2")
refuses("vaddps: operand 2 (zmm1{k1}): only the destination may be masked", "vaddps", "zmm0", "zmm1{k1}", "zmm2")
refuses("vcmpps: operand 1 (k1{k2}{z}): zeroing-masking {z} not allowed", "vcmpps", "k1{k2}{z}", "zmm1", "zmm2", 0)
refuses("vmovups: operand 2 ([rax]): embedded broadcast not allowed", "vmovups", "zmm0", { base = "rax", bcst = true })
refuses("vcvtph2ps: operand 2 ([rax]): embedded broadcast not allowed", "vcvtph2ps", "zmm0", { base = "rax", bcst = true })
refuses("vhaddps: operand 3 ([rax]): broadcast needs EVEX", "vhaddps", "ymm0", "ymm1", { base = "rax", bcst = true })
refuses("vaddps: operand 3 ([rax+rcx*3]): scale 3 is not 1, 2, 4 or 8", "vaddps", "xmm0", "xmm1", { base = "rax", index = "rcx", scale = 3 })
refuses("vaddps: operand 3 ([rax+rsp*1]): rsp cannot be an index", "vaddps", "xmm0", "xmm1", { base = "rax", index = "rsp" })
refuses("vaddps: operand 3 ([eax]): base 'eax' is not a 64-bit", "vaddps", "xmm0", "xmm1", { base = "eax" })
refuses("vaddps: operand 3 ([rax+xmm1*4]): index 'xmm1' is not a 64-bit", "vaddps", "xmm0", "xmm1", { base = "rax", index = "xmm1", scale = 4 })
refuses("vaddps: operand 3 ([rax+2147483648]): displacement 2147483648 is not a signed 32-bit", "vaddps", "xmm0", "xmm1", { base = "rax", disp = 2 ^ 31 })
refuses("vaddps: operand 3 ([rax]): unknown memory field 'size'", "vaddps", "xmm0", "xmm1", { base = "rax", size = 4 })
refuses("vaddps: operand 3 ([rcx]): scale without an index", "vaddps", "xmm0", "xmm1", { base = "rcx", scale = 2 })
refuses("vaddps: operand 2 (ymm1): expected xmm register", "vaddps", "xmm0", "ymm1", "xmm2")
refuses("vaddps: operand 1 (rax): expected xmm register", "vaddps", "rax", "xmm1", "xmm2")
refuses("vaddps: operand 1 (xmm32): unknown register 'xmm32'", "vaddps", "xmm32", "xmm1", "xmm2")
refuses("vaddps: operand 1 (zmm0{k0}): write mask must be k1-k7", "vaddps", "zmm0{k0}", "zmm1", "zmm2")
refuses("vaddps: operand 1 (zmm0{z}): {z} needs a write mask", "vaddps", "zmm0{z}", "zmm1", "zmm2")
refuses("vaddps: takes 3 operands, got 2", "vaddps", "xmm0", "xmm1")
refuses("vaddps: operand 3 (1): expected xmm register or 16-byte memory", "vaddps", "xmm0", "xmm1", 1)
refuses("vmovd: operand 2 (rax): expected 32-bit general register or 4-byte memory", "vmovd", "xmm0", "rax")
refuses("kmovw: operand 2 (xmm0): expected opmask register or 2-byte memory", "kmovw", "k1", "xmm0")
refuses("vcmpps: operand 2 (zmm1): expected xmm register", "vcmpps", "xmm0", "zmm1", "zmm2", 0)
refuses("vshufps: operand 4 (256): immediate out of range", "vshufps", "xmm0", "xmm1", "xmm2", 256)
refuses("vshufps: operand 4 (-129): immediate out of range", "vshufps", "xmm0", "xmm1", "xmm2", -129)
refuses("vshufps: operand 4 (1.5): immediate out of range", "vshufps", "xmm0", "xmm1", "xmm2", 1.5)
refuses("vextractf64x4: operand 2 (ymm1): vector length 256 not supported", "vextractf64x4", "xmm0", "ymm1", 1)
refuses("vextractf128: operand 2 (xmm1): vector length 128 not supported", "vextractf128", "xmm0", "xmm1", 1)
refuses("vmovups: operand 1 ([rdi]): unknown memory field 'zero'", "vmovups", { base = "rdi", mask = "k1", zero = true }, "zmm1")
refuses("vmovups: operand 2 ([rdi]): only the destination may be masked", "vmovups", "zmm0", { base = "rdi", mask = "k1" })
refuses("vhaddps: has no EVEX form", "{evex} vhaddps", "xmm0", "xmm1", "xmm2")
refuses("vaddps: operand 1 (zmm1{k1): bad decoration '{k1'", "vaddps", "zmm1{k1", "zmm2", "zmm3")
refuses("vpslld: operand 3 (300): immediate out of range", "vpslld", "xmm0", R, 300)
T.eq(x86.hex("\98\241"), "0x62,0xf1", "hex format")
T.eq(x86.byte_line("\197\248\119"), ".byte 0xc5,0xf8,0x77", "byte_line format")
T.eq(x86.line("vzeroupper"), ".byte 0xc5,0xf8,0x77", "line")
T.eq(x86.line("vfmadd231ps", "zmm0{k1}", "zmm1", { base = "rdi", index = "rcx", scale = 4, disp = 64, bcst = true }),
     ".byte 0x62,0xf2,0x75,0x59,0xb8,0x44,0x8f,0x10", "documented example")

-- a memoized form still refuses a bad displacement, and a new one
-- of it encodes as the encoder does (disp8 compressed by N, disp32)
T.eq(x86.bytes_cached("vmovups", "zmm3", { base = "rsi", disp = 64 }), x86.encode("vmovups", "zmm3", { base = "rsi", disp = 64 }), "memoized form, disp 64")
T.eq(x86.bytes_cached("vmovups", "zmm3", { base = "rsi", disp = 8192 }), x86.encode("vmovups", "zmm3", { base = "rsi", disp = 8192 }), "memoized form, new disp 8192")
T.eq(x86.bytes_cached("vmovups", "zmm3", { base = "rsi" }), x86.encode("vmovups", "zmm3", { base = "rsi" }), "memoized form, no disp")
T.raises("displacement 1.5 is not a signed 32%-bit integer", "memoized form refuses disp 1.5",
         x86.bytes_cached, "vmovups", "zmm3", { base = "rsi", disp = 1.5 })
T.raises("displacement 2147483648 is not", "memoized form refuses disp 2^31",
         x86.bytes_cached, "vmovups", "zmm3", { base = "rsi", disp = 2 ^ 31 })

local lt_line, lt_text = x86.line_text("vaddps", "zmm1", "zmm2", "zmm3")
T.eq(lt_line, x86.line("vaddps", "zmm1", "zmm2", "zmm3"), "line_text line")
T.eq(lt_text, x86.text("vaddps", "zmm1", "zmm2", "zmm3"), "line_text text")

T.done()
