-- The tuner's statistics (tuner/stats.lua) on synthetic ratio samples with
-- known answers: the sign-test interval against binomial tables, verdicts
-- (win, lose, tie, more), level switches, the rounds policy, determinism and
-- the table text of an interval. Pure Lua: runs on lua5.4 and LuaJIT.
package.path = "tests/?.lua;./?.lua;" .. package.path
local T = require("check")
local stats = require("tuner.stats")

-- n copies of x.
local function rep(x, n)
  local t = {}
  for i = 1, n do t[i] = x end
  return t
end

-- n values alternating a, b.
local function alt(a, b, n)
  local t = {}
  for i = 1, n do t[i] = i % 2 == 1 and a or b end
  return t
end

-- n values spread evenly over [lo, hi], in a fixed shuffled order (stride 7 mod n).
local function spread(lo, hi, n)
  local t = {}
  for i = 1, n do
    local k = (i * 7) % n
    t[i] = lo + (hi - lo) * k / (n - 1)
  end
  return t
end

-- Binomial(n, 1/2) cdf against exact fractions.
T.ok(math.abs(stats.sign_cdf(0, 6) - 1 / 64) < 1e-15, "P(X <= 0), n 6 = 1/64")
T.ok(math.abs(stats.sign_cdf(1, 10) - 11 / 1024) < 1e-15, "P(X <= 1), n 10 = 11/1024")
T.ok(math.abs(stats.sign_cdf(2, 10) - 56 / 1024) < 1e-15, "P(X <= 2), n 10 = 56/1024")
T.ok(math.abs(stats.sign_cdf(9, 20) - 0.411901) < 1e-6, "P(X <= 9), n 20 = 0.411901")
T.ok(math.abs(stats.sign_cdf(400, 1000) - 1.364e-10) < 1e-12, "P(X <= 400), n 1000 (log space, no underflow)")

-- The interval's order statistic k against the published 95% sign-test table
-- (n: k): 6:1 8:1 9:2 10:2 12:3 15:4 20:6 25:8 31:10; none below 6 rounds.
for _, c in ipairs { { 5, nil }, { 6, 1 }, { 8, 1 }, { 9, 2 }, { 10, 2 }, { 12, 3 }, { 15, 4 }, { 20, 6 }, { 25, 8 }, { 31, 10 } } do
  T.eq(stats.order_k(c[1], 0.95), c[2], ("95%% interval of %d rounds: order statistic"):format(c[1]))
end
local _, cover = stats.order_k(10, 0.95)
T.ok(math.abs(cover - (1 - 2 * 11 / 1024)) < 1e-12, "coverage of 10 rounds is 1 - 2 * 11/1024")

-- Nearest-rank quantiles of 4, 1, 3, 2: the ceil(q * 4)-th smallest.
T.eq(stats.quantile({ 4, 1, 3, 2 }, 0.25), 1, "quantile 0.25 of 1..4 is 1")
T.eq(stats.quantile({ 4, 1, 3, 2 }, 0.5), 2, "quantile 0.5 of 1..4 is 2")
T.eq(stats.quantile({ 4, 1, 3, 2 }, 0.75), 3, "quantile 0.75 of 1..4 is 3")
T.eq(stats.quantile({ 4, 1, 3, 2 }, 1), 4, "quantile 1 of 1..4 is 4")
T.eq(stats.quantile({ 4, 1, 3, 2 }, 0), 1, "quantile 0 of 1..4 is the smallest")
T.eq(stats.quantile({}, 0.5), nil, "quantile of nothing is nil")
T.eq(stats.quantile({ 5, 1, 4, 2, 3 }, 0.25), 2, "quantile 0.25 of 1..5 is the 2nd (rank 1.25 rounds up)")
T.eq(stats.quantile({ 5, 1, 4, 2, 3 }, 0.5), 3, "quantile 0.5 of 1..5 is the 3rd (rank 2.5 rounds up)")

-- The interval of 1..10 shuffled: [x(2), x(9)] = [2, 9], median 5.5.
local lo, med, hi = stats.interval({ 7, 3, 10, 1, 5, 9, 2, 8, 4, 6 }, 0.95)
T.ok(lo == 2 and med == 5.5 and hi == 9, "interval of 1..10 is 2..9, median 5.5", ("%s %s %s"):format(lo, med, hi))

-- Verdicts.
local d = stats.decide(rep(0.9, 8))
T.ok(d.decision == "win" and d.lo == 0.9 and d.hi == 0.9, "all ratios 0.9: win", d.decision)
T.eq(stats.decide(rep(1.1, 8)).decision, "lose", "all ratios 1.1: lose")
T.eq(stats.decide(rep(0.9, 5)).decision, "more", "5 rounds of 0.9: more (no 95% interval below 6)")
T.eq(stats.decide({ 0.5, 0.6 }).decision, "more", "2 rounds: more")
T.eq(stats.decide({}).decision, "more", "no rounds: more")
local a = stats.decide(alt(0.95, 1.05, 16)).decision
T.ok(a == "more", "alternating 0.95/1.05: more (interval 0.95..1.05 is wider than +-2%)", a)
T.eq(stats.decide(alt(0.99, 1.01, 16)).decision, "tie", "alternating 0.99/1.01: tie")
T.eq(stats.decide(spread(0.97, 0.99, 20)).decision, "win", "0.97..0.99: win (wins take precedence over ties)")
T.eq(stats.decide(spread(0.90, 1.10, 31)).decision, "more", "0.90..1.10 over 31 rounds: more")
T.eq(stats.decide(spread(0.90, 1.04, 31)).decision, "win", "0.90..1.04 over 31 rounds: win (x(22) = 0.998)")
T.eq(stats.decide(spread(0.90, 0.999, 8)).decision, "win", "0.90..0.999 over 8 rounds: win")
local one = spread(0.9, 0.98, 8)
one[3] = 1.2                                       -- one bad round of 8: the interval is x(1)..x(8)
T.eq(stats.decide(one).decision, "more", "8 rounds with one above 1: more")
local one20 = spread(0.9, 0.98, 20)
one20[5] = 1.2                                     -- one bad round of 20: k = 6, the interval stays below 1
T.eq(stats.decide(one20).decision, "win", "20 rounds with one above 1: win")

-- Level switches: incumbent times at two levels 1.3x apart (every fourth round slow).
local base, ratios = {}, {}
for i = 1, 24 do
  base[i] = i % 4 == 0 and 1300 or 1000
  ratios[i] = base[i] == 1000 and 0.90 + 0.001 * i or 1.05 + 0.001 * i   -- wins fast, loses slow
end
local lv = stats.levels(base)
T.ok(lv and math.abs(lv.ratio - 1.3) < 1e-9, "two levels 1.3x apart seen", lv and lv.ratio)
T.ok(lv and lv.of[4] == 2 and lv.of[1] == 1, "rounds labelled by level")
local all = stats.decide(ratios)
T.eq(all.decision, "win", "the pooled ratios alone would win (18 of 24 below 1)")
local sw = stats.decide(ratios, { base = base })
T.eq(sw.decision, "lose", "with the levels: the slow level's interval lies above 1: lose")
T.ok(sw.switch and sw.switch.levels[1].n == 18 and sw.switch.levels[2].n == 6, "18 fast rounds, 6 slow")
local both = {}
for i = 1, 24 do both[i] = 0.9 + 0.002 * i end
T.eq(stats.decide(both, { base = base }).decision, "win", "a win at both levels stays a win")
local mixed_slow = {}
for i = 1, 24 do   -- the slow level (6 rounds) wins by its median but 2 of 6 lose: its interval holds 1
  mixed_slow[i] = base[i] == 1000 and 0.85 or (i % 8 == 0 and 1.02 or 0.95)
end
local ms = stats.decide(mixed_slow, { base = base })
T.ok(ms.decision == "win" and ms.switch.levels[2].hi >= 1 and ms.switch.levels[2].med < 1,
     "a level whose median is below 1 holds the win though its interval holds 1", ms.decision)
local even_slow = {}
for i = 1, 24 do   -- the slow level at 1.01: no win there
  even_slow[i] = base[i] == 1000 and 0.85 or (i % 8 == 0 and 1.0 or 1.02)
end
T.eq(stats.decide(even_slow, { base = base }).decision, "more", "a level with median 1 blocks the win")
local few, fewr = {}, {}
for i = 1, 24 do                                   -- 5 slow rounds, losing: too few for a level interval
  few[i] = i % 5 == 2 and 1300 or 1000
  fewr[i] = few[i] == 1300 and 1.05 or 0.9 + 0.001 * i
end
local fd5 = stats.decide(fewr, { base = few })
T.ok(fd5.switch and fd5.switch.levels[2].n == 5 and fd5.decision == "win", "a level of 5 rounds does not block a win",
     fd5.decision)
T.eq(stats.levels(rep(1000, 24)), nil, "steady incumbent times: no switch")
T.eq(stats.levels(spread(1000, 1100, 24)), nil, "times within 10%: no switch")
T.eq(stats.levels({ 1000, 2000, 1000, 2000, 1000 }), nil, "5 rounds: too few to tell")

-- The rounds policy: batches until decided, capped.
local calls = 0
local function feed(list) return function(r) calls = calls + 1; return list[r], 1000 end end
local s = stats.sequential(feed(rep(0.9, 40)), { first = 8, batch = 8, max = 31 })
T.ok(s.decision == "win" and s.rounds == 8 and s.stop == "decided" and calls == 8, "clear win decided after the first 8 rounds")
calls = 0
s = stats.sequential(feed(alt(0.95, 1.05, 40)), { first = 8, batch = 8, max = 31 })
T.ok(s.decision == "more" and s.rounds == 31 and s.stop == "rounds cap" and calls == 31,
     "undecided: runs to the cap of 31 rounds", s.rounds)
local looks = 0
s = stats.sequential(feed(alt(0.95, 1.05, 40)), { first = 8, batch = 8, max = 31, more = function() looks = looks + 1; return looks < 2 end })
T.ok(s.stop == "time" and s.rounds == 16, "undecided: stops when the time runs out (after 2 batches)", s.rounds)
s = stats.sequential(feed(rep(0.9, 40)), { first = 8, max = 4 })
T.ok(s.decision == "more" and s.rounds == 4, "a cap below 6 rounds: more", s.rounds)
local mixed = spread(0.93, 1.01, 40)
s = stats.sequential(feed(mixed), { first = 8, batch = 8, max = 40 })
T.ok(s.decision == "win" and s.rounds > 8, "a marginal win needs more rounds", s.rounds .. " " .. s.decision)
-- Past the cap: a promising undecided win (median <= extend.below) goes on while extend.ok allows.
local third = {}
for i = 1, 70 do third[i] = i % 3 == 0 and 1.05 or 0.9 end
local ext = { max = 63, below = 0.97 }
s = stats.sequential(feed(third), { first = 8, batch = 8, max = 31 })
T.ok(s.decision == "more" and s.rounds == 31, "a win in 2 of 3 rounds is undecided at 31 rounds", s.rounds .. " " .. s.decision)
s = stats.sequential(feed(third), { first = 8, batch = 8, max = 31, extend = ext })
T.ok(s.decision == "win" and s.rounds > 31 and s.rounds <= 63 and s.extended, "extended past the cap, it is decided",
     s.rounds .. " " .. s.decision)
s = stats.sequential(feed(third), { first = 8, batch = 8, max = 31, extend = { max = 63, below = 0.97, ok = function() return false end } })
T.ok(s.rounds == 31 and s.stop == "rounds cap", "no extension when the budget says no", s.rounds)
s = stats.sequential(feed(alt(1.05, 0.95, 70)), { first = 8, batch = 8, max = 31, extend = ext })
T.ok(s.rounds == 31 and s.stop == "rounds cap", "no extension for a median near 1", s.rounds)
local err_round = function(r) if r == 3 then return nil, "boom" end return 0.9, 1 end
local e, why = stats.sequential(err_round, { first = 8 })
T.ok(e == nil and why == "boom", "a failed round's error comes back")

-- Determinism: the same samples give the same decision, run after run.
local d1, d2 = stats.decide(ratios, { base = base }), stats.decide(ratios, { base = base })
T.ok(d1.decision == d2.decision and d1.lo == d2.lo and d1.hi == d2.hi and stats.describe(d1) == stats.describe(d2),
     "deterministic decisions")
local shuffled = {}
for i = 1, #mixed do shuffled[i] = mixed[#mixed + 1 - i] end
local i1, i2 = stats.decide(mixed), stats.decide(shuffled)
T.ok(i1.lo == i2.lo and i1.hi == i2.hi and i1.med == i2.med, "the interval ignores the rounds' order")

-- Table text: outward rounding to 3 decimals, "-" when unbounded.
T.eq(stats.ci_text({ lo = 0.91234, hi = 0.95101 }), "0.912..0.952", "ci text rounds outward")
T.eq(stats.ci_text({ lo = 0.9, hi = 0.95 }), "0.900..0.950", "ci text of exact thousandths")
T.eq(stats.ci_text({ lo = 1.25, hi = 12.5 }), "1.250..12.500", "ci text above 1")
T.eq(stats.ci_text(stats.decide({ 0.9 })), "-", "ci text of no interval")
T.ok(stats.describe(sw):find("level switch 1.30x", 1, true), "describe names the level switch", stats.describe(sw))

-- The median (bench/roof.lua, bench/report.lua and tuner/search.lua call it):
-- odd and even counts, the caller's list left unsorted, nil for nothing.
local xs = { 3, 1, 2 }
T.eq(stats.median(xs), 2, "median of 3, 1, 2")
T.eq(xs[1], 3, "median leaves its list unsorted")
T.eq(stats.median({ 4, 1, 3, 2 }), 2.5, "median of an even count: mean of the middle two")
T.eq(stats.median({}), nil, "median of nothing: nil")

-- The memory's two levels in bandwidth samples (bench/history.lua and
-- bench/levels.lua): the middle of the widest gap, or nil for one level.
T.eq(stats.level_split({ 46, 44, 78, 45, 77 }), 61.5, "level split: between 46 and 77")
T.eq(stats.level_split({ 50, 47, 52, 49, 55 }), nil, "level split: one level (55 is not 1.3x 49.5)")
T.eq(stats.level_split({ 47, 48, 46, 38, 37, 47, 39 }), nil, "level split: 37-39 among 46-48 GB/s is no level (1.24x)")
T.eq(stats.level_split({ 50, 47, 52, 49, 55 }, 1.05), 53.5, "level split: a lower switch splits at 53.5")
local dips = { 12, 13 }
for i = 1, 100 do dips[#dips + 1] = 46 + i % 3 end
T.eq(stats.level_split(dips), nil, "level split: 2 dips among 102 samples are no level")
for i = 1, 10 do dips[#dips + 1] = 77 + i % 3 end
T.eq(stats.level_split(dips), 62.5, "level split: 10 of 112 samples at 77-79 are a level, the dips below")
T.eq(stats.level_split({ 44 }), nil, "level split: one value, none")
T.eq(stats.level_split({}), nil, "level split: no value, none")

T.done()
