"""The healing tests' pieces (tests/test_healing*.py): their training loop, a job's step
records, a running job found by its step, a simulated GPU's fault written and read, and the
rigdeck processes (controllers) of a test's home."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.kit import JOBSCRIPTS, wait_until
from tests.kit.bedcli import Cli

TRAIN = JOBSCRIPTS / "heal_train.py"


def step_keys(metrics: list[dict[str, Any]]) -> list[tuple[int, int]]:
    return [(m["rank"], m["step"]) for m in metrics if m.get("event") is None and m.get("step") is not None]


def running_at_step(cli: Cli, name: str, step: int) -> str:
    """The id of the job ``name`` once its rank 0 has reported ``step``, read from its metrics
    file on its host (at most 120 s): a CLI call per look takes seconds on a loaded machine, and
    these jobs last about ten, so a fault meant for their steps would come after them."""
    job_id = wait_until(lambda: next((j["job_id"] for j in cli.json("jobs") if j["name"] == name), None), 120,
                        f"the job {name}")

    def reached() -> bool:
        for h in cli.bed.hosts:
            path = h.state_dir / "jobs" / job_id / "metrics" / "rank-0.jsonl"
            try:
                lines = path.read_text().splitlines()
            except OSError:
                continue
            for line in reversed(lines):
                try:
                    m = json.loads(line)
                except ValueError:
                    continue
                if m.get("event") is None and isinstance(m.get("step"), int):
                    return bool(m["step"] >= step)
        return False

    wait_until(reached, 120, f"the job's step {step}", step=0.05)
    return str(job_id)


def placement_on_the_bed(cli: Cli, job_id: str) -> list[str]:
    """The hosts of ``job_id``'s attempt now, in node order, from its plan on its hosts (no CLI
    call)."""
    for h in cli.bed.hosts:
        try:
            plan = json.loads((h.state_dir / "jobs" / job_id / "plan.json").read_text())
        except (OSError, ValueError):
            continue
        return [str(n["host"]) for n in plan["nodes"]]
    raise AssertionError(f"no plan of {job_id} on any host of the bed")


def host_index(cli: Cli, name: str) -> int:
    return next(i for i, h in enumerate(cli.bed.hosts, start=1) if h.name == name)


def write_faults(cli: Cli, host: str, faults: dict[str, Any]) -> None:
    """The simulated GPUs of ``host`` fail as ``faults`` says (``{}``: none does)."""
    path = cli.bed.hosts[host_index(cli, host) - 1].state_dir / "sim-gpu-faults.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(faults))
    tmp.replace(path)


def gpu_report(cli: Cli, host: str, index: int) -> dict[str, Any]:
    (report,) = cli.json("hosts", host)
    return next(g for g in report["gpus"] if g["index"] == index)


def controllers(home: Path) -> list[str]:
    """rigdeck's processes on this machine that work in ``home`` (the app, the CLI, a server: a
    controller of this test's jobs), found by their environment."""
    needle = f"RIGDECK_HOME={home}".encode()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            env, argv = (d / "environ").read_bytes(), (d / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(f"{d.name}: {argv.replace(bytes(1), b' ').decode('utf-8', 'replace')}")
    return found
