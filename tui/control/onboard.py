"""Onboarding: checking hosts that are not in the inventory yet, then adding them to it.

The faces (the app's onboarding screen, ``rigdeck inventory add``) pick hosts from the ssh
config or name one; each is checked here before anything is written: the SSH connection (an
unknown host key is refused until the user accepts its fingerprint, a passphrase-protected key
is asked for through the face's prompt) and a usable Python (>= 3.9, what the agent needs).
Only hosts that passed are written to the inventory file.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tui.control.hostlinks import HostLinks, HostReport, _apply_facts
from tui.model.inventory import HostSpec
from tui.remote.inventoryfile import append_hosts, new_hosts_inventory
from tui.remote.transport import Transport, TransportError

log = logging.getLogger(__name__)

MIN_PYTHON = (3, 9)


@dataclass(frozen=True)
class Candidate:
    """A host that may be added: how it resolved, and where from."""

    spec: HostSpec

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def where(self) -> str:
        """user@address:port, and the jump when there is one."""
        s = self.spec
        via = f" via {s.proxy_jump}" if s.proxy_jump else ""
        return f"{s.user}@{s.address}:{s.port}{via}"


def _python_ok(version: str | None) -> bool:
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return m is not None and (int(m[1]), int(m[2])) >= MIN_PYTHON


class Onboarding:
    """Hosts not yet in the inventory file ``target``: check them, then write those chosen.

    ``entries``: ``[[hosts]]`` tables for named hosts (``rigdeck inventory add``); None: every
    concrete ``Host`` of the ssh config (the app's onboarding).
    """

    def __init__(self, target: str | os.PathLike[str] | None = None,
                 entries: Sequence[Mapping[str, Any]] | None = None):
        # ssh config hosts that do not resolve (a bad Port...) are left out, and said why.
        self.skipped: list[str] = []
        self.inventory, names = new_hosts_inventory(
            target, entries, skipped=self.skipped if entries is None else None)
        assert self.inventory.path is not None
        self.target: Path = self.inventory.path
        self.candidates = [Candidate(self.inventory.get(n)) for n in names]
        self.passed: dict[str, HostReport] = {}

    @property
    def ssh_config(self) -> Path | None:
        return self.inventory.ssh_config

    @property
    def known_hosts(self) -> Path:
        return self.inventory.known_hosts

    def candidate(self, name: str) -> Candidate:
        for c in self.candidates:
            if c.name == name:
                return c
        raise KeyError(name)

    def check(self, name: str, accept_fingerprints: Sequence[str] = ()) -> HostReport:
        """Connect to the candidate ``name`` and run the facts probe (its Python). The report's
        ``error_kind`` says what failed: ``unknown-host-key`` (``host_key`` holds the
        fingerprint to show; check again with it in ``accept_fingerprints`` once the user
        accepted it: it is recorded in known_hosts only then), ``host-key-changed``,
        ``unreachable``, ``auth``, ``passphrase`` (the user gave none), ``python``."""
        spec = self.candidate(name).spec
        ctl = HostLinks(self.inventory, accept_fingerprints=accept_fingerprints)

        def body(report: HostReport, t: Transport) -> None:
            facts = ctl._facts(spec, t)
            _apply_facts(report, facts)
            if not _python_ok(report.python):
                raise _PythonTooOld(spec.name, f"{spec.python} on the host is Python "
                                    f"{report.python or '?'}; the agent needs "
                                    f"{'.'.join(map(str, MIN_PYTHON))} or later")

        try:
            report = ctl._guarded(spec, body)
        finally:
            ctl.close()
        if report.error is None:
            self.passed[name] = report
        else:
            self.passed.pop(name, None)
        return report

    def write(self, names: Sequence[str]) -> Path:
        """Append the named candidates (each must have passed ``check``) to the inventory file."""
        unchecked = [n for n in names if n not in self.passed]
        if unchecked:
            raise ValueError(f"not checked (or failed): {', '.join(unchecked)}; nothing written")
        path = append_hosts(self.target, [self.candidate(n).spec for n in names])
        log.info("added %s to %s", ", ".join(names), path)
        return path


class _PythonTooOld(TransportError):
    kind = "python"

