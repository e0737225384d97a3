"""The model-parallel example (examples/pipeline/) from its spec across 3 test bed hosts, one
stage per host, on both schedules, against the same model trained in one process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.kit import EXAMPLES
from tests.kit.bedcli import Cli

# The examples stay as they are: mpirun reaches the other hosts with the bed's key through the
# inventory's per-host environment; and they train for a while, so a launch --wait may take its
# time (240 s), and still says where it hung before pytest's own limit (300 s) cuts the test short.
CLI_OPTIONS = {"mpi_ssh": True, "timeout": 240}
pytestmark = [pytest.mark.testbed, pytest.mark.cli_options(**CLI_OPTIONS)]


def _single_process_losses(steps: int, seed: int = 0, batch: int = 128, lr: float = 0.01) -> list[float]:
    """The pipeline example's model and data, whole, in this one process: the loss each step."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("pipeline_example", EXAMPLES / "pipeline" / "train.py")
    assert spec and spec.loader
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    model = torch.nn.Sequential(*ex.build_blocks(seed, 256, 9, 4, 4))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    out = []
    for step in range(steps):
        x, y = ex.make_batch(seed, step, batch)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def test_pipeline_example_runs_from_its_spec_with_both_schedules_and_matches_one_process(
        cli: Cli, tmp_path: Path) -> None:
    """The model-parallel example from its spec alone, one stage per host: rank 0 profiles, the
    plan cuts the unbalanced model, and training follows the single-process loss of the same model
    and seed, on the spec's interleaved schedule (1F1B) and on the simple one (GPipe)."""
    text = (EXAMPLES / "pipeline" / "job.toml").read_text()
    assert 'pipeline = "interleaved"' in text and '"--steps", "200"' in text
    # The example's spec as it is but for its length (40 steps of its 200: the suite's budget),
    # and once more with the other schedule.
    text = text.replace('"--steps", "200"', '"--steps", "40"').replace(
        'workdir = "."', f'workdir = "{EXAMPLES / "pipeline"}"')
    specs = {"interleaved": tmp_path / "interleaved.toml", "simple": tmp_path / "simple.toml"}
    specs["interleaved"].write_text(text)
    specs["simple"].write_text(text.replace('pipeline = "interleaved"', 'pipeline = "simple"'))
    steps = 40
    reference = _single_process_losses(steps)
    for schedule, spec in specs.items():
        view = cli.json("launch", str(spec), "--wait")
        assert view["state"] == "succeeded", json.dumps(view, indent=1)[-3000:]
        assert sorted(n["host"] for n in view["placement"]) == ["h1", "h2", "h3"]
        metrics = cli.json("metrics", view["job_id"])
        (plan,) = [m["plan"] for m in metrics if m.get("event") == "mp_plan"]
        assert (plan["source"], plan["schedule"], plan["partitions"], plan["blocks"]) == ("profiled", schedule, 3, 9)
        # The heavy block (4) is not with as many others as the equal split puts with it.
        assert max(s["time_s"] for s in plan["stages"]) < plan["equal_split"]["max_time_s"], plan
        reported = {(m["rank"], m["host"]) for m in metrics if m.get("event") == "mp_stage"}
        assert {r for r, _ in reported} == {0, 1, 2} and len({h for _, h in reported}) == 3
        curve = [(m["step"], m["loss"]) for m in metrics
                 if m.get("rank") == 2 and m.get("loss") is not None and m.get("event") is None]
        assert [s for s, _ in curve] == list(range(steps))
        got = [v for _, v in curve]
        assert got == pytest.approx(reference, rel=1e-4, abs=1e-6), (schedule, got[:5], reference[:5])
        assert sum(got[-5:]) / 5 < 0.6 * sum(got[:5]) / 5, got  # it learns
        status = cli.json("status", view["job_id"])
        assert [s["blocks"] for s in status["stages"]["stages"]] == [s["blocks"] for s in plan["stages"]]
        assert all(s["peak_bytes"] and s["busy_s"] for s in status["stages"]["stages"]), status["stages"]
        print(f"{schedule}: cuts {plan['cuts']} (equal split {plan['equal_split']['cuts']}), loss "
              f"{got[0]:.5f} -> {got[-1]:.5f}, single process {reference[0]:.5f} -> {reference[-1]:.5f}, "
              f"largest difference {max(abs(a - b) for a, b in zip(got, reference, strict=True)):.2e}")
