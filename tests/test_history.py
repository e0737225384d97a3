"""Job history: several rigdeck processes opening one history file at once (the app, `launch
--wait`, `status`) must all get in, whether the file is new or from before a column was added."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tui.control.history import History, JobRefError

ROOT = Path(__file__).resolve().parent.parent
OPENERS = 8

# A child process: it waits for the start file (argv[2]), opens the history (argv[1]) and
# does what follows, all children at once.
AT_ONCE = """
import sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
from tui.control.history import History
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.001)
h = History(Path(sys.argv[1]))
"""
# Each child writes a job.
CHILD = AT_ONCE + """h.create("job-" + sys.argv[3], "n", {{}})
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


# -- job references ------------------------------------------------------------------------------


def _history_with(tmp_path: Path, jobs: list[tuple[str, str]]) -> History:
    """A history holding ``(job_id, name)`` jobs, created in this order (the last is newest)."""
    h = History(tmp_path / "history.sqlite")
    for i, (job_id, name) in enumerate(jobs):
        h.create(job_id, name, {})
        h.update(job_id, created=1000.0 + i)
    return h


JOBS = [
    ("p-0101-000000-aaaa", "p"),
    ("train-0101-000001-bbbb", "train"),
    ("train-0101-000002-cccc", "train"),
    ("eval-0101-000003-dddd", "eval"),
]


def test_a_reference_is_an_exact_id_a_name_or_a_unique_prefix(tmp_path: Path) -> None:
    h = _history_with(tmp_path, JOBS)
    assert h.resolve("train-0101-000001-bbbb").rec["job_id"] == "train-0101-000001-bbbb"  # exact id
    by_name = h.resolve("train")
    assert (by_name.rec["job_id"], by_name.how) == ("train-0101-000002-cccc", "name")  # the newest
    assert by_name.matches == ("train-0101-000002-cccc", "train-0101-000001-bbbb")
    by_prefix = h.resolve("ev")
    assert (by_prefix.rec["job_id"], by_prefix.how) == ("eval-0101-000003-dddd", "prefix")
    assert h.find("nothing") is None


@pytest.mark.parametrize("ref", ["", " ", "\t\n", "%", "_", "*", "?", "%%", "_%", "*?_%"])
def test_empty_and_wildcard_only_references_are_refused(tmp_path: Path, ref: str) -> None:
    # A single job: the old lookup handed it out for "" and "%".
    h = _history_with(tmp_path, JOBS[:1])
    with pytest.raises(JobRefError, match="job reference"):
        h.find(ref)


@pytest.mark.parametrize("ref", ["p_", "p%", "t_ain", "train-0101-00000_", "%-0101"])
def test_like_wildcards_in_a_reference_are_literal(tmp_path: Path, ref: str) -> None:
    h = _history_with(tmp_path, JOBS)
    assert h.find(ref) is None


def test_a_literal_underscore_or_percent_matches_itself(tmp_path: Path) -> None:
    h = _history_with(tmp_path, [("a_b-0101-000000-aaaa", "a_b"), ("axb-0101-000001-bbbb", "axb"),
                                 ("c%d-0101-000002-cccc", "c%d")])
    assert h.resolve("a_").rec["job_id"] == "a_b-0101-000000-aaaa"
    assert h.resolve("c%").rec["job_id"] == "c%d-0101-000002-cccc"


def test_an_ambiguous_prefix_is_an_error_listing_the_candidates(tmp_path: Path) -> None:
    h = _history_with(tmp_path, JOBS)
    with pytest.raises(JobRefError) as info:
        h.find("train-0101")
    assert set(info.value.candidates) == {"train-0101-000001-bbbb", "train-0101-000002-cccc"}
    for job_id in ("train-0101-000001-bbbb", "train-0101-000002-cccc"):
        assert job_id in str(info.value)


# -- the CLI: a reference that names no single job stops nothing -----------------------------------


@pytest.fixture
def cli_history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> History:
    """The CLI's own history (RIGDECK_HOME) with running jobs on no host; no inventory."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("RIGDECK_HOME", str(tmp_path / "rigdeck"))
    monkeypatch.delenv("RIGDECK_INVENTORY", raising=False)
    h = History()
    for i, (job_id, name) in enumerate(JOBS):
        h.create(job_id, name, {}, state="running")
        h.update(job_id, created=1000.0 + i, placement=[])
    return h


def _states(h: History) -> dict[str, str]:
    return {r["job_id"]: r["state"] for r in h.list()}


@pytest.mark.parametrize("ref", ["", "_", "%", "p_", "train-0101"])
def test_cli_stop_of_a_reference_naming_no_single_job_exits_2_and_stops_nothing(
    cli_history: History, capsys: pytest.CaptureFixture[str], ref: str
) -> None:
    from tui.cli.main import main

    assert main(["stop", ref]) == 2
    assert set(_states(cli_history).values()) == {"running"}
    assert "rigdeck:" in capsys.readouterr().err


def test_cli_stop_by_a_shared_name_needs_yes(
    cli_history: History, capsys: pytest.CaptureFixture[str]
) -> None:
    from tui.cli.main import main

    assert main(["stop", "train"]) == 2
    err = capsys.readouterr().err
    assert "train-0101-000001-bbbb" in err and "train-0101-000002-cccc" in err and "--yes" in err
    assert set(_states(cli_history).values()) == {"running"}

    assert main(["stop", "--yes", "train"]) == 0
    assert _states(cli_history) == {
        "p-0101-000000-aaaa": "running",
        "train-0101-000001-bbbb": "running",
        "train-0101-000002-cccc": "stopped",  # the newest of that name, and it alone
        "eval-0101-000003-dddd": "running",
    }


def test_cli_stop_by_a_unique_name_or_prefix_needs_no_yes(cli_history: History) -> None:
    from tui.cli.main import main

    assert main(["stop", "eval"]) == 0
    assert main(["stop", "p-01"]) == 0
    assert _states(cli_history)["eval-0101-000003-dddd"] == "stopped"
    assert _states(cli_history)["p-0101-000000-aaaa"] == "stopped"
    assert _states(cli_history)["train-0101-000002-cccc"] == "running"


def test_an_event_and_the_state_it_brings_are_one_write(tmp_path: Path) -> None:
    """Whoever sees the job ``running`` (a reader, or an observer told of the state) sees its
    ``started`` event too."""
    h = History(tmp_path / "h.sqlite")
    h.create("j1", "j", {"name": "j"}, state="starting")
    told = []
    h.observers.append(lambda job_id, state, fields: told.append(
        (state, [e["event"] for e in (h.get(job_id) or {})["events"]])))
    h.add_event("j1", {"event": "started", "hosts": ["h1"]}, state="running", started=5.0)
    rec = h.get("j1") or {}
    assert (rec["state"], rec["started"], [e["event"] for e in rec["events"]]) == ("running", 5.0, ["started"])
    assert told == [("running", ["started"])]


# Each child adds its events to one job, as fast as it can.
ADDER = AT_ONCE + """for n in range(int(sys.argv[4])):
    h.add_event("j1", {{"event": "probe", "who": sys.argv[3], "n": n}})
h.close()
"""


def test_events_added_at_once_by_threads_and_processes_are_all_kept(tmp_path: Path) -> None:
    """Controllers in several processes (the app, ``launch --wait``, a server), and threads in
    one, add events to the same job at once: none is lost to another's write."""
    path = tmp_path / "h.sqlite"
    h = History(path)
    h.create("j1", "j", {"name": "j"})
    go, per = tmp_path / "go", 40
    procs = [subprocess.Popen([sys.executable, "-c", ADDER.format(root=str(ROOT)), str(path), str(go),
                               f"p{i}", str(per)], stderr=subprocess.PIPE, text=True) for i in range(3)]
    def add(who: str) -> None:
        for n in range(per):
            h.add_event("j1", {"event": "probe", "who": who, "n": n}, state="running")

    threads = [threading.Thread(target=add, args=(f"t{i}",)) for i in range(2)]
    go.touch()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read() if p.stderr else ""
    rec = h.get("j1") or {}
    got = sorted((e["who"], e["n"]) for e in rec["events"])
    assert got == sorted((w, n) for w in ("p0", "p1", "p2", "t0", "t1") for n in range(per))
    assert rec["state"] == "running"
    h.add_event("nobody", {"event": "probe"})  # no such job: nothing written, no error
    assert h.get("nobody") is None
    h.close()
