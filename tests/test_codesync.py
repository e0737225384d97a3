"""Code sync: ``[code] sync`` ships a directory that exists only on the workstation to the job's
hosts (content-addressed: only what changed is sent), and the job runs in the hosts' copies."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kit import EXAMPLES
from tests.kit.bedcli import Cli
from tests.testbed import WORKSTATION_ONLY, TestBed

pytestmark = pytest.mark.testbed

DDP_SPEC = """\
name = "ddp-synced"
command = ["{python}", "train.py", "--steps", "30", "--checkpoint-every", "10", "--seed", "0"]
launcher = "torchrun"
nodes = 3
processes_per_node = 2
max_runtime = "10m"

[code]
sync = "."

[env]
OMP_NUM_THREADS = "1"

[checkpoint]
dir = "/tmp/rigdeck-checkpoints/{job_id}"
"""


@pytest.fixture
def code_dir() -> Iterator[Path]:
    """A copy of the ddp example in a directory the bed's hosts do not see."""
    d = Path(WORKSTATION_ONLY) / f"ddp-{uuid.uuid4().hex[:8]}"
    d.mkdir(parents=True)
    shutil.copy(EXAMPLES / "ddp" / "train.py", d / "train.py")
    (d / "data").mkdir()
    (d / "data" / "notes.txt").write_text("shipped with the code\n")
    (d / "job.toml").write_text(DDP_SPEC)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _sync_event(view: dict) -> dict:
    return next(e for e in reversed(view["events"]) if e.get("event") == "code")


def test_ddp_runs_from_code_only_the_workstation_has_and_a_change_sends_one_file(
        testbed: TestBed, tmp_path: Path, code_dir: Path) -> None:
    # As tests/test_examples_e2e.py runs the examples (this job is the ddp example's training).
    cli = Cli(testbed, tmp_path, mpi_ssh=True, timeout=240)
    # The hosts cannot see the directory: the job can only run from what was shipped.
    res = cli.run("exec", "--all", "--json", "--", "test", "-e", str(code_dir / "train.py"), check=False)
    seen = json.loads(res.stdout)
    assert res.returncode == 1 and [r["exit_code"] for r in seen["hosts"]] == [1, 1, 1], res.stdout
    assert code_dir.joinpath("train.py").is_file()  # while the workstation has it

    first = cli.json("launch", str(code_dir / "job.toml"), "--wait", timeout=240)
    assert first["state"] == "succeeded", json.dumps(first, indent=1)[-3000:]
    assert len({n["host"] for n in first["placement"]}) == 3
    code = first["code"]
    files = {"train.py", "job.toml", "data/notes.txt"}
    assert code["files"] == len(files)
    sync = _sync_event(first)
    assert sorted(sync["hosts"]) == sorted(n["host"] for n in first["placement"])
    size = sum((code_dir / f).stat().st_size for f in files)
    for host, r in sync["hosts"].items():
        assert not r["had_tree"] and r["files_sent"] == len(files) and r["bytes_sent"] == size, (host, r)
        assert r["path"].endswith(f"/code/trees/{code['tree']}")
    # Each host ran in its own copy, under its private state dir, and the copy is exact.
    for h in testbed.hosts:
        tree = h.state_dir / "code" / "trees" / code["tree"]
        for f in files:
            assert (tree / f).read_bytes() == (code_dir / f).read_bytes(), (h.name, f)
    metrics = cli.json("metrics", first["job_id"])
    assert {m["rank"] for m in metrics if m.get("loss") is not None} == set(range(6))

    # One file changed: only that file goes, to every host (the sync is done once the job has
    # started; the run itself was shown above, so it is stopped here).
    with (code_dir / "train.py").open("a") as f:
        f.write("\n# changed after the first launch\n")
    second = cli.json("launch", str(code_dir / "job.toml"), timeout=240)
    cli.run("stop", second["job_id"], "--yes", "--grace", "1", check=False)
    assert second["code"]["tree"] != code["tree"]
    for host, r in _sync_event(second)["hosts"].items():
        assert not r["had_tree"] and r["files_sent"] == 1, (host, r)
        assert r["bytes_sent"] == (code_dir / "train.py").stat().st_size, (host, r)

    # The same version again: the hosts have it, nothing is sent.
    third = cli.run("launch", str(code_dir / "job.toml"))
    assert third.stdout.count("had it, sent nothing") == 3, third.stdout
    job_id = third.stdout.split()[1].rstrip(":")
    cli.run("stop", job_id, "--yes", check=False)


# -- the parts, without hosts ---------------------------------------------------------------------

def _manifest_rows(files: dict[str, bytes]) -> tuple[str, list[list]]:
    import hashlib

    from tui.model.codesync import FileEntry, Manifest

    m = Manifest(tuple(sorted((FileEntry(p, hashlib.sha256(b).hexdigest(), len(b), p.endswith(".sh"))
                               for p, b in files.items()), key=lambda e: e.path)))
    return m.tree, m.to_wire()


def test_agent_store_takes_only_contents_that_match_and_makes_the_tree_whole(tmp_path: Path) -> None:
    import base64
    import hashlib
    import zlib

    from agent import code

    files = {"a.py": b"print('a')\n", "run.sh": b"#!/bin/sh\necho hi\n", "d/b.txt": b"x" * 3000}
    tree, rows = _manifest_rows(files)
    from agent.code import tree_hash

    assert tree_hash([list(r) for r in rows]) == tree  # the agent names trees as the controller does
    have = code.have(str(tmp_path), tree, [r[1] for r in rows])
    assert have["path"] is None
    assert sorted(have["missing"]) == sorted(hashlib.sha256(b).hexdigest() for b in files.values())
    with pytest.raises(code.CodeError, match="not here"):
        code.commit(str(tmp_path), tree, rows)
    # A content whose bytes do not hash to its name is refused, and not kept.
    bad = hashlib.sha256(b"other").hexdigest()
    with pytest.raises(code.CodeError, match="does not match"):
        code.put(str(tmp_path), [[bad, "raw", base64.b64encode(b"not other").decode(), 0, True]])
    assert not Path(code.object_path(str(tmp_path), bad)).exists()
    # One sent whole (compressed), one in two parts, one raw.
    big = files["d/b.txt"]
    items = [[hashlib.sha256(files["a.py"]).hexdigest(), "raw", base64.b64encode(files["a.py"]).decode(), 0, True],
             [hashlib.sha256(files["run.sh"]).hexdigest(), "zlib",
              base64.b64encode(zlib.compress(files["run.sh"])).decode(), 0, True],
             [hashlib.sha256(big).hexdigest(), "raw", base64.b64encode(big[:1000]).decode(), 0, False],
             [hashlib.sha256(big).hexdigest(), "raw", base64.b64encode(big[1000:]).decode(), 1000, True]]
    assert code.put(str(tmp_path), items)["stored"] == 3
    # A manifest that does not hash to the tree's name is refused; paths out of the tree too.
    with pytest.raises(code.CodeError, match="does not hash"):
        code.commit(str(tmp_path), tree, rows[:-1])
    with pytest.raises(code.CodeError, match="not a relative path"):
        code.commit(str(tmp_path), tree, [["../evil", rows[0][1], rows[0][2], False]])
    made = code.commit(str(tmp_path), tree, rows)
    out = Path(made["path"])
    assert made["made"] and out.name == tree
    assert {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()} == files
    assert (out / "run.sh").stat().st_mode & 0o111 and not (out / "a.py").stat().st_mode & 0o111
    assert code.have(str(tmp_path), tree, [])["path"] == str(out)


def test_snapshot_lists_git_files_or_follows_rigdeckignore_and_checks_limits(tmp_path: Path) -> None:
    import dataclasses
    import subprocess

    from tui.model.codesync import CodeSpec, CodeSyncError
    from tui.remote.codesync import CodeStore

    plain = tmp_path / "plain"
    (plain / "sub" / "build").mkdir(parents=True)
    (plain / "train.py").write_text("x = 1\n")
    (plain / "notes.log").write_text("log\n")
    (plain / "keep.log").write_text("keep\n")
    (plain / "sub" / "build" / "out.bin").write_bytes(b"\0" * 10)
    (plain / "sub" / "m.py").write_text("y = 2\n")
    (plain / ".rigdeckignore").write_text("# logs and build output\n*.log\n!keep.log\nbuild/\n")
    store = CodeStore(tmp_path / "store")
    spec, done = store.snapshot(CodeSpec(sync=str(plain)))
    assert done["listed_by"] == ".rigdeckignore"
    paths = {e.path for e in store.manifest(spec.tree).entries}
    assert paths == {".rigdeckignore", "keep.log", "sub/m.py", "train.py"}
    assert spec.files == 4 and done["new_contents"] == 4

    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / ".gitignore").write_text("*.ckpt\n")
    (repo / "tracked.py").write_text("a\n")
    (repo / "gone.py").write_text("b\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    (repo / "gone.py").unlink()  # tracked, deleted here: nothing to ship
    (repo / "new.py").write_text("c\n")  # untracked, not ignored: shipped
    (repo / "model.ckpt").write_bytes(b"big")  # ignored
    spec, done = store.snapshot(CodeSpec(sync=str(repo)))
    assert done["listed_by"] == "git"
    assert {e.path for e in store.manifest(spec.tree).entries} == {".gitignore", "tracked.py", "new.py"}

    with pytest.raises(CodeSyncError, match=r"4 files to sync, over \[code\] max_files = 3"):
        store.snapshot(dataclasses.replace(CodeSpec(sync=str(plain)), max_files=3))
    (plain / "big.dat").write_bytes(b"\1" * (2 << 20))
    with pytest.raises(CodeSyncError, match=r"over \[code\] max_mb = 1"):
        store.snapshot(CodeSpec(sync=str(plain), max_mb=1))


def _project_with_links(tmp_path: Path, git: bool) -> tuple[Path, Path]:
    """A project (a git work tree or not) with a link to a file in it, a link to a secret
    outside it, and a directory linked from outside; the secret's path."""
    import subprocess

    outside = tmp_path / "home"
    (outside / ".ssh").mkdir(parents=True)
    secret = outside / ".ssh" / "id_ed25519"
    secret.write_text("PRIVATE KEY\n")
    (outside / "lib").mkdir()
    (outside / "lib" / "util.py").write_text("outside = True\n")
    proj = tmp_path / "proj"
    (proj / "conf").mkdir(parents=True)
    (proj / "train.py").write_text("x = 1\n")
    (proj / "conf" / "alias.py").symlink_to("../train.py")  # stays inside: shipped as today
    if git:
        cmd = ["git", "-C", str(proj), "-c", "user.name=t", "-c", "user.email=t@t"]
        subprocess.run([*cmd, "init", "-q"], check=True)
        (proj / "lib").mkdir()
        (proj / "lib" / "util.py").write_text("inside = True\n")
        subprocess.run([*cmd, "add", "."], check=True)
        subprocess.run([*cmd, "commit", "-qm", "x"], check=True)
        # git still lists lib/util.py, now read through a link to a directory outside
        shutil.rmtree(proj / "lib")
        (proj / "lib").symlink_to(outside / "lib")
    (proj / "deploy_key").symlink_to(secret)
    return proj, secret


@pytest.mark.parametrize("git", [False, True], ids=["rigdeckignore", "git"])
def test_a_link_out_of_the_synced_directory_is_refused_before_anything_is_read_unless_followed(
        tmp_path: Path, git: bool) -> None:
    from tui.model.codesync import CodeSpec, CodeSyncError
    from tui.remote.codesync import CodeStore

    proj, secret = _project_with_links(tmp_path, git)
    store = CodeStore(tmp_path / "code")
    with pytest.raises(CodeSyncError) as e:
        store.snapshot(CodeSpec(sync=str(proj)), "job.toml: [code] sync")
    msg = str(e.value)
    assert msg.startswith(f"job.toml: [code] sync ({proj}): ") and f"deploy_key -> {secret}" in msg, msg
    assert "[code] follow_links = true" in msg and "alias.py" not in msg
    if git:
        assert f"lib/util.py -> {tmp_path / 'home' / 'lib' / 'util.py'}" in msg and "2 symbolic links" in msg
    assert not (store.root / "objects").exists() and not (store.root / "manifests").exists()

    (proj / "deploy_key").unlink()  # without the links out, the link inside ships its file's content
    if git:
        (proj / "lib").unlink()
    spec, _ = store.snapshot(CodeSpec(sync=str(proj)))
    entries = {en.path: en for en in store.manifest(spec.tree).entries}
    assert entries["conf/alias.py"].sha256 == entries["train.py"].sha256

    (proj / "deploy_key").symlink_to(secret)
    spec, _ = store.snapshot(CodeSpec(sync=str(proj), follow_links=True))
    key = next(en for en in store.manifest(spec.tree).entries if en.path == "deploy_key")
    assert store.read(key.sha256) == secret.read_bytes()


@pytest.mark.parametrize(("extra", "field", "expected"), [
    ('[code]\nsync = "missing-dir"\n', "code.sync", "an existing directory on this machine"),
    ('[code]\nmax_files = 3\n', "code.sync", "a directory to sync"),
    ('workdir = "."\n[code]\nsync = "."\n', "workdir", "no workdir with [code] sync"),
    ('[code]\nsync = "."\nmax_mb = 0\n', "code.max_mb", "an integer of MB"),
    ('[code]\nsync = "."\ncompress = true\n', "code.compress", "one of"),
    ('[code]\nsync = "."\nfollow_links = "yes"\n', "code.follow_links", "true (ship what a symbolic link"),
])
def test_a_bad_code_table_names_the_file_and_field(tmp_path: Path, extra: str, field: str, expected: str) -> None:
    from tui.model.jobspec import JobSpecError, jobspec_from_toml

    path = tmp_path / "job.toml"
    with pytest.raises(JobSpecError) as e:
        jobspec_from_toml('name = "x"\ncommand = ["true"]\n' + extra, path)
    assert e.value.field == field and expected in e.value.expected and str(path) in str(e.value), str(e.value)


def test_a_code_spec_is_anchored_at_the_spec_file_and_survives_the_history(tmp_path: Path) -> None:
    from tui.model.jobspec import JobSpec, jobspec_from_toml

    (tmp_path / "src").mkdir()
    spec = jobspec_from_toml('name = "x"\ncommand = ["true"]\n[code]\nsync = "src"\nmax_files = 7\n'
                             'follow_links = true\n', tmp_path / "job.toml")
    assert spec.code is not None and spec.code.sync == str(tmp_path / "src") and spec.code.max_files == 7
    assert spec.code.follow_links and not jobspec_from_toml(
        'name = "x"\ncommand = ["true"]\n[code]\nsync = "src"\n', tmp_path / "job.toml").code.follow_links  # type: ignore[union-attr]
    assert spec.workdir == str(tmp_path / "src")
    assert JobSpec.from_dict(spec.to_dict()) == spec


def test_the_controllers_store_keeps_the_newest_snapshots_and_their_contents_only(tmp_path: Path) -> None:
    import os

    from tui.model.codesync import CodeSpec, CodeSyncError
    from tui.remote.codesync import CodeStore

    src = tmp_path / "src"
    src.mkdir()
    (src / "same.py").write_text("shared\n")
    store = CodeStore(tmp_path / "code")
    trees = []
    for i in range(4):
        (src / "v.py").write_text(f"version {i}\n")
        code, _ = store.snapshot(CodeSpec(sync=str(src)))
        trees.append(code.tree)
        os.utime(store.root / "manifests" / f"{code.tree}.json", (1000 + i, 1000 + i))
    assert store.prune(keep_newest=2) == 2  # versions 0 and 1 of v.py; same.py stays
    with pytest.raises(CodeSyncError, match="not in this controller's store"):
        store.manifest(trees[0])
    for tree in trees[2:]:
        assert all(store.has(e.sha256) for e in store.manifest(tree).entries)


def test_a_large_snapshot_keeps_its_new_contents_in_one_pack_pruned_when_none_is_used(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A snapshot reading many files keeps its new contents in one pack file with an index (not
    a file each); they read back as they were, through a fresh store too, and are pushed from
    there; a pack goes only when no kept snapshot uses any of its contents."""
    import hashlib
    import os

    from tui.model.codesync import CodeSpec
    from tui.remote import codesync
    from tui.remote.codesync import CodeStore, Payloads

    monkeypatch.setattr(codesync, "PACK_MIN", 4)
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for i in range(6):
        (src / "sub" / f"f{i}.py").write_text(f"content {i}\n" * (i + 1))
    (src / "twin.py").write_text("content 0\n")  # the same content as sub/f0.py: kept once
    old = 1_000_000_000
    for p in [*src.iterdir(), *(src / "sub").iterdir()]:
        os.utime(p, (old, old))  # long before the snapshot: a trusted stat
    store = CodeStore(tmp_path / "code")
    first, done = store.snapshot(CodeSpec(sync=str(src)))
    assert first.tree is not None and done["new_contents"] == 6 and done["files_read"] == 7
    assert not (store.root / "objects").exists()
    packs = sorted(p.name for p in (store.root / "packs").iterdir())
    assert len(packs) == 2 and packs[0].endswith(".json") and packs[1].endswith(".pack")
    again = CodeStore(tmp_path / "code")  # another process: finds them through the index
    for e in again.manifest(first.tree).entries:
        data = again.read(e.sha256)
        assert hashlib.sha256(data).hexdigest() == e.sha256 and len(data) == e.size
        assert (src / e.path).read_bytes() == data
    sizes = again.manifest(first.tree).blobs()
    assert again.missing([[s, n] for s, n in sizes.items()]) == []
    assert again.missing([[next(iter(sizes)), 1]]) == [next(iter(sizes))]  # another size: missing
    assert Payloads(again, sizes).record(next(iter(sizes)), False)[1] == sizes[next(iter(sizes))]
    # A change of one file: its content kept on its own; the pack stays (still used).
    # A file whose content the pack holds is not kept again.
    (src / "sub" / "f5.py").write_text("changed\n")
    (src / "copy.py").write_text("content 3\n" * 4)  # sub/f3.py's content
    for p in (src / "sub" / "f5.py", src / "copy.py"):
        os.utime(p, (old, old))
    second, done = store.snapshot(CodeSpec(sync=str(src)))
    assert done["files_read"] == 2 and done["new_contents"] == 1
    assert len(list((store.root / "objects").glob("*/*"))) == 1
    os.utime(store.root / "manifests" / f"{first.tree}.json", (1000, 1000))
    assert store.prune(keep_newest=1) == 0  # f5's old content lies in a pack still used: it stays
    assert all(store.has(e.sha256) for e in store.manifest(second.tree).entries)
    # Nothing of the pack used any more: it goes whole.
    for p in (src / "sub").iterdir():
        p.write_text(f"other {p.name}\n")
    (src / "twin.py").write_text("other twin\n")
    (src / "copy.py").write_text("other copy\n")
    third, _ = store.snapshot(CodeSpec(sync=str(src)))
    os.utime(store.root / "manifests" / f"{second.tree}.json", (1001, 1001))
    store.prune(keep_newest=1)
    assert all(store.has(e.sha256) for e in store.manifest(third.tree).entries)
    assert len(list((store.root / "packs").glob("*.pack"))) == 1  # the third's own
    assert not store.has(hashlib.sha256(b"content 1\ncontent 1\n").hexdigest())
    assert not CodeStore(tmp_path / "code").has(hashlib.sha256(b"content 1\ncontent 1\n").hexdigest())


def test_a_snapshot_reads_again_only_files_whose_stat_changed(tmp_path: Path) -> None:
    import os

    from tui.model.codesync import CodeSpec
    from tui.remote.codesync import CodeStore

    src = tmp_path / "src"
    src.mkdir()
    old = 1_000_000_000
    for i in range(5):
        (src / f"f{i}.py").write_text(f"v{i}\n")
        os.utime(src / f"f{i}.py", (old, old))  # long before the snapshot: a trusted stat
    store = CodeStore(tmp_path / "code")
    first, done = store.snapshot(CodeSpec(sync=str(src)))
    assert done["files_read"] == 5
    second, done = store.snapshot(CodeSpec(sync=str(src)))
    assert done["files_read"] == 0 and second.tree == first.tree
    (src / "f1.py").write_text("v1 changed, same second as written\n")  # mtime now: read, not cached
    third, done = store.snapshot(CodeSpec(sync=str(src)))
    assert done["files_read"] == 1 and third.tree != first.tree
    fourth, done = store.snapshot(CodeSpec(sync=str(src)))
    assert done["files_read"] == 1 and fourth.tree == third.tree  # too recent to trust: read again
    # Same size, same mtime, another inode (a file replaced by rename): read again.
    (src / "f2.tmp").write_text("v9\n")
    os.utime(src / "f2.tmp", (old, old))
    os.replace(src / "f2.tmp", src / "f2.py")
    fifth, done = store.snapshot(CodeSpec(sync=str(src)))
    assert done["files_read"] == 2
    assert {e.path: e.sha256 for e in store.manifest(fifth.tree).entries}["f2.py"] != \
        {e.path: e.sha256 for e in store.manifest(first.tree).entries}["f2.py"]


def test_packs_keep_only_contents_that_match_and_a_bad_or_cut_pack_keeps_nothing_of_it(tmp_path: Path) -> None:
    """Contents travel to a host in packs (written over SFTP, then taken in by the agent): each
    content is checked against its hash there; a damaged or cut pack keeps nothing of what is
    wrong, and the pack itself is gone either way."""
    import hashlib
    import os
    import random

    from agent import code
    from tui.model.codesync import CodeSpec
    from tui.remote.codesync import CodeStore, Payloads, _packs

    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    files = {"a.py": b"print('a')\n" * 200, "d/noise.bin": random.Random(0).randbytes(300_000),
             "tiny.txt": b"x", "same.txt": b"print('a')\n" * 200}
    for rel, data in files.items():
        (src / rel).write_bytes(data)
    store = CodeStore(tmp_path / "ctl" / "code")
    snap, _ = store.snapshot(CodeSpec(sync=str(src)))
    assert snap.tree is not None
    manifest = store.manifest(snap.tree)
    sizes = manifest.blobs()
    assert len(sizes) == 3  # two files with one content: one content, sent once
    host = str(tmp_path / "host")
    have = code.have(host, snap.tree, [[s, n] for s, n in sorted(sizes.items())])
    incoming = Path(have["incoming"])
    assert incoming.is_dir() and incoming.stat().st_mode & 0o777 == 0o700
    payloads = Payloads(store, sizes)
    raw = list(_packs(payloads, sorted(have["missing"]), lambda: False))
    assert len(raw) == 1 and raw[0][1] == 3 and raw[0][2] == raw[0][3] == sum(sizes.values())
    packs = list(_packs(payloads, sorted(have["missing"]), lambda: True))
    assert len(packs) == 1 and packs[0][1] == 3 and packs[0][2] == sum(sizes.values())
    assert packs[0][3] < packs[0][2]  # the text went compressed, the random bytes as they were
    data = packs[0][0]

    def unpack(raw: bytes) -> dict:
        name = os.urandom(16).hex() + ".pack"
        (incoming / name).write_bytes(raw)
        try:
            return code.unpack(host, name)
        finally:
            assert not (incoming / name).exists()  # removed whatever happened

    # One byte changed in the random content (sent raw, last in the pack: sorted by hash it
    # need not be; find it): refused, not kept; those before it are kept.
    noise_sha = hashlib.sha256(files["d/noise.bin"]).hexdigest()
    at = data.index(files["d/noise.bin"][1000:1100])
    with pytest.raises(code.CodeError, match="do not match its hash"):
        unpack(data[:at] + bytes([data[at] ^ 1]) + data[at + 1:])
    assert not Path(code.object_path(host, noise_sha)).exists()
    assert not list(Path(code.object_path(host, noise_sha)).parent.glob("*.part"))
    # Cut short: an error naming what was cut, nothing of the cut content kept.
    with pytest.raises(code.CodeError, match="ends inside"):
        unpack(data[:at])
    assert not Path(code.object_path(host, noise_sha)).exists()
    with pytest.raises(code.CodeError, match="not a rigdeck pack"):
        unpack(b"PK\x03\x04" + data)
    for bad in ("../x.pack", "a" * 32 + ".json", None):
        with pytest.raises(code.CodeError, match="'pack' must be"):
            code.unpack(host, bad)
    assert unpack(raw[0][0]) == {"stored": 3, "bytes": sum(sizes.values())}
    for sha in sizes:
        os.unlink(code.object_path(host, sha))
    got = unpack(data)
    assert got == {"stored": 3, "bytes": sum(sizes.values())}
    assert code.have(host, snap.tree, [[s, n] for s, n in sizes.items()])["missing"] == []
    made = code.commit(host, snap.tree, manifest.to_wire())
    out = Path(made["path"])
    assert {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()} == files
    # A pack left behind by a sync that broke off goes once it is old.
    left = incoming / ("b" * 32 + ".pack")
    left.write_bytes(data)
    os.utime(left, (1000, 1000))
    code.have(host, "c" * 64, [noise_sha, "d" * 64])
    assert not left.exists()


def test_push_to_a_local_agent_sends_packs_then_only_what_changed(tmp_path: Path) -> None:
    """The whole path on this machine's own agent (local transport: packs written as files)."""
    from tests.kit.local import local_inventory
    from tui.control.hostlinks import HostLinks
    from tui.model.codesync import CodeSpec
    from tui.remote.bundle import build_agent
    from tui.remote.codesync import CodeStore, push

    src = tmp_path / "src"
    src.mkdir()
    for i in range(40):
        (src / f"m{i}.py").write_text(f"value = {i}\n" * 50)
    store = CodeStore(tmp_path / "ctl" / "code")
    bundle = build_agent(tmp_path / "cache")
    state = tmp_path / "state"
    with HostLinks(local_inventory(state), bundle_factory=lambda: bundle) as ctl:
        try:
            snap, _ = store.snapshot(CodeSpec(sync=str(src)))
            assert snap.tree is not None
            seen: list[tuple[int, int]] = []
            first = push(ctl, "here", store, snap.tree, lambda h, d, t: seen.append((d, t)))
            assert not first.had_tree and first.files_sent == 40 and first.bytes_sent == snap.size
            assert seen[-1] == (snap.size, snap.size)
            tree = Path(first.path)
            assert (tree / "m7.py").read_text() == (src / "m7.py").read_text()
            assert not list((state / "code" / "incoming").iterdir())  # every pack taken in
            (src / "m7.py").write_text("value = 'changed'\n")
            snap2, _ = store.snapshot(CodeSpec(sync=str(src)))
            assert snap2.tree is not None
            second = push(ctl, "here", store, snap2.tree)
            assert second.files_sent == 1 and second.bytes_sent == len("value = 'changed'\n")
            assert push(ctl, "here", store, snap2.tree).had_tree
        finally:
            ctl.agent("here").shutdown(force=True)


def test_packs_go_compressed_only_to_a_link_slower_than_compression(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    """The first pack goes as it is; how fast it went decides the next ones: a slow link gets
    compressed packs, a fast one (where zlib would be the slower part) raw ones, and so does a
    slow one while this process was busy (short of CPU, not of link)."""
    from tui.model.codesync import CodeSpec
    from tui.remote import codesync
    from tui.remote.codesync import CodeStore, Payloads, _LinkRate, _packs

    rate = _LinkRate()
    rate.saw(8 << 20, 1.0, 0.05)  # 8 MB/s, this process mostly waiting
    assert rate.slow
    rate.saw(8 << 20, 0.05, 0.02)  # 160 MB/s
    assert not rate.slow
    rate.saw(1000, 10.0)  # a small pack's time is its round trips: no judgement
    assert not rate.slow
    rate.saw(8 << 20, 0.4, 0.2)  # 20 MB/s, but this process at half a core: its CPU is the limit
    assert not rate.slow
    rate.saw(8 << 20, 0.4, 0.04)
    assert rate.slow
    rate.saw(8 << 20, 0.4, 0.2)
    assert not rate.slow

    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"f{i}.py").write_text(f"line {i}\n" * 4000)
    store = CodeStore(tmp_path / "code")
    snap, _ = store.snapshot(CodeSpec(sync=str(src)))
    assert snap.tree is not None
    sizes = store.manifest(snap.tree).blobs()
    monkeypatch.setattr(codesync, "PACK_BYTES", 40_000)  # about one file a pack
    slow = iter([False, True, True, True, True, True])
    packs = list(_packs(Payloads(store, sizes), sorted(sizes), lambda: next(slow)))
    assert sum(p[1] for p in packs) == 6 and sum(p[2] for p in packs) == sum(sizes.values())
    assert packs[0][3] == packs[0][2]  # as it is
    assert all(p[3] < p[2] / 10 for p in packs[1:])  # compressed from the second on
