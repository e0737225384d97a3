"""Artifacts between hosts with no shared storage: fetch from the hosts that made them, put on
the hosts that need them, each content checked by its SHA-256.

A finished step's hosts each pack their part (``AgentFleet.artifact_pack``); ``merge``
(``tui.model.artifacts``) makes them one artifact. ``stage`` makes that artifact's tree on
other hosts: each host says which contents it lacks (``code_have``); each lacking content is
fetched ONCE, in pieces, from a host that holds it (``code_get`` over a side link of that host)
and each piece is passed on, as it comes, to every host that lacks it (``code_put``, pipelined
on a side link of each); the receiving agent appends the pieces and keeps the content only when
its bytes hash to its name; then ``code_commit`` makes the tree. No host opens a port: bytes go
host -> controller -> host over the agents' SSH streams, never more than a few pieces per host
held in memory. A host that has the tree gets nothing.
"""

from __future__ import annotations

import base64
import hashlib
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from agent.artifacts import MAX_GET_BYTES
from tui.model.artifacts import ArtifactError, check_artifact, merge
from tui.remote.agentclient import AgentClient
from tui.remote.codesync import MESSAGE_RAW_BYTES, WINDOW

__all__ = ["ArtifactError", "StageResult", "merge", "stage"]

PIECE_BYTES = MAX_GET_BYTES  # one code_get answer (its base64 stays under the 1 MiB message line)
# code_get answers in flight per source: WINDOW (4) of them, ~2.7 MB of base64, stay under the
# agent's 4 MiB write buffer (a client with more unread is dropped: 16 in flight were).
QUEUE_PIECES = 8  # pieces waiting for one destination: what bounds the controller's memory
_END = object()


@dataclass(frozen=True)
class StageResult:
    host: str
    path: str  # the artifact's tree on the host (a channel's dir, a seed checkpoint)
    files_sent: int  # contents sent to it
    bytes_sent: int  # their bytes
    seconds: float
    had_tree: bool  # it had the tree: nothing was sent

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "path": self.path, "files_sent": self.files_sent,
                "bytes_sent": self.bytes_sent, "seconds": round(self.seconds, 3), "had_tree": self.had_tree}


@dataclass
class _Dest:
    host: str
    link: Any
    missing: list[str]
    total: int
    q: queue.Queue[Any] = field(default_factory=lambda: queue.Queue(maxsize=QUEUE_PIECES))
    error: str | None = None
    ended: bool = False  # its sender has taken the end mark
    files_sent: int = 0
    bytes_sent: int = 0

    def fail(self, why: str) -> None:
        if self.error is None:
            self.error = why

    def deliver(self, item: list[Any], raw: int) -> None:
        """Queue one piece (a ``code_put`` blob) of ``raw`` bytes for this host's sender."""
        self.q.put((item, raw))


@dataclass
class _Staging:
    """One ``stage`` call's artifact and shared bookkeeping, passed between its steps (asking
    the hosts, planning the sources, the senders and the fetchers)."""

    ctl: Any
    tree: str
    wire: list[list[Any]]  # the manifest code_commit takes
    sizes: dict[str, int]  # content -> its size
    names: dict[str, str]  # content -> the first path that holds it (for errors)
    sources: dict[str, Any]  # host -> the contents it holds, as the artifact says
    progress: Callable[[str, int, int], None] | None
    timeout: float
    t0: float
    needers: dict[str, list[_Dest]] = field(default_factory=dict)  # content -> hosts that lack it
    errors: dict[str, str] = field(default_factory=dict)  # content -> why its source failed it
    lock: threading.Lock = field(default_factory=threading.Lock)

    def source_error(self, src: str, s: str, why: str) -> None:
        """Content ``s`` cannot come from ``src``: every host that needs it fails (the first
        reason stays)."""
        with self.lock:
            self.errors.setdefault(s, f"{self.names[s]} ({s[:12]}) from {src}: {why}")
            msg = self.errors[s]
        for d in self.needers.get(s, []):
            d.fail(f"{d.host}: {msg}")


def stage(ctl: Any, artifact: dict[str, Any], hosts: list[str],
          progress: Callable[[str, int, int], None] | None = None,
          timeout: float = 120.0) -> dict[str, StageResult | Exception]:
    """Make ``artifact``'s tree (``merge``'s answer) on every host of ``hosts``, in parallel:
    host -> ``StageResult``, or the Exception that kept that host from it (the others go on).
    ``ctl`` gives ``side_link(host)`` (the controller); ``progress(host, done_bytes,
    total_bytes)`` is called as contents land; ``timeout`` is the seconds any one answer may
    take."""
    entries, sources = check_artifact(artifact)
    sizes = {e.sha256: e.size for e in entries}
    names: dict[str, str] = {}
    for e in entries:
        names.setdefault(e.sha256, e.path)
    wire = [[e.path, e.sha256, e.size, e.executable] for e in entries]
    run = _Staging(ctl=ctl, tree=str(artifact["tree"]), wire=wire, sizes=sizes, names=names, sources=sources,
                   progress=progress, timeout=timeout, t0=time.monotonic())
    results: dict[str, StageResult | Exception] = {}
    hosts = list(dict.fromkeys(hosts))
    if not hosts:
        return results
    dests = _ask(run, hosts, results)
    if not dests:
        return results
    by_source, empty = _plan(run, dests)
    with ThreadPoolExecutor(max_workers=len(dests) + len(by_source), thread_name_prefix="stage") as pool:
        sending = {h: pool.submit(_send, run, d) for h, d in dests.items()}
        for s in empty:
            for d in run.needers[s]:
                d.deliver([s, "raw", "", 0, True], 0)
        fetching = [pool.submit(_Fetch(run, src, shas).fetch) for src, shas in by_source.items()]
        for f in fetching:
            f.result()
        for d in dests.values():
            d.q.put(_END)
        for h, sent in sending.items():
            results[h] = sent.result()
    return {h: results[h] for h in hosts}


def _ask(run: _Staging, hosts: list[str], results: dict[str, StageResult | Exception]) -> dict[str, _Dest]:
    """Ask every host, in parallel, what it lacks (``code_have``). A host that has the tree, or
    cannot be asked, gets its result now; the others are the destinations, their side links
    kept open for the contents."""
    tree, sizes, progress = run.tree, run.sizes, run.progress
    blobs = [[s, n] for s, n in sorted(sizes.items())]

    def ask(h: str) -> tuple[Any, dict[str, Any]]:
        link = run.ctl.side_link(h)
        try:
            return link, AgentClient.over(link).code_have(tree=tree, blobs=blobs, timeout=run.timeout)
        except BaseException:
            link.close()
            raise

    dests: dict[str, _Dest] = {}
    with ThreadPoolExecutor(max_workers=min(32, len(hosts)), thread_name_prefix="stage-ask") as pool:
        asked = {h: pool.submit(ask, h) for h in hosts}
    for h, fut in asked.items():
        try:
            link, ans = fut.result()
        except Exception as e:
            results[h] = ArtifactError(f"{h}: cannot stage artifact {tree[:12]}: {e}")
            continue
        if ans.get("path"):
            link.close()
            results[h] = StageResult(h, str(ans["path"]), 0, 0, time.monotonic() - run.t0, True)
            if progress:
                progress(h, 0, 0)
            continue
        missing = sorted({str(s) for s in ans.get("missing") or [] if s in sizes})
        dests[h] = _Dest(h, link, missing, sum(sizes[s] for s in missing))
    return dests


def _plan(run: _Staging, dests: dict[str, _Dest]) -> tuple[dict[str, list[str]], list[str]]:
    """Which destinations need each content (``run.needers``), and where each comes from: once,
    from the first holder that still has it, whoever needs it. Empty contents have nothing to
    read: they come back apart (their one, empty, piece is known)."""
    for d in dests.values():
        for s in d.missing:
            run.needers.setdefault(s, []).append(d)
    by_source: dict[str, list[str]] = {}
    empty = []
    for s in sorted(run.needers):
        if run.sizes[s] == 0:
            empty.append(s)
            continue
        holders = [h for h in run.sources if s in set(run.sources[h])]
        # A holder that says it lacks the content (pruned since it was packed) is no source.
        good = [h for h in holders if h not in dests or s not in set(dests[h].missing)]
        by_source.setdefault((good or holders)[0], []).append(s)
    return by_source, empty


def _put_calls(d: _Dest) -> Iterator[tuple[str, dict[str, Any]]]:
    """``code_put`` calls of the pieces queued for ``d``, as they come, the waiting ones batched
    up to a message's worth of raw bytes; ends at the end mark."""
    held: Any = None
    while True:
        got = held if held is not None else d.q.get()
        held = None
        if got is _END:
            d.ended = True
            return
        batch, raw = [got[0]], got[1]
        while True:
            try:
                nxt = d.q.get_nowait()
            except queue.Empty:
                break
            if nxt is _END or raw + nxt[1] > MESSAGE_RAW_BYTES:
                if nxt is _END:  # off the queue now: a link that fails before this batch is
                    d.ended = True  # answered must not leave the sender waiting for another one
                held = nxt
                break
            batch.append(nxt[0])
            raw += nxt[1]
        yield "code_put", {"blobs": batch}


def _send(run: _Staging, d: _Dest) -> StageResult | Exception:
    """One destination's sender: pass on its pieces as they come, then make the tree
    (``code_commit``); its StageResult, or the error that stopped it (a source's fault first:
    it says more than the agent's refusal)."""
    progress, tree = run.progress, run.tree
    done = {"bytes": 0}
    if progress:
        progress(d.host, 0, d.total)

    def landed(r: Any) -> None:
        if isinstance(r, dict):
            d.files_sent += int(r.get("stored") or 0)
            d.bytes_sent += int(r.get("bytes") or 0)
            done["bytes"] = d.bytes_sent
        if progress:
            progress(d.host, min(done["bytes"], d.total), d.total)

    try:
        try:
            d.link.pipeline(_put_calls(d), window=WINDOW, timeout=run.timeout, on_result=landed)
        except Exception as e:
            d.fail(f"{d.host}: {e}")
            while not d.ended:  # let the sources go on past this host
                if d.q.get() is _END:
                    d.ended = True
        with run.lock:
            why = d.error
            for s in d.missing:
                if s in run.errors:  # the source's fault says more than the agent's refusal
                    why = f"{d.host}: {run.errors[s]}"
                    break
        if why is not None:
            return ArtifactError(why)
        made = AgentClient.over(d.link).code_commit(tree=tree, files=run.wire, timeout=max(run.timeout, 300.0))
        return StageResult(d.host, str(made["path"]), d.files_sent, d.bytes_sent, time.monotonic() - run.t0, False)
    except Exception as e:
        return ArtifactError(f"{d.host}: cannot stage artifact {tree[:12]}: {e}")
    finally:
        d.link.close()


class _Fetch:
    """One source's fetcher: reads its contents once, in pieces (``code_get``, pipelined on a
    side link), checks each content's size and SHA-256 as it comes, and passes every piece on
    to each host that needs it."""

    def __init__(self, staging: _Staging, src: str, shas: list[str]) -> None:
        self.staging = staging
        self.src = src
        self.shas = shas
        self.order: deque[tuple[str, int, int]] = deque()  # the pieces asked for, in order
        self.hashes: dict[str, Any] = {}
        self.finished: set[str] = set()
        self.passed: dict[str, int] = {}  # bytes of each content passed on so far

    def calls(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """``code_get`` of every piece, content after content; a content no host still wants
        (all that wanted it have failed) is skipped."""
        sizes, needers = self.staging.sizes, self.staging.needers
        for s in self.shas:
            if all(d.error is not None for d in needers[s]):
                continue  # every host that wanted it has failed already
            off = 0
            while off < sizes[s]:
                n = min(PIECE_BYTES, sizes[s] - off)
                self.order.append((s, off, n))
                yield "code_get", {"sha": s, "offset": off, "size": n}
                off += n

    def got(self, r: Any) -> None:
        """One piece's answer: hashed into its content, checked, passed on."""
        run = self.staging
        s, off, n = self.order.popleft()
        if s in run.errors or s in self.finished:
            return
        size = run.sizes[s]
        text = str((r or {}).get("data") or "")
        data = base64.b64decode(text)
        h = self.hashes[s] = hashlib.sha256() if off == 0 else self.hashes[s]
        h.update(data)
        last = off + n >= size
        bad = None
        if len(data) != n or (r or {}).get("size") != size:
            bad = f"it is {(r or {}).get('size')} bytes there now, not {size} as packed"
            last = True
        elif last and h.hexdigest() != s:
            bad = "its content there no longer matches its SHA-256 (changed since it was packed)"
        if bad is not None:
            run.source_error(self.src, s, bad)
        item = [s, "raw", text, off, last]
        for d in run.needers[s]:
            # A bad content's last piece goes too: the receiving agent checks it, refuses
            # it and drops what it had of it (nothing of it is kept).
            if d.error is None or bad is not None:
                d.deliver(item, len(data))
        self.passed[s] = off + len(data)
        if last:
            self.finished.add(s)

    def fetch(self) -> None:
        """Fetch every content; a source that breaks off fails what it had not finished, and
        the hosts that had part of one get an empty last part (they check it and drop it)."""
        link = None
        try:
            link = self.staging.ctl.side_link(self.src)
            link.pipeline(self.calls(), window=WINDOW, timeout=self.staging.timeout, on_result=self.got)
        except Exception as e:
            for s in self.shas:
                if s not in self.finished:
                    self.staging.source_error(self.src, s, f"cannot read it: {e}")
                    if self.passed.get(s):  # an empty last part: the receiver checks what it has, drops it
                        for d in self.staging.needers[s]:
                            d.deliver([s, "raw", "", self.passed[s], True], 0)
        finally:
            if link is not None:
                link.close()
