"""Training that heals itself, on the test bed (gloo on CPU, simulated GPUs): a hang found with its
stacks and resumed from the checkpoint, a GPU fault drained and moved away from, a NaN loss.
Everything through the real CLI."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from agent import hangrule
from tests.kit import ROOT, wait_until
from tests.kit.bedcli import Cli, tagged

pytestmark = pytest.mark.testbed

TRAIN = ROOT / "tests" / "jobscripts" / "heal_train.py"


def _steps(metrics: list[dict[str, Any]]) -> list[tuple[int, int]]:
    return [(m["rank"], m["step"]) for m in metrics if m.get("event") is None and m.get("step") is not None]


def _control_run(cli: Cli, ckpt: Path) -> Any:
    """Issue 48's control run, started in the background: no [health] table, one step five times
    slower than the rest and a checkpoint save of SAVE_S, through runtime.Checkpointer. Its
    ``launch --wait``."""
    spec = cli.spec("control", f"""
command = ["{{python}}", "{TRAIN}", "--steps", "14", "--ckpt", "{ckpt}", "--sleep", "0.3", "--slow-step", "4",
           "--slow-factor", "5", "--checkpoint-every", "10", "--save-seconds", "{SAVE_S}"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 1
processes_per_node = 2
[env]
OMP_NUM_THREADS = "1"
""")
    return cli.popen("launch", str(spec), "--wait", "--json")


SAVE_S = 30  # issue 48's number: twice the learned floor (hangrule.FLOOR_S), so a rule blind to the save would fire


def test_a_rank_that_hangs_before_its_all_reduce_is_restarted_with_its_stacks_kept(cli: Cli, tmp_path: Path) -> None:
    """With no [health] table (issue 48, acceptance 4): the hang is found by the timeout learned
    from the job's own steps, in under a minute, by the job hosts, which take the stacks. Beside
    it, the control run (acceptance 2): a slow step and a 30 s save raise no incident."""
    ckpt, control_ckpt = tmp_path / "ckpt", tmp_path / "control"
    ckpt.mkdir()
    control_ckpt.mkdir()
    control = _control_run(cli, control_ckpt)
    spec = cli.spec("hangs", f"""
command = ["{{python}}", "{TRAIN}", "--steps", "30", "--ckpt", "{ckpt}", "--sleep", "0.3",
           "--hang-rank", "3", "--hang-step", "12"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 3
processes_per_node = 2
[env]
OMP_NUM_THREADS = "1"
[restart]
max_restarts = 1
""")
    try:
        t0 = time.monotonic()
        final = cli.json("launch", str(spec), "--wait", timeout=240)
        t1 = time.monotonic()
        out, _ = control.communicate(timeout=240)
        print(f"the hung job ran {t1 - t0:.0f} s; the control run ended {time.monotonic() - t1:.0f} s after it")
    finally:
        if control.poll() is None:
            control.kill()
    job_id = final["job_id"]
    assert final["state"] == "succeeded", json.dumps(final, indent=1)[-3000:]
    assert final["restarts"] == 1
    incident = next(e for e in final["events"] if e.get("event") == "incident")["cause"]
    assert incident["kind"] == "hang" and incident["last_step"] == 11
    # the cause names the hang, the learned timeout and its section, who judged it, and the rank
    # that is not in the all-reduce, where it is
    assert "hung: no rank reported a step after step 11" in incident["message"]
    assert "(step timeout 15 s, learned: 10 x the longest step seen (" in incident["message"], incident["message"]
    assert "job host; not in a collective: rank 3 at heal_train.py" in incident["message"], incident["message"]
    assert "in stuck" in incident["message"]
    assert (incident["section"], incident["timeout_s"]) == ("step", hangrule.FLOOR_S)
    assert {s["rank"] for s in incident["stacks"]} == set(range(6))
    restart = next(e for e in final["events"] if e.get("event") == "restart")
    metrics = cli.json("metrics", job_id)
    # step 10 is the first attempt's newest step the metrics keep (the second ran step 11 again):
    # the hang began one step after it at the latest
    last_step_at = max(m["time"] for m in metrics if m.get("step") == 10 and m.get("event") is None)
    found_in = next(e for e in final["events"] if e.get("event") == "incident")["time"] - last_step_at
    print(f"the hung rank was found {found_in:.1f} s after step 10 (learned step timeout "
          f"{incident['timeout_s']:g} s); restarted {restart['time'] - last_step_at:.1f} s after it\n"
          f"{incident['message'][:400]}")
    assert found_in < 60 and restart["time"] - last_step_at < 60, (found_in, restart["time"], last_step_at)
    # the stacks are in the ranks' logs, beside their output
    logs = cli.run("logs", job_id, "--rank", "3").stdout
    assert "rigdeck: Python stacks of rank 3" in logs and "in stuck" in logs
    # it resumed from its checkpoint (step 10) and each (rank, step) is shown once
    assert "resumed from step 10" in cli.run("logs", job_id, "--rank", "0").stdout
    steps = _steps(metrics)
    assert sorted(steps) == sorted({(r, s) for r in range(6) for s in range(1, 31)})
    assert len(steps) == len(set(steps))
    st = cli.json("status", job_id)
    (inc,) = st["incidents"]
    assert inc["kind"] == "hang" and inc["steps_rerun"] == 1 and 0 < inc["resume_s"] < 60
    assert hangrule.FLOOR_S <= inc["detect_s"] < 60
    assert (inc["section"], inc["timeout_s"]) == ("step", hangrule.FLOOR_S)
    assert 0 < st["goodput"]["ratio"] < 1
    text = cli.run("status", job_id).stdout
    assert "goodput  " in text and "incident hang after step 11: detected in " in text, text
    assert "step timeout 15 s, learned" in text, text
    print("rigdeck status:", *(line for line in text.splitlines() if "incident" in line), sep="\n")
    assert tagged(cli.bed, job_id) == {"h1": [], "h2": [], "h3": []}
    # the control run: no incident, no restart, though its save and its slow step really were slow
    done = json.loads(out)
    assert (done["state"], done["restarts"]) == ("succeeded", 0), json.dumps(done, indent=1)[-3000:]
    assert cli.json("status", done["job_id"])["incidents"] == []
    control_metrics = cli.json("metrics", done["job_id"])
    saves = [m for m in control_metrics if m.get("event") == "section" and m.get("phase") == "end"]
    assert {m["section"] for m in saves} == {"checkpoint"} and min(m["seconds"] for m in saves) >= SAVE_S
    slow = [m["step_time"] for m in control_metrics if m.get("step") == 5 and m.get("event") is None]
    assert slow and min(slow) >= 5 * 0.3, slow


def test_a_hang_with_on_hang_fail_fails_with_the_cause(cli: Cli, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    spec = cli.spec("hangs-fail", f"""
command = ["{{python}}", "{TRAIN}", "--steps", "30", "--ckpt", "{ckpt}", "--sleep", "0.2",
           "--hang-rank", "1", "--hang-step", "4"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 1
processes_per_node = 2
[health]
hang_timeout = "10s"
on_hang = "fail"
[restart]
max_restarts = 2
""")
    final = cli.json("launch", str(spec), "--wait", check=False, timeout=120)
    assert final["state"] == "failed" and final["restarts"] == 0
    assert final["cause"]["kind"] == "hang" and final["cause"]["message"].startswith(
        "hung: no rank reported a step after step 3 for 1"), final["cause"]
    assert "rank 1 at heal_train.py" in final["cause"]["message"]


def test_a_loss_that_turns_nan_fails_the_job_naming_the_first_bad_step(cli: Cli, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    spec = cli.spec("diverges", f"""
command = ["{{python}}", "{TRAIN}", "--steps", "200", "--ckpt", "{ckpt}", "--sleep", "0.5", "--nan-from", "6"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 1
processes_per_node = 2
""")
    final = cli.json("launch", str(spec), "--wait", check=False, timeout=120)
    assert final["state"] == "failed", final
    assert final["cause"]["kind"] == "nan" and final["cause"]["message"].startswith(
        "loss is NaN or inf at every reporting rank since step "), final["cause"]
    assert 6 <= final["cause"]["last_step"] <= 8


def test_a_loss_that_turns_nan_with_on_nan_restart_resumes_from_the_checkpoint(cli: Cli, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    spec = cli.spec("diverges-once", f"""
command = ["{{python}}", "{TRAIN}", "--steps", "20", "--ckpt", "{ckpt}", "--sleep", "0.5", "--nan-from", "8",
           "--checkpoint-every", "4"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 1
processes_per_node = 2
[health]
on_nan = "restart"
[restart]
max_restarts = 1
""")
    final = cli.json("launch", str(spec), "--wait", timeout=150)
    assert final["state"] == "succeeded" and final["restarts"] == 1, final
    # from the checkpoint before the first bad step (the one at step 8 was saved after it)
    assert "resumed from step 4" in cli.run("logs", final["job_id"], "--rank", "0").stdout
    # the newest attempt's steps stand for the ones it redid
    metrics = cli.json("metrics", final["job_id"])
    losses = {m["step"]: m["loss"] for m in metrics
              if m.get("rank") == 0 and m.get("event") is None and m.get("step") is not None}
    assert sorted(losses) == list(range(1, 21)), metrics[:5]
    assert all(v == v for v in losses.values())  # no NaN left


def _running_at_step(cli: Cli, name: str, step: int) -> str:
    """The id of the job ``name`` once it runs and has reported ``step`` (at most 120 s)."""
    def stepping() -> bool:
        jobs = [j for j in cli.json("jobs") if j["name"] == name and j["state"] == "running"]
        return bool(jobs) and (cli.json("status", jobs[0]["job_id"]).get("last_step") or 0) >= step

    wait_until(stepping, 120, f"the job's step {step}")
    return next(j["job_id"] for j in cli.json("jobs") if j["name"] == name)


def _host_index(cli: Cli, name: str) -> int:
    return next(i for i, h in enumerate(cli.bed.hosts, start=1) if h.name == name)


def _write_faults(cli: Cli, host: str, faults: dict[str, Any]) -> None:
    path = cli.bed.hosts[_host_index(cli, host) - 1].state_dir / "sim-gpu-faults.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(faults))
    tmp.replace(path)


def _gpu(cli: Cli, host: str, index: int) -> dict[str, Any]:
    (report,) = cli.json("hosts", host)
    return next(g for g in report["gpus"] if g["index"] == index)


@pytest.mark.parametrize("fault", [{"xid": 79}, {"ecc_uncorrected": 3}, {"lost": True}],
                         ids=["xid79", "ecc", "lost"])
def test_a_failing_gpu_under_a_rank_is_drained_and_the_job_resumes_elsewhere(
        cli: Cli, tmp_path: Path, fault: dict[str, Any]) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    spec = cli.spec("gpu-fault", f"""
command = ["{{python}}", "{TRAIN}", "--steps", "40", "--ckpt", "{ckpt}", "--sleep", "0.3", "--first-attempt-holds"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 2
gpus_per_node = 2
[env]
OMP_NUM_THREADS = "1"
[restart]
max_restarts = 1
""")
    waiter = cli.popen("launch", str(spec), "--wait", "--json")
    host, gpu = "", -1
    try:
        job_id = _running_at_step(cli, "gpu-fault", 6)
        first = cli.json("status", job_id)
        host, gpu = first["placement"][0]["host"], first["placement"][0]["gpus"][1]
        _write_faults(cli, host, {str(gpu): fault})
        # Seen unhealthy within 10 s of the fault, the last look included (its CLI call may end
        # after wait_until's deadline).
        start = time.monotonic()
        wait_until(lambda: _gpu(cli, host, gpu)["health"] == "unhealthy", 10, "the GPU unhealthy")
        assert time.monotonic() - start < 10
        why = _gpu(cli, host, gpu)["health_reason"]
        out, err = waiter.communicate(timeout=180)
        final = json.loads(out)
    finally:
        if waiter.poll() is None:
            waiter.kill()
        if host:
            _write_faults(cli, host, {})
    assert final["state"] == "succeeded" and final["restarts"] == 1, json.dumps(final, indent=1)[-3000:]
    incident = next(e for e in final["events"] if e.get("event") == "incident")["cause"]
    assert incident == {"message": f"{host} GPU {gpu} (simulated): {why}", "kind": "gpu", "host": host, "gpu": gpu}
    stop = next(e for e in final["events"] if e.get("event") == "incident")["time"]
    assert all((n["host"], g) != (host, gpu) for n in final["placement"] for g in n["gpus"])
    assert "resumed from step" in cli.run("logs", final["job_id"], "--rank", "0").stdout
    restarted = next(e for e in final["events"] if e.get("event") == "started" and e.get("restart_count") == 1)
    assert restarted["time"] - stop < 30
    # rigdeck drained it: a launch that needs it is refused, naming it, until an operator undrains it
    (drain,) = cli.json("drains")
    assert (drain["host"], drain["gpu"], drain["who"], drain["source"]) == (host, gpu, "rigdeck", "health")
    whole = cli.spec("whole-host", f"""
command = ["{{python}}", "-c", "print('ok')"]
workdir = "{ROOT}"
hosts = ["{host}"]
gpus_per_node = 4
""")
    refused = cli.run("launch", str(whole), "--no-queue", check=False)
    assert refused.returncode == 2 and f"GPU {gpu} drained ({host} GPU {gpu} (simulated): {why})" in refused.stderr
    assert _gpu(cli, host, gpu)["health"] == "drained"  # the fault is gone, the drain stays
    assert [d["target"] for d in cli.json("undrain", f"{host}:{gpu}")] == [f"{host}:{gpu}"]
    assert cli.json("drains") == []
    ran = cli.json("launch", str(whole), "--no-queue", "--wait")
    assert ran["state"] == "succeeded" and gpu in ran["placement"][0]["gpus"]
    assert _gpu(cli, host, gpu)["health"] == "ok"


def test_a_rank_that_dies_as_its_gpu_fails_is_the_gpus_incident_and_the_gpu_is_drained(
        cli: Cli, tmp_path: Path) -> None:
    """XID 79 on a real card: the rank's next CUDA call fails, and the process exits before (or
    as) telemetry shows the XID. The GPU, not the rank, is the cause: drained, and the restart
    never goes back to it."""
    ckpt, dead = tmp_path / "ckpt", tmp_path / "dead"
    ckpt.mkdir()
    dead.mkdir()
    spec = cli.spec("gpu-dies", f"""
command = ["{{python}}", "{TRAIN}", "--steps", "40", "--ckpt", "{ckpt}", "--sleep", "0.3", "--dead-gpus", "{dead}",
           "--first-attempt-holds"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 2
gpus_per_node = 1
[env]
OMP_NUM_THREADS = "1"
[restart]
max_restarts = 2
""")
    waiter = cli.popen("launch", str(spec), "--wait", "--json")
    host, gpu = "", -1
    try:
        job_id = _running_at_step(cli, "gpu-dies", 6)
        node = cli.json("status", job_id)["placement"][1]
        host, gpu = node["host"], node["gpus"][0]
        _write_faults(cli, host, {str(gpu): {"xid": 79}})
        (dead / f"dead-{cli.bed.hosts[_host_index(cli, host) - 1].hostname}-{gpu}").write_text("")
        out, err = waiter.communicate(timeout=180)
        final = json.loads(out)
    finally:
        if waiter.poll() is None:
            waiter.kill()
        if host:
            _write_faults(cli, host, {})
    assert final["state"] == "succeeded" and final["restarts"] == 1, json.dumps(final, indent=1)[-3000:]
    incident = next(e for e in final["events"] if e.get("event") == "incident")["cause"]
    assert (incident["kind"], incident["host"], incident["gpu"]) == ("gpu", host, gpu), incident
    assert "XID 79" in incident["message"]
    assert all((n["host"], g) != (host, gpu) for n in final["placement"] for g in n["gpus"])
    (drain,) = cli.json("drains")
    assert (drain["host"], drain["gpu"], drain["source"]) == (host, gpu, "health")
    cli.run("undrain", f"{host}:{gpu}")


def test_throttling_only_warns(cli: Cli, tmp_path: Path) -> None:
    host = cli.bed.hosts[0].name
    try:
        _write_faults(cli, host, {"3": {"throttle": "hw_slowdown"}})
        wait_until(lambda: _gpu(cli, host, 3)["health"] == "warn", 10, "the warning")
        assert _gpu(cli, host, 3)["health_reason"] == "throttled: hardware slowdown"
        spec = cli.spec("on-a-slow-gpu", f"""
command = ["{{python}}", "-c", "print('ok')"]
workdir = "{ROOT}"
hosts = ["{host}"]
gpus_per_node = 4
""")
        ran = cli.json("launch", str(spec), "--no-queue", "--wait")
        assert ran["state"] == "succeeded" and ran["restarts"] == 0 and 3 in ran["placement"][0]["gpus"]
        assert cli.json("drains") == []
    finally:
        _write_faults(cli, host, {})


def test_a_host_lost_mid_job_is_left_out_and_the_job_resumes_on_the_spare(cli: Cli, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    spec = cli.spec("host-lost", f"""
command = ["{{python}}", "{TRAIN}", "--steps", "40", "--ckpt", "{ckpt}", "--sleep", "0.3", "--first-attempt-holds"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 2
processes_per_node = 2
[env]
OMP_NUM_THREADS = "1"
[health]
host_timeout = "15s"
[restart]
max_restarts = 1
""")
    waiter = cli.popen("launch", str(spec), "--wait", "--json")
    lost = 0
    try:
        job_id = _running_at_step(cli, "host-lost", 8)
        hosts = [n["host"] for n in cli.json("status", job_id)["placement"]]
        spare = next(h.name for h in cli.bed.hosts if h.name not in hosts)
        gone = hosts[1]
        lost = _host_index(cli, gone)
        cli.bed.link_down(lost)  # first the link: the others hear nothing and wait in their all-reduce
        cli.bed.exec(lost, ["sh", "-c", f"grep -l -a 'RIGDECK_JOB_ID={job_id}' /proc/[0-9]*/environ 2>/dev/null"
                                        " | cut -d/ -f3 | xargs -r kill -9"])
        killed_at = time.time()
        out, err = waiter.communicate(timeout=240)
        final = json.loads(out)
    finally:
        if waiter.poll() is None:
            waiter.kill()
        if lost:
            cli.bed.link_up(lost)
    assert final["state"] == "succeeded" and final["restarts"] == 1, json.dumps(final, indent=1)[-3000:]
    assert sorted(n["host"] for n in final["placement"]) == sorted([hosts[0], spare])
    incident = next(e for e in final["events"] if e.get("event") == "incident")["cause"]
    assert incident["kind"] == "host" and incident["host"] == gone
    assert incident["message"].startswith(f"{gone} unreachable for ")
    started = next(e for e in final["events"] if e.get("event") == "started" and e.get("restart_count") == 1)
    assert started["time"] - killed_at < 60
    assert "resumed from step" in cli.run("logs", final["job_id"], "--rank", "0").stdout
    (inc,) = cli.json("status", final["job_id"])["incidents"]
    firsts = {}
    for m in cli.json("metrics", final["job_id"]):
        if m.get("step") is not None and m.get("event") is None:
            firsts.setdefault(m.get("restart"), m)
    assert inc["kind"] == "host" and inc["resume_s"] is not None, (inc, firsts)


def test_an_operator_drains_by_hand_and_drain_now_moves_the_running_job(cli: Cli, tmp_path: Path) -> None:
    import getpass

    h1, h2, h3 = (h.name for h in cli.bed.hosts)
    try:
        (d,) = cli.json("drain", h3, "--reason", "PSU swap")
        assert (d["target"], d["who"], d["source"], d["reason"], d["now"]) == (h3, getpass.getuser(), "operator",
                                                                               "PSU swap", False)
        assert "PSU swap" in cli.run("drains").stdout  # another process, the same drains: kept in the history
        wide = cli.spec("three-hosts", f'command = ["{{python}}", "-c", "print(1)"]\nworkdir = "{ROOT}"\nnodes = 3\n'
                                       'gpus_per_node = 1\n')
        refused = cli.run("launch", str(wide), "--no-queue", check=False)
        assert refused.returncode == 2 and f"{h3} drained" in refused.stderr, refused.stderr
        ckpt = tmp_path / "ckpt"
        ckpt.mkdir()
        spec = cli.spec("moved", f"""
command = ["{{python}}", "{TRAIN}", "--steps", "40", "--ckpt", "{ckpt}", "--sleep", "0.3", "--first-attempt-holds"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 2
gpus_per_node = 3
[env]
OMP_NUM_THREADS = "1"
[restart]
max_restarts = 1
""")
        waiter = cli.popen("launch", str(spec), "--wait", "--json")
        try:
            job_id = _running_at_step(cli, "moved", 5)
            placement = cli.json("status", job_id)["placement"]
            assert sorted(n["host"] for n in placement) == [h1, h2]
            gpu = next(n for n in placement if n["host"] == h2)["gpus"][0]
            cli.run("drain", f"{h2}:{gpu}", "--now", "--reason", "fan noise")
            drained_at = time.time()
            out, _ = waiter.communicate(timeout=180)
            final = json.loads(out)
        finally:
            if waiter.poll() is None:
                waiter.kill()
        assert final["state"] == "succeeded" and final["restarts"] == 1, json.dumps(final, indent=1)[-3000:]
        incident = next(e for e in final["events"] if e.get("event") == "incident")
        assert incident["cause"] == {"message": f"{h2}:{gpu} drained by {getpass.getuser()} (fan noise)",
                                     "kind": "drain", "host": h2, "gpu": gpu}
        assert incident["time"] - drained_at < 10
        assert all((n["host"], g) != (h2, gpu) for n in final["placement"] for g in n["gpus"])
        assert "resumed from step" in cli.run("logs", final["job_id"], "--rank", "0").stdout
    finally:
        cli.run("undrain", h3, f"{h2}:0", f"{h2}:1", f"{h2}:2", f"{h2}:3")
    assert cli.json("drains") == []


def _controllers(home: Path) -> list[str]:
    """rigdeck's processes on this machine that work in ``home`` (the app, the CLI, a server: a
    controller of this test's jobs), found by their environment."""
    needle = f"RIGDECK_HOME={home}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            env, argv = (d / "environ").read_bytes(), (d / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(f"{d.name}: {argv.replace(bytes(1), b' ').decode('utf-8', 'replace')}")
    return found


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
    index = _host_index(cli, host)
    d = cli.bed.hosts[index - 1].state_dir / "jobs" / job_id
    home = Path(cli.env["RIGDECK_HOME"])

    def alone(what: str) -> bool:  # asked at every look while the hosts handle the faults
        assert _controllers(home) == [], f"a controller runs while {what}"
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
    text = cli.run("status", job_id).stdout
    print("rigdeck status:", *(ln for ln in text.splitlines() if "incident" in ln), sep="\n")
    again = cli.json("status", job_id)
    assert len(again["incidents"]) == 2 and again["restarts"] == 2
    assert len([e for e in again["events"] if e.get("event") in ("restart", "incident")]) == 4
    # each step once, the newest attempt's; resumed from the checkpoints at 5 and 15
    steps = _steps(cli.json("metrics", job_id))
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
    index = _host_index(cli, host)
    d = cli.bed.hosts[index - 1].state_dir / "jobs" / job_id
    home = Path(cli.env["RIGDECK_HOME"])
    metrics = d / "metrics" / "rank-0.jsonl"
    try:
        wait_until(lambda: _controllers(home) == [] and metrics.exists() and b'"hold"' in metrics.read_bytes(), 120,
                   "the job holding")
        _write_faults(cli, host, {str(gpu): {"xid": 79}})

        def ended() -> dict[str, Any] | None:
            assert _controllers(home) == [], "a controller runs while the GPU fault is handled"
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
        _write_faults(cli, host, {})
        cli.run("undrain", f"{host}:{gpu}", check=False)
