"""How the controller reaches a host: SSH through paramiko, or the local machine directly.

Both transports take commands as argument lists. Over SSH the protocol carries one string,
which the user's login shell on the host parses: bash, zsh, but also fish or csh, whose quoting
rules differ from POSIX sh. So the list is quoted for POSIX sh (``shlex.join``), base64-encoded,
and handed to a fixed ``/bin/sh`` wrapper whose one argument is safe in any shell: no user value
is ever parsed by a login shell, and sh sees every argument as the single word it was.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import os
import random
import select
import shlex
import shutil
import socket
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko

from tui.model.inventory import HostSpec, Inventory
from tui.remote.hub import HubTransport
from tui.remote.inventoryfile import jump_chain

log = logging.getLogger(__name__)

IDLE_CHECK_S = 1.0  # how often a read waiting on a socket looks whether the connection was closed


class _QuietOpenFailures(logging.Filter):
    """paramiko logs each channel the server refuses at ERROR; here every refusal raises (or,
    for a daemon's socket nobody listens on yet, is expected), so that line would only alarm."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg
        return not (isinstance(msg, str) and msg.startswith("Secsh channel") and "open FAILED" in msg)


logging.getLogger("paramiko.transport").addFilter(_QuietOpenFailures())


# ---------------------------------------------------------------------------------------------
# Errors a user can cause or must act on. Each names the host.


class TransportError(Exception):
    """A host could not be reached or used; ``kind`` is a short machine-readable tag."""

    kind = "error"

    def __init__(self, host: str, message: str):
        super().__init__(f"{host}: {message}")
        self.host = host
        self.detail = message


class UnreachableError(TransportError):
    kind = "unreachable"


class AuthenticationError(TransportError):
    kind = "auth"


class UnknownHostKeyError(TransportError):
    """The host presented a key that known_hosts does not have; nothing was sent to it."""

    kind = "unknown-host-key"

    def __init__(self, host: str, hostkey_name: str, key: paramiko.PKey, known_hosts: Path):
        self.hostkey_name = hostkey_name
        self.key = key
        self.key_type = key.get_name()
        self.fingerprint = fingerprint(key)
        super().__init__(
            host,
            f"unknown host key for {hostkey_name}: {self.key_type} {self.fingerprint} "
            f"(not in {known_hosts}); check it out of band, then accept it with --accept-new",
        )


class HostKeyChangedError(TransportError):
    """The host's key differs from the recorded one. Never accepted automatically."""

    kind = "host-key-changed"

    def __init__(self, host: str, hostkey_name: str, got: paramiko.PKey, expected: paramiko.PKey,
                 known_hosts: Path):
        self.hostkey_name = hostkey_name
        self.fingerprint = fingerprint(got)
        self.expected_fingerprint = fingerprint(expected)
        super().__init__(
            host,
            "REMOTE HOST KEY HAS CHANGED for "
            f"{hostkey_name}: it presented {got.get_name()} {self.fingerprint}, but "
            f"{known_hosts} records {expected.get_name()} {self.expected_fingerprint}. "
            "This may be an attack (or a reinstalled host); refusing to connect. "
            "Remove the old entry by hand only once you know why it changed.",
        )


class CommandTimeout(TransportError):
    kind = "timeout"


class PassphraseRequiredError(AuthenticationError):
    """Authentication needs a private key that is encrypted, and no passphrase for it is held
    (none was asked for, or the user declined). ``key_file`` names the key."""

    kind = "passphrase"

    def __init__(self, host: str, key_file: str):
        self.key_file = key_file
        super().__init__(
            host,
            f"the key {key_file} is protected by a passphrase: enter it when asked, or add the "
            "key to ssh-agent (ssh-add)",
        )


# ---------------------------------------------------------------------------------------------
# Passphrases of encrypted private keys: asked once (through the face's prompt), held in this
# process's memory only, never written anywhere and never logged.

PassphrasePrompt = Callable[[str], "str | None"]
_passphrases: dict[str, str] = {}
_declined: set[str] = set()
_passphrase_lock = threading.Lock()
_prompt: PassphrasePrompt | None = None
DEFAULT_KEY_FILES = ("~/.ssh/id_rsa", "~/.ssh/id_ecdsa", "~/.ssh/id_ed25519")


def set_passphrase_prompt(prompt: PassphrasePrompt | None) -> None:
    """How to ask the user for a key's passphrase: ``prompt(key_file)`` returns it, or None
    when the user declines. Called from whatever thread connects; at most once per key file
    while the process lives (a wrong passphrase is asked again, up to three times)."""
    global _prompt
    _prompt = prompt


def _key_path(path: str) -> str:
    return os.path.realpath(os.path.expanduser(path))


def key_needs_passphrase(path: str) -> bool:
    """Whether the private key file is encrypted (False for a plain key or no key at all)."""
    try:
        paramiko.PKey.from_path(_key_path(path))
    except paramiko.PasswordRequiredException:
        return True
    except TypeError as e:  # what PKey.from_path raises for an encrypted key and no password
        return "password" in str(e).lower()
    except (OSError, paramiko.SSHException, ValueError):
        return False
    return False


def _open_key(path: str, passphrase: str) -> paramiko.PKey:
    """The private key at ``path`` opened with ``passphrase``; ValueError when it does not."""
    try:
        return paramiko.PKey.from_path(path, passphrase.encode())
    except (OSError, paramiko.SSHException, ValueError, TypeError):
        raise ValueError(f"that passphrase does not open {path}") from None


def remember_passphrase(path: str, passphrase: str) -> None:
    """Hold ``passphrase`` for the key at ``path`` in memory, once it is shown to open the key;
    ValueError when it does not (the message never holds the passphrase)."""
    real = _key_path(path)
    _open_key(real, passphrase)
    with _passphrase_lock:
        _passphrases[real] = passphrase
        _declined.discard(real)


def forget_passphrases() -> None:
    """Drop every held passphrase (and every refusal to give one)."""
    with _passphrase_lock:
        _passphrases.clear()
        _declined.clear()


def _unlocked_key(path: str) -> paramiko.PKey | None:
    secret = _passphrases.get(_key_path(path))
    if secret is None:
        return None
    try:
        return _open_key(_key_path(path), secret)
    except ValueError:
        return None


def _ask_passphrase(label: str, path: str) -> bool:
    """Ask for the passphrase of ``path`` (once per process); True when one is now held."""
    real = _key_path(path)
    with _passphrase_lock:  # one question at a time: parallel connects ask once
        if real in _passphrases:
            return True
        if real in _declined or _prompt is None:
            return False
        for _attempt in range(3):
            try:
                answer = _prompt(path)
            except (EOFError, KeyboardInterrupt, OSError):
                answer = None
            if not answer:
                break
            try:
                _open_key(real, answer)
            except ValueError:
                log.warning("%s: the passphrase given does not open %s", label, path)
                continue
            _passphrases[real] = answer
            return True
        _declined.add(real)
        return False


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint of a public key, e.g. ``SHA256:abc...``."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def hostkey_name(address: str, port: int) -> str:
    """The name known_hosts uses for a host: ``addr`` on port 22, ``[addr]:port`` otherwise."""
    return address if port == 22 else f"[{address}]:{port}"


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def check(self, host: str) -> CommandResult:
        if self.exit_code != 0:
            tail = (self.stderr or self.stdout).strip().splitlines()[-5:]
            raise TransportError(
                host, f"{shlex.join(self.argv[:3])}... exited {self.exit_code}: {' | '.join(tail)}"
            )
        return self


@dataclass
class Backoff:
    """Exponential backoff with full jitter, for reconnects."""

    initial: float = 0.5
    factor: float = 2.0
    maximum: float = 30.0
    attempts: int = 0
    _rng: random.Random = field(default_factory=random.Random, repr=False)

    def next_delay(self) -> float:
        ceiling = min(self.maximum, self.initial * (self.factor**self.attempts))
        self.attempts += 1
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempts = 0


class Stream(ABC):
    """A long-lived process on a host (the agent's ``attach``), spoken to over stdin/stdout."""

    @abstractmethod
    def send(self, data: bytes) -> None: ...

    @abstractmethod
    def recv(self, timeout: float) -> bytes | None:
        """Up to 64 KiB of stdout; ``None`` when nothing came within ``timeout``; ``b""`` at EOF."""

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def fileno(self) -> int:
        """A descriptor that is readable while output waits to be read (for a selector)."""

    def notify(self, callback: Callable[[], None]) -> bool:
        """Have ``callback`` called, from whichever thread receives the stream's output, each
        time output arrives (and once at once when some waits already) or the stream ends: a
        reader of many streams then waits on one wake-up of its own instead of a descriptor per
        stream. The callback must be quick and take no lock its reader holds while it reads or
        closes a stream. False: this stream has no such hook; wait on ``fileno``."""
        return False


class _Notify:
    """What a paramiko channel's input buffer sets when data arrives or the channel closes (its
    ``set_event`` hook; by default ``fileno`` puts a pipe there that costs a write and a read
    per packet): a call of the reader's ``callback``. The buffer calls ``clear`` once drained."""

    __slots__ = ("callback",)

    def __init__(self, callback: Callable[[], None]):
        self.callback = callback

    def set(self) -> None:
        self.callback()

    def clear(self) -> None:
        pass


class ChannelStream(Stream):
    def __init__(self, host: str, chan: paramiko.Channel):
        self.host = host
        self.chan = chan
        self._notified = False

    def notify(self, callback: Callable[[], None]) -> bool:
        if self._notified:
            raise RuntimeError(f"{self.host}: the agent stream already notifies a reader")
        self._notified = True
        self.chan.in_buffer.set_event(_Notify(callback))
        return True

    def send(self, data: bytes) -> None:
        try:
            self.chan.settimeout(10.0)
            self.chan.sendall(data)
        except (OSError, EOFError, paramiko.SSHException) as e:
            raise UnreachableError(self.host, f"send to agent failed: {e}") from None

    def recv(self, timeout: float) -> bytes | None:
        chan = self.chan
        if chan.recv_stderr_ready():
            self._log_stderr()
        if timeout <= 0 and not chan.recv_ready() and not chan.closed and not chan.eof_received:
            return None  # what recv would say, without the two exceptions it raises to say it
        try:
            chan.settimeout(timeout)
            return chan.recv(65536)
        except TimeoutError:
            return None
        except (OSError, EOFError, paramiko.SSHException) as e:
            raise UnreachableError(self.host, f"agent stream broke: {e}") from None

    def _log_stderr(self) -> None:
        """Read what the command wrote to stderr (a login shell's start-up files, the agent's
        complaints) and log it: unread, it would hold the channel's window, and with paramiko's
        ``fileno`` pipe (set by either stream) it kept a selector waking at once, forever."""
        try:
            text = self.chan.recv_stderr(65536).decode(errors="replace").strip()
        except (OSError, EOFError, paramiko.SSHException):
            return
        if text:
            log.info("%s: the agent stream's stderr: %s", self.host, text[:500])

    def close(self) -> None:
        self.chan.close()

    def fileno(self) -> int:
        if self._notified:  # paramiko's pipe would take the hook's place
            raise RuntimeError(f"{self.host}: the agent stream notifies its reader; it has no descriptor")
        return self.chan.fileno()  # paramiko's pipe, set while the channel holds data


class PipeStream(Stream):
    def __init__(self, host: str, proc: subprocess.Popen[bytes]):
        self.host = host
        self.proc = proc

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(data)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError) as e:
            raise UnreachableError(self.host, f"send to agent failed: {e}") from None

    def recv(self, timeout: float) -> bytes | None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return None
        return os.read(fd, 65536)

    def fileno(self) -> int:
        assert self.proc.stdout is not None
        return self.proc.stdout.fileno()

    def close(self) -> None:
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Transport(ABC):
    """One host. Thread-safe for concurrent ``run`` calls once connected."""

    def __init__(self, spec: HostSpec):
        self.spec = spec
        self.name = spec.name
        # Called once the host's TCP connect is answered, before the SSH handshake: whoever
        # waits for the connection can tell a host out of reach from one slow to log in to.
        self.on_reached: Callable[[], None] | None = None
        # Called as the TCP connect is sent: the wait for its answer starts there, not before
        # this process's own work to get there (on a busy machine, no fault of the host's).
        self.on_dialing: Callable[[], None] | None = None

    def _reached(self) -> None:
        if self.on_reached is not None:
            self.on_reached()

    def _dialing(self) -> None:
        if self.on_dialing is not None:
            self.on_dialing()

    @abstractmethod
    def connect(self) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    @property
    @abstractmethod
    def connected(self) -> bool: ...

    @abstractmethod
    def run(
        self,
        argv: Sequence[str],
        *,
        input: bytes | None = None,
        timeout: float = 60.0,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        """Run ``argv`` on the host and wait for it; raise CommandTimeout past ``timeout``."""

    @abstractmethod
    def put_file(self, local: Path, remote: str, mode: int = 0o644) -> None:
        """Copy a local file to an absolute path on the host, creating parent directories."""

    @abstractmethod
    def put_data(self, data: bytes, remote: str) -> None:
        """Write ``data`` to an absolute path on the host, in a directory that exists there."""

    @abstractmethod
    def home(self) -> str: ...

    @abstractmethod
    def file_size(self, path: str) -> int | None:
        """Size of a file on the host, or None when there is none."""

    @abstractmethod
    def install_checked(self, data: bytes, path: str, sha256: str, mode: int = 0o600) -> bool:
        """Make the file at ``path`` hold ``data``, whose SHA-256 is ``sha256``, with no process
        started on the host. When the file there already hashes so, nothing is written (False).
        Otherwise ``data`` goes to a temporary name beside it, is read back from the host's disk
        and hashed here, and only then renamed into place (True); a mismatch leaves nothing."""

    @abstractmethod
    def open_stream(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Stream:
        """Start ``argv`` and keep talking to it over its stdin/stdout."""

    def peer_address(self) -> str | None:
        """The IP address this connection reached on the host, or None where the connection
        says nothing about the host's own addresses (no network, or a jump host in between)."""
        return None

    def open_socket_stream(self, path: str) -> Stream | None:
        """A stream to the unix socket at absolute ``path`` on the host, with no process
        started there; None where this transport cannot, or the host refuses (nobody listens
        there, or its sshd does not forward to unix sockets)."""
        return None

    def remote_path(self, path: str) -> str:
        """Expand a leading ``~`` against the host's home directory."""
        if path == "~":
            return self.home()
        if path.startswith("~/"):
            return self.home().rstrip("/") + "/" + path[2:]
        return path

    def reconnect(self, backoff: Backoff | None = None, attempts: int = 3) -> None:
        """Close and connect again, waiting with backoff between failed attempts."""
        backoff = backoff or Backoff()
        for attempt in range(attempts):
            self.close()
            try:
                self.connect()
                backoff.reset()
                return
            except (UnknownHostKeyError, HostKeyChangedError, AuthenticationError):
                raise  # retrying cannot fix these
            except TransportError:
                if attempt == attempts - 1:
                    raise
                time.sleep(backoff.next_delay())

    def __enter__(self) -> Transport:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def remote_command(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """The string an SSH exec request carries for ``argv``: the same words reach the command
    whatever the login shell (sh, bash, zsh, fish, csh). Base64 has no character any of them
    treats specially inside single quotes."""
    script = "exec " + shlex.join(_with_env(argv, env))
    encoded = base64.b64encode(script.encode("utf-8")).decode("ascii")
    return f"exec /bin/sh -c 'eval \"$(echo {encoded} | base64 -d)\"'"


def _with_env(argv: Sequence[str], env: Mapping[str, str] | None) -> list[str]:
    if not env:
        return list(argv)
    return ["env", *(f"{k}={v}" for k, v in env.items()), *argv]


# ---------------------------------------------------------------------------------------------


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown keys, or record them in known_hosts when the user accepted new keys."""

    def __init__(self, host: str, known_hosts: Path, accept_new: bool,
                 accept_fingerprints: frozenset[str] = frozenset()):
        self.host = host
        self.known_hosts = known_hosts
        self.accept_new = accept_new
        # Keys the user checked and accepted by fingerprint: only those are recorded.
        self.accept_fingerprints = accept_fingerprints
        self.accepted: str | None = None

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if not self.accept_new and fingerprint(key) not in self.accept_fingerprints:
            raise UnknownHostKeyError(self.host, hostname, key, self.known_hosts)
        record_host_key(self.known_hosts, hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.accepted = fingerprint(key)
        log.warning("%s: accepted new host key %s %s", self.host, key.get_name(), self.accepted)


_known_hosts_lock = threading.Lock()


def record_host_key(known_hosts: Path, hostname: str, key: paramiko.PKey) -> None:
    """Append one entry to known_hosts (created 0600 in a 0700 directory if missing)."""
    with _known_hosts_lock:
        known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        fd = os.open(known_hosts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(line)


def load_host_keys(known_hosts: Path) -> paramiko.HostKeys:
    keys = paramiko.HostKeys()
    if known_hosts.exists():
        keys.load(str(known_hosts))
    return keys


def scan_host_key(address: str, port: int = 22, timeout: float = 5.0,
                  sock: Any = None) -> paramiko.PKey:
    """The key a server presents, without authenticating (for the app's trust dialog)."""
    s = sock or socket.create_connection((address, port), timeout=timeout)
    t = paramiko.Transport(s)
    try:
        t.banner_timeout = timeout
        t.start_client(timeout=timeout)
        return t.get_remote_server_key()
    finally:
        t.close()


SFTP_PIECE = 32000  # an SFTP write with its headers in one SSH packet (the server's max is 32 KiB)


STREAMLOCAL = "direct-streamlocal@openssh.com"  # OpenSSH's channel to a unix socket (ssh -L x:/path)
_streamlocal = threading.local()  # the socket path of the channel this thread is opening


class _AeadFirst(HubTransport):
    """paramiko's transport preferring AES-GCM when the server offers it: one pass of AES-NI
    per packet where AES-CTR also needs an HMAC-SHA-256 (bulk copies of code sync go twice as
    fast on the controller's CPU). Other ciphers stay in paramiko's order after it. Served by
    the hub's threads, not a thread of its own, where the hub may (``tui/remote/hub.py``).

    It also opens channels to a unix socket on the server (``open_unix_socket``), which
    paramiko's ``open_channel`` can ask for but not address: the socket's path is added to that
    one channel-open message as it is sent."""

    AEAD = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")  # paramiko has them from 3.5

    def __init__(self, sock: Any, *args: Any, **kwargs: Any):
        super().__init__(sock, *args, **kwargs)
        # paramiko's public options (its own list, disabled_algorithms still applied after), the
        # GCM ciphers it has moved first: a paramiko without them keeps its order.
        options = self.get_security_options()
        offered = tuple(options.ciphers)
        first = tuple(c for c in self.AEAD if c in offered)
        options.ciphers = first + tuple(c for c in offered if c not in first)

    def open_unix_socket(self, path: str, timeout: float) -> paramiko.Channel:
        """A channel to the unix socket at ``path`` on the server, connected by sshd as the
        logged-in user: no shell, no process started there. paramiko.ChannelException when
        sshd refuses (no one listens there, or its AllowStreamLocalForwarding is off)."""
        _streamlocal.path = path
        try:
            return self.open_channel(STREAMLOCAL, timeout=timeout)
        finally:
            _streamlocal.path = None

    def _send_user_message(self, data: Any) -> None:
        path = getattr(_streamlocal, "path", None)
        if path is not None and isinstance(data, paramiko.Message) and _opens(data, STREAMLOCAL):
            _streamlocal.path = None  # once: this thread's one channel-open message
            data.add_string(path)  # then what the protocol reserves: a string and a uint32
            data.add_string("")
            data.add_int(0)
        super()._send_user_message(data)


def _opens(message: paramiko.Message, kind: str) -> bool:
    """Whether ``message`` is a channel-open request of ``kind`` (RFC 4254 5.1)."""
    name = kind.encode()
    head = bytes([paramiko.common.MSG_CHANNEL_OPEN]) + len(name).to_bytes(4, "big") + name
    return message.asbytes().startswith(head)


class SSHTransport(Transport):
    """A paramiko connection to one host, optionally through ProxyJump hops."""

    def __init__(
        self,
        spec: HostSpec,
        known_hosts: Path,
        *,
        accept_new: bool = False,
        jumps: Sequence[HostSpec] = (),
        accept_fingerprints: Sequence[str] = (),
    ):
        super().__init__(spec)
        self.known_hosts = Path(known_hosts)
        self.accept_new = accept_new
        self.accept_fingerprints = frozenset(accept_fingerprints)
        self.jumps = list(jumps)
        self._client: paramiko.SSHClient | None = None
        self._jump_clients: list[paramiko.SSHClient] = []
        self._home: str | None = None
        self._sftp_client: paramiko.SFTPClient | None = None
        self._sftp_lock = threading.Lock()
        self._lock = threading.Lock()
        self.accepted_fingerprints: list[str] = []
        self._worked: dict[str, str] = {}  # hop name -> the unlocked key that logged in there

    # -- connection -------------------------------------------------------------------------

    def _open(self, spec: HostSpec, sock: Any, label: str) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        for name, entry in load_host_keys(self.known_hosts).items():
            for key_type, key in entry.items():
                client.get_host_keys().add(name, key_type, key)
        policy = _HostKeyPolicy(label, self.known_hosts, self.accept_new, self.accept_fingerprints)
        client.set_missing_host_key_policy(policy)
        key_files = [os.path.expanduser(p) for p in spec.identity_files]
        missing = [p for p in key_files if not os.path.exists(p)]
        if missing and len(missing) == len(key_files):
            raise AuthenticationError(label, f"identity file not found: {', '.join(missing)}")
        present = [p for p in key_files if os.path.exists(p)]
        # Keys to try: the host's identity files, else the default ones (as ssh looks for them).
        candidates = present or [p for p in map(os.path.expanduser, DEFAULT_KEY_FILES)
                                 if os.path.exists(p)]
        try:
            return self._connect(client, policy, spec, sock, label, present, candidates)
        except AuthenticationError:
            # Failed with an encrypted key among those to try and no passphrase held for it:
            # connect() asks for it and tries the whole chain again.
            locked = [p for p in candidates if _unlocked_key(p) is None and key_needs_passphrase(p)]
            if locked:
                raise PassphraseRequiredError(label, locked[0]) from None
            raise

    def _connect(self, client: paramiko.SSHClient, policy: _HostKeyPolicy, spec: HostSpec,
                 sock: Any, label: str, present: list[str], candidates: list[str]) -> paramiko.SSHClient:
        timeout = spec.connect_timeout
        key_files = present
        # A key whose passphrase the user gave is opened here; paramiko takes one such key: the
        # one that worked for this host before, else the one unlocked last (just asked for).
        order = list(_passphrases)
        unlocked = [(p, k) for p in candidates if (k := _unlocked_key(p)) is not None]
        unlocked.sort(key=lambda pk: (pk[0] != self._worked.get(spec.name),
                                      -order.index(_key_path(pk[0]))))
        pkey = unlocked[0][1] if unlocked else None
        files = [p for p in present if not unlocked or p != unlocked[0][0]]
        try:
            client.connect(
                spec.address,
                port=spec.port,
                username=spec.user,
                pkey=pkey,
                key_filename=files or None,
                look_for_keys=not key_files,
                allow_agent=True,
                timeout=timeout,
                banner_timeout=timeout,
                auth_timeout=timeout,
                channel_timeout=timeout,
                sock=sock,
                transport_factory=_AeadFirst,
            )
        except paramiko.BadHostKeyException as e:
            client.close()
            raise HostKeyChangedError(
                label, hostkey_name(spec.address, spec.port), e.key, e.expected_key, self.known_hosts
            ) from None
        except paramiko.AuthenticationException as e:
            client.close()
            tried = ", ".join(key_files) if key_files else "default keys"
            raise AuthenticationError(
                label,
                f"authentication failed for {spec.user}@{spec.address}:{spec.port} "
                f"(tried {tried} and ssh-agent): {e}",
            ) from None
        except (UnknownHostKeyError, HostKeyChangedError):
            client.close()
            raise
        except TimeoutError as e:
            client.close()
            raise UnreachableError(
                label, f"{spec.address}:{spec.port} did not answer within {timeout:g}s ({e})"
            ) from None
        except (OSError, paramiko.SSHException, EOFError) as e:
            client.close()
            raise UnreachableError(label, f"cannot connect to {spec.address}:{spec.port}: {e}") from None
        if policy.accepted:
            self.accepted_fingerprints.append(policy.accepted)
        if unlocked:
            self._worked[spec.name] = unlocked[0][0]
        transport = client.get_transport()
        if transport is not None:
            # A read of the socket wakes at each of its timeouts to see whether the connection
            # was closed: ten times a second by default. Once connected, once a second does:
            # on a hub only in the middle of a message; paramiko's own thread (behind a
            # ProxyJump) also when idle, for every host (a keepalive is sent from that check).
            transport.sock.settimeout(IDLE_CHECK_S)
            if spec.keepalive > 0:
                transport.set_keepalive(max(1, int(spec.keepalive)))
        return client

    def connect(self) -> None:
        with self._lock:
            if self._client is not None and self._alive(self._client):
                return
            self._close_locked()
            asked: set[str] = set()
            while True:
                try:
                    self._connect_chain()
                    return
                except PassphraseRequiredError as e:
                    # Ask the user (once per key file while this process lives), then try
                    # again: with that key first.
                    if e.key_file in asked or not _ask_passphrase(e.host, e.key_file):
                        raise
                    asked.add(e.key_file)

    def _connect_chain(self) -> None:
        hops = [*self.jumps, self.spec]
        clients: list[paramiko.SSHClient] = []
        sock: Any = None
        try:
            self._dialing()
            sock = self._tcp(hops[0], self.name if len(hops) == 1 else f"{self.name} (via jump {hops[0].name})")
            for i, hop in enumerate(hops):
                label = self.name if hop is self.spec else f"{self.name} (via jump {hop.name})"
                if hop is self.spec:
                    self._reached()
                client = self._open(hop, sock, label)
                clients.append(client)
                if i + 1 < len(hops):
                    nxt = hops[i + 1]
                    sock = self._direct_tcpip(client, nxt, label)
        except BaseException:
            for c in clients:
                c.close()
            if sock is not None:
                sock.close()
            raise
        self._jump_clients = clients[:-1]
        self._client = clients[-1]

    @staticmethod
    def _tcp(hop: HostSpec, label: str) -> socket.socket:
        """The TCP connection to the first hop (made here, not by paramiko, so that its answer
        is seen apart from the SSH handshake)."""
        timeout = hop.connect_timeout
        try:
            return socket.create_connection((hop.address, hop.port), timeout=timeout)
        except TimeoutError as e:
            raise UnreachableError(
                label, f"{hop.address}:{hop.port} did not answer within {timeout:g}s ({e})") from None
        except OSError as e:
            raise UnreachableError(label, f"cannot connect to {hop.address}:{hop.port}: {e}") from None

    def _direct_tcpip(self, client: paramiko.SSHClient, nxt: HostSpec, label: str) -> paramiko.Channel:
        transport = client.get_transport()
        assert transport is not None
        try:
            return transport.open_channel(
                "direct-tcpip", (nxt.address, nxt.port), ("127.0.0.1", 0), timeout=nxt.connect_timeout
            )
        except (paramiko.SSHException, OSError) as e:
            raise UnreachableError(
                label, f"jump host could not reach {nxt.address}:{nxt.port}: {e}"
            ) from None

    @staticmethod
    def _alive(client: paramiko.SSHClient) -> bool:
        t = client.get_transport()
        return t is not None and t.is_active()

    @property
    def connected(self) -> bool:
        c = self._client
        return c is not None and self._alive(c)

    def _close_locked(self) -> None:
        self._sftp_client = None
        if self._client is not None:
            self._client.close()
            self._client = None
        for c in reversed(self._jump_clients):
            c.close()
        self._jump_clients = []

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def _transport(self) -> paramiko.Transport:
        c = self._client
        t = c.get_transport() if c else None
        if t is None or not t.is_active():
            raise UnreachableError(self.name, "not connected")
        return t

    def peer_address(self) -> str | None:
        """The address the SSH connection reached: over a ProxyJump the socket's peer is the
        jump host, not this one, so None."""
        if self.jumps:
            return None
        try:
            peer = self._transport().getpeername()
        except (TransportError, OSError):
            return None
        return str(peer[0]).split("%")[0] if peer else None

    # -- commands ---------------------------------------------------------------------------

    def open_channel(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> paramiko.Channel:
        """Start ``argv`` and return its channel (for long-lived streams such as the agent)."""
        try:
            chan = self._transport().open_session(timeout=self.spec.connect_timeout)
            chan.exec_command(remote_command(argv, env))
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise UnreachableError(self.name, f"cannot open a session: {e}") from None
        return chan

    def open_stream(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Stream:
        return ChannelStream(self.name, self.open_channel(argv, env))

    def open_socket_stream(self, path: str) -> Stream | None:
        t = self._transport()
        if not isinstance(t, _AeadFirst):
            return None
        try:
            chan = t.open_unix_socket(path, timeout=self.spec.connect_timeout)
        except paramiko.ChannelException as e:
            log.debug("%s: no stream to %s: %s", self.name, path, e)
            return None
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise UnreachableError(self.name, f"cannot open a channel: {e}") from None
        return ChannelStream(self.name, chan)

    def run(
        self,
        argv: Sequence[str],
        *,
        input: bytes | None = None,
        timeout: float = 60.0,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        chan = self.open_channel(argv, env)
        deadline = time.monotonic() + timeout
        out, err = bytearray(), bytearray()
        try:
            if input:
                chan.sendall(input)
            chan.shutdown_write()
            while True:
                while chan.recv_ready():
                    out += chan.recv(65536)
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CommandTimeout(
                        self.name, f"{shlex.join(list(argv)[:3])}... still running after {timeout:g}s"
                    )
                if self._client is None or not self._alive(self._client):
                    raise UnreachableError(self.name, "connection lost while a command was running")
                select.select([chan], [], [], min(remaining, 0.5))
            code = chan.recv_exit_status()
        except (OSError, EOFError, paramiko.SSHException) as e:
            raise UnreachableError(self.name, f"connection lost: {e}") from None
        finally:
            chan.close()
        return CommandResult(tuple(argv), code, out.decode(errors="replace"), err.decode(errors="replace"))

    def _sftp(self) -> paramiko.SFTPClient:
        """One SFTP session per connection, opened on first use."""
        if self._sftp_client is None:
            sftp = paramiko.SFTPClient.from_transport(self._transport())
            assert sftp is not None
            sftp.get_channel().settimeout(max(30.0, self.spec.connect_timeout))
            self._sftp_client = sftp
        return self._sftp_client

    def put_file(self, local: Path, remote: str, mode: int = 0o644) -> None:
        try:
            with self._sftp_lock:
                sftp = self._sftp()
                _sftp_makedirs(sftp, os.path.dirname(remote))
                sftp.put(str(local), remote)
                sftp.chmod(remote, mode)
        except (OSError, paramiko.SSHException, EOFError) as e:
            raise TransportError(self.name, f"copy to {remote} failed: {e}") from None

    def put_data(self, data: bytes, remote: str) -> None:
        # Over the connection's SFTP session: no process on the host. Writes are pipelined, in
        # pieces that fit one SSH packet each (paramiko's 32 KiB ones take two).
        view = memoryview(data)
        try:
            with self._sftp_lock:
                sftp = self._sftp()
                with sftp.open(remote, "wb") as f:
                    f.set_pipelined(True)
                    for off in range(0, len(data), SFTP_PIECE):
                        f.write(view[off:off + SFTP_PIECE])
                size = sftp.stat(remote).st_size
        except (OSError, paramiko.SSHException, EOFError) as e:
            raise TransportError(self.name, f"copy to {remote} failed: {e}") from None
        if size != len(data):
            raise TransportError(self.name, f"copy to {remote} failed: {size} of {len(data)} bytes arrived")

    def file_size(self, path: str) -> int | None:
        try:
            with self._sftp_lock:
                return self._sftp().stat(path).st_size
        except FileNotFoundError:
            return None
        except (OSError, paramiko.SSHException, EOFError) as e:
            raise TransportError(self.name, f"cannot stat {path}: {e}") from None

    def install_checked(self, data: bytes, path: str, sha256: str, mode: int = 0o600) -> bool:
        # Over the connection's one SFTP session: a read back, and on a difference a pipelined
        # write, a read back of what landed, a chmod and a rename; a few round trips in all.
        part = f"{path}.part-{os.urandom(4).hex()}"
        try:
            with self._sftp_lock:
                sftp = self._sftp()
                if _sftp_sha256(sftp, path) == sha256:
                    return False
                _sftp_ensure_dir(sftp, os.path.dirname(path))
                with sftp.open(part, "wb") as f:
                    f.set_pipelined(True)
                    view = memoryview(data)
                    for off in range(0, len(data), SFTP_PIECE):
                        f.write(view[off:off + SFTP_PIECE])
                try:
                    got = _sftp_sha256(sftp, part)
                    if got != sha256:
                        raise TransportError(self.name, f"copy to {path} failed: it reads back with "
                                             f"sha256 {got}, not {sha256}; nothing installed")
                    sftp.chmod(part, mode)
                    sftp.posix_rename(part, path)
                except BaseException:
                    _sftp_remove_quietly(sftp, part)
                    raise
        except (OSError, paramiko.SSHException, EOFError) as e:
            raise TransportError(self.name, f"copy to {path} failed: {e}") from None
        return True

    def home(self) -> str:
        if self._home is None:
            try:
                with self._sftp_lock:
                    self._home = self._sftp().normalize(".")
            except (OSError, paramiko.SSHException, EOFError) as e:
                raise TransportError(self.name, f"cannot resolve the home directory: {e}") from None
        return self._home


def _sftp_makedirs(sftp: paramiko.SFTPClient, path: str) -> None:
    parts: list[str] = []
    p = path
    while p and p != "/":
        parts.append(p)
        p = os.path.dirname(p)
    for d in reversed(parts):
        try:
            sftp.stat(d)
        except OSError:
            sftp.mkdir(d, mode=0o700)


def _sftp_sha256(sftp: paramiko.SFTPClient, path: str) -> str | None:
    """The SHA-256 of the file at ``path`` as the host's disk holds it (read back with
    prefetch: the reads are pipelined), or None when there is none."""
    try:
        f = sftp.open(path, "rb")
    except FileNotFoundError:
        return None
    h = hashlib.sha256()
    with f:
        f.prefetch()
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _sftp_ensure_dir(sftp: paramiko.SFTPClient, path: str) -> None:
    """Make ``path`` (0700) and what it lacks above it: the deepest directory is looked at
    first, so an existing one costs one round trip, not one per level."""
    try:
        sftp.stat(path)
        return
    except FileNotFoundError:
        pass
    parent = os.path.dirname(path)
    if parent and parent != path:
        _sftp_ensure_dir(sftp, parent)
    try:
        sftp.mkdir(path, mode=0o700)
    except OSError:
        sftp.stat(path)  # made meanwhile by another connection: fine; else this raises


def _sftp_remove_quietly(sftp: paramiko.SFTPClient, path: str) -> None:
    try:
        sftp.remove(path)
    except (OSError, paramiko.SSHException, EOFError):
        pass


# ---------------------------------------------------------------------------------------------


class LocalTransport(Transport):
    """This machine, without SSH: the default one-host cluster."""

    def __init__(self, spec: HostSpec):
        super().__init__(spec)
        self._open = False

    def connect(self) -> None:
        self._open = True
        self._reached()

    def close(self) -> None:
        self._open = False

    @property
    def connected(self) -> bool:
        return self._open

    def run(
        self,
        argv: Sequence[str],
        *,
        input: bytes | None = None,
        timeout: float = 60.0,
        env: Mapping[str, str] | None = None,
    ) -> CommandResult:
        full_env = {**os.environ, **(env or {})}
        try:
            proc = subprocess.run(
                list(argv), input=input, capture_output=True, timeout=timeout, env=full_env
            )
        except subprocess.TimeoutExpired:
            raise CommandTimeout(self.name,
                                 f"{shlex.join(list(argv)[:3])}... still running after {timeout:g}s") from None
        except OSError as e:
            raise TransportError(self.name, f"cannot run {argv[0]}: {e}") from None
        return CommandResult(
            tuple(argv), proc.returncode, proc.stdout.decode(errors="replace"),
            proc.stderr.decode(errors="replace"),
        )

    def open_stream(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Stream:
        try:
            proc = subprocess.Popen(
                list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
            )
        except OSError as e:
            raise TransportError(self.name, f"cannot run {argv[0]}: {e}") from None
        return PipeStream(self.name, proc)

    def put_file(self, local: Path, remote: str, mode: int = 0o644) -> None:
        try:
            os.makedirs(os.path.dirname(remote), mode=0o700, exist_ok=True)
            shutil.copyfile(local, remote)
            os.chmod(remote, mode)
        except OSError as e:
            raise TransportError(self.name, f"copy to {remote} failed: {e}") from None

    def put_data(self, data: bytes, remote: str) -> None:
        try:
            with open(remote, "wb") as f:
                f.write(data)
        except OSError as e:
            raise TransportError(self.name, f"copy to {remote} failed: {e}") from None

    def install_checked(self, data: bytes, path: str, sha256: str, mode: int = 0o600) -> bool:
        try:
            if _file_sha256(path) == sha256:
                return False
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            part = f"{path}.part-{os.urandom(4).hex()}"
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                got = _file_sha256(part)
                if got != sha256:
                    raise TransportError(self.name, f"copy to {path} failed: it reads back with "
                                         f"sha256 {got}, not {sha256}; nothing installed")
                os.replace(part, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(part)
                raise
        except OSError as e:
            raise TransportError(self.name, f"copy to {path} failed: {e}") from None
        return True

    def home(self) -> str:
        return os.path.expanduser("~")

    def file_size(self, path: str) -> int | None:
        try:
            return os.stat(path).st_size
        except FileNotFoundError:
            return None


def _file_sha256(path: str) -> str | None:
    try:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        return h.hexdigest()
    except FileNotFoundError:
        return None


def last_json_object(text: str) -> dict[str, Any] | None:
    """The last line of a command's output that is a JSON object, or None. Helpers on the hosts
    print one such line last; whatever a login script printed before it is skipped, and a
    malformed last object means none (what came before it is not trusted instead)."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


def make_transport(inv: Inventory, spec: HostSpec, *, accept_new: bool = False,
                   accept_fingerprints: Sequence[str] = ()) -> Transport:
    """``accept_fingerprints``: host keys (SHA256:...) the user checked and accepted; one of
    them that known_hosts lacks is recorded there when a host presents it."""
    if spec.is_local:
        return LocalTransport(spec)
    return SSHTransport(spec, inv.known_hosts, accept_new=accept_new, jumps=jump_chain(inv, spec),
                        accept_fingerprints=accept_fingerprints)

