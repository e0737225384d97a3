"""The app as a user drives it: `rigdeck` in tmux on a 3-host test bed.

Launch the ddp example (on two of the hosts) from the launch dialog, watch its loss appear in the
job view, cut a third host off hard (its sshd and every session it served killed) and see it go
down while the app keeps answering keys, stop the job from the app through its confirmation,
and find no process of the job left on any host. Also: a host whose key is unknown, trusted from
the app's dialog, comes up.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests._require import TMUX_MISSING, require
from tests.testbed import TestBed
from tui.model.specform import read_spec_data
from tui.model.tomlwrite import dumps

pytestmark = pytest.mark.testbed

ROOT = Path(__file__).resolve().parent.parent
DDP = ROOT / "examples" / "ddp" / "job.toml"
TICKER = ROOT / "tests" / "jobscripts" / "ticker.py"


def job_spec(tmp: Path) -> tuple[Path, bool]:
    """The ddp example on h1 and h2 (h3 stays free to be cut off), with its own checkpoint
    directory; the ticker when the example is missing. Returns (spec, is_ticker)."""
    out = tmp / "job.toml"
    if DDP.exists():
        data = read_spec_data(DDP)
        data["workdir"] = str((DDP.parent / str(data.get("workdir", "."))).resolve())
        data.pop("nodes", None)
        data["hosts"] = ["h1", "h2"]
        data["total_steps"] = 300
        data.setdefault("checkpoint", {})["dir"] = str(tmp / "ckpt")
        out.write_text(dumps(data))
        return out, False
    out.write_text(
        f'name = "ticker"\ncommand = ["{{python}}", "{TICKER}", "--steps", "100000",'
        ' "--sleep", "0.2"]\n'
        f'workdir = "{ROOT}"\nhosts = ["h1", "h2"]\nprocesses_per_node = 2\ntotal_steps = 100000\n'
    )
    return out, True


class Tmux:
    """One app in a tmux session of its own tmux server (``-L``: a socket of its own), so a test
    running beside it (another pytest worker) cannot change its size or end its server."""

    def __init__(self, session: str, env: dict[str, str]):
        self.session = session
        self.env = env
        self.tmux = ["tmux", "-L", session]

    def start(self, cmd: str, width: int = 130, height: int = 38) -> None:
        subprocess.run(
            [
                *self.tmux,
                "new-session",
                "-d",
                "-s",
                self.session,
                "-x",
                str(width),
                "-y",
                str(height),
                cmd,
            ],
            check=True,
            env=self.env,
            cwd=ROOT,
        )

    def screen(self) -> str:
        return subprocess.run(
            [*self.tmux, "capture-pane", "-p", "-t", self.session], capture_output=True, text=True
        ).stdout

    def keys(self, *keys: str, literal: bool = False) -> None:
        subprocess.run(
            [*self.tmux, "send-keys", "-t", self.session, *(["-l"] if literal else []), *keys],
            check=True,
        )

    def wait(
        self, cond: Callable[[str], object], timeout: float, what: str, step: float = 0.2
    ) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if cond(screen):
                return screen
            time.sleep(step)
        raise AssertionError(
            f"timed out after {timeout}s waiting for {what}; the screen:\n{screen}"
        )

    def alive(self) -> bool:
        return (
            subprocess.run(
                [*self.tmux, "has-session", "-t", self.session], capture_output=True
            ).returncode
            == 0
        )

    def kill(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], capture_output=True)


@pytest.fixture
def tmux_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    require(shutil.which("tmux"), TMUX_MISSING)
    home = tmp_path / "home"
    home.mkdir()
    # COLUMNS and LINES (a pytest-xdist worker has COLUMNS=80) would size the app, not tmux's window.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RIGDECK_", "TMUX")) and k not in ("COLUMNS", "LINES")}
    env.update(HOME=str(home), TERM="xterm-256color", RIGDECK_HOME=str(home / "rigdeck"))
    yield env


def host_row(screen: str, name: str) -> str:
    return next((ln for ln in screen.splitlines() if re.match(rf"\s*{name}\s", ln)), "")


def sshd_pids(bed: TestBed, index: int) -> list[int]:
    """Every sshd process of host ``index`` (the listener and the sessions it forked)."""
    h = bed.hosts[index - 1]
    assert h.init_pid is not None
    ns = os.readlink(f"/proc/{h.init_pid}/ns/net")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/net") != ns:
                continue
            comm = Path(f"/proc/{entry}/comm").read_text().strip()
        except OSError:
            continue
        if comm == "sshd":
            found.append(int(entry))
    return found


def kill_sessions(bed: TestBed, index: int) -> list[int]:
    """Kill every sshd session of host ``index`` (its listener is already gone), by pid."""
    killed = []
    for pid in sshd_pids(bed, index):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    return killed


def tagged(bed: TestBed, job_id: str) -> dict[str, list[str]]:
    from tests.test_jobs import tagged as in_hosts

    return in_hosts(bed, job_id)


def launch_from_dialog(tmux: Tmux, spec: Path, is_ticker: bool) -> str:
    """Launch ``spec`` from the app's dialog (the path, enter loads it into the form, ctrl+s
    launches) and wait for the launched job's view; returns its job id."""
    tmux.keys("l")
    tmux.wait(lambda s: "Launch a job" in s, 10, "the launch dialog")
    tmux.keys(str(spec), literal=True)
    tmux.keys("Enter")
    tmux.wait(lambda s: "loaded" in s, 10, "the spec loaded into the form")
    tmux.keys("C-s")
    name = "ticker" if is_ticker else "ddp"
    pattern = rf"{name}-\d{{4}}-\d{{6}}-[0-9a-f]{{4}}"
    screen = tmux.wait(lambda s: re.search(pattern, s) and "Launch a job" not in s, 120,
                       "the job view of the launched job")
    return re.search(pattern, screen).group(0)  # type: ignore[union-attr]


def loss_of(screen: str) -> float | None:
    """The loss the job view's head shows, or None."""
    m = re.search(r"step (\d+)(?:/\d+)? · loss ([0-9.e+-]+)", screen)
    return float(m.group(2)) if m else None


def test_launch_watch_cut_a_host_and_stop_in_tmux(
    testbed: TestBed, tmp_path: Path, tmux_env: dict[str, str]
) -> None:
    bed = testbed
    inv = bed.write_inventory(tmp_path / "hosts.toml", python=sys.executable, connect_timeout=5.0)
    spec, is_ticker = job_spec(tmp_path)
    env = {**tmux_env, "RIGDECK_INVENTORY": str(inv)}
    tmux = Tmux(f"rdk-{uuid.uuid4().hex[:8]}", env)
    tmux.start(f"{sys.executable} -m tui.cli")
    job_id = None
    try:
        tmux.wait(lambda s: "hosts 3/3 up" in s, 90, "all three hosts up")

        job_id = launch_from_dialog(tmux, spec, is_ticker)

        # Its loss values appear in the job view (and change as it trains).
        screen = tmux.wait(loss_of, 240, "a loss in the job view")
        first = loss_of(screen)
        assert first is not None and first > 0
        if is_ticker:
            assert any(abs(first - 1.0 / (s + 1)) < 1e-3 * first for s in range(100000)), first
        screen = tmux.wait(lambda s: loss_of(s) not in (None, first), 120, "the loss to move on")
        assert "ranks 4/4 running" in screen, screen

        # Cut h3 off hard: its sshd and every session it served (the app's telemetry stream too).
        tmux.keys("1")
        tmux.wait(lambda s: "up" in host_row(s, "h3"), 30, "h3 up in the hosts view")
        listener = bed.hosts[2].sshd_pid
        deadline = time.monotonic() + 30
        while not [p for p in sshd_pids(bed, 3) if p != listener] and time.monotonic() < deadline:
            time.sleep(0.2)  # the app's telemetry session to h3 (it reconnects after a hiccup)
        bed.stop_sshd(3)
        killed_at = time.monotonic()
        assert kill_sessions(bed, 3), "no session of h3 to kill"
        screen = tmux.wait(
            lambda s: re.search(r"\b(down|stale)\b", host_row(s, "h3")), 20, "h3 stale or down"
        )
        took = time.monotonic() - killed_at
        assert took < 5.0 + 4.0, f"h3 went down only after {took:.1f}s (its timeout is 5s)"
        assert " up " in host_row(screen, "h1") + " " and " up " in host_row(screen, "h2") + " ", (
            screen
        )
        # The app still answers keys at once, while h3's reader fails to reconnect.
        for key, marker in (("2", "Util history"), ("3", "Checkpoint owner"), ("1", "Hostname")):
            t0 = time.monotonic()
            tmux.keys(key)
            tmux.wait(lambda s, m=marker: m in s, 3, f"the view behind key {key}", step=0.05)
            assert time.monotonic() - t0 < 3.0
        screen = tmux.wait(lambda s: "down" in host_row(s, "h3"), 20, "h3 down")
        assert "up" in host_row(screen, "h1") and "up" in host_row(screen, "h2")

        # Stop it from the app: the confirmation names the hosts and ranks.
        tmux.keys("3")
        tmux.wait(lambda s: job_id in s and "Checkpoint owner" in s, 10, "the jobs view")
        tmux.keys("s")
        screen = tmux.wait(lambda s: "Stop job" in s, 10, "the stop confirmation")
        assert job_id in screen and "h1: ranks 0, 1" in screen and "h2: ranks 2, 3" in screen, (
            screen
        )
        tmux.keys("y")
        tmux.wait(lambda s: "Stop job" not in s, 10, "the confirmation to close")
        tmux.keys("3")  # the jobs view (once, in CI, the hosts view was showing after the dialog)
        tmux.wait(lambda s: re.search(rf"{job_id}\s+stopped", s), 90, "the job stopped")
        assert tagged(bed, job_id) == {"h1": [], "h2": [], "h3": []}

        tmux.keys("q")
        deadline = time.monotonic() + 10
        while tmux.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not tmux.alive(), "the app did not quit on q"
    finally:
        tmux.kill()
        bed.start_sshd(3)
        if job_id:
            for i in (1, 2):
                bed.exec(i, ["sh", "-c", f"pkill -9 -f RIGDECK_JOB_ID={job_id} || true"])


async def test_trust_an_unknown_host_key_from_the_app(
    testbed: TestBed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """h1 with an empty known_hosts: down, its key shown; trusted in the dialog, it comes up."""
    from textual.widgets import Static

    from tui.app.screens.dialogs import TrustHostKey
    from tui.app.shell import RigdeckApp
    from tui.app.widgets.tables import HostsTable
    from tui.client import InProcessClient
    from tui.control.hostlinks import HostLinks
    from tui.remote.inventoryfile import load_inventory
    from tui.remote.transport import TransportError

    monkeypatch.setenv("RIGDECK_HOME", str(tmp_path / "home"))
    known = tmp_path / "known_hosts"
    inv = load_inventory(
        testbed.write_inventory(
            tmp_path / "hosts.toml", hosts=[1], known_hosts=str(known), connect_timeout=5.0
        )
    )
    expected = subprocess.run(
        ["ssh-keygen", "-lf", f"{testbed.hosts[0].host_key}.pub"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[1]
    app = RigdeckApp(InProcessClient(controller=HostLinks(inv)), keymap_file=tmp_path / "keys.toml")
    async with app.run_test(size=(120, 36)) as pilot:
        table = app.query_one("#hosts-table", HostsTable)

        async def wait(cond: Callable[[], bool], what: str, timeout: float = 30) -> None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                await pilot.pause(0.1)
                if cond():
                    return
            raise AssertionError(f"timed out waiting for {what}: {app.hosts_snapshot}")

        await wait(
            lambda: "h1" in table.rows and table.cell_text("h1", "state") == "down", "h1 down"
        )
        assert expected in table.cell_text("h1", "why")
        # A key other than the one the user checked is never recorded.
        with pytest.raises(TransportError, match="nothing recorded"):
            app.client.trust_host_key("h1", "SHA256:not-the-key-you-saw")
        assert not known.exists() or testbed.hosts[0].address not in known.read_text()
        await pilot.press("t")
        await pilot.pause()
        assert isinstance(app.screen, TrustHostKey)
        assert expected in str(app.screen.query_one("#hostkey-body", Static).render())
        await pilot.press("y")
        await wait(
            lambda: table.cell_text("h1", "state") == "up", "h1 up after trusting its key", 60
        )
        assert expected.split(":")[1] and testbed.hosts[0].address in known.read_text()
