"""`rigdeck server setup|start|stop|status|logs` against real sshd hosts (test bed).

One 3-host bed for the whole module (root's login shell on h3 is fish, so the forced command in
authorized_keys goes through a shell that is not POSIX sh). The server lives on h1; each host has
its own ~/.ssh, so the server's key line lands on each host separately. The bed's hosts cannot
reach any package index: the install is offline by construction.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._require import require
from tests.conftest import fish_bed
from tests.kit.fakes import LISTENER
from tests.testbed import TestBed
from tui.cli.main import main as rigdeck_main
from tui.control import serveradmin
from tui.model.inventory import Inventory
from tui.remote.inventoryfile import load_inventory
from tui.remote.serverhost import key_comment

pytestmark = pytest.mark.testbed

SERVER_DIR = "/root/.rigdeck/server"  # on h1 (the bed binds h1's state dir over /root/.rigdeck)
VENV = f"{SERVER_DIR}/venv"


@pytest.fixture(scope="module")
def bed() -> Iterator[TestBed]:
    with fish_bed(3, sim_gpus=2) as b:
        yield b


def _with_server(bed: TestBed, name: str, server: str, **defaults: object) -> Path:
    path = bed.write_inventory(bed.root / name, **defaults)
    with open(path, "a") as f:
        f.write("\n[server]\n" + server + "\n")
    return path


@pytest.fixture(scope="module")
def inv_path(bed: TestBed) -> Path:
    return _with_server(bed, "server-hosts.toml", 'host = "h1"')


@pytest.fixture(scope="module")
def inv(inv_path: Path) -> Inventory:
    return load_inventory(inv_path)


@pytest.fixture(scope="module")
def first_setup(inv: Inventory) -> serveradmin.SetupReport:
    steps: list[str] = []
    report = serveradmin.setup(inv, progress=steps.append)
    assert steps, "setup says what it does"
    return report


def on_h1(bed: TestBed, *argv: str, input: str | None = "", timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return bed.exec(1, list(argv), input=input, timeout=timeout)


def server_ssh(bed: TestBed, host: int, *command: str, extra: tuple[str, ...] = ()) -> list[str]:
    """ssh from h1 to ``host`` with the server's own key and known_hosts (no user config)."""
    return ["ssh", "-F", "/dev/null", "-i", f"{SERVER_DIR}/id_ed25519", "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={SERVER_DIR}/known_hosts", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", *extra,
            f"root@{bed.host(host).address}", *command]


def server_lines(bed: TestBed, host: int) -> list[str]:
    text = (bed.host(host).dot_ssh / "authorized_keys").read_text()
    return [ln for ln in text.splitlines() if ln.split()[-1:] == [key_comment("h1")]]


# ---------------------------------------------------------------------------------------------


def test_setup_refuses_a_host_whose_key_is_not_recorded(bed: TestBed) -> None:
    partial = bed.root / "known_hosts.partial"
    h2 = bed.host(2)
    partial.write_text("".join(ln + "\n" for ln in bed.known_hosts.read_text().splitlines()
                               if not ln.startswith(h2.address + " ")))
    path = _with_server(bed, "refused.toml", 'host = "h1"\nstate_dir = "~/.rigdeck/refused"',
                        known_hosts=str(partial))
    with pytest.raises(serveradmin.ServerHostError) as info:
        serveradmin.setup(load_inventory(path))
    message = str(info.value)
    assert f"no recorded host key for h2 ({h2.address})" in message
    assert "never a key on first use" in message and "--accept-new" in message
    assert not (bed.host(1).state_dir / "refused").exists()  # refused before touching anything
    # The CLI: one line on stderr, exit 1.
    code = rigdeck_main(["server", "setup", "--inventory", str(path)])
    assert code == 1


def test_setup_installs_the_server_offline(
    bed: TestBed, first_setup: serveradmin.SetupReport
) -> None:
    r = first_setup
    assert (r.host, r.state_dir, r.install) == ("h1", SERVER_DIR, "offline")
    assert r.key_created and r.public_key.startswith("ssh-ed25519 ")
    assert r.authorized == {"h1": "added", "h2": "added", "h3": "added"}
    help_ = on_h1(bed, f"{VENV}/bin/rigdeck", "--help")
    assert help_.returncode == 0, help_.stderr
    assert "server" in help_.stdout and "attach" in help_.stdout
    # Headless: the server's venv has paramiko and tomli-w, not the terminal UI.
    probe = on_h1(bed, f"{VENV}/bin/python", "-c",
                  "import importlib.util as u, json; print(json.dumps({m: u.find_spec(m) is not None"
                  " for m in ('paramiko', 'tomli_w', 'textual', 'rich')}))")
    assert json.loads(probe.stdout) == {"paramiko": True, "tomli_w": True, "textual": False,
                                        "rich": False}
    # The private key never left h1: it is there, 0600, and nowhere else in the bed.
    h1_state = bed.host(1).state_dir / "server"
    assert (h1_state / "id_ed25519").stat().st_mode & 0o777 == 0o600
    assert (h1_state / "id_ed25519.pub").read_text().split()[:2] == r.public_key.split()
    assert h1_state.stat().st_mode & 0o777 == 0o700
    for h in bed.hosts[1:]:
        assert not (h.state_dir / "server").exists()
    # known_hosts: the operator's recorded keys, one per host; the inventory reads back.
    kh = (h1_state / "known_hosts").read_text().splitlines()
    assert sorted(kh) == sorted(f"{h.address} {h.public_key}" for h in bed.hosts)
    server_inv = load_inventory(h1_state / "inventory.toml")
    assert server_inv.names == ["h1", "h2", "h3"]
    assert all(h.attach_only and h.identity_files == (f"{SERVER_DIR}/id_ed25519",)
               for h in server_inv.hosts)
    assert server_inv.known_hosts == Path(f"{SERVER_DIR}/known_hosts")


def test_the_key_line_is_restricted_to_the_agents_attach(
    bed: TestBed, first_setup: serveradmin.SetupReport
) -> None:
    for i in (1, 2, 3):
        lines = server_lines(bed, i)
        assert len(lines) == 1, lines
        line = lines[0]
        assert line.startswith('restrict,command="'), line
        assert " attach --state-dir /root/.rigdeck" in line and "agent.pyz" in line
        assert "RIGDECK_SIM_GPUS=2" in line  # the agent's environment, as the controller's
        assert first_setup.public_key in line


def test_the_server_key_runs_the_attach_and_nothing_else(
    bed: TestBed, first_setup: serveradmin.SetupReport
) -> None:
    for i in (2, 3):  # h3: root's login shell is fish
        out = on_h1(bed, *server_ssh(bed, i, "id"))
        assert "uid=" not in out.stdout, out.stdout
        assert out.returncode == 0, out.stderr  # the attach ran, saw stdin end, and left
        # Whatever is asked for, the attach runs instead.
        shadow = on_h1(bed, *server_ssh(bed, i, "cat", "/etc/shadow"))
        assert "root:" not in shadow.stdout
        # No forwarding either (restrict): a direct-tcpip channel is refused.
        fwd = on_h1(bed, *server_ssh(bed, i, extra=("-W", f"{bed.host(i).address}:22")),
                    timeout=30)
        assert fwd.returncode != 0 and "SSH-2.0" not in fwd.stdout
        assert "prohibited" in fwd.stderr, fwd.stderr


def test_the_server_reaches_every_agent_with_its_own_credentials(
    bed: TestBed, first_setup: serveradmin.SetupReport
) -> None:
    """From h1, with the server's installed rigdeck, inventory, key and known_hosts: an agent
    stream to every host (whatever command is asked for, the key's forced attach runs)."""
    script = (
        "import json\n"
        "from tui.remote.inventoryfile import load_inventory\n"
        "from tui.remote.transport import make_transport\n"
        "from tui.remote.agentlink import AgentLink\n"
        f"inv = load_inventory('{SERVER_DIR}/inventory.toml')\n"
        "out = {}\n"
        "for h in inv.hosts:\n"
        "    t = make_transport(inv, h); t.connect()\n"
        "    link = AgentLink(h.name, t.open_stream(['true']))\n"
        "    out[h.name] = link.handshake(20, client='server-test').get('pid')\n"
        "    link.close(); t.close()\n"
        "print(json.dumps(out))\n"
    )
    res = on_h1(bed, f"{VENV}/bin/python", "-c", script, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    pids = json.loads(res.stdout.strip().splitlines()[-1])
    assert sorted(pids) == ["h1", "h2", "h3"] and all(isinstance(p, int) for p in pids.values())


def test_setup_twice_duplicates_nothing(
    bed: TestBed, inv_path: Path, first_setup: serveradmin.SetupReport,
    capsys: pytest.CaptureFixture[str],
) -> None:
    h3_keys = bed.host(3).dot_ssh / "authorized_keys"
    stale = f'restrict,command="old" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIold {key_comment("h1")}'
    other = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIother someone@laptop"
    h3_keys.write_text(h3_keys.read_text() + other + "\n" + stale + "\n")
    capsys.readouterr()
    assert rigdeck_main(["server", "setup", "--json", "--inventory", str(inv_path)]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["install"] == "current" and again["wheels_copied"] == []
    assert not again["key_created"] and again["public_key"] == first_setup.public_key
    assert again["authorized"] == {"h1": "current", "h2": "current", "h3": "replaced"}
    for i in (1, 2, 3):
        assert len(server_lines(bed, i)) == 1
    assert other in h3_keys.read_text().splitlines()  # someone else's key is left alone
    assert stale not in h3_keys.read_text()


def test_no_host_listens_on_anything_but_sshd(
    bed: TestBed, first_setup: serveradmin.SetupReport
) -> None:
    require(shutil.which("ss") is not None, "ss is not installed (Debian: apt-get install iproute2)")
    for h in bed.hosts:
        out = bed.exec(h, ["ss", "-ltnH"])
        listeners = [ln.split()[3] for ln in out.stdout.splitlines() if ln.strip()]
        assert listeners == [f"{h.address}:22"], (h.name, out.stdout)




def test_start_status_logs_stop(
    bed: TestBed, inv: Inventory, inv_path: Path, first_setup: serveradmin.SetupReport,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The process mechanics with a stand-in for `rigdeck serve` (an echo server on the
    server's socket, run by the server's venv Python): detached from the SSH session, pid,
    status, a second start, `rigdeck attach` through the socket, logs, stop."""
    from tui.remote import serverhost

    stand_in = [f"{VENV}/bin/python", "-c", LISTENER, f"{SERVER_DIR}/sock/server.sock"]
    before = serveradmin.status(inv)
    assert before.set_up and not before.running and before.version == first_setup.version
    st = serverhost.start(inv, command=stand_in, timeout=20)
    try:
        assert st.started and st.running and st.listening and st.mode == "process"
        assert st.socket == f"{SERVER_DIR}/sock/server.sock"
        # The SSH session that started it is gone; it still runs, in its own session.
        again = serverhost.start(inv, command=stand_in, timeout=20)
        assert again.started is False and again.pid == st.pid
        now = serveradmin.status(inv)
        assert now.running and now.listening and now.pid == st.pid and now.since
        sid = bed.exec(1, ["ps", "-o", "sid=", "-p", str(now.pid)]).stdout.strip()
        assert sid == str(now.pid)  # setsid: the leader of its own session
        # rigdeck attach, on h1, through the socket: byte for byte, after its own first line
        # naming the person (none: the server account's own login, not a forced command).
        echo = on_h1(bed, f"{VENV}/bin/rigdeck", "attach", "--state-dir", SERVER_DIR,
                     input='{"id": 1, "x": "\\u00e9"}\n')
        assert echo.returncode == 0, echo.stderr
        assert echo.stdout == '{"identity": {"user": null}}\n{"id": 1, "x": "\\u00e9"}\n', echo.stdout
        # The CLI's status, both ways.
        assert rigdeck_main(["server", "status", "--json", "-i", str(inv_path)]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["running"] and shown["listening"] and shown["pid"] == st.pid
        assert set(shown) == {"host", "state_dir", "socket", "log", "running", "listening", "pid",
                              "since", "mode", "version", "build", "set_up"}  # docs/contracts.md
        assert rigdeck_main(["server", "logs", "-n", "5", "-i", str(inv_path)]) == 0
        assert "stand-in listening on" in capsys.readouterr().out
        # Still no TCP listener anywhere.
        assert bed.exec(1, ["ss", "-ltnH"]).stdout.count("LISTEN") == 1
    finally:
        stopped, was_running = serveradmin.stop(inv, timeout=5)
    assert was_running and not stopped.running and not stopped.listening
    assert bed.exec(1, ["kill", "-0", str(st.pid)]).returncode != 0
    assert serveradmin.stop(inv)[1] is False
    assert rigdeck_main(["server", "status", "-i", str(inv_path)]) == 1
    assert "not running" in capsys.readouterr().out
    # With the server gone, attach says so and exits 1.
    gone = on_h1(bed, f"{VENV}/bin/rigdeck", "attach", "--state-dir", SERVER_DIR, input="x\n")
    assert gone.returncode == 1 and "no rigdeck server listens" in gone.stderr


def test_start_shows_the_log_tail_when_the_server_does_not_come_up(
    bed: TestBed, inv: Inventory, first_setup: serveradmin.SetupReport
) -> None:
    from tui.remote import serverhost

    broken = [f"{VENV}/bin/python", "-c", "import sys; print('no inventory here'); sys.exit(2)"]
    with pytest.raises(serveradmin.ServerHostError) as info:
        serverhost.start(inv, command=broken, timeout=20)
    message = str(info.value)
    assert message.startswith("h1: the server exited (status 2)")
    assert "server.log" in message and "no inventory here" in message
    assert not serveradmin.status(inv).running
