"""Specs written for a test: a job spec file (and the error loading it gives), a JobSpec asking
for GPUs, a pipeline's [[steps]], the sweep example's spec and the objective it must record."""

from __future__ import annotations

import functools
import importlib.util
import json
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import pytest

from tests.kit import EXAMPLES, JOBSCRIPTS
from tui.model.jobspec import JobSpec, JobSpecError, load_jobspec

SWEEP_EXAMPLE = EXAMPLES / "sweep"


class SpecWriter(Protocol):
    """Who writes a spec file for ``rigdeck``: a bed's ``Cli``, the server tests' ``Operator``."""

    def spec(self, name: str, body: str) -> Path: ...


def spec_file(tmp_path: Path, text: str, name: str = "job.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def load_error(tmp_path: Path, text: str) -> JobSpecError:
    """The error loading ``text`` as a spec file gives; it names the file."""
    path = spec_file(tmp_path, text)
    with pytest.raises(JobSpecError) as info:
        load_jobspec(path)
    assert info.value.path == path
    assert str(path) in str(info.value)
    return info.value


def gpu_job(name: str, nodes: int | None, gpus: int, hosts: Sequence[str] = ()) -> JobSpec:
    return JobSpec(
        name=name,
        command=("python", "train.py"),
        workdir="/w",
        nodes=nodes,
        hosts=tuple(hosts),
        gpus_per_node=gpus,
    )


def pipeline_step(name: str, command: list[str], extra: str = "", job_extra: str = "") -> str:
    """A [[steps]] table whose job runs tests/jobscripts/pipeline_step.py."""
    argv = json.dumps(["{python}", "pipeline_step.py", *command])
    return (f'\n[[steps]]\nname = "{name}"\n{extra}\n[steps.job]\ncommand = {argv}\n'
            f'workdir = "{JOBSCRIPTS}"\nmax_runtime = "3m"\n{job_extra}\n')


def steps_of(out: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A pipeline's detail (``--json``): its steps by name."""
    return {s["name"]: s for s in out["steps"]}


def sweep_spec(cli: SpecWriter, name: str, *, trials: int, parallel: int | None = 3, strategy: str = "random",
               steps: int = 8, step_s: float = 0.1, report: str = "runtime", extra: str = "",
               metric: str = "val_loss", seed: int = 3) -> Path:
    """The sweep example (examples/sweep: an objective known in advance) as a spec ``cli`` wrote."""
    par = f"max_parallel = {parallel}\n" if parallel else ""
    return cli.spec(name, f"""
command = ["{{python}}", "objective.py", "--lr", "{{hp.lr}}", "--width", "{{hp.width}}",
           "--optimizer", "{{hp.optimizer}}", "--steps", "{steps}", "--step-seconds", "{step_s}",
           "--report", "{report}"]
workdir = "{SWEEP_EXAMPLE}"
gpus_per_node = 1
total_steps = {steps}
[sweep]
strategy = "{strategy}"
max_trials = {trials}
{par}seed = {seed}
objective = {{metric = "{metric}", goal = "minimize"}}
{extra}
[sweep.parameters]
lr = {{type = "float", low = 1e-4, high = 1.0, log = true}}
width = {{type = "int", low = 16, high = 256, step = 16}}
optimizer = {{type = "categorical", choices = ["sgd", "adam", "adamw"]}}
""")


@functools.cache
def _val_loss() -> Callable[[float, int, str, int], float]:
    # The example's own function, loaded from its file: the example stays a plain script (no
    # package, nothing of it on sys.path).
    spec = importlib.util.spec_from_file_location("sweep_objective", SWEEP_EXAMPLE / "objective.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.val_loss  # type: ignore[no-any-return]


def expected_objective(trial: dict[str, Any], steps: int) -> float:
    """The value a sweep trial (``--json``) of the example must have recorded after ``steps``."""
    p = dict(trial["params"])
    return _val_loss()(float(p["lr"]), int(p["width"]), str(p["optimizer"]), steps)
