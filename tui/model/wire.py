"""Typed views on the wire: dataclasses to JSON-able values and back.

The controller's API hands the faces dataclasses (job rows, job details, host views). Embedded,
they cross as objects; from a server they cross as JSON lines. ``encode`` turns a dataclass
(nested dataclasses, tuples, lists, dicts, None, numbers, strings) into plain JSON values and
``decode`` rebuilds the dataclass from its type hints, so both sides share one definition of
every view and no hand-written field lists drift apart.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import types
import typing
from typing import Any, TypeVar, Union

T = TypeVar("T")


class WireError(ValueError):
    """A value that does not fit the view it should decode into."""


def encode(value: Any) -> Any:
    """``value`` as JSON values: dataclasses become objects of their fields (properties are not
    sent: the receiver computes them), tuples become lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        custom = getattr(value, "to_wire", None)
        if custom is not None:
            return custom()
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    return value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    module = sys.modules.get(cls.__module__)
    return typing.get_type_hints(cls, vars(module) if module else None)


def decode(tp: Any, value: Any) -> Any:
    """``value`` (JSON values) as the type ``tp`` (a dataclass or a typing form)."""
    if tp is Any or tp is object:
        return value
    origin = typing.get_origin(tp)
    if origin is Union or (hasattr(types, "UnionType") and isinstance(tp, types.UnionType)):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise WireError(f"None where {tp} was expected")
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return decode(arg, value)
            except (WireError, TypeError, ValueError) as e:
                errors.append(str(e))
        raise WireError(f"{value!r} fits none of {tp}: {'; '.join(errors)}")
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise WireError(f"a list for {tp}, got {type(value).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(decode(args[0], v) for v in value)
        if args and len(args) != len(value):
            raise WireError(f"{len(args)} items for {tp}, got {len(value)}")
        return tuple(decode(a, v) for a, v in zip(args, value, strict=True)) if args else tuple(value)
    if origin is list:
        (arg,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, list):
            raise WireError(f"a list for {tp}, got {type(value).__name__}")
        return [decode(arg, v) for v in value]
    if origin is dict:
        args = typing.get_args(tp) or (Any, Any)
        if not isinstance(value, dict):
            raise WireError(f"an object for {tp}, got {type(value).__name__}")
        return {k: decode(args[1], v) for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        custom = getattr(tp, "from_wire", None)
        if custom is not None:
            return custom(value)
        if not isinstance(value, dict):
            raise WireError(f"an object for {tp.__name__}, got {type(value).__name__}")
        hints = _hints(tp)
        kwargs = {f.name: decode(hints[f.name], value[f.name])
                  for f in dataclasses.fields(tp) if f.init and f.name in value}
        return tp(**kwargs)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise WireError(f"a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise WireError(f"an integer, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise WireError(f"a string, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise WireError(f"true or false, got {value!r}")
        return value
    if isinstance(tp, type) and issubclass(tp, str):  # a str Enum
        return tp(value)
    return value
