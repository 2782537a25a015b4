-- LuaJIT FFI binding of libflashdecode, for the tuner and the bench drivers.
--
--   local fd = dofile("tuner/ffi.lua")        -- or require("tuner.ffi") from the repo root
--   local ctx = fd.create { threads = 0, backend = "tcc" }
--   local plan = fd.plan(ctx, fd.shape { batch = 1, n_q_heads = 32, ... })
--   fd.run(plan, fd.args { q = q, k = k, v = v, cur_pos = cp, out = out }, ctx)
--
-- The declarations come from runtime/flashdecode.h at load time (preprocessor
-- lines and the C++ guard removed; #define constants collected in fd.defines),
-- so the binding follows the header. The library is build/libflashdecode.so
-- unless $FD_LIB names another; the header is runtime/flashdecode.h unless
-- $FD_HEADER. Note: require("ffi") is LuaJIT's own module, so load this file by
-- path or as "tuner.ffi". Every helper raises a Lua error carrying fd_errmsg.
local ffi = require("ffi")
local M = {}

-- The repository root: two levels above this file.
local function find_root()
  local src = debug.getinfo(1, "S").source:gsub("^@", "")
  local dir = src:match("^(.*)/[^/]*$") or "."
  local up = dir:match("^(.*)/[^/]*$")
  if up == nil then return dir == "tuner" and "." or dir .. "/.." end
  return up == "" and "/" or up
end

M.root = os.getenv("FD_ROOT") or find_root()
M.header_path = os.getenv("FD_HEADER") or (M.root .. "/runtime/flashdecode.h")
M.lib_path = os.getenv("FD_LIB") or (M.root .. "/build/libflashdecode.so")

-- Read a whole file, or raise an error naming it.
local function read_file(path)
  local f, err = io.open(path, "rb")
  if not f then error("flashdecode ffi: cannot read " .. tostring(err), 0) end
  local s = f:read("*a")
  f:close()
  return s
end
M.read_file = read_file

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

-- Split the header text into cdef-able C (declarations only) and its #define values.
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

M.cdef_text, M.defines = M.parse_header(read_file(M.header_path))
ffi.cdef(M.cdef_text)

-- Declare one libc function unless an earlier module already did.
local function cdef_once(decl) pcall(ffi.cdef, decl) end
cdef_once("long sysconf(int name);")
cdef_once("void *malloc(size_t size);")
cdef_once("void free(void *ptr);")
cdef_once("void *aligned_alloc(size_t alignment, size_t size);")
cdef_once("int setenv(const char *name, const char *value, int overwrite);")

-- Load the shared library (once); raises an error that says how to build it.
function M.load(path)
  if M.lib then return M.lib end
  path = path or M.lib_path
  -- (libflashdecode links its Lua 5.4 statically with hidden symbols, so the
  -- lua_* functions LuaJIT exports cannot capture the library's calls.)
  local ok, lib = pcall(ffi.load, path)
  if not ok then
    error(("flashdecode ffi: cannot load %s (build it with `make lib` or set FD_LIB): %s"):format(path, lib), 0)
  end
  M.lib = lib
  return lib
end

-- String names of the header's enums, mapped to the C enum constants.
local ENUMS = {
  dtype = { f32 = "FD_F32", f16 = "FD_F16", bf16 = "FD_BF16", i8 = "FD_I8", int8 = "FD_I8",
            fp8 = "FD_FP8_E4M3", fp8_e4m3 = "FD_FP8_E4M3" },
  mask_mode = { causal = "FD_CAUSAL", mask = "FD_MASK", full = "FD_FULL" },
  layout = { bhsd = "FD_BHSD", bshd = "FD_BSHD", paged = "FD_PAGED" },
  backend = { tcc = "FD_BACKEND_TCC", cc = "FD_BACKEND_CC" },
  isa = { auto = "FD_ISA_AUTO", c = "FD_ISA_C", avx2 = "FD_ISA_AVX2", avx512 = "FD_ISA_AVX512" },
}
M.ISA_NAMES = { [0] = "c", "avx2", "avx512" }              -- by tiling-key isa digit
M.DTYPE_SIZE = { [0] = 4, 2, 2, 1, 1 }                     -- bytes per element, by fd_dtype value

-- Enum constants are reachable through any namespace once declared; C is always there.
local function enum_const(name) return tonumber(ffi.C[name]) end
-- The numeric value of an enum given by name ("f16") or number; errors name the kind.
function M.enum(kind, v)
  if type(v) == "number" then return v end
  local names = ENUMS[kind] or error("flashdecode ffi: unknown enum kind " .. tostring(kind), 2)
  local c = names[tostring(v):lower()]
  if not c then error(("flashdecode ffi: %s: unknown value %q"):format(kind, tostring(v)), 2) end
  return enum_const(c)
end

-- fd_errmsg of a context (or of fd_create failures with ctx nil) as a Lua string.
function M.errmsg(ctx)
  local s = M.load().fd_errmsg(ctx)
  return s ~= nil and ffi.string(s) or ""
end

-- Raise an error "<what>: <message> (code N)" unless rc is 0; returns rc.
-- level: as error()'s, counted from the caller of check (default 1: that caller).
function M.check(rc, ctx, what, level)
  rc = tonumber(rc)
  if rc ~= 0 then error(("%s: %s (code %d)"):format(what or "flashdecode", M.errmsg(ctx), rc), (level or 1) + 1) end
  return rc
end

-- Copy a Lua table's fields into a struct cdata; a field the struct lacks is an error.
local function fill_struct(cd, ctype, t, enums)
  for k, v in pairs(t or {}) do
    if enums and enums[k] then v = M.enum(enums[k], v) end
    local ok, err = pcall(function() cd[k] = v end)
    if not ok then error(("flashdecode ffi: %s.%s: %s"):format(ctype, tostring(k), err), 3) end
  end
  return cd
end

-- A context from a table of fd_config fields { threads, backend ("tcc"|"cc"), table,
-- cache_dir, isa_limit (number or "c"|"avx2"|"avx512") } (the strings need only
-- live through fd_create); missing fields are zero. Destroyed at collection.
function M.create(t)
  local lib = M.load()
  local cfg = fill_struct(ffi.new("fd_config"), "fd_config", t, { backend = "backend", isa_limit = "isa" })
  local ctx = lib.fd_create(cfg)
  if ctx == nil then error("fd_create: " .. M.errmsg(nil), 2) end
  return ffi.gc(ctx, lib.fd_destroy)
end

-- Destroy a context now (instead of at garbage collection).
function M.destroy(ctx)
  M.load().fd_destroy(ffi.gc(ctx, nil))
end

-- An fd_shape from a table with fd_shape's field names; enums by name or number.
function M.shape(t)
  local s = ffi.new("fd_shape")
  s.batch, s.n_q_heads, s.n_kv_heads, s.head_dim = t.batch, t.n_q_heads, t.n_kv_heads, t.head_dim
  s.kv_len = t.kv_len
  s.q_dtype = M.enum("dtype", t.q_dtype or "f32")
  s.kv_dtype = M.enum("dtype", t.kv_dtype or t.q_dtype or "f32")
  s.out_dtype = M.enum("dtype", t.out_dtype or t.q_dtype or "f32")
  s.mask_mode = M.enum("mask_mode", t.mask_mode or "causal")
  s.layout = M.enum("layout", t.layout or "bhsd")
  s.page_size = t.page_size or 0
  return s
end

-- fd_plan_opts from a table { chunk, group_tile, splits, threads, isa }; missing
-- fields are zero ("planner's choice"), or FD_PLAN_OPTS_DEFAULT when the header has one.
function M.plan_opts(t)
  local d = M.defines.FD_PLAN_OPTS_DEFAULT
  local o = type(d) == "table" and ffi.new("fd_plan_opts", d) or ffi.new("fd_plan_opts")
  return fill_struct(o, "fd_plan_opts", t, { isa = "isa" })
end

-- A plan for ctx and shape (cdata or table); opts optional. Freed at collection.
function M.plan(ctx, shape, opts)
  local lib = M.load()
  if type(shape) == "table" then shape = M.shape(shape) end
  local p = ffi.new("fd_plan *[1]")
  local rc = opts and lib.fd_plan_create_opts(ctx, shape, M.plan_opts(opts), p) or lib.fd_plan_create(ctx, shape, p)
  M.check(rc, ctx, "fd_plan_create", 2)
  return ffi.gc(p[0], lib.fd_plan_destroy)
end

-- Destroy a plan now.
function M.plan_destroy(plan)
  M.load().fd_plan_destroy(ffi.gc(plan, nil))
end

-- fd_plan_info for a longest valid length, as a Lua table.
function M.plan_info(plan, kv_len, ctx)
  local i = ffi.new("fd_plan_info")
  M.check(M.load().fd_plan_info_get(plan, kv_len, i), ctx, "fd_plan_info_get", 2)
  return { key = ffi.string(i.key), split_key = ffi.string(i.split_key), chunk = i.chunk,
           group_tile = i.group_tile, splits = i.splits, threads = i.threads, isa = i.isa,
           from_table = i.from_table ~= 0, compile_ms = tonumber(i.compile_ms) }
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
  local function get(fn)                                   -- nil when this header lacks fn
    local ok, v = pcall(function() return lib[fn](ctx) end)
    return ok and tonumber(v) or nil
  end
  return { threads = get("fd_ctx_threads"), backend = get("fd_ctx_backend"), max_isa = get("fd_ctx_max_isa") }
end

-- Build identification: { version, templates_hash, tcc_version }.
function M.build_info()
  local lib = M.load()
  local function str(p) return p ~= nil and ffi.string(p) or "" end
  return { version = M.defines.FD_VERSION, templates_hash = str(lib.fd_build_templates_hash()),
           tcc_version = str(lib.fd_build_tcc_version()) }
end

-- The C source of a key's kernel as a Lua string.
function M.kernel_source(ctx, key)
  local p = M.load().fd_kernel_source(ctx, key)
  if p == nil then error("fd_kernel_source: " .. M.errmsg(ctx), 2) end
  local s = ffi.string(p)
  ffi.C.free(p)
  return s
end

-- The machine's slug: the CPU model lowercased, vendor marks and clock dropped,
-- words joined by '-', then "-<cores>c": "AMD EPYC" on 2 cores -> "amd-epyc-2c".
function M.machine_slug(model, cores)
  local s = model:lower():gsub("%(r%)", ""):gsub("%(tm%)", ""):gsub("@.*$", "")
  s = s:gsub("%f[%w]%d+%-core%f[%W]", ""):gsub("%f[%w]processor%f[%W]", ""):gsub("%f[%w]cpu%f[%W]", "")
  s = s:gsub("[^%w]+", "-"):gsub("^%-+", ""):gsub("%-+$", "")
  return (s == "" and "cpu" or s) .. "-" .. tostring(cores) .. "c"
end

-- This machine: { model, cores (online), flags, slug }.
function M.machine()
  local ok, info = pcall(read_file, "/proc/cpuinfo")
  if not ok then info = "" end
  local model = info:match("model name%s*:%s*([^\n]+)") or "unknown cpu"
  local flags = info:match("\nflags%s*:%s*([^\n]+)") or ""
  local cores = tonumber(ffi.C.sysconf(84))                -- _SC_NPROCESSORS_ONLN on Linux
  model = model:gsub("%s+", " "):gsub("%s+$", "")
  return { model = model, cores = cores, flags = flags, slug = M.machine_slug(model, cores) }
end

-- The tuned table for this machine (results/tuned/<slug>.tsv) if it exists, else nil.
function M.tuned_table(slug)
  local path = ("%s/results/tuned/%s.tsv"):format(M.root, slug or M.machine().slug)
  local f = io.open(path)
  if f then f:close() return path end
  return nil
end

return M
