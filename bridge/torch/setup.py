# SPDX-License-Identifier: Apache-2.0
"""Builds the xlogrt-torch package: the xlogrt_torch module and, beside it,
libxlogrt_torch.so (the allocator's C functions, no torch dependency) and, where torch
imports, libxlogrt_torch_hooks.so compiled against that torch; and the xlogrt_cupy and
xlogrt_numba modules (pure Python, over the same libxlogrt_torch.so; pyproject.toml lists
the packages).

    python3 -m pip install --no-build-isolation ./bridge/torch

--no-build-isolation: the build uses the setuptools and the torch already installed
(an isolated build would download setuptools, and would not see torch). Needs a C++20
compiler (CXX, else c++) and the CUDA Toolkit's cuda.h (CUDA_PATH or CUDA_HOME, else
/usr/local/cuda); libcuda is loaded at run time. XLOGRT_TORCH_HOOKS=0 skips the hooks.
"""
import os
import re
import shlex
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


class BuildError(Exception):
    pass


def project_version():
    path = os.path.join(ROOT, "meson.build")
    try:
        with open(path) as f:
            m = re.search(r"version:\s*'([^']+)'", f.read())
    except OSError as e:
        raise BuildError(f"xlogrt-torch: {path} is unreadable ({e}): build from a checkout of xlogrt") from e
    if not m:
        raise BuildError(f"xlogrt-torch: no project version in {path}")
    return m.group(1)


def cuda_include():
    candidates = [os.path.join(os.environ[v], "include") for v in ("CUDA_PATH", "CUDA_HOME") if os.environ.get(v)]
    candidates += ["/usr/local/cuda/include", "/usr/include"]
    for d in candidates:
        if os.path.exists(os.path.join(d, "cuda.h")):
            return d
    raise BuildError("xlogrt-torch: cuda.h not found in " + ", ".join(candidates) +
                     " (install the CUDA Toolkit, or set CUDA_PATH)")


def run(cmd, what):
    print(f"xlogrt-torch: building {what}", flush=True)
    print("  " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise BuildError(f"xlogrt-torch: compiling {what} failed:\n{p.stdout}{p.stderr}")


def torch_flags():
    """(abi, include dirs, library dirs) of the torch this Python imports, else None."""
    if os.environ.get("XLOGRT_TORCH_HOOKS") == "0":
        print("xlogrt-torch: XLOGRT_TORCH_HOOKS=0: the hooks library is not built", flush=True)
        return None
    p = subprocess.run([sys.executable, os.path.join(HERE, "torch_flags.py")], capture_output=True, text=True)
    if p.returncode != 0:
        print("xlogrt-torch: torch does not import here, so the hooks library (record_stream, "
              f"torch.OutOfMemoryError, empty_cache) is not built: {p.stderr.strip()}", flush=True)
        return None
    abi, incs, libs = (p.stdout.strip().split("\n") + ["", "", ""])[:3]
    return abi, [d for d in incs.split(";") if d], [d for d in libs.split(";") if d]


class BuildLibraries(build_py):
    """build_py, then the two shared libraries into the package's build directory."""

    def run(self):
        super().run()
        try:
            self.build_libraries()
        except BuildError as e:
            raise SystemExit(str(e)) from None

    def build_libraries(self):
        out = os.path.join(self.build_lib, "xlogrt_torch")
        os.makedirs(out, exist_ok=True)
        version = project_version()
        cxx = shlex.split(os.environ.get("CXX", "c++"))
        cuda = cuda_include()
        exports = [f"-Wl,--version-script={os.path.join(HERE, 'xlogrt_torch.map')}", "-fvisibility=hidden",
                   "-fvisibility-inlines-hidden"]
        common = ["-std=c++20", "-O2", "-fPIC", "-shared", "-pthread", *exports]
        lib = os.path.join(out, "libxlogrt_torch.so")
        run([*cxx, *common, f'-DXLOGRT_VERSION="{version}"', "-I", os.path.join(ROOT, "include"),
             "-isystem", cuda, os.path.join(HERE, "xlogrt_torch.cpp"), "-Wl,-soname,libxlogrt_torch.so",
             "-o", lib, "-ldl"], "libxlogrt_torch.so")
        flags = torch_flags()
        torch_version = None
        if flags is not None:
            abi, incs, libs = flags
            cmd = [*cxx, *common, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-Wno-unused-parameter", "-isystem", cuda]
            for d in incs:
                cmd += ["-isystem", d]
            cmd += [os.path.join(HERE, "torch_hooks.cpp"), "-o", os.path.join(out, "libxlogrt_torch_hooks.so")]
            for d in libs:
                cmd += [f"-L{d}", f"-Wl,-rpath,{d}"]
            # $ORIGIN: the hooks find the libxlogrt_torch.so beside them (already loaded).
            cmd += ["-lc10", "-lc10_cuda", "-ltorch_cuda", lib, "-Wl,-rpath,$ORIGIN"]
            run(cmd, "libxlogrt_torch_hooks.so (against the torch python3 imports)")
            torch_version = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                                           capture_output=True, text=True).stdout.strip() or None
        with open(os.path.join(out, "_build_info.py"), "w") as f:
            f.write("# Written by setup.py when the package was built.\n")
            f.write(f"VERSION = {version!r}\nHOOKS = {flags is not None!r}\nTORCH_VERSION = {torch_version!r}\n")


class BinaryDistribution(Distribution):
    """The package carries shared libraries: its wheel is for this platform."""

    def has_ext_modules(self):
        return True


try:
    VERSION = project_version()
except BuildError as e:
    sys.exit(str(e))

setup(version=VERSION, cmdclass={"build_py": BuildLibraries}, distclass=BinaryDistribution)
