"""agent/slurmstep.py, the hosts' side of a job Slurm runs: the options sbatch may be given,
the batch script, and each node's wait for its plan. The real sbatch and srun run it in
tests/test_engines.py (a Slurm bed)."""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from pathlib import Path

import pytest

from agent import slurmstep


def test_only_the_options_rigdeck_passes_reach_sbatch() -> None:
    ok = ["--nodes=3", "--gres=gpu:2", "--partition=bed", "--job-name=rigdeck:j", "--time=0-00:15:00",
          "--exclude=tb1-h2,tb1-h3"]
    assert slurmstep.check_options(ok) == ok
    for bad, why in ((["--wrap=rm -rf ~"], "not one rigdeck passes"), (["-N3"], "expected --name=value"),
                     (["--nodes=3\n#SBATCH --x"], "expected --name=value"), ("--nodes=3", "must be a list")):
        with pytest.raises(slurmstep.SlurmStepError, match=why):
            slurmstep.check_options(bad)


def test_the_batch_script_is_constant_private_and_passes_its_arguments_on(tmp_path: Path) -> None:
    path = slurmstep.script_path(str(tmp_path))
    assert Path(path).read_text() == slurmstep.BATCH_SCRIPT
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "slurm").st_mode) == 0o700
    assert 'exec srun --ntasks-per-node=1 "$@"\n' in slurmstep.BATCH_SCRIPT  # no value of ours in it
    Path(path).write_text("#!/bin/sh\necho changed\n")
    assert Path(slurmstep.script_path(str(tmp_path))).read_text() == slurmstep.BATCH_SCRIPT


def test_a_node_waits_for_the_plan_of_its_own_slurm_job(tmp_path: Path) -> None:
    job_dir = tmp_path / "j"
    job_dir.mkdir()
    (job_dir / "plan.json").write_text(json.dumps({"slurm": {"job_id": "6"}}))  # an earlier attempt's
    assert not slurmstep.wait_plan(str(job_dir), "7", wait_s=0.2)

    def later() -> None:
        time.sleep(0.2)
        (job_dir / "plan.json").write_text(json.dumps({"slurm": {"job_id": "7"}}))
    t = threading.Thread(target=later)
    t.start()
    try:
        assert slurmstep.wait_plan(str(job_dir), "7", wait_s=30)
    finally:
        t.join()


def test_the_step_runs_the_agents_slurmhost_for_the_job() -> None:
    argv = slurmstep.step_argv(["/usr/bin/python3", "/s/agent.pyz"], "/s/jobs", "j-1")
    assert argv == ["/usr/bin/python3", "-S", "/s/agent.pyz", "slurmhost", "--jobs-root", "/s/jobs", "--job-id", "j-1"]
