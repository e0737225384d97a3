"""The views of the app, one module each (``base.py`` says what a view is).

A module here is a view when it names its class ``VIEW``; the shell's ``VIEWS`` lists the
modules in tab order, so a new view is its module and one line there.
"""

from __future__ import annotations

from importlib import import_module

from tui.app.views.base import View


def load_views(*modules: str) -> tuple[type[View], ...]:
    """The view classes of ``tui.app.views.MODULE`` for each module named, in that order."""
    out = []
    for name in modules:
        cls = getattr(import_module(f"{__name__}.{name}"), "VIEW", None)
        if not (isinstance(cls, type) and issubclass(cls, View)):
            raise TypeError(f"tui.app.views.{name}: VIEW names no View class")
        out.append(cls)
    return tuple(out)
