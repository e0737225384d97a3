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


def test_env_from_file_values_go_with_the_launch_and_are_kept_only_in_the_job_directory(tmp_path: Path) -> None:
    """``env_from_file`` through a server (issue 46): the server takes a spec with the file's path
    and names (never reads it) and the values apart, checked against those names (an error names
    the field and a name, never a value); the start's plan carries them to the hosts, where the
    agent keeps them in the job's directory (0600) and leaves plan.json the names alone; a
    restart's plan brings none and uses those; a host that never had them refuses, naming them."""
    import stat

    from agent.jobfiles import EnvFileMissing, keep_env_file, read_env_file
    from tui.control.history import History
    from tui.control.jobs import JobManager
    from tui.model.jobspec import JobSpec, JobSpecError, env_values_from_wire, jobspec_from_wire

    secret = "tok-0123456789abcdef"
    base = JobSpec(name="j", command=("true",), workdir="/", nodes=1, env=(("A", "1"),))
    sent = {**base.to_dict(), "env_from_file": "/home/bob/bob.env", "env_file_names": ["BOB_TOKEN", "HF"]}
    spec = jobspec_from_wire(sent)
    assert (spec.env_from_file, spec.env_file_names) == ("/home/bob/bob.env", ("BOB_TOKEN", "HF"))
    assert env_values_from_wire(spec, {"BOB_TOKEN": secret, "HF": "h"}) == {"BOB_TOKEN": secret, "HF": "h"}
    assert env_values_from_wire(base, None) is None
    bad = {
        "no values": (spec, None, "field 'env_from_file': expected the values of the spec's env_from_file"),
        "a name missing": (spec, {"BOB_TOKEN": secret}, "field 'env_values': expected the values"),
        "a name more": (spec, {"BOB_TOKEN": secret, "HF": "h", "X": secret}, 'got "X"'),
        "a number": (spec, {"BOB_TOKEN": 12345678, "HF": "h"}, "env_values.BOB_TOKEN"),
        "a NUL": (spec, {"BOB_TOKEN": secret + "\0", "HF": "h"}, "values without NUL characters"),
        "values without a file": (base, {"BOB_TOKEN": secret}, "expected nothing: the spec has no env_from_file"),
    }
    for what, (sp, given, said) in bad.items():
        with pytest.raises(JobSpecError) as e:
            env_values_from_wire(sp, given)
        print(f"{what}: {e.value}")
        assert said in str(e.value) and secret not in str(e.value) and "12345678" not in str(e.value), what
    for what, names in (("a RIGDECK_ name", ["RIGDECK_RANK"]), ("also in [env]", ["A"]), ("none", [])):
        with pytest.raises(JobSpecError, match="env_file_names"):
            jobspec_from_wire({**sent, "env_file_names": names})
        print(f"names: {what}: refused")

    # The server's start: the values it holds for the job, then (held no more) the names alone.
    jm = JobManager(SimpleNamespace(inventory=_inventory()), History(tmp_path / "history.sqlite"))  # type: ignore[arg-type]
    jm.reads_env_files = False
    jm.env_values["j-1"] = {"BOB_TOKEN": secret, "HF": "h"}
    first = jm.env_file("j-1", spec)
    assert first == {"names": ["BOB_TOKEN", "HF"], "values": {"BOB_TOKEN": secret, "HF": "h"}}
    del jm.env_values["j-1"]
    assert jm.env_file("j-1", spec) == {"names": ["BOB_TOKEN", "HF"]}  # never the workstation's path read
    rec = {"job_id": "j-1", "spec": spec.to_dict(), "events": [{"event": "started", "hosts": ["h2"]}]}
    assert jm.env_file_hosts(rec) == ["h2"]  # a restart goes only where they are kept

    # The agent's side: kept 0600 in the job's directory, plan.json's part the names alone.
    d = tmp_path / "jobs" / "j-1"
    d.mkdir(parents=True)
    plan = {"job_id": "j-1", "env_file": first}
    keep_env_file(str(d), plan)
    assert plan["env_file"] == {"names": ["BOB_TOKEN", "HF"]} and secret not in json.dumps(plan)
    kept = d / "env_file.json"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600 and read_env_file(str(d)) == first["values"]
    restart = {"job_id": "j-1", "env_file": {"names": ["BOB_TOKEN", "HF"]}}
    keep_env_file(str(d), restart)  # no values: those kept here
    assert read_env_file(str(d)) == first["values"]
    elsewhere = tmp_path / "jobs" / "j-2"
    elsewhere.mkdir()
    with pytest.raises(EnvFileMissing, match=r"the values of its env_from_file \(BOB_TOKEN, HF\) are not on this host"):
        keep_env_file(str(elsewhere), {"job_id": "j-1", "env_file": {"names": ["BOB_TOKEN", "HF"]}})


def test_a_join_goes_through_only_the_key_line_installed_for_that_person(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The race for one account (issue 46): alice installed the server's key line for her account
    but her join has not reached the server; bob claims that account first. The line carries the
    tag the server issued to alice (its attach says it in the hello), so bob's join is refused,
    naming the host, the account and him; alice's goes through. A line without a tag (an older
    rigdeck's) is refused too. The tag is kept with the person through a new key and goes with
    them."""
    import socket

    from agent import attach, protocol, serverhelper

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir(mode=0o700)
    state = tmp_path / "server"
    for name in ("alice", "bob"):
        payload = {"name": name, "admin": False, "key": f"ssh-ed25519 AAAA{name}", "fingerprint": "SHA256:x",
                   "line": f'restrict,command="x --user {name}" ssh-ed25519 AAAA{name} rigdeck-user:{name}@h1',
                   "comment": f"rigdeck-user:{name}@h1"}
        assert serverhelper.add_user(str(state), json.dumps(payload))["ok"]
    tags = {n: serverhelper.join_tag(str(state), n) for n in ("alice", "bob")}
    assert tags["alice"] != tags["bob"] and serverhelper.join_tag(str(state), "alice") == tags["alice"]

    # The attach of a line with a tag puts it in the daemon's hello, as the server reads it.
    ours, daemon = socket.socketpair()
    daemon.sendall(protocol.encode(protocol.hello(role="agent", roles=["server"])))
    said = json.loads(attach.take_role(ours, "server", tags["alice"]).split(b"\n", 1)[0])
    assert said["join_tag"] == tags["alice"] and said["roles"] == ["server"]
    ours.close()
    daemon.close()

    line_tag: dict[str, str | None] = {"rdk-alice": tags["alice"], "rdk-old": None}

    class Ctl(SimpleNamespace):
        def agent(self, host: str) -> Any:
            account = self.inventory.get(host).user
            raw = {"user": account, "python_executable": "/usr/bin/python3", "state_dir": f"/home/{account}/.rigdeck"}
            return SimpleNamespace(facts=lambda timeout=None: SimpleNamespace(raw=raw))

        def hello(self, host: str) -> dict[str, Any]:
            tag = line_tag[self.inventory.get(host).user]
            return {"agent_version": "x", **({"join_tag": tag} if tag else {})}

        def close(self) -> None:
            pass

    acc = Accounts(_inventory(), state, controller=lambda inv: Ctl(inventory=inv))
    with pytest.raises(JoinError) as e:
        acc.join("bob", {"h2": "rdk-alice"})
    print(f"bob claims alice's line first: {e.value}")
    assert "h2: the server's key line in rdk-alice's ~/.ssh/authorized_keys there was not installed for bob" \
        in str(e.value) and "its tag is not theirs" in str(e.value)
    assert "accounts" not in serverhelper.read_users(str(state))["bob"]
    with pytest.raises(JoinError, match="it carries no tag: an older rigdeck installed it"):
        acc.join("bob", {"h2": "rdk-old"})
    assert acc.join("alice", {"h2": "rdk-alice"})["h2"]["account"] == "rdk-alice"
    payload = {"name": "alice", "admin": False, "key": "ssh-ed25519 AAAAnew", "fingerprint": "SHA256:y",
               "line": 'restrict,command="x" ssh-ed25519 AAAAnew rigdeck-user:alice@h1',
               "comment": "rigdeck-user:alice@h1"}
    assert serverhelper.add_user(str(state), json.dumps(payload))["ok"]  # a new key: the same tag
    assert serverhelper.read_users(str(state))["alice"]["join_tag"] == tags["alice"]
    serverhelper.remove_user(str(state), "alice")
    with pytest.raises(KeyError):
        serverhelper.join_tag(str(state), "alice")


def test_a_member_who_has_not_joined_runs_no_job_as_the_servers_own_account(tmp_path: Path) -> None:
    """``[server] members_need_join`` (issue 46): by default a member who has not joined is
    refused where their job would run as the account the server itself runs as, naming them and
    what to run; an admin's job and a joined member's run; ``false`` lets members' jobs run as
    it, ``true`` refuses them whatever the account. The queue asks the same rule (nothing is
    recorded for a refused job)."""
    from tui.control.history import History
    from tui.control.jobs import JobError, JobManager
    from tui.control.queue import JobQueue
    from tui.control.server import Server, own_account_on_hosts
    from tui.model.identity import local_user
    from tui.model.inventory import ServerSpec
    from tui.model.jobspec import JobSpec

    me = local_user()
    hosts = (HostSpec(name="h1", address="10.0.0.1"), HostSpec(name="h2", address="10.0.0.2", user="ops"))
    inv = Inventory(hosts=hosts, path=None, known_hosts=Path("/nonexistent"), server=ServerSpec("h1"))
    assert own_account_on_hosts(inv) is None  # the server's own host takes no jobs; h2 is another account
    inv = Inventory(hosts=hosts, path=None, known_hosts=Path("/nonexistent"), server=ServerSpec("h1", allow_jobs=True))
    assert own_account_on_hosts(inv) == me

    _users(tmp_path, {"bob": {}, "carol": {"admin": True},
                      "alice": {"accounts": {"h2": {"account": "al", "python": "/p", "state_dir": "/s"}}}})
    srv = Server(None, tmp_path / "sock")  # type: ignore[arg-type]
    srv.users_dir = tmp_path
    srv.accounts = Accounts(_inventory(), tmp_path, controller=lambda inv: SimpleNamespace(close=lambda: None))
    srv.own_account_on_hosts = me
    said = srv.join_refusal("bob")
    print(f"bob, not joined: {said}")
    assert said == (f"refused: bob has not joined: a member's job would run as {me}, the account the server itself "
                    "runs as (it holds the server's key and users.json); run `rigdeck server join` (with access "
                    "of your own to the hosts) so that your jobs run as your own account, or ask an admin "
                    "(bob is a member)")
    assert [srv.join_refusal(u) for u in ("carol", "alice", None, srv.account.name)] == [None] * 4
    srv.members_need_join = False
    assert srv.join_refusal("bob") is None
    srv.members_need_join, srv.own_account_on_hosts = True, None
    assert "([server] members_need_join = true)" in (srv.join_refusal("bob") or "")
    srv.members_need_join = None
    assert srv.join_refusal("bob") is None  # a dedicated server account: members' jobs run as the hosts'

    srv.own_account_on_hosts = me
    jm = JobManager(SimpleNamespace(inventory=_inventory()), History(tmp_path / "history.sqlite"))  # type: ignore[arg-type]
    jm.join_rule = srv.join_refusal
    with pytest.raises(JobError, match="refused: bob has not joined"):
        JobQueue(jm).submit(JobSpec(name="j", command=("true",), workdir="/", nodes=1), user="bob")
    assert jm.history.list() == []


def test_remove_user_stop_stops_their_sweeps_and_pipelines_before_their_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    """``remove-user NAME`` is refused while a sweep or pipeline of theirs runs, naming it;
    ``--stop`` stops their sweeps and pipelines first (they would start more jobs), then their
    jobs as they are then, and only then removes them. Others' work is left alone."""
    import tui.client
    from tui.control import serveradmin
    from tui.remote import serverhost

    did: list[str] = []
    jobs = {"b-1": ("bob", "running"), "b-2": ("bob", "running"), "a-1": ("alice", "running")}

    class Client:
        def __init__(self, inventory: Any) -> None:
            pass

        def sweeps(self) -> list[Any]:
            return [SimpleNamespace(sweep_id="s-b", user="bob", state="running"),
                    SimpleNamespace(sweep_id="s-a", user="alice", state="running")]

        def pipelines(self) -> list[Any]:
            return [SimpleNamespace(pipeline_id="p-b", user="bob", state="running"),
                    SimpleNamespace(pipeline_id="p-old", user="bob", state="succeeded")]

        def list_jobs(self) -> list[Any]:
            return [SimpleNamespace(job_id=j, user=u, state=st) for j, (u, st) in jobs.items()]

        def sweep_stop(self, ref: str) -> None:
            did.append(f"sweep {ref}")
            jobs["b-1"] = ("bob", "stopped")  # its trial, stopped with it

        def pipeline_stop(self, ref: str) -> None:
            did.append(f"pipeline {ref}")

        def stop(self, ref: str, yes: bool = False) -> None:
            did.append(f"job {ref}")

        def close(self) -> None:
            pass

    monkeypatch.setattr(tui.client, "RemoteClient", Client)
    monkeypatch.setattr(serverhost, "remove_user", lambda inv, name: did.append(f"removed {name}"))
    with pytest.raises(serveradmin.ServerHostError) as e:
        serveradmin.remove_user(_inventory(), "bob")
    print(e.value)
    assert "refused: their sweeps s-b (running); their pipelines p-b (running); their jobs b-1 (running), " \
           "b-2 (running) have not ended" in str(e.value) and did == []
    stopped = serveradmin.remove_user(_inventory(), "bob", stop=True)
    assert did == ["sweep s-b", "pipeline p-b", "job b-2", "removed bob"], did
    assert stopped == {"sweeps": ["s-b"], "pipelines": ["p-b"], "jobs": ["b-2"]}


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
    # Before anyone joins, bob's jobs would run as the server's own account (root, as the server
    # runs here): one on the server's host could make him its admin. Refused before anything is
    # placed ([server] members_need_join, by default where the hosts' account is the server's),
    # naming him and what to run; the files unchanged.
    before = [bed.exec(1, ["cat", f]).stdout for f in SERVER_FILES]
    argv = ", ".join(f'"{f}"' for f in ("{python}", bed.share_dir / "edit.py", *SERVER_FILES))
    edit = bob.spec("edit-server", f'command = [{argv}]\nworkdir = "{bed.share_dir}"\nlauncher = "direct"\n'
                                   'nodes = 1\nhosts = ["h1"]\n')
    onto = bob.run("launch", str(edit), "--no-queue", check=False)
    print(f"bob (not joined): a job on the server host that edits users.json and authorized_keys: exit "
          f"{onto.returncode}: {onto.stderr.strip()[-400:]}")
    assert onto.returncode == 3 and "refused: bob has not joined: a member's job would run as root, the account " \
        "the server itself runs as" in onto.stderr and "run `rigdeck server join`" in onto.stderr, onto.stderr
    assert [bed.exec(1, ["cat", f]).stdout for f in SERVER_FILES] == before
    assert "bob-owns-the-server" not in "".join(before)
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
    # ...and says the tag issued to bob: the joins above went through only because each line's
    # attach said its owner's own tag in the hello (a line installed for another is refused).
    tag = json.loads(bed.exec(1, ["cat", "/root/.rigdeck/server/users.json"]).stdout)["users"]["bob"]["join_tag"]
    assert f"--join-tag {tag}" in line, line
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

        # bob's env_from_file through the server: the value reaches his rank, and again after a
        # restart (the server no longer holds it: his agent kept it in the job's directory), and
        # is nowhere in the server's history or log, nor in what bob or alice see.
        secret = f"bob-secret-{os.urandom(6).hex()}"
        (bob.tmp / "bob.env").write_text(f"# bob's token\nBOB_TOKEN={secret}\n")
        with_file = bob.spec("bob-env", person_ticker(bed, 1, host="h2") + 'env_from_file = "bob.env"\n'
                                                                             '[restart]\nmax_restarts = 1\n')
        e = bob.json("launch", str(with_file))["job_id"]
        (pe,) = running_ranks(bob, e, 1)
        environ = lambda pid: bed.exec(2, ["cat", f"/proc/{pid}/environ"]).stdout  # noqa: E731
        assert f"BOB_TOKEN={secret}\0" in environ(pe) and owners(bed, 2, [pe]) == [BOB]
        job_dir = f"{bed.person(BOB).home}/.rigdeck/jobs/{e}"
        kept = bed.exec(2, ["stat", "-c", "%a %U", f"{job_dir}/env_file.json"]).stdout.split()
        print(f"bob's env_from_file job {e}: rank {pe} has BOB_TOKEN; {job_dir}/env_file.json: {kept}")
        assert kept == ["600", BOB] and secret not in bed.exec(2, ["cat", f"{job_dir}/plan.json"]).stdout
        bed.exec(2, ["kill", "-9", str(pe)])

        def restarted() -> list[int]:
            st = bob.json("status", e)
            pids = [r["pid"] for r in st["ranks"] if r.get("state") == "running" and r.get("pid") not in (None, pe)]
            return pids if st["restarts"] == 1 else []
        (pe2,) = wait_until(restarted, 90, f"{e} restarted by the server", step=0.5)
        assert f"BOB_TOKEN={secret}\0" in environ(pe2), "the restart's rank has the value"
        shown = {"bob: jobs --json": bob.run("jobs", "--json").stdout,
                 "bob: status --json": bob.run("status", e, "--json").stdout,
                 "alice: jobs --json": alice.run("jobs", "--json").stdout,
                 "alice: status --json": alice.run("status", e, "--json").stdout}
        server_dir = "/root/.rigdeck/server"
        files = bed.exec(1, ["sh", "-c", f"ls -d {server_dir}/history.sqlite* {server_dir}/server.log 2>/dev/null; "
                                        "true"]).stdout.split()
        for f in files:  # lines of the file holding the value, counted on the server's host
            shown[f] = bed.exec(1, ["sh", "-c", f"grep -a -c {secret} {f} || true"]).stdout.strip()
        holding = [k for k, v in shown.items() if secret in v or (v.isdigit() and int(v) > 0)]
        print(f"where bob's value is, of {sorted(shown)}: {holding or 'nowhere'}")
        assert not holding and any(f.endswith("history.sqlite") for f in files), (holding, files)
        names = bed.exec(1, ["sh", "-c", f"cat {server_dir}/history.sqlite* | grep -a -c BOB_TOKEN || true"]).stdout
        assert int(names.strip() or 0) > 0, "the history keeps the name"  # the check above looked in those files
        assert any("history.sqlite" in k for k in shown)
        assert bob.json("stop", e, "--grace", "1")["state"] == "stopped"

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
