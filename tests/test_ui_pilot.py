"""Every action of the app, driven by Textual's pilot over recorded cluster and job data:
launch (file, form, errors at the field), stop with its confirmation, GPU filter and sort, the
log view's rank filter and search, the host key dialog, deploy, reconnect, help, rebinding, and
the Sweeps view (its trials, charts, stop keys, errors)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Input, Static

from tests.kit.pilot import static_text, until
from tests.ui_fixtures import (
    FINGERPRINT,
    JOB,
    OLD_SWEEP,
    SERVERS,
    SWEEP,
    FakeController,
    FakeMonitor,
    RecordedJobs,
    RecordedSweeps,
    cluster_state,
    no_room,
    recorded_app,
    recorded_service,
    recorded_sweeps,
    stage_jobs,
    stop_servers,
)
from tui.app.screens.dialogs import ConfirmStop, ConfirmSweepStop, HelpScreen, TrustHostKey
from tui.app.screens.launch import LaunchScreen
from tui.app.shell import RigdeckApp
from tui.app.widgets.chart import LossChart
from tui.app.widgets.logview import LogView
from tui.app.widgets.stages import COLUMNS, StagesTable
from tui.app.widgets.sweeps import SweepsTable, TrialsTable
from tui.app.widgets.tables import GpusTable, HostsTable, JobsTable, SavesTable
from tui.client import InProcessClient

ROOT = Path(__file__).resolve().parent.parent
TICKER = ROOT / "tests" / "jobscripts" / "ticker.py"

@pytest.fixture(params=["embedded", "server"])
def kind(request: pytest.FixtureRequest) -> Any:
    """Each app test twice: the controller in the app's process, and a server the app attaches to."""
    yield request.param
    stop_servers()


SIZE = (120, 36)


async def launch_screen(app: RigdeckApp, pilot: Pilot[None]) -> LaunchScreen:
    """The launch dialog, once it is mounted and has its focus (slow on a busy machine)."""
    for _ in range(100):
        await pilot.pause(0.02)
        screen = app.screen
        if isinstance(screen, LaunchScreen) and screen.query("#f-name") and app.focused is not None:
            return screen
    raise AssertionError(f"no launch dialog: {app.screen}")


async def test_hosts_view_says_why_a_host_is_down(kind: str) -> None:
    app = recorded_app(kind=kind)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        table = app.query_one("#hosts-table", HostsTable)
        assert [table.cell_text(h, "state") for h in ("h1", "h2", "h3")] == ["up", "up", "down"]
        assert table.cell_text("h1", "gpus") == "2/4 sim"
        await pilot.press("down", "down")
        await pilot.pause()
        detail = static_text(app, "#host-detail")
        assert "h3" in detail and FINGERPRINT in detail and "press t" in detail
        summary = static_text(app, "#summary")
        assert (
            "hosts 2/3 up" in summary
            and "1 down" in summary
            and "5 busy" in summary
            and "refresh 2 Hz" in summary
        )


async def test_the_frame_timer_times_steps_and_frames_and_shows_them_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RIGDECK_FRAME_TIMER", "1")
    app = recorded_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await pilot.pause()
        timer = app.frame_timer
        frames = timer.frames
        app.refresh_views(force=True)  # a step, and the frame it causes
        await pilot.pause()
        assert timer.frames > frames
        assert 0.0 < timer.longest_ms() < 60_000
        app.refresh_views()
        await pilot.pause()
        assert "frames ≤" in static_text(app, "#summary") and " slow" in static_text(app, "#summary")
    monkeypatch.delenv("RIGDECK_FRAME_TIMER")
    app = recorded_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert "frames" not in static_text(app, "#summary")  # only when asked


async def test_gpu_filter_busy_idle_and_sort(kind: str) -> None:
    app = recorded_app(kind=kind)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await pilot.pause()
        table = app.query_one("#gpus-table", GpusTable)
        assert table.row_count == 8
        await pilot.press("slash")
        assert isinstance(app.focused, Input)
        await pilot.press(*"h2", "enter")
        await pilot.pause()
        assert table.row_count == 4 and all(
            table.cell_text(k, "host") == "h2" for k in table._order
        )
        assert "'h2'" in static_text(app, "#gpus-status")
        await pilot.press("escape")  # clears the filter
        await pilot.pause()
        assert table.row_count == 8
        await pilot.press("b")
        await pilot.pause()
        assert table.row_count == 5  # busy: four ranks and bob's process
        assert any(table.cell_text(k, "job").startswith("bob pid") for k in table._order)
        await pilot.press("b")
        await pilot.pause()
        assert table.row_count == 3  # idle
        await pilot.press("b", "o")  # all again, then sort by utilization
        await pilot.pause()
        utils = [int(table.cell_text(k, "util").split()[-1].rstrip("%")) for k in table._order]
        assert utils == sorted(utils, reverse=True) and table.row_count == 8
        assert "util ↓" in static_text(app, "#gpus-status")


async def test_launch_from_a_spec_file(tmp_path: Path, kind: str) -> None:
    spec = tmp_path / "ticker.toml"
    spec.write_text(
        f'name = "ticker"\ncommand = ["{{python}}", "{TICKER}", "--steps", "30"]\n'
        "nodes = 2\nprocesses_per_node = 2\ntotal_steps = 30\n"
    )
    jobs = RecordedJobs()
    app = recorded_app(kind=kind, jobs=jobs)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("l")
        screen = await launch_screen(app, pilot)
        await pilot.press(*str(spec), "enter")  # enter in the path loads the file into the form
        await pilot.pause()
        assert screen.query_one("#f-name", Input).value == "ticker"
        assert screen.query_one("#f-total-steps", Input).value == "30"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: jobs.launched)
        await pilot.pause()
        assert [s.name for s in jobs.launched] == ["ticker"]
        assert jobs.launched[0].total_steps == 30 and jobs.launched[0].workdir == str(tmp_path)
        assert not isinstance(app.screen, LaunchScreen)
        assert app.tabs.active == "job" and app.job_id == JOB


async def test_launch_form_shows_errors_at_the_field(kind: str) -> None:
    jobs = RecordedJobs()
    app = recorded_app(kind=kind, jobs=jobs)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("l")
        screen = await launch_screen(app, pilot)
        screen.query_one("#f-name", Input).value = "demo"
        screen.query_one("#f-command", Input).value = f"{sys.executable} -c pass"
        screen.query_one("#f-nodes", Input).value = "two"
        await pilot.press("ctrl+s")
        await pilot.pause()
        err = static_text(screen, "#err-f-nodes")
        assert "field 'nodes'" in err and "integer" in err and '"two"' in err
        assert screen.query_one("#f-nodes").has_class("-invalid")
        assert not jobs.launched
        # Fixed, but the cluster has no room: the placement error shows at the placement field.
        jobs.launch_error = no_room()
        screen.query_one("#f-nodes", Input).value = "3"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: "free" in static_text(screen, "#err-f-nodes"))
        assert "asks 3 nodes" in static_text(screen, "#err-f-nodes")
        assert static_text(screen, "#err-f-name") == ""
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, LaunchScreen)
        assert not jobs.launched


async def test_stop_asks_first_and_shows_what_it_stops(kind: str) -> None:
    jobs = RecordedJobs()
    app = recorded_app(kind=kind, jobs=jobs)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("3")
        await pilot.pause()
        assert app.query_one("#jobs-table", JobsTable).cursor_key == JOB
        await pilot.press("s")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmStop)
        body = static_text(app.screen, "#stop-body")
        assert (
            "4 rank(s) on 2 host(s)" in body
            and "h1" in body
            and "ranks 2, 3" in body
            and "GPUs 0, 1" in body
        )
        await pilot.press("n")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmStop) and jobs.stopped == []
        await pilot.press("s")
        await pilot.pause()
        await pilot.press("y")
        await until(pilot, lambda: jobs.stopped)
        assert jobs.stopped == [JOB]
        # A job that has ended is not stopped again.
        await pilot.press("down")
        await pilot.press("s")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmStop)


async def test_jobs_view_retries_an_ended_job_and_moves_a_jobs_priority() -> None:
    import types

    jobs = RecordedJobs()
    svc = recorded_service(FakeController(), FakeMonitor(cluster_state()), jobs, RecordedSweeps())
    calls: list[tuple[str, str, int | None]] = []

    def retry(ref: str, *, queue: bool = True, user: str | None = None) -> Any:
        calls.append(("retry", ref, None))
        return types.SimpleNamespace(job_id="again-1", state="queued")

    def reprioritise(ref: str, priority: int, *, user: str | None = None) -> Any:
        calls.append(("priority", ref, priority))
        return types.SimpleNamespace(job_id=ref, state="running")

    svc.retry, svc.reprioritise = retry, reprioritise
    svc.view = lambda ref: types.SimpleNamespace(spec={"priority": 2})
    app = recorded_app(client=InProcessClient(service=svc), jobs=jobs)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("3")
        await pilot.pause()
        assert app.query_one("#jobs-table", JobsTable).cursor_key == JOB  # running
        await pilot.press("R")  # not ended: not retried
        await pilot.press("plus")
        await until(pilot, lambda: calls)
        assert calls == [("priority", JOB, 3)]
        await pilot.press("down")  # an ended job
        ended = app.query_one("#jobs-table", JobsTable).cursor_key
        await pilot.press("minus")  # ended: its priority no longer matters
        await pilot.press("R")
        await until(pilot, lambda: len(calls) == 2)
        assert calls[1] == ("retry", ended, None)
        await until(pilot, lambda: any("retried as again-1" in n.message for n in app._notifications))
        said = [n.message for n in app._notifications]
        assert any("only an ended job is retried" in m for m in said), said
        assert any("its priority no longer matters" in m for m in said), said


async def test_logs_rank_filter_follow_and_search(kind: str) -> None:
    app = recorded_app(kind=kind)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("6")
        view = app.query_one("#log-view", LogView)
        # From a server: after its first answers. Following, the end comes into view after the
        # refresh that lays out the lines (LogView.sync), not at once.
        await until(pilot, lambda: view.line_count == 105 and view.scroll_y == view.max_scroll_y > 0)
        assert view.line_count == 105 and view.follow
        assert view.scroll_y == view.max_scroll_y > 0  # following: the end is in view
        await pilot.press("r")
        await pilot.pause()
        lines = view.visible_text()
        assert view.rank == 0 and len(lines) == 27 and all(ln.startswith("[h1 r0]") for ln in lines)
        assert "rank 0" in static_text(app, "#logs-status")
        await pilot.press("r", "r")
        await pilot.pause()
        assert view.rank == 2 and all(ln.startswith("[h2 r2]") for ln in view.visible_text())
        await pilot.press("r", "r")  # past the last rank: all of them again
        await pilot.pause()
        assert view.rank is None and view.line_count == 105
        await pilot.press("f")
        assert not view.follow
        await pilot.press("slash")
        assert app.focused is app.query_one("#log-search")
        await pilot.press(*"FAILED", "enter")
        await pilot.pause()
        assert view.match_status == "'FAILED': 1/1"
        assert "'FAILED': 1/1" in static_text(app, "#logs-status")
        # The match is in view (render the line it is on).
        pos = view._matches[0]
        assert int(view.scroll_y) <= pos < int(view.scroll_y) + view.size.height


async def test_open_job_views_are_drawn_again_when_a_served_detail_arrives_after_them() -> None:
    """Through a server the open job's detail comes on the client's poller, after the selection:
    the Logs view, drawn while it is still on its way, is drawn again when it arrives (the app's
    clock is fixed here, so no turning second redraws it). The server holds the detail back
    until the view has drawn without it: the order that made the [server] tests flaky."""
    held = threading.Event()
    app = recorded_app(kind="server")
    service = SERVERS[-1].service
    answer = service.job_detail

    def job_detail(job_id: str) -> Any:
        held.wait(20)
        return answer(job_id)

    service.job_detail = job_detail
    try:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("6")
            view = app.query_one("#log-view", LogView)
            await until(pilot, lambda: app.job_id == JOB)
            await pilot.pause(0.2)
            assert app.jobwatch.detail(JOB) is None and view.buffer is None  # drawn without it
            held.set()
            await until(pilot, lambda: view.line_count == 105)
            assert view.line_count == 105 and JOB in static_text(app, "#logs-status")
    finally:
        held.set()
        stop_servers()


async def test_rank_output_cannot_drive_the_terminal(kind: str) -> None:
    """Escape sequences a rank prints are not drawn: no ESC or control reaches the terminal."""
    app = recorded_app(kind=kind)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("6")
        view = app.query_one("#log-view", LogView)
        await until(pilot, lambda: view.buffer is not None and view.line_count > 0)
        assert view.buffer is not None and view.follow
        view.buffer.extend([
            ("h1", 0, "\x1b[2J\x1b[H\x1b]0;owned\x07\x1b[31mTraceback\x1b[0m (most recent call last)"),
            ("h1", 0, "epoch 9\r 50%|#####\r100%|########## done\x1bc"),
        ])
        view.sync()
        await pilot.pause(0.2)
        drawn = ["".join(seg.text for seg in view.render_line(y)) for y in range(view.size.height)]
        assert not [ln for ln in drawn if any(ord(c) < 32 or 0x7F <= ord(c) <= 0x9F for c in ln)]
        assert any("[h1 r0] Traceback (most recent call last)" in ln for ln in drawn), drawn
        assert any(ln.rstrip().endswith("[h1 r0] 100%|########## done\ufffdc") for ln in drawn)
        await pilot.press("f", "slash", *"Traceback (most", "enter")
        await pilot.pause()
        assert view.match_status == "'Traceback (most': 1/1"


async def test_host_key_dialog_shows_the_fingerprint_and_records_it_on_request() -> None:
    ctl = FakeController()
    app = recorded_app(controller=ctl)
    monitor = app.client.monitor
    assert isinstance(monitor, FakeMonitor)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("down", "down", "t")
        await pilot.pause()
        assert isinstance(app.screen, TrustHostKey)
        body = static_text(app.screen, "#hostkey-body")
        assert FINGERPRINT in body and "ssh-ed25519" in body and "10.213.1.13:22" in body
        await pilot.press("n")
        await pilot.pause()
        assert ctl.trusted == []
        await pilot.press("t")
        await pilot.pause()
        await pilot.press("y")
        await until(pilot, lambda: ctl.trusted)
        await pilot.pause(0.1)
        assert ctl.trusted == [("h3", FINGERPRINT)]
        assert monitor.reconnects == ["h3"]
        # A host with a known key has nothing to trust.
        await pilot.press("up", "t")
        await pilot.pause()
        assert not isinstance(app.screen, TrustHostKey)


async def test_deploy_reconnect_help_and_palette() -> None:
    ctl = FakeController()
    app = recorded_app(controller=ctl)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("d")
        await until(pilot, lambda: ctl.deployed)
        assert ctl.deployed == [["h1"]]
        await pilot.press("down", "c")
        assert app.client.monitor.reconnects[-1] == "h2"
        commands = {c.title: c for c in app.get_system_commands(app.screen)}
        assert "Trust the host key of h3" in commands
        commands["Deploy the agent to every host"].callback()
        await until(pilot, lambda: len(ctl.deployed) == 2)
        assert ctl.deployed[-1] is None
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        text = "\n".join(str(w.render()) for w in app.screen.query(".help-group").results(Static))
        for binding_id in (
            "job.launch",
            "job.stop",
            "host.trust",
            "gpus.filter",
            "logs.rank",
            "stop.confirm",
            "view.sweeps",
            "sweeps.stop_trial",
            "sweeps.stop",
        ):
            assert binding_id in text
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)


async def test_keys_can_be_rebound_from_keys_toml(tmp_path: Path, kind: str) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text('"job.launch" = "L"\n[logs]\nrank = "R"\n')
    app = recorded_app(kind=kind, keymap_file=keys)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("l")
        await pilot.pause()
        assert not isinstance(app.screen, LaunchScreen)
        await pilot.press("L")
        await pilot.pause()
        assert isinstance(app.screen, LaunchScreen)
        await pilot.press("escape", "6")
        await pilot.pause()
        view = app.query_one("#log-view", LogView)
        await pilot.press("R")
        assert view.rank == 0


async def test_checkpoint_view_highlights_failed_saves_and_owner_moves(kind: str) -> None:
    app = recorded_app(kind=kind)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("5")
        await until(pilot, lambda: "policy" in static_text(app, "#ckpt-head"))
        head = static_text(app, "#ckpt-head")
        # h1's GPUs are simulated (the placement says so): the owner is labelled as such
        assert "policy host:h3/gpu:0" in head and "owner h1/gpu0 sim r0" in head
        assert "last complete: step 200" in head and "33s ago" in head and "1 failed save" in head
        assert "owner moved: h3/gpu0 → h1/gpu0 sim r0" in head
        saves = app.query_one("#saves-table", SavesTable)
        failed = [k for k in saves._order if saves.cell_text(k, "status") == "failed"]
        assert failed == ["save:150:0:h1"]
        assert all(flag for _, flag in saves.raw(failed[0]) or ())  # the whole row is marked
        assert "No space left" in saves.cell_text(failed[0], "note")


async def test_job_view_mouse_and_theme(kind: str) -> None:
    app = recorded_app(kind=kind)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        await until(pilot, lambda: "step 240/300" in static_text(app, "#job-head"))  # from a server: later
        head = static_text(app, "#job-head")
        assert "step 240/300" in head and "ETA 27s" in head and "ranks 4/4 running" in head
        assert len(app.query_one("#loss").points) == 241
        await pilot.press("2")
        await pilot.pause()
        table = app.query_one("#gpus-table", GpusTable)
        await pilot.click("#gpus-table", offset=(3, 3))  # header + 2 rows: the third GPU
        await pilot.pause()
        assert table.cursor_row == 2
        app.theme = "textual-light"
        await pilot.pause()
        app.refresh_views(force=True)
        await pilot.pause()
        assert table.row_count == 8


async def test_job_view_shows_a_straggler_signal(kind: str) -> None:
    """Step timing where rank 3 (on h2) is slow: the Job view's signals line names it, coloured
    as bad; a job without such timing shows no signals line."""
    plain = recorded_app(kind=kind)
    async with plain.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        await until(pilot, lambda: "step 240/300" in static_text(plain, "#job-head"))
        assert not plain.query_one("#job-signals", Static).display
    stop_servers()

    jobs = RecordedJobs()
    track = jobs._tracks[JOB]
    track.times.add({"rank": r, "host": "h1" if r < 2 else "h2", "step": s, "step_time": 0.9 if r == 3 else 0.3}
                    for s in range(1, 12) for r in range(4))
    track.diagnose(None)
    app = recorded_app(kind=kind, jobs=jobs)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        await until(pilot, lambda: "straggler" in static_text(app, "#job-signals"))
        box = app.query_one("#job-signals", Static)
        text = static_text(app, "#job-signals")
        assert box.display
        assert "straggler: rank 3 on h2 takes 900 ms a step, 3.0x the other ranks' median 300 ms" in text
        assert "look at h2" in text
        spans = {text[sp.start:sp.end]: str(sp.style) for sp in box.render().spans}  # type: ignore[attr-defined]
        assert spans["bad"] == "$error"  # the verdict in the theme's error colour


async def test_job_view_shows_the_stage_panel_of_a_pipeline_parallel_job(kind: str) -> None:
    """A [model_parallel] job: the Job view shows its plan's header and one row per stage,
    expected vs measured, the busiest stage and a high bubble marked; a job without a plan shows
    no panel. Embedded and through a server (the stages cross the wire)."""
    plain = recorded_app(kind=kind)
    async with plain.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        await until(pilot, lambda: "step 240/300" in static_text(plain, "#job-head"))
        assert not plain.query_one("#stages-head", Static).display
        assert not plain.query_one("#stages-table", StagesTable).display
    stop_servers()

    app = recorded_app(kind=kind, jobs=stage_jobs())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        await until(pilot, lambda: "pipeline" in static_text(app, "#stages-head"))
        head = static_text(app, "#stages-head")
        assert "4 stages · optimize speed · schedule interleaved (1F1B) · 8 microbatches" in head
        assert "activation checkpointing off · plan profiled, cuts 3, 4, 6" in head
        # Expected bubble (4-1)/(8+4-1) = 27%; measured: the mean of 1 - busy/step over the stages.
        measured = sum(1 - b / st for st, b in [(0.0410, 0.0301), (0.0412, 0.0395), (0.0409, 0.0198),
                                                 (0.0411, 0.0215)]) / 4
        assert f"bubble expected 27% · measured {measured * 100:.0f}%" in head
        assert "slowest stage 4.8 ms a microbatch, equal-layer split 6 ms" in head
        table = app.query_one("#stages-table", StagesTable)
        assert table.display and table.row_count == 4
        cols = [c.key for c in COLUMNS]
        rows = [[table.cell_text(str(i), c) for c in cols] for i in range(4)]
        assert rows[0] == ["0", "0-2", "r0 h1", "28.8 ms", "30.1 ms", "41 ms", "27%", "295.6 MB", "315.7 MB"]
        assert rows[1][:4] == ["1", "3", "r1 h1", "38.4 ms"] and rows[3][:3] == ["3", "6-7", "r3 h2"]

        def style(stage: int, column: str) -> Any:
            raw = table.current_raw(str(stage))
            assert raw is not None
            return table.render_cell(column, raw[cols.index(column)], table.palette).style  # type: ignore[union-attr]

        warn = table.palette["warn"]
        assert style(1, "busy") == warn and style(0, "busy") != warn  # stage 1, the heavy block, is the busiest
        assert rows[2][6] == "52%" and style(2, "bubble") == warn  # stage 2 waits half its steps: marked
        assert style(0, "bubble") != warn


async def test_a_controller_error_is_reported_not_raised() -> None:
    class Broken(FakeController):
        def deploy(self, names: list[str] | None = None) -> list:  # type: ignore[override]
            raise RuntimeError("deploy exploded")

    app = RigdeckApp(
        InProcessClient(controller=Broken(), monitor=FakeMonitor(cluster_state()), jobs=RecordedJobs()),
        keymap_file=Path("/nonexistent"),
    )
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("d")
        await until(pilot, lambda: any("exploded" in n.message for n in app._notifications))
        assert any("exploded" in n.message and n.severity == "error" for n in app._notifications)
        assert app.is_running


# -- the Sweeps view ------------------------------------------------------------------------


def best_so_far_of(detail: Any) -> list[tuple[int, float]]:
    """The best completed objective up to each trial number, worked out here from the trials."""
    out, best = [], None
    for t in sorted(detail.trials, key=lambda t: t.number):
        if t.state == "completed" and t.value is not None:
            best = t.value if best is None else min(best, t.value)
        if best is not None:
            out.append((t.number, best))
    return out


async def sweeps_shown(app: RigdeckApp, pilot: Pilot[None], rows: int = 2) -> None:
    """Switch to the Sweeps view (7) and wait for its first fetch with the selected detail."""
    await pilot.press("7")
    await until(pilot, lambda: app.sweeps_fetches and app.query_one("#trials-table").row_count
                and app.query_one("#sweeps-table").row_count == rows)
    await pilot.pause()


async def test_sweeps_view_lists_sweeps_and_trials_best_first(kind: str) -> None:
    sweeps = RecordedSweeps()
    app = recorded_app(kind=kind, sweeps=sweeps)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert sweeps.calls == 0  # nothing fetched while the view is hidden
        await sweeps_shown(app, pilot)
        assert app.tabs.active == "sweeps"
        table = app.query_one("#sweeps-table", SweepsTable)
        assert table._order == [SWEEP, OLD_SWEEP] and table.cursor_key == SWEEP
        assert [table.cell_text(SWEEP, c) for c in ("state", "strategy", "trials", "live", "pruned", "failed")] \
            == ["running", "bayesian+median", "10/16", "2", "2", "1"]
        assert table.cell_text(SWEEP, "best") == "0.008938 (#9)"
        assert table.cell_text(OLD_SWEEP, "state") == "completed" and table.cell_text(OLD_SWEEP, "trials") == "6/6"
        head = static_text(app, "#sweep-head")
        assert "best: trial 9" in head and "lr=0.0093 width=136 optimizer=adamw" in head
        assert "12 of 16 asked · 7 completed, 2 pruned, 1 failed" in head
        # Trials: completed ones by objective, lowest first; then the unfinished, newest first.
        trials = app.query_one("#trials-table", TrialsTable)
        assert trials._order == ["9", "3", "5", "8", "1", "4", "2", "12", "11", "10", "7", "6"]
        values = [float(trials.cell_text(k, "objective")) for k in trials._order[:7]]
        assert values == sorted(values) and values[0] == 0.008938
        assert trials.cell_text("9", "params") == "lr=0.0093 width=136 optimizer=adamw"
        assert trials.cell_text("9", "best_step") == "30" and trials.cell_text("9", "time") == "40s"
        assert trials.cell_text("6", "state") == "pruned" and trials.cell_text("6", "pruned") == "9"
        assert trials.cell_text("12", "state") == "running" and trials.cell_text("12", "time") == "2m39s"
        assert trials.cell_text("12", "objective") == "0.7451"  # reported so far (muted)
        assert trials.cell_text("10", "objective") == "-"
        # Best so far by trial number, and the curves of the best three.
        detail = recorded_sweeps()[SWEEP]
        best = app.query_one("#sweep-best", LossChart)
        assert list(best.series[0]) == best_so_far_of(detail)
        trial1 = next(t for t in detail.trials if t.number == 1)
        assert best.series[0][0] == (1, trial1.value) and best.series[0][-1] == (12, 0.008938)
        curves = app.query_one("#sweep-curves", LossChart)
        assert [len(s) for s in curves.series] == [30, 30, 30]
        assert curves.series[0][-1] == (30, 0.008938)
        assert all(f"#{n}" in str(curves.border_subtitle) for n in (9, 3, 5))
        # Another sweep: its trials and chart.
        await pilot.press("down")
        await until(pilot, lambda: trials.row_count == 6)
        assert app.sweep_id == OLD_SWEEP and trials.cursor_key == "4"
        assert "grid-width-sw81d0e4" in static_text(app, "#sweep-head")
        assert list(app.query_one("#sweep-best", LossChart).series[0]) == best_so_far_of(
            recorded_sweeps()[OLD_SWEEP])


async def test_sweeps_refresh_while_shown_and_not_when_hidden() -> None:
    sweeps = RecordedSweeps()
    app = recorded_app(sweeps=sweeps)
    async with app.run_test(size=SIZE) as pilot:
        await sweeps_shown(app, pilot)
        seen = app.sweeps_fetches
        await until(pilot, lambda: app.sweeps_fetches >= seen + 2)
        assert app.sweeps_fetches >= seen + 2  # about once a second
        await pilot.press("1")
        await pilot.pause(0.2)
        calls = sweeps.calls
        await pilot.pause(2.2)
        assert sweeps.calls == calls


async def test_stop_trial_and_stop_sweep_ask_first(kind: str) -> None:
    sweeps = RecordedSweeps()
    app = recorded_app(kind=kind, sweeps=sweeps)
    async with app.run_test(size=SIZE) as pilot:
        await sweeps_shown(app, pilot)
        await pilot.press("enter")  # into the trials
        trials = app.query_one("#trials-table", TrialsTable)
        assert app.focused is trials and trials.cursor_key == "9"
        await pilot.press("s")  # a completed trial is not stopped
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmSweepStop)
        assert any("trial 9 has already ended" in n.message for n in app._notifications)
        await pilot.press(*["down"] * 7)
        assert trials.cursor_key == "12"
        await pilot.press("s")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmSweepStop)
        assert "trial 12" in static_text(app.screen, "#stop-title").replace("[b]", "")
        body = static_text(app.screen, "#stop-body")
        assert "lr=0.0078 width=160 optimizer=adam" in body and "sweep-lr-t12-" in body
        await pilot.press("n")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmSweepStop) and app.tabs.active == "sweeps"
        await pilot.pause(0.3)
        assert sweeps.stopped_trials == [] and sweeps.stopped == []
        await pilot.press("s")
        await pilot.pause()
        await pilot.press("y")
        await until(pilot, lambda: sweeps.stopped_trials)
        assert sweeps.stopped_trials == [(SWEEP, 12)] and sweeps.stopped == []
        # The whole sweep.
        await pilot.press("S")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmSweepStop)
        body = static_text(app.screen, "#stop-body")
        assert "2 trial(s) running" in body and "best: trial 9" in body
        await pilot.press("escape")
        await pilot.pause(0.3)
        assert sweeps.stopped == []
        await pilot.press("S")
        await pilot.pause()
        await pilot.press("y")
        await until(pilot, lambda: sweeps.stopped)
        assert sweeps.stopped == [SWEEP] and sweeps.stopped_trials == [(SWEEP, 12)]
        await until(pilot, lambda: any("sweep-lr-sw3f9c2a: running" in n.message for n in app._notifications))
        # A finished sweep is not stopped again.
        await pilot.press("shift+tab", "down")
        await until(pilot, lambda: app.sweep_id == OLD_SWEEP and trials.row_count == 6)
        await pilot.press("S")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmSweepStop)
        assert any("has already ended (completed)" in n.message for n in app._notifications)
        assert sweeps.stopped == [SWEEP]


async def test_enter_on_a_trial_opens_its_job(kind: str) -> None:
    app = recorded_app(kind=kind)
    async with app.run_test(size=SIZE) as pilot:
        await sweeps_shown(app, pilot)
        await pilot.press("enter", "down", "enter")
        await pilot.pause()
        trial3 = next(t for t in recorded_sweeps()[SWEEP].trials if t.number == 3)
        assert app.tabs.active == "job" and app.job_id == trial3.job_id


async def test_enter_on_a_trial_asked_ahead_says_it_has_no_job_yet() -> None:
    from dataclasses import replace

    sweeps = RecordedSweeps()
    d = sweeps.details[SWEEP]
    running = next(t for t in d.trials if t.state == "running")
    ahead = replace(running, state="ready", curve=(), last_step=None, best_step=None, best_value=None, started=None)
    sweeps.details[SWEEP] = replace(d, trials=tuple(ahead if t is running else t for t in d.trials))
    app = recorded_app(sweeps=sweeps)
    async with app.run_test(size=SIZE) as pilot:
        await sweeps_shown(app, pilot)
        await pilot.press("enter", *["down"] * list(sweeps.details[SWEEP].trials).index(ahead))
        await pilot.pause()
        assert app.query_one("#trials-table", TrialsTable).cursor_row == list(sweeps.details[SWEEP].trials).index(ahead)
        before = app.job_id
        await pilot.press("enter")
        await pilot.pause()
        assert app.tabs.active == "sweeps" and app.job_id == before  # no job to open
        shown = [str(n.message) for n in app._notifications]
        assert any(f"Trial {ahead.number} was asked ahead" in m for m in shown), shown


async def test_sweeps_view_empty_state() -> None:
    app = recorded_app(sweeps=RecordedSweeps(empty=True))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("7")
        await until(pilot, lambda: app.sweeps_fetches)
        await pilot.pause()
        assert static_text(app, "#sweeps-status") == "no sweeps: rigdeck sweep SPEC starts one"
        assert app.query_one("#sweeps-table").row_count == 0
        await pilot.press("s", "S")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmSweepStop)
        assert any("no sweep selected" in n.message for n in app._notifications)


async def test_a_sweeps_error_is_shown_and_the_view_recovers(kind: str) -> None:
    sweeps = RecordedSweeps()
    sweeps.error = RuntimeError("the sweep store is locked")
    app = recorded_app(kind=kind, sweeps=sweeps)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("7")
        await until(pilot, lambda: "locked" in static_text(app, "#sweeps-status"))
        assert "the sweep store is locked" in static_text(app, "#sweeps-status")
        assert app.query_one("#sweeps-table").row_count == 0 and app.is_running
        sweeps.error = None
        await until(pilot, lambda: app.query_one("#sweeps-table").row_count == 2)
        assert "locked" not in static_text(app, "#sweeps-status")
        # Failing again: the last rows stay, with the error above them.
        sweeps.error = RuntimeError("the sweep store is locked")
        await until(pilot, lambda: "locked" in static_text(app, "#sweeps-status"))
        assert "showing the last fetched" in static_text(app, "#sweeps-status")
        assert app.query_one("#sweeps-table").row_count == 2


async def test_sweeps_view_over_a_server_whose_link_goes_down() -> None:
    """The server goes away: the view says so and keeps what it had; the app never waits."""
    app = recorded_app(kind="server")
    try:
        async with app.run_test(size=SIZE) as pilot:
            await sweeps_shown(app, pilot)
            stop_servers()
            for _ in range(300):  # the link's own wait for a reconnection: about 5 s
                await pilot.pause(0.05)
                if app.sweeps_error:
                    break
            status = static_text(app, "#sweeps-status")
            assert "server" in status and "showing the last fetched" in status, status
            assert app.query_one("#sweeps-table").row_count == 2
            await pilot.press("1")  # the UI answers meanwhile
            await pilot.pause()
            assert app.tabs.active == "hosts"
    finally:
        stop_servers()


async def test_launch_dialog_shows_code_sync_progress_per_host(tmp_path: Path) -> None:
    """[code] sync: while the launch waits for the hosts to get the code, the dialog says how far
    each is; the form keeps the spec's [code] table (and no workdir)."""
    (tmp_path / "src").mkdir()
    spec = tmp_path / "synced.toml"
    spec.write_text(f'name = "synced"\ncommand = ["{{python}}", "{TICKER}"]\nnodes = 2\n[code]\nsync = "src"\n')
    jobs = RecordedJobs()
    app = recorded_app(kind="embedded", jobs=jobs)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("l")
        screen = await launch_screen(app, pilot)
        await pilot.press(*str(spec), "enter")
        await pilot.pause()
        assert screen.query_one("#f-workdir", Input).value == ""
        app._code_progress("h2", 0, 0)
        app._code_progress("h1", 3 << 20, 12 << 20)
        await pilot.pause()
        status = static_text(screen, "#launch-status")
        assert "code → h1 3.0 MB of 12.0 MB, h2 has it" in status, status
        await pilot.press("ctrl+s")
        await until(pilot, lambda: jobs.launched)
        assert jobs.launched[0].code is not None and jobs.launched[0].code.sync == str(tmp_path / "src")


def test_the_job_view_line_for_synced_code() -> None:
    from tui.app.views.job import code_markup

    code = {"sync": "/src", "tree": "ab" * 32, "files": 3, "size": 2048}
    assert code_markup(None, []) is None
    assert "not yet synced" in (code_markup(code, []) or "")
    events = [{"event": "code", "hosts": {"h2": {"had_tree": True},
                                          "h1": {"had_tree": False, "files_sent": 1, "bytes_sent": 512}}}]
    line = code_markup(code, events) or ""
    assert line.startswith("code [b]abababababab[/b] · 3 files 2.0 KB"), line
    assert "synced: h1 +1 (512 B), h2 had it" in line, line


# -- the Usage view -------------------------------------------------------------------------------


async def test_usage_view_shows_each_persons_gpu_hours_per_week_and_their_sums(kind: str) -> None:
    """The bars and the table are the controller's usage (through the server, too): each
    person's weekly figures add up to their total, which is the sum of their jobs' GPU time."""
    from tests.ui_fixtures import NOW, usage_records
    from tui.model.usage import gpu_seconds, recent_weeks

    app = recorded_app(kind=kind)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        view = app.views["usage"]
        assert view.usage_reads == 0  # nothing read while the view is hidden
        await pilot.press("u")
        await until(pilot, lambda: view.usage_reads >= 1)
        await pilot.pause()
        report = view.usage_report
        assert report is not None and view.usage_error is None
        want = {}
        for rec in usage_records():
            want[rec["user"]] = want.get(rec["user"], 0.0) + gpu_seconds(rec, NOW) / 3600
        assert {r.key: round(r.gpu_hours, 6) for r in report.rows} == {k: round(v, 6) for k, v in want.items()}
        chart = str(app.query_one("#usage-chart", Static).render())
        lines = chart.splitlines()
        assert len(lines) == 3 * 6 and [ln.split()[0] for ln in lines[::6]] == ["alice", "bob", "carol"]
        for week in recent_weeks(NOW, 6):
            assert week in chart
        # alice's week with her big job has the longest bar; each figure is the week's GPU hours
        big = max(lines[:6], key=lambda ln: ln.count("█"))
        assert "48.00 GPU h" in big
        table = str(app.query_one("#usage-table", Static).render())
        assert "total" in table and "1" in table.split("bob")[1].split()[2]  # bob's preempted job


async def test_layouts_and_replaced_component_styles_are_freed_without_the_collector() -> None:
    """The app frees what Textual left to the garbage collector (tui/app/cycles.py): a
    table's old component styles (a "virtual" node each) go as soon as new ones replace them,
    and the compositor's map is held by nothing of the function that made it."""
    import gc
    import weakref

    app = recorded_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        await pilot.pause()
        table = app.query_one("#gpus-table", GpusTable)
        old = [weakref.ref(s.node) for s in table._component_styles.values() if s.node is not None]
        assert old
        gc.disable()
        try:
            app.update_styles(table)
            await pilot.pause()
            assert all(ref() is None for ref in old)  # by reference count alone
            table.refresh(layout=True)
            await pilot.pause()
            compositor = app.screen._compositor
            placed = compositor._visible_map or compositor._full_map
            assert placed is not None
            assert not [r for r in gc.get_referrers(placed) if type(r).__name__ == "cell"]
        finally:
            gc.enable()
