-- LuaJIT FFI binding of build/libfdbench.so (bench/bw.h, util.h, vanilla.h):
-- read bandwidth, cache flush, clock, buffer fill/compare, the vanilla baseline.
-- Needs tuner/ffi.lua loaded first (fd_shape / fd_args come from its cdef).
-- $FDB_LIB overrides the library path.
local ffi = require("ffi")
local fd = require("tuner.ffi")

-- Passive OpenMP waiting, set before libgomp loads, so idle OpenMP threads do
-- not spin on the cores flashdecode's pool is about to use.
ffi.C.setenv("OMP_WAIT_POLICY", "passive", 0)

for _, h in ipairs { "bw.h", "util.h", "vanilla.h" } do
  ffi.cdef((fd.parse_header(fd.read_file(fd.root .. "/bench/" .. h))))
end

local path = os.getenv("FDB_LIB") or (fd.root .. "/build/libfdbench.so")
local ok, lib = pcall(ffi.load, path)
if not ok then error(("bench: cannot load %s (make bench-lib): %s"):format(path, lib), 0) end
return lib
