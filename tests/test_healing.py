"""Training that heals itself, on the test bed (gloo on CPU, simulated GPUs): a hang found with its
stacks and resumed from the checkpoint, beside a control run whose slow step and slow save are no
hang; a NaN loss. Everything through the real CLI. The other faults: test_healing_gpu.py (a failing
GPU), test_healing_hosts.py (a host lost, a drain by hand), test_healing_alone.py (with no
controller running)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from agent import hangrule
from tests.kit import ROOT
from tests.kit.bedcli import Cli, tagged
from tests.kit.healing import TRAIN, step_keys

pytestmark = pytest.mark.testbed


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
    """With no [health] table (issue 48, acceptances 1 and 4): the hang is found in seconds by the
    quiet rule (every rank asleep and no step for 10 typical steps, at least 3 s: each job host
    says so of its ranks, the controller judges the job), and the stacks are taken. Beside it,
    the control run (acceptance 2): a slow step and a 30 s save raise no incident."""
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
    # the cause names the hang, the quiet timeout learned and its section, who judged it, and
    # the rank that is not in the all-reduce, where it is
    assert "hung: no rank reported a step after step 11" in incident["message"]
    assert ", every rank asleep (quiet timeout " in incident["message"], incident["message"]
    assert "learned: 10 x the typical step (" in incident["message"], incident["message"]
    assert "judged by the controller: every host's ranks asleep (h1, h2, h3); not in a collective: rank 3 at " \
           "heal_train.py" in incident["message"], incident["message"]
    assert "in stuck" in incident["message"]
    assert incident["section"] == "step" and hangrule.QUIET_FLOOR_S <= incident["timeout_s"] < hangrule.FLOOR_S
    assert {s["rank"] for s in incident["stacks"]} == set(range(6))
    restart = next(e for e in final["events"] if e.get("event") == "restart")
    metrics = cli.json("metrics", job_id)
    # step 10 is the first attempt's newest step the metrics keep (the second ran step 11 again):
    # the hang began one step after it at the latest
    last_step_at = max(m["time"] for m in metrics if m.get("step") == 10 and m.get("event") is None)
    found_in = next(e for e in final["events"] if e.get("event") == "incident")["time"] - last_step_at
    print(f"the hung rank was found {found_in:.1f} s after step 10 (quiet timeout "
          f"{incident['timeout_s']:g} s); restarted {restart['time'] - last_step_at:.1f} s after it\n"
          f"{incident['message'][:400]}")
    # under the learned rule's 15 s floor, on a loaded machine too
    assert found_in < hangrule.FLOOR_S and restart["time"] - last_step_at < 60, (found_in, restart["time"],
                                                                                 last_step_at)
    # the stacks are in the ranks' logs, beside their output
    logs = cli.run("logs", job_id, "--rank", "3").stdout
    assert "rigdeck: Python stacks of rank 3" in logs and "in stuck" in logs
    # it resumed from its checkpoint (step 10) and each (rank, step) is shown once
    assert "resumed from step 10" in cli.run("logs", job_id, "--rank", "0").stdout
    steps = step_keys(metrics)
    assert sorted(steps) == sorted({(r, s) for r in range(6) for s in range(1, 31)})
    assert len(steps) == len(set(steps))
    st = cli.json("status", job_id)
    (inc,) = st["incidents"]
    assert inc["kind"] == "hang" and inc["steps_rerun"] == 1 and 0 < inc["resume_s"] < 60
    assert hangrule.QUIET_FLOOR_S <= inc["detect_s"] < hangrule.FLOOR_S
    assert inc["section"] == "step" and inc["timeout_s"] == incident["timeout_s"]
    assert 0 < st["goodput"]["ratio"] < 1
    text = cli.run("status", job_id).stdout
    assert "goodput  " in text and "incident hang after step 11: detected in " in text, text
    # the controller's restart in its parts: found, the gang gone, the next attempt started, its
    # first step, in that order, and status prints each
    parts = (inc["detected_at"], inc["stopped_at"], inc["started_at"], inc["resumed_at"])
    assert None not in parts and list(parts) == sorted(parts), inc
    assert " + start " in text and " + first step " in text and " after detection, 1 step(s) lost" in text, text
    assert "every rank asleep (quiet timeout " in text, text
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
    # named at or before the first NaN (step 6), after the last good step the looks read: a look
    # on a loaded machine can miss a step or two (0.5 s each), and the resume must come before it
    assert 3 <= final["cause"]["last_step"] <= 6, final["cause"]


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
