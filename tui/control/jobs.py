"""Jobs across hosts, from the controller: place, start, supervise, stop, and read logs and metrics.

The hosts own running jobs (each agent keeps a job host process per job); the controller places
them, starts them everywhere, and, while it runs, acts as the gang's supervisor: the first failed
host stops the others and, when restarts remain, the whole gang starts again. Every controller
that looks at a job (``status``, ``jobs``, ``launch --wait``, the app) applies the same rule, so a
failure seen late is still handled.
"""

from __future__ import annotations

import builtins
import copy
import dataclasses
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Any

from agent.roles import program_source
from runtime.checkpoint import RESUME_BEFORE_ENV  # the contract with the ranks' checkpointer
from tui.control import pools
from tui.control.engines import (
    ALLOCATION_QUICK_S,
    LOOK_POLL_S,
    Engine,
    EngineError,
    OwnHosts,
    Queued,
    SlurmEngine,
)
from tui.control.healing import (
    Fault,
    Healer,
    adopted,
    gpu_moved,
    host_heals,
    moved_placement,
    stack_summary,
    with_reruns,
)
from tui.control.history import History, JobRef, JobRefError
from tui.control.hostlinks import HostLinks
from tui.control.reader import JobReader, LineJoiner, last_loss, log_ranks
from tui.control.tensorboard import pull as tensorboard_pull
from tui.model import usage
from tui.model.fairshare import preempt_pending
from tui.model.health import CONTAINER, Goodput, Incident, failure_kind, first_started, goodput, heals_on_host
from tui.model.identity import local_user
from tui.model.jobspec import EnvFileError, JobSpec, read_env_file
from tui.model.jobstate import (
    FAILED,
    PENDING,
    QUEUED,
    RUNNING,
    STARTING,
    STOPPED,
    STOPPING,
    SUCCEEDED,
    TERMINAL,
    UNKNOWN,
)
from tui.model.jobview import JobView, Progress, job_view
from tui.model.mpspec import ENV_VAR as MP_ENV_VAR
from tui.model.poolspec import check_pins
from tui.model.scheduler import (
    HostCapacity,
    NodeAssignment,
    Placement,
    PlacementError,
    Scheduler,
    capacity_from_state,
)
from tui.model.state import ClusterState, HostStatus
from tui.model.tbsync import parse_have
from tui.remote.transport import TransportError

log = logging.getLogger(__name__)

POLL_S = 0.5
STOP_POLL_S = 0.1  # how often a restart asks whether the stopped attempt has ended on every host
LEASE_S = 60.0  # how long a supervising controller's claim on a job lasts without renewal
GC_EVERY_S = 60.0  # a controller that starts many jobs applies retention on a host at most this often


class JobError(Exception):
    """A job request that cannot be carried out; the message says why."""


class AmbiguousJobError(JobError):
    """A stop by a name that several jobs share, not confirmed; ``job_ids`` are theirs, newest
    first."""

    def __init__(self, message: str, job_ids: tuple[str, ...]):
        super().__init__(message)
        self.job_ids = job_ids


def new_job_id(name: str) -> str:
    return f"{name}-{time.strftime('%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def overall_state(host_states: dict[str, dict[str, Any] | TransportError]) -> str:
    """The job's state from what its hosts say. A failure anywhere is a failure; otherwise, while
    any host cannot be reached the state is ``unknown`` (never guessed, never recorded)."""
    states = [s.get("state") for s in host_states.values() if isinstance(s, dict)]
    # A pool job: the primary's success is the job's, as Vertex's primary replica decides its
    # job's state; a worker that errors once its peer has gone (a collective cut short), or a
    # host out of reach, does not undo it.
    if pools.primary_succeeded(host_states):
        return SUCCEEDED
    if any(s == FAILED for s in states):
        return FAILED
    if len(states) < len(host_states):
        return UNKNOWN
    if states and all(s in TERMINAL for s in states):
        if all(s == SUCCEEDED for s in states):
            return SUCCEEDED
        return STOPPED
    if any(s == STOPPING for s in states):
        return STOPPING
    if any(s == STARTING for s in states) or not states:
        return STARTING
    return RUNNING


def left_behind(host_states: Mapping[str, Any]) -> dict[str, str]:
    """What each host still has of a job that is stopping or has ended: host -> what is left
    (its processes, the GPUs it still holds claimed, or why that cannot be known yet). Empty
    when every host is done with it: then its GPUs are free for the next job."""
    out: dict[str, str] = {}
    for host, st in host_states.items():
        if not isinstance(st, dict):
            out[host] = f"unreachable ({st})"
            continue
        if st.get("state") not in TERMINAL:
            out[host] = f"still {st.get('state')}"
            continue
        parts = []
        n = int(st.get("tagged_processes") or 0)
        if n:
            parts.append(f"{n} process{'es' if n != 1 else ''} left")
        held = st.get("claims_held", [])  # an agent older than the key: its processes are the claim
        if held is None:
            parts.append("GPU claims not read yet")
        elif held:
            parts.append(f"GPU {','.join(map(str, held))} still claimed")
        if parts:
            out[host] = ", ".join(parts)
    return out


def unreachable(host_states: dict[str, Any]) -> list[str]:
    return [h for h, s in host_states.items() if not isinstance(s, dict)]


def not_yet_told(rec: Mapping[str, Any], host_states: dict[str, Any]) -> dict[str, Any]:
    """``host_states`` with a host that has no such job yet read as ``starting`` while the job is
    being started (``pending`` or ``starting``: a launch, or the queue's poller in another
    process, is still telling its hosts), instead of as a host out of reach."""
    if rec.get("state") not in (PENDING, STARTING):
        return host_states
    told = f"no job {rec.get('job_id')} on this host"
    return {h: {"state": STARTING} if not isinstance(s, dict) and told in str(s) else s
            for h, s in host_states.items()}


SILENT_S = 2.0  # a host silent this long in a look while every other host says its ranks wait asleep: out of reach
REASK_S = 0.5  # while one host keeps a look waiting, those that answered are asked again this often


def _states_until_stalled(ask: Callable[[str], Any], hosts: Sequence[str]) -> dict[str, Any]:
    """Each host's ``job_status`` (``ask``), asked at once: every answer, or each host's
    TransportError, as a look waits for them (a host on a cut link, to its own 20 s timeout).
    Except where the job waits for the silent ones: while a host keeps the look waiting, those
    that answered are asked again every ``REASK_S`` (a peer lost mid-collective leaves their ranks
    asleep within seconds), and once each of them says its ranks wait asleep with no step
    (``idle``: agent/jobhost.py says it at part of the quiet timeout) while the silent hosts have
    kept this look waiting ``SILENT_S``, those count as out of reach for this look (their requests
    go on, and end, on their own threads)."""
    pool = ThreadPoolExecutor(max_workers=2 * len(hosts), thread_name_prefix="job-status")
    asked = time.monotonic()
    asking = {pool.submit(ask, h): h for h in hosts}
    got: dict[str, Any] = {}
    silent = set(hosts)  # not answered yet in this look
    try:
        while silent:
            left = REASK_S
            if got and all(isinstance(v, dict) and isinstance(v.get("idle"), dict) for v in got.values()):
                left = min(left, asked + SILENT_S - time.monotonic())
                if left <= 0:
                    break
            done, _ = wait(set(asking), timeout=left, return_when=FIRST_COMPLETED)
            for f in done:
                h = asking.pop(f)
                got[h] = f.result()
                silent.discard(h)
            if silent and got and not done:  # a host keeps the look waiting: those that answered, again
                busy = set(asking.values())
                for h in got:
                    if h not in busy:
                        asking[pool.submit(ask, h)] = h
    finally:
        pool.shutdown(wait=False)
    for h in silent:
        got[h] = TransportError(h, f"no answer in {time.monotonic() - asked:.1f} s while every other host said "
                                   "its ranks wait asleep")
    return {h: got[h] for h in hosts}


def this_attempt(rec: Mapping[str, Any], host_states: dict[str, Any]) -> dict[str, Any]:
    """``host_states`` with a host that still reports an earlier attempt of the job read as
    ``starting`` while the job is being started (``pending`` or ``starting``). A job restarted
    or resumed (a preempted job back from the queue) keeps its id: until this attempt's start
    reaches a host, that host still says how the attempt before ended (``stopped``, ``failed``),
    and that end is not this attempt's. Taken for it, a look during the start (another thread's,
    another controller's) would requeue, restart or end the job again while it starts."""
    if rec.get("state") not in (PENDING, STARTING):
        return host_states
    attempt = int(rec.get("restarts") or 0)
    return {h: {"state": STARTING} if isinstance(s, dict) and s.get("restart_count") is not None
            and int(s["restart_count"]) < attempt else s for h, s in host_states.items()}


def last_hosts(rec: Mapping[str, Any]) -> list[str]:
    """The hosts the job's newest attempt was started on (its last ``started`` event)."""
    started = [e for e in rec.get("events") or () if e.get("event") == "started"]
    return [str(h) for h in started[-1].get("hosts") or ()] if started else []


def first_cause(host_states: dict[str, Any]) -> dict[str, Any] | None:
    causes = []
    for host, st in host_states.items():
        if isinstance(st, dict) and st.get("state") == FAILED and st.get("cause"):
            c = dict(st["cause"])
            c.setdefault("host", host)
            causes.append((st.get("ended") or 0, c))
    if not causes:
        return None
    # A rank that failed by itself beats ranks that died because of it: prefer causes naming a
    # rank with an exit code or signal, then a rank whose container lost its GPUs (its peers'
    # collectives broke as it died), then the earliest.
    causes.sort(key=lambda ec: (ec[1].get("rank") is None, failure_kind(ec[1]) != CONTAINER, ec[0]))
    return causes[0][1]


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def stop_cause(host_states: dict[str, Any]) -> dict[str, Any] | None:
    """Why a job's hosts stopped it (``max_runtime of 7200s exceeded``, ...), from the first
    host that says so."""
    for host, st in host_states.items():
        if isinstance(st, dict) and st.get("state") == STOPPED and (st.get("cause") or {}).get("message"):
            return {**st["cause"], "host": st["cause"].get("host") or host}
    return None


def restarts_used(rec: Mapping[str, Any]) -> int:
    """Gang restarts counted against ``max_restarts``: every attempt after the first but those
    that resumed a preempted job."""
    return max(0, int(rec.get("restarts") or 0) - int(rec.get("preempted") or 0))


def hangs_on_host(rec: Mapping[str, Any]) -> bool:
    """Whether the job's host restarts it after a hang it judged (``heals_on_host``, a restart
    left, ``on_hang = "restart"``): then the hang is none of the controller's to act on."""
    spec = rec.get("spec") or {}
    if not heals_on_host(spec, len({n["host"] for n in rec.get("placement") or []}), bool(rec.get("slurm"))):
        return False
    health = spec.get("health") or {}
    restart = spec.get("restart") or {}
    return health.get("on_hang", "restart") == "restart" and restarts_used(rec) < int(restart.get("max_restarts") or 0)


def gpus_on_host(rec: Mapping[str, Any]) -> bool:
    """Whether the job's host acts first on a failed GPU of the job (``heals_on_host``, a restart
    left): it moves the ranks to a spare GPU there, or stops the job for the gang rules to move."""
    spec = rec.get("spec") or {}
    if not heals_on_host(spec, len({n["host"] for n in rec.get("placement") or []}), bool(rec.get("slurm"))):
        return False
    return restarts_used(rec) < int((spec.get("restart") or {}).get("max_restarts") or 0)


def rank_env(spec: JobSpec) -> dict[str, str]:
    """The spec's ``[env]`` and what rigdeck adds to it for every rank from the spec itself:
    ``RIGDECK_MODEL_PARALLEL`` (the parsed ``[model_parallel]`` table as JSON) for a
    pipeline-parallel job. The agent adds the rest (docs/contracts.md); ``env_from_file``'s
    values go apart (``JobManager.env_file``)."""
    env = dict(spec.env)
    if spec.model_parallel is not None:
        env[MP_ENV_VAR] = spec.model_parallel.to_env()
    return env


# Lists a processing input's source on a host (agent/listfiles.py, run with the host's Python
# through the agent's exec, the directory as its one argument): one of the server key's programs.
_LIST_FILES = program_source("listfiles.py")


class _Read:
    """One capacity read that several launches wait on."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: list[HostCapacity] = []
        self.error: BaseException | None = None


class JobManager:
    def __init__(self, controller: HostLinks, history: History | None = None):
        self.ctl = controller
        self.history = history or History()
        self.scheduler = Scheduler()
        import os
        import socket

        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.healer = Healer(self.history)
        self._gc_at: dict[str, float] = {}  # host -> when this controller last applied retention there
        self._reads: dict[tuple[tuple[str, ...], str | None, bool], _Read] = {}  # capacity reads in flight
        self._reads_lock = threading.Lock()
        # Code sync: the controller's store of snapshots, and each syncing job's progress
        # ({job_id: {host: (bytes done, bytes to send)}}) while its start waits for it.
        from tui.remote.codesync import CodeStore

        self.code_store = CodeStore(self.history.path.parent / "code")
        self.code_progress: dict[str, dict[str, tuple[int, int]]] = {}
        self.code_listeners: list[Callable[[str, str, int, int], None]] = []
        # A shared server's people who joined with accounts of their own (``rigdeck server
        # join``): person -> the controller that reaches their own agents (None: the person
        # has none, and their jobs go through ``ctl`` as before). None: nobody has.
        self.accounts: Callable[[str], HostLinks | None] | None = None
        self._base: JobManager | None = None  # the manager this one is a person's view of
        self._owner: str | None = None  # whose jobs this view handles (None: the server's ctl)
        self._views: dict[str, JobManager] = {}
        self._slurm: SlurmEngine | None = None  # made when a job goes through Slurm
        # ``env_from_file``: embedded, the values are read from the file at every start; a
        # server (``reads_env_files`` False) has them only as they came with the launch, held
        # here in memory (job id -> values) until the job's first start has taken them to its
        # hosts, which keep them in the job's directory (agent/jobfiles.py) for its restarts.
        self.reads_env_files = True
        # A shared server's rule for whose jobs may run before their owner joined with accounts
        # of their own (``Server.join_refusal``: why not, or None); None: everyone's may.
        self.join_rule: Callable[[str | None], str | None] | None = None
        self.env_values: dict[str, dict[str, str]] = {}

    # -- whose account a job runs as ------------------------------------------------------------

    def for_owner(self, user: str | None) -> JobManager:
        """The manager that handles ``user``'s jobs: this one, or (a person who joined a shared
        server with accounts of their own) the same manager (one history, scheduler, queue
        and store) whose ``ctl`` reaches that person's own agents, so that their jobs are
        placed, claimed, started, asked after and stopped as them."""
        base = self._base or self
        if base.accounts is None or not user or user == "?":
            return base
        if self._owner == user:
            return self
        ctl = base.accounts(user)
        if ctl is None:
            return base
        view = base._views.get(user)
        if view is None or view.ctl is not ctl:
            view = copy.copy(base)  # everything shared but the controller
            view.ctl, view._base, view._owner = ctl, base, user
            base._views[user] = view
        return view

    def check_joined(self, user: str | None) -> None:
        """JobError when ``user``'s job may not run before they join (``join_rule``)."""
        rule = (self._base or self).join_rule
        why = rule(user) if rule is not None else None
        if why is not None:
            raise JobError(why)

    def ctl_for(self, user: str | None) -> HostLinks:
        """The controller through which ``user``'s jobs are reached (``for_owner``)."""
        return self.for_owner(user).ctl

    def _person_hosts(self, spec: JobSpec) -> None:
        """On a person's view: a spec naming a host where they have no account recorded is
        refused, naming them and the host."""
        base = self._base
        if base is None:
            return
        mine = set(self.ctl.inventory.names)
        missing = [h for h in spec.hosts if h not in mine and h in base.ctl.inventory.names]
        if missing:
            raise JobError(
                f"{spec.path or 'job spec'}: field 'hosts': {self._owner} has no account recorded on "
                f"{', '.join(missing)} (their jobs run as their own account: run `rigdeck server join "
                f"{' '.join(missing)}` with access of their own there); they may use "
                f"{', '.join(self.ctl.inventory.names) or 'no host'}")

    # -- placement --------------------------------------------------------------------------

    def capacity(self, hosts: Sequence[str], skip: str | None = None, slurm: bool = True) -> list[HostCapacity]:
        """What every host has and has free: its latest sample plus the jobs its agent runs
        (``slurm`` false: the GPUs Slurm allocated as last read, Slurm not asked again: for a
        launch Slurm places itself).

        Launches that ask at the same time share one read (a wave of sweep trials starting at once
        asks every host once, not once per trial). Sharing is safe: a placement subtracts what this
        controller's jobs hold at the moment it is made, and the claim on each host is what settles
        a race with another controller."""
        key = (tuple(hosts), skip, slurm)
        with self._reads_lock:
            read = self._reads.get(key)
            leader = read is None
            if read is None:
                read = self._reads[key] = _Read()
        if not leader:
            read.done.wait()
            if read.error is not None:
                raise read.error
            return list(read.result)
        try:
            read.result = self._capacity(hosts, skip, slurm)
            return list(read.result)
        except BaseException as e:
            read.error = e
            raise
        finally:
            with self._reads_lock:
                self._reads.pop(key, None)
            read.done.set()

    def _capacity(self, hosts: Sequence[str], skip: str | None = None, slurm: bool = True) -> list[HostCapacity]:
        # Taken now: the stream's last sample can be a tick older than a stop that just ended,
        # and would show the stopped job's claims (a launch right after it queued for nothing).
        samples = self.ctl.agents(hosts).sample(fresh=True, slurm=slurm, timeout=30)
        job_lists = self.ctl.agents([h for h in hosts if not isinstance(samples[h], Exception)]).job_list(timeout=30)
        state = ClusterState([(s.name, s.address) for s in self.ctl.inventory.select(hosts)])
        for h, sample in samples.items():
            if isinstance(sample, dict):
                state.apply_sample(h, sample)
            elif isinstance(sample, TransportError):  # its reason goes into "waits for" and errors
                state.set_status(h, HostStatus.DOWN, sample.detail, kind=sample.kind)
        live: set[str] = set()
        for jobs in job_lists.values():
            if not isinstance(jobs, list):
                continue
            for j in jobs:
                if j.get("state") not in TERMINAL:
                    live.add(j["job_id"])
                if (j.get("state") not in TERMINAL and j.get("nodes") and j["job_id"] != skip
                        and j["job_id"] not in self.scheduler.reservations()):
                    self.scheduler.adopt(j["job_id"], Placement.from_plan_nodes(j["nodes"] or []))
        # A job adopted while its hosts were still stopping it holds nothing once they are done
        # and history says it ended: give its GPUs back (every host of it answered just now).
        answered = {h for h, jobs in job_lists.items() if isinstance(jobs, list)}
        for job_id, placement in self.scheduler.reservations().items():
            if job_id in live or not set(placement.hosts) <= answered:
                continue
            rec = self.history.get(job_id)
            if rec is not None and rec["state"] in TERMINAL:
                self.scheduler.release(job_id)
        return capacity_from_state(state.snapshot(), self.ctl.inventory, drains=self.healer.current_drains())

    def _master_addr(self, node: NodeAssignment, peers: Sequence[NodeAssignment] = ()) -> str:
        """The primary's address on the route the other hosts use to reach it (not the first of
        its sorted addresses: a ``docker0`` 172.17.x sorts before the cluster's 192.168.x).

        An IP in the inventory is that address. For a name: the address this controller's SSH
        session reached, when it is one of the host's own (not a jump host's, not a NAT's);
        else the address the primary's own route to the first other host leaves from. A job
        with no other host (one host on the local transport) rendezvouses on loopback: no peer
        needs a route to it, and the machine's other addresses can belong to interfaces that
        come and go under it (a bridge, a VPN); only a multi-host job with no route falls back
        to the first of the host's addresses.
        """
        import ipaddress

        try:
            ipaddress.ip_address(node.address)
            return node.address
        except ValueError:
            pass
        own = list(self.ctl.agent(node.host).facts().addresses)
        peer = self.ctl.peer_address(node.host)
        if peer is not None and peer in own:
            return peer
        for other in peers[:1]:
            routed = self.ctl.agent(node.host).route_source(peer=other.address)
            if routed and not ipaddress.ip_address(routed).is_loopback:
                return str(routed)
        if all(p.host == node.host for p in peers):
            return "127.0.0.1"
        if not own:
            raise JobError(f"host {node.host} reports no IP address to use as MASTER_ADDR")
        return own[0]

    def _node_ports(self, placement: Placement, master_addr: str) -> tuple[list[int], dict[str, str]]:
        """A port for every node, each free on its own host when probed (two nodes on one host
        never get the same one), and the address each host's ports were probed on (the primary's
        host: ``master_addr``; another: the address its route to the primary leaves from)."""
        primary = placement.nodes[0]
        addrs: dict[str, str] = {primary.host: master_addr}
        ports: list[int] = []
        used: dict[str, set[int]] = {}
        for node in placement.nodes:
            if node.host not in addrs:
                addrs[node.host] = self._master_addr(node, [primary])
            agent = self.ctl.agent(node.host)
            taken = used.setdefault(node.host, set())
            for _ in range(32):
                port = agent.probe_port(addr=addrs[node.host])
                if port not in taken:
                    break
            else:
                raise JobError(f"host {node.host}: no distinct free port for {node.pool} {node.replica} "
                               "after 32 probes")
            taken.add(port)
            ports.append(port)
        return ports, addrs

    def _plans(self, job_id: str, spec: JobSpec, placement: Placement, restart_count: int) -> dict[str, dict[str, Any]]:
        primary = placement.nodes[0]
        master_addr = self._master_addr(primary, placement.nodes[1:])
        ports: list[int] = []
        if spec.pools:
            ports, _addrs = self._node_ports(placement, master_addr)
            port = ports[0]
        else:
            port = self.ctl.agent(primary.host).probe_port(addr=master_addr)
        base = self.plan_base(job_id, spec, restart_count)
        base.update(nodes=placement.to_plan_nodes(), master_addr=master_addr, master_port=port)
        resolved = self.host_command
        if spec.pools:
            pools = {p.role: p for p in spec.pools}
            nodes = base["nodes"]
            for i, node in enumerate(placement.nodes):
                pool = pools[str(node.pool)]
                # Each replica's container: its pool's own, else the job's; null: on the host.
                box = spec.container_of(pool)
                nodes[i].update({"port": ports[i],
                                 "command": resolved(pool.command or spec.command, node.host, box is not None),
                                 "env": dict(pool.env), "on_failure": pool.on_failure,
                                 "container": box.to_dict() if box is not None else None})
        plans = {}
        for host in placement.hosts:
            indices = placement.on_host(host)
            plans[host] = {
                **base,
                "env": self.host_env(host, base),
                "node_index": indices[0],
                "command": (list(base["nodes"][indices[0]]["command"]) if spec.pools
                            else resolved(spec.command, host, spec.container is not None)),
            }
            if spec.pools:
                plans[host]["node_indices"] = indices
        return plans

    def host_command(self, command: Sequence[str], host: str, inside: bool) -> list[str]:
        """``command`` as ``host`` runs it: ``{python}`` its inventory python (in a container,
        the image's ``python3``, on its PATH)."""
        python = "python3" if inside else self.ctl.inventory.get(host).python
        return [python if c == "{python}" else c.replace("{python}", python) for c in command]

    def host_env(self, host: str, base: Mapping[str, Any]) -> dict[str, str]:
        """The job's environment on ``host``: the inventory's for the host, under the spec's."""
        return {**dict(self.ctl.inventory.get(host).env), **base["env"]}

    def plan_base(self, job_id: str, spec: JobSpec, restart_count: int) -> dict[str, Any]:
        """What every host's plan of this attempt holds alike, but the placement's part (nodes,
        master address and port), docs/contracts.md."""
        base: dict[str, Any] = {
            "job_id": job_id,
            "name": spec.name,
            "launcher": spec.launcher,
            "workdir": spec.workdir,
            "env": rank_env(spec),
            **({"env_file": self.env_file(job_id, spec)} if spec.env_from_file else {}),
            "hyperparameters": dict(spec.hyperparameters),
            "channels": dict(spec.channels),
            "checkpoint": {
                # {job_id} keeps one job's checkpoints (across its restarts) apart from another's.
                "dir": spec.checkpoint.dir.replace("{job_id}", job_id).replace("{name}", spec.name)
                if spec.checkpoint.dir else None,
                "owner": spec.checkpoint.owner,
            },
            "restart_count": restart_count,
            "max_runtime_s": spec.max_runtime_s,
            "grace_s": spec.grace_s,
            # the job host judges its ranks' hangs by the same rule (agent/hangrule.py)
            "health": {"hang_timeout": spec.health.hang_timeout, "startup_timeout": spec.health.startup_timeout,
                       "on_hang": spec.health.on_hang},
            "mpi": {"custom_options": list(spec.mpi_custom_options)},
            "loss_pattern": spec.loss_pattern,
            "log_max_bytes": spec.log_max_mb * (1 << 20) if spec.log_max_mb else None,
        }
        if spec.restart.max_restarts > 0 and spec.launcher == "direct" and spec.container is None and not spec.pools:
            base["standby"] = True  # the next attempt's ranks wait warm on the hosts (agent/standby.py)
        if spec.trial is not None:  # a sweep's trial: its number reaches the cloud contracts
            base["trial"] = spec.trial
            base["sweep_id"] = spec.sweep_id
        if spec.metric_definitions:
            base["metric_definitions"] = [{"name": n, "regex": r} for n, r in spec.metric_definitions]
        if spec.kind != "training" or spec.pools:
            base["kind"] = spec.kind
        if spec.container is not None and not spec.pools:
            base["container"] = spec.container.to_dict()
        return base

    def _processing(self, job_id: str, spec: JobSpec, placement: Placement,
                    workdirs: Mapping[str, str]) -> dict[str, dict[str, Any]]:
        """A processing job's ``plan["processing"]`` for each host. Each ``ShardedByKey``
        source is listed once, on the first host (its regular files, recursively, sorted by
        relative path), and the i-th file goes to the (i mod N)-th host in node order. A source
        that cannot be listed is a JobError (nothing has started yet)."""
        import hashlib
        import json
        import posixpath

        assert spec.processing is not None
        hosts = list(placement.hosts)
        first = hosts[0]
        out: dict[str, dict[str, Any]] = {h: {"inputs": [], "outputs": [{"name": n} for n in spec.processing.outputs]}
                                          for h in hosts}
        report: dict[str, Any] = {}
        for inp in spec.processing.inputs:
            def source(h: str, inp: Any = inp) -> str:
                return posixpath.normpath(posixpath.join(workdirs.get(h, spec.workdir), inp.source))

            if inp.distribution != "ShardedByKey":
                for h in hosts:
                    out[h]["inputs"].append({"name": inp.name, "source": source(h),
                                             "distribution": inp.distribution})
                report[inp.name] = {"distribution": inp.distribution}
                continue
            files = self._list_files(first, source(first), f"processing.inputs {inp.name!r}")
            digest = hashlib.sha256(json.dumps(files).encode("utf-8")).hexdigest()
            shards: dict[str, list[str]] = {h: [] for h in hosts}
            for i, f in enumerate(files):
                shards[hosts[i % len(hosts)]].append(f)
            for h in hosts:
                out[h]["inputs"].append({"name": inp.name, "source": source(h), "distribution": inp.distribution,
                                         "files": sorted(shards[h]), "total": len(files),
                                         "listing_sha256": digest})
            report[inp.name] = {"distribution": inp.distribution, "total": len(files), "listed_on": first,
                                "listing_sha256": digest, "hosts": {h: len(shards[h]) for h in hosts}}
        self.history.add_event(job_id, {"event": "processing", "inputs": report})
        return out

    def _list_files(self, host: str, source: str, what: str) -> list[str]:
        """The regular files under ``source`` on ``host`` (relative paths, sorted), through the
        agent's exec (argv only, no shell) with the host's Python."""
        import json

        python = self.ctl.inventory.get(host).python
        try:
            res = self.ctl.agent(host).exec(argv=[python, "-c", _LIST_FILES, source], timeout_s=120, timeout=150)
        except TransportError as e:
            raise JobError(f"{what}: cannot list {source} on {host}: {e}") from None
        if res.get("stdout_dropped"):
            raise JobError(f"{what}: {source} on {host} lists more than 1 MiB of file names")
        if res.get("exit_code") != 0:
            err = (res.get("error") or res.get("stderr") or "").strip().splitlines()
            said = err[-1] if err else f"exit {res.get('exit_code')}"
            raise JobError(f"{what}: cannot list {source} on {host}: {said}")
        try:
            files = json.loads((res.get("stdout") or "").strip().splitlines()[-1])["files"]
        except (ValueError, IndexError, KeyError, TypeError):
            raise JobError(f"{what}: {host} answered no listing of {source}") from None
        return [str(f) for f in files]

    # -- lifecycle --------------------------------------------------------------------------

    def launch(self, spec: JobSpec, *, job_id: str | None = None, look: bool = True,
               capacity: list[HostCapacity] | None = None, user: str | None = None) -> JobView:
        """Place the job, start it on every host, record it. Raises PlacementError or JobError.
        The view returned looks at the hosts once more, unless ``look`` is false (a caller that
        does not show it: the sweeps). ``capacity``: the hosts' capacity if the caller has just
        read it. ``user``: the job's owner, recorded as its ``user`` (default: this account; a job already
        recorded, as a queued one, keeps the owner it has unless one is given). A job that ran before
        (preempted, back from the queue) starts as its next attempt: its ranks resume from
        their newest checkpoint, as after a gang restart. A job of a person who joined with
        accounts of their own starts through their own agents (``for_owner``)."""
        if self.accounts is not None or self._base is not None:
            owner = user if user is not None else (self.history.get(job_id) or {}).get("user") if job_id else None
            self.check_joined(owner)
            view = self.for_owner(owner)
            if view is not self:
                return view.launch(spec, job_id=job_id, look=look, capacity=capacity, user=user)
            self._person_hosts(spec)
        unknown = [h for h in spec.hosts if h not in self.ctl.inventory.names]
        if unknown:
            raise JobError(
                f"{spec.path or 'job spec'}: field 'hosts': expected hosts from the inventory "
                f"({', '.join(self.ctl.inventory.names)}), got unknown {', '.join(map(repr, unknown))}"
            )
        self.check_pins(spec)
        if capacity is not None and self._base is not None:  # a person's jobs go only where they have an account
            capacity = [c for c in capacity if c.name in set(self.ctl.inventory.names)]
        job_id = job_id or new_job_id(spec.name)
        engine = self.engine()
        try:
            placement = engine.place(job_id, spec, capacity=capacity)
        except EngineError as e:
            raise JobError(str(e)) from None
        except Queued as q:
            assert isinstance(engine, SlurmEngine)
            return self._leave_to_slurm(engine, job_id, spec, user, q, look)
        try:
            attempt = self._begin_attempt(job_id, spec, placement, user, engine.record(job_id))
        except BaseException:
            engine.release(job_id)
            raise
        try:
            engine.start(job_id, spec, placement, restart_count=attempt)
        except EngineError as e:
            raise JobError(str(e)) from None
        if any(p.role == "reduction_server" for p in spec.pools):
            self._size_pools(job_id, placement)
        now = time.monotonic()
        due = [h for h in placement.hosts if now - self._gc_at.get(h, -GC_EVERY_S) >= GC_EVERY_S]
        if due:  # retention, applied where jobs start; a controller that starts many: once a minute a host
            self._gc_at.update({h: now for h in due})
            self.collect_garbage(due)
        return self.view(job_id, live=look)

    # -- the engines: where an attempt runs and who starts it (tui/control/engines.py) -------------

    def _leave_to_slurm(self, engine: SlurmEngine, job_id: str, spec: JobSpec, user: str | None, q: Queued,
                        look: bool) -> JobView:
        """A job Slurm has, which its nodes start themselves when Slurm runs it (their templates
        written before its submission): recorded ``pending`` with its Slurm job. A caller that
        looks (``look``) gets it once where it runs is known, or as Slurm has it after
        ALLOCATION_QUICK_S (queued: it starts whoever watches then)."""
        try:
            self._begin_attempt(job_id, spec, Placement(()), user, engine.record(job_id))
        except BaseException:
            engine.release(job_id)
            raise
        finally:
            engine.forget(job_id)
        self.history.add_event(job_id, {"event": "submitted to slurm", "slurm_job_id": q.slurm_job_id,
                                        "nodes_start": True})
        deadline = time.monotonic() + (ALLOCATION_QUICK_S if look else 0.0)
        while True:
            rec = engine.allocated(self.record(job_id))
            if rec.get("placement") or rec["state"] in TERMINAL or time.monotonic() >= deadline:
                return self.view(job_id, live=look)
            time.sleep(LOOK_POLL_S)

    def engine(self, rec: Mapping[str, Any] | None = None) -> Engine:
        """The engine of a new attempt (Slurm's where the inventory has ``[slurm]``), or of the
        job ``rec`` (the one that ran it)."""
        slurm = bool(rec.get("slurm")) if rec is not None else getattr(self.ctl.inventory, "slurm", None) is not None
        if slurm:
            if self._slurm is None:
                self._slurm = SlurmEngine(self)
            return self._slurm
        return OwnHosts(self)

    def slurm_drain(self, host: str, gpu: int | None, reason: str) -> str | None:
        """On a Slurm cluster, a drain of rigdeck's kept in Slurm too (its node drained, the
        reason naming rigdeck, the host and GPU). What went wrong, or None (logged, never raised:
        rigdeck's own drain holds all the same)."""
        if getattr(self.ctl.inventory, "slurm", None) is None:
            return None
        try:
            engine = self.engine()
            assert isinstance(engine, SlurmEngine)
            engine.drain(host, gpu, reason)
        except (EngineError, TransportError) as e:
            log.warning("drain of %s not kept in Slurm: %s", host, e)
            return str(e)
        return None

    def slurm_resume(self, host: str) -> str | None:
        """On a Slurm cluster, the host's node resumed in Slurm once rigdeck keeps no drain of it
        (and only a drain rigdeck set). What went wrong, or None."""
        if getattr(self.ctl.inventory, "slurm", None) is None or any(
                d["host"] == host for d in self.history.drains()):
            return None
        try:
            engine = self.engine()
            assert isinstance(engine, SlurmEngine)
            engine.resume(host)
        except (EngineError, TransportError) as e:
            log.warning("%s not resumed in Slurm: %s", host, e)
            return str(e)
        return None

    def _begin_attempt(self, job_id: str, spec: JobSpec, placement: Placement, user: str | None,
                       extra: Mapping[str, Any]) -> int:
        """The job recorded (created, or its next attempt: a job that ran before, preempted or
        back from the queue, resumes from its newest checkpoint) with the placement; its attempt."""
        rec = self.history.get(job_id)
        attempt = 0
        if rec is None:
            self.history.create(job_id, spec.name, spec.to_dict(), state=PENDING,
                                user=user if user is not None else local_user())
        elif any(e.get("event") == "started" for e in rec.get("events") or ()):
            attempt = int(rec.get("restarts") or 0) + 1
            self.history.add_event(job_id, {"event": "resumed", "restart_count": attempt,
                                            "preempted": int(rec.get("preempted") or 0)})
        owner = {"user": user} if rec is not None and user else {}
        # The attempt is recorded with the placement: a look before the start reaches the hosts
        # knows their answers of the attempt before are not this one's (this_attempt).
        self.history.update(job_id, state=PENDING, placement=placement.to_plan_nodes(), restarts=attempt,
                            **owner, **extra)
        return attempt

    def check_pins(self, spec: JobSpec) -> None:
        """A pool's ``hosts`` and ``labels`` the inventory cannot meet: JobError, before
        anything is placed or started (the spec's parser cannot know the inventory)."""
        if not spec.pools:
            return
        inv = {h.name: tuple(h.labels) for h in self.ctl.inventory.hosts}
        problem = check_pins(spec.pools, inv, str(spec.path or "job spec"))
        if problem is not None:
            raise JobError(problem)

    def _size_pools(self, job_id: str, placement: Placement) -> None:
        """Reduction Server sizing from each host's NIC speeds (facts ``nics``; an agent that
        reports none: unknown), stored as the record's ``pool_sizing``."""
        from tui.model.poolsizing import host_gbps, sizing

        gbps: dict[str, float | None] = {}
        for h in placement.hosts:
            try:
                facts = self.ctl.agent(h).facts(timeout=20)
            except TransportError:
                gbps[h] = None
                continue
            node = placement.nodes[placement.on_host(h)[0]]
            gbps[h] = host_gbps(facts.raw.get("nics"), node.address)
        result = sizing([(str(n.pool), n.host) for n in placement.nodes], gbps)
        if result is not None:
            self.history.update(job_id, pool_sizing=result)

    def env_file(self, job_id: str, spec: JobSpec) -> dict[str, Any]:
        """The plan's ``env_file``: the names of the job's ``env_from_file`` and, for a start
        that brings them, its values: embedded, read from the file now (every start); on a
        server, those that came with the launch (its first start only: a restart's hosts use
        the ones they kept). Never recorded, never logged."""
        names = list(spec.env_file_names)
        if job_id in self.env_values:
            return {"names": names, "values": dict(self.env_values[job_id])}
        if not (self._base or self).reads_env_files:
            return {"names": names}
        assert spec.env_from_file is not None
        try:
            values = dict(read_env_file(spec.env_from_file))
        except EnvFileError as e:
            raise JobError(f"env_from_file: {e}") from None
        return {"names": sorted(values), "values": values}

    def env_file_hosts(self, rec: Mapping[str, Any]) -> list[str] | None:
        """The hosts a restart of ``rec`` may use for its ``env_from_file`` values: on a server
        that no longer holds them, those where the job started before (each keeps them in the
        job's directory); None: any host."""
        if (self._base or self).reads_env_files or not (rec.get("spec") or {}).get("env_from_file") \
                or rec["job_id"] in self.env_values:
            return None
        return [h for e in rec.get("events") or () if e.get("event") == "started" for h in e.get("hosts") or ()]

    def _start(self, job_id: str, spec: JobSpec, placement: Placement, restart_count: int,
               plan_extra: Mapping[str, Any] | None = None) -> None:
        """Start the job on every host of ``placement``, or on none: whatever goes wrong (a host,
        the network, a bug, Ctrl-C) stops what started, gives back every claim and records the
        job as failed with why. A job is never left ``starting``. The ``env_from_file`` values
        a server held for the job are dropped either way: its hosts keep them now, or it failed."""
        try:
            self._start_on(job_id, spec, placement, restart_count, plan_extra)
        finally:
            self.env_values.pop(job_id, None)

    def _start_on(self, job_id: str, spec: JobSpec, placement: Placement, restart_count: int,
                  plan_extra: Mapping[str, Any] | None) -> None:
        self.history.update(job_id, state=STARTING, placement=placement.to_plan_nodes(), restarts=restart_count)
        hosts = list(placement.hosts)
        results: dict[str, Any] = {}
        try:
            workdirs = self._push_code(job_id, spec, hosts) if spec.code is not None else {}
            try:
                plans = self._plans(job_id, spec, placement, restart_count)
            except TransportError as e:
                raise JobError(f"could not prepare the launch: {e}") from None
            for h, path in workdirs.items():
                plans[h]["workdir"] = path
            heal = self._heal_plan(job_id, spec, placement)
            for plan in plans.values():
                plan.update(plan_extra or {})
                if heal is not None and not plan.get("slurm"):
                    plan["heal"] = heal
            if spec.kind == "processing" and spec.processing is not None:
                for h, processing in self._processing(job_id, spec, placement, workdirs).items():
                    plans[h]["processing"] = processing
            if spec.inputs or spec.seed_checkpoint:
                for h, staged in self._stage_artifacts(job_id, spec, hosts).items():
                    plans[h]["channels"] = {**plans[h]["channels"], **staged.get("channels", {})}
                    if staged.get("seed_checkpoint"):
                        plans[h]["seed_checkpoint"] = staged["seed_checkpoint"]
            primary = placement.nodes[0].host
            # The primary last: an mpirun there needs every other host's job directory in place.
            others = [h for h in plans if h != primary]
            results = self._start_hosts(plans, others)
            if not any(isinstance(r, Exception) for r in results.values()):
                results.update(self._start_hosts(plans, [primary]))
            failed = {h: r for h, r in results.items() if isinstance(r, Exception)}
            if failed:
                msg = "; ".join(f"{h}: {e}" for h, e in failed.items())
                raise JobError(f"job {job_id} could not start: {msg}")
        except BaseException as e:
            started = [h for h, r in results.items() if not isinstance(r, Exception)]
            self.ctl.agents(started).job_stop(job_id=job_id, grace_s=1.0, timeout=30)
            self.ctl.agents([h for h in hosts if h not in started]).job_release(job_id=job_id, timeout=30)
            why = str(e) if isinstance(e, JobError) else f"{type(e).__name__}: {e}"
            self.history.update(job_id, state=FAILED, ended=time.time(), cause={"message": f"start failed: {why}"})
            raise
        # Once per attempt: a look that saw every host run it while this start was still on its
        # way here (another thread, or the next controller after this one was killed) has
        # recorded the start already, and what it wrote since (an end) is not undone.
        self.history.add_event(job_id, {"event": "started", "restart_count": restart_count,
                                        "hosts": list(placement.hosts),
                                        "gpus": usage.placement_gpus(placement.to_plan_nodes())},
                               once=("event", "restart_count"), state=RUNNING, started=time.time())

    def _record_seen_start(self, rec: Mapping[str, Any], states: dict[str, Any]) -> None:
        """A job still recorded ``starting`` whose every host reports this attempt (running, or
        already ended): its start reached them all, and whoever started it has not recorded that
        (killed between telling the hosts and writing it down, or about to). The start is
        recorded now, from its placement, before its state moves on: no job runs or ends
        without its ``started`` event. Once per attempt, whoever comes first."""
        attempt = int(rec.get("restarts") or 0)
        if rec.get("state") != STARTING or not states or not all(
                isinstance(s, dict) and s.get("state") not in (None, STARTING) and (
                    s.get("restart_count") is None or int(s["restart_count"]) == attempt)
                for s in states.values()):
            return
        nodes = rec.get("placement") or []
        hosts = list(dict.fromkeys(str(n.get("host")) for n in nodes if isinstance(n, Mapping))) or list(states)
        self.history.add_event(rec["job_id"], {"event": "started", "restart_count": attempt, "hosts": hosts,
                                               "gpus": usage.placement_gpus(nodes), "seen": True},
                               once=("event", "restart_count"), started=time.time())

    def _heal_plan(self, job_id: str, spec: JobSpec, placement: Placement) -> dict[str, Any] | None:
        """The plan's ``heal`` for a job its host restarts itself (``heals_on_host``): the restarts
        the spec leaves it, which exits they are for, and the host's GPUs drained now (a spare it
        moves ranks to after a GPU fault is never one of them). None: the controller heals it."""
        rec = self.history.get(job_id) or {}
        if not heals_on_host(spec.to_dict(), len(placement.hosts), bool(rec.get("slurm"))):
            return None
        hosts = set(placement.hosts)
        drained = sorted({d.gpu for d in self.healer.current_drains() if d.host in hosts and d.gpu is not None})
        return {"by": "host", "restarts_left": max(0, spec.restart.max_restarts - restarts_used(rec)),
                "on_exit_codes": list(spec.restart.on_exit_codes), "drained": drained}

    def snapshot_code(self, spec: JobSpec) -> JobSpec:
        """A spec with ``[code] sync`` gets its snapshot now, at submission: the job runs this
        version of the files even if it waits in the queue while they change."""
        if spec.code is None or spec.code.tree is not None:
            return spec
        from tui.model.codesync import CodeSyncError

        try:
            code, _done = self.code_store.snapshot(spec.code, f"{spec.path or 'job spec'}: [code] sync")
        except CodeSyncError as e:
            raise JobError(str(e)) from None
        import dataclasses

        return dataclasses.replace(spec, code=code)

    def _push_code(self, job_id: str, spec: JobSpec, hosts: list[str]) -> dict[str, str]:
        """Ship the job's code snapshot to every host of the job, in parallel; the job's workdir
        on each host is its copy. Any host failing fails the start (nothing has started yet)."""
        from concurrent.futures import ThreadPoolExecutor

        from tui.model.codesync import CodeSyncError
        from tui.remote.codesync import Payloads, push

        if spec.code is not None and spec.code.tree is None:
            spec = self.snapshot_code(spec)
        assert spec.code is not None
        tree = spec.code.tree
        assert tree is not None
        live = self.code_progress.setdefault(job_id, {})
        payloads = Payloads(self.code_store, self.code_store.manifest(tree).blobs())

        def progress(host: str, done: int, total: int) -> None:
            live[host] = (done, total)
            for fn in list(self.code_listeners):
                fn(job_id, host, done, total)

        def one(h: str) -> Any:
            try:
                return push(self.ctl, h, self.code_store, tree, progress, payloads)
            except (TransportError, CodeSyncError) as e:
                return e

        try:
            with ThreadPoolExecutor(max_workers=min(32, len(hosts)), thread_name_prefix="sync") as pool:
                results = dict(zip(hosts, pool.map(one, hosts), strict=True))
        finally:
            self.code_progress.pop(job_id, None)
        failed = {h: r for h, r in results.items() if isinstance(r, Exception)}
        if failed:
            raise JobError("code sync failed: " + "; ".join(f"{h}: {e}" for h, e in failed.items()))
        self.history.add_event(job_id, {"event": "code", "tree": tree,
                                        "hosts": {h: r.to_json() for h, r in results.items()}})
        return {h: r.path for h, r in results.items()}

    def _stage_artifacts(self, job_id: str, spec: JobSpec, hosts: list[str]) -> dict[str, dict[str, Any]]:
        """A pipeline step's artifacts from earlier steps, made on every host of the job (moved
        from the hosts that made them when these do not have them, each content checked against
        its SHA-256): host -> {"channels": {channel: its tree}, "seed_checkpoint": a tree}. Any
        host failing fails the start (nothing has started yet)."""
        from tui.remote.artifacts import stage

        wanted: list[tuple[str, Mapping[str, Any]]] = list(spec.inputs)
        if spec.seed_checkpoint:
            wanted.append(("", spec.seed_checkpoint))
        out: dict[str, dict[str, Any]] = {h: {"channels": {}} for h in hosts}
        report: dict[str, Any] = {}
        for channel, art in wanted:
            what = f"channel {channel} ({art.get('from')})" if channel else f"checkpoints ({art.get('from')})"
            results = stage(self.ctl, dict(art), hosts)
            staged = {h: r for h, r in results.items() if not isinstance(r, Exception)}
            failed = {h: r for h, r in results.items() if isinstance(r, Exception)}
            if failed:
                raise JobError(f"{what} could not be staged: " + "; ".join(f"{h}: {e}" for h, e in failed.items()))
            for h, r in staged.items():
                if channel:
                    out[h]["channels"][channel] = r.path
                else:
                    out[h]["seed_checkpoint"] = r.path
            report[channel or "checkpoints"] = {"from": art.get("from"), "tree": art.get("tree"),
                                                "hosts": {h: r.to_json() for h, r in staged.items()}}
        self.history.add_event(job_id, {"event": "inputs", "artifacts": report})
        return out

    def _start_hosts(self, plans: dict[str, dict[str, Any]], hosts: list[str]) -> dict[str, Any]:
        from concurrent.futures import ThreadPoolExecutor

        def one(h: str) -> Any:
            try:
                return self.ctl.agent(h).job_start(plan=plans[h], timeout=60)
            except TransportError as e:
                return e

        if not hosts:
            return {}
        with ThreadPoolExecutor(max_workers=len(hosts)) as pool:
            return dict(zip(hosts, pool.map(one, hosts), strict=True))

    @staticmethod
    def hosts_ever(rec: dict[str, Any]) -> list[str]:
        """Every host the job has run on (a restart may have moved it): logs and metrics live there."""
        seen: list[str] = []
        for e in rec.get("events") or []:
            for h in e.get("hosts") or []:
                if h not in seen:
                    seen.append(h)
        for n in rec.get("placement") or []:
            if n["host"] not in seen:
                seen.append(n["host"])
        return seen

    def resolve(self, ref: str) -> JobRef:
        """The job ``ref`` names (exact id, newest of a name, unique literal id prefix)."""
        try:
            found = self.history.resolve(ref)
        except JobRefError as e:
            raise JobError(str(e)) from None
        if found is None:
            raise JobError(f"no job {ref!r} in {self.history.path}")
        return found

    def record(self, ref: str) -> dict[str, Any]:
        return self.resolve(ref).rec

    def host_states(self, rec: dict[str, Any], skip: Sequence[str] = (), *,
                    fresh_health: bool = False) -> dict[str, Any]:
        """What each host of the job's placement (but ``skip``) says of it (``job_status``), or the
        TransportError that kept it from saying. A host that does not answer in 20 s is out of
        reach for this look: less would take a slow host (a loaded machine) for a lost one, and a
        host out of reach is counted from its last answer anyway (tui/control/healing.py).
        ``fresh_health``: each host's ``gpu_health`` from a sample taken now."""
        hosts = [h for h in dict.fromkeys(n["host"] for n in rec.get("placement") or []) if h not in skip]
        ctl = self.ctl_for(rec.get("user"))
        if len(hosts) < 2:
            return ctl.agents(hosts).job_status(job_id=rec["job_id"], fresh_health=fresh_health, timeout=20)
        return _states_until_stalled(lambda h: ctl.agents([h]).job_status(
            job_id=rec["job_id"], fresh_health=fresh_health, timeout=20)[h], hosts)

    def stop(
        self, ref: str, grace_s: float | None = None, wait: bool = True, *, yes: bool = False,
        user: str | None = None,
    ) -> JobView:
        """Stop the job ``ref`` names. A name that several jobs share stops the newest only with
        ``yes``: a stop cannot be taken back, so the caller must have seen that it was a choice.
        ``user``: who stops it (default: the local account), recorded in its stop's event."""
        found = self.resolve(ref)
        if found.how == "name" and len(found.matches) > 1 and not yes:
            raise AmbiguousJobError(
                f"{ref!r} names {len(found.matches)} jobs: {', '.join(found.matches)}; "
                f"confirm stopping the newest ({found.matches[0]}), or give a job id",
                found.matches,
            )
        rec = found.rec
        job_id = rec["job_id"]
        by = user or local_user() or "?"
        if rec["state"] == QUEUED and self.history.take_queued(job_id):
            # Nothing runs yet: it leaves the line, and no host is touched.
            self.env_values.pop(job_id, None)
            self.history.update(job_id, state=STOPPED, ended=time.time(),
                                cause={"message": "cancelled while queued"})
            self.history.add_event(job_id, {"event": "cancelled while queued", "by": by})
            return self.view(job_id, live=False)
        self.history.update(job_id, supervisor=self.owner, lease_until=time.time() + LEASE_S)
        grace = grace_s if grace_s is not None else float(rec["spec"].get("grace_s", 30))
        self.history.update(job_id, state=STOPPING)
        self.history.add_event(job_id, {"event": "stop requested", "grace_s": grace, "by": by})
        hosts = list(dict.fromkeys(n["host"] for n in rec.get("placement") or []))
        self.ctl_for(rec.get("user")).agents(hosts).job_stop(job_id=job_id, grace_s=grace, timeout=20)
        try:
            self.engine(rec).stop(rec)  # Slurm's job cancelled (scancel): its step ends with the hosts'
        except EngineError as e:
            self.history.add_event(job_id, {"event": "engine stop failed", "error": str(e)})
        if not wait:
            # The hosts are stopping it: it stays "stopping" (its GPUs held) until supervision
            # sees them done, and records "stopped" then.
            self.history.update(job_id, supervisor=None, lease_until=None)
            return self.view(job_id, live=False)
        # Done when no process of it is left on any host and no host holds a GPU claim for it
        # (the job host writes its end, then exits: until then it holds the claims).
        deadline = time.monotonic() + grace + 30
        while True:
            states = self.host_states(rec)
            left = left_behind(states)
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
        if left_behind({h: s for h, s in states.items() if isinstance(s, dict)}):
            # A host that answers still has some of it: it stays "stopping" (its GPUs held)
            # and says what is left; supervision records its end once the hosts are done.
            self.history.update(job_id, supervisor=None, lease_until=None)
            self.history.add_event(job_id, {"event": "stop incomplete", "left": left})
            return self.view(job_id, live=False)
        extra: dict[str, Any] = {"cause": {"message": "stopped; unreachable then: " + ", ".join(left)}} if left else {}
        self.history.update(job_id, state=STOPPED, ended=time.time(), **extra)
        self.scheduler.release(job_id)
        return self.view(job_id)

    def stopping_on(self, hosts: Sequence[str]) -> list[dict[str, Any]]:
        """Jobs being stopped (``stopping``) that run on any of ``hosts``: what a launch on
        those hosts may be waiting for."""
        want = set(hosts)
        return [r for r in self.history.list(limit=500) if r["state"] == STOPPING
                and want & {n["host"] for n in r.get("placement") or []}]

    def await_stopped(self, job_ids: Sequence[str], timeout: float) -> dict[str, dict[str, str]]:
        """Follow stopping jobs until each is recorded ended and nothing of it is left on its
        hosts (no process, no GPU claim), or ``timeout`` passes. Supervises them meanwhile (a
        controller that holds their lease records the end itself). A preempted job back in the
        queue is done once the hosts it last ran on hold nothing of it (no process, no claim).
        Returns what is still left, by job (empty: all done)."""
        deadline = time.monotonic() + timeout
        pending = list(job_ids)
        left: dict[str, dict[str, str]] = {}
        while pending:
            left = {}
            for job_id in pending:
                rec = self.record(job_id)
                if rec["state"] == QUEUED:  # preempted and back in the queue: its placement is gone
                    states = self.host_states({**rec, "placement": [{"host": h} for h in last_hosts(rec)]})
                else:
                    states = self.supervise_once(rec) if rec["state"] not in TERMINAL else self.host_states(rec)
                    rec = self.record(job_id)
                what = left_behind(states)
                if rec["state"] not in TERMINAL and rec["state"] != QUEUED:
                    what = what or {"": f"recorded {rec['state']}"}
                if what:
                    left[job_id] = what
            pending = list(left)
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(POLL_S / 2)
        return left

    def supervise_once(self, rec: dict[str, Any]) -> dict[str, Any]:
        """Look at every host of the job once and apply the gang rules. Returns the host states."""
        view = self.for_owner(rec.get("user"))
        if view is not self:  # the gang rules act through the owner's own agents
            return view.supervise_once(rec)
        job_id = rec["job_id"]
        if rec["state"] == PENDING and (rec.get("slurm") or {}).get("nodes_start") and not rec.get("placement"):
            engine = self.engine(rec)  # a job left to Slurm's nodes: where Slurm runs it, once it does
            assert isinstance(engine, SlurmEngine)
            rec = engine.allocated(rec)
            if not rec.get("placement"):
                return {}
        states = this_attempt(rec, self.host_states(rec))
        if rec.get("slurm") and rec["state"] not in TERMINAL:
            states = self.engine(rec).checked(rec, states)
        # (a job launched without --wait stays "starting" in the history until a look sees it run)
        if rec["state"] in (STARTING, RUNNING, STOPPING) and host_heals(states, int(rec.get("restarts") or 0)):
            rec = self._adopt(rec, states)
        overall = overall_state(states)
        # What leaves every process alive and the job going nowhere (tui/control/healing.py).
        fault = self.healer.look(rec, states, hangs_on_host=hangs_on_host(rec),
                                 gpus_on_host=gpus_on_host(rec)) if rec["state"] == RUNNING and (
            overall in (RUNNING, UNKNOWN)) else None
        if fault is None and rec["state"] in (STARTING, RUNNING) and overall == FAILED:
            # A rank that died as its GPU failed (a CUDA error at XID 79) died of the GPU: drained,
            # recorded as the GPU's incident, and the restart goes elsewhere. Its host may not
            # have seen the death yet (its peer, whose collective broke, failed first): the
            # hosts still running are asked again on a sample taken now.
            fault = self.healer.gpu_fault(rec, states)
            running = [h for h, s in states.items() if isinstance(s, dict) and s.get("state") != FAILED]
            if fault is None and running:
                again = self.host_states(rec, skip=[h for h in states if h not in running], fresh_health=True)
                fault = self.healer.gpu_fault(rec, again)
        if rec["state"] in TERMINAL:
            self.healer.forget(job_id)
        news = bool(pools.replica_events(rec, states))  # a pool's replica failed, training goes on
        if fault is None and (rec["state"] in TERMINAL or rec["state"] == QUEUED or (
                overall in (rec["state"], "unknown") and not news)):
            return states  # what cannot be known is not written over what history knows
        # A controller that only looks (``status``, ``jobs``, a ``launch`` without ``--wait``)
        # holds the lease while it applies this change, not for LEASE_S after it has exited:
        # the app, or a ``launch --wait``, must not find the job unattended for a minute.
        held = rec.get("supervisor") == self.owner and (rec.get("lease_until") or 0) > time.time()
        if not self.history.try_lease(job_id, self.owner, LEASE_S):
            return states  # another controller is handling this job: just look
        try:
            if fault is not None:
                return self._heal(job_id, states, fault)
            return self._apply(job_id, states, overall)
        finally:
            if not held:
                self.history.release_lease(job_id, self.owner)

    def _adopt(self, rec: dict[str, Any], states: dict[str, Any]) -> dict[str, Any]:
        """The restarts the job's host made in place with nobody watching (agent/jobhost.py), into
        the history as if this controller had made them: each one's incident, ``restart`` and
        ``started`` events at the host's times, the record's ``restarts``. Under the lease, and
        only those after the history's newest attempt: two controllers never adopt one twice."""
        job_id = rec["job_id"]
        held = rec.get("supervisor") == self.owner and (rec.get("lease_until") or 0) > time.time()
        if not self.history.try_lease(job_id, self.owner, LEASE_S):
            return rec  # another controller is at it: it adopts them
        try:
            rec = self.record(job_id)
            for host, heal in host_heals(states, int(rec.get("restarts") or 0)):
                cause, incident = adopted(host, heal)
                attempt = incident.attempt + 1
                moved = gpu_moved(heal)
                if moved is not None:
                    # The ranks left a failed GPU for a spare on their host: the job holds the
                    # spare now, and the failed GPU stays out of placement (the host already
                    # keeps it out; the history's drain says so to every placement and face).
                    reasons = heal.get("reasons")
                    if not isinstance(reasons, Mapping):
                        reasons = {}
                    for old in moved[2]:
                        why = f"{host} GPU {old}: {reasons.get(str(old)) or 'unhealthy'}"
                        self.history.drain(host, old, why, cause["healed_by"], source="health")
                    rec = {**rec, "placement": moved_placement(rec.get("placement") or [], host, moved[1])}
                    self.history.update(job_id, placement=rec["placement"])
                    self.healer.drains_read = 0.0  # read again at the next look
                self.history.add_event(job_id, {"event": "incident", "cause": cause, "time": incident.detected_at})
                self.history.add_event(job_id, {"event": "restart", "restart_count": attempt, "cause": cause,
                                                "by": cause["healed_by"],
                                                "time": heal.get("stopped_at") or incident.detected_at})
                self.history.add_event(job_id, {"event": "started", "restart_count": attempt, "hosts": [host],
                                                "gpus": usage.placement_gpus(rec.get("placement")),
                                                "by": cause["healed_by"],
                                                "time": heal.get("started_at") or time.time()},
                                       restarts=attempt)
                self.history.add_incident(job_id, incident.to_dict())
                self.healer.forget(job_id)  # the next attempt is watched afresh
            return self.record(job_id)
        finally:
            if not held:
                self.history.release_lease(job_id, self.owner)

    def _heal(self, job_id: str, states: dict[str, Any], fault: Fault) -> dict[str, Any]:
        """Stop a job that a fault leaves alive and going nowhere, keep the incident, and restart
        it from its checkpoint away from what failed (or fail it, as its spec says)."""
        found = time.time()
        rec = self.record(job_id)  # as it is now that we hold the lease
        if rec["state"] not in (STARTING, RUNNING):  # (starting: a launch without --wait, never looked at since)
            return states
        cause = fault.cause()
        live = [h for h, s in states.items() if isinstance(s, dict) and s.get("state") not in TERMINAL]
        if fault.kind == "gpu" and fault.host is not None:
            # Kept out of placement until an operator undrains it, whatever the agent says next.
            self.history.drain(fault.host, fault.gpu, fault.message, "rigdeck", source="health")
            # In Slurm too: its node drained, the reason "rigdeck: HOST GPU N XID 79: ..." (where
            # Slurm refuses, the restart's --exclude keeps the job off the node all the same)
            refused = self.slurm_drain(fault.host, fault.gpu, fault.what or fault.message)
            if refused:
                cause["slurm_drain"] = f"not drained in Slurm: {refused}"
        if fault.kind == "hang" and live:
            # A job host that judged the hang took its ranks' stacks then; the others are asked now.
            taken: dict[str, Any] = dict(fault.stacks or {})
            ask = [h for h in live if h not in taken]
            got = self.ctl.agents(ask).job_stacks(job_id=job_id, why=fault.message, timeout_s=5.0,
                                                  timeout=20) if ask else {}
            taken.update({h: v for h, v in got.items() if not isinstance(v, Exception)})
            summary, rows = stack_summary(taken)
            cause["message"] = f"{fault.message}; {summary}"
            cause["stacks"] = rows
        self.history.add_event(job_id, {"event": "incident", "cause": cause})
        if live:  # (a restart may follow: the hosts' warm standbys wait for it)
            self.ctl.agents(live).job_stop(job_id=job_id, grace_s=5.0, keep_standbys=True, timeout=20)
        self.healer.record(job_id, fault, int(rec.get("restarts") or 0), time.time(), detected_at=found)
        dead = [h for h, s in states.items() if not isinstance(s, dict)]
        return self._restart_or_fail(job_id, rec, states, cause, eligible=fault.restart, dead=dead)

    def _apply(self, job_id: str, states: dict[str, Any], overall: str) -> dict[str, Any]:
        """The gang rules, applied by the lease holder to what the hosts reported."""
        rec = self.record(job_id)  # as it is now that we hold the lease
        if rec["state"] in TERMINAL:
            return states
        if rec["state"] in (PENDING, STARTING):  # a start began since the hosts were asked
            states = this_attempt(rec, states)
            overall = overall_state(states)
            self._record_seen_start(rec, states)
        pools.record_replica_events(self, job_id, rec, states)
        if overall in TERMINAL and preempt_pending(rec):
            return self._requeue(job_id, rec, states)
        if overall in (rec["state"], "unknown"):
            return states
        if overall == FAILED:
            cause = first_cause(states) or {"message": "a host reported failure"}
            found = time.time()
            live = [h for h, s in states.items() if isinstance(s, dict) and s.get("state") not in TERMINAL]
            if live:  # stop the rest of the gang now (a restart may follow: the warm standbys wait)
                self.ctl.agents(live).job_stop(job_id=job_id, grace_s=5.0, keep_standbys=True, timeout=20)
            spec = JobSpec.from_dict(rec["spec"])
            code = cause.get("exit_code")
            sig = cause.get("signal")
            eligible = not spec.restart.on_exit_codes or code in spec.restart.on_exit_codes or (
                sig is not None and 128 + sig in spec.restart.on_exit_codes)
            if eligible and restarts_used(rec) < spec.restart.max_restarts:
                # (a container that lost its GPUs is no GPU's fault: nothing is drained, and the
                # restart makes a new container, which usually has them again)
                kind = failure_kind(cause)
                self.healer.record(job_id, Fault(kind, str(cause.get("message") or "a rank failed"),
                                                 host=cause.get("host"), rank=cause.get("rank"),
                                                 gpu=_int_or_none(cause.get("gpu")) if kind == CONTAINER else None),
                                   int(rec.get("restarts") or 0), time.time(), detected_at=found)
            dead = [h for h, s in states.items() if not isinstance(s, dict)]
            return self._restart_or_fail(job_id, rec, states, cause, eligible=eligible, dead=dead)
        elif overall in TERMINAL:
            # A job that stopped without being asked to (max_runtime, or a stop from a host)
            # says why; a user's stop records its own.
            why = stop_cause(states) if overall == STOPPED else None
            extra: dict[str, Any] = {"cause": why} if why else {}
            if overall == SUCCEEDED and pools.primary_succeeded(states):
                # The primary's success ends a pool job: its other replicas are stopped.
                extra = pools.stop_after_primary(self, rec, states)
                self.history.update(job_id, state=overall, ended=time.time())
                self.history.add_event(job_id, {"event": overall, **extra})
                self.scheduler.release(job_id)
                return states
            self.history.update(job_id, state=overall, ended=time.time(), **extra)
            self.history.add_event(job_id, {"event": overall, **extra})
            self.scheduler.release(job_id)
            self._finish(rec)
        elif overall != rec["state"] and rec["state"] != STOPPING:
            self.history.update(job_id, state=overall)
        return states

    def _requeue(self, job_id: str, rec: dict[str, Any], states: dict[str, Any]) -> dict[str, Any]:
        """A preempted job's hosts are done with it: back to the queue, at its own priority and
        first submission time, to resume from its newest checkpoint when room frees."""
        by = [str(e.get("by")) for e in rec.get("events") or () if e.get("event") == "preempted"][-1:]
        waiting = (f"preempted by job {', '.join(by)}: resumes from its newest checkpoint when room frees"
                   if (rec.get("spec") or {}).get("preemptible") is True
                   else f"preempted by job {', '.join(by)}: starts again when room frees")
        self.history.update(job_id, state=QUEUED, placement=None, waiting=waiting,
                            priority=int((rec.get("spec") or {}).get("priority") or 0))
        self.history.add_event(job_id, {"event": "requeued", "waiting": waiting})
        self.scheduler.release(job_id)
        return states

    def _restart_or_fail(self, job_id: str, rec: dict[str, Any], states: dict[str, Any], cause: dict[str, Any],
                         *, eligible: bool, dead: Sequence[str]) -> dict[str, Any]:
        """The gang has been told to stop: start it again (its ranks resume from their newest
        checkpoint) on what is healthy and reachable, when the spec allows another restart;
        otherwise record the failure with its cause."""
        spec = JobSpec.from_dict(rec["spec"])
        restarts = int(rec.get("restarts") or 0)
        if restarts_used(rec) < spec.restart.max_restarts and eligible:
            self._wait_terminal(rec, 30, skip=dead)
            stopped = time.time()
            self.history.add_event(job_id, {"event": "restart", "restart_count": restarts + 1, "cause": cause})
            self.scheduler.release(job_id)
            candidates = [h for h in (list(spec.hosts) or self.ctl.inventory.names) if h not in dead]
            holding = self.env_file_hosts(rec)
            if holding is not None:  # its env_from_file values are only where it ran
                candidates = [h for h in candidates if h in holding]
            if cause.get("kind") == "nan" and cause.get("last_step") is not None:
                # A checkpoint saved after the loss went bad holds bad weights: resume from one before.
                spec = dataclasses.replace(spec, env=tuple(spec.env) + (
                    (RESUME_BEFORE_ENV, str(int(cause["last_step"]))),))
            engine = self.engine(rec)
            try:
                capacity = None if engine.name == "slurm" else self.capacity(candidates, skip=job_id)
                placement = engine.place(job_id, spec, capacity=capacity, exclude=dead,
                                         prefer=[str(n.get("host")) for n in rec.get("placement") or ()
                                                 if isinstance(n, dict)])
                extra = engine.record(job_id)
                if extra:
                    self.history.update(job_id, **extra)
                engine.start(job_id, spec, placement, restart_count=restarts + 1)
                self.healer.restart_began(job_id, stopped, time.time())
                self._end_standbys(rec, skip=list(dead) + list(placement.hosts))  # hosts it left
            except (PlacementError, JobError, EngineError) as e:
                self.healer.restart_began(job_id, stopped)
                engine.release(job_id)
                self.history.update(job_id, state=FAILED, ended=time.time(),
                                    cause={**cause, "restart_error": str(e)})
            return states
        # Decided: announced now (notifications), recorded once the gang has stopped.
        self.history.announce(job_id, "failed", {"cause": cause})
        self._wait_terminal(rec, 15, skip=dead)  # the rest of the gang is stopping: let it finish
        self._end_standbys(rec, skip=dead)  # no restart will adopt them
        self.history.update(job_id, state=FAILED, ended=time.time(), cause=cause)
        self.history.add_event(job_id, {"event": "failed", "cause": cause})
        self.scheduler.release(job_id)
        self._finish(rec)
        return states

    def _end_standbys(self, rec: Mapping[str, Any], skip: Sequence[str]) -> None:
        """The warm standbys of the job (agent/standby.py) on the hosts of ``rec``'s placement but
        ``skip`` end: no attempt there will adopt them (a stop of a job that ended there does
        only that). Best effort: a standby nobody adopts ends by itself soon after."""
        hosts = [h for h in dict.fromkeys(n["host"] for n in rec.get("placement") or []) if h not in skip]
        if hosts and rec.get("spec", {}).get("launcher") == "direct":
            self.ctl.agents(hosts).job_stop(job_id=rec["job_id"], grace_s=1.0, timeout=20)

    def _finish(self, rec: Mapping[str, Any]) -> None:
        """The engine that ran an ended job keeps its own word on the end (Slurm's state)."""
        try:
            self.engine(rec).finish(self.record(rec["job_id"]))
        except (EngineError, TransportError) as e:
            log.warning("%s: its engine's end not recorded: %s", rec["job_id"], e)

    def _wait_terminal(self, rec: dict[str, Any], timeout: float, skip: Sequence[str] = ()) -> None:
        """Until every host of the job but ``skip`` (out of reach) says it ended, or ``timeout``:
        asked every ``STOP_POLL_S`` (a restart waits for it; a look costs its hosts milliseconds)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = self.host_states(rec, skip=skip)
            if all(not isinstance(s, dict) or s.get("state") in TERMINAL for s in states.values()):
                return
            time.sleep(STOP_POLL_S)

    def wait(self, ref: str, on_change: Callable[[JobView], None] | None = None,
             timeout: float | None = None) -> JobView:
        """Supervise until the job ends (the gang's supervisor while this runs)."""
        job_id = self.record(ref)["job_id"]
        deadline = None if timeout is None else time.monotonic() + timeout
        last = None
        while True:
            began = time.monotonic()
            self.history.try_lease(job_id, self.owner, LEASE_S)  # we are the supervisor while we wait
            rec = self.record(job_id)
            self.supervise_once(rec)
            rec = self.record(job_id)
            if on_change and (rec["state"], rec["restarts"]) != last:
                last = (rec["state"], rec["restarts"])
                on_change(self.view(job_id, live=False))
            if rec["state"] in TERMINAL:
                return self.view(job_id)
            if deadline is not None and time.monotonic() > deadline:
                return self.view(job_id)
            time.sleep(max(0.05, POLL_S - (time.monotonic() - began)))  # a look every POLL_S

    # -- reading ----------------------------------------------------------------------------

    def view(self, ref: str, live: bool = True) -> JobView:
        """The job as its record has it and, ``live``, as its hosts say now (a live job's look
        applies the gang rules first, as every look does)."""
        rec = self.record(ref)
        if not live:
            return job_view(rec, {}, state_dirs=self.state_dirs())
        state, missing = None, []
        if rec["state"] not in TERMINAL:
            hosts = self.supervise_once(rec)
            rec = self.record(ref)  # what this look recorded (a replica failed, the end)
            hosts = not_yet_told(rec, hosts)
            missing = unreachable(hosts)
            if missing and rec["state"] not in TERMINAL and overall_state(hosts) == UNKNOWN:
                state = "unknown"
        else:
            hosts = self.host_states(rec)
        if rec.get("slurm"):  # Slurm's word on its job now (recorded when it changed)
            try:
                about = self.engine(rec).about(rec, live=True)
            except EngineError:
                about = None
            if about is not None:
                rec = {**rec, "slurm": about}
        step, loss = last_loss(hosts)
        incidents, gp = self.health(rec)
        return job_view(rec, hosts, state=state, unreachable=missing, progress=Progress(step=step, loss=loss),
                        state_dirs=self.state_dirs(), incidents=incidents, goodput=gp)

    def health(self, rec: Mapping[str, Any]) -> tuple[builtins.list[Incident], Goodput | None]:
        """The job's incidents, with the steps each made run twice, and its goodput: time in steps
        that count over the wall time since it first started (to its end), from its metrics
        (no goodput before it starts, or when its hosts cannot be read)."""
        incidents = [Incident.from_dict(d) for d in self.history.incidents(rec["job_id"])]
        first = first_started(rec)
        if first is None:
            return incidents, None
        try:
            records = self.metrics(rec["job_id"])
        except (TransportError, JobError):
            return incidents, None
        return (with_reruns(incidents, records),
                goodput(records, started=first, now=float(rec.get("ended") or time.time())))

    def state_dirs(self) -> dict[str, str]:
        """Each inventory host's ``state_dir`` (where its agent keeps jobs), for the views."""
        inventory = getattr(self.ctl, "inventory", None)  # a bare agent set (tests) has none
        return {name: inventory.get(name).state_dir for name in inventory.names} if inventory is not None else {}

    def list(self, refresh: bool = True) -> list[JobView]:
        out = []
        for rec in self.history.list():
            missing: builtins.list[str] = []
            if refresh and rec["state"] not in TERMINAL:
                try:
                    missing = unreachable(self.supervise_once(rec))
                except TransportError as e:
                    log.info("cannot refresh %s: %s", rec["job_id"], e)
            view = self.view(rec["job_id"], live=False)
            out.append(dataclasses.replace(view, unreachable=tuple(missing)) if missing else view)
        return out

    def metrics(self, ref: str) -> builtins.list[dict[str, Any]]:  # (``list`` here is the method)
        """Every metrics record of every rank, each once, in (step, rank) order. After a restart
        the new attempt's record of a (rank, step) replaces the earlier attempts' (events, which
        carry no step, are all kept)."""
        rec = self.record(ref)
        reader = JobReader(self.ctl_for(rec.get("user")), rec["job_id"])
        records = reader.all_metrics(self.hosts_ever(rec), timeout=30)
        for host, why in reader.unreachable.items():
            log.warning("%s unreachable: its metrics are not included (%s)", host, why)
        return records

    def log_chunks(self, ref: str, rank: int | None = None, follow: bool = False, poll_s: float = 0.5,
                   binary: bool = False) -> Iterator[tuple[str, int, Any, bool]]:
        """(host, rank, data, partial) for every piece of every rank's log, each byte exactly
        once, resuming by byte offset across reconnects; with ``follow`` until the job ends.
        ``partial``: the piece ends inside a line. ``binary``: bytes as the rank wrote them."""
        rec = self.record(ref)
        job_id = rec["job_id"]
        ctl = self.ctl_for(rec.get("user"))
        reader = JobReader(ctl, job_id)
        said: set[str] = set()
        while True:
            rec = self.record(job_id)
            ended = rec["state"] in TERMINAL
            got_any = False
            hosts = self.hosts_ever(rec)
            states = ctl.agents(hosts).job_status(job_id=job_id, timeout=20)  # at once
            for host in hosts:
                st = states[host]
                if isinstance(st, TransportError):
                    if host not in said:  # once a host, however long it is followed
                        said.add(host)
                        log.warning("%s unreachable: its logs are not included (%s)", host, st.detail)
                    continue
                said.discard(host)
                for r in log_ranks(st):
                    if rank is not None and r != rank:
                        continue
                    try:
                        for chunk in reader.log_chunks(host, r, binary=binary):
                            data = chunk.data if binary else chunk.text
                            if data:
                                got_any = True
                                yield host, r, data, chunk.partial
                    except TransportError:
                        pass
            if not follow or (ended and not got_any):
                return
            if follow and not ended:
                try:
                    self.supervise_once(rec)
                except TransportError:
                    pass
            time.sleep(poll_s)

    def log_lines(self, ref: str, rank: int | None = None, follow: bool = False,
                  poll_s: float = 0.5) -> Iterator[tuple[str, int, str]]:
        """(host, rank, line) for every log line, each exactly once: a line that came in pieces
        is one line, made safe to draw."""
        joiner = LineJoiner()
        for host, r, text, partial in self.log_chunks(ref, rank, follow, poll_s):
            for line in joiner.feed((host, r), text, partial):
                yield host, r, line
        for (host, r), line in joiner.flush():
            yield host, r, line

    def tensorboard_pull(self, ref: str, have: Sequence[Sequence[Any]] | None = None) -> Iterator[dict[str, Any]]:
        """The new bytes of the job's TensorBoard files on every host it ran on, against what the
        caller holds (``have``: ``[host, dir, path, id, size, mtime_ns]`` rows). First
        ``{"kind": "job", "job_id", "state", "hosts"}`` (a live job looked at once, as a
        followed log's is), then what ``tui.control.tensorboard.pull`` yields."""
        held = parse_have(have)
        rec = self.record(ref)
        if rec["state"] not in TERMINAL:
            try:
                self.supervise_once(rec)
            except TransportError as e:
                log.info("tensorboard %s: %s", rec["job_id"], e)
            rec = self.record(rec["job_id"])
        hosts = self.hosts_ever(rec)
        yield {"kind": "job", "job_id": rec["job_id"], "state": rec["state"], "hosts": hosts}
        yield from tensorboard_pull(self.ctl_for(rec.get("user")), rec["job_id"], hosts, held)

    def collect_garbage(self, hosts: Sequence[str] | None = None) -> dict[str, Any]:
        """Apply the inventory's retention on the hosts: remove the directories of ended jobs
        past it (never a running job's)."""
        ret = self.ctl.inventory.retention
        targets = list(hosts) if hosts is not None else self.ctl.inventory.names
        return self.ctl.agents(targets).job_gc(max_age_s=ret.max_age_days * 86400, max_jobs=ret.max_jobs,
                                               timeout=60)
