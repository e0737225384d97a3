"""Links to experiment trackers (issue 34): the patterns (agent/trackers.py) on lines as W&B,
MLflow and TensorBoard print them, the rank wrapper's parser that keeps them (agent/rankexec.py
``LinkParser``) and reads them back for ``job_status``, and the job's view of them
(tui/model/trackerlinks.py): merged over hosts, each URL once, nothing that could drive a
terminal. The test bed's end-to-end test is in tests/test_jobs.py, the Job view's in
tests/test_ui_trackers.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent import trackers
from agent.rankexec import LinkParser
from tui.model import wire
from tui.model.jobtext import job_lines
from tui.model.jobview import JobView, job_view
from tui.model.trackerlinks import TrackerLink, tracker_links

RUN = "https://wandb.ai/acme/llm-pretrain/runs/3kx9q2vb"
PROJECT = "https://wandb.ai/acme/llm-pretrain"
SELF_HOSTED = "http://wandb.corp.example:8080/acme/llm/runs/abc123"
MLFLOW_RUN = "http://10.213.1.5:5000/#/experiments/7/runs/0f1e2d3c4b5a69788796a5b4c3d2e1f0"
MLFLOW_EXPERIMENT = "http://10.213.1.5:5000/#/experiments/7"
BLUE, BOLD, UNDERLINE, YELLOW, RESET = "\x1b[34m", "\x1b[1m", "\x1b[4m", "\x1b[33m", "\x1b[0m"
WANDB = f"{BLUE}{BOLD}wandb{RESET}:"  # wandb's prefix as it colours it (click.style, blue and bold)


def url(u: str) -> str:
    return f"{BLUE}{UNDERLINE}{u}{RESET}"  # wandb colours its links blue, underlined


# What `wandb.init()` then `wandb.finish()` print on a terminal, colours and all.
WANDB_START = [
    f"{WANDB} Currently logged in as: {YELLOW}alice{RESET} ({YELLOW}acme{RESET}). "
    f"Use {BOLD}`wandb login --relogin`{RESET} to force relogin",
    f"{WANDB} Tracking run with wandb version 0.17.0",
    f"{WANDB} Run data is saved locally in {BOLD}/work/wandb/run-20240601_101500-3kx9q2vb{RESET}",
    f"{WANDB} Run {BOLD}`wandb offline`{RESET} to turn off syncing.",
    f"{WANDB} Syncing run {YELLOW}gallant-sun-12{RESET}",
    f"{WANDB} ⭐️ View project at {url(PROJECT)}",
    f"{WANDB} 🚀 View run at {url(RUN)}",
]
WANDB_END = f"{WANDB} 🚀 View run {YELLOW}gallant-sun-12{RESET} at: {url(RUN)}"


def plain(line: str) -> str:
    from agent.rankexec import ANSI_CSI_RE

    return ANSI_CSI_RE.sub("", line)


# ---------------------------------------------------------------------------------------------
# The patterns


@pytest.mark.parametrize("line, found", [
    ("wandb: 🚀 View run at " + RUN, [("wandb", RUN)]),
    ("wandb: 🚀 View run gallant-sun-12 at: " + RUN, [("wandb", RUN)]),
    # a self-hosted server: W&B's by the prefix, a run by /runs/
    ("wandb: 🚀 View run at " + SELF_HOSTED, [("wandb", SELF_HOSTED)]),
    ("[rank0]:wandb: 🚀 View run at " + RUN, [("wandb", RUN)]),  # torchrun's --tee prefix
    ("run page: " + RUN + ".", [("wandb", RUN)]),  # a script printing wandb.run.url, then a full stop
    ("wandb: ⭐️ View project at " + PROJECT, []),
    ("wandb: 🧹 View sweep at https://wandb.ai/acme/llm-pretrain/sweeps/h7s2k1", []),
    (f"🏃 View run bemused-finch-123 at: {MLFLOW_RUN}", [("mlflow", MLFLOW_RUN)]),
    (f"2024/06/01 10:15:02 INFO mlflow.tracking._tracking_service.client: 🏃 View run my run at: {MLFLOW_RUN}",
     [("mlflow", MLFLOW_RUN)]),
    ("🏃 View run x at: https://dbc-1.cloud.databricks.com/ml/experiments/12/runs/ab12",
     [("mlflow", "https://dbc-1.cloud.databricks.com/ml/experiments/12/runs/ab12")]),
    (f"🧪 View experiment at: {MLFLOW_EXPERIMENT}", []),
    ("TensorBoard 2.15.1 at http://gpu1:6006/ (Press CTRL+C to quit)", [("tensorboard", "http://gpu1:6006/")]),
    ("Upload started: https://tensorboard.dev/experiment/AbC123xyz/", [("tensorboard",
                                                                        "https://tensorboard.dev/experiment/AbC123xyz/")]),
    ("curves: http://gpu1:6006/#scalars&runFilter=ddp", [("tensorboard", "http://gpu1:6006/#scalars&runFilter=ddp")]),
    ("step 10 loss=0.5 see https://example.com/docs/runs/guide for more", []),  # no tracker's
    ("downloading https://download.pytorch.org/whl/cu121", []),
    ("wandb: 🚀 View run at 'https://wandb.ai/a/b/runs/c'", [("wandb", "https://wandb.ai/a/b/runs/c")]),
    (f"{RUN} and {MLFLOW_RUN}", [("wandb", RUN), ("mlflow", MLFLOW_RUN)]),
])
def test_links_in_real_looking_lines(line: str, found: list[tuple[str, str]]) -> None:
    assert trackers.links_in(line) == found


def test_wandb_lines_as_coloured_on_a_terminal() -> None:
    """wandb's own colours: the prefix and the URL each wrapped in escape sequences."""
    assert [trackers.links_in(plain(ln)) for ln in WANDB_START] == [[]] * 6 + [[("wandb", RUN)]]
    assert trackers.links_in(plain(WANDB_END)) == [("wandb", RUN)]
    # Without the colours taken off, the URL ends at the escape: nothing of it rides along.
    assert all("\x1b" not in u for _, u in trackers.links_in(WANDB_END))


def test_a_url_stops_at_control_characters_and_is_never_too_long() -> None:
    hostile = "wandb: 🚀 View run at https://wandb.ai/a/b/runs/c\x1b]52;c;ZXZpbA==\x07\x9b2J"
    assert trackers.links_in(hostile) == [("wandb", "https://wandb.ai/a/b/runs/c")]
    assert trackers.links_in("wandb: View run at https://wandb.ai/a/b/runs/" + "x" * trackers.MAX_URL) == []


# ---------------------------------------------------------------------------------------------
# The rank wrapper's parser and the links file


def feed_lines(parser: LinkParser, lines: list[str], cut: int = 7) -> None:
    """The lines as a pipe hands them over: in pieces that cut lines (and escapes) anywhere."""
    data = "".join(ln + "\n" for ln in lines).encode()
    for i in range(0, len(data), cut):
        parser.feed(data[i:i + cut])
    parser.flush()


def test_parser_keeps_each_run_once_from_coloured_output(tmp_path: Path) -> None:
    path = trackers.links_path(str(tmp_path), 0)
    Path(path).parent.mkdir()
    p = LinkParser(path, 0)
    feed_lines(p, ["step 1 loss=2.0", *WANDB_START, "step 2 loss=1.9", f"🏃 View run x at: {MLFLOW_RUN}",
                   WANDB_END, f"🧪 View experiment at: {MLFLOW_EXPERIMENT}",
                   f"{WANDB} 🚀 View run at {url(SELF_HOSTED)}"])  # W&B's only by its coloured prefix
    recs = [json.loads(ln) for ln in Path(path).read_text().splitlines()]
    assert [(r["kind"], r["url"], r["rank"]) for r in recs] == [
        ("wandb", RUN, 0), ("mlflow", MLFLOW_RUN, 0), ("wandb", SELF_HOSTED, 0)]
    assert all(isinstance(r["time"], float) for r in recs)
    assert [(r["kind"], r["url"]) for r in trackers.read_links(str(tmp_path))] == [
        ("wandb", RUN), ("mlflow", MLFLOW_RUN), ("wandb", SELF_HOSTED)]


def test_a_restarted_rank_adds_nothing_it_printed_before_and_a_chatty_one_is_capped(tmp_path: Path) -> None:
    path = trackers.links_path(str(tmp_path), 3)
    Path(path).parent.mkdir()
    feed_lines(LinkParser(path, 3), [WANDB_END])
    again = LinkParser(path, 3)  # the next attempt's wrapper
    feed_lines(again, [*WANDB_START, *(f"wandb: View run at https://wandb.ai/a/b/runs/r{i}" for i in range(40))])
    urls = [r["url"] for r in trackers.read_link_file(path)]
    assert urls[0] == RUN and len(urls) == trackers.MAX_PER_RANK == len(set(urls))


def test_read_links_joins_ranks_first_seen_first_and_skips_what_is_no_link(tmp_path: Path) -> None:
    d = tmp_path / trackers.LINKS_DIR
    d.mkdir()
    (d / "rank-1.jsonl").write_text(
        json.dumps({"kind": "wandb", "url": RUN, "rank": 1, "time": 20.0}) + "\n"
        + json.dumps({"kind": "mlflow", "url": MLFLOW_RUN, "rank": 1, "time": 10.0}) + "\n")
    (d / "rank-0.jsonl").write_text(
        json.dumps({"kind": "wandb", "url": RUN, "rank": 0, "time": 20.0}) + "\n"
        + "not json\n"
        + json.dumps({"kind": "wandb", "url": "https://x/runs/\x1b[2J", "rank": 0, "time": 1.0}) + "\n"
        + json.dumps({"kind": "gopher", "url": "https://x/runs/y", "rank": 0, "time": 1.0}) + "\n"
        + '{"kind": "tensorboard", "url": "https://tensorboard.dev/experiment/cut')  # a line cut short
    (d / "notes.txt").write_text("https://wandb.ai/a/b/runs/c\n")
    got = trackers.read_links(str(tmp_path))
    assert [(r["kind"], r["url"], r["rank"]) for r in got] == [("mlflow", MLFLOW_RUN, 1), ("wandb", RUN, 0)]
    assert trackers.read_links(str(tmp_path / "no-such-job")) == []


# ---------------------------------------------------------------------------------------------
# The job's view


def states() -> dict[str, object]:
    return {
        "h1": {"state": "running", "links": [
            {"kind": "wandb", "url": RUN, "rank": 0, "time": 100.0},
            {"kind": "wandb", "url": "javascript:alert(1)", "rank": 0, "time": 1.0},
            {"kind": "wandb", "url": "https://wandb.ai/a/b/runs/c\x1b]8;;x", "rank": 0, "time": 1.0},
            {"kind": "mlflow", "url": MLFLOW_RUN, "rank": True, "time": 300.0},
        ]},
        "h2": {"state": "running", "links": [
            {"kind": "mlflow", "url": MLFLOW_RUN, "rank": 2, "time": 200.0},
            {"kind": "wandb", "url": RUN, "rank": 2, "time": 150.0},
            "not a link",
        ]},
        "h3": TimeoutError("h3 did not answer"),
        "h4": {"state": "running", "links": "nonsense"},
    }


def test_tracker_links_merge_hosts_each_url_once_first_printed_first() -> None:
    assert tracker_links(states()) == (TrackerLink("wandb", RUN, 0, "h1"), TrackerLink("mlflow", MLFLOW_RUN, 2, "h2"))


REC = {"job_id": "ddp-1", "name": "ddp", "state": "running", "placement": [], "spec": {}}


def test_status_json_text_and_wire_carry_the_links() -> None:
    v = job_view(REC, states())
    assert v.to_json()["links"] == [{"kind": "wandb", "url": RUN, "rank": 0, "host": "h1"},
                                    {"kind": "mlflow", "url": MLFLOW_RUN, "rank": 2, "host": "h2"}]
    assert JobView.from_json(json.loads(json.dumps(v.to_json()))).links == v.links
    # As a server sends the app a job's detail (tui/control/server.py encode_detail: every field by itself).
    hints = wire._hints(JobView)
    assert wire.decode(hints["links"], json.loads(json.dumps(wire.encode(v.links)))) == v.links
    assert [ln for ln in job_lines(v) if ln.startswith("link")] == [
        f"link     wandb {RUN} (rank 0 on h1)", f"link     mlflow {MLFLOW_RUN} (rank 2 on h2)"]
    assert job_view(REC, states(), panels=False).links == ()  # the jobs table needs none
    assert job_view(REC, {"h1": {"state": "running"}}).to_json()["links"] == []  # an agent that sends none


def test_from_json_drops_what_is_no_link() -> None:
    d = {**job_view(REC, {}).to_json(), "links": [
        {"kind": "wandb", "url": RUN, "rank": 0, "host": "h1"},
        {"kind": "wandb", "url": "https://wandb.ai/a/b/runs/c\x07", "rank": 0, "host": "h1"},
        {"kind": "wandb", "url": RUN, "rank": 0},  # no host
        {"kind": "\x1b[2J", "url": RUN, "rank": 0, "host": "h1"}]}
    assert JobView.from_json(d).links == (TrackerLink("wandb", RUN, 0, "h1"),)
