-- System helpers for the tuner: clock, terminal test, cache flush, files,
-- environment. LuaJIT FFI on libc, and the library through lua/flashdecode.lua.
local ffi = require("ffi")
local fd = require("flashdecode")
local files = require("files")

pcall(ffi.cdef, "typedef struct fdt_timespec { long tv_sec; long tv_nsec; } fdt_timespec;")
pcall(ffi.cdef, "int clock_gettime(int clk, fdt_timespec *ts);")
pcall(ffi.cdef, "int isatty(int fd);")

local M = {}
local ts = ffi.new("fdt_timespec")

-- Monotonic seconds.
function M.now()
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end

-- Is stderr a terminal?
function M.stderr_tty() return ffi.C.isatty(2) == 1 end

-- An environment variable, or d when unset or empty.
function M.env(k, d)
  local v = os.getenv(k)
  return (v and v ~= "") and v or d
end

-- s single-quoted for the shell.
function M.quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- The tuner's cache flush is the benchmark's (bench/bw.c fdb_flush_caches:
-- all threads read a buffer of 4x the last-level cache), so the tuner and
-- `make bench` time the same cold state. libfdbench ($FDB_LIB, else build/)
-- sets OMP_WAIT_POLICY=passive before it loads, so its idle OpenMP threads do
-- not spin on the cores a measured call uses. M.flush_s: the seconds spent
-- flushing so far (the tuner's real-time deadline leaves them out).
local fdb
M.flush_s = 0

-- Evict the caches with the loaded library; adds the seconds it took to M.flush_s.
local function flush_now()
  local t0 = M.now()
  if fdb.fdb_flush_caches() ~= 0 then error("tune: out of memory for the cache flush buffer", 0) end
  M.flush_s = M.flush_s + (M.now() - t0)
end

-- Load the flush's library and flush once now, before any configuration is
-- timed: a missing library, or a flush buffer that cannot be allocated, is an
-- error of the run (naming what failed), never a failed configuration.
function M.flush_ready()
  if fdb then return end
  fdb = require("bench.lib")
  flush_now()
end

-- Evict the caches (the first call loads the library: its flush is that one).
function M.flush()
  if not fdb then return M.flush_ready() end
  flush_now()
end

-- The directory part of a path.
function M.dirname(p) return p:match("^(.*)/[^/]*$") or "." end

-- A CPU-time sample: busy and total ticks of the machine, ticks of this process.
function M.cpu_sample()
  local st = files.read("/proc/stat") or ""
  local f = {}
  for n in (st:match("^cpu%s+([^\n]+)") or ""):gmatch("%d+") do f[#f + 1] = tonumber(n) end
  local total, busy = 0, 0
  for i, n in ipairs(f) do
    if i <= 8 then total = total + n end
    if i <= 8 and i ~= 4 and i ~= 5 then busy = busy + n end   -- all but idle and iowait
  end
  local me = (files.read("/proc/self/stat") or ""):match("%) (.*)$") or ""
  local g = {}
  for x in me:gmatch("%S+") do g[#g + 1] = x end
  return { busy = busy, total = total, self = (tonumber(g[12]) or 0) + (tonumber(g[13]) or 0) }
end

-- Cores other processes kept busy on average between two samples.
function M.others_cores(a, b, cores)
  local total = b.total - a.total
  if total <= 0 then return 0 end
  return math.max(0, (b.busy - a.busy) - (b.self - a.self)) / (total / cores)
end

-- fd_tuned_table_header() of this build and machine.
function M.table_header()
  local buf = ffi.new("char[8192]")
  local n = fd.load().fd_tuned_table_header(buf, 8192)
  if n < 0 then error("tune: fd_tuned_table_header failed", 0) end
  return ffi.string(buf, n)
end

-- fd_shape_signature of an fd_shape.
function M.signature(shape)
  local buf = ffi.new("char[256]")
  if fd.load().fd_shape_signature(shape, buf, 256) < 0 then error("tune: fd_shape_signature failed", 0) end
  return ffi.string(buf)
end

-- fd_length_bucket of a length.
function M.bucket(len) return tonumber(fd.load().fd_length_bucket(len)) end

-- fd_machine_name().
function M.machine() return ffi.string(fd.load().fd_machine_name()) end

return M
