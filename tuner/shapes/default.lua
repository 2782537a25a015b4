-- The default shape set: decode shapes of common models. Fields: name, batch,
-- n_q_heads, n_kv_heads, head_dim, q/kv/out dtype (f32|f16|bf16), mask_mode
-- (causal|mask|full), layout (bhsd|bshd|paged), page_size (paged: keys per
-- page), q_len (query tokens per row, default 1), kv_len (cache lengths to
-- tune), lse.
local K = 1024
local llama_lens = { 1 * K, 4 * K, 16 * K, 64 * K }

-- A Llama-3.1-8B decode shape (or one tensor-parallel shard of it).
local function llama(hq, hkv, suffix)
  return { name = "llama3-8b" .. suffix, batch = 1, n_q_heads = hq, n_kv_heads = hkv, head_dim = 128,
           q_dtype = "bf16", kv_dtype = "bf16", out_dtype = "bf16", mask_mode = "causal",
           layout = "bhsd", kv_len = llama_lens }
end

return {
  llama(32, 8, ""),
  llama(16, 4, "-tp2"),
  llama(8, 2, "-tp4"),
  llama(4, 1, "-tp8"),
  { name = "falcon-40b", batch = 32, n_q_heads = 128, n_kv_heads = 8, head_dim = 64,
    q_dtype = "f16", kv_dtype = "f16", out_dtype = "f16", mask_mode = "causal", layout = "bhsd",
    kv_len = { 2048 } },
  { name = "mqa-b8-d64", batch = 8, n_q_heads = 8, n_kv_heads = 1, head_dim = 64,
    q_dtype = "f32", kv_dtype = "f16", out_dtype = "f32", mask_mode = "causal", layout = "bhsd",
    kv_len = { 4 * K } },
  { name = "mqa-b16-d128", batch = 16, n_q_heads = 8, n_kv_heads = 1, head_dim = 128,
    q_dtype = "f32", kv_dtype = "f16", out_dtype = "f32", mask_mode = "causal", layout = "bhsd",
    kv_len = { 4 * K } },
  { name = "mqa-b32-d256", batch = 32, n_q_heads = 8, n_kv_heads = 1, head_dim = 256,
    q_dtype = "f32", kv_dtype = "bf16", out_dtype = "f32", mask_mode = "causal", layout = "bhsd",
    kv_len = { 2 * K } },
  { name = "mha-32", batch = 1, n_q_heads = 32, n_kv_heads = 32, head_dim = 128,
    q_dtype = "f16", kv_dtype = "f16", out_dtype = "f16", mask_mode = "causal", layout = "bhsd",
    kv_len = { 4 * K, 16 * K } },
  -- A vLLM-style paged cache: a batch of 4 Llama-3.1-8B rows in pages of 64
  -- keys scattered over the pool (tuner/workload.lua).
  { name = "llama3-8b-paged", batch = 4, n_q_heads = 32, n_kv_heads = 8, head_dim = 128,
    q_dtype = "bf16", kv_dtype = "bf16", out_dtype = "bf16", mask_mode = "causal", layout = "paged",
    page_size = 64, kv_len = { 4 * K, 16 * K } },
  -- Speculative-decoding verification: 4 query tokens per row of Llama-3.1-8B.
  { name = "llama3-8b-q4", batch = 1, n_q_heads = 32, n_kv_heads = 8, head_dim = 128,
    q_dtype = "bf16", kv_dtype = "bf16", out_dtype = "bf16", mask_mode = "causal", layout = "bhsd",
    q_len = 4, kv_len = { 4 * K, 16 * K } },
  { name = "cross-attn-masked", batch = 4, n_q_heads = 16, n_kv_heads = 16, head_dim = 64,
    q_dtype = "f32", kv_dtype = "f32", out_dtype = "f32", mask_mode = "mask", layout = "bshd",
    kv_len = { 1500 }, lse = true },
}
