"""The agent daemon: one per user per host, reached only through a unix socket.

It lives in its own session (started detached by ``attach``), so an SSH disconnect never touches
it. It opens no TCP port. A lock file makes it single-instance even when two attaches race; the
socket lives in a 0700 directory and is itself 0600.

Stdlib only, Python 3.9+.
"""
from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import logging.handlers
import os
import socket
import sys
import threading
import time
import zipfile
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Type  # noqa: F401

# code, artifacts and tensorboard serve rare requests: imported by the methods that use them, so
# an agent that only streams telemetry never holds them (nor hashlib, zipfile and shutil's kin).
from agent import facts, gpuhealth, protocol, roles, textfile
from agent.paths import Paths, self_command, spawn_daemon
from agent.version import agent_version

log = logging.getLogger("rigdeck.agent")

WRITE_BUFFER_LIMIT = 4 << 20  # a client that lets this much pile up is dropped
MIN_INTERVAL = 0.1
MAX_INTERVAL = 60.0
EXEC_OUTPUT_MAX = 1 << 20  # bytes of a command's stdout (and of its stderr) kept; the rest counted
EXEC_TIMEOUT_MAX_S = 86400.0
QUIET_WATCH_S = 10.0  # how often the job watcher looks while no job is live here
# A job's GPU health (job_status, and gpu-health.json for a job its host heals) comes from a
# sample at most this old: a GPU's fault is seen within it (a sample costs about 1 ms of CPU)
JOB_HEALTH_MAX_AGE_S = 0.5


def _encode(msg: Dict[str, Any]) -> bytes:
    """One line of the protocol; a message it cannot carry becomes the error saying why."""
    try:
        return protocol.encode(msg)
    except protocol.ProtocolError as e:
        return protocol.encode(protocol.error(msg.get("id"), e.code, e.message))


class _Client:
    def __init__(self, daemon: "Daemon", writer: asyncio.StreamWriter, cid: int):
        self.daemon = daemon
        self.writer = writer
        self.cid = cid
        self.greeted = False
        self.first = True  # the next line is the connection's first (the attach's role line)
        self.role = None  # type: Optional[roles.Role]
        self.stream_task = None  # type: Optional[asyncio.Task]
        self.closed = False

    def send(self, msg: Dict[str, Any]) -> None:
        if self.closed:
            return
        self.send_line(_encode(msg))

    def send_line(self, data: bytes) -> None:
        """An encoded message (``_encode``): the telemetry event, encoded once for every client."""
        if self.closed:
            return
        transport = self.writer.transport
        if transport.is_closing():
            self.close()
            return
        if transport.get_write_buffer_size() > WRITE_BUFFER_LIMIT:
            log.warning("client %d reads too slowly; dropping it", self.cid)
            self.close()
            return
        self.writer.write(data)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.stream_task is not None:
            self.stream_task.cancel()
        self.writer.close()


class Daemon:
    def __init__(
        self,
        state_dir: str,
        sim_gpus: int = 0,
        interval: float = 1.0,
        collector_factory: Optional[Callable[..., Any]] = None,
    ):
        self.paths = Paths(state_dir)
        self.sim_gpus = sim_gpus
        self.interval = interval
        self.version = agent_version()
        self.started = time.time()
        self._collector_factory = collector_factory
        self._collector = None  # type: Any
        self._collector_lock = threading.Lock()
        self._sample_lock = threading.Lock()  # one sample at a time: the ticker's, a request's
        self._lock_fd = None  # type: Optional[int]
        self._clients = {}  # type: Dict[int, _Client]
        self._handlers = set()  # type: Set[asyncio.Task]  # one per connection
        self._next_cid = 0
        self._latest = None  # type: Optional[Dict[str, Any]]
        self._latest_line = b""  # self._latest as a telemetry event, encoded by the ticker thread
        self._latest_seq = 0
        self._health = (-1e9, [])  # type: Tuple[float, List[Dict[str, Any]]]  # (monotonic, GPUs not ok)
        self._health_read = {}  # type: Dict[int, bool]  # that sample's GPUs: index -> simulated
        self._spare = []  # type: List[int]  # GPUs a job host may move ranks to, from that same sample
        self._published = None  # type: Optional[asyncio.Event]  # set (and replaced) per sample
        self._stop = None  # type: Optional[asyncio.Event]
        # The ticker thread's wake-up: a first subscriber or a new textfile wants a sample now.
        self._wake = threading.Event()
        self._closing = False  # the ticker thread ends at its next wake-up
        self._jobs_poked = None  # type: Optional[asyncio.Event]  # a jobs request ran: look now
        self._server = None  # type: Any
        self._successor = None  # type: Optional[List[str]]
        self._pending_upgrade = None  # type: Optional[str]
        self._last_claims = {}  # type: Dict[int, Dict[str, Any]]
        # The GPUs Slurm allocated here, when this host is a Slurm node (agent/slurmnode.py).
        from agent.slurmnode import SlurmNode

        self._slurm = SlurmNode()
        self._code_pool = None  # type: Any
        # node_exporter's textfile (agent/textfile.py): {"path", "host"} or None, as the last
        # controller said (kept in the state dir for the daemons after this one).
        self._textfile = textfile.load(self.paths.state_dir)  # type: Optional[Dict[str, str]]
        self._textfile_lock = threading.Lock()
        self._textfile_at = -1e9  # monotonic time of the last write
        self._textfile_error = None  # type: Optional[str]
        # Every call that changes jobs (start, claim, stop, the watcher's reaping) runs on this
        # one thread, in the order the requests came: the loop stays free to answer status and
        # telemetry while a restart's claim waits for its earlier attempt (up to 10 s) or a
        # start spawns its job host, and no two of them touch a job at once.
        from concurrent.futures import ThreadPoolExecutor

        self._jobs_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jobs")
        from agent.jobs import Jobs

        self.jobs = Jobs(self.paths.state_dir, self_command())
        self.methods = {
            "ping": self._m_ping,
            "version": self._m_version,
            "facts": self._m_facts,
            "sample": self._m_sample,
            "subscribe": self._m_subscribe,
            "unsubscribe": self._m_unsubscribe,
            "set_rate": self._m_set_rate,
            "upgrade": self._m_upgrade,
            "shutdown": self._m_shutdown,
            "job_start": self._m_job_start,
            "job_stop": self._m_job_stop,
            "job_list": lambda c, p: self.jobs.list(),
            "job_status": self._m_job_status,
            "job_logs": self._m_job_logs,
            "job_metrics": self._m_job_metrics,
            "job_claim": self._m_job_claim,
            "slurm_submit": self._m_slurm_submit,
            "slurm_template": self._m_slurm_template,
            "job_release": self._m_job_release,
            "job_check": self._m_job_check,
            "image_have": self._m_image_have,
            "image_load": self._m_image_load,
            "job_gc": self._m_job_gc,
            "probe_port": lambda c, p: {"port": self._probe_port(p)},
            "exec": self._m_exec,
            "route_source": lambda c, p: {"address": self._route_source(p)},
            "code_have": self._m_code_have,
            "code_put": self._m_code_put,
            "code_unpack": self._m_code_unpack,
            "code_commit": self._m_code_commit,
            "code_get": self._m_code_get,
            "artifact_pack": self._m_artifact_pack,
            "job_stacks": self._m_job_stacks,
            "job_tensorboard_files": self._m_job_tensorboard_files,
            "job_tensorboard_read": self._m_job_tensorboard_read,
            "gpu_health_clear": self._m_gpu_health_clear,
            "prometheus_textfile": self._m_prometheus_textfile,
        }  # type: Dict[str, Callable[[_Client, Dict[str, Any]], Any]]

    # -- single instance ---------------------------------------------------------------------

    def acquire_lock(self) -> bool:
        self.paths.ensure()
        fd = os.open(self.paths.lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                return False
            raise
        self._lock_fd = fd
        tmp = self.paths.pidfile + ".tmp"
        with open(tmp, "w") as f:
            f.write("%d\n" % os.getpid())
        os.replace(tmp, self.paths.pidfile)
        return True

    def release_lock(self) -> None:
        if self._lock_fd is not None:
            try:
                os.unlink(self.paths.pidfile)
            except OSError:
                pass
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- serving -----------------------------------------------------------------------------

    def hello(self) -> Dict[str, Any]:
        return protocol.hello(
            role="agent",
            agent_version=self.version,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            started=self.started,
            python=sys.version.split()[0],
            roles=list(roles.ROLES),
            archive=self.archive(),
        )

    def archive(self) -> Dict[str, Any]:
        """What this daemon's own version's archive is on disk now (``agent/<version>/agent.pyz``
        and ``agent/current``, where the controller installs them), read at every hello: its
        SHA-256 (None when missing or unreadable) and the version ``current`` names. A controller
        whose archive hashes the same uses this link without reading the file back over SFTP
        (tui/control/hostlinks.py ``_socket_link``): 255 KB less per host per command."""
        import hashlib

        base = os.path.join(self.paths.state_dir, "agent")
        digest = None  # type: Optional[str]
        try:
            with open(os.path.join(base, self.version, "agent.pyz"), "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        except (OSError, ValueError):
            pass
        try:
            with open(os.path.join(base, "current"), "rb") as f:
                current = f.read(256).decode("utf-8", "replace").strip() or None  # type: Optional[str]
        except OSError:
            current = None
        return {"sha256": digest, "current": current}

    async def serve(self) -> None:
        loop = asyncio.get_event_loop()
        self._published = asyncio.Event()
        self._stop = asyncio.Event()
        self._jobs_poked = asyncio.Event()
        self._closing = False
        self._server = await asyncio.start_unix_server(
            self._on_client, sock=self._listening_socket(), limit=protocol.MAX_MESSAGE_BYTES
        )
        log.info("agent %s serving on %s (pid %d)", self.version, self.paths.socket, os.getpid())
        ticker = threading.Thread(target=self._ticker, args=(loop,), name="ticker", daemon=True)
        ticker.start()
        watcher = asyncio.ensure_future(self._job_watcher())
        try:
            await self._stop.wait()
        finally:
            self._closing = True
            self._wake.set()
            watcher.cancel()
            self._server.close()
            for c in list(self._clients.values()):
                c.close()
            for task in list(self._handlers):
                task.cancel()
            await asyncio.gather(watcher, *self._handlers, return_exceptions=True)
            # A sample under way ends first (as the executor's did before asyncio.run returned).
            await loop.run_in_executor(None, ticker.join)
            try:
                os.unlink(self.paths.socket)
            except OSError:
                pass
            if self._collector is not None:
                self._collector.close()
            self._jobs_pool.shutdown(wait=False)
            self._textfile_stop()

    def _textfile_stop(self) -> None:
        """Stopped for good (no successor takes over): take the textfile away, so node_exporter
        serves no figures that stopped changing. The setting stays for the next daemon."""
        with self._textfile_lock:
            setting, self._textfile = self._textfile, None  # a write still under way does nothing
        if setting is not None and not self._successor:
            try:
                textfile.remove(setting["path"])
            except OSError:
                pass

    def _listening_socket(self) -> socket.socket:
        """Bind and listen under a private name, then rename onto the public path.

        A client that sees the path can connect at once: the path never names a socket that is
        bound but not yet listening (which refuses connections), nor one with the umask's mode.
        """
        staging = self.paths.socket + ".new"
        for path in (staging, self.paths.socket):  # stale: we hold the lock, nobody serves them
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            sock.bind(staging)
        finally:
            os.umask(old_umask)
        os.chmod(staging, 0o600)
        sock.listen(128)
        os.rename(staging, self.paths.socket)
        return sock

    def _collector_instance(self) -> Any:
        # Built on an executor thread: NVML init or the first nvidia-smi rows can take seconds.
        with self._collector_lock:
            return self._make_collector()

    def _make_collector(self) -> Any:
        if self._collector is None:
            if self._collector_factory is not None:
                self._collector = self._collector_factory()
            else:
                from agent.gpuhealth import sim_faults_path
                from agent.telemetry import Collector

                self._collector = Collector(sim_gpus=self.sim_gpus, interval=self.interval,
                                            faults_path=sim_faults_path(self.paths.state_dir))
        return self._collector

    def _subscribers(self) -> int:
        # tuple(): one copy the ticker thread can take while the loop adds or drops a client
        return sum(1 for c in tuple(self._clients.values()) if c.stream_task is not None)

    def _sample_data(self, slurm_max_age: float = 5.0) -> Dict[str, Any]:
        """A sample as the clients get it, with the GPUs' claims (file locks: never on the loop)
        and Slurm's allocation read at most ``slurm_max_age`` s ago (when Slurm answers)."""
        from agent.telemetry import sample_to_dict

        collector = self._collector_instance()
        with self._sample_lock:
            sample = collector.sample()
        data = sample if isinstance(sample, dict) else sample_to_dict(sample)
        self._add_claims(data)
        self._add_slurm(data, slurm_max_age)
        self._add_held_out(data)
        return data

    def _add_held_out(self, data: Dict[str, Any]) -> None:
        """The GPUs a job host of this account took its ranks off (agent/gpuhealth.py's held-out
        record) read as unhealthy, whatever the sensor says now: kept out of placement until an
        undrain clears them (``gpu_health_clear``)."""
        held = gpuhealth.read_held_out(self.paths.state_dir)
        if held:
            gpuhealth.lay_held_out(data.get("gpus") or [], held)

    async def _collect(self, slurm_max_age: float = 0.0) -> Dict[str, Any]:
        """A sample taken now, off the loop (a request's, while the ticker has none to give):
        Slurm is asked now too, as a placement reads it (unless ``slurm_max_age`` says its last
        answer will do)."""
        return await asyncio.get_event_loop().run_in_executor(None, self._sample_data, slurm_max_age)

    def _add_claims(self, data: Dict[str, Any]) -> None:
        """Each GPU's claim (the job and user holding it on this host), or None."""
        from agent import claims

        try:
            held = claims.held()
        except (OSError, claims.ClaimError):  # no directory to trust: no claim to show
            held = {}
        if held is None:  # a claim is being made right now: keep the last answer
            held = self._last_claims
        self._last_claims = held
        for g in data.get("gpus") or []:
            h = held.get(int(g.get("index", -1)))
            g["claim"] = {"job_id": h.get("job_id"), "user": h.get("user"), "since": h.get("since")} if h else None

    def _add_slurm(self, data: Dict[str, Any], max_age: float) -> None:
        """A GPU Slurm allocated (to anyone's job) is claimed by that Slurm job: the claim names
        it, with ``"scheduler": "slurm"``, where rigdeck holds no claim of its own there. A node
        Slurm keeps its jobs off (drained, down) says so in the host's sample (``"slurm"``)."""
        held = self._slurm.allocated(max_age)
        node = self._slurm.unavailable()
        if node is not None and isinstance(data.get("host"), dict):
            data["host"] = {**data["host"], "slurm": node}  # drained or down in Slurm: said
        if not held:
            return
        for g in data.get("gpus") or []:
            job = held.get(int(g.get("index", -1)))
            if job is not None and not g.get("claim"):
                g["claim"] = {"job_id": job.get("job_id"), "user": job.get("user"), "since": None,
                              "scheduler": "slurm"}

    def _ticking(self) -> bool:
        return self._subscribers() > 0 or self._textfile is not None

    def _tick_interval(self) -> float:
        if self._subscribers() == 0:  # sampling for the textfile alone
            return max(self.interval, textfile.IDLE_INTERVAL_S)
        return self.interval

    def _ticker(self, loop: asyncio.AbstractEventLoop) -> None:
        """The ticker thread: collect at the current rate while someone listens, and more slowly
        while only the textfile is written; hand the loop the latest sample, encoded once for
        every client. A first subscriber or a new textfile (``_wake``) gets a sample at once.

        A thread of its own, not a timer on the loop and a hop to an executor: one wake-up of
        this thread and one of the loop per tick, where those took four or five (with the GIL
        passed back and forth), and nothing at all while nobody listens."""
        next_tick = time.monotonic()
        while not self._closing:
            if not self._ticking():
                self._wake.clear()  # before looking again: a subscribe in between still wakes us
                if not self._ticking() and not self._closing:
                    self._wake.wait()
                next_tick = time.monotonic()
                continue
            self._wake.clear()
            self._tick_once(loop)
            next_tick += self._tick_interval()
            delay = next_tick - time.monotonic()
            if delay < 0:  # fell behind: skip, do not burst
                next_tick = time.monotonic()
                delay = 0
            if self._wake.wait(delay):  # woken by a first subscriber: sample now
                next_tick = time.monotonic()

    def _tick_once(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            data = self._sample_data()
        except Exception:  # a broken sensor must not stop the daemon
            if not self._closing:
                log.exception("telemetry sample failed")
            return
        line = _encode(protocol.event("telemetry", data))
        try:
            loop.call_soon_threadsafe(self._publish, data, line)
        except RuntimeError:  # the loop is closed: the daemon is stopping
            return
        if self._textfile is not None:
            self._write_textfile(data, False)

    def _publish(self, data: Dict[str, Any], line: bytes) -> None:
        """The loop's side of a tick: the latest sample, and the streams woken to send it."""
        self._latest, self._latest_line = data, line
        self._latest_seq += 1
        published, self._published = self._published, asyncio.Event()
        if published is not None:
            published.set()

    async def _stream(self, client: _Client) -> None:
        seen = 0
        try:
            while not client.closed:
                if self._latest_seq <= seen:  # nothing newer than the last one sent
                    assert self._published is not None  # set by serve()
                    await self._published.wait()
                    continue
                seen = self._latest_seq
                client.send_line(self._latest_line)
                # A slow reader parks here; samples published meanwhile are skipped, not queued.
                await client.writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._next_cid += 1
        client = _Client(self, writer, self._next_cid)
        self._clients[client.cid] = client
        task = asyncio.current_task()
        assert task is not None  # this runs as a task
        self._handlers.add(task)
        splitter = protocol.LineSplitter()
        client.send(self.hello())
        try:
            while not client.closed:
                data = await reader.read(65536)
                if not data:
                    break
                for line, err in splitter.feed(data):
                    if err is not None:
                        client.send(protocol.error(None, err.code, err.message))
                        continue
                    assert line is not None
                    self._handle_line(client, line)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            client.close()
            self._clients.pop(client.cid, None)
            self._handlers.discard(task)

    def _handle_line(self, client: _Client, line: bytes) -> None:
        first, client.first = client.first, False
        try:
            msg = protocol.decode(line)
        except protocol.ProtocolError as e:
            client.send(protocol.error(e.request_id, e.code, e.message))
            return
        mtype = msg["type"]
        rid = msg.get("id")
        if mtype == "role":
            self._take_role(client, msg, first)
            return
        if mtype == "hello":
            if msg["protocol"] != protocol.PROTOCOL_VERSION:
                client.send(
                    protocol.error(
                        rid, protocol.VERSION_MISMATCH,
                        "agent speaks protocol %d, client %r" % (protocol.PROTOCOL_VERSION, msg["protocol"]),
                    )
                )
                return
            client.greeted = True
            return
        if mtype != "request":
            client.send(protocol.error(rid, protocol.BAD_MESSAGE, "the agent accepts hello and request only"))
            return
        if not client.greeted:
            client.send(protocol.error(rid, protocol.NOT_HELLO, "send hello first"))
            return
        method = self.methods.get(msg["method"])
        if method is None:
            client.send(protocol.error(rid, protocol.UNKNOWN_METHOD, "unknown method %r" % msg["method"]))
            return
        role = client.role
        why = role.refusal(msg["method"], msg["params"]) if role is not None else None
        if why is not None and role is not None:
            log.warning("client %d (role %s): refused %s", client.cid, role.name, msg["method"])
            client.send(protocol.error(rid, protocol.REFUSED, why))
            return
        try:
            result = method(client, msg["params"])
        except protocol.ProtocolError as e:
            client.send(protocol.error(rid, e.code, e.message))
            return
        except Exception as e:  # never let one request take the daemon down
            log.exception("method %s failed", msg["method"])
            client.send(protocol.error(rid, protocol.INTERNAL, "%s: %s" % (type(e).__name__, e)))
            return
        if asyncio.iscoroutine(result):
            asyncio.ensure_future(self._finish(client, rid, result))
        else:
            client.send(protocol.ok(rid, result))

    def _take_role(self, client: _Client, msg: Dict[str, Any], first: bool) -> None:
        """The attach's role line (``attach --role``): only the connection's first line, once.
        A role this agent does not know closes the connection: nothing unchecked gets through."""
        if not first:
            client.send(protocol.error(None, protocol.BAD_MESSAGE, "a role is the connection's first line only"))
            return
        try:
            client.role = roles.Role(msg["role"])
        except ValueError as e:
            client.send(protocol.error(None, protocol.REFUSED, str(e)))
            client.close()

    async def _finish(self, client: _Client, rid: Any, coro: Any) -> None:
        try:
            result = await coro
        except protocol.ProtocolError as e:
            client.send(protocol.error(rid, e.code, e.message))
            return
        except Exception as e:
            log.exception("request %s failed", rid)
            client.send(protocol.error(rid, protocol.INTERNAL, "%s: %s" % (type(e).__name__, e)))
            return
        client.send(protocol.ok(rid, result))

    # -- methods -----------------------------------------------------------------------------

    def _m_ping(self, client: _Client, params: Dict[str, Any]) -> Any:
        return {"time": time.time()}

    def _m_version(self, client: _Client, params: Dict[str, Any]) -> Any:
        h = self.hello()
        del h["type"]
        return h

    def _m_facts(self, client: _Client, params: Dict[str, Any]) -> Any:
        return facts.collect(self.paths.state_dir)

    async def _m_job_status(self, client: _Client, params: Dict[str, Any]) -> Any:
        """The job here, with the health of this host's GPUs that are not ok (``gpu_health``): the
        supervisor that polls the job sees a failing GPU without a telemetry stream of its own;
        for a failed job too, since a rank that died as its GPU failed died of the GPU."""
        status = self.jobs.status(self._str(params, "job_id"))
        if isinstance(status, dict) and status.get("state") not in (None, "succeeded", "stopped"):
            # a failure is judged on a fresh sample: the fault that killed the rank just came (a
            # supervisor asks for one too when a rank elsewhere failed first, as its peer died)
            fresh = status.get("state") == "failed" or params.get("fresh_health") is True
            status["gpu_health"] = await self._gpu_health(max_age=0.0 if fresh else JOB_HEALTH_MAX_AGE_S)
            # A rank of a container that could not reach its GPUs, which this host sees healthy:
            # the container's fault (agent/gpuhealth.py), not a GPU to drain.
            lost = gpuhealth.container_fault(status.get("cause"), status["gpu_health"], self._health_read,
                                             str(status.get("host") or ""))
            if lost is not None:
                status["cause"] = lost
        return status

    async def _gpu_health(self, max_age: float) -> List[Dict[str, Any]]:
        """This host's GPUs whose health is not ok, from a sample at most ``max_age`` s old (the
        stream's, when someone subscribes; else one taken now). ``max_age`` 0 is a sample taken
        now, even while a stream runs: the stream's last one may be up to a tick older than the
        fault that killed a rank. A failing sample reads as none."""
        now = time.monotonic()
        if max_age > 0 and now - self._health[0] <= max_age:
            return self._health[1]
        latest = self._latest if max_age > 0 and self._subscribers() > 0 else None
        try:
            data = latest if latest is not None else await self._collect()
        except Exception:  # a broken sensor must not break job_status
            log.exception("telemetry sample for GPU health failed")
            self._health_read = {}  # nothing known of any GPU: none is "healthy on the host"
            return []
        bad = [{"index": g.get("index"), "health": g.get("health"), "reason": g.get("health_reason"),
                "simulated": bool(g.get("simulated"))}
               for g in data.get("gpus") or [] if g.get("health") not in (None, "ok")]
        self._health_read = {int(g["index"]): bool(g.get("simulated")) for g in data.get("gpus") or []
                             if isinstance(g.get("index"), int)}
        self._spare = gpuhealth.spare_gpus(data.get("gpus") or [])
        self._health = (time.monotonic(), bad)
        return bad

    async def _m_sample(self, client: _Client, params: Dict[str, Any]) -> Any:
        # ``fresh``: a sample taken after this request came, not the stream's latest (up to a
        # tick old): placement right after a stop must not read the stopped job's claims.
        # ``slurm`` false: Slurm is not asked now (its last answer stands): a launch through
        # Slurm, which places the job itself, needs the host's GPUs and facts, not Slurm's claims
        # (``scontrol`` takes seconds while Slurm is busy ending a job).
        if params.get("fresh") is not True and self._latest is not None and self._subscribers() > 0:
            return self._latest
        return await self._collect(0.0 if params.get("slurm") is not False else float("inf"))

    def _rate_param(self, params: Dict[str, Any]) -> Optional[float]:
        hz = params.get("rate_hz")
        if hz is None:
            return None
        if isinstance(hz, bool) or not isinstance(hz, (int, float)) or not (1 / MAX_INTERVAL <= hz <= 10):
            raise protocol.ProtocolError(protocol.BAD_PARAMS, "rate_hz must be a number in 1/60..10")
        return 1.0 / float(hz)

    def _apply_interval(self, interval: float) -> None:
        self.interval = max(MIN_INTERVAL, min(MAX_INTERVAL, interval))
        if self._collector is not None and hasattr(self._collector, "set_interval"):
            self._collector.set_interval(self.interval)

    def _m_subscribe(self, client: _Client, params: Dict[str, Any]) -> Any:
        interval = self._rate_param(params)
        if interval is not None:
            self._apply_interval(interval)
        if client.stream_task is None:
            client.stream_task = asyncio.ensure_future(self._stream(client))
            self._wake.set()
        return {"rate_hz": 1.0 / self.interval}

    def _m_unsubscribe(self, client: _Client, params: Dict[str, Any]) -> Any:
        if client.stream_task is not None:
            client.stream_task.cancel()
            client.stream_task = None
        return {}

    def _m_set_rate(self, client: _Client, params: Dict[str, Any]) -> Any:
        interval = self._rate_param(params)
        if interval is None:
            raise protocol.ProtocolError(protocol.BAD_PARAMS, "set_rate needs rate_hz")
        self._apply_interval(interval)
        return {"rate_hz": 1.0 / self.interval}

    def busy(self) -> bool:
        """True while jobs run here: an upgrade waits for them (they would survive it, but the
        old daemon is the one that knows their bookkeeping best)."""
        return self.jobs.busy()

    def _supervise_jobs(self) -> List[Dict[str, Any]]:
        """Reap, stop what dead job hosts left, and say which jobs changed (the jobs thread)."""
        self.jobs.supervise()
        return self.jobs.changes()

    async def _job_watcher(self) -> None:
        """Tell every client about job state changes; hand over to a newer agent once idle."""
        loop = asyncio.get_event_loop()
        while True:
            try:
                # One hop to the jobs thread, not two: most seconds nothing changed.
                changes = await loop.run_in_executor(self._jobs_pool, self._supervise_jobs)
                await self._tell_gpu_health(loop)
                for st in changes:
                    for c in list(self._clients.values()):
                        if c.greeted:
                            c.send(protocol.event("job", st))
                if self._pending_upgrade and not await loop.run_in_executor(self._jobs_pool, self.busy):
                    self._successor = [sys.executable, self._pending_upgrade]
                    self._stop_now()
            except Exception:
                log.exception("job watcher")
            await self._job_watch_pause(loop)

    async def _tell_gpu_health(self, loop: asyncio.AbstractEventLoop) -> None:
        """While a job its host heals in place runs here, its GPUs' health, judged here each
        second (a sample at most ``JOB_HEALTH_MAX_AGE_S`` old), goes into its directory for its job host to read: with
        nobody watching, nobody else would ask for a sample."""
        jobs = await loop.run_in_executor(self._jobs_pool, self.jobs.healing_here)
        if not jobs:
            return
        bad = await self._gpu_health(max_age=JOB_HEALTH_MAX_AGE_S)
        await loop.run_in_executor(self._jobs_pool, self.jobs.tell_gpu_health, jobs, bad, list(self._spare))

    async def _job_watch_pause(self, loop: asyncio.AbstractEventLoop) -> None:
        """A second while a job is live or an upgrade waits. A host with no live job (most of
        the time) is looked at every 10 s, and the loop does not even wake in between: a job can
        only start through this daemon, and every request that changes jobs (``_in_jobs_thread``)
        ends the pause at once."""
        poked = self._jobs_poked
        assert poked is not None  # set by serve()
        poked.clear()  # before looking: a request that ends after this still ends the pause
        if not self.jobs.quiet() or self._pending_upgrade:
            await asyncio.sleep(1.0)
            return
        timer = loop.call_later(QUIET_WATCH_S, poked.set)  # a timer, not wait_for's task
        try:
            await poked.wait()
        finally:
            timer.cancel()

    @staticmethod
    def _str(params: Dict[str, Any], key: str) -> str:
        v = params.get(key)
        if not isinstance(v, str) or not v:
            raise protocol.ProtocolError(protocol.BAD_PARAMS, "%r must be a non-empty string" % key)
        return v

    @staticmethod
    def _int(params: Dict[str, Any], key: str, default: Optional[int] = None) -> int:
        v = params.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise protocol.ProtocolError(protocol.BAD_PARAMS, "%r must be an integer >= 0" % key)
        return v

    def _m_code_have(self, client: _Client, p: Dict[str, Any]) -> Any:
        from agent import code

        return self._code(lambda: code.have(self.paths.state_dir, p.get("tree"), p.get("blobs")))

    def _m_code_put(self, client: _Client, p: Dict[str, Any]) -> Any:
        from agent import code

        return self._code_in_thread(lambda: code.put(self.paths.state_dir, p.get("blobs")))

    def _m_code_unpack(self, client: _Client, p: Dict[str, Any]) -> Any:
        from agent import code

        return self._code_in_thread(lambda: code.unpack(self.paths.state_dir, p.get("pack")))

    def _m_code_commit(self, client: _Client, p: Dict[str, Any]) -> Any:
        from agent import code

        return self._code(lambda: code.commit(self.paths.state_dir, p.get("tree"), p.get("files")))

    def _image_params(self, p: Dict[str, Any]) -> Tuple[str, str]:
        image, wanted = p.get("image"), p.get("id")
        if not isinstance(image, str) or not image or image.startswith("-") or not isinstance(wanted, str):
            raise protocol.ProtocolError(protocol.BAD_PARAMS, "image and id must be strings (an image name, its id)")
        return image, wanted

    async def _m_image_have(self, client: _Client, p: Dict[str, Any]) -> Any:
        from agent import container

        image, wanted = self._image_params(p)
        return await self._code_in_thread(lambda: container.image_have(image, wanted, self.paths.state_dir))

    async def _m_image_load(self, client: _Client, p: Dict[str, Any]) -> Any:
        from agent import container

        image, wanted = self._image_params(p)
        path = self._str(p, "path")

        def load() -> Any:
            try:
                return container.image_load(path, image, wanted, self.paths.state_dir)
            except container.ContainerError as e:
                raise protocol.ProtocolError(protocol.BAD_PARAMS, str(e)) from None
        return await self._code_in_thread(load)

    def _m_code_get(self, client: _Client, p: Dict[str, Any]) -> Any:
        from agent import artifacts

        return self._code_in_thread(
            lambda: artifacts.get(self.paths.state_dir, p.get("sha"), p.get("offset"), p.get("size")))

    @staticmethod
    def _code(fn: Callable[[], Any]) -> Any:
        """Synced code (agent/code.py): a bad request is the caller's error, not the daemon's."""
        from agent import code

        try:
            return fn()
        except code.CodeError as e:
            raise protocol.ProtocolError(protocol.BAD_PARAMS, str(e)) from None

    async def _code_in_thread(self, fn: Callable[[], Any]) -> Any:
        """Storing sent contents (decode, hash, write) in a thread of its own, one at a time and
        in the order they came (a large content's parts must be appended in order), while the
        loop goes on reading the next message."""
        if self._code_pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._code_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="code")
        return await asyncio.get_running_loop().run_in_executor(self._code_pool, lambda: self._code(fn))

    def _m_artifact_pack(self, client: _Client, params: Dict[str, Any]) -> Any:
        """Pack ``kind`` (output, model, checkpoints) of an ended job here as a tree of the code
        store (agent/artifacts.py); hashing runs in the code thread, off the loop."""
        from agent import artifacts, code
        from agent.jobhost import TERMINAL
        from agent.jobs import JobError

        job_id = self._str(params, "job_id")
        kind = params.get("kind")
        if kind not in artifacts.KINDS:
            raise protocol.ProtocolError(protocol.BAD_PARAMS, "'kind' must be one of %s" % ", ".join(artifacts.KINDS))
        try:
            job_dir = self.jobs.job_dir(job_id)
        except JobError as e:
            raise protocol.ProtocolError(protocol.BAD_PARAMS, str(e)) from None
        st = self.jobs._state(job_id)
        if st is None:
            raise protocol.ProtocolError(protocol.BAD_PARAMS, "no job %s on this host" % job_id)
        if st.get("state") not in TERMINAL:
            raise protocol.ProtocolError(
                protocol.BAD_PARAMS, "job %s is still %s on this host: its artifacts are packed once it has ended"
                % (job_id, st.get("state")))
        from agent.jobhost import read_json

        plan = read_json(os.path.join(job_dir, "plan.json")) or {}

        def run() -> Any:
            try:
                return artifacts.pack(self.paths.state_dir, job_dir, job_id, plan, kind)
            except artifacts.ArtifactError as e:
                raise code.CodeError(str(e)) from None
            except OSError as e:
                raise code.CodeError("cannot pack %s of job %s: %s" % (kind, job_id, e)) from None

        return self._code_in_thread(run)

    def _m_exec(self, client: _Client, params: Dict[str, Any]) -> Any:
        """Run ``argv`` here, as this user, with no shell: each argument reaches the program as
        it was given (``rigdeck exec``). Answers when it ends or after ``timeout_s`` (then its
        process group is killed): exit code, signal, and its stdout and stderr (the first
        EXEC_OUTPUT_MAX bytes of each, the rest counted)."""
        argv = params.get("argv")
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and "\0" not in a for a in argv) \
                or not argv[0]:
            raise protocol.ProtocolError(protocol.BAD_PARAMS, "'argv' must be a non-empty list of strings")
        timeout = params.get("timeout_s", 600)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
                or not (0 < timeout <= EXEC_TIMEOUT_MAX_S):
            raise protocol.ProtocolError(protocol.BAD_PARAMS,
                                         "'timeout_s' must be a number in (0, %d]" % EXEC_TIMEOUT_MAX_S)
        return self._exec(list(argv), float(timeout))

    async def _exec(self, argv: List[str], timeout: float) -> Dict[str, Any]:
        import signal as _signal

        started = time.time()
        out = {"exit_code": None, "signal": None, "stdout": "", "stderr": "", "stdout_dropped": 0,
               "stderr_dropped": 0, "timed_out": False, "error": None}  # type: Dict[str, Any]
        try:
            # HOSTNAME as an interactive shell sets it (a program started with no shell has no
            # such variable otherwise): `rigdeck exec --all -- sh -c 'echo $HOSTNAME'` names each host.
            env = dict(os.environ)
            env.setdefault("HOSTNAME", socket.gethostname())
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, cwd=os.path.expanduser("~"), start_new_session=True,
                env=env)
        except OSError as e:  # as a shell says it: 127 not found, 126 found but not runnable
            out["exit_code"] = 127 if isinstance(e, FileNotFoundError) else 126
            out["error"] = "%s: %s" % (argv[0], e.strerror or e)
            out["duration_s"] = round(time.time() - started, 3)
            return out
        kept = {"stdout": bytearray(), "stderr": bytearray()}  # type: Dict[str, bytearray]

        async def drain(name: str, stream: Any) -> None:
            while True:
                chunk = await stream.read(65536)
                if not chunk:
                    return
                room = EXEC_OUTPUT_MAX - len(kept[name])
                kept[name] += chunk[:max(0, room)]
                out[name + "_dropped"] += max(0, len(chunk) - max(0, room))

        try:
            await asyncio.wait_for(asyncio.gather(drain("stdout", proc.stdout), drain("stderr", proc.stderr),
                                                  proc.wait()), timeout)
        except asyncio.TimeoutError:
            out["timed_out"] = True
            try:
                os.killpg(proc.pid, _signal.SIGKILL)
            except OSError:
                pass
            await proc.wait()
        rc = proc.returncode
        if rc is not None and rc < 0:
            out["signal"], out["exit_code"] = -rc, 128 - rc
        else:
            out["exit_code"] = rc
        for name in ("stdout", "stderr"):
            out[name] = bytes(kept[name]).decode("utf-8", "replace")
        out["duration_s"] = round(time.time() - started, 3)
        return out

    async def _in_jobs_thread(self, fn: Callable[[], Any], refused: str = "",
                              errors: Tuple[Type[BaseException], ...] = ()) -> Any:
        """``fn()`` on the jobs thread (in request order); ``errors`` come back as a bad-params
        answer that starts with ``refused``."""
        try:
            return await asyncio.get_event_loop().run_in_executor(self._jobs_pool, fn)
        except errors as e:
            raise protocol.ProtocolError(protocol.BAD_PARAMS, "%s%s" % (refused, e)) from None
        finally:
            self._poke_job_watcher()

    def _poke_job_watcher(self) -> None:
        """Jobs may have changed (or an upgrade waits): the job watcher looks now, not in 10 s."""
        if self._jobs_poked is not None:
            self._jobs_poked.set()

    def _m_job_start(self, client: _Client, params: Dict[str, Any]) -> Any:
        plan = params.get("plan")
        if not isinstance(plan, dict):
            raise protocol.ProtocolError(protocol.BAD_PARAMS, "job_start needs a 'plan' object")
        from agent.jobs import JobError

        return self._in_jobs_thread(lambda: self.jobs.start(plan), "cannot start: ",
                                    (JobError, KeyError, IndexError, TypeError, ValueError))

    def _m_job_stop(self, client: _Client, params: Dict[str, Any]) -> Any:
        grace = params.get("grace_s")
        if grace is not None and (isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace < 0):
            raise protocol.ProtocolError(protocol.BAD_PARAMS, "grace_s must be a number >= 0")
        job_id = self._str(params, "job_id")
        keep = params.get("keep_standbys", False)
        if not isinstance(keep, bool):
            raise protocol.ProtocolError(protocol.BAD_PARAMS, "keep_standbys must be true or false")
        return self._in_jobs_thread(lambda: self.jobs.stop(job_id, grace, keep_standbys=keep))

    def _m_job_logs(self, client: _Client, params: Dict[str, Any]) -> Any:
        # base64 takes 4/3 of the bytes: a binary chunk stays well inside one message
        limit = 512 * 1024 if params.get("binary") else 256 * 1024
        return self.jobs.logs(self._str(params, "job_id"), self._int(params, "rank"),
                              self._int(params, "offset", 0), min(limit, self._int(params, "max_bytes", limit)),
                              binary=bool(params.get("binary")))

    def _gpus(self, params: Dict[str, Any]) -> List[int]:
        gpus = params.get("gpus")
        if not isinstance(gpus, list) or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0
                                                 for g in gpus):
            raise protocol.ProtocolError(protocol.BAD_PARAMS, "'gpus' must be a list of GPU indices")
        return gpus

    def _m_job_claim(self, client: _Client, params: Dict[str, Any]) -> Any:
        from agent.jobs import JobError

        job_id, gpus = self._str(params, "job_id"), self._gpus(params)
        return self._in_jobs_thread(lambda: self.jobs.claim(job_id, gpus), "cannot claim: ", (JobError, OSError))

    def _m_slurm_submit(self, client: _Client, params: Dict[str, Any]) -> Any:
        """Submit a job to Slurm from here (agent/slurmstep.py): ``sbatch`` with the controller's
        ``options`` (each ``--name=value`` of a known name) and the constant batch script, whose
        step runs this agent's ``slurmhost`` for ``job_id`` on every node. Slurm's job id, or
        Slurm's own words when it refuses."""
        from agent import slurmstep
        from agent.jobs import JobError

        job_id = self._str(params, "job_id")
        options = params.get("options")
        template = params.get("template")
        nodes_agent = params.get("agent")

        def submit() -> Dict[str, Any]:
            self.jobs.job_dir(job_id)  # a job id the job dirs take
            command = slurmstep.step_command(self.jobs.zipapp_command or self.jobs.agent_command,
                                             self.jobs.unpacked_agent() if template else None, nodes_agent)
            return slurmstep.submit(self.paths.state_dir, self.jobs.root, command, job_id, options, template)
        return self._in_jobs_thread(submit, "cannot submit: ", (JobError, slurmstep.SlurmStepError, OSError))

    def _m_slurm_template(self, client: _Client, params: Dict[str, Any]) -> Any:
        """The controller's template of a job's plan (agent/slurmstep.py), named ``key``: this node,
        if Slurm gives it the job, makes its plan of it with nobody watching."""
        from agent import slurmstep

        key, template = params.get("key"), params.get("template")

        def write() -> Dict[str, Any]:
            path = slurmstep.write_template(self.jobs.root, key, template)
            # where this node's job hosts start from (the unpacked copy, made if it is gone)
            return {"path": path, "agent": self.jobs.unpacked_agent()}
        return self._in_jobs_thread(write, "cannot keep the template: ", (slurmstep.SlurmStepError, OSError))

    def _m_job_release(self, client: _Client, params: Dict[str, Any]) -> Any:
        job_id = self._str(params, "job_id")
        return self._in_jobs_thread(lambda: self.jobs.release(job_id))

    async def _m_job_check(self, client: _Client, params: Dict[str, Any]) -> Any:
        mb = params.get("min_free_mb", 0)
        if isinstance(mb, bool) or not isinstance(mb, (int, float)) or mb < 0:
            raise protocol.ProtocolError(protocol.BAD_PARAMS, "min_free_mb must be a number >= 0")
        container = params.get("container")
        if container is not None and not (isinstance(container, dict) and isinstance(container.get("image"), str)):
            raise protocol.ProtocolError(protocol.BAD_PARAMS, "container must be an object with an 'image'")
        job_id, gpus = self._str(params, "job_id"), self._gpus(params)
        if container is None:
            return self.jobs.check(job_id, gpus, float(mb))
        # podman answers in a fraction of a second, but not on the loop's time
        return await self._in_jobs_thread(lambda: self.jobs.check(job_id, gpus, float(mb), container))

    async def _m_job_stacks(self, client: _Client, params: Dict[str, Any]) -> Any:
        """The Python stacks of the job's live ranks here (agent/stacks.py); the signals and the
        wait for the dumps (up to ``timeout_s``, at most 10) run off the loop."""
        from agent import stacks

        job_dir = self.jobs.job_dir(self._str(params, "job_id"))
        why = params.get("why") or ""
        wait = params.get("timeout_s", 3.0)
        if not isinstance(why, str) or isinstance(wait, bool) or not isinstance(wait, (int, float)) or wait < 0:
            raise protocol.ProtocolError(protocol.BAD_PARAMS, "why must be text and timeout_s a number >= 0")
        job_id = self._str(params, "job_id")
        return await asyncio.get_running_loop().run_in_executor(
            None, lambda: stacks.collect(job_dir, job_id, why, min(float(wait), 10.0)))

    def _tensorboard_job_dir(self, params: Dict[str, Any]) -> str:
        from agent.jobs import JobError

        job_id = self._str(params, "job_id")
        try:
            job_dir = self.jobs.job_dir(job_id)
        except JobError as e:
            raise protocol.ProtocolError(protocol.BAD_PARAMS, str(e)) from None
        if not os.path.isdir(job_dir):
            raise protocol.ProtocolError(protocol.BAD_PARAMS, "no job %s on this host" % job_id)
        return job_dir

    async def _tensorboard(self, fn: Callable[[], Any]) -> Any:
        """A walk or a read of a job's TensorBoard files (agent/tensorboard.py), off the loop."""
        from agent import tensorboard

        try:
            return await asyncio.get_running_loop().run_in_executor(None, fn)
        except tensorboard.TensorboardError as e:
            raise protocol.ProtocolError(protocol.BAD_PARAMS, str(e)) from None

    def _m_job_tensorboard_files(self, client: _Client, params: Dict[str, Any]) -> Any:
        """The job's TensorBoard directories here and the files TensorBoard reads in them."""
        from agent import tensorboard

        job_dir = self._tensorboard_job_dir(params)
        return self._tensorboard(lambda: tensorboard.files(job_dir))

    def _m_job_tensorboard_read(self, client: _Client, params: Dict[str, Any]) -> Any:
        """A piece of one of them, from ``offset`` (at most 512 KiB)."""
        from agent import tensorboard

        job_dir = self._tensorboard_job_dir(params)
        offset = self._int(params, "offset", 0)
        max_bytes = self._int(params, "max_bytes", tensorboard.MAX_READ)
        return self._tensorboard(lambda: tensorboard.read_in_job(
            job_dir, params.get("dir"), params.get("path"), offset, max_bytes))

    def _m_gpu_health_clear(self, client: _Client, params: Dict[str, Any]) -> Any:
        """Forget the faults remembered for these GPUs (all when ``gpus`` is absent): an operator
        undrained them. Returns the GPUs that had one."""
        gpus = params.get("gpus")
        if gpus is not None and (not isinstance(gpus, list) or not all(
                isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus)):
            raise protocol.ProtocolError(protocol.BAD_PARAMS, "gpus must be a list of GPU indices")
        cleared = []  # type: List[int]
        try:  # the GPUs a job host held out here are put back too
            cleared.extend(gpuhealth.release_held_out(self.paths.state_dir, gpus))
        except OSError as e:
            log.warning("held-out GPUs not cleared: %s", e)
        clear = getattr(self._collector, "clear_health", None)
        if clear is not None:  # (no collector yet: nothing remembered)
            for g in (gpus if gpus is not None else [None]):
                cleared.extend(clear(g))
        return {"cleared": sorted(set(cleared))}

    def _m_prometheus_textfile(self, client: _Client, params: Dict[str, Any]) -> Any:
        """From now on write this host's GPU series to ``path`` for node_exporter, labelled
        ``host`` (the inventory's name for it); ``path`` None: stop, and take the file away.
        Answers once a first file is written: ``{"path": the path on this host, "error"}``."""
        path, host = params.get("path"), params.get("host")
        if not isinstance(host, str) or not host:
            raise protocol.ProtocolError(protocol.BAD_PARAMS, "'host' must be a non-empty string")
        if path is not None:
            try:
                path = textfile.resolve(path)
            except textfile.TextfileError as e:
                raise protocol.ProtocolError(protocol.BAD_PARAMS, str(e)) from None
        old, new = self._textfile, (None if path is None else {"path": path, "host": host})
        if old == new and new is not None and self._textfile_error is None:
            return {"path": path, "error": None}
        return self._set_textfile(old, new)

    async def _set_textfile(self, old: Optional[Dict[str, str]], new: Optional[Dict[str, str]]) -> Dict[str, Any]:
        loop = asyncio.get_event_loop()

        def switch() -> None:
            with self._textfile_lock:
                self._textfile, self._textfile_error = new, None
                if old is not None and (new is None or new["path"] != old["path"]):
                    textfile.remove(old["path"])
                textfile.save(self.paths.state_dir, new)
            if new is None:
                log.info("prometheus textfile: none (was %s)", old["path"] if old else None)
            else:
                log.info("prometheus textfile: %s, host %s", new["path"], new["host"])

        await loop.run_in_executor(None, switch)
        if new is None:
            return {"path": None, "error": None}
        self._wake.set()  # the ticker goes on writing it
        data = self._latest if self._latest is not None and self._subscribers() > 0 else await self._collect()
        error = await loop.run_in_executor(None, self._write_textfile, data, True)
        return {"path": new["path"], "error": error}

    def _write_textfile(self, data: Dict[str, Any], now: bool) -> Optional[str]:
        """Write the textfile from the sample ``data`` (at most once a second unless ``now``);
        the error that kept it from being written, or None. A new error is logged once."""
        with self._textfile_lock:
            setting = self._textfile
            if setting is None:
                return None
            at = time.monotonic()
            if not now and at - self._textfile_at < textfile.MIN_INTERVAL_S:
                return self._textfile_error
            self._textfile_at = at
            try:
                textfile.write(setting["path"], textfile.render(data, setting["host"]))
                error = None
            except OSError as e:
                error = "cannot write %s: %s" % (setting["path"], e.strerror or e)
            except Exception as e:  # a sample it cannot render must not stop the ticker
                log.exception("prometheus textfile")
                error = "cannot write %s: %s: %s" % (setting["path"], type(e).__name__, e)
            if error != self._textfile_error:
                if error:
                    log.warning("prometheus textfile: %s", error)
                else:
                    log.info("prometheus textfile: writing %s", setting["path"])
                self._textfile_error = error
            return error

    def _m_job_gc(self, client: _Client, params: Dict[str, Any]) -> Any:
        age, keep = params.get("max_age_s"), params.get("max_jobs")
        for name, v in (("max_age_s", age), ("max_jobs", keep)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
                raise protocol.ProtocolError(protocol.BAD_PARAMS, "%s must be a number >= 0" % name)
        return self._in_jobs_thread(lambda: self.jobs.gc(float(age) if age is not None else None,
                                                         int(keep) if keep is not None else None))

    def _m_job_metrics(self, client: _Client, params: Dict[str, Any]) -> Any:
        offsets = params.get("offsets") or {}
        if not isinstance(offsets, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in offsets.values()
        ):
            raise protocol.ProtocolError(protocol.BAD_PARAMS, "offsets must map rank to an integer >= 0")
        return self.jobs.metrics(self._str(params, "job_id"), {str(k): v for k, v in offsets.items()})

    def _probe_port(self, params: Dict[str, Any]) -> int:
        from agent.jobs import probe_port

        try:
            return probe_port(self._str(params, "addr"))
        except OSError as e:
            raise protocol.ProtocolError(protocol.BAD_PARAMS, "cannot bind %s: %s" % (params.get("addr"), e)) from e

    def _route_source(self, params: Dict[str, Any]) -> Optional[str]:
        """Where this host's route to ``peer`` goes out from (the controller's MASTER_ADDR when
        its own SSH session did not reach this host directly)."""
        from agent.clusterfiles import route_source

        return route_source(self._str(params, "peer"))

    def _m_upgrade(self, client: _Client, params: Dict[str, Any]) -> Any:
        path = params.get("path")
        if not isinstance(path, str) or not os.path.isfile(path) or not zipfile.is_zipfile(path):
            raise protocol.ProtocolError(protocol.BAD_PARAMS, "upgrade needs 'path' of an agent.pyz on this host")
        if self.busy():
            self._pending_upgrade = path
            self._poke_job_watcher()
            return {"scheduled": "when-idle"}
        self._successor = [sys.executable, path]
        asyncio.get_event_loop().call_later(0.1, self._stop_now)
        return {"scheduled": "now"}

    def _m_shutdown(self, client: _Client, params: Dict[str, Any]) -> Any:
        if self.busy() and not params.get("force"):
            raise protocol.ProtocolError(protocol.BAD_PARAMS, "the agent has running work; pass force")
        asyncio.get_event_loop().call_later(0.1, self._stop_now)
        return {"stopping": True}

    def _stop_now(self) -> None:
        if self._stop is not None:
            self._stop.set()

    def run(self) -> int:
        if not self.acquire_lock():
            log.info("another agent daemon already serves %s; exiting", self.paths.socket)
            return 0
        # Job hosts and rank wrappers start from the byte-compiled copy (after the lock: one
        # daemon makes it).
        self.jobs.use_unpacked()
        try:
            asyncio.run(self.serve())
        finally:
            self.release_lock()
        if self._successor:
            log.info("handing over to %s", self._successor[1])
            spawn_daemon(self.paths, self._successor)
        return 0


def setup_logging(paths: Paths) -> None:
    paths.ensure()
    handler = logging.handlers.RotatingFileHandler(paths.log, maxBytes=5 << 20, backupCount=2)
    handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
