"""``rigdeck inventory add NAME``: check a host, then add it to the inventory file.

NAME is resolved as the inventory would resolve it: the options given, else the ssh config's
``Host NAME`` block (HostName, User, Port, ProxyJump, IdentityFile), else the inventory's
``[defaults]``. Then it is checked: an SSH connection (an unknown host key is shown and
recorded only once accepted: at the prompt, or with ``--accept-fingerprint``; a passphrase
for an encrypted key is asked once, on the terminal, and kept in memory only) and a usable
Python on the host. Only then is the host appended to the file (created when missing; the
rest of its text is kept). A failed check writes nothing and says why. Exit 0 when added,
1 when a check failed or the user declined, 2 for bad input.
"""

from __future__ import annotations

import argparse
import getpass
import re
import sys
from typing import Any

from tui.client import HostReport, Onboarding

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
_FINGERPRINT_RE = re.compile(r"SHA256:[A-Za-z0-9+/]{43}")


def add_parser(isub: Any) -> None:
    p = isub.add_parser(
        "add", help="check a host (host key, login, Python) and add it to the inventory file",
        description=(__doc__ or "").split("\n\n")[1].replace("\n", " ") if __doc__ else None)
    p.add_argument("--inventory", "-i", metavar="PATH", default=argparse.SUPPRESS,
                   help="the inventory file to add to (default: $RIGDECK_INVENTORY or "
                   "~/.config/rigdeck/hosts.toml; created when missing)")
    p.add_argument("name", metavar="NAME", help="the host's name (an ssh config Host, or any name with --address)")
    p.add_argument("--address", metavar="A",
                   help="host name or IP address (default: the ssh config's HostName, else NAME)")
    p.add_argument("--user", metavar="U", help="login user (default: the ssh config's User, else yours)")
    p.add_argument("--port", metavar="P", type=int, help="SSH port (default: the ssh config's Port, else 22)")
    p.add_argument("--proxy-jump", metavar="J", help="jump host(s), as ssh's -J (default: the ssh config's ProxyJump)")
    p.add_argument("--identity-file", metavar="F", action="append",
                   help="private key (repeatable; default: the ssh config's IdentityFile, ssh-agent, ~/.ssh/id_*)")
    p.add_argument("--accept-fingerprint", metavar="SHA256:...", action="append", default=[],
                   help="a host key you checked out of band: recorded in known_hosts if the host "
                   "presents exactly it (repeatable, e.g. for a jump host too)")
    p.add_argument("--yes", "-y", action="store_true",
                   help="write without asking once the checks pass (host keys still need "
                   "--accept-fingerprint or a yes at the prompt)")


def _ask(question: str) -> bool:
    """A yes/no question on the terminal; no terminal, or anything but y/yes, is no."""
    if not sys.stdin.isatty():
        return False
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def ask_passphrase(key_file: str) -> str | None:
    """Ask on the terminal (never echoed); None when there is no terminal to ask on."""
    if not sys.stdin.isatty():
        return None
    return getpass.getpass(f"Passphrase for {key_file}: ")


def run(args: argparse.Namespace) -> int:
    bad = [f for f in args.accept_fingerprint if not _FINGERPRINT_RE.fullmatch(f)]
    if bad:
        print(f"rigdeck: --accept-fingerprint: expected SHA256:<43 base64 characters> "
              f"(as ssh-keygen -lf prints), got {bad[0]!r}", file=sys.stderr)
        return EXIT_USAGE
    entry: dict[str, Any] = {"name": args.name}
    for key, value in (("address", args.address), ("user", args.user), ("port", args.port),
                       ("proxy_jump", args.proxy_jump), ("identity_file", args.identity_file)):
        if value is not None:
            entry[key] = value
    ob = Onboarding(getattr(args, "inventory", None), entries=[entry])  # InventoryError: exit 2
    cand = ob.candidate(args.name)
    print(f"{cand.name}: {cand.where}" + (f", key {', '.join(cand.spec.identity_files)}"
                                          if cand.spec.identity_files else ""))
    accepted = list(args.accept_fingerprint)
    while True:
        report = ob.check(cand.name, accept_fingerprints=accepted)
        hk: dict[str, str] = dict(report.host_key or {})
        if report.error_kind != "unknown-host-key" or hk.get("fingerprint") in accepted:
            break
        print(f"{cand.name}: unknown host key {hk.get('type', '')} {hk.get('fingerprint')}",
              file=sys.stderr)
        print(f"The host key is not in {ob.known_hosts}. Compare its fingerprint "
              f"{hk.get('fingerprint')} with the host's own (ssh-keygen -lf "
              "/etc/ssh/ssh_host_*_key.pub there) before you trust it.", file=sys.stderr)
        if not _ask(f"Trust {hk.get('type', 'the')} key {hk.get('fingerprint')}?"):
            print(f"rigdeck: {cand.name}: host key not accepted; nothing written (accept it "
                  f"with --accept-fingerprint {hk.get('fingerprint')} once checked)",
                  file=sys.stderr)
            return EXIT_FAILED
        accepted.append(str(hk.get("fingerprint")))
    if report.error:
        print(f"rigdeck: {report.error}", file=sys.stderr)
        print(f"rigdeck: {cand.name}: check failed; nothing written to {ob.target}", file=sys.stderr)
        return EXIT_FAILED
    _print_ok(report)
    if not args.yes and sys.stdin.isatty() and not _ask(f"Add {cand.name} to {ob.target}?"):
        print("nothing written", file=sys.stderr)
        return EXIT_FAILED
    path = ob.write([cand.name])
    print(f"added {cand.name} to {path}")
    return EXIT_OK


def _print_ok(r: HostReport) -> None:
    gpus = f", {len(r.gpus)} GPU(s)" if r.gpus else ""
    print(f"{r.name}: reachable ({r.hostname or '?'}), Python {r.python} at "
          f"{r.python_executable}{gpus}")
