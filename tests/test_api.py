"""The controller API is declared once (tui/control/api.py): the in-process service, the server's
dispatch and both clients agree with the declaration, and nothing else names a method."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tui.client import Client, InProcessClient, Membership, RemoteClient, _RemoteJobs, _ServerStore
from tui.control import api
from tui.control.server import _methods, _Own, encode_result
from tui.control.service import ControllerService, ServiceInfo
from tui.model.inventory import HostSpec, Inventory

ROOT = Path(__file__).resolve().parent.parent

# The names on the wire, as servers and clients of other versions know them: a change here
# breaks them (kick and deploy went in issue 31: no client ever called them; retry and
# reprioritise came in issue 33; join_key, join and leave in issue 46; slurm_read in issue 47).
WIRE = {
    "info", "ping", "subscribe_hosts", "reconnect", "jobs_snapshot", "job_detail", "select", "stop_plan",
    "source_launch", "source_stop", "launch", "stop", "view", "list_jobs", "queue", "metrics", "logs", "gc",
    "wait", "sweep", "sweeps", "sweep_detail", "sweep_stop", "sweep_stop_trial", "sweep_wait", "doctor",
    "pipeline", "pipelines", "pipeline_detail", "pipeline_stop", "pipeline_retry", "pipeline_wait",
    "code_missing", "code_put", "code_manifest", "drains", "drain", "undrain", "exposition", "tensorboard_pull",
    "usage", "retry", "reprioritise", "join_key", "join", "leave", "slurm_read",
}

# Client methods that are no call of the controller API: the link's own, or work done on the
# workstation whichever controller runs (a server refuses them with a message).
NOT_CALLS = {"kind", "start", "close", "link", "probe", "deploy", "image_push", "exec", "trust_host_key",
             "on_code_progress", "telemetry_hz", "jobs"}


def params(fn: Callable[..., Any], skip: int = 0) -> list[inspect.Parameter]:
    """``fn``'s parameters after the first ``skip`` (self, the session)."""
    return list(inspect.signature(fn).parameters.values())[skip:]


def test_the_declaration_is_the_wire_as_it_was() -> None:
    assert set(api.METHODS) == WIRE
    for m in api.METHODS.values():
        assert m.doc, m.name
        assert m.own or m.service, m.name
        assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in m.signature.parameters.values()), m.name


def test_the_server_dispatches_exactly_the_declared_methods() -> None:
    table = _methods()
    assert set(table) == set(api.METHODS)
    own = {n for n, _ in inspect.getmembers(_Own, inspect.isfunction)}
    assert own == {m.attr for m in api.METHODS.values() if m.own}, "a handler of its own for each own method, no more"
    for m in api.METHODS.values():
        if m.own:  # the handler takes the session, then exactly the declared params
            got = params(getattr(_Own, m.attr), skip=1)
            assert [(p.name, p.default) for p in got] == [
                (p.name, p.default) for p in m.signature.parameters.values()], m.name
            assert inspect.isgeneratorfunction(getattr(_Own, m.attr)) == m.stream, m.name


def test_the_service_answers_every_declared_method() -> None:
    for m in api.METHODS.values():
        if m.service is None:
            continue
        fn = getattr(ControllerService, m.service)
        if m.own:
            continue  # the server's handler calls it its own way (a spec decoded, the session's id)
        have = {p.name: p for p in params(fn, skip=1)}
        for p in m.signature.parameters.values():
            assert p.name in have and have[p.name].kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY), (m.name, p.name)
            assert have[p.name].default == p.default, (m.name, p.name)
        extra = [n for n in have if n not in m.signature.parameters]
        assert all(have[n].default is not inspect.Parameter.empty for n in extra), (m.name, extra)
        assert inspect.isgeneratorfunction(fn) == m.stream, m.name


def test_the_client_is_the_declaration_and_what_a_client_writes_out_keeps_its_parameters() -> None:
    """``Client`` is ``api.ControllerAPI``: its calls are the declared methods, and no other
    public method of it calls the controller. A client writes out only what it does its own way
    (the rest go through its ``_call_declared``), each with exactly the declared parameters."""
    declared = {m.attr: m for m in api.METHODS.values() if m.client}
    public = {n for n in dir(Client) if not n.startswith("_")}
    assert public - NOT_CALLS == set(declared), "every Client method that calls the controller is declared"
    written = {}
    for m in declared.values():
        assert getattr(Client, m.attr) is m, m.attr  # the class's attribute is the declaration itself
        for cls in (InProcessClient, RemoteClient):
            own = inspect.getattr_static(cls, m.attr)
            if isinstance(own, api.Declared):
                continue  # made by the client's _call_declared
            written.setdefault(cls.__name__, []).append(m.attr)
            assert [(p.name, p.default) for p in params(own, skip=1)] == [
                (p.name, p.default) for p in m.signature.parameters.values()], (cls.__name__, m.attr)
    # What each client does its own way, and nothing more (a new method needs no line in either).
    assert written == {"InProcessClient": ["log_chunks"],
                       "RemoteClient": ["reconnect", "launch", "stop", "log_chunks", "sweep", "pipeline"]}


# -- what the clients send ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Pipeline:
    """A pipeline spec with no steps: what RemoteClient.pipeline reads of one."""

    steps: tuple[Any, ...] = ()
    path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"steps": []}


SAMPLES: dict[str, Any] = {
    "ref": "j1", "host": "h1", "grace_s": 5.0, "yes": True, "wait": False, "rank": 0, "follow": True,
    "hosts": ["h1"], "checks": ["gpus"], "timeout": 3.0, "number": 2, "step": "train", "queue": False,
    "targets": ["h1:0"], "reason": "fan", "now": True, "who": "ann", "by": "user", "since": 1.0,
    "have": [["h1", "/d/tensorboard", "events.out.tfevents.1", "5:7", 10, 20]], "priority": 7,
    "refresh": False, "env_values": None, "argv": ["scontrol", "-o", "show", "nodes"],
}


def sample_args(m: api.Method) -> dict[str, Any]:
    spec = _Pipeline() if m.attr == "pipeline" else types.SimpleNamespace(code=None, env_from_file=None,
                                                                                to_dict=lambda: {"name": "x"})
    return {p.name: spec if p.name == "spec" else SAMPLES[p.name] for p in m.signature.parameters.values()}


class _Sent(Exception):
    pass


Sent = list[tuple[api.Method, dict[str, Any]]]


def remote_client(answers: dict[str, Any] | None = None) -> tuple[RemoteClient, Sent]:
    """A RemoteClient that records what it would send (and sends nothing): the call ends there
    (``_Sent``), or is answered from ``answers`` (wire name -> result)."""
    inv = Inventory(hosts=(HostSpec(name="h1", address="10.0.0.1"),), path=Path("/x/hosts.toml"),
                    known_hosts=Path("/x/known_hosts"))
    client = RemoteClient(inv, server=types.SimpleNamespace(host="h1", state_dir="/x"),
                          transport_factory=lambda: None)
    sent: Sent = []
    real_send = client._send

    def send(rid: int, method: api.Method, params: dict[str, Any]) -> Any:
        sent.append((method, params))
        client._stream = types.SimpleNamespace(send=lambda data: None)
        call = real_send(rid, method, params)  # the declaration's check of the params
        if method.name not in (answers or {}):
            raise _Sent
        call.q.put({"result": (answers or {})[method.name]})
        return call

    client._ensure_link = lambda: None  # type: ignore[method-assign]
    client._send = send  # type: ignore[method-assign]
    return client, sent


def drive(fn: Callable[..., Any], **kwargs: Any) -> None:
    """``fn(**kwargs)`` up to its first send (a stream's too)."""
    with pytest.raises(_Sent):
        out = fn(**kwargs)
        if inspect.isgenerator(out):
            next(out)


def test_the_remote_client_sends_each_declared_method_with_its_params() -> None:
    client, sent = remote_client({api.jobs_snapshot.name: None})  # the list unchanged: the open job's detail next
    for m in api.METHODS.values():
        if not m.client:
            continue
        drive(getattr(client, m.attr), **sample_args(m))
        method, params = sent[-1]
        assert method is m, (m.attr, method.name)
        m.bind(params)
    # The app's job source and the code upload: the rest of the declared calls.
    jobs = _RemoteJobs(client)
    jobs._selected = "j1"
    store = _ServerStore(client)
    member = Membership(client)  # rigdeck server join and leave
    spec = types.SimpleNamespace(to_dict=lambda: {"name": "x"}, env_from_file=None)
    for fn in (jobs.poll_once, lambda: jobs.stop_plan("j1"), lambda: jobs.launch(spec),  # type: ignore[arg-type]
               lambda: jobs.stop_job("j1"), lambda: store.missing([["a", 1]]), lambda: store.put([]),
               lambda: store.add_manifest("t", []), member.key, lambda: member.join({"h2": "rdk-bob"}),
               lambda: member.leave(None)):
        drive(fn)
    jobs._selected = None
    drive(lambda: jobs.select("j2"))
    called = {m.name for m, _ in sent}
    link = {api.subscribe_hosts.name, api.ping.name}  # sent by the link thread as it (re)connects
    assert called | link == set(api.METHODS), f"declared, never called: {sorted(set(api.METHODS) - called - link)}"
    client_py = (ROOT / "tui" / "client.py").read_text()
    assert all(f"api.{api.METHODS[n].attr}" in client_py for n in link)


def test_a_call_the_declaration_does_not_allow_is_refused_before_it_is_sent() -> None:
    client, _ = remote_client()
    client._send = RemoteClient._send.__get__(client)  # type: ignore[method-assign]
    client._stream = types.SimpleNamespace(send=lambda data: pytest.fail("sent"))
    with pytest.raises(TypeError):
        client.call(api.sweep_stop, ref="s", nonsense=1)
    with pytest.raises(TypeError):
        client.call(api.sweep_stop_trial, ref="s")


def test_the_in_process_client_calls_the_declared_service_method() -> None:
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    class Service:
        inventory = None
        source = None

        def __getattr__(self, name: str) -> Any:
            return lambda *a, **kw: calls.append((name, a, kw))

    client = InProcessClient(service=Service())  # type: ignore[arg-type]
    for m in api.METHODS.values():
        if not m.client:
            continue
        getattr(client, m.attr)(**sample_args(m))
        name, args, kwargs = calls[-1]
        assert name == m.service, m.attr
        inspect.signature(getattr(ControllerService, name)).bind(None, *args, **kwargs)


# -- the wire ------------------------------------------------------------------------------------


def test_answers_decode_as_declared() -> None:
    info = ServiceInfo(kind="server", host="h1", pid=7, since=1.0, version="dev", history="/h", queue_advances=True)
    assert api.info.decode(encode_result(info)) == info
    assert api.metrics.decode(encode_result([{"step": 1}])) == [{"step": 1}]
    assert api.collect_garbage.decode(encode_result({"h1": ValueError("down")})) == {"h1": "down"}


def test_no_module_but_the_declaration_names_a_controller_method() -> None:
    """A call through the client's generic path (call, call_async, stream) or the server's table
    takes a declared method, never a string."""
    found = []
    for path in (ROOT / "tui").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                    "call", "call_async", "stream") and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and arg.value in WIRE:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.func.attr}({arg.value!r})")
    assert not found, found


def loopback(service: Any) -> RemoteClient:
    """A RemoteClient whose requests go, as JSON lines, to a server's session (its dispatch
    table, over ``service``) in this thread, and whose answers come back as the session sends
    them: the wire without a socket."""
    import json

    from tui.client import _Call
    from tui.control.server import Session

    client, _ = remote_client()
    calls: dict[int, _Call] = {}

    class Conn:
        def sendall(self, data: bytes) -> None:
            for line in data.decode().splitlines():
                msg = json.loads(line)
                calls[msg["id"]].q.put(msg)

    from tui.control.server import Server

    server = Server(service, Path("/nonexistent/server.sock"))  # nothing bound: the dispatch only
    session = Session(server, Conn(), 1)  # type: ignore[arg-type]

    def send(rid: int, method: api.Method, params: dict[str, Any]) -> _Call:
        method.bind(params)
        calls[rid] = _Call()
        session._call(json.loads(json.dumps({"id": rid, "method": method.name, "params": params}, default=str)))
        return calls[rid]

    client._send = send  # type: ignore[method-assign]
    return client


def test_a_code_snapshot_goes_to_the_servers_store_through_the_declared_methods(tmp_path: Path) -> None:
    from tui.model.codesync import CodeSpec
    from tui.remote.codesync import CodeStore

    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print('hi')\n")
    (src / "data.txt").write_text("x" * 5000)
    here, there = CodeStore(tmp_path / "here" / "code"), CodeStore(tmp_path / "there" / "code")
    code, _ = here.snapshot(CodeSpec(sync=str(src)))
    assert code.tree is not None
    service = types.SimpleNamespace(manager=types.SimpleNamespace(code_store=there))
    sent = here.upload(_ServerStore(loopback(service)), code.tree)
    assert sent["files"] == 2
    assert there.manifest(code.tree).tree == code.tree
    assert here.upload(_ServerStore(loopback(service)), code.tree)["files"] == 0  # it has them all now


def test_calls_streams_and_errors_cross_the_wire_as_they_did() -> None:
    from tui.client import ServerError, SweepError

    answered: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    class Service:
        def sweep_stop_trial(self, ref: str, number: int, user: str | None = None) -> Any:
            answered.append(("sweep_stop_trial", (ref, number), {}))
            raise SweepError(f"no trial {number} in {ref}")

        def sweep_stop(self, ref: str, user: str | None = None) -> Any:
            raise LookupError(ref)

        def log_chunks(self, ref: str, **kw: Any) -> Any:
            answered.append(("log_chunks", (ref,), kw))
            yield "h1", 0, b"a\xff\n", False

        def metrics(self, ref: str) -> list[dict[str, Any]]:
            return [{"step": 1, "loss": 0.5}]

    client = loopback(Service())
    assert list(client.log_chunks("j1", rank=0)) == [("h1", 0, b"a\xff\n", False)]
    assert answered[-1] == ("log_chunks", ("j1",), {"rank": 0, "follow": False, "binary": True})
    assert client.metrics("j1") == [{"step": 1, "loss": 0.5}]
    with pytest.raises(SweepError, match="no trial 3 in s1"):
        client.sweep_stop_trial("s1", 3)
    assert answered[-1] == ("sweep_stop_trial", ("s1", 3), {})
    with pytest.raises(ServerError, match="s1"):  # no local type: the server's message
        client.sweep_stop("s1")
    with pytest.raises(ServerError, match="no method 'kick'"):  # gone: no client called it
        client._result(_raw(client, "kick"))


def _raw(client: RemoteClient, name: str) -> dict[str, Any]:
    """What the loopback's session answers a request for ``name`` (declared or not)."""
    probe = api.Method(name=name, attr=name, signature=inspect.Signature(), result=Any, stream=False,
                       client=False, service=None, own=False, doc="")
    return client._send(99, probe, {}).q.get(timeout=5)


def test_every_method_declares_its_guard_or_why_it_needs_none_and_the_docs_table_is_the_declaration() -> None:
    """docs/server.md's table of methods is what the server enforces: each declared method has
    a guard, or is read-only or acts as its caller only by declaration, and the table's rows are
    the declarations' rules, one per method."""
    import re

    for m in api.METHODS.values():
        assert (m.guard is None) == (m.access in ("read", "self")), m.name
    text = (ROOT / "docs" / "server.md").read_text()
    block = text.split("<!-- methods: made from tui/control/api.py's declarations -->", 1)[1].split(
        "<!-- /methods -->", 1)[0]
    table = dict(re.findall(r"^\| `(\w+)` \| (.+?) \|$", block, re.M))
    assert table == {m.name: m.rule for m in api.METHODS.values()}
    # What each rule means is what the server's dispatch does (the guard checked before the call).
    assert {m.name for m in api.METHODS.values() if m.rule == "admins"} >= {"doctor", "gc", "reconnect", "drain"}
