"""The network-namespace test bed itself: real hosts, real sshd, complete teardown."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import testbed as tb
from tests.testbed import TestBed

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

pytestmark = pytest.mark.testbed

Factory = Callable[..., TestBed]


def ssh(bed: TestBed, i: int, *command: str, timeout: float = 20) -> subprocess.CompletedProcess:
    h = bed.host(i)
    argv = ["ssh", "-F", "/dev/null", "-i", str(bed.user_key), "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={bed.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", f"root@{h.address}", *command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def banner(address: str, timeout: float = 3.0) -> str:
    with socket.create_connection((address, 22), timeout=timeout) as s:
        s.settimeout(timeout)
        data = b""
        while b"\n" not in data:
            chunk = s.recv(256)
            if not chunk:
                break
            data += chunk
    return data.split(b"\n", 1)[0].decode(errors="replace").strip()


def reachable(address: str, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=timeout):
            return True
    except OSError:
        return False


def keyscan(address: str) -> str:
    out = subprocess.run(["ssh-keyscan", "-T", "5", "-t", "ed25519", address],
                         capture_output=True, text=True, timeout=20).stdout
    lines = [line for line in out.splitlines() if line and not line.startswith("#")]
    assert len(lines) == 1, out
    _, ktype, key = lines[0].split()[:3]
    return f"{ktype} {key}"


def netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def link_names() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line}


def processes_mentioning(text: str) -> list[str]:
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) != os.getpid():
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd:
                found.append(f"{p.name}: {cmd}")
    return found


# ------------------------------------------------------------------------------------------


def test_each_host_has_its_own_hostname_and_address(testbed: TestBed) -> None:
    assert testbed.gateway == f"10.213.{testbed.k}.1"
    assert testbed.bridge == f"rdkbr{testbed.k}"
    assert len(testbed.hosts) == 3
    for h in testbed.hosts:
        assert h.name == f"h{h.index}"
        assert h.hostname == f"tb{testbed.k}-h{h.index}"
        assert h.address == f"10.213.{testbed.k}.{10 + h.index}"
        assert h.port == 22 and h.sshd_pid and h.host_key.exists()
        assert testbed.host(h.name) is h and testbed.host(h.index) is h
        r = testbed.exec(h.index, ["hostname"])
        assert r.returncode == 0 and r.stdout.strip() == h.hostname
        r = testbed.exec(h.index, ["ip", "-4", "-o", "addr", "show", "eth0"])
        assert re.findall(r"inet (\S+)", r.stdout) == [f"{h.address}/24"]
    # The root namespace keeps its own hostname.
    assert socket.gethostname() not in {h.hostname for h in testbed.hosts}


def test_sshd_banner_and_real_ssh_login(testbed: TestBed) -> None:
    for h in testbed.hosts:
        assert banner(h.address).startswith("SSH-2.0-OpenSSH")
        r = ssh(testbed, h.index, "hostname; echo $SSH_CONNECTION")
        assert r.returncode == 0, r.stderr
        name, conn = r.stdout.splitlines()
        assert name == h.hostname
        client_ip, _, server_ip, server_port = conn.split()
        assert client_ip == testbed.gateway and server_ip == h.address and server_port == "22"


def test_state_dir_is_private_per_host(testbed: TestBed) -> None:
    h1, h2 = testbed.hosts[0], testbed.hosts[1]
    marker = f"marker-{os.getpid()}-{time.monotonic_ns()}"
    r = ssh(testbed, 1, f"echo hello > ~/.rigdeck/{marker}")
    assert r.returncode == 0, r.stderr
    try:
        assert (h1.state_dir / marker).read_text() == "hello\n"
        assert not (h2.state_dir / marker).exists()
        assert ssh(testbed, 2, f"test ! -e ~/.rigdeck/{marker}").returncode == 0
        assert not Path("/root/.rigdeck", marker).exists()  # nothing leaks to the real /root
        assert testbed.exec(1, ["cat", f"/root/.rigdeck/{marker}"]).stdout == "hello\n"
    finally:
        (h1.state_dir / marker).unlink(missing_ok=True)


def test_each_host_sees_only_its_own_processes(testbed: TestBed) -> None:
    r = testbed.exec(1, ["ps", "-ww", "-eo", "pid,args"])
    assert r.returncode == 0, r.stderr
    assert f"hosts/{testbed.hosts[0].name}/sshd_config" in r.stdout
    assert f"hosts/{testbed.hosts[1].name}/sshd_config" not in r.stdout
    assert "pytest" not in r.stdout


def test_host_to_host_ssh_and_proxy_jump(testbed: TestBed, tmp_path: Path) -> None:
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        "Host *\n"
        f"  IdentityFile {testbed.user_key}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {testbed.known_hosts}\n  StrictHostKeyChecking yes\n"
        "  BatchMode yes\n  User root\n  ConnectTimeout 5\n"
    )
    h1, h2 = testbed.hosts[0], testbed.hosts[1]
    r = subprocess.run(["ssh", "-F", str(cfg), "-J", h1.address, h2.address,
                        "hostname; echo $SSH_CONNECTION"], capture_output=True, text=True,
                       timeout=20, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    name, conn = r.stdout.splitlines()
    assert name == h2.hostname and conn.split()[0] == h1.address


def test_link_down_and_up(testbed: TestBed) -> None:
    h = testbed.hosts[2]
    assert reachable(h.address)
    testbed.link_down(h.index)
    try:
        assert not reachable(h.address, timeout=1.0)
    finally:
        testbed.link_up(h.index)
    deadline = time.monotonic() + 5
    while not reachable(h.address) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert reachable(h.address)
    assert ssh(testbed, h.index, "hostname").stdout.strip() == h.hostname


def test_inventory_file(testbed: TestBed, tmp_path: Path) -> None:
    data = tomllib.loads(testbed.inventory_path.read_text())
    assert data["defaults"] == {
        "user": "root", "port": 22, "identity_file": str(testbed.user_key),
        "known_hosts": str(testbed.known_hosts), "python": "python3",
        "state_dir": "~/.rigdeck", "connect_timeout": 5.0,
    }
    assert data["hosts"] == [{"name": h.name, "address": h.address, "sim_gpus": 4}
                             for h in testbed.hosts]
    p = testbed.write_inventory(tmp_path / "x.toml", hosts=[3, 1], connect_timeout=2.5,
                                python="/usr/bin/python3", verbose=True, retries=2,
                                tags=["a", 'b"c'])
    data = tomllib.loads(p.read_text())
    assert [h["name"] for h in data["hosts"]] == ["h3", "h1"]
    d = data["defaults"]
    assert d["connect_timeout"] == 2.5 and d["python"] == "/usr/bin/python3"
    assert d["verbose"] is True and d["retries"] == 2 and d["tags"] == ["a", 'b"c']
    kh = testbed.known_hosts.read_text().splitlines()
    assert kh == [f"{h.address} {h.public_key}" for h in testbed.hosts]


def test_stop_start_sshd_and_regenerate_host_key(testbed_factory: Factory) -> None:
    bed = testbed_factory(1)
    h = bed.hosts[0]
    old = keyscan(h.address)
    assert old == h.public_key

    # A session survives stopping the listener; new connections are refused until restart.
    session = subprocess.Popen(bed.ssh_argv(1, "echo up; sleep 60"), stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
    try:
        assert session.stdout is not None and session.stdout.readline().strip() == "up"
        bed.stop_sshd(1)
        assert h.sshd_pid is None
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((h.address, 22), timeout=2).close()
        assert session.poll() is None
        assert "sleep 60" in bed.exec(1, ["ps", "-ww", "-eo", "args"]).stdout
        bed.start_sshd(1)
        assert h.sshd_pid and ssh(bed, 1, "hostname").stdout.strip() == h.hostname
    finally:
        session.kill()
        session.wait()

    bed.regenerate_host_key(1)
    new = keyscan(h.address)
    assert new != old and new == h.public_key
    # known_hosts still has the old key: a strict login now refuses the changed key ...
    r = ssh(bed, 1, "hostname")
    assert r.returncode != 0 and "HOST IDENTIFICATION HAS CHANGED" in r.stderr
    # ... until it is refreshed.
    bed.refresh_known_hosts()
    assert ssh(bed, 1, "hostname").stdout.strip() == h.hostname


PEOPLE = ("rdk-alice", "rdk-bob")


def test_people_log_in_as_themselves_only_to_homes_of_their_own(testbed_factory: Factory) -> None:
    bed = testbed_factory(2, people=PEOPLE)
    alice, bob = (bed.person(p) for p in PEOPLE)

    def login(i: int, user: str, key: Path, command: str = "id -un; echo $HOME") -> subprocess.CompletedProcess:
        return subprocess.run(bed.ssh_argv(i, command, user=user, key=key), capture_output=True, text=True,
                              timeout=20, stdin=subprocess.DEVNULL)

    r = login(1, alice.name, alice.key)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [alice.name, str(alice.home)]
    assert login(2, bob.name, bob.key).stdout.split() == [bob.name, str(bob.home)]
    # Each key logs in as its own account and no other; the bed's root key is root's only.
    for user, key in (("root", alice.key), (bob.name, alice.key),
                      (alice.name, bob.key), (alice.name, bed.user_key)):
        r = login(1, user, key)
        assert r.returncode == 255 and "Permission denied" in r.stderr, (user, key, r.stdout, r.stderr)
    assert ssh(bed, 1, "id -un").stdout.strip() == "root"

    # Her ~/.rigdeck and ~/.ssh are hers (0700) and each host's own: h1's is not h2's.
    r = login(1, alice.name, alice.key, "stat -c '%U %a' ~/.rigdeck ~/.ssh; echo mine > ~/.rigdeck/marker")
    assert r.returncode == 0 and r.stdout.splitlines() == [f"{alice.name} 700"] * 2, (r.stdout, r.stderr)
    h1, h2 = bed.hosts
    marker = h1.person_state_dir(alice.name) / "marker"
    assert marker.read_text() == "mine\n" and marker.stat().st_uid == alice.uid
    assert not (h2.person_state_dir(alice.name) / "marker").exists()
    assert login(2, alice.name, alice.key, "test ! -e ~/.rigdeck/marker").returncode == 0
    assert not (alice.home / ".rigdeck" / "marker").exists()  # nothing reaches this machine's home
    # bob cannot read it; both can run the interpreter and the scripts people's jobs use.
    r = login(1, bob.name, bob.key, f"cat {alice.home}/.rigdeck/marker")
    assert r.returncode != 0 and "Permission denied" in r.stderr, r
    (bed.share_dir / "hello.py").write_text("import getpass; print('hello', getpass.getuser())\n")
    r = login(1, bob.name, bob.key, f"{tb.PERSON_PYTHON} {bed.share_dir / 'hello.py'}")
    assert r.returncode == 0 and r.stdout.strip() == f"hello {bob.name}", r
    assert bed.exec_as(2, alice.name, ["id", "-un"]).stdout.strip() == alice.name


def test_down_leaves_nothing_behind(testbed: TestBed) -> None:
    bed = TestBed(2).up()
    try:
        assert bed.k != testbed.k  # two beds at once: own number, own subnet
        assert bed.gateway != testbed.gateway
        k, root = bed.k, bed.root
        names = {h.netns for h in bed.hosts}
        links = {bed.bridge} | {h.veth for h in bed.hosts}
        assert names <= netns_names() and links <= link_names()
        # Sessions, a daemonised orphan and a process started with exec() are all cleaned up.
        assert ssh(bed, 1, "nohup setsid sleep 300 >/dev/null 2>&1 &").returncode == 0
        sess = subprocess.Popen(bed.ssh_argv(2, "sleep 300"), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ex = bed.popen(1, ["sleep", "300"])
        time.sleep(0.5)
        pids = {p for n in names for p in tb._netns_pids(n)}
        assert len(pids) >= 8
    finally:
        bed.down()
    bed.down()  # idempotent
    sess.wait(timeout=10)
    ex.wait(timeout=10)
    assert not names & netns_names()
    assert not links & link_names()
    assert not root.exists()
    assert [p for p in pids if tb._proc_state(p) is not None] == []
    assert processes_mentioning(str(root)) == []
    assert f"10.213.{k}." not in subprocess.run(["ip", "-4", "route"], capture_output=True,
                                                 text=True).stdout
    assert str(root) not in Path("/proc/self/mountinfo").read_text()
    # The shared bed is untouched.
    assert ssh(testbed, 1, "hostname").stdout.strip() == testbed.hosts[0].hostname


def test_cleanup_stale_removes_beds_of_dead_owners(testbed: TestBed) -> None:
    bed = TestBed(1).up()
    try:
        dead = subprocess.Popen(["true"])
        dead.wait()
        (bed.root / "owner.pid").write_text(f"{dead.pid}\n")
        (bed.root / "owner.start").write_text("")
        tb.cleanup_stale()
        assert not bed.root.exists()
        assert bed.hosts[0].netns not in netns_names()
        assert bed.bridge not in link_names()
        assert testbed.root.exists()  # a live owner's bed stays
    finally:
        bed.down()


def test_command_line_up_status_down() -> None:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    cmd = [sys.executable, "-m", "tests.testbed"]
    up = subprocess.run([*cmd, "up", "1", "--sim-gpus", "2"], capture_output=True, text=True,
                        timeout=60, env=env)
    m = re.search(r"test bed (\d+) is up", up.stdout)
    assert up.returncode == 0 and m, up.stdout + up.stderr
    k = m.group(1)
    try:
        assert (tb.BASE_DIR / k / "owner.pid").read_text().strip() == "0"
        inv = tomllib.loads((tb.BASE_DIR / k / "hosts.toml").read_text())
        assert inv["hosts"] == [{"name": "h1", "address": f"10.213.{k}.11", "sim_gpus": 2}]
        login = re.search(r"^\s+(ssh -i .*)$", up.stdout, re.M)
        assert login
        argv = login.group(1).split()
        r = subprocess.run([*argv[:-1], "-F", "/dev/null", "-o", "BatchMode=yes",
                            "-o", "IdentitiesOnly=yes", argv[-1], "hostname"],
                           capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
        assert r.stdout.strip() == f"tb{k}-h1", r.stderr
        tb.cleanup_stale()  # a manual bed is never cleaned automatically
        assert (tb.BASE_DIR / k).exists()
        st = subprocess.run([*cmd, "status"], capture_output=True, text=True, env=env)
        assert f"bed {k}: manual" in st.stdout
    finally:
        down = subprocess.run([*cmd, "down", k], capture_output=True, text=True, timeout=60,
                              env=env)
    assert down.returncode == 0 and f"test bed {k} torn down" in down.stdout
    assert not (tb.BASE_DIR / k).exists()
    assert f"rdk{k}h1" not in netns_names()


def test_atexit_handler_tears_down_unfinished_beds(tmp_path: Path) -> None:
    script = (
        "import os, sys\n"
        "from tests.testbed import TestBed\n"
        "bed = TestBed(1).up()\n"
        "print(bed.root, bed.hosts[0].netns, flush=True)\n"
        "sys.exit(0)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    root, ns = r.stdout.split()
    assert not Path(root).exists() and ns not in netns_names()


def test_signal_killed_owner_is_cleaned_by_the_next_session() -> None:
    script = (
        "import os, time\n"
        "from tests.testbed import TestBed\n"
        "bed = TestBed(1).up()\n"
        "print(bed.root, bed.hosts[0].netns, flush=True)\n"
        "time.sleep(60)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                         env=env)
    assert p.stdout is not None
    root, ns = p.stdout.readline().split()
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert Path(root).exists() and ns in netns_names()
    tb.cleanup_stale()
    assert not Path(root).exists() and ns not in netns_names()


def test_failed_up_raises_and_tears_down_what_it_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tb, "SSHD", "/bin/false")  # "sshd" exits at once
    bed = TestBed(2)
    with pytest.raises(tb.TestBedError, match="exited"):
        bed.up()
    assert bed.k and not bed.root.exists()
    assert not {h.netns for h in bed.hosts} & netns_names()
    assert bed.bridge not in link_names()
    assert processes_mentioning(str(bed.root)) == []
