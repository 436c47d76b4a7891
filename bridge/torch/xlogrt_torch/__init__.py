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
| XLOGRT_CACHE | `0` turns the caching layer off (every block from the driver's pool); `nvtx`; `KEY=SIZE` items for its sizes (README) | on |
| XLOGRT_LOG_FILE | a path: a CSV line for every allocation and free (tag 1: torch's) | no log |
| XLOGRT_LIBCUDA | the driver library to load | libcuda.so.1 |

install() loads libxlogrt_torch (the allocator's C functions) and libxlogrt_torch_hooks
(built against the torch of the build), which wires Tensor.record_stream to xlogrt's
cross-stream tracking, turns a refused allocation into torch.OutOfMemoryError and sets
the empty-cache and memory-fraction hooks. Both are loaded privately (RTLD_LOCAL): they
export their C functions alone, so no library loaded later binds to their code.
"""
import ctypes
import os

__all__ = ["__version__", "install", "installed", "memory_stats", "memory_allocated", "max_memory_allocated",
           "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats", "empty_cache",
           "set_per_process_memory_fraction", "stats", "reap", "flush_log", "last_error", "library_paths"]

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
        "device_allocs", "alloc_retries", "budget_bytes", "budget_in_use")]


_lib = None
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
    return lib


def install(build_dir=None, hooks=True, record_stream=True):
    """Makes xlogrt the CUDA allocator of this process. Call before any CUDA allocation.

    build_dir: a Meson build directory to load the libraries from (None: the installed
    package's). hooks=False: the plain pluggable allocator only (no record_stream, NULL on
    failure, no empty_cache or memory-fraction hooks). record_stream=False: the hooks
    without the record_stream hook (for the test that shows what goes wrong without it)."""
    global _lib, _hooks
    import torch
    if _lib is not None:
        raise RuntimeError("xlogrt_torch.install: already installed in this process")
    lib_path, hooks_path = library_paths(build_dir)
    where = "the installed package" if build_dir is None else build_dir
    if not os.path.exists(lib_path):
        raise FileNotFoundError(f"xlogrt_torch.install: {lib_path} is missing from {where} "
                                "(pip install ./bridge/torch, or a Meson build with -Dtorch_bridge=enabled)")
    if hooks and not os.path.exists(hooks_path):
        raise FileNotFoundError(f"xlogrt_torch.install: {hooks_path} is missing: torch did not import where the "
                                "bridge was built (rebuild where `python3 -c 'import torch'` works), or pass hooks=False")
    lib = _load(lib_path)
    alloc = torch.cuda.memory.CUDAPluggableAllocator(lib_path, "xlogrt_torch_malloc", "xlogrt_torch_free")
    torch.cuda.memory.change_current_allocator(alloc)
    if hooks:
        # Its DT_NEEDED libxlogrt_torch.so is the copy loaded above (found by its rpath).
        h = ctypes.CDLL(hooks_path)
        if h.xlogrt_torch_install_hooks(ctypes.c_int(1 if record_stream else 0)) != 0:
            raise RuntimeError("xlogrt_torch.install: the current CUDA allocator is not the pluggable one")
        _hooks = h
    _lib = lib
    return alloc


def installed():
    """Whether install() has run in this process."""
    return _lib is not None


def _library():
    if _lib is None:
        raise RuntimeError("xlogrt_torch: call install() first")
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
      xlogrt.pool_used_bytes, xlogrt.budget_bytes (None: none), xlogrt.budget_in_use.

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
