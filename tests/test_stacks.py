"""agent.stacks and agent/rankboot: a live rank's Python stacks, taken without stopping it."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agent import stacks

# "ready" is printed from inside wait_for_peers: once the test reads it, the main thread is in
# there (printed before, a loaded machine could dump it still on the line of the print).
RANK_SCRIPT = """
import threading, time

def wait_for_peers():
    print("ready", flush=True)
    while True:
        time.sleep(120)

def heartbeat():
    while True:
        time.sleep(1)

threading.Thread(target=heartbeat, daemon=True).start()
wait_for_peers()
"""


def _start_rank(tmp_path: Path, job_dir: Path, rank: int, extra_path: str = "") -> subprocess.Popen[str]:
    script = tmp_path / "train.py"
    script.write_text(RANK_SCRIPT)
    boot = stacks.boot_dir()
    assert boot is not None
    env = dict(os.environ, RIGDECK_JOB_ID="job-s1", PYTHONPATH=os.pathsep.join(p for p in (boot, extra_path) if p))
    env[stacks.ENV_STACKS_DIR] = stacks.rank_stacks_dir(str(job_dir), rank)
    p = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def test_a_live_rank_writes_its_stacks_on_request_and_keeps_running(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    (job_dir / "logs").mkdir(parents=True)
    # the user's own sitecustomize still loads after rigdeck's
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text(
        f"import os\nopen(os.path.join({str(tmp_path)!r}, 'theirs-' + str(os.getpid())), 'w').close()\n")
    rank = _start_rank(tmp_path, job_dir, 3, extra_path=str(theirs))
    # a process of the job that is not armed (not Python): never signalled, SIGUSR1 would kill it
    sleeper = subprocess.Popen(["sleep", "60"], env=dict(os.environ, RIGDECK_JOB_ID="job-s1"))
    try:
        got = stacks.collect(str(job_dir), "job-s1", why="no step for 20 s", timeout=10.0)
        assert got["armed"] == 1
        (one,) = got["stacks"]
        assert (one["rank"], one["pid"]) == (3, rank.pid)
        assert "in wait_for_peers" in one["text"] and "in heartbeat" in one["text"]  # every thread
        assert one["top"].startswith("train.py:") and one["top"].endswith(" in wait_for_peers"), one["top"]
        assert one["in_collective"] is False
        log = (job_dir / "logs" / "rank-3.log").read_text()
        assert f"--- rigdeck: Python stacks of rank 3 (pid {rank.pid}), no step for 20 s ---" in log
        assert "wait_for_peers" in log
        time.sleep(0.3)
        assert rank.poll() is None and sleeper.poll() is None  # both still run
        assert (tmp_path / f"theirs-{rank.pid}").exists()
        # a second request returns only the new dump
        again = stacks.collect(str(job_dir), "job-s1", timeout=10.0)["stacks"][0]["text"]
        assert again.count("in wait_for_peers") == 1
    finally:
        rank.kill()
        sleeper.kill()
        rank.wait()
        sleeper.wait()
    # the process is gone: its pid file is not signalled again
    assert stacks.collect(str(job_dir), "job-s1", timeout=0.5) == {"stacks": [], "armed": 0}


def test_a_rank_waiting_in_a_collective_is_told_from_the_one_that_is_not() -> None:
    waiting = (
        "Thread 0x00007f01 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 324 in wait\n'
        "\n"
        "Current thread 0x00007f00 (most recent call first):\n"
        '  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2501 in all_reduce\n'
        '  File "/home/u/train.py", line 41 in step\n'
        '  File "/home/u/train.py", line 60 in <module>\n'
    )
    assert stacks.summarize(waiting) == {"top": "train.py:41 in step", "in_collective": True}
    stuck = 'Current thread 0x00007f00 (most recent call first):\n  File "/home/u/train.py", line 12 in load\n'
    assert stacks.summarize(stuck) == {"top": "train.py:12 in load", "in_collective": False}
    assert stacks.summarize("") == {"top": None, "in_collective": False}
    # a rank waiting in runtime.Checkpointer's own collectives (a snapshot's exchange under
    # owner = "all", a restore's): waiting for the others too
    snapshot = ('Current thread 0x00007f00 (most recent call first):\n'
                '  File "/srv/agent/runtime/checkpoint.py", line 1080 in _wait_collective\n'
                '  File "/srv/agent/runtime/checkpoint.py", line 990 in _exchange_bytes\n'
                '  File "/home/u/train.py", line 77 in main\n')
    assert stacks.summarize(snapshot)["in_collective"] is True


def test_a_real_agent_takes_a_running_jobs_stacks_and_reports_a_simulated_fault(tmp_path: Path) -> None:
    """Through the daemon and its typed client (local transport): the rank wrapper arms the rank,
    ``job_stacks`` takes its stacks into the rank's log; the faults file makes a paper GPU unhealthy."""
    import json

    from agent import gpuhealth
    from agent.gpuhealth import SIM_FAULTS_FILE
    from tui.control.hostlinks import HostLinks
    from tui.model.inventory import HostSpec, Inventory
    from tui.remote.bundle import build_agent

    state = tmp_path / "state"
    spec = HostSpec(name="here", address="localhost", transport="local", python=sys.executable,
                    state_dir=str(state), sim_gpus=2)
    bundle = build_agent(tmp_path / "cache")
    script = tmp_path / "train.py"
    script.write_text(RANK_SCRIPT)
    with HostLinks(Inventory(hosts=(spec,), path=None, known_hosts=tmp_path / "kh"),
                    bundle_factory=lambda: bundle) as ctl:
        a = ctl.agent("here")
        job_id = f"stacks-{int(time.time())}"
        node = {"host": "here", "address": "127.0.0.1", "slots": 1, "gpus": []}
        a.job_start(plan={"job_id": job_id, "launcher": "direct", "nodes": [node], "node_index": 0,
                          "master_addr": "127.0.0.1", "master_port": a.probe_port(addr="127.0.0.1"),
                          "workdir": str(tmp_path), "command": [sys.executable, str(script)]})
        try:
            deadline = time.monotonic() + 30
            # The stacks wanted are those of a rank waiting for its peers: after it said so
            # (taken earlier, its top can be the module's line that starts a thread).
            while "ready" not in a.job_logs(job_id=job_id, rank=0, max_bytes=1 << 16).text:
                assert time.monotonic() < deadline, "the rank never said it was ready"
                time.sleep(0.2)
            while True:
                got = a.job_stacks(job_id=job_id, why="a test asked")
                if got.stacks or time.monotonic() > deadline:
                    break
                time.sleep(0.3)
            assert got.armed == 1 and [s.rank for s in got.stacks] == [0]
            top = got.stacks[0].top or ""
            assert top.startswith("train.py:") and top.endswith(" in wait_for_peers"), top
            assert a.job_status(job_id=job_id).get("state") == "running"  # taking stacks stops nothing
            log = a.job_logs(job_id=job_id, rank=0, max_bytes=1 << 20).text  # what `rigdeck logs` reads
            assert "Python stacks of rank 0" in log and "a test asked" in log
        finally:
            a.job_stop(job_id=job_id, grace_s=1.0)

        (state / SIM_FAULTS_FILE).write_text(json.dumps({"1": {"xid": 79}}))
        gpus = a.sample(timeout=30)["gpus"]
        assert [(g["health"], g["health_reason"]) for g in gpus] == [
            ("ok", None), ("unhealthy", "XID 79: GPU has fallen off the bus")]
        assert a.gpu_health_clear(gpus=[1]) == []  # a simulated fault is not remembered: its entry is the fault
        # a GPU a job host held out (it moved its ranks off it): unhealthy until an undrain clears it
        (state / SIM_FAULTS_FILE).write_text("{}")
        gpuhealth.hold_out(str(state), 0, "XID 79: GPU has fallen off the bus (simulated)", "j9", "here's job host",
                           time.time())
        gpus = a.sample(timeout=30, fresh=True)["gpus"]
        assert [(g["health"], g["health_reason"]) for g in gpus] == [
            ("unhealthy", "XID 79: GPU has fallen off the bus (simulated); held out by here's job host (job j9) "
                          "until undrained"), ("ok", None)]
        assert a.gpu_health_clear(gpus=[0]) == [0]
        assert [g["health"] for g in a.sample(timeout=30, fresh=True)["gpus"]] == ["ok", "ok"]
        a.shutdown(force=True)


@contextlib.contextmanager
def _job_on_a_local_host(tmp_path: Path, prefix: str, stream_hz: float | None = None,
                         gpu: int = 0) -> Iterator[tuple[Any, str, Path]]:
    """A ``sleep 60`` job on GPU ``gpu`` of a local host with 2 simulated GPUs (the daemon's state
    under ``tmp_path``): its agent, job id and state directory; ``stream_hz``: a telemetry stream
    subscribed first. The job is stopped and the daemon shut down after."""
    from tui.control.hostlinks import HostLinks
    from tui.model.inventory import HostSpec, Inventory
    from tui.remote.bundle import build_agent

    state = tmp_path / "state"
    spec = HostSpec(name="here", address="localhost", transport="local", python=sys.executable,
                    state_dir=str(state), sim_gpus=2)
    bundle = build_agent(tmp_path / "cache")
    with HostLinks(Inventory(hosts=(spec,), path=None, known_hosts=tmp_path / "kh"),
                    bundle_factory=lambda: bundle) as ctl:
        a = ctl.agent("here")
        if stream_hz is not None:
            a.subscribe(rate_hz=stream_hz)
        job_id = f"{prefix}-{int(time.time())}"
        node = {"host": "here", "address": "127.0.0.1", "slots": 1, "gpus": [gpu]}
        a.job_start(plan={"job_id": job_id, "launcher": "direct", "nodes": [node], "node_index": 0,
                          "master_addr": "127.0.0.1", "master_port": a.probe_port(addr="127.0.0.1"),
                          "workdir": str(tmp_path), "command": ["sleep", "60"]})
        try:
            yield a, job_id, state
        finally:
            a.job_stop(job_id=job_id, grace_s=1.0)
            a.shutdown(force=True)


def test_job_status_carries_the_hosts_failing_gpus_while_the_job_runs(tmp_path: Path) -> None:
    import json

    from agent.gpuhealth import SIM_FAULTS_FILE

    with _job_on_a_local_host(tmp_path, "health") as (a, job_id, state):
        assert a.job_status(job_id=job_id).get("gpu_health") == []
        (state / SIM_FAULTS_FILE).write_text(json.dumps({"0": {"xid": 79}, "1": {"throttle": "hw_thermal"}}))
        time.sleep(2.2)  # the answer is at most 2 s old
        assert a.job_status(job_id=job_id).get("gpu_health") == [
            {"index": 0, "health": "unhealthy", "reason": "XID 79: GPU has fallen off the bus", "simulated": True},
            {"index": 1, "health": "warn", "reason": "throttled: hardware thermal slowdown", "simulated": True}]
        a.job_stop(job_id=job_id, grace_s=1.0)
        deadline = time.monotonic() + 20
        while (st := a.job_status(job_id=job_id)).get("state") not in ("stopped", "failed", "succeeded"):
            assert time.monotonic() < deadline, st
            time.sleep(0.2)
        assert "gpu_health" not in st  # an ended job: nothing to watch


def test_a_fresh_health_answer_is_taken_now_even_while_a_stream_runs(tmp_path: Path) -> None:
    """A supervisor that asks for fresh health (a rank died: was it its GPU?) gets a sample taken
    now, not the stream's last one, which can be up to a tick older than the fault."""
    import json

    from agent.gpuhealth import SIM_FAULTS_FILE

    # a stream whose samples stay a minute old
    # GPU 1: a claim is this machine's, and the other local-host tests' jobs hold GPU 0 (the host's
    # failing GPUs are reported whichever the job holds)
    with _job_on_a_local_host(tmp_path, "fresh", stream_hz=1 / 60, gpu=1) as (a, job_id, state):
        assert a.job_status(job_id=job_id, fresh_health=True).get("gpu_health") == []
        (state / SIM_FAULTS_FILE).write_text(json.dumps({"0": {"xid": 79}}))
        assert a.job_status(job_id=job_id, fresh_health=True).get("gpu_health") == [
            {"index": 0, "health": "unhealthy", "reason": "XID 79: GPU has fallen off the bus", "simulated": True}]


# A rank whose program has ended and whose process is still finalizing: it blocks in a C exit
# handler (as a library's teardown can), after faulthandler has handed SIGUSR1 back.
EXITING_SCRIPT = """
import ctypes, sys
libc = ctypes.CDLL(None)
libc.__cxa_atexit(ctypes.cast(libc.pause, ctypes.c_void_p), None, None)  # runs after Python is done
print("ready", flush=True)
"""


def _sig_masks(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/status") as f:
        return {k: int(v, 16) for k, v in (line.split(":\t") for line in f if line.startswith(("SigIgn", "SigCgt")))}


def test_a_rank_signalled_for_its_stacks_while_it_exits_is_not_killed_nor_signalled(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    (job_dir / "ranks").mkdir(parents=True)
    script = tmp_path / "train.py"
    script.write_text(EXITING_SCRIPT)
    boot = stacks.boot_dir()
    assert boot is not None
    rank_dir = Path(stacks.rank_stacks_dir(str(job_dir), 0))
    env = dict(os.environ, RIGDECK_JOB_ID="job-s2", PYTHONPATH=boot, **{stacks.ENV_STACKS_DIR: str(rank_dir)})
    p = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        (job_dir / "ranks" / "rank-0.json").write_text(f'{{"rank": 0, "pid": {p.pid}}}')
        usr1 = 1 << (10 - 1)
        deadline = time.monotonic() + 30
        # Python has finalized: faulthandler's handler is gone (what it gave back is in place)
        while _sig_masks(p.pid)["SigCgt"] & usr1 and time.monotonic() < deadline:
            time.sleep(0.05)
        masks = _sig_masks(p.pid)
        assert not masks["SigCgt"] & usr1 and masks["SigIgn"] & usr1  # ignored, not SIG_DFL (death)
        assert (rank_dir / f"exiting-{p.pid}").exists()  # the exit hook's mark
        assert stacks.ranks_ending(str(job_dir)) == {0: True}
        assert stacks.collect(str(job_dir), "job-s2", timeout=0.5) == {"stacks": [], "armed": 0}  # not signalled
        os.kill(p.pid, 10)  # a stack signal sent anyway (a watch that read the marks a moment before)
        time.sleep(0.5)
        assert p.poll() is None  # still on its way out, not killed by signal 10
    finally:
        p.terminate()
        assert p.wait(timeout=30) == -15


def test_a_rank_is_ending_once_it_has_exited_or_marked_its_exit(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    ranks = job_dir / "ranks"
    ranks.mkdir(parents=True)
    assert stacks.ranks_ending(str(job_dir)) == {}
    for r, pid in ((0, 101), (1, 102), (2, 103)):
        (ranks / f"rank-{r}.json").write_text(f'{{"rank": {r}, "pid": {pid}}}')
    (ranks / "rank-3.json").write_text("{not json")  # half written: not ending
    (ranks / "rank-0.exit.json").write_text('{"rank": 0, "exit_code": 0}')
    Path(stacks.rank_stacks_dir(str(job_dir), 1)).mkdir(parents=True)
    Path(stacks.rank_stacks_dir(str(job_dir), 1), "exiting-102").touch()
    Path(stacks.rank_stacks_dir(str(job_dir), 1), "exiting-999").touch()  # a worker of the rank: not the rank
    Path(stacks.rank_stacks_dir(str(job_dir), 2)).mkdir(parents=True)
    Path(stacks.rank_stacks_dir(str(job_dir), 2), "exiting-102").touch()  # another rank's pid
    assert stacks.ranks_ending(str(job_dir)) == {0: True, 1: True, 2: False, 3: False}


def test_a_job_host_does_not_judge_its_ranks_hung_once_each_is_on_its_way_out(tmp_path: Path) -> None:
    import json

    from agent import jobhost

    job_dir = tmp_path / "jobs" / "job-s3"
    (job_dir / "metrics").mkdir(parents=True)
    (job_dir / "ranks").mkdir()
    (job_dir / "plan.json").write_text(json.dumps({
        "job_id": "job-s3", "node_index": 0, "launcher": "direct", "health": {"hang_timeout": 1},
        "nodes": [{"host": "h1", "address": "10.0.0.1", "slots": 2, "gpus": []}]}))
    jh = jobhost.JobHost(str(job_dir))
    with open(job_dir / "metrics" / "rank-0.jsonl", "a") as f:
        f.write('{"step": 40, "rank": 0}\n')
    for r in (0, 1):
        (job_dir / "ranks" / f"rank-{r}.json").write_text(f'{{"rank": {r}, "pid": {200 + r}}}')
    (job_dir / "ranks" / "rank-0.exit.json").write_text('{"rank": 0, "exit_code": 0}')
    Path(stacks.rank_stacks_dir(str(job_dir), 1)).mkdir(parents=True)
    assert jh.watch_progress() is None  # its first look: the step
    time.sleep(1.2)
    mark = Path(stacks.rank_stacks_dir(str(job_dir), 1), "exiting-201")
    mark.touch()
    assert jh.watch_progress() is None and jh.state.get("hang") is None  # past hang_timeout, both ending
    mark.unlink()  # rank 1 silent in its program: a hang, as before
    hang = jh.watch_progress()
    assert hang is not None and jh.state["hang"] == hang and "after step 40" in hang["message"], hang
