"""Slurm's state in the app (issue 47): the hosts view's Slurm column and drain reasons, and the
GPUs Slurm allocated to another user's job named as theirs in the GPU view and the map, in every
colour mode. Pilot tests over recorded data: Slurm's nodes are what a real Slurm 22.05.8 printed
on the test bed (tests/data/slurm/nodes-22.05.8-do.txt: tb1-h3 drained with a reason), read
through the service's ``exec`` as the live app reads it; the GPUs' Slurm claims are as the agent
reports them (agent/slurmnode.py). Then snapshots of those views."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.kit.pilot import static_words, until
from tests.ui_fixtures import (
    JOB,
    FakeController,
    gpu_sample,
    host_sample,
    inventory,
    recorded_app,
    settle,
    stop_servers,
)
from tui.app.shell import RigdeckApp
from tui.app.widgets.clustermap import FREE_GLYPH, SLURM_GLYPH, ClusterMap
from tui.app.widgets.tables import GpusTable, HostsTable, SlurmQueueTable
from tui.model.inventory import SlurmSpec
from tui.model.slurm import SQUEUE_ARGS
from tui.model.state import ClusterState

SIZE = (120, 36)
NODES = (Path(__file__).parent / "data" / "slurm" / "nodes-22.05.8-do.txt").read_text()
QUEUE = (Path(__file__).parent / "data" / "slurm" / "squeue-22.05.8.txt").read_text()
DRAIN_REASON = "rigdeck: h3 GPU 1 XID 79 (simulated)"  # as recorded
DRAIN_BY = "(by root at 2026-11-29T06:41:15)"
SLURM_JOB, SLURM_USER = "2", "nobody"  # holds GPUs 0-1 of tb1-h2 in the recording


def slurm_claim(job: str = SLURM_JOB, user: str = SLURM_USER) -> dict[str, Any]:
    return {"job_id": job, "user": user, "since": None, "scheduler": "slurm"}


def slurm_state(ticks: int = 20) -> ClusterState:
    """Three hosts up (tb1-h1..3): rigdeck's JOB on h1 GPUs 0-1; Slurm's job 2 of nobody holds
    h2 GPUs 0-1 (nobody's process runs on GPU 0, GPU 1 is idle under the allocation); bob's
    process on h2 GPU 3 (no job at all); the rest free."""
    state = ClusterState([(f"h{i}", f"10.213.1.{10 + i}") for i in (1, 2, 3)])
    for i in (1, 2, 3):
        state.set_agent(f"h{i}", {"agent_version": "3f9c2a71d04b8e15", "pid": 40 + i, "hostname": f"tb1-h{i}"})
    for tick in range(ticks):
        for i in (1, 2, 3):
            gpus = []
            for idx in range(4):
                job = JOB if (i == 1 and idx < 2) else None
                foreign = {(2, 0): SLURM_USER, (2, 3): "bob"}.get((i, idx))
                g = gpu_sample(i, idx, tick, job, idx if job else None, foreign)
                if i == 2 and idx < 2:
                    g["claim"] = slurm_claim()
                gpus.append(g)
            state.apply_sample(f"h{i}", host_sample(i, tick, gpus), received_at=float(tick))
    return state


class _Agents:
    """The agents' ``exec`` as the controller's pool answers it: Slurm's recorded output for
    ``scontrol -o show nodes`` on the login host; every call kept."""

    def __init__(self, answers: dict[tuple[str, ...], dict[str, Any]], calls: list[tuple[list[str], list[str]]],
                 hosts: list[str]) -> None:
        self.answers, self.calls, self.hosts = answers, calls, hosts

    def exec(self, *, argv: list[str], timeout_s: float, timeout: float | None = None) -> dict[str, Any]:
        self.calls.append((list(self.hosts), list(argv)))
        answer = self.answers.get(tuple(argv), {"exit_code": 127, "stdout": "", "stderr": "",
                                                "error": f"{argv[0]}: No such file or directory"})
        return {h: answer for h in self.hosts}


class SlurmController(FakeController):
    """The recorded controller of an inventory with ``[slurm]`` (login h1), whose agents answer
    Slurm's commands from ``answers``."""

    def __init__(self, answers: dict[tuple[str, ...], dict[str, Any]] | None = None) -> None:
        super().__init__(dataclasses.replace(inventory(), slurm=SlurmSpec(login="h1", partition="bed")))
        self.answers = answers if answers is not None else {
            ("scontrol", "-o", "show", "nodes"): {"exit_code": 0, "stdout": NODES, "stderr": ""},
            SQUEUE_ARGS: {"exit_code": 0, "stdout": QUEUE, "stderr": ""}}
        self.calls: list[tuple[list[str], list[str]]] = []
        self.threads: list[str] = []

    def agents(self, hosts: list[str]) -> _Agents:
        self.threads.append(threading.current_thread().name)
        return _Agents(self.answers, self.calls, hosts)


def slurm_app(controller: SlurmController | None = None, kind: str = "embedded") -> RigdeckApp:
    app: RigdeckApp = recorded_app(kind=kind, state=slurm_state(), controller=controller or SlurmController())
    return app


def gpu_row(app: RigdeckApp, host: str, index: int) -> str:
    g = app.client.state.gpu(host, index)
    assert g is not None
    return f"{host}/{g.uuid}"


# ---------------------------------------------------------------------------------------------
# The hosts view


async def test_hosts_view_shows_each_nodes_slurm_state_and_why_it_is_drained() -> None:
    ctl = SlurmController()
    app = slurm_app(ctl)
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one("#hosts-table", HostsTable)
        view = app.views["hosts"]
        await until(pilot, lambda: view.slurm_reads >= 1 and table.cell_text("h3", "slurm") == "drng")
        # sinfo's words: the recording has job 1 on every node (mixed); tb1-h3 drained while a
        # job still runs there (draining)
        assert [table.cell_text(h, "slurm") for h in ("h1", "h2", "h3")] == ["mix", "mix", "drng"]
        assert table.cell_text("h3", "why") == f"drained in Slurm: {DRAIN_REASON} {DRAIN_BY}"
        assert table.cell_text("h1", "why") == ""
        # read on the login host, off the UI's thread, with no shell
        assert (["h1"], ["scontrol", "-o", "show", "nodes"]) in ctl.calls
        assert ctl.threads and all(t != threading.main_thread().name for t in ctl.threads)
        detail = static_words(app, "#host-detail")
        assert "Slurm node tb1-h1 mix (mixed) · partition bed" in detail, detail
        await pilot.press("down", "down")
        await until(pilot, lambda: "tb1-h3" in static_words(app, "#host-detail"))
        detail = static_words(app, "#host-detail")
        assert detail.endswith(f"Slurm node tb1-h3 drng (mixed+drain): {DRAIN_REASON} {DRAIN_BY}"), detail


async def test_hosts_view_without_slurm_has_no_slurm_column_and_asks_nothing() -> None:
    app: RigdeckApp = recorded_app(state=slurm_state())
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one("#hosts-table", HostsTable)
        await until(pilot, lambda: table.row_count == 3)
        assert "slurm" not in table.column_keys
        assert not table.slurm and app.views["hosts"].slurm is None
        assert "Slurm" not in static_words(app, "#host-detail")
        await pilot.press("3")
        await pilot.pause()
        assert not app.query_one("#slurm-queue").display and not app.query_one("#slurm-queue-head").display
        assert app.views["jobs"].slurm_reads == 0


def drained_by_its_agent(state: ClusterState, host: int = 2) -> ClusterState:
    """``host``'s next sample says its node is drained in Slurm, as its agent reads it beside
    Slurm (agent/slurmnode.py: State= and Reason= as scontrol wrote them)."""
    sample = host_sample(host, 20, [gpu_sample(host, idx, 20, None, None, None) for idx in range(4)])
    sample["host"]["slurm"] = {"node": f"tb1-h{host}", "state": "IDLE+DRAIN",
                               "reason": f"{DRAIN_REASON} [root@2026-11-29T06:41:15]"}
    state.apply_sample(f"h{host}", sample, received_at=20.0)
    return state


async def test_beside_slurm_the_hosts_view_says_a_node_its_agent_read_drained() -> None:
    """No [slurm]: h2's agent reads its node drained in Slurm; the hosts view says it in h2's Why
    (a warning: rigdeck places nothing there) and the detail, and asks Slurm nothing itself."""
    app: RigdeckApp = recorded_app(state=drained_by_its_agent(slurm_state()))
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one("#hosts-table", HostsTable)
        await until(pilot, lambda: table.row_count == 3)
        said = f"drained in Slurm: {DRAIN_REASON} {DRAIN_BY}"
        assert table.cell_text("h2", "why") == said and table.cell_text("h1", "why") == ""
        assert "slurm" not in table.column_keys and app.views["hosts"].slurm is None
        await pilot.press("down")
        await until(pilot, lambda: said in static_words(app, "#host-detail"))


async def test_with_slurm_the_node_is_said_once_from_slurms_own_answer() -> None:
    """With [slurm] the login host's read says h3 drained; h3's agent saying it too adds nothing."""
    ctl = SlurmController()
    app: RigdeckApp = recorded_app(state=drained_by_its_agent(slurm_state(), 3), controller=ctl)
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one("#hosts-table", HostsTable)
        await until(pilot, lambda: app.views["hosts"].slurm_reads >= 1 and table.cell_text("h3", "slurm") == "drng")
        assert table.cell_text("h3", "why") == f"drained in Slurm: {DRAIN_REASON} {DRAIN_BY}"


async def test_a_slurm_that_cannot_be_read_is_said_not_raised() -> None:
    """No scontrol on the login host: the hosts are shown all the same, the Slurm column says it
    does not know, the detail says what the agent said."""
    ctl = SlurmController(answers={})
    app = slurm_app(ctl)
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one("#hosts-table", HostsTable)
        await until(pilot, lambda: app.views["hosts"].slurm_reads >= 1 and table.row_count == 3)
        await pilot.pause()
        assert [table.cell_text(h, "slurm") for h in ("h1", "h2", "h3")] == ["?", "?", "?"]
        assert [table.cell_text(h, "state") for h in ("h1", "h2", "h3")] == ["up", "up", "up"]
        detail = static_words(app, "#host-detail")
        assert ("Slurm's nodes not read on h1: scontrol -o show nodes: scontrol: No such file or directory"
                in detail), detail


async def test_an_app_attached_to_a_server_reads_slurm_through_the_server() -> None:
    """Attached to a server (a real one, over its socket): the server runs Slurm's reads on the
    login host through its own agents (``slurm_read``), and the views show them as an embedded
    app does; the server runs those exact commands and no other of a client's."""
    ctl = SlurmController()
    app = slurm_app(ctl, kind="server")
    try:
        async with app.run_test(size=SIZE) as pilot:
            table = app.query_one("#hosts-table", HostsTable)
            await until(pilot, lambda: app.views["hosts"].slurm_reads >= 1 and table.cell_text("h3", "slurm") == "drng")
            assert table.cell_text("h3", "why") == f"drained in Slurm: {DRAIN_REASON} {DRAIN_BY}"
            view = await jobs_view_read(pilot, 4)
            assert view.slurm_reads >= 1
            assert (["h1"], ["scontrol", "-o", "show", "nodes"]) in ctl.calls
            assert (["h1"], list(SQUEUE_ARGS)) in ctl.calls
            client = app.client
            for argv in (["scontrol", "update", "NodeName=tb1-h1", "State=DOWN"], ["sh", "-c", "id"],
                         ["scontrol", "-o", "show", "nodes", "tb1-h1"]):
                with pytest.raises(NotImplementedError):
                    client.exec(["h1"], argv, 5.0)
                with pytest.raises(Exception, match="slurm_read: expected one of"):
                    await asyncio.to_thread(client.slurm_read, argv)  # the wire itself refuses it
            assert all(argv in (["scontrol", "-o", "show", "nodes"], list(SQUEUE_ARGS)) for _, argv in ctl.calls)
    finally:
        stop_servers()


# ---------------------------------------------------------------------------------------------
# The Jobs view: Slurm's queue


def queue_rows(app: RigdeckApp) -> list[list[str]]:
    table = app.query_one("#slurm-queue", SlurmQueueTable)
    cols = ("job", "user", "state", "nodes", "gpus", "where")
    return [[table.cell_text(str(r.key.value), c) for c in cols] for r in table.ordered_rows]


async def jobs_view_read(pilot: Any, rows: int) -> Any:
    """The Jobs view opened, once it has read Slurm's queue and shows its ``rows``."""
    app = pilot.app
    await pilot.press("3")
    view = app.views["jobs"]
    await until(pilot, lambda: view.slurm_reads >= 1 and len(queue_rows(app)) == rows)
    return view


async def test_jobs_view_lists_slurms_queue_of_every_user_pending_first_with_slurms_reasons() -> None:
    """The queue a real Slurm 22.05.8 printed on the bed (tests/data/slurm/squeue-22.05.8.txt):
    two jobs pending (Resources, Priority), two running, root's and nobody's; below rigdeck's own
    jobs, pending first, read on the login host off the UI's thread, saying whose scheduling it is."""
    ctl = SlurmController()
    app = slurm_app(ctl)
    async with app.run_test(size=SIZE) as pilot:
        await jobs_view_read(pilot, 4)
        assert queue_rows(app) == [["3", "root", "PENDING", "3", "4", "Resources"],
                                   ["4", "nobody", "PENDING", "1", "2", "Priority"],
                                   ["1", "root", "RUNNING", "3", "2", "tb1-h1,tb1-h2,tb1-h3"],
                                   ["2", "nobody", "RUNNING", "1", "2", "tb1-h2"]]
        head = static_words(app, "#slurm-queue-head")
        assert head.startswith("Slurm: 4 job(s) · 2 pending · on h1"), head
        assert "Slurm schedules this cluster: rigdeck's launches wait in its queue, not in rigdeck's" in head
        assert (["h1"], list(SQUEUE_ARGS)) in ctl.calls
        assert all(t != threading.main_thread().name for t in ctl.threads)
        assert app.query_one("#jobs-table").row_count >= 1  # rigdeck's own jobs stay above


async def test_a_slurm_queue_that_cannot_be_read_is_said_and_its_last_answer_kept() -> None:
    ctl = SlurmController()
    app = slurm_app(ctl)
    async with app.run_test(size=SIZE) as pilot:
        view = await jobs_view_read(pilot, 4)
        ctl.answers.pop(SQUEUE_ARGS)  # squeue is gone from the login host
        view.poll()
        await until(pilot, lambda: view.slurm_reads >= 2)
        await pilot.pause()
        assert len(queue_rows(app)) == 4  # the last answer stays
        head = static_words(app, "#slurm-queue-head")
        assert "Slurm's queue not read on h1" in head and "squeue: No such file or directory" in head, head
        assert head.endswith("(the last answer shown)"), head


# ---------------------------------------------------------------------------------------------
# The GPU view and the map


async def test_gpu_view_names_the_slurm_job_and_its_user() -> None:
    app = slurm_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        table = app.query_one("#gpus-table", GpusTable)
        await until(pilot, lambda: table.row_count == 12)
        # GPU 0 runs nobody's process, GPU 1 nothing: both are Slurm job 2's
        for idx in (0, 1):
            assert table.cell_text(gpu_row(app, "h2", idx), "job") == f"slurm job {SLURM_JOB}, user {SLURM_USER}"
        assert table.cell_text(gpu_row(app, "h2", 3), "job").startswith("bob pid")
        assert table.cell_text(gpu_row(app, "h2", 2), "job") == "-"
        assert table.cell_text(gpu_row(app, "h1", 0), "job") == f"{JOB} r0"
        g = app.client.state.gpu("h2", 1)
        assert g is not None and g.busy  # not free: the idle filter leaves it out


async def test_map_draws_slurms_gpus_as_its_jobs_in_every_colour_mode() -> None:
    app = slurm_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("8")
        m = app.query_one("#cluster-map", ClusterMap)
        await until(pilot, lambda: app.tabs.active == "map" and len(m.hosts) == 3)
        for mode in ("util", "memory", "job"):
            assert m.mode == mode
            assert m.cell_at(1, 0)[0] == SLURM_GLYPH, mode  # h2 GPU 0: busy under Slurm's job
            assert m.cell_at(1, 1)[0] == SLURM_GLYPH, mode  # h2 GPU 1: idle, and still not free
            assert m.cell_at(1, 2)[0] == FREE_GLYPH, mode  # h2 GPU 2: free
            assert m.cell_at(0, 0)[0] not in (SLURM_GLYPH, FREE_GLYPH), mode  # rigdeck's JOB
            assert f"{SLURM_GLYPH} 2 Slurm's jobs" in static_words(app, "#map-legend"), mode
            await pilot.press("m")
            await pilot.pause()
        m.move_to(1, 1)
        await pilot.pause()
        detail = static_words(app, "#map-detail")
        assert f"slurm job {SLURM_JOB}, user {SLURM_USER}" in detail, detail
        assert "allocated by Slurm" in detail and not detail.endswith("free")
        users = static_words(app, "#map-users")
        assert f"{SLURM_USER} 2 GPUs 2 slurm job {SLURM_JOB}" in users, users
        assert "5 held · 7 free" in users  # JOB's 2, Slurm's 2, bob's 1: Slurm's not counted as free
        assert m.summary.free == 12 - m.summary.held


# ---------------------------------------------------------------------------------------------
# Snapshots (update with --snapshot-update after an intended change of the look; review the SVGs)


@pytest.mark.parametrize("view, keys", [("hosts", ("down", "down")), ("gpus", ("2",)), ("map", ("8", "m", "m")),
                                        ("jobs", ("3",))])
def test_views_with_slurms_state(snap_compare: Any, view: str, keys: tuple[str, ...]) -> None:
    """The hosts view with tb1-h3's drain selected; the GPU view; the map in job colours with the
    cursor on h2 GPU 1 (Slurm's job, idle); the Jobs view with Slurm's queue."""
    async def read_slurm_first(pilot: Any) -> None:
        hosts, jobs = pilot.app.views["hosts"], pilot.app.views["jobs"]
        for _ in range(200):
            if hosts.slurm_reads and jobs.slurm_reads:
                break
            await pilot.pause(0.05)
        await settle(*keys)(pilot)
        if view == "map":
            pilot.app.query_one("#cluster-map", ClusterMap).move_to(1, 1)
            await pilot.pause()

    assert snap_compare(slurm_app(), terminal_size=SIZE, run_before=read_slurm_first)
