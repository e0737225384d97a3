"""Hyperparameter sweeps: the [sweep] table's checks, Optuna's parts as the controller uses them,
and sweeps on the test bed (each trial a real job: agents, ranks, metrics files).

The example (examples/sweep/objective.py) has a known objective, so every trial's recorded value
is checked against the value its parameters must give."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.kit import ROOT, wait_until
from tests.kit.bedcli import Cli
from tests.kit.specs import expected_objective, sweep_spec
from tests.testbed import TestBed
from tui.control.sweeps import infrastructure_failure, sampler_for
from tui.model.jobspec import JobSpecError, jobspec_from_toml
from tui.model.metrics import objective_values

PROBE = ROOT / "tests" / "jobscripts" / "trial_probe.py"

BASE = """
name = "sw"
command = ["python", "train.py", "--lr", "{hp.lr}"]
[sweep]
objective = {metric = "val_loss"}
max_trials = 4
[sweep.parameters]
"""


def spec_error(params: str, sweep_extra: str = "", top: str = "") -> JobSpecError:
    text = BASE.replace('name = "sw"', 'name = "sw"\n' + top).replace("max_trials = 4",
                                                                     "max_trials = 4\n" + sweep_extra)
    with pytest.raises(JobSpecError) as e:
        jobspec_from_toml(text + params, "/tmp/sw.toml")
    return e.value


# ---------------------------------------------------------------------------------------------
# The [sweep] table


@pytest.mark.parametrize("params, sweep_extra, field, words", [
    ('lr = {type = "floot", low = 1, high = 2}', "", "sweep.parameters.lr.type", '"float", "int", "categorical"'),
    ('lr = {type = "float", low = 0.5, high = 0.1}', "", "sweep.parameters.lr.low", "low <= high"),
    ('lr = {type = "float", low = 0, high = 0.1, log = true}', "", "sweep.parameters.lr.low", "low > 0 with log"),
    ('lr = {type = "float", low = 0.1, high = 0.5}', 'strategy = "grid"', "sweep.parameters.lr.step", "a step"),
    ('lr = {type = "int", low = 1.5, high = 4}', "", "sweep.parameters.lr.low", "an integer"),
    ('lr = {type = "categorical", choices = []}', "", "sweep.parameters.lr.choices", "non-empty"),
    ('lr = {type = "categorical", choices = ["a", "a"]}', "", "sweep.parameters.lr.choices", "without repeats"),
    ('lr = {type = "float", low = 0.1, high = 0.5, choices = [1]}', "", "sweep.parameters.lr.choices", "no 'choices'"),
    ('lr = {type = "float", low = 0.1, high = 0.5}', 'strategy = "annealing"', "sweep.strategy", '"bayesian"'),
    ('lr = {type = "float", low = 0.1, high = 0.5}', 'early_stopping = "asha"', "sweep.early_stopping", '"median"'),
    ('lr = {type = "float", low = 0.1, high = 0.5}', "max_parallel = 0", "sweep.max_parallel", "an integer >= 1"),
    ('lr = {type = "float", low = 0.1, high = 0.5}', "max_triels = 3", "sweep.max_triels", "max_trials"),
    ('lr = {type = "float", low = 0.1, high = 0.5}',
     "[[sweep.metric_definitions]]\nname = \"val_loss\"\nregex = \"loss=(\"",
     "sweep.metric_definitions[0].regex", "does not compile"),
    ('width = {type = "int", low = 1, high = 4}', "", "command", "{hp.NAME} naming a sweep parameter"),
])
def test_bad_sweep_tables_name_the_field(params: str, sweep_extra: str, field: str, words: str) -> None:
    e = spec_error(params, sweep_extra)
    assert e.field == field, str(e)
    assert words in str(e), str(e)
    assert str(e).startswith("/tmp/sw.toml: field "), str(e)


def test_objective_and_trial_count_are_required_and_a_grid_counts_its_own() -> None:
    text = BASE.replace("max_trials = 4\n", "")
    with pytest.raises(JobSpecError, match="sweep.max_trials.*required, except for a grid"):
        jobspec_from_toml(text + 'lr = {type = "float", low = 0.1, high = 0.5}')
    with pytest.raises(JobSpecError, match="sweep.objective.*required"):
        jobspec_from_toml(BASE.replace('objective = {metric = "val_loss"}\n', "")
                          + 'lr = {type = "float", low = 0.1, high = 0.5}')
    grid = text.replace("[sweep]\n", '[sweep]\nstrategy = "grid"\n') + (
        'lr = {type = "float", low = 0.1, high = 0.5, step = 0.1}\n'
        'opt = {type = "categorical", choices = ["a", "b"]}\n')
    spec = jobspec_from_toml(grid)
    assert spec.sweep is not None and spec.sweep.max_trials == 10


def test_a_trial_is_an_ordinary_job_spec_with_its_values_in_the_command_and_hyperparameters() -> None:
    spec = jobspec_from_toml(BASE.replace('"{hp.lr}"]', '"{hp.lr}", "--opt={hp.opt}", "{hp.epochs}"]') +
                             'lr = {type = "float", low = 0.0001, high = 0.5, log = true}\n'
                             'opt = {type = "categorical", choices = ["adam", "sgd"]}\n'
                             "[hyperparameters]\nepochs = 3\n")
    trial = spec.for_trial(7, {"lr": 0.003, "opt": "sgd"}, "sw-abc")
    assert trial.sweep is None and trial.trial == "7" and trial.sweep_id == "sw-abc"
    assert trial.command == ("python", "train.py", "--lr", "0.003", "--opt=sgd", "3")
    assert dict(trial.hyperparameters) == {"epochs": 3, "lr": 0.003, "opt": "sgd"}
    assert trial.name == "sw-t7"
    with pytest.raises(JobSpecError, match="not also fixed in \\[hyperparameters\\]"):
        jobspec_from_toml(BASE + 'lr = {type = "float", low = 0.1, high = 0.5}\n[hyperparameters]\nlr = 0.1\n')


# ---------------------------------------------------------------------------------------------
# Pieces of the engine


def test_objective_values_take_rank_0_and_the_newest_attempt() -> None:
    records = [
        {"step": 1, "rank": 1, "val_loss": 9.0, "restart": 0},
        {"step": 1, "rank": 0, "val_loss": 1.0, "restart": 0},
        {"step": 2, "rank": 0, "val_loss": 0.8, "restart": 0},
        {"step": 1, "rank": 0, "val_loss": 1.5, "restart": 1},  # the restarted gang starts over
        {"step": 3, "rank": 0, "loss": 0.1, "restart": 1},  # another metric
        {"step": 4, "rank": 0, "val_loss": "0.7", "restart": 1},  # hypertune writes strings
    ]
    got = {s: v for s, (_, _, v) in objective_values(records, "val_loss").items()}
    assert got == {1: 1.5, 4: 0.7}


def test_infrastructure_failures_are_signals_and_lost_hosts_not_exits() -> None:
    assert infrastructure_failure({"rank": 0, "signal": 9, "exit_code": None})
    assert infrastructure_failure({"message": "job host lost"})
    assert not infrastructure_failure({"rank": 0, "exit_code": 1, "message": "Traceback"})
    assert not infrastructure_failure(None)


def test_proposals_depend_on_the_seed_and_the_trial_number_only() -> None:
    """A controller that restarts mid-sweep proposes what it would have: each trial's sampler is
    seeded by seed + trial number."""
    import optuna

    spec = jobspec_from_toml(BASE.replace("max_trials = 4", 'max_trials = 4\nstrategy = "random"\nseed = 5') +
                             'lr = {type = "float", low = 0.0001, high = 0.5, log = true}\n').sweep
    assert spec is not None
    from tui.control.sweeps import distributions

    def propose(numbers: list[int]) -> list[float]:
        study = optuna.create_study()
        out = []
        for n in numbers:
            study.sampler = sampler_for(spec, n)
            out.append(study.ask(distributions(spec)).params["lr"])
        return out

    assert propose([1, 2, 3]) == propose([1, 2, 3])
    propose_seed5 = propose(list(range(1, 11)))
    assert propose([3]) == propose([1, 2, 3])[2:]  # trial 3 alone, as after a restart
    assert len(set(propose([1, 2, 3]))) == 3
    other = jobspec_from_toml(BASE.replace("max_trials = 4", 'max_trials = 4\nstrategy = "random"\nseed = 6') +
                              'lr = {type = "float", low = 0.0001, high = 0.5, log = true}\n').sweep
    assert other is not None
    spec = other
    assert not set(propose(list(range(1, 11)))) & set(propose_seed5)  # another seed: other proposals


# ---------------------------------------------------------------------------------------------
# On the test bed

@pytest.mark.testbed
def test_a_sweep_runs_every_trial_as_a_job_and_records_its_objective(cli: Cli) -> None:
    cli.run("deploy")
    out = cli.json("sweep", str(sweep_spec(cli, "sw-basic", trials=5, parallel=3)), "--wait", timeout=300)
    row = out["row"]
    assert row["state"] == "completed" and row["trials"] == 5 and row["completed"] == 5, row
    trials = out["trials"]
    assert sorted(t["number"] for t in trials) == [1, 2, 3, 4, 5]
    assert len({t["job_id"] for t in trials}) == 5
    for t in trials:
        assert t["state"] == "completed"
        assert t["value"] == pytest.approx(expected_objective(t, 8), rel=1e-9), t
        assert t["last_step"] == 8
        job = cli.json("status", t["job_id"])
        assert job["state"] == "succeeded" and job["trial"] == str(t["number"])
        assert job["sweep_id"] == row["sweep_id"]
    values = [t["value"] for t in trials]
    assert values == sorted(values)  # best first
    assert out["best"]["number"] == trials[0]["number"]
    listed = cli.json("sweeps")
    assert [s["sweep_id"] for s in listed if s["sweep_id"] == row["sweep_id"]]
    status = cli.run("sweep", "status", row["sweep_id"]).stdout
    first = status.splitlines()[1]
    assert first.startswith(f"best: trial {trials[0]['number']}") and "lr=" in first, status


@pytest.mark.testbed
def test_every_rank_of_a_trial_sees_its_trial_number_and_parameters(cli: Cli, testbed: TestBed) -> None:
    """Issue 13, acceptance 4: multi-node trials (2 hosts) and a single-node one."""
    cli.run("deploy")
    results = {}
    for nodes in (2, 1):
        spec = cli.spec(f"sw-probe{nodes}", f"""
command = ["{{python}}", "{PROBE}", "--x", "{{hp.x}}", "--k", "{{hp.k}}", "--kind", "{{hp.kind}}"]
workdir = "{ROOT}"
nodes = {nodes}
gpus_per_node = 1
[hyperparameters]
fixed = "yes"
[sweep]
strategy = "random"
max_trials = 2
max_parallel = 2
seed = {nodes}
objective = {{metric = "val_loss"}}
[sweep.parameters]
x = {{type = "float", low = 0.1, high = 0.9}}
k = {{type = "int", low = 1, high = 9}}
kind = {{type = "categorical", choices = ["alpha", "beta"]}}
""")
        results[nodes] = cli.json("sweep", str(spec), "--wait", timeout=300)
    checked = 0
    for nodes, out in results.items():
        assert out["row"]["state"] == "completed", out["row"]
        for t in out["trials"]:
            params = dict(t["params"])
            assert t["value"] == pytest.approx(params["x"])  # rank 0 reported its --x
            job = cli.json("status", t["job_id"])
            hosts = [n["host"] for n in job["placement"]]
            assert len(hosts) == nodes
            seen_ranks = []
            for h in hosts:
                idx = [x.name for x in testbed.hosts].index(h)
                probe_dir = testbed.hosts[idx].state_dir / "jobs" / t["job_id"] / "trial-probe"
                for f in sorted(probe_dir.glob("rank-*.json")):
                    seen = json.loads(f.read_text())
                    seen_ranks.append(seen["rank"])
                    n = str(t["number"])
                    assert seen["RIGDECK_TRIAL"] == n and seen["CLOUD_ML_TRIAL_ID"] == n, seen
                    assert seen["cluster_spec_trial"] == n, seen
                    assert seen["tf_config"] is (nodes > 1)
                    if nodes > 1:
                        assert seen["tf_config_trial"] == n, seen
                    assert seen["RIGDECK_SWEEP_ID"] == out["row"]["sweep_id"]
                    assert seen["argv"] == {"x": params["x"], "k": params["k"], "kind": params["kind"]}
                    assert seen["SM_HPS"] == {**params, "fixed": "yes"}
                    assert {k: json.loads(v) for k, v in seen["hyperparameters.json"].items()} == {
                        **params, "fixed": "yes"}
                    assert float(seen["SM_HP"]["X"]) == params["x"] and int(seen["SM_HP"]["K"]) == params["k"]
                    assert seen["SM_HP"]["KIND"] == params["kind"]
                    checked += 1
            assert sorted(seen_ranks) == list(range(nodes)), (t, seen_ranks)
    assert checked == 2 * 2 + 2 * 1


@pytest.mark.testbed
@pytest.mark.parametrize("report", ["print", "hypertune"])
def test_the_objective_comes_from_metric_definitions_or_hypertune(cli: Cli, report: str) -> None:
    cli.run("deploy")
    extra = ""
    if report == "print":
        extra = '[[sweep.metric_definitions]]\nname = "val_loss"\nregex = "val_loss=([0-9.]+)"\n'
    out = cli.json("sweep", str(sweep_spec(cli, f"sw-{report}", trials=2, parallel=2, report=report, extra=extra)),
                   "--wait", timeout=300)
    assert out["row"]["state"] == "completed", out
    for t in out["trials"]:
        # print writes 6 decimals
        assert t["value"] == pytest.approx(expected_objective(t, 8), abs=2e-6), t
        assert t["last_step"] == 8


@pytest.mark.testbed
def test_a_metric_no_trial_reports_fails_the_trial_saying_so(cli: Cli) -> None:
    cli.run("deploy")
    out = cli.json("sweep", str(sweep_spec(cli, "sw-nometric", trials=1, metric="val_acc", steps=3)), "--wait",
                   timeout=300, check=False)
    (t,) = out["trials"]
    assert t["state"] == "failed" and t["error"] == "metric val_acc never reported", t
    assert cli.json("status", t["job_id"])["state"] == "succeeded"  # the job itself ran fine


@pytest.mark.testbed
def test_a_median_pruned_trial_is_stopped_and_recorded_at_its_step(cli: Cli) -> None:
    cli.run("deploy")
    out = cli.json("sweep", str(sweep_spec(cli, "sw-prune", trials=9, parallel=3, steps=20, step_s=0.15,
                                             extra='early_stopping = "median"', seed=11)), "--wait", timeout=400)
    assert out["row"]["state"] == "completed" and out["row"]["trials"] == 9
    pruned = [t for t in out["trials"] if t["state"] == "pruned"]
    assert pruned, [(t["number"], t["state"]) for t in out["trials"]]
    for t in pruned:
        assert t["pruned_step"] is not None and t["pruned_step"] < 20, t
        job = cli.json("status", t["job_id"])
        assert job["state"] == "stopped", job
        assert any(e["event"] == "pruned" for e in job["events"])


@pytest.mark.testbed
def test_an_embedded_controller_killed_mid_sweep_resumes_it_without_losing_or_repeating_a_trial(cli: Cli) -> None:
    """Issue 13, acceptance 5 (embedded): kill -9 the process running the sweep, start another."""
    cli.run("deploy")
    spec = sweep_spec(cli, "sw-resume", trials=8, parallel=2, steps=10, step_s=0.2)
    proc = cli.popen("sweep", str(spec), "--wait")
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        sweep_id = first.split()[1].rstrip(":")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            st = cli.json("sweep", "status", sweep_id)
            if st["row"]["completed"] >= 2:
                break
            time.sleep(0.5)
        else:
            raise AssertionError("two trials did not complete")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    mid = cli.json("sweep", "status", sweep_id)
    assert mid["row"]["state"] == "running" and mid["row"]["completed"] < 8
    out = cli.json("sweep", "status", sweep_id, "--wait", timeout=400)
    assert out["row"]["state"] == "completed", out["row"]
    numbers = [t["number"] for t in out["trials"]]
    assert sorted(numbers) == list(range(1, 9))  # exactly max_trials, none twice
    for t in out["trials"]:
        assert t["state"] == "completed" and t["value"] == pytest.approx(expected_objective(t, 10), rel=1e-9)
    jobs = [j for j in cli.json("jobs") if j["sweep_id"] == sweep_id]
    assert sorted(j["trial"] for j in jobs) == sorted(str(n) for n in numbers)  # one job per trial
    assert all(j["state"] == "succeeded" for j in jobs)


@pytest.mark.testbed
async def test_an_embedded_sweep_goes_on_when_the_app_is_quit_and_reopened(
        cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 13, acceptance 5 (embedded, the app): the app runs the sweep while it is open; quit
    mid-sweep, the sweep waits; reopened, the app finishes it, every trial once."""
    import asyncio

    from tui.app.shell import RigdeckApp
    from tui.client import InProcessClient
    from tui.model.jobspec import load_jobspec
    from tui.remote.inventoryfile import load_inventory

    cli.run("deploy")
    monkeypatch.setenv("RIGDECK_HOME", cli.env["RIGDECK_HOME"])
    inv = load_inventory(cli.inventory)
    spec = load_jobspec(sweep_spec(cli, "sw-app", trials=6, parallel=2, steps=10, step_s=0.2))

    async def until(cond: Any, what: str, timeout: float = 120) -> Any:
        # The wait (cond reads the controller) in a thread of its own: the app runs on meanwhile.
        return await asyncio.to_thread(wait_until, cond, timeout, what, 0.3)

    app = RigdeckApp(InProcessClient(inv), keymap_file=tmp_path / "keys.toml")
    async with app.run_test(size=(140, 40)) as pilot:
        sweep_id = (await asyncio.to_thread(app.client.sweep, spec)).row.sweep_id
        await until(lambda: app.client.sweep_detail(sweep_id).row.completed >= 2, "two trials completed")
        await pilot.press("q")
    mid = cli.json("sweep", "status", sweep_id)
    assert mid["row"]["state"] == "running" and mid["row"]["completed"] < 6, mid["row"]
    time.sleep(3)  # nothing runs the sweep now: no trial is asked
    assert cli.json("sweep", "status", sweep_id)["row"]["trials"] == mid["row"]["trials"]

    app = RigdeckApp(InProcessClient(inv), keymap_file=tmp_path / "keys.toml")
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("7")
        await until(lambda: any(r.sweep_id == sweep_id and r.state == "completed" for r in app.sweep_list),
                    "the reopened app finishes the sweep and shows it", 240)
    out = cli.json("sweep", "status", sweep_id)
    assert sorted(t["number"] for t in out["trials"]) == list(range(1, 7))
    for t in out["trials"]:
        assert t["state"] == "completed" and t["value"] == pytest.approx(expected_objective(t, 10), rel=1e-9)
    jobs = [j for j in cli.json("jobs") if j["sweep_id"] == sweep_id]
    assert sorted(int(j["trial"]) for j in jobs) == list(range(1, 7))


def test_a_bad_sweep_spec_is_refused_by_the_cli_before_anything_starts(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(BASE + 'lr = {type = "float", low = 0, high = 0.1, log = true}\n')
    env = {**os.environ, "RIGDECK_HOME": str(tmp_path / "home"), "RIGDECK_INVENTORY": str(tmp_path / "none.toml")}
    p = subprocess.run([sys.executable, "-m", "tui.cli", "sweep", str(bad)], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=60)
    assert p.returncode == 2
    assert f"{bad}: field 'sweep.parameters.lr.low': expected low > 0 with log = true" in p.stderr
    assert not (tmp_path / "home" / "history.sqlite").exists()  # nothing recorded, nothing started
    plain = tmp_path / "plain.toml"
    plain.write_text('name = "x"\ncommand = ["true"]\n')
    p = subprocess.run([sys.executable, "-m", "tui.cli", "sweep", str(plain)], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=60)
    assert p.returncode == 2 and "no [sweep] table" in p.stderr
    ok = tmp_path / "ok.toml"
    ok.write_text(BASE + 'lr = {type = "float", low = 0.01, high = 0.1, log = true}\n')
    local = {k: v for k, v in env.items() if k != "RIGDECK_INVENTORY"}  # this machine alone
    p = subprocess.run([sys.executable, "-m", "tui.cli", "launch", str(ok)], capture_output=True, text=True, env=local,
                       cwd=ROOT, timeout=60)
    assert p.returncode == 2 and "has a [sweep] table: run it with rigdeck sweep" in p.stderr


@pytest.mark.testbed
def test_a_random_sweep_asks_its_next_trials_ahead_and_a_stop_ends_them_without_jobs(cli: Cli) -> None:
    """Random proposals do not depend on results: while its trials run, the sweep asks up to
    max_parallel more ahead (``ready``, no job yet); a stop ends those with the sweep."""
    cli.run("deploy")
    # Trials 1 and 2 must outlast the test's looks and stops (each a CLI run: slow on a loaded machine).
    spec = sweep_spec(cli, "sw-ahead", trials=6, parallel=2, steps=300, step_s=0.2)
    proc = cli.popen("sweep", str(spec), "--wait")
    try:
        assert proc.stdout is not None
        sweep_id = proc.stdout.readline().split()[1].rstrip(":")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            st = cli.json("sweep", "status", sweep_id)
            states = {t["number"]: t["state"] for t in st["trials"]}
            if sorted(n for n, s in states.items() if s == "ready") == [3, 4]:
                break
            time.sleep(0.3)
        else:
            raise AssertionError(f"trials 3 and 4 were not asked ahead: {states}")
        assert sorted(n for n, s in states.items() if s in ("starting", "running")) == [1, 2], states
        assert len(states) == 4, "never more asked ahead than max_parallel"
        assert st["row"]["queued"] == 2 and st["row"]["running"] == 2, st["row"]
        ready = [t for t in st["trials"] if t["state"] == "ready"]
        for t in ready:  # no job until its turn (a running trial may end meanwhile and give it its turn)
            if cli.run("status", t["job_id"], check=False).returncode == 0:
                now = {x["number"]: x["state"] for x in cli.json("sweep", "status", sweep_id)["trials"]}
                assert now[t["number"]] != "ready", (t, now)
        # Stopping one of them (the app's `s` on a trial) ends it at once; the other stays ready.
        stop4 = subprocess.run(
            [sys.executable, "-c", "import argparse, json, sys; from tui.cli.main import _client; "
             "d = _client(argparse.Namespace(inventory=None)).sweep_stop_trial(sys.argv[1], 4); "
             "print(json.dumps({t.number: [t.state, t.error] for t in d.trials}))", sweep_id],
            capture_output=True, text=True, env=cli.env, cwd=ROOT, timeout=60)
        assert stop4.returncode == 0, stop4.stderr
        after = json.loads(stop4.stdout)
        assert after["4"] == ["stopped", "stopped by the user"] and after["3"][0] == "ready", after
        cli.run("sweep", "stop", sweep_id)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    final = cli.json("sweep", "status", sweep_id)
    assert final["row"]["state"] == "stopped", final["row"]
    by_number = {t["number"]: t for t in final["trials"]}
    # Trial 4's stop left room ahead for one more (5), if a round came before the sweep's stop.
    assert sorted(by_number) in ([1, 2, 3, 4], [1, 2, 3, 4, 5]), by_number
    assert all(t["state"] == "stopped" for t in by_number.values()), by_number
    assert by_number[4]["error"] == "stopped by the user"
    assert all(by_number[n]["error"] == "the sweep was stopped" for n in by_number if n in (3, 5))
    jobs = {j["trial"]: j["state"] for j in cli.json("jobs") if j["sweep_id"] == sweep_id}
    assert jobs == {"1": "stopped", "2": "stopped"}, jobs  # the ready ones never became jobs


def test_an_orphan_asked_without_its_parameters_is_failed_not_recorded(tmp_path: Path) -> None:
    """A controller killed inside Optuna's ask leaves a RUNNING trial with some or none of its
    parameters (each is written apart). The next controller adopts complete orphans as trials,
    but one without its parameters could never run (its command needs them): it is told failed
    and left out, so the sweep asks that trial number anew instead of stalling on it for good."""
    from types import SimpleNamespace

    from tui.control.history import History
    from tui.control.sweeps import SweepRunner, distributions

    spec = jobspec_from_toml(BASE + 'lr = {type = "float", low = 0.001, high = 0.1, log = true}\n',
                             tmp_path / "job.toml")
    manager = SimpleNamespace(history=History(tmp_path / "history.sqlite"), owner="test")
    runner = SweepRunner(manager, queue=None)
    optuna = __import__("optuna")
    study = optuna.create_study(study_name="sw-orph", storage=runner.storage)
    runner.store.create("sw-orph", "orph", spec.to_dict())
    assert spec.sweep is not None
    whole = study.ask(distributions(spec.sweep))  # asked and written: its controller died after
    cut = study.ask()  # asked, killed before its parameter was written
    runner._adopt_orphans("sw-orph", spec, study, [])
    rows = runner.store.trials("sw-orph")
    assert [(r["trial_id"], r["params"]) for r in rows] == [(whole._trial_id, whole.params)]
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    assert states == {whole.number: optuna.trial.TrialState.RUNNING, cut.number: optuna.trial.TrialState.FAIL}
