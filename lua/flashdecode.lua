-- flashdecode for LuaJIT: decode-phase attention on CPU arrays through the FFI.
--
--   local fd = require "flashdecode"
--   local ctx = fd.context { threads = 2 }                     -- backend, table, cache_dir, isa_limit
--   local plan = ctx:plan { batch = 1, n_q_heads = 8, n_kv_heads = 2, head_dim = 64, kv_len = 300,
--                           q_dtype = "bf16", kv_dtype = "bf16", out_dtype = "bf16" }
--   local q, out = fd.array("bf16", 8 * 64, 0.5), fd.array("bf16", 8 * 64)
--   local k, v = fd.array("bf16", 2 * 300 * 64), fd.array("bf16", 2 * 300 * 64)
--   plan:run { q = q, k = k, v = v, cur_pos = { 299 }, out = out }
--   print(fd.totable(out)[1], plan:info().key)
-- Shape features by name (fd.FEATURES): ctx:plan { ..., features = { "alibi", "sink_logits" } },
-- then plan:run { ..., alibi_slopes = slopes, sink_logits = logits } ([n_q_heads] f32 arrays or Lua lists).
--
-- Every failure is a Lua error (a string): the library's fd_errmsg sentence with
-- the call and the code, e.g. "flashdecode: fd_run: args.cur_pos[0] is 300,
-- outside 0..299 (kv_len - 1) (FD_EINVAL, code -1)"; a misspelled field, a bad
-- dtype name or an array of the wrong dtype or size is an error naming the field.
-- fd.error_code(err) reads the code back. Nothing is written to out on failure.
--
-- Where the declarations and the library come from (the first found is used):
--   header:  $FD_HEADER; $FD_INCLUDE_DIR/flashdecode.h; <root>/runtime/flashdecode.h
--            when this file is <root>/lua/flashdecode.lua (the source tree); the
--            installed include dir below; /usr/local/include; /usr/include
--   library: $FD_LIB (only it, when set); <root>/build/libflashdecode.so; the
--            installed lib dir below; the dynamic loader's libflashdecode.so.0
-- The header is parsed at load time (directives dropped, #define values kept in
-- fd.defines), so the binding always follows the installed header; the library's
-- version must equal the header's FD_VERSION.
-- `make install` copies this file through sed, which replaces the at-sign
-- placeholders INCLUDEDIR and LIBDIR in the next two lines with the real dirs.
local INSTALLED_INCLUDEDIR = "@INCLUDEDIR@"
local INSTALLED_LIBDIR = "@LIBDIR@"

local ffi = require("ffi")
local bit = require("bit")
local M = {}

-- ---------------------------------------------------------------------------
-- Locations
-- ---------------------------------------------------------------------------

-- True when path names a readable file.
local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

-- The source-tree root when this file is <root>/lua/flashdecode.lua (with
-- <root>/runtime/flashdecode.h beside it), else nil.
local function source_root()
  local src = debug.getinfo(1, "S").source:gsub("^@", "")
  local dir = src:match("^(.*)/[^/]*$") or "."
  local root = dir == "lua" and "." or dir:match("^(.*)/lua$") or (dir .. "/..")
  if root == "" then root = "/" end
  return exists(root .. "/runtime/flashdecode.h") and root or nil
end

-- A placeholder value as a directory, or nil while the file is not installed.
local function installed(dir) return dir:sub(1, 1) ~= "@" and dir or nil end

-- The header's path: $FD_HEADER, else the first existing candidate; an error lists them all.
local function find_header(root)
  local env, inc = os.getenv("FD_HEADER"), os.getenv("FD_INCLUDE_DIR")
  if env and env ~= "" then return env end
  local tried, dirs = {}, {}
  for _, dir in ipairs { inc ~= "" and inc or false, root and (root .. "/runtime") or false,
                        installed(INSTALLED_INCLUDEDIR) or false, "/usr/local/include", "/usr/include" } do
    if dir then dirs[#dirs + 1] = dir end
  end
  for _, dir in ipairs(dirs) do
    local p = dir .. "/flashdecode.h"
    if exists(p) then return p end
    tried[#tried + 1] = p
  end
  error("flashdecode: cannot find flashdecode.h (tried " .. table.concat(tried, ", ") ..
        "); set FD_HEADER or FD_INCLUDE_DIR, or install the library (`make install`)", 0)
end

-- The library candidates in order: $FD_LIB alone, else the source tree's build,
-- the installed lib dir, the dynamic loader's search path.
local function lib_candidates(root)
  local env = os.getenv("FD_LIB")
  if env and env ~= "" then return { env } end
  local c = {}
  if root and exists(root .. "/build/libflashdecode.so") then c[#c + 1] = root .. "/build/libflashdecode.so" end
  local libdir = installed(INSTALLED_LIBDIR)
  if libdir and exists(libdir .. "/libflashdecode.so.0") then c[#c + 1] = libdir .. "/libflashdecode.so.0" end
  c[#c + 1] = "libflashdecode.so.0"
  return c
end

M.root = source_root()
M.paths = { root = M.root, header = find_header(M.root) }

-- ---------------------------------------------------------------------------
-- The header
-- ---------------------------------------------------------------------------

-- Read a whole file, or raise an error naming it.
local function read_file(path)
  local f, err = io.open(path, "rb")
  if not f then error("flashdecode: cannot read " .. tostring(err), 0) end
  local s = f:read("*a")
  f:close()
  return s
end

-- A #define's value as Lua: a string, a number, a list of numbers ({ .. }), or the raw text.
local function define_value(v)
  v = v:gsub("/%*.-%*/", ""):gsub("^%s+", ""):gsub("%s+$", "")
  local str = v:match('^"(.*)"$')
  if str then return str end
  if tonumber(v) then return tonumber(v) end
  local inner = v:match("^{(.*)}$")
  if inner then
    local t = {}
    for x in inner:gmatch("[^,]+") do t[#t + 1] = tonumber(x) or x:match("^%s*(.-)%s*$") end
    return t
  end
  return v
end

-- Split C header text into cdef-able declarations (every directive dropped,
-- the __cplusplus block skipped) and its #define values.
function M.parse_header(text)
  text = text:gsub("\\\r?\n", " ")                      -- join continued lines
  local out, defines, skip = {}, {}, 0
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    local dir = line:match("^%s*#%s*(%a+)")
    if skip > 0 then
      if dir == "if" or dir == "ifdef" or dir == "ifndef" then skip = skip + 1
      elseif dir == "endif" then skip = skip - 1 end
    elseif dir == "ifdef" and line:match("__cplusplus") then
      skip = 1                                             -- the extern "C" wrapper
    elseif dir == "define" then
      local name, val = line:match("^%s*#%s*define%s+([%w_]+)%s+(.+)$")
      if name then defines[name] = define_value(val) end
    elseif not dir then
      out[#out + 1] = line
    end
  end
  return table.concat(out, "\n"), defines
end

M.cdef_text, M.defines = M.parse_header(read_file(M.paths.header))
M.version = M.defines.FD_VERSION
-- Declared once per process (a second copy of this module reuses the types).
if not pcall(ffi.typeof, "fd_plan_info") then ffi.cdef(M.cdef_text) end
for _, decl in ipairs { "void *aligned_alloc(size_t alignment, size_t size);", "void free(void *ptr);" } do
  pcall(ffi.cdef, decl)                                    -- unless declared already
end

-- Return codes by name ("EINVAL" = -1) and names by code, from the header's enum.
M.codes, M.code_names = { OK = 0 }, { [0] = "FD_OK" }
for name, v in M.cdef_text:gmatch("FD_(E%u+)%s*=%s*(%-?%d+)") do
  M.codes[name], M.code_names[tonumber(v)] = tonumber(v), "FD_" .. name
end

-- ---------------------------------------------------------------------------
-- The library
-- ---------------------------------------------------------------------------

-- The library's version from its tuned-table header ("library\t0.1.0"), or nil.
local function library_version(lib)
  local buf = ffi.new("char[8192]")
  local ok, n = pcall(function() return lib.fd_tuned_table_header(buf, 8192) end)
  if not ok or n < 0 then return nil end
  return ffi.string(buf, n):match("\nlibrary\t([^\n]+)")
end

-- Load the shared library (once, the first candidate that loads); the error
-- lists every attempt and how to build or point at the library.
function M.load()
  if M.lib then return M.lib end
  -- (libflashdecode exports only the header's functions and links its Lua 5.4
  -- internally, so LuaJIT's own lua_* symbols cannot capture its calls.)
  local tried = {}
  for _, path in ipairs(lib_candidates(M.root)) do
    local ok, lib = pcall(ffi.load, path)
    if ok then
      local v = library_version(lib)
      if v and v ~= M.version then
        error(("flashdecode: %s is version %s but %s declares %s; set FD_LIB or FD_HEADER"):format(
              path, v, M.paths.header, tostring(M.version)), 0)
      end
      M.lib, M.paths.lib = lib, path
      return lib
    end
    tried[#tried + 1] = ("%s (%s)"):format(path, lib)
  end
  error("flashdecode: cannot load libflashdecode; tried " .. table.concat(tried, "; ") ..
        ". Build it with `make lib` in the source tree, set FD_LIB, or `make install`", 0)
end

-- ---------------------------------------------------------------------------
-- Names and fields
-- ---------------------------------------------------------------------------

-- The shared facts (enum names, dtype sizes, ISA records): gen/facts.lua, from
-- the source tree, else its installed copy flashdecode_facts.lua.
local function load_facts()
  local root = source_root()
  if root and exists(root .. "/gen/facts.lua") then return dofile(root .. "/gen/facts.lua") end
  local ok, facts = pcall(require, "flashdecode_facts")
  if ok then return facts end
  error("flashdecode: cannot find gen/facts.lua or flashdecode_facts.lua (install the module with `make install`)", 0)
end
local facts = load_facts()
M.facts = facts

-- Names of an enum table of gen/facts.lua mapped to the C constants; with aliases.
local function enum_names(t, aliases)
  local out = {}
  for i = 0, #t do out[t[i].name] = t[i].enum end
  for alias, name in pairs(aliases or {}) do out[alias] = out[name] end
  return out
end

-- String names of the header's enums, mapped to the C enum constants.
local ENUMS = {
  dtype = enum_names(facts.dtypes, { int8 = "i8", fp8_e4m3 = "fp8", fp8_e5m2 = "e5m2" }),
  mask_mode = enum_names(facts.mask_modes),
  layout = enum_names(facts.layouts),
  backend = { tcc = "FD_BACKEND_TCC", cc = "FD_BACKEND_CC" },
  isa = enum_names(facts.isas),
}
ENUMS.isa.auto = "FD_ISA_AUTO"
M.ISA_NAMES = facts.names(facts.isas)              -- by tiling-key isa digit
M.DTYPE_NAMES = facts.names(facts.dtypes)          -- by fd_dtype value
M.DTYPE_SIZE = {}                                  -- bytes per element, by fd_dtype value (q8_0 34/32)
for i = 0, #facts.dtypes do M.DTYPE_SIZE[i] = facts.elem_bytes(i) end

-- The accepted names of an enum kind, sorted, for messages.
local function names_of(kind)
  local t = {}
  for n in pairs(ENUMS[kind]) do t[#t + 1] = n end
  table.sort(t)
  return table.concat(t, ", ")
end

-- The numeric value of an enum given by name ("f16", any case) or number, or
-- nil and a message naming the field (default: the kind).
local function enum_value(kind, v, field)
  if type(v) == "number" then return v end
  local c = type(v) == "string" and ENUMS[kind][v:lower()]
  if not c then
    return nil, ("flashdecode: %s: unknown %s %s (one of: %s)"):format(field or kind, kind,
                 type(v) == "string" and ("'" .. v .. "'") or type(v), names_of(kind))
  end
  return tonumber(ffi.C[c])           -- enum constants are reachable through any namespace
end

-- The numeric value of an enum by name or number; an unknown name is an error naming field (or kind).
function M.enum(kind, v, field)
  if not ENUMS[kind] then error("flashdecode: unknown enum kind " .. tostring(kind), 2) end
  local n, err = enum_value(kind, v, field)
  if not n then error(err, 2) end
  return n
end

-- nil, or a message naming the first key of t missing from the set known ("what: unknown field 'x'").
local function unknown_field(t, known, what)
  for k in pairs(t) do
    if not known[k] then
      local list = {}
      for n in pairs(known) do list[#list + 1] = n end
      table.sort(list)
      return ("flashdecode: %s: unknown field '%s' (fields: %s)"):format(what, tostring(k), table.concat(list, ", "))
    end
  end
end

-- A set from a list of names.
local function set(list)
  local s = {}
  for _, n in ipairs(list) do s[n] = true end
  return s
end

-- v as an integer for field, or nil and why (nil v: the default d, or "required" when d is nil).
local function integer(v, field, d)
  if v == nil then v = d end
  if v == nil then return nil, ("flashdecode: %s is required"):format(field) end
  if type(v) ~= "number" or v ~= math.floor(v) then
    return nil, ("flashdecode: %s: expected an integer, got %s"):format(field, type(v) == "number" and v or type(v))
  end
  return v
end

-- fd_errmsg of a context (or of fd_create failures with ctx nil) as a Lua string.
function M.errmsg(ctx)
  local s = M.load().fd_errmsg(ctx)
  return s ~= nil and ffi.string(s) or ""
end

-- The error text of a failed call: "flashdecode: <what>: <message> (FD_E..., code N)".
local function failure(rc, ctx, what)
  return ("flashdecode: %s: %s (%s, code %d)"):format(what, M.errmsg(ctx), M.code_names[rc] or "?", rc)
end

-- Raise the failure's error unless rc is 0; returns rc. level: as error()'s,
-- counted from the caller of check (default 1: that caller).
function M.check(rc, ctx, what, level)
  rc = tonumber(rc)
  if rc ~= 0 then error(failure(rc, ctx, what or "flashdecode"), (level or 1) + 1) end
  return rc
end

-- The code of an error raised by this module (and its name), or nil.
function M.error_code(err)
  local name, code = tostring(err):match("%((FD_E%u+), code (%-?%d+)%)$")
  return tonumber(code), name
end

-- ---------------------------------------------------------------------------
-- Low level: fd_* structs from tables, C handles (the tuner and bench use these)
-- ---------------------------------------------------------------------------

-- fd_config fields: how each is set from a Lua value (enum kind, "int" or "string").
local CONFIG_FIELDS = { threads = "int", backend = "backend", table = "string", cache_dir = "string", isa_limit = "isa",
                        deterministic = "int", precision = "int" }
-- fd_plan_opts fields, likewise.
local OPTS_FIELDS = { chunk = "int", group_tile = "int", splits = "int", threads = "int", isa = "isa", planes = "int",
                      precision = "int" }

-- Fill struct cd from table t by the field kinds; nil and why on an unknown
-- field or a bad value. Strings must outlive the struct's use (the caller keeps t).
local function fill(cd, t, kinds, what)
  local bad = unknown_field(t, kinds, what)
  if bad then return nil, bad end
  for k, v in pairs(t) do
    local kind, x, err = kinds[k], v, nil
    if kind == "int" then x, err = integer(v, what .. "." .. k)
    elseif kind == "string" then
      if type(v) ~= "string" then err = ("flashdecode: %s.%s: expected a string, got %s"):format(what, k, type(v)) end
    else x, err = enum_value(kind, v, what .. "." .. k) end
    if err then return nil, err end
    cd[k] = x
  end
  return cd
end

-- A context handle from a table of fd_config fields { threads, backend ("tcc"|"cc"),
-- table, cache_dir, isa_limit ("auto" or an isa name of M.ISA_NAMES, or the FD_ISA_* number),
-- deterministic (1: batch-invariant results, fd_config.deterministic), precision (1:
-- FD_PRECISION_FAST: bf16 weights in P.V, 2 MSD planes for int8 K, where a kernel serves it) };
-- missing fields are zero. Destroyed at collection. Or nil and why.
local function make_ctx(t)
  local lib = M.load()
  local cfg, err = fill(ffi.new("fd_config"), t, CONFIG_FIELDS, "context")
  if not cfg then return nil, err end
  local ctx = lib.fd_create(cfg)
  if ctx == nil then return nil, "flashdecode: fd_create: " .. M.errmsg(nil) end
  return ffi.gc(ctx, lib.fd_destroy)
end

-- A context handle (see make_ctx); a bad field or a failure is an error.
function M.create(t)
  local h, err = make_ctx(t or {})
  if not h then error(err, 2) end
  return h
end

-- Destroy a context handle now (instead of at garbage collection).
function M.destroy(ctx)
  M.load().fd_destroy(ffi.gc(ctx, nil))
end

-- fd_shape fields (gen/facts.lua SHAPE_FIELDS) with their defaults (nil:
-- required or derived in make_shape); enum fields take value names.
local ENUM_KIND = { dtypes = "dtype", mask_modes = "mask_mode", layouts = "layout" }
local NO_DEFAULT = set { "n_q_heads", "n_kv_heads", "head_dim", "kv_len", "kv_dtype", "out_dtype" }
local SHAPE_INTS, SHAPE_ENUMS, SHAPE_FLOATS, shape_names = {}, {}, {}, {}
for _, f in ipairs(facts.SHAPE_FIELDS) do
  local default = nil
  if not NO_DEFAULT[f[1]] then default = f[3] and facts[f[3]][0].name or (f[1] == "batch" and 1 or 0) end
  if f[3] then SHAPE_ENUMS[#SHAPE_ENUMS + 1] = { f[1], ENUM_KIND[f[3]], default }
  elseif f[2] == "float" then SHAPE_FLOATS[#SHAPE_FLOATS + 1] = f[1]
  else SHAPE_INTS[#SHAPE_INTS + 1] = { f[1], default } end
  shape_names[#shape_names + 1] = f[1]
end
M.SHAPE_FIELDS = set(shape_names)
-- fd_shape.features bits by name (gen/facts.lua features: "alibi" = FD_ALIBI, ...).
M.FEATURES = {}
for _, f in ipairs(facts.features or {}) do M.FEATURES[f.name] = f.bit end

-- The fd_shape.features bits of v: a number, a feature name (any case) or a
-- list of names and numbers; or nil and a message naming the field.
local function feature_bits(v)
  if type(v) ~= "table" then v = { v } end
  local bits = 0
  for _, x in ipairs(v) do
    local b = type(x) == "string" and M.FEATURES[x:lower()] or x
    if type(b) ~= "number" or b < 0 or b ~= math.floor(b) then
      local names = {}
      for n in pairs(M.FEATURES) do names[#names + 1] = n end
      table.sort(names)
      return nil, ("flashdecode: features: unknown feature %s (one of: %s, or the FD_* bits as a number)"):format(
        type(x) == "string" and ("'" .. x .. "'") or tostring(x), table.concat(names, ", "))
    end
    bits = bit.bor(bits, b)
  end
  return bits
end

-- An fd_shape from a table with fd_shape's field names (other keys ignored),
-- or nil and why. Defaults: batch 1, n_kv_heads = n_q_heads, q_dtype f32,
-- kv_dtype and out_dtype = q_dtype, causal, bhsd. features: see feature_bits.
local function make_shape(t)
  local s = ffi.new("fd_shape")
  local d = { n_kv_heads = t.n_q_heads, kv_dtype = t.q_dtype or "f32", out_dtype = t.q_dtype or "f32" }
  for _, f in ipairs(SHAPE_INTS) do
    local v, err = t[f[1]], nil
    if f[1] == "features" and v ~= nil then v, err = feature_bits(v) end
    if err then return nil, err end
    local x
    x, err = integer(v, f[1], f[2] or d[f[1]])
    if not x then return nil, err end
    s[f[1]] = x
  end
  for _, f in ipairs(SHAPE_ENUMS) do
    local v = t[f[1]]
    if v == nil then v = f[3] or d[f[1]] end
    local x, err = enum_value(f[2], v, f[1])
    if not x then return nil, err end
    s[f[1]] = x
  end
  for _, f in ipairs(SHAPE_FLOATS) do
    local v = t[f] or 0
    if type(v) ~= "number" then return nil, ("flashdecode: %s: expected a number, got %s"):format(f, type(v)) end
    s[f] = v
  end
  return s
end

-- An fd_shape cdata from a table (see make_shape); a bad field is an error naming it.
function M.shape(t)
  local s, err = make_shape(t)
  if not s then error(err, 2) end
  return s
end

-- fd_plan_opts from a table { chunk, group_tile, splits, threads, isa, planes }; missing
-- fields are zero ("planner's choice"), or FD_PLAN_OPTS_DEFAULT when the header has one.
local function make_opts(t)
  local d = M.defines.FD_PLAN_OPTS_DEFAULT
  local o = type(d) == "table" and ffi.new("fd_plan_opts", d) or ffi.new("fd_plan_opts")
  return fill(o, t, OPTS_FIELDS, "opts")
end

-- fd_plan_opts from a table (see make_opts); a bad field is an error naming it.
function M.plan_opts(t)
  local opts, err = make_opts(t or {})
  if not opts then error(err, 2) end
  return opts
end

-- A plan handle for a context handle, an fd_shape and opts (a table or nil);
-- freed at collection. Or nil and why.
local function make_plan(ctx, shape, opts)
  local lib, err = M.load(), nil
  if type(opts) == "table" then
    opts, err = make_opts(opts)
    if not opts then return nil, err end
  elseif opts ~= nil and type(opts) ~= "cdata" then
    return nil, "flashdecode: opts: expected a table of fields, got " .. type(opts)
  end
  local p = ffi.new("fd_plan *[1]")
  local rc = tonumber(opts and lib.fd_plan_create_opts(ctx, shape, opts, p) or lib.fd_plan_create(ctx, shape, p))
  if rc ~= 0 then return nil, failure(rc, ctx, "fd_plan_create") end
  return ffi.gc(p[0], lib.fd_plan_destroy)
end

-- A plan handle for a context handle and shape (cdata or table); opts optional.
function M.plan(ctx, shape, opts)
  if type(shape) == "table" then
    local err
    shape, err = make_shape(shape)
    if not shape then error(err, 2) end
  end
  local p, err = make_plan(ctx, shape, opts)
  if not p then error(err, 2) end
  return p
end

-- Destroy a plan handle now.
function M.plan_destroy(plan)
  M.load().fd_plan_destroy(ffi.gc(plan, nil))
end

-- fd_plan_info for a longest valid length as a Lua table (isa: the key digit), or nil and why.
local function info_of(plan, kv_len, ctx)
  local i = ffi.new("fd_plan_info")
  local rc = tonumber(M.load().fd_plan_info_get(plan, kv_len, i))
  if rc ~= 0 then return nil, failure(rc, ctx, "fd_plan_info_get") end
  return { key = ffi.string(i.key), split_key = ffi.string(i.split_key), chunk = i.chunk,
           group_tile = i.group_tile, splits = i.splits, threads = i.threads, isa = i.isa,
           from_table = i.from_table ~= 0, from_model = i.from_table == 2, kernels_compiled = i.kernels_compiled,
           compile_ms = tonumber(i.compile_ms) }
end

-- fd_plan_info as a Lua table (see info_of); a failure is an error.
function M.plan_info(plan, kv_len, ctx)
  local i, err = info_of(plan, kv_len, ctx)
  if not i then error(err, 2) end
  return i
end

-- An fd_args from a table with fd_args's field names (pointers as cdata).
function M.args(t)
  local a = ffi.new("fd_args")
  for k, v in pairs(t) do a[k] = v end
  return a
end

-- fd_run, raising an error with the context's message on failure.
function M.run(plan, args, ctx)
  return M.check(M.load().fd_run(plan, args), ctx, "fd_run", 2)
end

-- Context facts: { threads, backend (0 tcc, 1 cc: cc falls back to tcc), max_isa (key digit) }.
function M.ctx_info(ctx)
  local lib = M.load()
  return { threads = tonumber(lib.fd_ctx_threads(ctx)), backend = tonumber(lib.fd_ctx_backend(ctx)),
           max_isa = tonumber(lib.fd_ctx_max_isa(ctx)) }
end

-- Build identification: { version, templates_hash, tcc_version }.
function M.build_info()
  local lib = M.load()
  local function str(p) return p ~= nil and ffi.string(p) or "" end
  return { version = M.version, templates_hash = str(lib.fd_build_templates_hash()),
           tcc_version = str(lib.fd_build_tcc_version()) }
end

-- The C source of a key's kernel as a Lua string.
function M.kernel_source(ctx, key)
  local p = M.load().fd_kernel_source(ctx, key)
  if p == nil then error("flashdecode: fd_kernel_source: " .. M.errmsg(ctx), 2) end
  local s = ffi.string(p)
  ffi.C.free(p)
  return s
end

-- ---------------------------------------------------------------------------
-- Element conversions: f32 <-> f16 / bf16 / fp8 e4m3 / fp8 e5m2 bits, i8
-- ---------------------------------------------------------------------------

-- Small float formats by dtype name (gen/facts.lua float_bits of the float
-- dtypes narrower than f32): mantissa bits, exponent bias, sign bit, the
-- largest finite encoding, and the encodings of infinity (nil: saturate) and NaN.
local MINI = {}
for d = 0, #facts.dtypes do
  local b = facts.float_bits(d)
  if b and facts.dtypes[d].size < 4 then
    MINI[facts.dtypes[d].name] = { m = facts.dtypes[d].float.man, bias = b.bias, sign = b.sign, max = b.max,
                                   inf = b.inf, nan = b.nan, size = facts.dtypes[d].size }
  end
end
local f32box = ffi.new("float[1]")

-- x rounded to the nearest integer, ties to even.
local function round_even(x)
  local r = math.floor(x)
  local d = x - r
  if d > 0.5 or (d == 0.5 and r % 2 == 1) then r = r + 1 end
  return r
end

-- x (rounded to f32 first) as format f's bits, to nearest even; beyond the
-- range infinity (f16, bf16, e5m2) or the largest finite value (fp8 e4m3, saturated).
local function mini_encode(f, x)
  f32box[0] = x
  x = f32box[0]
  if x ~= x then return f.nan end
  local sign = (x < 0 or 1 / x < 0) and f.sign or 0
  local a = math.abs(x)
  if a == 0 or a == math.huge then return sign + (a == 0 and 0 or f.inf or f.max) end
  local _, e = math.frexp(a)                               -- a = m * 2^e, m in [0.5, 1)
  e = math.max(e - 1, 1 - f.bias)                          -- subnormals share the smallest exponent
  local n = round_even(a / 2 ^ (e - f.m))                  -- mantissa with its leading bit
  local bits = (e + f.bias - 1) * 2 ^ f.m + n              -- a carry into the exponent is exact
  if bits > f.max then bits = f.inf or f.max end
  return sign + bits
end

-- Format f's bits as a number.
local function mini_decode(f, b)
  local mag = b % f.sign
  local e, frac = math.floor(mag / 2 ^ f.m), mag % 2 ^ f.m
  local x
  if mag == f.nan or (f.inf and mag > f.inf) then x = 0 / 0
  elseif f.inf and mag == f.inf then x = math.huge
  elseif e == 0 then x = frac * 2 ^ (1 - f.bias - f.m)
  else x = (2 ^ f.m + frac) * 2 ^ (e - f.bias - f.m) end
  return b >= f.sign and -x or x
end

-- Element types of arrays: C type, bytes, encode (number -> element), decode.
local ident = function(x) return x end
local ELEMS = {
  f32 = { ctype = "float", size = 4, encode = ident, decode = ident },
  i32 = { ctype = "int32_t", size = 4, encode = ident, decode = ident },
  i8 = { ctype = "int8_t", size = 1, encode = function(x) return math.max(-128, math.min(127, math.floor(x + 0.5))) end,
         decode = ident },
}
for name, f in pairs(MINI) do
  ELEMS[name] = { ctype = f.size == 1 and "uint8_t" or "uint16_t", size = f.size,
                  encode = function(x) return mini_encode(f, x) end, decode = function(b) return mini_decode(f, tonumber(b)) end }
end
-- The block dtypes (q8_0, q4_0): arrays of their raw bytes (head_dim / 32
-- blocks of gen/facts.lua's bytes per K/V row); units: elements -> bytes.
for d = 0, #facts.dtypes do
  if facts.dtypes[d].block then
    ELEMS[facts.dtypes[d].name] = { ctype = "uint8_t", size = 1, encode = ident, decode = ident,
                                    units = function(n) return facts.kv_bytes(d, n) end }
  end
end
local ELEM_ALIASES = { int8 = "i8", fp8_e4m3 = "fp8", fp8_e5m2 = "e5m2", int32 = "i32", float = "f32" }

-- The canonical element type name of dtype (any case, aliases), or nil and why.
local function elem_name(dtype, what)
  local n = type(dtype) == "string" and dtype:lower() or nil
  n = n and (ELEM_ALIASES[n] or n)
  if n and ELEMS[n] then return n end
  return nil, ("flashdecode: %s: unknown dtype %s (one of: bf16, e5m2, f16, f32, fp8, i32, i8, q4_0, q8_0)"):format(
    what, type(dtype) == "string" and ("'" .. dtype .. "'") or type(dtype))
end

-- A number as an element of dtype ("bf16": its bits, "f32": itself, "i8": rounded, clamped).
function M.encode(dtype, x)
  local n, err = elem_name(dtype, "encode")
  if not n then error(err, 2) end
  return ELEMS[n].encode(x)
end

-- An element of dtype as a number.
function M.decode(dtype, e)
  local n, err = elem_name(dtype, "decode")
  if not n then error(err, 2) end
  return ELEMS[n].decode(e)
end

-- The common conversions by name: fd.f32_to_bf16(x), fd.bf16_to_f32(bits), and f16, fp8, e5m2 alike.
for n in pairs(MINI) do
  M["f32_to_" .. n], M[n .. "_to_f32"] = ELEMS[n].encode, ELEMS[n].decode
end

-- ---------------------------------------------------------------------------
-- Arrays
-- ---------------------------------------------------------------------------

-- Arrays made by fd.array: their element type and length (weak keys).
local arrays = setmetatable({}, { __mode = "k" })

-- Store init into array a of n elements of type e: a number (every element),
-- a list (its values from a[0]), or a function of the 0-based index.
local function store(a, e, n, init)
  local t = type(init)
  if t == "number" then
    local x = e.encode(init)
    for i = 0, n - 1 do a[i] = x end
  elseif t == "table" then
    if #init > n then return ("%d values for %d elements"):format(#init, n) end
    for i = 1, #init do a[i - 1] = e.encode(init[i]) end
  elseif t == "function" then
    for i = 0, n - 1 do a[i] = e.encode(init(i)) end
  else
    return "init: expected a number, a list or a function, got " .. t
  end
end

-- A zeroed, 64-byte aligned array of n elements of dtype ("f32", "f16", "bf16",
-- "i8", "fp8", "e5m2", "i32") as a typed pointer (float *, uint16_t *, ...), freed when
-- collected (keep it referenced while the library uses it); init: see store.
function M.array(dtype, n, init)
  local name, err = elem_name(dtype, "array")
  if not name then error(err, 2) end
  if type(n) ~= "number" or n < 1 or n ~= math.floor(n) then
    error(("flashdecode: array: length must be a positive integer, got %s"):format(tostring(n)), 2)
  end
  local e = ELEMS[name]
  local bytes = math.ceil(n * e.size / 64) * 64
  local p = ffi.C.aligned_alloc(64, bytes)
  if p == nil then error(("flashdecode: array: out of memory for %d bytes"):format(bytes), 2) end
  ffi.fill(p, bytes, 0)
  local a = ffi.gc(ffi.cast(e.ctype .. " *", p), ffi.C.free)
  arrays[a] = { dtype = name, n = n }
  if init ~= nil then
    local why = store(a, e, n, init)
    if why then error("flashdecode: array: " .. why, 2) end
  end
  return a
end

-- The dtype name and length of an array made by fd.array, or nil.
function M.array_info(a)
  local i = arrays[a]
  if i then return i.dtype, i.n end
end

-- The first n elements (default: all) of an fd.array array (or any pointer, given
-- dtype and n) as a Lua list of numbers.
function M.totable(a, n, dtype)
  local i = arrays[a] or {}
  local name, err = elem_name(dtype or i.dtype, "totable")
  if not name then error(err, 2) end
  n = n or i.n or error("flashdecode: totable: the length of a pointer not made by fd.array is needed", 2)
  local t, dec = {}, ELEMS[name].decode
  for k = 0, n - 1 do t[k + 1] = dec(a[k]) end
  return t
end

-- ---------------------------------------------------------------------------
-- High level: contexts and plans as objects
-- ---------------------------------------------------------------------------

local Context, Plan = {}, {}
Context.__index, Plan.__index = Context, Plan

-- A context: fd.context { threads, backend, table, cache_dir, isa_limit } (all
-- optional). ctx:errmsg() says why a tuned table was refused (the heuristic is used).
function M.context(cfg)
  if cfg ~= nil and type(cfg) ~= "table" then error("flashdecode: context: expected a table of fields", 2) end
  local h, err = make_ctx(cfg or {})
  if not h then error(err, 2) end
  return setmetatable({ handle = h }, Context)
end

-- The context's handle, or an error when it was closed.
local function live(ctx, what)
  if not ctx.handle then error(("flashdecode: %s: the context is closed"):format(what), 3) end
  return ctx.handle
end

-- Why the calling thread's last call on this context failed ("" if none; a
-- refused tuned table's reason).
function Context:errmsg()
  return self.handle and M.errmsg(self.handle) or ""
end

-- { threads, backend ("tcc"|"cc"), max_isa (an isa name of M.ISA_NAMES: the best the context may use) }.
function Context:info()
  local i = M.ctx_info(live(self, "ctx:info"))
  return { threads = i.threads, backend = i.backend == 1 and "cc" or "tcc", max_isa = M.ISA_NAMES[i.max_isa] }
end

-- Destroy the context now (its plans then fail with FD_EDESTROYED); idempotent.
function Context:close()
  if self.handle then M.destroy(self.handle) end
  self.handle = nil
end

-- Plan fields: the shape's and opts.
local PLAN_FIELDS = set { "opts" }
for k in pairs(M.SHAPE_FIELDS) do PLAN_FIELDS[k] = true end

-- A plan: ctx:plan { batch, n_q_heads, n_kv_heads, head_dim, kv_len, q_dtype,
-- kv_dtype, out_dtype, mask_mode, layout, page_size, q_len, pool_pages, window,
-- sink_tokens, softcap, features = { "alibi", "sink_logits", ... } or the FD_*
-- bits, opts = { chunk, group_tile, splits, threads, isa, planes } } (defaults: see
-- make_shape). Validated, planned and JIT-compiled now.
function Context:plan(spec)
  local h = live(self, "ctx:plan")
  if type(spec) ~= "table" then error("flashdecode: plan: expected a table of shape fields", 2) end
  local bad = unknown_field(spec, PLAN_FIELDS, "plan")
  if bad then error(bad, 2) end
  local shape, err = make_shape(spec)
  if not shape then error(err, 2) end
  local p
  p, err = make_plan(h, shape, spec.opts)
  if not p then error(err, 2) end
  local n = {}
  for k in pairs(M.SHAPE_FIELDS) do n[k] = tonumber(shape[k]) end
  return setmetatable({ handle = p, ctx = self, ctx_handle = h, shape = n }, Plan)
end

-- Per fd_args pointer field: the element type it holds (a shape field or a
-- fixed name), its element count for numeric shape s, [3] the shape field that
-- count follows (named in messages) and pool = true where the paged layout's
-- pools replace the dense shape; list = true: a Lua list of numbers is taken too.
-- Whether shape s sets FD_K_PER_CHANNEL (k_scale [B, Hkv, D], not per row).
local function k_per_channel(s) return math.floor((s.features or 0) / M.FEATURES.k_per_channel) % 2 == 1 end
local function q_count(s) return s.batch * math.max(1, s.q_len or 0) * s.n_q_heads * s.head_dim end
local function kv_count(s) return s.batch * s.n_kv_heads * s.kv_len * s.head_dim end
local function new_count(s) return s.batch * math.max(1, s.q_len or 0) * s.n_kv_heads * s.head_dim end
local ARG_FIELDS = {
  q = { "q_dtype", q_count }, out = { "out_dtype", q_count },
  k = { "kv_dtype", kv_count, pool = true }, v = { "kv_dtype", kv_count, pool = true },
  mask = { "f32", function(s) return s.batch * math.max(1, s.q_len or 0) * s.n_q_heads * s.kv_len end },
  k_scale = { "f32", function(s) return s.batch * s.n_kv_heads * (k_per_channel(s) and s.head_dim or s.kv_len) end,
              pool = true },
  v_scale = { "f32", function(s) return s.batch * s.n_kv_heads * s.kv_len end, pool = true },
  lse = { "f32", function(s) return s.batch * math.max(1, s.q_len or 0) * s.n_q_heads end },
  cur_pos = { "i32", function(s) return s.batch end },
  block_table = { "i32", nil },
  k_new = { "kv_dtype", new_count, "batch x q_len x n_kv_heads x head_dim" },
  v_new = { "kv_dtype", new_count, "batch x q_len x n_kv_heads x head_dim" },
  alibi_slopes = { "f32", function(s) return s.n_q_heads end, "n_q_heads", list = true },
  sink_logits = { "f32", function(s) return s.n_q_heads end, "n_q_heads", list = true },
  beam_src = { "i32", function(s) return s.batch * s.kv_len end, "batch x kv_len" },
}
local RUN_FIELDS = set { "scale" }
for k in pairs(ARG_FIELDS) do RUN_FIELDS[k] = true end

-- cur_pos as cdata: a Lua list of positions or one number for every batch row; or nil and why.
local function positions(v, batch)
  if type(v) == "number" then v = { v } end
  if #v ~= batch and #v ~= 1 then
    return nil, ("flashdecode: run: cur_pos: %d positions for batch %d"):format(#v, batch)
  end
  local a = ffi.new("int32_t[?]", batch)
  for b = 0, batch - 1 do
    local x, err = integer(v[math.min(b + 1, #v)], ("run: cur_pos[%d]"):format(b))
    if not x then return nil, err end
    a[b] = x
  end
  return a
end

-- Check pointer field k's value x against the plan's shape s: cdata, and for
-- fd.array arrays the right element type and enough elements; nil or why.
local function check_pointer(k, x, s)
  if type(x) ~= "cdata" then return ("flashdecode: run: %s: expected an array (cdata), got %s"):format(k, type(x)) end
  local i, f = arrays[x], ARG_FIELDS[k]
  if not i or (f.pool and s.layout == 2) then return nil end
  local want = f[1]:match("_dtype$") and M.DTYPE_NAMES[s[f[1]]] or f[1]
  if i.dtype ~= want then
    return ("flashdecode: run: %s: a %s array, the plan needs %s%s"):format(k, i.dtype, want,
            f[1] ~= want and (" (" .. f[1] .. ")") or "")
  end
  local need = f[2] and f[2](s)
  if need and ELEMS[want].units then need = ELEMS[want].units(need) end   -- block dtypes: bytes
  if need and i.n < need then
    return ("flashdecode: run: %s: %d elements, the shape needs %d%s"):format(k, i.n, need, f[3] and (" (" .. f[3] .. ")") or "")
  end
end

-- A per-head list (alibi_slopes, sink_logits) as float cdata: exactly the
-- element count of field k for shape s, numbers only; or nil and why.
local function float_list(k, v, s)
  local f = ARG_FIELDS[k]
  local need = f[2](s)
  if #v ~= need then
    return nil, ("flashdecode: run: %s: %d values, the shape needs %d (%s)"):format(k, #v, need, f[3])
  end
  local a = ffi.new("float[?]", need)
  for i = 1, need do
    if type(v[i]) ~= "number" then return nil, ("flashdecode: run: %s[%d]: expected a number, got %s"):format(k, i - 1, type(v[i])) end
    a[i - 1] = v[i]
  end
  return a
end

-- fd_args from a run table for shape s, with the cdata it made (kept alive by
-- the caller), or nil and why.
local function make_args(t, s)
  local bad = unknown_field(t, RUN_FIELDS, "run")
  if bad then return nil, bad end
  local a, keep = ffi.new("fd_args"), {}
  for k, x in pairs(t) do
    if k == "scale" then
      if type(x) ~= "number" then return nil, "flashdecode: run: scale: expected a number, got " .. type(x) end
    elseif k == "cur_pos" and type(x) ~= "cdata" then
      local err
      x, err = positions(type(x) == "table" and x or { x }, s.batch)
      if not x then return nil, err end
      keep[#keep + 1] = x
    elseif ARG_FIELDS[k].list and type(x) == "table" then
      local err
      x, err = float_list(k, x, s)
      if not x then return nil, err end
      keep[#keep + 1] = x
    else
      local why = check_pointer(k, x, s)
      if why then return nil, why end
    end
    a[k] = x
  end
  return a, keep
end

-- Run the plan once: plan:run { q, k, v, cur_pos, out, lse, mask, k_scale,
-- v_scale, block_table, scale, k_new, v_new, alibi_slopes, sink_logits, beam_src } with
-- arrays as cdata (cur_pos may be a Lua list or a number; k_new and v_new
-- (FD_NEW_KV) [batch, q_len, n_kv_heads, head_dim] in kv_dtype; alibi_slopes
-- (FD_ALIBI) and sink_logits (FD_SINK_LOGITS), [n_q_heads] f32, also a Lua
-- list); k_scale [batch, n_kv_heads, head_dim] with FD_K_PER_CHANNEL; beam_src
-- (FD_BEAMS) [batch, kv_len] i32). Returns the plan.
function Plan:run(t)
  if not self.handle then error("flashdecode: run: the plan is closed", 2) end
  if type(t) ~= "table" then error("flashdecode: run: expected a table of argument fields", 2) end
  local args, keep = make_args(t, self.shape)
  if not args then error(keep, 2) end
  local rc = M.load().fd_run(self.handle, args)
  if rc ~= 0 then error(failure(tonumber(rc), self.ctx_handle, "fd_run"), 2) end
  return self
end

-- What the plan runs for a longest valid length (default: kv_len): key,
-- split_key, chunk, group_tile, splits, threads, isa (name), isa_digit, from_table, ...
function Plan:info(kv_len)
  if not self.handle then error("flashdecode: info: the plan is closed", 2) end
  local i, err = info_of(self.handle, kv_len or self.shape.kv_len, self.ctx_handle)
  if not i then error(err, 2) end
  i.isa_digit, i.isa = i.isa, M.ISA_NAMES[i.isa]
  return i
end

-- Free the plan now; idempotent.
function Plan:close()
  if self.handle then M.plan_destroy(self.handle) end
  self.handle = nil
end

return M
