"""A multi-host SSH test bed on one machine: real sshd servers in network namespaces.

Each test host gets

* its own network namespace ``rdk<K>h<i>`` with ``eth0`` (a veth pair into the bridge
  ``rdkbr<K>`` in the root namespace) and the address ``10.213.<K>.<10+i>/24``; the bridge
  holds ``10.213.<K>.1`` (the controller's address);
* its own UTS namespace (hostname ``tb<K>-h<i>``), mount namespace (the real directory
  ``<root>/hosts/h<i>/state`` is bind-mounted over ``/root/.rigdeck`` and
  ``<root>/hosts/h<i>/dotssh`` over ``/root/.ssh``, propagation private)
  and PID namespace (a tiny init that reaps orphans; ``ps`` on a host shows only that host's
  processes, and killing the init takes every process of the host with it);
* a real OpenSSH ``sshd`` with its own ed25519 host key, listening on ``<address>:22`` only.

One user key pair (``<root>/id_ed25519``) is authorised for root on every host
(``<root>/authorized_keys.d/root``: every sshd reads ``authorized_keys.d/<the account>``, so a
key there logs in as that account only), and ``<root>/known_hosts`` lists every host key. Each
host's sshd also reads that host's own ``~/.ssh/authorized_keys`` (empty at first), so a key
installed on one host is authorised there only; this machine's own ``/root/.ssh`` is never read
or written (it is only created, empty, as a mount point when it does not exist).

**People** (``TestBed(n, people=("rdk-alice", "rdk-bob"))``, ``up N --people rdk-alice,rdk-bob``)
are real Unix accounts of this machine, made with ``useradd`` when missing (a home under /home,
a shell, no password: key logins only). The bed never removes them: the names are fixed, other
beds (parallel test sessions) use the same accounts, and an account costs nothing idle; remove
one by hand with ``userdel -r NAME`` when no bed is up. Each person gets a key pair of the bed's
(``<root>/people/<name>/id_ed25519``, ``TestBed.person_key``) authorised for their account only,
and on every host a private ``~/.rigdeck`` and ``~/.ssh`` of their own (``<root>/hosts/h<i>/people/
<name>/{state,dotssh}``, theirs, 0700, bind-mounted as root's are). Their agents and jobs cannot
run root's interpreters (``/root`` is 0700): they use the system's ``/usr/bin/python3``
(``PERSON_PYTHON``), and scripts for them go under ``<root>/share`` (``TestBed.share_dir``,
readable by all). ``<root>`` is ``/run/rigdeck-testbed/<K>``; the
instance number K (1..200) is allocated with an atomic ``mkdir`` so that several test beds
can exist at once. The test bed only ever contacts addresses inside namespaces it made.

Command line::

    python -m tests.testbed up N [--sim-gpus K] [--people A,B]   # a bed that outlives the command
    python -m tests.testbed status
    python -m tests.testbed down [--all] [K ...]

Needs root, iproute2, util-linux (unshare, nsenter, mount) and openssh-server.
"""

from __future__ import annotations

import argparse
import atexit
import ipaddress
import json
import logging
import os
import pwd
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

log = logging.getLogger("rigdeck.testbed")

BASE_DIR = Path("/run/rigdeck-testbed")
SUBNET_PREFIX = "10.213"
MAX_K = 200
MAX_HOSTS = 244  # host addresses .11 .. .254
SSHD = "/usr/sbin/sshd"
MOUNTPOINT = "/root/.rigdeck"
# A directory of this machine (the workstation) that the hosts do not see: each host has an empty
# tmpfs of its own over it. Code that exists only on the workstation lives here in tests.
WORKSTATION_ONLY = "/run/rigdeck-workstation"
SSH_MOUNTPOINT = "/root/.ssh"
# What people's agents and jobs run: root's interpreters (pyenv's, the venv's) are under /root,
# which other accounts cannot enter.
PERSON_PYTHON = "/usr/bin/python3"
_PERSON_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,30}$")
START_TIMEOUT = 10.0
_CREATING_GRACE_S = 60.0  # a bed dir without owner.pid younger than this is still being made

_NETNS_RE = re.compile(r"^rdk(\d+)h(\d+)$")
_VETH_RE = re.compile(r"^rdk(\d+)v(\d+)$")
_BRIDGE_RE = re.compile(r"^rdkbr(\d+)$")
_PROBE_RE = re.compile(r"^rdkprobe(\d+)$")

# The init of each host's PID namespace: reaps orphans, exits on SIGTERM (which makes the
# kernel kill every other process of that namespace).
_INIT_SCRIPT = r"""
# PID 1 of a rigdeck test bed host: reaps orphans; SIGTERM ends the host.
import os, signal, sys
signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
sys.stdout.write("READY\n"); sys.stdout.flush()
os.dup2(os.open(os.devnull, os.O_RDWR), 1)
while True:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
    signal.sigtimedwait([signal.SIGCHLD], 5.0)
"""

# Run inside the fresh namespaces (as PID 1, before it execs the init).
_HOLDER_SH = (
    'echo "$1" > /proc/sys/kernel/hostname && '
    'mount --bind "$2" "$3" && '
    'mount --bind "$7" "$8" && '  # each host's own ~/.ssh
    'mount -t tmpfs -o size=256m,mode=1777 rdk-shm /dev/shm && '  # each host's own (GPU claims live there)
    'mount -t tmpfs -o size=1m,mode=0755 rdk-ws ' + WORKSTATION_ONLY + ' && '  # the workstation's files, hidden
    '{ [ -z "$6" ] || mount --bind "$6" /etc/passwd; } && '  # a host whose root logs in to another shell
    # The machine's cgroup hierarchies, as a real host has them (`ip netns exec` mounted a sysfs
    # of the netns over /sys, without them): a container runtime needs them. Best effort.
    '{ [ -z "$RDK_CGROUPS" ] || printf "%s\\n" "$RDK_CGROUPS" | while read -r t o d; do '
    'mkdir -p "$d" && mount -t "$t" -o "$o" "rdk-$t" "$d" || exit 1; done || echo "cgroups not mounted" >&2; } && '
    'py="$4" init="$5" name="$1" && shift 8 && '
    'while [ "$#" -ge 2 ]; do mount --bind "$1" "$2" || exit 1; shift 2; done && '  # people's dirs
    'exec "$py" -I -S "$init" "$name"'
)


class TestBedError(RuntimeError):
    """The test bed could not be built (what was made has been torn down)."""

    __test__ = False


@dataclass
class TestHost:
    __test__ = False

    index: int  # 1-based
    name: str  # "h1", "h2", ... (inventory name)
    hostname: str  # "tb<K>-h<i>" (the UTS hostname)
    address: str  # "10.213.K.(10+i)"
    netns: str
    port: int  # 22
    host_key: Path  # private host key file
    host_dir: Path  # <root>/hosts/h<i>
    state_dir: Path  # real path of the host's private state dir (/root/.rigdeck inside)
    sshd_pid: int | None  # pid (root namespace) of the listening sshd
    sim_gpus: int = 0
    init_pid: int | None = None  # pid (root namespace) of the host's PID-namespace init
    veth: str = ""  # root-side veth end
    _holder: subprocess.Popen | None = field(default=None, repr=False, compare=False)
    _sshd_proc: subprocess.Popen | None = field(default=None, repr=False, compare=False)

    @property
    def sshd_config(self) -> Path:
        return self.host_dir / "sshd_config"

    @property
    def sshd_log(self) -> Path:
        return self.host_dir / "sshd.log"

    @property
    def dot_ssh(self) -> Path:
        """Real path of the host's own ~/.ssh (/root/.ssh inside)."""
        return self.host_dir / "dotssh"

    @property
    def public_key(self) -> str:
        """The host's public key, "ssh-ed25519 AAAA..." (no comment)."""
        parts = Path(str(self.host_key) + ".pub").read_text().split()
        return f"{parts[0]} {parts[1]}"

    def person_dir(self, person: str) -> Path:
        """Real path of a person's own dirs on this host: ``state`` (their ``~/.rigdeck`` inside)
        and ``dotssh`` (their ``~/.ssh``)."""
        return self.host_dir / "people" / person

    def person_state_dir(self, person: str) -> Path:
        return self.person_dir(person) / "state"


@dataclass(frozen=True)
class Person:
    """A real Unix account of this machine that the bed's hosts know (see the module)."""

    __test__ = False

    name: str
    uid: int
    gid: int
    home: Path
    key: Path  # private key, authorised for this account only


HostRef = int | str | TestHost  # a host: 1-based index, name/hostname/address, or itself

# --------------------------------------------------------------------------------------------
# small helpers


def _cgroup_mounts(mountinfo: str = "/proc/self/mountinfo") -> str:
    """This machine's mounts at and under /sys/fs/cgroup (tmpfs, cgroup, cgroup2) as lines of
    ``fstype options mountpoint``, in mount order: a bed host mounts the same hierarchies."""
    lines = []
    try:
        text = Path(mountinfo).read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        point, fstype, options = fields[4], tail[0], tail[2]
        under = point == "/sys/fs/cgroup" or point.startswith("/sys/fs/cgroup/")
        if fstype in ("tmpfs", "cgroup", "cgroup2") and under:
            lines.append(f"{fstype} {options} {point}")
    return "\n".join(lines)


def _run(argv: Sequence[str], check: bool = True, timeout: float = 30.0, **kw: Any):
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("stdin", subprocess.DEVNULL)
    try:
        cp = subprocess.run(list(argv), timeout=timeout, **kw)
    except (OSError, subprocess.TimeoutExpired) as e:
        if check:
            raise TestBedError(f"{' '.join(argv)}: {e}") from e
        return subprocess.CompletedProcess(list(argv), 255, "", str(e))
    if check and cp.returncode != 0:
        err = (cp.stderr or "").strip()
        raise TestBedError(f"{' '.join(argv)} failed ({cp.returncode}): {err}")
    return cp


def _quiet(argv: Sequence[str], what: str = "") -> bool:
    """Run a teardown step; log a warning instead of raising."""
    cp = _run(argv, check=False)
    if cp.returncode != 0:
        log.warning("testbed: %s: %s", what or " ".join(argv), (cp.stderr or "").strip())
        return False
    return True


def _netns_list() -> list[str]:
    cp = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in (cp.stdout or "").splitlines() if line.strip()]


def _link_names() -> list[str]:
    cp = _run(["ip", "-o", "link", "show"], check=False)
    names = []
    for line in (cp.stdout or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@", 1)[0])
    return names


def _netns_pids(ns: str) -> list[int]:
    cp = _run(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in (cp.stdout or "").split() if x.isdigit()]


def _proc_start(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22: starttime


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _alive(pid: int) -> bool:
    st = _proc_state(pid)
    return st is not None and st not in ("Z", "X")


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pass
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if int(p.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(p.name))
            except (OSError, ValueError, IndexError):
                pass
    return out


def _exe(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _ns_depth(pid: int) -> int:
    """How many PID namespaces deep pid is (0 when gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return len(line.split()) - 1
    except OSError:
        pass
    return 0


def _ns_local_pid(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError):
        pass
    return None


def _signal_until_gone(pids_fn: Any, term_wait: float, kill_wait: float) -> list[int]:
    """SIGTERM pids_fn()'s processes, wait, then SIGKILL what is left; return what survives."""
    for sig, wait in ((signal.SIGTERM, term_wait), (signal.SIGKILL, kill_wait)):
        pids = pids_fn()
        if not pids:
            return []
        for p in pids:
            _signal(p, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            time.sleep(0.02)
            if not pids_fn():
                return []
    return pids_fn()


def _kill_netns(ns: str, term_wait: float = 2.0) -> None:
    """End every process in a network namespace: SIGTERM, then SIGKILL.

    First the processes inside the host's PID namespace other than its init (their parents,
    sshd, the init or an nsenter, reap them at once), then the rest: the init (the kernel
    kills whatever is still in its namespace), the unshare holding it and any nsenter.
    Killing the init first would leave the kernel waiting for processes whose parent lives
    outside the namespace (an nsenter) to be reaped by PID 1.
    """
    own = _ns_depth(os.getpid())

    def inner() -> list[int]:
        return [p for p in _netns_pids(ns) if _ns_depth(p) > own and _ns_local_pid(p) != 1]

    _signal_until_gone(inner, term_wait, 2.0)
    left = _signal_until_gone(lambda: _netns_pids(ns), term_wait, 3.0)
    if left:
        log.warning("testbed: processes left in %s: %s", ns, left)


def _reap(proc: subprocess.Popen | None, timeout: float = 3.0) -> None:
    if proc is None:
        return
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log.warning("testbed: pid %d did not exit", proc.pid)


def _wait_port(address: str, port: int, timeout: float, proc: subprocess.Popen | None = None,
               logfile: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = ""
            if logfile is not None:
                try:
                    tail = logfile.read_text()[-2000:]
                except OSError:
                    pass
            raise TestBedError(f"sshd for {address} exited ({proc.returncode}): {tail.strip()}")
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return
        except OSError as e:
            last = e
            time.sleep(0.05)
    raise TestBedError(f"{address}:{port} did not accept connections within {timeout}s: {last}")


def _keygen(path: Path, comment: str) -> None:
    for p in (path, Path(str(path) + ".pub")):
        try:
            p.unlink()
        except FileNotFoundError:
            pass
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    os.chown(path, uid, gid)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


# The people the suite's beds use (tests/conftest.py makes their accounts before any bed starts).
PEOPLE = ("rdk-alice", "rdk-bob")


def ensure_account(name: str) -> pwd.struct_passwd:
    """The Unix account ``name`` of this machine, made when missing (idempotent, and safe when
    another bed makes it at the same moment): a home under /home, ``/bin/sh``, and ``*`` as its
    password (no password logs in; a ``!`` would mark it locked, which sshd refuses even for a
    key). Its ``~/.rigdeck`` and ``~/.ssh`` exist (the hosts' mount points), its own, 0700."""
    if not _PERSON_RE.match(name):
        raise TestBedError(f"person {name!r}: expected a lowercase account name (letters, digits, '-', '_')")
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        cp = _run(["useradd", "--create-home", "--user-group", "--shell", "/bin/sh", name], check=False)
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            raise TestBedError(f"useradd {name} failed ({cp.returncode}): {(cp.stderr or '').strip()}") from None
    shadow = _run(["getent", "shadow", name], check=False).stdout or ""
    if shadow.split(":")[1:2] != ["*"]:
        _run(["usermod", "-p", "*", name])
    home = Path(pw.pw_dir)
    if not home.is_dir():
        raise TestBedError(f"account {name} has no home directory {home}")
    for sub in (".rigdeck", ".ssh"):
        d = home / sub
        d.mkdir(mode=0o700, exist_ok=True)
        os.chown(d, pw.pw_uid, pw.pw_gid)
        os.chmod(d, 0o700)
    return pw


def _bed_dir(k: int) -> Path:
    return BASE_DIR / str(k)


def _owner_status(d: Path) -> str:
    """'manual', 'live', 'dead' or 'creating'."""
    try:
        text = (d / "owner.pid").read_text().strip()
    except FileNotFoundError:
        try:
            age = time.time() - d.stat().st_mtime
        except OSError:
            return "dead"
        return "creating" if age < _CREATING_GRACE_S else "dead"
    except OSError:
        return "dead"
    try:
        pid = int(text.split()[0])
    except (ValueError, IndexError):
        return "dead"
    if pid == 0:
        return "manual"
    if not _alive(pid):
        return "dead"
    try:
        start = (d / "owner.start").read_text().strip()
    except OSError:
        start = ""
    if start and _proc_start(pid) != start:
        return "dead"  # the pid was reused
    return "live"


def _read_state(d: Path) -> dict:
    try:
        return json.loads((d / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def _remove_iptables(rule: list[str] | None) -> None:
    if rule and shutil.which("iptables"):
        for _ in range(5):  # in case it was inserted more than once
            if _run(["iptables", "-D", *rule], check=False).returncode != 0:
                break


def _unmount_under(root: Path) -> None:
    """Lazily unmount anything (in this mount namespace) below root; there should be nothing."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    prefix = str(root).rstrip("/") + "/"
    points = []
    for line in lines:
        parts = line.split()
        if len(parts) > 4:
            mp = parts[4].replace("\\040", " ")
            if mp == str(root) or mp.startswith(prefix):
                points.append(mp)
    for mp in sorted(points, key=len, reverse=True):
        _quiet(["umount", "-l", mp], f"umount {mp}")


def _teardown_k(k: int, netns: Iterable[str] = (), veths: Iterable[str] = (),
                iptables_rule: list[str] | None = None, remove_dir: bool = True) -> None:
    """Remove everything of instance K that still exists. Never raises."""
    try:
        present_ns = set(_netns_list())
        ns_all = {n for n in present_ns if (m := _NETNS_RE.match(n)) and int(m.group(1)) == k}
        ns_all |= {n for n in netns if n in present_ns}
        for ns in sorted(ns_all):
            _kill_netns(ns)
        links = set(_link_names())
        v_all = {v for v in links if (m := _VETH_RE.match(v)) and int(m.group(1)) == k}
        v_all |= {v for v in veths if v in links}
        for v in sorted(v_all):
            _quiet(["ip", "link", "del", v], f"delete veth {v}")
        for ns in sorted(ns_all):
            _quiet(["ip", "netns", "del", ns], f"delete netns {ns}")
        if f"rdkbr{k}" in set(_link_names()):
            _quiet(["ip", "link", "del", f"rdkbr{k}"], f"delete bridge rdkbr{k}")
        _remove_iptables(iptables_rule)
        d = _bed_dir(k)
        if remove_dir and d.exists():
            _unmount_under(d)
            shutil.rmtree(d, ignore_errors=True)
            if d.exists():
                log.warning("testbed: could not remove %s", d)
    except Exception as e:  # teardown must never raise
        log.warning("testbed: teardown of instance %d: %s", k, e)


def _subnet_in_use(k: int) -> str:
    """A route or address of this machine at least as specific as 10.213.K.0/24 that overlaps it."""
    net = ipaddress.ip_network(f"{SUBNET_PREFIX}.{k}.0/24")
    routes = (_run(["ip", "-4", "route", "show", "table", "all"], check=False).stdout or "")
    addrs = (_run(["ip", "-4", "-o", "addr", "show"], check=False).stdout or "")
    kinds = ("unicast", "local", "broadcast", "multicast", "unreachable", "blackhole",
             "prohibit", "throw", "nat", "anycast")
    cands = []
    for line in routes.splitlines():
        words = line.split()
        if words and words[0] in kinds:
            words = words[1:]
        if words:
            cands.append(words[0])
    cands += [w for line in addrs.splitlines() for i, w in enumerate(line.split())
              if i > 0 and line.split()[i - 1] == "inet"]
    for c in cands:
        if c == "default":
            continue
        try:
            other = ipaddress.ip_network(c, strict=False)
        except ValueError:
            continue
        if other.prefixlen >= 24 and other.overlaps(net):
            return c
    return ""


# --------------------------------------------------------------------------------------------
# availability and stale cleanup


def available() -> tuple[bool, str]:
    """(True, "") when this machine can run the test bed, else (False, reason)."""
    if sys.platform != "linux":
        return False, f"needs Linux network namespaces (this is {sys.platform})"
    if os.geteuid() != 0:
        return False, "not root (the test bed needs root for network namespaces)"
    if not shutil.which("ip"):
        return False, "ip not found: apt-get install iproute2"
    for tool in ("unshare", "nsenter", "mount"):
        if not shutil.which(tool):
            return False, f"{tool} not found: apt-get install util-linux mount"
    if not os.access(SSHD, os.X_OK):
        return False, f"sshd not found at {SSHD}: apt-get install openssh-server"
    for tool in ("ssh-keygen", "ssh"):
        if not shutil.which(tool):
            return False, f"{tool} not found: apt-get install openssh-client"
    probe = f"rdkprobe{os.getpid()}"
    cp = _run(["ip", "netns", "add", probe], check=False)
    if cp.returncode != 0:
        return False, f"cannot create a network namespace: {(cp.stderr or '').strip()}"
    cp = _run(["ip", "netns", "del", probe], check=False)
    if cp.returncode != 0:
        return False, f"cannot delete a network namespace: {(cp.stderr or '').strip()}"
    return True, ""


def _claim_and_reap(d: Path) -> bool:
    """Tear down bed dir d unless its owner lives or another process is already at it."""
    lock = d / "reap.lock"
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except OSError:
        return False
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    if _owner_status(d) not in ("dead",):
        lock.unlink(missing_ok=True)
        return False
    st = _read_state(d)
    k = int(d.name)
    log.info("testbed: removing stale test bed %d (%s)", k, d)
    _teardown_k(k, netns=[h.get("netns", "") for h in st.get("hosts", [])],
                veths=[h.get("veth", "") for h in st.get("hosts", [])],
                iptables_rule=st.get("iptables_rule"))
    return True


def cleanup_stale() -> None:
    """Remove test beds whose owning process is dead, and orphaned rdk namespaces/links."""
    if os.geteuid() != 0:
        return
    if BASE_DIR.is_dir():
        for d in sorted(BASE_DIR.iterdir()):
            if d.name.isdigit() and d.is_dir() and _owner_status(d) == "dead":
                _claim_and_reap(d)
    _remove_orphans()


def _remove_orphans() -> None:
    """Namespaces, veths and bridges named like ours but without a bed dir: a crashed teardown."""
    ks = set()
    for n in _netns_list():
        if m := _NETNS_RE.match(n):
            ks.add(int(m.group(1)))
        elif (m := _PROBE_RE.match(n)) and not _alive(int(m.group(1))):
            _quiet(["ip", "netns", "del", n], f"delete probe netns {n}")
    for n in _link_names():
        if (m := _VETH_RE.match(n)) or (m := _BRIDGE_RE.match(n)):
            ks.add(int(m.group(1)))
    for k in sorted(ks):
        if not _bed_dir(k).exists():
            log.info("testbed: removing orphaned namespaces/links of instance %d", k)
            _teardown_k(k, remove_dir=False)


# --------------------------------------------------------------------------------------------
# the test bed

_LIVE: set[TestBed] = set()
_LIVE_LOCK = threading.Lock()


def _atexit() -> None:
    with _LIVE_LOCK:
        beds = list(_LIVE)
    for bed in beds:
        # Only the process that made a bed tears it down (not a forked child).
        if not bed.manual and bed._owner_pid == os.getpid():
            bed.down()


atexit.register(_atexit)


class TestBed:
    """N real SSH hosts on this machine. Use as a context manager or call up()/down()."""

    __test__ = False

    def __init__(self, n: int, sim_gpus: int = 0, *, manual: bool = False,
                 start_timeout: float = START_TIMEOUT, login_shells: dict[int, str] | None = None,
                 people: Sequence[str] = ()) -> None:
        if not 1 <= n <= MAX_HOSTS:
            raise ValueError(f"n must be in 1..{MAX_HOSTS}")
        bad = [p for p in people if not _PERSON_RE.match(p) or p == "root"]
        if bad or len(set(people)) != len(people):
            raise ValueError(f"people: distinct account names other than root expected, got {list(people)}")
        self.n = n
        self.people_names = tuple(people)
        self.people: dict[str, Person] = {}
        # host index -> root's login shell there (e.g. {3: "/usr/bin/fish"}): what sshd runs
        # the commands it is sent through, as on a host whose users chose fish.
        self.login_shells = dict(login_shells or {})
        self.sim_gpus = int(sim_gpus)
        self.manual = manual  # outlives this process (owner pid 0), never auto-cleaned
        self.start_timeout = start_timeout
        self.k: int = 0
        self.root: Path = Path()
        self.bridge: str = ""
        self.gateway: str = ""
        self.hosts: list[TestHost] = []
        self.user_key: Path = Path()
        self.known_hosts: Path = Path()
        self.inventory_path: Path = Path()
        self.authorized_keys_dir: Path = Path()
        self.authorized_keys: Path = Path()
        self.share_dir: Path = Path()  # readable by every account (people's job scripts)
        self.iptables_rule: list[str] | None = None
        self._is_up = False
        self._owner_pid = os.getpid()
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"TestBed(k={self.k}, n={self.n}, root={str(self.root)!r}, up={self._is_up})"

    # ---- context manager

    def __enter__(self) -> TestBed:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # ---- building

    def _allocate(self) -> None:
        BASE_DIR.mkdir(parents=True, exist_ok=True)
        for k in range(1, MAX_K + 1):
            d = _bed_dir(k)
            try:
                os.mkdir(d, 0o755)
            except FileExistsError:
                continue
            self.k, self.root = k, d  # down() now removes it whatever happens next
            # Claimed. Record the owner at once (cleanup_stale treats a young dir without
            # owner.pid as still being made).
            pid = 0 if self.manual else os.getpid()
            (d / "owner.start").write_text((_proc_start(pid) or "") if pid else "")
            tmp = d / "owner.pid.tmp"
            tmp.write_text(f"{pid}\n")
            os.replace(tmp, d / "owner.pid")
            # Leftovers of a crashed bed with this number belong to nobody now.
            _teardown_k(k, remove_dir=False)
            conflict = _subnet_in_use(k)
            if conflict:
                log.warning("testbed: %s.%d.0/24 is in use here (%s); skipping it",
                            SUBNET_PREFIX, k, conflict)
                shutil.rmtree(d, ignore_errors=True)
                self.k, self.root = 0, Path()
                continue
            return
        raise TestBedError(f"no free test bed number in 1..{MAX_K} under {BASE_DIR}")

    def up(self) -> TestBed:
        with self._lock:
            if self._is_up:
                return self
            ok, reason = available()
            if not ok:
                raise TestBedError(f"test bed unavailable: {reason}")
            self._owner_pid = os.getpid()
            self.hosts = []
            self.people = {}
            self.iptables_rule = None
            with _LIVE_LOCK:
                _LIVE.add(self)
            try:
                self._allocate()
                self._build()
            except BaseException as e:
                self.down()
                if isinstance(e, TestBedError):
                    raise
                if isinstance(e, Exception):
                    raise TestBedError(f"building the test bed failed: {e}") from e
                raise
            self._is_up = True
            return self

    def _build(self) -> None:
        k, root = self.k, self.root
        self.bridge = f"rdkbr{k}"
        self.gateway = f"{SUBNET_PREFIX}.{k}.1"
        self.user_key = root / "id_ed25519"
        self.known_hosts = root / "known_hosts"
        self.inventory_path = root / "hosts.toml"
        # One file per account, named as sshd's %u expands: root's key logs in as root only.
        self.authorized_keys_dir = root / "authorized_keys.d"
        self.authorized_keys = self.authorized_keys_dir / "root"
        self.share_dir = root / "share"
        (root / "hosts").mkdir()
        for i in range(1, self.n + 1):
            hd = root / "hosts" / f"h{i}"
            self.hosts.append(TestHost(
                index=i, name=f"h{i}", hostname=f"tb{k}-h{i}",
                address=f"{SUBNET_PREFIX}.{k}.{10 + i}", netns=f"rdk{k}h{i}", port=22,
                host_key=hd / "ssh_host_ed25519_key", host_dir=hd, state_dir=hd / "state",
                sshd_pid=None, sim_gpus=self.sim_gpus, veth=f"rdk{k}v{i}"))
        self._save_state()

        # keys and files
        _keygen(self.user_key, f"rigdeck-testbed-{k}")
        self.authorized_keys_dir.mkdir(mode=0o755)
        self.authorized_keys.write_text(Path(str(self.user_key) + ".pub").read_text())
        self.share_dir.mkdir(mode=0o755)
        if self.people_names:  # people reach their authorized_keys file and the shared scripts
            for d in (BASE_DIR, root, self.authorized_keys_dir, self.share_dir):
                os.chmod(d, os.stat(d).st_mode & 0o7777 | 0o055)
        for name in self.people_names:
            self._add_person(name)
        for h in self.hosts:
            h.state_dir.mkdir(parents=True)
            h.dot_ssh.mkdir(mode=0o700)
            (h.dot_ssh / "authorized_keys").touch(mode=0o600)
            for person in self.people.values():
                self._person_host_dirs(h, person)
            _keygen(h.host_key, h.hostname)
            self._write_sshd_config(h)
        self._write_known_hosts()
        self.write_inventory()
        (root / "nsinit.py").write_text(_INIT_SCRIPT.lstrip())

        # network
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        self._open_forwarding()
        for h in self.hosts:
            _run(["ip", "netns", "add", h.netns])
            _run(["ip", "link", "add", h.veth, "type", "veth", "peer", "name", "eth0",
                  "netns", h.netns])
            _run(["ip", "link", "set", h.veth, "master", self.bridge, "up"])
            _run(["ip", "-n", h.netns, "addr", "add", f"{h.address}/24", "dev", "eth0"])
            _run(["ip", "-n", h.netns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", h.netns, "link", "set", "lo", "up"])
        self._save_state()

        # namespaces and sshd
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        os.makedirs(MOUNTPOINT, exist_ok=True)
        os.makedirs(WORKSTATION_ONLY, mode=0o755, exist_ok=True)
        if not os.path.isdir(SSH_MOUNTPOINT):  # a mount point only; its content is never touched
            os.makedirs(SSH_MOUNTPOINT, mode=0o700, exist_ok=True)
        for h in self.hosts:
            self._start_holder(h)
        for h in self.hosts:
            self._spawn_sshd(h)
        for h in self.hosts:
            self._await_sshd(h)
        self._save_state()

    def _add_person(self, name: str) -> None:
        """The account (made when missing) and its key of this bed, authorised for it only."""
        pw = ensure_account(name)
        d = self.root / "people" / name
        d.mkdir(parents=True, mode=0o700)
        key = d / "id_ed25519"
        _keygen(key, f"rigdeck-testbed-{self.k}-{name}")
        authorized = self.authorized_keys_dir / name
        authorized.write_text(Path(str(key) + ".pub").read_text())
        os.chmod(authorized, 0o644)
        self.people[name] = Person(name=name, uid=pw.pw_uid, gid=pw.pw_gid, home=Path(pw.pw_dir), key=key)

    @staticmethod
    def _person_host_dirs(h: TestHost, person: Person) -> None:
        d = h.person_dir(person.name)
        (d / "state").mkdir(parents=True, mode=0o700)
        (d / "dotssh").mkdir(mode=0o700)
        (d / "dotssh" / "authorized_keys").touch(mode=0o600)
        os.chmod(d.parent, 0o755)
        _chown_tree(d, person.uid, person.gid)
        os.chmod(d, 0o700)

    def person(self, name: str) -> Person:
        try:
            return self.people[name]
        except KeyError:
            raise KeyError(f"no person {name!r} on this bed (people: {sorted(self.people)})") from None

    def person_key(self, name: str) -> Path:
        return self.person(name).key

    def _open_forwarding(self) -> None:
        """Bridged host-to-host traffic passes the FORWARD chain when br_netfilter is loaded;
        open it for this bridge only when the policy would drop it."""
        if not shutil.which("iptables"):
            return
        cp = _run(["iptables", "-S", "FORWARD"], check=False)
        if cp.returncode != 0 or "-P FORWARD ACCEPT" in (cp.stdout or ""):
            return
        rule = ["FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT"]
        if _run(["iptables", "-I", *rule], check=False).returncode == 0:
            self.iptables_rule = rule

    def _write_sshd_config(self, h: TestHost) -> None:
        h.sshd_config.write_text("\n".join([
            f"# rigdeck test bed {self.k}, host {h.name}",
            f"ListenAddress {h.address}:{h.port}",
            f"HostKey {h.host_key}",
            f"PidFile {h.host_dir / 'sshd.pid'}",
            # The bed's key for this account (%u: the account logging in), then the host's
            # own ~/.ssh (relative to the account's home).
            f"AuthorizedKeysFile {self.authorized_keys_dir}/%u .ssh/authorized_keys",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "UseDNS no",
            "PrintMotd no",
            "PrintLastLog no",
            "AllowTcpForwarding yes",
            "AllowStreamLocalForwarding yes",
            "MaxStartups 100:30:200",
            "MaxSessions 100",
            "LogLevel INFO",
            "Subsystem sftp internal-sftp",
            "",
        ]))

    def _write_known_hosts(self) -> None:
        lines = [f"{h.address} {h.public_key}\n" if h.port == 22
                 else f"[{h.address}]:{h.port} {h.public_key}\n" for h in self.hosts]
        tmp = self.known_hosts.with_suffix(".tmp")
        tmp.write_text("".join(lines))
        os.replace(tmp, self.known_hosts)

    def refresh_known_hosts(self) -> None:
        """Rewrite known_hosts from the hosts' current keys."""
        self._write_known_hosts()

    def _passwd_for(self, h: TestHost) -> str:
        """A passwd file giving root another login shell on host ``h``, or "" for the system's."""
        shell = self.login_shells.get(h.index)
        if not shell:
            return ""
        if not os.access(shell, os.X_OK):
            raise TestBedError(f"login shell {shell} for {h.name} is not installed (apt-get install fish)")
        lines = []
        for line in Path("/etc/passwd").read_text().splitlines():
            fields = line.split(":")
            if fields[0] == "root" and len(fields) == 7:
                fields[6] = shell
            lines.append(":".join(fields))
        path = h.host_dir / "passwd"
        path.write_text("\n".join(lines) + "\n")
        return str(path)

    def _start_holder(self, h: TestHost) -> None:
        """The host's UTS+mount+PID namespaces, held by a tiny init (PID 1 inside)."""
        argv = ["ip", "netns", "exec", h.netns,
                "unshare", "--uts", "--mount", "--propagation", "private",
                "--pid", "--fork", "--mount-proc", "--",
                "sh", "-c", _HOLDER_SH, "sh", h.hostname, str(h.state_dir), MOUNTPOINT,
                sys.executable, str(self.root / "nsinit.py"), self._passwd_for(h),
                str(h.dot_ssh), SSH_MOUNTPOINT]
        for person in self.people.values():  # each person's own ~/.rigdeck and ~/.ssh here
            d = h.person_dir(person.name)
            argv += [str(d / "state"), str(person.home / ".rigdeck"),
                     str(d / "dotssh"), str(person.home / ".ssh")]
        errlog = open(h.host_dir / "init.log", "wb")
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=errlog, start_new_session=True, close_fds=True,
                                    env={**os.environ, "RDK_CGROUPS": _cgroup_mounts()})
        finally:
            errlog.close()
        h._holder = proc
        assert proc.stdout is not None
        try:
            ready, _, _ = select.select([proc.stdout], [], [], self.start_timeout)
            line = proc.stdout.readline().decode(errors="replace").strip() if ready else ""
        finally:
            proc.stdout.close()
        if line != "READY":
            try:
                err = (h.host_dir / "init.log").read_text().strip()
            except OSError:
                err = ""
            raise TestBedError(f"namespaces for {h.name} did not come up: {err or 'timeout'}")
        kids = _children(proc.pid)
        if not kids:
            raise TestBedError(f"namespace init of {h.name} not found")
        h.init_pid = kids[0]

    def _ns_argv(self, h: TestHost) -> list[str]:
        if h.init_pid is None or not _alive(h.init_pid):
            raise TestBedError(f"host {h.name} is not running")
        return ["nsenter", "--target", str(h.init_pid), "--net", "--uts", "--mount", "--pid",
                "--"]

    def _spawn_sshd(self, h: TestHost) -> None:
        with open(h.sshd_log, "ab") as logf:
            proc = subprocess.Popen(
                [*self._ns_argv(h), SSHD, "-D", "-e", "-f", str(h.sshd_config)],
                stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True,
                close_fds=True)
        h._sshd_proc = proc

    def _await_sshd(self, h: TestHost) -> None:
        proc = h._sshd_proc
        assert proc is not None
        _wait_port(h.address, h.port, self.start_timeout, proc, h.sshd_log)
        # nsenter forks for the PID namespace: the sshd is its child (on a loaded machine the
        # fork can come late: it listens already, so it is there).
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            kids = [p for p in _children(proc.pid) if _exe(p) == SSHD]
            if kids:
                h.sshd_pid = kids[0]
                return
            time.sleep(0.02)
        raise TestBedError(f"sshd of {h.name} listens but its process was not found")

    def _save_state(self) -> None:
        st = {
            "k": self.k, "n": self.n, "sim_gpus": self.sim_gpus, "manual": self.manual,
            "bridge": self.bridge, "gateway": self.gateway, "root": str(self.root),
            "user_key": str(self.user_key), "known_hosts": str(self.known_hosts),
            "inventory": str(self.inventory_path), "iptables_rule": self.iptables_rule,
            "people": {p.name: str(p.key) for p in self.people.values()},
            "hosts": [{"index": h.index, "name": h.name, "hostname": h.hostname,
                       "address": h.address, "netns": h.netns, "veth": h.veth,
                       "init_pid": h.init_pid, "sshd_pid": h.sshd_pid} for h in self.hosts],
        }
        tmp = self.root / "state.json.tmp"
        tmp.write_text(json.dumps(st, indent=1))
        os.replace(tmp, self.root / "state.json")

    # ---- tearing down

    def down(self) -> None:
        """Tear everything down. Idempotent; never raises (warnings are logged)."""
        with self._lock:
            try:
                if self.k:
                    _teardown_k(self.k, netns=[h.netns for h in self.hosts],
                                veths=[h.veth for h in self.hosts],
                                iptables_rule=self.iptables_rule)
                for h in self.hosts:
                    _reap(h._sshd_proc)
                    _reap(h._holder)
                    h.sshd_pid = None
                    h.init_pid = None
            except Exception as e:
                log.warning("testbed: down(): %s", e)
            finally:
                self._is_up = False
                with _LIVE_LOCK:
                    _LIVE.discard(self)

    # ---- using

    def host(self, name_or_index: HostRef) -> TestHost:
        if isinstance(name_or_index, TestHost):
            return name_or_index
        if isinstance(name_or_index, int):
            if 1 <= name_or_index <= len(self.hosts):
                return self.hosts[name_or_index - 1]
            raise KeyError(f"no host {name_or_index} (1..{len(self.hosts)})")
        for h in self.hosts:
            if name_or_index in (h.name, h.hostname, h.address, h.netns):
                return h
        if str(name_or_index).isdigit():
            return self.host(int(name_or_index))
        raise KeyError(f"no host {name_or_index!r}")

    def stop_sshd(self, i: HostRef) -> None:
        """Stop only the listening sshd (sessions it started keep running)."""
        h = self.host(i)
        with self._lock:
            if h.sshd_pid is not None:
                _signal(h.sshd_pid, signal.SIGTERM)
            _reap(h._sshd_proc, timeout=5.0)
            h._sshd_proc = None
            h.sshd_pid = None

    def start_sshd(self, i: HostRef) -> None:
        """Start the host's sshd again with the same config (no-op when it runs)."""
        h = self.host(i)
        with self._lock:
            if h._sshd_proc is not None and h._sshd_proc.poll() is None:
                return
            self._spawn_sshd(h)
            self._await_sshd(h)
            self._save_state()

    def regenerate_host_key(self, i: HostRef, update_known_hosts: bool = False) -> None:
        """Give the host a new host key and restart its sshd. known_hosts keeps the old key
        (to test a changed host key) unless update_known_hosts is true."""
        h = self.host(i)
        with self._lock:
            self.stop_sshd(h)
            _keygen(h.host_key, h.hostname)
            self.start_sshd(h)
            if update_known_hosts:
                self._write_known_hosts()

    def exec(self, i: HostRef, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
        """Run argv inside host i's net, UTS, mount and PID namespaces (as root)."""
        h = self.host(i)
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        if "input" not in kwargs and "stdin" not in kwargs:
            kwargs["stdin"] = subprocess.DEVNULL
        return subprocess.run([*self._ns_argv(h), *argv], **kwargs)

    def popen(self, i: HostRef, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen:
        """Like exec(), but returns the Popen: the process runs until it ends, or until the
        Popen's own process (nsenter, which forks it into the host's PID namespace) is killed:
        it dies with it (a parent-death signal), so ``p.kill()`` leaves nothing on the host."""
        h = self.host(i)
        return subprocess.Popen([*self._ns_argv(h), "setpriv", "--pdeathsig", "KILL", "--", *argv], **kwargs)

    def link_down(self, i: HostRef) -> None:
        _run(["ip", "-n", self.host(i).netns, "link", "set", "eth0", "down"])

    def link_up(self, i: HostRef) -> None:
        _run(["ip", "-n", self.host(i).netns, "link", "set", "eth0", "up"])

    def exec_as(self, i: HostRef, person: str, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
        """Like exec(), as ``person`` (their uid, gid and groups; HOME theirs)."""
        p = self.person(person)
        return self.exec(i, ["setpriv", f"--reuid={p.uid}", f"--regid={p.gid}", "--init-groups", "--",
                             "env", f"HOME={p.home}", f"USER={p.name}", f"LOGNAME={p.name}", *argv], **kwargs)

    def ssh_argv(self, i: HostRef, *command: str, user: str = "root", key: Path | None = None) -> list[str]:
        """An ssh command line that logs in to host i as ``user`` with ``key`` (default: the
        test bed's root key; no user config)."""
        h = self.host(i)
        return ["ssh", "-F", "/dev/null", "-i", str(key or self.user_key), "-o", "IdentitiesOnly=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-p", str(h.port),
                f"{user}@{h.address}", *command]

    def write_inventory(self, path: Path | None = None, hosts: list[int] | None = None,
                        **defaults: Any) -> Path:
        path = Path(path) if path is not None else self.inventory_path
        d: dict[str, Any] = {
            "user": "root",
            "port": 22,
            "identity_file": str(self.user_key),
            "known_hosts": str(self.known_hosts),
            "python": "python3",
            "state_dir": "~/.rigdeck",
            "connect_timeout": 5.0,
        }
        d.update(defaults)
        text = tomli_w.dumps({"defaults": {k: str(v) if isinstance(v, Path) else v
                                           for k, v in d.items() if v is not None}})
        chosen = [self.host(i) for i in hosts] if hosts is not None else self.hosts
        for h in chosen:
            # One [[hosts]] table each, one key a line: tests edit this text by its lines.
            entry: dict[str, Any] = {"name": h.name, "address": h.address}
            if h.sim_gpus > 0:
                entry["sim_gpus"] = h.sim_gpus
            text += "\n[[hosts]]\n" + tomli_w.dumps(entry)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path


# --------------------------------------------------------------------------------------------
# command line


def _beds() -> list[tuple[int, Path, str, dict]]:
    out = []
    if BASE_DIR.is_dir():
        for d in sorted(BASE_DIR.iterdir(), key=lambda p: (len(p.name), p.name)):
            if d.name.isdigit() and d.is_dir():
                out.append((int(d.name), d, _owner_status(d), _read_state(d)))
    return out


def _cmd_up(args: argparse.Namespace) -> int:
    people = [p for p in (args.people or "").split(",") if p]
    try:
        bed = TestBed(args.n, sim_gpus=args.sim_gpus, manual=True, people=people)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        bed.up()
    except TestBedError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    with _LIVE_LOCK:
        _LIVE.discard(bed)
    print(f"test bed {bed.k} is up ({bed.n} hosts), controller address {bed.gateway}")
    print(f"inventory:   {bed.inventory_path}")
    print(f"key:         {bed.user_key}")
    print(f"known_hosts: {bed.known_hosts}")
    for h in bed.hosts:
        print(f"  {h.name}  {h.address:<15} {h.hostname}")
    h = bed.hosts[0]
    print("log in with:")
    print(f"  ssh -i {bed.user_key} -o UserKnownHostsFile={bed.known_hosts} root@{h.address}")
    for p in bed.people.values():
        print(f"  ssh -i {p.key} -o UserKnownHostsFile={bed.known_hosts} {p.name}@{h.address}")
    print(f"tear down with: {Path(sys.executable).name} -m tests.testbed down")
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    n = 0
    for k, d, status, st in _beds():
        if args.k and k not in args.k:
            continue
        if not (args.all or args.k or status == "manual"):
            continue
        if status == "live" and not args.k:
            print(f"note: bed {k} belongs to live process {(d / 'owner.pid').read_text().strip()}")
        _teardown_k(k, netns=[h.get("netns", "") for h in st.get("hosts", [])],
                    veths=[h.get("veth", "") for h in st.get("hosts", [])],
                    iptables_rule=st.get("iptables_rule"))
        print(f"test bed {k} torn down")
        n += 1
    if args.all:
        _remove_orphans()
    if n == 0:
        hint = "" if args.all else " (manual beds only; --all for all)"
        print("no test bed to tear down" + hint)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    beds = _beds()
    if not beds:
        print("no test beds")
    for k, d, status, st in beds:
        owner = "?"
        try:
            owner = (d / "owner.pid").read_text().strip()
        except OSError:
            pass
        hosts = ", ".join(f"{h['name']}={h['address']}" for h in st.get("hosts", []))
        print(f"bed {k}: {status} (owner pid {owner}) {d}  {hosts}")
    ours = {n for n in _netns_list() if _NETNS_RE.match(n)}
    known = {h.get("netns") for _, _, _, st in beds for h in st.get("hosts", [])}
    if ours - known:
        print(f"orphaned namespaces: {' '.join(sorted(ours - known))}")
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    p = argparse.ArgumentParser(prog="python -m tests.testbed", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="create a test bed that outlives this command")
    up.add_argument("n", type=int)
    up.add_argument("--sim-gpus", type=int, default=0)
    up.add_argument("--people", default="", help="accounts to make (when missing) and key, comma-separated")
    down = sub.add_parser("down", help="tear down manual test beds")
    down.add_argument("--all", action="store_true", help="every rdk test bed, stale ones too")
    down.add_argument("k", type=int, nargs="*", help="only these bed numbers")
    sub.add_parser("status", help="list the test beds")
    args = p.parse_args(argv)
    if args.cmd in ("up", "down") and os.geteuid() != 0:
        print("error: the test bed needs root", file=sys.stderr)
        return 1
    return {"up": _cmd_up, "down": _cmd_down, "status": _cmd_status}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
