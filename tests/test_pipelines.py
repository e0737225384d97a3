"""Pipelines on the test bed: real jobs on real hosts whose state dirs are private (no shared
storage), artifacts moved between them by the controller and checked by SHA-256, retries,
conditions, the step cache, continue_from, and `pipeline retry`.

The server's side (a pipeline advancing with no workstation process, a server killed mid-run)
is in tests/test_server.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.kit import ROOT
from tests.kit.bedcli import Cli
from tests.kit.specs import pipeline_step, steps_of
from tests.testbed import TestBed

EXAMPLE = ROOT / "examples" / "pipeline-steps"


def test_final_metrics_are_rank_0s_last_values_of_the_newest_attempt() -> None:
    from tui.model.metrics import final_metrics

    records = [
        {"rank": 1, "step": 5, "loss": 0.9, "time": 1.0},
        {"rank": 0, "step": 5, "loss": 0.5, "accuracy": 0.7, "time": 1.0},
        {"rank": 0, "step": 6, "loss": 0.4, "time": 2.0},
        {"rank": 0, "event": "checkpoint", "status": "done"},
        {"rank": 0, "step": 1, "restart": 1, "loss": 2.0, "note": "text"},
        {"rank": 0, "step": 2, "restart": 1, "accuracy": "0.93", "ok": True, "nan": float("nan")},
    ]
    # the restarted attempt's values win; a metric it has not reported keeps the last one's
    assert final_metrics(records) == {"accuracy": 0.93, "loss": 2.0}
    assert final_metrics(records[:3]) == {"accuracy": 0.7, "loss": 0.4}


def test_the_step_tree_hangs_each_step_under_the_last_step_it_needs() -> None:
    from tui.model.pipelineview import PipelineDetail, PipelineRow, StepRow

    steps = (StepRow("prep", "succeeded", "job"), StepRow("train", "running", "job", ("prep",)),
             StepRow("lint", "succeeded", "job"), StepRow("eval", "pending", "job", ("prep", "train")),
             StepRow("report", "pending", "job", ("lint", "eval")), StepRow("side", "pending", "job", ("prep",)))
    d = PipelineDetail(PipelineRow("p-1", "p", "running", 0.0), steps)
    assert [(prefix, s.name) for prefix, s in d.tree()] == [
        ("", "prep"), ("├─ ", "train"), ("│  └─ ", "eval"), ("│     └─ ", "report"), ("└─ ", "side"), ("", "lint")]


def job_dir(job_id: str) -> str:
    return f"/root/.rigdeck/jobs/{job_id}"  # inside each test bed host: its own private state dir


def sha256_on(bed: TestBed, host: str, path: str) -> str:
    res = bed.exec(host, ["sha256sum", path])
    assert res.returncode == 0, (host, path, res.stderr)
    return res.stdout.split()[0]


def jobs_by_id(cli: Cli) -> dict[str, dict[str, Any]]:
    return {j["job_id"]: j for j in cli.json("jobs")}


@pytest.mark.testbed
def test_the_example_runs_on_three_hosts_moving_artifacts_between_private_state_dirs(cli: Cli,
                                                                                     testbed: TestBed) -> None:
    """Issue 14, acceptance 1."""
    cli.run("deploy")
    out = cli.json("pipeline", str(EXAMPLE / "pipeline.toml"), "--wait", timeout=240)
    assert out["row"]["state"] == "succeeded", json.dumps(out, indent=1)[-4000:]
    steps = steps_of(out)
    assert [s["name"] for s in out["steps"]] == ["preprocess", "train", "evaluate", "register"]
    assert all(s["state"] == "succeeded" for s in out["steps"]), out["steps"]
    assert len(steps["preprocess"]["hosts"]) == 3 and len(steps["train"]["hosts"]) == 2
    assert dict(steps["evaluate"]["metrics"])["accuracy"] >= 0.9
    arts = {k: (files, size) for k, files, size in steps["preprocess"]["artifacts"]}
    assert arts["output"][0] == 4, arts  # three shards and the test split, from three hosts

    jobs = jobs_by_id(cli)
    pre = jobs[steps["preprocess"]["job_id"]]
    made_on = {f"shard-{i}.csv": n["host"] for i, n in enumerate(pre["placement"])}
    made_on["test.csv"] = pre["placement"][0]["host"]
    truth = {name: sha256_on(testbed, host, f"{job_dir(pre['job_id'])}/sagemaker/output/data/{name}")
             for name, host in made_on.items()}

    train = jobs[steps["train"]["job_id"]]
    moved = [e for e in train["events"] if e["event"] == "inputs"]
    assert moved, train["events"]
    for node in train["placement"]:
        host = node["host"]
        here = f"{job_dir(train['job_id'])}/sagemaker/input/data/train"
        for name, sha in truth.items():
            assert sha256_on(testbed, host, f"{here}/{name}") == sha, (host, name)
            if made_on[name] != host:  # the state dirs are private: another host's files are not here
                other = f"{job_dir(pre['job_id'])}/sagemaker/output/data/{name}"
                assert testbed.exec(host, ["test", "-e", other]).returncode == 1, (host, other)
        sent = moved[-1]["artifacts"]["train"]["hosts"][host]
        lacked = sum(1 for n in truth if made_on[n] != host)
        assert sent["files_sent"] == lacked and sent["bytes_sent"] > 0, sent
        config = json.loads(testbed.exec(host, ["cat", f"{job_dir(train['job_id'])}/sagemaker/input/config/"
                                                      "inputdataconfig.json"]).stdout)
        assert "train" in config, config

    evaluate = jobs[steps["evaluate"]["job_id"]]
    host = evaluate["placement"][0]["host"]
    config = json.loads(testbed.exec(host, ["cat", f"{job_dir(evaluate['job_id'])}/sagemaker/input/config/"
                                                  "inputdataconfig.json"]).stdout)
    assert set(config) == {"model", "test"}, config
    model_host = train["placement"][0]["host"]  # rank 0 wrote the model
    model_sha = sha256_on(testbed, model_host, f"{job_dir(train['job_id'])}/sagemaker/model/model.json")
    assert sha256_on(testbed, host, f"{job_dir(evaluate['job_id'])}/sagemaker/input/data/model/model.json") == model_sha

    register = jobs[steps["register"]["job_id"]]
    host = register["placement"][0]["host"]
    entry = json.loads(testbed.exec(host, ["cat", f"{job_dir(register['job_id'])}/sagemaker/output/data/"
                                                  "registry.json"]).stdout)
    assert entry["sha256"] == model_sha and entry["pipeline"] == out["row"]["pipeline_id"]

    # A copy with one step's spec changed: that step and the steps after it run again; the
    # preprocess step is taken from the first run (the spec files are not part of a step's code).
    copy = cli.tmp / "pipeline-steps"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    train_spec = copy / "train.toml"
    train_spec.write_text(train_spec.read_text().replace("steps = 60", "steps = 40"))
    again = cli.json("pipeline", str(copy / "pipeline.toml"), "--wait", timeout=240)
    steps2 = steps_of(again)
    assert again["row"]["state"] == "succeeded", json.dumps(again, indent=1)[-4000:]
    assert steps2["preprocess"]["state"] == "cached" and steps2["preprocess"]["job_id"] == pre["job_id"]
    for name in ("train", "evaluate", "register"):
        assert steps2[name]["state"] == "succeeded" and steps2[name]["job_id"] != steps[name]["job_id"], name


@pytest.mark.testbed
def test_a_step_is_retried_a_failing_one_fails_the_pipeline_and_retry_reruns_it_alone(cli: Cli, tmp_path: Path) -> None:
    """Issue 14, acceptance 2."""
    fixed = tmp_path / "fixed"  # the hosts see the test's temporary directory
    retry = 'retries = { max_attempts = 2, backoff = "1s", on = ["failed"] }'
    spec = cli.tmp / "retrying.toml"
    spec.write_text('name = "pl-retry"\n'
                    + pipeline_step("flaky", ["--fail-attempts", "1", "--write", "a.txt=from-a"], retry)
                    + pipeline_step("broken", ["--fail-unless", str(fixed), "--expect", "data/a.txt=from-a"],
                                    f'depends_on = ["flaky"]\ninputs = {{ data = "steps.flaky.output" }}\n{retry}')
                    + pipeline_step("after", ["--expect", "data/a.txt=from-a"],
                                    'depends_on = ["broken", "flaky"]\ninputs = { data = "steps.flaky.output" }')
                    + pipeline_step("beside", [], 'depends_on = ["flaky"]'))
    out = cli.json("pipeline", str(spec), "--wait", check=False, timeout=240)
    steps = steps_of(out)
    assert out["row"]["state"] == "failed", out["row"]
    assert steps["flaky"]["state"] == "succeeded" and steps["flaky"]["attempt"] == 2, steps["flaky"]
    assert steps["broken"]["state"] == "failed" and steps["broken"]["attempt"] == 2, steps["broken"]
    assert "exited 4" in steps["broken"]["reason"], steps["broken"]
    assert "broken" in out["row"]["reason"] and "exited 4" in out["row"]["reason"], out["row"]
    assert steps["after"]["state"] == "skipped" and "broken" in steps["after"]["reason"], steps["after"]
    assert steps["beside"]["state"] == "succeeded"  # a branch that does not need the failed step goes on
    pid = out["row"]["pipeline_id"]

    fixed.write_text("yes")
    cli.run("pipeline", "retry", pid, "broken")
    again = cli.json("pipeline", "status", pid, "--wait", timeout=240)
    steps2 = steps_of(again)
    assert again["row"]["state"] == "succeeded", again
    assert steps2["broken"]["state"] == "succeeded" and steps2["broken"]["job_id"] != steps["broken"]["job_id"]
    assert steps2["after"]["state"] == "succeeded"
    for name in ("flaky", "beside"):  # not run again
        assert steps2[name]["job_id"] == steps[name]["job_id"], name
    jobs = [j for j in cli.json("jobs") if j["name"] in {"flaky", "broken", "after", "beside"}]
    per_step = {n: sum(1 for j in jobs if j["name"] == n) for n in ("flaky", "broken", "after", "beside")}
    assert per_step == {"flaky": 2, "broken": 3, "after": 1, "beside": 1}, per_step


@pytest.mark.testbed
def test_a_false_condition_skips_its_branch_and_a_changed_step_reruns_with_its_dependents_only(cli: Cli) -> None:
    """Issue 14, acceptance 3 (and continue_from: a step starts from an earlier step's checkpoints)."""
    def spec(train_lr: str) -> Path:
        path = cli.tmp / f"cond-{train_lr}.toml"
        path.write_text(
            'name = "pl-cache"\n'
            + pipeline_step("prep", ["--write", "rows.csv=1,2,3"])
            + pipeline_step("train", ["--expect", "rows/rows.csv=1,2,3", "--checkpoint", "ck.txt=state",
                                      "--model", "m.txt=model", "--metric", "accuracy=0.5"],
                            'depends_on = ["prep"]\ninputs = { rows = "steps.prep.output" }',
                            f"[steps.job.hyperparameters]\nlr = {train_lr}\n")  # the only change between runs
            + pipeline_step("finetune", ["--expect-checkpoint", "ck.txt=state"],
                            'depends_on = ["train"]\ncontinue_from = "steps.train"')
            + pipeline_step("publish", ["--expect", "m/m.txt=model"],
                            'depends_on = ["train"]\nwhen = "steps.train.metrics.accuracy >= 0.9"\n'
                            'inputs = { m = "steps.train.model" }')
            + pipeline_step("announce", [], 'depends_on = ["publish"]'))
        return path

    first = cli.json("pipeline", str(spec("0.1")), "--wait", timeout=240)
    s1 = steps_of(first)
    assert first["row"]["state"] == "succeeded", first
    assert [s1[n]["state"] for n in ("prep", "train", "finetune", "publish", "announce")] == \
        ["succeeded", "succeeded", "succeeded", "skipped", "skipped"], first["steps"]
    assert "accuracy >= 0.9" in s1["publish"]["reason"] and "publish" in s1["announce"]["reason"]

    same = cli.json("pipeline", str(spec("0.1")), "--wait", timeout=240)
    s2 = steps_of(same)
    assert [s2[n]["state"] for n in ("prep", "train", "finetune")] == ["cached"] * 3, same["steps"]
    assert s2["train"]["job_id"] == s1["train"]["job_id"]  # the run it reuses
    assert same["row"]["cached"] == 3

    changed = cli.json("pipeline", str(spec("0.2")), "--wait", timeout=240)
    s3 = steps_of(changed)
    assert changed["row"]["state"] == "succeeded", changed
    assert s3["prep"]["state"] == "cached" and s3["prep"]["job_id"] == s1["prep"]["job_id"]
    for name in ("train", "finetune"):  # the changed step and the step after it ran again
        assert s3[name]["state"] == "succeeded" and s3[name]["job_id"] != s1[name]["job_id"], s3[name]
    assert s3["publish"]["state"] == "skipped" and s3["announce"]["state"] == "skipped"
