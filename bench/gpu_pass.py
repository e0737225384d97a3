"""The steps of bench/gpu_pass.sh, one per call: what a session lent a GPU runs (about 10 minutes).

    .venv/bin/python bench/gpu_pass.py check        # exit 2, saying why, without a usable GPU
    .venv/bin/python bench/gpu_pass.py collector    # NVML and nvidia-smi against nvidia-smi itself
    .venv/bin/python bench/gpu_pass.py ddp          # the ddp example: both launchers vs by hand
    .venv/bin/python bench/gpu_pass.py pipeline     # the model-parallel example profiled on CUDA
    .venv/bin/python bench/gpu_pass.py wrap NAME FILE   # a bench result as gpu-NAME.json

Each step writes ``bench/results/gpu-<step>.json``: what it measured, with the device, driver,
torch, CUDA and the commit (``gpu_meta``) beside ``bench/_meta.py``'s run block. A step that
finds something wrong says so and exits 1; the script goes on with the next.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._meta import run_meta, write_result  # noqa: E402

RESULTS = ROOT / "bench" / "results"
PY = sys.executable
LOAD_MB = 6000  # what the tagged stand-in for a rank holds on GPU 0
DDP_STEPS = 2000
# Rounds of the ddp step (each: both launchers, by hand and by rigdeck, taking turns).
DDP_ROUNDS = int(os.environ.get("RIGDECK_GPU_PASS_ROUNDS", "2"))
# The launchers the ddp step compares (both by default; "direct" alone for a longer series).
DDP_LAUNCHERS = tuple(os.environ.get("RIGDECK_GPU_PASS_LAUNCHERS", "direct torchrun").split())


def fail(msg: str, code: int = 1) -> None:
    print(f"gpu_pass: {msg}", file=sys.stderr)
    sys.exit(code)


def smi(*query: str) -> list[list[str]]:
    out = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return [[x.strip() for x in line.split(",")] for line in out.splitlines() if line.strip()]


def gpu_meta() -> dict[str, Any]:
    """Device, driver, torch and CUDA of this machine (the commit is in run_meta)."""
    rows = smi("--query-gpu=index,name,uuid,driver_version,memory.total")
    import torch

    return {"gpus": [{"index": int(r[0]), "name": r[1], "uuid": r[2], "memory_total_mb": int(r[4])}
                     for r in rows],
            "device": rows[0][1], "driver": rows[0][3], "torch": torch.__version__,
            "cuda": torch.version.cuda, "nccl": ".".join(map(str, torch.cuda.nccl.version()))}


def save(step: str, result: dict[str, Any], meta: dict[str, Any]) -> None:
    write_result(RESULTS / f"gpu-{step}.json", {"gpu_meta": gpu_meta(), **result}, meta)


def step_check() -> None:
    """Fail clearly (exit 2) on a machine without a usable NVIDIA GPU, before anything runs."""
    if shutil.which("nvidia-smi") is None:
        fail("no nvidia-smi on PATH: this script needs a machine with an NVIDIA GPU and its "
             "driver (nothing was run)", 2)
    try:
        rows = smi("--query-gpu=index,name,driver_version")
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        fail(f"nvidia-smi cannot reach a GPU ({e}): nothing was run", 2)
    if not rows:
        fail("nvidia-smi lists no GPU: nothing was run", 2)
    probe = subprocess.run([PY, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True, timeout=300)
    if probe.stdout.strip() != "True":
        fail(f"torch sees no CUDA device ({probe.stdout.strip() or probe.stderr[-300:]}): "
             "install a CUDA build of torch in this venv; nothing was run", 2)
    print(f"gpu_pass: {len(rows)} GPU(s): {rows[0][1]}, driver {rows[0][2]}")


def tagged_load(job_id: str, mb: int = LOAD_MB) -> subprocess.Popen[str]:
    """A process tagged as rank 0 of ``job_id`` that holds ``mb`` MB of GPU 0 and keeps it busy."""
    code = ("import sys, torch\n"
            f"x = torch.empty({mb} * 2**20, dtype=torch.uint8, device='cuda:0')\n"
            "a = torch.randn(4096, 4096, device='cuda:0')\n"
            "print('ready', flush=True)\n"
            "while True:\n"
            "    a = (a @ a).clamp_(-1, 1)\n"
            "    torch.cuda.synchronize()\n")
    env = dict(os.environ, RIGDECK_JOB_ID=job_id, RIGDECK_RANK="0", CUDA_VISIBLE_DEVICES="0")
    p = subprocess.Popen([PY, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    if p.stdout.readline().strip() != "ready":
        p.kill()
        fail("the tagged load process did not start on GPU 0")
    time.sleep(2.0)
    return p


def step_collector() -> None:
    """Both GPU sources under a tagged load, each beside nvidia-smi's own figures, same seconds:
    memory used within 1 %, the tagged process mapped to its job and rank."""
    meta = run_meta()
    load = tagged_load("gpu-pass-1")
    out: dict[str, Any] = {"load_mb": LOAD_MB, "job_id": "gpu-pass-1", "paths": {}}
    problems = []
    try:
        for backend in ("nvml", "nvidia-smi"):
            res = subprocess.run([PY, "-m", "agent.telemetry", "--backend", backend, "--count", "5"],
                                 capture_output=True, text=True, timeout=120, cwd=ROOT,
                                 env=dict(os.environ, PYTHONPATH=str(ROOT)), check=True)
            ref = smi("--query-gpu=index,memory.used,memory.reserved")
            samples = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
            g = samples[-1]["gpus"][0]
            smi_used = int(ref[0][1])
            mine = [p for p in g["processes"] if p["pid"] == load.pid]
            row = {"samples": samples, "nvidia_smi_used_mb": smi_used,
                   "nvidia_smi_reserved": ref[0][2], "used_mb": g["memory_used_mb"],
                   "reserved_mb": g.get("memory_reserved_mb"),
                   "within_1pct": abs(g["memory_used_mb"] - smi_used) <= 0.01 * smi_used,
                   "tagged_process": mine[0] if mine else None,
                   "cost_ms_mean": 1000 * sum(s["cost_s"] for s in samples[1:]) / max(1, len(samples) - 1)}
            out["paths"][backend] = row
            print(f"  {backend:<10} used {g['memory_used_mb']} MB (nvidia-smi {smi_used}), reserved "
                  f"{g.get('memory_reserved_mb')}, tagged: {mine[0] if mine else 'NOT FOUND'}, "
                  f"sample {row['cost_ms_mean']:.2f} ms")
            if samples[-1]["gpu_source"] != backend:
                problems.append(f"{backend}: the collector used {samples[-1]['gpu_source']}")
            if not row["within_1pct"]:
                problems.append(f"{backend}: used {g['memory_used_mb']} MB, nvidia-smi {smi_used}")
            if not mine or (mine[0]["job_id"], mine[0]["rank"]) != ("gpu-pass-1", 0):
                problems.append(f"{backend}: the tagged process is not mapped to gpu-pass-1 rank 0")
    finally:
        load.kill()
        load.wait()
    out["problems"] = problems
    save("collector", out, meta)
    if problems:
        fail("; ".join(problems))


def _seconds(text: str) -> float | None:
    m = re.findall(r"done: \d+ steps in ([0-9.]+)s", text)
    return float(m[-1]) if m else None


def _rigdeck_run(launcher: str, work: Path) -> dict[str, Any]:
    spec = work / f"ddp-{launcher}.toml"
    spec.write_text(
        f'name = "gpu-pass-ddp-{launcher}"\n'
        f'command = ["{{python}}", "train.py", "--steps", "{DDP_STEPS}", "--checkpoint-every", '
        f'"{DDP_STEPS}", "--seed", "0"]\n'
        f'workdir = "{ROOT / "examples" / "ddp"}"\nlauncher = "{launcher}"\n'
        'nodes = 1\ngpus_per_node = 1\nmax_runtime = "10m"\n\n[env]\nOMP_NUM_THREADS = "1"\n\n'
        '[checkpoint]\ndir = "' + str(work) + '/ckpt/{job_id}"\nowner = "rank0"\n')
    rigdeck = [PY, "-m", "tui.cli"]
    t0 = time.monotonic()
    res = subprocess.run([*rigdeck, "launch", "--wait", "--json", str(spec)], capture_output=True,
                         text=True, timeout=600, cwd=ROOT)
    wall = time.monotonic() - t0
    m = re.search(r'"job_id":\s*"([^"]+)"', res.stdout) or re.search(r"\b(\d{8}-\d{6}-[\w-]+)",
                                                                   res.stdout + res.stderr)
    logs = ""
    if m:
        logs = subprocess.run([*rigdeck, "logs", m.group(1)], capture_output=True, text=True,
                              timeout=120, cwd=ROOT).stdout
    return {"launcher": launcher, "rc": res.returncode, "job_id": m.group(1) if m else None,
            "train_s": _seconds(logs), "launch_to_end_s": wall, "stdout_tail": res.stdout[-800:],
            "stderr_tail": res.stderr[-800:]}


def _by_hand(launcher: str, work: Path) -> dict[str, Any]:
    args = ["--steps", str(DDP_STEPS), "--checkpoint-every", str(DDP_STEPS), "--seed", "0",
            "--checkpoint-dir", str(work / f"hand-{launcher}-{time.monotonic_ns()}")]
    script = str(ROOT / "examples" / "ddp" / "train.py")
    argv = ([PY, script, *args] if launcher == "direct" else
            [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", script, *args])
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="0")
    t0 = time.monotonic()
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    return {"launcher": launcher, "rc": res.returncode, "train_s": _seconds(res.stdout),
            "launch_to_end_s": time.monotonic() - t0, "stderr_tail": res.stderr[-800:]}


def step_ddp() -> None:
    """The ddp example, NCCL on GPU 0, 2000 steps: rigdeck with each launcher and the same
    script by hand (python, torchrun), taking turns, ``DDP_ROUNDS`` times (after one untimed
    run by hand: the first CUDA and NCCL start on a fresh machine is slower). Each cell's median
    and rigdeck's ratio to by hand are printed and kept."""
    meta = run_meta()
    work = Path(tempfile.mkdtemp(prefix="rigdeck-gpu-pass-"))
    warm = _by_hand("direct", work)
    print(f"  warm-up  direct    rc {warm['rc']} train {warm['train_s']} s (not counted)", flush=True)
    runs = []
    for n in range(DDP_ROUNDS):
        for launcher in DDP_LAUNCHERS:
            # who goes first takes turns too, so that neither always runs on a card just used
            turns = [("by hand", _by_hand), ("rigdeck", _rigdeck_run)]
            for how, fn in (turns if n % 2 == 0 else turns[::-1]):
                r = {"how": how, "round": n, **fn(launcher, work)}
                runs.append(r)
                print(f"  {how:<8} {launcher:<9} rc {r['rc']} train {r['train_s']} s, "
                      f"start to end {r['launch_to_end_s']:.1f} s", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    problems = [f"{r['how']} {r['launcher']}: rc {r['rc']}" for r in runs
                if r["rc"] != 0 or r["train_s"] is None]
    medians: dict[str, dict[str, Any]] = {}
    for launcher in DDP_LAUNCHERS:
        cell: dict[str, Any] = {}
        for how in ("by hand", "rigdeck"):
            times = sorted(r["train_s"] for r in runs
                           if r["how"] == how and r["launcher"] == launcher and r["train_s"] is not None)
            if times:
                cell[how] = statistics.median(times)
        if len(cell) == 2:
            cell["ratio"] = cell["rigdeck"] / cell["by hand"]
            # each round's own ratio (the two runs side by side in time), and their median
            per_round = []
            for n in range(DDP_ROUNDS):
                t = {r["how"]: r["train_s"] for r in runs if r["launcher"] == launcher
                     and r["round"] == n and r["train_s"] is not None}
                if len(t) == 2:
                    per_round.append(round(t["rigdeck"] / t["by hand"], 4))
            if per_round:
                cell["round_ratios"] = per_round
                cell["median_round_ratio"] = statistics.median(per_round)
            print(f"  {launcher:<9} median training s: by hand {cell['by hand']:.2f}, rigdeck "
                  f"{cell['rigdeck']:.2f}: {cell['ratio']:.3f}x ({DDP_ROUNDS} rounds); each round's "
                  f"ratio {cell.get('round_ratios')}, median {cell.get('median_round_ratio')}",
                  flush=True)
        medians[launcher] = cell
    save("ddp", {"steps": DDP_STEPS, "rounds": DDP_ROUNDS, "warm_up": warm, "runs": runs,
                 "medians": medians, "problems": problems}, meta)
    if problems:
        fail("; ".join(problems))


def step_pipeline() -> None:
    """The model-parallel example on CUDA: its blocks profiled on the GPU (forward, backward,
    activations) and each stage's peak memory from torch.cuda.max_memory_allocated. Three
    stages where there are three GPUs, else one (one process per GPU: NCCL)."""
    meta = run_meta()
    gpus = len(smi("--query-gpu=index"))
    ranks = 3 if gpus >= 3 else 1
    script = str(ROOT / "examples" / "pipeline" / "train.py")
    args = ["--steps", "40", "--partitions", str(ranks)]
    argv = ([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3", script, *args]
            if ranks == 3 else [PY, script, *args])
    with tempfile.TemporaryDirectory(prefix="rigdeck-gpu-pass-mp-") as job_dir:
        env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", RIGDECK_JOB_DIR=job_dir)
        res = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, cwd=job_dir)
        plans = [json.loads(p.read_text()) for p in Path(job_dir).rglob("*.json")]
    stages = [json.loads(line.split(" ", 1)[1]) for line in res.stdout.splitlines()
              if line.startswith("stage_summary ")]
    out = {"ranks": ranks, "rc": res.returncode, "stages": stages, "files": plans,
           "stdout_tail": res.stdout[-1500:], "stderr_tail": res.stderr[-1500:]}
    for s in stages:
        print(f"  stage {s['stage']}: blocks {s['blocks']}, peak {s['peak_bytes'] / 2**20:.1f} MiB "
              f"(max_memory_allocated), {s['steps_per_s']:.1f} steps/s")
    save("pipeline", out, meta)
    if res.returncode != 0 or not stages:
        fail(f"the pipeline example failed (rc {res.returncode}): {res.stderr[-300:]}")


async def _screens(sim_gpus: int) -> list[Path]:
    """The app on this machine while the ddp example trains on GPU 0 (launched from the app's
    launch dialog, as a user would): its GPU view and the job's view as SVGs."""
    import dataclasses

    from textual.widgets import Input

    from tui.app.shell import RigdeckApp
    from tui.client import InProcessClient
    from tui.control.hostlinks import HostLinks
    from tui.remote.inventoryfile import local_inventory

    inv = local_inventory()  # what rigdeck uses with no inventory: this machine, no SSH
    if sim_gpus:  # a dry run of this step on a machine without a GPU (simulated, and says so)
        inv = dataclasses.replace(inv, hosts=(dataclasses.replace(inv.hosts[0], sim_gpus=sim_gpus),))
    work = Path(tempfile.mkdtemp(prefix="rigdeck-gpu-pass-app-"))
    spec = work / "ddp.toml"
    spec.write_text(
        'name = "ddp-on-the-card"\n'
        'command = ["{python}", "train.py", "--steps", "20000", "--checkpoint-every", "250", "--seed", "0"]\n'
        f'workdir = "{ROOT / "examples" / "ddp"}"\nlauncher = "direct"\nnodes = 1\ngpus_per_node = 1\n'
        'total_steps = 20000\n\n[env]\nOMP_NUM_THREADS = "1"\n\n'
        f'[checkpoint]\ndir = "{work}/ckpt/{{job_id}}"\nowner = "rank0"\n')
    app = RigdeckApp(InProcessClient(controller=HostLinks(inv)), keymap_file=work / "keys.toml")
    shots: list[Path] = []
    async with app.run_test(size=(140, 40)) as pilot:

        async def until(cond: Any, what: str, limit: float) -> None:
            deadline = time.monotonic() + limit
            while not cond():
                if time.monotonic() > deadline:
                    fail(f"screens: timed out waiting for {what}")
                await pilot.pause(0.25)

        await until(lambda: any(h.status == "up" for h in app.hosts_snapshot), "this host up", 120)
        await pilot.press("l")
        await pilot.pause(0.3)
        app.screen.query_one("#spec-path", Input).value = str(spec)
        await pilot.press("enter")
        await pilot.pause(0.3)
        await pilot.press("ctrl+s")
        await until(lambda: app.job_id is not None, "the launch", 120)
        job_id = app.job_id or ""

        def step() -> int:
            row = app.jobs_snapshot.row(job_id)
            return -1 if row is None or row.step is None else row.step

        await until(lambda: step() >= 1500, "step 1500", 240)
        await pilot.pause(2.0)  # the GPU's utilization sampled while it trains
        app.refresh_views(force=True)
        for key, name in (("1", "gpu-hosts"), ("2", "gpu"), ("4", "gpu-job")):
            await pilot.press(key)
            await pilot.pause(0.6)
            app.clear_notifications()
            await pilot.pause(0.3)
            out = ROOT / "screenshots" / f"{name}.svg"
            app.save_screenshot(str(out))
            shots.append(out)
            print(f"  {out.relative_to(ROOT)} at step {step()}", flush=True)
        await asyncio.to_thread(app.client.service.stop, job_id, 2.0, yes=True, wait=True)
    shutil.rmtree(work, ignore_errors=True)
    return shots


def step_screens(sim_gpus: int = 0) -> None:
    """screenshots/gpu-hosts.svg, gpu.svg and gpu-job.svg: the app's Hosts, GPU and Job views
    on this machine's card while the ddp example trains on it."""
    meta = run_meta()
    shots = asyncio.run(_screens(sim_gpus))
    if sim_gpus:
        return  # a dry run: no card to name
    save("screens", {"files": [str(p.relative_to(ROOT)) for p in shots], "sim_gpus": sim_gpus}, meta)


def step_wrap(name: str, path: str) -> None:
    """A benchmark's own result file again as gpu-<name>.json, with the GPU's meta."""
    data = json.loads(Path(path).read_text())
    meta = data.pop("meta", None) or run_meta()
    save(name, {"from": path, **data}, meta)


def main() -> int:
    if len(sys.argv) < 2:
        fail(__doc__ or "", 2)
    step = sys.argv[1]
    if step == "screens-simulated":  # the screens step's dry run, without a GPU
        step_screens(sim_gpus=1)
        return 0
    if step != "check":
        step_check()
    steps = {"check": step_check, "collector": step_collector, "ddp": step_ddp,
             "pipeline": step_pipeline, "screens": step_screens}
    if step == "wrap":
        step_wrap(sys.argv[2], sys.argv[3])
    elif step in steps:
        steps[step]()
    else:
        fail(f"unknown step {step!r}; expected one of {', '.join([*steps, 'wrap'])}", 2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
