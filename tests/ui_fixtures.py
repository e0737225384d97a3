"""Recorded cluster and job data for the app's pilot and snapshot tests: no network, no clocks,
no randomness. The same folding code as the live app (ClusterState, jobwatch) turns it into what
the app shows."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tui.control.hostlinks import HostReport
from tui.control.jobwatch import JobWatch, _Track
from tui.model.inventory import HostSpec, Inventory
from tui.model.jobspec import JobSpec
from tui.model.jobview import JobRow
from tui.model.scheduler import PlacementError
from tui.model.state import ClusterState, HostStatus

T0 = 1_760_000_000.0  # the recorded job started here


def job_row(job_id: str, state: str, placement: tuple[dict[str, Any], ...] = ()) -> JobRow:
    """A jobs-table row with nothing measured yet: its id, state and placement only."""
    return JobRow(job_id=job_id, name=job_id, state=state, placement=placement, ranks_running=0,
                  ranks_total=0, step=None, loss=None, step_rate=None, total_steps=None,
                  created=None, started=None, ended=None, restarts=0, checkpoint_owner="-",
                  cause=None)
NOW = T0 + 125.0  # the app's clock in these tests
JOB = "ddp-1009-091320-ab12"
OLD_JOB = "ticker-1009-084500-9f3c"
FAILED_JOB = "fragile-1009-085010-77e1"
FINGERPRINT = "SHA256:q3m8yR5m0V2bXvY0f2Jx1m2ZrWcDf0Qw8d4pJkH5bLs"


def inventory(n: int = 3, known_hosts: Path = Path("/recorded/known_hosts")) -> Inventory:
    hosts = tuple(
        HostSpec(
            name=f"h{i}", address=f"10.213.1.{10 + i}", user="root", python="python3", sim_gpus=4
        )
        for i in range(1, n + 1)
    )
    return Inventory(hosts=hosts, path=Path("/recorded/hosts.toml"), known_hosts=known_hosts)


def gpu_sample(
    host_i: int,
    idx: int,
    tick: int,
    job: str | None = None,
    rank: int | None = None,
    foreign: str | None = None,
) -> dict[str, Any]:
    busy = job is not None or foreign is not None
    util = (55.0 + 40.0 * math.sin(tick / 3.0 + idx + host_i)) if busy else 0.0
    util = round(max(0.0, min(100.0, util)), 1)
    procs = []
    if job is not None:
        procs.append(
            {
                "pid": 4100 + 10 * host_i + idx,
                "user": "root",
                "used_memory_mb": 9000 + 700 * idx,
                "job_id": job,
                "rank": rank,
            }
        )
    if foreign is not None:
        procs.append(
            {
                "pid": 5200 + idx,
                "user": foreign,
                "used_memory_mb": 30000,
                "job_id": None,
                "rank": None,
            }
        )
    return {
        "index": idx,
        "name": "Simulated GPU",
        "uuid": f"SIM-{host_i:08x}-{idx}",
        "simulated": True,
        "utilization_pct": util,
        "memory_used_mb": (300 + sum(p["used_memory_mb"] for p in procs)) if procs else 0,
        "memory_total_mb": 81920,
        "temperature_c": round(30.0 + 0.5 * util, 1),
        "power_w": round(60.0 + 6.0 * util, 1),
        "power_limit_w": 700.0,
        "sm_clock_mhz": 1980 if busy else 345,
        "ecc_volatile_errors": 0,
        "processes": procs,
    }


def host_sample(host_i: int, tick: int, gpus: list[dict[str, Any]]) -> dict[str, Any]:
    busy = sum(1 for g in gpus if g["processes"])
    return {
        "seq": tick,
        "time": T0 + tick,
        "hostname": f"tb1-h{host_i}",
        "gpu_source": "simulated",
        "simulated": True,
        "cost_s": 0.001,
        "gpus": gpus,
        "host": {
            "cpu_pct": 8.0 + 21.0 * busy + host_i,
            "cpu_per_core": [10.0] * 16,
            "load": [1.0, 1.0, 1.0],
            "mem_used_mb": 6000 + 9000 * busy,
            "mem_total_mb": 64000,
            "swap_used_mb": 0,
            "swap_total_mb": 0,
            "disk_read_bps": 0.0,
            "disk_write_bps": 0.0,
            "net_rx_bps": 0.0,
            "net_tx_bps": 0.0,
        },
    }


def cluster_state(ticks: int = 30) -> ClusterState:
    """h1 and h2 up running JOB's four ranks (and bob's process on h2 GPU 3); h3 down: its host
    key is unknown."""
    state = ClusterState([(f"h{i}", f"10.213.1.{10 + i}") for i in (1, 2, 3)])
    for i in (1, 2):
        state.set_agent(
            f"h{i}", {"agent_version": "3f9c2a71d04b8e15", "pid": 40 + i, "hostname": f"tb1-h{i}"}
        )
    for tick in range(ticks):
        for i in (1, 2):
            gpus = []
            for idx in range(4):
                job = JOB if idx < 2 else None
                rank = (i - 1) * 2 + idx if job else None
                foreign = "bob" if (i == 2 and idx == 3) else None
                gpus.append(gpu_sample(i, idx, tick, job, rank, foreign))
            state.apply_sample(f"h{i}", host_sample(i, tick, gpus), received_at=float(tick))
    state.set_status(
        "h3",
        HostStatus.DOWN,
        f"unknown host key for 10.213.1.13: ssh-ed25519 {FINGERPRINT}",
        kind="unknown-host-key",
        host_key={"type": "ssh-ed25519", "fingerprint": FINGERPRINT, "name": "10.213.1.13"},
    )
    return state


class FakeMonitor:
    def __init__(self, state: ClusterState, rate_hz: float = 1.0):
        self.state = state
        self.rate_hz = rate_hz
        self.reconnects: list[str] = []
        self.started = False

    def start(self) -> FakeMonitor:
        self.started = True
        return self

    def stop(self, timeout: float = 0.0) -> None:
        self.started = False

    def reconnect(self, host: str) -> None:
        self.reconnects.append(host)


class FakeController:
    def __init__(self, inv: Inventory | None = None):
        self.inventory = inv or inventory()
        self.deployed: list[list[str] | None] = []
        self.trusted: list[tuple[str, str]] = []
        self.closed = False

    def deploy(self, names: list[str] | None = None) -> list[HostReport]:
        self.deployed.append(names)
        return [
            HostReport(
                name=n,
                address="x",
                port=22,
                transport="ssh",
                reachable=True,
                agent_version="3f9c2a71d04b8e15",
                copied=False,
            )
            for n in (names or self.inventory.names)
        ]

    def trust_host_key(self, host: str, fingerprint: str) -> str:
        self.trusted.append((host, fingerprint))
        return "10.213.1.13"

    def close(self) -> None:
        self.closed = True


# ---------------------------------------------------------------------------------------------
# Jobs


def _placement(hosts: list[str], gpus: list[int]) -> list[dict[str, Any]]:
    return [
        {
            "host": h,
            "address": f"10.213.1.{10 + int(h[1:])}",
            "slots": len(gpus),
            "gpus": gpus,
            "cpus": 16,
            "instance_type": "rigdeck.sim-gpu-4",
            "simulated": True,
        }
        for h in hosts
    ]


def _spec(name: str, total: int | None, owner: str = "rank0") -> dict[str, Any]:
    return {
        "name": name,
        "command": ["python3", "train.py"],
        "workdir": "/work/examples/ddp",
        "launcher": "torchrun",
        "nodes": 2,
        "hosts": [],
        "gpus_per_node": 2,
        "processes_per_node": None,
        "env": {},
        "max_runtime_s": 3600,
        "grace_s": 30.0,
        "hyperparameters": {},
        "checkpoint": {"dir": "/shared/ckpt/ddp", "owner": owner},
        "restart": {"max_restarts": 1, "on_exit_codes": []},
        "mpi": {"custom_options": []},
        "loss_pattern": None,
        "total_steps": total,
        "channels": {},
        "path": None,
    }


def _ranks(hosts: list[str], state: str, exit_code: int | None = None) -> dict[str, Any]:
    out = {}
    for n, h in enumerate(hosts):
        ranks = [
            {
                "rank": 2 * n + lr,
                "local_rank": lr,
                "pid": 4100 + 10 * n + lr,
                "state": state,
                "exit_code": exit_code,
                "signal": None,
            }
            for lr in range(2)
        ]
        out[h] = {
            "state": "running" if state == "running" else "succeeded",
            "ranks": ranks,
            "log_ranks": [r["rank"] for r in ranks],
        }
    return out


def ddp_metrics(steps: int = 241) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for s in range(steps):
        loss = 2.9 * math.exp(-s / 70.0) + 0.35 + 0.04 * math.sin(s * 1.7)
        for rank in range(4):
            records.append(
                {
                    "time": T0 + 2.0 + 0.45 * s,
                    "rank": rank,
                    "step": s,
                    "loss": round(loss + 0.01 * rank, 6),
                }
            )
    owner = {"rank": 0, "host": "h1", "gpu": 0}
    records.append(
        {
            "time": T0 + 1.5,
            "rank": 0,
            "event": "checkpoint_owner",
            "policy": "host:h3/gpu:0",
            "from": {"host": "h3", "gpu": 0},
            "to": owner,
            "reason": "host h3 not in this run",
        }
    )
    for step, status, secs, err in (
        (50, "done", 0.21, None),
        (100, "done", 0.24, None),
        (150, "failed", 0.05, "OSError: [Errno 28] No space left on device"),
        (200, "done", 0.22, None),
        (240, "writing", 0.0, None),
    ):
        t = T0 + 2.0 + 0.45 * step
        records.append(
            {
                "time": t,
                "rank": 0,
                "event": "checkpoint",
                "status": "writing",
                "step": step,
                "bytes": 0,
                "seconds": 0.0,
                "path": f"/shared/ckpt/ddp/step-{step:08d}.pt",
                "owner": owner,
                "error": None,
            }
        )
        if status != "writing":
            records.append(
                {
                    "time": t + secs,
                    "rank": 0,
                    "event": "checkpoint",
                    "status": status,
                    "step": step,
                    "bytes": 4_718_592 if status == "done" else 0,
                    "seconds": secs,
                    "path": f"/shared/ckpt/ddp/step-{step:08d}.pt",
                    "owner": owner,
                    "error": err,
                }
            )
    return records


def ddp_logs() -> list[tuple[str, int, str]]:
    lines = []
    for rank in range(4):
        host = "h1" if rank < 2 else "h2"
        lines.append((host, rank, f"rank {rank}: world 4, master 10.213.1.11:29511, gloo"))
    for s in range(0, 241, 10):
        for rank in range(4):
            host = "h1" if rank < 2 else "h2"
            loss = 2.9 * math.exp(-s / 70.0) + 0.35 + 0.04 * math.sin(s * 1.7) + 0.01 * rank
            lines.append((host, rank, f"step {s:4d} loss={loss:.4f} lr=0.00300 tok/s=18432"))
            if s == 150 and rank == 0:
                lines.append(
                    (
                        host,
                        rank,
                        "checkpoint step 150 FAILED: OSError: [Errno 28] No space left on device",
                    )
                )
    return lines


class RecordedJobs(JobWatch):
    """A JobWatch whose jobs come from recorded data; launch and stop are recorded too."""

    def __init__(self, hosts: list[str] | None = None):
        class _Ctl:
            inventory = inventory()

        class _Jobs:
            ctl = _Ctl()

        super().__init__(_Jobs(), clock=lambda: NOW)
        self.hosts = hosts or ["h1", "h2", "h3"]
        self.launched: list[JobSpec] = []
        self.stopped: list[str] = []
        self.launch_error: Exception | None = None
        recs = [
            {
                "job_id": JOB,
                "name": "ddp",
                "state": "running",
                "spec": _spec("ddp", 300, "host:h3/gpu:0"),
                "placement": _placement(["h1", "h2"], [0, 1]),
                "created": T0,
                "started": T0 + 1.0,
                "ended": None,
                "restarts": 0,
                "cause": None,
                "events": [],
            },
            {
                "job_id": FAILED_JOB,
                "name": "fragile",
                "state": "failed",
                "spec": _spec("fragile", None),
                "placement": _placement(["h1", "h2"], [2, 3]),
                "created": T0 - 1500,
                "started": T0 - 1499,
                "ended": T0 - 1400,
                "restarts": 1,
                "cause": {
                    "rank": 3,
                    "host": "h2",
                    "signal": 9,
                    "tail": ["step 57 loss=0.81", "Killed"],
                },
                "events": [],
            },
            {
                "job_id": OLD_JOB,
                "name": "ticker",
                "state": "succeeded",
                "spec": _spec("ticker", 60),
                "placement": _placement(["h1", "h2"], [0, 1]),
                "created": T0 - 1800,
                "started": T0 - 1799,
                "ended": T0 - 1769,
                "restarts": 0,
                "cause": None,
                "events": [],
            },
        ]
        from tui.control.jobwatch import JobsSnapshot, rank_rows

        for rec in recs:
            t = _Track(rec)
            hosts_of = [n["host"] for n in rec["placement"]]
            states = _ranks(
                hosts_of,
                "running" if rec["state"] == "running" else "exited",
                None if rec["state"] == "running" else 0,
            )
            t.states = states
            t.ranks = rank_rows(states, rec["placement"])
            if rec["job_id"] == JOB:
                t.fold.apply(ddp_metrics(), NOW)
                t.logs.extend(ddp_logs())
            elif rec["job_id"] == OLD_JOB:
                t.fold.apply(
                    [
                        {"time": T0 - 1798 + 0.5 * s, "rank": 0, "step": s, "loss": 1.0 / (s + 1)}
                        for s in range(60)
                    ],
                    NOW,
                )
            else:
                t.fold.apply(
                    [
                        {"time": T0 - 1498 + 1.0 * s, "rank": 0, "step": s, "loss": 2.0 - s / 40}
                        for s in range(58)
                    ],
                    NOW,
                )
            t.final = rec["state"] != "running"
            self._tracks[rec["job_id"]] = t
        self._snapshot = JobsSnapshot(tuple(self._tracks[r["job_id"]].row() for r in recs), 1)

    def start(self) -> RecordedJobs:
        return self

    def stop(self, timeout: float = 0.0) -> None:
        pass

    def inventory_hosts(self) -> list[str]:
        return list(self.hosts)

    def launch(self, spec: JobSpec, user: str | None = None, env_values: Mapping[str, str] | None = None) -> str:
        if self.launch_error is not None:
            raise self.launch_error
        self.launched.append(spec)
        return JOB

    def stop_job(self, job_id: str) -> str:
        self.stopped.append(job_id)
        return "stopped"


def signal_jobs() -> RecordedJobs:
    """The recorded jobs, the running one with live signals: rank 3 (h2) a straggler, and a
    world of 4 against a [scaling] reference of 8."""
    jobs = RecordedJobs()
    track = jobs._tracks[JOB]
    track.rec = {**track.rec, "spec": {**track.rec["spec"],
                                       "scaling": {"reference_world_size": 8, "base_lr": 0.1, "warmup_steps": 500}}}
    track.times.add({"rank": r, "host": "h1" if r < 2 else "h2", "step": s,
                     "step_time": 0.9 if r == 3 else 0.3 + 0.01 * (s % 3)}
                    for s in range(1, 30) for r in range(4))
    track.diagnose(None)
    return jobs


# A plan as docs/contracts.md's mp_plan event carries it: 8 blocks, block 3 heavy (4x the others),
# cut so the heavy block is a stage of its own; the equal-layer split would put it beside another.
MP_PLAN: dict[str, Any] = {
    "version": 1, "optimize": "speed", "schedule": "interleaved", "microbatches": 8, "partitions": 4,
    "blocks": 8, "cuts": [3, 4, 6], "source": "profiled",
    "stages": [
        {"stage": 0, "blocks": [0, 3], "time_s": 0.0036, "memory_bytes": 310_000_000, "send_bytes": 2_097_152},
        {"stage": 1, "blocks": [3, 4], "time_s": 0.0048, "memory_bytes": 402_000_000, "send_bytes": 2_097_152},
        {"stage": 2, "blocks": [4, 6], "time_s": 0.0024, "memory_bytes": 205_000_000, "send_bytes": 2_097_152},
        {"stage": 3, "blocks": [6, 8], "time_s": 0.0026, "memory_bytes": 221_000_000, "send_bytes": 0},
    ],
    "bubble": 3 / 11,
    "equal_split": {"cuts": [2, 4, 6], "max_time_s": 0.0060, "max_memory_bytes": 505_000_000},
}


def mp_records(step: int = 240) -> list[dict[str, Any]]:
    """Rank 0's mp_plan and every rank's latest mp_stage (step time, busy time, peak memory)."""
    measured = [(0.0410, 0.0301, 331_000_000), (0.0412, 0.0395, 418_000_000),
                (0.0409, 0.0198, 214_000_000), (0.0411, 0.0215, 236_000_000)]
    out: list[dict[str, Any]] = [{"time": NOW - 200, "rank": 0, "host": "h1", "event": "mp_plan", "plan": MP_PLAN}]
    for rank, (st, busy, peak) in enumerate(measured):
        out.append({"time": NOW - 1, "rank": rank, "host": "h1" if rank < 2 else "h2", "event": "mp_stage",
                    "stage": rank, "step": step, "step_time_s": st, "busy_s": busy, "peak_bytes": peak})
    return out


def stage_jobs() -> RecordedJobs:
    """The recorded jobs, the running one a [model_parallel] job with a plan and its stages
    measured (stage 1, the heavy block, the busiest)."""
    jobs = RecordedJobs()
    track = jobs._tracks[JOB]
    track.rec = {**track.rec, "spec": {**track.rec["spec"], "model_parallel": {
        "partitions": 4, "microbatches": 8, "pipeline": "interleaved", "optimize": "speed",
        "activation_checkpointing": False, "profile_batch": [64, 512], "batch_size": 64, "plan": None}}}
    track.stages.add(mp_records())
    return jobs


# A job made of worker pools (docs/contracts.md): 1 primary and 2 workers with a GPU each, 1
# reduction server and 1 evaluator on the CPU host h3; one plan node per replica.
POOL_NODES: list[tuple[str, int, str, list[int]]] = [
    ("primary", 0, "h1", [0]), ("worker", 0, "h1", [1]), ("worker", 1, "h2", [0]),
    ("reduction_server", 0, "h3", []), ("evaluator", 0, "h3", []),
]
POOL_SIZING: dict[str, Any] = {
    "workers_gbps": 30.0, "reducers_gbps": 10.0, "per_reducer_gbps": 10.0, "reducers": 1, "match": 3, "ok": False,
    "text": "reduction servers 1 x 10 Gbps = 10 Gbps < workers 3 x 10 Gbps = 30 Gbps: 3 would match",
}
EVAL_KILLED = 'evaluator 0 on h3 was killed by signal 9; training continues (on_failure = "continue")'


def pool_jobs(evaluator_failed: bool = True) -> RecordedJobs:
    """The recorded jobs, the running one a 4-pool job (primary, workers, reduction server,
    evaluator) on h1-h3 with its Reduction Server sizing; its evaluator killed by signal 9
    (``evaluator_failed``), which it reported as a ``replica failed`` event while training goes on."""
    jobs = RecordedJobs()
    track = jobs._tracks[JOB]
    placement = []
    for role, idx, h, gpus in POOL_NODES:
        placement.append({"host": h, "address": f"10.213.1.{10 + int(h[1:])}", "slots": 1, "gpus": gpus,
                          "cpus": 16, "instance_type": "rigdeck.sim-gpu-4" if gpus else "rigdeck.cpu-16",
                          "simulated": bool(gpus), "pool": role, "replica": idx})
    spec = {**track.rec["spec"], "launcher": "direct", "nodes": None, "gpus_per_node": None,
            "pools": [{"role": "primary", "replicas": 1, "gpus_per_replica": 1},
                      {"role": "worker", "replicas": 2, "gpus_per_replica": 1},
                      {"role": "reduction_server", "replicas": 1, "processes_per_replica": 1, "labels": ["cpu"]},
                      {"role": "evaluator", "replicas": 1, "processes_per_replica": 1, "on_failure": "continue"}]}
    events: list[dict[str, Any]] = []
    if evaluator_failed:
        events.append({"time": NOW - 30, "event": "replica failed", "pool": "evaluator", "replica": 0, "host": "h3",
                       "restart_count": 0, "exit_code": None, "signal": 9, "continues": True,
                       "message": EVAL_KILLED})
    track.rec = {**track.rec, "spec": spec, "placement": placement, "pool_sizing": POOL_SIZING, "events": events}
    states: dict[str, Any] = {}
    for i, (role, idx, h, _gpus) in enumerate(POOL_NODES):
        failed = evaluator_failed and role == "evaluator"
        st = states.setdefault(h, {"state": "running", "restart_count": 0, "ranks": [], "log_ranks": [],
                                   "replicas": []})
        st["ranks"].append({"rank": i, "local_rank": sum(1 for n in POOL_NODES[:i] if n[2] == h), "pid": 4100 + i,
                            "state": "exited" if failed else "running", "exit_code": None,
                            "signal": 9 if failed else None})
        st["log_ranks"].append(i)
        st["replicas"].append({"node_index": i, "pool": role, "replica": idx, "ranks": [i],
                               "state": "failed" if failed else "running", "exit_code": None,
                               "signal": 9 if failed else None, "message": None})
    from tui.control.jobwatch import JobsSnapshot, rank_rows

    track.states = states
    track.ranks = rank_rows(states, placement)
    jobs._snapshot = JobsSnapshot(tuple(t.row() for t in jobs._tracks.values()), 2)
    return jobs


PROCESSING_INPUTS = [{"name": "raw", "source": "/data/raw", "distribution": "ShardedByKey"},
                     {"name": "vocab", "source": "/data/vocab", "distribution": "FullyReplicated"}]


def processing_jobs(started: bool = True) -> RecordedJobs:
    """The recorded jobs with JOB made a processing job over h1-h3: a ShardedByKey input of 30
    files (listed on h1, 10 a host) and a FullyReplicated one, one output (``started``: the
    controller's ``processing`` event is there; otherwise the job has not listed its input yet)."""
    jobs = RecordedJobs()
    track = jobs._tracks[JOB]
    spec = {**track.rec["spec"], "kind": "processing", "launcher": "direct", "nodes": 3,
            "gpus_per_node": None, "processes_per_node": 1,
            "processing": {"inputs": PROCESSING_INPUTS, "outputs": [{"name": "counts"}]}}
    placement = [{"host": h, "address": f"10.213.1.{10 + i}", "slots": 1, "gpus": [], "cpus": 16,
                  "instance_type": "rigdeck.cpu-16", "simulated": False} for i, h in enumerate(["h1", "h2", "h3"], 1)]
    events: list[dict[str, Any]] = []
    if started:
        events.append({"time": T0 + 1.0, "event": "processing", "inputs": {
            "raw": {"distribution": "ShardedByKey", "total": 30, "listed_on": "h1", "listing_sha256": "ab" * 32,
                    "hosts": {"h1": 10, "h2": 10, "h3": 10}},
            "vocab": {"distribution": "FullyReplicated"}}})
    track.rec = {**track.rec, "spec": spec, "placement": placement, "events": events}
    from tui.control.jobwatch import JobsSnapshot, MetricsFold, rank_rows

    track.fold = MetricsFold()  # a processing job reports no loss
    track.states = {h: {"state": "running", "restart_count": 0, "log_ranks": [i],
                        "ranks": [{"rank": i, "local_rank": 0, "pid": 4200 + i, "state": "running",
                                   "exit_code": None, "signal": None}]} for i, h in enumerate(["h1", "h2", "h3"])}
    track.ranks = rank_rows(track.states, placement)

    jobs._snapshot = JobsSnapshot(tuple(t.row() for t in jobs._tracks.values()), 2)
    return jobs


# ---------------------------------------------------------------------------------------------
# Training that heals itself: a GPU fault moved JOB away, and an operator drained another GPU

XID_REASON = "XID 79: GPU has fallen off the bus"  # agent/gpuhealth.py's words for the fault
FAULT_MESSAGE = f"h1 GPU 1 (simulated): {XID_REASON}"  # the incident's (tui/control/healing.py)
HAND_DRAIN = "drained by root: fan noise"  # ControllerService._sync_drains' words for `rigdeck drain`
FAULT_STEP = 118  # the last step before the fault stopped JOB
RESUME_STEP = 100  # the checkpoint the restart resumed from
STOPPED_AT = T0 + 2.0 + 0.45 * FAULT_STEP + 1.5  # when rigdeck stopped the first attempt
RESUMED_AT = STOPPED_AT + 14.0  # the second attempt's first step
HEALED_PLACEMENT = {"h1": [0, 2], "h2": [0, 1]}  # where JOB runs again: not on h1 GPU 1


def healing_state(ticks: int = 30) -> ClusterState:
    """Three hosts up after the fault: JOB's ranks on h1 GPUs 0 and 2 and h2 GPUs 0 and 1; h1
    GPU 1 unhealthy (an XID 79, simulated; rigdeck drained it too), h2 GPU 2 drained by hand,
    bob's process on h2 GPU 3."""
    state = ClusterState([(f"h{i}", f"10.213.1.{10 + i}") for i in (1, 2, 3)])
    for i in (1, 2, 3):
        state.set_agent(f"h{i}", {"agent_version": "3f9c2a71d04b8e15", "pid": 40 + i, "hostname": f"tb1-h{i}"})
    state.set_drains({("h1", 1): f"drained by rigdeck: {FAULT_MESSAGE}", ("h2", 2): HAND_DRAIN})
    for tick in range(ticks):
        for i in (1, 2, 3):
            gpus = []
            for idx in range(4):
                gpus_of = HEALED_PLACEMENT.get(f"h{i}", [])
                job = JOB if idx in gpus_of else None
                rank = 2 * (i - 1) + gpus_of.index(idx) if job else None
                foreign = "bob" if (i == 2 and idx == 3) else None
                g = gpu_sample(i, idx, tick, job, rank, foreign)
                g["health"], g["health_reason"] = "ok", None
                if (i, idx) == (1, 1):
                    g["health"], g["health_reason"] = "unhealthy", XID_REASON
                gpus.append(g)
            state.apply_sample(f"h{i}", host_sample(i, tick, gpus), received_at=float(tick))
    return state


def healing_metrics() -> list[dict[str, Any]]:
    """JOB's steps: the first attempt to FAULT_STEP, the second (``restart`` 1) from RESUME_STEP + 1
    up to the app's clock; each rank's loss as ``ddp_metrics`` has it."""
    records: list[dict[str, Any]] = []
    attempts = [(0, range(0, FAULT_STEP + 1), T0 + 2.0),
                (1, range(RESUME_STEP + 1, RESUME_STEP + 1 + int((NOW - 1 - RESUMED_AT) / 0.45)), RESUMED_AT)]
    for attempt, steps, start in attempts:
        for n, s in enumerate(steps):
            loss = 2.9 * math.exp(-s / 70.0) + 0.35 + 0.04 * math.sin(s * 1.7)
            records += [{"time": start + 0.45 * n, "rank": rank, "step": s, "loss": round(loss + 0.01 * rank, 6),
                         "restart": attempt} for rank in range(4)]
    return records


def healing_incident() -> Any:
    """JOB's incident as the history keeps it (tui/control/healing.py): when it was found, when
    the attempt had stopped, when the next one started and took its first step, its last step;
    the steps lost are not kept (they are read from the metrics)."""
    from tui.model.health import Incident

    return Incident(kind="gpu", detected_at=STOPPED_AT, message=FAULT_MESSAGE, host="h1", gpu=1,
                    last_step=FAULT_STEP, resumed_at=RESUMED_AT, resume_s=RESUMED_AT - STOPPED_AT - 2.0, attempt=0,
                    detect_s=2.8, stopped_at=STOPPED_AT + 2.0, started_at=STOPPED_AT + 4.0)


def healing_jobs(incident: bool = True) -> RecordedJobs:
    """The recorded jobs, the running one after rigdeck moved it off h1 GPU 1 (``incident``): its
    second attempt on HEALED_PLACEMENT, resumed from step RESUME_STEP, its incident kept, its
    steps kept for goodput. Without ``incident``: the same job running its first attempt, never
    stopped (no incident, no restart)."""
    from tui.control.jobwatch import JobsSnapshot, MetricsFold, rank_rows

    jobs = RecordedJobs()
    track = jobs._tracks[JOB]
    started = {"time": T0 + 1.0, "event": "started", "restart_count": 0}
    if not incident:
        track.rec = {**track.rec, "events": [started]}
        track.keep_steps(ddp_metrics())
        jobs._snapshot = JobsSnapshot(tuple(t.row() for t in jobs._tracks.values()), 2)
        return jobs
    placement = [n for h, gpus in HEALED_PLACEMENT.items() for n in _placement([h], gpus)]
    events = [started,
              {"time": STOPPED_AT, "event": "incident", "cause": {"message": FAULT_MESSAGE, "kind": "gpu",
                                                                 "host": "h1", "gpu": 1}},
              {"time": STOPPED_AT + 2.0, "event": "restart", "restart_count": 1},
              {"time": STOPPED_AT + 4.0, "event": "started", "restart_count": 1}]
    track.rec = {**track.rec, "placement": placement, "restarts": 1, "started": STOPPED_AT + 4.0,
                 "events": events}
    track.fold = MetricsFold()
    records = healing_metrics()
    track.fold.apply(records, NOW)
    track.keep_steps(records)
    track.incidents = (healing_incident(),)
    track.states = _ranks(list(HEALED_PLACEMENT), "running")
    track.ranks = rank_rows(track.states, placement)
    jobs._snapshot = JobsSnapshot(tuple(t.row() for t in jobs._tracks.values()), 2)
    return jobs


# ---------------------------------------------------------------------------------------------
# Links to experiment trackers

WANDB_RUN = "https://wandb.ai/acme/llm-pretrain/runs/3kx9q2vb"
MLFLOW_RUN = "http://10.213.1.5:5000/#/experiments/7/runs/0f1e2d3c4b5a69788796a5b4c3d2e1f0"


def tracker_jobs(extra: int = 0) -> RecordedJobs:
    """The recorded jobs, the running one's hosts reporting the links its ranks printed (as
    ``job_status`` has them): a W&B run on rank 0 (h1), an MLflow run on rank 2 (h2), which rank
    3 printed too; ``extra`` more TensorBoard links on h2."""
    from tui.control.jobwatch import JobsSnapshot

    jobs = RecordedJobs()
    track = jobs._tracks[JOB]
    h1, h2 = track.states["h1"], track.states["h2"]
    h1["links"] = [{"kind": "wandb", "url": WANDB_RUN, "rank": 0, "time": T0 + 3.0}]
    h2["links"] = [{"kind": "mlflow", "url": MLFLOW_RUN, "rank": 2, "time": T0 + 4.0},
                   {"kind": "mlflow", "url": MLFLOW_RUN, "rank": 3, "time": T0 + 4.5}]
    h2["links"] += [{"kind": "tensorboard", "url": f"http://h2:{6006 + i}/#scalars", "rank": 2, "time": T0 + 5 + i}
                    for i in range(extra)]
    jobs._snapshot = JobsSnapshot(tuple(t.row() for t in jobs._tracks.values()), 2)
    return jobs


# ---------------------------------------------------------------------------------------------
# Sweeps

SWEEP = "sweep-lr-sw3f9c2a"
OLD_SWEEP = "grid-width-sw81d0e4"
PENALTY = {"adamw": 0.0, "adam": 0.05, "sgd": 0.3}


def val_loss(lr: float, width: int, optimizer: str, step: int) -> float:
    """examples/sweep/objective.py's curve: lowest at lr 0.01, width 128, adamw."""
    floor = (math.log10(lr) + 2.0) ** 2 / 4.0 + ((width - 128) / 128.0) ** 2 + PENALTY[optimizer]
    return floor + 1.5 * math.exp(-(0.08 + 0.12 * min(1.0, lr / 0.01)) * step)


# (lr, width, optimizer, state, steps reported, error)
SWEEP_TRIALS: list[tuple[float, int, str, str, int, str | None]] = [
    (0.0031, 64, "adam", "completed", 30, None),
    (0.21, 224, "sgd", "completed", 30, None),
    (0.012, 144, "adamw", "completed", 30, None),
    (0.00042, 96, "adamw", "completed", 30, None),
    (0.0087, 112, "adamw", "completed", 30, None),
    (0.055, 32, "adam", "pruned", 9, None),
    (0.0011, 176, "sgd", "pruned", 12, None),
    (0.0105, 128, "adam", "completed", 30, None),
    (0.0093, 136, "adamw", "completed", 30, None),
    (0.6, 16, "sgd", "failed", 0, "rank 0 on h2 exited with code 1"),
    (0.011, 120, "adamw", "running", 14, None),
    (0.0078, 160, "adam", "running", 5, None),
]


def _trial(sweep_id: str, number: int, lr: float, width: int, opt: str, state: str, steps: int,
           error: str | None, started: float) -> Any:
    from tui.model.sweepview import TrialRow

    curve = tuple((s, round(val_loss(lr, width, opt, s), 6)) for s in range(1, steps + 1))
    best = min(curve, key=lambda c: c[1]) if curve else None
    done = state in ("completed", "pruned", "failed", "stopped")
    return TrialRow(
        number=number,
        job_id=f"{sweep_id.split('-sw')[0]}-t{number}-{number:02d}a{number % 7}c{number % 5}",
        state=state,
        params=(("lr", lr), ("width", width), ("optimizer", opt)),
        value=curve[-1][1] if state == "completed" else None,
        best_step=best[0] if best else None,
        best_value=best[1] if best else None,
        last_step=curve[-1][0] if curve else None,
        pruned_step=steps if state == "pruned" else None,
        started=started,
        ended=started + (1.2 * steps + 4 if steps else 3) if done else None,
        error=error,
        curve=curve,
    )


def _sweep(sweep_id: str, name: str, state: str, strategy: str, pruner: str, max_trials: int,
           created: float, trials: list[Any], ended: float | None = None,
           reason: str | None = None) -> Any:
    from tui.model.sweepview import SweepDetail, SweepRow, sorted_trials

    count = {k: sum(1 for t in trials if t.state == k) for k in
             ("completed", "pruned", "failed", "stopped", "running", "queued")}
    done = sorted_trials([t for t in trials if t.state == "completed"], "minimize")
    row = SweepRow(
        sweep_id=sweep_id, name=name, state=state, strategy=strategy, pruner=pruner,
        metric="val_loss", goal="minimize", max_trials=max_trials, created=created, ended=ended,
        reason=reason, trials=len(trials), running=count["running"], queued=count["queued"],
        completed=count["completed"], pruned=count["pruned"],
        failed=count["failed"] + count["stopped"],
        best_trial=done[0].number if done else None, best_value=done[0].value if done else None,
    )
    parameters = (
        {"name": "lr", "type": "float", "low": 1e-4, "high": 1.0, "log": True},
        {"name": "width", "type": "int", "low": 16, "high": 256, "step": 16},
        {"name": "optimizer", "type": "categorical", "choices": ["sgd", "adam", "adamw"]},
    )
    return SweepDetail(row=row, parameters=parameters, trials=tuple(sorted_trials(trials, "minimize")),
                       seed=1)


def recorded_sweeps() -> dict[str, Any]:
    """Two sweeps: SWEEP running (bayesian with median pruning: completed, pruned, failed and
    running trials) and OLD_SWEEP, a finished grid; newest first."""
    created = T0 - 300
    trials = [_trial(SWEEP, i, *t, started=created + 2 + 24 * (i - 1))
              for i, t in enumerate(SWEEP_TRIALS, start=1)]
    old_created = T0 - 3600
    grid = [_trial(OLD_SWEEP, i, 0.01, w, "adamw", "completed", 30, None, old_created + 40 * i)
            for i, w in enumerate((32, 64, 96, 128, 160, 192), start=1)]
    return {
        SWEEP: _sweep(SWEEP, "sweep-lr", "running", "bayesian", "median", 16, created, trials),
        OLD_SWEEP: _sweep(OLD_SWEEP, "grid-width", "completed", "grid", "off", 6, old_created, grid,
                          ended=old_created + 300),
    }


class RecordedSweeps:
    """Stands in for the controller's SweepRunner: recorded sweeps; stops are recorded."""

    def __init__(self, empty: bool = False):
        self.details: dict[str, Any] = {} if empty else recorded_sweeps()
        self.stopped: list[str] = []
        self.stopped_trials: list[tuple[str, int]] = []
        self.error: Exception | None = None
        self.calls = 0

    def _check(self) -> None:
        self.calls += 1
        if self.error is not None:
            raise self.error

    def rows(self) -> list[Any]:
        self._check()
        return [d.row for d in self.details.values()]

    def detail(self, ref: str) -> Any:
        self._check()
        from tui.client import SweepError

        if ref not in self.details:
            raise SweepError(f"no sweep {ref!r} (rigdeck sweeps lists them)")
        return self.details[ref]

    def stop(self, ref: str, user: str | None = None) -> Any:
        self.stopped.append(ref)
        return self.detail(ref)

    def stop_trial(self, ref: str, number: int, user: str | None = None) -> Any:
        self.stopped_trials.append((ref, number))
        return self.detail(ref)

    def tick(self) -> None:
        pass

    def feed(self, job_id: str, records: list[dict[str, Any]]) -> None:
        pass

    def close(self) -> None:
        pass


def recorded_service(controller: Any, monitor: Any, jobs: Any, sweeps: RecordedSweeps, **kw: Any) -> Any:
    """A ControllerService over the recorded parts, its sweeps the recorded ones."""
    from tui.control.service import ControllerService

    class RecordedService(ControllerService):
        @property
        def sweeps(self) -> Any:  # type: ignore[override]
            return sweeps

        def usage(self, by: str = "user", since: float | None = None) -> Any:
            from tui.model.usage import usage_report

            return usage_report(usage_records(), by=by, since=since, now=NOW,
                                goodputs={"a-big": 0.92, "b-1": 0.75, "b-2": 0.5})

    return RecordedService(controller.inventory, controller=controller, monitor=monitor, source=jobs, **kw)


DAY = 86400.0


def usage_records() -> list[dict[str, Any]]:
    """History records of three people's jobs over the weeks up to NOW (the Usage view's data):
    alice's big job two weeks ago and one this week, bob's two (one preempted, one restarted),
    carol's still running."""
    def rec(job_id: str, user: str, attempts: list[tuple[float, float, int]], state: str = "succeeded",
            preempted: bool = False) -> dict[str, Any]:
        events: list[dict[str, Any]] = []
        for i, (start, end, gpus) in enumerate(attempts):
            events.append({"event": "started", "time": start, "gpus": gpus})
            if i < len(attempts) - 1 and preempted:  # asked to stop, then its gang stopped and requeued
                events += [{"event": "preempted", "time": end}, {"event": "requeued", "time": end}]
            elif i < len(attempts) - 1:
                events.append({"event": "restart", "time": end})
        ended = attempts[-1][1] if state != "running" else None
        return {"job_id": job_id, "name": job_id, "user": user, "state": state, "created": attempts[0][0],
                "ended": ended, "events": events, "placement": []}

    return [
        rec("a-big", "alice", [(NOW - 15 * DAY, NOW - 15 * DAY + 6 * 3600, 8)]),
        rec("a-small", "alice", [(NOW - 2 * DAY, NOW - 2 * DAY + 5 * 3600, 2)]),
        rec("b-1", "bob", [(NOW - 9 * DAY, NOW - 9 * DAY + 6 * 3600, 4), (NOW - 9 * DAY + 7 * 3600,
                                                                            NOW - 9 * DAY + 9 * 3600, 4)],
            preempted=True),
        rec("b-2", "bob", [(NOW - 1 * DAY, NOW - 1 * DAY + 3 * 3600, 2),
                           (NOW - DAY + 4 * 3600, NOW - DAY + 5 * 3600, 1)]),
        rec("c-run", "carol", [(NOW - 3600, NOW, 4)], state="running"),
    ]


def no_room() -> PlacementError:
    return PlacementError(
        "job 'ddp' asks 3 nodes x 2 GPUs; free: h1 GPUs 2,3; h2 GPU 2 (3: bob); h3 down"
    )


def recorded_app(**kw: Any) -> Any:
    """The app over recorded data, its clock fixed at NOW (``state``: another cluster than
    ``cluster_state()``; ``jobs``, ``sweeps``: other recorded ones)."""
    from tui.app.shell import RigdeckApp
    from tui.client import InProcessClient

    jobs = kw.pop("jobs", None) or RecordedJobs()
    sweeps = kw.pop("sweeps", None) or RecordedSweeps()
    state = kw.pop("state", None) or cluster_state()
    kind = kw.pop("kind", "embedded")
    controller = kw.pop("controller", None) or FakeController()
    client = kw.pop("client", None)
    if client is None and kind == "server":
        client = served_client(controller, FakeMonitor(state), jobs, sweeps)
    elif client is None:
        client = InProcessClient(
            service=recorded_service(controller, FakeMonitor(state), jobs, sweeps)
        )
    app = RigdeckApp(
        client,
        clock=lambda: NOW,
        keymap_file=kw.pop("keymap_file", Path("/nonexistent/keys.toml")),
        **kw,
    )
    return app


SERVERS: list[Any] = []  # servers started by served_client, stopped by stop_servers


def served_client(controller: Any, monitor: Any, jobs: Any, sweeps: RecordedSweeps | None = None) -> Any:
    """The same recorded parts behind a real ``rigdeck serve`` server (tui.control.server, in a
    thread of this process, on a unix socket in a fresh directory), and a RemoteClient attached
    to it: what the app sees then came through the server's JSON-lines API and the state mirror."""
    import tempfile
    import threading
    import types

    from tui.client import RemoteClient
    from tui.control.server import Server, socket_path
    from tui.remote.unixsock import UnixSocketTransport

    state_dir = Path(tempfile.mkdtemp(prefix="rigdeck-pilot-server-"))
    service = recorded_service(controller, monitor, jobs, sweeps or RecordedSweeps(), kind="server", host="h1")
    server = Server(service, socket_path(state_dir))
    server.listen()
    threading.Thread(target=server.serve_forever, daemon=True, name="pilot-server").start()
    SERVERS.append(server)
    client = RemoteClient(controller.inventory, server=types.SimpleNamespace(host="h1", state_dir=str(state_dir)),
                          transport_factory=lambda: UnixSocketTransport(socket_path(state_dir), "h1"))
    # Attached as the app would be, and given the server's first answers (every host's state,
    # the jobs list) before the test looks: a test of the view, not of the link's first second.
    client.start()
    import time

    want = {h.name: h.status for h in monitor.state.hosts.values()}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        have = {h.name: h.status for h in client.state.hosts.values()}
        if have == want and (client.jobs.snapshot().rows or not jobs.snapshot().rows):
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the served client did not mirror the server: {have} vs {want}")
    return client


def stop_servers() -> None:
    import shutil

    while SERVERS:
        server = SERVERS.pop()
        server.stop()
        shutil.rmtree(server.sock_path.parent.parent, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# A big cluster for the cluster map: 512 hosts x 8 simulated GPUs

MAP_HOSTS = 512
MAP_GPUS = 8
MAP_USERS = ("alice", "bob", "carol", "dave", "erin")
MAP_DOWN = (17, 300)  # hosts (positions) that sent a sample and then could not be reached
MAP_STALE = 42  # a host that sent samples and then went quiet


def map_host(i: int) -> str:
    return f"gpu{i:03d}"


def map_job(i: int, idx: int) -> tuple[str, str] | None:
    """(job id, user) holding GPU ``idx`` of host ``i``, or None: 20 jobs, each on a run of
    hosts, some on half a host; about a fifth of the GPUs are free."""
    if (i * 7 + idx * 3) % 5 == 0:
        return None
    j = (i // 26) % 20
    if j % 4 == 3 and idx >= 4:  # these jobs take half of each host
        return None
    return f"train-{j:02d}", MAP_USERS[j % len(MAP_USERS)]


def map_foreign(i: int, idx: int) -> str | None:
    """A process of no job (a user's notebook) on some free GPUs."""
    return "frank" if map_job(i, idx) is None and i % 37 == 5 else None


def map_gpu(i: int, idx: int, tick: int) -> dict[str, Any]:
    held = map_job(i, idx)
    foreign = map_foreign(i, idx)
    procs: list[dict[str, Any]] = []
    claim = None
    if held is not None:
        job, user = held
        rank = (i % 26) * MAP_GPUS + idx
        procs.append({"pid": 7000 + idx, "user": user, "used_memory_mb": 20000 + 997 * ((i + idx) % 60),
                      "job_id": job, "rank": rank})
        claim = {"job_id": job, "user": user, "since": T0}
    if foreign is not None:
        procs.append({"pid": 9100 + idx, "user": foreign, "used_memory_mb": 12000, "job_id": None, "rank": None})
    util = 0.0 if not procs else round(30.0 + 70.0 * (((i * 13 + idx * 29 + tick) % 100) / 100.0), 1)
    used = sum(p["used_memory_mb"] for p in procs)
    return {
        "index": idx,
        "name": "Simulated GPU",
        "uuid": f"SIM-map-{i:04d}-{idx}",
        "simulated": True,
        "utilization_pct": util,
        "memory_used_mb": used,
        "memory_total_mb": 81920,
        "temperature_c": round(30.0 + 0.5 * util, 1),
        "power_w": round(60.0 + 6.0 * util, 1),
        "power_limit_w": 700.0,
        "sm_clock_mhz": 1980 if procs else 345,
        "ecc_volatile_errors": 0,
        "processes": procs,
        "claim": claim,
    }


def map_state(n: int = MAP_HOSTS, tick: int = 0) -> ClusterState:
    """``n`` hosts x 8 simulated GPUs as ``map_job`` places jobs; the MAP_DOWN hosts down and
    MAP_STALE stale after one sample (their GPUs are known, as last seen)."""
    state = ClusterState([(map_host(i), f"10.40.{i // 250}.{i % 250 + 1}") for i in range(n)])
    for i in range(n):
        gpus = [map_gpu(i, idx, tick) for idx in range(MAP_GPUS)]
        state.apply_sample(map_host(i), host_sample(i, tick, gpus), received_at=float(tick))
    for i in MAP_DOWN:
        if i < n:
            state.set_status(map_host(i), HostStatus.DOWN, "connect timed out after 5.0s")
    if MAP_STALE < n:
        state.set_status(map_host(MAP_STALE), HostStatus.STALE, "no telemetry for 6.0s")
    return state


class MapJobs:
    """A job source with the map's 20 jobs running (names only; no detail)."""

    def __init__(self, n: int = MAP_HOSTS):
        from tui.control.jobwatch import JobsSnapshot

        rows = []
        for j in range(20):
            hosts = sorted({map_host(i) for i in range(n) for idx in range(MAP_GPUS)
                            if (map_job(i, idx) or ("",))[0] == f"train-{j:02d}"})
            placement = tuple({"host": h, "gpus": [], "simulated": True} for h in hosts)
            rows.append(JobRow(
                job_id=f"train-{j:02d}", name=f"llm-{j}", state="running", placement=placement,
                ranks_running=0, ranks_total=0, step=100, loss=1.0, step_rate=2.0, total_steps=1000,
                created=T0, started=T0 + 1, ended=None, restarts=0, checkpoint_owner="-", cause=None,
            ))
        self.current = JobsSnapshot(tuple(rows), 1)
        self.selected: str | None = None

    def start(self) -> MapJobs:
        return self

    def stop(self, timeout: float = 0.0) -> None:
        pass

    def snapshot(self) -> Any:
        return self.current

    def detail(self, job_id: str) -> None:
        return None

    def select(self, job_id: str | None) -> None:
        self.selected = job_id

    def kick(self) -> None:
        pass

    def inventory_hosts(self) -> list[str]:
        return []


def map_app(n: int = MAP_HOSTS, state: ClusterState | None = None) -> Any:
    """The app over ``map_state(n)`` and ``MapJobs``, its clock fixed at NOW."""
    from tui.app.shell import RigdeckApp
    from tui.client import InProcessClient

    hosts = tuple(HostSpec(name=map_host(i), address=f"10.40.{i // 250}.{i % 250 + 1}", user="root",
                           python="python3", sim_gpus=MAP_GPUS) for i in range(n))
    inv = Inventory(hosts=hosts, path=Path("/recorded/big.toml"), known_hosts=Path("/recorded/known_hosts"))
    st = state if state is not None else map_state(n)
    client = InProcessClient(controller=FakeController(inv), monitor=FakeMonitor(st), jobs=MapJobs(n))
    return RigdeckApp(client, clock=lambda: NOW, keymap_file=Path("/nonexistent/keys.toml"))


def settle(*keys: str) -> Any:
    """A snapshot's ``run_before``: let the app draw, clear its notifications, press ``keys``,
    stop the cursors of any input from blinking, and let it draw again."""
    from textual.widgets import Input

    async def run_before(pilot: Any) -> None:
        await pilot.pause()
        pilot.app.clear_notifications()
        if keys:
            await pilot.press(*keys)
        for screen in pilot.app.screen_stack:
            for inp in screen.query(Input):
                inp.cursor_blink = False
        await pilot.pause()
        pilot.app.clear_notifications()
        await pilot.pause()

    return run_before
