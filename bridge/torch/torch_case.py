# SPDX-License-Identifier: Apache-2.0
"""One case of the PyTorch bridge's GPU tests, in a process of its own (a process cannot
switch allocators): prints one JSON line with what it measured. Run by
test_torch_bridge.py and bench_allocators.py, not by hand (but it can be).

    python3 torch_case.py [--build BUILD] --allocator A --case C [--log FILE]

--build: a Meson build directory to load the bridge from (default: the installed
xlogrt_torch package; the `async` allocator needs a build).

allocators: native (torch's caching allocator), xlogrt (the bridge with its hooks),
xlogrt-norecord (the bridge without the record_stream hook), async (a plain
cuMemAllocAsync pluggable allocator).
cases: train, budget, log, stats, record_stream, bench, micro.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def install_allocator(build, allocator):
    if allocator == "native":
        return None
    if allocator == "torch-async":
        # torch's own cudaMallocAsync backend, which torch reads when it is imported.
        if "backend:cudaMallocAsync" not in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
            raise SystemExit("torch-async: run with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync")
        return None
    if allocator == "async":
        if build is None:
            raise SystemExit("torch_case: the async allocator is built by Meson: pass --build")
        d = os.path.join(build, "bridge", "torch")
        path = os.path.join(d, "libxlogrt_torch_async_baseline.so")
        alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "xlogrt_baseline_malloc", "xlogrt_baseline_free")
        torch.cuda.memory.change_current_allocator(alloc)
        return None
    if build is not None:
        sys.path.insert(0, HERE)  # the module beside this file, over the build's libraries
    else:  # the installed package, not the source beside this script
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
    import xlogrt_torch
    xlogrt_torch.install(build, record_stream=(allocator != "xlogrt-norecord"))
    return xlogrt_torch


def model_and_data(seed=0, bs=16, seq=128, d_model=512):
    torch.manual_seed(seed)
    layer = torch.nn.TransformerEncoderLayer(d_model=d_model, nhead=8, dim_feedforward=2048, dropout=0.0,
                                             batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    x = torch.randn(bs, seq, d_model, device="cuda", generator=g)
    y = torch.randn(bs, seq, d_model, device="cuda", generator=g)
    return model, opt, x, y


def step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss


def case_train(bridge, args):
    # The math attention kernel and deterministic algorithms: the same program on two
    # allocators must then give the same losses (the allocator moves only addresses).
    torch.use_deterministic_algorithms(True, warn_only=True)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    model, opt, x, y = model_and_data()
    losses = []
    with sdpa_kernel(SDPBackend.MATH):
        for _ in range(args.steps):
            losses.append(step(model, opt, x, y).item())
    out = {"losses": losses}
    if bridge:
        out["xlogrt_allocations"] = bridge.stats()["allocations"]
    return out


def case_budget(bridge, args):
    budget = bridge.stats()["budget_bytes"] if bridge else None
    out = {"budget_bytes": budget}
    try:
        torch.empty(args.big_bytes, dtype=torch.uint8, device="cuda")
        out["raised"] = None
    except torch.OutOfMemoryError as e:
        out["raised"] = "torch.OutOfMemoryError"
        out["message"] = str(e)
    except Exception as e:  # any other error is a failure of the case, reported as such
        out["raised"] = type(e).__name__
        out["message"] = str(e)
    small = torch.ones(1024, device="cuda")  # what fits is still served
    out["after_ok"] = bool(small.sum().item() == 1024)
    return out


def case_log(bridge, args):
    # Distinctive sizes that are also whole size classes of the caching layer (the log
    # names the block's bytes, a class, which for these is the request).
    sizes = [5 << 10, 3 << 17, 7 << 20]
    kept = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in sizes]
    ptrs = [t.data_ptr() for t in kept]
    del kept
    torch.cuda.synchronize()
    bridge.flush_log()
    st = bridge.stats()
    return {"sizes": sizes, "pointers": [hex(p) for p in ptrs], "allocations": st["allocations"],
            "frees": st["frees"]}


def case_stats(bridge, args):
    s0 = bridge.stats()
    t = torch.empty(1 << 20, dtype=torch.float32, device="cuda")
    s1 = bridge.stats()
    del t
    torch.cuda.synchronize()
    s2 = bridge.stats()
    bridge.reap()
    s3 = bridge.stats()
    # Frees retire by themselves: 5,000 tensors of 8 MiB allocated and dropped, no reap.
    for _ in range(5000):
        t = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
        t.fill_(1)
        del t
    torch.cuda.synchronize()
    s4 = bridge.stats()
    return {"before": s0, "live": s1, "freed": s2, "reaped": s3, "churned": s4}


def case_record_stream(bridge, args):
    n = 64 << 20  # floats: 256 MiB
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    a = torch.full((n,), 1.0, device="cuda")
    out = torch.empty(n, device="cuda")
    side.wait_stream(main)
    with torch.cuda.stream(side):
        torch.cuda._sleep(args.sleep_cycles)  # the slow consumer: reads a only after this
        out.copy_(a)
    a.record_stream(side)
    ptr = a.data_ptr()
    del a  # freed on main while side has not read it yet
    b = torch.full((n,), 7.0, device="cuda")  # on main: may take a's memory
    reused = b.data_ptr() == ptr
    torch.cuda.synchronize()
    wrong = int((out != 1.0).sum().item())
    return {"reused": reused, "wrong_elements": wrong, "elements": n}


def case_bench(bridge, args):
    model, opt, x, y = model_and_data()
    for _ in range(args.warmup):
        step(model, opt, x, y)
    torch.cuda.synchronize()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step(model, opt, x, y)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return {"ms_per_step_median": statistics.median(times), "ms_per_step": times}


def case_micro(bridge, args):
    sizes = [256, 4096, 65536, 1 << 20, 3 << 20, 512, 16 << 10]
    for n in sizes * 10:  # warm the allocator's cache / pool
        del_me = torch.empty(n, dtype=torch.uint8, device="cuda")
        del del_me
    torch.cuda.synchronize()
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for i in range(args.iters):
            t = torch.empty(sizes[i % len(sizes)], dtype=torch.uint8, device="cuda")
            del t
        torch.cuda.synchronize()
        rounds.append((time.perf_counter() - t0) * 1e6 / args.iters)
    return {"us_per_pair_median": statistics.median(rounds), "us_per_pair": rounds}


CASES = {"train": case_train, "budget": case_budget, "log": case_log, "stats": case_stats,
         "record_stream": case_record_stream, "bench": case_bench, "micro": case_micro}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=None)
    p.add_argument("--allocator", required=True, choices=["native", "xlogrt", "xlogrt-norecord", "async", "torch-async"])
    p.add_argument("--case", required=True, choices=sorted(CASES))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--iters", type=int, default=20000)
    p.add_argument("--big-bytes", type=int, default=1 << 30)
    p.add_argument("--sleep-cycles", type=int, default=400_000_000)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"skip": "no CUDA device"}))
        return 77
    if args.case == "train":  # deterministic cuBLAS: set before CUDA starts
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    bridge = install_allocator(args.build, args.allocator)
    result = CASES[args.case](bridge, args)
    result.update({"case": args.case, "allocator": args.allocator})
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
