"""Goodput under failures: rigdeck against torchrun (alone, with an operator) and ft_launcher, one fault schedule.

A 3-host data-parallel job (``bench/scripts/goodput_train.py``: gloo on CPU, one rank per host on one
simulated GPU, a checkpoint every ~30 s) on a 4-host test bed: one host is the spare. The same
faults hit every side, one every ``--gap`` seconds (default 120) from ``--first`` (60) after the launch:

1. ``hang``: rank 1 stops before its all-reduce, alive (every process lives).
2. ``xid``: the GPU under node 1 gets XID 79 (fell off the bus): its telemetry says so (the
   simulated GPU's ``sim-gpu-faults.json``) and a rank on it fails at each step, as a CUDA call
   on a lost GPU does, until the end of the run.
3. ``kill``: node 2's rank killed (SIGKILL).
4. ``host``: node 2's host lost: its link down, then its processes killed.

- rigdeck: ``rigdeck launch --wait`` with ``[restart] max_restarts = 8`` and ``[health]
  host_timeout = "20s"``; the hang timeouts are rigdeck's own (learned from the job, the quiet
  rule: agent/hangrule.py); the script checkpoints through ``runtime.Checkpointer`` with a memory
  snapshot of every step (``--memory``: same disk checkpoints, plus the snapshots); nothing else
  is done by hand.
- ``torchrun --max-restarts``, the automated baseline: what a user runs without rigdeck,
  ``torchrun --nnodes 3 --nproc-per-node 1 --max-restarts 3 --rdzv-backend c10d`` over ``ssh`` on
  each host, ``CUDA_VISIBLE_DEVICES`` set by hand, its own JSON checkpoints. torchrun's elastic
  agent restarts a gang whose worker exited; it cannot see a hang, a GPU's health or a host that
  went silent, and nobody steps in.
- ``torchrun by hand``: the same, with an **operator**, generous to it: someone who watches the
  job and, when it has made no step for ``--give-up`` seconds (60) after a fault, kills it
  everywhere and starts it again by hand on healthy hardware (another GPU of that host after the
  XID, the spare host after the host loss). Those recoveries are marked ``operator``; with nobody
  watching (a night), each would last until someone looked.
- ``ft_launcher (nvidia-resiliency-ext)``, the automated baseline with hang detection: NVIDIA's
  resiliency extension (0.4.1, installed by ``make bench``), what a user who wants hangs caught
  runs without rigdeck: ``ft_launcher`` with torchrun's side's settings (``--nnodes 3
  --nproc-per-node 1 --max-restarts 3 --rdzv-backend c10d``, its default restart policy
  ``any-failed``, over ``ssh`` on each host, its own JSON checkpoints), and in the script what its
  documentation asks (``goodput_train.py --nvrx``): a ``RankMonitorClient`` once the process group
  is up and a heartbeat after each step. Each rank's monitor kills its rank when the heartbeats
  stop for longer than the timeouts, set as a careful user sets them for this job: initial
  (process group up to the first heartbeat: the resume and one step, a second or two; a slow cold
  start on the loaded bed must not count as a hang) 60 s, between heartbeats 5 s (a step is
  ~0.3 s, a checkpoint's two barriers a little more: over 10 steps, and seconds of margin for a
  rank that the two cores pause), checked every 1 s (``--ft-workload-check-interval``; its
  default 5 s would add up to 5 s to each detection). Its learned timeouts are not used
  (``calculate_and_set_hb_timeouts``, 5 x the longest interval seen: after 100 steps of this job
  on CPU, 1.6 s between heartbeats, too close to the pauses of a loaded machine, and 0.02 s for
  the first, which a slower first step after a restart would miss). Its agent then restarts the
  gang, as torchrun's does for a worker that exited, ``max_restarts`` times per host (a gang
  restart counts on every host). Its node health checks (NVML's
  GPU recovery action, driver r570+; InfiniBand links) see nothing on the bed (no NVML, no
  InfiniBand: the simulated GPUs' XID is in rigdeck's telemetry only), so there the XID is known
  to it only by the rank's failures; no spare agent waits (torchrun's settings), and nobody steps
  in. Each host's ft_launcher gets a ``TMPDIR`` of its own: it names its sockets there by its pid,
  and the bed's hosts share this machine's ``/tmp`` but not its pids.

Every side's figures come from the same records by the same code: rank 0's step reports (time,
step, attempt) from the ranks' metrics files, and a poller that lists the job's processes on every
host every 0.25 s (one read of this machine's /proc, under which the bed's hosts are PID
namespaces; rigdeck's warm standbys are not the job's until an attempt adopts them).
- goodput: ``tui.model.health.goodput`` over the run (launch to the end of the schedule): each
  step counts once, as its newest attempt computed it; time lost to a fault, a restart or steps
  computed twice counts for nothing;
- per fault: detect (the fault until every process of the attempt it hit, those alive at the
  poller's last look before it, is gone: the launcher or the operator acted), first step (the
  fault until the next attempt's first step), steps lost (steps the next attempt computed again).
rigdeck's own ``status`` goodput and incidents are recorded beside them.

Targets (issue 48): rigdeck goodput >= 0.93; detected within 5 s for a hang and a lost host, 2 s
for a killed rank and an XID; the next first step within 5 s of detection on the surviving hosts
(10 s onto the spare); at most one step lost per fault.

Needs root (the network-namespace test bed), about 4 x (first + 4 gap + 1 min) a run: 40 min, and
3 runs by default (the result is written after each; the targets are judged over all of them, by
the p95 of each fault kind).
Usage: python bench/goodput.py [--runs 3] [--gap 120] [--first 60] [--give-up 60] [--only SIDE]
       [--out bench/results/goodput.json]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._meta import run_meta, write_result  # noqa: E402
from tests.testbed import TestBed, available  # noqa: E402
from tui.model.health import goodput  # noqa: E402

TRAIN = ROOT / "bench" / "scripts" / "goodput_train.py"  # not beside bench/runtime.py, which shadows runtime
NODES, SIM_GPUS = 3, 2
SLEEP, CKPT_EVERY = 0.3, 90  # ~3 steps a second on the bed: a checkpoint every ~30 s
FAULTS = ("hang", "xid", "kill", "host")
HOST_TIMEOUT = 20


def _cli(env: dict[str, str], *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tui.cli", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=timeout, check=check)


def read_records(files: list[Path]) -> list[dict[str, Any]]:
    """Rank 0's step reports from these metrics files, oldest first, ``restart`` = the ordinal of
    the attempt (process start) that made each."""
    recs: list[dict[str, Any]] = []
    for f in files:
        try:
            lines = f.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("event") is None and isinstance(r.get("step"), int) and r.get("attempt"):
                recs.append(r)
    recs.sort(key=lambda r: r["time"])
    order: dict[str, int] = {}
    for r in recs:
        order.setdefault(r["attempt"], len(order))
        r["restart"] = order[r["attempt"]]
    return recs


# Each process whose command line holds the tag, but a rigdeck warm standby still waiting (its
# environment names its standby directory, which holds waiting-<pid> until an attempt adopts it:
# agent/standby.py): one shell per host and poll, its pid and command line.
_PIDS_SH = r"""
for p in $(pgrep -f -- "$1"); do
  d=$(tr '\0' '\n' < /proc/$p/environ 2>/dev/null | sed -n 's/^RIGDECK_STANDBY=//p')
  if [ -n "$d" ] && [ -e "$d/waiting-$p" ]; then continue; fi
  c=$(tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null) && echo "$p $c"
done
"""


def rank_pids(bed: TestBed, i: int, tag: str) -> list[int]:
    """The pids of this run's rank processes on bed host ``i``: the training script's command line
    with the run's tag, not torchrun's agent, not a shell that started it, not a rigdeck standby
    that no attempt has adopted yet (the next attempt's, waiting)."""
    res = bed.exec(i, ["sh", "-c", _PIDS_SH, "pids", tag], timeout=20)
    pids = []
    for line in res.stdout.splitlines():
        pid, _, cmd = line.partition(" ")
        argv = cmd.split()
        if (pid.isdigit() and any(a.endswith("goodput_train.py") for a in argv[:3])
                and "torch.distributed.run" not in cmd):
            pids.append(int(pid))
    return pids


def rank_processes(tag: str, proc: str = "/proc") -> set[int]:
    """This run's rank processes on every host of the bed, by their pids on this machine: one
    read of its ``/proc`` (the bed's hosts are PID namespaces under it), a few milliseconds, no
    process started. As ``rank_pids``: the training script's command line with the run's tag,
    not torchrun's agent, not a rigdeck standby still waiting (its ``waiting-<pid>`` mark names
    its pid in its host's namespace: the last of ``NSpid``; the mark's directory is read through
    the process's own root, as its host's mounts show it)."""
    out = set()
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        base = f"{proc}/{name}"
        try:
            with open(f"{base}/cmdline", "rb") as f:
                argv = f.read().decode("utf-8", "replace").split("\0")
        except OSError:
            continue
        cmd = " ".join(argv)
        script = any(a.endswith("goodput_train.py") for a in argv[:3])
        if tag not in cmd or "torch.distributed.run" in cmd or not script:
            continue
        try:
            with open(f"{base}/environ", "rb") as f:
                env = f.read().decode("utf-8", "replace").split("\0")
            with open(f"{base}/status") as f:
                nspid = next((line.split()[-1] for line in f if line.startswith("NSpid:")), name)
        except OSError:
            continue
        standby = next((e.split("=", 1)[1] for e in env if e.startswith("RIGDECK_STANDBY=")), "")
        if standby and os.path.exists(f"{base}/root{standby}/waiting-{nspid}"):
            continue
        out.add(int(name))
    return out


class Poller(threading.Thread):
    """Every ``interval`` seconds, the pids of this run's ranks (their command lines hold ``tag``;
    torchrun's own agent process and rigdeck's waiting standbys are left out) on every host of the
    bed: one read of this machine's ``/proc`` (``rank_processes``), which asks no host and
    starts no process, so the looks keep their pace and take no CPU from the job."""

    def __init__(self, bed: TestBed, tag: str, interval: float = 0.25):
        super().__init__(daemon=True)
        self.bed, self.tag, self.interval = bed, tag, interval
        self.samples: list[tuple[float, set[int]]] = []
        self.halt = threading.Event()
        self.lock = threading.Lock()

    def pids(self) -> set[int]:
        return rank_processes(self.tag)

    def run(self) -> None:
        while not self.halt.is_set():
            t = time.time()
            got = self.pids()
            with self.lock:
                self.samples.append((t, got))
            self.halt.wait(max(0.0, self.interval - (time.time() - t)))

    def _hit(self, t_fault: float) -> tuple[list[tuple[float, set[int]]], set[int]]:
        """The samples so far, and the job's rank processes alive at the last look before the fault."""
        with self.lock:
            samples = list(self.samples)
        before = [s for t, s in samples if t < t_fault]
        return samples, before[-1] if before else set()

    def alive_before(self, t_fault: float) -> int:
        """How many of the job's rank processes were alive at the last look before the fault."""
        return len(self._hit(t_fault)[1])

    def gone_after(self, t_fault: float) -> float | None:
        """When every rank process of the attempt the fault hit (those alive at the last look
        before it) was gone (None: never, or none was alive: a job already dead detects nothing)."""
        samples, hit = self._hit(t_fault)
        if not hit:
            return None
        for t, s in samples:
            if t >= t_fault and not (hit & s):
                return t
        return None


@dataclass
class Side:
    name: str
    bed: TestBed
    tmp: Path
    env: dict[str, str]
    tag: str
    ckpt: Path = field(init=False)
    ctl: Path = field(init=False)
    faults: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ckpt = self.tmp / f"{self.name}-ckpt"
        self.ctl = self.tmp / f"{self.name}-ctl"
        self.ckpt.mkdir()
        self.ctl.mkdir()

    def train_args(self) -> list[str]:
        return [str(TRAIN), "--steps", "1000000", "--ckpt", str(self.ckpt), "--ctl", str(self.ctl),
                "--sleep", str(SLEEP), "--checkpoint-every", str(CKPT_EVERY), "--tag", self.tag]

    # what each side must say: which bed host (1-based) and GPU each node uses now
    def nodes(self) -> list[tuple[int, int]]:
        raise NotImplementedError

    def metrics_files(self) -> list[Path]:
        raise NotImplementedError

    def start(self, spec_dir: Path) -> None:
        raise NotImplementedError

    def operate(self, t_fault: float, kind: str, records: list[dict[str, Any]]) -> bool:
        """Step in after a fault the launcher did not recover from (True: did)."""
        raise NotImplementedError

    def finish(self) -> dict[str, Any]:
        raise NotImplementedError

    def kill_on(self, i: int) -> None:
        self.bed.exec(i, ["pkill", "-9", "-f", self.tag])


def write_faults(bed: TestBed, i: int, faults: dict[str, Any]) -> None:
    path = bed.hosts[i - 1].state_dir / "sim-gpu-faults.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(faults))
    tmp.replace(path)


def inject(side: Side, kind: str) -> dict[str, Any]:
    """The fault, now; what it hit, and ``at``: the moment of the act itself (finding where the
    fault goes, rigdeck's ``status`` or the ranks' pids, takes up to seconds on the loaded bed,
    and is no side's time to detect it)."""
    bed = side.bed
    nodes = side.nodes()
    if kind == "hang":
        at = time.time()
        (side.ctl / "hang").write_text("1")
        return {"rank": 1, "at": at}
    if kind == "xid":
        i, gpu = nodes[1]
        at = time.time()
        write_faults(bed, i, {str(gpu): {"xid": 79}})
        (side.ctl / f"dead-{bed.hosts[i - 1].hostname}-{gpu}").write_text("")
        return {"host": bed.hosts[i - 1].name, "gpu": gpu, "at": at}
    i, gpu = nodes[2]
    if kind == "kill":
        pids = [str(p) for p in rank_pids(bed, i, side.tag)]
        at = time.time()
        bed.exec(i, ["kill", "-9", *pids])
        return {"host": bed.hosts[i - 1].name, "at": at}
    at = time.time()
    bed.link_down(i)
    side.kill_on(i)
    return {"host": bed.hosts[i - 1].name, "at": at}


class Rigdeck(Side):
    def train_args(self) -> list[str]:
        return [*super().train_args(), "--memory"]

    def start(self, spec_dir: Path) -> None:
        spec = spec_dir / "goodput.toml"
        cmd = ", ".join(json.dumps(a) for a in ["{python}", *self.train_args()])
        spec.write_text(
            f'name = "goodput"\ncommand = [{cmd}]\nworkdir = "{ROOT}"\nlauncher = "direct"\n'
            f'nodes = {NODES}\ngpus_per_node = 1\n[env]\nOMP_NUM_THREADS = "1"\n'
            f'[health]\nhost_timeout = "{HOST_TIMEOUT}s"\n'
            '[restart]\nmax_restarts = 8\n')
        # the jobs of earlier runs (same name, same controller) are not this one
        before = {j["job_id"] for j in json.loads(_cli(self.env, "jobs", "--json").stdout or "[]")}
        self.waiter = subprocess.Popen([sys.executable, "-m", "tui.cli", "launch", str(spec), "--wait", "--json"],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env,
                                       cwd=ROOT)
        deadline = time.time() + 120
        self.job_id = ""
        while time.time() < deadline and not self.job_id:
            jobs = json.loads(_cli(self.env, "jobs", "--json").stdout or "[]")
            self.job_id = next((j["job_id"] for j in jobs
                                if j["name"] == "goodput" and j["job_id"] not in before), "")
            time.sleep(1)
        if not self.job_id:
            raise RuntimeError(f"rigdeck launch made no job: {self.waiter.communicate(timeout=30)}")

    def status(self) -> dict[str, Any]:
        return dict(json.loads(_cli(self.env, "status", self.job_id, "--json").stdout))

    def nodes(self) -> list[tuple[int, int]]:
        names = {h.name: k for k, h in enumerate(self.bed.hosts, start=1)}
        return [(names[n["host"]], int(n["gpus"][0])) for n in self.status()["placement"]]

    def metrics_files(self) -> list[Path]:
        return [h.state_dir / "jobs" / self.job_id / "metrics" / "rank-0.jsonl" for h in self.bed.hosts]

    def operate(self, t_fault: float, kind: str, records: list[dict[str, Any]]) -> bool:
        return False  # nobody steps in

    def finish(self) -> dict[str, Any]:
        st = self.status()
        _cli(self.env, "stop", self.job_id, timeout=180, check=False)
        try:
            out, err = self.waiter.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            self.waiter.kill()
            out, err = self.waiter.communicate()
        drains = json.loads(_cli(self.env, "drains", "--json").stdout or "[]")
        if drains:
            _cli(self.env, "undrain", *[d["target"] for d in drains], check=False)
        return {"status_goodput": st.get("goodput"), "incidents": st.get("incidents"),
                "restarts": st.get("restarts"), "state_at_end": st.get("state"),
                "drains": [{k: d.get(k) for k in ("target", "who", "source", "reason")} for d in drains]}


class ByHand(Side):
    def start(self, spec_dir: Path) -> None:
        self.hosts: list[tuple[int, int]] = [(1, 0), (2, 0), (3, 0)]
        self.launches = 0
        self.mdir = self.tmp / "by-hand-metrics"
        self.mdir.mkdir()
        self.procs: list[subprocess.Popen] = []
        self.launch()

    LOG, PORT_BASE, RDZV_ID = "by-hand", 29400, "goodput"  # its logs' names, its rendezvous

    def launcher(self, i: int) -> tuple[list[str], list[str], list[str]]:
        """How this side starts its agent on bed host ``i``: (environment, command, options after
        torchrun's own)."""
        return [], [sys.executable, "-m", "torch.distributed.run"], []

    def launch(self) -> None:
        self.launches += 1
        master = self.bed.hosts[self.hosts[0][0] - 1].address
        port = self.PORT_BASE + self.launches
        for node, (i, gpu) in enumerate(self.hosts):
            # The bed's hostnames resolve nowhere (as on many clusters without DNS): the careful
            # user says which node holds the rendezvous store and each node's own address.
            rdzv = ["--rdzv-conf", f"is_host={int(node == 0)}", "--local-addr", self.bed.hosts[i - 1].address]
            env, command, options = self.launcher(i)
            remote = shlex.join([
                "env", "OMP_NUM_THREADS=1", "GLOO_SOCKET_IFNAME=eth0", f"RIGDECK_METRICS_DIR={self.mdir}",
                f"CUDA_VISIBLE_DEVICES={gpu}", f"PYTHONPATH={ROOT}", *env,
                *command, "--nnodes", str(NODES), "--nproc-per-node", "1",
                "--max-restarts", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{master}:{port}",
                "--rdzv-id", f"{self.RDZV_ID}-{self.launches}", *rdzv, *options, *self.train_args()])
            log = open(self.tmp / f"{self.LOG}-{self.launches}-h{i}.log", "w")
            self.procs.append(subprocess.Popen(self.bed.ssh_argv(i, remote), stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL))

    def nodes(self) -> list[tuple[int, int]]:
        return list(self.hosts)

    def metrics_files(self) -> list[Path]:
        return [self.mdir / "rank-0.jsonl"]

    def operate(self, t_fault: float, kind: str, records: list[dict[str, Any]]) -> bool:
        """The operator: no step since ``give_up`` after the fault: kill it everywhere, start it
        again on healthy hardware."""
        for i in range(1, len(self.bed.hosts) + 1):
            self.kill_on(i)
        if kind == "xid":
            i, gpu = self.hosts[1]
            self.hosts[1] = (i, 1 - gpu)
        elif kind == "host":
            used = {i for i, _ in self.hosts}
            spare = next(k for k in range(1, len(self.bed.hosts) + 1) if k not in used)
            self.hosts[2] = (spare, 0)
        self.launch()
        return True

    def finish(self) -> dict[str, Any]:
        for i in range(1, len(self.bed.hosts) + 1):
            self.kill_on(i)
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        return {"launches_by_hand": self.launches}


class TorchrunAlone(ByHand):
    """torchrun's elastic agent on its own: nobody steps in."""

    def operate(self, t_fault: float, kind: str, records: list[dict[str, Any]]) -> bool:
        return False


# ft_launcher's rank monitor (nvidia-resiliency-ext), as a careful user sets it for this job: see
# the docstring. The ranks send a heartbeat after each step (goodput_train.py --nvrx).
NVRX_INITIAL_HB_TIMEOUT = 60.0  # process group up to the first heartbeat: the resume and one step
NVRX_HB_TIMEOUT = 5.0  # between two heartbeats: a step is ~0.3 s, a checkpoint's barriers a little more
NVRX_CHECK_INTERVAL = 1.0  # how often the monitor compares (its default, 5 s, would add up to 5 s)


class FtLauncher(ByHand):
    """NVIDIA's resiliency extension: ``ft_launcher`` (torchrun's agent with a rank monitor per
    rank that kills a rank whose heartbeats stop) with torchrun's side's settings; nobody steps in."""

    def train_args(self) -> list[str]:
        return [*super().train_args(), "--nvrx"]

    LOG, PORT_BASE, RDZV_ID = "nvrx", 29450, "goodput-nvrx"

    def launcher(self, i: int) -> tuple[list[str], list[str], list[str]]:
        # ft_launcher names its sockets in the temporary directory by its pid: the bed's hosts
        # share this machine's /tmp but each has its own pids, so each gets its own, as a real
        # host has.
        tmp = self.tmp / f"ft-tmp-{self.launches}-h{i}"
        tmp.mkdir()
        return ([f"TMPDIR={tmp}"], [str(Path(sys.executable).with_name("ft_launcher"))],
                ["--ft-initial-rank-heartbeat-timeout", str(NVRX_INITIAL_HB_TIMEOUT),
                 "--ft-rank-heartbeat-timeout", str(NVRX_HB_TIMEOUT),
                 "--ft-workload-check-interval", str(NVRX_CHECK_INTERVAL)])

    def operate(self, t_fault: float, kind: str, records: list[dict[str, Any]]) -> bool:
        return False  # nobody steps in

    def finish(self) -> dict[str, Any]:
        return {**super().finish(), "ft_launcher": self.log_counts()}

    def log_counts(self) -> dict[str, dict[str, int]]:
        """From each host's ft_launcher log: its restarts of its failed worker group (counted
        against its --max-restarts: each agent counts its own), those to let another host's agent
        back in (not counted), and its rank monitor's heartbeat timeouts."""
        out = {}
        for i, _ in self.hosts:
            try:
                text = (self.tmp / f"{self.LOG}-{self.launches}-h{i}.log").read_text(errors="replace")
            except OSError:
                continue
            out[self.bed.hosts[i - 1].name] = {
                "restarts": text.count("attempts left; will restart worker group"),
                "rejoin_restarts": text.count("new nodes from group_rank"),
                "heartbeat_timeouts": text.count("FT timeout elapsed")}
        return out


def nvrx_version() -> str:
    """The installed nvidia-resiliency-ext's version, or "" (then its side cannot run)."""
    try:
        return importlib.metadata.version("nvidia-resiliency-ext")
    except importlib.metadata.PackageNotFoundError:
        return ""


def new_first_step(records: list[dict[str, Any]], t_fault: float, old_attempts: set[int]) -> dict[str, Any] | None:
    return next((r for r in records if r["time"] > t_fault and r["restart"] not in old_attempts), None)


def run_side(side: Side, first: float, gap: float, give_up: float) -> dict[str, Any]:
    poller = Poller(side.bed, side.tag)
    poller.start()
    t0 = time.time()
    side.start(side.tmp)
    plan = [(t0 + first + gap * k, kind) for k, kind in enumerate(FAULTS)]
    end = t0 + first + gap * len(FAULTS)
    pending: list[dict[str, Any]] = []
    try:
        for at, kind in [*plan, (end, "")]:
            while time.time() < at:
                recs = read_records(side.metrics_files())
                for f in pending:
                    if f.get("recovered") or f.get("operator"):
                        continue
                    if new_first_step(recs, f["t"], f["old_attempts"]) is not None:
                        f["recovered"] = True
                    elif time.time() > f["t"] + give_up and side.operate(f["t"], f["kind"], recs):
                        f["operator"] = time.time() - f["t"]
                        print(f"  {side.name}: {f['kind']}: no step for {give_up:.0f} s: the operator restarts it "
                              "by hand", flush=True)
                time.sleep(0.5)
            if not kind:
                break
            recs = read_records(side.metrics_files())
            old = {r["restart"] for r in recs}
            what = inject(side, kind)
            t_f = what.pop("at")  # the act itself, not the look for where it goes
            last = recs[-1]["step"] if recs else None
            print(f"  {side.name}: t+{t_f - t0:.0f}s {kind} {what} at step {last}", flush=True)
            pending.append({"kind": kind, "t": t_f, "old_attempts": old, **what})
    finally:
        extra = side.finish()
        poller.halt.set()
        poller.join(timeout=30)
    recs = read_records(side.metrics_files())
    faults = []
    for f in pending:
        hit = [r for r in recs if r["restart"] in f["old_attempts"]]
        last_step = max((r["step"] for r in hit), default=None)
        nxt = new_first_step(recs, f["t"], f["old_attempts"])
        gone = poller.gone_after(f["t"])
        faults.append({
            "kind": f["kind"], "hit": {k: f[k] for k in ("rank", "host", "gpu") if k in f},
            "detect_s": None if gone is None else round(gone - f["t"], 1),
            "alive_at_fault": poller.alive_before(f["t"]),
            "first_step_s": None if nxt is None else round(nxt["time"] - f["t"], 1),
            "steps_lost": None if nxt is None or last_step is None else max(0, last_step - (nxt["step"] - 1)),
            # the attempt it hit went on stepping this long after the fault (a hang begins at the
            # hung rank's next step; negative: its last step came before the fault)
            "last_step_after_s": round(max(r["time"] for r in hit) - f["t"], 2) if hit else None,
            "operator_s": round(f["operator"], 1) if f.get("operator") else None,
        })
    g = goodput([r for r in recs if r["time"] <= end], t0, end)
    return {"goodput": g.to_dict(), "faults": faults, "wall_s": round(end - t0, 1),
            "first_step_s": round(recs[0]["time"] - t0, 1) if recs else None,
            "last_step": max((r["step"] for r in recs if r["time"] <= end), default=None), **extra}


SIDES: list[tuple[str, type[Side], str]] = [
    ("rigdeck", Rigdeck, "rigdeck"),
    ("torchrun-alone", TorchrunAlone, "torchrun --max-restarts"),
    ("by-hand", ByHand, "torchrun by hand"),
    ("nvrx", FtLauncher, "ft_launcher (nvidia-resiliency-ext)"),
]
# each side's key in the JSON result
RESULT_KEY = {"rigdeck": "rigdeck", "torchrun-alone": "torchrun_alone", "by-hand": "torchrun_by_hand", "nvrx": "nvrx"}


def _fmt(v: Any, unit: str = " s") -> str:
    return "never" if v is None else f"{v}{unit}"


def p95(values: list[float]) -> float:
    """The 95th percentile, linear between the two nearest (of 3 runs: near the largest)."""
    xs = sorted(values)
    k = 0.95 * (len(xs) - 1)
    lo = int(k)
    return xs[lo] if lo + 1 >= len(xs) else xs[lo] + (xs[lo + 1] - xs[lo]) * (k - lo)


DETECT_LIMIT = {"hang": 5.0, "xid": 2.0, "kill": 2.0, "host": 5.0}
RESTART_LIMIT = {"hang": 5.0, "xid": 5.0, "kill": 5.0, "host": 10.0}  # the host's: onto the spare


def run_once(bed: TestBed, tmp: Path, env: dict[str, str], args: argparse.Namespace, n: int) -> dict[str, Any]:
    """One run: each side in turn (``--only``: that one) under the same schedule."""
    results: dict[str, Any] = {}
    for key, cls, name in SIDES:
        if args.only and key != args.only:
            continue
        side_tmp = tmp / f"run{n}-{key}"
        side_tmp.mkdir()
        side = cls(name, bed, side_tmp, env, f"gp-{key}-{os.getpid()}-{n}")
        print(f"run {n}: {name}: {len(FAULTS)} faults, one every {args.gap:.0f} s from t+{args.first:.0f}s",
              flush=True)
        try:
            results[key] = run_side(side, args.first, args.gap, args.give_up)
        finally:
            for i in range(1, len(bed.hosts) + 1):
                bed.link_up(i)
                write_faults(bed, i, {})
        time.sleep(3)
    return results


def report_run(results: dict[str, Any], n: int) -> dict[str, Any]:
    """Print one run's table; its figures and targets (those of the sides it has: ``--only`` one)."""
    sides = [(key, name) for key, _, name in SIDES if key in results]
    ours = results.get("rigdeck")
    go = ours["goodput"]["ratio"] if ours else None
    shown = ", ".join(f"{name} {results[key]['goodput']['ratio']:.3f}" for key, name in sides)
    print(f"\nrun {n}: goodput over {results[sides[0][0]]['wall_s']:.0f} s: {shown}")
    ratios = {key: (go / results[key]["goodput"]["ratio"] if results[key]["goodput"]["ratio"] else None)
              for key, _ in sides if ours and key != "rigdeck"}
    for key, name in sides:
        if key in ratios:
            print(f"  rigdeck / {name}: {ratios[key] if ratios[key] is not None else float('inf'):.2f}x")
    print(f"  {'fault':6} {'side':36} {'detect':>10} {'first step after':>17} {'steps lost':>11}")
    for k, kind in enumerate(FAULTS):
        for key, name in sides:
            f = results[key]["faults"][k]
            op = " (operator)" if f.get("operator_s") else ""
            detect = "none alive" if f.get("alive_at_fault") == 0 else _fmt(f["detect_s"])
            print(f"  {kind:6} {name:36} {detect:>10} {_fmt(f['first_step_s']) + op:>17} "
                  f"{_fmt(f['steps_lost'], ''):>11}")
    out = {RESULT_KEY[key]: results[key] for key, _ in sides}
    if ours:
        out["ratio_goodput"] = ratios
        out["targets"] = checks = targets([ours])
        print("  targets: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in checks.items()))
    return out


def targets(runs: list[dict[str, Any]]) -> dict[str, bool]:
    """Issue 48's targets over rigdeck's side of ``runs``: per fault kind, the p95 of detection and
    of detection to the next first step."""
    faults = [f for r in runs for f in r["faults"]]
    ok = all(f["detect_s"] is not None and f["first_step_s"] is not None for f in faults)
    by_kind = {kind: [f for f in faults if f["kind"] == kind] for kind in FAULTS}
    return {
        "goodput_at_least_0.93": all(r["goodput"]["ratio"] >= 0.93 for r in runs),
        "detect_p95_5s_hang_host_2s_kill_xid": ok and all(
            p95([f["detect_s"] for f in fs]) <= DETECT_LIMIT[kind] for kind, fs in by_kind.items() if fs),
        "first_step_p95_within_5s_of_detection_10s_onto_the_spare": ok and all(
            p95([f["first_step_s"] - f["detect_s"] for f in fs]) <= RESTART_LIMIT[kind]
            for kind, fs in by_kind.items() if fs),
        "at_most_one_step_lost": all(f["steps_lost"] is not None and f["steps_lost"] <= 1 for f in faults),
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the runs so far: rigdeck's goodput and each baseline's, per fault kind rigdeck's p95."""
    ours = [r["rigdeck"] for r in runs]
    out: dict[str, Any] = {
        "runs": len(runs),
        "goodput": {field: [r[field]["goodput"]["ratio"] for r in runs] for field in RESULT_KEY.values()},
        # rigdeck's goodput over each baseline's, run by run
        "ratio_goodput": {RESULT_KEY[key]: [r["ratio_goodput"][key] for r in runs] for key, _, _ in SIDES[1:]},
        "per_kind_p95": {},
        "targets": targets(ours),
    }
    for kind in FAULTS:
        fs = [f for r in ours for f in r["faults"] if f["kind"] == kind]
        det = [f["detect_s"] for f in fs if f["detect_s"] is not None]
        rst = [f["first_step_s"] - f["detect_s"] for f in fs
               if f["detect_s"] is not None and f["first_step_s"] is not None]
        out["per_kind_p95"][kind] = {
            "detect_s": round(p95(det), 2) if det else None,
            "restart_to_first_step_s": round(p95(rst), 2) if rst else None,
            "steps_lost_max": max((f["steps_lost"] for f in fs if f["steps_lost"] is not None), default=None)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--first", type=float, default=60.0, help="seconds from the launch to the first fault")
    ap.add_argument("--gap", type=float, default=120.0, help="seconds between faults")
    ap.add_argument("--give-up", type=float, default=60.0,
                    help="the baseline's operator restarts a job with no step for this long after a fault")
    ap.add_argument("--runs", type=int, default=3, help="whole runs, each side in each (written after each)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "goodput.json"))
    ap.add_argument("--only", choices=[key for key, _, _ in SIDES],
                    help="one side alone (a trial: prints, writes nothing)")
    ap.add_argument("--keep", action="store_true", help="leave the bed up at the end (a trial: to look at it)")
    args = ap.parse_args()
    meta = run_meta()
    if args.only in (None, "nvrx") and not (nvrx_version() and Path(sys.executable).with_name("ft_launcher").exists()):
        print(f"bench/goodput.py's nvrx side needs ft_launcher beside {sys.executable}: make bench installs it "
              "(pip install --no-deps nvidia-resiliency-ext==0.4.1 and its extra: pip install -e '.[bench]')",
              file=sys.stderr)
        return 2
    ok, why = available()
    if not ok:
        print(f"bench/goodput.py needs the test bed: {why}", file=sys.stderr)
        return 2
    config = {"nodes": NODES, "spare_hosts": 1, "sim_gpus_per_host": SIM_GPUS, "step_sleep_s": SLEEP,
              "checkpoint_every_steps": CKPT_EVERY, "first_fault_s": args.first, "gap_s": args.gap,
              "operator_give_up_s": args.give_up, "host_timeout_s": HOST_TIMEOUT,
              "rigdeck_hang_rule": "learned + quiet (agent/hangrule.py)", "rigdeck_memory_snapshots": True,
              "nvrx": {"ft_launcher": "nvidia-resiliency-ext " + nvrx_version(), "max_restarts": 3,
                       "restart_policy": "any-failed", "initial_rank_heartbeat_timeout_s": NVRX_INITIAL_HB_TIMEOUT,
                       "rank_heartbeat_timeout_s": NVRX_HB_TIMEOUT,
                       "workload_check_interval_s": NVRX_CHECK_INTERVAL, "heartbeat": "after each step"},
              "faults": list(FAULTS), "runs": args.runs}
    runs: list[dict[str, Any]] = []
    with TestBed(NODES + 1, sim_gpus=SIM_GPUS) as bed, tempfile.TemporaryDirectory() as tmpd:
        tmp = Path(tmpd)
        inv = bed.write_inventory(tmp / "hosts.toml", python=sys.executable)
        env = {**os.environ, "RIGDECK_INVENTORY": str(inv), "RIGDECK_HOME": str(tmp / "home")}
        subprocess.run([sys.executable, "-m", "tui.cli", "deploy"], env=env, cwd=ROOT, check=True, capture_output=True)
        if args.only:
            got_one = run_once(bed, tmp, env, args, 1)
            print(json.dumps(got_one, indent=1))
            report_run(got_one, 1)
            if args.keep:
                release = tmp / "release"
                print(f"the bed stays up: RIGDECK_INVENTORY={inv} RIGDECK_HOME={tmp / 'home'}; "
                      f"touch {release} ends it", flush=True)
                while not release.exists():
                    time.sleep(1)
            return 0
        print(f"{NODES} hosts + 1 spare, 1 rank each (gloo, simulated GPUs), checkpoint every {CKPT_EVERY} steps "
              f"(~{CKPT_EVERY * SLEEP:.0f} s); rigdeck: learned and quiet hang rules, host_timeout {HOST_TIMEOUT}s, "
              f"a memory snapshot every step; torchrun --max-restarts 3 --rdzv-backend c10d alone, and by hand "
              f"with an operator after {args.give_up:.0f} s; ft_launcher --max-restarts 3 alone, heartbeat "
              f"timeouts {NVRX_INITIAL_HB_TIMEOUT:.0f} s initial, {NVRX_HB_TIMEOUT:.0f} s; {args.runs} run(s)",
              flush=True)
        for n in range(1, args.runs + 1):
            runs.append(report_run(run_once(bed, tmp, env, args, n), n))
            got = summary(runs)
            write_result(args.out, {"config": config, "runs": runs, "summary": got}, meta)  # kept after each run
    print(f"\nover {len(runs)} run(s) (rigdeck; p95 per fault kind):")
    print("  goodput: " + ", ".join(f"{key} {min(v):.3f}-{max(v):.3f}" for key, v in got["goodput"].items()))
    print("  rigdeck / each: " + ", ".join(
        f"{key} " + " / ".join(f"{x if x is not None else float('inf'):.2f}x" for x in v)
        for key, v in got["ratio_goodput"].items()))
    for kind, v in got["per_kind_p95"].items():
        print(f"  {kind:6} detect p95 {_fmt(v['detect_s'])}, detection to first step p95 "
              f"{_fmt(v['restart_to_first_step_s'])}, steps lost at most {_fmt(v['steps_lost_max'], '')}")
    print("  targets: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in got["targets"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
