"""Who the person at this end is, as the controller records it (a drain's ``who``, a
notification's ``user``, a job's submitter): the local account's name, or None where the
system cannot say (no passwd entry, no USER/LOGNAME)."""

from __future__ import annotations

import getpass


def local_user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None
