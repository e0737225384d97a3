"""Job history: several rigdeck processes opening one history file at once (the app, `launch
--wait`, `status`) must all get in, whether the file is new or from before a column was added."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tui.history import History

ROOT = Path(__file__).resolve().parent.parent
OPENERS = 8

# Each child waits for a start file, then opens the history and writes a job.
CHILD = """
import os, sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from tui.history import History
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.001)
h = History(Path(sys.argv[1]))
h.create("job-" + sys.argv[3], "n", {{}})
h.close()
"""


def _open_at_once(path: Path, tmp: Path) -> list[subprocess.CompletedProcess[str]]:
    go = tmp / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD.format(root=str(ROOT)), str(path), str(go), str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(OPENERS)
    ]
    go.touch()
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=60)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


@pytest.mark.parametrize("old_file", [False, True], ids=["new-file", "file-without-lease-columns"])
def test_many_processes_open_one_history_at_once(tmp_path: Path, old_file: bool) -> None:
    path = tmp_path / "history.sqlite"
    if old_file:  # the first release's table: no supervisor / lease_until columns
        db = sqlite3.connect(path)
        db.execute(
            "CREATE TABLE jobs (job_id TEXT PRIMARY KEY, name TEXT NOT NULL, spec TEXT NOT NULL,"
            " placement TEXT, state TEXT NOT NULL, created REAL NOT NULL, started REAL,"
            " ended REAL, cause TEXT, restarts INTEGER NOT NULL DEFAULT 0,"
            " events TEXT NOT NULL DEFAULT '[]')"
        )
        db.commit()
        db.close()
    results = _open_at_once(path, tmp_path)
    assert [r.returncode for r in results] == [0] * OPENERS, [r.stderr for r in results]
    h = History(path)
    assert len(h.list()) == OPENERS
    assert h.try_lease("job-0", "me", 60.0)  # the lease columns are there
    h.close()
