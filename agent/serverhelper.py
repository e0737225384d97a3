"""What ``rigdeck server ...`` runs on the hosts: one stdlib script, Python 3.9+.

``tui.remote.serverhost`` sends this file's source as ``python -c SOURCE COMMAND ARGS...`` (through
the transport's base64 wrapper: every value is one argv word, no shell parses it). Each command
prints one JSON object on its last line, except ``logs``, which prints the log's bytes.

    prepare STATE_DIR             make the server's directories; report the Python's platform,
                                  the wheels already there (sha256) and what is installed
    install STATE_DIR PLAN        make the venv (without pip: pip runs from its wheel) and pip
                                  install the plan's wheels; record what was installed
    keygen KEY COMMENT            the server's ed25519 key pair (made once; ssh-keygen, else the
                                  venv's cryptography); prints the public key
    authorize LINE COMMENT        put LINE in ~/.ssh/authorized_keys, replacing every line whose
                                  comment is COMMENT (never a duplicate); says the account it is
    deauthorize COMMENT           take every line whose comment is COMMENT out of it
    add-user STATE_DIR PAYLOAD    a person's forced-command key line and their entry in users.json
    remove-user STATE_DIR NAME    take both away
    users STATE_DIR               users.json's people
    write                         stdin {path: text} -> those files, atomically, 0600
    start STATE_DIR TIMEOUT ARGV  start the server unless it runs; wait until its socket accepts
    status STATE_DIR              whether it runs (pid, since, mode), whether the socket accepts
    stop STATE_DIR TIMEOUT        SIGTERM, then SIGKILL after TIMEOUT
    logs STATE_DIR LINES FOLLOW   the log's last LINES lines; FOLLOW=1: then what is appended,
                                  until stdin closes (the SSH channel)

This module is also importable (the tests run its functions locally); it imports nothing outside
the standard library.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

UNIT = "rigdeck-server"  # tui.model.serverlayout.SYSTEMD_UNIT
LOG_TAIL_LINES = 20


class Paths:
    """tui.model.serverlayout.ServerLayout, for the host side (absolute paths)."""

    def __init__(self, state_dir: str) -> None:
        d = os.path.abspath(os.path.expanduser(state_dir))
        self.state_dir = d
        self.venv = os.path.join(d, "venv")
        self.venv_python = os.path.join(d, "venv", "bin", "python")
        self.install_record = os.path.join(d, "venv", "rigdeck-install.json")
        self.wheels = os.path.join(d, "wheels")
        self.setup_record = os.path.join(d, "setup.json")
        self.inventory = os.path.join(d, "inventory.toml")
        self.socket_dir = os.path.join(d, "sock")
        self.socket = os.path.join(d, "sock", "server.sock")
        self.info = os.path.join(d, "server.json")
        self.pid = os.path.join(d, "server.pid")
        self.log = os.path.join(d, "server.log")
        # start and stop take turns on this lock (server.lock is `rigdeck serve`'s own, held
        # for its life)
        self.lock = os.path.join(d, "admin.lock")


def _out(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _write_atomic(path: str, data: bytes, mode: int) -> None:
    target = os.path.realpath(path)
    tmp = f"{target}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _sha256(path: str) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _tail(path: str, lines: int) -> bytes:
    """The last ``lines`` lines of a file (b"" when there is none)."""
    return _tail_at(path, lines)[0]


def _tail_at(path: str, lines: int) -> tuple:
    """(the last ``lines`` lines, the file's size they end at); (b"", 0) without a file."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = f.tell()
            size = min(end, 4096)
            while True:
                f.seek(end - size)
                data = f.read(size)
                if data.count(b"\n") > lines or size == end:
                    break
                size = min(end, size * 4)
    except OSError:
        return b"", 0
    if lines <= 0:
        return b"", end
    parts = data.split(b"\n")
    keep = parts[-(lines + 1):] if data.endswith(b"\n") else parts[-lines:]
    return b"\n".join(keep), end


# ---------------------------------------------------------------------------------------------
# prepare / install


def prepare(state_dir: str) -> dict:
    import platform
    import sysconfig

    p = Paths(state_dir)
    os.makedirs(p.state_dir, mode=0o700, exist_ok=True)  # an existing one keeps its mode
    for d in (p.wheels, p.socket_dir):
        os.makedirs(d, mode=0o700, exist_ok=True)
        os.chmod(d, 0o700)
    wheels = {n: _sha256(os.path.join(p.wheels, n))
              for n in sorted(os.listdir(p.wheels)) if n.endswith(".whl")}
    libc, version = platform.libc_ver() if sys.platform.startswith("linux") else ("", "")
    venv_ok = os.access(p.venv_python, os.X_OK)
    return {
        "state_dir": p.state_dir,
        "platform": {"implementation": sys.implementation.name,
                     "python": "{}.{}".format(*sys.version_info[:2]),
                     "platform": sysconfig.get_platform(), "libc": libc, "libc_version": version},
        "python_executable": sys.executable,
        "wheels": wheels,
        "installed": (_read_json(p.install_record) or {}) if venv_ok else {},
    }


def install(state_dir: str, plan_json: str) -> dict:
    """plan: {"pip": wheel name, "offline": [wheel names, installed exactly, --no-deps],
    "index": [requirements for the host's index, or []], "reinstall": [names] (subset of
    offline), "record": what to write to the install record}."""
    plan = json.loads(plan_json)
    p = Paths(state_dir)
    if not os.access(p.venv_python, os.X_OK):
        proc = subprocess.run([sys.executable, "-m", "venv", "--without-pip", p.venv],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            return {"ok": False, "error": "python -m venv failed: "
                    + proc.stdout.decode(errors="replace").strip()[-800:]}
    pip = [p.venv_python, os.path.join(p.wheels, plan["pip"], "pip"), "install",
           "--disable-pip-version-check", "--no-input", "--no-warn-script-location", "-q",
           "--no-compile"]  # bytecode is written on first import instead: a third of the time
    runs = []
    if plan.get("index"):
        runs.append(pip + ["--find-links", p.wheels, *plan["index"]])
    if plan.get("offline"):
        files = [os.path.join(p.wheels, n) for n in plan["offline"]]
        runs.append(pip + ["--no-index", "--no-deps", "--force-reinstall", *files])
    try:
        os.unlink(p.install_record)  # half an install is not the recorded one
    except FileNotFoundError:
        pass
    env = dict(os.environ, PIP_NO_INPUT="1")
    for argv in runs:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        if proc.returncode != 0:
            return {"ok": False, "error": "pip install failed (exit {}): {}".format(
                proc.returncode, proc.stdout.decode(errors="replace").strip()[-1500:])}
    _write_atomic(p.install_record, json.dumps(plan["record"], indent=1).encode(), 0o600)
    return {"ok": True}


# ---------------------------------------------------------------------------------------------
# keys


def keygen(key: str, comment: str) -> dict:
    pub = key + ".pub"
    created = False
    if not (os.path.exists(key) and os.path.exists(pub)):
        os.makedirs(os.path.dirname(key), mode=0o700, exist_ok=True)
        for path in (key, pub):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        try:
            proc = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment,
                                   "-f", key], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if proc.returncode != 0:
                return {"ok": False, "error": "ssh-keygen failed: "
                        + proc.stdout.decode(errors="replace").strip()[-500:]}
        except FileNotFoundError:  # no OpenSSH client here: the venv's cryptography
            from cryptography.hazmat.primitives import serialization
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

            private = Ed25519PrivateKey.generate()
            _write_atomic(key, private.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                serialization.NoEncryption()), 0o600)
            public = private.public_key().public_bytes(
                serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
            _write_atomic(pub, public + b" " + comment.encode() + b"\n", 0o644)
        created = True
    os.chmod(key, 0o600)
    with open(pub) as f:
        words = f.read().split()
    return {"ok": True, "created": created, "public_key": " ".join(words[:2])}


def _authorized_keys() -> tuple:
    """(the path of ~/.ssh/authorized_keys, its lines, its mode); made ~/.ssh when missing."""
    ssh_dir = os.path.join(os.path.expanduser("~"), ".ssh")
    if not os.path.isdir(ssh_dir):
        os.makedirs(ssh_dir, mode=0o700)
    path = os.path.join(ssh_dir, "authorized_keys")
    try:
        with open(path, "rb") as f:
            lines = f.read().decode("utf-8", errors="surrogateescape").splitlines()
        mode = os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        lines, mode = [], 0o600
    return path, lines, mode


def _rewrite_authorized(path: str, old: list, comment: str, line) -> dict:
    """``old`` without the lines whose comment is ``comment``, plus ``line`` (None: none)."""
    kept = [ln for ln in old if ln.split()[-1:] != [comment]]
    new = kept + ([line] if line is not None else [])
    if new == old:
        return {"changed": False, "removed": 0, "path": path}
    text = "\n".join(new) + "\n"
    mode = os.stat(path).st_mode & 0o777 if os.path.exists(path) else 0o600
    _write_atomic(path, text.encode("utf-8", errors="surrogateescape"), mode & 0o644 or 0o600)
    return {"changed": True, "removed": len(old) - len(kept), "path": path}


def authorize(line: str, comment: str) -> dict:
    """``line`` in ~/.ssh/authorized_keys, in place of every line whose comment is ``comment``."""
    import pwd

    path, old, _mode = _authorized_keys()
    return dict(_rewrite_authorized(path, old, comment, line), user=pwd.getpwuid(os.getuid()).pw_name)


# ---------------------------------------------------------------------------------------------
# the people who attach with keys of their own (users.json: tui.model.serverlayout)


def read_users(state_dir: str) -> dict:
    """name -> {"admin", "key", "fingerprint", "comment", "added"}: the server's people."""
    data = _read_json(os.path.join(Paths(state_dir).state_dir, "users.json")) or {}
    users = data.get("users")
    return users if isinstance(users, dict) else {}


def _write_users(state_dir: str, users: dict) -> None:
    p = Paths(state_dir)
    os.makedirs(p.state_dir, mode=0o700, exist_ok=True)
    body = json.dumps({"users": users}, indent=1, sort_keys=True) + "\n"
    _write_atomic(os.path.join(p.state_dir, "users.json"), body.encode(), 0o600)


class _UsersLocked:
    """users.json's writers take turns (add-user and remove-user here, the server recording
    a person's accounts): each reads, changes and writes it whole."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(Paths(state_dir).state_dir, "users.lock")
        self.fd = -1

    def __enter__(self) -> None:
        import fcntl

        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # the lock goes with it


def record_accounts(state_dir: str, name: str, accounts: dict) -> dict:
    """``accounts`` ({host: {"account", "python", "state_dir"}}, checked by the server) as
    ``name``'s, beside those recorded before (a host named again is replaced). The server calls
    this itself; no command of this script does. KeyError when ``name`` is not a user."""
    with _UsersLocked(state_dir):
        users = read_users(state_dir)
        if name not in users:
            raise KeyError(name)
        users[name]["accounts"] = {**(users[name].get("accounts") or {}), **accounts}
        _write_users(state_dir, users)
        return dict(users[name]["accounts"])


def join_tag(state_dir: str, name: str) -> str:
    """The tag this server issued to ``name`` for their key lines (``rigdeck server join``):
    made once, kept with them in users.json (a new key keeps it), gone with them (a person
    added again under the name gets another). The server calls this itself. KeyError when
    ``name`` is not a user."""
    import secrets

    with _UsersLocked(state_dir):
        users = read_users(state_dir)
        if name not in users:
            raise KeyError(name)
        tag = users[name].get("join_tag")
        if not isinstance(tag, str) or len(tag) != 32:
            tag = users[name]["join_tag"] = secrets.token_hex(16)
            _write_users(state_dir, users)
        return tag


def forget_accounts(state_dir: str, name: str, hosts: list) -> dict:
    """``name``'s accounts on ``hosts`` out of users.json (``rigdeck server leave``); the server
    calls this itself. Returns those left."""
    with _UsersLocked(state_dir):
        users = read_users(state_dir)
        if name not in users:
            raise KeyError(name)
        left = {h: a for h, a in (users[name].get("accounts") or {}).items() if h not in hosts}
        if left:
            users[name]["accounts"] = left
        else:
            users[name].pop("accounts", None)
        _write_users(state_dir, users)
        return left


def deauthorize(comment: str) -> dict:
    """Every line whose comment is ``comment`` out of ~/.ssh/authorized_keys (``leave``)."""
    path, old, _mode = _authorized_keys()
    return _rewrite_authorized(path, old, comment, None)


def add_user(state_dir: str, payload_json: str) -> dict:
    """payload {name, admin, key, fingerprint, line, comment}: the key's forced-command ``line``
    in authorized_keys (replacing that person's earlier one) and the person in users.json.
    Refused when the key is already on another line there: sshd would use the first line that
    holds the key, and the forced command would not apply."""
    u = json.loads(payload_json)
    path, lines, _mode = _authorized_keys()
    blob = u["key"].split()[1]
    for number, ln in enumerate(lines, start=1):
        if blob in ln.split() and ln.split()[-1:] != [u["comment"]]:
            return {"ok": False, "error": "this key is already in {} (line {}: {}): sshd would use that "
                    "line, not the forced command; each person needs a key of their own".format(
                        path, number, ln.split()[-1] if len(ln.split()) > 2 else "no comment")}
    result = _rewrite_authorized(path, lines, u["comment"], u["line"])
    with _UsersLocked(state_dir):
        users = read_users(state_dir)
        kept = {k: users[u["name"]][k] for k in ("accounts", "join_tag") if k in users.get(u["name"], {})}
        users[u["name"]] = {"admin": bool(u["admin"]), "key": u["key"], "fingerprint": u["fingerprint"],
                            "comment": u["comment"], "added": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **kept}
        _write_users(state_dir, users)
    return {"ok": True, "replaced": bool(result["removed"]), "user": users[u["name"]], "path": path}


def remove_user(state_dir: str, name: str) -> dict:
    """The person's key line out of authorized_keys and the person (their accounts on the
    hosts too: the server drops its links to them) out of users.json."""
    with _UsersLocked(state_dir):
        users = read_users(state_dir)
        if name not in users:
            return {"ok": False, "error": "no user {!r} on this server (its users: {})".format(
                name, ", ".join(sorted(users)) or "none")}
        path, lines, _mode = _authorized_keys()
        result = _rewrite_authorized(path, lines, users[name].get("comment") or "", None)
        del users[name]
        _write_users(state_dir, users)
    return {"ok": True, "removed_lines": result["removed"], "path": path}


def list_users(state_dir: str) -> dict:
    return {"ok": True, "users": read_users(state_dir)}


def write() -> dict:
    """stdin: {path: text}; each file written atomically, 0600, its directory made 0700."""
    files = json.loads(sys.stdin.buffer.read())
    for path, text in files.items():
        path = os.path.expanduser(path)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        _write_atomic(path, text.encode(), 0o600)
    return {"ok": True, "written": sorted(files)}


# ---------------------------------------------------------------------------------------------
# the server process


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks after boot (Linux), to tell a reused pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True


def _listening(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2.0)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def _running(p: Paths) -> dict | None:
    """server.json when the process it names still runs (the same process), else None."""
    info = _read_json(p.info)
    if not info or not isinstance(info.get("pid"), int) or info.get("stopped"):
        return None
    pid = info["pid"]
    if not _alive(pid):
        return None
    if info.get("start_time") and _start_time(pid) not in (None, info["start_time"]):
        return None  # the pid was reused
    return info


def _status(p: Paths) -> dict:
    info = _running(p)
    setup = _read_json(p.setup_record) or {}
    return {
        "running": info is not None,
        "listening": _listening(p.socket),
        "pid": info["pid"] if info else None,
        "since": info.get("started") if info else None,
        "mode": info.get("mode") if info else None,
        "version": setup.get("version"),
        "build": setup.get("build"),
        "socket": p.socket,
        "log": p.log,
        "state_dir": p.state_dir,
        "set_up": os.path.exists(p.setup_record),
    }


def status(state_dir: str) -> dict:
    return _status(Paths(state_dir))


def _locked(p: Paths):
    import fcntl

    os.makedirs(p.state_dir, mode=0o700, exist_ok=True)
    fd = os.open(p.lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _systemd_user() -> bool:
    """Whether a `systemd-run --user` unit here outlives the SSH session: the user's manager
    answers and the user lingers (else logind stops the manager, and the unit, at logout)."""
    try:
        ok = subprocess.run(["systemctl", "--user", "show-environment"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, timeout=10).returncode == 0
        if not ok:
            return False
        linger = subprocess.run(["loginctl", "show-user", str(os.getuid()),
                                 "--property=Linger", "--value"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=10)
        return linger.returncode == 0 and linger.stdout.strip() == b"yes"
    except (OSError, subprocess.SubprocessError):
        return False


def _spawn_systemd(p: Paths, argv: list) -> int | None:
    subprocess.run(["systemctl", "--user", "reset-failed", UNIT], stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)
    cmd = ["systemd-run", "--user", "--unit", UNIT, "--collect", "--quiet",
           "--working-directory", p.state_dir,
           "--property", "StandardOutput=append:" + p.log,
           "--property", "StandardError=append:" + p.log]
    proc = subprocess.run(cmd + ["--"] + argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=30)
    if proc.returncode != 0:
        return None
    show = subprocess.run(["systemctl", "--user", "show", UNIT, "--property=MainPID", "--value"],
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, timeout=10)
    try:
        pid = int(show.stdout.strip() or b"0")
    except ValueError:
        pid = 0
    return pid or None


def _spawn_detached(p: Paths, argv: list) -> subprocess.Popen:
    with open(os.devnull, "rb") as devnull, open(p.log, "ab") as log:
        os.chmod(p.log, 0o600)
        return subprocess.Popen(argv, stdin=devnull, stdout=log, stderr=log, cwd=p.state_dir,
                                start_new_session=True, close_fds=True)


def start(state_dir: str, timeout: str, argv_json: str) -> dict:
    p = Paths(state_dir)
    argv = json.loads(argv_json)
    lock = _locked(p)
    try:
        if _running(p) is not None:
            return dict(_status(p), started=False)
        if not os.path.exists(argv[0]):
            return dict(_status(p), started=False,
                        error=f"{argv[0]} is missing: run `rigdeck server setup` first")
        os.makedirs(p.socket_dir, mode=0o700, exist_ok=True)
        with open(p.log, "ab") as log:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            log.write(f"--- rigdeck server starting {stamp}: {' '.join(argv)}\n".encode())
        child = None
        pid = _spawn_systemd(p, argv) if _systemd_user() else None
        mode = "systemd" if pid else "process"
        if pid is None:
            child = _spawn_detached(p, argv)
            pid = child.pid
        info = {"pid": pid, "start_time": _start_time(pid), "mode": mode, "argv": argv,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "started_epoch": time.time()}
        _write_atomic(p.info, json.dumps(info, indent=1).encode(), 0o600)
        _write_atomic(p.pid, b"%d\n" % pid, 0o600)
        deadline = time.monotonic() + float(timeout)
        while True:
            exited = child.poll() if child is not None else (None if _alive(pid) else -1)
            if exited is not None:
                _mark_stopped(p)
                return dict(_status(p), started=False, error=f"the server exited (status {exited}) "
                            f"before it listened on {p.socket}",
                            log_tail=_tail(p.log, LOG_TAIL_LINES).decode(errors="replace"))
            if _listening(p.socket):
                return dict(_status(p), started=True)
            if time.monotonic() > deadline:
                _terminate(p, info, 5.0)
                return dict(_status(p), started=False, error=f"the server did not listen on {p.socket} "
                            f"within {timeout}s; it was stopped",
                            log_tail=_tail(p.log, LOG_TAIL_LINES).decode(errors="replace"))
            time.sleep(0.1)
    finally:
        os.close(lock)


def _mark_stopped(p: Paths) -> None:
    info = _read_json(p.info) or {}
    info["stopped"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    _write_atomic(p.info, json.dumps(info, indent=1).encode(), 0o600)
    try:
        os.unlink(p.pid)
    except FileNotFoundError:
        pass


def _terminate(p: Paths, info: dict, timeout: float) -> bool:
    """Stop the server ``info`` names; True when it had to be killed."""
    pid = info["pid"]
    if info.get("mode") == "systemd":
        subprocess.run(["systemctl", "--user", "stop", UNIT], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout + 10)
    killed = False
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        if not _alive(pid):
            break
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        killed = sig == signal.SIGKILL
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and _alive(pid):
            try:  # our own child (a start that timed out): reap it
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.05)
    _mark_stopped(p)
    return killed


def stop(state_dir: str, timeout: str) -> dict:
    p = Paths(state_dir)
    if not os.path.isdir(p.state_dir):
        return dict(_status(p), was_running=False, killed=False)
    lock = _locked(p)
    try:
        info = _running(p)
        if info is None:
            return dict(_status(p), was_running=False, killed=False)
        killed = _terminate(p, info, float(timeout))
        return dict(_status(p), was_running=True, killed=killed, stopped_pid=info["pid"])
    finally:
        os.close(lock)


def logs(state_dir: str, lines: str, follow: str) -> None:
    p = Paths(state_dir)
    out = sys.stdout.buffer
    data, pos = _tail_at(p.log, int(lines))  # following goes on from where the tail ended
    out.write(data)
    out.flush()
    if follow != "1":
        return
    stdin = sys.stdin.fileno()
    while True:
        ready, _, _ = select.select([stdin], [], [], 0.3)
        if ready and not os.read(stdin, 4096):
            return  # the client went away
        try:
            size = os.path.getsize(p.log)
        except OSError:
            continue
        if size < pos:
            pos = 0  # truncated or replaced
        if size > pos:
            with open(p.log, "rb") as f:
                f.seek(pos)
                data = f.read(size - pos)
            pos += len(data)
            try:
                out.write(data)
                out.flush()
            except BrokenPipeError:
                return


COMMANDS: dict[str, Callable[..., dict]] = {
    "prepare": prepare, "install": install, "keygen": keygen, "authorize": authorize, "deauthorize": deauthorize,
    "write": write, "start": start, "status": status, "stop": stop,
    "add-user": add_user, "remove-user": remove_user, "users": list_users,
}


def main(argv: list) -> int:
    command, args = argv[0], argv[1:]
    if command == "logs":
        logs(*args)
        return 0
    try:
        result = COMMANDS[command](*args)
    except Exception as e:  # reported to the workstation, which names the host
        _out({"ok": False, "error": f"{type(e).__name__}: {e}"})
        return 1
    _out(result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
