"""ctypes mirror of runtime/flashdecode.h and the loading of libflashdecode.

Every struct here copies its C declaration field by field, in order; the test
tests/test_python.py compares names, offsets and sizes with the header as
compiled by gcc, so a header change the binding misses fails a test.
"""
import ctypes
import ctypes.util
import os
import threading

from . import _facts

# FD_VERSION of the header this binding mirrors.
FD_VERSION = "0.1.0"

# Return codes (enum in flashdecode.h).
FD_OK = 0
FD_EINVAL = -1
FD_ENOMEM = -2
FD_ECOMPILE = -3
FD_EUNSUPPORTED = -4
FD_ETABLE = -5
FD_EDESTROYED = -6
FD_ESYS = -7

# fd_dtype, fd_mask_mode, fd_layout and the FD_ISA_* choices from gen/facts.lua
# (through the generated _facts.py); fd_backend and FD_ISA_AUTO.
globals().update(_facts.ENUMS)
FD_BACKEND_TCC, FD_BACKEND_CC = 0, 1
FD_ISA_AUTO = 0
FD_PRECISION_DEFAULT, FD_PRECISION_FAST = 0, 1   # fd_config.precision
# Names by value: dtypes and their sizes in bytes, mask modes, layouts, isa digits.
DTYPE_NAMES, DTYPE_SIZE = _facts.DTYPE_NAMES, _facts.DTYPE_SIZE
DTYPE_BLOCK = _facts.DTYPE_BLOCK   # (elements per block, bytes per block) by fd_dtype
MASK_MODE_NAMES, LAYOUT_NAMES, ISA_NAMES = _facts.MASK_MODE_NAMES, _facts.LAYOUT_NAMES, _facts.ISA_NAMES
# fd_shape.features bits by name ("alibi": FD_ALIBI, ...): the ENUMS entries gen/build.lua writes
# after those of the dtypes, mask modes, layouts and ISAs, each named FD_<NAME> after gen/facts.lua's name.
FEATURES = {name[3:].lower(): bit for name, bit in list(_facts.ENUMS.items())[
    len(DTYPE_NAMES) + len(MASK_MODE_NAMES) + len(LAYOUT_NAMES) + len(ISA_NAMES):]}
assert FEATURES and all(b > 0 and b & (b - 1) == 0 for b in FEATURES.values()), "features are not single bits"
# Upper bounds (#define in flashdecode.h; the library refuses values above them).
FD_MAX_THREADS = 1024
FD_MAX_SPLIT_ITEMS = 16384
FD_DETERMINISTIC_SPLIT_KEYS = 4096   # fd_config.deterministic: keys per split

# The integer constants by C name (the test checks each value against the header).
CONSTANTS = {name: value for name, value in globals().items()
             if name.startswith("FD_") and isinstance(value, int)}

_int, _i64, _ptr, _str = ctypes.c_int, ctypes.c_int64, ctypes.c_void_p, ctypes.c_char_p


# struct fd_config: context configuration.
class Config(ctypes.Structure):
    _fields_ = [("threads", _int), ("backend", _int), ("table", _str),
                ("cache_dir", _str), ("isa_limit", _int), ("max_kernels", _int),
                ("check_inputs", _int), ("deterministic", _int), ("precision", _int)]


# struct fd_shape: the problem a plan serves.
class Shape(ctypes.Structure):
    _fields_ = [(name, {"int": _int, "i64": _i64, "float": ctypes.c_float, "unsigned": ctypes.c_uint}[kind])
                for name, kind in _facts.SHAPE_FIELDS]


# struct fd_args: the arrays of one run (every pointer as c_void_p; scale a float).
class Args(ctypes.Structure):
    _fields_ = [("q", _ptr), ("k", _ptr), ("v", _ptr), ("cur_pos", _ptr), ("mask", _ptr),
                ("k_scale", _ptr), ("v_scale", _ptr), ("block_table", _ptr),
                ("scale", ctypes.c_float), ("out", _ptr), ("lse", _ptr),
                ("alibi_slopes", _ptr), ("sink_logits", _ptr), ("k_new", _ptr), ("v_new", _ptr),
                ("beam_src", _ptr)]


# struct fd_plan_opts: forced planner choices (0 = planner's choice).
class PlanOpts(ctypes.Structure):
    _fields_ = [("chunk", _int), ("group_tile", _int), ("splits", _int), ("threads", _int),
                ("isa", _int), ("planes", _int), ("precision", _int)]


# struct fd_plan_info: what a plan runs for a given length.
class PlanInfo(ctypes.Structure):
    _fields_ = [("key", ctypes.c_char * 24), ("split_key", ctypes.c_char * 24),
                ("chunk", _int), ("group_tile", _int), ("splits", _int), ("threads", _int),
                ("isa", _int), ("from_table", _int), ("kernels_compiled", _int),
                ("compile_ms", ctypes.c_double)]


# The C struct name of each mirror (for the layout test).
STRUCTS = {"fd_config": Config, "fd_shape": Shape, "fd_args": Args,
           "fd_plan_opts": PlanOpts, "fd_plan_info": PlanInfo}

_P = ctypes.POINTER
# name: (restype, argtypes) of every function the binding calls.
PROTOTYPES = {
    "fd_create": (_ptr, [_P(Config)]),
    "fd_destroy": (None, [_ptr]),
    "fd_plan_create_opts": (_int, [_ptr, _P(Shape), _P(PlanOpts), _P(_ptr)]),
    "fd_run": (_int, [_ptr, _P(Args)]),
    "fd_plan_destroy": (None, [_ptr]),
    "fd_errmsg": (_str, [_ptr]),
    "fd_plan_info_get": (_int, [_ptr, _i64, _P(PlanInfo)]),
    "fd_ctx_threads": (_int, [_ptr]),
    "fd_ctx_backend": (_int, [_ptr]),
    "fd_ctx_max_isa": (_int, [_ptr]),
    "fd_machine_name": (_str, []),
    "fd_tuned_table_header": (_int, [ctypes.c_char_p, ctypes.c_size_t]),
    "fd_length_bucket": (_i64, [_i64]),
}

BUILD_HINT = ("build it in the source tree with `make lib` (it writes build/libflashdecode.so) "
              "and set FD_LIB=/path/to/build/libflashdecode.so, or install it with `make install`")

_here = os.path.dirname(os.path.abspath(__file__))
_loaded = None
_load_lock = threading.Lock()


# The lib dir `make install` writes into the installed copy of this file (sed replaces
# the at-sign placeholder); still the placeholder in the source tree.
INSTALLED_LIBDIR = "@LIBDIR@"


# The places to look for the library, in order, each (description, path or name):
# $FD_LIB (only it, when set); the source tree's build/; the installed lib dir; the loader.
def candidates():
    env = os.environ.get("FD_LIB")
    if env:
        return [("$FD_LIB", env)]
    places = [("source tree", os.path.normpath(os.path.join(_here, "..", "..", "build", "libflashdecode.so")))]
    if not INSTALLED_LIBDIR.startswith("@"):
        places.append(("installed lib dir", os.path.join(INSTALLED_LIBDIR, "libflashdecode.so.0")))
    found = ctypes.util.find_library("flashdecode")
    if found:
        places.append(("find_library", found))
    return places + [("dynamic loader", "libflashdecode.so.0")]


# Set restype/argtypes of every function the binding uses; OSError if the library lacks one.
def _declare(lib, path):
    for name, (restype, argtypes) in PROTOTYPES.items():
        fn = getattr(lib, name, None)
        if fn is None:
            raise OSError("flashdecode: %s lacks %s (not a libflashdecode %s?); %s" % (path, name, FD_VERSION, BUILD_HINT))
        fn.restype, fn.argtypes = restype, argtypes
    return lib


# The version line of the library's tuned-table header ("library\t0.1.0").
def _library_version(lib):
    buf = ctypes.create_string_buffer(4096)
    if lib.fd_tuned_table_header(buf, len(buf)) < 0:
        return None
    for line in buf.value.decode(errors="replace").splitlines():
        if line.startswith("library\t"):
            return line.split("\t", 1)[1]
    return None


# Open the first loadable candidate; OSError with every attempt and the build hint if none.
def _open():
    tried = []
    for where, path in candidates():
        if os.sep in path and not os.path.exists(path) and where != "$FD_LIB":
            tried.append("%s %s (absent)" % (where, path))
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s %s (%s)" % (where, path, e))
            continue
        return _declare(lib, path), path
    raise OSError("flashdecode: cannot load libflashdecode; tried: %s. To get it, %s"
                  % ("; ".join(tried), BUILD_HINT))


# The loaded library (opened once): (CDLL, path, version).
def load():
    global _loaded
    with _load_lock:
        if _loaded is None:
            lib, path = _open()
            version = _library_version(lib)
            if version != FD_VERSION:
                raise OSError("flashdecode: %s is libflashdecode %s but this package mirrors %s; "
                              "use the library built with this package (%s)" % (path, version, FD_VERSION, BUILD_HINT))
            _loaded = (lib, path, version)
        return _loaded


# The loaded CDLL.
def lib():
    return load()[0]
