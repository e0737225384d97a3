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
``Packetizer``) and on its loop staying what was copied. ``hub_mode`` decides once, at the first
connection, whether the hub may serve: every internal it uses is there, and the source of each
paramiko function it re-enacts or stands in for (``MIRRORED``) has the fingerprint recorded in
``VERIFIED`` for the paramiko releases the copy was checked against. Otherwise, or with
``RIGDECK_HUB=threads``, every connection keeps paramiko's own thread, as a ProxyJump one does,
and a paramiko the copy was never checked against (a security release) still works, at a
thread per host. The choice and its reason are logged once.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import io
import itertools
import logging
import os
import selectors
import socket
import textwrap
import threading
import time
import tokenize
from collections import deque
from typing import Any, NamedTuple

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
from paramiko.packet import Packetizer

try:  # internals: a paramiko without them gets its own threads (hub_mode), not an import error
    from paramiko.packet import NeedRekeyException
    from paramiko.ssh_exception import MessageOrderError
except ImportError as e:
    _UNIMPORTABLE = [str(e)]
else:
    _UNIMPORTABLE = []

log = logging.getLogger(__name__)

HUB_THREADS = 4  # fixed, whatever the number of hosts
STALL_S = 10.0  # how long one message may take to arrive once it has begun
TICK_S = 1.0  # keepalives, rekeys and handshake deadlines are looked at this often
MODE_ENV = "RIGDECK_HUB"  # "threads": paramiko's own thread for every connection, whatever the check says

# The paramiko functions the hub re-enacts or takes the place of. A new paramiko can change what
# one of them does without a name going missing; then the hub's copy is no longer paramiko's.
MIRRORED: tuple[tuple[type, str], ...] = (
    (paramiko.Transport, "run"),  # the loop that start, _read_one, _dispatch and hub_end copy
    (paramiko.Transport, "start_client"),  # calls start() once, active already set, then waits
    (paramiko.Transport, "stop_thread"),  # close() returns once is_alive() says False
    (paramiko.Transport, "_send_user_message"),  # replaced on a hub during a key exchange
    (Packetizer, "read_all"),  # what it does when the socket is idle, hub_tick does
    (Packetizer, "_check_keepalive"),  # called by hub_tick, holding the write lock
)


class Checked(NamedTuple):
    """paramiko releases whose source of every ``MIRRORED`` function was read against the hub's
    copy, and those functions' fingerprints there (``fingerprint``)."""

    versions: tuple[str, ...]
    fingerprints: dict[str, str]


# Each entry is a set of sources the hub was checked against (issue 50): these eight releases'
# MIRRORED functions differ only in a comment of run's (3.4 to 3.5: "Re-use", later "Reuse");
# tests/test_hub.py, test_ssh.py and test_monitor.py passed with the hub serving on 3.4.0 and
# 5.1.0. A paramiko whose functions differ gets its own threads until its source is read and
# added here (3.3.1's run, without the strict key exchange, is one).
VERIFIED: tuple[Checked, ...] = (
    Checked(("3.4.0", "3.4.1", "3.5.0", "3.5.1", "4.0.0", "5.0.0", "5.0.1", "5.1.0"), {
        "Transport.run": "3dd2231bb37bf98c",
        "Transport.start_client": "a6fba83b8788f6de",
        "Transport.stop_thread": "1e71ad6c3353c9da",
        "Transport._send_user_message": "d28ab99bc770b753",
        "Packetizer.read_all": "6f8b4559a13935c8",
        "Packetizer._check_keepalive": "296db951dcf04ce4",
    }),
)

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


def missing_internals() -> list[str]:
    """The paramiko internals the hub uses that the installed paramiko lacks, by name."""
    missing = list(_UNIMPORTABLE)
    missing += [f"Transport.{n}" for n in _TRANSPORT_METHODS if not hasattr(paramiko.Transport, n)]
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
    return missing


# Tokens whose text is layout (their names are kept instead: an indent's width is not code) and
# those that are not code at all.
_LAYOUT = {tokenize.INDENT, tokenize.DEDENT, tokenize.NEWLINE}
_NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.ENDMARKER}
# Python 3.12 splits an f-string into tokens (3.14 a t-string too), older ones keep it one
# string: it is taken whole from the source, so that every Python gives the same fingerprint.
_STRING_STARTS = {getattr(tokenize, n) for n in ("FSTRING_START", "TSTRING_START") if hasattr(tokenize, n)}
_STRING_ENDS = {getattr(tokenize, n) for n in ("FSTRING_END", "TSTRING_END") if hasattr(tokenize, n)}


def fingerprint(source: str) -> str:
    """A function's code, as a short hash of its tokens: comments, its docstring, line breaks
    inside brackets and indent widths left out, so that a reworded comment or a reflowed line
    keeps it and a change to what the code does (a statement moved out of a block) does not."""
    source = textwrap.dedent(source)
    body = ast.parse(source).body[0]
    doc = None
    if isinstance(body, (ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(body) is not None:
        doc = (body.body[0].lineno, body.body[0].end_lineno or body.body[0].lineno)
    lines = source.splitlines(keepends=True)
    words: list[str] = []
    depth, start = 0, (0, 0)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in _STRING_STARTS:
            depth, start = depth + 1, (start if depth else tok.start)
        elif tok.type in _STRING_ENDS:
            depth -= 1
            if not depth:
                words.append(_span(lines, start, tok.end))
        elif depth or tok.type in _NOT_CODE:
            continue
        elif doc and doc[0] <= tok.start[0] <= doc[1] and tok.type in (tokenize.STRING, tokenize.NEWLINE):
            continue
        else:
            words.append(tokenize.tok_name[tok.type] if tok.type in _LAYOUT else tok.string)
    return hashlib.sha256("\0".join(words).encode()).hexdigest()[:16]


def _span(lines: list[str], start: tuple[int, int], end: tuple[int, int]) -> str:
    """The source text from ``start`` to ``end`` (tokenize's (line, column), lines from 1)."""
    if start[0] == end[0]:
        return lines[start[0] - 1][start[1]:end[1]]
    return "".join([lines[start[0] - 1][start[1]:], *lines[start[0]:end[0] - 1], lines[end[0] - 1][:end[1]]])


def installed_fingerprints() -> dict[str, str | None]:
    """``fingerprint`` of each ``MIRRORED`` function of the installed paramiko (None: no source to read)."""
    out: dict[str, str | None] = {}
    for cls, name in MIRRORED:
        try:
            out[f"{cls.__name__}.{name}"] = fingerprint(inspect.getsource(getattr(cls, name)))
        except (AttributeError, OSError, TypeError, SyntaxError):
            out[f"{cls.__name__}.{name}"] = None
    return out


class HubMode(NamedTuple):
    served: bool  # True: the hub's threads serve connections; False: paramiko's own thread each
    why: str
    warn: bool = False  # a warning: the hub is off unasked, or RIGDECK_HUB holds a value it ignores


def choose_mode() -> HubMode:
    """Whether the hub may serve connections with the installed paramiko, and why (no log)."""
    asked = os.environ.get(MODE_ENV, "").strip().lower()
    if asked == "threads":
        return HubMode(False, f"{MODE_ENV}=threads")
    ignored = f"{MODE_ENV}={asked!r} is not 'threads' or 'hub', so ignored; " if asked not in ("", "hub") else ""
    version = f"paramiko {paramiko.__version__}"
    missing = missing_internals()
    if missing:
        return HubMode(False, f"{ignored}{version} lacks internals the hub uses: {', '.join(missing)}", True)
    found = installed_fingerprints()
    checked = ", ".join(v for c in VERIFIED for v in c.versions)
    for c in VERIFIED:
        if c.fingerprints == found:
            return HubMode(True, f"{ignored}{version}: its loop and the functions the hub stands in "
                           f"for match the copy checked against paramiko {', '.join(c.versions)}", bool(ignored))
    changed = [name for name, fp in found.items()
               if fp is None or all(c.fingerprints.get(name) != fp for c in VERIFIED)]
    what = ", ".join(f"{n}{'' if found[n] else ' (no source)'}" for n in changed) or "these functions together"
    return HubMode(False, f"{ignored}{version}: {what} differ from the source the hub's copy was "
                   f"checked against (paramiko {checked})", True)


_mode: HubMode | None = None
_mode_lock = threading.Lock()


def hub_mode() -> HubMode:
    """``choose_mode``, decided once (at the first connection) and logged then."""
    global _mode
    with _mode_lock:
        if _mode is None:
            _mode = choose_mode()
            level = logging.WARNING if _mode.warn else logging.INFO
            if _mode.served:
                log.log(level, "SSH connections served by %d hub threads: %s", HUB_THREADS, _mode.why)
            else:
                log.log(level, "SSH connections each on paramiko's own thread (the hub is off): %s", _mode.why)
        return _mode


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
        # A socket, on a paramiko the hub was checked against: served by the hub (see hub_mode).
        self.served = isinstance(sock, socket.socket) and hub_mode().served
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
