# SPDX-License-Identifier: Apache-2.0
"""The PyTorch bridge on a GPU: each case runs torch_case.py in fresh processes (one per
allocator) and checks what it printed.

    python3 bridge/torch/test_torch_bridge.py [--build BUILD] [--out DIR]

--build: a Meson build directory to load the bridge from (default: the installed
xlogrt_torch package).

- train: a 6-layer TransformerEncoder with AdamW gives the same losses on xlogrt as on
  torch's own allocator, and xlogrt did serve its allocations;
- budget: XLOGRT_BUDGET_BYTES=256M stops a 1 GiB tensor with torch.OutOfMemoryError that
  names the budget, and what fits is still served;
- log: XLOGRT_LOG_FILE holds torch's allocations (sizes, pointers, tag 1) and frees, as
  many as Statistics counted, and BUILD/bench/log_replay replays it (when built);
- stats: the figures read from Python follow a 4 MiB tensor's life, and, with the cache
  off, 5,000 freed 8 MiB tensors leave true figures without a reap;
- record_stream: a tensor read on a side stream by a slow consumer, freed and its memory
  reallocated on the main stream, stays correct on torch's allocator and on xlogrt, and is
  corrupted on xlogrt without the record_stream hook (proof that the case can fail).
Exit 0 when every check passes, 1 otherwise, 77 without a CUDA device. Writes
DIR/torch_bridge_results.json (DIR: --out, else $OUT, else the current directory).
"""
import argparse
import csv
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def run(build, allocator, case, env=None, extra=()):
    e = dict(os.environ)
    e.update(env or {})
    cmd = [sys.executable, os.path.join(HERE, "torch_case.py"), *(["--build", build] if build else []), "--allocator", allocator,
           "--case", case, *extra]
    p = subprocess.run(cmd, env=e, capture_output=True, text=True)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        print(f"  {allocator}/{case} exited {p.returncode}:\n{p.stderr[-3000:]}", flush=True)
        return None
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=None)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 77
    os.makedirs(args.out, exist_ok=True)
    results = {}

    # train
    native = run(args.build, "native", "train")
    ours = run(args.build, "xlogrt", "train")
    results["train"] = {"native": native, "xlogrt": ours}
    if native and ours:
        a, b = native["losses"], ours["losses"]
        worst = max(abs(x - y) / max(abs(x), 1e-30) for x, y in zip(a, b))
        print(f"  losses native {a[0]:.6f} .. {a[-1]:.6f}, xlogrt {b[0]:.6f} .. {b[-1]:.6f}, "
              f"largest relative difference {worst:.3g}, bitwise equal: {a == b}")
        check(len(a) == len(b) and worst <= 1e-5, "train: the same losses on xlogrt as on torch's allocator")
        check(a[-1] < a[0], "train: the loss goes down (the steps train)")
        check(ours["xlogrt_allocations"] > 0, "train: xlogrt served the run's allocations")
    else:
        check(False, "train: both runs completed")

    # budget
    budget = 256 << 20
    r = run(args.build, "xlogrt", "budget", {"XLOGRT_BUDGET_BYTES": "256M"}, ["--big-bytes", str(1 << 30)])
    results["budget"] = r
    if r:
        msg = r.get("message", "")
        print(f"  message: {msg[:300]}")
        check(r["budget_bytes"] == budget, "budget: XLOGRT_BUDGET_BYTES=256M is the device's budget")
        check(r["raised"] == "torch.OutOfMemoryError", "budget: a 1 GiB tensor raises torch.OutOfMemoryError")
        check("XLOGRT_BUDGET_BYTES" in msg and str(budget) in msg, "budget: the message names the budget")
        check(r["after_ok"], "budget: a tensor that fits is still served")
    else:
        check(False, "budget: the run completed")

    # log
    log = os.path.join(args.out, "torch_allocations.csv")
    if os.path.exists(log):
        os.remove(log)
    r = run(args.build, "xlogrt", "log", {"XLOGRT_LOG_FILE": log})
    results["log"] = r
    if r and os.path.exists(log):
        with open(log, newline="") as f:
            rows = [row for row in csv.DictReader(f) if row.get("Tag") == "1"]
        allocs = [row for row in rows if row["Action"] == "allocate"]
        frees = {int(row["Pointer"], 16) for row in rows if row["Action"] == "free"}
        for n, p in zip(r["sizes"], r["pointers"]):
            hit = [row for row in allocs if int(row["Size"]) == n and int(row["Pointer"], 16) == int(p, 16)]
            check(len(hit) >= 1 and int(p, 16) in frees, f"log: torch's {n}-byte tensor is allocated and freed in the log")
        check(len(allocs) == r["allocations"], f"log: {len(allocs)} allocate lines, as Statistics counted ({r['allocations']})")
        check(sum(1 for row in rows if row["Action"] == "free") == r["frees"], "log: as many free lines as frees")
        replay = os.path.join(args.build or "", "bench", "log_replay")
        if args.build and os.path.exists(replay):
            p = subprocess.run([replay, log, "1"], capture_output=True, text=True)
            print("  " + "\n  ".join(p.stdout.strip().splitlines()[-6:]))
            check(p.returncode == 0, "log: log_replay replays it")
        else:
            print(f"  ({replay} not built: configure with -Dbenchmarks=true to replay the log)")
    else:
        check(False, "log: the run completed and wrote the log")

    # stats
    r = run(args.build, "xlogrt", "stats", {"XLOGRT_CACHE": "0"})  # every free goes to the pool, queued
    results["stats"] = r
    if r:
        b, l, f, z = r["before"], r["live"], r["freed"], r["reaped"]
        check(l["current_bytes"] - b["current_bytes"] == 4 << 20, "stats: a 4 MiB tensor adds 4 MiB of current bytes")
        check(l["allocations"] == b["allocations"] + 1, "stats: one allocation")
        check(f["current_bytes"] == b["current_bytes"] and f["frees"] == b["frees"] + 1, "stats: its free is counted")
        check(z["bytes_outstanding"] == b["bytes_outstanding"], "stats: after reap the bytes outstanding are back")
        c = r["churned"]
        check(c["bytes_outstanding"] <= c["current_bytes"] + c["cached_bytes"] + (64 << 20),
              f"stats: 5,000 tensors of 8 MiB freed without a reap leave true figures (held {c['bytes_outstanding']:,} B, "
              f"live {c['current_bytes']:,} B, cached {c['cached_bytes']:,} B)")
    else:
        check(False, "stats: the run completed")

    # record_stream
    results["record_stream"] = {}
    for allocator, must_be_correct in (("native", True), ("xlogrt", True), ("xlogrt-norecord", False)):
        r = run(args.build, allocator, "record_stream")
        results["record_stream"][allocator] = r
        if not r:
            check(False, f"record_stream: the {allocator} run completed")
            continue
        print(f"  {allocator}: memory reused {r['reused']}, {r['wrong_elements']} of {r['elements']} elements wrong")
        if must_be_correct:
            check(r["wrong_elements"] == 0, f"record_stream: the side stream reads what was written ({allocator})")
        else:
            check(r["reused"] and r["wrong_elements"] > 0,
                  "record_stream: without the hook the memory is reused under the slow reader and the result is corrupt")

    with open(os.path.join(args.out, "torch_bridge_results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"{'FAILED' if failures else 'PASSED'}: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
