"""Training that heals itself with no controller running (issue 48, acceptance 0), on the test bed:
a job of one host healed in place by its job host; an XID 79 on its GPU healed in place on a free
GPU of the host; a GPU fault with no GPU free there, which stops the job for the next controller to
move."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.kit import ROOT, wait_until
from tests.kit.bedcli import Cli, tagged
from tests.kit.healing import TRAIN, controllers, gpu_report, host_index, step_keys, write_faults

pytestmark = pytest.mark.testbed


def test_a_job_of_one_host_heals_in_place_with_no_controller_running(cli: Cli, tmp_path: Path) -> None:
    """Issue 48, acceptance 0: launched embedded, without --wait, and no rigdeck process left on
    the workstation. Its hang (attempt 0), then a rank killed (attempt 1), are each healed in place
    by its job host, from the checkpoint; the job succeeds with each step once. Then a controller
    looks (``rigdeck status``): the incidents and the restarts, each once, and a second look
    adopts nothing again."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    spec = cli.spec("alone", f"""
command = ["{{python}}", "{TRAIN}", "--steps", "16", "--ckpt", "{ckpt}", "--sleep", "0.3",
           "--hang-rank", "1", "--hang-step", "8", "--hold-attempts", "2"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 1
processes_per_node = 2
[env]
OMP_NUM_THREADS = "1"
[restart]
max_restarts = 2
""")
    launched = cli.json("launch", str(spec))
    job_id, host = launched["job_id"], launched["placement"][0]["host"]
    index = host_index(cli, host)
    d = cli.bed.hosts[index - 1].state_dir / "jobs" / job_id
    home = Path(cli.env["RIGDECK_HOME"])

    def alone(what: str) -> bool:  # asked at every look while the hosts handle the faults
        assert controllers(home) == [], f"a controller runs while {what}"
        return True

    def state() -> dict[str, Any]:
        return json.loads((d / "state.json").read_text())

    t0 = time.monotonic()
    # attempt 1 holds before its last step (the hang at step 8 was healed): now a rank is killed
    holding = d / "metrics" / "rank-1.jsonl"
    wait_until(lambda: alone("the hang is healed") and holding.exists() and b'"hold"' in holding.read_bytes(), 150,
               "attempt 1 holding")
    t1 = time.monotonic()
    assert state()["restart_count"] == 1
    pid = json.loads((d / "ranks" / "rank-1.json").read_text())["pid"]
    cli.bed.exec(index, ["kill", "-9", str(pid)])
    wait_until(lambda: alone("the killed rank is healed") and state()["state"] in ("succeeded", "failed"), 120,
               "the job's end")
    print(f"the hang healed and attempt 1 holding {t1 - t0:.0f} s after the launch; the job ended "
          f"{time.monotonic() - t1:.0f} s after the kill, no controller running")
    st = state()
    assert (st["state"], st["restart_count"]) == ("succeeded", 2), st
    hang, killed = st["heals"]
    assert (hang["attempt"], hang["kind"], killed["attempt"], killed["kind"]) == (0, "hang", 1, "exit")
    assert (killed["rank"], killed["signal"]) == (1, 9), killed
    # a controller looks: it adopts what the host did, once
    view = cli.json("status", job_id)
    assert (view["state"], view["restarts"]) == ("succeeded", 2), json.dumps(view, indent=1)[-3000:]
    incidents = view["incidents"]
    assert [(i["kind"], i["attempt"], i["healed_by"]) for i in incidents] == [
        ("hang", 0, f"{host}'s job host"), ("exit", 1, f"{host}'s job host")], incidents
    assert incidents[0]["last_step"] == 7 and incidents[0]["steps_rerun"] == 2, incidents[0]
    assert incidents[1]["steps_rerun"] == 0 and all(i["resume_s"] is not None for i in incidents), incidents
    assert "judged by " + f"{host}'s job host; not in a collective: rank 1 at heal_train.py" in incidents[0]["message"]
    restarts = [e for e in view["events"] if e.get("event") == "restart"]
    assert [(e["restart_count"], e["by"]) for e in restarts] == [(1, f"{host}'s job host"), (2, f"{host}'s job host")]
    # each restart the job host made, in its parts (its own moments, adopted), as status prints it
    for i in incidents:
        parts = (i["detected_at"], i["stopped_at"], i["started_at"], i["resumed_at"])
        assert None not in parts and list(parts) == sorted(parts), i
    text = cli.run("status", job_id).stdout
    assert text.count(" after detection, ") == 2, text
    print("rigdeck status:", *(ln for ln in text.splitlines() if "incident" in ln), sep="\n")
    again = cli.json("status", job_id)
    assert len(again["incidents"]) == 2 and again["restarts"] == 2
    assert len([e for e in again["events"] if e.get("event") in ("restart", "incident")]) == 4
    # each step once, the newest attempt's; resumed from the checkpoints at 5 and 15
    steps = step_keys(cli.json("metrics", job_id))
    assert sorted(steps) == [(r, s) for r in range(2) for s in range(1, 17)]
    logs = cli.run("logs", job_id, "--rank", "0").stdout
    assert "resumed from step 5" in logs and "resumed from step 15" in logs
    assert tagged(cli.bed, job_id) == {"h1": [], "h2": [], "h3": []}


def test_an_xid_79_with_no_controller_running_moves_the_ranks_to_a_free_gpu_of_their_host(
        cli: Cli, tmp_path: Path) -> None:
    """Issue 48, acceptance 0 (c): an XID 79 on the one GPU of a job its host heals, launched
    without --wait, with no rigdeck process on the workstation. The host has free GPUs: its job
    host claims one, holds the failed one out, and restarts the rank there from the checkpoint
    (its GPU dies under it as a CUDA call's would: whichever the job host sees first, the rank's
    death or the daemon's verdict, the heal is the GPU's). The job succeeds with each step once.
    The next controller that looks agrees: the incident says where the ranks went, the job's
    placement is the new GPU, the failed one is drained (by the host's job host, for its
    health) and no longer claimed."""
    ckpt, dead = tmp_path / "ckpt", tmp_path / "dead"
    ckpt.mkdir()
    dead.mkdir()
    spec = cli.spec("alone-xid", f"""
command = ["{{python}}", "{TRAIN}", "--steps", "12", "--ckpt", "{ckpt}", "--sleep", "0.3", "--first-attempt-holds",
           "--dead-gpus", "{dead}"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 1
gpus_per_node = 1
[env]
OMP_NUM_THREADS = "1"
[restart]
max_restarts = 1
""")
    launched = cli.json("launch", str(spec))
    job_id, host, gpu = launched["job_id"], launched["placement"][0]["host"], launched["placement"][0]["gpus"][0]
    index = host_index(cli, host)
    d = cli.bed.hosts[index - 1].state_dir / "jobs" / job_id
    home = Path(cli.env["RIGDECK_HOME"])
    metrics = d / "metrics" / "rank-0.jsonl"
    try:
        wait_until(lambda: controllers(home) == [] and metrics.exists() and b'"hold"' in metrics.read_bytes(), 120,
                   "the job holding")
        write_faults(cli, host, {str(gpu): {"xid": 79}})
        (dead / f"dead-{cli.bed.hosts[index - 1].hostname}-{gpu}").write_text("")
        t0 = time.monotonic()

        def ended() -> dict[str, Any] | None:
            assert controllers(home) == [], "a controller runs while the GPU fault is handled"
            st = json.loads((d / "state.json").read_text())
            return st if st["state"] in ("failed", "succeeded", "stopped") else None

        st = wait_until(ended, 60, "the job's end")
        print(f"the job ended {time.monotonic() - t0:.0f} s after the XID, no controller running")
        assert (st["state"], st["restart_count"]) == ("succeeded", 1), st
        (heal,) = st["heals"]
        new = heal["moved"][str(gpu)]
        assert (heal["kind"], heal["gpu"], heal["gpus"]) == ("gpu", gpu, [new]) and new != gpu, heal
        assert heal["message"] == (f"{host} GPU {gpu} (simulated): XID 79: GPU has fallen off the bus; "
                                   f"ranks moved to GPU {new} on {host}, restart in place"), heal
        # the next controller that looks agrees with what the host did
        view = cli.json("status", job_id)
        assert (view["state"], view["restarts"]) == ("succeeded", 1), json.dumps(view, indent=1)[-3000:]
        (inc,) = view["incidents"]
        assert (inc["kind"], inc["host"], inc["gpu"], inc["healed_by"]) == ("gpu", host, gpu, f"{host}'s job host")
        assert inc["message"] == heal["message"] and inc["resume_s"] is not None, inc
        assert [(n["host"], n["gpus"]) for n in view["placement"]] == [(host, [new])]
        restarts = [e for e in view["events"] if e.get("event") == "restart"]
        assert [(e["restart_count"], e["by"]) for e in restarts] == [(1, f"{host}'s job host")]
        text = cli.run("status", job_id).stdout
        assert f"ranks moved to GPU {new} on {host}, restart in place" in text, text
        (drain,) = [x for x in cli.json("drains") if x["host"] == host]
        assert (drain["gpu"], drain["source"], drain["who"]) == (gpu, "health", f"{host}'s job host"), drain
        assert "XID 79" in drain["reason"]
        # the fault gone from the sensor, the host still holds the GPU out (and the history drains it)
        write_faults(cli, host, {})
        failed = wait_until(lambda: (r := gpu_report(cli, host, gpu))["health_reason"] != "XID 79: GPU has fallen off "
                            "the bus" and r, 10, "the sensor's fault gone")
        assert (failed["health"], failed["claim"], failed["drain"]["source"]) == ("unhealthy", None, "health"), failed
        assert failed["health_reason"] == (f"XID 79: GPU has fallen off the bus (simulated); held out by {host}'s job "
                                           f"host (job {job_id}) until undrained"), failed
        # each step once, the newest attempt's; resumed from the checkpoint at 10
        steps = step_keys(cli.json("metrics", job_id))
        assert sorted(steps) == [(0, s) for s in range(1, 13)]
        assert "resumed from step 10" in cli.run("logs", job_id, "--rank", "0").stdout
        assert tagged(cli.bed, job_id) == {"h1": [], "h2": [], "h3": []}
    finally:
        write_faults(cli, host, {})
        shutil.rmtree(dead, ignore_errors=True)
        cli.run("undrain", f"{host}:{gpu}", check=False)
    assert gpu_report(cli, host, gpu)["health"] == "ok"  # the undrain put it back, on the host too


def test_a_gpu_fault_with_no_controller_running_and_no_free_gpu_stops_the_job_for_the_next_controller_to_move(
        cli: Cli, tmp_path: Path) -> None:
    """Issue 48, acceptance 0 (c): the agent judges an XID 79 on the GPU of a job its host heals,
    and every other GPU of the host runs another person's process: with no controller running,
    the job host is told (gpu-health.json: no spare), takes none of them, and stops the job
    rather than restart it on that card. The next controller that looks (``rigdeck status``)
    drains the GPU and restarts the job away from it; the restarted job then ends on its own."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    spec = cli.spec("alone-gpu", f"""
command = ["{{python}}", "{TRAIN}", "--steps", "12", "--ckpt", "{ckpt}", "--sleep", "0.3", "--first-attempt-holds"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 1
gpus_per_node = 1
[env]
OMP_NUM_THREADS = "1"
[restart]
max_restarts = 1
""")
    launched = cli.json("launch", str(spec))
    job_id, host, gpu = launched["job_id"], launched["placement"][0]["host"], launched["placement"][0]["gpus"][0]
    index = host_index(cli, host)
    d = cli.bed.hosts[index - 1].state_dir / "jobs" / job_id
    home = Path(cli.env["RIGDECK_HOME"])
    metrics = d / "metrics" / "rank-0.jsonl"
    # another person's work on every other GPU of the host (a simulated GPU's process)
    others = [cli.bed.popen(index, ["env", f"RIGDECK_SIM_GPU={g}", "sleep", "300"]) for g in range(4) if g != gpu]
    try:
        def told_no_spare() -> bool:
            health = d / "gpu-health.json"
            return health.exists() and json.loads(health.read_text()).get("spare") == []

        wait_until(lambda: controllers(home) == [] and metrics.exists() and b'"hold"' in metrics.read_bytes()
                   and told_no_spare(), 120, "the job holding, its host without a spare GPU")
        write_faults(cli, host, {str(gpu): {"xid": 79}})

        def ended() -> dict[str, Any] | None:
            assert controllers(home) == [], "a controller runs while the GPU fault is handled"
            st = json.loads((d / "state.json").read_text())
            return st if st["state"] in ("failed", "succeeded", "stopped") else None

        st = wait_until(ended, 60, "the job host to stop the job")
        assert (st["state"], st["cause"]["kind"], st["cause"]["gpu"], st["restart_count"]) == ("failed", "gpu", gpu, 0)
        assert "XID 79" in st["cause"]["message"] and not st.get("heals"), st
        assert "no spare GPU free here" in (d / "jobhost.log").read_text()
        # the next controller: drains the GPU, restarts the job away from it
        view = cli.json("status", job_id)
        assert view["restarts"] == 1, json.dumps(view, indent=1)[-3000:]
        (inc,) = view["incidents"]
        assert (inc["kind"], inc["host"], inc["gpu"], inc["healed_by"]) == ("gpu", host, gpu, None), inc
        assert all((n["host"], g) != (host, gpu) for n in view["placement"] for g in n["gpus"])
        final = wait_until(lambda: (v := cli.json("status", job_id))["state"] in ("succeeded", "failed") and v, 120,
                           "the restarted job's end")
        assert (final["state"], final["restarts"]) == ("succeeded", 1), json.dumps(final, indent=1)[-3000:]
        (drain,) = cli.json("drains")
        assert (drain["host"], drain["gpu"], drain["source"]) == (host, gpu, "health")
    finally:
        for p in others:
            p.kill()
            p.wait()
        write_faults(cli, host, {})
        cli.run("undrain", f"{host}:{gpu}", check=False)
