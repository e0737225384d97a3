"""The rules of ``tui.model.httpguard``: which Host, Origin and token a local HTTP listener
(``rigdeck web``, ``/metrics``) answers. The listeners themselves are checked over real HTTP in
tests/test_web.py and tests/test_exporter.py."""

from __future__ import annotations

import pytest

from tui.model.httpguard import Listener, host_port, token_matches


@pytest.mark.parametrize("value, parsed", [
    ("127.0.0.1:8000", ("127.0.0.1", 8000)),
    ("LocalHost:8000", ("localhost", 8000)),
    ("[::1]:8000", ("::1", 8000)),
    ("[::1]", ("::1", 80)),
    ("example.com", ("example.com", 80)),
    ("::1:8000", None),  # IPv6 goes in brackets
    ("[::1]8000", None),
    ("127.0.0.1:80a", None),
    ("127.0.0.1:0", None),
    ("127.0.0.1:65536", None),
    (":8000", None),
    ("", None),
])
def test_host_port_reads_a_host_header(value: str, parsed: tuple[str, int] | None) -> None:
    assert host_port(value) == parsed


def test_bound_to_loopback_it_answers_to_loopback_names_on_its_port_only() -> None:
    lo = Listener("127.0.0.1", 8000)
    for ok in ("127.0.0.1:8000", "localhost:8000", "LOCALHOST:8000", "[::1]:8000"):
        assert lo.allows_host(ok), ok
    for bad in ("evil.example:8000", "127.0.0.1:8001", "127.0.0.1", "10.0.0.5:8000",
                "127.0.0.1.evil.example:8000", "localhost.evil.example:8000", "", None):
        assert not lo.allows_host(bad), bad
    # A name this machine goes by is no help on loopback: only names that cannot be rebound.
    assert not Listener("127.0.0.1", 8000, ("gpu1",)).allows_host("gpu1:8000")
    assert Listener("::1", 9464).allows_host("[::1]:9464")
    assert Listener("127.0.0.1", 80).allows_host("localhost")  # port 80 goes unwritten


def test_bound_beyond_loopback_it_answers_to_its_address_and_this_machines_names() -> None:
    one = Listener("10.0.0.5", 9464, ("gpu1", "gpu1.cluster.example"))
    for ok in ("10.0.0.5:9464", "gpu1:9464", "GPU1.cluster.example:9464"):
        assert one.allows_host(ok), ok
    for bad in ("10.0.0.6:9464", "localhost:9464", "127.0.0.1:9464", "evil.example:9464", "gpu1:9465"):
        assert not one.allows_host(bad), bad
    every = Listener("0.0.0.0", 9464, ("gpu1",))
    for ok in ("10.0.0.5:9464", "192.168.1.7:9464", "[fe80::1]:9464", "localhost:9464", "gpu1:9464"):
        assert every.allows_host(ok), ok
    assert not every.allows_host("evil.example:9464")


def test_an_origin_must_be_the_server_the_request_went_to() -> None:
    lo = Listener("127.0.0.1", 8000)
    assert lo.allows_origin(None, "127.0.0.1:8000")  # no browser: the token decides
    assert lo.allows_origin("http://127.0.0.1:8000", "127.0.0.1:8000")
    assert lo.allows_origin("http://localhost:8000", "localhost:8000")
    for bad in ("http://evil.example", "http://evil.example:8000", "null", "https://127.0.0.1:8000",
                "http://localhost:8000", "http://127.0.0.1:8001", "http://127.0.0.1:8000/x", ""):
        assert not lo.allows_origin(bad, "127.0.0.1:8000"), bad
    # The same page by a rebound name: Origin and Host agree, and the Host is refused.
    assert not lo.allows_origin("http://evil.example:8000", "evil.example:8000")


def test_a_token_matches_itself_only() -> None:
    assert token_matches("abc-_123", "abc-_123")
    for bad in ("abc-_12", "abc-_1234", "ABC-_123", "", None):
        assert not token_matches(bad, "abc-_123"), bad
    assert not token_matches("", "")  # no token set is no way in
    assert not token_matches("é", "abc")  # not ASCII: refused, no error
