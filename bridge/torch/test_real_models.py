# SPDX-License-Identifier: Apache-2.0
"""The bridge in real programs, on a GPU: installed by pip as a user installs it, then
real_models.py's `mixed` case (after install(): transformers, torchvision, pyarrow and
pandas imported; ResNet-50 and GPT-2 training steps; 10,000 torch.cuda.Stream() objects;
10,000 streams created, used once through torch.cuda.ExternalStream and destroyed;
empty_cache and the memory fraction) through torch's own allocator and through xlogrt,
in separate processes, alternating, with the device's memory watched from outside.

    python3 bridge/torch/test_real_models.py [--rounds 2] [--out DIR]

Checks: pip installs the package into a fresh --target directory; each process exits 0;
xlogrt's losses equal torch's (deterministic settings; the largest relative difference is
printed, and must be at most 1e-3); torch.cuda.empty_cache and
set_per_process_memory_fraction reach xlogrt; an allocation over the fraction raises
torch.OutOfMemoryError naming the budget. Prints xlogrt's memory_stats beside torch's and
the device's peak memory per process. Exit 0, 1 on a failed check, 77 without a GPU.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from nvml_watch import run_measured  # noqa: E402
from real_models import allocator_env  # noqa: E402

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def rel_diff(a, b):
    return max((abs(x - y) / max(abs(x), abs(y), 1e-12) for x, y in zip(a, b)), default=float("inf"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--target", default=None, help="a directory the package was pip-installed into (default: install it now)")
    args = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 77
    os.makedirs(args.out, exist_ok=True)
    target = args.target
    if target is None:
        target = tempfile.mkdtemp(prefix="xlogrt_torch_site_")
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index",
                            "--target", target, HERE], capture_output=True, text=True)
        check(p.returncode == 0, f"pip install --target {target} ./bridge/torch ({time.perf_counter() - t0:.0f} s)")
        if p.returncode != 0:
            print(p.stdout[-3000:] + p.stderr[-3000:])
            return 1
    libs = sorted(f for f in os.listdir(os.path.join(target, "xlogrt_torch")) if f.endswith(".so"))
    check(libs == ["libxlogrt_torch.so", "libxlogrt_torch_hooks.so"], f"the package holds both libraries ({libs})")
    r = subprocess.run([sys.executable, os.path.join(HERE, "check_exports.py"),
                        *[os.path.join(target, "xlogrt_torch", f) for f in libs]], capture_output=True, text=True)
    print(r.stdout.strip())
    check(r.returncode == 0, "the installed libraries export xlogrt_* alone")

    base = dict(os.environ, PYTHONPATH=target + os.pathsep + os.environ.get("PYTHONPATH", ""),
                CUBLAS_WORKSPACE_CONFIG=":4096:8")
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "XLOGRT_CACHE", "XLOGRT_BUDGET_BYTES"):
        base.pop(k, None)
    results = {"native": [], "xlogrt": []}
    for rnd in range(args.rounds):
        order = ["native", "xlogrt"] if rnd % 2 == 0 else ["xlogrt", "native"]
        for a in order:
            cmd = [sys.executable, os.path.join(HERE, "real_models.py"), "--allocator", a, "--case", "mixed",
                   "--handshake"]
            try:
                res, peak = run_measured(cmd, dict(base, **allocator_env(a)))
            except RuntimeError as e:
                check(False, f"round {rnd + 1}: {a} runs the mixed program: {e}")
                continue
            res["device_peak"] = peak
            results[a].append(res)
            print(f"round {rnd + 1} {a}: {res['seconds']:.1f} s, device peak over baseline {peak / 2**20:,.0f} MiB, "
                  f"resnet losses {[round(x, 4) for x in res['resnet']['losses']]}", flush=True)
    if not results["native"] or not results["xlogrt"]:
        return 1
    n, x = results["native"][0], results["xlogrt"][0]
    check(True, f"xlogrt: install(), then transformers, torchvision, pyarrow (sum {x['arrow_sum']}) and pandas "
                "imported, and the process lived")
    for model in ("resnet", "gpt2"):
        d = rel_diff(n[model]["losses"], x[model]["losses"])
        same = n[model]["losses"] == x[model]["losses"]
        check(d <= 1e-3, f"{model}: xlogrt's losses equal torch's ({'bitwise' if same else f'largest relative difference {d:.2e}'}):"
                         f" {x[model]['losses']}")
    check(x["stream_churn_sum"] == n["stream_churn_sum"], "10,000 torch.cuda.Stream() objects, each used once")
    check(x["created_stream_churn_sum"] == n["created_stream_churn_sum"],
          f"10,000 streams created, used once through torch.cuda.ExternalStream and destroyed (the driver handed "
          f"out {x['created_stream_handles']} distinct handles; xlogrt: {x['stream_ids']} stream ids in use, "
          f"{x['streams_recycled']} recycled)")
    check(x["stream_ids"] <= 64, f"the stream churn left {x['stream_ids']} stream ids in use (at most 64)")
    live = x["stats_with_64mib_live"]
    check(live["allocated_bytes.all.current"] >= 64 << 20, "memory_stats counts the 64 MiB tensor")
    after = x["stats_after_empty_cache"]
    check(live["xlogrt.held_bytes"] >= live["xlogrt.cached_bytes"] + live["allocated_bytes.all.current"],
          "xlogrt.held_bytes counts the live and the cached bytes")
    check(after["xlogrt.cached_bytes"] == 0 and after["xlogrt.held_bytes"] == after["allocated_bytes.all.current"],
          f"torch.cuda.empty_cache reaches xlogrt (cached {after['xlogrt.cached_bytes']}, held "
          f"{after['xlogrt.held_bytes']} = live {after['allocated_bytes.all.current']})")
    total = torch.cuda.get_device_properties(0).total_memory
    check(x["budget_after_fraction"] is not None and abs(x["budget_after_fraction"] - total // 2) <= 1,
          f"set_per_process_memory_fraction(0.5) sets the budget ({x['budget_after_fraction']} of {total})")
    check("budget" in x["over_fraction"], f"over the fraction: torch.OutOfMemoryError naming the budget "
                                          f"({x['over_fraction'][:160]})")
    print("\nmemory_stats with the 64 MiB tensor live (same program, separate processes):")
    print(f"  {'key':<32} {'torch native':>16} {'xlogrt':>16}")
    for k in sorted(set(live) | set(n["stats_with_64mib_live"])):
        if k.startswith(("allocated_bytes.all", "reserved_bytes.all", "allocation.all", "num_", "xlogrt.")):
            print(f"  {k:<32} {str(n['stats_with_64mib_live'].get(k, '-')):>16} {str(live.get(k, '-')):>16}")
    print("\ndevice peak over baseline (NVML, outside the process), per process: "
          + "; ".join(f"{a} " + ", ".join(f"{r['device_peak'] / 2**20:,.0f} MiB" for r in results[a]) for a in results))
    with open(os.path.join(args.out, "real_models_results.json"), "w") as f:
        json.dump({"results": results, "failures": failures}, f, indent=1)
    print(f"\ntest_real_models: {'FAILED: ' + '; '.join(failures) if failures else 'all checks passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
