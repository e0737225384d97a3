"""Text from the hosts, made safe to draw: what a rank prints must not drive the operator's terminal.

Rank output and failure tails arrive byte for byte from remote processes. Drawn as they are,
their escape sequences would reach the terminal the app runs in: a colour change is harmless, but
a screen clear, a cursor move, a reset (``ESC c``) or an OSC 52 clipboard write is not. The app
shows each line as a terminal would have left it: rich's ANSI decoder drops escape sequences and
keeps what follows the last carriage return (a redrawn progress bar shows its last state); an OSC
sequence ended by BEL (a window title) goes too, and any control character left over becomes
U+FFFD.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")  # C0 but tab, DEL, C1
_OSC_BEL = re.compile(r"\x1b\][^\x07\x1b]*\x07")  # rich ends OSC only at ESC backslash


def terminal_safe(line: str) -> str:
    """``line`` without escape sequences or control characters; tabs are kept."""
    if not _CONTROL.search(line):
        return line  # the common case, and cheap: nothing to decode
    from rich.text import Text  # here: the CLI imports this module and seldom needs rich

    return _CONTROL.sub("\ufffd", Text.from_ansi(_OSC_BEL.sub("", line), end="").plain)


def log_lines(text: str) -> list[str]:
    """A chunk of rank output as lines: split at newlines only (``str.splitlines`` would also split
    at the carriage returns a progress bar redraws with), a CRLF's CR dropped."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the chunk ended with a newline (an empty chunk gives no line)
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]
