"""What an attach with a role may ask of the daemon: ``agent.pyz attach --role server``, the
forced command of a server's key (``rigdeck server setup`` on every host, ``rigdeck server join``
in a person's own ``authorized_keys``; docs/security.md).

The attach is the forced command, so the role is the key's, never the client's: the attach says
it to the daemon in the connection's first line, before any byte of the client's, and the daemon
answers every request outside the role's allow-list with a ``refused`` error naming the role and
what it may do. An attach with no role (a person's own, the workstation's) may do everything.

The server's allow-list is what a ``rigdeck serve`` asks of the agents (``tui/control``):
telemetry, jobs, the code store, logs, metrics, TensorBoard files, GPU health; not ``upgrade``
(the agent's code is its owner's to deploy), not ``shutdown``, and ``exec`` only of the agent's
own programs below, run by the agent's interpreter. ``job_start`` stays: a job is any command of
its owner's, so the server's key still starts processes as the account (see docs/security.md).

Stdlib only, Python 3.9+.
"""
import os
import pkgutil
import shutil
import sys
from typing import Any, Dict, List, Optional

SERVER = "server"
ROLES = (SERVER,)

# The agent's RPCs the server calls (tui/control and the tui/remote code it runs).
SERVER_METHODS = frozenset((
    "ping", "version", "facts", "sample", "subscribe",
    "job_start", "job_stop", "job_list", "job_status", "job_logs", "job_metrics",
    "job_claim", "job_release", "job_check", "job_gc", "job_stacks",
    "job_tensorboard_files", "job_tensorboard_read",
    "probe_port", "route_source", "exec",
    "code_have", "code_put", "code_unpack", "code_commit", "code_get", "artifact_pack",
    "gpu_health_clear", "prometheus_textfile",
    "slurm_submit",  # a job launched on a Slurm cluster: sbatch on the login host (agent/slurmstep.py)
    "slurm_template",  # ... and, while Slurm queues it, each node's template of its plan
))
# Not the server's: image_have and image_load (`rigdeck image push` is the workstation's, as
# deploy is), upgrade, shutdown, set_rate, unsubscribe.

# The programs the server runs through ``exec`` (``python -c SOURCE ARG...``): the doctor's
# probes (tui/control/doctorhost.py) and a processing input's listing (tui/control/jobs.py).
SERVER_PROGRAMS = ("doctorprobe.py", "listfiles.py")


def program_source(name: str) -> str:
    """The source of one of the agent's self-contained programs (from the zipapp on a host)."""
    data = pkgutil.get_data("agent", name)
    if data is None:
        raise FileNotFoundError("agent/%s" % name)
    return data.decode("utf-8")


def _interpreter(word: str) -> bool:
    """Is ``word`` (an exec's argv[0]) this agent's own interpreter, as exec would find it?"""
    found = shutil.which(word) if os.sep not in word else word
    if not found or not sys.executable:
        return False
    return os.path.realpath(found) == os.path.realpath(sys.executable)


class Role:
    """One connection's role: what it may ask."""

    def __init__(self, name: str):
        if name not in ROLES:
            raise ValueError("unknown role %r: expected one of %s" % (name, ", ".join(ROLES)))
        self.name = name
        self._programs = None  # type: Optional[List[str]]

    def programs(self) -> List[str]:
        if self._programs is None:
            self._programs = [program_source(n) for n in SERVER_PROGRAMS]
        return self._programs

    def refusal(self, method: str, params: Dict[str, Any]) -> Optional[str]:
        """Why ``method`` is refused to this role, or None when it may be asked."""
        may = "it may call %s" % ", ".join(sorted(SERVER_METHODS))
        if method not in SERVER_METHODS:
            return "the %s's key may not call %r (%s)" % (self.name, method, may)
        if method == "exec":
            argv = params.get("argv")
            ok = isinstance(argv, list) and len(argv) >= 3 and all(isinstance(a, str) for a in argv) \
                and argv[1] == "-c" and argv[2] in self.programs() and _interpreter(argv[0])
            if not ok:
                return ("the %s's key may exec only the agent's own programs (%s) with the agent's "
                        "interpreter (%s), as 'PYTHON -c SOURCE ARG...'" % (
                            self.name, ", ".join("agent/" + n for n in SERVER_PROGRAMS), sys.executable))
        return None
