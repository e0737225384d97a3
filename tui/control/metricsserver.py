"""The controller's ``/metrics``: Prometheus' text exposition (``tui.model.promexport``) over HTTP.

A stdlib ``ThreadingHTTPServer`` on its own thread. ``GET /metrics`` (and ``HEAD``) answers the
exposition made at that moment by the function it is given (the controller's, through the API:
``Client.exposition``), gzipped when the scraper accepts it, as Prometheus does; every other
path is a 404. It binds exactly the address it is given: the callers keep a default of
127.0.0.1, and a non-loopback address only when the user wrote one. A request whose ``Host``
header does not name it (``tui.model.httpguard``) is a 403: a page in the browser of someone on
this machine could otherwise read the metrics through DNS rebinding.
"""

from __future__ import annotations

import gzip
import http.server
import logging
import socket
import socketserver
import threading
from collections.abc import Callable
from typing import Any

from tui.model.fields import is_loopback
from tui.model.httpguard import Listener
from tui.model.promexport import CONTENT_TYPE

log = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
DEFAULT_LISTEN = ("127.0.0.1", 9464)  # Prometheus' port for exporters of this kind (OpenTelemetry's too)


def http_listener(host: str, port: int) -> Listener:
    """The Host rules of a listener bound to ``host``:``port``. Bound beyond loopback, it also
    answers to this machine's host name and FQDN (what a Prometheus target or a browser there
    would use); those are looked up only then, as the FQDN can be a DNS query."""
    if is_loopback(host):
        return Listener(host, port)
    return Listener(host, port, (socket.gethostname(), socket.getfqdn()))


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    exposition: Callable[[], str]
    listener: Listener

    def __init__(self, address: tuple[str, int], exposition: Callable[[], str]):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.exposition = exposition
        super().__init__(address, _Handler)
        self.listener = http_listener(address[0], self.server_port)

    def server_bind(self) -> None:
        # HTTPServer's own looks up the address's FQDN (a DNS query): not needed to serve.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    server_version = "rigdeck"
    protocol_version = "HTTP/1.1"  # keep-alive: Prometheus reuses its connection between scrapes

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        if not self.server.listener.allows_host(self.headers.get("Host")):
            log.warning("refused a request from %s naming Host %r: not this server's address",
                        self.address_string(), self.headers.get("Host"))
            self._send(403, b"rigdeck: the Host header does not name this server (a guard against DNS "
                            b"rebinding): scrape it by the address it listens on\n",
                       "text/plain; charset=utf-8", body)
            return
        if self.path.split("?", 1)[0] != METRICS_PATH:
            self._send(404, f"rigdeck: nothing at {self.path.split('?', 1)[0]}; the metrics are at "
                            f"{METRICS_PATH}\n".encode(), "text/plain; charset=utf-8", body)
            return
        try:
            text = self.server.exposition()
        except Exception as e:  # the scrape fails, the server goes on
            log.exception("the exposition failed")
            self._send(500, f"rigdeck: the exposition failed: {type(e).__name__}: {e}\n".encode(),
                       "text/plain; charset=utf-8", body)
            return
        data = text.encode("utf-8", "backslashreplace")
        self._send(200, data, CONTENT_TYPE, body, gzip_ok=self._accepts_gzip())

    def _accepts_gzip(self) -> bool:
        accept = self.headers.get("Accept-Encoding") or ""
        return any(part.split(";", 1)[0].strip().lower() == "gzip" for part in accept.split(","))

    def _send(self, code: int, data: bytes, ctype: str, body: bool, gzip_ok: bool = False) -> None:
        if gzip_ok:
            data = gzip.compress(data, compresslevel=1)
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        if gzip_ok:
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class MetricsServer:
    """``/metrics`` on ``host``:``port`` (port 0: a free one, see ``address``), answering what
    ``exposition()`` returns at each scrape. ``start`` serves from a thread; ``close`` stops."""

    def __init__(self, exposition: Callable[[], str], host: str = DEFAULT_LISTEN[0],
                 port: int = DEFAULT_LISTEN[1]):
        self._server = _Server((host, port), exposition)  # binds now: an address in use fails here
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        """The address and port bound (the port chosen, when 0 was asked)."""
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}{METRICS_PATH}"

    @property
    def reach(self) -> str:
        """Who can reach it, as its start line says: loopback only, or a warning."""
        if is_loopback(self.address[0]):
            return "loopback only"
        return "WARNING: reachable from the network, no login; the metrics name hosts, jobs and users"

    def start(self) -> MetricsServer:
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics-http", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve on this thread until ``close`` (from another) or an interrupt."""
        self._server.serve_forever()

    def close(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(5)
        self._server.server_close()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
