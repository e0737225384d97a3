"""The example jobs, launched as they are with `rigdeck launch` across 3 test bed hosts, and a
checkpoint owner's host dying mid-run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.kit import EXAMPLES, ROOT
from tests.kit.bedcli import Cli

# The examples stay as they are: mpirun reaches the other hosts with the bed's key through the
# inventory's per-host environment; and they train for a while, so a launch --wait may take its
# time (240 s), and still says where it hung before pytest's own limit (300 s) cuts the test short.
CLI_OPTIONS = {"mpi_ssh": True, "timeout": 240}
pytestmark = [pytest.mark.testbed, pytest.mark.cli_options(**CLI_OPTIONS)]


def losses(metrics: list[dict[str, Any]], rank: int = 0) -> list[tuple[int, float]]:
    return [(m["step"], m["loss"]) for m in metrics
            if m.get("rank") == rank and m.get("loss") is not None and m.get("event") is None]


@pytest.mark.parametrize("example", ["ddp", "mpi", "sharded", "sagemaker-script"])
def test_example_runs_across_three_hosts(cli: Cli, example: str) -> None:
    view = cli.json("launch", str(EXAMPLES / example / "job.toml"), "--wait")
    assert view["state"] == "succeeded", json.dumps(view, indent=1)[-3000:]
    assert len({n["host"] for n in view["placement"]}) == 3
    metrics = cli.json("metrics", view["job_id"])
    if example == "ddp":
        steps = [m for m in metrics if m.get("loss") is not None and m.get("event") is None]
        keys = [(m["rank"], m["step"]) for m in steps]
        assert len(keys) == len(set(keys)), "a step appeared twice"
        assert {r for r, _ in keys} == set(range(6))
        curve = losses(metrics)
        first = sum(v for _, v in curve[:10]) / 10
        last = sum(v for _, v in curve[-10:]) / 10
        assert last < 0.6 * first, (first, last)
        assert any(m.get("event") == "checkpoint" and m.get("status") == "done" for m in metrics)


def _single_process_losses(steps: int, seed: int = 0, batch: int = 128, lr: float = 0.01) -> list[float]:
    """The pipeline example's model and data, whole, in this one process: the loss each step."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("pipeline_example", EXAMPLES / "pipeline" / "train.py")
    assert spec and spec.loader
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    model = torch.nn.Sequential(*ex.build_blocks(seed, 256, 9, 4, 4))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    out = []
    for step in range(steps):
        x, y = ex.make_batch(seed, step, batch)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def test_pipeline_example_runs_from_its_spec_with_both_schedules_and_matches_one_process(
        cli: Cli, tmp_path: Path) -> None:
    """The model-parallel example from its spec alone, one stage per host: rank 0 profiles, the
    plan cuts the unbalanced model, and training follows the single-process loss of the same model
    and seed, on the spec's interleaved schedule (1F1B) and on the simple one (GPipe)."""
    text = (EXAMPLES / "pipeline" / "job.toml").read_text()
    assert 'pipeline = "interleaved"' in text and '"--steps", "200"' in text
    # The example's spec as it is but for its length (40 steps of its 200: the suite's budget),
    # and once more with the other schedule.
    text = text.replace('"--steps", "200"', '"--steps", "40"').replace(
        'workdir = "."', f'workdir = "{EXAMPLES / "pipeline"}"')
    specs = {"interleaved": tmp_path / "interleaved.toml", "simple": tmp_path / "simple.toml"}
    specs["interleaved"].write_text(text)
    specs["simple"].write_text(text.replace('pipeline = "interleaved"', 'pipeline = "simple"'))
    steps = 40
    reference = _single_process_losses(steps)
    for schedule, spec in specs.items():
        view = cli.json("launch", str(spec), "--wait")
        assert view["state"] == "succeeded", json.dumps(view, indent=1)[-3000:]
        assert sorted(n["host"] for n in view["placement"]) == ["h1", "h2", "h3"]
        metrics = cli.json("metrics", view["job_id"])
        (plan,) = [m["plan"] for m in metrics if m.get("event") == "mp_plan"]
        assert (plan["source"], plan["schedule"], plan["partitions"], plan["blocks"]) == ("profiled", schedule, 3, 9)
        # The heavy block (4) is not with as many others as the equal split puts with it.
        assert max(s["time_s"] for s in plan["stages"]) < plan["equal_split"]["max_time_s"], plan
        reported = {(m["rank"], m["host"]) for m in metrics if m.get("event") == "mp_stage"}
        assert {r for r, _ in reported} == {0, 1, 2} and len({h for _, h in reported}) == 3
        curve = [(m["step"], m["loss"]) for m in metrics
                 if m.get("rank") == 2 and m.get("loss") is not None and m.get("event") is None]
        assert [s for s, _ in curve] == list(range(steps))
        got = [v for _, v in curve]
        assert got == pytest.approx(reference, rel=1e-4, abs=1e-6), (schedule, got[:5], reference[:5])
        assert sum(got[-5:]) / 5 < 0.6 * sum(got[:5]) / 5, got  # it learns
        status = cli.json("status", view["job_id"])
        assert [s["blocks"] for s in status["stages"]["stages"]] == [s["blocks"] for s in plan["stages"]]
        assert all(s["peak_bytes"] and s["busy_s"] for s in status["stages"]["stages"]), status["stages"]
        print(f"{schedule}: cuts {plan['cuts']} (equal split {plan['equal_split']['cuts']}), loss "
              f"{got[0]:.5f} -> {got[-1]:.5f}, single process {reference[0]:.5f} -> {reference[-1]:.5f}, "
              f"largest difference {max(abs(a - b) for a, b in zip(got, reference, strict=True)):.2e}")


def test_owner_host_dies_the_gang_restarts_elsewhere_and_resumes(cli: Cli, tmp_path: Path) -> None:
    shared = tmp_path / "ckpt"  # every test bed host sees the same /tmp: shared storage
    spec = tmp_path / "ddp-owner.toml"
    spec.write_text(f"""
name = "ddp-owner"
command = ["{{python}}", "train.py", "--steps", "400", "--checkpoint-every", "20", "--seed", "1"]
workdir = "{EXAMPLES / 'ddp'}"
launcher = "torchrun"
nodes = 2
processes_per_node = 2
[env]
OMP_NUM_THREADS = "1"
[checkpoint]
dir = "{shared}"
owner = "host:h2/gpu:0"
[restart]
max_restarts = 1
""")
    waiter = subprocess.Popen([sys.executable, "-m", "tui.cli", "launch", str(spec), "--wait", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli.env, cwd=ROOT)
    try:
        # The owner's host dies as soon as it has saved once, while most of the 400 steps are
        # still to come (checked on the shared directory: a CLI call per poll takes seconds on a
        # loaded machine, and the job could end first).
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (shared / "latest").exists():
            if waiter.poll() is not None:
                out, err = waiter.communicate()
                raise AssertionError(f"launch --wait ended early ({waiter.returncode}):\n{out}\n{err}")
            time.sleep(0.1)
        if not (shared / "latest").exists():
            waiter.kill()
            out, err = waiter.communicate()
            raise AssertionError(f"no checkpoint before the kill; launch --wait said:\n{out[-2000:]}\n{err[-4000:]}")
        # its sshd and every process in it
        cli.bed.stop_sshd(2)
        cli.bed.exec(2, ["sh", "-c", "kill -9 -1"])
        out, err = waiter.communicate(timeout=400)
        final = json.loads(out)
    finally:
        if waiter.poll() is None:
            waiter.kill()
        cli.bed.start_sshd(2)
    assert final["state"] == "succeeded", json.dumps(final, indent=1)[-3000:]
    assert final["restarts"] == 1
    job_id = final["job_id"]
    first = next(e for e in final["events"] if e.get("event") == "started" and not e.get("restart_count"))
    assert first["hosts"] == ["h1", "h2"]
    assert [n["host"] for n in final["placement"]] == ["h1", "h3"]
    metrics = cli.json("metrics", job_id)
    saves = [m for m in metrics if m.get("event") == "checkpoint" and m.get("status") == "done"
             and not m.get("restart")]
    assert saves and all(m["owner"]["host"] == "h2" for m in saves)
    moves = [m for m in metrics if m.get("event") == "checkpoint_owner"]
    assert moves and moves[0]["from"]["host"] == "h2" and moves[0]["to"]["host"] in ("h1", "h3")
    after = [m for m in metrics if m.get("event") == "checkpoint" and m.get("status") == "done"
             and m["owner"]["host"] != "h2"]
    assert after, ("the new owner saved", [(m.get("restart"), m.get("step"), m.get("event")) for m in metrics][-40:])
    restart_event = next(e for e in final["events"] if e.get("event") == "restart")
    assert restart_event["cause"]["host"] in ("h1", "h2")
    # The restarted run resumed from the last complete checkpoint written before the kill.
    last_before = max(m["step"] for m in metrics if m.get("event") == "checkpoint"
                      and m.get("status") == "done" and m["owner"]["host"] == "h2")
    log0 = cli.run("logs", job_id, "--rank", "0").stdout
    resumed = [(int(m.group(1)), m.group(2)) for m in re.finditer(r"resumed from step (\d+) \(([^)]*)\)", log0)]
    # The newest checkpoint h2 completed before it died (its "done" line is the last thing the save
    # writes, so a kill just after a save can leave a complete checkpoint with no "done" line yet),
    # or, newer, the memory snapshot h1 kept (the example's Checkpointer.snapshot).
    assert len(resumed) == 1, resumed
    step, where = resumed[0]
    print(f"resumed from step {step} ({where}); h2's last disk checkpoint: step {last_before}")
    assert step in (last_before, last_before + 20) or (step > last_before and where.startswith("memory of rank ")
                                                       and where.endswith(" on h1")), (resumed, last_before)
    steps_r0 = [m["step"] for m in metrics if m.get("rank") == 0 and m.get("loss") is not None
                and m.get("event") is None]
    assert max(steps_r0) == 399
