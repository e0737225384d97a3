"""This host's GPU series as a Prometheus textfile, for node_exporter's textfile collector.

Where no rigdeck controller runs near the Prometheus that watches a host, the node_exporter
already on the host can serve rigdeck's per-GPU series (``agent/promtext.py``: the same names,
labels and meaning as the controller's ``/metrics``) from a file the agent keeps fresh. The
inventory's ``prometheus_textfile`` reaches the daemon through the ``prometheus_textfile`` RPC
each time a controller connects; the daemon keeps the setting in ``<state_dir>/SETTING_FILE``,
so a daemon that takes over after an upgrade goes on writing with no controller around.

A write is atomic, as node_exporter asks: a temporary file in the same directory (named so that
the collector, which reads only ``*.prom``, never reads it), made afresh with ``O_EXCL`` and
``O_NOFOLLOW`` (a link planted under its name is refused, not written through), mode 0644, then
renamed over the target. The directory must exist and be writable by the agent's user.

Stdlib only, Python 3.9+.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

SETTING_FILE = "prometheus-textfile.json"
MODE = 0o644  # node_exporter runs as a user of its own: it must be able to read the file
# How often the file is written while no controller subscribes to telemetry (the daemon samples
# only for it then), and the least time between two writes while one does (at up to 10 Hz).
IDLE_INTERVAL_S = 5.0
MIN_INTERVAL_S = 1.0


class TextfileError(ValueError):
    """A path that cannot be a textfile for node_exporter."""


def resolve(path: str) -> str:
    """``path`` checked (``agent.promtext.textfile_path_problem``) with ``~`` expanded for this
    host's user; TextfileError saying what was expected."""
    from agent.promtext import textfile_path_problem  # only where a textfile is asked for

    problem = textfile_path_problem(path)
    if problem is not None:
        raise TextfileError("prometheus_textfile %r: expected %s" % (path, problem))
    full = os.path.expanduser(path)
    if full.startswith("~"):  # "~nosuchuser/x.prom" stays as written
        raise TextfileError("prometheus_textfile %r: no such user's home on this host" % path)
    return os.path.normpath(full)


def render(sample: Dict[str, Any], host: str) -> str:
    """The file's text: the GPU series of ``sample``, labelled ``host`` (the inventory's name)."""
    from agent.promtext import host_gpus  # only where a textfile is asked for

    return host_gpus(sample, host).text()


def write(path: str, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (OSError when the directory does not take it)."""
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, ".%s.%d.tmp" % (name, os.getpid()))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags, MODE)
    except FileExistsError:  # left by a daemon of this pid that died mid-write
        os.unlink(tmp)
        fd = os.open(tmp, flags, MODE)
    try:
        try:
            os.fchmod(fd, MODE)  # whatever the umask
            data = text.encode("utf-8")
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def remove(path: str) -> None:
    """Take the file away (node_exporter then stops serving its series); gone already is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def load(state_dir: str) -> Optional[Dict[str, str]]:
    """The setting kept in ``state_dir`` (``{"path", "host"}``, the path resolved), or None."""
    try:
        with open(os.path.join(state_dir, SETTING_FILE)) as f:
            d = json.load(f)
        path, host = d["path"], d["host"]
        if isinstance(path, str) and isinstance(host, str) and host:
            return {"path": resolve(path), "host": host}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def save(state_dir: str, setting: Optional[Dict[str, str]]) -> None:
    """Keep ``setting`` in ``state_dir`` for the daemons to come (None: forget it)."""
    target = os.path.join(state_dir, SETTING_FILE)
    if setting is None:
        remove(target)
        return
    tmp = "%s.%d.tmp" % (target, os.getpid())
    with open(tmp, "w") as f:
        json.dump(setting, f)
    os.replace(tmp, target)
