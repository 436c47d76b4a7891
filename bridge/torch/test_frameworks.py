# SPDX-License-Identifier: Apache-2.0
"""CuPy and Numba through xlogrt, and PyTorch, CuPy and Numba in one process, on a GPU.

    python3 -m pip install --no-build-isolation --no-deps --no-index --target SITE ./bridge/torch
    PYTHONPATH=SITE python3 bridge/torch/test_frameworks.py --out DIR

Needs CuPy, numba-cuda and torch (the last for the one-process check only); imports the
installed package (SITE), never the source beside this script. Each case runs in a
process of its own (an allocator is chosen before the first allocation):

- cupy: an FFT, matmul and sort pipeline on four streams gives the results of CuPy's own
  MemoryPool, and xlogrt served it (tag 2);
- cupy budget: with XLOGRT_BUDGET_BYTES=256M, a 1 GiB array raises CuPy's
  OutOfMemoryError naming the budget, and Numba's device_array Numba's CudaAPIError
  (CUDA_ERROR_OUT_OF_MEMORY, a MemoryError); what fits is still served;
- cupy log: XLOGRT_LOG_FILE shows CuPy's arrays allocated and freed under tag 2;
- numba: kernels on device arrays from xlogrt (NUMBA_CUDA_MEMORY_MANAGER=xlogrt_numba) give
  the results of Numba's own allocator, bit for bit, and each run's saxpy is within float32
  rounding of a float64 reference; get_memory_info agrees with cuMemGetInfo;
- together: torch, CuPy and Numba through xlogrt in one process (torch.from_dlpack of a
  CuPy array and back, a Numba kernel on the result), one Statistics covering the three tags;
- bench: ns per cupy.cuda.alloc + free of 256 B, 64 KiB, 1 MiB, 64 MiB with CuPy's
  MemoryPool, MemoryAsyncPool and xlogrt, alternating processes, medians.

Prints ok/FAIL lines; exit 0 when every check passes, 1 otherwise, 77 without a CUDA
device. Writes DIR/frameworks_results.json (DIR: --out, else $OUT, else .).
"""
import argparse
import csv
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# The installed package, not the source beside this script (which has no C library).
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]



def numpy_for_numba():
    """numba-cuda releases that still name np.row_stack, which NumPy 2.4 removed, fail to
    compile any kernel, with any allocator; np.vstack is what it named. A shim for the
    framework under test, not for xlogrt (the GPU machine's numba-cuda needs it)."""
    import numpy as np
    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack


BENCH_SIZES = [256, 64 << 10, 1 << 20, 64 << 20]
LOG_SIZES = [5 << 10, 3 << 17, 7 << 20]  # whole size classes of the caching layer
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def cu_mem_get_info():
    """cuMemGetInfo of the current context, straight from libcuda."""
    cuda = ctypes.CDLL("libcuda.so.1")
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    rc = cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
    return (free.value, total.value) if rc == 0 else None


# ---- the cases (child processes) ------------------------------------------------------------


def cupy_pipeline(mode):
    import cupy
    import numpy as np
    if mode == "xlogrt":
        import xlogrt_cupy
        xlogrt_cupy.install()
    rng = np.random.default_rng(7)
    out = []
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(4)]
    results = []
    for i, s in enumerate(streams):
        with s:  # every array of the stream's pipeline allocated (and so freed) on it
            x = cupy.asarray(rng.standard_normal(1 << 16).astype(np.complex64))
            f = cupy.fft.fft(x)
            a = cupy.asarray(rng.standard_normal((512, 512)).astype(np.float32))
            m = a @ a.T
            v = cupy.asarray(rng.integers(0, 1 << 30, 1 << 20).astype(np.int64))
            srt = cupy.sort(v)
            results.append((f, m, srt))
    for s in streams:
        s.synchronize()
    for f, m, srt in results:
        out.append({"fft": [float(abs(f).sum()), *map(float, cupy.asnumpy(f[:4].real))],
                    "matmul": [float(m.sum()), *map(float, cupy.asnumpy(m[0, :4]))],
                    "sort_sorted": bool((srt[1:] >= srt[:-1]).all()),
                    "sort_head": [int(v) for v in cupy.asnumpy(srt[:4])],
                    "sort_sum": int(srt.sum())})
    del results
    r = {"results": out}
    if mode == "xlogrt":
        import xlogrt_cupy
        r["cupy"] = xlogrt_cupy.stats()
        r["allocator"] = cupy.cuda.get_allocator() is xlogrt_cupy.malloc
    return r


def cupy_budget(mode):
    import cupy
    import xlogrt_cupy
    numpy_for_numba()
    from numba import cuda
    from numba.cuda.cudadrv.driver import CudaAPIError
    xlogrt_cupy.install()
    r = {}
    try:
        cupy.empty(1 << 30, dtype=cupy.uint8)
        r["cupy"] = None
    except cupy.cuda.memory.OutOfMemoryError as e:
        r["cupy"] = str(e)
    try:
        cuda.device_array(1 << 30, dtype="u1")
        r["numba"] = None
    except CudaAPIError as e:
        r["numba"] = [str(e), isinstance(e, MemoryError), "OUT_OF_MEMORY" in str(e.code) or e.code == 2]
    r["after_ok"] = bool(cupy.ones(1024, dtype=cupy.float32).sum() == 1024)
    return r


def cupy_log(mode):
    import cupy
    import xlogrt_cupy
    import xlogrt_torch
    xlogrt_cupy.install()
    kept = [cupy.empty(n, dtype=cupy.uint8) for n in LOG_SIZES]
    ptrs = [a.data.ptr for a in kept]
    del kept
    cupy.cuda.Device().synchronize()
    dev = cupy.cuda.runtime.getDevice()
    xlogrt_torch.flush_log(dev)
    return {"pointers": ptrs, "cupy": xlogrt_cupy.stats()}


def numba_kernels(mode):
    import numpy as np
    numpy_for_numba()
    from numba import cuda

    @cuda.jit
    def saxpy(a, x, y, out):
        i = cuda.grid(1)
        if i < x.size:
            out[i] = a * x[i] + y[i]

    @cuda.jit
    def block_sums(x, out):
        i = cuda.grid(1)
        if i < x.size:
            cuda.atomic.add(out, i % out.size, x[i])

    rng = np.random.default_rng(11)
    n = 1 << 20
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    dx, dy = cuda.to_device(x), cuda.to_device(y)
    dout = cuda.device_array_like(dx)
    saxpy[(n + 255) // 256, 256](np.float32(2.5), dx, dy, dout)
    ints = cuda.to_device(rng.integers(0, 100, n).astype(np.int64))
    sums = cuda.to_device(np.zeros(64, dtype=np.int64))
    block_sums[(n + 255) // 256, 256](ints, sums)
    cuda.synchronize()
    res = dout.copy_to_host()
    # The reference in float64. The kernel may contract a*x+y into one FMA (one float32
    # rounding) or round twice, so near cancellation its relative error is unbounded: the
    # bound is 4 float32 epsilons of |a*x| + |y| (either way within 2), plus the smallest
    # normal float32 (a result flushed to zero).
    ax, y64 = 2.5 * x.astype(np.float64), y.astype(np.float64)
    err = np.abs(res.astype(np.float64) - (ax + y64))
    f32 = np.finfo(np.float32)
    ratio = err / (4 * f32.eps * (np.abs(ax) + np.abs(y64)) + f32.tiny)
    worst = int(ratio.argmax())
    r = {"saxpy_sum": float(res.astype(np.float64).sum()), "saxpy_head": [float(v) for v in res[:4]],
         "saxpy_ok": bool(ratio[worst] <= 1.0),
         "saxpy_worst": {"i": worst, "x": float(x[worst]), "y": float(y[worst]), "got": float(res[worst]),
                         "want": float(ax[worst] + y64[worst]), "error_over_bound": float(ratio[worst])},
         "sums": [int(v) for v in sums.copy_to_host()]}
    ctx = cuda.current_context()
    r["manager"] = type(ctx.memory_manager).__name__
    if mode == "xlogrt":
        import xlogrt_numba
        info = ctx.get_memory_info()
        r["memory_info"] = [int(info.free), int(info.total)]
        r["driver_info"] = cu_mem_get_info()
        r["numba"] = xlogrt_numba.stats(ctx.device.id)
    return r


def together(mode):
    import torch
    import xlogrt_torch
    xlogrt_torch.install()  # torch first: the hooks need the pluggable allocator as torch's current one
    import cupy
    import xlogrt_cupy
    numpy_for_numba()
    from numba import cuda
    xlogrt_cupy.install()
    n = 1 << 20
    c = cupy.arange(n, dtype=cupy.float32)  # CuPy's (tag 2)
    t = torch.from_dlpack(c)  # the same memory
    t2 = t * 2 + 1  # torch's (tag 1)
    c2 = cupy.from_dlpack(t2)  # back to CuPy, the same memory as t2

    @cuda.jit
    def add(a, b, out):
        i = cuda.grid(1)
        if i < a.size:
            out[i] = a[i] + b[i]

    out = cuda.device_array(n, dtype="f4")  # Numba's (tag 3)
    add[(n + 255) // 256, 256](cuda.as_cuda_array(c), cuda.as_cuda_array(c2), out)
    cuda.synchronize()
    got = out.copy_to_host()
    import numpy as np
    want = np.arange(n, dtype=np.float32) * 3 + 1
    dev = torch.cuda.current_device()
    tags = {name: xlogrt_torch.tag_stats(tag, dev) for name, tag in
            (("torch", xlogrt_torch.TORCH_TAG), ("cupy", xlogrt_torch.CUPY_TAG), ("numba", xlogrt_torch.NUMBA_TAG))}
    return {"same_memory": int(t.data_ptr()) == int(c.data.ptr) and int(c2.data.ptr) == int(t2.data_ptr()),
            "result_ok": bool(np.array_equal(got, want)), "tags": tags, "device": xlogrt_torch.stats(dev),
            "numba_manager": type(cuda.current_context().memory_manager).__name__}


def bench(mode):
    import cupy
    if mode == "MemoryPool":
        cupy.cuda.set_allocator(cupy.cuda.MemoryPool().malloc)
    elif mode == "MemoryAsyncPool":
        cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)
    else:
        import xlogrt_cupy
        xlogrt_cupy.install()
    alloc = cupy.cuda.alloc
    r = {}
    for size in BENCH_SIZES:
        for _ in range(200):  # warm: the pool holds a block of the size
            alloc(size)
        reps = []
        for _ in range(5):
            k = 2000
            t0 = time.perf_counter_ns()
            for _ in range(k):
                alloc(size)  # the MemoryPointer goes at once: allocate + free
            reps.append((time.perf_counter_ns() - t0) / k)
        r[str(size)] = statistics.median(reps)
    cupy.cuda.Device().synchronize()
    return r


CASES = {"cupy": cupy_pipeline, "cupy_budget": cupy_budget, "cupy_log": cupy_log, "numba": numba_kernels,
         "together": together, "bench": bench}


# ---- the checks (parent) --------------------------------------------------------------------


def run(case, mode, env=None):
    e = dict(os.environ)
    for k in ("XLOGRT_BUDGET_BYTES", "XLOGRT_LOG_FILE", "NUMBA_CUDA_MEMORY_MANAGER", "CUPY_GPU_MEMORY_LIMIT"):
        e.pop(k, None)
    e.update(env or {})
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--case", case, "--mode", mode], env=e,
                           capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        print(f"  {case}/{mode} ran past 240 s", flush=True)
        return None
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        print(f"  {case}/{mode} exited {p.returncode}:\n{p.stderr[-3000:]}", flush=True)
        return None
    return json.loads(lines[-1])


def close(a, b, rel=1e-5):
    return all(abs(x - y) <= rel * max(1.0, abs(x), abs(y)) for x, y in zip(a, b)) and len(a) == len(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--case", choices=sorted(CASES))
    ap.add_argument("--mode", default="xlogrt")
    ap.add_argument("--rounds", type=int, default=3, help="bench: processes per allocator")
    args = ap.parse_args()
    if args.case:
        print(json.dumps(CASES[args.case](args.mode)), flush=True)
        return 0

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_int(0)
        if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
            raise OSError("no device")
    except OSError:
        print("SKIP: no CUDA device")
        return 77
    os.makedirs(args.out, exist_ok=True)
    results = {}
    t_start = time.time()

    # cupy: the same results as CuPy's own pool
    native, ours = run("cupy", "native"), run("cupy", "xlogrt")
    results["cupy"] = {"native": native, "xlogrt": ours}
    if native and ours:
        same = all(close(a["fft"], b["fft"]) and close(a["matmul"], b["matmul"]) and a["sort_head"] == b["sort_head"]
                   and a["sort_sum"] == b["sort_sum"] and b["sort_sorted"]
                   for a, b in zip(native["results"], ours["results"]))
        check(same and len(ours["results"]) == 4, "cupy: FFT, matmul and sort on 4 streams equal CuPy's own pool's")
        # (Not all freed at the end: CuPy's FFT plan cache keeps its work area.)
        check(ours["allocator"] and ours["cupy"]["allocations"] > 0 and ours["cupy"]["frees"] > 0,
              f"cupy: xlogrt served them under tag 2 ({ours['cupy']['allocations']} allocations, "
              f"{ours['cupy']['frees']} frees)")
    else:
        check(False, "cupy: both pipelines ran")

    # cupy budget (and Numba's error under the same budget)
    r = run("cupy_budget", "xlogrt", {"XLOGRT_BUDGET_BYTES": "256M", "NUMBA_CUDA_MEMORY_MANAGER": "xlogrt_numba"})
    results["cupy_budget"] = r
    if r:
        check(r["cupy"] is not None and "XLOGRT_BUDGET_BYTES" in r["cupy"],
              f"cupy budget: 1 GiB over 256M raises CuPy's OutOfMemoryError naming the budget ({r['cupy']})")
        check(r["numba"] is not None and "XLOGRT_BUDGET_BYTES" in r["numba"][0] and r["numba"][1] and r["numba"][2],
              f"numba budget: CudaAPIError(CUDA_ERROR_OUT_OF_MEMORY), a MemoryError, naming the budget ({r['numba']})")
        check(r["after_ok"], "cupy budget: what fits is still served")
    else:
        check(False, "cupy budget: the case ran")

    # cupy log
    log = os.path.join(args.out, "cupy_allocations.csv")
    if os.path.exists(log):
        os.remove(log)
    r = run("cupy_log", "xlogrt", {"XLOGRT_LOG_FILE": log})
    results["cupy_log"] = r
    if r and os.path.exists(log):
        with open(log, newline="") as f:
            rows = [row for row in csv.DictReader(f) if row.get("Tag") == "2"]
        allocs = {int(row["Pointer"], 16) for row in rows if row["Action"] == "allocate"}
        frees = {int(row["Pointer"], 16) for row in rows if row["Action"] == "free"}
        check(all(p in allocs and p in frees for p in r["pointers"]),
              "cupy log: CuPy's arrays are allocated and freed under tag 2")
        n = sum(1 for row in rows if row["Action"] == "allocate")
        check(n == r["cupy"]["allocations"], f"cupy log: {n} tag-2 allocate lines, as Statistics counted "
                                             f"({r['cupy']['allocations']})")
    else:
        check(False, "cupy log: the run completed and wrote the log")

    # numba
    native = run("numba", "native")
    ours = run("numba", "xlogrt", {"NUMBA_CUDA_MEMORY_MANAGER": "xlogrt_numba"})
    results["numba"] = {"native": native, "xlogrt": ours}
    if native and ours:
        check(ours["manager"] == "XlogrtNumbaManager", f"numba: the context's memory manager is xlogrt's ({ours['manager']})")
        # Each run against the float64 reference; the two runs bit for bit (the same kernels
        # on the same inputs), heads and atomic sums.
        same = (native["saxpy_head"] == ours["saxpy_head"] and close([native["saxpy_sum"]], [ours["saxpy_sum"]])
                and native["sums"] == ours["sums"])
        ok = native["saxpy_ok"] and ours["saxpy_ok"] and same

        def figures(r):
            return (f"saxpy_ok {r['saxpy_ok']}, worst {r['saxpy_worst']}, head {r['saxpy_head']}, "
                    f"sum {r['saxpy_sum']!r}, atomic sums {r['sums'][:8]}... (total {sum(r['sums'])})")
        check(ok, "numba: saxpy (within the float32 rounding bound of a float64 reference) and atomic sums on "
                  "xlogrt's arrays equal Numba's own allocator's"
                  + ("" if ok else f"\n  native: {figures(native)}\n  xlogrt: {figures(ours)}"))
        check(ours["numba"]["allocations"] >= 5, f"numba: xlogrt served them under tag 3 ({ours['numba']['allocations']})")
        mi, di = ours["memory_info"], ours["driver_info"]
        check(di is not None and mi[1] == di[1] and abs(mi[0] - di[0]) <= 64 << 20,
              f"numba: get_memory_info {mi} agrees with cuMemGetInfo {di}")
    else:
        check(False, "numba: both runs completed")

    # together
    r = run("together", "xlogrt", {"NUMBA_CUDA_MEMORY_MANAGER": "xlogrt_numba"})
    results["together"] = r
    if r:
        check(r["same_memory"], "together: torch.from_dlpack of a CuPy array and back share the memory")
        check(r["result_ok"], "together: a Numba kernel on CuPy's and torch's memory gives the right sums")
        t = r["tags"]
        counts = ", ".join(f"{k} {v['allocations']}" for k, v in t.items())
        check(all(t[k]["allocations"] > 0 for k in t) and r["numba_manager"] == "XlogrtNumbaManager",
              f"together: torch, CuPy and Numba all allocated through xlogrt ({counts})")
        check(sum(v["allocations"] for v in t.values()) == r["device"]["allocations"]
              and sum(v["current_bytes"] for v in t.values()) == r["device"]["current_bytes"],
              "together: one Statistics: the device's figures are the three tags' sums")
    else:
        check(False, "together: the case ran")

    # bench: alternating processes, medians
    modes = ["MemoryPool", "MemoryAsyncPool", "xlogrt"]
    runs = {m: [] for m in modes}
    for _ in range(args.rounds):
        for m in modes:
            b = run("bench", m)
            if b:
                runs[m].append(b)
    table = {m: {str(s): statistics.median([b[str(s)] for b in runs[m]]) if runs[m] else None for s in BENCH_SIZES}
             for m in modes}
    results["bench"] = {"runs": runs, "median_ns": table}
    print("  ns per cupy.cuda.alloc + free (median of process medians):")
    print("  " + "bytes".rjust(10) + "".join(m.rjust(18) for m in modes))
    for s in BENCH_SIZES:
        print("  " + str(s).rjust(10) + "".join((f"{table[m][str(s)]:.0f}" if table[m][str(s)] is not None else "-").rjust(18)
                                               for m in modes))
    check(all(runs[m] for m in ("MemoryPool", "xlogrt")), "bench: CuPy's MemoryPool and xlogrt ran in every round")

    results["wall_s"] = round(time.time() - t_start, 1)
    results["failures"] = failures
    with open(os.path.join(args.out, "frameworks_results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"test_frameworks: {'FAILED: ' + '; '.join(failures) if failures else 'all checks passed'} "
          f"({results['wall_s']} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
