"""What the faces show of a processing job (``kind = "processing"``, SageMaker Processing): each
input and how it reached the hosts (``ShardedByKey``: how many of the listing's files each host
got; ``FullyReplicated``: every host all of it), and where each host keeps the outputs.

Plain data built from the job's record: its spec's ``[processing]`` table, its placement (the
hosts, in node order: the shards' order) and the ``processing`` event the controller recorded at
the start (the listing's size, the host it was listed on, the files per host). No I/O. The rules
are in docs/contracts.md ("Processing jobs: what the faces show").
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tui.model.termsafe import terminal_safe

PROCESSING_EVENT = "processing"


@dataclass(frozen=True)
class InputRow:
    """One ``[[processing.inputs]]`` entry as it was given out. ``total``, ``listed_on`` and
    ``per_host`` are the start's (a sharded input's; empty before the job started)."""

    name: str
    source: str
    distribution: str
    total: int | None = None
    listed_on: str | None = None
    per_host: tuple[tuple[str, int], ...] = ()  # (host, files), in node order

    @property
    def text(self) -> str:
        """``ShardedByKey: 30 files over 3 hosts (h1 10, h2 10, h3 10), listed on h1``."""
        source = terminal_safe(self.source)
        if self.distribution != "ShardedByKey":
            return f"{self.distribution}: every host reads all of {source}"
        if self.total is None:
            return f"{self.distribution}: {source}, split by file when the job starts"
        shares = ", ".join(f"{terminal_safe(h)} {n}" for h, n in self.per_host)
        hosts = len(self.per_host)
        return (f"{self.distribution}: {self.total} file{'' if self.total == 1 else 's'} of {source} over "
                f"{hosts} host{'' if hosts == 1 else 's'} ({shares})"
                + (f", listed on {terminal_safe(self.listed_on)}" if self.listed_on else ""))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "distribution": self.distribution,
                "total": self.total, "listed_on": self.listed_on, "hosts": dict(self.per_host)}


@dataclass(frozen=True)
class ProcessingView:
    """A processing job's inputs, its outputs' names, its hosts (node order) and where each
    host keeps the job's files (``job_dirs``: host -> the job's directory there, where known)."""

    inputs: tuple[InputRow, ...]
    outputs: tuple[str, ...]
    hosts: tuple[str, ...]
    job_dirs: tuple[tuple[str, str], ...] = ()

    def output_text(self, name: str) -> str:
        """``counts: ~/.rigdeck/jobs/J/processing/output/counts on h1, h2, h3`` (one path when
        every host keeps its jobs in the same place, else each host's)."""
        where = f"processing/output/{name}"
        dirs = dict(self.job_dirs)
        known = {dirs[h] for h in self.hosts if h in dirs}
        if len(known) == 1 and all(h in dirs for h in self.hosts):
            return f"{name}: {next(iter(known))}/{where} on {', '.join(self.hosts) or 'no host yet'}"
        if dirs:
            return f"{name}: " + ", ".join(f"{h} {dirs[h]}/{where}" if h in dirs else f"{h} (its job directory)/{where}"
                                           for h in self.hosts)
        return f"{name}: {where} in the job's directory on {', '.join(self.hosts) or 'each host'}"

    def to_json(self) -> dict[str, Any]:
        dirs = dict(self.job_dirs)
        return {"inputs": [i.to_json() for i in self.inputs],
                "outputs": [{"name": o, "hosts": {h: (f"{dirs[h]}/processing/output/{o}" if h in dirs else None)
                                                  for h in self.hosts}} for o in self.outputs],
                "hosts": list(self.hosts)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> ProcessingView | None:
        """The inverse of ``to_json`` (a server's answer); None for a job that is not one."""
        if not d:
            return None
        inputs = tuple(InputRow(
            name=str(i.get("name")), source=str(i.get("source")), distribution=str(i.get("distribution")),
            total=i.get("total"), listed_on=i.get("listed_on"),
            per_host=tuple((str(h), int(n)) for h, n in (i.get("hosts") or {}).items()))
            for i in d.get("inputs") or () if isinstance(i, Mapping))
        outputs = [o for o in d.get("outputs") or () if isinstance(o, Mapping)]
        hosts = tuple(str(h) for h in d.get("hosts") or ())
        suffix = "/processing/output/"
        dirs: dict[str, str] = {}
        for o in outputs:
            for h, path in (o.get("hosts") or {}).items():
                tail = f"{suffix}{o.get('name')}"
                if isinstance(path, str) and path.endswith(tail):
                    dirs.setdefault(str(h), path[: -len(tail)])
        return cls(inputs=inputs, outputs=tuple(str(o.get("name")) for o in outputs), hosts=hosts,
                   job_dirs=tuple((h, dirs[h]) for h in hosts if h in dirs))


def job_dir(state_dir: str, job_id: str) -> str:
    """Where an agent keeps a job's files: ``STATE_DIR/jobs/JOB_ID`` (agent/jobs.py)."""
    return f"{state_dir.rstrip('/') or '/'}/jobs/{job_id}"


def resolved_source(spec: Mapping[str, Any], source: str) -> str:
    """An input's directory as the hosts read it: a relative ``source`` is the job's workdir's
    (as the controller resolves it for the plan); with ``[code] sync`` each host has its own copy
    of the workdir, so the source stays as the spec wrote it."""
    workdir = spec.get("workdir")
    if source.startswith("/") or spec.get("code") or not isinstance(workdir, str) or not workdir.startswith("/"):
        return source
    return posixpath.normpath(posixpath.join(workdir, source))


def processing_view(rec: Mapping[str, Any], state_dirs: Mapping[str, str] | None = None) -> ProcessingView | None:
    """The job ``rec`` (a history record, or a view with ``job_id``, ``spec``, ``placement``,
    ``events``) as a processing job; None for any other kind. ``state_dirs``: host -> the
    inventory's ``state_dir`` there, to say where the outputs are."""
    spec = rec.get("spec") or {}
    if spec.get("kind") != "processing":
        return None
    table = spec.get("processing") or {}
    hosts = tuple(dict.fromkeys(str(n.get("host")) for n in rec.get("placement") or ()
                                if isinstance(n, Mapping) and n.get("host")))
    started: Mapping[str, Any] = {}
    for e in rec.get("events") or ():  # the newest start's (a restart lists again)
        if isinstance(e, Mapping) and e.get("event") == PROCESSING_EVENT and isinstance(e.get("inputs"), Mapping):
            started = e["inputs"]
    inputs = []
    for i in table.get("inputs") or ():
        if not isinstance(i, Mapping):
            continue
        name = str(i.get("name"))
        entry = started.get(name)
        got: Mapping[str, Any] = entry if isinstance(entry, Mapping) else {}
        shares = got.get("hosts")
        per_host: Mapping[str, Any] = shares if isinstance(shares, Mapping) else {}
        order = [h for h in hosts if h in per_host] + [str(h) for h in per_host if h not in hosts]
        inputs.append(InputRow(
            name=name, source=resolved_source(spec, str(i.get("source"))),
            distribution=str(i.get("distribution") or "FullyReplicated"),
            total=int(got["total"]) if isinstance(got.get("total"), int) else None,
            listed_on=str(got["listed_on"]) if got.get("listed_on") else None,
            per_host=tuple((h, int(per_host[h])) for h in order)))
    outputs = tuple(str(o.get("name")) for o in table.get("outputs") or () if isinstance(o, Mapping))
    dirs = tuple((h, job_dir(state_dirs[h], str(rec.get("job_id")))) for h in hosts
                 if state_dirs and h in state_dirs)
    return ProcessingView(inputs=tuple(inputs), outputs=outputs, hosts=hosts, job_dirs=dirs)


def processing_json(view: ProcessingView | None) -> dict[str, Any] | None:
    """``--json``'s ``processing``: the view as an object, null for a job that is not one."""
    return view.to_json() if view is not None else None


def processing_lines(view: ProcessingView) -> list[str]:
    """The inputs and outputs as plain lines for ``rigdeck status`` (the Job view draws the same)."""
    lines = [f"input    {terminal_safe(i.name)}  {i.text}" for i in view.inputs]
    lines += [f"output   {terminal_safe(view.output_text(o))}" for o in view.outputs]
    return lines


def processing_summary(view: ProcessingView) -> str:
    """The Job view's first line: ``processing on 3 hosts · 2 inputs · 1 output``."""
    n_in, n_out = len(view.inputs), len(view.outputs)
    hosts = len(view.hosts)
    return (f"processing on {hosts} host{'' if hosts == 1 else 's'} · {n_in} input{'' if n_in == 1 else 's'}"
            f" · {n_out} output{'' if n_out == 1 else 's'}")
