"""libgpumem.so.1 through ctypes: where it is found, and its C signatures.

The library is $GPUMEM_LIBRARY when that is set, else the one next to this
file (tools/install-python puts it there), so the package always knows the
path of the very library it uses (gpumem.torch hands it to PyTorch). It is
loaded on first use, and a missing library is an ImportError saying where it
was looked for and how to install it.
"""
import ctypes
import os
import threading

_HERE = os.path.dirname(os.path.abspath(__file__))
_lock = threading.Lock()
_lib = None
_path = None


def candidates():
    """The paths tried, in order."""
    env = os.environ.get("GPUMEM_LIBRARY")
    if env:
        return [env]  # asked for by name: that one or none
    return [os.path.join(_HERE, "libgpumem.so.1")]


def path():
    """The absolute path of the library in use (loading it if needed)."""
    load()
    return _path


def _declare(lib):
    c_int, c_size_t, c_void_p, c_char_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p
    P = ctypes.POINTER
    sigs = {
        "gpumem_connect": (c_void_p, [c_char_p]),
        "gpumem_close": (c_int, [c_void_p]),
        "gpumem_malloc": (c_int, [c_void_p, c_size_t, c_void_p, P(c_void_p)]),
        "gpumem_malloc_str": (c_int, [c_void_p, c_size_t, c_char_p, P(c_void_p)]),
        "gpumem_malloc_sharded": (c_int, [c_void_p, c_size_t, ctypes.c_uint, c_void_p,
                                          P(c_void_p), P(c_size_t), P(c_int)]),
        "gpumem_free": (c_int, [c_void_p, c_void_p]),
        "gpumem_device_count": (c_int, [c_void_p]),
        "gpumem_visible_device_count": (c_int, [c_void_p]),
        "gpumem_device_of": (c_int, [c_void_p, c_void_p]),
        "gpumem_export_dmabuf": (c_int, [c_void_p, c_void_p, c_size_t, P(c_int), P(c_size_t)]),
        "gpumem_trim": (c_int, [c_void_p, P(c_size_t)]),
        "gpumem_stats_json": (c_int, [c_void_p, P(c_void_p)]),
        "gpumem_call_json": (c_int, [c_void_p, c_char_p, c_char_p, P(c_void_p)]),
        "gpumem_mem_get_info": (c_int, [c_void_p, c_int, P(c_size_t), P(c_size_t)]),
        "gpumem_torch_mem_get_info": (c_int, [c_int, P(c_size_t), P(c_size_t)]),
        "gpumem_torch_memory_stats": (c_int, [c_int, c_void_p]),
        "gpumem_torch_reset_peak_memory_stats": (c_int, [c_int]),
        "gpumem_torch_empty_cache": (c_int, []),
        "gpumem_torch_last_refusal": (c_char_p, []),
        "gpumem_torch_record_stream": (c_int, [c_void_p, c_void_p]),
        "gpumem_string_free": (None, [c_void_p]),
        "gpumem_last_error": (c_int, []),
        "gpumem_last_error_message": (c_char_p, []),
        "gpumem_status_name": (c_char_p, [c_int]),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args


def load():
    """The loaded library (ctypes.CDLL)."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for p in candidates():
            if not os.path.exists(p):
                tried.append("%s (missing)" % p)
                continue
            try:
                lib = ctypes.CDLL(p)
            except OSError as e:
                tried.append("%s (%s)" % (p, e))
                continue
            try:
                _declare(lib)
            except AttributeError as e:
                tried.append("%s (not this version of libgpumem: %s)" % (p, e))
                continue
            _path = os.path.abspath(p)
            _lib = lib
            return _lib
        raise ImportError(
            "gpumem: libgpumem.so.1 could not be loaded; tried: %s. Install the package "
            "with tools/install-python from the gpumemd repository, or point "
            "GPUMEM_LIBRARY at a libgpumem.so.1." % "; ".join(tried))
