"""The launch form's side that is not UI: spec TOML <-> form fields.

A spec file loaded into the form keeps everything the form does not show (env,
hyperparameters, restart, ...): the form's fields override the file's values, and the result
goes through ``jobspec_from_toml`` like any file, so its errors name the same fields.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tui.model import tomlwrite
from tui.model.jobspec import JobSpec, JobSpecError, jobspec_from_toml

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# (field as the spec names it, label). Dotted: inside a table.
FORM_FIELDS: tuple[tuple[str, str], ...] = (
    ("name", "Name"),
    ("command", "Command"),
    ("workdir", "Workdir"),
    ("launcher", "Launcher"),
    ("nodes", "Nodes"),
    ("hosts", "Hosts"),
    ("gpus_per_node", "GPUs per node"),
    ("processes_per_node", "Procs per node"),
    ("total_steps", "Total steps"),
    ("max_runtime", "Max runtime"),
    ("checkpoint.dir", "Checkpoint dir"),
    ("checkpoint.owner", "Checkpoint owner"),
)
INT_FIELDS = ("nodes", "gpus_per_node", "processes_per_node", "total_steps")


def field_id(name: str) -> str:
    """A widget id for a spec field (``checkpoint.owner`` -> ``f-checkpoint-owner``)."""
    return "f-" + name.replace(".", "-").replace("_", "-")


def _get(d: Mapping[str, Any], dotted: str) -> Any:
    cur: Any = d
    for part in dotted.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


def form_values(data: Mapping[str, Any]) -> dict[str, str]:
    """What the form's inputs show for a spec's TOML data."""
    out = {}
    for name, _ in FORM_FIELDS:
        v = _get(data, name)
        if v is None:
            out[name] = ""
        elif name == "command" and isinstance(v, list):
            out[name] = " ".join(_word(str(x)) for x in v)
        elif name == "hosts" and isinstance(v, list):
            out[name] = ", ".join(str(x) for x in v)
        else:
            out[name] = str(v)
    return out


def _word(w: str) -> str:
    """A command word as the form shows it: quoted only where shlex.split needs it
    (``{python}`` stays as it is)."""
    return w if w and not re.search(r"[\s'\"\\#]", w) else shlex.quote(w)


def merge_form(base: Mapping[str, Any], values: Mapping[str, str]) -> dict[str, Any]:
    """The spec data with the form's values in place; an empty field removes the key."""
    data: dict[str, Any] = json.loads(json.dumps(base))  # a deep copy of plain TOML data
    for name, raw in values.items():
        text = raw.strip()
        parts = name.split(".")
        target = data
        for p in parts[:-1]:
            target = target.setdefault(p, {})
        key = parts[-1]
        if not text:
            target.pop(key, None)
            continue
        value: Any = text
        if name == "command":
            try:
                value = shlex.split(text)
            except ValueError as e:
                raise JobSpecError(
                    None, "command", f"a command line with balanced quotes ({e})"
                ) from None
        elif name == "hosts":
            value = [h.strip() for h in text.replace(",", " ").split() if h.strip()]
        elif name in INT_FIELDS or (name == "max_runtime" and text.isdigit()):
            value = int(text) if re.fullmatch(r"[+-]?\d+", text) else text
        target[key] = value
    for table in [k for k, v in data.items() if isinstance(v, dict) and not v]:
        del data[table]
    return data


def read_spec_data(path: Path) -> dict[str, Any]:
    """A spec file's TOML data (not yet checked); JobSpecError when it cannot be read."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise JobSpecError(path, None, "an existing job spec file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise JobSpecError(path, None, f"a readable UTF-8 file ({e})") from None
    except tomllib.TOMLDecodeError as e:
        raise JobSpecError(path, None, f"valid TOML ({e})") from None


def spec_from_form(
    base: Mapping[str, Any], values: Mapping[str, str], path: Path | None
) -> JobSpec:
    """Check the form as a spec (``path`` anchors a relative workdir and names the spec)."""
    return jobspec_from_toml(tomlwrite.dumps(merge_form(base, values)), path)
