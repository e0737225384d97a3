"""One job as plain lines: what ``rigdeck status`` prints (and ``launch --wait`` at the end),
from the one ``JobView``, with the signals and stages the CLI read from the metrics.

Every value that may carry a rank's or host's own words goes through ``terminal_safe``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tui.model.codesync import short
from tui.model.diagnose import Signal
from tui.model.health import Incident
from tui.model.jobstate import describe_cause
from tui.model.jobview import JobView
from tui.model.poolview import pool_lines
from tui.model.processingview import processing_lines
from tui.model.stages import StagesView
from tui.model.stagetext import stage_lines
from tui.model.termsafe import terminal_safe
from tui.model.textformat import simulated_text, size_bytes


def code_lines(code: Mapping[str, Any] | None, events: Sequence[Mapping[str, Any]]) -> list[str]:
    """The job's code snapshot and what each host was sent for it (the newest sync)."""
    if not code or not code.get("tree"):
        return []
    lines = [f"code     {short(code['tree'])}: {code.get('files')} files, {size_bytes(code.get('size') or 0)} "
             f"from {code.get('sync')}"]
    sync = next((e for e in reversed(events) if e.get("event") == "code"), None)
    for host, r in sorted((sync or {}).get("hosts", {}).items()):
        if r.get("had_tree"):
            lines.append(f"         {host}: had it, sent nothing")
        else:
            files = f"{r['files_sent']} file{'' if r['files_sent'] == 1 else 's'}"
            lines.append(f"         {host}: sent {files}, {size_bytes(r['bytes_sent'])} "
                         f"({size_bytes(r['wire_bytes'])} on the wire) in {r['seconds']:.1f}s")
    return lines


def signal_lines(signals: Sequence[Signal]) -> list[str]:
    lines = []
    for s in signals:  # host names and numbers only, but to be sure
        lines.append(f"signal   {s.verdict:<4} {terminal_safe(s.summary)}")
        lines.append(f"           advice: {terminal_safe(s.advice)}")
    return lines


def exit_text(rank: Mapping[str, Any]) -> str:
    """How a rank ended: ``sig 9``, its exit code, or ``-`` while it runs."""
    if rank.get("signal"):
        return f"sig {rank['signal']}"
    return "-" if rank.get("exit_code") is None else str(rank["exit_code"])


def _placement_line(v: JobView) -> str:
    def gpus(n: Mapping[str, Any]) -> str:
        return " gpus " + ",".join(map(str, n["gpus"])) if n.get("gpus") else ""

    return ", ".join(simulated_text(f"{n['host']}[{n['slots']}{gpus(n)}]", bool(n.get("gpus") and n.get("simulated")))
                     for n in v.placement)


def _rank_lines(v: JobView) -> list[str]:
    if not v.ranks:
        return []
    simulated = {n["host"] for n in v.placement if n.get("simulated")}
    lines = ["rank  host        local  gpu    pid      state    exit"]
    for r in v.ranks:
        gpu = "-" if r.get("gpu") is None else simulated_text(str(r["gpu"]), r["host"] in simulated)
        lines.append(f"{r['rank']:<5} {r['host']:<11} {r['local_rank']!s:<6} {gpu:<6} {r['pid']!s:<8} "
                     f"{r['state']:<8} {exit_text(r)}")
    return lines


def _seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f} s"


def _part(x: float | None) -> str:
    return "?" if x is None else f"{x:.1f} s" if x < 10 else f"{x:.0f} s"


def incident_text(i: Incident) -> str:
    """One failure and its cost, the restart in its parts: ``hang after step 11: detected in 21 s,
    stop 2.1 s + start 1.4 s + first step 3.0 s = next first step 6.5 s after detection, 1 step(s)
    lost``. A moment not known reads ``?``; an incident from before the parts were kept says only
    the stop to the first step."""
    where = "".join(f" {k} {v}" for k, v in (("host", i.host), ("GPU", i.gpu), ("rank", i.rank)) if v is not None)
    at = f" after step {i.last_step:g}" if i.last_step is not None else ""
    p = i.parts()
    if i.resumed_at is not None and (i.started_at is not None or i.stopped_at is not None):
        restart = (f"stop {_part(p['stop'])} + start {_part(p['start'])} + first step {_part(p['first_step'])}"
                   f" = next first step {_part(max(0.0, i.resumed_at - i.detected_at))} after detection")
    elif i.resume_s is not None:
        restart = f"next first step {_seconds(i.resume_s)} after the stop"
    else:
        restart = "not resumed"
    cost = [f"detected in {_seconds(i.detect_s)}" if i.detect_s is not None else None, restart,
            f"{i.steps_rerun} step(s) lost" if i.steps_rerun is not None else None]
    by = f" (restarted in place by {terminal_safe(i.healed_by)})" if i.healed_by else ""
    return f"{i.kind}{where}{at}: " + ", ".join(c for c in cost if c) + f"{by} — {terminal_safe(i.message)}"


def health_lines(v: JobView) -> list[str]:
    """Goodput, then each incident (what failed, how long it went unnoticed, what it cost)."""
    lines = []
    ratio = v.goodput.ratio if v.goodput is not None else None
    if v.goodput is not None and ratio is not None:
        lines.append(f"goodput  {ratio:.0%} ({v.goodput.useful_s:.0f} s in {v.goodput.steps} step(s) that count, "
                     f"of {v.goodput.wall_s:.0f} s)")
    lines += [f"incident {incident_text(i)}" for i in v.incidents]
    return lines


def link_lines(v: JobView) -> list[str]:
    """The links to experiment trackers its ranks printed: ``link     wandb https://... (rank 0 on h1)``."""
    return [f"link     {link.kind} {terminal_safe(link.url)} "
            f"({'rank ' + str(link.rank) + ' on ' if link.rank is not None else ''}{terminal_safe(link.host)})"
            for link in v.links]


def slurm_line(slurm: Mapping[str, Any]) -> str:
    """``slurm    job 12 RUNNING (submitted on h1)``: the Slurm job that runs a rigdeck job."""
    state = terminal_safe(str(slurm.get("state") or "?"))
    if slurm.get("gone"):  # ended past Slurm's MinJobAge: Slurm says no more how
        state = f"(last seen {state}; Slurm lists it no more)"
    why = f" ({terminal_safe(str(slurm['reason']))})" if slurm.get("reason") else ""
    login = f" (submitted on {terminal_safe(str(slurm['login']))})" if slurm.get("login") else ""
    return f"slurm    job {terminal_safe(str(slurm.get('job_id')))} {state}{why}{login}"


def last_checkpoint(records: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The newest completed checkpoint save among a job's metrics records (its owner, step), or None."""
    done = [r for r in records if r.get("event") == "checkpoint" and r.get("status") == "done"
            and isinstance(r.get("step"), int)]
    return max(done, key=lambda r: (r["step"], r.get("time") or 0.0)) if done else None


def checkpoint_line(save: Mapping[str, Any]) -> str:
    """``checkpoint owner h1 rank 0, step 20 saved``: who saved the newest checkpoint."""
    owner = save.get("owner") or {}
    return (f"checkpoint owner {terminal_safe(str(owner.get('host') or save.get('host') or '?'))} rank "
            f"{terminal_safe(str(owner.get('rank', save.get('rank'))))}, step {save.get('step')} saved")


def job_lines(v: JobView, signals: Sequence[Signal] = (), stages: StagesView | None = None,
              checkpoint: Mapping[str, Any] | None = None) -> list[str]:
    """The job: head, placement, code, progress, health, tracker links, signals, then its kind's panels (stages, pools,
    processing), its failure's cause with the last lines the rank wrote, and its ranks."""
    lines = [f"job      {v.job_id} ({v.name})"]
    if v.user:  # its owner (a job recorded before owners were has none)
        lines.append(f"user     {terminal_safe(v.user)}")
    lines += [f"state    {v.state_line}" + (f" after {v.restarts} restart(s)" if v.restarts else "")
              + (f", stopped by {terminal_safe(v.stopped_by)}" if v.stopped_by else ""),
              f"placement {_placement_line(v)}"]
    if v.slurm:  # run through Slurm: its job beside rigdeck's
        lines.append(slurm_line(v.slurm))
    lines += code_lines(v.spec.get("code"), v.events)
    if v.last_step is not None or v.last_loss is not None:
        lines.append(f"progress step {v.last_step} loss {v.last_loss}")
    if checkpoint is not None:
        lines.append(checkpoint_line(checkpoint))
    lines += health_lines(v)
    lines += link_lines(v)
    lines += signal_lines(signals)
    if stages is not None:
        lines += stage_lines(stages)
    if v.pools is not None:  # a job made of worker pools: its pools, sizing, failures
        lines += pool_lines(v.pools)
    if v.processing is not None:  # a processing job: its inputs and outputs
        lines += processing_lines(v.processing)
    if v.cause:
        lines.append(f"cause    {describe_cause(v.cause, restart_error=False)}")
        # rank output: no escape reaches the terminal
        lines += [f"         | {terminal_safe(str(line))}" for line in (v.cause.get("tail") or [])[-5:]]
    return lines + _rank_lines(v)
