"""GPU bookkeeping and placement: which hosts and GPUs each job gets.

The scheduler reads a capacity list (``capacity_from_state`` builds it from the live cluster
state) and keeps its own reservations; it never talks to a host. Rules:

- A GPU belongs to at most one job. A GPU is free when no job holds it and telemetry shows no
  process on it: foreign processes (not rigdeck's) and processes of rigdeck jobs the scheduler
  does not hold (say, one still exiting) both keep it busy.
- GPU jobs are packed vertically: the hosts with the most free GPUs are chosen first (ties by
  name), each giving exactly ``gpus_per_node`` GPUs, its lowest free indices.
- CPU-only jobs (``processes_per_node``) do not own anything: any up host will do, hosts without
  GPUs first, then the hosts running the fewest CPU jobs.
- Reservations are all-or-nothing. Ranks follow host names in sorted order, so the primary is
  the first name, as with SageMaker's sorted ``hosts``.
- A pool job (``[[pools]]``) gets one node per replica, every pool or none, in pool order
  (primary, worker, parameter_server, reduction_server, evaluator) then replica index, so ranks
  stay contiguous and torch's world (primary + workers) is ranks 0..W-1. A replica goes to the
  allowed host (its pool's ``hosts`` or ``labels``) with the fewest replicas of this job so far,
  then (GPU pools) the most GPUs still free, (CPU pools) hosts without GPUs and with fewer CPU
  jobs first, then by name. Several replicas may share a host; ``Placement.hosts`` is unique.
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tui.model.health import Drain
from tui.model.hostviews import HostView
from tui.model.inventory import Inventory
from tui.model.jobspec import JobSpec
from tui.model.poolspec import PoolSpec, check_pins, in_role_order

__all__ = [
    "HostCapacity",
    "NodeAssignment",
    "Placement",
    "PlacementError",
    "Scheduler",
    "capacity_from_state",
    "instance_type",
]


class PlacementError(ValueError):
    """A job cannot be placed (or adopted); the message says what was asked and what is free."""


@dataclass(frozen=True)
class HostCapacity:
    """What one host offers right now, as telemetry sees it."""

    name: str
    address: str
    up: bool
    cpus: int | None
    gpus: tuple[int, ...]  # physical GPU indices present
    foreign_busy: tuple[int, ...]  # GPUs running processes that are not rigdeck's
    simulated: bool
    gpu_name: str | None
    labels: tuple[str, ...] = ()
    # For messages and for GPUs rigdeck itself uses without a reservation here.
    status: str | None = None  # "up", "down", "stale", "connecting"; None: from ``up``
    foreign_users: tuple[tuple[int, str], ...] = ()  # (GPU, "bob" or "bob, carol")
    job_busy: tuple[tuple[int, str], ...] = ()  # (GPU, job id) of rigdeck processes seen
    claimed: tuple[tuple[int, str, str], ...] = ()  # (GPU, job id, user) claimed on the host
    # GPUs no job may use: unhealthy (the agent's judgement) or drained (an operator's, or
    # rigdeck's after a fault), with why: (GPU, "unhealthy: XID 79: ...", "drained: ...").
    unusable: tuple[tuple[int, str], ...] = ()
    why: str | None = None  # why a host that is not up is not (its last error), when known
    # GPUs Slurm allocated to a job of its own on this host (a slurmd beside rigdeck):
    # (GPU, Slurm job id or "", user or ""). Never placed on.
    slurm: tuple[tuple[int, str, str], ...] = ()

    @property
    def state(self) -> str:
        return self.status or ("up" if self.up else "down")


@dataclass(frozen=True)
class NodeAssignment:
    """One host's share of a job; ``cpus`` is the host's CPU count (SM_NUM_CPUS). In a pool
    job, one replica: ``pool`` its role and ``replica`` its index in the pool (None otherwise)."""

    host: str
    address: str
    slots: int
    gpus: tuple[int, ...]
    cpus: int | None
    instance_type: str
    simulated: bool
    pool: str | None = None
    replica: int | None = None

    def to_plan(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "host": self.host,
            "address": self.address,
            "slots": self.slots,
            "gpus": list(self.gpus),
            "cpus": self.cpus,
            "instance_type": self.instance_type,
            "simulated": self.simulated,
        }
        if self.pool is not None:
            out["pool"] = self.pool
            out["replica"] = self.replica
        return out

    @classmethod
    def from_plan(cls, d: Mapping[str, Any]) -> NodeAssignment:
        return cls(
            host=str(d["host"]),
            address=str(d["address"]),
            slots=int(d["slots"]),
            gpus=tuple(int(g) for g in d.get("gpus") or ()),
            cpus=None if d.get("cpus") is None else int(d["cpus"]),
            instance_type=str(d.get("instance_type", "")),
            simulated=bool(d.get("simulated", False)),
            pool=None if d.get("pool") is None else str(d["pool"]),
            replica=None if d.get("replica") is None else int(d["replica"]),
        )


@dataclass(frozen=True)
class Placement:
    """A job's nodes in rank order; ``nodes[0]`` is the primary. A pool job's nodes are its
    replicas, and a host may hold several of them."""

    nodes: tuple[NodeAssignment, ...]

    @property
    def world_size(self) -> int:
        return sum(n.slots for n in self.nodes)

    @property
    def hosts(self) -> tuple[str, ...]:
        """Each host once, in the order its first node comes."""
        return tuple(dict.fromkeys(n.host for n in self.nodes))

    def on_host(self, host: str) -> list[int]:
        """The indices in ``nodes`` of the nodes on ``host`` (ascending)."""
        return [i for i, n in enumerate(self.nodes) if n.host == host]

    @property
    def primary(self) -> NodeAssignment:
        return self.nodes[0]

    def gpu_keys(self) -> set[tuple[str, int]]:
        """Every (host, GPU) this placement holds."""
        return {(n.host, g) for n in self.nodes for g in n.gpus}

    def to_plan_nodes(self) -> list[dict[str, Any]]:
        """The job plan's ``nodes`` list (docs/contracts.md)."""
        return [n.to_plan() for n in self.nodes]

    @classmethod
    def from_plan_nodes(cls, nodes: Sequence[Mapping[str, Any]]) -> Placement:
        """The inverse of ``to_plan_nodes`` (for ``Scheduler.adopt`` from a plan on a host)."""
        return cls(tuple(NodeAssignment.from_plan(n) for n in nodes))


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def instance_type(cap: HostCapacity) -> str:
    """A name for the kind of host, like SageMaker's ``ml.p3.16xlarge``.

    ``rigdeck.gpu-8xnvidia-h100-80gb-hbm3`` (GPU count and model), ``rigdeck.sim-gpu-4``
    (simulated GPUs), ``rigdeck.cpu-16`` (no GPUs; CPU count).
    """
    if cap.gpus:
        n = len(cap.gpus)
        if cap.simulated:
            return f"rigdeck.sim-gpu-{n}"
        slug = _slug(cap.gpu_name or "")
        return f"rigdeck.gpu-{n}x{slug}" if slug else f"rigdeck.gpu-{n}"
    return f"rigdeck.cpu-{cap.cpus}" if cap.cpus else "rigdeck.cpu"


def _plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else many or word + 's'}"


def _indices(gpus: Iterable[int]) -> str:
    return ",".join(str(g) for g in sorted(gpus))


@dataclass
class _HostView:
    """One host as a given job would see it: free GPUs and why the others are not."""

    cap: HostCapacity
    excluded: bool
    free: tuple[int, ...] = ()
    busy: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.cap.name

    @property
    def usable(self) -> bool:
        return self.cap.up and not self.excluded

    def describe(self, gpu_job: bool) -> str:
        """``h1 1 GPU (GPU 2,3 busy with job 'a')``, ``h2 down``, ``h3 excluded``."""
        if not self.cap.up:
            return f"{self.name} {self.cap.state}"
        if self.excluded:
            return f"{self.name} excluded"
        if not gpu_job:
            return f"{self.name} up"
        if not self.cap.gpus:
            return f"{self.name} no GPUs"
        text = f"{self.name} {_plural(len(self.free), 'GPU')}"
        return text + (f" ({'; '.join(self.busy)})" if self.busy else "")


def _views(
    capacity: Sequence[HostCapacity],
    held: Mapping[tuple[str, int], str],
    job_id: str | None,
    exclude: frozenset[str],
) -> dict[str, _HostView]:
    views: dict[str, _HostView] = {}
    for cap in capacity:
        if cap.name in views:
            continue
        view = _HostView(cap, cap.name in exclude)
        views[cap.name] = view
        if not cap.up:
            continue
        taken: set[int] = set()
        # Never placed on, whoever asks: a GPU that fails or that someone took out of service.
        for g, why in cap.unusable:
            if g in cap.gpus and g not in taken:
                view.busy.append(f"GPU {g} {why}")
                taken.add(g)
        by_job: dict[str, list[int]] = {}
        for g in cap.gpus:
            holder = held.get((cap.name, g))
            if holder is not None:
                by_job.setdefault(holder, []).append(g)
                taken.add(g)
        for jid, gpus in by_job.items():
            view.busy.append(f"GPU {_indices(gpus)} busy with job {jid!r}")
        users = dict(cap.foreign_users)
        by_user: dict[str, list[int]] = {}
        for g in cap.foreign_busy:
            if g in cap.gpus and g not in taken:
                by_user.setdefault(users.get(g, ""), []).append(g)
                taken.add(g)
        for user, gpus in by_user.items():
            many = ", " in user  # several users' processes on these GPUs
            who = f" of user{'s' if many else ''} {user}" if user else ""
            what = "foreign processes" if many else "a foreign process"
            view.busy.append(f"GPU {_indices(gpus)} used by {what}{who}")
        unheld: dict[str, list[int]] = {}
        for g, jid in cap.job_busy:
            # A job's own leftovers (a restart after release) do not block it.
            if g in cap.gpus and g not in taken and jid != job_id:
                unheld.setdefault(jid, []).append(g)
                taken.add(g)
        for jid, gpus in unheld.items():
            view.busy.append(f"GPU {_indices(gpus)} running job {jid!r} (not reserved)")
        by_slurm: dict[tuple[str, str], list[int]] = {}
        for g, jid, user in cap.slurm:
            if g in cap.gpus and g not in taken:
                by_slurm.setdefault((jid, user), []).append(g)
                taken.add(g)
        for (jid, user), gpus in by_slurm.items():
            view.busy.append(f"GPU {_indices(gpus)} allocated by Slurm"
                             + (f" to job {jid}" if jid else "") + (f" of user {user}" if user else ""))
        claims: dict[tuple[str, str], list[int]] = {}
        for g, jid, user in cap.claimed:
            # The host's claim is the truth, whichever controller placed the job holding it.
            if g in cap.gpus and g not in taken and jid != job_id:
                claims.setdefault((jid, user), []).append(g)
                taken.add(g)
        for (jid, user), gpus in claims.items():
            view.busy.append(f"GPU {_indices(gpus)} claimed by job {jid!r}" + (f" of user {user}" if user else ""))
        view.free = tuple(g for g in sorted(cap.gpus) if g not in taken)
    return views


class Scheduler:
    """Thread-safe. Reservations are all-or-nothing across hosts; no two jobs share a GPU."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reservations: dict[str, Placement] = {}

    def _held(self, but: str | None = None) -> dict[tuple[str, int], str]:
        return {
            key: jid
            for jid, placement in self._reservations.items()
            if jid != but
            for key in placement.gpu_keys()
        }

    def _cpu_jobs(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for placement in self._reservations.values():
            for node in placement.nodes:
                if not node.gpus:
                    counts[node.host] = counts.get(node.host, 0) + 1
        return counts

    def reserve(
        self,
        job_id: str,
        spec: JobSpec,
        capacity: Sequence[HostCapacity],
        *,
        exclude_hosts: Iterable[str] = (),
        prefer_hosts: Iterable[str] = (),
    ) -> Placement:
        """Choose hosts and GPUs for ``spec`` and hold them for ``job_id``; PlacementError if
        it does not fit (nothing is held then). ``prefer_hosts`` (a restart's previous hosts) are
        chosen before others where they have room."""
        exclude = frozenset(exclude_hosts)
        with self._lock:
            if job_id in self._reservations:
                raise PlacementError(
                    f"job {job_id!r} already holds {', '.join(self._reservations[job_id].hosts)}"
                    " (release it first)"
                )
            views = _views(capacity, self._held(), job_id, exclude)
            placement = _place(spec, views, self._cpu_jobs(), frozenset(prefer_hosts))
            self._reservations[job_id] = placement
            return placement

    def fits(self, spec: JobSpec, capacity: Sequence[HostCapacity], *,
             without: Iterable[str] = ()) -> PlacementError | None:
        """Whether ``spec`` would fit now, holding nothing: None, or why not. ``without``: jobs
        whose GPUs count as free (what preempting them would give)."""
        gone = frozenset(without)
        if gone:
            capacity = [dataclasses.replace(c, job_busy=tuple(x for x in c.job_busy if x[1] not in gone),
                                            claimed=tuple(x for x in c.claimed if x[1] not in gone))
                        for c in capacity]
        with self._lock:
            held = {k: j for k, j in self._held().items() if j not in gone}
            views = _views(capacity, held, "\0probe", frozenset())
            try:
                _place(spec, views, self._cpu_jobs())
            except PlacementError as e:
                return e
            return None

    def release(self, job_id: str) -> None:
        """Give back what ``job_id`` holds; a job holding nothing is fine."""
        with self._lock:
            self._reservations.pop(job_id, None)

    def adopt(self, job_id: str, placement: Placement) -> None:
        """Hold ``placement`` for a job found running (after a controller restart).

        Replaces what ``job_id`` held; PlacementError if another job holds one of its GPUs.
        """
        with self._lock:
            held = self._held(but=job_id)
            clash = sorted(k for k in placement.gpu_keys() if k in held)
            if clash:
                listing = ", ".join(f"{h} GPU {g} (job {held[(h, g)]!r})" for h, g in clash)
                raise PlacementError(f"job {job_id!r} cannot be adopted: held by others: {listing}")
            self._reservations[job_id] = placement

    def reservations(self) -> dict[str, Placement]:
        """A copy: job id -> placement."""
        with self._lock:
            return dict(self._reservations)

    def free_gpus(self, capacity: Sequence[HostCapacity]) -> dict[str, tuple[int, ...]]:
        """Free GPU indices per host (none on hosts that are not up)."""
        with self._lock:
            views = _views(capacity, self._held(), None, frozenset())
        return {name: view.free for name, view in views.items()}


def _ask(spec: JobSpec, n: int) -> str:
    if spec.gpus_per_node is not None:
        per = _plural(spec.gpus_per_node, "GPU")
    else:
        per = _plural(spec.processes_per_node or 1, "process", "processes")
    on = f" on {', '.join(spec.hosts)}" if spec.hosts else ""
    return f"job {spec.name!r} asks {_plural(n, 'node')} x {per}{on}"


def _free_listing(views: Mapping[str, _HostView], gpu_job: bool) -> str:
    hosts = ", ".join(v.describe(gpu_job) for v in views.values()) or "no hosts"
    return f"{'free' if gpu_job else 'hosts'}: {hosts}"


def _place(spec: JobSpec, views: Mapping[str, _HostView], cpu_jobs: Mapping[str, int],
           prefer: frozenset[str] = frozenset()) -> Placement:
    if spec.pools:
        return _place_pools(spec, views, cpu_jobs)
    gpu_job = spec.gpus_per_node is not None
    k = spec.gpus_per_node or 0
    n = len(spec.hosts) if spec.hosts else spec.node_count
    ask = _ask(spec, n)

    def fail(problem: str) -> PlacementError:
        return PlacementError(f"{ask}: {problem}; {_free_listing(views, gpu_job)}")

    chosen: list[_HostView]
    if spec.hosts:
        problems = []
        for name in spec.hosts:
            view = views.get(name)
            if view is None:
                known = ", ".join(sorted(views)) or "none"
                problems.append(f"unknown host {name!r} (known: {known})")
            elif not view.cap.up:
                why = f" ({view.cap.why})" if view.cap.why else ""
                problems.append(f"host {name!r} is {view.cap.state}{why}")
            elif view.excluded:
                problems.append(f"host {name!r} is excluded")
            elif gpu_job and len(view.free) < k:
                problems.append(f"host {name!r} has {_plural(len(view.free), 'free GPU')}")
        if problems:
            raise fail("; ".join(problems))
        chosen = [views[name] for name in spec.hosts]
    elif gpu_job:
        fits = [v for v in views.values() if v.usable and len(v.free) >= k]
        if len(fits) < n:
            raise fail(f"hosts with >= {_plural(k, 'free GPU')}: {len(fits)}")
        fits.sort(key=lambda v: (v.name not in prefer, -len(v.free), v.name))
        chosen = fits[:n]
    else:
        usable = [v for v in views.values() if v.usable]
        if len(usable) < n:
            raise fail(f"hosts up: {len(usable)}")
        usable.sort(key=lambda v: (v.name not in prefer, bool(v.cap.gpus), cpu_jobs.get(v.name, 0), v.name))
        chosen = usable[:n]

    slots = spec.slots_per_node
    nodes = [
        NodeAssignment(
            host=v.name,
            address=v.cap.address,
            slots=slots,
            gpus=v.free[:k] if gpu_job else (),
            cpus=v.cap.cpus,
            instance_type=instance_type(v.cap),
            simulated=v.cap.simulated,
        )
        for v in chosen
    ]
    return Placement(tuple(sorted(nodes, key=lambda a: a.host)))


def _pool_ask(pool: PoolSpec) -> str:
    per = (_plural(pool.gpus_per_replica, "GPU") if pool.gpus_per_replica
           else _plural(pool.slots, "process", "processes"))
    pins = f" on {', '.join(pool.hosts)}" if pool.hosts else (
        f" on hosts labelled {', '.join(pool.labels)}" if pool.labels else "")
    return f"pool {pool.role!r} {_plural(pool.replicas, 'replica')} x {per}{pins}"


def _place_pools(spec: JobSpec, views: Mapping[str, _HostView], cpu_jobs: Mapping[str, int]) -> Placement:
    """Every replica of every pool a node, or PlacementError (nothing is held then)."""
    pinned = check_pins(spec.pools, {name: v.cap.labels for name, v in views.items()},
                        str(spec.path or "job spec"))
    if pinned is not None:
        raise PlacementError(pinned)
    taken: dict[str, set[int]] = {}  # GPUs given to earlier replicas of this job
    count: dict[str, int] = {}  # replicas of this job on each host so far
    nodes: list[NodeAssignment] = []

    def free(v: _HostView) -> tuple[int, ...]:
        return tuple(g for g in v.free if g not in taken.get(v.name, set()))

    for pool in in_role_order(spec.pools):
        k = pool.gpus_per_replica or 0
        allowed = [v for v in views.values()
                   if (not pool.hosts or v.name in pool.hosts) and set(pool.labels) <= set(v.cap.labels)]
        for r in range(pool.replicas):
            usable = [v for v in allowed if v.usable and (not k or len(free(v)) >= k)]
            if not usable:
                placed = f" ({_plural(r, 'replica')} placed)" if r else ""
                need = f"host with >= {_plural(k, 'free GPU')}" if k else "host up"
                hosts = ", ".join(f"{v.name} {_plural(len(free(v)), 'free GPU')}" if k and v.usable
                                  else v.describe(False) for v in allowed) or "none allowed"
                raise PlacementError(f"job {spec.name!r} asks {_pool_ask(pool)}: replica {r} has no "
                                     f"{need}{placed}; its hosts: {hosts}")
            if k:
                usable.sort(key=lambda v: (count.get(v.name, 0), -len(free(v)), v.name))
            else:
                usable.sort(key=lambda v: (count.get(v.name, 0), bool(v.cap.gpus), cpu_jobs.get(v.name, 0), v.name))
            v = usable[0]
            gpus = free(v)[:k]
            taken.setdefault(v.name, set()).update(gpus)
            count[v.name] = count.get(v.name, 0) + 1
            nodes.append(NodeAssignment(
                host=v.name, address=v.cap.address, slots=pool.slots, gpus=gpus, cpus=v.cap.cpus,
                instance_type=instance_type(v.cap), simulated=v.cap.simulated, pool=pool.role, replica=r,
            ))
    return Placement(tuple(nodes))


NO_JOBS_ON_SERVER = "the [server] host takes no jobs (allow_jobs = true in [server] lets it)"


def capacity_from_state(
    snapshot: Sequence[HostView], inventory: Inventory | None = None, drains: Sequence[Drain] = ()
) -> list[HostCapacity]:
    """Capacities of the hosts in ``ClusterState.snapshot()``, in its order.

    Only hosts whose status is "up" can take work. A GPU process without a job id is foreign.
    The inventory, when given, supplies labels (and the address, should the snapshot lack one).
    A GPU the agent calls unhealthy, or one ``drains`` names, is unusable; a drained host is
    not up (its status says "drained"), nor is one whose node Slurm drained or took down (its
    agent says so: ``why`` says Slurm's reason), nor the inventory's ``[server]`` host unless its
    ``allow_jobs`` (status "server").
    """
    specs = {h.name: h for h in inventory.hosts} if inventory is not None else {}
    server = getattr(inventory, "server", None)
    no_jobs = {server.host} if server is not None and not server.allow_jobs else set()
    out: list[HostCapacity] = []
    for host in snapshot:
        name = str(host.name)
        status = str(host.status or "down")
        gpus: list[int] = []
        foreign: list[int] = []
        users: list[tuple[int, str]] = []
        job_busy: list[tuple[int, str]] = []
        claimed: list[tuple[int, str, str]] = []
        slurm: list[tuple[int, str, str]] = []
        names: list[str] = []
        unusable: list[tuple[int, str]] = []
        simulated = bool(host.simulated)
        for g in host.gpus or ():
            index = int(g.index)
            gpus.append(index)
            drain = next((d for d in drains if d.host == name and d.gpu == index), None)
            if drain is not None:
                unusable.append((index, f"drained ({drain.reason})" if drain.reason else "drained"))
            elif g.health == "unhealthy":
                unusable.append((index, f"unhealthy ({g.health_reason})" if g.health_reason else "unhealthy"))
            if g.name:
                names.append(str(g.name))
            simulated = simulated or g.simulated
            procs = g.processes
            strangers = sorted({str(p.user or "") for p in procs if p.job_id is None})
            if any(p.job_id is None for p in procs):
                foreign.append(index)
                who = ", ".join(u for u in strangers if u)
                if who:
                    users.append((index, who))
            for jid in sorted({str(p.job_id) for p in procs if p.job_id is not None}):
                job_busy.append((index, jid))
            claim = g.claim
            if claim is not None and claim.scheduler == "slurm":
                slurm.append((index, str(claim.job_id or ""), str(claim.user or "")))
            elif claim is not None:
                claimed.append((index, str(claim.job_id or "?"), str(claim.user or "")))
        sample = host.host_sample
        per_core = sample.cpu_per_core if sample is not None else None
        spec = specs.get(name)
        why = str(host.reason) if status not in ("up", "drained") and host.reason else None
        kept_off = sample.slurm_unavailable if sample is not None else None
        if any(d.host == name and d.gpu is None for d in drains):
            status = "drained"
        elif kept_off and status == "up":  # drained or down in Slurm: rigdeck keeps off it too
            status, why = "drained", kept_off
        elif status == "up" and name in no_jobs:
            status, why = "server", NO_JOBS_ON_SERVER
        out.append(
            HostCapacity(
                name=name,
                address=str(host.address or (spec.address if spec else name)),
                up=status == "up",
                cpus=len(per_core) if per_core else None,
                gpus=tuple(sorted(gpus)),
                foreign_busy=tuple(sorted(foreign)),
                simulated=simulated,
                gpu_name=names[0] if names else None,
                labels=spec.labels if spec else (),
                status=status,
                foreign_users=tuple(users),
                job_busy=tuple(job_busy),
                claimed=tuple(claimed),
                unusable=tuple(unusable),
                why=why,
                slurm=tuple(slurm),
            )
        )
    return out
