"""The controller API, declared once: every method a face can call on a controller server.

Each declaration below is a stub. Its parameters are the request's ``params`` as they go over
the wire (JSON values: a job spec as its dict, hosts as a list), its return annotation the type
the answer decodes into (of each item, for a stream). From this one table:

* the server (``tui.control.server``) dispatches: a method with a ``service`` and no handler
  of its ``own`` calls that ``ControllerService`` method with the params and encodes its answer;
  an ``own`` method has a handler of the stub's name in the server (it needs the session, or
  decodes a spec, or encodes bytes);
* the clients (``tui.client``) are the declaration: ``Client`` is ``ControllerAPI``, whose
  methods are the stubs of the calls a face makes (``client=True``), each a ``Declared`` that
  hands its bound arguments to the client's ``_call_declared``; the in-process client calls the
  ``service`` method with them, the remote client sends the method's ``name`` (params checked
  against the stub) and decodes the answer by ``result``. A client writes out only what it does
  its own way (a spec's code sent first, log bytes decoded). A new method is its declaration here
  and its service method;
* ``tests/test_api.py`` checks that the in-process service, the server's dispatch and both
  clients agree with it.

Three more things are declared per method, for a server several people share: its ``guard``, the
rule (``tui.model.permissions``) the server checks with the session's person before it runs
(stopping a job is its owner's or an admin's, draining is an admin's), or, unguarded, its
``access``: ``read`` (it changes nothing anyone shares) or ``self`` (it acts as the caller only);
docs/server.md's table of methods is made from them (checked by tests/test_api.py); and its ``actor``, the
service keyword that receives that person (``user``: who launched or stopped it; ``who``: who
drained). The person always comes from the session (its SSH key's forced command), never from
the params: an ``actor`` the client sends is replaced.

The wire name is spelled here and nowhere else. It is a contract with clients and servers of
other versions, so it is written out, not taken from the stub's Python name: renaming a stub
(the ``Client`` method it stands for) does not rename the method on the wire.
"""

# The stubs below are declarations, never called: they have a signature and a docstring, no body.
# mypy: disable-error-code="empty-body"

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from tui.control.queue import QueueEntry
from tui.control.service import ServiceInfo
from tui.model import permissions as perm
from tui.model import wire
from tui.model.doctor import DoctorReport
from tui.model.jobspec import JobSpec
from tui.model.jobview import JobView, StopPlan
from tui.model.pipelinespec import PipelineSpec
from tui.model.pipelineview import PipelineDetail, PipelineRow
from tui.model.sweepview import SweepDetail, SweepRow
from tui.model.usage import UsageReport


@dataclass(frozen=True)
class Method:
    """One method of the controller API."""

    name: str  # on the wire
    attr: str  # the stub's name: the Client method that makes the call, the server's own handler
    signature: inspect.Signature  # the params, as they go over the wire
    result: Any  # what the answer decodes into (each item's type, for a stream)
    stream: bool  # answered by items and an end, not one result
    client: bool  # a Client method named ``attr`` makes this call (else the link, the job source, the code upload)
    service: str | None  # the ControllerService method that answers it (None: none does directly)
    own: bool  # the server has a handler of its own named ``attr`` (else it calls ``service``)
    doc: str
    guard: perm.Guard | None = None  # the permission the server checks first (None: anyone)
    actor: str | None = None  # the service keyword given the session's person ("user", "who")
    # Unguarded methods say why they need no guard: "read" (changes nothing anyone shares) or
    # "self" (acts as the caller only: their own new work, their own session).
    access: str | None = None
    # How long the remote client waits for the answer at least (a call that runs long on the
    # server: a launch behind a stop, the doctor's measurements); None: its usual timeout.
    timeout_s: float | None = None

    @property
    def rule(self) -> str:
        """Who may call it, in the words of docs/server.md's table of methods."""
        if self.guard is None:
            return "everyone (reads)" if self.access == "read" else "everyone, as themselves"
        if self.guard.admin_only:
            return "admins"
        return f"the {self.guard.kind}'s owner, or an admin"

    def bind(self, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` checked against the stub (TypeError for one it lacks or does not know),
        with the stub's defaults for those not given."""
        bound = self.signature.bind(**params)
        bound.apply_defaults()
        return dict(bound.arguments)

    def decode(self, value: Any) -> Any:
        """The answer (an item of a stream) as ``result``."""
        return _decode(self.result, value)


def _decode(tp: Any, value: Any) -> Any:
    # A job view crosses as its own JSON form (to_json/from_json), not as wire.encode's fields.
    if isinstance(tp, type) and hasattr(tp, "from_json"):
        return tp.from_json(value)
    if typing.get_origin(tp) is list:
        (arg,) = typing.get_args(tp)
        if isinstance(arg, type) and hasattr(arg, "from_json"):
            return [arg.from_json(v) for v in value]
    return wire.decode(tp, value)


METHODS: dict[str, Method] = {}  # by wire name, in the order declared

P = ParamSpec("P")
R = TypeVar("R")


class _Same:
    """The default of ``_declare``'s ``service``: the service method of the stub's own name."""


def _method(name: str, stub: Callable[..., Any], *, skip: int, stream: bool, client: bool,
            service: str | None | type[_Same], own: bool, guard: perm.Guard | None, actor: str | None,
            access: str | None, result: Any = None, timeout_s: float | None = None) -> Method:
    """The declaration of ``stub`` (its first ``skip`` parameters dropped: a method's self),
    recorded in METHODS. A stream's stub returns an Iterator of its items: ``result`` is the item."""
    assert name not in METHODS, f"{name} declared twice"
    hints = typing.get_type_hints(stub)
    answers = stub.__name__ if service is _Same else typing.cast("str | None", service)
    sig = inspect.signature(stub)
    sig = sig.replace(parameters=list(sig.parameters.values())[skip:])
    if result is None:
        result = hints.get("return", Any)
        if stream and typing.get_origin(result) in (Iterator, typing.Iterator):
            (result,) = typing.get_args(result)
    method = Method(
        name=name, attr=stub.__name__, signature=sig, result=result,
        stream=stream, client=client, service=answers, own=own, doc=inspect.getdoc(stub) or "",
        guard=guard, actor=actor, access=access, timeout_s=timeout_s,
    )
    assert own or method.service, f"{name}: a server handler of its own or a service method"
    # Every method says what it asks of its caller: a guard, or why it needs none.
    assert (guard is None) == (access in ("read", "self")), f"{name}: a guard, or access read or self"
    METHODS[name] = method
    return method


def _declare(name: str, *, stream: bool = False, service: str | None | type[_Same] = _Same, own: bool = False,
             guard: perm.Guard | None = None, actor: str | None = None,
             access: str | None = None) -> Callable[[Callable[..., Any]], Method]:
    """A call no ``Client`` method makes (the link's, the app's job source's, the code upload's):
    a module-level stub, the ``Method`` itself."""
    def declare(stub: Callable[..., Any]) -> Method:
        return _method(name, stub, skip=0, stream=stream, client=False, service=service, own=own,
                       guard=guard, actor=actor, access=access)
    return declare


class Declared(Generic[P, R]):
    """A ``ControllerAPI`` method: on the class, its ``Method``; on a client, a function of the
    stub's parameters that binds them (a call the stub does not allow fails here) and hands them
    to the client's ``_call_declared``. A client's own method of that name takes its place."""

    def __init__(self, method: Method) -> None:
        self.method = method
        self.__doc__ = method.doc

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> Method: ...

    @overload
    def __get__(self, obj: ControllerAPI, owner: type[Any]) -> Callable[P, R]: ...

    def __get__(self, obj: ControllerAPI | None, owner: type[Any]) -> Method | Callable[P, R]:
        if obj is None:
            return self.method
        method = self.method

        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            bound = method.signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return typing.cast(R, obj._call_declared(method, dict(bound.arguments)))

        call.__name__ = method.attr
        call.__doc__ = method.doc
        call.__signature__ = method.signature  # type: ignore[attr-defined]
        return call


def _call(name: str, *, stream: bool = False, service: str | None | type[_Same] = _Same, own: bool = False,
          guard: perm.Guard | None = None, actor: str | None = None, access: str | None = None,
          result: Any = None, timeout_s: float | None = None,
          ) -> Callable[[Callable[Concatenate[Any, P], R]], Declared[P, R]]:
    """A call a ``Client`` method makes: a stub method of ``ControllerAPI``, typed as the client
    method (a stream's as the Iterator of its items)."""
    def declare(stub: Callable[Concatenate[Any, P], R]) -> Declared[P, R]:
        return Declared(_method(name, stub, skip=1, stream=stream, client=True, service=service, own=own,
                                guard=guard, actor=actor, access=access, result=result, timeout_s=timeout_s))
    return declare


def __getattr__(name: str) -> Method:
    """``api.<stub name>``: the declared method of that name (``api.launch``, ``api.ping``)."""
    for m in METHODS.values():
        if m.attr == name:
            return m
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------------------------
# The link, the app's job source (tui.client's RemoteClient and its _RemoteJobs) and the code
# upload (tui.remote.codesync's, to the server's store): calls no Client method makes.


@_declare("ping", access="read", service=None, own=True)
def ping() -> float:
    """The server's clock: a link that went quiet asks, to find out whether it is still there."""


@_declare("subscribe_hosts", access="self", service=None, own=True)
def subscribe_hosts(rate_hz: float = 1.0) -> dict[str, Any]:
    """Start (or restart, from scratch) this session's telemetry deltas at ``rate_hz``."""


@_declare("jobs_snapshot", access="read", own=True)
def jobs_snapshot(since: int = -1) -> Any:
    """The jobs list's rows that changed since this session's last answer, or None."""


@_declare("job_detail", access="read", own=True)
def job_detail(job_id: str, log_since: int = 0) -> Any:
    """The open job's detail, and its log lines after ``log_since``."""


@_declare("select", access="self", own=True)
def select(job_id: str | None) -> None:
    """The job this session has open (its logs are read more often)."""


@_declare("stop_plan", access="read")
def stop_plan(job_id: str) -> StopPlan:
    """What stopping the job would do (the app's confirmation)."""


@_declare("source_launch", access="self", service=None, own=True)
def source_launch(spec: dict[str, Any], env_values: dict[str, str] | None = None) -> str:
    """The app's launch: the job's id. ``env_values``: as ``launch``'s."""


@_declare("source_stop", service=None, own=True, guard=perm.Guard("job", "stop", "job_id"))
def source_stop(job_id: str) -> str:
    """The app's stop: the job's state after it."""


@_declare("code_missing", access="read", service=None, own=True)
def code_missing(blobs: list[Any]) -> list[Any]:
    """Which of these contents ([sha256, size]) the server's store lacks."""


@_declare("code_put", access="self", service=None, own=True)
def code_put(blobs: list[Any]) -> dict[str, Any]:
    """Store these contents (code_put items, as an agent takes them)."""


@_declare("code_manifest", access="self", service=None, own=True)
def code_manifest(tree: str, files: list[Any]) -> dict[str, Any]:
    """Record a tree whose every content the server's store holds."""


@_declare("join_key", access="self", service=None, own=True)
def join_key() -> dict[str, Any]:
    """What ``rigdeck server join`` installs on the caller's hosts: the server's public key, its
    host and the caller's name on the server (a person's session only)."""


@_declare("join", access="self", service=None, own=True)
def join(accounts: dict[str, str]) -> dict[str, Any]:
    """Record the caller's own accounts ({host: account}) after checking each: the server
    attaches through the key line the caller installed there and asks the agent which account
    it runs as. From then on the caller's jobs run as those accounts, on those hosts only."""


@_declare("leave", access="self", service=None, own=True)
def leave(hosts: list[str] | None = None) -> dict[str, Any]:
    """Forget the caller's own accounts on ``hosts`` (None: all) and close the server's links to
    them; refused while a job of theirs runs there. What is left recorded, and what was dropped."""


# ---------------------------------------------------------------------------------------------
# What the faces call: ``tui.client.Client`` is this class.


class ControllerAPI:
    """The controller's calls, as a face makes them. A spec goes as its dict on the wire; a
    stream's items are decoded one by one as they come."""

    def _call_declared(self, method: Method, args: dict[str, Any]) -> Any:
        """Make the call ``method`` with ``args`` (every stub parameter, defaults applied)."""
        raise NotImplementedError

    @_call("info", access="read")
    def info(self) -> ServiceInfo:
        """Where the controller runs (the hello carries the same)."""

    @_call("reconnect", guard=perm.RECONNECT)
    def reconnect(self, host: str) -> None:
        """Reconnect the controller's telemetry reader of ``host`` now."""

    # -- jobs --------------------------------------------------------------------------------

    @_call("launch", access="self", own=True, actor="user", timeout_s=210.0)
    def launch(self, spec: JobSpec, queue: bool = True, env_values: dict[str, str] | None = None) -> JobView:
        """Start the job, or queue it when it does not fit now. The server checks the spec as a
        spec file is checked, and picks the id. (A launch behind a stop follows the stop to its
        end first: a remote client waits longer for it.) ``env_values``: the values of the
        spec's ``env_from_file``, read where the client runs (the remote client fills them in):
        the server checks them against the spec's names and holds them in memory only, until
        the job's first start has taken them to its hosts; never recorded, shown or logged."""

    @_call("stop", guard=perm.STOP_JOB, actor="user")
    def stop(self, ref: str, grace_s: float | None = None, yes: bool = False, wait: bool = True) -> JobView:
        """Stop the job (``wait``: answer when its processes and GPU claims are gone)."""

    @_call("retry", guard=perm.RETRY_JOB, actor="user", timeout_s=210.0)
    def retry(self, ref: str, queue: bool = True) -> JobView:
        """Launch an ended job again as a new job (same spec and code, same owner)."""

    @_call("reprioritise", own=True, guard=perm.REPRIORITISE_JOB, actor="user")
    def reprioritise(self, ref: str, priority: int) -> JobView:
        """Set the priority of a job that has not ended."""

    @_call("view", access="read")
    def view(self, ref: str) -> JobView:
        """One job by id, unique id prefix or name."""

    @_call("list_jobs", access="read")
    def list_jobs(self, refresh: bool = True) -> list[JobView]:
        """Every job of the history."""

    @_call("queue", access="read", service="queue_entries")
    def queue(self) -> list[QueueEntry]:
        """The queued jobs, in the order they start."""

    @_call("metrics", access="read")
    def metrics(self, ref: str) -> list[dict[str, Any]]:
        """The job's metrics records."""

    @_call("exposition", access="read")
    def exposition(self) -> str:
        """What the controller knows now (hosts, GPUs, jobs, the queue) in Prometheus' text
        exposition format, version 0.0.4 (``tui.model.promexport``)."""

    @_call("logs", access="read", stream=True, own=True, service="log_chunks", result=dict[str, Any])
    def log_chunks(self, ref: str, rank: int | None = None,
                   follow: bool = False) -> Iterator[tuple[str, int, bytes, bool]]:
        """The job's log output: (host, rank, bytes, partial); on the wire items
        {host, rank, b64, partial}."""

    @_call("tensorboard_pull", access="read", stream=True)
    def tensorboard_pull(self, ref: str, have: list[list[Any]] | None = None) -> Iterator[dict[str, Any]]:
        """The new bytes of the job's TensorBoard files on its hosts, against ``have`` (rows
        ``[host, dir, path, id, size, mtime_ns]``, ``tui.model.tbsync.have_row``): a job item,
        then each host's listing and pieces (``tui.control.tensorboard``)."""

    @_call("gc", guard=perm.GC)
    def collect_garbage(self, hosts: Sequence[str] | None = None) -> dict[str, Any]:
        """Remove what ended jobs left on the hosts."""

    @_call("wait", access="read", stream=True)
    def wait(self, ref: str, timeout: float | None = None) -> Iterator[JobView]:
        """The job's view each time its state or restart count changes, until it ends."""

    # -- sweeps, drains, the doctor, pipelines, usage ------------------------------------------

    @_call("sweep", access="self", own=True, actor="user")
    def sweep(self, spec: JobSpec) -> SweepDetail:
        """Start a sweep."""

    @_call("sweeps", access="read", service="sweep_rows")
    def sweeps(self) -> list[SweepRow]:
        """Every sweep."""

    @_call("sweep_detail", access="read")
    def sweep_detail(self, ref: str) -> SweepDetail:
        """One sweep by id, unique id prefix or name."""

    @_call("sweep_stop", guard=perm.STOP_SWEEP, actor="user")
    def sweep_stop(self, ref: str) -> SweepDetail:
        """Stop a sweep: its running trials stop and no new one starts."""

    @_call("sweep_stop_trial", own=True, guard=perm.STOP_TRIAL, actor="user")
    def sweep_stop_trial(self, ref: str, number: int) -> SweepDetail:
        """Stop one trial of a sweep."""

    @_call("sweep_wait", access="read", stream=True)
    def sweep_wait(self, ref: str, timeout: float | None = None) -> Iterator[SweepDetail]:
        """The sweep's detail each time a trial changes state, until the sweep ends."""

    @_call("slurm_read", access="read")
    def slurm_read(self, argv: Sequence[str]) -> dict[str, Any]:
        """One of Slurm's read commands (``tui.model.slurm.SERVER_READS``: its nodes, its queue;
        nothing else) on the ``[slurm]`` login host, through its agent: the login host -> the
        agent's answer (exit_code, stdout, stderr, error)."""

    @_call("drains", access="read")
    def drains(self) -> list[dict[str, Any]]:
        """The GPUs and hosts kept out of placement: who, when, why."""

    @_call("drain", guard=perm.DRAIN, actor="who", timeout_s=600.0)
    def drain(self, targets: Sequence[str], reason: str = "", now: bool = False,
              who: str = "") -> list[dict[str, Any]]:
        """Keep ``HOST`` or ``HOST:GPU`` out of placement (``now``: move the jobs running there
        too, answered once they are stopped and started again). Every drain in force after."""

    @_call("undrain", guard=perm.UNDRAIN)
    def undrain(self, targets: Sequence[str]) -> list[dict[str, Any]]:
        """Put ``HOST`` or ``HOST:GPU`` back into placement; the drains removed."""

    @_call("doctor", guard=perm.DOCTOR, timeout_s=1800.0)
    def doctor(self, hosts: Sequence[str] | None = None, checks: Sequence[str] | None = None) -> DoctorReport:
        """Run the doctor's checks over ``hosts`` (default: every host), ``checks`` a subset of
        tui.model.doctor.CHECKS; answered when its measurement jobs have ended."""

    @_call("pipeline", access="self", own=True, actor="user")
    def pipeline(self, spec: PipelineSpec) -> PipelineDetail:
        """Start a pipeline: record it and start the steps that need none."""

    @_call("pipelines", access="read", service="pipeline_rows")
    def pipelines(self) -> list[PipelineRow]:
        """Every pipeline."""

    @_call("pipeline_detail", access="read")
    def pipeline_detail(self, ref: str) -> PipelineDetail:
        """One pipeline by id, unique id prefix or name (the newest of that name)."""

    @_call("pipeline_stop", guard=perm.STOP_PIPELINE, actor="user")
    def pipeline_stop(self, ref: str) -> PipelineDetail:
        """Stop a pipeline: its running steps stop and no new one starts."""

    @_call("pipeline_retry", own=True, guard=perm.RETRY_PIPELINE)
    def pipeline_retry(self, ref: str, step: str) -> PipelineDetail:
        """Run a failed or stopped step again, then the steps skipped because of it."""

    @_call("pipeline_wait", access="read", stream=True)
    def pipeline_wait(self, ref: str, timeout: float | None = None) -> Iterator[PipelineDetail]:
        """The pipeline's detail each time a step changes state, until it ends."""

    @_call("usage", access="read", timeout_s=600.0)
    def usage(self, by: str = "user", since: float | None = None) -> UsageReport:
        """GPU hours, jobs, preemptions and goodput by ``by`` (user, group, job) after ``since``
        (epoch seconds; None: all), from the jobs' recorded GPU time (each job's goodput read
        from its hosts once: a first look over many jobs takes a while)."""
