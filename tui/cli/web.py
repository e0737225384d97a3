"""``rigdeck web [--port P] [--host ADDR]``: the app in a browser, served by textual-serve.

No new UI: every browser tab that opens the page gets its own run of ``rigdeck app``, with the
inventory and options given here, whose screen textual-serve carries over a websocket to a
terminal drawn in the page. Whoever has the page drives the cluster as the user running this, so
only the URL printed at the start opens it: it holds a token made for this run, and a request
without it, from another site's page, or naming another host (DNS rebinding) gets a 403
(``tui.cli.webserver``). Meant for this machine's own browser: it binds 127.0.0.1 by default
and refuses any address that is not loopback unless ``--allow-remote`` says so, because it
speaks plain HTTP, the token and the screen readable on the way. From another machine, an ssh
tunnel reaches it (``ssh -L P:127.0.0.1:P THIS-HOST``, then the printed URL there, the same
port on both ends). Ctrl+C (or SIGTERM) ends every session's app and then the server.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import socket
import sys
from collections.abc import Callable
from typing import Any

from tui.client import http_listener
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
        "its own `rigdeck app` with these options. Open the URL it prints: it holds a token made "
        "for this run, and whoever has it drives the cluster as you. Binds 127.0.0.1 (plain "
        "HTTP). From another machine, tunnel: "
        f"ssh -L {DEFAULT_PORT}:127.0.0.1:{DEFAULT_PORT} THIS-HOST, then open the printed URL "
        "there (the same port on both ends).",
    )
    common(p)
    p.add_argument("--port", "-p", type=int, default=DEFAULT_PORT, metavar="P",
                   help=f"TCP port (default {DEFAULT_PORT})")
    p.add_argument("--host", default=DEFAULT_HOST, metavar="ADDR",
                   help=f"address to bind (default {DEFAULT_HOST}; loopback only unless --allow-remote)")
    p.add_argument("--allow-remote", action="store_true",
                   help="bind a non-loopback --host anyway: plain HTTP, so anyone who can watch the "
                   "traffic sees the token and can control the cluster as you; an ssh -L tunnel "
                   "is the safe way in")


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
    """The address the printed URL names: the bound one, or this machine's name when bound to
    every interface (0.0.0.0 or ::), which no browser can open (a name the Host check takes)."""
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
            f"rigdeck web: --host {args.host} is not a loopback address. The browser app speaks "
            "plain HTTP: whoever can watch the network would see its token and could drive the "
            "cluster as you. To use it from another machine, keep the default and tunnel: ssh -L "
            f"{args.port}:127.0.0.1:{args.port} THIS-HOST, then open the URL it prints there. "
            f"(--allow-remote binds {args.host} anyway.)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    load_inventory(args)  # a bad inventory is reported now, not in every browser tab
    try:
        from tui.cli.webserver import WebServer
    except ImportError:
        print("rigdeck web: needs the textual-serve package (pip install textual-serve)",
              file=sys.stderr)
        return EXIT_FAILED

    token = secrets.token_urlsafe(32)  # per run: the URL printed below is the way in
    url = f"{public_url(args.host, args.port)}/?token={token}"
    how = (f"localhost only; from another machine: ssh -L {args.port}:127.0.0.1:{args.port} THIS-HOST"
           if is_loopback(args.host) else "WARNING: reachable from the network, over plain HTTP")
    server = WebServer(app_command(args), host=args.host, port=args.port, token=token,
                       listener=http_listener(args.host, args.port),
                       banner=f"rigdeck web: serving the app on {url} ({how}); Ctrl+C stops")
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
