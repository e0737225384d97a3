"""The daemon's side of jobs: start a job host process, stop it, and read what the job left on disk.

Everything a job knows lives in its directory (``<state_dir>/jobs/<job_id>/``): the plan, the
job host's ``state.json``, one log and one metrics file per rank, and rank records. The daemon
only reads those, so it can restart (or upgrade) without losing anything. Stdlib only, 3.9+.
"""
from __future__ import annotations

import glob
import json
import os
import re
import signal
import socket
import subprocess
import time
from typing import Any, Dict, List, Optional, Tuple

from agent.jobhost import TERMINAL, processes_with_tag, read_json, sweep
from agent.rankexec import write_json

JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
MAX_CHUNK = 256 * 1024
STDOUT_SUFFIX = "/stdout"  # job_metrics offsets into a rank's log (loss parsed from stdout)
DEFAULT_LOSS_RE = re.compile(
    r"""(?<![A-Za-z0-9_])['"]?loss['"]?\s*[:=]?\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)""",
    re.IGNORECASE,
)
STEP_RE = re.compile(r"""(?<![A-Za-z0-9_])['"]?(?:step|iter|iteration)['"]?\s*[:=]?\s*(\d+)""", re.IGNORECASE)
ANSI_CSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")  # colours and the like, in coloured logs


class JobError(Exception):
    pass


def _pid_alive(pid: Optional[int]) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _rank_ended(job_dir: str, rank: int) -> bool:
    """The rank's wrapper has recorded its exit: its log and metrics file are complete."""
    return os.path.exists(os.path.join(job_dir, "ranks", "rank-%d.exit.json" % rank))


def _utf8_boundary(data: bytes) -> int:
    """The longest prefix of ``data`` that does not end inside a UTF-8 character (never 0)."""
    j = len(data) - 1
    while j > 0 and len(data) - j < 4 and data[j] & 0xC0 == 0x80:
        j -= 1
    lead = data[j]
    need = 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    return len(data) if j + need <= len(data) or j == 0 else j


def _losses(text: str, rank: int, rx: Any) -> List[Dict[str, Any]]:
    """A record for each line of ``text`` with a loss ``rx`` finds: its loss, and its step if the
    line names one."""
    records = []  # type: List[Dict[str, Any]]
    for line in text.splitlines():
        if "\x1b" in line:
            line = ANSI_CSI_RE.sub("", line)
        m = rx.search(line)
        if not m:
            continue
        try:
            loss = float(m.group("loss") if "loss" in rx.groupindex else m.group(1))
        except (ValueError, IndexError):
            continue
        rec = {"rank": rank, "loss": loss}  # type: Dict[str, Any]
        s = STEP_RE.search(line)
        if s:
            rec["step"] = int(s.group(1))
        records.append(rec)
    return records


class Jobs:
    def __init__(self, state_dir: str, agent_command: List[str]):
        self.root = os.path.join(state_dir, "jobs")
        self.agent_command = agent_command
        self._children = {}  # type: Dict[str, subprocess.Popen]
        self._last_states = {}  # type: Dict[str, str]
        self._loss_counts = {}  # type: Dict[Tuple[str, int], int]  # (log, offset) -> loss lines before
        os.makedirs(self.root, mode=0o700, exist_ok=True)

    def job_dir(self, job_id: str) -> str:
        if not isinstance(job_id, str) or not JOB_ID_RE.match(job_id):
            raise JobError("bad job id %r" % (job_id,))
        return os.path.join(self.root, job_id)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, plan: Dict[str, Any]) -> Dict[str, Any]:
        for key in ("job_id", "launcher", "command", "nodes", "node_index", "master_addr", "master_port"):
            if key not in plan:
                raise JobError("plan lacks %r" % key)
        d = self.job_dir(plan["job_id"])
        current = read_json(os.path.join(d, "state.json"))
        if current and current.get("state") not in TERMINAL and _pid_alive(current.get("jobhost_pid")):
            raise JobError("job %s is already running here (pid %s)" % (plan["job_id"], current.get("jobhost_pid")))
        os.makedirs(d, mode=0o755, exist_ok=True)
        # A restart reuses the directory: logs and metrics go on; rank records start afresh.
        for f in glob.glob(os.path.join(d, "ranks", "*")):
            os.unlink(f)
        write_json(os.path.join(d, "plan.json"), plan)
        write_json(os.path.join(d, "state.json"), {
            "job_id": plan["job_id"], "state": "starting", "host": plan["nodes"][plan["node_index"]]["host"],
            "restart_count": plan.get("restart_count", 0), "started": time.time(), "ended": None,
            "cause": None, "jobhost_pid": None,
        })
        with open(os.devnull, "rb") as devnull, open(os.path.join(d, "jobhost.stderr"), "ab") as err:
            proc = subprocess.Popen(
                self.agent_command + ["jobhost", "--job-dir", d],
                stdin=devnull, stdout=err, stderr=err, start_new_session=True, cwd=d,
            )
        self._children[plan["job_id"]] = proc
        return {"job_dir": d, "jobhost_pid": proc.pid}

    def stop(self, job_id: str, grace_s: Optional[float] = None) -> Dict[str, Any]:
        d = self.job_dir(job_id)
        st = read_json(os.path.join(d, "state.json"))
        if st is None:
            raise JobError("no job %s on this host" % job_id)
        if grace_s is not None:
            plan = read_json(os.path.join(d, "plan.json")) or {}
            plan["grace_s"] = float(grace_s)
            write_json(os.path.join(d, "plan.json"), plan)  # the job host reads it when stopping
        pid = st.get("jobhost_pid")
        if st.get("state") in TERMINAL:
            swept = sweep(job_id)
            return {"state": st["state"], "swept": swept}
        if _pid_alive(pid):
            try:
                os.kill(pid, signal.SIGTERM)  # the job host runs the grace period and the sweep
            except OSError:
                pass
            return {"state": "stopping"}
        # No job host (it crashed): do its work here.
        swept = sweep(job_id, signal.SIGTERM)
        time.sleep(0.5)
        swept += sweep(job_id)
        st.update(state="stopped", ended=time.time(), cause={"message": "stopped; job host was gone"})
        write_json(os.path.join(d, "state.json"), st)
        return {"state": "stopped", "swept": swept}

    def reap(self) -> None:
        for job_id, p in list(self._children.items()):
            if p.poll() is not None:
                del self._children[job_id]

    def busy(self) -> bool:
        self.reap()
        return any(s.get("state") not in TERMINAL for s in self._states().values())

    # -- reading ------------------------------------------------------------------------------

    def _states(self) -> Dict[str, Dict[str, Any]]:
        out = {}
        try:
            names = os.listdir(self.root)
        except OSError:
            return out
        for name in names:
            st = read_json(os.path.join(self.root, name, "state.json"))
            if st is None:
                continue
            if st.get("state") not in TERMINAL and st.get("jobhost_pid") and not _pid_alive(st["jobhost_pid"]):
                st["state"] = "failed"  # the job host died without recording an end
                st["cause"] = st.get("cause") or {"message": "job host process %s died" % st["jobhost_pid"]}
            out[name] = st
        return out

    def list(self) -> List[Dict[str, Any]]:
        out = []
        for job_id, st in sorted(self._states().items()):
            plan = read_json(os.path.join(self.root, job_id, "plan.json")) or {}
            node = (plan.get("nodes") or [{}])[plan.get("node_index", 0)] if plan.get("nodes") else {}
            out.append({**st, "name": plan.get("name"), "gpus": node.get("gpus", []),
                        "nodes": plan.get("nodes"), "launcher": plan.get("launcher")})
        return out

    def status(self, job_id: str) -> Dict[str, Any]:
        d = self.job_dir(job_id)
        st = self._states().get(job_id)
        if st is None:
            raise JobError("no job %s on this host" % job_id)
        ranks = []
        for path in sorted(glob.glob(os.path.join(d, "ranks", "rank-*.json"))):
            if path.endswith(".exit.json"):
                continue
            rec = read_json(path)
            if rec is None:
                continue
            ex = read_json(path[: -len(".json")] + ".exit.json")
            if ex is not None:
                rstate = "exited" if ex.get("exit_code") == 0 else "failed"
            else:
                rstate = "running" if _pid_alive(rec.get("pid")) else "lost"
            ranks.append({**rec, "state": rstate, "exit_code": (ex or {}).get("exit_code"),
                          "signal": (ex or {}).get("signal")})
        ranks.sort(key=lambda r: r["rank"])
        return {**st, "ranks": ranks, "log_ranks": self.log_ranks(job_id),
                "tagged_processes": len(processes_with_tag(job_id))}

    def read_chunk(self, path: str, offset: int, max_bytes: int, final: bool = False) -> Tuple[str, int, bool]:
        """Complete lines from ``offset``: (text, next offset, more waiting).

        A line longer than ``max_bytes`` comes in pieces, cut between characters, so one endless
        line (a progress bar redrawn with ``\\r``) cannot stall a reader. With ``final`` (its
        writer has exited) an unterminated last line comes too. Offsets only ever advance by
        what was returned: nothing is skipped or sent twice."""
        max_bytes = max(1, min(int(max_bytes), MAX_CHUNK))
        try:
            with open(path, "rb") as f:
                f.seek(max(0, int(offset)))
                data = f.read(max_bytes + 1)
        except FileNotFoundError:
            return "", offset, False
        more = len(data) > max_bytes
        data = data[:max_bytes]
        if more or not final:
            cut = data.rfind(b"\n")
            if cut >= 0:
                data = data[: cut + 1]
            elif more:
                data = data[: _utf8_boundary(data)]
            else:
                return "", offset, more
        return data.decode("utf-8", "replace"), offset + len(data), more

    def logs(self, job_id: str, rank: int, offset: int = 0, max_bytes: int = MAX_CHUNK) -> Dict[str, Any]:
        d = self.job_dir(job_id)
        text, nxt, more = self.read_chunk(os.path.join(d, "logs", "rank-%d.log" % int(rank)), offset, max_bytes,
                                          final=_rank_ended(d, int(rank)))
        return {"rank": rank, "text": text, "offset": offset, "next_offset": nxt, "more": more}

    def log_ranks(self, job_id: str) -> List[int]:
        d = self.job_dir(job_id)
        out = []
        for p in glob.glob(os.path.join(d, "logs", "rank-*.log")):
            m = re.search(r"rank-(\d+)\.log$", p)
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    def metrics(self, job_id: str, offsets: Dict[str, int], max_bytes: int = MAX_CHUNK) -> Dict[str, Any]:
        """Metrics lines per rank from the given byte offsets; stdout-parsed loss for ranks with none.

        Each rank's reply names the offset it advanced (``offset_key``): ``"R"`` into the rank's
        metrics file, ``"R/stdout"`` into its log. The two never mix, so a reader that keeps
        offsets by ``offset_key`` reads a metrics file from its start once it appears."""
        d = self.job_dir(job_id)
        plan = read_json(os.path.join(d, "plan.json")) or {}
        out = {}  # type: Dict[str, Any]
        for rank in self.log_ranks(job_id) + self._metric_ranks(d):
            key = str(rank)
            if key in out:
                continue
            mpath = os.path.join(d, "metrics", "rank-%d.jsonl" % rank)
            if os.path.exists(mpath):
                text, nxt, more = self.read_chunk(mpath, offsets.get(key, 0), max_bytes,
                                                  final=_rank_ended(d, rank))
                records = []
                for line in text.splitlines():
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(rec, dict):
                        records.append(rec)
                out[key] = {"source": "metrics", "records": records, "next_offset": nxt, "more": more,
                            "offset_key": key}
            else:
                okey = key + STDOUT_SUFFIX
                part = self._stdout_metrics(d, rank, offsets.get(okey, 0), max_bytes, plan.get("loss_pattern"))
                part["offset_key"] = okey
                out[key] = part
        return out

    def _metric_ranks(self, d: str) -> List[int]:
        out = []
        for p in glob.glob(os.path.join(d, "metrics", "rank-*.jsonl")):
            m = re.search(r"rank-(\d+)\.jsonl$", p)
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    def _stdout_metrics(self, d: str, rank: int, offset: int, max_bytes: int, pattern: Optional[str]) -> Dict[str, Any]:
        """Loss (and step) from a rank's log lines. A loss line without a step number gets the
        count of loss lines before it as its step (``"counted": true``), so that a script which
        only prints its loss still draws a curve; every reader gets the same numbers."""
        rx = re.compile(pattern) if pattern else DEFAULT_LOSS_RE
        path = os.path.join(d, "logs", "rank-%d.log" % rank)
        text, nxt, more = self.read_chunk(path, offset, max_bytes, final=_rank_ended(d, rank))
        seen = self._losses_before(path, offset, rx)
        records = _losses(text, rank, rx)
        for rec in records:
            if "step" not in rec:
                rec["step"] = seen
                rec["counted"] = True
            seen += 1
        self._remember_losses(path, nxt, seen)
        return {"source": "stdout", "records": records, "next_offset": nxt, "more": more}

    def _losses_before(self, path: str, offset: int, rx: Any) -> int:
        """How many loss lines the log holds before ``offset`` (an offset this agent handed out)."""
        if offset <= 0:
            return 0
        n = self._loss_counts.get((path, offset))
        if n is not None:
            return n
        n = pos = 0  # a reader this daemon has not served (it was restarted): count once
        while pos < offset:
            text, nxt, _ = self.read_chunk(path, pos, min(MAX_CHUNK, offset - pos))
            if nxt == pos:
                break
            n += len(_losses(text, 0, rx))
            pos = nxt
        self._remember_losses(path, offset, n)
        return n

    def _remember_losses(self, path: str, offset: int, n: int) -> None:
        """Remember the count of loss lines before ``offset``; the oldest go past 4096 entries."""
        if len(self._loss_counts) >= 4096:
            del self._loss_counts[next(iter(self._loss_counts))]
        self._loss_counts[(path, offset)] = n

    def changes(self) -> List[Dict[str, Any]]:
        """Jobs whose state changed since the last call (for the daemon's job events)."""
        out = []
        for job_id, st in self._states().items():
            key = "%s/%s/%s" % (st.get("state"), st.get("restart_count"), bool(st.get("cause")))
            if self._last_states.get(job_id) != key:
                self._last_states[job_id] = key
                out.append(st)
        return out


def probe_port(addr: str) -> int:
    """A TCP port free on ``addr`` right now (for MASTER_PORT); the socket is closed at once."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.bind((addr, 0))
        return int(s.getsockname()[1])
    finally:
        s.close()
