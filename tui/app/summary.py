"""The summary line over the tabs: hosts up, GPUs busy, jobs running, refresh rates, and the
link to the controller when it is a server (or the jobs cannot be read)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from textual.markup import escape

from tui.app.widgets.tables import jobs_running
from tui.client import LinkStatus
from tui.model.hostviews import HostView
from tui.model.jobview import JobsSnapshot


def summarize(snapshot: Sequence[HostView]) -> dict[str, int]:
    """Counts for the summary line (``simulated``: how many of the GPUs are)."""
    status = [h.status for h in snapshot]
    gpus = sum(h.gpu_count for h in snapshot)
    busy = sum(h.gpus_busy for h in snapshot)
    return {
        "hosts": len(snapshot),
        "up": status.count("up"),
        "stale": status.count("stale"),
        "down": status.count("down"),
        "connecting": status.count("connecting"),
        "gpus": gpus,
        "busy": busy,
        "free": gpus - busy,
        "simulated": sum(h.gpu_count for h in snapshot if h.gpus_simulated),
    }


def summary_markup(hosts_snapshot: Sequence[HostView], jobs: JobsSnapshot, sample_hz: float, telemetry_hz: float,
                   link: LinkStatus, clock: Callable[[], float], frames: str = "") -> str:
    """The summary line's markup (``clock``: read only for how long a server link has been down;
    ``frames``: the frame timer's words, when it is shown)."""
    c = summarize(hosts_snapshot)
    running = jobs_running(jobs.rows)
    hosts = f"hosts [b]{c['up']}/{c['hosts']} up[/b]"  # "hosts 2/3 up · 1 stale · 0 down"
    hosts += f" · [$warning]{c['stale']} stale[/]" if c["stale"] else " · 0 stale"
    hosts += f" · [$error]{c['down']} down[/]" if c["down"] else " · 0 down"
    if c["connecting"]:
        hosts += f" · {c['connecting']} connecting"
    gpus = f"GPUs [b]{c['busy']} busy[/b] · {c['free']} free · {c['gpus']} total"
    if c["simulated"]:  # only the simulated ones: "(sim)" when all are, else "(4 sim)"
        gpus += (" [$text-muted](sim)[/]" if c["simulated"] == c["gpus"]
                 else f" [$text-muted]({c['simulated']} sim)[/]")
    rates = f"refresh {sample_hz:g} Hz" + (f", telemetry {telemetry_hz:g} Hz" if telemetry_hz else "")
    if frames:
        rates += f" · {frames}"
    queued = sum(1 for r in jobs.rows if r.state == "queued")
    text = (
        f"{hosts} [$text-muted]│[/] {gpus} [$text-muted]│[/] jobs [b]{running}[/b] running"
        + (f" · {queued} queued" if queued else "")
        + f" [$text-muted]│ {rates}[/]"
    )
    if link.kind == "server":
        if link.up:
            text += f"\n[$text-muted]controller: {escape(link.detail)}[/]"
        else:
            down = max(0, int(clock() - link.since))
            text += f"\n[$error]{escape(link.detail)} ({down}s)[/]"
    elif queued:
        text += "\n[$text-muted]controller: embedded (queued jobs start only while rigdeck runs)[/]"
    if jobs.error:
        text += f"\n[$error]jobs: {escape(jobs.error[:300])}[/]"
    return text
