-- bench/levels.lua (the cold two-builds A/B by memory level): the rounds
-- file parsed and refused line by line, the rounds split at the widest gap
-- of their read bandwidths (each level's ratio median and quartiles), one
-- level left unsplit, and the report's lines. Pure Lua: lua5.4 and LuaJIT.
package.path = "tests/?.lua;./?.lua;" .. package.path
local T = require("check")
local L = require("bench.levels")

local HEAD = "shape\tround\tread_gbs\ta_us\tb_us"

-- A rounds file: the banner, the column line, then rows {shape, read, a, b}.
local function file(rows)
  local out = { "# builds rounds: A a.so, B b.so, 8 rounds, cold", HEAD }
  for i, r in ipairs(rows) do out[#out + 1] = ("%s\t%d\t%.2f\t%.1f\t%.1f"):format(r[1], i - 1, r[2], r[3], r[4]) end
  return table.concat(out, "\n") .. "\n"
end

-- Two shapes; s1 wins 10% at the slow level (45-50 GB/s) and loses 20% at the fast one (90-95).
local rows = {}
for i = 1, 4 do
  rows[#rows + 1] = { "s1", 44 + i, 100, 90 }
  rows[#rows + 1] = { "s1", 89 + i, 60, 72 }
  rows[#rows + 1] = { "s2", 45 + i, 50, 50 }
end
local run = assert(L.parse(file(rows)))
T.eq(#run.rounds, 12, "parse: 12 rounds")
T.eq(run.banner, "builds rounds: A a.so, B b.so, 8 rounds, cold", "parse: the banner")
T.eq(run.rounds[2].read, 90, "parse: a round's read GB/s")

local t, split = L.table(run)
T.eq(split, 69.5, "split: the middle of the gap between 49 and 90 GB/s")
T.eq(#t, 2, "table: one row per shape, in order")
T.eq(t[1].shape, "s1", "table: s1 first")
T.eq(t[1].all.n, 8, "table: s1 has 8 rounds")
T.eq(t[1].slow.n, 4, "slow level: 4 rounds of s1")
T.eq(t[1].slow.ratio, 0.9, "slow level: s1's B/A 0.9")
T.eq(t[1].fast.ratio, 1.2, "fast level: s1's B/A 1.2")
T.eq(t[1].fast.read, 91.5, "fast level: s1's median read GB/s")
T.eq(t[2].fast, nil, "s2 has no fast round: no fast figures")
T.eq(t[2].slow.ratio, 1, "s2 slow: B/A 1")

-- One level: the same rounds with every read near 50 GB/s.
local flat = {}
for i, r in ipairs(rows) do flat[i] = { r[1], 48 + i % 3, r[3], r[4] } end
local t1, split1 = L.table(assert(L.parse(file(flat))))
T.eq(split1, nil, "one level: no split")
T.eq(t1[1].slow, nil, "one level: no slow figures")
T.eq(t1[1].all.ratio, 1.05, "one level: s1's B/A over all rounds (0.9 and 1.2: the median of eight)")

local md = L.markdown(run)
T.ok(md:find("slow at or below 69.5 GB/s", 1, true), "report: the split named")
T.ok(md:find("| s1 | fast | 4 | 91.5 | 60.0 | 72.0 | 1.200 | 1.200-1.200 |", 1, true), "report: s1's fast line")
T.ok(md:find("| s1 | slow | 4 | 46.5 | 100.0 | 90.0 | 0.900 | 0.900-0.900 |", 1, true), "report: s1's slow line")
T.ok(not md:find("| s2 | fast", 1, true), "report: no line for a level without rounds")
T.ok(L.markdown(assert(L.parse(file(flat)))):find("One memory level", 1, true), "report: one level said")

-- Refusals, each naming the line.
local bad = { { "no column line", "# x\n" },
              { "line 2: the columns", "# x\nshape\tround\tgbs\n" },
              { "line 3: not a round", "# x\n" .. HEAD .. "\ns1\t0\tfast\t1\t2\n" },
              { "line 3: not a round", "# x\n" .. HEAD .. "\ns1\t0\t50\t0\t2\n" },
              { "line 3: not a round", "# x\n" .. HEAD .. "\ns1\t0\t.\t1\t2\n" },
              { "line 4: not a round", "# x\n" .. HEAD .. "\n\ns1\t0\t50\t1\n" } }
for _, b in ipairs(bad) do
  local r, err = L.parse(b[2])
  T.ok(r == nil and err and err:find(b[1], 1, true), "refused: " .. b[1], err)
end

T.done()
