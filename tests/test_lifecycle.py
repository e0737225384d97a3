"""The gang lifecycle on the test bed, faults injected for real: two controllers racing for the
same GPUs, kill -9 of a job host and of a rank wrapper, a full disk, a flood of output, many
short jobs. Everything goes through the real CLI, the real agent and real processes."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.kit import ROOT, TICKER, wait_until
from tests.kit.bedcli import Cli, tagged
from tests.testbed import TestBed

# min_free_mb=1: the full-disk test fills a 4 MB state dir, which the default (256 MB) would
# refuse before its job could start.
pytestmark = [pytest.mark.testbed, pytest.mark.cli_options(min_free_mb=1)]

ROUNDS = int(os.environ.get("RIGDECK_CLAIM_ROUNDS", "4"))  # more for a soak run


def host_claims(bed: TestBed) -> dict[str, dict[int, str]]:
    """Every host's claimed GPUs and the job holding each, read on the host itself."""
    out = {}
    code = "import json; from agent import claims; print(json.dumps(claims.held() or {}))"
    for i, h in enumerate(bed.hosts, start=1):
        res = bed.exec(i, ["env", f"PYTHONPATH={ROOT}", sys.executable, "-c", code])
        out[h.name] = {int(g): v.get("job_id") for g, v in json.loads(res.stdout).items()}
    return out


def rank_gpus(bed: TestBed) -> dict[tuple[str, int], set[str]]:
    """(host, GPU) -> the jobs whose live processes were given that GPU, from their environment."""
    code = r"""
import json, os
out = []
for pid in os.listdir('/proc'):
    if not pid.isdigit():
        continue
    try:
        env = dict(kv.split('=', 1) for kv in open(f'/proc/{pid}/environ', 'rb').read().decode(
            'utf-8', 'replace').split('\0') if '=' in kv)
    except OSError:
        continue
    if 'RIGDECK_JOB_ID' in env and 'RIGDECK_GPUS' in env and 'RIGDECK_LOCAL_RANK' in env:
        gpus = env['RIGDECK_GPUS'].split(',')
        out.append([env['RIGDECK_JOB_ID'], gpus[int(env['RIGDECK_LOCAL_RANK'])]])
print(json.dumps(out))
"""
    seen: dict[tuple[str, int], set[str]] = {}
    for i, h in enumerate(bed.hosts, start=1):
        for job, gpu in json.loads(bed.exec(i, [sys.executable, "-c", code]).stdout):
            seen.setdefault((h.name, int(gpu)), set()).add(job)
    return seen


def test_two_controllers_racing_for_the_same_gpus_never_share_one(cli: Cli, tmp_path: Path) -> None:
    spec = cli.spec("race", f"""
command = ["{{python}}", "{TICKER}", "--steps", "600", "--sleep", "0.1"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 3
gpus_per_node = 4
""")
    homes = [{**cli.env, "RIGDECK_HOME": str(tmp_path / f"home{k}")} for k in (1, 2)]

    def launch(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        # --no-queue: the loser is refused, not queued (this is about the hosts' claims).
        return subprocess.run([sys.executable, "-m", "tui.cli", "launch", str(spec), "--json", "--no-queue"],
                              capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)

    refusals: list[str] = []
    for round_ in range(ROUNDS):
        with ThreadPoolExecutor(2) as pool:
            a, b = pool.map(launch, homes)
        winners = [(p, env) for p, env in zip((a, b), homes, strict=True) if p.returncode == 0]
        losers = [p for p in (a, b) if p.returncode != 0]
        assert len(winners) == 1 and len(losers) == 1, \
            f"round {round_}: {a.returncode} {b.returncode}\n{a.stderr}\n{b.stderr}"
        job_id = json.loads(winners[0][0].stdout)["job_id"]
        loser = losers[0]
        assert loser.returncode == 2, loser.stderr
        # Refused naming the holder: at the claim (the race), or from what the hosts report.
        assert any(f"{how} job {q}{job_id}" in loser.stderr for how in ("held by", "claimed by", "busy with")
                   for q in ("", "'")), loser.stderr
        refusals.append(loser.stderr.split(":", 2)[-1][:60])
        # The hosts say the winner holds every GPU, and no GPU was given to two jobs.
        claims = host_claims(cli.bed)
        assert claims == {h: {g: job_id for g in range(4)} for h in ("h1", "h2", "h3")}, claims
        wait_until(lambda: len(rank_gpus(cli.bed)) == 12, 30, "every rank of the winner")
        assert all(jobs == {job_id} for jobs in rank_gpus(cli.bed).values())
        stop = subprocess.run([sys.executable, "-m", "tui.cli", "stop", job_id, "--grace", "1"], capture_output=True,
                              text=True, timeout=120, env=winners[0][1], cwd=ROOT)
        assert stop.returncode == 0, stop.stderr
        assert host_claims(cli.bed) == {"h1": {}, "h2": {}, "h3": {}}  # the stop gave every GPU back
    print(f"{ROUNDS} rounds, one launch refused in each:", *sorted(set(r.split("(")[0] for r in refusals)), sep="\n  ")


def _jobhost_pid(bed: TestBed, i: int, job_id: str) -> int:
    st = json.loads((bed.hosts[i - 1].state_dir / "jobs" / job_id / "state.json").read_text())
    return int(st["jobhost_pid"])


def _attempt_procs(bed: TestBed, i: int, job_id: str, attempt: int) -> list[str]:
    res = bed.exec(i, ["sh", "-c", f"grep -l -a -z -x 'RIGDECK_RESTART_COUNT={attempt}' "
                                   f"$(grep -l -a -z -x 'RIGDECK_JOB_ID={job_id}' /proc/[0-9]*/environ 2>/dev/null) "
                                   "2>/dev/null | grep -v self || true"])
    return res.stdout.split()


def test_kill9_of_a_job_host_stops_its_ranks_and_fails_the_job(cli: Cli) -> None:
    spec = cli.spec("hostkill", f"""
command = ["{{python}}", "{TICKER}", "--steps", "100000"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 3
processes_per_node = 2
""")
    job_id = cli.json("launch", str(spec))["job_id"]
    wait_until(lambda: len([r for r in cli.json("status", job_id)["ranks"] if r["state"] == "running"]) == 6, 60,
               "six running ranks")
    pid = _jobhost_pid(cli.bed, 2, job_id)
    # The job host and its rank wrappers run from the agent's byte-compiled copy, without site.
    argv = cli.bed.exec(2, ["cat", f"/proc/{pid}/cmdline"]).stdout.split("\0")
    assert argv[1] == "-S" and argv[2].endswith("/unpacked") and argv[3] == "jobhost", argv
    argvs = [cli.bed.exec(2, ["cat", e.replace("/environ", "/cmdline")]).stdout.split("\0")
             for e in tagged(cli.bed, job_id)["h2"]]
    wrappers = [a for a in argvs if a[3:4] == ["rank"]]
    assert len(wrappers) == 2 and all(a[1] == "-S" and a[2].endswith("/unpacked") for a in wrappers), argvs
    cli.bed.exec(2, ["kill", "-9", str(pid)])
    killed = time.monotonic()
    wait_until(lambda: tagged(cli.bed, job_id)["h2"] == [], 10, "h2 to have no process of the job")
    print(f"\njob host kill: h2 clean after {time.monotonic() - killed:.1f}s")
    assert time.monotonic() - killed < 10
    st = cli.json("status", job_id)
    assert st["state"] == "failed"
    assert st["cause"]["host"] == "h2" and f"job host process {pid} was killed by signal 9" in st["cause"]["message"]
    wait_until(lambda: tagged(cli.bed, job_id) == {"h1": [], "h2": [], "h3": []}, 20, "the gang stopped")


def test_kill9_of_a_job_host_then_a_restart_repeats_no_step(cli: Cli) -> None:
    steps = 80
    spec = cli.spec("hostrestart", f"""
command = ["{{python}}", "{TICKER}", "--steps", "{steps}", "--sleep", "0.1"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 3
processes_per_node = 2
[restart]
max_restarts = 1
""")
    waiter = cli.popen("launch", str(spec), "--wait", "--json")
    try:
        jobs_dir = cli.bed.hosts[1].state_dir / "jobs"
        wait_until(lambda: any((d / "ranks" / "rank-3.json").exists() for d in jobs_dir.glob("hostrestart-*")),
                   60, "rank 3 on h2")
        job_id = max(jobs_dir.glob("hostrestart-*"), key=lambda d: d.stat().st_mtime).name
        time.sleep(2)  # some steps done
        pid = _jobhost_pid(cli.bed, 2, job_id)
        cli.bed.exec(2, ["kill", "-9", str(pid)])
        killed = time.monotonic()
        wait_until(lambda: _attempt_procs(cli.bed, 2, job_id, 0) == [], 10, "no process of attempt 0 on h2")
        print(f"\njob host kill with a restart: attempt 0 gone from h2 after {time.monotonic() - killed:.1f}s")
        assert time.monotonic() - killed < 10
        out, err = waiter.communicate(timeout=180)
        final = json.loads(out)
        assert final["state"] == "succeeded" and final["restarts"] == 1, err
        restart = next(e for e in final["events"] if e.get("event") == "restart")
        assert restart["cause"]["host"] == "h2" and f"job host process {pid}" in restart["cause"]["message"]
        records = [r for r in cli.json("metrics", job_id) if r.get("loss") is not None]
        pairs = [(r["rank"], r["step"]) for r in records]
        assert len(pairs) == len(set(pairs)) == 6 * steps  # each (rank, step) once: the last attempt's
        assert {r["restart"] for r in records} == {1}
        assert tagged(cli.bed, job_id) == {"h1": [], "h2": [], "h3": []}
    finally:
        if waiter.poll() is None:
            waiter.kill()


@pytest.mark.parametrize("launcher", ["direct", "torchrun"])
def test_kill9_of_a_rank_wrapper_fails_the_job_naming_rank_and_wrapper(cli: Cli, launcher: str) -> None:
    spec = cli.spec(f"wrapkill-{launcher}", f"""
command = ["{{python}}", "{TICKER}", "--steps", "100000"]
workdir = "{ROOT}"
launcher = "{launcher}"
nodes = 3
processes_per_node = 2
""")
    job_id = cli.json("launch", str(spec))["job_id"]
    rank_file = cli.bed.hosts[1].state_dir / "jobs" / job_id / "ranks" / "rank-3.json"
    wait_until(rank_file.exists, 60, "rank 3 on h2")
    rec = json.loads(rank_file.read_text())
    cli.bed.exec(2, ["kill", "-9", str(rec["wrapper_pid"])])
    killed = time.time()  # the bed's hosts share this machine's clock

    def failed() -> bool:
        return cli.json("status", job_id)["state"] == "failed"

    wait_until(failed, 60, "the job to fail")
    # How fast h2's job host failed the job, from its own record: the CLI's polls (a second or
    # more each on a loaded 2-core CI machine) are not part of it.
    state = json.loads((cli.bed.hosts[1].state_dir / "jobs" / job_id / "state.json").read_text())
    assert state["state"] == "failed" and state["ended"] - killed < 10, (state["ended"] - killed, state)
    cause = cli.json("status", job_id)["cause"]
    print(f"\nwrapper kill ({launcher}): failed by h2 {state['ended'] - killed:.1f}s after it: {cause['message']}")
    assert cause["rank"] == 3 and cause["host"] == "h2", cause
    assert f"rank 3's wrapper (pid {rec['wrapper_pid']}) was killed by signal 9" in cause["message"] or (
        launcher == "torchrun" and f"rank 3's wrapper (pid {rec['wrapper_pid']})" in cause["message"]), cause
    wait_until(lambda: tagged(cli.bed, job_id) == {"h1": [], "h2": [], "h3": []}, 15, "no process left on any host")


def test_a_full_disk_is_the_cause_and_a_nearly_full_host_is_refused(cli: Cli) -> None:
    jobs = "/root/.rigdeck/jobs"
    cli.bed.exec(2, ["mkdir", "-p", jobs])
    assert cli.bed.exec(2, ["mount", "-t", "tmpfs", "-o", "size=4m", "rdk-small", jobs]).returncode == 0
    try:
        spec = cli.spec("diskfill", f"""
command = ["{{python}}", "-c", "import time\\nfor i in range(100000):\\n    print(f'step {{i}} loss=0.5', \
'x' * 2000, flush=True)\\n    time.sleep(0.001)"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 3
processes_per_node = 1
""")
        job_id = cli.json("launch", str(spec))["job_id"]
        wait_until(lambda: cli.json("status", job_id)["state"] == "failed", 60, "the job to fail")
        cause = cli.json("status", job_id)["cause"]
        why = cli.bed.exec(2, ["sh", "-c", f"cat {jobs}/{job_id}/jobhost.stderr; df -h {jobs}"]).stdout
        assert cause["host"] == "h2", (cause, why)
        assert "no space left on tb" in cause["message"] and f"-h2:{jobs}/{job_id}" in cause["message"], (cause, why)
        assert " MB free" in cause["message"]
        print(f"\nfull disk: cause: {cause['message']}")
        wait_until(lambda: tagged(cli.bed, job_id) == {"h1": [], "h2": [], "h3": []}, 15, "no process left")
        # No temp file was left behind by writes that failed.
        left = cli.bed.exec(2, ["sh", "-c", f"find {jobs} -name '*.tmp-*'"]).stdout.split()
        assert left == []

        # Now the disk is nearly full: a launch onto it is refused before anything starts.
        cli.bed.exec(2, ["sh", "-c", f"rm -rf {jobs}/{job_id}; head -c 3500000 /dev/zero > {jobs}/filler"])
        before = {i: set(os.listdir(h.state_dir / "jobs")) for i, h in enumerate(cli.bed.hosts, 1) if i != 2}
        spec2 = cli.spec("nearlyfull", f"""
command = ["{{python}}", "{TICKER}", "--steps", "5"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 3
processes_per_node = 1
""")
        res = cli.run("launch", str(spec2), check=False)
        assert res.returncode == 2
        assert "h2: only 0." in res.stderr and f":{jobs} (at least 1 MB needed: min_free_mb)" in res.stderr, res.stderr
        assert "nothing was started" in res.stderr
        print(f"nearly full: {res.stderr.strip()}")
        after = {i: set(os.listdir(h.state_dir / "jobs")) for i, h in enumerate(cli.bed.hosts, 1) if i != 2}
        assert after == before
        assert cli.bed.exec(2, ["ls", jobs]).stdout.split() == ["filler"]
    finally:
        cli.bed.exec(2, ["umount", "-l", jobs])


FLOOD = r"""
import os, sys
rank = int(os.environ["RANK"])
out = sys.stdout.buffer
if rank == 0:  # a gigabyte: 1000 steps, each a loss line and a megabyte of noise
    noise = (b"n" * 1023 + b"\n") * 1024
    for step in range(1000):
        out.write(b"step %d loss=%.6f\n" % (step, 1.0 / (step + 1)))
        out.write(noise)
    out.write(b"the end of rank 0\n")
else:  # under the cap: a 20 MB line, invalid UTF-8, and steps
    for step in range(50):
        out.write(b"step %d loss=%.6f\n" % (step, 2.0 / (step + 1)))
    out.write(b"L" * (20 << 20) + b"\n")
    out.write(b"invalid \xff\xfe\xc3 utf-8\n")
    for step in range(50, 100):
        out.write(b"step %d loss=%.6f\n" % (step, 2.0 / (step + 1)))
out.flush()
"""


def _rank1_bytes() -> bytes:
    lines = [b"step %d loss=%.6f\n" % (s, 2.0 / (s + 1)) for s in range(50)]
    lines += [b"L" * (20 << 20) + b"\n", b"invalid \xff\xfe\xc3 utf-8\n"]
    lines += [b"step %d loss=%.6f\n" % (s, 2.0 / (s + 1)) for s in range(50, 100)]
    return b"".join(lines)


def test_a_flood_of_output_is_capped_and_read_back_exactly(cli: Cli, tmp_path: Path) -> None:
    script = tmp_path / "flood.py"
    script.write_text(FLOOD)
    spec = cli.spec("flood", f"""
command = ["{{python}}", "{script}"]
workdir = "{ROOT}"
launcher = "direct"
hosts = ["h1"]
processes_per_node = 2
[log]
max_mb = 100
""")
    job_id = cli.json("launch", str(spec))["job_id"]
    wait_until(lambda: cli.json("status", job_id)["state"] in ("succeeded", "failed"), 240, "the flood to end")
    t0 = time.monotonic()
    st = cli.json("status", job_id)
    status_s = time.monotonic() - t0
    assert st["state"] == "succeeded", st
    assert st["last_step"] == 999, st
    assert status_s < 10, f"status took {status_s:.1f}s"  # it reads file tails, never a whole log
    print(f"\nflood: rigdeck status took {status_s:.2f}s (the whole CLI: start, SSH, reply)")
    # Disk use: each rank's log within the cap.
    du = cli.bed.exec(1, ["du", "-sb", f"/root/.rigdeck/jobs/{job_id}/logs"]).stdout.split()[0]
    assert int(du) <= 2 * (100 << 20) + 4 * 4096, du
    print(f"flood: job logs on disk {int(du) / (1 << 20):.1f} MB for 1.0 GB + 20 MB written (cap 100 MB per rank)")
    # Every step of both ranks, each once.
    metrics = [(r["rank"], r["step"]) for r in cli.json("metrics", job_id) if r.get("loss") is not None]
    assert sorted(metrics) == [(0, s) for s in range(1000)] + [(1, s) for s in range(100)]
    # Rank 1 (under the cap): its bytes come back exactly, the 20 MB line as one line.
    raw1 = subprocess.run([sys.executable, "-m", "tui.cli", "logs", job_id, "--rank", "1", "--raw"],
                          capture_output=True, timeout=300, env=cli.env, cwd=ROOT)
    assert raw1.returncode == 0
    assert hashlib.sha256(raw1.stdout).hexdigest() == hashlib.sha256(_rank1_bytes()).hexdigest()
    prefixed = subprocess.run([sys.executable, "-m", "tui.cli", "logs", job_id, "--rank", "1"],
                              capture_output=True, timeout=300, env=cli.env, cwd=ROOT).stdout
    lines = prefixed.split(b"\n")
    assert len(lines) == 103 and lines[50] == b"[h1 r1] " + b"L" * (20 << 20)
    assert lines[51] == b"[h1 r1] invalid \xff\xfe\xc3 utf-8"
    # Rank 0 (a gigabyte): a dropped marker, then exactly the last bytes it wrote.
    raw0 = subprocess.run([sys.executable, "-m", "tui.cli", "logs", job_id, "--rank", "0", "--raw"],
                          capture_output=True, timeout=300, env=cli.env, cwd=ROOT).stdout
    marker, kept = raw0.split(b"\n", 1)
    assert marker.startswith(b"[... ") and marker.endswith(b" dropped ...]"), marker[:80]
    assert kept.endswith(b"the end of rank 0\n") and 25 << 20 <= len(kept) <= 100 << 20
    noise = (b"n" * 1023 + b"\n") * 1024
    whole_steps = kept.split(b"step ")[1:-1]
    assert whole_steps and all(s.split(b"\n", 1)[1] == noise for s in whole_steps)


def _daemon_zombies(bed: TestBed, i: int) -> tuple[int, int]:
    code = r"""
import os
pid = int(open('/root/.rigdeck/run/daemon.pid').read())
z = n = 0
for p in os.listdir('/proc'):
    if p.isdigit():
        try:
            f = open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()
        except OSError:
            continue
        if int(f[1]) == pid:
            n += 1
            z += f[0] == 'Z'
print(z, n)
"""
    z, n = bed.exec(i, [sys.executable, "-c", code]).stdout.split()
    return int(z), int(n)


def test_a_hundred_short_jobs_leave_no_zombie_and_gc_keeps_running_jobs(cli: Cli) -> None:
    from tui.control.hostlinks import HostLinks
    from tui.remote.inventoryfile import load_inventory

    ctl = HostLinks(load_inventory(cli.inventory))
    try:
        host = "h3"
        node = {"host": host, "address": cli.bed.hosts[2].address, "slots": 1, "gpus": []}
        base = {"launcher": "direct", "nodes": [node], "node_index": 0, "master_addr": node["address"],
                "master_port": 29999, "workdir": str(ROOT)}
        ids = [f"short-{k:03d}-{os.getpid()}" for k in range(100)]
        for job_id in ids:
            ctl.agent(host).job_start(plan={**base, "job_id": job_id, "command": ["true"]})
        keeper = f"keeper-{os.getpid()}"
        ctl.agent(host).job_start(plan={**base, "job_id": keeper, "command": ["sleep", "60"]})

        def all_ended() -> bool:
            states = {j["job_id"]: j["state"] for j in ctl.agent(host).job_list()}
            return all(states.get(j) == "succeeded" for j in ids)

        wait_until(all_ended, 120, "100 short jobs to end")
        time.sleep(1.5)  # the daemon's watcher reaps within a second
        zombies, children = _daemon_zombies(cli.bed, 3)
        assert zombies == 0, f"{zombies} zombie(s) among {children} children of the daemon"
        print(f"\n101 jobs started on h3: {zombies} zombies among the daemon's {children} children")
    finally:
        ctl.close()
    # rigdeck gc with a retention of a second: every ended job dir goes, the running one stays.
    inv = cli.bed.write_inventory(cli.tmp / "gc.toml", python=sys.executable, connect_timeout=5.0,
                                  retention={"max_age_days": 1 / 86400})
    time.sleep(1.1)
    out = subprocess.run([sys.executable, "-m", "tui.cli", "gc", "h3", "--json"], capture_output=True, text=True,
                         timeout=120, env={**cli.env, "RIGDECK_INVENTORY": str(inv)}, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)["h3"]
    assert set(ids) <= set(res["removed"]) and keeper in res["running"]
    left = set(os.listdir(cli.bed.hosts[2].state_dir / "jobs"))
    assert keeper in left and not (set(ids) & left)
    print(f"rigdeck gc h3: removed {len(res['removed'])}, running kept: {res['running']}")
    ctl = HostLinks(load_inventory(cli.inventory))
    try:
        ctl.agent(host).job_stop(job_id=keeper, grace_s=0.5)
    finally:
        ctl.close()
