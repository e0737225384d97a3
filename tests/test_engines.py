"""rigdeck launching through Slurm (tui/control/engines.py's SlurmEngine) on a real Slurm on the
test bed (tests/slurmbed.py): sbatch places the job, srun starts rigdeck's job host on every
node of the allocation, and everything rigdeck does goes on as on its own placement. One Slurm
bed for the file (the ``slurm`` fixture); the GPUs are simulated (Slurm's GRES on dummy device
files), the ranks train on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from tests._require import has_module, require
from tests.kit import ROOT, wait_until
from tests.kit.bedcli import Cli, running_ranks
from tests.slurmbed import SlurmBed

SLURM_ACCOUNTING = True  # slurmdbd and its database on this file's Slurm (tests/conftest.py): sacct answers

EXAMPLES = ROOT / "examples"
PROBE = ROOT / "tests" / "jobscripts" / "slurm_probe.py"
TICKER = ROOT / "tests" / "jobscripts" / "ticker.py"
HEAL_TRAIN = ROOT / "tests" / "jobscripts" / "heal_train.py"


# -- the seam, without a bed -------------------------------------------------------------------


def test_a_launch_goes_to_slurm_where_the_inventory_has_slurm_and_a_job_to_the_engine_that_ran_it(
        tmp_path: Path) -> None:
    from tui.control.engines import OwnHosts, SlurmEngine
    from tui.control.history import History
    from tui.control.jobs import JobManager
    from tui.model.inventory import HostSpec, Inventory, SlurmSpec

    hosts = (HostSpec(name="h1", address="10.0.0.1"),)
    where = {"path": tmp_path / "hosts.toml", "known_hosts": tmp_path / "known_hosts"}
    plain = JobManager(SimpleNamespace(inventory=Inventory(hosts=hosts, **where)), History(tmp_path / "a.sqlite"))
    on_slurm = JobManager(SimpleNamespace(inventory=Inventory(hosts=hosts, slurm=SlurmSpec(partition="bed"), **where)),
                          History(tmp_path / "b.sqlite"))
    assert isinstance(plain.engine(), OwnHosts) and isinstance(on_slurm.engine(), SlurmEngine)
    # a job is stopped, restarted and read by the engine that ran it, whatever the inventory says now
    assert isinstance(plain.engine({"slurm": {"job_id": "7"}}), SlurmEngine)
    assert isinstance(on_slurm.engine({"slurm": None}), OwnHosts)


def test_sbatch_is_asked_for_the_specs_shape_with_its_slurm_table_over_the_inventorys(tmp_path: Path) -> None:
    from tui.control.engines import SlurmEngine
    from tui.control.history import History
    from tui.control.jobs import JobManager
    from tui.model.inventory import HostSpec, Inventory, SlurmSpec
    from tui.model.jobspec import jobspec_from_toml

    inv = Inventory(hosts=(HostSpec(name="h1", address="10.0.0.1"),), path=tmp_path / "hosts.toml",
                    known_hosts=tmp_path / "known_hosts",
                    slurm=SlurmSpec(partition="bed", account="proj", qos="normal"))
    jm = JobManager(SimpleNamespace(inventory=inv), History(tmp_path / "h.sqlite"))
    spec = jobspec_from_toml('''name = "t"
command = ["true"]
workdir = "/"
nodes = 3
gpus_per_node = 2
max_runtime = "15m"
grace = 30
[slurm]
partition = "gpu"
constraint = "a100&ib"
''')
    assert SlurmEngine(jm).options("t-1", spec) == [
        "--nodes=3", "--ntasks-per-node=1", "--job-name=rigdeck:t-1", "--time=0-00:17:00", "--gres=gpu:2",
        "--partition=gpu", "--account=proj", "--qos=normal", "--constraint=a100&ib"]


def test_a_restart_excludes_the_nodes_rigdeck_drains_or_lost_and_asks_slurm_through_argv(tmp_path: Path) -> None:
    """--exclude names the Slurm nodes of hosts rigdeck drains (a GPU's drain too: Slurm gives
    whole nodes) and of the restart's lost hosts, read from Slurm's own node list (by address
    here: the inventory names are not Slurm's); nothing to exclude asks Slurm nothing."""
    from tui.control.engines import SlurmEngine
    from tui.control.history import History
    from tui.control.jobs import JobManager
    from tui.model.inventory import HostSpec, Inventory, SlurmSpec

    nodes = (ROOT / "tests" / "data" / "slurm" / "nodes-22.05.8-do.txt").read_text()
    asked: list[list[str]] = []

    class Agents:
        def exec(self, argv: list[str], timeout_s: float, timeout: float) -> dict[str, Any]:
            asked.append(argv)
            return {"a": {"exit_code": 0, "stdout": nodes, "stderr": ""}}

    hosts = tuple(HostSpec(name=n, address=f"10.213.1.1{i}") for i, n in enumerate("abc", start=1))
    inv = Inventory(hosts=hosts, path=tmp_path / "hosts.toml", known_hosts=tmp_path / "known_hosts",
                    slurm=SlurmSpec(partition="bed", login="a"))
    history = History(tmp_path / "h.sqlite")
    engine = SlurmEngine(JobManager(SimpleNamespace(inventory=inv, agents=lambda hosts: Agents()), history))
    assert engine.excluded() == [] and asked == []
    history.drain("b", 3, "XID 79", "rigdeck", source="health")
    assert engine.excluded(["c"]) == ["tb1-h2", "tb1-h3"]
    assert engine.excluded(["nowhere"]) == ["tb1-h2"]
    assert asked[0] == ["scontrol", "-o", "show", "nodes"]


POOLS_SPEC = '''name = "p"
command = ["true"]
workdir = "/"
[[pools]]
role = "primary"
gpus_per_replica = %d
[[pools]]
role = "worker"
replicas = 2
gpus_per_replica = %d
[[pools]]
role = "parameter_server"
[[pools]]
role = "evaluator"
'''


def test_a_pool_job_is_one_slurm_allocation_shaped_by_rigdecks_packing_and_packed_into_what_slurm_gave(
        tmp_path: Path) -> None:
    """sbatch's --nodes and --gres of a pool job come from rigdeck's packing of its replicas on
    idle nodes (GPUs busy now do not count: Slurm decides when they are free); the allocation is
    packed the same way, every node given a replica, each GPU replica on GPUs Slurm gave; an
    allocation the replicas do not fill is refused; a pinned pool is refused before sbatch."""
    import dataclasses

    from tui.control.engines import EngineError, SlurmEngine
    from tui.control.history import History
    from tui.control.jobs import JobManager
    from tui.model.inventory import HostSpec, Inventory, SlurmSpec
    from tui.model.jobspec import jobspec_from_toml
    from tui.model.scheduler import HostCapacity
    from tui.model.slurm import SlurmJobDetail

    nodes = (ROOT / "tests" / "data" / "slurm" / "nodes-22.05.8-do.txt").read_text()

    class Agents:
        def exec(self, argv: list[str], timeout_s: float, timeout: float) -> dict[str, Any]:
            return {"a": {"exit_code": 0, "stdout": nodes, "stderr": ""}}

    hosts = tuple(HostSpec(name=n, address=f"10.213.1.1{i}") for i, n in enumerate("abc", start=1))
    inv = Inventory(hosts=hosts, path=tmp_path / "hosts.toml", known_hosts=tmp_path / "known_hosts",
                    slurm=SlurmSpec(partition="bed", login="a"))
    engine = SlurmEngine(JobManager(SimpleNamespace(inventory=inv, agents=lambda hosts: Agents()),
                                    History(tmp_path / "h.sqlite")))
    caps = [HostCapacity(name=h.name, address=h.address, up=True, cpus=8, gpus=(0, 1, 2, 3), foreign_busy=(),
                         simulated=True, gpu_name="sim") for h in hosts]
    caps[0] = dataclasses.replace(caps[0], foreign_busy=(0, 1, 2, 3), slurm=((0, "9", "bob"),))  # busy now
    cpu_side = jobspec_from_toml(POOLS_SPEC % (1, 1))
    assert engine.pool_shape(cpu_side, caps) == (3, 1)
    opts = engine.options("p-1", cpu_side, shape=engine.pool_shape(cpu_side, caps))
    assert [o for o in opts if o.split("=")[0] in ("--nodes", "--ntasks-per-node", "--gres")] == [
        "--nodes=3", "--ntasks-per-node=1", "--gres=gpu:1"], opts
    big = jobspec_from_toml(POOLS_SPEC % (2, 4))
    assert engine.pool_shape(big, caps) == (3, 4)
    # on 2 nodes, 3 GPU replicas: two on one node, so every node of the job gets 2 GPUs
    assert engine.pool_shape(cpu_side, caps, excluded=["tb1-h3"]) == (2, 2)
    with pytest.raises(EngineError, match="do not fit the Slurm nodes rigdeck may use, even idle"):
        engine.pool_shape(big, caps, excluded=["tb1-h3"])  # 10 GPUs asked of 2 nodes x 4

    # Slurm gave h2, h1, h3 with one GPU each (not index 0 on two of them)
    detail = SlurmJobDetail(job_id="12", state="RUNNING", reason=None, nodes=("tb1-h2", "tb1-h1", "tb1-h3"),
                            gpus={"tb1-h2": (3,), "tb1-h1": (1,), "tb1-h3": (0,)})
    placement = engine._placement(cpu_side, detail, caps)
    got = [(n.pool, n.replica, n.host, n.gpus) for n in placement.nodes]
    assert got == [("primary", 0, "a", (1,)), ("worker", 0, "b", (3,)), ("worker", 1, "c", (0,)),
                   ("parameter_server", 0, "a", ()), ("evaluator", 0, "b", ())], got
    two = jobspec_from_toml(POOLS_SPEC.replace("replicas = 2", "replicas = 1") % (1, 1))  # 2 GPU replicas, 3 nodes
    detail4 = dataclasses.replace(detail, gpus={n: (0, 1) for n in detail.nodes})
    assert {n.host for n in engine._placement(two, detail4, caps).nodes} == {"a", "b", "c"}  # CPU ones fill c
    one = jobspec_from_toml(POOLS_SPEC.split("[[pools]]\nrole = \"parameter_server\"")[0]
                            .replace("replicas = 2", "replicas = 1") % (1, 1))
    with pytest.raises(EngineError, match="no replica packs onto node"):
        engine._placement(one, detail, caps)

    pinned = jobspec_from_toml(POOLS_SPEC % (1, 1) + 'labels = ["cpu"]\n')
    with pytest.raises(EngineError, match="field 'pools': pool.s. evaluator name hosts or labels"):
        engine._checked(pinned)


def test_a_launch_reads_slurms_nodes_once_for_its_shape_options_and_allocation(tmp_path: Path) -> None:
    """One place() of a pool job asks Slurm for its nodes once (its shape's candidates, sbatch's
    options and the allocation's hosts share the read), the next place() reads again."""
    from tui.control.engines import SlurmEngine
    from tui.control.history import History
    from tui.control.jobs import JobManager
    from tui.model.inventory import HostSpec, Inventory, SlurmSpec
    from tui.model.jobspec import jobspec_from_toml
    from tui.model.scheduler import HostCapacity

    nodes = (ROOT / "tests" / "data" / "slurm" / "nodes-22.05.8-do.txt").read_text()
    job = (ROOT / "tests" / "data" / "slurm" / "job-22.05.8-d.txt").read_text()
    job = job.replace("NodeList=tb1-h2\n", "NodeList=tb1-h[1-3]\n").replace(
        "     Nodes=tb1-h2 CPU_IDs=1 Mem=0 GRES=gpu:2(IDX:2-3)\n",
        "".join(f"     Nodes=tb1-h{i} CPU_IDs=1 Mem=0 GRES=gpu:1(IDX:{i})\n" for i in (1, 2, 3)))
    asked: list[list[str]] = []

    class Agents:
        def exec(self, argv: list[str], timeout_s: float, timeout: float) -> dict[str, Any]:
            asked.append(argv)
            out = {"nodes": nodes, "partition": "PartitionName=bed Nodes=tb1-h[1-3]\n", "job": job}.get(argv[-1])
            out = out or (job if argv[:3] == ["scontrol", "-d", "show"] else "slurm-wlm 22.05.8\n")
            return {"a": {"exit_code": 0, "stdout": out, "stderr": ""}}

        def slurm_submit(self, **kw: Any) -> dict[str, Any]:
            return {"slurm_job_id": "2"}

    hosts = tuple(HostSpec(name=n, address=f"10.213.1.1{i}") for i, n in enumerate("abc", start=1))
    inv = Inventory(hosts=hosts, path=tmp_path / "hosts.toml", known_hosts=tmp_path / "known_hosts",
                    slurm=SlurmSpec(partition="bed", login="a"))
    jm = JobManager(SimpleNamespace(inventory=inv, agents=lambda hosts: Agents(), agent=lambda h: Agents()),
                    History(tmp_path / "h.sqlite"))
    caps = [HostCapacity(name=h.name, address=h.address, up=True, cpus=8, gpus=(0, 1, 2, 3), foreign_busy=(),
                         simulated=True, gpu_name="sim") for h in hosts]
    engine = SlurmEngine(jm)
    spec = jobspec_from_toml(POOLS_SPEC % (1, 1))
    placement = engine.place("p-1", spec, capacity=caps)
    assert [(n.host, n.gpus) for n in placement.nodes[:3]] == [("a", (1,)), ("b", (2,)), ("c", (3,))]
    reads = [a for a in asked if a[-1] == "nodes"]
    assert len(reads) == 1 and any(a[:3] == ["scontrol", "-d", "show"] for a in asked), asked
    engine.slurm_nodes(["a"])  # outside a place(): read each time
    assert len([a for a in asked if a[-1] == "nodes"]) == 2


def test_a_spec_pinned_to_hosts_asks_slurm_for_exactly_their_nodes(tmp_path: Path) -> None:
    """A spec's ``hosts`` on a Slurm cluster: ``--nodelist`` of their Slurm nodes (read from Slurm's
    own node list, by address here) and ``--nodes`` their count; a pinned host that is drained or
    lost cannot be had (no sbatch that Slurm would refuse); a host that is no Slurm node is said."""
    from tui.control.engines import EngineError, SlurmEngine
    from tui.control.history import History
    from tui.control.jobs import JobManager
    from tui.model.inventory import HostSpec, Inventory, SlurmSpec
    from tui.model.jobspec import jobspec_from_toml

    nodes = (ROOT / "tests" / "data" / "slurm" / "nodes-22.05.8-do.txt").read_text()

    class Agents:
        def exec(self, argv: list[str], timeout_s: float, timeout: float) -> dict[str, Any]:
            return {"a": {"exit_code": 0, "stdout": nodes, "stderr": ""}}

    hosts = tuple(HostSpec(name=n, address=f"10.213.1.1{i}") for i, n in enumerate("abc", start=1))
    inv = Inventory(hosts=hosts + (HostSpec(name="d", address="10.99.0.1"),), path=tmp_path / "hosts.toml",
                    known_hosts=tmp_path / "known_hosts", slurm=SlurmSpec(partition="bed", login="a"))
    engine = SlurmEngine(JobManager(SimpleNamespace(inventory=inv, agents=lambda hosts: Agents()),
                                    History(tmp_path / "h.sqlite")))
    spec = jobspec_from_toml('name = "t"\ncommand = ["true"]\nworkdir = "/"\nhosts = ["c", "a"]\ngpus_per_node = 1\n')
    options = engine.options("t-1", spec)
    assert "--nodes=2" in options and options[-1] == "--nodelist=tb1-h1,tb1-h3", options
    with pytest.raises(EngineError, match="tb1-h3 of the hosts it names are drained or out of reach"):
        engine.options("t-1", spec, exclude=["tb1-h3"])
    assert engine.slurm_nodes(["a", "d"]) == {"a": "tb1-h1", "d": None}


def test_a_restart_ends_the_previous_slurm_job_first_and_keeps_what_slurm_said(tmp_path: Path) -> None:
    """The previous attempt's Slurm job: scancel while Slurm runs it (not while it completes),
    until Slurm says it ended; a ``slurm job ended`` event keeps its id, state and nodes."""
    from tui.control.engines import SlurmEngine
    from tui.control.history import History
    from tui.control.jobs import JobManager
    from tui.model.inventory import HostSpec, Inventory, SlurmSpec

    job = (ROOT / "tests" / "data" / "slurm" / "job-22.05.8-d.txt").read_text()
    states = {"running": ["RUNNING", "COMPLETED"], "completing": ["COMPLETING", "COMPLETING", "COMPLETED"]}
    asked: list[list[str]] = []
    said: list[str] = []

    class Agents:
        def exec(self, argv: list[str], timeout_s: float, timeout: float) -> dict[str, Any]:
            asked.append(argv)
            if argv[0] == "scancel":
                return {"h1": {"exit_code": 0, "stdout": "", "stderr": ""}}
            state = said.pop(0)
            return {"h1": {"exit_code": 0, "stdout": job.replace("JobState=RUNNING", f"JobState={state}"),
                           "stderr": ""}}

    inv = Inventory(hosts=(HostSpec(name="h1", address="10.0.0.1"),), path=tmp_path / "hosts.toml",
                    known_hosts=tmp_path / "known_hosts", slurm=SlurmSpec(partition="bed"))
    history = History(tmp_path / "h.sqlite")
    engine = SlurmEngine(JobManager(SimpleNamespace(inventory=inv, agents=lambda hosts: Agents()), history))
    for name, seq in states.items():
        asked.clear()
        said[:] = seq
        history.create(name, name, {})
        history.update(name, slurm={"job_id": "2", "nodes": ["tb1-h3"], "state": "RUNNING"})
        engine._retire(name)
        cancels = [a for a in asked if a[0] == "scancel"]
        assert cancels == ([["scancel", "2"]] if name == "running" else []), asked
        (ended,) = [e for e in history.get(name)["events"] if e["event"] == "slurm job ended"]
        assert {k: ended[k] for k in ("slurm_job_id", "state", "cancelled", "nodes")} == {
            "slurm_job_id": "2", "state": "COMPLETED", "cancelled": name == "running", "nodes": ["tb1-h3"]}


def test_the_hosts_are_read_while_slurm_checks_the_spec_and_a_refused_spec_submits_nothing(tmp_path: Path) -> None:
    """A launch's two waits before sbatch, the hosts' read (links made, agents deployed, a sample)
    and Slurm's check of the spec on the login, run side by side: here the check answers only
    once the read has begun, so one after the other would never end. A check Slurm refuses
    (no such partition) submits nothing, whatever the read found."""
    import threading

    from tui.control.engines import EngineError, SlurmEngine
    from tui.control.history import History
    from tui.control.jobs import JobManager
    from tui.model.inventory import HostSpec, Inventory, SlurmSpec
    from tui.model.jobspec import jobspec_from_toml

    reading = threading.Event()
    asked: list[list[str]] = []

    class Agents:
        def exec(self, argv: list[str], timeout_s: float, timeout: float) -> dict[str, Any]:
            asked.append(argv)
            assert reading.wait(10), "the spec was checked before the hosts' read began"
            if argv[-1] == "bed":
                return {"h1": {"exit_code": 1, "stdout": "", "stderr": "Partition bed not found"}}
            return {"h1": {"exit_code": 0, "stdout": "PartitionName=other Nodes=h1\n", "stderr": ""}}

        def slurm_submit(self, **kw: Any) -> dict[str, Any]:
            raise AssertionError("submitted")

    inv = Inventory(hosts=(HostSpec(name="h1", address="10.0.0.1"),), path=tmp_path / "hosts.toml",
                    known_hosts=tmp_path / "known_hosts", slurm=SlurmSpec(partition="bed", login="h1"))
    jm = JobManager(SimpleNamespace(inventory=inv, agents=lambda hosts: Agents(), agent=lambda h: Agents()),
                    History(tmp_path / "h.sqlite"))
    read: list[tuple[list[str], bool]] = []

    def capacity(hosts: list[str], skip: str | None = None, slurm: bool = True) -> list[Any]:
        read.append((list(hosts), slurm))
        reading.set()
        return []

    jm.capacity = capacity  # type: ignore[method-assign]
    spec = jobspec_from_toml('name = "t"\ncommand = ["true"]\nworkdir = "/tmp"\n')
    with pytest.raises(EngineError, match="partition 'bed': Slurm has no such partition"):
        SlurmEngine(jm).place("t-1", spec)
    assert read == [(["h1"], False)]  # every host Slurm may choose, and Slurm not asked per host
    assert asked and all(a[0] == "scontrol" and a[1] in ("-o", "--version") for a in asked)  # reads only


# -- through a real Slurm ------------------------------------------------------------------------


def slurm_cli(slurm: SlurmBed, tmp_path: Path, **kw: Any) -> Cli:
    cli = Cli(slurm.bed, tmp_path, **kw)
    cli.inventory.write_text(cli.inventory.read_text() + '\n[slurm]\nlogin = "h1"\npartition = "bed"\n')
    return cli


def squeue(slurm: SlurmBed) -> dict[str, tuple[str, str, str]]:
    """Slurm job id -> (name, state, nodes)."""
    out = slurm.run(["squeue", "--noheader", "--format=%i|%j|%T|%N"], check=False).stdout
    return {p[0]: (p[1], p[2], p[3]) for p in (line.split("|") for line in out.splitlines() if line.strip())}


def job_processes(slurm: SlurmBed, job_id: str, slurm_job: str) -> list[str]:
    """Every process on the bed's hosts of the rigdeck job (its tag) or its Slurm job (Slurm's
    environment, or a slurmstepd of the job)."""
    from tests.testbed import _netns_pids

    found = []
    for h in slurm.bed.hosts:
        for pid in _netns_pids(h.netns):
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if (f"SLURM_JOB_ID={slurm_job}".encode() in env or f"RIGDECK_JOB_ID={job_id}".encode() in env
                    or (cmd.startswith("slurmstepd") and f"[{slurm_job}." in cmd)):
                found.append(f"{h.name}: {pid} {cmd[:100]}")
    return found


def sagemaker_reads(seen: dict[str, Any]) -> dict[str, Any]:
    """What the sagemaker-training toolkit's Environment reads from a rank's SageMaker tree and
    SM_* (in a fresh interpreter, given only those)."""
    require(has_module("sagemaker_training"), "the sagemaker-training toolkit is not installed "
            "(pip install -e '.[test]' brings it)")
    code = ("import json\nfrom sagemaker_training import environment\ne = environment.Environment()\n"
            "print(json.dumps({'current_host': e.current_host, 'hosts': e.hosts, 'master': e.master_hostname}))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SM_")}
    env.update(seen["SM"], SAGEMAKER_BASE_DIR=seen["SAGEMAKER_BASE_DIR"])
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.testbed
def test_ddp_example_through_slurm_with_cluster_files_from_the_allocation(slurm: SlurmBed, tmp_path: Path) -> None:
    """The ddp example through sbatch/srun on 3 nodes, 2 GPUs each: Slurm runs it (squeue shows
    it while it runs), the ranks see Slurm's GPUs and cluster files made of Slurm's allocation,
    and rigdeck's status shows its loss, steps, checkpoint owner and Slurm's job."""
    cli = slurm_cli(slurm, tmp_path, timeout=300)
    seen_dir = tmp_path / "seen"
    seen_dir.mkdir()
    ckpt = tmp_path / "ckpt"
    spec = cli.spec("ddp-slurm", f'''
command = ["{{python}}", "{PROBE}", "{seen_dir}", "--", "{{python}}", "train.py", "--steps", "30",
           "--checkpoint-every", "10", "--seed", "0"]
workdir = "{EXAMPLES / 'ddp'}"
launcher = "torchrun"
nodes = 3
gpus_per_node = 2
max_runtime = "10m"
[env]
OMP_NUM_THREADS = "1"
[checkpoint]
dir = "{ckpt}"
owner = "rank0"
[log]
loss_pattern = 'loss[=:]\\s*([0-9.eE+-]+)'
''')
    waiter = subprocess.Popen([sys.executable, "-m", "tui.cli", "launch", str(spec), "--wait", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli.env, cwd=ROOT)
    running: dict[str, tuple[str, str, str]] = {}
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and waiter.poll() is None and not running:
            running = {j: v for j, v in squeue(slurm).items() if v[0].startswith("rigdeck:ddp-slurm")
                       and v[1] == "RUNNING"}
            time.sleep(0.2)
        out, err = waiter.communicate(timeout=300)
    finally:
        if waiter.poll() is None:
            waiter.kill()
    assert waiter.returncode == 0, out[-3000:] + err[-3000:]
    view = json.loads(out)
    assert view["state"] == "succeeded", json.dumps(view, indent=1)[-3000:]
    slurm_job = view["slurm"]["job_id"]
    # squeue showed it running, under rigdeck's job name, on all three nodes
    assert running == {slurm_job: (f"rigdeck:{view['job_id']}", "RUNNING",
                                   f"{slurm.node(1)[:-1]}[1-3]")}, running
    assert view["slurm"]["state"] == "COMPLETED", view["slurm"]
    assert sorted(n["host"] for n in view["placement"]) == ["h1", "h2", "h3"]
    # the ranks: Slurm's GPUs, rigdeck's cluster files of Slurm's allocation
    seen = {p.stem: json.loads(p.read_text()) for p in seen_dir.glob("*.json")}
    assert len(seen) == 6, sorted(seen)
    by_host = {n["host"]: n for n in view["placement"]}
    primary = view["placement"][0]
    for name, s in seen.items():
        host = next(h for h in by_host if slurm.node(h) == s["SLURMD_NODENAME"])
        assert s["SLURM_JOB_ID"] == slurm_job, (name, s)
        gpus = [int(g) for g in s["SLURM_JOB_GPUS"].split(",")]
        assert gpus == by_host[host]["gpus"] and len(gpus) == 2, (name, s, by_host[host])
        assert s["CUDA_VISIBLE_DEVICES"] == s["SLURM_JOB_GPUS"], (name, s)  # torchrun's ranks share the node's
        assert s["SM_CURRENT_HOST"] == host and json.loads(s["SM_HOSTS"]) == ["h1", "h2", "h3"], (name, s)
        tf = json.loads(s["TF_CONFIG"])["cluster"]
        assert tf["chief"] == [f"{primary['address']}:{tf['chief'][0].split(':')[1]}"], tf
        assert sorted(a.split(":")[0] for a in tf["chief"] + tf["worker"]) == sorted(
            n["address"] for n in view["placement"]), tf
        assert s["MASTER_ADDR"] == primary["address"] and s["WORLD_SIZE"] == "6", (name, s)
        if s["LOCAL_RANK"] != "0":
            continue
        # the real sagemaker-training reader, on the tree the host's ranks saw (its state dir)
        s["SAGEMAKER_BASE_DIR"] = s["SAGEMAKER_BASE_DIR"].replace(
            "/root/.rigdeck", str(slurm.bed.host(host).state_dir), 1)
        reads = sagemaker_reads(s)
        assert (reads["current_host"], reads["hosts"], reads["master"]) == (
            host, ["h1", "h2", "h3"], primary["host"]), (name, reads)
        assert s["SM"]["SM_NUM_GPUS"] == "2", (name, s["SM"])
    # rigdeck's status: loss, steps, checkpoint owner, Slurm's job
    status = cli.run("status", view["job_id"]).stdout
    assert f"slurm    job {slurm_job} COMPLETED (submitted on h1)" in status, status
    assert "progress step 29 loss " in status, status
    assert f"checkpoint owner {view['placement'][0]['host']} rank 0" in status, status
    metrics = cli.json("metrics", view["job_id"])
    steps = {(m["rank"], m["step"]) for m in metrics if m.get("loss") is not None and m.get("event") is None}
    assert {r for r, _ in steps} == set(range(6)) and max(s for _, s in steps) == 29
    assert any(m.get("event") == "checkpoint" and m.get("status") == "done" for m in metrics)


@pytest.mark.testbed
def test_the_mpi_example_through_slurm_runs_every_rank_inside_slurms_job(slurm: SlurmBed, tmp_path: Path) -> None:
    """mpirun on the primary, inside the allocation: Open MPI starts its daemons with Slurm's own
    srun, on Slurm's node names (the inventory gives Open MPI no ssh between the nodes), so every
    rank runs in the Slurm job, two a node in rank order, each on one of the GPUs Slurm gave its
    node; the example trains to its end."""
    cli = slurm_cli(slurm, tmp_path, timeout=300)
    seen_dir = tmp_path / "seen"
    seen_dir.mkdir()
    spec = cli.spec("mpi-slurm", f'''
command = ["{{python}}", "{PROBE}", "{seen_dir}", "--", "{{python}}", "train.py", "--steps", "20"]
workdir = "{EXAMPLES / 'mpi'}"
launcher = "mpirun"
nodes = 3
gpus_per_node = 2
max_runtime = "10m"
[env]
OMP_NUM_THREADS = "1"
[log]
loss_pattern = 'loss[=:]\\s*([0-9.eE+-]+)'
''')
    assert "OMPI_MCA_plm_rsh_args" not in cli.inventory.read_text()  # no ssh given to Open MPI
    view = cli.json("launch", str(spec), "--wait")
    slurm_job = view["slurm"]["job_id"]
    assert view["slurm"]["state"] == "COMPLETED", view["slurm"]
    hosts = [n["host"] for n in view["placement"]]
    by_host = {n["host"]: n for n in view["placement"]}
    seen = [json.loads(p.read_text()) for p in seen_dir.glob("*.json")]
    assert len(seen) == 6, [p.name for p in seen_dir.glob("*.json")]
    ranks: dict[str, list[int]] = {}
    for s in seen:
        assert s["SLURM_JOB_ID"] == slurm_job, s  # in Slurm's job: srun started it
        host = next(h for h in hosts if slurm.node(h) == s["SLURMD_NODENAME"])
        assert int(s["CUDA_VISIBLE_DEVICES"]) in by_host[host]["gpus"], (s, by_host[host])
        assert s["WORLD_SIZE"] == "6" and s["SM_CURRENT_HOST"] == host, s
        ranks.setdefault(host, []).append(int(s["RANK"]))
    assert [sorted(ranks[h]) for h in hosts] == [[0, 1], [2, 3], [4, 5]], ranks
    gpus = {h: sorted(int(s["CUDA_VISIBLE_DEVICES"]) for s in seen
                      if slurm.node(h) == s["SLURMD_NODENAME"]) for h in hosts}
    assert all(g == sorted(by_host[h]["gpus"]) for h, g in gpus.items()), gpus  # one GPU a rank
    metrics = cli.json("metrics", view["job_id"])
    assert {m["rank"] for m in metrics if m.get("loss") is not None} == set(range(6))


@pytest.mark.testbed
def test_a_sweeps_trials_are_slurm_jobs_run_side_by_side_as_slurm_allows(slurm: SlurmBed, tmp_path: Path) -> None:
    """The sweep example, 3 trials, 2 at a time, on a Slurm cluster: each trial is a job of its
    own that Slurm ran (its Slurm job completed), and the sweep finds its best."""
    cli = slurm_cli(slurm, tmp_path, timeout=300)
    text = (EXAMPLES / "sweep" / "sweep.toml").read_text()
    assert "max_trials = 30" in text and 'workdir = "."' in text
    spec = tmp_path / "sweep.toml"
    spec.write_text(text.replace("max_trials = 30", "max_trials = 3\nmax_parallel = 2")
                    .replace('workdir = "."', f'workdir = "{EXAMPLES / "sweep"}"'))
    out = cli.run("sweep", str(spec), "--wait").stdout
    assert "trials: 3 of 3 asked; 3 completed" in out, out
    trials = [j for j in cli.json("jobs") if j["job_id"].startswith("sweep-lr-t")]
    assert len(trials) == 3, trials
    slurm_jobs = set()
    for j in trials:
        # (rigdeck records the trial's end when its job hosts report it; Slurm's job, whose batch
        # script ran them, completes a moment later: fresh run 24 read it RUNNING in between)
        def ended(job_id: str = j["job_id"]) -> Any:
            v = cli.json("status", job_id)
            return v if v["slurm"]["state"] not in ("RUNNING", "COMPLETING") else None
        view = wait_until(ended, 60, f"Slurm's end of {j['job_id']}")
        assert view["state"] == "succeeded" and view["slurm"]["state"] == "COMPLETED", view["slurm"]
        slurm_jobs.add(view["slurm"]["job_id"])
    assert len(slurm_jobs) == 3  # a Slurm job each


@pytest.mark.testbed
def test_stop_cancels_the_slurm_job_and_leaves_no_process(slurm: SlurmBed, tmp_path: Path) -> None:
    """`rigdeck stop` of a running job Slurm runs: its job hosts stop their ranks, scancel ends
    Slurm's job (Slurm says CANCELLED), and no process of it is left on any node."""
    cli = slurm_cli(slurm, tmp_path)
    spec = cli.spec("tick-slurm", f'''command = ["{{python}}", "{TICKER}", "--steps", "100000", "--sleep", "0.2"]
workdir = "/"
launcher = "direct"
nodes = 3
gpus_per_node = 1
''')
    view = cli.json("launch", str(spec))
    job_id, slurm_job = view["job_id"], view["slurm"]["job_id"]
    try:
        running_ranks(cli, job_id, 3)
        assert squeue(slurm)[slurm_job][:2] == (f"rigdeck:{job_id}", "RUNNING"), squeue(slurm)
        assert job_processes(slurm, job_id, slurm_job), "the job runs inside Slurm's step"
        stopped = cli.json("stop", job_id)
        assert stopped["state"] == "stopped", json.dumps(stopped, indent=1)[-2000:]
        assert stopped["slurm"]["state"] == "CANCELLED", stopped["slurm"]
        assert job_processes(slurm, job_id, slurm_job) == []
        assert slurm_job not in squeue(slurm)
        status = cli.run("status", job_id).stdout
        assert f"slurm    job {slurm_job} CANCELLED" in status, status
    finally:
        slurm.run(["scancel", slurm_job], check=False)


@pytest.mark.testbed
def test_a_partition_slurm_does_not_know_is_refused_before_sbatch(slurm: SlurmBed, tmp_path: Path) -> None:
    """A spec's [slurm] partition Slurm has not: refused naming it, with Slurm's word, and nothing
    submitted; a request Slurm itself refuses (more GPUs than a node has) shows sbatch's words."""
    cli = slurm_cli(slurm, tmp_path)
    body = 'command = ["true"]\nworkdir = "/"\nlauncher = "direct"\nnodes = 1\ngpus_per_node = {n}\n'
    spec = cli.spec("bad-partition", body.format(n=1) + '[slurm]\npartition = "gpu"\n')
    refused = cli.run("launch", str(spec), check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert (f"{spec}: [slurm] partition 'gpu': Slurm has no such partition: Partition gpu not found"
            in refused.stderr), refused.stderr
    too_many = cli.run("launch", str(cli.spec("eight-gpus", body.format(n=8))), check=False)
    assert too_many.returncode == 2, too_many.stdout + too_many.stderr
    assert ("Slurm refused the job (sbatch on h1: sbatch: error: Batch job submission failed: "
            "Requested node configuration is not available)") in too_many.stderr, too_many.stderr
    assert squeue(slurm) == {}, "nothing was submitted"
    assert cli.json("jobs") == [], "nothing was launched"


@pytest.mark.testbed
def test_rigdecks_drain_drains_the_node_in_slurm_and_undrain_resumes_it(slurm: SlurmBed, tmp_path: Path) -> None:
    """On a Slurm cluster a drain of rigdeck's (an operator's, or healing's after a GPU fault: the
    same call) drains the host's node in Slurm, naming rigdeck, the host and GPU; undrain resumes
    it once rigdeck keeps no drain of the host. A node someone else drained keeps their drain."""
    cli = slurm_cli(slurm, tmp_path)
    node = slurm.node(2)

    def reason() -> str:
        return slurm.run(["sinfo", "-h", "-N", "-n", node, "-o", "%E"]).stdout.strip()
    try:
        cli.run("drain", "h2:1", "h2:3", "--reason", "XID 79")
        assert slurm.node_states()[node] == "drain" and reason() == "rigdeck: h2 GPU 3 XID 79", reason()
        cli.run("undrain", "h2:1")
        assert slurm.node_states()[node] == "drain", "rigdeck still drains GPU 3 of h2"
        cli.run("undrain", "h2:3")
        # resumed: idle (a '*' is Slurm's "not responding yet" mark, which its next ping clears)
        assert slurm.node_states()[node].rstrip("*") == "idle", slurm.node_states()
        slurm.run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", "Reason=admin: fan"])
        cli.run("drain", "h2", "--reason", "maintenance")
        assert reason() == "admin: fan", "another's drain and reason are kept"
        cli.run("undrain", "h2")
        assert slurm.node_states()[node] == "drain" and reason() == "admin: fan", "and not resumed by rigdeck"
    finally:
        slurm.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)


def write_faults(slurm: SlurmBed, host: str, faults: dict[str, Any]) -> None:
    """The simulated GPU faults of ``host`` (its agent reads them at its next sample)."""
    path = slurm.bed.host(host).state_dir / "sim-gpu-faults.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(faults))
    tmp.replace(path)


def sinfo_reasons(slurm: SlurmBed) -> dict[str, str]:
    """``sinfo -R``: Slurm node -> why it is drained (or down), in full."""
    out = slurm.run(["sinfo", "-R", "--noheader", "--format=%n|%E"]).stdout
    return {p[0].strip(): p[1].strip() for p in (line.split("|", 1) for line in out.splitlines() if "|" in line)}


@pytest.mark.testbed
def test_an_xid_79_under_a_slurm_job_drains_its_node_in_slurm_and_the_job_resumes_elsewhere(
        slurm: SlurmBed, tmp_path: Path) -> None:
    """Issue 47, acceptance 3. h1's node is drained by hand in Slurm: Slurm would otherwise place
    first there, and never does. The job runs on another node; an XID 79 on one of its GPUs
    drains that node in Slurm (sinfo -R: rigdeck, the host, the GPU, the XID), Slurm's job is
    ended and a new one submitted (with --exclude of the node), and the job resumes from its
    checkpoint on the third node and succeeds with each step once. `rigdeck undrain` resumes
    the node in Slurm; the drain by hand stays."""
    cli = slurm_cli(slurm, tmp_path, timeout=120)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    by_hand = slurm.node(1)
    slurm.run(["scontrol", "update", f"NodeName={by_hand}", "State=DRAIN", "Reason=admin: fan"])
    spec = cli.spec("xid-slurm", f'''
command = ["{{python}}", "{HEAL_TRAIN}", "--steps", "16", "--ckpt", "{ckpt}", "--sleep", "0.3",
           "--checkpoint-every", "4", "--first-attempt-holds"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 1
gpus_per_node = 2
[env]
OMP_NUM_THREADS = "1"
[restart]
max_restarts = 1
''')
    host, gpu, node = "", -1, ""
    try:
        waiter = cli.popen("launch", str(spec), "--wait", "--json")
        try:
            def stepping() -> str:
                jobs = [j["job_id"] for j in cli.json("jobs") if j["name"] == "xid-slurm" and j["state"] == "running"]
                return jobs[0] if jobs and (cli.json("status", jobs[0]).get("last_step") or 0) >= 6 else ""
            job_id = wait_until(stepping, 180, "the job's step 6", step=0.5)
            first = cli.json("status", job_id)
            (where,) = first["placement"]
            host, gpu, first_slurm = where["host"], where["gpus"][1], first["slurm"]["job_id"]
            node = slurm.node(host)
            assert host != "h1", "Slurm placed on a node drained by hand"
            write_faults(slurm, host, {str(gpu): {"xid": 79}})
            out, err = waiter.communicate(timeout=240)
        finally:
            if waiter.poll() is None:
                waiter.kill()
                waiter.communicate()
            if host:
                write_faults(slurm, host, {})
        assert waiter.returncode == 0, out[-3000:] + err[-3000:]
        final = json.loads(out)
        assert final["state"] == "succeeded" and final["restarts"] == 1, json.dumps(final, indent=1)[-3000:]
        incident = next(e for e in final["events"] if e.get("event") == "incident")["cause"]
        assert (incident["kind"], incident["host"], incident["gpu"]) == ("gpu", host, gpu), incident
        assert "XID 79" in incident["message"], incident
        # drained in Slurm, naming rigdeck, the host, the GPU and the XID
        reasons = sinfo_reasons(slurm)
        print("sinfo -R:", *(f"{n}: {r}" for n, r in sorted(reasons.items())), sep="\n  ")
        assert reasons[node].startswith(f"rigdeck: {host} GPU {gpu} XID 79"), reasons
        assert reasons[by_hand] == "admin: fan", reasons
        assert slurm.node_states()[node] == "drain", slurm.node_states()
        # the first Slurm job ended, a new one ran on the third node, excluding the drained one
        ended = next(e for e in final["events"] if e.get("event") == "slurm job ended")
        print(f"first Slurm job {first_slurm} on {host}: {ended}; then Slurm job {final['slurm']['job_id']} "
              f"on {final['slurm'].get('nodes')} (excluded {final['slurm'].get('excluded')})")
        assert ended["slurm_job_id"] == first_slurm, ended
        assert final["slurm"]["job_id"] != first_slurm and final["slurm"]["state"] == "COMPLETED", final["slurm"]
        assert final["slurm"]["excluded"] == [node], final["slurm"]
        assert [n["host"] for n in final["placement"]] == ["h3" if host == "h2" else "h2"], final["placement"]
        assert first_slurm not in squeue(slurm)
        # resumed from its checkpoint; each (rank, step) once
        assert "resumed from step" in cli.run("logs", job_id, "--rank", "0").stdout
        metrics = cli.json("metrics", job_id)
        steps = [(m["rank"], m["step"]) for m in metrics if m.get("event") is None and m.get("step") is not None]
        assert sorted(steps) == [(r, s) for r in range(2) for s in range(1, 17)], steps
        (drain,) = cli.json("drains")
        assert (drain["host"], drain["gpu"], drain["source"]) == (host, gpu, "health"), drain
        # rigdeck's undrain resumes the node in Slurm; the drain by hand is another's: kept
        cli.run("undrain", f"{host}:{gpu}")
        assert slurm.node_states()[node].rstrip("*") == "idle", slurm.node_states()
        assert slurm.node_states()[by_hand] == "drain" and sinfo_reasons(slurm) == {by_hand: "admin: fan"}
    finally:
        for n in (by_hand, node):
            if n:
                slurm.run(["scontrol", "update", f"NodeName={n}", "State=RESUME"], check=False)


@pytest.mark.testbed
def test_a_job_slurm_queues_is_left_to_its_nodes_and_runs_with_nobody_watching(slurm: SlurmBed,
                                                                               tmp_path: Path) -> None:
    """The cluster full (another user's job holds every GPU): `rigdeck launch` returns once Slurm
    has queued the job (pending, Slurm's reason), having left a template of its plan on every
    node. Nobody watches: no rigdeck command runs, and the job's record is not touched while
    Slurm runs it, once the other job ends, on the nodes it chooses; those nodes start it from
    their templates and Slurm's allocation, and it trains to its end with each step once. The
    next look records where Slurm ran it and how it ended."""
    from tests.slurmbed import OTHER_USER
    from tui.control.history import History

    cli = slurm_cli(slurm, tmp_path, timeout=300)
    ckpt = tmp_path / "ckpt"
    spec = cli.spec("queued-ddp", f'''
command = ["{{python}}", "train.py", "--steps", "20", "--checkpoint-every", "10", "--seed", "0"]
workdir = "{EXAMPLES / 'ddp'}"
launcher = "torchrun"
nodes = 2
gpus_per_node = 1
max_runtime = "10m"
[env]
OMP_NUM_THREADS = "1"
[checkpoint]
dir = "{ckpt}"
owner = "rank0"
[log]
loss_pattern = 'loss[=:]\\s*([0-9.eE+-]+)'
''')
    out = slurm.run(["sbatch", "--parsable", "-N", "3", "--gres=gpu:4", "--chdir=/tmp", f"--output={slurm.out}/%j.out",
                     "--wrap", "sleep 600"], user=OTHER_USER).stdout
    big = out.strip().split(";")[0]
    slurm_job = ""
    try:
        wait_until(lambda: squeue(slurm).get(big, ("", ""))[1] == "RUNNING", timeout=60, what="the blocker runs")

        def templates() -> dict[str, set[Path]]:
            return {h: set((slurm.bed.host(h).state_dir / "jobs").glob(".slurm-*.template.json"))
                    for h in ("h1", "h2", "h3")}
        before = templates()  # (earlier tests' jobs leave theirs on the nodes Slurm did not give them)
        said = cli.run("launch", str(spec)).stdout
        assert said.startswith("submitted queued-ddp-"), said
        assert "Slurm queues it: the nodes Slurm gives start it" in said, said
        view = cli.json("status", said.split()[1].rstrip(":"))
        job_id, slurm_job = view["job_id"], view["slurm"]["job_id"]
        assert f"Slurm job {slurm_job} PENDING ({view['slurm']['reason']})" in said, said
        assert view["state"] == "pending" and view["slurm"]["state"] == "PENDING", json.dumps(view, indent=1)
        assert view["slurm"]["reason"] in ("Resources", "Priority"), view["slurm"]
        assert view["placement"] == [], view["placement"]
        status = cli.run("status", job_id).stdout
        assert f"slurm    job {slurm_job} PENDING ({view['slurm']['reason']})" in status, status
        new = {h: sorted(t - before[h]) for h, t in templates().items()}
        assert all(len(t) == 1 for t in new.values()), new  # on every node Slurm may choose
        assert len({t[0].name for t in new.values()}) == 1  # one template, named in the step's argv
        assert all(t[0].stat().st_mode & 0o077 == 0 for t in new.values())  # private: it holds the env
        history = History(Path(cli.env["RIGDECK_HOME"]) / "history.sqlite")
        before = history.get(job_id)
        slurm.run(["scancel", big])  # the cluster frees up; nobody runs rigdeck from here on

        steps_argv: set[tuple[str, ...]] = set()

        def ended_on_hosts() -> dict[str, str]:
            for p in psutil.process_iter(["cmdline"]):  # each node's task of the Slurm step
                argv = tuple(p.info["cmdline"] or ())
                if "slurmhost" in argv and job_id in argv:
                    steps_argv.add(argv[:argv.index("slurmhost")])
            states = {}
            for h in ("h1", "h2", "h3"):
                f = slurm.bed.host(h).state_dir / "jobs" / job_id / "state.json"
                if f.exists():
                    states[h] = json.loads(f.read_text()).get("state")
            return states if len(states) == 2 and all(s in ("succeeded", "failed") for s in states.values()) else {}
        ran = wait_until(ended_on_hosts, timeout=240, what="the job's nodes end it on their own")
        assert set(ran.values()) == {"succeeded"}, ran
        # every node's task started from the agent's unpacked copy: one interpreter, no zipapp
        # (srun's own argv included: it names the same command)
        assert steps_argv and all(a[-1].endswith("/unpacked") and a[-2] == "-S" for a in steps_argv), steps_argv
        # each node Slurm gave made its plan of its template and took it away; the others keep theirs
        assert sorted(h for h, t in new.items() if t[0].exists()) == sorted({"h1", "h2", "h3"} - set(ran))
        assert history.get(job_id) == before  # nobody looked: the record is as the launch left it
        # The next look: where Slurm ran it, and its end.
        view = cli.json("status", job_id)
        assert view["state"] == "succeeded", json.dumps(view, indent=1)[-3000:]
        assert sorted(n["host"] for n in view["placement"]) == sorted(ran), view["placement"]
        assert all(len(n["gpus"]) == 1 for n in view["placement"]), view["placement"]
        assert view["slurm"]["state"] == "COMPLETED", view["slurm"]
        metrics = cli.json("metrics", job_id)
        steps = [(m["rank"], m["step"]) for m in metrics if m.get("loss") is not None and m.get("event") is None]
        assert sorted(steps) == sorted({(r, s) for r in range(2) for s in range(20)}), sorted(steps)
    finally:
        slurm.run(["scancel", big, *([slurm_job] if slurm_job else [])], check=False)


@pytest.mark.testbed
def test_a_queued_slurm_job_is_stopped_while_it_waits_and_launch_wait_follows_one_to_its_end(
        slurm: SlurmBed, tmp_path: Path) -> None:
    """While another user's job holds every GPU: `rigdeck stop` of a job Slurm queues cancels it in
    Slurm (stopped, CANCELLED; no node ever runs it), and `rigdeck launch --wait` of another
    returns with its end once Slurm has run it on the nodes it freed."""
    from tests.slurmbed import OTHER_USER
    from tui.control.history import History

    cli = slurm_cli(slurm, tmp_path, timeout=300)
    spec = cli.spec("queued-tick", f'''command = ["{{python}}", "{TICKER}", "--steps", "5", "--sleep", "0.1"]
workdir = "/"
launcher = "direct"
nodes = 2
gpus_per_node = 2
''')
    big = slurm.run(["sbatch", "--parsable", "-N", "3", "--gres=gpu:4", "--chdir=/tmp", f"--output={slurm.out}/%j.out",
                     "--wrap", "sleep 600"], user=OTHER_USER).stdout.strip().split(";")[0]
    ours: list[str] = []
    waiter = None
    try:
        wait_until(lambda: squeue(slurm).get(big, ("", ""))[1] == "RUNNING", timeout=60, what="the blocker runs")
        first = cli.json("launch", str(spec))
        ours.append(first["slurm"]["job_id"])
        assert first["state"] == "pending", first
        stopped = cli.json("stop", first["job_id"])
        assert stopped["state"] == "stopped" and stopped["slurm"]["state"] == "CANCELLED", stopped
        assert first["slurm"]["job_id"] not in squeue(slurm)
        assert not any((slurm.bed.host(h).state_dir / "jobs" / first["job_id"]).exists() for h in ("h1", "h2", "h3"))
        waiter = subprocess.Popen([sys.executable, "-m", "tui.cli", "launch", str(spec), "--wait", "--json"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli.env, cwd=ROOT)
        wait_until(lambda: [j for j, v in squeue(slurm).items() if v[0].startswith("rigdeck:queued-tick")
                            and v[1] == "PENDING"], timeout=120, what="the second job pends in Slurm")
        history = History(Path(cli.env["RIGDECK_HOME"]) / "history.sqlite")
        wait_until(lambda: [r for r in history.list() if r["job_id"] != first["job_id"]
                            and (r.get("slurm") or {}).get("nodes_start")], timeout=120,
                   what="the launch leaves the job to its nodes")
        slurm.run(["scancel", big])
        out, err = waiter.communicate(timeout=240)
        assert waiter.returncode == 0, out[-3000:] + err[-3000:]
        view = json.loads(out)
        ours.append(view["slurm"]["job_id"])
        assert view["state"] == "succeeded" and view["slurm"]["nodes_start"] is True, json.dumps(view, indent=1)[-3000:]
        assert len(view["placement"]) == 2 and all(len(n["gpus"]) == 2 for n in view["placement"]), view["placement"]
    finally:
        if waiter is not None and waiter.poll() is None:
            waiter.kill()
        slurm.run(["scancel", big, *ours], check=False)


def sacct_ended(slurm: SlurmBed, *jobs: str) -> dict[str, int]:
    """Slurm job id -> its ElapsedRaw in Slurm's accounting, once sacct has each one's end."""
    def read() -> dict[str, int]:
        out = slurm.run(["sacct", "-X", "-n", "-P", "-o", "JobIDRaw,State,ElapsedRaw", "-j", ",".join(jobs)],
                        check=False).stdout
        rows = [line.split("|") for line in out.splitlines() if line.strip()]
        done = {r[0]: int(r[2]) for r in rows if len(r) == 3 and r[1] not in ("RUNNING", "PENDING", "COMPLETING")}
        return done if set(done) == set(jobs) else {}
    return wait_until(read, timeout=60, what=f"sacct has the end of {', '.join(jobs)}")


@pytest.mark.testbed
def test_usage_on_slurm_is_slurms_accounting_of_every_users_jobs(slurm: SlurmBed, tmp_path: Path) -> None:
    """This file's Slurm keeps accounting (slurmdbd): `rigdeck usage` adds up Slurm's own figures
    (sacct): another user's job of 2 nodes x 2 GPUs and a rigdeck job through Slurm of 1 GPU,
    each its GPUs times the time Slurm accounted it; rigdeck's under its rigdeck job id, the
    other's as slurm:<id>; by user, nobody's hours are nobody's."""
    from tests.slurmbed import OTHER_USER

    cli = slurm_cli(slurm, tmp_path, timeout=300)
    other = slurm.run(["sbatch", "--parsable", "-N", "2", "--gres=gpu:2", "--chdir=/tmp",
                       f"--output={slurm.out}/%j.out", "--wrap", "sleep 2"], user=OTHER_USER).stdout.strip()
    spec = cli.spec("counted", f'''command = ["{{python}}", "{TICKER}", "--steps", "5", "--sleep", "0.2"]
workdir = "/"
launcher = "direct"
nodes = 1
gpus_per_node = 1
''')
    view = cli.json("launch", str(spec), "--wait")
    assert view["state"] == "succeeded", json.dumps(view, indent=1)[-2000:]
    ours = view["slurm"]["job_id"]
    elapsed = sacct_ended(slurm, other, ours)

    def counted() -> dict[str, Any] | None:
        # (a job's end reaches a query by time a moment after one by its id: slurmdbd keeps it then)
        got = cli.json("usage", "--by", "job")
        return got if view["job_id"] in {r["key"] for r in got["rows"]} else None
    report = wait_until(counted, timeout=60, what="rigdeck usage counts the rigdeck job")
    assert report["source"] == "sacct on h1" and report["note"] is None, report
    rows = {r["key"]: r for r in report["rows"]}
    assert rows[f"slurm:{other}"]["gpu_hours"] == pytest.approx(4 * elapsed[other] / 3600.0, abs=1e-9), rows
    assert rows[view["job_id"]]["gpu_hours"] == pytest.approx(1 * elapsed[ours] / 3600.0, abs=1e-9), rows
    assert rows[view["job_id"]]["jobs"] == 1 and elapsed[other] >= 2, (rows, elapsed)
    text = cli.run("usage").stdout
    assert text.splitlines()[0] == "from Slurm's accounting (sacct on h1): every user's Slurm jobs", text
    print(text)
    by_user = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()[3:-1]}
    assert by_user[OTHER_USER] >= 4 * elapsed[other] / 3600.0 - 0.0005, text  # (its earlier tests' jobs too)


@pytest.mark.testbed
def test_a_job_pinned_to_hosts_runs_on_exactly_their_slurm_nodes(slurm: SlurmBed, tmp_path: Path) -> None:
    """A spec's ``hosts`` through Slurm: sbatch gets ``--nodelist`` of their nodes, and each rank
    runs on one of them, whichever Slurm would have chosen."""
    cli = slurm_cli(slurm, tmp_path)
    spec = cli.spec("pinned", '''command = ["sh", "-c", "echo on $(hostname)"]
workdir = "/"
launcher = "direct"
hosts = ["h3", "h2"]
gpus_per_node = 1
''')
    view = cli.json("launch", str(spec), "--wait", timeout=180)
    assert view["state"] == "succeeded", json.dumps(view, indent=1)[-3000:]
    assert sorted(n["host"] for n in view["placement"]) == ["h2", "h3"], view["placement"]
    logs = cli.run("logs", view["job_id"]).stdout
    assert sorted(line.split("on ", 1)[1] for line in logs.splitlines() if "on " in line) == [
        slurm.node(2), slurm.node(3)], logs


@pytest.mark.testbed
def test_a_processing_job_through_slurm_shards_its_inputs_over_the_nodes_slurm_gave(slurm: SlurmBed,
                                                                                    tmp_path: Path) -> None:
    """A SageMaker Processing job (kind = "processing", no GPUs) through Slurm on 3 nodes: each
    file of a ShardedByKey input reaches exactly one node Slurm gave, the processing tree's
    resourceconfig names that node's host, and Slurm ran it (COMPLETED)."""
    cli = slurm_cli(slurm, tmp_path, timeout=300)
    source = tmp_path / "raw"
    source.mkdir()
    for i in range(12):
        (source / f"file{i:02d}.txt").write_text(f"record {i}\n")
    spec = cli.spec("proc-slurm", f"""
kind = "processing"
command = ["{{python}}", "{ROOT / 'tests' / 'jobscripts' / 'list_inputs.py'}"]
workdir = "{ROOT}"
nodes = 3
max_runtime = "5m"
[[processing.inputs]]
name = "sharded"
source = "{source}"
distribution = "ShardedByKey"
[[processing.outputs]]
name = "seen"
""")
    view = cli.json("launch", str(spec), "--wait", timeout=240)
    assert view["state"] == "succeeded", json.dumps(view, indent=1)[:3000]
    assert view["slurm"]["state"] == "COMPLETED", view["slurm"]
    hosts = [n["host"] for n in view["placement"]]
    assert sorted(hosts) == ["h1", "h2", "h3"], hosts
    together = []
    for h in slurm.bed.hosts:
        base = h.state_dir / "jobs" / view["job_id"] / "processing"
        config = json.loads((base / "config" / "resourceconfig.json").read_text())
        assert config == {"current_host": h.name, "hosts": hosts}, config
        together += (base / "output" / "seen" / "sharded.txt").read_text().splitlines()
    assert sorted(together) == sorted(f"{p.name}\trecord {int(p.stem[4:])}" for p in source.glob("*.txt")), together


@pytest.mark.testbed
def test_a_pool_job_through_slurm_packs_its_replicas_into_one_allocation(slurm: SlurmBed, tmp_path: Path) -> None:
    """Vertex's four worker pools through Slurm: one Slurm job of 3 nodes x 1 GPU (rigdeck's own
    packing of the 5 replicas says the shape), the replicas packed on the nodes and GPUs Slurm
    gave, each replica's cluster files (CLUSTER_SPEC, TF_CONFIG, torch's world of the primary
    and workers) checked from inside it; the primary's success ends the job in Slurm too."""
    cli = slurm_cli(slurm, tmp_path, timeout=300)
    hold = ROOT / "tests" / "jobscripts" / "probe_then_wait.py"
    probe = ROOT / "tests" / "probe_rank.py"
    spec = cli.spec("pools-slurm", f"""
command = ["{{python}}", "{probe}"]
workdir = "{ROOT}"
max_runtime = "5m"
grace = "5s"
[env]
OMP_NUM_THREADS = "1"
[[pools]]
role = "primary"
gpus_per_replica = 1
[[pools]]
role = "worker"
replicas = 2
gpus_per_replica = 1
[[pools]]
role = "parameter_server"
command = ["{{python}}", "{hold}"]
[[pools]]
role = "evaluator"
command = ["{{python}}", "{hold}"]
""")
    view = cli.json("launch", str(spec), "--wait", timeout=240)
    assert view["state"] == "succeeded", json.dumps(view, indent=1)[:4000]
    sid = view["slurm"]["job_id"]
    nodes = view["placement"]
    assert [(n["pool"], n["replica"]) for n in nodes] == [
        ("primary", 0), ("worker", 0), ("worker", 1), ("parameter_server", 0), ("evaluator", 0)], nodes
    assert sorted({n["host"] for n in nodes}) == ["h1", "h2", "h3"], nodes
    assert [len(n["gpus"]) for n in nodes] == [1, 1, 1, 0, 0], nodes
    # One Slurm job of 3 nodes, one GPU each: the GPUs of the replicas are those Slurm gave.
    acct = slurm.run(["sacct", "-X", "-n", "-P", "-j", sid, "--format=NNodes,AllocTRES,State"]).stdout.split("|")
    assert acct[0] == "3" and "gres/gpu=3" in acct[1], acct

    def ended() -> Any:  # (the primary's success ends the job; Slurm's job completes a moment later)
        v = cli.json("status", view["job_id"])
        return v if v["slurm"]["state"] not in ("RUNNING", "COMPLETING") else None
    assert wait_until(ended, 60, "Slurm's end of the pool job")["slurm"]["state"] == "COMPLETED"
    reports = []
    for h in slurm.bed.hosts:
        for p in sorted((h.state_dir / "jobs" / view["job_id"] / "probe").glob("*.json")):
            reports.append({**json.loads(p.read_text()), "_host": h.name})
    assert len(reports) == 5 and all(r["ok"] for r in reports), [(r["_host"], r["failures"]) for r in reports]

    def task(r: dict[str, Any], name: str) -> Any:
        v = r["values"][name]
        return (json.loads(v) if isinstance(v, str) else v)["task"]
    vertex = {"primary": "workerpool0", "worker": "workerpool1", "parameter_server": "workerpool2",
              "evaluator": "workerpool3"}
    by_task = {(task(r, "CLUSTER_SPEC")["type"], task(r, "CLUSTER_SPEC")["index"]): r for r in reports}
    for n in nodes:
        r = by_task[(vertex[n["pool"]], n["replica"])]
        assert r["_host"] == n["host"], (n, r["_host"])
        assert (r["values"].get("WORLD_SIZE") == "3") == (n["pool"] in ("primary", "worker")), r["values"]
        print(f"{n['pool']:>16} {n['replica']} on {n['host']} GPUs {n['gpus']}: CLUSTER_SPEC task "
              f"{task(r, 'CLUSTER_SPEC')}, TF_CONFIG task {task(r, 'TF_CONFIG')}, checks {len(r['checks'])} ok")
    pools = {p["role"]: p["state"] for p in view["pools"]}
    assert pools["primary"] == "succeeded" and pools["parameter_server"] == "stopped", pools
    print(f"Slurm job {sid}: sacct {acct}")


@pytest.mark.testbed
def test_a_pipelines_steps_are_slurm_jobs_and_their_files_reach_the_next_steps_nodes(slurm: SlurmBed,
                                                                                      tmp_path: Path) -> None:
    """The pipeline example (preprocess on 3 nodes -> DDP train on 2 -> evaluate -> register) on a
    Slurm cluster: every step is a Slurm job of its own that Slurm completed, each step's files
    reach the next step's nodes (evaluate scores the model train made on preprocess's shards)."""
    cli = slurm_cli(slurm, tmp_path, timeout=300)
    out = cli.json("pipeline", str(EXAMPLES / "pipeline-steps" / "pipeline.toml"), "--wait", timeout=280)
    assert out["row"]["state"] == "succeeded", json.dumps(out, indent=1)[-4000:]
    steps = {s["name"]: s for s in out["steps"]}
    assert [s["name"] for s in out["steps"]] == ["preprocess", "train", "evaluate", "register"]
    assert dict(steps["evaluate"]["metrics"])["accuracy"] >= 0.9, steps["evaluate"]
    slurm_jobs = {}
    for name, step in steps.items():
        def ended(job_id: str = step["job_id"]) -> Any:  # (Slurm completes a moment after rigdeck's end)
            v = cli.json("status", job_id)
            return v if v["slurm"]["state"] not in ("RUNNING", "COMPLETING") else None
        view = wait_until(ended, 60, f"Slurm's end of step {name}")
        assert view["state"] == "succeeded" and view["slurm"]["state"] == "COMPLETED", (name, view["slurm"])
        slurm_jobs[name] = (view["slurm"]["job_id"], [n["host"] for n in view["placement"]])
    assert len({sid for sid, _ in slurm_jobs.values()}) == 4, slurm_jobs  # a Slurm job each
    assert len(slurm_jobs["preprocess"][1]) == 3 and len(slurm_jobs["train"][1]) == 2, slurm_jobs
    print("steps as Slurm jobs:", slurm_jobs)
