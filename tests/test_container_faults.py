"""A ``[container]`` job whose container lost its GPUs is told apart from a failing GPU.

After a reload of the container runtime a running container can lose its GPU devices: inside,
NVML fails ("Failed to initialize NVML: Unknown Error") while the host reaches the same GPUs as
before. The job host marks a rank's device-access error (agent/jobhost.py), the agent judges it
against its own telemetry (agent/gpuhealth.py ``container_fault``, in ``job_status``) and the
controller records a ``container`` incident: nothing drained, the restart makes a new container.
When the host sees the GPU failing too, it is the GPU's fault, drained as before.

On the test bed the GPUs are simulated, and so is the container's loss of them: heal_train's
``--container-devices`` is a test device, a directory mounted into the container only, whose
``attempt-N/nvidia<g>`` files stand for the device nodes the container of attempt N was given.
Removing one is the container losing that GPU; the host's view of the GPU is the agent's
simulated faults file, as in tests/test_healing_gpu.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from agent import gpuhealth
from agent.jobhost import JobHost
from tests import containerimage
from tests._require import require
from tests.kit import ROOT, wait_until
from tests.kit.bedcli import Cli
from tests.kit.healing import TRAIN, gpu_report, host_index, write_faults
from tui.control.jobs import first_cause
from tui.model.health import Incident, failure_kind
from tui.model.jobtext import incident_text

NVML_TAIL = ["Traceback (most recent call last):", '  File "train.py", line 9, in <module>',
             "RuntimeError: Failed to initialize NVML: Unknown Error"]


# -- the rules, on this machine ----------------------------------------------------------------

def test_device_access_errors_are_told_from_a_gpu_that_faulted_under_a_kernel() -> None:
    assert gpuhealth.device_error(NVML_TAIL) == "NVML unknown error"
    assert gpuhealth.device_error(["RuntimeError: No CUDA GPUs are available"]) == "no CUDA GPUs available"
    assert gpuhealth.device_error("CUDA error: no CUDA-capable device is detected") == "no CUDA-capable device"
    # what XID 79 does to a running kernel is the GPU's own fault, not a lost device
    assert gpuhealth.device_error(["RuntimeError: CUDA error: unspecified launch failure"]) is None
    assert gpuhealth.device_error(["loss 0.5", None, 3, {"x": 1}]) is None
    assert gpuhealth.device_error(None) is None and gpuhealth.device_error(7) is None


def _cause(**kw: Any) -> dict[str, Any]:
    return {"rank": 1, "host": "h1", "exit_code": 1, "signal": None, "tail": NVML_TAIL,
            "device_error": "NVML unknown error", "gpus": [1], **kw}


def test_a_lost_device_the_host_sees_healthy_is_the_containers_fault() -> None:
    read = {0: True, 1: True, 2: True, 3: True}  # the host's telemetry read all four (simulated)
    got = gpuhealth.container_fault(_cause(), [{"index": 3, "health": "warn", "reason": "throttled"}], read, "h1")
    assert got is not None
    assert got["kind"] == "container" and got["gpu"] == 1 and got["rank"] == 1 and got["tail"] == NVML_TAIL
    assert got["message"] == ("h1: container lost its GPUs: NVML unknown error inside (rank 1 exited 1), "
                              "GPU 1 (simulated) healthy on the host")
    real = gpuhealth.container_fault(_cause(gpus=[0, 2], signal=6, exit_code=None), [], {0: False, 2: False}, "h2")
    assert real is not None and real["message"] == (
        "h2: container lost its GPUs: NVML unknown error inside (rank 1 killed by signal 6), GPUs 0, 2 healthy "
        "on the host")


def test_a_lost_device_the_host_sees_failing_or_cannot_read_stays_the_gpus() -> None:
    read = {0: True, 1: True}
    xid = [{"index": 1, "health": "unhealthy", "reason": "XID 79: GPU has fallen off the bus", "simulated": True}]
    assert gpuhealth.container_fault(_cause(), xid, read, "h1") is None
    assert gpuhealth.container_fault(_cause(), [], {}, "h1") is None  # the host's sample failed: nothing known
    assert gpuhealth.container_fault(_cause(gpus=[5]), [], read, "h1") is None  # not a GPU the host read
    # not a device error, or not one the job host marked: an exit as before
    assert gpuhealth.container_fault({"rank": 1, "exit_code": 1, "tail": NVML_TAIL}, [], read, "h1") is None
    assert gpuhealth.container_fault(_cause(kind="gpu"), [], read, "h1") is None


@pytest.mark.parametrize("cause", [None, "text", 3, [], {"device_error": "x", "gpus": 1},
                                   {"device_error": "x", "gpus": ["1", None, True]},
                                   {"device_error": "x", "gpus": [1], "kind": ["list"]}])
def test_a_malformed_cause_is_no_container_fault_and_no_error(cause: Any) -> None:
    assert gpuhealth.container_fault(cause, [{"index": [1]}, "x", None], {1: True}, "h1") is None
    assert gpuhealth.container_fault(cause, "not a list", {1: True}, "h1") is None


@pytest.mark.parametrize(("health", "kind"), [("ok", "container"), ("unhealthy", None)])
def test_the_agents_job_status_judges_a_lost_device_by_its_own_sample(
        tmp_path: Path, health: str, kind: str | None) -> None:
    """The daemon's ``job_status`` of a failed container job whose cause its job host marked: the
    GPU read healthy in the agent's own sample makes it the container's; read unhealthy (an
    XID 79), the cause is left as the job host wrote it, for the controller's GPU fault."""
    import asyncio

    from agent.daemon import Daemon

    state = tmp_path / "state"
    (state / "jobs" / "j1").mkdir(parents=True)
    cause = _cause(host="h1")
    (state / "jobs" / "j1" / "state.json").write_text(json.dumps(
        {"job_id": "j1", "host": "h1", "state": "failed", "cause": cause, "restart_count": 0}))
    d = Daemon(str(state))
    gpus = [{"index": 0, "health": "ok", "simulated": True},
            {"index": 1, "health": health, "health_reason": "XID 79: GPU has fallen off the bus" if health != "ok"
             else None, "simulated": True}]

    async def sample() -> dict[str, Any]:
        return {"gpus": gpus}

    d._collect = sample  # type: ignore[method-assign]
    got = asyncio.run(d._m_job_status(None, {"job_id": "j1"}))  # type: ignore[arg-type]
    assert got["cause"].get("kind") == kind, got["cause"]
    if kind is None:
        assert got["cause"] == cause and got["gpu_health"][0]["index"] == 1
    else:
        assert got["cause"]["message"].endswith("GPU 1 (simulated) healthy on the host")


def _job_dir(tmp_path: Path, container: bool) -> Path:
    d = tmp_path / "state" / "jobs" / "j1"
    (d / "ranks").mkdir(parents=True)
    plan = {"job_id": "j1", "node_index": 0, "launcher": "direct", "command": ["python3", "t.py"],
            "master_addr": "127.0.0.1", "master_port": 29500, "workdir": str(tmp_path),
            "nodes": [{"host": "h1", "slots": 2, "gpus": [2, 3]}]}
    if container:
        plan["container"] = {"image": "localhost/train:1"}
    (d / "plan.json").write_text(json.dumps(plan))
    for rank, gpu, ended, tail in ((0, 2, 10.0, ["RuntimeError: Connection closed by peer"]), (1, 3, 10.2, NVML_TAIL)):
        (d / "ranks" / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "gpu": gpu, "pid": 1}))
        (d / "ranks" / f"rank-{rank}.exit.json").write_text(json.dumps(
            {"rank": rank, "exit_code": 1, "signal": None, "ended": ended, "tail": tail}))
    return d


def test_the_job_host_names_the_rank_that_lost_its_device_and_its_gpu(tmp_path: Path) -> None:
    """Rank 0's collective broke first (its peer was gone), rank 1 could not reach its GPU: in a
    container job rank 1 is the cause, marked with its error and GPU for the agent to judge;
    without a container nothing changes (the first rank to fail, no mark)."""
    jh = JobHost(str(_job_dir(tmp_path, container=True)))
    cause = jh.first_failure(jh.rank_exits())
    assert cause is not None
    assert (cause["rank"], cause["device_error"], cause["gpus"]) == (1, "NVML unknown error", [3]), cause
    plain = JobHost(str(_job_dir(tmp_path / "plain", container=False)))
    cause = plain.first_failure(plain.rank_exits())
    assert cause is not None and cause["rank"] == 0 and "device_error" not in cause, cause


def test_the_controller_takes_a_container_fault_for_the_cause_and_its_incident_kind() -> None:
    lost = gpuhealth.container_fault(_cause(), [], {1: True}, "h2")
    assert lost is not None
    peer = {"rank": 0, "host": "h1", "exit_code": 1, "message": "rank 0 exited 1"}
    states = {"h1": {"state": "failed", "ended": 100.0, "cause": peer},
              "h2": {"state": "failed", "ended": 100.4, "cause": lost}}
    assert first_cause(states) == lost
    assert failure_kind(lost) == "container" and failure_kind(peer) == "exit"
    inc = Incident(kind=failure_kind(lost), detected_at=100.0, message=lost["message"], host="h2", gpu=1, rank=1)
    assert incident_text(inc).startswith("container host h2 GPU 1 rank 1: not resumed — h2: container lost its GPUs")


async def test_the_job_view_shows_a_container_incident_as_the_containers() -> None:
    """The Job view's incidents panel (recorded data, tests/ui_fixtures.py's healing job) with the
    incident a container that lost its GPU leaves: its kind, where, and the host's word on the GPU."""
    from dataclasses import replace

    from textual.widgets import Static

    from tests.kit.pilot import static_text, until
    from tests.ui_fixtures import JOB, healing_incident, healing_jobs, healing_state, recorded_app

    message = ("h1: container lost its GPUs: NVML unknown error inside (rank 1 exited 1), "
               "GPU 1 (simulated) healthy on the host")
    jobs = healing_jobs()
    jobs._tracks[JOB].incidents = (replace(healing_incident(), kind="container", rank=1, message=message),)
    app = recorded_app(state=healing_state(), jobs=jobs)
    async with app.run_test(size=(160, 36)) as pilot:
        await pilot.press("4")
        box = app.query_one("#job-incidents", Static)
        await until(pilot, lambda: box.display)
        text = " ".join(static_text(app, "#job-incidents").split())
    assert text.startswith("incident container host h1 GPU 1 rank 1 after step "), text
    assert text.endswith(f"— {message}"), text


# -- on the test bed -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def image() -> str:
    """The test image (tests/containerimage.py), as tests/test_container.py's fixture has it."""
    require(shutil.which("podman") is not None, "podman is not installed (make test installs it)")
    require(shutil.which("mmdebstrap") is not None or containerimage.archive().is_file(),
            "mmdebstrap is not installed (make test installs it)")
    return containerimage.ensure()


DEVICES_INSIDE = "/run/rigdeck-sim-gpu-devices"  # where the container sees the simulated device nodes


def _devices(tmp_path: Path) -> Path:
    """The simulated device nodes of the job's containers: every GPU, for attempts 0 and 1."""
    devices = tmp_path / "devices"
    for attempt in (0, 1):
        (devices / f"attempt-{attempt}").mkdir(parents=True)
        for g in range(4):
            (devices / f"attempt-{attempt}" / f"nvidia{g}").write_text("simulated device node\n")
    return devices


def _spec(cli: Cli, image: str, tmp_path: Path, name: str) -> Path:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    devices = _devices(tmp_path)
    return cli.spec(name, f"""
command = ["{{python}}", "{TRAIN}", "--steps", "12", "--ckpt", "{ckpt}", "--sleep", "0.1",
           "--container-devices", "{DEVICES_INSIDE}", "--first-attempt-holds"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 1
gpus_per_node = 2
[env]
OMP_NUM_THREADS = "1"
[restart]
max_restarts = 1
[container]
image = "{image}"
mounts = ["{tmp_path}:{tmp_path}", "{devices}:{DEVICES_INSIDE}:ro"]
""")


def _stepping(cli: Cli, name: str, step: int) -> tuple[str, int]:
    """The host and rank 1's GPU once the job ``name`` runs and its rank 1 reported ``step``: its
    metrics file read where its host keeps it (the bed's hosts share this machine's files), not
    through a rigdeck process at every look (two cores start the container meanwhile)."""
    def running() -> str | None:
        return next((j["job_id"] for j in cli.json("jobs") if j["name"] == name and j["state"] == "running"), None)

    job_id = wait_until(running, 120, f"{name} running", step=2.0)
    node = cli.json("status", job_id)["placement"][0]
    metrics = cli.bed.hosts[host_index(cli, node["host"]) - 1].state_dir / "jobs" / job_id / "metrics"

    def stepped() -> bool:
        try:
            lines = (metrics / "rank-1.jsonl").read_text().splitlines()
        except OSError:
            return False
        for ln in lines:
            try:
                if (json.loads(ln).get("step") or 0) >= step:
                    return True
            except (ValueError, AttributeError):
                continue  # a line still being written
        return False

    wait_until(stepped, 120, f"rank 1 of {name} at step {step}")
    return str(node["host"]), int(node["gpus"][1])


def _lose_a_gpu(cli: Cli, image: str, tmp_path: Path, name: str,
                host_fault: dict[str, Any] | None) -> tuple[dict[str, Any], str, int]:
    """Launch the job, and once it steps, take rank 1's GPU from its container (and, with
    ``host_fault``, fail it on the host too): the job's end as `launch --wait --json` prints it,
    the host and the GPU."""
    waiter = cli.popen("launch", str(_spec(cli, image, tmp_path, name)), "--wait", "--json")
    host, gpu = "", -1
    try:
        host, gpu = _stepping(cli, name, 6)  # after the checkpoint at step 5: the restart resumes from it
        if host_fault is not None:
            # The GPU fails on the host first (the driver logs its XID; telemetry samples at
            # 1 Hz), then its device is gone from the container: the order of a real fall off
            # the bus, and of what the agent's judgement of the failed rank reads.
            write_faults(cli, host, {str(gpu): host_fault})
            wait_until(lambda: gpu_report(cli, host, gpu)["health"] == "unhealthy", 30,
                       "the host's telemetry to see the GPU fail")
        (tmp_path / "devices" / "attempt-0" / f"nvidia{gpu}").unlink()
        out, _ = waiter.communicate(timeout=150)
    finally:
        if waiter.poll() is None:
            waiter.kill()
        if host:
            write_faults(cli, host, {})
    return json.loads(out), host, gpu


@pytest.mark.testbed
@pytest.mark.timeout(600)
@pytest.mark.cli_options(timeout=150)
def test_a_container_that_lost_its_gpu_is_the_containers_incident_and_nothing_is_drained(
        cli: Cli, image: str, tmp_path: Path) -> None:
    final, host, gpu = _lose_a_gpu(cli, image, tmp_path, "ctr-lost", host_fault=None)
    assert final["state"] == "succeeded" and final["restarts"] == 1, json.dumps(final, indent=1)[-3000:]
    (incident,) = final["incidents"]
    assert (incident["kind"], incident["host"], incident["gpu"], incident["rank"]) == ("container", host, gpu, 1)
    assert incident["message"] == (f"{host}: container lost its GPUs: NVML unknown error inside (rank 1 exited 1), "
                                   f"GPU {gpu} (simulated) healthy on the host"), incident
    restart = next(e for e in final["events"] if e.get("event") == "restart")
    assert restart["cause"]["kind"] == "container" and restart["cause"]["gpu"] == gpu, restart
    assert cli.json("drains") == []
    assert gpu_report(cli, host, gpu)["health"] == "ok"
    text = cli.run("status", final["job_id"]).stdout
    assert f"incident container host {host} GPU {gpu} rank 1" in text and "container lost its GPUs" in text, text
    assert "resumed from step" in cli.run("logs", final["job_id"], "--rank", "0").stdout


@pytest.mark.testbed
@pytest.mark.timeout(600)
@pytest.mark.cli_options(timeout=150)
def test_a_gpu_lost_in_the_container_and_failing_on_the_host_is_drained_as_before(
        cli: Cli, image: str, tmp_path: Path) -> None:
    final, host, gpu = _lose_a_gpu(cli, image, tmp_path, "ctr-xid", host_fault={"xid": 79})
    try:
        assert final["state"] == "succeeded" and final["restarts"] == 1, json.dumps(final, indent=1)[-3000:]
        (incident,) = final["incidents"]
        assert (incident["kind"], incident["host"], incident["gpu"]) == ("gpu", host, gpu), incident
        assert "XID 79" in incident["message"] and "container" not in incident["message"], incident
        assert all((n["host"], g) != (host, gpu) for n in final["placement"] for g in n["gpus"])
        (drain,) = cli.json("drains")
        assert (drain["host"], drain["gpu"], drain["source"]) == (host, gpu, "health")
    finally:
        cli.run("undrain", f"{host}:{gpu}", check=False)
