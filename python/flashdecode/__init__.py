"""flashdecode: decode-phase attention on CPUs, a ctypes binding of libflashdecode.

    import numpy as np, flashdecode
    ctx = flashdecode.Context(threads=2)
    plan = ctx.plan(batch=1, n_q_heads=32, n_kv_heads=8, head_dim=128, kv_len=4096,
                    q_dtype="bf16", kv_dtype="bf16", out_dtype="bf16")
    out = plan.run(q, k, v, cur_pos=[4095])           # q [B,Hq,D], k/v [B,Hkv,S,D]

Arrays are numpy arrays, C-contiguous, of the plan's shapes and dtypes: f32 is
float32, f16 float16, bf16 uint16 bits (or ml_dtypes.bfloat16; see to_bf16 /
from_bf16), int8 int8, fp8_e4m3 and fp8_e5m2 uint8 bits, q8_0 and q4_0 uint8
arrays of their raw ggml blocks (llama.cpp's KV cache bytes: each K/V row's last
axis head_dim // 32 * 34 or * 18 bytes, no k_scale / v_scale). Shapes and dtypes are
checked here (InvalidArgumentError, a ValueError, naming the argument);
everything else is checked by the library, whose every failure raises an Error
subclass carrying .code (FD_E*) and the library's message. Nothing is written
to out on failure.
The library is $FD_LIB, else build/libflashdecode.so of the source tree this
package sits in, else an installed libflashdecode.
"""
import ctypes
import operator
import os
import threading
import warnings

import numpy as np

from . import _dtypes
from . import _lib as L
from ._dtypes import BF16, from_bf16, to_bf16

__version__ = L.FD_VERSION
__all__ = ["Context", "Plan", "Error", "InvalidArgumentError", "OutOfMemoryError", "CompileError",
           "UnsupportedError", "TableError", "DestroyedError", "SystemCallError", "LibraryError",
           "TableWarning", "BF16", "to_bf16", "from_bf16", "machine_name", "length_bucket",
           "library_path", "__version__", "FD_ALIBI", "FD_SINK_LOGITS", "FD_NEW_KV", "FD_SHARED_KV",
           "FD_K_PER_CHANNEL", "FD_BEAMS", "FEATURES"]
# fd_shape.features bits (Context.plan(features=...)), from the generated facts.
FD_ALIBI, FD_SINK_LOGITS, FD_NEW_KV = L.FD_ALIBI, L.FD_SINK_LOGITS, L.FD_NEW_KV
FD_SHARED_KV, FD_K_PER_CHANNEL, FD_BEAMS = L.FD_SHARED_KV, L.FD_K_PER_CHANNEL, L.FD_BEAMS
# The same bits by name, as Context.plan(features=...) takes them: {"alibi": FD_ALIBI, "sink_logits": ...}.
FEATURES = dict(L.FEATURES)


class Error(Exception):
    """A flashdecode failure: .code is the FD_E* return code (None if the C API gives none), .message the text."""
    code = None

    def __init__(self, message, code=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class InvalidArgumentError(Error, ValueError):
    """FD_EINVAL, or an array refused before the call: the message names the field."""
    code = L.FD_EINVAL


class OutOfMemoryError(Error, MemoryError):
    """FD_ENOMEM."""
    code = L.FD_ENOMEM


class CompileError(Error):
    """FD_ECOMPILE: generating or compiling a kernel failed."""
    code = L.FD_ECOMPILE


class UnsupportedError(Error):
    """FD_EUNSUPPORTED: a valid request this build or CPU cannot serve."""
    code = L.FD_EUNSUPPORTED


class TableError(Error):
    """FD_ETABLE: a tuned table was refused."""
    code = L.FD_ETABLE


class DestroyedError(Error):
    """FD_EDESTROYED: the context (or this plan) was closed."""
    code = L.FD_EDESTROYED


class SystemCallError(Error):
    """FD_ESYS: a system call failed."""
    code = L.FD_ESYS


class LibraryError(Error, OSError):
    """libflashdecode could not be loaded (the message says how to build it)."""


class TableWarning(UserWarning):
    """A tuned table given to Context was refused; the heuristic plans instead."""


# The exception class of each return code.
_ERRORS = {cls.code: cls for cls in (InvalidArgumentError, OutOfMemoryError, CompileError, UnsupportedError,
                                      TableError, DestroyedError, SystemCallError)}

# Names of the enum arguments and their C values.
_BACKENDS = {"tcc": L.FD_BACKEND_TCC, "cc": L.FD_BACKEND_CC}
_PRECISIONS = {"default": L.FD_PRECISION_DEFAULT, "fast": L.FD_PRECISION_FAST}
# Names from the generated facts: an isa choice is its key digit plus one (0 = auto).
_ISAS = {"auto": L.FD_ISA_AUTO, **{name: digit + 1 for digit, name in enumerate(L.ISA_NAMES)}}
_ISA_DIGITS = L.ISA_NAMES
_MASK_MODES = {name: value for value, name in enumerate(L.MASK_MODE_NAMES)}
_LAYOUTS = {name: value for value, name in enumerate(L.LAYOUT_NAMES)}
_INT32 = (-2 ** 31, 2 ** 31 - 1)
_INT64 = (-2 ** 63, 2 ** 63 - 1)
# fd_shape fields without a named parameter of Context.plan (gen/facts.lua SHAPE_FIELDS): name -> C kind.
_PLAN_PARAMS = ("batch", "n_q_heads", "n_kv_heads", "head_dim", "kv_len", "q_dtype", "kv_dtype", "out_dtype",
                "mask_mode", "layout", "page_size")
_EXTRA_SHAPE_FIELDS = {name: kind for name, kind in L._facts.SHAPE_FIELDS if name not in _PLAN_PARAMS}
_OPTION_NAMES = tuple(name for name, _ in L.PlanOpts._fields_)


# The loaded library, or LibraryError with the build hint.
def _library():
    try:
        return L.lib()
    except OSError as e:
        raise LibraryError(str(e)) from None


# The exception for a nonzero return code, with the calling thread's fd_errmsg(ctx).
def _failure(lib, code, ctx_ptr):
    raw = lib.fd_errmsg(ctx_ptr)
    message = raw.decode(errors="replace") if raw else ""
    cls = _ERRORS.get(code)
    return cls(message or "error %d" % code) if cls else Error(message or "error %d" % code, code)


# value as a C integer in [lo, hi]; InvalidArgumentError naming field otherwise.
def _c_int(field, value, bounds=_INT32):
    try:
        v = operator.index(value)
    except TypeError:
        raise InvalidArgumentError("%s: expected an integer, got %r" % (field, value)) from None
    if not bounds[0] <= v <= bounds[1]:
        raise InvalidArgumentError("%s: %d does not fit in a %d-bit C integer"
                                   % (field, v, 32 if bounds is _INT32 else 64))
    return v


# The C value of an enum argument given by name; InvalidArgumentError naming field otherwise.
def _choice(field, value, table):
    key = value.lower() if isinstance(value, str) else None
    if key not in table:
        raise InvalidArgumentError("%s: %r is not one of %s" % (field, value, ", ".join(table)))
    return table[key]


# fd_shape.features from an int (the FD_* bits), a feature name ("alibi", any case) or an iterable of
# names and ints; InvalidArgumentError naming the field otherwise.
def _features(value):
    if isinstance(value, str) or hasattr(value, "__index__"):
        value = [value]
    try:
        items = list(value)
    except TypeError:
        raise InvalidArgumentError("features: expected an int, a feature name or a list of them, got %r"
                                   % (value,)) from None
    bits = 0
    for item in items:
        bit = FEATURES.get(item.lower()) if isinstance(item, str) else _c_int("features", item, _INT64)
        if bit is None or not 0 <= bit < 2 ** 32:
            raise InvalidArgumentError("features: %r is not a feature (one of %s, or the FD_* bits as an int)"
                                       % (item, ", ".join(FEATURES)))
        bits |= bit
    return bits


# A path argument as bytes for C (None stays NULL).
def _path(value):
    return None if value is None else os.fsencode(value)


# The shape and dtype an array must have, in words.
def _expected(shape, code):
    return "shape %s dtype %s" % (tuple(shape), _dtypes.describe(code))


# An array's address after checking type, shape, dtype, layout (and writability for outputs).
def _address(field, arr, shape, code, writable=False):
    if not isinstance(arr, np.ndarray):
        raise InvalidArgumentError("%s: expected a numpy array of %s, got %s"
                                   % (field, _expected(shape, code), type(arr).__name__))
    if arr.shape != tuple(shape) or not _dtypes.accepts(code, arr.dtype):
        raise InvalidArgumentError("%s: expected %s, got shape %s dtype %s"
                                   % (field, _expected(shape, code), arr.shape, arr.dtype))
    if not (arr.flags.c_contiguous and arr.flags.aligned):
        raise InvalidArgumentError("%s: must be C-contiguous and aligned (numpy.ascontiguousarray makes a copy)"
                                   % field)
    if writable and not arr.flags.writeable:
        raise InvalidArgumentError("%s: is read-only" % field)
    return arr.ctypes.data


# The package's own library: its path.
def library_path():
    _library()
    return L.load()[1]


# A short name for this machine ("amd-epyc-2c-avx512bf16"), as result files use.
def machine_name():
    return _library().fd_machine_name().decode()


# The kv-length bucket (smallest power of two >= n) a length falls in.
def length_bucket(n):
    return _library().fd_length_bucket(_c_int("n", n, _INT64))


class _Handle:
    """A library object owned by Python: close() frees it once (also at the end of a with
    block or at garbage collection); subclasses set _ptr and _lock and define _free(ptr)."""

    def close(self):
        """Free the object now; safe to call twice."""
        lock = getattr(self, "_lock", None)
        if lock is None:
            return
        with lock:
            if self._ptr is not None:
                self._free(self._ptr)
                self._ptr = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Context(_Handle):
    """A library context: threads, compiler backend, kernel cache, tuned table.

    Context(threads=0, backend="tcc"|"cc", table=None, cache_dir=None, isa_limit="auto"|"c"|"avx2"|"avx512",
    max_kernels=0, check_inputs=False, deterministic=False, precision="default"|"fast"); threads=0 means all online
    cores, max_kernels=0 an unbounded kernel cache, check_inputs=True refuses non-finite inputs in run(),
    deterministic=True gives batch-invariant results (a row's bits independent of the threads and the other rows;
    fd_config.deterministic), precision="fast" bf16 softmax weights in P.V where a kernel serves it
    (fd_config.precision FD_PRECISION_FAST: bf16 V on avx512bf16), 2 MSD planes instead of 3 for int8 K.
    close() (or the end of a with block, or garbage collection) ends it; plans made from it keep it referenced, and
    running one after close() raises DestroyedError.
    """

    def __init__(self, threads=0, backend="tcc", table=None, cache_dir=None, isa_limit="auto", max_kernels=0,
                 check_inputs=False, deterministic=False, precision="default"):
        self._ptr = None
        self._lib = _library()
        self._lock = threading.Lock()
        self._strings = (_path(table), _path(cache_dir))   # alive while C may read them
        cfg = L.Config(threads=_c_int("threads", threads), backend=_choice("backend", backend, _BACKENDS),
                       table=self._strings[0], cache_dir=self._strings[1],
                       isa_limit=_choice("isa_limit", isa_limit, _ISAS),
                       max_kernels=_c_int("max_kernels", max_kernels), check_inputs=1 if check_inputs else 0,
                       deterministic=1 if deterministic else 0,
                       precision=_choice("precision", precision, _PRECISIONS))
        ptr = self._lib.fd_create(ctypes.byref(cfg))
        if not ptr:
            raw = self._lib.fd_errmsg(None)
            raise Error(raw.decode(errors="replace") if raw else "fd_create failed")
        self._ptr = ptr
        self.table_note = self._lib.fd_errmsg(ptr).decode(errors="replace") if table is not None else ""
        if self.table_note:
            warnings.warn(self.table_note, TableWarning, stacklevel=2)

    # The live context pointer, or DestroyedError after close().
    def _handle(self):
        if self._ptr is None:
            raise DestroyedError("the context is closed")
        return self._ptr

    @property
    def threads(self):
        """Worker threads of the context."""
        return self._lib.fd_ctx_threads(self._handle())

    @property
    def backend(self):
        """The backend in use: "tcc" or "cc" (cc falls back to tcc when no compiler works)."""
        code = self._lib.fd_ctx_backend(self._handle())
        return {v: k for k, v in _BACKENDS.items()}.get(code, code)

    @property
    def max_isa(self):
        """The best ISA the context may use (of the highest rank): "c", "avx2", "avx512", "avx512vnni" or "avx512bf16"."""
        return _ISA_DIGITS[self._lib.fd_ctx_max_isa(self._handle())]

    def plan(self, batch, n_q_heads, n_kv_heads, head_dim, kv_len, q_dtype="f32", kv_dtype="f32",
             out_dtype="f32", mask_mode="causal", layout="bhsd", page_size=0, opts=None, **options):
        """Validate a shape, plan it and compile its kernels; options chunk, group_tile, splits,
        threads, isa ("c"|"avx2"|"avx512"|"avx512vnni"|"avx512bf16"), planes (MSD int8 scores: 2 or 3, -1
        off) and precision (fast precision: 1, -1 off) force planner choices, as keywords or in opts; the
        other fd_shape fields (pool_pages, q_len, window, ...) are keywords too; features takes
        the FD_* bits, a name or a list of names (features=["alibi", "sink_logits"], see FEATURES)."""
        extra = {name: options.pop(name) for name in list(options) if name in _EXTRA_SHAPE_FIELDS}
        shape = L.Shape(batch=_c_int("batch", batch), n_q_heads=_c_int("n_q_heads", n_q_heads),
                        n_kv_heads=_c_int("n_kv_heads", n_kv_heads), head_dim=_c_int("head_dim", head_dim),
                        kv_len=_c_int("kv_len", kv_len, _INT64),
                        q_dtype=_dtypes.parse("q_dtype", q_dtype, InvalidArgumentError),
                        kv_dtype=_dtypes.parse("kv_dtype", kv_dtype, InvalidArgumentError),
                        out_dtype=_dtypes.parse("out_dtype", out_dtype, InvalidArgumentError),
                        mask_mode=_choice("mask_mode", mask_mode, _MASK_MODES),
                        layout=_choice("layout", layout, _LAYOUTS), page_size=_c_int("page_size", page_size))
        for name, value in extra.items():
            kind = _EXTRA_SHAPE_FIELDS[name]
            if name == "features":
                value = _features(value)
            setattr(shape, name, float(value) if kind == "float" else _c_int(name, value, _INT64 if kind == "i64" else _INT32))
        popts = _plan_opts(opts, options)
        plan = ctypes.c_void_p()
        with self._lock:
            rc = self._lib.fd_plan_create_opts(self._handle(), ctypes.byref(shape), ctypes.byref(popts),
                                               ctypes.byref(plan))
            if rc:
                raise _failure(self._lib, rc, self._ptr)
        return Plan(self, plan.value, shape)

    def _free(self, ptr):
        self._lib.fd_destroy(ptr)


# fd_plan_opts from an opts dict and keywords; TypeError for unknown or repeated names.
def _plan_opts(opts, options):
    merged = dict(opts or {})
    for name in options:
        if name in merged:
            raise TypeError("plan option %r given both in opts and as a keyword" % name)
    merged.update(options)
    unknown = sorted(set(merged) - set(_OPTION_NAMES))
    if unknown:
        raise TypeError("unknown plan option(s) %s (known: %s)" % (", ".join(unknown), ", ".join(_OPTION_NAMES)))
    values = {}
    for name, value in merged.items():
        if name == "isa":
            values[name] = _choice("opts.isa", value, _ISAS)
        else:
            values[name] = _c_int("opts." + name, value)
    return L.PlanOpts(**values)


class Plan(_Handle):
    """A planned shape; run() it every decode step. Made by Context.plan()."""

    def __init__(self, ctx, ptr, shape):
        self._ptr = ptr
        self._lib = ctx._lib
        self._ctx = ctx                 # keeps the context object alive
        self._ctx_ptr = ctx._ptr        # for fd_errmsg, valid while this plan lives
        self._lock = threading.Lock()
        self._shape = shape
        B, Hq, Hkv, D, S = shape.batch, shape.n_q_heads, shape.n_kv_heads, shape.head_dim, shape.kv_len
        Bk = 1 if shape.features & L.FD_SHARED_KV else B      # FD_SHARED_KV: one sequence for every row
        R = _dtypes.row_len(shape.kv_dtype, D)               # q8_0 / q4_0: the row's block bytes
        kv = {L.FD_BHSD: (Bk, Hkv, S, R), L.FD_BSHD: (Bk, S, Hkv, R),
              L.FD_PAGED: (shape.pool_pages, Hkv, shape.page_size, R)}[shape.layout]
        # field: (expected shape, fd_dtype) of every array argument.
        rows = (B, shape.q_len, Hq) if shape.q_len > 1 else (B, Hq)   # query rows: [B, q_len, Hq] for several tokens
        self._arrays = {"q": (rows + (D,), shape.q_dtype), "k": (kv, shape.kv_dtype), "v": (kv, shape.kv_dtype),
                        "mask": (rows + (S,), L.FD_F32), "k_scale": (kv[:-1], L.FD_F32),
                        "v_scale": (kv[:-1], L.FD_F32), "out": (rows + (D,), shape.out_dtype),
                        "lse": (rows, L.FD_F32),
                        "k_new": ((B, max(1, shape.q_len), Hkv, D), shape.kv_dtype),
                        "v_new": ((B, max(1, shape.q_len), Hkv, D), shape.kv_dtype),
                        "alibi_slopes": ((Hq,), L.FD_F32), "sink_logits": ((Hq,), L.FD_F32)}
        if shape.features & L.FD_K_PER_CHANNEL:       # K scales per channel: [B, Hkv, D]
            self._arrays["k_scale"] = ((Bk, Hkv, D), L.FD_F32)

    @property
    def shape(self):
        """The plan's fd_shape as a dict of C values."""
        return {name: getattr(self._shape, name) for name, _ in L.Shape._fields_}

    # The address of an argument array (0 for None) after the shape/dtype checks.
    def _arg(self, field, arr, writable=False):
        if arr is None:
            return None
        return _address(field, arr, *self._arrays[field], writable=writable)

    # cur_pos as a contiguous int32 array of shape (batch,); a scalar means every row.
    def _positions(self, cur_pos):
        if cur_pos is None:
            return None
        B = self._shape.batch
        a = np.asarray(cur_pos)
        if a.ndim == 0:
            a = np.full(B, a)
        if a.dtype.kind not in "iu" or a.shape != (B,):
            raise InvalidArgumentError("cur_pos: expected %d integer(s) (shape (%d,)), got shape %s dtype %s"
                                       % (B, B, a.shape, a.dtype))
        if int(a.min()) < _INT32[0] or int(a.max()) > _INT32[1]:
            raise InvalidArgumentError("cur_pos: values must fit in int32, got %d..%d" % (a.min(), a.max()))
        return np.ascontiguousarray(a, np.int32)

    # The paged layout's block table as a contiguous int32 array [batch, ceil(kv_len / page_size)].
    def _block_table(self, table):
        if table is None:
            return None
        s = self._shape
        rows = 1 if s.features & L.FD_SHARED_KV else s.batch
        want = (rows, -(-s.kv_len // s.page_size)) if s.page_size else None
        a = np.asarray(table)
        if a.dtype.kind not in "iu" or a.shape != want:
            raise InvalidArgumentError("block_table: expected integers of shape %s, got shape %s dtype %s"
                                       % (want, a.shape, a.dtype))
        return np.ascontiguousarray(a, np.int32)

    # FD_BEAMS' beam_src as a contiguous int32 array [batch, kv_len].
    def _beam_src(self, src):
        if src is None:
            return None
        s = self._shape
        a = np.asarray(src)
        if a.dtype.kind not in "iu" or a.shape != (s.batch, s.kv_len):
            raise InvalidArgumentError("beam_src: expected integers of shape %s, got shape %s dtype %s"
                                       % ((s.batch, s.kv_len), a.shape, a.dtype))
        if a.size and (int(a.min()) < _INT32[0] or int(a.max()) > _INT32[1]):
            raise InvalidArgumentError("beam_src: values must fit in int32, got %d..%d" % (a.min(), a.max()))
        return np.ascontiguousarray(a, np.int32)

    # The output arrays: out and lse given (checked) or allocated.
    def _outputs(self, out, lse):
        if out is None:
            out = _dtypes.empty(self._arrays["out"][1], self._arrays["out"][0])
        if lse is True:
            lse = np.empty(self._arrays["lse"][0], np.float32)
        elif lse is False:
            lse = None
        return out, lse

    def run(self, q, k, v, cur_pos=None, out=None, lse=False, mask=None, k_scale=None, v_scale=None,
            scale=None, block_table=None, k_new=None, v_new=None, alibi_slopes=None, sink_logits=None,
            beam_src=None):
        """Attention of q over k/v; returns out, or (out, lse) when lse is True or an array.

        cur_pos: [batch] positions (causal mode; a scalar means every row), mask: [B,Hq,kv_len]
        float32 (mask mode), k_scale/v_scale: float32 per K/V row (int8/fp8), scale: None or 0
        for 1/sqrt(head_dim). out: an array to write (allocated when None). Paged layout: k, v
        (and scales) are pools [pool_pages, n_kv_heads, page_size, ...], block_table the int32
        page of each row's keys [batch, ceil(kv_len / page_size)]. FD_NEW_KV: k_new, v_new
        [batch, q_len, n_kv_heads, head_dim], the query tokens' own K/V. FD_ALIBI: alibi_slopes
        float32 [n_q_heads], score += slope[h] * (key position - query position). FD_SINK_LOGITS:
        sink_logits float32 [n_q_heads], one logit per head joining the softmax denominator (and lse).
        FD_K_PER_CHANNEL: k_scale float32 [batch, n_kv_heads, head_dim], one scale per K channel
        (int8/fp8 K). FD_BEAMS: beam_src int [batch, kv_len], key s of row b read from cache row
        beam_src[b, s]."""
        out, lse_arr = self._outputs(out, lse)
        pos = self._positions(cur_pos)
        table = self._block_table(block_table)
        src = self._beam_src(beam_src)
        args = L.Args(q=self._arg("q", q), k=self._arg("k", k), v=self._arg("v", v),
                      cur_pos=None if pos is None else pos.ctypes.data, mask=self._arg("mask", mask),
                      k_scale=self._arg("k_scale", k_scale), v_scale=self._arg("v_scale", v_scale),
                      block_table=None if table is None else table.ctypes.data,
                      k_new=self._arg("k_new", k_new), v_new=self._arg("v_new", v_new),
                      alibi_slopes=self._arg("alibi_slopes", alibi_slopes),
                      sink_logits=self._arg("sink_logits", sink_logits),
                      beam_src=None if src is None else src.ctypes.data,
                      scale=0.0 if scale is None else float(scale),
                      out=self._arg("out", out, writable=True), lse=self._arg("lse", lse_arr, writable=True))
        with self._lock:
            if self._ptr is None:
                raise DestroyedError("the plan is closed")
            rc = self._lib.fd_run(self._ptr, ctypes.byref(args))   # q, k, v, pos, out ... stay referenced here
            if rc:
                raise _failure(self._lib, rc, self._ctx_ptr)
        return out if lse_arr is None else (out, lse_arr)

    def info(self, kv_len=None):
        """What the plan runs when the longest valid length is kv_len (default: the capacity), as a dict."""
        n = self._shape.kv_len if kv_len is None else _c_int("kv_len", kv_len, _INT64)
        info = L.PlanInfo()
        with self._lock:
            if self._ptr is None:
                raise DestroyedError("the plan is closed")
            rc = self._lib.fd_plan_info_get(self._ptr, n, ctypes.byref(info))
            if rc:
                raise _failure(self._lib, rc, self._ctx_ptr)
        d = {name: getattr(info, name) for name, _ in L.PlanInfo._fields_}
        d["key"], d["split_key"] = info.key.decode(), info.split_key.decode()
        return d

    def _free(self, ptr):
        self._lib.fd_plan_destroy(ptr)
