"""``[container]`` jobs with Docker, and a person's rootless refusal, on a bed of their own
(2 hosts, each with a Docker daemon of its own, and the account rdk-alice): apart from
tests/test_container.py so that xdist hands the two files to different workers."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import containerimage
from tests._require import require
from tests.kit import JOBSCRIPTS, wait_until
from tests.kit.bedcli import Cli
from tests.test_container import (
    ALICE,
    DOCKER_DIR,
    DOCKER_HOST,
    containers,
    ddp_spec,
    ended,
    engine,
    inside_view,
    none_left,
    running_ranks,
)
from tests.testbed import PERSON_PYTHON, TestBed, TestBedError

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def image() -> str:
    """The test image (tests/containerimage.py), from its cache (built there the first time)."""
    require(shutil.which("podman") is not None, "podman is not installed (make test installs it)")
    require(shutil.which("mmdebstrap") is not None or containerimage.archive().is_file(),
            "mmdebstrap is not installed (make test installs it)")
    return containerimage.ensure()


# -- Docker, and a person's account, on a bed of their own -------------------------------------

def _dockerd(bed: TestBed, i: int) -> subprocess.Popen[bytes]:
    """A Docker daemon of host ``i``'s own, in its namespaces (so ``--network=host`` and
    ``--pid=host`` are that host's), its data, run state and socket under the agent's state dir
    there: hosts that share this machine's file system never share a daemon."""
    h = bed.hosts[i - 1]
    (h.state_dir / "docker").mkdir(mode=0o700, exist_ok=True)
    log = open(h.host_dir / "dockerd.log", "ab")
    try:
        return bed.popen(i, ["dockerd", "--data-root", f"{DOCKER_DIR}/data", "--exec-root", f"{DOCKER_DIR}/run",
                             "--host", DOCKER_HOST, "--pidfile", f"{DOCKER_DIR}/dockerd.pid",
                             "--iptables=false", "--ip6tables=false", "--bridge=none"],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    finally:
        log.close()


def _stop_dockerd(bed: TestBed, i: int, proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the daemon (it stops its containerd and unmounts its layers), else SIGKILL."""
    pid = (bed.hosts[i - 1].state_dir / "docker" / "dockerd.pid").read_text().strip() \
        if (bed.hosts[i - 1].state_dir / "docker" / "dockerd.pid").exists() else ""
    if pid:
        bed.exec(i, ["kill", pid])
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="module")
def bed(image: str) -> Iterator[TestBed]:
    """Two hosts (2 simulated GPUs each) and a person, rdk-alice. Each host runs a Docker daemon
    of its own (``_dockerd``) with the test image loaded (``docker load`` of the archive
    tests/containerimage.py built); the agents find it through DOCKER_HOST."""
    require(shutil.which("dockerd") is not None, "dockerd is not installed (make test installs docker.io)")
    b = TestBed(2, sim_gpus=2, people=(ALICE,))
    try:
        b.up()
    except TestBedError as e:
        pytest.fail(f"test bed did not come up: {e}", pytrace=False)
    daemons: dict[int, subprocess.Popen[bytes]] = {}
    try:
        for i in (1, 2):
            daemons[i] = _dockerd(b, i)
        def answer(i: int) -> bool:
            return b.exec(i, ["env", f"DOCKER_HOST={DOCKER_HOST}", "docker", "info"]).returncode == 0

        wait_until(lambda: answer(1) and answer(2), 60, "each host's dockerd to answer")
        loads = [b.popen(i, ["env", f"DOCKER_HOST={DOCKER_HOST}", "docker", "load", "-q", "-i",
                             str(containerimage.archive())], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                 for i in (1, 2)]
        for p in loads:
            out, _ = p.communicate(timeout=600)
            assert p.returncode == 0 and image in out.decode(), out
        yield b
    finally:
        for i, proc in daemons.items():
            _stop_dockerd(b, i, proc)
        b.down()


@pytest.mark.cli_options(timeout=240)
def test_ddp_example_runs_in_one_docker_container_per_host(bed: TestBed, image: str, tmp_path: Path) -> None:
    """The ddp example (torchrun) across 2 hosts in Docker containers, each host's daemon its
    own: each host's ranks in its one container (its cgroup, under containerd's shim), seeing the
    job's cluster files and the host's /dev/shm; loss, steps and the checkpoint owner as without
    a container; nothing left after. Then a job host killed outright: no container anywhere."""
    cli = Cli(bed, tmp_path, timeout=240, env={"DOCKER_HOST": DOCKER_HOST})
    job_id = cli.json("launch", str(ddp_spec(cli, image, 20, nodes=2, runtime="docker")))["job_id"]
    running_ranks(cli, job_id, 4)
    hosts = ("h1", "h2")
    by_host = {h: [r["pid"] for r in cli.json("status", job_id)["ranks"] if r["host"] == h] for h in hosts}
    marker = f"/dev/shm/rdk-docker-{job_id}"
    for i, h in enumerate(hosts, start=1):
        view = inside_view(cli, i, job_id, by_host[h], runtime="docker")
        assert view["name"] == f"rigdeck-{job_id}-{h}"
        for pid, rank in view["ranks"].items():
            assert rank["in_container"] and "containerd-shim" in rank["ancestors"], (h, pid, rank["ancestors"])
            base = rank["env"]["SAGEMAKER_BASE_DIR"]
            seen = cli.bed.exec(i, ["cat", f"/proc/{pid}/root{base}/input/config/resourceconfig.json"])
            assert json.loads(seen.stdout)["current_host"] == h, seen
            assert rank["env"]["RIGDECK_JOB_ID"] == job_id and rank["env"]["WORLD_SIZE"] == "4"
            assert "DOCKER_HOST" not in rank["env"]  # the client's setting, not the job's
        cli.bed.exec(i, ["sh", "-c", f"echo {h} > {marker}"])
        try:
            got = engine(cli, i, "docker", "exec", view["name"], "cat", marker)
            assert got.stdout.strip() == h, got
        finally:
            cli.bed.exec(i, ["rm", "-f", marker])
    st = ended(cli, job_id)
    assert st["state"] == "succeeded", json.dumps(st, indent=1)[-3000:]
    assert st["last_step"] == 19 and st["last_loss"] is not None
    metrics = cli.json("metrics", job_id)
    assert {m["rank"] for m in metrics if m.get("loss") is not None and m.get("event") is None} == set(range(4))
    assert {(m["owner"]["rank"], m["owner"]["host"]) for m in metrics
            if m.get("event") == "checkpoint" and m.get("status") == "done"} == {(0, "h1")}
    none_left(cli, job_id, "docker")

    # h2's job host killed outright: its container's `agent hold` ends with it (docker's --rm
    # removes it), h2's agent sweeps the rest, and h1's job host removes its own at the stop.
    spec = cli.spec("tickd", f'command = ["{{python}}", "ticker.py", "--steps", "100000", "--sleep", "0.2"]\n'
                    f'workdir = "{JOBSCRIPTS}"\nlauncher = "direct"\nnodes = 2\nprocesses_per_node = 1\n'
                    f'[container]\nimage = "{image}"\nruntime = "docker"\n')
    job_id = cli.json("launch", str(spec))["job_id"]
    running_ranks(cli, job_id, 2)
    assert all(len(v) == 1 for v in containers(cli, job_id, "docker").values())
    state = json.loads((bed.hosts[1].state_dir / "jobs" / job_id / "state.json").read_text())
    assert state["container"]["runtime"] == "docker", state["container"]
    cli.bed.exec(2, ["kill", "-9", str(state["jobhost_pid"])])
    st = ended(cli, job_id)
    assert st["state"] == "failed" and st["cause"]["host"] == "h2", st["cause"]
    none_left(cli, job_id, "docker")


def test_a_person_without_what_rootless_podman_needs_is_refused_before_anything_starts(
        bed: TestBed, tmp_path: Path) -> None:
    """rdk-alice's agent runs as her own account, whose SSH login (no PAM, no logind) has no
    XDG_RUNTIME_DIR; on h2 /etc/subuid and /etc/subgid give her no range (a copy without her,
    mounted there only). Her [container] job is refused by both hosts' checks, each naming her
    account, what it lacks and the command that gives it; nothing starts."""
    alice = Cli(bed, tmp_path / ALICE, user=ALICE, identity_file=str(bed.person_key(ALICE)), python=PERSON_PYTHON)
    spec = alice.spec("rootless", 'command = ["{python}", "x.py"]\nworkdir = "/tmp"\nnodes = 2\n'
                      'processes_per_node = 1\n[container]\nimage = "localhost/train:1"\n')
    copies = []
    for name in ("subuid", "subgid"):
        copy = bed.share_dir / f"{name}-without-alice"
        copy.write_text("".join(ln for ln in Path(f"/etc/{name}").read_text().splitlines(keepends=True)
                                if not ln.startswith(f"{ALICE}:")))
        copy.chmod(0o644)
        copies.append((copy, f"/etc/{name}"))
    for copy, target in copies:
        assert bed.exec(2, ["mount", "--bind", str(copy), target]).returncode == 0
    try:
        r = alice.run("launch", str(spec), check=False)
    finally:
        for _, target in copies:
            bed.exec(2, ["umount", target])
    assert r.returncode != 0 and "nothing was started" in r.stderr, r.stderr
    for h in ("h1", "h2"):
        assert (f"{h}: account {ALICE}: XDG_RUNTIME_DIR is not set: rootless podman keeps its runtime state there"
                in r.stderr), r.stderr
        assert f"`loginctl enable-linger {ALICE}`" in r.stderr
    assert re.search(rf"h2: account {ALICE} has no subordinate id range in /etc/subuid and /etc/subgid: rootless "
                     rf"podman needs one for its user namespace \(as root: `usermod --add-subuids (\d+)-\d+ "
                     rf"--add-subgids \1-\d+ {ALICE}`\)", r.stderr), r.stderr
    assert f"h1: account {ALICE} has no subordinate" not in r.stderr  # h1's files give her a range
    for host in bed.hosts:
        jobs = host.person_state_dir(ALICE) / "jobs"
        assert not (jobs.is_dir() and [d for d in os.listdir(jobs) if d.startswith("rootless")]), os.listdir(jobs)
