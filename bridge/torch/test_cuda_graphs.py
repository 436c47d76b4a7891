# SPDX-License-Identifier: Apache-2.0
"""CUDA graphs through each of torch's allocators, on a GPU: does torch.cuda.graph work
when xlogrt is torch's allocator (the bridge's capture hooks), as it does with torch's own?

    PYTHONPATH=SITE python3 bridge/torch/test_cuda_graphs.py --allocator native|xlogrt|torch-async
        [--case NAME] [--out DIR] [--build BUILD]
    PYTHONPATH=SITE python3 bridge/torch/test_cuda_graphs.py --compare [--rounds 2]
        [--allocators native,xlogrt] [--case NAME] [--out DIR]

SITE: a directory the package was pip-installed into (run_gpu.sh graphs does it); --build
takes the libraries of a Meson build directory instead. A process cannot switch
allocators, so each allocator runs in a process of its own (xlogrt_torch.install()
before the first CUDA tensor, as real_models.py does). --allocator runs the cases in this
process; --compare runs each case of each allocator in a process of its own, the
allocators alternating (native, xlogrt, native, xlogrt, ... for --rounds rounds), so
that a case which breaks its CUDA context or kills its process hides no other case, and
reads the device's memory from outside each process (NVML, as nvml_watch.py does): its
peak over the process's baseline, and the used memory at the points a case asks for.

Cases (each prints `case NAME: PASS|FAIL|EXPECTED-LIMITATION ...figures...`):
1. gpt2-forward: GPT-2 (4 layers, width 768, random weights, bf16, eval) on 8 x 256
   tokens, warmed up on a side stream, captured into static input and output; 20 times a
   new input is copied in, nine eager tensors of 4 KiB to 25 MiB are allocated and filled
   (and kept), the graph replays, its output is compared with an eager forward of the
   same input and every eager tensor is checked. An allocator that hands the graph's
   memory to eager tensors after the capture (a pluggable allocator without the capture
   hooks does: torch then allocates the capture's blocks from the ordinary pool) shows
   here as changed tensors or wrong outputs; both must be 0.
2. decode-kv: a decode step as vLLM and SGLang capture it: a GPT-2 style attention decode
   in plain torch over a static KV cache [layers, batch, heads, max_len, head_dim]
   (index_copy_ for K, scatter_ for V at a position tensor), one token in, logits out;
   captured once, replayed for 32 successive positions against the same step run eagerly
   on a copy of the cache (logits at every position, and both caches at the end).
3. shared-pool: two graphs of batch 64 and 16 captured into one graph_pool_handle(), the
   second after the first, replayed in capture order 10 times with new inputs and eager
   tensors alive; both outputs equal eager after each pair of replays.
4. make-graphed-callables: an MLP trained 5 optimizer steps through
   torch.cuda.make_graphed_callables (forward and backward graphs) and eagerly from the
   same weights and data: the losses agree.
5. release: a capture holding ~1.25 GiB of intermediates; after the graph, its output
   and its pool are dropped, gc.collect(), synchronize() and empty_cache(), the device's
   free memory (cudaMemGetInfo) is back within 64 MiB of before the capture. With
   xlogrt, memory_stats()'s keys naming "graph" are printed before, during and after.
6. compile-reduce-overhead: torch.compile(mode="reduce-overhead") on an MLP, 5 calls
   against eager. torch's CUDA-graph trees call allocator functions a pluggable allocator
   (and cudaMallocAsync) does not have; a failure whose message names one of them
   (checkPoolLiveAllocations, getCheckpointState, setCheckpointPoolState, or "... does
   not yet support") is EXPECTED-LIMITATION for those allocators, any other failure is
   FAIL, and so is a run that skipped CUDA graphs.
6b. compile-reduce-overhead-no-trees: the same with
   torch._inductor.config.triton.cudagraph_trees = False (inductor's older path: one
   torch.cuda.graph per compiled graph, no pool checks), which a pluggable allocator
   serves through its pool hooks; any failure is FAIL.
7. replay-footprint: case 1's capture again, measured: the device's used memory after
   the capture minus before it (NVML from outside under --compare, cudaMemGetInfo
   otherwise), the allocator's reserved memory over the same span
   (torch.cuda.memory_reserved, xlogrt_torch.memory_reserved with xlogrt), and what the
   first replay adds. --compare prints them side by side per allocator.

Exit 0 when every case passes or is an EXPECTED-LIMITATION (under --compare: for every
allocator and round), 1 otherwise, 77 without a CUDA device. --out DIR writes
DIR/cuda_graphs_<allocator>.json (--allocator) or DIR/cuda_graphs_compare.json and each
process's stderr under DIR/cuda_graphs_logs/ (--compare; DIR defaults to $OUT, else .).
"""
import argparse
import copy
import gc
import json
import os
import queue
import re
import statistics
import subprocess
import traceback
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from real_models import ALLOCATOR_ENV, allocator_env, install  # noqa: E402

CASES = ["gpt2-forward", "decode-kv", "shared-pool", "make-graphed-callables", "release",
         "compile-reduce-overhead", "compile-reduce-overhead-no-trees", "replay-footprint"]
PASS, FAIL, LIMITATION = "PASS", "FAIL", "EXPECTED-LIMITATION"
MIB = 2**20

# The eager tensors allocated while a captured graph is alive: 4 KiB to 25 MiB, so that
# every size class the allocators keep apart (torch's small and large pools, xlogrt's
# cache classes and its pool) holds one.
EAGER_BYTES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 3 << 20, 7 << 20, 13 << 20, 25 << 20]

# The allocator functions torch's CUDA-graph trees call that a pluggable allocator (and the
# cudaMallocAsync backend) lacks; the capture hooks themselves are the bridge's to provide,
# so a failure naming them is never a torch-side limitation.
TORCH_SIDE = re.compile(r"checkPoolLiveAllocations|getCheckpointState|setCheckpointPoolState")
CAPTURE_HOOKS = re.compile(r"AllocateToPool|allocate_to_pool|releasePool|release_pool")


# ---- helpers (the case processes) -----------------------------------------------------------


class Ctx:
    """What every case gets: torch, the xlogrt_torch module (None for torch's allocators),
    the allocator's name, the seed, and the device-memory probe."""

    def __init__(self, torch, xl, allocator, seed, handshake):
        self.torch, self.xl, self.allocator, self.seed, self.handshake = torch, xl, allocator, seed, handshake

    def device_used(self, label):
        """The device's used memory now (after a synchronize): read by the --compare process
        through NVML when it runs this one (it answers a MEASURE line on stdin), else
        total - free from cudaMemGetInfo. Returns (bytes, source)."""
        self.torch.cuda.synchronize()
        if self.handshake:
            print(f"MEASURE {label}", flush=True)
            return int(sys.stdin.readline()), "nvml-outside"
        free, total = self.torch.cuda.mem_get_info()
        return total - free, "cudaMemGetInfo"

    def reserved(self):
        """The allocator's reserved memory, as it reports it: (bytes, source)."""
        if self.xl is not None:
            return self.xl.memory_reserved(), "xlogrt_torch.memory_reserved"
        return self.torch.cuda.memory_reserved(), "torch.cuda.memory_reserved"

    def graph_stats(self):
        """xlogrt's memory_stats() keys naming graphs (None for torch's allocators)."""
        if self.xl is None:
            return None
        return {k: v for k, v in self.xl.memory_stats().items() if "graph" in k}


def err_text(e, lines=3):
    """The exception's type and the first lines of its message, and those of the exception
    it was raised from, when there is one."""
    def first(x):
        return f"{type(x).__name__}: " + " | ".join([l for l in str(x).splitlines() if l.strip()][:lines])[:600]

    root, seen = e, {id(e)}
    while (root.__cause__ or root.__context__) is not None and id(root.__cause__ or root.__context__) not in seen:
        root = root.__cause__ or root.__context__
        seen.add(id(root))
    return first(e) if root is e else f"{first(e)} (raised from {first(root)})"


def where(e):
    """' at FILE:LINE (FUNCTION)' of the innermost frame outside torch that the exception
    passed through: the line of the model or of this script that made the failing call."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "/torch/" not in f.filename]
    return f" at {frames[-1].filename}:{frames[-1].lineno} ({frames[-1].name})" if frames else ""


def chain_text(e):
    """The messages of an exception and of the exceptions it was raised from (torch.compile
    wraps the allocator's error in its own)."""
    texts, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        texts.append(f"{type(e).__name__}: {e}")
        e = e.__cause__ or e.__context__
    return "\n".join(texts)


def torch_side_limitation(text, allocator):
    """Whether a failure's text names an allocator function torch's CUDA-graph trees need
    and a pluggable allocator (or cudaMallocAsync) does not have."""
    if allocator == "native" or CAPTURE_HOOKS.search(text):
        return False
    if TORCH_SIDE.search(text):
        return True
    low = text.lower()
    return ("pluggable" in low or "cudamallocasync" in low) and ("not supported" in low or "does not yet support" in low)


def compare(torch, out, ref, atol, rtol):
    """(within tolerance, largest absolute difference, bitwise equal)."""
    a, b = out.float(), ref.float()
    diff = (a - b).abs()
    ok = bool((diff <= atol + rtol * b.abs()).all().item())  # NaN fails
    return ok, float(diff.max().item()), bool(torch.equal(out, ref))


def warm_up(torch, fn, iters=3):
    """fn run on a side stream before the capture, as torch's CUDA-graphs docs do (lazy
    initialisation, cuBLAS handles and workspaces, autotuning happen outside the capture)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(iters):
            fn()
    torch.cuda.current_stream().wait_stream(s)


def fill_eager(torch, seed):
    """The nine eager tensors, filled from seeded generators: [(tensor, seed)]."""
    kept = []
    for k, nbytes in enumerate(EAGER_BYTES):
        s = seed * 16 + k
        t = torch.empty(nbytes // 4, dtype=torch.int32, device="cuda")
        t.random_(generator=torch.Generator(device="cuda").manual_seed(s))
        kept.append((t, s))
    return kept


def changed_eager(torch, kept):
    """(tensors whose contents changed, elements changed): each is compared with its
    contents generated again from its seed."""
    tensors = elements = 0
    for t, s in kept:
        ref = torch.empty_like(t).random_(generator=torch.Generator(device="cuda").manual_seed(s))
        n = int((t != ref).sum().item())
        tensors += n > 0
        elements += n
    return tensors, elements


def mlp(torch, widths):
    layers = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(torch.nn.GELU())
    return torch.nn.Sequential(*layers).cuda()


# ---- GPT-2 (cases 1 and 7) ------------------------------------------------------------------

GPT2_BATCH, GPT2_SEQ, GPT2_VOCAB = 8, 256, 50257


def gpt2_model(torch, seed):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    cfg = GPT2Config(n_layer=4, n_embd=768, n_head=12, vocab_size=GPT2_VOCAB, attn_implementation="sdpa")
    return GPT2LMHeadModel(cfg).to(device="cuda", dtype=torch.bfloat16).eval()


def gpt2_forward(model, static_ids):
    # No KV cache, positions given as a CUDA tensor made before the capture, and no attention
    # mask: SDPA's causal flag stands for it. With eager attention and an explicit mask, the
    # forward copied a host tensor to the device during the capture (H200, torch's own
    # allocator too), which torch refuses.
    import torch
    positions = torch.arange(static_ids.shape[1], device=static_ids.device).expand_as(static_ids).contiguous()

    def forward():
        return model(input_ids=static_ids, position_ids=positions, use_cache=False).logits
    return forward


def capture(torch, fn, pool=None):
    """fn captured into a new graph (in `pool`, else a pool of its own): (graph, its output)."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool):
        out = fn()
    return g, out


def case_gpt2_forward(ctx):
    torch = ctx.torch
    model = gpt2_model(torch, ctx.seed)
    gen = torch.Generator(device="cuda").manual_seed(ctx.seed + 1)
    static_ids = torch.randint(0, GPT2_VOCAB, (GPT2_BATCH, GPT2_SEQ), device="cuda", generator=gen)
    wrong = changed = changed_elems = bitwise = 0
    worst = 0.0
    with torch.no_grad():
        forward = gpt2_forward(model, static_ids)
        warm_up(torch, forward)
        g, static_logits = capture(torch, forward)
        for it in range(20):
            ids = torch.randint(0, GPT2_VOCAB, (GPT2_BATCH, GPT2_SEQ), device="cuda", generator=gen)
            static_ids.copy_(ids)
            kept = fill_eager(torch, ctx.seed * 1000 + it)
            # The reference is computed before the replay, so it is one more eager tensor
            # the replay must leave alone.
            ref = model(input_ids=ids, use_cache=False).logits
            g.replay()
            torch.cuda.synchronize()
            ok, d, same = compare(torch, static_logits, ref, atol=0.05, rtol=0.02)
            wrong += not ok
            bitwise += same
            worst = max(worst, d)
            t, e = changed_eager(torch, kept)
            changed += t
            changed_elems += e
            del kept, ref
    figures = {"replays": 20, "wrong_outputs": wrong, "max_abs_diff": worst, "bitwise_equal": bitwise,
               "eager_tensors": 20 * len(EAGER_BYTES), "changed_tensors": changed, "changed_elements": changed_elems}
    return (PASS if wrong == 0 and changed == 0 else FAIL), figures, ""


# ---- decode with a static KV cache (case 2) ------------------------------------------------

DEC_LAYERS, DEC_BATCH, DEC_HEADS, DEC_HEAD_DIM, DEC_MAX_LEN, DEC_VOCAB = 4, 8, 8, 64, 128, 8192
DEC_PROMPT, DEC_STEPS = 16, 32


def decode_weights(torch, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    e, L = DEC_HEADS * DEC_HEAD_DIM, DEC_LAYERS

    def w(*shape):
        return torch.randn(*shape, device="cuda", generator=g) * 0.02

    return {"wte": w(DEC_VOCAB, e), "wpe": w(DEC_MAX_LEN, e), "qkv": w(L, e, 3 * e), "proj": w(L, e, e),
            "fc": w(L, e, 4 * e), "out": w(L, 4 * e, e)}


def decode_step(torch, p, tokens, pos, k_cache, v_cache, positions):
    """One token per sequence at position `pos` (a one-element device tensor): writes its
    K and V into the caches at pos and returns the logits [batch, vocab]. Nothing reads a
    tensor back to the host, so the step can be captured with pos as its input."""
    F = torch.nn.functional
    L, B, H, T, D = k_cache.shape
    e = H * D
    x = p["wte"][tokens] + p["wpe"].index_select(0, pos)  # [B, e]
    hidden = positions > pos  # [T]: the cache slots after pos
    pos_idx = pos.view(1, 1, 1, 1).expand(B, H, 1, D)
    for layer in range(L):
        q, k, v = (F.layer_norm(x, (e,)) @ p["qkv"][layer]).view(B, 3, H, D).unbind(1)
        k_cache[layer].index_copy_(2, pos, k.unsqueeze(2))
        v_cache[layer].scatter_(2, pos_idx, v.unsqueeze(2))
        att = (q.unsqueeze(2) @ k_cache[layer].transpose(-1, -2)) * D**-0.5  # [B, H, 1, T]
        att = att.masked_fill(hidden, float("-inf")).softmax(-1)
        x = x + (att @ v_cache[layer]).reshape(B, e) @ p["proj"][layer]
        x = x + F.gelu(F.layer_norm(x, (e,)) @ p["fc"][layer]) @ p["out"][layer]
    return F.layer_norm(x, (e,)) @ p["wte"].t()


def case_decode_kv(ctx):
    torch = ctx.torch
    p = decode_weights(torch, ctx.seed)
    gen = torch.Generator(device="cuda").manual_seed(ctx.seed + 2)
    shape = (DEC_LAYERS, DEC_BATCH, DEC_HEADS, DEC_MAX_LEN, DEC_HEAD_DIM)
    k0, v0 = torch.zeros(shape, device="cuda"), torch.zeros(shape, device="cuda")
    k0[:, :, :, :DEC_PROMPT] = torch.randn(*shape[:3], DEC_PROMPT, DEC_HEAD_DIM, device="cuda", generator=gen)
    v0[:, :, :, :DEC_PROMPT] = torch.randn(*shape[:3], DEC_PROMPT, DEC_HEAD_DIM, device="cuda", generator=gen)
    positions = torch.arange(DEC_MAX_LEN, device="cuda")
    k_graph, v_graph, k_eager, v_eager = k0.clone(), v0.clone(), k0.clone(), v0.clone()
    static_tokens = torch.zeros(DEC_BATCH, dtype=torch.long, device="cuda")
    static_pos = torch.full((1,), DEC_PROMPT, dtype=torch.long, device="cuda")
    eager_pos = static_pos.clone()
    wrong, worst = 0, 0.0
    with torch.no_grad():
        def step():
            return decode_step(torch, p, static_tokens, static_pos, k_graph, v_graph, positions)

        warm_up(torch, step)
        g, static_logits = capture(torch, step)
        k_graph.copy_(k0)  # the warm-up wrote into the cache: start both from the prompt
        v_graph.copy_(v0)
        for i in range(DEC_STEPS):
            tokens = torch.randint(0, DEC_VOCAB, (DEC_BATCH,), device="cuda", generator=gen)
            static_tokens.copy_(tokens)
            static_pos.fill_(DEC_PROMPT + i)
            g.replay()
            eager_pos.fill_(DEC_PROMPT + i)
            ref = decode_step(torch, p, tokens, eager_pos, k_eager, v_eager, positions)
            ok, d, _ = compare(torch, static_logits, ref, atol=1e-3, rtol=1e-3)
            wrong += not ok
            worst = max(worst, d)
        torch.cuda.synchronize()
        k_ok, k_diff, _ = compare(torch, k_graph, k_eager, atol=1e-4, rtol=1e-4)
        v_ok, v_diff, _ = compare(torch, v_graph, v_eager, atol=1e-4, rtol=1e-4)
    figures = {"positions": DEC_STEPS, "wrong_logits": wrong, "max_abs_diff": worst, "k_cache_diff": k_diff,
               "v_cache_diff": v_diff}
    ok = wrong == 0 and k_ok and v_ok
    return (PASS if ok else FAIL), figures, "" if k_ok and v_ok else "the graph's KV cache differs from the eager one"


# ---- one pool, two graphs (case 3) ----------------------------------------------------------


def case_shared_pool(ctx):
    torch = ctx.torch
    torch.manual_seed(ctx.seed)
    model = mlp(torch, [1024, 4096, 4096, 1024]).eval()
    gen = torch.Generator(device="cuda").manual_seed(ctx.seed + 3)
    batches = (64, 16)
    statics = [torch.randn(b, 1024, device="cuda", generator=gen) for b in batches]
    pool = torch.cuda.graph_pool_handle()
    graphs, outs = [], []
    wrong = changed = 0
    worst = 0.0
    with torch.no_grad():
        for x in statics:
            warm_up(torch, lambda x=x: model(x))
        for x in statics:  # the second capture after the first, into the same pool
            g, out = capture(torch, lambda x=x: model(x), pool)
            graphs.append(g)
            outs.append(out)
        for it in range(10):
            inputs = [torch.randn(b, 1024, device="cuda", generator=gen) for b in batches]
            kept = fill_eager(torch, ctx.seed * 1000 + it)
            for x, new in zip(statics, inputs):
                x.copy_(new)
            for g in graphs:  # in capture order
                g.replay()
            for out, new in zip(outs, inputs):  # the first graph's output survives the second's replay
                ok, d, _ = compare(torch, out, model(new), atol=1e-4, rtol=1e-4)
                wrong += not ok
                worst = max(worst, d)
            changed += changed_eager(torch, kept)[0]
            del kept
    figures = {"replays": 2 * 10, "wrong_outputs": wrong, "max_abs_diff": worst, "changed_tensors": changed}
    return (PASS if wrong == 0 and changed == 0 else FAIL), figures, ""


# ---- make_graphed_callables (case 4) --------------------------------------------------------


def case_make_graphed_callables(ctx):
    torch = ctx.torch
    F = torch.nn.functional
    torch.manual_seed(ctx.seed)
    model = mlp(torch, [512, 1024, 1024, 256])
    eager = copy.deepcopy(model)
    cpu = torch.Generator().manual_seed(ctx.seed + 4)
    data = [(torch.randn(128, 512, generator=cpu), torch.randn(128, 256, generator=cpu)) for _ in range(5)]
    sample = torch.randn(128, 512, device="cuda")
    graphed = torch.cuda.make_graphed_callables(model, (sample,))
    runs = []
    for m, params in ((graphed, model.parameters()), (eager, eager.parameters())):
        opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
        losses = []
        for x, y in data:
            x, y = x.cuda(), y.cuda()
            opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(m(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        runs.append(losses)
    graphed_losses, eager_losses = runs
    rel = max(abs(a - b) / max(abs(a), abs(b), 1e-12) for a, b in zip(graphed_losses, eager_losses))
    param_diff = max(float((a - b).abs().max().item()) for a, b in zip(model.parameters(), eager.parameters()))
    figures = {"steps": 5, "graphed_losses": graphed_losses, "eager_losses": eager_losses,
               "max_rel_loss_diff": rel, "max_param_diff": param_diff}
    ok = rel <= 1e-4 and param_diff <= 1e-4
    return (PASS if ok else FAIL), figures, ""


# ---- release (case 5) -----------------------------------------------------------------------

RELEASE_ELEMS = 32 * MIB  # float32: 128 MiB per intermediate
RELEASE_KEPT = 8


def case_release(ctx):
    torch = ctx.torch
    x = torch.randn(RELEASE_ELEMS, device="cuda", generator=torch.Generator(device="cuda").manual_seed(ctx.seed))

    def body():
        kept, y = [], x
        for i in range(RELEASE_KEPT):  # all alive at once: the pool must hold every one
            y = y * 0.5 + float(i)
            kept.append(y)
        return kept[0] + kept[-1]

    with torch.no_grad():
        warm_up(torch, body, iters=1)
        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()
        free0 = torch.cuda.mem_get_info()[0]
        stats = {"before": ctx.graph_stats()}
        pool = torch.cuda.graph_pool_handle()
        g, out = capture(torch, body, pool)
        g.replay()
        torch.cuda.synchronize()
        held = free0 - torch.cuda.mem_get_info()[0]
        stats["captured"] = ctx.graph_stats()
        ok_out, _, _ = compare(torch, out, body(), atol=1e-5, rtol=1e-5)
        del g, out, pool
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        free1 = torch.cuda.mem_get_info()[0]
        stats["released"] = ctx.graph_stats()
    lost = free0 - free1
    if stats["before"] is not None:
        for when, s in stats.items():
            print(f"  xlogrt_torch.memory_stats() keys with 'graph', {when}: {s if s else '(none)'}", flush=True)
    figures = {"held_mib": held / MIB, "not_returned_mib": lost / MIB, "output_correct": ok_out,
               "xlogrt_graph_stats": stats if stats["before"] is not None else None}
    notes = []
    if held < 0.9 * (RELEASE_KEPT * RELEASE_ELEMS * 4):
        notes.append(f"the capture held {held / MIB:,.0f} MiB, not the ~1 GiB the check needs")
    if lost > 64 * MIB:
        notes.append(f"{lost / MIB:,.0f} MiB did not come back after the graph and its pool were dropped")
    if not ok_out:
        notes.append("the replay's output differs from eager")
    return (FAIL if notes else PASS), figures, "; ".join(notes)


# ---- torch.compile reduce-overhead (case 6) -------------------------------------------------


def cudagraph_skips():
    try:
        from torch._dynamo.utils import counters
        return int(counters["inductor"]["cudagraph_skips"])
    except Exception:  # an internal counter: absent in some releases
        return None


def case_compile_reduce_overhead(ctx, trees=True):
    # trees=False: inductor's older CUDA-graph path, one torch.cuda.graph per compiled
    # graph, without the trees' checks of a pool's live blocks, which torch implements for
    # its own allocator only. Set for this case alone (the cases may share a process).
    import torch._inductor.config as inductor_config
    with inductor_config.patch({"triton.cudagraph_trees": trees}):
        return compile_reduce_overhead(ctx, trees)


def compile_reduce_overhead(ctx, trees):
    torch = ctx.torch
    torch.manual_seed(ctx.seed)
    model = mlp(torch, [1024, 2048, 1024]).eval()
    gen = torch.Generator(device="cuda").manual_seed(ctx.seed + 6)
    wrong, worst = 0, 0.0
    skips0 = cudagraph_skips()
    try:
        compiled = torch.compile(model, mode="reduce-overhead")
        with torch.no_grad():
            for _ in range(5):
                x = torch.randn(64, 1024, device="cuda", generator=gen)
                torch.compiler.cudagraph_mark_step_begin()
                out = compiled(x).clone()  # the graph's output is overwritten by its next replay
                ok, d, _ = compare(torch, out, model(x), atol=1e-4, rtol=1e-3)
                wrong += not ok
                worst = max(worst, d)
    except Exception as e:
        limitation = trees and torch_side_limitation(chain_text(e), ctx.allocator)
        return (LIMITATION if limitation else FAIL), {"calls": 5}, err_text(e)
    skips = None if skips0 is None else cudagraph_skips() - skips0
    figures = {"calls": 5, "wrong_outputs": wrong, "max_abs_diff": worst, "cudagraph_skips": skips}
    if wrong:
        return FAIL, figures, "the compiled model's output differs from eager"
    if skips:
        return FAIL, figures, f"torch.compile skipped CUDA graphs {skips} time(s) (see the process's stderr)"
    return PASS, figures, ""


# ---- replay footprint (case 7) --------------------------------------------------------------


def case_replay_footprint(ctx):
    torch = ctx.torch
    model = gpt2_model(torch, ctx.seed)
    gen = torch.Generator(device="cuda").manual_seed(ctx.seed + 7)
    static_ids = torch.randint(0, GPT2_VOCAB, (GPT2_BATCH, GPT2_SEQ), device="cuda", generator=gen)
    forward = gpt2_forward(model, static_ids)
    with torch.no_grad():
        warm_up(torch, forward)
        # What the warm-up left cached is not the graph's: the span starts from an empty cache.
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        used0, used_src = ctx.device_used("before-capture")
        res0, res_src = ctx.reserved()
        g, static_logits = capture(torch, forward)
        used1, _ = ctx.device_used("after-capture")
        res1, _ = ctx.reserved()
        g.replay()
        used2, _ = ctx.device_used("after-replay")
        ok, d, _ = compare(torch, static_logits, forward(), atol=0.05, rtol=0.02)
    figures = {"device_used_delta_mib": (used1 - used0) / MIB, "device_used_source": used_src,
               "reserved_delta_mib": (res1 - res0) / MIB, "reserved_source": res_src,
               "replay_adds_mib": (used2 - used1) / MIB, "output_correct": ok, "max_abs_diff": d}
    return (PASS if ok else FAIL), figures, "" if ok else "the replay's output differs from eager"


CASE_FNS = {"gpt2-forward": case_gpt2_forward, "decode-kv": case_decode_kv, "shared-pool": case_shared_pool,
            "make-graphed-callables": case_make_graphed_callables, "release": case_release,
            "compile-reduce-overhead": case_compile_reduce_overhead,
            "compile-reduce-overhead-no-trees": lambda ctx: case_compile_reduce_overhead(ctx, trees=False),
            "replay-footprint": case_replay_footprint}


def fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return "[" + ", ".join(fmt(x) for x in v) + "]"
    return str(v)


def run_case(ctx, name):
    torch = ctx.torch
    t0 = time.perf_counter()
    try:
        status, figures, detail = CASE_FNS[name](ctx)
    except Exception as e:
        status, figures, detail = FAIL, {}, err_text(e) + where(e)
    rec = {"case": name, "status": status, "figures": figures, "detail": detail,
           "seconds": time.perf_counter() - t0}
    try:  # what the case left behind goes, so that the next case starts from an empty cache
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    except Exception as e:
        rec["after"] = "the CUDA context is unusable after this case: " + err_text(e)
    shown = " ".join(f"{k}={fmt(v)}" for k, v in figures.items() if k != "xlogrt_graph_stats")
    print(f"case {name}: {status} {shown}" + (f" -- {detail}" if detail else "") + f" ({rec['seconds']:.1f} s)",
          flush=True)
    return rec


def worker(args):
    want = allocator_env(args.allocator)
    if "PYTORCH_CUDA_ALLOC_CONF" not in want and "backend" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        raise SystemExit(f"test_cuda_graphs: --allocator {args.allocator} with PYTORCH_CUDA_ALLOC_CONF="
                         f"{os.environ['PYTORCH_CUDA_ALLOC_CONF']} would not run that allocator: unset it")
    os.environ.update(want)  # before torch reads it (its first CUDA allocation)
    import torch
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 77
    xl = install(args.allocator, args.build)
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    # The references are eager runs of the same kernels; TF32 would only widen the
    # tolerances the fp32 cases need.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if args.handshake:
        print("READY", flush=True)
        sys.stdin.readline()
    ctx = Ctx(torch, xl, args.allocator, args.seed, args.handshake)
    try:
        import transformers
        transformers_version = transformers.__version__
    except ImportError:
        transformers_version = None
    names = CASES if args.case == "all" else [args.case]
    recs = [run_case(ctx, n) for n in names]
    result = {"allocator": args.allocator, "torch": torch.__version__, "transformers": transformers_version,
              "device": torch.cuda.get_device_name(), "cases": recs}
    if args.handshake:
        print("RESULT " + json.dumps(result), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"cuda_graphs_{args.allocator}.json"), "w") as f:
            json.dump(result, f, indent=1)
    return 0 if all(r["status"] in (PASS, LIMITATION) for r in recs) else 1


# ---- --compare (the driver process: no CUDA context of its own) -----------------------------


def run_child(args, allocator, case, rnd, base_env, logs):
    """One case of one allocator in a process of its own, its memory read through NVML:
    the case's record, with device_peak_mib (the peak over the process's baseline)."""
    from nvml_watch import Watch
    cmd = [sys.executable, os.path.abspath(__file__), "--allocator", allocator, "--case", case, "--handshake",
           "--seed", str(args.seed)] + (["--build", args.build] if args.build else [])
    env = dict(base_env, **allocator_env(allocator))
    stderr_path = os.path.join(logs, f"{allocator}-{case}-r{rnd + 1}.stderr")
    watch, baseline, result = None, None, None
    with open(stderr_path, "w") as err:
        p = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
        timed_out = threading.Event()

        def kill():
            timed_out.set()
            p.kill()

        timer = threading.Timer(args.timeout, kill)
        timer.start()

        def reply(text):
            try:
                p.stdin.write(text + "\n")
                p.stdin.flush()
            except (BrokenPipeError, OSError):
                pass

        # stdout is read on a thread of its own, so that the loop ends a few seconds after
        # the case process does even when a process it started holds the pipe open.
        lines = queue.Queue()

        def pump():
            for text in iter(p.stdout.readline, ""):
                lines.put(text)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        exited_at = None
        try:
            while True:
                try:
                    line = lines.get(timeout=0.5)
                except queue.Empty:
                    if p.poll() is not None:
                        exited_at = exited_at or time.monotonic()
                        if time.monotonic() - exited_at > 5:
                            break
                    continue
                if line is None:
                    break
                line = line.rstrip("\n")
                if line == "READY":
                    watch = Watch(args.device)
                    baseline = watch.used()
                    watch.start()
                    reply("go")
                elif line.startswith("MEASURE "):
                    reply(str((watch or Watch(args.device)).used()))
                elif line.startswith("RESULT "):
                    result = json.loads(line[len("RESULT "):])
                else:
                    print(f"    {line}", flush=True)
        finally:
            rc = p.wait()
            timer.cancel()
            peak = watch.stop() if watch is not None else None
    recs = (result or {}).get("cases") or []
    if rc == 77:
        rec = {"case": case, "status": "SKIP", "figures": {}, "detail": "no CUDA device"}
    elif recs:
        rec = recs[0]
        if rc != (0 if rec["status"] in (PASS, LIMITATION) else 1):  # e.g. a crash at the process's exit
            rec["detail"] = "; ".join(x for x in (rec["detail"], f"the process exited {rc} after its result") if x)
            rec["status"] = FAIL
    else:
        with open(stderr_path) as f:
            tail = " | ".join(f.read().strip().splitlines()[-4:])
        how = f"was killed after {args.timeout} s" if timed_out.is_set() else f"exited {rc}"
        rec = {"case": case, "status": FAIL, "figures": {}, "detail": f"the process {how} without a result: {tail}"}
    rec["rc"] = rc
    rec["device_peak_mib"] = None if peak is None else (peak - baseline) / MIB
    rec["versions"] = {k: (result or {}).get(k) for k in ("torch", "transformers", "device")}
    return rec


def cell(recs):
    return " ".join("LIMIT" if r["status"] == LIMITATION else r["status"] for r in recs) or "-"


def mib_list(values):
    return ", ".join("-" if v is None else f"{v:,.0f}" for v in values) or "-"


def compare_mode(args):
    try:
        import pynvml
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception as e:  # ImportError, or NVML without a driver
        print(f"SKIP: NVML is unavailable ({type(e).__name__}: {e}); --compare reads the device's memory through it")
        return 77
    if count == 0:
        print("SKIP: no CUDA device")
        return 77
    allocators = args.allocators.split(",")
    for a in allocators:
        if a not in ALLOCATOR_ENV:
            raise SystemExit(f"test_cuda_graphs: unknown allocator {a!r} (one of {', '.join(sorted(ALLOCATOR_ENV))})")
    cases = CASES if args.case == "all" else [args.case]
    out = args.out or os.environ.get("OUT", ".")
    logs = os.path.join(out, "cuda_graphs_logs")
    os.makedirs(logs, exist_ok=True)
    # Inductor compiles in the case process itself: a pool of compile workers would inherit
    # its stdout and could hold the pipe this process reads to its end open after the case
    # process has exited.
    base_env = dict(os.environ, PYTHONUNBUFFERED="1", TORCHINDUCTOR_COMPILE_THREADS="1")
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "XLOGRT_CACHE", "XLOGRT_BUDGET_BYTES", "XLOGRT_LOG_FILE"):
        base_env.pop(k, None)
    runs = {a: {c: [] for c in cases} for a in allocators}
    for rnd in range(args.rounds):
        for a in allocators:
            for c in cases:
                print(f"round {rnd + 1} {a} {c}:", flush=True)
                runs[a][c].append(run_child(args, a, c, rnd, base_env, logs))

    w = max(14, max(len(a) for a in allocators) + 2)
    print(f"\npass/fail per case (one word per round; LIMIT: {LIMITATION}):")
    print(f"  {'case':<26}" + "".join(f"{a:>{w + 10}}" for a in allocators))
    for c in cases:
        print(f"  {c:<26}" + "".join(f"{cell(runs[a][c]):>{w + 10}}" for a in allocators))
    if "replay-footprint" in cases:
        print("\nreplay footprint: case 1's capture (MiB, one figure per round):")
        print(f"  {'':<50}" + "".join(f"{a:>{w + 10}}" for a in allocators))
        rows = [("device used, after - before the capture (NVML)", "device_used_delta_mib"),
                ("allocator's reserved, after - before the capture", "reserved_delta_mib"),
                ("device used, what the first replay adds (NVML)", "replay_adds_mib")]
        for label, key in rows:
            cells = [mib_list([r["figures"].get(key) for r in runs[a]["replay-footprint"]]) for a in allocators]
            print(f"  {label:<50}" + "".join(f"{c:>{w + 10}}" for c in cells))
    print("\ndevice peak over each process's baseline (NVML, MiB, median of the rounds):")
    print(f"  {'case':<26}" + "".join(f"{a:>{w}}" for a in allocators))
    for c in cases:
        meds = []
        for a in allocators:
            vals = [r["device_peak_mib"] for r in runs[a][c] if r.get("device_peak_mib") is not None]
            meds.append(f"{statistics.median(vals):,.0f}" if vals else "-")
        print(f"  {c:<26}" + "".join(f"{m:>{w}}" for m in meds))

    failures = [f"{a} {c} round {i + 1}: {r.get('detail') or r['status']}"
                for a in allocators for c in cases for i, r in enumerate(runs[a][c])
                if r["status"] not in (PASS, LIMITATION, "SKIP")]
    limitations = [f"{a} {c} round {i + 1}: {r.get('detail', '')}"
                   for a in allocators for c in cases for i, r in enumerate(runs[a][c]) if r["status"] == LIMITATION]
    with open(os.path.join(out, "cuda_graphs_compare.json"), "w") as f:
        json.dump({"allocators": allocators, "rounds": args.rounds, "runs": runs, "failures": failures,
                   "limitations": limitations}, f, indent=1)
    print()
    for line in limitations:
        print(f"{LIMITATION}: {line}")
    for line in failures:
        print(f"FAIL: {line}")
    skipped = all(r["status"] == "SKIP" for a in allocators for c in cases for r in runs[a][c])
    print(f"test_cuda_graphs: {f'FAILED ({len(failures)})' if failures else 'all cases passed'}")
    return 77 if skipped else (1 if failures else 0)


def main():
    ap = argparse.ArgumentParser(description="CUDA graphs through torch's allocators (see the module docstring)")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--allocator", choices=sorted(ALLOCATOR_ENV), help="run the cases in this process")
    mode.add_argument("--compare", action="store_true", help="each case of each allocator in a process of its own")
    ap.add_argument("--case", default="all", choices=["all"] + CASES)
    ap.add_argument("--out", default=None, help="a directory for the JSON results")
    ap.add_argument("--build", default=None, help="a Meson build directory (default: the installed package)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=2, help="--compare: rounds of the allocators, alternating")
    ap.add_argument("--allocators", default="native,xlogrt", help="--compare: the allocators, in their order")
    ap.add_argument("--timeout", type=int, default=900, help="--compare: seconds one case process may take")
    ap.add_argument("--device", type=int, default=0, help="--compare: the NVML index of the device")
    ap.add_argument("--handshake", action="store_true", help=argparse.SUPPRESS)  # run by --compare
    args = ap.parse_args()
    return compare_mode(args) if args.compare else worker(args)


if __name__ == "__main__":
    sys.exit(main())
