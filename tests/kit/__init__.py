"""The test kit: helpers more than one test file uses, each defined once here (issue 50).

A test file imports what it needs from here, never from another ``test_*.py`` module (importing a
test module runs its module-level set-up and ties the two files' edits together).

- ``tests.kit`` (this module): the repository's paths, ``wait_until``, ``conforms`` (a JSON
  object's exact shape), ``communicate_all`` (many processes to their ends).
- ``tests.kit.bedcli``: ``Cli``, rigdeck's command line against a test bed, in a test's own
  ``RIGDECK_HOME``; ``tagged``, a job's processes on the bed's hosts. The ``cli`` fixture
  (tests/conftest.py) makes one; its options come from a ``cli_options`` marker.
- ``tests.kit.local``: a one-host cluster on this machine, without SSH (an inventory, the
  environment of a ``rigdeck`` command line, that command) and the agent daemon's socket.
- ``tests.kit.specs``: job, pipeline and sweep specs written for a test.
- ``tests.kit.prom``: the Prometheus text format read strictly, ``rigdeck exporter`` running,
  promtool and a Prometheus server.
- ``tests.kit.fakes``: stand-ins: pynvml, a host's telemetry, a notify command, a listener.
- ``tests.kit.healing``: the healing tests' training loop, a simulated GPU's faults, a running job
  found by its step, the controllers of a test's home.

The bed itself is tests/testbed.py and its fixtures are in tests/conftest.py.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent.parent
JOBSCRIPTS = ROOT / "tests" / "jobscripts"
EXAMPLES = ROOT / "examples"
TICKER = JOBSCRIPTS / "ticker.py"  # a stand-in training rank: N steps, a line and a metrics record each
PROBE = ROOT / "tests" / "probe_rank.py"  # checks every view of the cluster agrees, then joins gloo
TRACKERS = JOBSCRIPTS / "tracker_links.py"  # prints W&B's and MLflow's run links as they do

T = TypeVar("T")


def wait_until(cond: Callable[[], T], timeout: float, what: str, step: float = 0.2) -> T:
    """The first true value of ``cond()``, asked every ``step`` seconds, or after as long as the
    last ask took when that was longer: a slow ``cond`` (a CLI call, ~0.2 s of CPU) is asked at
    most half the time, not back to back (on the CI's 2 cores a test's polls take CPU from the
    jobs it waits for). An AssertionError naming ``what`` when none came within ``timeout``.
    ``cond`` is asked once more at the deadline, so a slow ``cond`` still gets its last look. A
    wait, not a timing: the limit only ends a broken run (AGENTS.md: no timed tests)."""
    deadline = time.monotonic() + timeout
    while True:
        asked = time.monotonic()
        value = cond()
        if value:
            return value
        now = time.monotonic()
        left = deadline - now
        if left <= 0:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {value!r:.300})")
        time.sleep(min(max(step, now - asked), left))


def conforms(obj: Any, schema: dict[str, Any], where: str) -> None:
    """``obj`` has exactly ``schema``'s keys, each of its type (a bool is not an int here)."""
    assert isinstance(obj, dict), f"{where}: {obj!r} is not an object"
    assert set(obj) == set(schema), \
        f"{where}: extra {sorted(set(obj) - set(schema))}, missing {sorted(set(schema) - set(obj))}"
    for key, types in schema.items():
        types = types if isinstance(types, tuple) else (types,)
        value = obj[key]
        ok = isinstance(value, types) and (bool in types or not isinstance(value, bool))
        assert ok, f"{where}.{key}: {value!r} is not {' or '.join(t.__name__ for t in types)}"


def communicate_all(procs: list[subprocess.Popen[str]], timeout: float = 180) -> list[subprocess.CompletedProcess[str]]:
    """Wait for every process and collect its output; any still running at the end is killed."""
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            outs.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs
