"""A shared server runs each person's jobs as that person's own Unix account (issue 46, items 1
and 2, the server's part; docs/security.md).

On the bed: a real server on h1 (`rigdeck server setup`/`start` by root, the operator), and two
people of the bed, real accounts of this machine (``rdk-alice``, ``rdk-bob``), each added to the
server (``alice``, ``bob``) with their own key, each with an inventory of their own: their own
account and key on the GPU hosts, the server reached with their key. Each runs ``rigdeck server
join h2``; the server checks each account through the key line it installed and records it. Then
each one's job on h2 runs as them (``ps -o user``), a job of bob's cannot read alice's job
directory nor signal her rank, bob's stop of alice's job is refused, a host bob did not join is
refused naming him and it, and ``remove-user bob`` closes the server's links to his account at
once and refuses his next call.

The fast checks (no bed) of what the server takes from a join and of the routing by owner come
first."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.kit import TICKER, wait_until
from tests.kit.bedcli import Cli, owners, person_ticker, running_ranks, tagged
from tests.testbed import PERSON_PYTHON, TestBed, TestBedError
from tui.control.accounts import Accounts, JoinError
from tui.model.inventory import HostSpec, Inventory

ALICE, BOB = "rdk-alice", "rdk-bob"
CLAIMS = "/dev/shm/rigdeck-gpu-claims"  # agent/claims.py DEFAULT_DIR
SPY = """import os, sys
def write():
    with open(os.path.join(sys.argv[1], "spy-was-here"), "w") as f:
        f.write("bob")
for what, act in (("read", lambda: os.listdir(sys.argv[1])), ("write", write),
                  ("signal", lambda: os.kill(int(sys.argv[2]), 15))):
    try:
        act()
        print(what, "allowed", flush=True)
    except PermissionError as e:
        print(what, "denied:", e, flush=True)
"""
# A job that would give its owner the server: a key line in the server account's authorized_keys,
# an admin in its users.json.
EDIT = """import sys
for path in sys.argv[1:]:
    with open(path, "a") as f:
        f.write("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBob bob-owns-the-server\\n")
    print("edited", path, flush=True)
"""
SERVER_KEY = "/root/.rigdeck/server/id_ed25519"  # the bed's server runs as root (the operator)
SERVER_FILES = ["/root/.rigdeck/server/users.json", "/root/.ssh/authorized_keys"]


# ---------------------------------------------------------------------------------------------
# No bed: what a join may claim, and which controller a job's owner gets.


def _inventory() -> Inventory:
    hosts = tuple(HostSpec(name=n, address=f"10.0.0.{i}", user="srv", attach_only=True)
                  for i, n in enumerate(("h1", "h2"), start=1))
    return Inventory(hosts=hosts, path=None, known_hosts=Path("/nonexistent"))


def _users(d: Path, users: dict[str, Any]) -> None:
    (d / "users.json").write_text(json.dumps({"users": users}))


def test_a_join_claiming_what_is_not_the_persons_is_refused_before_any_host_is_reached(tmp_path: Path) -> None:
    _users(tmp_path, {"alice": {"accounts": {"h2": {"account": "al", "python": "/p", "state_dir": "/s"}}},
                      "bob": {}})
    acc = Accounts(_inventory(), tmp_path, controller=lambda inv: pytest.fail("no host may be reached"))
    cases = {
        "an unknown host": ({"h9": "bob"}, "host 'h9': expected a host of the server's inventory (h1, h2)"),
        "a name a shell would read": ({"h2": "bob;id"}, "h2: account 'bob;id': expected a Unix account name"),
        "the server's own account": ({"h2": "srv"}, "h2: srv is the server's own account there"),
        "another person's account": ({"h2": "al"}, "h2: al is recorded for alice"),
        "nothing": ({}, "expected {host: account} with at least one host"),
        "not a table": (["h2"], "expected {host: account}"),
    }
    for what, (claim, said) in cases.items():
        with pytest.raises(JoinError) as e:
            acc.join("bob", claim)
        print(f"{what}: {e.value}")
        assert said in str(e.value), (what, str(e.value))
    with pytest.raises(JoinError, match="carol is not a user of this server"):
        acc.join("carol", {"h2": "carol"})
    with pytest.raises(JoinError, match=r"leave: bob has no account recorded on h2 \(recorded: none\)"):
        acc.leave("bob", ["h2"])


def test_a_persons_controller_reaches_their_hosts_as_their_account_and_goes_when_they_do(tmp_path: Path) -> None:
    made: list[Any] = []

    class Ctl(SimpleNamespace):
        closed = False

        def close(self) -> None:
            self.closed = True

    def make(inv: Inventory) -> Any:
        made.append(Ctl(inventory=inv))
        return made[-1]

    _users(tmp_path, {"alice": {"accounts": {"h2": {"account": "al", "python": "/usr/bin/python3",
                                                    "state_dir": "/home/al/.rigdeck"}}}, "bob": {}})
    acc = Accounts(_inventory(), tmp_path, controller=make)
    assert acc.controller("bob") is None and acc.controller("nobody") is None  # as without a join
    ctl = acc.controller("alice")
    assert ctl is not None and acc.controller("alice") is ctl  # one link per (host, account)
    (spec,) = ctl.inventory.hosts
    assert (spec.name, spec.user, spec.python, spec.state_dir, spec.attach_only) == (
        "h2", "al", "/usr/bin/python3", "/home/al/.rigdeck", True)

    from tui.control.history import History
    from tui.control.jobs import JobManager

    jm = JobManager(SimpleNamespace(inventory=_inventory()), History(tmp_path / "history.sqlite"))  # type: ignore[arg-type]
    assert jm.for_owner("alice") is jm  # nobody's accounts consulted: as before
    jm.accounts = acc.controller
    view = jm.for_owner("alice")
    assert view is not jm and view.ctl is ctl and view.history is jm.history and view.scheduler is jm.scheduler
    assert jm.for_owner("bob") is jm and jm.ctl_for(None) is jm.ctl and view.for_owner("alice") is view

    _users(tmp_path, {"bob": {}})  # remove-user alice
    assert acc.prune() == ["alice"] and ctl.closed and acc.controller("alice") is None
    assert jm.for_owner("alice") is jm


def test_a_job_that_fits_only_where_its_owner_has_no_account_is_refused_not_queued(tmp_path: Path) -> None:
    """The queue's check that a job could ever fit reads only its owner's hosts: bob (an account
    on h2 only, 1 GPU there) asking for 4 GPUs is refused at once, though h3 has 4; the server's
    own view (nobody's accounts) still sees both and would queue it."""
    from tui.control.history import History
    from tui.control.queue import JobQueue
    from tui.model.jobspec import JobSpec
    from tui.model.scheduler import HostCapacity, PlacementError

    gpus = {"h2": (0,), "h3": (0, 1, 2, 3)}

    class View(SimpleNamespace):
        def capacity(self, hosts: list[str]) -> list[HostCapacity]:
            self.asked.append(list(hosts))
            return [HostCapacity(h, f"10.0.0.{i}", True, 8, gpus[h], (), True, "Simulated GPU")
                    for i, h in enumerate(hosts, start=2)]

    def names(*hosts: str) -> Any:
        return SimpleNamespace(inventory=SimpleNamespace(names=list(hosts)))

    bobs = View(ctl=names("h2"), asked=[])
    server = View(ctl=names("h2", "h3"), asked=[], history=History(tmp_path / "h.sqlite"),
                  for_owner=lambda user: bobs if user == "bob" else server)
    q = JobQueue(server)  # type: ignore[arg-type]
    spec = JobSpec(name="big", command=("true",), workdir="/", nodes=1, gpus_per_node=4)
    with pytest.raises(PlacementError, match="it would not fit even on idle hosts") as e:
        q._check_feasible(spec, "bob")
    print(f"bob's 4-GPU job: {e.value}")
    assert bobs.asked == [["h2"]] and server.asked == []
    q._check_feasible(spec, "alice")  # not joined: the server's hosts, h3 included
    assert server.asked == [["h2", "h3"]]


def test_a_cached_pipeline_step_is_looked_for_through_its_owners_links() -> None:
    """A pipeline step's cache hit is used only when its artifacts are still there, asked through
    the links to the account the cached job ran as (a joined person's own agent, whose store
    holds them), and only by a pipeline whose steps run as that same account."""
    from tui.control.pipelines import PipelineRunner

    asked: list[tuple[str, str]] = []

    def links(who: str) -> Any:
        def agent(host: str) -> Any:
            def code_have(**_: Any) -> dict[str, Any]:
                asked.append((who, host))
                return {"missing": []}
            return SimpleNamespace(code_have=code_have)
        return SimpleNamespace(agent=agent)

    ctls = {"alice": links("alice"), "bob": links("bob")}
    server = links("server")
    owners = {"job-a": "alice", "p-alice": "alice", "p-bob": "bob", "p-carol": "carol"}
    hit = {"job_id": "job-a", "pipeline_id": "p-old", "metrics": {}, "hosts": ["h2"],
           "artifacts": {"model": {"tree": "t" * 64, "sources": {"h2": ["s" * 64]}, "files": []}}}
    updated: list[str] = []
    fake = SimpleNamespace(
        store=SimpleNamespace(cache_get=lambda key: hit, get=lambda pid: {"user": owners[pid]},
                              update_step=lambda pid, step, **kw: updated.append(pid),
                              cache_drop=lambda key: None),
        jm=SimpleNamespace(ctl_for=lambda user: ctls.get(user, server),
                           history=SimpleNamespace(get=lambda job_id: {"user": owners[job_id]})))
    fake._artifacts_present = lambda arts, ctl: PipelineRunner._artifacts_present(fake, arts, ctl)  # type: ignore[arg-type]
    step = SimpleNamespace(name="train")
    assert PipelineRunner._from_cache(fake, "p-alice", step, "k") is True  # type: ignore[arg-type]
    assert asked == [("alice", "h2")] and updated == ["p-alice"]  # through her links, not the server's
    for other in ("p-bob", "p-carol"):  # bob's own account; carol's: the server's
        assert PipelineRunner._from_cache(fake, other, step, "k") is False  # type: ignore[arg-type]
    assert asked == [("alice", "h2")] and updated == ["p-alice"]


def test_users_json_keeps_a_persons_accounts_through_a_new_key_and_drops_them_with_the_person(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agent import serverhelper

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir(mode=0o700)
    state = str(tmp_path / "server")

    def add(key: str) -> None:
        payload = {"name": "bob", "admin": False, "key": f"ssh-ed25519 {key}", "fingerprint": "SHA256:b",
                   "line": f'restrict,command="/s/venv/bin/rigdeck attach --user bob" ssh-ed25519 {key} '
                           'rigdeck-user:bob@h1', "comment": "rigdeck-user:bob@h1"}
        assert serverhelper.add_user(state, json.dumps(payload))["ok"]

    add("AAAAbob")
    mine = {"account": "rdk-bob", "python": "/usr/bin/python3", "state_dir": "/home/rdk-bob/.rigdeck"}
    assert serverhelper.record_accounts(state, "bob", {"h2": mine}) == {"h2": mine}
    assert serverhelper.record_accounts(state, "bob", {"h3": mine}) == {"h2": mine, "h3": mine}
    add("AAAAbob2")  # a new key: the same person, the same accounts
    assert serverhelper.read_users(state)["bob"]["accounts"] == {"h2": mine, "h3": mine}
    assert oct(os.stat(Path(state) / "users.json").st_mode & 0o777) == "0o600"
    assert serverhelper.forget_accounts(state, "bob", ["h3"]) == {"h2": mine}  # leave h3
    assert serverhelper.forget_accounts(state, "bob", ["h2"]) == {}
    assert "accounts" not in serverhelper.read_users(state)["bob"]
    serverhelper.remove_user(state, "bob")
    assert serverhelper.read_users(state) == {}
    with pytest.raises(KeyError):
        serverhelper.record_accounts(state, "bob", {"h2": mine})


# ---------------------------------------------------------------------------------------------
# On the bed: a real server, real sshd, real accounts.


class People:
    def __init__(self, bed: TestBed, operator: Cli, alice: Cli, bob: Cli) -> None:
        self.bed, self.operator, self.alice, self.bob = bed, operator, alice, bob


def _with_server(cli: Cli, h1_as_root: bool) -> None:
    """``cli``'s inventory with the [server] on h1 (reached as root: the operator's own login, or
    a person's key whose forced command names them)."""
    text = cli.inventory.read_text()
    if h1_as_root:
        text = text.replace('name = "h1"\n', 'name = "h1"\nuser = "root"\n', 1)
    cli.inventory.write_text(text + '\n[server]\nhost = "h1"\n')
    cli.env.pop("RIGDECK_SERVER", None)
    config = cli.tmp / "config.toml"
    config.write_text("")
    cli.env["RIGDECK_CONFIG"] = str(config)


@pytest.fixture(scope="module")
def people(tmp_path_factory: pytest.TempPathFactory) -> Iterator[People]:
    """A 3-host bed (4 simulated GPUs each) with two people; the server on h1, set up and started
    by root; alice and bob added with their own keys. The GPU claim directory on h2 is root's and
    sticky, as a host's admin makes it: every account's agent shares it."""
    bed = TestBed(3, sim_gpus=4, people=(ALICE, BOB))
    try:
        bed.up()
    except TestBedError as e:
        pytest.fail(f"test bed did not come up: {e}", pytrace=False)
    tmp = tmp_path_factory.mktemp("people")
    operator = Cli(bed, tmp / "operator", min_free_mb=1, timeout=900)
    try:
        for name, text in (("ticker.py", TICKER.read_text()), ("spy.py", SPY), ("edit.py", EDIT)):
            (bed.share_dir / name).write_text(text)
            os.chmod(bed.share_dir / name, 0o644)
        bed.exec(2, ["install", "-d", "-m", "1777", "-o", "root", "-g", "root", CLAIMS])
        _with_server(operator, h1_as_root=False)
        operator.run("deploy")
        operator.run("server", "setup")
        operator.run("server", "start")
        clis = []
        for name, account in (("alice", ALICE), ("bob", BOB)):
            cli = Cli(bed, tmp / name, user=account, identity_file=str(bed.person_key(account)),
                      python=PERSON_PYTHON, min_free_mb=1)
            _with_server(cli, h1_as_root=True)
            operator.run("server", "add-user", name, "--key", f"{bed.person_key(account)}.pub")
            clis.append(cli)
        yield People(bed, operator, *clis)
    finally:
        operator.run("server", "stop", check=False, timeout=60)
        bed.down()


def links_of(bed: TestBed, account: str) -> list[str]:
    """The SSH sessions on h2 logged in as ``account`` (the server's links to their agent)."""
    procs = bed.exec(2, ["ps", "-u", account, "-o", "args="]).stdout.splitlines()
    return [p for p in procs if p.startswith("sshd")]


def server_key_attempts(bed: TestBed, host: int, account: str, python: str) -> dict[str, Any]:
    """The server's own key speaking to ``account``'s agent on bed host ``host`` directly (``ssh``
    on the server's host with the key from the server's directory, as a thief of it would): the
    daemon's hello, then what each request outside the server's allow-list got, and one it may
    ask (``python``: the interpreter the server's inventory names there)."""
    import subprocess

    from agent import protocol
    from agent.roles import program_source

    proc = bed.popen(1, [
        "ssh", "-i", SERVER_KEY, "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o",
         "UserKnownHostsFile=/root/.rigdeck/server/known_hosts", "-o", "IdentitiesOnly=yes",
         f"{account}@{bed.host(host).address}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None
    got: dict[str, Any] = {"hello": json.loads(proc.stdout.readline())}
    asks = {
        "upgrade to an agent of its own": ("upgrade", {"path": "/tmp/evil.pyz"}),
        "shutdown": ("shutdown", {"force": True}),
        "exec cat users.json": ("exec", {"argv": ["cat", SERVER_FILES[0]], "timeout_s": 10}),
        "exec the listing with sh": ("exec", {"argv": ["sh", "-c", program_source("listfiles.py"), "/"],
                                              "timeout_s": 10}),
        "exec the listing (a program it may run)": ("exec", {"argv": [python, "-c", program_source("listfiles.py"),
                                                                     str(bed.share_dir)], "timeout_s": 30}),
    }
    proc.stdin.write(protocol.encode(protocol.hello()))
    try:
        for rid, (what, (method, params)) in enumerate(asks.items(), start=1):
            proc.stdin.write(protocol.encode(protocol.request(rid, method, **params)))
            proc.stdin.flush()
            while (msg := json.loads(proc.stdout.readline())).get("id") != rid:
                pass
            got[what] = msg
    finally:
        proc.stdin.close()
        proc.wait(30)
    return got


@pytest.mark.testbed
def test_each_persons_jobs_run_through_the_server_as_their_own_account(people: People) -> None:
    bed, op, alice, bob = people.bed, people.operator, people.alice, people.bob
    # Before anyone joins, bob's jobs would run as the server's own account: one on the server's
    # host could make him its admin. No job goes there (no allow_jobs here).
    before = [bed.exec(1, ["cat", f]).stdout for f in SERVER_FILES]
    argv = ", ".join(f'"{f}"' for f in ("{python}", bed.share_dir / "edit.py", *SERVER_FILES))
    edit = bob.spec("edit-server", f'command = [{argv}]\nworkdir = "{bed.share_dir}"\nlauncher = "direct"\n'
                                   'nodes = 1\nhosts = ["h1"]\n')
    onto = bob.run("launch", str(edit), "--no-queue", check=False)
    print(f"bob: a job on the server host that edits users.json and authorized_keys: exit {onto.returncode}: "
          f"{onto.stderr.strip()[-300:]}")
    assert onto.returncode != 0 and "the [server] host takes no jobs" in onto.stderr, onto.stderr
    assert [bed.exec(1, ["cat", f]).stdout for f in SERVER_FILES] == before
    assert "bob-owns-the-server" not in "".join(before)
    # A spec whose env_from_file the server would not carry: refused in one line, nothing started.
    (bob.tmp / "bob.env").write_text("BOB_TOKEN=bob-secret-1\n")
    with_file = bob.spec("with-env-file", person_ticker(bed, 1, host="h2") + 'env_from_file = "bob.env"\n')
    carried = bob.run("launch", str(with_file), check=False)
    print(f"bob: a spec with env_from_file through the server: exit {carried.returncode}: {carried.stderr.strip()}")
    assert carried.returncode == 2 and f"{with_file}: field 'env_from_file': expected nothing through a server" \
        in carried.stderr, carried.stderr
    assert "Traceback" not in carried.stderr and "bob-secret-1" not in carried.stderr
    assert not [v for v in bob.json("jobs") if v.get("user") == "bob"]  # nothing recorded, nothing started

    # The server's key reaches an agent only for what the server asks (agent/roles.py).
    from tui.remote.inventoryfile import load_inventory

    said = server_key_attempts(bed, 2, "root", load_inventory(op.inventory).get("h2").python)
    for what, got in said.items():
        print(f"the server's key on h2: {what}: {json.dumps(got)[:260]}")
    assert said["hello"]["roles"] == ["server"]
    for what in ("upgrade to an agent of its own", "shutdown", "exec cat users.json", "exec the listing with sh"):
        err = said[what]["error"]
        assert err["code"] == "refused" and "the server's key may" in err["message"], (what, err)
    listed = said["exec the listing (a program it may run)"]["result"]
    assert listed["exit_code"] == 0 and "spy.py" in json.loads(listed["stdout"])["files"], listed

    for cli, name, account in ((alice, "alice", ALICE), (bob, "bob", BOB)):
        joined = cli.run("server", "join", "h2")
        print(f"$ rigdeck server join h2  ({name})\n{joined.stderr}{joined.stdout}")
        assert f"joined h1 as {name}: your jobs run as {account} on h2" in joined.stdout, joined.stdout
    users = json.loads(bed.exec(1, ["cat", "/root/.rigdeck/server/users.json"]).stdout)["users"]
    assert {n: users[n]["accounts"]["h2"]["account"] for n in ("alice", "bob")} == {"alice": ALICE, "bob": BOB}
    line = bed.exec(2, ["cat", f"{bed.person(BOB).home}/.ssh/authorized_keys"]).stdout
    print(f"bob's authorized_keys on h2: {line}")
    assert line.startswith('restrict,command="') and "agent.pyz attach --state-dir" in line
    assert "--role server" in line  # the server reaches bob's agent with the server's allow-list only
    assert line.rstrip().endswith("rigdeck-server:h1:bob")

    a = alice.json("launch", str(alice.spec("alice-job", person_ticker(bed, 2, host="h2"))))["job_id"]
    b: str | None = None
    try:
        b = bob.json("launch", str(bob.spec("bob-job", person_ticker(bed, 1, host="h2"))))["job_id"]
        pa, pb = running_ranks(alice, a, 2), running_ranks(bob, b, 1)
        print(f"$ ps -o user= -p {','.join(map(str, pa + pb))}  (on h2)\n"
              f"alice's ranks {pa} -> {owners(bed, 2, pa)}, bob's ranks {pb} -> {owners(bed, 2, pb)}")
        assert owners(bed, 2, pa) == [ALICE, ALICE] and owners(bed, 2, pb) == [BOB]
        again = alice.run("server", "join", "h2", check=False)  # a job keeps the account it started as
        print(f"alice joins h2 again while her job runs: exit {again.returncode}: {again.stderr.strip()[-300:]}")
        assert again.returncode == 1 and f"alice's jobs {a} run on h2" in again.stderr, again.stderr
        assert "Traceback" not in again.stderr
        for job, who in ((a, ALICE), (b, BOB)):  # every process of the job, not only its ranks
            procs = [int(p.split("/")[2]) for p in tagged(bed, job)["h2"]]
            assert procs and set(owners(bed, 2, procs)) == {who}, (job, procs, owners(bed, 2, procs))

        # bob's job can neither read alice's job directory nor signal her rank.
        spy = bob.spec("spy", f'command = ["{{python}}", "{bed.share_dir / "spy.py"}", '
                              f'"{bed.person(ALICE).home}/.rigdeck/jobs/{a}", "{pa[0]}"]\n'
                              f'workdir = "{bed.share_dir}"\nlauncher = "direct"\nnodes = 1\nhosts = ["h2"]\n')
        view = bob.json("launch", str(spy), "--wait", timeout=120)
        logs = bob.run("logs", view["job_id"]).stdout
        print(f"bob: a job that reads alice's job directory: {view['state']}\n{logs}")
        assert view["state"] == "succeeded", view
        assert "read denied: [Errno 13] Permission denied" in logs and "signal denied: [Errno 1]" in logs, logs
        assert "write denied: [Errno 13] Permission denied" in logs and "allowed" not in logs, logs
        hers = f"{bed.person(ALICE).home}/.rigdeck/jobs/{a}"
        assert bed.exec(2, ["test", "-e", f"{hers}/spy-was-here"], check=False).returncode == 1

        # bob's stop of alice's job is refused; her job runs on as her.
        refused = bob.run("stop", a, "--grace", "1", check=False)
        print(f"$ rigdeck stop {a}  (bob): exit {refused.returncode}: {refused.stderr.strip()}")
        assert refused.returncode == 3 and f"job '{a}' belongs to alice" in refused.stderr, refused.stderr
        assert alice.json("status", a)["state"] == "running" and owners(bed, 2, pa) == [ALICE, ALICE]

        # A host bob has no account recorded on: refused, naming him and the host.
        elsewhere = bob.run("launch", str(bob.spec("bob-h3", person_ticker(bed, 1, host="h3"))), "--no-queue",
                            check=False)
        print(f"bob on h3: exit {elsewhere.returncode}: {elsewhere.stderr.strip()}")
        assert elsewhere.returncode != 0 and "bob has no account recorded on h3" in elsewhere.stderr

        # remove-user while bob's job runs: refused, naming it; with --stop the server stops it
        # through bob's own link first, then removes him.
        assert links_of(bed, BOB), "the server holds a link to bob's agent"
        kept = op.run("server", "remove-user", "bob", check=False)
        print(f"$ rigdeck server remove-user bob  (his job runs): exit {kept.returncode}: {kept.stderr.strip()}")
        assert kept.returncode == 1 and f"their jobs {b} (running) have not ended" in kept.stderr, kept.stderr
        assert "bob" in json.loads(bed.exec(1, ["cat", SERVER_FILES[0]]).stdout)["users"]
        assert owners(bed, 2, pb) == [BOB]
        removed = op.run("server", "remove-user", "bob", "--stop")
        print(f"$ rigdeck server remove-user bob --stop\n{removed.stderr}{removed.stdout}")
        assert f"stopped bob's jobs {b}" in removed.stdout, removed.stdout
        assert op.json("status", b)["state"] == "stopped" and owners(bed, 2, pb) == []
        b = None
        assert alice.json("stop", a, "--grace", "1")["state"] == "stopped"
    finally:
        if b is not None:
            bob.run("stop", b, "--grace", "1", check=False)
        alice.run("stop", a, "--grace", "1", check=False)

    # remove-user: the server's links to bob's account close at once, and his next call is refused
    # in one line saying why and what to do.
    wait_until(lambda: not links_of(bed, BOB), 30, "the server's links to rdk-bob on h2 to close")
    gone = bob.run("jobs", check=False, timeout=120)
    print(f"bob after remove-user: exit {gone.returncode}: {gone.stderr.strip()}")
    assert gone.returncode == 1 and "Traceback" not in gone.stderr
    assert len(gone.stderr.strip().splitlines()) == 1, gone.stderr
    assert f"rigdeck jobs: h1: the server host refused {bed.person_key(BOB)} for root@{bed.host(1).address}" \
        in gone.stderr and "ask its operator" in gone.stderr, gone.stderr
    assert links_of(bed, ALICE), "alice's link stays"

    # alice leaves h2: the server forgets her account and closes its link, and its key line is out
    # of her authorized_keys there.
    left = alice.run("server", "leave")
    print(f"$ rigdeck server leave  (alice)\n{left.stdout}")
    assert "left h2 on h1" in left.stdout, left.stdout
    wait_until(lambda: not links_of(bed, ALICE), 30, "the server's links to rdk-alice on h2 to close")
    keys = bed.exec(2, ["cat", f"{bed.person(ALICE).home}/.ssh/authorized_keys"]).stdout
    assert "rigdeck-server:h1:alice" not in keys, keys
    users = json.loads(bed.exec(1, ["cat", "/root/.rigdeck/server/users.json"]).stdout)["users"]
    assert "accounts" not in users["alice"], users["alice"]
    op.run("server", "remove-user", "alice")
