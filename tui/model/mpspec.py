"""A job spec's ``[model_parallel]`` table: a pipeline-parallel job's stages, schedule and plan.

The format is in docs/contracts.md ("Model parallelism"). Everything that can be known before
the job starts is checked here, with the same kit as the rest of the spec (tui.model.fields), so
a bad table names its field: partitions that are not the job's world size, microbatches that do
not divide the batch, an interleaved schedule with fewer microbatches than stages, and a plan
file that is missing or is for another number of stages (or fewer blocks than stages).

Whether the model has at least ``partitions`` blocks cannot be known before the script builds
it, unless a plan file says so: without one, ``runtime`` checks it in the profiling phase.

Nothing here profiles or partitions: every rank gets the parsed table as JSON in
``RIGDECK_MODEL_PARALLEL`` (``ModelParallelSpec.to_env``) and ``runtime`` does the rest.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tui.model.fields import Bad, Check, ErrorFactory, boolean, checked, int_range, is_int, one_of, show

__all__ = [
    "ENV_VAR",
    "OPTIMIZE",
    "SCHEDULES",
    "ModelParallelSpec",
    "parse_model_parallel",
]

ENV_VAR = "RIGDECK_MODEL_PARALLEL"
SCHEDULES = ("simple", "interleaved")  # torch.distributed.pipelining: ScheduleGPipe, Schedule1F1B
OPTIMIZE = ("speed", "memory")
MAX_PLAN_BYTES = 4 << 20  # a plan is a few KiB; a file this big is not one
MAX_SHAPE_DIMS = 8
_FUNCTION_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


@dataclass(frozen=True)
class ModelParallelSpec:
    """``[model_parallel]`` as checked, defaults filled. ``profile_batch`` is a sample input's
    shape (its first dimension the batch size) or the name of a function in the training script
    that returns a sample batch (None: a plan is given, nothing is profiled); ``plan`` is a plan
    file's path relative to the workdir, as the spec wrote it (None: profile first)."""

    partitions: int
    microbatches: int
    batch_size: int
    pipeline: str = "simple"
    optimize: str = "speed"
    activation_checkpointing: bool = False
    profile_batch: tuple[int, ...] | str | None = None
    plan: str | None = None

    def to_dict(self) -> dict[str, Any]:
        pb = self.profile_batch
        return {
            "partitions": self.partitions,
            "microbatches": self.microbatches,
            "pipeline": self.pipeline,
            "optimize": self.optimize,
            "activation_checkpointing": self.activation_checkpointing,
            "profile_batch": list(pb) if isinstance(pb, tuple) else pb,
            "batch_size": self.batch_size,
            "plan": self.plan,
        }

    def to_env(self) -> str:
        """The value of ``RIGDECK_MODEL_PARALLEL``: every key, defaults filled, as JSON."""
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelParallelSpec:
        """The inverse of ``to_dict`` (trusted input: the job history's copy of the spec)."""
        pb = d.get("profile_batch")
        return cls(
            partitions=int(d["partitions"]),
            microbatches=int(d["microbatches"]),
            batch_size=int(d["batch_size"]),
            pipeline=str(d.get("pipeline") or "simple"),
            optimize=str(d.get("optimize") or "speed"),
            activation_checkpointing=bool(d.get("activation_checkpointing")),
            profile_batch=tuple(int(x) for x in pb) if isinstance(pb, list) else pb,
            plan=d.get("plan"),
        )


# ---------------------------------------------------------------------------------------------
# Field checks


def _profile_batch(v: Any) -> tuple[int, ...] | str:
    if isinstance(v, str):
        if _FUNCTION_RE.fullmatch(v):
            return v
        raise Bad("the name of a function in the training script (letters, digits and '_', "
                  "not starting with a digit) that returns a sample batch")
    if isinstance(v, list) and 1 <= len(v) <= MAX_SHAPE_DIMS and all(is_int(x) and x >= 1 for x in v):
        return tuple(int(x) for x in v)
    raise Bad()


def _plan_path(v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise Bad()
    if os.path.isabs(v) or v.startswith("~"):
        raise Bad("a plan file's path relative to the workdir (every host reads it there)")
    return v


_PROFILE_EXPECTED = ("a sample input's shape (a list of 1-8 integers >= 1, the first the batch "
                     "size) or the name of a function in the training script that returns a "
                     "sample batch")
CHECKS: dict[str, Check] = {
    "partitions": Check("an integer >= 2 (pipeline stages: one rank each)", int_range(2)),
    "microbatches": Check("an integer >= 1 (each batch is split into this many)", int_range(1)),
    "pipeline": Check(" or ".join(f'"{s}"' for s in SCHEDULES), one_of(SCHEDULES)),
    "optimize": Check(" or ".join(f'"{s}"' for s in OPTIMIZE), one_of(OPTIMIZE)),
    "activation_checkpointing": Check("true or false", boolean),
    "profile_batch": Check(_PROFILE_EXPECTED, _profile_batch),
    "batch_size": Check("an integer >= 1 (the training batch, split into microbatches)", int_range(1)),
    "plan": Check("a plan file: a path relative to the workdir", _plan_path),
}


# ---------------------------------------------------------------------------------------------
# The table as a whole


def parse_model_parallel(
    raw: Any,
    error: ErrorFactory,
    *,
    world_size: int,
    world_text: str,
    workdir: str,
) -> ModelParallelSpec:
    """Check a ``[model_parallel]`` table. ``error(field, expected, got)`` makes the spec's own
    error (fields are named ``model_parallel.FIELD``); ``world_size`` is the job's, and
    ``world_text`` says how the spec makes it (``"nodes 3 x processes_per_node 1"``);
    ``workdir`` is the job's directory on this machine, where a ``plan`` file is read."""
    if not isinstance(raw, dict):
        raise error("model_parallel", "a table ([model_parallel])", raw)

    def sub_error(field: str, expected: str, got: Any) -> Exception:
        return error(f"model_parallel.{field}", expected, got)

    values = checked(raw, CHECKS, sub_error)
    for key in ("partitions", "microbatches"):
        if key not in values:
            raise sub_error(key, f"{CHECKS[key].expected} (required in [model_parallel])", None)
    partitions: int = values["partitions"]
    microbatches: int = values["microbatches"]
    pipeline: str = values.get("pipeline", "simple")
    profile = values.get("profile_batch")
    plan = values.get("plan")

    if profile is None and plan is None:
        raise sub_error("profile_batch", f"{_PROFILE_EXPECTED} (required unless a plan file is "
                        "given: the profiling run measures the model on it)", None)
    batch = values.get("batch_size")
    if isinstance(profile, tuple):
        if batch is None:
            batch = profile[0]
        elif batch != profile[0]:
            raise sub_error("batch_size", f"the first dimension of profile_batch ({profile[0]}), "
                            "or leave batch_size out", batch)
    elif batch is None:
        why = ("profile_batch names a function, so the batch size is not known"
               if profile is not None else "no profile_batch gives it")
        raise sub_error("batch_size", f"{CHECKS['batch_size'].expected} (required: {why})", None)

    if batch % microbatches:
        raise sub_error("microbatches", f"a divisor of the batch size {batch} (every microbatch "
                        "the same size)", microbatches)
    if pipeline == "interleaved" and microbatches < partitions:
        raise sub_error("microbatches", f"at least partitions ({partitions}) with pipeline = "
                        '"interleaved" (1F1B needs a microbatch in flight on every stage)',
                        microbatches)
    if world_size != partitions:
        raise sub_error("partitions", f"the job's world size, one rank per stage: {world_text} "
                        f"= {world_size} rank{'' if world_size == 1 else 's'}; set partitions = "
                        f"{world_size}, or nodes and processes_per_node (or gpus_per_node) so "
                        f"that they make {partitions}", partitions)
    if plan is not None:
        _check_plan(os.path.join(workdir, plan), plan, partitions, sub_error)
    return ModelParallelSpec(
        partitions=partitions,
        microbatches=microbatches,
        batch_size=batch,
        pipeline=pipeline,
        optimize=values.get("optimize", "speed"),
        activation_checkpointing=values.get("activation_checkpointing", False),
        profile_batch=profile,
        plan=plan,
    )


def _check_plan(path: str, given: str, partitions: int,
                error: Callable[[str, str, Any], Exception]) -> None:
    """The plan file exists here, is a plan, and is one for ``partitions`` stages (read locally,
    at submit time: the workdir is this machine's, or the directory [code] sync ships)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PLAN_BYTES + 1)
    except FileNotFoundError:
        raise error("plan", f"an existing plan file (relative to the workdir): {path} does not "
                    "exist", given) from None
    except OSError as e:
        raise error("plan", f"a readable plan file: {path}: {e.strerror or e}", given) from None
    if len(data) > MAX_PLAN_BYTES:
        raise error("plan", f"a plan file of at most {MAX_PLAN_BYTES >> 20} MiB: {path} is larger",
                    given)
    try:
        plan = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise error("plan", f"a plan file of JSON (the plan.json a profiling run writes): {path}: {e}",
                    given) from None
    what = "a plan (as a profiling run writes it: an object with blocks, cuts and stages)"
    if not isinstance(plan, dict):
        raise error("plan", f"{what}: {path} holds no object", given)
    stages, blocks, cuts = plan.get("stages"), plan.get("blocks"), plan.get("cuts")
    if not isinstance(stages, list) or not isinstance(blocks, int) or isinstance(blocks, bool) \
            or not isinstance(cuts, list):
        raise error("plan", f"{what}: {path} lacks them", given)
    if len(stages) != partitions:
        raise error("plan", f"a plan for partitions = {partitions} stages: {path} has "
                    f"{len(stages)}", given)
    if blocks < partitions:
        raise error("partitions", f"at most the model's number of blocks ({blocks}, as the plan "
                    f"file {path} says): a stage needs at least one block", partitions)
    bounds = [0, *cuts, blocks]
    ok = len(cuts) == partitions - 1 and all(is_int(c) for c in cuts)
    if not ok or any(a >= b for a, b in zip(bounds, bounds[1:], strict=False)):
        raise error("plan", f"{what}: {path} has cuts {show(cuts)}, which do not split {blocks} "
                    f"blocks into {partitions} stages", given)
