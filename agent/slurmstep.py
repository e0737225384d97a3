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

A job whose plan a template can describe starts with nobody watching: before ``sbatch`` the
controller writes a *template* (``slurm_template``) on every node Slurm may choose, in the jobs
root as ``.slurm-<key>.template.json``, ``<key>`` a random name the step's argv carries
(``--template``): the plan without what only the allocation tells (which nodes, in which order,
with which GPUs, and the rendezvous port). When Slurm runs the job (at once, or after days in
its queue), each node's task finds the template, reads the allocation from Slurm itself
(``SLURM_JOB_NODELIST``, ``SLURM_NODEID``, ``scontrol -d show job``'s GPU indices), makes its plan
of it (``complete``), and starts the job host as if the controller had written the plan.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time

from agent import filemodes, slurmtext

TYPE_CHECKING = False  # (mypy reads it as True) typing is not imported by a rank's or job's start
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional

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
           "job-name", "output", "chdir", "exclusive", "exclude", "nodelist")


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


def step_command(agent: List[str], unpacked: Optional[List[str]], nodes_said: Any) -> List[str]:
    """The agent command the step runs on every node: its unpacked copy (``unpacked``, this
    login host's) where every node that kept the job's template said its own is the same
    (``nodes_said``, what the controller gathered: one interpreter per node, starting from
    byte-compiled files), else the zipapp ``agent`` (which goes on to its copy itself, a second
    interpreter). Only this host's own value is ever run: the controller's is compared, not used."""
    if unpacked is not None and isinstance(nodes_said, list) and nodes_said == unpacked:
        return list(unpacked)
    return list(agent)


def step_argv(command: List[str], jobs_root: str, job_id: str, template: Optional[str] = None) -> List[str]:
    """What each node's task runs: this agent's ``slurmhost`` for the job, from its zipapp (the
    same path on every node the agent was deployed to alike); ``template``: the name of the
    template its nodes make their plans of."""
    from agent.jobhost import no_site  # (not at the top: a node's task imports only what it runs)

    return no_site(command) + ["slurmhost", "--jobs-root", jobs_root, "--job-id", job_id] + (
        ["--template", template] if template else [])


def submit(state_dir: str, jobs_root: str, command: List[str], job_id: str, options: Any,
           template: Optional[str] = None) -> Dict[str, Any]:
    """``sbatch --parsable OPTIONS batch.sh STEP-ARGV``: the Slurm job id, or Slurm's own words
    when it refuses (exit code, stderr)."""
    if template is not None:
        check_key(template)
    # Slurm's own output (srun's words, a job host that could not start) beside the job dirs,
    # which every host of the job has: a dot file, which no job listing reads as a job.
    output = "--output=%s" % os.path.join(jobs_root, ".slurm-%j.out")
    argv = ["sbatch", "--parsable"] + check_options(options) + [output, script_path(state_dir)] + step_argv(
        command, jobs_root, job_id, template)
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


PORT_BASE, PORT_SPAN = 20000, 10000  # a node-made plan's rendezvous port: from its Slurm job id


KEY_RE = re.compile(r"^[0-9a-f]{16,64}$")  # a template's name: random hex, from the controller


def template_path(jobs_root: str, key: str) -> str:
    return os.path.join(jobs_root, ".slurm-%s.template.json" % key)


def check_key(key: Any) -> str:
    if not isinstance(key, str) or not KEY_RE.match(key):
        raise SlurmStepError("'key' must be a template's name: 16 to 64 hex digits")
    return key


def check_template(key: Any, template: Any) -> Dict[str, Any]:
    """A template as the controller sends it (``slurm_template``), or SlurmStepError saying what
    is wrong: nothing of it is trusted further than its shape."""
    from agent.jobs import JOB_ID_RE

    check_key(key)
    if not isinstance(template, dict):
        raise SlurmStepError("'template' must be an object")
    base, hosts = template.get("base"), template.get("hosts")
    if not isinstance(base, dict) or not isinstance(base.get("job_id"), str) or not JOB_ID_RE.match(base["job_id"]):
        raise SlurmStepError("template 'base' must be a plan's fields with its 'job_id'")
    if not isinstance(hosts, dict) or not hosts:
        raise SlurmStepError("template 'hosts' must map each Slurm node rigdeck may get to its part")
    for name, part in hosts.items():
        if not isinstance(part, dict) or not isinstance(part.get("node"), dict) \
                or not isinstance(part.get("command"), list) or not part["command"] \
                or not all(isinstance(c, str) for c in part["command"]) \
                or not isinstance(part.get("master_addr"), str) or not isinstance(part.get("env", {}), dict):
            raise SlurmStepError("template 'hosts' %r: expected node, command, master_addr and env" % (name,))
    return template


def write_template(jobs_root: str, key: Any, template: Any) -> str:
    """The controller's template named ``key`` (checked), owner-only: it holds the job's
    environment."""
    check_template(key, template)
    os.makedirs(jobs_root, mode=0o755, exist_ok=True)
    path = template_path(jobs_root, key)
    tmp = "%s.tmp-%d" % (path, os.getpid())
    filemodes.write_private(tmp, json.dumps(template).encode())
    os.replace(tmp, path)
    return path


def port_for(slurm_job_id: str, environ: Dict[str, str]) -> int:
    """The rendezvous port every node of the job agrees on without asking each other: the first of
    the ports Slurm reserved for the step where the site set ``MpiParams=ports``, else one made
    of the job id (two jobs on one node get different ports unless their ids are PORT_SPAN apart)."""
    reserved = environ.get("SLURM_STEP_RESV_PORTS", "")
    first = reserved.split(",", 1)[0].split("-", 1)[0].strip()
    if first.isdigit() and 0 < int(first) < 65536:
        return int(first)
    return PORT_BASE + int(slurm_job_id) % PORT_SPAN


def complete(template: Dict[str, Any], slurm_job_id: str, nodes: List[str], node_id: int,
             gpus: Dict[str, List[int]], environ: Dict[str, str]) -> Dict[str, Any]:
    """This node's plan of a template, for Slurm's allocation: ``nodes`` in Slurm's order (the
    first is the primary), this node the ``node_id``-th, ``gpus`` each node's GPU indices."""
    hosts = template["hosts"]
    missing = [n for n in nodes if n not in hosts]
    if missing:
        raise SlurmStepError("Slurm allocated node(s) %s, which the template has no part for (%s)"
                             % (", ".join(missing), ", ".join(sorted(hosts))))
    if not 0 <= node_id < len(nodes):
        raise SlurmStepError("SLURM_NODEID %d is not a node of %s" % (node_id, ",".join(nodes)))
    mine = hosts[nodes[node_id]]
    plan = dict(template["base"])
    plan.update(
        nodes=[dict(hosts[n]["node"], gpus=[int(g) for g in gpus.get(n) or []]) for n in nodes],
        node_index=node_id, master_addr=hosts[nodes[0]]["master_addr"],
        master_port=port_for(slurm_job_id, environ), command=list(mine["command"]),
        env=dict(mine.get("env") or {}), slurm={"job_id": slurm_job_id, "nodes_start": True},
    )
    if mine.get("workdir"):
        plan["workdir"] = mine["workdir"]
    return plan


def allocation(slurm_job_id: str, environ: Dict[str, str]) -> tuple:
    """The job's nodes in Slurm's order and each one's GPU indices, as Slurm says them here."""
    nodes = slurmtext.hostlist(environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or "")
    if not nodes:
        raise SlurmStepError("no SLURM_JOB_NODELIST in the step's environment")
    try:
        cp = subprocess.run(["scontrol", "-d", "show", "job", slurm_job_id], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SlurmStepError("scontrol -d show job %s: %s" % (slurm_job_id, e)) from None
    if cp.returncode != 0:
        raise SlurmStepError("scontrol -d show job %s: %s" % (
            slurm_job_id, cp.stderr.decode("utf-8", "replace").strip() or "exit %d" % cp.returncode))
    gpus = slurmtext.job_node_gpus(cp.stdout.decode("utf-8", "replace"))
    return nodes, gpus


def wait_plan(job_dir: str, slurm_job_id: str, wait_s: float = PLAN_WAIT_S, poll_s: float = 0.05,
              template: str = "") -> str:
    """Until the controller's plan for this Slurm job is in ``job_dir`` (a plan of an earlier
    attempt, or of another Slurm job, is not it): ``"plan"``; or until the controller's template
    for it is at ``template``: ``"template"``; ``""`` when neither came."""
    from agent.jobhost import read_json

    deadline = time.monotonic() + wait_s
    path = os.path.join(job_dir, "plan.json")
    while time.monotonic() < deadline:
        plan = read_json(path)
        if plan is not None and str((plan.get("slurm") or {}).get("job_id")) == slurm_job_id:
            return "plan"
        if template and os.path.exists(template):
            return "template"
        time.sleep(poll_s)
    return ""


def _from_unpacked(jobs_root: str, job_id: str, template: Optional[str]) -> None:
    """Run from the zipapp (the one path every node's agent has: its unpacked copy is made by
    the daemon, lazily), go on from its byte-compiled copy, made here if need be: the job host
    and the rank wrappers it starts are then as quick to start as the daemon's."""
    from agent.paths import self_command, unpacked_command

    me = self_command()
    if len(me) == 2 and me[1].endswith(".pyz"):
        other = unpacked_command(me)
        if other != me:
            argv = step_argv(other, jobs_root, job_id, template)
            os.execv(argv[0], argv)


def host_main(jobs_root: str, job_id: str, template: Optional[str] = None) -> int:
    """``agent.pyz slurmhost``: one node's task in the Slurm step."""
    _from_unpacked(jobs_root, job_id, template)  # first: nothing more compiled from the zipapp
    from agent import jobhost
    from agent.jobs import JOB_ID_RE

    if not JOB_ID_RE.match(job_id):
        raise SystemExit("rigdeck slurmhost: bad job id %r" % job_id)
    slurm_job = os.environ.get("SLURM_JOB_ID")
    if not slurm_job:
        raise SystemExit("rigdeck slurmhost: not inside a Slurm job (no SLURM_JOB_ID)")
    if template is not None and not KEY_RE.match(template):
        raise SystemExit("rigdeck slurmhost: bad template name %r" % template)
    root = os.path.abspath(os.path.expanduser(jobs_root))
    job_dir = os.path.join(root, job_id)
    path = template_path(root, template) if template else ""
    got = wait_plan(job_dir, slurm_job, template=path)
    if not got:
        raise SystemExit("rigdeck slurmhost: no plan for Slurm job %s in %s after %g s"
                         % (slurm_job, job_dir, PLAN_WAIT_S))
    if got == "template":
        _plan_from_template(root, job_id, slurm_job, template or "", path)
    return jobhost.main(job_dir)


def _plan_from_template(root: str, job_id: str, slurm_job: str, key: str, path: str) -> None:
    """This node's plan made of the controller's template and Slurm's allocation, its job
    directory made as the agent makes a Slurm job's (agent/jobs.py)."""
    from agent.jobhost import read_json
    from agent.jobs import Jobs
    from agent.paths import self_command

    try:
        template = check_template(key, read_json(path))
        if template["base"]["job_id"] != job_id:
            raise SlurmStepError("template %s is job %s's, not %s's" % (key, template["base"]["job_id"], job_id))
        nodes, gpus = allocation(slurm_job, dict(os.environ))
        plan = complete(template, slurm_job, nodes, int(os.environ.get("SLURM_NODEID") or 0), gpus,
                        dict(os.environ))
    except (SlurmStepError, ValueError) as e:
        raise SystemExit("rigdeck slurmhost: Slurm job %s: %s" % (slurm_job, e)) from None
    jobs = Jobs(os.path.dirname(root), self_command())
    jobs.start(plan)
    try:
        os.unlink(path)  # used: the plan holds it now (the nodes Slurm did not give keep theirs until gc)
    except OSError:
        pass
