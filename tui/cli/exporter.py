"""``rigdeck exporter [--listen ADDR:PORT]``: the cluster as Prometheus metrics on ``/metrics``.

It runs the controller the inventory calls for, as every command does (embedded, unless the
inventory names a ``[server]``: then the server's controller answers each scrape), starts its
telemetry and its job poller (embedded, this process then supervises jobs and advances the queue,
as the app does), and serves ``GET /metrics`` until Ctrl+C or SIGTERM. The metrics are listed
in docs/observability.md.

It binds 127.0.0.1:9464 unless ``--listen`` names another address; there is no login, and the
metrics name hosts, jobs and users, so an address outside loopback is bound only when written
out, and said so when it starts.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Callable
from typing import Any

from tui.cli.signals import stop_signals
from tui.client import DEFAULT_LISTEN, MetricsServer
from tui.model.fields import Bad, listen_address, show

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEFAULT = f"{DEFAULT_LISTEN[0]}:{DEFAULT_LISTEN[1]}"


def add_parser(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser(
        "exporter",
        help=f"serve the cluster's metrics to Prometheus on /metrics (default {DEFAULT})",
        description="Run the controller and serve what it knows (GPUs with their job, rank and "
        "user; jobs; hosts; the queue) in Prometheus' text format on http://ADDR:PORT/metrics, "
        "until Ctrl+C. The metrics are listed in docs/observability.md.",
    )
    common(p)
    p.add_argument("--listen", default=DEFAULT, metavar="ADDR:PORT",
                   help=f"where to serve (default {DEFAULT}; [::1]:9464 for IPv6; port 0: any free "
                   "one). No login: an address outside loopback is reachable by anyone who can reach "
                   "this machine")


def run(args: argparse.Namespace, make_client: Callable[[argparse.Namespace], Any]) -> int:
    try:
        host, port = listen_address(args.listen)
    except Bad as e:
        print(f"rigdeck exporter: --listen {show(args.listen)}: expected {e.expected}", file=sys.stderr)
        return EXIT_USAGE
    client = make_client(args)  # the inventory is read (and a bad one reported) before anything binds
    try:
        try:
            server = MetricsServer(client.exposition, host, port)
        except OSError as e:
            print(f"rigdeck exporter: cannot listen on {args.listen}: {e.strerror or e}", file=sys.stderr)
            return EXIT_FAILED
        with server:
            client.start()
            server.start()
            who = "the embedded controller" if client.kind == "embedded" else "the server's controller"
            print(f"rigdeck exporter: serving {server.url} ({server.reach}) from {who}; Ctrl+C stops", flush=True)
            _wait_for_stop()
    finally:
        client.close()
    print("rigdeck exporter: stopped", flush=True)
    return EXIT_OK


def _wait_for_stop() -> None:
    """Until Ctrl+C (SIGINT) or SIGTERM, whatever this process inherited (see tui.cli.signals)."""
    stop = threading.Event()
    with stop_signals(stop.set):
        while not stop.wait(1.0):
            pass
