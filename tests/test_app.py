"""The app on this machine alone: driven headless by Textual's pilot, and in tmux as a user
sees it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests import bedclean
from tests._require import TMUX_MISSING, require
from tui.app.shell import RigdeckApp
from tui.app.terminal import HangupWatch
from tui.app.widgets.tables import GpusTable, HostsTable
from tui.client import InProcessClient
from tui.control.hostlinks import HostLinks
from tui.model.inventory import HostSpec, Inventory
from tui.remote.bundle import build_agent


async def test_app_shows_the_local_host_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIGDECK_HOME", str(tmp_path / "home"))
    # Its own claim directory: a job of another test on this machine must not make its GPUs busy.
    monkeypatch.setenv("RIGDECK_CLAIM_DIR", str(tmp_path / "claims"))
    spec = HostSpec(
        name="here",
        address="localhost",
        transport="local",
        python=sys.executable,
        state_dir=str(tmp_path / "state"),
        sim_gpus=2,
    )
    inv = Inventory(hosts=(spec,), path=None, known_hosts=tmp_path / "kh")
    bundle = build_agent(tmp_path / "cache")
    app = RigdeckApp(
        InProcessClient(controller=HostLinks(inv, bundle_factory=lambda: bundle)),
        keymap_file=tmp_path / "keys.toml",
    )
    async with app.run_test(size=(120, 30)) as pilot:
        table = app.query_one("#hosts-table", HostsTable)

        async def wait_up() -> None:
            for _ in range(100):
                await pilot.pause(0.1)
                if "here" in table.rows and table.cell_text("here", "state") == "up":
                    return
            raise AssertionError(f"not up: {app.client.state.snapshot()}")

        await wait_up()
        assert table.cell_text("here", "agent") == bundle.version[:8]
        # its 2 simulated GPUs (busy: those another test's job on this machine may load meanwhile:
        # the paper GPUs count this account's tagged processes in this PID namespace)
        busy, _, rest = table.cell_text("here", "gpus").partition("/")
        assert busy in ("0", "1", "2") and rest == "2 sim"
        assert "2 total" in str(app.query_one("#summary").render())
        assert (tmp_path / "state" / "agent" / bundle.version / "agent.pyz").exists()
        await pilot.press("c")  # reconnect: the monitor connects again and the host comes back
        await pilot.pause(0.3)
        await wait_up()
        await pilot.press("2")  # the GPU view shows both simulated GPUs
        await pilot.pause(0.5)
        gpus = app.query_one("#gpus-table", GpusTable)
        assert gpus.row_count == 2
        assert gpus.cell_text(gpus.cursor_key or "", "host") == "here"


def test_rigdeck_opens_on_this_machine_in_tmux(tmp_path: Path) -> None:
    """No inventory anywhere: `rigdeck` manages this machine alone, as `make run` does."""
    require(shutil.which("tmux"), TMUX_MISSING)
    home = tmp_path / "home"
    home.mkdir()
    session = f"rdk-{uuid.uuid4().hex[:8]}"
    # COLUMNS and LINES (a pytest-xdist worker has COLUMNS=80) would size the app, not tmux's window.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RIGDECK_", "TMUX")) and k not in ("COLUMNS", "LINES")}
    env.update(HOME=str(home), TERM="xterm-256color", RIGDECK_HOME=str(home / "rigdeck"))
    cmd = f"{sys.executable} -m tui.cli"
    subprocess.run(
        ["tmux", "-L", session, "new-session", "-d", "-s", session, "-x", "120", "-y", "30", cmd],
        check=True,
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        screen = ""
        for _ in range(60):
            time.sleep(0.5)
            screen = subprocess.run(
                ["tmux", "-L", session, "capture-pane", "-p", "-t", session], capture_output=True, text=True
            ).stdout
            if "hosts 1/1 up" in screen:
                break
        assert "hosts 1/1 up" in screen, screen
        assert "this machine (no inventory)" in screen
        assert os.uname().nodename in screen
        subprocess.run(["tmux", "-L", session, "send-keys", "-t", session, "q"], check=True)
        for _ in range(20):
            time.sleep(0.25)
            alive = subprocess.run(["tmux", "-L", session, "has-session", "-t", session], capture_output=True)
            if alive.returncode != 0:
                break
        assert alive.returncode != 0, "the app did not quit on 'q'"
        assert (home / ".rigdeck" / "agent" / "current").exists()
    finally:
        subprocess.run(["tmux", "-L", session, "kill-server"], capture_output=True)


# -- a terminal that goes away ---------------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent


def _watch(fd: int | None) -> tuple[HangupWatch, list[str], threading.Event]:
    reasons: list[str] = []
    called = threading.Event()

    def gone(reason: str) -> None:
        reasons.append(reason)
        called.set()

    return HangupWatch(fd, gone), reasons, called


def test_the_hangup_watch_calls_once_on_sighup() -> None:
    # Whatever this test run inherited (under nohup SIGHUP comes in ignored), the case here is
    # a terminal's default disposition.
    inherited = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        watch, reasons, called = _watch(None)
        watch.start()
        try:
            assert signal.getsignal(signal.SIGHUP) not in (signal.SIG_DFL, signal.SIG_IGN)
            os.kill(os.getpid(), signal.SIGHUP)
            assert called.wait(5)
            assert reasons == ["SIGHUP"]
        finally:
            watch.stop()
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGHUP, inherited)


def test_the_hangup_watch_leaves_an_ignored_sighup_ignored() -> None:
    """Started under nohup, the app keeps running when its terminal goes: SIGHUP stays ignored."""
    inherited = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        watch, _, called = _watch(None)
        watch.start()
        try:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)
            assert not called.wait(0.5)
        finally:
            watch.stop()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, inherited)


def test_the_hangup_watch_sees_its_pty_hang_up_and_not_a_key() -> None:
    master, slave = os.openpty()
    watch, reasons, called = _watch(slave)
    watch.start()
    try:
        os.write(master, b"q")  # a key nobody reads yet is not a hangup
        assert not called.wait(1.0)
        os.close(master)
        assert called.wait(5)
        assert reasons == ["the terminal hung up"]
    finally:
        watch.stop()
        os.close(slave)


def test_a_stopped_hangup_watch_calls_nobody() -> None:
    master, slave = os.openpty()
    watch, reasons, _called = _watch(slave)
    watch.start()
    watch.stop()
    os.close(master)
    time.sleep(0.6)
    os.close(slave)
    assert reasons == []


def test_terminal_gone_sees_a_hung_up_pty() -> None:
    from tui.app.terminal import terminal_gone

    master, slave = os.openpty()
    try:
        assert not terminal_gone(slave)
        os.write(master, b"x")  # a key waiting to be read is not a hangup, and is not read
        time.sleep(0.05)
        assert not terminal_gone(slave)
        os.close(master)  # what tmux does when its session is killed
        assert terminal_gone(slave)
        assert os.read(slave, 10) in (b"", b"x")  # EOF, as Textual's input thread sees it
    finally:
        os.close(slave)
    assert terminal_gone(slave)  # a closed descriptor is no terminal either


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _is_app(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"tui.cli" in argv or any(a.endswith(b"/bin/rigdeck") for a in argv[:2])


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for a parent (this container's init may never reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize(
    "how",
    [
        "plain",  # the app is the session leader: the kernel's SIGHUP reaches it
        "sighup-ignored",  # as under `trap '' HUP`: only seeing the hung-up terminal ends it
        "make-run",  # make is the leader and waits for the app, which never gets SIGHUP
    ],
)
def test_the_app_exits_when_its_terminal_goes_away(tmp_path: Path, how: str) -> None:
    require(shutil.which("tmux"), TMUX_MISSING)
    home = tmp_path / "home"
    home.mkdir()
    socket = f"rdk-{uuid.uuid4().hex[:8]}"  # a private tmux server: kill-server kills only it
    # COLUMNS and LINES (a pytest-xdist worker has COLUMNS=80) would size the app, not tmux's window.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RIGDECK_", "TMUX")) and k not in ("COLUMNS", "LINES")}
    env.update(HOME=str(home), TERM="xterm-256color", RIGDECK_HOME=str(home / "rigdeck"))
    venv = Path(sys.prefix)
    cmd = {
        "plain": f"{sys.executable} -m tui.cli",
        "sighup-ignored": f"sh -c \"trap '' HUP; exec {sys.executable} -m tui.cli\"",
        # -o: never reinstall into the suite's own venv, whatever the timestamps say.
        "make-run": f"make -C {REPO} -o {venv}/.installed run VENV={venv}",
    }[how]
    tmux = ["tmux", "-L", socket]
    apps: list[int] = []
    rigdeck = [sys.executable, "-m", "tui.cli"]
    job = None
    if how == "make-run":  # a job, running before the app starts, that must outlive it
        spec = tmp_path / "sleeper.toml"
        spec.write_text('name = "sleeper"\ncommand = ["sleep", "300"]\n')
        out = subprocess.run([*rigdeck, "launch", "--json", str(spec)], env=env, cwd=REPO,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        job = json.loads(out.stdout)["job_id"]
    subprocess.run([*tmux, "new-session", "-d", "-s", "app", "-x", "120", "-y", "30", cmd],
                   check=True, env=env, cwd=REPO)
    try:
        pane = int(subprocess.run([*tmux, "display", "-p", "-t", "app", "#{pane_pid}"],
                                  capture_output=True, text=True, check=True).stdout)
        screen = ""
        for _ in range(80):
            time.sleep(0.25)
            screen = subprocess.run([*tmux, "capture-pane", "-p", "-t", "app"],
                                    capture_output=True, text=True).stdout
            if "hosts 1/1 up" in screen:
                break
        assert "hosts 1/1 up" in screen, screen
        apps += [p for p in [pane, *_descendants(pane)] if _is_app(p)]
        assert len(apps) == 1, apps
        daemons = [int(p.read_text()) for p in home.glob(".rigdeck/run/daemon.pid")]
        subprocess.run([*tmux, "kill-server"], check=True)
        deadline = time.monotonic() + 10
        while _alive(apps[0]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(apps[0]), f"the app ({how}) runs on with no terminal"
        # The agent (where jobs live) is not the app's to stop, nor are its jobs.
        assert daemons and all(_alive(p) for p in daemons)
        if job is not None:
            out = subprocess.run([*rigdeck, "status", "--json", job], env=env, cwd=REPO,
                                 capture_output=True, text=True, timeout=60)
            assert json.loads(out.stdout)["state"] == "running", out.stdout + out.stderr
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
        if job is not None:
            subprocess.run([*rigdeck, "stop", "--grace", "1", job], env=env, cwd=REPO,
                           capture_output=True, timeout=60)
        for pid in apps:  # a failed run must not leave an app that starts the agent again
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        bedclean.stop_daemons_under(home)  # the local agent it started, alive as it should be


def test_every_view_module_is_in_the_one_list_with_its_own_id_key_and_binding_ids() -> None:
    """A view is its module under tui/app/views/ and one line in the shell's VIEWS: every module
    there is listed, and the tabs and the view keys come from that list, in its order."""
    from textual.binding import Binding

    from tui.app import shell
    from tui.app.views import base

    modules = {p.stem for p in Path(base.__file__).parent.glob("*.py")} - {"__init__", "base"}
    assert {v.__module__.rsplit(".", 1)[1] for v in shell.VIEWS} == modules
    ids = [v.ID for v in shell.VIEWS]
    assert len(set(ids)) == len(ids) and len({v.KEY for v in shell.VIEWS}) == len(ids)
    assert shell.TABS == tuple(ids)
    keys = [(b.key, b.id) for b in RigdeckApp.BINDINGS if isinstance(b, Binding) and (b.id or "").startswith("view.")]
    assert keys == [(v.KEY, f"view.{v.ID}") for v in shell.VIEWS]
    named = [b.id for v in shell.VIEWS for b in v.help_bindings() if isinstance(b, Binding) and b.id]
    assert len(set(named)) == len(named)  # the user keymap names bindings by id
    for v in shell.VIEWS:  # a view with keys of its own has a group on the help screen
        assert bool(v.HELP_GROUP) == any(isinstance(b, Binding) and b.id for b in v.help_bindings()), v.ID
