-- The tuner's search space and order (tuner/search.lua, gen/space.lua) and
-- its log notes (tuner/log.lua): chunks up to 4096 and 16 for MHA, split
-- choices up to 16, pruned kernels with their reasons, the coarse-to-fine
-- order (every other chunk first, then neighbours), and "#pruned" /
-- "#coverage" lines that round-trip and are written once across a resume.
-- Pure Lua (the FFI-bound modules are stubbed): runs on lua5.4 and LuaJIT.
package.path = "tests/?.lua;./?.lua;./gen/?.lua;" .. package.path
package.loaded["tuner.measure"] = {}   -- search.lua's timing side is not exercised here
local T = require("check")
local space = require("space")
local search = require("tuner.search")
local tlog = require("tuner.log")

-- List as comma text.
local function csv(t) return table.concat(t, ",") end

-- The space's chunks.
T.eq(csv(space.chunks(4)), "32,64,128,256,512,1024,2048,4096", "chunks for GQA: 32..4096")
T.eq(csv(space.chunks(1)), "16,32,64,128,256,512,1024,2048,4096", "chunks for MHA start at 16")
T.eq(csv(space.tiles(16)), "1,2,4,8,16", "every divisor tile up to 16")

-- Split choices: up to 16, bounded by items per thread and 128-key pieces.
T.eq(csv(search.split_choices(1, 2, 131072, 2)), "1,2,4,8,16", "one kv row, 2 threads, 128k: splits up to 16")
T.eq(csv(search.split_choices(1, 16, 131072, 16)), "1,2,4,8,16", "16 threads: still at most 16 splits")
T.eq(csv(search.split_choices(4, 2, 32768, 1)), "1,2,4,8", "4 kv rows, 2 threads: 16 items per thread")
T.eq(csv(search.split_choices(1, 2, 300, 1)), "1,2", "300 keys: no piece under 128 keys")
T.eq(csv(search.split_choices(32, 2, 4096, 1)), "1", "32 kv rows on 2 threads: no split")

-- Kernels of a job: isas stubbed (portable C always, isa 1 for even tiles, isa 2 beyond the context).
search.isas_of = function(_, tile) return tile % 2 == 0 and { 0, 1 } or { 0 } end
local h = { chunk = 256, tile = 4, isa = 1, splits = 1, threads = 2 }
local j = { G = 4, D = 128, len = 700, max_isa = 1 }
local ks, pruned = search.kernels(j, h, nil)
local names, why = {}, {}
for _, k in ipairs(ks) do names[k.name] = k end
for _, p in ipairs(pruned) do why[p.name] = p.why end
T.ok(names["c4096.t4.i1"] == nil and why["c4096.t4.i1"]:find("chunk 4096 >= 2 x the length 700", 1, true),
  "a chunk of twice the length is pruned with its reason", why["c4096.t4.i1"])
T.ok(names["c1024.t4.i1"] ~= nil, "chunk 1024 searched at length 700")
T.ok(why["c256.t1.i1"] and why["c256.t1.i1"]:find("no kernel for head_dim 128, group tile 1", 1, true),
  "an isa without a kernel for the tile is pruned naming head_dim and tile", why["c256.t1.i1"])
T.ok(why["c256.t4.i2"] == nil and names["c256.t4.i2"] == nil, "isas above the context's are neither searched nor logged")
T.eq(#ks + #pruned, 8 * 3 * 2, "searched + pruned = the whole space up to the context's isa")
T.eq(ks[1].name, "c256.t4.i1", "the heuristic's kernel first")

-- Coarse to fine: coarse kernels are every other chunk from the heuristic's
-- and the smallest, before the others in distance order.
local coarse_ok, seen_fine = true, false
for _, k in ipairs(ks) do
  local even = ({ [32] = 1, [64] = 1, [256] = 1, [1024] = 1, [4096] = 1 })[k.chunk]
  if (k.coarse and true or false) ~= (even == 1) then coarse_ok = false end
end
T.ok(coarse_ok, "coarse kernels: chunks 64, 256, 1024 (every other from the heuristic's 256) and 32 (the smallest)")
local order_ok = true
for i = 2, #ks do if ks[i].order < ks[i - 1].order then order_ok = false end end
T.ok(order_ok, "kernels sorted nearest the heuristic first")
local nb = {}
for _, o in ipairs(search.neighbours(ks, names["c256.t4.i1"])) do nb[#nb + 1] = o.name end
table.sort(nb)
T.eq(csv(nb), "c128.t4.i1,c256.t2.i1,c256.t4.i0,c512.t4.i1", "neighbours: one chunk, tile or isa step")
-- The isa step follows the fallback chain (3 -> 4 -> 2), not the digits:
-- isa 3's one neighbour by isa is digit 4, and digit 4's are 2 and 3.
local isas_stub = search.isas_of
search.isas_of = function() return { 0, 1, 2, 3, 4 } end
local jc = { G = 4, D = 128, len = 700, max_isa = 3 }
local kc = search.kernels(jc, { chunk = 256, tile = 4, isa = 3, splits = 1, threads = 2 }, nil)
local cn = {}
for _, k in ipairs(kc) do cn[k.name] = k end
local function isa_neighbours(name)
  local out = {}
  for _, o in ipairs(search.neighbours(kc, cn[name])) do if o.chunk == 256 and o.tile == 4 then out[#out + 1] = o.name end end
  table.sort(out)
  return csv(out)
end
T.eq(isa_neighbours("c256.t4.i3"), "c256.t4.i4", "isa 3's neighbour: digit 4, the next on its fallback chain")
T.eq(isa_neighbours("c256.t4.i4"), "c256.t4.i2,c256.t4.i3", "digit 4's neighbours: 2 and 3")
T.ok(cn["c256.t4.i4"].order < cn["c256.t4.i2"].order, "from the heuristic's isa 3, digit 4 (one step) is searched "
  .. "before digit 2 (two steps)", cn["c256.t4.i4"].order .. " vs " .. cn["c256.t4.i2"].order)
search.isas_of = isas_stub
local prior = { ["c32.t1.i0"] = 1 }
local kp = search.kernels(j, h, prior)
T.ok(kp[1].name == "c32.t1.i0" and kp[1].coarse, "the prior's best kernel first, and in the coarse pass")

-- Refinement interleaved: three finalists, the true times 90 (the quick
-- best), 100 and 120; the first run is twice as slow (a bandwidth
-- level switch), so timing each finalist's repetitions back to back (the
-- former refinement: the first finalist's all in the slow level) took the second. Each round times
-- every finalist once; the lowest median per-round ratio to the quick best wins.
local measure = package.loaded["tuner.measure"]
local truth, calls, stages = {}, 0, {}
measure.config_name = function(c) return ("c%d.t%d.s%d.p%d.i%d"):format(c.chunk, c.tile, c.splits, c.threads, c.isa) end
measure.measure = function(_, c, stage, reps, _)
  calls = calls + 1
  local name = measure.config_name(c)
  stages[stage] = (stages[stage] or "") .. name .. " "
  local t = truth[name] * (calls <= 1 and 2 or 1)
  return { ok = true, c = c, config = name, key = name, median_us = t, times = { t }, reps = reps }
end
local fin = { { chunk = 512, v = 90 }, { chunk = 256, v = 100 }, { chunk = 1024, v = 120 } }
local st = { j = {}, spent = 0, budget = 100, quick = {}, refined = {}, n = 0, planned = 0 }
for i, f in ipairs(fin) do
  local c = { chunk = f.chunk, tile = 4, isa = 1, splits = 1, threads = 2 }
  local name = measure.config_name(c)
  truth[name] = f.v
  st.quick[name] = { ok = true, c = c, config = name, median_us = 50 + i }   -- quick order: 512, 256, 1024
end
local win, finalists = search.refine(st, 0.1)   -- 3 rounds of 3
T.eq(win and win.config, "c512.t4.s1.p2.i1", "interleaved refinement finds the truly fastest across a level switch")
T.eq(finalists and #finalists == 3 and finalists[2].config .. " " .. finalists[3].config,
     "c256.t4.s1.p2.i1 c1024.t4.s1.p2.i1", "the finalists in refined order: the runner-up verification's candidate second")
local rounds, each = 0, true
for stage, list in pairs(stages) do
  rounds = rounds + 1
  local n = 0
  for _ in list:gmatch("%S+") do n = n + 1 end
  each = each and stage:match("^r%d+$") ~= nil and n == 3
end
T.ok(rounds == 3 and each, "3 rounds (stages r1..r3), each timing every finalist once")
T.ok(math.abs(st.refined["c1024.t4.s1.p2.i1"].median_us - 120) < 1e-9, "a finalist's refined time: the median of its rounds")

-- Recheck (the int8 16k job of the tune at b89fc65): the quick pass timed
-- chunk 64 (true 80) first, in a slow spell (108), then chunks 128 (90) and
-- 32 (95) after the bandwidth rose; chunk 512 (true 99, timed 110) and a
-- kernel at another decomposition (60) too. The recheck re-times the 3
-- fastest at the heuristic's decomposition in 2 interleaved rounds (stages k1,
-- k2), each keeping its fastest time: chunk 64 ranks first; chunk 512
-- (fourth) and the other decomposition are not re-timed; a re-time slower
-- than the quick one leaves the record as it was.
truth, calls, stages = {}, 0, {}
local slow_at = {}
measure.measure = function(_, c, stage, reps, _)
  calls = calls + 1
  local name = measure.config_name(c)
  stages[stage] = (stages[stage] or "") .. name .. " "
  local t = truth[name] * ((slow_at[name] == calls) and 1.5 or 1)
  return { ok = true, c = c, config = name, key = name, median_us = t, times = { t }, reps = reps }
end
local hk = { chunk = 256, tile = 4, isa = 4, splits = 1, threads = 2 }
local sr = { j = {}, spent = 0, budget = 100, quick = {}, refined = {}, n = 0, planned = 0 }
for _, q in ipairs { { 64, 1, 80, 108 }, { 128, 1, 90, 90 }, { 32, 1, 95, 95 }, { 512, 1, 99, 110 }, { 128, 2, 60, 60 } } do
  local c = { chunk = q[1], tile = 4, isa = 4, splits = q[2], threads = 2 }
  local name = measure.config_name(c)
  truth[name] = q[3]
  sr.quick[name] = { ok = true, c = c, config = name, median_us = q[4] }
end
slow_at["c128.t4.s1.p2.i4"] = 2        -- its first re-time (the second call) in a slow spell
local saved = search.RECHECK
search.RECHECK = 3
search.recheck(sr, hk, 0.1)
search.RECHECK = saved
local at_h = {}
for _, r in ipairs(search.ranked(sr.quick)) do if r.c.splits == 1 then at_h[#at_h + 1] = r.config end end
T.eq(csv(at_h), "c64.t4.s1.p2.i4,c128.t4.s1.p2.i4,c32.t4.s1.p2.i4,c512.t4.s1.p2.i4",
     "rechecked: the kernel timed in a slow spell ranks first at the heuristic's decomposition")
T.ok(sr.quick["c64.t4.s1.p2.i4"].median_us == 80 and sr.quick["c64.t4.s1.p2.i4"].quick_us == 108,
     "a rechecked record keeps its fastest time and its quick time as quick_us")
T.ok(sr.quick["c128.t4.s1.p2.i4"].median_us == 90 and sr.quick["c512.t4.s1.p2.i4"].median_us == 110
     and sr.quick["c128.t4.s2.p2.i4"].median_us == 60, "a slower re-time, the fourth kernel and another decomposition: unchanged")
local each_k = true
for _, stage in ipairs { "k1", "k2" } do
  local n = 0
  for name in (stages[stage] or ""):gmatch("%S+") do n = n + 1; each_k = each_k and name:find("s1", 1, true) ~= nil end
  each_k = each_k and n == 3
end
T.ok(each_k and stages.k3 == nil and calls == 6, "2 rounds (stages k1, k2), each timing the 3 kernels once", calls)
local tight = { j = {}, spent = 0.5, budget = 1, quick = {}, refined = {}, n = 0, planned = 0 }
for name, r in pairs(sr.quick) do tight.quick[name] = r end
calls = 0
search.recheck(tight, hk, 0.1)
T.eq(calls, 0, "no round when it would leave under 40% of the job's budget")

-- The chunk row re-timed (after the Falcon-40B bf16 job of the tune at
-- 936b23b): the coarse pass times chunk 64 of tile 4 (true 80) in a slow
-- spell (120), behind chunks 32 (90) and 256 (95) and three tile-2 kernels
-- (100-104). The re-time of the fastest kernel's row (tile 4, isa 1: the
-- coarse chunks 256, 1024 and 64 beside 32, stage c) gives chunk 64 its
-- true time, so the fine pass measures its neighbour chunk 128 (78, the
-- fastest), a neighbour of no other kernel of the best three.
search.isas_of = function(_, tile) return tile % 2 == 0 and { 0, 1 } or { 0 } end
local row_truth = { [32] = 90, [64] = 80, [128] = 78, [256] = 95, [512] = 98, [1024] = 105 }
local first_c64 = true
calls, stages = 0, {}
measure.measure = function(_, c, stage, reps, _)
  calls = calls + 1
  local name = measure.config_name(c)
  stages[stage] = (stages[stage] or "") .. name .. " "
  local t = 300
  if c.isa == 1 and c.tile == 4 then t = row_truth[c.chunk] elseif c.isa == 1 and c.tile == 2 then t = 100 + c.chunk / 256 end
  if name == "c64.t4.s1.p2.i1" and first_c64 then first_c64, t = false, 1.5 * t end
  return { ok = true, c = c, config = name, key = name, median_us = t, times = { t }, reps = reps }
end
local hr = { chunk = 256, tile = 4, isa = 1, splits = 1, threads = 2 }
local sk = { j = { G = 4, D = 128, len = 700, max_isa = 1, log = {} }, spent = 0, budget = 1000, quick = {}, refined = {},
             n = 0, planned = 0 }
search.kernel_pass(sk, hr, 0.1, false, nil)
local c64 = sk.quick["c64.t4.s1.p2.i1"]
T.ok(c64 and c64.median_us == 80 and c64.quick_us == 120, "the row's slow-spell chunk 64 keeps its re-timed 80, quick_us 120",
     c64 and (c64.median_us .. " " .. tostring(c64.quick_us)))
T.eq(stages.c, "c256.t4.s1.p2.i1 c1024.t4.s1.p2.i1 c64.t4.s1.p2.i1 ",
     "stage c: the fastest kernel's row (chunk 32, tile 4, isa 1) once each, in quick order")
T.ok(sk.quick["c128.t4.s1.p2.i1"] ~= nil and sk.quick["c128.t4.s1.p2.i1"].median_us == 78,
     "the fine pass measures chunk 128, chunk 64's neighbour")
local sk2 = { j = sk.j, spent = 450, budget = 1000, quick = {}, refined = {}, n = 0, planned = 0 }
first_c64, stages = true, {}
search.kernel_pass(sk2, hr, 0.1, false, nil)
T.ok(stages.c == nil, "no re-time when it would leave under 55% of the job's budget", stages.c)
search.isas_of = isas_stub

-- Finalists: the fastest, the fastest at another decomposition, then quick order.
local function rec(name, s, p) return { config = name, c = { splits = s, threads = p } } end
local q = { rec("a", 1, 2), rec("b", 1, 2), rec("c", 1, 2), rec("d", 4, 2), rec("e", 2, 2) }
local function names_of(list) local o = {} for i, r in ipairs(list) do o[i] = r.config end return csv(o) end
T.eq(names_of(search.finalists(q, 3)), "a,b,d", "the fastest at another splits count is a finalist (quick order kept)")
T.eq(names_of(search.finalists(q, 2)), "a,d", "two finalists: the fastest and the fastest at another decomposition")
T.eq(names_of(search.finalists(q, 1)), "a", "one finalist: the fastest")
T.eq(names_of(search.finalists({ rec("a", 1, 2), rec("b", 1, 2), rec("c", 1, 2) }, 3)), "a,b,c",
     "one decomposition only: quick order")
T.eq(names_of(search.finalists({ rec("a", 1, 2), rec("b", 1, 1) }, 3)), "a,b", "fewer records than finalists")

-- Log notes: format, parse, round trip, errors naming the field.
local note = { build = "b1", shape = "sig", bucket = 1024, len = 700, cache = "cold", what = "c4096.t4.i1",
               why = "chunk 4096 >= 2 x the length 700", name = "tiny" }
local line = tlog.format_note("pruned", note)
T.ok(line:sub(1, 8) == "#pruned\t", "a pruned note starts with #pruned and a tab", line)
local back = tlog.parse_note(line)
T.ok(back and back.what == note.what and back.why == note.why and back.bucket == 1024 and back.len == 700,
  "a pruned note parses back")
T.eq(tlog.format_note("pruned", back), line, "a pruned note round-trips")
local cov = { build = "b1", shape = "sig", bucket = 1024, len = 700, cache = "cold", kernels = 34, space = 120,
              pruned = 12, decompositions = 9, configs = 50, name = "tiny" }
local cl = tlog.format_note("coverage", cov)
local cb = tlog.parse_note(cl)
T.ok(cb and cb.kernels == 34 and cb.space == 120 and cb.decompositions == 9, "a coverage note parses back")
T.eq(tlog.format_note("coverage", cb), cl, "a coverage note round-trips")
T.raises("field why is missing", "a note without a field is refused naming it", tlog.format_note, "pruned",
  { build = "b", shape = "s", bucket = 1, len = 1, cache = "cold", what = "x", name = "n" })
local _, err = tlog.parse_note("#coverage\tb\ts\t1\t1\tcold\tx\t1\t1\t1\t1\tn")
T.ok(err and err:find("field kernels", 1, true), "a malformed coverage note is refused naming the field", err)

-- Build ids (tuner/log.lua build_id): the library build, then the CPU, so a
-- Zen 4 and a Zen 5 VM that share a slug ("AMD EPYC", 2 cores, AVX512-BF16)
-- reuse none of each other's measurements; a table's build (no CPU) matches
-- its measurements on any CPU and in logs written before the CPU joined.
local machine = require("tuner.machine")
local CPUINFO = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: %d\nmodel\t\t: %d\nmodel name\t: AMD EPYC\n"
local zen4, zen5 = machine.cpu_id_of(CPUINFO:format(25, 17)), machine.cpu_id_of(CPUINFO:format(26, 2))
T.eq(zen4, "amd-f25-m17", "cpu id: vendor, family and model from /proc/cpuinfo")
T.eq(machine.cpu_id_of("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"),
  "intel-f6-m143", "cpu id of an Intel CPU")
T.eq(machine.cpu_id_of("processor\t: 0\nmodel name\t: ARMv8\n"), "unknown-cpu", "cpu id where cpuinfo does not say")
local lib = tlog.build_id("0.1.0", "5422f7916d423f19", "0.9.27")
local b4, b5 = tlog.build_id("0.1.0", "5422f7916d423f19", "0.9.27", zen4), tlog.build_id("0.1.0", "5422f7916d423f19", "0.9.27", zen5)
T.eq(b4, "0.1.0-5422f7916d423f19-tcc0.9.27-amd-f25-m17", "build id: library, templates, tcc, cpu")
T.ok(b4 ~= b5, "two CPU models of one slug have two build ids", b4 .. " " .. b5)
T.ok(tlog.of_build(b4, lib) and tlog.of_build(b5, lib) and tlog.of_build(lib, lib),
  "the library build matches its ids on every CPU and the ids without one")
T.ok(not tlog.of_build("0.1.0-5422f7916d423f19-tcc0.9.270", lib) and not tlog.of_build(b4, b5),
  "another tcc or another CPU's id does not match", b4)
do   -- a log of the Zen 4's measurements resumes nothing on the Zen 5
  local lp = os.tmpname()
  local f = io.open(lp, "w")
  f:write(tlog.format({ build = b4, shape = "sig", bucket = 1024, len = 1024, cache = "cold", stage = "quick",
    config = "c256.t4.s1.p2.i3", key = "1", ok = true, median_us = 10, times = { 10 }, name = "tiny" }), "\n")
  f:close()
  local on4, on5 = tlog.open(lp, b4), tlog.open(lp, b5)
  on4:close(); on5:close()
  T.eq(on4.old .. "," .. on5.old, "1,0", "measurements on record: 1 on its own CPU, 0 on the other")
  os.remove(lp)
end

-- Written once, read back on resume (the log file, no measurements).
local path = os.tmpname()
os.remove(path)
local L = tlog.open(path, "b1")
L:note("pruned", note); L:note("pruned", note); L:note("coverage", cov)
L:close()
local L2 = tlog.open(path, "b1")
L2:note("pruned", note); L2:note("coverage", cov)
L2:close()
local n, lines = 0, {}
for l in io.lines(path) do if tlog.note_kind(l) then n = n + 1; lines[#lines + 1] = l end end
T.eq(n, 2, "each note written once across a resume")
T.ok(L2.notes[line] ~= nil and L2.notes[line].why == note.why, "a resumed log parsed the notes back")
os.remove(path)

T.done()
