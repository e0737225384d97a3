"""Each person's jobs run as that person's own Unix account on a host (issue 46, acceptance 2).

Two people of the test bed (real accounts of this machine, tests/testbed.py), ``rdk-alice`` and
``rdk-bob``, each with their own key, their own ``RIGDECK_HOME`` and an inventory naming their
own account; both name alice as the owner of the hosts' GPU claim directory
(``claim_dir_owner``), as every person of a shared host would name its admin. On the one host:
each one's ranks run as themselves, their GPUs are disjoint, each sees the other's GPUs as
claimed (by whom), a job needing the whole host waits naming alice's claim, a job of bob's can
neither read alice's job directory nor signal her ranks, and each ``rigdeck stop`` stops only its
owner's job."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kit import TICKER, wait_until
from tests.kit.bedcli import Cli, owners, person_ticker, running_ranks, tagged
from tests.testbed import PERSON_PYTHON, TestBed, TestBedError

pytestmark = pytest.mark.testbed

ALICE, BOB = "rdk-alice", "rdk-bob"
CLAIMS = "/dev/shm/rigdeck-gpu-claims"  # agent/claims.py DEFAULT_DIR
# What bob's job tries against alice's: her job directory, her rank (both must be refused).
SPY = """import os, sys
for what, act in (("read", lambda: os.listdir(sys.argv[1])), ("signal", lambda: os.kill(int(sys.argv[2]), 15))):
    try:
        act()
        print(what, "allowed", flush=True)
    except PermissionError as e:
        print(what, "denied:", e, flush=True)
"""


@pytest.fixture(scope="module")
def bed() -> Iterator[TestBed]:
    """One host, 4 simulated GPUs, two people (``bed``: conftest checks it is clean around each test)."""
    b = TestBed(1, sim_gpus=4, people=(ALICE, BOB))
    try:
        b.up()
    except TestBedError as e:
        pytest.fail(f"test bed did not come up: {e}", pytrace=False)
    try:
        for name, text in (("ticker.py", TICKER.read_text()), ("spy.py", SPY)):
            (b.share_dir / name).write_text(text)  # where every account can read it
            os.chmod(b.share_dir / name, 0o644)
        yield b
    finally:
        b.down()


def person(bed: TestBed, tmp: Path, name: str) -> Cli:
    """rigdeck as ``name`` runs it: their home, their key, their account on the hosts."""
    return Cli(bed, tmp / name, user=name, identity_file=str(bed.person_key(name)), python=PERSON_PYTHON,
               claim_dir_owner=ALICE)


def stop_agents(bed: TestBed) -> None:
    """End every person's agent daemon on the host (the next command starts one with the
    environment its inventory gives: a daemon keeps the one it started with)."""
    h = bed.hosts[0]
    for name in bed.people:
        try:
            pid = int((h.person_state_dir(name) / "run" / "daemon.pid").read_text().strip())
        except (OSError, ValueError):
            continue
        bed.exec(1, ["kill", str(pid)])
        wait_until(lambda p=pid: bed.exec(1, ["kill", "-0", str(p)]).returncode != 0, 20,  # type: ignore[misc]
                   f"{name}'s agent {pid} to end")


def claims_seen(cli: Cli) -> dict[int, Any]:
    """GPU -> its claim as ``rigdeck hosts --json`` shows it to this person."""
    (report,) = cli.json("hosts")
    assert report["reachable"] and not report["error"], report
    return {g["index"]: g["claim"] for g in report["gpus"]}


def test_two_peoples_jobs_run_as_themselves_share_no_gpu_and_see_each_others(bed: TestBed, tmp_path: Path) -> None:
    alice, bob = person(bed, tmp_path, ALICE), person(bed, tmp_path, BOB)
    h = bed.hosts[0]
    # bob first, before any claim directory exists: his agent makes none (it would be his, and
    # refused by alice's), and says who makes it and how.
    early = bob.run("launch", str(bob.spec("too-early", person_ticker(bed, 2))), "--no-queue", check=False)
    print(f"bob before any claim directory: exit {early.returncode}: {early.stderr.strip()}")
    assert early.returncode != 0, early.stdout
    assert f"GPU claim directory {CLAIMS} does not exist" in early.stderr, early.stderr
    assert f"install -d -m 1777 -o root -g root {CLAIMS}" in early.stderr, early.stderr
    bob.run("stop", "too-early", check=False)  # whatever the failed launch left in bob's history

    a = alice.json("launch", str(alice.spec("alice-job", person_ticker(bed, 2))))["job_id"]
    b = None
    try:
        st = bed.exec(1, ["stat", "-c", "%U %a", CLAIMS]).stdout.split()
        assert st == [ALICE, "1777"], st  # made by the owner's agent, sticky
        b = bob.json("launch", str(bob.spec("bob-job", person_ticker(bed, 2))))["job_id"]
        ga = alice.json("status", a)["placement"][0]["gpus"]
        gb = bob.json("status", b)["placement"][0]["gpus"]
        print(f"alice's {a} on GPUs {ga}, bob's {b} on GPUs {gb}")
        assert len(ga) == 2 and len(gb) == 2 and not set(ga) & set(gb)

        # Each one's ranks, and every process of their job, run as that person.
        pa, pb = running_ranks(alice, a, 2), running_ranks(bob, b, 2)
        print(f"ps -o user: alice's ranks {pa} -> {owners(bed, 1, pa)}, bob's ranks {pb} -> {owners(bed, 1, pb)}")
        assert owners(bed, 1, pa) == [ALICE, ALICE] and owners(bed, 1, pb) == [BOB, BOB]
        for job, who in ((a, ALICE), (b, BOB)):
            procs = [int(p.split("/")[2]) for p in tagged(bed, job)["h1"]]
            assert procs and set(owners(bed, 1, procs)) == {who}, (job, procs, owners(bed, 1, procs))

        # Each sees the other's GPUs as taken, and by whom.
        for cli in (alice, bob):
            seen = claims_seen(cli)
            print(f"{cli.inventory.parent.name} sees claims {seen}")
            assert {g: (c or {}).get("user") for g, c in seen.items()} == {
                **{g: ALICE for g in ga}, **{g: BOB for g in gb}}
            assert all(seen[g]["job_id"] == a for g in ga) and all(seen[g]["job_id"] == b for g in gb)

        # bob's job needing the whole host is refused now, or waits, naming alice's claim.
        big = bob.spec("whole-host", person_ticker(bed, 4))
        refused = bob.run("launch", str(big), "--no-queue", check=False)
        print(f"--no-queue: exit {refused.returncode}: {refused.stderr.strip()}")
        assert refused.returncode == 2, refused
        queued = bob.json("launch", str(big))
        print(f"queued: {queued['state']}: {queued['waiting']}")
        assert queued["state"] == "queued", queued
        assert a in queued["waiting"] and ALICE in queued["waiting"], queued["waiting"]
        assert bob.json("stop", queued["job_id"])["state"] == "stopped"

        # bob's job can neither read alice's job directory nor signal her rank.
        job_dir = h.person_state_dir(ALICE) / "jobs" / a
        modes = [(p.name, oct(p.stat().st_mode & 0o777), p.stat().st_uid)
                 for p in (h.person_state_dir(ALICE), job_dir.parent, job_dir)]
        print(f"alice's state dir, jobs dir, job dir on h1: {modes}")
        assert [m[2] for m in modes] == [bed.person(ALICE).uid] * 3
        assert modes[0][1] == modes[1][1] == "0o700"
        spy = bob.spec("spy", f'command = ["{{python}}", "{bed.share_dir / "spy.py"}", '
                              f'"{bed.person(ALICE).home}/.rigdeck/jobs/{a}", "{pa[0]}"]\n'
                              f'workdir = "{bed.share_dir}"\nlauncher = "direct"\nnodes = 1\n')
        view = bob.json("launch", str(spy), "--wait", timeout=120)
        logs = bob.run("logs", view["job_id"]).stdout
        print(f"bob's spy job: {view['state']}\n{logs}")
        assert view["state"] == "succeeded", view
        assert "read denied: [Errno 13] Permission denied" in logs and "signal denied: [Errno 1]" in logs, logs
        assert "allowed" not in logs

        # Each stop stops its owner's job only.
        bob.run("stop", b, "--grace", "2")
        b = None
        assert alice.json("status", a)["state"] == "running"
        assert owners(bed, 1, pa) == [ALICE, ALICE]  # her ranks live on
        assert set(claims_seen(alice)) == set(range(4)) and \
            {g for g, c in claims_seen(alice).items() if c} == set(ga)
    finally:
        if b is not None:
            bob.run("stop", b, "--grace", "2", check=False)
        alice.run("stop", a, "--grace", "2", check=False)
    assert not any(claims_seen(bob).values())


def test_a_claim_directory_made_by_another_person_is_refused_saying_how_to_make_it_right(
        bed: TestBed, tmp_path: Path) -> None:
    """Without claim_dir_owner, bob's agent trusts only root's or his own claim directory: one
    alice's agent made is refused, naming her, the command that fixes it, and the setting."""
    stop_agents(bed)
    bed.exec(1, ["rm", "-rf", CLAIMS])
    alice = person(bed, tmp_path, ALICE)
    bob = Cli(bed, tmp_path / "bob-alone", user=BOB, identity_file=str(bed.person_key(BOB)), python=PERSON_PYTHON)
    a = alice.json("launch", str(alice.spec("alice-first", person_ticker(bed, 1))))["job_id"]
    try:
        got = bob.run("launch", str(bob.spec("bob-second", person_ticker(bed, 1))), "--no-queue", check=False)
        print(f"exit {got.returncode}: {got.stderr.strip()}")
        assert got.returncode != 0
        assert f"GPU claim directory {CLAIMS} is not safe to use: it belongs to {ALICE}" in got.stderr, got.stderr
        assert f"install -d -m 1777 -o root -g root {CLAIMS}" in got.stderr, got.stderr
        assert f'claim_dir_owner = "{ALICE}"' in got.stderr, got.stderr
    finally:
        alice.run("stop", a, "--grace", "2", check=False)
        bob.run("stop", "bob-second", check=False)
    # Made right by root, as the refusal says: both trust it.
    bed.exec(1, ["install", "-d", "-m", "1777", "-o", "root", "-g", "root", CLAIMS])
    b = bob.json("launch", str(bob.spec("bob-third", person_ticker(bed, 1))))["job_id"]
    bob.run("stop", b, "--grace", "2")
    stop_agents(bed)  # the next test's agents start with their own inventories' settings

