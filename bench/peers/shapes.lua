-- The shapes of `make bench-peers`: the shapes of the benchmark set
-- (tuner/shapes/bench.lua, the same lengths and QUICK lengths) whose K/V the
-- harness gives ggml as they are (f32, f16, bf16), then the ones the
-- comparison with ggml adds. Fields as in bench.lua; kv_dtype may also be
-- "int8" (flashdecode's int8 + one f32 scale per row; ggml gets the same
-- values as q8_0 blocks: the int8 row below stands for the set's int8, q8_0
-- and q4_0 rows, which have no ggml twin of the same bytes). `peer_note` is
-- printed under the shape's rows.
local root = ...
local K = 1024
local HARNESS_KV = { f32 = true, f16 = true, bf16 = true }
local shapes = {}
for _, s in ipairs(dofile(root .. "/tuner/shapes/bench.lua")) do
  if HARNESS_KV[s.kv_dtype] then shapes[#shapes + 1] = s end
end

-- The shape named name, or nil.
local function named(name)
  for _, s in ipairs(shapes) do if s.name == name then return s end end
end

-- A copy of the benchmark shape named `name` with fields replaced.
local function variant_of(name, extra)
  local s = named(name) or error("bench/peers/shapes.lua: no benchmark shape " .. name)
  local t = {}
  for k, v in pairs(s) do t[k] = v end
  for k, v in pairs(extra) do t[k] = v end
  return t
end

if not named("falcon-40b-bf16") then   -- the benchmark set has had its own since issue 18
  shapes[#shapes + 1] = variant_of("falcon-40b", { name = "falcon-40b-bf16", q_dtype = "bf16", kv_dtype = "bf16",
                                                   out_dtype = "bf16" })
end
shapes[#shapes + 1] = variant_of("llama3-8b-f16", {
  name = "llama3-8b-int8", q_dtype = "f32", kv_dtype = "int8", out_dtype = "f32",
  kv_len = { 16 * K, 64 * K }, quick = { 16 * K },
  peer_note = "int8 K/V with one f32 scale per row (ours, 132 bytes per row) against ggml q8_0 (136 bytes per row: " ..
              "4 blocks of 32 codes + an f16 scale); every block carries its row's scale, so both hold the same values; " ..
              "ggml also rounds q to q8_0 for the dot products" })
return shapes
