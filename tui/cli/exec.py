"""``rigdeck exec [HOST ... | --all | --label L] [--json] [--timeout S] -- CMD ARG...``

Runs one command on many hosts at once, through each host's agent (``exec``): the program and
its arguments reach the host as a list and are run there with no shell, so nothing in them is
parsed, split or expanded on the way. Always from this workstation, as the user (a server's
keys run the agent's attach only). Output comes per host, each line prefixed with the host's
name (stdout to stdout, stderr to stderr), then an exit-code summary on stderr. Exit status 1
when any host failed (a non-zero exit, a signal, a timeout, or no answer), 2 for bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
DEFAULT_TIMEOUT_S = 600.0


def add_parser(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser(
        "exec", help="run a command on hosts at once, with no remote shell: HOST ... | --all | --label L -- CMD ARG...",
        description=__doc__.splitlines()[2].strip() if __doc__ else None)
    common(p)
    p.add_argument("--all", action="store_true", help="every host of the inventory")
    p.add_argument("--label", action="append", default=[], metavar="L", help="hosts with this label (repeatable)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"seconds before the command is killed on a host (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--json", action="store_true")
    p.add_argument("words", nargs=argparse.REMAINDER, metavar="HOST ... -- CMD ARG...")


class UsageError(Exception):
    pass


def split_words(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """Host names and the command, from what follows ``exec``: everything after the first
    ``--`` is the command, as it is; before it, host names and the options."""
    words = list(args.words)
    if "--" not in words:
        raise UsageError("put the command after `--`: rigdeck exec HOST ... -- CMD ARG...")
    cut = words.index("--")
    before, argv = words[:cut], words[cut + 1:]
    hosts: list[str] = []
    it = iter(before)
    for w in it:
        if w == "--all":
            args.all = True
        elif w == "--json":
            args.json = True
        elif w in ("--label", "--timeout"):
            value = next(it, None)
            if value is None:
                raise UsageError(f"{w} needs a value")
            if w == "--label":
                args.label.append(value)
            else:
                try:
                    args.timeout = float(value)
                except ValueError:
                    raise UsageError(f"--timeout: expected seconds, got {value!r}") from None
        elif w.startswith("-"):
            raise UsageError(f"unknown option {w!r} before `--`")
        else:
            hosts.append(w)
    if not argv:
        raise UsageError("no command after `--`")
    return hosts, argv


def choose_hosts(inventory: Any, names: list[str], all_hosts: bool, labels: list[str]) -> list[str]:
    """The hosts named, labelled, or all of them, in inventory order; UsageError for a name the
    inventory does not have, a label no host has, or no choice at all."""
    known = list(inventory.names)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"unknown host(s) {', '.join(unknown)} (the inventory has {', '.join(known)})")
    if not (names or all_hosts or labels):
        raise UsageError("name the hosts, or give --all or --label L")
    chosen = set(names)
    if all_hosts:
        chosen.update(known)
    for label in labels:
        having = [h.name for h in inventory.hosts if label in h.labels]
        if not having:
            raise UsageError(f"no host has label {label!r}")
        chosen.update(having)
    return [h for h in known if h in chosen]


def outcome(result: Any) -> dict[str, Any]:
    """One host's result as JSON: the agent's answer, or the error that kept it from answering."""
    if isinstance(result, dict):
        return dict(result)
    return {"exit_code": None, "signal": None, "stdout": "", "stderr": "", "stdout_dropped": 0,
            "stderr_dropped": 0, "timed_out": False, "error": f"unreachable: {result}", "duration_s": None}


def failed(r: dict[str, Any]) -> bool:
    return r.get("exit_code") != 0 or bool(r.get("timed_out")) or r.get("signal") is not None


def why(r: dict[str, Any]) -> str:
    if r.get("timed_out"):
        return "timed out (killed)"
    if r.get("exit_code") is None:
        return str(r.get("error") or "no answer")
    if r.get("signal") is not None:
        return f"killed by signal {r['signal']}"
    text = f"exit {r['exit_code']}"
    return f"{text}: {r['error']}" if r.get("error") else text


def _prefixed(host: str, text: str, dropped: int, stream: Any) -> None:
    if text:
        for line in text.splitlines():
            stream.write(f"{host}: {line}\n")
    if dropped:
        stream.write(f"{host}: [... {dropped} more bytes not kept ...]\n")


def run(args: argparse.Namespace, load_inventory: Callable[[argparse.Namespace], Any]) -> int:
    try:
        names, argv = split_words(args)
        if not (0 < args.timeout <= 86400):
            raise UsageError("--timeout: expected seconds in (0, 86400]")
        inventory = load_inventory(args)
        hosts = choose_hosts(inventory, names, args.all, args.label)
    except UsageError as e:
        print(f"rigdeck exec: {e}", file=sys.stderr)
        return EXIT_USAGE
    from tui.client import InProcessClient

    # Always from this workstation, over the user's own connections: a server's keys run the
    # agent's attach only, and a command is the user's to run, not the server's.
    with InProcessClient(inventory, accept_new=getattr(args, "accept_new", False)) as client:
        got = client.exec(hosts, argv, args.timeout)
    results = {h: outcome(got.get(h, "no answer")) for h in hosts}
    bad = [h for h in hosts if failed(results[h])]
    if args.json:
        json.dump({"argv": argv, "hosts": [{"host": h, **results[h]} for h in hosts], "failed": bad},
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for h in hosts:
            r = results[h]
            _prefixed(h, r["stdout"], int(r.get("stdout_dropped") or 0), sys.stdout)
            _prefixed(h, r["stderr"], int(r.get("stderr_dropped") or 0), sys.stderr)
        sys.stdout.flush()
        width = max(len(h) for h in hosts)
        for h in hosts:
            r = results[h]
            took = f"  {r['duration_s']:.2f} s" if isinstance(r.get("duration_s"), (int, float)) else ""
            print(f"{h:<{width}}  {why(r)}{took}", file=sys.stderr)
        print(f"{len(bad)} of {len(hosts)} host(s) failed" + (f": {', '.join(bad)}" if bad else ""),
              file=sys.stderr)
    return EXIT_FAILED if bad else EXIT_OK
