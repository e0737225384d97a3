"""``rigdeck tensorboard``: which bytes to fetch (tui/model/tbsync.py), the host's side that lists
and reads a job's TensorBoard files confined to its directories (agent/tensorboard.py), and the
incremental copy through the controller's pull into the local directory, on real files.

The acceptance test on the test bed (a 2-host gloo job writing with torch's SummaryWriter, read
back by TensorBoard itself) is tests/test_tensorboard_bed.py."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent import tensorboard as host_tb
from agent.kinds.base import NODE_ENV_FILE
from tui.cli import tensorboard as tb_cli
from tui.cli.main import main
from tui.control.tensorboard import pull
from tui.model.tbsync import Have, RemoteFile, TensorboardSyncError, local_parts, parse_have, start_offset
from tui.remote.agentclient import AgentClient

EVENTS = "events.out.tfevents.1700000000.h1.42.0"


# -- which bytes ---------------------------------------------------------------------------------


def test_an_event_file_is_read_from_where_the_copy_ends_and_from_0_when_it_shrank_or_was_replaced() -> None:
    f = RemoteFile(f"rank-0/{EVENTS}", size=100, mtime_ns=5, id="1:10")
    assert start_offset(f, None) == 0
    assert start_offset(RemoteFile(EVENTS, 0, 5, "1:10"), None) is None  # empty: nothing yet
    assert start_offset(f, Have("1:10", 60, 4)) == 60  # grew: the new bytes only
    assert start_offset(f, Have("1:10", 100, 4)) is None  # whole (a touched mtime is no news)
    assert start_offset(f, Have("1:10", 140, 5)) == 0  # truncated
    assert start_offset(f, Have("1:11", 60, 5)) == 0  # another file at the path
    asset = RemoteFile("plugins/projector/config.pbtxt", size=30, mtime_ns=9, id="1:12")
    assert start_offset(asset, Have("1:12", 30, 9)) is None
    assert start_offset(asset, Have("1:12", 10, 9)) == 10  # a copy cut short goes on
    assert start_offset(asset, Have("1:12", 30, 8)) == 0  # rewritten in place: again, whole


def test_local_places_stay_under_the_host_and_several_directories_get_a_folder_each() -> None:
    assert local_parts("h1", "/s/jobs/j/tensorboard", ["/s/jobs/j/tensorboard"], f"r0/{EVENTS}") == ["h1", "r0", EVENTS]
    assert local_parts("h1", "/data/tb/a", ["/data/tb/a", "/data/tb/b"], EVENTS) == ["h1", "data_tb_a", EVENTS]
    for host, path in (("h1", "../x.tfevents.1"), ("h1", "/etc/x.tfevents.1"), ("h1", "a/../../x"), ("..", EVENTS),
                       ("a/b", EVENTS)):
        with pytest.raises(TensorboardSyncError):
            local_parts(host, "/d", ["/d"], path)
    with pytest.raises(TensorboardSyncError, match="have entry"):
        parse_have([["h1", "/d", EVENTS, "1:2", -1, 0]])
    with pytest.raises(TensorboardSyncError, match=r"\[path, size, mtime_ns, id\]"):
        RemoteFile.from_row(["x.tfevents.1", "12", 0, "1:2"])


# -- the host's side ------------------------------------------------------------------------------


def job_dir(tmp: Path, name: str = "j1", tb: str | None = None, replicas: dict[str, str] | None = None) -> Path:
    """A job's directory as the agent leaves it: node_env.json naming its TensorBoard directory."""
    d = tmp / "jobs" / name
    d.mkdir(parents=True)
    (d / NODE_ENV_FILE).write_text(json.dumps({host_tb.ENV_VAR: tb or str(d / "tensorboard")}))
    for replica, value in (replicas or {}).items():
        (d / "replicas" / replica).mkdir(parents=True)
        (d / "replicas" / replica / NODE_ENV_FILE).write_text(json.dumps({host_tb.ENV_VAR: value}))
    return d


def test_the_job_s_directories_are_its_own_environment_s(tmp_path: Path) -> None:
    d = job_dir(tmp_path, replicas={"worker-0": "/data/tb/w", "worker-1": "rel/tb", "evaluator-0": "/data/tb/w/"})
    dirs, problems = host_tb.job_dirs(str(d))
    assert dirs == ["/data/tb/w", str(d / "tensorboard")]
    assert problems == ["AIP_TENSORBOARD_LOG_DIR='rel/tb' is not an absolute path: not read"]
    bare = tmp_path / "jobs" / "processing"
    bare.mkdir()
    assert host_tb.job_dirs(str(bare)) == ([], [])


def test_the_listing_holds_what_tensorboard_reads_and_follows_no_link(tmp_path: Path) -> None:
    d = job_dir(tmp_path)
    tb = d / "tensorboard"
    (tb / "rank-0" / "plugins" / "profile").mkdir(parents=True)
    (tb / "rank-0" / EVENTS).write_bytes(b"x" * 10)
    (tb / "rank-0" / "plugins" / "profile" / "trace.pb").write_bytes(b"p" * 3)
    (tb / "checkpoint.pt").write_bytes(b"c" * 99)  # not TensorBoard's: not listed
    secret = tmp_path / "secret"
    (secret / "sub").mkdir(parents=True)
    (secret / "sub" / "a.tfevents.1").write_bytes(b"s")
    (tb / "linked").symlink_to(secret)  # a link to a directory elsewhere: not followed
    (tb / "b.tfevents.2").symlink_to(secret / "sub" / "a.tfevents.1")  # nor a link to a file
    answer = host_tb.files(str(d))
    (listing,) = answer["dirs"]
    assert listing["dir"] == str(tb) and not listing["truncated"] and answer["problems"] == []
    assert [(p, size) for p, size, _, _ in listing["files"]] == [
        ("rank-0/" + EVENTS, 10), ("rank-0/plugins/profile/trace.pb", 3)]
    st = os.stat(tb / "rank-0" / EVENTS)
    assert listing["files"][0][2:] == [st.st_mtime_ns, f"{st.st_dev}:{st.st_ino}"]
    assert host_tb.files(str(job_dir(tmp_path, "j2")))["dirs"] == [
        {"dir": str(tmp_path / "jobs" / "j2" / "tensorboard"), "files": [], "truncated": False}]


def test_reading_is_confined_to_the_job_s_directory(tmp_path: Path) -> None:
    d = job_dir(tmp_path)
    tb = d / "tensorboard"
    (tb / "r").mkdir(parents=True)
    (tb / "r" / EVENTS).write_bytes(b"0123456789")
    got = host_tb.read_in_job(str(d), str(tb), f"r/{EVENTS}", 4, 3)
    assert (got["offset"], got["size"], got["eof"]) == (4, 10, False)
    assert base64.b64decode(got["b64"]) == b"456"
    past = host_tb.read_in_job(str(d), str(tb), f"r/{EVENTS}", 50)
    assert (past["b64"], past["size"], past["eof"]) == ("", 10, True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.tfevents.1").write_bytes(b"secret")
    (tb / "out").symlink_to(outside)
    (tb / "y.tfevents.1").symlink_to(outside / "x.tfevents.1")
    (tb / "notes.txt").write_text("not TensorBoard's")
    for path, says in ((f"../{d.name}/x.tfevents.1", "under the directory"), ("r/../../x.tfevents.1", "under"),
                       ("/etc/x.tfevents.1", "relative"), ("out/x.tfevents.1", "cannot read"),
                       ("y.tfevents.1", "cannot read"), ("notes.txt", "no file TensorBoard reads"),
                       ("r/none.tfevents.1", "no file"), ("", "relative")):
        with pytest.raises(host_tb.TensorboardError, match=says):
            host_tb.read_in_job(str(d), str(tb), path, 0)
    with pytest.raises(host_tb.TensorboardError, match="not a TensorBoard directory of this job"):
        host_tb.read_in_job(str(d), str(outside), "x.tfevents.1", 0)


# -- the copy, through the controller's pull ----------------------------------------------------


class Hosts:
    """Each host's agent as the controller reaches it (the typed client), answering from a job
    directory on this machine with the agent's own code."""

    def __init__(self, dirs: dict[str, Path]):
        self.dirs = dirs
        self.reads: list[tuple[str, str, int]] = []

    def agent(self, host: str) -> AgentClient:
        job = str(self.dirs[host])

        def call(method: str, timeout: float | None = None, **p: Any) -> Any:
            if method == "job_tensorboard_files":
                return host_tb.files(job)
            assert method == "job_tensorboard_read", method
            self.reads.append((host, p["path"], p["offset"]))
            return host_tb.read_in_job(job, p["dir"], p["path"], p["offset"], p.get("max_bytes"))

        return AgentClient(host, call)


class Client:
    """What ``rigdeck tensorboard`` asks of the controller API, answered as JobManager does."""

    def __init__(self, hosts: Hosts, state: str = "running"):
        self.hosts, self.state = hosts, state

    def tensorboard_pull(self, ref: str, have: list[list[Any]] | None = None) -> Iterator[dict[str, Any]]:
        yield {"kind": "job", "job_id": ref, "state": self.state, "hosts": list(self.hosts.dirs)}
        yield from pull(self.hosts, ref, list(self.hosts.dirs), parse_have(have))


def test_the_copy_takes_only_new_bytes_and_starts_a_replaced_or_truncated_file_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_tb, "MAX_READ", 1000)  # several pieces per file
    d1, d2 = job_dir(tmp_path / "h1"), job_dir(tmp_path / "h2")
    e1 = d1 / "tensorboard" / "rank-0" / EVENTS
    e2 = d2 / "tensorboard" / "rank-1" / EVENTS
    for e in (e1, e2):
        e.parent.mkdir(parents=True)
        e.write_bytes(os.urandom(2500))
    hosts = Hosts({"h1": d1, "h2": d2})
    local = tmp_path / "here"
    copy = tb_cli.LocalCopy(local)
    rnd = tb_cli.pull_once(Client(hosts), "j1", copy)
    assert rnd.copied == {"h1": 2500, "h2": 2500} and rnd.files == 2 and not rnd.problems
    l1, l2 = local / "h1" / "rank-0" / EVENTS, local / "h2" / "rank-1" / EVENTS
    assert l1.read_bytes() == e1.read_bytes() and l2.read_bytes() == e2.read_bytes()
    assert [o for h, _, o in hosts.reads if h == "h1"] == [0, 1000, 2000]

    # Appended to: only the new bytes come, to the end of the copy; an unchanged file costs no read.
    hosts.reads.clear()
    with open(e1, "ab") as f:
        f.write(b"tail" * 100)
    rnd = tb_cli.pull_once(Client(hosts), "j1", tb_cli.LocalCopy(local))  # a new run: the state file says where
    assert rnd.copied == {"h1": 400} and hosts.reads == [("h1", f"rank-0/{EVENTS}", 2500)]
    assert l1.read_bytes() == e1.read_bytes()

    # Truncated, then replaced by another file at the same path: each time again from byte 0.
    hosts.reads.clear()
    e1.write_bytes(b"short")  # the same inode, fewer bytes
    rnd = tb_cli.pull_once(Client(hosts), "j1", copy)
    assert rnd.copied == {"h1": 5} and hosts.reads == [("h1", f"rank-0/{EVENTS}", 0)]
    assert l1.read_bytes() == b"short"
    replaced = e1.with_name("new")
    replaced.write_bytes(b"another file, longer than before")
    os.replace(replaced, e1)
    rnd = tb_cli.pull_once(Client(hosts), "j1", copy)
    assert rnd.copied == {"h1": 32} and l1.read_bytes() == e1.read_bytes()
    e1.write_bytes(b"")
    tb_cli.pull_once(Client(hosts), "j1", copy)
    assert l1.read_bytes() == b""
    # Nothing new: nothing read.
    hosts.reads.clear()
    assert tb_cli.pull_once(Client(hosts), "j1", copy).copied == {} and hosts.reads == []


def test_a_piece_that_does_not_continue_its_copy_is_dropped_and_the_file_fetched_again(tmp_path: Path) -> None:
    d = job_dir(tmp_path / "h1")
    e = d / "tensorboard" / EVENTS
    e.parent.mkdir(parents=True)
    e.write_bytes(b"a" * 50)
    hosts = Hosts({"h1": d})
    local = tmp_path / "here"
    tb_cli.pull_once(Client(hosts), "j1", tb_cli.LocalCopy(local))
    assert (local / "h1" / EVENTS).read_bytes() == b"a" * 50
    # A second directory appears on the host (a pool's replica with its own): each gets a folder,
    # so the copy held is not where the file's new bytes go.
    (d / "replicas" / "worker-0").mkdir(parents=True)
    (d / "replicas" / "worker-0" / NODE_ENV_FILE).write_text(json.dumps({host_tb.ENV_VAR: str(tmp_path / "other")}))
    with open(e, "ab") as f:
        f.write(b"b" * 10)
    rnd = tb_cli.pull_once(Client(hosts), "j1", tb_cli.LocalCopy(local))
    assert rnd.copied == {} and rnd.hosts["h1"]["dirs"] == [str(d / "tensorboard"), str(tmp_path / "other")]
    rnd = tb_cli.pull_once(Client(hosts), "j1", tb_cli.LocalCopy(local))  # known no more: whole again
    moved = local / "h1" / "_".join(p for p in str(d / "tensorboard").split("/") if p) / EVENTS
    assert rnd.copied == {"h1": 60} and moved.read_bytes() == e.read_bytes()


def test_a_host_whose_agent_predates_the_rpc_is_named_with_why(tmp_path: Path) -> None:
    from tui.remote.agentlink import AgentError

    class Old(Hosts):
        def agent(self, host: str) -> AgentClient:
            def call(method: str, timeout: float | None = None, **p: Any) -> Any:
                raise AgentError(host, "unknown_method", f"unknown method {method!r}")
            return AgentClient(host, call)

    rnd = tb_cli.pull_once(Client(Old({"h1": tmp_path})), "j1", tb_cli.LocalCopy(tmp_path / "here"))
    assert rnd.failed == ["h1"] and "its agent is older than rigdeck tensorboard" in rnd.hosts["h1"]["error"]


def test_the_command_says_what_is_missing_before_it_asks_anything(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    monkeypatch.setenv("RIGDECK_INVENTORY", str(tmp_path / "none.toml"))
    monkeypatch.setattr(tb_cli.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(tb_cli.shutil, "which", lambda name: None)
    assert main(["tensorboard", "j1"]) == 2
    err = capsys.readouterr().err
    assert "TensorBoard is not installed" in err and "pip install 'rigdeck[tensorboard]'" in err and "--once" in err
    assert main(["tensorboard", "j1", "--poll", "0"]) == 2
    assert "--poll 0: expected a number of seconds > 0" in capsys.readouterr().err
