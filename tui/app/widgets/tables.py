"""The panels' tables: rows built from snapshots (plain functions), drawn by diff.

Each ``*_rows`` function turns controller state into ``(key, raw values)`` rows; raw values are
small hashable tuples, quantised to what the cell can show, so a row whose numbers moved below
what the screen can draw changes nothing. Each table renders a cell from its raw value.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import chain, compress
from operator import and_, attrgetter, not_
from typing import Any

from rich.console import RenderableType
from rich.text import Text

from tui.app.widgets.difftable import Col, DiffTable
from tui.app.widgets.format import (
    MEM_THRESHOLDS,
    SPARK,
    Palette,
    bar_cell,
    duration,
    level,
    loss_text,
    marked_simulated,
    placement_cell,
    placement_parts,
    power_cell,
    rate_bytes,
    size_bytes,
    size_mb,
    state_cell,
    state_level,
    step_rate_text,
    temp_cell,
    util_level,
)
from tui.model.gpumap import slurm_job_text
from tui.model.hostviews import GpuView, HostView
from tui.model.jobstate import TERMINAL
from tui.model.jobtext import exit_text
from tui.model.jobview import CheckpointSave, CheckpointView, JobRow, OwnerMove
from tui.model.slurm import SlurmJob, SlurmNode, drain_text, queue_order, queue_where
from tui.model.state import ClusterState


@dataclass(frozen=True)
class Widths:
    """Column widths for a terminal width: bars and sparklines grow with the screen."""

    bar: int
    spark: int
    job: int
    wide: bool
    why: int

    @classmethod
    def for_width(cls, width: int) -> Widths:
        if width >= 150:
            return cls(bar=12, spark=24, job=30, wide=True, why=max(24, width - 100))
        if width >= 110:
            # The GPU view's job column takes the room left over from 120 columns on: a rank's
            # job id, or why its GPU takes none, is read there.
            return cls(bar=10, spark=16, job=max(24, width - 96), wide=False, why=max(16, width - 96))
        return cls(bar=5, spark=8, job=15, wide=False, why=24)


def _text(s: object, style: Any = None) -> Text:
    # Never a str cell: DataTable would read "[h1 r0]" as markup.
    return Text("-" if s is None else str(s), style=style or "", no_wrap=True, overflow="ellipsis")


def percent_bar(raw: tuple[int | None, int, bool], palette: Palette) -> RenderableType:
    """A utilization bar (host CPU, GPU util) from ``(percent, bar width, stale)``."""
    pct, bw, stale = raw
    if pct is None:
        return _text("-", palette["muted"])
    return bar_cell(float(pct), bw, "dim" if stale else util_level(pct), f" {pct:3d}%", palette)


# ---------------------------------------------------------------------------------------------
# Hosts


def host_why(h: HostView, unwell: Sequence[GpuView] = (), slurm: bool = True) -> str:
    """Why a host is not up; for one that is, its node drained or down in Slurm as its agent
    read it (unless ``slurm`` is False: the caller says Slurm's own answer), what of its GPUs
    takes no work (``unwell``: those GPUs, to name each and its reason; else their counts) and
    an agent upgrade waiting."""
    if h.status == "up":
        kept_off = h.host_sample.slurm_unavailable if h.host_sample is not None and slurm else None
        if unwell:
            why = [f"GPU {g.index} {g.health}" + (f": {g.health_reason}" if g.health_reason else "") for g in unwell]
        else:
            why = [gpu_health_text(h)] if h.gpus_unhealthy or h.gpus_drained else []
        if h.upgrade_pending:
            why.append(f"agent upgrade to {h.upgrade_pending} when its jobs end")
        return " · ".join([kept_off, *why] if kept_off else why)
    key = h.host_key
    if h.error_kind == "unknown-host-key" and key:
        return f"unknown host key {key.type or ''} {key.fingerprint or ''}: press t to trust"
    if h.error_kind == "host-key-changed" and key:
        return f"HOST KEY CHANGED: now {key.fingerprint}, known_hosts has {key.expected}"
    return str(h.reason or "")


def gpu_health_text(h: HostView) -> str:
    """``GPUs: 1 unhealthy, 1 drained``: what of a host's GPUs takes no work (the GPU view and
    the map say which and why)."""
    parts = [f"{n} {word}" for n, word in ((h.gpus_unhealthy, "unhealthy"), (h.gpus_drained, "drained")) if n]
    return "GPUs: " + ", ".join(parts) if parts else ""


def why_level(h: HostView) -> str:
    """The palette level of a host's Why cell: a host key problem or an unhealthy GPU is
    critical, a drained GPU a warning, anything else muted."""
    if h.error_kind in ("unknown-host-key", "host-key-changed"):
        return "crit"
    if h.status == "up" and h.gpus_unhealthy:
        return "crit"
    if h.status == "up" and (h.gpus_drained or (h.host_sample is not None and h.host_sample.slurm_unavailable)):
        return "warn"
    return "muted"


@dataclass(frozen=True)
class SlurmNodes:
    """Slurm's nodes as the hosts view last read them (``[slurm]`` inventories only): ``find``
    gives a host's node from its names (``tui.model.slurm.node_index``; None before the first
    read), ``error`` what kept the last read from answering."""

    find: Callable[..., SlurmNode | None] | None = None
    error: str | None = None

    def node(self, h: HostView) -> SlurmNode | None:
        return self.find(h.name, h.hostname, h.address) if self.find is not None else None

    def cell(self, node: SlurmNode | None) -> tuple[str, str]:
        """(Slurm's word for the node's state, as sinfo has it, its palette level)."""
        if self.find is None:
            return ("?", "warn") if self.error else ("…", "muted")
        if node is None:
            return "no node", "muted"
        if node.down:
            return node.short_state, "crit"
        if not node.usable:
            return node.short_state, "warn"
        return node.short_state, "ok"


def slurm_why(node: SlurmNode | None) -> str:
    """Why Slurm keeps a node from new jobs (its reason, who set it and when), or ""."""
    return (drain_text(node) or "") if node is not None else ""


def host_rows(snapshot: Sequence[HostView], w: Widths,
              slurm: SlurmNodes | None = None) -> list[tuple[str, tuple[Any, ...]]]:
    """The hosts table's rows; with ``slurm`` (an inventory with ``[slurm]``) a Slurm column and
    Slurm's drain or down reason first in the Why column."""
    rows: list[tuple[str, tuple[Any, ...]]] = []
    for h in snapshot:
        s = h.host_sample
        stale = h.status != "up"
        if s is None:
            cpu = mem_used = mem_total = None
        else:
            cpu, mem_used, mem_total = s.cpu_pct, s.mem_used_mb, s.mem_total_mb
        mem_q = (
            None if mem_used is None or not mem_total else round(mem_used / mem_total * w.bar * 8)
        )
        rows.append(
            (
                h.name,
                (
                    h.name,
                    h.status or "connecting",
                    h.hostname or "-",
                    (h.agent_version or "-", bool(h.upgrade_pending)),
                    (None if cpu is None else round(cpu), w.bar, stale),
                    (
                        mem_q,
                        mem_used and size_mb(mem_used),
                        mem_total and size_mb(mem_total),
                        w.bar,
                        stale,
                    ),
                    (h.gpus_busy, h.gpu_count, h.any_simulated, h.gpu_source),
                    (host_why(h, slurm=slurm is None), why_level(h)),
                ),
            )
        )
        if slurm is not None:
            node = slurm.node(h)
            cell = slurm.cell(node)
            why, lvl = rows[-1][1][-1]
            said = slurm_why(node)
            if said:
                why, lvl = " · ".join(p for p in (said, why) if p), "crit" if cell[1] == "crit" else "warn"
            rows[-1] = (h.name, (*rows[-1][1][:-1], cell, (why, lvl)))
    return rows


class HostsTable(DiffTable):
    slurm = False  # a Slurm column (the inventory has [slurm]): set before the columns are

    def columns_for(self, w: Widths) -> list[Col]:
        return [
            Col("host", "Host"),
            Col("state", "State", 10),
            Col("hostname", "Hostname"),
            Col("agent", "Agent", 10),
            Col("cpu", "CPU", w.bar + 5),
            Col("mem", "Memory", w.bar + 12),
            Col("gpus", "GPUs", 9),
            *([Col("slurm", "Slurm", 7)] if self.slurm else []),
            Col("why", "Why", w.why),
        ]

    def render_cell(self, column: str, raw: Any, palette: Palette) -> RenderableType:
        if column == "state":
            return state_cell(raw, palette)
        if column == "agent":
            version, upgrading = raw
            t = _text(version[:8])
            if upgrading:
                t.append(" ↑", style=palette["warn"])
            return t
        if column == "cpu":
            return percent_bar(raw, palette)
        if column == "mem":
            q, used, total, bw, stale = raw
            if q is None:
                return _text("-", palette["muted"])
            pct = 100.0 * q / (bw * 8)
            return bar_cell(
                pct, bw, "dim" if stale else level(pct, MEM_THRESHOLDS), f" {used}/{total}", palette
            )
        if column == "gpus":
            busy, total, sim, source = raw
            if not total:
                return _text("none" if source == "none" else "-", palette["muted"])
            return marked_simulated(f"{busy}/{total}", sim, palette)
        if column in ("why", "slurm"):
            text, lvl = raw
            return _text(text, palette[lvl])
        return _text(raw)


# ---------------------------------------------------------------------------------------------
# GPUs

SORTS = ("host", "util", "memory", "temp", "job")
SORT_LABELS = {
    "host": "host",
    "util": "util ↓",
    "memory": "memory ↓",
    "temp": "temp ↓",
    "job": "job",
}
BUSY_FILTERS = ("all", "busy", "idle")


@dataclass(frozen=True)
class GpuFilter:
    """Which GPUs to show: ``busy`` (all, busy, idle) and free text matched against host and job;
    ``host:NAME`` and ``job:ID`` match one field only."""

    busy: str = "all"
    text: str = ""

    def describe(self) -> str:
        parts = [] if self.busy == "all" else [self.busy]
        if self.text:
            parts.append(repr(self.text))
        return " ".join(parts) or "none"

    def matches(self, host: str, g: GpuView, job_ids: Iterable[str]) -> bool:
        if self.busy != "all" and g.busy != (self.busy == "busy"):
            return False
        jobs = list(job_ids)
        for word in self.text.lower().split():
            if word.startswith("host:"):
                if word[5:] not in host.lower():
                    return False
            elif word.startswith("job:"):
                if not any(word[4:] in j.lower() for j in jobs):
                    return False
            elif word in ("busy", "idle"):
                if g.busy != (word == "busy"):
                    return False
            elif word not in host.lower() and not any(word in j.lower() for j in jobs):
                return False
        return True


def gpu_job_label(g: GpuView) -> tuple[str, str]:
    """(what runs on the GPU, its kind: job | slurm | foreign | idle). A GPU Slurm allocated to
    a job (its claim's ``scheduler``) is that job's, whoever's processes show on it, unless
    rigdeck's own job runs there."""
    jobs: dict[str, list[int]] = {}
    foreign = []
    for p in g.processes:
        if p.job_id:
            ranks = jobs.setdefault(p.job_id, [])
            if p.rank is not None:
                ranks.append(int(p.rank))
        else:
            foreign.append(p)
    if jobs:
        parts = []
        for job_id, ranks in jobs.items():
            rs = ",".join(f"r{r}" for r in sorted(set(ranks)))
            parts.append(f"{job_id} {rs}".strip())
        return " + ".join(parts), "job"
    claim = g.claim
    if claim is not None and claim.scheduler == "slurm":  # someone's Slurm job: theirs, whatever runs
        return slurm_job_text(claim.job_id, claim.user), "slurm"
    if foreign:
        p = foreign[0]
        more = f" +{len(foreign) - 1}" if len(foreign) > 1 else ""
        return f"{p.user or '?'} pid {p.pid}{more}", "foreign"
    if claim is not None and claim.job_id:  # claimed on the host, nothing on it yet
        who = f" ({claim.user})" if claim.user else ""
        return f"{claim.job_id} claimed{who}", "job"
    return "-", "idle"


_SPARK_OF = tuple(int(round(v * (len(SPARK) - 1) / 100.0)) for v in range(101))
_TOP = len(SPARK) - 1


def spark_levels(history: Sequence[float], width: int) -> tuple[int, ...]:
    """The last ``width`` utilization values as sparkline levels (0..7)."""
    tail = history[-width:] if isinstance(history, (list, tuple)) else list(history)[-width:]
    return tuple(
        _SPARK_OF[int(v + 0.5)] if 0.0 <= v <= 100.0 else (0 if v < 0 else _TOP) for v in tail
    )


GpuSource = tuple[str, bool, GpuView]  # (host, host not up, the GPU)


_IS_BUSY = attrgetter("busy")
_PROCESSES = attrgetter("processes")

_SORT_FIELDS = {
    "util": attrgetter("utilization_pct"),
    "memory": attrgetter("memory_used_mb"),
    "temp": attrgetter("temperature_c"),
}


def gpu_key(host: str, g: GpuView) -> str:
    """A GPU's row key: stable while the host has that GPU."""
    return f"{host}/{g.uuid or g.index}"


def gpu_entries(
    snapshot: Sequence[HostView], flt: GpuFilter = GpuFilter(), sort: str = "host"
) -> list[tuple[str, GpuSource]]:
    """(GPU key, source) for every GPU the filter lets through, in the chosen order: the cheap
    pass over every GPU that decides which rows exist and where."""
    items: list[tuple[str, GpuSource]] = []
    unfiltered = flt.busy == "all" and not flt.text
    for h in snapshot:
        host = h.name
        stale = h.status != "up"
        for g in h.gpus or ():
            if not unfiltered and not flt.matches(host, g, g.job_ids):
                continue
            items.append((gpu_key(host, g), (host, stale, g)))
    field = _SORT_FIELDS.get(sort)
    if field is not None:  # the most first; ties by host and index
        items.sort(key=lambda it: (-(field(it[1][2]) or 0), it[1][0], it[1][2].index or 0))
    elif sort == "job":
        labels = {k: gpu_job_label(src[2])[0] for k, src in items}
        items.sort(
            key=lambda it: (
                labels[it[0]] == "-",
                labels[it[0]],
                it[1][0],
                it[1][2].index or 0,
            )
        )
    # "host": snapshot order (the inventory's), GPUs by index
    return items


class GpuOrder:
    """Which GPUs the GPU view shows and in which order, kept from one tick to the next: a
    host's GPUs are looked at again only when its view changed (a new sample, a new status),
    the order is sorted again only when a GPU's sort key changed (one at a time by bisection
    when few did), and the shown list made again only when the order or the filter's verdict
    changed. The same rows in the same order as ``gpu_entries`` gives.

    Positions are GPUs in snapshot order (host, then GPU index); ``tie`` is a position's rank by
    (host name, index), which breaks ties in the sorted orders as ``gpu_entries`` does."""

    def __init__(self) -> None:
        self._for: tuple[Any, ...] | None = None
        self._seen: list[Any] = []  # per host: its GPUs' views last looked at
        self._fresh = True
        self._place: list[tuple[int, int]] = []  # position -> (host position, GPU position)
        self._first: list[int] = []  # host position -> its first GPU's position
        self._keys: list[str] = []  # position -> row key
        self._pos: dict[str, int] = {}  # row key -> position
        self._tie: list[int] = []
        self._by_tie: list[int] = []
        self._sort_key: list[tuple[Any, ...]] = []
        self._sorted: list[tuple[Any, ...]] = []  # every position's sort key, in order
        # After a sort of every key by a number: the values (-value by position) and the
        # positions in order stand for ``_sort_key`` and ``_sorted`` until a few keys change.
        self._values: list[Any] | None = None
        self._positions: list[int] | None = None  # the positions in order (``_sorted``'s)
        self._gpu_of: Callable[[int, int], GpuView | None] | None = None
        self._shown: list[bool] = []
        self._wanted: list[str] = []
        self._memo: list[list[Any] | None] = []  # position -> _memo_of's
        self._names: list[str] = []  # position -> its host's name
        # The text filter's verdicts (position -> bool) and the processes they were made from.
        self._text_for: list[tuple[Any, ...]] | None = None
        self._text_ok: list[bool] = []
        self._hosts: Sequence[HostView] = ()

    def update(
        self,
        snapshot: Sequence[HostView],
        flt: GpuFilter,
        sort: str,
        hosts: Sequence[HostView] | None = None,
        gpu_of: Callable[[int, int], GpuView | None] | None = None,
    ) -> list[str]:
        """The row keys to show, in order, for ``snapshot`` (with its GPUs).

        ``hosts``: the same hosts without their GPU lists (a hosts-only snapshot: its views are
        made again whenever the full ones are), and ``gpu_of(host position, GPU position)``,
        which reads a GPU as it is now. Given both, the order keeps nothing of ``snapshot``
        after this call: the second of samples it holds is freed by whoever replaces it (the
        monitor's readers), not on this thread when the next second comes."""
        names = tuple(h.name for h in snapshot)
        if hosts is None or gpu_of is None or tuple(h.name for h in hosts) != names:
            hosts = snapshot

            def gpu_of(hi: int, gi: int) -> GpuView | None:
                gpus = snapshot[hi].gpus or ()
                return gpus[gi] if gi < len(gpus) else None

        self._hosts, self._gpu_of = hosts, gpu_of
        key = (getattr(snapshot, "layout", None), names, flt, sort)
        if key != self._for or getattr(snapshot, "layout", None) is None:
            self._for = key
            self._lay_out(snapshot, flt)
        # A host's views are made again with each of its samples (and its status): a host whose
        # view is the one seen last time has the same GPUs (what the order reads of them).
        moved = [hi for hi, (now, was) in enumerate(zip(hosts, self._seen, strict=True)) if now is not was]
        if not moved:
            return self._wanted
        self._seen = list(hosts)
        gpu_lists = [h.gpus or () for h in snapshot]
        if sort == "host":
            reordered = False
        elif len(moved) * 4 > len(snapshot):  # most hosts: every key at once
            reordered = self._all_keys(sort, gpu_lists)
        else:
            reordered = self._some_keys(sort, gpu_lists, moved)
        shown_changed = self._fresh
        if not (flt.busy == "all" and not flt.text):
            if len(moved) * 4 > len(snapshot):  # most hosts: every GPU's verdict at once
                shown_changed = self._filter_all(flt, list(chain.from_iterable(gpu_lists))) or shown_changed
            else:
                shown, first = self._shown, self._first
                for hi in moved:
                    pos = first[hi]
                    gpus = gpu_lists[hi]
                    verdicts = self._verdicts(flt, snapshot[hi].name, gpus, pos)
                    if verdicts != shown[pos:pos + len(gpus)]:
                        shown[pos:pos + len(gpus)] = verdicts
                        shown_changed = True
        if reordered or shown_changed:
            keys, shown = self._keys, self._shown
            order = self._order_positions()
            if all(shown):
                self._wanted = list(map(keys.__getitem__, order))
            else:
                self._wanted = list(compress(map(keys.__getitem__, order), map(shown.__getitem__, order)))
        self._fresh = False
        return self._wanted

    def _filter_all(self, flt: GpuFilter, flat: list[GpuView]) -> bool:
        """Every GPU's verdict made again (most hosts sent a sample); True when any changed.
        Loops run in C where they can: a text verdict is made again only for a GPU whose
        processes changed (what its jobs are read from), a busy one read for every GPU."""
        names = self._names
        words = flt.text.lower().split()
        if any(w in ("busy", "idle") for w in words):  # the words read the utilization too
            verdicts = [flt.matches(h, g, g.job_ids) for h, g in zip(names, flat, strict=True)]
        else:
            verdicts = self._text_verdicts(flt, flat) if words else [True] * len(flat)
            if flt.busy != "all":
                busy = map(_IS_BUSY, flat)
                ok = busy if flt.busy == "busy" else map(not_, busy)
                verdicts = list(map(and_, ok, verdicts)) if words else list(ok)
        if verdicts == self._shown:
            return False
        # Its own list: a few hosts' samples change it in place, and the text verdicts it may
        # be made of stand for the processes they were made from.
        self._shown = verdicts if verdicts is not self._text_ok else list(verdicts)
        return True

    def _text_verdicts(self, flt: GpuFilter, flat: list[GpuView]) -> list[bool]:
        """Whether the filter's words match each GPU's host or jobs: kept while the GPU's
        processes are equal to those they were made from."""
        procs = list(map(_PROCESSES, flat))
        kept, ok = self._text_for, self._text_ok
        if kept is not None and procs == kept:
            return ok
        text_only = GpuFilter("all", flt.text)
        names = self._names
        if kept is None or len(kept) != len(procs):
            ok = [text_only.matches(h, g, g.job_ids) for h, g in zip(names, flat, strict=True)]
        else:
            ok = list(ok)
            for p in [p for p, (a, b) in enumerate(zip(procs, kept, strict=True)) if a != b]:
                g = flat[p]
                ok[p] = text_only.matches(names[p], g, g.job_ids)
        self._text_for, self._text_ok = procs, ok
        return ok

    def _order_positions(self) -> list[int]:
        """The positions in the order shown (filtered or not)."""
        if self._positions is None:
            self._positions = [k[-1] for k in self._sorted]
        return self._positions

    def _tuple_keys(self) -> None:
        """Every position's key tuple and their sorted list, from the plain values the last
        sort of every key left (``_some_keys`` and ``_resort`` work on the tuples)."""
        values = self._values
        if values is None:
            return
        self._values = None
        self._sort_key = list(zip(values, self._tie, range(len(values)), strict=True))
        key = self._sort_key
        self._sorted = [key[p] for p in self._order_positions()]

    def _all_keys(self, sort: str, gpu_lists: Sequence[Sequence[GpuView]]) -> bool:
        """Every GPU's sort key made again (most hosts sent a sample); True when any changed
        (the order is sorted again)."""
        flat = list(chain.from_iterable(gpu_lists))
        field = _SORT_FIELDS.get(sort)
        tie = self._tie
        if field is not None:
            # The keys are (-value, tie, position): sorting the positions in tie order by the
            # value alone (a stable sort of plain numbers keeps ties in tie order) gives their
            # order without making or comparing 4,096 tuples; the tuples are made only if a
            # later second changes a few hosts (``_tuple_keys``).
            values = [-(field(g) or 0) for g in flat]
            old = self._values
            if old is None and self._sort_key and len(self._sort_key[0]) == 3:
                old = [k[0] for k in self._sort_key]  # the keys as tuples: this sort's
            if values == old:
                return False
            self._values = values
            self._positions = sorted(self._by_tie, key=values.__getitem__)
            return True
        self._tuple_keys()
        labels = [self._memo_of(p, g)[0] for p, g in enumerate(flat)]
        new = [(lb == "-", lb, t, p) for p, (lb, t) in enumerate(zip(labels, tie, strict=True))]
        if new == self._sort_key:
            return False
        self._sort_key = new
        self._sorted = sorted(new)
        self._positions = None
        return True

    def _some_keys(self, sort: str, gpu_lists: Sequence[Sequence[GpuView]], moved: list[int]) -> bool:
        """The sort keys of the hosts in ``moved`` made again, the order kept by bisection
        (or sorted again when many changed); True when any changed."""
        self._tuple_keys()
        changed: list[tuple[tuple[Any, ...], tuple[Any, ...]]] = []
        sort_key, first = self._sort_key, self._first
        for hi in moved:
            gpus = gpu_lists[hi]
            pos = first[hi]
            end = pos + len(gpus)
            new_keys = self._keys_of(sort, gpus, pos)
            old_keys = sort_key[pos:end]
            if new_keys != old_keys:
                changed += [(o, n) for o, n in zip(old_keys, new_keys, strict=True) if o != n]
                sort_key[pos:end] = new_keys
        if changed:
            self._resort(changed)
            self._positions = None
        return bool(changed)

    def source(self, key: str) -> GpuSource | None:
        """A row's source now: (host, host not up, the GPU)."""
        pos = self._pos.get(key)
        if pos is None or self._gpu_of is None:
            return None
        hi, gi = self._place[pos]
        g = self._gpu_of(hi, gi)
        if g is None:
            return None
        h = self._hosts[hi]
        return (h.name, h.status != "up", g)

    def _lay_out(self, snapshot: Sequence[HostView], flt: GpuFilter) -> None:
        """A new set of GPUs (or filter, or sort): every position made again."""
        self._place = [(hi, gi) for hi, h in enumerate(snapshot) for gi in range(len(h.gpus or ()))]
        self._first = []
        n = 0
        for h in snapshot:
            self._first.append(n)
            n += len(h.gpus or ())
        self._keys = [gpu_key(h.name, g) for h in snapshot for g in h.gpus or ()]
        self._names = [h.name for h in snapshot for _ in h.gpus or ()]
        self._text_for = None
        self._text_ok = []
        self._pos = {k: i for i, k in enumerate(self._keys)}
        names = [(h.name, g.index or 0) for h in snapshot for g in h.gpus or ()]
        self._tie = [0] * n
        self._by_tie = sorted(range(n), key=names.__getitem__)  # positions in tie order
        for rank, pos in enumerate(self._by_tie):
            self._tie[pos] = rank
        self._seen = [None] * len(snapshot)  # nothing seen: every host looked at
        self._sort_key = [(pos,) for pos in range(n)]
        self._sorted = list(self._sort_key)
        self._values = None
        self._positions = None
        self._shown = [flt.busy == "all" and not flt.text] * n
        self._memo = [None] * n
        self._wanted = []
        self._fresh = True  # the shown list is made on the next update, whatever changed

    def _keys_of(self, sort: str, gpus: Sequence[GpuView], pos: int) -> list[tuple[Any, ...]]:
        """The sort keys of one host's GPUs (at positions ``pos``...)."""
        field = _SORT_FIELDS.get(sort)
        tie = self._tie
        if field is not None:  # the most first; ties by host and index
            return [(-(field(g) or 0), tie[p], p) for p, g in enumerate(gpus, pos)]
        if sort == "job":
            labels = [self._memo_of(p, g)[0] for p, g in enumerate(gpus, pos)]
            return [(lb == "-", lb, tie[p], p) for p, lb in enumerate(labels, pos)]
        return [(p,) for p in range(pos, pos + len(gpus))]  # "host": snapshot order

    def _memo_of(self, pos: int, g: GpuView) -> list[Any]:
        """[its job label, text verdicts by filter] of the GPU at ``pos``, kept while its
        processes and claim are the same objects (a host's views reuse them while they do not
        change), so a second of new numbers does not work out every GPU's job again."""
        memo = self._memo[pos]
        if memo is None or memo[2] is not g.processes or memo[3] is not g.claim:
            memo = self._memo[pos] = [gpu_job_label(g)[0], {}, g.processes, g.claim]
        return memo

    def _verdicts(self, flt: GpuFilter, host: str, gpus: Sequence[GpuView], pos: int) -> list[bool]:
        """Whether the filter shows each of a host's GPUs. Its words are matched against the
        host and the GPU's jobs once while those stay (a "busy" or "idle" word, which reads
        the utilization, every time)."""
        words = flt.text.lower().split()
        if any(w in ("busy", "idle") for w in words):
            return [flt.matches(host, g, g.job_ids) for g in gpus]
        text_only = GpuFilter("all", flt.text)
        out = []
        for p, g in enumerate(gpus, pos):
            if flt.busy != "all" and g.busy != (flt.busy == "busy"):
                out.append(False)
                continue
            memo = self._memo_of(p, g)[1]
            ok = memo.get(text_only)
            if ok is None:
                ok = memo[text_only] = text_only.matches(host, g, g.job_ids)
            out.append(ok)
        return out

    def _resort(self, changed: list[tuple[tuple[Any, ...], tuple[Any, ...]]]) -> None:
        """Keep ``_sorted`` in order: by bisection for a few changed keys, else sorted again
        (every key unique: each ends in its position)."""
        order = self._sorted
        if len(changed) * 16 > len(order):
            self._sorted = sorted(self._sort_key)
            return
        for old, new in changed:
            del order[bisect_left(order, old)]
            insort(order, new)


def gpu_raw(src: GpuSource, w: Widths) -> tuple[Any, ...]:
    """One GPU's raw cells, rounded to what a cell shows (0.3% more utilization is no change)."""
    host, stale, g = src
    bw = w.bar
    if g.health in ("unhealthy", "drained"):
        # A failing or drained GPU says so where its job would be: rigdeck is moving that job away.
        why = g.health_reason
        if not why:
            label = g.health
        elif why.startswith(g.health):  # a drain's reason says "drained by WHO: ..." itself
            label = why
        else:
            label = f"{g.health}: {why}"
        job = (label, g.health)
    elif g.processes or (g.claim is not None and g.claim.scheduler == "slurm"):  # Slurm's, even idle
        job = gpu_job_label(g)
    else:
        job = ("-", "idle")
    util = g.utilization_pct
    used, total = g.memory_used_mb, g.memory_total_mb
    if used is None or not total:
        mem: tuple[Any, ...] = (None, "", "muted", bw, stale)
    else:
        pct = 100.0 * used / total
        mem = (
            round(pct * bw * 8 / 100.0),
            f" {size_mb(used)}/{size_mb(total)}",
            level(pct, MEM_THRESHOLDS),
            bw,
            stale,
        )
    temp, power = g.temperature_c, g.power_w
    head: tuple[Any, ...] = (host, (g.index, g.simulated, g.health))
    if w.wide:
        head += (g.name or "-",)
    return head + (
        (None if util is None else int(util + 0.5), bw, stale),
        mem,
        (None if temp is None else int(temp + 0.5), stale),
        (None if power is None else int(power + 0.5), g.power_limit_w, stale),
        job,
        (spark_levels(g.history, w.spark), w.spark, stale),
    )


def gpu_rows(
    snapshot: Sequence[HostView],
    w: Widths,
    flt: GpuFilter = GpuFilter(),
    sort: str = "host",
) -> list[tuple[str, tuple[Any, ...]]]:
    """Every row with its raw cells (what ``GpusTable`` computes lazily for rows out of view)."""
    return [(key, gpu_raw(src, w)) for key, src in gpu_entries(snapshot, flt, sort)]


# A GPU's health beside its index: (mark, palette level); ok shows nothing.
HEALTH_MARKS = {"warn": (" !", "warn"), "unhealthy": (" ✗", "crit"), "drained": (" ⊘", "warn")}


class GpusTable(DiffTable):
    def columns_for(self, w: Widths) -> list[Col]:
        # As wide as its widest cell: "1 sim ✗" needs 7, a healthy simulated GPU's "1 sim" 5.
        cols = [Col("host", "Host"), Col("gpu", "GPU")]
        if w.wide:
            cols.append(Col("name", "Model"))
        cols += [
            Col("util", "Util", w.bar + 5),
            Col("mem", "Memory", w.bar + 12),
            Col("temp", "Temp", 5),
            Col("power", "Power", 9),
            Col("job", "Job / rank", w.job),
            Col("hist", "Util history", w.spark),
        ]
        return cols

    def render_cell(self, column: str, raw: Any, palette: Palette) -> RenderableType:
        if column == "gpu":
            index, sim, health = raw
            cell = marked_simulated(str(index), sim, palette)
            mark = HEALTH_MARKS.get(health)
            if mark is not None:
                cell.append(mark[0], style=palette[mark[1]])
            return cell
        if column == "util":
            return percent_bar(raw, palette)
        if column == "mem":
            q, label, lvl, bw, stale = raw
            if q is None:
                return _text("-", palette["muted"])
            return bar_cell(100.0 * q / (bw * 8), bw, "dim" if stale else lvl, label, palette)
        if column == "temp":
            t, stale = raw
            return (
                _text("-" if t is None else f"{t}°C", palette["dim"])
                if stale
                else temp_cell(t, palette)
            )
        if column == "power":
            p, limit, stale = raw
            if stale:
                return _text("-" if p is None else f"{p}/{limit or 0:.0f}W", palette["dim"])
            return power_cell(p, limit, palette)
        if column == "job":
            label, kind = raw
            look = {"job": "accent", "foreign": "warn", "slurm": "warn", "unhealthy": "crit",
                    "drained": "warn"}.get(kind, "muted")
            return _text(label, palette[look])
        if column == "hist":
            levels, width, stale = raw
            chars = " " * (width - len(levels)) + "".join(SPARK[i] for i in levels)
            return Text(chars, style=palette["dim" if stale else "accent"], no_wrap=True)
        return _text(raw)

    _layout: tuple[Any, ...] | None = None  # what the rows were laid out for (fast path)

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._gpu_order = GpuOrder()  # the sorted or filtered views' order
    _places: dict[str, tuple[int, int]] = {}  # row key -> (host, GPU) position in the snapshot

    def apply_snapshot(
        self, snapshot: Sequence[HostView], w: Widths, flt: GpuFilter, sort: str
    ) -> Any:
        """Every GPU's row exists and is in place; cells are diffed for the rows in view."""

        def gpu_of(hi: int, gi: int) -> GpuView | None:
            gpus = snapshot[hi].gpus or ()
            return gpus[gi] if gi < len(gpus) else None

        return self.apply_live(snapshot, lambda: snapshot, gpu_of, w, flt, sort)

    def apply_state(
        self,
        state: ClusterState,
        hosts: Sequence[HostView],
        w: Widths,
        flt: GpuFilter,
        sort: str,
    ) -> Any:
        """``apply_live`` on a live ``ClusterState``, given its hosts-only snapshot ``hosts``."""
        return self.apply_live(
            hosts, state.snapshot, lambda hi, gi: state.gpu(hosts[hi].name, gi), w, flt, sort
        )

    def apply_live(
        self,
        hosts: Sequence[HostView],
        full: Callable[[], Sequence[HostView]],
        gpu_of: Callable[[int, int], GpuView | None],
        w: Widths,
        flt: GpuFilter,
        sort: str,
    ) -> Any:
        """``apply_snapshot`` for a live cluster: ``hosts`` are the hosts now (their GPU lists
        may be left out), ``full()`` makes a snapshot with every GPU, and ``gpu_of(host
        position, GPU position)`` reads one GPU as it is now.

        Unfiltered and in host order (the default view), the rows and their order depend only
        on which GPUs each host has: while ``hosts.layout`` says that is unchanged, a tick reads
        only the GPUs of the rows in view (the others are read when drawn), and holds on to no
        other GPU's sample, so dropping the last second's samples is not this thread's work."""
        make_raw = partial(gpu_raw, w=w)
        layout = getattr(hosts, "layout", None)
        fast = layout is not None and sort == "host" and flt.busy == "all" and not flt.text
        key = (layout, len(hosts), w)
        if fast and key == self._layout and self.row_count == len(self._places):
            places = self._places

            def source_of(k: str) -> GpuSource | None:
                place = places.get(k)
                if place is None:
                    return None
                h = hosts[place[0]]
                g = gpu_of(*place)
                return None if g is None else (h.name, h.status != "up", g)

            return self.refresh_sources(source_of, make_raw)
        snapshot = full()
        if fast:
            stats = self.apply_sources(gpu_entries(snapshot, flt, sort), make_raw)
        else:  # sorted or filtered: the order kept from tick to tick
            order = self._gpu_order
            wanted = order.update(snapshot, flt, sort, hosts, gpu_of)
            stats = self.apply_keyed(wanted, order.source, make_raw)
        self._layout = None
        if fast:
            self._layout = (getattr(snapshot, "layout", layout), len(snapshot), w)
            self._places = {
                gpu_key(h.name, g): (hi, gi)
                for hi, h in enumerate(snapshot)
                for gi, g in enumerate(h.gpus or ())
            }
        return stats


# ---------------------------------------------------------------------------------------------
# Jobs


def job_rows(rows: Sequence[JobRow], now: float) -> list[tuple[str, tuple[Any, ...]]]:
    out = []
    for r in rows:
        runtime = r.runtime_s(now)
        step = (
            "-"
            if r.step is None
            else (f"{r.step}/{r.total_steps}" if r.total_steps else str(r.step))
        )
        ranks = f"{r.ranks_running}/{r.ranks_total}" if r.ranks_total else "-"
        state = r.state + (f" ↻{r.restarts}" if r.restarts else "")
        out.append(
            (
                r.job_id,
                (
                    r.job_id,
                    (r.state, state, bool(r.unreachable)),
                    ranks,
                    step,
                    loss_text(r.loss),
                    step_rate_text(r.step_rate),
                    None if runtime is None else int(runtime),
                    placement_parts(r.placement),
                    r.checkpoint_owner,
                ),
            )
        )
    return out


class JobsTable(DiffTable):
    def columns_for(self, w: Widths) -> list[Col]:
        return [
            Col("job", "Job"),
            Col("state", "State", 11),
            Col("ranks", "Ranks", 6),
            Col("step", "Step", 11),
            Col("loss", "Loss", 10),
            Col("rate", "Rate", 9),
            Col("runtime", "Runtime", 8),
            Col("placement", "Placement"),
            Col("ckpt", "Checkpoint owner"),
        ]

    def render_cell(self, column: str, raw: Any, palette: Palette) -> RenderableType:
        if column == "state":
            state, label, unreachable = raw
            t = state_cell(label, palette).copy()
            t.stylize(palette[state_level(state)])
            if unreachable:
                t.append(" !", style=palette["warn"])
            return t
        if column == "runtime":
            return _text(duration(raw) if raw is not None else "-")
        if column == "loss":
            return _text(raw, palette["strong"])
        if column == "placement":
            return placement_cell(raw, palette)
        return _text(raw)


def slurm_queue_rows(jobs: Sequence[SlurmJob]) -> list[tuple[str, tuple[Any, ...]]]:
    """Slurm's queue, every user's jobs, pending first: the Jobs view's second table."""
    return [(j.job_id, (j.job_id, j.user, j.state, "-" if j.node_count is None else str(j.node_count),
                        str(j.gpus_per_node), queue_where(j))) for j in queue_order(jobs)]


class SlurmQueueTable(DiffTable):
    def columns_for(self, w: Widths) -> list[Col]:
        return [
            Col("job", "Slurm job", 10),
            Col("user", "User", 10),
            Col("state", "State", 11),
            Col("nodes", "Nodes", 5),
            Col("gpus", "GPUs/node", 9),
            Col("where", "Why pending / where"),
        ]

    def render_cell(self, column: str, raw: Any, palette: Palette) -> RenderableType:
        if column == "state":
            return _text(raw, palette[state_level(str(raw).lower())])
        return _text(raw)


# ---------------------------------------------------------------------------------------------
# One job: ranks and checkpoints


def rank_rows(
    ranks: Sequence[Mapping[str, Any]], placement: Sequence[Mapping[str, Any]] = ()
) -> list[tuple[str, tuple[Any, ...]]]:
    """One row per rank; its GPU marked "sim" when the placement says its host's are simulated."""
    simulated = {n.get("host") for n in placement if n.get("simulated")}
    out = []
    for r in ranks:
        ex = exit_text(r)  # as rigdeck status says it
        gpu = r.get("gpu")
        out.append(
            (
                f"{r.get('rank')}",
                (
                    r.get("rank"),
                    r.get("host"),
                    r.get("local_rank"),
                    (gpu, gpu is not None and r.get("host") in simulated),
                    r.get("pid"),
                    r.get("state") or "-",
                    ex,
                ),
            )
        )
    return out


class RanksTable(DiffTable):
    def columns_for(self, w: Widths) -> list[Col]:
        return [
            Col("rank", "Rank", 5),
            Col("host", "Host"),
            Col("local", "Local", 5),
            Col("gpu", "GPU", 6),
            Col("pid", "PID", 8),
            Col("state", "State", 8),
            Col("exit", "Exit", 7),
        ]

    def render_cell(self, column: str, raw: Any, palette: Palette) -> RenderableType:
        if column == "gpu":
            gpu, sim = raw
            return marked_simulated("-" if gpu is None else str(gpu), sim, palette)
        if column == "state":
            return state_cell(raw, palette)
        if column == "exit":
            return _text(raw, palette["crit"] if raw not in ("-", "0") else None)
        return _text(raw)


def save_rows(view: CheckpointView, now: float) -> list[tuple[str, tuple[Any, ...]]]:
    """Saves and owner moves, newest first; ages from ``now`` rounded to what a cell shows."""
    events: list[tuple[float, str, tuple[Any, ...]]] = []
    for s in view.saves:
        events.append(
            (s.time or 0.0, f"save:{s.step}:{s.owner.rank}:{s.owner.host}", _save_raw(s, now))
        )
    for i, m in enumerate(view.moves):
        events.append((m.time or 0.0, f"move:{i}", _move_raw(m, now)))
    events.sort(key=lambda e: e[0], reverse=True)
    return [(key, raw) for _, key, raw in events]


def _age(t: float | None, now: float) -> str:
    return "-" if t is None else f"{duration(now - t)} ago"


def _save_raw(s: CheckpointSave, now: float) -> tuple[Any, ...]:
    failed = s.status == "failed"
    cells = (
        _age(s.time, now),
        str(s.step),
        s.owner.label(),
        s.status,
        size_bytes(s.bytes) if s.bytes else "-",
        "-" if s.seconds is None else f"{s.seconds:.2f}s",
        rate_bytes(s.speed_bps) if s.speed_bps else "-",
        s.error or "",
    )
    return tuple((c, failed) for c in cells)  # a failed save stands out as a whole row


def _move_raw(m: OwnerMove, now: float) -> tuple[Any, ...]:
    cells = (
        _age(m.time, now),
        "-",
        f"{m.from_.label()} → {m.to.label()}",
        "owner moved",
        "",
        "",
        "",
        m.reason or "",
    )
    return tuple((c, False) for c in cells)


class SavesTable(DiffTable):
    def columns_for(self, w: Widths) -> list[Col]:
        return [
            Col("when", "When", 10),
            Col("step", "Step", 7),
            Col("owner", "Owner"),
            Col("status", "Status", 11),
            Col("size", "Size", 9),
            Col("secs", "Took", 7),
            Col("speed", "Speed", 11),
            Col("note", "Note"),
        ]

    def render_cell(self, column: str, raw: Any, palette: Palette) -> RenderableType:
        value, failed = raw
        if failed:
            return _text(value, palette["crit"])
        if column == "status":
            return (
                state_cell(value, palette)
                if value != "owner moved"
                else _text(value, palette["warn"])
            )
        if column == "note":
            return _text(value, palette["muted"])
        return _text(value)


def jobs_running(rows: Iterable[JobRow]) -> int:
    """Jobs that hold hosts now (starting, running, stopping): not those still waiting (pending,
    queued), which the summary counts apart."""
    return sum(1 for r in rows if r.state not in TERMINAL and r.state not in ("pending", "queued"))
