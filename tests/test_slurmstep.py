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


def template(job_id: str = "q-1") -> dict:
    def part(host: str, addr: str) -> dict:
        return {"node": {"host": host, "address": addr, "slots": 1, "cpus": 4, "instance_type": "rigdeck.sim-gpu-4",
                         "simulated": True},
                "master_addr": addr, "command": ["/usr/bin/python3", "train.py"], "env": {"WHERE": host, "A": "1"}}
    return {"base": {"job_id": job_id, "name": "q", "launcher": "torchrun", "env": {"A": "1"}, "restart_count": 0},
            "hosts": {"tb1-h1": part("h1", "10.9.0.1"), "tb1-h2": part("h2", "10.9.0.2"),
                      "tb1-h3": part("h3", "10.9.0.3")}}


def test_a_node_makes_its_plan_of_the_template_and_slurms_allocation() -> None:
    """Slurm gave nodes h3 and h1, in that order: h3 is the primary (its address the master's),
    each node has the GPUs Slurm gave it, and the port is the one every node works out alike."""
    env = {"SLURM_JOB_NODELIST": "tb1-h[1,3]"}
    plans = [slurmstep.complete(template(), "4711", ["tb1-h3", "tb1-h1"], i,
                                {"tb1-h3": [2], "tb1-h1": [0]}, env) for i in (0, 1)]
    for i, plan in enumerate(plans):
        assert plan["job_id"] == "q-1" and plan["launcher"] == "torchrun" and plan["node_index"] == i
        assert [(n["host"], n["gpus"], n["address"]) for n in plan["nodes"]] == [
            ("h3", [2], "10.9.0.3"), ("h1", [0], "10.9.0.1")]
        assert plan["master_addr"] == "10.9.0.3" and plan["master_port"] == slurmstep.PORT_BASE + 4711
        assert plan["slurm"] == {"job_id": "4711", "nodes_start": True}
    assert plans[0]["env"]["WHERE"] == "h3" and plans[1]["env"]["WHERE"] == "h1"
    # Slurm's reserved ports, where the site has them, come first
    assert slurmstep.port_for("4711", {"SLURM_STEP_RESV_PORTS": "12000-12003"}) == 12000
    assert slurmstep.port_for("14711", {}) == slurmstep.port_for("4711", {})  # PORT_SPAN apart: the same
    assert slurmstep.port_for("4712", {}) != slurmstep.port_for("4711", {})
    with pytest.raises(slurmstep.SlurmStepError, match="tb1-h9, which the template has no part for"):
        slurmstep.complete(template(), "4711", ["tb1-h1", "tb1-h9"], 0, {}, env)
    with pytest.raises(slurmstep.SlurmStepError, match="SLURM_NODEID 2 is not a node"):
        slurmstep.complete(template(), "4711", ["tb1-h1", "tb1-h3"], 2, {}, env)


KEY = "0123456789abcdef"


@pytest.mark.parametrize("key, bad, why", [
    ("../../etc/x", {}, "16 to 64 hex digits"),
    ("0123456789ABCDEF", {}, "16 to 64 hex digits"),
    (31, {}, "16 to 64 hex digits"),
    (KEY, [], "must be an object"),
    (KEY, {"base": {"job_id": "../etc"}, "hosts": {"n": {}}}, "'base' must be"),
    (KEY, {"base": {"job_id": "j"}, "hosts": {}}, "'hosts' must map"),
    (KEY, {"base": {"job_id": "j"}, "hosts": {"n": {"node": {}, "command": "sh -c x", "master_addr": "a"}}},
     "expected node, command"),
    (KEY, {"base": {"job_id": "j"}, "hosts": {"n": {"node": {}, "command": ["x"], "master_addr": 7}}},
     "expected node, command"),
])
def test_a_template_not_of_its_shape_is_refused_and_nothing_written(tmp_path: Path, key: object, bad: object,
                                                                     why: str) -> None:
    with pytest.raises(slurmstep.SlurmStepError, match=why):
        slurmstep.write_template(str(tmp_path), key, bad)
    assert list(tmp_path.iterdir()) == []


def test_the_template_is_kept_private_and_a_waiting_node_finds_it(tmp_path: Path) -> None:
    root = tmp_path / "jobs"
    path = slurmstep.write_template(str(root), KEY, template())
    assert path == slurmstep.template_path(str(root), KEY) and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert json.loads(Path(path).read_text()) == template()
    assert slurmstep.wait_plan(str(root / "q-1"), "31", wait_s=5, template=path) == "template"
    assert slurmstep.wait_plan(str(root / "q-1"), "31", wait_s=0.1,
                               template=slurmstep.template_path(str(root), "f" * 16)) == ""
    # the step's argv names the template its nodes wait for
    assert slurmstep.step_argv(["/py", "/a.pyz"], "/j", "q-1", KEY)[-2:] == ["--template", KEY]
    with pytest.raises(slurmstep.SlurmStepError, match="16 to 64 hex digits"):
        slurmstep.submit(str(tmp_path), str(root), ["/py", "/a.pyz"], "q-1", [], template="x; rm -rf ~")


def test_the_step_starts_from_the_unpacked_copy_only_where_every_node_has_the_login_hosts_own(tmp_path: Path) -> None:
    unpacked = tmp_path / "v1" / "unpacked"
    (unpacked / "agent").mkdir(parents=True)
    (unpacked / "__main__.py").touch()
    (unpacked / "agent" / "BUILD.json").touch()
    pyz = ["/usr/bin/python3", str(tmp_path / "v1" / "agent.pyz")]
    copy = ["/usr/bin/python3", str(unpacked)]
    assert slurmstep.step_command(pyz, copy, list(copy)) == copy
    argv = slurmstep.step_argv(slurmstep.step_command(pyz, copy, list(copy)), "/s/jobs", "j-1", "ab" * 8)
    assert argv[:4] == ["/usr/bin/python3", "-S", str(unpacked), "slurmhost"], argv  # no site, as the zipapp
    # the nodes said another place, nothing, or something not of its shape; or no copy here
    for said in (["/usr/bin/python3", str(tmp_path / "v2" / "unpacked")], None, "x; rm -rf ~", {"a": 1}, [copy]):
        assert slurmstep.step_command(pyz, copy, said) == pyz, said
    assert slurmstep.step_command(pyz, None, None) == pyz
    assert slurmstep.step_command(pyz, None, list(copy)) == pyz  # a value from the client is never run as such
