"""The wire format: round trips, and a decoder that answers garbage with errors, never crashes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent import protocol
from agent.protocol import LineSplitter, ProtocolError, decode, encode

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)


def test_round_trip_of_each_message_type() -> None:
    for msg in (
        protocol.hello(agent_version="abc"),
        protocol.request(3, "ping", x=1),
        protocol.ok(3, {"a": [1, 2]}),
        protocol.error(None, protocol.BAD_JSON, "nope"),
        protocol.event("telemetry", {"seq": 1}),
    ):
        line = encode(msg)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert decode(line) == msg


@pytest.mark.parametrize(
    "line, code",
    [
        (b"not json", protocol.BAD_JSON),
        (b"\xff\xfe", protocol.BAD_JSON),
        (b"[1, 2]", protocol.BAD_MESSAGE),
        (b'{"type": "gossip"}', protocol.BAD_MESSAGE),
        (b'{"type": "request", "method": "ping"}', protocol.BAD_MESSAGE),
        (b'{"type": "request", "id": "7", "method": "ping"}', protocol.BAD_MESSAGE),
        (b'{"type": "request", "id": 7}', protocol.BAD_MESSAGE),
        (b'{"type": "request", "id": 7, "method": "ping", "params": [1]}', protocol.BAD_PARAMS),
        (b'{"type": "hello", "protocol": "1"}', protocol.BAD_MESSAGE),
        (b"[" * 100000 + b"]" * 100000, protocol.BAD_JSON),
    ],
)
def test_bad_messages_raise_protocol_errors(line: bytes, code: str) -> None:
    with pytest.raises(ProtocolError) as e:
        decode(line)
    assert e.value.code == code


def test_request_id_survives_into_the_error() -> None:
    with pytest.raises(ProtocolError) as e:
        decode(b'{"type": "request", "id": 9, "method": 5}')
    assert e.value.request_id == 9


def test_oversized_lines_are_reported_once_and_skipped() -> None:
    sp = LineSplitter(limit=100)
    out = sp.feed(b"x" * 150)
    assert len(out) == 1 and out[0][1] is not None and out[0][1].code == protocol.TOO_LARGE
    assert sp.feed(b"y" * 150) == []  # still the same long line: no second report
    out = sp.feed(b'tail\n{"a":1}\n')
    assert out == [(b'{"a":1}', None)]


@given(st.binary(max_size=2000))
@settings(max_examples=500, deadline=None)
def test_decoder_never_crashes_on_bytes(data: bytes) -> None:
    try:
        msg = decode(data)
    except ProtocolError as e:
        assert e.code in (protocol.BAD_JSON, protocol.BAD_MESSAGE, protocol.BAD_PARAMS, protocol.TOO_LARGE)
    else:
        assert isinstance(msg, dict) and msg["type"] in protocol.MESSAGE_TYPES


@given(json_values)
@settings(max_examples=500, deadline=None)
def test_decoder_never_crashes_on_json(value: object) -> None:
    try:
        msg = decode(json.dumps(value).encode())
    except ProtocolError:
        return
    assert msg["type"] in protocol.MESSAGE_TYPES


@given(st.lists(st.binary(max_size=300), max_size=20), st.integers(min_value=1, max_value=64))
@settings(max_examples=300, deadline=None)
def test_splitter_reassembles_lines_from_any_chunking(lines: list[bytes], chunk: int) -> None:
    clean = [ln.replace(b"\n", b"") for ln in lines]
    stream = b"".join(ln + b"\n" for ln in clean)
    sp = LineSplitter(limit=10_000)
    got = []
    for i in range(0, len(stream), chunk):
        got.extend(sp.feed(stream[i : i + chunk]))
    assert [g[0] for g in got] == [ln for ln in clean if ln.strip()]
