# SPDX-License-Identifier: Apache-2.0
"""Device memory of real models under each of torch's allocators, on a GPU: each
allocator in its own process (real_models.py), alternating, the device's memory watched
from outside the process (NVML). Per workload and allocator: the peak device footprint
over the process's baseline, the allocator's own live peak and the time per step or
request, as medians and ranges over the rounds; then each allocator's peak against the
live peak (torch's count), xlogrt without its cache, torch's cudaMallocAsync backend and
the best of torch's allocators in the run.

    python3 bridge/torch/bench_footprint.py [--rounds 3] [--workloads resnet,gpt2-serve,gpt2-train]
        [--allocators native,expandable,torch-async,xlogrt-nocache,xlogrt] [--steps N]
        [--traces DIR [--trace-steps N]] [--out DIR]

xlogrt comes from the installed xlogrt_torch package (PYTHONPATH). --traces DIR: one
more xlogrt process per workload with XLOGRT_LOG_FILE, its allocation log written to
DIR/<workload>.csv (for bench/footprint, which replays such logs on SimDriver).
Writes DIR/bench_footprint.json and prints the table.
"""
import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from nvml_watch import run_measured  # noqa: E402
from real_models import allocator_env  # noqa: E402

STEPS = {"resnet": 12, "gpt2-train": 12, "gpt2-serve": 24}
MIB = 2**20


def run(workload, allocator, steps, extra_env=None):
    cmd = [sys.executable, os.path.join(HERE, "real_models.py"), "--allocator", allocator, "--case", workload,
           "--steps", str(steps), "--handshake"]
    env = dict(os.environ)
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "XLOGRT_CACHE", "XLOGRT_LOG_FILE", "XLOGRT_BUDGET_BYTES",
              "XLOGRT_BACKEND"):
        env.pop(k, None)
    env.update(allocator_env(allocator))
    env.update(extra_env or {})
    res, peak = run_measured(cmd, env)
    t = res.get("ms_per_step_median", res.get("ms_per_request_median"))
    return {"device_peak": peak, "live_peak": res["live_peak"], "ms": t, "seconds": res["seconds"],
            "checksum": res.get("checksum"), "losses": res.get("losses"),
            "pool_reserved_peak": res.get("pool_reserved_peak"), "small_pool_reserved_peak": res.get("small_pool_reserved_peak")}


def med(xs):
    return statistics.median(xs)


TORCH_ALLOCATORS = ("native", "expandable", "torch-async")


def summarize(data, workloads, allocators, rounds):
    """Prints each workload's table and returns the summary. Beside each allocator's device
    peak (median of its processes): that peak over the live peak as torch counts it (the
    median over torch's own allocators' processes, when any ran; else the allocator's own
    count, which for xlogrt includes the size classes' rounding), over xlogrt without its
    cache, over torch's cudaMallocAsync backend, and over the best of torch's allocators."""
    summary = {}
    for w in workloads:
        print(f"\n{w} ({rounds} processes per allocator; MiB over each process's baseline, NVML):")
        print(f"  {'allocator':<15} {'device peak':>12} {'range':>17} {'live peak':>10} {'ms median':>10} "
              f"{'x live':>7} {'x no-cache':>10} {'x torch-async':>13} {'x best torch':>12}")
        medians = {a: med([x["device_peak"] for x in data[w][a]]) for a in allocators}
        ref_nc = medians.get("xlogrt-nocache")
        ref_async = medians.get("torch-async")
        peers = [medians[a] for a in allocators if a in TORCH_ALLOCATORS]
        best_peer = min(peers) if peers else None
        torch_live = [x["live_peak"] for a in allocators if a in TORCH_ALLOCATORS for x in data[w][a]]
        summary[w] = {}
        for a in allocators:
            peaks = [x["device_peak"] for x in data[w][a]]
            m = medians[a]
            live = med([x["live_peak"] for x in data[w][a]])
            ref_live = med(torch_live) if torch_live else live
            ms = med([x["ms"] for x in data[w][a]])
            # None (printed "-", null in the JSON) where the reference did not run.
            x = {k: m / ref if ref else None
                 for k, ref in (("live", ref_live), ("no-cache", ref_nc), ("torch-async", ref_async),
                                ("best torch", best_peer))}
            r = {k: f"{v:.3f}" if v is not None else "-" for k, v in x.items()}
            summary[w][a] = {"device_peak_mib": [p / MIB for p in peaks], "device_peak_median_mib": m / MIB,
                             "live_peak_median_mib": live / MIB, "ms_median": ms, "x": x}
            print(f"  {a:<15} {m / MIB:>12,.0f} {min(peaks) / MIB:>8,.0f}-{max(peaks) / MIB:<8,.0f} "
                  f"{live / MIB:>10,.0f} {ms:>10.1f} {r['live']:>7} {r['no-cache']:>10} "
                  f"{r['torch-async']:>13} {r['best torch']:>12}")
        sums = {x["checksum"] for a in allocators for x in data[w][a] if x["checksum"] is not None}
        if sums:
            print(f"  outputs: {'identical' if len(sums) == 1 else 'DIFFER'} across allocators and rounds")
    return summary


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workloads", default="resnet,gpt2-serve,gpt2-train")
    ap.add_argument("--allocators", default="native,expandable,torch-async,xlogrt-nocache,xlogrt")
    ap.add_argument("--steps", type=int, default=None, help="steps or requests per process (default: per workload)")
    ap.add_argument("--traces", default=None)
    ap.add_argument("--trace-steps", type=int, default=None, help="steps or requests of the traced process")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 77
    workloads, allocators = args.workloads.split(","), args.allocators.split(",")
    data = {w: {a: [] for a in allocators} for w in workloads}
    for w in workloads:
        steps = args.steps or STEPS[w]
        for r in range(args.rounds):
            k = r % len(allocators)
            order = allocators[k:] + allocators[:k]
            for a in order:
                data[w][a].append(run(w, a, steps))
            print(f"{w} round {r + 1}: " + ", ".join(f"{a} {data[w][a][-1]['device_peak'] / MIB:,.0f} MiB"
                                                     for a in order), flush=True)
        if args.traces:
            os.makedirs(args.traces, exist_ok=True)
            log = os.path.join(args.traces, f"{w}.csv")
            if os.path.exists(log):
                os.remove(log)
            t = run(w, "xlogrt", args.trace_steps or steps, {"XLOGRT_LOG_FILE": log})
            print(f"{w}: allocation log {log} ({os.path.getsize(log) / MIB:.1f} MiB, device peak "
                  f"{t['device_peak'] / MIB:,.0f} MiB)", flush=True)
    summary = summarize(data, workloads, allocators, args.rounds)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_footprint.json"), "w") as f:
        json.dump({"rounds": args.rounds, "raw": data, "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
