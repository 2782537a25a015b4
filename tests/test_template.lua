-- Template engine: substitution, control lines, include, #line mapping, errors.
package.path = "tests/?.lua;gen/?.lua;" .. package.path
local T = require("check")
local template = require("template")

local files = {
  ["a.tpl"] = "int x = $(N);\n@ for i = 1, N do\ny$(i) = $(i * 2); /* $$ */\n@ end\n@ include(\"b.tpl\", {M = N + 1})\nend;\n",
  ["b.tpl"] = "z = $(M);\n",
  ["bad_lua.tpl"] = "ok\n@ if then\n",
  ["bad_call.tpl"] = "one\ntwo $(nosuch.field)\n",
  ["bad_dollar.tpl"] = "a $x\n",
  ["raise.tpl"] = "x\n@ error(\"too big\")\n",
  ["multi.tpl"] = "$(\"l1\\nl2\")\nafter\n",
  ["cerr.tpl"] = "int f(void) {\n  return 1;\n  this is not C;\n}\n",
}
local eng = template.new { read = function(n) return files[n], "missing" end }

local out = eng:render("a.tpl", { N = 2 })
T.ok(out:find("int x = 2;", 1, true), "expression substitution")
T.ok(out:find("y1 = 2; /* $ */", 1, true) and out:find("y2 = 4;", 1, true), "loop over control lines, $$ escape")
T.ok(out:find('#line 1 "b.tpl"\nz = 3;', 1, true), "include with extra params and its own #line")
T.ok(out:find('#line 6 "a.tpl"\nend;', 1, true), "#line back to the including template")
T.eq(select(2, out:gsub('#line 3 "a.tpl"', "")), 2, "#line at each loop iteration")
T.ok(out:sub(1, 16) == '#line 1 "a.tpl"\n', "#line at the start")
local plain = template.new { read = function(n) return files[n] end, line_directives = false }:render("a.tpl", { N = 1 })
T.ok(not plain:find("#line", 1, true), "line directives can be turned off")
local multi = eng:render("multi.tpl", {})
T.ok(multi:find('#line 1 "multi.tpl@1"\nl1\nl2\n#line 2 "multi.tpl"\nafter', 1, true),
     "a multi-line expansion is numbered as a file of its own, named after its template line")
T.eq(eng:render("a.tpl", { N = 3 }), eng:render("a.tpl", { N = 3 }), "deterministic output")

T.raises("^bad_lua.tpl:2: error: ", "Lua syntax error names the template line", eng.render, eng, "bad_lua.tpl", {})
T.raises("^bad_call.tpl:2: error: ", "Lua runtime error names the template line", eng.render, eng, "bad_call.tpl", {})
T.raises("^bad_dollar.tpl:1: error: '%$' must be followed", "bare $ refused", eng.render, eng, "bad_dollar.tpl", {})
T.raises("^raise.tpl:2: error: too big", "error() in a template", eng.render, eng, "raise.tpl", {})
T.raises("^nothere.tpl: error: cannot read template", "missing template", eng.render, eng, "nothere.tpl", {})

-- A C compiler error in generated code points at the template line.
local src = eng:render("cerr.tpl", {}, "templates/")
local path = os.tmpname() .. ".c"
local fh = assert(io.open(path, "w")); fh:write(src); fh:close()
local p = io.popen("tcc -c " .. path .. " -o /dev/null 2>&1"); local msg = p:read("*a"); p:close()
os.remove(path)
T.ok(msg:find("templates/cerr.tpl:3:", 1, true) ~= nil, "tcc error names templates/cerr.tpl:3", msg)
T.done()
