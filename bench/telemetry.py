"""Telemetry cost: one agent daemon vs. spawning a sampler per tick; controller ingest at N hosts.

(a) Agent overhead. A real daemon (``python -m agent daemon`` from this source tree) streams 1 Hz
    telemetry to one unix-socket client for D seconds; its CPU (the nanoseconds on CPU of all its
    threads, /proc/<pid>/task/*/schedstat; utime+stime's 10 ms ticks are too coarse for a
    daemon that uses a few ms a second) and memory (RSS, PSS, USS) are measured once it is warm;
    before that, its CPU with no client at all (the state it spends most of its life in). The
    GPU source is whatever this machine has, as the agent picks it (NVML, else nvidia-smi, else
    8 *simulated* GPUs) and every figure says which; the result file is named by it
    (``bench/results/telemetry-<device>.json``). ``--before-tree DIR`` measures the daemon of
    another checkout first, in the same run (a before/after of an agent change).
    Baselines, each over the same D; a spawning one is a loop that starts a new process per 1 Hz
    tick and reads its output, its CPU the loop's own plus every child's (``os.wait4`` rusage):
    - python poller: spawning a Python poller per tick, as gpustat-web and nvitop-cluster do
      over SSH. The child imports rigdeck's own collector, builds a ``Collector(sim_gpus=8)``
      (the same GPU source as the daemon), takes one sample and prints it; most of its cost is
      interpreter start-up and imports.
    - stdlib sampler: a minimal ``python3 -c`` per tick that reads /proc/stat and /proc/meminfo
      and prints one JSON line, importing nothing of rigdeck (and sampling no GPUs at all: it
      does less work than the agent, so the ratio against it is the conservative one).
    Where ``nvidia-smi`` is on PATH (a GPU host), also: ``nvidia-smi --query-gpu=... -l 1``
    running all along (its CPU from schedstat, as the daemon's), one ``nvidia-smi --query-gpu``
    per tick, and ``nvitop --once`` per tick where nvitop is installed.
(b) HostLinks ingest. N daemons (each its own state dir, 8 simulated GPUs, 1 Hz) run as local
    processes; the controller reaches each through ``agent.pyz attach`` over pipes, using
    ``tui.control.monitor.Monitor`` unchanged (one reader thread per host, ``AgentLink`` +
    ``PipeStream``). Its ``ClusterState`` is a subclass that records when each sample is applied.
    Over D seconds: samples/s, the controller's CPU per sample (this process holds only the
    controller side) and the latency from the agent's sample time (``data["time"]``, taken at the
    start of collection, so it includes ``cost_s``) to ``apply_sample``. Deploying the agent is
    skipped (done once up front; bench/deploy.py measures it) unless ``--real-deploy``. The
    daemons are started once and reused for the larger N (ascending), idle in between.

The ingest figures use local pipes, not SSH: bench/scale.py measures the controller over SSH
against real sshd hosts of the test bed. All agents and the controller share this one machine,
so at large N the latency also carries the contention of N daemons and N attach bridges for the
same cores; the machine's CPU use during the window is reported next to it.

Usage: .venv/bin/python bench/telemetry.py [--agent-seconds 30] [--ingest-seconds 20]
                                            [--n 16,64,256]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.telemetry import NVIDIA_SMI_QUERY, parse_nvidia_smi_row  # noqa: E402
from bench._meta import run_meta, write_result  # noqa: E402
from tui.control.hostlinks import HostLinks, HostReport  # noqa: E402
from tui.control.monitor import Monitor  # noqa: E402
from tui.model.inventory import HostSpec, Inventory  # noqa: E402
from tui.model.state import ClusterState  # noqa: E402
from tui.remote.bundle import AgentBundle, build_agent  # noqa: E402
from tui.remote.transport import Transport  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
TARGET_AGENT_CPU_PCT = 0.15
TARGET_AGENT_RSS_MB = 40.0
TARGET_P95_MS = 100.0
# N attach bridges start at once on this one machine (on a real cluster each starts on its own
# host): give their handshakes time, or an overloaded machine fails them all together.
CONNECT_TIMEOUT_S = 120.0
BUSY_WARN_PCT = 25.0

# Spawning a Python poller per tick (as gpustat-web and nvitop-cluster do over SSH): one
# collector per process, one sample, printed.
POLL_SCRIPT = (
    "import json, sys\n"
    "from agent.telemetry import Collector, sample_to_dict\n"
    "with Collector(sim_gpus=int(sys.argv[1])) as c:\n"
    "    sys.stdout.write(json.dumps(sample_to_dict(c.sample())) + '\\n')\n"
)
# The least a Python sampler spawned per tick can do: the stdlib, /proc/stat and /proc/meminfo,
# one JSON line. No rigdeck import, no GPUs.
SAMPLER_SCRIPT = (
    "import json, time\n"
    "with open('/proc/stat') as f:\n"
    "    cpu = [int(x) for x in f.readline().split()[1:]]\n"
    "mem = {}\n"
    "with open('/proc/meminfo') as f:\n"
    "    for line in f:\n"
    "        k, _, v = line.partition(':')\n"
    "        mem[k] = int(v.split()[0])\n"
    "print(json.dumps({'time': time.time(), 'cpu_jiffies': cpu,\n"
    "                  'mem_total_kb': mem['MemTotal'], 'mem_available_kb': mem['MemAvailable']}))\n"
)
BASELINES = {
    "python_poller": "spawning a Python poller per tick (as gpustat-web and nvitop-cluster do "
                     "over SSH): imports rigdeck's collector, the daemon's GPU source",
    "stdlib_sampler": "spawning a minimal stdlib sampler per tick (python3 -c reading /proc/stat "
                      "and /proc/meminfo, one JSON line; no rigdeck import, no GPUs)",
    "smi_per_tick": "spawning nvidia-smi --query-gpu=... --format=csv,noheader,nounits per tick",
    "nvitop_once": "spawning nvitop --once per tick",
}
GPU_HOST_BASELINES = ("smi_per_tick", "nvitop_once")  # only where their program is on PATH
# What the agent's collector makes of this machine, printed as one JSON line.
PROBE_SCRIPT = (
    "import json, sys\n"
    "from agent.telemetry import Collector\n"
    "with Collector(sim_gpus=int(sys.argv[1])) as c:\n"
    "    s = c.sample()\n"
    "print(json.dumps({'source': s.gpu_source, 'names': [g.name for g in s.gpus]}))\n"
)


# -------------------------------------------------------------------------------------------
# /proc readers


def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of one process, in seconds; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_cpu_ns_s(pid: int) -> float | None:
    """Seconds on CPU of all of a process's live threads, from schedstat (nanoseconds); utime +
    stime (10 ms ticks) where the kernel has no schedstat. None once it is gone."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    total = 0
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat", "rb") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return proc_cpu_s(pid)
    return total / 1e9


def proc_ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return int(data[data.rfind(b")") + 2 :].split()[1])


def proc_mem_mb(pid: int) -> dict[str, float]:
    """RSS (VmRSS), and PSS / USS from smaps_rollup where the kernel has it, in MB."""
    out: dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    out["rss"] = int(line.split()[1]) / 1024
                    break
    except OSError:
        return out
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            private = 0
            for line in f:
                key, _, rest = line.partition(":")
                if key == "Pss":
                    out["pss"] = int(rest.split()[0]) / 1024
                elif key in ("Private_Clean", "Private_Dirty"):
                    private += int(rest.split()[0])
            out["uss"] = private / 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def proc_hwm_mb(pid: int) -> float | None:
    """Peak RSS (VmHWM) of a live process, in MB; None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def machine_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine."""
    with open("/proc/stat") as f:
        v = [float(x) for x in f.readline().split()[1:9]]
    return sum(v) - v[3] - v[4], sum(v)


def busy_pct(m0: tuple[float, float], m1: tuple[float, float]) -> float:
    """Machine CPU use between two machine_cpu() readings, as % of all cores."""
    total = m1[1] - m0[1]
    return 100.0 * (m1[0] - m0[0]) / total if total > 0 else float("nan")


def others_pct(m0: tuple[float, float], m1: tuple[float, float], ours_pct: float) -> float:
    """CPU that processes other than ours used in a window, in % of one core (interference)."""
    return max(0.0, busy_pct(m0, m1) * (os.cpu_count() or 1) - ours_pct)


def children_of(pid: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and proc_ppid(int(name)) == pid:
            out.append(int(name))
    return out


def mem_available_mb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_delta(a: dict[int, float | None], b: dict[int, float | None]) -> float:
    """The CPU seconds the processes used between two readings (``proc_cpu_s`` by pid); one
    gone at either reading counts nothing."""
    total = 0.0
    for pid, x in a.items():
        y = b.get(pid)
        if x is not None and y is not None:
            total += y - x
    return total


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks; q in 0..100."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


# -------------------------------------------------------------------------------------------
# Daemons we start, and their cleanup

_prctl: Any
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Last resort: a daemon of ours goes when this process does, even on SIGKILL.
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Daemons:
    """Agent daemons started by this benchmark; ``stop_all`` ends every one of them."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.state_dirs: list[Path] = []

    def start(
        self, cmd: list[str], state_dir: Path, env: dict[str, str]
    ) -> subprocess.Popen[bytes]:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(state_dir / "bench.stderr", "ab") as log:
            p = subprocess.Popen(
                [*cmd, "daemon", "--state-dir", str(state_dir)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=state_dir, env=env,
                start_new_session=True, preexec_fn=_die_with_parent,
            )
        self.procs.append(p)
        self.state_dirs.append(state_dir)
        return p

    def wait_ready(self, timeout: float) -> None:
        """Until every daemon's socket exists (it is listening then)."""
        deadline = time.monotonic() + timeout
        pending = list(zip(self.procs, self.state_dirs, strict=True))
        while pending:
            still = []
            for p, d in pending:
                if (d / "run" / "agent.sock").exists():
                    continue
                if p.poll() is not None:
                    tail = (d / "bench.stderr").read_text(errors="replace")[-500:]
                    raise RuntimeError(f"daemon in {d} exited {p.returncode}: {tail}")
                still.append((p, d))
            pending = still
            if pending and time.monotonic() > deadline:
                raise RuntimeError(f"{len(pending)} daemons did not listen within {timeout:g}s")
            if pending:
                time.sleep(0.05)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.poll() is None]

    def stop_all(self, timeout: float = 10.0) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        # A daemon some attach started on its own (none should) is named by its pidfile.
        ours = {p.pid for p in self.procs}
        for d in self.state_dirs:
            try:
                pid = int((d / "run" / "daemon.pid").read_text().strip())
            except (OSError, ValueError):
                continue
            if pid in ours:
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            if b"daemon" in cmdline and str(d).encode() in cmdline:
                try:
                    os.kill(pid, signal.SIGTERM)
                except OSError:
                    pass
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()
        self.state_dirs.clear()


def agent_env(sim_gpus: int, root: Path = ROOT) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    env["RIGDECK_SIM_GPUS"] = str(sim_gpus)
    return env


# -------------------------------------------------------------------------------------------
# (a) agent overhead


def _send(sock: socket.socket, msg: dict[str, Any]) -> None:
    sock.sendall(json.dumps(msg).encode() + b"\n")


def bench_agent(seconds: float, idle_seconds: float, sim_gpus: int, work: Path,
                daemons: Daemons, root: Path = ROOT, name: str = "agent-a") -> dict[str, Any]:
    """One daemon (from the source tree ``root``): ``idle_seconds`` with no client, then one
    subscribed client for ``seconds``."""
    sd = work / name
    p = daemons.start([sys.executable, "-m", "agent"], sd, agent_env(sim_gpus, root))
    daemons.wait_ready(30)
    idle_pct = None
    if idle_seconds > 0:
        time.sleep(0.5)  # past its start
        i0, ti0 = proc_cpu_ns_s(p.pid), time.monotonic()
        time.sleep(idle_seconds)
        i1, ti1 = proc_cpu_ns_s(p.pid), time.monotonic()
        if i0 is not None and i1 is not None:
            idle_pct = 100.0 * (i1 - i0) / (ti1 - ti0)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(sd / "run" / "agent.sock"))
    sock.settimeout(10)
    f = sock.makefile("rb")
    try:
        hello = json.loads(f.readline())
        assert hello.get("type") == "hello", hello
        _send(sock, {"type": "hello", "protocol": 1})
        _send(sock, {"type": "request", "id": 1, "method": "subscribe", "params": {"rate_hz": 1}})

        def next_msg() -> tuple[float, dict[str, Any]]:
            line = f.readline()
            if not line:
                raise RuntimeError("the daemon closed the connection")
            return time.time(), json.loads(line)

        # Warm up: the subscribe answer and two samples (the first builds the collector).
        warm = 0
        while warm < 2:
            _, msg = next_msg()
            if msg.get("type") == "response":
                assert msg.get("ok"), msg
            elif msg.get("type") == "event":
                warm += 1
        startup_cpu = proc_cpu_ns_s(p.pid) or 0.0
        m0 = machine_cpu()
        cpu0, t0 = proc_cpu_ns_s(p.pid), time.monotonic()
        # Its children (the nvidia-smi source's two nvidia-smi processes) are its cost too.
        kids0 = {k: proc_cpu_ns_s(k) for k in children_of(p.pid)}
        kids_rss = 0.0
        costs: list[float] = []
        lat: list[float] = []
        seqs: list[int] = []
        line_bytes: list[int] = []
        sources: set[str] = set()
        gpu_count = 0
        mem: dict[str, float] = {}
        while time.monotonic() - t0 < seconds:
            got, msg = next_msg()
            if msg.get("type") != "event" or msg.get("event") != "telemetry":
                continue
            data = msg["data"]
            costs.append(float(data["cost_s"]))
            lat.append(got - float(data["time"]))
            seqs.append(int(data["seq"]))
            sources.add(str(data.get("gpu_source")))
            gpu_count = len(data.get("gpus") or [])
            line_bytes.append(len(json.dumps(msg)))
            for k, v in proc_mem_mb(p.pid).items():
                mem[k] = max(mem.get(k, 0.0), v)
            kids_rss = max(kids_rss, sum(proc_mem_mb(k).get("rss", 0.0) for k in kids0))
        cpu1, t1 = proc_cpu_ns_s(p.pid), time.monotonic()
        kids_cpu = sum((proc_cpu_ns_s(k) or c) - c for k, c in kids0.items() if c is not None)
        m1 = machine_cpu()
        assert cpu0 is not None and cpu1 is not None
        # Leave the way a controller would: ask it to shut down, and check that it does.
        _send(sock, {"type": "request", "id": 2, "method": "shutdown", "params": {}})
        try:
            p.wait(10)
            clean_exit = p.returncode == 0
        except subprocess.TimeoutExpired:
            clean_exit = False
    finally:
        f.close()
        sock.close()
    elapsed = t1 - t0
    return {
        "seconds": elapsed,
        "samples": len(costs),
        "missed_samples": sum(max(0, b - a - 1) for a, b in zip(seqs, seqs[1:], strict=False)),
        "cpu_s": cpu1 - cpu0,
        "cpu_pct_of_core": 100.0 * (cpu1 - cpu0) / elapsed,
        "startup_cpu_s": startup_cpu,
        "idle_seconds": idle_seconds,
        "idle_cpu_pct_of_core": idle_pct,
        "rss_mb_max": mem.get("rss"),
        "pss_mb_max": mem.get("pss"),
        "uss_mb_max": mem.get("uss"),
        "cost_ms_mean": 1000 * mean(costs),
        "cost_ms_p95": 1000 * percentile(costs, 95),
        "client_latency_ms_p50": 1000 * percentile(lat, 50),
        "client_latency_ms_p95": 1000 * percentile(lat, 95),
        "event_bytes_mean": mean([float(b) for b in line_bytes]),
        "gpu_source": "/".join(sorted(sources)),
        "gpus": gpu_count,
        "source_tree": str(root),
        "cpu_measured": "schedstat of every thread (ns)",
        "children": len(kids0),
        "children_cpu_pct_of_core": 100.0 * kids_cpu / elapsed,
        "children_rss_mb_max": kids_rss,
        "shutdown_clean": clean_exit,
        "machine_cpu_busy_pct": busy_pct(m0, m1),
        "others_cpu_pct_of_core": others_pct(m0, m1, 100.0 * (cpu1 - cpu0) / elapsed),
    }


def spawn_argv(kind: str, sim_gpus: int) -> tuple[list[str], dict[str, str]] | None:
    """The command a spawning baseline runs each tick, and its environment; None where its
    program is not on this machine."""
    if kind == "python_poller":
        return [sys.executable, "-c", POLL_SCRIPT, str(sim_gpus)], agent_env(sim_gpus)
    if kind == "stdlib_sampler":
        return [sys.executable, "-c", SAMPLER_SCRIPT], dict(os.environ)
    exe = shutil.which("nvidia-smi" if kind == "smi_per_tick" else "nvitop")
    if exe is None:
        return None
    if kind == "smi_per_tick":
        return [exe, "--query-gpu=" + NVIDIA_SMI_QUERY, "--format=csv,noheader,nounits"], dict(os.environ)
    return [exe, "--once"], dict(os.environ)


def check_output(kind: str, out: bytes, probe: dict[str, Any]) -> float | None:
    """Raise if a baseline's child printed something else than a sample of this machine's GPUs;
    its collection cost in seconds where it says."""
    text = out.decode("utf-8", "replace").strip()
    if kind == "python_poller":
        sample = json.loads(text.splitlines()[-1])
        # the same source and GPUs as the daemon (real GPUs on a GPU host, not sim_gpus)
        assert sample["gpu_source"] == probe["source"], (sample["gpu_source"], probe)
        assert len(sample["gpus"]) == len(probe["names"]), (sample["gpus"], probe)
        return float(sample["cost_s"])
    if kind == "stdlib_sampler":
        sample = json.loads(text.splitlines()[-1])
        assert sample["cpu_jiffies"] and sample["mem_total_kb"] > 0, sample
    elif kind == "smi_per_tick":
        rows = [r for r in text.splitlines() if parse_nvidia_smi_row(r) is not None]
        assert len(rows) == len(probe["names"]), text[-500:]
    else:
        assert text, "nvitop --once printed nothing"
    return None


def bench_spawn(seconds: float, kind: str, sim_gpus: int, probe: dict[str, Any]) -> dict[str, Any]:
    """Spawn one sampler process per 1 Hz tick (``kind``: a key of BASELINES) for ``seconds``."""
    spec = spawn_argv(kind, sim_gpus)
    assert spec is not None, kind
    argv, env = spec
    self0 = time.process_time()
    m0 = machine_cpu()
    t0 = time.monotonic()
    next_tick = t0
    child_cpu: list[float] = []
    child_rss: list[float] = []
    walls: list[float] = []
    costs: list[float] = []
    while time.monotonic() - t0 < seconds:
        ts = time.monotonic()
        p = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
        )
        assert p.stdout is not None
        out = p.stdout.readline()
        # Its peak RSS, read while it is still exiting: wait4's ru_maxrss would be this
        # process's own size (a child's maximum RSS counts what it had at fork, before exec).
        hwm = proc_hwm_mb(p.pid)
        out += p.stdout.read()
        p.stdout.close()
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        walls.append(time.monotonic() - ts)
        if p.returncode != 0:
            raise RuntimeError(f"{kind} child exited {p.returncode}: {out[-500:]!r}")
        cost = check_output(kind, out, probe)
        if cost is not None:
            costs.append(cost)
        child_cpu.append(ru.ru_utime + ru.ru_stime)
        if hwm is not None:
            child_rss.append(hwm)
        next_tick += 1.0
        delay = next_tick - time.monotonic()
        if delay > 0:
            time.sleep(min(delay, max(0.0, seconds - (time.monotonic() - t0))))
    elapsed = time.monotonic() - t0
    self_cpu = time.process_time() - self0
    m1 = machine_cpu()
    total = sum(child_cpu) + self_cpu
    return {
        "what": BASELINES[kind],
        "argv": argv if kind in GPU_HOST_BASELINES else argv[:2],
        "seconds": elapsed,
        "ticks": len(child_cpu),
        "cpu_s": total,
        "children_cpu_s": sum(child_cpu),
        "loop_cpu_s": self_cpu,
        "cpu_pct_of_core": 100.0 * total / elapsed,
        "cpu_ms_per_tick": 1000 * total / max(1, len(child_cpu)),
        "child_rss_mb_max": max(child_rss, default=float("nan")),
        "child_rss_mb_mean": mean(child_rss),
        "child_rss_measured": f"VmHWM of {len(child_rss)} of {len(child_cpu)} children",
        "wall_ms_per_tick_p50": 1000 * percentile(walls, 50),
        "cost_ms_mean": 1000 * mean(costs) if costs else None,
        "interpreter": sys.executable,
        "machine_cpu_busy_pct": busy_pct(m0, m1),
        "others_cpu_pct_of_core": others_pct(m0, m1, 100.0 * total / elapsed),
    }


def bench_smi_loop(seconds: float, probe: dict[str, Any]) -> dict[str, Any] | None:
    """``nvidia-smi --query-gpu=... -l 1`` running all along (the cheapest way to watch a GPU
    host's GPUs, without processes): its CPU and memory over ``seconds`` once warm. None where
    there is no nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    argv = [exe, "--query-gpu=" + NVIDIA_SMI_QUERY, "--format=csv,noheader,nounits", "-l", "1"]
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    assert p.stdout is not None
    rows: list[str] = []

    def read() -> None:
        assert p.stdout is not None
        for raw in p.stdout:
            if parse_nvidia_smi_row(raw.decode("utf-8", "replace")) is not None:
                rows.append(raw.decode())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        time.sleep(2.0)  # past its start
        c0, t0, n0 = proc_cpu_ns_s(p.pid), time.monotonic(), len(rows)
        mem: dict[str, float] = {}
        while time.monotonic() - t0 < seconds:
            time.sleep(1.0)
            for k, v in proc_mem_mb(p.pid).items():
                mem[k] = max(mem.get(k, 0.0), v)
        c1, t1, n1 = proc_cpu_ns_s(p.pid), time.monotonic(), len(rows)
    finally:
        p.terminate()
        p.wait(10)
        reader.join(5)
    if c0 is None or c1 is None:
        raise RuntimeError(f"nvidia-smi -l 1 exited early ({p.returncode}): {rows[-3:]}")
    elapsed = t1 - t0
    return {
        "what": "nvidia-smi --query-gpu=... -l 1, one process all along (GPU rows, no processes)",
        "argv": argv, "seconds": elapsed, "rows": n1 - n0,
        "rows_expected": int(elapsed) * len(probe["names"]),
        "cpu_s": c1 - c0, "cpu_pct_of_core": 100.0 * (c1 - c0) / elapsed,
        "rss_mb_max": mem.get("rss"), "pss_mb_max": mem.get("pss"),
        "cpu_measured": "schedstat of every thread (ns)",
    }


def probe_gpus(sim_gpus: int) -> dict[str, Any]:
    """The agent's GPU source on this machine and its GPUs' names (one sample, in a child)."""
    out = subprocess.run([sys.executable, "-c", PROBE_SCRIPT, str(sim_gpus)], capture_output=True,
                         text=True, env=agent_env(sim_gpus), timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def device_name(probe: dict[str, Any]) -> str:
    """A file-name word for the GPUs measured: 'simulated', 'no-gpu', or the model (a count
    before it where there are several): 'nvidia-h100-80gb-hbm3', '8x-nvidia-a100-sxm4-80gb'."""
    if probe["source"] in ("simulated", "none"):
        return "simulated" if probe["source"] == "simulated" else "no-gpu"
    names = probe["names"]
    slug = re.sub(r"[^a-z0-9]+", "-", (names[0] if names else "gpu").lower()).strip("-")
    return f"{len(names)}x-{slug}" if len(names) > 1 else slug


def source_words(probe: dict[str, Any]) -> str:
    n = len(probe["names"])
    if probe["source"] == "simulated":
        return f"{n} simulated GPUs (no NVML, no nvidia-smi on this machine)"
    if probe["source"] == "none":
        return "no GPUs (none found, none simulated)"
    return f"{n} x {probe['names'][0] if n else 'GPU'} through {probe['source']}"


# -------------------------------------------------------------------------------------------
# (b) controller ingest


class RecordingState(ClusterState):
    """ClusterState that notes, per applied sample, when it was applied (wall clock)."""

    def __init__(self, hosts: list[tuple[str, str]]):
        super().__init__(hosts)
        self.records: list[tuple[float, float, float, str, int]] = []

    def apply_sample(
        self, host: str, data: dict[str, Any], received_at: float | None = None
    ) -> None:
        applied = time.time()
        super().apply_sample(host, data, received_at)
        # list.append is atomic under the GIL: reader threads need no lock of ours.
        self.records.append(
            (applied, float(data.get("time") or 0.0), float(data.get("cost_s") or 0.0), host,
             int(data.get("seq") or 0))
        )

    def window(self, w0: float, w1: float) -> tuple[list[Any], list[float], list[float], int]:
        """The records applied in [w0, w1): themselves, their latencies (applied minus sampled),
        their collection costs, and how many samples the hosts' sequence numbers skipped."""
        window = [r for r in self.records if w0 <= r[0] < w1]
        per_host: dict[str, list[int]] = {}
        for r in window:
            per_host.setdefault(r[3], []).append(r[4])
        missed = sum(
            max(0, b - a - 1) for seqs in per_host.values()
            for a, b in zip(sorted(seqs), sorted(seqs)[1:], strict=False)
        )
        return window, [r[0] - r[1] for r in window], [r[2] for r in window], missed

    def wait_all_up(self, timeout: float) -> None:
        """Until every host has sent a sample; RuntimeError (naming a few that have not, and
        why) after ``timeout`` s."""
        n = len(self.hosts)
        deadline = time.monotonic() + timeout
        while True:
            up = sum(1 for h in self.hosts.values() if h.samples > 0)
            if up == n:
                return
            if time.monotonic() > deadline:
                down = {h.name: h.reason for h in self.hosts.values() if h.samples == 0}
                raise RuntimeError(
                    f"N={n}: only {up} hosts sent telemetry; e.g. {list(down.items())[:3]}"
                )
            time.sleep(0.1)

    def status_counts(self) -> dict[str, int]:
        """How many hosts are in each status."""
        statuses: dict[str, int] = {}
        for h in self.hosts.values():
            statuses[h.status.value] = statuses.get(h.status.value, 0) + 1
        return statuses


def latency_fields(lat: list[float], costs: list[float]) -> dict[str, float]:
    """A window's sample-to-state latencies and collection costs, in ms (a result's fields)."""
    return {
        "latency_ms_p50": 1000 * percentile(lat, 50),
        "latency_ms_p95": 1000 * percentile(lat, 95),
        "latency_ms_p99": 1000 * percentile(lat, 99),
        "latency_ms_max": 1000 * max(lat, default=float("nan")),
        "cost_ms_mean": 1000 * mean(costs),
        "cost_ms_p95": 1000 * percentile(costs, 95),
    }


class PredeployedController(HostLinks):
    """The agent is already where the daemons run it from: skip the per-connect deploy checks."""

    def __init__(self, inventory: Inventory, bundle: AgentBundle):
        super().__init__(inventory, bundle_factory=lambda: bundle)

    def _deploy_one(self, report: HostReport, t: Transport, bundle: AgentBundle) -> tuple[str, str]:
        return t.spec.state_dir, str(bundle.path)


def bench_ingest(n: int, seconds: float, sim_gpus: int, work: Path, bundle: AgentBundle,
                 daemons: Daemons, real_deploy: bool) -> dict[str, Any]:
    """N hosts: daemons h000..h<N-1> (started here as far as the pool lacks them, then kept for
    larger N; each is unsubscribed and idle between runs), one Monitor reading all of them."""
    base = work / "ingest"
    env = agent_env(sim_gpus)
    t_setup = time.monotonic()
    for i in range(len(daemons.procs), n):
        # Each daemon runs the very zipapp the controller attaches with: same version, no upgrade.
        daemons.start([sys.executable, str(bundle.path)], base / f"h{i:03d}", env)
    daemons.wait_ready(max(60.0, n * 0.5))
    specs = [
        HostSpec(name=f"h{i:03d}", address="localhost", transport="local", python=sys.executable,
                 state_dir=str(daemons.state_dirs[i]), sim_gpus=sim_gpus,
                 connect_timeout=CONNECT_TIMEOUT_S)
        for i in range(n)
    ]
    inv = Inventory(hosts=tuple(specs), path=None, known_hosts=work / "known_hosts")
    ctl = (HostLinks(inv, bundle_factory=lambda: bundle) if real_deploy
           else PredeployedController(inv, bundle))
    mon = Monitor(ctl, rate_hz=1.0)
    state = RecordingState([(s.name, s.address) for s in inv.hosts])
    mon.state = state
    mon.start()
    try:
        state.wait_all_up(max(CONNECT_TIMEOUT_S, float(n)))
        setup_s = time.monotonic() - t_setup
        time.sleep(2.0)  # every collector past its first sample

        me = os.getpid()
        dpids = {p.pid for p in daemons.procs[:n] if p.poll() is None}
        apids = set(children_of(me)) - dpids  # the attach bridges
        d0 = {pid: proc_cpu_s(pid) for pid in dpids}
        a0 = {pid: proc_cpu_s(pid) for pid in apids}
        m0 = machine_cpu()
        c0 = time.process_time()
        w0 = time.time()
        events0 = mon.events_received
        time.sleep(seconds)
        w1 = time.time()
        c1 = time.process_time()
        m1 = machine_cpu()
        events1 = mon.events_received
        d1 = {pid: proc_cpu_s(pid) for pid in dpids}
        a1 = {pid: proc_cpu_s(pid) for pid in apids}
        statuses = state.status_counts()
        mem = {"controller": proc_mem_mb(me)}
        for key, pids in (("daemons", dpids), ("attach", apids)):
            per = [proc_mem_mb(pid) for pid in pids]
            mem[key] = {k: sum(m.get(k, 0.0) for m in per) for k in ("rss", "pss", "uss")}
            mem[key]["count"] = len(per)
    finally:
        mon.stop(timeout=15)
        ctl.close()

    window, lat, costs, missed = state.window(w0, w1)
    elapsed = w1 - w0
    count = len(window)
    ctl_cpu = c1 - c0
    return {
        "n": n,
        "seconds": elapsed,
        "setup_s": setup_s,
        "samples": count,
        "expected_samples": n * elapsed,
        "samples_per_s": count / elapsed,
        "events_per_s": (events1 - events0) / elapsed,
        "missed_samples": missed,
        "hosts_reporting": len({r[3] for r in window}),
        "status_at_end": statuses,
        "controller_cpu_s": ctl_cpu,
        "controller_cpu_pct_of_core": 100.0 * ctl_cpu / elapsed,
        "controller_cpu_ms_per_sample": 1000 * ctl_cpu / max(1, count),
        **latency_fields(lat, costs),
        "latency_minus_cost_ms_p95": 1000 * percentile(
            [a - b for a, b in zip(lat, costs, strict=True)], 95
        ),
        "daemons_cpu_pct_of_core": 100.0 * cpu_delta(d0, d1) / elapsed,
        "attach_cpu_pct_of_core": 100.0 * cpu_delta(a0, a1) / elapsed,
        "machine_cpu_busy_pct": busy_pct(m0, m1),
        "others_cpu_pct_of_core": others_pct(
            m0, m1, 100.0 * (ctl_cpu + cpu_delta(d0, d1) + cpu_delta(a0, a1)) / elapsed
        ),
        "cores": os.cpu_count(),
        "mem_mb": mem,
        "attach_pss_mb_each": mem["attach"]["pss"] / max(1, mem["attach"]["count"]),
        "daemon_pss_mb_each": mem["daemons"]["pss"] / max(1, mem["daemons"]["count"]),
        "real_deploy": real_deploy,
    }


# -------------------------------------------------------------------------------------------


def fmt(v: float | None, spec: str = ".1f") -> str:
    return "n/a" if v is None else format(v, spec)


SPAWN_LABELS = {
    "python_poller": "spawn Python poller",
    "stdlib_sampler": "spawn stdlib sampler",
    "smi_per_tick": "spawn nvidia-smi",
    "nvitop_once": "spawn nvitop --once",
}


def _agent_row(label: str, a: dict[str, Any]) -> None:
    mem = f"RSS {fmt(a['rss_mb_max'])} MB"
    if a.get("pss_mb_max") is not None:
        mem += f" (PSS {fmt(a['pss_mb_max'])}, USS {fmt(a['uss_mb_max'])})"
    print(f"  {label:<21} {a['cpu_pct_of_core']:6.3f} % of a core   {mem}   "
          f"sample cost mean {a['cost_ms_mean']:.2f} ms p95 {a['cost_ms_p95']:.2f} ms")
    if a.get("children"):
        print(f"  {'  its children':<21} {a['children_cpu_pct_of_core']:6.3f} % of a core   "
              f"RSS {a['children_rss_mb_max']:.1f} MB ({a['children']} processes: nvidia-smi)")
    if a.get("idle_cpu_pct_of_core") is not None:
        print(f"  {'  no client':<21} {a['idle_cpu_pct_of_core']:6.3f} % of a core   "
              f"(over {a['idle_seconds']:g} s before anyone subscribed)")


def print_agent(a: dict[str, Any], spawned: dict[str, dict[str, Any]], probe: dict[str, Any],
                smi_loop: dict[str, Any] | None, before: dict[str, Any] | None,
                skipped: list[str]) -> None:
    print(f"agent overhead ({source_words(probe)}; the daemon said: {a['gpu_source']}; 1 Hz, "
          f"{a['seconds']:.0f} s)")
    if before is not None:
        _agent_row("daemon, before", before)
    _agent_row("rigdeck daemon", a)
    if before is not None and a["cpu_pct_of_core"] > 0:
        print(f"  {'before / after':<21} {before['cpu_pct_of_core'] / a['cpu_pct_of_core']:6.2f}x "
              f"CPU, {before['rss_mb_max'] - a['rss_mb_max']:+.1f} MB RSS "
              f"(before: {before['source_tree']})")
    if smi_loop is not None:
        print(f"  {'nvidia-smi -l 1':<21} {smi_loop['cpu_pct_of_core']:6.3f} % of a core   "
              f"RSS {fmt(smi_loop['rss_mb_max'])} MB   {smi_loop['rows']} rows "
              f"(GPU rows only, no processes)")
    for kind, p in spawned.items():
        print(f"  {SPAWN_LABELS[kind]:<21} {p['cpu_pct_of_core']:6.2f} % of a core   "
              f"RSS {p['child_rss_mb_max']:.1f} MB per child   "
              f"{p['cpu_ms_per_tick']:.0f} ms CPU per tick, "
              f"{p['wall_ms_per_tick_p50']:.0f} ms wall")
    others = dict(spawned, **({"smi_loop": smi_loop} if smi_loop else {}))
    for kind, p in others.items():
        if a["cpu_pct_of_core"] > 0:
            what = (BASELINES[kind] if kind in BASELINES else p["what"]).split(":")[0]
            print(f"  ratio                 {p['cpu_pct_of_core'] / a['cpu_pct_of_core']:6.2f}x "
                  f"the daemon's CPU: {what}")
    for why in skipped:
        print(f"  not measured          {why}")
    ok_cpu = a["cpu_pct_of_core"] <= TARGET_AGENT_CPU_PCT
    ok_rss = a["rss_mb_max"] is not None and a["rss_mb_max"] <= TARGET_AGENT_RSS_MB
    print(f"  targets               <= {TARGET_AGENT_CPU_PCT:g} % CPU: "
          f"{'met' if ok_cpu else 'MISSED'}; "
          f"<= {TARGET_AGENT_RSS_MB:g} MB RSS: {'met' if ok_rss else 'MISSED'} "
          f"(set for NVML at 1 Hz; this run: {a['gpu_source']}); "
          f"{a['samples']} samples, {a['missed_samples']} skipped, "
          f"startup {a['startup_cpu_s']:.2f} s CPU (not counted)")
    other = f"{a['others_cpu_pct_of_core']:.0f} % (daemon window)"
    for kind, p in spawned.items():
        other += f", {p['others_cpu_pct_of_core']:.0f} % ({kind} window)"
    print(f"  other processes       {other} of a core (not ours: interference)")


def print_ingest(rows: list[dict[str, Any]], seconds: float) -> None:
    print(f"controller ingest (1 Hz per agent, {seconds:g} s, local pipes, not SSH: "
          f"see bench/scale.py; all on this {os.cpu_count()}-core machine)")
    for r in rows:
        print(f"  N={r['n']:<4d} samples/s {r['samples_per_s']:6.1f}  "
              f"CPU/sample {r['controller_cpu_ms_per_sample']:.2f} ms  "
              f"latency p50 {r['latency_ms_p50']:.1f} ms p95 {r['latency_ms_p95']:.1f} ms "
              f"max {r['latency_ms_max']:.0f} ms  (cost p95 {r['cost_ms_p95']:.1f} ms)")
        print(f"         controller {r['controller_cpu_pct_of_core']:.1f} % of a core, "
              f"daemons {r['daemons_cpu_pct_of_core']:.1f} %, "
              f"attach {r['attach_cpu_pct_of_core']:.1f} %, "
              f"others {r['others_cpu_pct_of_core']:.0f} %; "
              f"{r['missed_samples']} skipped; status {r['status_at_end']}; "
              f"setup {r['setup_s']:.1f} s")
        m = r["mem_mb"]
        print(f"         memory (PSS) controller {m['controller'].get('pss', 0):.0f} MB, "
              f"daemons {m['daemons']['pss']:.0f} MB ({r['daemon_pss_mb_each']:.1f} each), "
              f"attach {m['attach']['pss']:.0f} MB ({r['attach_pss_mb_each']:.1f} each)")
    if rows:
        last = rows[-1]
        verdict = "met" if last["latency_ms_p95"] < TARGET_P95_MS else "MISSED"
        print(f"  target                p95 < {TARGET_P95_MS:g} ms at N={last['n']}: {verdict}")


def run_baselines(args: argparse.Namespace, agent: dict[str, Any], probe: dict[str, Any],
                  result: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, Any] | None,
                                                   list[str]]:
    """Every baseline this machine can run, recorded in ``result``; what it could not, and why."""
    spawned: dict[str, dict[str, Any]] = {}
    skipped: list[str] = []
    if args.skip_baseline:
        return spawned, None, ["baselines (--skip-baseline)"]
    smi_loop = bench_smi_loop(args.agent_seconds, probe)
    if smi_loop is None:
        skipped.append("nvidia-smi -l 1 and a nvidia-smi per tick: no nvidia-smi on PATH")
    else:
        result["smi_loop_baseline"] = smi_loop
    for kind in BASELINES:
        if spawn_argv(kind, args.sim_gpus) is None:
            if kind == "nvitop_once":
                skipped.append("nvitop --once per tick: nvitop is not installed")
            continue
        spawned[kind] = bench_spawn(args.agent_seconds, kind, args.sim_gpus, probe)
        result[f"{kind}_baseline"] = spawned[kind]
    for kind, p in dict(spawned, **({"smi_loop": smi_loop} if smi_loop else {})).items():
        result[f"cpu_ratio_vs_{kind}"] = (p["cpu_pct_of_core"] / agent["cpu_pct_of_core"]
                                          if agent["cpu_pct_of_core"] > 0 else None)
    result["baselines_skipped"] = skipped
    return spawned, smi_loop, skipped


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agent-seconds", type=float, default=30.0, help="D for (a)")
    ap.add_argument("--idle-seconds", type=float, default=10.0,
                    help="(a): measure the daemon with no client first, this long")
    ap.add_argument("--ingest-seconds", type=float, default=20.0, help="D for (b), per N")
    ap.add_argument("--n", default="16,64,256", help="comma-separated host counts for (b)")
    ap.add_argument("--sim-gpus", type=int, default=8)
    ap.add_argument("--skip-agent", action="store_true")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--skip-ingest", action="store_true")
    ap.add_argument("--real-deploy", action="store_true",
                    help="let every reader run the controller's deploy check (3 spawns per host)")
    ap.add_argument("--before-tree", type=Path, default=None,
                    help="(a): also measure the daemon of this source tree, first, in the same run")
    ap.add_argument("--out", default=None,
                    help="default: bench/results/telemetry-<device>.json (simulated, the GPU model)")
    args = ap.parse_args()
    ns = [int(x) for x in args.n.split(",") if x.strip()]
    meta = run_meta()

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    notes: list[str] = []
    m0 = machine_cpu()
    time.sleep(2.0)
    busy_before = busy_pct(m0, machine_cpu())
    if busy_before > BUSY_WARN_PCT:
        notes.append(f"the machine was {busy_before:.0f} % busy before the run "
                     "(other processes): the numbers below are disturbed")
        print(f"warning: {notes[-1]}", file=sys.stderr)
    daemons = Daemons()
    work = Path(tempfile.mkdtemp(prefix="rigdeck-bench-"))
    os.chmod(work, 0o700)
    probe = probe_gpus(args.sim_gpus)
    device = device_name(probe)
    print(f"GPU source: {source_words(probe)}", flush=True)
    result: dict[str, Any] = {
        "machine": {"cores": os.cpu_count(), "mem_available_mb": mem_available_mb(),
                    "loadavg_at_start": list(os.getloadavg()), "python": sys.version.split()[0]},
        "sim_gpus": args.sim_gpus,
        "gpu_source": probe["source"],
        "gpu_names": probe["names"],
        "device": device,
        "targets": {"agent_cpu_pct_of_core": TARGET_AGENT_CPU_PCT,
                    "agent_rss_mb": TARGET_AGENT_RSS_MB},
        "ingest_transport": "local pipes (agent.pyz attach); bench/scale.py measures SSH",
    }
    result["machine"]["busy_pct_before_run"] = busy_before
    try:
        if not args.skip_agent:
            before = None
            if args.before_tree is not None:
                before = bench_agent(args.agent_seconds, args.idle_seconds, args.sim_gpus, work,
                                     daemons, root=args.before_tree.resolve(), name="agent-before")
                daemons.stop_all()
                result["agent_before"] = before
            agent = bench_agent(args.agent_seconds, args.idle_seconds, args.sim_gpus, work,
                                daemons)
            daemons.stop_all()
            result["agent"] = agent
            spawned, smi_loop, skipped = run_baselines(args, agent, probe, result)
            print_agent(agent, spawned, probe, smi_loop, before, skipped)
            print(flush=True)
        rows: list[dict[str, Any]] = []
        if not args.skip_ingest:
            bundle = build_agent(work / "cache")
            per_host_mb, attach_mb = 60.0, 25.0  # daemon + attach bridge, until a run measures it
            for n in sorted(ns):
                # Running daemons need only their attach bridge; new hosts need both.
                have = len(daemons.procs)
                avail = mem_available_mb()
                fit = have + int((0.8 * avail - have * attach_mb) / per_host_mb)
                if n > fit:
                    notes.append(f"N={n} needs ~{n * per_host_mb:.0f} MB; "
                                 f"{avail:.0f} MB available: ran N={fit}")
                    n = fit
                if n < 1:
                    continue
                row = bench_ingest(n, args.ingest_seconds, args.sim_gpus, work, bundle, daemons,
                                   args.real_deploy)
                rows.append(row)
                # What one more host really takes (PSS of its daemon and its attach bridge).
                attach_mb = max(10.0, 1.25 * row["attach_pss_mb_each"])
                per_host_mb = max(20.0, 1.25 * row["daemon_pss_mb_each"]) + attach_mb
                print(f"  ... N={n}: {row['samples_per_s']:.1f} samples/s, "
                      f"p95 {row['latency_ms_p95']:.1f} ms", flush=True)
            result["ingest"] = rows
            print()
            print_ingest(rows, args.ingest_seconds)
        for note in notes:
            print(f"note: {note}")
        result["notes"] = notes
    finally:
        daemons.stop_all()
        shutil.rmtree(work, ignore_errors=True)
    out = args.out or ROOT / "bench" / "results" / f"telemetry-{device}.json"
    write_result(out, result, meta)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; every daemon this run started was stopped", file=sys.stderr)
        sys.exit(130)
