"""The agent daemon on this machine: single instance, permissions, survival, and a fuzzed socket."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import protocol
from agent.daemon import Paths
from tests.kit import wait_until
from tests.kit.local import SocketClient

ROOT = Path(__file__).resolve().parent.parent


def attach(state_dir: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RIGDECK_SIM_GPUS": "2"}
    return subprocess.Popen(
        [sys.executable, "-m", "agent", "attach", "--state-dir", str(state_dir)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
    )


def daemon_pids(state_dir: Path) -> list[int]:
    """Live daemon processes serving this state dir, found by their command line."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            st_ = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if b"daemon" in cmd and str(state_dir).encode() in cmd and ") Z" not in st_:
            pids.append(int(entry))
    return pids


def read_msg(proc: subprocess.Popen[bytes]) -> dict:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "attach closed its output"
    return json.loads(line)


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "state"
    yield d
    for pid in daemon_pids(d):
        os.kill(pid, signal.SIGKILL)


def test_attach_starts_one_daemon_with_private_socket(state_dir: Path) -> None:
    p = attach(state_dir)
    hello = read_msg(p)
    assert hello["type"] == "hello" and hello["protocol"] == protocol.PROTOCOL_VERSION
    paths = Paths(str(state_dir))
    run = os.stat(paths.run_dir)
    sock = os.stat(paths.socket)
    assert stat.S_IMODE(run.st_mode) == 0o700 and run.st_uid == os.getuid()
    assert stat.S_ISSOCK(sock.st_mode) and stat.S_IMODE(sock.st_mode) == 0o600
    assert int(Path(paths.pidfile).read_text()) == hello["pid"]
    assert Path(paths.log).read_text().count("serving on") == 1
    assert p.stdin is not None
    p.stdin.close()
    p.wait(5)


def test_racing_attaches_leave_one_daemon(state_dir: Path) -> None:
    procs = [attach(state_dir) for _ in range(6)]
    with ThreadPoolExecutor(6) as pool:
        hellos = list(pool.map(read_msg, procs))
    assert len({h["pid"] for h in hellos}) == 1
    # the losers of the lock race exit (on a loaded machine that takes more than a moment)
    wait_until(lambda: daemon_pids(state_dir) == [hellos[0]["pid"]], 20, "one daemon left", step=0.1)
    for p in procs:
        assert p.stdin is not None
        p.stdin.close()
        p.wait(5)


def test_daemon_outlives_a_killed_attach(state_dir: Path) -> None:
    p = attach(state_dir)
    pid = read_msg(p)["pid"]
    p.kill()  # the SSH session dies hard
    p.wait(5)
    time.sleep(0.2)
    assert daemon_pids(state_dir) == [pid]
    q = attach(state_dir)
    assert read_msg(q)["pid"] == pid
    assert q.stdin is not None
    q.stdin.close()
    q.wait(5)


@pytest.fixture
def live(state_dir: Path) -> Iterator[SocketClient]:
    p = attach(state_dir)
    read_msg(p)
    c = SocketClient(Paths(str(state_dir)).socket)
    c.send(protocol.encode(protocol.hello()))
    yield c
    assert p.stdin is not None
    p.stdin.close()
    p.wait(5)


def test_requests_before_hello_are_refused(state_dir: Path) -> None:
    p = attach(state_dir)
    read_msg(p)
    c = SocketClient(Paths(str(state_dir)).socket)
    c.send(protocol.encode(protocol.request(1, "ping")))
    reply = c.recv()
    assert reply["ok"] is False and reply["error"]["code"] == protocol.NOT_HELLO
    c.send(protocol.encode({"type": "hello", "protocol": 99}))
    assert c.recv()["error"]["code"] == protocol.VERSION_MISMATCH
    assert p.stdin is not None
    p.stdin.close()
    p.wait(5)


def _expects_reply(line: bytes) -> bool:
    if not line.strip():
        return False
    try:
        msg = protocol.decode(line)
    except protocol.ProtocolError:
        return True
    return not (msg["type"] == "hello" and msg["protocol"] == protocol.PROTOCOL_VERSION)


fuzz_lines = st.lists(
    st.one_of(
        st.binary(max_size=300).map(lambda b: b.replace(b"\n", b"")),
        st.fixed_dictionaries(
            {"type": st.sampled_from(["request", "event", "response", "hello", "x"]),
             "id": st.one_of(st.integers(-5, 2**60), st.text(max_size=3), st.none()),
             "method": st.one_of(st.sampled_from(["ping", "version", "nope", ""]), st.integers()),
             "params": st.one_of(st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
                                 st.lists(st.integers(), max_size=2), st.none())}
        ).map(lambda d: json.dumps(d).encode()),
    ),
    min_size=1, max_size=15,
)


@given(lines=fuzz_lines)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzzed_daemon_answers_every_bad_message_and_stays_up(live: SocketClient, lines: list[bytes]) -> None:
    expected = sum(1 for ln in lines if _expects_reply(ln))
    live.send(b"".join(ln + b"\n" for ln in lines))
    for _ in range(expected):
        reply = live.recv()
        assert reply["type"] == "response"
    # Still alive and in step: a ping right after gets its own answer.
    live.send(protocol.encode(protocol.request(424242, "ping")))
    reply = live.recv()
    assert reply["id"] == 424242 and reply["ok"] is True


def test_oversized_message_gets_an_error_and_the_daemon_carries_on(live: SocketClient) -> None:
    live.send(b'{"type":"request","id":1,"method":"ping","params":{"x":"' + b"a" * (2 << 20) + b'"}}\n')
    reply = live.recv()
    assert reply["ok"] is False and reply["error"]["code"] == protocol.TOO_LARGE
    live.send(protocol.encode(protocol.request(2, "ping")))
    assert live.recv()["id"] == 2


class _BigSamples:
    """A collector whose samples are large, to fill socket buffers quickly."""

    def __init__(self) -> None:
        self.n = 0

    def sample(self) -> dict:
        self.n += 1
        return {"seq": self.n, "time": time.time(), "pad": "x" * 200_000}

    def set_interval(self, seconds: float) -> None:
        pass

    def close(self) -> None:
        pass


def test_the_socket_path_appears_only_once_it_accepts_connections(tmp_path: Path) -> None:
    """A client that sees the path can connect: it never names a bound, not yet listening socket.

    A stale socket left by a crashed daemon (and a stale staging name) are replaced.
    """
    from agent.daemon import Daemon

    d = Daemon(str(tmp_path / "state"), collector_factory=_BigSamples)
    assert d.acquire_lock()
    for stale in (d.paths.socket, d.paths.socket + ".new"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(stale)
        s.close()
    listening = d._listening_socket()
    try:
        st_ = os.stat(d.paths.socket)
        assert stat.S_ISSOCK(st_.st_mode) and stat.S_IMODE(st_.st_mode) == 0o600
        assert not os.path.exists(d.paths.socket + ".new")
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.settimeout(2)
        c.connect(d.paths.socket)  # no asyncio server yet: the backlog takes it
        c.close()
    finally:
        listening.close()
        d.release_lock()


def test_a_slow_reader_gets_the_latest_sample_not_a_backlog(tmp_path: Path) -> None:
    import asyncio
    import threading

    from agent.daemon import Daemon

    d = Daemon(str(tmp_path / "state"), collector_factory=_BigSamples)
    assert d.acquire_lock()
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=lambda: loop.run_until_complete(d.serve()), daemon=True)
    t.start()
    try:
        for _ in range(100):
            if os.path.exists(d.paths.socket):
                break
            time.sleep(0.05)
        c = SocketClient(d.paths.socket)
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        c.send(protocol.encode(protocol.hello()))
        c.send(protocol.encode(protocol.request(1, "subscribe", rate_hz=10)))
        time.sleep(4.0)  # ~40 samples of 200 kB are produced while we read nothing
        seqs = []
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            msg = c.recv()
            if msg.get("event") == "telemetry":
                seqs.append(msg["data"]["seq"])
                if msg["data"]["seq"] >= d._latest_seq - 1 and len(seqs) > 3:
                    break
        produced = d._latest_seq
        assert produced >= 30
        # Only a few samples were buffered on the way; the rest were skipped, not queued.
        assert len(seqs) < produced / 2, (len(seqs), produced)
        assert any(b - a > 1 for a, b in zip(seqs, seqs[1:], strict=False)), seqs
        assert seqs[-1] >= produced - 2
    finally:
        loop.call_soon_threadsafe(d._stop_now)
        t.join(5)
        d.release_lock()


class _CountedSamples:
    """A collector that counts its samples (the ticker thread's and the requests')."""

    def __init__(self) -> None:
        self.n = 0

    def sample(self) -> dict:
        self.n += 1
        return {"seq": self.n, "time": time.time(), "gpus": []}

    def set_interval(self, seconds: float) -> None:
        pass

    def close(self) -> None:
        pass


class _InProcess:
    """A Daemon serving on a thread of this process, for tests that look inside it."""

    def __init__(self, tmp_path: Path, collector: object) -> None:
        from agent.daemon import Daemon

        self.d = Daemon(str(tmp_path / "state"), collector_factory=lambda: collector)

    def start(self) -> _InProcess:
        import asyncio
        import threading

        assert self.d.acquire_lock()
        self.loop = asyncio.new_event_loop()
        self.t = threading.Thread(target=lambda: self.loop.run_until_complete(self.d.serve()), daemon=True)
        self.t.start()
        for _ in range(200):
            if os.path.exists(self.d.paths.socket):
                break
            time.sleep(0.05)
        return self

    def client(self) -> SocketClient:
        c = SocketClient(self.d.paths.socket)
        c.send(protocol.encode(protocol.hello()))
        return c

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.d._stop_now)
        self.t.join(10)
        assert not self.t.is_alive(), "the daemon did not stop"
        self.d.release_lock()


def _telemetry_lines(c: SocketClient, until_seq: int) -> dict[int, bytes]:
    """The raw telemetry lines this client got, by sample seq, until one of ``until_seq``."""
    got: dict[int, bytes] = {}
    while True:
        line = c.file.readline()
        assert line, "daemon closed the connection"
        msg = json.loads(line)
        if msg.get("event") == "telemetry":
            got[msg["data"]["seq"]] = line
            if msg["data"]["seq"] >= until_seq:
                return got


def test_every_subscriber_gets_the_same_event_encoded_once_per_sample(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agent import daemon

    encoded: list[int] = []
    real = daemon._encode

    def counting(msg: dict) -> bytes:
        if msg.get("event") == "telemetry":
            encoded.append(msg["data"]["seq"])
        return real(msg)

    monkeypatch.setattr(daemon, "_encode", counting)
    samples = _CountedSamples()
    srv = _InProcess(tmp_path, samples).start()
    try:
        a, b = srv.client(), srv.client()
        time.sleep(0.3)
        assert samples.n == 0  # nobody listens: the ticker takes none
        for rid, c in enumerate((a, b), 1):
            c.send(protocol.encode(protocol.request(rid, "subscribe", rate_hz=10)))
        got_a, got_b = _telemetry_lines(a, 8), _telemetry_lines(b, 8)
        both = set(got_a) & set(got_b)
        assert len(both) >= 5
        assert all(got_a[s] == got_b[s] for s in both)  # the same bytes
        # One encoding per sample, not one per client.
        assert sorted(encoded) == sorted(set(encoded)) and len(encoded) >= 8
        # Nobody listens again: the ticker stops (at 10 Hz it would take some 10 in a second).
        for rid, c in enumerate((a, b), 3):
            c.send(protocol.encode(protocol.request(rid, "unsubscribe")))
        time.sleep(0.5)
        stopped_at = samples.n
        time.sleep(1.0)
        assert samples.n == stopped_at
    finally:
        srv.stop()


def test_the_idle_job_watcher_looks_again_when_a_jobs_request_comes_not_on_a_timer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agent import daemon

    monkeypatch.setattr(daemon, "QUIET_WATCH_S", 3600.0)  # only a request can end its pause
    srv = _InProcess(tmp_path, _CountedSamples())
    looks: list[float] = []
    real = srv.d._supervise_jobs

    def counting() -> list:
        looks.append(time.monotonic())
        return real()

    srv.d._supervise_jobs = counting  # type: ignore[method-assign]
    srv.start()
    try:
        c = srv.client()
        c.send(protocol.encode(protocol.request(1, "ping")))
        assert c.recv()["ok"]
        deadline = time.monotonic() + 10
        while not looks and time.monotonic() < deadline:  # its first look, at the start
            time.sleep(0.05)
        time.sleep(1.5)
        # Quiet, no job: the watcher sleeps (it would look each second if a job were live).
        assert len(looks) == 1 and srv.d.jobs.quiet()
        c.send(protocol.encode(protocol.request(2, "job_release", job_id="none-here")))
        deadline = time.monotonic() + 10
        while len(looks) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(looks) == 2, "the request that may change jobs did not wake the job watcher"
    finally:
        srv.stop()


def _answer(c: SocketClient, rid: int) -> dict:
    """The answer to request ``rid`` (telemetry events on the way skipped)."""
    while True:
        msg = c.recv()
        if msg.get("id") == rid:
            return msg


def test_a_fresh_sample_is_taken_after_the_request_not_the_streams_last(tmp_path: Path) -> None:
    """Placement asks ``sample`` with ``fresh``: while a stream runs, the plain answer is the
    stream's last sample (up to a tick old: it can still show a stopped job's claims), the fresh
    one a sample taken after the request came."""
    samples = _CountedSamples()
    srv = _InProcess(tmp_path, samples).start()
    try:
        c = srv.client()
        c.send(protocol.encode(protocol.request(1, "subscribe", rate_hz=1 / 60)))  # one tick a minute
        _telemetry_lines(c, 1)  # the first subscriber's sample, at once
        c.send(protocol.encode(protocol.request(2, "sample")))
        assert _answer(c, 2)["result"]["seq"] == 1  # the stream's last
        before = samples.n
        c.send(protocol.encode(protocol.request(3, "sample", fresh=True)))
        got = _answer(c, 3)["result"]["seq"]
        assert got > before and samples.n > before  # taken for this request
        c.send(protocol.encode(protocol.request(4, "sample", fresh="yes")))  # only true asks it
        assert _answer(c, 4)["result"]["seq"] == 1
    finally:
        srv.stop()


def _ask(p: subprocess.Popen[bytes], rid: int, method: str, **params: object) -> dict:
    """Request ``method`` through the attach ``p``; its answer (telemetry skipped)."""
    assert p.stdin is not None
    p.stdin.write(protocol.encode(protocol.request(rid, method, **params)))
    p.stdin.flush()
    while True:
        msg = read_msg(p)
        if msg.get("id") == rid:
            return msg


def test_the_server_roles_attach_reaches_only_its_allow_list(state_dir: Path, tmp_path: Path) -> None:
    """``attach --role server`` (the server key's forced command, issue 46): the daemon refuses
    ``upgrade``, ``shutdown`` and any ``exec`` but the agent's own programs run by its interpreter,
    naming the role; the rest the server uses answers; a client can neither send a role line of
    its own to change it nor lose it. An attach without a role (a person's own) keeps everything."""
    from agent.daemon import Daemon
    from agent.roles import SERVER_METHODS, program_source

    # Every RPC is in the server's allow-list or refused to it on purpose: a new one is a choice.
    assert set(Daemon(str(tmp_path / "d")).methods) - SERVER_METHODS == {"upgrade", "shutdown", "unsubscribe",
                                                                         "set_rate", "image_have", "image_load"}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RIGDECK_SIM_GPUS": "2"}
    p = subprocess.Popen([sys.executable, "-m", "agent", "attach", "--state-dir", str(state_dir), "--role", "server"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    assert read_msg(p)["roles"] == ["server"]
    assert p.stdin is not None
    p.stdin.write(protocol.encode(protocol.hello()) + protocol.encode({"type": "role", "role": "nobody"}))
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.bin").write_text("x")
    listing = [sys.executable, "-c", program_source("listfiles.py"), str(tmp_path / "in")]
    attempts = {
        "upgrade": _ask(p, 1, "upgrade", path=str(tmp_path / "evil.pyz")),
        "shutdown": _ask(p, 2, "shutdown", force=True),
        "exec id": _ask(p, 3, "exec", argv=["id"], timeout_s=5),
        "exec the listing with sh": _ask(p, 4, "exec", argv=["/bin/sh", *listing[1:]], timeout_s=5),
        "set_rate": _ask(p, 5, "set_rate", rate_hz=50),
        "ping": _ask(p, 6, "ping"),
        "exec the listing": _ask(p, 7, "exec", argv=listing, timeout_s=30),
    }
    for what, got in attempts.items():
        print(f"server role: {what}: {json.dumps(got)[:240]}")
    for what in ("upgrade", "shutdown", "exec id", "exec the listing with sh", "set_rate"):
        err = attempts[what]["error"]
        assert err["code"] == protocol.REFUSED and "the server's key may" in err["message"], (what, err)
    assert "may not call 'upgrade'" in attempts["upgrade"]["error"]["message"]
    assert "agent/listfiles.py" in attempts["exec id"]["error"]["message"]
    assert attempts["ping"]["ok"] is True
    assert attempts["exec the listing"]["result"]["exit_code"] == 0
    assert json.loads(attempts["exec the listing"]["result"]["stdout"]) == {"files": ["a.bin"]}
    assert len(daemon_pids(state_dir)) == 1  # shutdown did not take it down
    p.stdin.close()
    p.wait(5)

    # A person's own attach: everything (exec of any argv here).
    mine = attach(state_dir)
    read_msg(mine)
    assert mine.stdin is not None
    mine.stdin.write(protocol.encode(protocol.hello()))
    assert _ask(mine, 1, "exec", argv=["id", "-u"], timeout_s=5)["result"]["stdout"].strip() == str(os.getuid())
    mine.stdin.close()
    mine.wait(5)


def test_an_attach_with_a_role_refuses_a_daemon_that_would_not_enforce_it(tmp_path: Path) -> None:
    """An older daemon (its hello names no roles) would take every request: the attach says so
    and bridges nothing."""
    import threading

    paths = Paths(str(tmp_path / "state"))
    paths.ensure()
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(paths.socket)
    srv.listen(1)
    got: list[bytes] = []

    def old_daemon() -> None:
        conn, _ = srv.accept()
        conn.sendall(protocol.encode(protocol.hello(agent_version="0.old")))
        conn.settimeout(10)
        got.append(conn.recv(65536))
        conn.close()

    t = threading.Thread(target=old_daemon, daemon=True)
    t.start()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "agent", "attach", "--state-dir", paths.state_dir, "--no-start",
                          "--role", "server"], input=protocol.encode(protocol.hello()), capture_output=True,
                         env=env, timeout=60)
    t.join(15)
    srv.close()
    print(out.stderr.decode())
    assert out.returncode == 1 and out.stdout == b""
    assert "(version 0.old) does not enforce the role 'server': refused" in out.stderr.decode()
    assert got == [b""]  # not one byte of the client's reached it


def test_a_slurm_template_not_of_its_shape_is_refused_and_the_daemon_carries_on(live: SocketClient,
                                                                                state_dir: Path) -> None:
    """``slurm_template`` (a Slurm job's plan template, agent/slurmstep.py) as a hostile
    hand might send it: each refused with what is wrong, nothing written; a good one is kept."""
    key = "00ff" * 4
    bad = [{}, {"key": "1; rm -rf ~", "template": {}}, {"key": key, "template": "x"},
           {"key": key, "template": {"base": {"job_id": "../../x"}, "hosts": {"n": {}}}},
           {"key": 5, "template": {"base": {"job_id": "j"}, "hosts": {}}}]
    for i, params in enumerate(bad):
        live.send(protocol.encode(protocol.request(i, "slurm_template", **params)))
        reply = live.recv()
        assert reply["ok"] is False and reply["error"]["code"] == protocol.BAD_PARAMS, reply
        assert reply["error"]["message"].startswith("cannot keep the template: "), reply
    jobs = state_dir / "jobs"
    assert not list(jobs.glob(".slurm-*")) if jobs.exists() else True
    good = {"base": {"job_id": "j-1"}, "hosts": {"n1": {"node": {"host": "h1"}, "command": ["true"],
                                                         "master_addr": "10.0.0.1", "env": {}}}}
    live.send(protocol.encode(protocol.request(99, "slurm_template", key=key, template=good)))
    reply = live.recv()
    assert reply["ok"] is True and json.loads((jobs / f".slurm-{key}.template.json").read_text()) == good, reply


def test_the_internal_commands_take_their_one_shape_and_anything_else_goes_to_argparse(tmp_path: Path) -> None:
    from agent import entry

    assert entry.parse(["rank", "--job-dir", "/j", "--rank", "3", "--local-rank", "1", "--", "python", "-u", "t.py"]) \
        == ("rank", {"--job-dir": "/j", "--rank": "3", "--local-rank": "1"}, ["python", "-u", "t.py"])
    assert entry.parse(["rank", "--job-dir", "/j", "--", "a", "--", "b"]) == ("rank", {"--job-dir": "/j"},
                                                                              ["a", "--", "b"])
    assert entry.parse(["jobhost", "--job-dir", "/j"]) == ("jobhost", {"--job-dir": "/j"}, [])
    assert entry.parse(["slurmhost", "--jobs-root", "/r", "--job-id", "j-1", "--template", "ab"]) == (
        "slurmhost", {"--jobs-root": "/r", "--job-id": "j-1", "--template": "ab"}, [])
    for argv in ([], ["daemon"], ["version"], ["rank", "--job-dir", "/j"], ["rank", "--job-dir=/j", "--", "x"],
                 ["rank", "--job-dir", "/j", "--rank", "x", "--", "y"], ["rank", "--rank", "1", "--", "y"],
                 ["jobhost"], ["jobhost", "--job-dir", "/j", "--job-dir", "/k"], ["jobhost", "--job-dir"],
                 ["jobhost", "--job-dir", "/j", "--", "x"], ["slurmhost", "--jobs-root", "/r"],
                 ["slurmhost", "--jobs-root", "/r", "--job-id", "j", "--other", "1"], ["rank", "-h"]):
        assert entry.parse(argv) is None, argv  # argparse's: its own errors and help, as before
    # through the fast path: the rank's command runs, its output kept, its exit code passed on
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-m", "agent", "rank", "--job-dir", str(tmp_path), "--rank", "0",
                          "--local-rank", "0", "--", "sh", "-c", "echo hi; exit 3"], capture_output=True, text=True,
                         cwd=root)
    assert out.returncode == 3 and (tmp_path / "logs" / "rank-0.log").read_text() == "hi\n", out
    assert json.loads((tmp_path / "ranks" / "rank-0.exit.json").read_text())["exit_code"] == 3
    # not its shape: argparse's words, as before
    out = subprocess.run([sys.executable, "-m", "agent", "rank", "--job-dir", str(tmp_path), "--"],
                         capture_output=True, text=True, cwd=root)
    assert out.returncode == 2 and "no command" in out.stderr, out


def test_a_jobs_gpu_health_comes_from_a_sample_at_most_half_a_second_old(state_dir: Path, tmp_path: Path) -> None:
    """The supervisor's look at a job (``job_status``) sees a GPU that failed since the last look
    once the sample it would reuse is older than JOB_HEALTH_MAX_AGE_S (0.5 s; it was 2 s, most
    of the time it took to find an XID on the bed)."""
    from agent.daemon import JOB_HEALTH_MAX_AGE_S

    p = attach(state_dir)
    read_msg(p)
    assert p.stdin is not None
    p.stdin.write(protocol.encode(protocol.hello()))
    plan = {"job_id": "hj", "name": "h", "launcher": "direct", "command": [sys.executable, "-c",
                                                                          "import time; time.sleep(60)"],
            "workdir": str(tmp_path), "env": {}, "restart_count": 0, "max_runtime_s": 120, "grace_s": 1,
            "nodes": [{"host": "local", "address": "127.0.0.1", "slots": 1, "gpus": [0]}], "node_index": 0,
            "master_addr": "127.0.0.1", "master_port": 29400}
    try:
        assert _ask(p, 1, "job_start", plan=plan).get("result") is not None
        first = _ask(p, 2, "job_status", job_id="hj")["result"]
        assert first["gpu_health"] == []  # a sample taken now, kept for the looks that follow
        faults = state_dir / "sim-gpu-faults.json"
        faults.write_text(json.dumps({"0": {"xid": 79}}))
        assert JOB_HEALTH_MAX_AGE_S <= 0.5
        time.sleep(0.7)
        got = _ask(p, 3, "job_status", job_id="hj")["result"]["gpu_health"]
        assert [(g["index"], g["health"], g["simulated"]) for g in got] == [(0, "unhealthy", True)], got
        assert "XID 79" in got[0]["reason"]
    finally:
        _ask(p, 4, "job_stop", job_id="hj", grace_s=0.5)
        p.stdin.close()
        p.wait(10)
