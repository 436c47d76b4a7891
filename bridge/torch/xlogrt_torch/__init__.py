# SPDX-License-Identifier: Apache-2.0
"""xlogrt as PyTorch's CUDA allocator.

    python3 -m pip install --no-build-isolation ./bridge/torch
    python3 -c 'import xlogrt_torch; xlogrt_torch.install()'   # before the first CUDA tensor

After install(), every CUDA tensor of the process comes from xlogrt's per-device
DeviceRuntime<DefaultStack>. torch.cuda.empty_cache() and
torch.cuda.set_per_process_memory_fraction() reach it; torch.cuda.memory_stats() does not
(PyTorch's pluggable allocator has no hook for it): read this module's memory_stats(),
memory_allocated(), memory_reserved(), ..., which keep torch's names and keys.

Configuration, read from the environment when a device's runtime is built (its first
allocation):

| variable | value | default |
|---|---|---|
| XLOGRT_BUDGET_BYTES | bytes per device (`512M`, `40G`, `1000000`): an allocation beyond it raises torch.OutOfMemoryError naming the budget; set_per_process_memory_fraction sets it later | no budget |
| XLOGRT_CACHE | `0` turns the caching layer off (every block from the base); `nvtx`; `KEY=SIZE` items for its sizes (README) | on |
| XLOGRT_BACKEND | `vmm`: the virtual memory base (pages mapped on demand, given back by empty_cache); `pool`: the device's memory pool | `auto`: vmm where the device has virtual memory management |
| XLOGRT_LOG_FILE | a path: a CSV line for every allocation and free (tag 1: torch's) | no log |
| XLOGRT_LIBCUDA | the driver library to load | libcuda.so.1 |

install() loads libxlogrt_torch (the allocator's C functions) and libxlogrt_torch_hooks
(built against the torch of the build), which wires Tensor.record_stream to xlogrt's
cross-stream tracking, turns a refused allocation into torch.OutOfMemoryError and sets
the empty-cache and memory-fraction hooks. Both are loaded privately (RTLD_LOCAL): they
export their C functions alone, so no library loaded later binds to their code.

One runtime for every framework: xlogrt_cupy and xlogrt_numba (the same package) load the
same libxlogrt_torch.so through shared_library(), so PyTorch, CuPy and Numba in one process
allocate from one DeviceRuntime per device: one budget, one cache, one log, one
Statistics, their allocations told apart by tag (TORCH_TAG, CUPY_TAG, NUMBA_TAG;
tag_stats()). The library keeps its name, libxlogrt_torch, for what torch and existing
callers already name; nothing in it depends on torch. Every module of the process must
load it from one path (the installed package, or one build directory): a second path
would be a second copy with runtimes of its own, so shared_library() refuses it.
"""
import ctypes
import os

__all__ = ["__version__", "install", "installed", "memory_stats", "memory_allocated", "max_memory_allocated",
           "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats", "empty_cache",
           "set_per_process_memory_fraction", "stats", "tag_stats", "mem_get_info", "record_stream", "reap",
           "flush_log", "last_error", "library_paths", "shared_library", "TORCH_TAG", "CUPY_TAG", "NUMBA_TAG"]

# The tags of each framework's allocations (xlogrt_torch.h's XLOGRT_TAG_*), in Statistics
# (tag_stats) and in the XLOGRT_LOG_FILE log.
TORCH_TAG, CUPY_TAG, NUMBA_TAG = 1, 2, 3

_HERE = os.path.dirname(os.path.abspath(__file__))


def _read_version():
    try:
        from ._build_info import VERSION  # written by setup.py into the installed package
        return VERSION
    except ImportError:  # the source tree: meson.build's project version
        import re
        try:
            with open(os.path.join(_HERE, "..", "..", "..", "meson.build")) as f:
                m = re.search(r"version:\s*'([^']+)'", f.read())
            return m.group(1) if m else "unknown"
        except OSError:
            return "unknown"


__version__ = _read_version()


class _Stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "current_bytes", "peak_bytes", "total_bytes", "freed_bytes", "current_count", "allocations", "frees",
        "failed", "bytes_outstanding", "cached_bytes", "pool_reserved", "pool_reserved_peak", "pool_used",
        "device_allocs", "alloc_retries", "budget_bytes", "budget_in_use", "graph_pool_bytes",
        "graph_pool_live_bytes", "stream_ids", "streams_recycled", "small_pool_reserved",
        "small_pool_reserved_peak")]


_lib = None        # the loaded libxlogrt_torch, whichever framework loaded it first
_lib_path = None   # the path it was loaded from
_installed = False  # install() (torch) has run
_hooks = None


def library_paths(build_dir=None):
    """The bridge's two libraries: in the installed package (build_dir None), else in a
    Meson build directory (its bridge/torch)."""
    d = _HERE if build_dir is None else build_dir
    if build_dir is not None and os.path.isdir(os.path.join(d, "bridge", "torch")):
        d = os.path.join(d, "bridge", "torch")
    return os.path.join(d, "libxlogrt_torch.so"), os.path.join(d, "libxlogrt_torch_hooks.so")


def _load(lib_path):
    lib = ctypes.CDLL(lib_path)  # RTLD_LOCAL: its symbols stay its own
    lib.xlogrt_torch_get_stats.argtypes = [ctypes.c_int, ctypes.POINTER(_Stats)]
    lib.xlogrt_torch_last_error.restype = ctypes.c_char_p
    lib.xlogrt_torch_version.restype = ctypes.c_char_p
    lib.xlogrt_torch_set_memory_fraction.argtypes = [ctypes.c_double, ctypes.c_int]
    # What xlogrt_cupy and xlogrt_numba call (ctypes releases the GIL around each call).
    lib.xlogrt_torch_malloc_tagged.restype = ctypes.c_void_p
    lib.xlogrt_torch_malloc_tagged.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32]
    lib.xlogrt_torch_free.restype = None
    lib.xlogrt_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
    lib.xlogrt_torch_record_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.xlogrt_torch_get_tag_stats.argtypes = [ctypes.c_int, ctypes.c_uint32, ctypes.POINTER(_Stats)]
    lib.xlogrt_torch_mem_get_info.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_uint64),
                                              ctypes.POINTER(ctypes.c_uint64)]
    return lib


def shared_library(build_dir=None):
    """The process's libxlogrt_torch, loaded on the first call (from the installed package,
    or from a Meson build directory): the one every framework module allocates through.
    build_dir None takes the copy loaded already, if any. Raises RuntimeError when a
    build_dir names another copy than the one loaded (a second copy would have runtimes,
    budgets and caches of its own), FileNotFoundError when it is missing."""
    global _lib, _lib_path
    if _lib is not None and build_dir is None:
        return _lib
    lib_path = os.path.realpath(library_paths(build_dir)[0])
    if _lib is not None:
        if _lib_path is not None and lib_path != _lib_path:
            raise RuntimeError(f"xlogrt: libxlogrt_torch is already loaded from {_lib_path}; loading {lib_path} "
                               "too would give this process a second runtime: load every framework's bridge "
                               "from one place")
        return _lib
    if not os.path.exists(lib_path):
        where = "the installed package" if build_dir is None else build_dir
        raise FileNotFoundError(f"xlogrt: {lib_path} is missing from {where} "
                                "(pip install ./bridge/torch, or a Meson build with -Dtorch_bridge=enabled)")
    _lib, _lib_path = _load(lib_path), lib_path
    return _lib


def install(build_dir=None, hooks=True, record_stream=True):
    """Makes xlogrt the CUDA allocator of this process. Call before any CUDA allocation.

    build_dir: a Meson build directory to load the libraries from (None: the installed
    package's). hooks=False: the plain pluggable allocator only (no record_stream, NULL on
    failure, no empty_cache or memory-fraction hooks). record_stream=False: the hooks
    without the record_stream hook (for the test that shows what goes wrong without it)."""
    global _installed, _hooks
    import torch
    if _installed:
        raise RuntimeError("xlogrt_torch.install: already installed in this process")
    lib_path, hooks_path = library_paths(build_dir)
    where = "the installed package" if build_dir is None else build_dir
    if not os.path.exists(lib_path):
        raise FileNotFoundError(f"xlogrt_torch.install: {lib_path} is missing from {where} "
                                "(pip install ./bridge/torch, or a Meson build with -Dtorch_bridge=enabled)")
    if hooks and not os.path.exists(hooks_path):
        raise FileNotFoundError(f"xlogrt_torch.install: {hooks_path} is missing: torch did not import where the "
                                "bridge was built (rebuild where `python3 -c 'import torch'` works), or pass hooks=False")
    shared_library(build_dir)  # the copy CuPy and Numba use too (ctypes and torch dlopen the same file)
    lib_path = _lib_path or lib_path
    alloc = torch.cuda.memory.CUDAPluggableAllocator(lib_path, "xlogrt_torch_malloc", "xlogrt_torch_free")
    torch.cuda.memory.change_current_allocator(alloc)
    if hooks:
        # Its DT_NEEDED libxlogrt_torch.so is the copy loaded above (found by its rpath).
        h = ctypes.CDLL(hooks_path)
        if h.xlogrt_torch_install_hooks(ctypes.c_int(1 if record_stream else 0)) != 0:
            raise RuntimeError("xlogrt_torch.install: the current CUDA allocator is not the pluggable one")
        _hooks = h
    _installed = True
    return alloc


def installed():
    """Whether install() has run in this process."""
    return _installed


def _library():
    if _lib is None:
        raise RuntimeError("xlogrt_torch: no framework allocates through xlogrt in this process yet: call "
                           "xlogrt_torch.install(), xlogrt_cupy.install() or xlogrt_numba.install() first")
    return _lib


def _check(rc, what):
    if rc != 0:
        raise RuntimeError(f"xlogrt_torch.{what}: {last_error()}")


def _device_index(device):
    if device is None:
        import torch
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    index = getattr(device, "index", None)  # a torch.device
    if index is None:
        if getattr(device, "type", None) == "cuda":
            import torch
            return torch.cuda.current_device()
        raise ValueError(f"xlogrt_torch: {device!r} is not a CUDA device")
    return index


def stats(device=None):
    """The device's raw figures (xlogrt_torch.h's xlogrt_torch_stats) as a dict;
    budget_bytes is None without a budget."""
    s = _Stats()
    _check(_library().xlogrt_torch_get_stats(_device_index(device), ctypes.byref(s)), "stats")
    d = {name: getattr(s, name) for name, _ in _Stats._fields_}
    if d["budget_bytes"] == 2**64 - 1:
        d["budget_bytes"] = None
    return d


def tag_stats(tag, device=None):
    """stats() with current_bytes .. failed those of the allocations tagged `tag` alone
    (TORCH_TAG, CUPY_TAG, NUMBA_TAG, or another tag up to 63); the other keys are the
    device's, as stats() has them."""
    s = _Stats()
    _check(_library().xlogrt_torch_get_tag_stats(_device_index(device), int(tag), ctypes.byref(s)), "tag_stats")
    d = {name: getattr(s, name) for name, _ in _Stats._fields_}
    if d["budget_bytes"] == 2**64 - 1:
        d["budget_bytes"] = None
    return d


def mem_get_info(device=None):
    """(free, total) bytes of the device as cuMemGetInfo tells them (the whole device, every
    process). Makes the device's primary context current on the calling thread."""
    free, total = ctypes.c_uint64(), ctypes.c_uint64()
    _check(_library().xlogrt_torch_mem_get_info(_device_index(device), ctypes.byref(free), ctypes.byref(total)),
           "mem_get_info")
    return free.value, total.value


def stream_handle(stream):
    """The driver handle (an int) of a stream of any framework: an int, None (0: the legacy
    default stream), an object with __cuda_stream__ (CUDA's stream protocol), a CuPy stream
    (.ptr), a torch stream (.cuda_stream), a Numba stream (int())."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    for attr in ("ptr", "cuda_stream"):
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    try:
        return int(stream)
    except (TypeError, ValueError):
        raise TypeError(f"xlogrt: {stream!r} is not a stream (an int handle, or a CuPy, torch or Numba stream)") from None


def base_pointer(obj):
    """The address xlogrt handed out for the memory of `obj`: an int (taken as it is), a
    CuPy array or MemoryPointer (its allocation's base, also for a view), a Numba device
    array or MemoryPointer (its owner's), a torch tensor (its storage's), else
    __cuda_array_interface__'s data pointer (which, for a view, is not the base)."""
    if isinstance(obj, int):
        return obj
    data = getattr(obj, "data", None)
    mem = getattr(data, "mem", None) or getattr(obj, "mem", None)  # cupy.ndarray / cupy MemoryPointer
    if mem is not None and hasattr(mem, "ptr"):
        return int(mem.ptr)
    gpu = getattr(obj, "gpu_data", None)  # a Numba device array
    if gpu is None and hasattr(obj, "device_pointer_value"):  # a Numba MemoryPointer
        gpu = obj
    if gpu is not None:
        owner = getattr(gpu, "owner", None)  # a view's owner is the allocation's pointer
        return int((owner if owner is not None else gpu).device_pointer_value or 0)
    if hasattr(obj, "untyped_storage"):  # torch.Tensor
        return int(obj.untyped_storage().data_ptr())
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0])
    raise TypeError(f"xlogrt: {type(obj).__name__} is not a pointer or a device array")


def record_stream(ptr_or_array, stream):
    """The free of the xlogrt block behind `ptr_or_array` (see base_pointer) waits for the
    work enqueued on `stream` up to the free (torch's Tensor.record_stream, for any
    framework's memory). Raises ValueError for memory xlogrt did not hand out."""
    ptr = base_pointer(ptr_or_array)
    if _library().xlogrt_torch_record_stream(ctypes.c_void_p(ptr), ctypes.c_void_p(stream_handle(stream))) != 0:
        raise ValueError(f"xlogrt.record_stream: {last_error()}")


def memory_stats(device=None):
    """torch.cuda.memory_stats()'s keys where xlogrt has the same figure, plus xlogrt's own:

    - allocated_bytes.all.{current,peak,allocated,freed}: bytes tensors asked for (peak:
      an upper bound, since the last reset_peak_memory_stats);
    - allocation.all.{current,allocated,freed}: block counts;
    - reserved_bytes.all.{current,peak}: the device memory pool's reserved memory, as
      torch's cudaMallocAsync backend reports it (peak: since the pool was created);
    - num_alloc_retries: pool failures retried after the cache gave memory back;
    - num_ooms: allocations refused; num_device_alloc: requests that reached the pool;
    - xlogrt.held_bytes (live + cached + frees not yet retired), xlogrt.cached_bytes,
      xlogrt.pool_used_bytes, xlogrt.budget_bytes (None: none), xlogrt.budget_in_use,
      xlogrt.graph_pool_bytes (what CUDA graph pools hold, in held_bytes) and
      xlogrt.graph_pool_live_bytes (of which tensors hold), xlogrt.stream_ids (stream ids
      in use: the pool's own streams and the adopted ones still live) and
      xlogrt.streams_recycled (ids given to a new stream after their stream was gone).

    torch's per-pool splits (small_pool, large_pool), segment and active-block figures
    have no counterpart and are absent."""
    s = stats(device)
    return {
        "allocated_bytes.all.current": s["current_bytes"],
        "allocated_bytes.all.peak": s["peak_bytes"],
        "allocated_bytes.all.allocated": s["total_bytes"],
        "allocated_bytes.all.freed": s["freed_bytes"],
        "allocation.all.current": s["current_count"],
        "allocation.all.allocated": s["allocations"],
        "allocation.all.freed": s["frees"],
        "reserved_bytes.all.current": s["pool_reserved"],
        "reserved_bytes.all.peak": s["pool_reserved_peak"],
        "num_alloc_retries": s["alloc_retries"],
        "num_ooms": s["failed"],
        "num_device_alloc": s["device_allocs"],
        "xlogrt.held_bytes": s["bytes_outstanding"] + s["cached_bytes"],
        "xlogrt.cached_bytes": s["cached_bytes"],
        "xlogrt.pool_used_bytes": s["pool_used"],
        "xlogrt.budget_bytes": s["budget_bytes"],
        "xlogrt.budget_in_use": s["budget_in_use"],
        "xlogrt.graph_pool_bytes": s["graph_pool_bytes"],
        "xlogrt.graph_pool_live_bytes": s["graph_pool_live_bytes"],
        "xlogrt.stream_ids": s["stream_ids"],
        "xlogrt.streams_recycled": s["streams_recycled"],
    }


def memory_allocated(device=None):
    """torch.cuda.memory_allocated: bytes the tensors of the device hold now."""
    return stats(device)["current_bytes"]


def max_memory_allocated(device=None):
    """torch.cuda.max_memory_allocated: the peak of memory_allocated (an upper bound)."""
    return stats(device)["peak_bytes"]


def memory_reserved(device=None):
    """torch.cuda.memory_reserved: the device memory pool's reserved memory."""
    return stats(device)["pool_reserved"]


def max_memory_reserved(device=None):
    """torch.cuda.max_memory_reserved: its highest since the pool was created."""
    return stats(device)["pool_reserved_peak"]


def reset_peak_memory_stats(device=None):
    """torch.cuda.reset_peak_memory_stats: allocated_bytes' peak starts again from now."""
    _check(_library().xlogrt_torch_reset_peak(_device_index(device)), "reset_peak_memory_stats")


def empty_cache():
    """torch.cuda.empty_cache (which reaches this through the reset hook too): cached
    blocks go back to the pool, queued frees are waited for, and the pool's unused memory
    goes back to the device."""
    _check(_library().xlogrt_torch_empty_cache(-1), "empty_cache")


def set_per_process_memory_fraction(fraction, device=None):
    """torch.cuda.set_per_process_memory_fraction: the device's budget becomes `fraction`
    (0 < fraction <= 1) of its memory; beyond it allocations raise torch.OutOfMemoryError."""
    if not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ValueError(f"xlogrt_torch.set_per_process_memory_fraction: {fraction!r} is not in (0, 1]")
    _check(_library().xlogrt_torch_set_memory_fraction(float(fraction), _device_index(device)),
           "set_per_process_memory_fraction")


def reap(device=None):
    """Waits for the device's queued frees and retires them."""
    _check(_library().xlogrt_torch_reap(_device_index(device)), "reap")


def flush_log(device=None):
    """Flushes the XLOGRT_LOG_FILE log."""
    _check(_library().xlogrt_torch_flush_log(_device_index(device)), "flush_log")


def last_error():
    """The bridge's last error on this thread."""
    return _library().xlogrt_torch_last_error().decode()
