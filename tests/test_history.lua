-- bench/history.lua (`make bench-history`): a bench TSV parsed by its column
-- names, the targets of a shape set, each run's figures and verdict at them
-- (the most threads of the tcc row, cold; bench/roof.lua bound_met), the
-- runs read back from a scratch git repository newest first (one without the
-- per-call columns gives no figures), the level split, and the report's
-- summary and run rows. Pure Lua beside git: lua5.4 and LuaJIT.
package.path = "tests/?.lua;gen/?.lua;./?.lua;" .. package.path
local T = require("check")
local H = require("bench.history")

local COLS = "kind\tshape\tkv_len\tvariant\tcache\tthreads\tgbs\tceiling_gbs\tcall_bw_gbs\tpct_call_bw\tpct_call_roof"

-- A bench TSV: its banner (commit, date), the column line, then rows.
local function tsv(commit, rows, cols)
  return ("# flashdecode bench m; cpu X (2 cores); commit %s; 2026-11-30 03:38 UTC; flashdecode 0.1.0\n%s\n%s\n")
    :format(commit, cols or COLS, table.concat(rows, "\n"))
end

-- One data row of the columns above.
local function row(shape, len, variant, cache, threads, gbs, ceiling, call_bw, pct, pct_roof)
  return table.concat({ "run", shape, tostring(len), variant, cache, tostring(threads), gbs, ceiling, call_bw, pct,
                        pct_roof }, "\t")
end

local shapes = {
  { name = "s1", target = { pct = 75, at = { 16384, 65536 } } },
  { name = "plain" },
  { name = "s2", target = { pct = 70, at = { 2048 } } },
}
local targets = H.targets(shapes)
T.eq(#targets, 3, "targets: one per target length")
T.eq(targets[2].shape .. " " .. targets[2].len .. " " .. targets[2].pct, "s1 65536 75", "targets: shape, length, pct")
T.eq(targets[3].shape, "s2", "targets: shapes without a target are left out")

-- Parsing by column names, the banner's commit and date.
local run = H.parse_tsv(tsv("abc1234-dirty", {
  row("s1", 16384, "tcc", "cold", 1, "20", "100", "45", "40", "40"),
  row("s1", 16384, "tcc", "cold", 2, "40", "100", "45", "90", "90"),     -- the most threads: this one
  row("s1", 16384, "tcc", "warm", 2, "60", "100", "-", "-", "-"),
  row("s1", 16384, "cc", "cold", 2, "10", "100", "45", "20", "20"),
  row("s1", 65536, "tcc", "cold", 2, "30", "40", "77", "39", "75"),      -- capped, 75% of the roof: not met
  row("s2", 2048, "tcc", "cold", 2, "30", "44", "47", "63", "86"),       -- capped, 86% of the roof: met
}))
T.eq(run.commit, "abc1234-dirty", "parse: the run's commit from the banner")
T.eq(run.date, "2026-11-30 03:38", "parse: the run's date")
T.eq(#run.rows, 6, "parse: every data row")
T.eq(run.rows[2].pct_call_bw, "90", "parse: fields by column name")

local b = H.run_bounds(run, targets)
T.eq(b[1] and b[1].pct_bw, 90, "bounds: the cold tcc row at the most threads")
T.eq(b[1] and b[1].met, true, "bounds: 90% of the call bandwidth meets 75%")
T.eq(b[2] and b[2].met, false, "bounds: capped by the ceiling but 75% of the roof: not met")
T.eq(b[3] and b[3].met, true, "bounds: capped by the ceiling, 86% of the roof: met")
T.eq(b[3] and b[3].call_bw, 47, "bounds: the bandwidth at the calls")
T.eq(b[3] and b[3].capped, true, "bounds: capped where the ceiling is below the bandwidth at the calls")
T.eq(b[1] and b[1].capped, false, "bounds: not capped where it is above")

-- A row whose ceiling is above the call bandwidth needs its pct of the bandwidth.
local run2 = H.parse_tsv(tsv("def5678", { row("s2", 2048, "tcc", "cold", 2, "30", "90", "77", "60", "90") }))
local b2 = H.run_bounds(run2, targets)
T.eq(b2[3] and b2[3].met, false, "bounds: not capped, 60% of the bandwidth: not met whatever the roof share")
T.eq(b2[1], nil, "bounds: no row, no figures")

-- A failed row ("-") gives no figures.
local run3 = H.parse_tsv(tsv("f00d123", { row("s1", 16384, "tcc", "cold", 2, "-", "-", "-", "-", "-") }))
T.eq(H.run_bounds(run3, targets)[1], nil, "bounds: a row without a per-call fraction gives none")

-- The level split: the middle of the widest gap.
T.eq(H.level_split({ 46, 44, 78, 45, 77 }), 61.5, "level split: between the two levels")
T.eq(H.level_split({ 44 }), nil, "level split: one value, none")

-- The runs of a scratch repository, newest first; the oldest predates the per-call columns.
local dir = os.tmpname()
os.remove(dir)
local function git(args) return os.execute(("git -C '%s' %s >/dev/null 2>&1"):format(dir, args)) end
local ok = os.execute(("mkdir -p '%s/results/bench' && git -C '%s' init -q"):format(dir, dir))
T.ok(ok == true or ok == 0, "scratch repository created", dir)
git("config user.email t@example.com")
git("config user.name test")
local function commit(text, msg)
  local f = assert(io.open(dir .. "/results/bench/m.tsv", "w"))
  f:write(text)
  f:close()
  git("add -A")
  git(("commit -q -m '%s'"):format(msg))
end
commit(tsv("0ld0ld0", { "run\ts1\t16384\ttcc\tcold\t2\t40" }, "kind\tshape\tkv_len\tvariant\tcache\tthreads\tgbs"), "old")
commit(tsv("abc1234", { row("s1", 16384, "tcc", "cold", 2, "40", "100", "45", "90", "90") }), "slow")
commit(tsv("def5678", { row("s1", 16384, "tcc", "cold", 2, "55", "100", "78", "70", "70") }), "fast")
local runs = H.runs(dir, "m", targets)
T.eq(#runs, 3, "runs: one per commit of the TSV")
T.eq(runs[1].commit, "def5678", "runs: newest first")
T.eq(runs[3].commit, "0ld0ld0", "runs: the oldest last")
T.eq(next(runs[3].bounds), nil, "runs: no per-call columns, no figures")
T.eq(runs[2].bounds[1] and runs[2].bounds[1].met, true, "runs: the slow run meets 75%")
T.eq(runs[1].bounds[1] and runs[1].bounds[1].met, false, "runs: the fast run at 70% does not")
local f = io.popen(("git -C '%s' rev-parse --short=7 HEAD"):format(dir))
local head = f:read("*l")
f:close()
T.eq(runs[1].in_commit, head, "runs: the commit that holds each run")

-- A renamed file (the slug that gained its isa): the history before the
-- rename is read at the old path, and the rename itself is no run.
git("mv results/bench/m.tsv results/bench/m-avx2.tsv")
git("commit -q -m rename")
local function commit_at(name, text, msg)
  local g = assert(io.open(dir .. "/results/bench/" .. name .. ".tsv", "w"))
  g:write(text)
  g:close()
  git("add -A")
  git(("commit -q -m '%s'"):format(msg))
end
commit_at("m-avx2", tsv("fee1234", { row("s1", 16384, "tcc", "cold", 2, "44", "100", "46", "96", "96") }), "after")
local renamed = H.runs(dir, "m-avx2", targets)
T.eq(#renamed, 4, "runs: a renamed file keeps its history, the rename no run of its own")
T.eq(renamed[1].commit, "fee1234", "runs: after the rename, newest first")
T.eq(renamed[2].commit, "def5678", "runs: before the rename, read at the old path")
T.eq(renamed[2].in_commit, head, "runs: a run moved by a rename keeps the commit that added it")
T.eq(renamed[4].commit, "0ld0ld0", "runs: the oldest last, across the rename")

-- The report: targets without figures left out and named, the summary by level, a row per run.
-- A capped row's cell gives its share of the roof.
local capped_md = H.markdown("m", { { commit = "abc1234", in_commit = "abc1234", date = "d", bounds = { b[3] } } },
                             { targets[3] }, {}, nil)
T.ok(capped_md:find("**63 (47.0); 86% of roof**", 1, true) ~= nil, "report: a capped row's share of the roof", capped_md)

local sub, kept, none = H.measured(runs, targets)
T.eq(#kept, 1, "measured: only the target with figures")
T.eq(none[1], "s1 64k", "measured: the others named")
local md = H.markdown("m", sub, kept, none, nil)
T.ok(md:find("| s1 | 16k | 75% | 2 | 1 | 80 | 1 / 1 | 0 / 1 |", 1, true) ~= nil, "report: summary row (runs, met, median, by level)", md)
T.ok(md:find("| `abc1234` | `", 1, true) ~= nil and md:find("**90 (45.0)**", 1, true) ~= nil,
     "report: a run's row, its met cell bold", md)
T.ok(md:find("s1 64k", 1, true) ~= nil, "report: names the targets without figures", md)
os.execute(("rm -rf '%s'"):format(dir))

T.done()
