"""``rigdeck web`` driven from a real browser: Debian's Chromium, headless, through Playwright.

Used by tests/test_web.py and by ``python -m tests.webpage [OUT.png]``, which saves the hosts
view as the browser draws it (screenshots/web-hosts.png by default; ``make screenshots`` runs it).

What the page shows is read from the page's own terminal (xterm.js): an init script keeps the
terminal object that textual-serve's page creates, and the screen's rows are read from its
buffer, which is what xterm.js draws onto the canvas.

Chromium runs with the flags this closed network needs (no background connections, no
component updates, no sync, no QUIC) and a fresh profile; Playwright is told where it is, so no
browser is downloaded (never run ``playwright install`` here). ``$RIGDECK_CHROMIUM`` names
another Chromium binary (default: ``chromium`` on PATH, Debian's /usr/bin/chromium).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("RIGDECK_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
VIEWPORT = {"width": 1400, "height": 860}

# Runs before the page's scripts: the first object given a ``terminal`` that is an xterm.js
# Terminal (textual-serve's page does ``this.terminal = new Terminal(...)``) is kept on window.
KEEP_TERMINAL = """
Object.defineProperty(Object.prototype, "terminal", {
  configurable: true,
  get() { return undefined; },
  set(value) {
    Object.defineProperty(this, "terminal",
      {value, writable: true, configurable: true, enumerable: true});
    if (value && value.buffer && typeof value.loadAddon === "function") {
      window.__rigdeckTerminal = value;
    }
  },
});
"""

# The terminal's visible rows as text, or null before the terminal exists.
SCREEN_TEXT = """
() => {
  const t = window.__rigdeckTerminal;
  if (!t) return null;
  const b = t.buffer.active, rows = [];
  for (let i = 0; i < t.rows; i++) {
    const line = b.getLine(b.viewportY + i);
    rows.push(line ? line.translateToString(true) : "");
  }
  return rows.join("\\n");
}
"""


def chromium_missing() -> str | None:
    """Why the browser test cannot run here, or None when it can."""
    if not os.path.exists(CHROMIUM):
        return "chromium is not installed (Debian: apt-get install chromium; make test does)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright Python package is not installed (pip install -e '.[test]')"
    return None


def free_port() -> int:
    """A loopback port free now, outside the kernel's range for outgoing connections (as the
    agent picks a job's MASTER_PORT): one inside it could be taken by another test's connection
    before the server binds it."""
    from agent.jobs import probe_port

    return probe_port("127.0.0.1")


@contextlib.contextmanager
def process_for_the_test(argv: list[str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` in its own session, its output in ``log_path``, for the ``with`` block: then
    SIGTERM, SIGKILL after 30 s (a loopback server a test starts: Prometheus, node_exporter)."""
    with log_path.open("w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def write_local_inventory(dir: Path, name: str = "here", sim_gpus: int = 0) -> Path:
    """A one-host inventory: this machine, reached without SSH, its agent's state under ``dir``."""
    inv = dir / "hosts.toml"
    sim = f"sim_gpus = {sim_gpus}\n" if sim_gpus else ""
    inv.write_text(
        "[[hosts]]\n"
        f'name = "{name}"\naddress = "localhost"\ntransport = "local"\npython = "{sys.executable}"\n'
        f'state_dir = "{dir / "state"}"\n{sim}'
    )
    return inv


class WebServer:
    """A running ``rigdeck web`` (its own process group), its URL and token once it printed
    them."""

    def __init__(self, inventory: Path, port: int, extra: list[str] | None = None) -> None:
        self.port = port
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tui.cli", "web", "--inventory", str(inventory),
             "--port", str(port), *(extra or [])],
            cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.base = f"http://127.0.0.1:{port}"  # the server, no token
        self.url = ""  # the URL it printed, its token included (wait_listening reads it)
        self.token = ""

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def wait_listening(self, timeout: float = 30.0) -> str:
        """Waits for the line that says where it serves, and takes its URL (``url``, ``token``)
        from there; returns the output so far."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.output()
            served = re.search(r"serving the app on (\S+/\?token=(\S+)) ", out)
            if served:
                self.url, self.token = served.group(1), served.group(2)
                return out
            if self.proc.poll() is not None:
                raise RuntimeError(f"rigdeck web exited {self.proc.returncode}:\n{out}")
            time.sleep(0.1)
        raise TimeoutError(f"rigdeck web did not start in {timeout}s:\n{self.output()}")

    def app_pids(self) -> list[int]:
        """The session apps: this server's child processes."""
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(self.proc.pid)],
                             capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def stop(self, timeout: float = 20.0) -> int:
        """SIGINT, as Ctrl+C; returns its exit status (SIGKILL to the group if it hangs)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise


@contextlib.contextmanager
def browser() -> Iterator[Any]:
    """A headless Chromium (a Playwright browser context) with a fresh profile."""
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="rigdeck-chromium-")
    try:
        with sync_playwright() as pw:
            ctx = pw.chromium.launch_persistent_context(
                profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
                viewport=VIEWPORT,  # type: ignore[arg-type]
            )
            try:
                ctx.add_init_script(KEEP_TERMINAL)
                yield ctx
            finally:
                ctx.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def open_page(ctx: Any, url: str) -> Any:
    """A new tab of ``ctx`` with ``url`` open."""
    page = ctx.new_page()
    page.goto(url, wait_until="domcontentloaded")
    return page


def screen_text(page: Any) -> str:
    return page.evaluate(SCREEN_TEXT) or ""


def wait_for_text(page: Any, *needles: str, timeout: float = 60.0) -> str:
    """Waits until the terminal's screen holds every one of ``needles``; returns the screen."""
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = screen_text(page)
        if all(n in text for n in needles):
            return text
        time.sleep(0.2)
    raise TimeoutError(f"the page never showed {needles!r}; its screen:\n{text}")


def screenshot(out: Path) -> None:
    """The hosts view of ``rigdeck web`` on this machine (4 simulated GPUs), as a PNG."""
    with tempfile.TemporaryDirectory(prefix="rigdeck-web-") as tmp:
        inv = write_local_inventory(Path(tmp), name="workstation", sim_gpus=4)
        server = WebServer(inv, free_port())
        try:
            server.wait_listening()
            with browser() as ctx:
                page = open_page(ctx, server.url)
                # The host's row once probed: its GPUs, marked simulated.
                wait_for_text(page, "Hosts 1", "workstation", "simulated")
                time.sleep(2.0)  # a telemetry tick or two, so the row is filled in
                out.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(out))
        finally:
            server.stop()
            stop_agents(Path(tmp))
    print(f"wrote {out}")


def stop_agents(state_root: Path) -> None:
    """The agent daemon the app started for the local host (it outlives apps by design)."""
    for pid_file in state_root.glob("**/run/daemon.pid"):
        with contextlib.suppress(ValueError, OSError):
            os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)


if __name__ == "__main__":
    why = chromium_missing()
    if why:
        raise SystemExit(why)
    screenshot(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "screenshots" / "web-hosts.png")
