"""`rigdeck pipeline ...` and `rigdeck pipelines`: argument handling, printing and exit codes,
through ``tui.cli.main.main`` with a stand-in client over recorded pipelines
(tests/pipeline_fixtures.py) and, for `pipeline SPEC`, a stand-in spec loader. The run against a
real controller is in the controller's tests."""

from __future__ import annotations

import importlib
import json
import sys
import types
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.pipeline_fixtures import (
    EARLIER,
    FAILED_PIPELINE,
    PIPELINE,
    RecordedPipelines,
    UnknownPipeline,
)
from tests.ui_fixtures import JOB, OLD_JOB, T0
from tui.model import wire
from tui.model.jobspec import JobSpecError
from tui.model.pipelineview import PipelineDetail, PipelineRow

main_mod = importlib.import_module("tui.cli.main")  # the module (tui.cli.main is also its function)

STATES = ("succeeded", "running", "pending", "skipped", "failed", "cached", "stopped")


class StandIn:
    """The client calls the pipeline commands make, answered from RecordedPipelines; what
    pipeline_wait yields is scripted by the test."""

    kind = "embedded"

    def __init__(self, pipes: RecordedPipelines, waits: list[PipelineDetail] | None = None):
        self.pipes = pipes
        self.waits = waits or []
        self.started: list[Any] = []
        self.waited: list[str] = []
        self.closed = 0

    def close(self) -> None:
        self.closed += 1

    def pipeline(self, spec: Any) -> PipelineDetail:
        self.started.append(spec)
        return self.pipes.detail(PIPELINE)

    def pipelines(self) -> list[PipelineRow]:
        return self.pipes.rows()

    def pipeline_detail(self, ref: str) -> PipelineDetail:
        return self.pipes.detail(ref)

    def pipeline_stop(self, ref: str) -> PipelineDetail:
        return self.pipes.stop(ref)

    def pipeline_retry(self, ref: str, step: str) -> PipelineDetail:
        d = self.pipes.detail(ref)
        if d.step(step) is None:
            raise UnknownPipeline(f"pipeline {ref}: no step {step!r} (steps: "
                                  f"{', '.join(s.name for s in d.steps)})")
        return self.pipes.retry(ref, step)

    def pipeline_wait(self, ref: str, timeout: float | None = None) -> Iterator[PipelineDetail]:
        self.waited.append(ref)
        for d in self.waits:
            self.pipes.details[d.row.pipeline_id] = d
            yield d


@pytest.fixture
def pipes() -> RecordedPipelines:
    return RecordedPipelines()


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch, pipes: RecordedPipelines) -> StandIn:
    c = StandIn(pipes)
    made: list[Any] = []

    def factory(args: Any) -> StandIn:
        made.append(args)
        return c

    monkeypatch.setattr(main_mod, "_client", factory)
    c.made = made  # type: ignore[attr-defined]
    # The stand-in's own "unknown pipeline" error counts as the controller's would.
    import tui.client

    monkeypatch.setattr(tui.client, "PipelineError", UnknownPipeline, raising=False)
    return c


@pytest.fixture
def loader(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``tui.model.pipelinespec.load_pipeline`` stood in for: records the paths it read; a
    path named bad.toml fails as a bad spec does."""
    read: list[str] = []
    mod = types.ModuleType("tui.model.pipelinespec")

    def load_pipeline(path: Any) -> Any:
        read.append(str(path))
        if Path(path).name == "bad.toml":
            raise JobSpecError(path, "steps.evaluate.depends_on",
                               "names of earlier steps (preprocess, train)", "trian")
        return types.SimpleNamespace(path=str(path), name="steps-demo")

    mod.load_pipeline = load_pipeline  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tui.model.pipelinespec", mod)
    return read


def at_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's clock at the recorded NOW (durations of running steps are printed to it)."""
    import tui.cli.pipeline as cli

    monkeypatch.setattr(cli.time, "time", lambda: T0 + 125)


def test_pipelines_lists_them(client: StandIn, capsys: pytest.CaptureFixture[str],
                              monkeypatch: pytest.MonkeyPatch) -> None:
    at_now(monkeypatch)
    assert main_mod.main(["pipelines"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["pipeline", "name", "state", "steps", "running", "cached", "failed",
                              "skipped", "age"]
    assert out[1].split() == [PIPELINE, "steps-demo", "running", "2/5", "2", "0", "0", "1", "5m25s"]
    assert out[2].split() == [FAILED_PIPELINE, "nightly", "failed", "3/3", "0", "1", "1", "1", "52m05s"]
    assert client.closed == 1


def test_pipelines_json_is_the_wire_encoding(client: StandIn, pipes: RecordedPipelines,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main_mod.main(["pipelines", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [wire.decode(PipelineRow, r) for r in data] == pipes.rows()


def test_no_pipelines(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(main_mod, "_client", lambda args: StandIn(RecordedPipelines(empty=True)))
    assert main_mod.main(["pipelines"]) == 0
    assert capsys.readouterr().out == "no pipelines\n"


def test_status_prints_the_step_tree(client: StandIn, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    at_now(monkeypatch)
    assert main_mod.main(["pipeline", "status", PIPELINE]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == f"pipeline {PIPELINE} (steps-demo): running  [examples/pipeline-steps/pipeline.toml]"
    assert lines[1].startswith("steps: 2 of 5 done; 1 succeeded, 0 cached, 0 failed, 1 skipped; 2 running")
    rows = [line for line in lines[3:] if any(f"  {st} " in line for st in STATES)]
    # Dependency order, tree prefixes, the others a step needs in brackets.
    col = lines[2].index("state")  # the step column ends where the state column starts
    names = [r[2:col].rstrip() for r in rows]
    assert names == ["preprocess", "├─ train", "│  └─ evaluate (+preprocess)", "├─ tune (sweep)",
                     "└─ register"]
    pre = rows[0].split()
    assert pre[1:6] == ["succeeded", "1/2", "1m00s", "-", "h1,h2,h3"]
    train = rows[1].split()
    assert train[2:7] == ["running", "2/3", "2m05s", "-", "h1,h2"]
    assert "attempt 1: host h3 lost" in rows[1]
    assert "waits for train" in rows[2]
    assert "when is false: steps.preprocess.metrics.rows is 48000" in rows[4]
    # Under each step: its job, condition, final metrics, artifacts as files and bytes.
    assert f"job {OLD_JOB} · metrics rows=48000 · artifacts output 3 files 12.0 MB" in out
    assert f"job {JOB}" in out and "sweep sweep-lr-sw3f9c2a" in out
    assert "when steps.preprocess.metrics.rows >= 1000000" in out


def test_status_of_a_failed_pipeline_names_the_step_and_cause(client: StandIn,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main_mod.main(["pipeline", "status", "nightly-pl0b"]) == 0  # a unique prefix
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (f"pipeline {FAILED_PIPELINE} (nightly): failed "
                                   "(step train failed: rank 3 on h2 killed by signal 9)")
    fetch = next(line for line in out.splitlines() if line.startswith("  fetch"))
    assert fetch.split()[1:5] == ["cached", "-", "-", "yes"]
    assert f"reuses {EARLIER}" in out and "artifacts output 12 files 1.0 MB" in out
    train = next(line for line in out.splitlines() if "└─ train" in line)
    assert train.split()[2:4] == ["failed", "3/3"] and "rank 3 on h2 killed by signal 9" in train
    assert "needs train, which failed" in out


def test_status_json_round_trips(client: StandIn, pipes: RecordedPipelines,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main_mod.main(["pipeline", "status", FAILED_PIPELINE, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert wire.decode(PipelineDetail, data) == pipes.details[FAILED_PIPELINE]
    assert data["steps"][0]["state"] == "cached" and data["row"]["reason"].startswith("step train failed")


def test_unknown_pipeline_is_an_error(client: StandIn, capsys: pytest.CaptureFixture[str]) -> None:
    assert main_mod.main(["pipeline", "status", "nope"]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err == "rigdeck: no pipeline 'nope' (rigdeck pipelines lists them)\n"
    assert client.closed == 1


@pytest.mark.parametrize("argv, message", [
    (["pipeline", "status"], "pipeline status takes one pipeline id"),
    (["pipeline", "stop"], "pipeline stop takes one pipeline id"),
    (["pipeline", "stop", "a", "b"], "pipeline stop takes one pipeline id"),
    (["pipeline", "retry", PIPELINE], "pipeline retry takes a pipeline id and a step name"),
    (["pipeline", "a.toml", "b.toml"], "pipeline takes one spec file"),
])
def test_usage_errors(client: StandIn, capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main_mod.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rigdeck: {message}")
    assert client.made == []  # type: ignore[attr-defined]  # nothing reached a controller


def test_stop(client: StandIn, pipes: RecordedPipelines, capsys: pytest.CaptureFixture[str]) -> None:
    assert main_mod.main(["pipeline", "stop", PIPELINE]) == 0
    out = capsys.readouterr().out
    assert pipes.stopped == [PIPELINE]
    assert out.splitlines()[0].startswith(f"pipeline {PIPELINE} (steps-demo): stopped")
    train = next(line for line in out.splitlines() if "├─ train" in line)
    assert train.split()[2] == "stopped" and "stopped by the operator" in train


def test_retry_a_step(client: StandIn, pipes: RecordedPipelines, capsys: pytest.CaptureFixture[str]) -> None:
    assert main_mod.main(["pipeline", "retry", FAILED_PIPELINE, "train"]) == 0
    assert pipes.retried == [(FAILED_PIPELINE, "train")]
    assert capsys.readouterr().out == f"pipeline {FAILED_PIPELINE}: step train queued\n"
    assert main_mod.main(["pipeline", "retry", FAILED_PIPELINE, "trian"]) == 2
    assert "no step 'trian' (steps: fetch, train, report)" in capsys.readouterr().err


def test_start_prints_the_id_and_steps(client: StandIn, loader: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main_mod.main(["pipeline", "examples/pipeline-steps/pipeline.toml"]) == 0
    assert loader == ["examples/pipeline-steps/pipeline.toml"]
    assert [s.path for s in client.started] == ["examples/pipeline-steps/pipeline.toml"]
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"pipeline {PIPELINE}: 5 steps; started preprocess, train, tune"
    assert out[1].split()[:2] == ["step", "state"] and out[2].split()[:2] == ["preprocess", "succeeded"]
    assert out[-1].strip().startswith("(no server: the pipeline advances only while rigdeck runs")
    assert client.waited == []


def test_a_bad_spec_stops_before_any_controller(client: StandIn, loader: list[str],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main_mod.main(["pipeline", "bad.toml"]) == 2
    err = capsys.readouterr().err
    assert err == ("rigdeck: bad.toml: field 'steps.evaluate.depends_on': expected names of earlier "
                   'steps (preprocess, train), got "trian" (string)\n')
    assert client.made == [] and client.started == []  # type: ignore[attr-defined]


def finished(d: PipelineDetail, state: str, **changes: dict[str, Any]) -> PipelineDetail:
    steps = tuple(replace(s, **changes[s.name]) if s.name in changes else s for s in d.steps)
    return PipelineDetail(replace(d.row, state=state, ended=T0 + 900), steps)


def test_start_and_wait_prints_each_change_and_exits_0_on_success(
        client: StandIn, pipes: RecordedPipelines, loader: list[str],
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    at_now(monkeypatch)
    d = pipes.details[PIPELINE]
    done = {"state": "succeeded", "ended": T0 + 400}
    step1 = finished(d, "running", train=done)
    step2 = finished(step1, "running", evaluate={"state": "running", "attempt": 1, "started": T0 + 401,
                                                 "hosts": ("h3",), "reason": None})
    step3 = finished(step2, "succeeded", evaluate={**done, "ended": T0 + 500,
                                                   "metrics": (("accuracy", 0.93),)},
                     tune={"state": "succeeded", "ended": T0 + 450})
    client.waits = [step1, step2, step3]
    assert main_mod.main(["pipeline", "pipeline.toml", "--wait"]) == 0
    assert client.waited == [PIPELINE]
    out = capsys.readouterr().out
    changes = [line for line in out.splitlines() if ": " in line and not line.startswith((" ", "pipeline", "steps"))]
    assert changes == [
        "train: succeeded (attempt 2/3): attempt 1: host h3 lost (retried: on = [\"failed\", \"host_lost\"])",
        "evaluate: running on h3",
        "tune: succeeded",
        "evaluate: succeeded",
    ]
    assert f"pipeline {PIPELINE} (steps-demo): succeeded" in out
    assert "metrics accuracy=0.93" in out
    assert "(no server" not in out


def test_wait_exits_1_when_the_pipeline_fails(client: StandIn, pipes: RecordedPipelines, loader: list[str],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    d = pipes.details[PIPELINE]
    client.waits = [finished(d, "failed", train={"state": "failed", "attempt": 3, "ended": T0 + 300,
                                                 "reason": "rank 0 on h1 exited with code 1"},
                             evaluate={"state": "skipped", "reason": "needs train, which failed"})]
    assert main_mod.main(["pipeline", "pipeline.toml", "--wait"]) == 1
    out = capsys.readouterr().out
    assert "train: failed (attempt 3/3): rank 0 on h1 exited with code 1" in out
    assert "evaluate: skipped: needs train, which failed" in out


def test_wait_json_prints_only_the_final_detail(client: StandIn, pipes: RecordedPipelines, loader: list[str],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    d = pipes.details[PIPELINE]
    last = finished(d, "succeeded", train={"state": "succeeded"}, evaluate={"state": "succeeded"},
                    tune={"state": "succeeded"})
    client.waits = [last]
    assert main_mod.main(["pipeline", "pipeline.toml", "--wait", "--json"]) == 0
    assert wire.decode(PipelineDetail, json.loads(capsys.readouterr().out)) == last


def test_retry_and_wait(client: StandIn, pipes: RecordedPipelines, capsys: pytest.CaptureFixture[str]) -> None:
    d = pipes.details[FAILED_PIPELINE]
    client.waits = [finished(d, "succeeded", train={"state": "succeeded", "attempt": 1, "max_attempts": 3,
                                                    "reason": None},
                             report={"state": "succeeded", "reason": None})]
    assert main_mod.main(["pipeline", "retry", FAILED_PIPELINE, "train", "--wait"]) == 0
    out = capsys.readouterr().out
    assert "train: succeeded (attempt 1/3)" in out and "report: succeeded" in out


PIPELINE_ROW = {"pipeline_id": str, "name": str, "state": str, "created": float, "ended": (float, type(None)),
                "reason": (str, type(None)), "steps": int, "succeeded": int, "cached": int, "failed": int,
                "skipped": int, "running": int, "path": (str, type(None)), "user": (str, type(None))}
OPT_STR = (str, type(None))
OPT_FLOAT = (float, type(None))
STEP = {"name": str, "state": str, "kind": str, "depends_on": list, "depth": int, "job_id": OPT_STR,
        "sweep_id": OPT_STR, "attempt": int, "max_attempts": int, "started": OPT_FLOAT, "ended": OPT_FLOAT,
        "reason": OPT_STR, "when": OPT_STR, "retry_at": OPT_FLOAT, "hosts": list, "metrics": list,
        "artifacts": list, "inputs": list, "continue_from": OPT_STR, "cache_key": OPT_STR,
        "cached_from": OPT_STR}


def test_pipeline_json_keeps_the_documented_keys(client: StandIn, capsys: pytest.CaptureFixture[str]) -> None:
    """The keys docs/contracts.md lists are exactly what `rigdeck pipeline status --json` and
    `rigdeck pipelines --json` write."""
    from tests.kit import conforms

    for ref in (PIPELINE, FAILED_PIPELINE):
        assert main_mod.main(["pipeline", "status", ref, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert set(out) == {"row", "steps"}
        conforms(out["row"], PIPELINE_ROW, "pipeline.row")
        for i, s in enumerate(out["steps"]):
            conforms(s, STEP, f"pipeline.steps[{i}]")
    assert main_mod.main(["pipelines", "--json"]) == 0
    for i, r in enumerate(json.loads(capsys.readouterr().out)):
        conforms(r, PIPELINE_ROW, f"pipelines[{i}]")
    doc = (Path(__file__).resolve().parent.parent / "docs" / "contracts.md").read_text()
    section = doc[doc.index("### `rigdeck pipeline --json`"):doc.index("### `rigdeck metrics --json`")]
    for key in (*PIPELINE_ROW, *STEP):
        assert f"`{key}`" in section, key
