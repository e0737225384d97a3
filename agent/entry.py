"""The agent's internal commands started many times per job, dispatched without ``agent.cli``.

A rank wrapper (``rank``), a job host (``jobhost``) and a Slurm node's task (``slurmhost``) are
fresh interpreters, one per rank or node of every job and restart: importing ``agent.cli``
(argparse, the host facts module) costs each of them tens of ms of CPU before it does anything,
and on a node starting a job those ms are taken from the ranks' own start. rigdeck writes these
command lines itself, in one shape (``--job-dir DIR [--rank R --local-rank L] -- COMMAND...``,
``--job-dir DIR``, ``--jobs-root DIR --job-id ID [--template KEY]``); ``run`` takes exactly that
shape and returns None for anything else, which then goes to ``agent.cli`` (argparse) as before.

Stdlib only, Python 3.9+.
"""
from __future__ import annotations

TYPE_CHECKING = False  # (mypy reads it as True) typing is not imported by a rank's or job's start
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

_OPTIONS = {
    "rank": (("--job-dir",), ("--rank", "--local-rank", "--standby")),
    "jobhost": (("--job-dir",), ()),
    "slurmhost": (("--jobs-root", "--job-id"), ("--template",)),
}


def parse(argv: List[str]) -> Optional[Tuple[str, Dict[str, str], List[str]]]:
    """(the command, its options, what follows ``--``) for one of the shapes above, else None."""
    if not argv or argv[0] not in _OPTIONS:
        return None
    name = argv[0]
    required, optional = _OPTIONS[name]
    opts = {}  # type: Dict[str, str]
    i = 1
    while i < len(argv) and argv[i] != "--":
        key = argv[i]
        if key not in required + optional or key in opts or i + 1 >= len(argv):
            return None
        opts[key] = argv[i + 1]
        i += 2
    rest = argv[i + 1:] if i < len(argv) else []
    if any(k not in opts for k in required) or (rest and name != "rank") or (name == "rank" and not rest):
        return None
    if name == "rank":
        for k in ("--rank", "--local-rank", "--standby"):
            if k in opts and not opts[k].lstrip("-").isdigit():
                return None
    return name, opts, rest


def run(argv: List[str]) -> Optional[int]:
    """Run ``argv`` if it is one of the internal commands' shapes; None: not one (argparse's)."""
    got = parse(argv)
    if got is None:
        return None
    name, opts, rest = got
    if name == "rank":
        from agent import rankexec

        def num(k: str) -> Optional[int]:
            return int(opts[k]) if k in opts else None

        return int(rankexec.main(opts["--job-dir"], num("--rank"), num("--local-rank"), rest,
                                 standby=opts.get("--standby") == "1"))
    if name == "jobhost":
        from agent import jobhost

        return int(jobhost.main(opts["--job-dir"]))
    from agent import slurmstep

    return int(slurmstep.host_main(opts["--jobs-root"], opts["--job-id"], opts.get("--template")))
