"""The controller API the faces use: the app and the CLI call this, and only this.

Two kinds, one interface:

* ``InProcessClient``: the controller runs in this process (the embedded default, how rigdeck
  has always run). A queue advances only while a controller process runs.
* ``RemoteClient``: the controller is ``rigdeck serve`` on a head host (inventory ``[server]``).
  One SSH exec channel to ``rigdeck attach`` there carries everything, telemetry included, as
  JSON lines (``tui.control.server``); the link reconnects by itself and says when it is down.
  Each call it makes is a method declared in ``tui.control.api`` (its name on the wire, params
  and answer), never a name of its own.

``connect(inventory)`` picks: the remote kind when the inventory names a server (unless
``RIGDECK_SERVER=off``), else the embedded one.
"""

from __future__ import annotations

import base64
import itertools
import json
import logging
import os
import queue as queue_mod
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agent.filemodes import UnsafeDirError
from tui.control import (
    api,
    serveradmin,  # noqa: F401  (`rigdeck server ...`: set-up and start on the server host)
)
from tui.control.doctor import DoctorError
from tui.control.history import JobRefError, rigdeck_home
from tui.control.hostlinks import HostReport
from tui.control.images import ImageError, ImagePush
from tui.control.jobs import AmbiguousJobError, JobError
from tui.control.metricsserver import DEFAULT_LISTEN, MetricsServer, http_listener
from tui.control.onboard import Candidate, Onboarding
from tui.control.pipelines import PipelineError
from tui.control.queue import QueueEntry
from tui.control.server import StateMirror, serve
from tui.control.service import ControllerService
from tui.control.sweeps import SweepError
from tui.model import wire
from tui.model.fairshare import QueuePolicy
from tui.model.inventory import INVENTORY_ENV, HostSpec, Inventory, InventoryError, default_inventory_path
from tui.model.jobspec import SERVER_ENV_FILE, JobSpec, JobSpecError
from tui.model.jobstate import describe_cause
from tui.model.jobview import JobDetail, JobRow, JobsSnapshot, JobView, LogBuffer, StopPlan
from tui.model.permissions import PermissionDenied
from tui.model.pipelinespec import PipelineSpec
from tui.model.pipelineview import PipelineDetail
from tui.model.scheduler import PlacementError
from tui.model.state import ClusterState
from tui.model.sweepview import SweepDetail
from tui.model.userconfig import NotifyConfig, UserConfig, load_config
from tui.remote.inventoryfile import hostfile_to_toml, load_hostfile, load_inventory
from tui.remote.transport import (
    AuthenticationError,
    Backoff,
    TransportError,
    UnreachableError,
    forget_passphrases,
    make_transport,
    remember_passphrase,
    set_passphrase_prompt,
)

log = logging.getLogger(__name__)

__all__ = [
    "AmbiguousJobError", "Candidate", "Client", "DEFAULT_LISTEN", "MetricsServer", "Onboarding",
    "forget_passphrases", "http_listener",
    "onboarding_offer", "remember_passphrase", "set_passphrase_prompt", "HostReport", "InProcessClient",
    "ImageError", "ImagePush", "InventoryError", "JobError", "PermissionDenied", "UnsafeDirError",
    "JobRefError", "JobSpecError", "JobView", "LinkStatus", "Membership", "PlacementError", "QueueEntry",
    "RemoteClient", "ServerError", "ServerKeyRefused", "TransportError", "connect", "describe_cause",
    "hostfile_to_toml", "load_hostfile", "load_inventory", "rigdeck_home", "serve", "serveradmin", "wire_json",
]


def onboarding_offer(inventory: str | None = None) -> Onboarding | None:
    """What the app offers when there is no inventory yet: the concrete ``Host`` entries of
    the ssh config, to check and write to the default inventory file. None when an inventory
    was named (``inventory`` or $RIGDECK_INVENTORY), the default file exists, or the ssh
    config has no concrete host (or cannot be read: the app goes on with this machine)."""
    if inventory or os.environ.get(INVENTORY_ENV) or default_inventory_path().exists():
        return None
    try:
        offer = Onboarding(default_inventory_path())
    except InventoryError as e:
        log.warning("no onboarding: %s", e)
        return None
    return offer if offer.candidates else None


def wire_json(value: Any) -> Any:
    """A typed view (or a list of them) as JSON values, for ``--json`` output."""
    return wire.encode(value)

SERVER_ENV = "RIGDECK_SERVER"  # "off": ignore the inventory's [server] (talk to hosts directly)


@dataclass(frozen=True)
class LinkStatus:
    """The face's path to its controller. Embedded: always up."""

    kind: str  # "embedded" | "server"
    up: bool
    detail: str  # "embedded", "server h1 (pid 4242)", "server h1: link down (…)"
    since: float  # when ``up`` last changed (time.time())
    queue_advances: bool  # queued jobs start with no face open


class ServerError(Exception):
    """An error the server reported that has no local type."""


class _ServerSpecError(JobSpecError):
    """A JobSpecError the server raised, in its words (file and field are in them already)."""

    def __init__(self, text: str) -> None:
        ValueError.__init__(self, text)
        self.path, self.field, self.expected, self.got = None, None, text, None


_ERRORS: dict[str, type[Exception]] = {
    "JobError": JobError, "PlacementError": PlacementError, "JobSpecError": _ServerSpecError,
    "JobRefError": JobError, "InventoryError": JobError, "SweepError": SweepError,
    "CodeSyncError": JobError, "TensorboardSyncError": JobError, "PipelineError": PipelineError,
    "DoctorError": DoctorError, "PermissionDenied": PermissionDenied,
}


class Client(api.ControllerAPI):
    """What the faces can see and do. Subclasses: InProcessClient, RemoteClient.

    The calls of the controller are its ``api.ControllerAPI`` methods, declared once in
    tui/control/api.py: a subclass makes them all in ``_call_declared`` and writes out only those
    it makes its own way. The methods here are the face's own: its link, and work done on the
    workstation whichever controller runs."""

    kind = "embedded"
    inventory: Inventory
    state: ClusterState

    # lifecycle
    def start(self, *, telemetry: bool = True, jobs: bool = True) -> Client:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def link(self) -> LinkStatus:
        raise NotImplementedError

    # hosts
    def probe(self, names: Sequence[str] | None = None) -> list[HostReport]:
        raise NotImplementedError

    def deploy(self, names: Sequence[str] | None = None) -> list[HostReport]:
        raise NotImplementedError

    def image_push(self, image: str, names: Sequence[str] | None = None,
                   progress: Callable[[str, int, int], None] | None = None) -> list[ImagePush]:
        """A container image of this machine's Podman store into each host's (skipping hosts
        that have it): one result per host."""
        raise NotImplementedError

    def exec(self, hosts: Sequence[str], argv: list[str], timeout_s: float) -> dict[str, Any]:
        """``argv`` run on ``hosts`` at once with no shell: host -> the agent's answer, or the
        TransportError that kept the host from answering."""
        raise NotImplementedError

    def trust_host_key(self, host: str, fingerprint: str) -> str:
        raise NotImplementedError

    @property
    def telemetry_hz(self) -> float:
        return 1.0

    # jobs (the app's live view)
    @property
    def jobs(self) -> Any:
        """The app's job source: snapshot(), detail(), select(), kick(), stop_plan(), launch(),
        stop_job(), inventory_hosts(), start(), stop()."""
        raise NotImplementedError

    def on_code_progress(self, fn: Callable[[str, str, int, int], None]) -> None:
        """``fn(job_id, host, bytes_done, bytes_total)`` as a job's code goes to its hosts (the
        embedded controller; a server reports the outcome in the job's events only)."""


# ---------------------------------------------------------------------------------------------
# Embedded


class InProcessClient(Client):
    kind = "embedded"

    def __init__(self, inventory: Inventory | None = None, *, accept_new: bool = False,
                 service: ControllerService | None = None, telemetry_hz: float = 1.0,
                 controller: Any = None, monitor: Any = None, jobs: Any = None,
                 notify: NotifyConfig | None = None, queue_policy: QueuePolicy | None = None):
        """``controller``, ``monitor``, ``jobs``: parts to use instead of making them (a test's
        recorded data, a benchmark's simulated cluster)."""
        if service is None:
            if inventory is None:
                assert controller is not None, "an inventory or a controller"
                inventory = controller.inventory
            service = ControllerService(inventory, accept_new=accept_new, telemetry_hz=telemetry_hz,
                                        monitor=monitor, controller=controller, source=jobs, notify=notify,
                                        queue_policy=queue_policy)
        self.service = service
        self.inventory = service.inventory
        if jobs is not None:  # a job source to show instead of the service's own (recorded data)
            service.source = jobs
        self._jobs = service.source
        self._since = time.time()

    @property
    def controller(self) -> Any:
        return self.service.ctl

    @property
    def state(self) -> ClusterState:  # type: ignore[override]
        return self.service.state

    @property
    def monitor(self) -> Any:
        return self.service.monitor

    @property
    def telemetry_hz(self) -> float:
        return float(getattr(self.service.monitor, "rate_hz", self.service.telemetry_hz) or 1.0)

    @property
    def jobs(self) -> Any:
        return self._jobs

    def start(self, *, telemetry: bool = True, jobs: bool = True) -> InProcessClient:
        if telemetry:
            self.service.monitor.start()
        if jobs:
            self._jobs.start()
        return self

    def close(self) -> None:
        self._jobs.stop()
        if self.service._monitor is not None:
            self.service._monitor.stop(timeout=2.0)
        self.service.ctl.close()
        self.service.close_notifier()

    def link(self) -> LinkStatus:
        return LinkStatus("embedded", True, "embedded controller", self._since, False)

    def _call_declared(self, method: api.Method, args: dict[str, Any]) -> Any:
        """Every call of the controller: its service method, with the call's arguments."""
        return getattr(self.service, str(method.service))(**args)

    def log_chunks(self, ref: str, rank: int | None = None,
                   follow: bool = False) -> Iterator[tuple[str, int, bytes, bool]]:
        return self.service.log_chunks(ref, rank=rank, follow=follow, binary=True)

    def probe(self, names: Sequence[str] | None = None) -> list[HostReport]:
        return self.service.probe(names)

    def deploy(self, names: Sequence[str] | None = None) -> list[HostReport]:
        return self.service.deploy(names)

    def image_push(self, image: str, names: Sequence[str] | None = None,
                   progress: Callable[[str, int, int], None] | None = None) -> list[ImagePush]:
        return self.service.image_push(image, names, progress)

    def exec(self, hosts: Sequence[str], argv: list[str], timeout_s: float) -> dict[str, Any]:
        return self.service.exec(hosts, argv, timeout_s)

    def trust_host_key(self, host: str, fingerprint: str) -> str:
        return self.service.trust_host_key(host, fingerprint)

    def on_code_progress(self, fn: Callable[[str, str, int, int], None]) -> None:
        self.service.manager.code_listeners.append(fn)


# ---------------------------------------------------------------------------------------------
# Remote


class _Call:
    def __init__(self) -> None:
        self.q: queue_mod.Queue[dict[str, Any]] = queue_mod.Queue()


class _RemoteJobs:
    """The app's job source over a server: a poller keeps the last snapshot and the open job's
    detail (its log lines mirrored into a local buffer), so the UI never waits on the network."""

    def __init__(self, client: RemoteClient, interval: float = 1.0):
        self.c = client
        self.interval = interval
        self._lock = threading.Lock()
        self._snapshot = JobsSnapshot((), 0)
        self._selected: str | None = None
        self._details: dict[str, JobDetail] = {}
        self._rows: dict[str, JobRow] = {}  # every job's row as the server last sent it
        self._logs: dict[str, LogBuffer] = {}
        self._kick = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> _RemoteJobs:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="remote-jobs")
            self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._kick.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._kick.clear()
            try:
                self.poll_once()
            except (TransportError, ServerError, JobError) as e:
                with self._lock:
                    self._snapshot = replace(self._snapshot, error=str(e))
            except Exception as e:
                log.exception("remote job poll failed")
                with self._lock:
                    self._snapshot = replace(self._snapshot, error=f"{type(e).__name__}: {e}")
            self._kick.wait(self.interval)

    def poll_once(self) -> None:
        since = self._snapshot.version if not self._snapshot.error and self._rows else -1
        data = self.c.call(api.jobs_snapshot, since=since)
        if data is not None:
            if data.get("full"):
                self._rows = {}
            for job_id, row in data["rows"].items():
                self._rows[job_id] = wire.decode(JobRow, row)  # only the rows that changed
            snap = JobsSnapshot(tuple(self._rows[j] for j in data["order"] if j in self._rows),
                                data["version"], error=data.get("error"), polled_at=data.get("polled_at"))
            with self._lock:
                self._snapshot = snap
        job_id = self._selected
        if job_id:
            buf = self._logs.setdefault(job_id, LogBuffer())
            d = self.c.call(api.job_detail, job_id=job_id, log_since=len(buf))
            if d is not None:
                logs = d.pop("logs")
                if logs["start"] > len(buf) or logs["length"] < len(buf):
                    buf = self._logs[job_id] = LogBuffer()  # a new server: start over
                    d2 = self.c.call(api.job_detail, job_id=job_id, log_since=0)
                    if d2 is None:
                        return
                    logs = d2.pop("logs")
                    d = d2
                buf.extend(tuple(x) for x in logs["lines"])  # type: ignore[misc]
                hints = wire._hints(JobDetail)
                fields = {k: wire.decode(hints[k], v) for k, v in d.items() if k in hints}
                detail = JobDetail(**fields, logs=buf)
                with self._lock:
                    self._details[job_id] = detail

    def snapshot(self) -> JobsSnapshot:
        with self._lock:
            return self._snapshot

    def detail(self, job_id: str) -> JobDetail | None:
        with self._lock:
            return self._details.get(job_id)

    def select(self, job_id: str | None) -> None:
        if job_id != self._selected:
            self._selected = job_id
            try:
                self.c.call_async(api.select, job_id=job_id)
            except TransportError:
                pass
            self._kick.set()

    def kick(self) -> None:
        self._kick.set()

    def stop_plan(self, job_id: str) -> StopPlan:
        return self.c.call(api.stop_plan, job_id=job_id)

    def launch(self, spec: JobSpec) -> str:
        spec, values = env_file_values(spec)
        job_id = self.c.call(api.source_launch, spec=spec.to_dict(), env_values=values)
        self.select(job_id)
        self._kick.set()
        return job_id

    def stop_job(self, job_id: str) -> str:
        state = self.c.call(api.source_stop, job_id=job_id)
        self._kick.set()
        return state

    def inventory_hosts(self) -> list[str]:
        return list(self.c.inventory.names)


# The server's ``rigdeck attach`` for a state dir given as $1 (``~/...`` expanded against $HOME).
ATTACH_SH = ('d=$1; case $d in "~") d=$HOME;; "~/"*) d=$HOME/${d#"~/"};; esac; '
             'exec "$d/venv/bin/rigdeck" attach --state-dir "$d"')


def env_file_values(spec: JobSpec) -> tuple[JobSpec, dict[str, str] | None]:
    """A launch through a server: the values of the spec's ``env_from_file``, read here (the
    file is on this machine) to go with the launch, and the spec with the names read now. A
    file that cannot be read is a JobSpecError naming it (never a value)."""
    if not spec.env_from_file:
        return spec, None
    import dataclasses

    from tui.model.jobspec import EnvFileError, read_env_file

    try:
        pairs = read_env_file(spec.env_from_file)
    except EnvFileError as e:
        raise JobSpecError(spec.path, "env_from_file", f"{e.expected} in {e.where}", e.got) from None
    return dataclasses.replace(spec, env_file_names=tuple(n for n, _ in pairs)), dict(pairs)


class ServerKeyRefused(AuthenticationError):
    """The server host refused the key this inventory reaches it with."""

    def __init__(self, host: HostSpec, cause: TransportError):
        key = ", ".join(host.identity_files) or "your SSH key"
        super().__init__(host.name, (
            f"the server host refused {key} for {host.user}@{host.address} ({cause.detail}): you are not "
            f"(or no longer) a user of this server, or this is not the key it knows you by; ask its operator "
            f"(rigdeck server add-user NAME --key YOUR_KEY.pub)"))


class RemoteClient(Client):
    """The controller API over one SSH channel to ``rigdeck attach`` on the server host."""

    kind = "server"

    def __init__(self, inventory: Inventory, *, accept_new: bool = False, telemetry_hz: float = 1.0,
                 call_timeout: float = 120.0, transport_factory: Callable[[], Any] | None = None,
                 server: Any = None):
        """``server``: where the server runs (``host``, ``state_dir``), default the inventory's
        ``[server]``; ``transport_factory``: how to reach it (default SSH to that host)."""
        server = server or getattr(inventory, "server", None)
        if server is None:
            raise ValueError("the inventory names no [server]")
        self.inventory = inventory
        self.server = server
        self.host = inventory.get(server.host)
        self.accept_new = accept_new
        self.call_timeout = call_timeout
        self._telemetry_hz = telemetry_hz
        self._factory = transport_factory or (lambda: make_transport(inventory, self.host, accept_new=accept_new))
        self.state = ClusterState([(h.name, h.address) for h in inventory.hosts])
        self._mirror = StateMirror(self.state)
        self._ids = itertools.count(1)
        self._calls: dict[int, _Call] = {}
        self._calls_lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._stream: Any = None
        self._transport: Any = None
        self._connected = threading.Event()
        self._refused: AuthenticationError | None = None  # the server host refused our key
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._subscribed = False
        self._up = False
        self._since = time.time()
        self._detail = "connecting"
        self._info: dict[str, Any] | None = None
        self._jobs = _RemoteJobs(self)
        self.bytes_in = 0
        self.reconnects = 0

    # -- connection ---------------------------------------------------------------------------

    @property
    def telemetry_hz(self) -> float:
        return self._telemetry_hz

    @property
    def jobs(self) -> Any:
        return self._jobs

    def start(self, *, telemetry: bool = True, jobs: bool = True) -> RemoteClient:
        self._subscribed = telemetry
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="server-link")
            self._thread.start()
        if jobs:
            self._jobs.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._jobs.stop()
        self._drop("closed")
        if self._thread is not None:
            self._thread.join(3.0)

    def _set_link(self, up: bool, detail: str) -> None:
        if up != self._up:
            self._since = time.time()
        self._up = up
        self._detail = detail

    def _drop(self, why: str) -> None:
        stream, self._stream = self._stream, None
        transport, self._transport = self._transport, None
        self._connected.clear()
        for s in (stream, transport):
            if s is not None:
                try:
                    s.close()
                except Exception:
                    pass
        with self._calls_lock:
            calls, self._calls = self._calls, {}
        for c in calls.values():
            c.q.put({"error": {"type": "UnreachableError", "message": f"server link lost: {why}"}})

    def _open(self) -> None:
        t = self._factory()
        t.connect()
        # The state dir is expanded by the host's sh from an argument, never parsed by it; and no
        # SFTP look first: a person's key (rigdeck server add-user) runs its forced command only.
        stream = t.open_stream(["sh", "-c", ATTACH_SH, "rigdeck-attach", self.server.state_dir])
        self._transport, self._stream = t, stream

    def _run(self) -> None:
        backoff = Backoff(initial=0.5, maximum=5.0)
        while not self._stop.is_set():
            try:
                self._open()
                self._pump_until_hello()
                backoff.reset()
                self._set_link(True, f"server {self.server.host} (pid {(self._info or {}).get('pid')})")
                self._connected.set()
                if self._subscribed:
                    self._mirror.reset()
                    self.call_async(api.subscribe_hosts, rate_hz=self._telemetry_hz)
                if self._jobs._selected:
                    self.call_async(api.select, job_id=self._jobs._selected)
                self._pump()
                why = "the server closed the channel"
            except AuthenticationError as e:  # a CLI command's call says so at once (_ensure_link)
                self._refused = e
                why = e.detail
            except TransportError as e:
                why = e.detail
            except Exception as e:  # never let the link thread die
                log.exception("server link")
                why = f"{type(e).__name__}: {e}"
            self._drop(why)
            if self._stop.is_set():
                break
            self._set_link(False, f"server {self.server.host}: link down ({why}); reconnecting")
            self.reconnects += 1
            self._stop.wait(backoff.next_delay())

    def _lines(self, timeout: float) -> Iterator[dict[str, Any] | None]:
        buf = b""
        unzip: Any = None  # after a hello that says so, the rest is one zlib stream
        while not self._stop.is_set():
            stream = self._stream
            if stream is None:
                return
            data = stream.recv(timeout)
            if data is None:
                yield None
                continue
            if data == b"":
                return
            self.bytes_in += len(data)
            buf += unzip.decompress(data) if unzip is not None else data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                try:
                    msg = json.loads(line)
                except ValueError:
                    log.info("bad line from the server: %r", line[:200])
                    continue
                if not isinstance(msg, dict):
                    continue
                if unzip is None and msg.get("event") == "hello" and msg.get("compress") == "zlib":
                    unzip = zlib.decompressobj()
                    buf = unzip.decompress(buf)
                yield msg

    def _pump_until_hello(self) -> None:
        deadline = time.monotonic() + max(20.0, self.host.connect_timeout)
        self._line_iter = self._lines(0.5)
        for msg in self._line_iter:
            if msg is not None and msg.get("event") == "hello":
                self._info = msg.get("data") or {}
                return
            if msg is None and time.monotonic() > deadline:
                raise UnreachableError(self.server.host, "no hello from the rigdeck server (is it started?)")
        raise UnreachableError(self.server.host, "the rigdeck server is not running there "
                                                 "(rigdeck server start)")

    def _pump(self) -> None:
        last_heard = time.monotonic()
        pinged = False
        for msg in self._line_iter:
            now = time.monotonic()
            if msg is None:
                # Silence: a link that died without a FIN (a dropped path) is found by a ping.
                if now - last_heard > 5.0 and not pinged:
                    self.call_async(api.ping)
                    pinged = True
                elif now - last_heard > 15.0:
                    raise UnreachableError(self.server.host, "no answer from the server for 15 s")
                continue
            last_heard, pinged = now, False
            self._dispatch(msg)

    def _dispatch(self, msg: dict[str, Any]) -> None:
        if "event" in msg:
            if msg["event"] == "hosts":
                self._mirror.apply(msg.get("data") or [])
            return
        with self._calls_lock:
            call = self._calls.get(msg.get("id"))  # type: ignore[arg-type]
            if call is not None and ("result" in msg or "error" in msg or "end" in msg):
                self._calls.pop(msg["id"], None)
        if call is not None:
            call.q.put(msg)

    def _send(self, rid: int, method: api.Method, params: dict[str, Any]) -> _Call:
        method.bind(params)  # a call the declaration does not allow fails here, not on the server
        call = _Call()
        with self._calls_lock:
            self._calls[rid] = call
        stream = self._stream
        if stream is None:
            with self._calls_lock:
                self._calls.pop(rid, None)
            raise UnreachableError(self.server.host, f"rigdeck server: {self._detail}")
        data = (json.dumps({"id": rid, "method": method.name, "params": params}, default=str) + "\n").encode()
        with self._send_lock:
            stream.send(data)
        return call

    # -- calls ------------------------------------------------------------------------------

    def call_async(self, method: api.Method, **params: Any) -> None:
        """Send and forget (the answer is dropped)."""
        rid = next(self._ids)
        self._send(rid, method, params)

    def _ensure_link(self) -> None:
        """A CLI command's first call starts the link (without telemetry) and waits for it; a
        key the server host refuses (a person removed, a wrong key) ends the wait at once, said
        in a line that names who, where and what to do (ServerKeyRefused)."""
        first = self._thread is None
        if first:
            self.start(telemetry=False, jobs=False)
        deadline = time.monotonic() + (max(30.0, self.host.connect_timeout * 3) if first else 5.0)
        while not self._connected.wait(0.1) and time.monotonic() < deadline:
            if self._refused is not None:
                raise ServerKeyRefused(self.host, self._refused)

    def call(self, method: api.Method, timeout: float | None = None, **params: Any) -> Any:
        """``method``'s answer, decoded as its declaration says."""
        self._ensure_link()
        rid = next(self._ids)
        call = self._send(rid, method, params)
        try:
            msg = call.q.get(timeout=timeout or self.call_timeout)
        except queue_mod.Empty:
            with self._calls_lock:
                self._calls.pop(rid, None)
            raise UnreachableError(self.server.host, f"the server did not answer {method.name} in time") from None
        return method.decode(self._result(msg))

    def _result(self, msg: dict[str, Any]) -> Any:
        if "error" in msg:
            err = msg["error"]
            kind, text = err.get("type", "Error"), err.get("message", "")
            if kind == "AmbiguousJobError":
                raise AmbiguousJobError(text, tuple(err.get("job_ids") or ()))
            if kind in ("UnreachableError", "TransportError"):
                raise UnreachableError(self.server.host, text)
            raise _ERRORS.get(kind, ServerError)(text)
        return msg.get("result")

    def stream(self, method: api.Method, **params: Any) -> Iterator[Any]:
        """A streaming method's items, each decoded as its declaration says."""
        self._ensure_link()
        rid = next(self._ids)
        call = self._send(rid, method, params)
        while True:
            try:
                msg = call.q.get(timeout=3600)
            except queue_mod.Empty:
                raise UnreachableError(self.server.host, f"{method.name}: nothing for an hour") from None
            if "item" in msg:
                with self._calls_lock:  # more to come: keep the call registered
                    self._calls.setdefault(rid, call)
                yield method.decode(msg["item"])
                continue
            if msg.get("end"):
                return
            self._result(msg)
            return

    # -- the API (tui.control.api declares each call: its name, params and answer) -------------

    def _call_declared(self, method: api.Method, args: dict[str, Any]) -> Any:
        """Every call of the controller: sent as declared, a spec as its dict; a stream's items
        decoded as they come."""
        params = {k: v.to_dict() if hasattr(v, "to_dict") else v for k, v in args.items()}
        if method.stream:
            return self.stream(method, **params)
        timeout = max(self.call_timeout, method.timeout_s) if method.timeout_s else None
        return self.call(method, timeout=timeout, **params)

    def link(self) -> LinkStatus:
        return LinkStatus("server", self._up, self._detail, self._since, True)

    def probe(self, names: Sequence[str] | None = None) -> list[HostReport]:
        raise ServerError("probing hosts runs from the workstation: RIGDECK_SERVER=off rigdeck hosts")

    def deploy(self, names: Sequence[str] | None = None) -> list[HostReport]:
        raise ServerError("agents are installed from the workstation: RIGDECK_SERVER=off rigdeck deploy, "
                          "then rigdeck server setup")

    def image_push(self, image: str, names: Sequence[str] | None = None,
                   progress: Callable[[str, int, int], None] | None = None) -> list[ImagePush]:
        raise ServerError("images are pushed from the workstation's Podman store: RIGDECK_SERVER=off "
                          "rigdeck image push")

    def exec(self, hosts: Sequence[str], argv: list[str], timeout_s: float) -> dict[str, Any]:
        """Only Slurm's reads (``tui.model.slurm.SERVER_READS``: its nodes and queue, on the login
        host), which the server runs through its agents (``slurm_read``); a server runs no
        other command of a client's."""
        from tui.model.slurm import SERVER_READS

        if tuple(argv) not in SERVER_READS:
            raise NotImplementedError
        return dict(self.slurm_read(list(argv)))

    def reconnect(self, host: str) -> None:
        self.call_async(api.reconnect, host=host)  # the app's key: never waits on the server

    def trust_host_key(self, host: str, fingerprint: str) -> str:
        raise ServerError("the server trusts only host keys recorded by its operator: record the key "
                          "on the workstation, then run rigdeck server setup")

    def _with_code(self, spec: JobSpec, *, env_file: bool = False) -> JobSpec:
        """``[code] sync`` through a server: the snapshot is taken here (the directory is on this
        machine) and what the server's store lacks of it is sent there; the server ships it to
        the hosts from its store. A sweep's or a pipeline's spec with ``env_from_file``
        (``env_file`` False) is refused here, naming its file, before anything is sent (the
        server carries a job's values to its first start only)."""
        if spec.env_from_file and not env_file:
            raise JobSpecError(spec.path, "env_from_file", SERVER_ENV_FILE)
        if spec.code is None or spec.code.tree is not None:
            return spec
        import dataclasses

        from tui.control.history import rigdeck_home
        from tui.model.codesync import CodeSyncError
        from tui.remote.codesync import CodeStore

        store = CodeStore(rigdeck_home() / "code")
        try:
            code, _done = store.snapshot(spec.code, f"{spec.path or 'job spec'}: [code] sync")
            assert code.tree is not None
            store.upload(_ServerStore(self), code.tree)
        except CodeSyncError as e:
            raise JobError(str(e)) from None
        return dataclasses.replace(spec, code=code)

    def launch(self, spec: JobSpec, queue: bool = True, env_values: dict[str, str] | None = None) -> JobView:
        spec, read = env_file_values(spec)
        return self._call_declared(api.launch, {"spec": self._with_code(spec, env_file=True), "queue": queue,
                                                "env_values": read if env_values is None else env_values})

    def sweep(self, spec: JobSpec) -> SweepDetail:
        return self._call_declared(api.sweep, {"spec": self._with_code(spec)})

    def stop(self, ref: str, grace_s: float | None = None, yes: bool = False, wait: bool = True) -> JobView:
        # A waiting stop is answered after the grace period (the job's own when none is given)
        # and the hosts' sweep: longer than an ordinary call may take.
        timeout = None if not wait else (grace_s + 90 if grace_s is not None else 900.0)
        return self.call(api.stop, timeout=timeout, ref=ref, grace_s=grace_s, yes=yes, wait=wait)

    def log_chunks(self, ref: str, rank: int | None = None,
                   follow: bool = False) -> Iterator[tuple[str, int, bytes, bool]]:
        for item in self.stream(api.log_chunks, ref=ref, rank=rank, follow=follow):
            yield item["host"], int(item["rank"]), base64.b64decode(item["b64"]), bool(item["partial"])

    def pipeline(self, spec: PipelineSpec) -> PipelineDetail:
        import dataclasses
        import os

        def absolute(p: Any) -> Any:  # the server tells the spec files apart from code by path
            return type(p)(os.path.abspath(p)) if p else p

        steps = tuple(dataclasses.replace(s, spec_path=absolute(s.spec_path),
                                          job=dataclasses.replace(self._with_code(s.job), path=absolute(s.job.path)))
                      for s in spec.steps)
        spec = dataclasses.replace(spec, steps=steps, path=absolute(spec.path))
        return self._call_declared(api.pipeline, {"spec": spec})


class _ServerStore:
    """The server's code store as ``CodeStore.upload`` sends to it: the three code methods of
    the controller API."""

    def __init__(self, client: RemoteClient):
        self.c = client

    def missing(self, blobs: list[Any]) -> list[Any]:
        return self.c.call(api.code_missing, blobs=blobs)

    def put(self, blobs: list[Any]) -> dict[str, Any]:
        return self.c.call(api.code_put, blobs=blobs)

    def add_manifest(self, tree: str, files: list[Any]) -> dict[str, Any]:
        return self.c.call(api.code_manifest, tree=tree, files=files)


class Membership:
    """A person's own accounts on the hosts, as the server records them: ``rigdeck server join``
    and ``leave`` (``tui.control.serveradmin``) call these over the person's own forced attach."""

    def __init__(self, client: RemoteClient):
        self.c = client

    def key(self) -> dict[str, Any]:
        """The server's public key, its host and who the server knows the caller as."""
        return self.c.call(api.join_key)

    def join(self, accounts: dict[str, str]) -> dict[str, Any]:
        return self.c.call(api.join, accounts=accounts)

    def leave(self, hosts: list[str] | None) -> dict[str, Any]:
        return self.c.call(api.leave, hosts=hosts)


def server_enabled(inventory: Inventory) -> bool:
    return getattr(inventory, "server", None) is not None and os.environ.get(SERVER_ENV, "").lower() not in (
        "off", "0", "no", "false")


def connect(inventory: Inventory, *, accept_new: bool = False, telemetry_hz: float = 1.0,
            config: UserConfig | None = None) -> Client:
    """The client this inventory calls for: the server it names, else the embedded controller.
    ``config``: the user's (default: ``load_config()``, checked here whichever it is, so a bad
    value stops the command before anything starts); its ``[notify]`` and queue rules
    (``[queue]``, ``[[group]]``, ``[[quota]]``) go to an embedded controller, as a server has
    its own copy."""
    config = config if config is not None else load_config()
    if server_enabled(inventory):
        return RemoteClient(inventory, accept_new=accept_new, telemetry_hz=telemetry_hz)
    return InProcessClient(inventory, accept_new=accept_new, telemetry_hz=telemetry_hz, notify=config.notify,
                           queue_policy=config.queue)
