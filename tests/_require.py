"""One way for a test to say what it needs: ``require(condition, reason)``.

Without the condition the test skips, with the reason; under ``RIGDECK_REQUIRE_TESTBED=1`` (as CI
sets, through ``make test``) it fails instead, so a machine that lacks something the suite needs
is never reported green. Every prerequisite in tests/ goes through here: the test bed, Python
3.9, tmux, mpirun, iptables, torch, psutil, root.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
from collections.abc import Callable

import pytest

REQUIRE_ENV = "RIGDECK_REQUIRE_TESTBED"


def required() -> bool:
    """Whether a missing prerequisite is a failure here (CI), not a skip."""
    return os.environ.get(REQUIRE_ENV) == "1"


def require(condition: object | Callable[[], object], reason: str) -> None:
    """Skip the calling test unless ``condition`` (or what it returns, when callable) is true;
    with RIGDECK_REQUIRE_TESTBED=1, fail instead. ``reason`` says what is missing and how to
    get it."""
    __tracebackhide__ = True  # a skip or failure is reported at the test that asked
    ok = condition() if callable(condition) else condition
    if ok:
        return
    if required():
        pytest.fail(f"required ({REQUIRE_ENV}=1) but missing: {reason}", pytrace=False)
    pytest.skip(reason)


def has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


@functools.cache
def python39() -> str | None:
    """``python3.9`` from PATH, if it runs and is 3.9 (a pyenv shim for a version not selected
    is on PATH but does not run). Debian 12 has no python3.9 package; ``make test`` puts a
    pyenv-installed one first on PATH when the machine has one (see the Makefile)."""
    path = shutil.which("python3.9")
    if path is None:
        return None
    check = "import sys; assert sys.version_info[:2] == (3, 9)"
    ok = subprocess.run([path, "-c", check], capture_output=True).returncode == 0
    return path if ok else None


PY39_MISSING = (
    "no working python3.9 on PATH (agent/ and runtime/ must run on 3.9; Debian 12 has no "
    "python3.9 package: install one, e.g. with pyenv, and `make test` puts it on PATH)"
)
MPIRUN_MISSING = "mpirun is not installed (Debian: apt-get install openmpi-bin; make test does)"
TORCH_MISSING = "torch is not installed (make test installs $(TORCH_SPEC))"
TMUX_MISSING = "tmux is not installed (Debian: apt-get install tmux; make test does)"
PROMTOOL_MISSING = "promtool is not installed (Debian: apt-get install prometheus; make test does)"
PROMETHEUS_MISSING = "prometheus is not installed (Debian: apt-get install prometheus; make test does)"
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"  # Debian's path for node_exporter
NODE_EXPORTER_MISSING = ("prometheus-node-exporter is not installed (Debian: apt-get install "
                         "prometheus-node-exporter; make test does)")
