"""gpumem: GPU memory from gpumemd, for Python.

    import gpumem
    with gpumem.connect() as c:              # $GPUMEMD_SOCKET, or the default socket
        b = c.malloc(1 << 20, gpus="0,1")    # placement as gpumemctl takes it
        b.view()[:5] = b"hello"              # sim backend: host memory, as a memoryview
        print(b.device, c.stats()["daemon"]["devices"][b.device]["used_bytes"])
        b.free()

A thin layer over libgpumem.so.1 (the C ABI, client/lib/include/gpumem.h) through ctypes,
so allocations go through the library's in-process caching pool: a small
block costs two C calls, no RPC. What it guarantees, besides what gpumem.h
does:

  * Errors are exceptions carrying the library's code and message
    (gpumem.Error and one subclass per code: ResourceExhausted is also a
    MemoryError, InvalidArgument a ValueError, ...). Bad input never
    crashes: a pointer this client did not hand out is ForeignPointer, a
    block freed twice DoubleFree, any call on a closed client Closed.
  * A view (Block.view(), Block.numpy()) keeps its block's memory in place:
    freeing the block, or closing the client, while a view (or a slice of
    it, or an array made from it) is alive only marks it; the memory goes
    back when the last view is gone. So a view never points at memory that
    was given back. Views exist on the sim backend only (its memory is host
    memory); on a GPU, blocks are device pointers (b.ptr) for CUDA code.
  * A Block that is garbage collected without free() is freed then; closing
    the client frees every block it still holds.
  * Thread-safe as the C ABI is; close() must not race with other calls.

gpumem.torch installs the package's library as PyTorch's allocator and makes
torch.cuda.mem_get_info() report the tenant's budget.
"""
import ctypes
import json
import os
import threading
import weakref

from . import _lib
from ._version import __version__

__all__ = [
    "connect", "Client", "Block", "Error", "InvalidArgument", "NotFound",
    "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Internal",
    "Unavailable", "ForeignPointer", "DoubleFree", "Lost", "Closed", "Forked",
    "library_path", "__version__",
]


class Error(Exception):
    """A gpumem failure: `code` (client/lib/include/gpumem.h), `name` and the message."""

    def __init__(self, code, name, message):
        super().__init__("%s: %s" % (name, message))
        self.code = code
        self.name = name
        self.message = message


class InvalidArgument(Error, ValueError):
    pass


class NotFound(Error, LookupError):
    pass


class PermissionDenied(Error, PermissionError):
    pass


class ResourceExhausted(Error, MemoryError):
    pass


class FailedPrecondition(Error):
    pass


class Internal(Error):
    pass


class Unavailable(Error, ConnectionError):
    pass


class ForeignPointer(Error, ValueError):
    pass


class DoubleFree(Error, ValueError):
    pass


class Lost(Error):
    pass


class Closed(Error):
    pass


class Forked(Error):
    pass


_BY_CODE = {3: InvalidArgument, 5: NotFound, 7: PermissionDenied, 8: ResourceExhausted,
            9: FailedPrecondition, 13: Internal, 14: Unavailable, 101: ForeignPointer,
            102: DoubleFree, 103: Lost, 104: Closed, 105: Forked}
_NAMES = {3: "GPUMEM_E_INVALID_ARGUMENT", 5: "GPUMEM_E_NOT_FOUND",
          7: "GPUMEM_E_PERMISSION_DENIED", 8: "GPUMEM_E_RESOURCE_EXHAUSTED",
          9: "GPUMEM_E_FAILED_PRECONDITION", 13: "GPUMEM_E_INTERNAL",
          14: "GPUMEM_E_UNAVAILABLE", 101: "GPUMEM_E_FOREIGN_POINTER",
          102: "GPUMEM_E_DOUBLE_FREE", 103: "GPUMEM_E_LOST", 104: "GPUMEM_E_CLOSED",
          105: "GPUMEM_E_FORKED"}


def _make_error(code, message):
    return _BY_CODE.get(code, Error)(code, _NAMES.get(code, "GPUMEM_E_OTHER"), message)


def _last_error(lib):
    code = lib.gpumem_last_error()
    msg = lib.gpumem_last_error_message()
    return _make_error(code, msg.decode("utf-8", "replace") if msg else "")


# Fields of 64-bit integers in gpumem.v1, which proto3's JSON writes as
# strings; the dicts this package returns have them as ints.
_INT64_FIELDS = frozenset("""
alignment allocation_count allocation_id allocations allocations_freed bytes bytes_wanted
current_bytes driver_free_bytes driver_total_bytes free_bytes freed_bytes frees
granularity_bytes id in_use_bytes largest_free_block_bytes largest_free_bytes leased_bytes
live_blocks max_allocations offset peak_bytes pooled_bytes refused_capacity
refused_fragmentation refused_other refused_quota request_id retained_bytes seq session
session_id since_unix_ns size_bytes slab_id slab_size_bytes time_unix_ns total_bytes
until_unix_ns used_bytes waiting_requests
""".split())


def _ints(obj):
    if isinstance(obj, dict):
        return {k: (int(v) if k in _INT64_FIELDS and isinstance(v, str) else _ints(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [_ints(v) for v in obj]
    return obj


def library_path():
    """The absolute path of the libgpumem.so.1 this package uses."""
    return _lib.path()


def connect(socket=None):
    """A Client of the daemon at `socket` ($GPUMEMD_SOCKET, then
    /run/gpumemd/gpumemd.sock). Unavailable when no daemon answers."""
    return Client(socket)


_ALIVE, _FREED, _FREE_PENDING = 0, 1, 2
_c_void_p = ctypes.c_void_p


class Block:
    """A block of the daemon's memory: `ptr` (int address: host memory on the
    sim backend, a device pointer on a GPU), `size` (bytes asked for) and
    `device` (the daemon's device index)."""

    # _live: a one-item list while the block is not freed; free() pops it,
    # which is atomic, so of two threads freeing one block exactly one does.
    __slots__ = ("ptr", "size", "_client", "_live", "_state", "_pins", "_device",
                 "__weakref__")

    def __init__(self, client, ptr, size, device=None):
        self.ptr = ptr
        self.size = size
        self._client = client
        self._live = [True]
        self._state = _ALIVE
        self._pins = 0
        self._device = device

    @property
    def device(self):
        if self._device is None:
            self._device = self._client.device_of(self)
        return self._device

    @property
    def freed(self):
        """True once free() was called (the memory may still wait for views)."""
        return not self._live

    def free(self):
        """Returns the block (see the module's note on views)."""
        self._client._free_block(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._live:
            self.free()

    def __del__(self):
        if self._live:
            try:
                self._client._free_block(self)
            except Exception:  # noqa: BLE001 - at collection nobody can be told
                pass

    def __int__(self):
        return self.ptr

    def __repr__(self):
        state = {_ALIVE: "", _FREED: " freed", _FREE_PENDING: " freed (views alive)"}
        return "<gpumem.Block 0x%x size=%d%s>" % (self.ptr, self.size, state[self._state])

    def view(self):
        """The block as a writable memoryview of bytes (sim backend only).

        The memory stays in place while the view, or anything made from it,
        is alive, even after free()."""
        return memoryview(self._pinned_array()).cast("B")

    def numpy(self, dtype="uint8", shape=None):
        """The block as a numpy array over its memory (needs numpy; sim
        backend only); kept in place like a view."""
        import numpy  # noqa: WPS433 - optional dependency
        dt = numpy.dtype(dtype)
        arr = numpy.frombuffer(self._pinned_array(), dtype=dt, count=self.size // dt.itemsize)
        return arr if shape is None else arr.reshape(shape)

    def _pinned_array(self):
        c = self._client
        if c._closing:
            raise Closed(104, "GPUMEM_E_CLOSED", "this client was closed")
        if not c._host_memory():
            raise FailedPrecondition(
                9, "GPUMEM_E_FAILED_PRECONDITION",
                "block 0x%x is device memory (%s backend): it has no host view; hand "
                "b.ptr to CUDA code instead" % (self.ptr, c._backend))
        # Pinned first, then checked: a free() racing this either sees the
        # pin (and leaves the memory to the view) or has taken `_live`.
        with c._pin_lock:
            self._pins += 1
            c._pinned += 1
        if not self._live or c._closing:
            c._unpin(self)
            if not self._live:
                raise DoubleFree(102, "GPUMEM_E_DOUBLE_FREE",
                                 "block 0x%x was freed: no new view of it" % self.ptr)
            raise Closed(104, "GPUMEM_E_CLOSED", "this client was closed")
        arr = (ctypes.c_ubyte * self.size).from_address(self.ptr)
        weakref.finalize(arr, c._unpin, self)
        return arr


class Client:
    """A connection to gpumemd with its own caching pool (gpumem_connect)."""

    def __init__(self, socket=None):
        lib = _lib.load()
        self._lib = lib
        h = lib.gpumem_connect(os.fsencode(socket) if socket is not None else None)
        if not h:
            raise _last_error(lib)
        self._h = h            # None once closed (the C handle is answered CLOSED)
        self._real_h = h
        self._closing = False  # close() was called
        self._pin_lock = threading.Lock()
        self._pinned = 0       # live views over this client's blocks
        self._backend = None
        self._malloc = lib.gpumem_malloc
        self._free = lib.gpumem_free

    # --- allocation -----------------------------------------------------

    def malloc(self, size, gpus=None, exclude=None, fallback=None, policy=None):
        """A Block of `size` bytes. Placement as gpumemctl takes it: gpus and
        exclude are device lists ("0,1", "all", "GPU-<uuid>", or a list of
        those), fallback a list of further sets tried in order, policy
        "least-loaded", "pack" or "near:<dev>". Without placement:
        $GPUMEM_PLACEMENT, else any device."""
        out = _c_void_p()
        try:
            if gpus is None and exclude is None and fallback is None and policy is None:
                rc = self._malloc(self._h, size, None, out)  # ctypes passes `out` by reference
            else:
                rc = self._lib.gpumem_malloc_str(
                    self._h, size, _placement_text(gpus, exclude, fallback, policy), out)
        except ctypes.ArgumentError:
            raise TypeError("size must be an int, not %r" % (size,)) from None
        if rc:
            raise self._size_error(size) or self._error()
        return Block(self, out.value, size)

    def malloc_sharded(self, total, shards, gpus=None, exclude=None, fallback=None,
                       policy=None):
        """`shards` Blocks on distinct devices, splitting `total` evenly (the
        last one takes the remainder); all or nothing."""
        if not isinstance(shards, int) or shards <= 0 or shards > 1024:
            raise InvalidArgument(3, "GPUMEM_E_INVALID_ARGUMENT",
                                  "shards must be an int in 1..1024, not %r" % (shards,))
        ptrs = (ctypes.c_void_p * shards)()
        sizes = (ctypes.c_size_t * shards)()
        devices = (ctypes.c_int * shards)()
        where = None
        keep = []
        if not (gpus is None and exclude is None and fallback is None and policy is None):
            where = _placement_struct(gpus, exclude, fallback, policy, keep)
        try:
            rc = self._lib.gpumem_malloc_sharded(self._h, total, shards,
                                                 ctypes.byref(where) if where else None,
                                                 ptrs, sizes, devices)
        except ctypes.ArgumentError:
            raise TypeError("total must be an int, not %r" % (total,)) from None
        if rc:
            raise self._size_error(total) or self._error()
        return [Block(self, ptrs[i], sizes[i], devices[i]) for i in range(shards)]

    def free(self, block):
        """Returns a Block, or an address this client handed out (an int)."""
        if isinstance(block, Block):
            if block._client is not self:
                raise ForeignPointer(101, "GPUMEM_E_FOREIGN_POINTER",
                                     "%r belongs to another client" % (block,))
            self._free_block(block)
            return
        ptr = _address(block)
        if self._free(self._h, ptr):
            raise self._error()

    def _free_block(self, block):
        try:
            block._live.pop()
        except IndexError:
            raise DoubleFree(102, "GPUMEM_E_DOUBLE_FREE",
                             "block 0x%x was freed already" % block.ptr) from None
        if block._pins:
            with self._pin_lock:
                if block._pins > 0:  # a view is alive: the last one frees it
                    block._state = _FREE_PENDING
                    return
        block._state = _FREED
        if self._free(self._h, block.ptr):
            raise self._error()

    def _unpin(self, block):
        with self._pin_lock:
            block._pins -= 1
            self._pinned -= 1
            free_now = block._pins == 0 and block._state == _FREE_PENDING
            if free_now:
                block._state = _FREED
            close_now = self._pinned == 0 and self._closing and self._real_h is not None
        if free_now:
            self._lib.gpumem_free(self._real_h, block.ptr)  # at collection: nobody to tell
        if close_now:
            self._close_now()

    def export_dmabuf(self, block, size=None):
        """(fd, offset): the block's memory as a dma-buf for a NIC
        (ibv_reg_dmabuf_mr); the fd is the caller's to close. FailedPrecondition
        for host memory (the sim backend)."""
        fd = ctypes.c_int(-1)
        offset = ctypes.c_size_t()
        n = size if size is not None else getattr(block, "size", 0)
        if self._lib.gpumem_export_dmabuf(self._h, _address(block), n, ctypes.byref(fd),
                                          ctypes.byref(offset)):
            raise self._error()
        return fd.value, offset.value

    def device_of(self, block):
        """The daemon's device index of a live block (or address)."""
        d = self._lib.gpumem_device_of(self._h, _address(block))
        if d < 0:
            raise self._error()
        return d

    def device_count(self):
        n = self._lib.gpumem_device_count(self._h)
        if n < 0:
            raise self._error()
        return n

    def visible_device_count(self):
        """How many of the daemon's devices this process can see: where a
        block with no placement may land."""
        n = self._lib.gpumem_visible_device_count(self._h)
        if n < 0:
            raise self._error()
        return n

    def trim(self):
        """Gives every empty lease back to the daemon now; bytes given back."""
        n = ctypes.c_size_t()
        if self._lib.gpumem_trim(self._h, ctypes.byref(n)):
            raise self._error()
        return n.value

    def mem_get_info(self, device):
        """(free, total) bytes the caller's tenant may still take / may ever
        hold on the daemon's device `device` (gpumem_mem_get_info)."""
        free = ctypes.c_size_t()
        total = ctypes.c_size_t()
        if self._lib.gpumem_mem_get_info(self._h, device, ctypes.byref(free),
                                         ctypes.byref(total)):
            raise self._error()
        return free.value, total.value

    # --- what the daemon says -------------------------------------------

    def stats(self):
        """The library's figures and the daemon's GetStats, as a dict."""
        out = ctypes.c_void_p()
        if self._lib.gpumem_stats_json(self._h, ctypes.byref(out)):
            raise self._error()
        return _ints(json.loads(self._take_string(out)))

    def session(self):
        """This process's session (GetSession): id, pid, uid, gid, tenant."""
        return self._call("GetSession")

    def tenants(self):
        """Tenants the caller may see (GetUsage): quota, current, peak,
        byte-seconds, per device."""
        return self._call("GetUsage").get("tenants", [])

    def ledger(self, tenant=None, since=None, until=None, limit=None, newest=False,
               page_token=None):
        """Ledger events (GetLedger), oldest first; `since`/`until` are Unix
        seconds (float) or None. Returns (events, next_page_token)."""
        req = {}
        if tenant is not None:
            req["tenant"] = str(tenant)
        if since is not None:
            req["since_unix_ns"] = str(int(since * 1e9))
        if until is not None:
            req["until_unix_ns"] = str(int(until * 1e9))
        if limit is not None:
            req["limit"] = int(limit)
        if newest:
            req["newest"] = True
        if page_token:
            req["page_token"] = page_token
        r = self._call("GetLedger", req)
        return r.get("events", []), r.get("next_page_token") or None

    def _call(self, method, request=None):
        out = ctypes.c_void_p()
        body = json.dumps(request).encode() if request else None
        if self._lib.gpumem_call_json(self._h, method.encode(), body, ctypes.byref(out)):
            raise self._error()
        return _ints(json.loads(self._take_string(out)))

    def _take_string(self, p):
        try:
            return ctypes.string_at(p.value).decode("utf-8")
        finally:
            self._lib.gpumem_string_free(p.value)

    def _host_memory(self):
        if self._backend is None:
            self._backend = self.stats()["daemon"].get("backend", "")
        return self._backend == "sim"

    # --- lifetime -------------------------------------------------------

    @property
    def closed(self):
        return self._closing

    def close(self):
        """Frees everything the client holds and disconnects. While views of
        its blocks are alive, the client is closed for calls at once and
        gives its memory back when the last view is gone. Closing twice is
        Closed."""
        with self._pin_lock:
            if self._closing:
                raise Closed(104, "GPUMEM_E_CLOSED", "this client was closed already")
            self._closing = True
            self._h = None  # every later call is answered Closed (see _error)
            now = self._pinned == 0
        if now:
            self._close_now()

    def _close_now(self):
        h, self._real_h = self._real_h, None
        if h is not None and self._lib.gpumem_close(h):
            raise _last_error(self._lib)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self._closing:
            self.close()

    def __del__(self):
        try:
            if not self._closing:
                self.close()
        except Exception:  # noqa: BLE001 - at collection nobody can be told
            pass

    def _size_error(self, size):
        # ctypes turns a negative size into a huge size_t: say what it was.
        if isinstance(size, int) and size < 0 and not self._closing:
            return InvalidArgument(3, "GPUMEM_E_INVALID_ARGUMENT",
                                   "size must be >= 0, not %d" % size)
        return None

    def _error(self):
        if self._closing:
            return Closed(104, "GPUMEM_E_CLOSED", "this client was closed")
        return _last_error(self._lib)


def _address(p):
    if isinstance(p, Block):
        return p.ptr
    if isinstance(p, int) and not isinstance(p, bool):
        if p < 0 or p >= 1 << 64:
            raise ForeignPointer(101, "GPUMEM_E_FOREIGN_POINTER",
                                 "%#x is not an address" % p)
        return p
    if isinstance(p, ctypes.c_void_p):
        return p.value or 0
    raise TypeError("want a gpumem.Block or an int address, not %s" % type(p).__name__)


def _device_list(v, what):
    if v is None:
        return None
    if isinstance(v, (int, str)) and not isinstance(v, bool):
        v = [v]
    items = []
    for x in v:
        if isinstance(x, bool) or not isinstance(x, (int, str)):
            raise InvalidArgument(3, "GPUMEM_E_INVALID_ARGUMENT",
                                  "%s: %r is not a device (an index or a GPU- UUID)" % (what, x))
        x = str(x).strip()
        if not x or any(ch.isspace() for ch in x):
            raise InvalidArgument(3, "GPUMEM_E_INVALID_ARGUMENT",
                                  "%s: %r is not a device list" % (what, x))
        items.append(x)
    return ",".join(items)


def _placement_text(gpus, exclude, fallback, policy):
    parts = []
    g = _device_list(gpus, "gpus")
    if g is not None:
        parts.append("--gpus=" + g)
    e = _device_list(exclude, "exclude")
    if e is not None:
        parts.append("--exclude=" + e)
    if fallback is not None:
        if isinstance(fallback, (str, int)):
            fallback = [fallback]
        for f in fallback:
            parts.append("--fallback=" + _device_list(f, "fallback"))
    if policy is not None:
        if not isinstance(policy, str) or not policy or any(ch.isspace() for ch in policy):
            raise InvalidArgument(3, "GPUMEM_E_INVALID_ARGUMENT",
                                  "policy: %r is not a policy (least-loaded, pack, near:DEV)"
                                  % (policy,))
        parts.append("--policy=" + policy)
    return " ".join(parts).encode()


class _Placement(ctypes.Structure):
    _fields_ = [("gpus", ctypes.c_char_p), ("exclude", ctypes.c_char_p),
                ("fallback", ctypes.POINTER(ctypes.c_char_p)), ("fallback_count", ctypes.c_size_t),
                ("policy", ctypes.c_char_p)]


def _placement_struct(gpus, exclude, fallback, policy, keep):
    p = _Placement()
    g = _device_list(gpus, "gpus")
    e = _device_list(exclude, "exclude")
    p.gpus = g.encode() if g is not None else None
    p.exclude = e.encode() if e is not None else None
    if fallback is not None:
        if isinstance(fallback, (str, int)):
            fallback = [fallback]
        sets = [_device_list(f, "fallback").encode() for f in fallback]
        arr = (ctypes.c_char_p * len(sets))(*sets)
        keep.append(arr)
        p.fallback = ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p))
        p.fallback_count = len(sets)
    if policy is not None:
        if not isinstance(policy, str):
            raise InvalidArgument(3, "GPUMEM_E_INVALID_ARGUMENT", "policy must be a string")
        p.policy = policy.encode()
    return p
