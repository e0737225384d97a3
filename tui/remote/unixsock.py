"""A face on the server's own host: the server's unix socket, no SSH in between.

``RemoteClient`` normally reaches ``rigdeck serve`` through an SSH exec channel to ``rigdeck
attach``; on the head host itself (or in a test) it can open the socket directly. Same stream
interface as the transports' (``send``, ``recv``, ``close``).
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from pathlib import Path

from tui.remote.transport import Stream, UnreachableError


class SocketStream(Stream):
    def __init__(self, name: str, sock: socket.socket):
        self.name = name
        self.sock = sock

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as e:
            raise UnreachableError(self.name, f"send to the server failed: {e}") from None

    def recv(self, timeout: float) -> bytes | None:
        try:
            self.sock.settimeout(timeout)
            return self.sock.recv(65536)
        except TimeoutError:
            return None
        except OSError as e:
            raise UnreachableError(self.name, f"server socket broke: {e}") from None

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def fileno(self) -> int:
        return self.sock.fileno()


class UnixSocketTransport:
    """What ``RemoteClient`` needs of a transport, for a local socket path."""

    def __init__(self, path: Path, name: str = "local"):
        self.path = Path(path)
        self.name = name
        self._streams: list[SocketStream] = []

    def connect(self) -> None:
        if not self.path.exists():
            raise UnreachableError(self.name, f"no server socket at {self.path} (rigdeck server start)")

    def remote_path(self, path: str) -> str:
        return path

    def open_stream(self, argv: Sequence[str], env: object = None) -> SocketStream:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(str(self.path))
        except OSError as e:
            s.close()
            raise UnreachableError(self.name, f"cannot connect to {self.path}: {e}") from None
        stream = SocketStream(self.name, s)
        self._streams.append(stream)
        return stream

    def close(self) -> None:
        for s in self._streams:
            s.close()
        self._streams.clear()
