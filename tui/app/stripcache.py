"""Textual's strips with their caches made when first used, not with every strip.

A ``Strip`` (one line of a widget) is made with seven small caches, one for each thing that
can be done to it (crop, divide, style, filter, length, crop-and-extend, offsets). Most strips
are made, drawn once and dropped, and use one or two of them at most, yet each strip cost
seven more objects. Profiled at 128 hosts, making those caches was the largest single cost of
a frame after a view switch (12,980 made in one frame of 1,854 strips), and in the objects the
collector walks they outnumbered everything else (34,000 of 137,000 in a minute of view
switches).

Here a new strip's caches are one shared stand-in that holds nothing (a lookup misses, a store
is dropped); each of the seven methods that uses a cache gives its strip a cache of its own,
of Textual's size, the first time it is called on it. What each method returns is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from textual.cache import FIFOCache
from textual.strip import Strip


class _NoCache:
    """Stands in for a strip's cache until the strip first needs that one."""

    __slots__ = ()

    def get(self, key: Any, default: Any = None) -> Any:
        return default

    def __setitem__(self, key: Any, value: Any) -> None:
        pass  # only reached if a method not named below used a cache: its result is kept by none

    def __contains__(self, key: Any) -> bool:
        return False

    def __len__(self) -> int:
        return 0


NO_CACHE = _NoCache()
# (the method, its cache, Textual's size for it)
CACHED = (
    ("divide", "_divide_cache", 4),
    ("crop", "_crop_cache", 16),
    ("apply_style", "_style_cache", 16),
    ("apply_filter", "_filter_cache", 4),
    ("adjust_cell_length", "_line_length_cache", 4),
    ("crop_extend", "_crop_extend_cache", 4),
    ("apply_offsets", "_offsets_cache", 4),
)
_init = Strip.__init__
_originals: dict[str, Callable[..., Any]] = {}


def _lazy_init(self: Strip, segments: Iterable[Any], cell_length: int | None = None) -> None:
    self._segments = list(segments)
    self._cell_length = cell_length
    self._divide_cache = self._crop_cache = self._style_cache = NO_CACHE  # type: ignore[assignment]
    self._filter_cache = self._line_length_cache = NO_CACHE  # type: ignore[assignment]
    self._crop_extend_cache = self._offsets_cache = NO_CACHE  # type: ignore[assignment]
    self._render_cache = None
    self._link_ids = None
    self._cell_count = None


def _with_cache(method: Callable[..., Any], slot: str, size: int) -> Callable[..., Any]:
    def first_gets_a_cache(self: Strip, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, slot) is NO_CACHE:
            setattr(self, slot, FIFOCache(size))
        return method(self, *args, **kwargs)

    first_gets_a_cache.__name__ = method.__name__
    first_gets_a_cache.__doc__ = method.__doc__
    first_gets_a_cache.__wrapped__ = method  # type: ignore[attr-defined]
    return first_gets_a_cache


def _fits() -> bool:
    """Whether this Textual's Strip is the one this was written against: the same slots."""
    slots = set(getattr(Strip, "__slots__", ()))
    return {slot for _, slot, _ in CACHED} | {"_segments", "_cell_length", "_render_cache",
                                               "_link_ids", "_cell_count"} == slots


def install() -> bool:
    """Make strips' caches lazily (once; the app does it when it starts). False, and nothing
    changed, if Textual's Strip is not the one this knows."""
    if Strip.__init__ is _lazy_init:
        return True
    if not _fits():
        return False
    for name, slot, size in CACHED:
        method = getattr(Strip, name)
        _originals[name] = method
        setattr(Strip, name, _with_cache(method, slot, size))
    Strip.__init__ = _lazy_init  # type: ignore[method-assign]
    return True


def uninstall() -> None:
    """Textual's own again (tests)."""
    if Strip.__init__ is not _lazy_init:
        return
    for name, method in _originals.items():
        setattr(Strip, name, method)
    Strip.__init__ = _init  # type: ignore[method-assign]
