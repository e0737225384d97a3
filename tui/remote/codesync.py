"""Code sync, the moving part: a snapshot of a local directory, and shipping it to hosts.

``snapshot`` lists the directory's files (in a git work tree: what git tracks plus untracked
files it does not ignore; elsewhere: everything but what ``.rigdeckignore`` names), checks the
spec's limits from sizes alone (before a byte is read), then reads each file once, hashes it and
keeps its content in the controller's store (``<RIGDECK_HOME>/code``), so what a job runs is what
was there when it was submitted, even if it waits in the queue while the files change.

``push`` ships a snapshot to one host over a connection of its own to the host's agent: the
host says whether it has the tree and which contents it lacks; only those are sent (compressed
when that pays), many per message and several messages in flight; then the host makes the tree.
The plain parts (manifest, tree hash, ignore rules, limits) are ``tui.model.codesync``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import stat
import subprocess
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tui.model.codesync import (
    IGNORE_FILE,
    CodeSpec,
    CodeSyncError,
    FileEntry,
    IgnoreRules,
    Manifest,
    check_limits,
    check_path,
)

MESSAGE_RAW_BYTES = 560 << 10  # payload per message: base64 of it stays under the agent's 1 MiB line
WINDOW = 4  # messages in flight per host
COMPRESS_MIN = 512  # smaller contents go as they are


@dataclass(frozen=True)
class PushResult:
    host: str
    path: str  # the tree on the host: the job's workdir there
    had_tree: bool  # the host had this version: nothing was sent
    files_sent: int
    bytes_sent: int  # content bytes of the files sent
    wire_bytes: int  # what went over the link for them (compressed, before base64)
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "path": self.path, "had_tree": self.had_tree,
                "files_sent": self.files_sent, "bytes_sent": self.bytes_sent,
                "wire_bytes": self.wire_bytes, "seconds": round(self.seconds, 3)}


# -- which files ------------------------------------------------------------------------------


def _git_files(root: Path) -> list[str] | None:
    """The files git would put in a commit of this directory (tracked, plus untracked ones not
    ignored), relative to ``root``; None when ``root`` is not in a git work tree."""
    if shutil.which("git") is None:
        return None
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    inside = subprocess.run(["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"],
                            capture_output=True, text=True, env=env)
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        return None
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard", "--", "."],
                         capture_output=True, env=env)
    if out.returncode != 0:
        raise CodeSyncError(f"{root}: git ls-files failed: {out.stderr.decode(errors='replace').strip()}")
    return sorted({p for p in out.stdout.decode("utf-8", "surrogateescape").split("\0") if p})


def _walk_files(root: Path) -> list[str]:
    """Every file under ``root`` but those ``.rigdeckignore`` (and the always-ignored) name."""
    ignore_file = root / IGNORE_FILE
    try:
        rules = IgnoreRules(ignore_file.read_text(encoding="utf-8").splitlines())
    except FileNotFoundError:
        rules = IgnoreRules()
    except (OSError, UnicodeDecodeError) as e:
        raise CodeSyncError(f"{ignore_file}: not readable as UTF-8 text ({e})") from None
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
        dirnames[:] = sorted(d for d in dirnames if not rules.ignored(rel_dir + d, True))
        out += [rel_dir + f for f in filenames if not rules.ignored(rel_dir + f, False)]
    return sorted(out)


def list_files(root: Path) -> tuple[list[tuple[str, Path, int, bool]], str]:
    """``(relative path, absolute path, size, executable)`` for each regular file to ship (a
    symlink to a file ships the file's content), and how the list was made."""
    names = _git_files(root)
    how = "git" if names is not None else IGNORE_FILE
    if names is None:
        names = _walk_files(root)
    files = []
    for rel in names:
        full = root / rel
        try:
            st = full.stat()
        except OSError:
            continue  # tracked but deleted here, or a dangling link: nothing to ship
        if not stat.S_ISREG(st.st_mode):
            continue  # a submodule or another non-file
        try:
            check_path(rel)
        except CodeSyncError as e:
            raise CodeSyncError(f"{root}: {e}") from None
        files.append((rel, full, st.st_size, bool(st.st_mode & 0o111)))
    return files, how


# -- the controller's store -------------------------------------------------------------------


class CodeStore:
    """Contents by hash and manifests by tree, on the controller's machine."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._lock = threading.Lock()

    def object_path(self, sha: str) -> Path:
        return self.root / "objects" / sha[:2] / sha

    def has(self, sha: str) -> bool:
        return self.object_path(sha).is_file()

    def read(self, sha: str) -> bytes:
        return self.object_path(sha).read_bytes()

    def _keep(self, sha: str, data: bytes) -> bool:
        dest = self.object_path(sha)
        if dest.is_file():
            return False
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f"{sha}.tmp{os.getpid()}.{threading.get_ident()}")
        tmp.write_bytes(data)
        os.replace(tmp, dest)
        return True

    def save_manifest(self, manifest: Manifest) -> None:
        path = self.root / "manifests" / f"{manifest.tree}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(manifest.to_wire()))
        os.replace(tmp, path)

    def manifest(self, tree: str) -> Manifest:
        path = self.root / "manifests" / f"{tree}.json"
        try:
            return Manifest.from_wire(json.loads(path.read_text()))
        except FileNotFoundError:
            raise CodeSyncError(f"code snapshot {tree[:12]} is not in this controller's store "
                                f"({self.root}): launch the job again") from None

    def snapshot(self, code: CodeSpec, where: str = "[code] sync") -> tuple[CodeSpec, dict[str, Any]]:
        """Take the snapshot of ``code.sync``: returns the spec with ``tree``/``files``/``size``
        set, and what was done (files, bytes, new contents, how the list was made)."""
        root = Path(code.sync)
        if not root.is_dir():
            raise CodeSyncError(f"{where}: {root} is not a directory")
        files, how = list_files(root)
        check_limits(len(files), sum(f[2] for f in files), code, f"{where} ({root})")
        entries = []
        new = 0
        for rel, full, _size, exe in files:
            try:
                data = full.read_bytes()
            except OSError as e:
                raise CodeSyncError(f"{where}: cannot read {full}: {e.strerror or e}") from None
            sha = hashlib.sha256(data).hexdigest()
            new += self._keep(sha, data)
            entries.append(FileEntry(rel, sha, len(data), exe))
        manifest = Manifest(tuple(sorted(entries, key=lambda e: e.path)))
        check_limits(len(entries), manifest.size, code, f"{where} ({root})")  # grown while read
        self.save_manifest(manifest)
        done = {"tree": manifest.tree, "files": len(entries), "bytes": manifest.size,
                "new_contents": new, "listed_by": how}
        return replace(code, tree=manifest.tree, files=len(entries), size=manifest.size), done


# -- to a host --------------------------------------------------------------------------------


def _pieces(store: CodeStore, missing: list[str], sizes: dict[str, int]
            ) -> Iterator[tuple[list[list[Any]], int, int, int]]:
    """Messages of ``code_put`` items: (items, files finished in it, content bytes, wire bytes)."""
    batch: list[list[Any]] = []
    batch_wire = 0
    batch_files = 0
    batch_bytes = 0
    for sha in missing:
        data = store.read(sha)
        if len(data) != sizes[sha] or hashlib.sha256(data).hexdigest() != sha:
            raise CodeSyncError(f"the controller's stored content {sha[:12]} is damaged ({store.root})")
        offset = 0
        while True:
            part = data[offset: offset + MESSAGE_RAW_BYTES]
            last = offset + len(part) >= len(data)
            enc, payload = "raw", part
            if len(part) >= COMPRESS_MIN:
                z = zlib.compress(part, 1)
                if len(z) < len(part) * 0.9:
                    enc, payload = "zlib", z
            if batch and batch_wire + len(payload) > MESSAGE_RAW_BYTES:
                yield batch, batch_files, batch_bytes, batch_wire
                batch, batch_wire, batch_files, batch_bytes = [], 0, 0, 0
            batch.append([sha, enc, base64.b64encode(payload).decode("ascii"), offset, last])
            batch_wire += len(payload)
            batch_bytes += len(part)
            offset += len(part)
            if last:
                batch_files += 1
                break
    if batch:
        yield batch, batch_files, batch_bytes, batch_wire


def push(link: Any, host: str, store: CodeStore, tree: str,
         progress: Callable[[str, int, int], None] | None = None) -> PushResult:
    """Ship tree ``tree`` (from ``store``) to ``host`` over ``link`` (an AgentLink of its own:
    requests are pipelined on it). ``progress(host, bytes_done, bytes_total)`` is called as
    contents go."""
    t0 = time.monotonic()
    manifest = store.manifest(tree)
    sizes = manifest.blobs()
    from tui.remote.agentclient import AgentClient

    agent = AgentClient.over(link)
    answer = agent.code_have(tree=tree, blobs=sorted(sizes), timeout=60)
    if answer.get("path"):
        if progress:
            progress(host, 0, 0)
        return PushResult(host, answer["path"], True, 0, 0, 0, time.monotonic() - t0)
    missing = [str(s) for s in answer.get("missing") or [] if s in sizes]
    total = sum(sizes[s] for s in missing)
    sent = {"files": 0, "bytes": 0, "wire": 0}
    if progress:
        progress(host, 0, total)

    def calls() -> Iterator[tuple[str, dict[str, Any]]]:
        for items, files, content, wire in _pieces(store, missing, sizes):
            sent["files"] += files
            sent["bytes"] += content
            sent["wire"] += wire
            yield "code_put", {"blobs": items}

    done = {"bytes": 0}

    def result(r: Any) -> None:
        done["bytes"] += int(r.get("bytes", 0)) if isinstance(r, dict) else 0
        if progress:
            progress(host, min(done["bytes"], total), total)

    link.pipeline(calls(), window=WINDOW, timeout=120, on_result=result)
    made = agent.code_commit(tree=tree, files=manifest.to_wire(), timeout=300)
    return PushResult(host, made["path"], False, sent["files"], sent["bytes"], sent["wire"],
                      time.monotonic() - t0)
