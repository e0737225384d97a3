"""``rigdeck attach``: bridge stdin/stdout to the server's unix socket, byte for byte.

This is what a client's SSH session runs on the server host (the operator's app or CLI, speaking
the controller API as JSON lines); it holds no state of its own. Like the agent's attach
(``agent/attach.py``) it only connects and copies, but it never starts a server: a server is
started on purpose (``rigdeck server start``), so when none listens this says so on stderr, in
one line, and exits 1.

Both directions are copied until either side closes. When stdin ends (the client closed its
channel) the socket's write side is shut down, so the server sees the end of the client's
requests, and what the server still sends is delivered until it closes too, for at most
``DRAIN_S`` seconds. When the server closes, or stdout is gone, this exits at once. Stdlib only.

Before the first byte of the client's, it sends the server one line of its own,
``{"identity": {"user": NAME}}``: the person a key's forced command names (``rigdeck attach
--user NAME``, installed by ``rigdeck server add-user``), or ``null`` for the server account's
own login. The server takes a session's person from this first line only, so what the client
sends after it cannot claim to be anyone.
"""

from __future__ import annotations

import json
import os
import select
import socket
import sys
import threading
import time

from tui.model.serverlayout import DEFAULT_SERVER_STATE_DIR, ServerLayout

__all__ = ["DRAIN_S", "bridge", "connect", "identity_line", "main"]

DRAIN_S = 5.0
CHUNK = 65536


def connect(state_dir: str) -> socket.socket:
    """A connection to the server listening under ``state_dir``; OSError when none does."""
    path = ServerLayout(os.path.expanduser(state_dir)).socket
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def bridge(sock: socket.socket, stdin_fd: int, stdout_fd: int, drain_s: float = DRAIN_S) -> int:
    """Copy ``stdin_fd`` -> ``sock`` and ``sock`` -> ``stdout_fd`` until either side closes."""
    stdin_closed_at: list[float] = []

    def pump_stdin() -> None:
        try:
            while True:
                data = os.read(stdin_fd, CHUNK)
                if not data:
                    break
                sock.sendall(data)
        except OSError:
            pass  # the server went away: the main loop sees it
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        stdin_closed_at.append(time.monotonic())

    threading.Thread(target=pump_stdin, name="attach-stdin", daemon=True).start()
    try:
        while True:
            if stdin_closed_at and time.monotonic() - stdin_closed_at[0] > drain_s:
                return 0
            ready, _, _ = select.select([sock], [], [], 0.2)
            if not ready:
                continue
            data = sock.recv(CHUNK)
            if not data:
                return 0
            _write_all(stdout_fd, data)
    except (BrokenPipeError, ConnectionResetError):
        return 0
    finally:
        sock.close()


def identity_line(user: str | None) -> bytes:
    """The first line the server reads on a session: whom it is for."""
    return (json.dumps({"identity": {"user": user}}) + "\n").encode()


def main(state_dir: str = DEFAULT_SERVER_STATE_DIR, user: str | None = None) -> int:
    path = ServerLayout(os.path.expanduser(state_dir)).socket
    try:
        sock = connect(state_dir)
    except OSError as e:
        why = e.strerror or str(e)
        sys.stderr.write(
            f"rigdeck attach: no rigdeck server listens on {path} ({why}); "
            "start it with `rigdeck server start`\n"
        )
        sys.stderr.flush()
        return 1
    try:
        sock.sendall(identity_line(user))
    except OSError:
        sock.close()
        sys.stderr.write("rigdeck attach: the server closed the connection\n")
        return 1
    sys.stdout.flush()
    return bridge(sock, sys.stdin.fileno(), sys.stdout.fileno())
