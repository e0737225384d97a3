"""Entry point of ``python agent.pyz COMMAND``. Stdlib only, Python 3.9+."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional

from agent import facts, filemodes, roles
from agent.version import agent_version


def _print_json(obj: object) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def _install(me: str, expect_sha256: str, state_dir: str, version: str) -> str:
    """Move this verified archive to ``<state_dir>/agent/<version>/agent.pyz`` and make it current."""
    final_dir = os.path.join(state_dir, "agent", version)
    final = os.path.join(final_dir, "agent.pyz")
    os.makedirs(final_dir, mode=0o700, exist_ok=True)
    if me != final:
        os.replace(me, final)
    _make_current(state_dir, version)
    return final


def _make_current(state_dir: str, version: str) -> None:
    current = os.path.join(state_dir, "agent", "current")
    try:
        with open(current) as f:
            if f.read().strip() == version:
                return
    except OSError:
        pass
    tmp = "%s.tmp%d" % (current, os.getpid())
    with open(tmp, "w") as f:
        f.write(version + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, current)


def cmd_version(args: argparse.Namespace) -> int:
    """Print the version, this file's SHA-256 and the host's facts as one JSON line.

    The controller checks the hash against the one it built, so one run both verifies the file
    and proves that this host's Python runs it. With ``--install`` (run from the uploaded
    ``.part`` file) a verified archive is also moved into place; facts are gathered before the
    rename, because the zip importer reopens the archive by path.
    """
    version = agent_version()
    me = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    sha = facts.sha256_file(me) if os.path.isfile(me) else None
    if args.install and sha != args.expect_sha256:
        _print_json({"ok": False, "error": "sha256 mismatch: expected %s, got %s" % (args.expect_sha256, sha)})
        return 3
    info = facts.collect(args.state_dir)
    info.update(ok=True, version=version, sha256=sha, path=me or None)
    if args.install:
        state_dir = os.path.expanduser(args.state_dir)
        info["path"] = _install(me, args.expect_sha256, state_dir, version)
        info["deployed_version"] = version
        info["deployed_sha256"] = sha
    _print_json(info)
    return 0


def cmd_attach(args: argparse.Namespace) -> int:
    """Bridge to the daemon. With ``--expect-sha256`` (the controller's one command on a host
    whose agent it believes installed) this archive's hash is checked first, and a mismatch
    ends here (exit 3, nothing started): the controller then deploys as ``version`` would."""
    from agent import attach

    if args.expect_sha256:
        me = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
        sha = facts.sha256_file(me) if os.path.isfile(me) else None
        if sha != args.expect_sha256:
            sys.stderr.write("rigdeck agent: %s has sha256 %s, expected %s\n" % (me, sha, args.expect_sha256))
            return 3
        _make_current(os.path.expanduser(args.state_dir), agent_version())
    if args.join_tag is not None and (not args.role or not attach.JOIN_TAG_RE.fullmatch(args.join_tag)):
        sys.stderr.write("rigdeck agent: --join-tag: expected 32 hex digits, with --role\n")
        return 2
    return attach.main(args.state_dir, start=not args.no_start, role=args.role, join_tag=args.join_tag)


def cmd_daemon(args: argparse.Namespace) -> int:
    # The daemon speaks over a unix socket only: asyncio would load ssl (libssl) for nothing.
    sys.modules.setdefault("ssl", None)  # type: ignore[arg-type]
    from agent import daemon

    paths = daemon.Paths(args.state_dir)
    try:
        daemon.setup_logging(paths)
    except filemodes.UnsafeDirError as e:
        sys.stderr.write("rigdeck agent: %s\n" % e)
        return 1
    try:
        sim = int(os.environ.get("RIGDECK_SIM_GPUS", "0") or 0)
    except ValueError:
        sim = 0
    return daemon.Daemon(paths.state_dir, sim_gpus=sim, interval=1.0 / args.rate_hz).run()


def cmd_rank(args: argparse.Namespace) -> int:
    from agent import rankexec

    # Only the separator goes: a "--" inside the command is the command's own argument.
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        sys.stderr.write("agent.pyz rank: no command\n")
        return 2
    return rankexec.main(args.job_dir, args.rank, args.local_rank, command)


def cmd_jobhost(args: argparse.Namespace) -> int:
    from agent import jobhost

    return jobhost.main(args.job_dir)


def cmd_slurmhost(args: argparse.Namespace) -> int:
    from agent import slurmstep

    return slurmstep.host_main(args.jobs_root, args.job_id, args.template)


def cmd_hold(args: argparse.Namespace) -> int:
    from agent import container

    return container.hold(args.pid)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="agent.pyz", description="rigdeck host agent")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("version", help="print the agent version, its hash and this host's facts as JSON")
    p.add_argument("--state-dir", default=None)
    p.add_argument("--install", action="store_true",
                   help="also move this archive into the state dir, if its hash is --expect-sha256")
    p.add_argument("--expect-sha256", default=None)
    p.set_defaults(func=cmd_version)
    p = sub.add_parser("attach", help="bridge stdin/stdout to the daemon, starting it if needed")
    p.add_argument("--state-dir", default="~/.rigdeck")
    p.add_argument("--no-start", action="store_true", help="fail instead of starting a daemon")
    p.add_argument("--role", default=None, choices=roles.ROLES,
                   help="the key's role (its forced command): requests outside its allow-list are refused")
    p.add_argument("--expect-sha256", default=None,
                   help="first check this archive's SHA-256 (and make its version the current one)")
    p.add_argument("--join-tag", default=None,
                   help="the tag a server issued to the person whose key line this is (said in the hello)")
    p.set_defaults(func=cmd_attach)
    p = sub.add_parser("daemon", help="run the daemon in the foreground (attach starts it detached)")
    p.add_argument("--state-dir", default="~/.rigdeck")
    p.add_argument("--rate-hz", type=float, default=1.0)
    p.set_defaults(func=cmd_daemon)
    p = sub.add_parser("rank", help="run one rank of a job (used by launchers)")
    p.add_argument("--job-dir", required=True)
    p.add_argument("--rank", type=int, default=None)
    p.add_argument("--local-rank", type=int, default=None)
    p.add_argument("command", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_rank)
    p = sub.add_parser("jobhost", help="supervise one job's ranks on this host (started by the daemon)")
    p.add_argument("--job-dir", required=True)
    p.set_defaults(func=cmd_jobhost)
    p = sub.add_parser("slurmhost", help="one node's task of a job Slurm runs: its job host, once its plan is in")
    p.add_argument("--jobs-root", required=True)
    p.add_argument("--job-id", required=True)
    p.add_argument("--template", default=None, help="the name of the template its plan is made of")
    p.set_defaults(func=cmd_slurmhost)
    p = sub.add_parser("hold", help="a [container] job's container process: lives while the job host does")
    p.add_argument("--pid", type=int, required=True)
    p.set_defaults(func=cmd_hold)
    args = parser.parse_args(argv)
    if getattr(args, "install", False) and not (args.expect_sha256 and args.state_dir):
        parser.error("--install needs --expect-sha256 and --state-dir")
    return int(args.func(args))
