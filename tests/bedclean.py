"""What a test left on a shared test bed, and taking it away.

Tests that share a bed (the session's ``testbed``, a module's ``served`` or ``bed``) must each
begin where the first began: no process of any job alive on a host, no GPU claim held, every
link up, no rate limit and no firewall rule left, and no agent daemon without the host's
simulated GPUs. ``leftovers`` reads that from this machine's
side (every bed host's processes are visible from the root PID namespace, and its claims through
``/proc/<init>/root``), so it costs a scan of ``/proc`` and a few ``ip``/``tc`` calls, not a round
trip over SSH. ``clean`` takes away what it found: the processes killed (the kernel then frees
their claims), links up, qdiscs and firewall rules removed.

conftest.py runs both around every test that uses a shared bed: what a test leaves is taken away
and named in that test's own failure, never in the next one's.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from tests.testbed import TestBed, TestHost

CLAIMS = "dev/shm/rigdeck-gpu-claims"  # agent/claims.py DEFAULT_DIR, under the host's root
JOB_TAG = b"RIGDECK_JOB_ID="
SIM_TAG = b"RIGDECK_SIM_GPU="
SIM_COUNT = b"RIGDECK_SIM_GPUS="


def _ns(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _bed_processes(hosts: list[TestHost]) -> Iterator[tuple[str, TestHost, list[bytes]]]:
    """(pid, its host, its environment's entries) of every process on ``hosts`` (found by PID
    namespace) whose environment can be read."""
    by_ns = {_ns(h.init_pid): h for h in hosts if h.init_pid}
    by_ns.pop(None, None)
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        host = by_ns.get(_ns(pid))
        if host is None:
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        yield pid, host, env


def job_processes(bed: TestBed) -> dict[str, list[tuple[int, str, str]]]:
    """host name -> [(pid as this machine sees it, job id, command line)] of every process on
    that host that belongs to a job (carrying a job's tag, or a job host, which carries none), or
    that loads a simulated GPU (``RIGDECK_SIM_GPU``: a test's stand-in for a GPU process)."""
    out: dict[str, list[tuple[int, str, str]]] = {}
    for pid, host, env in _bed_processes(bed.hosts):
        tag = next((v[len(JOB_TAG):].decode(errors="replace") for v in env if v.startswith(JOB_TAG)), None)
        if tag is None and any(v.startswith(SIM_TAG) for v in env):
            tag = "(a simulated GPU's load)"  # a test's CPU burner standing for a GPU process
        cmd = _cmdline(pid)
        argv = cmd.split()
        if tag is None and "jobhost" in argv and "--job-dir" in argv:  # the agent's job host
            i = argv.index("--job-dir") + 1
            tag = argv[i].rstrip("/").rsplit("/", 1)[-1] if i < len(argv) else "(a job host)"
        if tag is not None:
            out.setdefault(host.name, []).append((int(pid), tag, cmd[:160]))
    return out


def misconfigured_daemons(bed: TestBed) -> dict[str, list[tuple[int, str]]]:
    """host name -> [(pid, what is wrong)] for every agent daemon on the bed that does not show
    the host's simulated GPUs. A daemon lives on after the test that started it and serves every
    later controller; one started without ``RIGDECK_SIM_GPUS`` (an inventory written without the
    bed's ``sim_gpus``, as onboarding writes) leaves the host with no GPUs for the rest of the run."""
    out: dict[str, list[tuple[int, str]]] = {}
    for pid, host, env in _bed_processes([h for h in bed.hosts if h.sim_gpus > 0]):
        argv = _cmdline(pid).split()
        if "daemon" not in argv or "--state-dir" not in argv:
            continue
        want = SIM_COUNT + str(host.sim_gpus).encode()
        if want not in env:
            got = next((v.decode(errors="replace") for v in env if v.startswith(SIM_COUNT)), "no RIGDECK_SIM_GPUS")
            out.setdefault(host.name, []).append((int(pid), f"{got}, not {host.sim_gpus} simulated GPUs"))
    return out


def stop_misconfigured_daemons(bed: TestBed) -> None:
    """Stop the daemons ``misconfigured_daemons`` names (the next controller starts a right one)."""
    for found in misconfigured_daemons(bed).values():
        for pid, _ in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def claims_held(host: TestHost) -> dict[int, str]:
    """GPU -> its holder's job, for every GPU claim held on ``host`` right now."""
    if not host.init_pid:
        return {}
    d = Path(f"/proc/{host.init_pid}/root") / CLAIMS
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return {}
    out: dict[int, str] = {}
    for name in names:
        if not (name.startswith("gpu-") and name.endswith(".lock") and name[4:-5].isdigit()):
            continue
        try:
            fd = os.open(d / name, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
                continue  # free
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    continue
            try:
                holder = json.loads(os.pread(fd, 4096, 0).decode(errors="replace").strip() or "{}")
            except ValueError:
                holder = {}
            out[int(name[4:-5])] = str(holder.get("job_id") or "an unknown holder")
        finally:
            os.close(fd)
    return out


def _out(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _links(bed: TestBed, host: TestHost) -> list[str]:
    """What is off about a host's link: down, a qdisc (rate limit) on either end, a firewall rule."""
    said = []
    if "state DOWN" in _out(["ip", "-n", host.netns, "link", "show", "eth0"]) or \
            ",UP" not in _out(["ip", "-n", host.netns, "link", "show", "eth0"]):
        said.append("eth0 is down")
    for where, argv in (("eth0", ["tc", "-n", host.netns, "qdisc", "show", "dev", "eth0", "root"]),
                        (host.veth, ["tc", "qdisc", "show", "dev", host.veth, "root"])):
        q = _out(argv).strip()
        if q and not q.startswith(("qdisc noqueue", "qdisc pfifo_fast", "qdisc fq_codel")):
            said.append(f"qdisc on {where}: {q.splitlines()[0]}")
    rules = [ln for ln in _out(["ip", "netns", "exec", host.netns, "iptables", "-S"]).splitlines()
             if ln.startswith("-A ")]
    if rules:
        said.append(f"iptables: {'; '.join(rules)}")
    return said


def leftovers(bed: TestBed) -> list[str]:
    """Every leftover on the bed's hosts, one line each (empty: the bed is clean)."""
    lines = []
    procs = job_processes(bed)
    daemons = misconfigured_daemons(bed)
    for host in bed.hosts:
        for pid, job, cmd in procs.get(host.name, []):
            lines.append(f"{host.name}: process {pid} of job {job}: {cmd}")
        for pid, why in daemons.get(host.name, []):
            lines.append(f"{host.name}: agent daemon {pid} with {why}")
        for gpu, job in sorted(claims_held(host).items()):
            lines.append(f"{host.name}: GPU {gpu} claimed by job {job}")
        lines += [f"{host.name}: {what}" for what in _links(bed, host)]
        faults = host.state_dir / "sim-gpu-faults.json"
        if faults.exists() and faults.read_text().strip() not in ("", "{}"):
            lines.append(f"{host.name}: simulated GPU faults left: {faults.read_text().strip()[:200]}")
        held = host.state_dir / "gpu-held-out.json"  # agent/gpuhealth.py: GPUs a job host moved ranks off
        if held.exists() and held.read_text().strip() not in ("", "{}"):
            lines.append(f"{host.name}: GPUs held out by a job host: {held.read_text().strip()[:200]}")
    return lines


def clean(bed: TestBed, timeout: float = 15.0) -> list[str]:
    """Take away what ``leftovers`` finds; returns what is still there after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        for host in bed.hosts:
            _out(["ip", "-n", host.netns, "link", "set", "eth0", "up"])
            _out(["tc", "-n", host.netns, "qdisc", "del", "dev", "eth0", "root"])
            _out(["tc", "qdisc", "del", "dev", host.veth, "root"])
            _out(["ip", "netns", "exec", host.netns, "iptables", "-F"])
            (host.state_dir / "sim-gpu-faults.json").unlink(missing_ok=True)
            (host.state_dir / "gpu-held-out.json").unlink(missing_ok=True)
        for procs in job_processes(bed).values():
            for pid, _, _ in procs:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        stop_misconfigured_daemons(bed)
        time.sleep(0.3)
        left = leftovers(bed)
        if not left or time.monotonic() >= deadline:
            return left


def settled(bed: TestBed, timeout: float) -> list[str]:
    """The bed's leftovers once it has had up to ``timeout`` to settle (a job a test stopped just
    now may still be ending on its hosts): empty as soon as it is clean."""
    deadline = time.monotonic() + timeout
    while True:
        left = leftovers(bed)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.5)


def stop_daemons_under(root: Path) -> list[int]:
    """Kill every agent daemon of this machine whose state dir is under ``root`` (a test's own
    HOME or tmp dir: the app's local one-host cluster starts one there, and it outlives the
    test). Returns their pids."""
    killed = []
    prefix = str(root.resolve())
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        argv = _cmdline(pid).split()
        if "daemon" in argv and "--state-dir" in argv:
            i = argv.index("--state-dir") + 1
            if i < len(argv) and (argv[i] == prefix or argv[i].startswith(prefix + "/")):
                try:
                    os.kill(int(pid), signal.SIGKILL)
                    killed.append(int(pid))
                except OSError:
                    pass
    return killed
