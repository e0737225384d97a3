"""The wire format between the controller and the agent daemon: JSON lines. One definition, both sides.

Every message is one JSON object on one line (UTF-8, ``\\n``-terminated), at most
``MAX_MESSAGE_BYTES`` long. Each carries a ``type``:

- ``hello``    both sides, first: ``{"type": "hello", "protocol": 1, ...}``. The daemon's hello adds
  ``agent_version``, ``hostname``, ``pid``, ``started``, and ``archive``: ``{"sha256", "current"}``,
  its version's ``agent.pyz`` hashed on the host's disk at this hello, and the version
  ``agent/current`` names.
- ``request``  controller -> daemon: ``{"type": "request", "id": 7, "method": "ping", "params": {}}``.
- ``response`` daemon -> controller: ``{"type": "response", "id": 7, "ok": true, "result": ...}`` or
  ``{"type": "response", "id": 7, "ok": false, "error": {"code": "...", "message": "..."}}``.
  A message too broken to carry an id is answered with ``"id": null``.
- ``role``     the attach -> daemon, the connection's first line when the attach has a role
  (``agent.pyz attach --role server``, a key's forced command): ``{"type": "role", "role":
  "server"}``. Requests outside the role's allow-list (``agent/roles.py``) are then answered with
  a ``refused`` error. Accepted only as the first line: a client behind the attach cannot send it
  first, nor change it later.
- ``event``    daemon -> controller, unrequested: ``{"type": "event", "event": "telemetry",
  "data": {...}}``. Telemetry events are latest-value: a slow reader gets fewer, never a backlog.

Stdlib only, Python 3.9+.
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Tuple

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 1 << 20

MESSAGE_TYPES = ("hello", "request", "response", "event", "role")

# Error codes carried in error responses.
BAD_JSON = "bad_json"
BAD_MESSAGE = "bad_message"
TOO_LARGE = "too_large"
UNKNOWN_METHOD = "unknown_method"
BAD_PARAMS = "bad_params"
NOT_HELLO = "hello_required"
VERSION_MISMATCH = "protocol_version"
INTERNAL = "internal"
REFUSED = "refused"


class ProtocolError(Exception):
    """A message that cannot be accepted; ``code`` is one of the error codes above."""

    def __init__(self, code: str, message: str, request_id: Optional[int] = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


def encode(msg: Dict[str, Any]) -> bytes:
    data = json.dumps(msg, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    if len(data) >= MAX_MESSAGE_BYTES:
        raise ProtocolError(TOO_LARGE, "message of %d bytes exceeds %d" % (len(data), MAX_MESSAGE_BYTES))
    return data + b"\n"


def _request_id(obj: Dict[str, Any]) -> Optional[int]:
    rid = obj.get("id")
    if isinstance(rid, int) and not isinstance(rid, bool) and 0 <= rid < 2**53:
        return rid
    return None


def decode(line: bytes) -> Dict[str, Any]:
    """Parse and validate one line (without or with its newline). Raises ProtocolError."""
    if len(line) > MAX_MESSAGE_BYTES:
        raise ProtocolError(TOO_LARGE, "message of %d bytes exceeds %d" % (len(line), MAX_MESSAGE_BYTES))
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProtocolError(BAD_JSON, "not UTF-8: %s" % e) from None
    try:
        obj = json.loads(text)
    except ValueError as e:  # JSONDecodeError, or deeply nested input
        raise ProtocolError(BAD_JSON, "not JSON: %s" % e) from None
    except RecursionError:
        raise ProtocolError(BAD_JSON, "JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise ProtocolError(BAD_MESSAGE, "expected a JSON object, got %s" % type(obj).__name__)
    rid = _request_id(obj)
    mtype = obj.get("type")
    if mtype not in MESSAGE_TYPES:
        raise ProtocolError(BAD_MESSAGE, "unknown message type %r" % (mtype,), rid)
    if mtype == "hello":
        if not isinstance(obj.get("protocol"), int) or isinstance(obj.get("protocol"), bool):
            raise ProtocolError(BAD_MESSAGE, "hello needs an integer 'protocol'", rid)
    elif mtype == "request":
        if rid is None:
            raise ProtocolError(BAD_MESSAGE, "request needs an integer 'id' >= 0", None)
        if not isinstance(obj.get("method"), str) or not obj["method"]:
            raise ProtocolError(BAD_MESSAGE, "request needs a string 'method'", rid)
        params = obj.get("params", {})
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise ProtocolError(BAD_PARAMS, "'params' must be an object", rid)
        obj["params"] = params
    elif mtype == "response":
        if not isinstance(obj.get("ok"), bool):
            raise ProtocolError(BAD_MESSAGE, "response needs a boolean 'ok'", rid)
    elif mtype == "role":
        if not isinstance(obj.get("role"), str):
            raise ProtocolError(BAD_MESSAGE, "role needs a string 'role'", rid)
    elif mtype == "event":
        if not isinstance(obj.get("event"), str):
            raise ProtocolError(BAD_MESSAGE, "event needs a string 'event'", rid)
    return obj


class LineSplitter:
    """Cuts a byte stream into lines, bounded: an oversized line is reported once and skipped."""

    def __init__(self, limit: int = MAX_MESSAGE_BYTES):
        self.limit = limit
        self._buf = bytearray()
        self._skipping = False

    def feed(self, data: bytes) -> List[Tuple[Optional[bytes], Optional[ProtocolError]]]:
        """Return (line, None) for each complete line and (None, error) for each oversized one."""
        out = []  # type: List[Tuple[Optional[bytes], Optional[ProtocolError]]]
        self._buf += data
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                if len(self._buf) > self.limit:
                    if not self._skipping:
                        out.append((None, ProtocolError(TOO_LARGE, "line longer than %d bytes" % self.limit)))
                    self._skipping = True
                    del self._buf[:]
                return out
            line = bytes(self._buf[:nl])
            del self._buf[: nl + 1]
            if self._skipping:
                self._skipping = False  # the tail of the oversized line
                continue
            if len(line) > self.limit:
                out.append((None, ProtocolError(TOO_LARGE, "line longer than %d bytes" % self.limit)))
                continue
            if line.strip():
                out.append((line, None))


def hello(**fields: Any) -> Dict[str, Any]:
    msg = {"type": "hello", "protocol": PROTOCOL_VERSION}  # type: Dict[str, Any]
    msg.update(fields)
    return msg


def request(rid: int, method: str, **params: Any) -> Dict[str, Any]:
    return {"type": "request", "id": rid, "method": method, "params": params}


def ok(rid: Optional[int], result: Any = None) -> Dict[str, Any]:
    return {"type": "response", "id": rid, "ok": True, "result": result}


def error(rid: Optional[int], code: str, message: str) -> Dict[str, Any]:
    return {"type": "response", "id": rid, "ok": False, "error": {"code": code, "message": message}}


def event(name: str, data: Any) -> Dict[str, Any]:
    return {"type": "event", "event": name, "data": data}
