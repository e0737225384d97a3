"""``agent.pyz attach``: bridge stdin/stdout to the user's daemon, starting it first if needed.

This process is what an SSH session runs. When the session drops, stdin closes and this process
exits; the daemon, in its own session, carries on. With ``--role`` (a key's forced command: the
server's, ``agent/roles.py``) it first tells the daemon the role, in the connection's first line,
before any byte of the client's; a daemon that does not enforce roles (an older agent) is not
bridged to at all. Stdlib only, Python 3.9+.
"""
from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time
from typing import Optional

from agent import protocol
from agent.paths import Paths, spawn_daemon

CONNECT_WAIT_S = 15.0
JOIN_TAG_RE = re.compile(r"[0-9a-f]{32}")


def connect(paths: Paths, start: bool = True, wait: float = CONNECT_WAIT_S) -> socket.socket:
    """Connect to the daemon's socket; start a daemon (once) when none answers. A state
    directory not to trust is refused first (``Paths.check``): its socket may not be ours."""
    try:
        paths.check()
    except FileNotFoundError:
        pass  # none yet: the daemon started below makes it
    deadline = time.monotonic() + wait
    spawned = False
    delay = 0.02
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(paths.socket)
            return s
        except (FileNotFoundError, ConnectionRefusedError):
            s.close()
            if not start:
                raise
        if not spawned:
            # Racing attaches may each spawn one; the daemon's lock lets exactly one serve.
            spawn_daemon(paths)
            spawned = True
        if time.monotonic() > deadline:
            raise TimeoutError("no agent daemon answered on %s within %.0fs" % (paths.socket, wait))
        time.sleep(delay)
        delay = min(0.2, delay * 2)


def _pump_stdin(sock: socket.socket) -> None:
    fd = sys.stdin.fileno()
    try:
        while True:
            data = os.read(fd, 65536)
            if not data:
                break
            sock.sendall(data)
    except OSError:
        pass
    # The SSH session is gone (or the controller closed its end): leave, the daemon stays.
    os._exit(0)


def bridge(sock: socket.socket) -> int:
    threading.Thread(target=_pump_stdin, args=(sock,), daemon=True).start()
    out = sys.stdout.fileno()
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return 0
            view = memoryview(data)
            while view:
                n = os.write(out, view)
                view = view[n:]
    except (BrokenPipeError, ConnectionResetError):
        return 0


def _daemon_hello(sock: socket.socket) -> bytes:
    """The daemon's hello line (it sends it first), and whatever came after it, unparsed."""
    buf = b""
    sock.settimeout(CONNECT_WAIT_S)
    while b"\n" not in buf:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("the agent daemon closed the connection before its hello")
        buf += data
        if len(buf) > protocol.MAX_MESSAGE_BYTES:
            raise ConnectionError("the agent daemon's hello is too long")
    sock.settimeout(None)
    return buf


def take_role(sock: socket.socket, role: str, join_tag: Optional[str] = None) -> bytes:
    """Tell the daemon ``role`` before the client says anything; refuse a daemon that would not
    enforce it. Returns the daemon's bytes read meanwhile (its hello first), for the client.
    ``join_tag`` (the key line's, ``rigdeck server join``: the tag the server issued to the
    person who installed it) goes into that hello: the server accepts a join only through the
    line carrying the tag it issued to that same person."""
    got = _daemon_hello(sock)
    first, rest = got.split(b"\n", 1)
    try:
        hello = protocol.decode(first)
    except protocol.ProtocolError as e:
        raise ConnectionError("the agent daemon's hello: %s" % e.message) from None
    if role not in (hello.get("roles") or []):
        raise ConnectionError(
            "the agent daemon here (version %s) does not enforce the role %r: refused. Stop it and "
            "attach again with the agent this key names (rigdeck deploy)" % (hello.get("agent_version"), role))
    sock.sendall(protocol.encode({"type": "role", "role": role}))
    if join_tag is None:
        return got
    hello["join_tag"] = join_tag
    return protocol.encode(hello) + rest


def main(state_dir: str, start: Optional[bool] = True, role: Optional[str] = None,
         join_tag: Optional[str] = None) -> int:
    paths = Paths(state_dir)
    try:
        sock = connect(paths, start=bool(start))
        pending = take_role(sock, role, join_tag) if role else b""
    except (OSError, TimeoutError) as e:
        sys.stderr.write("rigdeck agent: %s\n" % e)
        return 1
    view = memoryview(pending)
    while view:
        view = view[os.write(sys.stdout.fileno(), view):]
    return bridge(sock)
