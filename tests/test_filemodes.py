"""Who may read and change rigdeck's directories and files (agent/filemodes.py): the
controller's home, history and code store are their owner's alone (0700 directories, 0600
files), made so and tightened when an older version left them looser; the agent keeps its GPU
claims and its state only in directories nobody else can swap things in."""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agent import claims, filemodes
from agent.jobs import JobError, Jobs
from agent.paths import Paths
from tests.kit.local import local_cluster, rigdeck_out

OTHER_UID = 12345  # a user that is neither root nor us (the tests run as root)
ROOT = Path(__file__).resolve().parent.parent


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def _not_private(top: Path) -> list[str]:
    """Every directory under ``top`` (itself too) that is not 0700 and file that is not 0600."""
    bad = [] if _mode(top) == 0o700 else [f"{top} {_mode(top):o}"]
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames:
            p = Path(dirpath, name)
            bad += [] if _mode(p) == 0o700 else [f"{p} {_mode(p):o}"]
        for name in filenames:
            p = Path(dirpath, name)
            bad += [] if _mode(p) == 0o600 else [f"{p} {_mode(p):o}"]
    return bad


def _stop_daemon(state: Path) -> None:
    """End the agent daemon this test's launch started (its pid file says which)."""
    try:
        pid = int((state / "run" / "daemon.pid").read_text())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


# -- the controller's side --------------------------------------------------------------------


def test_a_launch_on_this_machine_leaves_everything_in_rigdeck_home_its_owners_alone(tmp_path: Path) -> None:
    """The embedded controller (no server): a job with synced code, launched and waited for,
    in a home an older version left 0755."""
    env = local_cluster(tmp_path)
    home = Path(env["RIGDECK_HOME"])
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "m.py").write_text("VALUE = 7\n")
    (src / "main.py").write_text("from pkg.m import VALUE\nprint('value', VALUE)\n")
    spec = tmp_path / "job.toml"
    spec.write_text('name = "private"\ncommand = ["{python}", "main.py"]\nlauncher = "direct"\n'
                    'nodes = 1\nprocesses_per_node = 1\n[code]\nsync = "src"\n')
    try:
        out = rigdeck_out(env, "launch", str(spec), "--wait")
    finally:
        _stop_daemon(tmp_path / "state")
    assert "succeeded" in out, out
    assert (home / "history.sqlite").is_file() and list((home / "code" / "manifests").iterdir())
    assert _not_private(home) == []


def test_the_history_and_its_wal_files_are_made_and_tightened_owner_only(tmp_path: Path) -> None:
    from tui.control.history import History

    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, 0o755)
    db = home / "history.sqlite"
    old = sqlite3.connect(db)  # as an older version made it: the umask's 0644
    old.execute("CREATE TABLE t (x)")
    old.close()
    os.chmod(db, 0o644)
    first = History(db)
    try:
        first.create("j1", "a", {})
        assert {p.name: _mode(p) for p in home.iterdir()} == {
            "history.sqlite": 0o600, "history.sqlite-wal": 0o600, "history.sqlite-shm": 0o600}
        # A -wal left looser while the file is open (an older version's) is tightened by the next opener.
        os.chmod(f"{db}-wal", 0o644)
        History(db).close()
        assert _mode(Path(f"{db}-wal")) == 0o600
    finally:
        first.close()
    new = tmp_path / "fresh" / "h.sqlite"
    History(new).close()
    assert _mode(new) == 0o600


def test_rigdeck_home_is_made_or_tightened_private_and_refused_when_shared_or_someone_elses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tui.control.history import rigdeck_home

    monkeypatch.setenv("RIGDECK_HOME", str(tmp_path / "new" / "home"))
    assert _mode(rigdeck_home()) == 0o700
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o775)
    monkeypatch.setenv("RIGDECK_HOME", str(loose))
    assert rigdeck_home() == loose and _mode(loose) == 0o700

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    monkeypatch.setenv("RIGDECK_HOME", str(shared))
    with pytest.raises(filemodes.UnsafeDirError, match=rf"RIGDECK_HOME {shared} is a shared directory \(mode 1777"):
        rigdeck_home()
    assert _mode(shared) == 0o1777  # left as it was: others use it

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, OTHER_UID, OTHER_UID)
    monkeypatch.setenv("RIGDECK_HOME", str(theirs))
    with pytest.raises(filemodes.UnsafeDirError, match=rf"RIGDECK_HOME {theirs} belongs to uid {OTHER_UID}"):
        rigdeck_home()


def test_the_code_store_keeps_contents_private_and_tightens_a_store_made_before(tmp_path: Path) -> None:
    from tui.model.codesync import CodeSpec
    from tui.remote.codesync import PACK_MIN, CodeStore

    src = tmp_path / "src"
    src.mkdir()
    (src / "one.py").write_text("one\n")
    root = tmp_path / "code"
    # A store as an older version left it: the umask's modes.
    (root / "objects" / "ab").mkdir(parents=True)
    (root / "objects" / "ab" / ("ab" * 32)).write_text("old\n")
    for p in (root, root / "objects", root / "objects" / "ab"):
        os.chmod(p, 0o755)
    os.chmod(root / "objects" / "ab" / ("ab" * 32), 0o644)
    store = CodeStore(root)
    assert _not_private(root) == []
    store.snapshot(CodeSpec(sync=str(src)))  # one new content: a file of its own
    for i in range(PACK_MIN):
        (src / f"m{i}.py").write_text(f"m = {i}\n")
    store.snapshot(CodeSpec(sync=str(src)))  # many: one pack and its index
    assert list((root / "packs").glob("*.pack")) and (root / "statcache.json").is_file()
    assert _not_private(root) == []
    # A server's store, filled by a workstation: what a host keeps 0444 is its owner's here.
    served = CodeStore(tmp_path / "server" / "code")
    data = b"sent by a workstation\n"
    sha = hashlib.sha256(data).hexdigest()
    served.put([[sha, "raw", base64.b64encode(data).decode(), 0, True]])
    assert served.read(sha) == data and _mode(served.object_path(sha)) == 0o400
    assert [d for d in (served.root, served.root / "objects", served.object_path(sha).parent)
            if _mode(d) != 0o700] == []


# -- the agent's side -------------------------------------------------------------------------


def _untrusted(tmp_path: Path, how: str) -> Path:
    """A directory the agent must not use: another user's, or writable by others without the
    sticky bit."""
    d = tmp_path / how
    d.mkdir()
    if how == "theirs":
        os.chown(d, OTHER_UID, OTHER_UID)
        os.chmod(d, 0o1777)  # sticky, yet its owner may remove anyone's locks
    else:
        os.chmod(d, {"world-writable": 0o777, "group-writable": 0o770}[how])
    return d


UNTRUSTED = [("theirs", rf"it belongs to uid {OTHER_UID}, another user \(root expected\)"),
             ("world-writable", r"its group and everyone may write to it \(mode 777\) without the sticky bit"),
             ("group-writable", r"its group may write to it \(mode 770\) without the sticky bit")]


@pytest.mark.parametrize(("how", "why"), UNTRUSTED)
def test_a_claim_directory_not_to_trust_is_refused_and_left_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str, why: str) -> None:
    d = _untrusted(tmp_path, how)
    with pytest.raises(claims.ClaimError, match=rf"GPU claim directory {d} is not safe to use: {why}"):
        claims.claim([0], "j1", str(d))
    with pytest.raises(claims.ClaimError, match=why):
        claims.held(str(d))
    assert claims.join([0], str(d)) == []
    assert list(d.iterdir()) == []  # no lock file, not even the mutex, was made there
    # Through the daemon's Jobs: the check says why, and the claim is refused.
    monkeypatch.setenv("RIGDECK_CLAIM_DIR", str(d))
    jobs = Jobs(str(tmp_path / "state"), ["agent"])
    problems = jobs.check("j1", [0], 0)["problems"]
    assert len(problems) == 1 and f"GPU claim directory {d} is not safe to use" in problems[0], problems
    with pytest.raises(JobError, match=why):
        jobs.claim("j1", [0])


def test_a_claim_directory_root_or_we_own_sticky_or_private_is_used(tmp_path: Path) -> None:
    for mode in (0o1777, 0o1770, 0o755):
        d = tmp_path / f"claims-{mode:o}"
        d.mkdir()
        os.chmod(d, mode)
        fds = claims.claim([0], "j1", str(d))
        try:
            assert claims.held(str(d))[0]["job_id"] == "j1"
        finally:
            for fd in fds:
                os.close(fd)
    made = tmp_path / "made"
    for fd in claims.claim([1], "j2", str(made)):
        os.close(fd)
    assert _mode(made) == 0o1777


NOBODY = "nobody"  # Debian's unprivileged account: another person's agent in these tests
_AS_NOBODY_CLAIM = """
import sys
from agent import claims
try:
    fds = claims.claim([int(g) for g in sys.argv[2].split(",")], sys.argv[1])
except claims.ClaimError as e:
    print("refused:", e, flush=True)
    sys.exit(3)
print("claimed", flush=True)
sys.stdin.read()  # holds the claim until the test closes stdin
"""


def _as_nobody(job_id: str, gpus: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """An agent's claim made as another account (``nobody``, the system's Python: it cannot enter
    /root), held until its stdin closes."""
    require_nobody = subprocess.run(["id", "-u", NOBODY], capture_output=True, text=True)
    assert require_nobody.returncode == 0, f"no {NOBODY} account: {require_nobody.stderr}"
    return subprocess.Popen(["setpriv", "--reuid", NOBODY, "--regid", "nogroup", "--clear-groups", "--",
                             "/usr/bin/python3", "-I", "-c", "import sys; sys.path.insert(0, sys.argv.pop(1)); "
                             "exec(sys.argv.pop(1))", str(ROOT), _AS_NOBODY_CLAIM, job_id, gpus],
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd="/")


def test_one_claim_directory_across_accounts_its_named_owner_makes_and_all_trust(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two accounts' agents on a host share one claim directory: with an owner named
    (claim_dir_owner), only that account or root makes it; every agent trusts it; a GPU one
    account claims is refused to the other, naming the job and the user."""
    import pwd
    import shutil
    import tempfile

    monkeypatch.delenv("RIGDECK_CLAIM_DIR_OWNER", raising=False)
    base = Path(tempfile.mkdtemp(prefix="rdk-claims-", dir="/dev/shm"))  # outside /root's 0700 tmp
    os.chmod(base, 0o1777)  # as /dev/shm: any account may make the claim directory in it
    d = base / "claims"
    env = {"PATH": "/usr/bin:/bin", "RIGDECK_CLAIM_DIR": str(d), "RIGDECK_CLAIM_DIR_OWNER": "root"}
    try:
        # nobody's agent, root named as the owner: it makes no directory of its own, and says how.
        p = _as_nobody("theirs", "0", env)
        out, err = p.communicate("", timeout=30)
        assert p.returncode == 3, (out, err)
        assert f"GPU claim directory {d} does not exist" in out and "its owner is to be root" in out, out
        assert f"install -d -m 1777 -o root -g root {d}" in out, out
        assert not d.exists()
        # Named as the owner itself, nobody's agent makes it (1777, its own) and claims GPU 1.
        p = _as_nobody("theirs", "1", {**env, "RIGDECK_CLAIM_DIR_OWNER": NOBODY})
        try:
            assert p.stdout is not None and p.stdout.readline().strip() == "claimed", p.communicate("", timeout=30)
            assert d.stat().st_uid == pwd.getpwnam(NOBODY).pw_uid and _mode(d) == 0o1777
            # An agent of another account (root here) that names no owner refuses it, saying both fixes.
            with pytest.raises(claims.ClaimError) as e:
                claims.claim([0], "mine", str(d))
            said = str(e.value)
            assert f"it belongs to {NOBODY} (uid " in said and "another user (root expected)" in said, said
            assert f"install -d -m 1777 -o root -g root {d}" in said, said
            assert f'claim_dir_owner = "{NOBODY}"' in said, said
            # Naming the owner, it trusts the directory: sees nobody's claim, and is refused that GPU.
            monkeypatch.setenv("RIGDECK_CLAIM_DIR_OWNER", NOBODY)
            held = claims.held(str(d))
            assert held is not None and held[1]["job_id"] == "theirs" and held[1]["user"] == NOBODY, held
            with pytest.raises(claims.ClaimError, match=rf"GPU 1 on .* is held by job theirs \(user {NOBODY}, pid"):
                claims.claim([0, 1], "mine", str(d))
            fds = claims.claim([0, 2], "mine", str(d))
        finally:
            p.communicate("", timeout=30)
        try:
            # ... and nobody's agent, in turn, sees root's GPUs as taken and is refused them.
            p = _as_nobody("theirs-2", "2", {**env, "RIGDECK_CLAIM_DIR_OWNER": NOBODY})
            out, err = p.communicate("", timeout=30)
            assert p.returncode == 3 and "GPU 2 on" in out and "held by job mine (user root" in out, (out, err)
            assert sorted(claims.held(str(d)) or {}) == [0, 2]  # nobody's GPU 1 went with its process
        finally:
            for fd in fds:
                os.close(fd)
        monkeypatch.setenv("RIGDECK_CLAIM_DIR_OWNER", "no-such-account-rdk")
        with pytest.raises(claims.ClaimError, match="claim_dir_owner 'no-such-account-rdk' .* is no account on"):
            claims.claim([0], "mine", str(d))
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize(("how", "why"), UNTRUSTED)
def test_an_agent_state_dir_not_to_trust_is_refused_before_a_daemon_uses_it(
        tmp_path: Path, how: str, why: str) -> None:
    d = _untrusted(tmp_path, how)
    with pytest.raises(filemodes.UnsafeDirError, match=rf"agent state directory {d} is not safe to use: {why}"):
        Paths(str(d)).ensure()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for command in ("attach", "daemon"):
        res = subprocess.run([sys.executable, "-m", "agent", command, "--state-dir", str(d)], env=env,
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        assert res.returncode == 1, (command, res.stdout, res.stderr)
        assert f"rigdeck agent: agent state directory {d} is not safe to use" in res.stderr, res.stderr
    assert list(d.iterdir()) == []  # no run directory, socket, log or daemon


def test_an_agent_state_dir_of_root_or_ours_is_used(tmp_path: Path) -> None:
    for name, mode in (("private", 0o700), ("readable", 0o755), ("sticky", 0o1777)):
        d = tmp_path / name
        d.mkdir()
        os.chmod(d, mode)
        Paths(str(d)).ensure()
        assert _mode(d / "run") == 0o700
