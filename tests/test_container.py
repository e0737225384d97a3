"""``[container]`` jobs (agent/container.py): the spec's checks, and on the session's test bed
(3 hosts, real sshd, a real Podman with runc) the ddp example in one container per host, a stop
and a killed rank leaving no container and no process, and a missing image or runtime refused
before anything starts. The image is tests/containerimage.py's (``make image`` builds it once
per recipe and loads it into this machine's podman store, which every bed host's agent reads
as its read-only image store)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agent import container as agent_container
from tests import containerimage
from tests._require import require
from tests.kit import EXAMPLES, JOBSCRIPTS, wait_until
from tests.kit.bedcli import Cli, tagged
from tui.control.images import ImagePush
from tui.model.jobspec import JobSpecError, jobspec_from_toml, jobspec_from_wire

# The first test on the bed builds the image when this machine has none cached (about 3 minutes,
# more with the other workers running): its setup needs more than the suite's 300 s.
pytestmark = pytest.mark.timeout(900)

HOSTS = ("h1", "h2", "h3")
# Inside a bed host, the agent's state dir is /root/.rigdeck (tests/testbed.py).
STORE_ENV = ["env", "CONTAINERS_CONF=/root/.rigdeck/podman/containers.conf",
             "CONTAINERS_STORAGE_CONF=/root/.rigdeck/podman/storage.conf"]
# The bed of the Docker tests runs a Docker daemon of its own on each host (docker_bed), its
# state under the agent's state dir there, found by the agent through DOCKER_HOST (the inventory's env).
DOCKER_DIR = "/root/.rigdeck/docker"
DOCKER_HOST = f"unix://{DOCKER_DIR}/docker.sock"
ALICE = "rdk-alice"
BASE = 'name = "c"\ncommand = ["{python}", "x.py"]\nworkdir = "/tmp"\n'


# -- the spec --------------------------------------------------------------------------------

def spec_error(body: str) -> str:
    with pytest.raises(JobSpecError) as e:
        jobspec_from_toml(BASE + body, "/tmp/c.toml")
    return str(e.value)


def test_container_table_is_read_and_survives_the_wire() -> None:
    spec = jobspec_from_toml(BASE + '[container]\nimage = "localhost/train:1"\nmounts = ["/data:/data:ro"]\n'
                             'workdir = "/work"\noptions = ["--cap-add", "SYS_PTRACE"]\n', "/tmp/c.toml")
    assert spec.container is not None
    assert (spec.container.image, spec.container.runtime, spec.container.mounts, spec.container.workdir,
            spec.container.options) == ("localhost/train:1", "podman", ("/data:/data:ro",), "/work",
                                        ("--cap-add", "SYS_PTRACE"))
    assert jobspec_from_wire(spec.to_dict()).container == spec.container
    assert jobspec_from_toml(BASE, "/tmp/c.toml").container is None


@pytest.mark.parametrize(("body", "field", "expected"), [
    ('[container]\nruntime = "podman"\n', "container.image", "(required in [container])"),
    ('[container]\nimage = "-v:/x"\n', "container.image", "without spaces or a leading '-'"),
    ('[container]\nimage = "x"\nruntime = "lxc"\n', "container.runtime", '"podman" or "docker" or "apptainer"'),
    ('[container]\nimage = "x"\nmounts = ["data:/d"]\n', "container.mounts", '"SRC:DST" or "SRC:DST:ro"'),
    ('[container]\nimage = "x"\nmounts = ["/a:/b:rx"]\n', "container.mounts", '"SRC:DST" or "SRC:DST:ro"'),
    ('[container]\nimage = "x"\nworkdir = "rel"\n', "container.workdir", "an absolute directory"),
    ('[container]\nimage = "x"\noptions = "--privileged"\n', "container.options", "a list of strings"),
    ('[container]\nimage = "x"\nshm = 1\n', "container.shm", "image, mounts, options, runtime, workdir"),
    ('launcher = "mpirun"\n[container]\nimage = "x"\n', "launcher", '"direct" or "torchrun" with [container]'),
    ('[container]\nimage = "localhost/x:1"\nruntime = "apptainer"\n', "container.image",
     "an image file's absolute path on the hosts (a SIF file or sandbox directory)"),
])
def test_a_bad_container_field_is_named_with_what_was_expected(body: str, field: str, expected: str) -> None:
    text = spec_error(body)
    assert text.startswith("/tmp/c.toml: ") and f"field '{field}'" in text and expected in text, text


# -- the agent's side, on this machine -------------------------------------------------------

def test_an_absent_runtime_is_named_with_what_the_host_has(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    assert agent_container.check({"image": "x", "runtime": "podman"}, str(tmp_path)) == [
        "no podman here (container runtimes found: none of podman, docker, apptainer)"]
    podman = shutil.which("podman", path="/usr/bin:/usr/local/bin")
    require(podman is not None, "podman is not installed (make test installs it)")
    (bin_dir / "podman").symlink_to(podman or "")
    assert agent_container.check({"image": "x", "runtime": "apptainer"}, str(tmp_path)) == [
        "no apptainer here (container runtimes found: podman)"]
    assert agent_container.check({"image": "x", "runtime": "docker"}, str(tmp_path)) == [
        "no docker here (container runtimes found: podman)"]


def test_limits_come_from_the_host_and_never_exceed_it() -> None:
    import resource

    argv = agent_container.ulimits()
    got = dict(argv[i + 1].split("=", 1) for i in range(0, len(argv), 2))
    assert set(got) == {"nofile", "nproc", "memlock"}
    soft, hard = (-1 if v == resource.RLIM_INFINITY else v for v in resource.getrlimit(resource.RLIMIT_NOFILE))
    assert got["nofile"] == f"{soft}:{hard}"
    nproc = [int(v) for v in got["nproc"].split(":")]
    assert all(0 < v <= agent_container.PODMAN_NPROC for v in nproc)


# -- each runtime's commands, on this machine --------------------------------------------------

PLAN = {"workdir": "/srv/code", "checkpoint": None}
AGENT = ["python3", "/opt/rigdeck/agent.pyz"]


def box(tmp_path: Path, runtime: str, monkeypatch: pytest.MonkeyPatch, simulated: bool = False,
        **spec: Any) -> agent_container.Container:
    """A Container of job j1 on host h2, its job dir under ``tmp_path``'s state dir."""
    if simulated:
        monkeypatch.setenv("RIGDECK_SIM_GPUS", "4")
    else:
        monkeypatch.delenv("RIGDECK_SIM_GPUS", raising=False)
    job_dir = tmp_path / "state" / "jobs" / "j1"
    job_dir.mkdir(parents=True)
    return agent_container.Container({"image": "localhost/train:1", "runtime": runtime, **spec}, "j1", "h2",
                                     str(job_dir))


def options_of(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def test_docker_runs_one_container_with_the_hosts_namespaces_limits_gpus_and_paths(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    c = box(tmp_path, "docker", monkeypatch, mounts=["/data:/data:ro"], options=["--cap-add", "SYS_PTRACE"])
    argv = c.run_argv(PLAN, AGENT, [2, 0], 4242)
    assert argv[:6] == ["docker", "run", "--detach", "--rm", "--name", "rigdeck-j1-h2"], argv
    for flag in ("--network=host", "--ipc=host", "--pid=host", "--uts=host"):
        assert flag in argv
    assert options_of(argv, "--label") == ["rigdeck.job=j1"]
    assert options_of(argv, "--gpus") == ['"device=0,2"']  # Docker's form: the quotes keep the comma in
    assert "--device" not in argv or options_of(argv, "--device") == ["/dev/infiniband"]
    limits = dict(v.split("=", 1) for v in options_of(argv, "--ulimit"))
    soft, hard = (-1 if v == resource.RLIM_INFINITY else v for v in resource.getrlimit(resource.RLIMIT_NPROC))
    assert limits["nproc"] == f"{soft}:{hard}"  # the host's own: Podman's cap is Podman's
    assert set(limits) == {"nofile", "nproc", "memlock"}
    job_dir = str(tmp_path / "state" / "jobs" / "j1")
    assert options_of(argv, "--volume") == [f"{job_dir}:{job_dir}", "/srv/code:/srv/code",
                                            "/opt/rigdeck/agent.pyz:/opt/rigdeck/agent.pyz:ro", "/data:/data:ro"]
    assert argv[-9:] == ["--cap-add", "SYS_PTRACE", "--entrypoint", "python3", "localhost/train:1",
                         "/opt/rigdeck/agent.pyz", "hold", "--pid", "4242"], argv
    assert "--user" not in argv  # root here: the daemon's root is the job's
    # simulated GPUs: no device to pass
    sim = box(tmp_path / "sim", "docker", monkeypatch, simulated=True).run_argv(PLAN, AGENT, [0, 2], 1)
    assert "--gpus" not in sim


def test_docker_exec_passes_values_only_through_the_clients_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c = box(tmp_path, "docker", monkeypatch)
    env = {"PATH": "/usr/bin", "DOCKER_HOST": "unix:///x.sock", "RANK": "3", "SECRET": "a b; $(rm -rf /)",
           "CUDA_VISIBLE_DEVICES": "2,5"}
    argv = c.exec_argv(env, "/srv/code", ["python3", "w.py"], [5, 2])
    assert argv[:4] == ["docker", "exec", "--workdir", "/srv/code"]
    assert options_of(argv, "--env") == ["CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES", "RANK", "SECRET"]
    assert argv[-3:] == ["rigdeck-j1-h2", "python3", "w.py"]
    assert not any("a b;" in a or a.startswith("unix:") for a in argv), argv
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"  # renumbered: only the job's GPUs are inside
    assert env["DOCKER_HOST"] == "unix:///x.sock"  # the client's own, kept for it, not passed in


def test_a_docker_daemon_that_does_not_answer_is_named_before_anything_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require(shutil.which("docker") is not None, "no docker client (make test installs docker.io)")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")
    (problem,) = agent_container.check({"image": "localhost/train:1", "runtime": "docker"}, str(tmp_path))
    assert problem.startswith(f"the Docker daemon does not answer account root at unix://{tmp_path}/none.sock: "), \
        problem
    assert "usermod -aG docker root" in problem


def test_apptainer_runs_one_instance_of_an_image_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c = box(tmp_path, "apptainer", monkeypatch, image="/images/train.sif", mounts=["/data:/data:ro"])
    argv = c.run_argv(PLAN, AGENT, [1, 3], 77)
    assert argv[:4] == ["apptainer", "instance", "start", "--cleanenv"]
    assert "--nv" in argv and argv[-2:] == ["/images/train.sif", "rigdeck-j1-h2"]
    job_dir = str(tmp_path / "state" / "jobs" / "j1")
    assert options_of(argv, "--bind") == [f"{job_dir}:{job_dir}", "/srv/code:/srv/code",
                                          "/opt/rigdeck/agent.pyz:/opt/rigdeck/agent.pyz:ro", "/data:/data:ro"]
    env = {"PATH": "/usr/bin", "RANK": "1", "CUDA_VISIBLE_DEVICES": "3"}
    ex = c.exec_argv(env, "/srv/code", ["python3", "w.py"], [1, 3])
    assert ex == ["apptainer", "exec", "--cleanenv", "--pwd", "/srv/code", "instance://rigdeck-j1-h2", "python3",
                  "w.py"]
    # --nv shows every GPU of the host: CUDA keeps the host's numbers
    assert env["APPTAINERENV_RANK"] == "1" and env["APPTAINERENV_CUDA_VISIBLE_DEVICES"] == "3"
    assert "APPTAINERENV_PATH" not in env
    sim = box(tmp_path / "sim", "apptainer", monkeypatch, simulated=True, image="/i.sif").run_argv(PLAN, AGENT, [0], 1)
    assert "--nv" not in sim


def test_apptainer_needs_an_image_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    apptainer = tmp_path / "bin" / "apptainer"
    apptainer.parent.mkdir()
    apptainer.write_text("#!/bin/sh\nexit 0\n")  # on PATH only: nothing here runs it
    apptainer.chmod(0o755)
    monkeypatch.setenv("PATH", str(apptainer.parent))
    assert agent_container.check({"image": "localhost/train:1", "runtime": "apptainer"}, str(tmp_path)) == [
        "image localhost/train:1: apptainer runs an image file (a SIF file or a sandbox directory at an absolute "
        "path on the host), not a name"]
    assert agent_container.check({"image": "/nope/train.sif", "runtime": "apptainer"}, str(tmp_path)) == [
        "no image file /nope/train.sif here"]


def test_rootless_podman_needs_subordinate_ids_and_a_runtime_dir(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """As an account other than root (its uid, as the agent of a person's account runs)."""
    import pwd

    me = pwd.getpwnam("nobody")
    monkeypatch.setattr(agent_container.os, "geteuid", lambda: me.pw_uid)
    subuid, subgid = tmp_path / "subuid", tmp_path / "subgid"
    subuid.write_text("someone:100000:65536\nother:165536:65536\n")
    subgid.write_text(f"someone:100000:65536\n{me.pw_uid}:300000:65536\n")
    files = (str(subuid), str(subgid))
    got = agent_container.rootless_problems("podman", {}, files)
    assert got == [
        f"account nobody has no subordinate id range in {subuid}: rootless podman needs one for its user "
        "namespace (as root: `usermod --add-subuids 365536-431071 nobody`)",
        "account nobody: XDG_RUNTIME_DIR is not set: rootless podman keeps its runtime state there (a login "
        f"through systemd-logind makes /run/user/{me.pw_uid}; as root: `loginctl enable-linger nobody`, or give "
        "the agent XDG_RUNTIME_DIR, a directory of nobody's with mode 0700, in the inventory's env)"], got
    # a runtime dir that is not the account's own (root's, here) is named as such
    (xdg,) = agent_container.rootless_problems("podman", {"XDG_RUNTIME_DIR": str(tmp_path)},
                                               (str(subgid), str(subgid)))
    assert f"XDG_RUNTIME_DIR {tmp_path} is not a directory of its own (owner uid 0" in xdg, xdg
    # docker's and apptainer's accounts need nothing of this (a daemon that answers, or nothing)
    assert agent_container.rootless_problems("docker", {}, files) == []
    monkeypatch.setattr(agent_container.os, "geteuid", lambda: 0)
    assert agent_container.rootless_problems("podman", {}, files) == []


# -- on the test bed ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def image() -> str:
    """The test image (tests/containerimage.py): taken from the cache, or built there the first
    time on this machine (about 3 minutes), in this worker while the others run their files,
    rather than before the whole suite. ``make image`` does the same by hand."""
    require(shutil.which("podman") is not None, "podman is not installed (make test installs it)")
    require(shutil.which("mmdebstrap") is not None or containerimage.archive().is_file(),
            "mmdebstrap is not installed (make test installs it)")
    return containerimage.ensure()


def podman(cli: Cli, host: int, *args: str) -> subprocess.CompletedProcess[str]:
    """podman on bed host ``host`` with the agent's store there."""
    return cli.bed.exec(host, [*STORE_ENV, "podman", *args])


def engine(cli: Cli, host: int, runtime: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The runtime's client on bed host ``host`` as the agent there runs it: podman with the
    agent's store, docker with the host's own daemon (``docker_bed``)."""
    if runtime == "docker":
        return cli.bed.exec(host, ["env", f"DOCKER_HOST={DOCKER_HOST}", "docker", *args])
    return podman(cli, host, *args)


def containers(cli: Cli, job_id: str, runtime: str = "podman") -> dict[str, list[str]]:
    """Every container of the job, running or not, on each host (``ps -a`` there)."""
    out = {}
    for i, h in enumerate(cli.bed.hosts, start=1):
        r = engine(cli, i, runtime, "ps", "-a", "--filter", f"label=rigdeck.job={job_id}", "--format", "{{.Names}}")
        assert r.returncode == 0, r.stderr
        out[h.name] = r.stdout.split()
    return out


def none_left(cli: Cli, job_id: str, runtime: str = "podman") -> None:
    """No container and no process of the ended job on any host within 30 s: its job host
    records the end, then removes its containers and exits, so a status that reads ended may
    come a moment before."""
    empty: dict[str, list[str]] = {h.name: [] for h in cli.bed.hosts}
    wait_until(lambda: containers(cli, job_id, runtime) == empty, 30, f"no container of {job_id} left")
    wait_until(lambda: tagged(cli.bed, job_id) == empty, 30, f"no process of {job_id} left")


def ddp_spec(cli: Cli, image: str, steps: int, nodes: int = 3, runtime: str = "podman") -> Path:
    return cli.spec("ddpc", f"""
command = ["{{python}}", "train.py", "--steps", "{steps}", "--checkpoint-every", "10", "--seed", "0"]
workdir = "{EXAMPLES / 'ddp'}"
launcher = "torchrun"
nodes = {nodes}
processes_per_node = 2
[env]
OMP_NUM_THREADS = "1"
[checkpoint]
dir = "/tmp/rigdeck-checkpoints/{{job_id}}"
owner = "rank0"
[log]
loss_pattern = 'loss[=:]\\s*([0-9.eE+-]+)'
[container]
image = "{image}"
runtime = "{runtime}"
""")


def running_ranks(cli: Cli, job_id: str, n: int) -> list[int]:
    """The host pids of the job's ``n`` ranks once all run, asked every 2 s (each look is a
    rigdeck process: on 2 cores, asking more often slows the ranks' start it waits for)."""
    def pids() -> list[int]:
        got = [r["pid"] for r in cli.json("status", job_id)["ranks"] if r.get("pid") and r.get("state") == "running"]
        return got if len(got) == n else []
    return wait_until(pids, 180, f"{n} running ranks of {job_id}", step=2.0)


def ended(cli: Cli, job_id: str, timeout: float = 240) -> dict[str, Any]:
    """The job's status once it ended (each look through ``status`` supervises it too)."""
    def done() -> dict[str, Any] | None:
        st = cli.json("status", job_id)
        return st if st["state"] in ("succeeded", "failed", "stopped") else None
    return wait_until(done, timeout, f"{job_id} to end", step=2.0)


def inside_view(cli: Cli, host: int, job_id: str, pids: list[int], runtime: str = "podman") -> dict[str, Any]:
    """What host ``host`` shows of the job's container and of its ranks ``pids``: the
    container's id and pid, each rank's cgroup line and ancestry (names up to the host's init)."""
    (name,) = containers(cli, job_id, runtime)[cli.bed.hosts[host - 1].name]
    info = json.loads(engine(cli, host, runtime, "inspect", name).stdout)[0]
    ps = cli.bed.exec(host, ["ps", "-e", "-o", "pid=,ppid=,comm="]).stdout.split("\n")
    parent = {int(p[0]): (int(p[1]), p[2]) for p in (ln.split(None, 2) for ln in ps) if len(p) == 3}
    ranks = {}
    for pid in pids:
        chain, p = [], pid
        while p in parent and p > 1:
            p, comm = parent[p][0], parent.get(parent[p][0], (0, "?"))[1]
            chain.append(comm)
        cgroup = cli.bed.exec(host, ["cat", f"/proc/{pid}/cgroup"]).stdout
        env = cli.bed.exec(host, ["cat", f"/proc/{pid}/environ"]).stdout.split("\0")
        ranks[pid] = {"ancestors": chain, "in_container": info["Id"] in cgroup,
                      "env": dict(e.split("=", 1) for e in env if "=" in e)}
    return {"name": name, "id": info["Id"], "pid": info["State"]["Pid"], "ranks": ranks}


@pytest.mark.testbed
@pytest.mark.cli_options(timeout=240)
async def app_shows(cli: Cli, job_id: str, keymap: Path) -> tuple[str, str]:
    """The app on the bed's inventory (in process, as `make run` opens it), the job opened: what
    the Job view's head and the Checkpoints view's head say."""
    from tests.kit.pilot import static_words, until
    from tui.app.shell import RigdeckApp
    from tui.client import InProcessClient
    from tui.remote.inventoryfile import load_inventory

    app = RigdeckApp(InProcessClient(load_inventory(cli.inventory)), keymap_file=keymap)
    async with app.run_test(size=(160, 48)) as pilot:
        app.select_job(job_id)
        await pilot.press("4")
        await until(pilot, lambda: "step 29" in static_words(app, "#job-head"), 60)
        job = static_words(app, "#job-head")
        await pilot.press("5")
        await until(pilot, lambda: "last complete" in static_words(app, "#ckpt-head"), 30)
        return job, static_words(app, "#ckpt-head")


def test_ddp_example_runs_in_one_container_per_host(cli: Cli, image: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The ddp example (torchrun) across 3 hosts in containers: each host's ranks in its one
    container, seeing the job's cluster files and the host's /dev/shm; loss, steps and the
    checkpoint owner come back as without a container, in `rigdeck status` and in the app;
    nothing is left after."""
    job_id = cli.json("launch", str(ddp_spec(cli, image, 30)))["job_id"]
    pids = running_ranks(cli, job_id, 6)
    by_host = {h: [r["pid"] for r in cli.json("status", job_id)["ranks"] if r["host"] == h] for h in HOSTS}
    assert sorted(len(v) for v in by_host.values()) == [2, 2, 2], by_host
    marker = f"/dev/shm/rdk-container-{job_id}"
    for i, h in enumerate(HOSTS, start=1):
        view = inside_view(cli, i, job_id, by_host[h])
        for pid, rank in view["ranks"].items():
            # in the container's cgroup, under conmon (podman's monitor), not under sshd
            assert rank["in_container"] and "conmon" in rank["ancestors"], (h, pid, rank["ancestors"])
            # the cluster files, as the rank itself sees them (its root is the container's)
            base = rank["env"]["SAGEMAKER_BASE_DIR"]
            seen = cli.bed.exec(i, ["cat", f"/proc/{pid}/root{base}/input/config/resourceconfig.json"])
            assert json.loads(seen.stdout)["current_host"] == h, seen
            assert rank["env"]["RIGDECK_JOB_ID"] == job_id and rank["env"]["WORLD_SIZE"] == "6"
        # /dev/shm inside is the host's own: a file written on the host is there
        cli.bed.exec(i, ["sh", "-c", f"echo {h} > {marker}"])
        try:
            got = podman(cli, i, "exec", view["name"], "cat", marker)
            assert got.stdout.strip() == h, got
        finally:
            cli.bed.exec(i, ["rm", "-f", marker])
    assert len(pids) == 6
    st = ended(cli, job_id)
    assert st["state"] == "succeeded", json.dumps(st, indent=1)[-3000:]
    assert st["last_step"] == 29 and st["last_loss"] is not None
    text = cli.run("status", job_id).stdout
    assert "progress step 29 loss" in text and "checkpoint owner h1 rank 0, step " in text, text
    monkeypatch.setenv("RIGDECK_HOME", cli.env["RIGDECK_HOME"])
    job, ckpt = asyncio.run(app_shows(cli, job_id, tmp_path / "keys.toml"))
    assert "succeeded" in job and "step 29 · loss " in job, job
    assert re.search(r"last complete: step \d+ by h1(/gpu\d+ sim)? r0 ", ckpt), ckpt  # the bed's GPUs: simulated
    print("app, Job view:", job, "\napp, Checkpoints view:", ckpt, sep="\n")
    metrics = cli.json("metrics", job_id)
    assert {m["rank"] for m in metrics if m.get("loss") is not None and m.get("event") is None} == set(range(6))
    owners = {(m["owner"]["rank"], m["owner"]["host"]) for m in metrics
              if m.get("event") == "checkpoint" and m.get("status") == "done"}
    assert owners == {(0, "h1")}, owners
    none_left(cli, job_id)


@pytest.mark.testbed
@pytest.mark.cli_options(timeout=240)
def test_stop_and_a_killed_rank_leave_no_container_and_no_process(cli: Cli, image: str) -> None:
    """`rigdeck stop` mid-run removes every host's container; a rank killed inside its container
    stops the gang as it does without one, naming the rank; a job host killed outright leaves no
    container either. (The stdlib ticker, direct launcher:
    what is shown here needs no torch.)"""
    spec = cli.spec("tickc", f'command = ["{{python}}", "ticker.py", "--steps", "100000", "--sleep", "0.2"]\n'
                    f'workdir = "{JOBSCRIPTS}"\nlauncher = "direct"\nnodes = 3\nprocesses_per_node = 2\n'
                    f'[container]\nimage = "{image}"\n')
    job_id = cli.json("launch", str(spec))["job_id"]
    running_ranks(cli, job_id, 6)
    assert all(len(v) == 1 for v in containers(cli, job_id).values())
    stopped = cli.json("stop", job_id, "--grace", "2")
    assert stopped["state"] == "stopped", stopped
    wait_until(lambda: containers(cli, job_id) == {h: [] for h in HOSTS}, 30, "no container left")
    assert tagged(cli.bed, job_id) == {h: [] for h in HOSTS}

    job_id = cli.json("launch", str(spec))["job_id"]
    running_ranks(cli, job_id, 6)
    (rank3,) = [r for r in cli.json("status", job_id)["ranks"] if r["rank"] == 3]
    # the training process itself (the wrapper's child), killed from the host: it runs in the
    # container, in the host's PID namespace
    child = cli.bed.exec(2, ["pgrep", "-P", str(rank3["pid"])]).stdout.split()
    target = int(child[0]) if child else rank3["pid"]
    cli.bed.exec(2, ["kill", "-9", str(target)])
    st = ended(cli, job_id)
    assert st["state"] == "failed", json.dumps(st, indent=1)[-3000:]
    assert st["cause"]["rank"] == 3 and st["cause"]["host"] == "h2", st["cause"]
    none_left(cli, job_id)

    # The job host itself killed outright: its agent stops what it left, the container too.
    job_id = cli.json("launch", str(spec))["job_id"]
    running_ranks(cli, job_id, 6)
    state = json.loads((cli.bed.hosts[1].state_dir / "jobs" / job_id / "state.json").read_text())
    cli.bed.exec(2, ["kill", "-9", str(state["jobhost_pid"])])
    st = ended(cli, job_id)
    assert st["state"] == "failed" and st["cause"]["host"] == "h2" and st["cause"]["signal"] == 9, st["cause"]
    none_left(cli, job_id)


@pytest.mark.testbed
def test_a_missing_image_or_runtime_is_refused_before_anything_starts(cli: Cli, image: str) -> None:
    """Refused by every host's check, naming the host and what it lacks; no job directory, no
    process, no container anywhere."""
    missing = cli.spec("noimage", f'command = ["{{python}}", "x.py"]\nworkdir = "{EXAMPLES / "ddp"}"\n'
                       'nodes = 3\nprocesses_per_node = 1\n[container]\nimage = "localhost/rigdeck-nope:0"\n')
    r = cli.run("launch", str(missing), check=False)
    assert r.returncode != 0
    for h in HOSTS:
        assert f"{h}: image localhost/rigdeck-nope:0 is not in podman's image store here" in r.stderr, r.stderr
    assert "nothing was started" in r.stderr
    # An archive only one host has (each bed host has its own /root/.rigdeck): the others are named.
    h1_only = cli.bed.hosts[0].state_dir / "image.tar"
    h1_only.write_bytes(b"not an image")
    try:
        arch = cli.spec("noarchive", f'command = ["{{python}}", "x.py"]\nworkdir = "{EXAMPLES / "ddp"}"\n'
                        'nodes = 3\nprocesses_per_node = 1\n[container]\nimage = "/root/.rigdeck/image.tar"\n')
        r = cli.run("launch", str(arch), check=False)
    finally:
        h1_only.unlink()
    assert r.returncode != 0
    assert "h2: no image archive /root/.rigdeck/image.tar here" in r.stderr, r.stderr
    assert "h3: no image archive" in r.stderr and "h1: no image archive" not in r.stderr, r.stderr
    absent = cli.spec("noruntime", f'command = ["{{python}}", "x.py"]\nworkdir = "{EXAMPLES / "ddp"}"\n'
                      'nodes = 3\nprocesses_per_node = 1\n[container]\nimage = "/images/train.sif"\n'
                      'runtime = "apptainer"\n')
    r = cli.run("launch", str(absent), check=False)
    assert r.returncode != 0
    for h in HOSTS:
        assert f"{h}: no apptainer here (container runtimes found: podman" in r.stderr, r.stderr
    for i in range(1, 4):
        jobs = cli.bed.exec(i, ["sh", "-c", "ls /root/.rigdeck/jobs 2>/dev/null | "
                                            "grep -E '^no(image|archive|runtime)' || true"])
        assert jobs.stdout.strip() == "", jobs.stdout


@pytest.mark.testbed
def test_image_push_ships_layers_by_content_and_skips_hosts_that_have_it(cli: Cli, tmp_path: Path) -> None:
    """`rigdeck image push` (tui.control.images) from a workstation store of its own (the bed's hosts share this
    machine's store, which the workstation must not be): each host is sent the image's layers
    once; an image that shares its layer with one pushed before costs only its config; a host
    whose agent has the image is skipped."""
    require(shutil.which("podman") is not None, "podman is not installed (make test installs it)")
    conf = tmp_path / "storage.conf"
    conf.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{tmp_path}/storage"\nrunroot = "{tmp_path}/run"\n')
    ws = {**cli.env, "CONTAINERS_STORAGE_CONF": str(conf)}
    cli.env = ws
    root = tmp_path / "rootfs"
    root.mkdir()
    (root / "payload").write_bytes(os.urandom(2 << 20))  # 2 MB that no compression makes smaller
    subprocess.run(["tar", "-C", str(root), "-cf", str(tmp_path / "rootfs.tar"), "."], check=True)
    tag = f"localhost/rigdeck-push-{tmp_path.name.lower().replace('_', '-')}"
    first, second = f"{tag}:1", f"{tag}:2"
    subprocess.run(["podman", "import", "-q", str(tmp_path / "rootfs.tar"), first], env=ws, check=True,
                   capture_output=True)
    subprocess.run(["podman", "import", "-q", "--change", "CMD=/payload", str(tmp_path / "rootfs.tar"), second],
                   env=ws, check=True, capture_output=True)
    try:
        got = {r["host"]: r for r in cli.json("image", "push", first, "h1", "h2")}
        assert set(got) == {"h1", "h2"} and not any(r["error"] or r["skipped"] for r in got.values()), got
        assert all(set(r) == set(ImagePush("h").to_json()) for r in got.values())
        assert all(r["bytes_sent"] > 2_000_000 for r in got.values()), got  # the layer, to each host
        for i in (1, 2):
            assert podman(cli, i, "image", "exists", first).returncode == 0
        (h1,) = cli.json("hosts", "h1")
        assert "podman" in h1["containers"]["runtimes"] and first in h1["containers"]["images"], h1["containers"]
        assert "h1 images: " in cli.run("hosts", "h1").stdout
        again = {r["host"]: r for r in cli.json("image", "push", first)}
        # h3 shares the bed's one image store with h1 and h2: its agent has the image too
        assert all(r["skipped"] and not r["error"] for r in again.values()), again
        layered = {r["host"]: r for r in cli.json("image", "push", second, "h1")}
        assert 0 < layered["h1"]["bytes_sent"] < 100_000, layered  # the config, not the layer again
        assert podman(cli, 1, "image", "exists", second).returncode == 0
    finally:
        for name in (first, second):
            subprocess.run(["podman", "rmi", "--force", "--ignore", name], capture_output=True)
            subprocess.run(["podman", "rmi", "--force", "--ignore", name], env=ws, capture_output=True)
