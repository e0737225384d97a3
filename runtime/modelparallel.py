"""Pipeline model parallelism from a ``[model_parallel]`` spec: profile, partition, run a stage.

``pipeline_stage(blocks, sample, loss_fn)`` is the one call a training rank makes::

    stage = runtime.pipeline_stage(blocks, sample, nn.functional.mse_loss)
    opt = torch.optim.SGD(stage.module.parameters(), lr=0.05)
    for x, y in batches:
        opt.zero_grad()
        loss = stage.step(x, y)          # a float on the last stage, None elsewhere
        opt.step()

Phase 1 (no ``plan`` file in the config): rank 0 profiles every block on a microbatch of the
sample (forward and backward time, parameter, gradient and activation bytes, the bytes it sends
on), writes ``$RIGDECK_JOB_DIR/model_parallel/profile.json``, partitions
(``runtime.partition``), writes ``plan.json`` next to it and broadcasts the plan; with a plan
file every rank reads that and nothing is profiled. Rank 0 reports the plan once
(``mp_plan`` event).

Phase 2: this rank's blocks become its stage (``torch.distributed.pipelining.PipelineStage``),
wrapped in activation checkpointing when asked, run by ``ScheduleGPipe`` (``simple``) or
``Schedule1F1B`` (``interleaved``). Every ``EVENT_EVERY`` steps each rank reports its stage's
wall step time, the time it was busy in its own forward and backward, and its peak memory
(``mp_stage`` event).

The configuration is ``$RIGDECK_MODEL_PARALLEL`` (JSON of the spec's table, set by rigdeck for
every rank) unless ``config=`` is given. Every block takes one tensor and returns one tensor.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from runtime.partition import (
    DEFAULT_BANDWIDTH,
    PartitionError,
    bubble,
    check_plan,
    check_request,
    partition,
)

ENV = "RIGDECK_MODEL_PARALLEL"
JOB_DIR_ENV = "RIGDECK_JOB_DIR"
EVENT_EVERY = 5
# Each block runs at least PROFILE_REPEATS times after a warm-up, and on until PROFILE_MIN_S of
# runs are measured (at most PROFILE_MAX_REPEATS): small blocks take microseconds, and one
# context switch on a busy host would otherwise be most of a figure.
PROFILE_REPEATS = 5
PROFILE_MIN_S = 0.05
PROFILE_MAX_REPEATS = 50
DEFAULTS: Dict[str, Any] = {
    "partitions": None, "microbatches": 1, "pipeline": "simple", "optimize": "speed",
    "activation_checkpointing": False, "profile_batch": None, "batch_size": None, "plan": None,
}


def _fail(message: str) -> SystemExit:
    return SystemExit(f"rigdeck model parallel: {message}")


def config_from_env(environ: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """The ``[model_parallel]`` table from ``$RIGDECK_MODEL_PARALLEL``, defaults filled in."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV)
    if not raw:
        raise _fail(f"${ENV} is not set: give pipeline_stage(config=...) or run the job from a "
                    "spec with a [model_parallel] table")
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise _fail(f"${ENV} is not JSON ({e})") from None
    if not isinstance(value, dict):
        raise _fail(f"${ENV} must be a JSON object, got {type(value).__name__}")
    return value


def _normalize(config: Dict[str, Any]) -> Dict[str, Any]:
    unknown = sorted(set(config) - set(DEFAULTS))
    if unknown:
        raise _fail(f"unknown model_parallel key{'s' if len(unknown) > 1 else ''} "
                    f"{', '.join(unknown)} (known: {', '.join(DEFAULTS)})")
    cfg = {**DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
    for key in ("partitions", "microbatches"):
        value = cfg[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _fail(f"model_parallel.{key} must be an int >= 1, got {value!r}")
    if not isinstance(cfg["activation_checkpointing"], bool):
        raise _fail("model_parallel.activation_checkpointing must be true or false, got "
                    f"{cfg['activation_checkpointing']!r}")
    return cfg


# -- measuring ---------------------------------------------------------------------------------


def _nbytes(t: Any) -> int:
    return int(t.numel() * t.element_size())


def _storage_key(t: Any) -> Tuple[str, int]:
    try:
        return (str(t.device), int(t.untyped_storage().data_ptr()))
    except (RuntimeError, NotImplementedError):  # no storage (sparse, meta...): by identity
        return ("id", id(t))


def _storage_bytes(t: Any) -> int:
    try:
        return int(t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return _nbytes(t)


class SavedBytes:
    """Bytes of tensors autograd holds for backward, live and peak, while its hooks are on.

    ``hooks()`` is a ``torch.autograd.graph.saved_tensors_hooks`` context: every tensor saved
    for backward in it is counted once per storage (several views of one buffer are one
    buffer) until the graph that holds it is freed. Parameters are left out (counted as
    parameters).
    """

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0
        self.total = 0  # bytes ever packed since reset (distinct storages at the time)
        self._refs: Dict[Tuple[str, int], List[int]] = {}  # key -> [count, bytes]
        self.exclude: set = set()

    def reset(self, exclude: Sequence[Any] = ()) -> None:
        self.peak = self.live
        self.total = 0
        self.exclude = {_storage_key(p) for p in exclude}

    def hooks(self) -> Any:
        import torch

        return torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def _pack(self, t: Any) -> Any:
        key = _storage_key(t)
        if key in self.exclude:
            return t
        ref = self._refs.get(key)
        if ref is None:
            size = _storage_bytes(t)
            self._refs[key] = [1, size]
            self.live += size
            self.total += size
            self.peak = max(self.peak, self.live)
        else:
            ref[0] += 1
        return _Held(t, key, self)

    def _release(self, key: Tuple[str, int]) -> None:
        ref = self._refs.get(key)
        if ref is None:
            return
        ref[0] -= 1
        if ref[0] <= 0:
            del self._refs[key]
            self.live -= ref[1]


class _Held:
    """A saved tensor while autograd holds it; its release is counted when the graph lets go."""

    __slots__ = ("tensor", "key", "meter")

    def __init__(self, tensor: Any, key: Tuple[str, int], meter: SavedBytes) -> None:
        self.tensor, self.key, self.meter = tensor, key, meter

    def __del__(self) -> None:
        self.meter._release(self.key)


def _unpack(held: Any) -> Any:
    return held.tensor if isinstance(held, _Held) else held


def _tensor_out(value: Any, where: str) -> Any:
    import torch

    if not isinstance(value, torch.Tensor):
        raise _fail(f"{where} returned {type(value).__name__}; pipeline_stage needs every block "
                    "to take one tensor and return one tensor")
    return value


class _Preserved:
    """Restore the RNG and the blocks' buffers and gradients after profiling or shape probing,
    so that training starts from exactly the state the script built (same on every rank)."""

    def __init__(self, blocks: Sequence[Any]) -> None:
        self.blocks = blocks

    def __enter__(self) -> "_Preserved":
        import torch

        self.rng = torch.get_rng_state()
        self.cuda_rng = (torch.cuda.get_rng_state_all()
                         if torch.cuda.is_available() and torch.cuda.is_initialized() else None)
        # By name: moving a module to another device replaces its buffer tensors.
        self.buffers = [{name: b.detach().clone() for name, b in blk.named_buffers()}
                        for blk in self.blocks]
        self.grads = [[(p, p.grad) for p in blk.parameters()] for blk in self.blocks]
        self.training = [blk.training for blk in self.blocks]
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch

        torch.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        with torch.no_grad():
            for blk, saved in zip(self.blocks, self.buffers):  # noqa: B905 (Python 3.9)
                for name, buf in blk.named_buffers():
                    if name in saved:
                        buf.copy_(saved[name].to(buf.device))
        for grads in self.grads:
            for p, grad in grads:
                p.grad = grad
        for blk, mode in zip(self.blocks, self.training):  # noqa: B905 (Python 3.9)
            blk.train(mode)


def _device_of(module: Any, default: Any) -> Any:
    for p in module.parameters():
        return p.device
    return default


def _sync(device: Any) -> None:
    import torch

    if getattr(device, "type", str(device)).startswith("cuda"):
        torch.cuda.synchronize(device)


def profile_blocks(blocks: Sequence[Any], sample: Any, device: Any = None,
                   repeats: int = PROFILE_REPEATS) -> Dict[str, Any]:
    """Time and measure every block on ``sample`` (one microbatch), in order, on ``device``.

    Per block: forward and backward seconds (the fastest of at least ``repeats`` runs after one
    warm-up, and of enough runs to fill ``PROFILE_MIN_S``: the least disturbed one), the
    bytes of its parameters and their gradients, the bytes it saves for backward (activations,
    counted with saved_tensors_hooks), and the bytes of its output (what goes to the next block).
    Each block visits ``device`` and goes back where it was; RNG, buffers and gradients are
    restored afterwards.
    """
    import torch

    device = torch.device(device) if device is not None else sample.device
    meter = SavedBytes()
    out_blocks: List[Dict[str, Any]] = []
    x = sample.detach().to(device).clone()  # its own storage: a slice of a batch is not counted whole
    input_bytes = _nbytes(x)
    with _Preserved(blocks):
        for index, block in enumerate(blocks):
            home = _device_of(block, device)
            block.to(device)
            block.train(True)
            params = list(block.parameters())
            if index and x.is_floating_point():  # as in the pipeline: the first input has no grad
                x = x.detach().requires_grad_(True)
            fwd: List[float] = []
            bwd: List[float] = []
            activation = 0
            out = None
            rep = 0
            while rep <= repeats or (sum(fwd) + sum(bwd) < PROFILE_MIN_S
                                     and rep <= PROFILE_MAX_REPEATS):
                meter.reset(params)
                _sync(device)
                t0 = time.perf_counter()
                with meter.hooks():
                    out = _tensor_out(block(x), f"block {index} ({type(block).__name__})")
                _sync(device)
                t1 = time.perf_counter()
                activation = meter.total
                if out.requires_grad:
                    out.backward(torch.ones_like(out))
                _sync(device)
                t2 = time.perf_counter()
                if rep:  # the first is a warm-up
                    fwd.append(t1 - t0)
                    bwd.append(t2 - t1)
                for p in params:
                    p.grad = None
                if x.requires_grad:
                    x.grad = None
                rep += 1
            assert out is not None
            param_bytes = sum(_nbytes(p) for p in params)
            out_blocks.append({
                "index": index, "name": type(block).__name__,
                "forward_s": min(fwd), "backward_s": min(bwd), "runs": len(fwd),
                "param_bytes": param_bytes,
                "grad_bytes": sum(_nbytes(p) for p in params if p.requires_grad),
                "activation_bytes": int(activation),
                "output_bytes": _nbytes(out), "output_shape": list(out.shape),
                "output_dtype": str(out.dtype).replace("torch.", ""),
            })
            x = out.detach()
            del out
            block.to(home)
    return {"version": 1, "device": str(device), "repeats": repeats,
            "microbatch_size": int(sample.shape[0]) if sample.dim() else 1,
            "input_bytes": input_bytes, "input_shape": list(sample.shape),
            "input_dtype": str(sample.dtype).replace("torch.", ""), "blocks": out_blocks}


# -- the stage ---------------------------------------------------------------------------------


class _Blocks:  # the nn.Module subclass is made on first use: torch loads lazily
    cls: Any = None


def _stage_module(blocks: Sequence[Any], checkpointing: bool, meter: SavedBytes,
                  clock: Dict[str, float], device: Any) -> Any:
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    if _Blocks.cls is None:
        class StageModule(nn.Module):
            """This rank's blocks in order; times its forward and counts what it saves."""

            def __init__(self, blocks: Sequence[Any], checkpointing: bool, meter: SavedBytes,
                         clock: Dict[str, float], device: Any) -> None:
                super().__init__()
                self.blocks = nn.ModuleList(blocks)
                self.checkpointing = checkpointing
                self._meter, self._clock, self._device = meter, clock, device

            def forward(self, x: Any) -> Any:
                _sync(self._device)
                t0 = time.perf_counter()
                with self._meter.hooks():
                    for block in self.blocks:
                        if self.checkpointing and torch.is_grad_enabled():
                            x = checkpoint(block, x, use_reentrant=False)
                        else:
                            x = block(x)
                _sync(self._device)
                self._clock["busy"] += time.perf_counter() - t0
                return x

        _Blocks.cls = StageModule
    return _Blocks.cls(blocks, checkpointing, meter, clock, device)


def _probe_shapes(blocks: Sequence[Any], start: int, stop: int, sample_mb: Any) -> Tuple[Any, Any]:
    """(input, output) of blocks[start:stop] for one microbatch: a no-grad forward through
    blocks[:stop] on this rank (state restored afterwards)."""
    import torch

    x = sample_mb
    inp = x
    with _Preserved(blocks[:stop]), torch.no_grad():
        for index, block in enumerate(blocks[:stop]):
            if index == start:
                inp = x
            x = _tensor_out(block(x.to(_device_of(block, x.device))), f"block {index}")
    return inp, x


def _job_dir() -> str:
    base = os.environ.get(JOB_DIR_ENV)
    if base:
        path = os.path.join(base, "model_parallel")
    else:
        path = tempfile.mkdtemp(prefix="rigdeck-model-parallel-")
        print(f"rigdeck model parallel: ${JOB_DIR_ENV} is not set; profile and plan go to {path}",
              file=sys.stderr, flush=True)
    os.makedirs(path, exist_ok=True)
    return path


def _write_json(path: str, value: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def _read_plan(path: str, partitions: int, blocks: int) -> Dict[str, Any]:
    try:
        with open(path) as f:
            plan = json.load(f)
    except OSError as e:
        raise _fail(f"model_parallel.plan: cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise _fail(f"model_parallel.plan: {path} is not JSON ({e})") from None
    try:
        return check_plan(plan, partitions, blocks, where=f"model_parallel.plan {path}")
    except PartitionError as e:
        raise _fail(str(e)) from None


class PipelineStageRunner:
    """This rank's stage: ``module`` (its blocks), ``plan``, ``step(inputs, target)``.

    ``stats`` keeps every step's figures (``step_time_s``, ``busy_s``, ``peak_bytes``).
    """

    def __init__(self, *, module: Any, stage: Any, schedule: Any, plan: Dict[str, Any],
                 index: int, device: Any, meter: SavedBytes, clock: Dict[str, float],
                 profile: Optional[Dict[str, Any]], directory: Optional[str],
                 batch_size: int) -> None:
        self.module = module
        self.batch_size = batch_size
        self.pipeline_stage = stage
        self.schedule = schedule
        self.plan = plan
        self.stage_index = index
        self.partitions = plan["partitions"]
        self.is_first = index == 0
        self.is_last = index == self.partitions - 1
        self.device = device
        self.profile = profile
        self.directory = directory
        self.stats: List[Dict[str, float]] = []
        self._meter, self._clock = meter, clock
        self._cuda = str(device).startswith("cuda")
        self._window: List[Dict[str, float]] = []

    def _peak_bytes(self) -> int:
        import torch

        if self._cuda:
            return int(torch.cuda.max_memory_allocated(self.device))
        params = list(self.module.parameters())
        state = sum(_nbytes(p) for p in params)
        state += sum(_nbytes(p.grad) for p in params if p.grad is not None)
        return int(state + self._meter.peak)

    def step(self, inputs: Any = None, target: Any = None) -> Optional[float]:
        """One step of the schedule: ``inputs`` feed the first stage, ``target`` the loss on
        the last (others may pass them too; they are not used). Returns the batch's mean loss
        on the last stage, else None. Gradients accumulate into ``module``'s parameters."""
        import torch

        if self.is_first and inputs is None:
            raise ValueError("stage.step(): the first stage needs inputs")
        if self.is_last and target is None:
            raise ValueError("stage.step(): the last stage needs a target")
        for name, value in (("inputs", inputs if self.is_first else None),
                            ("target", target if self.is_last else None)):
            if value is not None and int(value.shape[0]) != self.batch_size:
                raise ValueError(f"stage.step(): {name} has {int(value.shape[0])} rows; the "
                                 f"stages were built for batches of {self.batch_size} "
                                 "(model_parallel.batch_size, or profile_batch's first size)")
        if self._cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        self._meter.reset(list(self.module.parameters()))
        self._clock["busy"] = 0.0
        args = (inputs.to(self.device),) if self.is_first else ()
        losses: List[Any] = []
        kw: Dict[str, Any] = {}
        if self.is_last:
            kw = {"target": target.to(self.device), "losses": losses}
        _sync(self.device)
        t0 = time.perf_counter()
        self.schedule.step(*args, **kw)
        _sync(self.device)
        wall = time.perf_counter() - t0
        figures = {"step_time_s": wall, "busy_s": self._clock["busy"],
                   "peak_bytes": self._peak_bytes()}
        self.stats.append(figures)
        self._window.append(figures)
        n = len(self.stats) - 1
        if len(self._window) >= EVENT_EVERY:
            from runtime.metrics import reporter

            w = self._window
            reporter().event("mp_stage", stage=self.stage_index, step=n,
                             step_time_s=round(sum(f["step_time_s"] for f in w) / len(w), 6),
                             busy_s=round(sum(f["busy_s"] for f in w) / len(w), 6),
                             peak_bytes=int(max(f["peak_bytes"] for f in w)))
            self._window = []
        if self.is_last:
            return float(torch.stack([loss.detach() for loss in losses]).mean().item())
        return None


def _time_backward(stage: Any, clock: Dict[str, float], device: Any) -> None:
    """Add the stage's backward compute to ``clock["busy"]`` (wraps its backward helper)."""
    inner = getattr(stage, "backward_maybe_with_nosync", None)
    if inner is None:
        return

    def timed(*args: Any, **kwargs: Any) -> Any:
        _sync(device)
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            _sync(device)
            clock["busy"] += time.perf_counter() - t0

    stage.backward_maybe_with_nosync = timed


def _sample_tensor(sample: Any, cfg: Dict[str, Any]) -> Any:
    import torch

    if sample is None:
        shape = cfg.get("profile_batch")
        if isinstance(shape, str):
            main = sys.modules.get("__main__")
            fn = getattr(main, shape, None)
            if not callable(fn):
                raise _fail(f"model_parallel.profile_batch names {shape!r}, which is not a "
                            "function of the training script")
            sample = fn
        elif isinstance(shape, list) and shape and all(isinstance(d, int) for d in shape):
            sample = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
        else:
            raise _fail("no sample batch: pass pipeline_stage(sample=...) or set "
                        "model_parallel.profile_batch")
    if callable(sample) and not isinstance(sample, torch.Tensor):
        sample = sample()
    if not isinstance(sample, torch.Tensor) or sample.dim() == 0:
        raise _fail(f"the sample batch must be a tensor with a batch dimension, got "
                    f"{type(sample).__name__}")
    return sample


def pipeline_stage(blocks: Sequence[Any], sample: Any, loss_fn: Callable[[Any, Any], Any], *,
                   config: Optional[Dict[str, Any]] = None,
                   cuts: Optional[Sequence[int]] = None,
                   bandwidth: float = DEFAULT_BANDWIDTH) -> PipelineStageRunner:
    """This rank's pipeline stage of the model ``blocks`` (see the module docstring).

    ``sample``: a sample batch (a tensor whose first dimension is the batch size) or a
    zero-argument function returning one. ``config``: the ``[model_parallel]`` table (default:
    ``$RIGDECK_MODEL_PARALLEL``). ``cuts``: force these cut points instead of the partitioner's
    (profiling still runs, for the expected figures; e.g. the equal-layer split, to compare).
    ``bandwidth``: bytes/s between stages, for the expected send times.

    Errors that make the job impossible (more partitions than blocks, a world size that is not
    the partition count, a batch the microbatches do not divide, a plan file that does not fit)
    raise SystemExit with a message naming the ``model_parallel`` field, on every rank, before
    any training step.
    """
    import torch
    import torch.distributed.pipelining  # noqa: F401  (a torch without it fails here, before any check)

    from runtime.distributed import init_distributed
    from runtime.metrics import reporter

    blocks = list(blocks)
    req = _stage_request(blocks, sample, config)
    info = init_distributed()
    device = torch.device(info.device)
    plan, profile, directory = _stage_plan(req, blocks, info.rank, device, cuts, bandwidth)
    if info.rank == 0:
        reporter().event("mp_plan", plan=plan)
    return _stage_runner(req, blocks, info.rank, device, plan, loss_fn, profile, directory)


@dataclass(frozen=True)
class _StageRequest:
    """What ``pipeline_stage`` was asked for, checked on every rank before torch.distributed
    starts: the ``[model_parallel]`` table, the batch and one microbatch of the sample."""

    cfg: Dict[str, Any]  # the [model_parallel] table, normalized
    partitions: int
    microbatches: int
    schedule: str  # model_parallel.pipeline
    batch: int
    sample_mb: Any  # the sample's first microbatch (a tensor)
    plan_from_file: Optional[Dict[str, Any]]  # model_parallel.plan's plan, read and checked


def _stage_request(blocks: List[Any], sample: Any, config: Optional[Dict[str, Any]]) -> _StageRequest:
    """The request checked: partitions against blocks and the world size, the schedule against
    the microbatches, the microbatches against the batch, a plan file against the model. Any
    misfit is SystemExit naming the ``model_parallel`` field."""
    from runtime.cluster import cluster_info

    cfg = _normalize(dict(config_from_env() if config is None else config))
    p, m, schedule_name = cfg["partitions"], cfg["microbatches"], cfg["pipeline"]
    try:
        check_request(len(blocks), p, cfg["optimize"], m, schedule_name)
    except PartitionError as e:
        raise _fail(str(e)) from None
    if schedule_name == "interleaved" and m < p:
        raise _fail(f"model_parallel.pipeline = 'interleaved' needs model_parallel.microbatches "
                    f">= model_parallel.partitions ({m} < {p})")
    world = cluster_info().world_size
    if world != p:
        raise _fail(f"model_parallel.partitions = {p} needs a world size of {p} (one stage per "
                    f"rank), this job has {world}")
    sample_t = _sample_tensor(sample, cfg)
    shape = cfg["profile_batch"]
    batch = cfg["batch_size"] or (shape[0] if isinstance(shape, list) and shape
                                  else int(sample_t.shape[0]))
    if batch % m:
        raise _fail(f"model_parallel.microbatches = {m} does not divide the batch size {batch}")
    micro = batch // m
    if sample_t.shape[0] < micro:
        raise _fail(f"the sample batch has {sample_t.shape[0]} rows, fewer than one microbatch "
                    f"(batch size {batch} / model_parallel.microbatches {m} = {micro})")
    plan_file = cfg["plan"]
    plan_from_file = None
    if plan_file:
        plan_from_file = _read_plan(str(plan_file), p, len(blocks))  # every rank, before init
    return _StageRequest(cfg=cfg, partitions=p, microbatches=m, schedule=schedule_name, batch=batch,
                         sample_mb=sample_t[:micro], plan_from_file=plan_from_file)


def _stage_plan(req: _StageRequest, blocks: List[Any], rank: int, device: Any,
                cuts: Optional[Sequence[int]], bandwidth: float
                ) -> Tuple[Dict[str, Any], Optional[Dict[str, Any]], Optional[str]]:
    """The plan every rank follows, with rank 0's profile and the job directory it wrote them
    to (None, None with a plan file). Rank 0 profiles and partitions, then broadcasts the plan,
    or its error: every rank must hear of a failure, not wait for a plan."""
    import torch.distributed as dist

    if req.plan_from_file is not None:
        plan = {**req.plan_from_file, "source": "file", "schedule": req.schedule,
                "microbatches": req.microbatches, "bubble": bubble(req.partitions, req.microbatches)}
        return plan, None, None
    cfg, m = req.cfg, req.microbatches
    profile = None
    directory = None
    payload: List[Any] = [None]
    if rank == 0:
        try:
            directory = _job_dir()
            profile = profile_blocks(blocks, req.sample_mb, device)
            profile["batch_size"], profile["microbatches"] = req.batch, m
            _write_json(os.path.join(directory, "profile.json"), profile)
            plan = partition(profile, req.partitions, cfg["optimize"], m, req.schedule,
                             bandwidth=bandwidth,
                             activation_checkpointing=cfg["activation_checkpointing"],
                             cuts=cuts)
            _write_json(os.path.join(directory, "plan.json"), plan)
            payload = [plan]
        except (Exception, SystemExit) as e:  # every rank must hear of it, not wait
            if not isinstance(e, (PartitionError, SystemExit)):
                import traceback

                traceback.print_exc()
            payload = [{"error": f"{type(e).__name__}: {e}"
                        if not isinstance(e, (PartitionError, SystemExit)) else str(e)}]
    dist.broadcast_object_list(payload, src=0)
    got = payload[0]
    if not isinstance(got, dict) or "error" in got:
        message = got.get("error") if isinstance(got, dict) else "no plan from rank 0"
        raise SystemExit(message if str(message).startswith("rigdeck") else
                         f"rigdeck model parallel: profiling on rank 0 failed: {message}")
    return got, profile, directory


def _stage_runner(req: _StageRequest, blocks: List[Any], index: int, device: Any, plan: Dict[str, Any],
                  loss_fn: Callable[[Any, Any], Any], profile: Optional[Dict[str, Any]],
                  directory: Optional[str]) -> PipelineStageRunner:
    """This rank's blocks of the plan as a torch PipelineStage (its input and output shapes
    probed on the sample microbatch) with its schedule, ready to step."""
    import torch
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    p, m = req.partitions, req.microbatches
    bounds = [0, *plan["cuts"], len(blocks)]
    start, stop = bounds[index], bounds[index + 1]
    inp, out = _probe_shapes(blocks, start, stop, req.sample_mb)
    meter = SavedBytes()
    clock = {"busy": 0.0}
    module = _stage_module(blocks[start:stop], req.cfg["activation_checkpointing"], meter, clock,
                           device)
    module.to(device)
    first = index == 0
    input_args = torch.empty(inp.shape, dtype=inp.dtype, device=device,
                             requires_grad=(not first) and inp.is_floating_point())
    output_args = torch.empty(out.shape, dtype=out.dtype, device=device, requires_grad=True)
    stage = PipelineStage(module, index, p, device, input_args=input_args,
                          output_args=output_args)
    _time_backward(stage, clock, device)
    schedule_cls = ScheduleGPipe if req.schedule == "simple" else Schedule1F1B
    schedule = schedule_cls(stage, n_microbatches=m, loss_fn=loss_fn)
    return PipelineStageRunner(module=module, stage=stage, schedule=schedule, plan=plan,
                               index=index, device=device, meter=meter, clock=clock,
                               profile=profile, directory=directory, batch_size=req.batch)
