-- The phase profile's attribution (bench/profile.lua) on known perf report
-- lines: a kernel sample inside a statement's inline assembly takes the name
-- of the template line's `$(simd_NAME(` (or `$(NAME(`), one in the template's
-- C is "kernel_c" with its line, libflashdecode is the executor, anything else
-- outside; shares are % of the lines' sum, in the report's phase order, and
-- the C lines hottest first. Pure Lua: lua5.4 and LuaJIT.
package.path = "tests/?.lua;gen/?.lua;./?.lua;" .. package.path
local T = require("check")
local profile = require("bench.profile")

local function near(got, want, name)
  return T.ok(got ~= nil and math.abs(got - want) <= 1e-9 * math.max(1, math.abs(want)), name,
              ("got %s, want %s"):format(tostring(got), tostring(want)))
end

-- Templates as a reader gives them: decode.c.tpl line 3 the scores, 5 the
-- P.V, 7 plain C; prelude.c.tpl line 2 a C helper's body.
local TEMPLATES = {
  ["decode.c.tpl"] = { "/* head */", "", "$(simd_scores())", "", "$(simd_pv(blk))", "", "  for (h = 0; h < nh; h++) {" },
  ["prelude.c.tpl"] = { "static inline float fd_expf(float x) {", '$(exp_body("x", "p", "    "))' },
}
local function read(file) return TEMPLATES[file] end

-- parse_line: the samples, object and source line of a tab-separated line.
local n, dso, src = profile.parse_line(" 21.88% \t 2746       \tfd_k1003-26f9.so  \tdecode.c.tpl@3:1")
T.eq(n, 2746, "parse_line: the sample count")
T.eq(dso, "fd_k1003-26f9.so", "parse_line: the object, padding stripped")
T.eq(src, "decode.c.tpl@3:1", "parse_line: the source line")
T.eq(profile.parse_line("# Samples: 83K of event 'cpu-clock'"), nil, "parse_line: a comment is no line")
T.eq(profile.parse_line(""), nil, "parse_line: an empty line is no line")
T.eq(profile.parse_line(" 21.88% \tfd_k1003-26f9.so\tdecode.c.tpl@3:1"), nil, "parse_line: a line without the sample column is no line")

-- classify: statements by their template line, the kernel's C, executor, outside.
T.eq(profile.classify("fd_k1003-ab.so", "decode.c.tpl@3:1", read), "scores", "classify: simd_scores -> scores")
T.eq(profile.classify("fd_k1003-ab.so", "decode.c.tpl@5:1", read), "pv", "classify: simd_pv(blk) -> pv")
T.eq(profile.classify("fd_k1003-ab.so", "prelude.c.tpl@2:5", read), "exp_body", "classify: $(exp_body( -> exp_body")
T.eq(profile.classify("fd_k1003-ab.so", "decode.c.tpl@7:1", read), "decode.c.tpl@7",
     "classify: a #line at a template line without $( keeps file@line")
T.eq(profile.classify("fd_k1003-ab.so", "other.c.tpl@9:1", read), "other.c.tpl@9", "classify: an unknown template keeps file@line")
local id, where = profile.classify("fd_k1003-ab.so", "decode.c.tpl:7", read)
T.eq(id, "kernel_c", "classify: the template's C is kernel_c")
T.eq(where, "decode.c.tpl:7", "classify: ... with its template line")
id, where = profile.classify("fd_k1003-ab.so", "??:0", read)
T.eq(id .. " " .. where, "kernel_c ?", "classify: a kernel address without a line is kernel_c, ?")
T.eq(profile.classify("libflashdecode.so.0.1.0", ":0", read), "executor", "classify: libflashdecode is the executor")
T.eq(profile.classify("libc.so.6", "random.c:291", read), "outside", "classify: libc is outside")
T.eq(profile.classify("[kernel.kallsyms]", "exc_page_fault+215", read), "outside", "classify: the OS is outside")
T.eq(profile.classify("fd_kcache.so", "decode.c.tpl@3:1", read), "outside", "classify: only fd_k<digits>- objects are kernels")

-- aggregate: samples per phase over a report, in % of the lines' samples (200 here).
local report = table.concat({
  "# a header line",
  " 30.00% \t 60 \tfd_k1003-26f9.so\tdecode.c.tpl@3:1",
  " 20.00% \t 40 \tfd_k1003-26f9.so\tdecode.c.tpl@5:1",
  " 15.00% \t 30 \tfd_k1003-26f9.so\tdecode.c.tpl@3:1",
  " 10.00% \t 20 \tfd_k1003-26f9.so\tdecode.c.tpl:7",
  " 15.00% \t 30 \tfd_k1003-26f9.so\tdecode.c.tpl:2",
  "  5.00% \t 10 \tlibflashdecode.so.0.1.0\t:0",
  "  3.00% \t  6 \tlibc.so.6\trandom.c:291",
  "  2.00% \t  4 \tfd_k1003-26f9.so\tdecode.c.tpl@7:1",
}, "\n")
local a = profile.aggregate(report, read)
T.eq(a.samples, 200, "aggregate: samples is the lines' sum")
near(a.shares.scores, 45, "aggregate: scores 90 of 200 = 45%")
near(a.shares.pv, 20, "aggregate: pv 40 of 200 = 20%")
near(a.shares.kernel_c, 25, "aggregate: the kernel's C 50 of 200 = 25%")
near(a.shares.executor, 5, "aggregate: executor 5%")
near(a.shares.outside, 3, "aggregate: outside 3%")
near(a.shares["decode.c.tpl@7"], 2, "aggregate: an unnamed statement 2%")
local sum = 0
for _, v in pairs(a.shares) do sum = sum + v end
near(sum, 100, "aggregate: the shares add up to 100")
T.eq(table.concat(a.order, ","), "scores,pv,kernel_c,executor,outside,decode.c.tpl@7",
     "aggregate: the phases in report order, unknown ones last")
T.eq(#a.c_lines, 2, "aggregate: two C lines")
T.eq(a.c_lines[1][1], "decode.c.tpl:2", "aggregate: the hottest C line first")
near(a.c_lines[1][2], 15, "aggregate: ... at 30 of 200 = 15%")
T.eq(#profile.aggregate("", read).order, 0, "aggregate: an empty report has no phases")

T.eq(table.concat(profile.sort { "outside", "zz", "pv", "aa", "scores" }, ","), "scores,pv,outside,aa,zz",
     "sort: known phases in report order, then others by name")

-- labels: a known phase's words, an unknown one its own name.
T.eq(profile.label("pv"), "P·V", "label: pv")
T.eq(profile.label("decode.c.tpl@7"), "decode.c.tpl@7", "label: an unknown phase keeps its name")
local colors = {}
for _, p in ipairs(profile.PHASES) do
  T.ok(not colors[p.color], "color: " .. p.id .. " has a colour of its own", p.color)
  colors[p.color] = true
end
T.eq(profile.color("decode.c.tpl@7"), "#666666", "color: an unknown phase is grey")

-- template_reader: the repository's own decode template names the scores statement.
local lines = profile.template_reader("templates")("decode.c.tpl")
local found
for _, l in ipairs(lines or {}) do found = found or l:match("%$%(simd_scores%(") end
T.ok(found ~= nil, "template_reader: templates/decode.c.tpl has $(simd_scores(")
T.eq(profile.template_reader("templates")("nosuch.tpl"), nil, "template_reader: a missing template is nil")

T.done()
