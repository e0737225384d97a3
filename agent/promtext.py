"""Prometheus' text exposition format (version 0.0.4), and the metric families of one GPU.

Two writers share this: the controller's ``/metrics`` (``tui/model/promexport.py``, which declares
the families of hosts, jobs and the queue and lists every family in its ``FAMILIES``) and the
agent's textfile for node_exporter on each host (``agent/textfile.py``). What a GPU's series are
called, their type, unit, labels and meaning, how each figure of a telemetry sample becomes one
(``GPU_FIGURES``), and whose job and rank a GPU is labelled with (``gpu_owner``) are written here
once, so both say the same.

``Exposition`` writes the text: ``# HELP`` and ``# TYPE`` once per family, every series of a
family with the same label names (an unknown value is ``""``), label values escaped, no series
twice, an unknown figure no series at all (never a 0).

Stdlib only, Python 3.9, and no I/O: the controller's model (``tui.model``) imports it.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from agent.gpuhealth import HEALTH_STATES, OK

MIB = 1024 * 1024  # the agent's ``_mb`` figures are MiB (agent/telemetry.py)
TYPES = ("gauge", "counter")
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


@dataclass(frozen=True)
class Family:
    """One metric family: what ``# HELP`` and ``# TYPE`` say, and its label names (every series
    of it has exactly these). ``unit``: the base unit, for the docs ("" for a plain number)."""

    name: str
    type: str
    unit: str
    labels: Tuple[str, ...]
    help: str

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError("%r: not a metric name" % self.name)
        if self.type not in TYPES:
            raise ValueError("%s: type %r, expected one of %s" % (self.name, self.type, ", ".join(TYPES)))
        if (self.type == "counter") != self.name.endswith("_total"):
            raise ValueError("%s: a counter's name ends in _total, and only a counter's" % self.name)
        bad = [n for n in self.labels if not _LABEL.fullmatch(n) or n.startswith("__")]
        if bad or len(set(self.labels)) != len(self.labels):
            raise ValueError("%s: label names %r" % (self.name, self.labels))


# ---------------------------------------------------------------------------------------------
# A GPU's families

# host: the inventory's name (the controller tells the agent); gpu: the index on its host.
GPU = ("host", "gpu", "uuid", "job_id", "rank", "user", "simulated")

GPU_FAMILIES = (
    Family("rigdeck_gpu_info", "gauge", "", GPU + ("model",), "1 for every GPU, its model in the labels."),
    Family("rigdeck_gpu_utilization_ratio", "gauge", "ratio", GPU,
           "Share of the last sample interval the GPU was running kernels (0 to 1)."),
    Family("rigdeck_gpu_memory_used_bytes", "gauge", "bytes", GPU, "GPU memory in use."),
    Family("rigdeck_gpu_memory_total_bytes", "gauge", "bytes", GPU, "GPU memory in all."),
    Family("rigdeck_gpu_temperature_celsius", "gauge", "celsius", GPU, "GPU temperature."),
    Family("rigdeck_gpu_power_watts", "gauge", "watts", GPU, "GPU power draw."),
    Family("rigdeck_gpu_power_limit_watts", "gauge", "watts", GPU, "GPU enforced power limit."),
    Family("rigdeck_gpu_sm_clock_hertz", "gauge", "hertz", GPU, "GPU SM clock."),
    Family("rigdeck_gpu_ecc_uncorrected_errors_total", "counter", "errors", GPU,
           "Uncorrected ECC errors since the driver loaded (NVML's volatile count; absent without ECC)."),
    Family("rigdeck_gpu_health", "gauge", "", GPU + ("health",),
           "The GPU's health as a state set: 1 for its state (ok, warn, unhealthy, drained), 0 for the others."),
    Family("rigdeck_gpu_health_reason", "gauge", "", GPU + ("reason",),
           "1 with why the GPU is not ok (the agent's judgement or the drain), only while it has a reason."),
)  # type: Tuple[Family, ...]


def scaled(v: Optional[float], factor: float) -> Optional[float]:
    """A figure in the family's base unit (MiB as bytes, MHz as hertz); None stays None."""
    return None if v is None else v * factor


def ratio(pct: Optional[float]) -> Optional[float]:
    """A percentage as a ratio (divided, not multiplied by 0.01: 17.1 reads 0.171, not 0.17100000000000001)."""
    return None if pct is None else pct / 100


def bool_label(v: bool) -> str:
    return "true" if v else "false"


# Each measured figure of a GPU: (its family, its key in a telemetry sample's GPU, the conversion
# to the family's base unit). A GpuView (tui/model/hostviews.py) has the same names as attributes.
GPU_FIGURES = (
    ("rigdeck_gpu_utilization_ratio", "utilization_pct", ratio),
    ("rigdeck_gpu_memory_used_bytes", "memory_used_mb", lambda v: scaled(v, MIB)),
    ("rigdeck_gpu_memory_total_bytes", "memory_total_mb", lambda v: scaled(v, MIB)),
    ("rigdeck_gpu_temperature_celsius", "temperature_c", lambda v: v),
    ("rigdeck_gpu_power_watts", "power_w", lambda v: v),
    ("rigdeck_gpu_power_limit_watts", "power_limit_w", lambda v: v),
    ("rigdeck_gpu_sm_clock_hertz", "sm_clock_mhz", lambda v: scaled(v, 1_000_000)),
    ("rigdeck_gpu_ecc_uncorrected_errors_total", "ecc_volatile_errors", lambda v: v),
)  # type: Tuple[Tuple[str, str, Callable[[Any], Optional[float]]], ...]


def gpu_owner(processes: Iterable[Tuple[Optional[str], Optional[int], Optional[str]]],
              claim: Optional[Tuple[Optional[str], Optional[str]]]) -> Tuple[str, str, str]:
    """(job_id, rank, user) of whoever holds a GPU, from its processes' ``(job_id, rank, user)``
    and its claim's ``(job_id, user)`` (None: no claim): its first process that is a job's rank,
    else its claim (a job's, between ranks), else its first process's user (someone outside
    rigdeck); "" for what is not known."""
    procs = list(processes)
    for job_id, rank, user in procs:
        if job_id:
            return job_id, "" if rank is None else str(rank), user or (claim[1] if claim else None) or ""
    if claim is not None and (claim[0] or claim[1]):
        return claim[0] or "", "", claim[1] or ""
    return "", "", next((user for _, _, user in procs if user), None) or ""


def gpu_labels(host: str, index: Any, uuid: Any, owner: Tuple[str, str, str], simulated: bool) -> Dict[str, Any]:
    job_id, rank, user = owner
    return {"host": host, "gpu": index, "uuid": uuid, "job_id": job_id, "rank": rank, "user": user,
            "simulated": bool_label(simulated)}


def add_gpu(e: Exposition, labels: Mapping[str, Any], model: Any, health: str, reason: Optional[str],
            figure: Optional[Callable[[str], Any]]) -> None:
    """One GPU's series: its info and health always; its measurements from ``figure(key)`` (a
    sample's ``get``, or a view's attributes) unless ``figure`` is None (its host is stale or
    down: the last figures are not now's)."""
    e.add("rigdeck_gpu_info", dict(labels, model=model), 1)
    for state in HEALTH_STATES:
        e.add("rigdeck_gpu_health", dict(labels, health=state), 1 if health == state else 0)
    if reason:
        e.add("rigdeck_gpu_health_reason", dict(labels, reason=reason), 1)
    if figure is None:
        return
    for name, key, convert in GPU_FIGURES:
        e.add(name, labels, convert(figure(key)))


def host_gpus(sample: Mapping[str, Any], host: str) -> Exposition:
    """A host's GPU series from one telemetry sample of its agent (``agent/telemetry.py``'s
    dict, with each GPU's ``claim`` as the daemon adds it), labelled ``host``."""
    e = Exposition(GPU_FAMILIES)
    for g in sample.get("gpus") or []:
        procs = [(p.get("job_id"), p.get("rank"), p.get("user")) for p in g.get("processes") or []]
        c = g.get("claim")
        claim = (c.get("job_id"), c.get("user")) if isinstance(c, dict) else None
        labels = gpu_labels(host, g.get("index"), g.get("uuid"), gpu_owner(procs, claim), bool(g.get("simulated")))
        add_gpu(e, labels, g.get("name"), g.get("health") or OK, g.get("health_reason"), g.get)
    return e


# ---------------------------------------------------------------------------------------------
# A textfile's path


def textfile_path_problem(path: Any) -> Optional[str]:
    """What is wrong with ``path`` as a textfile for node_exporter (None: nothing). Its textfile
    collector reads the files named ``*.prom`` in its directory, so the name ends in ``.prom``;
    the path is absolute or starts with ``~`` (expanded on the host, as its user's home)."""
    if not isinstance(path, str):
        return "a string"
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        return "a path without control characters"
    if not path.startswith(("/", "~")):
        return "an absolute path or one that starts with ~ (a relative path has no meaning on a host)"
    name = path.rsplit("/", 1)[-1]
    if not name.endswith(".prom") or name == ".prom":
        return "a file name ending in .prom (node_exporter's textfile collector reads only *.prom files)"
    return None


# ---------------------------------------------------------------------------------------------
# The text format


def escape_label(value: str) -> str:
    """A label value as the format writes it between quotes: ``\\``, ``"`` and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """``# HELP`` text: ``\\`` and newline escaped (quotes stay as they are)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(v: float) -> str:
    """A sample value: integers without a point, floats as Python's shortest repr, NaN and the
    infinities as the format spells them."""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)


class Exposition:
    """The series of one exposition of ``families``, family by family, written as text by ``text``."""

    def __init__(self, families: Sequence[Family]) -> None:
        self.families = tuple(families)
        self._by_name = {f.name: f for f in self.families}
        if len(self._by_name) != len(self.families):
            raise ValueError("a metric family declared twice")
        self._series = {}  # type: Dict[str, Dict[Tuple[str, ...], float]]

    def add(self, name: str, labels: Mapping[str, Any], value: Optional[float]) -> None:
        """One series of the family ``name``; ``labels`` must name exactly its label names (None
        is ""). A None value adds nothing: an unknown figure is no series, not a zero."""
        if value is None:
            return
        fam = self._by_name[name]
        if len(labels) != len(fam.labels) or not all(n in labels for n in fam.labels):
            raise ValueError("%s: labels %s, expected %s" % (name, sorted(labels), sorted(fam.labels)))
        key = tuple("" if labels[n] is None else str(labels[n]) for n in fam.labels)
        series = self._series.setdefault(name, {})
        if key in series:
            raise ValueError("%s: the series %s twice" % (name, {n: key[i] for i, n in enumerate(fam.labels)}))
        series[key] = value

    def series(self, name: str) -> Dict[Tuple[str, ...], float]:
        """The family's series so far: label values (in its label order) -> value."""
        return dict(self._series.get(name, {}))

    def text(self) -> str:
        """The exposition: the families in declaration order, each with its HELP and TYPE, those
        with no series left out."""
        out: List[str] = []
        for fam in self.families:
            series = self._series.get(fam.name)
            if not series:
                continue
            out.append("# HELP %s %s" % (fam.name, escape_help(fam.help)))
            out.append("# TYPE %s %s" % (fam.name, fam.type))
            for key, value in series.items():
                if fam.labels:
                    pairs = ",".join('%s="%s"' % (n, escape_label(key[i])) for i, n in enumerate(fam.labels))
                    out.append("%s{%s} %s" % (fam.name, pairs, format_value(value)))
                else:
                    out.append("%s %s" % (fam.name, format_value(value)))
        return "\n".join(out) + "\n" if out else ""
