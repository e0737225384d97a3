"""Training that heals itself with no controller running (issue 48, acceptance 0), on the test bed:
a job of one host healed in place by its job host; a GPU fault that stops the job for the next
controller to move."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.kit import ROOT, wait_until
from tests.kit.bedcli import Cli, tagged
from tests.kit.healing import TRAIN, controllers, host_index, step_keys, write_faults

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


def test_a_gpu_fault_with_no_controller_running_stops_the_job_for_the_next_controller_to_move(
        cli: Cli, tmp_path: Path) -> None:
    """Issue 48, acceptance 0 (c): the agent judges an XID 79 on the GPU of a job its host heals;
    with no controller running, the job host is told (gpu-health.json) and stops the job rather
    than restart it on that card. The next controller that looks (``rigdeck status``) drains the
    GPU and restarts the job away from it; the restarted job then ends on its own."""
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
    try:
        wait_until(lambda: controllers(home) == [] and metrics.exists() and b'"hold"' in metrics.read_bytes(), 120,
                   "the job holding")
        write_faults(cli, host, {str(gpu): {"xid": 79}})

        def ended() -> dict[str, Any] | None:
            assert controllers(home) == [], "a controller runs while the GPU fault is handled"
            st = json.loads((d / "state.json").read_text())
            return st if st["state"] in ("failed", "succeeded", "stopped") else None

        st = wait_until(ended, 60, "the job host to stop the job")
        assert (st["state"], st["cause"]["kind"], st["cause"]["gpu"], st["restart_count"]) == ("failed", "gpu", gpu, 0)
        assert "XID 79" in st["cause"]["message"] and not st.get("heals"), st
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
        write_faults(cli, host, {})
        cli.run("undrain", f"{host}:{gpu}", check=False)
