"""Text from the hosts, made safe to draw: what a rank prints must not drive the operator's terminal.

Rank output and failure tails arrive byte for byte from remote processes. Drawn as they are,
their escape sequences would reach the terminal the app runs in: a colour change is harmless, but
a screen clear, a cursor move, a reset (``ESC c``) or an OSC 52 clipboard write is not. The faces
show each line as a terminal would have left it: ECMA-48 control sequences (CSI, OSC ended by BEL
or ST, and the two-character Fe escapes) are dropped, what follows the last carriage return is
kept (a redrawn progress bar shows its last state), BEL goes, and any control character left
over becomes U+FFFD (so an ``ESC c`` is defused, not obeyed).

The control room keeps raw text; this module is plain string work, so both faces and the log
buffer can use it without a rendering library.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")  # C0 but tab, DEL, C1
_SEQUENCE = re.compile(
    r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC ... BEL or ST (a title, a clipboard write)
    r"|\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves, screen clears
    r"|\x1b[(@-Z\\-_]"  # a two-character escape (Fe), and a charset designator's lead-in
)


def terminal_safe(line: str) -> str:
    """``line`` without escape sequences or control characters; tabs are kept."""
    if not _CONTROL.search(line):
        return line  # the common case, and cheap: nothing to decode
    text = _SEQUENCE.sub("", line)
    if "\r" in text:
        text = text.rsplit("\r", 1)[1]  # a terminal would show the last redraw only
    return _CONTROL.sub("\ufffd", text.replace("\x07", ""))


def log_lines(text: str) -> list[str]:
    """A chunk of rank output as lines: split at newlines only (``str.splitlines`` would also split
    at the carriage returns a progress bar redraws with), a CRLF's CR dropped."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the chunk ended with a newline (an empty chunk gives no line)
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]
