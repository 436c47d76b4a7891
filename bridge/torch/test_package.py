# SPDX-License-Identifier: Apache-2.0
"""The xlogrt-torch package without a GPU or torch (CI): pip builds its wheel from the
checkout, installs it into a fresh virtual environment and uninstalls it again.

    python3 bridge/torch/test_package.py FAKE_LIBCUDA

- the wheel holds the module and libxlogrt_torch.so (and the hooks where torch imports);
- `import xlogrt_torch` works without torch, and __version__ is meson.build's version;
- the installed library exports xlogrt_* functions alone (check_exports.py);
- its C functions, loaded as install() loads them, run on the fake libcuda, and the
  torch-shaped figures (memory_stats) follow a block's life; bad input is refused by name;
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
        site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True).stdout.strip()
        check(sh([py, "-m", "pip", "uninstall", "-y", "xlogrt-torch"]).returncode == 0, "pip uninstalls it")
        left = glob.glob(os.path.join(site, "xlogrt*"))
        check(not left, f"nothing of the package is left in site-packages ({left})")
    print(f"test_package: {'FAILED: ' + '; '.join(failures) if failures else 'all checks passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
