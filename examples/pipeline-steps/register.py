"""Register the trained model: its content hash and weights into output/data/registry.json.

Runs only when the pipeline's condition held (evaluate's accuracy >= 0.9)."""

from __future__ import annotations

import hashlib
import json
import os


def main() -> int:
    path = os.path.join(os.environ["SM_CHANNEL_MODEL"], "model.json")
    with open(path, "rb") as f:
        data = f.read()
    entry = {"model": "blobs-logreg", "sha256": hashlib.sha256(data).hexdigest(),
             "pipeline": os.environ.get("RIGDECK_PIPELINE_ID"), "weights": json.loads(data)}
    with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "registry.json"), "w") as f:
        json.dump(entry, f, indent=1)
    print(f"registered blobs-logreg sha256={entry['sha256'][:12]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
