"""What the benchmarks share.

The ones that run the ddp example on a test bed (launch, container, slurm):

The command line (``--rounds``, ``--steps``, ``--out``), the run's metadata (``bench/_meta.py``)
and the bed check (``bed_args``); the job spec they launch (``write_ddp_spec``); a job launched
through ``rigdeck launch`` (``launch``); and the ranks' per-step records (``read_metrics``, from
the example's ``runtime.report()`` lines) and the waits on them.

The ones that drive the controller's service or the app over made-up hosts, with no links
(exporter, ui, attach): ``StubController`` and ``StubMonitor``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._meta import run_meta  # noqa: E402
from tui.model.inventory import HostSpec, Inventory  # noqa: E402
from tui.model.state import ClusterState  # noqa: E402

SCRIPT = ROOT / "examples" / "ddp" / "train.py"
NODES, PER_NODE = 3, 2
Metrics = dict[int, list[dict]]


def bed_args(doc: str, name: str, steps: int, needs: str = "the test bed",
             *checks: Callable[[], tuple[bool, str]],
             options: Callable[[argparse.ArgumentParser], None] | None = None,
             ) -> tuple[argparse.Namespace, dict[str, Any]] | None:
    """Parse ``--rounds``, ``--steps`` (default ``steps``) and ``--out`` (bench/results/NAME.json),
    and what ``options`` adds; take the run's metadata, then check the bed (``checks``): None,
    and why on stderr, when it is not there."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / f"{name}.json"))
    if options is not None:
        options(ap)
    args = ap.parse_args()
    meta = run_meta()
    found = [check() for check in checks]
    if not all(ok for ok, _ in found):
        why = next((w for _, w in found if w), "")
        print(f"bench/{name}.py needs {needs}: {why}", file=sys.stderr)
        return None
    return args, meta


def bed_env(inv: Path, home: Path) -> dict[str, str]:
    """The environment of a ``rigdeck`` command on the bed's inventory, deployed first (as a user
    would have: this is about starting jobs, not installs)."""
    env = {**os.environ, "RIGDECK_INVENTORY": str(inv), "RIGDECK_HOME": str(home)}
    subprocess.run([sys.executable, "-m", "tui.cli", "deploy"], env=env, cwd=ROOT, check=True,
                   capture_output=True)
    return env


def write_ddp_spec(spec: Path, name: str, steps: int, per_node: str = "processes_per_node",
                   extra: str = "") -> Path:
    """The ddp example's job spec, NODES x PER_NODE (``per_node``: the key that says how many),
    torchrun, one thread a rank; ``extra``: tables after ``[env]``."""
    spec.write_text(
        f'name = "{name}"\n'
        f'command = ["{{python}}", "{SCRIPT}", "--steps", "{steps}", "--checkpoint-every", "100000"]\n'
        f'workdir = "{ROOT}"\nlauncher = "torchrun"\nnodes = {NODES}\n{per_node} = {PER_NODE}\n'
        '[env]\nOMP_NUM_THREADS = "1"\n'
        + extra
    )
    return spec


def launch(spec: Path, env: dict[str, str]) -> tuple[float, str]:
    """``rigdeck launch SPEC --json``: when it was run (Unix time) and the job's id."""
    t0 = time.time()
    out = subprocess.run([sys.executable, "-m", "tui.cli", "launch", str(spec), "--json"],
                         capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    return t0, json.loads(out.stdout)["job_id"]


def job_metrics(bed: Any, job_id: str) -> Callable[[], list[Path]]:
    """The job's metrics folders on every host of the bed."""
    return lambda: [h.state_dir / "jobs" / job_id / "metrics" for h in bed.hosts]


def read_metrics(dirs: list[Path]) -> Metrics:
    """Each rank's per-step records (those with a loss) in the folders."""
    out: Metrics = {}
    for d in dirs:
        for f in d.glob("rank-*.jsonl"):
            # runtime.report()'s rank-<N>.jsonl only: the agent keeps losses it parsed from a
            # rank's output in rank-<N>.stdout.jsonl beside it.
            rank_s = f.name[len("rank-"):-len(".jsonl")]
            if not rank_s.isdigit():
                continue
            recs = []
            for line in f.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if "loss" in rec and rec.get("event") is None:
                    recs.append(rec)
            out[int(rank_s)] = recs
    return out


def wait_metrics(dirs_fn: Callable[[], list[Path]], done: Callable[[Metrics], bool], timeout: float,
                 what: str) -> Metrics:
    """Read the ranks' records every 0.1 s until all NODES x PER_NODE ranks have some and
    ``done``; TimeoutError (``what`` did not happen) after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = read_metrics(dirs_fn())
        if len(m) == NODES * PER_NODE and done(m):
            return m
        time.sleep(0.1)
    raise TimeoutError(f"{what} in {timeout}s")


def wait_steps(dirs_fn: Callable[[], list[Path]], steps: int, timeout: float) -> Metrics:
    """Every rank's records, once each has ``steps`` of them."""
    return wait_metrics(dirs_fn, lambda m: all(len(v) >= steps for v in m.values()), timeout,
                        f"ranks did not reach {steps} steps")


def wait_first_steps(dirs_fn: Callable[[], list[Path]], timeout: float) -> float:
    """When the last of the ranks reported its first step (Unix time)."""
    m = wait_metrics(dirs_fn, lambda m: all(m.values()), timeout, "the ranks did not all report a step")
    return max(recs[0]["time"] for recs in m.values())


def summarize(m: Metrics, t0: float) -> tuple[float, float]:
    """From ``t0`` to the last rank's first step (s), and rank 0's steps/s over its last four
    fifths of steps."""
    first = max(recs[0]["time"] for recs in m.values())
    r0 = m[0][len(m[0]) // 5:]  # steady state: skip the first fifth (warm-up, stragglers)
    rate = (len(r0) - 1) / (r0[-1]["time"] - r0[0]["time"])
    return first - t0, rate


def training_s(m: Metrics) -> float:
    """Rank 0's training time: from its first step's report to its last's (every step, warm-up
    included; the launch before it is ``summarize``'s)."""
    return float(m[0][-1]["time"] - m[0][0]["time"])


class StubController:
    """A controller of N made-up hosts (gpu000, gpu001, ...; ``host``: more of each HostSpec) that
    reaches none of them."""

    def __init__(self, n: int, **host: Any):
        hosts = tuple(
            HostSpec(name=f"gpu{i:03d}", address=f"10.0.{i // 250}.{i % 250 + 1}", **host) for i in range(n)
        )
        self.inventory = Inventory(
            hosts=hosts, path=Path(f"/bench/{n}-hosts.toml"), known_hosts=Path("/dev/null")
        )

    def close(self) -> None:
        pass


class StubMonitor:
    """A monitor that samples nothing: the bench fills ``state`` itself."""

    rate_hz = 1.0

    def __init__(self, state: ClusterState):
        self.state = state

    def start(self) -> StubMonitor:
        return self

    def stop(self, timeout: float = 0.0) -> None:
        pass

    def reconnect(self, host: str) -> None:
        pass
