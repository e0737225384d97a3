"""The controller: one object that the CLI and the app both drive. No Textual in here.

It owns one transport per host, talks to hosts in parallel (one slow host never holds up the
others beyond its own timeout), and turns what it learns into plain report objects.

A dead host costs nothing: a host's link is made by one connect attempt at a time, on a
thread of its own (``_Attempt``). A request waits for it only while it can still succeed soon:
a host whose TCP connect has not been answered within ``CONNECT_WAIT_S`` is reported out of
reach at once while the attempt goes on in the background; one whose attempt failed is reported
out of reach, without being tried again, until its backoff has passed (``_Reach``). What one
process learnt, the next knows (``memory``, the history's table of hosts out of reach): a host
found out of reach after the full wait is waited for only ``KNOWN_DOWN_WAIT_S`` by the commands
of the next ``KNOWN_DOWN_FOR_S``, so a second command does not pay the wait again.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tui.model.inventory import HostSpec, Inventory
from tui.remote.agentclient import AgentClient, TypedAgents
from tui.remote.bundle import AgentBundle, build_agent
from tui.remote.transport import (
    Backoff,
    HostKeyChangedError,
    Transport,
    TransportError,
    UnknownHostKeyError,
    UnreachableError,
    fingerprint,
    hostkey_name,
    last_json_object,
    make_transport,
    record_host_key,
    scan_host_key,
)

log = logging.getLogger(__name__)

FACTS_SOURCE = (Path(__file__).resolve().parent.parent.parent / "agent" / "facts.py").read_text()
COMMAND_TIMEOUT = 60.0
AGENT_MIN_PYTHON = "3.9"  # what agent/__main__.py checks first on a host
# How long a request waits for a host's TCP connect to be answered. The kernel answers a SYN
# whatever the host's load, within one round trip: under 0.35 s by fiber anywhere on Earth,
# about 0.6 s over a geostationary satellite. A SYN lost on the way is sent again only after the
# initial retransmission timeout (1 s, RFC 6298), so no wait short of 1 s plus a round trip
# would see that answer: 0.7 s misses nothing a full second would catch. A host silent that
# long is out of reach (its link down, or the machine off); the attempt goes on to its connect
# timeout meanwhile, and is used if it succeeds.
CONNECT_WAIT_S = 0.7
# A host found out of reach after that full wait, within this long, is waited for this long only
# (a host that is back answers its SYN in a round trip, well within it); after this long it is
# given the full wait again, so a far host once too slow for the short wait is never held down.
KNOWN_DOWN_WAIT_S = 0.3
KNOWN_DOWN_FOR_S = 30.0
# A host whose telemetry has gone quiet is asked with this timeout at most, not its usual one.
QUIET_TIMEOUT_S = 1.0
RETRY_FIRST_S = 1.0  # backoff after a failed connect attempt: doubling, with jitter, up to
RETRY_MAX_S = 10.0  # this (a host that comes back is used again within this long)

T = TypeVar("T")


@dataclass
class HostReport:
    """What one host said (or why it said nothing). ``to_json`` is the stable CLI contract."""

    name: str
    address: str
    port: int
    transport: str
    labels: list[str] = field(default_factory=list)
    reachable: bool = False
    error: str | None = None
    error_kind: str | None = None
    host_key: dict[str, str] | None = None
    hostname: str | None = None
    addresses: list[str] = field(default_factory=list)
    agent_version: str | None = None
    agent_current: bool = False
    copied: bool | None = None
    bytes_copied: int = 0
    python: str | None = None
    python_executable: str | None = None
    cpus: int | None = None
    memory_total_mb: int | None = None
    gpu_source: str | None = None
    gpus: list[dict[str, Any]] = field(default_factory=list)
    # {"runtimes": [...], "images": [...] or None}: the container runtimes on PATH, podman's images
    containers: dict[str, Any] | None = None
    agent_pid: int | None = None
    sample: dict[str, Any] | None = None
    elapsed_s: float = 0.0
    # What was verified on the host this time (CHECKS): an answer is only as good as its check.
    checked: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The documented keys (docs/contracts.md), each named here: a new or renamed field
        changes the output only when this mapping does."""
        return {
            "name": self.name,
            "address": self.address,
            "port": self.port,
            "transport": self.transport,
            "labels": list(self.labels),
            "reachable": self.reachable,
            "error": self.error,
            "error_kind": self.error_kind,
            "host_key": dict(self.host_key) if self.host_key is not None else None,
            "hostname": self.hostname,
            "addresses": list(self.addresses),
            "agent_version": self.agent_version,
            "agent_current": self.agent_current,
            "copied": self.copied,
            "bytes_copied": self.bytes_copied,
            "python": self.python,
            "python_executable": self.python_executable,
            "cpus": self.cpus,
            "memory_total_mb": self.memory_total_mb,
            "gpu_source": self.gpu_source,
            # health: the agent's judgement (hosts; null for deploy), drain: the controller's
            # claim: the job and user holding it on the host (hosts; null for deploy)
            "gpus": [{"health": None, "health_reason": None, "drain": None, "claim": None, **dict(g)}
                     for g in self.gpus],
            "containers": self.containers,
            "agent_pid": self.agent_pid,
            "sample": self.sample,
            "elapsed_s": round(self.elapsed_s, 3),
            "checked": list(self.checked),
        }


# What a host report can say was verified on the host (its ``checked``).
CHECK_SHA256 = "sha256"  # the agent archive on the host's disk, read back and hashed here
CHECK_PYTHON = "python"  # the host's Python ran the agent's code and told its facts


def host_key_info(e: TransportError) -> dict[str, str] | None:
    """What a host key error tells the user: key type and SHA256 fingerprint (and the expected
    fingerprint when the key changed); None for other errors."""
    if isinstance(e, UnknownHostKeyError):
        return {"type": e.key_type, "fingerprint": e.fingerprint, "name": e.hostkey_name}
    if isinstance(e, HostKeyChangedError):
        return {"fingerprint": e.fingerprint, "expected": e.expected_fingerprint,
                "name": e.hostkey_name}
    return None


def archive_vouched(hello: dict[str, Any] | None, bundle: AgentBundle) -> bool:
    """Whether a daemon's hello says ``bundle`` is installed and current on its host: the daemon
    runs this version, its ``agent.pyz`` there hashes to the bundle's SHA-256 (read by the daemon
    at this hello) and ``agent/current`` names it. Then nothing is read back over SFTP; a daemon
    that says less (an older one) gets the SFTP check and install as before."""
    archive = (hello or {}).get("archive")
    if not isinstance(archive, dict) or (hello or {}).get("agent_version") != bundle.version:
        return False
    return archive.get("sha256") == bundle.sha256 and archive.get("current") == bundle.version


def _report_for(spec: HostSpec) -> HostReport:
    return HostReport(
        name=spec.name,
        address=spec.address,
        port=spec.port,
        transport=spec.transport,
        labels=list(spec.labels),
    )


def _apply_facts(report: HostReport, facts: dict[str, Any]) -> None:
    report.hostname = facts.get("hostname")
    report.addresses = list(facts.get("addresses") or [])
    report.python = facts.get("python")
    report.python_executable = facts.get("python_executable")
    report.cpus = facts.get("cpus")
    report.memory_total_mb = facts.get("memory_total_mb")
    report.gpu_source = facts.get("gpu_source")
    report.gpus = list(facts.get("gpus") or [])
    report.containers = facts.get("containers") if isinstance(facts.get("containers"), dict) else None


def _parse_json_line(host: str, text: str, what: str) -> dict[str, Any]:
    value = last_json_object(text)
    if value is None:
        raise TransportError(host, f"{what} printed no JSON: {text.strip()[:200]!r}")
    return value


class _Attempt:
    """One connect attempt to a host: connect, check the agent, attach, hello. ``dialed`` is set
    as its TCP connect is sent (``dialed_at``), ``reached`` once that is answered (each also when
    the attempt ended)."""

    def __init__(self, closes: int) -> None:
        self.closes = closes  # the controller's close() count when it began
        self.started = time.monotonic()
        self.dialed = threading.Event()  # the TCP connect is sent (or the attempt got past it)
        self.dialed_at = self.started
        self.reached = threading.Event()
        self.done = threading.Event()
        self.link: Any = None
        self.error: BaseException | None = None


@dataclass
class _Reach:
    """What this controller knows of reaching one host: its last failed attempt and when the
    next may start."""

    attempt: _Attempt | None = None
    error: TransportError | None = None
    down_since: float | None = None  # wall clock, for the message
    retry_at: float = 0.0  # monotonic
    backoff: Backoff = field(default_factory=lambda: Backoff(initial=RETRY_FIRST_S, maximum=RETRY_MAX_S))


class HostLinks(TypedAgents):
    """Headless control of an inventory of hosts. ``agent(host)`` is a host's typed agent
    client and ``agents(hosts)`` several at once (``tui.remote.agentclient``); ``request`` and
    ``request_many`` are the untyped path beneath them."""

    def __init__(
        self,
        inventory: Inventory,
        *,
        accept_new: bool = False,
        bundle_factory: Callable[[], AgentBundle] = build_agent,
        accept_fingerprints: Sequence[str] = (),
    ):
        self.inventory = inventory
        self.accept_new = accept_new
        self.accept_fingerprints = tuple(accept_fingerprints)  # host keys the user accepted
        self._bundle_factory = bundle_factory
        self._bundle: AgentBundle | None = None
        self._transports: dict[str, Transport] = {}
        self._links: dict[str, Any] = {}
        self._pyz: dict[str, str | None] = {}
        self._host_locks: dict[str, threading.Lock] = {s.name: threading.Lock() for s in inventory.hosts}
        self._bundle_lock = threading.Lock()
        self._reach: dict[str, _Reach] = {s.name: _Reach() for s in inventory.hosts}
        self._reach_lock = threading.Lock()
        self._closes = 0  # close() calls: an attempt begun before the last one keeps nothing
        self.connect_wait = CONNECT_WAIT_S
        # Hosts found out of reach by earlier commands (``History``: unreached, set_unreached,
        # set_reached), or None: set by the service that owns the history.
        self.memory: Any = None
        # host -> why it is believed out of reach now (its telemetry went quiet), or None: set
        # by whoever reads telemetry (the service, while its monitor runs).
        self.quiet: Callable[[str], str | None] = lambda host: None

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def bundle(self) -> AgentBundle:
        with self._bundle_lock:  # hosts connect in parallel: build once
            if self._bundle is None:
                self._bundle = self._bundle_factory()
            return self._bundle

    def specs(self, names: Sequence[str] | None = None) -> tuple[HostSpec, ...]:
        return self.inventory.select(names) if names else self.inventory.hosts

    def transport(self, spec: HostSpec) -> Transport:
        t = self._transports.get(spec.name)
        if t is None:
            t = make_transport(self.inventory, spec, accept_new=self.accept_new,
                               accept_fingerprints=self.accept_fingerprints)
            self._transports[spec.name] = t
        return t

    def close(self) -> None:
        """Close every link and connection. A connect attempt still running is not waited for
        (a host out of reach would hold this up to its connect timeout): it closes what it
        makes once it ends."""
        with self._reach_lock:
            self._closes += 1
            connecting = {h for h, r in self._reach.items() if r.attempt is not None and not r.attempt.done.is_set()}
        # Copies: a connect attempt that ends meanwhile adds its link (and a transport) from its
        # own thread; it sees the close (``_closes``) and closes what it made itself.
        for link in list(self._links.values()):
            link.close()
        self._links.clear()
        for name, t in list(self._transports.items()):
            if name not in connecting:
                t.close()
        self._transports.clear()

    # -- agent requests (the CLI's and the job manager's path to the daemons) ----------------

    def _link(self, spec: HostSpec) -> Any:
        """The host's agent link: the one made already, or one made now by a connect attempt
        (started here unless one runs), waited for only while it can still succeed soon.
        Raises UnreachableError at once for a host known to be out of reach."""
        link = self._links.get(spec.name)
        if link is not None:
            return link
        att = self._attempt(spec)
        budget = self.connect_wait if not spec.proxy_jump else spec.connect_timeout * 4
        known = self._known_down(spec) if not spec.proxy_jump else None
        if known is not None:
            budget = min(budget, KNOWN_DOWN_WAIT_S)
        # The wait is for the host's answer: it starts as the connect is sent, after this
        # process's own work to get there (key files, the host's lock), which a busy machine
        # makes slow and which is bounded by the connect timeout.
        if not att.dialed.wait(max(0.0, att.started + spec.connect_timeout - time.monotonic())):
            raise UnreachableError(spec.name, f"not yet connecting to {spec.address}:{spec.port} after "
                                   f"{spec.connect_timeout:g}s (still trying)")
        if not att.reached.wait(max(0.0, att.dialed_at + budget - time.monotonic())):
            detail = (f"{spec.address}:{spec.port} did not answer within {budget:g}s "
                      f"(still trying, connect timeout {spec.connect_timeout:g}s)")
            self._remember(spec, detail, checked=known is None)
            if known is not None:
                detail = f"out of reach since {time.strftime('%H:%M:%S', time.localtime(known))}; {detail}"
            raise UnreachableError(spec.name, detail)
        att.done.wait()  # bounded by the attempt's own timeouts (connect, hello, requests)
        if att.error is not None:
            raise att.error
        return att.link

    def _known_down(self, spec: HostSpec) -> float | None:
        """When ``spec``'s host was first found out of reach, if an earlier command found it so
        after the full wait within ``KNOWN_DOWN_FOR_S``; else None."""
        if self.memory is None:
            return None
        try:
            found = self.memory.unreached(f"{spec.address}:{spec.port}")
        except Exception as e:  # a hint only: never a reason for a request to fail
            log.debug("reading what is known of %s failed: %s", spec.name, e)
            return None
        if found is None or time.time() - found[1] > KNOWN_DOWN_FOR_S:
            return None
        return found[0]

    def _remember(self, spec: HostSpec, detail: str, checked: bool) -> None:
        if self.memory is not None:
            try:
                self.memory.set_unreached(f"{spec.address}:{spec.port}", detail, checked)
            except Exception as e:
                log.debug("recording %s out of reach failed: %s", spec.name, e)

    def _forget(self, spec: HostSpec) -> None:
        """``spec``'s host answered: no longer held out of reach (a write only when it was)."""
        if self.memory is not None:
            try:
                endpoint = f"{spec.address}:{spec.port}"
                if self.memory.unreached(endpoint) is not None:
                    self.memory.set_reached(endpoint)
            except Exception as e:
                log.debug("recording %s reached failed: %s", spec.name, e)

    def reach(self, hosts: Sequence[str]) -> None:
        """Begin connecting to ``hosts`` now, in the background, returning at once: work that
        will need them (a launch reading its code snapshot) goes on meanwhile, and a request
        then finds the link made or being made. A host linked, being tried, or in its backoff
        is left as it is; an unknown name is ignored (the request that needs it says so)."""
        known = set(self.inventory.names)
        for host in hosts:
            if host in known and host not in self._links:
                try:
                    self._attempt(self.inventory.get(host))
                except TransportError:
                    pass  # in its backoff: the request that needs it says why

    def _attempt(self, spec: HostSpec) -> _Attempt:
        """The connect attempt running for ``spec``, else a new one, unless the last failed and
        its backoff has not passed: then its error, at once (it names when it was down since)."""
        with self._reach_lock:
            r = self._reach[spec.name]
            if r.attempt is not None and not r.attempt.done.is_set():
                return r.attempt
            if r.error is not None and time.monotonic() < r.retry_at:
                since = time.strftime("%H:%M:%S", time.localtime(r.down_since or time.time()))
                raise UnreachableError(spec.name, f"out of reach since {since} ({r.error.detail}); "
                                       f"tried again in {r.retry_at - time.monotonic():.0f}s")
            att = r.attempt = _Attempt(self._closes)
        threading.Thread(target=self._connect_link, args=(spec, att), name=f"connect-{spec.name}",
                         daemon=True).start()
        return att

    def _connect_link(self, spec: HostSpec, att: _Attempt) -> None:
        """One connect attempt (its own thread): the link is kept, or the failure recorded."""
        t: Transport | None = None
        try:
            t = self.transport(spec)

            def dialing() -> None:
                att.dialed_at = time.monotonic()
                att.dialed.set()

            def reached() -> None:  # the TCP connect answered: no longer out of reach
                att.dialed.set()
                att.reached.set()
                self._forget(spec)

            t.on_dialing = dialing
            t.on_reached = reached
            with self._host_locks[spec.name]:  # never beside a request on the old link
                t.connect()
                att.dialed.set()
                att.reached.set()
                link, pyz = self.agent_link(spec, t)
                if pyz is not None and (link.remote_hello or {}).get("agent_version") != self.bundle.version:
                    link = self._upgraded(spec, t, link, pyz)
                self.configure_agent(spec, AgentClient.over(link))
                self._links[spec.name] = link
                self._pyz[spec.name] = pyz
            att.link = link
            self._reached(spec.name)
            with self._reach_lock:
                closed = self._closes != att.closes
                if closed and self._links.get(spec.name) is link:
                    del self._links[spec.name]
            if closed:  # the controller closed meanwhile: nobody will use or close these (a
                link.close()  # later request, after the close, makes its own attempt)
                t.close()
        except BaseException as e:  # handed to whoever waits for the attempt
            att.error = e
            if isinstance(e, TransportError):
                self._unreached(spec.name, e)
                if e.kind in ("unreachable", "timeout") and not att.reached.is_set():
                    self._remember(spec, e.detail, checked=True)
            if self._closes != att.closes and t is not None:
                t.close()
        finally:
            att.dialed.set()
            att.reached.set()
            att.done.set()

    def _reached(self, host: str) -> None:
        with self._reach_lock:
            r = self._reach[host]
            r.error, r.down_since, r.retry_at = None, None, 0.0
            r.backoff.reset()

    def _unreached(self, host: str, e: TransportError) -> None:
        """Record a failure to reach ``host``: out of reach until its backoff passes. Only what
        time may mend (no answer, a broken connection) is held; a host key or login refused is
        tried again at the next request (the user may have fixed it meanwhile)."""
        if e.kind not in ("unreachable", "timeout", "error"):
            return
        with self._reach_lock:
            r = self._reach[host]
            if r.error is None:
                r.down_since = time.time()
            r.error = e
            r.retry_at = time.monotonic() + r.backoff.next_delay()

    def unreachable(self) -> dict[str, str]:
        """host -> why, for the hosts this controller now holds out of reach."""
        with self._reach_lock:
            return {h: r.error.detail for h, r in self._reach.items() if r.error is not None}

    def agent_link(self, spec: HostSpec, t: Transport) -> tuple[Any, str | None]:
        """A link to the host's daemon on the connected transport ``t``, its hello received:
        straight to the daemon's socket when one runs (no process started on the host), else
        the attach of the agent checked there, else the attach after a check and an install
        (which starts the daemon). Returns the link and the agent.pyz path (None for an
        ``attach_only`` host). Raises the reason the agent cannot start, when it cannot."""
        link, pyz = self._socket_link(spec, t)
        if link is None:
            link, pyz = self._checked_attach(spec, t)
        if link is None:
            stream, pyz = self.open_agent_stream(spec, t)
            try:
                link = self._greeted(spec, stream, "rigdeck")
            except TransportError as e:
                raise (e if pyz is None else self.start_failure(spec, t, pyz, e)) from None
        return link, pyz

    def _socket_link(self, spec: HostSpec, t: Transport) -> tuple[Any, str | None]:
        """No process on the host when its daemon runs (the common case): the agent archive is
        checked over SFTP (and put back when missing or not whole: ``_deploy_one``), then the
        link goes straight to the daemon's unix socket through the SSH connection (an older
        daemon is then asked to hand over, as after the attach). ``(None, None)`` when no
        daemon answers there, or the host's sshd does not forward to unix sockets: the attach
        (``_checked_attach``) starts one."""
        if getattr(spec, "attach_only", False):
            return None, None
        bundle = self.bundle
        state_dir = t.remote_path(spec.state_dir)
        socket_path = f"{state_dir}/run/agent.sock"
        stream = t.open_socket_stream(socket_path)
        if stream is None:  # no daemon (or no forwarding): the attach starts one, once installed
            self._deploy_one(_report_for(spec), t, bundle)
            return None, None
        try:
            link = self._greeted(spec, stream, "rigdeck")
        except TransportError as e:  # a socket left by a daemon that died: the attach mends it
            log.info("%s: the daemon's socket did not answer (%s): attaching", spec.name, e)
            self._deploy_one(_report_for(spec), t, bundle)
            return None, None
        pyz = f"{state_dir}/agent/{bundle.version}/agent.pyz"
        if archive_vouched(link.remote_hello, bundle):
            return link, pyz  # this very archive, hashed on the host's disk at this hello
        # An older daemon, or its archive missing, changed or not current: installed (and read
        # back) over SFTP, then the daemon is asked again (an older one then hands over).
        link.close()
        state_dir, pyz = self._deploy_one(_report_for(spec), t, bundle)
        stream = t.open_socket_stream(socket_path)
        if stream is None:
            return None, None
        try:
            return self._greeted(spec, stream, "rigdeck"), pyz
        except TransportError as e:
            log.info("%s: the daemon's socket did not answer (%s): attaching", spec.name, e)
            return None, None

    def _checked_attach(self, spec: HostSpec, t: Transport) -> tuple[Any, str | None]:
        """One command on the host when the agent is installed there: the attach of this
        controller's agent, which checks its own SHA-256 before anything starts. When it is not
        there (or not whole) the attach ends at once and ``(None, None)`` says to deploy first,
        as ``open_agent_stream`` does (a check and an install, then the attach)."""
        if getattr(spec, "attach_only", False):
            return None, None
        bundle = self.bundle
        state_dir = t.remote_path(spec.state_dir)
        pyz = f"{state_dir}/agent/{bundle.version}/agent.pyz"
        argv = [spec.python, pyz, "attach", "--state-dir", state_dir, "--expect-sha256", bundle.sha256]
        try:
            return self._greeted(spec, t.open_stream(argv, env=self.agent_env(spec)), "rigdeck"), pyz
        except TransportError as e:
            log.info("%s: agent %s not ready to attach (%s): deploying first", spec.name, bundle.version, e)
            return None, None

    def _upgraded(self, spec: HostSpec, t: Transport, link: Any, pyz: str) -> Any:
        """An older daemon answered: it hands over to the agent just deployed at once when idle
        (then a link to the new one), or once its jobs end (the old link meanwhile), as the
        monitor's connection asks it too. Without this, a user who only runs commands (never the
        app) would keep the old agent, and every job host it starts, for good."""
        from tui.remote.agentlink import AgentError

        try:
            when = AgentClient.over(link).upgrade(path=pyz, timeout=spec.connect_timeout)
        except (AgentError, TransportError) as e:
            log.info("%s: the running agent did not take the upgrade (%s): using it as it is", spec.name, e)
            return link
        if when != "now":
            log.info("%s: agent %s runs jobs: it hands over to %s when they end", spec.name,
                     (link.remote_hello or {}).get("agent_version"), self.bundle.version)
            return link
        link.close()
        deadline = time.monotonic() + max(10.0, 2 * spec.connect_timeout)
        while True:  # the old daemon stops within a moment; its successor takes the socket
            try:
                new = self._greeted(spec, self._attach_stream(spec, t, pyz), "rigdeck")
                if (new.remote_hello or {}).get("agent_version") == self.bundle.version:
                    return new
                if time.monotonic() > deadline:
                    return new  # still the old one: a request to it is still answered
                new.close()
            except (AgentError, TransportError):
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    def side_link(self, host: str) -> Any:
        """A second connection to ``host``'s agent, on the same SSH connection, for a long
        exchange (code sync) that must not hold up the host's other requests. The caller closes
        it. The agent is checked (and deployed) through the host's first connection."""
        spec = self.inventory.get(host)
        self._link(spec)
        with self._host_locks[host]:
            t = self.transport(spec)
            pyz = self._pyz.get(host)
        if getattr(spec, "attach_only", False) or pyz is None:
            stream = t.open_stream([spec.python, "agent.pyz", "attach"], env={})
        else:
            stream = self._attach_stream(spec, t, pyz)
        return self._greeted(spec, stream, "rigdeck-sync")

    def file_writer(self, host: str) -> Callable[[bytes, str], None] | None:
        """Writes bytes to a path on ``host`` over SFTP on the host's SSH connection (no process
        started there): code sync's packs. None for an ``attach_only`` host, whose key runs the
        agent's attach whatever is asked."""
        spec = self.inventory.get(host)
        if getattr(spec, "attach_only", False):
            return None
        t = self.transport(spec)
        t.connect()
        return t.put_data

    def _attach_stream(self, spec: HostSpec, t: Transport, pyz: str) -> Any:
        """One more attach to the host's daemon through the agent.pyz already checked there."""
        return t.open_stream([spec.python, pyz, "attach", "--state-dir", t.remote_path(spec.state_dir)],
                             env=self.agent_env(spec))

    @staticmethod
    def _greeted(spec: HostSpec, stream: Any, client: str) -> Any:
        """An AgentLink on ``stream`` once the agent has said hello (the stream closed if not)."""
        from tui.remote.agentlink import AgentLink, hello_timeout

        link = AgentLink(spec.name, stream)
        try:
            link.handshake(hello_timeout(spec.connect_timeout), client=client)
        except BaseException:
            link.close()
            raise
        return link

    def open_agent_stream(self, spec: HostSpec, t: Transport) -> tuple[Any, str | None]:
        """The agent's attach stream on a connected transport. Normally the agent is checked
        (and installed or upgraded) first. An ``attach_only`` host (a server's, reached with a
        key whose forced command is the agent's attach) gets no other command: sshd runs the
        attach whatever is asked, so nothing is checked or installed from here. Returns the
        stream and the agent.pyz path (None when not known here)."""
        if getattr(spec, "attach_only", False):
            return t.open_stream([spec.python, "agent.pyz", "attach"], env={}), None
        state_dir, pyz = self._deploy_one(_report_for(spec), t, self.bundle)
        stream = t.open_stream([spec.python, pyz, "attach", "--state-dir", state_dir], env=self.agent_env(spec))
        return stream, pyz

    def hello(self, host: str) -> dict[str, Any]:
        """What ``host``'s agent said in its hello on this controller's link (connecting first
        when needed): its version, and for a key line of ``rigdeck server join``, its tag."""
        return dict(self._link(self.inventory.get(host)).remote_hello or {})

    def request(self, host: str, method: str, timeout: float = 30.0, **params: Any) -> Any:
        """One request to a host's daemon, connecting (and deploying) first when needed. Call
        it through ``agent(host)``, whose methods name the RPCs and their parameters.

        Serialised per host; different hosts proceed in parallel. A broken connection is
        dropped and tried once more, so a host that came back is used again at once. A host out
        of reach answers at once (``_link``); one whose telemetry went quiet is given
        ``QUIET_TIMEOUT_S`` and no second try.
        """
        from tui.remote.agentlink import AgentError

        spec = self.inventory.get(host)
        quiet = self.quiet(host)
        if quiet is not None:
            timeout = min(timeout, QUIET_TIMEOUT_S)
        for attempt in (0, 1):
            link = self._link(spec)
            with self._host_locks[host]:
                try:
                    return link.request(method, timeout=timeout, **params)
                except AgentError:
                    raise
                except TransportError as e:
                    if self._links.get(host) is link:
                        del self._links[host]
                    link.close()
                    self.transport(spec).close()
                    if attempt == 1 or quiet is not None:
                        self._unreached(host, e)
                        raise
        raise AssertionError("unreachable")

    def peer_address(self, host: str) -> str | None:
        """The IP address this controller's own connection to ``host`` reached (connecting
        first when needed), or None: a local host, or one behind a ProxyJump."""
        spec = self.inventory.get(host)
        self._link(spec)
        with self._host_locks[host]:
            return self.transport(spec).peer_address()

    def request_many(
        self, hosts: Sequence[str], method: str, timeout: float = 30.0, **params: Any
    ) -> dict[str, Any]:
        """The same request to several hosts at once: host -> result, or the TransportError.
        Call it through ``agents(hosts)``."""

        def one(h: str) -> Any:
            try:
                return self.request(h, method, timeout=timeout, **params)
            except TransportError as e:
                return e

        if not hosts:
            return {}
        with ThreadPoolExecutor(max_workers=min(64, len(hosts)), thread_name_prefix="req") as pool:
            return dict(zip(hosts, pool.map(one, hosts), strict=True))

    def __enter__(self) -> HostLinks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _parallel(self, specs: Sequence[HostSpec], fn: Callable[[HostSpec], T]) -> list[T]:
        """Run ``fn`` for every host at once; results in inventory order."""
        if not specs:
            return []
        with ThreadPoolExecutor(max_workers=min(64, len(specs)), thread_name_prefix="host") as pool:
            return list(pool.map(fn, specs))

    def _guarded(self, spec: HostSpec, body: Callable[[HostReport, Transport], None]) -> HostReport:
        report = _report_for(spec)
        start = time.monotonic()
        try:
            t = self.transport(spec)
            t.connect()
            report.reachable = True
            body(report, t)
        except TransportError as e:
            report.error = str(e)
            report.error_kind = e.kind
            if isinstance(e, UnknownHostKeyError):
                report.host_key = {"type": e.key_type, "fingerprint": e.fingerprint}
            elif isinstance(e, HostKeyChangedError):
                report.host_key = {"fingerprint": e.fingerprint, "expected": e.expected_fingerprint}
            if e.kind in ("unreachable", "auth", "passphrase", "unknown-host-key", "host-key-changed"):
                report.reachable = False
        except Exception as e:  # a bug must not hide the other hosts' reports
            log.exception("%s: unexpected error", spec.name)
            report.error = f"{spec.name}: internal error: {type(e).__name__}: {e}"
            report.error_kind = "internal"
        finally:
            report.elapsed_s = time.monotonic() - start
        return report

    def _facts(self, spec: HostSpec, t: Transport) -> dict[str, Any]:
        argv = [spec.python, "-c", FACTS_SOURCE, spec.state_dir]
        res = t.run(argv, timeout=COMMAND_TIMEOUT, env=self.agent_env(spec))
        if res.exit_code != 0:
            raise TransportError(
                spec.name,
                f"python {spec.python!r} is not usable on the host (exit {res.exit_code}; "
                f"the agent needs Python {AGENT_MIN_PYTHON}+): {res.stderr.strip()[-300:]}",
            )
        return _parse_json_line(spec.name, res.stdout, "the facts probe")

    @staticmethod
    def configure_agent(spec: HostSpec, agent: AgentClient) -> None:
        """Tell a host's agent, on each new connection, what the inventory asks it to do on its own
        (it goes on after the controller leaves): the node_exporter textfile, or none. A refusal
        or a failed write is logged; the connection is used all the same."""
        from agent.protocol import UNKNOWN_METHOD
        from tui.remote.agentlink import AgentError

        try:
            got = agent.prometheus_textfile(path=spec.prometheus_textfile, host=spec.name,
                                            timeout=spec.connect_timeout)
        except AgentError as e:  # a path the host refuses, or an old agent waiting for its upgrade
            level = logging.INFO if e.code == UNKNOWN_METHOD and not spec.prometheus_textfile else logging.WARNING
            log.log(level, "%s: prometheus_textfile %r: %s", spec.name, spec.prometheus_textfile, e)
            return
        if got.error:
            log.warning("%s: prometheus_textfile: %s", spec.name, got.error)

    @staticmethod
    def agent_env(spec: HostSpec) -> dict[str, str]:
        env = dict(spec.env)
        if spec.sim_gpus:
            env["RIGDECK_SIM_GPUS"] = str(spec.sim_gpus)
        if spec.claim_dir_owner:  # agent/claims.py OWNER_ENV
            env["RIGDECK_CLAIM_DIR_OWNER"] = spec.claim_dir_owner
        return env

    # -- what the CLI and app call ---------------------------------------------------------

    def trust_host_key(self, host: str, expected_fingerprint: str) -> str:
        """Record the key ``host`` presents in known_hosts, if it is the one the user checked.

        The key is fetched again and compared with ``expected_fingerprint`` (what the user was
        shown), so a key swapped in between is refused. Returns the recorded known_hosts name.
        """
        spec = self.inventory.get(host)
        if spec.is_local:
            raise TransportError(host, "a local host has no host key")
        if spec.proxy_jump:
            raise TransportError(
                host, "behind a ProxyJump: check the key, then run `rigdeck hosts "
                f"{host} --accept-new`")
        try:
            key = scan_host_key(spec.address, spec.port, timeout=spec.connect_timeout)
        except Exception as e:  # OSError, EOFError, paramiko.SSHException: all mean "no key"
            raise TransportError(
                host, f"cannot fetch the host key of {spec.address}:{spec.port}: {e}") from None
        got = fingerprint(key)
        if got != expected_fingerprint:
            raise TransportError(
                host, f"the host now presents {key.get_name()} {got}, not the "
                f"{expected_fingerprint} you checked; nothing recorded")
        name = hostkey_name(spec.address, spec.port)
        record_host_key(self.inventory.known_hosts, name, key)
        log.warning("%s: trusted host key %s %s for %s", host, key.get_name(), got, name)
        return name

    def probe(self, names: Sequence[str] | None = None) -> list[HostReport]:
        """Reach every host and report its facts and deployed agent, deploying nothing."""
        version = self.bundle.version

        def body(report: HostReport, t: Transport) -> None:
            facts = self._facts(t.spec, t)
            _apply_facts(report, facts)
            report.checked.append(CHECK_PYTHON)
            report.agent_version = facts.get("deployed_version")
            report.agent_current = report.agent_version == version
            if report.agent_version:
                pyz = f"{facts['state_dir']}/agent/{report.agent_version}/agent.pyz"
                self._latest_sample(report, t, facts["state_dir"], pyz)

        return self._parallel(self.specs(names), lambda s: self._guarded(s, body))

    def _latest_sample(self, report: HostReport, t: Transport, state_dir: str, pyz: str) -> None:
        """Ask the host's daemon (started if needed) for its latest telemetry sample."""
        from tui.remote.agentlink import AgentLink, hello_timeout

        spec = t.spec
        link = AgentLink(
            spec.name,
            t.open_stream([spec.python, pyz, "attach", "--state-dir", state_dir], env=self.agent_env(spec)),
        )
        try:
            hello = link.handshake(hello_timeout(spec.connect_timeout), client="rigdeck-cli")
            report.agent_pid = hello.get("pid")
            self.configure_agent(spec, AgentClient.over(link))
            report.sample = AgentClient.over(link).sample(timeout=spec.connect_timeout)
        finally:
            link.close()
        # Each GPU's health as the agent judges it now (agent/gpuhealth.py), and who claims it
        # (any account's job on the host: agent/claims.py), beside its facts.
        judged = {g.get("index"): g for g in (report.sample or {}).get("gpus") or []}
        for g in report.gpus:
            seen = judged.get(g.get("index"))
            g["health"] = (seen.get("health") or "ok") if seen is not None else None
            g["health_reason"] = seen.get("health_reason") if seen is not None else None
            g["claim"] = seen.get("claim") if seen is not None else None

    def deploy(self, names: Sequence[str] | None = None) -> list[HostReport]:
        """Install the current agent where it is missing or not whole, and report each host.

        Over SFTP alone (no process started on the host, as scp): see ``_deploy_one``. The
        host's Python is checked where this controller holds a link to a daemon (it is asked
        for its facts), else at the agent's first start, which any command reaching the host
        makes; ``checked`` says which."""
        bundle = self.bundle

        def body(report: HostReport, t: Transport) -> None:
            self._deploy_one(report, t, bundle)
            link = self._links.get(t.spec.name)
            if link is not None:
                try:
                    facts = AgentClient.over(link).facts(timeout=t.spec.connect_timeout)
                except TransportError as e:  # the link broke: Python stays unchecked
                    log.info("%s: no facts from the running agent: %s", t.spec.name, e)
                    return
                _apply_facts(report, facts.raw)
                report.checked.append(CHECK_PYTHON)

        return self._parallel(self.specs(names), lambda s: self._guarded(s, body))

    def start_failure(self, spec: HostSpec, t: Transport, pyz: str, cause: TransportError) -> TransportError:
        """Why the agent at ``pyz`` (hash-checked on the host's disk) did not start: its
        ``version`` command run once more by the host's Python, whose failure says it (no such
        interpreter, or one too old: the archive's ``__main__`` checks before anything else).
        ``cause`` when that runs fine."""
        state_dir = t.remote_path(spec.state_dir)
        try:
            res = t.run([spec.python, pyz, "version", "--state-dir", state_dir], timeout=COMMAND_TIMEOUT,
                        env=self.agent_env(spec))
        except TransportError:
            return cause
        if res.exit_code == 0 and "{" in res.stdout:
            return cause
        why = (res.stderr.strip() or res.stdout.strip()).splitlines()[-3:]
        return TransportError(
            spec.name, f"the agent cannot start: python {spec.python!r} (the inventory's `python`) "
            f"exited {res.exit_code} on the host: {' | '.join(why) or 'no output'}")

    def _deploy_one(self, report: HostReport, t: Transport, bundle: AgentBundle) -> tuple[str, str]:
        """Make sure ``bundle`` is installed and current; returns (state_dir, agent.pyz path)
        there. Over the connection's SFTP session, no process started on the host: the
        installed file is read back and hashed here (a match: nothing copied); when it is
        missing or differs, the archive goes to a temporary name, is read back and hashed, and
        is renamed into place. Then ``agent/current`` names its version, the same way."""
        spec = t.spec
        state_dir = t.remote_path(spec.state_dir)
        final = f"{state_dir}/agent/{bundle.version}/agent.pyz"
        report.copied = t.install_checked(bundle.path.read_bytes(), final, bundle.sha256, mode=0o700)
        report.bytes_copied = bundle.size if report.copied else 0
        current = f"{bundle.version}\n".encode()
        t.install_checked(current, f"{state_dir}/agent/current", hashlib.sha256(current).hexdigest())
        report.checked.append(CHECK_SHA256)
        report.agent_version = bundle.version
        report.agent_current = True
        return state_dir, final
