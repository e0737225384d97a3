"""Where a job's attempt runs and who starts it: one seam, two engines.

``JobManager`` (tui/control/jobs.py) asks an ``Engine`` for each attempt of a job (its launch,
a gang restart) and for its end (a stop); supervision, history, metrics and the faces never
ask which engine ran it: both put rigdeck's job host on every host of the placement, and the
job hosts report to the agents as always.

- ``OwnHosts``: rigdeck's own placement. The scheduler reserves GPUs from telemetry, every host
  is checked (room, GPUs free) and claimed (a flock per GPU, host by host), then the agents
  start the job hosts.
- ``SlurmEngine`` (an inventory with ``[slurm]``): Slurm places. ``sbatch`` is run on the login
  host through its agent (``slurm_submit``: agent/slurmstep.py's batch script, whose ``srun
  --ntasks-per-node=1`` step starts the agent's ``slurmhost`` on every node); the engine reads
  the allocation (``scontrol -d show job``: nodes and GPU indices), makes the placement of it,
  and the agents write each node's plan, which that node's task in the step is waiting for: the
  job host runs inside the Slurm step, on the GPUs Slurm gave. ``scancel`` ends it. Slurm's
  queue decides when it runs; rigdeck's own queue never holds it. A restart (healing's, the
  gang rules') ends the previous Slurm job and submits a new one with ``--exclude`` of the nodes
  rigdeck drains or lost; rigdeck's drains are Slurm's too (``drain``/``resume``).

  A first start whose plan a template can describe (``self_starts``) is left to the nodes, as
  ``sbatch`` leaves a job: before sbatch, the engine writes a template of the plan on every node
  Slurm may choose (``_write_templates``), then submits and raises ``Queued``; the launch records
  the job and returns (after a short look for where it runs). When Slurm runs the job, at once
  or after days in its queue, each node's task makes its plan of the template and the allocation
  and starts its job host, with nobody watching (agent/slurmstep.py). A controller that looks
  records where Slurm ran it (``allocated``). A job a template cannot describe (an mpirun job,
  pools, a processing job, staged inputs, ``env_from_file``), and every restart, waits for its
  allocation and has its plans written by the controller, as above.

  A pool job is one Slurm job of identical nodes (``pool_shape``: rigdeck's own packing of its
  replicas on idle nodes says how many nodes, and the most GPUs any of them takes is every
  node's ``--gres``); once Slurm allocates, the same packing on the nodes and GPUs it gave
  places the replicas, several to a node where they fit, one job host per node.
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from tui.model.jobspec import JobSpec
from tui.model.scheduler import NodeAssignment, Placement, PlacementError, Scheduler, instance_type
from tui.model.slurm import (
    ENDED_STATES,
    SlurmJobDetail,
    SlurmParseError,
    SlurmReadError,
    check_spec,
    login_of,
    node_index,
    parse_job_detail,
    read_nodes,
    sbatch_options,
)
from tui.remote.transport import TransportError

if TYPE_CHECKING:
    from tui.control.jobs import JobManager

ALLOCATION_WAIT_S = 600.0  # how long a launch waits for Slurm to run the job it submitted
POLL_S = 0.25
ALLOCATION_POLL_S, ALLOCATION_QUICK_S = 0.1, 10.0  # the allocation's first 10 s read every 0.1 s
# A job left to its nodes starts whether anyone looks or not: a launch that waits to say where it
# runs asks at this pace, not the allocation's, so its questions (Slurm's job, the primary's plan)
# do not take the CPU the nodes are starting the job with.
LOOK_POLL_S = 0.5
STEP_START_S = 5.0  # a node's task of the step has had this long to start its job host
STEP_LOST_S = 120.0  # ... and is lost after this long, whatever Slurm says of the job
FINISH_WAIT_S = 10.0  # for Slurm to say how its job ended, once the job hosts have
SLURM_MARGIN_S = 60.0  # Slurm's time limit past max_runtime and the grace: rigdeck's own stop first


class EngineError(Exception):
    """A start the engine could not make; the message says what was asked and what was said."""


class Queued(Exception):
    """The job is Slurm's now: its nodes start it themselves when Slurm runs it, from the
    templates written before its submission."""

    def __init__(self, slurm_job_id: str) -> None:
        super().__init__(f"Slurm job {slurm_job_id}: its nodes start it")
        self.slurm_job_id = slurm_job_id


def self_starts(spec: JobSpec) -> str | None:
    """Why the hosts could not start ``spec`` from a template when Slurm runs it (the controller
    must: it waits for the allocation), or None when they can."""
    if spec.launcher == "mpirun":
        return "an mpirun job's primary starts after every other host's job directory is in place"
    if spec.pools:
        return "worker pools get a port per replica, probed on each host"
    if spec.kind == "processing":
        return "a processing job's inputs are sharded over the nodes Slurm gives"
    if spec.inputs or spec.seed_checkpoint:
        return "inputs are staged on the nodes Slurm gives"
    if spec.env_from_file:
        return "env_from_file values go only to the nodes that run the job"
    return None


def _as_idle(cap: Any, **more: Any) -> Any:
    """A host's capacity with nothing of anyone's on its GPUs (processes, rigdeck's jobs, claims,
    Slurm's jobs), as a Slurm job's own packing sees the nodes Slurm gives it; ``more`` replaces
    other fields."""
    return dataclasses.replace(cap, foreign_busy=(), foreign_users=(), job_busy=(), claimed=(), slurm=(), **more)


class Engine(Protocol):
    name: str

    def place(self, job_id: str, spec: JobSpec, *, capacity: Any = None,
              exclude: Sequence[str] | None = None, prefer: Sequence[str] = ()) -> Placement:
        """Where the job's next attempt runs, held for it: rigdeck's reserved and claimed GPUs,
        or the nodes and GPUs Slurm allocated. ``capacity``: the hosts' as a caller has just read
        it; ``exclude``: a restart's hosts out of reach (None: a first start); ``prefer``: a
        restart's previous hosts, taken first where they still have room (their warm standbys and
        memory snapshots are there). Raises PlacementError or EngineError."""
        ...

    def start(self, job_id: str, spec: JobSpec, placement: Placement, restart_count: int) -> None:
        """Start the attempt on ``placement`` (everywhere or nowhere: what it held given back)."""
        ...

    def release(self, job_id: str) -> None:
        """Give back what ``place`` held for a start that will not come."""
        ...

    def record(self, job_id: str) -> dict[str, Any]:
        """What the job's record keeps of this engine (``{"slurm": {...}}``, or nothing)."""
        ...

    def stop(self, rec: Mapping[str, Any]) -> None:
        """The engine's own end of a job whose hosts were told to stop (``scancel``)."""
        ...

    def finish(self, rec: Mapping[str, Any]) -> None:
        """The job ended (recorded so): the engine's own word on its end kept (Slurm's state)."""
        ...

    def checked(self, rec: Mapping[str, Any], states: dict[str, Any]) -> dict[str, Any]:
        """The hosts' states, with what the engine knows that they cannot: a host whose job host
        never started since Slurm's job ended is failed, saying so."""
        ...

    def about(self, rec: Mapping[str, Any], live: bool) -> dict[str, Any] | None:
        """The engine's word on the job for the faces (Slurm's job id and state), or None."""
        ...


class OwnHosts:
    """rigdeck's own placement and start (see the module's docstring)."""

    name = "rigdeck"

    def __init__(self, jm: JobManager) -> None:
        self.jm = jm

    def place(self, job_id: str, spec: JobSpec, *, capacity: Any = None,
              exclude: Sequence[str] | None = None, prefer: Sequence[str] = ()) -> Placement:
        jm = self.jm
        if capacity is None:
            candidates = [h for h in (list(spec.hosts) or jm.ctl.inventory.names) if h not in (exclude or ())]
            capacity = jm.capacity(candidates, skip=job_id if exclude is not None else None)
        placement = jm.scheduler.reserve(job_id, spec, capacity, exclude_hosts=list(exclude or ()),
                                         prefer_hosts=prefer)
        try:
            if exclude is None:  # a first start checks room and GPUs first; a restart claims at once
                self._preflight(job_id, placement, spec)
            self._claim(job_id, placement)
        except BaseException:
            jm.scheduler.release(job_id)
            raise
        return placement

    @staticmethod
    def _gpus_by_host(placement: Placement) -> dict[str, list[int]]:
        """Every GPU the job holds on each host (a pool job's replicas on one host together)."""
        gpus: dict[str, list[int]] = {h: [] for h in placement.hosts}
        for n in placement.nodes:
            gpus[n.host] += [g for g in n.gpus if g not in gpus[n.host]]
        return gpus

    @staticmethod
    def _containers_by_host(placement: Placement, spec: JobSpec | None) -> dict[str, list[dict[str, Any]]]:
        """The containers each host will run for the job: the job's ``[container]``, or in a
        pool job those of the pools it has replicas of (each distinct one once)."""
        out: dict[str, list[dict[str, Any]]] = {h: [] for h in placement.hosts}
        if spec is None:
            return out
        pools = {p.role: p for p in spec.pools}
        for n in placement.nodes:
            box = spec.container_of(pools.get(str(n.pool))) if spec.pools else spec.container
            if box is not None and box.to_dict() not in out[n.host]:
                out[n.host].append(box.to_dict())
        return out

    def _preflight(self, job_id: str, placement: Placement, spec: JobSpec | None = None) -> None:
        """Before anything starts: every host has room for the job's files and its GPUs free,
        and the runtime and image of each container it will run are there (a pool job may run
        several: one check each, the space and the GPUs with the first)."""
        boxes = self._containers_by_host(placement, spec)
        hosts = list(placement.hosts)
        gpus = self._gpus_by_host(placement)
        from concurrent.futures import ThreadPoolExecutor

        def one(h: str) -> Any:
            agent = self.jm.ctl.agent(h)
            try:
                first = agent.job_check(job_id=job_id, gpus=gpus[h], min_free_mb=self.jm.ctl.inventory.min_free_mb,
                                        container=boxes[h][0] if boxes[h] else None, timeout=30)
                more = [agent.job_check(job_id=job_id, gpus=[], min_free_mb=0, container=box, timeout=30).problems
                        for box in boxes[h][1:]]
            except TransportError as e:
                return e
            return [*first.problems, *(p for ps in more for p in ps if p not in first.problems)]

        with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
            results = dict(zip(hosts, pool.map(one, hosts), strict=True))
        problems = []
        for h, r in results.items():
            if isinstance(r, Exception):
                problems.append(f"{h}: {r}")
            else:
                problems += [f"{h}: {p}" for p in r]
        if problems:
            raise EngineError("job not started (nothing was started): " + "; ".join(problems))

    def _claim(self, job_id: str, placement: Placement) -> None:
        """Claim the job's GPUs on every host, one host after another in name order: of two
        controllers racing for the same GPUs, the one that claims the first contested host wins
        them all, and the other gives back what it claimed. All hosts or none."""
        claimed: list[str] = []
        host = ""
        try:
            for host, gpus in sorted(self._gpus_by_host(placement).items()):
                if not gpus:
                    continue
                self.jm.ctl.agent(host).job_claim(job_id=job_id, gpus=gpus, timeout=30)
                claimed.append(host)
        except TransportError as e:
            self.jm.ctl.agents(claimed).job_release(job_id=job_id, timeout=30)
            raise EngineError(f"job not started (nothing was started): {host}: {e}") from None

    def start(self, job_id: str, spec: JobSpec, placement: Placement, restart_count: int) -> None:
        try:
            self.jm._start(job_id, spec, placement, restart_count=restart_count)
        except BaseException:
            self.jm.scheduler.release(job_id)
            raise

    def release(self, job_id: str) -> None:
        self.jm.scheduler.release(job_id)

    def record(self, job_id: str) -> dict[str, Any]:
        return {}

    def stop(self, rec: Mapping[str, Any]) -> None:
        return None

    def finish(self, rec: Mapping[str, Any]) -> None:
        return None

    def checked(self, rec: Mapping[str, Any], states: dict[str, Any]) -> dict[str, Any]:
        return states

    def about(self, rec: Mapping[str, Any], live: bool) -> dict[str, Any] | None:
        return None


class SlurmEngine:
    """Slurm's placement and start (see the module's docstring)."""

    name = "slurm"

    def __init__(self, jm: JobManager) -> None:
        self.jm = jm
        self._submitted: dict[str, dict[str, Any]] = {}  # job id -> its Slurm job, until recorded
        self._one_read = threading.local()  # a place()'s one read of Slurm's nodes (``_nodes``)

    # -- Slurm's commands on the login host, through its agent (no shell) ----------------------

    @property
    def login(self) -> str:
        try:
            return login_of(self.jm.ctl.inventory)
        except SlurmReadError as e:
            raise EngineError(str(e)) from None

    def _exec(self, hosts: list[str], argv: list[str], timeout_s: float) -> Mapping[str, Any]:
        return dict(self.jm.ctl.agents(hosts).exec(argv=list(argv), timeout_s=timeout_s, timeout=timeout_s + 30))

    def _run(self, argv: Sequence[str], timeout_s: float = 15.0) -> dict[str, Any]:
        login = self.login
        try:
            answer = self._exec([login], list(argv), timeout_s)[login]
        except TransportError as e:
            raise EngineError(f"{' '.join(argv)} on {login}: {e}") from None
        if not isinstance(answer, Mapping):
            raise EngineError(f"{' '.join(argv)} on {login}: {answer}")
        return dict(answer)

    def detail(self, slurm_job_id: str) -> SlurmJobDetail | None:
        """``scontrol -d show job``'s word on a job (None: Slurm no longer knows it)."""
        argv = ["scontrol", "-d", "show", "job", slurm_job_id]
        out = self._run(argv)
        if out.get("exit_code") != 0:
            said = " ".join(str(out.get("stderr") or out.get("error") or "").split())
            if "Invalid job id" in said:
                return None
            raise EngineError(f"{' '.join(argv)} on {self.login}: {said or 'exit ' + str(out.get('exit_code'))}")
        try:
            return parse_job_detail(str(out.get("stdout") or ""), " ".join(argv))
        except SlurmParseError as e:
            raise EngineError(str(e)) from None

    # -- the seam ---------------------------------------------------------------------------

    def _checked(self, spec: JobSpec) -> None:
        """Before anything is submitted: what Slurm will not take, said in its own words."""
        inv = self.jm.ctl.inventory
        where = str(spec.path or "job spec")
        if spec.kind not in ("training", "processing"):
            raise EngineError(f"{where}: a {spec.kind} job on a Slurm cluster: not yet (docs/slurm.md); "
                              "training and processing jobs launch through sbatch")
        pinned_pools = [p.role for p in spec.pools if p.hosts or p.labels]
        if pinned_pools:
            raise EngineError(f"{where}: field 'pools': pool(s) {', '.join(pinned_pools)} name hosts or labels: "
                              "on a Slurm cluster Slurm chooses the nodes of the job's one allocation "
                              "(docs/slurm.md); leave the pools unpinned or pin the job with `hosts`")
        if spec.hosts:  # pinned: Slurm gives exactly their nodes (--nodelist)
            nodes = self.slurm_nodes(spec.hosts)
            missing = [h for h, n in nodes.items() if n is None]
            if missing:
                raise EngineError(f"{where}: field 'hosts': {', '.join(missing)}: no Slurm node is this host "
                                  "(scontrol show nodes lists none by its name, hostname or address)")
        checked = check_spec(self._exec, inv)  # login, partition (account, qos where Slurm can say)
        if checked.errors:
            raise EngineError("; ".join(checked.errors))
        partition = dict(spec.slurm).get("partition")
        if partition and partition != (inv.slurm.partition if inv.slurm else None):
            out = self._run(["scontrol", "-o", "show", "partition", partition])
            said = " ".join(str(out.get("stderr") or out.get("error") or out.get("stdout") or "").split())
            if out.get("exit_code") != 0 or not str(out.get("stdout") or "").startswith("PartitionName="):
                raise EngineError(f"{where}: [slurm] partition {partition!r}: Slurm has no such partition: "
                                  f"{said or 'scontrol show partition does not list it'}")

    def options(self, job_id: str, spec: JobSpec, exclude: Sequence[str] = (),
                shape: tuple[int, int] | None = None) -> list[str]:
        """sbatch's options: the spec's ``[slurm]`` values over the inventory's, and the Slurm
        nodes to ``exclude`` (``--exclude``). ``shape``: a pool job's nodes and GPUs per node
        (``pool_shape``), over the spec's."""
        base = self.jm.ctl.inventory.slurm
        mine = dict(spec.slurm)

        def pick(name: str) -> str | None:
            return mine.get(name) or (getattr(base, name, None) if base is not None else None)
        pinned = [n for n in self.slurm_nodes(spec.hosts).values() if n] if spec.hosts else []
        if set(pinned) & set(exclude):
            raise EngineError(f"{spec.path or 'job spec'}: field 'hosts': Slurm node(s) "
                              f"{', '.join(sorted(set(pinned) & set(exclude)))} of the hosts it names are drained "
                              "or out of reach: the job cannot run on exactly its hosts")
        nodes, gpus = shape if shape is not None else (len(spec.hosts) or spec.node_count, spec.gpus_per_node)
        return sbatch_options(
            job_id, nodes=nodes, gpus_per_node=gpus,
            runtime_s=spec.max_runtime_s + spec.grace_s + SLURM_MARGIN_S, partition=pick("partition"),
            account=pick("account"), qos=pick("qos"), constraint=pick("constraint"), exclude=exclude,
            nodelist=pinned)

    def _nodes(self) -> Any:
        """Slurm's nodes as ``node_index`` finds them (``scontrol show nodes`` on the login), read
        once in a ``place`` (its checks, its options, its templates and its allocation's hosts ask
        alike), else each time."""
        find = getattr(self._one_read, "find", None)
        if find is not None:
            return find
        try:
            find = node_index(read_nodes(self._exec, self.jm.ctl.inventory))
        except SlurmReadError as e:
            raise EngineError(str(e)) from None
        if getattr(self._one_read, "placing", False):
            self._one_read.find = find
        return find

    def slurm_nodes(self, hosts: Sequence[str]) -> dict[str, str | None]:
        """Inventory host -> the name of its Slurm node (by name, hostname or address; None: none)."""
        inv = self.jm.ctl.inventory
        find = self._nodes()
        out: dict[str, str | None] = {}
        for h in hosts:
            node = find(h, inv.get(h).address) if h in inv.names else None
            out[h] = node.name if node is not None else None
        return out

    def excluded(self, lost: Sequence[str] = ()) -> list[str]:
        """The Slurm nodes an attempt must not run on: those of hosts rigdeck drains (a GPU's drain
        or the host's: Slurm gives whole nodes; where Slurm could not be told of the drain, this
        keeps the job off the node all the same) and of ``lost`` hosts (out of rigdeck's reach,
        which Slurm may not have noticed yet). A node drained in Slurm needs no ``--exclude``:
        Slurm places no job there."""
        hosts = set(lost) | {str(d["host"]) for d in self.jm.history.drains()}
        inv = self.jm.ctl.inventory
        hosts &= set(inv.names)
        if not hosts:
            return []
        return [n for n in self.slurm_nodes(sorted(hosts)).values() if n is not None]

    def _retire(self, job_id: str) -> None:
        """Before a restart's sbatch: the previous attempt's Slurm job ended (its job hosts were
        stopped, so its step ends by itself; ``scancel`` where Slurm still runs it, not when it
        is completing), and what Slurm said of it kept in the job's events (the record's
        ``slurm`` becomes the new job's). At most FINISH_WAIT_S: Slurm's own end of it may
        take longer (KillWait), and the new job is Slurm's to place meanwhile."""
        rec = self.jm.history.get(job_id) or {}
        old = dict(rec.get("slurm") or {})
        sid = str(old.get("job_id") or "")
        if not sid:
            return
        state, cancelled = str(old.get("state") or ""), False
        deadline = time.monotonic() + FINISH_WAIT_S
        while True:
            try:
                detail = self.detail(sid)
            except EngineError:
                break
            if detail is None:
                state = state if state in ENDED_STATES else "gone"
                break
            state = detail.state
            if detail.ended:
                break
            if not cancelled and state != "COMPLETING":  # (completing: its processes are ending)
                self._cancel(sid)
                cancelled = True
            if time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
        self.jm.history.add_event(job_id, {"event": "slurm job ended", "slurm_job_id": sid, "state": state,
                                           "cancelled": cancelled, "nodes": list(old.get("nodes") or [])})

    def place(self, job_id: str, spec: JobSpec, *, capacity: Any = None,
              exclude: Sequence[str] | None = None, prefer: Sequence[str] = ()) -> Placement:
        # (Slurm chooses the nodes: ``prefer`` is not passed on)
        self._one_read.placing, self._one_read.find = True, None
        try:
            return self._place(job_id, spec, capacity=capacity, exclude=exclude)
        finally:
            self._one_read.placing, self._one_read.find = False, None

    def _place(self, job_id: str, spec: JobSpec, *, capacity: Any = None,
               exclude: Sequence[str] | None = None) -> Placement:
        # Every host Slurm may choose has its agent (deployed, connected) before the job can run
        # there: a node's task of the step starts the agent's zipapp, which must be in place. The
        # hosts are read (linked, sampled) while the spec is checked with Slurm and the previous
        # attempt retired: one wait for both, not one after the other.
        # (Slurm places the job: its claims on the hosts are not asked for again.)
        read = self._read_soon(list(self.jm.ctl.inventory.names)) if capacity is None else None
        self._checked(spec)
        if exclude is not None:  # a restart: the previous attempt's Slurm job is done first
            self._retire(job_id)
        excluded = self.excluded(exclude or ())
        shape = None
        if spec.pools:  # the allocation's shape is rigdeck's packing of the replicas
            capacity = read.result() if read is not None else capacity
            read = None
            shape = self.pool_shape(spec, capacity, excluded)
        options = self.options(job_id, spec, excluded, shape)
        login = self.login
        if read is not None:
            capacity = read.result()
        # A new job whose plan a template can describe is left to its nodes (the module's doc).
        key = secrets.token_hex(8) if (exclude is None and self_starts(spec) is None
                                       and self.jm.history.get(job_id) is None) else None
        agent = self._write_templates(job_id, spec, capacity, excluded, key) if key is not None else None
        try:
            got = self.jm.ctl.agent(login).slurm_submit(job_id=job_id, options=options, template=key, agent=agent,
                                                        timeout=90)
        except TransportError as e:
            raise EngineError(f"job not submitted to Slurm: {login}: {e}") from None
        sid = got.get("slurm_job_id")
        if not sid:
            said = " ".join(str(got.get("stderr") or got.get("stdout") or "").split())
            said = said or f"exit {got.get('exit_code')}"
            raise EngineError(f"Slurm refused the job (sbatch on {login}: {said})")
        self._submitted[job_id] = {"job_id": str(sid), "login": login, "state": "PENDING",
                                   "options": options, "excluded": excluded, "submitted": time.time()}
        if key is not None:
            self._submitted[job_id]["nodes_start"] = True
            raise Queued(str(sid))
        try:
            detail = self._allocation(str(sid))
            placement = self._placement(spec, detail, capacity)
        except BaseException:
            self._cancel(str(sid))
            self._submitted.pop(job_id, None)
            raise
        self._submitted[job_id].update(state=detail.state, nodes=list(detail.nodes))
        return placement

    def _read_soon(self, hosts: list[str]) -> Future[Any]:
        """The hosts' capacity (Slurm not asked: it places the job), read on a thread of its own."""
        read: Future[Any] = Future()

        def run() -> None:
            try:
                read.set_result(self.jm.capacity(hosts, slurm=False))
            except BaseException as e:
                read.set_exception(e)
        threading.Thread(target=run, name="slurm-capacity", daemon=True).start()
        return read

    def _allocation(self, sid: str) -> SlurmJobDetail:
        """Until Slurm runs job ``sid`` (its nodes and GPUs known), or it ends, or the wait is over."""
        deadline = time.monotonic() + ALLOCATION_WAIT_S
        while True:
            detail = self.detail(sid)
            if detail is None or detail.ended:
                why = f"{detail.state}" + (f" ({detail.reason})" if detail.reason else "") if detail else "gone"
                raise EngineError(f"Slurm job {sid} ended before it ran: {why}")
            if detail.state == "RUNNING" and detail.nodes:
                return detail
            if time.monotonic() > deadline:
                raise EngineError(f"Slurm job {sid} still {detail.state} after {ALLOCATION_WAIT_S:.0f} s"
                                  + (f" ({detail.reason})" if detail.reason else "") + ": cancelled")
            # Quickly while Slurm is likely to start it at once (the ranks wait for the plan
            # this read leads to), then at the usual pace for a job that queues.
            waited = time.monotonic() - (deadline - ALLOCATION_WAIT_S)
            time.sleep(ALLOCATION_POLL_S if waited < ALLOCATION_QUICK_S else POLL_S)

    def _hosts_of(self, nodes: Sequence[str]) -> dict[str, str]:
        """Slurm node -> inventory host (by the node's name, hostname or address)."""
        inv = self.jm.ctl.inventory
        find = self._nodes()
        out: dict[str, str] = {}
        for h in inv.hosts:
            node = find(h.name, h.address)
            if node is not None:
                out[node.name] = h.name
        missing = [n for n in nodes if n not in out]
        if missing:
            raise EngineError(f"Slurm allocated node(s) {', '.join(missing)}, which are no inventory host "
                              f"({', '.join(inv.names)}): add them to the inventory")
        return out

    def _candidates(self, spec: JobSpec, capacity: Any, excluded: Sequence[str]) -> dict[str, str]:
        """Slurm node -> inventory host, for each node the job may get: every inventory host that
        is a Slurm node and was read, less ``excluded``; only the spec's ``hosts`` when it names them."""
        caps = {c.name for c in capacity or []}
        return {node: h for h, node in self.slurm_nodes(self.jm.ctl.inventory.names).items()
                if node is not None and node not in excluded and h in caps and (not spec.hosts or h in spec.hosts)}

    def pool_shape(self, spec: JobSpec, capacity: Any, excluded: Sequence[str] = ()) -> tuple[int, int]:
        """A pool job's one Slurm allocation, as (nodes, GPUs per node): rigdeck's own packing of
        its replicas (tui/model/scheduler.py) on the Slurm nodes it may run on, each taken as
        idle (Slurm decides which are free), gives how many nodes it spreads over; every node
        of one Slurm job gets the same GPUs, the most any node of that packing uses. Once Slurm
        allocates, the same packing on the nodes and GPUs it gave places the replicas
        (``_placement``)."""
        hosts = set(self._candidates(spec, capacity, excluded).values())
        idle = [_as_idle(c) for c in capacity or [] if c.name in hosts]
        try:
            packed = Scheduler().reserve("\0shape", spec, idle)
        except PlacementError as e:
            raise EngineError(f"{spec.path or 'job spec'}: the pools do not fit the Slurm nodes rigdeck may use, "
                              f"even idle: {e}") from None
        gpus: dict[str, int] = {}
        for n in packed.nodes:
            gpus[n.host] = gpus.get(n.host, 0) + len(n.gpus)
        return len(gpus), max(gpus.values())

    def _pool_placement(self, spec: JobSpec, detail: SlurmJobDetail, hosts: Mapping[str, str],
                        caps: Mapping[str, Any]) -> Placement:
        """A pool job's replicas packed as rigdeck packs them, on the nodes and GPUs Slurm gave
        (a GPU rigdeck knows is failing left out); every node gets a replica (each node's task
        waits for its plan), else an EngineError."""
        given = []
        for n in detail.nodes:
            cap, gpus = caps[hosts[n]], tuple(detail.gpus.get(n, ()))
            given.append(_as_idle(cap, up=True, status=None, gpus=gpus,
                                  unusable=tuple(u for u in cap.unusable if u[0] in gpus)))
        try:
            placement = Scheduler().reserve(str(detail.job_id), spec, given)
        except PlacementError as e:
            raise EngineError(f"Slurm job {detail.job_id}'s allocation ({', '.join(detail.nodes)}) "
                              f"does not hold the pools: {e}") from None
        idle = [n for n in detail.nodes if hosts[n] not in placement.hosts]
        if idle:
            raise EngineError(f"Slurm job {detail.job_id}: no replica packs onto node(s) {', '.join(idle)} "
                              "of its allocation")
        return placement

    def _placement(self, spec: JobSpec, detail: SlurmJobDetail, capacity: Any) -> Placement:
        """The placement of Slurm's allocation: its nodes in Slurm's order (the first is the
        primary), each with the GPUs Slurm gave; the rest (address, CPUs, simulated) as read of
        the hosts before the job was submitted. A pool job's replicas: ``_pool_placement``."""
        hosts = self._hosts_of(detail.nodes)
        caps = {c.name: c for c in capacity}
        missing = [n for n in detail.nodes if hosts[n] not in caps]
        if missing:
            raise PlacementError(f"{', '.join(hosts[n] for n in missing)} (Slurm node(s) {', '.join(missing)}): "
                                 "no capacity read")
        if spec.pools:
            return self._pool_placement(spec, detail, hosts, caps)
        nodes = []
        for n in detail.nodes:
            cap = caps[hosts[n]]
            gpus = tuple(detail.gpus.get(n, ()))
            if spec.gpus_per_node and len(gpus) != spec.gpus_per_node:
                raise EngineError(f"Slurm job {detail.job_id} holds GPUs {list(gpus)} on {n}, "
                                  f"not the {spec.gpus_per_node} asked for")
            nodes.append(NodeAssignment(host=hosts[n], address=cap.address, slots=spec.slots_per_node,
                                        gpus=gpus, cpus=cap.cpus, instance_type=instance_type(cap),
                                        simulated=cap.simulated))
        return Placement(tuple(nodes))

    def start(self, job_id: str, spec: JobSpec, placement: Placement, restart_count: int) -> None:
        slurm = self._submitted.get(job_id) or dict((self.jm.history.get(job_id) or {}).get("slurm") or {})
        sid = str(slurm.get("job_id") or "")
        try:
            self.jm._start(job_id, spec, placement, restart_count=restart_count,
                           plan_extra={"slurm": {"job_id": sid}})
        except BaseException:
            self._cancel(sid)
            raise
        finally:
            self._submitted.pop(job_id, None)

    def _write_templates(self, job_id: str, spec: JobSpec, capacity: Any, excluded: Sequence[str],
                         key: str) -> list[str] | None:
        """Before the job is submitted: a template of its plan, named ``key``, on every node Slurm
        may run it on (each inventory host that is a Slurm node, less ``excluded``; only the
        spec's ``hosts`` when it names them; the job's code pushed there first), so that those
        Slurm gives it make their plans of it when Slurm runs it. All nodes or an EngineError.
        Where the nodes' agents start job hosts from (their unpacked copy) when all said the
        same place, else None."""
        caps = {c.name: c for c in capacity or []}
        hosts = self._candidates(spec, capacity, excluded)  # Slurm node -> inventory host
        if not hosts:
            raise EngineError("no inventory host is a Slurm node the job may run on")
        base = self.jm.plan_base(job_id, spec, 0)
        workdirs = self.jm._push_code(job_id, spec, list(hosts.values())) if spec.code is not None else {}
        nodes = {n: NodeAssignment(host=h, address=caps[h].address, slots=spec.slots_per_node, gpus=(),
                                   cpus=caps[h].cpus, instance_type=instance_type(caps[h]),
                                   simulated=caps[h].simulated) for n, h in hosts.items()}
        parts: dict[str, Any] = {}
        for n, h in hosts.items():
            peers = [nodes[m] for m in nodes if m != n][:1]  # the route another node would take to it
            part: dict[str, Any] = {
                "node": {k: v for k, v in nodes[n].to_plan().items() if k != "gpus"},
                "master_addr": self.jm._master_addr(nodes[n], peers),
                "command": self.jm.host_command(spec.command, h, spec.container is not None),
                "env": self.jm.host_env(h, base)}
            if h in workdirs:
                part["workdir"] = workdirs[h]
            parts[n] = part
        said = self.jm.ctl.agents(list(hosts.values())).slurm_template(
            key=key, template={"base": base, "hosts": parts}, timeout=30)
        failed = {h: r for h, r in said.items() if isinstance(r, Exception)}
        if failed:
            raise EngineError("the job's plan not left on every node Slurm may run it on: "
                              + "; ".join(f"{h}: {e}" for h, e in sorted(failed.items())))
        places = set()
        for r in said.values():
            a = r.get("agent") if isinstance(r, dict) else None
            places.add(tuple(a) if isinstance(a, list) and all(isinstance(x, str) for x in a) else None)
        one = places.pop() if len(places) == 1 else None
        return list(one) if one else None

    def forget(self, job_id: str) -> None:
        """What was kept of the job's submission, once it is recorded."""
        self._submitted.pop(job_id, None)

    def allocated(self, rec: Mapping[str, Any]) -> dict[str, Any]:
        """A job left to its nodes (``Queued``) as Slurm and its nodes have it now: once Slurm ran it
        and its primary node made its plan, that plan's placement recorded (``starting``: the
        hosts' own start and end are then seen as any other's); ended before any node made one,
        failed with what Slurm said; still queued, Slurm's state and reason kept. The record then."""
        from tui.model.jobstate import FAILED, STARTING

        job_id = str(rec["job_id"])
        slurm = dict(rec.get("slurm") or {})
        sid = str(slurm.get("job_id") or "")
        try:
            detail = self.detail(sid)
        except EngineError:
            return dict(rec)
        if detail is not None and detail.nodes and (detail.state == "RUNNING" or detail.ended):
            try:
                primary = self._hosts_of(detail.nodes[:1])[detail.nodes[0]]
            except EngineError:
                primary = ""
            nodes = self._planned(rec, primary) if primary else None
            if nodes:
                slurm.update(state=detail.state, reason=detail.reason, nodes=list(detail.nodes))
                self.jm.history.update(job_id, state=STARTING, placement=nodes, slurm=slurm)
                return self.jm.record(job_id)
        if detail is None or detail.ended:
            why = (detail.state + (f" ({detail.reason})" if detail.reason else "")) if detail else "gone from Slurm"
            slurm.update(state=detail.state if detail else slurm.get("state"), gone=detail is None)
            self.jm.history.update(job_id, state=FAILED, ended=time.time(), slurm=slurm,
                                   cause={"message": f"Slurm job {sid} ended before its nodes started it: {why}"})
        elif (detail.state, detail.reason) != (slurm.get("state"), slurm.get("reason")):
            slurm.update(state=detail.state, reason=detail.reason)
            self.jm.history.update(job_id, slurm=slurm)
        return self.jm.record(job_id)

    def _planned(self, rec: Mapping[str, Any], host: str) -> list[dict[str, Any]] | None:
        """The placement the job's plan on ``host`` has (its node made it of Slurm's allocation),
        or None: no plan there yet, or the host out of reach."""
        try:
            jobs = self.jm.ctl_for(rec.get("user")).agent(host).job_list(timeout=20)
        except TransportError:
            return None
        for j in jobs:
            if j.get("job_id") == rec["job_id"] and j.get("nodes"):
                return [dict(n) for n in j.get("nodes") or []]
        return None

    def release(self, job_id: str) -> None:
        got = self._submitted.pop(job_id, None)
        if got:
            self._cancel(got["job_id"])

    def record(self, job_id: str) -> dict[str, Any]:
        got = self._submitted.get(job_id)
        return {"slurm": {k: v for k, v in got.items() if k != "options"}} if got else {}

    def _cancel(self, sid: str) -> dict[str, Any]:
        if not sid:
            return {}
        try:
            return self._run(["scancel", sid])
        except EngineError as e:
            return {"exit_code": None, "stderr": str(e)}

    def stop(self, rec: Mapping[str, Any]) -> None:
        """``scancel`` the job's Slurm job (its step's processes get Slurm's SIGTERM, then SIGKILL
        after KillWait), and record what Slurm then says of it."""
        slurm = dict(rec.get("slurm") or {})
        sid = str(slurm.get("job_id") or "")
        if not sid:
            return
        said = self._cancel(sid)
        slurm["cancelled"] = time.time()
        if said.get("exit_code") not in (0, None) or said.get("stderr"):
            slurm["scancel"] = " ".join(str(said.get("stderr") or "").split())
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                detail = self.detail(sid)
            except EngineError:
                break
            if detail is None:
                slurm["gone"] = True
                break
            slurm["state"] = detail.state
            if detail.ended:
                break
            time.sleep(POLL_S)
        self.jm.history.update(str(rec["job_id"]), slurm=slurm)

    def finish(self, rec: Mapping[str, Any]) -> None:
        """Slurm's end of the job kept in its record: its step ends as the job hosts exit, then
        its batch script; what Slurm says within FINISH_WAIT_S (a job Slurm has already
        forgotten, past its MinJobAge, keeps the last state read)."""
        slurm = dict(rec.get("slurm") or {})
        sid = str(slurm.get("job_id") or "")
        if not sid or slurm.get("state") in ENDED_STATES:
            return
        deadline = time.monotonic() + FINISH_WAIT_S
        while time.monotonic() < deadline:
            try:
                detail = self.detail(sid)
            except EngineError:
                return
            if detail is None:
                slurm["gone"] = True
                break
            slurm.update(state=detail.state, reason=detail.reason)
            if detail.ended:
                break
            time.sleep(POLL_S)
        self.jm.history.update(str(rec["job_id"]), slurm=slurm)

    def checked(self, rec: Mapping[str, Any], states: dict[str, Any]) -> dict[str, Any]:
        """A node whose job host has not started (``starting``, no pid) while Slurm's job has
        ended, or runs no more: its task in the step is gone (it could not start the agent, the
        job was cancelled in Slurm), and the job failed there with what Slurm's output says."""
        waiting = [h for h, s in states.items() if isinstance(s, dict) and s.get("state") == "starting"
                   and not s.get("jobhost_pid") and s.get("slurm")]
        sid = str((rec.get("slurm") or {}).get("job_id") or "")
        if not waiting or not sid:
            return states
        started = max((float(s.get("started") or 0) for h, s in states.items() if h in waiting), default=0.0)
        if time.time() - started < STEP_START_S:
            return states
        try:
            detail = self.detail(sid)
        except EngineError:
            return states
        late = time.time() - started > STEP_LOST_S
        if detail is not None and not detail.ended and not late:
            return states
        said = "gone from Slurm" if detail is None else detail.state + (f" ({detail.reason})" if detail.reason else "")
        if detail is not None and not detail.ended:
            said += f" for {STEP_LOST_S:.0f} s"
        out = dict(states)
        for h in waiting:
            out[h] = {**states[h], "state": "failed", "cause": {
                "host": h, "rank": None, "message": f"Slurm job {sid} {said}: its task on {h} never started "
                f"rigdeck's job host (Slurm's output: .slurm-{sid}.out in the login host's job directory)"}}
        return out

    # -- drains: rigdeck's kept in Slurm too ---------------------------------------------------

    def _node(self, host: str) -> Any:
        """The Slurm node of inventory host ``host`` (a SlurmNode), or an EngineError."""
        inv = self.jm.ctl.inventory
        try:
            nodes = read_nodes(self._exec, inv)
        except SlurmReadError as e:
            raise EngineError(str(e)) from None
        spec = inv.get(host)
        node = node_index(nodes)(spec.name, spec.address)
        if node is None:
            raise EngineError(f"{host}: Slurm has no node of this host")
        return node

    def drain(self, host: str, gpu: int | None, reason: str) -> str:
        """Drain ``host``'s node in Slurm (Slurm drains whole nodes: a GPU's drain drains its
        node), its reason ``rigdeck: HOST GPU N REASON``: Slurm places no job there either. A node
        someone else drained keeps their drain and reason. The reason in force."""
        node = self._node(host)
        if node.drained and not (node.reason or "").startswith("rigdeck:"):
            return str(node.reason or "")  # drained already by someone else: theirs is kept
        text = " ".join(p for p in ("rigdeck:", host, f"GPU {gpu}" if gpu is not None else "", reason) if p)
        out = self._run(["scontrol", "update", f"NodeName={node.name}", "State=DRAIN", f"Reason={text}"])
        if out.get("exit_code") != 0:
            said = " ".join(str(out.get("stderr") or out.get("error") or "").split())
            raise EngineError(f"{host}: Slurm did not drain node {node.name}: {said}")
        return text

    def resume(self, host: str) -> bool:
        """Resume ``host``'s node in Slurm when rigdeck drained it (its reason starts ``rigdeck:``;
        another's drain is left as it is). True when resumed."""
        node = self._node(host)
        if not (node.drained and (node.reason or "").startswith("rigdeck:")):
            return False
        out = self._run(["scontrol", "update", f"NodeName={node.name}", "State=RESUME"])
        if out.get("exit_code") != 0:
            said = " ".join(str(out.get("stderr") or out.get("error") or "").split())
            raise EngineError(f"{host}: Slurm did not resume node {node.name}: {said}")
        return True

    def about(self, rec: Mapping[str, Any], live: bool) -> dict[str, Any] | None:
        slurm = dict(rec.get("slurm") or {})
        if not slurm.get("job_id"):
            return None
        if live:
            try:
                detail = self.detail(str(slurm["job_id"]))
            except (EngineError, SlurmReadError):
                detail = None
            if detail is not None:
                slurm.update(state=detail.state, reason=detail.reason)
                if detail.state != (rec.get("slurm") or {}).get("state"):
                    self.jm.history.update(str(rec["job_id"]), slurm={**(rec.get("slurm") or {}),
                                                                       "state": detail.state})
            elif slurm.get("state") not in ENDED_STATES and not slurm.get("gone"):
                slurm["gone"] = True  # ended, and past Slurm's MinJobAge: how, Slurm no longer says
                self.jm.history.update(str(rec["job_id"]), slurm=slurm)
        return slurm
