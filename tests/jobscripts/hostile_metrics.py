"""A rank whose metrics strings try to drive the operator's terminal: an event, a status and a
metric value carrying ESC, OSC (title and clipboard), BEL and other control characters. It writes
three steps and the hostile event, then runs until stopped (``--steps-only``: then exits 0)."""

import json
import os
import sys
import time

rank = int(os.environ.get("RANK") or 0)
with open(os.path.join(os.environ["RIGDECK_METRICS_DIR"], f"rank-{rank}.jsonl"), "a") as f:
    for step in range(3):
        f.write(json.dumps({"time": time.time(), "rank": rank, "step": step, "loss": 1.0 / (step + 1),
                            "note": "\x1b[2Jcleared"}) + "\n")
    f.write(json.dumps({"time": time.time(), "rank": rank, "event": "\x1b]0;pwned\x07ckpt\x1bc",
                        "status": "\x1b]52;c;ZXZpbA==\x07done\x08\x7f", "step": 2,
                        "path": "\x1b]8;;file:///etc\x1b\\ckpt\x1b]8;;\x1b\\"}) + "\n")
print(f"rank {rank} wrote its metrics", flush=True)
if "--steps-only" not in sys.argv:
    time.sleep(600)
