"""One job view type (tui/model/jobview.py): ``rigdeck status`` and the app's Job view read the
same ``JobView``, built by ``job_view`` from a history record and what the hosts said; its
command form (``to_json``) and the app's wire form carry it back; the CLI formats it without
the app."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tui.control.jobwatch import _Track
from tui.control.server import encode_detail
from tui.model import wire
from tui.model.jobview import JobDetail, JobRow, JobView, Progress, job_view, rank_rows
from tui.remote.transport import TransportError

PLACEMENT = [
    {"host": "h1", "slots": 2, "gpus": [0, 1], "simulated": True},
    {"host": "h2", "slots": 2, "gpus": [4, 5]},
]
REC: dict[str, Any] = {
    "job_id": "j-1", "name": "j", "state": "running", "spec": {"name": "j", "total_steps": 100},
    "placement": PLACEMENT, "restarts": 1, "created": 10.0, "started": 11.0, "events": [{"event": "started"}],
}


def _rank(rank: int | None, local: int, state: str = "running", gpu: int | None = None) -> dict[str, Any]:
    return {"rank": rank, "local_rank": local, "pid": 100 + local, "state": state, "gpu": gpu}


def states() -> dict[str, Any]:
    return {"h1": {"state": "running", "ranks": [_rank(1, 1), _rank(0, 0)]},
            "h2": TransportError("h2", "connection refused")}


def test_one_type_for_both_faces() -> None:
    assert JobDetail is JobView
    assert isinstance(_Track(dict(REC)).detail(), JobView)


def test_the_builder_reads_the_record_and_the_hosts() -> None:
    v = job_view(REC, states(), state="unknown", unreachable=["h2"], progress=Progress(step=7, loss=0.5))
    assert (v.job_id, v.state, v.state_line, v.restarts) == ("j-1", "unknown", "unknown (h2 unreachable)", 1)
    assert v.hosts["h2"] == {"error": "h2: connection refused"}  # a host's error, as the wire has it
    assert [(r["rank"], r["host"], r["gpu"]) for r in v.ranks] == [(0, "h1", 0), (1, "h1", 1)]
    assert (v.last_step, v.last_loss) == (7, 0.5)
    assert v.pools is None and v.processing is None and v.waiting is None
    row = v.row
    assert isinstance(row, JobRow)
    assert (row.ranks_running, row.ranks_total, row.step, row.total_steps, row.checkpoint_owner) == (2, 4, 7, 100, "-")
    assert row.unreachable == ("h2",)
    queued = job_view({**REC, "state": "queued", "waiting": "2 GPUs on h1"}, {})
    assert queued.state_line == "queued (2 GPUs on h1)" and queued.ranks == ()


def test_a_rank_finds_its_gpu_by_its_number_or_its_hosts_first_node() -> None:
    placement = [{"host": "h1", "slots": 1, "gpus": [3], "pool": "primary"},
                 {"host": "h1", "slots": 1, "gpus": [6], "pool": "worker"}]
    got = rank_rows({"h1": {"ranks": [_rank(1, 0), _rank(None, 0), _rank(0, 0, gpu=9)]}}, placement)
    assert [(r["rank"], r["gpu"]) for r in got] == [(None, 3), (0, 9), (1, 6)]


def test_the_command_form_and_the_apps_wire_carry_the_view_back() -> None:
    v = job_view(REC, states(), unreachable=["h2"], progress=Progress(step=7, loss=0.5))
    back = JobView.from_json(json.loads(json.dumps({**v.to_json(), "spec": v.spec})))
    assert back == v
    d = json.loads(json.dumps(encode_detail(v, 0)))
    d.pop("logs")
    hints = wire._hints(JobView)
    again = JobView(**{k: wire.decode(hints[k], x) for k, x in d.items() if k in hints})
    assert again == v and again.row == v.row


def test_status_prints_the_view_without_the_app(capsys: Any) -> None:
    from tui.cli.main import _print_job

    _print_job(job_view(REC, states(), progress=Progress(step=7, loss=0.5)))
    out = capsys.readouterr().out.splitlines()
    assert "placement h1[2 gpus 0,1] sim, h2[2 gpus 4,5]" in out
    assert "progress step 7 loss 0.5" in out
    # The commands load neither the app nor Textual (a fresh interpreter: pytest's plugins load Textual here).
    probe = "import sys, tui.cli.main; print(sorted(m for m in sys.modules if m.split('.')[0] == 'textual' or "
    probe += "m.startswith('tui.app')))"
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parent.parent)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stderr
