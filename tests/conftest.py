"""Shared fixtures. The network-namespace test bed: see tests/testbed.py."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# The kit's helpers assert (a spec's error, an exposition's shape): their failures say what was
# compared, as a test's own asserts do. Registered before anything imports the kit.
pytest.register_assert_rewrite("tests.kit")

from tests import bedclean, slurmbed  # noqa: E402
from tests._require import require  # noqa: E402
from tests.kit.bedcli import Cli  # noqa: E402
from tests.slurmbed import SlurmBed  # noqa: E402
from tests.testbed import PEOPLE, TestBed, TestBedError, available, cleanup_stale, ensure_account  # noqa: E402

_AVAILABLE: tuple[bool, str] | None = None


def _require_testbed() -> None:
    """Skip (or, with RIGDECK_REQUIRE_TESTBED=1, fail) when this machine cannot run the bed."""
    global _AVAILABLE
    if _AVAILABLE is None:
        _AVAILABLE = available()
    ok, reason = _AVAILABLE
    require(ok, f"test bed unavailable: {reason}")


def pytest_configure(config: pytest.Config) -> None:
    # The beds' people (real Unix accounts) made once, here in the controller, before any worker
    # starts a bed: useradd replaces /etc/passwd, and a bed host that gives root another login
    # shell (test_honest's fish host) sees its own passwd through a bind mount over /etc/passwd,
    # which a rename over that path in this namespace detaches: an account made while such a
    # host runs would give it back the system's shell (fresh run 29 saw bash there).
    if hasattr(config, "workerinput") or os.name != "posix" or os.geteuid() != 0 or not shutil.which("useradd"):
        return
    for name in PEOPLE:
        try:
            ensure_account(name)
        except TestBedError as e:  # the tests that need them say so
            print(f"warning: test bed account {name}: {e}")


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


# Seconds per test file (setup, call and teardown summed), printed at the end: under
# `--dist loadfile` a file runs on one worker, so the longest file bounds the run. Reports reach
# the controller's hook under xdist too.
_FILE_SECONDS: dict[str, float] = {}
FILES_SHOWN = 40


# The files handed to the xdist workers first (the Makefile runs `--dist loadfile
# --no-loadscope-reorder`), longest first, from the summary below: a long file that starts last
# runs alone at the end while the other workers idle. xdist's own order (most tests first) put
# these bed files, which have few tests each, at the end. The rest follow in collection order.
LONG_FIRST = (
    "tests/test_server.py", "tests/test_healing_gpu.py", "tests/test_jobs.py", "tests/test_lifecycle.py",
    "tests/test_container_docker.py", "tests/test_sweeps.py", "tests/test_memcheckpoint.py",
    "tests/test_ui_pilot.py", "tests/test_examples.py", "tests/test_container.py",
    "tests/test_healing_hosts.py", "tests/test_healing.py", "tests/test_examples_e2e.py",
    "tests/test_engines.py", "tests/test_server_accounts.py", "tests/test_healing_alone.py",
    "tests/test_examples_pipeline_e2e.py", "tests/test_pipelines.py", "tests/test_container_faults.py",
    "tests/test_container_grains.py", "tests/test_examples_owner_e2e.py", "tests/test_accounts.py",
    "tests/test_codesync.py", "tests/test_signals_e2e.py", "tests/test_ui_snapshots.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    first = {path: i for i, path in enumerate(LONG_FIRST)}
    # (a stable sort: the rest keep their order)
    items.sort(key=lambda item: first.get(item.nodeid.split("::", 1)[0], len(first)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _FILE_SECONDS or hasattr(terminalreporter.config, "workerinput"):
        return
    slowest = sorted(_FILE_SECONDS.items(), key=lambda kv: kv[1], reverse=True)[:FILES_SHOWN]
    total = sum(_FILE_SECONDS.values())
    terminalreporter.write_sep("=", f"slowest {len(slowest)} test files (setup + call + teardown); "
                                    f"all {len(_FILE_SECONDS)} files: {total:.0f} s")
    for path, seconds in slowest:
        terminalreporter.write_line(f"{seconds:8.1f}s {path}")


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
def cli(testbed: TestBed, tmp_path: Path, request: pytest.FixtureRequest) -> Cli:
    """rigdeck's command line against the session's bed, in this test's own home and inventory
    (tests/kit/bedcli.py). A test or module that needs more says so with a marker, whose keywords
    are Cli's options: ``pytestmark = pytest.mark.cli_options(min_free_mb=1)``."""
    options = request.node.get_closest_marker("cli_options")
    return Cli(testbed, tmp_path, **(options.kwargs if options else {}))


@pytest.fixture
def testbed_factory() -> Iterator[Callable[..., TestBed]]:
    """make(n, sim_gpus=0, people=()) -> a started TestBed of its own (``people``: accounts with
    keys of their own, tests/testbed.py); all are torn down after the test."""
    _require_testbed()
    beds: list[TestBed] = []

    def make(n: int, sim_gpus: int = 0, people: tuple[str, ...] = ()) -> TestBed:
        bed = TestBed(n, sim_gpus=sim_gpus, people=people)
        beds.append(bed)
        return bed.up()

    try:
        yield make
    finally:
        for bed in reversed(beds):
            bed.down()


# Fixtures whose bed outlives one test (a module's or the session's): every test that uses one
# begins on a clean bed, and a test that leaves something there fails for it (tests/bedclean.py).
SHARED_BEDS = ("testbed", "served", "bed")
SETTLE_S = 10.0  # what a test stopped at its end may take to be gone from its hosts


def _shared_beds(request: pytest.FixtureRequest) -> list[TestBed]:
    beds = []
    for name in SHARED_BEDS:
        if name in request.fixturenames:
            value = request.getfixturevalue(name)
            value = value[0] if isinstance(value, tuple) else value
            if isinstance(value, TestBed) and value.hosts:
                beds.append(value)
    return beds


@pytest.fixture(autouse=True)
def _shared_bed_is_clean(request: pytest.FixtureRequest) -> Iterator[None]:
    """Before the test: the shared bed holds nothing of an earlier test (anything found is taken
    away first, and said). After it: what the test left (a job's processes, a GPU claim, a link
    down or rate-limited, a firewall rule) is taken away and fails this test, by name."""
    if not any(n in request.fixturenames for n in SHARED_BEDS) or os.geteuid() != 0:
        yield
        return
    beds = _shared_beds(request)
    for bed in beds:
        found = bedclean.leftovers(bed)
        if found:
            still = bedclean.clean(bed)
            print(f"\nwarning: bed {bed.k} held before {request.node.nodeid} (taken away):\n  "
                  + "\n  ".join(found), file=sys.stderr)
            if still:
                pytest.fail(f"bed {bed.k} could not be cleaned: {still}", pytrace=False)
    yield
    for bed in beds:
        found = bedclean.settled(bed, SETTLE_S)
        if found:
            still = bedclean.clean(bed)
            pytest.fail(f"{request.node.name} left this on the shared bed {bed.k} (taken away now"
                        + (f"; still there: {still}" if still else "") + "):\n  " + "\n  ".join(found),
                        pytrace=False)


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


# A real Slurm on a bed of its own (tests/slurmbed.py): one per test file that asks for it.
@pytest.fixture(scope="module")
def slurm_cluster(request: pytest.FixtureRequest) -> Iterator[SlurmBed]:
    """A started 3-host bed (4 simulated GPUs each) with Slurm up on it: slurmctld on h1, a
    slurmd on every host, the GPUs as GRES; torn down (and checked gone) after the file's tests.
    A test file that sets ``SLURM_ACCOUNTING = True`` gets Slurm's accounting too (slurmdbd and
    its database: ``sacct`` answers)."""
    _require_testbed()
    ok, why = slurmbed.available()
    require(ok, f"Slurm unavailable: {why}")
    accounting = bool(getattr(request.module, "SLURM_ACCOUNTING", False))
    if accounting:
        ok, why = slurmbed.accounting_available()
        require(ok, f"Slurm's accounting unavailable: {why}")
    bed = TestBed(3, sim_gpus=4)
    try:
        bed.up()
        cluster = SlurmBed(bed, accounting=accounting).up()
    except Exception as e:  # a Slurm command that failed as much as the bed: say it, leave nothing
        bed.down()
        pytest.fail(f"Slurm on the test bed did not come up: {type(e).__name__}: {e}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.down()
        left = slurmbed.processes(bed)
        bed.down()
        assert not left, f"Slurm's processes outlived its teardown: {left}"


@pytest.fixture
def slurm(slurm_cluster: SlurmBed) -> Iterator[SlurmBed]:
    """The file's Slurm, checked clean (every node idle, no job) before and after the test: what
    a test left is taken away and fails that test."""
    bed = slurm_cluster.bed
    found = slurm_cluster.leftovers() + bedclean.leftovers(bed)
    if found:
        slurm_cluster.clean()
        bedclean.clean(bed)
        print(f"\nwarning: Slurm's bed held before this test (taken away): {found}", file=sys.stderr)
    yield slurm_cluster
    found = slurm_cluster.settled() + bedclean.settled(bed, SETTLE_S)
    if found:
        slurm_cluster.clean()
        bedclean.clean(bed)
        pytest.fail(f"the test left this on Slurm's bed (taken away now): {found}", pytrace=False)
