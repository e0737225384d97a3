"""Where a rigdeck server keeps its files on its host: everything under one directory.

::

    <state_dir>/                 0700; the [server] table's state_dir (default ~/.rigdeck/server)
      venv/                      the server's own Python environment: rigdeck, paramiko and
                                 their dependencies (no textual, no rich: the server is headless)
      venv/rigdeck-install.json  the wheels installed there (a second setup skips pip)
      wheels/                    the wheels it was installed from, shipped by the operator
      id_ed25519, id_ed25519.pub the server's own key pair, made on the host; the private key
                                 never leaves it
      known_hosts                the operator's recorded host keys of every inventory host
      inventory.toml             the operator's inventory as the server uses it: its own key,
                                 its known_hosts, attach_only on every host
      config.toml                the operator's [notify] table: the server sends the webhook
                                 and runs the command (on its host)
      setup.json                 what setup installed (rigdeck version and build, when)
      sock/server.sock           the unix socket ``rigdeck serve`` listens on (0600, in 0700)
      server.json                how and when the running server was started (pid, mode)
      server.pid                 its pid
      server.log                 its stdout and stderr, appended
      server.lock                held by ``rigdeck serve`` for its life (one server per dir)
      admin.lock                 held while ``rigdeck server start`` or ``stop`` works
      history.sqlite             the server's job history (``rigdeck serve``)
      users.json                 the people who attach with keys of their own: name, admin,
                                 key fingerprint (``rigdeck server add-user``; 0600)

Plain path arithmetic (POSIX paths on the server host); nothing here touches a file.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

__all__ = ["DEFAULT_SERVER_STATE_DIR", "SYSTEMD_UNIT", "ServerLayout"]

DEFAULT_SERVER_STATE_DIR = "~/.rigdeck/server"
SYSTEMD_UNIT = "rigdeck-server"  # the `systemd-run --user` unit, where systemd is used


@dataclass(frozen=True)
class ServerLayout:
    """The files of a server whose directory is ``state_dir`` (absolute, or ``~/...`` for the
    host to expand)."""

    state_dir: str

    def _p(self, *parts: str) -> str:
        return posixpath.join(self.state_dir, *parts)

    @property
    def venv(self) -> str:
        return self._p("venv")

    @property
    def venv_python(self) -> str:
        return self._p("venv", "bin", "python")

    @property
    def rigdeck(self) -> str:
        """The server's own ``rigdeck`` command."""
        return self._p("venv", "bin", "rigdeck")

    @property
    def install_record(self) -> str:
        return self._p("venv", "rigdeck-install.json")

    @property
    def wheels(self) -> str:
        return self._p("wheels")

    @property
    def key(self) -> str:
        return self._p("id_ed25519")

    @property
    def public_key(self) -> str:
        return self._p("id_ed25519.pub")

    @property
    def known_hosts(self) -> str:
        return self._p("known_hosts")

    @property
    def inventory(self) -> str:
        return self._p("inventory.toml")

    @property
    def config(self) -> str:
        return self._p("config.toml")

    @property
    def setup_record(self) -> str:
        return self._p("setup.json")

    @property
    def socket_dir(self) -> str:
        return self._p("sock")

    @property
    def socket(self) -> str:
        return self._p("sock", "server.sock")

    @property
    def info(self) -> str:
        return self._p("server.json")

    @property
    def pid(self) -> str:
        return self._p("server.pid")

    @property
    def log(self) -> str:
        return self._p("server.log")

    def serve_argv(self, metrics_listen: str | None = None) -> list[str]:
        """The command that runs the server, on its host; with ``metrics_listen`` (the
        ``[server]`` table's ``ADDR:PORT``), serving ``/metrics`` there too."""
        argv = [self.rigdeck, "serve", "--state-dir", self.state_dir]
        return argv + ["--metrics-listen", metrics_listen] if metrics_listen else argv

    @property
    def users(self) -> str:
        return self._p("users.json")

    def attach_argv(self, user: str | None = None) -> list[str]:
        """What a client runs over SSH on the server host to reach the server's socket; with
        ``user``, the forced command of that person's key (``rigdeck server add-user``)."""
        argv = [self.rigdeck, "attach", "--state-dir", self.state_dir]
        return argv + ["--user", user] if user else argv
