"""Field checks for the model's TOML files (the inventory, job specs, the user's config): one kit
for all of them, so that a boolean, an integer range or a number is checked (and its error worded)
in one place.

A check takes the raw TOML value and returns the converted one, or raises ``Bad``. A table of
``Check``s (field name -> what is expected, how to convert) goes through ``checked``, which turns
an unknown key or a ``Bad`` into the caller's own error (``InventoryError``, ``JobSpecError``),
so each file's errors name its file, host or dotted field the way that file's users expect.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

__all__ = [
    "ENV_NAME_RE",
    "Bad",
    "Check",
    "ErrorFactory",
    "boolean",
    "checked",
    "finite",
    "int_range",
    "is_int",
    "is_loopback",
    "listen_address",
    "nonblank",
    "number",
    "one_of",
    "quoted",
    "show",
    "token",
    "unknown_field",
    "valid",
]

ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Bad(Exception):
    """A value failed its check; ``checked`` adds file and field.

    ``expected`` and ``got`` override the check's own text and the value shown; ``sub`` extends
    the field's name: ``"PATH"`` makes ``env.PATH``, ``"[2]"`` makes ``command[2]``.
    """

    def __init__(self, expected: str | None = None, *, got: Any = None, sub: str | None = None):
        super().__init__(expected)
        self.expected = expected
        self.got = got
        self.sub = sub


class Check(NamedTuple):
    expected: str
    convert: Callable[[Any], Any]


# (field, expected, got) -> the error to raise; got is None when there is nothing to show.
ErrorFactory = Callable[[str, str, Any], Exception]


def unknown_field(key: str, known: Sequence[str]) -> str:
    """What an unknown key should have been: the known fields, and the nearest one if any."""
    hint = difflib.get_close_matches(key, known, n=1)
    did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
    return f"one of the known fields {', '.join(sorted(known))}{did_you_mean}"


def checked(raw: Mapping[str, Any], checks: Mapping[str, Check], error: ErrorFactory) -> dict[str, Any]:
    """Check every key of one table; unknown keys are errors. ``error`` makes the exception."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        check = checks.get(key)
        if check is None:
            raise error(key, unknown_field(key, list(checks)), None)
        try:
            out[key] = check.convert(value)
        except Bad as bad:
            sub = bad.sub or ""
            name = key + (sub if sub.startswith("[") or not sub else f".{sub}")
            got = value if bad.got is None else bad.got
            raise error(name, bad.expected or check.expected, got) from None
    return out


def valid(check: Callable[[Any], Any], v: Any) -> bool:
    """Whether ``v`` passes ``check`` (for a value inside a field, whose error says more)."""
    try:
        check(v)
    except Bad:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# The checks themselves: every file's fields use these, none keeps a copy of its own.


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def int_range(lo: int, hi: int | None = None) -> Callable[[Any], int]:
    """An integer >= lo (and <= hi when given); booleans are not integers here."""

    def check(v: Any) -> int:
        if is_int(v) and v >= lo and (hi is None or v <= hi):
            return int(v)
        raise Bad()

    return check


def finite(v: Any) -> int | float:
    """A finite number (integer or float), kept as it was written: an integer stays one."""
    if (is_int(v) or isinstance(v, float)) and math.isfinite(v):
        return v
    raise Bad()


def number(*, positive: bool) -> Callable[[Any], float]:
    """A finite number (integer or float) > 0, or >= 0 when not ``positive``; as a float."""

    def check(v: Any) -> float:
        v = finite(v)
        if v > 0 or (v == 0 and not positive):
            return float(v)
        raise Bad()

    return check


def boolean(v: Any) -> bool:
    """``true`` or ``false``: a TOML boolean, not 0, 1 or a string."""
    if isinstance(v, bool):
        return v
    raise Bad()


def one_of(options: tuple[str, ...]) -> Callable[[Any], str]:
    """One of ``options`` (names: ``"simple"``, ``"speed"``...)."""

    def check(v: Any) -> str:
        if v in options:
            return str(v)
        raise Bad()

    return check


def nonblank(v: Any) -> str:
    """A string with something other than whitespace in it."""
    if isinstance(v, str) and v.strip():
        return v
    raise Bad()


def token(v: Any) -> str:
    """A non-empty string without whitespace (addresses, user names)."""
    if isinstance(v, str) and v and not any(c.isspace() for c in v):
        return v
    raise Bad()


LISTEN_EXPECTED = (
    "ADDR:PORT, an address to listen on and a TCP port (0: any free one), "
    "e.g. 127.0.0.1:9464 or [::1]:9464"
)
_HOST_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")


def listen_address(v: Any, *, expected: str = LISTEN_EXPECTED, any_port: bool = True) -> tuple[str, int]:
    """``ADDR:PORT`` (an IPv6 address in brackets) as (address, port); the address is always
    written out: an empty one (``:9464``) would mean every interface, which is never implied.
    ``any_port``: port 0 (any free one) is taken; ``expected``: what an error says was expected."""

    def bad(why: str = "") -> Bad:
        return Bad(f"{expected}" + (f" ({why})" if why else ""))

    if not isinstance(v, str):
        raise bad()
    host, sep, port = v.strip().rpartition(":")
    if not sep:
        raise bad()
    if not host:
        raise bad("no address: write it out, 0.0.0.0 for every interface")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise bad(f"{host!r} is no IPv6 address") from None
    elif ":" in host:
        raise bad("an IPv6 address goes in brackets")
    elif not _HOST_NAME.fullmatch(host):
        raise bad(f"{host!r} is no address or host name")
    if not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise bad(f"the port is {port!r}, not a number from 0 to 65535")
    if int(port) == 0 and not any_port:
        raise bad("port 0 would be any free one, which nobody could find")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback only (127.0.0.0/8, ::1, localhost)."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


# ---------------------------------------------------------------------------------------------
# Values in error messages.

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def quoted(s: str, *, escape_controls: bool = True) -> str:
    """``s`` in double quotes with TOML's escapes; other control characters as ``\\uXXXX``
    unless ``escape_controls`` is False."""
    out = []
    for ch in s:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif escape_controls and (ord(ch) < 0x20 or ord(ch) == 0x7F):
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def show(value: Any, *, escape_controls: bool = True) -> str:
    """A value as an error message shows it (TOML-like, cut to 80 characters)."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = quoted(value, escape_controls=escape_controls)
    else:
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
