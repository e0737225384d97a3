"""Job history on the operator's machine: SQLite under ``RIGDECK_HOME`` (default ~/.local/share/rigdeck)."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import filemodes
from tui.model.jobstate import PENDING

log = logging.getLogger(__name__)

# Told of every recorded state change: (job id, new state, the other fields written with it).
StateObserver = Callable[[str, str, dict[str, Any]], None]

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id      TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    spec        TEXT NOT NULL,
    placement   TEXT,
    state       TEXT NOT NULL,
    created     REAL NOT NULL,
    started     REAL,
    ended       REAL,
    cause       TEXT,
    restarts    INTEGER NOT NULL DEFAULT 0,
    events      TEXT NOT NULL DEFAULT '[]',
    supervisor  TEXT,
    lease_until REAL
);
CREATE TABLE IF NOT EXISTS drains (
    host        TEXT NOT NULL,
    gpu         INTEGER NOT NULL,  -- -1: the whole host
    reason      TEXT NOT NULL,
    who         TEXT NOT NULL,
    at          REAL NOT NULL,
    source      TEXT NOT NULL,     -- operator | health
    now         INTEGER NOT NULL DEFAULT 0,  -- also move the jobs running there
    PRIMARY KEY (host, gpu)
);
CREATE TABLE IF NOT EXISTS incidents (
    job_id      TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    data        TEXT NOT NULL,
    PRIMARY KEY (job_id, seq)
);
CREATE TABLE IF NOT EXISTS unreached (
    endpoint    TEXT PRIMARY KEY,  -- address:port
    since       REAL NOT NULL,     -- first found out of reach (wall clock)
    checked     REAL NOT NULL,     -- last found so after a full wait (wall clock)
    detail      TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS notified (
    kind        TEXT NOT NULL,
    id          TEXT NOT NULL,
    event       TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    time        REAL NOT NULL,
    PRIMARY KEY (kind, id, event, attempt)
);
"""
# Columns added after the first release, for history files made before them.
ADDED_COLUMNS = (("supervisor", "TEXT"), ("lease_until", "REAL"), ("priority", "INTEGER"), ("waiting", "TEXT"),
                 ("pool_sizing", "TEXT"), ("user", "TEXT"), ("preempted", "INTEGER"),  # user: the job's owner
                 ("slurm", "TEXT"))  # slurm: the Slurm job that runs it (tui/control/engines.py)
# (table, column, type) added to the other tables since they first shipped.
ADDED_ELSEWHERE = (("drains", "now", "INTEGER NOT NULL DEFAULT 0"),)
JSON_FIELDS = ("spec", "placement", "cause", "events", "pool_sizing", "slurm")
# Characters that are wildcards somewhere (SQL LIKE, shell globs): a reference made only of them
# is a mistake, never a job.
WILDCARDS = frozenset("%_*?")


class JobRefError(ValueError):
    """A job reference that names no single job; ``candidates`` are the ids it could mean."""

    def __init__(self, message: str, candidates: tuple[str, ...] = ()):
        super().__init__(message)
        self.candidates = candidates


@dataclass(frozen=True)
class JobRef:
    """How a reference resolved: ``rec`` is the job; ``how`` is "id", "name" or "prefix";
    ``matches`` are the ids of every job the reference matched that way, newest first (several
    only for a name shared by several jobs)."""

    rec: dict[str, Any]
    how: str
    matches: tuple[str, ...]


def rigdeck_home() -> Path:
    """This machine's rigdeck directory, made (or tightened to) 0700: the history and the code
    store in it hold every job's spec, environment and code (``agent.filemodes``)."""
    home = Path(os.environ.get("RIGDECK_HOME") or os.path.expanduser("~/.local/share/rigdeck"))
    filemodes.private_dir(home, "RIGDECK_HOME")
    return home


def _assignments(fields: dict[str, Any]) -> tuple[str, list[Any]]:
    """``col = ?, ...`` and the values for an UPDATE of ``fields`` (JSON fields encoded)."""
    cols = ", ".join(f"{k} = ?" for k in fields)
    return cols, [json.dumps(v) if k in JSON_FIELDS else v for k, v in fields.items()]


def _private_database(path: Path) -> None:
    """The history file made 0600 before SQLite opens it (or tightened): SQLite would make it
    with the umask's mode, and makes its -wal and -shm files with the database file's."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, filemodes.PRIVATE_FILE))
    filemodes.private_file(path)


class History:
    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path else rigdeck_home() / "history.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _private_database(self.path)
        self._lock = threading.Lock()
        self.observers: list[StateObserver] = []  # the notifier, when one is configured
        # Told of every incident kept (job id, the incident): the notifier too.
        self.incident_observers: list[Callable[[str, dict[str, Any]], None]] = []
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, timeout=10)
        # Several processes may open a new file at once. Turning on WAL takes the file for a
        # moment, and SQLite answers "database is locked" to the others at once, without waiting
        # its busy timeout: try again for as long as that timeout.
        deadline = time.monotonic() + 10
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.executescript(SCHEMA)
                break
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self._migrate()
        for side in ("-wal", "-shm"):  # made with the file's mode, but older ones may be looser
            filemodes.private_file(f"{self.path}{side}")

    def _migrate(self) -> None:
        """Add the columns an older history file lacks. Several rigdeck processes may open one
        file at once (the app, ``launch --wait``, ``status``): whoever adds a column first wins,
        and the others find it there."""
        for table, name, kind in [("jobs", n, k) for n, k in ADDED_COLUMNS] + list(ADDED_ELSEWHERE):
            cols = {r[1] for r in self._db.execute(f"PRAGMA table_info({table})")}
            if name in cols:
                continue
            try:
                with self._db:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")
            except sqlite3.OperationalError as e:
                if "duplicate column name" not in str(e):
                    raise

    def close(self) -> None:
        self._db.close()

    def create(self, job_id: str, name: str, spec: dict[str, Any], state: str = PENDING,
               user: str | None = None) -> None:
        """Record a new job; ``user``: who owns it (tui.model.fairshare.job_user reads it)."""
        with self._lock, self._db:
            self._db.execute(
                "INSERT INTO jobs (job_id, name, spec, state, created, user) VALUES (?, ?, ?, ?, ?, ?)",
                (job_id, name, json.dumps(spec), state, time.time(), user),
            )
        self.announce(job_id, state)

    def update(self, job_id: str, **fields: Any) -> None:
        if not fields:
            return
        cols, values = _assignments(fields)
        with self._lock, self._db:
            self._db.execute(f"UPDATE jobs SET {cols} WHERE job_id = ?", (*values, job_id))
        self._announce_change(job_id, fields)

    def _announce_change(self, job_id: str, fields: dict[str, Any]) -> None:
        """A write that set ``state`` is announced, with the other fields it set."""
        if "state" in fields:
            self.announce(job_id, str(fields["state"]), {k: v for k, v in fields.items() if k != "state"})

    def announce(self, job_id: str, state: str, fields: dict[str, Any] | None = None) -> None:
        """Tell the observers that ``job_id`` reached ``state`` (recorded, or decided and about
        to be: a failed gang is announced before its other ranks have finished stopping). An
        observer's error is logged, never raised: telling must not change what is recorded."""
        for observer in list(self.observers):
            try:
                observer(job_id, state, dict(fields or {}))
            except Exception:
                log.exception("a state observer failed for %s -> %s", job_id, state)

    def first_notice(self, kind: str, ref: str, event: str, attempt: int = 0) -> bool:
        """Record that ``event`` of ``kind`` ``ref`` (its ``attempt``) was notified; True only for
        the first caller, in whatever process and across restarts: one notice per transition."""
        with self._lock, self._db:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO notified (kind, id, event, attempt, time) VALUES (?, ?, ?, ?, ?)",
                (kind, ref, event, int(attempt), time.time()))
            return cur.rowcount == 1

    def try_lease(self, job_id: str, owner: str, seconds: float) -> bool:
        """Become (or stay) the one controller that acts on this job, for ``seconds``.

        Several controllers may watch a job (the app, ``launch --wait``, ``status``); only the
        lease holder stops, fails or restarts it, so a failure is never handled twice.
        """
        now = time.time()
        with self._lock, self._db:
            cur = self._db.execute(
                "UPDATE jobs SET supervisor = ?, lease_until = ? WHERE job_id = ? AND "
                "(supervisor IS NULL OR supervisor = ? OR lease_until IS NULL OR lease_until < ?)",
                (owner, now + seconds, job_id, owner, now),
            )
            return cur.rowcount == 1

    def release_lease(self, job_id: str, owner: str) -> None:
        """Give the job up, if ``owner`` holds it, so another controller can act on it at once."""
        with self._lock, self._db:
            self._db.execute(
                "UPDATE jobs SET supervisor = NULL, lease_until = NULL WHERE job_id = ? AND supervisor = ?",
                (job_id, owner),
            )

    def add_event(self, job_id: str, event: dict[str, Any], *, once: tuple[str, ...] = (),
                  **fields: Any) -> bool:
        """Append ``event`` (stamped now) to the job's events; ``fields`` change in the same write,
        so nobody reads the one without the other (a job ``running`` with no ``started`` event).
        The events are read and written back in one write transaction: two threads or processes
        adding events at once both keep theirs (SQLite lets one writer in at a time; the other
        waits its busy timeout). ``once``: keys of ``event`` that make it the same event; when
        the job already has one with those values, nothing is written (neither the event nor
        ``fields``: whoever wrote it first decided). Whether it was written."""
        entry = {"time": time.time(), **event}
        cols, values = _assignments(fields) if fields else ("", [])
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")  # the write lock before the read
                row = self._db.execute("SELECT events FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
                if row is None:
                    self._db.rollback()
                    return False
                events = json.loads(row[0]) if row[0] else []
                if once and any(all(e.get(k) == event.get(k) for k in once) for e in events):
                    self._db.rollback()
                    return False
                events.append(entry)
                self._db.execute(f"UPDATE jobs SET events = ?{', ' + cols if cols else ''} WHERE job_id = ?",
                                 (json.dumps(events), *values, job_id))
                self._db.commit()
            except BaseException:
                self._db.rollback()
                raise
        self._announce_change(job_id, fields)
        return True

    def _row(self, row: sqlite3.Row | tuple[Any, ...], names: list[str]) -> dict[str, Any]:
        d = dict(zip(names, row, strict=True))
        for k in JSON_FIELDS:
            if d.get(k) is not None:
                d[k] = json.loads(d[k])
        return d

    def get(self, job_id: str) -> dict[str, Any] | None:
        with self._lock:
            cur = self._db.execute("SELECT * FROM jobs WHERE job_id = ?", (job_id,))
            row = cur.fetchone()
            names = [c[0] for c in cur.description]
        return self._row(row, names) if row else None

    def resolve(self, ref: str) -> JobRef | None:
        """What ``ref`` names: an exact job id, else the newest job of that name, else the one
        job whose id starts with ``ref`` (literally: ``_`` and ``%`` are not wildcards).

        A name comes before a prefix because a job's id starts with its name: with two jobs named
        ``train``, ``train`` is a prefix of both ids but plainly means the newest ``train``.
        Raises :class:`JobRefError` for a reference that could name any job (empty, or only
        wildcard-like characters) and for a prefix shared by several jobs.
        """
        if not ref.strip():
            raise JobRefError(
                f"an empty job reference {ref!r}: give a job id, an id prefix or a job name"
            )
        if set(ref) <= WILDCARDS:
            raise JobRefError(
                f"job reference {ref!r} is only wildcard-like characters; "
                "give a job id, an id prefix or a job name (references are matched literally)"
            )
        rec = self.get(ref)
        if rec:
            return JobRef(rec, "id", (ref,))
        with self._lock:
            cur = self._db.execute(
                "SELECT * FROM jobs WHERE name = ? ORDER BY created DESC", (ref,)
            )
            rows = cur.fetchall()
            names = [c[0] for c in cur.description]
            if not rows:
                cur = self._db.execute(
                    "SELECT * FROM jobs WHERE substr(job_id, 1, ?) = ? ORDER BY created DESC",
                    (len(ref), ref),
                )
                rows = cur.fetchall()
                how = "prefix"
            else:
                how = "name"
        if not rows:
            return None
        ids = tuple(str(r[0]) for r in rows)
        if how == "prefix" and len(rows) > 1:
            shown = ", ".join(ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
            raise JobRefError(
                f"job reference {ref!r} is a prefix of {len(ids)} job ids: {shown}", ids
            )
        return JobRef(self._row(rows[0], names), how, ids)

    def find(self, ref: str) -> dict[str, Any] | None:
        """The job ``ref`` names (see :meth:`resolve`), or None if it names none."""
        found = self.resolve(ref)
        return found.rec if found else None

    def queued(self) -> list[dict[str, Any]]:
        """The jobs waiting to start, in the order the queue starts them: higher priority first,
        first come first within one priority."""
        with self._lock:
            cur = self._db.execute(
                "SELECT * FROM jobs WHERE state = 'queued' ORDER BY COALESCE(priority, 0) DESC, created, job_id")
            rows = cur.fetchall()
            names = [c[0] for c in cur.description]
        return [self._row(r, names) for r in rows]

    def recent(self, since: float) -> list[dict[str, Any]]:
        """Every job that has not ended, or ended at or after ``since``: what holds GPUs now and
        what used them lately (fair share's and the quotas' usage)."""
        with self._lock:
            cur = self._db.execute(
                "SELECT * FROM jobs WHERE ended IS NULL OR ended >= ? ORDER BY created", (since,))
            rows = cur.fetchall()
            names = [c[0] for c in cur.description]
        return [self._row(r, names) for r in rows]

    def take_queued(self, job_id: str) -> bool:
        """Move a queued job to ``pending`` if it still is queued: exactly one caller wins, so a
        queued job is never started twice (two loops, a cancel racing a start)."""
        with self._lock, self._db:
            cur = self._db.execute(
                "UPDATE jobs SET state = 'pending', waiting = NULL WHERE job_id = ? AND state = 'queued'",
                (job_id,))
            taken = cur.rowcount == 1
        if taken:
            self.announce(job_id, "pending")
        return taken

    # -- hosts found out of reach: what the next command (another process) knows of them -----

    def unreached(self, endpoint: str) -> tuple[float, float, str] | None:
        """(since, checked, detail) of ``endpoint`` (address:port) last found out of reach."""
        with self._lock:
            row = self._db.execute("SELECT since, checked, detail FROM unreached WHERE endpoint = ?",
                                   (endpoint,)).fetchone()
        return None if row is None else (float(row[0]), float(row[1]), str(row[2]))

    def set_unreached(self, endpoint: str, detail: str, checked: bool) -> None:
        """``endpoint`` did not answer; ``checked``: after the full wait (a short wait of a host
        known down confirms nothing new, so it leaves ``checked`` as it was)."""
        now = time.time()
        with self._lock, self._db:
            self._db.execute(
                "INSERT INTO unreached (endpoint, since, checked, detail) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(endpoint) DO UPDATE SET detail = excluded.detail"
                + (", checked = excluded.checked" if checked else ""),
                (endpoint, now, now if checked else 0.0, detail))

    def set_reached(self, endpoint: str) -> None:
        with self._lock, self._db:
            self._db.execute("DELETE FROM unreached WHERE endpoint = ?", (endpoint,))

    # -- drains: GPUs and hosts kept out of placement (they outlive the controller) -------------

    def drain(self, host: str, gpu: int | None, reason: str, who: str, source: str = "operator",
              now: bool = False) -> bool:
        """Keep ``host:gpu`` (``gpu`` None: the whole host) out of placement; ``now``: move the jobs
        running there too. False when it was drained already (the first drain's who, when and why
        are kept; a ``now`` is added to it)."""
        with self._lock, self._db:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO drains (host, gpu, reason, who, at, source, now) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (host, -1 if gpu is None else int(gpu), reason, who, time.time(), source, int(now)))
            if cur.rowcount == 0 and now:
                self._db.execute("UPDATE drains SET now = 1 WHERE host = ? AND gpu = ?",
                                 (host, -1 if gpu is None else int(gpu)))
            return cur.rowcount > 0

    def undrain(self, host: str, gpu: int | None) -> list[dict[str, Any]]:
        """Put ``host:gpu`` back (``gpu`` None: the host's drain and every GPU drain of it). The
        drains removed."""
        with self._lock, self._db:
            where, args = ("host = ?", (host,)) if gpu is None else ("host = ? AND gpu = ?", (host, int(gpu)))
            rows = self._db.execute(f"SELECT host, gpu, reason, who, at, source, now FROM drains WHERE {where}",
                                    args).fetchall()
            self._db.execute(f"DELETE FROM drains WHERE {where}", args)
        return [self._drain_row(r) for r in rows]

    def drains(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT host, gpu, reason, who, at, source, now FROM drains ORDER BY host, gpu").fetchall()
        return [self._drain_row(r) for r in rows]

    @staticmethod
    def _drain_row(r: tuple[Any, ...]) -> dict[str, Any]:
        return {"host": r[0], "gpu": None if r[1] < 0 else r[1], "reason": r[2], "who": r[3], "at": r[4],
                "source": r[5], "now": bool(r[6])}

    # -- incidents: each failure of a job and what it cost ------------------------------------

    def add_incident(self, job_id: str, incident: dict[str, Any]) -> int:
        with self._lock, self._db:
            (seq,) = self._db.execute("SELECT COALESCE(MAX(seq), -1) + 1 FROM incidents WHERE job_id = ?",
                                      (job_id,)).fetchone()
            self._db.execute("INSERT INTO incidents (job_id, seq, data) VALUES (?, ?, ?)",
                             (job_id, seq, json.dumps(incident)))
        for observe in list(self.incident_observers):
            try:
                observe(job_id, incident)
            except Exception:  # an observer's bug must not lose the incident or stop the healing
                log.exception("incident observer failed")
        return int(seq)

    def update_incident(self, job_id: str, seq: int, **fields: Any) -> None:
        with self._lock, self._db:
            row = self._db.execute("SELECT data FROM incidents WHERE job_id = ? AND seq = ?", (job_id, seq)).fetchone()
            if row is None:
                return
            data = {**json.loads(row[0]), **fields}
            self._db.execute("UPDATE incidents SET data = ? WHERE job_id = ? AND seq = ?",
                             (json.dumps(data), job_id, seq))

    def incidents(self, job_id: str) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT data FROM incidents WHERE job_id = ? ORDER BY seq", (job_id,)).fetchall()
        return [json.loads(r[0]) for r in rows]

    def list(self, limit: int = 100) -> list[dict[str, Any]]:
        with self._lock:
            cur = self._db.execute("SELECT * FROM jobs ORDER BY created DESC LIMIT ?", (limit,))
            rows = cur.fetchall()
            names = [c[0] for c in cur.description]
        return [self._row(r, names) for r in rows]
