"""A stand-in for a pipeline-parallel rank (issue 16's events, shaped as docs/contracts.md says;
the real ones come from runtime.pipeline_stage): it reads RIGDECK_MODEL_PARALLEL, prints it, and
appends to its metrics file what a stage reports: rank 0 the mp_plan (cut from the table's
partitions), every rank an mp_stage for its stage (= its rank) and a step. Exits 0."""

import json
import os
import time

rank = int(os.environ.get("RANK") or 0)
table = json.loads(os.environ["RIGDECK_MODEL_PARALLEL"])
print("RIGDECK_MODEL_PARALLEL=" + os.environ["RIGDECK_MODEL_PARALLEL"], flush=True)
p, m = table["partitions"], table["microbatches"]
blocks = 2 * p
records = []
if rank == 0:
    stages = [{"stage": i, "blocks": [2 * i, 2 * i + 2], "time_s": 0.001 * (i + 1),
               "memory_bytes": 1000 * (i + 1), "send_bytes": 64 if i < p - 1 else 0} for i in range(p)]
    plan = {"version": 1, "optimize": table["optimize"], "schedule": table["pipeline"], "microbatches": m,
            "partitions": p, "blocks": blocks, "cuts": [2 * i for i in range(1, p)], "source": "profiled",
            "stages": stages, "bubble": (p - 1) / (m + p - 1),
            "equal_split": {"cuts": [2 * i for i in range(1, p)], "max_time_s": 0.001 * p,
                            "max_memory_bytes": 1000 * p}}
    records.append({"time": time.time(), "rank": rank, "event": "mp_plan", "plan": plan})
records.append({"time": time.time(), "rank": rank, "step": 1, "loss": 1.0})
records.append({"time": time.time(), "rank": rank, "event": "mp_stage", "stage": rank, "step": 1,
                "step_time_s": 0.01, "busy_s": 0.002 * (rank + 1), "peak_bytes": 1500 * (rank + 1)})
with open(os.path.join(os.environ["RIGDECK_METRICS_DIR"], f"rank-{rank}.jsonl"), "a") as f:
    for r in records:
        f.write(json.dumps(r) + "\n")
