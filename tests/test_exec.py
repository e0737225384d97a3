"""``rigdeck exec``: one command on many hosts at once, through the agents, with no remote shell."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kit import ROOT
from tests.kit.bedcli import Cli
from tests.testbed import TestBed

# Every character a shell would act on: none of it may be parsed, split or expanded on the way.
NASTY = "a b;  $(touch /tmp/rigdeck-exec-pwned) `id` 'q' \"d\" * ~ $HOME \\ | > x & é"


@pytest.mark.testbed
def test_exec_runs_on_every_host_with_each_argument_as_given(cli: Cli) -> None:
    cli.run("deploy")
    pwned = Path("/tmp/rigdeck-exec-pwned")
    pwned.unlink(missing_ok=True)
    probe = ("import json, socket, sys; print(json.dumps({'argv': sys.argv[1:], 'host': socket.gethostname()})); "
             "print('to stderr', file=sys.stderr)")
    res = cli.run("exec", "--all", "--", sys.executable, "-c", probe, NASTY, "", "two\nlines", check=False)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert [ln.split(": ", 1)[0] for ln in lines] == ["h1", "h2", "h3"], res.stdout  # prefixed, in inventory order
    for name, line in zip(("h1", "h2", "h3"), lines, strict=True):
        prefix, _, rest = line.partition(": ")
        assert prefix == name
        got = json.loads(rest)
        assert got["argv"] == [NASTY, "", "two\nlines"]  # literally, the empty one and the newline too
    assert not pwned.exists(), "nothing was run by a shell"
    assert [ln for ln in res.stderr.splitlines() if ln.endswith("to stderr")] == [
        f"{h}: to stderr" for h in ("h1", "h2", "h3")]
    summary = res.stderr.splitlines()[-4:]
    assert [s.split()[0] for s in summary[:3]] == ["h1", "h2", "h3"] and all(" exit 0 " in s + " " for s in summary[:3])
    assert summary[-1] == "0 of 3 host(s) failed"
    # A shell run on each host sees the host's name in $HOSTNAME, as a login shell would.
    named = cli.run("exec", "--all", "--", "sh", "-c", "echo $HOSTNAME")
    assert named.stdout.splitlines() == [f"h{i}: {h.hostname}" for i, h in enumerate(cli.bed.hosts, start=1)], \
        named.stdout


@pytest.mark.testbed
def test_exec_says_which_hosts_failed_and_exits_1(cli: Cli, testbed: TestBed) -> None:
    cli.run("deploy")
    # h2 exits 3, the others 0: the hostname decides, on the host.
    code = f"import socket, sys; sys.exit(3 if socket.gethostname() == {testbed.hosts[1].hostname!r} else 0)"
    res = cli.run("exec", "h1", "h2", "--", sys.executable, "-c", code, check=False)
    assert res.returncode == 1
    tail = res.stderr.splitlines()[-3:]
    assert tail[0].split()[:3] == ["h1", "exit", "0"] and tail[1].split()[:3] == ["h2", "exit", "3"], tail
    assert tail[2] == "1 of 2 host(s) failed: h2"
    # JSON: every host's outcome; a missing program is 127, as a shell says it.
    out = json.loads(cli.run("exec", "--json", "--all", "--", "/no/such/program", "x", check=False).stdout)
    assert out["argv"] == ["/no/such/program", "x"] and out["failed"] == ["h1", "h2", "h3"]
    assert all(h["exit_code"] == 127 and "/no/such/program" in h["error"] for h in out["hosts"])
    # A timeout kills it there, and says so.
    res = cli.run("exec", "h3", "--timeout", "1", "--", "sleep", "30", check=False)
    assert res.returncode == 1 and "timed out (killed)" in res.stderr, res.stderr
    # A signal is named.
    res = cli.run("exec", "h1", "--", "sh", "-c", "kill -TERM $$", check=False)
    assert res.returncode == 1 and "killed by signal 15" in res.stderr, res.stderr
    # A host that cannot be reached is named too; the others answer (a 5 s connect timeout).
    testbed.link_down(2)
    try:
        res = cli.run("exec", "--all", "--", "true", check=False, timeout=120)
    finally:
        testbed.link_up(2)
    tail = res.stderr.splitlines()[-4:]
    assert res.returncode == 1 and tail[1].startswith("h2  unreachable:"), res.stderr
    assert tail[0].split()[:3] == ["h1", "exit", "0"] and tail[2].split()[:3] == ["h3", "exit", "0"]
    assert tail[3] == "1 of 3 host(s) failed: h2"


@pytest.mark.testbed
def test_exec_chooses_hosts_by_label_and_refuses_bad_usage_before_running_anything(cli: Cli, tmp_path: Path) -> None:
    inv = cli.inventory.read_text()
    labelled = tmp_path / "labelled.toml"
    # h2 gets the label "gpu-a" (the bed's inventory lists hosts as [[hosts]] tables in order).
    parts = inv.split("[[hosts]]")
    parts[2] = parts[2].rstrip("\n") + '\nlabels = ["gpu-a"]\n\n'
    labelled.write_text("[[hosts]]".join(parts))
    env = {**cli.env, "RIGDECK_INVENTORY": str(labelled)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "tui.cli", "exec", *args], capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=120)

    res = run("--label", "gpu-a", "--", "hostname")
    assert res.returncode == 0 and res.stdout == f"h2: {cli.bed.hosts[1].hostname}\n", (res.stdout, res.stderr)
    for args, words in [(("h1", "hostname"), "after `--`"), (("--", "hostname"), "name the hosts"),
                        (("h9", "--", "hostname"), "unknown host(s) h9"),
                        (("--label", "nope", "--", "x"), "no host has label"),
                        (("h1", "--"), "no command"), (("h1", "--bogus", "--", "x"), "unknown option"),
                        (("h1", "--timeout", "0", "--", "x"), "--timeout")]:
        res = run(*args)
        assert res.returncode == 2 and words in res.stderr and res.stdout == "", (args, res.stderr)
