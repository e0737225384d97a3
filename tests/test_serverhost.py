"""The server's host side without the test bed: the authorized_keys line and its forced command,
the helper script's commands run locally, the server's inventory, wheels, and `rigdeck attach`.
(Against real sshd hosts: tests/test_server_setup.py.)"""

from __future__ import annotations

import base64
import json
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from agent import serverhelper
from tests.kit.fakes import LISTENER
from tui.model.inventory import HostSpec, Inventory, InventoryError, ServerSpec
from tui.model.serverlayout import ServerLayout
from tui.remote.inventoryfile import load_inventory
from tui.remote.serverhost import (
    HELPER_SOURCE,
    ServerHostError,
    authorized_key_line,
    forced_command,
    recorded_host_keys,
    server_inventory,
)
from tui.remote.serverwheels import Platform, build_wheels, local_platform, repack
from tui.remote.transport import remote_command

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJgqwaJL9f7Wf6MlQdHRjA1M4ehYIzFzfsiEo996/eK3"


# ---------------------------------------------------------------------------------------------
# The key line


def test_forced_command_is_plain_when_every_shell_reads_it_alike() -> None:
    argv = ["python3", "/home/ml/.rigdeck/agent/ab12/agent.pyz", "attach", "--state-dir",
            "/home/ml/.rigdeck"]
    assert forced_command(argv, {"RIGDECK_SIM_GPUS": "4"}) == (
        "env RIGDECK_SIM_GPUS=4 python3 /home/ml/.rigdeck/agent/ab12/agent.pyz attach "
        "--state-dir /home/ml/.rigdeck")
    assert forced_command(argv) == " ".join(argv)


@pytest.mark.parametrize("odd", ["/srv/my dir", "/srv/$HOME", "/srv/a'b", '/srv/a"b', "/srv/{a,b}",
                                 "/srv/a;b", "/srv/~x", "/srv/a!b", "/srv/a%b"])
def test_forced_command_wraps_anything_a_shell_could_read_differently(odd: str) -> None:
    argv = ["python3", f"{odd}/agent.pyz", "attach", "--state-dir", odd]
    cmd = forced_command(argv, {"X": "1"})
    assert cmd == remote_command(argv, {"X": "1"})
    encoded = cmd.split("echo ", 1)[1].split(" |", 1)[0]
    assert shlex.split(base64.b64decode(encoded).decode()) == ["exec", "env", "X=1", *argv]
    # Each login shell sshd could hand it to runs exactly these words.
    shown = forced_command(["printf", "[%s]", odd], {"X": "1"})
    for shell in ("/bin/sh", "/bin/bash", "/usr/bin/fish"):
        if os.access(shell, os.X_OK):
            out = subprocess.run([shell, "-c", shown], capture_output=True, text=True, timeout=30)
            assert out.stdout == f"[{odd}]", (shell, out.stderr)


def test_authorized_key_line_escapes_quotes_for_sshd() -> None:
    line = authorized_key_line(KEY + " someone@laptop", 'a "b" c', "rigdeck-server@h1")
    assert line == f'restrict,command="a \\"b\\" c" {KEY} rigdeck-server@h1'
    with pytest.raises(ServerHostError):
        authorized_key_line("not a key", "x", "c")
    with pytest.raises(ServerHostError):
        authorized_key_line(KEY, "x\ny", "c")
    with pytest.raises(ServerHostError):
        authorized_key_line(KEY, "x\\", "c")  # \" would swallow the closing quote


def test_sshd_reads_the_forced_command_back(tmp_path: Path) -> None:
    """OpenSSH's own parser (sshd -T can't read authorized_keys; ssh-keygen -l can check the
    line parses as a key with options)."""
    cmd = forced_command(["python3", "/x y/agent.pyz", "attach"], {"A": 'q"uote'})
    line = authorized_key_line(KEY, cmd, "rigdeck-server@h1")
    path = tmp_path / "authorized_keys"
    path.write_text(line + "\n")
    out = subprocess.run(["ssh-keygen", "-l", "-f", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "rigdeck-server@h1" in out.stdout


# ---------------------------------------------------------------------------------------------
# The helper, run here


def helper(*args: str, stdin: bytes = b"", env: dict[str, str] | None = None,
           python: str = sys.executable) -> dict:
    proc = subprocess.run([python, "-c", HELPER_SOURCE, *args], input=stdin, capture_output=True,
                          env={**os.environ, **(env or {})}, timeout=60)
    assert proc.stdout, proc.stderr
    return json.loads(proc.stdout.decode().strip().splitlines()[-1])


def test_authorize_replaces_the_servers_line_and_keeps_the_others(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home)}
    first = helper("authorize", f'restrict,command="a" {KEY} rigdeck-server@h1',
                   "rigdeck-server@h1", env=env)
    assert first["changed"] and first["removed"] == 0
    ak = home / ".ssh" / "authorized_keys"
    assert oct(ak.stat().st_mode & 0o777) == "0o600"
    assert oct((home / ".ssh").stat().st_mode & 0o777) == "0o700"
    again = helper("authorize", f'restrict,command="a" {KEY} rigdeck-server@h1',
                   "rigdeck-server@h1", env=env)
    assert again == {**again, "changed": False, "removed": 0}
    ak.write_text(ak.read_text() + "ssh-ed25519 AAAAother me@laptop\n"
                  + 'command="x" ssh-ed25519 AAAAother2 rigdeck-server@h9\n')
    new = f'restrict,command="b" {KEY} rigdeck-server@h1'
    third = helper("authorize", new, "rigdeck-server@h1", env=env)
    assert third["changed"] and third["removed"] == 1
    assert ak.read_text().splitlines() == [
        "ssh-ed25519 AAAAother me@laptop",
        'command="x" ssh-ed25519 AAAAother2 rigdeck-server@h9',  # another server's: kept
        new,
    ]


def test_write_makes_private_files(tmp_path: Path) -> None:
    out = helper("write", stdin=json.dumps({str(tmp_path / "d" / "a"): "x\n",
                                            str(tmp_path / "b"): "y"}).encode())
    assert out["ok"]
    assert (tmp_path / "d" / "a").read_text() == "x\n" and (tmp_path / "b").read_text() == "y"
    assert (tmp_path / "d" / "a").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "d").stat().st_mode & 0o777 == 0o700


def test_helper_runs_on_python_3_9(tmp_path: Path) -> None:
    from tests._require import PY39_MISSING, python39, require

    py = python39()
    require(py is not None, PY39_MISSING)
    assert py is not None
    out = helper("prepare", str(tmp_path / "srv"), python=py)
    assert out["platform"]["python"] == "3.9"
    assert out["wheels"] == {} and out["installed"] == {}
    assert helper("status", str(tmp_path / "srv"), python=py)["running"] is False


def test_tail_reads_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "log"
    assert serverhelper._tail(str(log), 5) == b""
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(10000)))
    assert serverhelper._tail(str(log), 3) == b"line 9997\nline 9998\nline 9999\n"
    log.write_bytes(b"a\nb\nc")
    assert serverhelper._tail(str(log), 2) == b"b\nc"
    assert serverhelper._tail(str(log), 0) == b""


def test_start_status_stop_here(tmp_path: Path) -> None:
    """The start/stop mechanics on this machine, with a stand-in that listens on the socket
    (the real `rigdeck serve` is exercised on the test bed)."""
    sd = tmp_path / "srv"
    layout = ServerLayout(str(sd))
    listener = [sys.executable, "-c", LISTENER, layout.socket]
    first = helper("start", str(sd), "20", json.dumps(listener))
    try:
        assert first["started"] is True and first["running"] and first["listening"]
        assert first["mode"] in ("process", "systemd")
        pid = first["pid"]
        assert (sd / "server.pid").read_text().strip() == str(pid)
        again = helper("start", str(sd), "20", json.dumps(listener))
        assert again["started"] is False and again["pid"] == pid
        st = helper("status", str(sd))
        assert st["running"] and st["listening"] and st["pid"] == pid and st["since"]
        assert b"stand-in listening" in (sd / "server.log").read_bytes()
    finally:
        stopped = helper("stop", str(sd), "5")
    assert stopped["was_running"] and not stopped["running"] and not stopped["listening"]
    assert not (sd / "server.pid").exists()
    assert helper("stop", str(sd), "5")["was_running"] is False


def test_start_reports_a_server_that_dies_or_never_listens(tmp_path: Path) -> None:
    sd = tmp_path / "srv"
    dies = [sys.executable, "-c", "import sys; print('cannot open the history'); sys.exit(3)"]
    out = helper("start", str(sd), "20", json.dumps(dies))
    assert out["started"] is False and "exited (status 3)" in out["error"]
    assert "cannot open the history" in out["log_tail"]
    hangs = [sys.executable, "-c", "import time; print('stuck', flush=True); time.sleep(60)"]
    t0 = time.monotonic()
    out = helper("start", str(sd), "1.5", json.dumps(hangs))
    assert time.monotonic() - t0 < 20
    assert out["started"] is False and "did not listen" in out["error"] and "stopped" in out["error"]
    assert "stuck" in out["log_tail"] and not out["running"]
    missing = helper("start", str(sd), "5", json.dumps([str(sd / "venv/bin/rigdeck"), "serve"]))
    assert "rigdeck server setup" in missing["error"]


# ---------------------------------------------------------------------------------------------
# The server's inventory and known_hosts


def _inventory(tmp_path: Path, body: str) -> Inventory:
    path = tmp_path / "hosts.toml"
    path.write_text('[defaults]\nssh_config = ""\nknown_hosts = "%s"\n' % (tmp_path / "kh") + body)
    return load_inventory(path)


def _with_allow_jobs(src: Path, dst: Path) -> Path:
    dst.write_text(src.read_text().replace('[server]\nhost = "h1"\n', '[server]\nhost = "h1"\nallow_jobs = true\n'))
    assert "allow_jobs" in dst.read_text()
    return dst


def test_server_inventory_reads_back_with_the_servers_key(tmp_path: Path) -> None:
    inv = _inventory(tmp_path, """
[[hosts]]
name = "h1"
address = "10.0.0.1"
labels = ["a100"]
env = { NCCL_DEBUG = "INFO" }
slots = 4

[[hosts]]
name = "h2"
address = "10.0.0.2:2222"
proxy_jump = "h1"
sim_gpus = 2
prometheus_textfile = "~/node-exporter/rigdeck.prom"

[server]
host = "h1"
""")
    layout = ServerLayout("/home/ml/.rigdeck/server")
    text = server_inventory(inv, layout, "h1")
    path = tmp_path / "server.toml"
    path.write_text(text)
    back = load_inventory(path)
    assert back.known_hosts == Path(layout.known_hosts)
    # The server knows its own host, and that no job goes there unless the operator's inventory said so.
    assert back.server is not None and (back.server.host, back.server.allow_jobs) == ("h1", False)
    assert inv.path is not None
    allowed = load_inventory(_with_allow_jobs(inv.path, tmp_path / "allowed.toml"))
    (tmp_path / "allowed-server.toml").write_text(server_inventory(allowed, layout, "h1"))
    assert load_inventory(tmp_path / "allowed-server.toml").server.allow_jobs is True  # type: ignore[union-attr]
    for before, after in zip(inv.hosts, back.hosts, strict=True):
        assert after.identity_files == (layout.key,)
        assert after.attach_only is True
        assert after.proxy_jump is None  # the restricted key cannot forward: direct
        for f in ("name", "address", "port", "user", "python", "state_dir", "labels", "slots",
                  "sim_gpus", "env", "connect_timeout", "keepalive", "prometheus_textfile"):
            assert getattr(after, f) == getattr(before, f), f
    assert [h.prometheus_textfile for h in back.hosts] == [None, "~/node-exporter/rigdeck.prom"]


def test_server_inventory_refuses_a_local_host_elsewhere(tmp_path: Path) -> None:
    inv = _inventory(tmp_path, '[[hosts]]\nname = "me"\ntransport = "local"\n\n'
                               '[[hosts]]\nname = "h1"\naddress = "a"\n\n[server]\nhost = "h1"\n')
    with pytest.raises(ServerHostError, match="'me' is this workstation"):
        server_inventory(inv, ServerLayout("/s"), "h1")


def test_recorded_host_keys_refuse_unknown_hosts(tmp_path: Path) -> None:
    (tmp_path / "kh").write_text(
        "10.0.0.1 " + KEY + "\n[10.0.0.2]:2222 " + KEY + "\n")
    inv = _inventory(tmp_path, '[[hosts]]\nname = "h1"\naddress = "10.0.0.1"\n\n'
                               '[[hosts]]\nname = "h2"\naddress = "10.0.0.2:2222"\n\n'
                               '[[hosts]]\nname = "h3"\naddress = "10.0.0.3"\n')
    assert recorded_host_keys(inv, inv.hosts[:2]) == (
        f"10.0.0.1 {KEY}\n[10.0.0.2]:2222 {KEY}\n")
    with pytest.raises(ServerHostError) as info:
        recorded_host_keys(inv, inv.hosts)
    message = str(info.value)
    assert "h3 (10.0.0.3)" in message and "never a key on first use" in message
    assert "rigdeck hosts h3 --accept-new" in message


def test_inventory_without_server_table_is_a_clear_error(tmp_path: Path) -> None:
    from tui.remote.serverhost import server_of

    inv = _inventory(tmp_path, '[[hosts]]\nname = "h1"\naddress = "a"\n')
    with pytest.raises(ServerHostError, match=r"has no \[server\] table"):
        server_of(inv)
    with pytest.raises(InventoryError):
        _inventory(tmp_path, '[[hosts]]\nname = "h1"\naddress = "a"\n[server]\nhost = "h9"\n')
    assert ServerSpec("h1").state_dir == "~/.rigdeck/server"
    assert HostSpec("a", "b").attach_only is False


# ---------------------------------------------------------------------------------------------
# Wheels


def test_platform_fits() -> None:
    here = Platform("cpython", "3.11", "linux-x86_64", "glibc", "2.36")
    assert here.fits(here)
    assert here.fits(Platform("cpython", "3.11", "linux-x86_64", "glibc", "2.39"))
    assert not here.fits(Platform("cpython", "3.11", "linux-x86_64", "glibc", "2.31"))
    assert not here.fits(Platform("cpython", "3.12", "linux-x86_64", "glibc", "2.36"))
    assert not here.fits(Platform("cpython", "3.11", "linux-aarch64", "glibc", "2.36"))
    assert not here.fits(Platform("cpython", "3.11", "linux-x86_64", "musl", "1.2"))
    assert local_platform().fits(local_platform())


def test_repacked_wheel_is_reproducible_and_complete(tmp_path: Path) -> None:
    from importlib import metadata

    dist = metadata.distribution("tomli_w")
    a = repack(dist, tmp_path / "a")
    b = repack(dist, tmp_path / "b")
    assert a.name == b.name and a.name.startswith(f"tomli_w-{dist.version}-")
    assert a.read_bytes() == b.read_bytes()
    with zipfile.ZipFile(a) as zf:
        names = zf.namelist()
        record = zf.read(next(n for n in names if n.endswith(".dist-info/RECORD"))).decode()
    assert "tomli_w/__init__.py" in names
    assert not any(n.endswith((".pyc", "INSTALLER", "direct_url.json")) for n in names)
    assert all(n in record for n in names)


def test_wheel_set_has_the_servers_dependencies_only(tmp_path: Path) -> None:
    ws = build_wheels(tmp_path / "cache")
    names = {p.name.split("-")[0].lower() for p in ws.dependencies}
    assert {"paramiko", "tomli_w", "cryptography", "bcrypt", "pynacl"} <= names
    assert not names & {"textual", "rich", "psutil", "nvidia_ml_py"}
    assert ws.rigdeck.name.startswith("rigdeck-") and ws.pip.name.startswith("pip-")
    again = build_wheels(tmp_path / "cache")  # from the cache: the same files
    assert again.files == ws.files and again.build == ws.build


# ---------------------------------------------------------------------------------------------
# rigdeck attach


class EchoServer:
    """A unix socket server that echoes, or (``close_after``) closes after that many bytes."""

    def __init__(self, path: Path, close_after: int | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(4)
        self.close_after = close_after
        self.received = bytearray()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                self.received += data
                conn.sendall(data)
                if self.close_after is not None and len(self.received) >= self.close_after:
                    return


def attach(state_dir: Path, data: bytes, timeout: float = 30) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "tui.cli", "attach", "--state-dir", str(state_dir)],
                          input=data, capture_output=True, timeout=timeout)


def test_attach_bridges_bytes_both_ways(tmp_path: Path) -> None:
    from tui.control.attach import identity_line

    server = EchoServer(tmp_path / "sock" / "server.sock")
    payload = bytes(range(256)) * 4096 + b"\n{\"id\": 1}\n"  # 1 MiB and a bit, every byte value
    proc = attach(tmp_path, payload)
    assert proc.returncode == 0, proc.stderr
    # The attach's own first line says whose session it is (here the account's: no --user).
    assert identity_line(None) == b'{"identity": {"user": null}}\n'
    assert proc.stdout == identity_line(None) + payload  # what the server sent after stdin ended still arrives
    assert bytes(server.received) == identity_line(None) + payload


def test_attach_with_a_user_says_so_before_any_byte_of_the_clients(tmp_path: Path) -> None:
    server = EchoServer(tmp_path / "sock" / "server.sock")
    claim = b'{"identity": {"user": "root"}}\n'  # a client's claim comes after, and counts for nothing
    proc = subprocess.run([sys.executable, "-m", "tui.cli", "attach", "--state-dir", str(tmp_path), "--user", "bob"],
                          input=claim, capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert bytes(server.received) == b'{"identity": {"user": "bob"}}\n' + claim


def test_attach_ends_when_the_server_closes(tmp_path: Path) -> None:
    from tui.control.attach import identity_line

    EchoServer(tmp_path / "sock" / "server.sock", close_after=len(identity_line(None)) + 5)
    proc = subprocess.Popen([sys.executable, "-m", "tui.cli", "attach", "--state-dir", str(tmp_path)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"hello")
    proc.stdin.flush()  # stdin stays open: the server's close alone ends the bridge
    try:
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
    assert proc.stdout.read() == identity_line(None) + b"hello"
    proc.stdin.close()


def test_attach_without_a_server_says_so(tmp_path: Path) -> None:
    proc = attach(tmp_path / "none", b"")
    assert proc.returncode == 1 and proc.stdout == b""
    err = proc.stderr.decode()
    assert err.count("\n") == 1 and err.startswith("rigdeck attach: no rigdeck server listens on ")
    assert str(tmp_path / "none" / "sock" / "server.sock") in err


# ---------------------------------------------------------------------------------------------
# serverhost end to end on this machine (a local-transport server host)


def _local_server(tmp_path: Path) -> Inventory:
    path = tmp_path / "hosts.toml"
    path.write_text(
        f'[[hosts]]\nname = "me"\ntransport = "local"\npython = "{sys.executable}"\n\n'
        f'[server]\nhost = "me"\nstate_dir = "{tmp_path / "srv"}"\n')
    return load_inventory(path)


@pytest.mark.timeout(120)
def test_start_logs_stop_through_serverhost_locally(tmp_path: Path) -> None:
    from tui.remote import serverhost

    inv = _local_server(tmp_path)
    layout = ServerLayout(str(tmp_path / "srv"))
    st = serverhost.status(inv)
    assert (st.host, st.running, st.set_up, st.socket) == ("me", False, False, layout.socket)
    started = serverhost.start(inv, command=[sys.executable, "-c", LISTENER, layout.socket])
    try:
        assert started.started and started.running and started.listening
        assert serverhost.attach_command(inv, serverhost.make_transport(inv, inv.hosts[0])) == [
            layout.rigdeck, "attach", "--state-dir", layout.state_dir]
        got = bytearray()
        serverhost.logs(inv, got.extend, lines=1)
        assert got.startswith(b"stand-in listening on")

        class Enough(Exception):
            pass

        followed = bytearray()
        appended: list[bool] = []

        def write(data: bytes) -> None:
            followed.extend(data)
            if b"appended" in followed:
                raise Enough
            if not appended:
                appended.append(True)
                with open(layout.log, "ab") as f:
                    f.write(b"x appended\n")

        with pytest.raises(Enough):
            serverhost.logs(inv, write, lines=1, follow=True)
        assert followed.endswith(b"x appended\n")
    finally:
        stopped, was_running = serverhost.stop(inv, timeout=5)
    assert was_running and not stopped.running


def test_start_passes_the_inventorys_metrics_listen_to_serve(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """`rigdeck server start` runs `<venv>/bin/rigdeck serve --state-dir DIR --metrics-listen
    ADDR:PORT` when the [server] table has metrics_listen (here a stand-in rigdeck that records
    its argv and listens on the socket), and says where the metrics are."""
    from tui.cli.main import main

    layout = ServerLayout(str(tmp_path / "srv"))
    path = tmp_path / "hosts.toml"
    path.write_text(
        f'[[hosts]]\nname = "me"\ntransport = "local"\npython = "{sys.executable}"\n\n'
        f'[server]\nhost = "me"\nstate_dir = "{layout.state_dir}"\nmetrics_listen = "127.0.0.1:19464"\n')
    stand_in = Path(layout.rigdeck)
    stand_in.parent.mkdir(parents=True)
    stand_in.write_text(f"#!{sys.executable}\nimport json, sys\n"
                        f"open({str(tmp_path / 'argv.json')!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
                        f"sys.argv[1:] = [{layout.socket!r}]\n" + LISTENER)
    stand_in.chmod(0o755)
    assert main(["server", "start", "--inventory", str(path)]) == 0
    try:
        out = capsys.readouterr().out
        assert "server on me: started" in out
        assert "  metrics on http://127.0.0.1:19464/metrics ([server] metrics_listen)" in out, out
        assert json.loads((tmp_path / "argv.json").read_text()) == [
            "serve", "--state-dir", layout.state_dir, "--metrics-listen", "127.0.0.1:19464"]
    finally:
        assert main(["server", "stop", "--inventory", str(path)]) == 0
    assert layout.serve_argv() == [layout.rigdeck, "serve", "--state-dir", layout.state_dir]  # without: none


def test_the_helper_fits_on_one_command_line() -> None:
    # One argv word of `sh -c` on the host: Linux takes at most 128 KiB per word.
    assert len(remote_command(["python3", "-c", HELPER_SOURCE, "status", "/x"])) < 100_000


def test_install_plans(tmp_path: Path) -> None:
    """Offline: only the wheels that changed, --no-deps; another platform: the host's index for
    the dependencies, rigdeck's own wheel from here; nothing when the record matches."""
    from tui.remote import serverhost
    from tui.remote.serverwheels import WheelSet
    from tui.remote.transport import CommandResult

    files = {}
    for name in ("pip-1-py3-none-any.whl", "dep-1-py3-none-any.whl", "rigdeck-0.1-py3-none-any.whl"):
        files[name] = tmp_path / name
        files[name].write_bytes(name.encode())
    here = local_platform()
    ws = WheelSet(rigdeck=files["rigdeck-0.1-py3-none-any.whl"], pip=files["pip-1-py3-none-any.whl"],
                  dependencies=(files["dep-1-py3-none-any.whl"],), requirements=("dep>=1",),
                  version="0.1", build="b", platform=here)

    class Fake:
        name = "h"

        def __init__(self) -> None:
            self.runs: list[list[str]] = []
            self.puts: list[str] = []

        def run(self, argv, *, input=None, timeout=60.0, env=None):  # type: ignore[no-untyped-def]
            self.runs.append(list(argv))
            return CommandResult(tuple(argv), 0, '{"ok": true}\n', "")

        def put_file(self, local, remote, mode=0o644):  # type: ignore[no-untyped-def]
            self.puts.append(remote)

    def plan(installed: dict, host: Platform, there: dict | None = None) -> tuple[Fake, dict | None, str]:
        t = Fake()
        report = serverhost.SetupReport("h", "/s", "python3", "current", "", "0.1", "b")
        serverhost._install(t, "python3", ServerLayout("/s"), ws,  # type: ignore[arg-type]
                            {"wheels": there or {}, "installed": installed}, host, report,
                            lambda _: None)
        runs = [r for r in t.runs if r[3] == "install"]
        return t, (json.loads(runs[0][5]) if runs else None), report.install

    t, p, how = plan({}, here)
    assert len(t.puts) == 3 and how == "offline"
    assert p is not None and p["offline"] == ["dep-1-py3-none-any.whl", "rigdeck-0.1-py3-none-any.whl"]
    assert p["index"] == [] and p["pip"] == "pip-1-py3-none-any.whl"
    record = p["record"]
    shas = record["wheels"]
    t, p, how = plan(record, here, there=shas)
    assert t.puts == [] and p is None and how == "current"
    changed = {**record, "wheels": {**shas, "rigdeck-0.1-py3-none-any.whl": "old"}}
    t, p, _ = plan(changed, here, there=shas)
    assert p is not None and p["offline"] == ["rigdeck-0.1-py3-none-any.whl"]
    other = Platform(here.implementation, "3.99", here.platform, here.libc, here.libc_version)
    t, p, how = plan({}, other)
    assert how == "index" and p is not None
    assert p["index"] == ["dep>=1"] and p["offline"] == ["rigdeck-0.1-py3-none-any.whl"]
