"""Metrics lines for the agent: one JSON object per line in ``$RIGDECK_METRICS_DIR/rank-<R>.jsonl``.

Each line goes out in one ``os.write`` on an ``O_APPEND`` descriptor, so a rank that dies leaves
whole lines only and the agent can read the file while ranks append to it. No fsync per line:
the agent reads the page cache, and a host crash loses the last lines only.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Dict, Mapping, Optional

METRICS_DIR_ENV = "RIGDECK_METRICS_DIR"
_RESERVED = frozenset(("time", "rank", "event"))


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
        if metrics:
            line.update(metrics)
        data = (_ENCODE(line) + "\n").encode()
        fd = self._fd if self._fd is not None else self._open()
        _write_all(fd, data)

    def event(self, event: str, **fields: Any) -> None:
        """A non-step line (``{"event": ..., ...}``), e.g. checkpoint progress."""
        self.write(dict(event=event, **fields))

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


_default: Optional[Reporter] = None
_default_key: Optional[str] = None
_NONE = Reporter(None, 0)


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
    """This process's reporter, (re)opened when ``$RIGDECK_METRICS_DIR`` changes."""
    global _default, _default_key
    key = os.environ.get(METRICS_DIR_ENV)
    if key == _default_key and _default is not None:
        return _default
    if _default is not None:
        _default.close()
    _default = Reporter(key, _rank_from_env(os.environ)) if key else _NONE
    _default_key = key
    return _default


def report(step: Optional[int] = None, loss: Any = None, **metrics: Any) -> None:
    """Append ``{"time", "rank", "step", "loss", **metrics}`` to this rank's metrics file.

    Values: ints, floats, strings, bools, or scalars with ``.item()`` (torch tensors). Costs next
    to nothing when ``$RIGDECK_METRICS_DIR`` is unset.
    """
    key = os.environ.get(METRICS_DIR_ENV)
    if key is None:
        return
    rep = _default if (key == _default_key and _default is not None) else reporter()
    rep.step(step, loss, **metrics)
