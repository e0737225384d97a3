"""The agent's version: the content hash of the sources it was built from (see tui/bundle.py)."""
from __future__ import annotations

import json
import pkgutil

DEV_VERSION = "dev"


def agent_version() -> str:
    """The version baked into the zipapp at build time, or 'dev' when run from a source tree."""
    try:
        data = pkgutil.get_data("agent", "BUILD.json")
    except (OSError, ValueError):
        data = None
    if not data:
        return DEV_VERSION
    return str(json.loads(data.decode("utf-8")).get("version", DEV_VERSION))
