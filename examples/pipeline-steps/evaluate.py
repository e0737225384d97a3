"""Accuracy of the trained model on the test split: both arrive as channels.

``input/data/model`` is the train step's model dir, ``input/data/test`` the preprocess step's
output (its ``test.csv``). Reports ``accuracy`` (the pipeline's ``when`` reads it) and writes
``eval.json`` to output/data."""

from __future__ import annotations

import json
import math
import os

import runtime


def main() -> int:
    with open(os.path.join(os.environ["SM_CHANNEL_MODEL"], "model.json")) as f:
        m = json.load(f)
    right = total = 0
    with open(os.path.join(os.environ["SM_CHANNEL_TEST"], "test.csv")) as f:
        next(f)
        for line in f:
            x, y, label = line.strip().split(",")
            z = m["w"][0] * float(x) + m["w"][1] * float(y) + m["b"]
            guess = 1 if 1.0 / (1.0 + math.exp(-z)) >= 0.5 else 0
            right += guess == int(label)
            total += 1
    accuracy = right / total
    runtime.report(step=1, accuracy=accuracy)
    with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "eval.json"), "w") as f:
        json.dump({"accuracy": accuracy, "rows": total}, f)
    print(f"accuracy={accuracy:.4f} on {total} rows", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
