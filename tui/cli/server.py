"""``rigdeck server setup|start|stop|status|logs|add-user|users|remove-user|join|leave`` and ``rigdeck attach``.

The server is the controller running as a long-lived process (``rigdeck serve``) on the host the
inventory's ``[server]`` table names; these commands put it there and look after it, through
``tui.control.serveradmin`` (through ``tui.client``). ``rigdeck attach`` runs on the server host itself:
it is what a client's SSH session runs to speak to the server.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tui.model.userconfig import NotifyConfig, load_config, redact_url

EXIT_OK = 0
EXIT_FAILED = 1


def _inventory_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--inventory", "-i", metavar="PATH", default=argparse.SUPPRESS,
        help="inventory TOML with a [server] table (default: $RIGDECK_INVENTORY or "
        "~/.config/rigdeck/hosts.toml)",
    )


def add_parsers(sub: Any) -> None:
    """The ``server`` and ``attach`` subcommands, on the main parser's subparsers ``sub``. The
    server's commands take ``--inventory`` but not ``--accept-new``: setup never records a host
    key (the server trusts recorded keys only)."""
    from tui.model.serverlayout import DEFAULT_SERVER_STATE_DIR

    p = sub.add_parser(
        "server",
        help="the controller as a long-lived server on one of your hosts ([server] in the inventory)",
    )
    _inventory_option(p)
    ssub = p.add_subparsers(dest="server_command", required=True, metavar="COMMAND")
    sp = ssub.add_parser(
        "setup",
        help="deploy the agent, install rigdeck in a venv on the server host (offline, from "
        "wheels built here), give the server its own key and authorise it on every host for "
        "the agent's attach only",
    )
    _inventory_option(sp)
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp = ssub.add_parser("start", help="start the server (it outlives this SSH session)")
    _inventory_option(sp)
    sp.add_argument("--timeout", type=float, default=30.0, metavar="S",
                    help="seconds to wait for its socket (default 30)")
    sp.add_argument("--json", action="store_true")
    sp = ssub.add_parser("stop", help="stop the server (SIGTERM, then SIGKILL)")
    _inventory_option(sp)
    sp.add_argument("--timeout", type=float, default=10.0, metavar="S",
                    help="seconds between SIGTERM and SIGKILL (default 10)")
    sp.add_argument("--json", action="store_true")
    sp = ssub.add_parser("status", help="whether the server runs: pid, since, version, socket")
    _inventory_option(sp)
    sp.add_argument("--json", action="store_true")
    sp = ssub.add_parser("logs", help="the server's log")
    _inventory_option(sp)
    sp.add_argument("-n", "--lines", type=int, default=50, metavar="N",
                    help="the last N lines (default 50)")
    sp.add_argument("-f", "--follow", action="store_true", help="then what is appended")
    _user_parsers(ssub)

    p = sub.add_parser(
        "attach",
        help="(on the server host) bridge stdin/stdout to the running server's socket",
    )
    p.add_argument("--state-dir", default=DEFAULT_SERVER_STATE_DIR, metavar="DIR",
                   help=f"the server's directory (default {DEFAULT_SERVER_STATE_DIR})")
    p.add_argument("--user", default=None, metavar="NAME",
                   help="the person this session is (a key's forced command says it: rigdeck server add-user)")


def _user_parsers(ssub: Any) -> None:
    sp = ssub.add_parser(
        "add-user",
        help="let a person attach with their own SSH key: installed on the server host with a forced "
        "command that names them (no shell, no pty, no forwarding)",
    )
    _inventory_option(sp)
    sp.add_argument("name", metavar="NAME", help="their name on the server (a-z, 0-9, _ . -)")
    sp.add_argument("--key", required=True, metavar="PUBKEY",
                    help="their OpenSSH public key: a .pub file, or the key line itself")
    sp.add_argument("--admin", action="store_true",
                    help="may stop anyone's work, drain hosts and change quotas (default: a member)")
    sp.add_argument("--json", action="store_true")
    sp = ssub.add_parser("users", help="the people who attach with keys of their own: name, admin, key fingerprint")
    _inventory_option(sp)
    sp.add_argument("--json", action="store_true")
    sp = ssub.add_parser("remove-user", help="revoke a person's key (their name stays on the work they did); "
                                             "refused while a job of theirs runs or waits, unless --stop")
    _inventory_option(sp)
    sp.add_argument("name", metavar="NAME")
    sp.add_argument("--stop", action="store_true",
                    help="stop their running and queued jobs first (through their own accounts), then remove them")
    sp = ssub.add_parser(
        "join",
        help="(a person, with their own access to the hosts) let the server run your jobs as your own "
        "account: its key goes into your authorized_keys there, for your own agent only",
    )
    _inventory_option(sp)
    sp.add_argument("hosts", nargs="*", metavar="HOST",
                    help="the hosts to join (default: every host of your inventory but the server's)")
    sp.add_argument("--json", action="store_true")
    sp = ssub.add_parser("leave", help="(a person) undo join: the server forgets your accounts and its key "
                                       "leaves your authorized_keys (refused while a job of yours runs there)")
    _inventory_option(sp)
    sp.add_argument("hosts", nargs="*", metavar="HOST", help="the hosts to leave (default: every one joined)")


def _read_key(value: str) -> str:
    """The key line ``--key`` gives: the value itself when it looks like a key, else a file's."""
    from pathlib import Path

    if value.split()[:1] and value.split()[0].startswith(("ssh-", "ecdsa-", "sk-")):
        return value
    try:
        return Path(value).expanduser().read_text()
    except OSError as e:
        raise SystemExit(f"rigdeck: --key {value}: cannot read it ({e.strerror or e}); expected an "
                         "OpenSSH public key file or the key line itself") from None


def _run_users(args: argparse.Namespace, inv: Any) -> int:
    from tui.client import serveradmin

    cmd = args.server_command
    if cmd == "join":
        progress = None if args.json else (lambda m: print(f"  {m}", file=sys.stderr, flush=True))
        report = serveradmin.join(inv, args.hosts, progress=progress)
        if args.json:
            _dump(report.to_json())
        else:
            print(f"joined {report.server_host} as {report.user}: your jobs run as "
                  + ", ".join(f"{a['account']} on {h}" for h, a in sorted(report.accounts.items())))
        return EXIT_OK
    if cmd == "leave":
        report, left = serveradmin.leave(inv, args.hosts)
        rest = ", ".join(f"{a['account']} on {h}" for h, a in sorted(report.accounts.items()))
        print(f"left {', '.join(left) or 'nothing'} on {report.server_host}: its key is out of your "
              f"authorized_keys there; " + (f"your jobs still run as {rest}" if rest else
                                            "your jobs run as the server's account again"))
        return EXIT_OK
    if cmd == "add-user":
        user, replaced = serveradmin.add_user(inv, args.name, _read_key(args.key), admin=args.admin)
        if args.json:
            _dump(dict(user.to_json(), replaced=replaced))
        else:
            role = "admin" if user.admin else "member"
            print(f"user {user.name} ({role}): key {user.fingerprint} installed on {inv.server.host}"
                  + (", replacing their earlier key" if replaced else "")
                  + f"; it may only run `rigdeck attach --user {user.name}`")
        return EXIT_OK
    if cmd == "users":
        people = serveradmin.users(inv)
        if args.json:
            _dump([u.to_json() for u in people])
        elif not people:
            print(f"no users on {inv.server.host} (rigdeck server add-user NAME --key PUBKEY)")
        else:
            width = max(len(u.name) for u in people)
            print(f"{'NAME':<{width}}  ROLE    KEY")
            for u in people:
                print(f"{u.name:<{width}}  {'admin' if u.admin else 'member':<6}  {u.fingerprint}")
        return EXIT_OK
    stopped = serveradmin.remove_user(inv, args.name, stop=args.stop,
                                      progress=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    done = [f"{kind} {', '.join(ids)}" for kind, ids in stopped.items() if ids]
    if done:
        print(f"stopped {args.name}'s {'; '.join(done)}")
    print(f"user {args.name}: key removed from {inv.server.host}; they can no longer attach")
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    from tui.client import serveradmin

    if args.command == "attach":
        return serveradmin.attach(args.state_dir, user=args.user)
    inv = serveradmin.load(getattr(args, "inventory", None))
    try:
        return _run_server(args, inv)
    except serveradmin.ServerHostError as e:
        print(f"rigdeck: {e}", file=sys.stderr)
        return EXIT_FAILED


def _dump(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")


def _notify_line(n: NotifyConfig, host: str) -> str:
    """What the server will send, secrets hidden: ``webhook https://h/*** ... (from h1)``."""
    if not n.sends:
        return "nothing ([notify] in your config.toml has no webhook or command)"
    parts = ([f"webhook {redact_url(n.webhook)}"] if n.webhook else []) + (
        [f"command {n.command[0]}"] if n.command else [])
    return f"{', '.join(parts)} on {', '.join(n.on)}, sent from {host}"


def _run_server(args: argparse.Namespace, inv: Any) -> int:
    from tui.client import serveradmin

    cmd = args.server_command
    if cmd in ("add-user", "users", "remove-user", "join", "leave"):
        return _run_users(args, inv)
    if cmd == "setup":
        progress = None if args.json else (lambda m: print(f"  {m}", file=sys.stderr, flush=True))
        report = serveradmin.setup(inv, progress=progress)
        if args.json:
            _dump(report.to_json())
            return EXIT_OK
        print(f"server on {report.host}: {report.state_dir}")
        how = {"offline": "installed offline from wheels built here",
               "index": "installed, dependencies from the host's own index",
               "current": "already current"}[report.install]
        print(f"  rigdeck {report.version} (build {report.build}): {how} ({report.platform})")
        if report.wheels_copied:
            print(f"  copied {len(report.wheels_copied)} wheel(s)")
        print(f"  key: {report.public_key}{' (new)' if report.key_created else ''}")
        print("  authorised for the agent's attach only on: "
              + ", ".join(f"{h} ({how})" for h, how in report.authorized.items()))
        print(f"  inventory: {report.inventory}")
        print(f"  notify: {_notify_line(load_config().notify, report.host)}")
        print(f"  done in {report.elapsed_s:.1f}s; next: rigdeck server start")
        return EXIT_OK
    if cmd == "start":
        st = serveradmin.start(inv, timeout=args.timeout)
        if args.json:
            _dump(dict(st.to_json(), started=bool(st.started)))
        elif st.started:
            print(f"server on {st.host}: started (pid {st.pid}, {st.mode}); "
                  f"listening on {st.socket}")
            if inv.server.metrics_listen:
                print(f"  metrics on http://{inv.server.metrics_listen}/metrics ([server] metrics_listen)")
        else:
            print(f"server on {st.host}: already running (pid {st.pid}, since {st.since})")
        return EXIT_OK
    if cmd == "stop":
        st, was_running = serveradmin.stop(inv, timeout=args.timeout)
        if args.json:
            _dump(dict(st.to_json(), was_running=was_running))
        else:
            print(f"server on {st.host}: " + ("stopped" if was_running else "was not running"))
        return EXIT_OK if not st.running else EXIT_FAILED
    if cmd == "status":
        st = serveradmin.status(inv)
        if args.json:
            _dump(st.to_json())
        else:
            _print_status(st)
        return EXIT_OK if st.running and st.listening else EXIT_FAILED
    if cmd == "logs":
        out = sys.stdout.buffer

        def write(data: bytes) -> None:
            out.write(data)
            out.flush()

        serveradmin.logs(inv, write, lines=args.lines, follow=args.follow)
        return EXIT_OK
    raise AssertionError(cmd)


def _print_status(st: Any) -> None:
    if st.running:
        state = f"running (pid {st.pid}, since {st.since}, {st.mode})"
    elif not st.set_up:
        state = "not set up (rigdeck server setup)"
    else:
        state = "not running (rigdeck server start)"
    print(f"server on {st.host}: {state}")
    print(f"  socket   {st.socket} ({'accepts' if st.listening else 'not listening'})")
    if st.version:
        print(f"  version  rigdeck {st.version} (build {st.build})")
    print(f"  log      {st.log}")
