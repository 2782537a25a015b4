#!/usr/bin/python3
"""One grouped-query (GQA) bf16 decode step with the flashdecode Python module,
checked against numpy in float64.

From a source checkout after `make lib`:
    PYTHONPATH=python /usr/bin/python3 examples/python_decode.py
Installed (`make install`): /usr/bin/python3 python_decode.py from anywhere.
Prints the max error relative to the largest output; exits 1 above half a bf16 ulp.
"""
import math
import sys

import numpy as np

import flashdecode

B, HQ, HKV, D, S = 1, 32, 8, 128, 4096      # Llama-3-8B attention, a 4096-token cache
pos = 3000                                  # the query's position: keys 0..3000 are visible

rng = np.random.default_rng(0)
q = flashdecode.to_bf16(rng.standard_normal((B, HQ, D)))
k = flashdecode.to_bf16(rng.standard_normal((B, HKV, S, D)))
v = flashdecode.to_bf16(rng.standard_normal((B, HKV, S, D)))

with flashdecode.Context(threads=2) as ctx:
    plan = ctx.plan(batch=B, n_q_heads=HQ, n_kv_heads=HKV, head_dim=D, kv_len=S,
                    q_dtype="bf16", kv_dtype="bf16", out_dtype="bf16", mask_mode="causal", layout="bhsd")
    out, lse = plan.run(q, k, v, cur_pos=[pos], lse=True)
    print("flashdecode %s, %s, kernel %s" % (flashdecode.__version__, flashdecode.library_path(), plan.info()["key"]))

# The same attention in float64: query head h reads kv head h // (HQ / HKV).
qd, kd, vd = (flashdecode.from_bf16(x).astype(np.float64) for x in (q, k, v))
ref = np.empty((B, HQ, D))
for h in range(HQ):
    j = h // (HQ // HKV)
    s = kd[0, j, :pos + 1] @ qd[0, h] / math.sqrt(D)
    p = np.exp(s - s.max())
    ref[0, h] = p @ vd[0, j, :pos + 1] / p.sum()

err = np.abs(flashdecode.from_bf16(out) - ref).max() / np.abs(ref).max()
bound = 2.0 ** -8 + 1e-5                    # bf16 output rounding plus f32 arithmetic
print("out %s bf16, lse[0, 0] %.4f; max error %.2e of the largest output (bound %.2e)"
      % (out.shape, lse[0, 0], err, bound))
sys.exit(0 if err <= bound else 1)
