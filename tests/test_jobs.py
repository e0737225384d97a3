"""Jobs across test bed hosts (gloo on CPU, simulated GPUs): launchers, placement, stop, failure,
restart, disconnect, bad specs. Everything goes through the real CLI."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests._require import require
from tests.kit import PROBE, ROOT, TICKER, TRACKERS, wait_until
from tests.kit.bedcli import Cli, tagged  # tests/test_ui_e2e.py imports tagged from here too

pytestmark = pytest.mark.testbed


@pytest.mark.parametrize("launcher", ["direct", "torchrun", "mpirun"])
def test_each_launcher_gets_agreeing_cluster_files(cli: Cli, launcher: str) -> None:
    mpi = ""
    if launcher == "mpirun":
        ssh = (f"-i {cli.bed.user_key} -o UserKnownHostsFile={cli.bed.known_hosts} "
               "-o StrictHostKeyChecking=yes -o BatchMode=yes")
        mpi = f'[mpi]\ncustom_options = ["-mca", "plm_rsh_args", "{ssh}"]\n'
    spec = cli.spec(f"probe-{launcher}", f"""
command = ["{{python}}", "{PROBE}"]
workdir = "{ROOT}"
launcher = "{launcher}"
nodes = 3
gpus_per_node = 2
max_runtime = "5m"
[env]
OMP_NUM_THREADS = "1"
[hyperparameters]
lr = 0.1
epochs = 2
[model_parallel]
partitions = 6
microbatches = 6
profile_batch = [12, 4]
{mpi}""")
    view = cli.json("launch", str(spec), "--wait", timeout=240)
    assert view["state"] == "succeeded", json.dumps(view, indent=1)[:3000]
    assert [n["host"] for n in view["placement"]] == ["h1", "h2", "h3"]
    reports = []
    for h in cli.bed.hosts:
        probe_dir = h.state_dir / "jobs" / view["job_id"] / "probe"
        reports += [json.loads(p.read_text()) for p in sorted(probe_dir.glob("rank-*.json"))]
    assert sorted(r["rank"] for r in reports) == list(range(6))
    bad = [r for r in reports if not r["ok"]]
    assert not bad, bad
    assert len(view["ranks"]) == 6 and all(r["state"] == "exited" for r in view["ranks"])
    # Every rank, whoever started it, got the [model_parallel] table as the runtime reads it.
    assert [json.loads(r["model_parallel"] or "null") for r in reports] == [{
        "partitions": 6, "microbatches": 6, "pipeline": "simple", "optimize": "speed",
        "activation_checkpointing": False, "profile_batch": [12, 4], "batch_size": 12, "plan": None}] * 6


def test_two_jobs_never_share_a_gpu_and_a_third_is_told_why(cli: Cli) -> None:
    body = f"""
command = ["{{python}}", "{TICKER}", "--steps", "600", "--sleep", "0.1"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 3
gpus_per_node = 2
"""
    a = cli.json("launch", str(cli.spec("fill-a", body)))
    b = cli.json("launch", str(cli.spec("fill-b", body)))
    try:
        for host in ("h1", "h2", "h3"):
            ga = next(n["gpus"] for n in a["placement"] if n["host"] == host)
            gb = next(n["gpus"] for n in b["placement"] if n["host"] == host)
            assert len(ga) == 2 and len(gb) == 2 and not set(ga) & set(gb)
        third = cli.run("launch", str(cli.spec("no-room", body)), "--no-queue", check=False)
        assert third.returncode == 2
        assert "asks 3 nodes x 2 GPUs" in third.stderr or "2 GPUs" in third.stderr, third.stderr
        assert "free" in third.stderr
        # Without --no-queue it waits, and says for what: the hosts and the jobs holding their GPUs.
        queued = cli.json("launch", str(cli.spec("no-room", body)))
        assert queued["state"] == "queued" and queued["placement"] == []
        assert "free" in queued["waiting"] and a["job_id"] in queued["waiting"], queued["waiting"]
        line = cli.json("queue")
        assert [(e["position"], e["job_id"]) for e in line] == [(1, queued["job_id"])]
        assert line[0]["waiting"] == queued["waiting"] and line[0]["gpus"] == 6
        cancelled = cli.json("stop", queued["job_id"])  # a queued job leaves the line, no host touched
        assert cancelled["state"] == "stopped" and cancelled["cause"]["message"] == "cancelled while queued"
        assert cli.json("queue") == []
    finally:
        cli.run("stop", a["job_id"], "--grace", "2")
        cli.run("stop", b["job_id"], "--grace", "2")
    # Freed: the same request fits again.
    c = cli.json("launch", str(cli.spec("fits-again", body)))
    cli.run("stop", c["job_id"], "--grace", "2")


def stepped(cli: Cli, job_id: str, n: int) -> None:
    """Until each of the job's ``n`` ranks reported a step (its metrics file on its host holds
    a record): a rank that ignores SIGTERM does so by then. A stop sent while a rank's
    interpreter is still starting ends it at once (fresh runs 23 and 24: a stop, quick through
    the CLI zygote, came before the grace could have passed)."""
    def count() -> int:
        files = [h.state_dir / "jobs" / job_id / "metrics" / f"rank-{r}.jsonl" for h in cli.bed.hosts for r in range(n)]
        return sum(1 for f in files if f.exists() and f.stat().st_size > 0)
    wait_until(lambda: count() == n, 60, f"a step from each of {job_id}'s {n} ranks")


def test_stop_kills_everything_and_a_sigterm_ignorer_after_the_grace(cli: Cli) -> None:
    spec = cli.spec("stubborn", f"""
command = ["{{python}}", "{TICKER}", "--steps", "100000", "--ignore-term"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 3
processes_per_node = 2
""")
    view = cli.json("launch", str(spec))
    job_id = view["job_id"]
    wait_until(lambda: all(len(v) >= 2 for v in tagged(cli.bed, job_id).values()), 30, "ranks running")
    stepped(cli, job_id, 6)
    start = time.monotonic()
    stopped = cli.json("stop", job_id, "--grace", "3")
    took = time.monotonic() - start
    assert stopped["state"] == "stopped"
    assert took >= 3.0, "SIGKILL came before the grace period ended"
    assert took < 15.0, f"the stop took {took:.1f} s: its --grace 3 was not the one applied"
    assert tagged(cli.bed, job_id) == {"h1": [], "h2": [], "h3": []}
    st = cli.json("status", job_id)
    # Each rank says it was stopped, not that it failed or was lost (SIGKILL, past its grace, took
    # its wrapper too: no exit record says how it ended).
    assert [r["state"] for r in st["ranks"]] == ["stopped"] * 6, st["ranks"]


def test_stop_returns_when_nothing_is_left_and_a_launch_behind_a_stop_starts_on_the_release(cli: Cli) -> None:
    """Issue 30: `rigdeck stop` returns only once no process of the job is left on any host and
    its GPU claims are free; a job that needs the same GPUs, launched at once behind a
    `stop --no-wait`, starts within 3 s of those claims being released, and says it waited."""
    import threading

    from tests import bedclean

    body = f"""
command = ["{{python}}", "{TICKER}", "--steps", "100000", "--ignore-term"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 3
gpus_per_node = 4
"""  # every GPU of every host; each rank ignores SIGTERM: a stop takes its whole grace
    bed = cli.bed

    def held(job_id: str) -> list[str]:
        procs = [f"{h}: {pid}" for h, ps in bedclean.job_processes(bed).items() for pid, j, _ in ps if j == job_id]
        claims = [f"{h.name} GPU {g}" for h in bed.hosts for g, j in bedclean.claims_held(h).items() if j == job_id]
        return procs + claims

    first = cli.json("launch", str(cli.spec("whole-1", body)))["job_id"]
    wait_until(lambda: all(tagged(bed, first).values()), 60, "ranks running on every host")
    stepped(cli, first, 12)
    began = time.monotonic()
    out = cli.run("stop", first, "--grace", "2")
    took = time.monotonic() - began
    assert held(first) == [], held(first)  # the moment it returned: no process, no claim
    # It waited for the grace (SIGKILL after it), not for the spec's 30 s: a loaded 2-core machine
    # has taken 13 s to stop and sweep 12 ranks on 3 hosts.
    assert 2.0 <= took < 20.0, took
    assert "waiting until no process of it is left" in out.stdout, out.stdout
    assert f"{first}: stopped after" in out.stdout and "GPU claims released" in out.stdout, out.stdout
    print(f"\nstop (waiting) returned after {took:.1f} s:\n{out.stdout}")

    second = cli.json("launch", str(cli.spec("whole-2", body)))["job_id"]
    wait_until(lambda: all(tagged(bed, second).values()), 60, "the second job's ranks running")
    stepped(cli, second, 12)
    released: list[float] = []
    done = threading.Event()

    def watch() -> None:  # the moment the last of the second job's claims goes, read from the hosts
        while not done.is_set():
            if not held(second):
                released.append(time.time())
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    # A grace long enough that the launch below (a CLI starting up, on a loaded machine) comes
    # while the second job is still stopping: it must queue behind the stop, not find it over.
    stopping = cli.run("stop", second, "--grace", "8", "--no-wait")
    assert f"{second}: stopping" in stopping.stdout, stopping.stdout
    third = cli.run("launch", str(cli.spec("whole-3", body)))  # at once, for the same GPUs
    try:
        done.set()
        watcher.join(5)
        assert released, "the second job's claims were never seen released"
        view = cli.json("status", "whole-3")
        assert view["state"] in ("starting", "running"), (view["state"], view.get("waiting"), third.stdout)
        waited = [e for e in view["events"] if e["event"] == "waited for stop"]
        assert waited and waited[0]["jobs"] == [second], view["events"]
        late = view["started"] - released[0]
        print(f"third job started {late:.2f} s after the second one's claims were released;\n{third.stdout}")
        assert late <= 3.0, late
        assert f"until {second} had stopped" in third.stdout, third.stdout
        assert cli.json("status", second)["state"] == "stopped"
    finally:
        cli.run("stop", "whole-3", "--grace", "1", check=False)


def test_max_runtime_stops_the_job_with_the_grace_period(cli: Cli) -> None:
    spec = cli.spec("overtime", f"""
command = ["{{python}}", "{TICKER}", "--steps", "100000", "--ignore-term"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 2
processes_per_node = 1
max_runtime = "4s"
grace = "2s"
""")
    start = time.monotonic()
    proc = cli.run("launch", str(spec), "--wait", "--json", check=False, timeout=120)
    took = time.monotonic() - start
    assert proc.returncode == 1 and proc.stdout.strip(), proc.stderr  # it ran, and did not succeed
    view = json.loads(proc.stdout)
    assert view["state"] == "stopped", json.dumps(view, indent=1)[:2000]
    assert "max_runtime of 4s exceeded" in view["cause"]["message"], view["cause"]
    # 4 s of running, then SIGTERM (ignored), the 2 s grace and SIGKILL: not before 6 s.
    assert 6.0 <= took < 60.0, took
    assert tagged(cli.bed, view["job_id"]) == {"h1": [], "h2": [], "h3": []}
    out = cli.run("status", view["job_id"]).stdout
    assert "max_runtime of 4s exceeded" in out, out


def environ(cli: Cli, host: int, pid: int) -> str:
    """A process's environment on a bed host, as the kernel holds it."""
    return cli.bed.exec(host, ["cat", f"/proc/{pid}/environ"]).stdout


def test_kill9_of_one_rank_fails_the_gang_then_restart_once(cli: Cli) -> None:
    """A gang restart after a rank's SIGKILL, once. The job's ``env_from_file`` (a secret on the
    workstation) reaches the ranks of each attempt, read again at the restart, and its value is
    nowhere in the history (its database files), ``jobs --json`` or ``status --json``: the names only."""
    secret = f"tok-{os.urandom(8).hex()}"
    env_file = cli.tmp / "fragile.env"
    env_file.write_text(f"# a secret the spec does not hold\nFRAGILE_TOKEN={secret}\n")
    spec = cli.spec("fragile", f"""
command = ["{{python}}", "{TICKER}", "--steps", "100000"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 3
processes_per_node = 2
env_from_file = "{env_file.name}"
[restart]
max_restarts = 1
""")
    waiter = cli.popen("launch", str(spec), "--wait", "--json")
    try:
        home_jobs = lambda: sorted((cli.bed.hosts[1].state_dir / "jobs").glob("fragile-*"))  # noqa: E731
        wait_until(lambda: home_jobs() and (home_jobs()[-1] / "ranks" / "rank-3.json").exists(), 60, "rank 3")
        job_id = home_jobs()[-1].name
        victim = json.loads((home_jobs()[-1] / "ranks" / "rank-3.json").read_text())["pid"]
        assert f"FRAGILE_TOKEN={secret}\0" in environ(cli, 2, victim)
        cli.bed.exec(2, ["kill", "-9", str(victim)])  # rank 3 is h2's second rank
        killed_at = time.monotonic()

        def all_hosts_ended_once() -> bool:
            events = cli.json("status", job_id).get("events", [])
            return any(e.get("event") == "restart" for e in events)

        wait_until(all_hosts_ended_once, 30, "the gang to fail and restart")
        assert time.monotonic() - killed_at < 15
        st = cli.json("status", job_id)
        restart = next(e for e in st["events"] if e.get("event") == "restart")
        assert restart["cause"]["rank"] == 3 and restart["cause"]["host"] == "h2"
        assert restart["cause"]["signal"] == 9
        wait_until(lambda: cli.json("status", job_id)["restarts"] == 1
                   and all(r["state"] == "running" for r in cli.json("status", job_id)["ranks"])
                   and len(cli.json("status", job_id)["ranks"]) == 6, 60, "the restarted gang running")
        # A second failure exhausts max_restarts: the job fails with that rank as the cause.
        rank_file = cli.bed.hosts[0].state_dir / "jobs" / job_id / "ranks" / "rank-0.json"
        restarted = json.loads(rank_file.read_text())["pid"]
        assert f"FRAGILE_TOKEN={secret}\0" in environ(cli, 1, restarted)  # read again for the restart
        cli.bed.exec(1, ["kill", "-9", str(restarted)])
        killed_at = time.monotonic()
        out, _ = waiter.communicate(timeout=60)
        final = json.loads(out)
        assert final["state"] == "failed" and final["restarts"] == 1
        assert final["cause"]["rank"] == 0 and final["cause"]["signal"] == 9
        ended = {h: s.get("ended") for h, s in final["hosts"].items()}
        assert all(e is not None for e in ended.values())
        assert max(ended.values()) - min(ended.values()) < 5.0, ended
        assert tagged(cli.bed, job_id) == {"h1": [], "h2": [], "h3": []}
        # The value is the ranks' alone: not in what the controller keeps or shows.
        shown = {"jobs --json": cli.run("jobs", "--json").stdout, "launch --wait --json": out,
                 "status --json": cli.run("status", job_id, "--json").stdout}
        shown.update({f.name: f.read_bytes().decode("latin-1") for f in (cli.tmp / "home").glob("history.sqlite*")})
        print({k: (len(v), secret in v) for k, v in shown.items()})
        assert "history.sqlite" in shown and not [k for k, v in shown.items() if secret in v]
        assert any("FRAGILE_TOKEN" in v for k, v in shown.items() if k.startswith("history"))  # the name is kept
    finally:
        if waiter.poll() is None:
            waiter.kill()


def test_job_survives_cli_exit_and_a_cut_path_then_logs_and_metrics_are_exact(cli: Cli) -> None:
    steps = 40  # 20 s of training: the path is cut for 12 of them
    spec = cli.spec("steady", f"""
command = ["{{python}}", "{TICKER}", "--steps", "{steps}", "--sleep", "0.5"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 3
processes_per_node = 2
""")
    job_id = cli.json("launch", str(spec))["job_id"]  # the CLI exits here; the job goes on
    gw = cli.bed.gateway
    rules = [["iptables", "-I", "INPUT", "-s", gw, "-j", "DROP"], ["iptables", "-I", "OUTPUT", "-d", gw, "-j", "DROP"]]
    for r in rules:
        res = cli.bed.exec(2, r)
        require(res.returncode == 0, f"iptables unusable in the namespace: {res.stderr.strip()}")
    try:
        time.sleep(12)
        h2_ranks = sorted((cli.bed.hosts[1].state_dir / "jobs" / job_id / "logs").glob("rank-*.log"))
        assert len(h2_ranks) == 2  # ranks on the cut-off host kept running and writing
    finally:
        for r in rules:
            cli.bed.exec(2, [r[0], "-D", *r[2:]])
    wait_until(lambda: cli.json("status", job_id)["state"] == "succeeded", 120, "job success")
    metrics = cli.json("metrics", job_id)
    steps_seen = [(m["rank"], m["step"]) for m in metrics if m.get("loss") is not None]
    assert sorted(steps_seen) == sorted((r, s) for r in range(6) for s in range(steps))
    logs = cli.run("logs", job_id).stdout.splitlines()
    step_lines = [ln for ln in logs if "step=" in ln]
    assert len(step_lines) == 6 * steps and len(set(step_lines)) == 6 * steps
    assert all(ln.startswith(("[h1 r0]", "[h1 r1]", "[h2 r2]", "[h2 r3]", "[h3 r4]", "[h3 r5]")) for ln in logs)
    only_r3 = cli.run("logs", job_id, "--rank", "3").stdout.splitlines()
    assert only_r3 and all(ln.startswith("[h2 r3]") for ln in only_r3)


def test_tracker_links_the_ranks_print_are_in_status(cli: Cli) -> None:
    """Rank 0 (h1) prints what W&B prints, coloured, its run twice; rank 1 (h2) what MLflow logs.
    Both runs are in ``status --json``'s links, once each, with the rank and host that printed
    them; the project and experiment pages are not runs."""
    wandb_run = "https://wandb.ai/acme/llm-pretrain/runs/3kx9q2vb"
    mlflow_run = "http://10.213.1.5:5000/#/experiments/7/runs/0f1e2d3c4b5a69788796a5b4c3d2e1f0"
    spec = cli.spec("trackers", f"""
command = ["{{python}}", "{TRACKERS}"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 2
processes_per_node = 1
""")
    view = cli.json("launch", str(spec), "--wait", timeout=240)
    assert view["state"] == "succeeded", json.dumps(view, indent=1)[:3000]
    status = cli.json("status", view["job_id"])
    assert sorted(status["links"], key=lambda link: link["kind"]) == [
        {"kind": "mlflow", "url": mlflow_run, "rank": 1, "host": "h2"},
        {"kind": "wandb", "url": wandb_run, "rank": 0, "host": "h1"},
    ]
    assert [link["url"] for link in status["hosts"]["h1"]["links"]] == [wandb_run]  # its second line adds nothing
    text = cli.run("status", view["job_id"]).stdout
    assert f"link     wandb {wandb_run} (rank 0 on h1)" in text, text


@pytest.mark.parametrize(
    "body, needle",
    [
        ('command = ["x"]\nlauncher = "slurm"\nnodes = 1\n', "launcher"),
        ('command = []\nnodes = 1\n', "command"),
        ('command = ["x"]\nnodes = "3"\n', "nodes"),
        ('command = ["x"]\nnodes = 1\ngpus_per_node = 99\n', "99"),
        ('command = ["x"]\nhosts = ["h1", "nosuchhost"]\nprocesses_per_node = 1\n', "nosuchhost"),
        ('command = ["x"]\nnodes = 1\n[env]\nX = 5\n', "env"),
        ('command = ["x"]\nnodes = 2\nprocesses_per_node = 1\n[model_parallel]\npartitions = 3\n'
         'microbatches = 4\nprofile_batch = [8]\n', "model_parallel.partitions"),
        # Worker pools (issue 15): two primaries, zero replicas, an unknown role, a pool pinned
        # to a label no inventory host carries (only the controller knows the inventory).
        ('command = ["x"]\n[[pools]]\nrole = "primary"\n[[pools]]\nrole = "primary"\n',
         "field 'pools[1].role': expected at most one primary pool (pools[0] is the primary already)"),
        ('command = ["x"]\n[[pools]]\nrole = "primary"\n[[pools]]\nrole = "worker"\nreplicas = 0\n',
         "field 'pools[1].replicas': expected an integer >= 1 (pool 'worker'), got 0"),
        ('command = ["x"]\n[[pools]]\nrole = "primary"\n[[pools]]\nrole = "ps"\n',
         "field 'pools[1].role': expected \"primary\" or \"worker\""),
        ('command = ["x"]\n[[pools]]\nrole = "primary"\n[[pools]]\nrole = "parameter_server"\n'
         'labels = ["cpu"]\n', "field 'pools[1].labels': expected labels some inventory host carries "
         "(known: none) (pool 'parameter_server'), got 'cpu'"),
        ('command = ["x"]\n[[pools]]\nrole = "primary"\nhosts = ["h1", "h7"]\n',
         "field 'pools[0].hosts': expected hosts from the inventory (h1, h2, h3) (pool 'primary'), got unknown 'h7'"),
    ],
)
def test_bad_specs_say_why_and_start_nothing(cli: Cli, body: str, needle: str) -> None:
    spec = cli.spec("bad", body)
    before = {h.name: set((h.state_dir / "jobs").glob("*")) for h in cli.bed.hosts}
    proc = cli.run("launch", str(spec), check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr
    after = {h.name: set((h.state_dir / "jobs").glob("*")) for h in cli.bed.hosts}
    assert after == before


@pytest.mark.testbed
def test_a_removed_agent_copy_is_made_again_and_a_job_host_that_cannot_start_fails_its_job(cli: Cli) -> None:
    """The daemon starts job hosts from its unpacked copy of the agent. Someone removes the
    agent's directory while it runs: the next job still starts. A job host that exits before it
    records itself fails the job with the reason, instead of leaving it "starting"."""
    import shutil

    cli.run("deploy")
    spec = cli.spec("copy", f"""
command = ["{{python}}", "{TICKER}", "--steps", "3", "--sleep", "0.05"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 1
processes_per_node = 1
hosts = ["h1"]
""")
    agent_dir = cli.bed.hosts[0].state_dir / "agent"
    shutil.rmtree(agent_dir)  # the daemon runs on; the launch's deploy puts the archive back
    done = cli.json("launch", str(spec), "--wait")
    assert done["state"] == "succeeded", done
    (copy,) = agent_dir.glob("*/unpacked")
    main = copy / "__main__.py"
    good = main.read_bytes()
    main.write_text("raise SystemExit(7)\n")  # damaged: it is there, but cannot start a job host
    try:
        failed = cli.json("launch", str(spec), "--wait", check=False)
    finally:
        main.write_bytes(good)
    assert failed["state"] == "failed", failed
    assert "exited 7 before it started" in failed["cause"]["message"], failed["cause"]
    assert cli.json("launch", str(spec), "--wait")["state"] == "succeeded"
