"""A pool replica that stays up: runs tests/probe_rank.py's checks (and, in the torch world, its
gloo collectives), then waits until it is stopped. For the pool tests: parameter servers and
evaluators serve until the job ends, and a replica to kill must be alive when it is killed."""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import time
from pathlib import Path

PROBE = Path(__file__).resolve().parent.parent / "probe_rank.py"


def main() -> int:
    spec = importlib.util.spec_from_file_location("probe_rank", PROBE)
    assert spec is not None and spec.loader is not None
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    code = probe.main()
    if code != 0:
        return code
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    sys.stdout.write(f"{os.environ.get('RIGDECK_POOL')} {os.environ.get('RIGDECK_POOL_REPLICA')} waiting\n")
    sys.stdout.flush()
    while True:
        time.sleep(1)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
