-- The LuaJIT module lua/flashdecode.lua (`require "flashdecode"`) as a user
-- sees it, run from outside the source tree: a GQA bf16 causal decode and an
-- f32 mask-mode decode against a double-precision reference computed here,
-- ALiBi slopes, learned sink logits and beam_src (features by name) against the same
-- reference, forced plan options, bad arguments (errors naming the field, out untouched),
-- arrays and conversions, the installed layout (the module copied by the
-- install sed, found with no FD_LIB/FD_HEADER), and examples/luajit_decode.lua.
--   luajit tests/luajit_module.lua     (LuaJIT only: it needs the FFI)
-- It re-runs itself in a temporary directory with LUA_PATH=<root>/lua/?.lua;
-- FD_LIB, when set, is made absolute first. Prints "FAIL - name: why" per
-- failure and "N passed, N failed"; exits 1 on a failure.
local ROOT_ARG = "--in-tmp"

-- Run a shell command; true when it exits 0.
local function sh(cmd)
  local rc = os.execute(cmd)
  return rc == 0 or rc == true
end

-- Single-quote a string for the shell.
local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- The first line a command prints.
local function sh_line(cmd)
  local p = io.popen(cmd)
  local s = p:read("*l")
  p:close()
  return s
end

-- Parent: the absolute repository root, a temp dir, the child run there.
local function relaunch()
  local me = arg[0]
  if me:sub(1, 1) ~= "/" then me = os.getenv("PWD") .. "/" .. me end
  local root = me:match("^(.*)/tests/[^/]*$")
  local lib = os.getenv("FD_LIB")
  if lib and lib ~= "" and lib:sub(1, 1) ~= "/" then lib = os.getenv("PWD") .. "/" .. lib end
  local tmp = sh_line("mktemp -d")
  local luajit = arg[-1] or "luajit"
  local ok = sh(("cd %s && LUA_PATH=%s %s %s %s %s %s"):format(q(tmp), q(root .. "/lua/?.lua;;"),
    lib and ("FD_LIB=" .. q(lib)) or "", q(luajit), q(me), ROOT_ARG, q(root)))
  sh("rm -rf " .. q(tmp))
  os.exit(ok and 0 or 1)
end
if arg[1] ~= ROOT_ARG then relaunch() end

local ROOT = arg[2]
local LUAJIT = arg[-1] or "luajit"
local ffi = require("ffi")
local fd = require("flashdecode")

local pass, fail = 0, 0
-- Record a check: name, condition, and why it failed (a string or a function giving it).
local function check(name, ok, why)
  if ok then pass = pass + 1 return true end
  fail = fail + 1
  print(("FAIL - %s: %s"):format(name, type(why) == "function" and why() or tostring(why or "false")))
  return false
end

-- f must raise an error containing every string of wants (plain text).
local function raises(name, wants, f)
  local ok, err = pcall(f)
  if ok then return check(name, false, "no error raised") end
  for _, w in ipairs(wants) do
    if not tostring(err):find(w, 1, true) then return check(name, false, ("error %q lacks %q"):format(tostring(err), w)) end
  end
  return check(name, true)
end

-- ---------------------------------------------------------------------------
-- Problems and the double-precision reference
-- ---------------------------------------------------------------------------

-- A deterministic generator of numbers in [-1, 1) (Park-Miller, exact in doubles).
local function rng(seed)
  local s = seed
  return function()
    s = s * 16807 % 2147483647
    return s / 2147483647 * 2 - 1
  end
end

-- Arrays of problem p = { B, Hq, Hkv, D, S, dtype (q, k, v), cur_pos (list) or mask = true,
-- slopes / sinks (lists [Hq]: ALiBi slopes, sink logits) } filled from rnd; keys at or past a row's valid length hold 1000s (a read past cur_pos shows).
local function make_problem(p, rnd)
  local S, D = p.S, p.D
  p.q = fd.array(p.dtype, p.B * p.Hq * D, function() return rnd() end)
  local valid = function(i)                               -- key index i of element i: valid?
    local b = math.floor(i / (p.Hkv * S * D))
    local key = math.floor(i / D) % S
    return p.mask or key <= p.cur_pos[b + 1]
  end
  p.k = fd.array(p.dtype, p.B * p.Hkv * S * D, function(i) return valid(i) and rnd() or 1000 end)
  p.v = fd.array(p.dtype, p.B * p.Hkv * S * D, function(i) return valid(i) and rnd() or 1000 end)
  if p.mask then
    p.mask_arr = fd.array("f32", p.B * p.Hq * S, function(i)
      local r = rnd()
      return (i % S == 0 or r > -0.6) and 2 * r or -math.huge  -- key 0 always kept
    end)
  end
  return p
end

-- Reference out[B*Hq*D] and lse[B*Hq] in doubles from the arrays' decoded values:
-- with p.slopes the ALiBi bias slope[h] * (key - cur_pos[b]) joins each score;
-- with p.sinks the head's sink logit joins the softmax denominator (and lse) once.
-- The cache row key i of row b is read from: its own, or p.beams' entry (FD_BEAMS).
local function src_row(p, b, i) return p.beams and p.beams[b * p.S + i + 1] or b end

local function reference(p)
  local qv, kv, vv = fd.totable(p.q), p.kvals or fd.totable(p.k), p.vvals or fd.totable(p.v)
  local mv = p.mask and fd.totable(p.mask_arr)
  local S, D, G = p.S, p.D, p.Hq / p.Hkv
  local scale = 1 / math.sqrt(D)
  local out, lse = {}, {}
  for b = 0, p.B - 1 do
    local len = p.mask and S or p.cur_pos[b + 1] + 1
    for h = 0, p.Hq - 1 do
      local j, qo = math.floor(h / G), (b * p.Hq + h) * D
      local s, m = {}, -math.huge
      for i = 0, len - 1 do
        local ko, x = ((src_row(p, b, i) * p.Hkv + j) * S + i) * D, 0
        for d = 1, D do x = x + qv[qo + d] * kv[ko + d] end
        x = x * scale + (mv and mv[(b * p.Hq + h) * S + i + 1] or 0)
        if p.slopes then x = x + p.slopes[h + 1] * (i - p.cur_pos[b + 1]) end
        s[i], m = x, math.max(m, x)
      end
      local sum, acc = 0, {}
      for d = 1, D do acc[d] = 0 end
      for i = 0, len - 1 do
        local w, vo = math.exp(s[i] - m), ((src_row(p, b, i) * p.Hkv + j) * S + i) * D
        sum = sum + w
        for d = 1, D do acc[d] = acc[d] + w * vv[vo + d] end
      end
      local sink = p.sinks and p.sinks[h + 1] or -math.huge
      local top = math.max(m, sink)
      local total = sum * math.exp(m - top) + math.exp(sink - top)   -- in units of e^top
      for d = 1, D do out[qo + d] = acc[d] * math.exp(m - top) / total end
      lse[b * p.Hq + h + 1] = top + math.log(total)
    end
  end
  return out, lse
end

-- Max error of got (list) against ref relative to ref's largest magnitude.
local function max_rel_err(got, ref)
  local scale, err = 0, 0
  for i = 1, #ref do scale = math.max(scale, math.abs(ref[i])) end
  if scale == 0 then scale = 1 end
  for i = 1, #ref do
    local e = math.abs(got[i] - ref[i]) / scale
    if e ~= e then return math.huge end
    err = math.max(err, e)
  end
  return err
end

-- Max error of lse relative to max(1, |ref|).
local function lse_err(got, ref)
  local err = 0
  for i = 1, #ref do
    local e = math.abs(got[i] - ref[i]) / math.max(1, math.abs(ref[i]))
    err = (e ~= e) and math.huge or math.max(err, e)
  end
  return err
end

-- Plan p on ctx (extra plan fields in extra), run it (with p.slopes_arg and
-- p.sinks_arg as alibi_slopes and sink_logits), compare with the reference:
-- out within tol, lse within 1e-5. Returns the plan.
local function run_and_compare(name, ctx, p, tol, extra)
  local spec = { batch = p.B, n_q_heads = p.Hq, n_kv_heads = p.Hkv, head_dim = p.D, kv_len = p.S,
                 q_dtype = p.dtype, kv_dtype = p.dtype, out_dtype = p.dtype, mask_mode = p.mask and "mask" or "causal" }
  for k, v in pairs(extra or {}) do spec[k] = v end
  local plan = ctx:plan(spec)
  local out, lse = fd.array(p.dtype, p.B * p.Hq * p.D), fd.array("f32", p.B * p.Hq)
  local ok, err = pcall(plan.run, plan, { q = p.q, k = p.k, v = p.v, cur_pos = not p.mask and p.cur_pos or nil,
                                          mask = p.mask_arr, out = out, lse = lse,
                                          alibi_slopes = p.slopes_arg, sink_logits = p.sinks_arg,
                                          beam_src = p.beams_arg })
  if not check(name .. ": runs", ok, err) then return plan end
  local rout, rlse = reference(p)
  local e, le = max_rel_err(fd.totable(out), rout), lse_err(fd.totable(lse), rlse)
  print(("%s: max error %.3g (tolerance %.3g), lse error %.3g, key %s"):format(name, e, tol, le, plan:info().key))
  check(name .. ": out matches the double reference", e <= tol, ("max error %.3g > %.3g"):format(e, tol))
  check(name .. ": lse matches the double reference", le <= 1e-5, ("lse error %.3g"):format(le))
  return plan
end

-- ---------------------------------------------------------------------------
-- Checks
-- ---------------------------------------------------------------------------

-- Where the module found itself, its header and library.
local function test_location()
  check("run from outside the source tree", os.getenv("PWD") ~= ROOT, "PWD is the root")
  check("the module's source root", fd.root == ROOT, ("%s ~= %s"):format(tostring(fd.root), ROOT))
  check("the header from the source tree", fd.paths.header == ROOT .. "/runtime/flashdecode.h", fd.paths.header)
  check("fd.version is the header's FD_VERSION", fd.version == fd.defines.FD_VERSION and fd.version:match("^%d+%.%d+%.%d+$"),
        tostring(fd.version))
  local ok, err = pcall(fd.load)
  check("the library loads", ok, err)
end

-- The GQA bf16 causal decode, with the planner's choice and forced options.
local function test_gqa_bf16(ctx)
  local p = make_problem({ B = 1, Hq = 8, Hkv = 2, D = 64, S = 300, dtype = "bf16", cur_pos = { 287 } }, rng(7))
  local tol = 2e-3 + 2 ^ -7                                 -- tests/compare.c: bf16 KV, bf16 out
  run_and_compare("GQA bf16 causal (B=1 Hq=8 Hkv=2 D=64 kv_len=300)", ctx, p, tol)
  local plan = run_and_compare("GQA bf16, opts chunk=64 splits=3", ctx, p, tol, { opts = { chunk = 64, splits = 3 } })
  local i = plan:info()
  check("plan:info reports the forced chunk and splits", i.chunk == 64 and i.splits == 3,
        ("chunk %d splits %d"):format(i.chunk, i.splits))
  check("plan:info names the isa", fd.ISA_NAMES[i.isa_digit] == i.isa, tostring(i.isa))
end

-- The f32 mask-mode decode (MQA, two batch rows, -inf entries).
local function test_mask_f32(ctx)
  local p = make_problem({ B = 2, Hq = 4, Hkv = 1, D = 32, S = 100, dtype = "f32", mask = true }, rng(11))
  run_and_compare("f32 mask mode (B=2 Hq=4 Hkv=1 D=32 kv_len=100)", ctx, p, 1e-5)
end

-- K or V of problem p as ggml blocks of dtype kd ("q8_0", "q4_0"): an fd.array of
-- the raw bytes (D / 32 blocks of 34 or 18 bytes per row: an f16 scale, then
-- int8 codes, or nibbles: element j low in byte j, element j + 16 high), every
-- code drawn, and the values decoded here (a list from 1, as fd.totable).
local function block_cache(p, kd, rnd)
  local bb = kd == "q8_0" and 34 or 18
  local nblk = p.B * p.Hkv * p.S * p.D / 32
  local raw, vals = fd.array(kd, nblk * bb), {}
  for blk = 0, nblk - 1 do
    local h = fd.f32_to_f16(0.002 + 0.02 * (rnd() + 1))
    local base, d = blk * bb, fd.f16_to_f32(h)
    raw[base], raw[base + 1] = h % 256, math.floor(h / 256)
    for j = 0, 31 do
      local code = math.floor((rnd() + 1) * (kd == "q8_0" and 128 or 8))      -- 0..255 or 0..15
      if kd == "q8_0" then
        raw[base + 2 + j] = code
        vals[blk * 32 + j + 1] = d * (code >= 128 and code - 256 or code)
      else
        local at = base + 2 + j % 16
        raw[at] = raw[at] + (j < 16 and code or code * 16)
        vals[blk * 32 + j + 1] = d * (code - 8)
      end
    end
  end
  return raw, vals
end

-- q8_0 and q4_0 KV (llama.cpp's block caches) with f32 q and out, causal, against
-- the reference over the values decoded here; an f32 array or a short byte
-- array as k is refused naming k.
local function test_blocks(ctx)
  for _, kd in ipairs { "q8_0", "q4_0" } do
    local rnd = rng(kd == "q8_0" and 21 or 22)
    local p = { B = 2, Hq = 8, Hkv = 2, D = 64, S = 90, dtype = "f32", cur_pos = { 89, 40 } }
    p.q = fd.array("f32", p.B * p.Hq * p.D, function() return rnd() end)
    p.k, p.kvals = block_cache(p, kd, rnd)
    p.v, p.vvals = block_cache(p, kd, rnd)
    run_and_compare(kd .. " KV blocks (B=2 Hq=8 Hkv=2 D=64 kv_len=90)", ctx, p, 1e-5, { kv_dtype = kd })
    local plan = ctx:plan { batch = p.B, n_q_heads = p.Hq, n_kv_heads = p.Hkv, head_dim = p.D, kv_len = p.S,
                            q_dtype = "f32", kv_dtype = kd, out_dtype = "f32" }
    local out = fd.array("f32", p.B * p.Hq * p.D)
    raises(kd .. ": an f32 k array refused", { "k:", "f32 array", kd }, function()
      plan:run { q = p.q, k = fd.array("f32", p.B * p.Hkv * p.S * p.D), v = p.v, cur_pos = p.cur_pos, out = out }
    end)
    raises(kd .. ": a short k array refused", { "k:", "elements" }, function()
      plan:run { q = p.q, k = fd.array(kd, 100), v = p.v, cur_pos = p.cur_pos, out = out }
    end)
  end
end

-- The f32 causal problem of the feature tests (B=2 Hq=8 Hkv=2 D=32 kv_len=200).
local function feature_problem(seed)
  return make_problem({ B = 2, Hq = 8, Hkv = 2, D = 32, S = 200, dtype = "f32", cur_pos = { 199, 120 } }, rng(seed))
end

-- The ALiBi slopes 2^(-8(h+1)/Hq) as a list.
local function alibi_slopes(Hq)
  local t = {}
  for h = 0, Hq - 1 do t[h + 1] = 2 ^ (-8 * (h + 1) / Hq) end
  return t
end

-- FD_ALIBI (features by name): slopes as an fd.array and as a Lua list, against
-- the reference with the bias; one run without the slopes' effect must differ.
local function test_alibi(ctx)
  local p = feature_problem(13)
  p.slopes = alibi_slopes(p.Hq)
  p.slopes_arg = fd.array("f32", p.Hq, p.slopes)
  local plan = run_and_compare("ALiBi slopes, f32 (B=2 Hq=8 Hkv=2 D=32 kv_len=200)", ctx, p, 1e-5, { features = { "alibi" } })
  check("features { 'alibi' } sets FD_ALIBI", plan.shape.features == fd.FEATURES.alibi, tostring(plan.shape.features))
  p.slopes_arg = p.slopes
  run_and_compare("ALiBi slopes as a Lua list", ctx, p, 1e-5, { features = "alibi" })
  local rout = reference(p)
  p.slopes = nil
  check("the ALiBi reference differs from the plain one", max_rel_err(reference(p), rout) > 1e-2, "the bias changes nothing")
end

-- FD_BEAMS (features by name): beam_src [B, kv_len] with runs from the other
-- row and the row itself, against the reference that reads through it.
local function test_beams(ctx)
  local p = feature_problem(23)
  p.beams = {}
  for b = 0, p.B - 1 do
    for i = 0, p.S - 1 do p.beams[b * p.S + i + 1] = (i >= 50 and i < 150) and 1 - b or (i % 7 == 0 and 1 - b or b) end
  end
  p.beams_arg = fd.array("i32", p.B * p.S, p.beams)
  run_and_compare("beams, f32 (B=2 Hq=8 Hkv=2 D=32 kv_len=200)", ctx, p, 1e-5, { features = { "beams" } })
  run_and_compare("beams with forced splits 3", ctx, p, 1e-5, { features = "beams", opts = { splits = 3 } })
  local rout = reference(p)
  p.beams = nil
  check("the beams reference differs from the plain one", max_rel_err(reference(p), rout) > 1e-2, "beam_src changes nothing")
end

-- FD_SINK_LOGITS (features as the bit): per-head sink logits (one -inf: no
-- sink, one 8: it dominates) against the reference.
local function test_sink_logits(ctx)
  local p = feature_problem(17)
  local rnd = rng(19)
  p.sinks = {}
  for h = 1, p.Hq do p.sinks[h] = h == 2 and -math.huge or h == 3 and 8 or 3 + 2 * rnd() end
  p.sinks_arg = fd.array("f32", p.Hq, p.sinks)
  local plan = run_and_compare("sink logits, f32 (B=2 Hq=8 Hkv=2 D=32 kv_len=200)", ctx, p, 1e-5,
                               { features = tonumber(ffi.C.FD_SINK_LOGITS) })
  check("fd.FEATURES.sink_logits is the header's FD_SINK_LOGITS", fd.FEATURES.sink_logits == tonumber(ffi.C.FD_SINK_LOGITS),
        tostring(fd.FEATURES.sink_logits))
  run_and_compare("sink logits with forced splits 3", ctx, p, 1e-5, { features = { "SINK_LOGITS" }, opts = { splits = 3 } })
  p.slopes, p.slopes_arg = alibi_slopes(p.Hq), fd.array("f32", p.Hq, alibi_slopes(p.Hq))
  run_and_compare("sink logits and ALiBi together", ctx, p, 1e-5, { features = { "alibi", 2 } })
end

-- FD_NEW_KV: the cache holds the keys before each row's token, whose own K/V
-- row comes in k_new/v_new ([B, 1, Hkv, D]); the cache's row at the token's
-- position is overwritten with 1e4 (never read), so the output must equal the
-- plain causal reference over the original keys. A k_new of the wrong length
-- is refused naming it.
local function test_new_kv(ctx)
  local p = feature_problem(23)
  local rout, rlse = reference(p)
  local n = p.B * p.Hkv * p.D
  local kn, vn = fd.array("f32", n), fd.array("f32", n)
  for b = 0, p.B - 1 do
    for j = 0, p.Hkv - 1 do
      local src, dst = ((b * p.Hkv + j) * p.S + p.cur_pos[b + 1]) * p.D, (b * p.Hkv + j) * p.D
      for d = 0, p.D - 1 do
        kn[dst + d], vn[dst + d] = p.k[src + d], p.v[src + d]
        p.k[src + d], p.v[src + d] = 1e4, -1e4
      end
    end
  end
  local plan = ctx:plan { batch = p.B, n_q_heads = p.Hq, n_kv_heads = p.Hkv, head_dim = p.D, kv_len = p.S,
                          q_dtype = "f32", kv_dtype = "f32", out_dtype = "f32", features = { "new_kv" } }
  local out, lse = fd.array("f32", p.B * p.Hq * p.D), fd.array("f32", p.B * p.Hq)
  local ok, err = pcall(plan.run, plan, { q = p.q, k = p.k, v = p.v, cur_pos = p.cur_pos, out = out, lse = lse,
                                          k_new = kn, v_new = vn })
  if check("FD_NEW_KV with k_new/v_new: runs", ok, err) then
    local e, le = max_rel_err(fd.totable(out), rout), lse_err(fd.totable(lse), rlse)
    check("FD_NEW_KV: out matches the reference over the original keys", e <= 1e-5, ("max error %.3g"):format(e))
    check("FD_NEW_KV: lse matches the reference", le <= 1e-5, ("lse error %.3g"):format(le))
  end
  raises("k_new of the wrong length", { "k_new:", "needs " .. n },
         function() plan:run { q = p.q, k = p.k, v = p.v, cur_pos = p.cur_pos, out = out, k_new = fd.array("f32", n - 1),
                               v_new = vn } end)
end

-- Bad feature names and per-head arrays of the wrong length: errors naming the
-- argument, nothing run (out untouched).
local function test_feature_errors(ctx)
  raises("unknown feature name", { "features", "'alibl'", "sink_logits" },
         function() ctx:plan { n_q_heads = 8, n_kv_heads = 2, head_dim = 32, kv_len = 64, features = { "alibl" } } end)
  local q, kv = fd.array("f32", 8 * 32), fd.array("f32", 2 * 64 * 32)
  for _, c in ipairs {
    { "alibi", "alibi_slopes", fd.array("f32", 7), { "alibi_slopes:", "7 elements", "needs 8 (n_q_heads)" } },
    { "alibi", "alibi_slopes", { 1, 2, 3 }, { "alibi_slopes:", "3 values", "needs 8 (n_q_heads)" } },
    { "sink_logits", "sink_logits", fd.array("f32", 4), { "sink_logits:", "4 elements", "needs 8 (n_q_heads)" } },
    { "sink_logits", "sink_logits", { 1, 2, 3, 4, 5, 6, 7, 8, 9 }, { "sink_logits:", "9 values", "needs 8" } },
    { "sink_logits", "sink_logits", fd.array("bf16", 8), { "sink_logits:", "bf16", "f32" } },
  } do
    local plan = ctx:plan { n_q_heads = 8, n_kv_heads = 2, head_dim = 32, kv_len = 64, features = c[1] }
    local out = fd.array("f32", 8 * 32, 7)
    raises(("%s of the wrong length (%s)"):format(c[2], type(c[3])), c[4],
           function() plan:run { q = q, k = kv, v = kv, cur_pos = 63, out = out, [c[2]] = c[3] } end)
    check(c[2] .. " refused: out untouched", fd.totable(out)[1] == 7 and fd.totable(out)[256] == 7, "out was written")
  end
end

-- A run that must fail naming wants, leaving out untouched.
local function run_fails(name, plan, args, wants)
  local out = args.out
  raises(name, wants, function() plan:run(args) end)
  local same = true
  for i = 0, 8 * 64 - 1 do if out[i] ~= 0x7777 then same = false break end end
  check(name .. ": out untouched", same, "out was written")
end

-- Bad arguments: each an error naming the field.
local function test_errors(ctx)
  local base = { batch = 1, n_q_heads = 8, n_kv_heads = 2, head_dim = 64, kv_len = 300, q_dtype = "bf16" }
  -- base with fields changed
  local function with(t)
    local s = {}
    for k, v in pairs(base) do s[k] = v end
    for k, v in pairs(t) do s[k] = v end
    return s
  end
  raises("wrong dtype name", { "q_dtype", "'bf61'" }, function() ctx:plan(with { q_dtype = "bf61" }) end)
  raises("n_q_heads not a multiple of n_kv_heads", { "n_q_heads", "n_kv_heads", "FD_EINVAL" },
         function() ctx:plan(with { n_q_heads = 6, n_kv_heads = 4 }) end)
  local _, err = pcall(ctx.plan, ctx, with { n_q_heads = 6, n_kv_heads = 4 })
  check("fd.error_code reads the code back", fd.error_code(err) == fd.codes.EINVAL, tostring(fd.error_code(err)))
  raises("unknown shape field", { "unknown field 'n_kv_head'" }, function() ctx:plan(with { n_kv_head = 2 }) end)
  raises("non-integer head_dim", { "head_dim", "integer" }, function() ctx:plan(with { head_dim = 64.5 }) end)
  local no_len = with {}
  no_len.kv_len = nil
  raises("missing kv_len", { "kv_len is required" }, function() ctx:plan(no_len) end)
  raises("unknown opts field", { "opts", "'chunks'" }, function() ctx:plan(with { opts = { chunks = 64 } }) end)
  raises("opts not a table", { "opts", "expected a table" }, function() ctx:plan(with { opts = 64 }) end)
  raises("unknown context field", { "unknown field 'thread'" }, function() fd.context { thread = 1 } end)
  raises("bad isa_limit name", { "isa_limit", "'avx9'" }, function() fd.context { isa_limit = "avx9" } end)
  local plan = ctx:plan(base)
  local q, kv = fd.array("bf16", 8 * 64), fd.array("bf16", 2 * 300 * 64)
  local out = fd.array("bf16", 8 * 64, fd.bf16_to_f32(0x7777))
  local function args(t)
    local a = { q = q, k = kv, v = kv, cur_pos = { 5 }, out = out }
    for k, v in pairs(t) do a[k] = v end
    return a
  end
  run_fails("cur_pos out of range", plan, args { cur_pos = { 300 } }, { "fd_run", "cur_pos[0] is 300", "FD_EINVAL" })
  run_fails("unknown run field", plan, args { lse_out = 1 }, { "unknown field" })
  run_fails("q of the wrong dtype", plan, args { q = fd.array("f32", 8 * 64) }, { "q:", "f32", "bf16" })
  run_fails("k too short", plan, args { k = fd.array("bf16", 100) }, { "k:", "100 elements" })
  run_fails("q not an array", plan, args { q = { 1, 2 } }, { "q:", "expected an array" })
  run_fails("cur_pos list of the wrong length", plan, args { cur_pos = { 1, 2 } }, { "cur_pos", "batch 1" })
  raises("plan:info past kv_len", { "fd_plan_info_get", "kv_len 301" }, function() plan:info(301) end)
  plan:close()
  run_fails("a closed plan", plan, args {}, { "closed" })
end

-- Arrays and element conversions.
local function test_arrays()
  local a = fd.array("bf16", 3, { 1, -2.5, 0.1 })
  check("arrays are 64-byte aligned", tonumber(ffi.cast("uintptr_t", a)) % 64 == 0, "misaligned")
  check("fd.array_info", select(1, fd.array_info(a)) == "bf16" and select(2, fd.array_info(a)) == 3, "wrong info")
  local t = fd.totable(a)
  check("bf16 values round trip", t[1] == 1 and t[2] == -2.5 and math.abs(t[3] - 0.1) < 1e-3, table.concat(t, " "))
  check("f32_to_bf16 rounds to nearest even", fd.f32_to_bf16(1 + 2 ^ -8) == 0x3f80 and fd.f32_to_bf16(1 + 3 * 2 ^ -8) == 0x3f82,
        ("%x %x"):format(fd.f32_to_bf16(1 + 2 ^ -8), fd.f32_to_bf16(1 + 3 * 2 ^ -8)))
  check("f16 bits", fd.f32_to_f16(65504) == 0x7bff and fd.f32_to_f16(65520) == 0x7c00 and fd.f16_to_f32(1) == 2 ^ -24,
        "f16 conversions")
  check("fp8 e5m2 bits: nearest even, 57344 the largest, infinity from 61440, subnormals",
        fd.f32_to_e5m2(1.125) == 0x3c and fd.f32_to_e5m2(61439) == 0x7b and fd.f32_to_e5m2(61440) == 0x7c
          and fd.f32_to_e5m2(-2 ^ -16) == 0x81 and fd.e5m2_to_f32(0x7b) == 57344 and fd.e5m2_to_f32(0xfc) == -math.huge,
        ("%x %x %x %x"):format(fd.f32_to_e5m2(1.125), fd.f32_to_e5m2(61439), fd.f32_to_e5m2(61440), fd.f32_to_e5m2(-2 ^ -16)))
  local bad
  for c = 0, 255 do                                       -- each code is the f16 whose upper byte it is
    local x, h = fd.decode("fp8_e5m2", c), fd.f16_to_f32(c * 256)
    if not (x == h or (x ~= x and h ~= h)) then bad = bad or c end
  end
  check("every fp8 e5m2 code decodes as its f16", bad == nil, ("code 0x%02x"):format(bad or 0))
  raises("unknown array dtype", { "array", "'bf17'" }, function() fd.array("bf17", 4) end)
  raises("array length", { "positive integer" }, function() fd.array("f32", 0) end)
end

-- Run a shell command in the temp dir, returning its output and success.
local function capture(cmd)
  local p = io.popen(cmd .. " 2>&1; echo \"exit $?\"")
  local s = p:read("*a")
  p:close()
  return s, s:match("exit 0\n$") ~= nil
end

-- The installed layout under prefix dir pre: the module copied by the install
-- rule's sed (placeholders filled from prefix sp), its facts (gen/facts.lua as
-- flashdecode_facts.lua), the header and the library.
local function install_copy(pre, sp)
  local sed = ("sed -e 's|@PREFIX@|%s|g' -e 's|@LIBDIR@|%s/lib|g' -e 's|@INCLUDEDIR@|%s/include|g' -e 's|@VERSION@|%s|g'")
    :format(sp, sp, sp, fd.version)
  local lib = fd.paths.lib:sub(1, 1) == "/" and fd.paths.lib or (os.getenv("PWD") .. "/" .. fd.paths.lib)
  return sh(("mkdir -p %s/share/lua/5.1 %s/include %s/lib && %s %s > %s/share/lua/5.1/flashdecode.lua && cp %s %s/share/lua/5.1/flashdecode_facts.lua && cp %s %s/include/ && ln -s %s %s/lib/libflashdecode.so.0")
    :format(pre, pre, pre, sed, q(ROOT .. "/lua/flashdecode.lua"), pre, q(ROOT .. "/gen/facts.lua"), pre,
            q(ROOT .. "/runtime/flashdecode.h"), pre, q(lib), pre))
end

-- A small decode through the installed module: prints where it found the header and library.
local INSTALLED_SCRIPT = [[local fd = require "flashdecode"
local ctx = fd.context { threads = 1 }
local plan = ctx:plan { n_q_heads = 2, head_dim = 16, kv_len = 4 }
local q, k, out = fd.array("f32", 32, 1), fd.array("f32", 128, 0.5), fd.array("f32", 32)
local v = fd.array("f32", 128, function(i) return math.floor(i / 16) % 4 end)
plan:run { q = q, k = k, v = v, cur_pos = 1, out = out }
print(fd.paths.header, fd.paths.lib, tostring(fd.root), out[0])]]

-- The installed module (FD_LIB and FD_HEADER unset) under pre, placeholders
-- filled from sp, with extra environment env: finds header and lib as expected.
local function test_installed(name, pre, sp, env, want_header, want_lib)
  check(name .. ": installed layout made", install_copy(pre, sp), "mkdir/sed/cp failed")
  local s, done = capture(("env -u FD_LIB -u FD_HEADER %s LUA_PATH=%s %s installed.lua")
    :format(env, q(pre .. "/share/lua/5.1/?.lua;;"), q(LUAJIT)))
  check(name .. ": the module runs", done, s)
  local h, l, r, o = s:match("^(%S+)\t(%S+)\t(%S+)\t(%S+)")
  check(name .. ": finds the header", h == want_header, tostring(h))
  check(name .. ": finds the library", l == want_lib, tostring(l))
  check(name .. ": is not in a source tree", r == "nil", tostring(r))
  check(name .. ": computes (mean of v rows 0 and 1 = 0.5)", tonumber(o) == 0.5, tostring(o))
end

-- Installed in place (PREFIX=pre), and staged (DESTDIR) with the prefix not
-- there: FD_INCLUDE_DIR and the loader's path (LD_LIBRARY_PATH) find the copies.
local function test_install_layouts()
  local f = io.open("installed.lua", "w")
  f:write(INSTALLED_SCRIPT)
  f:close()
  local pre = os.getenv("PWD") .. "/prefix"
  test_installed("installed", pre, pre, "", pre .. "/include/flashdecode.h", pre .. "/lib/libflashdecode.so.0")
  local dest = os.getenv("PWD") .. "/dest/usr"
  test_installed("staged", dest, "/nonexistent", ("FD_INCLUDE_DIR=%s LD_LIBRARY_PATH=%s"):format(q(dest .. "/include"), q(dest .. "/lib")),
                 dest .. "/include/flashdecode.h", "libflashdecode.so.0")
end

-- examples/luajit_decode.lua runs and reports a small error.
local function test_example()
  local s, done = capture(("%s %s"):format(q(LUAJIT), q(ROOT .. "/examples/luajit_decode.lua")))
  check("examples/luajit_decode.lua runs", done, s)
  local e = tonumber(s:match("max error ([%d%.e%-]+)"))
  check("the example's error is small", e and e < 1e-2, s)
end

test_location()
local ctx = fd.context { threads = 2 }
test_gqa_bf16(ctx)
test_mask_f32(ctx)
test_blocks(ctx)
test_alibi(ctx)
test_sink_logits(ctx)
test_beams(ctx)
test_new_kv(ctx)
test_feature_errors(ctx)
test_errors(ctx)
test_arrays()
test_install_layouts()
test_example()
ctx:close()
raises("a closed context", { "closed" }, function() ctx:plan { n_q_heads = 1, head_dim = 16, kv_len = 4 } end)

print(("%d passed, %d failed"):format(pass, fail))
os.exit(fail == 0 and 0 or 1)
