"""Stand-ins for what a test cannot have or must control: pynvml, a host's telemetry as the
agent reports it, a notify command, a listener on a Unix socket."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests import h100data

# --- pynvml, its GPUs the recorded H100's (tests/data/gpu-h100/)


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeNvml:
    """The pynvml functions the collector uses; counts every call. GPU ``i`` gives what NVML gave
    at tick ``i`` of the recording on a real H100 (tests/data/gpu-h100/): its first memory call the
    recorded used (the driver's reservation counted in), memory info v2 nvidia-smi's used with the
    reservation apart. GPU 0 has the card's uuid; the others' end in their index."""

    NVMLError = FakeNVMLError
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_ERROR_FUNCTION_NOT_FOUND = 13
    nvmlMemory_v2 = 0x02000028  # as pynvml spells it; None: a pynvml older than v2

    def __init__(self, gpus: int = 2) -> None:
        self.gpus = gpus
        self.fail_init = False
        self.calls: Counter[str] = Counter()
        self.compute: dict[int, list[Any]] = {i: [] for i in range(gpus)}
        self.graphics: dict[int, list[Any]] = {i: [] for i in range(gpus)}
        self.no_ecc: set[int] = set()
        self.lost_power: set[int] = set()
        self.driver_has_v2 = True  # False: the v2 call is missing from the driver's library

    def _h(self, name: str, h: Any = None) -> int:
        self.calls[name] += 1
        if h is not None:
            assert isinstance(h, tuple) and h[0] == "handle", h
            return int(h[1])
        return -1

    def _rec(self, i: int) -> dict[str, Any]:
        return h100data.gpu("nvml", i)

    def nvmlInit(self) -> None:
        self._h("nvmlInit")
        if self.fail_init:
            raise FakeNVMLError(self.NVML_ERROR_LIBRARY_NOT_FOUND)

    def nvmlShutdown(self) -> None:
        self._h("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._h("nvmlDeviceGetCount")
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Any:
        self._h("nvmlDeviceGetHandleByIndex")
        return ("handle", i)

    def nvmlDeviceGetName(self, h: Any) -> bytes:
        return self._rec(self._h("nvmlDeviceGetName", h))["name"].encode()  # older pynvml: bytes

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        i = self._h("nvmlDeviceGetUUID", h)
        return h100data.UUID if i == 0 else f"{h100data.UUID[:-4]}{i:04x}"

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        i = self._h("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=int(self._rec(i)["utilization_pct"]), memory=10)

    def nvmlDeviceGetMemoryInfo(self, h: Any, version: int | None = None) -> Any:
        i = self._h("nvmlDeviceGetMemoryInfo", h)
        mib = 1024 * 1024
        total = self._rec(i)["memory_total_mb"] * mib
        if version is None:  # the first version: used counts the driver's reservation
            used = self._rec(i)["memory_used_mb"] * mib
            return SimpleNamespace(total=total, used=used, free=total - used)
        assert version == 0x02000028, version
        if not self.driver_has_v2:
            raise FakeNVMLError(self.NVML_ERROR_FUNCTION_NOT_FOUND)
        reserved = h100data.RESERVED_MB * mib
        used = self._rec(i)["memory_used_mb"] * mib - reserved
        return SimpleNamespace(version=version, total=total, reserved=reserved,
                               free=total - reserved - used, used=used)

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return int(self._rec(self._h("nvmlDeviceGetTemperature", h))["temperature_c"])

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        i = self._h("nvmlDeviceGetPowerUsage", h)
        if i in self.lost_power:
            raise FakeNVMLError(self.NVML_ERROR_GPU_IS_LOST)
        return round(self._rec(i)["power_w"] * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, h: Any) -> int:
        return round(self._rec(self._h("nvmlDeviceGetEnforcedPowerLimit", h))["power_limit_w"] * 1000)

    def nvmlDeviceGetClockInfo(self, h: Any, clock: int) -> int:
        assert clock == self.NVML_CLOCK_SM
        return int(self._rec(self._h("nvmlDeviceGetClockInfo", h))["sm_clock_mhz"])

    def nvmlDeviceGetTotalEccErrors(self, h: Any, error_type: int, counter: int) -> int:
        assert (error_type, counter) == (1, 0)
        i = self._h("nvmlDeviceGetTotalEccErrors", h)
        if i in self.no_ecc:
            raise FakeNVMLError(self.NVML_ERROR_NOT_SUPPORTED)
        return int(self._rec(i)["ecc_volatile_errors"])

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        return self.compute[self._h("nvmlDeviceGetComputeRunningProcesses", h)]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: Any) -> list[Any]:
        return self.graphics[self._h("nvmlDeviceGetGraphicsRunningProcesses", h)]


# --- the agent's telemetry of a host with real GPUs, as the scheduler reads it


def telemetry(gpus: list[dict[str, object]], cores: int = 8) -> dict[str, object]:
    return {
        "time": 1.0,
        "simulated": False,
        "gpu_source": "nvml",
        "host": {
            "cpu_pct": 1.0,
            "cpu_per_core": [0.0] * cores,
            "mem_used_mb": 1,
            "mem_total_mb": 2,
        },
        "gpus": gpus,
    }


def gpu(index: int, *procs: tuple[str | None, str | None]) -> dict[str, object]:
    return {
        "index": index,
        "name": "NVIDIA A100-SXM4-80GB",
        "uuid": f"GPU-{index}",
        "simulated": False,
        "utilization_pct": 0.0,
        "processes": [
            {"pid": 100 + i, "user": user, "used_memory_mb": 1, "job_id": job, "rank": None}
            for i, (user, job) in enumerate(procs)
        ],
    }


# --- a [notify] command (``python -c WRITER FILE``): each event a line of FILE, its fields the
# event read from stdin, the job id, the event's name, and whether RIGDECK_EVENT says the same


WRITER = ("import os, sys; data = sys.stdin.read(); "
          "open(sys.argv[1], 'a').write(data + '\\t' + os.environ['RIGDECK_JOB_ID'] + '\\t' "
          "+ os.environ['RIGDECK_EVENT_NAME'] + '\\t' + str(os.environ['RIGDECK_EVENT'] == data) + '\\n')")


def written_lines(p: Path) -> list[list[str]]:
    """WRITER's lines so far, each split into its fields."""
    return [ln.split("\t") for ln in p.read_text().splitlines()] if p.exists() else []


# --- a program that listens on the Unix socket ``argv[1]`` and echoes what it reads

LISTENER = r"""
import os, socket, sys
path = sys.argv[1]
os.makedirs(os.path.dirname(path), exist_ok=True)
if os.path.exists(path):
    os.unlink(path)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
s.listen(8)
print("stand-in listening on", path, flush=True)
while True:
    c, _ = s.accept()
    while True:
        d = c.recv(65536)
        if not d:
            break
        c.sendall(d)
    c.close()
"""
