"""Every TOML file rigdeck writes is written here, with tomli-w: never formatted by hand, so that
quoting, escapes and key syntax have one owner. (Reading is tomllib's, in each file's parser.)

Written this way: a job spec from the launch form (``tui.model.specform``), the inventory an
import or the onboarding writes (``tui.remote.inventoryfile``), the server's inventory and config
(``tui.remote.serverhost``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tomli_w

__all__ = ["dumps", "table"]


def dumps(data: Mapping[str, Any]) -> str:
    """A whole document."""
    return tomli_w.dumps(data)


def table(name: str, data: Mapping[str, Any], *, array: bool = False) -> str:
    """One table under a header of its own, one key a line, a table value after it as
    ``[name.key]``: ``[name]``, or with ``array`` one entry of an array of tables, ``[[name]]``.

    tomli-w writes a short entry of an array of tables inline (``hosts = [{ ... }]``); an entry
    with its own header reads as a file a user edits, and can be appended to one.
    """
    text = tomli_w.dumps({name: dict(data)})
    if not array:
        return text
    header = tomli_w.dumps({name: {}}).rstrip("\n")  # [name], quoted as TOML needs
    # A table of nothing but tables gets no header of its own from tomli-w.
    body = text[len(header) + 1:] if text.startswith(header + "\n") else text
    return f"[{header}]\n{body}"
