"""User key bindings: ``~/.config/rigdeck/keys.toml`` maps binding ids to keys.

Every binding in the app has an id (``job.launch``, ``logs.rank``, ...). The file can list them
flat or grouped::

    "job.launch" = "L"          # flat, quoted (a dotted bare key would be a table)

    [logs]
    rank = "R"                  # the same as "logs.rank" = "R"
    follow = "F,ctrl+f"         # several keys, comma-separated

No Textual here: the app applies the result with ``App.set_keymap``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def keymap_path() -> Path:
    """``$RIGDECK_KEYS``, else ``$XDG_CONFIG_HOME/rigdeck/keys.toml`` (default ~/.config)."""
    explicit = os.environ.get("RIGDECK_KEYS")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(base) / "rigdeck" / "keys.toml"


def _flatten(d: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            yield from _flatten(v, key + ".")
        else:
            yield key, v


def load_keymap(
    path: Path | None = None, known: Iterable[str] = ()
) -> tuple[dict[str, str], list[str]]:
    """(binding id -> keys, problems). A missing file is no problem; a bad entry is skipped and
    named in the problems, so one typo does not cost the other bindings."""
    path = path or keymap_path()
    if not path.exists():
        return {}, []
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        return {}, [f"{path}: not readable as TOML: {e}"]
    if isinstance(data.get("keys"), Mapping) and len(data) == 1:
        data = data["keys"]  # a [keys] table is fine too
    known_ids = set(known)
    keymap: dict[str, str] = {}
    problems = []
    for binding_id, value in _flatten(data):
        if not isinstance(value, str) or not value.strip():
            problems.append(
                f'{path}: {binding_id!r}: expected a key such as "ctrl+l", got {value!r}'
            )
            continue
        if known_ids and binding_id not in known_ids:
            problems.append(f"{path}: unknown binding id {binding_id!r} (see the help screen, '?')")
            continue
        keymap[binding_id] = ",".join(k.strip() for k in value.split(",") if k.strip())
    return keymap, problems
