"""Who the person at this end is, as the controller records it (a drain's ``who``, a
notification's ``user``, a job's owner): the local account's name, or None where the system
cannot say (no passwd entry, no USER/LOGNAME). With a server, a session's person is the name
its SSH key's forced command gives (``rigdeck server add-user``), never what a client claims;
the names and keys a server accepts are checked here."""

from __future__ import annotations

import base64
import binascii
import getpass
import hashlib
import re

__all__ = ["KEY_TYPES", "UserError", "check_public_key", "check_user_name", "key_fingerprint", "local_user"]

# A person's name on a server: a POSIX-ish login name (it goes into a forced command and the
# authorized_keys comment, so nothing a shell or sshd would read as more than a word).
_NAME = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")
KEY_TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
             "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com")


class UserError(ValueError):
    """A user name or key that cannot be used; the message says what was expected."""


def local_user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


def check_user_name(name: str) -> str:
    """``name`` when it is a valid person's name on a server, else UserError saying what is."""
    if not _NAME.fullmatch(name or ""):
        raise UserError(f"user name {name!r}: expected 1 to 32 characters of a-z, 0-9, '_', '.', '-', "
                        "starting with a letter or '_'")
    return name


def check_public_key(text: str, where: str = "--key") -> str:
    """``<type> <base64>`` of an OpenSSH public key line (its comment dropped); UserError naming
    ``where`` when it is not one (a private key, a fingerprint, a truncated line)."""
    words = (text or "").split()
    if len(words) < 2 or words[0] not in KEY_TYPES:
        shown = (text or "").strip()[:40]
        raise UserError(f"{where}: expected an OpenSSH public key line ({' | '.join(KEY_TYPES[:3])} ... "
                        f"AAAA...), got {shown!r}")
    try:
        blob = base64.b64decode(words[1], validate=True)
    except (binascii.Error, ValueError):
        raise UserError(f"{where}: the key's base64 part does not decode") from None
    if not blob.startswith(len(words[0]).to_bytes(4, "big") + words[0].encode()):
        raise UserError(f"{where}: the key's base64 part is not a {words[0]} key")
    return f"{words[0]} {words[1]}"


def key_fingerprint(public_key: str) -> str:
    """OpenSSH's ``SHA256:...`` fingerprint of a public key line (what ``ssh-keygen -lf`` says)."""
    blob = base64.b64decode(public_key.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
