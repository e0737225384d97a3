"""``rigdeck``: the app with no arguments, headless commands otherwise. Both drive one Controller."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from tui.controller import Controller, HostReport
from tui.inventory import (
    Inventory,
    InventoryError,
    hostfile_to_toml,
    load_hostfile,
    load_inventory,
)

EXIT_OK = 0
EXIT_HOST_FAILED = 1
EXIT_USAGE = 2


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--inventory",
        "-i",
        metavar="PATH",
        default=argparse.SUPPRESS,
        help="inventory TOML (default: $RIGDECK_INVENTORY or ~/.config/rigdeck/hosts.toml; "
        "with neither, this machine alone)",
    )
    p.add_argument(
        "--accept-new",
        action="store_true",
        default=argparse.SUPPRESS,
        help="record host keys not yet in known_hosts (a changed key is still refused)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rigdeck", description="A cockpit for bare-metal GPU clusters over SSH."
    )
    _common(parser)
    parser.add_argument("-v", "--verbose", action="store_true", help="log to stderr")
    sub = parser.add_subparsers(dest="command")

    p = sub.add_parser("app", help="open the terminal app (the default)")
    _common(p)

    p = sub.add_parser("hosts", help="reach every host and show what it is")
    _common(p)
    p.add_argument("names", nargs="*", metavar="HOST")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("deploy", help="install or upgrade the agent on hosts")
    _common(p)
    p.add_argument("names", nargs="*", metavar="HOST")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = sub.add_parser("inventory", help="inspect or import inventories")
    _common(p)
    isub = p.add_subparsers(dest="inventory_command", required=True)
    ip = isub.add_parser("show", help="print the resolved inventory")
    ip.add_argument("--json", action="store_true")
    ip = isub.add_parser("import", help="convert a DeepSpeed/MPI hostfile ('host slots=N') to TOML")
    ip.add_argument("hostfile")
    ip.add_argument("-o", "--output", help="write here instead of stdout (refuses to overwrite)")
    return parser


def _gpu_summary(r: HostReport) -> str:
    if not r.gpus:
        return "-" if r.gpu_source in (None, "none") else "0"
    sim = " simulated" if any(g.get("simulated") for g in r.gpus) else ""
    names = sorted({g.get("name", "?") for g in r.gpus})
    return f"{len(r.gpus)}x {'/'.join(names)}{sim}"


def _print_reports(reports: list[HostReport], *, deploy: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for col in ("host", "address", "state", "hostname", "agent", "python", "cpus", "mem", "gpus"):
        table.add_column(col)
    if deploy:
        table.add_column("copied")
    for r in reports:
        state = "up" if r.reachable and not r.error else ("error" if r.reachable else "unreachable")
        agent = (r.agent_version or "-") + ("" if r.agent_current or not r.agent_version else " (old)")
        row = [
            r.name,
            f"{r.address}:{r.port}" if r.transport == "ssh" else "local",
            state,
            r.hostname or "-",
            agent,
            r.python or "-",
            str(r.cpus or "-"),
            f"{r.memory_total_mb / 1024:.1f}G" if r.memory_total_mb else "-",
            _gpu_summary(r),
        ]
        if deploy:
            row.append("-" if r.copied is None else ("yes" if r.copied else "no (current)"))
        table.add_row(*row)
    console = Console()
    console.print(table)
    err = Console(stderr=True)
    for r in reports:
        if r.error:
            err.print(f"[bold red]{r.name}[/]: {r.error}", highlight=False, markup=True)


def _load(args: argparse.Namespace) -> Inventory:
    return load_inventory(getattr(args, "inventory", None))


def _run_hosts(args: argparse.Namespace, deploy: bool) -> int:
    inv = _load(args)
    with Controller(inv, accept_new=getattr(args, "accept_new", False)) as ctl:
        reports = ctl.deploy(args.names) if deploy else ctl.probe(args.names)
    if args.json:
        json.dump([r.to_json() for r in reports], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_reports(reports, deploy=deploy)
    return EXIT_OK if all(r.reachable and not r.error for r in reports) else EXIT_HOST_FAILED


def _run_inventory(args: argparse.Namespace) -> int:
    if args.inventory_command == "import":
        text = hostfile_to_toml(load_hostfile(args.hostfile))
        if args.output:
            out = Path(args.output)
            if out.exists():
                print(f"rigdeck: {out} exists; not overwriting", file=sys.stderr)
                return EXIT_USAGE
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
            print(f"wrote {out}", file=sys.stderr)
        else:
            sys.stdout.write(text)
        return EXIT_OK
    inv = _load(args)
    if args.json:
        hosts = [
            {
                "name": h.name, "address": h.address, "port": h.port, "user": h.user,
                "transport": h.transport, "python": h.python, "state_dir": h.state_dir,
                "labels": list(h.labels), "proxy_jump": h.proxy_jump, "slots": h.slots,
                "sim_gpus": h.sim_gpus,
            }
            for h in inv.hosts
        ]
        json.dump({"path": str(inv.path) if inv.path else None, "hosts": hosts}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(f"# {inv.path or 'built-in: this machine'}")
        for h in inv.hosts:
            via = f" via {h.proxy_jump}" if h.proxy_jump else ""
            print(f"{h.name}\t{h.user}@{h.address}:{h.port}{via}\t{h.transport}\t{','.join(h.labels)}")
    return EXIT_OK


def _run_app(args: argparse.Namespace) -> int:
    from tui.app import RigdeckApp

    inv = _load(args)
    RigdeckApp(Controller(inv, accept_new=getattr(args, "accept_new", False))).run()
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        if args.command in (None, "app"):
            return _run_app(args)
        if args.command == "hosts":
            return _run_hosts(args, deploy=False)
        if args.command == "deploy":
            return _run_hosts(args, deploy=True)
        if args.command == "inventory":
            return _run_inventory(args)
    except InventoryError as e:
        print(f"rigdeck: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    raise AssertionError(f"unhandled command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
