"""[model_parallel] in a job spec (tui.model.mpspec): what it parses to, what reaches every
rank, and every bad table named before anything starts (issue 16, acceptance 6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.kit.specs import spec_file
from tui.model.jobspec import JobSpec, JobSpecError, load_jobspec
from tui.model.mpspec import ModelParallelSpec

HEAD = 'name = "pipe"\ncommand = ["{python}", "train.py"]\n'
THREE = HEAD + "nodes = 3\nprocesses_per_node = 1\n"


def load_error(tmp_path: Path, text: str) -> JobSpecError:
    path = spec_file(tmp_path, text)
    with pytest.raises(JobSpecError) as info:
        load_jobspec(path)
    assert info.value.path == path and str(info.value).startswith(f"{path}: field ")
    return info.value


def plan_json(partitions: int = 3, blocks: int = 6, cuts: list[int] | None = None) -> str:
    """A plan shaped as docs/contracts.md's mp_plan event carries it."""
    cuts = cuts if cuts is not None else [blocks * (i + 1) // partitions for i in range(partitions - 1)]
    bounds = [0, *cuts, blocks]
    return json.dumps({
        "version": 1, "optimize": "speed", "schedule": "simple", "microbatches": 4,
        "partitions": partitions, "blocks": blocks, "cuts": cuts, "source": "profiled",
        "stages": [{"stage": i, "blocks": [bounds[i], bounds[i + 1]], "time_s": 0.01,
                    "memory_bytes": 1000, "send_bytes": 100} for i in range(len(bounds) - 1)],
        "bubble": (partitions - 1) / (4 + partitions - 1),
        "equal_split": {"cuts": cuts, "max_time_s": 0.01, "max_memory_bytes": 1000},
    })


# ---------------------------------------------------------------------------------------------
# Good tables


def test_a_full_table_parses_and_reaches_ranks_as_json(tmp_path: Path) -> None:
    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / "p.json").write_text(plan_json())
    spec = load_jobspec(spec_file(tmp_path, THREE + """
        [model_parallel]
        partitions = 3
        microbatches = 4
        pipeline = "interleaved"
        optimize = "memory"
        activation_checkpointing = true
        profile_batch = [32, 64]
        plan = "plans/p.json"
    """))
    assert spec.model_parallel == ModelParallelSpec(
        partitions=3, microbatches=4, batch_size=32, pipeline="interleaved", optimize="memory",
        activation_checkpointing=True, profile_batch=(32, 64), plan="plans/p.json")
    assert json.loads(spec.model_parallel.to_env()) == {
        "partitions": 3, "microbatches": 4, "pipeline": "interleaved", "optimize": "memory",
        "activation_checkpointing": True, "profile_batch": [32, 64], "batch_size": 32,
        "plan": "plans/p.json"}


def test_defaults_are_filled(tmp_path: Path) -> None:
    spec = load_jobspec(spec_file(tmp_path, HEAD + "nodes = 2\n[model_parallel]\npartitions = 2\n"
                                  "microbatches = 8\nprofile_batch = [16, 3, 32, 32]\n"))
    assert spec.model_parallel is not None
    assert json.loads(spec.model_parallel.to_env()) == {
        "partitions": 2, "microbatches": 8, "pipeline": "simple", "optimize": "speed",
        "activation_checkpointing": False, "profile_batch": [16, 3, 32, 32], "batch_size": 16,
        "plan": None}
    # A function named by the script: the batch size must be given.
    spec = load_jobspec(spec_file(tmp_path, HEAD + "gpus_per_node = 2\n[model_parallel]\npartitions = 2\n"
                                  'microbatches = 2\nprofile_batch = "sample_batch"\nbatch_size = 8\n'))
    assert spec.model_parallel is not None and spec.model_parallel.profile_batch == "sample_batch"
    assert spec.model_parallel.batch_size == 8
    # A plan file alone needs no profile_batch (nothing is profiled).
    (tmp_path / "plan.json").write_text(plan_json(2, 5))
    spec = load_jobspec(spec_file(tmp_path, HEAD + 'hosts = ["a", "b"]\n[model_parallel]\npartitions = 2\n'
                                  'microbatches = 2\nbatch_size = 8\nplan = "plan.json"\n'))
    assert spec.model_parallel is not None and spec.model_parallel.profile_batch is None


def test_the_contract_example_loads(tmp_path: Path) -> None:
    """The example in docs/contracts.md ("Model parallelism"), verbatim, and the env it shows."""
    import re

    text = (Path(__file__).resolve().parent.parent / "docs" / "contracts.md").read_text()
    block = re.search(r"## Model parallelism.*?```toml\n(.*?)```", text, re.S)
    env = re.search(r"`RIGDECK_MODEL_PARALLEL`, every rank's: `(.*?)`", text, re.S)
    assert block is not None and env is not None
    spec = load_jobspec(spec_file(tmp_path, block.group(1)))
    assert spec.model_parallel is not None and spec.world_size == spec.model_parallel.partitions == 3
    assert json.loads(spec.model_parallel.to_env()) == json.loads(env.group(1).replace("\n", " "))


def test_it_survives_the_history_and_a_sweep_trial(tmp_path: Path) -> None:
    spec = load_jobspec(spec_file(tmp_path, THREE + "[model_parallel]\npartitions = 3\nmicrobatches = 4\n"
                                  "profile_batch = [32, 64]\n"))
    again = JobSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec and hash(again) == hash(spec)
    assert load_jobspec(spec_file(tmp_path, THREE)).to_dict()["model_parallel"] is None


def test_the_plan_is_read_in_the_synced_directory(tmp_path: Path) -> None:
    """With [code] sync the workdir is the synced directory: the plan is looked for there."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "plan.json").write_text(plan_json())
    spec = load_jobspec(spec_file(tmp_path, THREE + '[code]\nsync = "src"\n[model_parallel]\n'
                                  'partitions = 3\nmicrobatches = 3\nbatch_size = 9\nplan = "plan.json"\n'))
    assert spec.model_parallel is not None and spec.model_parallel.plan == "plan.json"


# ---------------------------------------------------------------------------------------------
# Bad tables: each names model_parallel.FIELD and what was expected.

BAD = [
    pytest.param(THREE, "partitions = 1\nmicrobatches = 1\nprofile_batch = [4]", "partitions",
                 "an integer >= 2", id="one-partition"),
    pytest.param(THREE, 'partitions = "3"\nmicrobatches = 1\nprofile_batch = [4]', "partitions",
                 "an integer >= 2", id="partitions-type"),
    pytest.param(THREE, "microbatches = 1\nprofile_batch = [4]", "partitions",
                 "(required in [model_parallel])", id="partitions-missing"),
    pytest.param(THREE, "partitions = 3\nprofile_batch = [4]", "microbatches",
                 "(required in [model_parallel])", id="microbatches-missing"),
    pytest.param(THREE, "partitions = 3\nmicrobatches = 5\nprofile_batch = [32, 64]", "microbatches",
                 "a divisor of the batch size 32", id="microbatches-do-not-divide"),
    pytest.param(THREE, "partitions = 3\nmicrobatches = 2\nprofile_batch = [32]\npipeline = \"interleaved\"",
                 "microbatches", 'at least partitions (3) with pipeline = "interleaved"', id="interleaved-few"),
    pytest.param(HEAD + "nodes = 2\nprocesses_per_node = 2\n", "partitions = 3\nmicrobatches = 4\nprofile_batch = [32]",
                 "partitions", "the job's world size, one rank per stage: nodes 2 x processes_per_node 2 = 4 ranks",
                 id="world-size"),
    pytest.param(HEAD, "partitions = 3\nmicrobatches = 4\nprofile_batch = [32]", "partitions",
                 "nodes 1 (not set) x processes_per_node 1 (not set) = 1 rank; set partitions = 1, or nodes "
                 "and processes_per_node (or gpus_per_node) so that they make 3", id="world-size-not-set"),
    pytest.param(HEAD + 'hosts = ["a", "b"]\ngpus_per_node = 2\n',
                 "partitions = 2\nmicrobatches = 4\nprofile_batch = [32]",
                 "partitions", "2 hosts listed x gpus_per_node 2 = 4 ranks", id="world-size-gpus"),
    pytest.param(THREE, "partitions = 3\nmicrobatches = 4\nprofile_batch = [32]\npipline = \"simple\"",
                 "pipline", "did you mean 'pipeline'", id="unknown-key"),
    pytest.param(THREE, "partitions = 3\nmicrobatches = 4\nprofile_batch = [32]\npipeline = \"gpipe\"",
                 "pipeline", '"simple" or "interleaved"', id="pipeline"),
    pytest.param(THREE, "partitions = 3\nmicrobatches = 4\nprofile_batch = [32]\noptimize = \"both\"",
                 "optimize", '"speed" or "memory"', id="optimize"),
    pytest.param(THREE, "partitions = 3\nmicrobatches = 4\nprofile_batch = [32]\nactivation_checkpointing = 1",
                 "activation_checkpointing", "true or false", id="checkpointing"),
    pytest.param(THREE, "partitions = 3\nmicrobatches = 4\nprofile_batch = [0, 4]", "profile_batch",
                 "a sample input's shape", id="shape-zero"),
    pytest.param(THREE, 'partitions = 3\nmicrobatches = 4\nprofile_batch = "make batch"', "profile_batch",
                 "the name of a function in the training script", id="function-name"),
    pytest.param(THREE, "partitions = 3\nmicrobatches = 4", "profile_batch",
                 "required unless a plan file is given", id="profile-missing"),
    pytest.param(THREE, 'partitions = 3\nmicrobatches = 4\nprofile_batch = "sample"', "batch_size",
                 "required: profile_batch names a function", id="batch-missing"),
    pytest.param(THREE, "partitions = 3\nmicrobatches = 4\nprofile_batch = [32]\nbatch_size = 64", "batch_size",
                 "the first dimension of profile_batch (32)", id="batch-disagrees"),
    pytest.param(THREE, 'partitions = 3\nmicrobatches = 4\nbatch_size = 8\nplan = "/abs/plan.json"', "plan",
                 "relative to the workdir", id="plan-absolute"),
    pytest.param(THREE, 'partitions = 3\nmicrobatches = 4\nbatch_size = 8\nplan = "nope.json"', "plan",
                 "an existing plan file (relative to the workdir): ", id="plan-missing"),
]


@pytest.mark.parametrize(("head", "table", "field", "expected"), BAD)
def test_bad_tables_name_their_field(tmp_path: Path, head: str, table: str, field: str, expected: str) -> None:
    err = load_error(tmp_path, head + "[model_parallel]\n" + table + "\n")
    assert err.field == f"model_parallel.{field}"
    assert expected in err.expected, err.expected
    assert f"field 'model_parallel.{field}': expected {err.expected}" in str(err)


def test_a_non_table_is_named(tmp_path: Path) -> None:
    err = load_error(tmp_path, THREE + "model_parallel = 3\n")
    assert err.field == "model_parallel" and "a table ([model_parallel])" in str(err)


@pytest.mark.parametrize(
    ("content", "field", "expected"),
    [
        (plan_json(2, 6), "plan", "a plan for partitions = 3 stages: {path} has 2"),
        (plan_json(3, 2, [1, 2]), "partitions",
         "at most the model's number of blocks (2, as the plan file {path} says)"),
        (plan_json(3, 6, [4, 2]), "plan", "has cuts [4, 2], which do not split 6 blocks into 3 stages"),
        ("{not json", "plan", "a plan file of JSON"),
        ("[1, 2, 3]", "plan", "holds no object"),
        ('{"stages": []}', "plan", "lacks them"),
    ],
)
def test_a_plan_file_must_fit_the_table(tmp_path: Path, content: str, field: str, expected: str) -> None:
    (tmp_path / "plan.json").write_text(content)
    err = load_error(tmp_path, THREE + '[model_parallel]\npartitions = 3\nmicrobatches = 4\nbatch_size = 8\n'
                     'plan = "plan.json"\n')
    assert err.field == f"model_parallel.{field}"
    assert expected.format(path=tmp_path / "plan.json") in err.expected, err.expected


def test_cli_launch_of_a_bad_table_exits_2_and_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the real CLI: the error names the file and field; no job is recorded (there is no
    inventory: the spec fails before any host would be asked)."""
    from tui.cli.main import main
    from tui.control.history import History

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RIGDECK_HOME", str(tmp_path / "rigdeck"))
    monkeypatch.delenv("RIGDECK_INVENTORY", raising=False)
    path = spec_file(tmp_path, THREE + "[model_parallel]\npartitions = 3\nmicrobatches = 5\n"
                     "profile_batch = [32, 64]\n")
    assert main(["launch", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == (f"rigdeck: {path}: field 'model_parallel.microbatches': expected a divisor of the "
                   "batch size 32 (every microbatch the same size), got 5 (integer)\n")
    assert History().list() == []


# ---------------------------------------------------------------------------------------------
# Through a real job on this machine (the local transport: a real agent and job host, no SSH)


def test_every_rank_gets_the_table_and_status_shows_the_stages(tmp_path: Path) -> None:
    """Two ranks of a [model_parallel] job each get RIGDECK_MODEL_PARALLEL (the parsed table,
    defaults filled); what they report as mp_plan and mp_stage comes back in `rigdeck status`
    (text and --json's "stages") after the job ended."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    inv = tmp_path / "hosts.toml"
    inv.write_text("[[hosts]]\n"
                   f'name = "here"\naddress = "localhost"\ntransport = "local"\npython = "{sys.executable}"\n'
                   f'state_dir = "{tmp_path / "state"}"\n'
                   f'env = {{ RIGDECK_CLAIM_DIR = "{tmp_path / "claims"}" }}\n')
    env = {**os.environ, "RIGDECK_HOME": str(tmp_path / "home"), "RIGDECK_INVENTORY": str(inv)}

    def rigdeck(*args: str) -> str:
        res = subprocess.run([sys.executable, "-m", "tui.cli", *args], env=env, cwd=root,
                             capture_output=True, text=True, timeout=180)
        assert res.returncode == 0, f"rigdeck {' '.join(args)} exited {res.returncode}:\n{res.stdout}\n{res.stderr}"
        return res.stdout

    spec = spec_file(tmp_path, HEAD.replace("train.py", str(root / "tests" / "jobscripts" / "mp_probe.py"))
                     + f'workdir = "{root}"\nprocesses_per_node = 2\n[model_parallel]\npartitions = 2\n'
                     'microbatches = 4\noptimize = "memory"\nprofile_batch = [8, 16]\n')
    done = json.loads(rigdeck("launch", str(spec), "--wait", "--json"))
    assert done["state"] == "succeeded", done
    job_id = done["job_id"]

    table = {"partitions": 2, "microbatches": 4, "pipeline": "simple", "optimize": "memory",
             "activation_checkpointing": False, "profile_batch": [8, 16], "batch_size": 8, "plan": None}
    seen = [json.loads(line.split("RIGDECK_MODEL_PARALLEL=", 1)[1])
            for line in rigdeck("logs", job_id).splitlines() if "RIGDECK_MODEL_PARALLEL=" in line]
    assert seen == [table, table]

    status = json.loads(rigdeck("status", job_id, "--json"))
    st = status["stages"]
    assert (st["optimize"], st["schedule"], st["microbatches"], st["partitions"], st["cuts"]) == (
        "memory", "simple", 4, 2, [2])
    assert st["expected_bubble"] == pytest.approx(1 / 5) and st["activation_checkpointing"] is False
    assert [(s["stage"], s["blocks"], s["step_time_s"], s["busy_s"], s["peak_bytes"], s["rank"])
            for s in st["stages"]] == [(0, [0, 2], 0.01, 0.002, 1500, 0), (1, [2, 4], 0.01, 0.004, 3000, 1)]
    assert st["measured_bubble"] == pytest.approx((0.8 + 0.6) / 2)
    text = rigdeck("status", job_id).splitlines()
    at = next(i for i, line in enumerate(text) if line.startswith("stages "))
    assert text[at] == "stages   2 stages · optimize memory · schedule simple (GPipe) · 4 microbatches · " \
                       "activation checkpointing off · plan profiled, cuts 2"
    assert text[at + 1].strip().startswith("bubble expected 20% · measured 70%")
    assert text[at + 2].split() == ["stage", "blocks", "rank", "exp", "busy", "busy", "step", "bubble", "exp", "mem",
                                    "peak"]
    assert text[at + 3].split() == ["0", "0-1", "r0", "here", "4", "ms", "2", "ms", "10", "ms", "80%", "1000", "B",
                                    "1.5", "KB"]

    # The job poller (the app's, a server's) reads the same metrics, shows the stages and keeps
    # the plan in the job's history, where a job whose hosts are gone still has it.
    from tui.control.history import History
    from tui.control.hostlinks import HostLinks
    from tui.control.jobs import JobManager
    from tui.control.jobwatch import JobWatch
    from tui.model.stages import plan_from_events
    from tui.remote.inventoryfile import load_inventory

    history = History(tmp_path / "home" / "history.sqlite")
    ctl = HostLinks(load_inventory(inv))
    try:
        watch = JobWatch(JobManager(ctl, history))
        watch.poll_once()
        detail = watch.detail(job_id)
        assert detail is not None and detail.stages is not None
        assert json.loads(json.dumps(detail.stages.to_json())) == st
        rec = history.get(job_id)
        assert rec is not None
        kept = plan_from_events(rec["events"])
        assert kept is not None and kept["cuts"] == [2] and len(kept["stages"]) == 2
        JobWatch(JobManager(ctl, history)).poll_once()  # a restarted app reads it all again: kept once
        rec = history.get(job_id)
        assert rec is not None and [e["event"] for e in rec["events"]].count("mp_plan") == 1
    finally:
        ctl.close()
        history.close()
