#!/usr/bin/python3
"""Tests of the Python binding (python/flashdecode) against a numpy float64 reference.

    make B=build lib && FD_LIB=build/libflashdecode.so PYTHONPATH=python /usr/bin/python3 tests/test_python.py

Prints "FAIL - name: why" per failure and ends with "N passed, N failed" (exit 1 on failure).
Tolerance per output element: |out - ref| <= r |ref| + 1e-5 max|ref|, where r is the output
dtype's rounding (half a unit in the last place: 0 for f32, 2^-11 for f16, 2^-8 for bf16) and
1e-5 the kernels' f32 arithmetic (the reference gets exactly the values the library reads, KV
dequantized in float64, so this holds for every KV dtype). lse: 1e-5 relative to max(1, |lse|);
-inf exactly for a row with no visible key.
"""
import ctypes
import gc
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings

import numpy as np

import flashdecode as fd
from flashdecode import _lib
from flashdecode._facts import ISA_NAMES, ISA_RANK

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
HEADER = os.path.join(ROOT, "runtime", "flashdecode.h")
tally = {"passed": 0, "failed": 0}


# Record one check; print the reason when it fails.
def check(cond, name, why=""):
    tally["passed" if cond else "failed"] += 1
    if not cond:
        print("FAIL - %s: %s" % (name, why))
    return cond


# Run one test function; an unexpected exception is a failure.
def case(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - a test must report, not stop
        check(False, fn.__name__, "raised %s: %s" % (type(e).__name__, e))


# ---- the reference -------------------------------------------------------------

# e4m3 value of every byte (NaN for 0x7f and 0xff), as the library reads fp8.
def e4m3_table():
    b = np.arange(256)
    exp, man = (b >> 3) & 15, b & 7
    v = np.where(exp == 0, np.ldexp(man.astype(float), -9), np.ldexp((8 + man).astype(float), exp - 10))
    v[(b & 0x7F) == 0x7F] = np.nan
    return np.where(b & 0x80, -v, v)


E4M3 = e4m3_table()


# e5m2 value of every byte (bias 15; +-Inf for 0x7c and 0xfc, NaN for 0x7d-0x7f and 0xfd-0xff).
def e5m2_table():
    b = np.arange(256)
    exp, man = (b >> 2) & 31, b & 3
    v = np.where(exp == 0, np.ldexp(man.astype(float), -16), np.ldexp((4 + man).astype(float), exp - 17))
    v[exp == 31] = np.where(man[exp == 31] == 0, np.inf, np.nan)
    return np.where(b & 0x80, -v, v)


E5M2 = e5m2_table()


# Softmax attention in float64: out [B,Hq,D], lse [B,Hq]; k/v [B,Hkv,S,D] (already dequantized).
# slopes [Hq]: the ALiBi bias slope[h] * (key - cur_pos[b]) joins each score (causal); sinks [Hq]:
# head h's sink logit joins its softmax denominator (and lse) once, with no value row.
def reference(q, k, v, cur_pos, mask=None, scale=None, slopes=None, sinks=None):
    B, Hq, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    G = Hq // Hkv
    scale = scale or 1 / math.sqrt(D)
    out, lse = np.zeros((B, Hq, D)), np.full((B, Hq), -np.inf)
    for b in range(B):
        n = S if cur_pos is None else cur_pos[b] + 1
        for h in range(Hq):
            j = h // G
            s = scale * (k[b, j, :n] @ q[b, h])
            if mask is not None:
                s = s + mask[b, h, :n]
            if slopes is not None:
                s = s + slopes[h] * (np.arange(n) - cur_pos[b])
            m = s.max()
            if m == -np.inf:
                continue
            p = np.exp(s - m)
            out[b, h], lse[b, h] = (p @ v[b, j, :n]) / p.sum(), m + math.log(p.sum())
            if sinks is not None:
                total = np.logaddexp(lse[b, h], sinks[h])
                out[b, h], lse[b, h] = out[b, h] * math.exp(lse[b, h] - total), total
    return out, lse


# ---- problems ------------------------------------------------------------------

SCALE_RANGE = {"int8": (0.005, 0.02), "fp8_e4m3": (0.001, 0.004), "fp8_e5m2": (0.001, 0.004)}


# ggml blocks (llama.cpp's q8_0 / q4_0) of random codes, every code possible, and f16 scales:
# (uint8 array [..., D // 32 * block bytes], float64 values [..., D]), decoded here independently.
def blocks(rng, dtype, shape):
    lead, nb = shape[:-1], shape[-1] // 32
    d = rng.uniform(0.002, 0.05, lead + (nb, 1)).astype(np.float16)
    if dtype == "q8_0":
        codes = rng.integers(-128, 128, lead + (nb, 32), dtype=np.int8)
        raw, vals = codes.view(np.uint8), codes.astype(np.float64)
    else:  # q4_0: byte j holds element j in its low nibble, element j + 16 in its high one
        nib = rng.integers(0, 16, lead + (nb, 32), dtype=np.uint8)
        raw, vals = nib[..., :16] | (nib[..., 16:] << 4), nib.astype(np.float64) - 8
    raw = np.concatenate([d.view(np.uint8), raw], axis=-1)
    return np.ascontiguousarray(raw.reshape(lead + (-1,))), (d.astype(np.float64) * vals).reshape(shape)


# (array for the library, its float64 values) of random data in dtype.
def values(rng, dtype, shape):
    if dtype in ("q8_0", "q4_0"):
        return blocks(rng, dtype, shape)
    x = rng.standard_normal(shape)
    if dtype == "f32":
        a = x.astype(np.float32)
    elif dtype == "f16":
        a = x.astype(np.float16)
    elif dtype == "bf16":
        a = fd.to_bf16(x)
        return a, fd.from_bf16(a).astype(np.float64)
    elif dtype == "int8":
        a = rng.integers(-127, 128, shape, dtype=np.int8)
    elif dtype == "fp8_e4m3":
        a = rng.integers(0, 256, shape, dtype=np.uint8)
        a[(a & 0x7F) == 0x7F] = 0x3C
        return a, E4M3[a]
    else:  # fp8_e5m2: |x| up to 448 as e4m3's, subnormals included
        a = rng.integers(0, 256, shape, dtype=np.uint8)
        a = (a & 0x80) | (a & 0x7F) % 0x60
        return a, E5M2[a]
    return a, a.astype(np.float64)


# Per-row scales for a quantized KV dtype: (float32 array [rows], float64 array to multiply with).
def scales(rng, dtype, shape):
    s = rng.uniform(*SCALE_RANGE[dtype], shape[:-1]).astype(np.float32)
    return s, s.astype(np.float64)[..., None]


# A random problem from a case: the run's keyword arguments and the reference's inputs (BHSD doubles).
def problem(c, rng):
    B, Hq, Hkv, D, S = c["B"], c["Hq"], c["Hkv"], c["D"], c["S"]
    kv_shape = (B, Hkv, S, D) if c["layout"] == "bhsd" else (B, S, Hkv, D)
    q, qd = values(rng, c["q"], (B, Hq, D))
    k, kd = values(rng, c["kv"], kv_shape)
    v, vd = values(rng, c["kv"], kv_shape)
    kw = dict(q=q, k=k, v=v, scale=c.get("scale"))
    if c["kv"] in SCALE_RANGE:
        (kw["k_scale"], ks), (kw["v_scale"], vs) = scales(rng, c["kv"], kv_shape), scales(rng, c["kv"], kv_shape)
        kd, vd = kd * ks, vd * vs
    if c["layout"] == "bshd":
        kd, vd = kd.transpose(0, 2, 1, 3), vd.transpose(0, 2, 1, 3)
    mask = None
    if c["mode"] == "mask":
        mask = rng.standard_normal((B, Hq, S)).astype(np.float32)
        mask[rng.random(mask.shape) < 0.3] = -np.inf
        mask[0, 1, :] = -np.inf                        # one head sees no key: out 0, lse -inf
        kw["mask"] = mask
    if c["mode"] == "causal":
        kw["cur_pos"] = c["cur_pos"]
    ref = reference(qd, kd, vd, c["cur_pos"] if c["mode"] == "causal" else None, mask, c.get("scale"))
    return kw, ref


# f32 arithmetic of the kernels, relative to max |ref|: the reference sees exactly the values the
# library reads (dequantized in float64), so every KV dtype gets the same budget.
ARITH_TOL = 1e-5
# Rounding of the output dtype, relative to the element: half a unit in the last place.
OUT_ROUNDING = {"f32": 0.0, "f16": 2.0 ** -11, "bf16": 2.0 ** -8}


# The allowed |out - ref| per element: its rounding plus the arithmetic budget.
def bound(c, ref):
    return OUT_ROUNDING[c["out"]] * np.abs(ref) + ARITH_TOL * (np.abs(ref).max() or 1.0)


# Output values as float64 (bf16 bits decoded).
def as_f64(out, dtype):
    return (fd.from_bf16(out) if dtype == "bf16" else out).astype(np.float64)


# Check out (and lse) against the reference; returns the max error relative to max |ref|.
def compare(name, c, out, lse, ref):
    diff = np.abs(as_f64(out, c["out"]) - ref[0])
    diff[np.isnan(diff)] = np.inf
    worst = float((diff / bound(c, ref[0])).max())
    err = float(diff.max() / (np.abs(ref[0]).max() or 1.0))
    check(worst <= 1, name, "error %.3g of max|ref|, worst element %.3g x its bound" % (err, worst))
    if lse is not None:
        inf = np.isinf(ref[1])
        lerr = float((np.abs(lse[~inf] - ref[1][~inf]) / np.maximum(1, np.abs(ref[1][~inf]))).max())
        check(lerr <= 1e-5 and np.array_equal(lse[inf], ref[1][inf]), name + " (lse)",
              "lse error %.3g, -inf rows %s vs %s" % (lerr, lse[inf], ref[1][inf]))
    return err


BASE = dict(B=1, Hq=8, Hkv=2, D=64, S=300, q="f32", kv="f32", out="f32", mode="causal", layout="bhsd",
            cur_pos=[257])
# The numerical cases: changes to BASE.
CASES = [
    dict(name="GQA bf16 decode (Hq 32, Hkv 8, D 128, 4096 keys)", Hq=32, Hkv=8, D=128, S=4096,
         q="bf16", kv="bf16", out="bf16", cur_pos=[4095]),
    dict(name="GQA bf16 KV, f32 out (the kernels' own error)", Hq=32, Hkv=8, D=128, S=4096,
         q="bf16", kv="bf16", out="f32", cur_pos=[4000]),
    dict(name="f32", D=64),
    dict(name="f16 (D 96)", q="f16", kv="f16", out="f16", D=96),
    dict(name="mask mode, batch 2", B=2, mode="mask", kv="bf16", out="f32"),
    dict(name="full mode, batch 2", B=2, mode="full", kv="f16", out="bf16"),
    dict(name="BSHD layout", layout="bshd", q="bf16", kv="bf16", out="f32", B=2, cur_pos=[299, 17]),
    dict(name="int8 KV with scales", kv="int8", q="bf16", out="bf16", Hq=16, Hkv=4, D=128),
    dict(name="int8 KV with scales, BSHD", kv="int8", layout="bshd", B=2, cur_pos=[100, 250]),
    dict(name="fp8 KV with scales, BSHD", kv="fp8_e4m3", layout="bshd"),
    dict(name="fp8 e5m2 KV with scales", kv="fp8_e5m2", q="bf16", out="f16", Hq=16, Hkv=4, D=128),
    dict(name="q8_0 blocks (llama.cpp KV), mask mode", kv="q8_0", q="f16", out="f32", mode="mask", B=2, D=128),
    dict(name="q4_0 blocks, BSHD, batch 2", kv="q4_0", q="bf16", out="bf16", layout="bshd", B=2, cur_pos=[299, 40]),
    dict(name="q4_0 blocks, D 96, full mode", kv="q4_0", mode="full", D=96),
    dict(name="uneven cur_pos over batch 2", B=2, S=1024, cur_pos=[5, 900], kv="bf16", out="bf16"),
    dict(name="forced splits 7, chunk 64, group tile 2", S=2000, cur_pos=[1999], kv="bf16",
         opts=dict(splits=7, chunk=64, group_tile=2), want=dict(splits=7, chunk=64, group_tile=2)),
    dict(name="forced options as keywords", S=600, cur_pos=[599], kw=dict(splits=3, threads=1),
         want=dict(splits=3, threads=1)),
    dict(name="scale argument 0.3", scale=0.3, kv="f16"),
    dict(name="portable C isa", opts=dict(isa="c"), want=dict(isa=0), D=32, S=100, cur_pos=[99]),
    dict(name="AVX2 isa", opts=dict(isa="avx2"), want=dict(isa=1), kv="f16", out="bf16"),
    dict(name="MQA batch 4 (Hkv 1)", B=4, Hq=8, Hkv=1, S=200, cur_pos=[199, 0, 57, 120], kv="bf16"),
]


# Plan a case, run it without and with lse, compare both; print the max error.
def run_case(ctx, c, rng):
    c = dict(BASE, **c)
    plan = ctx.plan(batch=c["B"], n_q_heads=c["Hq"], n_kv_heads=c["Hkv"], head_dim=c["D"], kv_len=c["S"],
                    q_dtype=c["q"], kv_dtype=c["kv"], out_dtype=c["out"], mask_mode=c["mode"],
                    layout=c["layout"], opts=c.get("opts"), **c.get("kw", {}))
    info = plan.info()
    for field, want in c.get("want", {}).items():
        check(info[field] == want, c["name"] + " (plan.info)", "%s is %r, forced %r" % (field, info[field], want))
    kw, ref = problem(c, rng)
    err = compare(c["name"], c, plan.run(**kw), None, ref)
    lse = np.empty((c["B"], c["Hq"]), np.float32)
    out, lse_back = plan.run(lse=lse, **kw)
    check(lse_back is lse, c["name"] + " (lse)", "the given lse array is not returned")
    err = max(err, compare(c["name"] + " (with lse)", c, out, lse, ref))
    print("  %s: max error %.3g of max|ref| (bound %.3g), key %s"
          % (c["name"], err, ARITH_TOL + OUT_ROUNDING[c["out"]], info["key"]))


# Every numerical case on one 2-thread context.
def test_numerics():
    rng = np.random.default_rng(12)
    with fd.Context(threads=2) as ctx:
        best = ISA_RANK[ISA_NAMES.index(ctx.max_isa)]
        isas = [n for n, r in zip(ISA_NAMES, ISA_RANK) if r <= best]
        for c in CASES:
            if c.get("opts", {}).get("isa", "c") not in isas:
                print("  %s: skipped, this CPU lacks the ISA" % c["name"])
                continue
            try:
                run_case(ctx, c, rng)
            except Exception as e:  # noqa: BLE001
                check(False, c["name"], "raised %s: %s" % (type(e).__name__, e))


# The cc backend (system compiler, disk cache) gives the same answers.
def test_cc_backend():
    with tempfile.TemporaryDirectory() as cache, fd.Context(threads=1, backend="cc", cache_dir=cache) as ctx:
        run_case(ctx, dict(name="cc backend, bf16", kv="bf16", out="bf16"), np.random.default_rng(3))


# lse=True allocates a float32 [B, Hq] array and returns (out, lse).
def test_lse_true():
    c = dict(BASE, name="lse=True", kv="bf16")
    with fd.Context(threads=2) as ctx:
        plan = ctx.plan(batch=1, n_q_heads=8, n_kv_heads=2, head_dim=64, kv_len=300, kv_dtype="bf16")
        kw, ref = problem(c, np.random.default_rng(5))
        res = plan.run(lse=True, **kw)
        ok = isinstance(res, tuple) and res[1].dtype == np.float32 and res[1].shape == (1, 8)
        if check(ok, "lse=True", "got %r" % (type(res),)):
            compare("lse=True", c, res[0], res[1], ref)


# The paged layout: f32 pools with pages in shuffled pool order, against the
# float64 reference over the dense cache the pages hold.
def test_paged():
    B, Hq, Hkv, D, S, ps = 2, 8, 2, 64, 300, 16
    rng = np.random.default_rng(11)
    k = rng.uniform(-1, 1, (B, Hkv, S, D)).astype(np.float32)
    v = rng.uniform(-1, 1, (B, Hkv, S, D)).astype(np.float32)
    q = rng.uniform(-1, 1, (B, Hq, D)).astype(np.float32)
    per_row = -(-S // ps)
    pool_pages = B * per_row + 2
    table = rng.permutation(pool_pages)[:B * per_row].reshape(B, per_row).astype(np.int32)
    kp = np.full((pool_pages, Hkv, ps, D), np.nan, np.float32)
    vp = kp.copy()
    for b in range(B):
        for s in range(S):
            kp[table[b, s // ps], :, s % ps] = k[b, :, s]
            vp[table[b, s // ps], :, s % ps] = v[b, :, s]
    pos = np.array([S - 1, 100], np.int32)
    with fd.Context(threads=2) as ctx:
        plan = ctx.plan(batch=B, n_q_heads=Hq, n_kv_heads=Hkv, head_dim=D, kv_len=S, layout="paged",
                        page_size=ps, pool_pages=pool_pages)
        out, lse = plan.run(q, kp, vp, cur_pos=pos, lse=True, block_table=table)
    ref_out, ref_lse = reference(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), pos)
    err = np.abs(out - ref_out).max() / np.abs(ref_out).max()
    check(err < 1e-5 and np.abs(lse - ref_lse).max() < 1e-4, "paged layout vs float64 reference",
          "max error %.3g" % err)


# Several query tokens: token t of row b sits at cur_pos[b] - q_len + 1 + t and sees the keys up to it.
def test_q_len():
    B, Hq, Hkv, D, S, T = 2, 8, 2, 64, 200, 4
    rng = np.random.default_rng(12)
    k = rng.uniform(-1, 1, (B, Hkv, S, D)).astype(np.float32)
    v = rng.uniform(-1, 1, (B, Hkv, S, D)).astype(np.float32)
    q = rng.uniform(-1, 1, (B, T, Hq, D)).astype(np.float32)
    pos = np.array([S - 1, T - 1], np.int32)
    with fd.Context(threads=2) as ctx:
        plan = ctx.plan(batch=B, n_q_heads=Hq, n_kv_heads=Hkv, head_dim=D, kv_len=S, q_len=T)
        out, lse = plan.run(q, k, v, cur_pos=pos, lse=True)
    ok = out.shape == (B, T, Hq, D) and lse.shape == (B, T, Hq)
    for t in range(T):
        ref_out, ref_lse = reference(q[:, t].astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                                     pos - T + 1 + t)
        ok = ok and np.abs(out[:, t] - ref_out).max() < 1e-5 and np.abs(lse[:, t] - ref_lse).max() < 1e-4
    check(ok, "q_len 4 vs float64 reference per token")


# FD_SHARED_KV: one K/V sequence [1, Hkv, S, D] attended by every batch row (full mode).
def test_shared_kv():
    B, Hq, Hkv, D, S = 3, 8, 2, 64, 150
    rng = np.random.default_rng(13)
    k = rng.uniform(-1, 1, (1, Hkv, S, D)).astype(np.float32)
    v = rng.uniform(-1, 1, (1, Hkv, S, D)).astype(np.float32)
    q = rng.uniform(-1, 1, (B, Hq, D)).astype(np.float32)
    with fd.Context(threads=2) as ctx:
        plan = ctx.plan(batch=B, n_q_heads=Hq, n_kv_heads=Hkv, head_dim=D, kv_len=S, mask_mode="full",
                        features=fd.FD_SHARED_KV)
        out = plan.run(q, k, v)
    ref_out, _ = reference(q.astype(np.float64), np.repeat(k, B, 0).astype(np.float64),
                           np.repeat(v, B, 0).astype(np.float64), None)
    check(np.abs(out - ref_out).max() < 1e-5, "FD_SHARED_KV vs float64 reference over copied K/V")


# FD_NEW_KV: the cache holds the keys before the first query token; the tokens' own K/V come in k_new, v_new.
def test_new_kv():
    B, Hq, Hkv, D, S, T = 2, 8, 2, 64, 100, 3
    rng = np.random.default_rng(14)
    k = rng.uniform(-1, 1, (B, Hkv, S, D)).astype(np.float32)
    v = rng.uniform(-1, 1, (B, Hkv, S, D)).astype(np.float32)
    kn = rng.uniform(-1, 1, (B, T, Hkv, D)).astype(np.float32)
    vn = rng.uniform(-1, 1, (B, T, Hkv, D)).astype(np.float32)
    q = rng.uniform(-1, 1, (B, T, Hq, D)).astype(np.float32)
    pos = np.array([T - 1, 60], np.int32)                   # cached keys: 0 and 58
    with fd.Context(threads=2) as ctx:
        plan = ctx.plan(batch=B, n_q_heads=Hq, n_kv_heads=Hkv, head_dim=D, kv_len=S, q_len=T, features=fd.FD_NEW_KV)
        out = plan.run(q, k, v, cur_pos=pos, k_new=kn, v_new=vn)
    ok = True
    for b in range(B):
        C = pos[b] - T + 1
        kc = np.concatenate([k[b, :, :C], kn[b].transpose(1, 0, 2)], 1)[None]
        vc = np.concatenate([v[b, :, :C], vn[b].transpose(1, 0, 2)], 1)[None]
        for t in range(T):
            ref, _ = reference(q[b:b + 1, t].astype(np.float64), kc.astype(np.float64), vc.astype(np.float64), [C + t])
            ok = ok and np.abs(out[b, t] - ref[0]).max() < 1e-5
    check(ok, "FD_NEW_KV vs float64 reference over the cache then the new keys")


# An f32 causal problem for the feature tests: q, k, v (float32) and cur_pos of two rows.
def feature_problem(seed, B=2, Hq=8, Hkv=2, D=64, S=300):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.uniform(-1, 1, shape).astype(np.float32) for shape in ((B, Hq, D), (B, Hkv, S, D), (B, Hkv, S, D)))
    return q, k, v, np.array([S - 1, S // 2 - 10], np.int32)


# Run plan on a feature problem with extra run arguments; compare out and lse with the float64 reference.
def check_feature_run(name, plan, prob, run_kw, ref_kw):
    q, k, v, pos = prob
    out, lse = plan.run(q, k, v, cur_pos=pos, lse=True, **run_kw)
    ref_out, ref_lse = reference(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), pos, **ref_kw)
    err, lerr = np.abs(out - ref_out).max() / np.abs(ref_out).max(), np.abs(lse - ref_lse).max()
    check(err < 1e-5 and lerr < 1e-5, name, "max error %.3g, lse error %.3g" % (err, lerr))
    print("  %s: max error %.3g of max|ref|, lse error %.3g, key %s" % (name, err, lerr, plan.info()["key"]))
    return ref_out


# FD_ALIBI (features by name): slopes 2^(-8(h+1)/Hq) against the float64 reference with the bias.
def test_alibi():
    prob = feature_problem(21)
    slopes = np.exp2(-8.0 * np.arange(1, 9) / 8).astype(np.float32)
    with fd.Context(threads=2) as ctx:
        plan = ctx.plan(batch=2, n_q_heads=8, n_kv_heads=2, head_dim=64, kv_len=300, features=["alibi"])
        check(plan.shape["features"] == fd.FD_ALIBI, "features=['alibi'] sets FD_ALIBI", plan.shape["features"])
        ref = check_feature_run("ALiBi slopes vs float64 reference", plan, prob, dict(alibi_slopes=slopes),
                                dict(slopes=slopes.astype(np.float64)))
        plain, _ = reference(*(a.astype(np.float64) for a in prob[:3]), prob[3])
        check(np.abs(plain - ref).max() > 1e-2 * np.abs(ref).max(), "the ALiBi bias changes the reference")
        plan = ctx.plan(batch=2, n_q_heads=8, n_kv_heads=2, head_dim=64, kv_len=300, features="ALiBi", splits=3)
        check_feature_run("ALiBi slopes, forced splits 3", plan, prob, dict(alibi_slopes=slopes),
                          dict(slopes=slopes.astype(np.float64)))


# FD_SINK_LOGITS (features as the bit and by name): per-head logits, one -inf (no sink), one 8 (it dominates).
def test_sink_logits():
    prob = feature_problem(22)
    sinks = np.random.default_rng(23).uniform(2, 6, 8).astype(np.float32)
    sinks[1], sinks[2] = -np.inf, 8.0
    with fd.Context(threads=2) as ctx:
        plan = ctx.plan(batch=2, n_q_heads=8, n_kv_heads=2, head_dim=64, kv_len=300, features=fd.FD_SINK_LOGITS)
        check_feature_run("sink logits vs float64 reference", plan, prob, dict(sink_logits=sinks),
                          dict(sinks=sinks.astype(np.float64)))
        plan = ctx.plan(batch=2, n_q_heads=8, n_kv_heads=2, head_dim=64, kv_len=300,
                        features=("sink_logits", "alibi"), splits=3)
        check(plan.shape["features"] == fd.FD_SINK_LOGITS | fd.FD_ALIBI, "features as a tuple of names",
              plan.shape["features"])
        slopes = np.exp2(-8.0 * np.arange(1, 9) / 8).astype(np.float32)
        check_feature_run("sink logits and ALiBi, forced splits 3", plan, prob, dict(sink_logits=sinks, alibi_slopes=slopes),
                          dict(sinks=sinks.astype(np.float64), slopes=slopes.astype(np.float64)))


# fn() must raise exc with every one of words in its message.
def expect_error(name, exc, words, fn):
    try:
        fn()
        check(False, name, "no error raised")
    except exc as e:
        check(all(w in str(e) for w in words), name, "message %r lacks %r" % (str(e), words))


# FD_K_PER_CHANNEL (KIVI): int8 K with one scale per (row, kv head, channel), channels 1000x apart; V per row.
def test_k_per_channel():
    q, k, v, pos = feature_problem(24)
    k = (k * (np.logspace(0, 3, 64) / 30)).astype(np.float32)
    ks = (np.abs(k).max(axis=2) / 127).astype(np.float32)                      # [B, Hkv, D]
    kq = np.clip(np.rint(k / ks[:, :, None, :]), -127, 127).astype(np.int8)
    vs = (np.abs(v).max(axis=3) / 127).astype(np.float32)                      # [B, Hkv, S]
    vq = np.clip(np.rint(v / vs[..., None]), -127, 127).astype(np.int8)
    with fd.Context(threads=2) as ctx:
        for splits in (1, 3):
            plan = ctx.plan(2, 8, 2, 64, 300, kv_dtype="int8", features=["k_per_channel"], splits=splits)
            out, lse = plan.run(q, kq, vq, cur_pos=pos, lse=True, k_scale=ks, v_scale=vs)
            kd = kq.astype(np.float64) * ks[:, :, None, :].astype(np.float64)
            vd = vq.astype(np.float64) * vs[..., None].astype(np.float64)
            ref_out, ref_lse = reference(q.astype(np.float64), kd, vd, pos)
            err, lerr = np.abs(out - ref_out).max() / np.abs(ref_out).max(), np.abs(lse - ref_lse).max()
            check(err < 1e-5 and lerr < 1e-5, "per-channel K scales, splits %d" % splits,
                  "max error %.3g, lse error %.3g" % (err, lerr))
        expect_error("k_scale per row with FD_K_PER_CHANNEL", fd.InvalidArgumentError, ["k_scale"],
                     lambda: plan.run(q, kq, vq, cur_pos=pos, k_scale=np.ones((2, 2, 300), np.float32), v_scale=vs))


# FD_BEAMS (TensorRT-LLM's cache indirection): key s of row b read from row beam_src[b, s].
def test_beams():
    q, k, v, pos = feature_problem(25)
    src = np.random.default_rng(26).integers(0, 2, (2, 300)).astype(np.int32)
    src[:, 100:200] = [[1], [0]]                                               # long runs from the other row
    with fd.Context(threads=2) as ctx:
        for splits in (1, 3):
            plan = ctx.plan(2, 8, 2, 64, 300, features="beams", splits=splits)
            out, lse = plan.run(q, k, v, cur_pos=pos, lse=True, beam_src=src)
            gather = lambda x: np.stack([x[src[b], :, np.arange(300)].transpose(1, 0, 2) for b in range(2)])
            ref_out, ref_lse = reference(q.astype(np.float64), gather(k).astype(np.float64),
                                         gather(v).astype(np.float64), pos)
            err, lerr = np.abs(out - ref_out).max() / np.abs(ref_out).max(), np.abs(lse - ref_lse).max()
            check(err < 1e-5 and lerr < 1e-5, "beams, splits %d" % splits, "max error %.3g, lse error %.3g" % (err, lerr))
        bad = src.copy()
        bad[0, 7] = 2
        expect_error("beam_src entry 2 of batch 2", fd.InvalidArgumentError, ["beam_src[b=0, key=7] is 2"],
                     lambda: plan.run(q, k, v, cur_pos=pos, beam_src=bad))
        expect_error("beam_src of the wrong shape", fd.InvalidArgumentError, ["beam_src"],
                     lambda: plan.run(q, k, v, cur_pos=pos, beam_src=src[:, :10]))


# fd.FEATURES names every features bit of the header's enum (FD_ALIBI -> "alibi").
def test_feature_names():
    text = uncommented(open(HEADER).read())
    enum = re.search(r"enum\s*\{\s*(FD_ALIBI\b[^}]*)\}", text)
    want = {n[3:].lower(): int(v) for n, v in re.findall(r"(FD_\w+)\s*=\s*(\d+)", enum.group(1))} if enum else None
    check(fd.FEATURES == want, "fd.FEATURES matches the header's features enum", "%r vs %r" % (fd.FEATURES, want))


# A given out array is written and returned; a scalar cur_pos means every row.
def test_given_out_and_scalar_pos():
    c = dict(BASE, name="out given", B=2, cur_pos=[150, 150])
    with fd.Context(threads=2) as ctx:
        plan = ctx.plan(batch=2, n_q_heads=8, n_kv_heads=2, head_dim=64, kv_len=300)
        kw, ref = problem(c, np.random.default_rng(6))
        kw["cur_pos"] = np.int64(150)
        out = np.zeros((2, 8, 64), np.float32)
        check(plan.run(out=out, **kw) is out, "out given", "not the same array returned")
        compare("out given", c, out, None, ref)


# ---- bad arguments ---------------------------------------------------------------

# A small bf16 plan and valid arguments for the error tests.
def small_setup(ctx, **shape):
    s = dict(batch=1, n_q_heads=4, n_kv_heads=2, head_dim=32, kv_len=64, q_dtype="bf16", kv_dtype="bf16",
             out_dtype="bf16")
    s.update(shape)
    plan = ctx.plan(**s)
    rng = np.random.default_rng(1)
    kv = (s["batch"], s["n_kv_heads"], s["kv_len"], s["head_dim"])
    kw = dict(q=fd.to_bf16(rng.standard_normal((s["batch"], s["n_q_heads"], s["head_dim"]))),
              k=fd.to_bf16(rng.standard_normal(kv)), v=fd.to_bf16(rng.standard_normal(kv)),
              cur_pos=[s["kv_len"] - 1] * s["batch"])
    return plan, kw


# Run with bad arguments: the error type, the words its message must hold, and out (and lse) untouched.
def expect_run_error(name, plan, kw, exc, words, code=None):
    out = np.full((plan.shape["batch"], plan.shape["n_q_heads"], plan.shape["head_dim"]), 0x1234, np.uint16)
    lse = np.full((plan.shape["batch"], plan.shape["n_q_heads"]), 7.0, np.float32)
    try:
        plan.run(out=out, lse=lse, **kw)
        check(False, name, "no error raised")
    except exc as e:
        msg = str(e)
        check(all(w in msg for w in words), name, "message %r lacks %r" % (msg, words))
        check(code is None or e.code == code, name, "code %r, expected %r" % (getattr(e, "code", None), code))
    check((out == 0x1234).all() and (lse == 7.0).all(), name + " (out untouched)", "out or lse was written")


# Each bad run argument: (name, changes to the valid arguments, exception, words in the message, code).
def bad_run_args(kw):
    k = kw["k"]
    return [
        ("wrong k shape", dict(k=k[:, :, :32].copy()), fd.InvalidArgumentError,
         ["k:", "expected shape (1, 2, 64, 32) dtype bfloat16", "got shape (1, 2, 32, 32)"], -1),
        ("wrong k dtype", dict(k=k.astype(np.float32)), ValueError, ["k:", "bfloat16", "float32"], -1),
        ("non-contiguous v", dict(v=np.ascontiguousarray(np.swapaxes(kw["v"], 2, 3)).swapaxes(2, 3)),
         ValueError, ["v:", "C-contiguous"], -1),
        ("q not an array", dict(q=kw["q"].tolist()), ValueError, ["q:", "numpy array"], -1),
        ("cur_pos out of range (library)", dict(cur_pos=[64]), fd.InvalidArgumentError,
         ["cur_pos[0]", "64", "kv_len"], -1),
        ("cur_pos negative (library)", dict(cur_pos=[-1]), fd.Error, ["cur_pos[0]"], -1),
        ("cur_pos wrong length", dict(cur_pos=[1, 2]), ValueError, ["cur_pos:", "shape (1,)"], -1),
        ("cur_pos beyond int32", dict(cur_pos=[2 ** 32 + 5]), ValueError, ["cur_pos:", "int32"], -1),
        ("cur_pos missing in causal mode (library)", dict(cur_pos=None), fd.Error, ["cur_pos", "FD_CAUSAL"], -1),
        ("scale not finite (library)", dict(scale=float("nan")), fd.Error, ["scale"], -1),
        ("mask of the wrong dtype", dict(mask=np.zeros((1, 4, 64))), ValueError, ["mask:", "float32"], -1),
    ]


# Every bad run argument raises an error naming it and writes nothing.
def test_bad_run_arguments():
    with fd.Context(threads=2) as ctx:
        plan, kw = small_setup(ctx)
        for name, change, exc, words, code in bad_run_args(kw):
            expect_run_error(name, plan, dict(kw, **change), exc, words, code)


# alibi_slopes and sink_logits of the wrong length or dtype: refused naming the argument, nothing run.
def test_bad_feature_arguments():
    with fd.Context(threads=2) as ctx:
        plan, kw = small_setup(ctx, features=["alibi", "sink_logits"])
        good = dict(alibi_slopes=np.ones(4, np.float32), sink_logits=np.zeros(4, np.float32))
        for name, change, words in [
                ("alibi_slopes of the wrong length", dict(alibi_slopes=np.ones(3, np.float32)),
                 ["alibi_slopes:", "expected shape (4,) dtype float32", "got shape (3,)"]),
                ("sink_logits of the wrong length", dict(sink_logits=np.zeros(5, np.float32)),
                 ["sink_logits:", "expected shape (4,) dtype float32", "got shape (5,)"]),
                ("sink_logits of the wrong dtype", dict(sink_logits=np.zeros(4)), ["sink_logits:", "float64"]),
                ("alibi_slopes not an array", dict(alibi_slopes=[1.0] * 4), ["alibi_slopes:", "numpy array"])]:
            expect_run_error(name, plan, dict(kw, **dict(good, **change)), fd.InvalidArgumentError, words, -1)
        expect_run_error("sink_logits missing with FD_SINK_LOGITS (library)", plan,
                         dict(kw, alibi_slopes=good["alibi_slopes"]), fd.InvalidArgumentError,
                         ["args.sink_logits is NULL"], -1)


# Refusals of the library for missing per-mode arrays: mask in mask mode, scales with int8 KV.
def test_missing_mode_arrays():
    with fd.Context(threads=2) as ctx:
        plan, kw = small_setup(ctx, mask_mode="mask")
        expect_run_error("mask missing in mask mode", plan, dict(kw, cur_pos=None), fd.InvalidArgumentError,
                         ["args.mask", "FD_MASK"], -1)
        plan, kw = small_setup(ctx, kv_dtype="int8")
        i8 = dict(k=kw["k"].view(np.int8)[..., ::2].copy(), v=kw["v"].view(np.int8)[..., ::2].copy())
        expect_run_error("k_scale missing with int8 KV", plan, dict(kw, **i8), fd.Error, ["k_scale", "int8"], -1)


# Bad output arrays: wrong dtype, read-only.
def test_bad_outputs():
    with fd.Context(threads=2) as ctx:
        plan, kw = small_setup(ctx)
        for name, out, words in [("out wrong dtype", np.zeros((1, 4, 32), np.float32), ["out:", "bfloat16"]),
                                 ("out read-only", np.zeros((1, 4, 32), np.uint16), ["out:", "read-only"])]:
            out.flags.writeable = name != "out read-only"
            try:
                plan.run(out=out, **kw)
                check(False, name, "no error raised")
            except ValueError as e:
                check(all(w in str(e) for w in words), name, "message %r" % str(e))
                check(not out.any(), name + " (out untouched)", "out was written")
        try:
            plan.run(lse=np.zeros((1, 5), np.float32), **kw)
            check(False, "lse wrong shape", "no error raised")
        except ValueError as e:
            check("lse:" in str(e), "lse wrong shape", "message %r" % str(e))


# Each bad plan request: (name, changes to a valid shape, exception, words in the message).
BAD_PLANS = [
    ("n_q_heads not a multiple of n_kv_heads (library)", dict(n_q_heads=6, n_kv_heads=4), fd.InvalidArgumentError,
     ["n_q_heads", "n_kv_heads"]),
    ("bad dtype string", dict(kv_dtype="bf17"), ValueError, ["kv_dtype", "bf17"]),
    ("q_dtype int8 refused (library)", dict(q_dtype="int8"), fd.Error, ["q_dtype"]),
    ("q_dtype q8_0 refused (library)", dict(q_dtype="q8_0"), fd.Error, ["q_dtype"]),
    ("q4_0 with head_dim 48 (library)", dict(kv_dtype="q4_0", head_dim=48), fd.InvalidArgumentError,
     ["shape.head_dim", "q4_0", "32"]),
    ("bad mask_mode string", dict(mask_mode="sliding"), ValueError, ["mask_mode", "sliding"]),
    ("bad layout string", dict(layout="nhwc"), ValueError, ["layout", "nhwc"]),
    ("unknown feature name", dict(features=["alibi", "alibl"]), fd.InvalidArgumentError,
     ["features", "'alibl'", "sink_logits"]),
    ("features not a name or list", dict(features=1.5), fd.InvalidArgumentError, ["features"]),
    ("head_dim beyond a C int", dict(head_dim=2 ** 32 + 32), ValueError, ["head_dim"]),
    ("batch 0 (library)", dict(batch=0), fd.InvalidArgumentError, ["shape.batch"]),
    ("head_dim not an integer", dict(head_dim=32.0), ValueError, ["head_dim"]),
    ("paged layout without pool_pages (library)", dict(layout="paged", page_size=16), fd.InvalidArgumentError,
     ["shape.pool_pages"]),
    ("splits negative (library)", dict(opts=dict(splits=-1)), fd.InvalidArgumentError, ["opts.splits"]),
    ("group_tile not dividing (library)", dict(group_tile=3), fd.InvalidArgumentError, ["opts.group_tile"]),
    ("bad isa string", dict(isa="sse9"), ValueError, ["opts.isa", "sse9"]),
    ("unknown plan option", dict(chunks=64), TypeError, ["chunks"]),
    ("option both in opts and keyword", dict(opts=dict(chunk=64), chunk=64), TypeError, ["chunk"]),
]


# Every bad plan request raises an error that names the field.
def test_bad_plans():
    shape = dict(batch=1, n_q_heads=4, n_kv_heads=2, head_dim=32, kv_len=64)
    with fd.Context(threads=2) as ctx:
        for name, change, exc, words in BAD_PLANS:
            try:
                ctx.plan(**dict(shape, **change))
                check(False, name, "no error raised")
            except exc as e:
                check(all(w in str(e) for w in words), name, "message %r lacks %r" % (str(e), words))


# Bad context settings name the setting.
def test_bad_context():
    for name, kw, words in [("bad backend", dict(backend="gcc"), ["backend", "gcc"]),
                            ("bad isa_limit", dict(isa_limit="sse2"), ["isa_limit"]),
                            ("negative threads (library)", dict(threads=-1), ["config.threads"])]:
        try:
            fd.Context(**kw)
            check(False, name, "no error raised")
        except fd.Error as e:
            check(all(w in str(e) for w in words), name, "message %r" % str(e))


# A refused tuned table warns (TableWarning) and the context still plans with the heuristic.
def test_refused_table():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with fd.Context(threads=1, table="/nonexistent/table.tsv") as ctx:
            check("cannot open" in ctx.table_note, "refused table note", "note %r" % ctx.table_note)
            check(any(issubclass(w.category, fd.TableWarning) for w in seen), "refused table warning", "no warning")
            ctx.plan(batch=1, n_q_heads=2, n_kv_heads=1, head_dim=16, kv_len=8)


# ---- lifetime ------------------------------------------------------------------

# A plan keeps its Context alive; after close() runs fail with DestroyedError and write nothing.
def test_lifetime():
    ctx = fd.Context(threads=2)
    plan, kw = small_setup(ctx)
    del ctx
    gc.collect()
    out = plan.run(**kw)
    check(out.shape == (1, 4, 32), "plan outlives its Context variable", "shape %s" % (out.shape,))
    plan._ctx.close()
    expect_run_error("run after Context.close()", plan, kw, fd.DestroyedError, ["destroyed"], -6)
    try:
        plan._ctx.plan(batch=1, n_q_heads=4, n_kv_heads=2, head_dim=32, kv_len=64)
        check(False, "plan after close", "no error raised")
    except fd.DestroyedError:
        check(True, "plan after close")
    plan.close()
    plan.close()
    expect_run_error("run after Plan.close()", plan, kw, fd.DestroyedError, ["closed"], -6)


# Plans of one context run from several Python threads at once and all get the right answers.
def test_threads():
    c = dict(BASE, name="threads", kv="bf16", out="bf16", B=2, cur_pos=[299, 150])
    with fd.Context(threads=2) as ctx:
        plan = ctx.plan(batch=2, n_q_heads=8, n_kv_heads=2, head_dim=64, kv_len=300, kv_dtype="bf16",
                        out_dtype="bf16")
        kw, ref = problem(c, np.random.default_rng(9))
        errors = []

        def work():
            for _ in range(5):
                errors.append(float((np.abs(as_f64(plan.run(**kw), "bf16") - ref[0]) / bound(c, ref[0])).max()))
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        check(len(errors) == 20 and max(errors) <= 1, "4 Python threads x 5 runs",
              "%d runs, worst element %.3g x its bound" % (len(errors), max(errors or [math.inf])))


# ---- helpers, info, version --------------------------------------------------------

# to_bf16 rounds to nearest even from float32 and float64 (no double rounding); from_bf16 is exact.
def test_bf16_helpers():
    cases = [(1 + 2 ** -8, 0x3F80), (1 + 3 * 2 ** -8, 0x3F82), (1 + 2 ** -8 + 2 ** -30, 0x3F81),
             (-1.5, 0xBFC0), (np.inf, 0x7F80), (3.4e38, 0x7F80), (1e-45, 0x0000), (0.0, 0), (-0.0, 0x8000)]
    for x, bits in cases:
        got = int(fd.to_bf16(np.array([x])).view(np.uint16)[0])
        check(got == bits, "to_bf16(%r)" % x, "0x%04x, expected 0x%04x" % (got, bits))
    check(np.isnan(fd.from_bf16(fd.to_bf16(np.array([np.nan], np.float32))))[0], "to_bf16(nan)", "not NaN")
    every = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    f = fd.from_bf16(every)
    fin = ~np.isnan(f)
    check(np.array_equal(fd.to_bf16(f[fin]).view(np.uint16), every[fin]), "bf16 round trip", "bits changed")
    check(f.dtype == np.float32 and fd.to_bf16(f[:4]).dtype == fd.BF16, "bf16 dtypes", "%s" % f.dtype)


# plan.info() is a dict of fd_plan_info's fields; a length outside the plan is a library error.
def test_info():
    with fd.Context(threads=2) as ctx:
        plan = ctx.plan(batch=1, n_q_heads=4, n_kv_heads=2, head_dim=32, kv_len=5000, kv_dtype="bf16")
        info = plan.info(100)
        names = [n for n, _ in _lib.PlanInfo._fields_]
        check(sorted(info) == sorted(names) and isinstance(info["key"], str) and info["key"].isdigit(),
              "plan.info fields", "%r" % info)
        check(info["threads"] >= 1 and info["chunk"] >= 1, "plan.info values", "%r" % info)
        try:
            plan.info(5001)
            check(False, "plan.info beyond kv_len", "no error")
        except fd.InvalidArgumentError as e:
            check("kv_len" in str(e), "plan.info beyond kv_len", str(e))
        check(fd.length_bucket(1000) == 1024 and fd.machine_name(), "length_bucket, machine_name", "")


# The header without its comments.
def uncommented(text):
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


# The C declarations of the header: {struct: [field names in order]}.
def header_structs(text):
    structs = {}
    for name, body in re.findall(r"typedef struct (\w+) \{(.*?)\} \1;", text, flags=re.S):
        fields = []
        for decl in filter(None, (d.strip() for d in body.split(";"))):
            for part in decl.split(","):
                fields.append(re.search(r"(\w+)\s*(\[[^\]]*\])?\s*$", part).group(1))
        structs[name] = fields
    return structs


# A C program printing sizeof/offsetof of every mirrored field and every constant, as "name value" lines.
def layout_program():
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "flashdecode.h"', 'int main(void) {',
             '  printf("FD_VERSION %s\\n", FD_VERSION);']
    for cname, cls in _lib.STRUCTS.items():
        lines.append('  printf("%s %%zu\\n", sizeof(%s));' % (cname, cname))
        for field, _ in cls._fields_:
            lines.append('  printf("%s.%s %%zu\\n", offsetof(%s, %s));' % (cname, field, cname, field))
    for const in _lib.CONSTANTS:
        lines.append('  printf("%s %%d\\n", (int)%s);' % (const, const))
    return "\n".join(lines + ["  return 0;", "}", ""])


# What the same facts are in the binding.
def binding_layout():
    facts = {"FD_VERSION": fd.__version__}
    for cname, cls in _lib.STRUCTS.items():
        facts[cname] = str(ctypes.sizeof(cls))
        for field, _ in cls._fields_:
            facts["%s.%s" % (cname, field)] = str(getattr(cls, field).offset)
    facts.update({k: str(v) for k, v in _lib.CONSTANTS.items()})
    return facts


# Struct names, field names, offsets, sizes, constants and the version match the header compiled by gcc.
def test_header_layout():
    text = uncommented(open(HEADER).read())
    decl = header_structs(text)
    for cname, cls in _lib.STRUCTS.items():
        mine = [f for f, _ in cls._fields_]
        check(decl.get(cname) == mine, "fields of " + cname, "header %s, binding %s" % (decl.get(cname), mine))
    check(set(decl) == set(_lib.STRUCTS), "every struct mirrored", "header %s" % sorted(decl))
    enums = set(re.findall(r"\b(FD_[A-Z0-9_]+)\s*=", text) + re.findall(r"#define (FD_\w+) -?\d", text))
    check(enums <= set(_lib.CONSTANTS), "every constant mirrored", "missing %s" % sorted(enums - set(_lib.CONSTANTS)))
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = os.path.join(tmp, "layout.c"), os.path.join(tmp, "layout")
        open(src, "w").write(layout_program())
        cc = subprocess.run(["gcc", "-std=c11", "-I" + os.path.dirname(HEADER), src, "-o", exe],
                            capture_output=True, text=True)
        if not check(cc.returncode == 0, "layout program compiles", cc.stderr[-500:]):
            return
        c_facts = dict(line.split(" ", 1) for line in subprocess.run([exe], capture_output=True, text=True,
                                                                     check=True).stdout.splitlines())
    mine = binding_layout()
    bad = ["%s: C %s, binding %s" % (k, c_facts.get(k), v) for k, v in mine.items() if c_facts.get(k) != v]
    check(not bad, "sizeof/offsetof/constants vs gcc", "; ".join(bad))


# Install a copy of the package under root/pydir the way `make install` does (placeholders filled).
def install_copy(root, pydir, libdir):
    dst = os.path.join(root, pydir, "flashdecode")
    shutil.copytree(os.path.dirname(fd.__file__), dst, ignore=shutil.ignore_patterns("__pycache__"))
    for name in os.listdir(dst):
        path = os.path.join(dst, name)
        text = open(path).read().replace("@LIBDIR@", libdir).replace("@PREFIX@", root)
        open(path, "w").write(text)


# library_path() printed by a fresh interpreter with PYTHONPATH and without $FD_LIB, run in cwd.
def lookup(pythonpath, cwd):
    env = {k: v for k, v in os.environ.items() if k != "FD_LIB"}
    env["PYTHONPATH"] = pythonpath
    r = subprocess.run([sys.executable, "-c", "import flashdecode; print(flashdecode.library_path())"],
                       env=env, capture_output=True, text=True, cwd=cwd)
    return r.stdout.strip() + r.stderr[-300:]


# Library lookup: $FD_LIB that does not load names it and says how to build; a source tree's
# build/ and the installed lib dir are found without $FD_LIB.
def test_library_lookup():
    lib = os.path.abspath(fd.library_path())
    env = dict(os.environ, FD_LIB="/nonexistent/libflashdecode.so")
    r = subprocess.run([sys.executable, "-c", "import flashdecode; flashdecode.Context()"], env=env,
                       capture_output=True, text=True)
    check(r.returncode != 0 and "/nonexistent/libflashdecode.so" in r.stderr and "make lib" in r.stderr,
          "FD_LIB not loadable", r.stderr[-300:])
    with tempfile.TemporaryDirectory() as tmp:
        tree = os.path.join(tmp, "tree")
        shutil.copytree(os.path.dirname(fd.__file__), os.path.join(tree, "python", "flashdecode"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        os.makedirs(os.path.join(tree, "build"))
        shutil.copy(lib, os.path.join(tree, "build", "libflashdecode.so"))
        got = lookup(os.path.join(tree, "python"), tmp)
        check(got == os.path.join(tree, "build", "libflashdecode.so"), "lookup: source tree", got)
        prefix = os.path.join(tmp, "prefix")
        install_copy(prefix, "dist-packages", os.path.join(prefix, "lib"))
        os.makedirs(os.path.join(prefix, "lib"))
        shutil.copy(lib, os.path.join(prefix, "lib", "libflashdecode.so.0"))
        got = lookup(os.path.join(prefix, "dist-packages"), tmp)
        check(got == os.path.join(prefix, "lib", "libflashdecode.so.0"), "lookup: installed lib dir", got)


def main():
    for test in [test_header_layout, test_bf16_helpers, test_numerics, test_cc_backend, test_lse_true,
                 test_given_out_and_scalar_pos, test_paged, test_q_len, test_shared_kv, test_new_kv, test_alibi, test_sink_logits,
                 test_k_per_channel, test_beams,
                 test_feature_names, test_bad_run_arguments, test_bad_feature_arguments, test_missing_mode_arrays, test_bad_outputs,
                 test_bad_plans, test_bad_context, test_refused_table, test_lifetime, test_threads, test_info,
                 test_library_lookup]:
        case(test)
    print("%d passed, %d failed" % (tally["passed"], tally["failed"]))
    return 1 if tally["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
