# SPDX-License-Identifier: Apache-2.0
"""A few DDP training steps with NCCL all-reduce, one process per GPU, each process's
CUDA memory from xlogrt's default runtime of its own GPU (the PyTorch bridge) or from
PyTorch's native allocator, for comparison.

NOT RUN YET: written on a machine without a GPU, for test/gpu_repro/two_gpu.sh, which runs

    NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc_per_node=2 bridge/torch/ddp_step.py \\
        --allocator xlogrt --build build --out two_gpu-logs

once with --allocator native and once with --allocator xlogrt, and compares the losses.
Keep NCCL's NVLink multicast off (NCCL_NVLS_ENABLE=0), as the device notes ask.

Each rank writes OUT/ddp_<allocator>_rank<r>.log (its GPU, its losses and, with xlogrt,
the stack's figures for its device); rank 0 writes OUT/ddp_loss_<allocator>.txt, one
loss per step. The model, the data and the seeds are the same for both allocators, and
deterministic algorithms are asked for, so the losses should match.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--allocator", choices=["native", "xlogrt"], required=True)
    p.add_argument("--build", default="build")
    p.add_argument("--out", default="two_gpu-logs")
    p.add_argument("--steps", type=int, default=5)
    a = p.parse_args()

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

    import torch
    if a.allocator == "xlogrt":
        sys.path.insert(0, HERE)
        import xlogrt_torch
        xlogrt_torch.install(a.build)  # before the first CUDA allocation of this process
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.cuda.set_device(local_rank)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    log = open(os.path.join(a.out, f"ddp_{a.allocator}_rank{rank}.log"), "w")
    print(f"rank {rank} of {world} on cuda:{local_rank} ({torch.cuda.get_device_name(local_rank)}), "
          f"allocator {a.allocator}, NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')}", file=log, flush=True)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024))
    model = DDP(model.cuda(local_rank), device_ids=[local_rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard of the data

    losses = []
    for step in range(a.steps):
        x = torch.randn(256, 1024, generator=gen).cuda(local_rank)
        y = torch.randn(256, 1024, generator=gen).cuda(local_rank)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()  # the gradients' all-reduce runs through NCCL here
        opt.step()
        reduced = loss.detach().clone()
        dist.all_reduce(reduced)
        losses.append(reduced.item() / world)
        print(f"step {step}: loss {losses[-1]!r}", file=log, flush=True)

    torch.cuda.synchronize(local_rank)
    if a.allocator == "xlogrt":
        print(f"xlogrt stats, device {local_rank}: {xlogrt_torch.stats(local_rank)}", file=log, flush=True)
    if rank == 0:
        with open(os.path.join(a.out, f"ddp_loss_{a.allocator}.txt"), "w") as f:
            for v in losses:
                f.write(f"{v!r}\n")
    dist.destroy_process_group()
    log.close()


if __name__ == "__main__":
    main()
