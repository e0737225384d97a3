"""Whom a local HTTP listener answers (``rigdeck web``, ``/metrics``): the rules, no I/O.

A listener on 127.0.0.1 is reachable by every page the person's browser opens, not only by the
person: a page on another site can send requests to it (and open websockets, which no CORS rule
stops), and through DNS rebinding (its own name made to resolve to 127.0.0.1) read what comes
back. Three checks close that:

- the ``Host`` header must name the listener as it is bound (or a name that can only mean this
  machine): a rebinding page's requests carry its own name there, which no rule here accepts;
- a browser's ``Origin`` header, when there is one, must be the page's own server: another
  site's websocket is refused;
- ``rigdeck web``'s token, random per run, shows whoever asks has been given the URL it printed
  (a page on another site, or another user of this machine, has not).
"""

from __future__ import annotations

import hmac
import ipaddress
from dataclasses import dataclass

from tui.model.fields import is_loopback

__all__ = ["Listener", "host_port", "token_matches"]

WILDCARDS = ("0.0.0.0", "::", "")  # bound to every interface


def host_port(value: str, default_port: int = 80) -> tuple[str, int] | None:
    """A ``Host`` header's (or an origin's) ``NAME[:PORT]`` as (lower-case name, port), an IPv6
    address without its brackets; None when it is no such thing (an unbracketed IPv6 address,
    a port that is no number)."""
    value = value.strip().lower()
    if value.startswith("["):
        name, sep, rest = value[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            return None
        port = rest[1:] if rest else ""
    else:
        name, _, port = value.partition(":")
        if ":" in port:
            return None
    if not name:
        return None
    if not port:
        return name, default_port
    if not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        return None
    return name, int(port)


def token_matches(given: str | None, token: str) -> bool:
    """Whether ``given`` is the token, compared in constant time (a timing difference would let
    a guesser find it a character at a time)."""
    if not given or not token:
        return False
    return hmac.compare_digest(given.encode(), token.encode())


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Listener:
    """Where a listener is bound (``host`` as given to bind, ``port`` the one bound), and the
    names this machine goes by (``names``: its host name and FQDN, accepted when it is bound
    beyond loopback, where a scraper or browser may well use them)."""

    host: str
    port: int
    names: tuple[str, ...] = ()

    def allows_host(self, header: str | None) -> bool:
        """Whether a request's ``Host`` header names this listener: the bound address, a
        loopback name when bound to loopback (``localhost``), this machine's names when bound
        beyond it, any IP address when bound to every interface; always with the bound port.
        An IP address or ``localhost`` cannot be a rebinding page's name; another name can."""
        parsed = host_port(header or "")
        if parsed is None or parsed[1] != self.port:
            return False
        name, bound = parsed[0], self.host.strip("[]").lower()
        if name == bound:
            return True
        if is_loopback(name):
            return is_loopback(bound) or bound in WILDCARDS
        if bound in WILDCARDS and _is_ip(name):
            return True
        return not is_loopback(bound) and name in {n.lower() for n in self.names if n}

    def allows_origin(self, origin: str | None, host_header: str | None) -> bool:
        """Whether a request's ``Origin`` is the server it was sent to (``http://`` and its
        ``Host``): the page is one this listener served. No ``Origin`` at all is no browser's
        request (browsers send one with every websocket), which the other checks cover."""
        if origin is None:
            return True
        scheme, sep, rest = origin.partition("://")
        if not sep or scheme.lower() != "http" or "/" in rest:
            return False  # "null" (a sandboxed or file: page), https (not served here)
        theirs, ours = host_port(rest), host_port(host_header or "")
        return theirs is not None and theirs == ours and self.allows_host(host_header)
