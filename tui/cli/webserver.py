"""textual-serve's server as ``rigdeck web`` runs it: only for whoever holds the run's token, from
no other site (``tui.model.httpguard``: the Host and Origin checks), with a log that never holds
the token, and every session's app ended on the way out.

The token reaches the server twice: in the page's URL (``/?token=...``, the URL ``rigdeck web``
prints) and in the path of the websocket the page opens (``/ws/TOKEN``), which this server
writes into the page it serves with that token. A path, not a query: textual-serve's script
appends its own query (``?width=..&height=..``) to the websocket URL it is given. No cookie: a
browser sends a cookie for 127.0.0.1 to every port there, whoever listens on it.

Imported by ``tui.cli.web`` only once textual-serve is known to be installed.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp_jinja2
from aiohttp import web
from textual_serve.server import Server, to_int

from tui.cli.web import QUIT_GRACE_S
from tui.model.httpguard import Listener, token_matches

log = logging.getLogger("rigdeck.web")

# textual-serve's routes anyone may fetch without the token: its page's scripts and styles, and
# a file the app delivers, whose key is a random one (uuid4) sent to that session's page only.
OPEN_ROUTES = ("static", "download")
TOKEN_WEBSOCKET = "/ws/{token}"
REDACTED = "<token>"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _RedactingFormatter(logging.Formatter):
    """Formats a record, then takes the token out of all of it: the message (an access log line
    holds the request's URL), its arguments and any traceback."""

    def __init__(self, secret: str, fmt: str) -> None:
        super().__init__(fmt)
        self.secret = secret

    def format(self, record: logging.LogRecord) -> str:
        return super().format(record).replace(self.secret, REDACTED)


class WebServer(Server):
    """textual-serve's server with rigdeck's guard, page, words and shutdown."""

    def __init__(self, command: str, *, host: str, port: int, token: str, listener: Listener,
                 banner: str) -> None:
        super().__init__(command, host=host, port=port, title="rigdeck")
        self.token, self.listener, self.banner = token, listener, banner
        self.sessions: set[asyncio.Task[Any]] = set()

    def initialize_logging(self) -> None:
        # Instead of textual-serve's handler (rich tracebacks with their local variables, where
        # a token could be shown): one plain handler, the only one, that redacts the token.
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(_RedactingFormatter(self.token, "rigdeck web: %(levelname)s %(message)s"))
        logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)

    async def _make_app(self) -> web.Application:
        app: web.Application = await super()._make_app()
        app.router.add_get(TOKEN_WEBSOCKET, self.handle_websocket, name="websocket-token")
        app.middlewares.append(self._guard)
        return app

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every request passes ``_refusal`` first; a refused one gets a 403 and nothing else
        (a websocket is never upgraded, so no app starts)."""
        refusal = self._refusal(request)
        if refusal is None:
            return await handler(request)
        # The route's name, not the path: a path can hold a token.
        log.warning("refused %s %s from %s: %s", request.method,
                    request.match_info.route.name or "(no such page)", request.remote, refusal)
        return web.Response(status=403, text=f"rigdeck web: {refusal}\n")

    def _refusal(self, request: web.Request) -> str | None:
        host = request.headers.get("Host")
        if not self.listener.allows_host(host):
            return f"the Host header {host!r} does not name this server (a guard against DNS rebinding)"
        origin = request.headers.get("Origin")
        if not self.listener.allows_origin(origin, host):
            return f"a page from {origin!r}, not this server's, may not use it"
        if request.match_info.route.name in OPEN_ROUTES:
            return None
        given = request.match_info.get("token") or request.query.get("token")
        if not token_matches(given, self.token):
            return "no valid token: open the URL that `rigdeck web` printed, ?token=... included"
        return None

    async def handle_index(self, request: web.Request) -> web.StreamResponse:
        """textual-serve's page, its websocket going back to the address the browser asked for
        (its Host, checked) with the token in the path."""
        context = {
            "font_size": to_int(request.query.get("fontsize", "16"), 16),
            "app_websocket_url": f"ws://{request.host}/ws/{self.token}",
            "config": {"static": {"url": "/static/"}},
            "application": {"name": self.title},
        }
        response = aiohttp_jinja2.render_template("app_index.html", request, context)
        # The page and its URL hold the token: kept out of the cache and of Referer headers
        # (the page loads a font from another site).
        response.headers["Cache-Control"] = "no-store"
        response.headers["Referrer-Policy"] = "no-referrer"
        return response

    async def on_startup(self, app: web.Application) -> None:
        print(self.banner, flush=True)

    async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
        task = asyncio.current_task()
        assert task is not None
        self.sessions.add(task)
        try:
            return await super().handle_websocket(request)
        finally:
            self.sessions.discard(task)

    async def on_shutdown(self, app: web.Application) -> None:
        # Cancelling a session's handler makes textual-serve tell its app to quit and wait for
        # it; a stuck app is killed once the server has stopped (tui.cli.web._end_children).
        tasks = list(self.sessions)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=QUIT_GRACE_S)
