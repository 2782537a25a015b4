"""Element types: the names the API accepts, their numpy dtypes, bf16 conversion."""
import numpy as np

from . import _lib as L

try:  # bfloat16 / float8 as real numpy dtypes when ml_dtypes is installed
    import ml_dtypes as _ml
except ImportError:  # pragma: no cover - depends on the machine
    _ml = None

# The dtype bf16 arrays are made with: ml_dtypes.bfloat16 if importable, else uint16 bits.
BF16 = np.dtype(_ml.bfloat16) if _ml is not None else np.dtype(np.uint16)

# fd_dtype by every accepted spelling: gen/facts.lua's names, then numpy's and aliases.
NAMES = {name: code for code, name in enumerate(L.DTYPE_NAMES)}
NAMES.update({"float32": L.FD_F32, "float16": L.FD_F16, "bfloat16": L.FD_BF16, "int8": L.FD_I8,
              "fp8_e4m3": L.FD_FP8_E4M3, "float8_e4m3fn": L.FD_FP8_E4M3,
              "fp8_e5m2": L.FD_FP8_E5M2, "float8_e5m2": L.FD_FP8_E5M2})

# Per fd_dtype: the name used in messages, the numpy dtype names accepted, the dtype allocated.
TABLE = {
    L.FD_F32: ("float32", ("float32",), np.dtype(np.float32)),
    L.FD_F16: ("float16", ("float16",), np.dtype(np.float16)),
    L.FD_BF16: ("bfloat16", ("bfloat16", "uint16"), BF16),
    L.FD_I8: ("int8", ("int8",), np.dtype(np.int8)),
    L.FD_FP8_E4M3: ("fp8_e4m3", ("float8_e4m3fn", "uint8"), np.dtype(np.uint8)),
    L.FD_FP8_E5M2: ("fp8_e5m2", ("float8_e5m2", "uint8"), np.dtype(np.uint8)),
    # ggml blocks: uint8 arrays of the raw blocks, head_dim // 32 blocks per K/V row (row_bytes)
    L.FD_Q8_0: ("q8_0 blocks (uint8)", ("uint8",), np.dtype(np.uint8)),
    L.FD_Q4_0: ("q4_0 blocks (uint8)", ("uint8",), np.dtype(np.uint8)),
}
# Every dtype of gen/facts.lua has an entry, of its size in bytes.
assert sorted(TABLE) == list(range(len(L.DTYPE_SIZE)))
assert all(TABLE[c][2].itemsize == (L.DTYPE_SIZE[c] or 1) for c in TABLE), "dtype sizes differ from gen/facts.lua"


# The fd_dtype of a dtype name; ValueError naming the field for an unknown one.
def parse(field, name, error):
    key = name.lower() if isinstance(name, str) else None
    if key not in NAMES:
        raise error("%s: %r is not a dtype (one of f32, f16, bf16, int8, fp8_e4m3, fp8_e5m2, q8_0, q4_0)" % (field, name))
    return NAMES[key]


# The last axis of a K/V array of fd_dtype code for head_dim D: D, or a block dtype's row bytes.
def row_len(code, D):
    n, nbytes = L.DTYPE_BLOCK[code]
    return D if n == 1 else D // n * nbytes


# Whether a numpy dtype carries fd_dtype code.
def accepts(code, dtype):
    return dtype.name in TABLE[code][1]


# A readable name of fd_dtype code for messages.
def describe(code):
    return TABLE[code][0]


# A new uninitialized array for fd_dtype code.
def empty(code, shape):
    return np.empty(shape, TABLE[code][2])


# float32 bits of x rounded to odd (keeps a later rounding to bf16 exact, no double rounding).
def _f32_round_to_odd(x):
    f = x.astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        back = f.astype(np.float64)
        over = np.abs(back) > np.abs(x)
        f[over] = np.nextafter(f[over], np.float32(0))
        inexact = f.astype(np.float64) != x
    bits = f.view(np.uint32).copy()
    bits[inexact & ~np.isnan(x)] |= np.uint32(1)
    return bits


# bf16 of a float array, rounded to nearest even; an array of BF16 (uint16 bits without ml_dtypes).
def to_bf16(x):
    x = np.asarray(x)
    if x.dtype in (np.float16, np.float32):
        bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
    else:
        bits = _f32_round_to_odd(np.asarray(x, np.float64))
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    out = np.where(nan, (bits >> np.uint32(16)) | np.uint32(0x40), rounded).astype(np.uint16)
    return out.view(BF16)


# float32 values of a bf16 array (uint16 bits or ml_dtypes.bfloat16).
def from_bf16(h):
    h = np.asarray(h)
    if h.dtype.name not in ("uint16", "bfloat16"):
        raise ValueError("from_bf16: expected uint16 bits or bfloat16, got dtype %s" % h.dtype)
    return (np.ascontiguousarray(h).view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
