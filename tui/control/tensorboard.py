"""A job's TensorBoard files, brought from its hosts a piece at a time (``rigdeck tensorboard``).

Each host lists the files TensorBoard reads under the job's TensorBoard directories there
(``job_tensorboard_files``: the directories are the job's own ``AIP_TENSORBOARD_LOG_DIR``, never
one the request names); ``tui.model.tbsync.start_offset`` decides, from what the caller already
holds, which bytes of each are new; ``job_tensorboard_read`` brings them, at most 512 KiB a
request. A file is read up to the size it was listed with: what it grows by meanwhile comes at
the next pull. A file replaced or truncated while it is read is left for the next pull (it then
starts again from byte 0).

What a pull yields, in order, host after host:

- ``{"kind": "host", "host", "dirs", "files", "bytes", "problems", "error"}``: the host's listing
  (``error``: it could not be listed; ``problems``: what was wrong with part of it);
- ``{"kind": "data", "host", "dir", "path", "id", "mtime_ns", "offset", "b64"}``: a piece of a
  file from ``offset`` (at ``offset`` 0 the caller starts the file again; a file that is empty
  now comes as one empty piece then);
- ``{"kind": "problem", "host", "text"}``: a file that could not be read this time.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from agent.protocol import UNKNOWN_METHOD
from tui.control.reader import Agents
from tui.model.tbsync import Have, RemoteFile, TensorboardSyncError, start_offset
from tui.remote.agentclient import AgentClient
from tui.remote.agentlink import AgentError
from tui.remote.transport import TransportError

log = logging.getLogger(__name__)

Key = tuple[str, str, str]  # (host, its directory, the file's path under it)


def pull(agents: Agents, job_id: str, hosts: Sequence[str], have: Mapping[Key, Have],
         timeout: float = 20.0) -> Iterator[dict[str, Any]]:
    """The new bytes of the job's TensorBoard files on ``hosts`` (see the module's doc)."""
    for host in hosts:
        yield from _pull_host(agents.agent(host), host, job_id, have, timeout)


def _listing(host: str, answer: dict[str, Any]) -> tuple[list[tuple[str, RemoteFile]], list[str], list[str]]:
    """(files with their directory, the directories, problems) of a host's listing."""
    files: list[tuple[str, RemoteFile]] = []
    roots: list[str] = []
    problems = [str(p) for p in answer.get("problems") or []]
    for d in answer.get("dirs") or []:
        if not isinstance(d, dict) or not isinstance(d.get("dir"), str):
            problems.append(f"a listing must be {{dir, files, truncated}}, not {d!r}")
            continue
        root = d["dir"]
        roots.append(root)
        for row in d.get("files") or []:
            try:
                files.append((root, RemoteFile.from_row(row)))
            except TensorboardSyncError as e:
                problems.append(f"{root}: {e}")
        if d.get("truncated"):
            problems.append(f"{root}: more files than one listing holds: only the first {len(d.get('files') or [])}")
    return files, roots, problems


def _pull_host(agent: AgentClient, host: str, job_id: str, have: Mapping[Key, Have],
               timeout: float) -> Iterator[dict[str, Any]]:
    try:
        answer = agent.job_tensorboard_files(job_id=job_id, timeout=timeout)
    except TransportError as e:
        log.info("tensorboard files on %s: %s", host, e)
        why = str(e)
        if isinstance(e, AgentError) and e.code == UNKNOWN_METHOD:
            why = ("its agent is older than rigdeck tensorboard: it is replaced by this version's "
                   "once no job runs there")
        yield {"kind": "host", "host": host, "dirs": [], "files": 0, "bytes": 0, "problems": [], "error": why}
        return
    files, roots, problems = _listing(host, answer)
    yield {"kind": "host", "host": host, "dirs": roots, "files": len(files),
           "bytes": sum(f.size for _, f in files), "problems": problems, "error": None}
    for root, f in files:
        offset = start_offset(f, have.get((host, root, f.path)))
        if offset is None:
            continue
        try:
            yield from _read(agent, host, job_id, root, f, offset, timeout)
        except TransportError as e:
            yield {"kind": "problem", "host": host, "text": f"{root}/{f.path}: {e}"}


def _read(agent: AgentClient, host: str, job_id: str, root: str, f: RemoteFile, offset: int,
          timeout: float) -> Iterator[dict[str, Any]]:
    """The pieces of ``f`` from ``offset`` up to its listed size."""
    item = {"kind": "data", "host": host, "dir": root, "path": f.path, "id": f.id, "mtime_ns": f.mtime_ns}
    if offset == 0 and f.size == 0:
        yield {**item, "offset": 0, "b64": ""}
        return
    pos = offset
    while pos < f.size:
        piece = agent.job_tensorboard_read(job_id=job_id, dir=root, path=f.path, offset=pos, timeout=timeout)
        if piece.get("id") != f.id or not isinstance(piece.get("size"), int) or piece["size"] < pos:
            return  # replaced or truncated since it was listed: the next pull starts it again
        try:
            data = base64.b64decode(str(piece.get("b64") or ""), validate=True)
        except (binascii.Error, ValueError):
            yield {"kind": "problem", "host": host, "text": f"{root}/{f.path}: a piece that is no base64"}
            return
        if not data:
            return
        yield {**item, "offset": pos, "b64": piece["b64"]}
        pos += len(data)
