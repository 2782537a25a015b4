-- Tiling key: one decimal digit group per kernel parameter (see docs/DESIGN.md).
-- Keys are handled as decimal strings so that 17-digit keys survive LuaJIT,
-- whose numbers are doubles; Lua 5.4 integers are accepted on input too.
local M = {}

-- The field table and the key's length are gen/facts.lua's (KEY_FIELDS,
-- KEY_DIGITS): gen/build.lua keydefs turns them into build/fd_keydefs.h, so
-- the C runtime never restates them.
local facts = require("facts")
local F = facts
M.fields = F.KEY_FIELDS
M.DIGITS = F.KEY_DIGITS
M.FLAG_SPLIT, M.FLAG_LSE = F.FLAG_SPLIT, F.FLAG_LSE

local by_name = {}
for _, f in ipairs(M.fields) do by_name[f.name] = f end
M.by_name = by_name

-- Defaults for fields a caller may omit when encoding: the least value of
-- every field but the required ones (head_dim and chunk).
M.defaults = {}
for _, f in ipairs(M.fields) do if not f.required then M.defaults[f.name] = f.min end end

-- Turn a symbolic or numeric field value into an integer, or raise naming the field.
local function field_value(f, v)
  if type(v) == "string" and f.names then
    for i = f.min, f.max do if f.names[i] == v:lower() then return i end end
  end
  local n = tonumber(v)
  if n == nil or n ~= math.floor(n) then
    error(("key: field %s: '%s' is not an integer%s"):format(f.name, tostring(v),
      f.names and (" or one of " .. table.concat(f.names, "|", f.min, f.max)) or ""), 0)
  end
  if n < f.min or n > f.max then
    error(("key: field %s: %d is out of range %d..%d"):format(f.name, n, f.min, f.max), 0)
  end
  return math.floor(n)
end

-- Whether flag bit (a power of two) is set in flags (arithmetic, not bit
-- operators, so LuaJIT parses it too).
function M.has_flag(flags, bit)
  return math.floor(flags / bit) % 2 == 1
end

-- Why MSD planes (the planes digit) cannot serve the key's other fields, or
-- nil: 2 or 3 planes, int8 K, an isa record with the vnni group (or with the
-- msd16 group: 2 planes, gen/facts.lua msd16_fits), not both per-channel K
-- and beams.
function M.planes_misfit(t)
  local n = t.planes or 0
  if n == 0 then return nil end
  if n == 1 then return "1 plane is not served (0 = off, 2 or 3)" end
  if F.dtypes[t.kv_dtype].name ~= "i8" then
    return ("MSD planes need int8 K, not kv_dtype %s"):format(F.dtypes[t.kv_dtype].name)
  end
  local groups = F.isas[t.isa].groups
  if groups.msd16 and not groups.vnni then   -- one int16 plane (gen/facts.lua msd16_fits)
    if n ~= 2 then return ("isa %s serves 2 planes only (q as one int16 plane, vpmaddwd), not %d"):format(F.isas[t.isa].name, n) end
    if not F.msd16_fits(t.group_tile, t.head_dim) then
      return ("isa %s serves planes with group tiles %d to %d and head_dim a multiple of %d, not tile %d, head_dim %d"):format(
        F.isas[t.isa].name, F.MSD16_TILES[1], F.MSD16_TILES[2], F.MSD16_D, t.group_tile, t.head_dim)
    end
  elseif not groups.vnni then
    return ("MSD planes need an isa with int8 dot products (vpdpbusd), not isa %s"):format(F.isas[t.isa].name)
  end
  if (t.k_per_channel or 0) == 1 and (t.beams or 0) == 1 then
    return "MSD planes with per-channel K scales and beams are not served (q is refolded per source row, in f32)"
  end
  return nil
end

-- Why fast precision (the precision digit: bf16 weights in P.V by
-- vdpbf16ps) cannot serve the key's other fields, or nil: bf16 V and an isa
-- record with the bf16 group (row-major and head-lane tiles alike).
function M.precision_misfit(t)
  if (t.precision or 0) == 0 then return nil end
  if F.dtypes[t.kv_dtype].name ~= "bf16" then
    return ("fast precision (bf16 weights) needs bf16 V, not kv_dtype %s"):format(F.dtypes[t.kv_dtype].name)
  end
  if not F.isas[t.isa].groups.bf16 then
    return ("fast precision needs an isa with bf16 dot products (vdpbf16ps), not isa %s"):format(F.isas[t.isa].name)
  end
  return nil
end

-- Check a key's fields beyond their ranges: the reserved flag bit,
-- per-channel K scales without int8/fp8 K, MSD planes (planes_misfit) and
-- fast precision (precision_misfit).
local function check_fields(t)
  if M.has_flag(t.flags, F.FLAG_RESERVED) then
    error(("key: field flags: bit %d is reserved"):format(F.FLAG_RESERVED), 0)
  end
  if (t.k_per_channel or 0) == 1 and not F.dtypes[t.kv_dtype].quant then
    error(("key: field k_per_channel: per-channel K scales need int8/fp8 K, not kv_dtype %s"):format(
      F.dtypes[t.kv_dtype].name), 0)
  end
  local why = M.planes_misfit(t)
  if why then error("key: field planes: " .. why, 0) end
  why = M.precision_misfit(t)
  if why then error("key: field precision: " .. why, 0) end
end

-- Encode a table of fields (names or numbers) into a decimal key string; a
-- "key" entry (as left by decode) is ignored.
function M.encode(t)
  for k in pairs(t) do
    if k ~= "key" and not by_name[k] then error(("key: unknown field '%s'"):format(tostring(k)), 0) end
  end
  local vals = {}
  for _, f in ipairs(M.fields) do
    local v = t[f.name]
    if v == nil then v = M.defaults[f.name] end
    if v == nil then error(("key: field %s is required"):format(f.name), 0) end
    vals[f.name] = field_value(f, v)
  end
  check_fields(vals)
  local parts = {}
  for i = #M.fields, 1, -1 do
    local f = M.fields[i]
    parts[#parts + 1] = ("%0" .. f.width .. "d"):format(vals[f.name])
  end
  return (table.concat(parts):gsub("^0+", ""))
end

-- Normalize a key given as a string or Lua 5.4 integer into a 17-digit string.
local function key_digits(key)
  if math.type and math.type(key) == "integer" then
    if key < 0 then error("key: a key is never negative", 0) end
    key = ("%d"):format(key)
  elseif type(key) == "number" then
    error("key: pass keys as decimal strings (a float cannot hold 17 digits exactly)", 0)
  end
  if type(key) ~= "string" or not key:match("^%d+$") then
    error(("key: '%s' is not a decimal key"):format(tostring(key)), 0)
  end
  key = key:gsub("^0+", "")
  if #key > M.DIGITS then
    error(("key: %s has %d digits, a key has at most %d"):format(key, #key, M.DIGITS), 0)
  end
  return ("0"):rep(M.DIGITS - #key) .. key
end

-- Decode a key into a table of integer fields, refusing malformed keys.
function M.decode(key)
  local s = key_digits(key)
  local t = {}
  for _, f in ipairs(M.fields) do
    local hi = M.DIGITS - f.pos
    local v = tonumber(s:sub(hi - f.width + 1, hi))
    if v < f.min or v > f.max then
      error(("key: %s: field %s (digit%s %d%s) is %d, out of range %d..%d"):format(
        key, f.name, f.width > 1 and "s" or "", f.pos,
        f.width > 1 and ("-" .. (f.pos + f.width - 1)) or "", v, f.min, f.max), 0)
    end
    t[f.name] = v
  end
  local ok, err = pcall(check_fields, t)
  if not ok then error(("key: %s: %s"):format(key, err:gsub("^key: ", "")), 0) end
  t.key = s:gsub("^0+", "")
  return t
end

-- The symbolic name of a field's value ("bf16", "causal"), or the number.
function M.value_name(field, v)
  local f = by_name[field]
  return f.names and f.names[v] or tostring(v)
end

-- Describe a key in words, most significant field first.
function M.describe(key)
  local t = M.decode(key)
  local flags = {}
  if M.has_flag(t.flags, F.FLAG_SPLIT) then flags[#flags + 1] = "split partials" end
  if M.has_flag(t.flags, F.FLAG_LSE) then flags[#flags + 1] = "lse" end
  local extra = ((t.k_per_channel or 0) == 1 and ", K scales per channel" or "") .. ((t.beams or 0) == 1 and ", beams" or "")
    .. ((t.planes or 0) > 0 and (F.isas[t.isa].groups.vnni and (", MSD scores in %d int8 planes"):format(t.planes)
                                  or ", MSD scores in one int16 plane (the planes digit 2)") or "")
    .. ((t.precision or 0) == 1 and ", fast precision (bf16 weights)" or "")
  return ("template %d, chunk %d, head_dim %d, group tile %d, %s, %s, %s, out %s, kv %s, q %s, %s%s"):format(
    t.template, t.chunk, t.head_dim, t.group_tile, F.isas[t.isa].text,
    #flags > 0 and table.concat(flags, " + ") or "no flags", F.mask_modes[t.mask_mode].text,
    M.value_name("out_dtype", t.out_dtype), M.value_name("kv_dtype", t.kv_dtype),
    M.value_name("q_dtype", t.q_dtype), M.value_name("layout", t.layout):upper(), extra)
end

return M
