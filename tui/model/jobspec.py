"""Job specs: what to run, on how many hosts and GPUs, and for how long, read from TOML.

The format is in docs/contracts.md ("Job spec"). Nothing here touches a host: loading checks
every field and returns a frozen ``JobSpec`` that the scheduler places and the controller turns
into a job plan.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import functools
import json
import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tui.model.codesync import DEFAULT_MAX_FILES, DEFAULT_MAX_MB, CodeSpec
from tui.model.containerspec import CONTAINER_RUNTIMES, ContainerSpec
from tui.model.fields import (
    ENV_NAME_RE,
    Bad,
    Check,
    boolean,
    checked,
    int_range,
    is_int,
    nonblank,
    number,
    show,
    unknown_field,
)
from tui.model.health import HealthSpec
from tui.model.inventory import NAME_RE as HOST_NAME_RE
from tui.model.inventory import SLURM_JOB_FIELDS
from tui.model.mpspec import ModelParallelSpec, parse_model_parallel
from tui.model.poolspec import (
    KINDS,
    POOL_CONTAINER_EXPECTED,
    POOL_EXCLUDES,
    PoolSpec,
    ProcessingSpec,
    parse_pools,
    parse_processing,
)
from tui.model.sweepspec import (
    HP_PLACEHOLDER_RE,
    SweepSpec,
    format_hp,
    parse_sweep,
    substitute_command,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "DEFAULT_GRACE_S",
    "DEFAULT_LOSS_PATTERN",
    "DEFAULT_MAX_RUNTIME_S",
    "LAUNCHERS",
    "MAX_RUNTIME_LIMIT_S",
    "CheckpointSpec",
    "ContainerSpec",
    "JobSpec",
    "JobSpecError",
    "RestartSpec",
    "jobspec_from_data",
    "jobspec_from_toml",
    "load_jobspec",
    "parse_duration",
    "parse_loss",
]

LAUNCHERS = ("direct", "torchrun", "mpirun")
# SageMaker's StoppingCondition.MaxRuntimeInSeconds: default one day, at most 28 days.
DEFAULT_MAX_RUNTIME_S = 24 * 3600
MAX_RUNTIME_LIMIT_S = 28 * 24 * 3600
DEFAULT_GRACE_S = 30.0

# Sizes a host can take. Linux refuses one argument or environment string over 128 KiB
# (MAX_ARG_STRLEN) and all of them together over ARG_MAX; the plan that carries them to the
# agent is one protocol message of under 1 MiB (agent/protocol.py MAX_MESSAGE_BYTES), where JSON
# may write a control character as six. Checked here, before anything starts, so that a spec
# too big fails with its field named instead of on a host halfway through a launch.
MAX_ARG_BYTES = 64 * 1024  # one command argument, env value or mpi option
MAX_ARGV_BYTES = 128 * 1024  # all of command (or of mpi.custom_options, or of env) together
MAX_HYPERPARAMETERS_BYTES = 32 * 1024  # as JSON: copied into several SM_* variables
MAX_PATH_BYTES = 4096  # PATH_MAX: workdir, checkpoint.dir, channel paths
MAX_SPEC_JSON_BYTES = 512 * 1024  # the spec as the job plan carries it

JOB_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
# "host:NAME/gpu:I"; NAME as in the inventory, I a physical GPU index (or local rank without GPUs).
_OWNER_HOST_RE = re.compile(r"host:(?P<host>[^/]*)/gpu:(?P<gpu>[^/]*)")
OWNER_POLICIES = ("rank0", "per-node", "all")

# Units largest first, each at most once: "1d", "2h", "90m", "45s", "1h30m", "1.5h", "1h 30m".
_DURATION_RE = re.compile(
    r"\s*(?:(?P<d>\d+(?:\.\d+)?)\s*d)?\s*(?:(?P<h>\d+(?:\.\d+)?)\s*h)?"
    r"\s*(?:(?P<m>\d+(?:\.\d+)?)\s*m)?\s*(?:(?P<s>\d+(?:\.\d+)?)\s*s)?\s*",
    re.IGNORECASE,
)
_UNIT_S = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}

# The training loss on a log line: the word "loss" on its own, optionally quoted, then "=", ":"
# or spaces, then a number (or nan/inf, which a diverging run prints). "val_loss", "train_loss",
# "val/loss", "eval.loss" and "loss_scale" are other quantities and do not match: "loss" must not
# be part of a longer name (letters, digits, "_", "-", "." or "/" before it, a name character
# after it). Case-insensitive.
DEFAULT_LOSS_PATTERN = (
    r"(?i)(?<![A-Za-z0-9_./-])['\"]?loss['\"]?(?:\s*[=:]\s*|\s+)"
    r"(?P<loss>[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|nan(?![a-z])|inf(?:inity)?(?![a-z])))"
)


PRIORITY_MIN, PRIORITY_MAX = -1000, 1000  # a job's priority; a server caps a member's lower


class JobSpecError(ValueError):
    """A problem in a job spec that the user can fix.

    ``field`` is dotted (``restart.max_restarts``, ``env.PATH``), or None for problems with the
    file as a whole; ``got`` is the offending value (None: nothing to show).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        field: str | None,
        expected: str,
        got: Any = None,
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.field = field
        self.expected = expected
        self.got = got
        super().__init__(self._message())

    def _message(self) -> str:
        parts = [str(self.path) if self.path is not None else "<job spec>"]
        if self.field is not None:
            parts.append(f"field {self.field!r}")
        text = f"expected {self.expected}"
        if self.got is not None:
            # Control characters are shown as they are, as job spec messages always have.
            text += f", got {show(self.got, escape_controls=False)} ({_type_name(self.got)})"
        parts.append(text)
        return ": ".join(parts)


@dataclass(frozen=True)
class CheckpointSpec:
    """``[checkpoint]``: where checkpoints go and which rank writes them."""

    dir: str | None = None
    owner: str = "rank0"  # "rank0" | "host:NAME/gpu:I" | "per-node" | "all"


@dataclass(frozen=True)
class RestartSpec:
    """``[restart]``: gang restarts; no exit codes listed means any non-zero exit restarts."""

    max_restarts: int = 0
    on_exit_codes: tuple[int, ...] = ()


@dataclass(frozen=True)
class ScalingSpec:
    """``[scaling]``: the world size the learning rate was tuned at, for the linear scaling rule
    (Goyal et al. 2017): at another world size the job view shows ``base_lr * world /
    reference_world_size``, reached over ``warmup_steps`` (``runtime.scaled_lr``'s rule)."""

    reference_world_size: int
    base_lr: float
    warmup_steps: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"reference_world_size": self.reference_world_size, "base_lr": self.base_lr,
                "warmup_steps": self.warmup_steps}


@dataclass(frozen=True)
class JobSpec:
    """One validated job spec. ``nodes`` is None when the spec did not say (see node_count)."""

    name: str
    command: tuple[str, ...]
    workdir: str
    launcher: str = "direct"
    nodes: int | None = None
    hosts: tuple[str, ...] = ()
    gpus_per_node: int | None = None
    processes_per_node: int | None = None
    env: tuple[tuple[str, str], ...] = ()
    max_runtime_s: int = DEFAULT_MAX_RUNTIME_S
    grace_s: float = DEFAULT_GRACE_S
    # Values as TOML gave them (lists, tables): treat them as read-only.
    hyperparameters: tuple[tuple[str, Any], ...] = ()
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    restart: RestartSpec = field(default_factory=RestartSpec)
    health: HealthSpec = field(default_factory=HealthSpec)  # ``[health]``: hangs, lost hosts, NaN
    mpi_custom_options: tuple[str, ...] = ()
    loss_pattern: str | None = None
    log_max_mb: int | None = None  # each rank's log kept on its host, rotated beyond this
    total_steps: int | None = None
    channels: tuple[tuple[str, str], ...] = ()
    priority: int = 0  # the queue starts higher priorities first, FIFO within one
    # May a higher-priority job stop this one? True: yes, and it resumes from its [checkpoint]
    # dir; "restart": yes, and it may start over (no checkpoint to resume from); False: never.
    preemptible: bool | str = False
    # A sweep's spec has ``sweep``; each of its trials is a spec without it, with ``trial`` (the
    # trial's number as a string from "1", as Vertex writes it), ``sweep_id`` and the sweep's
    # metric definitions (read off rank 0's output).
    sweep: SweepSpec | None = None
    trial: str | None = None
    sweep_id: str | None = None
    metric_definitions: tuple[tuple[str, str], ...] = ()
    # ``[code] sync``: a directory on the operator's machine shipped to the hosts before the
    # job starts; the job runs in the host's copy (and ``workdir`` is that directory here).
    code: CodeSpec | None = None
    # A pipeline step's job (tui.model.pipelinespec): artifacts of earlier steps staged on its
    # hosts before it starts. ``inputs``: channel -> an artifact (``{"tree", "files",
    # "sources", "from"}``: the manifest's hash, its rows ``[path, sha256, size, executable]``,
    # which hosts hold which contents, and ``steps.X.output`` it came from); its channel
    # ``input/data/<channel>`` is the host's copy. ``seed_checkpoint``: an artifact copied into
    # the job's checkpoint dir before its first attempt (``continue_from``).
    inputs: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    seed_checkpoint: Mapping[str, Any] | None = None
    pipeline_id: str | None = None
    step: str | None = None
    scaling: ScalingSpec | None = None
    # ``[model_parallel]``: a pipeline-parallel job (tui.model.mpspec); its ranks get it as
    # RIGDECK_MODEL_PARALLEL.
    model_parallel: ModelParallelSpec | None = None
    # ``kind = "processing"``: SageMaker Processing's contract, ``[processing]`` its inputs and
    # outputs; ``[[pools]]``: Vertex's worker pools (tui.model.poolspec), in the spec's order.
    kind: str = "training"
    pools: tuple[PoolSpec, ...] = ()
    processing: ProcessingSpec | None = None
    # ``[slurm]``: on a Slurm cluster, sbatch's partition, account, qos, constraint for this job
    # (over the inventory's [slurm]); (name, value) pairs.
    slurm: tuple[tuple[str, str], ...] = ()
    # ``[container]``: the ranks of each host run in one container (agent/container.py).
    container: ContainerSpec | None = None
    path: Path | None = None
    # ``env_from_file``: a file of NAME=value lines on the workstation (absolute). Its values are
    # read again at every start (``read_env_file``), sent to the hosts for the ranks only, and
    # never kept in the spec: only the file and the names it held when checked.
    env_from_file: str | None = None
    env_file_names: tuple[str, ...] = ()

    def __hash__(self) -> int:
        # Hyperparameters may hold lists and tables, so hash the canonical JSON form instead.
        return hash(json.dumps(self.to_dict(), sort_keys=True))

    @property
    def node_count(self) -> int:
        """How many hosts the job runs on: ``nodes``, else the number of ``hosts``, else 1.
        A pool job: its replicas, all pools together (several may share a host)."""
        if self.pools:
            return sum(p.replicas for p in self.pools)
        if self.nodes is not None:
            return self.nodes
        return len(self.hosts) or 1

    @property
    def uses_gpus(self) -> bool:
        if self.pools:
            return any(p.uses_gpus for p in self.pools)
        return self.gpus_per_node is not None

    @property
    def slots_per_node(self) -> int:
        """Ranks on each host: one per GPU, or ``processes_per_node``."""
        return self.gpus_per_node or self.processes_per_node or 1

    @property
    def world_size(self) -> int:
        """Every rank of the job (a pool job: of every pool; torch's world is the primary's and
        the workers' only, ``torch_world_size``)."""
        if self.pools:
            return sum(p.replicas * p.slots for p in self.pools)
        return self.node_count * self.slots_per_node

    @property
    def torch_world_size(self) -> int:
        if self.pools:
            return sum(p.replicas * p.slots for p in self.pools if p.in_world)
        return self.world_size

    def container_of(self, pool: PoolSpec | None = None) -> ContainerSpec | None:
        """The container the ranks run in: the job's ``[container]``; a pool's own ``container``
        over it (``false``: that pool on the hosts themselves). None: on the hosts."""
        if pool is not None and pool.container is not None:
            return pool.container or None
        return self.container

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form (job history); ``from_dict`` reads it back."""
        return {
            "name": self.name,
            "command": list(self.command),
            "workdir": self.workdir,
            "launcher": self.launcher,
            "nodes": self.nodes,
            "hosts": list(self.hosts),
            "gpus_per_node": self.gpus_per_node,
            "processes_per_node": self.processes_per_node,
            "env": dict(self.env),
            "max_runtime_s": self.max_runtime_s,
            "grace_s": self.grace_s,
            "hyperparameters": copy.deepcopy(dict(self.hyperparameters)),
            "checkpoint": {"dir": self.checkpoint.dir, "owner": self.checkpoint.owner},
            "restart": {
                "max_restarts": self.restart.max_restarts,
                "on_exit_codes": list(self.restart.on_exit_codes),
            },
            "health": self.health.to_dict(),
            "mpi": {"custom_options": list(self.mpi_custom_options)},
            "loss_pattern": self.loss_pattern,
            "log_max_mb": self.log_max_mb,
            "total_steps": self.total_steps,
            "channels": dict(self.channels),
            "priority": self.priority,
            "preemptible": self.preemptible,
            "sweep": self.sweep.to_dict() if self.sweep is not None else None,
            "trial": self.trial,
            "sweep_id": self.sweep_id,
            "metric_definitions": [list(d) for d in self.metric_definitions],
            "code": self.code.to_dict() if self.code is not None else None,
            "inputs": {k: copy.deepcopy(dict(v)) for k, v in self.inputs},
            "seed_checkpoint": copy.deepcopy(dict(self.seed_checkpoint)) if self.seed_checkpoint else None,
            "pipeline_id": self.pipeline_id,
            "step": self.step,
            "scaling": self.scaling.to_dict() if self.scaling is not None else None,
            "model_parallel": self.model_parallel.to_dict() if self.model_parallel is not None else None,
            "kind": self.kind,
            "pools": [p.to_dict() for p in self.pools],
            "processing": self.processing.to_dict() if self.processing is not None else None,
            "slurm": dict(self.slurm),
            "container": self.container.to_dict() if self.container is not None else None,
            "path": str(self.path) if self.path is not None else None,
            # Only when set: the wire and the history of a spec without one stay as they were.
            **({"env_from_file": self.env_from_file, "env_file_names": list(self.env_file_names)}
               if self.env_from_file else {}),
        }

    def for_trial(self, number: int, values: Mapping[str, Any], sweep_id: str) -> JobSpec:
        """Trial ``number`` (from 1) of this sweep's spec, with ``values`` for its parameters:
        an ordinary job spec whose hyperparameters carry them (so hyperparameters.json and
        SM_HP_* do) and whose command has each ``{hp.NAME}`` filled in."""
        assert self.sweep is not None
        hps = {**dict(self.hyperparameters), **dict(values)}
        suffix = f"-t{number}"

        def pool(p: PoolSpec) -> PoolSpec:
            command = substitute_command(p.command, hps) if p.command is not None else None
            return dataclasses.replace(p, command=command, container=_trial_container(p.container, hps))

        return dataclasses.replace(
            self,
            name=self.name[: 64 - len(suffix)] + suffix,
            command=substitute_command(self.command, hps),
            pools=tuple(pool(p) for p in self.pools),
            container=_trial_container(self.container, hps),
            hyperparameters=tuple(hps.items()),
            sweep=None,
            trial=str(number),
            sweep_id=sweep_id,
            metric_definitions=tuple((d.name, d.regex) for d in self.sweep.metric_definitions),
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JobSpec:
        """The inverse of ``to_dict``. The input is trusted (it was written by ``to_dict``)."""
        checkpoint = d.get("checkpoint") or {}
        restart = d.get("restart") or {}
        mpi = d.get("mpi") or {}
        path = d.get("path")
        return cls(
            name=d["name"],
            command=tuple(d["command"]),
            workdir=d["workdir"],
            launcher=d.get("launcher", "direct"),
            nodes=d.get("nodes"),
            hosts=tuple(d.get("hosts") or ()),
            gpus_per_node=d.get("gpus_per_node"),
            processes_per_node=d.get("processes_per_node"),
            env=tuple((d.get("env") or {}).items()),
            max_runtime_s=int(d.get("max_runtime_s", DEFAULT_MAX_RUNTIME_S)),
            priority=int(d.get("priority") or 0),
            preemptible=d.get("preemptible") or False,
            grace_s=float(d.get("grace_s", DEFAULT_GRACE_S)),
            hyperparameters=tuple(copy.deepcopy(d.get("hyperparameters") or {}).items()),
            checkpoint=CheckpointSpec(
                dir=checkpoint.get("dir"), owner=checkpoint.get("owner", "rank0")
            ),
            restart=RestartSpec(
                max_restarts=int(restart.get("max_restarts", 0)),
                on_exit_codes=tuple(restart.get("on_exit_codes") or ()),
            ),
            health=HealthSpec.from_dict(d.get("health")),
            mpi_custom_options=tuple(mpi.get("custom_options") or ()),
            loss_pattern=d.get("loss_pattern"),
            log_max_mb=d.get("log_max_mb"),
            slurm=tuple((d.get("slurm") or {}).items()),
            total_steps=d.get("total_steps"),
            channels=tuple((d.get("channels") or {}).items()),
            sweep=SweepSpec.from_dict(d["sweep"]) if d.get("sweep") else None,
            trial=d.get("trial"),
            sweep_id=d.get("sweep_id"),
            metric_definitions=tuple((str(n), str(r)) for n, r in d.get("metric_definitions") or ()),
            code=CodeSpec.from_dict(d["code"]) if d.get("code") else None,
            inputs=tuple((str(k), dict(v)) for k, v in (d.get("inputs") or {}).items()),
            seed_checkpoint=dict(d["seed_checkpoint"]) if d.get("seed_checkpoint") else None,
            pipeline_id=d.get("pipeline_id"),
            step=d.get("step"),
            scaling=ScalingSpec(**d["scaling"]) if d.get("scaling") else None,
            model_parallel=(ModelParallelSpec.from_dict(d["model_parallel"])
                            if d.get("model_parallel") else None),
            kind=str(d.get("kind") or "training"),
            pools=tuple(PoolSpec.from_dict(p) for p in d.get("pools") or ()),
            processing=ProcessingSpec.from_dict(d["processing"]) if d.get("processing") else None,
            container=ContainerSpec.from_dict(d["container"]) if d.get("container") else None,
            path=Path(path) if path is not None else None,
            env_from_file=d.get("env_from_file"),
            env_file_names=tuple(d.get("env_file_names") or ()),
        )


# ---------------------------------------------------------------------------------------------
# Durations and loss lines.


def parse_duration(value: Any) -> float:
    """Seconds from ``"2h"``, ``"90m"``, ``"1h30m"``, ``"1d"``, ``"45s"`` or a number of seconds.

    Raises ValueError for anything else (negative numbers included).
    """
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"not a duration: {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"not a duration: {value!r}")
    m = _DURATION_RE.fullmatch(value)
    if m is None or not any(m.groupdict().values()):
        raise ValueError(f"not a duration: {value!r}")
    return sum(float(n) * _UNIT_S[unit] for unit, n in m.groupdict().items() if n is not None)


@functools.lru_cache(maxsize=32)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def parse_loss(line: str, pattern: str | None = None) -> float | None:
    """The loss on a log line (the first match of ``pattern``), or None.

    The pattern's group named ``loss`` is read if it has one, else its first group.
    """
    rx = _compiled(pattern if pattern is not None else DEFAULT_LOSS_PATTERN)
    m = rx.search(line)
    if m is None:
        return None
    text = m.group("loss") if "loss" in rx.groupindex else m.group(1)
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------------
# Field checks (the kit is tui.model.fields). Each takes the raw TOML value and returns the
# converted one, or raises Bad.


def _job_name(v: Any) -> str:
    if isinstance(v, str) and JOB_NAME_RE.fullmatch(v):
        return v
    raise Bad()


def _utf8_len(s: str) -> int:
    return len(s.encode("utf-8", "surrogatepass"))


def _arguments(v: tuple[str, ...], what: str) -> tuple[str, ...]:
    """Each argument and all of them together small enough for exec on any host."""
    total = 0
    for i, arg in enumerate(v):
        size = _utf8_len(arg)
        if size > MAX_ARG_BYTES:
            raise Bad(
                f"{what} of at most {MAX_ARG_BYTES} bytes (64 KiB) each; this one has {size}",
                sub=f"[{i}]",
            )
        total += size + 1  # exec counts each one's terminating NUL
    if total > MAX_ARGV_BYTES:
        raise Bad(
            f"{what} of at most {MAX_ARGV_BYTES} bytes (128 KiB) together; these have {total}"
        )
    return v


def _command(v: Any) -> tuple[str, ...]:
    if isinstance(v, list) and v and all(isinstance(s, str) and s for s in v):
        return _arguments(tuple(v), "arguments")
    raise Bad()


def _path_text(v: Any) -> str:
    """A path on the hosts: non-empty, and no longer than a path can be."""
    text = nonblank(v)
    if _utf8_len(text) > MAX_PATH_BYTES:
        raise Bad(f"a path of at most {MAX_PATH_BYTES} bytes; this one has {_utf8_len(text)}")
    return text


def _workdir(v: Any) -> str:
    # "~" would mean a different home on every host, and the spec file's directory is local.
    if isinstance(v, str) and v.strip() and not v.startswith("~"):
        return _path_text(v)
    raise Bad()


def _kind(v: Any) -> str:
    if v in KINDS:
        return str(v)
    raise Bad()


def _launcher(v: Any) -> str:
    if v in LAUNCHERS:
        return str(v)
    raise Bad()


def _host_names(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not v:
        raise Bad()
    for name in v:
        if not isinstance(name, str) or not HOST_NAME_RE.fullmatch(name):
            raise Bad(got=name)
    repeated = sorted({n for n in v if v.count(n) > 1})
    if repeated:
        raise Bad("host names without repeats", got=repeated[0])
    return tuple(v)


def _env(v: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(v, dict):
        raise Bad()
    for key, value in v.items():
        if not ENV_NAME_RE.fullmatch(key):
            raise Bad("environment variable names ([A-Za-z_][A-Za-z0-9_]*)", got=key)
        if key.startswith("RIGDECK_"):
            raise Bad("no RIGDECK_* variables (rigdeck sets those for every rank)", got=key)
        if not isinstance(value, str):
            raise Bad('a string (quote numbers and booleans: "1")', got=value, sub=key)
        if _utf8_len(value) > MAX_ARG_BYTES:
            raise Bad(
                f"a value of at most {MAX_ARG_BYTES} bytes (64 KiB); this one has "
                f"{_utf8_len(value)}",
                sub=key,
            )
    total = sum(_utf8_len(f"{k}={x}") + 1 for k, x in v.items())
    if total > MAX_ARGV_BYTES:
        raise Bad(
            f"variables of at most {MAX_ARGV_BYTES} bytes (128 KiB) together; these have {total}"
        )
    return tuple(v.items())


def _max_runtime(v: Any) -> int:
    try:
        seconds = parse_duration(v)
    except ValueError:
        raise Bad() from None
    if seconds <= 0 or seconds > MAX_RUNTIME_LIMIT_S or seconds != int(seconds):
        raise Bad()
    return int(seconds)


def _timeout(v: Any) -> float:
    try:
        seconds = parse_duration(v)
    except ValueError:
        raise Bad() from None
    if seconds <= 0:
        raise Bad()
    return seconds


def _one_of(*choices: str) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if v not in choices:
            raise Bad()
        return str(v)

    return check


def _grace(v: Any) -> float:
    try:
        return parse_duration(v)
    except ValueError:
        raise Bad() from None


def _json_value(v: Any, where: str) -> None:
    """Reject what has no JSON form (TOML dates and times); ``where`` is the dotted sub-field."""
    if isinstance(v, (datetime.date, datetime.time)):
        raise Bad(
            "numbers, strings, booleans, arrays or tables (no dates or times)", got=v, sub=where
        )
    if isinstance(v, list):
        for i, x in enumerate(v):
            _json_value(x, f"{where}[{i}]")
    elif isinstance(v, dict):
        for k, x in v.items():
            _json_value(x, f"{where}.{k}")


def _hyperparameters(v: Any) -> tuple[tuple[str, Any], ...]:
    if not isinstance(v, dict):
        raise Bad()
    for key, value in v.items():
        # Each becomes SM_HP_<KEY>: "=" cannot be in a variable's name.
        if not key or "=" in key:
            raise Bad("hyperparameter names that are not empty and have no '='", got=key)
        _json_value(value, key)
    size = _utf8_len(json.dumps(v))
    if size > MAX_HYPERPARAMETERS_BYTES:
        raise Bad(
            f"hyperparameters of at most {MAX_HYPERPARAMETERS_BYTES} bytes (32 KiB) as JSON, "
            f"since each is copied into several SM_* variables; these have {size}"
        )
    return tuple(v.items())


def _channels(v: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(v, dict):
        raise Bad()
    for key, value in v.items():
        # The name becomes SM_CHANNEL_<NAME>, so it must be usable in a variable name.
        if not ENV_NAME_RE.fullmatch(key):
            raise Bad(
                "channel names of letters, digits and '_' (not starting with a digit)", got=key
            )
        if not isinstance(value, str) or not value.strip():
            raise Bad("a path on the hosts (a non-empty string)", got=value, sub=key)
        try:
            _path_text(value)
        except Bad as bad:
            raise Bad(bad.expected, sub=key) from None
    return tuple(v.items())


def _owner(v: Any) -> str:
    if not isinstance(v, str):
        raise Bad()
    if v in OWNER_POLICIES:
        return v
    m = _OWNER_HOST_RE.fullmatch(v)
    if m is None:
        raise Bad()
    if not HOST_NAME_RE.fullmatch(m["host"]):
        raise Bad("a host name of letters, digits, '.', '_' and '-' after 'host:'", got=v)
    if not m["gpu"].isascii() or not m["gpu"].isdigit():
        raise Bad("a GPU index (an integer >= 0) after 'gpu:'", got=v)
    return f"host:{m['host']}/gpu:{int(m['gpu'])}"


def _exit_codes(v: Any) -> tuple[int, ...]:
    if isinstance(v, list) and all(is_int(c) and 1 <= c <= 255 for c in v):
        return tuple(v)
    raise Bad()


def _strings(v: Any) -> tuple[str, ...]:
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return tuple(v)
    raise Bad()


def _options(v: Any) -> tuple[str, ...]:
    return _arguments(_strings(v), "options")


def _preemptible(v: Any) -> bool | str:
    if isinstance(v, bool) or v == "restart":
        return v
    raise Bad()


def _image(v: Any) -> str:
    text = _path_text(v)
    if text != text.strip() or text.startswith("-") or any(c.isspace() for c in text):
        raise Bad()
    return text


def _abs_path(v: Any) -> str:
    text = _path_text(v)
    if not text.startswith("/") or ":" in text:
        raise Bad()
    return text


def _mounts(v: Any) -> tuple[str, ...]:
    out = []
    for m in _strings(v):
        parts = m.split(":")
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
            raise Bad(got=m)
        for p in parts[:2]:
            if not p.startswith("/") or _utf8_len(p) > MAX_PATH_BYTES or "," in p:
                raise Bad(got=m)
        out.append(m)
    return tuple(out)


_LOSS_EXPECTED = "a regular expression with exactly one capture group, or a group named 'loss'"


def _loss_pattern(v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise Bad()
    try:
        rx = re.compile(v)
    except re.error as e:
        raise Bad(f"{_LOSS_EXPECTED} (it does not compile: {e})") from None
    if "loss" not in rx.groupindex and rx.groups != 1:
        raise Bad(f"{_LOSS_EXPECTED} (it has {rx.groups} groups)")
    return v


_TOP_FIELDS: dict[str, Check] = {
    "name": Check("a job name of 1-64 letters, digits, '.', '_' and '-'", _job_name),
    "command": Check("a non-empty list of non-empty strings", _command),
    "workdir": Check(
        "a directory: absolute, or relative to the spec file's directory (no '~')", _workdir
    ),
    "launcher": Check(" or ".join(f'"{x}"' for x in LAUNCHERS), _launcher),
    "kind": Check(" or ".join(f'"{x}"' for x in KINDS), _kind),
    "nodes": Check("an integer >= 1", int_range(1)),
    "hosts": Check("a non-empty list of inventory host names", _host_names),
    "gpus_per_node": Check("an integer >= 1", int_range(1)),
    "processes_per_node": Check("an integer >= 1", int_range(1)),
    "max_runtime": Check(
        "a duration of whole seconds, > 0 and at most 28 days: an integer of seconds or a "
        'string like "2h", "90m", "1h30m", "1d"',
        _max_runtime,
    ),
    "grace": Check('a duration >= 0: seconds or a string like "30s", "2m"', _grace),
    "total_steps": Check("an integer >= 1", int_range(1)),
    "priority": Check(f"an integer {PRIORITY_MIN}..{PRIORITY_MAX} (the queue starts higher first)",
                      int_range(PRIORITY_MIN, PRIORITY_MAX)),
    "preemptible": Check('true (a higher-priority job may stop it; it resumes from its [checkpoint] dir), '
                         '"restart" (it may be stopped and start over) or false', _preemptible),
    "env": Check('a table of strings (NAME = "value")', _env),
    "env_from_file": Check("a file of NAME=value lines on this machine (absolute, ~/..., or relative to the "
                           "spec file's directory)", _path_text),
    "hyperparameters": Check("a table ([hyperparameters])", _hyperparameters),
    "channels": Check('a table of paths on the hosts (name = "/path")', _channels),
}
_TABLES: dict[str, dict[str, Check]] = {
    "checkpoint": {
        "dir": Check("a directory path on the hosts (a non-empty string)", _path_text),
        "owner": Check(
            '"rank0", "per-node", "all" or "host:NAME/gpu:I" (I an integer >= 0)', _owner
        ),
    },
    "restart": {
        "max_restarts": Check("an integer >= 0", int_range(0)),
        "on_exit_codes": Check(
            "a list of exit codes 1..255 (a death by signal N exits with 128+N)", _exit_codes
        ),
    },
    "health": {
        "hang_timeout": Check('a duration > 0 without a new step before the job is hung: seconds or a string '
                              'like "15m", "20s"', _timeout),
        "startup_timeout": Check('a duration > 0 before the first step: seconds or a string like "30m"', _timeout),
        "host_timeout": Check('a duration > 0 a host may be out of reach mid-job: seconds or a string like "60s"',
                              _timeout),
        "on_hang": Check('"restart" (counted against [restart] max_restarts) or "fail"', _one_of("restart", "fail")),
        "on_nan": Check('"fail", "restart" or "ignore"', _one_of("fail", "restart", "ignore")),
    },
    "mpi": {"custom_options": Check("a list of strings", _options)},
    "container": {
        "image": Check("an image: a name in the hosts' image store (\"localhost/train:1\") or an "
                       "archive path on the hosts (podman save's, docker save's; Apptainer's SIF file), "
                       "without spaces or a leading '-'",
                       _image),
        "runtime": Check(" or ".join(f'"{x}"' for x in CONTAINER_RUNTIMES), _one_of(*CONTAINER_RUNTIMES)),
        "mounts": Check('a list of "SRC:DST" or "SRC:DST:ro", absolute paths without \',\'', _mounts),
        "workdir": Check("an absolute directory inside the container (no ':')", _abs_path),
        "options": Check("a list of strings (options for the runtime's run, as they are)", _options),
    },
    "code": {
        "sync": Check("a directory on this machine: absolute, or relative to the spec file's "
                      "directory (no '~')", _workdir),
        "max_files": Check("an integer 1..1000000 (files shipped at most)", int_range(1, 1_000_000)),
        "max_mb": Check("an integer of MB, 1..1048576 (the tree's size at most)", int_range(1, 1 << 20)),
        "follow_links": Check("true (ship what a symbolic link out of the directory points to) or false",
                              boolean),
    },
    "log": {"loss_pattern": Check(_LOSS_EXPECTED, _loss_pattern),
            "max_mb": Check("an integer of MB, 2..1048576 (each rank's log on its host; older output "
                             "is rotated out beyond it)", int_range(2, 1 << 20))},
    "slurm": SLURM_JOB_FIELDS,
    "scaling": {
        "reference_world_size": Check("an integer >= 1 (the world size base_lr was tuned at)",
                                      int_range(1)),
        "base_lr": Check("a number > 0 (the learning rate at reference_world_size)",
                         number(positive=True)),
        "warmup_steps": Check("an integer >= 0 (steps to reach the scaled learning rate)",
                              int_range(0)),
    },
}
_REQUIRED = ("name", "command")
# Tables with their own parsers (and their own cross-checks).
_OWN_TABLES = ("sweep", "model_parallel", "pools", "processing")


def _checked(
    raw: Mapping[str, Any], checks: Mapping[str, Check], path: Path | None, prefix: str
) -> dict[str, Any]:
    """Check every key of one table; unknown keys are errors. ``prefix``: "" or "restart."."""

    def error(name: str, expected: str, got: Any) -> JobSpecError:
        return JobSpecError(path, prefix + name, expected, got)

    return checked(raw, checks, error)


# ---------------------------------------------------------------------------------------------
# Loading.


def read_spec_file(path: str | os.PathLike[str], what: str = "job spec") -> tuple[Path, str]:
    """A spec file's path (``~`` expanded) and its text; a missing, non-UTF-8 or unreadable
    file is a JobSpecError naming it (``what``: "job spec", "pipeline spec")."""
    target = Path(os.path.expanduser(os.fspath(path)))
    try:
        return target, target.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise JobSpecError(target, None, f"an existing {what} file") from None
    except UnicodeDecodeError as e:
        raise JobSpecError(target, None, f"UTF-8 text ({e})") from None
    except OSError as e:
        raise JobSpecError(target, None, f"a readable file ({e.strerror or e})") from None


def load_jobspec(path: str | os.PathLike[str]) -> JobSpec:
    """Read and check a job spec file."""
    target, text = read_spec_file(path)
    return jobspec_from_toml(text, target)


def jobspec_from_toml(text: str, path: str | os.PathLike[str] | None = None) -> JobSpec:
    """Check a job spec given as TOML text; ``path`` names it in errors and anchors ``workdir``.

    Without a path, a relative ``workdir`` is taken relative to the current directory.
    """
    where = Path(path) if path is not None else None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise JobSpecError(where, None, f"valid TOML ({e})") from None
    return jobspec_from_data(data, where)


def jobspec_from_data(data: Mapping[str, Any], where: Path | None, prefix: str = "", *,
                      wire: bool = False) -> JobSpec:
    """Check a job spec given as its decoded TOML table: a job spec file's, or a pipeline
    step's inline ``[steps.job]`` (tui.model.pipelinespec). ``where`` names the file in errors
    and anchors a relative ``workdir`` and ``[code] sync`` (its directory; without one, the
    current directory); ``prefix`` goes before every field an error names
    (``"steps.train.job."``), so one set of checks serves both. ``wire``: the tables with
    parsers of their own come apart (``jobspec_from_wire``), which checks what needs them."""
    at = _At(where, prefix)
    _no_nul(data, where, prefix.rstrip("."))
    values, tables = _fields(data, at)
    kind: str = values.get("kind", "training")
    pools = _pools(data, values, kind, at)
    processing = _processing(data, values, kind, at)
    hosts: tuple[str, ...] = values.get("hosts", ())
    nodes: int | None = values.get("nodes")
    gpus, procs = _slots(values, hosts, nodes, bool(pools), at)
    workdir, code = _workdir_and_code(values, tables["code"], where, at)
    checkpoint = tables["checkpoint"]
    restart = tables["restart"]
    spec = JobSpec(
        name=values["name"],
        command=values["command"],
        workdir=workdir,
        launcher=values.get("launcher", "direct"),
        nodes=nodes,
        hosts=hosts,
        gpus_per_node=gpus,
        processes_per_node=procs,
        env=values.get("env", ()),
        max_runtime_s=values.get("max_runtime", DEFAULT_MAX_RUNTIME_S),
        priority=values.get("priority", 0),
        preemptible=values.get("preemptible", False),
        grace_s=values.get("grace", DEFAULT_GRACE_S),
        hyperparameters=values.get("hyperparameters", ()),
        checkpoint=CheckpointSpec(
            dir=checkpoint.get("dir"), owner=checkpoint.get("owner", "rank0")
        ),
        restart=RestartSpec(
            max_restarts=restart.get("max_restarts", 0),
            on_exit_codes=restart.get("on_exit_codes", ()),
        ),
        health=HealthSpec.from_dict(tables["health"]),
        mpi_custom_options=tables["mpi"].get("custom_options", ()),
        loss_pattern=tables["log"].get("loss_pattern"),
        log_max_mb=tables["log"].get("max_mb"),
        slurm=tuple(tables["slurm"].items()),
        total_steps=values.get("total_steps"),
        channels=values.get("channels", ()),
        code=code,
        scaling=_scaling(tables["scaling"], at),
        kind=kind,
        pools=pools,
        processing=processing,
        container=_container(tables["container"], values.get("launcher", "direct"), at),
        path=where,
    )
    if "env_from_file" in values:
        spec = _with_env_file(spec, values["env_from_file"], where, at)
    if spec.preemptible is True and not spec.checkpoint.dir:
        raise at.error("preemptible", 'a [checkpoint] dir to resume from with preemptible = true (or '
                       'preemptible = "restart": the job may be stopped and start over)', True)
    spec = _with_sweep_and_model_parallel(spec, data, values, at)
    if not wire:
        check_container_images(spec, at.error)
    size = len(json.dumps(spec.to_dict()).encode("utf-8"))
    if size > MAX_SPEC_JSON_BYTES:
        raise at.error(
            None,
            f"a spec of at most {MAX_SPEC_JSON_BYTES} bytes (512 KiB) as the job plan carries it "
            f"(JSON); this one has {size}",
        )
    return spec


# A spec's wire form (``to_dict``) as a client sends it to a server. The fields only the server
# fills in (a sweep's trial, a pipeline step's inputs, ...) are never taken from a client; the rest
# go through the checks a spec file's do.
_SERVER_ONLY = ("trial", "sweep_id", "metric_definitions", "inputs", "seed_checkpoint", "pipeline_id", "step")
_WIRE_TOP = {"name": "name", "command": "command", "launcher": "launcher", "kind": "kind", "nodes": "nodes",
             "hosts": "hosts", "gpus_per_node": "gpus_per_node", "processes_per_node": "processes_per_node",
             "max_runtime_s": "max_runtime", "grace_s": "grace", "total_steps": "total_steps",
             "priority": "priority", "preemptible": "preemptible", "env": "env",
             "hyperparameters": "hyperparameters", "channels": "channels"}
_WIRE_TABLES = ("checkpoint", "restart", "health", "mpi", "scaling", "slurm", "container")
_WIRE_OWN = ("sweep", "model_parallel", "pools", "processing", "code", "workdir", "path", "loss_pattern",
             "log_max_mb", "env_from_file", "env_file_names")
HEX64_RE = re.compile(r"[0-9a-f]{64}")


SERVER_ENV_FILE = ("nothing in a sweep or a pipeline through a server (yet): a server carries the values of a "
                   "job's env_from_file to that job's first start only; launch the job itself, or without the "
                   "server (RIGDECK_SERVER=off)")
ENV_VALUES_EXPECTED = "the values of the spec's env_from_file, one string without NUL for each of its names"


def _wire_env_file(d: Mapping[str, Any], at: _At) -> None:
    """A client's ``env_from_file`` (the file on its machine: shown, never read here) and its
    ``env_file_names``: names as ``[env]``'s are, none also in ``[env]``."""
    path, names = d.get("env_from_file"), d.get("env_file_names")
    if not path and not names:
        return
    try:
        _path_text(path)
    except Bad:
        raise at.error("env_from_file", "the path of the file on the client's machine (a string)", path) from None
    if not isinstance(names, list) or not names:
        raise at.error("env_file_names", "the names of the env_from_file's variables (a list)", names)
    try:
        _env({n: "" for n in names} if all(isinstance(n, str) for n in names) else None)
    except Bad as e:
        raise at.error("env_file_names", e.expected or "environment variable names", e.got) from None
    env = d.get("env") or {}
    both = sorted(set(names) & set(env if isinstance(env, dict) else ()))
    if len(set(names)) != len(names) or both:
        raise at.error("env_file_names", "names used once and not also in [env]", (both or names)[0])


def env_values_from_wire(spec: JobSpec, given: Any) -> dict[str, str] | None:
    """The values of ``spec``'s ``env_from_file`` as a client sent them with a launch: exactly
    its names, each a string of ``[env]``'s limits. JobSpecError naming the field and, where
    one is wrong, the name (never a value)."""
    at = _At(spec.path, "")
    if not spec.env_from_file:
        if given is not None:
            raise at.error("env_values", "nothing: the spec has no env_from_file")
        return None
    if not isinstance(given, dict):
        raise at.error("env_from_file", f"{ENV_VALUES_EXPECTED} with the launch (this client sent none: "
                       "a rigdeck older than the server?)")
    if sorted(given) != sorted(spec.env_file_names):
        odd = sorted(set(given) ^ set(spec.env_file_names))
        raise at.error("env_values", f"{ENV_VALUES_EXPECTED} ({', '.join(spec.env_file_names)})",
                       str(odd[0])[:64] if odd else None)
    try:
        _env(given)
        if any("\0" in v for v in given.values()):
            raise Bad("values without NUL characters (\\0)")
    except Bad as e:
        raise at.error("env_values" + (f".{e.sub}" if e.sub else ""), e.expected or ENV_VALUES_EXPECTED) from None
    return {str(k): str(v) for k, v in given.items()}


def jobspec_from_wire(d: Any) -> JobSpec:
    """A job spec a client sent (``to_dict``'s form), checked as a spec file is: every plain field
    and table by the same ``Check`` (a name of job-name characters, a priority in -1000..1000,
    environment names), the cross-checks of ``jobspec_from_data``; the tables with parsers of
    their own decoded by them; and no field that only the server fills in. A server decodes
    what a client sends with this, never with the trusting ``from_dict``. JobSpecError names
    the field."""
    at = _At(None, "")
    if not isinstance(d, dict):
        raise at.error(None, "a job spec (a JSON object)", type(d).__name__)
    known = {*_WIRE_TOP, *_WIRE_TABLES, *_WIRE_OWN, *_SERVER_ONLY}
    for key in d:
        if key not in known:
            raise at.error(str(key), unknown_field(str(key), sorted(known)))
    for key in _SERVER_ONLY:
        if d.get(key):
            raise at.error(key, "nothing: the server sets it", d[key])
    _wire_env_file(d, at)
    table: dict[str, Any] = {_WIRE_TOP[k]: v for k, v in d.items() if k in _WIRE_TOP and v is not None}
    for k in ("env", "hyperparameters", "channels"):
        if table.get(k) == {}:
            del table[k]
    if table.get("hosts") == []:
        del table["hosts"]
    for k in _WIRE_TABLES:
        raw = d.get(k)
        if isinstance(raw, dict):
            raw = {n: v for n, v in raw.items() if v is not None and v != []}
        if raw:
            table[k] = raw
    log = {n: v for n, v in (("loss_pattern", d.get("loss_pattern")), ("max_mb", d.get("log_max_mb")))
           if v is not None}
    if log:
        table["log"] = log
    if d.get("code") is None:
        table["workdir"] = d.get("workdir")
    checked = jobspec_from_data(table, None, wire=True)
    _wire_pool_containers(d.get("pools"), at)
    try:
        trusted = JobSpec.from_dict({k: v for k, v in d.items() if k not in _SERVER_ONLY and k != "path"})
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise at.error(None, f"a job spec in the form the client writes ({type(e).__name__}: {e})") from None
    code = _wire_code(d.get("code"), at)
    kept = {f.name: getattr(checked, f.name) for f in dataclasses.fields(JobSpec)
            if f.name not in ("sweep", "model_parallel", "pools", "processing", "code", "workdir", "path",
                              "env_from_file", "env_file_names",
                              "gpus_per_node", "processes_per_node", *_SERVER_ONLY)}
    spec = dataclasses.replace(trusted, **kept, code=code, workdir=code.sync if code else checked.workdir,
                               path=None)
    check_container_images(spec, at.error)
    return spec


def _prefixed(at: _At, prefix: str) -> Callable[[str, str, Any], Exception]:
    def error(field: str, expected: str, got: Any) -> Exception:
        return at.error(prefix + field, expected, got)
    return error


def _wire_pool_containers(pools: Any, at: _At) -> None:
    """Each pool's ``container`` as a client sent it: absent or null (the job's), false (on the
    hosts), or a table checked as ``[container]`` is."""
    for i, pool in enumerate(pools if isinstance(pools, list) else ()):
        box = pool.get("container") if isinstance(pool, dict) else None
        if box is None or box is False:
            continue
        if not isinstance(box, dict):
            raise at.error(f"pools[{i}].container", POOL_CONTAINER_EXPECTED, box)
        raw = {n: v for n, v in box.items() if v is not None and v != []}
        parse_container(raw, _prefixed(at, f"pools[{i}].container."))


def _wire_code(raw: Any, at: _At) -> CodeSpec | None:
    """``[code]`` as a client sends it: the synced directory on its machine, its limits, and the
    snapshot's tree hash the server's store must hold."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise at.error("code", "a table ([code])", raw)
    unknown = [k for k in raw if k not in ("sync", "max_files", "max_mb", "follow_links", "tree", "files", "size")]
    if unknown:
        raise at.error(f"code.{unknown[0]}", "sync, max_files, max_mb, follow_links, tree, files or size",
                       raw[unknown[0]])
    sync = raw.get("sync")
    if not isinstance(sync, str) or not os.path.isabs(sync):
        raise at.error("code.sync", "an absolute directory on the client's machine", sync)
    limits = _checked({k: raw[k] for k in ("max_files", "max_mb", "follow_links") if raw.get(k) is not None},
                      _TABLES["code"], None, "code.")
    tree = raw.get("tree")
    if tree is not None and not (isinstance(tree, str) and HEX64_RE.fullmatch(tree)):
        raise at.error("code.tree", "a snapshot's hash (64 hex digits)", tree)
    for k in ("files", "size"):
        v = raw.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise at.error(f"code.{k}", "an integer >= 0", v)
    if _utf8_len(sync) > MAX_PATH_BYTES:
        raise at.error("code.sync", f"a path of at most {MAX_PATH_BYTES} bytes", sync)
    return CodeSpec(sync=sync, max_files=limits.get("max_files", DEFAULT_MAX_FILES),
                    max_mb=limits.get("max_mb", DEFAULT_MAX_MB), follow_links=limits.get("follow_links", False),
                    tree=tree, files=raw.get("files"), size=raw.get("size"))


@dataclass(frozen=True)
class _At:
    """Where a spec's errors point: its file, and the prefix before every field they name (a
    pipeline step's ``"steps.train.job."``); the steps below share it instead of a closure."""

    path: Path | None
    prefix: str

    def error(self, field: str | None, expected: str, got: Any = None) -> JobSpecError:
        name = self.prefix + field if field is not None else (self.prefix.rstrip(".") or None)
        return JobSpecError(self.path, name, expected, got)


def _fields(data: Mapping[str, Any], at: _At) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The top-level fields and the plain tables, each checked: an unknown key, a table that is
    not one, or a missing required field is an error. The tables with their own parsers
    (``_OWN_TABLES``) are left to them."""
    for key in data:
        if key not in _TOP_FIELDS and key not in _TABLES and key not in _OWN_TABLES:
            raise at.error(key, unknown_field(key, [*_TOP_FIELDS, *_TABLES, *_OWN_TABLES]))
    top = {k: v for k, v in data.items() if k not in _TABLES and k not in _OWN_TABLES}
    values = _checked(top, _TOP_FIELDS, at.path, at.prefix)
    tables: dict[str, dict[str, Any]] = {}
    for name, checks in _TABLES.items():
        raw = data.get(name, {})
        if not isinstance(raw, dict):
            raise at.error(name, f"a table ([{name}])", raw)
        tables[name] = _checked(raw, checks, at.path, f"{at.prefix}{name}.")

    for key in _REQUIRED:
        if key not in values:
            raise at.error(key, f"{_TOP_FIELDS[key].expected} (required)")
    return values, tables


def _pools(data: Mapping[str, Any], values: Mapping[str, Any], kind: str, at: _At) -> tuple[PoolSpec, ...]:
    """``[[pools]]``, checked against what a pool job cannot have (a processing kind, the fields
    each pool sets itself, a launcher other than direct); () without it."""
    if "pools" not in data:
        return ()
    if kind == "processing":
        raise at.error("pools", 'no [[pools]] in a processing job (kind = "processing": every host '
                       "runs the same command)", None)
    for key in POOL_EXCLUDES:
        if key in data:
            raise at.error(key, f"no {key} with [[pools]] (each pool sets its own)",
                           None if key == "model_parallel" else data[key])
    if values.get("launcher", "direct") != "direct":
        raise at.error("launcher", '"direct" with [[pools]] (each replica runs its own command)',
                       values["launcher"])
    return parse_pools(data["pools"], at.error, {k: _TOP_FIELDS[k] for k in ("command", "env", "hosts")},
                       container=parse_container)


def _processing(data: Mapping[str, Any], values: Mapping[str, Any], kind: str, at: _At) -> ProcessingSpec | None:
    """A processing job's ``[processing]`` (its inputs and outputs; an empty one when left
    out), checked against the tables and launchers it cannot have; None for any other kind."""
    if "processing" in data and kind != "processing":
        raise at.error("processing", 'kind = "processing" (a [processing] table is a processing '
                       "job's inputs and outputs)", None)
    if kind != "processing":
        return None
    for key in ("model_parallel", "sweep"):
        if key in data:
            raise at.error(key, f'no [{key}] in a processing job (kind = "processing")', None)
    if values.get("launcher", "direct") != "direct":
        raise at.error("launcher", '"direct" in a processing job (every host runs the command '
                       "itself)", values["launcher"])
    return parse_processing(data.get("processing", {}), at.error)


def _slots(values: Mapping[str, Any], hosts: tuple[str, ...], nodes: int | None, pooled: bool,
           at: _At) -> tuple[int | None, int | None]:
    """``gpus_per_node`` and ``processes_per_node``: at most one of them, and one process per
    node when neither is given (a pool job leaves both to its pools); ``nodes`` must match a
    host list."""
    if hosts and nodes is not None and nodes != len(hosts):
        raise at.error("nodes", f"the number of hosts listed in 'hosts' ({len(hosts)})", nodes)
    gpus: int | None = values.get("gpus_per_node")
    procs: int | None = values.get("processes_per_node")
    if gpus is not None and procs is not None:
        raise at.error(
            "processes_per_node",
            "only one of gpus_per_node (hosts with GPUs) and processes_per_node (hosts without)",
            procs,
        )
    if gpus is None and procs is None and not pooled:
        procs = 1
    return gpus, procs


def _workdir_and_code(values: Mapping[str, Any], code_table: Mapping[str, Any], where: Path | None,
                      at: _At) -> tuple[str, CodeSpec | None]:
    """The job's working directory (``workdir`` from the spec's directory), or with ``[code]
    sync`` the synced directory, which must exist here, and its CodeSpec."""
    base = where.parent if where is not None else Path.cwd()
    workdir = os.path.normpath(os.path.join(os.path.abspath(base), values.get("workdir", ".")))
    if "sync" in code_table:
        if "workdir" in values:
            raise at.error("workdir", "no workdir with [code] sync (the job runs in the "
                           "hosts' copy of the synced directory)", values["workdir"])
        workdir = os.path.normpath(os.path.join(os.path.abspath(base), code_table["sync"]))
        if not os.path.isdir(workdir):
            raise at.error("code.sync", "an existing directory on this machine", code_table["sync"])
        return workdir, CodeSpec(sync=workdir, max_files=code_table.get("max_files", DEFAULT_MAX_FILES),
                                 max_mb=code_table.get("max_mb", DEFAULT_MAX_MB),
                                 follow_links=code_table.get("follow_links", False))
    if code_table:
        raise at.error("code.sync", "a directory to sync (max_files, max_mb and follow_links need it)")
    return workdir, None


def _container(table: Mapping[str, Any], launcher: str, at: _At) -> ContainerSpec | None:
    if not table:
        return None
    if "image" not in table:
        raise at.error("container.image", f"{_TABLES['container']['image'].expected} (required in [container])")
    check_container_launcher(launcher, _prefixed(at, ""))
    if _needs_image_file(table):
        raise at.error("container.image", APPTAINER_IMAGE, table["image"])
    return ContainerSpec(image=table["image"], runtime=table.get("runtime", "podman"),
                         mounts=table.get("mounts", ()), workdir=table.get("workdir"),
                         options=table.get("options", ()))


def parse_container(raw: Mapping[str, Any], error: Callable[[str, str, Any], Exception]) -> ContainerSpec:
    """A ``[container]`` table given somewhere else than at the top of a job spec (a worker
    pool's ``container``, a pipeline step's), checked as ``[container]`` is: ``error(FIELD,
    expected, got)`` names FIELD as in that table (``image``, ``mounts``), its caller puts
    where the table is in front."""
    values = checked(raw, _TABLES["container"], error)
    if "image" not in values:
        raise error("image", f"{_TABLES['container']['image'].expected} (required in a container table)", None)
    if _needs_image_file(values):
        raise error("image", APPTAINER_IMAGE, values["image"])
    return ContainerSpec(image=values["image"], runtime=values.get("runtime", "podman"),
                         mounts=values.get("mounts", ()), workdir=values.get("workdir"),
                         options=values.get("options", ()))


APPTAINER_IMAGE = ('an image file\'s absolute path on the hosts (a SIF file or sandbox directory) '
                   'with runtime = "apptainer": it has no image store')


def _needs_image_file(table: Mapping[str, Any]) -> bool:
    return table.get("runtime") == "apptainer" and not str(table["image"]).startswith("/")


def check_container_launcher(launcher: str, error: Callable[[str, str, Any], Exception]) -> None:
    if launcher == "mpirun":
        raise error("launcher", '"direct" or "torchrun" with [container] (mpirun would start ranks '
                    "outside the other hosts' containers)", launcher)


_Box = TypeVar("_Box")


def _trial_container(box: _Box, hps: Mapping[str, Any]) -> _Box:
    """A container whose image names ``{hp.NAME}``, that parameter's value in it (a sweep's
    trial); anything else as it is."""
    if isinstance(box, ContainerSpec) and HP_PLACEHOLDER_RE.search(box.image):
        image = HP_PLACEHOLDER_RE.sub(lambda m: format_hp(hps[m.group(1)]), box.image)
        return dataclasses.replace(box, image=image)  # type: ignore[return-value]
    return box


def check_container_images(spec: JobSpec, error: Callable[[str, str, Any], Exception]) -> None:
    """Every ``{hp.NAME}`` in a container's image (the job's, a pool's) names a categorical
    parameter of the spec's sweep, and each of its choices makes an image: a sweep whose trials
    run in different images (a categorical parameter lists them), refused before anything
    starts when one of them could not be run."""
    boxes: list[tuple[str, ContainerSpec | bool | None]] = [("container.image", spec.container)]
    boxes += [(f"pools[{i}].container.image", p.container) for i, p in enumerate(spec.pools)]
    params = {p.name: p for p in spec.sweep.parameters} if spec.sweep is not None else {}
    for where, box in boxes:
        if not isinstance(box, ContainerSpec):
            continue
        for name in HP_PLACEHOLDER_RE.findall(box.image):
            param = params.get(name)
            if param is None or param.type != "categorical":
                what = ("a categorical parameter of [sweep] (its choices: the images the trials run in)"
                        if spec.sweep is not None else
                        "no {hp.NAME} outside a sweep (a sweep's categorical parameter may choose each trial's image)")
                raise error(where, f"{what}; {{hp.{name}}} names "
                            + ("no such parameter" if param is None else f"a {param.type} parameter"), box.image)
            for choice in param.choices:
                # the other placeholders as a plain word: each is checked in its turn
                image = HP_PLACEHOLDER_RE.sub(_one_value(name, choice), box.image)
                try:
                    _image(image)
                except Bad:
                    raise error(where, f"with each choice of sweep.parameters.{name}, "
                                + _TABLES["container"]["image"].expected, image) from None


def _one_value(name: str, value: Any) -> Callable[[re.Match[str]], str]:
    """A substitution of ``{hp.NAME}`` by ``value``, and of every other placeholder by a word."""
    def sub(m: re.Match[str]) -> str:
        return format_hp(value) if m.group(1) == name else "x"
    return sub


def _scaling(table: Mapping[str, Any], at: _At) -> ScalingSpec | None:
    """``[scaling]`` with both of its required fields, or None when it is left out."""
    if not table:
        return None
    for key in ("reference_world_size", "base_lr"):
        if key not in table:
            raise at.error(f"scaling.{key}", f"{_TABLES['scaling'][key].expected} (required in [scaling])")
    return ScalingSpec(**table)


def _with_sweep_and_model_parallel(spec: JobSpec, data: Mapping[str, Any], values: Mapping[str, Any],
                                   at: _At) -> JobSpec:
    """The spec with its ``[sweep]`` and ``[model_parallel]``: parsed last, since each checks
    itself against the finished spec (its command and hyperparameters, its world size)."""
    if "sweep" in data:
        sweep = parse_sweep(data["sweep"], at.error, command=spec.command,
                            hyperparameters=dict(spec.hyperparameters), duration=_max_runtime)
        spec = dataclasses.replace(spec, sweep=sweep)
    if "model_parallel" in data:
        mp = parse_model_parallel(data["model_parallel"], at.error, world_size=spec.world_size,
                                  world_text=_world_text(values, spec), workdir=spec.workdir)
        spec = dataclasses.replace(spec, model_parallel=mp)
    return spec


ENV_FILE_LINES = ("NAME=value lines (NAME of [A-Za-z_][A-Za-z0-9_]*, not RIGDECK_*, each once; the value "
                  "is the rest of the line, as it is; blank lines and # comments are skipped)")


class EnvFileError(ValueError):
    """An ``env_from_file`` that cannot be used: ``where`` (the file, and the line), what was
    expected there and the offending name (never a value: they are secrets)."""

    def __init__(self, where: str, expected: str, got: str | None = None):
        self.where, self.expected, self.got = where, expected, got
        super().__init__(f"{where}: expected {expected}" + (f", got {show(got)}" if got is not None else ""))


def read_env_file(path: str) -> tuple[tuple[str, str], ...]:
    """The NAME=value pairs of an ``env_from_file`` (EnvFileError: missing, unreadable, or a line
    that is not one)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise EnvFileError(path, f"an existing file of {ENV_FILE_LINES}") from None
    except UnicodeDecodeError:
        raise EnvFileError(path, "UTF-8 text") from None
    except OSError as e:
        raise EnvFileError(path, f"a readable file ({e.strerror or e})") from None
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, eq, value = line.partition("=")
        got = name if eq and len(name) <= 64 else None
        if not eq or not ENV_NAME_RE.fullmatch(name):
            raise EnvFileError(f"{path} line {n}", ENV_FILE_LINES, got)
        if name.startswith("RIGDECK_") or name in out:
            raise EnvFileError(f"{path} line {n}", "a name used once" if name in out else
                               "no RIGDECK_* name (rigdeck sets those for every rank)", got)
        if "\0" in value:
            raise EnvFileError(f"{path} line {n}", "a value without NUL characters (\\0)")
        out[name] = value
    try:
        _env(out)
    except Bad as e:
        raise EnvFileError(f"{path}{' ' + e.sub if e.sub else ''}", e.expected or ENV_FILE_LINES) from None
    return tuple(out.items())


def _with_env_file(spec: JobSpec, given: str, where: Path | None, at: _At) -> JobSpec:
    """The spec with its ``env_from_file`` checked now (the file, every line; no name also in
    ``[env]``): its absolute path and the names, never the values."""
    base = where.parent if where is not None else Path.cwd()
    path = os.path.normpath(os.path.join(os.path.abspath(base), os.path.expanduser(given)))
    try:
        pairs = read_env_file(path)
    except EnvFileError as e:
        raise at.error("env_from_file", f"{e.expected} in {e.where}", e.got) from None
    names = tuple(n for n, _ in pairs)
    both = sorted(set(names) & {n for n, _ in spec.env})
    if both:
        raise at.error("env_from_file", f"names not also in [env] ({path} and [env] both set {', '.join(both)})")
    return dataclasses.replace(spec, env_from_file=path, env_file_names=names)


def _world_text(values: Mapping[str, Any], spec: JobSpec) -> str:
    """How the spec makes its world size, for an error that must say what to change:
    ``nodes 3 x processes_per_node 1`` (a field the spec leaves out is named as its default)."""
    if "nodes" in values:
        nodes = f"nodes {spec.node_count}"
    elif spec.hosts:
        nodes = f"{spec.node_count} hosts listed"
    else:
        nodes = "nodes 1 (not set)"
    if spec.gpus_per_node is not None:
        slots = f"gpus_per_node {spec.gpus_per_node}"
    elif "processes_per_node" in values:
        slots = f"processes_per_node {spec.slots_per_node}"
    else:
        slots = "processes_per_node 1 (not set)"
    return f"{nodes} x {slots}"


def _no_nul(value: Any, where: Path | None, field: str) -> None:
    """No NUL anywhere, names included: exec and the environment end a string at the first
    one, so the host would run something other than what the spec says."""
    if isinstance(value, str):
        if "\0" in value:
            raise JobSpecError(where, field or None, "text without NUL characters (\\0)", value)
    elif isinstance(value, list):
        for i, x in enumerate(value):
            _no_nul(x, where, f"{field}[{i}]")
    elif isinstance(value, dict):
        for k, x in value.items():
            name = f"{field}.{k}" if field else k
            if "\0" in k:
                raise JobSpecError(where, name, "names without NUL characters (\\0)", k)
            _no_nul(x, where, name)


def _type_name(value: Any) -> str:
    return {
        bool: "boolean",
        int: "integer",
        float: "float",
        str: "string",
        list: "array",
        dict: "table",
    }.get(type(value), type(value).__name__)

