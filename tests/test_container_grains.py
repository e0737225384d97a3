"""Containers at the grain of each capability (docs/containers.md, "Sweeps, pipelines and worker
pools"): a sweep's trials in the container of its spec, each trial in the image its categorical
parameter chose; a pipeline's steps each in its own container or on the host; a worker pool job's
pools each in its own container (one per host per distinct container) or on the host.

The spec's checks and the agent's grouping run here on this machine; on the session's test bed
(3 hosts, real sshd, real Podman) a 2-trial sweep, a 2-step pipeline and a 3-pool job, each rank
proving where it ran (tests/jobscripts/where_probe.py: Podman's ``/run/.containerenv`` and the
rank's own cgroup, against the containers Podman lists). The image is tests/containerimage.py's
(the ``image`` fixture of tests/test_container.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agent import jobhost
from tests.kit import JOBSCRIPTS, wait_until
from tests.kit.bedcli import Cli, tagged
from tests.kit.specs import steps_of
from tests.test_container import ended, image, podman  # noqa: F401  (image: the fixture)
from tui.model.containerspec import ContainerSpec
from tui.model.jobspec import JobSpec, JobSpecError, jobspec_from_toml, jobspec_from_wire
from tui.model.pipelinespec import PipelineSpec, pipeline_from_toml

pytestmark = pytest.mark.timeout(900)  # the image fixture may build the image (test_container.py)

HOSTS = ("h1", "h2", "h3")
PROBE = ["{python}", "where_probe.py"]
POOLS = """name = "p"
command = ["x"]
[container]
image = "localhost/train:1"
[[pools]]
role = "primary"
[[pools]]
role = "worker"
container = {image = "localhost/other:2", mounts = ["/data:/data:ro"]}
[[pools]]
role = "evaluator"
container = false
"""
SWEEP = """name = "s"
command = ["x", "--v", "{hp.v}"]
[container]
image = "localhost/train:{hp.v}"
[sweep]
objective = {metric = "val_loss"}
strategy = "grid"
[sweep.parameters]
v = {type = "categorical", choices = ["a", "b"]}
"""


def spec_error(text: str) -> str:
    with pytest.raises(JobSpecError) as e:
        jobspec_from_toml(text, "/tmp/s.toml")
    return str(e.value)


# -- the specs ---------------------------------------------------------------------------------

def test_each_pool_runs_in_its_own_container_the_jobs_or_on_the_host_and_it_survives_the_wire() -> None:
    spec = jobspec_from_toml(POOLS, "/tmp/p.toml")
    primary, worker, evaluator = spec.pools
    job_box = ContainerSpec("localhost/train:1")
    assert (primary.container, spec.container_of(primary)) == (None, job_box)
    assert spec.container_of(worker) == ContainerSpec("localhost/other:2", mounts=("/data:/data:ro",))
    assert evaluator.container is False and spec.container_of(evaluator) is None
    for again in (JobSpec.from_dict(json.loads(json.dumps(spec.to_dict()))), jobspec_from_wire(spec.to_dict())):
        assert again.pools == spec.pools and again.container == spec.container
    # A pool without a container of its own says nothing of it: its wire form is as it was.
    assert "container" not in primary.to_dict() and spec.to_dict()["pools"][2]["container"] is False


@pytest.mark.parametrize(("old", "new", "field", "expected"), [
    ("container = false", "container = true", "pools[2].container", "or false (this pool on the hosts"),
    ('image = "localhost/other:2", ', "", "pools[1].container.image",
     "(required in a container table) (pool 'worker')"),
    ('"/data:/data:ro"', '"data:/d"', "pools[1].container.mounts", '"SRC:DST" or "SRC:DST:ro"'),
    ("mounts = [", "shm = 1, mounts = [", "pools[1].container.shm", "image, mounts, options, runtime, workdir"),
])
def test_a_bad_pool_container_is_named_with_what_was_expected(old: str, new: str, field: str, expected: str) -> None:
    text = spec_error(POOLS.replace(old, new))
    assert text.startswith("/tmp/s.toml: ") and f"field '{field}'" in text and expected in text, text


def test_a_bad_pool_container_on_the_wire_is_refused_naming_it() -> None:
    d = jobspec_from_toml(POOLS, "/tmp/p.toml").to_dict()
    d["pools"][1]["container"] = {"image": "-v", "runtime": "podman"}
    with pytest.raises(JobSpecError) as e:
        jobspec_from_wire(d)
    assert "field 'pools[1].container.image'" in str(e.value), e.value


def test_a_sweep_trial_runs_in_the_image_its_categorical_parameter_chose() -> None:
    spec = jobspec_from_toml(SWEEP, "/tmp/s.toml")
    assert spec.container is not None and spec.container.image == "localhost/train:{hp.v}"
    trials = [spec.for_trial(n, {"v": v}, "sw1") for n, v in ((1, "a"), (2, "b"))]
    assert [t.container.image for t in trials if t.container] == ["localhost/train:a", "localhost/train:b"]
    assert jobspec_from_wire(spec.to_dict()).container == spec.container
    # Without a placeholder every trial runs in the spec's one image.
    plain = jobspec_from_toml(SWEEP.replace(":{hp.v}", ":1"), "/tmp/s.toml")
    assert plain.for_trial(1, {"v": "a"}, "sw1").container == plain.container == ContainerSpec("localhost/train:1")


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("train:{hp.v}", "train:{hp.w}", "a categorical parameter of [sweep] (its choices: the images the trials "
                                      "run in); {hp.w} names no such parameter"),
    ('{type = "categorical", choices = ["a", "b"]}', '{type = "int", low = 1, high = 2}', "names a int parameter"),
    ('"b"]', '"b c"]', 'with each choice of sweep.parameters.v, an image'),
])
def test_an_image_a_trial_could_not_run_is_refused_before_the_sweep_starts(old: str, new: str, expected: str) -> None:
    text = spec_error(SWEEP.replace(old, new))
    assert "field 'container.image'" in text and expected in text, text


def test_a_placeholder_in_the_image_of_a_job_that_is_no_sweep_is_refused() -> None:
    text = spec_error('name = "j"\ncommand = ["x"]\n[container]\nimage = "localhost/train:{hp.v}"\n')
    assert "field 'container.image'" in text and "no {hp.NAME} outside a sweep" in text, text


def pipeline(tmp_path: Path, steps: str) -> PipelineSpec:
    (tmp_path / "job.toml").write_text('name = "j"\ncommand = ["x"]\n[container]\nimage = "localhost/train:1"\n')
    path = tmp_path / "p.toml"
    path.write_text('name = "pl"\n' + steps)
    return pipeline_from_toml(path.read_text(), path)


def test_each_pipeline_step_runs_in_its_own_container_or_on_the_host(tmp_path: Path) -> None:
    spec = pipeline(tmp_path, '[[steps]]\nname = "a"\nspec = "job.toml"\n'
                    '[[steps]]\nname = "b"\nspec = "job.toml"\ncontainer = false\n'
                    '[[steps]]\nname = "c"\nspec = "job.toml"\ncontainer = {image = "localhost/other:2"}\n'
                    '[[steps]]\nname = "d"\n[steps.job]\ncommand = ["y"]\n[steps.job.container]\nimage = "i:3"\n')
    got = {s.name: s.job.container for s in spec.steps}
    assert got == {"a": ContainerSpec("localhost/train:1"), "b": None, "c": ContainerSpec("localhost/other:2"),
                   "d": ContainerSpec("i:3")}
    assert PipelineSpec.from_dict(json.loads(json.dumps(spec.to_dict()))).steps == spec.steps


@pytest.mark.parametrize(("step", "field", "expected"), [
    ("container = true", "steps.b.container", "or false (this step on the hosts themselves"),
    ('container = {image = "a b"}', "steps.b.container.image", "without spaces"),
    ('container = {runtime = "podman"}', "steps.b.container.image", "(required in a container table)"),
    ('container = {image = "x:{hp.v}"}', "steps.b.container.image", "no {hp.NAME} outside a sweep"),
])
def test_a_bad_step_container_is_named_with_what_was_expected(tmp_path: Path, step: str, field: str,
                                                              expected: str) -> None:
    with pytest.raises(JobSpecError) as e:
        pipeline(tmp_path, f'[[steps]]\nname = "b"\nspec = "job.toml"\n{step}\n')
    assert f"field '{field}'" in str(e.value) and expected in str(e.value), e.value


# -- the agent's side, on this machine ------------------------------------------------------

def job_host(tmp_path: Path, plan: dict[str, Any]) -> jobhost.JobHost:
    job_dir = tmp_path / "state" / "jobs" / plan["job_id"]
    job_dir.mkdir(parents=True)
    (job_dir / "plan.json").write_text(json.dumps(plan))
    return jobhost.JobHost(str(job_dir))


def node(pool: str, replica: int, host: str, box: dict[str, Any] | None) -> dict[str, Any]:
    return {"host": host, "address": "10.0.0.1", "slots": 1, "gpus": [], "pool": pool, "replica": replica,
            "port": 4000 + replica, "container": box}


def test_a_host_runs_one_container_per_distinct_pool_container_and_the_rest_on_itself(tmp_path: Path) -> None:
    train, other = {"image": "localhost/train:1"}, {"image": "localhost/other:2"}
    nodes = [node("primary", 0, "h1", train), node("worker", 0, "h1", other), node("worker", 1, "h1", other),
             node("evaluator", 0, "h1", None), node("parameter_server", 0, "h2", train)]
    plan = {"job_id": "j-1", "launcher": "direct", "nodes": nodes, "node_index": 0, "node_indices": [0, 1, 2, 3],
            "command": ["x"], "workdir": str(tmp_path), "kind": "training"}
    jh = job_host(tmp_path, plan)
    assert [b.name for b in jh.boxes] == ["rigdeck-j-1-h1-primary", "rigdeck-j-1-h1-worker"]
    assert {i: b.name if b else None for i, b in jh.node_box.items()} == {
        0: "rigdeck-j-1-h1-primary", 1: "rigdeck-j-1-h1-worker", 2: "rigdeck-j-1-h1-worker"}
    assert jh.node_box.get(3) is None  # the evaluator: on the host
    assert [b.spec["image"] for b in jh.boxes] == ["localhost/train:1", "localhost/other:2"]
    # One distinct container here: the job's own name, as without pools.
    only = job_host(tmp_path / "b", {**plan, "node_indices": [1, 2]})
    assert [b.name for b in only.boxes] == ["rigdeck-j-1-h1"]


def test_a_containers_channels_are_mounted_read_only_where_they_are(tmp_path: Path) -> None:
    """A pipeline step's staged input (a tree of the host's store) is a link in the job dir to a
    path the container does not otherwise mount: it is mounted there, read-only."""
    staged = tmp_path / "store" / "tree"
    staged.mkdir(parents=True)
    plan = {"job_id": "j-2", "launcher": "direct", "node_index": 0, "command": ["x"], "workdir": str(tmp_path / "w"),
            "nodes": [{"host": "h1", "address": "10.0.0.1", "slots": 1, "gpus": []}],
            "channels": {"train": str(staged), "gone": str(tmp_path / "nowhere"), "here": str(tmp_path / "w" / "d")},
            "container": {"image": "localhost/train:1", "mounts": ["/data:/data"]}}
    (tmp_path / "w" / "d").mkdir(parents=True)
    jh = job_host(tmp_path, plan)
    assert jh.container is not None
    assert jh.container.spec["mounts"] == ["/data:/data", f"{staged}:{staged}:ro"]
    argv = jh.container.run_argv(jh.plan, ["python3", "/opt/agent.pyz"], [], 1)
    assert f"{staged}:{staged}:ro" in argv


# -- on the test bed -----------------------------------------------------------------------------

def job_dir(cli: Cli, host: str, job_id: str) -> Path:
    return cli.bed.hosts[HOSTS.index(host)].state_dir / "jobs" / job_id


def records(cli: Cli, host: str, job_id: str) -> dict[str, dict[str, Any]]:
    """The probe's records in the job's directory on ``host``, by file name."""
    return {p.stem: json.loads(p.read_text()) for p in sorted((job_dir(cli, host, job_id) / "where").glob("*.json"))}


def left(cli: Cli, host: str, job_id: str) -> list[str]:
    """The job's containers still on ``host``, running or not (``podman ps -a`` with the agent's
    store there)."""
    r = podman(cli, HOSTS.index(host) + 1, "ps", "-a", "--filter", f"label=rigdeck.job={job_id}",
               "--format", "{{.Names}}")
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def none_left_after_end(cli: Cli, host: str, job_id: str) -> None:
    """No container of the ended job on ``host`` within 30 s: its job host records the job's end,
    then removes its containers (agent/jobhost.py ``run``), and holds the job's GPU claims until
    it exits after that, so a status that reads ended may come a moment before."""
    wait_until(lambda: left(cli, host, job_id) == [], 30, f"no container of {job_id} left on {host}")


def in_container(rec: dict[str, Any]) -> bool:
    """Podman's own mark in its containers, and the image's python3 (the hosts run the suite's)."""
    return bool(rec["containerenv"] and rec["python"] == "/usr/bin/python3")


def on_host(rec: dict[str, Any]) -> bool:
    return not rec["containerenv"] and not rec["libpod"] and rec["python"] != "/usr/bin/python3"


@pytest.mark.testbed
def test_a_sweeps_trials_run_in_the_container_each_in_the_image_it_chose(cli: Cli, image: str) -> None:  # noqa: F811
    """Two trials (a grid over a categorical parameter whose choices name the test image two
    ways: by its name and by its id, the one image the suite builds; the machine's image store,
    which other tests read at the same time, is left as it is): each trial's rank ran in a
    container (Podman's /run/.containerenv, the image's python3), started from the image its
    value named (the job host's own log of its `podman run`)."""
    image_id = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", image], check=True,
                              capture_output=True, text=True).stdout.strip()
    assert len(image_id) == 64, image_id
    spec = cli.spec("swc", f"""
command = {json.dumps([*PROBE, "--report", "1.0"])}
workdir = "{JOBSCRIPTS}"
max_runtime = "3m"
[container]
image = "{{hp.image}}"
[sweep]
strategy = "grid"
max_parallel = 2
objective = {{metric = "val_loss"}}
[sweep.parameters]
image = {{type = "categorical", choices = ["{image}", "{image_id}"]}}
""")
    out = cli.json("sweep", str(spec), "--wait", timeout=240)
    assert out["row"]["state"] == "completed" and out["row"]["completed"] == 2, out["row"]
    chose = []
    for t in out["trials"]:
        st = cli.json("status", t["job_id"])
        assert st["state"] == "succeeded" and t["value"] == 1.0, (t, st["state"])
        (host,) = {n["host"] for n in st["placement"]}
        rec = records(cli, host, t["job_id"])["rank-0"]
        assert in_container(rec) and rec["trial"] == str(t["number"]), rec
        want = dict(t["params"])["image"]
        ran = [ln for ln in (job_dir(cli, host, t["job_id"]) / "jobhost.log").read_text().splitlines()
               if "container: podman" in ln]
        assert len(ran) == 1 and f" {want} " in ran[0], ran
        chose.append(want)
        none_left_after_end(cli, host, t["job_id"])
        print(f"trial {t['number']} on {host}: podman run ... {want} ...; inside: /run/.containerenv "
              f"{rec['containerenv']}, python {rec['python']}, cgroup {rec['cgroup'].splitlines()[0]}")
    assert sorted(chose) == sorted([image, image_id])


@pytest.mark.testbed
def test_a_pipelines_step_runs_in_its_container_and_the_next_on_the_host(cli: Cli, image: str) -> None:  # noqa: F811
    """Step 1 an inline job given a container by the step (`container = {image = ...}`); step 2 a
    spec file with a [container] that the step puts on the host (`container = false`), reading
    step 1's record as its input: an artifact made in a container, read on the host."""
    job = cli.spec("plc-job", f'command = {json.dumps([*PROBE, "--input", "first/where.json"])}\n'
                   f'workdir = "{JOBSCRIPTS}"\nmax_runtime = "3m"\n[container]\nimage = "{image}"\n')
    spec = cli.tmp / "plc.toml"
    spec.write_text(f"""name = "plc"
[[steps]]
name = "inside"
container = {{image = "{image}"}}
[steps.job]
command = {json.dumps([*PROBE, "--output", "where.json"])}
workdir = "{JOBSCRIPTS}"
max_runtime = "3m"
[[steps]]
name = "outside"
spec = "{job}"
container = false
depends_on = ["inside"]
inputs = {{ first = "steps.inside.output" }}
""")
    out = cli.json("pipeline", str(spec), "--wait", timeout=240)
    steps = steps_of(out)
    assert out["row"]["state"] == "succeeded", {n: (st["state"], st["reason"]) for n, st in steps.items()}
    seen, where = {}, {}
    for name in ("inside", "outside"):
        st = cli.json("status", steps[name]["job_id"])
        (host,) = where[name] = {n["host"] for n in st["placement"]}
        seen[name] = records(cli, host, steps[name]["job_id"])["rank-0"]
        print(f"step {name} on {host}: /run/.containerenv {seen[name]['containerenv']}, python "
              f"{seen[name]['python']}, cgroup {seen[name]['cgroup'].splitlines()[0]}")
    assert in_container(seen["inside"]) and seen["inside"]["step"] == "inside", seen["inside"]
    assert on_host(seen["outside"]) and seen["outside"]["step"] == "outside", seen["outside"]
    assert seen["outside"]["input"] == seen["inside"]  # step 1's artifact, as it wrote it in its container
    (host,) = where["inside"]
    none_left_after_end(cli, host, steps["inside"]["job_id"])


@pytest.mark.testbed
def test_a_pool_job_runs_each_pool_in_its_own_container_or_on_the_host(cli: Cli, image: str) -> None:  # noqa: F811
    """Three pools on h1: the primary in the job's [container], the worker in a container of its
    own (one more on the host: its table differs), the evaluator on the host. Each rank is in the
    container Podman lists for its pool (its cgroup names that container's id), or in none; the
    primary ends the job, which succeeds, and no container or process is left."""
    spec = cli.spec("poolc", f"""
command = {json.dumps([*PROBE, "--serve"])}
workdir = "{JOBSCRIPTS}"
max_runtime = "3m"
grace = "2s"
[container]
image = "{image}"
[[pools]]
role = "primary"
hosts = ["h1"]
command = {json.dumps([*PROBE, "--until", "release"])}
[[pools]]
role = "worker"
hosts = ["h1"]
container = {{image = "{image}", options = ["--env", "RIGDECK_TEST_BOX=worker"]}}
[[pools]]
role = "evaluator"
hosts = ["h1"]
container = false
""")
    job_id = cli.json("launch", str(spec))["job_id"]
    def all_three() -> dict[str, dict[str, Any]] | None:
        got = records(cli, "h1", job_id)
        return got if len(got) == 3 else None

    recs = wait_until(all_three, 120, "every pool's record", step=1.0)
    listed = podman(cli, 1, "ps", "--no-trunc", "--filter", f"label=rigdeck.job={job_id}",
                    "--format", "{{.Names}} {{.ID}}").stdout.split("\n")
    ids = dict(line.split() for line in listed if line.strip())
    assert sorted(ids) == [f"rigdeck-{job_id}-h1-primary", f"rigdeck-{job_id}-h1-worker"], ids
    primary, worker, evaluator = recs["primary-0"], recs["worker-1"], recs["evaluator-2"]
    # Each rank's cgroup as h1 sees it: in its pool's container (the id Podman lists), or in none.
    cgroup = {r["pool"]: cli.bed.exec(1, ["cat", f"/proc/{r['pid']}/cgroup"]).stdout for r in recs.values()}
    assert in_container(primary) and ids[f"rigdeck-{job_id}-h1-primary"] in cgroup["primary"], primary
    assert in_container(worker) and ids[f"rigdeck-{job_id}-h1-worker"] in cgroup["worker"], worker
    assert ids[f"rigdeck-{job_id}-h1-primary"] not in cgroup["worker"]
    assert on_host(evaluator) and not any(i in cgroup["evaluator"] for i in ids.values()), evaluator
    for r in (primary, worker, evaluator):
        line = next((ln for ln in cgroup[r["pool"]].splitlines() if "libpod" in ln), cgroup[r["pool"]].splitlines()[0])
        print(f"{r['pool']} rank {r['rank']}: /run/.containerenv {r['containerenv']}, python {r['python']}, "
              f"cgroup {line}")
    (job_dir(cli, "h1", job_id) / "where" / "release").write_text("")
    st = ended(cli, job_id, timeout=120)
    assert st["state"] == "succeeded", json.dumps(st, indent=1)[-3000:]
    none_left_after_end(cli, "h1", job_id)
    wait_until(lambda: tagged(cli.bed, job_id) == {h: [] for h in HOSTS}, 30, "no process left")
