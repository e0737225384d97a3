"""The app live on N test bed hosts, driven through tmux for a minute: does any frame stall?

A test bed of N real sshd hosts (8 simulated GPUs each, labelled simulated) gets the agent
(``HostLinks.deploy``); then ``rigdeck`` runs in a 200x60 tmux window with
``RIGDECK_FRAME_TIMER=1``, so its summary line shows its own frame timer: the longest stretch
of its UI thread (a sampling step, a frame, a collector pass) in the last 10 s and 60 s, and how
many were over 33 ms (a frame at 30 fps). Once every host is up, a user's minute: the GPU view
(sorted by utilization, filtered to busy GPUs, back), the jobs view, the map, the hosts view,
a key every few seconds; the screen is read twice a second, and every host must stay up.

Baseline: the frame budget, 33 ms; the result is the longest stretch and the count of slow ones
in the minute, by the app's own timer, as the summary line showed them.

Usage (as root, under the heavy lock; the bed comes up and goes down in this command):
    .venv/bin/python bench/ui_live.py [--hosts 128] [--seconds 60]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._meta import run_meta, write_result  # noqa: E402
from tests.test_ui_e2e import Tmux  # noqa: E402
from tests.testbed import TestBed, available  # noqa: E402
from tui.control.hostlinks import HostLinks  # noqa: E402
from tui.remote.inventoryfile import load_inventory  # noqa: E402

SIM_GPUS = 8
EXITED = "rigdeck exited with status"  # the pane's last words when the app ends (it stays open)
FRAMES = re.compile(r"frames ≤(\d+) ms 10s · ≤(\d+) ms 60s(?: \((\w+)\))? · (\d+) slow")
UP = re.compile(r"hosts (\d+)/(\d+) up")
# (key, what shows once it is taken): a user's round of the views
ROUND = [("2", "Util history"), ("o", "sort: util"), ("b", "filter: busy"), ("b", "filter: idle"),
         ("b", "filter: none"), ("o", "sort: memory"), ("o", "sort: temp"), ("o", "sort: job"),
         ("o", "sort: host"), ("3", "Checkpoint owner"), ("8", "GPUs by user"), ("1", "Hostname")]


def read(screen: str) -> tuple[tuple[int, int] | None, tuple[int, int, int, str] | None]:
    """(hosts up, hosts) and (longest in 10 s, in 60 s, slow in 60 s, what the longest was)."""
    up = UP.search(screen)
    fr = FRAMES.search(screen)
    return (
        (int(up.group(1)), int(up.group(2))) if up else None,
        (int(fr.group(1)), int(fr.group(2)), int(fr.group(4)), fr.group(3) or "") if fr else None,
    )


def app_rss_mb(tmux: Tmux) -> float | None:
    """The app's resident memory (the ``tui.cli`` process under the pane's shell), in MB."""
    import subprocess

    pane = subprocess.run([*tmux.tmux, "display", "-p", "-t", tmux.session, "#{pane_pid}"],
                          capture_output=True, text=True).stdout.strip()
    for proc in Path("/proc").iterdir():
        try:
            status = (proc / "status").read_text()
            if f"\nPPid:\t{pane}\n" in status and b"tui.cli" in (proc / "cmdline").read_bytes():
                return int(status.split("VmRSS:")[1].split()[0]) / 1024
        except (OSError, IndexError, ValueError):
            continue
    return None


def drive(tmux: Tmux, n: int, seconds: float, settle: float) -> dict[str, Any]:
    """Once every host is up: the round of views for ``seconds``, the screen read twice a
    second. Returns what the frame timer said."""
    t0 = time.monotonic()
    screen = tmux.wait(lambda s: f"hosts {n}/{n} up" in s or EXITED in s, 600, f"all {n} hosts up", step=1.0)
    if EXITED in screen:
        raise RuntimeError(f"the app ended before every host was up:\n{screen}")
    up_after = time.monotonic() - t0
    # Out of the minute measured: the start-up (connecting N hosts, the collector's first pass).
    time.sleep(settle)
    start = time.monotonic()
    rss = [(0.0, app_rss_mb(tmux))]
    readings: list[tuple[float, int, int, int, str]] = []
    down_seen: list[str] = []
    keys = 0
    i = 0
    while time.monotonic() - start < seconds:
        key, shows = ROUND[i % len(ROUND)]
        tmux.keys(key)
        keys += 1
        i += 1
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            screen = tmux.screen()
            up, fr = read(screen)
            if up is not None and up != (n, n):
                down_seen.append(f"{time.monotonic() - start:.1f}s: hosts {up[0]}/{up[1]} up")
            if fr is not None:
                readings.append((time.monotonic() - start, *fr))
            if EXITED in screen:
                raise RuntimeError(f"the app ended while driven:\n{screen}")
            if shows in screen:
                break
            time.sleep(0.5)
        time.sleep(max(0.0, 2.0 - (time.monotonic() - deadline + 5.0)))
        if time.monotonic() - start - rss[-1][0] >= 30.0:
            rss.append((round(time.monotonic() - start), app_rss_mb(tmux)))
    time.sleep(1.0)
    rss.append((round(time.monotonic() - start), app_rss_mb(tmux)))
    up, fr = read(tmux.screen())
    if fr is None:
        raise RuntimeError(f"no frame timer on the screen:\n{tmux.screen()}")
    return {
        "hosts_up_after_s": round(up_after, 1),
        "hosts_up_at_end": list(up) if up else None,
        "hosts_not_all_up": down_seen,
        "keys": keys,
        "longest_10s_ms_max": max((r[1] for r in readings), default=None),
        "longest_60s_ms_at_end": fr[1],
        "slow_in_60s_at_end": fr[2],
        "longest_was": fr[3],
        "readings": len(readings),
        "rss_mb": [(t, round(mb, 1) if mb is not None else None) for t, mb in rss],
        "screen_at_end": tmux.screen(),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--settle", type=float, default=62.0,
                    help="seconds after every host is up before the minute starts")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "ui-live.json"))
    ap.add_argument("--frame-log", metavar="FILE",
                    help="the app writes each collector pass and each stretch over 20 ms (with its "
                    "view) to FILE (RIGDECK_FRAME_LOG)")
    args = ap.parse_args()
    # A timeout's SIGTERM ends the run through its cleanup (the bed torn down, tmux ended).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ok, why = available()
    if not ok or not shutil.which("tmux"):
        print(f"bench/ui_live.py needs the test bed and tmux: {why or 'no tmux'}", file=sys.stderr)
        return 2
    meta = run_meta()
    t0 = time.monotonic()
    with TestBed(args.hosts, sim_gpus=SIM_GPUS) as bed, tempfile.TemporaryDirectory() as tmp:
        up_s = time.monotonic() - t0
        print(f"test bed of {args.hosts} hosts up in {up_s:.1f} s", flush=True)
        inv = bed.write_inventory(Path(tmp) / "hosts.toml", python=sys.executable, connect_timeout=5.0)
        with HostLinks(load_inventory(inv)) as ctl:
            bad = {r.name: r.error for r in ctl.deploy() if r.error}
        if bad:
            raise RuntimeError(f"deploy failed: {bad}")
        print(f"agent deployed in {time.monotonic() - t0 - up_s:.1f} s", flush=True)
        home = Path(tmp) / "home"
        home.mkdir()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("RIGDECK_", "TMUX")) and k not in ("COLUMNS", "LINES")}
        env.update(HOME=str(home), TERM="xterm-256color", RIGDECK_HOME=str(home / "rigdeck"),
                   RIGDECK_INVENTORY=str(inv), RIGDECK_FRAME_TIMER="1")
        if args.frame_log:
            env["RIGDECK_FRAME_LOG"] = str(Path(args.frame_log).resolve())
        tmux = Tmux(f"rdk-live-{uuid.uuid4().hex[:8]}", env)
        # The pane outlives the app, so a traceback or an early exit can be read from it.
        tmux.start(f"sh -c '{sys.executable} -m tui.cli; echo {EXITED} $?; sleep 3600'",
                   width=200, height=60)
        try:
            result = drive(tmux, args.hosts, args.seconds, args.settle)
        finally:
            tmux.kill()
    screen = result.pop("screen_at_end")
    print("\n".join(screen.splitlines()[:4]))
    ok = (result["slow_in_60s_at_end"] == 0 and not result["hosts_not_all_up"]
          and result["hosts_up_at_end"] == [args.hosts, args.hosts])
    print(f"{args.hosts} hosts x {SIM_GPUS} simulated GPUs, {args.seconds:.0f} s driven through tmux "
          f"({result['keys']} keys): longest UI stretch {result['longest_60s_ms_at_end']} ms in the "
          f"last 60 s, a {result['longest_was']} (budget 33 ms: {result['longest_60s_ms_at_end'] / 33.3:.2f}x), "
          f"{result['slow_in_60s_at_end']} over 33 ms; every host up throughout: "
          f"{not result['hosts_not_all_up']} -> {'met' if ok else 'MISSED'}; the app's RSS "
          f"{result['rss_mb'][0][1]} MB at the start, {result['rss_mb'][-1][1]} MB at the end", flush=True)
    write_result(args.out, {
        "what": "the app (rigdeck in tmux, 200x60, RIGDECK_FRAME_TIMER=1) on N test bed hosts for "
        "a minute of view changes: its own frame timer's longest UI-thread stretch and the count "
        "over 33 ms",
        "hosts": args.hosts, "sim_gpus": SIM_GPUS, "seconds": args.seconds,
        "testbed_up_s": round(up_s, 1), "target": "no stretch over 33 ms, every host up",
        "target_met": ok, **result,
    }, meta)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
