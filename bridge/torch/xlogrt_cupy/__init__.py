# SPDX-License-Identifier: Apache-2.0
"""xlogrt as CuPy's device memory allocator.

    python3 -m pip install --no-build-isolation ./bridge/torch      # the xlogrt-torch package
    python3 -c 'import cupy, xlogrt_cupy; xlogrt_cupy.install(); print(cupy.arange(4).sum())'

install() makes malloc (below) CuPy's allocator (cupy.cuda.set_allocator): every CuPy array
allocated afterwards comes from xlogrt's DeviceRuntime<DefaultStack> of its device, the
same one PyTorch (xlogrt_torch.install) and Numba (xlogrt_numba) use in this process: one
budget, one cache, one XLOGRT_LOG_FILE log. CuPy's allocations carry tag 2
(xlogrt_torch.CUPY_TAG): xlogrt_cupy.stats() and the log tell them from torch's (1) and
Numba's (3). `with cupy.cuda.using_allocator(xlogrt_cupy.malloc):` uses xlogrt for a block
of code (on the calling thread) instead.

Streams. CuPy tells an allocator the size alone; malloc allocates on CuPy's current stream
(cupy.cuda.get_current_stream()) and the free is queued on that same stream when the
memory's last reference goes (the stream object is kept alive until then). So the free
waits for all work on the allocation stream, and for nothing else: CuPy has no hook that
tells the allocator an array was used on another stream (CuPy's own MemoryPool has the same
rule: memory goes back to the pool of its allocation stream). The safe patterns:

- allocate under the stream that uses the array (`with stream: a = cupy.empty(...)`);
- or, before the last reference to an array used on another stream goes, call
  xlogrt_cupy.record_stream(a, other_stream): the free then also waits for the work
  enqueued on other_stream up to the free (torch's Tensor.record_stream);
- or synchronize the other stream before the array dies.

Streams of CuPy's default kinds are blocking unless created with non_blocking=True: work on
the legacy null stream and on a blocking stream is ordered anyway.

The owner. Each block's cupy.cuda.UnownedMemory has as its owner a tuple (address, stream,
capsule) that libxlogrt_torch builds in the call that allocates (a builtin function made
from the library's method definition: no ctypes call per allocation): the capsule's C
destructor queues the free, and the tuple, which drops its items last to first, holds the
stream object until then. No Python code runs at the free, and the garbage collector sees
the stream through the tuple (an array kept on its own stream object is collected as
before). The library does not link against Python: the first malloc hands it the C-API
functions it calls (ctypes.pythonapi's; xlogrt_torch.h's xlogrt_torch_cupy_init).

Errors. A refusal (the budget, the device's memory, a bad size or device) raises
cupy.cuda.memory.OutOfMemoryError carrying xlogrt's message; a budget refusal names the
budget (XLOGRT_BUDGET_BYTES). A free xlogrt refuses (never expected: CuPy frees what it
was given) is reported on stderr and the block stays live.

Importing this module does not import CuPy; install() and malloc() need it.
"""
import ctypes

import xlogrt_torch as _x

__all__ = ["TAG", "install", "uninstall", "installed", "malloc", "record_stream", "stats", "device_stats"]

TAG = _x.CUPY_TAG

_cupy = None
_lib = None
_previous = None
_installed = False
_c_alloc = None  # libxlogrt_torch's alloc, bound (with CuPy's names) by _bind


def _import_cupy(what):
    global _cupy
    if _cupy is None:
        try:
            import cupy
        except ImportError as e:
            raise ImportError(f"xlogrt_cupy.{what}: CuPy does not import here ({e}); install CuPy for this "
                              "CUDA (e.g. pip install cupy-cuda13x)") from e
        _cupy = cupy
    return _cupy


def _out_of_memory(cupy, size, device, message):
    total = limit = 0
    try:
        s = _x.stats(device)
        total, limit = s["current_bytes"], s["budget_bytes"] or 0
    except Exception:  # the device has no runtime (a bad ordinal): no figures
        pass
    e = cupy.cuda.memory.OutOfMemoryError(size, total, limit)
    # CuPy's own message, with xlogrt's reason (naming the budget where it refused).
    e.args = (f"{message} (CuPy asked for {size:,} bytes on device {device}; {total:,} bytes live there "
              "through xlogrt, every framework's together)",)
    return e


class _PythonApi(ctypes.Structure):
    """xlogrt_torch.h's xlogrt_torch_python_api: the C-API functions alloc calls."""
    _fields_ = [(name, ctypes.c_void_p) for name in (
        "capsule_new", "capsule_get_pointer", "long_from_void_ptr", "long_as_ssize_t", "long_as_long",
        "long_as_void_ptr", "err_occurred", "err_set_string", "tuple_pack", "incref", "decref", "save_thread",
        "restore_thread", "none", "type_error")]


_API_FUNCTIONS = ("PyCapsule_New", "PyCapsule_GetPointer", "PyLong_FromVoidPtr", "PyLong_AsSsize_t", "PyLong_AsLong",
                  "PyLong_AsVoidPtr", "PyErr_Occurred", "PyErr_SetString", "PyTuple_Pack", "Py_IncRef", "Py_DecRef",
                  "PyEval_SaveThread", "PyEval_RestoreThread")


def _bind(cupy):
    """Binds what malloc calls, once: CuPy's functions and classes (a module attribute look-up
    on every call costs), and alloc, libxlogrt_torch's builtin function that allocates and
    builds the owner (xlogrt_torch.h's xlogrt_torch_cupy_init)."""
    global _get_device, _current_stream, _UnownedMemory, _MemoryPointer, _c_alloc
    lib = _lib if _lib is not None else _shared()
    api = ctypes.pythonapi
    try:
        table = _PythonApi(*[ctypes.cast(getattr(api, n), ctypes.c_void_p) for n in _API_FUNCTIONS],
                           id(None), id(TypeError))
        new_function = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.py_object,
                                         ctypes.py_object)(("PyCFunction_NewEx", api))
    except AttributeError as e:
        raise RuntimeError(f"xlogrt_cupy: this Python does not show its C API to ctypes ({e})") from None
    init = lib.xlogrt_torch_cupy_init
    init.restype, init.argtypes = ctypes.c_void_p, [ctypes.POINTER(_PythonApi)]
    method = init(ctypes.byref(table))
    if not method:
        raise RuntimeError(f"xlogrt_cupy: {lib.xlogrt_torch_last_error().decode()}")
    cuda = cupy.cuda
    _get_device, _current_stream = cuda.runtime.getDevice, cuda.get_current_stream
    _UnownedMemory, _MemoryPointer = cuda.UnownedMemory, cuda.MemoryPointer
    _c_alloc = new_function(method, None, None)


def malloc(size):
    """CuPy's allocator: `size` bytes of the current device for CuPy's current stream, as a
    cupy.cuda.MemoryPointer over a cupy.cuda.UnownedMemory whose owner frees it through
    xlogrt. Raises cupy.cuda.memory.OutOfMemoryError on refusal."""
    if _c_alloc is None:
        _bind(_cupy if _cupy is not None else _import_cupy("malloc"))
    device = _get_device()
    if not 0 < size < 2**63:
        if size == 0:
            return _MemoryPointer(_UnownedMemory(0, 0, None, device), 0)
        raise _out_of_memory(_cupy, max(size, 0), device, f"xlogrt: invalid_argument: a size of {size} bytes")
    stream = _current_stream()
    owner = _c_alloc(size, device, stream.ptr, stream)  # (address, stream, capsule) or None
    if owner is None:
        raise _out_of_memory(_cupy, size, device, _lib.xlogrt_torch_last_error().decode())
    return _MemoryPointer(_UnownedMemory(owner[0], size, owner, device), 0)


def _shared(build_dir=None):
    global _lib
    _lib = _x.shared_library(build_dir)
    return _lib


def install(build_dir=None):
    """Makes malloc CuPy's allocator for the process (cupy.cuda.set_allocator). Call before
    the first CuPy array: arrays from CuPy's pool stay in it. build_dir: a Meson build
    directory to load libxlogrt_torch.so from (None: the installed package's)."""
    global _previous, _installed
    cupy = _import_cupy("install")
    _shared(build_dir)
    if not _installed:
        get = getattr(cupy.cuda, "get_allocator", None)
        _previous = get() if get is not None else None
    cupy.cuda.set_allocator(malloc)
    _installed = True


def uninstall():
    """CuPy's allocator before install() again (its default pool when unknown). Arrays from
    xlogrt stay valid and are freed through xlogrt."""
    global _installed
    cupy = _import_cupy("uninstall")
    cupy.cuda.set_allocator(_previous if _previous is not None else cupy.get_default_memory_pool().malloc)
    _installed = False


def installed():
    """Whether install() is in effect."""
    return _installed


def record_stream(ptr_or_array, stream):
    """The free of the xlogrt memory of a CuPy array (or its base pointer) waits for the
    work enqueued on `stream` (a cupy.cuda.Stream, or any stream xlogrt_torch.stream_handle
    takes) up to the free. Raises ValueError for memory xlogrt did not hand out."""
    if _lib is None:
        _shared()
    _x.record_stream(ptr_or_array, stream)


def stats(device=None):
    """CuPy's figures (tag 2) with the device's (xlogrt_torch.tag_stats). device None:
    CuPy's current device."""
    return _x.tag_stats(TAG, _device(device))


def device_stats(device=None):
    """The device's figures for every framework together (xlogrt_torch.stats)."""
    return _x.stats(_device(device))


def _device(device):
    if _lib is None:
        _shared()
    if device is None:
        return _import_cupy("stats").cuda.runtime.getDevice()
    return int(getattr(device, "id", device))

