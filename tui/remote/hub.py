"""SSH connections served by a fixed pool of threads instead of one paramiko thread per host.

paramiko gives every ``Transport`` a thread of its own that reads the connection's messages and
hands them to its handlers (key exchange, authentication, channels). With a few hundred hosts
that is a few hundred threads, mostly asleep in ``recv``. ``HubTransport`` starts no thread:
the banner exchange and the first key-exchange message go out from the thread that connects
(which waits for the handshake anyway), then one of ``HUB_THREADS`` hub threads takes the
connection. A hub waits on all its connections' sockets with a selector and, when one is
readable, reads one SSH message from it and dispatches it through paramiko's own handler tables,
as paramiko's thread would; callers keep waiting on paramiko's events and channels as before.
Once a second a hub does what paramiko's thread did on each idle second: keepalives, a rekey the
sending side asked for, the handshake's deadline.

What a slow host can cost: a message is read whole once its first bytes are there, so a host
that stops in the middle of a packet holds its hub until ``STALL_S`` passes, then loses its
connection (the controller reconnects it as after any drop); hosts are spread over the hubs, so
the other hubs go on meanwhile. A connection through ProxyJump hops rides a channel of the hop,
not a socket: it keeps paramiko's own thread (``served`` False).

This leans on paramiko internals (private methods and fields of ``Transport`` and
``Packetizer``): ``_check_paramiko`` verifies them when this module is imported, with an error
saying what is missing, and ``pyproject.toml`` pins the paramiko versions it was verified with.
"""

from __future__ import annotations

import itertools
import logging
import selectors
import socket
import threading
import time
from collections import deque
from typing import Any

import paramiko
import paramiko.transport as _ptransport
from paramiko.common import (
    DEBUG,
    ERROR,
    MSG_DEBUG,
    MSG_DISCONNECT,
    MSG_IGNORE,
    MSG_KEXINIT,
    MSG_NAMES,
    MSG_UNIMPLEMENTED,
    WARNING,
    cMSG_UNIMPLEMENTED,
)
from paramiko.packet import NeedRekeyException
from paramiko.ssh_exception import MessageOrderError

log = logging.getLogger(__name__)

HUB_THREADS = 4  # fixed, whatever the number of hosts
STALL_S = 10.0  # how long one message may take to arrive once it has begun
TICK_S = 1.0  # keepalives, rekeys and handshake deadlines are looked at this often
VERIFIED = ((5, 1),)  # paramiko (major, minor) versions this was checked against

_TRANSPORT_METHODS = ("_send_user_message", "_check_banner", "_send_kex_init", "_expect_packet", "_enforce_strict_kex",
                      "_parse_disconnect", "_parse_debug", "_ensure_authed", "_send_message", "_log",
                      "start_client", "stop_thread")
_TRANSPORT_FIELDS = ("packetizer", "sock", "active", "lock", "in_kex", "kex_engine", "local_version",
                     "handshake_timeout", "_expected_packet", "_handler_table", "_channel_handler_table",
                     "_channels", "channels_seen", "auth_handler", "agreed_on_strict_kex",
                     "completion_event", "channel_events", "server_accept_cv", "saved_exception",
                     "clear_to_send", "clear_to_send_timeout")
_PACKETIZER_FIELDS = ("_Packetizer__remainder", "_Packetizer__write_lock", "read_message",
                      "write_all", "need_rekey", "start_handshake", "complete_handshake",
                      "handshake_timed_out", "_check_keepalive", "close")


def _check_paramiko() -> None:
    """Raise, naming what is missing, unless paramiko has every internal the hub uses."""
    version = tuple(int(x) for x in paramiko.__version__.split(".")[:2])
    missing = [f"Transport.{n}" for n in _TRANSPORT_METHODS if not hasattr(paramiko.Transport, n)]
    missing += [] if hasattr(_ptransport, "_active_threads") else ["paramiko.transport._active_threads"]
    missing += [] if hasattr(paramiko.Channel, "_unlink") else ["Channel._unlink"]
    a, b = socket.socketpair()
    try:
        probe = paramiko.Transport(a)
        missing += [f"Transport().{n}" for n in _TRANSPORT_FIELDS if not hasattr(probe, n)]
        missing += [f"Packetizer().{n}" for n in _PACKETIZER_FIELDS if not hasattr(probe.packetizer, n)]
    finally:
        a.close()
        b.close()
    verified = ", ".join(f"{major}.{minor}" for major, minor in VERIFIED)
    if missing:
        raise ImportError(
            f"paramiko {paramiko.__version__} lacks what tui/remote/hub.py drives its connections "
            f"with: {', '.join(missing)}; install a paramiko it was verified with "
            f"({verified}, as pyproject.toml pins)")
    if version not in VERIFIED:
        log.warning("paramiko %s is not among the versions tui/remote/hub.py was verified with (%s)",
                    paramiko.__version__, verified)


_check_paramiko()


class _Stalled(ConnectionError):
    """A host stopped in the middle of a message for longer than ``STALL_S``."""


_step = threading.local()  # .deadline: when the message a hub is reading must have arrived


class _HubSocket:
    """The connection's socket as paramiko's packetizer sees it: the same socket, except that on
    a hub thread a read or write still waiting past the step's deadline fails (paramiko would
    wait on, and so would every other host of that hub)."""

    def __init__(self, sock: socket.socket):
        self._sock = sock

    def _overdue(self) -> None:
        deadline = getattr(_step, "deadline", None)
        if deadline is not None and time.monotonic() > deadline:
            raise _Stalled(f"nothing more of a message for {STALL_S:g}s")

    def recv(self, n: int) -> bytes:
        try:
            return self._sock.recv(n)
        except TimeoutError:
            self._overdue()
            raise

    def send(self, data: bytes) -> int:
        try:
            return self._sock.send(data)
        except TimeoutError:
            self._overdue()
            raise

    def __getattr__(self, name: str) -> Any:  # settimeout, close, fileno, getpeername, _closed
        return getattr(self._sock, name)


def _free(lock: Any) -> bool:
    """Whether no thread holds ``lock`` (an RLock has no ``locked()`` before Python 3.14). A
    look only, released at once: holding it while taking paramiko's other locks would take
    them in the opposite order to its writers."""
    if not lock.acquire(blocking=False):
        return False
    lock.release()
    return True


class HubTransport(paramiko.Transport):
    """A paramiko transport that one of the hub's threads serves (see the module's doc)."""

    def __init__(self, sock: Any, *args: Any, **kwargs: Any):
        self.served = isinstance(sock, socket.socket)
        self._hub: _Hub | None = None
        self._hub_fd = -1
        self._deferred: deque[Any] = deque()  # answers held while a key exchange runs
        super().__init__(_HubSocket(sock) if self.served else sock, *args, **kwargs)
        if self.served:
            # A handler that answers during a key exchange waits for it to end; on a hub, for
            # no longer than a stalled message may hold it (paramiko's default is 30 s).
            self.clear_to_send_timeout = STALL_S

    # -- what paramiko's thread did before its loop, from the connecting thread ----------

    def start(self) -> None:
        """Called by ``start_client``: the banners and our key-exchange offer, then the hub."""
        if not self.served:
            super().start()
            return
        _ptransport._active_threads.append(self)
        try:
            self.packetizer.write_all((self.local_version + "\r\n").encode())
            self._check_banner()
            self.packetizer.start_handshake(self.handshake_timeout)
            self._send_kex_init()
            self._expect_packet(MSG_KEXINIT)
            self._hub_fd = self.sock.fileno()
        except Exception as e:  # what paramiko's thread catches too: the caller gets it
            self.hub_end(e)
            return
        self._hub = _pick_hub()
        self._hub.add(self)

    def is_alive(self) -> bool:
        return super().is_alive() if not self.served else False

    def close(self) -> None:
        hub = self._hub
        if hub is not None:
            hub.forget(self)  # before the socket closes: its descriptor may be reused at once
        super().close()

    # -- one turn of paramiko's message loop, on a hub thread ---------------------------------

    def hub_buffered(self) -> bool:
        """Whether bytes already read from the socket wait in the packetizer (after the banner)."""
        return bool(self.packetizer._Packetizer__remainder)  # type: ignore[attr-defined]

    def hub_step(self) -> bool:
        """Read one message and act on it as paramiko's thread would; False: the peer ended the
        connection (or spoke of a channel it never had), and it is to be closed. A rekey that
        the message's bytes asked for starts at once, as paramiko's loop starts it before its
        next read: the next message may be long in coming."""
        going = self._read_one()
        if going and self.packetizer.need_rekey() and not self.in_kex:
            self._send_kex_init()
        self.hub_flush()
        return going

    def _send_user_message(self, data: Any) -> None:
        """paramiko's handlers answer some messages (a channel's close, a global request) with
        this, which waits while a key exchange is under way; on a hub that wait would hold the
        very thread that must read the exchange's next message (paramiko's own thread has the
        same knot, undone only by its 30 s timeout). There the answer waits in a queue instead,
        sent once the new keys are in use."""
        if getattr(_step, "deadline", None) is not None and not self.clear_to_send.is_set():
            self._deferred.append(data)
            return
        if getattr(_step, "holds_writer", None) is self:
            # The hub's keepalive, sent while the hub holds the write lock with no key exchange
            # under way (only a hub thread starts one): no writer can be mid-message, and
            # taking the clear-to-send lock here would take the locks in the writers' opposite
            # order.
            self._send_message(data)
            return
        super()._send_user_message(data)

    def hub_flush(self) -> None:
        """Send what the hub's handlers answered during a key exchange, once it is over."""
        while self._deferred and self.clear_to_send.is_set() and self.active:
            super()._send_user_message(self._deferred.popleft())

    def _read_one(self) -> bool:
        packetizer = self.packetizer
        if packetizer.need_rekey() and not self.in_kex:
            self._send_kex_init()
        try:
            ptype, m = packetizer.read_message()
        except NeedRekeyException:
            return True
        if ptype == MSG_DISCONNECT:
            self._parse_disconnect(m)
            return False
        if ptype in (MSG_IGNORE, MSG_DEBUG):
            self._enforce_strict_kex(ptype)
            if ptype == MSG_DEBUG:
                self._parse_debug(m)
            return True
        expected: tuple[int, ...] = self._expected_packet  # type: ignore[has-type]
        if expected:
            if ptype not in expected:
                error = MessageOrderError if self.agreed_on_strict_kex else paramiko.SSHException
                raise error(f"Expecting packet from {expected!r}, got {ptype:d}")
            self._expected_packet = ()
            if 30 <= ptype <= 41:  # the key exchange's own messages, which its engine reads
                self.kex_engine.parse_next(ptype, m)
                return True
        outcome = self._dispatch(ptype, m)
        if outcome == "more-auth":
            return True
        packetizer.complete_handshake()
        return outcome != "end"

    def _dispatch(self, ptype: int, m: paramiko.Message) -> str:
        if ptype in self._handler_table:
            refusal = self._ensure_authed(ptype, m)
            if refusal:
                self._send_message(refusal)
            else:
                self._handler_table[ptype](m)
        elif ptype in self._channel_handler_table:
            chanid = m.get_int()
            chan = self._channels.get(chanid)
            if chan is not None:
                self._channel_handler_table[ptype](chan, m)
            elif chanid in self.channels_seen:
                self._log(DEBUG, f"Ignoring message for dead channel {chanid:d}")
            else:
                self._log(ERROR, f"Channel request for unknown channel {chanid:d}")
                return "end"
        elif self.auth_handler is not None and ptype in self.auth_handler._handler_table:
            self.auth_handler._handler_table[ptype](m)
            if self._expected_packet:
                return "more-auth"
        else:
            self._log(WARNING, f"Oops, unhandled type {ptype} ({MSG_NAMES.get(ptype)!r})")
            if ptype != MSG_UNIMPLEMENTED:
                reply = paramiko.Message()
                reply.add_byte(cMSG_UNIMPLEMENTED)
                reply.add_int(m.seqno)
                self._send_message(reply)
        return "ok"

    def hub_tick(self) -> None:
        """What paramiko's thread did when a second passed with nothing to read. Skipped while
        another thread is writing (it holds the packetizer's write lock), so that a host that
        stopped reading holds that writer only, never the hub: the keepalive is sent holding
        that lock, taken only if free, so no writer can take it between a look and the send."""
        packetizer = self.packetizer
        if packetizer.handshake_timed_out():
            raise EOFError("the SSH handshake did not finish in time")
        lock = packetizer._Packetizer__write_lock  # type: ignore[attr-defined]
        if not self.clear_to_send.is_set() or not _free(lock):
            return  # a key exchange, or a writer, is under way: a keepalive would wait for it
        if packetizer.need_rekey() and not self.in_kex:
            self._send_kex_init()
        self.hub_flush()
        if not self.clear_to_send.is_set() or not lock.acquire(blocking=False):
            return  # the key exchange just started, or a writer came in: the next tick
        _step.holds_writer = self
        try:
            packetizer._check_keepalive()
        finally:
            _step.holds_writer = None
            lock.release()

    def hub_end(self, error: BaseException | None) -> None:
        """What paramiko's thread does when its loop ends: record why, wake every waiter (the
        handshake, authentication, channel opens), close the channels and the socket."""
        active: bool = self.active  # type: ignore[has-type]
        if isinstance(error, (EOFError, _Stalled)) or error is None or not active:
            self._log(DEBUG, f"connection ended: {error or 'closed by the peer'}")
        else:
            self._log(ERROR, f"Exception (client): {error}")
        if error is not None:
            self.saved_exception = error  # type: ignore[assignment]
        if self in _ptransport._active_threads:
            _ptransport._active_threads.remove(self)
        for chan in list(self._channels.values()):
            chan._unlink()
        if active:
            self.active = False
            self.packetizer.close()
            if self.completion_event is not None:
                self.completion_event.set()
            if self.auth_handler is not None:
                self.auth_handler.abort()
            for event in self.channel_events.values():
                event.set()
            with self.lock:
                self.server_accept_cv.notify()
        self.sock.close()


class _Hub:
    """One hub thread: a selector over its connections' sockets, and a queue of connections to
    take or drop (filled by other threads, applied by the hub between reads)."""

    def __init__(self, index: int):
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._todo: deque[tuple[bool, HubTransport]] = deque()
        self._links: dict[int, HubTransport] = {}
        self.thread = threading.Thread(target=self._run, name=f"ssh-hub-{index}", daemon=True)
        self.thread.start()

    def add(self, t: HubTransport) -> None:
        self._todo.append((True, t))
        self._wake()

    def forget(self, t: HubTransport) -> None:
        self._todo.append((False, t))
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except BlockingIOError:
            pass  # a wake-up already waits

    def _run(self) -> None:
        next_tick = time.monotonic() + TICK_S
        while True:
            try:
                next_tick = self._turn(next_tick)
            except Exception:  # a bug here must not silence every host of this hub for good
                log.exception("SSH hub %s: a turn failed; going on", threading.current_thread().name)
                time.sleep(0.1)  # a failure that repeats does not spin

    def _turn(self, next_tick: float) -> float:
        ready = self._selector.select(max(0.0, next_tick - time.monotonic()))
        for key, _mask in ready:
            if key.data is None:
                self._drain_wake()
            elif (link := self._links.get(key.fd)) is key.data and link is not None:
                self._serve(link)
        self._apply()
        if time.monotonic() < next_tick:
            return next_tick
        for t in list(self._links.values()):
            self._guarded(t, t.hub_tick)
        return time.monotonic() + TICK_S

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _apply(self) -> None:
        while self._todo:
            add, t = self._todo.popleft()
            if add and t.active:
                self._take(t)
            else:
                self._drop(t)

    def _take(self, t: HubTransport) -> None:
        stale = self._links.pop(t._hub_fd, None)
        if stale is not None:  # closed elsewhere, its descriptor already reused
            self._drop(stale)
        try:
            self._selector.register(t._hub_fd, selectors.EVENT_READ, t)
        except (OSError, ValueError, KeyError) as e:  # its socket closed meanwhile
            t.hub_end(e)
            return
        self._links[t._hub_fd] = t
        if t.hub_buffered():  # bytes read with the banner: no readiness will say so
            self._serve(t)

    def _serve(self, t: HubTransport) -> None:
        def turn() -> None:
            if not t.hub_step():
                self._drop(t)
                t.hub_end(None)
                return
            while t.active and t.hub_buffered():
                if not t.hub_step():
                    self._drop(t)
                    t.hub_end(None)
                    return
        self._guarded(t, turn)

    def _guarded(self, t: HubTransport, work: Any) -> None:
        """Run ``work`` for ``t`` under the step deadline; any failure ends that connection only."""
        if not t.active:
            self._drop(t)
            return
        _step.deadline = time.monotonic() + STALL_S
        try:
            work()
        except Exception as e:
            self._drop(t)
            t.hub_end(e)
        finally:
            _step.deadline = None

    def _drop(self, t: HubTransport) -> None:
        if self._links.get(t._hub_fd) is t:
            del self._links[t._hub_fd]
        key = self._selector.get_map().get(t._hub_fd)
        if key is not None and key.data is t:
            self._selector.unregister(t._hub_fd)


_hubs: list[_Hub] = []
_hubs_lock = threading.Lock()
_turn = itertools.count()


def _pick_hub() -> _Hub:
    """The next hub in turn, started on first need (at most ``HUB_THREADS``)."""
    with _hubs_lock:
        if len(_hubs) < HUB_THREADS:
            _hubs.append(_Hub(len(_hubs)))
            return _hubs[-1]
        return _hubs[next(_turn) % HUB_THREADS]


def hub_threads() -> list[threading.Thread]:
    """The hub threads started so far (for a bench's or a test's count)."""
    with _hubs_lock:
        return [h.thread for h in _hubs]
