"""What the faces show of a processing job (docs/contracts.md, "Processing jobs: what the faces
show"): the view built from the job's record (its spec's inputs, its placement, the controller's
``processing`` event), its plain lines for ``rigdeck status``, its ``--json`` object and the wire;
the Job view's processing panel, embedded and through a server; ``rigdeck status`` text and JSON.
The real run is tests/test_pools_e2e.py's processing job on the test bed."""

from __future__ import annotations

import importlib
import json
from typing import Any

import pytest
from textual.widgets import Static

from tests.kit.pilot import static_text, until
from tests.ui_fixtures import JOB, PROCESSING_INPUTS, processing_jobs, recorded_app, stop_servers
from tui.app.widgets.chart import LossChart
from tui.app.widgets.processing import COLUMNS, ProcessingTable
from tui.control.server import encode_detail
from tui.model import wire
from tui.model.jobview import JobDetail, JobView
from tui.model.processingview import (
    ProcessingView,
    processing_json,
    processing_lines,
    processing_view,
)

main_mod = importlib.import_module("tui.cli.main")

SHARDED = "ShardedByKey: 30 files of /data/raw over 3 hosts (h1 10, h2 10, h3 10), listed on h1"
REPLICATED = "FullyReplicated: every host reads all of /data/vocab"


def record(started: bool = True, **changes: Any) -> dict[str, Any]:
    rec = dict(processing_jobs(started)._tracks[JOB].rec)
    rec.update(changes)
    return rec


def test_a_started_processing_job_says_how_each_input_reached_the_hosts_and_where_outputs_are() -> None:
    view = processing_view(record(), {"h1": "~/.rigdeck", "h2": "~/.rigdeck", "h3": "~/.rigdeck"})
    assert view is not None
    assert view.hosts == ("h1", "h2", "h3")
    raw, vocab = view.inputs
    assert (raw.name, raw.total, raw.listed_on, raw.per_host) == ("raw", 30, "h1", (("h1", 10), ("h2", 10), ("h3", 10)))
    assert raw.text == SHARDED
    assert (vocab.total, vocab.per_host) == (None, ()) and vocab.text == REPLICATED
    assert processing_lines(view) == [
        f"input    raw  {SHARDED}",
        f"input    vocab  {REPLICATED}",
        f"output   counts: ~/.rigdeck/jobs/{JOB}/processing/output/counts on h1, h2, h3",
    ]


def test_before_the_start_a_sharded_input_says_it_is_split_then_and_state_dirs_may_differ() -> None:
    view = processing_view(record(started=False), {"h1": "/srv/a", "h2": "/srv/b/"})
    assert view is not None
    assert view.inputs[0].text == "ShardedByKey: /data/raw, split by file when the job starts"
    # h3's state dir unknown: each host's place said apart, the unknown one as the job's directory.
    assert view.output_text("counts") == (f"counts: h1 /srv/a/jobs/{JOB}/processing/output/counts, "
                                          f"h2 /srv/b/jobs/{JOB}/processing/output/counts, "
                                          "h3 (its job directory)/processing/output/counts")
    assert processing_view(record(started=False)).output_text("counts") == (  # type: ignore[union-attr]
        "counts: processing/output/counts in the job's directory on h1, h2, h3")


def test_a_restart_shows_its_own_listing_and_other_jobs_have_no_view() -> None:
    rec = record()
    again = {"time": 2.0, "event": "processing", "inputs": {
        "raw": {"distribution": "ShardedByKey", "total": 31, "listed_on": "h1",
                "hosts": {"h1": 11, "h2": 10, "h3": 10}},
        "vocab": {"distribution": "FullyReplicated"}}}
    view = processing_view({**rec, "events": [*rec["events"], {"event": "restart"}, again]})
    assert view is not None and view.inputs[0].total == 31 and view.inputs[0].per_host[0] == ("h1", 11)
    assert processing_view({**rec, "spec": {**rec["spec"], "kind": "training"}}) is None
    assert processing_view({"job_id": "x", "spec": {}}) is None
    assert processing_json(None) is None


def test_a_relative_source_is_the_workdirs_unless_each_host_has_its_own_copy() -> None:
    rec = record()
    inputs = [{"name": "raw", "source": "data/../raw", "distribution": "ShardedByKey"}]
    spec = {**rec["spec"], "workdir": "/w/job", "processing": {"inputs": inputs, "outputs": []}}
    view = processing_view({**rec, "spec": spec})
    assert view is not None and view.inputs[0].source == "/w/job/raw"
    synced = processing_view({**rec, "spec": {**spec, "code": {"sync": "/home/me/proj"}}})
    assert synced is not None and synced.inputs[0].source == "data/../raw"


def test_escapes_in_a_source_never_reach_the_terminal() -> None:
    inputs = [{**PROCESSING_INPUTS[1], "source": "/data/\x1b[31mred"}]
    rec = record()
    view = processing_view({**rec, "spec": {**rec["spec"], "processing": {"inputs": inputs, "outputs": []}}})
    assert view is not None
    assert view.inputs[0].source == "/data/\x1b[31mred"  # the data as given
    assert all("\x1b" not in line for line in processing_lines(view))


def test_json_and_the_wire_carry_the_view_back_whole() -> None:
    view = processing_view(record(), {"h1": "/s", "h2": "/s", "h3": "/s"})
    assert view is not None
    d = json.loads(json.dumps(processing_json(view)))
    assert d["hosts"] == ["h1", "h2", "h3"]
    assert d["inputs"][0] == {"name": "raw", "source": "/data/raw", "distribution": "ShardedByKey", "total": 30,
                              "listed_on": "h1", "hosts": {"h1": 10, "h2": 10, "h3": 10}}
    assert d["inputs"][1]["hosts"] == {} and d["inputs"][1]["total"] is None
    assert d["outputs"] == [{"name": "counts", "hosts": {h: f"/s/jobs/{JOB}/processing/output/counts"
                                                         for h in ("h1", "h2", "h3")}}]
    assert ProcessingView.from_json(d) == view
    assert ProcessingView.from_json(None) is None
    # The server sends a JobDetail as encode_detail makes it; a face rebuilds it from the hints.
    detail = processing_jobs()._tracks[JOB].detail({"h1": "/s", "h2": "/s", "h3": "/s"})
    sent = json.loads(json.dumps(encode_detail(detail, 0)))
    assert wire.decode(wire._hints(JobDetail)["processing"], sent["processing"]) == detail.processing == view


@pytest.fixture(params=["embedded", "server"])
def kind(request: pytest.FixtureRequest) -> Any:
    yield request.param
    stop_servers()


async def test_job_view_shows_the_processing_panel_of_a_processing_job(kind: str) -> None:
    app = recorded_app(kind=kind, jobs=processing_jobs())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("4")
        await until(pilot, lambda: "processing" in static_text(app, "#processing-head"))
        head = static_text(app, "#processing-head")
        assert "processing on 3 hosts · 2 inputs · 1 output" in head
        # The fixture's inventory keeps the default state_dir.
        assert f"output counts: ~/.rigdeck/jobs/{JOB}/processing/output/counts on h1, h2, h3" in head
        table = app.query_one("#processing-table", ProcessingTable)
        assert table.display and table.row_count == 2
        assert [[table.cell_text(k, c.key) for c in COLUMNS] for k in ("raw", "vocab")] == [
            ["raw", "ShardedByKey", "30", "h1 10, h2 10, h3 10", "/data/raw"],
            ["vocab", "FullyReplicated", "all", "every host", "/data/vocab"],
        ]
        assert not app.query_one("#pools-head", Static).display
        # No loss to draw: the chart gives its room to the panels; the head says runtime and ranks.
        assert not app.query_one("#loss", LossChart).display
        assert "step -" not in static_text(app, "#job-head") and "ranks " in static_text(app, "#job-head")


async def test_a_training_job_shows_no_processing_panel() -> None:
    app = recorded_app(kind="embedded")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("4")
        await until(pilot, lambda: "step 240/300" in static_text(app, "#job-head"))
        assert not app.query_one("#processing-head", Static).display
        assert not app.query_one("#processing-table", ProcessingTable).display
        assert app.query_one("#loss", LossChart).display


class _StatusClient:
    kind = "embedded"

    def __init__(self, view: JobView):
        self._view = view

    def view(self, ref: str) -> JobView:
        return self._view

    def metrics(self, ref: str) -> list[dict[str, Any]]:
        return []

    def close(self) -> None:
        pass


def _view() -> JobView:
    rec = record()
    return JobView(job_id=rec["job_id"], name=rec["name"], state="succeeded", spec=rec["spec"],
                   placement=rec["placement"], events=rec["events"], started=rec["started"],
                   processing=processing_view(rec, {"h1": "/s", "h2": "/s", "h3": "/s"}))


def test_status_prints_the_inputs_and_outputs(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(main_mod, "_client", lambda args: _StatusClient(_view()))
    assert main_mod.main(["status", JOB]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"input    raw  {SHARDED}" in out and f"input    vocab  {REPLICATED}" in out
    assert f"output   counts: /s/jobs/{JOB}/processing/output/counts on h1, h2, h3" in out


def test_status_json_has_the_processing_object(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(main_mod, "_client", lambda args: _StatusClient(_view()))
    assert main_mod.main(["status", JOB, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["processing"]["inputs"][0]["hosts"] == {"h1": 10, "h2": 10, "h3": 10}
    back = JobView.from_json(data)
    assert back.processing == _view().processing
