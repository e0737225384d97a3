"""What the faces show of a job made of worker pools (docs/contracts.md, "Worker pools: controller
rules and what the faces show"): the Job view's pools panel (role, replicas, hosts, state per pool,
the Reduction Server sizing line, the replica failures training went on after), the stop
confirmation's list of pools, a failure cause that names the pool, and ``rigdeck status`` (text
and ``--json``). Over recorded jobs (tests/ui_fixtures.py ``pool_jobs``), embedded and through a
server; the real run is the test bed's end-to-end test.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

import pytest
from textual.widgets import Static

from tests.kit.pilot import static_text, until
from tests.test_ui_pilot import SIZE
from tests.ui_fixtures import EVAL_KILLED, JOB, POOL_SIZING, pool_jobs, recorded_app, stop_servers
from tui.app.screens.dialogs import ConfirmStop
from tui.app.widgets.pools import COLUMNS, PoolsTable
from tui.app.widgets.tables import JobsTable, RanksTable
from tui.control.jobwatch import JobsSnapshot
from tui.control.server import encode_detail
from tui.model import wire
from tui.model.jobview import JobDetail, JobView
from tui.model.poolview import PoolsView

main_mod = importlib.import_module("tui.cli.main")


@pytest.fixture(params=["embedded", "server"])
def kind(request: pytest.FixtureRequest) -> Any:
    """Each app test twice: the controller in the app's process, and a server the app attaches to."""
    yield request.param
    stop_servers()


def table_rows(table: PoolsTable, keys: list[str]) -> list[list[str]]:
    return [[table.cell_text(k, c.key) for c in COLUMNS] for k in keys]


async def test_job_view_shows_the_pools_panel_of_a_pool_job(kind: str) -> None:
    """One row per pool in pool order, with its replicas, hosts and state from the hosts'
    replicas; the sizing line and the evaluator killed while training went on above it. A job
    without pools shows no panel."""
    plain = recorded_app(kind=kind)
    async with plain.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        await until(pilot, lambda: "step 240/300" in static_text(plain, "#job-head"))
        assert not plain.query_one("#pools-head", Static).display
        assert not plain.query_one("#pools-table", PoolsTable).display
    stop_servers()

    app = recorded_app(kind=kind, jobs=pool_jobs())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("4")
        await until(pilot, lambda: "pools" in static_text(app, "#pools-head"))
        head = static_text(app, "#pools-head")
        assert "pools 4 pools · 5 replicas" in head
        assert f"sizing: {POOL_SIZING['text']}" in head
        assert EVAL_KILLED in head
        table = app.query_one("#pools-table", PoolsTable)
        assert table.display and table.row_count == 4
        keys = ["primary", "worker", "reduction_server", "evaluator"]
        assert table_rows(table, keys) == [
            ["primary", "1", "h1", "running", "stops the gang"],
            ["worker", "2", "h1, h2", "running", "stops the gang"],
            ["reduction_server", "1", "h3", "running", "stops the gang"],
            ["evaluator", "1", "h3", "failed", "training continues"],
        ]
        raw = table.current_raw("evaluator")
        assert raw is not None
        failed_style = table.render_cell("state", raw[3], table.palette).style  # type: ignore[union-attr]
        assert failed_style == table.palette["crit"]
        # Two replicas on h1: each rank's GPU is its own node's (ranks contiguous in node order).
        ranks = app.query_one("#ranks-table", RanksTable)
        await until(pilot, lambda: ranks.row_count == 5)
        assert [ranks.cell_text(str(i), "gpu") for i in range(5)] == ["0 sim", "1 sim", "0 sim", "-", "-"]


async def test_the_stop_confirmation_lists_the_pools_it_stops(kind: str) -> None:
    jobs = pool_jobs()
    app = recorded_app(kind=kind, jobs=jobs)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("3")
        table = app.query_one("#jobs-table", JobsTable)
        await until(pilot, lambda: table.row_count == 3)
        assert table.cursor_key == JOB
        await pilot.press("s")
        await until(pilot, lambda: isinstance(app.screen, ConfirmStop))
        assert isinstance(app.screen, ConfirmStop)
        body = static_text(app.screen, "#stop-body")  # type: ignore[arg-type]
        # Every host once, with all its replicas' ranks and GPUs; then the pools.
        assert "5 rank(s) on 3 host(s)" in body
        assert "h1: ranks 0, 1 on GPUs 0, 1" in body and "h3: ranks 3, 4" in body
        assert "Its 4 pools all stop:" in body
        for line in ("primary: 1 replica on h1", "worker: 2 replicas on h1, h2",
                     "reduction_server: 1 replica on h3", "evaluator: 1 replica on h3"):
            assert line in body
        await pilot.press("y")
        await until(pilot, lambda: jobs.stopped)
        assert jobs.stopped == [JOB]


async def test_a_pool_jobs_failure_cause_names_the_pool(kind: str) -> None:
    jobs = pool_jobs(evaluator_failed=False)
    track = jobs._tracks[JOB]
    track.rec = {**track.rec, "state": "failed", "ended": track.rec["started"] + 60,
                 "cause": {"host": "h2", "rank": 2, "exit_code": 1, "signal": None, "pool": "worker", "replica": 1}}
    jobs._snapshot = JobsSnapshot(tuple(t.row() for t in jobs._tracks.values()), 3)
    app = recorded_app(kind=kind, jobs=jobs)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("3")
        table = app.query_one("#jobs-table", JobsTable)
        await until(pilot, lambda: table.row_count == 3)
        app.select_job(JOB)  # as enter on its row does
        await pilot.press("4")
        # Through a server the detail comes a poll later; the app's clock is frozen here, so no
        # new second redraws the view once it is in: ask for one.
        await until(pilot, lambda: app.jobwatch.detail(JOB) is not None)
        app.refresh_views(force=True)
        await until(pilot, lambda: "cause" in static_text(app, "#job-head"))
        assert "cause: worker 1 on h2 (rank 2) exited 1" in static_text(app, "#job-head")


def test_pools_cross_the_wire_to_a_servers_faces() -> None:
    """The server sends a JobDetail as encode_detail makes it; the remote client rebuilds it from
    JobDetail's type hints: the pools come back equal (a job without pools: None)."""
    jobs = pool_jobs()
    detail = jobs._tracks[JOB].detail()
    assert detail.pools is not None
    sent = json.loads(json.dumps(encode_detail(detail, 0)))
    hints = wire._hints(JobDetail)
    got = wire.decode(hints["pools"], sent["pools"])
    assert isinstance(got, PoolsView) and got == detail.pools
    assert got.pool("evaluator") is not None and got.pool("evaluator").state == "failed"  # type: ignore[union-attr]
    assert got.sizing_text == POOL_SIZING["text"] and got.failures == (EVAL_KILLED,)
    plain = pool_jobs()._tracks
    other = next(t for k, t in plain.items() if k != JOB).detail()
    assert wire.decode(hints["pools"], json.loads(json.dumps(encode_detail(other, 0)))["pools"]) is None


class _StatusClient:
    """``rigdeck status``'s calls, answered with one recorded pool job's view."""

    kind = "embedded"

    def __init__(self, view: JobView):
        self._view = view

    def view(self, ref: str) -> JobView:
        assert ref == self._view.job_id
        return self._view

    def metrics(self, ref: str) -> list[dict[str, Any]]:
        return []

    def close(self) -> None:
        pass


def _pool_view() -> JobView:
    from tui.model.poolview import pools_view

    track = pool_jobs()._tracks[JOB]
    rec = track.rec
    return JobView(job_id=rec["job_id"], name=rec["name"], state=rec["state"], spec=rec["spec"],
                   placement=rec["placement"], events=rec["events"], hosts=track.states, started=rec["started"],
                   pool_sizing=rec["pool_sizing"], pools=pools_view(rec, track.states))


def test_status_prints_the_pools_table_and_sizing(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    client = _StatusClient(_pool_view())
    monkeypatch.setattr(main_mod, "_client", lambda args: client)
    assert main_mod.main(["status", JOB]) == 0
    lines = capsys.readouterr().out.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("pool "))
    assert lines[i].split() == ["pool", "replicas", "hosts", "state"]
    assert [line.split() for line in lines[i + 1:i + 5]] == [
        ["primary", "1", "h1", "running"], ["worker", "2", "h1,", "h2", "running"],
        ["reduction_server", "1", "h3", "running"], ["evaluator", "1", "h3", "failed"]]
    assert lines[i + 5] == f"sizing   {POOL_SIZING['text']}"
    assert lines[i + 6] == f"replica  {EVAL_KILLED}"


def test_status_json_has_the_pools_and_sizing(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    client = _StatusClient(_pool_view())
    monkeypatch.setattr(main_mod, "_client", lambda args: client)
    assert main_mod.main(["status", JOB, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(p["role"], p["replicas"], p["hosts"], p["state"], p["on_failure"]) for p in data["pools"]] == [
        ("primary", 1, ["h1"], "running", "stop"), ("worker", 2, ["h1", "h2"], "running", "stop"),
        ("reduction_server", 1, ["h3"], "running", "stop"), ("evaluator", 1, ["h3"], "failed", "continue")]
    assert data["pool_sizing"] == POOL_SIZING
    assert [e["message"] for e in data["events"] if e["event"] == "replica failed"] == [EVAL_KILLED]
    back = JobView.from_json(data)
    assert back.pools is not None and back.pools.failures == (EVAL_KILLED,)
