"""Code sync, the moving part: a snapshot of a local directory, and shipping it to hosts.

``snapshot`` lists the directory's files (in a git work tree: what git tracks plus untracked
files it does not ignore; elsewhere: everything but what ``.rigdeckignore`` names), checks the
spec's limits from sizes alone (before a byte is read), then reads each file once, hashes it and
keeps its content in the controller's store (``<RIGDECK_HOME>/code``), so what a job runs is what
was there when it was submitted, even if it waits in the queue while the files change.

``push`` ships a snapshot to one host: the host's agent says whether it has the tree and which
contents it lacks; only those are sent (compressed when that pays), as packs of many contents
written over SFTP on the host's SSH connection while the agent takes in the pack before (each
content checked against its hash there); then the host makes the tree. Where SFTP is not there
(a host whose key only runs the agent's attach) the contents go in messages on a connection of
their own to the agent instead, several in flight.
The plain parts (manifest, tree hash, ignore rules, limits) are ``tui.model.codesync``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import posixpath
import queue
import secrets
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

from agent import code as host_code
from agent import filemodes
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
PACK_BYTES = 8 << 20  # a pack closes once this much is in it (a larger content is a pack alone)
PACK_FIRST_BYTES = 1 << 20  # ... the first one at this much, each next one twice the last, up to PACK_BYTES
COMPRESS_BELOW_BPS = 32e6  # packs go compressed to a host whose link is slower (see _LinkRate)
COMPRESS_JUDGE_BYTES = 1 << 20  # a smaller pack's time is mostly round trips: it says nothing
COMPRESS_IDLE_SHARE = 0.2  # ... and only while this process used less of a core than this (see _LinkRate)
KEEP_SNAPSHOTS = 32  # the controller's store keeps the newest snapshots (and their contents)
FRESH_BYTES = 128 << 20  # contents a snapshot just read stay in memory up to this much, for its push
PACK_MIN = 64  # a snapshot reading this many files or more keeps its new contents in one pack
PACK_STALE_S = 3600  # a pack without its index (a snapshot that broke off) goes after this long


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


def list_files(root: Path, follow_links: bool = False,
               where: str | None = None) -> tuple[list[tuple[str, Path, int, bool, os.stat_result]], str]:
    """``(relative path, absolute path, size, executable, stat)`` for each regular file to ship,
    and how the list was made. A symbolic link to a file ships the file's content; one whose
    file lies outside ``root`` (the link itself, or a linked directory on its way) is refused
    before anything is read, unless ``follow_links``: a link to ~/.ssh/id_ed25519 in a project
    would ship the key to every host. ``where`` names the spec field in errors."""
    names = _git_files(root)
    how = "git" if names is not None else IGNORE_FILE
    if names is None:
        names = _walk_files(root)
    where = where or str(root)
    files = []
    outside: list[tuple[str, str]] = []  # (relative path, where it really is)
    real_dirs: dict[str, str] = {}  # a directory of the listing -> its real path
    real_root = os.path.realpath(root)
    for rel in names:
        full = root / rel
        try:
            st = os.lstat(full)
            linked = stat.S_ISLNK(st.st_mode)
            if linked:
                st = full.stat()
        except OSError:
            continue  # tracked but deleted here, or a dangling link: nothing to ship
        if not stat.S_ISREG(st.st_mode):
            continue  # a submodule, a linked directory (never followed) or another non-file
        try:
            check_path(rel)
        except CodeSyncError as e:
            raise CodeSyncError(f"{where}: {e}") from None
        if not follow_links:
            out = _outside(real_root, rel, linked, real_dirs)
            if out is not None:
                outside.append((rel, out))
        files.append((rel, full, st.st_size, bool(st.st_mode & 0o111), st))
    if outside:
        raise CodeSyncError(_links_out_message(where, root, outside))
    return files, how


def _outside(real_root: str, rel: str, linked: bool, real_dirs: dict[str, str]) -> str | None:
    """Where file ``rel`` (under the directory whose real path is ``real_root``) really is, when
    that is outside it; None when inside. Only a link, or a directory on its way whose real path
    is not where the listing says (a link among its directories), needs the file resolved: one
    realpath per directory, so a large tree costs no more than a stat per file."""
    rel_dir = posixpath.dirname(rel)
    real_dir = real_dirs.get(rel_dir)
    if real_dir is None:
        real_dir = real_dirs[rel_dir] = os.path.realpath(os.path.join(real_root, rel_dir))
    if not linked and real_dir == os.path.normpath(os.path.join(real_root, rel_dir)):
        return None
    real = os.path.realpath(os.path.join(real_root, rel))
    return None if real.startswith(real_root.rstrip(os.sep) + os.sep) else real


def _links_out_message(where: str, root: Path, outside: list[tuple[str, str]]) -> str:
    shown = "; ".join(f"{rel} -> {real}" for rel, real in outside[:5])
    more = f" (and {len(outside) - 5} more)" if len(outside) > 5 else ""
    return (f"{where} ({root}): {len(outside)} symbolic link{'s' if len(outside) > 1 else ''} "
            f"lead{'' if len(outside) > 1 else 's'} out of the directory: {shown}{more}. What a link points to "
            f"would be shipped to every host: remove the link, list it in .gitignore (a git work tree) or "
            f"{IGNORE_FILE}, or set [code] follow_links = true to ship it")


# -- the controller's store -------------------------------------------------------------------


class _StorePack:
    """A snapshot's new contents kept as one file of the store, ``packs/<name>.pack`` (the
    contents one after the other), with its index ``packs/<name>.json`` (``{sha256: [offset,
    size]}``): one file made instead of one per content, which on the controller's disk costs
    more than reading and hashing them (bench/sync.py). The pack is renamed into place whole,
    then its index: a content is found only once all of it is there."""

    def __init__(self, root: Path):
        self.dir = root / "packs"
        self.name = f"{time.time_ns():x}-{secrets.token_hex(4)}"
        self.index: dict[str, list[int]] = {}
        self._tmp = self.dir / f"{self.name}.pack.tmp"
        self._f: Any = None
        self._pos = 0

    def add(self, sha: str, data: bytes) -> None:
        if self._f is None:
            filemodes.private_dir(self.dir, "code store")
            self._f = filemodes.open_private(self._tmp)
        self._f.write(data)
        self.index[sha] = [self._pos, len(data)]
        self._pos += len(data)

    def close(self) -> Path | None:
        """Put the pack and its index in place; the pack's path (None when nothing was added)."""
        if self._f is None:
            return None
        self._f.close()
        pack = self.dir / f"{self.name}.pack"
        os.replace(self._tmp, pack)
        tmp = self.dir / f"{self.name}.json.tmp"
        filemodes.write_private(tmp, json.dumps(self.index).encode())
        os.replace(tmp, self.dir / f"{self.name}.json")
        return pack

    def abort(self) -> None:
        if self._f is not None:
            self._f.close()
            self._tmp.unlink(missing_ok=True)


class CodeStore:
    """Contents by hash and manifests by tree, on the controller's machine. A content is a file
    of its own (``objects/ab/abcd...``) or lies in a pack with others (``_StorePack``). It holds
    the code of every job: its directories are 0700 and its files 0600 (``_make_private``)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._lock = threading.RLock()
        self._fresh: dict[str, bytes] = {}  # see fresh()
        self._packed: dict[str, tuple[Path, int, int]] = {}  # sha -> (pack, offset, size)
        self._indexes: set[str] = set()  # the pack indexes read into _packed
        self._make_private()

    def _make_private(self) -> None:
        """Make the store and its directories private (agent.filemodes). A store there before
        with a looser mode was made by an older rigdeck, with the umask's modes: all it holds is
        tightened first, then its root, whose mode says from then on that this was done."""
        try:
            st = os.stat(self.root)
            # someone else's store is left as it is: private_dir below refuses it
            older = st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != filemodes.PRIVATE_DIR
        except FileNotFoundError:
            older = False
        if older:
            for dirpath, dirnames, filenames in os.walk(self.root):
                for name in dirnames:
                    filemodes.private_dir(os.path.join(dirpath, name), "code store")
                for name in filenames:
                    if not os.path.islink(os.path.join(dirpath, name)):
                        filemodes.private_file(os.path.join(dirpath, name))
        filemodes.private_dir(self.root, "code store")

    def object_path(self, sha: str) -> Path:
        return self.root / "objects" / sha[:2] / sha

    def fresh(self, sha: str) -> bytes | None:
        """Content ``sha`` as the latest snapshot read it, if it is still in memory (up to
        FRESH_BYTES of them, each given once): those bytes were hashed to ``sha`` as they were
        read, so the push that follows sends them without reading and hashing its stored copy
        again. None: read the store (``read``, checked by the caller)."""
        with self._lock:
            return self._fresh.pop(sha, None)

    def _load_packs(self) -> None:
        """Read the indexes of packs made since the last look (by this or another process)."""
        try:
            names = [n for n in os.listdir(self.root / "packs") if n.endswith(".json")]
        except FileNotFoundError:
            return
        for name in names:
            if name in self._indexes:
                continue
            pack = self.root / "packs" / (name[:-5] + ".pack")
            try:
                index = json.loads((self.root / "packs" / name).read_text())
            except (OSError, ValueError):
                continue  # pruned meanwhile, or unreadable: its contents count as missing
            with self._lock:
                for sha, (offset, size) in index.items():
                    self._packed.setdefault(sha, (pack, int(offset), int(size)))
                self._indexes.add(name)

    def _where(self, sha: str) -> tuple[Path, int, int] | None:
        """The pack holding ``sha`` (its path, offset, size), None if none does."""
        got = self._packed.get(sha)
        if got is None:
            self._load_packs()
            got = self._packed.get(sha)
        return got

    def _size(self, sha: str) -> int | None:
        try:
            return self.object_path(sha).stat().st_size
        except FileNotFoundError:
            got = self._where(sha)
            return None if got is None or not got[0].is_file() else got[2]

    def has(self, sha: str) -> bool:
        return self._size(sha) is not None

    def read(self, sha: str) -> bytes:
        try:
            return self.object_path(sha).read_bytes()
        except FileNotFoundError:
            got = self._where(sha)
            if got is None:
                raise
        pack, offset, size = got
        with open(pack, "rb") as f:
            f.seek(offset)
            return f.read(size)

    def _keep(self, sha: str, data: bytes, made: set[str] | None = None) -> bool:
        """Store ``data`` as content ``sha`` unless it is there (written whole under a name of
        its own, then renamed: never seen half-written); ``made``: directories known to exist (a
        snapshot's thousands of contents share 256 of them: one mkdir each)."""
        parent = os.path.join(self.root, "objects", sha[:2])
        dest = os.path.join(parent, sha)
        if os.path.isfile(dest):
            return False
        if made is None or parent not in made:
            # objects/ first: made as a parent of objects/ab, it would get the umask's mode
            filemodes.private_dir(os.path.dirname(parent), "code store")
            filemodes.private_dir(parent, "code store")
            if made is not None:
                made.add(parent)
        tmp = f"{dest}.tmp{os.getpid()}.{threading.get_ident()}"
        try:
            filemodes.write_private(tmp, data)
        except BaseException:
            os.unlink(tmp)
            raise
        os.replace(tmp, dest)
        return True

    def save_manifest(self, manifest: Manifest) -> None:
        path = self.root / "manifests" / f"{manifest.tree}.json"
        filemodes.private_dir(path.parent, "code store")
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        filemodes.write_private(tmp, json.dumps(manifest.to_wire()).encode())
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
        self._load_packs()
        return [str(sha) for sha, size in blobs if self._size(str(sha)) != size]

    def put(self, items: list[Any]) -> dict[str, int]:
        """Keep contents sent as a host's agent takes them (``code_put`` items), each checked
        against its hash: a server's store, filled by a workstation. The same layout and checks
        as a host's store, so the same code."""
        if self.root.name != "code":
            raise CodeSyncError(f"a store that takes contents lives in a directory named code, not {self.root}")
        filemodes.private_dir(self.root / "objects", "code store")  # else made with the umask's mode
        try:
            done = host_code.put(str(self.root.parent), items)
        except host_code.CodeError as e:
            raise CodeSyncError(str(e)) from None
        for item in items:  # a host keeps its contents 0444; this store keeps them its owner's
            if item[4]:
                filemodes.private_file(self.object_path(str(item[0])))
        return done

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
            return gone + self._prune_packs(used)

    def _prune_packs(self, used: set[str]) -> int:
        """Remove the packs none of whose contents ``used`` names (a pack some snapshot still
        uses stays whole), and packs a snapshot that broke off left without an index."""
        pdir = self.root / "packs"
        gone = 0
        try:
            names = os.listdir(pdir)
        except FileNotFoundError:
            return 0
        for name in names:
            path = pdir / name
            if name.endswith(".json"):
                try:
                    index = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue
                if any(sha in used for sha in index):
                    continue
                path.unlink(missing_ok=True)
                (pdir / (name[:-5] + ".pack")).unlink(missing_ok=True)
                self._packed.clear()  # read again when next asked: a content may lie in two packs
                self._indexes.clear()
                gone += len(index)
            elif not (pdir / f"{name.split('.')[0]}.json").exists():
                try:
                    if time.time() - path.stat().st_mtime > PACK_STALE_S:
                        path.unlink()
                except OSError:
                    pass
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
            filemodes.private_dir(path.parent, "code store")
            tmp = path.with_name(f"statcache.json.tmp{os.getpid()}.{threading.get_ident()}")
            filemodes.write_private(tmp, json.dumps({"files": merged}).encode())
            os.replace(tmp, path)
        except OSError:
            pass  # only a cache

    def _take(self, files: list[tuple[str, Path, int, bool, os.stat_result]], cache: dict[str, list[Any]],
              where: str) -> tuple[list[FileEntry], dict[str, list[Any]], int, int]:
        """Each file's entry, with what the stat cache will say of it, how many contents were
        new and how many files were read: an unchanged file from the cache, the others read,
        hashed and kept (in one pack when there are PACK_MIN or more to read)."""
        hits: dict[str, str] = {}
        for _rel, full, _size, _exe, st in files:
            hit = cache.get(str(full))
            if hit is not None and hit[:4] == [st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev] and self.has(hit[4]):
                hits[str(full)] = hit[4]  # unchanged since it was last read (see _stat_cache)
        self._load_packs()
        pack = _StorePack(self.root) if len(files) - len(hits) >= PACK_MIN else None
        entries, seen, fresh = [], {}, {}
        new = fresh_bytes = 0
        made: set[str] = set()
        try:
            for rel, full, _size, exe, st in files:
                key = str(full)
                stamp = [st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev]
                sha = hits.get(key, "")
                if sha:
                    size = st.st_size
                else:
                    try:
                        with open(key, "rb") as f:
                            data = f.read()
                    except OSError as e:
                        raise CodeSyncError(f"{where}: cannot read {full}: {e.strerror or e}") from None
                    sha, size = hashlib.sha256(data).hexdigest(), len(data)
                    if (sha in self._packed and self.has(sha)) or (pack is not None and sha in pack.index):
                        pass  # kept already (has(): its pack is still there)
                    elif pack is None:
                        new += self._keep(sha, data, made)
                    elif not self.object_path(sha).is_file():
                        pack.add(sha, data)
                        new += 1
                    if fresh_bytes + size <= FRESH_BYTES:
                        fresh[sha] = data
                        fresh_bytes += size
                    if size != st.st_size:
                        stamp = []  # changed while read: not to be trusted next time
                seen[key] = [*stamp, sha] if stamp else []
                entries.append(FileEntry(rel, sha, size, exe))
            where_packed = pack.close() if pack is not None else None
        except BaseException:
            if pack is not None:
                pack.abort()
            raise
        with self._lock:
            self._fresh = fresh  # the previous snapshot's are dropped: memory stays bounded
            if pack is not None and where_packed is not None:
                self._packed.update({sha: (where_packed, at[0], at[1]) for sha, at in pack.index.items()})
                self._indexes.add(pack.name + ".json")
        return entries, seen, new, len(files) - len(hits)

    def snapshot(self, code: CodeSpec, where: str = "[code] sync") -> tuple[CodeSpec, dict[str, Any]]:
        """Take the snapshot of ``code.sync``: returns the spec with ``tree``/``files``/``size``
        set, and what was done (files, bytes, new contents, how the list was made)."""
        root = Path(code.sync)
        if not root.is_dir():
            raise CodeSyncError(f"{where}: {root} is not a directory")
        files, how = list_files(root, code.follow_links, where)
        check_limits(len(files), sum(f[2] for f in files), code, f"{where} ({root})")
        cache = self._stat_cache()
        started = time.time()
        entries, seen, new, read = self._take(files, cache, where)
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
        self._records: dict[tuple[str, bool], tuple[bytes, int, int]] = {}
        self._warming = False
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

    def warm(self, shas: list[str]) -> None:
        """Encode the records of ``shas`` ahead, in a thread of their own (once per sync): the
        compression (zlib leaves the GIL) then runs beside the uploads instead of between them."""
        with self._lock:
            if self._warming:
                return
            self._warming = True

        def run() -> None:
            for sha in shas:
                try:
                    self.record(sha, compress=True)
                except CodeSyncError:
                    return  # the push that needs it says so

        threading.Thread(target=run, name="code-encode", daemon=True).start()

    def record(self, sha: str, compress: bool = True) -> tuple[bytes, int, int]:
        """``(its record in a pack, content bytes, payload bytes)``: the whole content in one,
        compressed when ``compress`` and it compresses, else as it is."""
        with self._lock:
            lock = self._locks.setdefault(sha, threading.Lock())
        with lock:
            got = self._records.get((sha, compress))
            if got is None:
                data = self._checked(sha)
                payload, enc = data, "raw"
                if compress and _compressible(data):
                    z = zlib.compress(data, 1)
                    if len(z) < len(data) * 0.9:
                        payload, enc = z, "zlib"
                got = self._records[(sha, compress)] = (
                    host_code.pack_record(sha, enc, payload), len(data), len(payload))
            return got

    def _checked(self, sha: str) -> bytes:
        data = self.store.fresh(sha)
        if data is not None and len(data) == self.sizes[sha]:
            return data  # hashed as the snapshot read it (CodeStore.fresh)
        data = self.store.read(sha)
        if len(data) != self.sizes[sha] or hashlib.sha256(data).hexdigest() != sha:
            raise CodeSyncError(f"the controller's stored content {sha[:12]} is damaged ({self.store.root})")
        return data

    def _encode(self, sha: str) -> list[tuple[list[Any], int, int]]:
        data = self._checked(sha)
        compress = _compressible(data)
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


def _compressible(data: bytes) -> bool:
    """Compress only what compresses: a sample of a large content says (random bytes, already
    compressed data and weights are sent as they are)."""
    return len(data) >= COMPRESS_MIN and (
        len(data) <= PROBE_BYTES or len(zlib.compress(data[:PROBE_BYTES], 1)) < PROBE_BYTES * 0.9)


def _packs(payloads: Payloads, missing: list[str],
           compress: Callable[[], bool]) -> Iterator[tuple[bytes, int, int, int]]:
    """Packs of ``missing``: (pack, files in it, content bytes, payload bytes). ``compress()``
    says, as each pack begins, whether its contents go compressed (see ``_LinkRate``)."""
    parts: list[bytes] = [host_code.PACK_MAGIC]
    files = content = wire = 0
    zipped = compress()
    limit = min(PACK_FIRST_BYTES, PACK_BYTES)  # small first: the host starts taking in sooner
    for i, sha in enumerate(missing):
        rec, size, payload = payloads.record(sha, zipped)
        if files and wire + payload > limit:
            yield b"".join(parts), files, content, wire
            parts, files, content, wire = [host_code.PACK_MAGIC], 0, 0, 0
            limit = min(limit * 2, PACK_BYTES)
            if compress() != zipped:
                zipped = not zipped
                if zipped:
                    payloads.warm(missing[i:])
                rec, size, payload = payloads.record(sha, zipped)
        parts.append(rec)
        files += 1
        content += size
        wire += payload
    if files:
        yield b"".join(parts), files, content, wire


class _LinkRate:
    """Whether compressing pays on one host's link, from how fast its packs went: zlib at level
    1 makes about 70 MB/s of text on one core and halves it, so below about COMPRESS_BELOW_BPS
    the link is the slower part and compression saves time; above it (a fast LAN, the test
    bed's links on one machine) it only costs CPU at both ends (measured: bench/sync.py). The
    first pack goes as it is, and says.

    A slow pack counts only when this process was mostly waiting meanwhile (its CPU under
    COMPRESS_IDLE_SHARE of a core): a link that is the limit leaves the sender idle (a few ms
    of CPU per MB sent, about a tenth of a core at 32 MB/s), while a sender short of CPU (the
    other hosts' packs, the snapshot, a machine shared with the hosts as the test bed's is)
    writes slowly on any link, and zlib would only add to its work and the hosts'. Measured
    on the bed: packs at 12-33 MB/s with this process at 0.28-0.79 of a core, and compression
    then cost the whole sync time."""

    def __init__(self) -> None:
        self.slow = False

    def saw(self, nbytes: int, seconds: float, cpu_seconds: float = 0.0) -> None:
        """One pack of ``nbytes`` written in ``seconds``, this process using ``cpu_seconds``
        of CPU (all its threads) meanwhile."""
        if nbytes >= COMPRESS_JUDGE_BYTES:
            seconds = max(seconds, 1e-6)
            self.slow = nbytes / seconds < COMPRESS_BELOW_BPS and cpu_seconds / seconds < COMPRESS_IDLE_SHARE


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


def push(ctl: Any, host: str, store: CodeStore, tree: str,
         progress: Callable[[str, int, int], None] | None = None,
         payloads: Payloads | None = None) -> PushResult:
    """Ship tree ``tree`` (from ``store``) to ``host``. ``ctl`` is the controller: its
    ``agent(host)`` asks and commits, ``file_writer(host)`` writes the packs (``side_link(host)``
    carries the contents where there is no writer). ``progress(host, bytes_done, bytes_total)``
    is called as contents go. Pushes of one tree to several hosts share ``payloads``."""
    t0 = time.monotonic()
    manifest = store.manifest(tree)
    sizes = manifest.blobs()
    payloads = payloads or Payloads(store, sizes)
    agent = ctl.agent(host)
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

    done = {"bytes": 0}

    def result(r: Any) -> None:
        done["bytes"] += int(r.get("bytes", 0)) if isinstance(r, dict) else 0
        if progress:
            progress(host, min(done["bytes"], total), total)

    write = ctl.file_writer(host) if missing and answer.get("incoming") else None
    if write is not None:
        rate = _LinkRate()
        _send_packs(agent, write, str(answer["incoming"]), _packs(payloads, missing, lambda: rate.slow),
                    sent, result, rate)
    elif missing:
        _send_messages(ctl.side_link(host), payloads, missing, sent, result)
    made = agent.code_commit(tree=tree, files=manifest.to_wire(), timeout=300)
    return PushResult(host, made["path"], False, sent["files"], sent["bytes"], sent["wire"],
                      time.monotonic() - t0)


def _send_packs(agent: Any, write: Callable[[bytes, str], None], incoming: str,
                packs: Iterator[tuple[bytes, int, int, int]], sent: dict[str, int],
                on_result: Callable[[Any], None], rate: _LinkRate) -> None:
    """Write each pack into ``incoming`` on the host while the agent takes in the one before:
    at most two packs wait there at a time."""
    ready: queue.Queue[tuple[str, int, int, int] | BaseException | None] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def writer() -> None:
        try:
            for data, files, content, wire in packs:
                if stop.is_set():
                    return
                name = secrets.token_hex(16) + ".pack"
                began, cpu = time.monotonic(), time.process_time()
                write(data, f"{incoming}/{name}")
                rate.saw(len(data), time.monotonic() - began, time.process_time() - cpu)
                ready.put((name, files, content, wire))
            ready.put(None)
        except BaseException as e:  # raised again by the taker below
            ready.put(e)

    thread = threading.Thread(target=writer, name="code-pack", daemon=True)
    thread.start()
    try:
        while (item := ready.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            name, files, content, wire = item
            r = agent.code_unpack(pack=name, timeout=300)
            sent["files"] += files
            sent["bytes"] += content
            sent["wire"] += wire
            on_result(r)
    finally:
        stop.set()
        while thread.is_alive():  # let a writer waiting to hand over a pack see the stop
            try:
                ready.get(timeout=0.1)
            except queue.Empty:
                pass
        thread.join()


def _send_messages(link: Any, payloads: Payloads, missing: list[str], sent: dict[str, int],
                   on_result: Callable[[Any], None]) -> None:
    """The contents in ``code_put`` messages on ``link`` (closed after), several in flight."""

    def calls() -> Iterator[tuple[str, dict[str, Any]]]:
        for items, files, content, wire in _pieces(payloads, missing):
            sent["files"] += files
            sent["bytes"] += content
            sent["wire"] += wire
            yield "code_put", {"blobs": items}

    try:
        link.pipeline(calls(), window=WINDOW, timeout=120, on_result=on_result)
    finally:
        link.close()
