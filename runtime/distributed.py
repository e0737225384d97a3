"""Process group from ClusterInfo, DDP with a multi-host bucket size, the linear scaling rule."""

from __future__ import annotations

import os
from typing import Any, Optional

from runtime.cluster import DEFAULT_MASTER_PORT, ClusterInfo, cluster_info

DEFAULT_TIMEOUT_S = 1800.0
DEFAULT_BUCKET_CAP_MB = 64  # REFERENCE.md: 64 for multi-host all-reduce (torch's default is 25)


def init_distributed(backend: Optional[str] = None, timeout_s: float = DEFAULT_TIMEOUT_S, *,
                     default_master_port: int = DEFAULT_MASTER_PORT) -> ClusterInfo:
    """Start torch.distributed for this rank and return its ClusterInfo.

    Backend: NCCL when CUDA is available, else gloo. Sets the CUDA device from the local rank and
    fills ``MASTER_ADDR``/``MASTER_PORT``/``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/
    ``LOCAL_WORLD_SIZE`` where missing, so ranks started by mpirun (Open MPI variables only) or
    from SageMaker/Vertex cluster files need no other set-up. ``default_master_port`` is used
    when no source names a port. A world of one gets an in-memory store (no port taken).
    Calling it again once the group is up only returns the info.
    """
    import datetime

    import torch
    import torch.distributed as dist

    info = cluster_info(default_master_port=default_master_port)
    for name, value in (("MASTER_ADDR", info.master_addr), ("MASTER_PORT", info.master_port),
                        ("RANK", info.rank), ("WORLD_SIZE", info.world_size),
                        ("LOCAL_RANK", info.local_rank),
                        ("LOCAL_WORLD_SIZE", info.local_world_size)):
        os.environ.setdefault(name, str(value))
    if info.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(info.device))
    if dist.is_initialized():
        return info
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    if info.world_size == 1:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timeout)
    else:
        dist.init_process_group(backend, init_method="env://", rank=info.rank,
                                world_size=info.world_size, timeout=timeout)
    return info


def shutdown_distributed() -> None:
    """Leave the process group: a barrier, then ``destroy_process_group()``. No-op without one.

    The barrier is there for gloo: its worker threads release a finished collective's tensors a
    moment after the caller moved on, and that needs the GIL; a process that tears the group
    down or exits in that moment can hang or abort. While the ranks wait in the barrier those
    releases happen. The cyclic garbage collector stays off in this process after it (see
    below). At the end of a training script, ``finish()`` is the safer call: it tears nothing
    down at all.
    """
    import gc

    dist = _initialized_dist()
    if dist is None:
        return
    if dist.get_world_size() > 1:
        dist.barrier()
    # No cyclic collection from here on: a pass could free the group (a DDP model in a cycle
    # holds it) while a gloo worker still waits for the GIL to release the barrier's tensors;
    # the group's end joins that worker holding the GIL, and the rank hangs for good (seen in
    # test_examples: one rank's last frame at the exit_process() line, a gloo thread with no
    # Python frame). What is left is freed when the process exits.
    gc.disable()
    _watchdog(TEARDOWN_WATCHDOG_S)
    dist.destroy_process_group()
    _watchdog(None)


# The group's end and the process's: each takes well under a second. Should either hang all the
# same (a rank of the ddp example, once in a few fresh-clone runs, stayed alive for minutes after
# its peers had gone, cause not yet known), faulthandler's own thread, which needs no GIL, writes
# every thread's stack to the rank's log and ends the rank (exit 1): a failed rank that says
# where it hung, not a job that never ends.
TEARDOWN_WATCHDOG_S = 60.0


def _watchdog(seconds: Optional[float]) -> None:
    """Arm (or, with None, disarm) the hang watchdog; nothing where stderr is not a file.

    faulthandler keeps one such timer per process: arming this one replaces a timer the
    training script armed with ``faulthandler.dump_traceback_later``, and disarming cancels it.
    Both happen only at the very end of a rank, where no script's timer has anything left to
    watch."""
    import faulthandler
    import sys

    try:
        if seconds is None:
            faulthandler.cancel_dump_traceback_later()
        else:
            faulthandler.dump_traceback_later(seconds, exit=True, file=sys.stderr)
    except (AttributeError, OSError, ValueError, RuntimeError):
        pass


def exit_process(code: int = 0) -> None:
    """End this rank now, once stdout and stderr are flushed, skipping the interpreter's teardown.

    For the very end of a training script (after any file it wrote is closed); ``finish()``
    calls it once every rank is there. torch's gloo worker threads can still be finishing a collective's
    cleanup while Python tears down, and torch then aborts the process ("terminate called
    without an active exception", exit 134), which torchrun or mpirun reports as a failed rank.
    """
    import os
    import sys

    _watchdog(TEARDOWN_WATCHDOG_S)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(code)


def finish(code: int = 0) -> None:
    """End a training script's rank: wait for every rank, then ``exit_process(code)``.

    Call it where the script's work ends, inside the function that holds the model (not after
    that function returned): nothing is torn down on the way out. Returning from that function
    frees the model, its optimizer and their tensors while gloo's worker threads can still be
    finishing the last collective, and tearing the group down joins those threads; either,
    once in a few fresh-clone runs of the ddp example, left one rank alive for good after its
    peers had exited (its last frame the line after ``main()`` returned, a gloo thread with no
    Python frame). Here the ranks meet in a barrier (with a process group up; a peer still
    writing its checkpoint, asynchronous saves included, is waited for), and the process ends at
    once, its output flushed. With ``code`` 0 the memory snapshots this rank wrote
    (``Checkpointer.snapshot``) are removed first: every rank reached the end, nothing will
    resume from them.
    ``shutdown_distributed()`` is for a rank that goes on without the group.
    """
    import gc
    import sys

    dist = _initialized_dist()
    gc.disable()  # no pass from here on can free what a gloo thread still uses (see above)
    if "runtime.checkpoint" in sys.modules:  # an asynchronous save on disk before anyone leaves
        sys.modules["runtime.checkpoint"].wait_for_saves()
    if dist is not None and dist.get_world_size() > 1:
        dist.barrier()
    if code == 0 and "runtime.checkpoint" in sys.modules:
        sys.modules["runtime.checkpoint"].drop_memory_snapshots()
    exit_process(code)


def _initialized_dist() -> Any:
    """torch.distributed when a process group is up in this process; else None."""
    import sys

    if "torch" not in sys.modules:  # never imported here: no group (and no torch to load)
        return None
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def ddp(model: Any, bucket_cap_mb: int = DEFAULT_BUCKET_CAP_MB, **kw: Any) -> Any:
    """Wrap ``model`` in DistributedDataParallel (on this rank's CUDA device when it has one).

    Without a process group (plain single-process run) the model is returned unwrapped.
    """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    if not (dist.is_available() and dist.is_initialized()):
        return model
    if torch.cuda.is_available() and "device_ids" not in kw:
        device = torch.cuda.current_device()
        model = model.to(device)
        kw["device_ids"] = [device]
    return DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb, **kw)


def scaled_lr(base_lr: float, base_batch: int, global_batch: int, step: int,
              warmup_steps: int = 0) -> float:
    """Learning rate by the linear scaling rule with gradual warmup (Goyal et al. 2017).

    Target ``base_lr * global_batch / base_batch``; over the first ``warmup_steps`` steps it rises
    linearly from ``base_lr`` (step 0) to the target (step ``warmup_steps`` onwards).
    """
    if base_batch <= 0 or global_batch <= 0:
        raise ValueError("scaled_lr: batch sizes must be positive")
    target = base_lr * global_batch / base_batch
    if warmup_steps <= 0 or step >= warmup_steps:
        return target
    return base_lr + (target - base_lr) * max(step, 0) / warmup_steps
