"""The controller's end of one agent connection: JSON lines over a transport stream.

Single-threaded by design: whoever holds the link both issues requests and receives events;
anything that arrives while it waits for a response goes to ``on_event``. ``drain`` delivers
what has arrived without waiting, for a reader that waits on many links at once (the monitor).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from agent import protocol
from tui.remote.transport import Stream, TransportError

HELLO_MIN_S = 20.0


def hello_timeout(connect_timeout: float) -> float:
    """How long the agent's hello may take. It comes after a Python interpreter has started on
    the host (the first time, the daemon too): with many hosts connecting at once on a busy
    controller or host that takes longer than a TCP connect (bench/scale.py: 27 of 32 test bed
    hosts missed a 5 s hello on 2 cores). A dead host fails at the connect, not here."""
    return max(connect_timeout, HELLO_MIN_S)


class AgentError(TransportError):
    """The agent answered a request with an error."""

    kind = "agent"

    def __init__(self, host: str, code: str, message: str):
        super().__init__(host, f"agent error {code}: {message}")
        self.code = code


class AgentLink:
    def __init__(self, host: str, stream: Stream, on_event: Callable[[dict[str, Any]], None] | None = None):
        self.host = host
        self.stream = stream
        self.on_event = on_event or (lambda msg: None)
        self.splitter = protocol.LineSplitter()
        self._pending: list[dict[str, Any]] = []
        self._next_id = 0
        self.remote_hello: dict[str, Any] | None = None
        self.bad_messages = 0

    def close(self) -> None:
        self.stream.close()

    def send(self, msg: dict[str, Any]) -> None:
        self.stream.send(protocol.encode(msg))

    def _feed(self, data: bytes) -> None:
        for line, err in self.splitter.feed(data):
            if err is not None or line is None:
                self.bad_messages += 1
                continue
            try:
                self._pending.append(protocol.decode(line))
            except protocol.ProtocolError:
                self.bad_messages += 1  # a garbled line costs that line only

    def drain(self, max_reads: int = 16) -> int:
        """Deliver what has arrived, without waiting (the stream said it is readable); returns
        how many messages. Reads until nothing more waits (a reader told once per arrival must
        leave nothing behind), at most ``max_reads`` times, so one busy stream cannot hold its
        reader. Raises TransportError when the agent closed the stream."""
        for _ in range(max_reads):
            data = self.stream.recv(0.0)
            if data == b"":
                raise TransportError(self.host, "the agent closed the connection")
            if not data:
                break
            self._feed(data)
        n = 0
        while self._pending:
            self._dispatch(self._pending.pop(0))
            n += 1
        return n

    def recv(self, timeout: float) -> dict[str, Any] | None:
        """The next decoded message, or None when none came within ``timeout``."""
        deadline = time.monotonic() + timeout
        while not self._pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            data = self.stream.recv(remaining)
            if data is None:
                return None
            if data == b"":
                raise TransportError(self.host, "the agent closed the connection")
            self._feed(data)
        return self._pending.pop(0)

    def handshake(self, timeout: float, **fields: Any) -> dict[str, Any]:
        """Exchange hellos; returns the agent's (its version, hostname, pid)."""
        self.send(protocol.hello(role="controller", **fields))
        deadline = time.monotonic() + timeout
        while True:
            msg = self.recv(max(0.0, deadline - time.monotonic()))
            if msg is None:
                raise TransportError(self.host, f"the agent did not say hello within {timeout:g}s")
            if msg["type"] == "hello":
                if msg.get("protocol") != protocol.PROTOCOL_VERSION:
                    raise TransportError(
                        self.host,
                        f"agent speaks protocol {msg.get('protocol')}, we speak {protocol.PROTOCOL_VERSION}",
                    )
                self.remote_hello = msg
                return msg
            self._dispatch(msg)

    def request(self, method: str, timeout: float = 30.0, **params: Any) -> Any:
        self._next_id += 1
        rid = self._next_id
        self.send(protocol.request(rid, method, **params))
        deadline = time.monotonic() + timeout
        while True:
            msg = self.recv(max(0.0, deadline - time.monotonic()))
            if msg is None:
                raise TransportError(self.host, f"agent did not answer {method} within {timeout:g}s")
            if msg["type"] == "response" and msg.get("id") == rid:
                if msg["ok"]:
                    return msg.get("result")
                err = msg.get("error") or {}
                raise AgentError(self.host, str(err.get("code")), str(err.get("message")))
            self._dispatch(msg)

    def pipeline(self, calls: Iterator[tuple[str, dict[str, Any]]], window: int = 4,
                 timeout: float = 60.0, on_result: Callable[[Any], None] | None = None) -> int:
        """Send ``calls`` with up to ``window`` of them unanswered at once (the daemon answers a
        connection's requests in order), so the link is never idle waiting for a round trip.
        ``on_result`` gets each result in order; the first error raises (after which the link
        should be closed: answers to later requests may still come). Returns how many ran."""
        pending: dict[int, str] = {}
        done = 0

        def collect() -> None:
            nonlocal done
            deadline = time.monotonic() + timeout
            while True:
                msg = self.recv(max(0.0, deadline - time.monotonic()))
                if msg is None:
                    raise TransportError(self.host, f"agent did not answer within {timeout:g}s")
                if msg["type"] == "response" and msg.get("id") in pending:
                    method = pending.pop(msg["id"])
                    if not msg["ok"]:
                        err = msg.get("error") or {}
                        raise AgentError(self.host, str(err.get("code")), f"{method}: {err.get('message')}")
                    done += 1
                    if on_result is not None:
                        on_result(msg.get("result"))
                    return
                self._dispatch(msg)

        for method, params in calls:
            while len(pending) >= window:
                collect()
            self._next_id += 1
            pending[self._next_id] = method
            self.send(protocol.request(self._next_id, method, **params))
        while pending:
            collect()
        return done

    def _dispatch(self, msg: dict[str, Any]) -> None:
        if msg["type"] == "event":
            self.on_event(msg)

    def pump(self, timeout: float) -> int:
        """Deliver events for up to ``timeout`` seconds; returns how many arrived."""
        n = 0
        deadline = time.monotonic() + timeout
        while True:
            msg = self.recv(max(0.0, deadline - time.monotonic()))
            if msg is None:
                return n
            self._dispatch(msg)
            n += 1
            if time.monotonic() >= deadline:
                return n
