-- The default shape set: decode shapes of common models. Fields: name, batch,
-- n_q_heads, n_kv_heads, head_dim, q/kv/out dtype (f32|f16|bf16; kv also
-- i8|fp8|e5m2|q8_0|q4_0), mask_mode (causal|mask|full), layout
-- (bhsd|bshd|paged), page_size (paged: keys per page), q_len (query tokens
-- per row, default 1), window and sink_tokens (a sliding window), softcap,
-- features (a list of names: alibi, sink_logits), kv_len (cache lengths to
-- tune), lse. A window, softcap or feature makes a signature token of its
-- own (gen/facts.lua SIGNATURE), so such a shape gets rows of its own; a
-- windowed one is tuned in the bucket of the keys its window leaves.
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
  -- Issue 18's bound shapes that the lines above do not cover (tuner/shapes/bench.lua
  -- times them against the read bandwidth): Llama-3.1-8B in f16, and the MQA batch
  -- and Falcon-40B in bf16, where the tuner's isa digit weighs vdpbf16ps scores
  -- against f32 FMA ones on this machine instead of leaving it to the cost model.
  { name = "llama3-8b-f16", batch = 1, n_q_heads = 32, n_kv_heads = 8, head_dim = 128,
    q_dtype = "f16", kv_dtype = "f16", out_dtype = "f16", mask_mode = "causal",
    layout = "bhsd", kv_len = { 16 * K, 64 * K } },
  { name = "mqa-b8-bf16", batch = 8, n_q_heads = 8, n_kv_heads = 1, head_dim = 128,
    q_dtype = "bf16", kv_dtype = "bf16", out_dtype = "bf16", mask_mode = "causal", layout = "bhsd",
    kv_len = { 4 * K, 16 * K } },
  { name = "falcon-40b-bf16", batch = 32, n_q_heads = 128, n_kv_heads = 8, head_dim = 64,
    q_dtype = "bf16", kv_dtype = "bf16", out_dtype = "bf16", mask_mode = "causal", layout = "bhsd",
    kv_len = { 2048 } },
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
  -- Mistral-7B's sliding window of 4096 keys over a 32k cache: one row, in the
  -- window's bucket (4096), whatever the cache length.
  { name = "mistral-7b-swa", batch = 1, n_q_heads = 32, n_kv_heads = 8, head_dim = 128,
    q_dtype = "bf16", kv_dtype = "bf16", out_dtype = "bf16", mask_mode = "causal", layout = "bhsd",
    window = 4096, kv_len = { 32 * K } },
  -- Gemma-2-9B's global layers: attention logits soft-capped at 50.
  { name = "gemma2-9b", batch = 1, n_q_heads = 16, n_kv_heads = 8, head_dim = 256,
    q_dtype = "bf16", kv_dtype = "bf16", out_dtype = "bf16", mask_mode = "causal", layout = "bhsd",
    softcap = 50, kv_len = { 8 * K } },
  -- MPT-7B: 32 heads of their own (MHA) with ALiBi's slopes 2^(-i/4) (tuner/workload.lua).
  { name = "mpt-7b-alibi", batch = 1, n_q_heads = 32, n_kv_heads = 32, head_dim = 128,
    q_dtype = "bf16", kv_dtype = "bf16", out_dtype = "bf16", mask_mode = "causal", layout = "bhsd",
    features = { "alibi" }, kv_len = { 2 * K } },
  -- Llama-3.1-8B over llama.cpp's q4_0 KV cache (--cache-type-k/v q4_0; q and out f32, as its graph).
  { name = "llama3-8b-q4_0", batch = 1, n_q_heads = 32, n_kv_heads = 8, head_dim = 128,
    q_dtype = "f32", kv_dtype = "q4_0", out_dtype = "f32", mask_mode = "causal", layout = "bhsd",
    kv_len = { 4 * K } },
  -- Llama-3.1-8B over an int8 KV cache with per-row scales (bf16 q and out): the
  -- tuner's isa digit chooses MSD int8 scores (isa 3 or 4) or f32 FMA ones.
  { name = "llama3-8b-int8", batch = 1, n_q_heads = 32, n_kv_heads = 8, head_dim = 128,
    q_dtype = "bf16", kv_dtype = "i8", out_dtype = "bf16", mask_mode = "causal", layout = "bhsd",
    kv_len = { 16 * K, 64 * K } },
}
