"""Recorded rows of a real NVIDIA H100 80GB HBM3 (tests/data/gpu-h100/, see its PROVENANCE.md),
in the forms the collector reads: nvidia-smi's CSV rows and the values NVML gave, per tick."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data" / "gpu-h100"


@cache
def samples(name: str) -> tuple[dict[str, Any], ...]:
    """The samples of one recording (``nvml`` or ``nvidia-smi``), in the order they were taken."""
    lines = (DATA / f"{name}-under-load.jsonl").read_text().splitlines()
    return tuple(json.loads(line) for line in lines if line.strip())


def gpu(name: str, tick: int = 0) -> dict[str, Any]:
    """The one GPU of a recorded tick (wrapping round the recording)."""
    s = samples(name)
    return s[tick % len(s)]["gpus"][0]


SMI_USED_MB = gpu("nvidia-smi")["memory_used_mb"]  # 6863: what nvidia-smi said under the load
NVML_V1_USED_MB = gpu("nvml")["memory_used_mb"]  # 7342: NVML's first memory call, same load
TOTAL_MB = gpu("nvml")["memory_total_mb"]  # 81559
RESERVED_MB = NVML_V1_USED_MB - SMI_USED_MB  # 479: derived (PROVENANCE.md)
UUID = gpu("nvml")["uuid"]
NAME = gpu("nvml")["name"]
TAGGED = gpu("nvml")["processes"][0]  # the tagged process NVML saw: job, rank, MB used


def _num(v: float | None, spec: str) -> str:
    return "[N/A]" if v is None else format(v, spec)


def smi_gpu_row(tick: int = 0, reserved: bool = False) -> str:
    """The line ``nvidia-smi --query-gpu=NVIDIA_SMI_QUERY[,memory.reserved] --format=csv,
    noheader,nounits`` printed at a recorded tick."""
    g = gpu("nvidia-smi", tick)
    fields = [
        str(g["index"]), g["name"], g["uuid"], _num(g["utilization_pct"], ".0f"),
        str(g["memory_used_mb"]), str(g["memory_total_mb"]), _num(g["temperature_c"], ".0f"),
        _num(g["power_w"], ".2f"), _num(g["power_limit_w"], ".2f"), str(g["sm_clock_mhz"]),
        str(g["ecc_volatile_errors"]),
    ]
    if reserved:
        fields.append(str(RESERVED_MB))
    return ", ".join(fields)


def smi_app_row(pid: int) -> str:
    """A ``--query-compute-apps=gpu_uuid,pid,used_memory`` line for the tagged process, under
    ``pid`` (the test's own stand-in for it)."""
    return f"{UUID}, {pid}, {TAGGED['used_memory_mb']}"
