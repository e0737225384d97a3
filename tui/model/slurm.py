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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from agent import slurmtext
from agent.slurmtext import SlurmTextError

__all__ = [
    "SQUEUE_ARGS",
    "SQUEUE_FIELDS",
    "SlurmJob",
    "SlurmNode",
    "SlurmParseError",
    "drain_text",
    "node_of",
    "parse_jobs",
    "parse_jobs_json",
    "parse_nodes",
    "parse_nodes_json",
]

# squeue's columns as rigdeck asks for them (``squeue --noheader --format=...``): id, user,
# state, pending reason, node count, GRES per node, nodes. The node list comes last: it is the
# one column that can be long; none holds a '|'.
SQUEUE_FIELDS = ("%A", "%u", "%T", "%r", "%D", "%b", "%N")
SQUEUE_ARGS = ("squeue", "--noheader", "--format=" + "|".join(SQUEUE_FIELDS))

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
