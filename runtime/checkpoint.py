"""Checkpoints written by the ranks the policy names, atomically, with a manifest written last.

Layout of a checkpoint directory (``dir``, or ``dir/<host>/`` under ``per-node``)::

    step-00000120.pt              the state (torch.save), renamed into place after fsync
    step-00000120.manifest.json   step, bytes, sha256, owner, time: written last; marks completion
    latest                        the name of the newest complete checkpoint ("step-00000120")
    .step-00000130.pt.tmp-<pid>   a save in progress (or killed): never read

Under ``all`` every rank writes its own part through ``torch.distributed.checkpoint``
(``dcp.save``/``dcp.load``) into ``step-00000120/rank-<R>/``, where dcp writes ``.metadata`` last
(tmp, fsync, rename) to mark the part complete. The ranks then exchange each part's size and
``.metadata`` sha256 (tensor collectives), and rank 0 writes the manifest (``parts``) and
``latest``. Each rank reloads its own part, so a resume needs the same world size, but no shared
directory: a part may live on its rank's host. (dcp is run per rank, without its own collectives:
those pickle objects through numpy, which a training host's torch may lack.)

Every file is written to a temporary name in the same directory, flushed, fsynced and renamed;
the directory is fsynced after each rename. A checkpoint without its manifest is incomplete and
ignored, so a save killed at any moment leaves the previous good checkpoint in charge.

**Memory snapshots** (``Checkpointer.snapshot``, called every step): the state, in the flat form of
``runtime.flatstate`` (one JSON header and the tensors' bytes in one copy; ``torch.save``'s where
that cannot hold it), goes into a tmpfs directory of the host (``/dev/shm/rigdeck-mem-<uid>/<job id>/``: it
outlives the rank's process, not the host), as ``step-00000121.snap`` (a tmp name, renamed; the
newest ``memory_keep`` kept). One rank per host writes it (local rank 0): under the replicated
policies every rank holds the same state, so each host of the job keeps its own copy and a host
lost with its memory leaves the copies of the others, with nothing sent over the network.
``load_latest`` agrees with every rank on the newest step anyone holds, in memory or on disk, and
the holder broadcasts it: a rank on a spare host resumes from a peer host's memory. Under ``all``
each rank's state is its own: every rank writes its snapshot (``rank-<R>/step-*.snap``) and sends a
copy to the same local rank on the next host (point to point), which keeps it in its host's tmpfs;
a restore takes the newest step every rank's snapshot is held for, and each rank gets its own
from its holder.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import io
import json
import math
import os
import re
import shutil
import sys
import threading
import time
import types
import warnings
import weakref
from typing import Any, Dict, List, Mapping, Optional, Tuple

from runtime import flatstate, metrics
from runtime.cluster import ClusterInfo, ClusterInfoError, check_policy, cluster_info, resolve_owner
from runtime.metrics import METRICS_DIR_ENV, Reporter

MANIFEST_FORMAT = 1
LATEST = "latest"
RESUME_BEFORE_ENV = "RIGDECK_RESUME_BEFORE_STEP"  # set by rigdeck on a restart after a NaN loss
_NAME = re.compile(r"^step-(\d{8,})$")
_MANIFEST = re.compile(r"^(step-\d{8,})\.manifest\.json$")
_DATA = re.compile(r"^(step-\d{8,})(\.pt)?$")
_TMP = re.compile(r"^\.(step-\d{8,}|latest).*\.tmp-(\d+)$")
_SNAP = re.compile(r"^step-(\d{8,})\.snap$")
# what ``snapshot`` calls for its state (a module, callable too, is a state itself)
_STATE_BUILDERS = (types.FunctionType, types.MethodType, types.BuiltinMethodType, functools.partial)
_CHUNK = 32 << 20
_moves_reported: set = set()
MEMORY_DIR_ENV = "RIGDECK_MEMORY_DIR"  # where memory snapshots go (default under /dev/shm)
MEMORY_ROOT = "/dev/shm"
SNAPSHOT_BUDGET = 0.005  # memory snapshots may cost at most this share of the step time (per host)


def _power_of_two_at_least(n: int) -> int:
    return 1 << (n - 1).bit_length()


_WROTE_SNAPSHOTS: set = set()  # the memory directories this process wrote snapshots into
_WRITERS: "weakref.WeakSet[Checkpointer]" = weakref.WeakSet()  # those that saved asynchronously


def wait_for_saves() -> None:
    """Wait for every asynchronous save of this process to be on disk (``runtime.finish()``
    does, before the ranks meet); a failed one is warned about here, not raised."""
    for ckpt in list(_WRITERS):
        try:
            ckpt.wait()
        except Exception as e:
            _warn(str(e))


def drop_memory_snapshots() -> None:
    """Remove the memory snapshot directories this process wrote into (``runtime.finish()`` does,
    once every rank reached the end: nothing will resume from them; the disk checkpoints stay)."""
    for path in sorted(_WROTE_SNAPSHOTS):
        shutil.rmtree(path, ignore_errors=True)
    _WROTE_SNAPSHOTS.clear()


def memory_job_dir(job_id: str, uid: Optional[int] = None, root: str = MEMORY_ROOT) -> str:
    """The tmpfs directory of one rigdeck job's memory snapshots on a host (the agent removes it
    when the job ends there)."""
    return os.path.join(root, f"rigdeck-mem-{os.getuid() if uid is None else uid}", job_id)


def _stage(name: str) -> None:
    """A named point inside a save. Does nothing; tests replace it to kill a save right there."""


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view[:_CHUNK]):]


class _HashingFile:
    """A write-only file for torch.save that hashes what it writes.

    A big buffer is hashed on a second thread while this one writes it and then fsyncs what is
    written so far (hashlib, os.write and os.fsync all release the GIL): hashing costs no extra
    time as long as it is faster than the disk, and the final fsync finds little left to do.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        n = len(view)
        if n >= (8 << 20):
            hasher = threading.Thread(target=self.sha.update, args=(view,), daemon=True)
            hasher.start()
            try:
                start_writeback = _writeback_starter()
                done = 0
                while done < n:
                    wrote = os.write(self.fd, view[done:done + _CHUNK])
                    # Let the disk start on this chunk while the next one is copied in.
                    start_writeback(self.fd, self.size + done, wrote)
                    done += wrote
                os.fsync(self.fd)
            finally:
                hasher.join()
        else:
            self.sha.update(view)
            _write_all(self.fd, view)
        self.size += n
        return n

    def flush(self) -> None:
        pass


_WRITEBACK: List[Any] = []


def _writeback_starter() -> Any:
    """Linux's sync_file_range(..., SYNC_FILE_RANGE_WRITE): start writing a range to disk
    without waiting (what databases do for big files); a no-op where libc lacks it."""
    if not _WRITEBACK:
        starter: Any = lambda fd, offset, length: None  # noqa: E731
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                fn = ctypes.CDLL(None, use_errno=True).sync_file_range
                fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]

                def starter(fd: int, offset: int, length: int) -> None:
                    fn(fd, offset, length, 2)  # SYNC_FILE_RANGE_WRITE; a hint, errors ignored

            except (OSError, AttributeError):
                pass
        _WRITEBACK.append(starter)
    return _WRITEBACK[0]


def _torch_save(state: Any, out: Any) -> None:
    import torch

    target: Any = out  # a file-like object with write() and flush() is all torch.save needs
    try:
        from torch.utils.serialization import config
    except ImportError:  # torch < 2.6: no switch, the zip records carry a CRC32 too
        torch.save(state, target)
        return
    # The manifest's sha256 covers every byte; torch's own CRC32 of each record would be a
    # second pass over the data on this thread.
    with getattr(config, "patch")({"save.compute_crc32": False}):  # noqa: B009 (untyped)
        torch.save(state, target)


def _tmp_name(path: str) -> str:
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}.tmp-{os.getpid()}")


def _atomic_write_text(path: str, text: str) -> None:
    tmp = _tmp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, memoryview(text.encode()))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path) or ".")


def _sha256_file(path: str) -> Tuple[int, str]:
    sha = hashlib.sha256()
    size = 0
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(max(1, min(_CHUNK, os.fstat(f.fileno()).st_size)))
        view = memoryview(buf)
        while True:
            n = f.readinto(buf)
            if not n:
                break
            sha.update(view[:n])
            size += n
    return size, sha.hexdigest()


def _warn(msg: str) -> None:
    print(f"rigdeck checkpoint: {msg}", file=sys.stderr, flush=True)


def _dist() -> Any:
    """torch.distributed when a process group is up, else None (torch only if already loaded)."""
    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist
    return None


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read."""


class Checkpointer:
    """Saves and restores training state under a checkpoint ownership policy.

    ``owner``: ``rank0`` (default), ``host:NAME/gpu:I``, ``per-node`` or ``all``; default
    ``$RIGDECK_CHECKPOINT_OWNER``. ``dir`` defaults to ``$RIGDECK_CHECKPOINT_DIR``. ``keep``: how
    many complete checkpoints to keep (None or 0: all). ``barrier``: after a save, every rank waits
    for the others when a process group is up, so non-owners never run ahead of a save.

    ``memory_dir``: where ``snapshot`` keeps this host's memory snapshots (default
    ``$RIGDECK_MEMORY_DIR``, else ``/dev/shm/rigdeck-mem-<uid>/<job id>``, or ``.../dir-<hash of
    dir>`` outside a rigdeck job); ``memory_keep``: how many it keeps (default 2);
    ``snapshot_budget``: the share of the step time snapshots may cost (default 0.005): a snapshot
    slower than that is taken every N steps instead of every step.

    ``async_save``: a save by a file owner (not under ``all``) serialises the state and returns;
    a thread writes it (fsync, manifest, ``latest``, its ``checkpoint`` events) while training goes
    on. The next save, ``load_latest``, ``wait()`` and ``runtime.finish()`` wait for it; a failed
    write raises its ``CheckpointError`` there.
    """

    def __init__(self, dir: Optional[str] = None, owner: Optional[str] = None, *,
                 keep: Optional[int] = 3, barrier: bool = True,
                 info: Optional[ClusterInfo] = None,
                 environ: Optional[Mapping[str, str]] = None,
                 reporter: Optional[Reporter] = None,
                 memory_dir: Optional[str] = None, memory_keep: int = 2,
                 snapshot_budget: float = SNAPSHOT_BUDGET, async_save: bool = False) -> None:
        env = os.environ if environ is None else environ
        self.info = info if info is not None else cluster_info(environ)
        root = dir or env.get("RIGDECK_CHECKPOINT_DIR")
        if not root:
            raise ValueError("Checkpointer: no directory given and RIGDECK_CHECKPOINT_DIR is unset")
        self.root = os.path.abspath(os.fspath(root))
        self.policy = (owner or env.get("RIGDECK_CHECKPOINT_OWNER") or "rank0").strip()
        check_policy(self.policy, self.info)
        decision = resolve_owner(self.policy, self.info)
        self.is_owner = decision.owner
        self.dir = (os.path.join(self.root, self.info.current_host) if self.policy == "per-node"
                    else self.root)
        self.keep = keep
        self.barrier = barrier
        before = env.get(RESUME_BEFORE_ENV, "")
        self.resume_before = int(before) if before.isdigit() else None
        if reporter is None:
            # This process's own metrics file when the environment is the real one.
            reporter = metrics.reporter() if environ is None else Reporter(
                env.get(METRICS_DIR_ENV), self.info.rank)
        self.reporter = reporter
        self.moved_from = decision.moved_from
        if memory_keep < 1:
            raise ValueError(f"Checkpointer: memory_keep must be at least 1, got {memory_keep}")
        if not 0 < snapshot_budget <= 1:
            raise ValueError(f"Checkpointer: snapshot_budget must be in (0, 1], got {snapshot_budget}")
        mem = memory_dir or env.get(MEMORY_DIR_ENV)
        if not mem:
            mem = memory_job_dir(self.info.job_id
                                 or "dir-" + hashlib.sha256(self.root.encode()).hexdigest()[:16])
        self.memory_dir = os.path.abspath(os.fspath(mem))
        self.memory_keep = memory_keep
        self.snapshot_budget = snapshot_budget
        self.snapshot_every = 1  # steps between snapshots, from the snapshot's cost and the step time
        self._snap_last_call: Optional[float] = None  # the last call: when, and its step
        self._snap_call_step: Optional[int] = None
        self._snap_last_step: Optional[int] = None  # the last snapshot written
        self._snap_cost: Optional[float] = None  # seconds a snapshot takes (smoothed)
        self._snap_wrote_cost = 0.0  # what the last call spent writing one
        self._step_time: Optional[float] = None  # seconds a step takes (smoothed)
        self._snap_off: Optional[str] = None  # why snapshots stopped (a full tmpfs), once warned
        self.restored_from: Optional[Dict[str, Any]] = None  # what load_latest resumed from
        self.async_save = async_save
        self._writer: Optional[threading.Thread] = None  # an asynchronous save still writing
        self._writer_error: Optional[BaseException] = None
        self._snap_failed: Optional[BaseException] = None  # a peer copy refused (under all)
        if decision.moved_from is not None and self.is_owner:
            key = (self.root, self.policy)
            if key not in _moves_reported:
                _moves_reported.add(key)
                self.reporter.event("checkpoint_owner", policy=self.policy,
                                    **{"from": decision.moved_from, "to": self.owner_id},
                                    reason=decision.reason)

    @property
    def owner_id(self) -> Dict[str, Any]:
        """This rank as a checkpoint owner: ``{"rank", "host", "gpu"}``."""
        return {"rank": self.info.rank, "host": self.info.current_host,
                "gpu": self.info.owner_gpu}

    # -- saving ------------------------------------------------------------------------------

    def save(self, step: int, state: Any) -> Optional[str]:
        """Write ``state`` as the checkpoint of ``step`` if this rank owns checkpoints.

        Returns the checkpoint's path on owners, None elsewhere. Reports writing/done/failed to
        the metrics file; a failed save raises ``CheckpointError``. Every rank, owner or not,
        is in a ``checkpoint`` section meanwhile (a non-owner waits in the barrier), so rigdeck
        judges a slow save against saves, not steps.
        """
        with self.reporter.section("checkpoint"):
            if self.policy == "all":
                path: Optional[str] = self._save_dcp(step, state)
            elif self.is_owner and self.async_save:
                path = self._save_file_async(step, state)
            elif self.is_owner:
                path = self._save_file(step, state)
            else:
                path = None
            self._barrier()
        return path

    def _save_file_async(self, step: int, state: Any) -> str:
        """Serialise ``state`` here (its copy: training may change the tensors from now on), then
        write it on a thread of its own; the previous asynchronous save is waited for first."""
        self.wait()
        buf = io.BytesIO()
        try:
            _torch_save(state, buf)
        except Exception as e:
            raise CheckpointError(f"serialising the checkpoint of step {step} failed: {e}") from e
        data = buf.getvalue()
        path = os.path.join(self.dir, _checkpoint_name(step) + ".pt")
        writer = threading.Thread(target=self._write_behind, args=(step, data),
                                  name=f"rigdeck-checkpoint-{step}")
        self._writer = writer
        _WRITERS.add(self)
        writer.start()  # not a daemon: an interpreter's normal exit waits for it
        return path

    def _write_behind(self, step: int, data: bytes) -> None:
        try:
            self._save_file(step, None, data=data)
        except BaseException as e:  # reported by _save_file; raised by the next save or wait()
            self._writer_error = e

    def wait(self) -> None:
        """Wait until an asynchronous save (``async_save``) is on disk; raises the
        ``CheckpointError`` of one that failed. The next save, ``load_latest`` and
        ``runtime.finish()`` wait too."""
        writer = self._writer
        if writer is not None:
            writer.join()
            self._writer = None
        error, self._writer_error = self._writer_error, None
        if error is not None:
            raise error

    def _report(self, status: str, step: int, nbytes: int, seconds: float, path: str,
                error: Optional[str] = None) -> None:
        self.reporter.event("checkpoint", status=status, step=step, bytes=nbytes,
                            seconds=round(seconds, 6), path=path, owner=self.owner_id,
                            error=error)

    def _save_file(self, step: int, state: Any, data: Optional[bytes] = None) -> str:
        """Write the checkpoint of ``step``: ``state`` serialised here, or ``data``, its bytes
        already serialised (an asynchronous save's)."""
        name = _checkpoint_name(step)
        path = os.path.join(self.dir, name + ".pt")
        self._report("writing", step, 0, 0.0, path)
        t0 = time.perf_counter()
        nbytes = 0
        tmp = _tmp_name(path)
        try:
            os.makedirs(self.dir, exist_ok=True)
            self._unpublish(name)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                out = _HashingFile(fd)
                if data is not None:
                    out.write(data)
                else:
                    _torch_save(state, out)
                os.fsync(fd)
            finally:
                os.close(fd)
            nbytes = out.size
            _stage("data-written")
            os.replace(tmp, path)
            _fsync_dir(self.dir)
            _stage("data-renamed")
            self._publish(name, step, os.path.basename(path), nbytes, out.sha.hexdigest(),
                          time.perf_counter() - t0)
        except BaseException as e:
            self._report("failed", step, nbytes, time.perf_counter() - t0, path,
                         f"{type(e).__name__}: {e}")
            try:
                os.remove(tmp)
            except OSError:
                pass  # never created, or already renamed into place
            if isinstance(e, Exception):
                raise CheckpointError(f"saving checkpoint {path} failed: {e}") from e
            raise
        self._report("done", step, nbytes, time.perf_counter() - t0, path)
        self._prune()
        return path

    def _publish(self, name: str, step: int, data: str, nbytes: int, sha256: Optional[str],
                 seconds: float, parts: Optional[Dict[str, Any]] = None) -> None:
        manifest: Dict[str, Any] = {
            "format": MANIFEST_FORMAT, "name": name, "step": step, "data": data,
            "bytes": nbytes, "sha256": sha256, "policy": self.policy, "owner": self.owner_id,
            "job_id": self.info.job_id, "world_size": self.info.world_size,
            "time": time.time(), "seconds": round(seconds, 6),
        }
        if parts is not None:
            manifest["parts"] = parts
        _atomic_write_text(self._manifest_path(name), json.dumps(manifest, indent=1) + "\n")
        _stage("manifest-written")
        _atomic_write_text(os.path.join(self.dir, LATEST), name + "\n")
        _stage("latest-written")

    def _manifest_path(self, name: str) -> str:
        return os.path.join(self.dir, name + ".manifest.json")

    def _unpublish(self, name: str) -> None:
        """Make an existing checkpoint of this name incomplete before it is overwritten."""
        manifest = self._manifest_path(name)
        if not os.path.exists(manifest):
            return
        if self.latest_name() == name:
            others = [c for c in self.complete() if c[1] != name]
            if others:
                _atomic_write_text(os.path.join(self.dir, LATEST), others[-1][1] + "\n")
            else:
                os.remove(os.path.join(self.dir, LATEST))
        os.remove(manifest)
        _fsync_dir(self.dir)

    def _save_dcp(self, step: int, state: Any) -> str:
        import torch.distributed.checkpoint as dcp

        if not isinstance(state, dict):
            raise TypeError("Checkpointer(owner='all') saves a dict state (a dcp state_dict)")
        name = _checkpoint_name(step)
        part = self._part_dir(name)
        dist = _dist()
        primary = self.info.rank == 0
        self._report("writing", step, 0, 0.0, part)
        t0 = time.perf_counter()
        nbytes = 0
        try:
            os.makedirs(self.dir, exist_ok=True)
            if primary:
                self._unpublish(name)
            if dist is not None:
                dist.barrier()  # nobody overwrites a part while it is still published
            stale = os.path.join(part, ".metadata")
            if os.path.exists(stale):
                os.remove(stale)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*torch.distributed is disabled")
                dcp.save(state, checkpoint_id=part, no_dist=True)
            nbytes = _tree_size(part)
            _size, digest = _sha256_file(os.path.join(part, ".metadata"))
            parts = _gather_parts(dist, nbytes, digest)
            doomed: List[str] = []
            if primary:
                self._publish(name, step, name, sum(b for b, _d in parts), None,
                              time.perf_counter() - t0,
                              parts={str(r): {"bytes": b, "sha256": d}
                                     for r, (b, d) in enumerate(parts)})
                doomed = self._prune()
            if dist is not None:
                doomed = json.loads(_broadcast_bytes(
                    dist, json.dumps(doomed).encode() if primary else None, 0).decode())
        except BaseException as e:
            self._report("failed", step, nbytes, time.perf_counter() - t0, part,
                         f"{type(e).__name__}: {e}")
            if isinstance(e, Exception):
                raise CheckpointError(f"saving checkpoint {part} failed: {e}") from e
            raise
        self._report("done", step, nbytes, time.perf_counter() - t0, part)
        for old in doomed:  # every rank deletes its own parts of pruned checkpoints
            try:
                _remove(self._part_dir(old))
                if not os.listdir(os.path.join(self.dir, old)):
                    os.rmdir(os.path.join(self.dir, old))
            except FileNotFoundError:
                pass  # rank 0 removed the whole checkpoint (a shared directory)
            except OSError as e:
                _warn(f"could not remove {self._part_dir(old)}: {e}")
        return part

    def _part_dir(self, name: str) -> str:
        return os.path.join(self.dir, name, f"rank-{self.info.rank}")

    def _barrier(self) -> None:
        dist = _dist() if self.barrier else None
        if dist is not None and dist.get_world_size() > 1:
            dist.barrier()

    # -- memory snapshots --------------------------------------------------------------------

    def snapshot(self, step: int, state: Any, *, every: Optional[int] = None) -> bool:
        """Keep ``state`` as the memory snapshot of ``step`` (completed: call it after the
        optimizer's step), cheaply enough to call every step. Returns True where this call wrote
        one.

        Under the replicated policies (``rank0``, ``host:NAME/gpu:I``, ``per-node``) local rank 0
        of each host writes it into the host's tmpfs (``memory_dir``) and the other ranks return at
        once: no collective, ranks never wait for each other here. Under ``all`` (each rank's state
        its own) every rank writes its own, in ``memory_dir/rank-<R>/``, and sends a copy to the
        same local rank on the next host, which keeps it in its host's tmpfs: every rank calls it
        at the same steps (it is a collective there). A snapshot costing more than
        ``snapshot_budget`` of the step time is taken every N steps (``snapshot_every``, from the
        two measured; agreed by every rank under ``all``, and a power of two under the others, so
        that the hosts' schedules nest) instead, at the first call past each multiple of N;
        ``every`` fixes N. A tmpfs that
        refuses it (full) turns snapshots off with one warning (every rank's under ``all``); disk
        checkpoints go on.

        ``state`` may be a function of no arguments (a ``def``, a lambda, a bound method or a
        ``functools.partial``) that returns the state: it is called only when this call writes a
        snapshot, so the ranks that do not write and the steps in between do not build it (on the
        ddp example ``model.state_dict()`` and ``opt.state_dict()`` take about 0.07 ms a call, on
        every rank, every step: about 0.35% of the test bed's 2 cores, 6 ranks at 16 steps a second).
        """
        if every is not None and (not isinstance(every, int) or every < 1):
            raise ValueError(f"Checkpointer.snapshot: every must be a positive int, got {every!r}")
        _checkpoint_name(step)
        sharded = self.policy == "all"
        now = time.perf_counter()
        last_call, call_step = self._snap_last_call, self._snap_call_step
        wrote_cost, self._snap_wrote_cost = self._snap_wrote_cost, 0.0
        self._snap_last_call, self._snap_call_step = now, step
        if self._snap_off is not None or (not sharded and self.info.local_rank != 0):
            return False
        proposed = every or 1
        if last_call is not None and call_step is not None and self._snap_cost is not None:
            # the time of a step since the last call, that call's own snapshot left out
            per_step = max(1e-6, (now - last_call - wrote_cost) / max(1, step - call_step))
            self._step_time = per_step if self._step_time is None else (
                0.7 * self._step_time + 0.3 * per_step)
            proposed = every or max(1, math.ceil(
                self._snap_cost / (self.snapshot_budget * self._step_time)))
            if not sharded:
                # Each host chooses its own interval: a power of two, counted from step 0, so
                # that the hosts' schedules nest and the gang waits for their snapshots at the
                # steps of the most frequent one only, not at each host's own steps. Lowered only
                # with a margin, so that a few cheap snapshots do not make it flip.
                if every:
                    self.snapshot_every = every
                elif (_power_of_two_at_least(proposed) > self.snapshot_every
                      or _power_of_two_at_least(math.ceil(proposed * 1.5)) < self.snapshot_every):
                    self.snapshot_every = _power_of_two_at_least(proposed)
            last, n = self._snap_last_step, self.snapshot_every
            # Called every step: on the multiples of N only (a host whose N just fell takes its
            # next one on the grid, not at once); called less often: the first call past one.
            if last is not None and last <= step and not (
                    step % n == 0 if step - call_step == 1 else step // n != last // n):
                return False
        t0 = time.perf_counter()
        if isinstance(state, _STATE_BUILDERS):
            state = state()
        parts, _keep = _snapshot_parts((step, state))
        if sharded:
            if not self._snapshot_sharded(step, b"".join(parts), proposed):
                return False
        else:
            try:
                self._write_snapshot(self.memory_dir, step, parts)
            except OSError as e:
                self._snapshots_off(e)
                return False
        cost = time.perf_counter() - t0
        self._snap_cost = cost if self._snap_cost is None else 0.7 * self._snap_cost + 0.3 * cost
        self._snap_wrote_cost = time.perf_counter() - now
        self._snap_last_step = step
        return True

    def _write_snapshot(self, directory: str, step: int, data: Any) -> None:
        """``data``: the snapshot's bytes, or the buffers to write one after the other."""
        path = os.path.join(directory, _checkpoint_name(step) + ".snap")
        tmp = _tmp_name(path)
        try:
            os.makedirs(os.path.dirname(self.memory_dir), mode=0o700, exist_ok=True)
            os.makedirs(directory, mode=0o700, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                for part in [data] if isinstance(data, (bytes, bytearray, memoryview)) else data:
                    _write_all(fd, memoryview(part).cast("B"))
            finally:
                os.close(fd)
            os.replace(tmp, path)  # tmpfs: no fsync; the rename makes it whole or absent
        except OSError:
            try:
                os.remove(tmp)
            except OSError:
                pass
            raise
        _WROTE_SNAPSHOTS.add(self.memory_dir)
        self._prune_snapshots(directory, keep_from=step)

    def _snapshots_off(self, e: BaseException) -> None:
        free = ""
        try:
            st = os.statvfs(os.path.dirname(self.memory_dir))
            free = f", {st.f_bavail * st.f_frsize / 1e6:.1f} MB free"
        except OSError:
            pass
        self._snap_off = f"{self.memory_dir}: {e}{free}"
        _warn(f"memory snapshots off: {self._snap_off}; a restart resumes from disk checkpoints")

    def _peers(self) -> Optional[Tuple[int, int]]:
        """(the rank this one sends its snapshots to, the rank whose copies it keeps): the same
        local rank on the next host and on the one before; None on one host."""
        world, per_host = self.info.world_size, max(1, self.info.local_world_size)
        if world <= per_host or world % per_host:
            return None
        return (self.info.rank + per_host) % world, (self.info.rank - per_host) % world

    def _snapshot_sharded(self, step: int, data: bytes, proposed: int) -> bool:
        """Under ``all``: this rank's own snapshot, then the exchange with its peers; every rank
        agrees first on the next interval and on whether anyone's tmpfs refused one."""
        me = self.info.rank
        problem: Optional[BaseException] = self._snap_failed
        if problem is None:
            try:
                self._write_snapshot(self._rank_dir(me), step, data)
            except OSError as e:
                problem = e
        dist = _dist()
        if dist is not None and dist.get_world_size() > 1:
            anyone, agreed = _reduce_ints(dist, [int(problem is not None), proposed], "max")
        else:
            anyone, agreed = int(problem is not None), proposed
        if anyone:
            self._snapshots_off(problem or OSError("another rank's tmpfs refused its snapshot"))
            return False
        self.snapshot_every = agreed
        peers = self._peers()
        if dist is not None and peers is not None:
            got = _exchange_bytes(dist, data, *peers)
            try:
                self._write_snapshot(self._rank_dir(peers[1]), step, got)
            except OSError as e:
                self._snap_failed = e  # every rank turns them off at the next snapshot
        return True

    def _rank_dir(self, rank: int) -> str:
        return os.path.join(self.memory_dir, f"rank-{rank}")

    def snapshots(self, directory: Optional[str] = None) -> List[Tuple[int, str]]:
        """This host's memory snapshots, oldest first: (step, path); under ``all``, pass
        ``directory`` (``memory_dir/rank-<R>``, rank R's)."""
        directory = directory or (self._rank_dir(self.info.rank) if self.policy == "all"
                                  else self.memory_dir)
        try:
            entries = os.listdir(directory)
        except OSError:
            return []
        out = []
        for entry in entries:
            m = _SNAP.match(entry)
            if m:
                out.append((int(m.group(1)), os.path.join(directory, entry)))
        out.sort()
        return out

    def _prune_snapshots(self, directory: str, keep_from: Optional[int] = None,
                         after: Optional[int] = None, leftovers: bool = True) -> None:
        """Keep the newest ``memory_keep`` snapshots in ``directory``. ``keep_from``: the step
        just written, newer than any kept (those after it are another timeline's, e.g. from before
        a NaN restart); ``after``: remove those after this step (the step a restart resumed
        from)."""
        try:
            snaps = self.snapshots(directory)
            doomed = [p for s, p in snaps if (keep_from is not None and s > keep_from)
                      or (after is not None and s > after)]
            live = [p for s, p in snaps if p not in doomed]
            doomed += live[:-self.memory_keep]
            for entry in os.listdir(directory) if leftovers else ():
                t = _TMP.match(entry)
                if t and int(t.group(2)) != os.getpid():  # its one writer's, dead
                    doomed.append(os.path.join(directory, entry))
            for path in doomed:
                try:
                    _remove(path)
                except FileNotFoundError:
                    pass
        except FileNotFoundError:
            pass
        except OSError as e:
            _warn(f"could not prune memory snapshots in {directory}: {e}")

    def _memory_newest(self) -> Optional[Tuple[int, str]]:
        for step, path in reversed(self.snapshots()):
            if self.resume_before is None or step < self.resume_before:
                return step, path
        return None

    def _disk_newest(self) -> Optional[int]:
        resumable = self.resumable()
        return resumable[-1][0] if resumable else None

    # -- reading -----------------------------------------------------------------------------

    def latest_name(self) -> Optional[str]:
        """The checkpoint ``latest`` names, or None."""
        try:
            with open(os.path.join(self.dir, LATEST), encoding="utf-8") as f:
                name = f.read().strip()
        except FileNotFoundError:
            return None
        return name if _NAME.match(name) else None

    def complete(self) -> List[Tuple[int, str, Dict[str, Any]]]:
        """Complete checkpoints (those with a manifest), oldest first: (step, name, manifest)."""
        out = []
        try:
            entries = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        for entry in entries:
            m = _MANIFEST.match(entry)
            if not m:
                continue
            try:
                with open(os.path.join(self.dir, entry), encoding="utf-8") as f:
                    manifest = json.load(f)
                step = int(manifest["step"])
            except (OSError, ValueError, KeyError, TypeError) as e:
                _warn(f"ignoring unreadable manifest {os.path.join(self.dir, entry)}: {e}")
                continue
            out.append((step, m.group(1), manifest))
        out.sort(key=lambda c: (c[0], c[1]))
        return out

    def _verify(self, name: str, manifest: Mapping[str, Any]) -> Optional[str]:
        """None when the checkpoint's bytes match its manifest, else what is wrong."""
        data = os.path.join(self.dir, str(manifest.get("data", name + ".pt")))
        if not os.path.exists(data):
            return f"{data} is missing"
        size, digest = _sha256_file(data)
        if size != manifest.get("bytes"):
            return f"{data} has {size} bytes, manifest says {manifest.get('bytes')}"
        if digest != manifest.get("sha256"):
            return f"{data} sha256 {digest} does not match the manifest's {manifest.get('sha256')}"
        return None

    def _verify_part(self, name: str, expected: Mapping[str, Any]) -> Optional[str]:
        """None when this rank's part of an ``all`` checkpoint matches its manifest entry."""
        part = self._part_dir(name)
        meta = os.path.join(part, ".metadata")
        if not os.path.exists(meta):
            return f"{meta} is missing"
        size = _tree_size(part)
        if size != expected.get("bytes"):
            return f"{part} has {size} bytes, manifest says {expected.get('bytes')}"
        _n, digest = _sha256_file(meta)
        if digest != expected.get("sha256"):
            return f"{meta} sha256 {digest} does not match the manifest's {expected.get('sha256')}"
        return None

    def resumable(self) -> List[Tuple[int, str, Dict[str, Any]]]:
        """The complete checkpoints a restart may resume from, oldest first: all of them, or, when
        rigdeck restarted the job because its loss went NaN at step N (``RIGDECK_RESUME_BEFORE_STEP``),
        those saved before step N (a checkpoint saved after the loss went bad holds bad weights)."""
        if self.resume_before is None:
            return self.complete()
        return [c for c in self.complete() if c[0] < self.resume_before]

    def load_latest(self, map_location: Any = "cpu", *, weights_only: bool = True,
                    state: Optional[Dict[str, Any]] = None,
                    broadcast: Optional[bool] = None) -> Optional[Tuple[int, Any]]:
        """(step, state) of the newest step held: a memory snapshot (``snapshot``) of any host of
        the job, or the newest complete checkpoint whose bytes match its manifest; None if neither.
        A memory snapshot wins a tie. After a NaN restart (``RIGDECK_RESUME_BEFORE_STEP``) both
        only count before the first bad step.

        With a process group up (and ``broadcast`` not False) the ranks agree on the newest step
        any of them holds, and its holder (the lowest rank) sends it to every rank, so ranks on
        hosts without it (a spare replacing a lost host) resume from the same step. Without one,
        this host's memory snapshot and the checkpoint directory are read here.
        ``restored_from`` then says what it was: ``{"step", "source": "memory"|"disk", "rank",
        "host"}``. Under ``all``, ``state`` is the state_dict to load into (in place); every rank
        reads its disk part, or, where every rank's snapshot of a step at least as new is held on
        some host, each gets its own from its holder.
        """
        self.wait()
        if self.policy == "all":
            return self._load_dcp(state)
        dist = _dist()
        if broadcast is None:
            broadcast = dist is not None and dist.get_world_size() > 1
        mem = self._memory_newest()
        if not broadcast or dist is None:
            return self._restored(self._load_here(map_location, weights_only, mem))
        # Every rank offers what it holds: its host's newest memory snapshot, and an owner its
        # newest disk checkpoint. The newest step wins, memory before disk, then the lowest rank,
        # which reads it and broadcasts the bytes.
        me, world = dist.get_rank(), dist.get_world_size()
        disk = self._disk_newest() if self.is_owner or me == 0 else None
        mine = max(-1, -1 if mem is None else mem[0],
                   -1 if disk is None or not self.is_owner else disk)
        # [newest offered, whether any rank owns checkpoints, rank 0's own disk step]: with no
        # owner in the group, rank 0 reads the directory (as before memory snapshots)
        best, owned, first = _reduce_ints(dist, [mine, int(self.is_owner),
                                                 -1 if disk is None or me != 0 else disk], "max")
        if not owned:
            best = max(best, first)
        elif not self.is_owner:
            disk = None
        if best < 0:
            return self._restored(None)
        offer = me if mem is not None and mem[0] == best else (
            world + me if disk == best else 2 * world)
        chosen = _reduce_int(dist, offer, "min")
        if chosen >= 2 * world:  # (cannot happen: the newest step is someone's offer)
            return self._restored(None)
        src = chosen % world
        payload: Optional[bytes] = None
        header: Optional[bytes] = None
        if me == src:
            source = "memory" if chosen < world else "disk"
            data: Optional[bytes] = None
            if mem is not None and source == "memory":
                data = self._read_snapshot(mem[1])
            if data is None:
                source = "disk"
                result = self._load_local("cpu", weights_only)
                data = b"" if result is None else _dumps(result)
            payload = data
            header = json.dumps({"source": source, "rank": me,
                                 "host": self.info.current_host}).encode()
        where = json.loads(_broadcast_bytes(dist, header, src).decode())
        data = _broadcast_bytes(dist, payload, src)
        if not data:
            return self._restored(None)
        return self._restored(_loads(data, map_location, weights_only), where)

    def _read_snapshot(self, path: str) -> Optional[bytes]:
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            _warn(f"could not read memory snapshot {path}: {e}")
            return None

    def _load_here(self, map_location: Any, weights_only: bool,
                   mem: Optional[Tuple[int, str]]) -> Optional[Tuple[Tuple[int, Any], Dict[str, Any]]]:
        """The newest of this host's memory snapshot and the disk checkpoints, read here."""
        here = {"rank": self.info.rank, "host": self.info.current_host}
        disk = self._disk_newest()
        if mem is not None and (disk is None or mem[0] >= disk):
            data = self._read_snapshot(mem[1])
            if data is not None:
                return _loads(data, map_location, weights_only), {"source": "memory", **here}
        result = self._load_local(map_location, weights_only)
        if result is None:
            return None
        return result, {"source": "disk", **here}

    def _restored(self, got: Any, where: Optional[Dict[str, Any]] = None) -> Optional[Tuple[int, Any]]:
        """Note what a restore resumed from (``restored_from``), drop this host's snapshots of
        steps after it (another timeline's), and return (step, state) or None."""
        if got is not None and where is None:
            got, where = got
        if got is None:
            self.restored_from = None
            return None
        step = int(got[0])
        self.restored_from = {"step": step, **(where or {})}
        if self.info.local_rank == 0:
            self._prune_after(step)
        if self.info.rank == 0 and where is not None:
            on = f" on {where['host']}" if where.get("host") else ""
            _warn(f"resuming from step {step}: {where.get('source')} of rank {where.get('rank')}{on}")
        return step, got[1]

    def _prune_after(self, step: int) -> None:
        """This host's snapshots of steps after ``step`` go (every rank's, under ``all``)."""
        dirs = [self.memory_dir]
        if self.policy == "all":
            try:
                dirs = [os.path.join(self.memory_dir, e) for e in os.listdir(self.memory_dir)
                        if e.startswith("rank-")]
            except OSError:
                dirs = []
        for d in dirs:  # (another local rank may be writing what it received: its tmp stays)
            self._prune_snapshots(d, after=step, leftovers=False)

    def _sharded_memory(self, dist: Any) -> Optional[Tuple[int, List[int]]]:
        """Under ``all``: the newest step for which every rank's snapshot is held on some host,
        and for each rank the rank that holds it (itself first, else the lowest); None if there is
        none. Every rank says what its host holds (an all_gather)."""
        world = dist.get_world_size() if dist is not None else 1
        depth = 4  # the newest snapshots of each rank a host offers
        held = [-1] * (world * depth)
        for t in range(world):
            steps = [s for s, _p in self.snapshots(self._rank_dir(t))
                     if self.resume_before is None or s < self.resume_before][-depth:]
            held[t * depth:t * depth + len(steps)] = steps
        every = _gather_ints(dist, held) if dist is not None else [held]
        common: Optional[set] = None
        for t in range(world):
            found = {s for h in range(world) for s in every[h][t * depth:(t + 1) * depth] if s >= 0}
            common = found if common is None else common & found
        if not common:
            return None
        best = max(common)
        holders = []
        for t in range(world):
            have = [h for h in range(world) if best in every[h][t * depth:(t + 1) * depth]]
            holders.append(t if t in have else min(have))
        return best, holders

    def _load_sharded_memory(self, dist: Any, step: int, holders: List[int],
                             state: Dict[str, Any]) -> Tuple[int, Any]:
        """Every rank's snapshot of ``step`` to its rank (sent by its holder where that is another
        rank), loaded into ``state`` in place; a snapshot received is kept on this host too."""
        me = self.info.rank if dist is None else dist.get_rank()
        name = _checkpoint_name(step) + ".snap"
        sends = {t: self._read_snapshot(os.path.join(self._rank_dir(t), name)) or b""
                 for t, h in enumerate(holders) if h == me and t != me}
        data: Optional[bytes] = None
        if holders[me] == me:
            data = self._read_snapshot(os.path.join(self._rank_dir(me), name))
        if dist is not None:
            got = _transfer_bytes(dist, holders, sends)
            if got is not None:
                data = got
                try:
                    self._write_snapshot(self._rank_dir(me), step, got)
                except OSError as e:
                    _warn(f"could not keep the snapshot received in {self._rank_dir(me)}: {e}")
        if not data:
            raise CheckpointError(f"the memory snapshot of step {step} for rank {me} could not be read "
                                  f"(from rank {holders[me]})")
        loaded_step, loaded = _loads(data, "cpu", True)
        _copy_into(state, loaded)
        return int(loaded_step), state

    def _load_local(self, map_location: Any, weights_only: bool) -> Optional[Tuple[int, Any]]:
        import torch

        for step, name, manifest in reversed(self.resumable()):
            problem = self._verify(name, manifest)
            if problem is not None:
                _warn(f"skipping checkpoint {name}: {problem}")
                continue
            path = os.path.join(self.dir, str(manifest.get("data", name + ".pt")))
            return step, torch.load(path, map_location=map_location, weights_only=weights_only)
        return None

    def _load_dcp(self, state: Optional[Dict[str, Any]]) -> Optional[Tuple[int, Any]]:
        import torch.distributed.checkpoint as dcp

        if state is None:
            raise TypeError("Checkpointer(owner='all').load_latest needs state= (loaded in place)")
        dist = _dist()
        world = self.info.world_size
        candidates: List[Any] = []
        if self.info.rank == 0:
            # Newest first; only checkpoints of this world size (each rank reloads its own part).
            candidates = [[step, name, manifest["parts"]]
                          for step, name, manifest in reversed(self.resumable())
                          if isinstance(manifest.get("parts"), dict)
                          and len(manifest["parts"]) == world]
        if dist is not None:
            candidates = json.loads(_broadcast_bytes(
                dist, json.dumps(candidates).encode() if self.info.rank == 0 else None,
                0).decode())
        mem = self._sharded_memory(dist)
        if mem is not None and (not candidates or mem[0] >= candidates[0][0]):
            step, loaded = self._load_sharded_memory(dist, mem[0], mem[1], state)
            me = self.info.rank if dist is None else dist.get_rank()
            return self._restored((step, loaded), {"source": "memory", "rank": mem[1][me],
                                                   "host": self.info.current_host
                                                   if mem[1][me] == me else None})
        for step, name, parts in candidates:
            problem = self._verify_part(name, parts.get(str(self.info.rank), {}))
            if problem is not None:
                _warn(f"skipping checkpoint {name}: {problem}")
            if not _all_ranks_agree(dist, problem is None):
                continue
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*torch.distributed is disabled")
                dcp.load(state, checkpoint_id=self._part_dir(name), no_dist=True)
            return self._restored((step, state), {"source": "disk", "rank": self.info.rank,
                                                  "host": self.info.current_host})
        return self._restored(None)

    # -- retention ---------------------------------------------------------------------------

    def _prune(self) -> List[str]:
        """Delete complete checkpoints beyond ``keep`` (manifest first), and leftovers of killed
        saves older than the newest complete one; returns the names deleted. Problems are warned
        about, not raised: the checkpoint just written is good."""
        gone: List[str] = []
        try:
            complete = self.complete()
            if not complete:
                return gone
            doomed = complete[:-self.keep] if self.keep and len(complete) > self.keep else []
            for _step, name, manifest in doomed:
                os.remove(self._manifest_path(name))
                _remove(os.path.join(self.dir, str(manifest.get("data", name + ".pt"))))
                gone.append(name)
            newest = complete[-1][0]
            kept = {name for _s, name, _m in complete}
            for entry in os.listdir(self.dir):
                m = _DATA.match(entry)
                if m and m.group(1) not in kept and _step_of(m.group(1)) < newest:
                    _remove(os.path.join(self.dir, entry))
                    gone.append(m.group(1))
                t = _TMP.match(entry)
                if t and int(t.group(2)) != os.getpid():
                    _remove(os.path.join(self.dir, entry))
        except OSError as e:
            _warn(f"could not prune old checkpoints in {self.dir}: {e}")
        return gone


def _tree_size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(root, f))
               for root, _dirs, files in os.walk(path) for f in files)


def _gather_parts(dist: Any, nbytes: int, digest: str) -> List[Tuple[int, str]]:
    """Every rank's (bytes, sha256 of its .metadata), in rank order, through tensors only."""
    if dist is None:
        return [(nbytes, digest)]
    import torch

    device = _device(dist)
    mine = torch.tensor([nbytes] + list(bytes.fromhex(digest)), dtype=torch.long, device=device)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    _wait_collective(dist.all_gather(every, mine, async_op=True))
    out = []
    for t in every:
        values = t.cpu().tolist()
        out.append((int(values[0]), bytes(values[1:]).hex()))
    return out


def _all_ranks_agree(dist: Any, ok: bool) -> bool:
    if dist is None:
        return ok
    import torch

    t = torch.tensor([1 if ok else 0], dtype=torch.long, device=_device(dist))
    _wait_collective(dist.all_reduce(t, op=dist.ReduceOp.MIN, async_op=True))
    return bool(t.item())


# The handles of finished collectives stay referenced from here for a while. gloo's worker
# thread drops its own reference to a finished collective a moment after the caller has moved
# on; if that is the last one, it releases the collective's tensors there, which needs the GIL,
# and during interpreter shutdown (a script ending right after a restore) that kills the thread
# and aborts the process ("terminate called without an active exception"). Holding the handle
# makes this thread the one that lets go, later, under the GIL.
_RETAINED: "collections.deque[Any]" = collections.deque(maxlen=32)


def _wait_collective(work: Any) -> None:
    work.wait()
    _RETAINED.append(work)


def _gather_ints(dist: Any, values: List[int]) -> List[List[int]]:
    """Every rank's ``values`` (the same length everywhere), in rank order."""
    import torch

    mine = torch.tensor(values, dtype=torch.long, device=_device(dist))
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    _wait_collective(dist.all_gather(every, mine, async_op=True))
    return [[int(v) for v in t.cpu().tolist()] for t in every]


def _bytes_of(t: Any, n: int) -> bytes:
    import ctypes

    host = t.cpu().contiguous()
    return ctypes.string_at(host.data_ptr(), n)


def _exchange_bytes(dist: Any, data: bytes, to: int, frm: int) -> bytes:
    """Send ``data`` to rank ``to`` while receiving what rank ``frm`` sends (point to point)."""
    import torch

    device = _device(dist)
    size_out = torch.tensor([len(data)], dtype=torch.long, device=device)
    size_in = torch.empty(1, dtype=torch.long, device=device)
    for work in [dist.isend(size_out, to), dist.irecv(size_in, frm)]:
        _wait_collective(work)
    n = int(size_in.item())
    out = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    inp = torch.empty(max(n, 1), dtype=torch.uint8, device=device)
    for work in [dist.isend(out, to), dist.irecv(inp, frm)]:
        _wait_collective(work)
    return _bytes_of(inp, n)


def _transfer_bytes(dist: Any, holders: List[int], sends: Dict[int, bytes]) -> Optional[bytes]:
    """Each rank t whose holder h is another rank receives from h what h has in ``sends[t]``;
    returns what this rank received (None if it holds its own)."""
    import torch

    device = _device(dist)
    me = dist.get_rank()
    pairs = [(t, h) for t, h in enumerate(holders) if h != t]
    sizes_out = {t: torch.tensor([len(sends.get(t, b""))], dtype=torch.long, device=device)
                 for t, h in pairs if h == me}
    size_in = torch.zeros(1, dtype=torch.long, device=device)
    works = [dist.isend(sizes_out[t], t) for t, h in pairs if h == me]
    if holders[me] != me:
        works.append(dist.irecv(size_in, holders[me]))
    for work in works:
        _wait_collective(work)
    n = int(size_in.item())
    outs = {t: torch.frombuffer(bytearray(sends[t]), dtype=torch.uint8).to(device)
            for t, h in pairs if h == me and sends.get(t)}
    inp = torch.empty(max(n, 1), dtype=torch.uint8, device=device)
    works = [dist.isend(outs[t], t) for t in outs]
    if holders[me] != me and n:
        works.append(dist.irecv(inp, holders[me]))
    for work in works:
        _wait_collective(work)
    return None if holders[me] == me else _bytes_of(inp, n)


def _copy_into(dst: Any, src: Any) -> Any:
    """``src``'s values in ``dst``, in place where both are tensors of one shape (or dicts)."""
    import torch

    if isinstance(dst, dict) and isinstance(src, dict):
        for key, value in src.items():
            dst[key] = _copy_into(dst[key], value) if key in dst else value
        return dst
    if isinstance(dst, torch.Tensor) and isinstance(src, torch.Tensor) and dst.shape == src.shape:
        with torch.no_grad():
            dst.copy_(src)
        return dst
    return src


def _reduce_ints(dist: Any, values: List[int], op: str) -> List[int]:
    """``values`` reduced element by element over every rank ("max" or "min"), in one tensor."""
    import torch

    t = torch.tensor(values, dtype=torch.long, device=_device(dist))
    _wait_collective(dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.MIN,
                          async_op=True))
    return [int(v) for v in t.cpu().tolist()]


def _reduce_int(dist: Any, value: int, op: str) -> int:
    """``value`` reduced over every rank ("max" or "min"), through a tensor."""
    return _reduce_ints(dist, [value], op)[0]


def _device(dist: Any) -> Any:
    import torch

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _broadcast_bytes(dist: Any, payload: Optional[bytes], src: int) -> bytes:
    """``payload`` from rank ``src`` to every rank, through tensors only (the ``*_object``
    collectives need numpy, which a training host may lack)."""
    import ctypes

    import torch

    device = _device(dist)
    size = torch.tensor([len(payload or b"")], dtype=torch.long, device=device)
    _wait_collective(dist.broadcast(size, src=src, async_op=True))
    n = int(size.item())
    if n == 0:
        return b""
    if payload is not None:
        buf = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
    else:
        buf = torch.empty(n, dtype=torch.uint8, device=device)
    _wait_collective(dist.broadcast(buf, src=src, async_op=True))
    host = buf.cpu().contiguous()
    data = ctypes.string_at(host.data_ptr(), n)
    buf.set_(torch.UntypedStorage(0, device=device))  # the kept handle need not keep the bytes
    return data


def _snapshot_parts(obj: Any) -> Tuple[List[Any], List[Any]]:
    """``obj`` as a memory snapshot: (the buffers to write in order, what must stay alive until
    they are written). The flat form (``runtime.flatstate``: one JSON header, the tensors' bytes
    in one copy) where it holds ``obj`` exactly, else ``torch.save``'s (without CRC32: a second
    pass over the bytes)."""
    flat = flatstate.encode(obj)
    if flat is not None:
        return flat
    buf = io.BytesIO()
    _torch_save(obj, buf)
    return [buf.getvalue()], []


def _dumps(obj: Any) -> bytes:
    """``obj`` as bytes that ``_loads`` reads back (the flat form where it can)."""
    parts, _keep = _snapshot_parts(obj)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _loads(data: bytes, map_location: Any, weights_only: bool) -> Any:
    """What ``_dumps`` or a snapshot wrote: the flat form (which runs no pickle), else
    ``torch.load``'s."""
    import torch

    if flatstate.is_flat(data):
        try:
            return flatstate.decode(data, map_location)
        except flatstate.FormatError as e:
            raise CheckpointError(f"memory snapshot: {e}") from None
    return torch.load(io.BytesIO(data), map_location=map_location, weights_only=weights_only)


def _checkpoint_name(step: int) -> str:
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"checkpoint step must be a non-negative int, got {step!r}")
    return f"step-{step:08d}"


def _step_of(name: str) -> int:
    return int(name.split("-", 1)[1])


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


__all__ = ["Checkpointer", "CheckpointError", "ClusterInfoError", "memory_job_dir"]
