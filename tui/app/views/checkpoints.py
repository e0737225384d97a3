"""Checkpoints (5): the open job's checkpoint policy, owners, last complete save, and its saves."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.markup import escape
from textual.widgets import Static

from tui.app.views.base import JOBS, OPEN_JOB, View, set_text
from tui.app.widgets.format import duration, size_bytes
from tui.app.widgets.tables import SavesTable, save_rows
from tui.model.jobview import CheckpointView


class CheckpointsView(View):
    ID, KEY, TITLE = "checkpoints", "5", "Checkpoints"
    FOLLOWS = frozenset({JOBS, OPEN_JOB})
    TABLES = ("#saves-table",)
    FOCUS = "#saves-table"

    def compose(self) -> ComposeResult:
        yield Static("no job open", id="ckpt-head", classes="head")
        yield SavesTable(id="saves-table")

    def update(self, now: float) -> None:
        shell = self.shell
        detail = shell.jobwatch.detail(shell.job_id) if shell.job_id else None
        head = self.query_one("#ckpt-head", Static)
        saves = self.query_one("#saves-table", SavesTable)
        if detail is None:
            set_text(head, "no job open: pick one in Jobs (3)")
            saves.apply([])
            return
        set_text(head, "\n".join(head_lines(detail.row.job_id, detail.checkpoints, now)))
        saves.apply(save_rows(detail.checkpoints, now))


def head_lines(job_id: str, ck: CheckpointView, now: float) -> list[str]:
    """Policy, directory and owners; the last complete save; failures; the last owner moves."""
    owners = ", ".join(o.label() for o in ck.owners) or "-"
    lines = [
        f"[b]{escape(job_id)}[/b]  policy [b]{escape(ck.policy)}[/b]"
        + (f" · dir {escape(ck.directory)}" if ck.directory else "")
        + f" · owner{'s' if len(ck.owners) != 1 else ''} [b]{escape(owners)}[/b]"
    ]
    d = ck.last_done
    if d is not None:
        age = duration(now - d.time) + " ago" if d.time is not None else "-"
        speed = f"{size_bytes(d.speed_bps)}/s" if d.speed_bps else "-"
        lines.append(
            f"last complete: step [b]{d.step}[/b] by {escape(d.owner.label())} · {age} · "
            f"{size_bytes(d.bytes)} in {d.seconds or 0:.2f}s · {speed}"
        )
    else:
        lines.append("[$text-muted]no complete checkpoint yet[/]")
    if ck.failed:
        lines.append(f"[$error]{ck.failed} failed save(s): highlighted below[/]")
    for m in ck.moves[-2:]:
        lines.append(
            f"[$warning]owner moved: {escape(m.from_.label())} → {escape(m.to.label())}"
            f" ({escape(m.reason or '')})[/]"
        )
    return lines


VIEW = CheckpointsView
