"""A processing job's script: counts the lines of each of this host's input files, into
processing/output/counts/<host>.tsv (one "input/file<TAB>lines" row per file)."""

import json
import os

root = os.environ.get("RIGDECK_PROCESSING_DIR", "/opt/ml/processing")
with open(os.path.join(root, "config", "resourceconfig.json")) as f:
    me = json.load(f)["current_host"]
rows = []
for name in sorted(os.listdir(os.path.join(root, "input"))):
    base = os.path.join(root, "input", name)
    for d, dirs, files in os.walk(base, followlinks=True):
        dirs.sort()
        for fn in sorted(files):
            path = os.path.join(d, fn)
            with open(path, "rb") as f:
                rows.append(f"{name}/{os.path.relpath(path, base)}\t{sum(1 for _ in f)}\n")
out = os.path.join(root, "output", "counts")
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, f"{me}.tsv"), "w") as f:
    f.writelines(rows)
print(f"{me}: counted the lines of {len(rows)} files", flush=True)
