"""Where the agent daemon's memory goes on a GPU host: RSS, PSS, USS and anonymous memory after
each stage in one process (bare Python; the daemon's and the collector's imports; pynvml; NVML's
init; the collector's first sample and 20 more), then the largest mappings. Run on a GPU host
from the repo's root: ``python3 bench/nvml_memory.py`` (writes $OUT/nvml-mem.json, else /tmp).
What it found on an H100 is in docs/benchmarks.md ("On a GPU") and
bench/results/gpu-nvml-memory.json."""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.getcwd())


def mem() -> dict[str, float]:
    """This process's memory now (MB), from /proc/self/smaps_rollup."""
    out: dict[str, float] = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("Rss", "Pss", "Private_Clean", "Private_Dirty", "Anonymous"):
                out[key] = int(value.split()[0]) / 1024
    out["USS"] = out.get("Private_Clean", 0.0) + out.get("Private_Dirty", 0.0)
    return {k: round(v, 1) for k, v in out.items() if k in ("Rss", "Pss", "USS", "Anonymous")}


def largest_mappings(count: int = 15) -> list[tuple[str, float]]:
    """The mappings holding the most resident memory (MB), by file (``[anon]`` for none)."""
    maps: dict[str, float] = {}
    current = None
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 5 and "-" in parts[0] and ":" not in parts[0]:
                current = parts[5] if len(parts) > 5 else "[anon]"
            elif line.startswith("Rss:") and current is not None:
                maps[current] = maps.get(current, 0.0) + int(parts[1]) / 1024
    return sorted(maps.items(), key=lambda kv: -kv[1])[:count]


def main() -> int:
    rows = [("bare python", mem())]
    import agent.daemon  # noqa: F401

    rows.append(("+ agent.daemon", mem()))
    import agent.telemetry as telemetry

    rows.append(("+ agent.telemetry", mem()))
    try:
        import pynvml  # type: ignore

        rows.append(("+ import pynvml", mem()))
        pynvml.nvmlInit()
        rows.append(("+ nvmlInit", mem()))
        pynvml.nvmlShutdown()
    except Exception as e:  # no NVML here: the stages after it say so
        rows.append((f"nvml: {e}", mem()))
    collector = telemetry.Collector(interval=1.0)
    collector.sample()
    rows.append((f"+ Collector, first sample ({getattr(collector, 'gpu_source', '?')})", mem()))
    for _ in range(20):
        time.sleep(0.05)
        collector.sample()
    rows.append(("+ 20 samples", mem()))
    top = largest_mappings()
    for name, m in rows:
        print(f"{name:<45} {m}")
    print("largest mappings by RSS (MB):")
    for path, mb in top:
        print(f"  {mb:7.1f}  {path}")
    with open(os.environ.get("OUT", "/tmp") + "/nvml-mem.json", "w") as f:
        json.dump({"stages": rows, "mappings": top}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
