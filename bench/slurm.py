"""Launch to first step through rigdeck on Slurm against a hand-written sbatch + srun torchrun.

A Slurm bed (tests/slurmbed.py: a real slurmctld and slurmd per host, simulated GPUs as GRES),
3 nodes x 2 GPUs, the ddp example (gloo on CPU), torchrun on every node.
- rigdeck:   `rigdeck launch job.toml` with `[slurm]` in the inventory: the [slurm] check, sbatch
             through the login host's agent, the allocation read, the plans to the agents, the job
             host started by srun in the step, cluster files, torchrun.
- baseline:  what a person writes by hand: one batch script that finds the first node's address
             with scontrol and runs `srun --ntasks-per-node=1 sh -c 'torchrun --node-rank
             $SLURM_NODEID --master-addr ADDR ...'` (the bed's node names do not resolve, so no
             c10d rendezvous by name), submitted with `sbatch -N 3 --gres=gpu:2` on the login host.
Both sides time their steps the same way: the example's `runtime.report()` lines (the baseline
gets RIGDECK_METRICS_DIR, so its ranks write the same per-step timestamps). Launch latency = time
from the command to the last rank's first step. Each round launches once on each side, who goes
first taking turns; the medians are reported with their ratio (rigdeck / by hand), and each
round's own ratio beside them.

Then what Slurm's state costs the app, on a second bed of ``--refresh-nodes`` hosts (64), each a
Slurm node (its own slurmd): the app (in process, headless, as `make run` opens it on an
inventory with ``[slurm]``) on the Hosts view, with every host's agent streaming telemetry. Per
read of Slurm's nodes (the view's timer does one every POLL_S = 10 s; here ``--refreshes`` more
are asked for in a row): the CPU of the worker thread that asks the login host's agent for
``scontrol -o show nodes`` and parses the answer (``time.thread_time``), and the UI thread's CPU
to fold it into the hosts table and the detail (index, rows, cells). Beside it, the whole app's
CPU per second on that bed over ``--window`` seconds (telemetry of every host, the views'
refreshes; ``time.process_time``), which Slurm's share is compared with, and what the commands
cost on the hosts: ``scontrol -o show nodes`` on the login host per read, and each agent's own
``scontrol -d -o show node <itself>`` (agent/slurmnode.py, at most once per 5 s per host).
CPU, not wall time: the figures hold on a loaded machine. Needs root (the test bed).
Usage: python bench/slurm.py [--rounds 3] [--steps 40] [--refresh-nodes 64] [--refreshes 20]
       [--window 20]  (``--rounds 0``: the refresh part only; ``--refresh-nodes 0``: no refresh part)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._meta import write_result  # noqa: E402
from bench.common import (  # noqa: E402
    NODES,
    PER_NODE,
    SCRIPT,
    bed_args,
    bed_env,
    job_metrics,
    launch,
    wait_first_steps,
    write_ddp_spec,
)
from tests import slurmbed  # noqa: E402
from tests.slurmbed import SlurmBed  # noqa: E402
from tests.testbed import TestBed, available  # noqa: E402

# The hand-written batch script: every value it needs comes in its environment (sbatch --export).
BY_HAND = """#!/bin/sh
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
addr=$(scontrol -o show node "$first" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')
exec srun --ntasks-per-node=1 sh -c 'exec "$PY" -m torch.distributed.run --nnodes "$SLURM_NNODES" \\
  --nproc-per-node 2 --node-rank "$SLURM_NODEID" --master-addr "$0" --master-port "$PORT" \\
  "$TRAIN" --steps "$STEPS" --checkpoint-every 100000 --checkpoint-dir "$CKPT"' "$addr"
"""


def wait_gone(slurm: SlurmBed, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while slurm.jobs() and time.monotonic() < deadline:
        time.sleep(0.2)


SETTLE_S = 2.0


def settle(slurm: SlurmBed, timeout: float = 120) -> None:
    """Before each launch, either side: the last job gone from Slurm, every node idle again (its
    epilog done, not COMPLETING) and SETTLE_S of quiet. Without it the side that goes right after
    the other's job pays for that job's end: a launch straight after a job by hand had Slurm start
    its step 1.5-2 s later than after a rigdeck job, whose launch ran `rigdeck status` after it."""
    wait_gone(slurm, timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = slurm.run(["sinfo", "-h", "-N", "-o", "%T"]).stdout.split()
        if states and all(st == "idle" for st in states):
            break
        time.sleep(0.2)
    time.sleep(SETTLE_S)


def run_rigdeck(bed: TestBed, slurm: SlurmBed, tmp: Path, steps: int, env: dict[str, str]) -> float:
    t0, job_id = launch(write_ddp_spec(tmp / "job.toml", "bench-slurm", steps, "gpus_per_node"), env)
    dirs = job_metrics(bed, job_id)
    first = wait_first_steps(dirs, 600)
    wait_gone(slurm)  # the job ran to its end (then rigdeck records it, at the next look)
    subprocess.run([sys.executable, "-m", "tui.cli", "status", job_id], capture_output=True, env=env, cwd=ROOT)
    return first - t0


def run_by_hand(slurm: SlurmBed, tmp: Path, steps: int, port: int) -> float:
    mdir = Path(tempfile.mkdtemp(dir=tmp))
    ckpt = Path(tempfile.mkdtemp(dir=tmp))
    script = tmp / "by-hand.sh"
    script.write_text(BY_HAND)
    script.chmod(0o755)
    exports = {"PY": sys.executable, "TRAIN": str(SCRIPT), "STEPS": str(steps), "CKPT": str(ckpt),
               "PORT": str(port), "RIGDECK_METRICS_DIR": str(mdir), "OMP_NUM_THREADS": "1",
               "GLOO_SOCKET_IFNAME": "eth0", "PYTHONPATH": str(ROOT)}
    t0 = time.time()
    slurm.run(["env", *[f"{k}={v}" for k, v in exports.items()], "sbatch", "--parsable", "-N", str(NODES),
               "--ntasks-per-node=1", f"--gres=gpu:{PER_NODE}", "--export=ALL", f"--output={tmp}/by-hand-%j.out",
               str(script)])
    try:
        first = wait_first_steps(lambda: [mdir], 300)
    except TimeoutError:
        for out in tmp.glob("by-hand-*.out"):
            print(f"--- {out.name}\n" + "\n".join(out.read_text().splitlines()[-20:]), file=sys.stderr)
        raise
    wait_gone(slurm)
    return first - t0


# The CPU seconds (user + system) of a command on a bed host, by its own rusage.
_RUSAGE = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], capture_output=True, check=True); "
           "r = resource.getrusage(resource.RUSAGE_CHILDREN); print(r.ru_utime + r.ru_stime)")


def command_cpu(slurm: SlurmBed, host: int, argv: list[str], times: int = 10) -> float:
    """Median CPU seconds of ``argv`` run on bed host ``host`` (``times`` runs)."""
    return statistics.median(float(slurm.run(["python3", "-c", _RUSAGE, *argv], host).stdout)
                             for _ in range(times))


async def app_refreshes(inv: Path, keymap: Path, n: int, refreshes: int, window: float) -> dict[str, Any]:
    """The app on ``inv`` (``n`` hosts, ``[slurm]``), Hosts view: CPU per read of Slurm's nodes
    (worker thread) and per fold into the view (UI thread), and the app's CPU per second."""
    from tests.kit.pilot import until
    from tui.app.shell import RigdeckApp
    from tui.app.views import hosts as hosts_view
    from tui.app.widgets.tables import HostsTable
    from tui.client import InProcessClient
    from tui.remote.inventoryfile import load_inventory

    reads: list[float] = []
    folds: list[float] = []
    app = RigdeckApp(InProcessClient(load_inventory(inv)), keymap_file=keymap)
    async with app.run_test(size=(200, 80)) as pilot:
        view = app.views["hosts"]
        assert isinstance(view, hosts_view.HostsView)
        real_read = view.reader.read

        def timed_read(exec_: Any, inventory: Any) -> Any:
            t0 = time.thread_time()
            try:
                return real_read(exec_, inventory)
            finally:
                reads.append(time.thread_time() - t0)

        view.reader.read = timed_read  # this app's own reader: nothing to put back
        real_done = view.worker_done

        def timed_done(result: Any, error: str | None = None) -> None:
            t0 = time.thread_time()
            real_done(result, error)
            folds.append(time.thread_time() - t0)

        view.worker_done = timed_done  # type: ignore[method-assign]
        await pilot.press("1")
        table = app.query_one("#hosts-table", HostsTable)

        def every_node_shown() -> bool:
            shown = app.hosts_snapshot
            try:
                return (len(shown) == n and all(h.status == "up" for h in shown)
                        and all(table.cell_text(h.name, "slurm") not in ("", "?") for h in shown))
            except KeyError:  # a row not in the table yet
                return False
        await until(pilot, every_node_shown, 300)
        if not every_node_shown():
            raise SystemExit(f"the app did not show {n} hosts up with their Slurm state within 300 s")
        await pilot.pause(3)
        c0, w0 = time.process_time(), time.monotonic()
        await pilot.pause(window)
        app_cpu_per_s = (time.process_time() - c0) / (time.monotonic() - w0)
        reads.clear()
        folds.clear()
        first = view.slurm_reads
        for i in range(1, refreshes + 1):
            view.poll()
            await until(pilot, lambda k=first + i: view.slurm_reads >= k, 30)  # type: ignore[misc]
            await pilot.pause(0.2)
        states = sorted({table.cell_text(h.name, "slurm") for h in app.hosts_snapshot})
    return {"hosts": n, "reads": len(reads), "read_cpu_s": reads, "fold_cpu_s": folds,
            "app_cpu_per_s": app_cpu_per_s, "window_s": window, "slurm_states_shown": states}


def refresh_cost(n: int, refreshes: int, window: float) -> dict[str, Any]:
    """The refresh part, on a bed of ``n`` hosts that are each a Slurm node."""
    with TestBed(n, sim_gpus=2) as bed, tempfile.TemporaryDirectory(dir="/tmp") as tmpd:
        tmp = Path(tmpd)
        tmp.chmod(0o755)
        slurm = SlurmBed(bed, start_timeout=max(60.0, 3.0 * n)).up()
        try:
            inv = bed.write_inventory(tmp / "hosts.toml", python=sys.executable)
            inv.write_text(inv.read_text() + '\n[slurm]\nlogin = "h1"\npartition = "bed"\n')
            env = bed_env(inv, tmp / "home")
            os.environ.update(RIGDECK_INVENTORY=env["RIGDECK_INVENTORY"], RIGDECK_HOME=env["RIGDECK_HOME"])
            app = asyncio.run(app_refreshes(inv, tmp / "keys.toml", n, refreshes, window))
            app["login_scontrol_cpu_s"] = command_cpu(slurm, 1, ["scontrol", "-o", "show", "nodes"])
            app["agent_scontrol_cpu_s"] = command_cpu(slurm, n, ["scontrol", "-d", "-o", "show", "node",
                                                                  slurm.node(n)])
        finally:
            slurm.down()
    return app


def print_refresh(r: dict[str, Any]) -> None:
    from tui.app.views.hosts import HostsView

    read, fold = statistics.median(r["read_cpu_s"]), statistics.median(r["fold_cpu_s"])
    per_s = (read + fold) / HostsView.POLL_S
    agents = r["hosts"] * r["agent_scontrol_cpu_s"] / 5.0
    print(f"\nthe app's refresh with Slurm's state, {r['hosts']} Slurm nodes (bed hosts), median of {r['reads']} reads")
    print(f"  worker thread (ask the login agent, parse {r['hosts']} nodes): {read * 1e3:.1f} ms CPU per read")
    print(f"  UI thread (index, hosts table, detail):             {fold * 1e3:.1f} ms CPU per read")
    print(f"  every {HostsView.POLL_S:g} s: {per_s * 1e3:.2f} ms CPU per second, against the app's whole "
          f"{r['app_cpu_per_s'] * 1e3:.0f} ms per second on this bed ({per_s / r['app_cpu_per_s']:.1%})")
    print(f"  on the hosts: scontrol -o show nodes {r['login_scontrol_cpu_s'] * 1e3:.1f} ms CPU per read (login host); "
          f"each agent's own node read {r['agent_scontrol_cpu_s'] * 1e3:.1f} ms per 5 s "
          f"({agents * 1e3:.1f} ms per second for all {r['hosts']})")
    print(f"  Slurm states shown: {', '.join(r['slurm_states_shown'])}")


def refresh_options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--refresh-nodes", type=int, default=64)
    ap.add_argument("--refreshes", type=int, default=20)
    ap.add_argument("--window", type=float, default=20.0)


def main() -> int:
    parsed = bed_args(__doc__, "slurm", 40, "the test bed and Slurm", available, slurmbed.available,
                      options=refresh_options)
    if parsed is None:
        return 2
    args, meta = parsed
    result: dict[str, Any] = {}
    if args.rounds > 0:
        result.update(launch_rounds(args))
    if args.refresh_nodes > 0:
        refresh = refresh_cost(args.refresh_nodes, args.refreshes, args.window)
        print_refresh(refresh)
        result["refresh"] = refresh
    write_result(args.out, result, meta)
    return 0


def launch_rounds(args: argparse.Namespace) -> dict[str, Any]:
    """The launch part: rounds of one launch each side, who goes first taking turns."""
    with TestBed(NODES, sim_gpus=4) as bed, tempfile.TemporaryDirectory(dir="/tmp") as tmpd:
        tmp = Path(tmpd)
        tmp.chmod(0o755)
        slurm = SlurmBed(bed).up()
        try:
            inv = bed.write_inventory(tmp / "hosts.toml", python=sys.executable)
            inv.write_text(inv.read_text() + '\n[slurm]\nlogin = "h1"\npartition = "bed"\n')
            env = bed_env(inv, tmp / "home")
            ours, hand, firsts = [], [], []
            for r in range(args.rounds):
                # Who goes first takes turns: neither side always starts right after the other's
                # job ended (its processes and Slurm's epilog still leaving the CPU).
                first_side = "by hand" if r % 2 == 0 else "rigdeck"
                firsts.append(first_side)
                for side in ((0, 1) if first_side == "by hand" else (1, 0)):
                    settle(slurm)
                    if side == 0:
                        hand.append(run_by_hand(slurm, tmp, args.steps, 29400 + r))
                    else:
                        ours.append(run_rigdeck(bed, slurm, tmp, args.steps, env))
                print(f"round {r + 1} ({first_side} first): by hand {hand[-1]:.2f}s | rigdeck {ours[-1]:.2f}s",
                      flush=True)
        finally:
            slurm.down()
    lat_h, lat_o = statistics.median(hand), statistics.median(ours)
    paired = [o / h for o, h in zip(ours, hand, strict=True)]
    print(f"\n{NODES} Slurm nodes x {PER_NODE} GPUs (simulated), ddp example, median of {args.rounds}")
    print(f"  launch to every rank's first step: sbatch + srun torchrun by hand {lat_h:.2f} s, "
          f"rigdeck on Slurm {lat_o:.2f} s, ratio {lat_o / lat_h:.3f}x; each round's own ratio "
          f"{[round(x, 3) for x in paired]}, median {statistics.median(paired):.3f}x")
    return {"rounds": args.rounds, "steps": args.steps, "by_hand_s": hand, "rigdeck_s": ours, "first": firsts,
            "median": {"launch_by_hand_s": lat_h, "launch_rigdeck_s": lat_o}, "ratio_launch": lat_o / lat_h,
            "round_ratios": paired, "median_round_ratio": statistics.median(paired)}


if __name__ == "__main__":
    sys.exit(main())
