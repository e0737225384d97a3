"""The controller API, declared once: every method a face can call on a controller server.

Each declaration below is a stub. Its parameters are the request's ``params`` as they go over
the wire (JSON values: a job spec as its dict, hosts as a list), its return annotation the type
the answer decodes into (of each item, for a stream). From this one table:

* the server (``tui.control.server``) dispatches: a method with a ``service`` and no handler
  of its ``own`` calls that ``ControllerService`` method with the params and encodes its answer;
  an ``own`` method has a handler of the stub's name in the server (it needs the session, or
  decodes a spec, or encodes bytes);
* the remote client (``tui.client.RemoteClient``) sends the method's ``name``, checks the params
  against the stub and decodes the answer by ``result``;
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tui.control.queue import QueueEntry
from tui.control.service import ServiceInfo
from tui.model import permissions as perm
from tui.model import wire
from tui.model.doctor import DoctorReport
from tui.model.jobview import JobView, StopPlan
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


class _Same:
    """The default of ``_declare``'s ``service``: the service method of the stub's own name."""


def _declare(name: str, *, stream: bool = False, client: bool = True, service: str | None | type[_Same] = _Same,
             own: bool = False, guard: perm.Guard | None = None, actor: str | None = None,
             access: str | None = None) -> Callable[[Callable[..., Any]], Method]:
    def declare(stub: Callable[..., Any]) -> Method:
        assert name not in METHODS, f"{name} declared twice"
        hints = typing.get_type_hints(stub)
        answers = stub.__name__ if service is _Same else typing.cast("str | None", service)
        method = Method(
            name=name, attr=stub.__name__, signature=inspect.signature(stub), result=hints.get("return", Any),
            stream=stream, client=client, service=answers, own=own, doc=inspect.getdoc(stub) or "",
            guard=guard, actor=actor, access=access,
        )
        assert own or method.service, f"{name}: a server handler of its own or a service method"
        # Every method says what it asks of its caller: a guard, or why it needs none.
        assert (guard is None) == (access in ("read", "self")), f"{name}: a guard, or access read or self"
        METHODS[name] = method
        return method
    return declare


# ---------------------------------------------------------------------------------------------
# The link and the app's job source (tui.client's RemoteClient and its _RemoteJobs).


@_declare("info", access="read")
def info() -> ServiceInfo:
    """Where the controller runs (the hello carries the same)."""


@_declare("ping", access="read", client=False, service=None, own=True)
def ping() -> float:
    """The server's clock: a link that went quiet asks, to find out whether it is still there."""


@_declare("subscribe_hosts", access="self", client=False, service=None, own=True)
def subscribe_hosts(rate_hz: float = 1.0) -> dict[str, Any]:
    """Start (or restart, from scratch) this session's telemetry deltas at ``rate_hz``."""


@_declare("reconnect", guard=perm.RECONNECT)
def reconnect(host: str) -> None:
    """Reconnect the server's telemetry reader of ``host`` now."""


@_declare("jobs_snapshot", access="read", client=False, own=True)
def jobs_snapshot(since: int = -1) -> Any:
    """The jobs list's rows that changed since this session's last answer, or None."""


@_declare("job_detail", access="read", client=False, own=True)
def job_detail(job_id: str, log_since: int = 0) -> Any:
    """The open job's detail, and its log lines after ``log_since``."""


@_declare("select", access="self", client=False, own=True)
def select(job_id: str | None) -> None:
    """The job this session has open (its logs are read more often)."""


@_declare("stop_plan", access="read", client=False)
def stop_plan(job_id: str) -> StopPlan:
    """What stopping the job would do (the app's confirmation)."""


@_declare("source_launch", access="self", client=False, service=None, own=True)
def source_launch(spec: dict[str, Any]) -> str:
    """The app's launch: the job's id."""


@_declare("source_stop", client=False, service=None, own=True, guard=perm.Guard("job", "stop", "job_id"))
def source_stop(job_id: str) -> str:
    """The app's stop: the job's state after it."""


# ---------------------------------------------------------------------------------------------
# Jobs (the Client's commands).


@_declare("launch", access="self", own=True, actor="user")
def launch(spec: dict[str, Any], queue: bool = True) -> JobView:
    """Start the job, or queue it when it does not fit now. The server checks the spec as a
    spec file is checked, and picks the id."""


@_declare("stop", guard=perm.STOP_JOB, actor="user")
def stop(ref: str, grace_s: float | None = None, yes: bool = False, wait: bool = True) -> JobView:
    """Stop the job (``wait``: answer when its processes and GPU claims are gone)."""


@_declare("retry", guard=perm.RETRY_JOB, actor="user")
def retry(ref: str, queue: bool = True) -> JobView:
    """Launch an ended job again as a new job (same spec and code, same owner)."""


@_declare("reprioritise", own=True, guard=perm.REPRIORITISE_JOB, actor="user")
def reprioritise(ref: str, priority: int) -> JobView:
    """Set the priority of a job that has not ended."""


@_declare("view", access="read")
def view(ref: str) -> JobView:
    """One job by id, unique id prefix or name."""


@_declare("list_jobs", access="read")
def list_jobs(refresh: bool = True) -> list[JobView]:
    """Every job of the history."""


@_declare("queue", access="read", service="queue_entries")
def queue() -> list[QueueEntry]:
    """The queued jobs, in the order they start."""


@_declare("metrics", access="read")
def metrics(ref: str) -> list[dict[str, Any]]:
    """The job's metrics records."""


@_declare("exposition", access="read")
def exposition() -> str:
    """What the controller knows now as Prometheus' text exposition (``rigdeck exporter``)."""


@_declare("logs", access="read", stream=True, own=True, service="log_chunks")
def log_chunks(ref: str, rank: int | None = None, follow: bool = False) -> dict[str, Any]:
    """The job's log output: items {host, rank, b64, partial}."""


@_declare("tensorboard_pull", access="read", stream=True)
def tensorboard_pull(ref: str, have: list[list[Any]] | None = None) -> dict[str, Any]:
    """The new bytes of the job's TensorBoard files on its hosts, against ``have`` (rows
    ``[host, dir, path, id, size, mtime_ns]``): a job item, then each host's listing and pieces
    (``tui.control.tensorboard``)."""


@_declare("gc", guard=perm.GC)
def collect_garbage(hosts: list[str] | None = None) -> dict[str, Any]:
    """Remove what ended jobs left on the hosts."""


@_declare("wait", access="read", stream=True)
def wait(ref: str, timeout: float | None = None) -> JobView:
    """The job's view each time its state or restart count changes, until it ends."""


# ---------------------------------------------------------------------------------------------
# Sweeps, the doctor, pipelines.


@_declare("sweep", access="self", own=True, actor="user")
def sweep(spec: dict[str, Any]) -> SweepDetail:
    """Start a sweep."""


@_declare("sweeps", access="read", service="sweep_rows")
def sweeps() -> list[SweepRow]:
    """Every sweep."""


@_declare("sweep_detail", access="read")
def sweep_detail(ref: str) -> SweepDetail:
    """One sweep by id, unique id prefix or name."""


@_declare("sweep_stop", guard=perm.STOP_SWEEP, actor="user")
def sweep_stop(ref: str) -> SweepDetail:
    """Stop a sweep: its running trials stop and no new one starts."""


@_declare("sweep_stop_trial", own=True, guard=perm.STOP_TRIAL, actor="user")
def sweep_stop_trial(ref: str, number: int) -> SweepDetail:
    """Stop one trial of a sweep."""


@_declare("sweep_wait", access="read", stream=True)
def sweep_wait(ref: str, timeout: float | None = None) -> SweepDetail:
    """The sweep's detail each time a trial changes state, until the sweep ends."""


@_declare("drains", access="read")
def drains() -> list[dict[str, Any]]:
    """The GPUs and hosts kept out of placement: who, when, why."""


@_declare("drain", guard=perm.DRAIN, actor="who")
def drain(targets: list[str], reason: str = "", now: bool = False, who: str = "") -> list[dict[str, Any]]:
    """Keep ``HOST`` or ``HOST:GPU`` out of placement (``now``: move the jobs running there too)."""


@_declare("undrain", guard=perm.UNDRAIN)
def undrain(targets: list[str]) -> list[dict[str, Any]]:
    """Put ``HOST`` or ``HOST:GPU`` back into placement; the drains removed."""


@_declare("doctor", guard=perm.DOCTOR)
def doctor(hosts: list[str] | None = None, checks: list[str] | None = None) -> DoctorReport:
    """Run the doctor's checks over ``hosts`` (default: every host)."""


@_declare("pipeline", access="self", own=True, actor="user")
def pipeline(spec: dict[str, Any]) -> PipelineDetail:
    """Start a pipeline."""


@_declare("pipelines", access="read", service="pipeline_rows")
def pipelines() -> list[PipelineRow]:
    """Every pipeline."""


@_declare("pipeline_detail", access="read")
def pipeline_detail(ref: str) -> PipelineDetail:
    """One pipeline by id, unique id prefix or name."""


@_declare("pipeline_stop", guard=perm.STOP_PIPELINE, actor="user")
def pipeline_stop(ref: str) -> PipelineDetail:
    """Stop a pipeline: its running steps stop and no new one starts."""


@_declare("pipeline_retry", own=True, guard=perm.RETRY_PIPELINE)
def pipeline_retry(ref: str, step: str) -> PipelineDetail:
    """Run a failed or stopped step again, then the steps skipped because of it."""


@_declare("pipeline_wait", access="read", stream=True)
def pipeline_wait(ref: str, timeout: float | None = None) -> PipelineDetail:
    """The pipeline's detail each time a step changes state, until it ends."""


@_declare("usage", access="read")
def usage(by: str = "user", since: float | None = None) -> UsageReport:
    """GPU hours, jobs, preemptions and goodput by ``by`` (user, group, job) after ``since``
    (epoch seconds; None: all), from the jobs' recorded GPU time."""


# ---------------------------------------------------------------------------------------------
# Code: a ``[code] sync`` snapshot sent to the server's store (tui.remote.codesync's upload).


@_declare("code_missing", access="read", client=False, service=None, own=True)
def code_missing(blobs: list[Any]) -> list[Any]:
    """Which of these contents ([sha256, size]) the server's store lacks."""


@_declare("code_put", access="self", client=False, service=None, own=True)
def code_put(blobs: list[Any]) -> dict[str, Any]:
    """Store these contents (code_put items, as an agent takes them)."""


@_declare("code_manifest", access="self", client=False, service=None, own=True)
def code_manifest(tree: str, files: list[Any]) -> dict[str, Any]:
    """Record a tree whose every content the server's store holds."""
