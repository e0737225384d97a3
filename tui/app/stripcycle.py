"""Textual's ``Strip.divide`` and ``Strip.crop_extend`` without the reference cycle each makes
of a strip cut whole.

``Strip.divide(cuts)`` caches its result in the strip; when the one cut is the strip's own
length the result is ``[self]``, so the strip holds a list that holds the strip. The compositor
divides every line it draws that way, and each such strip (with its eight small caches) then
outlives its last reference until the garbage collector finds the cycle: at 128 hosts the app
made tens of thousands of them a minute, and the collector's passes over them were the app's
longest stalls (a once-a-minute full pass of ~80 ms, young passes of 15-30 ms). Returned
uncached, the same list is freed the moment nothing uses it (making it again costs less than
the cache lookup did).

``Strip.crop_extend(start, end)`` does the same when the crop is the whole strip: it keeps the
strip itself in the strip's own cache. Counted with ``gc.DEBUG_SAVEALL`` over a minute of view
switches at 128 hosts, these were most of what the collector found after a freeze (each with
its segments and eight caches); the whole strip is returned here without caching it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.style import Style
from textual.strip import Strip

_divide = Strip.divide
_crop_extend = Strip.crop_extend


def _divide_uncycled(self: Strip, cuts: Iterable[int]) -> Sequence[Strip]:
    cuts = list(cuts)
    length = self.cell_length
    if [cut for cut in cuts if cut <= length] == [length]:
        return [self]  # the whole strip: as Strip.divide gives it, but not kept in itself
    return _divide(self, cuts)


def _crop_extend_uncycled(self: Strip, start: int, end: int, style: Style | None) -> Strip:
    if start <= 0 and end == self.cell_length:
        return self  # neither extended nor cropped: Strip.crop_extend's result, not cached
    return _crop_extend(self, start, end, style)


def install() -> None:
    """Replace ``Strip.divide`` and ``Strip.crop_extend`` (once; the app does it when it
    starts)."""
    if Strip.divide is not _divide_uncycled:
        Strip.divide = _divide_uncycled  # type: ignore[method-assign]
    if Strip.crop_extend is not _crop_extend_uncycled:
        Strip.crop_extend = _crop_extend_uncycled  # type: ignore[method-assign]
