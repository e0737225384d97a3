"""The doctor's checks that run on a host (``rigdeck doctor``; the verdicts are drawn on the
workstation, in ``tui/control/doctorhost.py``).

- ``probe ADDRESS``: the versions the jobs would use (Python, torch, CUDA, NCCL, the NVIDIA
  driver), each GPU's health as NVML reports it, and the interface and MTU this host's packets
  to ``ADDRESS`` (the primary) leave by;
- ``disk SIZE_MB ROLE DIR [ROLE DIR ...]``: write (with fsync) and uncached read throughput of a
  ``SIZE_MB`` file in each directory.

Each prints one JSON line. The controller runs this file's source with the host's own interpreter
(``python -c SOURCE probe ADDRESS`` through the agent's ``exec``): that interpreter's torch is the
one the jobs import, and every path and address is an argument of its own, so no shell ever parses
a user's value. Like ``agent/facts.py`` it must therefore stay a self-contained module with no
package imports.

Stdlib only (torch and pynvml are read when the interpreter has them), Python 3.9+.
"""
from __future__ import annotations

import json
import mmap
import os
import platform
import socket
import struct
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

CHUNK = 4 << 20  # bytes written and read per call
# NVML's per-GPU readings: (key, function, its arguments after the handle). The ECC ones are
# (uncorrected, volatile) and (uncorrected, aggregate).
NVML_FIELDS = (
    ("ecc_volatile_uncorrected", "nvmlDeviceGetTotalEccErrors", (1, 0)),
    ("ecc_aggregate_uncorrected", "nvmlDeviceGetTotalEccErrors", (1, 1)),
    ("throttle_reasons", "nvmlDeviceGetCurrentClocksThrottleReasons", ()),
    ("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration", ()),
    ("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", ()),
    ("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth", ()),
    ("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth", ()),
)


def _why(e: BaseException, limit: int = 200) -> str:
    return ("%s: %s" % (type(e).__name__, e))[:limit]


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


# -- versions ---------------------------------------------------------------------------------


def torch_versions() -> Dict[str, Any]:
    """torch, the CUDA it was built for and the NCCL it carries. A torch that is installed but
    does not import (a CUDA build without its libraries) still reports its version, marked broken."""
    out = {}  # type: Dict[str, Any]
    try:
        import torch

        out["torch"] = str(torch.__version__)
        out["cuda"] = getattr(torch.version, "cuda", None)
        nccl = None
        try:
            if torch.cuda.is_available():
                v = torch.cuda.nccl.version()
                nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        except Exception as e:
            out["nccl_error"] = str(e)[:200]
        out["nccl"] = nccl
    except Exception as e:
        out.update(torch=None, torch_error=_why(e), cuda=None, nccl=None)
        try:
            from importlib.metadata import version

            out["torch"] = version("torch")
            out["torch_broken"] = True
        except Exception:
            pass
    return out


def _nvml_gpu(pynvml: Any, index: int) -> Dict[str, Any]:
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    g = {"index": index, "name": _text(pynvml.nvmlDeviceGetName(h))}  # type: Dict[str, Any]
    for key, fn, args in NVML_FIELDS:
        try:
            g[key] = int(getattr(pynvml, fn)(h, *args))
        except Exception:
            g[key] = None  # not supported on this GPU (ECC off, no PCIe, ...)
    return g


def nvml() -> Dict[str, Any]:
    """The driver version and each GPU's readings through NVML (``nvml`` None without it)."""
    out = {"driver": None, "nvml": None}  # type: Dict[str, Any]
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            out["driver"] = _text(pynvml.nvmlSystemGetDriverVersion())
            out["nvml"] = [_nvml_gpu(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:
        out["nvml_error"] = _why(e)
    return out


def smi_driver() -> Optional[str]:
    """The driver version from nvidia-smi, for a host without pynvml."""
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=20)
        lines = r.stdout.decode(errors="replace").split()
        if r.returncode == 0 and lines:
            return lines[0].strip()
    except Exception:
        pass
    return None


# -- the route towards the primary ----------------------------------------------------------------


def _ip_route(addr: str) -> Tuple[Optional[str], bool]:
    """(the ``dev`` of ``ip -o route get``, whether the address is this host's own)."""
    r = subprocess.run(["ip", "-o", "route", "get", addr], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, timeout=10)
    words = r.stdout.decode(errors="replace").split()
    dev = words[words.index("dev") + 1] if "dev" in words else None
    return dev, bool(words) and words[0] == "local"


def _proc_route(addr: str) -> Optional[str]:
    """The interface of the longest IPv4 prefix in /proc/net/route that covers ``addr``."""
    best = None  # type: Optional[Tuple[int, str]]
    a = struct.unpack("<I", socket.inet_aton(addr))[0]
    with open("/proc/net/route") as f:
        for line in f.readlines()[1:]:
            p = line.split()
            dest, mask = int(p[1], 16), int(p[7], 16)
            if a & mask == dest and (best is None or bin(mask).count("1") > best[0]):
                best = (bin(mask).count("1"), p[0])
    return best[1] if best is not None else None


def _holder(addr: str) -> Optional[str]:
    """The interface that holds ``addr`` (on the primary the route is ``lo``: this names the NIC)."""
    r = subprocess.run(["ip", "-o", "-4", "addr", "show"], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, timeout=10)
    for line in r.stdout.decode(errors="replace").splitlines():
        w = line.split()
        if len(w) > 3 and w[3].split("/")[0] == addr:
            return w[1].rstrip(":")
    return None


def route(target: str) -> Dict[str, Any]:
    """The interface the routing table picks towards ``target`` (a name or an IPv4 address), its
    MTU and every interface of the host."""
    out = {}  # type: Dict[str, Any]
    try:
        addr = str(socket.getaddrinfo(target, None, socket.AF_INET)[0][4][0])
    except Exception:
        addr = target
    out["primary_address"] = addr
    dev, local = None, False
    try:
        dev, local = _ip_route(addr)
        out["route_source"] = "ip route get"
    except Exception:
        pass
    if dev is None:  # no iproute2: the kernel's table
        try:
            dev = _proc_route(addr)
            out["route_source"] = "/proc/net/route"
        except Exception:
            pass
    if local or dev == "lo":
        try:
            dev = _holder(addr) or dev
        except Exception:
            pass
    out["interface"] = dev
    out["mtu"] = None
    if dev:
        try:
            with open("/sys/class/net/%s/mtu" % dev) as f:
                out["mtu"] = int(f.read().strip())
        except Exception:
            pass
    try:
        out["interfaces"] = sorted(os.listdir("/sys/class/net"))
    except Exception:
        out["interfaces"] = []
    return out


def probe(target: str) -> Dict[str, Any]:
    """Everything ``probe`` prints: versions, NVML's readings and the route towards ``target``."""
    out = {"python": platform.python_version(), "executable": sys.executable}  # type: Dict[str, Any]
    out.update(torch_versions())
    out.update(nvml())
    if out["driver"] is None:
        out["driver"] = smi_driver()
    out.update(route(target))
    return out


# -- disk throughput ------------------------------------------------------------------------------


def fstype(path: str) -> str:
    """The type of the filesystem ``path`` is on (the longest mount point above it), or "?"."""
    best, kind = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                p = line.split()
                mnt = p[1].replace("\\040", " ")
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, kind = mnt, p[2]
    except Exception:
        pass
    return kind


def _read_all(fd: int, buf: mmap.mmap) -> Tuple[int, float]:
    got = 0
    t0 = time.perf_counter()
    while True:
        k = os.readv(fd, [buf])
        if k <= 0:
            break
        got += k
    return got, time.perf_counter() - t0


def _open_uncached(path: str) -> Tuple[int, str]:
    """The file opened for a read that does not come from the page cache, and how: O_DIRECT, or
    the cache dropped with fadvise, or (neither works) the page cache after all."""
    if hasattr(os, "O_DIRECT"):
        try:
            return os.open(path, os.O_RDONLY | os.O_DIRECT), "O_DIRECT"
        except OSError:
            pass
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return fd, "fadvise DONTNEED"
    except (AttributeError, OSError):
        return fd, "page cache"


def _timed_read(path: str, buf: mmap.mmap, r: Dict[str, Any]) -> None:
    fd, how = _open_uncached(path)
    try:
        try:
            r["read_bytes"], r["read_s"] = _read_all(fd, buf)
        except OSError:
            if how != "O_DIRECT":
                raise
            os.close(fd)  # this filesystem takes O_DIRECT at open but not at read
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            how = "fadvise DONTNEED"
            r["read_bytes"], r["read_s"] = _read_all(fd, buf)
    finally:
        os.close(fd)
    r["read_method"] = how


def measure(role: str, directory: str, size_mb: int) -> Dict[str, Any]:
    """Write a ``size_mb`` file into ``directory`` (fsync), read it back uncached, remove it."""
    r = {"role": role, "dir": directory}  # type: Dict[str, Any]
    path = None
    try:
        d = os.path.realpath(os.path.expanduser(directory))
        r["dir"] = d
        os.makedirs(d, exist_ok=True)
        r["fstype"] = fstype(d)
        path = os.path.join(d, ".rigdeck-doctor-%s-%d.tmp" % (socket.gethostname(), os.getpid()))
        buf = mmap.mmap(-1, CHUNK)  # page-aligned: O_DIRECT reads into it
        buf.write(os.urandom(CHUNK))
        n = max(1, (size_mb << 20) // CHUNK)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            t0 = time.perf_counter()
            for _ in range(n):
                os.write(fd, buf)
            os.fsync(fd)
            r["write_s"] = time.perf_counter() - t0
        finally:
            os.close(fd)
        r["bytes"] = n * CHUNK
        _timed_read(path, buf, r)
    except Exception as e:
        r["error"] = _why(e, 300)
    finally:
        if path:
            try:
                os.unlink(path)
            except OSError:
                pass
    return r


def disk(size_mb: int, dirs: Sequence[Tuple[str, str]]) -> List[Dict[str, Any]]:
    """``measure`` each (role, directory) in turn."""
    return [measure(role, d, size_mb) for role, d in dirs]


# -- entry point ----------------------------------------------------------------------------------

USAGE = "usage: doctorprobe.py probe ADDRESS | disk SIZE_MB ROLE DIR [ROLE DIR ...]\n"


def main(argv: Optional[List[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] == "probe":
        result = probe(args[1])  # type: Any
    elif len(args) >= 4 and len(args) % 2 == 0 and args[0] == "disk" and args[1].isdigit():
        result = disk(int(args[1]), [(args[i], args[i + 1]) for i in range(2, len(args), 2)])
    else:
        sys.stderr.write(USAGE)
        return 2
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
