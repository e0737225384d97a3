"""``agent.pyz rank --job-dir D [--rank R --local-rank L] -- COMMAND...``: the wrapper every rank runs in.

Whatever launched it (the job host process, torchrun or mpirun), it gives each rank the same
bookkeeping:

- the rank's output (stdout and stderr) comes through a pipe and goes to ``logs/rank-<R>.log``,
  capped per rank with rotation (``jobfiles.CappedLog``); loss lines are parsed on the way into
  ``metrics/rank-<R>.stdout.jsonl``, so metrics keep up with a chatty rank whatever the cap drops;
- a sweep's metric definitions (``RIGDECK_METRIC_DEFINITIONS``: SageMaker MetricDefinitions, a
  name and a regex each) are applied to rank 0's output only, into ``metrics/defs-rank-0.jsonl``.
  The rank is the global one under every launcher (``--rank`` from the job host for ``direct``,
  ``RANK`` from torchrun, ``OMPI_COMM_WORLD_RANK`` from mpirun), so exactly one wrapper of the
  job, on the primary, parses them: the nodes never report a metric twice;
- links to experiment trackers (a W&B or MLflow run, TensorBoard) the rank prints are kept in
  ``links/rank-<R>.jsonl`` (``agent.trackers`` knows them), for ``job_status``;
- a ``ranks/rank-<R>.json`` record names the rank's and the wrapper's pids;
- when the rank ends, ``ranks/rank-<R>.exit.json`` records its exit code or signal, the last
  lines it printed, and a resource error (a full disk) if one stopped it;
- the rank joins its job's GPU claims (``agent.claims``) and holds them while it lives;
- the rank dies with the wrapper (``PR_SET_PDEATHSIG``): no training process outlives it.

Signals sent to the wrapper are passed on to the rank. Stdlib only, Python 3.9+.
"""
from __future__ import annotations

import collections
import ctypes
import json
import os
import re
import select
import signal
import subprocess
import sys
import time

from agent import claims, stacks, trackers
from agent.jobfiles import (  # noqa: F401  (write_json and tail: imported from here by others)
    DEFAULT_LOG_CAP,
    CappedLog,
    is_resource_error,
    reserve,
    resource_message,
    tail,
    write_json,
)

TYPE_CHECKING = False  # (mypy reads it as True) typing is not imported by a rank's or job's start
if TYPE_CHECKING:
    from typing import Any, Deque, Dict, List, Optional, Tuple

TAIL_LINES = 20
TAIL_CHARS = 400  # of each tail line kept in the exit record (it must fit its reserve)
EXIT_RESERVE = 16384
CHUNK = 65536
DEFAULT_LOSS_RE = re.compile(
    r"""(?<![A-Za-z0-9_])['"]?loss['"]?\s*[:=]?\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)""",
    re.IGNORECASE,
)
STEP_RE = re.compile(r"""(?<![A-Za-z0-9_])['"]?(?:step|iter|iteration)['"]?\s*[:=]?\s*(\d+)""", re.IGNORECASE)
ANSI_CSI_RE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")  # colours and the like, in coloured logs
MATCH_BYTES = 4096  # loss is looked for in a line's first bytes only
# "OSError: [Errno 28] No space left on device: '/ckpt/step-10.pt'" in a rank's own traceback
ERRNO_LINE_RE = re.compile(r"\[Errno (28|122|30)\] [^:'\n]*(?::\s*'([^']+)')?")
PR_SET_PDEATHSIG = 1
# Keys a metrics record keeps for itself (or a reader adds): never a metric's name.
RECORD_KEYS = ("rank", "step", "time", "source", "counted", "restart", "host", "event")
DEFS_RANK = 0  # the one rank whose output metric definitions read (see the module docstring)


def _first_int(env: Dict[str, str], names: List[str]) -> Optional[int]:
    for n in names:
        v = env.get(n)
        if v is not None and v.strip().lstrip("-").isdigit():
            return int(v)
    return None


def parse_loss(line: str, rank: int, rx: Any) -> Optional[Dict[str, Any]]:
    """A metrics record for one output line that shows a loss: its loss, and its step if the line
    names one."""
    if "\x1b" in line:
        line = ANSI_CSI_RE.sub("", line)
    m = rx.search(line)
    if not m:
        return None
    try:
        loss = float(m.group("loss") if "loss" in rx.groupindex else m.group(1))
    except (ValueError, IndexError):
        return None
    rec = {"rank": rank, "loss": loss}  # type: Dict[str, Any]
    s = STEP_RE.search(line)
    if s:
        rec["step"] = int(s.group(1))
    return rec


class LineParser:
    """Records parsed from a rank's complete output lines (each cut to its first ``MATCH_BYTES``),
    appended to one metrics file: one ``os.write`` per batch with ``O_APPEND``, so a reader never
    sees half a record. Subclasses say what a line gives (:meth:`parse`)."""

    prefilter = None  # type: Optional[bytes]  # lines without it (lower-cased) are skipped unread

    def __init__(self, path: str):
        self.path = path
        self.partial = b""
        self.fd = None  # type: Optional[int]
        self.error = None  # type: Optional[OSError]

    def parse(self, line: str) -> List[Dict[str, Any]]:
        raise NotImplementedError

    def feed(self, data: bytes) -> None:
        data = self.partial + data
        last = data.rfind(b"\n")
        if last < 0:
            self.partial = data[:MATCH_BYTES]
            return
        self.partial = data[last + 1:][:MATCH_BYTES]
        block = data[: last + 1]
        if self.prefilter is not None and self.prefilter not in block.lower():
            return
        out = []
        for raw in block.split(b"\n")[:-1]:
            if self.prefilter is not None and self.prefilter not in raw[:MATCH_BYTES].lower():
                continue
            for rec in self.parse(raw[:MATCH_BYTES].decode("utf-8", "replace")):
                out.append(json.dumps(rec) + "\n")
        if out:
            self._append("".join(out).encode())

    def flush(self) -> None:
        if self.partial:
            self.partial, rest = b"", self.partial
            self.feed(rest + b"\n")

    def _append(self, data: bytes) -> None:
        if self.error is not None:
            return
        try:
            if self.fd is None:
                self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.write(self.fd, data)
        except OSError as e:
            self.error = e


class LossParser(LineParser):
    """Loss records from a rank's output, appended to ``metrics/rank-R.stdout.jsonl``. A loss line
    without a step number gets the count of loss lines before it in this run as its step."""

    def __init__(self, path: str, rank: int, pattern: Optional[str]):
        super().__init__(path)
        self.rank = rank
        self.rx = re.compile(pattern) if pattern else DEFAULT_LOSS_RE
        self.prefilter = None if pattern else b"loss"
        self.count = 0

    def parse(self, line: str) -> List[Dict[str, Any]]:
        rec = parse_loss(line, self.rank, self.rx)
        if rec is None:
            return []
        if "step" not in rec:
            rec["step"] = self.count
            rec["counted"] = True
        self.count += 1
        rec["time"] = time.time()
        return [rec]


class LinkParser(LineParser):
    """Links to experiment trackers in a rank's output (``agent.trackers``), appended to
    ``links/rank-R.jsonl``: each URL once, at most ``trackers.MAX_PER_RANK``. A restarted rank
    starts from what its file holds, so an attempt that prints the same run again adds nothing."""

    prefilter = b"http"

    def __init__(self, path: str, rank: int):
        super().__init__(path)
        self.rank = rank
        self.seen = {rec["url"] for rec in trackers.read_link_file(path)}

    def parse(self, line: str) -> List[Dict[str, Any]]:
        if "\x1b" in line:
            line = ANSI_CSI_RE.sub("", line)
        out = []
        for kind, url in trackers.links_in(line):
            if url not in self.seen and len(self.seen) < trackers.MAX_PER_RANK:
                self.seen.add(url)
                out.append(trackers.link_record(kind, url, self.rank))
        return out


def metric_definitions(raw: Optional[str]) -> List[Tuple[str, Any]]:
    """(name, compiled regex) of each usable definition in ``RIGDECK_METRIC_DEFINITIONS`` (a JSON
    list of SageMaker MetricDefinitions, ``{"name", "regex"}``). One that cannot be used (a bad
    regex, a name a record keeps for itself) is left out, with a line on stderr (the launcher's
    log) saying why: a typo in one definition must not stop the rank or the others."""
    if not raw:
        return []
    try:
        items = json.loads(raw)
    except ValueError as e:
        sys.stderr.write("rigdeck rank: RIGDECK_METRIC_DEFINITIONS is not JSON (%s): ignored\n" % e)
        return []
    out = []  # type: List[Tuple[str, Any]]
    for item in items if isinstance(items, list) else []:
        name = item.get("name") if isinstance(item, dict) else None
        regex = item.get("regex") if isinstance(item, dict) else None
        if not isinstance(name, str) or not name or not isinstance(regex, str) or name in RECORD_KEYS:
            sys.stderr.write("rigdeck rank: metric definition %r skipped: it needs a name (not one of "
                             "%s) and a regex\n" % (item, ", ".join(RECORD_KEYS)))
            continue
        try:
            out.append((name, re.compile(regex)))
        except (re.error, OverflowError, RecursionError) as e:
            sys.stderr.write("rigdeck rank: metric definition %r skipped: bad regex %r: %s\n" % (name, regex, e))
    return out


def definition_value(rx: Any, line: str) -> Optional[float]:
    """The number a definition's regex finds in ``line``: its group named ``value``, else its first
    group (SageMaker's rule). None when it does not match or what it captured is no number."""
    m = rx.search(line)
    if not m:
        return None
    try:
        return float(m.group("value") if "value" in rx.groupindex else m.group(1))
    except (IndexError, TypeError, ValueError):  # no group, a group that did not take part, "abc"
        return None


class DefinitionParser(LineParser):
    """SageMaker-style metric definitions applied to a rank's output, records appended to
    ``metrics/defs-rank-R.jsonl``: one per line and definition that matches, with the line's step
    if it names one, else the count of that definition's matches before it in this run."""

    def __init__(self, path: str, rank: int, definitions: List[Tuple[str, Any]]):
        super().__init__(path)
        self.rank = rank
        self.definitions = definitions
        self.counts = [0] * len(definitions)

    def parse(self, line: str) -> List[Dict[str, Any]]:
        if "\x1b" in line:
            line = ANSI_CSI_RE.sub("", line)
        hits = []
        for i, (name, rx) in enumerate(self.definitions):
            value = definition_value(rx, line)
            if value is not None:
                hits.append((i, name, value))
        if not hits:
            return []
        s = STEP_RE.search(line)
        out = []
        for i, name, value in hits:
            rec = {"rank": self.rank, name: value, "time": time.time(),
                   "source": "metric_definitions"}  # type: Dict[str, Any]
            if s:
                rec["step"] = int(s.group(1))
            else:
                rec["step"] = self.counts[i]
                rec["counted"] = True
            self.counts[i] += 1
            out.append(rec)
        return out


def _die_with_parent(libc: Any, parent: int) -> Any:
    def pre() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)
    return pre


def die_with_parent() -> Any:
    """A ``preexec_fn`` that makes the child get SIGTERM when this process dies (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl  # noqa: B018  (resolve it now, not in the forked child)
    except (OSError, AttributeError):
        return None
    return _die_with_parent(libc, os.getpid())


def _resource_cause(log: CappedLog, parsers: List[LineParser], lines: Deque[bytes]) -> Optional[str]:
    """What a full disk (or a read-only one) did to this rank, if anything."""
    for err, path in [(log.error, log.path)] + [(p.error, p.path) for p in parsers]:
        if err is not None and is_resource_error(err):
            return resource_message(err, path)
    for raw in reversed(lines):  # the rank's own traceback: "[Errno 28] No space left on device: '...'"
        m = ERRNO_LINE_RE.search(raw.decode("utf-8", "replace"))
        if m:
            err = OSError(int(m.group(1)), os.strerror(int(m.group(1))))
            return resource_message(err, m.group(2) or os.getcwd())
    return None


def main(job_dir: str, rank: Optional[int], local_rank: Optional[int], command: List[str],
         standby: bool = False) -> int:
    if standby:  # a warm standby: this wrapper becomes a rank's only when a job host adopts it
        from agent import standby as standbys

        return standbys.serve(job_dir, local_rank or 0, command)
    env = _launcher_env(job_dir)
    if rank is None:
        rank = _first_int(env, ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"])
    if local_rank is None:
        local_rank = _first_int(env, ["LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"])
    if rank is None:
        sys.stderr.write("rigdeck rank: cannot tell this rank's number (no RANK or OMPI_COMM_WORLD_RANK)\n")
        return 127
    run = _prepare(job_dir, env, rank, local_rank if local_rank is not None else 0)
    held = claims.join(int(g) for g in run.gpus)  # the claim lives while this rank lives
    read_fd, write_fd = os.pipe()
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=write_fd, stderr=write_fd, env=env,
                                 pass_fds=held, preexec_fn=die_with_parent())
    except OSError as e:
        return _not_started(run, command, e)
    finally:
        os.close(write_fd)
        for fd in held:
            os.close(fd)

    return run_rank(run, child, read_fd)


def run_rank(run: _RankRun, child: Any, read_fd: int, watch_pid: Optional[int] = None) -> int:
    """The rank ``child`` runs, from its start to its end: signals passed on to it, its record,
    its output pumped (``watch_pid``: see ``_pump``), its exit record; the wrapper's exit code."""
    def forward(signum: int, frame: object) -> None:
        try:
            child.send_signal(signum)
        except OSError:
            pass

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, forward)
    _write_rank_record(run, child.pid)
    last = _pump(run, child, read_fd, forward, watch_pid=watch_pid)
    return _finish(run, child.wait(), last)


class _RankRun:
    """One rank's bookkeeping, passed from the step that sets it up to the ones that feed it
    and close it. (A plain class: ``dataclasses`` would cost every rank's wrapper its import.)"""

    def __init__(self, rank: int, local_rank: int, env: Dict[str, str], gpus: List[str],
                 gpu: Optional[int], ranks: str, exit_path: str, log: CappedLog,
                 parsers: List[LineParser]) -> None:
        self.rank = rank
        self.local_rank = local_rank
        self.env = env  # the rank's environment
        self.gpus = gpus  # this host's GPUs given to the job (RIGDECK_GPUS), in local-rank order
        self.gpu = gpu  # this rank's own
        self.ranks = ranks  # the job's ranks/ directory
        self.exit_path = exit_path  # ranks/rank-R.exit.json, its space reserved
        self.log = log
        self.parsers = parsers


def _launcher_env(job_dir: str) -> Dict[str, str]:
    """The environment the rank starts from: this process's, with this host's own view of the
    cluster under mpirun, without the claim fds meant for the wrapper."""
    env = dict(os.environ)
    if env.get("RIGDECK_LAUNCHER") == "mpirun":
        # mpirun exported the primary's environment to every host: put this host's own view of
        # the cluster (written here by this host's agent, same job path) back on top.
        from agent.clusterfiles import load_node_env

        mine = load_node_env(job_dir)
        if mine:
            env.update(mine)
    env.pop("RIGDECK_CLAIM_FDS", None)
    return env


def _prepare(job_dir: str, env: Dict[str, str], rank: int, local_rank: int) -> _RankRun:
    """rigdeck's rank variables in ``env``, the job's directories, the exit record's space
    (reserved before the rank can fill the disk), the capped log and the metric parsers."""
    # mpirun and torchrun set only their own variables: give every rank rigdeck's too.
    env["RIGDECK_RANK"] = str(rank)
    env["RIGDECK_LOCAL_RANK"] = str(local_rank)
    if env.get("RIGDECK_IN_WORLD") != "0":  # a pool job's ps, reduction server or evaluator is
        env.setdefault("RANK", str(rank))  # not in torch's world: no RANK/LOCAL_RANK for it
        env.setdefault("LOCAL_RANK", str(local_rank))
    gpus = [g for g in env.get("RIGDECK_GPUS", "").split(",") if g]
    gpu = int(gpus[local_rank]) if local_rank < len(gpus) else None
    if gpu is not None and env.get("RIGDECK_LAUNCHER") == "mpirun":
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    # Every Python process of the rank arms faulthandler at start (agent/rankboot), so that a hung
    # job's stacks can be taken before it is stopped (agent/stacks.py).
    env[stacks.ENV_STACKS_DIR] = stacks.rank_stacks_dir(job_dir, rank)
    boot = stacks.boot_dir()
    if boot:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (boot, env.get("PYTHONPATH", "")) if p)
    logs = os.path.join(job_dir, "logs")
    ranks = os.path.join(job_dir, "ranks")
    metrics = os.path.join(job_dir, "metrics")
    for d in (logs, ranks, metrics, os.path.join(job_dir, trackers.LINKS_DIR)):
        os.makedirs(d, exist_ok=True)
    exit_path = os.path.join(ranks, "rank-%d.exit.json" % rank)
    try:
        os.unlink(exit_path)
    except OSError:
        pass
    reserve(exit_path, EXIT_RESERVE)  # so the exit record gets out even when the disk fills up
    try:
        cap = int(env.get("RIGDECK_LOG_CAP") or DEFAULT_LOG_CAP)
    except ValueError:
        cap = DEFAULT_LOG_CAP
    log = CappedLog(os.path.join(logs, "rank-%d.log" % rank), cap)
    parsers = [LossParser(os.path.join(metrics, "rank-%d.stdout.jsonl" % rank), rank,
                          env.get("RIGDECK_LOSS_PATTERN") or None),
               LinkParser(trackers.links_path(job_dir, rank), rank)]  # type: List[LineParser]
    definitions = metric_definitions(env.get("RIGDECK_METRIC_DEFINITIONS")) if rank == DEFS_RANK else []
    if definitions:
        parsers.append(DefinitionParser(os.path.join(metrics, "defs-rank-%d.jsonl" % rank), rank, definitions))
    return _RankRun(rank=rank, local_rank=local_rank, env=env, gpus=gpus, gpu=gpu, ranks=ranks,
                    exit_path=exit_path, log=log, parsers=parsers)


def _not_started(run: _RankRun, command: List[str], e: OSError) -> int:
    """The command could not be started: say so in the rank's log and exit record."""
    log = run.log
    log.write(("rigdeck: cannot start %s: %s\n" % (command[0], e)).encode())
    log.close()
    write_json(run.exit_path, {"rank": run.rank, "exit_code": 127, "signal": None, "ended": time.time(),
                               "tail": tail(log.path), "error": str(e)})
    return 127


def _write_rank_record(run: _RankRun, pid: int) -> None:
    """``ranks/rank-R.json``: the rank's and the wrapper's pids (a full disk only loses it)."""
    env = run.env
    try:
        write_json(
            os.path.join(run.ranks, "rank-%d.json" % run.rank),
            {"rank": run.rank, "local_rank": run.local_rank, "pid": pid, "wrapper_pid": os.getpid(),
             "host": env.get("RIGDECK_CURRENT_HOST") or os.uname().nodename, "gpu": run.gpu,
             "started": time.time(), "restart_count": int(env.get("RIGDECK_RESTART_COUNT", "0") or 0)},
        )
    except OSError as e:
        if not is_resource_error(e):
            raise


def _pump(run: _RankRun, child: Any, read_fd: int, forward: Any, watch_pid: Optional[int] = None) -> Deque[bytes]:
    """Pass the rank's output to its log and parsers until it has ended and its pipe is drained
    (or a second after it ended: what it left running may hold the pipe); the rank is stopped
    when its log cannot be written for a full disk. Closes ``read_fd``; the rank's last lines.
    ``watch_pid``: the job host of a wrapper it did not spawn (an adopted standby,
    agent/standby.py): when it dies the rank is stopped, as a spawned wrapper's death signal
    would."""
    log, parsers = run.log, run.parsers
    last = collections.deque(maxlen=TAIL_LINES)  # type: Deque[bytes]
    partial = b""
    stopped_for_disk = False
    exited_at = None  # type: Optional[float]
    while True:
        # After the rank exits, whatever it left running may keep the pipe open: drain briefly.
        timeout = 0.5 if exited_at is None else max(0.0, exited_at + 1.0 - time.monotonic())
        try:
            ready = select.select([read_fd], [], [], timeout)[0]
        except InterruptedError:
            ready = []
        if ready:
            data = os.read(read_fd, CHUNK)
            if not data:
                break
            log.write(data)
            for parser in parsers:
                parser.feed(data)
            lines = (partial + data).split(b"\n")
            partial = lines.pop()[-MATCH_BYTES:]
            last.extend(ln[:MATCH_BYTES] for ln in lines[-TAIL_LINES:])
            if log.error is not None and is_resource_error(log.error) and not stopped_for_disk:
                stopped_for_disk = True  # its output cannot be kept: stop the rank, say why
                forward(signal.SIGTERM, None)
        if exited_at is None and child.poll() is not None:
            exited_at = time.monotonic()
        if watch_pid is not None and not ready and exited_at is None and not _alive(watch_pid):
            watch_pid = None  # once: the rank is told to stop, its end is pumped as any other
            forward(signal.SIGTERM, None)
        if exited_at is not None and (not ready or time.monotonic() > exited_at + 1.0):
            break
    os.close(read_fd)
    if partial:
        last.append(partial)
    return last


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _finish(run: _RankRun, code: int, last: Deque[bytes]) -> int:
    """Flush the parsers, close the log, write the exit record; the wrapper's own exit code
    (128 + N for a rank killed by signal N)."""
    log, parsers = run.log, run.parsers
    for parser in parsers:
        parser.flush()
    log.close()
    sig = -code if code < 0 else None
    record = {"rank": run.rank, "exit_code": code if code >= 0 else None, "signal": sig,
              "ended": time.time(), "tail": [ln[:TAIL_CHARS].decode("utf-8", "replace") for ln in last]}  # type: Dict[str, Any]
    cause = _resource_cause(log, parsers, last)
    if cause:
        record["error"] = cause  # a failure even if the rank exited 0: part of its output is lost
    if log.lost:
        record["lost_bytes"] = log.lost
    write_json(run.exit_path, record)
    return code if code >= 0 else 128 + (sig or 0)
