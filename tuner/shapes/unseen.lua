-- Shapes the default set (tuner/shapes/default.lua) does not contain, from
-- real models: an odd group size, head dims 96 and 256, batch > 1 and a 128k
-- tensor-parallel shard. `make tune SHAPES=tuner/shapes/unseen.lua` tunes
-- them; `make tune-sweep` times every configuration of them (tuner/sweep.lua).
-- One length each keeps a tuning run near 2 minutes on 2 cores.
local K = 1024

-- A bf16 causal decode shape of batch b.
local function bf16(name, b, hq, hkv, d, len)
  return { name = name, batch = b, n_q_heads = hq, n_kv_heads = hkv, head_dim = d, q_dtype = "bf16",
           kv_dtype = "bf16", out_dtype = "bf16", mask_mode = "causal", layout = "bhsd", kv_len = { len } }
end

return {
  -- Qwen2-7B: 28 query heads over 4 kv heads (G = 7), head_dim 128.
  bf16("qwen2-7b", 1, 28, 4, 128, 32 * K),
  -- Gemma-2-9B: 16 query heads over 8 kv heads, head_dim 256.
  bf16("gemma2-9b", 1, 16, 8, 256, 8 * K),
  -- Phi-3-mini: multi-head (32 / 32), head_dim 96, f16.
  { name = "phi3-mini", batch = 1, n_q_heads = 32, n_kv_heads = 32, head_dim = 96, q_dtype = "f16",
    kv_dtype = "f16", out_dtype = "f16", mask_mode = "causal", layout = "bhsd", kv_len = { 4 * K } },
  -- Mistral-7B at batch 4: 32 query heads over 8 kv heads, head_dim 128.
  bf16("mistral-7b-b4", 4, 32, 8, 128, 8 * K),
  -- Llama-3-70B, one shard of tensor parallelism 8: 8 query heads over 1 kv head at 128k.
  bf16("llama3-70b-tp8", 1, 8, 1, 128, 128 * K),
}
