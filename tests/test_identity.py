"""Who is who on a shared server, what each may do, and who used the GPUs: the rules
(tui.model.permissions, tui.model.usage, tui.model.identity), the server's dispatch applying them
with a session's person (a real Server and Session over a socket pair), and the server host's
users.json and authorized_keys as `rigdeck server add-user` leaves them (the helper run here,
HOME in a temporary directory). The bed's end-to-end run is in tests/test_server.py."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agent import serverhelper
from tui.control.server import Server, Session
from tui.model.identity import UserError, check_public_key, check_user_name, key_fingerprint
from tui.model.permissions import DRAIN, STOP_JOB, Actor, PermissionDenied, check, refusal
from tui.model.usage import attempts, gpu_seconds, parse_since, report_lines, usage_report

ALICE, BOB, ROOT = Actor("alice"), Actor("bob"), Actor("root", admin=True)


def test_a_member_stops_only_their_own_job_and_the_refusal_names_the_owner_and_the_rule() -> None:
    assert refusal(ALICE, STOP_JOB, ref="x", owner="alice") is None
    assert refusal(ROOT, STOP_JOB, ref="x", owner="alice") is None
    assert refusal(BOB, STOP_JOB, ref="x", owner="alice") == (
        "refused: job 'x' belongs to alice; members may stop only their own jobs (bob is a member)")
    assert "has no recorded owner" in str(refusal(BOB, STOP_JOB, ref="old", owner=None))
    with pytest.raises(PermissionDenied, match="draining hosts is for admins only"):
        check(ALICE, DRAIN)
    check(ROOT, DRAIN)


def test_names_and_keys_are_checked_and_the_fingerprint_is_ssh_keygens(tmp_path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "alice@laptop", "-f",
                    str(tmp_path / "k")], check=True)
    line = (tmp_path / "k.pub").read_text()
    key = check_public_key(line)
    assert key == " ".join(line.split()[:2])
    said = subprocess.run(["ssh-keygen", "-lf", str(tmp_path / "k.pub")], capture_output=True, text=True,
                          check=True).stdout.split()[1]
    assert key_fingerprint(key) == said
    for bad in ("", "AAAA", (tmp_path / "k").read_text(), "ssh-ed25519 AAAAC3NzaC1yc2E="):
        with pytest.raises(UserError, match="--key"):
            check_public_key(bad)
    for bad in ("", "Alice", "a b", "a;rm", "-x", "x" * 40):
        with pytest.raises(UserError, match="user name"):
            check_user_name(bad)
    assert check_user_name("alice.w-2") == "alice.w-2"


def job(job_id: str, user: str | None, events: list[tuple[str, float, int | None]], ended: float | None,
        state: str = "succeeded") -> dict[str, Any]:
    evs = [{"event": e, "time": t, **({"gpus": g} if g is not None else {})} for e, t, g in events]
    return {"job_id": job_id, "user": user, "events": evs, "ended": ended, "state": state, "created": 0.0,
            "placement": [{"host": "h1", "gpus": [0, 1]}]}


def test_a_jobs_gpu_time_is_each_attempts_gpus_times_its_span_and_usage_sums_exactly_those() -> None:
    now = 10_000.0
    recs = [
        # 4 GPUs for 100 s, a restart, then 2 GPUs (elsewhere) for 50 s
        job("a1", "alice", [("started", 1000, 4), ("restart", 1100, None), ("started", 1110, 2)], 1160),
        # from before the started event said its GPUs: the placement's two, 300 s
        job("a2", "alice", [("started", 2000, None)], 2300),
        # still running: until now
        job("b1", "bob", [("queued", 5000, None), ("started", 9000, 1)], None, state="running"),
        # preempted once (asked at 190, its gang stopped and back in the queue at 200), resumed
        job("b2", "bob", [("started", 100, 2), ("preempted", 190, None), ("requeued", 200, None), ("started", 400, 2)],
            500),
        job("q", "bob", [("queued", 50, None)], None, state="queued"),  # never ran: no GPU time
    ]
    assert [(a.start, a.end, a.gpus) for a in attempts(recs[0], now)] == [(1000, 1100, 4), (1110, 1160, 2)]
    assert gpu_seconds(recs[0], now) == 500 and gpu_seconds(recs[1], now) == 600
    assert gpu_seconds(recs[2], now) == 1000 and gpu_seconds(recs[3], now) == 400 and gpu_seconds(recs[4], now) == 0
    report = usage_report(recs, by="user", now=now, goodputs={"a1": 0.5, "a2": 1.0})
    by = {r.key: r for r in report.rows}
    assert by["alice"].gpu_hours * 3600 == pytest.approx(gpu_seconds(recs[0], now) + gpu_seconds(recs[1], now))
    assert by["bob"].gpu_hours * 3600 == pytest.approx(sum(gpu_seconds(r, now) for r in recs[2:]))
    assert report.gpu_hours * 3600 == pytest.approx(sum(gpu_seconds(r, now) for r in recs))
    assert (by["alice"].jobs, by["bob"].jobs, by["bob"].preempted) == (2, 3, 1)
    assert by["alice"].goodput == pytest.approx((0.5 * 500 + 1.0 * 600) / 1100) and by["bob"].goodput is None
    assert sum(sum(w.values()) for w in report.weeks.values()) == pytest.approx(report.gpu_hours)
    by_job = usage_report(recs, by="job", now=now)
    assert {r.key: round(r.gpu_hours * 3600) for r in by_job.rows} == {"a1": 500, "a2": 600, "b1": 1000, "b2": 400,
                                                                     "q": 0}
    groups = usage_report(recs, by="group", now=now, groups={"alice": ["vision"]})
    assert {r.key for r in groups.rows} == {"vision", "(no group)"}
    since = usage_report(recs, by="user", now=now, since=1130)  # a1's second attempt from 1130 on, a2, b1
    assert {r.key: round(r.gpu_hours * 3600) for r in since.rows} == {"alice": 60 + 600, "bob": 1000}
    text = "\n".join(report_lines(report))
    assert "alice" in text and "total" in text and "GPU-HOURS" in text
    with pytest.raises(ValueError, match="--by"):
        usage_report(recs, by="team", now=now)


def test_an_attempt_across_a_week_boundary_counts_in_both_weeks() -> None:
    monday = time.mktime(time.strptime("2026-11-23 00:00", "%Y-%m-%d %H:%M")) - time.timezone
    monday = float(int(monday))
    rec = job("w", "alice", [("started", monday - 3600, 1)], monday + 7200)
    weeks = usage_report([rec], now=monday + 9000).weeks["alice"]
    assert weeks == {"2026-W47": pytest.approx(1.0), "2026-W48": pytest.approx(2.0)}


def test_since_takes_a_date_or_days_back_and_says_what_it_expected() -> None:
    assert parse_since("7d", 1_000_000.0) == 1_000_000.0 - 7 * 86400
    assert parse_since("2026-11-01", 0) == time.mktime(time.strptime("2026-11-01", "%Y-%m-%d"))
    with pytest.raises(ValueError, match=r"--since: expected a date .* got 'last week'"):
        parse_since("last week", 0)


# -- the server's dispatch, with a session's person -----------------------------------------------


class Service:
    """The parts of ControllerService the dispatch reaches: owners, and the calls it makes."""

    _watch = None  # no poller: nothing selected

    def __init__(self) -> None:
        from tui.model.fairshare import QueuePolicy

        self.owners = {"a-job": "alice", "b-job": "bob"}
        self.queue_policy = QueuePolicy(member_max_priority=5)
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def info(self) -> dict[str, Any]:
        return {"kind": "server"}

    def owner(self, kind: str, ref: str) -> tuple[str, str | None]:
        return ref, self.owners[ref]

    def stop(self, ref: str, grace_s: float | None = None, *, yes: bool = False, wait: bool = True,
             user: str | None = None) -> dict[str, Any]:
        self.calls.append(("stop", {"ref": ref, "user": user}))
        return {"stopped": ref}

    def drain(self, targets: list[str], reason: str = "", now: bool = False, who: str = "") -> list[Any]:
        self.calls.append(("drain", {"targets": targets, "who": who}))
        return []

    def retry(self, ref: str, *, queue: bool = True, user: str | None = None) -> dict[str, Any]:
        self.calls.append(("retry", {"ref": ref, "user": user}))
        return {"retried": ref}

    def reprioritise(self, ref: str, priority: int, *, user: str | None = None) -> dict[str, Any]:
        self.calls.append(("reprioritise", {"ref": ref, "priority": priority, "user": user}))
        return {"priority": priority}


class Wire:
    """One session of a real Server over a socket pair: lines in, answers out."""

    def __init__(self, server: Server, first: dict[str, Any] | None):
        ours, theirs = socket.socketpair()
        ours.settimeout(20)  # a missing answer fails the test, never hangs it
        self.sock = ours
        self.session = Session(server, theirs, 1)
        threading.Thread(target=self.session.run, daemon=True).start()
        self.file = ours.makefile("rb")
        assert json.loads(self.file.readline())["event"] == "hello"
        import zlib

        self.unzip = zlib.decompressobj()
        self.buf = b""
        if first is not None:
            self.send(first)

    def send(self, msg: dict[str, Any]) -> None:
        self.sock.sendall((json.dumps(msg) + "\n").encode())

    def next(self) -> dict[str, Any]:
        while b"\n" not in self.buf:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError
            self.buf += self.unzip.decompress(data)
        line, self.buf = self.buf.split(b"\n", 1)
        return dict(json.loads(line))

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.send({"id": 1, "method": method, "params": params})
        return self.next()


@pytest.fixture
def server(tmp_path: Path) -> Server:
    serverhelper._write_users(str(tmp_path), {
        "alice": {"admin": False, "fingerprint": "SHA256:a"}, "bob": {"admin": False, "fingerprint": "SHA256:b"},
        "carol": {"admin": True, "fingerprint": "SHA256:c"}})
    srv = Server(Service(), tmp_path / "sock")  # type: ignore[arg-type]
    srv.users_dir = tmp_path
    return srv


def test_the_server_takes_the_person_from_the_attachs_first_line_and_applies_the_rules(server: Server) -> None:
    svc: Service = server.service  # type: ignore[assignment]
    bob = Wire(server, {"identity": {"user": "bob"}})
    refused = bob.call("stop", ref="a-job")
    assert refused["error"] == {"type": "PermissionDenied", "message":
                                "refused: job 'a-job' belongs to alice; members may stop only their own jobs "
                                "(bob is a member)"}
    assert svc.calls == []
    # What the client sends after the attach's line claims nothing: not a second identity...
    bob.send({"identity": {"user": "carol"}})
    assert "identity is said once" in bob.next()["data"]
    # ...nor a who of its own: the session's person is recorded
    assert "draining hosts is for admins only (bob is a member)" in bob.call("drain", targets=["h1"], who="carol")[
        "error"]["message"]
    assert bob.call("stop", ref="b-job")["result"] == {"stopped": "b-job"}
    assert svc.calls == [("stop", {"ref": "b-job", "user": "bob"})]
    carol = Wire(server, {"identity": {"user": "carol"}})
    assert carol.call("stop", ref="a-job")["result"] == {"stopped": "a-job"}
    assert carol.call("drain", targets=["h1"], who="mallory")["result"] == []
    assert svc.calls[1:] == [("stop", {"ref": "a-job", "user": "carol"}),
                             ("drain", {"targets": ["h1"], "who": "carol"})]
    # The server's own account (an attach without --user, or the socket itself) is an admin.
    account = Wire(server, {"identity": {"user": None}})
    assert "result" in account.call("stop", ref="a-job")
    assert svc.calls[-1] == ("stop", {"ref": "a-job", "user": server.account.name})


def test_retry_and_reprioritise_are_the_owners_or_an_admins(server: Server) -> None:
    svc: Service = server.service  # type: ignore[assignment]
    bob = Wire(server, {"identity": {"user": "bob"}})
    assert bob.call("retry", ref="a-job")["error"]["message"] == (
        "refused: job 'a-job' belongs to alice; members may retry only their own jobs (bob is a member)")
    assert bob.call("reprioritise", ref="a-job", priority=9)["error"]["message"] == (
        "refused: job 'a-job' belongs to alice; members may reprioritise only their own jobs (bob is a member)")
    assert svc.calls == []
    assert "error" in bob.call("retry", ref="b-job", user="carol")  # no who of its own: not a param
    assert bob.call("retry", ref="b-job")["result"] == {"retried": "b-job"}
    assert bob.call("reprioritise", ref="b-job", priority=3)["result"] == {"priority": 3}
    assert bob.call("reprioritise", ref="b-job", priority=6)["error"]["message"] == (
        "refused: priority 6 is above 5, the highest a member may give (bob is a member; an admin may set it "
        "higher)")
    carol = Wire(server, {"identity": {"user": "carol"}})  # an admin
    assert carol.call("reprioritise", ref="a-job", priority=9)["result"] == {"priority": 9}
    assert svc.calls == [("retry", {"ref": "b-job", "user": "bob"}),
                         ("reprioritise", {"ref": "b-job", "priority": 3, "user": "bob"}),
                         ("reprioritise", {"ref": "a-job", "priority": 9, "user": "carol"})]


def test_a_person_not_in_users_json_is_turned_away_and_a_removed_one_can_do_nothing_more(server: Server) -> None:
    mallory = Wire(server, {"identity": {"user": "mallory"}})
    assert mallory.next() == {"event": "error", "data": "mallory is not a user of this server (rigdeck server "
                                                         "add-user)"}
    with pytest.raises(EOFError):
        mallory.next()
    bob = Wire(server, {"identity": {"user": "bob"}})
    assert "result" in bob.call("stop", ref="b-job")
    users = serverhelper.read_users(str(server.users_dir))
    del users["bob"]
    serverhelper._write_users(str(server.users_dir), users)
    assert bob.call("stop", ref="b-job")["error"]["message"] == "refused: bob is no longer a user of this server"


def test_a_removed_persons_open_sessions_are_closed_streams_and_all(server: Server) -> None:
    """remove-user ends the person's open sessions at once (the server looks as users.json
    changes), so an app left open stops receiving; others' sessions go on."""
    bob, alice = Wire(server, {"identity": {"user": "bob"}}), Wire(server, {"identity": {"user": "alice"}})
    server._sessions += [bob.session, alice.session]
    assert "result" in bob.call("stop", ref="b-job")
    server.close_removed()  # nothing changed: nobody is closed
    assert not bob.session._closed.is_set() and not alice.session._closed.is_set()
    users = serverhelper.read_users(str(server.users_dir))
    del users["bob"]
    serverhelper._write_users(str(server.users_dir), users)
    server.close_removed()
    assert bob.next() == {"event": "error", "data": "bob is no longer a user of this server"}
    with pytest.raises(EOFError):
        bob.next()
    assert bob.session._closed.is_set() and not alice.session._closed.is_set()
    assert "result" in alice.call("stop", ref="a-job")


# -- the server host's files, as add-user leaves them ---------------------------------------------


def test_add_user_installs_a_forced_command_and_refuses_a_key_already_there(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir(mode=0o700)
    own = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOwn operator@laptop"
    (tmp_path / ".ssh" / "authorized_keys").write_text(own + "\n")
    state = str(tmp_path / "server")
    payload = {"name": "bob", "admin": False, "key": "ssh-ed25519 AAAAbob", "fingerprint": "SHA256:b",
               "line": 'restrict,command="/s/venv/bin/rigdeck attach --state-dir /s --user bob" ssh-ed25519 '
                       'AAAAbob rigdeck-user:bob@h1', "comment": "rigdeck-user:bob@h1"}
    out = serverhelper.add_user(state, json.dumps(payload))
    assert out["ok"] and not out["replaced"]
    lines = (tmp_path / ".ssh" / "authorized_keys").read_text().splitlines()
    assert lines == [own, payload["line"]]
    assert serverhelper.read_users(state)["bob"]["fingerprint"] == "SHA256:b"
    assert oct((tmp_path / "server" / "users.json").stat().st_mode & 0o777) == "0o600"
    # The operator's own (unrestricted) key given as someone's: sshd would use its first line.
    taken = dict(payload, name="eve", key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOwn", comment="rigdeck-user:eve@h1")
    refused = serverhelper.add_user(state, json.dumps(taken))
    assert refused["ok"] is False and "already in" in refused["error"] and "line 1" in refused["error"]
    assert serverhelper.remove_user(state, "bob")["removed_lines"] == 1
    assert (tmp_path / ".ssh" / "authorized_keys").read_text().splitlines() == [own]
    assert serverhelper.read_users(state) == {}
    assert "no user 'bob'" in serverhelper.remove_user(state, "bob")["error"]


def test_usage_with_a_bad_since_says_what_it_expected_before_reaching_anything(
        capsys: pytest.CaptureFixture[str]) -> None:
    from tui.cli.main import main

    assert main(["usage", "--since", "yesterday", "-i", "/nonexistent/hosts.toml"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rigdeck usage: --since: expected a date (YYYY-MM-DD or YYYY-MM-DDTHH:MM)") and \
        "'yesterday'" in err


def test_env_values_are_the_owners_and_admins_and_a_members_priority_is_capped() -> None:
    from tui.model.permissions import HIDDEN, Actor, env_for, priority_refusal

    spec = {"name": "j", "env": {"WANDB_API_KEY": "s3cret"},
            "pools": [{"name": "w", "env": {"TOKEN": "t0k"}}, {"name": "e", "env": {}}]}
    bob, alice, carol = Actor("bob"), Actor("alice"), Actor("carol", admin=True)
    seen = env_for(bob, "alice", spec)
    assert seen["env"] == {"WANDB_API_KEY": HIDDEN} and seen["pools"][0]["env"] == {"TOKEN": HIDDEN}
    assert "s3cret" not in str(seen) and "t0k" not in str(seen)
    assert spec["env"] == {"WANDB_API_KEY": "s3cret"}  # the record itself is untouched
    for who in (alice, carol, None):  # the owner, an admin, the person at their own controller
        assert env_for(who, "alice", spec) == spec
    assert "s3cret" not in str(env_for(bob, None, spec))  # no recorded owner: only admins see it
    assert priority_refusal(bob, 0, 0) is None and priority_refusal(carol, 1000, 0) is None
    assert "the highest a member may give" in (priority_refusal(bob, 1, 0) or "")
