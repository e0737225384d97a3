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


def stage(ctl: Any, artifact: dict[str, Any], hosts: list[str],
          progress: Callable[[str, int, int], None] | None = None,
          timeout: float = 120.0) -> dict[str, StageResult | Exception]:
    """Make ``artifact``'s tree (``merge``'s answer) on every host of ``hosts``, in parallel:
    host -> ``StageResult``, or the Exception that kept that host from it (the others go on).
    ``ctl`` gives ``side_link(host)`` (the controller); ``progress(host, done_bytes,
    total_bytes)`` is called as contents land; ``timeout`` is the seconds any one answer may
    take."""
    entries, sources = check_artifact(artifact)
    tree = str(artifact["tree"])
    wire = [[e.path, e.sha256, e.size, e.executable] for e in entries]
    sizes = {e.sha256: e.size for e in entries}
    names: dict[str, str] = {}
    for e in entries:
        names.setdefault(e.sha256, e.path)
    blobs = [[s, n] for s, n in sorted(sizes.items())]
    t0 = time.monotonic()
    results: dict[str, StageResult | Exception] = {}
    hosts = list(dict.fromkeys(hosts))
    if not hosts:
        return results

    def ask(h: str) -> tuple[Any, dict[str, Any]]:
        link = ctl.side_link(h)
        try:
            return link, AgentClient.over(link).code_have(tree=tree, blobs=blobs, timeout=timeout)
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
            results[h] = StageResult(h, str(ans["path"]), 0, 0, time.monotonic() - t0, True)
            if progress:
                progress(h, 0, 0)
            continue
        missing = sorted({str(s) for s in ans.get("missing") or [] if s in sizes})
        dests[h] = _Dest(h, link, missing, sum(sizes[s] for s in missing))
    if not dests:
        return results

    # Which destinations need each content, and where each comes from (once, whoever needs it).
    needers: dict[str, list[_Dest]] = {}
    for d in dests.values():
        for s in d.missing:
            needers.setdefault(s, []).append(d)
    by_source: dict[str, list[str]] = {}
    empty = []
    for s in sorted(needers):
        if sizes[s] == 0:
            empty.append(s)  # nothing to read: its one (empty) piece is known
            continue
        holders = [h for h in sources if s in set(sources[h])]
        # A holder that says it lacks the content (pruned since it was packed) is no source.
        good = [h for h in holders if h not in dests or s not in set(dests[h].missing)]
        by_source.setdefault((good or holders)[0], []).append(s)
    errors: dict[str, str] = {}
    lock = threading.Lock()

    def deliver(d: _Dest, item: list[Any], raw: int) -> None:
        d.q.put((item, raw))

    def sender(d: _Dest) -> StageResult | Exception:
        done = {"bytes": 0}
        if progress:
            progress(d.host, 0, d.total)

        def calls() -> Iterator[tuple[str, dict[str, Any]]]:
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
                        held = nxt
                        break
                    batch.append(nxt[0])
                    raw += nxt[1]
                yield "code_put", {"blobs": batch}

        def landed(r: Any) -> None:
            if isinstance(r, dict):
                d.files_sent += int(r.get("stored") or 0)
                d.bytes_sent += int(r.get("bytes") or 0)
                done["bytes"] = d.bytes_sent
            if progress:
                progress(d.host, min(done["bytes"], d.total), d.total)

        try:
            try:
                d.link.pipeline(calls(), window=WINDOW, timeout=timeout, on_result=landed)
            except Exception as e:
                d.fail(f"{d.host}: {e}")
                while not d.ended:  # let the sources go on past this host
                    if d.q.get() is _END:
                        d.ended = True
            with lock:
                why = d.error
                for s in d.missing:
                    if s in errors:  # the source's fault says more than the agent's refusal
                        why = f"{d.host}: {errors[s]}"
                        break
            if why is not None:
                return ArtifactError(why)
            made = AgentClient.over(d.link).code_commit(tree=tree, files=wire, timeout=max(timeout, 300.0))
            return StageResult(d.host, str(made["path"]), d.files_sent, d.bytes_sent, time.monotonic() - t0, False)
        except Exception as e:
            return ArtifactError(f"{d.host}: cannot stage artifact {tree[:12]}: {e}")
        finally:
            d.link.close()

    def source_error(src: str, s: str, why: str) -> None:
        with lock:
            errors.setdefault(s, f"{names[s]} ({s[:12]}) from {src}: {why}")
            msg = errors[s]
        for d in needers.get(s, []):
            d.fail(f"{d.host}: {msg}")

    def fetch(src: str, shas: list[str]) -> None:
        order: deque[tuple[str, int, int]] = deque()
        hashes: dict[str, Any] = {}
        finished: set[str] = set()
        passed: dict[str, int] = {}  # bytes of each content passed on so far

        def calls() -> Iterator[tuple[str, dict[str, Any]]]:
            for s in shas:
                if all(d.error is not None for d in needers[s]):
                    continue  # every host that wanted it has failed already
                off = 0
                while off < sizes[s]:
                    n = min(PIECE_BYTES, sizes[s] - off)
                    order.append((s, off, n))
                    yield "code_get", {"sha": s, "offset": off, "size": n}
                    off += n

        def got(r: Any) -> None:
            s, off, n = order.popleft()
            if s in errors or s in finished:
                return
            text = str((r or {}).get("data") or "")
            data = base64.b64decode(text)
            h = hashes[s] = hashlib.sha256() if off == 0 else hashes[s]
            h.update(data)
            last = off + n >= sizes[s]
            bad = None
            if len(data) != n or (r or {}).get("size") != sizes[s]:
                bad = f"it is {(r or {}).get('size')} bytes there now, not {sizes[s]} as packed"
                last = True
            elif last and h.hexdigest() != s:
                bad = "its content there no longer matches its SHA-256 (changed since it was packed)"
            if bad is not None:
                source_error(src, s, bad)
            item = [s, "raw", text, off, last]
            for d in needers[s]:
                # A bad content's last piece goes too: the receiving agent checks it, refuses
                # it and drops what it had of it (nothing of it is kept).
                if d.error is None or bad is not None:
                    deliver(d, item, len(data))
            passed[s] = off + len(data)
            if last:
                finished.add(s)

        link = None
        try:
            link = ctl.side_link(src)
            link.pipeline(calls(), window=WINDOW, timeout=timeout, on_result=got)
        except Exception as e:
            for s in shas:
                if s not in finished:
                    source_error(src, s, f"cannot read it: {e}")
                    if passed.get(s):  # an empty last part: the receiver checks what it has, drops it
                        for d in needers[s]:
                            deliver(d, [s, "raw", "", passed[s], True], 0)
        finally:
            if link is not None:
                link.close()

    with ThreadPoolExecutor(max_workers=len(dests) + len(by_source), thread_name_prefix="stage") as pool:
        sending = {h: pool.submit(sender, d) for h, d in dests.items()}
        for s in empty:
            for d in needers[s]:
                deliver(d, [s, "raw", "", 0, True], 0)
        fetching = [pool.submit(fetch, src, shas) for src, shas in by_source.items()]
        for f in fetching:
            f.result()
        for d in dests.values():
            d.q.put(_END)
        for h, sent in sending.items():
            results[h] = sent.result()
    return {h: results[h] for h in hosts}
