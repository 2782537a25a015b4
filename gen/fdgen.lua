-- fdgen: the generator's commands. Run by the C CLI (build/fdgen, from the
-- copies embedded in the library, where fd_read is the template reader) or
-- directly: lua5.4 gen/fdgen.lua ...
--   fdgen key encode field=value ...     print the key
--   fdgen key decode KEY                 print the fields and a description
--   fdgen source KEY                     print the generated C source of KEY
--   fdgen gen SHAPES.lua -o DIR          write every variant a shape set needs, and DIR/index.tsv
--   fdgen export TABLE -o HEADER         a tuned table as a C header with its kernels and an executor
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

local function usage()
  io.stderr:write([[
usage: fdgen key encode field=value ...   (fields: layout q_dtype kv_dtype out_dtype mask_mode
                                            flags isa group_tile head_dim chunk template)
       fdgen key decode KEY
       fdgen source KEY
       fdgen gen SHAPES.lua -o DIR
       fdgen export TABLE -o HEADER [--default KEY]   (a tuned table -> a self-contained C header)
       fdgen run --shape NAME|SPEC [--shapes FILE] [--kv-len N] [--splits N] [--chunk N]
                 [--tile N] [--threads N] [--backend tcc|cc]      (C CLI only)
       fdgen bench [SHAPES.lua] [-o REPORT] [--splits N] [--chunk N] [--tile N]
                   [--threads N] [--reps N]                         (C CLI only)
       fdgen machine                                                (C CLI only: this machine's name)
]])
  os.exit(2)
end

-- `fdgen key encode|decode ...`
local function cmd_key(a)
  if a[2] == "encode" then
    local t = {}
    for i = 3, #a do
      local k, v = a[i]:match("^([%w_]+)=(.+)$")
      if not k then error(("fdgen: '%s' is not field=value"):format(a[i]), 0) end
      t[k] = v
    end
    print(key.encode(t))
  elseif a[2] == "decode" and a[3] then
    local f = key.decode(a[3])
    for _, fd in ipairs(key.fields) do print(("%-10s %s"):format(fd.name, key.value_name(fd.name, f[fd.name]))) end
    print(key.describe(a[3]))
  else
    usage()
  end
end

-- `fdgen gen SHAPES -o DIR`: one file per variant, plus DIR/index.tsv.
local function cmd_gen(a)
  local shapes_path, dir = a[2], nil
  for i = 3, #a do if a[i] == "-o" then dir = a[i + 1] end end
  if not shapes_path or not dir then usage() end
  local g = generator()
  local seen, keys, users = {}, {}, {}
  for _, s in ipairs(space.load_shapes(shapes_path)) do
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

local commands = {
  key = cmd_key,
  gen = cmd_gen,
  export = function(a) require("export").cli(a, embedded and fd_read or nil, here) end,
  source = function(a)
    if not a[2] then usage() end
    io.write(generator().source(a[2]))
  end,
}

local cmd = commands[arg[1] or ""]
if not cmd then usage() end
local ok, err = pcall(cmd, arg)
if not ok then io.stderr:write(tostring(err), "\n"); os.exit(1) end
