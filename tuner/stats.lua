-- Decisions by statistics (pure Lua: Lua 5.1+ and LuaJIT, no FFI).
-- A candidate and an incumbent are timed back to back in paired rounds; each
-- round gives a ratio candidate/incumbent. The decision rests on the median
-- ratio and its distribution-free confidence interval: the sign-test interval
-- [x(k), x(n+1-k)] of the sorted ratios, k the largest with
-- 2 * P(Bin(n, 1/2) <= k - 1) <= 1 - level, which covers the true median with
-- probability at least level whatever the distribution (no 95% interval exists
-- below 6 rounds). Deterministic: the same ratios give the same answer.
--   win   the whole interval lies below 1
--   lose  the whole interval lies above 1
--   tie   the interval lies inside 1 +- tie (2%)
--   more  none of these: more rounds are needed
-- Level switches: when the incumbent's per-round times split into levels (the
-- median of the slowest third over that of the fastest third exceeds SWITCH),
-- the rounds are split at the geometric mean of the two and a win must hold
-- within each level that has rounds enough for an interval.
-- Rounds come in batches (sequential): FIRST rounds, then BATCH more until a
-- decision or the cap (rounds or seconds) is reached. Looking after each batch
-- makes the overall error rate somewhat above 1 - level; the batches are few.
local M = {}
M.LEVEL = 0.95     -- confidence level of the interval
M.TIE = 0.02       -- a tie: the interval inside 1 +- 2%
M.SWITCH = 1.15    -- slowest-third / fastest-third median of incumbent times that shows a level switch
M.FIRST = 8        -- rounds before the first look
M.BATCH = 8        -- rounds added per look

-- A sorted copy of a list of numbers.
local function sorted(t)
  local s = {}
  for i, x in ipairs(t) do s[i] = x end
  table.sort(s)
  return s
end

-- Median of a list of numbers (nil when empty).
function M.median(t)
  local s, n = sorted(t), #t
  if n == 0 then return nil end
  return n % 2 == 1 and s[(n + 1) / 2] or 0.5 * (s[n / 2] + s[n / 2 + 1])
end

-- The q-quantile (0 <= q <= 1) of a list of numbers by nearest rank: the
-- ceil(q * n)-th smallest, the smallest for q = 0 (nil when empty).
function M.quantile(t, q)
  local s, n = sorted(t), #t
  if n == 0 then return nil end
  return s[math.max(1, math.ceil(q * n))]
end

-- Values each side of a level split must hold, at least: this share of them
-- (and one). On the Zen 5 VM 0.1-0.4% of the rounds' samples are dips
-- (12-30 GB/s), and a level can hold as few as 4% of a long A/B's rounds.
M.LEVEL_SIDE = 0.03
-- The least ratio of the two sides' medians that makes them two levels: the
-- VM's levels are about 45 and 80 GB/s (1.7x); a spell of 38 GB/s among
-- samples of 47 (1.25x) is none.
M.LEVEL_RATIO = 1.3

-- The middle of the widest gap between the sorted values xs (bandwidth
-- samples: a shared machine's memory moves between two levels) that leaves
-- LEVEL_SIDE of them on each side (a few outliers, such as a sample taken
-- while the VM was descheduled, are no level), or nil for one level: fewer
-- than two values, or the median of the values above the gap less than
-- ratio (LEVEL_RATIO) times the median of those below it.
function M.level_split(xs, ratio)
  local t = sorted(xs)
  local side = math.max(1, math.ceil(M.LEVEL_SIDE * #t))
  local gap, at
  for i = side, #t - side do
    if not gap or t[i + 1] - t[i] > gap then gap, at = t[i + 1] - t[i], i end
  end
  if not at then return nil end
  local lo, hi = {}, {}
  for i = 1, #t do
    if i <= at then lo[#lo + 1] = t[i] else hi[#hi + 1] = t[i] end
  end
  if not (M.median(lo) > 0) or M.median(hi) < (ratio or M.LEVEL_RATIO) * M.median(lo) then return nil end
  return (t[at] + t[at + 1]) / 2
end

-- P(X <= k) for X ~ Binomial(n, 1/2), summed in log space (exact to rounding for n up to thousands).
function M.sign_cdf(k, n)
  if k < 0 then return 0 end
  if k >= n then return 1 end
  local logp, sum = n * math.log(0.5), 0
  for i = 0, k do
    sum = sum + math.exp(logp)
    logp = logp + math.log(n - i) - math.log(i + 1)
  end
  return math.min(sum, 1)
end

-- The order statistic k of the sign-test interval for n values at level, and
-- its exact coverage; nil when n is too small for any interval at that level.
function M.order_k(n, level)
  local alpha, k = 1 - level, nil
  for j = 1, math.floor((n + 1) / 2) do
    if 2 * M.sign_cdf(j - 1, n) <= alpha + 1e-12 then k = j else break end
  end
  if not k then return nil end
  return k, 1 - 2 * M.sign_cdf(k - 1, n)
end

-- The median of ratios and its confidence interval at level (default LEVEL):
-- lo, med, hi, coverage. Too few values: lo 0 and hi math.huge (unbounded).
function M.interval(ratios, level)
  local s, n = sorted(ratios), #ratios
  local med = M.median(s)
  local k, cover = M.order_k(n, level or M.LEVEL)
  if not k then return 0, med, math.huge, 1 end
  return s[k], med, s[n + 1 - k], cover
end

-- The verdict of one interval (see the file's comment).
local function verdict(lo, hi, tie)
  if hi == math.huge then return "more" end
  if hi < 1 then return "win" end
  if lo > 1 then return "lose" end
  if lo >= 1 - tie and hi <= 1 + tie then return "tie" end
  return "more"
end

-- Level switches in the incumbent's per-round times base: nil when none (or
-- fewer than 6 rounds), else { ratio = slow/fast third medians, cut, of = level of each round (1 fast, 2 slow) }.
function M.levels(base, switch)
  local n = #base
  if n < 6 then return nil end
  local s, third = sorted(base), math.floor(n / 3)
  local fast, slow = {}, {}
  for i = 1, third do fast[i], slow[i] = s[i], s[n + 1 - i] end
  local mf, ms = M.median(fast), M.median(slow)
  if not (mf > 0) or ms / mf <= (switch or M.SWITCH) then return nil end
  local cut, of = math.sqrt(mf * ms), {}
  for i, x in ipairs(base) do of[i] = x < cut and 1 or 2 end
  return { ratio = ms / mf, cut = cut, of = of }
end

-- The interval and verdict of the rounds of each level (lv from M.levels).
local function per_level(ratios, lv, o)
  local out = {}
  for l = 1, 2 do
    local r = {}
    for i, x in ipairs(ratios) do if lv.of[i] == l then r[#r + 1] = x end end
    local lo, med, hi = M.interval(r, o.level)
    out[l] = { n = #r, lo = lo, med = med, hi = hi, decision = verdict(lo, hi, o.tie) }
  end
  return out
end

-- Decide on paired ratios candidate/incumbent. opts: level, tie, switch,
-- base (the incumbent's per-round times, for level switches). Returns
-- { decision, lo, med, hi, coverage, n, switch = { ratio, cut, of, levels } or nil }.
function M.decide(ratios, opts)
  local o = opts or {}
  o = { level = o.level or M.LEVEL, tie = o.tie or M.TIE, switch = o.switch or M.SWITCH, base = o.base }
  local lo, med, hi, cover = M.interval(ratios, o.level)
  local d = { decision = verdict(lo, hi, o.tie), lo = lo, med = med, hi = hi, coverage = cover, n = #ratios }
  d.switch = o.base and M.levels(o.base, o.switch) or nil
  if d.switch then
    d.switch.levels = per_level(ratios, d.switch, o)
    for _, l in ipairs(d.switch.levels) do         -- a win must hold at every level that has an interval:
      if d.decision == "win" and l.hi ~= math.huge and (l.med >= 1 or l.lo > 1) then   -- its median below 1
        d.decision = l.lo > 1 and "lose" or "more"
      end
    end
  end
  return d
end

-- The rounds policy: round(r) runs paired round r and returns its ratio and
-- the incumbent's time (or nil and an error); rounds are added in batches
-- (opts.first, opts.batch) until decide() gives other than "more", opts.max
-- rounds are run, or opts.more(n) (seconds left?) says false. Returns the
-- decision with rounds (= n) and stop ("decided", "rounds cap" or "time"),
-- or nil and the error. opts.extend = { max, below, ok }: at the cap, a
-- candidate whose median ratio is at most below goes on to extend.max rounds
-- while ok(n) (the budget) says so: a promising but undecided win gets more
-- rounds instead of falling back to the incumbent.
function M.sequential(round, opts)
  local o = opts or {}
  local max = o.max or 31
  local target, ratios, base, extended = math.min(o.first or M.FIRST, max), {}, {}, nil
  while true do
    for r = #ratios + 1, target do
      local ratio, b = round(r)
      if not ratio then return nil, b end
      ratios[r], base[r] = ratio, b
    end
    local d = M.decide(ratios, { level = o.level, tie = o.tie, switch = o.switch, base = base })
    d.rounds, d.ratios, d.base, d.extended = #ratios, ratios, base, extended
    if d.decision ~= "more" then d.stop = "decided"; return d end
    local x = o.extend
    if #ratios >= max then
      if not (x and #ratios < x.max and d.med <= x.below and (not x.ok or x.ok(#ratios))) then
        d.stop = "rounds cap"; return d
      end
      max, extended = math.min(#ratios + (o.batch or M.BATCH), x.max), true
    end
    if o.more and not o.more(#ratios) then d.stop = "time"; return d end
    target = math.min(#ratios + (o.batch or M.BATCH), max)
  end
end

-- x rounded down (dir -1) or up (dir 1) to 3 decimals, as text.
local function round3(x, dir)
  local v = dir < 0 and math.floor(x * 1000 + 1e-9) or math.ceil(x * 1000 - 1e-9)
  return ("%d.%03d"):format(math.floor(v / 1000), v % 1000)
end

-- The interval as table text "lo..hi", rounded outward to 3 decimals ("-" when unbounded).
function M.ci_text(d)
  if not d or d.hi == math.huge then return "-" end
  return round3(d.lo, -1) .. ".." .. round3(d.hi, 1)
end

-- One line describing decision d: verdict, interval, median, rounds, why it stopped, levels.
function M.describe(d)
  local s = ("%s %s (median %.3f, %d rounds%s)"):format(d.decision, M.ci_text(d), d.med or 0, d.n,
    d.stop and d.stop ~= "decided" and (", stopped: " .. d.stop) or "")
  if d.switch then
    local l = d.switch.levels
    s = s .. ("; level switch %.2fx: fast %d rounds %s, slow %d rounds %s"):format(d.switch.ratio,
      l[1].n, M.ci_text(l[1]), l[2].n, M.ci_text(l[2]))
  end
  return s
end

return M
