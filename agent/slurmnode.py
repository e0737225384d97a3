"""The GPUs Slurm has allocated on this host, read from Slurm itself.

On a host where ``slurmd`` runs beside rigdeck (an inventory without ``[slurm]``), a GPU Slurm
gave to a job is taken, whoever's job it is and whether or not its processes have started: the
agent's samples say so (the GPU's ``claim`` is Slurm's, with the Slurm job id and user) and
rigdeck's placement never lands on it.

What is read: ``scontrol -d -o show node <this host>`` (``GresUsed=gpu:2``: how many; some
versions add which, ``(IDX:0-1)``, 22.05 does not); when GPUs are used, the node's jobs
(``squeue -w``) and each one's GPUs there (``scontrol -d show job``: ``GRES=gpu:2(IDX:0-1)``).
The node's own state comes with the first read: a node drained or down in Slurm (by an admin, NHC
or Slurm itself) is said (``unavailable()``: its State= and Reason= as scontrol wrote them), and
the workstation keeps rigdeck's placement off it as off a host rigdeck drained.
A host without ``scontrol`` or a Slurm configuration, or one Slurm does not know by its short
hostname, is no Slurm node: looked at again each minute. A command that fails or hangs (each
has a timeout) never breaks a sample: the last answer is kept, the failure is logged once, and
Slurm is asked again after a pause.

Stdlib only, Python 3.9+.
"""
from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from agent import slurmtext

log = logging.getLogger("rigdeck.agent.slurm")

COMMAND_TIMEOUT_S = 3.0
RECHECK_S = 60.0  # a host that is no Slurm node (or whose scontrol is missing) is looked at again
RETRY_S = 15.0  # after a failed or slow command, Slurm is asked again no sooner than this
CONF_PATHS = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf", "/run/slurm/conf/slurm.conf")
JOB_STATES = "R,CG,S"  # jobs that hold their GPUs: running, completing, suspended
# Words of a node's State= that keep Slurm's jobs off it ("IDLE+DRAIN", "DOWN*", "MIXED+DRAIN",
# "IDLE*": not responding); the workstation reads the state itself (tui/model/slurm.py).
UNAVAILABLE = ("DRAIN", "DRAINED", "DRAINING", "DOWN", "NOT_RESPONDING")

Runner = Callable[[Sequence[str], float], Tuple[int, str, str]]


def run_command(argv: Sequence[str], timeout: float) -> Tuple[int, str, str]:
    """(exit status, stdout, stderr) of argv, never through a shell; 124 on a timeout."""
    try:
        cp = subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=timeout, env={**os.environ, "LC_ALL": "C"})
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout:g}s"
    except OSError as e:
        return 127, "", str(e)
    return cp.returncode, cp.stdout, cp.stderr


def slurm_configured() -> bool:
    """Whether this host has Slurm's commands and a configuration for them."""
    if shutil.which("scontrol") is None:
        return False
    conf = os.environ.get("SLURM_CONF")
    return any(os.path.isfile(p) for p in ((conf,) if conf else ()) + CONF_PATHS)


class SlurmNode:
    """This host as a Slurm node: ``allocated(max_age)`` -> GPU index -> {"job_id", "user"}."""

    def __init__(self, node: Optional[str] = None, run: Runner = run_command,
                 configured: Callable[[], bool] = slurm_configured,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.node = node or socket.gethostname().split(".")[0]
        self._run = run
        self._configured = configured
        self._clock = clock
        self._lock = threading.Lock()
        self._held: Dict[int, Dict[str, Any]] = {}
        self._unavailable: Optional[Dict[str, str]] = None  # State= and Reason= when drained/down
        self._at = -1e18  # when _held was read
        self._next_try = -1e18  # no command before this (not a node, or after a failure)
        self._logged: set = set()

    def allocated(self, max_age: float = 5.0) -> Dict[int, Dict[str, Any]]:
        """GPUs Slurm has allocated here, read at most ``max_age`` s ago when Slurm answers; the
        last answer while it does not (or while another thread asks it). Never raises."""
        now = self._clock()
        if now - self._at <= max_age or now < self._next_try:
            return self._held
        # Another sample may be asking Slurm right now: the stream's takes its answer; a fresh
        # one (a placement's) waits for it a little, then asks again itself.
        fresh = max_age <= 0
        if not (self._lock.acquire(True, COMMAND_TIMEOUT_S) if fresh else self._lock.acquire(False)):
            return self._held
        try:
            now = self._clock()
            if now < self._next_try:  # the one before failed just now: no second wait on Slurm
                return self._held
            self._refresh(now)
        except Exception as e:  # never let Slurm's text break a sample
            self._failed(f"reading Slurm's allocation of {self.node} failed: {e}", now)
        finally:
            self._lock.release()
        return self._held

    def unavailable(self) -> Optional[Dict[str, str]]:
        """``{"node", "state", "reason"}`` as Slurm last said them, when Slurm keeps its jobs off
        this node (drained, draining, down, not responding); None when it does not, or this is no
        Slurm node. What ``allocated`` read last: no command of its own."""
        return self._unavailable

    def _refresh(self, now: float) -> None:
        if not self._configured():
            self._held, self._unavailable, self._next_try = {}, None, now + RECHECK_S
            return
        rc, out, err = self._run(["scontrol", "-d", "-o", "show", "node", self.node], COMMAND_TIMEOUT_S)
        if rc != 0:
            if "not found" in err.lower() or "invalid node name" in err.lower():
                self._once(f"{self.node} is no Slurm node (scontrol: {err.strip()}): not read again for "
                           f"{RECHECK_S:g}s", logging.INFO)
                self._held, self._unavailable, self._next_try = {}, None, now + RECHECK_S
                return
            self._failed(f"scontrol show node {self.node} failed ({rc}): {err.strip()}", now)
            return
        nodes = slurmtext.records(out, "NodeName")
        if not nodes:
            self._failed(f"scontrol show node {self.node} said nothing of it", now)
            return
        self._unavailable = _unavailable(self.node, nodes[0])
        count, indices = slurmtext.gres(nodes[0].get("GresUsed", ""))
        held: Dict[int, Dict[str, Any]] = {}
        if count:
            held = self._by_job(indices or [], now)
            if held is None:
                return
        self._held, self._at = held, now

    def _by_job(self, used: List[int], now: float) -> Any:
        """GPU -> its Slurm job and user; the GPUs ``used`` (GresUsed's IDX, where the version says
        them) that no job names are Slurm's all the same. None on failure."""
        rc, out, err = self._run(["squeue", "--noheader", f"--nodelist={self.node}", f"--states={JOB_STATES}",
                                  "--format=%A|%u"], COMMAND_TIMEOUT_S)
        if rc != 0:
            self._failed(f"squeue on {self.node} failed ({rc}): {err.strip()}", now)
            return None
        held: Dict[int, Dict[str, Any]] = {}
        for line in out.splitlines():
            job_id, _, user = line.strip().partition("|")
            if not job_id.isdigit():
                continue
            rc, text, err = self._run(["scontrol", "-d", "show", "job", job_id], COMMAND_TIMEOUT_S)
            if rc != 0:  # ended between the two questions: its GPUs are free again
                continue
            for g in slurmtext.job_node_gpus(text).get(self.node, []):
                held[g] = {"job_id": job_id, "user": user or None}
        for g in used:  # used, and no job named: still Slurm's
            held.setdefault(g, {"job_id": None, "user": None})
        return held

    def _failed(self, message: str, now: float) -> None:
        self._once(message, logging.WARNING)
        self._next_try = now + RETRY_S

    def _once(self, message: str, level: int) -> None:
        key = message.split(":", 1)[0]
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, "%s", message)


def _unavailable(node: str, record: Dict[str, str]) -> Optional[Dict[str, str]]:
    """The node's State= and Reason= when its state keeps Slurm's jobs off it, else None."""
    state = record.get("State", "")
    words = [w.upper() for w in state.split("+") if w]
    if not any(w.rstrip("*~#!%$@^-") in UNAVAILABLE or w.endswith("*") for w in words):
        return None
    return {"node": node, "state": state[:200], "reason": record.get("Reason", "")[:500]}
