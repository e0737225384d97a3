"""One fetch of a list from the controller and the selected one's detail (the Sweeps and the
Pipelines views: ``fetch_sweeps``, ``fetch_pipelines``), made on a worker thread: the client's
calls may wait on the network."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

R = TypeVar("R")
D = TypeVar("D")


@dataclass(frozen=True)
class ListFetch(Generic[R, D]):
    """What one fetch brought: the list (None: not fetched), the selected one's detail, which
    one that is, and the error that cut the fetch short (what came before it is good)."""

    rows: tuple[R, ...] | None
    detail: D | None
    selected: str | None
    error: str | None = None


def fetch_list(rows: Callable[[], Iterable[R]], detail: Callable[[str], D], key: Callable[[R], str],
               noun: str, selected: str | None) -> ListFetch[R, D]:
    """The list (``rows()``) and the detail of ``selected`` (the first listed, the newest, when it
    is none or gone); never raises: a failed call is the fetch's error, which names the ``noun``."""
    try:
        got = tuple(rows())
    except Exception as e:
        return ListFetch(None, None, selected, f"{noun}s: {str(e) or type(e).__name__}")
    ids = [key(r) for r in got]
    if selected not in ids:
        selected = ids[0] if ids else None
    if selected is None:
        return ListFetch(got, None, None)
    try:
        found = detail(selected)
    except Exception as e:
        return ListFetch(got, None, selected, f"{noun} {selected}: {str(e) or type(e).__name__}")
    return ListFetch(got, found, selected)
