-- One decode step of grouped-query attention with flashdecode from LuaJIT.
--   LUA_PATH="lua/?.lua;;" luajit examples/luajit_decode.lua   (in the source tree, after `make lib`)
--   luajit examples/luajit_decode.lua                           (after `make install`)
local fd = require "flashdecode"

local H, HKV, D, S = 8, 2, 64, 300                 -- query heads, kv heads, head_dim, cache capacity
local ctx = fd.context { threads = 2 }
local plan = ctx:plan { batch = 1, n_q_heads = H, n_kv_heads = HKV, head_dim = D, kv_len = S,
                        q_dtype = "bf16", kv_dtype = "bf16", out_dtype = "bf16" }   -- causal, [B, Hkv, S, D]

-- 64-byte aligned arrays, filled through f32 -> bf16 conversion.
local q = fd.array("bf16", H * D, function(i) return math.sin(i) end)
local k = fd.array("bf16", HKV * S * D, function(i) return math.cos(0.37 * i) end)
local v = fd.array("bf16", HKV * S * D, function(i) return math.sin(0.11 * i) end)
local out = fd.array("bf16", H * D)

local pos = 249                                    -- this step's position: keys 0..249 are attended
plan:run { q = q, k = k, v = v, cur_pos = { pos }, out = out }
local info = plan:info(pos + 1)
print(("kernel %s (%s), chunk %d, %d split(s)"):format(info.key, info.isa, info.chunk, info.splits))

-- Head 0 by hand in doubles: softmax(q.K / sqrt(D)) V over keys 0..pos of kv head 0.
local w, sum, err = {}, 0, 0
for i = 0, pos do
  local s = 0
  for d = 0, D - 1 do s = s + fd.bf16_to_f32(q[d]) * fd.bf16_to_f32(k[i * D + d]) end
  w[i] = math.exp(s / math.sqrt(D))
  sum = sum + w[i]
end
for d = 0, D - 1 do
  local o = 0
  for i = 0, pos do o = o + w[i] * fd.bf16_to_f32(v[i * D + d]) end
  err = math.max(err, math.abs(o / sum - fd.bf16_to_f32(out[d])))
end
print(("out[0..3] = %.4f %.4f %.4f %.4f; head 0 max error %.2g"):format(
  fd.bf16_to_f32(out[0]), fd.bf16_to_f32(out[1]), fd.bf16_to_f32(out[2]), fd.bf16_to_f32(out[3]), err))

-- A bad argument is a Lua error naming the field, with the library's message.
local ok, msg = pcall(plan.run, plan, { q = q, k = k, v = v, cur_pos = { S }, out = out })
print(ok, msg)
plan:close()
ctx:close()
