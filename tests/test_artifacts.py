"""Artifacts between hosts with no shared storage: a finished job's outputs packed on each of its
hosts (agent/artifacts.py), merged into one artifact and staged onto other hosts through the
controller (tui/remote/artifacts.py), every content checked by its SHA-256."""

from __future__ import annotations

import hashlib
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.testbed import TestBed
from tui.model.artifacts import ArtifactError, merge
from tui.model.codesync import FileEntry, tree_hash

ROOT = Path(__file__).resolve().parent.parent
HOST_STATE = "/root/.rigdeck"  # each bed host's private state dir, as the host sees it

# One shard per host (two pieces' worth on the second host, so a content moves in parts), a file
# every host writes alike, and the model on rank 0.
SCRIPT = r"""
import os
host = os.environ["SM_CURRENT_HOST"]
out = os.environ["SM_OUTPUT_DATA_DIR"]
os.makedirs(os.path.join(out, "shards"), exist_ok=True)
n = 700 * 1024 if host.endswith("2") else 1000
with open(os.path.join(out, "shards", "shard-%s.bin" % host), "wb") as f:
    f.write((host * n).encode()[: n * 3])
with open(os.path.join(out, "common.txt"), "w") as f:
    f.write("the same on every host\n")
os.symlink("/etc/hostname", os.path.join(out, "a-link"))
if os.environ["RANK"] == "0":
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "model.bin"), "wb") as f:
        f.write(b"weights" * 100)
"""


def _plans(bed: TestBed, hosts: list[str], job_id: str, command: list[str], **extra: Any) -> dict[str, dict]:
    nodes = [{"host": h, "address": bed.host(h).address, "slots": 1, "gpus": []} for h in hosts]
    return {h: {"job_id": job_id, "launcher": "direct", "command": command, "nodes": nodes, "node_index": i,
                "master_addr": nodes[0]["address"], "master_port": 29400, "workdir": str(ROOT), **extra}
            for i, h in enumerate(hosts)}


def _wait_ended(ctl: Any, hosts: list[str], job_id: str, timeout: float = 30) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while True:
        states = {h: ctl.agent(h).job_status(job_id=job_id)["state"] for h in hosts}
        if all(s in ("succeeded", "failed", "stopped") for s in states.values()):
            return states
        assert time.monotonic() < deadline, f"{job_id} did not end: {states}"
        time.sleep(0.3)


def _local(bed: TestBed, host: str, path: str) -> Path:
    """A path a host's agent answered (under its private state dir), as this process sees it."""
    assert path.startswith(HOST_STATE + "/"), path
    return bed.host(host).state_dir / path[len(HOST_STATE) + 1:]


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def ran(testbed: TestBed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, TestBed, str]]:
    """A controller on the bed and a finished 2-host job (h1, h2) that wrote shards."""
    from tui.control.hostlinks import HostLinks
    from tui.remote.inventoryfile import load_inventory

    inv = testbed.write_inventory(tmp_path_factory.mktemp("art") / "hosts.toml", python=sys.executable,
                                  connect_timeout=5.0)
    ctl = HostLinks(load_inventory(inv))
    job_id = f"art-{uuid.uuid4().hex[:8]}"
    try:
        for h, plan in _plans(testbed, ["h1", "h2"], job_id, [sys.executable, "-c", SCRIPT]).items():
            ctl.agent(h).job_start(plan=plan)
        assert _wait_ended(ctl, ["h1", "h2"], job_id) == {"h1": "succeeded", "h2": "succeeded"}
        yield ctl, testbed, job_id
    finally:
        ctl.close()


pytestmark_bed = pytest.mark.testbed


@pytestmark_bed
def test_outputs_packed_on_each_host_are_staged_everywhere_and_checked(ran: tuple[Any, TestBed, str]) -> None:
    from tui.remote.artifacts import StageResult, stage

    ctl, bed, job_id = ran
    packs = ctl.agents(["h1", "h2"]).artifact_pack(job_id=job_id, kind="output", timeout=60)
    for h, p in packs.items():
        assert not isinstance(p, Exception), (h, p)
        names = sorted(r[0] for r in p["files"])
        # regular files only: the job's symlink is not part of it
        assert names == ["common.txt", f"shards/shard-{h}.bin"], (h, names)
        job_file = bed.host(h).state_dir / "jobs" / job_id / "sagemaker/output/data" / f"shards/shard-{h}.bin"
        row = next(r for r in p["files"] if r[0].startswith("shards/"))
        assert row[1] == _sha(job_file) and row[2] == job_file.stat().st_size
        assert _sha(_local(bed, h, p["path"]) / row[0]) == row[1]
    # Packing again, unchanged: the same tree.
    again = ctl.agent("h2").artifact_pack(job_id=job_id, kind="output", timeout=60)
    assert again["tree"] == packs["h2"]["tree"]

    art = merge(packs)  # type: ignore[arg-type]
    assert sorted(r[0] for r in art["files"]) == ["common.txt", "shards/shard-h1.bin", "shards/shard-h2.bin"]
    seen: dict[str, list[tuple[int, int]]] = {}
    got = stage(ctl, art, ["h1", "h2", "h3"], progress=lambda h, d, t: seen.setdefault(h, []).append((d, t)))
    for h, r in got.items():
        assert isinstance(r, StageResult), (h, r)
        tree = _local(bed, h, r.path)
        assert sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file()) == \
            ["common.txt", "shards/shard-h1.bin", "shards/shard-h2.bin"], h
        for path, sha, size, _exe in art["files"]:
            assert _sha(tree / path) == sha and (tree / path).stat().st_size == size, (h, path)
    sizes = {r[0]: r[2] for r in art["files"]}
    # Each host got only what it lacked: h1 the other shard, h2 h1's, h3 all three contents.
    assert (got["h1"].files_sent, got["h1"].bytes_sent) == (1, sizes["shards/shard-h2.bin"])  # type: ignore[union-attr]
    assert (got["h2"].files_sent, got["h2"].bytes_sent) == (1, sizes["shards/shard-h1.bin"])  # type: ignore[union-attr]
    assert (got["h3"].files_sent, got["h3"].bytes_sent) == (3, art["bytes"])  # type: ignore[union-attr]
    assert seen["h3"][-1] == (art["bytes"], art["bytes"])
    print("\n" + "\n".join(f"staged on {h}: {r.to_json()}" for h, r in got.items()))  # type: ignore[union-attr]
    # A second stage: every host has the tree, nothing is sent.
    twice = stage(ctl, art, ["h1", "h2", "h3"])
    for h, r in twice.items():
        assert isinstance(r, StageResult) and r.had_tree and r.files_sent == 0 and r.bytes_sent == 0, (h, r)
        assert r.to_json()["had_tree"] is True

    model = ctl.agents(["h1", "h2"]).artifact_pack(job_id=job_id, kind="model", timeout=60)
    assert [r[0] for r in model["h1"]["files"]] == ["model.bin"] and model["h2"]["files"] == []  # type: ignore[index]
    assert merge(model)["files"] == model["h1"]["files"]  # type: ignore[arg-type,index]


@pytestmark_bed
def test_a_content_changed_on_its_source_after_packing_is_refused(ran: tuple[Any, TestBed, str]) -> None:
    from tui.remote.artifacts import StageResult, stage

    ctl, bed, job_id = ran
    # checkpoints: the job wrote none; a checkpoint file is added now, then packed
    ck = bed.host("h2").state_dir / "jobs" / job_id / "sagemaker" / "checkpoints"
    (ck / "step-1.pt").write_bytes(b"good checkpoint " * 64)
    pack = ctl.agent("h2").artifact_pack(job_id=job_id, kind="checkpoints", timeout=60)
    art = merge({"h2": pack})
    sha = art["files"][0][1]
    # The packed file is read-only now (its content is the store's); someone changes it anyway.
    assert (ck / "step-1.pt").stat().st_mode & 0o777 == 0o444
    os.chmod(ck / "step-1.pt", 0o644)
    (ck / "step-1.pt").write_bytes(b"evil checkpoint " * 64)  # same size, other bytes
    got = stage(ctl, art, ["h1", "h2"])
    assert isinstance(got["h2"], StageResult) and got["h2"].had_tree  # its own tree: nothing moves
    err = got["h1"]
    assert isinstance(err, ArtifactError), err
    print(f"\nstaging a changed content: {err}")
    assert "step-1.pt" in str(err) and "h2" in str(err) and "SHA-256" in str(err), str(err)
    objects = bed.host("h1").state_dir / "code" / "objects" / sha[:2]
    assert not (objects / sha).exists() and not (objects / f"{sha}.part").exists()

    # A source that cannot give the content (it is not there): the error names it and the file;
    # a host that had the tree is not held up by it.
    lost = {**art, "sources": {"h3": [sha]}}
    got = stage(ctl, lost, ["h1", "h2"])
    assert isinstance(got["h2"], StageResult) and got["h2"].had_tree
    assert isinstance(got["h1"], ArtifactError) and "step-1.pt" in str(got["h1"]) and "from h3" in str(got["h1"]) \
        and "not stored" in str(got["h1"]), got["h1"]


@pytestmark_bed
def test_a_running_job_is_not_packed_and_bad_requests_are_errors(ran: tuple[Any, TestBed, str]) -> None:
    from tui.remote.agentlink import AgentError

    ctl, bed, _job_id = ran
    job_id = f"busy-{uuid.uuid4().hex[:8]}"
    plan = _plans(bed, ["h3"], job_id, ["sleep", "30"])["h3"]
    ctl.agent("h3").job_start(plan=plan)
    try:
        with pytest.raises(AgentError, match="still"):
            ctl.agent("h3").artifact_pack(job_id=job_id, kind="output")
    finally:
        ctl.agent("h3").job_stop(job_id=job_id, grace_s=0.5)
    agent = ctl.agent("h3")
    bad_packs: list[tuple[dict[str, Any], str]] = [({"job_id": "../etc", "kind": "output"}, "bad job id"),
                           ({"job_id": job_id, "kind": "weights"}, "kind"),
                           ({"job_id": "no-such-job", "kind": "output"}, "no job")]
    for params, expect in bad_packs:
        with pytest.raises(AgentError, match=expect):
            agent.artifact_pack(**params)
    content = b"x" * 1000
    sha = hashlib.sha256(content).hexdigest()
    agent.code_put(blobs=[[sha, "raw", __import__("base64").b64encode(content).decode(), 0, True]])
    piece = agent.code_get(sha=sha, offset=990, size=100)
    assert piece["size"] == 1000 and piece["eof"] and __import__("base64").b64decode(piece["data"]) == b"x" * 10
    bad_gets: list[tuple[dict[str, Any], str]] = [({"sha": "../../etc/passwd", "offset": 0, "size": 10}, "SHA-256"),
                           ({"sha": sha, "offset": -1, "size": 10}, "offset"),
                           ({"sha": sha, "offset": 1001, "size": 10}, "past the end"),
                           ({"sha": sha, "offset": 0, "size": 0}, "size"),
                           ({"sha": "0" * 64, "offset": 0, "size": 10}, "not stored")]
    for params, expect in bad_gets:
        with pytest.raises(AgentError, match=expect):
            agent.code_get(**params)
    assert agent.ping() > 0  # the daemon answered every one and lives on


@pytestmark_bed
def test_seed_checkpoint_fills_an_empty_checkpoint_dir_and_never_overwrites(ran: tuple[Any, TestBed, str]) -> None:
    from tui.remote.artifacts import StageResult, stage

    ctl, bed, _ = ran
    content = b"resume from here\n"
    sha = hashlib.sha256(content).hexdigest()
    import base64

    # A seed tree on h3 (as a step's checkpoints would be staged there).
    ctl.agent("h1").code_put(blobs=[[sha, "raw", base64.b64encode(content).decode(), 0, True]])
    rows = [["ckpt/last.pt", sha, len(content), False]]
    ctl.agent("h1").code_commit(tree=tree_hash([FileEntry(*r) for r in rows]), files=rows)  # type: ignore[arg-type]
    art = {"tree": tree_hash([FileEntry(*r) for r in rows]), "files": rows, "bytes": len(content),  # type: ignore[arg-type]
           "sources": {"h1": [sha]}}
    staged = stage(ctl, art, ["h3"])["h3"]
    assert isinstance(staged, StageResult) and staged.files_sent == 1
    job_id = f"seed-{uuid.uuid4().hex[:8]}"
    reader = ("import os; p = os.path.join(os.environ['RIGDECK_CHECKPOINT_DIR'], 'ckpt', 'last.pt'); "
              "open(p, 'a').write('trained\\n')")
    plan = _plans(bed, ["h3"], job_id, [sys.executable, "-c", reader], seed_checkpoint=staged.path)["h3"]
    ctl.agent("h3").job_start(plan=plan)
    assert _wait_ended(ctl, ["h3"], job_id) == {"h3": "succeeded"}
    ck = bed.host("h3").state_dir / "jobs" / job_id / "sagemaker" / "checkpoints" / "ckpt" / "last.pt"
    assert ck.read_bytes() == content + b"trained\n"  # a writable copy, seeded before the job ran
    assert (_local(bed, "h3", staged.path) / "ckpt" / "last.pt").read_bytes() == content  # the tree untouched
    # The next attempt (restart_count 1) is not seeded; a first attempt over a dir that has the
    # file keeps the file as it is.
    ctl.agent("h3").job_start(plan={**plan, "restart_count": 1})
    _wait_ended(ctl, ["h3"], job_id)
    assert ck.read_bytes() == content + b"trained\n" * 2
    ctl.agent("h3").job_start(plan=plan)
    _wait_ended(ctl, ["h3"], job_id)
    assert ck.read_bytes() == content + b"trained\n" * 3
    # A seed that is not on the host fails the start, saying so.
    other = f"seed-{uuid.uuid4().hex[:8]}"
    ctl.agent("h3").job_start(plan={**plan, "job_id": other, "seed_checkpoint": "/nowhere/tree"})
    assert _wait_ended(ctl, ["h3"], other) == {"h3": "failed"}
    cause = ctl.agent("h3").job_status(job_id=other)["cause"]
    assert cause is not None and "seed_checkpoint /nowhere/tree is not a directory on this host" in cause["message"]


# -- merge, without hosts ---------------------------------------------------------------------------

def _row(path: str, data: bytes, exe: bool = False) -> list[Any]:
    return [path, hashlib.sha256(data).hexdigest(), len(data), exe]


def test_merge_is_the_union_with_one_file_per_path_and_the_agents_tree_hash() -> None:
    from agent.code import tree_hash as agent_tree_hash

    a = {"files": [_row("shard-0", b"a"), _row("common", b"c")]}
    b = {"files": [_row("shard-1", b"b"), _row("common", b"c"), _row("dup-of-a", b"a")]}
    art = merge({"h2": b, "h1": a})
    assert [r[0] for r in art["files"]] == ["common", "dup-of-a", "shard-0", "shard-1"]
    assert art["bytes"] == 4
    assert art["tree"] == agent_tree_hash(art["files"])
    sha = {d: hashlib.sha256(d).hexdigest() for d in (b"a", b"b", b"c")}
    assert art["sources"] == {"h1": sorted([sha[b"a"], sha[b"c"]]), "h2": sorted([sha[b"a"], sha[b"b"], sha[b"c"]])}
    assert merge({"h1": a, "h2": b}) == art  # the order the packs come in does not matter
    empty = merge({"h1": {"files": []}})
    assert empty["files"] == [] and empty["tree"] == agent_tree_hash([])


def test_merge_refuses_a_path_with_two_contents_naming_it_and_both_hosts() -> None:
    with pytest.raises(ArtifactError, match=r"model\.bin: h1 and h3 both wrote it, with different contents"):
        merge({"h1": {"files": [_row("model.bin", b"one")]}, "h3": {"files": [_row("model.bin", b"two")]}})
    with pytest.raises(ArtifactError, match="h2: not a relative path"):
        merge({"h2": {"files": [_row("../escape", b"x")]}})
    with pytest.raises(ArtifactError, match="h2: each file must be"):
        merge({"h2": {"files": [["a", "b"]]}})


# -- packing, on this machine's agent code --------------------------------------------------------

def test_pack_links_the_jobs_own_files_copies_others_and_reads_an_unchanged_job_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agent import artifacts

    state = tmp_path / "state"
    job = state / "jobs" / "j1"
    out = job / "sagemaker" / "output" / "data"
    (out / "sub").mkdir(parents=True)
    (out / "a.txt").write_text("a\n")
    (out / "sub" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(out / "sub" / "run.sh", 0o755)
    (out / "link").symlink_to("/etc/hostname")
    (out / "dir-link").symlink_to(tmp_path)
    mine = tmp_path / "user-ckpt"  # a checkpoint.dir outside the job's directory: the user's
    mine.mkdir()
    (mine / "last.pt").write_bytes(b"ck")
    os.chmod(mine / "last.pt", 0o640)

    p = artifacts.pack(str(state), str(job), "j1", {}, "output")
    assert p["files"] == [["a.txt", _sha_bytes(b"a\n"), 2, False], ["sub/run.sh", _sha_bytes(b"#!/bin/sh\n"), 10, True]]
    assert p["bytes"] == 12 and Path(p["path"], "sub", "run.sh").read_bytes() == b"#!/bin/sh\n"
    # the job's own file is the stored content now (one inode), read-only
    obj = Path(state, "code", "objects", p["files"][0][1][:2], p["files"][0][1])
    assert os.path.samefile(obj, out / "a.txt") and (out / "a.txt").stat().st_mode & 0o777 == 0o444

    ck = artifacts.pack(str(state), str(job), "j1", {"checkpoint": {"dir": str(mine)}}, "checkpoints")
    assert ck["files"] == [["last.pt", _sha_bytes(b"ck"), 2, False]]
    assert (mine / "last.pt").stat().st_mode & 0o777 == 0o640 and (mine / "last.pt").stat().st_nlink == 1

    assert artifacts.pack(str(state), str(job), "j1", {}, "model")["files"] == []  # empty: an empty tree

    reads: list[str] = []
    for name in ("_store_linked", "_store_copied"):
        real = getattr(artifacts, name)
        monkeypatch.setattr(artifacts, name, lambda sd, full, real=real: reads.append(full) or real(sd, full))
    assert artifacts.pack(str(state), str(job), "j1", {}, "output") == p
    assert reads == []  # nothing read again
    (out / "b.txt").write_text("new\n")
    again = artifacts.pack(str(state), str(job), "j1", {}, "output")
    assert reads == [str(out / "b.txt")] and len(again["files"]) == 3


def _sha_bytes(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_a_destination_whose_link_fails_after_the_last_piece_does_not_hang_the_stage() -> None:
    """A destination's link that fails once its sender has taken the last pieces, and the end
    mark behind them, off its queue: the sender must not wait for a second end mark (it used to,
    and ``stage`` never returned). Fake links, no bed."""
    import base64
    import threading

    from tui.remote.artifacts import StageResult, stage

    content = b"one piece\n" * 100
    sha = _sha_bytes(content)
    rows = [["a.txt", sha, len(content), False]]
    art = {"tree": tree_hash([FileEntry(*r) for r in rows]), "files": rows,  # type: ignore[arg-type]
           "bytes": len(content), "sources": {"src": [sha]}}
    fetched = threading.Event()

    class Link:
        def __init__(self, host: str) -> None:
            self.host = host

        def request(self, method: str, timeout: float = 30.0, **params: Any) -> Any:
            assert method == "code_have", method
            return {"path": "/trees/t"} if self.host == "src" else {"missing": [sha]}

        def pipeline(self, calls: Iterator[tuple[str, dict[str, Any]]], window: int = 4, timeout: float = 60.0,
                     on_result: Any = None) -> int:
            if self.host == "src":
                for method, _params in calls:
                    assert method == "code_get", method
                    on_result({"data": base64.b64encode(content).decode(), "size": len(content), "eof": True})
                return 1
            fetched.wait(10)
            time.sleep(0.3)  # the end mark is queued by now: the batch takes it along
            next(calls)
            raise ConnectionError("link dropped")

        def close(self) -> None:
            if self.host == "src":
                fetched.set()

    class Ctl:
        def side_link(self, host: str) -> Link:
            return Link(host)

    got: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: got.update(stage(Ctl(), art, ["src", "dst"], timeout=5.0)),
                              daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "stage hung on a destination whose link failed"
    assert isinstance(got["src"], StageResult) and got["src"].had_tree
    assert isinstance(got["dst"], ArtifactError) and str(got["dst"]) == "dst: link dropped", got["dst"]
