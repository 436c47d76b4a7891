# SPDX-License-Identifier: Apache-2.0
"""xlogrt as PyTorch's CUDA allocator.

    import xlogrt_torch
    xlogrt_torch.install("build/bridge/torch")      # before the first CUDA tensor
    x = torch.empty(1 << 20, device="cuda")         # from DeviceRuntime<DefaultStack>
    print(xlogrt_torch.stats())                     # {'current_bytes': ..., ...}

The stack is configured by the environment, as every default runtime:
XLOGRT_BUDGET_BYTES (a budget per device: torch.OutOfMemoryError beyond it, naming it),
XLOGRT_LOG_FILE (a CSV log of every allocate and free), XLOGRT_LIBCUDA.

install() loads libxlogrt_torch (the pluggable allocator's functions) and, when it was
built (meson found torch), libxlogrt_torch_hooks, which wires Tensor.record_stream to
xlogrt's cross-stream tracking and turns a refused allocation into
torch.OutOfMemoryError. Without the hooks, record_stream is silently dropped (as by any
pluggable allocator) and a refused allocation gives a tensor without memory: install()
refuses to run without them unless hooks=False is asked for.
"""
import ctypes
import os

import torch

__all__ = ["install", "stats", "reap", "flush_log", "last_error", "library_paths"]


class _Stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "current_bytes", "peak_bytes", "total_bytes", "allocations", "frees", "failed",
        "bytes_outstanding", "budget_bytes")]


_lib = None


def library_paths(build_dir):
    """The bridge's two libraries in a build directory (meson's bridge/torch)."""
    d = build_dir
    if os.path.isdir(os.path.join(d, "bridge", "torch")):
        d = os.path.join(d, "bridge", "torch")
    return os.path.join(d, "libxlogrt_torch.so"), os.path.join(d, "libxlogrt_torch_hooks.so")


def install(build_dir, hooks=True, record_stream=True):
    """Makes xlogrt the CUDA allocator of this process. Call before any CUDA allocation.

    hooks=False: the plain pluggable allocator only (no record_stream, NULL on failure).
    record_stream=False: the hooks without the record_stream hook (for the test that shows
    what goes wrong without it)."""
    global _lib
    if _lib is not None:
        raise RuntimeError("xlogrt_torch.install: already installed in this process")
    lib_path, hooks_path = library_paths(build_dir)
    if not os.path.exists(lib_path):
        raise FileNotFoundError(f"xlogrt_torch.install: {lib_path} is missing (build with -Dtorch_bridge=enabled)")
    if hooks and not os.path.exists(hooks_path):
        raise FileNotFoundError(f"xlogrt_torch.install: {hooks_path} is missing: meson did not find torch "
                                "(python3 -c 'import torch' must work where meson configures), or pass hooks=False")
    # RTLD_GLOBAL: the hooks library links against this very copy (one bridge state).
    lib = ctypes.CDLL(lib_path, mode=ctypes.RTLD_GLOBAL)
    lib.xlogrt_torch_get_stats.argtypes = [ctypes.c_int, ctypes.POINTER(_Stats)]
    lib.xlogrt_torch_last_error.restype = ctypes.c_char_p
    alloc = torch.cuda.memory.CUDAPluggableAllocator(lib_path, "xlogrt_torch_malloc", "xlogrt_torch_free")
    torch.cuda.memory.change_current_allocator(alloc)
    if hooks:
        rc = ctypes.CDLL(hooks_path).xlogrt_torch_install_hooks(ctypes.c_int(1 if record_stream else 0))
        if rc != 0:
            raise RuntimeError("xlogrt_torch.install: the current CUDA allocator is not the pluggable one")
    _lib = lib
    return alloc


def _check(rc, what):
    if rc != 0:
        raise RuntimeError(f"xlogrt_torch.{what}: {last_error()}")


def stats(device=0):
    """The device stack's figures, as a dict (budget_bytes is None without a budget)."""
    s = _Stats()
    _check(_lib.xlogrt_torch_get_stats(device, ctypes.byref(s)), "stats")
    d = {name: getattr(s, name) for name, _ in _Stats._fields_}
    if d["budget_bytes"] == 2**64 - 1:
        d["budget_bytes"] = None
    return d


def reap(device=0):
    """Waits for the device's queued frees and retires them (bytes_outstanding drops)."""
    _check(_lib.xlogrt_torch_reap(device), "reap")


def flush_log(device=0):
    """Flushes the XLOGRT_LOG_FILE log."""
    _check(_lib.xlogrt_torch_flush_log(device), "flush_log")


def last_error():
    """The bridge's last error on this thread."""
    return _lib.xlogrt_torch_last_error().decode()
