"""Screenshots of the app for the README, from a real run: ``python -m tests.screenshots``.

Brings up a 3-host test bed (simulated GPUs, needs root), opens the app headless on it, launches
the ddp example on two hosts from the launch dialog (2 GPUs per host, ranks started by the agent;
checkpoint owner ``host:h3/gpu:0``, so the ownership moves to rank 0 on a host of the run, as
after a restart without h3), starts a foreign process on h3's GPU 1, and once the job has
trained for a while and saved checkpoints,
saves every main view (the cluster map too) and the launch and stop dialogs as SVG and PNG
into ``screenshots/``.
Then it stops the job from the app, runs a short hyperparameter sweep through the app's client
(examples/sweep with fewer trials and steps: every trial a real job on the bed) and, once some
trials completed, saves the Sweeps view with that sweep selected; then the example pipeline, and
last the Doctor view (h3's link rate-limited); then tears the bed down.
``--only sweeps`` makes the sweeps screenshot alone (no training job: a minute, not ten);
``--only pipelines`` the Pipelines view alone (the example pipeline run twice);
``--only doctor`` the Doctor view alone (h3's link rate-limited with ``tc ... tbf`` both ways,
then ``D``: the doctor's measurement jobs on the bed).
Last, the onboarding screen (no inventory, a fixture ssh config under a fresh HOME, three of its
hosts checked); ``--only onboarding`` makes that one alone. ``--only signals``: the Job view of a
3-host job whose rank 1 sleeps in every step (tests/jobscripts/signals_probe.py), once the
straggler signal names it (``signals.svg``; not part of the full run). ``--only stages``: the Job
view of the pipeline example (examples/pipeline/job.toml, a ``[model_parallel]`` job: profiling,
plan, training on 3 hosts; ``--stages-spec`` another spec) once every stage has reported its
measurements (``stages.svg``; not part of the full run). ``--only pools``: the Job view of a job
made of worker pools (``--pools-spec``, default a 4-pool ticker job with a reduction server and an
evaluator) once every pool's replicas run and its evaluator, killed, is reported while training
goes on (``pools.svg``; not part of the full run). ``--only processing``: the Job view of
examples/processing (its data split by file over the 3 hosts) once it ended, with its processing
panel (``processing.svg``; not part of the full run). ``--only healing``: the ddp example on h1
and h2 with restarts to spend; an XID 79 written for the simulated GPU of its rank 1 once it saved
two checkpoints, and, once rigdeck has restarted it from its checkpoint on healthy GPUs and it
stepped on, h3 GPU 2 drained by hand: the GPU view, the map and the Job view (its incident and
goodput) as ``healing-gpus.svg``, ``healing-map.svg`` and ``healing-job.svg`` (not part of the full
run). ``--only usage``: jobs of alice and bob (4, 1 and 4 simulated GPUs, at once) launched through
the app's controller with each as owner, then the Usage view (``usage.svg``; not part of the full
run). ``--only slurm``: a real Slurm on the bed (tests/slurmbed.py) and an inventory with
``[slurm]``: another user's Slurm jobs (one holding 2 of h2's GPUs, one pending), h3's node
drained with a reason, a rigdeck job launched through Slurm; the Hosts, GPU and Jobs views as
``slurm-hosts.svg``, ``slurm-gpus.svg`` and ``slurm-jobs.svg`` (not part of the full run).

PNGs come from ``rsvg-convert`` (Debian: librsvg2-bin) with the Fira Code font the SVGs name
(fonts-firacode); both are installed with apt-get when missing and this runs as root.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "screenshots"
DDP = ROOT / "examples" / "ddp" / "job.toml"
SWEEP = ROOT / "examples" / "sweep" / "sweep.toml"
PIPELINE = ROOT / "examples" / "pipeline-steps"
TICKER = ROOT / "tests" / "jobscripts" / "ticker.py"
SIGNALS_PROBE = ROOT / "tests" / "jobscripts" / "signals_probe.py"
MP_EXAMPLE = ROOT / "examples" / "pipeline" / "job.toml"
SIZE = (140, 40)

_TEXT = re.compile(
    r'<text([^>]*?) x="([0-9.]+)"([^>]*?) textLength="([0-9.]+)"([^>]*)>([^<]*)</text>'
)


def ensure_converter() -> str:
    """rsvg-convert's path, installing it (and the font the SVGs use) when missing and root."""
    need = []
    if shutil.which("rsvg-convert") is None:
        need.append("librsvg2-bin")
    if (
        subprocess.run(["fc-list", "Fira Code"], capture_output=True, text=True).stdout.strip()
        == ""
    ):
        need.append("fonts-firacode")
    if need and os.geteuid() == 0 and shutil.which("apt-get"):
        print(f"installing {' '.join(need)}", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *need],
            env=env,
            check=True,
        )
    path = shutil.which("rsvg-convert")
    if path is None:
        raise SystemExit(
            "rsvg-convert not found: apt-get install librsvg2-bin (and fonts-firacode)"
        )
    return path


def for_raster(svg: str) -> str:
    """The SVG as rsvg renders it right: spaces kept, and runs of characters the monospace font
    lacks (the chart's braille) placed one cell at a time instead of squeezed by a fallback font."""
    svg = svg.replace("<svg ", '<svg xml:space="preserve" ', 1)

    def split(m: re.Match[str]) -> str:
        pre, x, mid, length, post, body = m.groups()
        chars = html.unescape(body)
        if not any(0x2800 <= ord(c) <= 0x28FF for c in chars) or len(chars) < 2:
            return m.group(0)
        cell = float(length) / len(chars)
        return "".join(
            f'<text{pre} x="{float(x) + i * cell:.1f}"{mid} textLength="{cell:.1f}"{post}>'
            f"{html.escape(c)}</text>"
            for i, c in enumerate(chars)
            if c != " "
        )

    return _TEXT.sub(split, svg)


def to_png(svg_path: Path, converter: str) -> Path:
    png = svg_path.with_suffix(".png")
    with tempfile.NamedTemporaryFile("w", suffix=".svg", delete=False) as tmp:
        tmp.write(for_raster(svg_path.read_text()))
    try:
        subprocess.run([converter, "-o", str(png), tmp.name], check=True)
    finally:
        os.unlink(tmp.name)
    return png


def job_spec(tmp: Path) -> Path:
    from tui.model.specform import read_spec_data
    from tui.model.tomlwrite import dumps

    out = tmp / "ddp.toml"
    if DDP.exists():
        data = read_spec_data(DDP)
        data["workdir"] = str((DDP.parent / str(data.get("workdir", "."))).resolve())
        data.pop("nodes", None)
        data["hosts"] = ["h1", "h2"]
        # Two (simulated) GPUs per host instead of two processes, one rank started per GPU by
        # the agent itself: the GPU view attributes each rank to its own GPU.
        data.pop("processes_per_node", None)
        data["gpus_per_node"] = 2
        data["launcher"] = "direct"
        cmd = [str(c) for c in data["command"]]
        if "--checkpoint-every" in cmd:
            cmd[cmd.index("--checkpoint-every") + 1] = "50"
        if "--steps" in cmd:  # long enough to be caught running
            cmd[cmd.index("--steps") + 1] = "1200"
        data["command"] = cmd
        data["total_steps"] = 1200
        data["checkpoint"] = {"dir": str(tmp / "ckpt"), "owner": "host:h3/gpu:0"}
    else:
        data = {
            "name": "ticker",
            "command": ["{python}", str(TICKER), "--steps", "600", "--sleep", "0.2"],
            "workdir": str(ROOT),
            "hosts": ["h1", "h2"],
            "processes_per_node": 2,
            "total_steps": 600,
        }
    out.write_text(dumps(data))
    return out


def sweep_spec(tmp: Path) -> Path:
    """examples/sweep, short: 12 trials of 30 steps at 0.3 s a step, four at a time, median
    pruning; one (simulated) GPU per trial."""
    from tui.model.specform import read_spec_data
    from tui.model.tomlwrite import dumps

    data = read_spec_data(SWEEP)
    data["workdir"] = str((SWEEP.parent / str(data.get("workdir", "."))).resolve())
    data["command"] = [str(c) for c in data["command"]] + ["--step-seconds", "0.3"]
    data["hyperparameters"]["steps"] = 30
    data["total_steps"] = 30
    data["max_runtime"] = "5m"
    sweep = data["sweep"]
    sweep.update(max_trials=12, max_parallel=4, early_stopping="median")
    out = tmp / "sweep.toml"
    out.write_text(dumps(data))
    return out


async def run_sweep(app: Any, pilot: Any, tmp: Path, converter: str, shots: list[Path],
                    until: Any) -> None:
    """Start the short sweep through the app's client (off the app's loop: starting its first
    trials places them on the hosts), show the Sweeps view, and capture it once at least six
    trials completed (or the sweep ended)."""
    from tui.model.jobspec import load_jobspec

    spec = load_jobspec(sweep_spec(tmp))
    detail = await asyncio.to_thread(app.client.sweep, spec)
    sweep_id = detail.row.sweep_id
    print(f"sweep {sweep_id}: {detail.row.max_trials} trials", flush=True)
    await pilot.press("7")

    def progress() -> tuple[int, str]:
        row = next((r for r in app.sweep_list if r.sweep_id == sweep_id), None)
        return (0, "") if row is None else (row.completed, row.state)

    await until(
        lambda: progress()[0] >= 6 or progress()[1] in ("completed", "stopped", "failed"),
        "six trials of the sweep",
        240,
    )
    await pilot.press("enter")  # into the trials, the cursor on the best
    app.query_one("#trials-table").move_cursor(row=0)
    await pilot.pause(1.5)
    await capture(app, pilot, "sweeps", converter, shots)
    print(f"sweep {sweep_id}: {progress()[0]} trials completed at the screenshot", flush=True)
    row = next((r for r in app.sweep_list if r.sweep_id == sweep_id), None)
    if row is not None and row.state in ("running", "stopping"):
        await asyncio.to_thread(app.client.sweep_stop, sweep_id)
        await until(
            lambda: progress()[1] in ("stopped", "completed", "failed"), "the sweep to stop", 120
        )
    print(f"sweep {sweep_id}: {progress()[1]}", flush=True)


async def run_pipeline(app: Any, pilot: Any, tmp: Path, converter: str, shots: list[Path],
                       until: Any) -> None:
    """examples/pipeline-steps, run to the end through the app's client; then again with the
    train step's learning rate changed: preprocess comes from the cache, train runs again. The
    Pipelines view is captured while the second run's train step runs."""
    import shutil

    from tui.model.pipelinespec import load_pipeline

    src = tmp / "pipeline-steps"
    shutil.copytree(PIPELINE, src)
    first = await asyncio.to_thread(app.client.pipeline, load_pipeline(src / "pipeline.toml"))
    print(f"pipeline {first.row.pipeline_id}: {first.row.steps} steps", flush=True)
    await pilot.press("9")

    def state(pid: str) -> str:
        row = next((r for r in app.pipeline_list if r.pipeline_id == pid), None)
        return "" if row is None else row.state

    await until(lambda: state(first.row.pipeline_id) in ("succeeded", "failed", "stopped"),
                "the first pipeline run", 300)
    print(f"pipeline {first.row.pipeline_id}: {state(first.row.pipeline_id)}", flush=True)
    train = src / "train.toml"
    train.write_text(train.read_text().replace("lr = 0.5", "lr = 0.4"))
    second = await asyncio.to_thread(app.client.pipeline, load_pipeline(src / "pipeline.toml"))
    pid = second.row.pipeline_id
    await until(lambda: state(pid) != "", "the second run in the list", 30)
    app.query_one("#pipelines-table").move_cursor(row=0)  # the newest: the second run

    def train_state() -> str:
        d = app.pipeline_detail
        if d is None or d.row.pipeline_id != pid:
            return ""
        s = d.step("train")
        return "" if s is None else s.state

    await until(lambda: train_state() == "running", "the second run's train step", 180)
    app.query_one("#steps-table").move_cursor(row=1)  # train: its detail below the tree
    await pilot.pause(1.5)
    await capture(app, pilot, "pipelines", converter, shots)
    await until(lambda: state(pid) in ("succeeded", "failed", "stopped"), "the second pipeline run", 300)
    print(f"pipeline {pid}: {state(pid)}", flush=True)


async def run_signals(app: Any, pilot: Any, tmp: Path, converter: str, shots: list[Path],
                      until: Any) -> None:
    """A job with a straggler (rank 1 works 0.25 s more a step) and a [scaling] reference of 8
    ranks, launched through the app's job source; the Job view once the signal is up."""
    from tui.model.jobspec import load_jobspec

    spec = tmp / "straggle.toml"
    spec.write_text(
        f'name = "straggle"\ncommand = ["{{python}}", "{SIGNALS_PROBE}", "--work", "0.1", '
        f'"--slow-rank", "1", "--slow-extra", "0.25"]\nworkdir = "{ROOT}"\nlauncher = "direct"\n'
        'nodes = 3\nprocesses_per_node = 1\nmax_runtime = "10m"\n'
        "[scaling]\nreference_world_size = 8\nbase_lr = 0.1\nwarmup_steps = 500\n"
    )
    job_id = await asyncio.to_thread(app.jobwatch.launch, load_jobspec(spec))
    app.select_job(job_id)
    await pilot.press("4")

    def flagged() -> bool:
        d = app.jobwatch.detail(job_id)
        return d is not None and any(s.kind == "straggler" for s in d.signals)

    await until(flagged, "the straggler signal", 90)
    await pilot.pause(3.0)
    await capture(app, pilot, "signals", converter, shots)
    await asyncio.to_thread(app.jobwatch.stop_job, job_id)


async def run_stages(app: Any, pilot: Any, converter: str, shots: list[Path], until: Any,
                     spec_path: Path) -> None:
    """A [model_parallel] job launched through the app's job source; the Job view once its plan
    is known and every stage has reported a measurement (its stage panel filled)."""
    from tui.model.jobspec import load_jobspec

    spec = load_jobspec(spec_path)
    if spec.model_parallel is None:
        raise SystemExit(f"{spec_path}: no [model_parallel] table: no stage panel to show")
    job_id = await asyncio.to_thread(app.jobwatch.launch, spec)
    app.select_job(job_id)
    await pilot.press("4")

    def measured() -> bool:
        d = app.jobwatch.detail(job_id)
        if d is not None and d.row.state in ("failed", "stopped"):
            raise SystemExit(f"job {job_id} {d.row.state}: {d.row.cause}")
        return d is not None and d.stages is not None and all(s.busy_s is not None for s in d.stages.stages)

    await until(measured, "every stage's measurements", 300)
    await pilot.pause(3.0)
    await capture(app, pilot, "stages", converter, shots)
    await asyncio.to_thread(app.jobwatch.stop_job, job_id)


def pools_spec(tmp: Path) -> Path:
    """A 4-pool job for the pools screenshot: a primary and 2 workers training (the ticker, a
    simulated GPU each), a reduction server (so the sizing line shows) and an evaluator, both
    waiting on CPU."""
    wait = '["{python}", "-c", "import time; time.sleep(3600)"]'
    out = tmp / "pools.toml"
    out.write_text(f"""name = "pools"
command = ["{{python}}", "{TICKER}", "--steps", "3000", "--sleep", "0.2"]
workdir = "{ROOT}"
total_steps = 3000
max_runtime = "30m"
[[pools]]
role = "primary"
gpus_per_replica = 1
[[pools]]
role = "worker"
replicas = 2
gpus_per_replica = 1
[[pools]]
role = "reduction_server"
command = {wait}
[[pools]]
role = "evaluator"
command = {wait}
""")
    return out


async def run_pools(app: Any, pilot: Any, bed: Any, tmp: Path, converter: str, shots: list[Path], until: Any,
                    spec_path: Path | None) -> None:
    """A job made of worker pools launched through the app's job source (``spec_path``, or
    ``pools_spec``); once every pool runs, its evaluator (if any) is killed (SIGKILL, inside its
    host): the Job view is captured once that shows as a replica failure training went on after."""
    from tui.model.jobspec import load_jobspec

    spec_path = spec_path or pools_spec(tmp)
    if not spec_path.exists():
        raise SystemExit(f"{spec_path}: no such job spec (--pools-spec: a spec with [[pools]])")
    spec = load_jobspec(spec_path)
    if not spec.pools:
        raise SystemExit(f"{spec_path}: no [[pools]]: no pools panel to show")
    job_id = await asyncio.to_thread(app.jobwatch.launch, spec)
    app.select_job(job_id)
    await pilot.press("4")

    def detail() -> Any:
        return live_detail(app, job_id)

    def all_running() -> bool:
        d = detail()
        return d is not None and d.pools is not None and all(p.state == "running" for p in d.pools.pools) \
            and d.row.step is not None and d.row.step >= 20

    await until(all_running, "every pool running", 300)
    d = detail()
    evaluator = d.pools.pool("evaluator")
    if evaluator is not None:
        first = sum(p.replicas for p in d.pools.pools if p.role != "evaluator")  # ranks in pool order
        rank = next((r for r in d.ranks if r.get("rank") == first), None)
        if rank is not None and rank.get("pid"):
            bed.exec(rank["host"], ["kill", "-KILL", str(rank["pid"])])
            await until(lambda: bool(detail().pools.failures), "the evaluator's failure reported", 60)
    await pilot.pause(3.0)
    app.refresh_views(force=True)
    await capture(app, pilot, "pools", converter, shots)
    await asyncio.to_thread(app.jobwatch.stop_job, job_id)


PROCESSING_EXAMPLE = ROOT / "examples" / "processing" / "job.toml"


async def run_processing(app: Any, pilot: Any, converter: str, shots: list[Path], until: Any) -> None:
    """examples/processing (its data/ split by file over the 3 hosts) launched through the app's
    job source; the Job view is captured once the job ended with its processing panel filled."""
    from tui.model.jobspec import load_jobspec

    job_id = await asyncio.to_thread(app.jobwatch.launch, load_jobspec(PROCESSING_EXAMPLE))
    app.select_job(job_id)
    await pilot.press("4")

    def done() -> bool:
        d = app.jobwatch.detail(job_id)
        if d is None or d.row.state not in ("failed", "stopped", "succeeded"):
            return False
        if d.row.state != "succeeded":
            raise SystemExit(f"job {job_id} {d.row.state}: {d.row.cause}")
        return d.processing is not None and all(i.total is not None for i in d.processing.inputs
                                                if i.distribution == "ShardedByKey")

    await until(done, "the processing job to end", 180)
    await pilot.pause(2.0)
    app.refresh_views(force=True)
    await capture(app, pilot, "processing", converter, shots)


def healing_spec(tmp: Path) -> Path:
    """The ddp example as the main run has it (h1 and h2, 2 simulated GPUs each, a rank per GPU),
    saving every 25 steps, with restarts to spend: what rigdeck needs to move it off a bad GPU."""
    from tui.model.specform import read_spec_data
    from tui.model.tomlwrite import dumps

    data = read_spec_data(job_spec(tmp))
    data["name"] = "ddp-heals"
    cmd = [str(c) for c in data["command"]]
    if "--checkpoint-every" in cmd:
        cmd[cmd.index("--checkpoint-every") + 1] = "25"
    data["command"] = cmd
    data["checkpoint"] = {"dir": str(tmp / "ckpt-heal"), "owner": "rank0"}
    data["restart"] = {"max_restarts": 2, "on_exit_codes": []}
    out = tmp / "ddp-heals.toml"
    out.write_text(dumps(data))
    return out


def live_detail(app: Any, job_id: str) -> Any:
    """The job's detail in the app; a job that ended before its screenshot ends the run, saying why."""
    d = app.jobwatch.detail(job_id)
    if d is not None and d.row.state in ("failed", "stopped", "succeeded"):
        raise SystemExit(f"job {job_id} {d.row.state}: {d.row.cause}")
    return d


def write_gpu_faults(bed: Any, host: str, faults: dict[str, Any]) -> None:
    """The simulated GPUs' faults file of a bed host (agent/gpuhealth.py reads it at each sample)."""
    import json

    path = bed.host(host).state_dir / "sim-gpu-faults.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(faults))
    tmp.replace(path)


async def run_healing(app: Any, pilot: Any, bed: Any, tmp: Path, converter: str, shots: list[Path],
                      until: Any) -> None:
    """The ddp example on h1 and h2 (``healing_spec``) launched through the app's job source; past
    its second checkpoint, an XID 79 written for the simulated GPU of rank 1: rigdeck drains that
    GPU and restarts the job from its checkpoint on healthy GPUs. Once the new attempt has stepped
    on, an operator drains h3 GPU 2 by hand. Then the GPU view, the map (its cursor on the failed
    GPU) and the Job view (its incident, goodput) are captured."""
    from tui.app.widgets.clustermap import ClusterMap
    from tui.model.jobspec import load_jobspec

    job_id = await asyncio.to_thread(app.jobwatch.launch, load_jobspec(healing_spec(tmp)))
    app.select_job(job_id)
    await pilot.press("4")

    def detail() -> Any:
        return live_detail(app, job_id)

    def step() -> int:
        d = detail()
        return -1 if d is None or d.row.step is None else d.row.step

    await until(lambda: step() >= 60, "step 60 (two checkpoints saved)", 600)
    rank = next(r for r in detail().ranks if r.get("rank") == 1)
    host, gpu = str(rank["host"]), int(rank["gpu"])
    write_gpu_faults(bed, host, {str(gpu): {"xid": 79}})
    print(f"{job_id}: XID 79 written for {host} GPU {gpu} (rank 1) at step {step()}", flush=True)
    try:
        def resumed() -> bool:
            d = detail()
            inc = d.incidents[-1] if d is not None and d.incidents else None
            return d is not None and d.row.restarts >= 1 and d.row.state == "running" \
                and inc is not None and inc.resume_s is not None and step() >= (inc.last_step or 0) + 100

        await until(resumed, "the restart on healthy GPUs, stepping past the fault", 600)
        await asyncio.to_thread(app.client.drain, ["h3:2"], "fan noise")
        state = app.client.state
        await until(lambda: getattr(state.gpu("h3", 2), "health", "") == "drained", "h3 GPU 2 drained", 60)
        d = detail()
        inc = d.incidents[-1]
        print(f"{job_id}: restarted on {[(n['host'], n['gpus']) for n in d.row.placement]}; incident: "
              f"{inc.message}; restart parts {inc.parts()}, {inc.steps_rerun} steps lost; "
              f"goodput {d.goodput.ratio if d.goodput else None}", flush=True)
        await pilot.pause(2.0)
        app.refresh_views(force=True)
        await pilot.press("2")
        await pilot.pause(0.5)
        await capture(app, pilot, "healing-gpus", converter, shots)
        await pilot.press("8", "m", "m")  # job colours: the job's GPUs beside the two that take none
        await pilot.pause(0.5)
        m = app.query_one("#cluster-map", ClusterMap)
        m.move_to([h.name for h in m.hosts].index(host), gpu)
        await pilot.pause(0.5)
        await capture(app, pilot, "healing-map", converter, shots)
        await pilot.press("4")
        await pilot.pause(0.5)
        await capture(app, pilot, "healing-job", converter, shots)
    finally:
        write_gpu_faults(bed, host, {})
    await asyncio.to_thread(app.jobwatch.stop_job, job_id)


DOCTOR_RATE = ("rate", "200mbit", "burst", "256kb", "latency", "50ms")


def limit_link(bed: Any, i: int) -> None:
    """Rate-limit host i's link both ways (this kernel has no netem): its eth0's egress in its
    namespace, and the bridge-side veth's egress (what the host receives)."""
    h = bed.host(i)
    for argv in (["tc", "-n", h.netns, "qdisc", "replace", "dev", "eth0", "root", "tbf", *DOCTOR_RATE],
                 ["tc", "qdisc", "replace", "dev", h.veth, "root", "tbf", *DOCTOR_RATE]):
        subprocess.run(argv, check=True)


async def run_doctor_view(app: Any, pilot: Any, bed: Any, converter: str, shots: list[Path],
                          until: Any) -> None:
    """h3's link rate-limited, then D in the Doctor view; captured once the report is in."""
    limit_link(bed, 3)
    await pilot.press("0")
    await pilot.pause(0.3)
    await pilot.press("D")
    await until(lambda: app.doctor_runs, "the doctor's report", 600)
    if app.doctor_error:
        print(f"doctor: {app.doctor_error}", flush=True)
    report = app.doctor_report
    if report is not None:
        print(f"doctor: {report.worst}, {len(report.findings)} findings", flush=True)
        for f in report.findings:
            print(f"  {f.check:9} {f.subject:10} {f.verdict:4} {f.summary}", flush=True)
    table = app.query_one("#doctor-table")
    if table.row_count > 1:
        table.move_cursor(row=1)  # the first p2p finding: h3's, if it is bad
    await pilot.pause(0.5)
    await capture(app, pilot, "doctor", converter, shots)


async def run_usage(app: Any, pilot: Any, tmp: Path, converter: str, shots: list[Path], until: Any) -> None:
    """Jobs of two people on the bed, launched through the controller the app runs with each
    person as the owner (what a server records from each person's key): alice's 4-GPU and 1-GPU
    jobs, bob's 4-GPU job, all at once; the Usage view once they ended."""
    from tui.model.jobspec import load_jobspec
    from tui.model.jobstate import TERMINAL

    runs = [("alice", "alice-train", 2, 2, 300), ("alice", "alice-eval", 1, 1, 150), ("bob", "bob-train", 2, 2, 200)]
    ids = []
    for user, name, nodes, gpus, steps in runs:
        spec = tmp / f"{name}.toml"
        spec.write_text(f'name = "{name}"\ncommand = ["{{python}}", "{TICKER}", "--steps", "{steps}", "--sleep", '
                        f'"0.1"]\nworkdir = "{ROOT}"\nlauncher = "direct"\nnodes = {nodes}\ngpus_per_node = {gpus}\n')
        view = await asyncio.to_thread(app.client.service.launch, load_jobspec(spec), user=user)
        ids.append(view.job_id)
        print(f"{user}: {view.job_id} {view.state}", flush=True)

    def ended() -> bool:
        return all((r := app.jobs_snapshot.row(j)) is not None and r.state in TERMINAL for j in ids)

    await until(ended, "the jobs to end", 300)
    view = app.views["usage"]
    await pilot.press("u")
    await until(lambda: view.usage_reads >= 1 and view.usage_report is not None
                and {r.key for r in view.usage_report.rows} >= {"alice", "bob"}, "the usage", 120)
    await pilot.pause(1.0)
    await capture(app, pilot, "usage", converter, shots)


async def run_slurm(bed: Any, slurm: Any, tmp: Path, converter: str, shots: list[Path]) -> None:
    """The app on a Slurm cluster (a real Slurm on the bed, the inventory's ``[slurm]``): another
    user's Slurm job holding 2 of h2's GPUs, one of theirs pending, h3's node drained by an
    admin with a reason, and a rigdeck training job launched through Slurm; then the Hosts view
    (Slurm's column and the drain reason), the GPU view (the Slurm job's GPUs named as theirs)
    and the Jobs view (Slurm's queue beside rigdeck's jobs)."""
    from tests.slurmbed import OTHER_USER
    from tui.app.shell import RigdeckApp
    from tui.client import InProcessClient
    from tui.control.hostlinks import HostLinks
    from tui.remote.inventoryfile import load_inventory

    path = bed.write_inventory(tmp / "hosts.toml", python=sys.executable, connect_timeout=5.0)
    path.write_text(path.read_text() + '\n[slurm]\nlogin = "h1"\npartition = "bed"\n')
    os.environ["RIGDECK_INVENTORY"] = str(path)

    def sbatch(*args: str) -> str:
        out = slurm.run(["sbatch", "--parsable", f"--output={slurm.out}/%j.out", "--chdir=/tmp", *args],
                        user=OTHER_USER).stdout
        return out.strip().split(";")[0]

    theirs = sbatch("-J", "their-train", "-w", slurm.node(2), "--gres=gpu:2", "--wrap", "sleep 900")
    waiting = sbatch("-J", "their-big", "-N", "2", "--gres=gpu:4", "--wrap", "sleep 900")
    slurm.run(["scontrol", "update", f"NodeName={slurm.node(3)}", "State=DRAIN",
               "Reason=GPU 1 fan failing, swap Tuesday"])
    spec = tmp / "train.toml"
    spec.write_text(f'name = "train"\ncommand = ["{{python}}", "{TICKER}", "--steps", "3000", "--sleep", "0.1"]\n'
                    f'workdir = "{ROOT}"\nlauncher = "direct"\nnodes = 1\ngpus_per_node = 2\n')
    launched = subprocess.run([sys.executable, "-m", "tui.cli", "launch", str(spec), "--json"], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
    if launched.returncode != 0:
        raise SystemExit(f"the launch through Slurm failed: {launched.stderr}")
    print(f"Slurm jobs of {OTHER_USER}: {theirs} (running), {waiting}; rigdeck's through Slurm: "
          f"{launched.stdout[:200]}", flush=True)
    app = RigdeckApp(InProcessClient(controller=HostLinks(load_inventory(path))), keymap_file=tmp / "keys.toml")
    async with app.run_test(size=SIZE) as pilot:

        until = pilot_until(pilot)

        await until(lambda: sum(h.status == "up" for h in app.hosts_snapshot) == 3, "three hosts up", 120)
        await until(lambda: any((r.step or 0) > 20 for r in app.jobs_snapshot.rows), "the job's steps", 120)
        hosts = app.views["hosts"]
        await until(lambda: hosts.slurm_reads >= 1, "Slurm's nodes", 60)
        await pilot.press("down", "down")  # h3: the detail gives the whole drain reason
        await pilot.pause(1.0)
        await capture(app, pilot, "slurm-hosts", converter, shots)
        await pilot.press("2")
        await pilot.pause(1.0)
        await capture(app, pilot, "slurm-gpus", converter, shots)
        jobs = app.views["jobs"]
        await pilot.press("3")
        await until(lambda: jobs.slurm_reads >= 1, "Slurm's queue", 60)
        await pilot.pause(1.0)
        await capture(app, pilot, "slurm-jobs", converter, shots)
        for row in app.jobs_snapshot.rows:
            await asyncio.to_thread(app.client.stop, row.job_id)
    slurm.run(["scancel", theirs, waiting])
    slurm.run(["scontrol", "update", f"NodeName={slurm.node(3)}", "State=RESUME"])


def pilot_until(pilot: Any) -> Any:
    """``await until(cond, what, limit)``: the app's pilot pauses until ``cond()``, or the run
    ends saying what it waited for."""

    async def until(cond: Any, what: str, limit: float) -> None:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            await pilot.pause(0.25)
            if cond():
                return
        raise SystemExit(f"timed out waiting for {what}")
    return until


async def capture(app: Any, pilot: Any, name: str, converter: str, shots: list[Path]) -> None:
    app.clear_notifications()
    await pilot.pause(0.3)
    svg = OUT / f"{name}.svg"
    app.save_screenshot(str(svg))
    shots.append(to_png(svg, converter))
    print(f"  {svg.relative_to(ROOT)} + .png", flush=True)


async def run(
    bed: Any, tmp: Path, converter: str, wait_steps: int, timeout: float, only: str = "all",
    stages_spec: Path = MP_EXAMPLE, pools_spec: Path | None = None,
) -> list[Path]:
    from textual.widgets import Input

    from tui.app.shell import RigdeckApp
    from tui.client import InProcessClient
    from tui.control.hostlinks import HostLinks
    from tui.remote.inventoryfile import load_inventory

    inv = load_inventory(
        bed.write_inventory(tmp / "hosts.toml", python=sys.executable, connect_timeout=5.0)
    )
    spec = job_spec(tmp)
    app = RigdeckApp(InProcessClient(controller=HostLinks(inv)), keymap_file=tmp / "keys.toml")
    shots: list[Path] = []
    burner = None
    async with app.run_test(size=SIZE) as pilot:

        until = pilot_until(pilot)

        await until(
            lambda: sum(h.status == "up" for h in app.hosts_snapshot) == 3, "three hosts up", 120
        )
        if only == "sweeps":
            await run_sweep(app, pilot, tmp, converter, shots, until)
            return shots
        if only == "pipelines":
            await run_pipeline(app, pilot, tmp, converter, shots, until)
            return shots
        if only == "signals":
            await run_signals(app, pilot, tmp, converter, shots, until)
            return shots
        if only == "stages":
            await run_stages(app, pilot, converter, shots, until, stages_spec)
            return shots
        if only == "doctor":
            await run_doctor_view(app, pilot, bed, converter, shots, until)
            return shots
        if only == "pools":
            await run_pools(app, pilot, bed, tmp, converter, shots, until, pools_spec)
            return shots
        if only == "processing":
            await run_processing(app, pilot, converter, shots, until)
            return shots
        if only == "healing":
            await run_healing(app, pilot, bed, tmp, converter, shots, until)
            return shots
        if only == "usage":
            await run_usage(app, pilot, tmp, converter, shots, until)
            return shots
        # Somebody else's process on h3's GPU 1 (a CPU burner the simulated GPU follows).
        burner = bed.popen(
            3,
            ["env", "RIGDECK_SIM_GPU=1", sys.executable, "-c", "while True: pass"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        await pilot.press("l")
        await pilot.pause(0.3)
        app.screen.query_one("#spec-path", Input).value = str(spec)
        await pilot.press("enter")
        await pilot.pause(0.3)
        for inp in app.screen.query(Input):
            inp.cursor_blink = False
        await capture(app, pilot, "launch", converter, shots)
        await pilot.press("ctrl+s")
        await until(lambda: app.job_id is not None, "the launch", 120)
        job_id = app.job_id
        print(f"launched {job_id}; waiting for {wait_steps} steps", flush=True)

        def progress() -> int:
            row = app.jobs_snapshot.row(job_id or "")
            return -1 if row is None or row.step is None else row.step

        await until(lambda: progress() >= wait_steps, f"step {wait_steps}", timeout)
        await pilot.pause(1.5)
        app.refresh_views(force=True)
        for key, name in (
            ("1", "hosts"),
            ("2", "gpus"),
            ("3", "jobs"),
            ("4", "job"),
            ("5", "checkpoints"),
            ("6", "logs"),
            ("8", "map"),
        ):
            await pilot.press(key)
            await pilot.pause(0.5)
            await capture(app, pilot, name, converter, shots)
        await pilot.press("3", "s")
        await pilot.pause(0.5)
        await capture(app, pilot, "stop", converter, shots)
        await pilot.press("y")
        await until(
            lambda: getattr(app.jobs_snapshot.row(job_id or ""), "state", "") == "stopped",
            "the job to stop",
            120,
        )
        print(f"stopped {job_id}", flush=True)
        detail = app.jobwatch.detail(job_id or "")
        if detail is not None:
            print(f"owner moves: {detail.checkpoints.moves}", flush=True)
        if burner is not None:
            burner.kill()
            burner.wait()
            burner = None
        await run_sweep(app, pilot, tmp, converter, shots, until)
        await run_pipeline(app, pilot, tmp, converter, shots, until)
        await run_doctor_view(app, pilot, bed, converter, shots, until)  # last: it limits h3's link
    if burner is not None:
        burner.kill()
        burner.wait()
    return shots


async def run_onboarding(bed: Any, tmp: Path, converter: str) -> list[Path]:
    """The onboarding screen (no inventory; the hosts of an ssh config under a fresh HOME),
    after checking three hosts: two whose keys were accepted, one with its port closed."""
    from textual.widgets import DataTable

    from tui.app.screens.dialogs import TrustHostKey
    from tui.app.screens.onboarding import OnboardingScreen
    from tui.app.shell import RigdeckApp
    from tui.client import InProcessClient, load_inventory, onboarding_offer

    home = tmp / "onboard-home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    h1, h2, h3 = bed.hosts[:3]
    (home / ".ssh" / "config").write_text(
        f"Host *\n    User root\n    IdentityFile {bed.user_key}\n"
        f"Host gpu-a\n    HostName {h1.address}\nHost gpu-b\n    HostName {h2.address}\n"
        f"Host gpu-c\n    HostName {h3.address}\nHost old-box\n    HostName {h3.address}\n"
        "    Port 2\n")
    os.environ["HOME"] = str(home)
    os.environ.pop("RIGDECK_INVENTORY", None)
    app = RigdeckApp(InProcessClient(load_inventory()), onboarding=onboarding_offer(),
                     keymap_file=tmp / "keys.toml")
    shots: list[Path] = []
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.5)
        screen = app.screen
        assert isinstance(screen, OnboardingScreen), screen
        for name in ("gpu-a", "gpu-b", "old-box"):
            screen.query_one("#onboard-table", DataTable).move_cursor(row=screen.names.index(name))
            await pilot.press("space")
        await pilot.press("enter")
        for _ in range(2):
            for _ in range(100):
                await pilot.pause(0.1)
                if isinstance(app.screen, TrustHostKey):
                    break
            await pilot.press("y")
        for _ in range(100):
            await pilot.pause(0.1)
            if len(screen.ok_names()) == 2 and not screen.checking:
                break
        await capture(app, pilot, "onboarding", converter, shots)
    return shots


def shots_on_slurm(bed: Any, tmp: Path, converter: str) -> int:
    from tests import slurmbed

    ok, why = slurmbed.available()
    if not ok:
        print(f"--only slurm needs Slurm: {why}", file=sys.stderr)
        return 2
    cluster = slurmbed.SlurmBed(bed).up()
    shots: list[Path] = []
    try:
        asyncio.run(run_slurm(bed, cluster, tmp, converter, shots))
    finally:
        cluster.down()
    print(f"wrote {len(shots)} PNGs (and their SVGs) to {OUT.relative_to(ROOT)}/")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--steps", type=int, default=500, help="wait for this many training steps first"
    )
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument(
        "--only",
        choices=("all", "sweeps", "pipelines", "doctor", "onboarding", "signals", "stages", "pools", "processing",
                 "healing", "usage", "slurm"),
        default="all",
        help="sweeps: only the Sweeps view (a short sweep, no training job); pipelines: only the "
        "Pipelines view (the example pipeline, twice); doctor: only the Doctor view (h3's link "
        "rate-limited); onboarding: only the onboarding screen; signals: the Job view of a job "
        "with a straggler (not in the full run); stages: the Job view of a [model_parallel] "
        "job, its stage panel filled (not in the full run); pools: the Job view of a job made of "
        "worker pools once every pool runs (not in the full run); processing: the Job view of "
        "examples/processing once it ended (not in the full run); healing: the GPU view, the map "
        "and the Job view after an XID 79 moved a training job off its GPU and a GPU was drained "
        "by hand (not in the full run); usage: the Usage view after jobs of two people ran (not in "
        "the full run); slurm: the Hosts, GPU and Jobs views on a real Slurm on the bed (not in the full "
        "run)",
    )
    ap.add_argument("--stages-spec", type=Path, default=MP_EXAMPLE,
                    help="--only stages: the [model_parallel] job spec to run (default: the pipeline example)")
    ap.add_argument("--pools-spec", type=Path, default=None,
                    help="--only pools: a job spec with [[pools]] to run (default: a 4-pool ticker job, "
                    "its evaluator killed once every pool runs)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from tests.testbed import TestBed, available

    ok, why = available()
    if not ok:
        print(f"screenshots need the test bed: {why}", file=sys.stderr)
        return 2
    converter = ensure_converter()
    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rigdeck-shots-") as t:
        tmp = Path(t)
        os.environ["RIGDECK_HOME"] = str(tmp / "home")
        bed = TestBed(3, sim_gpus=4)
        bed.up()
        try:
            if args.only == "slurm":
                return shots_on_slurm(bed, tmp, converter)
            shots = [] if args.only == "onboarding" else asyncio.run(
                run(bed, tmp, converter, args.steps, args.timeout, args.only, args.stages_spec, args.pools_spec))
            if args.only in ("all", "onboarding"):  # last: it changes HOME
                shots += asyncio.run(run_onboarding(bed, tmp, converter))
        finally:
            bed.down()
    print(f"wrote {len(shots)} PNGs (and their SVGs) to {OUT.relative_to(ROOT)}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
