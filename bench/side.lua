-- What the side benchmarks (bench/paged.lua, bench/uneven.lua) share: the
-- run's identity, the context their plans come from, aligned buffers,
-- bandwidth samples and the report's small formatters. Each takes the
-- benchmark's name ("paged", "uneven") where it shows in a file or message.
local ffi = require("ffi")
local fd = require("flashdecode")
local fdb = require("bench.lib")
local machine = require("tuner.machine")
local report = require("bench.report")

local M = {}

-- $k, or d when it is unset or empty.
function M.env(k, d)
  local v = os.getenv(k)
  return (v and v ~= "") and v or d
end

-- The run's identity: machine, commit, date, library build, load; its
-- report is named <name>-<machine>[-quick].
function M.run_info(name, root, quick)
  local m = machine.info()
  return { machine = m, commit = machine.commit(root), date = os.date("!%Y-%m-%d %H:%M UTC"),
           build = fd.build_info(), threads = m.cores, name = name .. "-" .. m.slug .. (quick and "-quick" or ""),
           load_start = machine.sh("cat /proc/loadavg"), flush = tonumber(fdb.fdb_flush_bytes()),
           bw_kernel = ffi.string(fdb.fdb_bw_kernel()), hugepages = fdb.fdb_hugepages() ~= 0,
           cmd = M.env("FDB_CMD", (quick and "QUICK=1 " or "") .. "luajit bench/" .. name .. ".lua") }
end

-- One all-threads read bandwidth sample of bytes, appended to bw.
function M.sample_bw(info, bw, when, reps, bytes)
  bw[#bw + 1] = { when = when, gbs = fdb.fdb_read_bw_gbs(bytes, info.threads, reps) }
end

-- The context every plan comes from: the tuned table ($FDB_TABLE or the
-- machine's) when it loads, else the heuristic; info records which.
function M.context(info, backend)
  local tbl = M.env("FDB_TABLE", nil) or machine.tuned_table(info.machine.slug)
  local ok, ctx = pcall(fd.create, { threads = info.threads, backend = backend, table = tbl })
  info.table = ok and tbl or nil
  if ok and tbl and fd.errmsg(ctx) ~= "" then info.table_note, info.table = fd.errmsg(ctx), nil end
  if not ok then
    info.table_note = tbl and tostring(ctx)
    ctx = fd.create { threads = info.threads, backend = backend }
  end
  info.backend = fd.ctx_info(ctx).backend == 1 and "cc" or "tcc"
  return ctx
end

-- A buffer of bytes (64-byte aligned, huge pages as the bench asks), kept in list.
function M.alloc(name, list, bytes)
  local p = fdb.fdb_alloc(math.max(bytes, 64))
  if p == nil then error(("bench-%s: out of memory allocating %.0f MiB"):format(name, bytes / 2 ^ 20), 0) end
  list[#list + 1] = p
  return p
end

-- Bytes of one element of dtype name.
function M.esize(name) return fd.DTYPE_SIZE[fd.enum("dtype", name)] end

-- x with d decimals (2), "-" for nil, NaN and infinity.
function M.num(x, d)
  if x == nil or x ~= x or x == math.huge then return "-" end
  return ("%." .. (d or 2) .. "f"):format(x)
end

-- The bandwidth samples of res as one line.
function M.bw_line(res)
  local t = {}
  for _, s in ipairs(res.bw) do t[#t + 1] = ("%s %.1f"):format(s.when, s.gbs) end
  return table.concat(t, ", ")
end

-- The gnuplot script dir/ratio.gp drawing body as out/name.svg and .png;
-- returns its path and the svg's name.
function M.chart_script(dir, out, name, body)
  local text = {}
  for _, t in ipairs { { "svg size 900,480 dynamic enhanced font 'sans,11' background rgb 'white'", "svg" },
                       { "pngcairo size 900,480 enhanced font 'sans,10' background rgb 'white'", "png" } } do
    text[#text + 1] = ("set terminal %s\nset output '%s/%s.%s'\n%s\n"):format(t[1], out, name, t[2], body)
  end
  local gp = dir .. "/ratio.gp"
  report.write_file(gp, table.concat(text) .. "set output\n")
  return gp, name .. ".svg"
end

-- path relative to the repository root when under it.
function M.relative(root, path)
  return path:sub(1, #root + 1) == root .. "/" and path:sub(#root + 2) or path
end

return M
