"""The Doctor view (0), driven by Textual's pilot over a recorded report
(tests/doctor_fixtures.py): D runs the doctor on a worker thread and shows its progress, then
the findings grouped by check with bad first, the skipped checks and the p2p matrix with h3's
links marked; an error (the client without a doctor, or one that raises) is an error line and
the view recovers; a hung doctor never freezes the app; and a snapshot."""

from __future__ import annotations

import threading
from typing import Any

from textual.pilot import Pilot
from textual.widgets import Static

from tests.doctor_fixtures import JOBS, STARTED, RecordedDoctor, doctor_app, report
from tests.kit.pilot import static_text, until
from tests.ui_fixtures import NOW
from tui.app.widgets.doctor import (
    FindingsTable,
    figure,
    finding_rows,
    matrix_markup,
    p2p_matrix,
    pair_of,
    summary_markup,
)
from tui.model.doctor import DoctorReport, Finding

SIZE = (120, 36)


def messages(app: Any) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def ran(app: Any, pilot: Pilot[None], runs: int = 1) -> None:
    await until(pilot, lambda: app.doctor_runs >= runs)
    await pilot.pause()


async def test_d_runs_the_doctor_and_shows_progress_then_the_report() -> None:
    doc = RecordedDoctor()
    doc.gate = threading.Event()
    app = doctor_app(doc)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("0")
            await pilot.pause()
            assert app.tabs.active == "doctor"
            assert "no doctor run yet: press D" in static_text(app, "#doctor-status")
            assert doc.calls == []  # nothing runs until asked
            await pilot.press("D")
            await until(pilot, lambda: doc.started.is_set())
            await until(pilot, lambda: "running… (1s)" in static_text(app, "#doctor-status"))
            assert "running… (1s)" in static_text(app, "#doctor-status")
            assert app.query_one("#doctor-table").row_count == 0
            await pilot.press("D")  # one run at a time
            await pilot.pause()
            assert any("already running" in m for m in messages(app)) and len(doc.calls) == 1
            doc.gate.set()
            await ran(app, pilot)
            status = static_text(app, "#doctor-status")
            assert "running" not in status
            assert "doctor: bad" in status and "3 bad · 0 warn · 8 ok" in status
            assert "3 host(s) h1,h2,h3" in status and "ran 2m05s ago, took 48s" in status
            assert f"3 job(s) {JOBS[0]}" in status
            assert "skipped: gpu: no NVML (simulated GPUs)" in status
            assert doc.calls == [(None, None)]  # every host, every check
    finally:
        doc.gate.set()


async def test_the_table_is_grouped_by_check_with_bad_first() -> None:
    app = doctor_app(RecordedDoctor())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("0", "D")
        await ran(app, pilot)
        table = app.query_one("#doctor-table", FindingsTable)
        assert table._order == [
            "allreduce/all",
            "p2p/h1<->h3", "p2p/h2<->h3", "p2p/h1<->h2",
            "disk/h1", "disk/h2", "disk/h3",
            "versions/h3", "versions/all",
            "clock/h2", "clock/h3",
        ]
        # The check named once per group.
        assert [table.cell_text(k, "check") for k in table._order[:4]] == ["allreduce", "p2p", "", ""]
        assert table.cell_text("p2p/h2<->h3", "verdict") == "bad"
        assert table.cell_text("p2p/h2<->h3", "value") == "139 MB/s"
        assert "12% of the median 1180 MB/s" in table.cell_text("p2p/h2<->h3", "summary")
        assert table.cell_text("versions/h3", "summary") == "torch: missing on h3; 2.5.1 on h1, h2"
        assert "install torch 2.5.1 on h3" in table.cell_text("versions/h3", "advice")
        assert table.cell_text("p2p/h1<->h2", "advice") == "-"
        # The finding under the cursor in full, under the table.
        assert table.cursor_key == "allreduce/all"
        assert "busbw 1.42 GB/s, algbw 1.07 GB/s at 64 MB" in static_text(app, "#doctor-detail")
        await pilot.press("down", "down")
        assert table.cursor_key == "p2p/h2<->h3"
        detail = static_text(app, "#doctor-detail")
        assert "p2p h2<->h3 bad · 139 MB/s, 0.64 ms; 12% of the median 1180 MB/s" in detail
        assert "check this link: its NICs, cables, switch port and any rate limit (tc qdisc)" in detail
        assert "size_mb=64 latency_ms=0.64" in detail
        pal = table.palette
        assert table.render_cell("verdict", "bad", pal).style == pal["crit"]
        assert table.render_cell("verdict", "warn", pal).style == pal["warn"]
        assert table.render_cell("verdict", "ok", pal).style == pal["ok"]


async def test_the_matrix_marks_h3s_links() -> None:
    app = doctor_app(RecordedDoctor())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("0", "D")
        await ran(app, pilot)
        box = app.query_one("#doctor-matrix", Static)
        assert box.display
        text = static_text(app, "#doctor-matrix")
        lines = text.splitlines()
        assert lines[0].split() == ["h1", "h2", "h3"]
        assert lines[1].split() == ["h1", "·", "1180", "MB/s", "143", "MB/s"]
        assert lines[3].split() == ["h3", "143", "MB/s", "139", "MB/s", "·"]
        assert "slowest: h2<->h3 139 MB/s, 88% below the typical link 1180 MB/s" in text
        assert "every link of h3 is slow: look at that host's network" in text
    m = p2p_matrix(report())
    assert m is not None and m.hosts == ("h1", "h2", "h3")
    assert m.level("h2", "h3") == m.level("h3", "h2") == "slowest"
    assert m.level("h1", "h3") == "crit" and m.level("h1", "h2") == "ok"
    assert m.suspects == ("h3",)
    lines = matrix_markup(m).splitlines()
    assert "[reverse $error b]" in lines[2]  # h2's row: its h3 cell
    assert lines[3].startswith("[b $error]h3") and lines[1].startswith("[b]h1")  # h3 named red
    # Every link slow alike: no host to blame.
    from dataclasses import replace

    r = report()
    even = replace(r, findings=tuple(replace(f, verdict="bad", value=100.0) if f.check == "p2p" else f
                                     for f in r.findings))
    m2 = p2p_matrix(even)
    assert m2 is not None and m2.suspects == () and len(m2.slowest) == 3


async def test_no_doctor_in_the_client_is_an_error_line_and_the_view_recovers() -> None:
    """A client without a doctor (NotImplementedError: e.g. an older server's) is shown, not
    raised; a later run that works replaces it."""
    app = doctor_app()

    def no_doctor(*args: object, **kw: object) -> None:
        raise NotImplementedError

    app.client.doctor = no_doctor
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("0", "D")
        await ran(app, pilot)
        assert app.is_running
        assert "this controller has no doctor yet (NotImplementedError)" in static_text(app, "#doctor-status")
        assert "D runs it again" in static_text(app, "#doctor-status")
        assert app.query_one("#doctor-table").row_count == 0
        assert not app.query_one("#doctor-matrix").display and not app.query_one("#doctor-detail").display
        doc = RecordedDoctor()
        app.client.doctor = doc
        await pilot.press("D")
        await ran(app, pilot, 2)
        status = static_text(app, "#doctor-status")
        assert "NotImplementedError" not in status and "doctor: bad" in status


async def test_an_error_keeps_the_last_report_shown() -> None:
    doc = RecordedDoctor()
    app = doctor_app(doc)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("0", "D")
        await ran(app, pilot)
        doc.error = RuntimeError("h2: agent not reachable")
        await pilot.press("D")
        await ran(app, pilot, 2)
        status = static_text(app, "#doctor-status")
        assert "doctor: h2: agent not reachable (showing the last report)" in status
        assert "doctor: bad" in status
        assert app.query_one("#doctor-table").row_count == 11
        doc.error = None
        await pilot.press("D")
        await ran(app, pilot, 3)
        assert "agent not reachable" not in static_text(app, "#doctor-status")


async def test_a_hung_doctor_does_not_freeze_the_app() -> None:
    """The doctor never answers: the app keeps answering keys, other views work, and the view
    counts the seconds; a run that ends while another view shows is a toast."""
    doc = RecordedDoctor()
    doc.gate = threading.Event()
    app = doctor_app(doc)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("0", "D")
            await until(pilot, lambda: doc.started.is_set())
            await pilot.press("3")
            await pilot.pause()
            assert app.tabs.active == "jobs" and app.query_one("#jobs-table").row_count
            await pilot.press("0")
            await until(pilot, lambda: "running… (2s)" in static_text(app, "#doctor-status"))
            assert app.doctor_running and "running… (2s)" in static_text(app, "#doctor-status")
            await pilot.press("1")
            doc.gate.set()
            await until(pilot, lambda: app.doctor_runs)
            assert app.tabs.active == "hosts"
            assert any("doctor: bad (0 shows it)" in m for m in messages(app))
            await pilot.press("0")
            await pilot.pause()
            assert app.query_one("#doctor-table").row_count == 11
    finally:
        doc.gate.set()


async def test_help_lists_the_doctor_keys_and_they_can_be_rebound(tmp_path: Any) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text('[doctor]\nrun = "R"\n')
    doc = RecordedDoctor()
    app = doctor_app(doc, keymap_file=keys)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.keymap_problems == []
        groups = dict(app.binding_groups())
        assert ("R", "Run doctor", "doctor.run") in groups["Doctor view"]
        assert ("0", "Doctor", "view.doctor") in groups["Everywhere"]
        await pilot.press("0", "D")
        await pilot.pause(0.3)
        assert doc.calls == []
        await pilot.press("R")
        await ran(app, pilot)
        assert doc.calls == [(None, None)]


async def test_the_palette_runs_the_doctor_from_any_view() -> None:
    doc = RecordedDoctor()
    app = doctor_app(doc)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.tabs.active == "hosts"
        commands = {c.title: c for c in app.get_system_commands(app.screen)}
        commands["Run the doctor over every host"].callback()
        await ran(app, pilot)
        assert app.tabs.active == "doctor" and doc.calls == [(None, None)]
        assert app.query_one("#doctor-table").row_count == 11


def test_rows_summary_and_figures() -> None:
    assert figure(1180.0, "MB/s") == "1180 MB/s" and figure(1.42, "GB/s") == "1.42 GB/s"
    assert figure(0.0239, "GB/s") == "23.9 MB/s" and figure(0.84, "GB/s") == "840 MB/s"
    assert figure(12.25, "ms") == "12.2 ms" and figure(None, "") == "-"
    assert pair_of("h1<->h3") == ("h1", "h3") and pair_of("h1") is None and pair_of("all") is None
    r = DoctorReport(hosts=("a", "b"), started=STARTED, ended=None, findings=(
        Finding("clock", "b", "warn", "offset 40 ms", value=40.0, unit="ms"),
        Finding("clock", "a", "ok", "offset 0 ms"),
        Finding("clock", "a", "bad", "again"),
    ))
    rows = finding_rows(r)
    assert [k for k, _ in rows] == ["clock/a", "clock/b", "clock/a#1"]
    assert [raw[2] for _, raw in rows] == ["bad", "warn", "ok"]
    line = summary_markup(r, NOW)
    assert "no jobs" in line and "took" not in line and "1 bad" in line
    assert p2p_matrix(r) is None  # no p2p pairs: no matrix


def _doctor(*keys: str) -> Any:
    async def run_before(pilot: Pilot[Any]) -> None:
        app: Any = pilot.app
        await pilot.pause()
        await pilot.press("0", "D")
        for _ in range(100):
            await pilot.pause(0.05)
            if app.doctor_runs:
                break
        app.clear_notifications()
        if keys:
            await pilot.press(*keys)
        await pilot.pause()

    return run_before


def test_snapshot_doctor_view(snap_compare: Any) -> None:
    """The recorded report: h3's links bad, torch drift, gpu skipped; the matrix; the cursor on
    h1<->h3, its advice in full below the table."""
    assert snap_compare(doctor_app(RecordedDoctor()), terminal_size=(120, 36), run_before=_doctor("down"))
