"""A plain torch.distributed all-reduce timing loop, written apart from rigdeck's doctor (no
rigdeck import): the baseline the doctor's bus bandwidth is compared with.

    python allreduce_loop.py SIZE_MB ITERS WARMUP

Every rank: gloo (NCCL with CUDA), env:// rendezvous; rank 0 prints
``plain-allreduce size_bytes=N time_s=T busbw_gbps=B``: T the mean of ITERS all-reduces (the
slowest rank's), busbw = size / T * 2 (n - 1) / n / 1e9.
"""

import os
import sys
import time

import torch
import torch.distributed as dist

size_mb, iters, warmup = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if cuda else "gloo", init_method="env://")
dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
n = dist.get_world_size()
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
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
