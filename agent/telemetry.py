"""Live telemetry of one host: its GPUs and its CPU, memory, disks and network, once per tick.

Stdlib only at import time, Python 3.9+. pynvml (nvidia-ml-py) is used where the host has it,
imported inside the code that needs it; host metrics come from /proc (psutil only where a host has
no /proc, or when asked for).
Every sample is a plain dataclass: nothing in this module knows who reads it.

GPU sources, in the order ``Collector`` tries them:
- ``nvml``: NVML through pynvml, device handles created once and cached.
- ``nvidia-smi``: two long-running children, ``nvidia-smi --query-gpu=... -lms N`` and
  ``nvidia-smi --query-compute-apps=... -lms N``, whose latest rows reader threads keep (never one
  spawn per tick); the processes map to rigdeck job and rank as on the NVML path.
- ``simulated``: ``RIGDECK_SIM_GPUS=N`` paper GPUs whose load follows the CPU use of the user's
  processes tagged for them (``RIGDECK_SIM_GPU=i``, or ``RIGDECK_JOB_ID`` plus
  ``CUDA_VISIBLE_DEVICES``: its entry at ``LOCAL_RANK``, else its first). Marked ``simulated`` everywhere.
- ``none``: no GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from agent import gpuhealth, standby
from agent.facts import simulated_gpus

MB = 1024 * 1024
BACKENDS = ("nvml", "nvidia-smi", "simulated", "none")
MIN_INTERVAL_S = 0.1
MAX_INTERVAL_S = 60.0

NVIDIA_SMI_QUERY = (
    "index,name,uuid,utilization.gpu,memory.used,memory.total,temperature.gpu,"
    "power.draw,power.limit,clocks.sm,ecc.errors.uncorrected.volatile.total"
)
# Asked after the fields above where the driver knows it (an older nvidia-smi refuses the whole
# query: the stream then asks without it).
NVIDIA_SMI_RESERVED = "memory.reserved"
NVIDIA_SMI_APPS_QUERY = "gpu_uuid,pid,used_memory"

# Environment variables that tie a process to a rigdeck job or a simulated GPU.
ENV_SIM_GPU = "RIGDECK_SIM_GPU"
ENV_JOB_ID = "RIGDECK_JOB_ID"
ENV_RANK = "RIGDECK_RANK"
ENV_CUDA_VISIBLE = "CUDA_VISIBLE_DEVICES"
ENV_LOCAL_RANK = "LOCAL_RANK"
_ENV_KEYS = frozenset(
    k.encode() for k in (ENV_SIM_GPU, ENV_JOB_ID, ENV_RANK, ENV_CUDA_VISIBLE, ENV_LOCAL_RANK)
)

SIM_MEMORY_TOTAL_MB = 81920
SIM_POWER_LIMIT_W = 700.0


class TelemetryError(RuntimeError):
    """A telemetry source that was asked for by name cannot be used on this host."""


# ---------------------------------------------------------------------------------------------
# Samples: plain data
# ---------------------------------------------------------------------------------------------


@dataclass
class GpuProcess:
    pid: int
    user: Optional[str]
    used_memory_mb: Optional[int]
    job_id: Optional[str]
    rank: Optional[int]

    def to_dict(self) -> Dict[str, Any]:
        return {
            "pid": self.pid,
            "user": self.user,
            "used_memory_mb": self.used_memory_mb,
            "job_id": self.job_id,
            "rank": self.rank,
        }

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> GpuProcess:
        return cls(
            pid=int(d["pid"]),
            user=d.get("user"),
            used_memory_mb=d.get("used_memory_mb"),
            job_id=d.get("job_id"),
            rank=d.get("rank"),
        )


@dataclass
class GpuSample:
    index: int
    name: str
    uuid: str
    simulated: bool
    utilization_pct: Optional[float]
    memory_used_mb: Optional[int]
    memory_total_mb: Optional[int]
    temperature_c: Optional[float]
    power_w: Optional[float]
    power_limit_w: Optional[float]
    sm_clock_mhz: Optional[int]
    ecc_volatile_errors: Optional[int]  # None where the card has no ECC
    processes: List[GpuProcess] = field(default_factory=list)
    health: str = gpuhealth.OK  # ok | warn | unhealthy, judged on the host (agent/gpuhealth.py)
    health_reason: Optional[str] = None
    # The driver's own reservation, kept apart from memory_used_mb as nvidia-smi keeps it; None
    # where the source cannot tell (an old driver or pynvml, simulated GPUs).
    memory_reserved_mb: Optional[int] = None

    def to_dict(self) -> Dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "uuid": self.uuid,
            "simulated": self.simulated,
            "utilization_pct": self.utilization_pct,
            "memory_used_mb": self.memory_used_mb,
            "memory_total_mb": self.memory_total_mb,
            "temperature_c": self.temperature_c,
            "power_w": self.power_w,
            "power_limit_w": self.power_limit_w,
            "sm_clock_mhz": self.sm_clock_mhz,
            "ecc_volatile_errors": self.ecc_volatile_errors,
            "processes": [p.to_dict() for p in self.processes],
            "health": self.health,
            "health_reason": self.health_reason,
            "memory_reserved_mb": self.memory_reserved_mb,
        }

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> GpuSample:
        return cls(
            index=int(d["index"]),
            name=str(d["name"]),
            uuid=str(d["uuid"]),
            simulated=bool(d.get("simulated", False)),
            utilization_pct=d.get("utilization_pct"),
            memory_used_mb=d.get("memory_used_mb"),
            memory_total_mb=d.get("memory_total_mb"),
            temperature_c=d.get("temperature_c"),
            power_w=d.get("power_w"),
            power_limit_w=d.get("power_limit_w"),
            sm_clock_mhz=d.get("sm_clock_mhz"),
            ecc_volatile_errors=d.get("ecc_volatile_errors"),
            processes=[GpuProcess.from_dict(p) for p in d.get("processes") or []],
            # an agent older than health checks says nothing: that is "ok", as it always read
            health=str(d.get("health") or gpuhealth.OK),
            health_reason=d.get("health_reason"),
            memory_reserved_mb=d.get("memory_reserved_mb"),
        )


@dataclass
class HostSample:
    cpu_pct: float
    cpu_per_core: List[float]
    load: List[float]  # 1, 5 and 15 minute load averages
    mem_used_mb: int
    mem_total_mb: int
    swap_used_mb: int
    swap_total_mb: int
    disk_read_bps: float
    disk_write_bps: float
    net_rx_bps: float
    net_tx_bps: float

    def to_dict(self) -> Dict[str, Any]:
        return {
            "cpu_pct": self.cpu_pct,
            "cpu_per_core": list(self.cpu_per_core),
            "load": list(self.load),
            "mem_used_mb": self.mem_used_mb,
            "mem_total_mb": self.mem_total_mb,
            "swap_used_mb": self.swap_used_mb,
            "swap_total_mb": self.swap_total_mb,
            "disk_read_bps": self.disk_read_bps,
            "disk_write_bps": self.disk_write_bps,
            "net_rx_bps": self.net_rx_bps,
            "net_tx_bps": self.net_tx_bps,
        }

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> HostSample:
        return cls(
            cpu_pct=float(d["cpu_pct"]),
            cpu_per_core=[float(x) for x in d.get("cpu_per_core") or []],
            load=[float(x) for x in d.get("load") or []],
            mem_used_mb=int(d["mem_used_mb"]),
            mem_total_mb=int(d["mem_total_mb"]),
            swap_used_mb=int(d.get("swap_used_mb", 0)),
            swap_total_mb=int(d.get("swap_total_mb", 0)),
            disk_read_bps=float(d.get("disk_read_bps", 0.0)),
            disk_write_bps=float(d.get("disk_write_bps", 0.0)),
            net_rx_bps=float(d.get("net_rx_bps", 0.0)),
            net_tx_bps=float(d.get("net_tx_bps", 0.0)),
        )


@dataclass
class Sample:
    seq: int
    time: float
    hostname: str
    gpu_source: str  # "nvml" | "nvidia-smi" | "simulated" | "none"
    simulated: bool  # True when the GPUs are simulated
    host: HostSample
    gpus: List[GpuSample]
    cost_s: float  # wall time this sample took to collect

    def to_dict(self) -> Dict[str, Any]:
        return {
            "seq": self.seq,
            "time": self.time,
            "hostname": self.hostname,
            "gpu_source": self.gpu_source,
            "simulated": self.simulated,
            "host": self.host.to_dict(),
            "gpus": [g.to_dict() for g in self.gpus],
            "cost_s": self.cost_s,
        }

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> Sample:
        return cls(
            seq=int(d["seq"]),
            time=float(d["time"]),
            hostname=str(d["hostname"]),
            gpu_source=str(d["gpu_source"]),
            simulated=bool(d.get("simulated", False)),
            host=HostSample.from_dict(d["host"]),
            gpus=[GpuSample.from_dict(g) for g in d.get("gpus") or []],
            cost_s=float(d.get("cost_s", 0.0)),
        )


def sample_to_dict(s: Sample) -> Dict[str, Any]:
    """A plain dict of ``s``, ready for ``json.dumps``."""
    return s.to_dict()


def sample_from_dict(d: Dict[str, Any]) -> Sample:
    """The inverse of ``sample_to_dict``; keys it does not know are ignored."""
    return Sample.from_dict(d)


# ---------------------------------------------------------------------------------------------
# Small readers
# ---------------------------------------------------------------------------------------------


def _read_bytes(path: str) -> bytes:
    # os-level reads: /proc files are small, and open() costs several times more per call.
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while True:
            b = os.read(fd, 65536)
            if not b:
                break
            chunks.append(b)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _read_text(path: str) -> str:
    return _read_bytes(path).decode("ascii", "replace")


def _clamp_interval(seconds: float) -> float:
    return max(MIN_INTERVAL_S, min(MAX_INTERVAL_S, float(seconds)))


def _rate(
    cur: Dict[str, Tuple[int, int]], prev: Dict[str, Tuple[int, int]], dt: float
) -> Tuple[float, float]:
    """Summed per-device byte rates; devices that came, went or reset their counters add nothing."""
    if dt <= 0:
        return 0.0, 0.0
    a = b = 0
    for name, (x, y) in cur.items():
        p = prev.get(name)
        if p is None:
            continue
        if x >= p[0]:
            a += x - p[0]
        if y >= p[1]:
            b += y - p[1]
    return round(a / dt, 1), round(b / dt, 1)


# ---------------------------------------------------------------------------------------------
# /proc parsers (pure, unit-testable on recorded text)
# ---------------------------------------------------------------------------------------------


def _busy_total(values: Iterable[float]) -> Tuple[float, float]:
    """(busy, total) from user nice system idle iowait irq softirq steal (guest is inside user)."""
    v = list(values)[:8]
    v += [0.0] * (8 - len(v))
    total = sum(v)
    return total - v[3] - v[4], total


def parse_proc_stat_cpus(text: str) -> List[Tuple[float, float]]:
    """(busy, total) jiffies of each ``cpuN`` line of /proc/stat, in file order."""
    out = []
    for line in text.split("\n"):
        if line.startswith("cpu"):
            if line[3:4].isdigit():
                out.append(_busy_total(float(x) for x in line.split()[1:9]))
        elif out:
            break  # cpu lines come first; skip the long intr line
    return out


_MEMINFO_KEYS = frozenset(("MemTotal", "MemFree", "MemAvailable", "Buffers", "Cached", "SwapTotal", "SwapFree"))


def parse_meminfo(text: str) -> Tuple[int, int, int, int]:
    """(mem used, mem total, swap used, swap total) in MB; used means total - available."""
    kb = {}  # type: Dict[str, int]
    for line in text.split("\n"):
        key, _, rest = line.partition(":")
        if key not in _MEMINFO_KEYS:  # some 50 other lines: not even split
            continue
        parts = rest.split()
        if parts:
            try:
                kb[key] = int(parts[0])
            except ValueError:
                continue
        if key == "SwapFree":  # the last one needed, some 15 lines in: the rest is not read
            break
    total = kb.get("MemTotal", 0)
    avail = kb.get("MemAvailable")
    if avail is None:  # kernels before 3.14
        avail = kb.get("MemFree", 0) + kb.get("Buffers", 0) + kb.get("Cached", 0)
    swap_total = kb.get("SwapTotal", 0)
    swap_used = swap_total - kb.get("SwapFree", swap_total)
    return (
        max(0, total - avail) // 1024,
        total // 1024,
        max(0, swap_used) // 1024,
        swap_total // 1024,
    )


_PART_P = re.compile(r"^(.*\d)p\d+$")  # nvme0n1p2, mmcblk0p1
_PART_N = re.compile(r"^(.*\D)\d+$")  # sda1, vdb2, xvda1
_SKIP_DISK = re.compile(r"^(loop\d|ram\d|zram\d|dm-\d|md\d)")


def whole_disks(names: Iterable[str]) -> List[str]:
    """The names that are whole disks: no partitions of a listed disk, no loop/ram devices.

    Device-mapper and md devices are left out too: their I/O is already counted on the disks
    beneath them.
    """
    names = list(names)
    listed = set(names)
    out = []
    for n in names:
        if _SKIP_DISK.match(n):
            continue
        m = _PART_P.match(n) or _PART_N.match(n)
        if m and m.group(1) in listed:
            continue
        out.append(n)
    return out


def parse_diskstats(text: str) -> Dict[str, Tuple[int, int]]:
    """name -> (read bytes, written bytes) of each device in /proc/diskstats (512-byte sectors)."""
    out = {}
    for line in text.split("\n"):
        f = line.split()
        if len(f) < 10:
            continue
        try:
            out[f[2]] = (int(f[5]) * 512, int(f[9]) * 512)
        except ValueError:
            continue
    return out


def parse_net_dev(text: str) -> Dict[str, Tuple[int, int]]:
    """interface -> (received bytes, sent bytes) from /proc/net/dev."""
    out = {}
    for line in text.split("\n"):
        name, sep, rest = line.partition(":")
        if not sep:
            continue
        f = rest.split()
        if len(f) < 9:
            continue
        try:
            out[name.strip()] = (int(f[0]), int(f[8]))
        except ValueError:
            continue
    return out


# ---------------------------------------------------------------------------------------------
# Host metrics
# ---------------------------------------------------------------------------------------------


class _HostSampler:
    """CPU, memory, disk and network of the host, through psutil or /proc.

    CPU percentages come from our own deltas of cumulative times, not psutil.cpu_percent():
    that keeps its last reading in module state, which two collectors in one process would share.
    """

    def __init__(self, use_psutil: Optional[bool] = None, proc_root: str = "/proc") -> None:
        self._ps = None  # type: Any
        self._root = proc_root
        # /proc where the host has it: a sample costs 146 us there against 354 us through psutil
        # (which reads /proc/meminfo twice and /proc/vmstat), and psutil is not imported at all.
        if use_psutil or (use_psutil is None and not os.path.exists(proc_root + "/stat")):
            try:
                import psutil  # type: ignore

                self._ps = psutil
            except ImportError:
                if use_psutil:
                    raise TelemetryError("use_psutil=True but psutil is not installed") from None
        self._prev = None  # type: Optional[Tuple[float, List[Tuple[float, float]], Dict[str, Tuple[int, int]], Dict[str, Tuple[int, int]]]]
        self._disk_names = ()  # type: Tuple[str, ...]
        self._disk_keep = frozenset()  # type: frozenset

    @property
    def uses_psutil(self) -> bool:
        return self._ps is not None

    def _cpus(self) -> List[Tuple[float, float]]:
        if self._ps is not None:
            return [_busy_total(t) for t in self._ps.cpu_times(percpu=True)]
        return parse_proc_stat_cpus(_read_text(self._root + "/stat"))

    def _memory(self) -> Tuple[int, int, int, int]:
        if self._ps is not None:
            vm = self._ps.virtual_memory()
            sw = self._ps.swap_memory()
            return (
                int(max(0, vm.total - vm.available) // MB),
                int(vm.total // MB),
                int(sw.used // MB),
                int(sw.total // MB),
            )
        return parse_meminfo(_read_text(self._root + "/meminfo"))

    def _disks(self) -> Dict[str, Tuple[int, int]]:
        if self._ps is not None:
            raw = {
                k: (v.read_bytes, v.write_bytes)
                # nowrap=False: its bookkeeping triples the cost; _rate already ignores resets.
                for k, v in (self._ps.disk_io_counters(perdisk=True, nowrap=False) or {}).items()
            }
        else:
            try:
                raw = parse_diskstats(_read_text(self._root + "/diskstats"))
            except OSError:
                raw = {}
        names = tuple(raw)
        if names != self._disk_names:  # the device list rarely changes: classify it once
            self._disk_names = names
            self._disk_keep = frozenset(whole_disks(names))
        return {k: v for k, v in raw.items() if k in self._disk_keep}

    def _nets(self) -> Dict[str, Tuple[int, int]]:
        if self._ps is not None:
            raw = {
                k: (v.bytes_recv, v.bytes_sent)
                for k, v in (self._ps.net_io_counters(pernic=True, nowrap=False) or {}).items()
            }
        else:
            try:
                raw = parse_net_dev(_read_text(self._root + "/net/dev"))
            except OSError:
                raw = {}
        raw.pop("lo", None)
        return raw

    def sample(self, mono: float) -> HostSample:
        cpus = self._cpus()
        disks = self._disks()
        nets = self._nets()
        mem_used, mem_total, swap_used, swap_total = self._memory()
        try:
            load = [round(x, 2) for x in os.getloadavg()]
        except OSError:
            load = [0.0, 0.0, 0.0]
        cpu_pct = 0.0
        per_core = [0.0] * len(cpus)
        disk_r = disk_w = net_rx = net_tx = 0.0
        prev = self._prev
        if prev is not None:
            dt = mono - prev[0]
            if len(prev[1]) == len(cpus):
                per_core = [_cpu_pct(cpus[k], prev[1][k]) for k in range(len(cpus))]
                cpu_pct = _cpu_pct(
                    (sum(c[0] for c in cpus), sum(c[1] for c in cpus)),
                    (sum(p[0] for p in prev[1]), sum(p[1] for p in prev[1])),
                )
            disk_r, disk_w = _rate(disks, prev[2], dt)
            net_rx, net_tx = _rate(nets, prev[3], dt)
        self._prev = (mono, cpus, disks, nets)
        return HostSample(
            cpu_pct=cpu_pct,
            cpu_per_core=per_core,
            load=load,
            mem_used_mb=mem_used,
            mem_total_mb=mem_total,
            swap_used_mb=swap_used,
            swap_total_mb=swap_total,
            disk_read_bps=disk_r,
            disk_write_bps=disk_w,
            net_rx_bps=net_rx,
            net_tx_bps=net_tx,
        )


def _cpu_pct(cur: Tuple[float, float], prev: Tuple[float, float]) -> float:
    total = cur[1] - prev[1]
    if total <= 0:
        return 0.0
    return round(max(0.0, min(100.0, 100.0 * (cur[0] - prev[0]) / total)), 1)


# ---------------------------------------------------------------------------------------------
# Processes: who owns a pid, and which rigdeck job / simulated GPU it belongs to
# ---------------------------------------------------------------------------------------------


def parse_environ(data: bytes) -> Dict[str, str]:
    """The rigdeck-relevant variables of a NUL-separated /proc/<pid>/environ."""
    if b"RIGDECK_" not in data:  # nearly every process: skip the split
        return {}
    out = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key in _ENV_KEYS:
            out[key.decode()] = value.decode("utf-8", "replace")
    return out


def _int_or_none(text: Optional[str]) -> Optional[int]:
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


class _Proc:
    __slots__ = ("pid", "inode", "uid", "env", "fresh", "start", "cpu_ticks", "cpu_mono", "stat_fd")

    def __init__(self, pid: int, inode: int, uid: int, env: Dict[str, str], fresh: bool) -> None:
        self.pid = pid
        self.inode = inode  # /proc/<pid>'s inode: a new process under a reused pid gets a new one
        self.uid = uid
        self.env = env
        self.fresh = fresh
        self.start = None  # type: Optional[bytes]
        self.cpu_ticks = None  # type: Optional[int]
        self.cpu_mono = 0.0
        self.stat_fd = None  # type: Optional[int]  # held open: one pread() per tick


class ProcessTable:
    """Processes of this host as /proc shows them, with their rigdeck tags, cached per pid.

    An environment does not change after exec, so each is read once; a process that appeared
    after the first scan is read once more on the next one, because the first read can catch a
    child between fork and exec, still carrying its parent's environment; so is one whose
    environment read empty (caught inside its exec, before the new one is set). Environments are read
    only for processes of this agent's own user. A pid reused between two scans is told apart
    by the inode of its /proc directory.
    """

    RESCAN_S = 2.0
    MAX_STAT_FDS = 256  # processes whose /proc/<pid>/stat stays open between ticks

    def __init__(self, proc_root: str = "/proc") -> None:
        self._root = proc_root
        self._uid = os.geteuid()
        self._procs = {}  # type: Dict[int, _Proc]
        self._inodes = {}  # type: Dict[int, int]  # pid -> inode of every entry of _procs
        self._fresh = set()  # type: set  # pids of _procs to read once more at the next scan
        self._tagged = {}  # type: Dict[int, _Proc]
        self._last_scan = float("-inf")
        self._last_pid = None  # type: Optional[bytes]  # /proc/loadavg's newest pid at the last listing
        self._users = {}  # type: Dict[int, Optional[str]]
        self._open_fds = 0
        self._scanned = False

    def _load(self, pid: int, fresh: bool = True) -> Optional[_Proc]:
        path = "%s/%d" % (self._root, pid)
        try:
            st = os.stat(path)
        except OSError:
            return None
        env = {}  # type: Dict[str, str]
        own = st.st_uid == self._uid
        if own:
            try:
                raw = _read_bytes(path + "/environ")
            except OSError:
                raw = b"-"
            env = parse_environ(raw)
            # An empty environment is a process inside its exec (the new one is not readable
            # yet), even at the first scan: read it once more at the next.
            fresh = fresh or not raw
        return _Proc(pid, st.st_ino, st.st_uid, env, own and fresh)

    def _put(self, p: _Proc) -> None:
        old = self._procs.get(p.pid)
        if old is not None and old is not p:
            self._close_fd(old)
        self._procs[p.pid] = p
        self._inodes[p.pid] = p.inode
        if p.fresh:
            self._fresh.add(p.pid)
        else:
            self._fresh.discard(p.pid)
        if p.env:
            self._tagged[p.pid] = p
        else:
            self._tagged.pop(p.pid, None)

    def _close_fd(self, p: _Proc) -> None:
        if p.stat_fd is not None:
            os.close(p.stat_fd)
            p.stat_fd = None
            self._open_fds -= 1

    def drop(self, pid: int) -> None:
        p = self._procs.pop(pid, None)
        self._inodes.pop(pid, None)
        self._fresh.discard(pid)
        self._tagged.pop(pid, None)
        if p is not None:
            self._close_fd(p)

    def close(self) -> None:
        """Close the files held open and forget everything."""
        for pid in list(self._procs):
            self.drop(pid)

    def _newest_pid(self) -> Optional[bytes]:
        """The pid last handed out in this PID namespace (/proc/loadavg's fifth field), or None
        where there is no such file (a made-up /proc)."""
        try:
            return _read_bytes(self._root + "/loadavg").split()[4]
        except (OSError, IndexError):
            return None

    def rescan(self, mono: float, force: bool = False) -> bool:
        """List /proc (at most every RESCAN_S): forget dead pids, read the new ones.

        Not even listed when no process was made since the last listing (the newest pid is the
        same: a new process, or one under a reused pid, always takes a new one); those that were
        new then are read again all the same. Returns whether /proc was listed."""
        if not force and mono - self._last_scan < self.RESCAN_S:
            return False
        self._last_scan = mono
        newest = self._newest_pid()  # before listing: a process made while we list moves it
        if not force and newest is not None and newest == self._last_pid:
            self._read_fresh_again(None)
            return False
        try:
            with os.scandir(self._root) as it:
                # d_ino: no stat() per pid
                seen = {int(e.name): e.inode() for e in it if e.name.isdigit()}
        except OSError:
            return False
        self._last_pid = newest
        for pid in self._procs.keys() - seen.keys():
            self.drop(pid)
        self._read_fresh_again(seen)
        # Processes already there at the first scan are past their exec; only later ones are
        # read a second time.
        fresh = self._scanned
        self._scanned = True
        for pid, _ in sorted(seen.items() - self._inodes.items()):  # new pids, and reused ones
            q = self._load(pid, fresh)
            if q is not None:
                self._put(q)
        return True

    def _read_fresh_again(self, seen: Optional[Dict[int, int]]) -> None:
        """Read once more the environment of the processes that were new at the last scan (the
        first read can catch one between fork and exec); ``seen``: /proc's pids and inodes now."""
        for pid in sorted(self._fresh):
            p = self._procs[pid]
            if seen is not None and seen.get(pid) != p.inode:
                continue  # a new process under this pid: read as one below
            p.fresh = False
            self._fresh.discard(pid)
            try:
                p.env = parse_environ(_read_bytes("%s/%d/environ" % (self._root, pid)))
            except OSError:
                continue
            self._put(p)

    def lookup(self, pid: int) -> Optional[_Proc]:
        """The entry of one pid (for pids NVML names), read now if unknown or reused."""
        p = self._procs.get(pid)
        if p is not None:
            try:
                if os.stat("%s/%d" % (self._root, pid)).st_ino == p.inode:
                    return p
            except OSError:
                self.drop(pid)
                return None
        p = self._load(pid, fresh=False)  # NVML already saw it use the GPU: well past exec
        if p is None:
            self.drop(pid)
            return None
        self._put(p)
        return p

    def retain(self, pids: Iterable[int]) -> None:
        """Forget every pid not in ``pids``."""
        keep = set(pids)
        for pid in [pid for pid in self._procs if pid not in keep]:
            self.drop(pid)

    def tagged(self) -> List[_Proc]:
        """Processes of this user whose environment carries a rigdeck variable."""
        return [p for p in self._tagged.values() if p.uid == self._uid]

    def user_name(self, uid: int) -> Optional[str]:
        if uid not in self._users:
            try:
                self._users[uid] = pwd.getpwuid(uid).pw_name
            except KeyError:
                self._users[uid] = str(uid)
        return self._users[uid]

    def read_stat(self, p: _Proc) -> Optional[Tuple[int, int]]:
        """(utime+stime ticks, rss pages) of a live process; None (and forgotten) if it is gone.

        The file stays open between ticks: a pread() costs a third of open+read+close, and a
        held file keeps naming the same process (ESRCH once it is gone, never a reused pid).
        """
        try:
            fd = p.stat_fd
            if fd is not None:
                data = os.pread(fd, 4096, 0)
            elif self._open_fds < self.MAX_STAT_FDS:
                fd = os.open("%s/%d/stat" % (self._root, p.pid), os.O_RDONLY)
                p.stat_fd = fd
                self._open_fds += 1
                data = os.pread(fd, 4096, 0)
            else:
                data = _read_bytes("%s/%d/stat" % (self._root, p.pid))
        except OSError:
            self.drop(p.pid)
            return None
        f = data[data.rfind(b")") + 2 :].split()
        if len(f) < 22 or f[0] in (b"Z", b"X"):
            return None
        if p.start is None:
            p.start = f[19]
        elif p.start != f[19]:  # pid reused between two scans
            self.drop(p.pid)
            return None
        return int(f[11]) + int(f[12]), int(f[21])

    def __len__(self) -> int:
        return len(self._procs)


# ---------------------------------------------------------------------------------------------
# GPU sources
# ---------------------------------------------------------------------------------------------


class _NoGpus:
    source = "none"

    def sample(self, mono: float) -> List[GpuSample]:
        return []

    def set_interval(self, seconds: float) -> None:
        pass

    def close(self) -> None:
        pass


def _sim_gpu_of(env: Dict[str, str], count: int, uuid_index: Dict[str, int]) -> Optional[int]:
    """The simulated GPU a process is tagged for, from its environment."""
    tag = env.get(ENV_SIM_GPU)
    if tag is not None:
        i = _int_or_none(tag)
        return i if i is not None and 0 <= i < count else None
    if ENV_JOB_ID not in env:
        return None
    visible = [v.strip() for v in env.get(ENV_CUDA_VISIBLE, "").split(",") if v.strip()]
    if not visible:
        return None
    # A rank that sees several GPUs (torchrun gives every rank of a host the host's GPUs) uses
    # the one at its LOCAL_RANK, as ``torch.cuda.set_device(LOCAL_RANK)`` does; anything else
    # (one GPU, or no local rank) uses the first it sees.
    local = _int_or_none(env.get(ENV_LOCAL_RANK))
    pick = visible[local % len(visible)] if local is not None and local >= 0 else visible[0]
    i = _int_or_none(pick)
    if i is None:
        return uuid_index.get(pick)  # CUDA_VISIBLE_DEVICES may name GPUs by uuid
    return i if 0 <= i < count else None


def _pid_ns(pid: str) -> Optional[str]:
    """The PID namespace of a process (``self``: this one), or None where it cannot be read."""
    try:
        return os.readlink("/proc/%s/ns/pid" % pid)
    except OSError:
        return None


class _SimulatedGpus:
    """Paper GPUs whose load is the CPU use and memory the RSS of the processes tagged for them."""

    source = "simulated"

    def __init__(self, count: int, hostname: str, table: Optional[ProcessTable] = None,
                 faults_path: Optional[str] = None) -> None:
        self._gpus = simulated_gpus(count, hostname)
        # The test bed breaks a paper GPU by writing this file; the fault lasts as long as its entry.
        self._faults_path = faults_path
        self._judge = gpuhealth.HealthJudge(sticky=False)
        self._uuid_index = {g["uuid"]: g["index"] for g in self._gpus}
        self._table = table if table is not None else ProcessTable()
        self._clk = float(os.sysconf("SC_CLK_TCK"))
        self._page_mb = os.sysconf("SC_PAGE_SIZE") / MB
        # Only where the table reads the real /proc (tests hand it a made-up one).
        self._ns = _pid_ns("self") if getattr(self._table, "_root", "/proc") == "/proc" else None
        self._ns_of = {}  # type: Dict[Tuple[int, int], bool]  # (pid, inode) -> in this agent's PID namespace

    def _here(self, p: _Proc) -> bool:
        """Whether a process belongs to this host: paper GPUs are this PID namespace's own (a
        host of the test bed is one; a job on another host of it must not load these GPUs)."""
        key = (p.pid, p.inode)
        here = self._ns_of.get(key)
        if here is None:
            if len(self._ns_of) > 4096:
                self._ns_of.clear()
            here = self._ns_of[key] = self._ns is None or _pid_ns(str(p.pid)) in (self._ns, None)
        return here

    def sample(self, mono: float) -> List[GpuSample]:
        n = len(self._gpus)
        table = self._table
        table.rescan(mono)
        util = [0.0] * n
        rss = [0.0] * n
        procs = [[] for _ in range(n)]  # type: List[List[GpuProcess]]
        for p in table.tagged():
            env = standby.as_adopted(p.pid, p.env) if standby.ENV_DIR in p.env else p.env  # type: Optional[Dict[str, str]]
            i = _sim_gpu_of(env, n, self._uuid_index) if env is not None else None
            if i is None or not self._here(p):
                continue
            st = table.read_stat(p)
            if st is None:
                continue
            ticks, pages = st
            if p.cpu_ticks is not None and mono > p.cpu_mono:
                util[i] += 100.0 * (ticks - p.cpu_ticks) / self._clk / (mono - p.cpu_mono)
            p.cpu_ticks, p.cpu_mono = ticks, mono
            mb = pages * self._page_mb
            rss[i] += mb
            procs[i].append(
                GpuProcess(
                    pid=p.pid,
                    user=table.user_name(p.uid),
                    used_memory_mb=int(mb),
                    job_id=p.env.get(ENV_JOB_ID),
                    rank=_int_or_none(p.env.get(ENV_RANK)),
                )
            )
        faults = gpuhealth.read_sim_faults(self._faults_path) if self._faults_path else {}
        out = []
        for g in self._gpus:
            i = g["index"]
            u = round(max(0.0, min(100.0, util[i])), 1)
            total = g["memory_total_mb"]
            seen = gpuhealth.sim_observation(faults.get(i))
            health, reason = self._judge.judge(i, seen)
            out.append(
                GpuSample(
                    index=i,
                    name=g["name"],
                    uuid=g["uuid"],
                    simulated=True,
                    utilization_pct=u,
                    memory_used_mb=min(total, 300 + int(rss[i])) if procs[i] else 0,
                    memory_total_mb=total,
                    temperature_c=round(30.0 + 0.5 * u, 1),
                    power_w=round(60.0 + 6.0 * u, 1),
                    power_limit_w=SIM_POWER_LIMIT_W,
                    sm_clock_mhz=1980 if u > 0 else 345,
                    ecc_volatile_errors=seen.ecc_uncorrected,
                    processes=sorted(procs[i], key=lambda x: x.pid),
                    health=health,
                    health_reason=reason,
                )
            )
        return out

    def clear_health(self, index: Optional[int] = None) -> List[int]:
        return self._judge.clear(index)

    def set_interval(self, seconds: float) -> None:
        pass

    def close(self) -> None:
        self._table.close()


def _gpu_processes(table: ProcessTable, used: Dict[int, Optional[int]],
                   all_pids: set) -> List[GpuProcess]:
    """The processes a GPU source names (pid -> MB used), with their user, job and rank read from
    their environment; their pids are added to ``all_pids``."""
    procs = []
    for pid, mb in sorted(used.items()):
        all_pids.add(pid)
        p = table.lookup(pid)
        procs.append(
            GpuProcess(
                pid=pid,
                user=table.user_name(p.uid) if p is not None else None,
                used_memory_mb=mb,
                job_id=p.env.get(ENV_JOB_ID) if p is not None else None,
                rank=_int_or_none(p.env.get(ENV_RANK)) if p is not None else None,
            )
        )
    return procs


def _absent(*args: Any) -> Any:
    """Stands in for an NVML call this pynvml lacks: the field reads as unknown."""
    return None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class _NvmlGpus:
    """NVML through a pynvml module object (a test can pass a fake one)."""

    source = "nvml"

    def __init__(self, nvml: Any, table: Optional[ProcessTable] = None) -> None:
        self._nvml = nvml
        self._err = nvml.NVMLError
        self._not_supported = getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", 3)
        self._no_function = getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)
        self._unsupported = set()  # type: set  # (gpu index, query name): never asked again
        self._table = table if table is not None else ProcessTable()
        self._events = None  # type: Any
        nvml.nvmlInit()
        self._open = True
        try:
            count = nvml.nvmlDeviceGetCount()
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except self._err:
            self.close()
            raise
        self._names = []  # type: List[str]
        self._uuids = []  # type: List[str]
        self._judge = gpuhealth.HealthJudge()
        self._gpu_lost = getattr(nvml, "NVML_ERROR_GPU_IS_LOST", 15)
        self._lost_now = set()  # type: set  # GPUs whose queries said "GPU is lost" this sample
        self._slow_at = 0.0  # when the slow health reads (retired pages, row remapping) were last made
        self._slow = {}  # type: Dict[int, Tuple[Optional[bool], Optional[bool], Optional[bool]]]
        self._events = self._xid_events()
        for i, h in enumerate(self._handles):
            name = self._q(i, "name", nvml.nvmlDeviceGetName, h)
            uuid = self._q(i, "uuid", nvml.nvmlDeviceGetUUID, h)
            self._names.append(_text(name) if name is not None else "unknown")
            self._uuids.append(_text(uuid) if uuid is not None else "GPU-index-%d" % i)

    @property
    def count(self) -> int:
        return len(self._handles)

    def _q(self, i: int, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """One NVML query; an NVMLError gives None for this field only."""
        if (i, what) in self._unsupported:
            return None
        try:
            return fn(*args)
        except self._err as e:
            value = getattr(e, "value", None)
            if value == self._not_supported:
                self._unsupported.add((i, what))
            elif value == self._gpu_lost:
                self._lost_now.add(i)
            return None

    def _xid_events(self) -> Any:
        """An NVML event set that hears every GPU's critical XID errors, or None where this NVML
        (or every GPU) offers none: health then rests on the counters alone."""
        nvml = self._nvml
        create = getattr(nvml, "nvmlEventSetCreate", None)
        kind = getattr(nvml, "nvmlEventTypeXidCriticalError", None)
        if create is None or kind is None:
            return None
        try:
            events = create()
        except self._err:
            return None
        heard = 0
        for h in self._handles:
            try:
                nvml.nvmlDeviceRegisterEvents(h, kind, events)
                heard += 1
            except self._err:
                pass  # this GPU cannot report XIDs (NOT_SUPPORTED): its counters still count
        if heard:
            return events
        self._free_events(events)
        return None

    def _free_events(self, events: Any) -> None:
        try:
            self._nvml.nvmlEventSetFree(events)
        except (self._err, AttributeError):
            pass

    def _xids(self) -> Dict[int, List[int]]:
        """The XID errors NVML queued since the last sample, per GPU index (no wait)."""
        out = {}  # type: Dict[int, List[int]]
        if self._events is None:
            return out
        nvml = self._nvml
        for _ in range(256):  # a storm of events must not hold the sample up
            try:
                data = nvml.nvmlEventSetWait_v2(self._events, 0)
            except self._err as e:
                if getattr(e, "value", None) == self._gpu_lost:
                    self._lost_now.update(range(len(self._handles)))
                break  # TIMEOUT: nothing more queued
            try:
                i = int(nvml.nvmlDeviceGetIndex(data.device))
            except self._err:
                continue
            out.setdefault(i, []).append(int(data.eventData))
        return out

    def _throttle(self, i: int, h: Any) -> List[str]:
        nvml = self._nvml
        fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
        mask = self._q(i, "throttle", fn, h) if fn is not None else None
        return gpuhealth.throttle_text(int(mask)) if mask is not None else []

    def _slow_reads(self, mono: float) -> None:
        """Retired pages and row remapping change rarely and cost more: read every 5 s."""
        if self._slow and mono - self._slow_at < 5.0:
            return
        self._slow_at = mono
        nvml = self._nvml
        enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
        for i, h in enumerate(self._handles):
            pending = self._q(i, "retired", getattr(nvml, "nvmlDeviceGetRetiredPagesPendingStatus", _absent), h)
            rows = self._q(i, "remap", getattr(nvml, "nvmlDeviceGetRemappedRows", _absent), h)
            remap_pending = bool(rows[2]) if rows is not None else None
            remap_failed = bool(rows[3]) if rows is not None else None
            self._slow[i] = (pending == enabled if pending is not None else None, remap_pending, remap_failed)

    def _health(self, i: int, h: Any, ecc: Any, xids: List[int]) -> Tuple[str, Optional[str]]:
        retired, remap_pending, remap_failed = self._slow.get(i, (None, None, None))
        seen = gpuhealth.Observation(
            xids=xids, ecc_uncorrected=int(ecc) if ecc is not None else None, retired_pending=retired,
            remap_pending=remap_pending, remap_failed=remap_failed, lost=i in self._lost_now,
            throttle=self._throttle(i, h))
        return self._judge.judge(i, seen)

    def clear_health(self, index: Optional[int] = None) -> List[int]:
        return self._judge.clear(index)

    def _memory(self, i: int, h: Any) -> Tuple[Optional[int], Optional[int], Optional[int]]:
        """(used, total, reserved) MB as nvidia-smi shows them: NVML's memory info v2, whose used
        leaves out what the driver reserves (the first version counts it as used: some 480 MB of
        an idle H100). Where v2 is missing (an old driver or pynvml), the first version, and
        reserved unknown."""
        nvml = self._nvml
        v2 = getattr(nvml, "nvmlMemory_v2", None)
        if v2 is not None and (i, "memory_v2") not in self._unsupported:
            try:
                m = nvml.nvmlDeviceGetMemoryInfo(h, version=v2)
                return int(m.used // MB), int(m.total // MB), int(m.reserved // MB)
            except TypeError:  # a pynvml whose call takes no version
                self._unsupported.add((i, "memory_v2"))
            except self._err as e:
                if getattr(e, "value", None) in (self._not_supported, self._no_function):
                    self._unsupported.add((i, "memory_v2"))
                elif getattr(e, "value", None) == self._gpu_lost:
                    self._lost_now.add(i)
        m = self._q(i, "memory", nvml.nvmlDeviceGetMemoryInfo, h)
        if m is None:
            return None, None, None
        return int(m.used // MB), int(m.total // MB), None

    def _processes(self, i: int, h: Any) -> Dict[int, Optional[int]]:
        nvml = self._nvml
        used = {}  # type: Dict[int, Optional[int]]
        for what, fn in (
            ("compute", nvml.nvmlDeviceGetComputeRunningProcesses),
            ("graphics", nvml.nvmlDeviceGetGraphicsRunningProcesses),
        ):
            for proc in self._q(i, what, fn, h) or []:
                mem = getattr(proc, "usedGpuMemory", None)
                mb = int(mem // MB) if isinstance(mem, int) else None
                pid = int(proc.pid)
                if used.get(pid) is None or (mb is not None and mb > (used[pid] or 0)):
                    used[pid] = mb
        return used

    def sample(self, mono: float) -> List[GpuSample]:
        nvml = self._nvml
        q = self._q
        table = self._table
        out = []
        all_pids = set()  # type: set
        self._lost_now = set()
        xids = self._xids()
        self._slow_reads(mono)
        for i, h in enumerate(self._handles):
            util = q(i, "util", nvml.nvmlDeviceGetUtilizationRates, h)
            temp = q(i, "temp", nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
            power = q(i, "power", nvml.nvmlDeviceGetPowerUsage, h)
            limit = q(i, "limit", nvml.nvmlDeviceGetEnforcedPowerLimit, h)
            clock = q(i, "clock", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM)
            ecc = q(
                i,
                "ecc",
                nvml.nvmlDeviceGetTotalEccErrors,
                h,
                nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nvml.NVML_VOLATILE_ECC,
            )
            procs = _gpu_processes(table, self._processes(i, h), all_pids)
            used, total, reserved = self._memory(i, h)
            out.append(
                GpuSample(
                    index=i,
                    name=self._names[i],
                    uuid=self._uuids[i],
                    simulated=False,
                    utilization_pct=float(util.gpu) if util is not None else None,
                    memory_used_mb=used,
                    memory_total_mb=total,
                    temperature_c=float(temp) if temp is not None else None,
                    power_w=round(power / 1000.0, 2) if power is not None else None,
                    power_limit_w=round(limit / 1000.0, 2) if limit is not None else None,
                    sm_clock_mhz=int(clock) if clock is not None else None,
                    ecc_volatile_errors=int(ecc) if ecc is not None else None,
                    processes=procs,
                    memory_reserved_mb=reserved,
                )
            )
            out[-1].health, out[-1].health_reason = self._health(i, h, ecc, xids.get(i, []))
        table.retain(all_pids)
        return out

    def set_interval(self, seconds: float) -> None:
        pass

    def close(self) -> None:
        self._table.close()
        if self._events is not None:
            self._free_events(self._events)
            self._events = None
        if self._open:
            self._open = False
            try:
                self._nvml.nvmlShutdown()
            except self._err:
                pass  # nothing left to release


def _smi_number(text: str) -> Optional[float]:
    """A numeric nvidia-smi field; '[N/A]', '[Not Supported]', 'N/A', 'ERR!' and such give None."""
    t = text.strip()
    if not t or t.startswith("["):
        return None
    try:
        v = float(t.split()[0])  # tolerate a unit left in ('512.34 W')
    except ValueError:
        return None
    if v != v or v in (float("inf"), float("-inf")):
        return None
    return v


def _smi_int(text: str) -> Optional[int]:
    v = _smi_number(text)
    return int(v) if v is not None else None


def parse_nvidia_smi_row(line: str, reserved: bool = False) -> Optional[GpuSample]:
    """One line of ``nvidia-smi --query-gpu=NVIDIA_SMI_QUERY --format=csv,noheader,nounits``
    (``reserved``: with ``,NVIDIA_SMI_RESERVED`` after it).

    None for anything that is not a GPU row (a header, an error message, a blank line).
    """
    parts = [p.strip() for p in line.strip().split(",")]
    extra = 1 if reserved else 0
    if len(parts) < 11 + extra:
        return None
    try:
        index = int(parts[0])
    except ValueError:
        return None
    n = len(parts) - extra
    nums = parts[n - 8 : n]
    return GpuSample(
        index=index,
        name=", ".join(parts[1 : n - 9]),  # a name with a comma in it spreads over several parts
        uuid=parts[n - 9],
        simulated=False,
        utilization_pct=_smi_number(nums[0]),
        memory_used_mb=_smi_int(nums[1]),
        memory_total_mb=_smi_int(nums[2]),
        temperature_c=_smi_number(nums[3]),
        power_w=_smi_number(nums[4]),
        power_limit_w=_smi_number(nums[5]),
        sm_clock_mhz=_smi_int(nums[6]),
        ecc_volatile_errors=_smi_int(nums[7]),
        processes=[],
        memory_reserved_mb=_smi_int(parts[n]) if reserved else None,
    )


def parse_compute_app_row(line: str) -> Optional[Tuple[str, int, Optional[int]]]:
    """(GPU uuid, pid, MB used) from one line of ``nvidia-smi --query-compute-apps=
    NVIDIA_SMI_APPS_QUERY --format=csv,noheader,nounits``; None for anything else ('No running
    processes found', a blank line)."""
    parts = [p.strip() for p in line.strip().split(",")]
    if len(parts) != 3 or not parts[0].startswith(("GPU-", "MIG-")):
        return None
    try:
        pid = int(parts[1])
    except ValueError:
        return None
    return parts[0], pid, _smi_int(parts[2])


class _SmiChild:
    """One long-running ``nvidia-smi ... -lms N``; a daemon thread hands each line it prints to
    ``on_line(child, text)``."""

    def __init__(self, argv: Callable[[], List[str]], on_line: Callable[[Any, str], None],
                 name: str) -> None:
        self._argv = argv
        self._on_line = on_line
        self._name = name
        self.lock = threading.Lock()
        self.proc = None  # type: Optional[subprocess.Popen]
        self.started = float("-inf")
        self._threads = []  # type: List[threading.Thread]
        self.spawned = 0

    def start(self) -> None:
        # Its own process group, so stopping it also stops anything it started.
        proc = subprocess.Popen(
            self._argv(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.spawned += 1
        with self.lock:
            self.proc = proc
            self.started = time.monotonic()
        t = threading.Thread(target=self._reader, args=(proc,), name=self._name, daemon=True)
        t.start()
        self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _reader(self, proc: subprocess.Popen) -> None:
        stdout = proc.stdout
        assert stdout is not None
        try:
            for raw in stdout:
                if proc is not self.proc:
                    return  # replaced by a newer child
                self._on_line(proc, raw.decode("utf-8", "replace"))
        except (OSError, ValueError):
            return  # a broken pipe: the child is gone either way
        finally:
            stdout.close()  # only this thread touches the pipe: closing it elsewhere would block

    def dead(self) -> bool:
        proc = self.proc
        return proc is None or proc.poll() is not None

    def stop(self) -> None:
        with self.lock:
            proc, self.proc = self.proc, None
        if proc is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)  # the group we made for it in start
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.wait(timeout=2.0)
                break
            except subprocess.TimeoutExpired:
                continue

    def join(self) -> None:
        for t in self._threads:
            t.join(timeout=2.0)


class _NvidiaSmiStream:
    """Two long-running nvidia-smi children: the GPU rows (``--query-gpu``) and the processes on
    them (``--query-compute-apps``), each read by a daemon thread that keeps the latest rows.

    A tick's process rows come out together; a row arriving more than half an interval after the
    one before starts the next tick's list. No process row for 1.5 intervals (+0.5 s) means no
    processes: nvidia-smi prints nothing for a GPU nobody uses.
    """

    source = "nvidia-smi"
    RESTART_MIN_S = 10.0  # a dying child is restarted at most this often
    STARTUP_WAIT_S = 3.0

    def __init__(self, executable: str, interval: float,
                 table: Optional[ProcessTable] = None) -> None:
        self._exe = executable
        self._interval = _clamp_interval(interval)
        self._lock = threading.Lock()
        self._rows = {}  # type: Dict[int, Tuple[float, GpuSample]]
        self._apps = []  # type: List[Tuple[str, int, Optional[int]]]
        self._apps_at = float("-inf")  # when the last process row came
        self._reserved = True  # ask memory.reserved until this nvidia-smi refuses it
        self._got_row = threading.Event()
        self._closed = False
        self._table = table if table is not None else ProcessTable()
        self._gpu = _SmiChild(self._gpu_argv, self._on_gpu_line, "rigdeck-nvidia-smi")
        self._procs = _SmiChild(self._apps_argv, self._on_app_line, "rigdeck-nvidia-smi-apps")
        self._gpu.start()
        self._wait_first_rows()
        if not self._got_row.is_set() and self._gpu.dead():
            self._reserved = False  # a driver without memory.reserved: the plain query
            self._gpu.stop()
            self._gpu.start()
            self._wait_first_rows()
        self._procs.start()

    @property
    def spawned(self) -> int:
        return self._gpu.spawned + self._procs.spawned

    @property
    def _proc(self) -> Optional[subprocess.Popen]:
        return self._gpu.proc

    def _loop_args(self) -> List[str]:
        return ["--format=csv,noheader,nounits", "-lms", str(int(round(self._interval * 1000)))]

    def _gpu_argv(self) -> List[str]:
        query = NVIDIA_SMI_QUERY + ("," + NVIDIA_SMI_RESERVED if self._reserved else "")
        return [self._exe, "--query-gpu=" + query] + self._loop_args()

    def _apps_argv(self) -> List[str]:
        return [self._exe, "--query-compute-apps=" + NVIDIA_SMI_APPS_QUERY] + self._loop_args()

    def _on_gpu_line(self, proc: Any, text: str) -> None:
        row = parse_nvidia_smi_row(text, self._reserved)
        if row is None:
            return
        with self._lock:
            self._rows[row.index] = (time.monotonic(), row)
        self._got_row.set()

    def _on_app_line(self, proc: Any, text: str) -> None:
        row = parse_compute_app_row(text)
        if row is None:
            return
        now = time.monotonic()
        with self._lock:
            if now - self._apps_at > 0.5 * self._interval:
                self._apps = []  # a new tick: a new list, never the one a sample holds
            self._apps.append(row)
            self._apps_at = now

    def _wait_first_rows(self) -> None:
        deadline = time.monotonic() + self.STARTUP_WAIT_S
        while not self._got_row.wait(0.02):
            if time.monotonic() > deadline or self._gpu.dead():
                return
        time.sleep(0.05)  # one query's rows arrive together: let the rest of the first batch in

    @property
    def produced_rows(self) -> bool:
        return self._got_row.is_set()

    def _stale_after(self) -> float:
        return max(5.0 * self._interval, 10.0)

    def _check(self, child: _SmiChild, newest: float, mono: float) -> None:
        """Restart a child that died or went quiet (at most every RESTART_MIN_S)."""
        if self._closed or mono - child.started < self.RESTART_MIN_S:
            return
        if child.dead() or mono - max(newest, child.started) > self._stale_after():
            child.stop()
            if not self._closed:
                child.start()

    def _processes_now(self, mono: float) -> Dict[str, Dict[int, Optional[int]]]:
        with self._lock:
            apps, at = self._apps, self._apps_at
        by_uuid = {}  # type: Dict[str, Dict[int, Optional[int]]]
        if mono - at <= 1.5 * self._interval + 0.5:
            for uuid, pid, mb in apps:
                by_uuid.setdefault(uuid, {})[pid] = mb
        return by_uuid

    def sample(self, mono: float) -> List[GpuSample]:
        with self._lock:
            rows = list(self._rows.items())
        newest = max((t for _, (t, _) in rows), default=float("-inf"))
        self._check(self._gpu, newest, mono)
        if self._procs.dead():  # a quiet apps child is normal (no processes): only a dead one
            self._check(self._procs, mono, mono)
        stale = self._stale_after()
        by_uuid = self._processes_now(mono)
        all_pids = set()  # type: set
        out = []
        for _, (t, r) in sorted(rows):
            if mono - t <= stale:
                # Copies: the reader keeps these objects, the caller may change what it gets.
                procs = _gpu_processes(self._table, by_uuid.get(r.uuid, {}), all_pids)
                out.append(replace(r, processes=procs))
        self._table.retain(all_pids)
        return out

    def set_interval(self, seconds: float) -> None:
        seconds = _clamp_interval(seconds)
        if seconds == self._interval:
            return
        self._interval = seconds
        for child in (self._gpu, self._procs):
            child.stop()
            if not self._closed:
                child.start()

    def close(self) -> None:
        self._closed = True
        for child in (self._gpu, self._procs):
            child.stop()
        for child in (self._gpu, self._procs):
            child.join()
        self._table.close()


# ---------------------------------------------------------------------------------------------
# The collector
# ---------------------------------------------------------------------------------------------


class Collector:
    """One sample of this host per call; the daemon calls ``sample()`` once per tick."""

    def __init__(
        self,
        sim_gpus: int = 0,
        interval: float = 1.0,
        hostname: Optional[str] = None,
        backend: Optional[str] = None,
        nvml_module: Any = None,
        use_psutil: Optional[bool] = None,
        faults_path: Optional[str] = None,
    ) -> None:
        """``backend`` forces one GPU source ('nvml', 'nvidia-smi', 'simulated', 'none') and raises
        TelemetryError where it cannot start; None tries NVML, nvidia-smi, then simulated GPUs
        (if ``sim_gpus`` > 0), then none. ``nvml_module`` replaces pynvml; ``use_psutil``
        False forces /proc, True requires psutil, None reads /proc where there is one (cheaper)
        and psutil, when importable, where there is none. ``faults_path``: the
        simulated GPUs' faults file (agent/gpuhealth.py)."""
        if backend is not None and backend not in BACKENDS:
            raise ValueError("backend must be one of %s or None, not %r" % (BACKENDS, backend))
        self.hostname = hostname or socket.gethostname()
        self.interval = _clamp_interval(interval)
        self.notes = []  # type: List[str]  # why sources were passed over, for the daemon's log
        self._lock = threading.Lock()
        self._seq = 0
        self._closed = False
        self._host = _HostSampler(use_psutil)
        self._faults_path = faults_path
        self._gpus = self._open_gpus(backend, max(0, int(sim_gpus)), nvml_module)
        self.gpu_source = self._gpus.source  # type: str

    @property
    def uses_psutil(self) -> bool:
        return self._host.uses_psutil

    def _open_gpus(self, backend: Optional[str], sim_gpus: int, nvml_module: Any) -> Any:
        forced = backend is not None
        if backend in (None, "nvml"):
            nvml = nvml_module
            if nvml is None:
                try:
                    import pynvml  # type: ignore  # shipped by nvidia-ml-py

                    nvml = pynvml
                except ImportError:
                    self.notes.append("nvml: nvidia-ml-py (pynvml) is not installed")
            if nvml is not None:
                try:
                    gpus = _NvmlGpus(nvml)
                except nvml.NVMLError as e:
                    self.notes.append("nvml: %s" % e)
                else:
                    if gpus.count or forced:
                        return gpus
                    gpus.close()
                    self.notes.append("nvml: no GPUs")
            if forced:
                raise TelemetryError("NVML requested, unavailable: " + "; ".join(self.notes))
        if backend in (None, "nvidia-smi"):
            exe = shutil.which("nvidia-smi")
            if exe is None:
                self.notes.append("nvidia-smi: not on PATH")
            else:
                try:
                    stream = _NvidiaSmiStream(exe, self.interval)
                except OSError as e:
                    self.notes.append("nvidia-smi: %s" % e)
                else:
                    proc = stream._proc
                    exited = proc is None or proc.poll() is not None
                    if forced or stream.produced_rows or not exited:
                        return stream
                    stream.close()
                    self.notes.append("nvidia-smi: exited without printing a GPU row")
            if forced:
                raise TelemetryError("nvidia-smi requested, unavailable: " + "; ".join(self.notes))
        if backend == "simulated" or (backend is None and sim_gpus > 0):
            return _SimulatedGpus(sim_gpus, self.hostname, faults_path=self._faults_path)
        return _NoGpus()

    def sample(self) -> Sample:
        """Host and GPU metrics now; rates and CPU percentages cover the time since the last one."""
        t0 = time.perf_counter()
        now = time.time()
        with self._lock:
            if self._closed:
                raise TelemetryError("sample() on a closed Collector")
            mono = time.monotonic()
            host = self._host.sample(mono)
            gpus = self._gpus.sample(mono)
            self._seq += 1
            seq = self._seq
        source = self.gpu_source
        return Sample(
            seq=seq,
            time=now,
            hostname=self.hostname,
            gpu_source=source,
            simulated=source == "simulated",
            host=host,
            gpus=gpus,
            cost_s=round(time.perf_counter() - t0, 6),
        )

    def clear_health(self, index: Optional[int] = None) -> List[int]:
        """Forget remembered GPU faults (one GPU's, or all): the GPUs that had one."""
        with self._lock:
            clear = getattr(self._gpus, "clear_health", None)
            return clear(index) if clear is not None else []

    def set_interval(self, seconds: float) -> None:
        """Clamp to [0.1, 60] s; the nvidia-smi stream restarts with the new period."""
        with self._lock:
            self.interval = _clamp_interval(seconds)
            if not self._closed:
                self._gpus.set_interval(self.interval)

    def close(self) -> None:
        """Stop the nvidia-smi child or shut NVML down. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._gpus.close()

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m agent.telemetry``: print a few samples as JSON lines (a check by hand)."""
    parser = argparse.ArgumentParser(prog="agent.telemetry", description=main.__doc__)
    sim = _int_or_none(os.environ.get("RIGDECK_SIM_GPUS")) or 0
    parser.add_argument("--sim-gpus", type=int, default=sim)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--count", type=int, default=2)
    parser.add_argument("--backend", choices=BACKENDS, default=None)
    args = parser.parse_args(argv)
    with Collector(sim_gpus=args.sim_gpus, interval=args.interval, backend=args.backend) as c:
        for k in range(max(1, args.count)):
            if k:
                time.sleep(c.interval)
            sys.stdout.write(json.dumps(sample_to_dict(c.sample()), sort_keys=True) + "\n")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
