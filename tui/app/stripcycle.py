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

Both go through ``tui/app/textualpatch.py``: in a Textual where either method is gone or takes
other parameters, that one stays Textual's (its cycles left to the collector) and the log says so.

What to propose upstream (Textual, ``src/textual/strip.py``): in ``Strip.divide``, when the cuts
come to ``[self.cell_length]``, return ``[self]`` without storing it in ``self._divide_cache``;
in ``Strip.crop_extend``, when ``start <= 0`` and ``end == self.cell_length``, return ``self``
without storing it in ``self._crop_extend_cache`` (as ``Strip.crop`` already does for a whole
crop). No cache then holds its own strip, and a strip is freed by reference count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from rich.style import Style
from textual.strip import Strip

from tui.app.textualpatch import patch

FEATURE = "whole-strip cuts freed by reference count (tui/app/stripcycle.py)"


def _divide_uncycled(divide: Callable[..., Sequence[Strip]]) -> Callable[..., Sequence[Strip]]:
    def divide_uncycled(self: Strip, cuts: Iterable[int]) -> Sequence[Strip]:
        cuts = list(cuts)
        length = self.cell_length
        if [cut for cut in cuts if cut <= length] == [length]:
            return [self]  # the whole strip: as Strip.divide gives it, but not kept in itself
        return divide(self, cuts)

    return divide_uncycled


def _crop_extend_uncycled(crop_extend: Callable[..., Strip]) -> Callable[..., Strip]:
    def crop_extend_uncycled(self: Strip, start: int, end: int, style: Style | None) -> Strip:
        if start <= 0 and end == self.cell_length:
            return self  # neither extended nor cropped: Strip.crop_extend's result, not cached
        return crop_extend(self, start, end, style)

    return crop_extend_uncycled


def install() -> None:
    """Replace ``Strip.divide`` and ``Strip.crop_extend`` where they are as expected (once;
    the app does it when it starts)."""
    patch(Strip, "divide", ("self", "cuts"), _divide_uncycled, FEATURE)
    patch(Strip, "crop_extend", ("self", "start", "end", "style"), _crop_extend_uncycled, FEATURE)
