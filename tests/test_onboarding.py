"""Onboarding from ~/.ssh/config, against the test bed's real sshd hosts.

The app (Textual's pilot): with no inventory file and a fixture ``~/.ssh/config`` (under a
temporary HOME), the onboarding screen lists exactly the config's concrete hosts; the chosen
ones are checked for real (unknown host keys go through the host key dialog; a closed port is
unreachable); writing produces an inventory the real loader reads back; skipping writes nothing.

The CLI (``rigdeck inventory add``, run as a process): success with a host key accepted by
fingerprint, a duplicate name, an unknown key refused (nothing written), and a
passphrase-protected key unlocked at the terminal's prompt (a pty), the passphrase found in
no file written and in no output or log.
"""

from __future__ import annotations

import base64
import hashlib
import os
import pty
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable

from tests import bedclean
from tests.kit.pilot import until
from tests.testbed import TestBed
from tui.app.screens.dialogs import TrustHostKey
from tui.app.screens.onboarding import OnboardingScreen, PassphraseDialog
from tui.app.shell import RigdeckApp
from tui.app.widgets.keybar import KeyBar
from tui.client import (
    InProcessClient,
    forget_passphrases,
    load_inventory,
    onboarding_offer,
    set_passphrase_prompt,
)

pytestmark = pytest.mark.testbed


async def settled(pilot: Pilot[None], cond: Callable[[], object]) -> None:
    """The kit's wait with this file's bound: a host's key and an SSH check can take 30 s."""
    await until(pilot, cond, 30.0)


ROOT = Path(__file__).resolve().parent.parent
SIZE = (140, 36)
CLOSED_PORT = 2  # nothing listens there on a bed host: connection refused


def fingerprint_of(public_key: str) -> str:
    """OpenSSH's SHA256 fingerprint of "type base64" (as ssh-keygen -lf prints it)."""
    blob = base64.b64decode(public_key.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def write_ssh_config(home: Path, bed: TestBed, extra: str = "") -> Path:
    """A user's ~/.ssh/config: wildcard and negated patterns, three bed hosts (one under two
    names on one Host line), and one whose port is closed."""
    h1, h2, h3 = bed.hosts[:3]
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    path = ssh / "config"
    path.write_text(f"""\
# the user's own ssh config
Host *
    ServerAliveInterval 30
    IdentityFile {bed.user_key}

Host gpu-a
    HostName {h1.address}
    User root

Host gpu-b gpu-b-alias
    HostName {h2.address}
    Port 22
    User root

Host *.corp !gpu-c
    User nobody

Host gpu-c
    HostName {h3.address}
    User root

Host gone
    HostName {h1.address}
    Port {CLOSED_PORT}
    User root
{extra}""")
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, testbed: TestBed) -> Iterator[Path]:
    """A fresh HOME (no inventory, empty known_hosts) with the fixture ssh config."""
    h = tmp_path / "home"
    h.mkdir()
    write_ssh_config(h, testbed)
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.delenv("RIGDECK_INVENTORY", raising=False)
    monkeypatch.delenv("RIGDECK_SERVER", raising=False)
    forget_passphrases()
    before = set(threading.enumerate())
    yield h
    set_passphrase_prompt(None)
    forget_passphrases()
    # The app's host links may still be connecting when it quits (the monitor's stop waits 2 s):
    # one that then deploys this machine's agent starts its daemon after the app is gone. Let
    # the monitor's setup threads end before the daemons are stopped, or one outlives the test.
    # (The SSH hub's threads serve the whole process: they are not waited for.)
    deadline = time.monotonic() + 30
    for t in set(threading.enumerate()) - before:
        if t.name.startswith("monitor"):
            t.join(max(0.0, deadline - time.monotonic()))
    # Hosts onboarded here have no `sim_gpus` (as a user adds them): a check that started the
    # daemon of one of the bed's hosts started it without the bed's simulated GPUs.
    bedclean.stop_misconfigured_daemons(testbed)
    bedclean.stop_daemons_under(h)  # the app's local one-host cluster's agent, under this HOME


def inventory_file(home: Path) -> Path:
    return home / ".config" / "rigdeck" / "hosts.toml"


def app_as_the_cli_makes_it() -> RigdeckApp:
    """What `rigdeck` with no arguments builds (tui/main.py open_app, from tui/cli/main.py _run_app)."""
    return RigdeckApp(InProcessClient(load_inventory()), onboarding=onboarding_offer())


def rows(screen: OnboardingScreen) -> dict[str, list[str]]:
    table = screen.query_one("#onboard-table", DataTable)
    return {str(key.value): [str(c) for c in table.get_row(key)] for key in table.rows}


async def pick(pilot: Pilot[None], screen: OnboardingScreen, names: list[str]) -> None:
    table = screen.query_one("#onboard-table", DataTable)
    for name in names:
        table.move_cursor(row=screen.names.index(name))
        await pilot.press("space")


async def test_onboarding_lists_the_concrete_hosts_checks_them_and_writes_the_inventory(
        home: Path, testbed: TestBed) -> None:
    app = app_as_the_cli_makes_it()
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot, lambda: isinstance(app.screen, OnboardingScreen))
        screen = app.screen
        assert isinstance(screen, OnboardingScreen)
        # Exactly the concrete names, in file order: no "*", "*.corp" or "!gpu-c".
        assert list(rows(screen)) == ["gpu-a", "gpu-b", "gpu-b-alias", "gpu-c", "gone"]
        assert all(r[3] == "not checked" for r in rows(screen).values())

        await pick(pilot, screen, ["gpu-a", "gpu-b", "gpu-c", "gone"])
        await pilot.press("enter")
        # gpu-a, gpu-b and gpu-c present keys that the (empty) known_hosts lacks: a dialog each.
        asked: dict[str, str] = {}
        for _ in range(3):
            await settled(pilot, lambda: isinstance(app.screen, TrustHostKey))
            dialog = app.screen
            assert isinstance(dialog, TrustHostKey), rows(screen)
            asked[dialog.host] = dialog.key.fingerprint or ""
            await pilot.press("n" if dialog.host == "gpu-c" else "y")
            await pilot.pause(0.1)
        h1, h2, h3 = testbed.hosts[:3]
        assert asked == {"gpu-a": fingerprint_of(h1.public_key), "gpu-b": fingerprint_of(h2.public_key),
                         "gpu-c": fingerprint_of(h3.public_key)}
        await settled(pilot, lambda: rows(screen)["gpu-a"][3].startswith("ok")
                    and rows(screen)["gpu-b"][3].startswith("ok")
                    and not rows(screen)["gone"][3].startswith(("not", "checking")))
        result = {n: r[3] for n, r in rows(screen).items()}
        assert result["gpu-a"].startswith(f"ok: {h1.hostname}, Python 3."), result
        assert result["gpu-b"].startswith(f"ok: {h2.hostname}, Python 3."), result
        assert result["gpu-c"].startswith("key refused"), result
        assert result["gone"].startswith("unreachable:") and str(CLOSED_PORT) in result["gone"], result
        assert result["gpu-b-alias"] == "not checked"  # not selected
        # Only the accepted keys were recorded.
        known = (home / ".ssh" / "known_hosts").read_text()
        assert h1.address in known and h2.address in known and h3.address not in known

        await pilot.press("w")
        await settled(pilot, lambda: not isinstance(app.screen, OnboardingScreen))
        written = inventory_file(home)
        assert app.client.inventory.path == written  # the app goes on with it
        assert app.sub_title == str(written)

    inv = load_inventory(written)  # the real loader
    assert [(h.name, h.address, h.port, h.user) for h in inv.hosts] == [
        ("gpu-a", h1.address, 22, "root"), ("gpu-b", h2.address, 22, "root")]
    assert all(h.identity_files == (str(testbed.user_key),) for h in inv.hosts)


async def test_skipping_onboarding_writes_nothing_and_goes_on_with_this_machine(
        home: Path) -> None:
    app = app_as_the_cli_makes_it()
    async with app.run_test(size=SIZE) as pilot:
        await settled(pilot, lambda: isinstance(app.screen, OnboardingScreen))
        screen = app.screen
        assert isinstance(screen, OnboardingScreen)
        await pick(pilot, screen, ["gpu-a"])
        await pilot.press("l", "3")  # the app's keys (launch, views) are off: no cluster yet
        await pilot.pause(0.2)
        assert app.screen is screen
        bar = screen.query_one(KeyBar).text  # and out of the key bar: the screen's keys are in
        assert "w Write inventory" in bar and "esc Skip" in bar and "q Quit" in bar
        assert "Launch" not in bar
        await pilot.press("escape")
        await settled(pilot, lambda: not isinstance(app.screen, OnboardingScreen))
        assert not isinstance(app.screen, OnboardingScreen)
        await settled(pilot, lambda: "Launch" in app.screen.query_one(KeyBar).text)
        assert "l Launch" in app.screen.query_one(KeyBar).text  # the app's keys are back
        assert app.client.inventory.path is None  # this machine alone, as without onboarding
        assert [h.transport for h in app.client.inventory.hosts] == ["local"]
    assert not inventory_file(home).exists()
    assert not (home / ".config" / "rigdeck").exists()
    assert not (home / ".ssh" / "known_hosts").exists()


async def test_onboarding_asks_a_keys_passphrase_in_a_password_dialog(home: Path, testbed: TestBed) -> None:
    secret = "s3cretpass9"
    key = home / ".ssh" / "id_locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", secret, "-f", str(key)], check=True)
    h3 = testbed.hosts[2]
    (home / ".ssh" / "config").write_text(
        f"Host locked\n    HostName {h3.address}\n    User root\n    IdentityFile {key}\n")
    authorized = h3.dot_ssh / "authorized_keys"
    before = authorized.read_text()
    authorized.write_text(before + Path(f"{key}.pub").read_text())
    try:
        app = app_as_the_cli_makes_it()
        async with app.run_test(size=SIZE) as pilot:
            await settled(pilot, lambda: isinstance(app.screen, OnboardingScreen))
            screen = app.screen
            assert isinstance(screen, OnboardingScreen) and screen.names == ["locked"]
            await pilot.press("space", "enter")
            await settled(pilot, lambda: isinstance(app.screen, TrustHostKey))
            await pilot.press("y")
            await settled(pilot, lambda: isinstance(app.screen, PassphraseDialog))
            dialog = app.screen
            assert isinstance(dialog, PassphraseDialog) and dialog.key_file == str(key)
            await pilot.press(*secret)
            # A password field: what is shown is not what was typed.
            assert secret not in str(dialog.query_one("#passphrase-input").render())
            await pilot.press("enter")
            await settled(pilot, lambda: rows(screen)["locked"][3].startswith("ok"))
            assert rows(screen)["locked"][3].startswith(f"ok: {h3.hostname}"), rows(screen)
            await pilot.press("w")
            await settled(pilot, lambda: not isinstance(app.screen, OnboardingScreen))
    finally:
        authorized.write_text(before)
    assert load_inventory(inventory_file(home)).get("locked").identity_files == (str(key),)
    for f in home.rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f


def test_no_onboarding_when_an_inventory_exists_or_the_config_has_no_concrete_host(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    offer = onboarding_offer()
    assert offer is not None and [c.name for c in offer.candidates] == [
        "gpu-a", "gpu-b", "gpu-b-alias", "gpu-c", "gone"]
    assert onboarding_offer(str(home / "elsewhere.toml")) is None  # an inventory was named
    inventory_file(home).parent.mkdir(parents=True)
    inventory_file(home).write_text("")
    assert onboarding_offer() is None
    inventory_file(home).unlink()
    # A Host block that does not resolve is left out (and said why); the others are offered.
    (home / ".ssh" / "config").write_text(
        "Host good\n    HostName 192.0.2.1\nHost bad\n    HostName 192.0.2.2\n    Port 99999\n")
    offer = onboarding_offer()
    assert offer is not None and [c.name for c in offer.candidates] == ["good"]
    assert len(offer.skipped) == 1 and "'bad'" in offer.skipped[0] and "'Port'" in offer.skipped[0]
    (home / ".ssh" / "config").write_text("Host *\n    User root\nHost !x *.y\n    Port 2\n")
    assert onboarding_offer() is None


# ---------------------------------------------------------------------------------------------
# rigdeck inventory add


def rigdeck(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home)}
    env.pop("RIGDECK_INVENTORY", None)
    return subprocess.run([sys.executable, "-m", "tui.cli", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)


def test_inventory_add_checks_the_host_and_appends_it(home: Path, testbed: TestBed) -> None:
    h1 = testbed.hosts[0]
    target = inventory_file(home)
    target.parent.mkdir(parents=True)
    target.write_text("# my hosts\n[defaults]\nconnect_timeout = 5.0\n\n"
                      "[[hosts]]\nname = \"laptop\"\ntransport = \"local\"\n")
    r = rigdeck(home, "inventory", "add", "gpu-a", "--accept-fingerprint", fingerprint_of(h1.public_key))
    assert r.returncode == 0, r.stderr
    assert f"added gpu-a to {target}" in r.stdout
    assert f"gpu-a: reachable ({h1.hostname}), Python 3." in r.stdout
    text = target.read_text()
    assert text.startswith("# my hosts\n[defaults]\nconnect_timeout = 5.0\n")  # kept as it was
    inv = load_inventory(target)
    assert inv.names == ["laptop", "gpu-a"]
    a = inv.get("gpu-a")
    assert (a.address, a.port, a.user, a.connect_timeout) == (h1.address, 22, "root", 5.0)
    assert f"{h1.address} {h1.public_key}" in (home / ".ssh" / "known_hosts").read_text()
    assert not list(target.parent.glob(".*.tmp"))  # the temporary file was renamed

    # The same name again: refused before anything is reached, the file untouched.
    r = rigdeck(home, "inventory", "add", "gpu-a", "--address", testbed.hosts[1].address)
    assert r.returncode == 2
    assert str(target) in r.stderr and "'gpu-a'" in r.stderr and "already" in r.stderr
    assert target.read_text() == text

    # Options win over the ssh config; a host not in the config at all works with --address.
    h2 = testbed.hosts[1]
    r = rigdeck(home, "inventory", "add", "other", "-i", str(target), "--address", h2.address, "--user", "root",
                "--identity-file", str(testbed.user_key),
                "--accept-fingerprint", fingerprint_of(h2.public_key))
    assert r.returncode == 0, r.stderr
    assert load_inventory(target).get("other").address == h2.address


def test_inventory_add_refuses_an_unknown_host_key_without_acceptance(
        home: Path, testbed: TestBed) -> None:
    h2 = testbed.hosts[1]
    r = rigdeck(home, "inventory", "add", "gpu-b", "--yes")  # --yes accepts no key
    assert r.returncode == 1
    assert fingerprint_of(h2.public_key) in r.stderr  # shown, to be checked out of band
    assert "host key not accepted; nothing written" in r.stderr
    assert not inventory_file(home).exists()
    assert not (home / ".ssh" / "known_hosts").exists()
    # A fingerprint that is not the host's is no acceptance either.
    other = fingerprint_of(testbed.hosts[0].public_key)
    r = rigdeck(home, "inventory", "add", "gpu-b", "--accept-fingerprint", other)
    assert r.returncode == 1 and not inventory_file(home).exists()
    # An unreachable host: nothing written, and the error says why.
    r = rigdeck(home, "inventory", "add", "gone")
    assert r.returncode == 1
    assert f"{testbed.hosts[0].address}:{CLOSED_PORT}" in r.stderr and "nothing written" in r.stderr
    assert not inventory_file(home).exists()


def run_in_pty(home: Path, argv: list[str], answers: list[tuple[bytes, bytes]],
               timeout: float = 90.0) -> tuple[int, bytes]:
    """Run ``rigdeck argv`` on a terminal of its own; each time its output shows a prompt of
    ``answers`` (in order), type the answer. Returns the exit status and all it printed."""
    env = {**os.environ, "HOME": str(home), "TERM": "dumb"}
    env.pop("RIGDECK_INVENTORY", None)
    pid, fd = pty.fork()
    if pid == 0:  # the child: its stdin, stdout and stderr are the pty, its controlling tty
        os.chdir(ROOT)
        os.execve(sys.executable, [sys.executable, "-m", "tui.cli", *argv], env)
    out = b""
    pending = list(answers)
    seen = 0
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    data = os.read(fd, 4096)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                out += data
            if pending and pending[0][0] in out[seen:]:
                seen = out.index(pending[0][0], seen) + len(pending[0][0])
                os.write(fd, pending.pop(0)[1])
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
    assert not pending, f"never asked {pending[0][0]!r}; output:\n{out.decode(errors='replace')}"
    return os.waitstatus_to_exitcode(status), out


def test_inventory_add_asks_at_the_terminal_before_trusting_and_writing(
        home: Path, testbed: TestBed) -> None:
    h2 = testbed.hosts[1]
    fp = fingerprint_of(h2.public_key)
    trust = f"Trust ssh-ed25519 key {fp}? [y/N] ".encode()
    # No at the key's question: nothing recorded, nothing written.
    code, out = run_in_pty(home, ["inventory", "add", "gpu-b"], [(trust, b"n\n")])
    assert code == 1 and b"host key not accepted; nothing written" in out
    assert not inventory_file(home).exists() and not (home / ".ssh" / "known_hosts").exists()
    # Yes to the key, then yes to writing.
    add = f"Add gpu-b to {inventory_file(home)}? [y/N] ".encode()
    code, out = run_in_pty(home, ["inventory", "add", "gpu-b"], [(trust, b"y\n"), (add, b"y\n")])
    assert code == 0, out.decode(errors="replace")
    assert fp.encode() in out  # shown before the question
    b = load_inventory(inventory_file(home)).get("gpu-b")
    assert (b.address, b.port, b.user) == (h2.address, 22, "root")


def test_inventory_add_with_a_passphrase_protected_key(home: Path, testbed: TestBed,
                                                         tmp_path: Path) -> None:
    secret = "corr3ct horse battery"
    key = home / ".ssh" / "id_locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", secret, "-C", "locked", "-f", str(key)],
                   check=True)
    h3 = testbed.hosts[2]
    authorized = h3.dot_ssh / "authorized_keys"
    before = authorized.read_text()
    authorized.write_text(before + Path(f"{key}.pub").read_text())
    try:
        argv = ["-v", "inventory", "add", "locked", "--address", h3.address, "--user", "root",
                "--identity-file", str(key), "--accept-fingerprint", fingerprint_of(h3.public_key),
                "--yes"]
        prompt = f"Passphrase for {key}: ".encode()
        # A wrong passphrase is asked again; the right one unlocks the key.
        code, out = run_in_pty(home, argv, [(prompt, b"not it\n"), (prompt, secret.encode() + b"\n")])
    finally:
        authorized.write_text(before)
    text = out.decode(errors="replace")
    assert code == 0, text
    assert f"locked: reachable ({h3.hostname})" in text
    assert out.count(prompt) == 2  # once wrong, once right: then held, not asked again
    inv = load_inventory(inventory_file(home))
    assert inv.get("locked").identity_files == (str(key),)
    # The passphrase is nowhere: not echoed, not in the (verbose) log, not in any file written.
    assert secret.encode() not in out
    for f in home.rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f
    assert secret.encode() not in (testbed.root / "hosts" / h3.name / "sshd.log").read_bytes()


def test_inventory_add_without_a_terminal_cannot_unlock_an_encrypted_key(
        home: Path, testbed: TestBed) -> None:
    key = home / ".ssh" / "id_locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "pw", "-f", str(key)], check=True)
    h3 = testbed.hosts[2]
    r = rigdeck(home, "inventory", "add", "locked", "--address", h3.address, "--user", "root",
                "--identity-file", str(key), "--accept-fingerprint", fingerprint_of(h3.public_key))
    assert r.returncode == 1
    assert f"the key {key} is protected by a passphrase" in r.stderr
    assert not inventory_file(home).exists()


def test_two_encrypted_keys_each_asked_once_until_one_logs_in(home: Path, testbed: TestBed) -> None:
    """Only the second of two passphrase-protected keys is authorised: each passphrase is
    asked once, in turn, and a later connection asks nothing."""
    from tui.client import Onboarding

    keys = {}
    for name, secret in (("k1", "first-secret"), ("k2", "second-secret")):
        keys[name] = home / ".ssh" / name
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", secret, "-f", str(keys[name])],
                       check=True)
    secrets = {str(keys["k1"]): "first-secret", str(keys["k2"]): "second-secret"}
    asked: list[str] = []

    def prompt(key_file: str) -> str | None:
        asked.append(key_file)
        return secrets[key_file]

    h3 = testbed.hosts[2]
    authorized = h3.dot_ssh / "authorized_keys"
    before = authorized.read_text()
    authorized.write_text(before + Path(f"{keys['k2']}.pub").read_text())
    set_passphrase_prompt(prompt)
    try:
        ob = Onboarding(None, entries=[{"name": "two", "address": h3.address, "user": "root",
                                        "identity_file": [str(keys["k1"]), str(keys["k2"])]}])
        fp = fingerprint_of(h3.public_key)
        report = ob.check("two", accept_fingerprints=[fp])
        assert report.error is None, report.error
        assert asked == [str(keys["k1"]), str(keys["k2"])]
        report = ob.check("two")  # a new connection: both passphrases held, none asked
        assert report.error is None, report.error
        assert len(asked) == 2
    finally:
        authorized.write_text(before)
