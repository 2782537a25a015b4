-- `fdgen export TABLE -o HEADER [--default KEY]`: a tuned table -> one C
-- header with the table as static data, a lookup, a default row, the source
-- of every kernel the rows select and a small executor, so an application
-- compiled by its own compiler runs the tuned kernels without Lua or tcc.
-- Also the tuned-table parser the tuner reuses (M.parse).
local key = require("key")
local template = require("template")
local generate = require("generate")
local files = require("files")
local facts = require("facts")

local M = {}
-- The table format, shared with runtime/table.c through gen/facts.lua.
M.MAGIC = facts.TABLE_MAGIC
M.IDENTITY = facts.TABLE_IDENTITY
M.COLUMNS = "columns\t" .. table.concat(facts.TABLE_COLUMNS, "\t")
M.DEFAULT_CHUNK = facts.H_CHUNK   -- the default row's chunk (the planner heuristic's)

-- Split a line on tabs (empty fields kept).
local function fields_of(line)
  local t = {}
  for f in (line .. "\t"):gmatch("([^\t]*)\t") do t[#t + 1] = f end
  return t
end
M.fields_of = fields_of

-- The shape signature and the fit check: gen/facts.lua's, which runtime/plan.c
-- and runtime/table.c read too (through build/fd_keydefs.h).
M.parse_signature = facts.parse_signature
M.misfit = facts.misfit

-- A positive integer field, or an error naming it.
local function pos_int(v, name, bad)
  if not v:match("^%d+$") or tonumber(v) < 1 then bad(("field %s '%s' is not a positive integer"):format(name, v)) end
  return tonumber(v)
end

-- A finite number field, or an error naming it.
local function number(v, name, bad)
  local n = tonumber(v)
  if not n or n ~= n or n == math.huge or n == -math.huge or not v:match("^[-+%d.eE]+$") then
    bad(("field %s '%s' is not a number"):format(name, v))
  end
  return n
end

-- A decimal without sign or exponent ("0.912", "1") under 64 bytes (as
-- runtime/table.c takes), as a number, or nil.
local function decimal(v)
  if #v >= 64 or not (v:match("^%d+$") or v:match("^%d+%.%d+$")) then return nil end
  local n = tonumber(v)
  return n and n < math.huge and n or nil
end

-- The ratio_ci field: "-" (the heuristic's own row) or "lo..hi", two
-- decimals with 0 < lo <= hi; returns lo, hi (nil for "-") or bad(why).
local function ratio_ci(v, bad)
  if v == "-" then return nil end
  local at = v:find("..", 1, true)
  local lo, hi = at and decimal(v:sub(1, at - 1)), at and decimal(v:sub(at + 2))
  if not lo or not hi or lo <= 0 or lo > hi then
    bad(("field ratio_ci '%s' is not '-' or lo..hi (decimals, 0 < lo <= hi)"):format(v))
  end
  return lo, hi
end

-- Parse one row line; bad(why) raises naming the file and line.
local function parse_row(line, bad)
  local f = fields_of(line)
  if #f ~= #facts.TABLE_COLUMNS then
    bad(("has %d fields, want %d (%s)"):format(#f, #facts.TABLE_COLUMNS, table.concat(facts.TABLE_COLUMNS, " ")))
  end
  local r = { shape = f[1], key = f[3], median_text = f[6], gbps_text = f[7], heuristic_text = f[8], name = f[9],
              ratio_ci = f[10] }
  r.s = M.parse_signature(f[1]) or bad(("field shape '%s' is not a shape signature"):format(f[1]))
  r.bucket = pos_int(f[2], "bucket", bad)
  local ok, dec = pcall(key.decode, f[3])
  if not ok or dec.key ~= f[3] then   -- canonical: no leading zero (a new top digit may be 0)
    bad(("field key '%s' is not a tiling key: %s"):format(f[3], ok and "a leading zero" or dec))
  end
  local why = M.misfit(dec, r.s)
  if why then bad(("field key %s does not fit shape %s: %s"):format(f[3], f[1], why)) end
  r.fields = dec
  r.splits, r.threads = pos_int(f[4], "splits", bad), pos_int(f[5], "threads", bad)
  r.median_us, r.gbps = number(f[6], "median_us", bad), number(f[7], "gbps", bad)
  r.heuristic_us = number(f[8], "heuristic_us", bad)
  if r.name == "" then bad("field name is empty") end
  r.ci_lo, r.ci_hi = ratio_ci(f[10], bad)
  return r
end

-- A model line's value: [-]digits[.digits][e[+-]digits], finite (as
-- runtime/table.c takes); the number, or nil.
function M.model_value(v)
  local m, e = v:match("^(%-?%d+%.?%d*)(.*)$")
  if not m or (e ~= "" and not e:match("^[eE][-+]?%d+$")) or m:sub(-1) == "." or #v >= 64 then return nil end
  local x = tonumber(v)
  return x and x == x and x > -math.huge and x < math.huge and x or nil
end

-- The cost model (tuner/model.lua) from its lines' values by name:
-- { coef (by MODEL_FEATURES index), limits (by MODEL_LIMITS name) }; raises
-- why when a name is unknown or missing. The exported header ignores it.
function M.model_from_fields(fields)
  local m, known = { coef = {}, limits = {} }, {}
  for _, f in ipairs(facts.MODEL_FEATURES) do known[f[1]] = true end
  for _, n in ipairs(facts.MODEL_LIMITS) do known[n] = true end
  for name in pairs(fields) do if not known[name] then error(("unknown model name '%s'"):format(name), 0) end end
  for i, f in ipairs(facts.MODEL_FEATURES) do
    m.coef[i] = tonumber(fields[f[1]]) or error(("the model has no coefficient for feature %s"):format(f[1]), 0)
  end
  for _, n in ipairs(facts.MODEL_LIMITS) do
    m.limits[n] = tonumber(fields[n]) or error(("the model has no limit %s"):format(n), 0)
  end
  return m
end

-- Parse tuned-table text: { header (text), identity = {library=..}, rows };
-- any defect raises "path:line: why" (the table is taken whole or not at all).
function M.parse(text, path)
  local lines, n = {}, 0
  for l in text:gmatch("([^\n]*)\n") do lines[#lines + 1] = l end
  local function bad(why) error(("%s:%d: %s"):format(path, n, why), 0) end
  n = 1
  if lines[1] ~= M.MAGIC then bad(("not a flashdecode tuned table (want '%s')"):format(M.MAGIC)) end
  local ident = {}
  for i, name in ipairs(M.IDENTITY) do
    n = i + 1
    local l = lines[n] or bad("truncated in its header")
    local k, v = l:match("^(%w+)\t(.*)$")
    if k ~= name then bad(("want the %s line, got '%s'"):format(name, l)) end
    ident[name] = v
  end
  n = 7
  if lines[7] ~= M.COLUMNS then bad("the columns line is not '" .. M.COLUMNS:gsub("\t", " ") .. "'") end
  local t = { header = table.concat(lines, "\n", 1, 7) .. "\n", identity = ident, rows = {} }
  local model, known = nil, {}
  for _, f in ipairs(facts.MODEL_FEATURES) do known[f[1]] = true end
  for _, l in ipairs(facts.MODEL_LIMITS) do known[l] = true end
  for i = 8, #lines do
    n = i
    local count = lines[i]:match("^end\t(%d+)$")
    if count then
      if tonumber(count) ~= #t.rows then bad(("the end line counts %s rows but the table has %d"):format(count, #t.rows)) end
      if i ~= #lines or text:sub(-1) ~= "\n" then n = i + 1; bad("text after the end line") end
      if model then
        local ok, m = pcall(M.model_from_fields, model)
        if not ok then bad(m) end
        t.model = m
      end
      return t
    end
    local f = fields_of(lines[i])
    if f[1] == facts.MODEL_LINE then     -- the cost model (tuner/model.lua), after the rows
      if #f ~= 3 then bad(("a model line has %d fields, want 3 (model, name, value)"):format(#f)) end
      if not known[f[2]] then bad(("model name '%s' is not a feature or limit of gen/facts.lua"):format(f[2])) end
      model = model or {}
      if model[f[2]] then bad(("model name '%s' is given twice"):format(f[2])) end
      if not M.model_value(f[3]) then bad(("model value '%s' is not a finite number"):format(f[3])) end
      model[f[2]] = f[3]
    elseif model then bad("a row after the model lines")
    else t.rows[#t.rows + 1] = parse_row(lines[i], bad) end
  end
  n = #lines + 1
  bad("truncated (no end line)")
end

-- The key of a variant: key k with flags digit set to flags.
function M.variant(k, flags)
  local f = key.decode(k)
  f.flags = flags
  return key.encode(f)
end

-- A C string literal.
local function c_str(s)
  return '"' .. s:gsub('[%c"\\\128-\255]', function(c) return ("\\%03o"):format(c:byte()) end) .. '"'
end

-- The default row: key default_key, or the first row's fields with the
-- heuristic chunk and group tile 1 (which divides every group size), and no
-- MSD planes where they do not serve tile 1 (AVX2's int16 plane of q).
local function default_row(t, default_key)
  local k = default_key
  if not k then
    if #t.rows == 0 then error("fdgen export: the table has no rows; give --default KEY", 0) end
    local f = key.decode(t.rows[1].key)
    f.chunk, f.group_tile, f.flags = M.DEFAULT_CHUNK, 1, 0
    if key.planes_misfit(f) then f.planes = 0 end
    k = key.encode(f)
  end
  local ok, f = pcall(key.decode, k)
  if not ok then error("fdgen export: --default: " .. f, 0) end
  if f.flags ~= 0 then error(("fdgen export: --default %s: field flags must be 0"):format(k), 0) end
  return { key = f.key, fields = f, default = true, splits = 1, threads = 1, bucket = 0, shape = "default",
           name = "default", median_text = "0", gbps_text = "0", heuristic_text = "0" }
end

-- Make a kernel unit's external definitions static (several units and
-- several including files coexist); raises if one is left external.
local function make_static(src, k)
  src = src:gsub("\nvoid (fd_k%d+[%w_]*%()", "\nstatic void %1")
  src = src:gsub("\nconst fd_kernel_desc (fd_k%d+_desc)", "\nstatic const fd_kernel_desc %1")
  for line in src:gmatch("[^\n]+") do
    if line:match("^[%a_]") and line:match("fd_k%d") and not line:match("^static ") and not line:match("^typedef ") then
      error(("fdgen export: kernel %s: an external definition is left: %s"):format(k, line), 0)
    end
  end
  return src
end

-- The key fields that are fd_shape.features bits (gen/facts.lua KEY_FIELDS
-- feature): a header exported with --features holds, beside each row's
-- kernels, those of every combination c (1 .. 2^n - 1; bit i: FEATURE_DIGITS[i])
-- of the named ones the generator serves for the row.
local FEATURE_DIGITS = {}
for _, f in ipairs(facts.KEY_FIELDS) do if f.feature then FEATURE_DIGITS[#FEATURE_DIGITS + 1] = f end end
local FEATURE_COMBOS = math.floor(2 ^ #FEATURE_DIGITS) - 1

-- Is bit i (1-based) of combination c set?
local function combo_has(c, i) return math.floor(c / 2 ^ (i - 1)) % 2 == 1 end

-- The key of row key k with the feature digits of combination c, when every
-- digit it sets is in wanted (a set of names) and the generator serves it; else nil.
local function feature_key(k, c, wanted)
  local f = key.decode(k)
  for i, d in ipairs(FEATURE_DIGITS) do
    if combo_has(c, i) and not wanted[d.name] then return nil end
    f[d.name] = combo_has(c, i) and 1 or 0
  end
  local ok, fk = pcall(key.encode, f)   -- the key encoder refuses combinations that make no sense
  return ok and pcall(generate.params, fk) and fk or nil
end

-- The kernel symbols (plain, lse, split) of row key k for each feature
-- combination (nil where not exported).
local function feature_kernels(k, wanted)
  local out = {}
  for c = 1, FEATURE_COMBOS do
    local fk = feature_key(k, c, wanted)
    if fk then
      out[c] = { "fd_k" .. fk .. "_desc", "fd_k" .. M.variant(fk, key.FLAG_LSE) .. "_desc",
                 "fd_k" .. M.variant(fk, key.FLAG_SPLIT) .. "_desc" }
    end
  end
  return out
end

-- Row data for the template: numeric shape fields and the three kernel symbols.
local function row_params(r, wanted)
  local s = r.s
  if not s then   -- the default row fits no shape: every signature field 0
    s = {}
    for _, f in ipairs(facts.signature_fields()) do s[f[1]] = 0 end
  end
  return { sig = c_str(r.shape), name = c_str(r.name), key = c_str(r.key), s = s, bucket = r.bucket,
           splits = r.splits, threads = r.threads, median = r.median_text, gbps = r.gbps_text,
           heuristic = r.heuristic_text, plain = "fd_k" .. r.key .. "_desc",
           lse = "fd_k" .. M.variant(r.key, key.FLAG_LSE) .. "_desc",
           split = "fd_k" .. M.variant(r.key, key.FLAG_SPLIT) .. "_desc", feat = feature_kernels(r.key, wanted) }
end

-- Every kernel key the rows and the default row select (and their feature
-- combinations in wanted), sorted.
local function kernel_keys(rows, wanted)
  local seen, keys = {}, {}
  for _, r in ipairs(rows) do
    local bases = { r.key }
    for c = 1, FEATURE_COMBOS do bases[#bases + 1] = feature_key(r.key, c, wanted) end
    for _, b in ipairs(bases) do
      for _, v in ipairs(facts.variants) do
        local k = M.variant(b, v.flags)
        if not seen[k] then seen[k] = true; keys[#keys + 1] = k end
      end
    end
  end
  table.sort(keys)
  return keys
end

-- 1/sqrt(D) as a C double literal for every head_dim (matches the runtime's (float)(1.0 / sqrt(D))).
local function inv_sqrt(rows)
  local seen, out = {}, {}
  for _, r in ipairs(rows) do
    local d = r.fields.head_dim
    if not seen[d] then seen[d] = true; out[#out + 1] = { d = d, v = ("%.17g"):format(1 / math.sqrt(d)) } end
  end
  table.sort(out, function(a, b) return a.d < b.d end)
  return out
end

-- The C condition that row r was tuned for executed shape s, one comparison
-- per signature field (gen/facts.lua signature_fields): softcap on or off,
-- the feature bits that have a token.
local function same_shape_expr()
  local t = {}
  for _, f in ipairs(facts.signature_fields()) do
    local n = f[1]
    t[#t + 1] = f[2] == "on" and ("r->%s == (s->%s > 0)"):format(n, n)
      or f[2] == "bits" and ("r->%s == (s->%s & %du)"):format(n, n, facts.signature_feature_bits())
      or ("r->%s == s->%s"):format(n, n)
  end
  return table.concat(t, "\n         && ")
end

-- The header text for parsed table t, and its number of kernels. opts: source (name shown in the
-- banner), default_key, features (key field names whose combinations the rows carry too), read
-- (template reader) or dir (templates folder).
function M.render(t, opts)
  local wanted = {}
  for _, n in ipairs(opts.features or {}) do wanted[n] = true end
  local def = default_row(t, opts.default_key)
  local all = {}
  for _, r in ipairs(t.rows) do all[#all + 1] = r end
  all[#all + 1] = def
  local g = generate.new { read = opts.read, dir = opts.dir, line_directives = false }
  local kernels = {}
  for _, k in ipairs(kernel_keys(all, wanted)) do kernels[#kernels + 1] = { key = k, source = make_static(g.source(k), k) } end
  local rows = {}
  for i, r in ipairs(t.rows) do rows[i] = row_params(r, wanted) end
  local reader = opts.read or function(name)
    local s = files.read((opts.dir or "templates") .. "/" .. name)
    return s, s == nil and "cannot open" or nil
  end
  local eng = template.new { read = reader, line_directives = false }
  return eng:render("export.h.tpl", {
    SOURCE = opts.source, IDENT = t.identity, ROWS = rows, DEFAULT = row_params(def, wanted),
    DEFAULT_KEY = def.key, DEFAULT_DESC = key.describe(def.key), KERNELS = kernels, INV_SQRT = inv_sqrt(all),
    PAGE_SIZE_MIN = facts.PAGE_SIZE_MIN, PAGE_SIZE_MAX = facts.PAGE_SIZE_MAX, Q_LEN_MAX = facts.Q_LEN_MAX,
    FEATURE_COUNT = #facts.features, FEATURES_SERVED = facts.feature_bits(function(f) return f.served end),
    SHARED_KV = facts.feature_bits(function(f) return f.name == "shared_kv" end),
    HEADER_FEATURES = facts.feature_bits(function(f)
      return f.name == "shared_kv" or f.name == "alibi" or f.name == "sink_logits" or f.name == "k_per_channel"
        or f.name == "beams" end),
    K_PER_CHANNEL = facts.feature_bits(function(f) return f.name == "k_per_channel" end),
    BEAMS = facts.feature_bits(function(f) return f.name == "beams" end),
    FEATURE_DIGITS = FEATURE_DIGITS, FEATURE_COMBOS = math.max(FEATURE_COMBOS, 1),
    feature_bit_list = function()
      local v = {}
      for _, d in ipairs(FEATURE_DIGITS) do v[#v + 1] = tostring(d.feature) .. "u" end
      return #v > 0 and table.concat(v, ", ") or "0"
    end,
    -- a row's feat initializer: { &plain, &lse, &split } or { 0, 0, 0 } per combination
    feat_list = function(r)
      local v = {}
      for c = 1, math.max(FEATURE_COMBOS, 1) do
        local k = r.feat[c]
        v[#v + 1] = k and ("{ &%s, &%s, &%s }"):format(k[1], k[2], k[3]) or "{ 0, 0, 0 }"
      end
      return "{ " .. table.concat(v, ", ") .. " }"
    end,
    ALIBI = facts.feature_bits(function(f) return f.name == "alibi" end),
    SINK_LOGITS = facts.feature_bits(function(f) return f.name == "sink_logits" end),
    SHAPE_FIELDS = facts.SHAPE_FIELDS, SIG_FIELDS = facts.signature_fields(), FIT_SAME = facts.FIT_SAME,
    SAME_SHAPE = same_shape_expr(),
    C_TYPE = { int = "int", i64 = "int64_t", float = "float", unsigned = "unsigned" },
    DTYPE_COUNT = #facts.dtypes + 1,
    -- "v0, v1, ..." of f(record, value) over the dtypes, by fd_dtype value
    dtype_list = function(f)
      local v = {}
      for i = 0, #facts.dtypes do v[#v + 1] = f(facts.dtypes[i], i) end
      return table.concat(v, ", ")
    end,
    row_fields = function(r)
      local v = {}
      for _, f in ipairs(facts.signature_fields()) do
        local x = r.s[f[1]] or 0
        v[#v + 1] = f[2] == "on" and (x > 0 and "1" or "0") or f[2] == "bits" and (x .. "u") or tostring(x)
      end
      return table.concat(v, ", ")
    end,
  }, "templates/"), #kernels
end

-- The key feature names of a --features list "a,b" (each a KEY_FIELDS
-- feature digit's name), or an error naming the unknown one.
function M.feature_names(list)
  local known, out = {}, {}
  for _, d in ipairs(FEATURE_DIGITS) do known[d.name] = true end
  for n in (list or ""):gmatch("[^,]+") do
    if not known[n] then
      local names = {}
      for _, d in ipairs(FEATURE_DIGITS) do names[#names + 1] = d.name end
      error(("fdgen export: --features: '%s' is not a feature digit (%s)"):format(n, table.concat(names, ", ")), 0)
    end
    out[#out + 1] = n
  end
  return out
end

-- The directory part of a path ("." when none).
local function dirname(p) return p:match("^(.*)/[^/]*$") or "." end

-- `fdgen export TABLE -o HEADER [--default KEY]`; read is the embedded
-- template reader (nil: the source tree's templates under here).
function M.cli(a, read, here)
  local path, out, def, features
  local i = 2
  while a[i] do
    if a[i] == "-o" then out = a[i + 1]; i = i + 2
    elseif a[i] == "--default" then def = a[i + 1]; i = i + 2
    elseif a[i] == "--features" then features = M.feature_names(a[i + 1]); i = i + 2
    elseif not path and a[i]:sub(1, 1) ~= "-" then path = a[i]; i = i + 1
    else error(("fdgen export: unknown argument '%s'"):format(a[i]), 0) end
  end
  if not path or not out then
    error("usage: fdgen export TABLE -o HEADER [--default KEY] [--features k_per_channel,beams]", 0)
  end
  local text = files.read(path) or error(("fdgen export: %s: cannot read the table"):format(path), 0)
  local t = M.parse(text, path)
  local src, nk = M.render(t, { source = path:match("[^/]*$"), default_key = def, features = features, read = read,
                            dir = (here or ".") .. "/templates" })
  files.mkdir(dirname(out))
  local written = files.write_if_changed(out, src)
  io.stderr:write(("fdgen export: %s: %d rows, %d kernels (%s)\n"):format(out, #t.rows, nk,
    written and "written" or "unchanged"))
end

return M
