# SPDX-License-Identifier: Apache-2.0
"""Benchmark of torch's allocators on a GPU, alternating processes (one process cannot
switch allocators, and a CPU-bound step moves by +-20 % between processes): torch's own
(native), the xlogrt bridge (xlogrt), and torch's cudaMallocAsync backend (torch-async,
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync). `--allocators` picks others, e.g. the
plain cuMemAllocAsync pluggable allocator (async, async_baseline.cpp). Each round runs one process per allocator, in a
rotated order, for the training step (6-layer TransformerEncoder + AdamW, bs 16,
seq 128) and for a torch.empty + free micro-loop.

    python3 bridge/torch/bench_allocators.py --build BUILD [--rounds 5] [--out DIR]

Prints, per allocator, the median and range over processes of each process's median
ms/step and us per torch.empty + free, and the ratios of the medians to native; writes
DIR/bench_allocators.json.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ALLOCATORS = ["native", "xlogrt", "torch-async"]


def run(build, allocator, case, extra):
    cmd = [sys.executable, os.path.join(HERE, "torch_case.py"), "--build", build, "--allocator", allocator,
           "--case", case, *extra]
    env = dict(os.environ)
    if allocator == "torch-async":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        raise SystemExit(f"{allocator}/{case} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--allocators", default=",".join(ALLOCATORS))
    args = ap.parse_args()
    allocators = args.allocators.split(",")
    if "native" not in allocators:
        raise SystemExit("bench_allocators: the ratios need native among --allocators")
    if args.rounds < 5:
        raise SystemExit("bench_allocators: at least 5 rounds (processes per allocator)")
    import torch
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 77
    step = {a: [] for a in allocators}
    micro = {a: [] for a in allocators}
    for r in range(args.rounds):
        k = r % len(allocators)
        order = allocators[k:] + allocators[:k]
        for a in order:
            step[a].append(run(args.build, a, "bench", ["--steps", str(args.steps)])["ms_per_step_median"])
            micro[a].append(run(args.build, a, "micro", ["--iters", str(args.iters)])["us_per_pair_median"])
        print(f"round {r + 1}: " + ", ".join(f"{a} {step[a][-1]:.2f} ms {micro[a][-1]:.2f} us" for a in order),
              flush=True)
    summary = {}
    print(f"\n{'allocator':<11} {'ms/step median':>15} {'range':>17} {'x native':>9} "
          f"{'us/empty+free':>14} {'range':>17} {'x native':>9}")
    for a in allocators:
        sm, mm = statistics.median(step[a]), statistics.median(micro[a])
        summary[a] = {"ms_per_step": step[a], "ms_per_step_median": sm, "us_per_pair": micro[a], "us_per_pair_median": mm}
        print(f"{a:<11} {sm:>15.3f} {min(step[a]):>8.3f}-{max(step[a]):<8.3f} "
              f"{sm / statistics.median(step['native']):>9.3f} {mm:>14.3f} "
              f"{min(micro[a]):>8.3f}-{max(micro[a]):<8.3f} {mm / statistics.median(micro['native']):>9.3f}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_allocators.json"), "w") as f:
        json.dump({"rounds": args.rounds, "steps": args.steps, "iters": args.iters, "results": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
