"""Two more of Textual's reference cycles, made to die young or not at all.

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
"""

from __future__ import annotations

from typing import Any

from textual._compositor import Compositor
from textual.css.stylesheet import Stylesheet
from textual.dom import DOMNode

_arrange_root = Compositor._arrange_root
_process_component_classes = Stylesheet._process_component_classes


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


def install() -> None:
    """Replace both (once; the app does it when it starts)."""
    if Compositor._arrange_root is not _arrange_root_copied:
        Compositor._arrange_root = _arrange_root_copied  # type: ignore[method-assign]
    if Stylesheet._process_component_classes is not _process_component_classes_freeing:
        Stylesheet._process_component_classes = _process_component_classes_freeing  # type: ignore[method-assign]
