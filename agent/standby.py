"""Warm standby ranks: the next attempt's processes started ahead, with the script's imports done.

A restart's ranks are new processes: each starts an interpreter and imports what the script
imports before its first step (``import torch`` alone is about 3 s of CPU), and on a host whose
cores the restarted ranks share, that is most of a restart's time to its first step. So, once an
attempt of a job that may restart has reached its first steps, its job host starts one standby
per local rank (``agent.pyz rank --job-dir D --local-rank L --standby 1 -- COMMAND...``), in its
own session, outside the job's process group:

- the standby wrapper spawns the rank's command as a rank wrapper would (its output through a
  pipe, dying with the wrapper), with ``RIGDECK_STANDBY_FD`` naming one end of a socket pair; the
  rank boot (``agent/rankboot/sitecustomize.py``) sees it, imports the modules the script itself
  imports at its top level (``warm_imports``: found outside the script's own directory, as
  ``site`` runs before the script's directory is on ``sys.path``) and waits on the socket;
- the wrapper listens on ``<job dir>/standby/slot-<L>.sock`` (0600, peers of its own account only).

The next attempt's job host on this host (after a restart in place, or the controller's restart
with the same job directory) **adopts** a standby instead of spawning a rank: it sends the rank's
environment, number, command and working directory, with its GPU claim descriptors, and the
standby takes the command only when it is the very one it started (and the interpreter's own
variables, ``PYTHON*`` and ``LD_*``, are unchanged: they act at the interpreter's start); then it
becomes that rank's wrapper (``agent.rankexec``: the rank's log, metrics, records, claims) and
hands the waiting process its environment, working directory and claims, and the script runs.
A standby refused, dead or missing: that rank starts cold, as always.

While a standby waits it is not the job's: a stop's sweep by the job's tag (``processes_with_tag``)
passes over a process whose environment names a standby directory holding ``waiting-<pid>``; the
marks go before the standby answers an adoption, so from then on the sweep finds it like any rank.
A standby ends itself when the job succeeded, when its job directory is gone, or when no job host
of the job has lived for ``LINGER_S``; the job host ends its standbys when the job succeeds.

Stdlib only, Python 3.9+.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time

from agent.jobfiles import read_json

TYPE_CHECKING = False  # (mypy reads it as True) typing is not imported by a rank's or job's start
if TYPE_CHECKING:
    import socket
    from typing import Any, Dict, List, Optional

ENV_FD = "RIGDECK_STANDBY_FD"  # the waiting process's end of its socket pair (the rank boot reads it)
ENV_IMPORTS = "RIGDECK_STANDBY_IMPORTS"  # the modules it imports while it waits, comma separated
ENV_DIR = "RIGDECK_STANDBY"  # the standby directory: marks a standby's processes (environ)
DIR = "standby"
LINGER_S = 30.0  # a standby outlives its job's last job host this long (a restart comes within it)
MAX_MESSAGE = 4 << 20
MAX_IMPORTS = 64
BUFFER_BYTES = 65536  # what the waiting process prints (its imports' warnings) is kept for its log
START_ENV_PREFIXES = ("PYTHON", "LD_")  # read at the interpreter's start: a change needs a new one
# What telemetry reads of a rank's environment to tell its GPU, kept for an adopted standby
ADOPTED_KEYS = ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "RIGDECK_GPUS", "RIGDECK_SIM_GPU")


def standby_dir(job_dir: str) -> str:
    return os.path.join(job_dir, DIR)


def slot_path(job_dir: str, local_rank: int) -> str:
    return os.path.join(standby_dir(job_dir), "slot-%d.sock" % int(local_rank))


def as_adopted(pid: int, env: Dict[str, str]) -> Optional[Dict[str, str]]:
    """A process's environment as its rank has it: a standby's ``/proc`` environ is the one it
    started with, so a waiting standby is on no GPU (None) and an adopted one's GPUs are those
    its adoption gave (``adopted-<pid>.json``, written by its wrapper); any other process's
    ``env`` as it is."""
    d = env.get(ENV_DIR)
    if not d:
        return env
    if os.path.exists(os.path.join(d, "waiting-%d" % pid)):
        return None
    given = read_json(os.path.join(d, "adopted-%d.json" % pid))
    if given is None:
        return {k: v for k, v in env.items() if k not in ADOPTED_KEYS}  # (a rank's own subprocess)
    return dict(env, **{k: str(v) for k, v in given.items() if k in ADOPTED_KEYS})


def waiting(pid: int, environ: bytes) -> bool:
    """Whether the process ``pid`` (its ``/proc`` environ, NUL separated) is a standby still
    waiting: not yet any attempt's rank."""
    prefix = (ENV_DIR + "=").encode()
    for item in environ.split(b"\0"):
        if item.startswith(prefix):
            d = item[len(prefix):].decode("utf-8", "replace")
            return bool(d) and os.path.exists(os.path.join(d, "waiting-%d" % pid))
    return False


# -- which imports a standby does ahead ---------------------------------------------------------

def script_of(command: List[str], cwd: str) -> Optional[str]:
    """The script a ``python [-flags] script.py ...`` command runs (absolute), or None for any
    other command (a module, ``-c``, an option with a value, a launcher): no standby for it."""
    if len(command) < 2 or not os.path.basename(command[0]).startswith("python"):
        return None
    i = 1
    while i < len(command) and command[i].startswith("-"):
        flag = command[i]
        if flag == "--" or flag[1:2] in ("c", "m", "W", "X") or not flag[1:].isalpha() or flag.startswith("--"):
            return None
        i += 1
    if i >= len(command) or not command[i].endswith(".py"):
        return None
    path = command[i] if os.path.isabs(command[i]) else os.path.join(cwd, command[i])
    return path if os.path.isfile(path) else None


def warm_imports(command: List[str], cwd: str) -> Optional[List[str]]:
    """The modules the script imports at its top level (``import a.b``, ``from a.b import c``:
    ``a.b``), in order, for its standby to import while it waits; None when the command is not a
    script a standby can start, or the script cannot be read or parsed. Relative imports and
    ``__future__`` are left out; so is what the script's own directory holds (the user's code,
    whose import may act on the rank's environment: only the next attempt's is right for it)."""
    import ast

    script = script_of(command, cwd)
    if script is None:
        return None
    try:
        with open(script, "rb") as f:
            tree = ast.parse(f.read(), filename=script)
    except (OSError, SyntaxError, ValueError):
        return None
    here = os.path.dirname(script)
    names = []  # type: List[str]
    for node in tree.body:
        if isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found = [node.module]
        else:
            continue
        for name in found:
            top = name.split(".")[0]
            if top == "__future__" or name in names or _local(here, top):
                continue
            names.append(name)
    return names[:MAX_IMPORTS]


def _local(here: str, top: str) -> bool:
    return os.path.exists(os.path.join(here, top + ".py")) or os.path.isdir(os.path.join(here, top))


# -- the job host's side ------------------------------------------------------------------------

def spawn(agent: List[str], job_dir: str, local_rank: int, command: List[str], cwd: str,
          env: Dict[str, str], imports: List[str], log_fd: int) -> Optional[subprocess.Popen]:
    """Start the standby of ``local_rank`` (None when a live one already holds its slot, or it
    cannot be started): in its own session, holding no claim."""
    path = slot_path(job_dir, local_rank)
    if len(path.encode()) > 100:  # a Unix socket's path is at most 107 bytes
        return None
    if _alive_slot(path):
        return None
    os.makedirs(standby_dir(job_dir), mode=0o700, exist_ok=True)
    senv = dict(env)
    senv[ENV_DIR] = standby_dir(job_dir)
    senv[ENV_IMPORTS] = ",".join(imports)
    senv.pop("RIGDECK_CLAIM_FDS", None)
    argv = agent + ["rank", "--job-dir", job_dir, "--local-rank", str(local_rank), "--standby", "1", "--"] + command
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd, cwd=cwd, env=senv,
                                start_new_session=True)
    except OSError:
        return None


def _alive_slot(path: str) -> bool:
    """Whether a standby answers on ``path`` (its meta file names a live wrapper)."""
    meta = read_json(path[:-len(".sock")] + ".json")
    pid = meta.get("pid") if meta else None
    return isinstance(pid, int) and os.path.exists(path) and _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def adopt(job_dir: str, local_rank: int, rank: int, env: Dict[str, str], command: List[str], cwd: str,
          claim_fds: List[int], timeout: float = 5.0) -> Optional[Dict[str, Any]]:
    """Hand rank ``rank`` (this host's ``local_rank``) to the standby waiting in its slot: its
    answer (``{"ok": true, "wrapper": pid, "child": pid}``), or None (no standby, or it refused:
    start the rank cold)."""
    import socket

    path = slot_path(job_dir, local_rank)
    if not os.path.exists(path):
        return None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        s.connect(path)
        body = json.dumps({"env": env, "rank": int(rank), "local_rank": int(local_rank), "command": list(command),
                           "cwd": cwd, "adopter": os.getpid()}).encode()
        socket.send_fds(s, [body[:65536]], list(claim_fds))
        if len(body) > 65536:
            s.sendall(body[65536:])
        s.shutdown(socket.SHUT_WR)
        answer = _read_all(s, 65536)
    except OSError:
        return None
    finally:
        s.close()
    try:
        got = json.loads(answer.decode())
    except ValueError:
        return None
    if not isinstance(got, dict) or got.get("ok") is not True or not isinstance(got.get("wrapper"), int):
        return None
    return got


def end_all(job_dir: str) -> List[int]:
    """Stop every standby of the job here (its wrapper's session: the waiting process with it)."""
    hit = []  # type: List[int]
    d = standby_dir(job_dir)
    try:
        names = os.listdir(d)
    except OSError:
        return hit
    for name in names:
        if not (name.startswith("slot-") and name.endswith(".json")):
            continue
        meta = read_json(os.path.join(d, name)) or {}
        pid = meta.get("pid")
        if isinstance(pid, int) and pid > 1 and os.path.exists(os.path.join(d, "waiting-%d" % pid)):
            try:
                os.killpg(pid, signal.SIGKILL)  # the wrapper leads its own session and group
                hit.append(pid)
            except OSError:
                pass
    return hit


class Adopted:
    """A rank wrapper this job host adopted (a standby, not its child): what the job host's loop
    asks of a ``Popen``, from ``/proc`` and the rank's exit record."""

    def __init__(self, pid: int, exit_path: str) -> None:
        self.pid = pid
        self.exit_path = exit_path
        self.returncode = None  # type: Optional[int]

    def poll(self) -> Optional[int]:
        if self.returncode is not None:
            return self.returncode
        try:
            with open("/proc/%d/stat" % self.pid) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            state = "X"
        if state not in ("Z", "X"):
            return None
        rec = read_json(self.exit_path) or {}
        code, sig = rec.get("exit_code"), rec.get("signal")
        if isinstance(code, int):
            self.returncode = code
        elif isinstance(sig, int):
            self.returncode = 128 + sig
        else:
            self.returncode = -signal.SIGKILL  # gone without its record: as a wrapper killed
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("rank wrapper %d" % self.pid, timeout or 0)
            time.sleep(0.1)
        return int(self.returncode or 0)

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)


# -- the standby's side -------------------------------------------------------------------------

def serve(job_dir: str, local_rank: int, command: List[str]) -> int:
    """The standby wrapper: start the waiting process, wait for an adoption, then be its rank's
    wrapper (``agent.rankexec``). Exits 0 without ever running a rank when nobody adopts it."""
    import socket

    job_dir = os.path.abspath(job_dir)
    d = standby_dir(job_dir)
    path = slot_path(job_dir, local_rank)
    mine = [os.getpid()]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        _mark(d, os.getpid())
        try:
            os.unlink(path)
        except OSError:
            pass
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(4)
        _write_meta(path, {"pid": os.getpid(), "child": None, "command": command, "cwd": os.getcwd(),
                           "started": time.time()})
    except OSError as e:
        sys.stderr.write("rigdeck standby: cannot listen on %s: %s\n" % (path, e))
        _unmark(d, mine)
        return 0
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    read_fd, write_fd = os.pipe()
    from agent import stacks
    from agent.rankexec import die_with_parent

    env = dict(os.environ)
    env[ENV_FD] = str(theirs.fileno())
    boot = stacks.boot_dir()  # the rank boot waits (and arms faulthandler once adopted)
    if boot:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (boot, env.get("PYTHONPATH", "")) if p)

    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=write_fd, stderr=write_fd, env=env,
                                 pass_fds=[theirs.fileno()], preexec_fn=die_with_parent())
    except OSError as e:
        sys.stderr.write("rigdeck standby: cannot start %s: %s\n" % (command[0], e))
        _close_slot(listener, path, d, mine)
        return 0
    finally:
        os.close(write_fd)
        theirs.close()
    mine.append(child.pid)
    _mark(d, child.pid)
    _write_meta(path, dict(read_json(path[:-len(".sock")] + ".json") or {}, child=child.pid))
    adopted = False
    try:
        got = _wait_for_adoption(listener, job_dir, command, child, read_fd, ours, path)
        if got is None:
            return 0
        adopted = True
        conn, go, fds, early = got
        return _become_rank(job_dir, conn, go, fds, child, ours, read_fd, early, path, d, mine, listener)
    finally:
        if not adopted:
            if child.poll() is None:
                child.kill()
                child.wait()
            _close_slot(listener, path, d, mine)


def _wait_for_adoption(listener: socket.socket, job_dir: str, command: List[str], child: Any,
                       read_fd: int, ours: socket.socket, path: str) -> Any:
    """(connection, message, descriptors, what the process printed) of the first adoption that
    takes this standby; None when the standby should end instead. The waiting process's word
    that its imports are done goes into the slot's meta file (``ready``)."""
    early = bytearray()
    orphaned_since = None  # type: Optional[float]
    try:
        linger = float(os.environ.get("RIGDECK_STANDBY_LINGER_S") or LINGER_S)
    except ValueError:
        linger = LINGER_S
    while True:
        try:
            ready = select.select([listener.fileno(), read_fd, ours.fileno()], [], [], 1.0)[0]
        except InterruptedError:
            ready = []
        if ours.fileno() in ready:
            word = ours.recv(1)
            if not word:
                return None  # the waiting process ended
            _write_meta(path, dict(read_json(path[:-len(".sock")] + ".json") or {}, ready=time.time()))
        if read_fd in ready:
            data = os.read(read_fd, 65536)
            if not data:
                return None  # the waiting process ended (its imports failed hard, or killed)
            if len(early) < BUFFER_BYTES:
                early.extend(data[:BUFFER_BYTES - len(early)])
        if child.poll() is not None:
            return None
        if listener.fileno() in ready:
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            got = _take(conn, command)
            if got is not None:
                return (conn, got[0], got[1], bytes(early))
            conn.close()
            continue
        state = read_json(os.path.join(job_dir, "state.json"))
        if state is None and not os.path.isdir(job_dir):
            return None
        if state is not None and state.get("state") == "succeeded":
            return None
        if _job_host_alive(state):
            orphaned_since = None
        elif orphaned_since is None:
            orphaned_since = time.monotonic()
        elif time.monotonic() - orphaned_since > linger:
            return None


def _job_host_alive(state: Optional[Dict[str, Any]]) -> bool:
    if state is None or state.get("state") in ("succeeded", "failed", "stopped"):
        return False
    pid = state.get("jobhost_pid")
    return isinstance(pid, int) and pid > 1 and _alive(pid)


def _take(conn: socket.socket, command: List[str]) -> Any:
    """The adoption's message and descriptors when it is one this standby can take, else None
    (answered with why)."""
    import socket

    fds = []  # type: List[int]
    try:
        conn.settimeout(5.0)
        uid = _peer_uid(conn)
        if uid != os.getuid():
            _answer(conn, {"ok": False, "why": "another account's connection"})
            return None
        first, fds, _flags, _addr = socket.recv_fds(conn, 65536, 64)
        body = bytes(first) + _read_all(conn, MAX_MESSAGE)
        go = json.loads(body.decode())
        why = _refusal(go, command)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        why = "unreadable adoption: %s" % e
        go = None
    if why is not None:
        for fd in fds:
            os.close(fd)
        _answer(conn, {"ok": False, "why": why})
        return None
    return go, fds


def _refusal(go: Any, command: List[str]) -> Optional[str]:
    """Why this standby cannot become the rank ``go`` describes (None: it can)."""
    if not isinstance(go, dict):
        return "not an object"
    env = go.get("env")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        return "env is not an object of strings"
    if go.get("command") != command:
        return "another command"
    if go.get("cwd") != os.getcwd():
        return "another working directory"
    for key in ("rank", "local_rank", "adopter"):
        if not isinstance(go.get(key), int) or isinstance(go.get(key), bool) or go[key] < 0:
            return "%s is not an integer >= 0" % key
    mine = {k: v for k, v in os.environ.items() if k.startswith(START_ENV_PREFIXES) and k != ENV_IMPORTS}
    theirs = {k: v for k, v in env.items() if k.startswith(START_ENV_PREFIXES)}
    if mine != theirs:
        return "the interpreter's variables differ (%s)" % ", ".join(sorted(set(mine) ^ set(theirs) | {
            k for k in mine if k in theirs and mine[k] != theirs[k]}))
    return None


def _become_rank(job_dir: str, conn: socket.socket, go: Dict[str, Any], fds: List[int], child: Any,
                 ours: socket.socket, read_fd: int, early: bytes, path: str, d: str, mine: List[int],
                 listener: socket.socket) -> int:
    """Take the rank: its bookkeeping as any wrapper's, the waiting process told to go, the
    adopter answered; then the rank's output pumped until it ends (``agent.rankexec``). ``fds``:
    the adopter's claim descriptors, held for the rank's life as a wrapper it spawned would."""
    import socket

    from agent import claims, rankexec

    _close_slot(listener, path, d, mine)  # no second adoption; the stop's sweep finds us from now on
    env = dict(go["env"])
    env.pop("RIGDECK_CLAIM_FDS", None)
    run = rankexec._prepare(job_dir, env, int(go["rank"]), int(go["local_rank"]))
    held = claims.join(int(g) for g in run.gpus)
    try:
        body = json.dumps({"env": run.env, "cwd": go["cwd"]}).encode()
        socket.send_fds(ours, [body[:65536]], held)
        if len(body) > 65536:
            ours.sendall(body[65536:])
        ours.shutdown(socket.SHUT_WR)  # (not closed: its word that it is ready may still come)
    except OSError as e:  # the waiting process is gone: the adopter starts this rank cold
        _answer(conn, {"ok": False, "why": "the waiting process is gone: %s" % e})
        conn.close()
        child.kill()
        child.wait()
        return 0
    finally:
        for fd in held:
            os.close(fd)
    given = os.path.join(d, "adopted-%d.json" % child.pid)
    try:
        _write_json(given, {k: run.env[k] for k in ADOPTED_KEYS if k in run.env})
    except OSError:
        pass
    _answer(conn, {"ok": True, "wrapper": os.getpid(), "child": child.pid})
    conn.close()
    if early:
        run.log.write(early)
        for parser in run.parsers:
            parser.feed(early)
    try:
        return rankexec.run_rank(run, child, read_fd, watch_pid=int(go["adopter"]))
    finally:
        try:
            os.unlink(given)
        except OSError:
            pass


def _peer_uid(conn: socket.socket) -> int:
    import socket
    import struct

    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def _answer(conn: socket.socket, what: Dict[str, Any]) -> None:
    try:
        conn.sendall(json.dumps(what).encode())
    except OSError:
        pass


def _read_all(s: socket.socket, limit: int) -> bytes:
    out = bytearray()
    while len(out) <= limit:
        data = s.recv(65536)
        if not data:
            break
        out.extend(data)
    if len(out) > limit:
        raise ValueError("message over %d bytes" % limit)
    return bytes(out)


def _mark(d: str, pid: int) -> None:
    os.close(os.open(os.path.join(d, "waiting-%d" % pid), os.O_WRONLY | os.O_CREAT, 0o600))


def _unmark(d: str, pids: List[int]) -> None:
    for pid in pids:
        try:
            os.unlink(os.path.join(d, "waiting-%d" % pid))
        except OSError:
            pass


def _close_slot(listener: socket.socket, path: str, d: str, mine: List[int]) -> None:
    """The slot no longer takes adoptions: its socket and meta file gone (when still ours: a newer
    standby may hold the slot), the waiting marks gone."""
    try:
        listener.close()
    except OSError:
        pass
    if _meta_is_mine(path):
        for p in (path, path[:-len(".sock")] + ".json"):
            try:
                os.unlink(p)
            except OSError:
                pass
    _unmark(d, mine)


def _meta_is_mine(path: str) -> bool:
    meta = read_json(path[:-len(".sock")] + ".json")
    return meta is not None and meta.get("pid") == os.getpid()


def _write_meta(path: str, meta: Dict[str, Any]) -> None:
    _write_json(path[:-len(".sock")] + ".json", meta)


def _write_json(path: str, value: Dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)
