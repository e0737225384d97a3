"""The daemon's side of jobs: start a job host process, stop it, and read what the job left on disk.

Everything a job knows lives in its directory (``<state_dir>/jobs/<job_id>/``): the plan, the
job host's ``state.json``, one log and one metrics file per rank, and rank records. The daemon
only reads those, so it can restart (or upgrade) without losing anything. Stdlib only, 3.9+.
"""
from __future__ import annotations

import base64
import errno
import glob
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import time

from agent import claims as gpu_claims
from agent import container as containers
from agent import filemodes, stacks, standby
from agent.clusterfiles import HYPERTUNE_FILE, global_ranks
from agent.jobfiles import free_mb, keep_env_file, read_log, read_tail, resource_message, write_json
from agent.jobhost import (
    GPU_HEALTH_FILE,
    STOP_FILE,
    TERMINAL,
    mark_attempt,
    no_site,
    pid_alive,
    processes_with_tag,
    read_json,
    sweep,
)
from agent.rankexec import DEFS_RANK, RECORD_KEYS
from agent.trackers import read_links

TYPE_CHECKING = False  # (mypy reads it as True) typing is not imported by a rank's or job's start
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MAX_CHUNK = 256 * 1024
STDOUT_SUFFIX = "/stdout"  # job_metrics offsets into a rank's parsed-stdout metrics
DEFS_KEY = "%d/defs" % DEFS_RANK  # job_metrics offset into metrics/defs-rank-0.jsonl
HYPERTUNE_SUFFIX = "/hypertune"  # "R/hypertune": the last hypertune timestamp sent, in µs
# cloudml-hypertune's own keys in an entry; every other key is a metric (a number in a string)
HYPERTUNE_RESERVED = ("timestamp", "trial", "global_step", "checkpoint_path")
CLAIM_TTL_S = 120.0  # a claim made ahead of a start lapses if the start never comes
ORPHAN_GRACE_S = 2.0  # SIGTERM to SIGKILL for the ranks of a job host that died


class JobError(Exception):
    pass


def _rank_ended(job_dir: str, rank: int) -> bool:
    """The rank's wrapper has recorded its exit: its log and metrics file are complete."""
    return os.path.exists(os.path.join(job_dir, "ranks", "rank-%d.exit.json" % rank))


def _jsonl(text: str) -> List[Dict[str, Any]]:
    records = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            records.append(rec)
    return records


def _last_record(path: str, max_bytes: int = 65536) -> Optional[Dict[str, Any]]:
    """The last metrics record with a loss in a metrics file, from its tail only."""
    data = read_tail(path, max_bytes)
    if data is None:
        return None
    for rec in reversed(_jsonl(data.decode("utf-8", "replace"))):
        if rec.get("loss") is not None:
            return rec
    return None


def _wire_safe(rec: Dict[str, Any]) -> Dict[str, Any]:
    """A metrics record the wire can carry: JSON has no NaN or infinity (a diverged loss), so such
    a value goes as its text ("nan", "inf", "-inf") and ``nonfinite`` names the keys that hold
    one (the workstation's client turns them back into floats)."""
    bad = [k for k, v in rec.items() if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf")))]
    if not bad:
        return rec
    out = dict(rec)
    for k in bad:
        out[k] = repr(rec[k])
    out["nonfinite"] = bad
    return out


def _last_step(path: str, marks: List[Dict[str, Any]], max_bytes: int = 65536) -> Optional[Dict[str, Any]]:
    """The last record in a metrics file that reports a step, from its tail only, with the attempt
    that wrote it (by where it lies against each attempt's start in ``attempts.json``): the
    controller's watch on progress must not take the last attempt's step for the new one's."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return None
    data = read_tail(path, max_bytes)
    if not data:
        return None
    base = size - len(data)
    end = len(data)
    while end > 0:
        start = data.rfind(b"\n", 0, end - 1) + 1
        line = data[start:end].strip()
        end = start
        if not line or start == 0 and base > 0:
            continue  # an empty line, or the tail's first line (cut in the middle)
        try:
            rec = json.loads(line.decode("utf-8", "replace"))
        except ValueError:
            continue
        step = rec.get("step") if isinstance(rec, dict) and rec.get("event") is None else None
        if isinstance(step, bool) or not isinstance(step, (int, float)):
            continue
        offset = base + start
        name = os.path.basename(path)
        attempt = max([int(m.get("restart_count") or 0) for m in marks
                       if int((m.get("sizes") or {}).get(name, 0)) <= offset] or [0])
        return {"step": step, "time": rec.get("time"), "loss": rec.get("loss"), "attempt": attempt}
    return None


def _sections(path: str, marks: List[Dict[str, Any]], max_bytes: int = 65536) -> Optional[Dict[str, Any]]:
    """The sections (``runtime.section``: a checkpoint save, an evaluation) the rank of a metrics
    file is inside now, and the longest run of each it ended, in the current attempt and the
    file's tail: the controller's hang rule (agent/hangrule.py) judges each against its own.
    None when the tail holds no section of this attempt."""
    data = read_tail(path, max_bytes)
    if not data or b'"section"' not in data:
        return None
    try:
        size = os.path.getsize(path)
    except OSError:
        return None
    current = max([int(m.get("restart_count") or 0) for m in marks] or [0])
    begins = [int((m.get("sizes") or {}).get(os.path.basename(path), 0)) for m in marks
              if int(m.get("restart_count") or 0) == current]
    first = max(begins or [0]) - (size - len(data))  # where this attempt's lines begin in the tail
    opened = []  # type: List[str]
    ended = {}  # type: Dict[str, float]
    at = 0
    for line in data.split(b"\n"):
        here, at = at, at + len(line) + 1
        if here < first or b'"section"' not in line:
            continue
        rec = _section_event(line)
        if rec is None:
            continue
        name = rec["section"]
        if rec.get("phase") == "begin":
            opened.append(name)
        elif rec.get("phase") == "end":
            if name in opened:
                opened.remove(name)
            seconds = rec.get("seconds")
            if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
                ended[name] = max(ended.get(name, 0.0), float(seconds))
    if not opened and not ended:
        return None
    return {"attempt": current, "sections": sorted(set(opened)), "ended": ended}


def _section_event(line: bytes) -> Optional[Dict[str, Any]]:
    try:
        rec = json.loads(line.decode("utf-8", "replace"))
    except ValueError:
        return None
    if not isinstance(rec, dict) or rec.get("event") != "section" or not isinstance(rec.get("section"), str):
        return None
    return rec


def _runs_jobhost(pid: Any, job_dir: str) -> bool:
    """Whether ``pid`` is (still) the job host of ``job_dir``, by its command line."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return b"jobhost" in argv and os.fsencode(job_dir) in argv


def _keep_env_file(job_dir: str, plan: Dict[str, Any]) -> None:
    """The start's ``env_from_file`` values into the job's directory (0600), out of the plan
    (``agent.jobfiles.keep_env_file``); JobError naming the job when they are not to be had."""
    try:
        keep_env_file(job_dir, plan)
    except ValueError as e:
        raise JobError("job %s: %s" % (plan.get("job_id"), e)) from None


class Jobs:
    def __init__(self, state_dir: str, agent_command: List[str]):
        self.root = os.path.join(state_dir, "jobs")
        self.agent_command = agent_command
        self.zipapp_command = None  # type: Optional[List[str]]  # what agent_command was unpacked from
        self._children = {}  # type: Dict[str, subprocess.Popen]
        self._exit_codes = {}  # type: Dict[int, int]  # job host pid -> its exit status, once reaped
        self._last_states = {}  # type: Dict[str, str]
        self._pending = {}  # type: Dict[str, Tuple[List[int], float]]  # claims made ahead of a start
        self._live = -1  # jobs not ended at the last supervise (-1: none made yet)
        self._state_cache = {}  # type: Dict[str, Tuple[Tuple[int, int, int], Dict[str, Any]]]
        # Every job's directory (its spec, environment, logs, checkpoints) is below this one, which
        # nobody but this account may enter: another person's jobs on the host cannot read them.
        filemodes.private_dir(self.root, "job directory root")

    def job_dir(self, job_id: str) -> str:
        if not isinstance(job_id, str) or not JOB_ID_RE.match(job_id):
            raise JobError("bad job id %r" % (job_id,))
        return os.path.join(self.root, job_id)

    # -- GPU claims -----------------------------------------------------------------------------

    def _drop_pending(self, job_id: str) -> None:
        fds, _ = self._pending.pop(job_id, ([], 0.0))
        for fd in fds:
            os.close(fd)

    def _expire_pending(self) -> None:
        now = time.monotonic()
        for job_id in [j for j, (_, until) in self._pending.items() if until < now]:
            self._drop_pending(job_id)

    def _clear_previous(self, job_id: str) -> None:
        """No process of an earlier attempt may live when a new one starts: stop stragglers (a
        terminal job's leftovers), refuse while its job host still runs."""
        d = self.job_dir(job_id)
        current = read_json(os.path.join(d, "state.json"))
        if current and current.get("state") not in TERMINAL and pid_alive(current.get("jobhost_pid")):
            raise JobError("job %s is already running here (pid %s)" % (job_id, current.get("jobhost_pid")))
        # The earlier attempt's job host writes its ended state, then exits: until it has, it
        # holds the job's GPU claims (it carries no job tag of its own). A restart waits for it.
        jobhost = (current or {}).get("jobhost_pid")
        if not _runs_jobhost(jobhost, d):
            jobhost = None  # gone, or its pid now someone else's
        deadline = time.monotonic() + 5.0
        while pid_alive(jobhost) and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.02)
        if jobhost is not None and pid_alive(jobhost):
            try:
                os.kill(int(jobhost), signal.SIGKILL)
            except OSError:
                pass
            while pid_alive(jobhost) and time.monotonic() < deadline + 2.0:
                self.reap()
                time.sleep(0.02)
        if not processes_with_tag(job_id):
            return
        sweep(job_id, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while processes_with_tag(job_id) and time.monotonic() < deadline:
            time.sleep(0.05)
            sweep(job_id, signal.SIGKILL)
        left = processes_with_tag(job_id)
        if left:
            raise JobError("processes of an earlier attempt of %s are still alive here: %s"
                           % (job_id, " ".join(map(str, left))))

    def claim(self, job_id: str, gpus: List[int], ttl_s: float = CLAIM_TTL_S) -> Dict[str, Any]:
        """Claim this host's GPUs for a start that follows (all or none); lapses after ``ttl_s``."""
        self.job_dir(job_id)
        self._expire_pending()
        self._drop_pending(job_id)
        self._clear_previous(job_id)
        fds = self._claim_after_previous(job_id, gpus)
        self._pending[job_id] = (fds, time.monotonic() + ttl_s)
        return {"claimed": sorted(int(g) for g in gpus)}

    def _claim_after_previous(self, job_id: str, gpus: List[int], wait_s: float = 10.0) -> List[int]:
        """Claim ``gpus`` for ``job_id``. A claim still held by this same job's earlier attempt
        (its last process exiting as the restart comes) is waited for, up to ``wait_s``, with its
        stragglers stopped again; anyone else's claim is refused at once. A refusal names the
        processes that hold the lock open."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return gpu_claims.claim(gpus, job_id)
            except gpu_claims.ClaimError as e:
                if e.holder.get("job_id") != job_id or time.monotonic() > deadline:
                    who = gpu_claims.lock_holders(e.gpu) if e.gpu is not None else []
                    held = "; held open by %s" % ", ".join("pid %d (%s)" % w for w in who) if who else ""
                    raise JobError(str(e) + held) from None
            self.reap()
            sweep(job_id, signal.SIGKILL)
            time.sleep(0.1)

    def release(self, job_id: str) -> Dict[str, Any]:
        """Give back a claim made ahead of a start that will not come."""
        self.job_dir(job_id)
        had = job_id in self._pending
        self._drop_pending(job_id)
        return {"released": had}

    def check(self, job_id: str, gpus: List[int], min_free_mb: float,
              container: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """Whether a start could go ahead here, changing nothing: free space for the job's files,
        the GPUs unclaimed, and a ``[container]`` job's runtime and image here. Returns the
        problems (empty when none)."""
        self.job_dir(job_id)
        problems = containers.check(container, os.path.dirname(self.root)) if container else []
        mb = free_mb(self.root)
        if mb is not None and mb < min_free_mb:
            problems.append("only %.1f MB free in %s:%s (at least %g MB needed: min_free_mb)"
                            % (mb, socket.gethostname(), self.root, min_free_mb))
        try:
            held = gpu_claims.held(gpus=gpus) or {}
        except gpu_claims.ClaimError as e:  # a claim directory not to trust: the claim would fail
            problems.append("%s: %s" % (socket.gethostname(), e))
            held = {}
        for g, holder in sorted(held.items()):
            if holder.get("job_id") != job_id:
                problems.append("GPU %d on %s is held by %s"
                                % (g, socket.gethostname(), gpu_claims.describe_holder(holder)))
        return {"problems": problems, "free_mb": mb}

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, plan: Dict[str, Any]) -> Dict[str, Any]:
        for key in ("job_id", "launcher", "command", "nodes", "node_index", "master_addr", "master_port"):
            if key not in plan:
                raise JobError("plan lacks %r" % key)
        job_id = plan["job_id"]
        d = self.job_dir(job_id)
        if plan.get("slurm"):
            return self._start_in_slurm(d, plan)
        # every replica this host runs (a pool job may put several here): their GPUs, all or none
        gpus = sorted({int(g) for i in (plan.get("node_indices") or [plan["node_index"]])
                       for g in plan["nodes"][int(i)].get("gpus") or []})
        self._expire_pending()
        if job_id in self._pending:
            fds = self._pending.pop(job_id)[0]
        else:
            self._clear_previous(job_id)
            fds = self._claim_after_previous(job_id, gpus) if gpus else []
        try:
            os.makedirs(d, mode=0o755, exist_ok=True)
            # A restart reuses the directory: logs and metrics go on; rank records start afresh,
            # and a stop asked of the attempt before is not this one's.
            for f in glob.glob(os.path.join(d, "ranks", "*")):
                os.unlink(f)
            _unlink(os.path.join(d, STOP_FILE))
            _keep_env_file(d, plan)
            self._mark_attempt(d, int(plan.get("restart_count") or 0))
            write_json(os.path.join(d, "plan.json"), plan)
            write_json(os.path.join(d, "state.json"), {
                "job_id": job_id, "state": "starting", "host": plan["nodes"][plan["node_index"]]["host"],
                "restart_count": plan.get("restart_count", 0), "started": time.time(), "ended": None,
                "cause": None, "jobhost_pid": None,
            })
            env = dict(os.environ, RIGDECK_CLAIM_FDS=",".join(str(fd) for fd in fds))
            with open(os.devnull, "rb") as devnull, open(os.path.join(d, "jobhost.stderr"), "ab") as err:
                proc = subprocess.Popen(
                    no_site(self._command()) + ["jobhost", "--job-dir", d],
                    stdin=devnull, stdout=err, stderr=err, start_new_session=True, cwd=d, env=env,
                    pass_fds=fds,
                )
        finally:
            for fd in fds:  # the job host holds the claim now (or nobody does)
                os.close(fd)
        self._children[job_id] = proc
        return {"job_dir": d, "jobhost_pid": proc.pid}

    def _start_in_slurm(self, d: str, plan: Dict[str, Any]) -> Dict[str, Any]:
        """A job Slurm runs: its job host is this host's task of the Slurm step (agent/slurmstep.py),
        which waits for this plan; it starts nothing and claims no GPU here (Slurm allocated
        them: agent/slurmnode.py counts them taken). The state goes first: the job host's own
        states follow the plan and are never written over."""
        job_id = plan["job_id"]
        self._clear_previous(job_id)
        os.makedirs(d, mode=0o755, exist_ok=True)
        _keep_env_file(d, plan)
        for f in glob.glob(os.path.join(d, "ranks", "*")):
            os.unlink(f)
        _unlink(os.path.join(d, STOP_FILE))
        self._mark_attempt(d, int(plan.get("restart_count") or 0))
        write_json(os.path.join(d, "state.json"), {
            "job_id": job_id, "state": "starting", "host": plan["nodes"][plan["node_index"]]["host"],
            "restart_count": plan.get("restart_count", 0), "started": time.time(), "ended": None,
            "cause": None, "jobhost_pid": None, "slurm": plan["slurm"],
        })
        write_json(os.path.join(d, "plan.json"), plan)
        return {"job_dir": d, "jobhost_pid": None, "slurm": plan["slurm"]}

    @staticmethod
    def _mark_attempt(d: str, restart_count: int) -> None:
        mark_attempt(d, restart_count)

    def stop(self, job_id: str, grace_s: Optional[float] = None, keep_standbys: bool = False) -> Dict[str, Any]:
        """Stop the job here. Its warm standbys (agent/standby.py) end too, unless the controller
        stops the gang for a restart that may adopt them (``keep_standbys``)."""
        d = self.job_dir(job_id)
        self._drop_pending(job_id)
        st = read_json(os.path.join(d, "state.json"))
        if st is None:
            raise JobError("no job %s on this host" % job_id)
        if not keep_standbys:
            standby.end_all(d)
        if grace_s is not None:
            plan = read_json(os.path.join(d, "plan.json")) or {}
            plan["grace_s"] = float(grace_s)
            write_json(os.path.join(d, "plan.json"), plan)  # the job host reads it when stopping
        pid = st.get("jobhost_pid") or self._child_pid(job_id)
        if st.get("state") in TERMINAL:
            swept = sweep(job_id)
            return {"state": st["state"], "swept": swept}
        # Kept on disk as well as signalled: a job host healing in place ignores SIGTERM while it
        # stops its own ranks, and must not start them again after this stop.
        try:
            write_json(os.path.join(d, STOP_FILE), {"at": time.time()})
        except OSError:
            pass  # a full disk: the signal still stops it (a restart in place could follow)
        if pid is not None and pid_alive(pid):
            try:
                os.kill(pid, signal.SIGTERM)  # the job host runs the grace period and the sweep
            except OSError:
                pass
            return {"state": "stopping"}
        # No job host (it crashed): do its work here.
        swept = sweep(job_id, signal.SIGTERM)
        time.sleep(0.5)
        swept += sweep(job_id)
        now = read_json(os.path.join(d, "state.json")) or st
        if now.get("jobhost_pid"):  # it was only starting: it read the stop file and ends itself
            return {"state": now.get("state", "stopping"), "swept": swept}
        st.update(state="stopped", ended=time.time(), cause={"message": "stopped; job host was gone"})
        write_json(os.path.join(d, "state.json"), st)
        return {"state": "stopped", "swept": swept}

    def _child_pid(self, job_id: str) -> Optional[int]:
        """The job host this agent started for ``job_id`` and that still runs, when it has not
        recorded its own pid yet (a stop that comes within a moment of the start)."""
        p = self._children.get(job_id)
        return p.pid if p is not None and p.poll() is None else None

    def use_unpacked(self) -> None:
        """Start job hosts and rank wrappers from the zipapp's byte-compiled copy (made now)."""
        from agent.paths import unpacked_command

        self.zipapp_command = list(self.agent_command)
        self.agent_command = unpacked_command(self.zipapp_command)

    def unpacked_agent(self) -> Optional[List[str]]:
        """The agent's unpacked copy as a command (``[python, DIR]``), made again if it is gone;
        None when the agent runs from no zipapp or cannot be unpacked here."""
        c = self._command()
        from agent.paths import is_unpacked

        return list(c) if len(c) == 2 and is_unpacked(c[1]) else None

    def _command(self) -> List[str]:
        """The agent command for a new job host: the unpacked copy, made again first when it is
        gone (someone removed the agent's directory, and a deploy put the archive back)."""
        from agent.paths import is_unpacked, unpacked_command

        c = self.agent_command
        if self.zipapp_command and c != self.zipapp_command and not (
                is_unpacked(c[1]) and os.path.isfile(os.path.join(c[1], "agent", "jobhost.py"))):
            self.agent_command = c = unpacked_command(self.zipapp_command)
        return c

    def reap(self) -> None:
        """Collect every job host that ended (no zombies), remembering how it ended."""
        for job_id, p in list(self._children.items()):
            code = p.poll()
            if code is not None:
                self._exit_codes[p.pid] = code
                if self._children.pop(job_id, None) is p:  # a request's thread may reap too
                    self._never_started(job_id, p.pid, code)
        while len(self._exit_codes) > 1024:
            try:
                del self._exit_codes[next(iter(self._exit_codes))]
            except (KeyError, RuntimeError, StopIteration):
                break

    def _never_started(self, job_id: str, pid: int, code: int) -> None:
        """A job host that exited before it recorded itself (its interpreter could not start it):
        the job failed here, saying why, instead of "starting" for ever."""
        st = self._read_state(job_id)
        if st is None or st.get("state") in TERMINAL or st.get("jobhost_pid"):
            return
        why = (read_tail(os.path.join(self.root, job_id, "jobhost.stderr"), 400) or b"").decode(
            "utf-8", "replace").strip()
        how = "was killed by signal %d" % -code if code < 0 else "exited %d" % code
        if os.path.exists(os.path.join(self.root, job_id, STOP_FILE)):  # stopped before it began
            st.update(state="stopped", ended=time.time(), cause={
                "message": "stopped by request before the job host (pid %d) started" % pid})
        else:
            st.update(state="failed", ended=time.time(), cause={
                "host": st.get("host"), "rank": None, "jobhost_pid": pid, "signal": -code if code < 0 else None,
                "message": "the job host (pid %d) %s before it started%s" % (pid, how, ": " + why if why else "")})
        try:
            write_json(os.path.join(self.root, job_id, "state.json"), st)
        except OSError:
            pass

    def busy(self) -> bool:
        self.reap()
        return any(s.get("state") not in TERMINAL for s in self._states().values())

    def _death_cause(self, st: Dict[str, Any]) -> Dict[str, Any]:
        pid = st["jobhost_pid"]
        if pid not in self._exit_codes:
            # It died after the last reap (supervise reaps, then looks which job hosts are
            # gone): collect it now, or its signal would be unknown ("died").
            self.reap()
        code = self._exit_codes.get(pid)
        if code is not None and code < 0:
            how = "was killed by signal %d" % -code
        elif code is not None:
            how = "exited %d without recording an end" % code
        else:
            how = "died"
        msg = "job host process %s %s; the job's processes on this host were stopped" % (pid, how)
        job_dir = os.path.join(self.root, str(st.get("job_id")))
        mb = free_mb(job_dir)
        if mb is not None and mb < 1.0:  # what most likely killed it
            msg = resource_message(OSError(errno.ENOSPC, "No space left on device"), job_dir) + "; " + msg
        return {"host": st.get("host"), "rank": None, "jobhost_pid": pid,
                "signal": -code if code is not None and code < 0 else None, "message": msg}

    def quiet(self) -> bool:
        """Nothing here can change by itself: no job was live at the last ``supervise``, and no
        job host of this daemon runs or is being started (a start always comes through it)."""
        return self._live == 0 and not self._children and not self._pending

    def supervise(self) -> None:
        """The daemon's watch over job hosts: a job host that died leaves no process behind (its
        ranks are stopped by the job tag), and the job fails with a cause naming it."""
        self.reap()
        self._expire_pending()
        dead = []
        live = 0
        for job_id, st in self._states(raw=True).items():
            if st.get("state") not in TERMINAL:
                live += 1
                if st.get("jobhost_pid") and not pid_alive(st["jobhost_pid"]):
                    dead.append((job_id, st))
        self._live = live
        for job_id, st in dead:
            if sweep(job_id, signal.SIGTERM):
                deadline = time.monotonic() + ORPHAN_GRACE_S
                while processes_with_tag(job_id) and time.monotonic() < deadline:
                    time.sleep(0.1)
                for _ in range(20):
                    if not sweep(job_id, signal.SIGKILL):
                        break
                    time.sleep(0.1)
            boxes = [st.get("container")] + list(st.get("containers") or [])  # a pool job may have several
            names = sorted({str(b["name"]) for b in boxes if isinstance(b, dict) and b.get("name")})
            runtimes = {str(b["name"]): str(b.get("runtime") or "podman") for b in boxes
                        if isinstance(b, dict) and b.get("name")}
            state_dir = os.path.dirname(self.root)
            for name in names:  # its process ended with the sweep; podman's own cleanup of a --rm
                # container needs the store's settings, which it is not given (docker's daemon
                # removes its own; an apptainer instance holds no process of the job's)
                runtime = runtimes[name]
                env = containers.store_env(state_dir) if runtime == "podman" else {}
                containers.remove(name, env, runtime, state_dir)
            st.update(state="failed", ended=time.time(), cause=self._death_cause(st))
            try:
                write_json(os.path.join(self.root, job_id, "state.json"), st)
            except OSError:
                pass

    # -- reading ------------------------------------------------------------------------------

    def _read_state(self, name: str) -> Optional[Dict[str, Any]]:
        """A job's state.json, read again only when it changed: the daemon looks at every job
        each second, and ended jobs (most of them) never change."""
        path = os.path.join(self.root, name, "state.json")
        try:
            stamp = os.stat(path)
        except OSError:
            self._state_cache.pop(name, None)
            return None
        key = (stamp.st_mtime_ns, stamp.st_size, stamp.st_ino)
        hit = self._state_cache.get(name)
        if hit is not None and hit[0] == key:
            return dict(hit[1])
        st = read_json(path)
        if st is not None:
            self._state_cache[name] = (key, st)
        return dict(st) if st is not None else None

    def _states(self, raw: bool = False) -> Dict[str, Dict[str, Any]]:
        out = {}  # type: Dict[str, Dict[str, Any]]
        try:
            names = os.listdir(self.root)
        except OSError:
            return out
        for name in names:
            st = self._state(name, raw)
            if st is not None:
                out[name] = st
        return out

    def _state(self, name: str, raw: bool = False) -> Optional[Dict[str, Any]]:
        """One job's state (without ``raw``: failed when its job host died)."""
        if not name or name.startswith(".") or "/" in name:
            return None
        st = self._read_state(name)
        if st is None:
            return None
        if not raw and st.get("state") not in TERMINAL and st.get("jobhost_pid") and not pid_alive(st["jobhost_pid"]):
            st["state"] = "failed"  # the job host died; the watcher is stopping what it left
            st["cause"] = st.get("cause") or self._death_cause(st)
        return st

    def list(self) -> List[Dict[str, Any]]:
        out = []
        for job_id, st in sorted(self._states().items()):
            plan = read_json(os.path.join(self.root, job_id, "plan.json")) or {}
            nodes = plan.get("nodes") or []
            mine = plan.get("node_indices") or [plan.get("node_index", 0)]
            gpus = [g for i in mine if 0 <= int(i) < len(nodes) for g in nodes[int(i)].get("gpus") or []]
            out.append({**st, "name": plan.get("name"), "gpus": gpus,
                        "nodes": plan.get("nodes"), "launcher": plan.get("launcher")})
        return out

    def status(self, job_id: str) -> Dict[str, Any]:
        """The job here: its state, its ranks, each rank's last loss (read from file tails: as
        fast for a rank that printed a gigabyte as for one that printed a line) and the links to
        experiment trackers its ranks printed (``agent.trackers``: small files of their own)."""
        d = self.job_dir(job_id)
        st = self._state(job_id)  # this job's file only: hosts keep hundreds of ended jobs
        if st is None:
            raise JobError("no job %s on this host" % job_id)
        # A rank that ended by a stop (the user's, max_runtime's, or its replica's once the primary
        # succeeded or its evaluator failed) is "stopped", not "failed": its exit says how it ended.
        stopped_ranks = {int(r) for rep in st.get("replicas") or [] if rep.get("state") in ("stopping", "stopped")
                         for r in rep.get("ranks") or []}
        ranks = []
        ending = {}  # type: Dict[int, bool]  # rank -> ended (exit record) or on its way out (exit mark)
        for path in sorted(glob.glob(os.path.join(d, "ranks", "rank-*.json"))):
            if path.endswith(".exit.json"):
                continue
            rec = read_json(path)
            if rec is None:
                continue
            ex = read_json(path[: -len(".json")] + ".exit.json")
            if isinstance(rec.get("rank"), int):
                ending[rec["rank"]] = ex is not None or stacks.exiting(d, rec["rank"], rec.get("pid"))
            if ex is not None:
                rstate = "exited" if ex.get("exit_code") == 0 and not ex.get("error") else "failed"
            else:
                rstate = "running" if pid_alive(rec.get("pid")) else "lost"
            if rstate in ("failed", "lost") and (st.get("state") == "stopped" or rec.get("rank") in stopped_ranks):
                rstate = "stopped"  # a SIGKILL after the grace leaves no exit record: "lost" otherwise
            ranks.append({**rec, "state": rstate, "exit_code": (ex or {}).get("exit_code"),
                          "signal": (ex or {}).get("signal")})
        ranks.sort(key=lambda r: r["rank"])
        last = {}
        progress = {}  # rank -> its newest step record: the controller's hang watch reads it
        marks = (read_json(os.path.join(d, "attempts.json")) or {}).get("attempts") or [] if (
            st.get("state") not in TERMINAL) else []
        for rank in sorted(set(self.log_ranks(job_id)) | set(self._metric_ranks(d))):
            rec = _last_record(os.path.join(d, "metrics", "rank-%d.jsonl" % rank)) or _last_record(
                os.path.join(d, "metrics", "rank-%d.stdout.jsonl" % rank))
            if rec is not None:
                last[str(rank)] = _wire_safe(rec)
            if st.get("state") in TERMINAL:
                continue
            steps = [p for p in (_last_step(os.path.join(d, "metrics", name % rank), marks) for name in (
                "rank-%d.jsonl", "rank-%d.stdout.jsonl", "defs-rank-%d.jsonl")) if p is not None]
            sections = _sections(os.path.join(d, "metrics", "rank-%d.jsonl" % rank), marks)
            newest = max(steps, key=lambda p: (p["attempt"], p["step"])) if steps else None
            if sections is not None and (newest is None or newest["attempt"] < sections["attempt"]):
                newest = {"step": None, "attempt": sections["attempt"]}  # in a section before its first step
            if newest is not None and sections is not None and newest["attempt"] == sections["attempt"]:
                newest = {**newest, "sections": sections["sections"], "ended": sections["ended"]}
            if newest is not None:
                if ending.get(rank):  # past its last step, on its way out: its silence is no hang
                    newest = {**newest, "exiting": True}
                progress[str(rank)] = _wire_safe(newest)
        # What the job left once it has ended (a look through every process's environment, too
        # dear for each look at a running job; None while it runs): its tagged processes, plus
        # its job host while that still lives (it carries no tag, and holds the job's GPU claims
        # until it exits), and the GPUs this host still has claimed for it (None: the claim
        # directory was busy, ask again). A stop is done here when both are nothing.
        tagged = None  # type: Optional[int]
        claims_held = None  # type: Optional[List[int]]
        if st.get("state") in TERMINAL:
            tagged = len(processes_with_tag(job_id))
            if _runs_jobhost(st.get("jobhost_pid"), d) and pid_alive(st.get("jobhost_pid")):
                tagged += 1
            try:
                held = gpu_claims.held()
            except gpu_claims.ClaimError:
                held = {}  # a claim directory not to trust holds no claim of this job's
            claims_held = None if held is None else sorted(
                g for g, h in held.items() if h.get("job_id") == job_id)
        idle = st.get("idle")
        if isinstance(idle, dict) and isinstance(idle.get("at"), (int, float)) and isinstance(
                idle.get("stalled_s"), (int, float)):  # its ranks asleep, no step: for how long now
            since = max(0.0, time.time() - float(idle["at"]))
            idle = dict(idle, stalled_s=round(float(idle["stalled_s"]) + since, 3))
            if isinstance(idle.get("asleep_s"), (int, float)):
                idle["asleep_s"] = round(float(idle["asleep_s"]) + since, 3)
            st = {**st, "idle": idle}
        return {**st, "ranks": ranks, "log_ranks": self.log_ranks(job_id), "last_metrics": last,
                "tagged_processes": tagged, "claims_held": claims_held, "progress": progress,
                "links": read_links(d)}

    def read_chunk(self, path: str, offset: int, max_bytes: int, final: bool = False) -> Tuple[bytes, int, bool]:
        """Complete lines from logical ``offset``: (bytes, next offset, more waiting).

        A line longer than ``max_bytes`` comes in pieces, cut between characters, so one endless
        line (a progress bar redrawn with ``\\r``) cannot stall a reader. With ``final`` (its
        writer has exited) an unterminated last line comes too. Offsets only ever advance by
        what was returned: nothing is skipped or sent twice (bytes a capped log dropped come as
        one marker line)."""
        max_bytes = max(1, min(int(max_bytes), MAX_CHUNK))
        return read_log(path, offset, max_bytes, final)

    def logs(self, job_id: str, rank: int, offset: int = 0, max_bytes: int = MAX_CHUNK,
             binary: bool = False) -> Dict[str, Any]:
        """A chunk of a rank's log. ``partial``: it ends inside a line (the rest follows).
        ``binary``: the bytes as they are, in base64 (text replaces invalid UTF-8)."""
        d = self.job_dir(job_id)
        data, nxt, more = self.read_chunk(os.path.join(d, "logs", "rank-%d.log" % int(rank)), offset, max_bytes,
                                          final=_rank_ended(d, int(rank)))
        out = {"rank": rank, "offset": offset, "next_offset": nxt, "more": more,
               "partial": bool(data) and not data.endswith(b"\n")}  # type: Dict[str, Any]
        if binary:
            out["b64"] = base64.b64encode(data).decode("ascii")
        else:
            out["text"] = data.decode("utf-8", "replace")
        return out

    def log_ranks(self, job_id: str) -> List[int]:
        d = self.job_dir(job_id)
        out = []
        for p in glob.glob(os.path.join(d, "logs", "rank-*.log")):
            m = re.search(r"rank-(\d+)\.log$", p)
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    def metrics(self, job_id: str, offsets: Dict[str, int], max_bytes: int = MAX_CHUNK) -> Dict[str, Any]:
        """Metrics lines per rank from the given offsets: the rank's own metrics file, or the loss
        its wrapper parsed from its output for ranks without one; and a sweep's metrics, when
        there are any.

        Each part names the offset it advanced (``offset_key``): ``"R"`` into the rank's metrics
        file, ``"R/stdout"`` into its parsed output. The two never mix, so a reader that keeps
        offsets by ``offset_key`` reads a metrics file from its start once it appears. Two more
        parts, keyed by their offset key: ``"0/defs"``, what rank 0's wrapper found with the
        spec's metric definitions (a byte offset too), and ``"R/hypertune"`` for what
        cloudml-hypertune reported on this host, R being the host's first rank. hypertune rewrites
        its file, so that offset is the newest entry's timestamp in microseconds instead.
        Every record carries ``restart``: the attempt that wrote it."""
        d = self.job_dir(job_id)
        marks = (read_json(os.path.join(d, "attempts.json")) or {}).get("attempts") or []
        out = {}  # type: Dict[str, Any]
        for rank in self._metric_ranks(d):
            key = str(rank)
            mpath = os.path.join(d, "metrics", "rank-%d.jsonl" % rank)
            okey = key
            if not os.path.exists(mpath):
                mpath = os.path.join(d, "metrics", "rank-%d.stdout.jsonl" % rank)
                okey = key + STDOUT_SUFFIX
            source = "stdout" if okey != key else "metrics"
            out[key] = self._appended_part(d, marks, rank, mpath, okey, offsets.get(okey, 0), max_bytes, source)
        dpath = os.path.join(d, "metrics", "defs-rank-%d.jsonl" % DEFS_RANK)
        if os.path.exists(dpath):
            out[DEFS_KEY] = self._appended_part(d, marks, DEFS_RANK, dpath, DEFS_KEY, offsets.get(DEFS_KEY, 0),
                                                max_bytes, "metric_definitions")
        first = _first_rank_here(d)
        if first is not None:
            hkey = "%d%s" % (first, HYPERTUNE_SUFFIX)
            part = _hypertune_part(os.path.join(d, "metrics", HYPERTUNE_FILE), first, hkey,
                                   offsets.get(hkey, 0), marks)
            if part is not None:
                out[hkey] = part
        return out

    def _appended_part(self, d: str, marks: List[Dict[str, Any]], rank: int, mpath: str, okey: str,
                       start: int, max_bytes: int, source: str) -> Dict[str, Any]:
        """The records of a file of JSON lines that only grows, from byte ``start``."""
        data, nxt, more = self.read_chunk(mpath, start, max_bytes, final=_rank_ended(d, rank))
        if more and data and not data.endswith(b"\n"):  # one record longer than a chunk: whole
            data, nxt, more = read_log(mpath, start, 4 * MAX_CHUNK, _rank_ended(d, rank))
        records = []
        pos = start
        name = os.path.basename(mpath)
        for line in data.split(b"\n"):
            line_at, pos = pos, pos + len(line) + 1
            recs = _jsonl(line.decode("utf-8", "replace"))
            if not recs:
                continue
            rec = recs[0]
            if "restart" not in rec:
                rec["restart"] = _attempt_at(marks, name, line_at)
            records.append(_wire_safe(rec))
        return {"source": source, "records": records, "next_offset": nxt, "more": more, "offset_key": okey}

    def _metric_ranks(self, d: str) -> List[int]:
        out = set()
        for p in glob.glob(os.path.join(d, "metrics", "rank-*.jsonl")):
            m = re.search(r"rank-(\d+)(?:\.stdout)?\.jsonl$", p)
            if m:
                out.add(int(m.group(1)))
        return sorted(out)

    def gc(self, max_age_s: Optional[float], max_jobs: Optional[int]) -> Dict[str, Any]:
        """Remove the directories of ended jobs past retention: older than ``max_age_s`` (since
        they ended), or beyond the newest ``max_jobs``. Never a job that runs, or one any process
        still carries the tag of."""
        ended = []
        kept_running = []
        for job_id, st in self._states().items():
            if st.get("state") not in TERMINAL:
                kept_running.append(job_id)
                continue
            ended.append((float(st.get("ended") or st.get("started") or 0), job_id))
        ended.sort(reverse=True)
        now = time.time()
        removed = []
        for i, (when, job_id) in enumerate(ended):
            too_old = max_age_s is not None and now - when > max_age_s
            too_many = max_jobs is not None and i >= max_jobs
            if not (too_old or too_many) or job_id in self._pending or processes_with_tag(job_id):
                continue
            shutil.rmtree(os.path.join(self.root, job_id), ignore_errors=True)
            self._last_states.pop(job_id, None)
            self._state_cache.pop(job_id, None)
            removed.append(job_id)
        if max_age_s is not None:  # a queued Slurm job's templates no node used (agent/slurmstep.py)
            for path in glob.glob(os.path.join(self.root, ".slurm-*.template.json")):
                try:
                    if now - os.stat(path).st_mtime > max_age_s:
                        os.unlink(path)
                except OSError:
                    pass
        return {"removed": sorted(removed), "running": sorted(kept_running),
                "kept": len(ended) - len(removed)}

    def healing_here(self) -> Dict[str, List[int]]:
        """The live jobs whose job host heals them in place (their plan's ``heal``), each with
        its GPUs here: the daemon tells them of their GPUs' health (``tell_gpu_health``)."""
        out = {}  # type: Dict[str, List[int]]
        for job_id, st in self._states().items():
            if st.get("state") in TERMINAL:
                continue
            plan = read_json(os.path.join(self.root, job_id, "plan.json")) or {}
            if (plan.get("heal") or {}).get("by") != "host":
                continue
            nodes = plan.get("nodes") or []
            i = int(plan.get("node_index") or 0)
            gpus = [int(g) for g in (nodes[i].get("gpus") or [] if 0 <= i < len(nodes) else [])]
            if gpus:
                out[job_id] = gpus
        return out

    def tell_gpu_health(self, jobs: Dict[str, List[int]], bad: List[Dict[str, Any]],
                        spare: Optional[List[int]] = None) -> None:
        """Write each job's GPUs that are not ok into its ``gpu-health.json`` at the first
        judgment and when that changed, with this host's ``spare`` GPUs (healthy, unused,
        unclaimed: where its job host may move ranks off a failed one): GPU health is judged in
        the daemon's memory, and a job host healing in place must not restart its ranks on a card
        that failed (agent/jobhost.py reads it)."""
        for job_id, gpus in jobs.items():
            mine = [g for g in bad if g.get("index") in gpus]
            path = os.path.join(self.root, job_id, GPU_HEALTH_FILE)
            old = read_json(path)
            if old is None or (old.get("gpus", []), old.get("spare", [])) != (mine, list(spare or [])):
                try:
                    write_json(path, {"gpus": mine, "spare": list(spare or []), "at": time.time()})
                except OSError:
                    pass  # a full disk: the controller's look still sees the GPU

    def changes(self) -> List[Dict[str, Any]]:
        """Jobs whose state changed since the last call (for the daemon's job events)."""
        out = []
        for job_id, st in self._states().items():
            key = "%s/%s/%s" % (st.get("state"), st.get("restart_count"), bool(st.get("cause")))
            if self._last_states.get(job_id) != key:
                self._last_states[job_id] = key
                out.append(st)
        return out


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _attempt_at(marks: List[Dict[str, Any]], name: str, offset: int) -> int:
    """The attempt whose metrics began at or before ``offset`` in metrics file ``name``."""
    attempt = 0
    for m in marks:
        if int((m.get("sizes") or {}).get(name, 0)) <= offset:
            attempt = max(attempt, int(m.get("restart_count") or 0))
    return attempt


def _attempt_at_time(marks: List[Dict[str, Any]], when: float) -> int:
    """The attempt that had begun by ``when`` (a mark from an agent that did not record start
    times counts as begun from the first)."""
    attempt = 0
    for m in marks:
        if float(m.get("started") or 0) <= when:
            attempt = max(attempt, int(m.get("restart_count") or 0))
    return attempt


def _first_rank_here(d: str) -> Optional[int]:
    """The lowest global rank of this host's node, from the plan in the job dir (None if it does
    not say)."""
    plan = read_json(os.path.join(d, "plan.json")) or {}
    try:
        return min(global_ranks(plan, int(plan["node_index"])))
    except (KeyError, TypeError, ValueError):  # no node_index, no nodes, a node without slots
        return None


def _number(v: Any) -> Optional[float]:
    """``v`` as a float: a JSON number or a string of one (hypertune writes strings)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        return None
    try:
        return float(v)
    except ValueError:
        return None


def hypertune_record(entry: Any, rank: int) -> Optional[Dict[str, Any]]:
    """A metrics record from one entry of cloudml-hypertune's file (``{"global_step": "1000",
    "<tag>": "0.987", "timestamp": 1525851440.12, "trial": "1", "checkpoint_path": ""}``), or
    None for one that is not such an entry: no finite timestamp, a step that is no whole number,
    no metric. A missing step is 0, as hypertune writes one it was not given."""
    if not isinstance(entry, dict):
        return None
    when = _number(entry.get("timestamp"))
    step = _number(entry.get("global_step", 0))
    if when is None or not math.isfinite(when) or step is None or not step.is_integer():
        return None
    rec = {"rank": rank, "step": int(step), "time": when, "source": "hypertune"}  # type: Dict[str, Any]
    found = False
    for key, value in entry.items():
        if key in HYPERTUNE_RESERVED or key in RECORD_KEYS:
            continue
        number = _number(value)
        if number is not None:
            rec[key] = number
            found = True
    if not found:
        return None
    if entry.get("trial") is not None:
        rec["trial"] = str(entry["trial"])
    return rec


def _micros(when: float) -> int:
    return int(round(when * 1e6))


def _hypertune_part(path: str, rank: int, okey: str, since_us: int,
                    marks: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """hypertune's entries newer than ``since_us`` (µs since the epoch), oldest first, or None
    when there is no file. hypertune rewrites the whole file on each report (its last 100), so a
    byte offset means nothing there; an entry's timestamp does. A line being written as we read
    (or any line that is no entry) is skipped: a complete one has a later timestamp than every
    entry before it, so it comes in a later reply."""
    data = read_tail(path, MAX_CHUNK)  # hypertune's 100 entries fit many times over
    if data is None:
        return None
    records = []
    for line in data.split(b"\n"):
        try:
            entry = json.loads(line.decode("utf-8", "replace"))
        except ValueError:
            continue
        rec = hypertune_record(entry, rank)
        if rec is not None and _micros(rec["time"]) > since_us:
            rec["restart"] = _attempt_at_time(marks, rec["time"])
            records.append(rec)
    records.sort(key=lambda r: r["time"])
    nxt = max([since_us] + [_micros(r["time"]) for r in records])
    return {"source": "hypertune", "records": records, "next_offset": nxt, "more": False, "offset_key": okey}


EPHEMERAL_DEFAULT = (32768, 60999)
# Ports handed out lately (port -> monotonic time): two jobs launched close together never get the
# same one, although neither has bound it yet.
_HANDED: Dict[int, float] = {}
_HANDED_FOR = 120.0


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> Tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections (Linux's default when
    unreadable)."""
    try:
        with open(path) as f:
            lo, hi = (int(x) for x in f.read().split()[:2])
        if 1 <= lo <= hi <= 65535:
            return lo, hi
    except (OSError, ValueError):
        pass
    return EPHEMERAL_DEFAULT


def port_candidates(ephemeral: Tuple[int, int], count: int = 64, rng: Any = None) -> List[int]:
    """Random ports outside the ephemeral range, where the first probe looks for a MASTER_PORT.

    A port inside it can be taken, between the probe and the rank's bind, as the local port of any
    outgoing connection on the host (another job's gloo or NCCL mesh, an ssh session); one below
    it is only ever bound on purpose. Below the range first (torch's own default, 29500, is
    there), above it when the range starts too low to leave room."""
    import random
    r = rng or random.Random()
    lo, hi = ephemeral
    pools: List[Tuple[int, int]] = []
    if lo - 1 >= 10000:
        pools.append((max(10000, lo - 20000), lo - 1))
    if hi + 1 <= 65535 - 1000:
        pools.append((hi + 1, 65535))
    if not pools:
        return []
    out: List[int] = []
    for _ in range(count):
        a, b = pools[0] if len(pools) == 1 or r.random() < 0.8 else pools[1]
        out.append(r.randint(a, b))
    return out


def _bindable(family: int, addr: str, port: int) -> bool:
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.bind((addr, port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def probe_port(addr: str) -> int:
    """A TCP port free on ``addr`` right now (for MASTER_PORT), outside the kernel's ephemeral
    range when one there is free (see ``port_candidates``) and not one handed out in the last two
    minutes; the socket is closed at once."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    now = time.monotonic()
    for p, t in list(_HANDED.items()):
        if now - t > _HANDED_FOR:
            del _HANDED[p]
    for port in port_candidates(ephemeral_range()):
        if port not in _HANDED and _bindable(family, addr, port):
            _HANDED[port] = now
            return port
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.bind((addr, 0))
        port = int(s.getsockname()[1])
    finally:
        s.close()
    _HANDED[port] = now
    return port
