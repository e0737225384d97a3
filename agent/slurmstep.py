"""A job launched through Slurm, the hosts' side (stdlib, Python 3.9).

The controller asks the login host's agent to submit (``slurm_submit``): ``sbatch`` runs
``BATCH_SCRIPT``, a constant script whose one line starts one task per node of the allocation
(``srun --ntasks-per-node=1``) running the argv handed to sbatch after the script: no user value
is ever read by a shell (``"$@"`` passes sbatch's arguments on as they are). That argv is this
agent's ``slurmhost``: on each node, inside the Slurm step, it waits for the plan the controller
writes once it has read the allocation (nodes and GPU indices), then runs rigdeck's job host
(agent/jobhost.py) in its own process: the ranks, cluster files, launchers, metrics and
checkpoints are the job host's as on rigdeck's own placement, and ``scancel`` reaches every
process, since all of them are in the step.
"""
from __future__ import annotations

import os
import subprocess
import time
from typing import Any, Dict, List

from agent import filemodes
from agent.jobhost import no_site, read_json

BATCH_SCRIPT = (
    "#!/bin/sh\n"
    "# rigdeck's batch script (agent/slurmstep.py): one task per node of the allocation runs the\n"
    "# arguments sbatch was given after this script, as they are (no shell reads them).\n"
    'exec srun --ntasks-per-node=1 "$@"\n'
)
SUBMIT_TIMEOUT_S = 60.0
PLAN_WAIT_S = 900.0  # a step whose plan never comes (the controller gave up) ends itself
# sbatch options the controller may pass: each one "--name=value", its name one of these.
OPTIONS = ("nodes", "ntasks-per-node", "gres", "time", "partition", "account", "qos", "constraint",
           "job-name", "output", "chdir", "exclusive", "exclude")


class SlurmStepError(Exception):
    pass


def script_path(state_dir: str) -> str:
    """The batch script in ``<state_dir>/slurm`` (made owner-only, written when it differs)."""
    d = os.path.join(state_dir, "slurm")
    filemodes.private_dir(d, "Slurm batch script directory")
    path = os.path.join(d, "batch.sh")
    try:
        with open(path) as f:
            if f.read() == BATCH_SCRIPT:
                return path
    except OSError:
        pass
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(BATCH_SCRIPT)
    os.chmod(tmp, 0o700)
    os.replace(tmp, path)
    return path


def check_options(options: Any) -> List[str]:
    if not isinstance(options, list):
        raise SlurmStepError("'options' must be a list of sbatch options")
    for o in options:
        if not isinstance(o, str) or "\0" in o or "\n" in o or not o.startswith("--"):
            raise SlurmStepError("sbatch option %r: expected --name=value" % (o,))
        name = o[2:].split("=", 1)[0]
        if name not in OPTIONS:
            raise SlurmStepError("sbatch option %r: not one rigdeck passes (%s)" % (o, ", ".join(OPTIONS)))
    return list(options)


def step_argv(command: List[str], jobs_root: str, job_id: str) -> List[str]:
    """What each node's task runs: this agent's ``slurmhost`` for the job, from its zipapp (the
    same path on every node the agent was deployed to alike)."""
    return no_site(command) + ["slurmhost", "--jobs-root", jobs_root, "--job-id", job_id]


def submit(state_dir: str, jobs_root: str, command: List[str], job_id: str, options: Any) -> Dict[str, Any]:
    """``sbatch --parsable OPTIONS batch.sh STEP-ARGV``: the Slurm job id, or Slurm's own words
    when it refuses (exit code, stderr)."""
    # Slurm's own output (srun's words, a job host that could not start) beside the job dirs,
    # which every host of the job has: a dot file, which no job listing reads as a job.
    output = "--output=%s" % os.path.join(jobs_root, ".slurm-%j.out")
    argv = ["sbatch", "--parsable"] + check_options(options) + [output, script_path(state_dir)] + step_argv(
        command, jobs_root, job_id)
    try:
        cp = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            timeout=SUBMIT_TIMEOUT_S, cwd=os.path.expanduser("~"))
    except FileNotFoundError as e:
        return {"slurm_job_id": None, "exit_code": 127, "stderr": "sbatch: %s" % (e.strerror or e), "argv": argv}
    except subprocess.TimeoutExpired:
        return {"slurm_job_id": None, "exit_code": None,
                "stderr": "sbatch gave no answer in %g s" % SUBMIT_TIMEOUT_S, "argv": argv}
    out = cp.stdout.decode("utf-8", "replace").strip()
    err = cp.stderr.decode("utf-8", "replace").strip()
    first = out.split(";", 1)[0].strip() if cp.returncode == 0 else ""
    return {"slurm_job_id": first if first.isdigit() else None, "exit_code": cp.returncode,
            "stdout": out, "stderr": err, "argv": argv}


def wait_plan(job_dir: str, slurm_job_id: str, wait_s: float = PLAN_WAIT_S, poll_s: float = 0.05) -> bool:
    """Until the controller's plan for this Slurm job is in ``job_dir`` (a plan of an earlier
    attempt, or of another Slurm job, is not it)."""
    deadline = time.monotonic() + wait_s
    path = os.path.join(job_dir, "plan.json")
    while time.monotonic() < deadline:
        plan = read_json(path)
        if plan is not None and str((plan.get("slurm") or {}).get("job_id")) == slurm_job_id:
            return True
        time.sleep(poll_s)
    return False


def _from_unpacked(jobs_root: str, job_id: str) -> None:
    """Run from the zipapp (the one path every node's agent has: its unpacked copy is made by
    the daemon, lazily), go on from its byte-compiled copy, made here if need be: the job host
    and the rank wrappers it starts are then as quick to start as the daemon's."""
    from agent.paths import self_command, unpacked_command

    me = self_command()
    if len(me) == 2 and me[1].endswith(".pyz"):
        other = unpacked_command(me)
        if other != me:
            argv = no_site(other) + ["slurmhost", "--jobs-root", jobs_root, "--job-id", job_id]
            os.execv(argv[0], argv)


def host_main(jobs_root: str, job_id: str) -> int:
    """``agent.pyz slurmhost``: one node's task in the Slurm step."""
    from agent import jobhost
    from agent.jobs import JOB_ID_RE

    if not JOB_ID_RE.match(job_id):
        raise SystemExit("rigdeck slurmhost: bad job id %r" % job_id)
    slurm_job = os.environ.get("SLURM_JOB_ID")
    if not slurm_job:
        raise SystemExit("rigdeck slurmhost: not inside a Slurm job (no SLURM_JOB_ID)")
    _from_unpacked(jobs_root, job_id)
    job_dir = os.path.join(os.path.abspath(os.path.expanduser(jobs_root)), job_id)
    if not wait_plan(job_dir, slurm_job):
        raise SystemExit("rigdeck slurmhost: no plan for Slurm job %s in %s after %g s"
                         % (slurm_job, job_dir, PLAN_WAIT_S))
    return jobhost.main(job_dir)
