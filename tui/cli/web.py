"""``rigdeck web [--port P] [--host ADDR]``: the app in a browser, served by textual-serve.

No new UI: every browser tab that opens the page gets its own run of ``rigdeck app``, with the
inventory and options given here, whose screen textual-serve carries over a websocket to a
terminal drawn in the page. Meant for this machine's own browser: it binds 127.0.0.1 by default
and refuses any address that is not loopback unless ``--allow-remote`` says so, because
textual-serve has no login: whoever reaches the port drives the cluster as the user running
this. From another machine, an ssh tunnel reaches it (``ssh -L P:127.0.0.1:P THIS-HOST``, then
http://127.0.0.1:P there, the same port on both ends). Ctrl+C (or SIGTERM) ends every session's
app and then the server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import socket
import sys
from collections.abc import Callable
from typing import Any

from tui.model.fields import is_loopback

__all__ = ["add_parser", "app_command", "is_loopback", "public_url", "run"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEFAULT_PORT = 8000
DEFAULT_HOST = "127.0.0.1"
# How long an app has to quit after its session is told to end, before it is killed.
QUIT_GRACE_S = 5.0


def add_parser(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser(
        "web",
        help="serve the app to a browser on this machine (localhost only; from elsewhere: ssh -L)",
        description="Serve the app to a browser on this machine with textual-serve: each tab runs "
        "its own `rigdeck app` with these options. Binds 127.0.0.1: there is no login, so "
        "anyone who reaches the port drives the cluster as you. From another machine, tunnel: "
        f"ssh -L {DEFAULT_PORT}:127.0.0.1:{DEFAULT_PORT} THIS-HOST, then open "
        f"http://127.0.0.1:{DEFAULT_PORT} there (the same port on both ends).",
    )
    common(p)
    p.add_argument("--port", "-p", type=int, default=DEFAULT_PORT, metavar="P",
                   help=f"TCP port (default {DEFAULT_PORT})")
    p.add_argument("--host", default=DEFAULT_HOST, metavar="ADDR",
                   help=f"address to bind (default {DEFAULT_HOST}; loopback only unless --allow-remote)")
    p.add_argument("--allow-remote", action="store_true",
                   help="bind a non-loopback --host anyway: anyone who reaches it controls the "
                   "cluster as you (no login); an ssh -L tunnel is the safe way in")


def app_command(args: argparse.Namespace) -> str:
    """The shell line textual-serve runs per session (it starts commands through ``sh -c``):
    this Python running ``rigdeck app`` with the user's options, every word quoted, ``exec`` so
    the app is the session's process itself and ends with it."""
    argv = [sys.executable, "-m", "tui.cli", "app"]
    inventory = getattr(args, "inventory", None)
    if inventory is not None:
        argv += ["--inventory", os.path.abspath(os.path.expanduser(inventory))]
    if getattr(args, "accept_new", False):
        argv.append("--accept-new")
    return "exec " + shlex.join(argv)


def public_url(host: str, port: int) -> str:
    """The address the page's websocket goes back to: the bound one, or this machine's name when
    bound to every interface (0.0.0.0 or ::), which no browser can open."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def run(args: argparse.Namespace, load_inventory: Callable[[argparse.Namespace], Any]) -> int:
    if not 0 < args.port < 65536:
        print(f"rigdeck web: --port {args.port}: expected a TCP port, 1 to 65535", file=sys.stderr)
        return EXIT_USAGE
    if not is_loopback(args.host) and not args.allow_remote:
        print(
            f"rigdeck web: --host {args.host} is not a loopback address. The browser app has no "
            "login: anyone who can reach that port would drive the cluster as you. To use it from "
            f"another machine, keep the default and tunnel: ssh -L {args.port}:127.0.0.1:{args.port} "
            f"THIS-HOST, then open http://127.0.0.1:{args.port} there. (--allow-remote binds "
            f"{args.host} anyway.)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    load_inventory(args)  # a bad inventory is reported now, not in every browser tab
    try:
        from textual_serve.server import Server
    except ImportError:
        print("rigdeck web: needs the textual-serve package (pip install textual-serve)",
              file=sys.stderr)
        return EXIT_FAILED

    url = public_url(args.host, args.port)
    local = is_loopback(args.host)

    class WebServer(Server):  # type: ignore[misc]
        """textual-serve's server, saying where it is in rigdeck's words, and ending every
        session's app on the way out instead of leaving them to the handlers' timeout."""

        sessions: set[asyncio.Task[Any]] = set()

        async def on_startup(self, app: Any) -> None:
            how = (f"localhost only; from another machine: ssh -L {args.port}:127.0.0.1:{args.port} "
                   "THIS-HOST" if local else "WARNING: no login, reachable from the network")
            print(f"rigdeck web: serving the app on {url} ({how}); Ctrl+C stops", flush=True)

        async def handle_websocket(self, request: Any) -> Any:
            task = asyncio.current_task()
            assert task is not None
            self.sessions.add(task)
            try:
                return await super().handle_websocket(request)
            finally:
                self.sessions.discard(task)

        async def on_shutdown(self, app: Any) -> None:
            # Cancelling a session's handler makes textual-serve tell its app to quit and wait
            # for it; a stuck app is killed below, once the server has stopped.
            tasks = list(self.sessions)
            for t in tasks:
                t.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=QUIT_GRACE_S)

    server = WebServer(app_command(args), host=args.host, port=args.port, title="rigdeck",
                       public_url=url)
    try:
        server.serve()
    except OSError as e:
        print(f"rigdeck web: cannot listen on {args.host}:{args.port}: {e.strerror or e}",
              file=sys.stderr)
        return EXIT_FAILED
    finally:
        _end_children()
    print("rigdeck web: stopped", flush=True)
    return EXIT_OK


def _end_children() -> None:
    """Ends any session app still running: each is a child of this process (``exec`` in its
    command line). Only those: an agent daemon that an app started lives in its own session and
    is meant to outlive it. SIGTERM, then SIGKILL after a grace."""
    import psutil

    children = psutil.Process().children(recursive=False)
    for c in children:
        try:
            c.terminate()
        except psutil.Error:
            pass
    _gone, alive = psutil.wait_procs(children, timeout=QUIT_GRACE_S)
    for c in alive:
        try:
            c.kill()
        except psutil.Error:
            pass
