# SPDX-License-Identifier: Apache-2.0
"""Real models through one allocator, in a process of its own (a process cannot switch
allocators): prints one JSON line with what it measured. Run by test_real_models.py and
bench_footprint.py, which watch the device's memory from outside the process.

    python3 real_models.py --allocator A --case C [--steps N] [--seed S] [--handshake]

allocators: native (torch's caching allocator), expandable (the same with
expandable_segments), torch-async (torch's cudaMallocAsync backend), xlogrt (the bridge,
from the installed xlogrt_torch package, or --build BUILD: its default stack, over the
virtual memory base where the device has it), xlogrt-nocache (the same with
XLOGRT_CACHE=0), xlogrt-256k and xlogrt-64k (the cache for blocks up to that size only),
xlogrt-vmm and xlogrt-vmm-nocache (the virtual memory base named, XLOGRT_BACKEND=vmm),
xlogrt-pool and xlogrt-pool-nocache (the device's memory pool, XLOGRT_BACKEND=pool),
xlogrt-smallpool and xlogrt-onepool (the pool base, blocks up to 1 MiB from a pool of their
own or one pool for all: XLOGRT_CACHE=small_pool_bytes=1M or 0).
torch reads PYTORCH_CUDA_ALLOC_CONF and xlogrt XLOGRT_CACHE and XLOGRT_BACKEND from the
environment: the caller sets them (allocator_env below).
cases:
- resnet: torchvision ResNet-50 training (cuDNN, bf16 autocast, channels_last, SGD);
- gpt2-train: transformers GPT-2 small training (bf16 autocast, AdamW), sequence length
  drawn per step from 64-1024 with the tokens per batch constant;
- gpt2-serve: GPT-2 medium (24 layers, width 1024, bf16) serving requests of random batch
  1-32 and prompt 16-896 tokens, 32 new tokens each (generate, KV cache);
- mixed: the bridge's real-program test: after install(), transformers, torchvision,
  pyarrow and pandas are imported; a ResNet-50 and a GPT-2 training step, 10,000
  torch.cuda.Stream() objects each used once, empty_cache and the memory fraction.
Models have random weights (nothing is downloaded); every run of a case with one seed
does the same work. --handshake: print READY once CUDA is initialised and wait for a line
on stdin before the work (the caller reads the device's baseline memory between).
"""
import argparse
import json
import os
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

ALLOCATOR_ENV = {
    "native": {},
    "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "torch-async": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
    "xlogrt": {},
    "xlogrt-nocache": {"XLOGRT_CACHE": "0"},
    "xlogrt-256k": {"XLOGRT_CACHE": "max_block_bytes=256K"},
    "xlogrt-64k": {"XLOGRT_CACHE": "max_block_bytes=64K"},
    "xlogrt-smallpool": {"XLOGRT_BACKEND": "pool", "XLOGRT_CACHE": "small_pool_bytes=1M"},
    "xlogrt-onepool": {"XLOGRT_BACKEND": "pool", "XLOGRT_CACHE": "small_pool_bytes=0"},
    "xlogrt-vmm": {"XLOGRT_BACKEND": "vmm"},
    "xlogrt-vmm-nocache": {"XLOGRT_BACKEND": "vmm", "XLOGRT_CACHE": "0"},
    "xlogrt-pool": {"XLOGRT_BACKEND": "pool"},
    "xlogrt-pool-nocache": {"XLOGRT_BACKEND": "pool", "XLOGRT_CACHE": "0"},
}


def allocator_env(allocator):
    """The environment variables a process of `allocator` needs."""
    return dict(ALLOCATOR_ENV[allocator])


def install(allocator, build):
    if allocator.startswith("xlogrt"):
        if build:
            sys.path.insert(0, HERE)  # the module beside this file, over the build's libraries
        else:  # the installed package, not the source beside this script
            sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
        import xlogrt_torch
        xlogrt_torch.install(build)
        return xlogrt_torch
    return None


def deterministic(torch, seed):
    torch.manual_seed(seed)
    random.seed(seed)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)


def sync_ms(torch, t0):
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def resnet(torch, steps, seed, batch=32):
    import torchvision
    deterministic(torch, seed)
    model = torchvision.models.resnet50(weights=None).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator(device="cuda").manual_seed(seed)
    losses, ms = [], []
    for _ in range(steps):
        x = torch.randn(batch, 3, 224, 224, device="cuda", generator=g).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,), device="cuda", generator=g)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        ms.append(sync_ms(torch, t0))
    return {"losses": losses, "ms_per_step": ms}


def gpt2_train(torch, steps, seed, tokens=8192, fixed=None):
    from transformers import GPT2Config, GPT2LMHeadModel
    deterministic(torch, seed)
    model = GPT2LMHeadModel(GPT2Config(attn_implementation="eager")).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = random.Random(seed)
    g = torch.Generator(device="cuda").manual_seed(seed)
    losses, ms = [], []
    for _ in range(steps):
        seq = fixed or rng.choice([64, 128, 192, 256, 384, 512, 640, 768, 896, 1024])
        ids = torch.randint(0, 50257, (max(1, tokens // seq), seq), device="cuda", generator=g)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
        ms.append(sync_ms(torch, t0))
    return {"losses": losses, "ms_per_step": ms}


def gpt2_serve(torch, requests, seed):
    from transformers import GPT2Config, GPT2LMHeadModel
    deterministic(torch, seed)
    cfg = GPT2Config(n_layer=24, n_embd=1024, n_head=16, attn_implementation="eager")
    model = GPT2LMHeadModel(cfg).cuda().to(torch.bfloat16).eval()
    rng = random.Random(seed)
    g = torch.Generator(device="cuda").manual_seed(seed)
    ms, checksum = [], 0
    with torch.no_grad():
        for _ in range(requests):
            batch, prompt = rng.randint(1, 32), rng.randint(16, 896)
            ids = torch.randint(0, 50257, (batch, prompt), device="cuda", generator=g)
            t0 = time.perf_counter()
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, min_new_tokens=32,
                                 do_sample=False, pad_token_id=0)
            ms.append(sync_ms(torch, t0))
            checksum = (checksum * 31 + int(out[:, -32:].sum().item())) % (1 << 61)
    return {"ms_per_request": ms, "checksum": checksum}


def stream_churn(torch, n):
    """n torch.cuda.Stream() objects, each used once for an allocation and a kernel."""
    total = 0.0
    for i in range(n):
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            x = torch.full((1024,), float(i % 7), device="cuda")
            total += float(x[:1].sum().item())
            del x
        del s
    return total


def created_stream_churn(torch, n):
    """n CUDA streams created (cuStreamCreate, non-blocking), each used once by torch
    through torch.cuda.ExternalStream for an allocation, a kernel and a free, then
    destroyed: the churn of libraries that make streams of their own. Returns the sum the
    kernels gave and how many distinct handles the driver handed out."""
    import ctypes
    cu = ctypes.CDLL("libcuda.so.1")
    total, handles = 0.0, set()
    for i in range(n):
        h = ctypes.c_void_p()
        if cu.cuStreamCreate(ctypes.byref(h), 1) != 0:
            raise RuntimeError(f"cuStreamCreate failed at stream {i}")
        handles.add(h.value)
        s = torch.cuda.ExternalStream(h.value)
        with torch.cuda.stream(s):
            x = torch.full((1024,), float(i % 7), device="cuda")
            total += float(x[:1].sum().item())
            del x
        s.synchronize()
        del s
        if cu.cuStreamDestroy_v2(h) != 0:
            raise RuntimeError(f"cuStreamDestroy failed at stream {i}")
    return total, len(handles)


def mixed(torch, xl, seed):
    # Everything a real program loads, after install(): the crash was here.
    import pandas
    import pyarrow
    import torchvision  # noqa: F401
    import transformers  # noqa: F401
    out = {}
    table = pyarrow.table({"a": list(range(1000)), "b": [float(i) / 3 for i in range(1000)]})
    out["arrow_sum"] = pyarrow.compute.sum(table["a"]).as_py()
    out["pandas_mean"] = float(pandas.DataFrame({"a": range(1000)})["a"].mean())
    out["resnet"] = resnet(torch, 3, seed)
    out["gpt2"] = gpt2_train(torch, 3, seed, fixed=256)
    out["stream_churn_sum"] = stream_churn(torch, 10_000)
    out["created_stream_churn_sum"], out["created_stream_handles"] = created_stream_churn(torch, 10_000)
    if xl is not None:
        s = xl.memory_stats()
        out["stream_ids"], out["streams_recycled"] = s["xlogrt.stream_ids"], s["xlogrt.streams_recycled"]
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    if xl is not None:
        s = xl.memory_stats()
        out["stats_with_64mib_live"] = s
        del x
        torch.cuda.empty_cache()  # through the pluggable allocator's reset hook
        out["stats_after_empty_cache"] = xl.memory_stats()
        torch.cuda.set_per_process_memory_fraction(0.5)  # through the memory-fraction hook
        out["budget_after_fraction"] = xl.memory_stats()["xlogrt.budget_bytes"]
        try:
            torch.empty(int(torch.cuda.get_device_properties(0).total_memory * 0.6), dtype=torch.uint8, device="cuda")
            out["over_fraction"] = "allocated"
        except torch.OutOfMemoryError as e:
            out["over_fraction"] = str(e)[:300]
        out["version"] = xl.__version__
    else:
        out["stats_with_64mib_live"] = {k: v for k, v in torch.cuda.memory_stats().items()
                                        if k.startswith(("allocated_bytes.all", "reserved_bytes.all", "allocation.all",
                                                         "num_alloc_retries", "num_ooms", "num_device_alloc"))}
        del x
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--allocator", required=True, choices=sorted(ALLOCATOR_ENV))
    ap.add_argument("--case", required=True, choices=["resnet", "gpt2-train", "gpt2-serve", "mixed"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--build", default=None, help="a Meson build directory (default: the installed package)")
    ap.add_argument("--handshake", action="store_true")
    args = ap.parse_args()
    for k, v in allocator_env(args.allocator).items():
        if os.environ.get(k) != v:
            raise SystemExit(f"real_models: run {args.allocator} with {k}={v} in the environment")
    import torch
    xl = install(args.allocator, args.build)
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    if args.handshake:
        print("READY", flush=True)
        sys.stdin.readline()
    t0 = time.perf_counter()
    if args.case == "resnet":
        out = resnet(torch, args.steps, args.seed)
    elif args.case == "gpt2-train":
        out = gpt2_train(torch, args.steps, args.seed)
    elif args.case == "gpt2-serve":
        out = gpt2_serve(torch, args.steps, args.seed)
    else:
        out = mixed(torch, xl, args.seed)
    torch.cuda.synchronize()
    out["seconds"] = time.perf_counter() - t0
    if xl is not None:
        s = xl.stats()
        out["live_peak"] = s["peak_bytes"]
        out["held"] = s["bytes_outstanding"]
        out["cached"] = s["cached_bytes"]
        out["pool_reserved_peak"] = s["pool_reserved_peak"]
        out["small_pool_reserved_peak"] = s["small_pool_reserved_peak"]
    else:
        out["live_peak"] = torch.cuda.max_memory_allocated()
    for k in ("ms_per_step", "ms_per_request"):
        if k in out and out[k]:
            out[k + "_median"] = statistics.median(out[k][1:] or out[k])
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
