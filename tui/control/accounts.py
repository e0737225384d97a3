"""A shared server's links to each person's own account on the hosts (``rigdeck server join``).

A person who joined has installed the server's public key in their own ``authorized_keys`` on
some hosts, restricted to their own agent's attach, and told the server which account that is
on which host. The server checked it (attached through that key, asked the agent which account
it runs as) and recorded ``{host: {"account", "python", "state_dir"}}`` for them in
``users.json`` (``record_accounts``). From then on their jobs are reached through a controller of
their own: the server's inventory cut to those hosts, each with their account as ``user``, the
python their agent runs (``{python}`` in their job's command) and their state dir
(``tui.control.jobs.JobManager.for_owner`` picks it by the job's owner). One agent link per
(host, account); a person no longer in ``users.json`` (``remove-user``) has theirs closed.

Nothing a client sends is taken on trust: the hosts must be the server's, the account a plain
Unix name that is neither the server's own account there nor one recorded for another person,
and the agent reached through it must say it runs as that account.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import os
import re
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agent.serverhelper import forget_accounts, read_users, record_accounts
from tui.control.hostlinks import HostLinks
from tui.model.inventory import Inventory
from tui.remote.transport import TransportError

log = logging.getLogger(__name__)

# What useradd accepts by default (and nothing a shell or an sshd option could read otherwise).
ACCOUNT_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
VERIFY_TIMEOUT_S = 30.0


class JoinError(ValueError):
    """A join the server refuses: the message names the host and what was expected."""


class Accounts:
    """Each joined person's controller, made when first needed and kept while their record is
    the same; ``close`` ends every link."""

    def __init__(self, inventory: Inventory, state_dir: Path,
                 controller: Callable[[Inventory], HostLinks] = HostLinks) -> None:
        self.inventory = inventory
        self.state_dir = Path(state_dir)
        self._make = controller
        self._lock = threading.Lock()
        self._ctls: dict[str, tuple[Any, HostLinks]] = {}  # person -> (their record, controller)
        self._users: tuple[Any, dict[str, Any]] = (None, {})  # users.json: (its stamp, people)

    # -- what is recorded ---------------------------------------------------------------------

    def people(self) -> dict[str, Any]:
        """users.json's people, read again only when the file changed (every supervised job asks
        for its owner's links each round)."""
        try:  # every writer replaces the file whole (a new inode); the rest is for hand edits
            st = (self.state_dir / "users.json").stat()
            stamp: tuple[int, int, int] | None = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        if stamp is None or stamp != self._users[0]:
            self._users = (stamp, read_users(str(self.state_dir)))
        return self._users[1]

    def recorded(self, user: str) -> dict[str, dict[str, str]]:
        """``user``'s accounts as users.json records them, hosts of this inventory only ({}:
        none, or not a user)."""
        person = self.people().get(user)
        got = person.get("accounts") if isinstance(person, dict) else None
        if not isinstance(got, dict):
            return {}
        names = set(self.inventory.names)
        return {h: dict(a) for h, a in got.items() if h in names and isinstance(a, dict)
                and isinstance(a.get("account"), str)}

    def inventory_of(self, accounts: Mapping[str, Mapping[str, str]]) -> Inventory:
        """The server's inventory cut to ``accounts``' hosts, each reached as that account."""
        hosts = []
        for spec in self.inventory.hosts:
            a = accounts.get(spec.name)
            if a is None:
                continue
            hosts.append(dataclasses.replace(
                spec, user=a["account"], python=a.get("python") or spec.python,
                state_dir=a.get("state_dir") or spec.state_dir))
        return dataclasses.replace(self.inventory, hosts=tuple(hosts))

    # -- the links ----------------------------------------------------------------------------

    def controller(self, user: str) -> HostLinks | None:
        """The controller that reaches ``user``'s own agents; None when they recorded no
        account (their jobs go through the server's own links, as without a join)."""
        accounts = self.recorded(user)
        with self._lock:
            held = self._ctls.get(user)
            if held is not None and held[0] == accounts:
                return held[1]
            if held is not None:  # joined again, or removed: the old links go
                del self._ctls[user]
                held[1].close()
            if not accounts:
                return None
            ctl = self._make(self.inventory_of(accounts))
            self._ctls[user] = (accounts, ctl)
            return ctl

    def prune(self) -> list[str]:
        """Close the links of people no longer in users.json (``remove-user``): at once, not at
        their next job. Returns who."""
        present = self.people()
        with self._lock:
            gone = [u for u in self._ctls if u not in present]
            for u in gone:
                self._ctls.pop(u)[1].close()
        for u in gone:
            log.info("%s is no longer a user: their links to their own accounts are closed", u)
        return gone

    def linked(self) -> list[str]:
        with self._lock:
            return sorted(self._ctls)

    def close(self) -> None:
        with self._lock:
            held, self._ctls = list(self._ctls.values()), {}
        for _, ctl in held:
            ctl.close()

    # -- join ---------------------------------------------------------------------------------

    def join(self, user: str, accounts: Any) -> dict[str, dict[str, str]]:
        """Check and record ``accounts`` ({host: account}, as a client sent it) as ``user``'s:
        JoinError naming the host and what was expected for anything wrong. Returns every
        account recorded for them now."""
        if not isinstance(accounts, dict) or not accounts:
            raise JoinError("join: expected {host: account} with at least one host")
        people = read_users(str(self.state_dir))
        if user not in people:
            raise JoinError(f"join: {user} is not a user of this server")
        for host, account in accounts.items():
            self._allowed(user, people, host, account)
        tag = people[user].get("join_tag") if isinstance(people[user], dict) else None
        if not isinstance(tag, str):
            raise JoinError(f"join: {user} has no key line tag from this server yet (rigdeck server join asks "
                            "for it first: run it again)")
        checked = {host: self.verify(host, account, tag, user) for host, account in accounts.items()}
        got = record_accounts(str(self.state_dir), user, checked)
        self.controller(user)  # the new record's links, the old ones closed
        return {h: dict(a) for h, a in got.items()}

    def leave(self, user: str, hosts: Any) -> tuple[list[str], dict[str, dict[str, str]]]:
        """Forget ``user``'s accounts on ``hosts`` (a list of host names; None: every one) and
        close the links to them. (the hosts dropped, the accounts still recorded)."""
        recorded = self.recorded(user)
        if hosts is None:
            hosts = list(recorded)
        if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
            raise JoinError("leave: expected a list of host names, or none for every host")
        unknown = [h for h in hosts if h not in recorded]
        if unknown:
            raise JoinError(f"leave: {user} has no account recorded on {', '.join(h[:64] for h in unknown)} "
                            f"(recorded: {', '.join(sorted(recorded)) or 'none'})")
        try:
            left = forget_accounts(str(self.state_dir), user, hosts)
        except KeyError:
            raise JoinError(f"leave: {user} is not a user of this server") from None
        self.controller(user)  # the links to what was dropped close now
        return sorted(hosts), {h: dict(a) for h, a in left.items()}

    def _allowed(self, user: str, people: Mapping[str, Any], host: Any, account: Any) -> None:
        if not isinstance(host, str) or host not in self.inventory.names:
            raise JoinError(f"join: host {str(host)[:64]!r}: expected a host of the server's inventory "
                            f"({', '.join(self.inventory.names)})")
        if not isinstance(account, str) or not ACCOUNT_RE.fullmatch(account):
            raise JoinError(f"join: {host}: account {str(account)[:64]!r}: expected a Unix account name "
                            "(a-z, 0-9, '_', '-', starting with a letter or '_')")
        spec = self.inventory.get(host)
        if account == spec.user or spec.is_local:
            raise JoinError(f"join: {host}: {account} is the server's own account there; a person's jobs "
                            "run as an account of their own")
        for other, rec in people.items():
            theirs = (rec.get("accounts") or {}).get(host) if isinstance(rec, dict) else None
            if other != user and isinstance(theirs, dict) and theirs.get("account") == account:
                raise JoinError(f"join: {host}: {account} is recorded for {other}; each person joins "
                                "with an account of their own")

    def verify(self, host: str, account: str, tag: str, user: str = "the person joining") -> dict[str, str]:
        """Attach to ``host`` as ``account`` with the server's key (the line the person
        installed: their own agent's attach) and ask that agent which account it runs as. The
        line must carry ``tag``, the one issued to the person joining (its attach says it in the
        hello): a line another person installed for themselves is not theirs to claim, even
        before that person's own join reached the server. {"account", "python", "state_dir"}
        as the agent says them; JoinError otherwise."""
        inv = self.inventory_of({host: {"account": account}})
        ctl = self._make(inv)
        try:
            facts = ctl.agent(host).facts(timeout=VERIFY_TIMEOUT_S).raw
            said_tag = ctl.hello(host).get("join_tag")
        except TransportError as e:
            raise JoinError(f"join: {host}: the server could not reach {account}'s agent with its key "
                            f"(is the key line in {account}'s ~/.ssh/authorized_keys there?): {e}") from None
        finally:
            ctl.close()
        if not isinstance(said_tag, str) or not hmac.compare_digest(said_tag, tag):
            why = "it carries no tag: an older rigdeck installed it" if said_tag is None else "its tag is not theirs"
            raise JoinError(f"join: {host}: the server's key line in {account}'s ~/.ssh/authorized_keys there was "
                            f"not installed for {user} ({why}); each person joins with an account of their own, "
                            "through the line `rigdeck server join` installs for them")
        said = facts.get("user")
        if said != account:
            raise JoinError(f"join: {host}: the agent reached as {account} runs as {said or 'an unknown account'} "
                            "(an agent older than this server says none: deploy it again)")
        python, state_dir = facts.get("python_executable"), facts.get("state_dir")
        if not isinstance(python, str) or not os.path.isabs(python) or not isinstance(state_dir, str):
            raise JoinError(f"join: {host}: {account}'s agent did not say its python and state dir")
        return {"account": account, "python": python, "state_dir": state_dir}
