"""What every benchmark result records about its run: the code, the agent, the machine, the command.

A figure is only worth comparing with another when both say which commit and which agent they
measured, on how many cores, and how they were started. Every benchmark writes its JSON through
``write_result``, which puts ``run_meta()`` (taken when the run began) under ``"meta"``.

``dirty`` ignores ``bench/results/``: ``make bench`` runs the benchmarks in sequence, and each
one's result file, just written, must not mark the next one's run as made from edited code.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tui.remote.bundle import build_bytes  # noqa: E402

RESULTS = "bench/results"


def _git(*args: str) -> str | None:
    try:
        res = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout if res.returncode == 0 else None


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def run_meta() -> dict[str, Any]:
    """Commit (and whether the tree had edits), agent version, date, machine, command line."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--", ".", f":(exclude){RESULTS}")
    dirty = None if status is None else [line[3:] for line in status.splitlines() if line]
    version, data = build_bytes()
    return {
        "commit": commit.strip() if commit else None,
        "dirty": None if dirty is None else bool(dirty),
        "dirty_paths": (dirty or [])[:20],
        "agent_version": version,
        "agent_sha256": hashlib.sha256(data).hexdigest(),
        "date": _now(),
        "machine": {
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        },
        "command": shlex.join([sys.executable, *sys.argv]),
        "cwd": os.getcwd(),
    }


def write_result(path: str | Path, result: dict[str, Any], meta: dict[str, Any]) -> Path:
    """Write ``result`` as JSON with ``meta`` (from ``run_meta()`` at the start) first."""
    meta = {**meta, "finished": _now(),
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()]}
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, **result}, indent=2) + "\n")
    print(f"wrote {out}")
    return out
