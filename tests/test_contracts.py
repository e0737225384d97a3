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
from tui.controller import HostReport
from tui.history import History
from tui.jobs import JobManager, JobView
from tui.scheduler import NodeAssignment

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = ROOT / "tests" / "jobscripts" / "hostile_metrics.py"
NONE = type(None)
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # anything but tab and newline

# -- metrics text ---------------------------------------------------------------------------


def test_metrics_text_prints_rank_strings_through_terminal_safe(capsys: pytest.CaptureFixture[str]) -> None:
    from tui.cli import _print_metrics

    _print_metrics([
        {"host": "h1", "rank": 0, "step": "\x1b[2J3", "loss": "\x1b]52;c;ZXZpbA==\x070.5"},
        {"host": "h1", "rank": "\x1bc0", "event": "\x1b]0;title\x07checkpoint\x07",
         "status": "do\x08ne\x1b[?1049h", "step": "\x9b5"},
    ])
    out = capsys.readouterr().out
    assert not CONTROL.search(out), repr(out)
    assert "step 3" in out and "loss 0.5" in out and "checkpoint" in out and "title" not in out
