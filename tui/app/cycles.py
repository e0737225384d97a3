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

Each goes through ``tui/app/textualpatch.py``: in a Textual where the method is gone, takes
other parameters, or keeps its data otherwise than the replacement reads it, that one stays
Textual's (its cycles left to the collector) and the log says so once.

What to propose upstream (Textual), one change each, so these replacements can go:

- ``Compositor._arrange_root`` (``src/textual/_compositor.py``): its inner ``add_widget`` calls
  itself through its own closure, a cycle holding ``map`` and ``widgets``. Passing the function
  (or a small object with the two collections) as an argument instead of closing over itself,
  or ``del add_widget`` before returning, leaves no cycle.
- ``Stylesheet._process_component_classes`` (``src/textual/css/stylesheet.py``): it makes a new
  virtual ``DOMNode`` per component class on every call, each a web of cycles (its styles'
  ``node`` is the virtual node, so are its node list's and signals' owners), and the one whose
  styles are replaced is garbage only the collector frees. Keeping one virtual node per node
  and component class and applying the stylesheet to it again, or emptying the replaced one
  as this replacement does, would leave the collector nothing.
- ``LRUCache.clear`` and ``LRUCache.discard`` (``src/textual/cache.py``): clear each link
  (``link.clear()``, or set ``link[0] = link[1] = None``) before forgetting ``_cache`` and
  ``_head``, and clear the discarded link, so that no entry stays a ring of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from textual.cache import LRUCache
from textual.css.stylesheet import Stylesheet
from textual.dom import DOMNode

from tui.app.textualpatch import Need, Probe, patch

if TYPE_CHECKING:  # a private module: found at install, where it may be gone
    from textual._compositor import Compositor

ARRANGE = "layouts freed by reference count (tui/app/cycles.py)"
COMPONENTS = "replaced component styles freed by reference count (tui/app/cycles.py)"
LRU = "LRU cache entries freed by reference count (tui/app/cycles.py)"

Fn = Callable[..., Any]


def _arrange_root_copied(arrange_root: Fn) -> Fn:
    def arrange_root_copied(self: Compositor, *args: Any, **kwargs: Any) -> Any:
        placed, widgets = arrange_root(self, *args, **kwargs)
        return dict(placed), set(widgets)

    return arrange_root_copied


def _process_component_classes_freeing(process: Fn) -> Fn:
    def process_component_classes_freeing(self: Stylesheet, node: DOMNode) -> None:
        old = dict(node._component_styles)
        process(self, node)
        kept = {id(styles) for styles in node._component_styles.values()}
        for styles in old.values():
            virtual = styles.node
            if id(styles) not in kept and virtual is not None and virtual is not node:
                vars(virtual).clear()  # every cycle through the node goes through its attributes

    return process_component_classes_freeing


def _lru_clear_unlinked(clear: Fn) -> Fn:
    def lru_clear_unlinked(self: LRUCache[Any, Any]) -> None:
        for link in self._cache.values():
            link.clear()  # the ring cut: each entry freed when the dict lets go of it
        clear(self)

    return lru_clear_unlinked


def _lru_discard_unlinked(discard: Fn) -> Fn:
    def lru_discard_unlinked(self: LRUCache[Any, Any], key: Any) -> None:
        link = self._cache.get(key)
        discard(self, key)
        if link is not None and key not in self._cache:
            link.clear()  # an entry alone in the ring links to itself

    return lru_discard_unlinked


def _lru_links_are_lists() -> bool:
    """Whether an LRUCache keeps each entry in ``_cache`` as a list (the ring's links), which
    the replacements cut with ``list.clear``."""
    cache: LRUCache[int, int] = LRUCache(2)
    cache.set(1, 1)
    return isinstance(cache._cache.get(1), list)


def _component_needs() -> list[Need]:
    """What the component-styles replacement reads: a node's ``_component_styles`` (set by its
    ``__init__``) and a styles object's ``node``."""
    node = DOMNode()
    return [Need(node, "_component_styles"), Need(node.styles, "node")]


def install() -> None:
    """Replace all three where they are as expected (once; the app does it when it starts)."""
    arrange = ("self", "root", "size", "visible_only")
    patch("textual._compositor.Compositor", "_arrange_root", arrange, _arrange_root_copied, ARRANGE)
    patch(Stylesheet, "_process_component_classes", ("self", "node"), _process_component_classes_freeing,
          COMPONENTS, _component_needs())
    links = [Probe("LRUCache keeps its entries as lists in _cache", _lru_links_are_lists)]
    patch(LRUCache, "clear", ("self",), _lru_clear_unlinked, LRU, links)
    patch(LRUCache, "discard", ("self", "key"), _lru_discard_unlinked, LRU, links)
