-- x86.lua: a small x86-64 encoder for the VEX and EVEX SIMD instructions the
-- kernels need. TinyCC's assembler knows almost no SIMD, so generated inline
-- asm carries these instructions as `.byte` lines; general-purpose
-- instructions (mov/add/cmp/jnz/lea) are left to tcc. Every encoding is checked
-- byte for byte against the GNU assembler by tests/test_x86.lua.
-- Pure Lua, runs on Lua 5.4 and LuaJIT 2.1 (no bit operators, no goto).
--
-- API
--   x86.encode(mnemonic, op1, op2, ...) -> string of raw bytes
--   x86.text(mnemonic, op1, op2, ...)   -> the same instruction in GNU as Intel
--                                          syntax (for comments and the test)
--   x86.hex(bytes)       -> "0x62,0xf1,..."
--   x86.byte_line(bytes) -> ".byte 0x62,0xf1,..."  (one line of assembler text)
--   x86.line(mnemonic, ...) -> x86.byte_line(x86.encode(mnemonic, ...))
--   x86.line_text(mnemonic, ...) -> x86.line(...), x86.text(...) (one match, memoized)
--   x86.bytes_cached(mnemonic, ...) -> x86.encode(...) (memoized)
--   x86.rows             -> the parsed opcode table (read-only; for tests)
--
-- Operands, Intel order (destination first):
--   vector registers  "xmm0".."xmm31", "ymm0".."ymm31", "zmm0".."zmm31"
--                     (16-31 and zmm only in EVEX forms)
--   opmask registers  "k0".."k7"
--   general registers "rax".."r15" (memory bases/indexes only), "eax".."r15d"
--                     (vmovd, kmovw)
--   write-masking     "zmm1{k2}" (merge) or "zmm1{k2}{z}" (zero), destination
--                     only, EVEX only; a table {reg="zmm1", mask="k2", zero=true}
--                     is accepted too
--   memory            {base="rdi", index="rcx", scale=4, disp=64, bcst=false,
--                     mask="k1"}: every field optional; bcst=true is the EVEX
--                     embedded broadcast {1to4}/{1to8}/{1to16} of one element;
--                     mask (merge only) is for a masked store destination.
--                     No base means an absolute disp32 (SIB form).
--   immediates        Lua integers, -128..255 (imm8)
-- Encoding choice: like GNU as, VEX when the instruction has a VEX form and the
-- operands allow it (no register >= 16, no zmm, no mask, no broadcast), else
-- EVEX. Prefix the mnemonic with "{evex} " to force EVEX, as with GNU as.
-- Any unsupported mnemonic or operand raises an error starting with "x86: "
-- that names the instruction and the offending operand.
--
-- Example:
--   local x86 = require("x86")
--   local mem = { base = "rdi", index = "rcx", scale = 4, disp = 64, bcst = true }
--   print(x86.line("vfmadd231ps", "zmm0{k1}", "zmm1", mem))
--   --> .byte 0x62,0xf2,0x75,0x59,0xb8,0x44,0x8f,0x10
local M = {}

local floor = math.floor
local unpack = table.unpack or unpack

-- The opcode table, one row per operand form of a mnemonic. Columns:
--   enc   V = VEX form, E = EVEX form, VE = both (same opcode)
--   map   opcode map 0F, 0F38 or 0F3A;  pp: mandatory prefix "", 66, F3, F2
--   op    opcode byte;  W: the W bit (WIG instructions use 0, like GNU as)
--   roles one letter per operand: R = ModRM.reg, V = VEX/EVEX.vvvv,
--         M = ModRM.rm (register or memory), I = imm8
--   kinds one per operand (L = the instruction's vector length, taken from
--         its first V/VM register operand, else 128):
--         V vector of length L; VM V or L-bit memory; H vector of L/2 (at
--         least xmm); HM vector of L/2 (at
--         least xmm) or L/2-bit memory; QM xmm or L/4-bit memory; X xmm;
--         XM xmm or m128; XM32 xmm or m32; M L-bit memory; M32 m32; M64 m64; K opmask;
--         KM16 opmask or m16; M16 m16; R32 32-bit register; RM32 r32 or m32;
--         I imm8
--   lens  allowed L: x = 128, y = 256, z = 512 (VEX never takes z);
--         s = scalar (L ignored, encoded 0); 0/1 = fixed VEX.L (mask insns)
--   tuple EVEX tuple type for disp8*N: fv full vector (N = L/8, element size
--         with broadcast), hvm half mem (L/16), qvm quarter mem (L/32),
--         t1s tuple1 scalar (element), t4 tuple4 (4 elements), - VEX only
--   flags b = embedded broadcast allowed; /n = ModRM.reg opcode extension;
--         nomask = no EVEX write-masking; nozero = no {z};
--         d = GNU as swaps a VEX reg-reg form to opcode+1 when that saves C4
local OPS = {
  -- mnemonic      enc   map     pp    op    W  roles   kinds          lens   tuple  flags
  -- moves
  { "vmovups",      "VE", "0F",   "",   0x10, 0, "RM",   "V,VM",        "xyz", "fv",  "d" },
  { "vmovups",      "VE", "0F",   "",   0x11, 0, "MR",   "M,V",         "xyz", "fv",  "" },
  { "vmovaps",      "VE", "0F",   "",   0x28, 0, "RM",   "V,VM",        "xyz", "fv",  "d" },
  { "vmovaps",      "VE", "0F",   "",   0x29, 0, "MR",   "M,V",         "xyz", "fv",  "" },
  { "vmovss",       "VE", "0F",   "F3", 0x10, 0, "RM",   "X,M32",       "s",   "t1s", "" },
  { "vmovss",       "VE", "0F",   "F3", 0x11, 0, "MR",   "M32,X",       "s",   "t1s", "" },
  { "vmovlps",      "V",  "0F",   "",   0x13, 0, "MR",   "M64,X",       "x",   "-",   "" },
  { "vmovhps",      "V",  "0F",   "",   0x17, 0, "MR",   "M64,X",       "x",   "-",   "" },
  { "vextractps",   "V",  "0F3A", "66", 0x17, 0, "MRI",  "M32,X,I",     "x",   "-",   "" },
  { "vmovd",        "VE", "0F",   "66", 0x6E, 0, "RM",   "X,RM32",      "x",   "t1s", "nomask" },
  { "vmovd",        "VE", "0F",   "66", 0x7E, 0, "MR",   "RM32,X",      "x",   "t1s", "nomask" },
  { "vmovhlps",     "VE", "0F",   "",   0x12, 0, "RVM",  "X,X,X",       "x",   "fv",  "nomask" },
  { "vbroadcastss", "VE", "0F38", "66", 0x18, 0, "RM",   "V,XM32",      "xyz", "t1s", "" },
  { "vpbroadcastd", "VE", "0F38", "66", 0x58, 0, "RM",   "V,XM32",      "xyz", "t1s", "" },
  { "vmaskmovps",   "V",  "0F38", "66", 0x2C, 0, "RVM",  "V,V,M",       "xy",  "-",   "" },
  { "vmaskmovps",   "V",  "0F38", "66", 0x2E, 0, "MVR",  "M,V,V",       "xy",  "-",   "" },
  -- packed single arithmetic
  { "vaddps",       "VE", "0F",   "",   0x58, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  { "vsubps",       "VE", "0F",   "",   0x5C, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  { "vmulps",       "VE", "0F",   "",   0x59, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  { "vdivps",       "VE", "0F",   "",   0x5E, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  { "vmaxps",       "VE", "0F",   "",   0x5F, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  { "vminps",       "VE", "0F",   "",   0x5D, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  { "vhaddps",      "V",  "0F",   "F2", 0x7C, 0, "RVM",  "V,V,VM",      "xy",  "-",   "" },
  { "vscalefps",    "E",  "0F38", "66", 0x2C, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  { "vfmadd132ps",  "VE", "0F38", "66", 0x98, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  { "vfmadd213ps",  "VE", "0F38", "66", 0xA8, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  { "vfmadd231ps",  "VE", "0F38", "66", 0xB8, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  { "vfmsub132ps",  "VE", "0F38", "66", 0x9A, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  { "vfnmadd213ps", "VE", "0F38", "66", 0xAC, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  { "vfnmadd231ps", "VE", "0F38", "66", 0xBC, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  -- dot products of pairs into f32 / int32 lanes (AVX512-BF16, AVX512-VNNI)
  { "vdpbf16ps",    "E",  "0F38", "F3", 0x52, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  { "vcvtneps2bf16","E",  "0F38", "F3", 0x72, 0, "RM",   "H,V",         "xyz", "fv",  "" },
  { "vpdpbusd",     "E",  "0F38", "66", 0x50, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  -- two-table permutes (AVX-512F): the index register is overwritten by the result
  { "vpermi2ps",    "E",  "0F38", "66", 0x77, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  -- scalar single arithmetic
  { "vaddss",       "VE", "0F",   "F3", 0x58, 0, "RVM",  "X,X,XM32",    "s",   "t1s", "" },
  { "vsubss",       "VE", "0F",   "F3", 0x5C, 0, "RVM",  "X,X,XM32",    "s",   "t1s", "" },
  { "vmulss",       "VE", "0F",   "F3", 0x59, 0, "RVM",  "X,X,XM32",    "s",   "t1s", "" },
  { "vdivss",       "VE", "0F",   "F3", 0x5E, 0, "RVM",  "X,X,XM32",    "s",   "t1s", "" },
  { "vmaxss",       "VE", "0F",   "F3", 0x5F, 0, "RVM",  "X,X,XM32",    "s",   "t1s", "" },
  { "vminss",       "VE", "0F",   "F3", 0x5D, 0, "RVM",  "X,X,XM32",    "s",   "t1s", "" },
  { "vfmadd231ss",  "VE", "0F38", "66", 0xB9, 0, "RVM",  "X,X,XM32",    "s",   "t1s", "" },
  -- bitwise (EVEX forms of the float ones are AVX512DQ)
  { "vandps",       "VE", "0F",   "",   0x54, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  { "vandnps",      "VE", "0F",   "",   0x55, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  { "vorps",        "VE", "0F",   "",   0x56, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  { "vxorps",       "VE", "0F",   "",   0x57, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  { "vpand",        "V",  "0F",   "66", 0xDB, 0, "RVM",  "V,V,VM",      "xy",  "-",   "" },
  { "vpandn",       "V",  "0F",   "66", 0xDF, 0, "RVM",  "V,V,VM",      "xy",  "-",   "" },
  { "vpor",         "V",  "0F",   "66", 0xEB, 0, "RVM",  "V,V,VM",      "xy",  "-",   "" },
  { "vpxor",        "V",  "0F",   "66", 0xEF, 0, "RVM",  "V,V,VM",      "xy",  "-",   "" },
  { "vpandd",       "E",  "0F",   "66", 0xDB, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  { "vpandnd",      "E",  "0F",   "66", 0xDF, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  { "vpord",        "E",  "0F",   "66", 0xEB, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  { "vpxord",       "E",  "0F",   "66", 0xEF, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  -- packed dword integer
  { "vpaddd",       "VE", "0F",   "66", 0xFE, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  { "vpsubd",       "VE", "0F",   "66", 0xFA, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  { "vpmaddwd",     "V",  "0F",   "66", 0xF5, 0, "RVM",  "V,V,VM",      "xy",  "-",   "" },
  { "vpackssdw",    "V",  "0F",   "66", 0x6B, 0, "RVM",  "V,V,VM",      "xy",  "-",   "" },
  { "vpslld",       "V",  "0F",   "66", 0x72, 0, "VMI",  "V,V,I",       "xy",  "-",   "/6" },
  { "vpslld",       "E",  "0F",   "66", 0x72, 0, "VMI",  "V,VM,I",      "xyz", "fv",  "b /6" },
  { "vpsrld",       "V",  "0F",   "66", 0x72, 0, "VMI",  "V,V,I",       "xy",  "-",   "/2" },
  { "vpsrld",       "E",  "0F",   "66", 0x72, 0, "VMI",  "V,VM,I",      "xyz", "fv",  "b /2" },
  { "vpsrad",       "V",  "0F",   "66", 0x72, 0, "VMI",  "V,V,I",       "xy",  "-",   "/4" },
  { "vpsrad",       "E",  "0F",   "66", 0x72, 0, "VMI",  "V,VM,I",      "xyz", "fv",  "b /4" },
  -- packed word integer (EVEX forms are AVX512BW)
  { "vpsllw",       "V",  "0F",   "66", 0x71, 0, "VMI",  "V,V,I",       "xy",  "-",   "/6" },
  { "vpsllw",       "E",  "0F",   "66", 0x71, 0, "VMI",  "V,VM,I",      "xyz", "fv",  "/6" },
  { "vpackusdw",    "VE", "0F38", "66", 0x2B, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  -- byte/word interleaves within 128-bit lanes (the MSD P.V's V transpose)
  { "vpunpcklbw",   "VE", "0F",   "66", 0x60, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "" },
  { "vpunpckhbw",   "VE", "0F",   "66", 0x68, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "" },
  { "vpunpcklwd",   "VE", "0F",   "66", 0x61, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "" },
  { "vpunpckhwd",   "VE", "0F",   "66", 0x69, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "" },
  -- conversions and rounding
  { "vcvtps2dq",    "VE", "0F",   "66", 0x5B, 0, "RM",   "V,VM",        "xyz", "fv",  "b" },
  { "vcvttps2dq",   "VE", "0F",   "F3", 0x5B, 0, "RM",   "V,VM",        "xyz", "fv",  "b" },
  { "vcvtdq2ps",    "VE", "0F",   "",   0x5B, 0, "RM",   "V,VM",        "xyz", "fv",  "b" },
  { "vroundps",     "V",  "0F3A", "66", 0x08, 0, "RMI",  "V,VM,I",      "xy",  "-",   "" },
  { "vrndscaleps",  "E",  "0F3A", "66", 0x08, 0, "RMI",  "V,VM,I",      "xyz", "fv",  "b" },
  { "vcvtph2ps",    "VE", "0F38", "66", 0x13, 0, "RM",   "V,HM",        "xyz", "hvm", "" },
  { "vcvtps2ph",    "VE", "0F3A", "66", 0x1D, 0, "MRI",  "HM,V,I",      "xyz", "hvm", "" },
  { "vpmovzxwd",    "VE", "0F38", "66", 0x33, 0, "RM",   "V,HM",        "xyz", "hvm", "" },
  { "vpmovzxbd",    "VE", "0F38", "66", 0x31, 0, "RM",   "V,QM",        "xyz", "qvm", "" },
  { "vpmovzxbw",    "VE", "0F38", "66", 0x30, 0, "RM",   "V,HM",        "xyz", "hvm", "" },
  { "vpmovsxbd",    "VE", "0F38", "66", 0x21, 0, "RM",   "V,QM",        "xyz", "qvm", "" },
  { "vpmovsxbw",    "V",  "0F38", "66", 0x20, 0, "RM",   "V,HM",        "xy",  "-",   "" },
  { "vpmovdw",      "E",  "0F38", "F3", 0x33, 0, "MR",   "HM,V",        "xyz", "hvm", "" },
  { "vpmovdb",      "E",  "0F38", "F3", 0x31, 0, "MR",   "QM,V",        "xyz", "qvm", "" },
  -- lane moves and shuffles
  { "vextractf128", "V",  "0F3A", "66", 0x19, 0, "MRI",  "XM,V,I",      "y",   "-",   "" },
  { "vinsertf128",  "V",  "0F3A", "66", 0x18, 0, "RVMI", "V,V,XM,I",    "y",   "-",   "" },
  { "vpinsrw",      "V",  "0F",   "66", 0xC4, 0, "RVMI", "X,X,M16,I",   "x",   "-",   "" },
  { "vextractf32x4","E",  "0F3A", "66", 0x19, 0, "MRI",  "XM,V,I",      "yz",  "t4",  "" },
  { "vinsertf32x4", "E",  "0F3A", "66", 0x18, 0, "RVMI", "V,V,XM,I",    "yz",  "t4",  "" },
  { "vextractf64x4","E",  "0F3A", "66", 0x1B, 1, "MRI",  "HM,V,I",      "z",   "t4",  "" },
  { "vinsertf64x4", "E",  "0F3A", "66", 0x1A, 1, "RVMI", "V,V,HM,I",    "z",   "t4",  "" },
  { "vpermilps",    "VE", "0F3A", "66", 0x04, 0, "RMI",  "V,VM,I",      "xyz", "fv",  "b" },
  { "vpermq",       "V",  "0F3A", "66", 0x00, 1, "RMI",  "V,VM,I",      "y",   "-",   "" },
  { "vpermq",       "E",  "0F3A", "66", 0x00, 1, "RMI",  "V,VM,I",      "yz",  "fv",  "b" },
  { "vshufps",      "VE", "0F",   "",   0xC6, 0, "RVMI", "V,V,VM,I",    "xyz", "fv",  "b" },
  { "vunpcklps",    "VE", "0F",   "",   0x14, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  { "vunpckhps",    "VE", "0F",   "",   0x15, 0, "RVM",  "V,V,VM",      "xyz", "fv",  "b" },
  { "vshuff32x4",   "E",  "0F3A", "66", 0x23, 0, "RVMI", "V,V,VM,I",    "yz",  "fv",  "b" },
  { "vshuff64x2",   "E",  "0F3A", "66", 0x23, 1, "RVMI", "V,V,VM,I",    "yz",  "fv",  "b" },
  { "vperm2f128",   "V",  "0F3A", "66", 0x06, 0, "RVMI", "V,V,VM,I",    "y",   "-",   "" },
  { "vblendps",     "V",  "0F3A", "66", 0x0C, 0, "RVMI", "V,V,VM,I",    "xy",  "-",   "" },
  -- compares: VEX writes a vector, EVEX an opmask
  { "vcmpps",       "V",  "0F",   "",   0xC2, 0, "RVMI", "V,V,VM,I",    "xy",  "-",   "" },
  { "vcmpps",       "E",  "0F",   "",   0xC2, 0, "RVMI", "K,V,VM,I",    "xyz", "fv",  "b nozero" },
  { "vpcmpeqd",     "V",  "0F",   "66", 0x76, 0, "RVM",  "V,V,VM",      "xy",  "-",   "" },
  { "vpcmpeqd",     "E",  "0F",   "66", 0x76, 0, "RVM",  "K,V,VM",      "xyz", "fv",  "b nozero" },
  -- opmask instructions (VEX-encoded)
  { "kmovw",        "V",  "0F",   "",   0x90, 0, "RM",   "K,KM16",      "0",   "-",   "" },
  { "kmovw",        "V",  "0F",   "",   0x91, 0, "MR",   "M16,K",       "0",   "-",   "" },
  { "kmovw",        "V",  "0F",   "",   0x92, 0, "RM",   "K,R32",       "0",   "-",   "" },
  { "kmovw",        "V",  "0F",   "",   0x93, 0, "RM",   "R32,K",       "0",   "-",   "" },
  { "kortestw",     "V",  "0F",   "",   0x98, 0, "RM",   "K,K",         "0",   "-",   "" },
  { "kxnorw",       "V",  "0F",   "",   0x46, 0, "RVM",  "K,K,K",       "1",   "-",   "" },
  { "vzeroupper",   "V",  "0F",   "",   0x77, 0, "",     "",            "x",   "-",   "" },
}

local MAPS = { ["0F"] = 1, ["0F38"] = 2, ["0F3A"] = 3 }
local PPS = { [""] = 0, ["66"] = 1, ["F3"] = 2, ["F2"] = 3 }
local LENS = { x = 128, y = 256, z = 512 }

-- Split a string into its characters, or on commas when sep is given.
local function split(s, sep)
  local t = {}
  if sep then for p in s:gmatch("[^,]+") do t[#t + 1] = p end
  else for c in s:gmatch(".") do t[#t + 1] = c end end
  return t
end

-- Turn one OPS line into a row table with named, decoded fields.
local function parse_row(r)
  local row = { mn = r[1], vex = r[2]:find("V") ~= nil, evex = r[2]:find("E") ~= nil,
                map = MAPS[r[3]], pp = PPS[r[4]], op = r[5], w = r[6],
                roles = split(r[7]), kinds = split(r[8], ","), tuple = r[10],
                lens = {}, scalar = r[9] == "s" }
  assert(row.map and row.pp and #row.roles == #row.kinds, r[1])
  for c in r[9]:gmatch(".") do
    if LENS[c] then row.lens[LENS[c]] = true
    elseif c == "s" then row.lens[128] = true
    else row.lens[128] = true; row.lbit = tonumber(c) end
  end
  for f in r[11]:gmatch("%S+") do
    if f == "b" then row.bcst = true
    elseif f == "d" then row.swap = true
    elseif f == "nomask" then row.nomask = true
    elseif f == "nozero" then row.nozero = true
    elseif f:match("^/%d$") then row.ext = tonumber(f:sub(2))
    else error("x86: bad flag " .. f .. " in row " .. r[1]) end
  end
  return row
end

local ROWS, BY_MN = {}, {}
for _, r in ipairs(OPS) do
  local row = parse_row(r)
  ROWS[#ROWS + 1] = row
  BY_MN[row.mn] = BY_MN[row.mn] or {}
  table.insert(BY_MN[row.mn], row)
end
M.rows = ROWS

---------------------------------------------------------------------------
-- Operands

-- Raise an "x86: " error (no position prefix).
local function fail(fmt, ...) error("x86: " .. fmt:format(...), 0) end

local POW2 = {}
for k = 0, 40 do POW2[k] = 2 ^ k end

-- Bit k of a non-negative integer n.
local function bit(n, k) return floor(n / POW2[k]) % 2 end

-- True for a Lua number with an integral value.
local function isint(v) return type(v) == "number" and v == floor(v) end

-- Register name -> { class = vec/k/r64/r32, num, bits (vector size) }.
local REGS = {}
for i, n in ipairs({ "ax", "cx", "dx", "bx", "sp", "bp", "si", "di" }) do
  REGS["r" .. n] = { class = "r64", num = i - 1 }
  REGS["e" .. n] = { class = "r32", num = i - 1 }
end
for i = 8, 15 do
  REGS["r" .. i] = { class = "r64", num = i }
  REGS["r" .. i .. "d"] = { class = "r32", num = i }
end
for i = 0, 31 do
  REGS["xmm" .. i] = { class = "vec", num = i, bits = 128 }
  REGS["ymm" .. i] = { class = "vec", num = i, bits = 256 }
  REGS["zmm" .. i] = { class = "vec", num = i, bits = 512 }
end
for i = 0, 7 do REGS["k" .. i] = { class = "k", num = i } end
M.regs = REGS

-- Look up a register name; ctx names the instruction and operand for errors.
local function reg_info(name, ctx)
  local r = type(name) == "string" and REGS[name:lower()]
  if not r then fail("%s: unknown register '%s'", ctx, tostring(name)) end
  return r
end

-- A mask name "k1".."k7" -> number; k0 means "no mask" and is refused.
local function mask_num(s, ctx)
  local r = reg_info(s, ctx)
  if r.class ~= "k" or r.num == 0 then fail("%s: write mask must be k1-k7, got '%s'", ctx, s) end
  return r.num
end

-- A number as text: integers without a ".0" on Lua 5.4.
local function num_text(v)
  if isint(v) and math.abs(v) < 2 ^ 53 then return ("%d"):format(v) end
  return tostring(v)
end

-- Text of a memory table for error messages and assembler text.
local function mem_text(m)
  local s = ""
  if m.base then s = tostring(m.base) end
  if m.index then s = s .. (s ~= "" and "+" or "") .. tostring(m.index) .. "*" .. num_text(m.scale or 1) end
  local d = m.disp or 0
  if type(d) == "number" and (d ~= 0 or s == "") then
    if s == "" then s = num_text(d)
    else s = s .. (d < 0 and "-" or "+") .. num_text(math.abs(d)) end
  end
  return "[" .. s .. "]"
end

local MEM_KEYS = { base = true, index = true, scale = true, disp = true, bcst = true, mask = true }
local SCALES = { [1] = 0, [2] = 1, [4] = 2, [8] = 3 }

-- Validate a memory table -> { type = "mem", base, index (numbers), scale, disp, bcst, mask }.
local function parse_mem(m, ctx)
  for k in pairs(m) do
    if not MEM_KEYS[k] then fail("%s: unknown memory field '%s'", ctx, tostring(k)) end
  end
  local o = { type = "mem", scale = m.scale or 1, disp = m.disp or 0,
              bcst = m.bcst and true or false, mem = m }
  if m.base ~= nil then
    local r = reg_info(m.base, ctx)
    if r.class ~= "r64" then fail("%s: base '%s' is not a 64-bit general register", ctx, m.base) end
    o.base = r.num
  end
  if m.index ~= nil then
    local r = reg_info(m.index, ctx)
    if r.class ~= "r64" then fail("%s: index '%s' is not a 64-bit general register", ctx, m.index) end
    if r.num == 4 then fail("%s: rsp cannot be an index", ctx) end
    o.index = r.num
  end
  if not SCALES[o.scale] then fail("%s: scale %s is not 1, 2, 4 or 8", ctx, num_text(o.scale)) end
  if o.scale ~= 1 and not o.index then fail("%s: scale without an index", ctx) end
  if not isint(o.disp) or o.disp < -2 ^ 31 or o.disp >= 2 ^ 31 then
    fail("%s: displacement %s is not a signed 32-bit integer", ctx, num_text(o.disp))
  end
  if m.mask ~= nil then o.mask = mask_num(m.mask, ctx) end
  return o
end

-- Parse a register string with optional {kN}{z} decorations.
local function parse_reg(s, ctx)
  local name, deco = s:match("^%s*([%w]+)%s*(.-)%s*$")
  if not name then fail("%s: cannot parse operand", ctx) end
  local r = reg_info(name, ctx)
  local o = { type = "reg", class = r.class, num = r.num, bits = r.bits, name = name:lower() }
  while deco ~= "" do
    local d, rest = deco:match("^{%s*(%w+)%s*}%s*(.*)$")
    if not d then fail("%s: bad decoration '%s'", ctx, deco) end
    if d:lower() == "z" then o.zero = true else o.mask = mask_num(d, ctx) end
    deco = rest
  end
  if o.zero and not o.mask then fail("%s: {z} needs a write mask {k1}-{k7}", ctx) end
  return o
end

-- The context of operand i of mn in error messages, formatted only when an
-- error is raised (string.format's %s calls __tostring).
local CTX_MT = { __tostring = function(c)
  local v = c.v
  return ("%s: operand %d (%s)"):format(c.mn, c.i, type(v) == "table" and
    (v.reg and tostring(v.reg) or mem_text(v)) or tostring(v))
end }

-- The error context of operand v at position i of mn.
local function context(v, i, mn)
  return setmetatable({ v = v, i = i, mn = mn }, CTX_MT)
end

-- Register operands by their text: parsed once, shared (after parsing only
-- operand_sig writes a record, its cached signature text `sig`; a failed
-- parse raises and keeps nothing).
local REG_OPERANDS = {}

-- Turn one user operand (string, table or number) into an operand record.
local function parse_operand(v, i, mn)
  local o
  if type(v) == "number" then
    o = { type = "imm", value = v }
  elseif type(v) == "string" then
    o = REG_OPERANDS[v]
    if not o then
      o = parse_reg(v, context(v, i, mn))
      REG_OPERANDS[v] = o
    end
  elseif type(v) == "table" and v.reg ~= nil then
    local ctx = context(v, i, mn)
    o = parse_reg(tostring(v.reg), ctx)
    if v.mask ~= nil then o.mask = mask_num(v.mask, ctx) end
    if v.zero then o.zero = true end
    if o.zero and not o.mask then fail("%s: {z} needs a write mask {k1}-{k7}", ctx) end
  elseif type(v) == "table" then
    o = parse_mem(v, context(v, i, mn))
  else
    fail("%s: unsupported operand type %s", context(v, i, mn), type(v))
  end
  return o
end

---------------------------------------------------------------------------
-- Operand kinds

-- Vector register size a kind accepts at vector length L (nil: none).
local function kind_vec(kind, L)
  if kind == "V" or kind == "VM" then return L end
  if kind == "HM" or kind == "H" then return math.max(128, floor(L / 2)) end
  if kind == "QM" or kind == "X" or kind == "XM" or kind == "XM32" then return 128 end
end

-- Memory size in bytes a kind accepts at vector length L (nil: none).
local function kind_mem(kind, L)
  if kind == "VM" or kind == "M" then return floor(L / 8) end
  if kind == "HM" then return floor(L / 16) end
  if kind == "QM" then return floor(L / 32) end
  if kind == "XM" then return 16 end
  if kind == "M64" then return 8 end
  if kind == "XM32" or kind == "M32" or kind == "RM32" then return 4 end
  if kind == "KM16" or kind == "M16" then return 2 end
end

local VEC_NAMES = { [128] = "xmm", [256] = "ymm", [512] = "zmm" }

-- Describe what a kind accepts, for "expected ..." messages.
local function kind_text(kind, L)
  local t = {}
  local v = kind_vec(kind, L)
  if v then t[#t + 1] = VEC_NAMES[v] .. " register" end
  if kind == "K" or kind == "KM16" then t[#t + 1] = "opmask register" end
  if kind == "R32" or kind == "RM32" then t[#t + 1] = "32-bit general register" end
  local m = kind_mem(kind, L)
  if m then t[#t + 1] = ("%d-byte memory"):format(m) end
  if kind == "I" then t[#t + 1] = "imm8" end
  return table.concat(t, " or ")
end

-- Does operand o fit kind at vector length L?
local function kind_ok(kind, o, L)
  if o.type == "imm" then return kind == "I" end
  if o.type == "mem" then return kind_mem(kind, L) ~= nil end
  if o.class == "vec" then return kind_vec(kind, L) == o.bits end
  if o.class == "k" then return kind == "K" or kind == "KM16" end
  if o.class == "r32" then return kind == "R32" or kind == "RM32" end
  return false
end

---------------------------------------------------------------------------
-- Matching an instruction against a row

-- " and MN has no EVEX form" when the row cannot fall back to EVEX.
local function no_evex(row, mn)
  return row.evex and "" or (" and %s has no EVEX form"):format(mn)
end

-- Check operands against row in one encoding; returns a match, or nil and a
-- score (how far the operands got: count, kinds, then the rest), position and
-- reason (a string, or a function making it: most failures are never shown).
local function attempt(row, evex, ops, mn)
  local n = #row.kinds
  if #ops ~= n then return nil, 0, 0, function() return ("takes %d operands, got %d"):format(n, #ops) end end
  local L, lpos = 128, 0
  for i = 1, n do
    local k, o = row.kinds[i], ops[i]
    if (k == "V" or k == "VM") and o.class == "vec" then L, lpos = o.bits, i; break end
  end
  for i = 1, n do
    if not kind_ok(row.kinds[i], ops[i], L) then
      return nil, 100 + i, i, function() return "expected " .. kind_text(row.kinds[i], L) end
    end
  end
  if not evex and L == 512 then return nil, 200 + lpos, lpos, "zmm needs EVEX" .. no_evex(row, mn) end
  if not row.lens[L] then
    return nil, 200 + lpos, lpos, function()
      local ok = {}
      for _, b in ipairs({ 128, 256, 512 }) do
        if row.lens[b] and (evex or b < 512) then ok[#ok + 1] = tostring(b) end
      end
      return ("vector length %d not supported (only %s)"):format(L, table.concat(ok, ", "))
    end
  end
  for i = 1, n do
    local o = ops[i]
    if o.mask then
      if i ~= 1 then return nil, 200 + i, i, "only the destination may be masked" end
      if not evex then return nil, 200 + i, i, "masking needs EVEX" .. no_evex(row, mn) end
      if row.nomask then return nil, 200 + i, i, "write-masking not supported" end
      if o.zero and (o.type == "mem" or row.nozero) then
        return nil, 200 + i, i, "zeroing-masking {z} not allowed here"
      end
    end
    if o.bcst then
      if not evex then return nil, 200 + i, i, "broadcast needs EVEX" .. no_evex(row, mn) end
      if not row.bcst then return nil, 200 + i, i, "embedded broadcast not allowed" end
    end
    if o.type == "reg" and o.num >= 16 and not evex then
      return nil, 200 + i, i, "registers 16-31 need EVEX" .. no_evex(row, mn)
    end
    if o.type == "imm" and (not isint(o.value) or o.value < -128 or o.value > 255) then
      return nil, 200 + i, i, "immediate out of range -128..255"
    end
  end
  return { row = row, evex = evex, ops = ops, L = L }
end

local EVEX_TRIES = { false, true }

-- What attempt() reads of an operand, as text: class, size, a register of
-- 16-31, mask, zeroing, broadcast, an imm8 out of range.
local function operand_sig(o)
  if o.type == "imm" then return (isint(o.value) and o.value >= -128 and o.value <= 255) and "i" or "i!" end
  if o.type == "mem" then return "m" .. (o.bcst and "b" or "") .. (o.mask and "k" or "") end
  local s = o.sig
  if not s then
    s = o.class .. (o.bits or "") .. (o.num >= 16 and "+" or "")
    o.sig = s
  end
  return s .. (o.mask and "k" or "") .. (o.zero and "z" or "")
end

-- Successful matches by signature (mnemonic, {evex}, operand sigs): the row,
-- encoding and length that the search over rows chose for them.
local MATCHES = {}

-- Search the rows of name for the first that fits ops, VEX first; raises the
-- failure that got furthest.
local function search(name, force, ops, args)
  local rows = BY_MN[name]
  -- report the failure that got furthest; on a tie the EVEX try of the same row
  local best_score, best_pos, best_why, best_row = -1, 0, nil, nil
  for _, row in ipairs(rows) do
    for _, evex in ipairs(EVEX_TRIES) do
      if (evex and row.evex) or (not evex and row.vex and not force) then
        local m, score, pos, why = attempt(row, evex, ops, name)
        if m then return m end
        if score > best_score or (score == best_score and row == best_row) then
          best_score, best_pos, best_why, best_row = score, pos, why, row
        end
      end
    end
  end
  if force and best_why == nil then fail("%s: has no EVEX form", name) end
  if type(best_why) == "function" then best_why = best_why() end
  if best_pos == 0 then fail("%s: %s", name, best_why) end
  fail("%s: %s", context(args[best_pos], best_pos, name), best_why)
end

-- Parse the operands and find the first row/encoding that fits, VEX first.
local function match(mn, ...)
  if type(mn) ~= "string" then fail("mnemonic must be a string, got %s", type(mn)) end
  local force = false
  local name = mn:match("^%s*{evex}%s*(%S+)%s*$")
  if name then force = true else name = mn:match("^%s*(%S+)%s*$") or mn end
  name = name:lower()
  if not BY_MN[name] then fail("unknown instruction '%s'", mn) end
  local args = { ... }
  local ops, sig = {}, { force and "{evex}" .. name or name }
  for i = 1, select("#", ...) do
    ops[i] = parse_operand(args[i], i, name)
    sig[i + 1] = operand_sig(ops[i])
  end
  sig = table.concat(sig, ",")
  local hit = MATCHES[sig]
  if not hit then
    local m = search(name, force, ops, args)
    hit = { row = m.row, evex = m.evex, L = m.L }
    MATCHES[sig] = hit
  end
  return { row = hit.row, evex = hit.evex, ops = ops, L = hit.L, force = force, mn = name }
end

---------------------------------------------------------------------------
-- Encoding forms

-- EVEX disp8 scale N for the row's tuple type at length L.
local function disp8_scale(row, L, bcst)
  local elem = row.w == 1 and 8 or 4
  local t = row.tuple
  if t == "fv" then return bcst and elem or floor(L / 8) end
  if t == "hvm" then return floor(L / 16) end
  if t == "qvm" then return floor(L / 32) end
  if t == "t1s" then return elem end
  if t == "t4" then return 4 * elem end
  return 1
end

-- Append n little-endian bytes of the signed integer v to out.
local function put_le(out, v, n)
  v = v % 2 ^ (8 * n)
  for _ = 1, n do
    out[#out + 1] = v % 256
    v = floor(v / 256)
  end
end

-- ModRM, optional SIB and displacement for ModRM.reg = reg and r/m operand rm;
-- N is the EVEX disp8 scale (1 for VEX).
local function modrm(out, reg, rm, N)
  if rm.type == "reg" then
    out[#out + 1] = 0xC0 + reg % 8 * 8 + rm.num % 8
    return
  end
  local base, index, disp = rm.base, rm.index, rm.disp
  local mod, dsize = 2, 4
  if base == nil then
    mod, dsize = 0, 4                                   -- [index*s + disp32] / [disp32]
  elseif disp == 0 and base % 8 ~= 5 then
    mod, dsize = 0, 0                                   -- rbp/r13 need an explicit disp8 0
  elseif disp % N == 0 and disp / N >= -128 and disp / N <= 127 then
    mod, dsize, disp = 1, 1, floor(disp / N)            -- (compressed) disp8
  end
  if index == nil and base ~= nil and base % 8 ~= 4 then
    out[#out + 1] = mod * 64 + reg % 8 * 8 + base % 8
  else                                                  -- SIB: rsp/r12 base, index, or no base
    out[#out + 1] = mod * 64 + reg % 8 * 8 + 4
    out[#out + 1] = SCALES[rm.scale] * 64 + (index or 4) % 8 * 8 + (base or 5) % 8
  end
  if dsize > 0 then put_le(out, disp, dsize) end
end

-- VEX prefix: the 2-byte C5 form when X, B and W are 0 and the map is 0F, else C4.
local function vex_prefix(out, R, X, B, map, W, vvvv, L, pp)
  if X == 0 and B == 0 and W == 0 and map == 1 then
    out[#out + 1] = 0xC5
    out[#out + 1] = (1 - R) * 128 + (15 - vvvv) * 8 + L * 4 + pp
  else
    out[#out + 1] = 0xC4
    out[#out + 1] = (1 - R) * 128 + (1 - X) * 64 + (1 - B) * 32 + map
    out[#out + 1] = W * 128 + (15 - vvvv) * 8 + L * 4 + pp
  end
end

-- EVEX prefix 62 P0 P1 P2; R2 is EVEX.R' (bit 4 of ModRM.reg), vvvv is 0..31.
local function evex_prefix(out, R, X, B, R2, map, W, vvvv, pp, z, LL, b, aaa)
  out[#out + 1] = 0x62
  out[#out + 1] = (1 - R) * 128 + (1 - X) * 64 + (1 - B) * 32 + (1 - R2) * 16 + map
  out[#out + 1] = W * 128 + (15 - vvvv % 16) * 8 + 4 + pp
  out[#out + 1] = z * 128 + LL * 32 + b * 16 + (1 - bit(vvvv, 4)) * 8 + aaa
end

-- Encode a match into a byte string.
local function emit(m)
  local row, ops = m.row, m.ops
  local reg, vvvv, rm, imm = row.ext or 0, 0, nil, nil
  for i, role in ipairs(row.roles) do
    local o = ops[i]
    if role == "R" then reg = o.num
    elseif role == "V" then vvvv = o.num
    elseif role == "M" then rm = o
    elseif role == "I" then imm = o.value end
  end
  local op = row.op
  -- GNU as uses the store opcode for a VEX reg-reg move when that avoids C4.
  if row.swap and not m.evex and rm.type == "reg" and rm.num >= 8 and reg < 8 then
    reg, rm, op = rm.num, { type = "reg", num = reg }, op + 1
  end
  local R, R2, X, B = bit(reg, 3), bit(reg, 4), 0, 0
  if rm and rm.type == "reg" then
    B, X = bit(rm.num, 3), bit(rm.num, 4)
  elseif rm then
    B, X = rm.base and bit(rm.base, 3) or 0, rm.index and bit(rm.index, 3) or 0
  end
  local out = {}
  local N = 1
  if m.evex then
    local dst = ops[1]
    local bcst = rm and rm.type == "mem" and rm.bcst
    local LL = row.scalar and 0 or ({ [128] = 0, [256] = 1, [512] = 2 })[m.L]
    evex_prefix(out, R, X, B, R2, row.map, row.w, vvvv, row.pp, dst.zero and 1 or 0, LL,
                bcst and 1 or 0, dst.mask or 0)
    N = disp8_scale(row, m.L, bcst)
  else
    local L = row.lbit or ((row.scalar or m.L == 128) and 0 or 1)
    vex_prefix(out, R, X, B, row.map, row.w, vvvv, L, row.pp)
  end
  out[#out + 1] = op
  if rm then modrm(out, reg, rm, N) end
  if imm then out[#out + 1] = imm % 256 end
  return string.char(unpack(out))
end

---------------------------------------------------------------------------
-- Public API

-- Encode one instruction; returns its bytes as a Lua string.
function M.encode(mn, ...)
  return emit(match(mn, ...))
end

local PTR = { [2] = "word", [4] = "dword", [8] = "qword", [16] = "xmmword",
              [32] = "ymmword", [64] = "zmmword" }

-- One operand of a match in GNU as Intel syntax.
local function operand_text(m, i)
  local o, kind = m.ops[i], m.row.kinds[i]
  local s
  if o.type == "imm" then return ("%d"):format(o.value) end
  if o.type == "reg" then
    s = o.name
  else
    local size = kind_mem(kind, m.L)
    local elem = m.row.w == 1 and 8 or 4
    s = PTR[o.bcst and elem or size] .. " ptr " .. mem_text(o.mem)
    if o.bcst then s = s .. ("{1to%d}"):format(floor(m.L / 8 / elem)) end
  end
  if o.mask then s = s .. ("{k%d}"):format(o.mask) end
  if o.zero then s = s .. "{z}" end
  return s
end

-- A match as GNU as Intel-syntax text (with "{evex} " when forced).
local function text_of(m)
  local t = {}
  for i = 1, #m.ops do t[i] = operand_text(m, i) end
  local s = (m.force and "{evex} " or "") .. m.mn
  if #t > 0 then s = s .. " " .. table.concat(t, ", ") end
  return s
end

-- The instruction as GNU as Intel-syntax text.
function M.text(mn, ...)
  return text_of(match(mn, ...))
end

-- "0x62,0xf1,..." for a byte string.
function M.hex(bytes)
  if #bytes == 0 then return "" end
  return (("0x%02x,"):rep(#bytes - 1) .. "0x%02x"):format(bytes:byte(1, -1))
end

-- ".byte 0x62,0xf1,..." : one line of assembler text.
function M.byte_line(bytes)
  return ".byte " .. M.hex(bytes)
end

-- Encode and format as a .byte line in one call.
function M.line(mn, ...)
  return M.byte_line(M.encode(mn, ...))
end

-- Operand-table fields in the order of a memo key (x86.line_text).
local OPERAND_FIELDS = { "reg", "mask", "zero", "base", "index", "scale", "disp", "bcst" }
local OPERAND_FIELD = {}
for _, k in ipairs(OPERAND_FIELDS) do OPERAND_FIELD[k] = true end

-- An operand-table field that may enter a key as it is (nil: written as "").
local KEY_TYPES = { string = true, number = true }

-- The memo key of one operand, or nil when it is not plain: a table with a
-- field outside OPERAND_FIELDS or a value that is neither string nor number
-- (zero and bcst count as flags).
local function operand_key(v)
  local t = type(v)
  if t == "string" then return v end
  if t == "number" then return "#" .. v end
  if t ~= "table" then return nil end
  for k, x in next, v do
    if not OPERAND_FIELD[k] then return nil end
    if k ~= "zero" and k ~= "bcst" and not KEY_TYPES[type(x)] then return nil end
  end
  return "{" .. (v.reg or "") .. "," .. (v.mask or "") .. "," .. (v.zero and "z" or "") .. ","
    .. (v.base or "") .. "," .. (v.index or "") .. "," .. (v.scale or "") .. "," .. (v.disp or "")
    .. "," .. (v.bcst and "b" or "") .. "}"
end

-- The memo key of an instruction, or nil when an operand is not plain (its
-- error is then raised by matching, never skipped by a memo hit).
local function memo_key(mn, ...)
  local n = select("#", ...)
  if n <= 3 then
    local a, b, c = ...
    local ka = n < 1 and "" or operand_key(a)
    local kb = n < 2 and "" or operand_key(b)
    local kc = n < 3 and "" or operand_key(c)
    if not (ka and kb and kc) then return nil end
    return mn .. "|" .. n .. "|" .. ka .. "|" .. kb .. "|" .. kc
  end
  local t = { mn, n }
  for i = 1, n do
    local k = operand_key((select(i, ...)))
    if not k then return nil end
    t[#t + 1] = k
  end
  return table.concat(t, "|")
end

-- Instructions already encoded, per form: bounded memos, each emptied when it
-- reaches LINE_MEMO_MAX entries.
local LINE_MEMO_MAX = 8192
local text_memo, bytes_memo = { t = {}, n = 0 }, { t = {}, n = 0 }

-- Keep v under key k in memo c (k nil: the operands cannot be keyed, so
-- nothing is kept); returns v.
local function keep(c, k, v)
  if k then
    if c.n >= LINE_MEMO_MAX then c.t, c.n = {}, 0 end
    c.t[k], c.n = v, c.n + 1
  end
  return v
end

-- x86.line and x86.text of one instruction from a single match, memoized:
-- kernels of one isa share most of their instructions.
function M.line_text(mn, ...)
  local k = memo_key(mn, ...)
  local hit = k and text_memo.t[k]
  if not hit then
    local m = match(mn, ...)
    hit = keep(text_memo, k, { M.byte_line(emit(m)), text_of(m) })
  end
  return hit[1], hit[2]
end

-- The bytes of one instruction, memoized (for sources that pack them).
function M.bytes_cached(mn, ...)
  local k = memo_key(mn, ...)
  return k and bytes_memo.t[k] or keep(bytes_memo, k, emit(match(mn, ...)))
end

return M
