"""``rigdeck serve``: the controller service, headless and long-lived, on a unix socket.

The server holds the agent connections, the history database, the queue and the supervisors
(``ControllerService``). Faces reach it through ``rigdeck attach`` (an SSH exec channel on the
head host, bridged to the socket) and speak JSON lines:

    -> {"id": 7, "method": "launch", "params": {...}}
    <- {"id": 7, "result": ...}                      or {"id": 7, "error": {"type", "message"}}
    <- {"id": 7, "item": ...} ... {"id": 7, "end": true}     (streaming methods: logs, wait)
    <- {"event": "hosts", "data": [...]}             (after subscribe_hosts: telemetry deltas)

The methods, their params and what they answer are declared once, in ``tui.control.api``: the
table the server dispatches from (``_methods``) is made from it.

The server's first line (``{"event": "hello", ..., "compress": "zlib"}``) is plain; what it sends
after it is one zlib stream, flushed after each message (``Z_SYNC_FLUSH``), so each message can
be read as soon as it arrives. The client's requests are plain JSON lines.

Who a session is: ``rigdeck attach`` sends one line of its own first, ``{"identity": {"user":
NAME}}``, NAME being what the SSH key's forced command says (``rigdeck server add-user``), or
null for the server account's own login, which owns the server and is an admin. Only the first
line may say it; a person must be in ``users.json`` (their role is read from there at each
check, so ``remove-user`` and a changed role apply at once). A method's ``guard``
(``tui.control.api``) is checked with that person by ``tui.model.permissions`` before the method
runs, and its ``actor`` keyword gets that person's name: the client's own claims count for
nothing.

A person who joined (``join_key``, then ``join``: ``rigdeck server join``) has their jobs reached
through links to their own account on each host joined (``tui.control.accounts``), so their ranks
run as them; ``remove-user`` closes those links at once (``close_removed``).

The socket lives in ``<state_dir>/sock`` (0700) and is itself 0600; there is no TCP listener,
unless ``--metrics-listen ADDR:PORT`` (the inventory's ``[server] metrics_listen``) asks for
Prometheus' ``GET /metrics`` there (``tui.control.metricsserver``, the controller's exposition).
One server per state dir: ``server.lock`` is held (flock) for the server's lifetime, so a second
``serve`` refuses and a restarted one re-adopts what the first left: the running jobs (the
hosts say what runs; the gang rules go on), the queue and the history (SQLite).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import socket
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import filemodes
from agent.serverhelper import join_tag, read_users
from tui.control import api
from tui.control.accounts import Accounts, JoinError
from tui.control.history import History
from tui.control.metricsserver import MetricsServer
from tui.control.service import ControllerService
from tui.model import wire
from tui.model.identity import local_user
from tui.model.jobspec import (
    HEX64_RE,
    PRIORITY_MAX,
    PRIORITY_MIN,
    SERVER_ENV_FILE,
    JobSpec,
    JobSpecError,
    env_values_from_wire,
    jobspec_from_wire,
)
from tui.model.jobstate import QUEUED
from tui.model.permissions import Actor, Guard, PermissionDenied, check, env_for, join_refusal, priority_refusal
from tui.model.state import ClusterState, HostState
from tui.model.userconfig import UserConfig, load_config

log = logging.getLogger(__name__)

SOCKET_NAME = "server.sock"
MAX_LINE = 16 << 20  # one request; a launch carries a spec, nothing carries more
DEFAULT_RATE_HZ = 1.0


def socket_path(state_dir: Path) -> Path:
    return state_dir / "sock" / SOCKET_NAME


class RemoteError(Exception):
    """An error raised by a method, as sent to the client: its type's name and message."""


# ---------------------------------------------------------------------------------------------
# Telemetry as deltas: what the attached face's mirror of the cluster state needs.


def host_status(h: HostState) -> list[Any]:
    return [h.status.value, h.reason, h.error_kind, h.host_key]


def host_agent(h: HostState) -> list[Any]:
    return [h.agent_version, h.agent_pid, h.hostname, h.upgrade_pending]


@dataclass
class _Sent:
    """What one session last sent about one host."""

    samples: int = -1
    status: list[Any] | None = None
    agent: list[Any] | None = None
    gpus: dict[int, dict[str, Any]] = field(default_factory=dict)
    host_sample: dict[str, Any] | None = None


_MISSING = object()


def field_delta(before: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``now`` that differ from ``before``, and under ``"-"`` those it lost."""
    d = {k: v for k, v in now.items() if before.get(k, _MISSING) != v}
    gone = [k for k in before if k not in now]
    if gone:
        d["-"] = gone
    return d


def apply_delta(before: dict[str, Any] | None, delta: dict[str, Any], skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """``before`` with ``field_delta``'s answer applied (keys in ``skip`` are not fields)."""
    out = dict(before or {})
    for k in delta.get("-") or []:
        out.pop(k, None)
    out.update({k: v for k, v in delta.items() if k != "-" and k not in skip})
    return out


def host_delta(h: HostState, sent: _Sent) -> dict[str, Any] | None:
    """What changed about ``h`` since ``sent`` (updated in place), or None. A sample goes as the
    fields of each GPU that changed (a GPU's index always), so a quiet cluster costs nothing and
    a busy one its changing numbers."""
    out: dict[str, Any] = {}
    status = host_status(h)
    if status != sent.status:
        out["st"] = sent.status = status
    agent = host_agent(h)
    if agent != sent.agent:
        out["ag"] = sent.agent = agent
    if h.samples != sent.samples:
        sent.samples = h.samples
        gpus = []
        seen = set()
        for idx, g in sorted(h.gpus.items()):
            seen.add(idx)
            before = sent.gpus.get(idx)
            now = g.sample
            if before is None:  # new to this face: with its recent utilization (the sparkline)
                gpus.append({**now, "_hist": list(g.history)})
            else:
                gpus.append({**field_delta(before, now), "index": idx})
            sent.gpus[idx] = now
        for idx in [i for i in sent.gpus if i not in seen]:
            del sent.gpus[idx]
        s: dict[str, Any] = {"g": gpus, "n": sorted(seen), "t": h.last_sample_time,
                             "sim": h.simulated, "src": h.gpu_source}
        if h.host_sample != sent.host_sample:  # its changed fields only, as for a GPU
            if sent.host_sample is None or h.host_sample is None:
                s["h"] = h.host_sample
            else:
                s["hd"] = field_delta(sent.host_sample, h.host_sample)
            sent.host_sample = h.host_sample
        out["s"] = s
    if not out:
        return None
    out["name"] = h.name
    return out



class StateMirror:
    """The face's side: folds the server's host deltas into a local ``ClusterState``, through
    the same methods the server's own telemetry readers use."""

    def __init__(self, state: ClusterState):
        self.state = state
        self._gpus: dict[str, dict[int, dict[str, Any]]] = {}
        self._host_sample: dict[str, Any] = {}

    def reset(self) -> None:
        """A new connection sends everything again."""
        self._gpus.clear()
        self._host_sample.clear()

    def apply(self, deltas: list[dict[str, Any]]) -> None:
        from tui.model.state import HostStatus

        for d in deltas:
            name = d.get("name")
            if name not in self.state.hosts:
                continue
            if "ag" in d:
                v, pid, hostname, upgrade = d["ag"]
                self.state.set_agent(name, {"agent_version": v, "pid": pid, "hostname": hostname},
                                     upgrade_pending=upgrade)
            if "s" in d:
                s = d["s"]
                known = self._gpus.setdefault(name, {})
                seeds = {}
                for g in s.get("g") or []:
                    idx = int(g["index"])
                    known[idx] = apply_delta(known.get(idx), g, skip=("_hist",))
                    if "_hist" in g:
                        seeds[idx] = g["_hist"]
                for idx in [i for i in known if i not in set(s.get("n") or [])]:
                    del known[idx]
                if "h" in s:
                    self._host_sample[name] = s["h"]
                elif "hd" in s:
                    self._host_sample[name] = apply_delta(self._host_sample.get(name), s["hd"])
                self.state.apply_sample(name, {
                    "time": s.get("t"), "simulated": s.get("sim"), "gpu_source": s.get("src"),
                    "host": self._host_sample.get(name), "gpus": [known[i] for i in sorted(known)],
                })
                if seeds:
                    self.state.seed_history(name, seeds)
            if "st" in d:
                status, reason, kind, host_key = d["st"]
                self.state.set_status(name, HostStatus(status), reason, kind=kind, host_key=host_key)


# ---------------------------------------------------------------------------------------------
# Encoding what methods return.


def encode_result(value: Any, s: Session | None = None) -> Any:
    """An answer as it crosses the wire to session ``s`` (None: the server's own use): a job's
    ``[env]`` values only to its owner and admins (``tui.model.permissions.env_for``)."""
    from tui.control.hostlinks import HostReport
    from tui.model.jobview import JobView

    if isinstance(value, JobView):
        return {**value.to_json(), "spec": env_for(_viewer(s), value.user, value.spec)}
    if isinstance(value, HostReport):
        return value.to_json()
    if isinstance(value, list):
        return [encode_result(v, s) for v in value]
    if isinstance(value, dict):
        return {k: (v.to_json() if hasattr(v, "to_json") and not isinstance(v, dict) else
                    (str(v) if isinstance(v, BaseException) else encode_result(v, s))) for k, v in value.items()}
    if isinstance(value, BaseException):
        return {"error": str(value)}
    return wire.encode(value)


def _viewer(s: Session | None) -> Actor | None:
    """Who an answer is for: the session's person; None (sees all) for the server itself."""
    return None if s is None else s.actor


def encode_detail(detail: Any, log_since: int, s: Session | None = None) -> dict[str, Any]:
    """A JobDetail without its log buffer, plus the log lines after ``log_since``; its spec as
    ``s``'s person may see it."""
    import dataclasses

    out = {f.name: wire.encode(getattr(detail, f.name)) for f in dataclasses.fields(detail) if f.name != "logs"}
    out["spec"] = env_for(_viewer(s), detail.user, out.get("spec") or {})
    start, lines = detail.logs.since(log_since)
    out["logs"] = {"start": start, "lines": [list(x) for x in lines], "length": len(detail.logs)}
    return out


# ---------------------------------------------------------------------------------------------
# The server.


# A session's requests answered at once (the app keeps a few streams open and polls; a client
# past this is refused until one ends).
MAX_IN_FLIGHT = 32


class Session:
    """One attached face: its requests, its telemetry subscription, its selected job."""

    def __init__(self, server: Server, conn: socket.socket, number: int):
        self.server = server
        self.conn = conn
        self.who = f"session-{number}"
        self.user: str | None = None  # the person its attach named (None: the server's account)
        self._lines_read = 0
        self._in_flight = 0  # requests being answered (each on a thread of its own)
        self._flight_lock = threading.Lock()
        self._wlock = threading.Lock()
        self._closed = threading.Event()
        self.rate_hz = 0.0
        self._sent: dict[str, _Sent] = {}
        self.bytes_out = 0
        self._z: Any = None
        self.rows_sent: dict[str, Any] = {}  # jobs_snapshot: each job's row as last sent

    def send(self, msg: dict[str, Any]) -> None:
        data = (json.dumps(msg, separators=(",", ":"), default=str) + "\n").encode()
        with self._wlock:
            if self._z is not None:  # after the hello, one zlib stream, flushed at each message
                data = self._z.compress(data) + self._z.flush(zlib.Z_SYNC_FLUSH)
            self.conn.sendall(data)
            self.bytes_out += len(data)

    def run(self) -> None:
        svc = self.server.service
        try:
            # The hello goes as plain text; everything after it is compressed (telemetry is most of
            # it: repeated keys, small numbers), which the hello announces.
            self.send({"event": "hello", "data": encode_result(svc.info()), "compress": "zlib"})
            self._z = zlib.compressobj(6)
            buf = b""
            while not self._closed.is_set():
                chunk = self.conn.recv(65536)
                if not chunk:
                    break
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    self._handle_line(line)
                if len(buf) > MAX_LINE:
                    self.send({"event": "error", "data": "request too long"})
                    break
        except OSError:
            pass
        finally:
            self.close()

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        if self.server.service._watch is not None:
            self.server.service.select(None, who=self.who)
        try:
            # shutdown first: it ends the session's own recv (a close alone leaves it blocked)
            # and tells the attach at the other end, which exits.
            self.conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.conn.close()
        except OSError:
            pass

    @property
    def actor(self) -> Actor:
        """The session's person as the rules see them now (users.json read again)."""
        return self.server.actor(self.user)

    def _identify(self, identity: Any) -> None:
        """The attach's first line: the person its forced command names. One not (or no longer)
        in users.json is refused, and the session ends."""
        user = identity.get("user") if isinstance(identity, dict) else None
        if user is None:
            return
        self.user = str(user)
        self.who = f"{self.user}-{self.who}"
        if self.server.actor(self.user).name != self.user:
            self.send({"event": "error", "data": f"{self.user} is not a user of this server "
                                                 "(rigdeck server add-user)"})
            self.close()

    def _handle_line(self, line: bytes) -> None:
        if self._closed.is_set():
            return
        self._lines_read += 1
        try:
            msg = json.loads(line)
            if isinstance(msg, dict) and "identity" in msg:
                if self._lines_read != 1:  # only the attach's own first line says who
                    raise ValueError("identity is said once, by rigdeck attach, in the first line")
                self._identify(msg["identity"])
                return
            if not isinstance(msg, dict) or not isinstance(msg.get("method"), str):
                raise ValueError("expected {id, method, params}")
        except ValueError as e:  # a bad message never ends the server, nor this session
            self.send({"event": "error", "data": f"bad message: {e}"})
            return
        with self._flight_lock:
            busy = self._in_flight >= MAX_IN_FLIGHT
            if not busy:
                self._in_flight += 1
        if busy:  # a client that floods the server gets errors, not a thread each
            self.send({"id": msg.get("id"), "error": {
                "type": "RemoteError", "message": f"refused: {MAX_IN_FLIGHT} requests of this session are "
                                                  "still being answered; wait for one"}})
            return
        threading.Thread(target=self._call_counted, args=(msg,), daemon=True,
                         name=f"{self.who}-{msg.get('method')}").start()

    def _call_counted(self, msg: dict[str, Any]) -> None:
        try:
            self._call(msg)
        finally:
            with self._flight_lock:
                self._in_flight -= 1

    def _call(self, msg: dict[str, Any]) -> None:
        rid = msg.get("id")
        method = msg["method"]
        params = msg.get("params") or {}
        handler = self.server.methods.get(method)
        try:
            if handler is None:
                raise RemoteError(f"no method {method!r}")
            result = handler(self, **params)
            if hasattr(result, "__next__"):  # a stream: items, then the end
                for item in result:
                    if self._closed.is_set():
                        return
                    self.send({"id": rid, "item": item})
                self.send({"id": rid, "end": True})
            else:
                self.send({"id": rid, "result": result})
        except Exception as e:
            if not isinstance(e, (RemoteError, ValueError, LookupError, PermissionDenied)) and type(e).__name__ not in (
                    "JobError", "AmbiguousJobError", "PlacementError", "JobSpecError", "TransportError"):
                log.exception("%s failed", method)
            extra = {"job_ids": list(e.job_ids)} if hasattr(e, "job_ids") else {}
            try:
                self.send({"id": rid, "error": {"type": type(e).__name__, "message": str(e), **extra}})
            except OSError:
                pass

    def telemetry_loop(self) -> None:
        state = self.server.service.state
        while not self._closed.is_set() and self.rate_hz > 0:
            deltas = []
            for h in list(state.hosts.values()):
                sent = self._sent.setdefault(h.name, _Sent())
                d = host_delta(h, sent)
                if d is not None:
                    deltas.append(d)
            if deltas:
                try:
                    self.send({"event": "hosts", "data": deltas})
                except OSError:
                    return
            self._closed.wait(1.0 / self.rate_hz)


class Server:
    def __init__(self, service: ControllerService, sock_path: Path):
        self.service = service
        self.sock_path = sock_path
        self._stop = threading.Event()
        self._sessions: list[Session] = []
        self._listener: socket.socket | None = None
        self.methods: dict[str, Callable[..., Any]] = _methods()
        # The people who attach with keys of their own (None: nobody but the server's account).
        self.users_dir: Path | None = None
        self._users_stamp: int | None = None  # users.json's mtime when sessions were last checked
        # The server's own account: whoever logs in as it owns the state dir anyway.
        self.account = Actor(f"{local_user() or 'server'}", admin=True)
        # The links to people's own accounts on the hosts (``rigdeck server join``), or None.
        self.accounts: Accounts | None = None
        # [server] members_need_join (None: where the hosts' account is the server's own), and
        # that account when a host that takes jobs is reached as it (None: none is).
        self.members_need_join: bool | None = None
        self.own_account_on_hosts: str | None = None

    def join_refusal(self, user: str | None) -> str | None:
        """Why a job of ``user``'s may not run (a member who has not joined, where the server
        runs no member's job as the hosts' account: ``[server] members_need_join``), or None."""
        if user is None or user == self.account.name or self.accounts is None or self.members_need_join is False:
            return None
        as_account = None if self.members_need_join else self.own_account_on_hosts
        if self.members_need_join is None and as_account is None:
            return None
        return join_refusal(self.actor(user), bool(self.accounts.recorded(user)), as_account)

    def actor(self, user: str | None) -> Actor:
        """The person ``user`` as the rules see them: the account (None), a member or an admin
        of users.json, or, when not there (removed), a member of another name, refused all."""
        if user is None:
            return self.account
        people = read_users(str(self.users_dir)) if self.users_dir is not None else {}
        if user not in people:
            return Actor(f"(removed user {user})")
        return Actor(user, admin=bool(people[user].get("admin")))

    def authorize(self, s: Session, guard: Guard, params: dict[str, Any]) -> None:
        """PermissionDenied when the session's person may not do what ``guard`` guards to what
        ``params`` name (each target, for a method that takes several). A reference checked is
        replaced in ``params`` by the id it resolved to, so the action hits what was checked,
        not a same-named job launched in between."""
        actor = s.actor
        if actor.admin:
            return
        if guard.admin_only:
            check(actor, guard)
        refs = params.get(guard.param)
        idents = []
        for ref in refs if isinstance(refs, list) else [refs]:
            ident, owner = self.service.owner(guard.kind, str(ref))
            check(actor, guard, ref=ident, owner=owner)
            idents.append(ident)
        params[guard.param] = idents if isinstance(refs, list) else idents[0]

    def listen(self) -> None:
        filemodes.private_dir(self.sock_path.parent, "the server's socket directory")
        if self.sock_path.exists() or self.sock_path.is_symlink():
            self.sock_path.unlink()  # ours (the lock says no other server runs)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            s.bind(str(self.sock_path))
        finally:
            os.umask(old)
        os.chmod(self.sock_path, 0o600)
        s.listen(64)
        self._listener = s

    def serve_forever(self) -> None:
        assert self._listener is not None
        self._listener.settimeout(0.5)
        n = 0
        while not self._stop.is_set():
            self.close_removed()
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    break
                raise
            n += 1
            sess = Session(self, conn, n)
            self._sessions = [s for s in self._sessions if not s._closed.is_set()] + [sess]
            threading.Thread(target=sess.run, daemon=True, name=sess.who).start()

    def close_removed(self) -> None:
        """End the sessions of people no longer in users.json (``remove-user``, checked at most
        every half second as the users file changes): their streams too, not only their next
        request. A removed person's open app stops getting telemetry and jobs at once."""
        if self.users_dir is None:
            return
        try:
            stamp = (self.users_dir / "users.json").stat().st_mtime_ns
        except OSError:
            stamp = None
        if stamp == self._users_stamp:
            return
        self._users_stamp = stamp
        if self.accounts is not None:
            self.accounts.prune()  # a removed person's links to their accounts close now
        for s in list(self._sessions):
            if s.user is not None and not s._closed.is_set() and self.actor(s.user).name != s.user:
                try:
                    s.send({"event": "error", "data": f"{s.user} is no longer a user of this server"})
                except OSError:
                    pass
                s.close()

    def stop(self) -> None:
        self._stop.set()
        for s in list(self._sessions):
            s.close()
        if self._listener is not None:
            self._listener.close()


def _methods() -> dict[str, Callable[..., Any]]:
    """The controller API as the server exposes it (``tui.control.api``): wire name -> handler."""
    return {m.name: _handler(m) for m in api.METHODS.values()}


def _bind(s: Session, m: api.Method, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` checked against ``m``'s stub, its guard checked with the session's person
    (PermissionDenied), and its actor keyword given that person's name (for a service call)."""
    bound = m.bind(params)
    if s.user is not None and s.actor.name != s.user:
        raise PermissionDenied(f"refused: {s.user} is no longer a user of this server")
    if m.guard is not None:
        s.server.authorize(s, m.guard, bound)
    if m.actor and not m.own:
        bound[m.actor] = s.actor.name
    return bound


def _handler(m: api.Method) -> Callable[..., Any]:
    """The handler of ``m``: the server's own (``_Own``), or a call of the service method that
    answers it, its answer (each item of a stream) encoded; the guard checked first."""
    if m.own:
        own = getattr(_Own, m.attr)

        def handle(s: Session, **params: Any) -> Any:
            return own(s, **_bind(s, m, params))
    elif m.stream:
        def handle(s: Session, **params: Any) -> Any:
            bound = _bind(s, m, params)  # refused at the call, not at the first item
            return (encode_result(item, s) for item in getattr(s.server.service, str(m.service))(**bound))
    else:
        def handle(s: Session, **params: Any) -> Any:
            return encode_result(getattr(s.server.service, str(m.service))(**_bind(s, m, params)), s)
    handle.__name__ = m.attr
    return handle


def _may_run(s: Session) -> None:
    """PermissionDenied for new work of a member who must join first (``Server.join_refusal``)."""
    why = s.server.join_refusal(s.user)
    if why is not None:
        raise PermissionDenied(why)


def _person(s: Session) -> dict[str, Any]:
    """The ``user`` keyword for a session of a person (none for the server's own account: the
    layers below default to the local account, which it is)."""
    return {"user": s.user} if s.user is not None else {}


class _Own:
    """The server's own handlers, each named after its stub in ``tui.control.api``: the methods
    that need the session, decode a spec or encode bytes. Each gets the session and the params,
    checked against the stub."""

    @staticmethod
    def ping(s: Session) -> float:
        return time.time()

    @staticmethod
    def subscribe_hosts(s: Session, rate_hz: float = DEFAULT_RATE_HZ) -> dict[str, Any]:
        start = s.rate_hz <= 0
        s.rate_hz = max(0.1, min(float(rate_hz), 10.0))
        s._sent.clear()  # everything again, for a new mirror
        if start:
            threading.Thread(target=s.telemetry_loop, daemon=True, name=f"{s.who}-hosts").start()
        inv = s.server.service.inventory
        return {"hosts": [[h.name, h.address] for h in inv.hosts], "rate_hz": s.rate_hz}

    @staticmethod
    def jobs_snapshot(s: Session, since: int = -1) -> Any:
        """The jobs list, or None when unchanged since ``since``. Only the rows that changed
        since this session's last answer are sent (``rows``), with the order of all (``order``);
        ``full`` says the client must drop what it kept (a new session, or ``since`` = -1)."""
        snap = s.server.service.jobs_snapshot()
        if snap.version == since:
            return None
        full = since < 0 or not s.rows_sent
        if full:
            s.rows_sent = {}
        rows = {}
        for r in snap.rows:
            enc = wire.encode(r)
            if s.rows_sent.get(r.job_id) != enc:
                rows[r.job_id] = s.rows_sent[r.job_id] = enc
        order = [r.job_id for r in snap.rows]
        for gone in [j for j in s.rows_sent if j not in set(order)]:
            del s.rows_sent[gone]
        return {"version": snap.version, "error": snap.error, "polled_at": snap.polled_at,
                "order": order, "rows": rows, "full": full}

    @staticmethod
    def job_detail(s: Session, job_id: str, log_since: int = 0) -> Any:
        d = s.server.service.job_detail(job_id)
        return None if d is None else encode_detail(d, log_since, s)

    @staticmethod
    def select(s: Session, job_id: str | None) -> None:
        s.server.service.select(job_id, who=s.who)

    @staticmethod
    def source_launch(s: Session, spec: dict[str, Any], env_values: dict[str, str] | None = None) -> str:
        checked = _client_spec(s, spec)
        values = env_values_from_wire(checked, env_values)
        _may_run(s)
        return str(s.server.service.source.launch(checked, **_person(s), env_values=values))

    @staticmethod
    def source_stop(s: Session, job_id: str) -> str:
        return str(s.server.service.source.stop_job(job_id, **_person(s)))

    @staticmethod
    def launch(s: Session, spec: dict[str, Any], queue: bool = True, env_values: dict[str, str] | None = None) -> Any:
        svc = s.server.service
        checked = _client_spec(s, spec)
        # The env_from_file's values: checked against the spec's names, then held in memory
        # only, until the job's first start takes them to its hosts (never recorded or shown).
        values = env_values_from_wire(checked, env_values)
        _may_run(s)
        view = svc.launch(checked, queue=queue is not False, user=s.actor.name, env_values=values)
        if view.state != QUEUED:  # the launching face opens the job it started
            svc.select(view.job_id, who=s.who)
        return encode_result(view, s)

    @staticmethod
    def log_chunks(s: Session, ref: str, rank: int | None = None, follow: bool = False) -> Any:
        import base64

        for host, r, data, partial in s.server.service.log_chunks(ref, rank=rank, follow=follow, binary=True):
            yield {"host": host, "rank": r, "b64": base64.b64encode(data).decode(), "partial": partial}

    @staticmethod
    def sweep(s: Session, spec: dict[str, Any]) -> Any:
        checked = _client_spec(s, spec)
        if checked.env_from_file:  # its trials are launched by the server, with no values
            raise JobSpecError(checked.path, "env_from_file", SERVER_ENV_FILE)
        _may_run(s)
        return wire.encode(s.server.service.sweep(checked, user=s.actor.name))

    @staticmethod
    def sweep_stop_trial(s: Session, ref: str, number: int) -> Any:
        return encode_result(s.server.service.sweep_stop_trial(ref, int(number), user=s.actor.name), s)

    @staticmethod
    def pipeline(s: Session, spec: dict[str, Any]) -> Any:
        from tui.model.pipelinespec import PipelineSpec

        pipeline = PipelineSpec.from_dict(spec)
        if any(step.job.env_from_file for step in pipeline.steps):  # its steps' launches carry no values
            raise JobSpecError(None, "env_from_file", SERVER_ENV_FILE)
        _may_run(s)
        return wire.encode(s.server.service.pipeline(pipeline, user=s.actor.name))

    @staticmethod
    def pipeline_retry(s: Session, ref: str, step: str) -> Any:
        return encode_result(s.server.service.pipeline_retry(ref, str(step)), s)

    @staticmethod
    def reprioritise(s: Session, ref: str, priority: int) -> Any:
        # Out of the spec's range or not an integer: the service's own error says so.
        in_range = isinstance(priority, int) and PRIORITY_MIN <= priority <= PRIORITY_MAX
        why = priority_refusal(s.actor, priority, s.server.service.queue_policy.member_max_priority) \
            if in_range else None
        if why is not None:
            raise PermissionDenied(why)
        return encode_result(s.server.service.reprioritise(ref, priority, user=s.actor.name), s)

    @staticmethod
    def code_missing(s: Session, blobs: list[Any]) -> Any:
        return s.server.service.manager.code_store.missing(_blob_sizes(blobs))

    @staticmethod
    def code_put(s: Session, blobs: list[Any]) -> Any:
        if not isinstance(blobs, list) or not all(isinstance(b, list) and b and _is_hash(b[0]) for b in blobs):
            raise ValueError("code_put: expected a list of contents, each [sha256 (64 hex digits), ...]")
        return s.server.service.manager.code_store.put(blobs)

    @staticmethod
    def code_manifest(s: Session, tree: str, files: list[Any]) -> Any:
        if not _is_hash(tree) or not isinstance(files, list) or not all(
                isinstance(f, list) and len(f) >= 2 and _is_hash(f[1]) for f in files):
            raise ValueError("code_manifest: expected a tree hash and rows [path, sha256, ...] of 64 hex digits")
        return {"tree": s.server.service.manager.code_store.add_manifest(tree, files).tree}

    @staticmethod
    def join_key(s: Session) -> Any:
        accounts = _joinable(s)
        setup = json.loads((accounts.state_dir / "setup.json").read_text())
        # The tag the key line carries (its forced command's --join-tag): a join is accepted only
        # through a line with the tag issued to the person joining (Accounts.verify).
        try:
            tag = join_tag(str(accounts.state_dir), str(s.user))
        except KeyError:
            raise JoinError(f"join: {s.user} is not a user of this server") from None
        return {"public_key": str(setup["public_key"]), "server_host": str(setup["server_host"]),
                "user": s.user, "join_tag": tag}

    @staticmethod
    def join(s: Session, accounts: Any) -> Any:
        user, joinable = s.actor.name, _joinable(s)
        if isinstance(accounts, dict):
            _refuse_running(s, user, [str(h) for h in accounts], "join")
        return {"user": user, "accounts": joinable.join(user, accounts)}

    @staticmethod
    def leave(s: Session, hosts: Any = None) -> Any:
        user, joinable = s.actor.name, _joinable(s)
        if isinstance(hosts, list):
            _refuse_running(s, user, [str(h) for h in hosts], "leave")
        elif hosts is None:
            _refuse_running(s, user, list(joinable.recorded(user)), "leave")
        dropped, left = joinable.leave(user, hosts)
        return {"user": user, "left": dropped, "accounts": left}


def _refuse_running(s: Session, user: str, hosts: list[str], what: str) -> None:
    """JoinError naming ``user``'s jobs that run (or are being started or stopped) on ``hosts``:
    a job keeps the account it started as, and after a join or a leave the server would ask
    after it through another one, which does not know it."""
    from tui.model.jobstate import TERMINAL

    busy = [r["job_id"] for r in s.server.service.manager.history.list(limit=5000)
            if r.get("user") == user and r["state"] not in TERMINAL and r["state"] != QUEUED
            and set(hosts) & {n.get("host") for n in r.get("placement") or []}]
    if busy:
        raise JoinError(f"{what}: {user}'s jobs {', '.join(busy)} run on {', '.join(sorted(hosts))}: a job keeps "
                        f"the account it started as; stop them first (rigdeck stop)")


def _joinable(s: Session) -> Accounts:
    """The server's accounts, for a session of a person (the server's own account joins nothing)."""
    if s.user is None:
        raise JoinError("join: the server's own account runs its links as itself; a person joins "
                        "over their own key (rigdeck server add-user)")
    if s.server.accounts is None:
        raise JoinError("join: this server keeps no accounts of people (it has no state dir)")
    return s.server.accounts


def _is_hash(v: Any) -> bool:
    return isinstance(v, str) and HEX64_RE.fullmatch(v) is not None


def _blob_sizes(blobs: Any) -> list[list[Any]]:
    """``[[sha256, size], ...]`` as a client must send it: a content's hash (never a path: the
    store would answer whether ``../x`` exists on the server's host) and a size."""
    if not isinstance(blobs, list) or not all(
            isinstance(b, list) and len(b) == 2 and _is_hash(b[0]) and isinstance(b[1], int)
            and not isinstance(b[1], bool) and b[1] >= 0 for b in blobs):
        raise ValueError("code_missing: expected [[sha256 (64 hex digits), size (an integer >= 0)], ...]")
    return blobs


def _client_spec(s: Session, spec: Any) -> JobSpec:
    """A spec a client sent, checked as a spec file is (``jobspec_from_wire``: JobSpecError
    names the field), and its priority within what the session's person may give."""
    checked = jobspec_from_wire(spec)
    why = priority_refusal(s.actor, checked.priority, s.server.service.queue_policy.member_max_priority)
    if why is not None:
        raise PermissionDenied(why)
    return checked


# ---------------------------------------------------------------------------------------------
# The process.


def serve(state_dir: Path, *, inventory_path: Path | None = None, telemetry_hz: float = 1.0,
          metrics_listen: tuple[str, int] | None = None) -> int:
    """Run the server in the foreground until SIGTERM or SIGINT. Exit 3 when another server
    holds this state dir, 1 when ``metrics_listen`` (address, port: ``GET /metrics`` there,
    the controller's exposition) cannot be bound."""
    from tui.remote.inventoryfile import load_inventory

    state_dir = Path(os.path.expanduser(str(state_dir)))
    filemodes.private_dir(state_dir, "the server's state directory")
    lock = open(state_dir / "server.lock", "a+")  # noqa: SIM115 - held for the process's life
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"rigdeck serve: another server runs on {state_dir}", flush=True)
        return 3
    (state_dir / "server.pid").write_text(f"{os.getpid()}\n")
    inv = load_inventory(inventory_path or state_dir / "inventory.toml")
    server = getattr(inv, "server", None)
    host = server.host if server is not None else None
    # The operator's [notify] and the queue's rules ([queue], [[group]], [[quota]]), as
    # `rigdeck server setup` copied them (none: nothing is sent; fair share, no quotas).
    config = load_config(state_dir / "config.toml") if (state_dir / "config.toml").exists() else UserConfig()
    service = ControllerService(
        inv, history=History(state_dir / "history.sqlite"), telemetry_hz=telemetry_hz, kind="server",
        host=host, owner=f"server:{state_dir}", notify=config.notify, queue_policy=config.queue,
    )
    try:
        metrics = _metrics_server(service, metrics_listen)
    except OSError:
        service.close()
        (state_dir / "server.pid").unlink(missing_ok=True)
        return 1
    srv = Server(service, socket_path(state_dir))
    srv.users_dir = state_dir
    # Each person who joined reaches the hosts as themselves: their jobs go through their links.
    srv.accounts = Accounts(inv, state_dir)
    service.manager.accounts = srv.accounts.controller
    # env_from_file: the values come with each launch (the file is on the client's machine);
    # the server never reads a file of that name on its own host.
    service.manager.reads_env_files = False
    # A member who has not joined runs no job as the hosts' account where it is the server's own
    # ([server] members_need_join: docs/security.md); the queue and retries ask it too.
    srv.members_need_join = server.members_need_join if server is not None else None
    srv.own_account_on_hosts = own_account_on_hosts(inv)
    service.manager.join_rule = srv.join_refusal
    return _run(service, srv, metrics, state_dir, len(inv.hosts))


def own_account_on_hosts(inv: Any) -> str | None:
    """The account this server runs as, when a host that takes jobs is reached as it (the
    inventory's ``user``, or, naming none, ssh's default: this account); None when none is."""
    me = local_user()
    server = getattr(inv, "server", None)
    for h in inv.hosts:
        if server is not None and h.name == server.host and not server.allow_jobs:
            continue  # no job goes there
        if me and (h.user or me) == me:
            return me
    return None


def _metrics_server(service: ControllerService, listen: tuple[str, int] | None) -> MetricsServer | None:
    """``/metrics`` on ``listen``, bound before anything starts (not yet serving); None without
    one. OSError, said on stdout (the server's log), when the address cannot be bound."""
    if listen is None:
        return None
    shown = f"[{listen[0]}]:{listen[1]}" if ":" in listen[0] else f"{listen[0]}:{listen[1]}"
    try:
        return MetricsServer(service.exposition, *listen)
    except OSError as e:
        print(f"rigdeck serve: cannot listen on {shown} for /metrics: {e.strerror or e}", flush=True)
        raise


def _run(service: ControllerService, server: Server, metrics: MetricsServer | None, state_dir: Path,
         hosts: int) -> int:
    """Listen on the socket (and serve ``/metrics``), start the controller, answer until a
    signal; then stop serving, close the controller and forget the pid."""

    def on_signal(signum: int, frame: Any) -> None:
        server.stop()

    try:
        server.listen()
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        service.start(telemetry=True, jobs=True)
        log.info("rigdeck server %d on %s (%d hosts)", os.getpid(), server.sock_path, hosts)
        print(f"rigdeck server {os.getpid()} listening on {server.sock_path}", flush=True)
        if metrics is not None:
            metrics.start()
            print(f"rigdeck server {os.getpid()}: metrics on {metrics.url} ({metrics.reach})", flush=True)
        server.serve_forever()
    finally:
        if metrics is not None:
            metrics.close()  # before the controller: a scrape meanwhile would find it closed
        service.close()
        if server.accounts is not None:
            server.accounts.close()
        try:
            (state_dir / "server.pid").unlink()
        except OSError:
            pass
    return 0
