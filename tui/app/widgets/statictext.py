"""Updating a Static's text without laying the screen out again when it keeps its height.

``Static.update`` asks for a layout of the whole screen by default: its new text may be taller
or shorter. A panel whose numbers change every second (the map's GPU detail and users, a
view's status line) mostly keeps its height, and a layout of the app's screen costs several
milliseconds of the frame. Here the text is measured at the width it has, and the layout asked
for only when its height changed (or its size cannot be known yet).
"""

from __future__ import annotations

from textual.widgets import Static


def update_static(widget: Static, text: str) -> bool:
    """Show ``text`` in ``widget`` when it differs from what it shows; True when it did."""
    if getattr(widget, "_rd_text", None) == text:
        return False
    widget._rd_text = text  # type: ignore[attr-defined]
    width = widget.content_region.width
    rule = widget.styles.width
    if not widget.is_mounted or width <= 0 or (rule is not None and rule.is_auto):
        widget.update(text)  # not laid out yet, or as wide as its text: measured by a layout
        return True
    widget.update(text, layout=False)
    rule = widget.styles.height
    if rule is None or rule.is_auto:
        height = widget.get_content_height(widget.container_size, widget.app.size, width)
        if height != widget.content_region.height:
            widget.refresh(layout=True)
    return True
