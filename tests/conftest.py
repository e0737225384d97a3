"""Shared fixtures. The network-namespace test bed: see tests/testbed.py."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests._require import require
from tests.testbed import TestBed, TestBedError, available, cleanup_stale

_AVAILABLE: tuple[bool, str] | None = None


def _require_testbed() -> None:
    """Skip (or, with RIGDECK_REQUIRE_TESTBED=1, fail) when this machine cannot run the bed."""
    global _AVAILABLE
    if _AVAILABLE is None:
        _AVAILABLE = available()
    ok, reason = _AVAILABLE
    require(ok, f"test bed unavailable: {reason}")


def pytest_sessionstart(session: pytest.Session) -> None:
    # Leftovers of earlier runs whose process died (never beds of live processes).
    if os.name == "posix" and os.geteuid() == 0:
        try:
            cleanup_stale()
        except Exception as e:  # never block the session on a cleanup problem
            print(f"warning: test bed cleanup failed: {e}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """Each phase's report kept on the item (``item.rep_call``): a fixture's teardown can tell
    whether its test failed and say more about the state it leaves."""
    report: pytest.TestReport = yield
    setattr(item, f"rep_{report.when}", report)
    return report


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Every test marked `testbed` needs the machine, whether or not it uses a fixture.
    if item.get_closest_marker("testbed") is not None:
        _require_testbed()


@contextlib.contextmanager
def fish_bed(n: int = 3, sim_gpus: int = 4) -> Iterator[TestBed]:
    """A started bed of ``n`` hosts whose last host's root login shell is fish (every command
    sent there goes through a shell whose quoting is not POSIX sh's); torn down on exit."""
    _require_testbed()
    fish = shutil.which("fish")
    require(fish is not None, "fish is not installed (Debian: apt-get install fish; make test does)")
    bed = TestBed(n, sim_gpus=sim_gpus, login_shells={n: fish or "/usr/bin/fish"})
    try:
        bed.up()
    except TestBedError as e:
        pytest.fail(f"test bed did not come up: {e}", pytrace=False)
    try:
        yield bed
    finally:
        bed.down()


@pytest.fixture(scope="session")
def testbed() -> Iterator[TestBed]:
    """A started 3-host test bed (4 simulated GPUs each), shared by the whole session. Root's
    login shell on h3 is fish."""
    with fish_bed(3, sim_gpus=4) as bed:
        yield bed


@pytest.fixture
def testbed_factory() -> Iterator[Callable[..., TestBed]]:
    """make(n, sim_gpus=0) -> a started TestBed of its own; all are torn down after the test."""
    _require_testbed()
    beds: list[TestBed] = []

    def make(n: int, sim_gpus: int = 0) -> TestBed:
        bed = TestBed(n, sim_gpus=sim_gpus)
        beds.append(bed)
        return bed.up()

    try:
        yield make
    finally:
        for bed in reversed(beds):
            bed.down()


@pytest.fixture(autouse=True)
def _no_daemon_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests that start agent daemons in a tmp state dir must not leave them running."""
    if "tmp_path" not in request.fixturenames:
        yield
        return
    tmp = request.getfixturevalue("tmp_path")  # set up first, so torn down after this
    yield
    for pid_file in Path(tmp).glob("**/run/daemon.pid"):
        try:
            os.kill(int(pid_file.read_text().strip()), signal.SIGKILL)
        except (ValueError, OSError):
            pass
