"""The controller as a service, on the test bed: `rigdeck server setup` and `start` put it on h1,
the CLI and the app reach it over one SSH channel, and it manages jobs with no workstation
process alive: gang restarts, the queue, a restart of the server itself, a lost path to it; a
Prometheus scrapes its /metrics ([server] metrics_listen) and `rigdeck exporter` while a job trains.

Everything is real: sshd on each host, the server's own key (restricted on every host to the
agent's attach), `rigdeck serve` in a venv on h1, agents, ranks, iptables, Prometheus."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._require import PROMETHEUS_MISSING, PROMTOOL_MISSING, require
from tests.conftest import fish_bed
from tests.kit import ROOT, TICKER, clizygote, wait_until
from tests.kit.prom import Exporter, get, prometheus, promtool_check, query, read
from tests.kit.specs import expected_objective, pipeline_step, steps_of, sweep_spec
from tests.test_ui_e2e import tmux_env  # noqa: F401, F811  (a fixture)
from tests.testbed import TestBed

pytestmark = pytest.mark.testbed
HOOK_PORT = 18089  # the notify test's webhook receiver, on h2
METRICS_PORT = 19464  # the server's /metrics, on h1's address ([server] metrics_listen)
TRAIN = ROOT / "tests" / "jobscripts" / "heal_train.py"


class Operator:
    """One person at a workstation: their own RIGDECK_HOME, the shared inventory."""

    def __init__(self, inventory: Path, home: Path):
        self.inventory = inventory
        self.home = home
        self.env = {**os.environ, "RIGDECK_HOME": str(home), "PYTHONPATH": str(ROOT)}
        self.env.pop("RIGDECK_SERVER", None)

    def run(self, *args: str, check: bool = True, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        proc = clizygote.run([*args, "-i", str(self.inventory)], self.env, timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"rigdeck {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def json(self, *args: str, check: bool = True, timeout: float = 180) -> Any:
        return json.loads(self.run(*args, "--json", check=check, timeout=timeout).stdout)

    def spec(self, name: str, body: str) -> Path:
        path = self.home / f"{name}.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'name = "{name}"\n' + body)
        return path


def workstation_rigdeck(homes: list[Path]) -> list[int]:
    """Processes of these operators still alive on the workstation: any process whose
    environment carries one of their RIGDECK_HOMEs (every CLI and app they started does)."""
    marks = {f"RIGDECK_HOME={h}".encode() for h in homes}
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            env = set(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if env & marks:
            out.append(int(pid))
    return out


def rank_pids(bed: TestBed, host: int, job_id: str) -> dict[int, int]:
    """rank -> pid of the job's training processes on a host, read there from /proc."""
    code = r"""
import json, os, sys
out = {}
for pid in os.listdir('/proc'):
    if not pid.isdigit():
        continue
    try:
        env = dict(kv.split('=', 1) for kv in open(f'/proc/{pid}/environ', 'rb').read().decode(
            'utf-8', 'replace').split('\0') if '=' in kv)
        cmd = open(f'/proc/{pid}/cmdline', 'rb').read()
    except OSError:
        continue
    # the training process itself, not its rank wrapper (the agent's, whose argv holds the command)
    if env.get('RIGDECK_JOB_ID') == sys.argv[1] and 'RANK' in env and b'ticker' in cmd and b'agent' not in cmd:
        out[env['RANK']] = int(pid)
print(json.dumps(out))
"""
    res = bed.exec(host, [sys.executable, "-c", code, job_id])
    return {int(k): v for k, v in json.loads(res.stdout or "{}").items()}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestBed, Operator, Operator]]:
    """A server on h1 of a 3-host bed of its own (4 simulated GPUs each, fish as h3's login
    shell: the server key's forced command runs through it), set up and started from the
    workstation; two operators. Its own bed: the queue tests need every GPU free, whatever
    other modules left on the shared one."""
    with fish_bed(3, sim_gpus=4) as bed:
        tmp = tmp_path_factory.mktemp("served")
        inv = bed.write_inventory(tmp / "hosts.toml", python=sys.executable, connect_timeout=5.0, min_free_mb=1)
        # /metrics on h1's bed address, so that a Prometheus at the workstation reaches it.
        # allow_jobs: the bed has three hosts and the queue tests fill them all. members_need_join
        # = false: its people (add-user) have no accounts of their own, and their jobs run as the
        # hosts' account, root, which the server runs as too (refused by default: security.md).
        inv.write_text(inv.read_text() + f'\n[server]\nhost = "h1"\nallow_jobs = true\nmembers_need_join = false\n'
                       f'metrics_listen = "{bed.host(1).address}:{METRICS_PORT}"\n')
        alice, bob = Operator(inv, tmp / "alice"), Operator(inv, tmp / "bob")
        # Alice's [notify]: a webhook on h2 (a receiver there only while the notify test runs),
        # carried to the server by setup; the server sends to it from h1.
        config = tmp / "config.toml"
        config.write_text(f'[notify]\nwebhook = "http://{bed.host(2).address}:{HOOK_PORT}/hook?token=s3cret"\n'
                          'on = ["started", "failed"]\nretries = 1\ntimeout_s = 2\n')
        alice.env["RIGDECK_CONFIG"] = bob.env["RIGDECK_CONFIG"] = str(config)
        alice.run("deploy")
        setup = alice.run("server", "setup", timeout=900).stdout
        assert "notify: webhook http://" in setup and "s3cret" not in setup, setup
        started = alice.run("server", "start", timeout=120).stdout
        assert f"metrics on http://{bed.host(1).address}:{METRICS_PORT}/metrics" in started, started
        try:
            yield bed, alice, bob
        finally:
            alice.run("server", "stop", check=False, timeout=60)


def server_leftovers(client: Any) -> list[tuple[str, str, str]]:
    """What the server still runs or holds: (kind, id, state) of every job not ended (a queued
    one too), every sweep and pipeline not ended; read over one link (``client``)."""
    from tui.model.jobstate import TERMINAL
    from tui.model.pipelineview import PIPELINE_FINAL
    from tui.model.sweepview import SWEEP_FINAL

    out = [("job", v.job_id, v.state) for v in client.list_jobs() if v.state not in TERMINAL]
    out += [("sweep", r.sweep_id, r.state) for r in client.sweeps() if r.state not in SWEEP_FINAL]
    out += [("pipeline", r.pipeline_id, r.state) for r in client.pipelines() if r.state not in PIPELINE_FINAL]
    return out


def take_away(client: Any, left: list[tuple[str, str, str]]) -> None:
    """Stop what ``server_leftovers`` found: sweeps and pipelines first (they start jobs), then jobs."""
    for kind, ref, _ in sorted(left, key=lambda x: ("sweep", "pipeline", "job").index(x[0])):
        try:
            if kind == "sweep":
                client.sweep_stop(ref)
            elif kind == "pipeline":
                client.pipeline_stop(ref)
            else:
                client.stop(ref, grace_s=1)
        except Exception as e:  # stopped meanwhile, or ended: what is left is read again
            print(f"stopping {kind} {ref}: {type(e).__name__}: {e}", file=sys.stderr)
    for kind, ref, _ in server_leftovers(client):  # the jobs a sweep or pipeline had running
        if kind == "job":
            client.stop(ref, grace_s=1)


@pytest.fixture(scope="module")
def server_link(served: tuple[TestBed, Operator, Operator]) -> Iterator[Any]:
    """One link to the server for the module's checks (a CLI per look would cost seconds)."""
    from tui.client import RemoteClient, load_inventory

    client = RemoteClient(load_inventory(served[1].inventory))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(autouse=True)
def server_starts_clean(request: pytest.FixtureRequest) -> Iterator[None]:
    """The module's tests share one server: each begins with no job, queued entry, sweep or
    pipeline of an earlier one alive there, and one that leaves any fails for it, by name, after
    it is stopped (conftest's bed check then sees the hosts themselves clean)."""
    if "served" not in request.fixturenames:
        yield
        return
    client = request.getfixturevalue("server_link")
    left = server_leftovers(client)
    if left:
        take_away(client, left)
        print(f"\nwarning: the server ran {left} before {request.node.name} (stopped)", file=sys.stderr)
    yield
    deadline = time.monotonic() + 10  # a stop the test made at its end may still be being recorded
    while (left := server_leftovers(client)) and time.monotonic() < deadline:
        time.sleep(0.5)
    if left:
        take_away(client, left)
        pytest.fail(f"{request.node.name} left these running on the server (stopped now): "
                    + ", ".join(f"{k} {ref} ({st})" for k, ref, st in left), pytrace=False)


@pytest.fixture(autouse=True)
def said_when_failed(request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]) -> Iterator[None]:
    """When a test here fails, what the server was doing: its log, its jobs (state, why waiting)
    and the GPU claims each host holds, printed past pytest's capture (a CI log keeps it)."""
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is None or not rep.failed or "served" not in request.fixturenames:
        return
    bed, alice, _ = request.getfixturevalue("served")
    parts = [f"--- {request.node.name} failed; the server's state:"]
    try:
        parts.append(alice.run("server", "logs", "-n", "120", check=False, timeout=60).stdout)
        for v in alice.json("jobs", check=False, timeout=60):
            parts.append(f"job {v['job_id']} {v['state']} on {[n['host'] for n in v.get('placement') or []]}"
                         f" waiting={v.get('waiting')!r}")
        from agent.claims import DEFAULT_DIR as claims

        for h in (1, 2, 3):
            res = bed.exec(h, ["sh", "-c", f"ls -l {claims}; cat {claims}/* 2>/dev/null | head -c 2000; "
                                           "ps -ww -eo pid,ppid,etimes,args | head -60"])
            parts.append(f"h{h}:\n{res.stdout}{res.stderr}")
    except Exception as e:  # what can be said, said; never a second failure
        parts.append(f"(could not read more: {type(e).__name__}: {e})")
    with capsys.disabled():
        print("\n".join(parts))


TICK = f"""
command = ["{{python}}", "{TICKER}", "--steps", "{{steps}}", "--sleep", "0.1"]
workdir = "{ROOT}"
launcher = "direct"
"""


def ticker(steps: int) -> str:
    return TICK.replace("{steps}", str(steps))


def test_a_killed_rank_reaches_a_webhook_in_the_bed_within_5s_sent_by_the_server(
        served: tuple[TestBed, Operator, Operator], tmp_path: Path) -> None:
    """Acceptance (issue 18, item 3): the server, alone, POSTs a ``failed`` event with the job
    id, the cause and the host to an HTTP receiver inside the bed within 5 s of a ``kill -9``."""
    bed, alice, bob = served
    out = tmp_path / "received.jsonl"
    receiver = bed.popen(2, [sys.executable, str(ROOT / "tests" / "notify_receiver.py"), bed.host(2).address,
                             str(HOOK_PORT), str(out)], stdout=subprocess.PIPE, text=True)
    assert receiver.stdout is not None
    ready = receiver.stdout.readline().split()  # "listening PORT PID", the pid as h2 sees it
    try:
        assert ready[:1] == ["listening"], ready
        spec = alice.spec("notified", ticker(100_000) + 'nodes = 2\nhosts = ["h2", "h3"]\ngpus_per_node = 1\n')
        job_id = alice.json("launch", str(spec))["job_id"]
        try:
            pids = wait_until(lambda: rank_pids(bed, 3, job_id) or None, 60, "the rank on h3 runs")

            def events() -> list[dict[str, Any]]:
                return [json.loads(ln) for ln in out.read_text().splitlines()] if out.exists() else []

            started = wait_until(lambda: [e for e in events() if e["body"]["event"] == "started"], 30,
                                 "the started event")
            assert started[0]["body"]["id"] == job_id and started[0]["body"]["controller"] == "server"
            assert workstation_rigdeck([alice.home, bob.home]) == []  # no workstation process is alive
            killed_at = time.time()
            bed.exec(3, ["kill", "-9", str(next(iter(pids.values())))])
            failed = wait_until(lambda: [e for e in events() if e["body"]["event"] == "failed"], 30,
                                "the failed event")
            took = failed[0]["received"] - killed_at
            print(f"\nfailed event received {took:.2f}s after kill -9 (job {job_id})")
            assert workstation_rigdeck([alice.home, bob.home]) == []
            body = failed[0]["body"]
            assert body["id"] == job_id and body["kind"] == "job" and body["name"] == "notified"
            assert body["host"] == "h3" and body["cause"]["host"] == "h3" and body["cause"]["signal"] == 9, body
            assert "killed by signal 9" in body["cause_text"] and sorted(body["hosts"]) == ["h2", "h3"]
            assert failed[0]["path"] == "/hook?token=s3cret"
            assert took < 5.0, f"the failed event took {took:.2f}s"
            # One event per transition: the record of the failure (once the gang has stopped)
            # sends nothing more, and neither does a look from the workstation.
            wait_until(lambda: alice.json("status", job_id)["state"] == "failed", 60, "the job is recorded failed")
            time.sleep(2)
            assert [e["body"]["event"] for e in events()] == ["started", "failed"], events()
            assert "s3cret" not in alice.run("server", "logs", "-n", "200").stdout
        finally:
            alice.run("stop", job_id, "--grace", "1", check=False)
    finally:
        if len(ready) == 3:  # nsenter forked it into h2's PID namespace: stopped there
            bed.exec(2, ["kill", "-9", ready[2]])
        receiver.kill()
        receiver.wait()


def test_server_status_and_the_cli_go_through_it(served: tuple[TestBed, Operator, Operator]) -> None:
    bed, alice, _ = served
    st = alice.json("server", "status")
    assert st["running"] and st["listening"], st
    # The CLI's jobs come from the server's history, not from a workstation database.
    assert alice.json("jobs") == [] or isinstance(alice.json("jobs"), list)
    assert not (alice.home / "history.sqlite").exists()


def test_a_rank_killed_while_no_workstation_process_runs_is_restarted_by_the_server(
        served: tuple[TestBed, Operator, Operator]) -> None:
    bed, alice, bob = served
    spec = alice.spec("unattended", ticker(100_000) + """
nodes = 2
hosts = ["h2", "h3"]
gpus_per_node = 1
[restart]
max_restarts = 1
""")
    job = alice.json("launch", str(spec))
    job_id = job["job_id"]
    try:
        pids = wait_until(lambda: rank_pids(bed, 3, job_id) or None, 60, "the rank on h3 runs")
        assert workstation_rigdeck([alice.home, bob.home]) == []  # every workstation process has ended
        killed_at = time.time()
        bed.exec(3, ["kill", "-9", str(next(iter(pids.values())))])  # a pid of h3's own PID namespace
        time.sleep(15)  # nothing runs on the workstation meanwhile
        assert workstation_rigdeck([alice.home, bob.home]) == []
        view = alice.json("status", job_id)  # re-attaching
        restarts = [e for e in view["events"] if e["event"] == "restart"]
        assert view["restarts"] == 1 and restarts, (view["state"], view["events"], view["hosts"],
                                                    alice.run("server", "logs", "-n", "80").stdout)
        assert restarts[0]["cause"]["host"] == "h3", restarts[0]["cause"]
        assert restarts[0]["cause"]["signal"] == 9, restarts[0]["cause"]
        assert restarts[0]["time"] - killed_at < 15
        started = [e for e in view["events"] if e["event"] == "started"]
        assert len(started) == 2 and started[1]["time"] - killed_at < 15, started
        assert view["state"] == "running", view["state"]
        # Both hosts run the new attempt; the old rank on h2 was stopped with the gang.
        assert rank_pids(bed, 2, job_id) and rank_pids(bed, 3, job_id)
        status = alice.run("status", job_id).stdout
        assert "after 1 restart" in status, status
    finally:
        alice.run("stop", job_id, "--grace", "1", check=False)


def test_two_operators_share_jobs_and_queue_and_the_queue_runs_unattended(
        served: tuple[TestBed, Operator, Operator]) -> None:
    bed, alice, bob = served
    live = [(v["job_id"], v["state"]) for v in alice.json("jobs")
            if v["state"] not in ("succeeded", "failed", "stopped")]
    assert live == [], live  # what earlier tests started has ended
    # All of every host's GPUs: one at a time. Long enough (50 s) that the first is still running
    # while both operators read the queue, even on a loaded machine.
    body = ticker(500) + "nodes = 3\ngpus_per_node = 4\n"
    specs = [alice.spec("whole-a", body), bob.spec("whole-b", body)]
    procs = [subprocess.Popen([sys.executable, "-m", "tui.cli", "launch", str(s), "--json", "-i", str(op.inventory)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=op.env, cwd=ROOT)
             for s, op in zip(specs, (alice, bob), strict=True)]
    views = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        views.append(json.loads(out))
    states = sorted(v["state"] for v in views)
    assert states[0] == "queued" and states[1] in ("starting", "running"), states
    first = next(v for v in views if v["state"] != "queued")
    second = next(v for v in views if v["state"] == "queued")
    assert first["job_id"] in second["waiting"] or "GPU" in second["waiting"], second["waiting"]
    # Both operators see the same jobs and the same line.
    ids_a = {v["job_id"] for v in alice.json("jobs")}
    ids_b = {v["job_id"] for v in bob.json("jobs")}
    assert {first["job_id"], second["job_id"]} <= ids_a and ids_a == ids_b
    assert [e["job_id"] for e in alice.json("queue")] == [second["job_id"]] == [e["job_id"] for e in bob.json("queue")]
    assert workstation_rigdeck([alice.home, bob.home]) == []
    deadline = time.time() + 120
    while time.time() < deadline:  # the workstation only sleeps: nothing of rigdeck runs here
        time.sleep(10)
        v1 = alice.json("status", first["job_id"])
        if v1["state"] in ("succeeded", "failed", "stopped"):
            break
    v1 = alice.json("status", first["job_id"])
    assert v1["state"] == "succeeded", v1
    v2 = wait_until(lambda: (lambda v: v if v["started"] else None)(bob.json("status", second["job_id"])), 60,
                    "the queued job starts")
    assert v2["started"] - v1["ended"] <= 3.0, (v1["ended"], v2["started"])
    assert [e for e in v2["events"] if e["event"] == "queued"]
    alice.run("stop", second["job_id"], "--grace", "1")


def test_a_killed_server_restarts_and_readopts_its_jobs_and_queue(served: tuple[TestBed, Operator, Operator]) -> None:
    bed, alice, bob = served
    body = ticker(100_000) + "nodes = 3\ngpus_per_node = 4\n"
    running = alice.json("launch", str(alice.spec("keeps-running", body)))
    waiting = bob.json("launch", str(bob.spec("keeps-waiting", body)))
    assert running["state"] in ("starting", "running") and waiting["state"] == "queued"
    try:
        before = {h: rank_pids(bed, h, running["job_id"]) for h in (1, 2, 3)}
        assert all(before.values()), before
        # A drain is the server's: every operator sees it, and it outlives the server.
        alice.run("drain", f"{bed.hosts[2].name}:3", "--reason", "fan noise")
        pid = alice.json("server", "status")["pid"]
        bed.exec(1, ["kill", "-9", str(pid)])
        wait_until(lambda: not alice.json("server", "status", check=False).get("running") or None, 30,
                   "the server is seen dead")
        alice.run("server", "start", timeout=120)
        time.sleep(3)  # a few supervision rounds
        view = alice.json("status", running["job_id"])
        assert view["state"] == "running" and view["restarts"] == 0, view
        after = {h: rank_pids(bed, h, running["job_id"]) for h in (1, 2, 3)}
        assert after == before  # re-adopted: the same processes, nothing started again
        (drain,) = bob.json("drains")
        assert (drain["target"], drain["reason"], drain["source"]) == (f"{bed.hosts[2].name}:3", "fan noise",
                                                                       "operator")
        bob.run("undrain", f"{bed.hosts[2].name}:3")
        assert alice.json("drains") == []
        queued = [e["job_id"] for e in alice.json("queue")]
        assert queued == [waiting["job_id"]], (queued, bob.json("status", waiting["job_id"], check=False),
                                               alice.run("server", "logs", "-n", "60").stdout)
        started = [e for e in view["events"] if e["event"] == "started"]
        assert len(started) == 1
        alice.run("stop", running["job_id"], "--grace", "1")
        # While the queue starts it, a host may not have it yet: that reads as starting, never as
        # a host out of reach (unknown).
        seen: list[str] = []
        v2 = wait_until(lambda: (lambda v: v if seen.append(v.get("state")) or v.get("state") == "running" else None)(
                            bob.json("status", waiting["job_id"], check=False)),
                        60, "the queued job starts after the restart")
        assert len([e for e in v2["events"] if e["event"] == "started"]) == 1
        assert "unknown" not in seen, seen
    finally:
        alice.run("undrain", bed.hosts[2].name, check=False)
        for j in (running["job_id"], waiting["job_id"]):
            alice.run("stop", j, "--grace", "1", check=False)


def test_code_only_the_workstation_has_runs_through_the_server(served: tuple[TestBed, Operator, Operator]) -> None:
    """[code] sync with a server: the workstation sends the server what its store lacks, the
    server ships it to the hosts; the hosts (the server's too) never see the directory."""
    import shutil
    import uuid

    from tests.testbed import WORKSTATION_ONLY

    bed, alice, _ = served
    src = Path(WORKSTATION_ONLY) / f"served-{uuid.uuid4().hex[:8]}"
    (src / "data").mkdir(parents=True)
    mark = uuid.uuid4().hex
    (src / "data" / "mark.txt").write_text(mark)
    (src / "show.py").write_text("import os\nprint('mark', open('data/mark.txt').read(), 'in', os.getcwd())\n")
    spec = src / "job.toml"
    spec.write_text('name = "synced"\ncommand = ["{python}", "show.py"]\nlauncher = "direct"\nnodes = 2\n'
                    '[code]\nsync = "."\n')
    try:
        view = alice.json("launch", str(spec), "--wait", timeout=300)
        assert view["state"] == "succeeded", json.dumps(view, indent=1)[-2000:]
        tree = view["code"]["tree"]
        sync = next(e for e in reversed(view["events"]) if e.get("event") == "code")
        assert len(sync["hosts"]) == 2 and all(r["files_sent"] == 3 for r in sync["hosts"].values()), sync
        logs = alice.run("logs", view["job_id"]).stdout
        assert logs.count(f"mark {mark} in /root/.rigdeck/code/trees/{tree}") == 2, logs
        # The workstation's store holds the snapshot; the server's store got it from there.
        assert (alice.home / "code" / "manifests" / f"{tree}.json").is_file()
        assert bed.exec(1, ["test", "-e", str(src)]).returncode == 1  # the server's host cannot see it
    finally:
        shutil.rmtree(src, ignore_errors=True)


def test_a_sweep_runs_unattended_and_survives_a_killed_server(served: tuple[TestBed, Operator, Operator]) -> None:
    """Issue 13, acceptance 5 (server): the sweep is started and left; the server is killed -9
    mid-sweep and started again; the sweep completes with exactly max_trials trials, each once."""
    bed, alice, bob = served
    started = alice.json("sweep", str(sweep_spec(alice, "sw-served", trials=8, parallel=3, steps=10, step_s=0.2)))
    sweep_id = started["row"]["sweep_id"]
    assert workstation_rigdeck([alice.home]) == []  # nobody at the workstation runs it
    wait_until(lambda: bob.json("sweep", "status", sweep_id)["row"]["completed"] >= 2, 120, "two trials completed")
    pid = alice.json("server", "status")["pid"]
    bed.exec(1, ["kill", "-9", str(pid)])
    wait_until(lambda: not alice.json("server", "status", check=False).get("running") or None, 30,
               "the server is seen dead")
    alice.run("server", "start", timeout=120)
    out = bob.json("sweep", "status", sweep_id, "--wait", timeout=300)  # follows it over the server's stream
    assert out["row"]["state"] == "completed", out["row"]
    assert sorted(t["number"] for t in out["trials"]) == list(range(1, 9))
    for t in out["trials"]:
        assert t["state"] == "completed" and t["value"] == pytest.approx(expected_objective(t, 10), rel=1e-9), t
    jobs = [j for j in alice.json("jobs") if j["sweep_id"] == sweep_id]
    assert sorted(int(j["trial"]) for j in jobs) == list(range(1, 9))  # one job per trial: none ran twice
    twice = [(j["job_id"], j["events"]) for j in jobs if len([e for e in j["events"] if e["event"] == "started"]) != 1]
    assert not twice, (twice, alice.run("server", "logs", "-n", "80").stdout)


def test_a_pipeline_advances_unattended_and_a_killed_server_neither_reruns_nor_loses_a_step(
        served: tuple[TestBed, Operator, Operator]) -> None:
    """Issue 14, acceptance 4: the pipeline is started and left; the server is killed -9 while a
    step runs and started again; the pipeline ends with every step run once, the running one
    followed to its end (not started again), the finished one not run again."""
    bed, alice, bob = served
    spec = alice.home / "served-pipeline.toml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text('name = "pl-served"\n'
                    + pipeline_step("first", ["--write", "part-{node}.txt=from-first"], "", "nodes = 2\n")
                    + pipeline_step("long", ["--sleep", "12", "--expect", "parts/part-1.txt=from-first",
                                             "--write", "long.txt=done"],
                                    'depends_on = ["first"]\ninputs = { parts = "steps.first.output" }')
                    + pipeline_step("last", ["--expect", "long/long.txt=done"],
                                    'depends_on = ["long"]\ninputs = { long = "steps.long.output" }'))
    started = alice.json("pipeline", str(spec))
    pid = started["row"]["pipeline_id"]
    assert workstation_rigdeck([alice.home]) == []  # nobody at the workstation runs it
    running = wait_until(lambda: (lambda s: s if s["long"]["state"] == "running" else None)(
        steps_of(bob.json("pipeline", "status", pid))), 120, "the long step running")
    server = alice.json("server", "status")["pid"]
    bed.exec(1, ["kill", "-9", str(server)])
    wait_until(lambda: not alice.json("server", "status", check=False).get("running") or None, 30,
               "the server is seen dead")
    alice.run("server", "start", timeout=120)
    out = bob.json("pipeline", "status", pid, "--wait", timeout=300)
    steps = steps_of(out)
    assert out["row"]["state"] == "succeeded", (out, alice.run("server", "logs", "-n", "80").stdout)
    assert steps["first"]["job_id"] == running["first"]["job_id"]  # not run again
    assert steps["long"]["job_id"] == running["long"]["job_id"]  # followed, not lost or restarted
    jobs = [j for j in alice.json("jobs") if j.get("name") in ("first", "long", "last")]
    assert sorted(j["name"] for j in jobs) == ["first", "last", "long"], [j["job_id"] for j in jobs]
    twice = [(j["job_id"], j["events"]) for j in jobs if len([e for e in j["events"] if e["event"] == "started"]) != 1]
    assert not twice, (twice, alice.run("server", "logs", "-n", "80").stdout)


def test_doctor_runs_on_the_server(served: tuple[TestBed, Operator, Operator]) -> None:
    """`rigdeck doctor` through the server: its measurement job is the server's, and a bad host
    name comes back as the doctor's own error (exit 2, the name said)."""
    bed, alice, _ = served
    bad = alice.run("doctor", "h9", "--checks", "p2p", check=False)
    assert bad.returncode == 2 and "unknown host 'h9'" in bad.stderr, bad.stderr
    rep = alice.json("doctor", "h2", "h3", "--checks", "p2p", timeout=300)
    assert rep["hosts"] == ["h2", "h3"] and len(rep["job_ids"]) == 1, rep
    assert {f["subject"] for f in rep["findings"]} == {"all", "h2<->h3", "h2", "h3"}
    assert all(f["value"] > 0 for f in rep["findings"])
    assert alice.json("status", rep["job_ids"][0])["state"] == "succeeded"
    assert not (alice.home / "history.sqlite").exists()


def test_the_servers_key_runs_only_the_agent_and_no_host_listens_on_tcp(
        served: tuple[TestBed, Operator, Operator]) -> None:
    bed, alice, _ = served
    key = "/root/.rigdeck/server/id_ed25519"
    for target in bed.hosts[1:]:
        res = bed.exec(1, ["ssh", "-i", key, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                           "-o", "UserKnownHostsFile=/root/.rigdeck/server/known_hosts",
                           f"root@{target.address}", "id"], timeout=30, input="")
        assert "uid=" not in res.stdout, res.stdout
    # The GPU hosts listen on nothing but sshd; the server's host on the /metrics its [server]
    # table asked for too, held by the server.
    pid = alice.json("server", "status")["pid"]
    for i, h in enumerate(bed.hosts, start=1):
        listening = bed.exec(i, ["ss", "-ltnp"]).stdout.splitlines()[1:]
        others = [ln for ln in listening if "sshd" not in ln]
        if i == 1:
            (metrics,) = others
            assert f"{h.address}:{METRICS_PORT} " in metrics and f"pid={pid}," in metrics, metrics
        else:
            assert others == [], (h.name, others)


def person(served: tuple[TestBed, Operator, Operator], tmp: Path, name: str) -> tuple[Operator, Path]:
    """``name`` at a workstation of their own: their own key pair (made here) and an inventory that
    reaches the server host with it; (the person, their public key file)."""
    _, op, _ = served
    key = tmp / name / "id_ed25519"
    key.parent.mkdir(parents=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{name}@laptop", "-f", str(key)],
                   check=True)
    text = op.inventory.read_text().replace('name = "h1"\n', f'name = "h1"\nidentity_file = "{key}"\n', 1)
    assert str(key) in text
    inv = tmp / name / "hosts.toml"
    inv.write_text(text)
    who = Operator(inv, tmp / name / "home")
    who.env["RIGDECK_CONFIG"] = op.env["RIGDECK_CONFIG"]
    return who, Path(f"{key}.pub")


def test_people_attach_with_their_own_keys_and_a_member_stops_only_their_own_job(
        served: tuple[TestBed, Operator, Operator], tmp_path: Path) -> None:
    """Acceptance (issue 33, item 1): alice and bob (members) and carol (an admin), each with a
    key of their own installed by `rigdeck server add-user`, see every job; bob's stop of alice's
    job is refused naming alice, carol's succeeds; the job records its owner and who stopped it.
    Their keys run nothing but the attach; `remove-user` revokes."""
    bed, operator, _ = served
    people = {n: person(served, tmp_path, n) for n in ("alice", "bob", "carol")}
    try:
        for name, (_, pub) in people.items():
            operator.run("server", "add-user", name, "--key", str(pub), *(["--admin"] if name == "carol" else []))
        listed = {u["name"]: u for u in operator.json("server", "users")}
        for name, (_, pub) in people.items():
            said = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True).stdout.split()[1]
            assert (listed[name]["admin"], listed[name]["fingerprint"]) == (name == "carol", said), listed
        alice, bob, carol = (people[n][0] for n in ("alice", "bob", "carol"))
        # A person's key runs the attach and nothing else: no shell, whatever is asked.
        key = people["bob"][1].with_suffix("")
        res = subprocess.run(["ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                              "-o", f"UserKnownHostsFile={bed.known_hosts}", "-o", "IdentitiesOnly=yes",
                              f"root@{bed.host(1).address}", "id"], input="", capture_output=True, text=True,
                             timeout=60)
        assert "uid=" not in res.stdout and '"event":"hello"' in res.stdout, (res.stdout, res.stderr)
        job = alice.json("launch", str(alice.spec("alices", ticker(3000) + "gpus_per_node = 2\n")))
        job_id = job["job_id"]
        assert job["user"] == "alice", job
        for who in (alice, bob, carol):  # each sees every job, with its owner
            assert [v["user"] for v in who.json("jobs") if v["job_id"] == job_id] == ["alice"]
        refused = bob.run("stop", job_id, "--grace", "1", check=False)
        assert refused.returncode == 3, (refused.stdout, refused.stderr)
        assert (f"refused: job '{job_id}' belongs to alice; members may stop only their own jobs "
                "(bob is a member)") in refused.stderr
        assert bob.json("status", job_id)["state"] in ("starting", "running")
        stopped = carol.json("stop", job_id, "--grace", "1")
        assert (stopped["state"], stopped["stopped_by"], stopped["user"]) == ("stopped", "carol", "alice"), stopped
        seen = bob.json("status", job_id)
        assert [e["by"] for e in seen["events"] if e["event"] == "stop requested"] == ["carol"]
        assert "stopped by carol" in bob.run("status", job_id).stdout
        # What usage says is the sum of the jobs' recorded GPU time: here 2 GPUs from start to end.
        started = next(e["time"] for e in seen["events"] if e["event"] == "started")
        usage = {r["key"]: r for r in alice.json("usage", "--by", "job")["rows"]}
        assert usage[job_id]["gpu_hours"] == pytest.approx(2 * (seen["ended"] - started) / 3600, abs=1e-9)
        operator.run("server", "remove-user", "bob")
        gone = bob.run("jobs", check=False, timeout=120)
        assert gone.returncode != 0 and "bob" not in operator.run("server", "users").stdout
    finally:
        for name in people:
            operator.run("server", "remove-user", name, check=False)


class Wire:
    """A person speaking the server's wire directly over their forced attach (``ssh`` with their
    key): JSON lines out, the hello in plain text, then one zlib stream in (as the server sends)."""

    def __init__(self, bed: TestBed, key: Path):
        import zlib

        self.proc = subprocess.Popen(
            ["ssh", "-i", str(key), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o",
             f"UserKnownHostsFile={bed.known_hosts}", "-o", "IdentitiesOnly=yes", f"root@{bed.host(1).address}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert self.proc.stdout is not None
        self.hello = json.loads(self.proc.stdout.readline())
        assert self.hello.get("event") == "hello", self.hello
        self.z = zlib.decompressobj()
        self.buf = b""
        self.rid = 0

    def _line(self) -> dict[str, Any]:
        import select

        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            ready, _, _ = select.select([fd], [], [], 120)
            chunk = os.read(fd, 65536) if ready else b""
            assert chunk, "the server closed the link or said nothing for 120 s"
            self.buf += self.z.decompress(chunk)
        line, self.buf = self.buf.split(b"\n", 1)
        return dict(json.loads(line))

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """The answer: ``{"result": ...}`` or ``{"error": {"type", "message"}}``."""
        assert self.proc.stdin is not None
        self.rid += 1
        self.proc.stdin.write((json.dumps({"id": self.rid, "method": method, "params": params}) + "\n").encode())
        self.proc.stdin.flush()
        while True:
            msg = self._line()
            if msg.get("id") == self.rid:
                return msg

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(30)


def test_a_member_speaking_the_wire_directly_gets_nothing_the_rules_refuse(
        served: tuple[TestBed, Operator, Operator], tmp_path: Path) -> None:
    """Acceptance (issue 46, item 1, the server's part): bob, a member, speaks the wire directly
    over his forced attach and tries each attack on the server's checks; each is refused or sees
    nothing, and alice's jobs and the server's users file are unchanged. Each attempt and what it
    got is printed.

    Three more attempts of the acceptance list need what this bed does not have (a server
    without ``allow_jobs``, people with accounts of their own), and are made and printed the
    same way in tests/test_server_accounts.py's bed test: "a job on the server host that edits
    users.json and authorized_keys" (refused, the files unchanged), "a job that reads alice's job
    directory" (bob's, as his own account, on her host: permission denied, nothing of his in
    it), and the server's own key asking an agent for ``upgrade``, ``shutdown`` or an ``exec``
    not on its list (refused)."""
    from tui.model.jobspec import load_jobspec

    bed, operator, _ = served
    people = {n: person(served, tmp_path, n) for n in ("alice", "bob")}
    users_file = ["cat", "/root/.rigdeck/server/users.json"]
    wires: list[Wire] = []
    try:
        for name, (_, pub) in people.items():
            operator.run("server", "add-user", name, "--key", str(pub))
        users_before = bed.exec(1, users_file).stdout
        alice, bob = people["alice"][0], people["bob"][0]
        secret = "alice-wandb-key-0123456789"
        running = alice.json("launch", str(alice.spec("alices-run", ticker(3000) + 'gpus_per_node = 1\n'
                                                      f'[env]\nWANDB_API_KEY = "{secret}"\n')))
        queued = alice.json("launch", str(alice.spec("alices-big", ticker(50) + "nodes = 3\ngpus_per_node = 4\n")))
        assert queued["state"] == "queued", queued
        bobs = bob.json("launch", str(bob.spec("bobs", ticker(3000) + "gpus_per_node = 1\n")))
        w = Wire(bed, people["bob"][1].with_suffix(""))
        wires.append(w)
        good = load_jobspec(bob.spec("bobs-wire", ticker(5) + "gpus_per_node = 1\n")).to_dict()
        attempts: list[tuple[str, dict[str, Any]]] = [
            ("view alice's job", w.call("view", ref=running["job_id"])),
            ("list_jobs", w.call("list_jobs")),
            ("launch with alice's queued job's id", w.call("launch", spec=good, job_id=queued["job_id"])),
            ("launch at priority 10^12", w.call("launch", spec={**good, "priority": 10**12})),
            ("launch named with an escape sequence", w.call("launch", spec={**good, "name": "x\x1b[2Jgone"})),
            ("launch at priority 5 (above a member's 0)", w.call("launch", spec={**good, "priority": 5})),
            ("launch a trial of someone's sweep", w.call("launch", spec={**good, "sweep_id": "s-1", "trial": "1"})),
            ("reprioritise his own job to 5000", w.call("reprioritise", ref=bobs["job_id"], priority=5000)),
            ("reprioritise his own job to 5", w.call("reprioritise", ref=bobs["job_id"], priority=5)),
            ("reprioritise alice's job", w.call("reprioritise", ref=queued["job_id"], priority=-5)),
            ("doctor", w.call("doctor", hosts=["h2", "h3"], checks=["p2p"])),
            ("gc", w.call("gc")),
            ("reconnect", w.call("reconnect", host="h2")),
            ("code_missing with ../", w.call("code_missing", blobs=[["../../../etc/passwd", 1]])),
            ("code_manifest with a path for a hash", w.call("code_manifest", tree="../x", files=[])),
        ]
        for what, got in attempts:
            print(f"bob: {what}: {json.dumps(got)[:300]}")
        said = dict(attempts)
        for what in ("view alice's job", "list_jobs"):
            assert "result" in said[what] and secret not in json.dumps(said[what]), said[what]
        (seen,) = [v for v in said["list_jobs"]["result"] if v["job_id"] == running["job_id"]]
        assert set(seen["spec"]["env"]) == {"WANDB_API_KEY"}  # the name, not the value
        for what, _ in attempts[2:]:
            assert "error" in said[what] and "result" not in said[what], (what, said[what])
        assert "unexpected keyword argument 'job_id'" in said["launch with alice's queued job's id"]["error"]["message"]
        assert "priority" in said["launch at priority 10^12"]["error"]["message"]
        assert "name" in said["launch named with an escape sequence"]["error"]["message"]
        assert "the highest a member may give" in said["launch at priority 5 (above a member's 0)"]["error"]["message"]
        assert "the server sets it" in said["launch a trial of someone's sweep"]["error"]["message"]
        assert "-1000..1000" in said["reprioritise his own job to 5000"]["error"]["message"]
        for what in ("doctor", "gc", "reconnect"):
            assert "for admins only (bob is a member)" in said[what]["error"]["message"], said[what]
        # Nothing changed: alice's jobs as they were (her own view shows her secret), bob started
        # nothing, the users file is the same.
        mine = Wire(bed, people["alice"][1].with_suffix(""))
        wires.append(mine)
        hers = mine.call("view", ref=running["job_id"])["result"]
        assert hers["spec"]["env"] == {"WANDB_API_KEY": secret} and hers["state"] in ("starting", "running")
        big = mine.call("view", ref=queued["job_id"])["result"]
        assert (big["state"], big["user"], big["spec"]["priority"]) == ("queued", "alice", 0), big
        assert [v["name"] for v in bob.json("jobs") if v.get("user") == "bob"] == ["bobs"]
        assert bed.exec(1, users_file).stdout == users_before
    finally:
        for w in wires:
            w.close()
        for v in operator.json("jobs"):
            if v.get("user") in people and v["state"] not in ("succeeded", "failed", "stopped"):
                operator.run("stop", v["job_id"], "--grace", "1", check=False)
        for name in people:
            operator.run("server", "remove-user", name, check=False)


def test_the_app_shows_a_lost_server_link_and_reconnects(served: tuple[TestBed, Operator, Operator]) -> None:
    import asyncio

    bed, alice, _ = served
    spec = alice.spec("through-a-cut", ticker(100_000) + "nodes = 2\nhosts = [\"h2\", \"h3\"]\ngpus_per_node = 1\n")

    async def run() -> None:
        from tui.app.shell import RigdeckApp
        from tui.client import RemoteClient, load_inventory
        from tui.model.jobspec import load_jobspec

        inv = load_inventory(alice.inventory)
        client = RemoteClient(inv)
        app = RigdeckApp(client, keymap_file=alice.home / "keys.toml")
        async with app.run_test(size=(120, 36)) as pilot:
            def summary() -> str:
                return str(app.query_one("#summary").render())

            async def until(cond: Callable[[], bool], what: str, limit: float) -> None:
                end = time.monotonic() + limit
                while time.monotonic() < end:
                    await pilot.pause(0.5)
                    if cond():
                        return
                raise AssertionError(f"{what}: {summary()}")

            await until(lambda: "controller: server h1" in summary(), "link up", 60)
            await until(lambda: "3/3 up" in summary(), "hosts up through the server", 60)
            job = client.launch(load_jobspec(spec))
            ns = bed.host(1).netns
            rule = ["INPUT", "-s", bed.gateway, "-j", "DROP"]  # the workstation's path to h1
            subprocess.run(["ip", "netns", "exec", ns, "iptables", "-I", *rule], check=True)
            cut = time.monotonic()
            try:
                await until(lambda: "link down" in summary(), "link down shown", 40)
                await asyncio.sleep(max(0.0, 30 - (time.monotonic() - cut)))
            finally:
                subprocess.run(["ip", "netns", "exec", ns, "iptables", "-D", *rule], check=True)
            await until(lambda: "controller: server h1" in summary(), "reconnected by itself", 60)
            assert client.reconnects >= 1
            view = client.view(job.job_id)  # the job went on meanwhile, on hosts the server still reached
            assert view.state == "running" and view.restarts == 0 and view.last_step, view.to_json()
            client.stop(job.job_id, grace_s=1)

    asyncio.run(run())


def test_the_app_in_tmux_against_the_server(served: tuple[TestBed, Operator, Operator], tmp_path: Path,
                                             tmux_env: dict[str, str]) -> None:  # noqa: F811
    """The end-to-end run of the app in a real terminal, attached to the server: hosts up through
    it, a launch from the dialog, the loss in the job view, a stop from the app."""
    import re
    import uuid

    from tests.test_ui_e2e import Tmux, job_spec, launch_from_dialog, loss_of

    bed, alice, _ = served
    spec, is_ticker = job_spec(tmp_path)
    env = {**tmux_env, "RIGDECK_INVENTORY": str(alice.inventory), "PYTHONPATH": str(ROOT)}
    tmux = Tmux(f"rdk-{uuid.uuid4().hex[:8]}", env)
    tmux.start(f"{sys.executable} -m tui.cli")
    job_id = None
    try:
        tmux.wait(lambda s: "hosts 3/3 up" in s and "controller: server h1" in s, 90, "hosts up via the server")
        job_id = launch_from_dialog(tmux, spec, is_ticker)
        screen = tmux.wait(loss_of, 240, "a loss in the job view")
        first = loss_of(screen)
        tmux.wait(lambda s: loss_of(s) not in (None, first), 120, "the loss to move on")
        # The job is the server's: the other operator's CLI sees it.
        assert job_id in {v["job_id"] for v in alice.json("jobs")}
        tmux.keys("3")
        tmux.wait(lambda s: job_id in s and "Placement" in s, 10, "the jobs view")
        tmux.keys("s")
        tmux.wait(lambda s: "Stop job" in s, 10, "the stop confirmation")
        tmux.keys("y")
        tmux.wait(lambda s: "Stop job" not in s, 10, "the confirmation to close")
        tmux.keys("3")
        tmux.wait(lambda s: re.search(rf"{job_id}\s+stopped", s), 90, "the job stopped")
        tmux.keys("q")
        deadline = time.monotonic() + 10
        while tmux.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not tmux.alive(), "the app did not quit on q"
        assert alice.json("status", job_id)["state"] == "stopped"
    finally:
        tmux.kill()
        if job_id:
            alice.run("stop", job_id, "--grace", "1", check=False)


def test_prometheus_scrapes_the_server_and_the_exporter_while_a_job_trains(
        served: tuple[TestBed, Operator, Operator], tmp_path: Path) -> None:
    """Acceptance (issue 34): a real Prometheus scrapes the server's /metrics ([server]
    metrics_listen) and `rigdeck exporter` (through the server) while a gloo job reports its
    loss with runtime.report; its HTTP API answers the job's loss and its GPUs with job and rank
    labels from both, and promtool accepts both expositions."""
    require(shutil.which("prometheus"), PROMETHEUS_MISSING)
    require(shutil.which("promtool"), PROMTOOL_MISSING)
    bed, alice, _ = served
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    # Steps 1 to 3 (loss 1/3), then it holds before its last step until stopped.
    spec = alice.spec("scraped", f"""
command = ["{{python}}", "{TRAIN}", "--steps", "4", "--ckpt", "{ckpt}", "--sleep", "0.1", "--first-attempt-holds"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 2
hosts = ["h2", "h3"]
gpus_per_node = 1
[env]
OMP_NUM_THREADS = "1"
""")
    job_id = alice.json("launch", str(spec))["job_id"]
    server_at = f"{bed.host(1).address}:{METRICS_PORT}"
    exporter = Exporter(alice.inventory, "127.0.0.1:0", alice.env)
    try:
        exporter_url = exporter.url(60)
        assert "from the server's controller" in exporter.output()
        exporter_at = exporter_url.removeprefix("http://").removesuffix("/metrics")

        def at_step_3() -> bool:
            r = read(get(f"http://{server_at}/metrics")[2].decode())
            steps = [float(v) for (n, ls), v in r.samples.items() if n == "rigdeck_job_step"
                     and dict(ls)["job_id"] == job_id]
            return steps == [3.0]

        wait_until(at_step_3, 120, "the server's /metrics has the job at step 3")
        for url in (f"http://{server_at}/metrics", exporter_url):
            text = get(url)[2].decode()
            assert read(text).value("rigdeck_job_loss", job_id=job_id, name="scraped") == pytest.approx(1 / 3)
            done = promtool_check(text)
            assert (done.returncode, done.stdout + done.stderr) == (0, ""), url
        with prometheus(tmp_path, server_at, exporter_at) as prom:
            loss = query(prom, f'rigdeck_job_loss{{job_id="{job_id}"}}', count=2)
            assert sorted(s["metric"]["instance"] for s in loss) == sorted([server_at, exporter_at])
            assert [(s["metric"]["name"], s["metric"]["user"]) for s in loss] == [("scraped", "root")] * 2
            assert [float(s["value"][1]) for s in loss] == pytest.approx([1 / 3, 1 / 3])
            gpus = query(prom, f'rigdeck_gpu_utilization_ratio{{job_id="{job_id}"}}', count=4)
            placed = {(g["metric"]["instance"], g["metric"]["host"], g["metric"]["gpu"], g["metric"]["rank"])
                      for g in gpus}
            view = alice.json("status", job_id)
            ranks = {(r["host"], str(r["gpu"]), str(r["rank"])) for r in view["ranks"]}
            assert sorted((h, r) for h, _g, r in ranks) == [("h2", "0"), ("h3", "1")], view["ranks"]
            assert placed == {(at, *rank) for at in (server_at, exporter_at) for rank in ranks}
            assert {g["metric"]["job"] for g in gpus} == {"rigdeck"} and {g["metric"]["user"] for g in gpus} == {"root"}
    finally:
        exporter.stop()
        alice.run("stop", job_id, "--grace", "1", check=False)
    assert "rigdeck exporter: stopped" in exporter.output()
