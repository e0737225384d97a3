"""``agent.pyz rank --job-dir D [--rank R --local-rank L] -- COMMAND...``: the wrapper every rank runs in.

Whatever launched it (the job host process, torchrun or mpirun), it gives each rank the same
bookkeeping: its output goes straight to ``logs/rank-<R>.log`` (a file, not a pipe, so nothing is
lost when the agent restarts), a ``ranks/rank-<R>.json`` record names its pid, and when the rank
ends ``ranks/rank-<R>.exit.json`` records its exit code or signal and the last lines it printed.
Signals sent to the wrapper are passed on to the rank. Stdlib only, Python 3.9+.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Dict, List, Optional

TAIL_LINES = 20


def _first_int(env: Dict[str, str], names: List[str]) -> Optional[int]:
    for n in names:
        v = env.get(n)
        if v is not None and v.strip().lstrip("-").isdigit():
            return int(v)
    return None


def write_json(path: str, obj: object) -> None:
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def tail(path: str, lines: int = TAIL_LINES, max_bytes: int = 16384) -> List[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    return data.decode("utf-8", "replace").splitlines()[-lines:]


def main(job_dir: str, rank: Optional[int], local_rank: Optional[int], command: List[str]) -> int:
    env = dict(os.environ)
    if env.get("RIGDECK_LAUNCHER") == "mpirun":
        # mpirun exported the primary's environment to every host: put this host's own view of
        # the cluster (written here by this host's agent, same job path) back on top.
        from agent.clusterfiles import load_node_env

        mine = load_node_env(job_dir)
        if mine:
            env.update(mine)
    if rank is None:
        rank = _first_int(env, ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"])
    if local_rank is None:
        local_rank = _first_int(env, ["LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"])
    if rank is None:
        sys.stderr.write("rigdeck rank: cannot tell this rank's number (no RANK or OMPI_COMM_WORLD_RANK)\n")
        return 127
    if local_rank is None:
        local_rank = 0
    # mpirun and torchrun set only their own variables: give every rank rigdeck's too.
    env["RIGDECK_RANK"] = str(rank)
    env["RIGDECK_LOCAL_RANK"] = str(local_rank)
    env.setdefault("RANK", str(rank))
    env.setdefault("LOCAL_RANK", str(local_rank))
    gpus = [g for g in env.get("RIGDECK_GPUS", "").split(",") if g]
    gpu = int(gpus[local_rank]) if local_rank < len(gpus) else None
    if gpu is not None and env.get("RIGDECK_LAUNCHER") == "mpirun":
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    logs = os.path.join(job_dir, "logs")
    ranks = os.path.join(job_dir, "ranks")
    os.makedirs(logs, exist_ok=True)
    os.makedirs(ranks, exist_ok=True)
    log_path = os.path.join(logs, "rank-%d.log" % rank)
    exit_path = os.path.join(ranks, "rank-%d.exit.json" % rank)
    try:
        os.unlink(exit_path)
    except OSError:
        pass
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log_fd, stderr=log_fd, env=env)
    except OSError as e:
        os.write(log_fd, ("rigdeck: cannot start %s: %s\n" % (command[0], e)).encode())
        write_json(exit_path, {"rank": rank, "exit_code": 127, "signal": None, "ended": time.time(),
                               "tail": tail(log_path), "error": str(e)})
        return 127
    finally:
        os.close(log_fd)

    def forward(signum: int, frame: object) -> None:
        try:
            child.send_signal(signum)
        except OSError:
            pass

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, forward)
    write_json(
        os.path.join(ranks, "rank-%d.json" % rank),
        {"rank": rank, "local_rank": local_rank, "pid": child.pid, "wrapper_pid": os.getpid(),
         "host": env.get("RIGDECK_CURRENT_HOST") or socket.gethostname(), "gpu": gpu,
         "started": time.time(), "restart_count": int(env.get("RIGDECK_RESTART_COUNT", "0") or 0)},
    )
    code = child.wait()
    sig = -code if code < 0 else None
    write_json(exit_path, {"rank": rank, "exit_code": code if code >= 0 else None, "signal": sig,
                           "ended": time.time(), "tail": tail(log_path)})
    return code if code >= 0 else 128 + (sig or 0)
