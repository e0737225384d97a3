"""Slurm's state as rigdeck reads it: its nodes (``scontrol show nodes``) and jobs (``squeue``).

Pure: each parser takes the text a command printed and returns plain frozen dataclasses, or
raises ``SlurmParseError`` naming the command and what was expected. Both of Slurm's shapes
are read where the version has them: the text every version prints (``scontrol``'s
``Key=value`` records, several lines or ``-o``'s one) and the JSON of 21.08+ (``sinfo --json``,
``squeue --json``).
The text shapes and the versions they come from are listed in docs/slurm.md; recorded
outputs are in tests/data/slurm/.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from agent import slurmtext
from agent.slurmtext import SlurmTextError

__all__ = [
    "SACCT_FIELDS",
    "SQUEUE_ARGS",
    "SQUEUE_FIELDS",
    "SacctJob",
    "SlurmJob",
    "SlurmNode",
    "SlurmParseError",
    "SlurmReadError",
    "SpecCheck",
    "check_spec",
    "drain_text",
    "node_index",
    "read_jobs",
    "read_nodes",
    "node_of",
    "parse_jobs",
    "parse_jobs_json",
    "parse_nodes",
    "parse_nodes_json",
    "parse_sacct",
    "sacct_args",
    "sacct_usage_records",
    "QUEUE_NOTE",
    "queue_order",
    "queue_where",
]

# squeue's columns as rigdeck asks for them (``squeue --noheader --format=...``): id, user,
# state, pending reason, node count, GRES per node, nodes. The node list comes last: it is the
# one column that can be long; none holds a '|'.
SQUEUE_FIELDS = ("%A", "%u", "%T", "%r", "%D", "%b", "%N")
SQUEUE_ARGS = ("squeue", "--noheader", "--format=" + "|".join(SQUEUE_FIELDS))
NODES_ARGS = ("scontrol", "-o", "show", "nodes")
# What a face may have a server run on the login host for it (the app attached to a server reads
# Slurm's nodes and queue so): these exact commands, and nothing else (ControllerService.slurm_read).
SERVER_READS = (NODES_ARGS, SQUEUE_ARGS)
READ_TIMEOUT_S = 15.0  # one Slurm command on the login host, through its agent

# scontrol's node states (the base state, then '+'-joined flags); sinfo's short words for them.
_BASE_STATES = ("IDLE", "MIXED", "ALLOCATED", "DOWN", "ERROR", "FUTURE", "UNKNOWN", "COMPLETING")
_REASON_RE = re.compile(r"^(?P<text>.*?)\s*\[(?P<user>[^@\]]*)@(?P<when>[^\]]*)\]$")


class SlurmParseError(ValueError):
    """Slurm printed something rigdeck does not read; the message names the command and what was
    expected."""


@dataclass(frozen=True)
class SlurmNode:
    """One node as Slurm sees it."""

    name: str
    state: str  # the base state, lower case: "idle", "mixed", "allocated", "down", ...
    flags: tuple[str, ...] = ()  # upper case, as Slurm spells them: "DRAIN", "NOT_RESPONDING", ...
    reason: str | None = None  # why it is drained or down, as given
    reason_user: str | None = None  # who set the reason
    reason_time: str | None = None  # when, ISO 8601 as scontrol writes it (local time of Slurm)
    hostname: str | None = None
    address: str | None = None
    partitions: tuple[str, ...] = ()
    gpus: int = 0  # GRES gpu configured
    gpus_used: int | None = None  # None: not said (GresUsed comes with ``scontrol -d``)
    gpus_used_idx: tuple[int, ...] | None = None  # which ones (None: not said; 22.05 never does)
    cpus: int | None = None
    cpus_alloc: int | None = None

    @property
    def drained(self) -> bool:
        """Drained or draining: no new job may start on it."""
        return "DRAIN" in self.flags

    @property
    def down(self) -> bool:
        return self.state == "down" or "DOWN" in self.flags or "NOT_RESPONDING" in self.flags

    @property
    def usable(self) -> bool:
        """Whether a job may be placed on it: not drained, down or in error."""
        return not (self.drained or self.down or self.state in ("error", "future"))

    @property
    def short_state(self) -> str:
        """The state as sinfo words it: idle, mix, alloc, drain (drained), drng (draining), down."""
        if self.down:
            return "down"
        if self.drained:
            return "drain" if self.state == "idle" else "drng"
        return {"mixed": "mix", "allocated": "alloc", "completing": "comp"}.get(self.state, self.state)


@dataclass(frozen=True)
class SlurmJob:
    """One job in Slurm's queue."""

    job_id: str
    user: str
    state: str  # Slurm's word, upper case: "PENDING", "RUNNING", ...
    reason: str | None  # why it is pending ("Resources", "Priority", ...); None when it has none
    node_count: int | None
    nodes: tuple[str, ...]  # expanded from Slurm's host list; () while pending
    gpus_per_node: int  # from the job's GRES/TRES per node; 0 when it asked for none that way

    @property
    def pending(self) -> bool:
        return self.state == "PENDING"


QUEUE_NOTE = ("Slurm schedules this cluster: its queue, priorities and fair share are Slurm's. rigdeck's "
              "launches here go to Slurm (sbatch, job name rigdeck:<job id>) and wait in its queue: "
              "rigdeck's own queue schedules no Slurm job and holds none of them.")


def queue_order(jobs: Sequence[SlurmJob]) -> list[SlurmJob]:
    """Slurm's queue as rigdeck shows it (``rigdeck queue``, the Jobs view): pending first, then
    by state and Slurm's job id."""
    return sorted(jobs, key=lambda j: (not j.pending, j.state, int(j.job_id) if j.job_id.isdigit() else 0))


def queue_where(job: SlurmJob) -> str:
    """Why a pending job waits (Slurm's reason), or where a running one runs (its nodes)."""
    return (job.reason or "-") if job.pending else (",".join(job.nodes) or "-")


# --------------------------------------------------------------------------------------------
# nodes


def _state(text: str, what: str) -> tuple[str, tuple[str, ...]]:
    words = [w for w in text.strip().split("+") if w]
    if not words:
        raise SlurmParseError(f"{what}: expected State= like IDLE or MIXED+DRAIN, got {text!r}")
    base = words[0].rstrip("*~#!%$@^-").upper()
    if not re.fullmatch(r"[A-Z_]+", base):
        raise SlurmParseError(f"{what}: expected State= like IDLE or MIXED+DRAIN, got {text!r}")
    flags = tuple(w.upper() for w in words[1:])
    if base == "DRAINED" or base == "DRAINING" or base == "DRAIN":  # an old Slurm's single word
        return ("idle" if base != "DRAINING" else "mixed"), ("DRAIN", *flags)
    return base.lower(), flags


def _reason(text: str | None) -> tuple[str | None, str | None, str | None]:
    if text is None or text.strip() in ("", "(null)", "None"):
        return None, None, None
    m = _REASON_RE.match(text.strip())
    if m is None:
        return text.strip(), None, None
    return m.group("text") or None, m.group("user") or None, m.group("when") or None


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.strip().isdigit() else None


def _names(text: str | None) -> tuple[str, ...]:
    if text is None or text.strip() in ("", "(null)"):
        return ()
    return tuple(p for p in text.strip().split(",") if p)


def _none(text: str | None) -> str | None:
    return None if text is None or text.strip() in ("", "(null)", "N/A") else text.strip()


def parse_nodes(text: str, command: str = "scontrol show nodes") -> list[SlurmNode]:
    """The nodes of ``scontrol show nodes`` (``-d`` and ``-o`` too), any version's text."""
    try:
        recs = slurmtext.records(text, "NodeName")
    except SlurmTextError as e:
        raise SlurmParseError(f"{command}: {e}") from None
    if not recs and text.strip() and "No nodes in the system" not in text:
        raise SlurmParseError(f"{command}: expected NodeName= records, got {text.strip()[:80]!r}")
    return [_node(r, command) for r in recs]


def _node(r: Mapping[str, str], command: str) -> SlurmNode:
    name = r.get("NodeName", "").strip()
    what = f"{command}: node {name or '?'}"
    if not name:
        raise SlurmParseError(f"{command}: expected NodeName=<name>, got an empty name")
    if "State" not in r:
        raise SlurmParseError(f"{what}: expected a State= field")
    state, flags = _state(r["State"], what)
    reason, who, when = _reason(r.get("Reason"))
    try:
        gpus, _ = slurmtext.gres(r.get("Gres", ""))
        used, idx = slurmtext.gres(r["GresUsed"]) if "GresUsed" in r else (None, None)
    except SlurmTextError as e:
        raise SlurmParseError(f"{what}: {e}") from None
    return SlurmNode(
        name=name, state=state, flags=flags, reason=reason, reason_user=who, reason_time=when,
        hostname=_none(r.get("NodeHostName")), address=_none(r.get("NodeAddr")),
        partitions=_names(r.get("Partitions")), gpus=gpus, gpus_used=used,
        gpus_used_idx=tuple(idx) if idx is not None else None,
        cpus=_int(r.get("CPUTot")), cpus_alloc=_int(r.get("CPUAlloc")),
    )


def _json(text: str, key: str, command: str) -> list[Mapping[str, Any]]:
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise SlurmParseError(f"{command} --json: expected JSON, got {text.strip()[:60]!r} ({e})") from None
    if not isinstance(doc, Mapping) or not isinstance(doc.get(key), list):
        raise SlurmParseError(f"{command} --json: expected an object with a {key!r} list")
    errors = doc.get("errors") or []
    if errors:
        raise SlurmParseError(f"{command} --json: Slurm said {errors!r}")
    items = doc[key]
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise SlurmParseError(f"{command} --json: {key}[{i}]: expected an object")
    return items


def _json_time(value: Any) -> str | None:
    if isinstance(value, Mapping):  # 23.02+: {"set": true, "number": 1700000000}
        value = value.get("number") if value.get("set", True) else None
    if isinstance(value, (int, float)) and value > 0:
        return datetime.fromtimestamp(value, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return None


def _json_state(n: Mapping[str, Any], what: str) -> tuple[str, tuple[str, ...]]:
    state = n.get("state")
    if isinstance(state, list):  # 23.02+: ["IDLE", "DRAIN"]
        if not state or not all(isinstance(s, str) for s in state):
            raise SlurmParseError(f"{what}: expected state to be a list of words, got {state!r}")
        return _state("+".join(state), what)
    if not isinstance(state, str):
        raise SlurmParseError(f"{what}: expected state to be a word like \"idle\", got {state!r}")
    flags = n.get("state_flags") or []
    if not isinstance(flags, list):
        raise SlurmParseError(f"{what}: expected state_flags to be a list, got {flags!r}")
    base, more = _state(state, what)
    return base, tuple(dict.fromkeys([*more, *(str(f).upper() for f in flags)]))


def parse_nodes_json(text: str, command: str = "sinfo") -> list[SlurmNode]:
    """The nodes of ``sinfo --json`` (22.05's openapi v0.0.38; 22.05's scontrol has no
    ``--json``, 23.02's ``scontrol show nodes --json`` gives the same ``nodes`` list). Its
    reason's time is given in UTC."""
    out = []
    for n in _json(text, "nodes", command):
        name = n.get("name")
        if not isinstance(name, str) or not name:
            raise SlurmParseError(f"{command} --json: expected every node to have a name")
        what = f"{command} --json: node {name}"
        state, flags = _json_state(n, what)
        try:
            gpus, _ = slurmtext.gres(str(n.get("gres") or ""))
            used, idx = slurmtext.gres(str(n.get("gres_used") or ""))
        except SlurmTextError as e:
            raise SlurmParseError(f"{what}: {e}") from None
        reason = n.get("reason")
        parts = n.get("partitions")
        out.append(SlurmNode(
            name=name, state=state, flags=flags,
            reason=str(reason) if reason else None,
            reason_user=str(n.get("reason_set_by_user") or "") or None,
            reason_time=_json_time(n.get("reason_changed_at")),
            hostname=str(n.get("hostname") or "") or None, address=str(n.get("address") or "") or None,
            partitions=tuple(str(p) for p in parts) if isinstance(parts, list) else (),
            gpus=gpus, gpus_used=used, gpus_used_idx=tuple(idx) if idx is not None else None,
            cpus=n.get("cpus") if isinstance(n.get("cpus"), int) else None,
            cpus_alloc=n.get("alloc_cpus") if isinstance(n.get("alloc_cpus"), int) else None,
        ))
    return out


# --------------------------------------------------------------------------------------------
# jobs


def _gpus_per_node(text: str) -> int:
    """GPUs per node from squeue's %b (``gres:gpu:2``, ``gres/gpu:2``, ``gpu:2``, ``N/A``)."""
    text = text.strip()
    if text in ("", "N/A", "(null)"):
        return 0
    parts = [p.replace("gres/", "gres:", 1) for p in slurmtext.split_gres(text)]
    return slurmtext.gres(",".join(parts))[0]


def parse_jobs(text: str, command: str = " ".join(SQUEUE_ARGS)) -> list[SlurmJob]:
    """The jobs of ``squeue`` run with ``SQUEUE_ARGS``' format, one a line."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cols = line.strip().split("|", len(SQUEUE_FIELDS) - 1)
        if len(cols) != len(SQUEUE_FIELDS):
            raise SlurmParseError(f"{command}: line {n}: expected {len(SQUEUE_FIELDS)} columns "
                                  f"({'|'.join(SQUEUE_FIELDS)}), got {line.strip()[:80]!r}")
        job_id, user, state, reason, count, gres, nodes = (c.strip() for c in cols)
        if not re.fullmatch(r"\d+(_\d+|_\[[^\]]*\])?(\+\d+)?", job_id):
            raise SlurmParseError(f"{command}: line {n}: expected a job id, got {job_id!r}")
        if not re.fullmatch(r"[A-Z_]+", state):
            raise SlurmParseError(f"{command}: line {n}: expected a job state like RUNNING, got {state!r}")
        try:
            gpus = _gpus_per_node(gres)
            hosts = tuple(slurmtext.hostlist(nodes))
        except SlurmTextError as e:
            raise SlurmParseError(f"{command}: line {n}: {e}") from None
        out.append(SlurmJob(job_id=job_id, user=user, state=state,
                            reason=None if reason in ("None", "", "(null)") else reason,
                            node_count=_int(count), nodes=hosts, gpus_per_node=gpus))
    return out


# --------------------------------------------------------------------------------------------
# accounting: sacct, where slurmdbd keeps it

# sacct's fields as rigdeck asks for them: each job allocation (no steps), its times as epoch
# seconds (SLURM_TIME_FORMAT=%s), its allocated TRES (``gres/gpu=N``: the whole job's GPUs).
SACCT_FIELDS = ("JobIDRaw", "User", "Account", "State", "Start", "End", "AllocTRES", "JobName")
SACCT_SINCE_EVER = "1970-01-02T00:00:00"


def sacct_args(window_s: float | None) -> tuple[str, ...]:
    """``sacct`` on the login host for every user's jobs that ran in the ``window_s`` seconds up to
    now (None: ever), through ``env`` (no shell) for the times as epoch seconds. ``--truncate``
    is not asked: the figures are cut to the window here, from each job's own start and end."""
    start = f"now-{max(0, int(window_s))}seconds" if window_s is not None else SACCT_SINCE_EVER
    return ("env", "SLURM_TIME_FORMAT=%s", "sacct", "--allusers", "--allocations", "--noheader", "--parsable2",
            "--format=" + ",".join(SACCT_FIELDS), f"--starttime={start}", "--endtime=now")


@dataclass(frozen=True)
class SacctJob:
    """One job allocation in Slurm's accounting."""

    job_id: str
    user: str
    account: str
    state: str  # "COMPLETED", "RUNNING", "CANCELLED by 0" as sacct says it
    start: float | None  # None: it never started
    end: float | None  # None: it runs still
    gpus: int  # the whole job's
    name: str

    @property
    def rigdeck_job(self) -> str | None:
        """The rigdeck job it ran (rigdeck names its Slurm jobs ``rigdeck:<job id>``)."""
        return self.name[len("rigdeck:"):] if self.name.startswith("rigdeck:") else None


def _tres_gpus(text: str) -> int:
    """The GPUs of sacct's ``AllocTRES`` (``cpu=2,gres/gpu=2,mem=1G,node=1``; typed ones, like
    ``gres/gpu:a100=2``, when it names no total)."""
    total, typed = None, 0
    for item in text.split(","):
        key, _, value = item.strip().partition("=")
        if key == "gres/gpu" or key.startswith("gres/gpu:"):
            if not value.isdigit():
                raise SlurmParseError(f"AllocTRES {text!r}: expected a GPU count in {item!r}")
            if key == "gres/gpu":
                total = int(value)
            else:
                typed += int(value)
    return total if total is not None else typed


def _epoch(text: str, what: str) -> float | None:
    text = text.strip()
    if text in ("", "Unknown", "None", "N/A"):
        return None
    if not text.isdigit():
        raise SlurmParseError(f"{what} {text!r}: expected epoch seconds (SLURM_TIME_FORMAT=%s) or Unknown")
    return float(text)


def parse_sacct(text: str, command: str = "sacct") -> list[SacctJob]:
    """The job allocations of ``sacct`` run with ``sacct_args``, one a line (``--parsable2``: the
    job name, last, may hold a ``|``)."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cols = line.split("|", len(SACCT_FIELDS) - 1)
        if len(cols) != len(SACCT_FIELDS):
            raise SlurmParseError(f"{command}: line {n}: expected {len(SACCT_FIELDS)} fields "
                                  f"({'|'.join(SACCT_FIELDS)}), got {line.strip()[:80]!r}")
        job_id, user, account, state, start, end, tres, name = cols
        if not re.fullmatch(r"\d+", job_id.strip()):
            raise SlurmParseError(f"{command}: line {n}: expected a job id, got {job_id.strip()!r}")
        try:
            job = SacctJob(job_id=job_id.strip(), user=user.strip(), account=account.strip(), state=state.strip(),
                           start=_epoch(start, "Start"), end=_epoch(end, "End"), gpus=_tres_gpus(tres),
                           name=name.strip())
        except SlurmParseError as e:
            raise SlurmParseError(f"{command}: line {n}: {e}") from None
        out.append(job)
    return out


def sacct_usage_records(jobs: Sequence[SacctJob]) -> list[dict[str, Any]]:
    """Slurm's jobs as the usage figures read jobs (tui.model.usage: one attempt from its start to
    its end, or now, holding its GPUs); a job rigdeck launched keeps rigdeck's job id, another is
    ``slurm:<id>``. A job that never started holds nothing and is left out."""
    out = []
    for j in jobs:
        if j.start is None:
            continue
        out.append({"job_id": j.rigdeck_job or f"slurm:{j.job_id}", "user": j.user or None, "created": j.start,
                    "state": "running" if j.end is None else "ended", "ended": j.end,
                    "events": [{"event": "started", "time": j.start, "gpus": j.gpus}]})
    return out


def _json_word(value: Any) -> str:
    if isinstance(value, list):  # 23.02+: ["RUNNING"]
        return str(value[0]) if value else ""
    return str(value or "")


def parse_jobs_json(text: str, command: str = "squeue") -> list[SlurmJob]:
    """The jobs of ``squeue --json``."""
    out = []
    for j in _json(text, "jobs", command):
        job_id = j.get("job_id")
        if not isinstance(job_id, int):
            raise SlurmParseError(f"{command} --json: expected every job to have a numeric job_id")
        state = _json_word(j.get("job_state")).upper()
        if not state:
            raise SlurmParseError(f"{command} --json: job {job_id}: expected a job_state")
        reason = _json_word(j.get("state_reason"))
        count = j.get("node_count")
        if isinstance(count, Mapping):
            count = count.get("number")
        try:
            hosts = tuple(slurmtext.hostlist(str(j.get("nodes") or "")))
            gpus = _gpus_per_node(str(j.get("tres_per_node") or ""))
        except SlurmTextError as e:
            raise SlurmParseError(f"{command} --json: job {job_id}: {e}") from None
        out.append(SlurmJob(job_id=str(job_id), user=str(j.get("user_name") or ""), state=state,
                            reason=None if reason in ("None", "") else reason,
                            node_count=count if isinstance(count, int) else None,
                            nodes=hosts, gpus_per_node=gpus))
    return out


def by_name(nodes: Sequence[SlurmNode]) -> dict[str, SlurmNode]:
    return {n.name: n for n in nodes}


def node_of(nodes: Sequence[SlurmNode], *names: str | None) -> SlurmNode | None:
    """The node a host is in Slurm: the one whose name, hostname or address is one of ``names``
    (an inventory host's name, address, the hostname it reports), by name first."""
    wanted = [n for n in names if n]
    for key in ("name", "hostname", "address"):
        for node in nodes:
            if getattr(node, key) in wanted:
                return node
    return None


def drain_text(node: SlurmNode) -> str | None:
    """Why a drained or down node is, as a line: its reason, who set it and when; None for a
    node that is neither."""
    if not (node.drained or node.down):
        return None
    what = "drained" if node.drained else "down"
    who = " ".join(p for p in (f"by {node.reason_user}" if node.reason_user else "",
                               f"at {node.reason_time}" if node.reason_time else "") if p)
    return f"{what} in Slurm: {node.reason or 'no reason given'}" + (f" ({who})" if who else "")


def agent_node_text(said: Any) -> str | None:
    """What a host's agent said of its own Slurm node (``{"node", "state", "reason"}`` as
    scontrol wrote them: agent/slurmnode.py) as ``drain_text`` words it, when Slurm keeps its
    jobs off the node; None when it does not. Text that does not read as a node's state is said
    as it came (the host is kept out all the same: its agent found it unavailable)."""
    if not isinstance(said, Mapping):
        return None
    name, state, reason = (str(said.get(k) or "")[:500] for k in ("node", "state", "reason"))
    try:
        base, flags = _state(state, "node")
    except SlurmParseError:
        return f"unavailable in Slurm: state {state!r}"
    text, who, when = _reason(reason)
    node = SlurmNode(name=name or "?", state=base, flags=flags, reason=text, reason_user=who, reason_time=when)
    if state.split("+")[0].endswith("*"):  # "IDLE*": slurmctld hears nothing from its slurmd
        node = SlurmNode(name=node.name, state="down", flags=(*node.flags, "NOT_RESPONDING"),
                         reason=text, reason_user=who, reason_time=when)
    return drain_text(node) or f"unavailable in Slurm: state {state!r}"


# --------------------------------------------------------------------------------------------
# reading Slurm on the login host (through a client's ``exec``: the faces share this)


class SlurmReadError(Exception):
    """Slurm's state could not be read: the message says where, which command and what it said."""


# ``exec(hosts, argv, timeout_s)`` -> host -> the agent's answer (a dict) or what kept it from one.
Exec = Callable[[list[str], list[str], float], Mapping[str, Any]]


def login_of(inventory: Any) -> str:
    """The inventory host whose agent runs Slurm's commands (``[slurm]`` login, else the first
    host); a SlurmReadError when it is no inventory host (an inventory file makes a login alias a
    host of its own: one built otherwise may lack it) or there is no ``[slurm]``."""
    spec = getattr(inventory, "slurm", None)
    if spec is None:
        raise SlurmReadError("the inventory has no [slurm] table")
    login = spec.login_host(inventory.hosts)
    names = list(inventory.names)
    if login not in names:
        raise SlurmReadError(f"[slurm] login {login!r}: Slurm's state is read through an inventory "
                             f"host's agent; {login!r} is none ({', '.join(names) or 'no hosts'})")
    return str(login)


def run_on_login(exec_: Exec, inventory: Any, argv: Sequence[str], what: str) -> tuple[str, str]:
    """(login host, what ``argv`` printed there); a SlurmReadError naming ``what``, the host, the
    command and what it said when it could not run or failed."""
    login = login_of(inventory)
    try:
        result = exec_([login], list(argv), READ_TIMEOUT_S)[login]
    except NotImplementedError:
        raise SlurmReadError(f"{what} not read: this client runs no command on a host, and its server "
                             f"runs only Slurm's reads of its nodes and queue ({' '.join(argv)} is neither)") from None
    except Exception as e:  # the client could not ask (a lost link)
        raise SlurmReadError(f"{what} not read on {login}: {type(e).__name__}: {e}") from None
    if not isinstance(result, Mapping):
        raise SlurmReadError(f"{what} not read on {login}: {result}")
    if result.get("exit_code") != 0:
        said = str(result.get("stderr") or result.get("error") or "").strip() or f"exit {result.get('exit_code')}"
        raise SlurmReadError(f"{what} not read on {login}: {' '.join(argv)}: {said}")
    return login, str(result.get("stdout") or "")


def read_nodes(exec_: Exec, inventory: Any) -> list[SlurmNode]:
    """Slurm's nodes, read with ``scontrol -o show nodes`` on the login host."""
    login, out = run_on_login(exec_, inventory, NODES_ARGS, "Slurm's nodes")
    try:
        return parse_nodes(out, " ".join(NODES_ARGS))
    except SlurmParseError as e:
        raise SlurmReadError(f"Slurm's nodes not read on {login}: {e}") from None


def read_jobs(exec_: Exec, inventory: Any) -> list[SlurmJob]:
    """Slurm's queue (every user's pending and running jobs), read with squeue on the login host."""
    login, out = run_on_login(exec_, inventory, SQUEUE_ARGS, "Slurm's queue")
    try:
        return parse_jobs(out)
    except SlurmParseError as e:
        raise SlurmReadError(f"Slurm's queue not read on {login}: {e}") from None


def node_index(nodes: Sequence[SlurmNode]) -> Callable[..., SlurmNode | None]:
    """``node_of`` for many hosts: a function of a host's names (its inventory name, the hostname
    it reports, its address) giving its node, by name first, then hostname, then address; a
    lookup costs a few dict reads, not a pass over every node."""
    keyed = [{getattr(n, key): n for n in reversed(nodes) if getattr(n, key)}
             for key in ("name", "hostname", "address")]

    def find(*names: str | None) -> SlurmNode | None:
        for index in keyed:
            for name in names:
                if name and name in index:
                    return index[name]
        return None
    return find


# --------------------------------------------------------------------------------------------
# the [slurm] table checked against Slurm


@dataclass(frozen=True)
class SpecCheck:
    """What Slurm said of the inventory's ``[slurm]`` table: ``errors`` (each naming the field,
    its value and what Slurm said: nothing may run with them) and ``notes`` (what could not be
    checked, and why)."""

    errors: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    version: tuple[int, ...] | None = None  # Slurm's on the login host, when it said it


# The oldest Slurm rigdeck drives: the versions its readers were checked on (recorded 20.11 and
# 22.05 output, tests/data/slurm) and the first with srun's --overlap (SLURM_OVERLAP), which an
# mpirun job's daemons need beside the job hosts' own step in rigdeck's allocation. An older
# Slurm shares a busy allocation's CPUs between steps differently, and prints its own words.
MIN_VERSION = (20, 11)
_VERSION_RE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> tuple[int, ...] | None:
    """``scontrol --version``'s ``slurm 22.05.8`` (``slurm-wlm 22.05.8`` on Debian) -> (22, 5, 8);
    None when it says no version."""
    m = _VERSION_RE.search(text)
    return tuple(int(g) for g in m.groups() if g is not None) if m else None


def _ask(exec_: Exec, login: str, argv: Sequence[str]) -> tuple[bool, str, str, bool]:
    """(whether it exited 0, its stdout, what it said: its stderr or why it did not run, whether
    the agent could not start it at all: not found or not runnable, exit 127 or 126)."""
    try:
        result = exec_([login], list(argv), READ_TIMEOUT_S)[login]
    except NotImplementedError:
        return False, "", "this client runs no command on a host", False
    except Exception as e:  # the client could not ask (a lost link)
        return False, "", f"{type(e).__name__}: {e}", False
    if not isinstance(result, Mapping):
        return False, "", str(result), False
    # what it said: stderr, else why it did not run, else (a failure scontrol prints on stdout,
    # "Partition gpu not found") its stdout
    said = " ".join(str(result.get("stderr") or result.get("error")
                        or (result.get("stdout") if result.get("exit_code") != 0 else "") or "").split())
    if result.get("timed_out"):
        said = f"no answer in {READ_TIMEOUT_S:.0f} s"
    ok = result.get("exit_code") == 0
    unstarted = result.get("exit_code") in (126, 127) and bool(result.get("error"))
    return ok, str(result.get("stdout") or ""), said or ("" if ok else f"exit {result.get('exit_code')}"), unstarted


def _partition_names(text: str) -> list[str]:
    try:
        return [r.get("PartitionName", "").strip() for r in slurmtext.records(text, "PartitionName")]
    except SlurmTextError:
        return []


def check_spec(exec_: Exec, inventory: Any) -> SpecCheck:
    """The ``[slurm]`` table checked against the Slurm its login host reaches, before anything
    runs there: ``login`` has Slurm's commands and they reach a cluster (``scontrol -o show
    partition``); ``partition`` is one of its partitions; ``account`` and
    ``qos`` are in its accounting database (``sacctmgr``), where it has one: without slurmdbd
    they are not checked (a note says so and what sacctmgr said; sbatch checks them then).
    ``constraint`` is not checked (Slurm matches features per node at submission). Slurm older
    than ``MIN_VERSION`` is refused, naming its version and what rigdeck needs of a newer one."""
    spec = inventory.slurm
    where = f"{inventory.path}: [slurm]" if getattr(inventory, "path", None) else "[slurm]"
    try:
        login = login_of(inventory)
    except SlurmReadError as e:
        return SpecCheck((f"{inventory.path}: {e}" if getattr(inventory, "path", None) else str(e),))
    argv = ("scontrol", "-o", "show", "partition")
    ok, out, said, unstarted = _ask(exec_, login, argv)
    if unstarted:
        return SpecCheck((f"{where} login {login!r}: no Slurm commands there: {said}",))
    if not ok:
        return SpecCheck((f"{where} login {login!r}: Slurm's commands there reach no Slurm cluster: "
                          f"scontrol -o show partition: {said}",))
    errors: list[str] = []
    notes: list[str] = []
    version_ok, version_out, version_said, _ = _ask(exec_, login, ("scontrol", "--version"))
    version = parse_version(version_out) if version_ok else None
    if version is None:
        notes.append(f"{where} login {login!r}: Slurm's version not read (scontrol --version: "
                     f"{version_said or version_out.strip()[:80] or 'nothing'}); rigdeck needs "
                     f"{'.'.join(map(str, MIN_VERSION))} or newer")
    elif version < MIN_VERSION:
        shown = _VERSION_RE.search(version_out).group(0)  # type: ignore[union-attr]  # as Slurm wrote it
        return SpecCheck((f"{where} login {login!r}: Slurm {shown} there is older "
                          f"than rigdeck drives: expected Slurm {MIN_VERSION[0]}.{MIN_VERSION[1]:02d} or newer "
                          "(srun's --overlap for an mpirun job's daemons, and squeue's and scontrol's "
                          "output as rigdeck reads it)",), version=version)
    partitions = _partition_names(out)
    if spec.partition is not None and spec.partition not in partitions:
        known, _, said, _ = _ask(exec_, login, ("scontrol", "-o", "show", "partition", spec.partition))
    if spec.partition is not None and spec.partition not in partitions and not known:  # (a hidden one is known)
        errors.append(f"{where} partition {spec.partition!r}: Slurm has no such partition: "
                      f"{said or 'scontrol show partition does not list it'} (its partitions: "
                      f"{', '.join(partitions) or 'none'})")
    for field, entity, column in (("account", "account", "Account"), ("qos", "qos", "Name")):
        value = getattr(spec, field)
        if value is None:
            continue
        ok, out, said, _ = _ask(exec_, login, ("sacctmgr", "--noheader", "--parsable2", "show", entity, value,
                                            f"format={column}"))
        if not ok:
            notes.append(f"{where} {field} {value!r} not checked: Slurm has no accounting database here "
                         f"(sacctmgr: {said}); sbatch checks it when a job is submitted")
        elif value.lower() not in [line.strip().lower() for line in out.splitlines()]:  # Slurm lowers them
            errors.append(f"{where} {field} {value!r}: Slurm's accounting database has no such {field} "
                          f"(sacctmgr show {entity} {value} lists none)")
    return SpecCheck(tuple(errors), tuple(notes), version)


# --------------------------------------------------------------------------------------------
# a job rigdeck submits (tui/control/engines.py): what sbatch is asked for, what Slurm allocated

# Slurm's job states after which it runs nothing more (squeue and scontrol's words).
ENDED_STATES = ("BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
                "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT", "SPECIAL_EXIT", "REVOKED")


def job_name(job_id: str) -> str:
    """The Slurm job name of a rigdeck job (squeue's NAME column)."""
    return f"rigdeck:{job_id}"


def slurm_time(seconds: float) -> str:
    """``--time`` for a limit of ``seconds`` (rounded up to whole minutes): ``D-HH:MM:00``."""
    minutes = max(1, -(-int(seconds) // 60))
    days, rest = divmod(minutes, 24 * 60)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00"


def sbatch_options(job_id: str, *, nodes: int, gpus_per_node: int | None, runtime_s: float,
                   partition: str | None = None, account: str | None = None, qos: str | None = None,
                   constraint: str | None = None, exclude: Sequence[str] = (),
                   nodelist: Sequence[str] = ()) -> list[str]:
    """sbatch's options for a rigdeck job: ``nodes`` nodes, one task each (its job host), GPUs per
    node as ``--gres=gpu:N``, a time limit of ``runtime_s`` (the job's max_runtime and its stop's
    grace: rigdeck's own limit comes first), the partition, account, QOS and constraint given,
    the Slurm nodes to ``exclude`` (``--exclude=a,b``: nodes rigdeck drains or lost), and those of
    a spec's ``hosts`` (``--nodelist=a,b``: the job runs on exactly them).
    Each is one ``--name=value`` argument:
    no value is read by a shell (agent/slurmstep.py checks the names)."""
    opts = [f"--nodes={int(nodes)}", "--ntasks-per-node=1", f"--job-name={job_name(job_id)}",
            f"--time={slurm_time(runtime_s)}"]
    if gpus_per_node:
        opts.append(f"--gres=gpu:{int(gpus_per_node)}")
    for name, value in (("partition", partition), ("account", account), ("qos", qos),
                        ("constraint", constraint)):
        if value:
            opts.append(f"--{name}={value}")
    if exclude:
        opts.append("--exclude=" + ",".join(sorted(set(exclude))))
    if nodelist:
        opts.append("--nodelist=" + ",".join(sorted(set(nodelist))))
    return opts


@dataclass(frozen=True)
class SlurmJobDetail:
    """One job as ``scontrol -d show job <id>`` tells it: its state, why it waits, and (once it
    runs) its nodes in Slurm's order with the GPU indices it holds on each."""

    job_id: str
    state: str  # "PENDING", "RUNNING", "CANCELLED", ...
    reason: str | None
    nodes: tuple[str, ...]
    gpus: Mapping[str, tuple[int, ...]]  # node -> GPU indices (none asked: absent)

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES


def parse_job_detail(text: str, command: str = "scontrol -d show job") -> SlurmJobDetail:
    try:
        recs = slurmtext.records(text, "JobId")
    except SlurmTextError as e:
        raise SlurmParseError(f"{command}: {e}") from None
    if not recs:
        raise SlurmParseError(f"{command}: expected a JobId= record, got {text[:80]!r}")
    r = recs[0]
    state = (r.get("JobState") or "").split()[0].upper() if r.get("JobState") else ""
    if not state:
        raise SlurmParseError(f"{command}: the job has no JobState=")
    try:
        nodes = tuple(slurmtext.hostlist(r["NodeList"])) if _none(r.get("NodeList")) else ()
        gpus = {n: tuple(g) for n, g in slurmtext.job_node_gpus(text).items()}
    except SlurmTextError as e:
        raise SlurmParseError(f"{command}: {e}") from None
    # Reason runs to the end of its line in scontrol's free-text rule: the keys after it go
    reason = _none(re.split(r"\s+[A-Za-z][A-Za-z0-9_:]*=", r.get("Reason") or "")[0])
    return SlurmJobDetail(job_id=r["JobId"].strip(), state=state, reason=None if reason == "None" else reason,
                          nodes=nodes, gpus=gpus)
