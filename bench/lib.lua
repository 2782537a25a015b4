-- LuaJIT FFI binding of build/libfdbench.so (bench/bw.h, stream.h, util.h, vanilla.h):
-- read bandwidth, cache flush, clock, buffer fill/compare, the vanilla baseline,
-- the streaming probe.
-- Loads lua/flashdecode.lua first (fd_shape / fd_args come from its cdef).
-- $FDB_LIB overrides the library path.
local ffi = require("ffi")
local fd = require("flashdecode")
local files = require("files")
pcall(ffi.cdef, "int setenv(const char *name, const char *value, int overwrite);")

-- The repository root: the directory above this file's bench/.
local root = (debug.getinfo(1, "S").source:gsub("^@", "")):match("^(.*)/bench/[^/]*$") or "."

-- Passive OpenMP waiting, set before libgomp loads, so idle OpenMP threads do
-- not spin on the cores flashdecode's pool is about to use.
ffi.C.setenv("OMP_WAIT_POLICY", "passive", 0)

for _, h in ipairs { "bw.h", "stream.h", "util.h", "vanilla.h" } do
  local path = root .. "/bench/" .. h
  ffi.cdef((fd.parse_header(files.read(path) or error("bench: cannot read " .. path, 0))))
end

local path = os.getenv("FDB_LIB") or (root .. "/build/libfdbench.so")
local ok, lib = pcall(ffi.load, path)
if not ok then error(("bench: cannot load %s (make bench-lib): %s"):format(path, lib), 0) end
return lib
