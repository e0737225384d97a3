"""A processing job's script: writes, for every input channel under RIGDECK_PROCESSING_DIR, the
relative path of every file it finds there (recursively, through the symlinks rigdeck made) with
its first line, into output/seen/<channel>.txt."""

from __future__ import annotations

import os

base = os.environ["RIGDECK_PROCESSING_DIR"]
inputs = os.path.join(base, "input")
out = os.path.join(base, "output", "seen")
os.makedirs(out, exist_ok=True)
for channel in sorted(os.listdir(inputs)):
    root = os.path.join(inputs, channel)
    rows = []
    for d, _dirs, files in os.walk(root, followlinks=True):
        for name in files:
            path = os.path.join(d, name)
            with open(path) as f:
                rows.append(f"{os.path.relpath(path, root)}\t{f.readline().strip()}")
    with open(os.path.join(out, channel + ".txt"), "w") as f:
        f.write("".join(r + "\n" for r in sorted(rows)))
print("processed", base)
