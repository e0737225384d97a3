"""Code sync, the plain part: what ``[code]`` says, which files a tree holds, and its hash.

A job spec with ``[code] sync = "DIR"`` ships DIR (on the operator's machine) to every host of
the job before it starts. What is shipped is a *manifest*: one entry per file (relative POSIX
path, executable bit, SHA-256 of the content, size), sorted by path. The manifest's own SHA-256
(over a canonical text form) is the tree's name: hosts store file contents by their hash and
a tree by its name, so a host that has the tree gets nothing and a host that has most of its
files gets only the others. This module does no I/O: the reading and sending are in
``tui.remote.codesync``.
"""

from __future__ import annotations

import fnmatch
import hashlib
import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

DEFAULT_MAX_FILES = 20_000
DEFAULT_MAX_MB = 1024
IGNORE_FILE = ".rigdeckignore"
# Never shipped, whatever the ignore file says (a tree that is not a git work tree).
ALWAYS_IGNORED = (".git/", "__pycache__/", "*.pyc", ".rigdeckignore~")


class CodeSyncError(ValueError):
    """A tree that cannot be shipped as it is (too big, unreadable, a bad path)."""


@dataclass(frozen=True)
class CodeSpec:
    """``[code]`` of a job spec. ``sync`` is an absolute directory on the operator's machine.
    ``follow_links``: ship what a symbolic link out of it points to (refused otherwise).
    ``tree`` is filled in when the controller has taken its snapshot (the manifest's hash)."""

    sync: str
    max_files: int = DEFAULT_MAX_FILES
    max_mb: int = DEFAULT_MAX_MB
    follow_links: bool = False
    tree: str | None = None
    files: int | None = None
    size: int | None = None

    def to_dict(self) -> dict[str, object]:
        return {"sync": self.sync, "max_files": self.max_files, "max_mb": self.max_mb,
                "follow_links": self.follow_links, "tree": self.tree, "files": self.files, "size": self.size}

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> CodeSpec:
        return cls(sync=str(d["sync"]), max_files=int(d.get("max_files") or DEFAULT_MAX_FILES),  # type: ignore[call-overload]
                   max_mb=int(d.get("max_mb") or DEFAULT_MAX_MB),  # type: ignore[call-overload]
                   follow_links=bool(d.get("follow_links", False)),
                   tree=d.get("tree") or None,  # type: ignore[arg-type]
                   files=d.get("files"), size=d.get("size"))  # type: ignore[arg-type]


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative, POSIX separators, no '..'
    sha256: str
    size: int
    executable: bool = False

    def line(self) -> str:
        return f"{self.sha256} {'x' if self.executable else '-'} {self.size} {self.path}"


@dataclass(frozen=True)
class Manifest:
    entries: tuple[FileEntry, ...]

    @property
    def tree(self) -> str:
        return tree_hash(self.entries)

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)

    def blobs(self) -> dict[str, int]:
        """Each distinct content hash and its size (two files with the same content: one blob)."""
        return {e.sha256: e.size for e in self.entries}

    def to_wire(self) -> list[list[object]]:
        return [[e.path, e.sha256, e.size, e.executable] for e in self.entries]

    @classmethod
    def from_wire(cls, rows: Iterable[Sequence[object]]) -> Manifest:
        entries = []
        for row in rows:
            path, sha, size, exe = row
            entries.append(FileEntry(check_path(str(path)), check_sha(str(sha)), int(size), bool(exe)))  # type: ignore[call-overload]
        return cls(tuple(sorted(entries, key=lambda e: e.path)))


_SHA_RE = re.compile(r"[0-9a-f]{64}")


def check_sha(sha: str) -> str:
    if not _SHA_RE.fullmatch(sha):
        raise CodeSyncError(f"not a SHA-256 in hex: {sha!r}")
    return sha


def check_path(path: str) -> str:
    """A manifest path: relative, normalised, inside the tree, no NUL or newline."""
    if (not path or path.startswith("/") or "\0" in path or "\n" in path or "\\" in path
            or posixpath.normpath(path) != path or path == "." or path.split("/")[0] == ".."):
        raise CodeSyncError(f"not a relative path inside the tree: {path!r}")
    return path


def tree_hash(entries: Iterable[FileEntry]) -> str:
    """The tree's name: SHA-256 of its sorted entry lines."""
    h = hashlib.sha256(b"rigdeck-tree-1\n")
    for e in sorted(entries, key=lambda e: e.path):
        h.update(e.line().encode("utf-8") + b"\n")
    return h.hexdigest()


def check_limits(count: int, size: int, spec: CodeSpec, where: str) -> None:
    """Raise before anything is read further or sent when the tree is over the spec's limits."""
    if count > spec.max_files:
        raise CodeSyncError(
            f"{where}: {count} files to sync, over [code] max_files = {spec.max_files}: list what "
            f"should not be shipped in .gitignore (a git work tree) or {IGNORE_FILE}, or raise max_files")
    if size > spec.max_mb << 20:
        raise CodeSyncError(
            f"{where}: {size / (1 << 20):.1f} MB to sync, over [code] max_mb = {spec.max_mb}: list what "
            f"should not be shipped in .gitignore (a git work tree) or {IGNORE_FILE}, or raise max_mb")


class IgnoreRules:
    """The patterns of a ``.rigdeckignore`` (gitignore's common forms): ``#`` comments, blank
    lines, ``name`` (anywhere), ``/name`` (at the top), ``dir/`` (directories only), ``*``/``?``/
    ``[..]`` globs, ``**/`` any depth, and ``!pattern`` to take a file back. The last matching
    pattern decides."""

    def __init__(self, lines: Iterable[str] = ()):
        self.rules: list[tuple[bool, bool, bool, re.Pattern[str]]] = []  # (negate, dir_only, anchored, rx)
        for pat in [*ALWAYS_IGNORED, *lines]:
            self._add(pat)

    def _add(self, raw: str) -> None:
        pat = raw.rstrip("\n").rstrip()
        if not pat or pat.startswith("#"):
            return
        negate = pat.startswith("!")
        if negate:
            pat = pat[1:]
        dir_only = pat.endswith("/")
        pat = pat.rstrip("/")
        anchored = "/" in pat
        pat = pat.lstrip("/")
        if not pat:
            return
        self.rules.append((negate, dir_only, anchored, re.compile(_glob_regex(pat))))

    def ignored(self, path: str, is_dir: bool) -> bool:
        """Whether ``path`` (relative, POSIX) is ignored; a directory's parents are checked by
        the walk, which does not descend into an ignored directory."""
        name = path.rsplit("/", 1)[-1]
        out = False
        for negate, dir_only, anchored, rx in self.rules:
            if dir_only and not is_dir:
                continue
            if rx.fullmatch(path if anchored else name) or (not anchored and rx.fullmatch(path)):
                out = not negate
        return out


def _glob_regex(pat: str) -> str:
    """A gitignore-style glob as a regex: ``*`` and ``?`` stay inside one path segment, ``**``
    crosses them."""
    out = []
    i = 0
    while i < len(pat):
        if pat.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pat.startswith("/**", i) and i + 3 == len(pat):
            out.append("/.*")
            i += 3
        elif pat[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pat[i] == "?":
            out.append("[^/]")
            i += 1
        elif pat[i] == "[":
            j = pat.find("]", i + 1)
            if j < 0:
                out.append(re.escape(pat[i]))
                i += 1
            else:
                out.append(fnmatch.translate(pat[i:j + 1])[4:-3])
                i = j + 1
        else:
            out.append(re.escape(pat[i]))
            i += 1
    return "".join(out)


def short(tree: str | None) -> str:
    """How a tree's hash is shown: its first 12 hex digits."""
    return tree[:12] if tree else "-"
