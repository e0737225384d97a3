"""Job (4): the open job: its head, live signals, incidents, links to its experiment trackers,
loss chart, the panels of its kind (a model-parallel job's stages, a worker-pool job's pools, a
processing job's inputs) and its ranks."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.markup import escape
from textual.style import Style
from textual.widgets import Static

from tui.app.views.base import JOBS, OPEN_JOB, View, set_text
from tui.app.widgets.chart import LossChart
from tui.app.widgets.format import (
    SIM_MARK,
    duration,
    loss_text,
    placement_parts,
    size_bytes,
    state_markup,
    step_rate_text,
)
from tui.app.widgets.pools import PoolsTable, pool_rows, pools_head_markup
from tui.app.widgets.processing import ProcessingTable, processing_head_markup, processing_rows
from tui.app.widgets.stages import StagesTable, stage_rows, stages_head_markup
from tui.app.widgets.tables import RanksTable, rank_rows
from tui.client import describe_cause
from tui.model.jobtext import incident_text
from tui.model.jobview import JobDetail
from tui.model.termsafe import terminal_safe
from tui.model.trackerlinks import TrackerLink

NO_JOB = "no job open: launch one (l), or pick one in Jobs (3) and press enter"


class OpenJobView(View):
    ID, KEY, TITLE = "job", "4", "Job"
    FOLLOWS = frozenset({JOBS, OPEN_JOB})
    TABLES = ("#ranks-table", "#stages-table", "#pools-table", "#processing-table")
    FOCUS = "#ranks-table"

    def compose(self) -> ComposeResult:
        yield Static(NO_JOB, id="job-head", classes="head")
        # Live bottleneck signals (stragglers, input-bound, ...): shown only when any.
        signals = Static("", id="job-signals", classes="head")
        signals.display = False
        yield signals
        # Each time rigdeck's healing stopped the job and what it cost: shown only when any.
        incidents = Static("", id="job-incidents", classes="head")
        incidents.display = False
        yield incidents
        # Links to the job's experiment trackers (W&B, MLflow, TensorBoard): shown only when any.
        links = Static("", id="job-links", classes="head")
        links.display = False
        yield links
        with Vertical(id="job-body"):
            yield LossChart(id="loss")
            # A [model_parallel] job's plan and stages, a job made of worker pools: its pools, a
            # processing job: its inputs and where its outputs are. Each shown only for its kind.
            for name, table in (("stages", StagesTable), ("pools", PoolsTable), ("processing", ProcessingTable)):
                head = Static("", id=f"{name}-head", classes="head")
                head.display = False
                yield head
                panel = table(id=f"{name}-table")
                panel.display = False
                yield panel
            yield RanksTable(id="ranks-table")

    def setup(self) -> None:
        self.query_one("#loss", LossChart).border_title = "loss by step"
        self.query_one("#ranks-table").border_title = "ranks"
        self.query_one("#stages-table").border_title = "stages: expected vs measured, per step"
        self.query_one("#pools-table").border_title = "pools"
        self.query_one("#processing-table").border_title = "processing inputs"

    def update(self, now: float) -> None:
        shell = self.shell
        detail = shell.jobwatch.detail(shell.job_id) if shell.job_id else None
        head = self.query_one("#job-head", Static)
        chart = self.query_one("#loss", LossChart)
        ranks = self.query_one("#ranks-table", RanksTable)
        self._update_signals(detail)
        self._update_incidents(detail)
        self._update_links(detail)
        self._update_panel("stages", detail.stages if detail is not None else None,
                           stages_head_markup, stage_rows)
        self._update_panel("pools", detail.pools if detail is not None else None,
                           pools_head_markup, pool_rows)
        self._update_panel("processing", detail.processing if detail is not None else None,
                           processing_head_markup, processing_rows)
        # A processing job reports no loss: its chart gives its room to the panels (unless a
        # loss came after all).
        chart.display = detail is None or detail.processing is None or bool(detail.points)
        if detail is None:
            set_text(head, NO_JOB)
            chart.set_points((), None, empty="no job open")
            ranks.apply([])
            return
        r = detail.row
        set_text(head, "\n".join(head_lines(detail, now)))
        x_max = float(r.total_steps - 1) if r.total_steps else None
        chart.set_points(
            detail.points,
            (r.job_id, detail.points_version),
            x_max=x_max,
            empty="waiting for the first loss",
        )
        ranks.apply(rank_rows(detail.ranks, r.placement))

    def _update_signals(self, detail: JobDetail | None) -> None:
        box = self.query_one("#job-signals", Static)
        signals = detail.signals if detail is not None else ()
        box.display = bool(signals)
        lines = []
        for sig in signals:
            lvl = {"bad": "$error", "warn": "$warning"}.get(sig.verdict, "$text-muted")
            pad = " " * max(1, 5 - len(sig.verdict))
            lines.append(f"[{lvl}]{escape(sig.verdict)}[/]{pad}{escape(sig.summary)}")
            lines.append(f"     [$text-muted]{escape(sig.advice)}[/]")
        set_text(box, "\n".join(lines))

    def _update_incidents(self, detail: JobDetail | None) -> None:
        box = self.query_one("#job-incidents", Static)
        incidents = detail.incidents if detail is not None else ()
        box.display = bool(incidents)
        lines = [f"[$warning]incident[/] {escape(incident_text(i))}" for i in incidents[-4:]]
        if len(incidents) > 4:
            lines.insert(0, f"[$text-muted]{len(incidents) - 4} earlier: rigdeck status shows every one[/]")
        set_text(box, "\n".join(lines))

    def _update_links(self, detail: JobDetail | None) -> None:
        box = self.query_one("#job-links", Static)
        links = detail.links if detail is not None else ()
        box.display = bool(links)
        if getattr(box, "_rd_links", None) != links:  # an update costs a layout pass
            box.update(links_content(links))
            box._rd_links = links  # type: ignore[attr-defined]

    def _update_panel(self, name: str, view: Any, head_markup: Callable[[Any], str],
                      rows: Callable[[Any], Any]) -> None:
        """A panel of the job's kind (``#NAME-head`` over ``#NAME-table``), shown only for a
        job that has its view."""
        head = self.query_one(f"#{name}-head", Static)
        table = self.query_one(f"#{name}-table")
        head.display = table.display = view is not None
        if view is None:
            table.apply([])  # type: ignore[attr-defined]
            return
        set_text(head, head_markup(view))
        table.apply(rows(view))  # type: ignore[attr-defined]


def head_lines(detail: JobDetail, now: float) -> list[str]:
    """The job head: id, state and placement; progress; its code; who does not answer; the cause."""
    r = detail.row
    lvl = state_markup(r.state)
    line1 = (
        f"[b]{escape(r.job_id)}[/b]  [{lvl}]{escape(r.state)}[/]"
        + (f" after {r.restarts} restart(s)" if r.restarts else "")
        + f"  [$text-muted]on[/] {placement_markup(r.placement)}"
    )
    step = (
        "-"
        if r.step is None
        else (f"{r.step}/{r.total_steps}" if r.total_steps else str(r.step))
    )
    eta = r.eta_s
    best = min((p[1] for p in detail.points), default=None)
    line2 = (
        f"runtime {duration(r.runtime_s(now))} · ranks {r.ranks_running}/{r.ranks_total} running"
    ) if detail.processing is not None and r.step is None else (
        f"step [b]{step}[/b] · loss [b]{loss_text(r.loss)}[/b]"
        + (
            f" (min {loss_text(best)})"
            if best is not None and r.loss is not None and best < r.loss
            else ""
        )
        + f" · {step_rate_text(r.step_rate)}"
        + (f" · ETA [b]{duration(eta)}[/b]" if eta is not None else "")
        + f" · runtime {duration(r.runtime_s(now))}"
        + f" · ranks {r.ranks_running}/{r.ranks_total} running"
    )
    ratio = detail.goodput.ratio if detail.goodput is not None else None
    if ratio is not None and (detail.incidents or r.restarts):
        line2 += f" · goodput [b]{ratio:.0%}[/b]"  # worth a place once something failed
    lines = [line1, line2]
    code = code_markup(detail.spec.get("code"), detail.events)
    if code:
        lines.append(code)
    if r.unreachable:
        lines.append(f"[$warning]not answering: {escape(', '.join(r.unreachable))}[/]")
    if r.cause:
        lines.append(f"[$error]cause: {escape(describe_cause(dict(r.cause)) or 'unknown')}[/]")
        for tail in (r.cause.get("tail") or [])[-3:]:
            lines.append(f"[$text-muted]  | {escape(terminal_safe(str(tail)))}[/]")
    return lines


LINKS_SHOWN = 4  # rigdeck status --json has every one


def links_content(links: Sequence[TrackerLink]) -> Content:
    """One line a link: its tracker, the URL (a hyperlink the terminal opens), the rank and host
    that printed it. Not markup: a URL is any text, and the agent and the model let through only
    URLs that carry no control character (tui.model.trackerlinks)."""
    parts: list[str | Content | tuple[str, str | Style]] = []
    for i, link in enumerate(links[:LINKS_SHOWN]):
        who = f"rank {link.rank} on {link.host}" if link.rank is not None else link.host
        parts += ["\n" if i else "", Content.from_markup("[$text-muted]$kind[/] ", kind=f"{link.kind:<11}"),
                  (terminal_safe(link.url), Style(underline=True, link=link.url)),
                  Content.from_markup("  [$text-muted]$who[/]", who=terminal_safe(who))]
    if len(links) > LINKS_SHOWN:
        parts.append(Content.from_markup("\n[$text-muted]$n more: rigdeck status --json shows every one[/]",
                                         n=str(len(links) - LINKS_SHOWN)))
    return Content.assemble(*parts)


def placement_markup(placement: Sequence[Mapping[str, Any]]) -> str:
    """The job head's placement, each node whose GPUs are simulated marked as the tables mark
    them (``placement_parts``; markup, since the head is one Static of markup lines)."""
    parts = [escape(label) + (f"[$text-muted]{SIM_MARK}[/]" if sim else "")
             for label, sim in placement_parts(placement)]
    return " ".join(parts) or "-"


def code_markup(code: Mapping[str, Any] | None, events: Sequence[Mapping[str, Any]]) -> str | None:
    """``[code] sync``: the snapshot's hash and size, and what its hosts were sent for it."""
    if not code or not code.get("tree"):
        return None
    text = (f"code [b]{escape(str(code['tree'])[:12])}[/b] · {code.get('files')} files "
            f"{size_bytes(code.get('size') or 0)}")
    sync = next((e for e in reversed(events) if e.get("event") == "code"), None)
    if sync:
        per = []
        for host, got in sorted((sync.get("hosts") or {}).items()):
            per.append(f"{escape(host)} had it" if got.get("had_tree") else
                       f"{escape(host)} +{got.get('files_sent')} ({size_bytes(got.get('bytes_sent') or 0)})")
        text += " · synced: " + ", ".join(per)
    else:
        text += " · [$text-muted]not yet synced[/]"
    return text


VIEW = OpenJobView
