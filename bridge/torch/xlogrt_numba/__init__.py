# SPDX-License-Identifier: Apache-2.0
"""xlogrt as Numba's CUDA device memory manager: an External Memory Management (EMM) plugin.

    python3 -m pip install --no-build-isolation ./bridge/torch      # the xlogrt-torch package
    NUMBA_CUDA_MEMORY_MANAGER=xlogrt_numba python3 my_numba_program.py

or, in the program, before the first CUDA context: `import xlogrt_numba; xlogrt_numba.install()`
(numba.cuda.set_memory_manager(xlogrt_numba.XlogrtNumbaManager)).

Every device array Numba allocates afterwards comes from xlogrt's DeviceRuntime<DefaultStack>
of its device, the same one PyTorch (xlogrt_torch) and CuPy (xlogrt_cupy) use in this
process: one budget, one cache, one XLOGRT_LOG_FILE log. Numba's allocations carry tag 3
(xlogrt_torch.NUMBA_TAG; xlogrt_numba.stats()). Pinned and mapped host memory stay Numba's
own (the plugin derives from numba.cuda.HostOnlyCUDAMemoryManager).

Streams. Numba's EMM interface passes no stream (its version 1 has no asynchronous
allocation): memalloc allocates on Numba's default stream (the legacy default stream, or the
per-thread default stream under NUMBA_CUDA_PER_THREAD_DEFAULT_STREAM=1), and the array's
finalizer queues the free on that same stream when Numba drops the memory. Numba's own
streams (cuda.stream()) are blocking, so work on them is ordered with the legacy default
stream: the free waits for it. Not covered: non-blocking streams (cuda.external_stream of
a torch or CuPy stream created non-blocking), and every other stream under the per-thread
default stream. For those, before the array's last reference goes, call
xlogrt_numba.record_stream(array, stream) (the free then waits for that stream's work up to
the free), or synchronize the stream.

Frees: stream-ordered and immediate (no deallocation queue, no synchronization), so
defer_cleanup() defers only Numba's own host-memory cleanup; memory freed inside it is
reusable by later work on the same stream at once. reset() (numba.cuda.close / context
reset) gives xlogrt's cached blocks back to the device (xlogrt_torch.empty_cache of the
device); live arrays stay valid and free through xlogrt when they go.

Errors. A refusal (the budget, the device's memory, a bad size) raises
xlogrt_numba.OutOfMemoryError, which is both numba's CudaAPIError with code
CUDA_ERROR_OUT_OF_MEMORY (what Numba's own allocator raises) and a MemoryError, carrying
xlogrt's message (naming XLOGRT_BUDGET_BYTES where the budget refused). get_ipc_handle
raises RuntimeError: xlogrt's blocks come from a stream-ordered memory pool, which legacy
CUDA IPC (cuIpcGetMemHandle) cannot export.

get_memory_info() is the driver's cuMemGetInfo for the device (free and total of the whole
device, every process's use counted); xlogrt's own figures are stats() and device_stats().

Importing this module does not import Numba: XlogrtNumbaManager (and _numba_memory_manager,
which NUMBA_CUDA_MEMORY_MANAGER reads) is built on first access, when Numba imports.
"""
import contextlib
import ctypes
import weakref

import xlogrt_torch as _x

__all__ = ["TAG", "install", "record_stream", "stats", "device_stats", "XlogrtNumbaManager", "OutOfMemoryError"]

TAG = _x.NUMBA_TAG
CU_STREAM_PER_THREAD = 0x2

_built = None  # (XlogrtNumbaManager, OutOfMemoryError), once Numba imported


def _import_numba(what):
    try:
        from numba import cuda
        from numba.cuda.cudadrv import driver
    except ImportError as e:
        raise ImportError(f"xlogrt_numba.{what}: Numba's CUDA target does not import here ({e}); "
                          "install numba-cuda") from e
    return cuda, driver


def _oom_code(driver):
    binding = getattr(driver, "binding", None)
    if binding is not None and hasattr(binding, "CUresult"):
        return binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY  # numba-cuda over cuda.bindings
    from numba.cuda.cudadrv import enums
    return enums.CUDA_ERROR_OUT_OF_MEMORY


def _default_stream(driver):
    config = getattr(driver, "config", None)
    return CU_STREAM_PER_THREAD if getattr(config, "CUDA_PER_THREAD_DEFAULT_STREAM", 0) else 0


def _finalizer(lib, ptr, size, device, stream):
    def free():
        lib.xlogrt_torch_free(ptr, size, device, stream)
    return free


def _build():
    global _built
    if _built is not None:
        return _built
    cuda, driver = _import_numba("XlogrtNumbaManager")
    oom_code = _oom_code(driver)

    class OutOfMemoryError(driver.CudaAPIError, MemoryError):
        """xlogrt refused a Numba allocation: a CudaAPIError with code
        CUDA_ERROR_OUT_OF_MEMORY, as Numba's own allocator raises, and a MemoryError."""

        def __init__(self, msg):
            super().__init__(oom_code, msg)

    class XlogrtNumbaManager(cuda.HostOnlyCUDAMemoryManager):
        """Numba's device memory from xlogrt (see the module's documentation). One
        instance per Numba context (device)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)  # context=None when Numba checks the version
            self._lib = None
            self._stream = 0

        def _device(self):
            return self.context.device.id

        def initialize(self):
            """Loads libxlogrt_torch (once per process) and builds the device's runtime,
            so that a device xlogrt cannot serve fails here, by name."""
            self._lib = _x.shared_library()
            self._stream = _default_stream(driver)
            s = _x._Stats()
            if self._lib.xlogrt_torch_get_stats(self._device(), ctypes.byref(s)) != 0:
                raise RuntimeError(f"xlogrt_numba: device {self._device()}: {_x.last_error()}")

        def memalloc(self, size):
            lib = self._lib if self._lib is not None else _x.shared_library()
            ctx = weakref.proxy(self.context)
            if size == 0:
                binding = getattr(driver, "binding", None)  # as Numba makes an empty array's pointer
                null = binding.CUdeviceptr(0) if hasattr(binding, "CUdeviceptr") else ctypes.c_void_p(0)
                return cuda.MemoryPointer(ctx, null, 0)
            device = self._device()
            if not 0 < size < 2**63:
                raise OutOfMemoryError(f"xlogrt: invalid_argument: a size of {size} bytes (Numba, device {device})")
            ptr = lib.xlogrt_torch_malloc_tagged(size, device, self._stream, TAG)
            if not ptr:
                raise OutOfMemoryError(f"{lib.xlogrt_torch_last_error().decode()} "
                                       f"(Numba asked for {size:,} bytes on device {device})")
            return cuda.MemoryPointer(ctx, ctypes.c_void_p(ptr), size,
                                      finalizer=_finalizer(lib, ptr, size, device, self._stream))

        def get_memory_info(self):
            """cuMemGetInfo of the device: MemoryInfo(free, total)."""
            if self._lib is None:
                self._lib = _x.shared_library()
            free, total = _x.mem_get_info(self._device())
            return cuda.MemoryInfo(free=free, total=total)

        def get_ipc_handle(self, memory):
            raise RuntimeError("xlogrt_numba: no IPC handle: xlogrt's blocks come from a stream-ordered memory "
                               "pool (cuMemAllocFromPoolAsync), which legacy CUDA IPC (cuIpcGetMemHandle) "
                               "cannot export; copy the data into memory from Numba's own allocator to share it")

        def reset(self):
            """Numba's host allocations are cleaned up; xlogrt's cached blocks of the
            device go back to the device. Live device arrays stay valid."""
            super().reset()
            if self._lib is not None and self.context is not None:
                self._lib.xlogrt_torch_empty_cache(self._device())

        @contextlib.contextmanager
        def defer_cleanup(self):
            """Defers Numba's host-memory cleanup; xlogrt's frees are stream-ordered and
            never synchronize, so there is nothing of its own to defer."""
            with super().defer_cleanup():
                yield

        @property
        def interface_version(self):
            return 1

    _built = (XlogrtNumbaManager, OutOfMemoryError)
    return _built


def __getattr__(name):
    # Built when first asked for (PEP 562), so that importing this module needs no Numba.
    if name in ("XlogrtNumbaManager", "_numba_memory_manager"):
        return _build()[0]
    if name == "OutOfMemoryError":
        return _build()[1]
    raise AttributeError(f"module 'xlogrt_numba' has no attribute {name!r}")


def install():
    """numba.cuda.set_memory_manager(XlogrtNumbaManager): call before the first CUDA context
    of the process (contexts created before keep their manager)."""
    cuda, _ = _import_numba("install")
    _x.shared_library()
    cuda.set_memory_manager(_build()[0])


def record_stream(ptr_or_array, stream):
    """The free of the xlogrt memory of a Numba device array (or its base pointer) waits
    for the work enqueued on `stream` (a Numba stream, or any stream
    xlogrt_torch.stream_handle takes) up to the free. Raises ValueError for memory xlogrt
    did not hand out."""
    _x.shared_library()
    _x.record_stream(ptr_or_array, stream)


def stats(device=0):
    """Numba's figures (tag 3) with the device's (xlogrt_torch.tag_stats)."""
    _x.shared_library()
    return _x.tag_stats(TAG, int(device))


def device_stats(device=0):
    """The device's figures for every framework together (xlogrt_torch.stats)."""
    _x.shared_library()
    return _x.stats(int(device))
