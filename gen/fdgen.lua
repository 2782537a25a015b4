-- fdgen: the generator's commands (key, source, gen, export), each described
-- by one row of the `commands` table below, which the help is generated from.
-- Run by the C CLI (build/fdgen, from the copies embedded in the library,
-- where fd_read is the template reader) or directly: lua5.4 gen/fdgen.lua ...
-- `fdgen --help` lists the commands; `fdgen help COMMAND` or
-- `fdgen COMMAND --help` describes one. Usage errors exit 2, failures 1.
local embedded = rawget(_G, "fd_read") ~= nil
local here = (arg and arg[0] or ""):match("^(.*)/gen/[^/]*$") or "."
if not embedded then package.path = here .. "/gen/?.lua;" .. package.path end
local key = require("key")
local space = require("space")
local generate = require("generate")
local files = require("files")

-- A generator over the embedded templates or the source tree's.
local function generator()
  return generate.new(embedded and { read = fd_read } or { dir = here .. "/templates" })
end

-- The key fields and their value names, for `fdgen key --help`.
local function key_fields_text()
  local lines = {}
  for _, f in ipairs(key.fields) do
    local vals = f.names and table.concat(f.names, "|", f.min, f.max) or ("%d..%d"):format(f.min, f.max)
    local def = key.defaults[f.name]
    lines[#lines + 1] = ("  %-10s %s%s"):format(f.name, vals,
      def and (" (default %s)"):format(f.names and f.names[def] or def) or " (required)")
  end
  return table.concat(lines, "\n")
end

-- `fdgen key encode FIELD=VALUE ...` or `fdgen key decode KEY`.
local function cmd_key(pos, _, fail)
  if pos[1] == "encode" then
    local t = {}
    for i = 2, #pos do
      local k, v = pos[i]:match("^([%w_]+)=(.+)$")
      if not k then fail(("'%s' is not FIELD=VALUE"):format(pos[i])) end
      t[k] = v
    end
    print(key.encode(t))
  elseif pos[1] == "decode" then
    if #pos ~= 2 then fail("key decode takes one KEY") end
    local f = key.decode(pos[2])
    for _, fd in ipairs(key.fields) do print(("%-10s %s"):format(fd.name, key.value_name(fd.name, f[fd.name]))) end
    print(key.describe(pos[2]))
  else
    fail(("unknown key action '%s' (encode or decode)"):format(pos[1]))
  end
end

-- `fdgen source KEY`.
local function cmd_source(pos)
  io.write(generator().source(pos[1]))
end

-- `fdgen gen SHAPES -o DIR`: one file per variant, plus DIR/index.tsv.
local function cmd_gen(pos, opts)
  local dir, g = opts["-o"], generator()
  local seen, keys, users = {}, {}, {}
  for _, s in ipairs(space.load_shapes(pos[1])) do
    for _, k in ipairs(space.variants(s)) do
      if not seen[k] then seen[k] = true; keys[#keys + 1] = k; users[k] = {} end
      table.insert(users[k], s.name)
    end
  end
  table.sort(keys)
  files.mkdir(dir)
  local index, written = { "# key\tfile\tshapes\tdescription" }, 0
  for _, k in ipairs(keys) do
    local name = "fd_k" .. k .. ".c"
    if files.write_if_changed(dir .. "/" .. name, g.source(k)) then written = written + 1 end
    index[#index + 1] = table.concat({ k, name, table.concat(users[k], ","), key.describe(k) }, "\t")
  end
  files.write_if_changed(dir .. "/index.tsv", table.concat(index, "\n") .. "\n")
  io.stderr:write(("fdgen: %d variants in %s (%d rewritten)\n"):format(#keys, dir, written))
end

-- `fdgen export TABLE -o HEADER [--default KEY] [--features LIST]` (gen/export.lua does the work).
local function cmd_export(pos, opts)
  local a = { "export", pos[1], "-o", opts["-o"] }
  if opts["--default"] then a[#a + 1] = "--default"; a[#a + 1] = opts["--default"] end
  if opts["--features"] then a[#a + 1] = "--features"; a[#a + 1] = opts["--features"] end
  require("export").cli(a, embedded and fd_read or nil, here)
end

local commands, by_name, help   -- help is defined after the table it reads

-- One row per command: usage arguments, bounds on the positional arguments,
-- options (each takes a value), a summary line, a description and examples.
commands = {
  { name = "key", args = "encode FIELD=VALUE ... | decode KEY", min = 1,
    summary = "encode a tiling key from its fields, or decode one",
    about = "encode prints the 17-digit key of the given fields (names or numbers);\n"
         .. "decode prints each field of KEY and a one-line description. Fields:\n" .. key_fields_text(),
    example = "fdgen key encode head_dim=128 chunk=256 group_tile=4 kv_dtype=bf16\nfdgen key decode 10256128040002220",
    run = cmd_key },
  { name = "source", args = "KEY", min = 1, max = 1,
    summary = "print the generated C source of one kernel key",
    about = "Writes the kernel unit of KEY (its descriptor symbol is fd_kKEY_desc) to stdout.",
    example = "fdgen source 10256128040002220 > k.c",
    run = cmd_source },
  { name = "gen", args = "SHAPES.lua -o DIR", min = 1, max = 1,
    options = { { "-o", "DIR", "directory to write the variants and DIR/index.tsv to (required)", required = true } },
    summary = "write every kernel variant a shape set needs, and an index",
    about = "One file DIR/fd_kKEY.c per variant the shapes of SHAPES.lua need, rewritten only when\n"
         .. "its content changes, and DIR/index.tsv (key, file, shapes, description).",
    example = "fdgen gen tuner/shapes/default.lua -o build/gen/default",
    run = cmd_gen },
  { name = "export", args = "TABLE -o HEADER [--default KEY] [--features LIST]", min = 1, max = 1,
    options = { { "-o", "HEADER", "the C header to write (required)", required = true },
                { "--default", "KEY", "kernel of the default row (default: the first row's fields, chunk 128, tile 1)" },
                { "--features", "LIST", "key feature digits whose kernels each row carries too (k_per_channel,beams)" } },
    summary = "turn a tuned table into a self-contained C header",
    about = "The header holds the table as static data, a lookup with a default row, the source of\n"
         .. "every kernel the rows select and a small executor: no Lua or tcc needed to use it.",
    example = "fdgen export results/tuned/$(fdgen machine).tsv -o flashdecode_tuned.h",
    run = cmd_export },
  { name = "help", args = "[COMMAND]", max = 1,
    summary = "print the list of commands, or one command's help",
    about = "`fdgen COMMAND --help` (or -h) prints the same as `fdgen help COMMAND`.",
    example = "fdgen help gen",
    run = function(pos) help(pos[1]) end },
}
by_name = {}
for _, c in ipairs(commands) do by_name[c.name] = c end

-- Write a command's usage line and options to f.
local function write_usage(f, c)
  f:write(("usage: fdgen %s %s\n"):format(c.name, c.args))
  f:write("options:\n")
  for _, o in ipairs(c.options or {}) do f:write(("  %-22s %s\n"):format(o[1] .. " " .. o[2], o[3])) end
  f:write(("  %-22s %s\n"):format("-h, --help", "print this help"))
end

-- Write the list of commands to f.
local function write_overview(f)
  f:write("usage: fdgen COMMAND [ARGS...]\n\nThe generator's commands:\n")
  for _, c in ipairs(commands) do f:write(("  %-9s %s\n"):format(c.name, c.summary)) end
  f:write("  (run, bench and machine are in the C command line, build/fdgen)\n\n"
       .. "`fdgen help COMMAND` or `fdgen COMMAND --help` describes one.\n\n"
       .. "example:\n  fdgen key decode 10256128040002220\n")
end

-- A usage error: one line and the usage (of c, or the list) on stderr, exit status 2.
local function usage_error(c, msg)
  io.stderr:write("fdgen: ", msg, "\n")
  if c then write_usage(io.stderr, c) else write_overview(io.stderr) end
  os.exit(2)
end

-- `fdgen help [COMMAND]` on stdout; `help --summary NAME` prints just the
-- summary line (the C CLI builds its list of commands with it).
help = function(name, summary_only)
  if not name then return write_overview(io.stdout) end
  local c = by_name[name] or usage_error(nil, ("unknown command '%s'"):format(name))
  if summary_only then return io.write(c.summary, "\n") end
  write_usage(io.stdout, c)
  io.write("\n", c.about, "\n\nexample:\n  ", (c.example:gsub("\n", "\n  ")), "\n")
end

-- Split a command's arguments into positional ones and options; nil on -h/--help.
local function parse(c, a)
  local pos, opts, known = {}, {}, {}
  for _, o in ipairs(c.options or {}) do known[o[1]] = o end
  local i = 2
  while a[i] do
    local s = a[i]
    if s == "-h" or s == "--help" then return nil end
    if s:sub(1, 1) == "-" and #s > 1 then
      local o = known[s] or usage_error(c, ("%s: unknown option '%s'"):format(c.name, s))
      opts[s] = a[i + 1] or usage_error(c, ("%s: option %s needs a value (%s)"):format(c.name, s, o[2]))
      i = i + 2
    else
      pos[#pos + 1] = s
      i = i + 1
    end
  end
  return pos, opts
end

-- Check the positional count and the required options of c.
local function check_args(c, pos, opts)
  if #pos < (c.min or 0) then usage_error(c, ("%s: missing argument (%s)"):format(c.name, c.args)) end
  if c.max and #pos > c.max then usage_error(c, ("%s: unexpected argument '%s'"):format(c.name, pos[c.max + 1])) end
  for _, o in ipairs(c.options or {}) do
    if o.required and not opts[o[1]] then usage_error(c, ("%s: option %s %s is required"):format(c.name, o[1], o[2])) end
  end
end

-- Run the command line in `arg`; returns normally on success.
local function main(a)
  local name = a[1]
  if not name then usage_error(nil, "no command given") end
  if name == "-h" or name == "--help" then return help() end
  if name == "help" and a[2] == "--summary" and a[3] and not a[4] then return help(a[3], true) end
  local c = by_name[name] or usage_error(nil, ("unknown command '%s'"):format(name))
  local pos, opts = parse(c, a)
  if not pos then return help(c.name) end
  check_args(c, pos, opts)
  c.run(pos, opts, function(msg) usage_error(c, c.name .. ": " .. msg) end)
end

local ok, err = pcall(main, arg)
if not ok then io.stderr:write(tostring(err), "\n"); os.exit(1) end
