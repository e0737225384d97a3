"""The ddp example with its checkpoint owned by one host, whose host dies mid-run on the test bed:
the gang restarts elsewhere, a new owner saves, and training resumes from the last checkpoint."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.kit import EXAMPLES, ROOT
from tests.kit.bedcli import Cli

# The examples stay as they are: mpirun reaches the other hosts with the bed's key through the
# inventory's per-host environment; and they train for a while, so a launch --wait may take its
# time (240 s), and still says where it hung before pytest's own limit (300 s) cuts the test short.
CLI_OPTIONS = {"mpi_ssh": True, "timeout": 240}
pytestmark = [pytest.mark.testbed, pytest.mark.cli_options(**CLI_OPTIONS)]


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
