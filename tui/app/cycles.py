"""Three more of Textual's reference cycles, made to die young or not at all.

Cyclic garbage waits for a pass of the garbage collector, and the longer it lives the older
the (costlier) pass that finds it (``tui/app/collector.py``). At 128 hosts two of Textual's
habits made a few thousand such objects a view switch (counted with ``gc.DEBUG_SAVEALL``):

- The compositor places widgets with a nested function that calls itself, so each arrangement
  is a cycle (the function, its closure) holding the map and widget set it returns. The
  compositor keeps that map until the next arrangement; then the dead closure still holds it.
  Returned as copies, the originals die with the closure at once: young garbage, cheap to find.
- A widget with component classes (a DataTable's cursor, header, ...) gets a "virtual" node
  per class each time its styles are applied (a focus change, a tab switch). A node is a web of
  cycles (its styles, node list and signals all point back at it), kept as long as the widget
  keeps that class's styles. When a new set replaces them, the old nodes' attributes are
  dropped, so they are freed by reference count.
- Textual's ``LRUCache`` keeps its entries in a ring of lists (each links to the one before and
  after it), and ``clear()`` forgets the ring without cutting it: every entry, with its key
  and value, becomes one cycle. A DataTable clears its line and row caches on every update, so
  each update left its header's lines (strips, with their segments and caches, and keys holding
  the cursor's ``Coordinate`` and the widget's pseudo-classes) to the collector; after a freeze
  (``tui/app/collector.py``) nothing would find them. Each entry is emptied as the cache is
  cleared, or as one is discarded.
"""

from __future__ import annotations

from typing import Any

from textual._compositor import Compositor
from textual.cache import LRUCache
from textual.css.stylesheet import Stylesheet
from textual.dom import DOMNode

_arrange_root = Compositor._arrange_root
_process_component_classes = Stylesheet._process_component_classes
_lru_clear = LRUCache.clear
_lru_discard = LRUCache.discard


def _arrange_root_copied(self: Compositor, *args: Any, **kwargs: Any) -> Any:
    placed, widgets = _arrange_root(self, *args, **kwargs)
    return dict(placed), set(widgets)


def _process_component_classes_freeing(self: Stylesheet, node: DOMNode) -> None:
    old = dict(node._component_styles)
    _process_component_classes(self, node)
    kept = {id(styles) for styles in node._component_styles.values()}
    for styles in old.values():
        virtual = styles.node
        if id(styles) not in kept and virtual is not None and virtual is not node:
            vars(virtual).clear()  # every cycle through the node goes through its attributes


def _lru_clear_unlinked(self: LRUCache[Any, Any]) -> None:
    for link in self._cache.values():
        link.clear()  # the ring cut: each entry freed when the dict lets go of it
    _lru_clear(self)


def _lru_discard_unlinked(self: LRUCache[Any, Any], key: Any) -> None:
    link = self._cache.get(key)
    _lru_discard(self, key)
    if link is not None and key not in self._cache:
        link.clear()  # an entry alone in the ring links to itself


def install() -> None:
    """Replace all three (once; the app does it when it starts)."""
    if Compositor._arrange_root is not _arrange_root_copied:
        Compositor._arrange_root = _arrange_root_copied  # type: ignore[method-assign]
    if Stylesheet._process_component_classes is not _process_component_classes_freeing:
        Stylesheet._process_component_classes = _process_component_classes_freeing  # type: ignore[method-assign]
    if LRUCache.clear is not _lru_clear_unlinked:
        LRUCache.clear = _lru_clear_unlinked  # type: ignore[method-assign]
        LRUCache.discard = _lru_discard_unlinked  # type: ignore[method-assign]
