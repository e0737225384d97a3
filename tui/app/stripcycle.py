"""Textual's ``Strip.divide`` without the reference cycle it makes of a strip cut whole.

``Strip.divide(cuts)`` caches its result in the strip; when the one cut is the strip's own
length the result is ``[self]``, so the strip holds a list that holds the strip. The compositor
divides every line it draws that way, and each such strip (with its eight small caches) then
outlives its last reference until the garbage collector finds the cycle: at 128 hosts the app
made tens of thousands of them a minute, and the collector's passes over them were the app's
longest stalls (a once-a-minute full pass of ~80 ms, young passes of 15-30 ms). Returned
uncached, the same list is freed the moment nothing uses it (making it again costs less than
the cache lookup did).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from textual.strip import Strip

_divide = Strip.divide


def _divide_uncycled(self: Strip, cuts: Iterable[int]) -> Sequence[Strip]:
    cuts = list(cuts)
    length = self.cell_length
    if [cut for cut in cuts if cut <= length] == [length]:
        return [self]  # the whole strip: as Strip.divide gives it, but not kept in itself
    return _divide(self, cuts)


def install() -> None:
    """Replace ``Strip.divide`` (once; the app does it when it starts)."""
    if Strip.divide is not _divide_uncycled:
        Strip.divide = _divide_uncycled  # type: ignore[method-assign]
