-- The benchmark shape set (`make bench`), in the format of default.lua. Extra
-- fields read only by tuner/bench.lua: quick (the kv lengths of a QUICK=1 run),
-- sweep (draw this shape's GB/s and time-vs-kv_len charts), threads_at (run the
-- 1..N thread scaling of this shape at that kv_len), target (issue 18's bound:
-- the planner's kernel, cold, at least pct % of the read bandwidth sampled next
-- to each call, or 85 % of the roof where a measured compute ceiling is below
-- that bandwidth, at the lengths `at`). Causal shapes run with
-- cur_pos = kv_len - 1 for every batch row (the full length is valid).
local K = 1024

-- Llama-3.1-8B decode (B=1, Hq=32, Hkv=8, D=128) with q, KV and out in one dtype.
local function llama(dt, lens, extra)
  local s = { name = "llama3-8b-" .. dt, batch = 1, n_q_heads = 32, n_kv_heads = 8, head_dim = 128,
              q_dtype = dt, kv_dtype = dt, out_dtype = dt, mask_mode = "causal", layout = "bhsd",
              kv_len = lens, quick = { 1 * K, 16 * K }, sweep = true }
  for k, v in pairs(extra or {}) do s[k] = v end
  return s
end

return {
  llama("f16", { 1 * K, 4 * K, 16 * K, 64 * K }, { target = { pct = 75, at = { 16 * K, 64 * K } } }),
  llama("bf16", { 1 * K, 4 * K, 16 * K, 64 * K }, { threads_at = 16 * K, quick_threads_at = 4 * K,
                                                   target = { pct = 85, at = { 16 * K, 64 * K } } }),
  -- One tensor-parallel shard (TP=8) of it: a single kv head, lengths to 128k.
  { name = "llama3-8b-tp8", batch = 1, n_q_heads = 4, n_kv_heads = 1, head_dim = 128,
    q_dtype = "bf16", kv_dtype = "bf16", out_dtype = "bf16", mask_mode = "causal", layout = "bhsd",
    kv_len = { 1 * K, 2 * K, 4 * K, 8 * K, 16 * K, 32 * K, 64 * K, 128 * K }, quick = { 4 * K, 32 * K }, sweep = true },
  -- Multi-query attention, batched.
  { name = "mqa-b8", batch = 8, n_q_heads = 8, n_kv_heads = 1, head_dim = 128,
    q_dtype = "f32", kv_dtype = "f16", out_dtype = "f32", mask_mode = "causal", layout = "bhsd",
    kv_len = { 16 * K }, quick = { 4 * K } },
  -- Falcon-40B decode.
  { name = "falcon-40b", batch = 32, n_q_heads = 128, n_kv_heads = 8, head_dim = 64,
    q_dtype = "f16", kv_dtype = "f16", out_dtype = "f16", mask_mode = "causal", layout = "bhsd",
    kv_len = { 2048 }, quick = { 2048 } },
  -- The two grouped shapes again in bf16 (q, KV and out), as issue 18 states
  -- its targets: bf16 K lets the scores take vdpbf16ps where the tile allows.
  { name = "mqa-b8-bf16", batch = 8, n_q_heads = 8, n_kv_heads = 1, head_dim = 128,
    q_dtype = "bf16", kv_dtype = "bf16", out_dtype = "bf16", mask_mode = "causal", layout = "bhsd",
    kv_len = { 16 * K }, quick = { 4 * K }, target = { pct = 80, at = { 4 * K, 16 * K } } },
  { name = "falcon-40b-bf16", batch = 32, n_q_heads = 128, n_kv_heads = 8, head_dim = 64,
    q_dtype = "bf16", kv_dtype = "bf16", out_dtype = "bf16", mask_mode = "causal", layout = "bhsd",
    kv_len = { 2048 }, quick = { 2048 }, target = { pct = 70, at = { 2048 } } },
  -- Multi-head attention (one query head per kv head).
  { name = "mha-32", batch = 1, n_q_heads = 32, n_kv_heads = 32, head_dim = 128,
    q_dtype = "f16", kv_dtype = "f16", out_dtype = "f16", mask_mode = "causal", layout = "bhsd",
    kv_len = { 16 * K }, quick = { 4 * K } },
  -- Speculative-decoding verification: 4 query tokens per row, each K/V row read
  -- once for the 4 x 4 query rows of a kv head (the vanilla baseline serves one token).
  llama("bf16", { 16 * K }, { name = "llama3-8b-q4", q_len = 4, quick = { 4 * K }, sweep = false }),
  -- llama.cpp's quantized KV caches (ggml q8_0 / q4_0 blocks: 34 and 18 bytes per 32
  -- values, the KV GB/s counted in those bytes), f16 q and out.
  llama("f16", { 4 * K, 16 * K, 64 * K }, { name = "llama3-8b-q8_0", kv_dtype = "q8_0", quick = { 16 * K }, sweep = false }),
  llama("f16", { 4 * K, 16 * K, 64 * K }, { name = "llama3-8b-q4_0", kv_dtype = "q4_0", quick = { 16 * K }, sweep = false }),
  -- int8 KV cache (per-row f32 scales; MSD scores on VNNI), bf16 q and out; the
  -- KV GB/s counted in its real bytes (128 codes and a 4-byte scale per row).
  llama("bf16", { 16 * K, 64 * K }, { name = "llama3-8b-int8", kv_dtype = "i8", quick = { 16 * K }, sweep = false,
                                       target = { pct = 85, at = { 16 * K, 64 * K } } }),
  -- f32 KV cache, the Llama-3.1-8B head layout.
  llama("f32", { 4 * K, 16 * K }, { name = "llama3-8b-f32", quick = { 4 * K }, sweep = false }),
}
