"""The one reader of a job's logs and metrics on its hosts, for the CLI and the app alike.

Ranks write their logs and metrics to files on their hosts; the agents hand them out by byte
offset (``job_logs``, ``job_metrics``), so a reader that keeps its offsets reads each byte once,
across reconnects and agent restarts. ``JobReader`` keeps them: per (host, rank) for logs, per
host and offset key for metrics. ``JobManager`` (``rigdeck logs``, ``rigdeck metrics``) makes one
per command; ``JobWatch`` (the app) keeps one per job and reads on from where it was each round.

Besides the offsets it owns:

- joining the pieces of a line longer than a chunk into one line (``LineJoiner``), whole for the
  CLI, kept to its first ``keep`` characters (and a count of the rest) for the app's log view;
- the metrics of an agent from before offset keys (``MetricsPart.offset_key`` None): its one
  offset per rank was into the rank's parsed output until the rank's metrics file appeared, and
  then the same offset went into the metrics file. The reader notices the switch (the rank's
  ``source`` going from ``stdout`` to ``metrics``), drops that answer and reads the metrics file
  from its start, instead of from an offset that belonged to another file;
- the parts of a sweep's metrics (``"0/defs"``, ``"R/hypertune"``): their records carry their
  rank; a record without one takes the rank its part's key begins with;
- after a restart, the newest attempt's record of each (rank, step) (``newest_attempts``, by
  the rule of tui.model.metrics);
- the last loss of a job from its hosts' statuses (``last_loss``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from tui.model.metrics import newest_attempts
from tui.model.termsafe import log_lines
from tui.remote.agentclient import AgentClient, JobState, LogChunk
from tui.remote.transport import TransportError

log = logging.getLogger(__name__)
METRICS_WORKERS = 16  # hosts asked at once for a job's metrics


class Agents(Protocol):
    """Where a reader gets a host's agent client (the controller)."""

    def agent(self, host: str) -> AgentClient: ...


def _number(v: Any, default: float) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else default


def part_rank(key: str) -> int | None:
    """The rank a ``job_metrics`` part is of, from its key: ``"3"``, or a rank and what the part
    holds (``"0/defs"``, ``"2/hypertune"``). None for a key that names no rank."""
    head = key.split("/", 1)[0]
    return int(head) if head.isdigit() else None


def log_ranks(status: Mapping[str, Any]) -> list[int]:
    """The ranks a host has logs of, from its ``job_status``: its ranks now, and every rank that
    wrote a log there (an earlier attempt's too)."""
    return sorted({r["rank"] for r in status.get("ranks") or []} | set(status.get("log_ranks") or []))


def last_loss(host_states: Mapping[str, Any]) -> tuple[Any, Any]:
    """(step, loss) of the newest step any rank reported a loss for, from the hosts' statuses
    (the hosts read each rank's last record from file tails: as cheap for a rank that printed a
    gigabyte as for one that printed a line); the lowest rank wins a tie. (None, None) if none."""
    steps = [m for st in host_states.values() if isinstance(st, dict)
             for m in (st.get("last_metrics") or {}).values() if m.get("loss") is not None]
    if not steps:
        return None, None
    last = max(steps, key=lambda m: (_number(m.get("step"), 0), -_number(m.get("rank"), 0)))
    return last.get("step"), last.get("loss")


def metrics_order(r: Mapping[str, Any]) -> tuple[float, float, float]:
    """Sort key of metrics records: (step, rank, time); a step that is not a number sorts first
    (ranks write these records, and not always as they should)."""
    return (_number(r.get("step"), -1), _number(r.get("rank"), 0), _number(r.get("time"), 0))


class LineJoiner:
    """Log chunks to lines, per (host, rank): a line that came in pieces (``partial`` chunks) is
    one line. ``keep``: a joined line is kept to its first ``keep`` characters, with a note of how
    many more it had (the app's log view); None keeps it whole (``rigdeck logs``)."""

    def __init__(self, keep: int | None = None):
        self.keep = keep
        self.pending: dict[Any, tuple[str, int]] = {}  # key -> (the line's start so far, chars cut)

    def _clip(self, text: str, cut: int) -> tuple[str, int]:
        if self.keep is not None and len(text) > self.keep:
            return text[: self.keep], cut + len(text) - self.keep
        return text, cut

    def feed(self, key: Any, text: str, partial: bool) -> list[str]:
        """The lines ``text`` completes (a CRLF's CR dropped, split at newlines only)."""
        start, cut = self.pending.pop(key, ("", 0))
        if partial:  # the complete lines before its last newline go now; the rest waits
            nl = text.rfind("\n")
            text, tail = text[: nl + 1], text[nl + 1 :]
            if not text:
                self.pending[key] = self._clip(start + tail, cut)
                return []
            self.pending[key] = self._clip(tail, 0)
        if not (start or cut):
            return log_lines(text)
        nl = text.find("\n")
        head, rest = (text, "") if nl < 0 else (text[:nl], text[nl + 1 :])
        line, cut = self._clip(start + head, cut)
        return log_lines(line + (f" [... {cut} more characters]" if cut else "") + "\n" + rest)

    def flush(self) -> list[tuple[Any, str]]:
        """(key, line) for every line still waiting for its end (the reading is over)."""
        return [(key, line) for key in list(self.pending) for line in self.feed(key, "", False)]


class JobReader:
    """A job's logs and metrics on its hosts, each byte read once: holds the offsets."""

    def __init__(self, agents: Agents, job_id: str, *, keep: int | None = None):
        self.agents = agents
        self.job_id = job_id
        self.log_offsets: dict[tuple[str, int], int] = {}
        self.joiner = LineJoiner(keep)
        self.metrics_offsets: dict[str, dict[str, int]] = {}  # host -> offset key -> byte offset
        self.sources: dict[tuple[str, str], str | None] = {}  # (host, part key) -> its source
        self.unreachable: dict[str, str] = {}  # host -> why its metrics were not read, last call

    # -- hosts -------------------------------------------------------------------------------

    def status(self, host: str, timeout: float = 20.0) -> JobState:
        """The job on ``host`` (its ``job_status``). Raises TransportError."""
        return self.agents.agent(host).job_status(job_id=self.job_id, timeout=timeout)

    # -- logs --------------------------------------------------------------------------------

    def log_chunks(self, host: str, rank: int, *, binary: bool = False, max_chunks: int | None = None,
                   timeout: float = 20.0) -> Iterator[LogChunk]:
        """The chunks of ``rank``'s log on ``host`` from where this reader was, until the agent
        has no more now (the last chunk's ``more`` is False) or after ``max_chunks``. Each chunk's
        offset is taken as read once it is yielded. Raises TransportError."""
        key = (host, rank)
        agent = self.agents.agent(host)
        n = 0
        while max_chunks is None or n < max_chunks:
            n += 1
            chunk = agent.job_logs(job_id=self.job_id, rank=rank, offset=self.log_offsets.get(key, 0),
                                   binary=binary, timeout=timeout)
            self.log_offsets[key] = chunk.next_offset
            yield chunk
            if not chunk.more:
                return

    def lines(self, host: str, rank: int, chunk: LogChunk) -> list[str]:
        """The lines ``chunk`` (of ``rank``'s log on ``host``) completes, pieces joined."""
        return self.joiner.feed((host, rank), chunk.text, chunk.partial)

    # -- metrics -----------------------------------------------------------------------------

    def metrics(self, hosts: Sequence[str], *, max_rounds: int | None = None,
                timeout: float = 20.0) -> list[dict[str, Any]]:
        """New metrics records of every rank on ``hosts`` since the last call, each with its
        ``rank`` and ``host``, in the order the hosts gave them. ``max_rounds``: requests per
        host (a huge backlog then comes over several calls). The hosts are asked at once, so an
        unreachable one costs its own timeout, not the others'; it is logged and left for the
        next call."""
        hosts = list(dict.fromkeys(hosts))
        self.unreachable = {}
        for host in hosts:  # made here, not on the workers
            self.metrics_offsets.setdefault(host, {})
        if len(hosts) <= 1:
            return [r for h in hosts for r in self._host_metrics(h, max_rounds, timeout)]
        with ThreadPoolExecutor(max_workers=min(METRICS_WORKERS, len(hosts)),
                                thread_name_prefix="metrics") as pool:
            parts = list(pool.map(lambda h: self._host_metrics(h, max_rounds, timeout), hosts))
        return [r for part in parts for r in part]

    def _host_metrics(self, host: str, max_rounds: int | None, timeout: float) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        offsets = self.metrics_offsets[host]
        rounds = 0
        while max_rounds is None or rounds < max_rounds:
            rounds += 1
            try:
                parts = self.agents.agent(host).job_metrics(job_id=self.job_id, offsets=dict(offsets),
                                                            timeout=timeout)
            except TransportError as e:
                log.info("metrics from %s: %s", host, e)
                self.unreachable[host] = e.detail
                break
            more = False
            for key, part in parts.items():
                before = self.sources.get((host, key))
                self.sources[(host, key)] = part.source
                if before == "stdout" and part.source == "metrics" and part.offset_key is None:
                    # An agent from before offset keys: its offset was into the rank's output
                    # until the metrics file appeared. Read the metrics file from its start.
                    offsets[key] = 0
                    more = True
                    continue
                for r in part.records:
                    if "rank" not in r:
                        r["rank"] = part_rank(key)
                    r["host"] = host
                    out.append(r)
                offsets[part.offset_key or key] = part.next_offset
                more = more or part.more
            if not more:
                break
        return out

    def all_metrics(self, hosts: Sequence[str], *, timeout: float = 20.0) -> list[dict[str, Any]]:
        """Every metrics record from where this reader was to the end of what ``hosts`` have (for
        a new reader: all of them), each (rank, step) once from its newest attempt
        (``newest_attempts``), in (step, rank) order."""
        out = newest_attempts(self.metrics(hosts, timeout=timeout))
        out.sort(key=metrics_order)
        return out
