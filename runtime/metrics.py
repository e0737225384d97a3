"""Metrics lines for the agent: one JSON object per line in ``$RIGDECK_METRICS_DIR/rank-<R>.jsonl``.

Each line goes out in one ``os.write`` on an ``O_APPEND`` descriptor, so a rank that dies leaves
whole lines only and the agent can read the file while ranks append to it. No fsync per line:
the agent reads the page cache, and a host crash loses the last lines only.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from typing import Any, Dict, Iterator, Mapping, Optional

METRICS_DIR_ENV = "RIGDECK_METRICS_DIR"
_RESERVED = frozenset(("time", "rank", "event"))

# Seconds a rank spent on something between two step reports (``runtime.timed`` adds
# ``data_time``, ``runtime.comm_timer`` adds ``comm_time``); the next ``report(step=...)`` writes
# and clears them. A value the caller passes itself wins.
_pending: Dict[str, float] = {}
_pending_lock = threading.Lock()


def add_time(name: str, seconds: float) -> None:
    """Add ``seconds`` to the ``name`` field of this rank's next step report (thread-safe)."""
    with _pending_lock:
        _pending[name] = _pending.get(name, 0.0) + seconds


def _take_pending() -> Dict[str, float]:
    if not _pending:  # nothing measured (the common case): no lock taken
        return {}
    with _pending_lock:
        if not _pending:
            return {}
        out = dict(_pending)
        _pending.clear()
        return out


def _scalar(value: Any) -> Any:
    """JSON fallback: torch/numpy scalars via ``.item()``; anything else is an error."""
    item = getattr(value, "item", None)
    if item is not None:
        return item()
    raise TypeError(f"metric value {value!r} ({type(value).__name__}) is not a number or scalar")


# Non-finite floats come out as NaN/Infinity (Python's json reads them back): a diverged loss is
# worth showing, not hiding.
_ENCODE = json.JSONEncoder(default=_scalar, separators=(",", ":")).encode


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class Reporter:
    """Appends metrics lines for one rank; a no-op without a metrics directory."""

    def __init__(self, metrics_dir: Optional[str], rank: int) -> None:
        self.metrics_dir = metrics_dir or None
        self.rank = rank
        self.path = (os.path.join(metrics_dir, f"rank-{rank}.jsonl") if metrics_dir else None)
        self._fd: Optional[int] = None
        self._lock = threading.Lock()
        self._last_step_at: Optional[float] = None  # monotonic time of the previous step report
        self._last_step: Any = None  # and its step

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def _open(self) -> int:
        with self._lock:
            if self._fd is None:
                assert self.path is not None and self.metrics_dir is not None
                os.makedirs(self.metrics_dir, exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND |
                                   getattr(os, "O_CLOEXEC", 0), 0o644)
            return self._fd

    def write(self, fields: Mapping[str, Any]) -> None:
        """Append one line: ``time`` and ``rank`` first, then ``fields``."""
        if self.path is None:
            return
        line: Dict[str, Any] = {"time": time.time(), "rank": self.rank}
        line.update(fields)
        data = (_ENCODE(line) + "\n").encode()
        fd = self._fd if self._fd is not None else self._open()
        _write_all(fd, data)

    def step(self, step: Optional[int] = None, loss: Any = None, **metrics: Any) -> None:
        if self.path is None:
            return
        bad = _RESERVED.intersection(metrics)
        if bad:
            raise ValueError(f"report(): {', '.join(sorted(bad))} is set by report itself")
        line: Dict[str, Any] = {"time": time.time(), "rank": self.rank}
        if step is not None:
            line["step"] = step
        if loss is not None:
            line["loss"] = loss
        if step is not None and step != self._last_step:
            # step_time: seconds since this rank's previous step report (none on the first);
            # data_time/comm_time: what runtime.timed/comm_timer measured since then. A second
            # report of the same step (an evaluation's metrics) carries none of them.
            now = time.monotonic()
            if self._last_step_at is not None:
                line["step_time"] = round(now - self._last_step_at, 6)
            self._last_step_at, self._last_step = now, step
            for name, seconds in _take_pending().items():
                line[name] = round(seconds, 6)
        if metrics:
            line.update(metrics)
        data = (_ENCODE(line) + "\n").encode()
        fd = self._fd if self._fd is not None else self._open()
        _write_all(fd, data)

    def event(self, event: str, **fields: Any) -> None:
        """A non-step line (``{"event": ..., ...}``), e.g. checkpoint progress."""
        self.write(dict(event=event, **fields))

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        """Mark a section of this rank's work (``checkpoint``, ``eval``): a ``section`` event as it
        begins and one as it ends, with its seconds. rigdeck's hang rule (agent/hangrule.py) gives
        each section a timeout learned from its own runs, so a slow save is judged against saves,
        not against steps."""
        if self.path is None:
            yield
            return
        self.event("section", section=name, phase="begin")
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.event("section", section=name, phase="end", seconds=round(time.monotonic() - t0, 6))

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


_NONE = Reporter(None, 0)
_current: Optional[Reporter] = None


def _rank_from_env(env: Mapping[str, str]) -> int:
    # The launchers' own variables first: a metrics line must not fail on an unrelated
    # inconsistency (cluster_info checks everything), and this runs once per process.
    for name in ("RIGDECK_RANK", "RANK", "OMPI_COMM_WORLD_RANK"):
        raw = env.get(name, "").strip()
        if raw.isdigit():
            return int(raw)
    from runtime.cluster import cluster_info

    return cluster_info().rank


def reporter() -> Reporter:
    """This process's reporter. ``$RIGDECK_METRICS_DIR`` is read once, on first use (reading the
    environment costs more than the rest of a no-op report); ``reset()`` reads it again."""
    global _current
    if _current is None:
        metrics_dir = os.environ.get(METRICS_DIR_ENV)
        _current = Reporter(metrics_dir, _rank_from_env(os.environ)) if metrics_dir else _NONE
    return _current


def reset() -> None:
    """Close this process's metrics file; the next report() looks at the environment again."""
    global _current
    if _current is not None:
        _current.close()
    _current = None


def section(name: str) -> "contextlib.AbstractContextManager[None]":
    """``with runtime.section("eval"): ...``: this rank is in section ``name`` meanwhile (see
    ``Reporter.section``). A no-op without ``$RIGDECK_METRICS_DIR``."""
    rep = _current if _current is not None else reporter()
    return rep.section(name)


def report(step: Optional[int] = None, loss: Any = None, **metrics: Any) -> None:
    """Append ``{"time", "rank", "step", "loss", **metrics}`` to this rank's metrics file.

    Values: ints, floats, strings, bools, or scalars with ``.item()`` (torch tensors). A no-op
    costing well under a microsecond when ``$RIGDECK_METRICS_DIR`` is unset.
    """
    rep = _current if _current is not None else reporter()
    if rep is not _NONE:
        rep.step(step, loss, **metrics)
