"""A pipeline step's artifact, the plain part: the packs of a step's hosts as one tree.

Each host of a finished step packs its part (``artifact_pack``: ``{tree, files, bytes, path}``,
files as ``[path, sha256, size, executable]``). ``merge`` makes them one artifact: the union of
their files (a path the hosts hold with the same content is one file; with different contents
it is an error naming the path and both hosts), named by the same tree hash as synced code, and
which host holds which contents (where ``tui.remote.artifacts.stage`` fetches them from). No I/O.
"""

from __future__ import annotations

from typing import Any

from tui.model.codesync import CodeSyncError, FileEntry, check_path, check_sha, tree_hash


class ArtifactError(ValueError):
    """Packs that cannot be one artifact, or an artifact that cannot be staged."""


def _rows(host: str, pack: Any) -> list[FileEntry]:
    if not isinstance(pack, dict) or not isinstance(pack.get("files"), list):
        raise ArtifactError(f"{host}: a pack must be an object with 'files' (artifact_pack's answer)")
    out = []
    for row in pack["files"]:
        if (not isinstance(row, (list, tuple)) or len(row) != 4 or isinstance(row[2], bool)
                or not isinstance(row[2], int) or row[2] < 0):
            raise ArtifactError(f"{host}: each file must be [path, sha256, size, executable], not {row!r}")
        try:
            out.append(FileEntry(check_path(str(row[0])), check_sha(str(row[1])), row[2], bool(row[3])))
        except CodeSyncError as e:
            raise ArtifactError(f"{host}: {e}") from None
    return out


def merge(packs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The packs of one step's hosts (host -> ``artifact_pack``'s answer) as one artifact:
    ``{"tree", "files", "bytes", "sources": {host: [sha256, ...]}}``."""
    files: dict[str, tuple[FileEntry, str]] = {}
    sources: dict[str, list[str]] = {}
    for host in sorted(packs):
        held: set[str] = set()
        for e in _rows(host, packs[host]):
            held.add(e.sha256)
            got = files.get(e.path)
            if got is None:
                files[e.path] = (e, host)
                continue
            first, where = got
            if first.sha256 != e.sha256 or first.size != e.size:
                raise ArtifactError(
                    f"{e.path}: {where} and {host} both wrote it, with different contents "
                    f"({first.sha256[:12]}, {first.size} bytes on {where}; {e.sha256[:12]}, {e.size} bytes "
                    f"on {host}): write each host's part under a name of its own")
            if e.executable and not first.executable:
                files[e.path] = (e, where)
        sources[host] = sorted(held)
    entries = sorted((e for e, _ in files.values()), key=lambda e: e.path)
    return {"tree": tree_hash(entries),
            "files": [[e.path, e.sha256, e.size, e.executable] for e in entries],
            "bytes": sum(e.size for e in entries),
            "sources": sources}


def check_artifact(artifact: Any) -> tuple[list[FileEntry], dict[str, list[str]]]:
    """An artifact's files and sources, checked: its files hash to its tree, and every content
    has a host that holds it."""
    if not isinstance(artifact, dict):
        raise ArtifactError("an artifact must be an object with tree, files and sources")
    entries = _rows("artifact", artifact)
    tree = artifact.get("tree")
    if tree_hash(entries) != tree:
        raise ArtifactError(f"the artifact's files do not hash to its tree {str(tree)[:12]}")
    raw = artifact.get("sources") or {}
    if not isinstance(raw, dict):
        raise ArtifactError("an artifact's 'sources' must map a host to the contents it holds")
    sources = {str(h): [str(s) for s in shas] for h, shas in raw.items() if isinstance(shas, list)}
    held = {s for shas in sources.values() for s in shas}
    for e in entries:
        if e.sha256 not in held:
            raise ArtifactError(f"{e.path}: no host holds its content {e.sha256[:12]}")
    return entries, sources
