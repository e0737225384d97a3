"""The typed agent client: one method per agent RPC (``agent/daemon.py``'s dispatch table).

The RPCs' wire names are written here and nowhere else on the workstation side: the controller,
the monitor and the job readers call ``AgentClient.job_status(job_id=...)``, never
``request(host, "job_status", ...)``. Each method takes keyword parameters named as the daemon
reads them, and turns the answer into a typed value: a dataclass where the controller reads
fields, a plain ``dict`` (said so in its docstring) where the payload is passed through as the
agent sent it.

Two ways to reach an agent:

- ``AgentClient``: one host. It sits on a ``call(method, timeout=..., **params)`` function, which
  is a bound ``AgentLink.request`` (``AgentClient.over(link)``) or the controller's per-host
  ``request`` (``HostLinks.agent(host)``, which connects, deploys and reconnects as needed).
- ``AgentFleet``: the same request to several hosts at once (``HostLinks.agents(hosts)``), each
  host's answer or the ``TransportError`` that kept it from answering.

Any object with the controller's ``request``/``request_many`` gains ``agent()`` and ``agents()``
by inheriting ``TypedAgents`` (the controller does; so do the tests' stand-ins for it).
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypedDict, TypeVar

from tui.remote.transport import TransportError

T = TypeVar("T")

#: The one function an ``AgentClient`` needs: ``call(method, timeout=..., **params)``; the
#: timeout is left out when the caller gave none (the transport's default then applies).
Call = Callable[..., Any]


# ---------------------------------------------------------------------------------------------
# What the agent answers


class JobRankState(TypedDict, total=False):
    """One rank in a ``job_status`` answer (the rank's start record plus its outcome)."""

    rank: int
    local_rank: int
    pid: int | None
    gpu: int | None
    state: str  # running | exited | failed | lost
    exit_code: int | None
    signal: int | None


class JobState(TypedDict, total=False):
    """A job on one host, as ``job_status`` (and each ``job_list`` entry) has it.

    A ``TypedDict``, not a dataclass: the gang rules read these keys, and the same mapping is
    passed through unchanged into ``JobView.hosts`` (``rigdeck status --json``) and the app's
    job state, so it stays the agent's own JSON object. Only the keys the controller reads are
    named; the agent may send more.
    """

    job_id: str
    state: str  # starting | running | stopping | succeeded | failed | stopped
    host: str
    restart_count: int
    started: float | None
    ended: float | None
    cause: dict[str, Any] | None
    jobhost_pid: int | None
    # job_status only:
    ranks: list[JobRankState]
    log_ranks: list[int]
    last_metrics: dict[str, dict[str, Any]]  # rank (as a string) -> its last metrics record
    tagged_processes: int | None  # processes still tagged with the job, once it ended; None before
    claims_held: list[int] | None  # GPUs still claimed here for the job, once it ended (None: ask again)
    gpu_health: list[dict[str, Any]]  # while it runs: the host's GPUs not ok ({index, health, reason, simulated})
    progress: dict[str, dict[str, Any]]  # while it runs: rank -> its newest step ({step, time, loss, attempt,
    #   and sections, ended: the runtime.section it is inside, the longest run of each it ended})
    hang: dict[str, Any] | None  # a hang the job host judged on its ranks (agent/hangrule.py), with their stacks
    links: list[dict[str, Any]]  # links to experiment trackers its ranks here printed ({kind, url, rank, time})
    # job_list only:
    name: str | None
    gpus: list[int]
    nodes: list[dict[str, Any]] | None
    launcher: str | None


def _finite_back(rec: Any) -> Any:
    """A metrics record with the values the agent had to send as text (NaN and infinity: JSON has
    neither; ``nonfinite`` names them) made floats again."""
    if isinstance(rec, dict) and "nonfinite" in rec:
        for k in rec.pop("nonfinite") or ():
            try:
                rec[k] = float(rec[k])
            except (TypeError, ValueError, KeyError):
                pass
    return rec


def _job_state(d: Any) -> JobState:
    """A ``job_status`` answer, its metrics records' NaN and infinity made floats again."""
    if isinstance(d, dict):
        for key in ("last_metrics", "progress"):
            for rec in (d.get(key) or {}).values():
                _finite_back(rec)
    return d  # type: ignore[no-any-return]


@dataclass(frozen=True)
class AgentVersion:
    """The running daemon (``version``): what its hello says."""

    agent_version: str | None
    hostname: str | None
    pid: int | None
    started: float | None
    python: str | None
    protocol: int | None

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> AgentVersion:
        return cls(d.get("agent_version"), d.get("hostname"), d.get("pid"), d.get("started"),
                   d.get("python"), d.get("protocol"))


@dataclass(frozen=True)
class HostFacts:
    """What the host is (``facts``). ``raw`` is the agent's whole answer."""

    hostname: str | None
    addresses: tuple[str, ...]
    python: str | None
    cpus: int | None
    memory_total_mb: int | None
    gpu_source: str | None
    gpus: tuple[dict[str, Any], ...]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> HostFacts:
        return cls(d.get("hostname"), tuple(str(a) for a in d.get("addresses") or ()), d.get("python"),
                   d.get("cpus"), d.get("memory_total_mb"), d.get("gpu_source"),
                   tuple(d.get("gpus") or ()), d)


@dataclass(frozen=True)
class JobStarted:
    """A start the host accepted (``job_start``): the job's directory and its job host."""

    job_dir: str | None
    jobhost_pid: int | None

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> JobStarted:
        return cls(d.get("job_dir"), d.get("jobhost_pid"))


@dataclass(frozen=True)
class JobStopped:
    """What a ``job_stop`` did: the job's state after it (``stopping`` while its job host runs
    the grace period) and how many stray processes of the job were swept, if it swept."""

    state: str | None
    swept: int | None = None

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> JobStopped:
        return cls(d.get("state"), d.get("swept"))


@dataclass(frozen=True)
class RankStack:
    """One process's stacks (faulthandler's text), where its main thread is, and whether it waits
    inside a collective call."""

    rank: int
    pid: int
    text: str
    top: str | None
    in_collective: bool


@dataclass(frozen=True)
class RankStacks:
    """What ``job_stacks`` took: each armed process's stacks, and how many were armed."""

    stacks: tuple[RankStack, ...]
    armed: int

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> RankStacks:
        return cls(tuple(RankStack(int(s["rank"]), int(s["pid"]), str(s.get("text") or ""), s.get("top"),
                                   bool(s.get("in_collective"))) for s in d.get("stacks") or ()),
                   int(d.get("armed") or 0))


@dataclass(frozen=True)
class JobCheck:
    """Whether a start could go ahead on the host (``job_check``); it changes nothing."""

    problems: tuple[str, ...]
    free_mb: float | None

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> JobCheck:
        return cls(tuple(str(p) for p in d.get("problems") or ()), d.get("free_mb"))


@dataclass(frozen=True)
class TextfileState:
    """What ``prometheus_textfile`` left the host's agent doing: the file it writes (``~``
    expanded on the host; None: none), and why its first write failed, when it did."""

    path: str | None
    error: str | None

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> TextfileState:
        return cls(d.get("path"), d.get("error"))


@dataclass(frozen=True)
class LogChunk:
    """A piece of a rank's log (``job_logs``), read from byte ``offset`` to ``next_offset``.

    ``text`` holds it as text (invalid UTF-8 replaced); with ``binary`` it is ``data`` instead,
    the bytes as the rank wrote them, and ``text`` is empty. ``partial``: it ends inside a line
    (the rest follows, or the rank ended without a newline). ``more``: more is waiting now.
    """

    rank: int
    offset: int
    next_offset: int
    more: bool
    partial: bool
    text: str = ""
    data: bytes = b""

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> LogChunk:
        data = base64.b64decode(d["b64"]) if "b64" in d else b""
        return cls(int(d.get("rank", -1)), int(d.get("offset", 0)), d["next_offset"], bool(d["more"]),
                   bool(d.get("partial")), d.get("text") or "", data)


@dataclass(frozen=True)
class MetricsPart:
    """One rank's new metrics records (``job_metrics``), from its metrics file (``source``
    ``metrics``) or from the losses its wrapper parsed out of its output (``stdout``); or a sweep's
    metrics: what rank 0's wrapper found with the metric definitions (``metric_definitions``, part
    ``"0/defs"``) and what cloudml-hypertune reported on a host (``hypertune``, part
    ``"R/hypertune"``, R the host's first rank; its offset is a timestamp in microseconds).

    ``offset_key`` names the offset ``next_offset`` advances (``"R"`` or ``"R/stdout"`` for a
    rank's part, the part's own key for the others); an agent
    from before offset keys sends none (``None``): its one offset per rank moved from the output
    to the metrics file when that file appeared. ``records`` are the rank's JSON objects as it
    wrote them (plus ``restart``, the attempt that wrote each), passed through as dicts.
    """

    records: list[dict[str, Any]]
    next_offset: int
    more: bool
    source: str | None = None
    offset_key: str | None = None

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> MetricsPart:
        return cls([_finite_back(r) for r in d["records"]], d["next_offset"], bool(d["more"]), d.get("source"),
                   d.get("offset_key"))


UpgradeWhen = Literal["now", "when-idle"]


def _dict(d: Any) -> dict[str, Any]:
    return d if isinstance(d, dict) else {}


def _metrics(d: Any) -> dict[str, MetricsPart]:
    return {str(rank): MetricsPart.from_wire(part) for rank, part in _dict(d).items()}


def _job_states(d: Any) -> list[JobState]:
    return list(d) if isinstance(d, list) else []


def _kw(timeout: float | None) -> dict[str, float]:
    return {} if timeout is None else {"timeout": timeout}


def _sample_params(fresh: bool, slurm: bool) -> dict[str, bool]:
    return {**({"fresh": True} if fresh else {}), **({} if slurm else {"slurm": False})}


# ---------------------------------------------------------------------------------------------
# One host


class AgentClient:
    """The agent on one host: one method per RPC. A failed request raises ``TransportError``
    (``AgentError``, a subclass, when the agent answered with an error). ``timeout`` is the
    seconds to wait for the answer; ``None`` leaves the transport's default (30 s)."""

    def __init__(self, host: str, call: Call):
        self.host = host
        self._call = call

    @classmethod
    def over(cls, link: Any) -> AgentClient:
        """A client on one open ``AgentLink`` (the monitor's stream, a probe's short session)."""
        return cls(link.host, link.request)

    def __repr__(self) -> str:
        return f"AgentClient({self.host!r})"

    # -- the daemon ----------------------------------------------------------------------------

    def ping(self, *, timeout: float | None = None) -> float:
        """The agent's clock (``time.time()`` there)."""
        return float(_dict(self._call("ping", **_kw(timeout))).get("time") or 0.0)

    def version(self, *, timeout: float | None = None) -> AgentVersion:
        """The running daemon: its version, hostname, pid and start time."""
        return AgentVersion.from_wire(_dict(self._call("version", **_kw(timeout))))

    def facts(self, *, timeout: float | None = None) -> HostFacts:
        """The host's facts (addresses, Python, CPUs, memory, GPUs, what is deployed)."""
        return HostFacts.from_wire(_dict(self._call("facts", **_kw(timeout))))

    def sample(self, *, fresh: bool = False, slurm: bool = True, timeout: float | None = None) -> dict[str, Any]:
        """The latest telemetry sample (GPUs with their claims, host CPU and memory). A plain
        dict: passed through unchanged to ``ClusterState.apply_sample`` and ``HostReport.sample``.
        ``fresh``: one taken after this request, never the stream's last; ``slurm`` false: on a
        Slurm node, Slurm is not asked for its claims now (its last answer stands)."""
        return _dict(self._call("sample", **_kw(timeout), **_sample_params(fresh, slurm)))

    def subscribe(self, *, rate_hz: float | None = None, timeout: float | None = None) -> float:
        """Stream ``telemetry`` events on this connection (at ``rate_hz``, 1/60..10, when given);
        returns the daemon's rate now. The events go to the link's ``on_event``."""
        params = {} if rate_hz is None else {"rate_hz": rate_hz}
        return float(_dict(self._call("subscribe", **_kw(timeout), **params)).get("rate_hz") or 0.0)

    def unsubscribe(self, *, timeout: float | None = None) -> None:
        """Stop this connection's telemetry events."""
        self._call("unsubscribe", **_kw(timeout))

    def set_rate(self, *, rate_hz: float, timeout: float | None = None) -> float:
        """Change the daemon's sampling rate (for every subscriber); returns it."""
        return float(_dict(self._call("set_rate", **_kw(timeout), rate_hz=rate_hz)).get("rate_hz") or 0.0)

    def upgrade(self, *, path: str, timeout: float | None = None) -> UpgradeWhen | None:
        """Hand over to the agent.pyz at ``path`` on the host: ``"now"`` when the daemon is idle
        (it restarts as the new version), ``"when-idle"`` once its jobs have ended."""
        when = _dict(self._call("upgrade", **_kw(timeout), path=path)).get("scheduled")
        return when if when in ("now", "when-idle") else None

    def shutdown(self, *, force: bool = False, timeout: float | None = None) -> bool:
        """Stop the daemon (refused while jobs run, unless ``force``); True when it is stopping."""
        return bool(_dict(self._call("shutdown", **_kw(timeout), force=force)).get("stopping"))

    # -- jobs --------------------------------------------------------------------------------

    def job_start(self, *, plan: dict[str, Any], timeout: float | None = None) -> JobStarted:
        """Start this host's part of a job from its plan (the controller's ``_plans``)."""
        return JobStarted.from_wire(_dict(self._call("job_start", **_kw(timeout), plan=plan)))

    def job_stop(self, *, job_id: str, grace_s: float | None = None, keep_standbys: bool = False,
                 timeout: float | None = None) -> JobStopped:
        """Stop the job here: SIGTERM to its ranks, SIGKILL after ``grace_s`` (the plan's when None).
        ``keep_standbys``: its warm standbys wait on for the restart that follows (agent/standby.py);
        otherwise they end too."""
        params: dict[str, Any] = {"job_id": job_id}
        if grace_s is not None:
            params["grace_s"] = grace_s
        if keep_standbys:
            params["keep_standbys"] = True
        return JobStopped.from_wire(_dict(self._call("job_stop", **_kw(timeout), **params)))

    def job_list(self, *, timeout: float | None = None) -> list[JobState]:
        """Every job this host knows, with its name, GPUs and plan nodes (passed through as the
        agent's dicts; see ``JobState``)."""
        return _job_states(self._call("job_list", **_kw(timeout)))

    def job_status(self, *, job_id: str, fresh_health: bool = False, timeout: float | None = None) -> JobState:
        """The job here: state, cause, ranks, ranks with logs, each rank's last metrics record
        (see ``JobState``: the agent's dict, passed through); ``fresh_health``: its
        ``gpu_health`` from a sample taken now."""
        extra: dict[str, Any] = {"fresh_health": True} if fresh_health else {}
        return _job_state(self._call("job_status", **_kw(timeout), job_id=job_id, **extra))

    def exec(self, *, argv: list[str], timeout_s: float, timeout: float | None = None) -> dict[str, Any]:
        """Run ``argv`` on the host with no shell: its exit code, signal, stdout and stderr (see
        ``exec`` in docs/contracts.md)."""
        return _dict(self._call("exec", **_kw(timeout), argv=argv, timeout_s=timeout_s))

    def code_have(self, *, tree: str, blobs: list[Any], timeout: float | None = None) -> dict[str, Any]:
        """Synced code: ``{path, missing}``: the tree's path when the host has it, else which
        of ``blobs`` (content hashes) it lacks (see "Synced code on a host" in docs/contracts.md)."""
        return _dict(self._call("code_have", **_kw(timeout), tree=tree, blobs=blobs))

    def code_put(self, *, blobs: list[list[Any]], timeout: float | None = None) -> dict[str, Any]:
        """Store contents ``[[sha256, "raw"|"zlib", base64, offset, last], ...]``, each checked
        against its hash: ``{stored, bytes}``. Code sync pipelines these on a link of its own."""
        return _dict(self._call("code_put", **_kw(timeout), blobs=blobs))

    def code_unpack(self, *, pack: str, timeout: float | None = None) -> dict[str, Any]:
        """Take in the pack ``pack`` (a name in the ``incoming`` dir ``code_have`` gave, written
        there over SFTP), each content checked against its hash; the pack is removed:
        ``{stored, bytes}``."""
        return _dict(self._call("code_unpack", **_kw(timeout), pack=pack))

    def code_commit(self, *, tree: str, files: list[list[Any]], timeout: float | None = None) -> dict[str, Any]:
        """Make ``tree`` from its manifest ``[[path, sha256, size, executable], ...]`` out of
        stored contents: ``{path, made}``."""
        return _dict(self._call("code_commit", **_kw(timeout), tree=tree, files=files))

    def image_have(self, *, image: str, id: str, timeout: float | None = None) -> dict[str, Any]:
        """Whether a job on the host would run ``image`` with this id: ``{have, id, runtimes}``
        (``id``: the one the host has under that name, or null)."""
        return _dict(self._call("image_have", **_kw(timeout), image=image, id=id))

    def image_load(self, *, path: str, image: str, id: str, timeout: float | None = None) -> dict[str, Any]:
        """Load the image directory ``path`` (a tree ``code_commit`` made) into the host's own
        image store as ``image``, checked to be ``id``: ``{image, id}``."""
        return _dict(self._call("image_load", **_kw(timeout), path=path, image=image, id=id))

    def code_get(self, *, sha: str, offset: int, size: int, timeout: float | None = None) -> dict[str, Any]:
        """A piece of a stored content (at most 512 KiB of it): ``{data: base64, size: the
        whole content's size, eof}`` (artifacts move host -> controller -> host this way)."""
        return _dict(self._call("code_get", **_kw(timeout), sha=sha, offset=offset, size=size))

    def artifact_pack(self, *, job_id: str, kind: str, timeout: float | None = None) -> dict[str, Any]:
        """Pack ``kind`` (``output``, ``model`` or ``checkpoints``) of a job that has ended here
        as a tree of the host's code store: ``{tree, files: [[path, sha256, size, executable]],
        bytes, path}`` (see "Artifacts on a host" in docs/contracts.md)."""
        return _dict(self._call("artifact_pack", **_kw(timeout), job_id=job_id, kind=kind))

    def job_logs(self, *, job_id: str, rank: int, offset: int = 0, max_bytes: int | None = None,
                 binary: bool = False, timeout: float | None = None) -> LogChunk:
        """A chunk of ``rank``'s log from byte ``offset``: complete lines, or a piece of a line
        longer than a chunk (``partial``). ``binary``: the bytes as written (``LogChunk.data``)."""
        params: dict[str, Any] = {"job_id": job_id, "rank": rank, "offset": offset}
        if max_bytes is not None:
            params["max_bytes"] = max_bytes
        if binary:
            params["binary"] = True
        return LogChunk.from_wire(_dict(self._call("job_logs", **_kw(timeout), **params)))

    def job_metrics(self, *, job_id: str, offsets: dict[str, int],
                    timeout: float | None = None) -> dict[str, MetricsPart]:
        """New metrics records of every rank here, from ``offsets`` (offset key -> offset; see
        ``MetricsPart``): part key (a rank as a string, ``"0/defs"``, ``"R/hypertune"``) -> part."""
        return _metrics(self._call("job_metrics", **_kw(timeout), job_id=job_id, offsets=offsets))

    def job_tensorboard_files(self, *, job_id: str, timeout: float | None = None) -> dict[str, Any]:
        """The job's TensorBoard directories here (each node's ``AIP_TENSORBOARD_LOG_DIR``) and
        the files TensorBoard reads in them: ``{dirs: [{dir, files: [[path, size, mtime_ns, id]],
        truncated}], problems: [text]}`` (see "TensorBoard files on a host" in docs/contracts.md)."""
        return _dict(self._call("job_tensorboard_files", **_kw(timeout), job_id=job_id))

    def job_tensorboard_read(self, *, job_id: str, dir: str, path: str, offset: int,
                             max_bytes: int | None = None, timeout: float | None = None) -> dict[str, Any]:
        """A piece (at most 512 KiB) of the file ``path`` under the job's TensorBoard directory
        ``dir`` from byte ``offset``: ``{b64, offset, size, mtime_ns, id, eof}``, the file as it
        is now (an ``offset`` past its end reads nothing)."""
        params: dict[str, Any] = {"job_id": job_id, "dir": dir, "path": path, "offset": offset}
        if max_bytes is not None:
            params["max_bytes"] = max_bytes
        return _dict(self._call("job_tensorboard_read", **_kw(timeout), **params))

    def job_claim(self, *, job_id: str, gpus: Sequence[int], timeout: float | None = None) -> list[int]:
        """Claim ``gpus`` here for a start that follows (all or none; lapses if none comes).
        Returns the GPUs claimed; a GPU held by another job is an ``AgentError``."""
        got = _dict(self._call("job_claim", **_kw(timeout), job_id=job_id, gpus=list(gpus)))
        return [int(g) for g in got.get("claimed") or ()]

    def slurm_submit(self, *, job_id: str, options: Sequence[str], template: str | None = None,
                     agent: Sequence[str] | None = None, timeout: float | None = None) -> dict[str, Any]:
        """Submit ``job_id`` to Slurm from this (the login) host: ``sbatch`` with ``options``
        (``--name=value`` each) and rigdeck's batch script, whose step starts this agent's job
        host for it on every node. ``agent``: where every node that kept ``template`` said its
        agent's unpacked copy is (the step starts from it where the login host's is the same).
        ``slurm_job_id`` (None when Slurm refused), ``exit_code``, ``stdout``, ``stderr``
        (Slurm's own words), ``argv``."""
        extra: dict[str, Any] = {"template": template} if template else {}
        if template and agent:
            extra["agent"] = list(agent)
        return _dict(self._call("slurm_submit", **_kw(timeout), job_id=job_id, options=list(options), **extra))

    def slurm_template(self, *, key: str, template: Mapping[str, Any],
                       timeout: float | None = None) -> dict[str, Any]:
        """Keep a job's plan template, named ``key``, here (agent/slurmstep.py): if Slurm gives
        this node the job, it makes its plan of it, with nobody watching. Its ``path``."""
        return _dict(self._call("slurm_template", **_kw(timeout), key=key, template=dict(template)))

    def job_release(self, *, job_id: str, timeout: float | None = None) -> bool:
        """Give back a claim made for a start that will not come; True when there was one."""
        return bool(_dict(self._call("job_release", **_kw(timeout), job_id=job_id)).get("released"))

    def job_check(self, *, job_id: str, gpus: Sequence[int], min_free_mb: float = 0.0,
                  container: Mapping[str, Any] | None = None, timeout: float | None = None) -> JobCheck:
        """Whether a start could go ahead here (free space, the GPUs unclaimed, a ``[container]``
        job's runtime and image present), changing nothing."""
        extra = {"container": dict(container)} if container else {}
        return JobCheck.from_wire(_dict(self._call("job_check", **_kw(timeout), job_id=job_id,
                                                   gpus=list(gpus), min_free_mb=min_free_mb, **extra)))

    def job_gc(self, *, max_age_s: float | None = None, max_jobs: int | None = None,
               timeout: float | None = None) -> dict[str, Any]:
        """Remove ended jobs' directories past retention. A plain dict (``removed``, ``kept``,
        ``running``): passed through unchanged to ``rigdeck gc``'s output."""
        return _dict(self._call("job_gc", **_kw(timeout), max_age_s=max_age_s, max_jobs=max_jobs))

    def job_stacks(self, *, job_id: str, why: str = "", timeout_s: float = 3.0,
                   timeout: float | None = None) -> RankStacks:
        """The Python stacks of the job's live ranks on the host, taken without stopping them; each
        is also appended to its rank's log, headed with ``why``."""
        return RankStacks.from_wire(_dict(self._call(
            "job_stacks", **_kw(timeout if timeout is not None else timeout_s + 10.0), job_id=job_id, why=why,
            timeout_s=timeout_s)))

    # -- GPU health --------------------------------------------------------------------------

    def gpu_health_clear(self, *, gpus: list[int] | None = None, timeout: float | None = None) -> list[int]:
        """Forget the faults the host remembers for these GPUs (all when None), as an undrain
        does; the GPUs that had one."""
        params: dict[str, Any] = {} if gpus is None else {"gpus": list(gpus)}
        return [int(g) for g in _dict(self._call("gpu_health_clear", **_kw(timeout), **params)).get("cleared") or []]

    # -- node_exporter's textfile ------------------------------------------------------------

    def prometheus_textfile(self, *, path: str | None, host: str, timeout: float | None = None) -> TextfileState:
        """Have the agent write the host's GPU series to ``path`` on the host for node_exporter's
        textfile collector, labelled ``host`` (the inventory's name), and keep doing so with no
        controller connected; None stops it and removes the file. Answers after a first write."""
        return TextfileState.from_wire(_dict(self._call("prometheus_textfile", **_kw(timeout), path=path,
                                                        host=host)))

    # -- the network -------------------------------------------------------------------------

    def probe_port(self, *, addr: str, timeout: float | None = None) -> int:
        """A TCP port free on the host's address ``addr`` (the job's MASTER_PORT)."""
        return int(_dict(self._call("probe_port", **_kw(timeout), addr=addr))["port"])

    def route_source(self, *, peer: str, timeout: float | None = None) -> str | None:
        """The address the host's route to ``peer`` leaves from, or None."""
        got = _dict(self._call("route_source", **_kw(timeout), peer=peer)).get("address")
        return str(got) if got else None


# ---------------------------------------------------------------------------------------------
# Many hosts at once


class AgentFleet:
    """The same request to several hosts in parallel (``HostLinks.request_many``): each method
    returns host -> its answer (typed as ``AgentClient``'s), or the ``TransportError`` that kept
    that host from answering. One slow host holds up the others only to its own timeout."""

    def __init__(self, hosts: Sequence[str], call_many: Call):
        self.hosts = list(hosts)
        self._call_many = call_many

    def __repr__(self) -> str:
        return f"AgentFleet({self.hosts!r})"

    def _each(self, convert: Callable[[Any], T], method: str, timeout: float | None,
              **params: Any) -> dict[str, T | TransportError]:
        if not self.hosts:
            return {}
        got = self._call_many(method, **_kw(timeout), **params)
        return {h: r if isinstance(r, TransportError) else convert(r) for h, r in got.items()}

    def exec(self, *, argv: list[str], timeout_s: float,
             timeout: float | None = None) -> dict[str, dict[str, Any] | TransportError]:
        """``argv`` run on every host at once, with no shell (``AgentClient.exec``)."""
        return self._each(_dict, "exec", timeout, argv=argv, timeout_s=timeout_s)

    def ping(self, *, timeout: float | None = None) -> dict[str, float | TransportError]:
        """Each agent's clock."""
        return self._each(lambda d: float(_dict(d).get("time") or 0.0), "ping", timeout)

    def version(self, *, timeout: float | None = None) -> dict[str, AgentVersion | TransportError]:
        """Each running daemon."""
        return self._each(lambda d: AgentVersion.from_wire(_dict(d)), "version", timeout)

    def facts(self, *, timeout: float | None = None) -> dict[str, HostFacts | TransportError]:
        """Each host's facts."""
        return self._each(lambda d: HostFacts.from_wire(_dict(d)), "facts", timeout)

    def sample(self, *, fresh: bool = False, slurm: bool = True,
               timeout: float | None = None) -> dict[str, dict[str, Any] | TransportError]:
        """Each host's latest telemetry sample (plain dicts, passed through to ``ClusterState``);
        ``fresh``, ``slurm``: as ``AgentClient.sample``'s."""
        return self._each(_dict, "sample", timeout, **_sample_params(fresh, slurm))

    def job_list(self, *, timeout: float | None = None) -> dict[str, list[JobState] | TransportError]:
        """Each host's jobs."""
        return self._each(_job_states, "job_list", timeout)

    def artifact_pack(self, *, job_id: str, kind: str,
                      timeout: float | None = None) -> dict[str, dict[str, Any] | TransportError]:
        """``kind`` of the ended job packed on every host at once (``AgentClient.artifact_pack``):
        the answers are what ``tui.model.artifacts.merge`` takes."""
        return self._each(_dict, "artifact_pack", timeout, job_id=job_id, kind=kind)

    def job_status(self, *, job_id: str, fresh_health: bool = False,
                   timeout: float | None = None) -> dict[str, JobState | TransportError]:
        """The job on each host (the agents' dicts, passed through: see ``JobState``);
        ``fresh_health``: its ``gpu_health`` from a sample taken now."""
        params: dict[str, Any] = {"job_id": job_id}
        if fresh_health:
            params["fresh_health"] = True
        return self._each(_job_state, "job_status", timeout, **params)

    def job_stop(self, *, job_id: str, grace_s: float | None = None, keep_standbys: bool = False,
                 timeout: float | None = None) -> dict[str, JobStopped | TransportError]:
        """Stop the job on every host (``keep_standbys``: as ``AgentClient.job_stop``)."""
        params: dict[str, Any] = {"job_id": job_id}
        if grace_s is not None:
            params["grace_s"] = grace_s
        if keep_standbys:
            params["keep_standbys"] = True
        return self._each(lambda d: JobStopped.from_wire(_dict(d)), "job_stop", timeout, **params)

    def slurm_template(self, *, key: str, template: Mapping[str, Any],
                       timeout: float | None = None) -> dict[str, dict[str, Any] | TransportError]:
        """Keep a job's plan template, named ``key``, on every host (agent/slurmstep.py): whichever
        nodes Slurm gives it make their plans of it, with nobody watching."""
        return self._each(_dict, "slurm_template", timeout, key=key, template=dict(template))

    def job_release(self, *, job_id: str, timeout: float | None = None) -> dict[str, bool | TransportError]:
        """Give back the job's claims on every host."""
        return self._each(lambda d: bool(_dict(d).get("released")), "job_release", timeout, job_id=job_id)

    def job_gc(self, *, max_age_s: float | None = None, max_jobs: int | None = None,
               timeout: float | None = None) -> dict[str, dict[str, Any] | TransportError]:
        """Retention on every host (plain dicts, passed through to ``rigdeck gc``)."""
        return self._each(_dict, "job_gc", timeout, max_age_s=max_age_s, max_jobs=max_jobs)

    def job_stacks(self, *, job_id: str, why: str = "", timeout_s: float = 3.0,
                   timeout: float | None = None) -> dict[str, RankStacks | TransportError]:
        """The Python stacks of the job's live ranks on every host, taken at once."""
        return self._each(lambda d: RankStacks.from_wire(_dict(d)), "job_stacks",
                          timeout if timeout is not None else timeout_s + 10.0, job_id=job_id, why=why,
                          timeout_s=timeout_s)


# ---------------------------------------------------------------------------------------------
# Where the controller gets them


class Requests(Protocol):
    """The untyped path a typed client rides on (the controller's): a method name and params."""

    def request(self, host: str, method: str, timeout: float = ..., **params: Any) -> Any: ...

    def request_many(self, hosts: Sequence[str], method: str, timeout: float = ...,
                     **params: Any) -> dict[str, Any]: ...


class TypedAgents:
    """``agent(host)`` and ``agents(hosts)`` for anything with ``request``/``request_many``."""

    def agent(self: Requests, host: str) -> AgentClient:
        """The typed client of ``host``'s agent (connecting and deploying when first used)."""
        return AgentClient(host, functools.partial(self.request, host))

    def agents(self: Requests, hosts: Iterable[str]) -> AgentFleet:
        """Typed requests to several hosts' agents at once."""
        hosts = list(hosts)
        return AgentFleet(hosts, functools.partial(self.request_many, hosts))
