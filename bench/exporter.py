"""Prometheus exposition cost: the controller's ``/metrics`` per scrape at 128 hosts x 8 GPUs,
and the agent's node_exporter textfile per write; against dcgm-exporter's resource budget.

(a) ``ControllerService.exposition()``, as ``rigdeck exporter`` and the server answer a scrape:
    the snapshot of a ``ClusterState`` holding 128 hosts x 8 GPUs (simulated samples: every GPU
    busy with one of 16 running jobs, 8 hosts x 64 ranks each, its rank's process and its claim
    as the agent reports them; a few GPUs warn or unhealthy), the view of each of the 50 jobs a
    real ``JobWatch`` follows (16 running, each with 300 steps of every rank's metrics folded,
    34 ended), 5 jobs waiting in a real history's queue; ``cluster_exposition`` and its text.
    Between two scrapes every host sends a new sample (not timed: in use 15 s of telemetry come
    between two scrapes). CPU per scrape: ``time.process_time`` around each call, this thread
    alone running.
(b) The HTTP path: a real ``MetricsServer`` (``tui/control/metricsserver.py``) over
    ``InProcessClient(service).exposition``, scraped over one keep-alive connection with
    ``Accept-Encoding: gzip``, as Prometheus does. Its CPU per scrape: the process's CPU over the
    request less the scraping thread's own (``time.thread_time``): the exposition, the HTTP
    handling and the gzip, on the server's handler thread.
(c) The agent's textfile (``agent/textfile.py``): one host's 8 GPUs rendered and written
    atomically (temporary file, rename) to a temp dir; CPU per write, and as a share of a core at
    the agent's rates (once a second while a controller subscribes, every 5 s otherwise). The
    sampling itself is the agent's telemetry, measured by bench/telemetry.py.

The reference is dcgm-exporter's budget: its Helm chart (github.com/NVIDIA/dcgm-exporter,
``deployment/values.yaml``) suggests ``cpu: 100m`` as the request and the limit of its pod, one
pod per node (a DaemonSet), and its ServiceMonitor scrapes every 15 s: 0.1 core x 15 s = 1.5 CPU
seconds per node per scrape. That budget covers dcgm-exporter's collection and serving; (a) and
(b) are rigdeck's serving alone (its telemetry's cost is bench/telemetry.py's and scale.py's), and
one controller serves all 128 nodes, so each is compared per node and as a whole cluster against
one node's budget.

Usage: .venv/bin/python bench/exporter.py [--hosts 128] [--scrapes 200] [--writes 500]
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent import textfile  # noqa: E402
from bench._meta import run_meta, write_result  # noqa: E402
from bench.common import StubController, StubMonitor  # noqa: E402
from tui.client import InProcessClient, MetricsServer  # noqa: E402
from tui.control.history import History  # noqa: E402
from tui.control.jobwatch import JobsSnapshot, JobWatch, _Track, rank_rows  # noqa: E402
from tui.control.service import ControllerService  # noqa: E402
from tui.model.state import ClusterState  # noqa: E402

GPUS = 8
HOSTS_PER_JOB = 8
JOBS_FOLLOWED = 50  # what the controller's poller follows (JobWatch's limit)
STEPS = 300
QUEUED = 5
NOW = 1_800_000_000.0
# dcgm-exporter's Helm chart: cpu 100m per node's pod; its ServiceMonitor scrapes every 15 s.
DCGM_CPU_CORES = 0.1
DCGM_SCRAPE_S = 15.0
DCGM_BUDGET_S = DCGM_CPU_CORES * DCGM_SCRAPE_S  # CPU seconds per node per scrape
AGENT_RATES_S = (1.0, textfile.IDLE_INTERVAL_S)  # one write a second (subscribed), every 5 s (idle)


def host_name(i: int) -> str:
    return f"gpu{i:03d}"


def job_id(k: int) -> str:
    return f"train-{k:02d}-0101-120000-{k:04x}"


def gpu(i: int, g: int, t: int, rng: random.Random) -> dict[str, Any]:
    """GPU ``g`` of host ``i`` at second ``t``: rank ``(i % 8) * 8 + g`` of job ``i // 8``."""
    k, rank = i // HOSTS_PER_JOB, (i % HOSTS_PER_JOB) * GPUS + g
    health, reason = "ok", None
    if (i * GPUS + g) % 97 == 13:
        health, reason = "warn", "throttled: hardware slowdown"
    elif (i * GPUS + g) % 211 == 5:
        health, reason = "unhealthy", "XID 79: GPU has fallen off the bus"
    return {
        "index": g, "name": "Simulated GPU", "uuid": f"SIM-{i:08x}-{g}", "simulated": True,
        "utilization_pct": round(rng.uniform(60, 100), 1), "memory_used_mb": int(rng.uniform(30000, 80000)),
        "memory_total_mb": 81920, "temperature_c": round(rng.uniform(40, 85), 1),
        "power_w": round(rng.uniform(200, 700), 1), "power_limit_w": 700.0,
        "sm_clock_mhz": int(rng.uniform(1400, 1980)), "ecc_volatile_errors": 0,
        "processes": [{"pid": 10000 + g, "user": "ml", "used_memory_mb": 30000, "job_id": job_id(k), "rank": rank}],
        "claim": {"job_id": job_id(k), "user": "ml", "since": NOW - 3600},
        "health": health, "health_reason": reason,
    }


def sample(i: int, t: int, rng: random.Random) -> dict[str, Any]:
    return {
        "seq": t, "time": NOW + t, "hostname": host_name(i), "gpu_source": "simulated", "simulated": True,
        "cost_s": 0.002, "gpus": [gpu(i, g, t, rng) for g in range(GPUS)],
        "host": {"cpu_pct": rng.uniform(20, 90), "cpu_per_core": [50.0] * 64, "load": [30.0, 28.0, 25.0],
                 "mem_used_mb": int(rng.uniform(2e5, 9e5)), "mem_total_mb": 1_000_000, "swap_used_mb": 0,
                 "swap_total_mb": 0, "disk_read_bps": rng.uniform(0, 5e8), "disk_write_bps": rng.uniform(0, 1e8),
                 "net_rx_bps": rng.uniform(0, 1e9), "net_tx_bps": rng.uniform(0, 1e9)},
    }


def feed(state: ClusterState, n: int, t: int, rng: random.Random) -> None:
    for i in range(n):
        state.apply_sample(host_name(i), sample(i, t, rng), received_at=time.monotonic())


def _record(k: int, n_hosts: int) -> dict[str, Any]:
    running = k < n_hosts // HOSTS_PER_JOB
    hosts = [host_name((k * HOSTS_PER_JOB + h) % n_hosts) for h in range(HOSTS_PER_JOB)]
    spec = {"name": f"train-{k}", "command": ["python3", "train.py"], "launcher": "torchrun",
            "nodes": HOSTS_PER_JOB, "gpus_per_node": GPUS, "total_steps": 100_000, "env": {}}
    return {
        "job_id": job_id(k), "name": f"train-{k}", "spec": spec,
        "state": "running" if running else ("succeeded", "failed", "stopped")[k % 3],
        "placement": [{"host": h, "address": "10.0.0.1", "slots": GPUS, "gpus": list(range(GPUS))} for h in hosts],
        "created": NOW - 7200 - k, "started": NOW - 7000 - k, "ended": None if running else NOW - 3600 - k,
        "restarts": k % 2, "cause": None, "events": [],
    }


def jobs(ctl: StubController, n_hosts: int) -> JobWatch:
    """A real JobWatch following ``JOBS_FOLLOWED`` jobs (not started: nothing is polled)."""

    class _Jobs:
        pass

    stub = _Jobs()
    stub.ctl = ctl  # type: ignore[attr-defined]
    watch = JobWatch(stub, clock=lambda: NOW)
    rows = []
    for k in range(JOBS_FOLLOWED):
        rec = _record(k, n_hosts)
        t = _Track(rec)
        running = rec["state"] == "running"
        ranks = range(HOSTS_PER_JOB * GPUS) if running else range(1)
        t.fold.apply([{"time": NOW - 600 + 2.0 * s, "rank": r, "step": s, "loss": 3.0 / (1 + s / 50) + 0.001 * r}
                      for s in range(STEPS) for r in ranks], NOW)
        t.states = {node["host"]: {
            "state": "running" if running else "succeeded",
            "ranks": [{"rank": n * GPUS + lr, "local_rank": lr, "pid": 10000 + lr, "gpu": lr,
                       "state": "running" if running else "exited", "exit_code": None if running else 0,
                       "signal": None} for lr in range(GPUS)]} for n, node in enumerate(rec["placement"])}
        t.ranks = rank_rows(t.states, rec["placement"])
        t.final = not running
        watch._tracks[rec["job_id"]] = t
        rows.append(t.row())
    watch._snapshot = JobsSnapshot(tuple(rows), 1, polled_at=NOW)
    return watch


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def stats_ms(values: list[float]) -> dict[str, float]:
    return {"mean_ms": round(1000 * statistics.fmean(values), 3), "p50_ms": round(1000 * pct(values, 50), 3),
            "p95_ms": round(1000 * pct(values, 95), 3), "max_ms": round(1000 * max(values), 3)}


def time_exposition(service: ControllerService, state: ClusterState, n: int, scrapes: int,
                    rng: random.Random) -> tuple[dict[str, float], int]:
    cpu = []
    size = 0
    for t in range(scrapes + 5):
        feed(state, n, t, rng)
        c0 = time.process_time()
        text = service.exposition()
        c1 = time.process_time()
        if t >= 5:  # warm-up left out
            cpu.append(c1 - c0)
        size = len(text.encode())
    return stats_ms(cpu), size


def time_http(service: ControllerService, state: ClusterState, n: int, scrapes: int,
              rng: random.Random) -> tuple[dict[str, float], int]:
    server = MetricsServer(InProcessClient(service=service).exposition, "127.0.0.1", 0).start()
    cpu = []
    size = 0
    try:
        host, port = server.address
        conn = http.client.HTTPConnection(host, port, timeout=60)
        for t in range(scrapes + 5):
            feed(state, n, 1000 + t, rng)
            p0, c0 = time.process_time(), time.thread_time()
            conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
            resp = conn.getresponse()
            body = resp.read()
            p1, c1 = time.process_time(), time.thread_time()
            assert resp.status == 200 and resp.headers["Content-Encoding"] == "gzip", resp.status
            if t >= 5:
                cpu.append((p1 - p0) - (c1 - c0))  # the server's threads: the process less this one
            size = len(body)
        conn.close()
        gzip.decompress(body).decode()  # it was whole
    finally:
        server.close()
    return stats_ms(cpu), size


def time_textfile(writes: int, rng: random.Random) -> tuple[dict[str, float], int]:
    cpu = []
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "rigdeck.prom")
        for t in range(writes + 5):
            s = sample(3, t, rng)
            c0 = time.process_time()
            textfile.write(path, textfile.render(s, "gpu003"))
            c1 = time.process_time()
            if t >= 5:
                cpu.append(c1 - c0)
        size = os.path.getsize(path)
    return stats_ms(cpu), size


def report(n: int, expo: dict[str, float], http_ms: dict[str, float], agent: dict[str, float]) -> dict[str, Any]:
    """Each figure against dcgm-exporter's budget, printed and returned."""
    budget_ms = DCGM_BUDGET_S * 1000
    out: dict[str, Any] = {"dcgm_budget_ms_per_node_per_scrape": budget_ms}
    for name, got in (("exposition", expo), ("http", http_ms)):
        per_node = got["mean_ms"] / n
        out[name] = {"per_node_ms": round(per_node, 4), "budget_over_per_node": round(budget_ms / per_node, 1),
                     "cluster_over_one_node_budget": round(got["mean_ms"] / budget_ms, 4),
                     "core_share_at_15s": round(got["mean_ms"] / 1000 / DCGM_SCRAPE_S, 5)}
        print(f"  {name:10s}: {got['mean_ms']:.1f} ms CPU per scrape of {n} hosts (p95 {got['p95_ms']:.1f}) ="
              f" {per_node:.3f} ms per node, {budget_ms / per_node:.0f}x under dcgm-exporter's {budget_ms:.0f} ms"
              f" per node; the whole cluster's scrape is {100 * got['mean_ms'] / budget_ms:.1f}% of ONE node's"
              f" budget ({100 * got['mean_ms'] / 1000 / DCGM_SCRAPE_S:.2f}% of a core at one scrape per 15 s)")
    out["textfile"] = {}
    for every in AGENT_RATES_S:
        cores = agent["mean_ms"] / 1000 / every
        out["textfile"][f"every_{every:g}s"] = {"millicores": round(1000 * cores, 3),
                                                "budget_over": round(DCGM_CPU_CORES / cores, 1)}
        print(f"  textfile  : {agent['mean_ms']:.2f} ms CPU per write of 8 GPUs; one every {every:g} s ="
              f" {1000 * cores:.2f} millicores, {DCGM_CPU_CORES / cores:.0f}x under dcgm-exporter's 100m per node")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=128)
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--writes", type=int, default=500)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "exporter.json"))
    args = ap.parse_args()
    meta = run_meta()
    rng = random.Random(34)
    n = args.hosts
    ctl = StubController(n, user="ml")
    state = ClusterState([(h.name, h.address) for h in ctl.inventory.hosts])
    with tempfile.TemporaryDirectory() as d:
        history = History(Path(d) / "history.sqlite")
        for q in range(QUEUED):
            history.create(f"wait-{q}", f"wait-{q}", {"nodes": 4, "gpus_per_node": GPUS}, state="queued")
            history.update(f"wait-{q}", priority=q % 2)
        service = ControllerService(ctl.inventory, controller=ctl, monitor=StubMonitor(state),  # type: ignore[arg-type]
                                    source=jobs(ctl, n), history=history)
        print(f"{n} hosts x {GPUS} GPUs, {JOBS_FOLLOWED} jobs followed ({n // HOSTS_PER_JOB} running), "
              f"{QUEUED} queued; {args.scrapes} scrapes, {args.writes} textfile writes", flush=True)
        expo, expo_bytes = time_exposition(service, state, n, args.scrapes, rng)
        print(f"exposition(): CPU per scrape mean {expo['mean_ms']:.1f} ms, p50 {expo['p50_ms']:.1f}, "
              f"p95 {expo['p95_ms']:.1f} ms; {expo_bytes / 1e6:.2f} MB of text", flush=True)
        http_ms, gz_bytes = time_http(service, state, n, args.scrapes, rng)
        print(f"GET /metrics (gzip): server CPU per scrape mean {http_ms['mean_ms']:.1f} ms, p50 "
              f"{http_ms['p50_ms']:.1f}, p95 {http_ms['p95_ms']:.1f} ms; {gz_bytes / 1e3:.0f} kB on the wire",
              flush=True)
        history.close()
    agent, agent_bytes = time_textfile(args.writes, rng)
    print(f"agent textfile: CPU per write mean {agent['mean_ms']:.2f} ms, p95 {agent['p95_ms']:.2f} ms; "
          f"{agent_bytes / 1e3:.1f} kB", flush=True)
    print(f"against dcgm-exporter (Helm chart: cpu 100m per node, a scrape every {DCGM_SCRAPE_S:g} s = "
          f"{DCGM_BUDGET_S:g} CPU s per node per scrape):")
    compared = report(n, expo, http_ms, agent)
    write_result(args.out, {
        "hosts": n, "gpus_per_host": GPUS, "jobs_followed": JOBS_FOLLOWED, "queued": QUEUED,
        "scrapes": args.scrapes, "writes": args.writes,
        "exposition": {**expo, "bytes": expo_bytes}, "http_gzip": {**http_ms, "bytes_on_wire": gz_bytes},
        "textfile": {**agent, "bytes": agent_bytes},
        "baseline": {"name": "dcgm-exporter's Helm chart resources (cpu: 100m per node) at its 15 s scrape",
                     "source": "https://github.com/NVIDIA/dcgm-exporter/blob/main/deployment/values.yaml",
                     "cpu_cores_per_node": DCGM_CPU_CORES, "scrape_interval_s": DCGM_SCRAPE_S},
        "compared": compared,
    }, meta)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
