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
PROBE_BYTES = 64 << 10  # how much of a large content is tried first
KEEP_SNAPSHOTS = 32  # the controller's store keeps the newest snapshots (and their contents)


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


def list_files(root: Path) -> tuple[list[tuple[str, Path, int, bool, os.stat_result]], str]:
    """``(relative path, absolute path, size, executable, stat)`` for each regular file to ship
    (a symlink to a file ships the file's content), and how the list was made."""
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
        files.append((rel, full, st.st_size, bool(st.st_mode & 0o111), st))
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

    def missing(self, blobs: list[Any]) -> list[str]:
        """Which of ``blobs`` (``[sha256, size]``) this store lacks (or holds at another size)."""
        out = []
        for sha, size in blobs:
            p = self.object_path(str(sha))
            if not p.is_file() or p.stat().st_size != size:
                out.append(str(sha))
        return out

    def put(self, items: list[Any]) -> dict[str, int]:
        """Keep contents sent as a host's agent takes them (``code_put`` items), each checked
        against its hash: a server's store, filled by a workstation. The same layout and checks
        as a host's store, so the same code."""
        from agent import code as host_code

        if self.root.name != "code":
            raise CodeSyncError(f"a store that takes contents lives in a directory named code, not {self.root}")
        try:
            return host_code.put(str(self.root.parent), items)
        except host_code.CodeError as e:
            raise CodeSyncError(str(e)) from None

    def add_manifest(self, tree: str, files: list[Any]) -> Manifest:
        """Record a tree whose every content is here, after checking it hashes to ``tree``."""
        manifest = Manifest.from_wire(files)
        if manifest.tree != tree:
            raise CodeSyncError(f"the manifest does not hash to tree {tree[:12]}")
        lacking = self.missing([[e.sha256, e.size] for e in manifest.entries])
        if lacking:
            raise CodeSyncError(f"{len(lacking)} contents of tree {tree[:12]} are not here: send them first")
        self.save_manifest(manifest)
        return manifest

    def upload(self, other: Any, tree: str) -> dict[str, int]:
        """Send tree ``tree`` of this store to another store (a server's, through the controller
        API): only the contents it lacks, then the manifest. ``other`` has this store's own
        ``missing``, ``put`` and ``add_manifest``."""
        manifest = self.manifest(tree)
        sizes = manifest.blobs()
        lacking = [str(s) for s in other.missing([[s, n] for s, n in sorted(sizes.items())]) if s in sizes]
        payloads = Payloads(self, sizes)
        sent = {"files": 0, "bytes": 0, "wire": 0}
        for items, files, content, wire in _pieces(payloads, lacking):
            other.put(items)
            sent["files"] += files
            sent["bytes"] += content
            sent["wire"] += wire
        other.add_manifest(tree, manifest.to_wire())
        return sent

    def prune(self, keep: tuple[str, ...] = (), keep_newest: int = KEEP_SNAPSHOTS) -> int:
        """Forget all but the newest ``keep_newest`` snapshots (and ``keep``), and the contents
        only they used; returns how many contents went. A job still queued on a forgotten
        snapshot fails its start saying so."""
        with self._lock:
            mdir = self.root / "manifests"
            try:
                manifests = sorted(mdir.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
            except FileNotFoundError:
                return 0
            if len(manifests) <= keep_newest:
                return 0
            kept = [p for i, p in enumerate(manifests) if i < keep_newest or p.stem in keep]
            used: set[str] = set()
            for p in kept:
                try:
                    used.update(str(row[1]) for row in json.loads(p.read_text()))
                except (OSError, ValueError, IndexError, TypeError):
                    return 0  # unsure what is used: keep everything
            for p in manifests:
                if p not in kept:
                    p.unlink(missing_ok=True)
            gone = 0
            for obj in (self.root / "objects").glob("*/*"):
                if len(obj.name) == 64 and obj.name not in used:
                    obj.unlink(missing_ok=True)
                    gone += 1
            return gone

    def _stat_cache(self) -> dict[str, list[Any]]:
        """What each file's stat was when it was last read, and its hash, as git's index keeps
        it: a file whose size, mtime, inode and device are as they were is not read again. An
        entry whose mtime was too close to when it was recorded is not kept (a change within
        the clock's grain would look unchanged)."""
        try:
            data = json.loads((self.root / "statcache.json").read_text())
            return {k: v for k, v in data.get("files", {}).items() if isinstance(v, list) and len(v) == 5}
        except (OSError, ValueError, AttributeError):
            return {}

    def _save_stat_cache(self, cache: dict[str, list[Any]], seen: dict[str, list[Any]], started: float) -> None:
        racy = int((started - 2.0) * 1e9)
        merged = {**cache, **{k: v for k, v in seen.items() if v and v[1] < racy}}
        for k, v in seen.items():
            if not v or v[1] >= racy:
                merged.pop(k, None)
        if len(merged) > 200_000:  # a bound: the newest snapshot's files first
            merged = {k: merged[k] for k in seen if k in merged}
        path = self.root / "statcache.json"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"statcache.json.tmp{os.getpid()}.{threading.get_ident()}")
            tmp.write_text(json.dumps({"files": merged}))
            os.replace(tmp, path)
        except OSError:
            pass  # only a cache

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
        read = 0
        cache = self._stat_cache()
        started = time.time()
        seen: dict[str, list[Any]] = {}
        for rel, full, _size, exe, st in files:
            key = str(full)
            stamp = [st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev]
            hit = cache.get(key)
            if hit is not None and hit[:4] == stamp and self.has(hit[4]):
                sha, size = hit[4], st.st_size  # unchanged since it was last read (see _stat_cache)
            else:
                try:
                    data = full.read_bytes()
                except OSError as e:
                    raise CodeSyncError(f"{where}: cannot read {full}: {e.strerror or e}") from None
                sha, size = hashlib.sha256(data).hexdigest(), len(data)
                new += self._keep(sha, data)
                read += 1
                if size != st.st_size:
                    stamp = []  # changed while read: not to be trusted next time
            seen[key] = [*stamp, sha] if stamp else []
            entries.append(FileEntry(rel, sha, size, exe))
        self._save_stat_cache(cache, seen, started)
        manifest = Manifest(tuple(sorted(entries, key=lambda e: e.path)))
        check_limits(len(entries), manifest.size, code, f"{where} ({root})")  # grown while read
        self.save_manifest(manifest)
        self.prune(keep=(manifest.tree,))
        done = {"tree": manifest.tree, "files": len(entries), "bytes": manifest.size,
                "new_contents": new, "files_read": read, "listed_by": how}
        return replace(code, tree=manifest.tree, files=len(entries), size=manifest.size), done


# -- to a host --------------------------------------------------------------------------------


class Payloads:
    """Each content's ``code_put`` items, encoded once however many hosts it goes to (reading,
    checking, compressing and base64 cost the controller's CPU once per sync, not per host)."""

    def __init__(self, store: CodeStore, sizes: dict[str, int]):
        self.store = store
        self.sizes = sizes
        self._done: dict[str, list[tuple[list[Any], int, int]]] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def items(self, sha: str) -> list[tuple[list[Any], int, int]]:
        """``[(item, content bytes, wire bytes)]``: one item, or a large content's parts."""
        with self._lock:
            lock = self._locks.setdefault(sha, threading.Lock())
        with lock:
            got = self._done.get(sha)
            if got is None:
                got = self._done[sha] = self._encode(sha)
            return got

    def _encode(self, sha: str) -> list[tuple[list[Any], int, int]]:
        data = self.store.read(sha)
        if len(data) != self.sizes[sha] or hashlib.sha256(data).hexdigest() != sha:
            raise CodeSyncError(f"the controller's stored content {sha[:12]} is damaged ({self.store.root})")
        # Compress only what compresses: a sample of a large content says (random bytes,
        # already compressed data and weights are sent as they are).
        compress = len(data) >= COMPRESS_MIN and (
            len(data) <= PROBE_BYTES or len(zlib.compress(data[:PROBE_BYTES], 1)) < PROBE_BYTES * 0.9)
        out = []
        offset = 0
        while True:
            part = data[offset: offset + MESSAGE_RAW_BYTES]
            last = offset + len(part) >= len(data)
            enc, payload = "raw", part
            if compress and len(part) >= COMPRESS_MIN:
                z = zlib.compress(part, 1)
                if len(z) < len(part) * 0.9:
                    enc, payload = "zlib", z
            out.append(([sha, enc, base64.b64encode(payload).decode("ascii"), offset, last], len(part), len(payload)))
            offset += len(part)
            if last:
                return out


def _pieces(payloads: Payloads, missing: list[str]) -> Iterator[tuple[list[list[Any]], int, int, int]]:
    """Messages of ``code_put`` items: (items, files finished in it, content bytes, wire bytes)."""
    batch: list[list[Any]] = []
    batch_wire = 0
    batch_files = 0
    batch_bytes = 0
    for sha in missing:
        for item, content, wire in payloads.items(sha):
            if batch and batch_wire + wire > MESSAGE_RAW_BYTES:
                yield batch, batch_files, batch_bytes, batch_wire
                batch, batch_wire, batch_files, batch_bytes = [], 0, 0, 0
            batch.append(item)
            batch_wire += wire
            batch_bytes += content
            batch_files += bool(item[4])
    if batch:
        yield batch, batch_files, batch_bytes, batch_wire


def push(link: Any, host: str, store: CodeStore, tree: str,
         progress: Callable[[str, int, int], None] | None = None,
         payloads: Payloads | None = None) -> PushResult:
    """Ship tree ``tree`` (from ``store``) to ``host`` over ``link`` (an AgentLink of its own:
    requests are pipelined on it). ``progress(host, bytes_done, bytes_total)`` is called as
    contents go. Pushes of one tree to several hosts share ``payloads``."""
    t0 = time.monotonic()
    manifest = store.manifest(tree)
    sizes = manifest.blobs()
    payloads = payloads or Payloads(store, sizes)
    from tui.remote.agentclient import AgentClient

    agent = AgentClient.over(link)
    answer = agent.code_have(tree=tree, blobs=[[s, n] for s, n in sorted(sizes.items())], timeout=60)
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
        for items, files, content, wire in _pieces(payloads, missing):
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
