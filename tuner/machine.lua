-- This machine for result file names: the CPU model, online cores and flags,
-- its slug ("amd-epyc-2c-avx512bf16"), and its tuned table in the repository.
-- LuaJIT's FFI with sysconf declared, loaded on first use (cpu_id_of runs on any Lua).
local function cffi()
  local ffi = require("ffi")
  pcall(ffi.cdef, "long sysconf(int name);")               -- unless declared already
  return ffi
end

local M = {}

-- The repository root: the directory above this file's tuner/.
M.root = (debug.getinfo(1, "S").source:gsub("^@", "")):match("^(.*)/tuner/[^/]*$") or "."

-- The machine's slug ("amd-epyc-2c-avx512bf16"): the library's fd_machine_name, the
-- one rule (runtime/cpu.c fd_machine_slug) that `make tune` and `fdgen
-- machine` name the tuned table by.
function M.slug()
  return cffi().string(require("flashdecode").load().fd_machine_name())
end

-- The text of /proc/cpuinfo ("" where it cannot be read).
local function cpuinfo()
  local f = io.open("/proc/cpuinfo", "rb")
  local info = f and f:read("*a") or ""
  if f then f:close() end
  return info
end

-- The CPU's vendor, family and model as CPUID reports them ("amd-f25-m1") in
-- the text of a /proc/cpuinfo, "unknown-cpu" where it does not say: it tells
-- apart CPUs whose slugs agree (a Zen 4 and a Zen 5 VM both read "AMD EPYC";
-- family 25 model 17 and family 26).
function M.cpu_id_of(info)
  local vendor = info:match("vendor_id%s*:%s*(%S+)")
  local family, model = info:match("cpu family%s*:%s*(%d+)"), info:match("\nmodel%s*:%s*(%d+)")
  if not (vendor and family and model) then return "unknown-cpu" end
  vendor = ({ AuthenticAMD = "amd", GenuineIntel = "intel" })[vendor] or vendor:lower():gsub("[^%w]", "")
  return ("%s-f%s-m%s"):format(vendor, family, model)
end

-- This CPU's M.cpu_id_of.
function M.cpu_id() return M.cpu_id_of(cpuinfo()) end

-- This machine: { model, cores (online), flags, slug }.
function M.info()
  local info = cpuinfo()
  local model = info:match("model name%s*:%s*([^\n]+)") or "unknown cpu"
  local flags = info:match("\nflags%s*:%s*([^\n]+)") or ""
  local cores = tonumber(cffi().C.sysconf(84))                -- _SC_NPROCESSORS_ONLN on Linux
  model = model:gsub("%s+", " "):gsub("%s+$", "")
  return { model = model, cores = cores, flags = flags, slug = M.slug() }
end

-- The tuned table for this machine (results/tuned/<slug>.tsv) if it exists, else nil.
function M.tuned_table(slug)
  local path = ("%s/results/tuned/%s.tsv"):format(M.root, slug or M.info().slug)
  local f = io.open(path)
  if f then f:close() return path end
  return nil
end

-- Shell output of a command, trimmed ("" on failure).
function M.sh(cmd)
  local p = io.popen(cmd .. " 2>/dev/null")
  local s = p and p:read("*a") or ""
  if p then p:close() end
  return (s:gsub("%s+$", ""))
end

-- The commit of the tree at root, short, with "-dirty" when tracked files changed ("unknown" outside git).
function M.commit(root)
  local git = ("git -C '%s' "):format(root)
  local commit = M.sh(git .. "rev-parse --short HEAD")
  if commit == "" then return "unknown" end
  if M.sh(git .. "status --porcelain --untracked-files=no") ~= "" then commit = commit .. "-dirty" end
  return commit
end

return M
