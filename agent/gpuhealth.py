"""Whether each GPU of this host is fit to run on: judged here, on the host, every sample.

A GPU can fail while every process on it stays alive: an XID error that needs a reset, memory
that returns uncorrectable errors, a card fallen off the bus. What NVML says about each GPU (or,
for the simulated GPUs of the test bed, what ``<state_dir>/sim-gpu-faults.json`` says) becomes
one ``health`` (``ok`` | ``warn`` | ``unhealthy``) and a ``health_reason`` a person can act on.
``drained`` is the controller's word, laid over this one; the agent never says it.

Stdlib only, Python 3.9+.
"""
from __future__ import annotations

import json
import os

TYPE_CHECKING = False  # (mypy reads it as True) typing is not imported by a rank's or job's start
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

OK = "ok"
WARN = "warn"
UNHEALTHY = "unhealthy"
DRAINED = "drained"  # set by the controller: an operator or rigdeck took the GPU out of placement
HEALTH_STATES = (OK, WARN, UNHEALTHY, DRAINED)

SIM_FAULTS_FILE = "sim-gpu-faults.json"

# The XIDs NVIDIA's "XID Errors" catalog (docs.nvidia.com/deploy/xid-errors) lists as needing an
# operator's action (reset the GPU, drain the node or replace the board), not an application bug.
CRITICAL_XIDS = {
    48: "double-bit ECC error",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}

# Clock-event reasons (NVML bit masks) that mean the hardware is slowing the GPU down: the job
# still runs, slower; a warning for the operator, not a reason to move the job.
THROTTLE_BITS = {
    0x8: "hardware slowdown",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
}
THROTTLE_NAMES = {
    "hw_slowdown": "hardware slowdown",
    "sw_thermal": "software thermal slowdown",
    "hw_thermal": "hardware thermal slowdown",
    "hw_power_brake": "hardware power brake",
}


def xid_text(xid: int) -> str:
    what = CRITICAL_XIDS.get(xid)
    return "XID %d: %s" % (xid, what) if what else "XID %d" % xid


def throttle_text(mask: int) -> List[str]:
    return [name for bit, name in sorted(THROTTLE_BITS.items()) if mask & bit]


class Observation:
    """What was read about one GPU in one sample. None: not known (unsupported, or not read)."""

    __slots__ = ("xids", "ecc_uncorrected", "retired_pending", "remap_pending", "remap_failed", "lost",
                 "throttle")

    def __init__(self, xids: Optional[List[int]] = None, ecc_uncorrected: Optional[int] = None,
                 retired_pending: Optional[bool] = None, remap_pending: Optional[bool] = None,
                 remap_failed: Optional[bool] = None, lost: bool = False,
                 throttle: Optional[List[str]] = None) -> None:
        self.xids = list(xids or [])
        self.ecc_uncorrected = ecc_uncorrected
        self.retired_pending = retired_pending
        self.remap_pending = remap_pending
        self.remap_failed = remap_failed
        self.lost = lost
        self.throttle = list(throttle or [])


class HealthJudge:
    """Turns each GPU's observations into ``(health, reason)``.

    A real fault is remembered (``sticky``): an XID is an event seen once, and a GPU that lost
    memory rows stays suspect after the count stops rising, until an operator clears it
    (``clear``, on undrain). The simulated GPUs' faults file describes the fault as it stands, so
    a judge made with ``sticky=False`` forgets a fault when its entry is removed."""

    def __init__(self, sticky: bool = True) -> None:
        self.sticky = sticky
        self._ecc_base = {}  # type: Dict[int, int]  # the uncorrected count first seen (volatile)
        self._remembered = {}  # type: Dict[int, str]  # GPU -> the fault that made it unhealthy

    def clear(self, index: Optional[int] = None) -> List[int]:
        """Forget remembered faults (of one GPU, or all); the next sample judges afresh. The
        ECC baseline moves to the count then, so errors already counted are not faults again."""
        gone = [i for i in self._remembered if index is None or i == index]
        for i in gone:
            del self._remembered[i]
        for i in list(self._ecc_base):
            if index is None or i == index:
                del self._ecc_base[i]
        return sorted(gone)

    def judge(self, index: int, seen: Observation) -> Tuple[str, Optional[str]]:
        fault = self._fault(index, seen)
        if fault is not None:
            if self.sticky:
                self._remembered.setdefault(index, fault)
            return UNHEALTHY, fault
        if index in self._remembered:
            return UNHEALTHY, self._remembered[index]
        warnings = ["%s (not one NVIDIA lists as needing a reset)" % xid_text(x) for x in seen.xids]
        if seen.throttle:
            warnings.append("throttled: " + ", ".join(seen.throttle))
        if warnings:
            return WARN, "; ".join(warnings)
        return OK, None

    def _fault(self, index: int, seen: Observation) -> Optional[str]:
        if seen.lost:
            return "GPU is lost (NVML cannot reach it)"
        for x in seen.xids:
            if x in CRITICAL_XIDS:
                return xid_text(x)
        if seen.ecc_uncorrected is not None:
            base = self._ecc_base.setdefault(index, 0 if not self.sticky else seen.ecc_uncorrected)
            if seen.ecc_uncorrected > base:
                return "ECC: %d uncorrected errors (was %d)" % (seen.ecc_uncorrected, base)
        if seen.remap_failed:
            return "row remapping failed: replace or reset the GPU"
        if seen.remap_pending:
            return "rows pending remap: the GPU needs a reset"
        if seen.retired_pending:
            return "retired pages pending: the GPU needs a reset"
        return None


def read_sim_faults(path: str) -> Dict[int, Dict[str, Any]]:
    """The simulated faults file: ``{"1": {"xid": 79}, "3": {"throttle": "hw_slowdown"}}``. A file
    that is missing, unreadable or malformed means no fault (the test bed writes it whole)."""
    return read_gpu_map(path)


def read_gpu_map(path: str) -> Dict[int, Dict[str, Any]]:
    """A JSON file of ``{"<GPU index>": {...}}``: each GPU index >= 0 with its table. Missing,
    unreadable or malformed (the file, a key, an entry) is nothing: never an error."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    out = {}  # type: Dict[int, Dict[str, Any]]
    if not isinstance(data, dict):
        return out
    for key, rec in data.items():
        try:
            i = int(key)
        except (TypeError, ValueError):
            continue
        if i >= 0 and isinstance(rec, dict):
            out[i] = rec
    return out


def sim_observation(fault: Optional[Dict[str, Any]]) -> Observation:
    """A simulated GPU's observation from its entry of the faults file (none: healthy)."""
    if not fault:
        return Observation(ecc_uncorrected=0)
    xid = fault.get("xid")
    ecc = fault.get("ecc_uncorrected")
    throttle = fault.get("throttle")
    names = throttle if isinstance(throttle, list) else [throttle] if throttle else []
    return Observation(
        xids=[int(xid)] if isinstance(xid, int) else [],
        ecc_uncorrected=int(ecc) if isinstance(ecc, int) else 0,
        retired_pending=bool(fault.get("retired_pending", False)),
        remap_pending=bool(fault.get("remap_pending", False)),
        lost=bool(fault.get("lost", False)),
        throttle=[THROTTLE_NAMES.get(str(n), str(n)) for n in names],
    )


def sim_faults_path(state_dir: Optional[str]) -> Optional[str]:
    return os.path.join(state_dir, SIM_FAULTS_FILE) if state_dir else None


NVIDIA_VENDOR = "0x10de"
DISPLAY_CLASSES = ("0x0300", "0x0302")  # VGA-compatible and 3D controllers


def pci_gpu_count(sys_root: str = "/sys") -> Optional[int]:
    """How many NVIDIA display controllers the PCI bus lists: what the host booted with. A GPU that
    fell off the bus can drop out of NVML's count while staying here. None where /sys has no PCI."""
    base = os.path.join(sys_root, "bus", "pci", "devices")
    try:
        names = os.listdir(base)
    except OSError:
        return None
    n = 0
    for name in names:
        try:
            with open(os.path.join(base, name, "vendor")) as f:
                vendor = f.read().strip()
            with open(os.path.join(base, name, "class")) as f:
                cls = f.read().strip()
        except OSError:
            continue
        if vendor == NVIDIA_VENDOR and cls[:6] in DISPLAY_CLASSES:
            n += 1
    return n


# -- a container that lost its GPUs --------------------------------------------------------------
#
# After a reload of the container runtime (or of systemd, which rewrites the devices cgroup), a
# running container can lose access to its GPU devices: inside, NVML and CUDA fail ("Failed to
# initialize NVML: Unknown Error", NVIDIA/nvidia-container-toolkit#48) while the host reaches the
# same GPUs as before. That is the container's fault, not the GPU's: draining the GPU would take
# a good card out of placement, and a restart, which makes a new container, cures it.

# What a rank prints when it cannot reach its GPU's device at all (lower-case needle, its name).
# Not the errors of a GPU that faulted under a running kernel ("unspecified launch failure",
# "an illegal memory access"): those are the GPU's, and the host's telemetry sees them too.
DEVICE_ERRORS = (
    ("failed to initialize nvml: unknown error", "NVML unknown error"),
    ("nvml: unknown error", "NVML unknown error"),
    ("nvmlerror_unknown", "NVML unknown error"),
    ("failed to initialize nvml", "NVML could not be initialized"),
    ("no cuda-capable device is detected", "no CUDA-capable device"),
    ("cudaerrornodevice", "no CUDA-capable device"),
    ("cuda_error_no_device", "no CUDA-capable device"),
    ("no cuda gpus are available", "no CUDA GPUs available"),
    ("cuda driver initialization failed", "CUDA driver initialization failed"),
    ("cuda error: unknown error", "CUDA unknown error"),
)
CONTAINER = "container"  # a cause's (and an incident's) kind: the container, not its GPUs, failed


def device_error(lines: Any) -> Optional[str]:
    """The device-access error (its short name) that ``lines`` (a rank's last lines and the
    failure's message: strings, other items ignored) show, or None."""
    if isinstance(lines, str):
        lines = [lines]
    if not isinstance(lines, (list, tuple)):
        return None
    for line in lines:
        if not isinstance(line, str):
            continue
        low = line.lower()
        for needle, name in DEVICE_ERRORS:
            if needle in low:
                return name
    return None


def container_fault(cause: Any, not_ok: Any, read: Dict[int, bool], host: str) -> Optional[Dict[str, Any]]:
    """A failed container job's ``cause`` (its job host marked ``device_error`` and ``gpus``, the
    GPUs of the failed rank here) judged against this host's own view of those GPUs: ``read``,
    the GPUs its telemetry read (index -> simulated), and ``not_ok``, those whose health is not
    ok (``{index, health, ...}``). When the host read every one of them and sees none unhealthy,
    the container lost its GPUs: the cause again, ``kind`` "container", ``gpu`` the first of them
    and a message that says so. None when the cause is no device error, when the host did not
    read one of the GPUs, or sees one failing too (then it is the GPU's fault, as any failing
    GPU's). A malformed cause is None, never an error."""
    if not isinstance(cause, dict) or not cause.get("device_error") or cause.get("kind") not in (None, CONTAINER):
        return None
    listed = cause.get("gpus")
    gpus = [g for g in listed if isinstance(g, int) and not isinstance(g, bool)] if isinstance(listed, list) else []
    bad = {g.get("index") for g in not_ok if isinstance(g, dict) and g.get("health") == UNHEALTHY
           and isinstance(g.get("index"), int)} if isinstance(not_ok, list) else set()
    if not gpus or bad & set(gpus) or any(g not in read for g in gpus):
        return None
    sim = " (simulated)" if any(read[g] for g in gpus) else ""
    which = "GPU%s %s%s" % ("s" if len(gpus) > 1 else "", ", ".join(str(g) for g in gpus), sim)
    rank = cause.get("rank")
    who = ""
    if rank is not None:
        how = ("killed by signal %s" % cause["signal"] if cause.get("signal")
               else "exited %s" % cause.get("exit_code"))
        who = " (rank %s %s)" % (rank, how)
    message = "%s: container lost its GPUs: %s inside%s, %s healthy on the host" % (
        host, cause["device_error"], who, which)
    out = dict(cause, kind=CONTAINER, message=message, gpu=gpus[0])
    if cause.get("message") and cause.get("kind") != CONTAINER:
        out["rank_message"] = cause["message"]
    return out


# -- GPUs held out on this host: a job host moved its ranks off them (agent/jobhost.py) --------

HELD_OUT_FILE = "gpu-held-out.json"  # in the agent's state dir: {"<index>": {reason, job_id, by, at}}


def read_held_out(state_dir: Optional[str]) -> Dict[int, Dict[str, Any]]:
    """The GPUs of this host that a job host took its ranks off after a fault with nobody
    watching, each with why (``{"reason", "job_id", "by", "at"}``). Anything unreadable or
    malformed is no record (nothing here may stop the daemon or a job host)."""
    if not state_dir:
        return {}
    return read_gpu_map(os.path.join(state_dir, HELD_OUT_FILE))


def _change_held_out(state_dir: str, change: Any) -> List[int]:
    """Apply ``change(records)`` (in place; returns the GPUs it changed) to the record file under
    its lock, written whole (a reader never sees half of it)."""
    import fcntl

    path = os.path.join(state_dir, HELD_OUT_FILE)
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        records = read_held_out(state_dir)
        changed = change(records)
        if changed:
            tmp = "%s.tmp-%d" % (path, os.getpid())
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({str(k): v for k, v in sorted(records.items())}, f, sort_keys=True)
            os.replace(tmp, path)
        return sorted(changed)
    finally:
        os.close(fd)  # closing drops the lock


def hold_out(state_dir: str, gpu: int, reason: str, job_id: str, by: str, now: float) -> bool:
    """Keep ``gpu`` out of every rigdeck job on this host until it is cleared (``release_held_out``,
    the daemon's ``gpu_health_clear`` on an undrain): the daemon's samples call it unhealthy with
    ``reason``, so no placement takes it and the next controller drains it. False when it was
    held out already (the first record stays)."""
    def add(records: Dict[int, Dict[str, Any]]) -> List[int]:
        if int(gpu) in records:
            return []
        records[int(gpu)] = {"reason": reason, "job_id": job_id, "by": by, "at": now}
        return [int(gpu)]

    return bool(_change_held_out(state_dir, add))


def release_held_out(state_dir: str, gpus: Optional[List[int]] = None) -> List[int]:
    """Forget the held-out records of ``gpus`` (all when None). Returns the GPUs that had one."""
    def drop(records: Dict[int, Dict[str, Any]]) -> List[int]:
        gone = [i for i in records if gpus is None or i in gpus]
        for i in gone:
            del records[i]
        return gone

    if not read_held_out(state_dir):
        return []
    return _change_held_out(state_dir, drop)


def held_out_reason(rec: Dict[str, Any]) -> str:
    """A held-out GPU's health reason in a sample: its fault, and who took the ranks off it."""
    why = str(rec.get("reason") or "a fault")
    who = str(rec.get("by") or "a job host")
    job = " (job %s)" % rec["job_id"] if rec.get("job_id") else ""
    return "%s; held out by %s%s until undrained" % (why, who, job)


def lay_held_out(gpus: List[Dict[str, Any]], held: Dict[int, Dict[str, Any]]) -> None:
    """A sample's GPUs (in place): each held-out one is unhealthy, whatever it reads as now (a
    simulated fault removed, a daemon restarted and its judge's memory gone)."""
    for g in gpus:
        try:
            rec = held.get(int(g.get("index", -1)))
        except (TypeError, ValueError):
            continue
        if rec is not None and g.get("health") != UNHEALTHY:
            g["health"], g["health_reason"] = UNHEALTHY, held_out_reason(rec)


def spare_gpus(gpus: List[Dict[str, Any]]) -> List[int]:
    """The GPUs of a sample (held-out ones laid over, claims added) that a job host may move its
    ranks to: health ok, no process on it (another person's or another job's), nobody's claim.
    Only a hint: the claim (agent/claims.py) decides who gets one."""
    out = []
    for g in gpus:
        index = g.get("index")
        if isinstance(index, bool) or not isinstance(index, int):
            continue
        if g.get("health", OK) == OK and not g.get("processes") and not g.get("claim"):
            out.append(index)
    return sorted(out)
