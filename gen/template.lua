-- Template engine: C text with Lua escapes, compiled to a Lua function.
--
--   @ <lua statement>     a control line (the whole line is Lua): @ for d = 0, D-1 do
--   text $(expr) text     an output line; $(expr) is replaced by tostring(expr)
--   $$                    a literal '$'
--
-- Each template line becomes exactly one line of the compiled Lua chunk, so a
-- Lua error in a template names the template's own file and line. Output
-- lines carry `#line N "file"` directives whenever the output stops following
-- the template line by line (after control lines, at each loop iteration, on
-- include), so a C compiler error points back at the template.
--
-- Inside a template: every field of the params table, the Lua basics (ipairs,
-- pairs, math, string, table, tostring, tonumber, error, assert, select, type),
-- include(name[, extra]) to render another template in place, and
-- emit(text) to write a raw line.
local M = {}

local SAFE = { "ipairs", "pairs", "math", "string", "table", "tostring", "tonumber",
               "error", "assert", "select", "type", "unpack", "pcall" }

-- Split text into lines (a trailing newline does not make an extra line).
local function lines_of(text)
  local out = {}
  for line in (text .. (text:sub(-1) == "\n" and "" or "\n")):gmatch("(.-)\r?\n") do
    out[#out + 1] = line
  end
  return out
end

-- Find the ')' matching the '(' at position i, skipping Lua string literals.
local function matching_paren(s, i)
  local depth, j = 0, i
  while j <= #s do
    local c = s:sub(j, j)
    if c == '"' or c == "'" then
      local k = j + 1
      while k <= #s and s:sub(k, k) ~= c do k = k + (s:sub(k, k) == "\\" and 2 or 1) end
      j = k
    elseif c == "(" then depth = depth + 1
    elseif c == ")" then
      depth = depth - 1
      if depth == 0 then return j end
    end
    j = j + 1
  end
  return nil
end

-- Compile one output line to a Lua expression that yields its text.
local function compile_text(line, name, lnum)
  local parts, pos = {}, 1
  while true do
    local s = line:find("$", pos, true)
    if not s then break end
    if s > pos then parts[#parts + 1] = ("%q"):format(line:sub(pos, s - 1)) end
    local nxt = line:sub(s + 1, s + 1)
    if nxt == "$" then
      parts[#parts + 1] = '"$"'; pos = s + 2
    elseif nxt == "(" then
      local e = matching_paren(line, s + 1)
      if not e then error(("%s:%d: error: unclosed $( in template line"):format(name, lnum), 0) end
      parts[#parts + 1] = "_str(" .. line:sub(s + 2, e - 1) .. ")"
      pos = e + 1
    else
      error(("%s:%d: error: '$' must be followed by '(' or '$'"):format(name, lnum), 0)
    end
  end
  if pos <= #line then parts[#parts + 1] = ("%q"):format(line:sub(pos)) end
  if #parts == 0 then parts[1] = '""' end
  return table.concat(parts, " .. "):gsub("\\\n", "\\n")
end

-- Translate a template into Lua source, one Lua line per template line.
function M.translate(text, name)
  local out = {}
  for lnum, line in ipairs(lines_of(text)) do
    local code = line:match("^%s*@(.*)$")
    if code then
      out[lnum] = code
    else
      out[lnum] = ("_line(%d, %s)"):format(lnum, compile_text(line, name, lnum))
    end
  end
  return table.concat(out, "\n")
end

-- Turn a Lua error message "name:N: msg" into "name:N: error: msg".
local function as_c_error(msg)
  msg = tostring(msg)
  if msg:find(": error: ", 1, true) then return msg end
  local where, rest = msg:match("^([^:]+:%d+): (.*)$")
  if where then return where .. ": error: " .. rest end
  return "error: " .. msg
end

-- An engine renders templates read through opts.read(name) -> text or nil, err.
-- opts.line_directives (default true) controls the #line output.
function M.new(opts)
  local self = { read = opts.read, lines = opts.line_directives ~= false, compiled = {} }

  -- Compile (once) the template called name; returns a function of its env.
  local function compile(name)
    if self.compiled[name] then return self.compiled[name] end
    local text, err = self.read(name)
    if not text then error(("%s: error: cannot read template: %s"):format(name, tostring(err)), 0) end
    local src, fn = M.translate(text, name)
    if setfenv then -- LuaJIT: a fresh chunk per render, given its env by setfenv
      local _, lerr = loadstring(src, "=" .. name)
      if lerr then error(as_c_error(lerr), 0) end
      fn = function(env) return setfenv(loadstring(src, "=" .. name), env)() end
    else -- Lua 5.4: the env arrives as the chunk's argument, on line 1
      local chunk, lerr = load("local _ENV = ...; " .. src, "=" .. name, "t")
      if not chunk then error(as_c_error(lerr), 0) end
      fn = chunk
    end
    self.compiled[name] = fn
    return fn
  end

  -- Render template name with params into the output state st.
  local function render_into(st, name, params)
    local fn = compile(name)
    local env = {}
    for _, k in ipairs(SAFE) do env[k] = _G[k] end
    env.unpack = env.unpack or table.unpack
    for k, v in pairs(params) do env[k] = v end
    env._str = tostring
    -- Emit the output of template line lnum. An expansion spanning several
    -- lines (an asm statement) is numbered as a file of its own, named
    -- "<template>@<lnum>", so a compiler error inside it reads
    -- "decode.c.tpl@153:7: error:", line 7 of the expansion at line 153; the
    -- next line re-synchronizes. Directive texts are made once per line.
    local dirs = st.dirs[name]
    if not dirs then dirs = {}; st.dirs[name] = dirs end
    local out = st.out
    env._line = function(lnum, s)
      if not self.lines then out[#out + 1] = s; return end
      if s:find("\n", 1, true) then
        out[#out + 1] = ('#line 1 "%s%s@%d"'):format(st.prefix, name, lnum)
        out[#out + 1] = s
        st.file = nil
        return
      end
      if st.file ~= name or st.next ~= lnum then
        local dir = dirs[lnum]
        if not dir then dir = ('#line %d "%s"'):format(lnum, st.prefix .. name); dirs[lnum] = dir end
        out[#out + 1] = dir
      end
      out[#out + 1] = s
      st.file, st.next = name, lnum + 1
    end
    env.emit = function(s) st.out[#st.out + 1] = s; st.file = nil end
    env.include = function(sub, extra)
      local p = {}
      for k, v in pairs(params) do p[k] = v end
      for k, v in pairs(extra or {}) do p[k] = v end
      render_into(st, sub, p)
      st.file = nil
    end
    fn(env)
  end

  -- Render template name with params; returns the text or raises "file:line: error: ...".
  function self.render(_, name, params, prefix)
    local st = { out = {}, dirs = {}, prefix = prefix or "" }
    local ok, err = pcall(render_into, st, name, params or {})
    if not ok then error(as_c_error(err), 0) end
    return table.concat(st.out, "\n") .. "\n"
  end
  return self
end

return M
