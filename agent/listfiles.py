"""A processing input's source listed on a host: its regular files, recursively, by path relative
to it, sorted, as one JSON line ``{"files": [...]}`` (a missing directory exits non-zero, saying so).

The controller runs this file's source with the host's own interpreter (``python -c SOURCE DIR``
through the agent's ``exec``; the directory is an argument of its own, so no shell parses it),
as it runs ``agent/doctorprobe.py``: a self-contained module with no package imports. It is one
of the programs the server's key may ``exec`` (``agent/roles.py``).

Stdlib only, Python 3.9+.
"""
import json
import os
import sys


def _fail(e: OSError) -> None:
    raise e


def main(root: str) -> int:
    if not os.path.isdir(root):
        sys.stderr.write("not a directory: %s\n" % root)
        return 1
    out = []
    for d, dirs, files in os.walk(root, onerror=_fail):
        dirs.sort()
        for f in files:
            p = os.path.join(d, f)
            if os.path.isfile(p):
                out.append(os.path.relpath(p, root))
    print(json.dumps({"files": sorted(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
