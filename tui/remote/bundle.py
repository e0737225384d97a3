"""Build the agent zipapp from ``agent/`` and ``runtime/``; its content hash is the agent version.

The archive is byte-for-byte reproducible (sorted entries, fixed timestamps and modes), so the same
sources always give the same version and the same file hash.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGES = ("agent", "runtime")
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class AgentBundle:
    path: Path
    version: str
    sha256: str
    size: int


def _source_files(root: Path) -> list[tuple[str, Path]]:
    files = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix in {".py", ".json"}:
                files.append((path.relative_to(root).as_posix(), path))
    return sorted(files)


def source_version(root: Path = REPO_ROOT) -> str:
    """Content hash of the agent sources: the agent version."""
    h = hashlib.sha256()
    for rel, path in _source_files(root):
        h.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _entry(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    zf.writestr(info, data)


def build_bytes(root: Path = REPO_ROOT) -> tuple[str, bytes]:
    version = source_version(root)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        # The archive's entry point is the agent's own (it checks the Python version first).
        _entry(zf, "__main__.py", (root / "agent" / "__main__.py").read_bytes())
        for rel, path in _source_files(root):
            _entry(zf, rel, path.read_bytes())
        _entry(zf, "agent/BUILD.json", json.dumps({"version": version}).encode())
    return version, b"#!/usr/bin/env python3\n" + buf.getvalue()


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "rigdeck"


def build_agent(out_dir: Path | None = None, root: Path = REPO_ROOT) -> AgentBundle:
    """Build (or reuse) ``agent-<version>.pyz`` in ``out_dir`` (default: the user cache)."""
    version, data = build_bytes(root)
    out = Path(out_dir) if out_dir else cache_dir()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"agent-{version}.pyz"
    digest = hashlib.sha256(data).hexdigest()
    if not path.exists() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
        # Several processes (two CLIs at once) and threads may build it together: own temp names.
        tmp = path.with_suffix(f".pyz.tmp-{os.getpid()}-{threading.get_ident()}")
        tmp.write_bytes(data)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    return AgentBundle(path=path, version=version, sha256=digest, size=len(data))
