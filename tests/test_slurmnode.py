"""agent/slurmnode.py: the GPUs Slurm allocated on this host, and rigdeck never placing on them.

Slurm's commands are answered here by a recorded double (the real ones run in
tests/test_slurmbed.py's bed test): what matters in these tests is what the agent makes of each
answer, a failure or a hang."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from agent.daemon import Daemon
from agent.slurmnode import RECHECK_S, RETRY_S, SlurmNode
from tests.kit.fakes import gpu, telemetry
from tui.model.jobspec import JobSpec
from tui.model.scheduler import PlacementError, Scheduler, capacity_from_state
from tui.model.state import ClusterState

NODE = "tb7-h2"
NODE_BUSY = (f"NodeName={NODE} Arch=x86_64 CoresPerSocket=1 CPUAlloc=1 CPUEfctv=8 CPUTot=8 Gres=gpu:4 "
             "GresDrain=N/A GresUsed=gpu:2(IDX:0-1) NodeAddr=10.213.7.12 State=MIXED Partitions=bed\n")
NODE_IDLE = NODE_BUSY.replace("GresUsed=gpu:2(IDX:0-1)", "GresUsed=gpu:0(IDX:N/A)").replace("MIXED", "IDLE")
JOB = f"""JobId=12 JobName=wrap
   UserId=nobody(65534) GroupId=nogroup(65534) MCS_label=N/A
   JobState=RUNNING Reason=None Dependency=(null)
   NodeList={NODE}
   JOB_GRES=gpu:2
     Nodes={NODE} CPU_IDs=0 Mem=0 GRES=gpu:2(IDX:0-1)
   MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0
"""


class Slurm:
    """Slurm's commands as a recorded double: argv[0..1] -> (rc, stdout, stderr), and the calls."""

    def __init__(self, answers: dict[str, tuple[int, str, str]]):
        self.answers = answers
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
        self.calls.append(list(argv))
        key = "squeue" if argv[0] == "squeue" else f"{argv[0]} {argv[-2]}"
        return self.answers[key]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def busy() -> dict[str, tuple[int, str, str]]:
    return {"scontrol node": (0, NODE_BUSY, ""), "squeue": (0, "12|nobody\n", ""), "scontrol job": (0, JOB, "")}


def test_gpus_of_a_slurm_job_are_named_with_its_id_and_user() -> None:
    slurm = Slurm(busy())
    node = SlurmNode(NODE, run=slurm, configured=lambda: True, clock=Clock())
    assert node.allocated(0) == {0: {"job_id": "12", "user": "nobody"}, 1: {"job_id": "12", "user": "nobody"}}
    assert slurm.calls[0] == ["scontrol", "-d", "-o", "show", "node", NODE]


def test_an_idle_node_costs_one_question() -> None:
    slurm = Slurm({"scontrol node": (0, NODE_IDLE, "")})
    node = SlurmNode(NODE, run=slurm, configured=lambda: True, clock=Clock())
    assert node.allocated(0) == {}
    assert len(slurm.calls) == 1


def test_a_host_without_slurm_asks_nothing() -> None:
    slurm = Slurm({})
    node = SlurmNode(NODE, run=slurm, configured=lambda: False, clock=Clock())
    assert node.allocated(0) == {} and slurm.calls == []


def test_a_host_slurm_does_not_know_is_asked_again_a_minute_later() -> None:
    slurm = Slurm({"scontrol node": (1, "", f"Node {NODE} not found\n")})
    clock = Clock()
    node = SlurmNode(NODE, run=slurm, configured=lambda: True, clock=clock)
    assert node.allocated(0) == {} and node.allocated(0) == {}
    assert len(slurm.calls) == 1
    clock.t += RECHECK_S + 1
    node.allocated(0)
    assert len(slurm.calls) == 2


def test_a_hung_scontrol_keeps_the_last_answer_and_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    slurm = Slurm(busy())
    clock = Clock()
    node = SlurmNode(NODE, run=slurm, configured=lambda: True, clock=clock)
    first = node.allocated(0)
    slurm.answers["scontrol node"] = (124, "", "timed out after 3s")
    with caplog.at_level(logging.WARNING, logger="rigdeck.agent.slurm"):
        for _ in range(3):
            clock.t += RETRY_S + 1
            assert node.allocated(0) == first  # its GPUs stay taken
    assert [r.getMessage() for r in caplog.records] == [f"scontrol show node {NODE} failed (124): timed out after 3s"]
    calls = len(slurm.calls)
    clock.t += 1  # within the pause: Slurm is not asked
    node.allocated(0)
    assert len(slurm.calls) == calls


@pytest.mark.parametrize("text", ["garbage", "NodeName=x GresUsed=gpu:two", "\x00\x01"])
def test_output_it_cannot_read_never_breaks_a_sample(text: str, caplog: pytest.LogCaptureFixture) -> None:
    node = SlurmNode(NODE, run=Slurm({"scontrol node": (0, text, "")}), configured=lambda: True, clock=Clock())
    with caplog.at_level(logging.WARNING, logger="rigdeck.agent.slurm"):
        assert node.allocated(0) == {}
    assert caplog.records and NODE in caplog.records[0].getMessage()


def test_a_sample_shows_slurms_gpus_as_claimed_by_the_slurm_job(tmp_path: Path) -> None:
    daemon = Daemon(str(tmp_path / "state"), collector_factory=lambda: None)
    daemon._slurm = SlurmNode(NODE, run=Slurm(busy()), configured=lambda: True, clock=Clock())
    gpus = [gpu(0), gpu(1), gpu(2), gpu(3)]
    gpus[1]["claim"] = {"job_id": "mine", "user": "me", "since": 1.0}
    daemon._add_slurm(telemetry(gpus), 0.0)
    claims = [g.get("claim") for g in gpus]
    assert claims == [{"job_id": "12", "user": "nobody", "since": None, "scheduler": "slurm"},
                      {"job_id": "mine", "user": "me", "since": 1.0}, None, None]


class _Samples:
    """A collector of 4 idle GPUs."""

    def sample(self) -> dict[str, object]:
        return telemetry([gpu(i) for i in range(4)])


def test_a_fresh_sample_asks_slurm_and_one_for_a_slurm_launch_keeps_its_last_answer(tmp_path: Path) -> None:
    """``sample`` with ``fresh`` asks Slurm now (a placement beside Slurm must see what Slurm just
    allocated); with ``slurm: false`` too (a launch through Slurm, which places the job itself,
    needs the host's GPUs and facts) it asks nothing and the last answer stands."""
    import asyncio

    slurm = Slurm(busy())
    clock = Clock()
    daemon = Daemon(str(tmp_path / "state"), collector_factory=_Samples)
    daemon._slurm = SlurmNode(NODE, run=slurm, configured=lambda: True, clock=clock)

    def sample(**params: object) -> list[object]:
        data = asyncio.run(daemon._m_sample(None, params))  # type: ignore[arg-type]
        return [(g.get("claim") or {}).get("job_id") for g in data["gpus"]]

    assert sample(fresh=True) == ["12", "12", None, None] and len(slurm.calls) == 3
    slurm.answers["scontrol node"] = (0, NODE_IDLE, "")  # Slurm ended job 12 since
    clock.t += 60
    assert sample(fresh=True, slurm=False) == ["12", "12", None, None] and len(slurm.calls) == 3
    assert sample(fresh=True) == [None, None, None, None] and len(slurm.calls) == 4


def _capacity(claims: dict[int, dict[str, object]]):
    state = ClusterState([("h2", "10.0.0.2")])
    gpus = [gpu(i) for i in range(4)]
    for i, c in claims.items():
        gpus[i]["claim"] = c
    state.apply_sample("h2", telemetry(gpus))
    return capacity_from_state(state.snapshot())


def test_placement_takes_the_gpus_slurm_left_and_refuses_naming_the_slurm_job() -> None:
    slurm = {"job_id": "12", "user": "nobody", "since": None, "scheduler": "slurm"}
    cap = _capacity({0: slurm, 1: slurm})
    assert cap[0].slurm == ((0, "12", "nobody"), (1, "12", "nobody")) and cap[0].claimed == ()
    two = JobSpec(name="two", command=("true",), workdir="/", nodes=1, gpus_per_node=2)
    placement = Scheduler().reserve("a", two, cap)
    assert placement.nodes[0].gpus == (2, 3)
    four = JobSpec(name="four", command=("true",), workdir="/", nodes=1, gpus_per_node=4)
    with pytest.raises(PlacementError, match=r"GPU 0,1 allocated by Slurm to job 12 of user nobody"):
        Scheduler().reserve("b", four, cap)


def test_a_streams_sample_never_waits_for_slurm_being_asked_elsewhere() -> None:
    """One thread's scontrol hangs: another sample (the stream's) answers with what is known
    without waiting, and asks nothing more of Slurm."""
    gate, asking = threading.Event(), threading.Event()
    calls: list[list[str]] = []

    def hung(argv: Sequence[str], timeout: float) -> tuple[int, str, str]:
        calls.append(list(argv))
        asking.set()
        gate.wait(30)
        return 0, NODE_IDLE, ""

    node = SlurmNode(NODE, run=hung, configured=lambda: True)
    placement = threading.Thread(target=node.allocated, args=(0.0,))
    placement.start()
    try:
        assert asking.wait(30)
        assert node.allocated(5.0) == {}
        assert not gate.is_set() and len(calls) == 1  # answered while the other still waits
    finally:
        gate.set()
        placement.join(30)


NODE_DRAINED = NODE_IDLE.replace("State=IDLE", "State=IDLE+DRAIN").replace(
    "Partitions=bed", "Partitions=bed Reason=disk swap friday [admin@2026-11-30T01:02:03]")


@pytest.mark.parametrize(("text", "said"), [
    (NODE_DRAINED, "drained in Slurm: disk swap friday (by admin at 2026-11-30T01:02:03)"),
    (NODE_IDLE.replace("State=IDLE", "State=DOWN*"), "down in Slurm: no reason given"),
    (NODE_IDLE.replace("State=IDLE", "State=IDLE*"), "down in Slurm: no reason given"),
    (NODE_BUSY.replace("State=MIXED", "State=MIXED+DRAIN"), "drained in Slurm: no reason given"),
    (NODE_IDLE, None),
    (NODE_BUSY, None),
])
def test_a_node_slurm_drained_or_took_down_is_said_by_its_agent_and_kept_out_of_placement(
        tmp_path: Path, text: str, said: str | None) -> None:
    """Beside Slurm (no [slurm]): the agent reads its node's State= with the allocation, the host's
    sample says a drained or down node, and placement keeps off it naming Slurm's reason; one
    Slurm resumed takes work again on the next read."""
    answers = {**busy(), "scontrol node": (0, text, "")}
    clock = Clock()
    daemon = Daemon(str(tmp_path / "state"), collector_factory=lambda: None)
    daemon._slurm = SlurmNode(NODE, run=Slurm(answers), configured=lambda: True, clock=clock)

    def capacity():
        data = telemetry([gpu(i) for i in range(4)])
        daemon._add_slurm(data, 0.0)
        state = ClusterState([("h2", "10.0.0.2")])
        state.apply_sample("h2", data)
        return data, capacity_from_state(state.snapshot())[0]

    data, cap = capacity()
    one = JobSpec(name="one", command=("true",), workdir="/", nodes=1, gpus_per_node=1, hosts=("h2",))
    if said is None:
        assert "slurm" not in data["host"] and cap.status == "up"  # type: ignore[operator]
        Scheduler().reserve("a", one, [cap])
        return
    assert data["host"]["slurm"]["node"] == NODE  # type: ignore[index]
    assert (cap.status, cap.why, cap.up) == ("drained", said, False)
    with pytest.raises(PlacementError, match=f"host 'h2' is drained \\({said.split(' (')[0]}"):
        Scheduler().reserve("a", one, [cap])
    answers["scontrol node"] = (0, NODE_IDLE, "")  # resumed in Slurm
    clock.t += 60
    data, cap = capacity()
    assert "slurm" not in data["host"] and cap.status == "up"  # type: ignore[operator]
    assert Scheduler().reserve("b", one, [cap]).nodes[0].host == "h2"


@pytest.mark.parametrize("said", [{"node": "n", "state": "+", "reason": "x"}, {"state": 5}, "DRAIN", None,
                                  {"node": "n", "state": "IDLE+DRAIN", "reason": "[x@y" * 200}])
def test_what_an_agent_says_of_its_node_never_breaks_the_host_view(said: object) -> None:
    state = ClusterState([("h2", "10.0.0.2")])
    data = telemetry([gpu(0)])
    data["host"] = {**data["host"], "slurm": said}  # type: ignore[dict-item]
    state.apply_sample("h2", data)
    cap = capacity_from_state(state.snapshot())[0]
    kept_off = isinstance(said, dict)
    assert cap.status == ("drained" if kept_off else "up"), cap
    if kept_off:
        assert cap.why and "in Slurm" in cap.why and len(cap.why) < 700
