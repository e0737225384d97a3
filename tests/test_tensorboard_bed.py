"""``rigdeck tensorboard`` on the test bed: a real 2-host gloo job writes scalars with torch's
SummaryWriter to its AIP_TENSORBOARD_LOG_DIR; the command brings both hosts' event files here
while the job runs, TensorBoard's own reader (EventAccumulator) and a served TensorBoard (its
HTTP API) see both hosts' steps, and the steps written later arrive as new bytes only.

The job writes in two phases of 5 steps and waits after each for the test (tests/jobscripts/
tb_writer.py): the test reads at a point it chose, never at a time it guessed."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests._require import TORCH_MISSING, has_module, require
from tests.kit import ROOT, wait_until
from tests.kit.bedcli import Cli
from tests.webpage import free_port

pytestmark = pytest.mark.testbed

WRITER = ROOT / "tests" / "jobscripts" / "tb_writer.py"
TENSORBOARD_MISSING = "tensorboard is not installed (pip install -e '.[test]' installs it)"


def steps_read(logdir: Path) -> dict[str, list[int]]:
    """run (its folder under ``logdir``) -> the steps of ``loss``, as TensorBoard's reader sees them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = {}
    for run in sorted({p.parent for p in logdir.rglob("*.tfevents.*")}):
        acc = EventAccumulator(str(run))
        acc.Reload()
        out[run.relative_to(logdir).as_posix()] = [e.step for e in acc.Scalars("loss")]
    return out


def steps_served(port: int, runs: list[str]) -> dict[str, list[int] | None]:
    """run -> the steps of ``loss`` the TensorBoard on ``port`` serves (None: not yet)."""
    out: dict[str, list[int] | None] = {}
    for run in runs:
        query = urllib.parse.urlencode({"run": run, "tag": "loss"})
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/scalars/scalars?{query}",
                                        timeout=10) as r:
                out[run] = [int(point[1]) for point in json.load(r)]
        except (OSError, ValueError):  # not up yet, or the run not loaded yet
            out[run] = None
    return out


def local_bytes(logdir: Path, host: str) -> int:
    return sum(p.stat().st_size for p in (logdir / host).rglob("*.tfevents.*"))


class Lines:
    """One of a running command's outputs, read as it comes (a pipe left unread could fill)."""

    def __init__(self, stream: Any):
        self.lines: list[str] = []
        self.thread = threading.Thread(target=lambda: self.lines.extend(iter(stream.readline, "")), daemon=True)
        self.thread.start()

    def has(self, needle: str) -> bool:
        return any(needle in line for line in list(self.lines))


def test_both_hosts_event_files_come_here_as_they_grow_and_tensorboard_serves_them(cli: Cli) -> None:
    require(has_module("torch"), TORCH_MISSING)
    require(has_module("tensorboard"), TENSORBOARD_MISSING)
    spec = cli.spec("tb", f"""
command = ["{{python}}", "{WRITER}", "5", "2"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 2
gpus_per_node = 1
max_runtime = "5m"
[env]
OMP_NUM_THREADS = "1"
""")
    view = cli.json("launch", str(spec))
    job = view["job_id"]
    hosts = [n["host"] for n in view["placement"]]
    dirs = {h.name: h.state_dir / "jobs" / job for h in cli.bed.hosts if h.name in hosts}
    runs = [f"{h}/rank-{r}" for r, h in enumerate(hosts)]
    out = cli.tmp / "tb"
    proc = None
    try:
        wait_until(lambda: all((d / "written-5").exists() for d in dirs.values()), 180, "5 steps on each host")
        once = cli.run("tensorboard", job, "--once", "--dir", str(out))
        assert steps_read(out) == {r: list(range(5)) for r in runs}, once.stdout + once.stderr
        first = {h: local_bytes(out, h) for h in hosts}
        assert all(first.values()) and all(f"{h}: 1 file(s)" in once.stdout for h in hosts), once.stdout

        # Following, with TensorBoard: the next 5 steps arrive while the job runs.
        port = free_port()
        # Started as a shell starts a background job (SIGINT ignored): Ctrl+C still stops it.
        proc = subprocess.Popen(
            [sys.executable, "-m", "tui.cli", "tensorboard", job, "--dir", str(out), "--port", str(port),
             "--poll", "0.5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli.env, cwd=ROOT,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        said, errors = Lines(proc.stdout), Lines(proc.stderr)
        wait_until(lambda: steps_served(port, runs) == {r: list(range(5)) for r in runs}, 120,
                   "TensorBoard serving both hosts' first 5 steps")
        for d in dirs.values():
            (d / "go-5").touch()
        wait_until(lambda: steps_served(port, runs) == {r: list(range(10)) for r in runs}, 120,
                   "TensorBoard serving both hosts' 10 steps")
        assert proc.poll() is None
        for d in dirs.values():
            (d / "go-10").touch()
        wait_until(lambda: said.has(f"{job} succeeded: every event file it wrote is in"), 120,
                   "the command saying the job ended")
        assert steps_served(port, runs) == {r: list(range(10)) for r in runs}  # serving on after the end
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, errors.lines
        said.thread.join(10)
        assert said.has("rigdeck tensorboard: stopped"), said.lines
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait(30)
        for d in dirs.values():
            for gate in ("go-5", "go-10"):
                if d.exists():
                    (d / gate).touch()
        cli.run("stop", job, "--grace", "2", check=False)

    # Only new bytes came: what the follow brought of each host is what its files grew by, and
    # the copies are the hosts' files byte for byte.
    for h in hosts:
        brought = sum(int(m.group(1)) for line in said.lines if line.startswith(f"{h}: ")
                      for m in [re.search(r"\(\+(\d+) bytes\)", line)] if m)
        assert brought == local_bytes(out, h) - first[h] > 0, said.lines
        remote = dirs[h] / "tensorboard"
        copies = sorted(p.relative_to(out / h) for p in (out / h).rglob("*.tfevents.*"))
        assert copies == sorted(p.relative_to(remote) for p in remote.rglob("*.tfevents.*"))
        assert all((out / h / p).read_bytes() == (remote / p).read_bytes() for p in copies)
    assert steps_read(out) == {r: list(range(10)) for r in runs}
