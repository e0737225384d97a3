"""tui.model.scheduler: placement rules, bookkeeping, and that no two jobs ever share a GPU."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.kit.fakes import gpu, telemetry
from tests.kit.specs import gpu_job
from tui.model import scheduler
from tui.model.inventory import HostSpec, Inventory
from tui.model.jobspec import JobSpec
from tui.model.scheduler import (
    HostCapacity,
    NodeAssignment,
    Placement,
    PlacementError,
    Scheduler,
    capacity_from_state,
    instance_type,
)
from tui.model.state import ClusterState, HostStatus


def cpu_job(name: str, nodes: int | None, procs: int, hosts: Sequence[str] = ()) -> JobSpec:
    return JobSpec(
        name=name,
        command=("python", "train.py"),
        workdir="/w",
        nodes=nodes,
        hosts=tuple(hosts),
        processes_per_node=procs,
    )


def host(
    name: str,
    gpus: int = 4,
    *,
    up: bool = True,
    foreign: Sequence[int] = (),
    users: Sequence[tuple[int, str]] = (),
    job_busy: Sequence[tuple[int, str]] = (),
    simulated: bool = False,
    cpus: int | None = 16,
    status: str | None = None,
) -> HostCapacity:
    return HostCapacity(
        name=name,
        address=f"10.0.0.{name[-1]}",
        up=up,
        cpus=cpus,
        gpus=tuple(range(gpus)),
        foreign_busy=tuple(foreign),
        simulated=simulated,
        gpu_name="NVIDIA H100 80GB HBM3" if gpus else None,
        status=status,
        foreign_users=tuple(users),
        job_busy=tuple(job_busy),
    )


def gpus_of(p: Placement) -> dict[str, tuple[int, ...]]:
    return {n.host: n.gpus for n in p.nodes}


# ---------------------------------------------------------------------------------------------
# Placement rules


def test_vertical_packing_one_node_takes_the_host_with_four_free() -> None:
    s = Scheduler()
    cap = [host("h1", 2), host("h2", 4), host("h3", 4, foreign=[0])]
    p = s.reserve("j", gpu_job("big", 1, 4), cap)
    assert gpus_of(p) == {"h2": (0, 1, 2, 3)}
    assert p.world_size == 4


def test_most_free_first_ties_by_name() -> None:
    s = Scheduler()
    cap = [host("h3", 8), host("h1", 4), host("h2", 8), host("h4", 2)]
    p = s.reserve("j", gpu_job("pair", 2, 2), cap)
    assert gpus_of(p) == {"h2": (0, 1), "h3": (0, 1)}
    # h2 and h3 now have 6 free each, h1 4: the next pair lands on them again.
    p2 = s.reserve("k", gpu_job("pair2", 2, 2), cap)
    assert gpus_of(p2) == {"h2": (2, 3), "h3": (2, 3)}
    # Now all of h1, h2 and h3 have 4 free: h1 and h2 by name.
    p3 = s.reserve("l", gpu_job("pair3", 2, 2), cap)
    assert gpus_of(p3) == {"h1": (0, 1), "h2": (4, 5)}


def test_each_node_gets_exactly_k_lowest_free_gpus() -> None:
    s = Scheduler()
    cap = [host("h1", 8, foreign=[0, 2])]
    p = s.reserve("j", gpu_job("x", 1, 3), cap)
    assert gpus_of(p) == {"h1": (1, 3, 4)}
    assert p.nodes[0].slots == 3


def test_default_node_count_is_one() -> None:
    s = Scheduler()
    p = s.reserve("j", gpu_job("x", None, 2), [host("h1"), host("h2")])
    assert len(p.nodes) == 1


def test_foreign_busy_gpus_are_not_free() -> None:
    s = Scheduler()
    cap = [host("h1", 4, foreign=[1, 3])]
    assert s.free_gpus(cap) == {"h1": (0, 2)}
    with pytest.raises(PlacementError):
        s.reserve("j", gpu_job("x", 1, 3), cap)
    assert s.reserve("j", gpu_job("x", 1, 2), cap).nodes[0].gpus == (0, 2)


def test_gpus_running_unreserved_rigdeck_jobs_are_not_free() -> None:
    s = Scheduler()
    cap = [host("h1", 2, job_busy=[(0, "old")])]
    assert s.free_gpus(cap) == {"h1": (1,)}
    with pytest.raises(PlacementError, match=r"GPU 0 running job 'old' \(not reserved\)"):
        s.reserve("j", gpu_job("x", 1, 2), cap)
    # A job's own leftovers (say, from before a restart) do not block it.
    assert s.reserve("old", gpu_job("x", 1, 2), cap).nodes[0].gpus == (0, 1)


def test_down_hosts_are_never_chosen() -> None:
    s = Scheduler()
    cap = [host("h1", 8, up=False), host("h2", 2, up=False, status="stale"), host("h3", 2)]
    p = s.reserve("j", gpu_job("x", 1, 2), cap)
    assert p.hosts == ("h3",)
    assert s.free_gpus(cap) == {"h1": (), "h2": (), "h3": ()}
    with pytest.raises(PlacementError) as info:
        s.reserve("k", gpu_job("y", 1, 1), cap)
    assert "h1 down" in str(info.value)
    assert "h2 stale" in str(info.value)


def test_a_restart_keeps_its_previous_hosts_where_they_have_room() -> None:
    """After an XID drained GPU 0 of h2, the 3-node restart stays on h1-h3 (h2's GPU 1), not on
    the spare h4 with more free GPUs; a previous host without room is left for the next."""
    s = Scheduler()
    cap = [host("h1", 2, foreign=[1]), host("h2", 2, foreign=[0]), host("h3", 2, foreign=[1]), host("h4", 2)]
    job = gpu_job("ddp", 3, 1)
    assert gpus_of(s.reserve("fresh", job, cap)) == {"h4": (0,), "h1": (0,), "h2": (1,)}  # most free first
    s.release("fresh")
    p = s.reserve("j", job, cap, prefer_hosts=["h1", "h2", "h3"])
    assert gpus_of(p) == {"h1": (0,), "h2": (1,), "h3": (0,)}
    s.release("j")
    full = [host("h1", 2, foreign=[1]), host("h2", 2, foreign=[0, 1]), host("h3", 2, foreign=[1]), host("h4", 2)]
    assert gpus_of(s.reserve("j", job, full, prefer_hosts=["h1", "h2", "h3"])) == {
        "h1": (0,), "h3": (0,), "h4": (0,)}


def test_excluded_hosts_are_never_chosen() -> None:
    s = Scheduler()
    cap = [host("h1", 8), host("h2", 4)]
    p = s.reserve("j", gpu_job("x", 1, 4), cap, exclude_hosts=["h1"])
    assert p.hosts == ("h2",)
    with pytest.raises(PlacementError, match="host 'h2' is excluded"):
        s.reserve("k", gpu_job("y", 1, 1, hosts=["h2"]), cap, exclude_hosts={"h2"})


def test_explicit_hosts() -> None:
    s = Scheduler()
    cap = [host("h1", 8), host("h2", 2), host("h3", 2)]
    p = s.reserve("j", gpu_job("x", 2, 2, hosts=["h3", "h2"]), cap)
    assert gpus_of(p) == {"h2": (0, 1), "h3": (0, 1)}
    assert p.hosts == ("h2", "h3")  # rank order: sorted names


def test_explicit_hosts_errors_name_the_host() -> None:
    s = Scheduler()
    cap = [host("h1", 2), host("h2", 2, up=False), host("h3", 1)]
    with pytest.raises(PlacementError) as info:
        s.reserve("j", gpu_job("x", None, 2, hosts=["h1", "h9"]), cap)
    assert "unknown host 'h9' (known: h1, h2, h3)" in str(info.value)
    with pytest.raises(PlacementError, match="host 'h2' is down"):
        s.reserve("j", gpu_job("x", None, 2, hosts=["h1", "h2"]), cap)
    with pytest.raises(PlacementError, match="host 'h3' has 1 free GPU;"):
        s.reserve("j", gpu_job("x", None, 2, hosts=["h1", "h3"]), cap)
    assert s.reservations() == {}


def test_third_job_that_does_not_fit_says_what_is_asked_and_free() -> None:
    s = Scheduler()
    cap = [
        host("h1", 4, foreign=[1], users=[(1, "bob")]),
        host("h2", 4),
        host("h3", 4, up=False),
        host("h4", 0, cpus=8),
    ]
    s.reserve("a", gpu_job("a", 1, 2), cap)  # h2 (4 free) -> 0,1
    s.reserve("b", gpu_job("b", 1, 2), cap)  # h1 has 3 free, h2 2 -> h1 0,2
    with pytest.raises(PlacementError) as info:
        s.reserve("c", gpu_job("big", 2, 2), cap)
    assert str(info.value) == (
        "job 'big' asks 2 nodes x 2 GPUs: hosts with >= 2 free GPUs: 1; "
        "free: h1 1 GPU (GPU 0,2 busy with job 'b'; GPU 1 used by a foreign process of user bob), "
        "h2 2 GPUs (GPU 0,1 busy with job 'a'), h3 down, h4 no GPUs"
    )
    assert set(s.reservations()) == {"a", "b"}


def test_release_frees() -> None:
    s = Scheduler()
    cap = [host("h1", 4)]
    s.reserve("a", gpu_job("a", 1, 4), cap)
    assert s.free_gpus(cap) == {"h1": ()}
    with pytest.raises(PlacementError):
        s.reserve("b", gpu_job("b", 1, 1), cap)
    s.release("a")
    s.release("a")  # twice is fine
    assert s.free_gpus(cap) == {"h1": (0, 1, 2, 3)}
    assert s.reserve("b", gpu_job("b", 1, 4), cap).nodes[0].gpus == (0, 1, 2, 3)


def test_a_job_id_holds_one_reservation() -> None:
    s = Scheduler()
    cap = [host("h1", 4)]
    s.reserve("a", gpu_job("a", 1, 1), cap)
    with pytest.raises(PlacementError, match="already holds h1"):
        s.reserve("a", gpu_job("a", 1, 1), cap)


def test_rank_order_is_sorted_by_host_name() -> None:
    s = Scheduler()
    cap = [host("h9", 2), host("h1", 4), host("h5", 8)]
    p = s.reserve("j", gpu_job("x", 3, 2), cap)
    assert p.hosts == ("h1", "h5", "h9")
    assert p.primary.host == "h1"
    assert [n["host"] for n in p.to_plan_nodes()] == ["h1", "h5", "h9"]


def test_plan_nodes_follow_the_contract() -> None:
    s = Scheduler()
    cap = [host("h1", 4, simulated=True, cpus=2), host("h2", 8)]
    p = s.reserve("j", gpu_job("x", 2, 2), cap)
    nodes = p.to_plan_nodes()
    assert nodes == [
        {
            "host": "h1",
            "address": "10.0.0.1",
            "slots": 2,
            "gpus": [0, 1],
            "cpus": 2,
            "instance_type": "rigdeck.sim-gpu-4",
            "simulated": True,
        },
        {
            "host": "h2",
            "address": "10.0.0.2",
            "slots": 2,
            "gpus": [0, 1],
            "cpus": 16,
            "instance_type": "rigdeck.gpu-8xnvidia-h100-80gb-hbm3",
            "simulated": False,
        },
    ]
    assert json.loads(json.dumps(nodes)) == nodes
    assert Placement.from_plan_nodes(nodes) == p
    assert p.world_size == 4


def test_instance_types() -> None:
    assert instance_type(host("h1", 0, cpus=32)) == "rigdeck.cpu-32"
    assert instance_type(host("h1", 0, cpus=None)) == "rigdeck.cpu"
    assert instance_type(host("h1", 2, simulated=True)) == "rigdeck.sim-gpu-2"
    assert instance_type(host("h1", 1)) == "rigdeck.gpu-1xnvidia-h100-80gb-hbm3"


def test_cpu_jobs_share_hosts_and_prefer_hosts_without_gpus() -> None:
    s = Scheduler()
    cap = [host("g1", 4), host("c2", 0, cpus=8), host("c1", 0, cpus=4), host("c3", 0, up=False)]
    p = s.reserve("a", cpu_job("a", 2, 3), cap)
    assert p.hosts == ("c1", "c2")
    assert [(n.slots, n.gpus, n.cpus) for n in p.nodes] == [(3, (), 4), (3, (), 8)]
    assert p.nodes[0].instance_type == "rigdeck.cpu-4"
    assert p.world_size == 6
    # Not exclusive: a second job still fits, on the least used hosts.
    p2 = s.reserve("b", cpu_job("b", 2, 1), cap)
    assert p2.hosts == ("c1", "c2")
    p3 = s.reserve("c", cpu_job("c", 3, 1), cap)
    assert p3.hosts == ("c1", "c2", "g1")
    # CPU jobs do not take GPUs.
    assert s.free_gpus(cap)["g1"] == (0, 1, 2, 3)
    with pytest.raises(PlacementError) as info:
        s.reserve("d", cpu_job("d", 4, 2), cap)
    assert str(info.value) == (
        "job 'd' asks 4 nodes x 2 processes: hosts up: 3; hosts: g1 up, c2 up, c1 up, c3 down"
    )


def test_cpu_job_on_explicit_hosts() -> None:
    s = Scheduler()
    cap = [host("g1", 4), host("c1", 0)]
    p = s.reserve("a", cpu_job("a", None, 2, hosts=["g1"]), cap)
    assert p.hosts == ("g1",)
    assert p.nodes[0].gpus == ()


def test_adopt() -> None:
    s = Scheduler()
    cap = [host("h1", 4)]
    running = Placement((NodeAssignment("h1", "10.0.0.1", 2, (1, 2), 16, "rigdeck.gpu-4", False),))
    s.adopt("old", running)
    assert s.reservations() == {"old": running}
    assert s.free_gpus(cap) == {"h1": (0, 3)}
    with pytest.raises(PlacementError, match=r"h1 GPU 1 \(job 'old'\)"):
        s.adopt("other", running)
    s.adopt("old", running)  # again: the same job, no clash
    s.release("old")
    assert s.free_gpus(cap) == {"h1": (0, 1, 2, 3)}


# ---------------------------------------------------------------------------------------------
# Invariants: no GPU held twice, all or nothing.


def assert_no_double_booking(s: Scheduler, cap: Sequence[HostCapacity]) -> None:
    by_name = {c.name: c for c in cap}
    seen: dict[tuple[str, int], str] = {}
    for jid, placement in s.reservations().items():
        assert len(set(placement.hosts)) == len(placement.nodes)
        for node in placement.nodes:
            for g in node.gpus:
                assert (node.host, g) not in seen, (jid, seen[(node.host, g)], node.host, g)
                seen[(node.host, g)] = jid
                assert g in by_name[node.host].gpus
                assert g not in by_name[node.host].foreign_busy


capacities = st.lists(
    st.tuples(st.integers(0, 6), st.booleans(), st.sets(st.integers(0, 5), max_size=3)),
    min_size=1,
    max_size=5,
).map(
    lambda rows: [
        HostCapacity(
            name=f"h{i}",
            address=f"10.0.0.{i}",
            up=up,
            cpus=4,
            gpus=tuple(range(n)),
            foreign_busy=tuple(sorted(g for g in foreign if g < n)),
            simulated=True,
            gpu_name="Simulated GPU",
        )
        for i, (n, up, foreign) in enumerate(rows)
    ]
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), st.integers(0, 7), st.integers(1, 4), st.integers(1, 4)),
        st.tuples(st.just("release"), st.integers(0, 7), st.just(0), st.just(0)),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(cap=capacities, ops=operations)
def test_random_reserve_and_release_never_double_book(
    cap: list[HostCapacity], ops: list[tuple[str, int, int, int]]
) -> None:
    s = Scheduler()
    for op, j, nodes, k in ops:
        jid = f"j{j}"
        before = s.reservations()
        if op == "release":
            s.release(jid)
            assert jid not in s.reservations()
            continue
        free_before = s.free_gpus(cap)
        try:
            p = s.reserve(jid, gpu_job(jid, nodes, k), cap)
        except PlacementError as e:
            # All or nothing: a failure holds nothing new.
            assert s.reservations() == before
            assert f"job {jid!r} asks" in str(e) or "already holds" in str(e)
            if jid not in before:
                # It really did not fit.
                assert sum(len(f) >= k for f in free_before.values()) < nodes
            continue
        assert jid not in before
        assert len(p.nodes) == nodes
        assert list(p.hosts) == sorted(p.hosts)
        for node in p.nodes:
            assert len(node.gpus) == k == node.slots
            assert set(node.gpus) <= set(free_before[node.host])
        assert s.reservations() == {**before, jid: p}
        assert_no_double_booking(s, cap)


def test_concurrent_reserves_never_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    # Widen the window between choosing GPUs and recording them, where an unlocked
    # scheduler would hand the same GPU to two threads.
    place = scheduler._place

    def slow_place(*args: Any, **kwargs: Any) -> Placement:
        time.sleep(0.002)
        return place(*args, **kwargs)

    monkeypatch.setattr(scheduler, "_place", slow_place)
    s = Scheduler()
    cap = [host(f"h{i}", 4) for i in range(1, 5)]  # 16 GPUs
    barrier = threading.Barrier(40)
    won: list[Placement] = []
    lost: list[PlacementError] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        barrier.wait()
        try:
            p = s.reserve(f"j{i}", gpu_job(f"j{i}", 1, 1 + i % 2), cap)
        except PlacementError as e:
            with lock:
                lost.append(e)
        else:
            with lock:
                won.append(p)
            if i % 5 == 0:
                s.release(f"j{i}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(won) + len(lost) == 40
    assert won and lost
    assert_no_double_booking(s, cap)
    held = sum(len(n.gpus) for p in s.reservations().values() for n in p.nodes)
    assert held <= 16


# ---------------------------------------------------------------------------------------------
# From the live cluster state


def test_capacity_from_state(tmp_path: Path) -> None:
    state = ClusterState([("h1", "10.0.0.1"), ("h2", "10.0.0.2"), ("h3", "10.0.0.3")])
    state.apply_sample(
        "h1",
        telemetry(
            [
                gpu(0),
                gpu(1, ("bob", None), ("carol", None)),
                gpu(2, ("me", "job-a")),
                gpu(3, ("me", "job-a"), (None, None)),
            ]
        ),
    )
    state.apply_sample("h2", telemetry([], cores=4))
    state.apply_sample("h3", telemetry([gpu(0)]))
    state.set_status("h3", HostStatus.DOWN, "gone")
    inv = Inventory(
        hosts=(HostSpec("h1", "10.0.0.1", labels=("a100",)), HostSpec("h2", "10.0.0.2")),
        path=None,
        known_hosts=tmp_path / "kh",
    )
    h1, h2, h3 = capacity_from_state(state.snapshot(), inv)
    assert h1 == HostCapacity(
        name="h1",
        address="10.0.0.1",
        up=True,
        cpus=8,
        gpus=(0, 1, 2, 3),
        foreign_busy=(1, 3),
        simulated=False,
        gpu_name="NVIDIA A100-SXM4-80GB",
        labels=("a100",),
        status="up",
        foreign_users=((1, "bob, carol"),),
        job_busy=((2, "job-a"), (3, "job-a")),
    )
    assert (h2.up, h2.gpus, h2.cpus) == (True, (), 4)
    assert (h3.up, h3.status) == (False, "down")

    s = Scheduler()
    caps = [h1, h2, h3]
    assert s.free_gpus(caps) == {"h1": (0,), "h2": (), "h3": ()}
    with pytest.raises(PlacementError) as info:
        s.reserve("c", gpu_job("c", 1, 2), caps)
    assert "GPU 1 used by foreign processes of users bob, carol" in str(info.value)
    assert "GPU 3 used by a foreign process;" in str(info.value)
    assert "GPU 2 running job 'job-a' (not reserved)" in str(info.value)
    assert s.reserve("c", gpu_job("c", 1, 1), caps).nodes[0].instance_type == (
        "rigdeck.gpu-4xnvidia-a100-sxm4-80gb"
    )


def test_the_queue_waits_out_a_lost_claim_race_and_nothing_else() -> None:
    """A start refused because another controller's job holds the GPUs (at the claim, or at the
    hosts' preflight check a moment before) waits in the queue; bad input and full disks do not."""
    from tui.control.jobs import JobError
    from tui.control.queue import JobQueue

    def refused(why: str) -> bool:
        return JobQueue._transient(JobError(f"job not started (nothing was started): {why}"))

    assert refused("h1: GPU 1 on tb1-h1 is held by job loop-t9 (user root, pid 340, since 2026-11-22 16:09:56)")
    assert refused("h2: GPU 0,1 claimed by job 'a' of user bob")
    assert not refused("h1: 120 MB free under the state dir, min_free_mb is 2048")
    assert not refused("h1: no such file: train.py")
    assert JobQueue._transient(PlacementError("h1 0 GPUs free"))


def test_launches_asking_for_capacity_at_once_share_one_read_and_its_error() -> None:
    """A wave of sweep trials starting together asks each host once, not once per trial."""
    import threading

    from tui.control.jobs import JobManager

    jm = JobManager.__new__(JobManager)  # only the read-sharing part: no hosts here
    jm._reads, jm._reads_lock = {}, threading.Lock()
    calls: list[tuple[tuple[str, ...], str | None]] = []
    gate = threading.Event()
    outcome: dict[str, Any] = {"value": ["h1 has 4"]}

    def read(hosts: Any, skip: Any = None, slurm: bool = True) -> Any:
        calls.append((tuple(hosts), skip))
        gate.wait(10)
        if isinstance(outcome["value"], Exception):
            raise outcome["value"]
        return list(outcome["value"])

    jm._capacity = read  # type: ignore[method-assign]
    results: list[Any] = []

    def ask(hosts: list[str]) -> None:
        try:
            results.append(jm.capacity(hosts))
        except Exception as e:  # noqa: BLE001
            results.append(e)

    for outcome_value in (["h1 has 4"], RuntimeError("h1: connection refused")):
        calls.clear()
        results.clear()
        gate.clear()
        outcome["value"] = outcome_value
        threads = [threading.Thread(target=ask, args=(["h1", "h2"],)) for _ in range(6)]
        threads.append(threading.Thread(target=ask, args=(["h1"],)))  # other hosts: its own read
        for t in threads:
            t.start()
        deadline = time.monotonic() + 5
        while len(calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # the others are waiting on the read in flight by now
        gate.set()
        for t in threads:
            t.join(10)
        assert sorted(calls) == [(("h1",), None), (("h1", "h2"), None)], calls
        assert len(results) == 7
        if isinstance(outcome_value, Exception):
            assert all(r is outcome_value for r in results)
        else:
            assert all(r == ["h1 has 4"] for r in results)
    # Once it is done, the next launch reads afresh.
    outcome["value"] = ["h1 has 3"]
    assert jm.capacity(["h1", "h2"]) == ["h1 has 3"]
    assert calls[-1] == (("h1", "h2"), None) and len(calls) == 3
    assert jm._reads == {}


def test_a_queued_job_that_does_not_fit_stays_in_line_while_the_queue_looks(tmp_path) -> None:
    """The queue asks whether a job fits before taking it from the line: a job that does not
    fit is never `pending` (out of `rigdeck queue`) for the length of a try, and a job that fits
    is launched with the capacity just read (one read, not two)."""
    from tui.control.history import History
    from tui.control.queue import JobQueue
    from tui.model.jobspec import JobSpec
    from tui.model.scheduler import HostCapacity, Scheduler

    history = History(tmp_path / "history.sqlite")
    seen: list[tuple[str, str]] = []
    history.observers.append(lambda job_id, state, fields: seen.append((job_id, state)))

    class Manager:
        def __init__(self) -> None:
            self.history = history
            self.scheduler = Scheduler()
            self.free = (0,)
            self.launched: list[tuple[str, object]] = []
            self.ctl = type("Ctl", (), {"inventory": type("Inv", (), {"names": ["h1"]})()})()

        def capacity(self, hosts):
            busy = tuple(g for g in range(4) if g not in self.free)
            return [HostCapacity("h1", "10.0.0.1", True, 8, (0, 1, 2, 3), busy, True, "Simulated GPU",
                                 foreign_users=tuple((g, "bob") for g in busy))]

        def launch(self, spec, *, job_id, capacity):
            self.launched.append((job_id, capacity))

    jm = Manager()
    q = JobQueue(jm)  # type: ignore[arg-type]
    spec = JobSpec(name="big", command=("true",), workdir="/", nodes=1, gpus_per_node=2)
    history.create("big-1", "big", spec.to_dict(), state="queued")
    for _ in range(3):
        assert q.advance() == []
        assert [e.job_id for e in q.entries()] == ["big-1"]
    assert ("big-1", "pending") not in seen and jm.launched == []
    assert "GPU" in (history.get("big-1") or {}).get("waiting", "")
    jm.free = (0, 1, 2)
    assert q.advance() == ["big-1"]
    assert [j for j, _ in jm.launched] == ["big-1"] and jm.launched[0][1] is not None


# ---------------------------------------------------------------------------------------------
# Worker pools: one node per replica, every pool or none


def pool_job(*pools: Any, name: str = "pj") -> JobSpec:
    from tui.model.poolspec import PoolSpec

    return JobSpec(name=name, command=("python", "train.py"), workdir="/w",
                   pools=tuple(p if isinstance(p, PoolSpec) else PoolSpec(**p) for p in pools))


def labelled(cap: HostCapacity, *labels: str) -> HostCapacity:
    import dataclasses

    return dataclasses.replace(cap, labels=labels)


def test_pool_replicas_are_nodes_in_pool_order_spread_over_hosts() -> None:
    spec = pool_job({"role": "evaluator"}, {"role": "worker", "replicas": 2, "gpus_per_replica": 2},
                    {"role": "primary", "gpus_per_replica": 2},
                    {"role": "parameter_server", "labels": ("cpu",)})
    caps = [host("h1", 4), host("h2", 4), labelled(host("h3", 0), "cpu")]
    p = Scheduler().reserve("j", spec, caps)
    got = [(n.pool, n.replica, n.host, n.gpus, n.slots) for n in p.nodes]
    # GPU replicas: fewest of this job first, then most free GPUs, then name; the parameter
    # server only on the labelled host; the evaluator (CPU) on a host with fewest replicas (h2
    # and h3 have one each), GPU-less hosts before others.
    assert got == [("primary", 0, "h1", (0, 1), 2), ("worker", 0, "h2", (0, 1), 2),
                   ("worker", 1, "h1", (2, 3), 2), ("parameter_server", 0, "h3", (), 1),
                   ("evaluator", 0, "h3", (), 1)]
    assert p.hosts == ("h1", "h2", "h3") and p.on_host("h1") == [0, 2] and p.on_host("h3") == [3, 4]
    assert p.world_size == spec.world_size == 8
    plan = p.to_plan_nodes()
    assert plan[2]["pool"] == "worker" and plan[2]["replica"] == 1
    assert Placement.from_plan_nodes(plan) == p


def test_a_plain_jobs_plan_nodes_have_no_pool_keys() -> None:
    p = Scheduler().reserve("j", gpu_job("g", 2, 1), [host("h1"), host("h2")])
    assert all("pool" not in n and "replica" not in n for n in p.to_plan_nodes())
    assert Placement.from_plan_nodes(p.to_plan_nodes()) == p


def test_pools_are_placed_all_or_none_and_the_error_names_the_pool() -> None:
    s = Scheduler()
    spec = pool_job({"role": "primary", "gpus_per_replica": 2},
                    {"role": "worker", "replicas": 3, "gpus_per_replica": 2})
    with pytest.raises(PlacementError) as e:
        s.reserve("j", spec, [host("h1", 4), host("h2", 2)])
    assert str(e.value) == ("job 'pj' asks pool 'worker' 3 replicas x 2 GPUs: replica 2 has no host with "
                            ">= 2 free GPUs (2 replicas placed); its hosts: h1 0 free GPUs, h2 0 free GPUs")
    assert s.reservations() == {}  # nothing held
    # Another job's GPUs are not free; the all-fit case holds every replica's GPUs.
    s.reserve("other", gpu_job("o", 1, 2, hosts=["h1"]), [host("h1", 4), host("h2", 4)])
    assert s.fits(spec, [host("h1", 4), host("h2", 4)]) is not None  # 8 GPUs asked, 6 free
    two = pool_job({"role": "primary", "gpus_per_replica": 2}, {"role": "worker", "replicas": 2, "gpus_per_replica": 2})
    p = s.reserve("j", two, [host("h1", 4), host("h2", 4)])
    assert [(n.host, n.gpus) for n in p.nodes] == [("h2", (0, 1)), ("h1", (2, 3)), ("h2", (2, 3))]
    assert p.gpu_keys().isdisjoint(s.reservations()["other"].gpu_keys())


def test_pool_pins_hosts_and_labels() -> None:
    caps = [labelled(host("h1", 0), "cpu"), labelled(host("h2", 0), "cpu"), host("h3", 2)]
    spec = pool_job({"role": "primary", "hosts": ("h3",)}, {"role": "evaluator", "replicas": 2, "labels": ("cpu",)})
    p = Scheduler().reserve("j", spec, caps)
    assert [(n.pool, n.host) for n in p.nodes] == [("primary", "h3"), ("evaluator", "h1"), ("evaluator", "h2")]
    down = [labelled(host("h1", 0, up=False, status="down"), "cpu"), *caps[1:]]
    p = Scheduler().reserve("j", spec, down)  # the other labelled host takes both replicas
    assert [(n.pool, n.host) for n in p.nodes] == [("primary", "h3"), ("evaluator", "h2"), ("evaluator", "h2")]
    with pytest.raises(PlacementError, match=r"field 'pools\[1\]\.labels': expected labels some inventory "
                       r"host carries \(known: cpu\) \(pool 'evaluator'\), got 'fast'"):
        Scheduler().reserve("j", pool_job({"role": "primary"}, {"role": "evaluator", "labels": ("fast",)}), caps)
    with pytest.raises(PlacementError, match=r"field 'pools\[0\]\.hosts'.*got unknown 'h9'"):
        Scheduler().reserve("j", pool_job({"role": "primary", "hosts": ("h9",)}), caps)
    with pytest.raises(PlacementError, match=r"^job 'pj' asks pool 'primary' 1 replica x 1 process on h1: "
                       r"replica 0 has no host up; its hosts: h1 down$"):
        Scheduler().reserve("j", pool_job({"role": "primary", "hosts": ("h1",)}), down)


def test_the_server_host_takes_no_job_unless_the_inventory_allows_it(tmp_path: Path) -> None:
    """A job on the [server] host runs as an account that can change the server's files: it is
    not placed there (named, with the rule, when a spec asks for it) unless allow_jobs."""
    from tui.model.inventory import ServerSpec

    state = ClusterState([("h1", "10.0.0.1"), ("h2", "10.0.0.2")])
    for h in ("h1", "h2"):
        state.apply_sample(h, telemetry([gpu(0), gpu(1)]))
    hosts = (HostSpec("h1", "10.0.0.1"), HostSpec("h2", "10.0.0.2"))
    guarded = Inventory(hosts=hosts, path=None, known_hosts=tmp_path / "kh", server=ServerSpec("h1"))
    h1, h2 = capacity_from_state(state.snapshot(), guarded)
    assert (h1.up, h1.status, h2.up) == (False, "server", True)
    s = Scheduler()
    placed = s.reserve("a", gpu_job("a", 1, 2), [h1, h2])
    assert [n.host for n in placed.nodes] == ["h2"]
    with pytest.raises(PlacementError, match=r"host 'h1' is server \(the \[server\] host takes no jobs"):
        Scheduler().reserve("b", JobSpec(name="b", command=("x",), workdir="/", hosts=("h1",), gpus_per_node=1),
                            [h1, h2])
    allowed = Inventory(hosts=hosts, path=None, known_hosts=tmp_path / "kh", server=ServerSpec("h1", allow_jobs=True))
    assert [c.up for c in capacity_from_state(state.snapshot(), allowed)] == [True, True]
