"""A job spec's ``[sweep]`` table: what a hyperparameter sweep searches, for which objective, how.

The format is in docs/contracts.md ("Sweeps"). Checked here, before anything starts, with the
same kit as the rest of the spec (tui.model.fields), so a bad sweep names its field: an unknown
parameter type, ``low > high``, ``log`` with ``low <= 0``, a grid over a float range without
``step``, a ``{hp.NAME}`` in the command that names no parameter.

Nothing here searches: the controller's sweep service (tui.control.sweeps) hands these
parameters to Optuna and runs each trial as a job made by ``trial_spec``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tui.model.fields import (
    Bad,
    Check,
    ErrorFactory,
    boolean,
    checked,
    finite,
    int_range,
    is_int,
    nonblank,
    one_of,
    unknown_field,
)

__all__ = [
    "EARLY_STOPPING",
    "GOALS",
    "PARAM_TYPES",
    "STRATEGIES",
    "MetricDefinition",
    "Parameter",
    "SweepSpec",
    "command_placeholders",
    "format_hp",
    "grid_points",
    "parse_sweep",
    "substitute_command",
]

PARAM_TYPES = ("float", "int", "categorical")
STRATEGIES = ("random", "grid", "bayesian", "hyperband")
EARLY_STOPPING = ("off", "median", "hyperband")
GOALS = ("minimize", "maximize")
MAX_TRIALS_LIMIT = 100_000
MAX_GRID = 100_000  # grid points: more is a mistake (and Optuna would hold them all in memory)
# A parameter's name becomes SM_HP_<NAME> and {hp.NAME} in the command.
PARAM_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
# The metric's name is a key in runtime.report(), a SageMaker metric name, a hypertune tag.
METRIC_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_./:-]{0,127}")
HP_PLACEHOLDER_RE = re.compile(r"\{hp\.([^{}]*)\}")
_DEFS_EXPECTED = ("a regular expression with one capture group (or a group named 'value') that "
                  "matches the metric's number on a line of rank 0's output")


@dataclass(frozen=True)
class Parameter:
    """One searched hyperparameter: a float or int range, or a list of choices."""

    name: str
    type: str  # "float" | "int" | "categorical"
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()

    def grid_values(self) -> list[Any]:
        """Every value a grid visits (a float range needs ``step``; checked when parsed)."""
        if self.type == "categorical":
            return list(self.choices)
        assert self.low is not None and self.high is not None
        step = self.step if self.step is not None else 1
        n = int(math.floor((self.high - self.low) / step + 1e-9)) + 1
        values = [self.low + i * step for i in range(n)]
        if self.type == "int":
            return [int(v) for v in values]
        return [round(v, 12) for v in values]

    def to_dict(self) -> dict[str, Any]:
        if self.type == "categorical":
            return {"name": self.name, "type": self.type, "choices": list(self.choices)}
        d: dict[str, Any] = {"name": self.name, "type": self.type, "low": self.low, "high": self.high,
                             "log": self.log}
        if self.step is not None:
            d["step"] = self.step
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Parameter:
        return cls(name=d["name"], type=d["type"], low=d.get("low"), high=d.get("high"),
                   log=bool(d.get("log")), step=d.get("step"), choices=tuple(d.get("choices") or ()))


@dataclass(frozen=True)
class MetricDefinition:
    """SageMaker's MetricDefinitions entry: the metric ``name`` read off rank 0's output by ``regex``."""

    name: str
    regex: str


@dataclass(frozen=True)
class SweepSpec:
    """One validated ``[sweep]`` table."""

    parameters: tuple[Parameter, ...]
    metric: str
    goal: str = "minimize"
    metric_definitions: tuple[MetricDefinition, ...] = ()
    strategy: str = "bayesian"
    early_stopping: str = "off"
    max_trials: int = 10
    max_parallel: int | None = None  # None: as many as fit
    max_runtime_s: int | None = None  # the whole sweep's
    retries: int = 1  # per trial, for failures of the infrastructure (a lost host)
    warm_start: str | None = None  # an earlier sweep (id or name) whose trials seed this one
    seed: int | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parameters)

    @property
    def pruner(self) -> str:
        """The early-stopping rule in force: a hyperband strategy prunes by hyperband unless
        ``early_stopping`` names another rule."""
        if self.early_stopping == "off" and self.strategy == "hyperband":
            return "hyperband"
        return self.early_stopping

    def grid_size(self) -> int:
        return math.prod(len(p.grid_values()) for p in self.parameters)

    def to_dict(self) -> dict[str, Any]:
        return {
            "parameters": [p.to_dict() for p in self.parameters],
            "objective": {"metric": self.metric, "goal": self.goal},
            "metric_definitions": [{"name": m.name, "regex": m.regex} for m in self.metric_definitions],
            "strategy": self.strategy,
            "early_stopping": self.early_stopping,
            "max_trials": self.max_trials,
            "max_parallel": self.max_parallel,
            "max_runtime_s": self.max_runtime_s,
            "retries": self.retries,
            "warm_start": self.warm_start,
            "seed": self.seed,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SweepSpec:
        """The inverse of ``to_dict`` (trusted input)."""
        obj = d.get("objective") or {}
        return cls(
            parameters=tuple(Parameter.from_dict(p) for p in d.get("parameters") or ()),
            metric=str(obj.get("metric")),
            goal=str(obj.get("goal") or "minimize"),
            metric_definitions=tuple(MetricDefinition(m["name"], m["regex"])
                                     for m in d.get("metric_definitions") or ()),
            strategy=str(d.get("strategy") or "bayesian"),
            early_stopping=str(d.get("early_stopping") or "off"),
            max_trials=int(d.get("max_trials") or 1),
            max_parallel=d.get("max_parallel"),
            max_runtime_s=d.get("max_runtime_s"),
            retries=int(d.get("retries") or 0),
            warm_start=d.get("warm_start"),
            seed=d.get("seed"),
        )


# ---------------------------------------------------------------------------------------------
# Hyperparameter values in the command


def format_hp(value: Any) -> str:
    """A value as ``{hp.NAME}`` puts it in the command: as JSON writes numbers and booleans
    (``0.001``, ``64``, ``true``), strings as they are."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def command_placeholders(command: tuple[str, ...] | list[str]) -> list[str]:
    """The names in every ``{hp.NAME}`` of the command, in order."""
    return [m.group(1) for arg in command for m in HP_PLACEHOLDER_RE.finditer(arg)]


def substitute_command(command: tuple[str, ...], values: Mapping[str, Any]) -> tuple[str, ...]:
    """The command with each ``{hp.NAME}`` replaced by that hyperparameter's value (each
    argument stays one argument: no shell ever parses it)."""
    return tuple(HP_PLACEHOLDER_RE.sub(lambda m: format_hp(values[m.group(1)]), arg) for arg in command)


# ---------------------------------------------------------------------------------------------
# Checks


def _choices(v: Any) -> tuple[Any, ...]:
    if not isinstance(v, list) or not v:
        raise Bad()
    for i, c in enumerate(v):
        if not isinstance(c, (str, int, float, bool)) or (isinstance(c, float) and not math.isfinite(c)):
            raise Bad("strings, numbers or booleans", got=c, sub=f"[{i}]")
    seen: list[Any] = []
    for c in v:
        if any(type(c) is type(s) and c == s for s in seen):
            raise Bad("choices without repeats", got=c)
        seen.append(c)
    return tuple(v)


_PARAM_FIELDS: dict[str, Check] = {
    "type": Check(" or ".join(f'"{t}"' for t in PARAM_TYPES), lambda v: v),
    "low": Check("a number", finite),
    "high": Check("a number", finite),
    "log": Check("true or false", boolean),
    "step": Check("a number > 0", finite),
    "choices": Check("a non-empty list of strings, numbers or booleans", _choices),
}
_ALLOWED = {
    "float": ("type", "low", "high", "log", "step"),
    "int": ("type", "low", "high", "log", "step"),
    "categorical": ("type", "choices"),
}


def _parameter(name: str, raw: Any, error: ErrorFactory) -> Parameter:
    where = f"sweep.parameters.{name}"
    if not PARAM_NAME_RE.fullmatch(name):
        raise error(where, "a parameter name of letters, digits, '_' and '-' (not starting with a digit, "
                           "at most 64)", name)
    if not isinstance(raw, dict):
        raise error(where, 'a table such as {type = "float", low = 1e-4, high = 0.1, log = true}', raw)
    kind = raw.get("type")
    if kind not in PARAM_TYPES:
        raise error(f"{where}.type", "a parameter type: " + ", ".join(f'"{t}"' for t in PARAM_TYPES)
                    + (" (required)" if kind is None else ""), kind)

    def sub_error(field: str, expected: str, got: Any) -> Exception:
        return error(f"{where}.{field}", expected, got)

    for key in raw:
        if key in _PARAM_FIELDS and key not in _ALLOWED[kind]:
            raise sub_error(key, f"no {key!r} for a {kind} parameter (it takes "
                                 f"{', '.join(k for k in _ALLOWED[kind] if k != 'type')})", raw[key])
    values = checked(raw, _PARAM_FIELDS, sub_error)
    if kind == "categorical":
        if "choices" not in values:
            raise sub_error("choices", f"{_PARAM_FIELDS['choices'].expected} (required)", None)
        return Parameter(name, kind, choices=values["choices"])
    for key in ("low", "high"):
        if key not in values:
            raise sub_error(key, f"a number (required for a {kind} parameter)", None)
    low, high = values["low"], values["high"]
    if kind == "int":
        for key in ("low", "high", "step"):
            if key in values and not is_int(values[key]):
                raise sub_error(key, "an integer", values[key])
    if low > high:
        raise sub_error("low", f"low <= high ({high})", low)
    log = values.get("log", False)
    if log and low <= 0:
        raise sub_error("low", "low > 0 with log = true (a log scale has no zero or negatives)", low)
    step = values.get("step")
    if step is not None:
        if step <= 0:
            raise sub_error("step", "a number > 0", step)
        if log and (kind == "float" or step != 1):
            raise sub_error("step", "no step with log = true (a log scale is not evenly stepped)", step)
    if kind == "int":
        return Parameter(name, kind, low=int(low), high=int(high), log=log,
                         step=int(step) if step is not None else None)
    return Parameter(name, kind, low=float(low), high=float(high), log=log,
                     step=float(step) if step is not None else None)


def _objective(raw: Any, error: ErrorFactory) -> tuple[str, str]:
    if not isinstance(raw, dict):
        raise error("sweep.objective", 'a table: {metric = "val_loss", goal = "minimize"}', raw)
    for key in raw:
        if key not in ("metric", "goal"):
            raise error(f"sweep.objective.{key}", unknown_field(key, ["metric", "goal"]), None)
    metric = raw.get("metric")
    if not isinstance(metric, str) or not METRIC_NAME_RE.fullmatch(metric):
        raise error("sweep.objective.metric", "a metric name (letters, digits, '_', '.', '/', ':', '-'), "
                    "as runtime.report(), a metric definition or hypertune names it"
                    + (" (required)" if metric is None else ""), metric)
    goal = raw.get("goal", "minimize")
    if goal not in GOALS:
        raise error("sweep.objective.goal", " or ".join(f'"{g}"' for g in GOALS), goal)
    return metric, str(goal)


def _metric_definitions(raw: Any, error: ErrorFactory) -> tuple[MetricDefinition, ...]:
    if not isinstance(raw, list):
        raise error("sweep.metric_definitions", "an array of tables ([[sweep.metric_definitions]] with "
                    "name and regex)", raw)
    out = []
    names: set[str] = set()
    for i, d in enumerate(raw):
        where = f"sweep.metric_definitions[{i}]"
        if not isinstance(d, dict):
            raise error(where, "a table with name and regex", d)
        for key in d:
            if key not in ("name", "regex"):
                raise error(f"{where}.{key}", unknown_field(key, ["name", "regex"]), None)
        name = d.get("name")
        if not isinstance(name, str) or not METRIC_NAME_RE.fullmatch(name):
            raise error(f"{where}.name", "a metric name (letters, digits, '_', '.', '/', ':', '-')"
                        + (" (required)" if name is None else ""), name)
        if name in names:
            raise error(f"{where}.name", "a name not defined twice", name)
        names.add(name)
        regex = d.get("regex")
        if not isinstance(regex, str) or not regex:
            raise error(f"{where}.regex", _DEFS_EXPECTED + (" (required)" if regex is None else ""), regex)
        try:
            rx = re.compile(regex)
        except re.error as e:
            raise error(f"{where}.regex", f"{_DEFS_EXPECTED} (it does not compile: {e})", regex) from None
        if "value" not in rx.groupindex and rx.groups != 1:
            raise error(f"{where}.regex", f"{_DEFS_EXPECTED} (it has {rx.groups} groups)", regex)
        out.append(MetricDefinition(name, regex))
    return tuple(out)


def _warm_start(v: Any) -> str:
    return nonblank(v).strip()


def parse_sweep(
    raw: Any,
    error: ErrorFactory,
    *,
    command: tuple[str, ...],
    hyperparameters: Mapping[str, Any],
    duration: Callable[[Any], int],
) -> SweepSpec:
    """Check a ``[sweep]`` table. ``error(field, expected, got)`` makes the spec's own error;
    ``command`` and ``hyperparameters`` are the spec's, checked against the parameters;
    ``duration`` converts ``max_runtime`` (the job spec's rule for durations)."""
    if not isinstance(raw, dict):
        raise error("sweep", "a table ([sweep])", raw)
    scalars: dict[str, Check] = {
        "strategy": Check(" or ".join(f'"{s}"' for s in STRATEGIES), one_of(STRATEGIES)),
        "early_stopping": Check(" or ".join(f'"{s}"' for s in EARLY_STOPPING), one_of(EARLY_STOPPING)),
        "max_trials": Check(f"an integer 1..{MAX_TRIALS_LIMIT}", int_range(1, MAX_TRIALS_LIMIT)),
        "max_parallel": Check("an integer >= 1 (leave it out: as many trials as fit at once)", int_range(1)),
        "max_runtime": Check('the whole sweep\'s time limit: seconds or a string like "2h", "90m"', duration),
        "retries": Check("an integer 0..10 (restarts of a trial whose host was lost)", int_range(0, 10)),
        "warm_start": Check("an earlier sweep's id or name", _warm_start),
        "seed": Check("an integer >= 0", int_range(0)),
    }
    tables = ("parameters", "objective", "metric_definitions")
    for key in raw:
        if key not in scalars and key not in tables:
            raise error(f"sweep.{key}", unknown_field(key, [*scalars, *tables]), None)

    def sub_error(field: str, expected: str, got: Any) -> Exception:
        return error(f"sweep.{field}", expected, got)

    values = checked({k: v for k, v in raw.items() if k in scalars}, scalars, sub_error)
    params_raw = raw.get("parameters")
    if not isinstance(params_raw, dict) or not params_raw:
        raise error("sweep.parameters", 'a table of parameters ([sweep.parameters] lr = {type = "float", '
                    "low = 1e-4, high = 0.1, log = true})" + (" (required)" if params_raw is None else ""),
                    params_raw)
    parameters = tuple(_parameter(name, p, error) for name, p in params_raw.items())
    if "objective" not in raw:
        raise error("sweep.objective", '{metric = "val_loss", goal = "minimize"} (required)', None)
    metric, goal = _objective(raw["objective"], error)
    defs = _metric_definitions(raw.get("metric_definitions", []), error)
    for p in parameters:
        if p.name in hyperparameters:
            raise error(f"sweep.parameters.{p.name}", "a name not also fixed in [hyperparameters] (the sweep "
                        "sets it for each trial)", p.name)
    known = {p.name for p in parameters} | set(hyperparameters)
    for name in command_placeholders(command):
        if name not in known:
            raise error("command", f"{{hp.NAME}} naming a sweep parameter or a hyperparameter "
                        f"({', '.join(sorted(known))})", "{hp." + name + "}")
    strategy = values.get("strategy", "bayesian")
    spec = SweepSpec(
        parameters=parameters, metric=metric, goal=goal, metric_definitions=defs, strategy=strategy,
        early_stopping=values.get("early_stopping", "off"), max_trials=values.get("max_trials", 0),
        max_parallel=values.get("max_parallel"), max_runtime_s=values.get("max_runtime"),
        retries=values.get("retries", 1), warm_start=values.get("warm_start"), seed=values.get("seed"),
    )
    if strategy == "grid":
        for p in parameters:
            if p.type == "float" and p.step is None:
                raise error(f"sweep.parameters.{p.name}.step", "a step for a float range in a grid "
                            "(a grid visits a list of values)", None)
            if p.log:
                raise error(f"sweep.parameters.{p.name}.log", "no log scale in a grid (give choices or a step)",
                            True)
        size = spec.grid_size()
        if size > MAX_GRID:
            raise error("sweep.parameters", f"a grid of at most {MAX_GRID} points; this one has {size}", None)
        if "max_trials" not in values:
            spec = dataclasses.replace(spec, max_trials=size)
    elif "max_trials" not in values:
        raise error("sweep.max_trials", f"{scalars['max_trials'].expected} (required, except for a grid)", None)
    return spec


def grid_points(spec: SweepSpec) -> list[dict[str, Any]]:
    """Every point of a grid sweep, in order."""
    names = spec.names
    return [dict(zip(names, combo, strict=True))
            for combo in itertools.product(*(p.grid_values() for p in spec.parameters))]
