"""The controller's leased records in SQLite (the history file): sweeps and pipelines alike.

Each kind is one table keyed by ``<noun>_id`` with ``name``, ``spec`` (JSON), ``state``,
``created``, ``supervisor``, ``lease_until`` and ``user`` (who made it). Of several controllers on one history, the one
holding a record's lease advances it; a lease is renewed every poller round, so a controller
that died gives its records up within ``LEASE_S``."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from tui.model.jobstate import RUNNING, STOPPING

log = logging.getLogger(__name__)

LEASE_S = 10.0


def records_table(table: str, key: str) -> str:
    """The CREATE TABLE of one kind's records: the columns ``RowStore`` reads and writes."""
    return f"""
CREATE TABLE IF NOT EXISTS {table} (
    {key:<11} TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    spec        TEXT NOT NULL,
    state       TEXT NOT NULL,
    created     REAL NOT NULL,
    ended       REAL,
    reason      TEXT,
    supervisor  TEXT,
    lease_until REAL,
    user        TEXT
);"""


class RowStore:
    """One kind's rows. Subclasses set ``noun`` ("sweep", "pipeline"), ``table`` and ``error``
    (the exception a bad reference raises)."""

    noun = ""
    table = ""
    error: type[Exception] = ValueError

    def __init__(self, path: Path, schema: str):
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, timeout=20)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(schema)
        self._add_user_column()
        # Told of every recorded state: (id, state); the notifier, when configured.
        self.observers: list[Any] = []

    def _add_user_column(self) -> None:
        """``user`` (who made the record) on a table made before owners were recorded."""
        cols = {r[1] for r in self._db.execute(f"PRAGMA table_info({self.table})")}
        if "user" in cols:
            return
        try:
            with self._db:
                self._db.execute(f"ALTER TABLE {self.table} ADD COLUMN user TEXT")
        except sqlite3.OperationalError as e:  # another process added it meanwhile
            if "duplicate column name" not in str(e):
                raise

    @property
    def key(self) -> str:
        return f"{self.noun}_id"

    def _announce(self, ident: str, state: str) -> None:
        for observer in list(self.observers):
            try:
                observer(ident, state)
            except Exception:
                log.exception("a %s state observer failed for %s -> %s", self.noun, ident, state)

    def close(self) -> None:
        self._db.close()

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        with self._lock:
            cur = self._db.execute(sql, args)
            names = [c[0] for c in cur.description]
            return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    def _exec(self, sql: str, args: tuple[Any, ...] = ()) -> int:
        with self._lock, self._db:
            return self._db.execute(sql, args).rowcount

    def all(self, limit: int = 100) -> list[dict[str, Any]]:
        """The newest first."""
        return [self._decode(r) for r in
                self._rows(f"SELECT * FROM {self.table} ORDER BY created DESC LIMIT ?", (limit,))]

    def get(self, ident: str) -> dict[str, Any] | None:
        rows = self._rows(f"SELECT * FROM {self.table} WHERE {self.key} = ?", (ident,))
        return self._decode(rows[0]) if rows else None

    def find(self, ref: str) -> dict[str, Any]:
        """A record by id, unique id prefix or name (the newest of that name)."""
        found = self.get(ref)
        if found is not None:
            return found
        rows = self._rows(f"SELECT * FROM {self.table} WHERE name = ? ORDER BY created DESC", (ref,))
        if rows:
            return self._decode(rows[0])
        rows = self._rows(f"SELECT * FROM {self.table} WHERE substr({self.key}, 1, ?) = ? ORDER BY created DESC",
                          (len(ref), ref))
        if len(rows) == 1:
            return self._decode(rows[0])
        if rows:
            raise self.error(f"{ref!r} could be any of the {self.noun}s {', '.join(r[self.key] for r in rows)}")
        raise self.error(f"no {self.noun} {ref!r} (rigdeck {self.noun}s lists them)")

    def active(self) -> list[dict[str, Any]]:
        return [self._decode(r) for r in self._rows(
            f"SELECT * FROM {self.table} WHERE state IN (?, ?) ORDER BY created", (RUNNING, STOPPING))]

    def update(self, ident: str, **fields: Any) -> None:
        cols = ", ".join(f"{k} = ?" for k in fields)
        self._exec(f"UPDATE {self.table} SET {cols} WHERE {self.key} = ?", (*fields.values(), ident))
        if "state" in fields:
            self._announce(ident, str(fields["state"]))

    def try_lease(self, ident: str, owner: str) -> bool:
        now = time.time()
        return self._exec(
            f"UPDATE {self.table} SET supervisor = ?, lease_until = ? WHERE {self.key} = ? AND "
            "(supervisor IS NULL OR supervisor = ? OR lease_until IS NULL OR lease_until < ?)",
            (owner, now + LEASE_S, ident, owner, now)) == 1

    def release(self, owner: str) -> None:
        self._exec(f"UPDATE {self.table} SET supervisor = NULL, lease_until = NULL WHERE supervisor = ?", (owner,))

    @staticmethod
    def _decode(r: dict[str, Any]) -> dict[str, Any]:
        r["spec"] = json.loads(r["spec"])
        return r
