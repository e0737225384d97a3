"""The cluster map's data: who holds each GPU, a stable colour slot per job, the per-user
summary, and how a cursor moves over hosts packed many to a line. Plain functions over the
views (no I/O, no Textual): the map widget draws what these return.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from operator import attrgetter

from tui.model.hostviews import GpuView, HostView
from tui.model.jobstate import TERMINAL
from tui.model.jobview import JobRow

MODES = ("util", "memory", "job")
MODE_LABELS = {"util": "utilization", "memory": "memory fill", "job": "job"}
UNKNOWN_USER = "?"


def slurm_job_text(job_id: str | None, user: str | None) -> str:
    """How the app names a GPU's Slurm job: ``slurm job 12, user alice``."""
    return f"slurm job {job_id or '?'}, user {user or UNKNOWN_USER}"


def slurm_holder_id(job_id: str | None) -> str:
    """A Slurm job's id as a holder's ``job_id``: ``slurm job 12``, never one of rigdeck's."""
    return f"slurm job {job_id or '?'}"


@dataclass(frozen=True, slots=True)
class Holder:
    """What holds a GPU: a job (``job_id``, with its ``user`` when known), processes that
    belong to no job (``foreign``, ``user`` the first one's), or nothing. ``slurm``: the job is
    one Slurm allocated the GPU to (``job_id`` is then ``slurm job <Slurm's id>``)."""

    job_id: str | None = None
    user: str | None = None
    foreign: bool = False
    slurm: bool = False

    @property
    def free(self) -> bool:
        return self.job_id is None and not self.foreign


FREE = Holder()


def live_placements(rows: Iterable[JobRow]) -> dict[tuple[str, int], str]:
    """(host, GPU index) -> the job placed there, for every job that has not ended: a GPU a job
    was given counts as held before its ranks show up in the GPU's processes."""
    placed: dict[tuple[str, int], str] = {}
    for r in rows:
        if r.state in TERMINAL:
            continue
        for node in r.placement:
            host = node.get("host")
            for gpu in node.get("gpus") or ():
                placed.setdefault((str(host), int(gpu)), r.job_id)
    return placed


def holder_of(g: GpuView, placed: Mapping[tuple[str, int], str]) -> Holder:
    """The GPU's holder: its processes' job first, then its host's claim, then the placement of
    a live job; the user from the claim, else from the job's process. Processes of no job make
    it held by their user (``foreign``). A GPU Slurm allocated to a job (its claim's
    ``scheduler``) is that Slurm job's, unless one of rigdeck's jobs runs on it."""
    claim = g.claim
    job = None
    user = claim.user if claim is not None else None
    foreign_user = None
    for p in g.processes:
        if p.job_id:
            if job is None:
                job = p.job_id
            if user is None and p.job_id == job:
                user = p.user
        elif foreign_user is None:
            foreign_user = p.user or UNKNOWN_USER
    if job is None and claim is not None and claim.scheduler == "slurm":  # someone's Slurm job
        return _holder(slurm_holder_id(claim.job_id), claim.user or UNKNOWN_USER, False, True)
    if job is None and claim is not None and claim.job_id:
        job = claim.job_id
    if job is None:
        job = placed.get((g.host, g.index))
    if job is not None:
        return _holder(job, user, False)
    if foreign_user is not None:
        return _holder(None, foreign_user, True)
    return FREE


@lru_cache(maxsize=4096)
def _holder(job: str | None, user: str | None, foreign: bool, slurm: bool = False) -> Holder:
    """One shared Holder for each (job, user, foreign): a frozen dataclass costs microseconds to
    make, and a second in which the GPUs change hands (a wave of jobs starting) makes thousands."""
    return Holder(job, user, foreign, slurm)


_PROCESSES, _CLAIM, _INDEX = attrgetter("processes"), attrgetter("claim"), attrgetter("index")


def holders(
    snapshot: Sequence[HostView],
    placed: Mapping[tuple[str, int], str],
    before: tuple[Sequence[HostView], Sequence[tuple[Holder, ...]]] | None = None,
) -> list[tuple[Holder, ...]]:
    """Each host's GPUs' holders, in the snapshot's order (GPUs in index order).

    ``before``: the (snapshot, holders) of the last call with the same ``placed``. A GPU whose
    processes are the same tuple (the state keeps a GPU's process views while its processes do
    not change) and whose claim is equal keeps its holder: a second of samples costs the
    GPUs whose holders may have changed."""
    old: dict[str, tuple[HostView, tuple[Holder, ...]]] = {}
    if before is not None:
        old = {h.name: (h, hs) for h, hs in zip(before[0], before[1], strict=False)}
    out = []
    for h in snapshot:
        gpus = h.gpus or ()
        prev = old.get(h.name)
        if prev is None or prev[0].gpus is None or len(prev[0].gpus) != len(gpus):
            out.append(tuple(holder_of(g, placed) for g in gpus))
            continue
        pgpus, phs = prev[0].gpus, prev[1]
        if (list(map(_PROCESSES, gpus)) == list(map(_PROCESSES, pgpus))
                and list(map(_CLAIM, gpus)) == list(map(_CLAIM, pgpus))
                and list(map(_INDEX, gpus)) == list(map(_INDEX, pgpus))):
            out.append(phs)  # the whole host as it was: compared in C, not GPU by GPU
            continue
        out.append(tuple(
            phs[i] if (p.processes is g.processes and p.claim == g.claim and p.index == g.index)
            else holder_of(g, placed)
            for i, (g, p) in enumerate(zip(gpus, pgpus, strict=True))
        ))
    return out


def assign_slots(previous: Mapping[str, int], jobs: Iterable[str], n: int) -> dict[str, int]:
    """A colour slot (0..n-1) per job: a job keeps the slot it had; a new one takes the lowest
    slot no job shown has, or (all taken) one from its id's hash, the same on every run."""
    out: dict[str, int] = {}
    new: list[str] = []
    for j in jobs:
        if j in out:
            continue
        if j in previous:
            out[j] = previous[j]
        else:
            out[j] = -1
            new.append(j)
    used = {s for s in out.values() if s >= 0}
    free = [s for s in range(n) if s not in used]
    for j in sorted(new):
        out[j] = free.pop(0) if free else zlib.crc32(j.encode()) % n
    return out


@dataclass(frozen=True, slots=True)
class UserLine:
    """One user's share: GPUs held, per job (job id, GPUs) most first, and GPUs their
    processes hold outside any job (``other``)."""

    user: str
    gpus: int
    jobs: tuple[tuple[str, int], ...]
    other: int


@dataclass(frozen=True, slots=True)
class Summary:
    users: tuple[UserLine, ...]  # most GPUs first, then by name
    gpus: int
    held: int
    free: int
    unreachable: int  # GPUs of hosts that are not up (their last known holders are counted)


def user_summary(snapshot: Sequence[HostView], held_by: Sequence[tuple[Holder, ...]]) -> Summary:
    """Who holds how many GPUs, in which jobs (``held_by`` as ``holders`` makes it)."""
    per_user: dict[str, dict[str, int]] = {}
    other: dict[str, int] = {}
    gpus = held = unreachable = 0
    for h, hs in zip(snapshot, held_by, strict=False):
        gpus += len(hs)
        if h.status != "up":
            unreachable += len(hs)
        for who in hs:
            if who.free:
                continue
            held += 1
            user = who.user or UNKNOWN_USER
            if who.job_id is not None:
                jobs = per_user.setdefault(user, {})
                jobs[who.job_id] = jobs.get(who.job_id, 0) + 1
            else:
                other[user] = other.get(user, 0) + 1
                per_user.setdefault(user, {})
    lines = []
    for user, jobs in per_user.items():
        n_other = other.get(user, 0)
        ordered = tuple(sorted(jobs.items(), key=lambda kv: (-kv[1], kv[0])))
        lines.append(UserLine(user, sum(jobs.values()) + n_other, ordered, n_other))
    lines.sort(key=lambda u: (-u.gpus, u.user))
    return Summary(tuple(lines), gpus, held, gpus - held, unreachable)


# ---------------------------------------------------------------------------------------------
# Layout and cursor


@dataclass(frozen=True, slots=True)
class Grid:
    """Hosts packed ``per_line`` to a line, each a block ``block`` characters wide: a label of
    ``label`` characters, a space, ``slots`` GPU cells of ``cell`` characters each, a space."""

    hosts: int
    per_line: int
    label: int
    slots: int
    cell: int

    @property
    def block(self) -> int:
        return self.label + 1 + self.slots * self.cell + 1

    @property
    def lines(self) -> int:
        return -(-self.hosts // self.per_line) if self.hosts else 0

    def place(self, host_pos: int) -> tuple[int, int]:
        """(line, x of the block's first character) of the host at ``host_pos``."""
        line, col = divmod(host_pos, self.per_line)
        return line, col * self.block

    def cell_x(self, host_pos: int, gpu_pos: int) -> int:
        return self.place(host_pos)[1] + self.label + 1 + gpu_pos * self.cell

    def at(self, x: int, line: int) -> tuple[int, int | None] | None:
        """(host position, GPU position or None for its label) at a point, or None."""
        col, off = divmod(x, self.block)
        if col >= self.per_line:
            return None
        pos = line * self.per_line + col
        if pos >= self.hosts or line < 0:
            return None
        off -= self.label + 1
        if off < 0:
            return pos, None
        gpu = off // self.cell
        return (pos, gpu) if gpu < self.slots else None


def grid_for(
    names: Sequence[str], slots: int, width: int, height: int, max_label: int = 12
) -> Grid:
    """The layout for hosts ``names`` with up to ``slots`` GPUs each in ``width`` x ``height``:
    the widest cells (3, 2, then 1 character) with which every line fits the height, else
    1-character cells and as many hosts per line as the width takes (the map scrolls)."""
    label = max(1, min(max_label, max((len(n) for n in names), default=1)))
    slots = max(slots, 4)  # room for "down" on a host with no GPU known
    n = len(names)
    height = max(1, height)
    for cell in (3, 2, 1):
        most = max(1, width // Grid(n, 1, label, slots, cell).block)  # hosts a line can take
        if -(-n // most) <= height or cell == 1:
            # As few hosts to a line as the height allows: a small cluster gets a line each.
            per_line = min(most, max(1, -(-n // height)))
            return Grid(n, per_line, label, slots, cell)
    raise AssertionError("unreachable")


def host_label(name: str, width: int) -> str:
    return name if len(name) <= width else name[: max(0, width - 1)] + "…"


def move(
    cursor: tuple[int, int], key: str, counts: Sequence[int], per_line: int
) -> tuple[int, int]:
    """The cursor (host position, GPU position) after an arrow key: left and right step over
    GPUs and on into the next host's; up and down go to the host a line above or below, at the
    same GPU or its last one. A host with no GPU has one position (0)."""
    if not counts:
        return (0, 0)
    host, gpu = cursor
    host = min(max(host, 0), len(counts) - 1)
    last = max(0, counts[host] - 1)
    gpu = min(max(gpu, 0), last)
    if key == "right":
        if gpu < last:
            return host, gpu + 1
        return (host + 1, 0) if host + 1 < len(counts) else (host, gpu)
    if key == "left":
        if gpu > 0:
            return host, gpu - 1
        return (host - 1, max(0, counts[host - 1] - 1)) if host > 0 else (host, gpu)
    if key in ("up", "down"):
        to = host - per_line if key == "up" else host + per_line
        if 0 <= to < len(counts):
            return to, min(gpu, max(0, counts[to] - 1))
        return host, gpu
    if key == "home":
        return 0, 0
    if key == "end":
        return len(counts) - 1, 0
    return host, gpu
