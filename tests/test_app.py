"""The app on this machine alone: driven headless by Textual's pilot, and in tmux as a user
sees it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tui.app import RigdeckApp
from tui.bundle import build_agent
from tui.controller import Controller
from tui.inventory import HostSpec, Inventory
from tui.widgets.tables import GpusTable, HostsTable


async def test_app_shows_the_local_host_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RIGDECK_HOME", str(tmp_path / "home"))
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
        Controller(inv, bundle_factory=lambda: bundle), keymap_file=tmp_path / "keys.toml"
    )
    async with app.run_test(size=(120, 30)) as pilot:
        table = app.query_one("#hosts-table", HostsTable)

        async def wait_up() -> None:
            for _ in range(100):
                await pilot.pause(0.1)
                if "here" in table.rows and table.cell_text("here", "state") == "up":
                    return
            raise AssertionError(f"not up: {app.monitor.state.snapshot()}")

        await wait_up()
        assert table.cell_text("here", "agent") == bundle.version[:8]
        assert table.cell_text("here", "gpus") == "0/2 sim"
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


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")
def test_rigdeck_opens_on_this_machine_in_tmux(tmp_path: Path) -> None:
    """No inventory anywhere: `rigdeck` manages this machine alone, as `make run` does."""
    home = tmp_path / "home"
    home.mkdir()
    session = f"rdk-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RIGDECK_", "TMUX"))}
    env.update(HOME=str(home), TERM="xterm-256color", RIGDECK_HOME=str(home / "rigdeck"))
    cmd = f"{sys.executable} -m tui.cli"
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "30", cmd],
        check=True,
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        screen = ""
        for _ in range(60):
            time.sleep(0.5)
            screen = subprocess.run(
                ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True
            ).stdout
            if "hosts 1/1 up" in screen:
                break
        assert "hosts 1/1 up" in screen, screen
        assert "this machine (no inventory)" in screen
        assert os.uname().nodename in screen
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        for _ in range(20):
            time.sleep(0.25)
            alive = subprocess.run(["tmux", "has-session", "-t", session], capture_output=True)
            if alive.returncode != 0:
                break
        assert alive.returncode != 0, "the app did not quit on 'q'"
        assert (home / ".rigdeck" / "agent" / "current").exists()
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
