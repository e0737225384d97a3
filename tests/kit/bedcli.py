"""``rigdeck`` as a person runs it against a test bed (tests/testbed.py), in a test's own
``RIGDECK_HOME`` and inventory; and a job's processes as the bed's hosts see them. The ``cli``
fixture (tests/conftest.py) makes a ``Cli`` for the session's bed, its options from a
``cli_options`` marker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.kit import ROOT, clizygote
from tests.testbed import TestBed


class Cli:
    """rigdeck's command line against ``bed``, in ``tmp``'s home and inventory. Its options, each
    one some test file needs (the ``cli_options`` marker passes them to the fixture's):

    - ``inventory``: more of the inventory's [defaults] (``min_free_mb=1``: launch refuses a
      host only when its state dir has under 1 MB free);
    - ``labels``: host name -> its labels;
    - ``mpi_ssh``: Open MPI's way to the other hosts, the bed's key, in [defaults] env (mpirun
      jobs whose spec says nothing of it, as the examples');
    - ``timeout``: the default limit of ``run`` and ``json`` (a launch --wait of a job that
      trains for a while)."""

    def __init__(self, bed: TestBed, tmp: Path, *, labels: dict[str, list[str]] | None = None,
                 mpi_ssh: bool = False, timeout: float = 180, **inventory: Any):
        self.bed = bed
        self.tmp = tmp
        self.timeout = timeout
        # The hosts run ranks with this interpreter (it has torch), not the system python3.
        defaults: dict[str, Any] = {"python": sys.executable, "connect_timeout": 5.0, **inventory}
        if mpi_ssh:
            ssh = (f"-i {bed.user_key} -o UserKnownHostsFile={bed.known_hosts} "
                   "-o StrictHostKeyChecking=yes -o BatchMode=yes")
            defaults["env"] = {**defaults.get("env", {}), "OMPI_MCA_plm_rsh_args": ssh}
        self.inventory = bed.write_inventory(tmp / "hosts.toml", **defaults)
        for host, words in (labels or {}).items():
            # write_inventory writes one key a line, each host's name first: its labels follow.
            text = self.inventory.read_text()
            marker = f'name = "{host}"\n'
            assert marker in text, text
            self.inventory.write_text(text.replace(marker, marker + f"labels = {json.dumps(words)}\n"))
        self.env = {**os.environ, "RIGDECK_HOME": str(tmp / "home"), "RIGDECK_INVENTORY": str(self.inventory)}

    def run(self, *args: str, check: bool = True, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        """``rigdeck ARGS`` to its end. One still running after ``timeout`` is asked where it is
        (SIGABRT: faulthandler prints every thread's stack) and the test fails saying that, with
        the jobs and the hosts' processes: a hang in CI says where it hung."""
        timeout = self.timeout if timeout is None else timeout
        try:
            # (through this worker's CLI zygote: a forked child of an interpreter that imported
            # rigdeck already, tests/kit/clizygote.py)
            proc: subprocess.CompletedProcess[str] = clizygote.run(
                list(args), {**self.env, "PYTHONFAULTHANDLER": "1"}, timeout, abort=True)
        except subprocess.TimeoutExpired as e:
            out, err = str(e.output or ""), str(e.stderr or "")
            raise AssertionError(f"rigdeck {' '.join(args)} still running after {timeout:.0f}s; its "
                                 f"stdout:\n{out[-3000:]}\nits stderr and threads:\n{err[-12000:]}\n"
                                 f"{self.said_state()}") from None
        if check and proc.returncode != 0:
            raise AssertionError(f"rigdeck {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def said_state(self) -> str:
        """What this test's jobs and the bed's hosts are doing now, as far as can be read: for a
        failure message (never a second failure)."""
        parts = []
        try:
            jobs = subprocess.run([sys.executable, "-m", "tui.cli", "jobs", "--json"], capture_output=True,
                                  text=True, timeout=60, env=self.env, cwd=ROOT)
            for v in json.loads(jobs.stdout or "[]"):
                parts.append(f"job {v['job_id']} {v['state']} on {[n['host'] for n in v.get('placement') or []]} "
                             f"waiting={v.get('waiting')!r} events={json.dumps(v.get('events', [])[-6:])[:1500]}")
                if v["state"] not in ("succeeded", "failed", "stopped"):
                    logs = subprocess.run([sys.executable, "-m", "tui.cli", "logs", v["job_id"]], capture_output=True,
                                          text=True, timeout=60, env=self.env, cwd=ROOT)
                    parts.append(f"its logs' tail:\n{logs.stdout[-3000:]}{logs.stderr[-1000:]}")
            for i, h in enumerate(self.bed.hosts, start=1):
                res = self.bed.exec(i, ["ps", "-ww", "-eo", "pid,ppid,etimes,stat,args"])
                parts.append(f"{h.name} processes:\n{res.stdout[-4000:]}")
                # A link left rate-limited (test_doctor's tbf) makes a job slow, not hung.
                inside = self.bed.exec(i, ["tc", "qdisc", "show", "dev", "eth0"]).stdout.strip()
                outside = subprocess.run(["tc", "qdisc", "show", "dev", h.veth], capture_output=True,
                                         text=True, timeout=10).stdout.strip()
                parts.append(f"{h.name} qdiscs: eth0 {inside!r}, {h.veth} {outside!r}")
        except Exception as e:
            parts.append(f"(could not read more: {type(e).__name__}: {e})")
        return "\n".join(parts)

    def json(self, *args: str, check: bool = True, timeout: float | None = None) -> Any:
        return json.loads(self.run(*args, "--json", check=check, timeout=timeout).stdout)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "tui.cli", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.env, cwd=ROOT)

    def spec(self, name: str, body: str) -> Path:
        path = self.tmp / f"{name}.toml"
        path.write_text(f'name = "{name}"\n' + body)
        return path


def tagged(bed: TestBed, job_id: str) -> dict[str, list[str]]:
    """Processes carrying the job id, per host, seen from inside each host."""
    out = {}
    for i, h in enumerate(bed.hosts, start=1):
        res = bed.exec(i, ["sh", "-c", f"grep -l -a 'RIGDECK_JOB_ID={job_id}' /proc/[0-9]*/environ 2>/dev/null "
                                       "| grep -v self || true"])
        out[h.name] = [ln for ln in res.stdout.split() if "/self/" not in ln and "/thread-self/" not in ln]
    return out


def person_ticker(bed: TestBed, gpus: int, host: str | None = None) -> str:
    """A job spec's body: the stdlib ticker from the bed's shared directory (a person's account
    can read it, and run it with the bed's PERSON_PYTHON), ``gpus`` GPUs on one node."""
    return (f'command = ["{{python}}", "{bed.share_dir / "ticker.py"}", "--steps", "3000", "--sleep", "0.1"]\n'
            f'workdir = "{bed.share_dir}"\nlauncher = "direct"\nnodes = 1\ngpus_per_node = {gpus}\n'
            + (f'hosts = ["{host}"]\n' if host else ""))


def running_ranks(cli: Cli, job_id: str, n: int) -> list[int]:
    """The host-side pids of a job's ``n`` ranks, once all run."""
    from tests.kit import wait_until

    def pids() -> list[int]:
        ranks = cli.json("status", job_id)["ranks"]
        got = [r["pid"] for r in ranks if r.get("pid") and r.get("state") == "running"]
        return got if len(got) == n else []
    return wait_until(pids, 60, f"{n} running ranks of {job_id}", step=0.5)


def owners(bed: TestBed, host: int, pids: list[int]) -> list[str]:
    """The account each of ``pids`` runs as on bed host ``host`` (``ps -o user=``)."""
    return bed.exec(host, ["ps", "-o", "user=", "-p", ",".join(map(str, pids))]).stdout.split()
