"""A real Slurm on the test bed (tests/slurmbed.py): GRES jobs see their GPUs, drains show.

The GPUs are simulated (dummy device files): Slurm allocates them and sets the job's
environment as on a real node."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.kit.bedcli import Cli
from tests.slurmbed import OTHER_USER, SlurmBed

pytestmark = pytest.mark.testbed


def submit(slurm: SlurmBed, *args: str, user: str | None = None) -> str:
    """``sbatch ARGS`` on h1; the job's id."""
    cp = slurm.run(["sbatch", "--parsable", f"--output={slurm.out}/%j.out", "--chdir=/tmp", *args],
                   user=user)
    return cp.stdout.strip().split(";")[0]


def wait_gone(slurm: SlurmBed, job_id: str, timeout: float = 60.0) -> None:
    """Until Slurm runs or holds the job no more."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(line.split()[0] == job_id for line in slurm.jobs()):
            return
        time.sleep(0.2)
    raise AssertionError(f"Slurm job {job_id} still there after {timeout}s: {slurm.jobs()}")


def wait_running(slurm: SlurmBed, job_id: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if f"{job_id} RUNNING" in " ".join(slurm.jobs()):
            return
        time.sleep(0.1)
    raise AssertionError(f"Slurm job {job_id} not running after {timeout}s: {slurm.jobs()}")


def test_every_node_is_idle_with_its_gpus(slurm: SlurmBed) -> None:
    cp = slurm.run(["sinfo", "-h", "-N", "-o", "%N %t %G"])
    rows = sorted(line.split() for line in cp.stdout.splitlines())
    assert rows == [[n, "idle", "gpu:4"] for n in sorted(slurm.nodes)], cp.stdout


def test_three_node_gres_job_sees_two_gpus_on_each(slurm: SlurmBed) -> None:
    job = submit(slurm, "-N", "3", "--gres=gpu:2", "--wrap",
                 "srun sh -c 'echo $(hostname) $SLURM_NODEID CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES'")
    wait_gone(slurm, job)
    out = (slurm.out / f"{job}.out").read_text()
    lines = sorted(line.split() for line in out.splitlines() if "CUDA_VISIBLE_DEVICES" in line)
    assert [(words[0], words[2]) for words in lines] == [
        (n, "CUDA_VISIBLE_DEVICES=0,1") for n in sorted(slurm.nodes)], out


@pytest.mark.parametrize("request_args", [
    ("--gres=gpu:2",),
    ("--gres=gpu:4",),
    ("--gpus-per-node=2",),
    ("--gpus=2",),
    ("-n", "2", "--gpus-per-task=1"),
    ("--gres=gpu:1", "--cpus-per-gpu=2"),
], ids=lambda a: " ".join(a))
def test_gres_request_is_allocated(slurm: SlurmBed, request_args: tuple[str, ...]) -> None:
    """The GRES requests rigdeck may make, each allocated by this Slurm (22.05.8, which Slurm's
    bug 15857 names: docs/slurm.md says which requests it hits and which it spares)."""
    job = submit(slurm, "-N", "1", *request_args, "--wrap", "echo GPUS=$CUDA_VISIBLE_DEVICES")
    wait_gone(slurm, job)
    out = (slurm.out / f"{job}.out").read_text()
    assert "GPUS=" in out and "not available" not in out, out


def test_drain_shows_in_sinfo_reasons(slurm: SlurmBed) -> None:
    node = slurm.node(2)
    reason = "rigdeck test: GPU 1 XID 79"
    slurm.run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])
    try:
        cp = slurm.run(["sinfo", "-R", "-h", "-o", "%N|%E|%u"])
        assert cp.stdout.split("\n")[0].split("|") == [node, reason, "root"], cp.stdout
        assert slurm.node_states()[node] == "drain"
    finally:
        slurm.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])


def test_other_users_job_holds_gpus(slurm: SlurmBed) -> None:
    """A second Unix user's job holds 2 GPUs of a node: Slurm says so in the node's GresUsed."""
    node = slurm.node(2)
    job = submit(slurm, "-w", node, "--gres=gpu:2", "--wrap", "sleep 60", user=OTHER_USER)
    try:
        wait_running(slurm, job)
        # 22.05 says how many of a node's GPUs are used, and the job which ones it holds
        cp = slurm.run(["scontrol", "-d", "show", "node", node])
        assert "GresUsed=gpu:2\n" in cp.stdout, cp.stdout
        cp = slurm.run(["scontrol", "-d", "show", "job", job])
        assert f"Nodes={node} CPU_IDs=0 Mem=0 GRES=gpu:2(IDX:0-1)" in cp.stdout, cp.stdout
        assert f"{job} RUNNING {OTHER_USER}" in slurm.jobs()
    finally:
        slurm.run(["scancel", job])


def test_rigdeck_beside_slurm_never_takes_the_gpus_slurm_gave(slurm: SlurmBed, tmp_path: Path) -> None:
    """No [slurm] in the inventory: another user's Slurm job holds GPUs 0-1 of h2, so rigdeck
    places a 2-GPU job on 2-3, and one that needs all 4 is refused naming the Slurm job."""
    cli = Cli(slurm.bed, tmp_path)
    node = slurm.node(2)
    job = submit(slurm, "-w", node, "--gres=gpu:2", "--wrap", "sleep 300", user=OTHER_USER)
    try:
        wait_running(slurm, job)
        body = '''command = ["sh", "-c", "echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"]
workdir = "/"
launcher = "direct"
hosts = ["h2"]
nodes = 1
gpus_per_node = {n}
'''
        # The app's GPU view (embedded, the bed's real agents) names the Slurm job and its user
        # on h2's GPUs 0-1, and leaves 2-3 free.
        shown = app_gpu_jobs(cli, "h2")
        assert shown == {0: f"slurm job {job}, user {OTHER_USER}", 1: f"slurm job {job}, user {OTHER_USER}",
                         2: "-", 3: "-"}, shown
        view = cli.json("launch", str(cli.spec("beside", body.format(n=2))), "--wait", timeout=120)
        assert view["state"] == "succeeded", json.dumps(view, indent=1)[:3000]
        assert [(n["host"], n["gpus"]) for n in view["placement"]] == [("h2", [2, 3])]
        logs = cli.run("logs", view["job_id"]).stdout
        # a rank a GPU, each seeing its own
        assert sorted(logs.splitlines()) == ["[h2 r0] CUDA_VISIBLE_DEVICES=2", "[h2 r1] CUDA_VISIBLE_DEVICES=3"], logs
        refused = cli.run("launch", str(cli.spec("all-four", body.format(n=4))), "--no-queue", check=False)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert f"GPU 0,1 allocated by Slurm to job {job} of user {OTHER_USER}" in refused.stderr, refused.stderr
        # without --no-queue it waits, saying for what
        queued = cli.json("launch", str(cli.spec("all-four-later", body.format(n=4))))
        try:
            assert queued["state"] == "queued" and queued["placement"] == [], queued
            assert f"allocated by Slurm to job {job} of user {OTHER_USER}" in queued["waiting"], queued["waiting"]
        finally:
            cli.run("stop", queued["job_id"])
    finally:
        slurm.run(["scancel", job])


def test_rigdeck_beside_slurm_keeps_off_a_node_slurm_drained_and_takes_it_back_when_resumed(
        slurm: SlurmBed, tmp_path: Path) -> None:
    """No [slurm] in the inventory: an admin drains h2's node in Slurm. A launch that names h2 is
    refused with Slurm's reason, who set it and when, before anything starts; one that does not
    lands elsewhere; once the node is resumed in Slurm, h2 takes work again."""
    cli = Cli(slurm.bed, tmp_path)
    node = slurm.node(2)
    reason = "rigdeck test: disk swap"
    body = 'command = ["true"]\nworkdir = "/"\nlauncher = "direct"\nnodes = 1\ngpus_per_node = 4\n'
    slurm.run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])
    try:
        refused = cli.run("launch", str(cli.spec("on-h2", body + 'hosts = ["h2"]\n')), "--no-queue", check=False)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert f"host 'h2' is drained (drained in Slurm: {reason} (by root at " in refused.stderr, refused.stderr
        assert cli.json("jobs") == [], "a refused launch leaves no job"
        two = cli.spec("anywhere", body.replace("nodes = 1", "nodes = 2"))
        view = cli.json("launch", str(two), "--wait", timeout=120)
        assert view["state"] == "succeeded", json.dumps(view, indent=1)[:3000]
        assert sorted(n["host"] for n in view["placement"]) == ["h1", "h3"], view["placement"]
    finally:
        slurm.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
    view = cli.json("launch", str(cli.spec("back", body + 'hosts = ["h2"]\n')), "--wait", timeout=120)
    assert view["state"] == "succeeded" and [n["host"] for n in view["placement"]] == ["h2"], view


def test_rigdeck_hosts_shows_each_nodes_slurm_state_and_drain_reason(slurm: SlurmBed, tmp_path: Path) -> None:
    cli = Cli(slurm.bed, tmp_path)
    cli.inventory.write_text(cli.inventory.read_text() + '\n[slurm]\nlogin = "h1"\npartition = "bed"\n')
    node = slurm.node(3)
    reason = "rigdeck test: GPU 1 XID 79"
    slurm.run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])
    try:
        hosts = {h["name"]: h["slurm"] for h in cli.json("hosts")}
        assert {h: (s["node"], s["state"]) for h, s in hosts.items()} == {
            "h1": (slurm.node(1), "idle"), "h2": (slurm.node(2), "idle"), "h3": (node, "drain")}
        assert (hosts["h3"]["reason"], hosts["h3"]["reason_user"], hosts["h3"]["flags"]) == (reason, "root", ["DRAIN"])
        text = cli.run("hosts").stdout
        assert f"h3\tslurm: {node} drain\tdrained in Slurm: {reason} (by root at " in text, text
        assert f"h1\tslurm: {slurm.node(1)} idle\n" in text, text
        # The app's Hosts view (embedded, the bed's real hosts): Slurm's word for each node, and
        # why h3 is drained, as Slurm said it on the login host.
        shown = app_hosts_slurm(cli)
        assert shown["slurm"] == {"h1": "idle", "h2": "idle", "h3": "drain"}, shown
        assert shown["why"]["h3"].startswith(f"drained in Slurm: {reason} (by root at "), shown
        assert shown["why"]["h1"] == "", shown
    finally:
        slurm.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])


def test_an_inventory_with_no_hosts_gets_slurms_nodes_through_a_login_alias_and_launches_on_them(
        slurm: SlurmBed, tmp_path: Path) -> None:
    """The inventory says only [defaults] and [slurm] with ``login`` an ~/.ssh/config alias (of
    h1): rigdeck reads the nodes there (``scontrol -o show nodes``, over SSH), each a host named
    as Slurm names it, the alias merged with the node it is; the hosts come up, and a job
    launched through Slurm runs on them."""
    bed = slurm.bed
    cli = Cli(bed, tmp_path)
    ssh = tmp_path / "ssh_config"
    ssh.write_text(f"Host cluster\n    HostName {bed.hosts[0].address}\n")
    base = bed.write_inventory(tmp_path / "base.toml", hosts=[], python=sys.executable, connect_timeout=5.0,
                               sim_gpus=4, ssh_config=str(ssh))
    assert "[[hosts]]" not in base.read_text()
    cli.inventory.write_text(base.read_text() + '\n[slurm]\nlogin = "cluster"\npartition = "bed"\n')
    hosts = cli.json("hosts")
    assert [h["name"] for h in hosts] == slurm.nodes, hosts
    assert [h["address"] for h in hosts] == [h.address for h in bed.hosts]
    assert all(not h.get("error") for h in hosts), hosts
    assert [h["slurm"]["state"] for h in hosts] == ["idle"] * 3  # Slurm's state of each, read on the login
    body = ('command = ["sh", "-c", "echo $(hostname) CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"]\nworkdir = "/"\n'
            'launcher = "direct"\nnodes = 2\ngpus_per_node = 1\nmax_runtime = "5m"\n')
    view = cli.json("launch", str(cli.spec("from-slurm", body)), "--wait", timeout=180)
    assert view["state"] == "succeeded", json.dumps(view, indent=1)[-3000:]
    assert len(view["placement"]) == 2 and {n["host"] for n in view["placement"]} <= set(slurm.nodes)
    logs = cli.run("logs", view["job_id"]).stdout
    assert sorted(line.split("] ", 1)[1].split()[0] for line in logs.splitlines()) == sorted(
        n["host"] for n in view["placement"]), logs  # each node's own rank, on the node Slurm chose


def with_slurm_table(cli: Cli, table: str) -> None:
    cli.inventory.write_text(cli.inventory.read_text() + "\n[slurm]\n" + table)


def wait_reason(slurm: SlurmBed, job_id: str, reason: str, timeout: float = 60.0) -> None:
    """Until Slurm gives the pending job ``reason`` (its scheduler sets it on its next pass)."""
    deadline = time.monotonic() + timeout
    said = ""
    while time.monotonic() < deadline:
        said = slurm.run(["squeue", "--noheader", f"--jobs={job_id}", "--format=%T %r"]).stdout.strip()
        if said == f"PENDING {reason}":
            return
        time.sleep(0.2)
    raise AssertionError(f"Slurm job {job_id}: {said!r}, not pending for {reason} after {timeout}s")


def test_rigdeck_queue_lists_slurms_jobs_with_their_pending_reasons(slurm: SlurmBed, tmp_path: Path) -> None:
    """Another user's job holds every GPU of the cluster: a root job asking for 2 more pends for
    Resources, a held one for JobHeldUser; `rigdeck queue` lists all three beside rigdeck's own
    (empty) queue and says whose scheduling it is."""
    cli = Cli(slurm.bed, tmp_path)
    with_slurm_table(cli, 'login = "h1"\npartition = "bed"\n')
    big = submit(slurm, "-N", "3", "--gres=gpu:4", "--wrap", "sleep 120", user=OTHER_USER)
    jobs = [big]
    try:
        wait_running(slurm, big)
        waiting = submit(slurm, "-N", "1", "--gres=gpu:2", "--wrap", "true")
        jobs.append(waiting)
        held = submit(slurm, "--hold", "-N", "1", "--gres=gpu:1", "--wrap", "true")
        jobs.append(held)
        wait_reason(slurm, waiting, "Resources")
        wait_reason(slurm, held, "JobHeldUser")
        out = cli.json("queue")
        assert out["rigdeck"] == [] and out["slurm_error"] is None, out
        got = {j["job_id"]: (j["user"], j["state"], j["reason"], j["node_count"], j["gpus_per_node"], j["nodes"])
               for j in out["slurm"]}
        assert got == {big: (OTHER_USER, "RUNNING", None, 3, 4, list(slurm.nodes)),
                       waiting: ("root", "PENDING", "Resources", 1, 2, []),
                       held: ("root", "PENDING", "JobHeldUser", 1, 1, [])}, got
        assert "rigdeck's own queue schedules no Slurm job" in out["note"]
        text = cli.run("queue").stdout
        lines = text.splitlines()
        assert "no job waits" in lines and "Slurm's queue on h1: every user's jobs, pending first" in lines, text
        rows = [line.split() for line in lines if line.split()[:1] in ([big], [waiting], [held])]
        assert rows == [[waiting, "root", "PENDING", "1", "2", "Resources"],
                        [held, "root", "PENDING", "1", "1", "JobHeldUser"],
                        [big, OTHER_USER, "RUNNING", "3", "4", ",".join(list(slurm.nodes))]], text
        assert "Slurm schedules this cluster" in text
        # The app's Jobs view lists the same queue below rigdeck's jobs, read on the login host.
        shown = app_slurm_queue(cli)
        assert shown["rows"] == [[waiting, "root", "PENDING", "1", "2", "Resources"],
                                 [held, "root", "PENDING", "1", "1", "JobHeldUser"],
                                 [big, OTHER_USER, "RUNNING", "3", "4", ",".join(list(slurm.nodes))]], shown
        assert "Slurm: 3 job(s) · 2 pending · on h1" in shown["head"], shown
        assert "Slurm schedules this cluster" in shown["head"], shown
    finally:
        slurm.run(["scancel", *jobs])
        for job in jobs:
            wait_gone(slurm, job)


def app_slurm_queue(cli: Cli) -> dict[str, Any]:
    """The app on ``cli``'s inventory (embedded, the bed's real hosts), its Jobs view once it has
    read Slurm's queue: the Slurm table's rows (as shown) and the line over it."""
    from tests.kit.pilot import static_words, until
    from tui.app.widgets.tables import SlurmQueueTable

    async def look(app: Any, pilot: Any) -> dict[str, Any]:
        await pilot.press("3")
        view = app.views["jobs"]
        table = app.query_one("#slurm-queue", SlurmQueueTable)
        await until(pilot, lambda: view.slurm_reads >= 1 and table.row_count > 0, 60)
        cols = ("job", "user", "state", "nodes", "gpus", "where")
        keys = [str(r.key.value) for r in table.ordered_rows]
        return {"rows": [[table.cell_text(k, c) for c in cols] for k in keys],
                "head": static_words(app, "#slurm-queue-head")}

    return in_app(cli, look)


def app_hosts_slurm(cli: Cli) -> dict[str, Any]:
    """The app's Hosts view on ``cli``'s inventory once it has read Slurm's nodes: each host's
    Slurm column and its "why" column, as shown."""
    from tests.kit.pilot import until
    from tui.app.widgets.tables import HostsTable

    async def look(app: Any, pilot: Any) -> dict[str, Any]:
        view = app.views["hosts"]
        table = app.query_one("#hosts-table", HostsTable)
        hosts = ("h1", "h2", "h3")
        await until(pilot, lambda: view.slurm_reads >= 1 and all(table.cell_text(h, "slurm") for h in hosts), 60)
        return {"slurm": {h: table.cell_text(h, "slurm") for h in hosts},
                "why": {h: table.cell_text(h, "why") for h in hosts}}

    return in_app(cli, look)


def app_gpu_jobs(cli: Cli, host: str) -> dict[int, str]:
    """The app's GPU view on ``cli``'s inventory, once every GPU of ``host`` is shown with the
    agent's Slurm claims: each GPU's "job" column."""
    from tests.kit.pilot import until
    from tui.app.widgets.tables import GpusTable

    async def look(app: Any, pilot: Any) -> dict[str, Any]:
        await pilot.press("2")
        table = app.query_one("#gpus-table", GpusTable)

        def rows() -> dict[int, str]:
            out = {}
            for idx in range(4):
                g = app.client.state.gpu(host, idx)
                if g is None:
                    return {}
                try:
                    out[idx] = table.cell_text(f"{host}/{g.uuid}", "job")
                except KeyError:  # not in the table yet
                    return {}
            return out

        await until(pilot, lambda: bool(rows()) and rows()[0].startswith("slurm job"), 60)
        return {"jobs": rows()}

    return dict(in_app(cli, look)["jobs"])


def in_app(cli: Cli, look: Any) -> dict[str, Any]:
    """``look(app, pilot)`` in the app on ``cli``'s inventory (embedded: the app links to the
    bed's real hosts itself), headless at 120x36."""
    import asyncio

    from tui.app.shell import RigdeckApp
    from tui.client import InProcessClient
    from tui.control.hostlinks import HostLinks
    from tui.remote.inventoryfile import load_inventory

    async def run() -> dict[str, Any]:
        app = RigdeckApp(InProcessClient(controller=HostLinks(load_inventory(cli.inventory))),
                         keymap_file=cli.tmp / "keys.toml")
        async with app.run_test(size=(120, 36)) as pilot:
            got: dict[str, Any] = await look(app, pilot)
            return got

    old = os.environ.get("RIGDECK_HOME")
    os.environ["RIGDECK_HOME"] = cli.env["RIGDECK_HOME"]
    try:
        return asyncio.run(run())
    finally:
        if old is None:
            os.environ.pop("RIGDECK_HOME", None)
        else:
            os.environ["RIGDECK_HOME"] = old


def test_an_unknown_partition_is_refused_naming_it_before_anything_runs(slurm: SlurmBed, tmp_path: Path) -> None:
    cli = Cli(slurm.bed, tmp_path)
    with_slurm_table(cli, 'login = "h1"\npartition = "gpu"\naccount = "proj-17"\n')
    body = 'command = ["true"]\nworkdir = "/"\nlauncher = "direct"\nnodes = 1\ngpus_per_node = 1\n'
    refused = cli.run("launch", str(cli.spec("p", body)), check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert (f"{cli.inventory}: [slurm] partition 'gpu': Slurm has no such partition: "
            "Partition gpu not found (its partitions: bed)") in refused.stderr, refused.stderr
    # no slurmdbd on the bed: the account is said to be unchecked, with what sacctmgr said
    assert f"{cli.inventory}: [slurm] account 'proj-17' not checked: Slurm has no accounting database" \
        in refused.stderr, refused.stderr
    assert "version" not in refused.stderr, refused.stderr  # 22.05.8's, read and new enough
    assert cli.json("jobs") == [], "nothing was launched"
    hosts = cli.run("hosts", check=False)
    assert hosts.returncode == 2 and "[slurm] partition 'gpu'" in hosts.stderr, hosts.stderr


def test_a_login_where_slurm_reaches_no_cluster_is_refused(cli: Cli) -> None:
    """The session's bed runs no Slurm (Slurm's commands are there, no configuration, no
    controller): `[slurm]` naming one of its hosts is refused naming the login and what scontrol
    said."""
    with_slurm_table(cli, 'login = "h2"\n')
    body = 'command = ["true"]\nworkdir = "/"\nlauncher = "direct"\nnodes = 1\ngpus_per_node = 1\n'
    refused = cli.run("launch", str(cli.spec("p", body)), check=False)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert (f"{cli.inventory}: [slurm] login 'h2': Slurm's commands there reach no Slurm cluster: "
            "scontrol -o show partition: ") in refused.stderr, refused.stderr
    assert cli.json("jobs") == []


def test_usage_on_slurm_without_accounting_counts_rigdecks_jobs_and_says_why(slurm: SlurmBed,
                                                                             tmp_path: Path) -> None:
    """This Slurm keeps no accounting (no slurmdbd): `rigdeck usage` counts the jobs rigdeck
    launched and says why not Slurm's, with sacct's own words."""
    cli = Cli(slurm.bed, tmp_path)
    with_slurm_table(cli, 'login = "h1"\npartition = "bed"\n')
    report = cli.json("usage")
    assert report["source"] is None, report
    assert report["note"].startswith("Slurm's accounting not read on h1: env SLURM_TIME_FORMAT=%s sacct "), report
    assert "accounting storage is disabled" in report["note"], report
    assert report["note"].endswith(": the figures are the jobs rigdeck launched"), report
    text = cli.run("usage").stdout
    assert text.splitlines()[0] == f"({report['note']})", text
