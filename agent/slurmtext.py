"""Slurm's text as ``scontrol`` writes it: ``Key=value`` records, GRES strings and host lists.

Pure (no I/O): the agent reads its own node's allocation with it (agent/slurmnode.py) and the
workstation reads the cluster's nodes and jobs (tui/model/slurm.py). Every function takes text
and returns plain values or raises ``SlurmTextError`` naming what was expected.

Stdlib only, Python 3.9+.
"""
from __future__ import annotations

import re

TYPE_CHECKING = False  # (mypy reads it as True) typing is not imported by a rank's or job's start
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

# A key of scontrol's records: a word that starts a line or follows a space, then '='.
_KEY_RE = re.compile(r"(?:(?<=\s)|^)([A-Za-z][A-Za-z0-9_:]*)=")
# Keys whose value is free text that runs to the end of its line (it may hold spaces and "=").
_LINE_KEYS = ("Reason", "Comment", "Extra")
# A reason Slurm stamped with who set it and when, followed by another key or the line's end.
_STAMPED_RE = re.compile(r"(.*?\[[^\[\]@]*@[^\[\]]*\])(?=\s+[A-Za-z][A-Za-z0-9_:]*=|\s*$)")
# One GRES of a node or a job: name, optional type, count, then optional "(IDX:0-1)" or "(S:0)".
_GRES_RE = re.compile(
    r"^(?:gres[:/])?(?P<name>[A-Za-z0-9_]+)(?::(?P<type>[^:(,]+))?(?::(?P<count>\d+)[KMG]?)"
    r"(?:\((?P<extra>[^)]*)\))?$")


class SlurmTextError(ValueError):
    """Slurm's output is not what was expected; the message says what was."""


def records(text: str, first_key: str) -> List[Dict[str, str]]:
    """The ``Key=value`` records of ``scontrol show`` output, each starting at ``first_key``.

    Both shapes are read: the default one (a record over several indented lines, records apart
    by blank lines) and ``-o``'s (a record a line). Text that holds no ``first_key=`` at the
    start of a record raises SlurmTextError."""
    out: List[Dict[str, str]] = []
    current: Optional[Dict[str, str]] = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith(first_key + "="):
            current = {}
            out.append(current)
        elif current is None:
            raise SlurmTextError(f"expected a record starting with {first_key}=, got {raw[:80]!r}")
        current.update(pairs(line))
    return out


def pairs(line: str) -> Dict[str, str]:
    """The ``Key=value`` pairs of one line. A value runs to the next key, except the free-text
    keys (``Reason=``, ``Comment=``...) whose value is the rest of the line; a ``Reason=`` that
    ends in Slurm's ``[user@time]`` ends there (``-o``'s one line goes on after it)."""
    out: Dict[str, str] = {}
    pos = 0
    while True:
        m = _KEY_RE.search(line, pos)
        if m is None:
            return out
        key = m.group(1)
        if key in _LINE_KEYS:
            stamped = _STAMPED_RE.match(line, m.end())
            if key == "Reason" and stamped is not None:
                out[key] = stamped.group(1).strip()
                pos = stamped.end()
                continue
            out[key] = line[m.end():].strip()
            return out
        nxt = _KEY_RE.search(line, m.end())
        end = nxt.start() if nxt is not None else len(line)
        out[key] = line[m.end():end].strip()
        pos = end


def split_gres(text: str) -> List[str]:
    """``gpu:a100:2(IDX:0-1),gpu:v100:0(IDX:N/A)`` -> its GRES, split at commas outside ()."""
    out: List[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif ch == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return [g.strip() for g in out if g.strip()]


def gres(text: str, name: str = "gpu") -> Tuple[int, Optional[List[int]]]:
    """How many of GRES ``name`` a Gres/GresUsed/GRES string holds, and their indices when it
    says them (``IDX:0-1``; None when it does not: ``-d`` was not asked, or an older Slurm).

    ``(null)``, ``N/A`` and the empty string hold none. Typed GRES add up."""
    text = text.strip()
    if text in ("", "(null)", "N/A", "none"):
        return 0, None
    count = 0
    indices: Optional[List[int]] = None
    for one in split_gres(text):
        m = _GRES_RE.match(one)
        if m is None:
            # a name without a count ("gpu") is one of it
            bare = re.match(r"^(?:gres[:/])?([A-Za-z0-9_]+)(?::([^:(,]+))?$", one)
            if bare is None:
                raise SlurmTextError(f"expected a GRES like gpu:2 or gpu:a100:2(IDX:0-1), got {one!r}")
            if bare.group(1) == name:
                count += 1
            continue
        if m.group("name") != name:
            continue
        count += int(m.group("count"))
        extra = m.group("extra") or ""
        if extra.startswith("IDX:"):
            idx = extra[4:]
            if indices is None:
                indices = []
            if idx not in ("N/A", ""):
                indices.extend(index_list(idx))
    return count, (sorted(set(indices)) if indices is not None else None)


def index_list(text: str) -> List[int]:
    """``0-1,3`` -> [0, 1, 3]."""
    out: List[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise SlurmTextError(f"expected GPU indices like 0-1,3, got {text!r}")
        out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return out


def hostlist(text: str) -> List[str]:
    """A Slurm host list (``tb1-h[1-3,5],gpu[01-02]``) -> its host names, in order.
    ``(null)`` and the empty string are none."""
    text = text.strip()
    if text in ("", "(null)", "N/A"):
        return []
    out: List[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text + ","):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise SlurmTextError(f"expected a host list like node[1-3], got {text!r}")
        elif ch == "," and depth == 0:
            out.extend(_expand(text[start:i], text))
            start = i + 1
    if depth != 0:
        raise SlurmTextError(f"expected a host list like node[1-3], got {text!r}")
    return out


def _expand(one: str, whole: str) -> List[str]:
    m = re.match(r"^([^\[\]]*)\[([^\[\]]+)\]([^\[\]]*)$", one)
    if m is None:
        if "[" in one or "]" in one or not one:
            raise SlurmTextError(f"expected a host list like node[1-3], got {whole!r}")
        return [one]
    prefix, ranges, suffix = m.groups()
    out = []
    for part in ranges.split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise SlurmTextError(f"expected a host list like node[1-3], got {whole!r}")
        width = len(lo) if lo.startswith("0") else 0
        for n in range(int(lo), int(hi) + 1 if sep else int(lo) + 1):
            out.append(f"{prefix}{str(n).zfill(width)}{suffix}")
    return out


def user_name(text: str) -> str:
    """``bob(1001)`` -> ``bob`` (scontrol's UserId); a bare name stays."""
    return text.split("(", 1)[0].strip()


def job_node_gpus(text: str) -> Dict[str, List[int]]:
    """Node name -> the GPU indices a job holds there, from ``scontrol -d show job <id>``'s
    per-node lines (``Nodes=tb1-h[1-2] CPU_IDs=0 Mem=0 GRES=gpu:2(IDX:0-1)``; the default,
    several-line shape: ``-o`` would fold them into one record)."""
    out: Dict[str, List[int]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("Nodes="):
            continue
        p = pairs(line)
        if "GRES" not in p:
            continue
        indices = gres(p["GRES"])[1] or []
        for node in hostlist(p["Nodes"]):
            out[node] = indices
    return out
