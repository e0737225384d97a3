"""Warm standby ranks (agent/standby.py, issue 48): which imports a standby does ahead, and a
standby's life on this machine's real processes: started outside the job (a stop's sweep passes
over it while it waits), adopted by the next attempt's job host as a rank with that attempt's
environment, refused for another command or interpreter, ended when its job succeeded or its job
host is gone, and stopped with the job host that adopted it. The restarts that adopt standbys on
the test bed's hosts are in tests/test_healing_hosts.py and tests/test_healing_alone.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from agent import standby
from agent.jobfiles import read_json
from agent.jobhost import processes_with_tag

ROOT = Path(__file__).resolve().parents[1]
AGENT = [sys.executable, "-m", "agent"]

SCRIPT = '''\
from __future__ import annotations
import json
import os, sys
import time
from collections import OrderedDict as _od
from . import sibling  # noqa
import mylib.sub
from mylib import thing
print("rank", os.environ.get("RANK"), "cwd", os.getcwd(), "json-early", "json" in sys.modules, flush=True)
time.sleep(float(os.environ.get("SLEEP", "0")))
'''

RUN = '''\
import json
import os
import sys
import time
print("rank", os.environ.get("RANK"), "cwd", os.getcwd(), "argv", sys.argv[1:], flush=True)
time.sleep(float(os.environ.get("SLEEP", "0")))
'''


@pytest.fixture
def job():
    """A short job directory (a Unix socket's path is at most 107 bytes) whose state says a live
    job host (this process) runs it; the script in its own directory."""
    d = Path(tempfile.mkdtemp(prefix="sb", dir="/tmp"))
    (d / "job" / "ranks").mkdir(parents=True)
    (d / "code").mkdir()
    (d / "code" / "run.py").write_text(RUN)
    state = {"state": "running", "jobhost_pid": os.getpid()}
    (d / "job" / "state.json").write_text(json.dumps(state))
    procs: list[subprocess.Popen] = []
    yield d, procs
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            p.wait()
    shutil.rmtree(d, ignore_errors=True)


def _env(tag: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIGDECK_")}
    env.update({"RIGDECK_JOB_ID": tag, "PYTHONPATH": str(ROOT), "RANK": "0", **extra})
    return env


def _start(d: Path, procs: list, env: dict[str, str], command: list[str] | None = None,
           imports: list[str] | None = None) -> subprocess.Popen:
    command = command or [sys.executable, str(d / "code" / "run.py"), "--x", "1"]
    with open(d / "job" / "launcher.log", "ab") as out:
        p = standby.spawn(AGENT, str(d / "job"), 0, command, str(d / "code"), env,
                          imports if imports is not None else ["json"], out.fileno())
    assert p is not None
    procs.append(p)
    # (its socket comes first, then its meta file: read when there, as the job host does)
    _until(lambda: os.path.exists(standby.slot_path(str(d / "job"), 0))
           and (read_json(str(d / "job" / "standby" / "slot-0.json")) or {}).get("child"), 20)
    return p


def _until(cond, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_warm_imports_are_the_scripts_top_level_imports_from_outside_its_own_directory(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "sibling.py").write_text("")
    cmd = [sys.executable, "-u", str(tmp_path / "train.py"), "--lr", "1"]
    assert standby.warm_imports(cmd, "/") == ["json", "os", "sys", "time", "collections", "mylib.sub", "mylib"]
    (tmp_path / "mylib").mkdir()  # now the user's own package beside the script: not imported ahead
    assert standby.warm_imports(cmd, "/") == ["json", "os", "sys", "time", "collections"]
    # relative to the working directory
    assert standby.warm_imports([sys.executable, "train.py"], str(tmp_path))[:2] == ["json", "os"]


@pytest.mark.parametrize("command", [
    ["python3", "-m", "train"],  # a module: no standby
    ["python3", "-c", "print(1)"],
    ["python3", "-X", "importtime", "train.py"],  # an option with a value
    ["torchrun", "train.py"],  # not an interpreter
    ["python3", "missing.py"],
    ["python3", "notes.txt"],
    ["python3"],
])
def test_no_standby_for_a_command_that_is_not_a_script(tmp_path, command):
    (tmp_path / "train.py").write_text("import json\n")
    assert standby.warm_imports(command, str(tmp_path)) is None


def test_a_script_that_does_not_parse_gets_no_standby(tmp_path):
    (tmp_path / "train.py").write_text("import (\n")
    assert standby.warm_imports(["python3", "train.py"], str(tmp_path)) is None


def test_a_standby_waits_outside_the_job_then_runs_as_the_adopting_attempts_rank(job):
    d, procs = job
    env = _env("sbjob1", SLEEP="0")
    _start(d, procs, env)
    meta = json.loads((d / "job" / "standby" / "slot-0.json").read_text())
    waiting = {meta["pid"], meta["child"]}
    # waiting: not the job's (a stop's sweep by the job's tag passes over it)
    assert not set(processes_with_tag("sbjob1")) & waiting
    got = standby.adopt(str(d / "job"), 0, 5, dict(env, RANK="5"), [sys.executable, str(d / "code" / "run.py"),
                                                                  "--x", "1"], str(d / "code"), [])
    assert got is not None and got["ok"] and got["wrapper"] == meta["pid"] and got["child"] == meta["child"]
    rank = standby.Adopted(got["wrapper"], str(d / "job" / "ranks" / "rank-5.exit.json"))
    assert rank.wait(20) == 0
    log = (d / "job" / "logs" / "rank-5.log").read_text()
    assert f"rank 5 cwd {d / 'code'} argv ['--x', '1']" in log  # the adopter's environment, its rank
    record = json.loads((d / "job" / "ranks" / "rank-5.json").read_text())
    assert record["pid"] == meta["child"] and record["wrapper_pid"] == meta["pid"]
    assert json.loads((d / "job" / "ranks" / "rank-5.exit.json").read_text())["exit_code"] == 0
    assert not (d / "job" / "standby" / "slot-0.sock").exists()  # never adopted twice
    assert standby.adopt(str(d / "job"), 0, 5, env, ["x"], str(d / "code"), []) is None


def test_a_standby_adopted_before_its_imports_are_done_runs_the_rank_once_they_are(job):
    """The restart came while the standby still imported (its word that it is ready comes after
    the adoption): the rank runs all the same, its output in its log, exit 0 (it once ended
    quietly with exit 0 instead, a rank that passed without running)."""
    d, procs = job
    (d / "lib").mkdir()
    (d / "lib" / "slowmod.py").write_text("import time\ntime.sleep(2)\n")
    env = _env("sbjob7", PYTHONPATH=f"{ROOT}{os.pathsep}{d / 'lib'}")
    _start(d, procs, env, imports=["slowmod"])
    meta = json.loads((d / "job" / "standby" / "slot-0.json").read_text())
    assert not meta.get("ready")
    got = standby.adopt(str(d / "job"), 0, 2, dict(env, RANK="2"),
                        [sys.executable, str(d / "code" / "run.py"), "--x", "1"], str(d / "code"), [])
    assert got is not None
    assert standby.Adopted(got["wrapper"], str(d / "job" / "ranks" / "rank-2.exit.json")).wait(30) == 0
    assert "rank 2 cwd" in (d / "job" / "logs" / "rank-2.log").read_text()


NICE_RUN = """\
import os, sys, threading, time
import nicemod
here = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
print("imported at nice", nicemod.AT, "rank runs at nice", here, flush=True)
"""


def test_a_standbys_imports_take_only_the_cpu_the_job_leaves_and_its_rank_runs_at_its_own_priority(job):
    """The imports run in a thread at nice 19 (a job using every core runs on as fast while its
    standbys warm up); the thread that then runs the rank keeps the priority it was started with."""
    d, procs = job
    (d / "lib").mkdir()
    (d / "lib" / "nicemod.py").write_text(
        "import os, threading\nAT = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())\n")
    (d / "code" / "nice.py").write_text(NICE_RUN)
    command = [sys.executable, str(d / "code" / "nice.py")]
    env = _env("sbjob9", PYTHONPATH=f"{ROOT}{os.pathsep}{d / 'lib'}")
    _start(d, procs, env, command=command, imports=["nicemod"])
    _until(lambda: json.loads((d / "job" / "standby" / "slot-0.json").read_text()).get("ready"), 20)
    got = standby.adopt(str(d / "job"), 0, 3, dict(env, RANK="3"), command, str(d / "code"), [])
    assert got is not None and got["ok"]
    assert standby.Adopted(got["wrapper"], str(d / "job" / "ranks" / "rank-3.exit.json")).wait(20) == 0
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    assert f"imported at nice 19 rank runs at nice {mine}" in (d / "job" / "logs" / "rank-3.log").read_text()


def test_an_adopted_standby_is_the_jobs_for_a_stop_and_dies_with_its_job_host(job):
    d, procs = job
    env = _env("sbjob2", SLEEP="60")
    _start(d, procs, env)
    adopter = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # the adopter answers for itself here: its pid rides in the message, as a job host's does
        body_env = dict(env, RANK="1")
        got = _adopt_as(d, body_env, adopter.pid)
        assert got is not None
        _until(lambda: (d / "job" / "ranks" / "rank-1.json").exists(), 10)
        child = json.loads((d / "job" / "ranks" / "rank-1.json").read_text())["pid"]
        assert {got["wrapper"], child} <= set(processes_with_tag("sbjob2"))
        t = time.monotonic()
        adopter.kill()
        adopter.wait()
        rank = standby.Adopted(got["wrapper"], str(d / "job" / "ranks" / "rank-1.exit.json"))
        assert rank.wait(15) == 128 + signal.SIGTERM  # stopped as a spawned wrapper's rank is
        assert time.monotonic() - t < 5
        assert json.loads((d / "job" / "ranks" / "rank-1.exit.json").read_text())["signal"] == signal.SIGTERM
    finally:
        adopter.kill()
        adopter.wait()


def _adopt_as(d: Path, env: dict[str, str], adopter: int) -> dict | None:
    """An adoption whose message names ``adopter`` as the job host (standby.adopt names itself)."""
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(standby.slot_path(str(d / "job"), 0))
    s.sendall(json.dumps({"env": env, "rank": 1, "local_rank": 0, "cwd": str(d / "code"), "adopter": adopter,
                          "command": [sys.executable, str(d / "code" / "run.py"), "--x", "1"]}).encode())
    s.shutdown(socket.SHUT_WR)
    answer = s.recv(65536)
    s.close()
    got = json.loads(answer)
    return got if got.get("ok") else None


@pytest.mark.parametrize("change, why", [
    ({"command": ["python3", "other.py"]}, "another command"),
    ({"cwd": "/"}, "another working directory"),
    ({"env": {"PYTHONPATH": "/elsewhere"}}, "the interpreter's variables differ (PYTHONPATH)"),
    ({"env": {"LD_PRELOAD": "/x.so"}}, "the interpreter's variables differ (LD_PRELOAD)"),
    ({"rank": -1}, "rank is not an integer >= 0"),
    ({"rank": True}, "rank is not an integer >= 0"),
    ({"adopter": "1"}, "adopter is not an integer >= 0"),
    ({"env": {"RANK": 3}}, "env is not an object of strings"),
    ({"env": []}, "env is not an object of strings"),
    ("garbage", "unreadable adoption"),
    ([1, 2], "not an object"),
])
def test_a_standby_refuses_what_it_was_not_started_for_and_keeps_waiting(job, change, why):
    import socket

    d, procs = job
    env = _env("sbjob3")
    _start(d, procs, env)
    good = {"env": env, "rank": 0, "local_rank": 0, "cwd": str(d / "code"), "adopter": os.getpid(),
            "command": [sys.executable, str(d / "code" / "run.py"), "--x", "1"]}
    if isinstance(change, dict):
        bad = dict(good)
        for k, v in change.items():
            bad[k] = dict(env, **v) if k == "env" and isinstance(v, dict) and "RANK" not in v else v
        body = json.dumps(bad).encode()
    elif isinstance(change, list):
        body = json.dumps(change).encode()
    else:
        body = change.encode()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(standby.slot_path(str(d / "job"), 0))
    s.sendall(body)
    s.shutdown(socket.SHUT_WR)
    answer = json.loads(s.recv(65536))
    s.close()
    assert answer["ok"] is False and answer["why"].startswith(why)
    assert not (d / "job" / "ranks" / "rank-0.json").exists()  # nothing of a rank was started
    # still waiting, and the right adoption takes it
    got = standby.adopt(str(d / "job"), 0, 0, env, good["command"], str(d / "code"), [])
    assert got is not None
    assert standby.Adopted(got["wrapper"], str(d / "job" / "ranks" / "rank-0.exit.json")).wait(20) == 0


def test_a_standby_ends_when_its_job_succeeded(job):
    d, procs = job
    p = _start(d, procs, _env("sbjob4"))
    child = json.loads((d / "job" / "standby" / "slot-0.json").read_text())["child"]
    (d / "job" / "state.json").write_text(json.dumps({"state": "succeeded", "jobhost_pid": os.getpid()}))
    assert p.wait(10) == 0
    _until(lambda: not os.path.exists(f"/proc/{child}") or _zombie(child), 10)
    assert not list((d / "job" / "standby").iterdir())  # its socket, meta and marks are gone


def test_a_standby_ends_once_no_job_host_of_its_job_has_lived_for_its_linger(job):
    d, procs = job
    p = _start(d, procs, _env("sbjob5", RIGDECK_STANDBY_LINGER_S="1"))
    (d / "job" / "state.json").write_text(json.dumps({"state": "failed", "jobhost_pid": os.getpid()}))
    assert p.wait(15) == 0


def test_the_job_hosts_end_stops_its_waiting_standbys(job):
    d, procs = job
    p = _start(d, procs, _env("sbjob6"))
    assert standby.end_all(str(d / "job")) == [p.pid]
    assert p.wait(10) == -signal.SIGKILL


def test_an_adopted_wrapper_gone_without_its_record_reads_as_killed(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    gone = standby.Adopted(p.pid, str(tmp_path / "rank-0.exit.json"))
    assert gone.poll() == -signal.SIGKILL
    (tmp_path / "rank-1.exit.json").write_text(json.dumps({"exit_code": None, "signal": 15}))
    assert standby.Adopted(p.pid, str(tmp_path / "rank-1.exit.json")).poll() == 128 + 15
    live = standby.Adopted(os.getpid(), str(tmp_path / "none.json"))
    assert live.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        live.wait(0.2)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
