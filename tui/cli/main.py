"""``rigdeck``'s headless commands. With no command the app opens, through the opener the
command's entry point (``tui.main``) hands in. Both drive one HostLinks."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tui.cli import doctor as doctor_cli
from tui.cli import drain as drain_cli
from tui.cli import exec as exec_cli
from tui.cli import exporter as exporter_cli
from tui.cli import onboard as onboard_cli
from tui.cli import pipeline as pipeline_cli
from tui.cli import retry as retry_cli
from tui.cli import server as server_cli
from tui.cli import sweep as sweep_cli
from tui.cli import tensorboard as tensorboard_cli
from tui.cli import usage as usage_cli
from tui.cli import web as web_cli
from tui.client import (
    HostReport,
    ImageError,
    InProcessClient,
    TransportError,
    UnsafeDirError,
    connect,
    hostfile_to_toml,
    load_hostfile,
    load_inventory,
    set_passphrase_prompt,
)
from tui.model.diagnose import Signal
from tui.model.fields import Bad, listen_address, show
from tui.model.inventory import Inventory, InventoryError
from tui.model.jobstate import QUEUED, SUCCEEDED, TERMINAL, UNKNOWN
from tui.model.jobtext import code_lines, job_lines, last_checkpoint
from tui.model.jobview import JobView
from tui.model.permissions import PermissionDenied
from tui.model.slurm import QUEUE_NOTE, queue_order, queue_where
from tui.model.stages import StagesView

EXIT_OK = 0
EXIT_HOST_FAILED = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3  # a server refused: the work is someone else's, or the command is for admins


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

    p = sub.add_parser("launch", help="place and start a job from a spec file")
    _common(p)
    p.add_argument("spec", metavar="SPEC", help="job spec TOML")
    p.add_argument("--json", action="store_true")
    p.add_argument("--wait", action="store_true", help="supervise until the job ends; exit 0 only if it succeeded")
    p.add_argument("--no-queue", action="store_true",
                   help="refuse (exit 2) when the job does not fit now, instead of queueing it")

    p = sub.add_parser("queue", help="the jobs waiting to start: position, owner, priority, fair-share factor, "
                                     "what each waits for")
    _common(p)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("serve", help="run the controller as a server here (what `rigdeck server start` runs)")
    p.add_argument("--state-dir", default="~/.rigdeck/server", metavar="DIR")
    p.add_argument("--inventory", "-i", metavar="PATH", default=argparse.SUPPRESS,
                   help="inventory (default: DIR/inventory.toml, written by `rigdeck server setup`)")
    p.add_argument("--metrics-listen", metavar="ADDR:PORT", default=None,
                   help="also serve Prometheus' GET /metrics there (`rigdeck server start` passes the "
                   "inventory's [server] metrics_listen); no login: keep it on loopback unless meant")

    p = sub.add_parser("jobs", help="list jobs")
    _common(p)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("status", help="one job: state, placement, ranks, last step and loss, failure cause")
    _common(p)
    p.add_argument("job", metavar="JOB")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("logs", help="a job's logs, each line once, prefixed [host rN]")
    _common(p)
    p.add_argument("job", metavar="JOB")
    p.add_argument("--rank", type=int, default=None)
    p.add_argument("--follow", "-f", action="store_true")
    p.add_argument("--raw", action="store_true",
                   help="one rank's bytes exactly as it wrote them, no prefixes (needs --rank)")

    p = sub.add_parser("metrics", help="a job's steps and losses (every step once)")
    _common(p)
    p.add_argument("job", metavar="JOB")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("stop", help="stop a job on every host (SIGTERM, grace, SIGKILL, sweep)")
    _common(p)
    p.add_argument("job", metavar="JOB")
    p.add_argument("--grace", type=float, default=None, metavar="S", help="seconds between SIGTERM and SIGKILL")
    p.add_argument("--yes", "-y", action="store_true",
                   help="when JOB is a name several jobs share, stop the newest of them")
    p.add_argument("--no-wait", dest="wait", action="store_false",
                   help="return once the hosts are told, not when no process of the job is left "
                        "(it shows 'stopping' until then, its GPUs held)")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("gc", help="remove ended jobs' directories on the hosts past the inventory's retention")
    _common(p)
    p.add_argument("names", nargs="*", metavar="HOST")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("image", help="container images on the hosts ([container] jobs)")
    _common(p)
    isub = p.add_subparsers(dest="image_command", required=True)
    ip = isub.add_parser("push", help="put an image of this machine's Podman store into each host's "
                                      "(content-addressed, as code sync; hosts that have it are skipped)")
    ip.add_argument("image", metavar="IMAGE")
    ip.add_argument("names", nargs="*", metavar="HOST", help="default: every host of the inventory")
    ip.add_argument("--json", action="store_true")

    p = sub.add_parser("inventory", help="inspect or import inventories")
    _common(p)
    isub = p.add_subparsers(dest="inventory_command", required=True)
    ip = isub.add_parser("show", help="print the resolved inventory")
    ip.add_argument("--json", action="store_true")
    ip = isub.add_parser("import", help="convert a DeepSpeed/MPI hostfile ('host slots=N') to TOML")
    ip.add_argument("hostfile")
    ip.add_argument("-o", "--output", help="write here instead of stdout (refuses to overwrite)")
    onboard_cli.add_parser(isub)

    sweep_cli.add_parsers(sub, _common)
    doctor_cli.add_parser(sub, _common)
    drain_cli.add_parsers(sub, _common)
    usage_cli.add_parsers(sub, _common)
    retry_cli.add_parsers(sub, _common)
    pipeline_cli.add_parsers(sub, _common)
    exec_cli.add_parser(sub, _common)
    web_cli.add_parser(sub, _common)
    exporter_cli.add_parser(sub, _common)
    tensorboard_cli.add_parser(sub, _common)
    server_cli.add_parsers(sub)
    return parser


def _gpu_summary(r: HostReport) -> str:
    if not r.gpus:
        return "-" if r.gpu_source in (None, "none") else "0"
    sim = " simulated" if any(g.get("simulated") for g in r.gpus) else ""
    names = sorted({g.get("name", "?") for g in r.gpus})
    return f"{len(r.gpus)}x {'/'.join(names)}{sim}"


def _container_summary(r: HostReport) -> str:
    """``podman:3,docker``: the container runtimes, podman with its number of images."""
    c = r.containers or {}
    parts = []
    for name in c.get("runtimes") or ():
        images = c.get("images")
        parts.append(f"{name}:{len(images)}" if name == "podman" and images is not None else name)
    return ",".join(parts) or "-"


def _print_reports(reports: list[HostReport], *, deploy: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for col in ("host", "address", "state", "hostname", "agent", "python", "cpus", "mem", "gpus", "containers"):
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
            _container_summary(r),
        ]
        if deploy:
            row.append("-" if r.copied is None else ("yes" if r.copied else "no (current)"))
        table.add_row(*row)
    console = Console()
    console.print(table)
    for r in reports:  # podman's images, a line per host (names are long: not in the table)
        images = (r.containers or {}).get("images")
        if images:
            console.print(f"{r.name} images: {', '.join(images)}", highlight=False, soft_wrap=True)
    err = Console(stderr=True)
    for r in reports:
        if r.error:
            err.print(f"[bold red]{r.name}[/]: {r.error}", highlight=False, markup=True)
    unrun = [r.name for r in reports if deploy and not r.error and "python" not in r.checked]
    if unrun:  # say what deploy checked, and what it did not
        err.print(f"checked: the agent's SHA-256 as each host's disk holds it. Not run yet on "
                  f"{', '.join(unrun)}: the agent's first start there checks its Python "
                  "(`rigdeck hosts` starts it now)", highlight=False, markup=False)


def _load(args: argparse.Namespace) -> Inventory:
    # ``rigdeck hosts`` reads a Slurm cluster's nodes afresh (no [[hosts]]: they are Slurm's);
    # every other command uses the last answer for a few minutes.
    return load_inventory(getattr(args, "inventory", None), fresh=getattr(args, "command", None) == "hosts",
                          accept_new=bool(getattr(args, "accept_new", False)))


def _slurm_nodes(client: Any, inv: Inventory, reports: list[HostReport]) -> tuple[dict[str, Any], str | None]:
    """With ``[slurm]``: each reported host's Slurm node (host name -> SlurmNode or None), read by
    ``scontrol -o show nodes`` on the login host through its agent (no shell); and what went
    wrong, if anything (the hosts are shown all the same)."""
    from tui.model.slurm import SlurmReadError, node_index, read_nodes

    try:
        find = node_index(read_nodes(client.exec, inv))
    except SlurmReadError as e:
        return {}, str(e)
    return {r.name: find(r.name, r.hostname, r.address) for r in reports}, None


def _slurm_json(node: Any) -> dict[str, Any] | None:
    if node is None:
        return None
    return {"node": node.name, "state": node.short_state, "flags": list(node.flags), "reason": node.reason,
            "reason_user": node.reason_user, "reason_time": node.reason_time}


def _print_slurm(slurm: dict[str, Any], error: str | None) -> None:
    from tui.model.slurm import drain_text

    if error:
        print(f"rigdeck: {error}", file=sys.stderr)
        return
    for host, node in slurm.items():
        if node is None:
            print(f"{host}\tslurm: no node of this host")
            continue
        why = drain_text(node)
        print(f"{host}\tslurm: {node.name} {node.short_state}" + (f"\t{why}" if why else ""))


def _run_hosts(args: argparse.Namespace, deploy: bool) -> int:
    inv = _load(args)
    # Always from this workstation: inspecting and installing agents takes commands on the hosts,
    # which a server's key (restricted to the agent's attach) cannot run.
    slurm: dict[str, Any] = {}
    slurm_error: str | None = None
    slurm_ok = True
    with InProcessClient(inv, accept_new=getattr(args, "accept_new", False)) as client:
        reports = client.deploy(args.names) if deploy else client.probe(args.names)
        if inv.slurm is not None and not deploy:
            slurm_ok = _slurm_checked(client)
            slurm, slurm_error = _slurm_nodes(client, inv, reports)
    if args.json:
        out = [r.to_json() for r in reports]
        if inv.slurm is not None and not deploy:
            for r in out:
                r["slurm"] = _slurm_json(slurm.get(r["name"]))
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        if slurm_error:
            print(f"rigdeck: {slurm_error}", file=sys.stderr)
    else:
        _print_reports(reports, deploy=deploy)
        if inv.slurm is not None and not deploy:
            _print_slurm(slurm, slurm_error)
    if not slurm_ok:
        return EXIT_USAGE
    return EXIT_OK if all(r.reachable and not r.error for r in reports) else EXIT_HOST_FAILED


def _run_image(args: argparse.Namespace) -> int:
    """``rigdeck image push``: always from this workstation, whose Podman store holds the image."""
    from tui.model.textformat import size_bytes as fmt_bytes

    inv = _load(args)
    last: dict[str, int] = {}

    def progress(host: str, done: int, total: int) -> None:
        if args.json or not total:
            return
        if done - last.get(host, -(1 << 40)) >= 64 << 20 or done == total:
            last[host] = done
            print(f"image -> {host}: {fmt_bytes(done)} of {fmt_bytes(total)}", file=sys.stderr)

    with InProcessClient(inv, accept_new=getattr(args, "accept_new", False)) as client:
        try:
            results = client.image_push(args.image, args.names or None, progress)
        except ImageError as e:
            print(f"rigdeck: {e}", file=sys.stderr)
            return EXIT_USAGE
    if args.json:
        json.dump([r.to_json() for r in results], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for r in results:
            if r.error:
                print(f"{r.host}\tfailed: {r.error}")
            elif r.skipped:
                print(f"{r.host}\thas {args.image}: skipped")
            else:
                print(f"{r.host}\tloaded {args.image} ({fmt_bytes(r.bytes_sent)} sent, {r.seconds:.1f} s)")
    return EXIT_OK if all(not r.error for r in results) else EXIT_HOST_FAILED


def _run_inventory(args: argparse.Namespace) -> int:
    if args.inventory_command == "add":
        return onboard_cli.run(args)
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
                "sim_gpus": h.sim_gpus, "prometheus_textfile": h.prometheus_textfile,
                "claim_dir_owner": h.claim_dir_owner,
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


def _client(args: argparse.Namespace) -> Any:
    return connect(_load(args), accept_new=getattr(args, "accept_new", False))


def _code_progress() -> Any:
    """A printer of code-sync progress: a line per host at each quarter of what it is sent."""
    from tui.model.textformat import size_bytes
    shown: dict[tuple[str, str], int] = {}

    def show(job_id: str, host: str, done: int, total: int) -> None:
        quarter = 4 if total == 0 else done * 4 // total
        if shown.get((job_id, host), -1) >= quarter:
            return
        shown[(job_id, host)] = quarter
        if total == 0:
            print(f"code → {host}: has this version, nothing to send", file=sys.stderr, flush=True)
        else:
            print(f"code → {host}: {size_bytes(done)} of {size_bytes(total)}", file=sys.stderr, flush=True)

    return show


def job_signals(client: Any, view: JobView, records: list[dict[str, Any]] | None = None) -> list[Signal]:
    """A live job's bottleneck signals (tui.model.diagnose) from its metrics records (read here
    unless given); none for a job that ended or has not started. No telemetry here: GPU
    utilization counts as unknown."""
    from tui.model.diagnose import signals_from_records

    if view.state in TERMINAL or view.state == QUEUED or view.unreachable:
        return []  # with hosts unreachable, the others' ranks alone would mislead
    if records is None:
        records = client.metrics(view.job_id)
    world = sum(int(n.get("slots") or 0) for n in view.placement)
    return list(signals_from_records(records, spec=view.spec, world=world))


def job_stages(client: Any, view: JobView, records: list[dict[str, Any]] | None = None) -> StagesView | None:
    """A [model_parallel] job's plan and stages (tui.model.stages) from its metrics records (read
    here unless given), the plan from its history when the hosts no longer have it; None for any
    other job."""
    from tui.model.stages import stages_from_records

    if not view.spec.get("model_parallel") or view.state == QUEUED:
        return None
    if records is None:
        try:
            records = client.metrics(view.job_id)
        except Exception as e:  # hosts gone: the history's plan, without measurements
            print(f"rigdeck: the stages' measurements could not be read: {e}", file=sys.stderr)
            records = []
    return stages_from_records(records, view.events, view.spec)


def _status_records(client: Any, view: JobView) -> list[dict[str, Any]] | None:
    """The metrics records ``status`` reads once for both signals and stages (None: neither
    needs them). None read while hosts of the job are unreachable: the view just waited for them,
    and signals from the other hosts' ranks alone would mislead (the stages show the plan)."""

    if view.unreachable:
        return []
    live = view.state not in TERMINAL and view.state != QUEUED
    return client.metrics(view.job_id) if live else None


def _print_job(v: JobView, signals: Sequence[Signal] = (), stages: StagesView | None = None,
               checkpoint: Mapping[str, Any] | None = None) -> None:
    for line in job_lines(v, signals, stages, checkpoint):
        print(line)


def _print_metrics(records: list[dict[str, Any]]) -> None:
    """Steps and events, one a line. Every value is the rank's own (a metrics line is whatever a
    rank appended), so each goes through ``terminal_safe``: no escape of theirs reaches the
    terminal."""
    from tui.model.termsafe import terminal_safe

    def s(value: Any) -> str:
        return terminal_safe(str(value))

    for r in records:
        if r.get("event"):
            print(f"{s(r.get('host'))} r{s(r.get('rank'))} {s(r['event'])} {s(r.get('status', ''))} "
                  f"step {s(r.get('step'))}")
        else:
            print(f"step {s(r.get('step')):<8} loss {s(r.get('loss')):<22} rank {s(r.get('rank'))} {s(r.get('host'))}")


def _print_logs(chunks: Any, *, raw: bool, flush: bool) -> None:
    """Rank output as bytes, as the ranks wrote them (``rigdeck logs`` is ``cat``, not the app):
    each line prefixed ``[host rN] ``, a line that came in pieces printed as one line."""
    out = sys.stdout.buffer
    mid: dict[tuple[str, int], bool] = {}  # a rank's line is printed up to its middle
    last: tuple[str, int] | None = None
    for host, rank, data, _partial in chunks:
        key = (host, rank)
        if raw:
            out.write(data)
        else:
            if last is not None and last != key and mid.get(last):
                out.write(b"\n")
                mid[last] = False
            prefix = f"[{host} r{rank}] ".encode()
            lines = data.split(b"\n")
            for i, line in enumerate(lines):
                if i == len(lines) - 1 and not line:
                    break
                if not mid.get(key):
                    out.write(prefix)
                out.write(line)
                if i < len(lines) - 1:
                    out.write(b"\n")
                    mid[key] = False
                else:
                    mid[key] = True
        last = key
        if flush:
            out.flush()
    if not raw and last is not None and mid.get(last):
        out.write(b"\n")
    out.flush()


def _print_queue(entries: list[Any]) -> None:
    if not entries:
        print("no job waits")
        return
    print(f"{'pos':<4} {'job':<34} {'user':<10} {'prio':>4} {'fair':>5} {'gpus':>4}  {'waiting since':<19} waits for")
    for e in entries:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.queued_at))
        fair = f"{e.fairshare:.2f}" if e.fairshare is not None else "-"
        print(f"{e.position:<4} {e.job_id:<34} {e.user:<10} {e.priority:>4} {fair:>5} {e.gpus:>4}  {since:<19} "
              f"{e.waiting}")


def _run_jobs(args: argparse.Namespace) -> int:
    """The job commands, each its own function over one client."""
    from tui.client import JobError

    client = _client(args)
    try:
        return _JOB_COMMANDS[args.command](client, args)
    except JobError as e:
        print(f"rigdeck: {e}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        client.close()


def _launch(client: Any, args: argparse.Namespace) -> int:
    from tui.client import JobError, PlacementError
    from tui.model.jobspec import JobSpecError, load_jobspec

    try:
        spec = load_jobspec(args.spec)
        if client.kind == "embedded" and client.inventory.slurm is not None:
            # Every host Slurm may choose is linked to while the login checks the spec: the
            # launch reads them all next.
            client.controller.reach(list(client.inventory.names))
        if not _slurm_checked(client):  # a [slurm] table Slurm does not know: nothing runs
            return EXIT_USAGE
        if spec.sweep is not None:
            print(f"rigdeck: {args.spec}: has a [sweep] table: run it with rigdeck sweep "
                  f"{args.spec}", file=sys.stderr)
            return EXIT_USAGE
        if spec.code is not None and not args.json:
            client.on_code_progress(_code_progress())
        view = client.launch(spec, queue=not args.no_queue)
    except (JobSpecError, PlacementError, JobError) as e:
        print(f"rigdeck: {e}", file=sys.stderr)
        return EXIT_USAGE
    if not args.json:
        _print_launched(client, view)
    if args.wait:
        for v in client.wait(view.job_id):
            if not args.json:
                print(f"{v.job_id}: {v.state}" + (f" (restart {v.restarts})" if v.restarts else ""), flush=True)
        view = client.view(view.job_id)
    if args.json:
        json.dump(view.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif args.wait:
        _print_job(view)
    if args.wait:
        return EXIT_OK if view.state == SUCCEEDED else EXIT_HOST_FAILED
    return EXIT_OK


def _print_launched(client: Any, view: Any) -> None:
    """What a launch did: queued (where, waiting for what) or started (where, after what)."""
    if view.state == QUEUED:
        pos = next((e.position for e in client.queue() if e.job_id == view.job_id), "?")
        print(f"queued {view.job_id} (position {pos}): waits for {view.waiting}", flush=True)
        if client.kind == "embedded":
            print("  (no server: the queue advances only while rigdeck runs: the app, or "
                  "launch --wait)", flush=True)
        return
    slurm = view.slurm or {}
    if slurm.get("nodes_start") and not view.placement:
        why = f" ({slurm['reason']})" if slurm.get("reason") else ""
        print(f"submitted {view.job_id}: Slurm job {slurm.get('job_id')} {slurm.get('state') or 'PENDING'}{why}",
              flush=True)
        print("  (Slurm queues it: the nodes Slurm gives start it, whoever watches; rigdeck status shows "
              "where it ran)", flush=True)
        return
    hosts = dict.fromkeys(n["host"] for n in view.placement)  # a pool job's replicas share hosts
    print(f"launched {view.job_id}: {', '.join(hosts)}", flush=True)
    for ev in view.events:
        if ev.get("event") == "waited for stop":
            print(f"  (queued {ev.get('waited_s')} s, until {', '.join(ev.get('jobs') or [])} "
                  "had stopped and released its GPUs)", flush=True)
    if view.pool_sizing:
        print(f"reduction server sizing: {view.pool_sizing.get('text')}", flush=True)
    for line in code_lines(view.spec.get("code"), view.events):
        print(line, flush=True)


def _jobs(client: Any, args: argparse.Namespace) -> int:
    views = client.list_jobs()
    if args.json:
        json.dump([v.to_json() for v in views], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(f"{'job':<34} {'user':<10} {'state':<10} {'restarts':<8} hosts")
        for v in views:
            away = f"  ({', '.join(v.unreachable)} unreachable)" if v.unreachable else ""
            print(f"{v.job_id:<34} {v.user or '-':<10} {v.state:<10} {v.restarts:<8} "
                  f"{','.join(n['host'] for n in v.placement)}{away}")
    return EXIT_OK


def _slurm_queue(client: Any) -> tuple[list[Any], str | None]:
    """With ``[slurm]``: every user's jobs in Slurm's queue (squeue on the login host, through its
    agent, no shell), and what kept them from being read. A client attached to a server runs no
    command on a host: Slurm is then read from here."""
    from tui.client import InProcessClient
    from tui.model.slurm import SlurmReadError, read_jobs

    inv = client.inventory
    try:
        if client.kind == "embedded":
            return read_jobs(client.exec, inv), None
        with InProcessClient(inv, accept_new=False) as local:
            return read_jobs(local.exec, inv), None
    except SlurmReadError as e:
        return [], str(e)


def _slurm_checked(client: Any) -> bool:
    """With ``[slurm]``: its values checked against Slurm on the login host (tui.model.slurm
    ``check_spec``); each error and note said on stderr. False when anything is wrong: then
    nothing runs."""
    from tui.client import InProcessClient
    from tui.model.slurm import check_spec

    inv = client.inventory
    if inv.slurm is None:
        return True
    if client.kind == "embedded":
        checked = check_spec(client.exec, inv)
    else:
        with InProcessClient(inv, accept_new=False) as local:
            checked = check_spec(local.exec, inv)
    for note in checked.notes:
        print(f"rigdeck: note: {note}", file=sys.stderr)
    for error in checked.errors:
        print(f"rigdeck: {error}", file=sys.stderr)
    return not checked.errors


def _slurm_job_json(j: Any) -> dict[str, Any]:
    return {"job_id": j.job_id, "user": j.user, "state": j.state, "reason": j.reason,
            "node_count": j.node_count, "nodes": list(j.nodes), "gpus_per_node": j.gpus_per_node}


def _print_slurm_queue(jobs: list[Any], login: str) -> None:
    print(f"\nSlurm's queue on {login}: every user's jobs, pending first")
    if not jobs:
        print("no Slurm job")
        return
    print(f"{'job':<10} {'user':<10} {'state':<11} {'nodes':>5} {'gpus/node':>9}  why pending / where")
    for j in queue_order(jobs):
        count = "-" if j.node_count is None else str(j.node_count)
        print(f"{j.job_id:<10} {j.user:<10} {j.state:<11} {count:>5} {j.gpus_per_node:>9}  {queue_where(j)}")


def _queue(client: Any, args: argparse.Namespace) -> int:
    from tui.client import wire_json

    entries = client.queue()
    inv = client.inventory
    slurm_jobs: list[Any] = []
    slurm_error: str | None = None
    if inv.slurm is not None:
        slurm_jobs, slurm_error = _slurm_queue(client)
    if args.json:
        out: Any = wire_json(entries)
        if inv.slurm is not None:
            out = {"rigdeck": out, "slurm": [_slurm_job_json(j) for j in slurm_jobs],
                   "slurm_error": slurm_error, "note": QUEUE_NOTE}
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        if inv.slurm is not None:
            print("rigdeck's queue")
        _print_queue(entries)
        if client.kind == "embedded" and entries:
            print("(no server: the queue advances only while rigdeck runs: the app, or launch --wait)")
        if inv.slurm is not None:
            if slurm_error is None:
                _print_slurm_queue(slurm_jobs, inv.slurm.login_host(inv.hosts) or "?")
            print(f"\n({QUEUE_NOTE})")
    if slurm_error:
        print(f"rigdeck: {slurm_error}", file=sys.stderr)
    return EXIT_OK


def _status(client: Any, args: argparse.Namespace) -> int:
    view = client.view(args.job)
    records = _status_records(client, view)
    signals = job_signals(client, view, records)
    stages = job_stages(client, view, records)
    checkpoint = None
    if (view.spec.get("checkpoint") or {}).get("dir") and view.state != QUEUED and not view.unreachable:
        checkpoint = last_checkpoint(records if records is not None else client.metrics(view.job_id))
    if args.json:
        json.dump({**view.to_json(), "signals": [s.to_json() for s in signals],
                   "stages": stages.to_json() if stages is not None else None,
                   "checkpoint": checkpoint}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_job(view, signals, stages, checkpoint)
    return EXIT_HOST_FAILED if view.state == UNKNOWN else EXIT_OK


def _logs(client: Any, args: argparse.Namespace) -> int:
    if args.raw and args.rank is None:
        print("rigdeck: --raw needs --rank N (one rank's bytes)", file=sys.stderr)
        return EXIT_USAGE
    _print_logs(client.log_chunks(args.job, rank=args.rank, follow=args.follow), raw=args.raw, flush=args.follow)
    return EXIT_OK


def _gc(client: Any, args: argparse.Namespace) -> int:
    unknown = [n for n in args.names if n not in client.inventory.names]
    if unknown:
        print(f"rigdeck: unknown host(s) {', '.join(unknown)}", file=sys.stderr)
        return EXIT_USAGE
    results = client.collect_garbage(args.names or None)
    out = {h: (r if isinstance(r, dict) else {"error": str(r)}) for h, r in results.items()}
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        ret = client.inventory.retention
        print(f"retention: ended jobs newer than {ret.max_age_days:g} days, at most {ret.max_jobs} per host")
        for h, r in out.items():
            if "error" in r:
                print(f"{h}: {r['error']}")
            else:
                print(f"{h}: removed {len(r['removed'])}, kept {r['kept']} ended and {len(r['running'])} running"
                      + (f" ({', '.join(r['removed'])})" if r["removed"] else ""))
    return EXIT_OK if all("error" not in r for r in out.values()) else EXIT_HOST_FAILED


def _metrics(client: Any, args: argparse.Namespace) -> int:
    records = client.metrics(args.job)
    if args.json:
        json.dump(records, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_metrics(records)
    return EXIT_OK


def _stop(client: Any, args: argparse.Namespace) -> int:
    """``rigdeck stop``: by default returns once no process of the job is left on any host and
    its GPU claims are released, saying so; ``--no-wait`` once the hosts are told."""
    from tui.client import AmbiguousJobError

    began = time.monotonic()
    if args.wait and not args.json:
        print(f"stopping {args.job}: waiting until no process of it is left on its hosts and its GPU claims "
              "are released (--no-wait returns at once)", flush=True)
    try:
        view = client.stop(args.job, grace_s=args.grace, yes=args.yes, wait=args.wait)
    except AmbiguousJobError as e:
        print(f"rigdeck: {e} (stop --yes {args.job} stops the newest)", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        json.dump(view.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif not args.wait:
        print(f"{view.job_id}: {view.state} (the hosts are stopping it; its GPUs are held until they are done)")
    elif view.state in TERMINAL:
        hosts = ", ".join(dict.fromkeys(n["host"] for n in view.placement)) or "no host"
        print(f"{view.job_id}: {view.state} after {time.monotonic() - began:.1f} s: no process of it left "
              f"on {hosts}, its GPU claims released")
    else:
        left = next((e.get("left") for e in reversed(view.events) if e.get("event") == "stop incomplete"), None)
        said = "; ".join(f"{h}: {w}" for h, w in (left or {}).items()) or "the hosts did not say"
        print(f"{view.job_id}: {view.state}: not done after the grace period and 30 s more ({said}); "
              "it is recorded stopped once the hosts are done", file=sys.stderr)
    if not args.wait:
        return EXIT_OK if view.state in (*TERMINAL, "stopping") else EXIT_HOST_FAILED
    return EXIT_OK if view.state in TERMINAL else EXIT_HOST_FAILED


# Opens the app with a client and, when there is no inventory yet, the onboarding offer. The CLI
# never imports the app: the ``rigdeck`` command (``tui.main``) hands this in.
AppOpener = Callable[[Any, Any], None]


_JOB_COMMANDS: dict[str, Callable[[Any, argparse.Namespace], int]] = {
    "launch": _launch, "jobs": _jobs, "queue": _queue, "status": _status, "logs": _logs, "gc": _gc,
    "metrics": _metrics, "stop": _stop,
}


def _run_app(args: argparse.Namespace, open_app: AppOpener | None) -> int:
    from tui.client import onboarding_offer

    if open_app is None:
        print("rigdeck: this entry point has no app; run `rigdeck` (or python -m tui) to open it", file=sys.stderr)
        return EXIT_USAGE
    # No inventory yet: the app offers the ssh config's hosts first (its onboarding screen).
    offer = onboarding_offer(getattr(args, "inventory", None))
    open_app(_client(args), offer)
    return EXIT_OK


def _run_serve(args: argparse.Namespace) -> int:
    from tui.client import serve

    metrics = None
    if args.metrics_listen is not None:
        try:
            metrics = listen_address(args.metrics_listen)
        except Bad as e:
            print(f"rigdeck serve: --metrics-listen {show(args.metrics_listen)}: expected {e.expected}",
                  file=sys.stderr)
            return EXIT_USAGE
    inventory = Path(args.inventory) if getattr(args, "inventory", None) else None
    return serve(Path(args.state_dir), inventory_path=inventory, metrics_listen=metrics)


def main(argv: Sequence[str] | None = None, open_app: AppOpener | None = None) -> int:
    """The ``rigdeck`` command's commands; with none (or ``app``), ``open_app`` opens the app."""
    args = build_parser().parse_args(argv)
    # An encrypted key's passphrase: asked on the terminal, once (none without a terminal).
    set_passphrase_prompt(onboard_cli.ask_passphrase)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        if args.command in (None, "app"):
            return _run_app(args, open_app)
        if args.command == "hosts":
            return _run_hosts(args, deploy=False)
        if args.command == "deploy":
            return _run_hosts(args, deploy=True)
        if args.command == "inventory":
            return _run_inventory(args)
        if args.command == "image":
            return _run_image(args)
        if args.command in ("launch", "jobs", "status", "logs", "metrics", "stop", "gc", "queue"):
            return _run_jobs(args)
        if args.command in ("sweep", "sweeps"):
            return sweep_cli.run(args, _client)
        if args.command == "doctor":
            return doctor_cli.run(args, _client)
        if args.command in ("drain", "undrain", "drains"):
            return drain_cli.run(args, _client)
        if args.command == "usage":
            return usage_cli.run(args, _client)
        if args.command in ("retry", "priority"):
            return retry_cli.run(args, _client)
        if args.command in ("pipeline", "pipelines"):
            return pipeline_cli.run(args, _client)
        if args.command == "exec":
            return exec_cli.run(args, _load)
        if args.command == "web":
            return web_cli.run(args, _load)
        if args.command == "exporter":
            return exporter_cli.run(args, _client)
        if args.command == "tensorboard":
            return tensorboard_cli.run(args, _client)
        if args.command == "serve":
            return _run_serve(args)
        if args.command in ("server", "attach"):
            return server_cli.run(args)
    except InventoryError as e:
        print(f"rigdeck: {e}", file=sys.stderr)
        return EXIT_USAGE
    except PermissionDenied as e:  # a server's rules (tui.model.permissions): the words say whose and why
        print(f"rigdeck {args.command}: {e}", file=sys.stderr)
        return EXIT_REFUSED
    except UnsafeDirError as e:  # RIGDECK_HOME (or a server's directory) someone else may reach
        print(f"rigdeck: {e}", file=sys.stderr)
        return EXIT_USAGE
    except TransportError as e:  # the server (or a host) out of reach, or refusing the key: one line
        print(f"rigdeck {args.command}: {e}", file=sys.stderr)
        return EXIT_HOST_FAILED
    except KeyboardInterrupt:
        return 130
    raise AssertionError(f"unhandled command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
