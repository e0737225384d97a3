"""The app's one way into Textual's internals: what it patches or relies on is checked first.

A few of Textual's private methods and attributes are patched or used for speed or memory
(``stripcycle``, ``cycles``, ``frametimer``, ``widgets/difftable``). Textual renames and changes
those between releases without notice: pyproject.toml pins the versions the suite passes with,
but an app installed next to another Textual should still run, with Textual's own behaviour
where one of them is not as expected (slower, or more for the garbage collector), not crash.

So each patch says what it needs (``Need``: a name there, a function with these parameters;
``Probe``: anything else, checked by running it) and goes through ``patch`` or ``usable``: when
a need is not met the log says so once (per feature, per process) and the caller keeps
Textual's own.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Protocol

log = logging.getLogger(__name__)

# On a replacement ``patch`` installed: the function it replaced (so a second ``patch`` of the
# same name knows it is already there).
REPLACED = "_rigdeck_replaced"
_MISSING = object()
_told: set[str] = set()  # the features the log has said something about already


class Check(Protocol):
    def problem(self) -> str | None:
        """What is not as the app expects, or None."""


def _params(fn: Any) -> tuple[str, ...] | None:
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # not something with a signature
        return None


def _owner_name(owner: object) -> str:
    if isinstance(owner, str):
        return owner
    return owner.__qualname__ if isinstance(owner, type) else f"{type(owner).__qualname__}()"


def resolve(owner: object) -> object:
    """``owner`` itself, or for a dotted path (``"textual._compositor.Compositor"``: a class in
    a private module, which may be gone) what it names, or ``_MISSING``."""
    if not isinstance(owner, str):
        return owner
    module, _, name = owner.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name, _MISSING)
    except ImportError:
        return _MISSING


@dataclass(frozen=True)
class Need:
    """``owner.name`` is there (``owner`` a class, an instance for what its ``__init__`` sets,
    or a class's dotted path) and, when ``params`` is given, is a function taking exactly those
    parameters."""

    owner: object
    name: str
    params: tuple[str, ...] | None = None

    def problem(self) -> str | None:
        where = f"{_owner_name(self.owner)}.{self.name}"
        owner = resolve(self.owner)
        if owner is _MISSING:
            return f"{_owner_name(self.owner)} is not there"
        # Looked up statically: a property is not run, a __getattr__ not asked.
        if inspect.getattr_static(owner, self.name, _MISSING) is _MISSING:
            return f"{where} is not there"
        if self.params is None:
            return None
        found = _params(getattr(owner, self.name))
        if found != self.params:
            return f"{where} takes {found}, not {self.params}"
        return None


@dataclass(frozen=True)
class Probe:
    """What a patch relies on that a name cannot say (how an object keeps its data): ``check()``
    is run, and false or an exception means it is not so."""

    what: str
    check: Callable[[], bool]

    def problem(self) -> str | None:
        try:
            ok = self.check()
        except Exception as e:
            return f"{self.what}: not so ({type(e).__name__}: {e})"
        return None if ok else f"{self.what}: not so"


def textual_version() -> str:
    try:
        return version("textual")
    except PackageNotFoundError:
        return "(version unknown)"


def usable(feature: str, needs: Iterable[Check]) -> bool:
    """Whether every one of ``needs`` is met. If not, the log says once which are not and that
    the app goes without ``feature`` (Textual's own behaviour stays)."""
    problems = [p for p in (n.problem() for n in needs) if p is not None]
    if problems and feature not in _told:
        _told.add(feature)
        log.warning(
            "Textual %s: %s; going without %s (Textual's own behaviour kept)",
            textual_version(), "; ".join(problems), feature,
        )
    return not problems


def patch(
    owner: type | str,
    name: str,
    params: tuple[str, ...],
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]],
    feature: str,
    needs: Iterable[Check] = (),
) -> bool:
    """Put ``wrap(original)`` in the place of ``owner.name`` (``owner`` a class or its dotted
    path), a function taking ``params``, once; if it is not there as such, or one of ``needs``
    is not met, leave Textual's (and say so once, see ``usable``). True when the replacement is
    in place."""
    cls = resolve(owner)
    current = getattr(cls, name, None)
    if getattr(current, REPLACED, None) is not None:
        return True  # patched before (the app starts more than once in a process: tests)
    if not usable(feature, [Need(owner, name, params), *needs]):
        return False
    replacement = wrap(current)  # type: ignore[arg-type]
    setattr(replacement, REPLACED, current)
    setattr(cls, name, replacement)
    return True
