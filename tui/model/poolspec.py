"""A job spec's worker pools (``[[pools]]``), its ``kind`` and a processing job's ``[processing]``.

The format is in docs/contracts.md ("Worker pools and processing jobs: the spec and the plan").
A pool job is Vertex AI's up to four worker pools (and SageMaker's heterogeneous instance
groups): one primary, workers, parameter servers or reduction servers, evaluators, each with
its own replica count, size, command, env and host pins. A processing job is SageMaker
Processing's: every host runs the same command over inputs either copied whole to each host
(``FullyReplicated``) or split among them file by file (``ShardedByKey``).

Everything the spec alone can tell is checked here, with the spec's own kit (tui.model.fields),
so an error names ``pools[I].FIELD`` and the pool's role. Whether a pool's ``hosts`` and
``labels`` exist is the inventory's business: ``check_pins`` is called by the controller at
launch and submit, before anything starts. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tui.model.containerspec import ContainerSpec
from tui.model.fields import (
    Bad,
    Check,
    ErrorFactory,
    checked,
    int_range,
    nonblank,
    one_of,
    unknown_field,
)

__all__ = [
    "DISTRIBUTIONS",
    "KINDS",
    "ON_FAILURE",
    "ROLES",
    "PoolSpec",
    "ProcessingInput",
    "ProcessingSpec",
    "check_pins",
    "in_role_order",
    "parse_pools",
    "parse_processing",
    "pool_order",
]

# In Vertex's worker pool order: workerpool0 primary, workerpool1 workers, workerpool2 parameter
# servers or reduction servers (one of the two), workerpool3 evaluators.
ROLES = ("primary", "worker", "parameter_server", "reduction_server", "evaluator")
KINDS = ("training", "processing")
ON_FAILURE = ("continue", "stop")
# SageMaker's S3DataDistributionType; FullyReplicated is its default.
DISTRIBUTIONS = ("FullyReplicated", "ShardedByKey")
IO_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
# The top-level fields a pool job may not set: each pool sets its own.
POOL_EXCLUDES = ("nodes", "hosts", "gpus_per_node", "processes_per_node", "model_parallel")


def pool_order(role: str) -> int:
    """A role's place in Vertex's order (the plan's nodes and ranks follow it)."""
    return ROLES.index(role)


def in_role_order(pools: Iterable[PoolSpec]) -> list[PoolSpec]:
    """The pools as placement and ranks take them: primary, worker, parameter_server,
    reduction_server, evaluator (the spec keeps the file's order, which its errors index)."""
    return sorted(pools, key=lambda p: pool_order(p.role))


@dataclass(frozen=True)
class PoolSpec:
    """One ``[[pools]]`` entry as checked, defaults filled. ``command`` None: the job's;
    ``gpus_per_replica`` None: a CPU pool of ``processes_per_replica`` processes a replica;
    ``container`` None: the job's ``[container]`` (if it has one), False: on the hosts
    themselves, a ContainerSpec: this pool's own (``JobSpec.container_of`` says which)."""

    role: str
    replicas: int = 1
    gpus_per_replica: int | None = None
    processes_per_replica: int | None = None
    command: tuple[str, ...] | None = None
    env: tuple[tuple[str, str], ...] = ()
    hosts: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    on_failure: str = "stop"
    container: ContainerSpec | Literal[False] | None = None

    @property
    def slots(self) -> int:
        """Processes in each replica: one per GPU, or ``processes_per_replica``."""
        return self.gpus_per_replica or self.processes_per_replica or 1

    @property
    def uses_gpus(self) -> bool:
        return self.gpus_per_replica is not None

    @property
    def in_world(self) -> bool:
        """Whether its ranks are in torch's world (the primary's and the workers')."""
        return self.role in ("primary", "worker")

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role, "replicas": self.replicas, "gpus_per_replica": self.gpus_per_replica,
            "processes_per_replica": self.processes_per_replica,
            "command": list(self.command) if self.command is not None else None,
            "env": dict(self.env), "hosts": list(self.hosts), "labels": list(self.labels),
            "on_failure": self.on_failure,
            # Only when the pool says: the wire and the history of a pool without one stay as they were.
            **({"container": self.container.to_dict() if self.container else False}
               if self.container is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PoolSpec:
        """The inverse of ``to_dict`` (trusted input: the job history's copy of the spec)."""
        command = d.get("command")
        box = d.get("container")
        return cls(
            role=str(d["role"]), replicas=int(d.get("replicas") or 1),
            gpus_per_replica=d.get("gpus_per_replica"), processes_per_replica=d.get("processes_per_replica"),
            command=tuple(command) if command is not None else None,
            env=tuple((d.get("env") or {}).items()), hosts=tuple(d.get("hosts") or ()),
            labels=tuple(d.get("labels") or ()), on_failure=str(d.get("on_failure") or "stop"),
            container=ContainerSpec.from_dict(box) if isinstance(box, dict) else (False if box is False else None),
        )


@dataclass(frozen=True)
class ProcessingInput:
    """``[[processing.inputs]]``: ``source`` as the spec wrote it (absolute, or relative to the
    workdir: the controller makes it absolute for the plan)."""

    name: str
    source: str
    distribution: str = "FullyReplicated"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "distribution": self.distribution}


@dataclass(frozen=True)
class ProcessingSpec:
    """``[processing]``: a processing job's inputs and outputs (output names only)."""

    inputs: tuple[ProcessingInput, ...] = ()
    outputs: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"inputs": [i.to_dict() for i in self.inputs],
                "outputs": [{"name": n} for n in self.outputs]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProcessingSpec:
        return cls(
            inputs=tuple(ProcessingInput(name=str(i["name"]), source=str(i["source"]),
                                         distribution=str(i.get("distribution") or "FullyReplicated"))
                         for i in d.get("inputs") or ()),
            outputs=tuple(str(o["name"]) for o in d.get("outputs") or ()),
        )


# ---------------------------------------------------------------------------------------------
# Field checks


def _labels(v: Any) -> tuple[str, ...]:
    if isinstance(v, list) and v and all(isinstance(s, str) and s.strip() for s in v):
        return tuple(v)
    raise Bad()


def _io_name(v: Any) -> str:
    if isinstance(v, str) and IO_NAME_RE.fullmatch(v) and v not in (".", ".."):
        return v
    raise Bad()


def _source(v: Any) -> str:
    text = nonblank(v)
    if text.startswith("~"):
        raise Bad()
    return text


POOL_CONTAINER_EXPECTED = ("a table (this pool's own container: image, and runtime, mounts, workdir, options "
                           "as in [container]) or false (this pool on the hosts themselves, not in the job's "
                           "[container])")
_IO_NAME = "a name of 1-64 letters, digits, '.', '_' and '-' (not '.' or '..')"


def _pool_checks(shared: Mapping[str, Check]) -> dict[str, Check]:
    return {
        "role": Check(" or ".join(f'"{r}"' for r in ROLES), one_of(ROLES)),
        "replicas": Check("an integer >= 1", int_range(1)),
        "gpus_per_replica": Check("an integer >= 1", int_range(1)),
        "processes_per_replica": Check("an integer >= 1", int_range(1)),
        "command": shared["command"],
        "env": shared["env"],
        "hosts": shared["hosts"],
        "labels": Check("a non-empty list of inventory labels (strings)", _labels),
        "on_failure": Check(" or ".join(f'"{x}"' for x in ON_FAILURE), one_of(ON_FAILURE)),
        "container": Check(POOL_CONTAINER_EXPECTED, lambda v: v),  # checked by parse_pools itself
    }


# ---------------------------------------------------------------------------------------------
# The tables as a whole


# Checks a pool's ``container`` table (the job spec's checks of ``[container]``): (the raw table,
# the error factory for its fields, which it names as in ``[container]``: "image") -> the spec.
ContainerParser = Callable[[Mapping[str, Any], ErrorFactory], ContainerSpec]


def parse_pools(raw: Any, error: ErrorFactory, shared: Mapping[str, Check],
                container: ContainerParser | None = None) -> tuple[PoolSpec, ...]:
    """Check ``[[pools]]``. ``error(field, expected, got)`` makes the spec's own error; fields
    are named ``pools[I].FIELD``. ``shared``: the spec's own checks of ``command``, ``env`` and
    ``hosts`` (a pool's are the same as the job's); ``container``: the spec's check of a
    ``[container]`` table, for a pool's own (without it a pool may not have one)."""
    if not isinstance(raw, list) or not raw or not all(isinstance(p, dict) for p in raw):
        raise error("pools", "an array of tables ([[pools]]), at least the primary's", raw)
    checks = _pool_checks(shared)
    pools: list[PoolSpec] = []
    seen: dict[str, int] = {}
    for i, table in enumerate(raw):
        role_raw = table.get("role")
        known_role = role_raw if isinstance(role_raw, str) and role_raw in ROLES else None

        def pool_error(field: str, expected: str, got: Any, i: int = i, role: str | None = known_role) -> Exception:
            return error(f"pools[{i}].{field}", expected + (f" (pool {role!r})" if role else ""), got)

        values = checked(table, checks, pool_error)
        box: ContainerSpec | Literal[False] | None = None
        if "container" in table:
            if table["container"] is False:
                box = False
            elif isinstance(table["container"], dict) and container is not None:
                def box_error(field: str, expected: str, got: Any, pool_error: ErrorFactory = pool_error) -> Exception:
                    return pool_error(f"container.{field}", expected, got)

                box = container(table["container"], box_error)
            else:
                raise pool_error("container", POOL_CONTAINER_EXPECTED, table["container"])
        if "role" not in values:
            raise pool_error("role", f"{checks['role'].expected} (required)", None)
        role: str = values["role"]
        if role in seen:
            if role == "primary":
                why = f"at most one primary pool (pools[{seen[role]}] is the primary already)"
            else:
                why = f"one pool per role (pools[{seen[role]}] is the {role} pool already)"
            raise error(f"pools[{i}].role", why, role)
        other = {"parameter_server": "reduction_server", "reduction_server": "parameter_server"}.get(role)
        if other in seen:
            raise error(f"pools[{i}].role", f"not both parameter_server and reduction_server pools "
                        f"(both are Vertex's workerpool2; pools[{seen[other]}] is the {other} pool)", role)
        seen[role] = i
        replicas = values.get("replicas", 1)
        if role == "primary" and replicas != 1:
            raise pool_error("replicas", "1 (the primary pool has exactly one replica)", replicas)
        gpus = values.get("gpus_per_replica")
        procs = values.get("processes_per_replica")
        if gpus is not None and procs is not None:
            raise pool_error("processes_per_replica", "only one of gpus_per_replica (hosts with GPUs) "
                             "and processes_per_replica (hosts without)", procs)
        if "hosts" in values and "labels" in values:
            raise pool_error("labels", "only one of hosts and labels (pin the pool to hosts by name "
                             "or by label)", list(values["labels"]))
        if "on_failure" in values and role != "evaluator":
            raise pool_error("on_failure", "no on_failure outside the evaluator pool (a "
                             f"{role} failing always stops the gang)", values["on_failure"])
        pools.append(PoolSpec(
            role=role, replicas=replicas, gpus_per_replica=gpus,
            processes_per_replica=procs if gpus is not None or procs is not None else 1,
            command=values.get("command"), env=values.get("env", ()),
            hosts=values.get("hosts", ()), labels=values.get("labels", ()),
            on_failure=values.get("on_failure", "continue" if role == "evaluator" else "stop"),
            container=box,
        ))
    if "primary" not in seen:
        raise error("pools", 'exactly one pool with role = "primary" (there is none; roles given: '
                    + ", ".join(p.role for p in pools) + ")", None)
    return tuple(pools)  # in the spec's order: errors at launch index them as the file does


def parse_processing(raw: Any, error: ErrorFactory) -> ProcessingSpec:
    """Check ``[processing]``; fields are named ``processing.inputs[I].FIELD``."""
    if not isinstance(raw, dict):
        raise error("processing", "a table ([processing])", raw)
    for key in raw:
        if key not in ("inputs", "outputs"):
            raise error(f"processing.{key}", unknown_field(key, ["inputs", "outputs"]), None)
    in_checks = {
        "name": Check(_IO_NAME + ": it becomes processing/input/<name>", _io_name),
        "source": Check("a directory on the hosts: absolute, or relative to the workdir (no '~')", _source),
        "distribution": Check(" or ".join(f'"{d}"' for d in DISTRIBUTIONS), one_of(DISTRIBUTIONS)),
    }
    out_checks = {"name": Check(_IO_NAME + ": it becomes processing/output/<name>", _io_name)}
    inputs: list[ProcessingInput] = []
    outputs: list[str] = []
    for what, checks in (("inputs", in_checks), ("outputs", out_checks)):
        tables = raw.get(what, [])
        if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
            raise error(f"processing.{what}", f"an array of tables ([[processing.{what}]])", tables)
        names: dict[str, int] = {}
        for i, table in enumerate(tables):

            def sub_error(field: str, expected: str, got: Any, i: int = i, what: str = what) -> Exception:
                return error(f"processing.{what}[{i}].{field}", expected, got)

            values = checked(table, checks, sub_error)
            for key in ("name", "source") if what == "inputs" else ("name",):
                if key not in values:
                    raise sub_error(key, f"{checks[key].expected} (required)", None)
            name = values["name"]
            if name in names:
                raise sub_error("name", f"a name no other of processing.{what} has "
                                f"(processing.{what}[{names[name]}] has it)", name)
            names[name] = i
            if what == "inputs":
                inputs.append(ProcessingInput(name=name, source=values["source"],
                                              distribution=values.get("distribution", "FullyReplicated")))
            else:
                outputs.append(name)
    return ProcessingSpec(inputs=tuple(inputs), outputs=tuple(outputs))


def check_pins(pools: Iterable[PoolSpec], inventory_hosts: Mapping[str, Iterable[str]],
               where: str) -> str | None:
    """The first pool whose ``hosts`` or ``labels`` the inventory cannot meet, as the error
    text (``where``: the spec file's name), or None. ``inventory_hosts``: host -> its labels."""
    for i, pool in enumerate(pools):
        unknown = [h for h in pool.hosts if h not in inventory_hosts]
        if unknown:
            return (f"{where}: field 'pools[{i}].hosts': expected hosts from the inventory "
                    f"({', '.join(inventory_hosts)}) (pool {pool.role!r}), got unknown "
                    + ", ".join(map(repr, unknown)))
        if pool.labels:
            carrying = [h for h, labels in inventory_hosts.items() if set(pool.labels) <= set(labels)]
            if not carrying:
                known = sorted({lb for labels in inventory_hosts.values() for lb in labels})
                missing = [lb for lb in pool.labels if not any(lb in set(ls) for ls in inventory_hosts.values())]
                got = missing[0] if missing else ", ".join(pool.labels)
                what = ("labels some inventory host carries" if missing
                        else "labels that one inventory host carries together")
                return (f"{where}: field 'pools[{i}].labels': expected {what} (known: "
                        f"{', '.join(known) or 'none'}) (pool {pool.role!r}), got {got!r}")
    return None
