"""Pipeline specs: steps (each a job or a sweep) with dependencies, retries, conditions and
artifacts passed between them, read from TOML.

A pipeline file::

    name = "shards"
    [[steps]]
    name = "preprocess"
    spec = "preprocess.toml"          # a job (or sweep) spec file, relative to this file
    [[steps]]
    name = "train"
    depends_on = ["preprocess"]
    inputs = { train = "steps.preprocess.output" }   # channel -> steps.STEP.output|model|checkpoints
    retries = { max_attempts = 3, backoff = "10s", on = ["failed", "host_lost"] }
    hyperparameters = { batch = 64 }  # over the job's own
    [steps.job]                       # or the job inline: the fields of a job spec file
    command = ["{python}", "train.py"]
    [[steps]]
    name = "register"
    depends_on = ["train"]
    when = "steps.train.metrics.accuracy >= 0.9"   # tui.model.pexpr
    continue_from = "steps.train"     # that step's checkpoints, copied into this step's

Loading checks everything before anything starts (the runner trusts a loaded spec): each step's
job through the job spec's own checks (tui.model.jobspec.jobspec_from_data, fields named
``steps.train.job.command``), the names, the graph (no cycle, no unknown step), and that every
input, condition and ``continue_from`` reads a step upstream (reachable through depends_on).
Errors are ``JobSpecError``s naming the file, ``steps.STEP.FIELD`` (``steps[I].FIELD`` while the
step has no usable name) and what was expected.

A sweep step's artifacts and metrics are its best trial's (as the pipeline view shows them);
``steps.X.params.NAME`` reads a sweep step's best trial's value of its searched parameter NAME
(a job step has none: its hyperparameters are fixed in its spec). A step's state reads
"succeeded" when it was cached. The only I/O here is reading the pipeline file and its steps' spec files.
"""

from __future__ import annotations

import dataclasses
import difflib
import heapq
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tui.model.fields import ENV_NAME_RE, Bad, Check, checked, int_range, unknown_field
from tui.model.jobspec import (
    JOB_NAME_RE,
    MAX_SPEC_JSON_BYTES,
    JobSpec,
    JobSpecError,
    _hyperparameters,
    _no_nul,
    check_container_images,
    check_container_launcher,
    jobspec_from_data,
    load_jobspec,
    parse_container,
    parse_duration,
    read_spec_file,
)
from tui.model.pexpr import Expr, ExprError, Ref, kind_of_value, parse
from tui.model.pipelineview import STEP_FINAL

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "ARTIFACTS",
    "MAX_ATTEMPTS",
    "MAX_BACKOFF_S",
    "MAX_STEPS",
    "RETRY_ON",
    "STEP_NAME_RE",
    "InputRef",
    "PipelineSpec",
    "RetrySpec",
    "StepSpec",
    "load_pipeline",
    "pipeline_from_data",
    "pipeline_from_toml",
]

STEP_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,39}")
MAX_STEPS = 200
MAX_ATTEMPTS = 100
MAX_BACKOFF_S = 3600.0  # the longest wait between two attempts
ARTIFACTS = ("output", "model", "checkpoints")  # output/data/, model/, the checkpoint dir
RETRY_ON = ("failed", "host_lost")
_STEP_NAME_EXPECTED = ("a step name: a letter or '_', then letters, digits, '_' and '-' "
                       "(at most 40 characters)")
_INPUT_EXPECTED = ('an artifact of an upstream step: "steps.STEP.output", "steps.STEP.model" or '
                   '"steps.STEP.checkpoints"')
_INPUT_RE = re.compile(r"steps\.(?P<step>[^.]+)\.(?P<artifact>.+)")
_CONTINUE_RE = re.compile(r"steps\.(?P<step>.+)")
_TOP_KEYS = ("name", "steps")
_STEP_KEYS = ("name", "spec", "job", "depends_on", "inputs", "retries", "hyperparameters", "when",
              "continue_from", "container")
_STEP_CONTAINER_EXPECTED = ("a table (this step's container: image, and runtime, mounts, workdir, options as in "
                            "[container]) or false (this step on the hosts themselves, whatever its job spec says)")


# ---------------------------------------------------------------------------------------------
# The spec.


@dataclass(frozen=True)
class RetrySpec:
    """``retries``: how often a step is tried (the first attempt included), after which causes,
    and how long to wait between attempts (``backoff_s``, doubling each time, at most 1 hour)."""

    max_attempts: int = 1
    backoff_s: float = 0.0
    on: tuple[str, ...] = RETRY_ON

    def delay(self, attempt_that_failed: int) -> float:
        """Seconds to wait before the attempt after ``attempt_that_failed`` (counted from 1):
        ``backoff_s * 2 ** (n - 1)``, at most an hour."""
        n = max(1, attempt_that_failed)
        if self.backoff_s <= 0:
            return 0.0
        return min(self.backoff_s * 2.0 ** min(n - 1, 64), MAX_BACKOFF_S)

    def retries(self, attempt_that_failed: int, cause: str) -> bool:
        """Whether a step whose attempt ``attempt_that_failed`` ended by ``cause`` ("failed" or
        "host_lost") is tried again."""
        return cause in self.on and attempt_that_failed < self.max_attempts

    def to_dict(self) -> dict[str, Any]:
        return {"max_attempts": self.max_attempts, "backoff_s": self.backoff_s, "on": list(self.on)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RetrySpec:
        return cls(max_attempts=int(d.get("max_attempts", 1)),
                   backoff_s=float(d.get("backoff_s", 0.0)),
                   on=tuple(d.get("on") or RETRY_ON))


@dataclass(frozen=True)
class InputRef:
    """One of ``inputs``: the artifact ``artifact`` ("output", "model", "checkpoints") of step
    ``step``, given to this step as its channel ``channel`` (``input/data/<channel>``)."""

    channel: str
    step: str
    artifact: str

    @property
    def text(self) -> str:
        return f"steps.{self.step}.{self.artifact}"


@dataclass(frozen=True)
class StepSpec:
    """One checked step. ``job`` is its job (a sweep's spec when ``job.sweep``), with the step's
    ``hyperparameters`` laid over the job's own; ``spec_path`` the spec file it came from (None:
    inline); ``index`` its place in the file (from 0)."""

    name: str
    job: JobSpec
    depends_on: tuple[str, ...] = ()
    retries: RetrySpec = RetrySpec()
    when: Expr | None = None
    inputs: tuple[InputRef, ...] = ()
    continue_from: str | None = None  # a step's name
    spec_path: str | None = None
    index: int = 0

    @property
    def kind(self) -> str:
        return "sweep" if self.job.sweep is not None else "job"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "index": self.index,
            "job": self.job.to_dict(),
            "depends_on": list(self.depends_on),
            "retries": self.retries.to_dict(),
            "when": self.when.text if self.when is not None else None,
            "inputs": {i.channel: i.text for i in self.inputs},
            "continue_from": self.continue_from,
            "spec_path": self.spec_path,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StepSpec:
        """The inverse of ``to_dict`` (trusted input: it was written by ``to_dict``)."""
        inputs = []
        for channel, text in (d.get("inputs") or {}).items():
            m = _INPUT_RE.fullmatch(text)
            if m is None:
                raise ValueError(f"not an input: {text!r}")
            inputs.append(InputRef(channel, m["step"], m["artifact"]))
        return cls(
            name=d["name"],
            job=JobSpec.from_dict(d["job"]),
            depends_on=tuple(d.get("depends_on") or ()),
            retries=RetrySpec.from_dict(d.get("retries") or {}),
            when=parse(d["when"]) if d.get("when") is not None else None,
            inputs=tuple(inputs),
            continue_from=d.get("continue_from"),
            spec_path=d.get("spec_path"),
            index=int(d.get("index") or 0),
        )


@dataclass(frozen=True)
class PipelineSpec:
    """One checked pipeline; ``steps`` in dependency order (each after every step in its
    depends_on; file order among those ready together)."""

    name: str
    steps: tuple[StepSpec, ...]
    path: Path | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.steps)

    def step(self, name: str) -> StepSpec:
        """The step called ``name``; KeyError if there is none."""
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(name)

    def upstream(self, name: str) -> set[str]:
        """Every step ``name`` needs: its depends_on, theirs, and so on."""
        by_name = {s.name: s for s in self.steps}
        out: set[str] = set()
        todo = list(by_name[name].depends_on)
        while todo:
            n = todo.pop()
            if n not in out:
                out.add(n)
                todo.extend(by_name[n].depends_on)
        return out

    def downstream(self, name: str) -> set[str]:
        """Every step that needs ``name``, directly or through others."""
        self.step(name)
        out: set[str] = set()
        for s in self.steps:  # dependency order: a step's needs come before it
            if name in s.depends_on or out.intersection(s.depends_on):
                out.add(s.name)
        return out

    def depth(self, name: str) -> int:
        """The longest chain of steps before ``name`` (0: it needs none)."""
        depths: dict[str, int] = {}
        for s in self.steps:
            depths[s.name] = 1 + max((depths[d] for d in s.depends_on), default=-1)
        return depths[name]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form; ``from_dict`` reads it back."""
        return {
            "name": self.name,
            "path": str(self.path) if self.path is not None else None,
            "steps": [s.to_dict() for s in self.steps],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PipelineSpec:
        """The inverse of ``to_dict`` (trusted input)."""
        path = d.get("path")
        return cls(name=d["name"], steps=tuple(StepSpec.from_dict(s) for s in d.get("steps") or ()),
                   path=Path(path) if path is not None else None)


# ---------------------------------------------------------------------------------------------
# Loading.


def load_pipeline(path: str | os.PathLike[str]) -> PipelineSpec:
    """Read and check a pipeline spec file (and its steps' spec files)."""
    target, text = read_spec_file(path, "pipeline spec")
    return pipeline_from_toml(text, target)


def pipeline_from_toml(text: str, path: str | os.PathLike[str] | None = None) -> PipelineSpec:
    """Check a pipeline spec given as TOML text; ``path`` names it in errors and anchors the
    steps' relative ``spec`` files, ``workdir`` and ``[code] sync`` (without it: the current
    directory)."""
    where = Path(path) if path is not None else None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise JobSpecError(where, None, f"valid TOML ({e})") from None
    return pipeline_from_data(data, where)


def pipeline_from_data(data: Mapping[str, Any], where: Path | None) -> PipelineSpec:
    """Check a pipeline spec given as its decoded TOML table (see ``pipeline_from_toml``)."""
    for key in data:
        if key not in _TOP_KEYS:
            raise JobSpecError(where, key, unknown_field(key, list(_TOP_KEYS)))
    name = data.get("name")
    if not isinstance(name, str) or not JOB_NAME_RE.fullmatch(name):
        raise JobSpecError(where, "name", "a pipeline name of 1-64 letters, digits, '.', '_' and '-'"
                           + (" (required)" if name is None else ""), name)
    raw_steps = data.get("steps")
    if raw_steps is None or (isinstance(raw_steps, list) and not raw_steps):
        raise JobSpecError(where, "steps", "at least one step ([[steps]] with a name and a job)")
    if not isinstance(raw_steps, list) or not all(isinstance(s, dict) for s in raw_steps):
        bad = raw_steps if not isinstance(raw_steps, list) else next(
            s for s in raw_steps if not isinstance(s, dict))
        raise JobSpecError(where, "steps", "an array of tables ([[steps]])", bad)
    if len(raw_steps) > MAX_STEPS:
        raise JobSpecError(where, "steps", f"at most {MAX_STEPS} steps; this pipeline has "
                           f"{len(raw_steps)}")

    loader = _Loader(where)
    drafts = [loader.step(i, raw) for i, raw in enumerate(raw_steps)]
    seen: dict[str, int] = {}
    for d in drafts:
        if d.name in seen:
            raise JobSpecError(where, f"steps[{d.index}].name", f"a name no other step has "
                               f"(steps[{seen[d.name]}] is also called {d.name!r})", d.name)
        seen[d.name] = d.index
    names = [d.name for d in drafts]
    for d in drafts:
        for dep in d.depends_on:
            if dep not in seen:
                raise JobSpecError(where, f"steps.{d.name}.depends_on", _known_steps(dep, names), dep)
    _no_cycle(drafts, where)
    order = _dependency_order(drafts)
    by_name = {d.name: d for d in drafts}
    upstream: dict[str, set[str]] = {}
    for d in order:
        up: set[str] = set()
        for dep in d.depends_on:
            up |= {dep} | upstream[dep]
        upstream[d.name] = up
    steps = [loader.cross_check(d, names, upstream[d.name], by_name) for d in order]
    return PipelineSpec(name=name, steps=tuple(steps), path=where)


@dataclass(frozen=True)
class _Draft:
    """A step whose own fields are checked; references to other steps not yet."""

    index: int
    name: str
    job: JobSpec
    depends_on: tuple[str, ...]
    retries: RetrySpec
    when: Expr | None
    when_text: str | None
    inputs: tuple[InputRef, ...]
    continue_from: str | None
    continue_text: str | None
    spec_path: str | None


def _known_steps(name: str, names: Sequence[str]) -> str:
    hint = difflib.get_close_matches(name, names, n=1)
    return (f"a step of this pipeline ({', '.join(_shown(names))})"
            + (f"; did you mean {hint[0]!r}?" if hint else ""))


def _shown(names: Sequence[str]) -> list[str]:
    return list(names) if len(names) <= 20 else [*names[:20], f"... ({len(names)} in all)"]


def _not_upstream(step: str, other: str) -> str:
    return (f"{other!r} is not upstream of {step!r} (a step reads only the steps it depends on, "
            f"directly or through others): add {other!r} to steps.{step}.depends_on")


def _duration_to_hour(v: Any) -> float:
    try:
        seconds = parse_duration(v)
    except ValueError:
        raise Bad() from None
    if seconds > MAX_BACKOFF_S:
        raise Bad()
    return seconds


def _retry_on(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
        raise Bad()
    for x in v:
        if x not in RETRY_ON:
            raise Bad(got=x)
    if len(set(v)) != len(v):
        raise Bad('causes without repeats: "failed", "host_lost"')
    return tuple(v)


_RETRY_CHECKS: dict[str, Check] = {
    "max_attempts": Check(f"an integer 1..{MAX_ATTEMPTS} (attempts in all, the first included)",
                          int_range(1, MAX_ATTEMPTS)),
    "backoff": Check('a duration of at most 1h: seconds or a string like "10s", "2m" (the wait '
                     "before the second attempt; it doubles for each one after, up to 1h)",
                     _duration_to_hour),
    "on": Check('a non-empty list of the causes to retry: "failed", "host_lost"', _retry_on),
}


class _Loader:
    def __init__(self, where: Path | None) -> None:
        self.where = where
        self.base = where.parent if where is not None else Path.cwd()

    def error(self, field: str | None, expected: str, got: Any = None) -> JobSpecError:
        return JobSpecError(self.where, field, expected, got)

    # -- one step's own fields -------------------------------------------------------------

    def step(self, index: int, raw: Mapping[str, Any]) -> _Draft:
        name = raw.get("name")
        if not isinstance(name, str) or not STEP_NAME_RE.fullmatch(name):
            raise self.error(f"steps[{index}].name", _STEP_NAME_EXPECTED
                             + (" (required)" if name is None else ""), name)
        label = f"steps.{name}"
        for key in raw:
            if key not in _STEP_KEYS:
                raise self.error(f"{label}.{key}", unknown_field(key, list(_STEP_KEYS)))
        # No NUL in a path, a condition or a hyperparameter (the job's own table checks its own).
        _no_nul({k: v for k, v in raw.items() if k != "job"}, self.where, label)

        job, spec_path = self.job(raw, name, label)
        if "hyperparameters" in raw:
            job = self.overlay(job, raw["hyperparameters"], label)
        if "container" in raw:
            job = self.container(job, raw["container"], label)

        depends_on: tuple[str, ...] = ()
        if "depends_on" in raw:
            deps = raw["depends_on"]
            if not isinstance(deps, list) or not all(isinstance(x, str) for x in deps):
                raise self.error(f"{label}.depends_on", 'a list of step names (depends_on = '
                                 '["preprocess"])', deps)
            repeated = [x for x in deps if deps.count(x) > 1]
            if repeated:
                raise self.error(f"{label}.depends_on", "step names without repeats", repeated[0])
            if name in deps:
                raise self.error(f"{label}.depends_on", "other steps (a step cannot depend on "
                                 "itself)", name)
            depends_on = tuple(deps)

        retries = RetrySpec()
        if "retries" in raw:
            retries = self.retries(raw["retries"], label)

        when = None
        when_text = None
        if "when" in raw:
            when_text = raw["when"]
            if not isinstance(when_text, str):
                raise self.error(f"{label}.when", "a condition as a string, such as "
                                 '"steps.evaluate.metrics.accuracy >= 0.9"', when_text)
            try:
                when = parse(when_text)
            except ExprError as e:
                raise self.error(f"{label}.when", f"a condition over earlier steps ({e})",
                                 when_text) from None

        inputs = self.inputs(raw["inputs"], job, label) if "inputs" in raw else ()

        continue_from = None
        continue_text = None
        if "continue_from" in raw:
            continue_text = raw["continue_from"]
            m = _CONTINUE_RE.fullmatch(continue_text) if isinstance(continue_text, str) else None
            if m is None or not STEP_NAME_RE.fullmatch(m["step"]):
                hint = ""
                if isinstance(continue_text, str) and STEP_NAME_RE.fullmatch(continue_text):
                    hint = f' (write "steps.{continue_text}")'
                raise self.error(f"{label}.continue_from", 'an upstream step whose checkpoints this '
                                 f'step starts from: "steps.STEP"{hint}', continue_text)
            continue_from = m["step"]
            if continue_from == name:
                raise self.error(f"{label}.continue_from", "another step (a step cannot continue "
                                 "from itself)", continue_text)

        return _Draft(index=index, name=name, job=job, depends_on=depends_on, retries=retries,
                      when=when, when_text=when_text, inputs=inputs, continue_from=continue_from,
                      continue_text=continue_text, spec_path=spec_path)

    def job(self, raw: Mapping[str, Any], name: str, label: str) -> tuple[JobSpec, str | None]:
        has_spec, has_job = "spec" in raw, "job" in raw
        if has_spec and has_job:
            raise self.error(f"{label}.spec", 'either spec = "FILE.toml" or an inline [steps.job] '
                             "table, not both", raw["spec"])
        if not has_spec and not has_job:
            raise self.error(f"{label}.spec", 'a job: spec = "FILE.toml" (a job or sweep spec file, '
                             "relative to this file) or an inline [steps.job] table (required)")
        if has_spec:
            spec = raw["spec"]
            if not isinstance(spec, str) or not spec.strip():
                raise self.error(f"{label}.spec", "a job or sweep spec file: absolute, or relative "
                                 "to this file's directory", spec)
            target = os.path.normpath(os.path.join(os.path.abspath(self.base),
                                                   os.path.expanduser(spec)))
            try:
                return load_jobspec(target), target
            except JobSpecError as e:
                raise self.error(f"{label}.spec", f"a job spec that loads ({e})") from None
        table = raw["job"]
        if not isinstance(table, dict):
            raise self.error(f"{label}.job", "a table ([steps.job]) with the fields of a job spec",
                             table)
        data = dict(table)
        data.setdefault("name", name)
        return jobspec_from_data(data, self.where, prefix=f"{label}.job."), None

    def overlay(self, job: JobSpec, raw: Any, label: str) -> JobSpec:
        field = f"{label}.hyperparameters"

        def error(sub: str, expected: str, got: Any) -> JobSpecError:
            return self.error(field + sub[len("v"):], expected, got)

        checked({"v": raw}, {"v": Check("a table of hyperparameters laid over the job's own "
                                        "(hyperparameters = {batch = 64})", _hyperparameters)}, error)
        if job.sweep is not None:
            for key in raw:
                if key in job.sweep.names:
                    raise self.error(f"{field}.{key}", "a name the sweep does not search (it sets "
                                     "that one for each trial)", key)
        merged = {**dict(job.hyperparameters), **raw}
        checked({"v": merged}, {"v": Check("hyperparameters", _hyperparameters)}, error)
        job = dataclasses.replace(job, hyperparameters=tuple(merged.items()))
        size = len(json.dumps(job.to_dict()).encode("utf-8"))
        if size > MAX_SPEC_JSON_BYTES:
            raise self.error(field, f"a job of at most {MAX_SPEC_JSON_BYTES} bytes (512 KiB) as "
                             f"the job plan carries it (JSON); with these it has {size}")
        return job

    def container(self, job: JobSpec, raw: Any, label: str) -> JobSpec:
        """The step's ``container`` over its job's ``[container]``: its own table, or false (on
        the hosts). A worker pool's own ``container`` still wins for that pool."""
        field = f"{label}.container"

        def error(sub: str, expected: str, got: Any) -> JobSpecError:
            return self.error(f"{field}.{sub}" if sub != "launcher" else f"{field}",
                              expected + (f" (the job's launcher is {got!r})" if sub == "launcher" else ""),
                              None if sub == "launcher" else got)

        if raw is False:
            return dataclasses.replace(job, container=None)
        if not isinstance(raw, dict):
            raise self.error(field, _STEP_CONTAINER_EXPECTED, raw)
        box = parse_container(raw, error)
        check_container_launcher(job.launcher, error)
        job = dataclasses.replace(job, container=box)
        check_container_images(job, lambda sub, expected, got: self.error(
            f"{field}.image" if sub == "container.image" else f"{label}.job.{sub}", expected, got))
        return job

    def retries(self, raw: Any, label: str) -> RetrySpec:
        if not isinstance(raw, dict):
            raise self.error(f"{label}.retries", 'a table: {max_attempts = 3, backoff = "10s", '
                             'on = ["failed", "host_lost"]}', raw)

        def error(field: str, expected: str, got: Any) -> JobSpecError:
            return self.error(f"{label}.retries.{field}", expected, got)

        values = checked(raw, _RETRY_CHECKS, error)
        return RetrySpec(max_attempts=values.get("max_attempts", 1),
                         backoff_s=values.get("backoff", 0.0),
                         on=values.get("on", RETRY_ON))

    def inputs(self, raw: Any, job: JobSpec, label: str) -> tuple[InputRef, ...]:
        if not isinstance(raw, dict):
            raise self.error(f"{label}.inputs", 'a table of channels: {train = '
                             '"steps.preprocess.output"}', raw)
        own = {c.upper(): c for c, _ in job.channels}
        seen: dict[str, str] = {}
        out = []
        for channel, text in raw.items():
            field = f"{label}.inputs.{channel}"
            if not ENV_NAME_RE.fullmatch(channel):
                raise self.error(f"{label}.inputs", "channel names of letters, digits and '_' "
                                 "(not starting with a digit)", channel)
            if channel.upper() in own:
                raise self.error(field, "a channel the job does not also define in its own "
                                 f"channels (it has {own[channel.upper()]!r}: both would be "
                                 f"SM_CHANNEL_{channel.upper()})", channel)
            if channel.upper() in seen:
                raise self.error(field, f"a channel name not used twice ({seen[channel.upper()]!r} "
                                 f"is also SM_CHANNEL_{channel.upper()})", channel)
            seen[channel.upper()] = channel
            m = _INPUT_RE.fullmatch(text) if isinstance(text, str) else None
            if m is None or not STEP_NAME_RE.fullmatch(m["step"]):
                raise self.error(field, _INPUT_EXPECTED, text)
            if m["artifact"] not in ARTIFACTS:
                hint = difflib.get_close_matches(m["artifact"], ARTIFACTS, n=1)
                raise self.error(field, _INPUT_EXPECTED + (f" (did you mean "
                                 f"'steps.{m['step']}.{hint[0]}'?)" if hint else ""), text)
            out.append(InputRef(channel, m["step"], m["artifact"]))
        return tuple(out)

    # -- references to other steps ---------------------------------------------------------

    def cross_check(self, d: _Draft, names: Sequence[str], upstream: set[str],
                    by_name: Mapping[str, _Draft]) -> StepSpec:
        label = f"steps.{d.name}"
        for i in d.inputs:
            field = f"{label}.inputs.{i.channel}"
            if i.step == d.name:
                raise self.error(field, "an artifact of an upstream step, not of this one", i.text)
            if i.step not in by_name:
                raise self.error(field, _known_steps(i.step, names), i.text)
            if i.step not in upstream:
                raise self.error(field, f"an artifact of an upstream step; {_not_upstream(d.name, i.step)}",
                                 i.text)
        if d.continue_from is not None:
            field = f"{label}.continue_from"
            if d.continue_from not in by_name:
                raise self.error(field, _known_steps(d.continue_from, names), d.continue_text)
            if d.continue_from not in upstream:
                raise self.error(field, f"an upstream step; {_not_upstream(d.name, d.continue_from)}",
                                 d.continue_text)
        if d.when is not None:
            self.check_when(d, d.when, names, upstream, by_name)
        return StepSpec(name=d.name, job=d.job, depends_on=d.depends_on, retries=d.retries,
                        when=d.when, inputs=d.inputs, continue_from=d.continue_from,
                        spec_path=d.spec_path, index=d.index)

    def check_when(self, d: _Draft, when: Expr, names: Sequence[str], upstream: set[str],
                   by_name: Mapping[str, _Draft]) -> None:
        field = f"steps.{d.name}.when"

        def fail(position: int, message: str) -> JobSpecError:
            return self.error(field, f"a condition over earlier steps ({ExprError(message, position)})",
                              when.text)

        for ref in when.ref_positions():
            if ref.step == d.name:
                raise fail(ref.position, f"{ref.text} is this step's own; a condition reads the "
                           "steps it depends on")
            if ref.step not in by_name:
                hint = difflib.get_close_matches(ref.step, names, n=1)
                raise fail(ref.position, f"{ref.text}: no step is called {ref.step!r} (the steps "
                           f"are {', '.join(_shown(names))})"
                           + (f"; did you mean {hint[0]!r}?" if hint else ""))
            if ref.step not in upstream:
                raise fail(ref.position, _not_upstream(d.name, ref.step))
            if ref.kind == "params":
                sweep = by_name[ref.step].job.sweep
                if sweep is None:
                    raise fail(ref.position, f"{ref.text}: params are a sweep step's parameters (its "
                               f"best trial's), and {ref.step!r} is a job, whose hyperparameters are "
                               "fixed in its spec")
                if ref.key not in sweep.names:
                    hint = difflib.get_close_matches(ref.key or "", sweep.names, n=1)
                    fixed = dict(by_name[ref.step].job.hyperparameters)
                    raise fail(ref.position, f"{ref.text}: the sweep of step {ref.step!r} searches no "
                               f"parameter {ref.key!r} (it searches {', '.join(sweep.names)})"
                               + (f"; {ref.key!r} is a fixed hyperparameter of its spec"
                                  if ref.key in fixed else "")
                               + (f"; did you mean {hint[0]!r}?" if hint else ""))
        for ref, value, position in when.compared_literals():
            if ref.kind == "state" and value == "cached":
                raise fail(position, "a cached step's state reads as 'succeeded' (its earlier run "
                           "succeeded), so it never equals 'cached'")
            if ref.kind == "state" and isinstance(value, str) and value not in STEP_FINAL:
                hint = difflib.get_close_matches(value, STEP_FINAL, n=1)
                raise fail(position, f"a step's state is one of {', '.join(STEP_FINAL)}, not "
                           f"{value!r}" + (f" (did you mean {hint[0]!r}?)" if hint else ""))

        def kind_of(ref: Ref) -> str | None:
            if ref.kind == "metrics":
                return "number"
            if ref.kind == "state":
                return "string"
            return _param_kind(by_name[ref.step].job, ref.key or "")

        try:
            when.check(kind_of)
        except ExprError as e:
            raise fail(e.position, e.message) from None


def _param_kind(job: JobSpec, key: str) -> str | None:
    """The kind of value sweep parameter ``key`` has ("number", "string", "boolean"), None when
    it cannot be told (a categorical parameter of mixed choices)."""
    if job.sweep is not None:
        for p in job.sweep.parameters:
            if p.name == key:
                if p.type != "categorical":
                    return "number"
                kinds = {kind_of_value(c) for c in p.choices}
                return kinds.pop() if len(kinds) == 1 else None
    return None


def _no_cycle(drafts: Sequence[_Draft], where: Path | None) -> None:
    """Raise naming a cycle of depends_on, if there is one (from its earliest step in the file)."""
    by_name = {d.name: d for d in drafts}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for first in drafts:
        if state.get(first.name):
            continue
        path: list[str] = []
        # An explicit stack of (step, its next dependency to visit): deep chains need no recursion.
        stack: list[tuple[str, int]] = [(first.name, 0)]
        state[first.name] = 1
        path.append(first.name)
        while stack:
            name, i = stack[-1]
            deps = by_name[name].depends_on
            if i >= len(deps):
                stack.pop()
                path.pop()
                state[name] = 2
                continue
            stack[-1] = (name, i + 1)
            dep = deps[i]
            if state.get(dep) == 1:
                cycle = path[path.index(dep):]
                start = min(cycle, key=lambda n: by_name[n].index)
                k = cycle.index(start)
                ring = cycle[k:] + cycle[:k] + [start]
                raise JobSpecError(where, f"steps.{start}.depends_on", "steps without a cycle; these "
                                   f"form one: {' -> '.join(ring)} (each depends on the next)")
            if not state.get(dep):
                state[dep] = 1
                path.append(dep)
                stack.append((dep, 0))


def _dependency_order(drafts: Sequence[_Draft]) -> list[_Draft]:
    """Each step after every step it depends on; among those ready together, file order."""
    waiting = {d.name: len(d.depends_on) for d in drafts}
    needed_by: dict[str, list[_Draft]] = {d.name: [] for d in drafts}
    for d in drafts:
        for dep in d.depends_on:
            needed_by[dep].append(d)
    ready = [(d.index, d.name) for d in drafts if not d.depends_on]
    heapq.heapify(ready)
    by_name = {d.name: d for d in drafts}
    out: list[_Draft] = []
    while ready:
        _, name = heapq.heappop(ready)
        out.append(by_name[name])
        for d in needed_by[name]:
            waiting[d.name] -= 1
            if waiting[d.name] == 0:
                heapq.heappush(ready, (d.index, d.name))
    assert len(out) == len(drafts), "a cycle got past _no_cycle"
    return out
