"""``rigdeck tensorboard JOB``: the job's TensorBoard event files from every host it ran on, copied
here as they grow, and TensorBoard serving them on this machine.

Each host's files are the ones the job wrote under its ``AIP_TENSORBOARD_LOG_DIR`` there (the
agent reads where from the job's own environment); they come through the controller API
(``tensorboard_pull``) into ``<dir>/<host>/...`` (default ``$RIGDECK_HOME/tensorboard/<job id>``),
only the bytes that are new since the last pull: event files are only ever appended to. A file
that shrank or was replaced is copied again from its start (``tui.model.tbsync``). What is held
of each file is kept in ``<dir>/.rigdeck-pull.json``, so another run goes on where this one
stopped.

It starts TensorBoard on ``127.0.0.1`` (the Python rigdeck runs from must have the
``tensorboard`` package: ``pip install 'rigdeck[tensorboard]'``), says its URL, and pulls every
``--poll`` seconds while the job runs; once the job has ended and its last bytes are here,
TensorBoard goes on serving until Ctrl+C. ``--once``: one pull, no TensorBoard. ``--no-serve``:
pull until the job ends, no TensorBoard.
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tui.cli.signals import interrupt, stop_signals
from tui.model.jobstate import QUEUED, TERMINAL
from tui.model.tbsync import Have, TensorboardSyncError, have_row, local_parts
from tui.model.textformat import size_bytes

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
STATE_FILE = ".rigdeck-pull.json"
DEFAULT_PORT = 6006
PORT_TRIES = 10  # 6006 and the nine after it, then any free port
INSTALL_HINT = ("TensorBoard is not installed in the Python rigdeck runs from ({python}): "
                "pip install 'rigdeck[tensorboard]' (or pip install tensorboard) there; "
                "--once or --no-serve copy the files without it")


def add_parser(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser(
        "tensorboard",
        help="copy a job's TensorBoard event files here from its hosts as they grow, and serve them with TensorBoard",
        description="Copy the event files the job writes to AIP_TENSORBOARD_LOG_DIR on each of its hosts into "
        "DIR/HOST/ (only what is new each time), run TensorBoard on 127.0.0.1 over DIR and keep "
        "copying while the job runs, until Ctrl+C. See docs/observability.md.",
    )
    common(p)
    p.add_argument("job", metavar="JOB")
    p.add_argument("--dir", metavar="DIR", default=None,
                   help="where the files go (default $RIGDECK_HOME/tensorboard/JOB_ID)")
    p.add_argument("--once", action="store_true", help="copy what is new once and exit (no TensorBoard)")
    p.add_argument("--no-serve", dest="serve", action="store_false",
                   help="copy until the job ends, without starting TensorBoard")
    p.add_argument("--port", type=int, default=None, metavar="P",
                   help=f"TensorBoard's port on 127.0.0.1 (default {DEFAULT_PORT}, or the next free one)")
    p.add_argument("--poll", type=float, default=2.0, metavar="S", help="seconds between copies (default 2)")


# -- the copy here -------------------------------------------------------------------------------


class LocalCopy:
    """The copies under ``root`` of a job's files, and what each holds (``STATE_FILE``)."""

    def __init__(self, root: Path):
        self.root = root
        self.state_path = root / STATE_FILE
        # (host, dir, path) -> {"id", "mtime_ns", "local"}: the file it is a copy of, and where
        self.entries: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.roots: dict[str, list[str]] = {}  # host -> its directories, as its last listing said
        self._load()

    def _load(self) -> None:
        try:
            rows = json.loads(self.state_path.read_text()).get("files") or []
        except (OSError, ValueError, AttributeError):
            return  # none yet (or unreadable): every file is copied from its start
        for row in rows:
            if isinstance(row, list) and len(row) == 6 and all(isinstance(v, str) for v in row[:4]) \
                    and isinstance(row[4], int) and isinstance(row[5], str):
                self.entries[(row[0], row[1], row[2])] = {"id": row[3], "mtime_ns": row[4], "local": row[5]}

    def save(self) -> None:
        rows = [[*k, e["id"], e["mtime_ns"], e["local"]] for k, e in sorted(self.entries.items())]
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"files": rows}))
        os.replace(tmp, self.state_path)

    def _size(self, local: str) -> int | None:
        try:
            return (self.root / local).stat().st_size
        except OSError:
            return None

    def have(self) -> list[list[Any]]:
        """What is held of each file, as the pull takes it: the bytes its copy has now."""
        out = []
        for (host, root, path), e in self.entries.items():
            size = self._size(e["local"])
            if size is not None:
                out.append(have_row(host, root, path, Have(e["id"], size, e["mtime_ns"])))
        return out

    def write(self, item: dict[str, Any]) -> int:
        """Write a piece where it belongs; returns the bytes written. A piece that does not go on
        from the end of its copy is dropped, and so is what is known of the file: it is copied
        again from its start at the next pull."""
        key = (str(item["host"]), str(item["dir"]), str(item["path"]))
        local = "/".join(local_parts(key[0], key[1], self.roots.get(key[0]) or [key[1]], key[2]))
        offset = int(item["offset"])
        entry = self.entries.get(key)
        if offset > 0 and (entry is None or entry["local"] != local or entry["id"] != item["id"]
                           or self._size(local) != offset):
            self.entries.pop(key, None)
            return 0
        data = base64.b64decode(item["b64"])
        path = self.root / local
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "r+b" if offset > 0 else "wb") as f:
            f.seek(offset)
            f.write(data)
        self.entries[key] = {"id": item["id"], "mtime_ns": int(item["mtime_ns"]), "local": local}
        return len(data)


# -- one pull ------------------------------------------------------------------------------------


class Round:
    """What one pull found and brought: per host, its listing and the bytes copied."""

    def __init__(self) -> None:
        self.job: dict[str, Any] = {}
        self.hosts: dict[str, dict[str, Any]] = {}
        self.copied: dict[str, int] = {}
        self.problems: list[str] = []

    @property
    def state(self) -> str:
        return str(self.job.get("state") or "")

    @property
    def files(self) -> int:
        return sum(int(h.get("files") or 0) for h in self.hosts.values())

    @property
    def failed(self) -> list[str]:
        return [h for h, v in self.hosts.items() if v.get("error")]


def pull_once(client: Any, ref: str, copy: LocalCopy) -> Round:
    """One ``tensorboard_pull``, written into ``copy`` as it comes; the state saved after it."""
    rnd = Round()
    try:
        for item in client.tensorboard_pull(ref, copy.have()):
            kind = item.get("kind")
            if kind == "job":
                rnd.job = item
            elif kind == "host":
                host = str(item["host"])
                rnd.hosts[host] = item
                copy.roots[host] = [str(d) for d in item.get("dirs") or []]
                rnd.problems += [f"{host}: {p}" for p in item.get("problems") or []]
            elif kind == "data":
                try:
                    n = copy.write(item)
                except (TensorboardSyncError, OSError, ValueError) as e:
                    rnd.problems.append(f"{item.get('host')}: {item.get('path')!r}: not written: {e}")
                    continue
                if n:
                    rnd.copied[str(item["host"])] = rnd.copied.get(str(item["host"]), 0) + n
            elif kind == "problem":
                rnd.problems.append(f"{item.get('host')}: {item.get('text')}")
    finally:
        copy.save()
    return rnd


class Reporter:
    """Says what each pull found: every host's files and the bytes copied (when following, only
    when they changed), each problem once."""

    def __init__(self) -> None:
        self.said: set[str] = set()
        self.files: dict[str, int] = {}  # host -> the files its last listing had

    def _once(self, line: str, err: bool = False) -> None:
        if line not in self.said:
            self.said.add(line)
            print(line, file=sys.stderr if err else sys.stdout, flush=True)

    def round(self, rnd: Round, follow: bool) -> None:
        job_id = rnd.job.get("job_id")
        if rnd.state == QUEUED:
            self._once(f"{job_id} is queued: no host yet" + ("; waiting" if follow else ""))
        for host, h in rnd.hosts.items():
            if h.get("error"):
                self._once(f"{host}: cannot list its files: {h['error']}", err=True)
                continue
            files, copied = int(h.get("files") or 0), rnd.copied.get(host, 0)
            if not follow or self.files.get(host) != files or copied:
                self.files[host] = files
                dirs = ", ".join(h.get("dirs") or []) or "no AIP_TENSORBOARD_LOG_DIR"
                print(f"{host}: {files} file(s), {size_bytes(int(h.get('bytes') or 0))} in {dirs} "
                      f"(+{copied} bytes)", flush=True)
        for p in rnd.problems:
            self._once(p, err=True)
        if rnd.hosts and rnd.files == 0 and rnd.state != QUEUED:
            self._once(f"no event files yet on {', '.join(rnd.hosts)}: the job writes them to its "
                       "AIP_TENSORBOARD_LOG_DIR" + ("; waiting" if follow and rnd.state not in TERMINAL else ""))


# -- TensorBoard -----------------------------------------------------------------------------------


def tensorboard_command() -> list[str] | None:
    """How to run TensorBoard: this Python's ``tensorboard`` package, else one on PATH."""
    if importlib.util.find_spec("tensorboard") is not None:
        return [sys.executable, "-m", "tensorboard.main"]
    found = shutil.which("tensorboard")
    return [found] if found else None


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_port(asked: int | None) -> int | None:
    """``asked`` when it is free; with none asked the first free of 6006.. or any free one."""
    if asked is not None:
        return asked if _free(asked) else None
    for port in range(DEFAULT_PORT, DEFAULT_PORT + PORT_TRIES):
        if _free(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_tensorboard(command: list[str], logdir: Path, port: int, poll: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*command, "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port),
                             "--reload_interval", f"{max(poll, 1.0):g}"], stdin=subprocess.DEVNULL)


def stop_tensorboard(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the command -----------------------------------------------------------------------------------


def _check(args: argparse.Namespace) -> str | None:
    """What is wrong with the options, before anything is asked of the hosts."""
    if not (args.poll > 0):
        return f"--poll {args.poll:g}: expected a number of seconds > 0"
    if args.port is not None and not 0 < args.port < 65536:
        return f"--port {args.port}: expected a port number 1..65535"
    return None


def run(args: argparse.Namespace, make_client: Callable[[argparse.Namespace], Any]) -> int:
    from tui.client import JobError, rigdeck_home

    bad = _check(args)
    if bad:
        print(f"rigdeck tensorboard: {bad}", file=sys.stderr)
        return EXIT_USAGE
    serve = args.serve and not args.once
    command = tensorboard_command() if serve else None
    if serve and command is None:
        print(f"rigdeck tensorboard: {INSTALL_HINT.format(python=sys.executable)}", file=sys.stderr)
        return EXIT_USAGE
    client = make_client(args)
    try:
        job_id = client.view(args.job).job_id
        copy = LocalCopy(Path(args.dir).expanduser() if args.dir else rigdeck_home() / "tensorboard" / job_id)
        try:
            copy.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            print(f"rigdeck tensorboard: --dir {copy.root}: expected a directory it can write to ({e.strerror or e})",
                  file=sys.stderr)
            return EXIT_USAGE
        if args.once:
            rnd = pull_once(client, job_id, copy)
            Reporter().round(rnd, follow=False)
            print(f"{job_id}: {copy.root}", flush=True)
            return EXIT_FAILED if rnd.failed else EXIT_OK
        return _follow(client, job_id, copy, command, args)
    except JobError as e:
        print(f"rigdeck tensorboard: {e}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        client.close()


def _follow(client: Any, job_id: str, copy: LocalCopy, command: list[str] | None, args: argparse.Namespace) -> int:
    proc = None
    if command is not None:
        port = pick_port(args.port)
        if port is None:
            print(f"rigdeck tensorboard: port {args.port} on 127.0.0.1 is in use: --port another", file=sys.stderr)
            return EXIT_FAILED
        proc = start_tensorboard(command, copy.root, port, args.poll)
        print(f"rigdeck tensorboard: TensorBoard at http://127.0.0.1:{port}/ over {copy.root} "
              "(loopback only); Ctrl+C stops", flush=True)
    # Ctrl+C and SIGTERM stop it whatever this process inherited (see tui.cli.signals).
    try:
        with stop_signals(interrupt):
            return _pull_until_ended(client, job_id, copy, proc, args.poll)
    except KeyboardInterrupt:
        print("rigdeck tensorboard: stopped", flush=True)
        return EXIT_OK
    finally:
        if proc is not None:
            stop_tensorboard(proc)


def _pull_until_ended(client: Any, job_id: str, copy: LocalCopy, proc: subprocess.Popen[bytes] | None,
                      poll: float) -> int:
    """Pull every ``poll`` seconds until the job has ended (its last bytes pulled after it did),
    then, with TensorBoard, wait for Ctrl+C. TensorBoard exiting by itself ends this too."""
    reporter = Reporter()
    for _ in _ticks(poll, proc):
        rnd = pull_once(client, job_id, copy)
        reporter.round(rnd, follow=True)
        if rnd.state in TERMINAL:
            more = "; TensorBoard goes on serving them until Ctrl+C" if proc is not None else ""
            print(f"{job_id} {rnd.state}: every event file it wrote is in {copy.root}{more}", flush=True)
            break
    if proc is not None:
        for _ in _ticks(1.0, proc):
            pass
    if proc is not None and proc.poll() is not None:
        print(f"rigdeck tensorboard: TensorBoard exited ({proc.returncode}); its output is above", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _ticks(every: float, proc: subprocess.Popen[bytes] | None) -> Iterator[None]:
    """Forever, one every ``every`` seconds (the first at once), while TensorBoard (if any) runs."""
    while proc is None or proc.poll() is None:
        yield None
        deadline = time.monotonic() + every
        while time.monotonic() < deadline and (proc is None or proc.poll() is None):
            time.sleep(min(0.2, every))
