"""What a host is: hostname, addresses, Python, CPUs, memory, the GPUs the agent can see, and its
container runtimes and images.

Stdlib only, Python 3.9+. The controller also runs this file's source with ``python -c`` on hosts
where no agent is deployed yet, so it must stay a self-contained module with no package imports.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from typing import Any, Dict, List, Optional

NVIDIA_SMI_QUERY = "index,name,uuid,memory.total"


def _memory_total_mb() -> Optional[int]:
    try:
        import psutil  # type: ignore

        return int(psutil.virtual_memory().total // (1024 * 1024))
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


def _addresses() -> List[str]:
    """IPv4 addresses of this host's interfaces (loopback excluded)."""
    try:
        import psutil  # type: ignore

        out = []
        for addrs in psutil.net_if_addrs().values():
            for a in addrs:
                if a.family == socket.AF_INET and not a.address.startswith("127."):
                    out.append(a.address)
        return sorted(out)
    except ImportError:
        pass
    ip = shutil.which("ip")
    if not ip:
        return []
    try:
        text = subprocess.run(
            [ip, "-4", "-o", "addr", "show"], capture_output=True, text=True, timeout=5
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    out = []
    for line in text.splitlines():
        parts = line.split()
        if "inet" in parts:
            addr = parts[parts.index("inet") + 1].split("/")[0]
            if not addr.startswith("127."):
                out.append(addr)
    return sorted(out)


SYS_NET = "/sys/class/net"
IFF_LOOPBACK = 0x8


def _read_sys(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:  # EINVAL: a virtual device without a link speed
        return None


def _addresses_by_interface() -> Dict[str, List[str]]:
    """Interface name -> its IPv4 and IPv6 addresses (link-local IPv6 left out)."""
    out = {}  # type: Dict[str, List[str]]
    try:
        import psutil  # type: ignore

        for name, addrs in psutil.net_if_addrs().items():
            for a in addrs:
                if a.family in (socket.AF_INET, socket.AF_INET6) and not a.address.startswith("fe80"):
                    out.setdefault(name, []).append(a.address.split("%")[0])
        return out
    except ImportError:
        pass
    ip = shutil.which("ip")
    if not ip:
        return out
    try:
        text = subprocess.run([ip, "-o", "addr", "show"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return out
    for line in text.splitlines():
        parts = line.split()
        for fam in ("inet", "inet6"):
            if fam in parts and len(parts) > parts.index(fam) + 1 and len(parts) > 1:
                addr = parts[parts.index(fam) + 1].split("/")[0]
                if not addr.startswith("fe80"):
                    out.setdefault(parts[1].split("@")[0], []).append(addr)
    return out


def nics(sys_net: str = SYS_NET) -> List[Dict[str, Any]]:
    """This host's network interfaces but loopback: name, link speed in Mb/s (``speed`` in
    /sys/class/net; None when the kernel reports -1 or nothing, as virtual devices do) and
    addresses. What the Reduction Server sizing adds up."""
    try:
        names = sorted(os.listdir(sys_net))
    except OSError:
        return []
    addrs = _addresses_by_interface()
    out = []
    for name in names:
        flags = _read_sys(os.path.join(sys_net, name, "flags"))
        try:
            loopback = bool(int(flags, 16) & IFF_LOOPBACK) if flags else name == "lo"
        except ValueError:
            loopback = name == "lo"
        if loopback:
            continue
        raw = _read_sys(os.path.join(sys_net, name, "speed"))
        try:
            speed = int(raw) if raw is not None else None  # type: Optional[int]
        except ValueError:
            speed = None
        if speed is not None and speed <= 0:
            speed = None
        out.append({"name": name, "speed_mbps": speed, "addresses": sorted(addrs.get(name, []))})
    return out


def _gpus_nvml() -> Optional[List[Dict[str, Any]]]:
    try:
        import pynvml  # type: ignore  # shipped by nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError: no driver on this host
        return None
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            gpus.append(
                {
                    "index": i,
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                    "memory_total_mb": int(mem.total // (1024 * 1024)),
                    "simulated": False,
                }
            )
        return gpus
    finally:
        pynvml.nvmlShutdown()


def parse_nvidia_smi_inventory(text: str) -> List[Dict[str, Any]]:
    """Parse ``nvidia-smi --query-gpu=index,name,uuid,memory.total --format=csv,noheader,nounits``."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 4:
            continue
        try:
            gpus.append(
                {
                    "index": int(fields[0]),
                    "name": fields[1],
                    "uuid": fields[2],
                    "memory_total_mb": int(float(fields[3])),
                    "simulated": False,
                }
            )
        except ValueError:
            continue
    return gpus


def _gpus_nvidia_smi() -> Optional[List[Dict[str, Any]]]:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        proc = subprocess.run(
            [smi, "--query-gpu=" + NVIDIA_SMI_QUERY, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=15,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return parse_nvidia_smi_inventory(proc.stdout)


def simulated_gpus(count: int, hostname: str) -> List[Dict[str, Any]]:
    """GPUs that exist only on paper, for hosts without any (test beds, demos). Always marked."""
    return [
        {
            "index": i,
            "name": "Simulated GPU",
            "uuid": "SIM-%s-%d" % (hashlib.sha1(hostname.encode()).hexdigest()[:8], i),
            "memory_total_mb": 81920,
            "simulated": True,
        }
        for i in range(count)
    ]


def discover_gpus(hostname: str) -> "tuple[str, List[Dict[str, Any]]]":
    """Return (source, gpus): source is 'nvml', 'nvidia-smi', 'simulated' or 'none'."""
    gpus = _gpus_nvml()
    if gpus:
        return "nvml", gpus
    gpus = _gpus_nvidia_smi()
    if gpus:
        return "nvidia-smi", gpus
    try:
        sim = int(os.environ.get("RIGDECK_SIM_GPUS", "0") or 0)
    except ValueError:
        sim = 0
    if sim > 0:
        return "simulated", simulated_gpus(sim, hostname)
    return "none", []


def sha256_file(path: str) -> Optional[str]:
    try:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    except OSError:
        return None


def _account() -> Optional[str]:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid with no passwd entry (a container's)
        return None


CONTAINER_RUNTIMES = ("podman", "docker", "apptainer")  # agent/container.py's RUNTIMES (no imports here)


def containers() -> Dict[str, Any]:
    """The container runtimes on PATH and, with podman, the images of the host's own store (the
    one ``rigdeck image push`` loads into and ``[container]`` jobs read); images is None when
    podman did not answer."""
    runtimes = [r for r in CONTAINER_RUNTIMES if shutil.which(r)]
    images = None  # type: Optional[List[str]]
    if "podman" in runtimes:
        try:
            r = subprocess.run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}}"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               timeout=10, check=False)
            if r.returncode == 0:
                images = sorted({ln for ln in r.stdout.decode(errors="replace").split() if "<none>" not in ln})
        except (OSError, subprocess.TimeoutExpired):
            pass
    return {"runtimes": runtimes, "images": images}


def collect(state_dir: Optional[str] = None) -> Dict[str, Any]:
    """All facts as one JSON-able dict. ``state_dir`` ('~' allowed) adds what is deployed there."""
    hostname = socket.gethostname()
    source, gpus = discover_gpus(hostname)
    facts = {
        "hostname": hostname,
        "addresses": _addresses(),
        "nics": nics(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "memory_total_mb": _memory_total_mb(),
        "gpu_source": source,
        "gpus": gpus,
        "home": os.path.expanduser("~"),
        "user": _account(),  # the account the agent runs as (a shared server checks a join by it)
        "containers": containers(),
    }  # type: Dict[str, Any]
    if state_dir is not None:
        sd = os.path.expanduser(state_dir)
        facts["state_dir"] = sd
        current = None
        try:
            with open(os.path.join(sd, "agent", "current")) as f:
                current = f.read().strip() or None
        except OSError:
            pass
        facts["deployed_version"] = current
        if current:
            pyz = os.path.join(sd, "agent", current, "agent.pyz")
            facts["deployed_sha256"] = sha256_file(pyz)
    return facts


def main(argv: Optional[List[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    state_dir = args[0] if args else None
    json.dump(collect(state_dir), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
