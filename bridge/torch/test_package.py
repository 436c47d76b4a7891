# SPDX-License-Identifier: Apache-2.0
"""The xlogrt-torch package without a GPU or torch (CI): pip builds its wheel from the
checkout, installs it into a fresh virtual environment and uninstalls it again.

    python3 bridge/torch/test_package.py FAKE_LIBCUDA

- the wheel holds the module and libxlogrt_torch.so (and the hooks where torch imports);
- `import xlogrt_torch` works without torch, and __version__ is meson.build's version;
- the installed library exports xlogrt_* functions alone (check_exports.py);
- its C functions, loaded as install() loads them, run on the fake libcuda, and the
  torch-shaped figures (memory_stats) follow a block's life; bad input is refused by name;
- xlogrt_cupy and xlogrt_numba import without CuPy or Numba and say so, by name, when
  used; over minimal stand-ins of cupy and numba.cuda (STANDINS: the names the modules
  call, as CuPy 14 and numba-cuda define them) they allocate through the same library on
  the fake libcuda: each framework's tag reaches Statistics, one Statistics covers them,
  the log (XLOGRT_LOG_FILE) shows their tags, a budget refusal raises each framework's
  error naming XLOGRT_BUDGET_BYTES, frees follow the last reference, get_memory_info is
  cuMemGetInfo; bad input (a tag, a foreign pointer, a second library path) is refused by name;
  CuPy's block is allocated for CuPy's current stream (its StreamId in the log), and its
  owner holds the stream object until the free is queued, lets go of it after, and leaves a
  cycle through the stream object to the garbage collector;
- `pip uninstall` leaves nothing of the package behind.
Exit 0, 1 on a failed check, 77 when this Python has no pip, venv, setuptools or wheel.
"""
import glob
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def sh(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        print(f"  {' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-3000:]}{p.stderr[-3000:]}", flush=True)
    return p


# Runs inside the virtual environment, from outside the checkout.
PROBE = r'''
import ctypes, json, os, sys
import xlogrt_torch as x
out = {"version": x.__version__, "file": x.__file__, "torch_imported": "torch" in sys.modules}
lib_path, hooks_path = x.library_paths()
out["lib"] = lib_path
x._lib = x._load(lib_path)  # what install() does before torch takes the library
lib = x._lib
lib.xlogrt_torch_malloc.restype = ctypes.c_void_p
lib.xlogrt_torch_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
lib.xlogrt_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
out["lib_version"] = lib.xlogrt_torch_version().decode()
s = ctypes.c_void_p(0x10000)
p = lib.xlogrt_torch_malloc(1 << 20, 0, s)
out["live"] = x.memory_stats(0)
out["allocated"] = x.memory_allocated(0)
lib.xlogrt_torch_free(p, -1, 0, s)
out["negative_free"] = x.last_error()
out["after_negative"] = x.memory_allocated(0)
lib.xlogrt_torch_free(p, 1 << 20, 0, s)
out["after_free"] = x.memory_allocated(0)
try:
    x.set_per_process_memory_fraction(2.0, 0)
    out["fraction"] = "accepted"
except ValueError as e:
    out["fraction"] = str(e)
x.empty_cache()
out["empty"] = x.memory_stats(0)
print(json.dumps(out))
'''


# Minimal stand-ins for what xlogrt_cupy and xlogrt_numba call of CuPy and numba.cuda
# (CuPy 14's and numba-cuda's names and signatures), written into a directory that the
# probe puts on sys.path after checking the modules without them.
STANDINS = {
    "cupy/__init__.py": "from . import cuda\n",
    "cupy/cuda/__init__.py": r'''
from . import memory, runtime
class Stream:
    def __init__(self, ptr): self.ptr = ptr
    def __enter__(self):
        global _current
        self._prev, _current = _current, self
        return self
    def __exit__(self, *a):
        global _current
        _current = self._prev
null = Stream(0)
_current = None
def get_current_stream(): return _current or null
class UnownedMemory:
    def __init__(self, ptr, size, owner, device_id=-1):
        self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id
class MemoryPointer:
    def __init__(self, mem, offset): self.mem, self.ptr = mem, mem.ptr + offset
_allocator = None
def set_allocator(allocator=None):
    global _allocator
    _allocator = allocator
def get_allocator(): return _allocator
''',
    "cupy/cuda/runtime.py": "def getDevice():\n    return 0\n",
    "cupy/cuda/memory.py": r'''
class OutOfMemoryError(MemoryError):
    def __init__(self, size, total, limit=0):
        super().__init__(f"Out of memory allocating {size:,} bytes (allocated so far: {total:,} bytes, limit {limit}).")
''',
    "numba/__init__.py": "",
    "numba/cuda/__init__.py": r'''
import weakref
from collections import namedtuple
from .cudadrv import driver
MemoryInfo = namedtuple("MemoryInfo", "free,total")
class HostOnlyCUDAMemoryManager:
    def __init__(self, *args, **kwargs):
        if "context" not in kwargs:
            raise RuntimeError("Memory manager requires a context")
        self.context = kwargs.pop("context")
        self.host_reset = 0
    def reset(self): self.host_reset += 1
    def defer_cleanup(self):
        import contextlib
        return contextlib.nullcontext()
class MemoryPointer:
    def __init__(self, context, pointer, size, owner=None, finalizer=None):
        self.context, self.device_pointer, self.size, self._owner = context, pointer, size, owner
        if finalizer is not None:
            self._finalizer = weakref.finalize(self, finalizer)
    @property
    def owner(self): return self if self._owner is None else self._owner
    @property
    def device_pointer_value(self): return self.device_pointer.value or None
manager = None
def set_memory_manager(mm_plugin):
    global manager
    if mm_plugin(context=None).interface_version != 1:
        raise RuntimeError("EMM Plugin interface version")
    manager = mm_plugin
''',
    "numba/cuda/cudadrv/__init__.py": "",
    "numba/cuda/cudadrv/enums.py": "CUDA_ERROR_OUT_OF_MEMORY = 2\n",
    "numba/cuda/cudadrv/driver.py": r'''
class CudaDriverError(Exception):
    pass
class CudaAPIError(CudaDriverError):
    def __init__(self, code, msg):
        self.code, self.msg = code, msg
        super().__init__(code, msg)
    def __str__(self): return "[%s] %s" % (self.code, self.msg)
class config:
    CUDA_PER_THREAD_DEFAULT_STREAM = 0
''',
}

# Runs inside the virtual environment with XLOGRT_BUDGET_BYTES=4M and XLOGRT_LOG_FILE set;
# argv[1]: the stand-ins' directory.
FRAMEWORKS_PROBE = r'''
import csv, ctypes, gc, importlib, json, os, sys, weakref
import xlogrt_torch as x, xlogrt_cupy, xlogrt_numba
out = {"imported": sorted(m for m in ("cupy", "numba", "torch") if m in sys.modules)}
def error_of(f):
    try:
        f()
        return None
    except Exception as e:
        return type(e).__name__ + ": " + str(e)
out["cupy_missing"] = error_of(lambda: xlogrt_cupy.malloc(16))
out["numba_missing"] = error_of(lambda: xlogrt_numba.XlogrtNumbaManager)
sys.path.insert(0, sys.argv[1])
importlib.invalidate_caches()
import cupy, numba.cuda
lib = x.shared_library()
def tag(t): return x.tag_stats(t, 0)

# CuPy: allocate on the current stream, record a side stream, free on the last reference.
xlogrt_cupy.install()
out["cupy_allocator"] = cupy.cuda.get_allocator() is xlogrt_cupy.malloc
with cupy.cuda.Stream(0x30000):
    m = cupy.cuda._allocator(1 << 20)
out["cupy_ptr"] = m.ptr
out["cupy_live"] = tag(x.CUPY_TAG)["current_bytes"]
# A tag-1 block on the same handle (xlogrt_torch_malloc_tagged): the log must give it CuPy's StreamId.
lib.xlogrt_torch_free(lib.xlogrt_torch_malloc_tagged(256, 0, 0x30000, 1), 256, 0, 0x30000)
# The owner holds the allocation's stream until the block's free is queued, then lets go.
class TrackedStream(cupy.cuda.Stream):
    def __del__(self):
        ended.append(tag(x.CUPY_TAG)["frees"])
ended = []
s = TrackedStream(0x50000)
with s:
    k = xlogrt_cupy.malloc(4096)
held, frees0 = weakref.ref(s), tag(x.CUPY_TAG)["frees"]
del s
out["stream_held"] = held() is not None
del k
out["stream_after_free"] = [held() is None, ended == [frees0 + 1]]
# A cycle through the stream (an array kept on its stream object) is the collector's to free.
s = TrackedStream(0x60000)
with s:
    s.scratch = xlogrt_cupy.malloc(4096)
held, frees0 = weakref.ref(s), tag(x.CUPY_TAG)["frees"]
del s
gc.collect()
out["stream_cycle"] = [held() is None, tag(x.CUPY_TAG)["frees"] == frees0 + 1]
xlogrt_cupy.record_stream(m, cupy.cuda.Stream(0x40000))
out["foreign_record"] = error_of(lambda: xlogrt_cupy.record_stream(0x1234, 0))
out["empty"] = xlogrt_cupy.malloc(0).ptr

# Numba: the EMM plugin, as NUMBA_CUDA_MEMORY_MANAGER finds it.
M = importlib.import_module("xlogrt_numba")._numba_memory_manager
xlogrt_numba.install()
out["numba_manager"] = numba.cuda.manager is M
class Device: id = 0
class Context: device = Device()
ctx = Context()
mgr = M(context=ctx)
mgr.initialize()
p = mgr.memalloc(4096)
out["numba_live"] = tag(x.NUMBA_TAG)["current_bytes"]
out["numba_ptr"] = p.device_pointer.value
out["memory_info"] = list(mgr.get_memory_info())
out["ipc"] = error_of(lambda: mgr.get_ipc_handle(p))
with mgr.defer_cleanup():
    pass

# One Statistics for all.
lib.xlogrt_torch_malloc.restype = ctypes.c_void_p
lib.xlogrt_torch_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
t = lib.xlogrt_torch_malloc(8192, 0, ctypes.c_void_p(0x10000))
out["tags_live"] = [tag(k)["current_bytes"] for k in (x.TORCH_TAG, x.CUPY_TAG, x.NUMBA_TAG)]
out["device_live"] = x.stats(0)["current_bytes"]
lib.xlogrt_torch_free(t, 8192, 0, ctypes.c_void_p(0x10000))

# Refusals: the budget (4 MiB), by each framework's error.
try:
    xlogrt_cupy.malloc(8 << 20)
    out["cupy_oom"] = None
except cupy.cuda.memory.OutOfMemoryError as e:
    out["cupy_oom"] = str(e)
try:
    mgr.memalloc(8 << 20)
    out["numba_oom"] = None
except numba.cuda.driver.CudaAPIError as e:
    out["numba_oom"] = [str(e), e.code, isinstance(e, MemoryError)]
out["bad_tag"] = [lib.xlogrt_torch_malloc_tagged(64, 0, None, 64), x.last_error()]
out["bad_tag_stats"] = error_of(lambda: x.tag_stats(99, 0))
out["second_copy"] = error_of(lambda: x.shared_library("/nonexistent"))
out["negative"] = error_of(lambda: xlogrt_cupy.malloc(-1))
# libxlogrt_torch's alloc (the builtin malloc calls) refuses what is not its four ints and object.
out["alloc_args"] = [error_of(lambda: xlogrt_cupy._c_alloc(64, 0)), error_of(lambda: xlogrt_cupy._c_alloc(64, 0, "s", None))]

del m, p
gc.collect()
out["after"] = [tag(x.CUPY_TAG), tag(x.NUMBA_TAG)]
mgr.reset()
out["reset"] = [mgr.host_reset, x.stats(0)["cached_bytes"]]
x.flush_log(0)
with open(os.environ["XLOGRT_LOG_FILE"], newline="") as f:
    out["log"] = [[r["Action"], int(r["Pointer"], 16), r["Tag"], int(r["Stream"])] for r in csv.DictReader(f)]
print(json.dumps(out))
'''


def frameworks_checks(py, env, tmp):
    standins = os.path.join(tmp, "standins")
    for rel, text in STANDINS.items():
        os.makedirs(os.path.dirname(os.path.join(standins, rel)), exist_ok=True)
        with open(os.path.join(standins, rel), "w") as f:
            f.write(text)
    log = os.path.join(tmp, "frameworks.csv")
    p = sh([py, "-c", FRAMEWORKS_PROBE, standins], env=dict(env, XLOGRT_BUDGET_BYTES="4M", XLOGRT_LOG_FILE=log), cwd=tmp)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    check(p.returncode == 0 and bool(lines), "xlogrt_cupy and xlogrt_numba run over the stand-ins on the fake libcuda")
    if not lines:
        return
    import json
    r = json.loads(lines[-1])
    check(r["imported"] == [], f"importing xlogrt_cupy and xlogrt_numba imports no framework ({r['imported']})")
    check("ImportError" in (r["cupy_missing"] or "") and "CuPy does not import" in r["cupy_missing"],
          f"without CuPy, xlogrt_cupy.malloc says so by name ({r['cupy_missing']})")
    check("ImportError" in (r["numba_missing"] or "") and "Numba" in r["numba_missing"],
          f"without Numba, xlogrt_numba.XlogrtNumbaManager says so by name ({r['numba_missing']})")
    check(r["cupy_allocator"], "xlogrt_cupy.install sets CuPy's allocator")
    check(r["cupy_live"] == 1 << 20, "CuPy's MiB counts under its tag")
    check(r["stream_held"] and r["stream_after_free"] == [True, True],
          "a CuPy block's owner holds its stream until the free is queued, then lets go "
          f"({r['stream_held']}, {r['stream_after_free']})")
    check(r["stream_cycle"] == [True, True],
          f"a cycle through the stream object is collected and its block freed ({r['stream_cycle']})")
    check("foreign_block" in (r["foreign_record"] or ""), "record_stream of a foreign pointer is refused by name")
    check(r["empty"] == 0, "a CuPy allocation of 0 bytes is a null pointer")
    check(r["numba_manager"], "xlogrt_numba.install sets Numba's memory manager (interface version 1)")
    check(r["numba_live"] == 4096, "Numba's 4 KiB counts under its tag")
    check(r["memory_info"] == [1 << 30, 2 << 30], f"get_memory_info is cuMemGetInfo ({r['memory_info']})")
    check("RuntimeError" in (r["ipc"] or "") and "IPC" in r["ipc"], "get_ipc_handle is refused by name")
    check(r["tags_live"] == [8192, 1 << 20, 4096] and r["device_live"] == 8192 + (1 << 20) + 4096,
          f"one Statistics: torch, CuPy and Numba by tag, and their sum ({r['tags_live']}, {r['device_live']})")
    check("XLOGRT_BUDGET_BYTES" in (r["cupy_oom"] or "") and "CuPy asked for" in r["cupy_oom"],
          f"over the budget, CuPy's OutOfMemoryError names the budget ({r['cupy_oom']})")
    oom = r["numba_oom"] or ["", 0, False]
    check("XLOGRT_BUDGET_BYTES" in oom[0] and oom[1] == 2 and oom[2],
          f"over the budget, Numba's CudaAPIError(CUDA_ERROR_OUT_OF_MEMORY), a MemoryError, names the budget ({oom})")
    check(r["bad_tag"][0] is None and "tag 64 is outside 1..63" in r["bad_tag"][1], "a tag out of range is refused by name")
    check("tag 99" in (r["bad_tag_stats"] or ""), "tag_stats of a tag out of range is refused by name")
    check("already loaded" in (r["second_copy"] or ""), "a second copy of the library is refused by name")
    check("OutOfMemoryError" in (r["negative"] or "") and "invalid_argument" in r["negative"],
          "a negative CuPy size is CuPy's OutOfMemoryError naming invalid_argument")
    two, text = r["alloc_args"]
    check((two or "").startswith("TypeError") and "(size, device, stream, stream_object)" in two
          and (text or "").startswith("TypeError"), f"the C alloc refuses other arguments with TypeError ({r['alloc_args']})")
    cupy_after, numba_after = r["after"]
    check(cupy_after["current_bytes"] == 0 and cupy_after["frees"] == cupy_after["allocations"] == 3
          and numba_after["current_bytes"] == 0 and numba_after["frees"] == 1,
          "the last references gone, CuPy's and Numba's blocks are freed")
    check(r["reset"] == [1, 0], "reset: Numba's host state and xlogrt's cache are cleared")
    log = r["log"]
    for name, ptr, t in (("CuPy", r["cupy_ptr"], "2"), ("Numba", r["numba_ptr"], "3")):
        check(any(l[:3] == ["allocate", ptr, t] for l in log) and any(l[:3] == ["free", ptr, t] for l in log),
              f"the log shows {name}'s block allocated and freed under tag {t}")
    # Stream 0x30000: CuPy's MiB (its current stream), then torch's tag-1 block; stream 0x10000: torch's.
    cupy_stream = [l[3] for l in log if l[:3] == ["allocate", r["cupy_ptr"], "2"]]
    on_30000 = [l[3] for l in log if l[0] == "allocate" and l[2] == "1" and l[3] in cupy_stream]
    on_10000 = [l[3] for l in log if l[0] == "allocate" and l[2] == "1" and l[3] not in cupy_stream]
    check(len(cupy_stream) == 1 and len(on_30000) == 1 and len(on_10000) == 1,
          f"CuPy's block is allocated for CuPy's current stream (StreamIds: CuPy's {cupy_stream}, torch's on the "
          f"same handle {on_30000}, on another {on_10000})")


def main():
    if len(sys.argv) != 2:
        print("usage: test_package.py FAKE_LIBCUDA")
        return 2
    fake = os.path.abspath(sys.argv[1])
    # The first Python with what building and installing a package needs (this one, else
    # the system's: a Python of its own may lack `wheel`).
    need = "import setuptools, wheel, pip, venv"
    python = next((p for p in (sys.executable, "/usr/bin/python3")
                   if os.path.exists(p) and subprocess.run([p, "-c", need], capture_output=True).returncode == 0), None)
    if python is None:
        print(f"SKIP: neither {sys.executable} nor /usr/bin/python3 has pip, venv, setuptools and wheel")
        return 77
    print(f"python: {python}", flush=True)
    with open(os.path.join(ROOT, "meson.build")) as f:
        version = re.search(r"version:\s*'([^']+)'", f.read()).group(1)
    with tempfile.TemporaryDirectory() as tmp:
        print("building the wheel (pip wheel --no-build-isolation ./bridge/torch) ...", flush=True)
        # The build writes bridge/torch/build and *.egg-info: work on a copy of what it reads.
        src = os.path.join(tmp, "src")
        sh(["cp", "-r", os.path.join(ROOT, "include"), os.path.join(ROOT, "meson.build"), tmp])
        os.makedirs(os.path.join(tmp, "bridge"))
        sh(["cp", "-r", HERE, os.path.join(tmp, "bridge", "torch")])
        src = os.path.join(tmp, "bridge", "torch")
        for junk in ("build", "xlogrt_torch.egg-info"):
            sh(["rm", "-rf", os.path.join(src, junk)])
        wheels = os.path.join(tmp, "wheels")
        p = sh([python, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index", "-w", wheels, src])
        found = glob.glob(os.path.join(wheels, "xlogrt_torch-*.whl"))
        check(p.returncode == 0 and len(found) == 1, "pip builds one wheel")
        if not found:
            return 1
        names = subprocess.run([python, "-m", "zipfile", "-l", found[0]], capture_output=True, text=True).stdout
        check("xlogrt_torch/libxlogrt_torch.so" in names and "xlogrt_torch/__init__.py" in names,
              "the wheel holds the module and libxlogrt_torch.so")
        check("xlogrt_cupy/__init__.py" in names and "xlogrt_numba/__init__.py" in names,
              "the wheel holds xlogrt_cupy and xlogrt_numba")
        check(f"xlogrt_torch-{version}" in os.path.basename(found[0]), f"the wheel's version is {version}")

        env_dir = os.path.join(tmp, "venv")
        check(sh([python, "-m", "venv", env_dir]).returncode == 0, "a fresh virtual environment")
        py = os.path.join(env_dir, "bin", "python")
        check(sh([py, "-m", "pip", "install", "--no-index", "--no-deps", found[0]]).returncode == 0,
              "pip installs the wheel")
        env = dict(os.environ, XLOGRT_LIBCUDA=fake)
        env.pop("XLOGRT_BUDGET_BYTES", None)
        p = sh([py, "-c", PROBE], env=env, cwd=tmp)
        lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
        check(p.returncode == 0 and bool(lines), "the installed package runs on the fake libcuda")
        if lines:
            import json
            r = json.loads(lines[-1])
            check(r["version"] == version and r["lib_version"] == version,
                  f"__version__ and the library's version are {version} ({r['version']}, {r['lib_version']})")
            check(not r["torch_imported"], "importing xlogrt_torch does not import torch")
            check(r["file"].startswith(env_dir), "the module comes from the virtual environment")
            check(sh([sys.executable, os.path.join(HERE, "check_exports.py"), r["lib"]]).returncode == 0,
                  "the installed library exports xlogrt_* alone")
            live = r["live"]
            check(live["allocated_bytes.all.current"] == 1 << 20 and r["allocated"] == 1 << 20,
                  "memory_stats / memory_allocated count the live MiB")
            check(live["allocation.all.current"] == 1 and live["allocated_bytes.all.peak"] >= 1 << 20,
                  "torch's count and peak keys")
            check("negative size" in r["negative_free"] and r["after_negative"] == 1 << 20,
                  "a free with a negative size is refused by name and the block stays")
            check(r["after_free"] == 0, "the free with the right size frees it")
            check("not in (0, 1]" in r["fraction"], "a memory fraction of 2.0 is refused")
            empty = r["empty"]
            check(empty["xlogrt.cached_bytes"] == 0 and empty["xlogrt.held_bytes"] == 0,
                  "empty_cache leaves nothing cached or queued")
        frameworks_checks(py, env, tmp)
        site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True).stdout.strip()
        check(sh([py, "-m", "pip", "uninstall", "-y", "xlogrt-torch"]).returncode == 0, "pip uninstalls it")
        left = glob.glob(os.path.join(site, "xlogrt*"))
        check(not left, f"nothing of the package is left in site-packages ({left})")
    print(f"test_package: {'FAILED: ' + '; '.join(failures) if failures else 'all checks passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
