"""The example jobs, launched as they are with `rigdeck launch` across 3 test bed hosts. The
model-parallel example against one process: test_examples_pipeline_e2e.py; a checkpoint owner's
host dying mid-run: test_examples_owner_e2e.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.kit import EXAMPLES
from tests.kit.bedcli import Cli

# The examples stay as they are: mpirun reaches the other hosts with the bed's key through the
# inventory's per-host environment; and they train for a while, so a launch --wait may take its
# time (240 s), and still says where it hung before pytest's own limit (300 s) cuts the test short.
CLI_OPTIONS = {"mpi_ssh": True, "timeout": 240}
pytestmark = [pytest.mark.testbed, pytest.mark.cli_options(**CLI_OPTIONS)]


def losses(metrics: list[dict[str, Any]], rank: int = 0) -> list[tuple[int, float]]:
    return [(m["step"], m["loss"]) for m in metrics
            if m.get("rank") == rank and m.get("loss") is not None and m.get("event") is None]


@pytest.mark.parametrize("example", ["ddp", "mpi", "sharded", "sagemaker-script"])
def test_example_runs_across_three_hosts(cli: Cli, example: str) -> None:
    view = cli.json("launch", str(EXAMPLES / example / "job.toml"), "--wait")
    assert view["state"] == "succeeded", json.dumps(view, indent=1)[-3000:]
    assert len({n["host"] for n in view["placement"]}) == 3
    metrics = cli.json("metrics", view["job_id"])
    if example == "ddp":
        steps = [m for m in metrics if m.get("loss") is not None and m.get("event") is None]
        keys = [(m["rank"], m["step"]) for m in steps]
        assert len(keys) == len(set(keys)), "a step appeared twice"
        assert {r for r, _ in keys} == set(range(6))
        curve = losses(metrics)
        first = sum(v for _, v in curve[:10]) / 10
        last = sum(v for _, v in curve[-10:]) / 10
        assert last < 0.6 * first, (first, last)
        assert any(m.get("event") == "checkpoint" and m.get("status") == "done" for m in metrics)
