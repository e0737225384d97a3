"""The Python stacks of a job's ranks on this host, taken while they live (a hung job, before it is
stopped).

Each rank's Python processes arm ``faulthandler`` on SIGUSR1 at start (agent/rankboot) and leave
``<job_dir>/stacks/rank-<R>/pid-<P>.txt``. ``collect`` signals every armed process that still
carries the job's tag, waits for the dumps to land, appends each to the rank's log (so
``rigdeck logs`` shows it beside the rank's output) and returns them with a one-line summary: the
frame the main thread is in, and whether that is inside a collective call.

Stdlib only, Python 3.9+.
"""
from __future__ import annotations

import json
import os
import re
import signal
import time

TYPE_CHECKING = False  # (mypy reads it as True) typing is not imported by a rank's or job's start
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

STACKS_DIR = "stacks"
ENV_STACKS_DIR = "RIGDECK_STACKS_DIR"

# A frame in one of these is waiting on the other ranks, not the reason they wait.
_COLLECTIVE_FILES = ("torch/distributed/", "torch/cuda/nccl", "mpi4py/", "horovod/")
_COLLECTIVE_FUNCS = {"all_reduce", "allreduce", "barrier", "broadcast", "all_gather", "all_gather_into_tensor",
                     "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "gather", "scatter", "reduce",
                     "send", "recv", "wait", "monitored_barrier", "Allreduce", "Barrier", "Bcast",
                     "_wait_collective"}  # runtime.checkpoint's wait for its own collectives
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_THREAD = re.compile(r"^(?P<current>Current thread|Thread) (?P<id>0x[0-9a-f]+)")


def rank_stacks_dir(job_dir: str, rank: int) -> str:
    return os.path.join(job_dir, STACKS_DIR, "rank-%d" % rank)


def _exit_mark(rank_dir: str, pid: int) -> str:
    return os.path.join(rank_dir, "exiting-%d" % pid)  # the rank boot's exit hook leaves it


def exiting(job_dir: str, rank: int, pid: Any) -> bool:
    """The rank's process ``pid`` has left its program and is finalizing (the rank boot's exit
    hook left ``exiting-<pid>``): its silence is not a hang, and it is not signalled."""
    return isinstance(pid, int) and os.path.exists(_exit_mark(rank_stacks_dir(job_dir, rank), pid))


def ranks_ending(job_dir: str) -> Dict[int, bool]:
    """Each rank this host started in ``job_dir`` (``ranks/rank-R.json``): whether it has ended
    (its exit record) or its process is on its way out (``exiting``)."""
    out = {}  # type: Dict[int, bool]
    base = os.path.join(job_dir, "ranks")
    try:
        names = os.listdir(base)
    except OSError:
        return out
    for name in names:
        m = re.match(r"^rank-(\d+)\.json$", name)
        if m is None:
            continue
        rank = int(m.group(1))
        try:
            with open(os.path.join(base, name)) as f:
                rec = json.load(f)
        except (OSError, ValueError):
            out[rank] = False
            continue
        pid = rec.get("pid") if isinstance(rec, dict) else None
        out[rank] = (os.path.exists(os.path.join(base, "rank-%d.exit.json" % rank))
                     or exiting(job_dir, rank, pid))
    return out


def _tagged(pid: int, job_id: str) -> bool:
    """Still the job's process (a pid file can outlive its process; the pid can be reused)."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            return ("RIGDECK_JOB_ID=%s" % job_id).encode() in f.read().split(b"\0")
    except OSError:
        return False


def _armed(job_dir: str, job_id: str) -> List[Dict[str, Any]]:
    out = []  # type: List[Dict[str, Any]]
    base = os.path.join(job_dir, STACKS_DIR)
    try:
        rank_dirs = sorted(os.listdir(base))
    except OSError:
        return out
    for rd in rank_dirs:
        if not rd.startswith("rank-") or not rd[5:].isdigit():
            continue
        try:
            files = sorted(os.listdir(os.path.join(base, rd)))
        except OSError:
            continue
        for name in files:
            m = re.match(r"^pid-(\d+)\.txt$", name)
            if m is None:
                continue
            pid = int(m.group(1))
            if not _tagged(pid, job_id) or os.path.exists(_exit_mark(os.path.join(base, rd), pid)):
                continue  # not the job's any more, or finalizing (a stack signal then is ignored)
            path = os.path.join(base, rd, name)
            try:
                size = os.path.getsize(path)
            except OSError:
                continue
            out.append({"rank": int(rd[5:]), "pid": pid, "path": path, "offset": size})
    return out


def summarize(text: str) -> Dict[str, Any]:
    """The main thread's innermost frame of a faulthandler dump, and whether any frame of it is a
    collective call (then the rank is waiting for the others)."""
    threads = []  # type: List[Dict[str, Any]]
    for line in text.splitlines():
        t = _THREAD.match(line)
        if t:
            threads.append({"current": t.group("current") == "Current thread", "frames": []})
            continue
        f = _FRAME.match(line)
        if f and threads:
            threads[-1]["frames"].append((f.group("file"), int(f.group("line")), f.group("func")))
    if not threads:
        return {"top": None, "in_collective": False}
    main = next((t for t in threads if t["current"]), threads[0])  # the signal lands on the main thread
    frames = main["frames"]
    in_collective = any(
        any(part in path for part in _COLLECTIVE_FILES) or func in _COLLECTIVE_FUNCS for path, _, func in frames)
    # "most recent call first": the first frame of the user's own code is what the rank is doing
    own = [fr for fr in frames if "site-packages" not in fr[0] and "/lib/python" not in fr[0]]
    top = (own or frames)[0] if frames else None
    return {"top": "%s:%d in %s" % (os.path.basename(top[0]), top[1], top[2]) if top else None,
            "in_collective": in_collective}


def collect(job_dir: str, job_id: str, why: str = "", timeout: float = 3.0) -> Dict[str, Any]:
    """Ask each armed process of the job for its stacks; wait up to ``timeout`` for them."""
    armed = _armed(job_dir, job_id)
    for a in armed:
        try:
            os.kill(a["pid"], signal.SIGUSR1)
        except OSError:
            a["gone"] = True
    deadline = time.monotonic() + timeout
    pending = [a for a in armed if not a.get("gone")]
    last: Dict[int, Tuple[int, int]] = {}  # pid -> (size, polls it held)
    while pending and time.monotonic() < deadline:
        time.sleep(0.1)
        still = []
        for a in pending:
            try:
                size = os.path.getsize(a["path"])
            except OSError:
                continue
            # faulthandler writes a dump in many small writes, and a loaded machine can pause it
            # between two: done when it grew, then held for two looks, and its current thread
            # shows a frame (a dump cut after a thread's header has none)
            held = last[a["pid"]][1] + 1 if a["pid"] in last and last[a["pid"]][0] == size else 0
            last[a["pid"]] = (size, held)
            if size > a["offset"] and held >= 2 and summarize(_read_from(a["path"], a["offset"]))["top"]:
                continue
            still.append(a)
        pending = still
    out = []  # type: List[Dict[str, Any]]
    for a in armed:
        text = _read_from(a["path"], a["offset"])
        if not text:
            continue
        s = summarize(text)
        out.append({"rank": a["rank"], "pid": a["pid"], "text": text, "top": s["top"],
                    "in_collective": s["in_collective"]})
        _append_to_log(job_dir, a["rank"], a["pid"], why, text)
    return {"stacks": out, "armed": len(armed)}


def _read_from(path: str, offset: int, limit: int = 256 * 1024) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return ""


def _append_to_log(job_dir: str, rank: int, pid: int, why: str, text: str) -> None:
    head = "\n--- rigdeck: Python stacks of rank %d (pid %d)%s ---\n" % (rank, pid, ", " + why if why else "")
    data = (head + text.rstrip("\n") + "\n--- end of stacks ---\n").encode("utf-8", "replace")
    path = os.path.join(job_dir, "logs", "rank-%d.log" % rank)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError:
        return
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def boot_dir() -> Optional[str]:
    """The directory a rank puts first on PYTHONPATH to be armed (inside the zipapp too: zipimport
    reads ``archive.pyz/agent/rankboot``)."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, "rankboot")
