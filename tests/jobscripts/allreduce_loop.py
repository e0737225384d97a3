"""A plain torch.distributed all-reduce timing loop, written apart from rigdeck's doctor (no
rigdeck import): the baseline the doctor's bus bandwidth is compared with.

    python allreduce_loop.py SIZES_MB ITERS WARMUP      (SIZES_MB: 64, or 1,4,16,64)

Every rank: gloo (NCCL with CUDA), env:// rendezvous. For each size in turn, as nccl-tests and
the doctor go through their sizes: WARMUP all-reduces, then ITERS timed; rank 0 prints
``plain-allreduce size_bytes=N time_s=T busbw_gbps=B``: T the mean of the ITERS (the slowest
rank's), busbw = size / T * 2 (n - 1) / n / 1e9.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

sizes_mb = [float(s) for s in sys.argv[1].split(",")]
iters, warmup = int(sys.argv[2]), int(sys.argv[3])
cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if cuda else "gloo", init_method="env://")
dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
n = dist.get_world_size()
for size_mb in sizes_mb:
    x = torch.ones(int(size_mb * 1024 * 1024) // 4, device=dev)
    for _ in range(warmup):
        dist.all_reduce(x)
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    if cuda:
        torch.cuda.synchronize()
    t = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    size = x.numel() * 4
    if dist.get_rank() == 0:
        busbw = size / t.item() * 2 * (n - 1) / n / 1e9
        print(f"plain-allreduce size_bytes={size} time_s={t.item():.6f} busbw_gbps={busbw:.6f}", flush=True)
    del x
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
