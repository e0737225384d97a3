"""Contracts a user or a script relies on: every command's ``--json`` keys and types (as
docs/contracts.md lists them), a ``sim`` marker wherever a simulated GPU is shown, rank strings
made safe in ``rigdeck metrics``, and MASTER_ADDR on the route the other hosts use."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests._require import require
from tests.kit import conforms
from tests.kit.local import local_cluster, rigdeck_out
from tui.control.history import History
from tui.control.hostlinks import HostReport
from tui.control.jobs import JobManager
from tui.model.jobview import JobView
from tui.model.scheduler import NodeAssignment
from tui.remote.agentclient import TypedAgents

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = ROOT / "tests" / "jobscripts" / "hostile_metrics.py"
NONE = type(None)
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # anything but tab and newline

# The key sets and types of docs/contracts.md ("--json output of every command").
HOST_REPORT: dict[str, Any] = {
    "name": str, "address": str, "port": int, "transport": str, "labels": list,
    "reachable": bool, "error": (str, NONE), "error_kind": (str, NONE), "host_key": (dict, NONE),
    "hostname": (str, NONE), "addresses": list, "agent_version": (str, NONE),
    "agent_current": bool, "copied": (bool, NONE), "bytes_copied": int, "python": (str, NONE),
    "python_executable": (str, NONE), "cpus": (int, NONE), "memory_total_mb": (int, NONE),
    "gpu_source": (str, NONE), "gpus": list, "containers": (dict, NONE), "agent_pid": (int, NONE),
    "sample": (dict, NONE),
    "elapsed_s": (float, int), "checked": list,
}
GPU = {"index": int, "name": str, "uuid": str, "memory_total_mb": int, "simulated": bool,
       "health": (str, NONE), "health_reason": (str, NONE), "drain": (dict, NONE), "claim": (dict, NONE)}
INVENTORY_HOST = {
    "name": str, "address": str, "port": int, "user": str, "transport": str, "python": str,
    "state_dir": str, "labels": list, "proxy_jump": (str, NONE), "slots": (int, NONE), "sim_gpus": int,
    "prometheus_textfile": (str, NONE), "claim_dir_owner": (str, NONE),
}
JOB: dict[str, Any] = {
    "job_id": str, "name": str, "state": str, "restarts": int, "placement": list,
    "cause": (dict, NONE), "created": (float, NONE), "started": (float, NONE), "ended": (float, NONE),
    "ranks": list, "last_step": (int, NONE), "last_loss": (float, int, NONE), "hosts": dict,
    "events": list, "unreachable": list, "waiting": (str, NONE), "sweep_id": (str, NONE), "trial": (str, NONE),
    "code": (dict, NONE), "pipeline_id": (str, NONE), "step": (str, NONE),
    "pools": list, "pool_sizing": (dict, NONE), "processing": (dict, NONE),
    "incidents": list, "goodput": (dict, NONE), "links": list, "user": (str, NONE), "stopped_by": (str, NONE),
    "slurm": (dict, NONE),
}
# status --json: a job, its live signals, its stages, its newest checkpoint save
STATUS = {**JOB, "signals": list, "stages": (dict, NONE), "checkpoint": (dict, NONE)}
STAGES = {"optimize": str, "schedule": str, "microbatches": (int, NONE), "partitions": int, "blocks": (int, NONE),
          "cuts": list, "source": str, "activation_checkpointing": (bool, NONE), "expected_bubble": (float, int, NONE),
          "measured_bubble": (float, NONE), "equal_split": (dict, NONE), "stages": list}
STAGE = {"stage": int, "blocks": list, "expected_time_s": (float, NONE), "expected_memory_bytes": (int, NONE),
         "send_bytes": (int, NONE), "step": (int, NONE), "step_time_s": (float, NONE), "busy_s": (float, NONE),
         "peak_bytes": (int, NONE), "bubble": (float, NONE), "rank": (int, NONE), "host": (str, NONE)}
PROCESSING = {"inputs": list, "outputs": list, "hosts": list}
PROCESSING_INPUT = {"name": str, "source": str, "distribution": str, "total": (int, NONE), "listed_on": (str, NONE),
                    "hosts": dict}
PROCESSING_OUTPUT = {"name": str, "hosts": dict}
POOL = {"role": str, "replicas": int, "hosts": list, "state": str, "replica_states": list, "on_failure": str}
POOL_SIZING = {"workers_gbps": (float, int, NONE), "reducers_gbps": (float, int, NONE),
               "per_reducer_gbps": (float, int, NONE), "reducers": int, "match": (int, NONE), "ok": (bool, NONE),
               "text": str}
LINK = {"kind": str, "url": str, "rank": (int, NONE), "host": str}
SIGNAL = {"kind": str, "verdict": str, "host": (str, NONE), "rank": (int, NONE), "summary": str, "advice": str}
NODE = {"host": str, "address": str, "slots": int, "gpus": list, "cpus": (int, NONE),
        "instance_type": str, "simulated": bool}
RANK = {"rank": int, "host": str, "local_rank": int, "gpu": (int, NONE), "pid": (int, NONE),
        "state": str, "exit_code": (int, NONE), "signal": (int, NONE)}
GC = {"removed": list, "kept": int, "running": list}
EXEC = {"argv": list, "hosts": list, "failed": list}
EXEC_HOST = {"host": str, "exit_code": (int, NONE), "signal": (int, NONE), "stdout": str, "stderr": str,
             "stdout_dropped": int, "stderr_dropped": int, "timed_out": bool, "error": (str, NONE),
             "duration_s": (float, int, NONE)}


# -- host reports -----------------------------------------------------------------------------


def test_host_report_json_is_the_documented_mapping_not_the_dataclass() -> None:
    r = HostReport(name="h1", address="10.0.0.5", port=2222, transport="ssh", labels=["a"],
                   reachable=True, hostname="n1", addresses=["10.0.0.5"], agent_version="v",
                   agent_current=True, copied=True, bytes_copied=10, python="3.11.2",
                   python_executable="/usr/bin/python3", cpus=8, memory_total_mb=1024,
                   gpu_source="simulated", gpus=[{"index": 0, "name": "Simulated GPU", "uuid": "SIM-1-0",
                                                  "memory_total_mb": 81920, "simulated": True}],
                   agent_pid=7, sample={"seq": 1}, elapsed_s=0.12345)
    d = r.to_json()
    conforms(d, HOST_REPORT, "report")
    assert d["port"] == 2222 and d["gpu_source"] == "simulated" and d["elapsed_s"] == 0.123
    conforms(d["gpus"][0], GPU, "report.gpus[0]")
    json.dumps(d)  # serialisable as it is

    @dataclasses.dataclass
    class Grown(HostReport):  # a field added for the app's sake
        ssh_banner: str = "OpenSSH_9.2"

    assert set(Grown(name="h1", address="a", port=22, transport="ssh").to_json()) == set(HOST_REPORT)


# -- every command on this machine, as a one-host cluster without SSH -------------------------


def _job(data: Any, where: str) -> None:
    conforms(data, STATUS if where == "status" else JOB, where)
    for i, sig in enumerate(data.get("signals", []) if where == "status" else []):
        conforms(sig, SIGNAL, f"{where}.signals[{i}]")
        assert sig["kind"] in ("straggler", "input_bound", "comm_bound", "lr_scaling")
        assert sig["verdict"] in ("ok", "warn", "bad")
    for i, n in enumerate(data["placement"]):
        conforms(n, NODE, f"{where}.placement[{i}]")
    for i, r in enumerate(data["ranks"]):
        conforms(r, RANK, f"{where}.ranks[{i}]")
    for i, link in enumerate(data["links"]):
        conforms(link, LINK, f"{where}.links[{i}]")
    for i, e in enumerate(data["events"]):
        assert isinstance(e.get("time"), float) and isinstance(e.get("event"), str), f"{where}.events[{i}]: {e}"
    for h, st in data["hosts"].items():
        assert isinstance(h, str) and isinstance(st, dict), f"{where}.hosts[{h}]"


def test_every_command_json_keeps_its_keys_and_types(tmp_path: Path) -> None:
    env = local_cluster(tmp_path)

    inv = json.loads(rigdeck_out(env, "inventory", "show", "--json"))
    assert set(inv) == {"path", "hosts"} and inv["path"] == env["RIGDECK_INVENTORY"]
    conforms(inv["hosts"][0], INVENTORY_HOST, "inventory.hosts[0]")

    for command in ("deploy", "hosts"):
        reports = json.loads(rigdeck_out(env, command, "--json"))
        assert isinstance(reports, list) and len(reports) == 1
        r = reports[0]
        conforms(r, HOST_REPORT, command)
        assert r["port"] == 22 and r["transport"] == "local" and r["reachable"] and r["error"] is None
        if command == "deploy":  # nothing ran on the host: the archive's hash checked, no facts
            assert r["checked"] == ["sha256"] and r["gpu_source"] is None and r["gpus"] == []
            continue
        assert r["checked"] == ["python"]
        assert r["gpu_source"] == "simulated" and len(r["gpus"]) == 2
        for g in r["gpus"]:
            conforms(g, GPU, f"{command}.gpus")
            assert g["simulated"] is True
    assert isinstance(r["copied"], NONE) and isinstance(r["agent_pid"], int) and isinstance(r["sample"], dict)

    spec = tmp_path / "hostile.toml"
    # No GPU for the job: the simulated GPUs of this machine are seen by every agent on it,
    # so a test running beside this one could hold them. The unit tests below mark GPUs.
    spec.write_text(f'name = "hostile"\ncommand = ["{{python}}", "{HOSTILE}"]\nworkdir = "{tmp_path}"\n'
                    'launcher = "direct"\nnodes = 1\nprocesses_per_node = 1\n')
    launched = json.loads(rigdeck_out(env, "launch", str(spec), "--json"))
    _job(launched, "launch")
    job_id = launched["job_id"]
    try:
        deadline = time.monotonic() + 60
        while True:
            records = json.loads(rigdeck_out(env, "metrics", job_id, "--json"))
            if len(records) == 4 or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert len(records) == 4, records
        for r in records:
            assert isinstance(r["host"], str) and isinstance(r["rank"], int) and not isinstance(r["rank"], bool)

        status = json.loads(rigdeck_out(env, "status", job_id, "--json"))
        _job(status, "status")
        assert status["state"] == "running" and len(status["ranks"]) == 1
        assert status["placement"][0]["gpus"] == [] and status["ranks"][0]["gpu"] is None

        # Text: ranks without a GPU are not marked, though the host's GPUs are simulated.
        text = rigdeck_out(env, "status", job_id)
        assert "placement here[1]\n" in text
        rank_line = next(ln for ln in text.splitlines() if ln.startswith("0 "))
        assert rank_line.split()[:4] == ["0", "here", "0", "-"], rank_line

        # Text: what the rank wrote reaches the terminal without its escapes.
        out = rigdeck_out(env, "metrics", job_id)
        assert not CONTROL.search(out), repr(out)
        assert "ckpt" in out and "done" in out and "pwned" not in out  # the OSC title is gone whole
    finally:
        stopped = json.loads(rigdeck_out(env, "stop", job_id, "--grace", "1", "--json", ok=(0, 1)))
    _job(stopped, "stop")
    assert stopped["state"] == "stopped"

    jobs = json.loads(rigdeck_out(env, "jobs", "--json"))
    assert isinstance(jobs, list) and [j["job_id"] for j in jobs] == [job_id]
    assert json.loads(rigdeck_out(env, "queue", "--json")) == []  # nothing waits (tests/test_jobs.py queues one)
    _job(jobs[0], "jobs[0]")
    assert jobs[0]["ranks"] == [] and jobs[0]["hosts"] == {}  # from history, no look at the hosts

    gc = json.loads(rigdeck_out(env, "gc", "--json"))
    assert list(gc) == ["here"]
    conforms(gc["here"], GC, "gc.here")

    ran = json.loads(rigdeck_out(env, "exec", "--all", "--json", "--", "sh", "-c", "echo out; echo err >&2; exit 4",
                                  ok=(1,)))
    conforms(ran, EXEC, "exec")
    assert ran["argv"] == ["sh", "-c", "echo out; echo err >&2; exit 4"] and ran["failed"] == ["here"]
    conforms(ran["hosts"][0], EXEC_HOST, "exec.hosts[0]")
    assert ran["hosts"][0]["exit_code"] == 4
    assert ran["hosts"][0]["stdout"] == "out\n" and ran["hosts"][0]["stderr"] == "err\n"


# -- sim markers ------------------------------------------------------------------------------


def _mixed_view() -> JobView:
    """h1's GPUs simulated, h2's real."""
    placement = [
        {"host": "h1", "address": "10.0.0.1", "slots": 2, "gpus": [0, 1], "cpus": 8,
         "instance_type": "rigdeck.sim-gpu-4", "simulated": True},
        {"host": "h2", "address": "10.0.0.2", "slots": 2, "gpus": [2, 3], "cpus": 8,
         "instance_type": "rigdeck.gpu-4xh100", "simulated": False},
    ]
    ranks = [{"rank": i, "host": h, "local_rank": i % 2, "gpu": g, "pid": 100 + i, "state": "running",
              "exit_code": None, "signal": None}
             for i, (h, g) in enumerate([("h1", 0), ("h1", 1), ("h2", 2), ("h2", 3)])]
    return JobView(job_id="j-1", name="j", state="running", spec={}, placement=placement, ranks=ranks)


def test_status_text_marks_only_the_simulated_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    from tui.cli.main import _print_job

    _print_job(_mixed_view())
    lines = capsys.readouterr().out.splitlines()
    assert "placement h1[2 gpus 0,1] sim, h2[2 gpus 2,3]" in lines
    gpu_cells = {ln.split()[0]: ln.split()[3:5] for ln in lines if ln[:1].isdigit()}
    assert gpu_cells == {"0": ["0", "sim"], "1": ["1", "sim"], "2": ["2", "102"], "3": ["3", "103"]}


def test_job_view_placement_and_ranks_mark_only_the_simulated_gpus() -> None:
    from tui.app.shell import placement_markup
    from tui.app.widgets.format import PLAIN, placement_text
    from tui.app.widgets.tables import RanksTable, rank_rows

    v = _mixed_view()
    assert placement_text(v.placement) == "h1[0,1] sim h2[2,3]"
    assert placement_markup(v.placement) == "h1[0,1][$text-muted] sim[/] h2[2,3]"
    rows = dict(rank_rows(v.ranks, v.placement))
    assert [rows[k][3] for k in ("0", "1", "2", "3")] == [(0, True), (1, True), (2, False), (3, False)]
    table = RanksTable()
    cells = [table.render_cell("gpu", rows[k][3], PLAIN).plain for k in ("0", "2")]
    assert cells == ["0 sim", "2"]
    no_gpu = {**v.ranks[0], "gpu": None}
    assert dict(rank_rows([no_gpu], v.placement))["0"][3] == (None, False)  # no GPU: nothing simulated


def test_summary_counts_only_the_simulated_gpus() -> None:
    from tui.app.shell import summarize
    from tui.model.state import ClusterState

    state = ClusterState([("sim", "a"), ("real", "b")])
    for host, simulated in (("sim", True), ("real", False)):
        gpus = [{"index": i, "uuid": f"{host}-{i}", "simulated": simulated, "processes": []}
                for i in range(4)]
        state.apply_sample(host, {"gpus": gpus})
    sim, real = state.snapshot(gpus=False)
    assert summarize([sim, real])["simulated"] == 4
    assert summarize([real])["simulated"] == 0
    assert summarize([sim, sim])["simulated"] == 8


# -- metrics text ---------------------------------------------------------------------------


def test_metrics_text_prints_rank_strings_through_terminal_safe(capsys: pytest.CaptureFixture[str]) -> None:
    from tui.cli.main import _print_metrics

    _print_metrics([
        {"host": "h1", "rank": 0, "step": "\x1b[2J3", "loss": "\x1b]52;c;ZXZpbA==\x070.5"},
        {"host": "h1", "rank": "\x1bc0", "event": "\x1b]0;title\x07checkpoint\x07",
         "status": "do\x08ne\x1b[?1049h", "step": "\x9b5"},
    ])
    out = capsys.readouterr().out
    assert not CONTROL.search(out), repr(out)
    assert "step 3" in out and "loss 0.5" in out and "checkpoint" in out and "title" not in out


# -- MASTER_ADDR ------------------------------------------------------------------------------


class _Ctl(TypedAgents):
    """A controller that answers as a host with a docker0 (172.17.0.1, sorting first) would."""

    def __init__(self, peer: str | None, routed: str | None):
        self.peer, self.routed = peer, routed
        self.asked: list[tuple[str, str, dict[str, Any]]] = []

    def request(self, host: str, method: str, **params: Any) -> Any:
        self.asked.append((host, method, params))
        if method == "facts":
            return {"addresses": ["172.17.0.1", "192.168.1.20"]}
        if method == "route_source":
            return {"address": self.routed}
        raise AssertionError(method)

    def peer_address(self, host: str) -> str | None:
        return self.peer


def _node(host: str, address: str) -> NodeAssignment:
    return NodeAssignment(host=host, address=address, slots=1, gpus=(), cpus=1, instance_type="x", simulated=False)


@pytest.mark.parametrize("peer, routed, why", [
    ("192.168.1.20", None, "the address the controller's SSH session reached"),
    (None, "192.168.1.20", "a ProxyJump or the local transport: the primary's route to h2"),
    ("203.0.113.7", "192.168.1.20", "a NAT's address is not the host's own: the route"),
])
def test_master_addr_is_the_routed_address_not_the_first_sorted(
        tmp_path: Path, peer: str | None, routed: str | None, why: str) -> None:
    ctl = _Ctl(peer, routed)
    jm = JobManager(ctl, History(tmp_path / "history.sqlite"))  # type: ignore[arg-type]
    assert jm._master_addr(_node("h1", "gpu-a"), [_node("h2", "gpu-b")]) == "192.168.1.20", why
    if routed:
        assert ("h1", "route_source", {"peer": "gpu-b"}) in ctl.asked
    # An IP in the inventory is the address the controller (or its jump host) reached: as is.
    assert jm._master_addr(_node("h1", "10.9.8.7"), [_node("h2", "gpu-b")]) == "10.9.8.7"


def test_a_job_on_one_local_host_rendezvouses_on_loopback_not_on_another_interface(tmp_path: Path) -> None:
    """No other host needs a route to it: not the first of the host's addresses (a bridge or a
    VPN that can go away under the job, or serve another program's port), loopback; the same
    with several nodes (worker pools) on that one host. An SSH-reached address stays the host's."""
    jm = JobManager(_Ctl(None, None), History(tmp_path / "history.sqlite"))  # type: ignore[arg-type]
    assert jm._master_addr(_node("h1", "gpu-a")) == "127.0.0.1"
    assert jm._master_addr(_node("h1", "gpu-a"), [_node("h1", "gpu-a")]) == "127.0.0.1"
    # With another host and no route to it, the host's first address is all there is.
    assert jm._master_addr(_node("h1", "gpu-a"), [_node("h2", "gpu-b")]) == "172.17.0.1"
    remote = JobManager(_Ctl("192.168.1.20", None), History(tmp_path / "history2.sqlite"))  # type: ignore[arg-type]
    assert remote._master_addr(_node("h1", "gpu-a")) == "192.168.1.20"


def test_master_addr_on_the_local_transport_is_the_source_of_the_route_to_the_peer(tmp_path: Path) -> None:
    """The real agent's answer, checked against ``ip route get``: with a second interface on this
    machine (a test bed's bridge, docker0) the route's address is not necessarily the first."""
    from tui.control.hostlinks import HostLinks
    from tui.model.inventory import HostSpec, Inventory
    from tui.remote.bundle import build_agent

    require(lambda: subprocess.run(["ip", "-V"], capture_output=True).returncode == 0, "iproute2 (ip)")
    nets = [ln.split() for ln in subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"],
                                                capture_output=True, text=True).stdout.splitlines()]
    cidrs = sorted(p[3] for p in nets if len(p) > 3)
    require(cidrs, "a non-loopback IPv4 address on this machine")
    addr, prefix = cidrs[-1].split("/")  # the one that sorts last, when there are several
    import ipaddress

    net = ipaddress.ip_interface(cidrs[-1]).network
    peer = next(str(h) for h in net.hosts() if str(h) != addr)  # on-link: nothing is sent to it
    expected = subprocess.run(["ip", "-o", "route", "get", peer], capture_output=True, text=True).stdout.split()
    expected_src = expected[expected.index("src") + 1]
    spec = HostSpec(name="here", address="localhost", transport="local", python=sys.executable,
                    state_dir=str(tmp_path / "state"))
    bundle = build_agent(tmp_path / "cache")
    with HostLinks(Inventory(hosts=(spec,), path=None, known_hosts=tmp_path / "kh"),
                    bundle_factory=lambda: bundle) as ctl:
        jm = JobManager(ctl, History(tmp_path / "history.sqlite"))
        got = jm._master_addr(_node("here", "localhost"), [_node("other", peer)])
    assert got == expected_src == addr, (got, expected_src, cidrs)



@pytest.mark.testbed
def test_master_addr_on_the_test_bed_is_the_address_the_other_hosts_reach(testbed: Any, tmp_path: Path) -> None:
    """Both hosts named by aliases (resolved by an /etc/hosts of the controller's own mount
    namespace) and each given a second interface with 10.0.0.1, which sorts before its 10.213.K.x: every
    rank's MASTER_ADDR is the primary's bed address, the one the controller's SSH reached."""
    import shutil

    require(shutil.which("unshare") and shutil.which("mount"), "util-linux (unshare, mount)")
    bed = testbed
    hosts = [bed.host(1), bed.host(2)]
    inv = bed.write_inventory(tmp_path / "hosts.toml", hosts=[1, 2], python=sys.executable,
                              known_hosts=str(tmp_path / "known_hosts"))
    text, etc_hosts = inv.read_text(), Path("/etc/hosts").read_text()
    known = bed.known_hosts.read_text()
    for h in hosts:
        alias = f"rdk-contracts-{h.name}"
        text = text.replace(f'address = "{h.address}"', f'address = "{alias}"')
        etc_hosts += f"\n{h.address} {alias}\n"
        known += f"{alias} {h.public_key}\n"
    inv.write_text(text)
    (tmp_path / "known_hosts").write_text(known)
    (tmp_path / "etc_hosts").write_text(etc_hosts)
    spec = tmp_path / "master.toml"
    spec.write_text('name = "master"\nhosts = ["h1", "h2"]\nlauncher = "direct"\nprocesses_per_node = 1\n'
                    f'workdir = "{tmp_path}"\n'
                    """command = ["{python}", "-c", 'import os; print("MASTER", os.environ["MASTER_ADDR"], """
                    """os.environ["RIGDECK_MASTER_ADDR"])']\n""")
    env = {**os.environ, "RIGDECK_HOME": str(tmp_path / "home"), "RIGDECK_INVENTORY": str(inv)}

    def rigdeck(*args: str) -> subprocess.CompletedProcess[str]:
        # The aliases resolve only in this command's mount namespace: the machine's /etc/hosts is untouched.
        return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                               'mount --bind "$0" /etc/hosts && exec "$@"', str(tmp_path / "etc_hosts"),
                               sys.executable, "-m", "tui.cli", *args],
                              env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)

    for h in hosts:  # a veth pair inside the host (no dummy module in a container), as docker0 would be
        for argv in (["link", "add", "dock0", "type", "veth", "peer", "name", "dock1"],
                     ["addr", "add", "10.0.0.1/24", "dev", "dock0"], ["link", "set", "dock0", "up"],
                     ["link", "set", "dock1", "up"]):
            subprocess.run(["ip", "-n", h.netns, *argv], check=True, capture_output=True)
    try:
        res = rigdeck("launch", str(spec), "--wait", "--json")
        assert res.returncode == 0, res.stdout + res.stderr
        job = json.loads(res.stdout)
        assert job["state"] == "succeeded"
        primary = bed.host(job["placement"][0]["host"])
        logs = rigdeck("logs", job["job_id"])
        assert logs.returncode == 0, logs.stderr
        lines = [ln.split() for ln in logs.stdout.splitlines() if " MASTER " in ln]
        assert len(lines) == 2, logs.stdout
        for ln in lines:
            assert ln[-2:] == [primary.address, primary.address], (ln, "not 10.0.0.1")
    finally:
        for h in hosts:
            subprocess.run(["ip", "-n", h.netns, "link", "del", "dock0"], capture_output=True)  # takes dock1 along


async def test_app_marks_simulated_gpus_in_the_job_view_the_stop_dialog_and_the_summary() -> None:
    from textual.widgets import Static

    from tests.ui_fixtures import (
        JOB,
        NOW,
        FakeController,
        FakeMonitor,
        RecordedJobs,
        cluster_state,
        gpu_sample,
        host_sample,
        recorded_app,
    )
    from tui.app.shell import RigdeckApp
    from tui.app.widgets.tables import RanksTable
    from tui.client import InProcessClient

    app = recorded_app()  # every GPU simulated
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("4")
        await pilot.pause()
        head = str(app.query_one("#job-head", Static).render())
        assert f"{JOB}  running  on h1[0,1] sim h2[0,1] sim" in head
        ranks = app.query_one("#ranks-table", RanksTable)
        assert [ranks.cell_text(k, "gpu") for k in ("0", "1", "2", "3")] == ["0 sim", "1 sim", "0 sim", "1 sim"]
        assert "8 total (sim)" in str(app.query_one("#summary", Static).render())
        await pilot.press("3", "s")
        await pilot.pause()
        body = str(app.screen.query_one("#stop-body", Static).render())
        assert "h1: ranks 0, 1 on GPUs 0, 1 sim" in body

    state = cluster_state()  # then h2 reports real GPUs
    real = [{**gpu_sample(2, idx, 30), "simulated": False, "name": "NVIDIA H100"} for idx in range(4)]
    state.apply_sample("h2", {**host_sample(2, 30, real), "gpu_source": "nvml", "simulated": False},
                       received_at=30.0)
    app = RigdeckApp(InProcessClient(controller=FakeController(), monitor=FakeMonitor(state), jobs=RecordedJobs()),
                     clock=lambda: NOW, keymap_file=Path("/nonexistent/keys.toml"))
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        summary = str(app.query_one("#summary", Static).render())
        assert "8 total (4 sim)" in summary, summary


QUEUE_ENTRY = {"position": int, "job_id": str, "name": str, "priority": int, "queued_at": float,
               "waiting": str, "hosts": list, "gpus": int, "user": str, "fairshare": (float, type(None)),
               "preempted": int}


def test_queue_json_keeps_its_keys_and_types() -> None:
    from tui.client import QueueEntry, wire_json

    entry = QueueEntry(position=1, job_id="j-1", name="j", priority=5, queued_at=1.5,
                       waiting="h1 0 GPUs (GPU 0,1 busy with job 'x')", hosts=("h1",), gpus=2, user="alice",
                       fairshare=0.5, preempted=1)
    out = json.loads(json.dumps(wire_json([entry])))
    conforms(out[0], QUEUE_ENTRY, "queue[0]")
    fifo = json.loads(json.dumps(wire_json([dataclasses.replace(entry, fairshare=None)])))
    conforms(fifo[0], QUEUE_ENTRY, "queue[0]")


SWEEP_ROW = {"sweep_id": str, "name": str, "state": str, "strategy": str, "pruner": str, "metric": str,
             "goal": str, "max_trials": int, "created": float, "ended": (float, NONE), "reason": (str, NONE),
             "trials": int, "running": int, "queued": int, "completed": int, "pruned": int, "failed": int,
             "best_trial": (int, NONE), "best_value": (float, NONE), "user": (str, NONE)}
TRIAL = {"number": int, "job_id": str, "state": str, "params": list, "value": (float, NONE),
         "best_step": (int, NONE), "best_value": (float, NONE), "last_step": (int, NONE),
         "pruned_step": (int, NONE), "started": (float, NONE), "ended": (float, NONE), "attempt": int,
         "error": (str, NONE), "curve": list}
SWEEP = {"best": (dict, NONE), "row": dict, "parameters": list, "trials": list, "max_parallel": (int, NONE),
         "seed": (int, NONE)}


def test_sweep_json_keeps_its_keys_and_types() -> None:
    """The documented keys are exactly what `rigdeck sweep --json` writes (tui/cli/sweep.py)."""
    from tui.cli.sweep import detail_json
    from tui.client import wire_json
    from tui.model.sweepview import SweepDetail, SweepRow, TrialRow

    done = TrialRow(number=2, job_id="sw-t2-ab12cd", state="completed", params=(("lr", 0.01), ("opt", "adam")),
                    value=0.12, best_step=30, best_value=0.12, last_step=30, started=10.0, ended=20.0,
                    curve=((1, 1.0), (30, 0.12)))
    pruned = TrialRow(number=1, job_id="sw-t1-cd34ef", state="pruned", params=(("lr", 0.5), ("opt", "sgd")),
                      best_step=3, best_value=0.9, last_step=3, pruned_step=3, started=10.0, ended=14.0,
                      error=None, curve=((1, 1.2), (3, 0.9)))
    row = SweepRow(sweep_id="sw-sw1a2b3c", name="sw", state="running", strategy="bayesian", pruner="median",
                   metric="val_loss", goal="minimize", max_trials=4, created=9.5, trials=2, completed=1, pruned=1,
                   best_trial=2, best_value=0.12)
    detail = SweepDetail(row=row, parameters=({"name": "lr", "type": "float", "low": 1e-4, "high": 1.0,
                                               "log": True},), trials=(done, pruned), max_parallel=None, seed=1)
    out = json.loads(json.dumps(detail_json(detail)))
    conforms(out, SWEEP, "sweep")
    conforms(out["row"], SWEEP_ROW, "sweep.row")
    conforms(out["best"], TRIAL, "sweep.best")
    for i, t in enumerate(out["trials"]):
        conforms(t, TRIAL, f"sweep.trials[{i}]")
    assert out["best"]["number"] == 2 and list(out)[0] == "best"
    rows = json.loads(json.dumps(wire_json([row])))
    conforms(rows[0], SWEEP_ROW, "sweeps[0]")


def test_signal_json_is_the_documented_mapping() -> None:
    from tui.model.diagnose import signals_from_records

    recs = [{"rank": r, "host": f"h{r}", "step": s, "step_time": 0.5 if r == 1 else 0.1, "data_time": 0.09}
            for s in range(1, 6) for r in range(3)]
    found = signals_from_records(recs, spec={"scaling": {"reference_world_size": 8, "base_lr": 0.1}}, world=3)
    assert {s.kind for s in found} == {"straggler", "input_bound", "lr_scaling"}
    for i, s in enumerate(found):
        d = s.to_json()
        conforms(d, SIGNAL, f"signals[{i}]")
        json.dumps(d)


def test_stages_json_is_the_documented_mapping() -> None:
    """status --json's "stages", from mp_plan and mp_stage records shaped as docs/contracts.md says."""
    from tui.model.stages import stages_from_records

    plan = {"version": 1, "optimize": "speed", "schedule": "interleaved", "microbatches": 4, "partitions": 2,
            "blocks": 5, "cuts": [3], "source": "file", "bubble": 0.2,
            "stages": [{"stage": 0, "blocks": [0, 3], "time_s": 0.01, "memory_bytes": 100, "send_bytes": 8},
                       {"stage": 1, "blocks": [3, 5], "time_s": 0.02, "memory_bytes": 200, "send_bytes": 0}],
            "equal_split": {"cuts": [2], "max_time_s": 0.03, "max_memory_bytes": 300}}
    recs = [{"rank": 0, "host": "h1", "event": "mp_plan", "plan": plan},
            {"rank": 1, "host": "h2", "event": "mp_stage", "stage": 1, "step": 5, "step_time_s": 0.2,
             "busy_s": 0.08, "peak_bytes": 250}]
    view = stages_from_records(recs, spec={"model_parallel": {"activation_checkpointing": True}})
    assert view is not None
    d = json.loads(json.dumps(view.to_json()))
    conforms(d, STAGES, "stages")
    assert set(d["equal_split"]) == {"cuts", "max_time_s", "max_memory_bytes"}
    for i, s in enumerate(d["stages"]):
        conforms(s, STAGE, f"stages.stages[{i}]")
    assert d["stages"][0]["step"] is None and d["stages"][1]["bubble"] == pytest.approx(0.6)


def test_pools_json_is_the_documented_mapping(tmp_path: Path) -> None:
    """A pool job's ``pools`` and ``pool_sizing`` in every command's job object, as
    docs/contracts.md ("Worker pools: controller rules and what the faces show") says."""
    history = History(tmp_path / "history.sqlite")
    history.create("p-1", "ps", {"name": "ps", "pools": [{"role": "primary"}, {"role": "evaluator"}]},
                   state="running")
    sizing = {"workers_gbps": 30.0, "reducers_gbps": 10.0, "per_reducer_gbps": 10.0, "reducers": 1, "match": 3,
              "ok": False,
              "text": "reduction servers 1 x 10 Gbps = 10 Gbps < workers 3 x 10 Gbps = 30 Gbps: 3 would match"}
    history.update("p-1", pool_sizing=sizing, placement=[
        {"host": "h1", "address": "10.0.0.1", "slots": 1, "gpus": [0], "cpus": 8, "instance_type": "x",
         "simulated": True, "pool": "primary", "replica": 0},
        {"host": "h2", "address": "10.0.0.2", "slots": 1, "gpus": [], "cpus": 8, "instance_type": "y",
         "simulated": False, "pool": "evaluator", "replica": 0}])
    d = json.loads(json.dumps(JobManager(TypedAgents(), history).view("p-1", live=False).to_json()))  # type: ignore[arg-type]
    conforms(d, JOB, "pool job")  # (its placement nodes carry "pool" and "replica" besides NODE's keys)
    assert [p["role"] for p in d["pools"]] == ["primary", "evaluator"]
    for i, p in enumerate(d["pools"]):
        conforms(p, POOL, f"pools[{i}]")
    assert d["pools"][1]["on_failure"] == "continue" and d["pools"][0]["state"] == "unknown"
    conforms(d["pool_sizing"], POOL_SIZING, "pool_sizing")



def test_processing_json_is_the_documented_mapping(tmp_path: Path) -> None:
    """A processing job's ``processing`` in every command's job object, as docs/contracts.md
    ("Processing jobs: what the faces show") says; null for every other job."""
    history = History(tmp_path / "history.sqlite")
    spec = {"name": "count", "kind": "processing", "processing": {
        "inputs": [{"name": "raw", "source": "/w/raw", "distribution": "ShardedByKey"},
                   {"name": "ref", "source": "/w/ref", "distribution": "FullyReplicated"}],
        "outputs": [{"name": "counts"}]}}
    history.create("c-1", "count", spec, state="running")
    history.update("c-1", placement=[
        {"host": h, "address": f"10.0.0.{i}", "slots": 1, "gpus": [], "cpus": 8, "instance_type": "x",
         "simulated": False} for i, h in enumerate(("h1", "h2"), 1)])
    history.add_event("c-1", {"event": "processing", "inputs": {
        "raw": {"distribution": "ShardedByKey", "total": 3, "listed_on": "h1", "listing_sha256": "0" * 64,
                "hosts": {"h1": 2, "h2": 1}}, "ref": {"distribution": "FullyReplicated"}}})
    history.create("t-1", "train", {"name": "train"}, state="running")
    jm = JobManager(TypedAgents(), history)  # type: ignore[arg-type]
    d = json.loads(json.dumps(jm.view("c-1", live=False).to_json()))
    conforms(d, JOB, "processing job")
    conforms(d["processing"], PROCESSING, "processing")
    for i, inp in enumerate(d["processing"]["inputs"]):
        conforms(inp, PROCESSING_INPUT, f"processing.inputs[{i}]")
    conforms(d["processing"]["outputs"][0], PROCESSING_OUTPUT, "processing.outputs[0]")
    assert d["processing"]["inputs"][0]["hosts"] == {"h1": 2, "h2": 1}
    assert d["processing"]["outputs"][0]["hosts"] == {"h1": None, "h2": None}  # no inventory: places unknown
    assert json.loads(json.dumps(jm.view("t-1", live=False).to_json()))["processing"] is None
