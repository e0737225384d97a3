"""``agent.pyz jobhost --job-dir D``: supervises one job's ranks on one host.

The daemon starts one per job per host, detached in its own session, so its process group is the
job's process group on this host. It starts the ranks (itself for ``direct``, through torchrun,
or through mpirun on the primary), waits for them, stops the rest of this host's ranks when one
fails, enforces ``max_runtime``, and keeps ``state.json`` current. Neither an agent restart nor a
dropped SSH session touches it. Stdlib only, Python 3.9+.
"""
from __future__ import annotations

import collections
import glob
import json
import os
import select
import shutil
import signal
import subprocess
import time

from agent import clusterfiles, gpuhealth, hangrule, standby
from agent import container as containers
from agent.jobfiles import (  # noqa: F401  (read_json: imported from here by others)
    free_mb,
    is_resource_error,
    read_env_file,
    read_json,
    reserve,
    resource_message,
    tail,
    write_json,
)
from agent.rankexec import die_with_parent

TYPE_CHECKING = False  # (mypy reads it as True) typing is not imported by a rank's or job's start
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

    Box = Optional[containers.Container]  # the container a rank runs in; None: on the host

MEMORY_ROOT = "/dev/shm"  # runtime.checkpoint.memory_job_dir's: the ranks' memory snapshots


def memory_job_dir(job_id: str, root: str = MEMORY_ROOT) -> str:
    """Where a job's ranks of this account keep their memory snapshots on this host (the same
    path as runtime.checkpoint.memory_job_dir; the agent does not import the runtime)."""
    return os.path.join(root, "rigdeck-mem-%d" % os.getuid(), job_id)

POLL_S = 0.5  # at the latest: a rank's exit wakes the loop at once (SIGCHLD), a poll finds the rest
STOP_POLL_S = 0.1  # a stop looks this often whether its ranks are gone (a restart waits for it)
DISK_FULL_MB = 1.0  # a failure with less than this free under the job dir is put down to it
TERMINAL = ("succeeded", "failed", "stopped")
GPU_HEALTH_FILE = "gpu-health.json"  # the job's GPUs that are not ok, as the daemon judged them
# The daemon writes gpu-health.json from a sample at most 0.5 s old, in a loop that turns each second
GPU_HEALTH_LAG_S = 2.0
STANDBY_AFTER_S = 5.0  # an attempt's standbys start this long after its first step (its start has the CPUs first)
STOP_FILE = "stop.json"  # the agent's stop, on disk: a job host healing in place reads it before it starts again


def agent_command() -> List[str]:
    """How ranks invoke this agent (the zipapp when we run from one)."""
    from agent.paths import self_command

    return self_command()


def no_site(command: List[str]) -> List[str]:
    """``command`` (an agent command: interpreter first) run without ``site``: the job host and
    the rank wrappers need only the standard library, and a site with many .pth files and import
    hooks (an editable install, a big environment) costs tens of ms of CPU at every start, which
    a wave of trials starting at once pays many times over. Only for the zipapp (``[python,
    agent.pyz]``), which carries everything it imports; an agent run from a source tree
    (``-m agent``) may be importable only through site."""
    from agent.paths import is_unpacked

    if len(command) == 2 and (command[1].endswith(".pyz") or is_unpacked(command[1])):
        return [command[0], "-S", command[1]]
    return list(command)


def pid_alive(pid: Optional[int]) -> bool:
    """True for a live process (a zombie is not alive)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def tree_reading(pid: int, proc_root: str = "/proc") -> Optional[Tuple[bool, int]]:
    """Whether any process of ``pid``'s tree (it and its descendants) is running or in disk wait
    at this moment, and the CPU clock ticks (user + system) the tree's live processes have used;
    None when ``pid`` is gone (or a zombie)."""
    running, ticks = False, 0
    seen = set()  # type: set
    todo = [pid]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open("%s/%d/stat" % (proc_root, p)) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            state, used = fields[0], int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            if p == pid:
                return None
            continue
        if state == "Z":
            if p == pid:
                return None
            continue
        running = running or state in ("R", "D")
        ticks += used
        try:
            tasks = os.listdir("%s/%d/task" % (proc_root, p))
        except OSError:
            tasks = []
        for t in tasks:
            try:
                with open("%s/%d/task/%s/children" % (proc_root, p, t)) as f:
                    todo.extend(int(c) for c in f.read().split())
            except (OSError, ValueError):
                pass
    return running, ticks


def claim_fds(env: Dict[str, str]) -> List[int]:
    """The GPU claim descriptors the daemon handed this job host (``RIGDECK_CLAIM_FDS``)."""
    out = []
    for part in (env.get("RIGDECK_CLAIM_FDS") or "").split(","):
        if part.strip().isdigit():
            out.append(int(part))
    return out


def mark_attempt(d: str, restart_count: int) -> None:
    """Record where attempt ``restart_count``'s metrics begin in every rank's metrics files (and
    when it began) in ``attempts.json``, so each record can be told apart by attempt (a restarted
    gang repeats its steps). The agent marks each start it makes; a job host healing in place
    marks its own."""
    marks = (read_json(os.path.join(d, "attempts.json")) or {}).get("attempts") or []
    sizes = {os.path.basename(p): os.path.getsize(p) for p in glob.glob(os.path.join(d, "metrics", "*.jsonl"))}
    marks = [m for m in marks if int(m.get("restart_count", -1)) < restart_count]
    # hypertune's file is rewritten, not appended to: its entries are told apart by time
    marks.append({"restart_count": restart_count, "sizes": sizes, "started": time.time()})
    write_json(os.path.join(d, "attempts.json"), {"attempts": marks})


def processes_with_tag(job_id: str, proc_root: str = "/proc") -> List[int]:
    """Pids (other than ours) whose environment carries RIGDECK_JOB_ID=<job_id>."""
    needle = ("RIGDECK_JOB_ID=%s" % job_id).encode()
    me = os.getpid()
    out = []  # type: List[int]
    try:
        entries = os.listdir(proc_root)
    except OSError:
        return out
    for e in entries:
        if not e.isdigit() or int(e) == me:
            continue
        try:
            with open(os.path.join(proc_root, e, "environ"), "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0") and not (b"RIGDECK_STANDBY=" in env and standby.waiting(int(e), env)):
            out.append(int(e))  # (a warm standby still waiting is not the job's yet: agent/standby.py)
    return out


def group_members(pgid: int, proc_root: str = "/proc") -> List[int]:
    """Pids in process group ``pgid``, except this process."""
    me = os.getpid()
    out = []
    for e in os.listdir(proc_root):
        if not e.isdigit() or int(e) == me:
            continue
        try:
            with open(os.path.join(proc_root, e, "stat")) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid:
            out.append(int(e))
    return out


def sweep(job_id: str, sig: int = signal.SIGKILL) -> List[int]:
    """Signal every process still carrying the job id; never by process name."""
    hit = []
    for pid in processes_with_tag(job_id):
        try:
            os.kill(pid, sig)
            hit.append(pid)
        except OSError:
            pass
    return hit


class RankProgress:
    """What this host's ranks wrote to their metrics files since this job host started (an earlier
    attempt's lines are not this one's): each file's newest step, the sections (``runtime.section``)
    its rank is inside, and the longest run of each section it ended. Read as the files grow, a
    few bytes per look."""

    NAMES = ("rank-", "defs-rank-")

    def __init__(self, metrics_dir: str) -> None:
        self.dir = metrics_dir
        self.offsets = {}  # type: Dict[str, int]
        self.steps = {}  # type: Dict[str, float]
        self.inside = {}  # type: Dict[str, List[str]]
        self.ended = {}  # type: Dict[str, float]
        self.first_step_at = None  # type: Optional[float]  # the earliest step record's own time
        self.last_at = {}  # type: Dict[str, Tuple[float, float]]  # file -> its newest (step, record time)
        # the recent intervals between a rank's steps, by the records' own times (hangrule.typical)
        self.intervals = collections.deque(maxlen=64)  # type: collections.deque
        for name in self._files():
            try:
                self.offsets[name] = os.path.getsize(os.path.join(self.dir, name))
            except OSError:
                pass

    def _files(self) -> List[str]:
        try:
            names = os.listdir(self.dir)
        except OSError:
            return []
        return [n for n in names if n.endswith(".jsonl") and n.startswith(self.NAMES)]

    def read(self) -> None:
        for name in self._files():
            path = os.path.join(self.dir, name)
            offset = self.offsets.get(name, 0)
            try:
                size = os.path.getsize(path)
                if size < offset:  # made again (smaller): read it from its start
                    offset = 0
                if size <= offset:
                    continue
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read(1 << 20)
            except OSError:
                continue
            whole = data.rfind(b"\n") + 1  # a line still being written waits for the next look...
            if whole == 0 and len(data) == 1 << 20:
                whole = len(data)  # ...unless it is longer than a look reads: no step record, skipped
            self.offsets[name] = offset + whole
            for line in data[:whole].split(b"\n"):
                if b'"step"' in line or b'"section"' in line:
                    self._take(name, line)

    def _take(self, name: str, line: bytes) -> None:
        try:
            rec = json.loads(line.decode("utf-8", "replace"))
        except ValueError:
            return
        if not isinstance(rec, dict):
            return
        event = rec.get("event")
        if event is None:
            step = rec.get("step")
            if isinstance(step, (int, float)) and not isinstance(step, bool):
                self.steps[name] = max(self.steps.get(name, float("-inf")), float(step))
                when = rec.get("time")
                if isinstance(when, (int, float)) and not isinstance(when, bool):
                    self.first_step_at = min(self.first_step_at or float(when), float(when))
                    before = self.last_at.get(name)
                    if before is None or float(step) > before[0]:
                        if before is not None and float(when) >= before[1]:
                            self.intervals.append(float(when) - before[1])
                        self.last_at[name] = (float(step), float(when))
        elif event == "section" and isinstance(rec.get("section"), str):
            inside = self.inside.setdefault(name, [])
            if rec.get("phase") == "begin":
                inside.append(rec["section"])
            elif rec.get("phase") == "end" and rec["section"] in inside:
                inside.remove(rec["section"])
                seconds = rec.get("seconds")
                if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
                    self.ended[rec["section"]] = max(self.ended.get(rec["section"], 0.0), float(seconds))

    def sections(self) -> List[str]:
        return sorted({n for names in self.inside.values() for n in names})


class JobHost:
    def __init__(self, job_dir: str):
        self.job_dir = os.path.abspath(job_dir)
        plan = read_json(os.path.join(self.job_dir, "plan.json"))
        if plan is None:
            raise SystemExit("rigdeck jobhost: no plan.json in %s" % self.job_dir)
        self.plan = self._with_env_file(plan)  # type: Dict[str, Any]
        self.node_index = int(plan["node_index"])
        self.node = plan["nodes"][self.node_index]
        # A pool job may run several replicas (nodes) here, each with its own command.
        self.node_indices = clusterfiles.node_indices(plan)
        self.pooled = clusterfiles.is_pool_plan(plan)
        self.replicas = []  # type: List[Dict[str, Any]]  # state.json "replicas" (pool jobs)
        self.replica_procs = {}  # type: Dict[int, List[subprocess.Popen]]
        self.job_id = str(plan["job_id"])
        self.launcher = plan["launcher"]
        self.procs = []  # type: List[Any]  # subprocess.Popen, or standby.Adopted (a warm standby it adopted)
        self.state_path = os.path.join(self.job_dir, "state.json")
        self.state = {
            "job_id": self.job_id,
            "host": self.node["host"],
            "node_index": self.node_index,
            "restart_count": plan.get("restart_count", 0),
            "state": "starting",
            "jobhost_pid": os.getpid(),
            "started": time.time(),
            "ended": None,
            "cause": None,
            "expected_ranks": sorted(r for i in self.node_indices
                                     for r in clusterfiles.global_ranks(plan, i)),
        }  # type: Dict[str, Any]
        self.stop_requested = False
        self.stop_reason = None  # type: Optional[str]
        self.claim_fds = claim_fds(dict(os.environ))  # kept open: passed to every launcher
        self._preexec = die_with_parent()
        health = plan.get("health") or {}
        self.on_hang = str(health.get("on_hang") or "restart")
        self.progress = RankProgress(os.path.join(self.job_dir, "metrics"))
        self.hang_watch = self._new_watch()
        self.idle = hangrule.Idle(hz=float(os.sysconf("SC_CLK_TCK")))
        self.rank_pids = {}  # type: Dict[int, int]  # this attempt's ranks here -> their pids (the idle look's)
        # the quiet look's last sight: (no step for, every rank asleep for, quiet timeout, typical step)
        self.quiet = None  # type: Optional[Tuple[float, float, float, float]]
        self.standby_envs = {}  # type: Dict[int, Dict[str, str]]  # local rank -> its env (when standbys are kept)
        self.standbys = []  # type: List[subprocess.Popen]  # standbys this job host started, until reaped
        self.standbys_started = False  # this attempt's standbys (for the next one) were started
        self.adopted = 0  # ranks of this attempt that were warm standbys
        # The containers this host runs: a job's one (``plan["container"]``), or a pool job's,
        # one per distinct container of its replicas here (each node's ``container``: its pool's).
        self.box_nodes = {}  # type: Dict[str, List[int]]  # a container's name -> the nodes in it
        self.boxes, self.node_box = self._containers(plan)
        self.container = None if self.pooled else self.node_box.get(self.node_index)
        # Who heals this job (the controller's plan says, docs/jobs.md "With nobody watching"): a
        # job of one host heals in place here, this many times at most, with nobody watching.
        heal = plan.get("heal") or {}  # type: Dict[str, Any]
        self.heals_here = (heal.get("by") == "host" and not self.pooled and self.container is None
                           and self.launcher in ("direct", "torchrun") and len(plan["nodes"]) == 1)
        self.heals_left = int(heal.get("restarts_left") or 0)
        self.on_exit_codes = [int(c) for c in heal.get("on_exit_codes") or []]

    def _new_watch(self) -> hangrule.Watch:
        health = self.plan.get("health") or {}
        return hangrule.Watch(time.monotonic(), _seconds(health.get("hang_timeout")),
                              _seconds(health.get("startup_timeout")))

    # -- state --------------------------------------------------------------------------------

    def save(self, **changes: Any) -> None:
        self.state.update(changes)
        try:
            write_json(self.state_path, self.state)  # rewritten in place when the disk is full
        except OSError as e:
            if not is_resource_error(e):
                raise
            self.log("cannot save state: %s" % e)

    def log(self, text: str) -> None:
        try:
            with open(os.path.join(self.job_dir, "jobhost.log"), "a") as f:
                f.write("%s %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S"), text))
        except OSError:
            pass  # a full disk: state.json says what matters

    def _containers(self, plan: Dict[str, Any]) -> "Tuple[List[containers.Container], Dict[int, Box]]":
        """This host's containers, and which of them each of its nodes runs in (None: on the
        host). A pool job's node names its own (``container``: its pool's, null for none); a
        plan without that key on its nodes, the job's. Several distinct ones here: each named
        after the pools it holds (``rigdeck-JOB-HOST-worker``), else the job's one name."""
        def spec_of(i: int) -> Optional[Dict[str, Any]]:
            node = plan["nodes"][i]
            spec = node.get("container") if self.pooled and "container" in node else plan.get("container")
            return self._with_channels(spec) if isinstance(spec, dict) and spec.get("image") else None

        groups = []  # type: List[List[Any]]  # [spec, [node indices]]
        for i in self.node_indices:
            spec = spec_of(i)
            if spec is None:
                continue
            for g in groups:
                if g[0] == spec:
                    g[1].append(i)
                    break
            else:
                groups.append([spec, [i]])
        boxes = []  # type: List[containers.Container]
        by_node = {}  # type: Dict[int, Box]
        host = str(self.node["host"])
        for spec, nodes in groups:
            who = host if len(groups) == 1 else "%s-%s" % (host, "-".join(
                sorted({str(plan["nodes"][i].get("pool")) for i in nodes})))
            box = containers.Container(spec, self.job_id, who, self.job_dir)
            self.box_nodes[box.name] = nodes
            boxes.append(box)
            for i in nodes:
                by_node[i] = box
        return boxes, by_node

    def _with_channels(self, spec: Dict[str, Any]) -> Dict[str, Any]:
        """A container's spec with each of the job's channel sources (a pipeline step's staged
        inputs, a spec's ``channels``) mounted read-only at its own path, so that the channel
        links in the job dir resolve inside: those that exist here, outside the paths the
        container mounts anyway (the job dir, the workdir)."""
        mounted = [self.job_dir, os.path.abspath(self.plan.get("workdir") or self.job_dir)]
        extra = list(spec.get("mounts") or ())
        try:
            channels = clusterfiles.channel_sources(self.plan)
        except ValueError:
            return spec
        for src in channels:
            src = os.path.abspath(src)
            inside = any(src == m or src.startswith(m.rstrip("/") + "/") for m in mounted)
            if inside or src == "/" or ":" in src or "," in src or not os.path.exists(src):
                continue
            extra.append("%s:%s:ro" % (src, src))
        return dict(spec, mounts=extra) if extra != list(spec.get("mounts") or ()) else spec

    def _popen(self, argv: List[str], box: "Box", **kw: Any) -> subprocess.Popen:
        """A launcher or wrapper: holds the job's GPU claims and dies with this job host. With a
        container (``box``), it runs in it (the runtime's exec)."""
        if box is not None:
            argv = box.exec_argv(kw["env"], kw["cwd"], argv, self._gpus(box))
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, pass_fds=self.claim_fds,
                                preexec_fn=self._preexec, **kw)

    def _gpus(self, box: "Box" = None) -> List[int]:
        """The job's GPUs here (with ``box``: those of the nodes that run in it)."""
        nodes = self.box_nodes.get(box.name, self.node_indices) if box is not None else self.node_indices
        return sorted({int(g) for i in nodes for g in self.plan["nodes"][i].get("gpus") or []})

    def _agent(self, box: "Box" = None) -> List[str]:
        """How a wrapper starts the agent: in a container, the image's python3 runs it (mounted
        at its own path)."""
        me = agent_command()
        if box is not None and len(me) == 2:
            return no_site(["python3", me[1]])
        return no_site(me)

    def _start_containers(self) -> None:
        """Every container this host runs for the job, before any rank; state.json names them
        (``container``: the first, ``containers``: all) for the agent to remove should this job
        host be killed outright."""
        if not self.boxes:
            return
        if self.launcher == "mpirun":
            raise containers.ContainerError("a [container] job runs with the direct or torchrun "
                                            "launcher, not mpirun")
        if len(agent_command()) != 2:
            raise containers.ContainerError("a [container] job needs the agent's zipapp (this agent "
                                            "runs from a source tree)")
        started = []  # type: List[Dict[str, Any]]
        for box in self.boxes:
            # named in state.json before it starts: a job host killed halfway leaves none behind
            named = {"name": box.name, "runtime": box.runtime, "pid": None}
            self.save(container=started[0] if started else named, containers=started + [named])
            box.start(self.plan, self._agent(box), self._gpus(box), self.log)
            started.append(dict(named, pid=box.pid()))
        self.save(container=started[0], containers=started)

    def remove_containers(self) -> None:
        for box in self.boxes:
            box.remove()

    # -- start --------------------------------------------------------------------------------

    def _wrap(self, rank: Optional[int], local_rank: Optional[int],
              box: "Box" = None) -> List[str]:
        argv = self._agent(box) + ["rank", "--job-dir", self.job_dir]
        if rank is not None:
            argv += ["--rank", str(rank), "--local-rank", str(local_rank)]
        return argv + ["--"]

    def _finish_env(self, env: Dict[str, str]) -> None:
        """What every rank's environment gets on top of the cluster's (in place)."""
        plan = self.plan
        env["PYTHONUNBUFFERED"] = "1"
        env.pop("RIGDECK_CLAIM_FDS", None)
        if plan.get("log_max_bytes"):
            env["RIGDECK_LOG_CAP"] = str(int(plan["log_max_bytes"]))
        if plan.get("loss_pattern"):
            env["RIGDECK_LOSS_PATTERN"] = str(plan["loss_pattern"])
        if plan.get("metric_definitions"):  # rank 0's wrapper parses its output with them
            env["RIGDECK_METRIC_DEFINITIONS"] = json.dumps(plan["metric_definitions"])
        me = agent_command()
        if len(me) == 2:  # ranks can `import runtime` straight from the agent's zipapp (or its copy)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (me[1], env.get("PYTHONPATH", "")) if p)

    def start(self) -> None:
        plan = self.plan
        iface = clusterfiles.route_interface(plan["master_addr"])
        if self.pooled:
            self._start_replicas(iface)
            return
        env = dict(os.environ)
        env.update(clusterfiles.node_env(plan, self.node_index, self.job_dir, iface))
        self._finish_env(env)
        os.makedirs(os.path.join(self.job_dir, "logs"), exist_ok=True)
        os.makedirs(os.path.join(self.job_dir, "ranks"), exist_ok=True)
        cwd = plan.get("workdir") or self.job_dir
        command = list(plan["command"])
        self._start_containers()
        box = self.container
        out = open(os.path.join(self.job_dir, "launcher.log"), "ab")
        if self.launcher == "direct":
            warm = self.warm_imports(command, cwd)
            self.standby_envs = {}
            for local_rank, rank in enumerate(clusterfiles.global_ranks(plan, self.node_index)):
                renv = dict(env)
                renv.update(clusterfiles.rank_env(plan, self.node_index, local_rank))
                if warm is not None:
                    self.standby_envs[local_rank] = renv
                    got = standby.adopt(self.job_dir, local_rank, rank, renv, command, cwd, self.claim_fds)
                    if got is not None:  # a warm standby is this rank now (agent/standby.py)
                        self.procs.append(standby.Adopted(
                            int(got["wrapper"]), os.path.join(self.job_dir, "ranks", "rank-%d.exit.json" % rank)))
                        self.adopted += 1
                        continue
                self.procs.append(self._popen(self._wrap(rank, local_rank, box) + command, box, cwd=cwd,
                                              env=renv, stdout=out, stderr=out))
        elif self.launcher == "torchrun":
            nodes = plan["nodes"]
            argv = [
                command[0], "-m", "torch.distributed.run",
                "--nnodes", str(len(nodes)),
                "--nproc-per-node", str(self.node["slots"]),
                "--node-rank", str(self.node_index),
                "--master-addr", plan["master_addr"],
                "--master-port", str(plan["master_port"]),
                "--max-restarts", "0",  # rigdeck restarts the whole gang across hosts itself
                "--no-python",
            ] + self._wrap(None, None, box) + command
            self.procs.append(self._popen(argv, box, cwd=cwd, env=env, stdout=out, stderr=out))
        elif self.launcher == "mpirun":
            if self.node_index == 0:
                hostfile = env["RIGDECK_HOSTFILE"]
                names = sorted(k for k in env if k.startswith(("RIGDECK_", "SM_", "SAGEMAKER_", "AIP_", "CLOUD_ML_"))
                               or k in ("CLUSTER_SPEC", "TF_CONFIG", "MASTER_ADDR", "MASTER_PORT",
                                        "WORLD_SIZE", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
                                        "PYTHONUNBUFFERED", "PATH", "LD_LIBRARY_PATH", "PYTHONPATH")
                               or k in dict(plan.get("env") or {}))
                slurm = clusterfiles.slurm_mpi(plan, env, self.job_dir)
                if slurm is not None:  # Open MPI's daemons through Slurm's srun, on Slurm's names
                    hostfile, env = slurm
                argv = clusterfiles.mpirun_argv(plan, names, iface, hostfile)
                # mpirun runs the command on every host: put the rank wrapper in front of it there.
                cmd_at = len(argv) - len(command)
                argv = argv[:cmd_at] + self._wrap(None, None) + argv[cmd_at:]
                self.procs.append(self._popen(argv, None, cwd=cwd, env=env, stdout=out, stderr=out))
            # Other hosts: mpirun's daemons start our ranks; this process only watches them.
        else:
            raise SystemExit("unknown launcher %r" % self.launcher)
        out.close()
        self.save(state="running", iface=iface)
        self.log("started %s launcher, %d local process(es)%s" % (
            self.launcher, len(self.procs), ", %d of them warm standbys" % self.adopted if self.adopted else ""))

    # -- warm standbys: the next attempt's ranks started ahead (agent/standby.py) ---------------

    def warm_imports(self, command: List[str], cwd: str) -> Optional[List[str]]:
        """What this attempt's standbys import ahead; None: no standbys (the plan does not ask
        for them, or the ranks run in a container, or the command is not a Python script)."""
        if not self.plan.get("standby") or self.container is not None or self.pooled or self.plan.get("slurm"):
            return None  # (a Slurm step's processes end with it: a standby would not outlive it)
        return standby.warm_imports(command, cwd)

    def keep_standbys(self) -> None:
        """Once this attempt's ranks are in their steps (``STANDBY_AFTER_S`` past the first, so
        their start has the host's CPUs to itself), start one standby per local rank for the next
        attempt (each slot at most once per attempt); reap those that ended."""
        self.standbys = [p for p in self.standbys if p.poll() is None]
        if self.standbys_started or not self.standby_envs or self.progress.first_step_at is None:
            return
        now = time.time()
        if now < self.progress.first_step_at + STANDBY_AFTER_S:
            return
        # Only while the steps go on: a job that stalled (a fault, a peer lost) is being judged
        # and restarted, and the standbys' imports would take the CPU its hosts answer with.
        newest = max((at for _step, at in self.progress.last_at.values()), default=None)
        typical = hangrule.typical(self.progress.intervals) or 1.0
        if newest is None or now - newest > max(3 * typical, 1.0):
            return
        self.standbys_started = True
        plan = self.plan
        cwd = plan.get("workdir") or self.job_dir
        command = list(plan["command"])
        imports = standby.warm_imports(command, cwd) or []
        with open(os.path.join(self.job_dir, "launcher.log"), "ab") as out:
            for local_rank, renv in sorted(self.standby_envs.items()):
                p = standby.spawn(self._agent(), self.job_dir, local_rank, command, cwd, renv, imports, out.fileno())
                if p is not None:
                    self.standbys.append(p)
        if self.standbys:
            self.log("%d warm standby(s) started for the next attempt (imports ahead: %s)"
                     % (len(self.standbys), ", ".join(imports) or "none"))

    def _start_replicas(self, iface: Optional[str]) -> None:
        """A pool job: every replica this host runs, each rank with its pool's command and its
        replica's cluster files (all written before anything starts)."""
        plan = self.plan
        if self.launcher != "direct":
            raise ValueError("a job with worker pools needs the direct launcher (the plan says %r)"
                             % self.launcher)
        envs = {}  # type: Dict[int, Dict[str, str]]
        for i in self.node_indices:
            env = dict(os.environ)
            env.update(clusterfiles.node_env(plan, i, self.job_dir, iface))
            self._finish_env(env)
            envs[i] = env
        os.makedirs(os.path.join(self.job_dir, "logs"), exist_ok=True)
        os.makedirs(os.path.join(self.job_dir, "ranks"), exist_ok=True)
        cwd = plan.get("workdir") or self.job_dir
        self._start_containers()
        self.replicas = []
        with open(os.path.join(self.job_dir, "launcher.log"), "ab") as out:
            for i in self.node_indices:
                node = plan["nodes"][i]
                command = clusterfiles.node_command(plan, i)
                ranks = clusterfiles.global_ranks(plan, i)
                procs = []
                for local_rank, rank in enumerate(ranks):
                    renv = dict(envs[i])
                    renv.update(clusterfiles.rank_env(plan, i, local_rank))
                    box = self.node_box.get(i)
                    p = self._popen(self._wrap(rank, local_rank, box) + command, box, cwd=cwd, env=renv,
                                    stdout=out, stderr=out)
                    procs.append(p)
                    self.procs.append(p)
                self.replica_procs[i] = procs
                self.replicas.append({
                    "node_index": i, "pool": node["pool"], "replica": int(node["replica"]),
                    "ranks": ranks, "state": "running", "exit_code": None, "signal": None,
                    "message": None, "on_failure": _on_failure(node),
                })
        self.save(state="running", iface=iface, replicas=self.replicas)
        self.log("started %d replica(s): %s" % (len(self.replicas), ", ".join(
            "%s %d" % (r["pool"], r["replica"]) for r in self.replicas)))

    # -- watching -----------------------------------------------------------------------------

    def _rank_files(self, exits: bool) -> Dict[int, Dict[str, Any]]:
        """Rank number -> its exit records (``exits``) or its start records, from ``ranks/``."""
        out = {}  # type: Dict[int, Dict[str, Any]]
        d = os.path.join(self.job_dir, "ranks")
        try:
            names = os.listdir(d)
        except OSError:
            return out
        for n in names:
            if n.startswith("rank-") and n.endswith(".json") and n.endswith(".exit.json") == exits:
                rec = read_json(os.path.join(d, n))
                if rec is not None and "rank" in rec:
                    out[int(rec["rank"])] = rec
        return out

    def rank_exits(self) -> Dict[int, Dict[str, Any]]:
        return self._rank_files(exits=True)

    def first_failure(self, exits: Dict[int, Dict[str, Any]],
                      ranks: Optional[List[int]] = None) -> Optional[Dict[str, Any]]:
        bad = [r for r in exits.values()
               if (r.get("exit_code") not in (0, None) or r.get("signal") or r.get("error"))
               and (ranks is None or r.get("rank") in ranks)]
        if not bad:
            return None
        # A full disk beats what it caused; then a rank that could not reach its GPU (its peers'
        # collectives broke as it died); otherwise the first rank to fail.
        first = min(bad, key=lambda r: (not r.get("error"), self.device_error(r) is None, r.get("ended") or 0))
        cause = {"rank": first["rank"], "host": self.node["host"], "exit_code": first.get("exit_code"),
                 "signal": first.get("signal"), "tail": first.get("tail") or []}
        if first.get("error"):
            cause["message"] = first["error"]
        err = self.device_error(first)
        if err is not None:  # the agent judges it against its own view of the GPUs (job_status)
            cause.update(device_error=err, gpus=self._rank_gpus(int(first["rank"])))
        return self._with_disk(cause)

    def device_error(self, exit_record: Dict[str, Any]) -> Optional[str]:
        """In a ``[container]`` job, the GPU device-access error a rank's last lines show (NVML's
        "Unknown Error" in a container that lost its devices), or None."""
        if not self.boxes:
            return None
        return gpuhealth.device_error(list(exit_record.get("tail") or []) + [exit_record.get("error")])

    def _rank_gpus(self, rank: int) -> List[int]:
        """The GPUs here of ``rank`` (its record's ``gpu``), else all of the job's here."""
        gpu = (self.rank_records().get(rank) or {}).get("gpu")
        return [int(gpu)] if isinstance(gpu, int) and not isinstance(gpu, bool) else self._gpus()

    def _with_disk(self, cause: Dict[str, Any]) -> Dict[str, Any]:
        """A failure on a full job dir says so, whatever the rank died of."""
        if "no space left" in str(cause.get("message") or ""):
            return cause
        mb = free_mb(self.job_dir)
        if mb is not None and mb < DISK_FULL_MB:
            err = OSError(28, "No space left on device")
            msg = resource_message(err, self.job_dir)
            cause["message"] = msg + ("; " + cause["message"] if cause.get("message") else "")
        return cause

    def rank_records(self) -> Dict[int, Dict[str, Any]]:
        return self._rank_files(exits=False)

    def lost_wrapper(self, exits: Dict[int, Dict[str, Any]],
                     ranks: Optional[List[int]] = None) -> Optional[Dict[str, Any]]:
        """A rank whose wrapper died without recording its end (``kill -9`` of the wrapper)."""
        codes = {p.pid: p.poll() for p in self.procs}  # our children: their signal is known
        for rank, rec in sorted(self.rank_records().items()):
            wpid = rec.get("wrapper_pid")
            if ranks is not None and rank not in ranks:
                continue
            if rank in exits or not wpid or pid_alive(wpid):
                continue
            if os.path.exists(os.path.join(self.job_dir, "ranks", "rank-%d.exit.json" % rank)):
                continue  # it wrote its record just now
            code = codes.get(wpid)
            sig = -code if code is not None and code < 0 else None
            how = "was killed by signal %d" % sig if sig else "died"
            return self._with_disk({
                "rank": rank, "host": self.node["host"], "exit_code": None, "signal": sig,
                "wrapper_pid": wpid, "pid": rec.get("pid"),
                "message": "rank %d's wrapper (pid %d) %s; its training process (pid %s) was stopped"
                           % (rank, wpid, how, rec.get("pid")),
                "tail": tail(os.path.join(self.job_dir, "logs", "rank-%d.log" % rank)),
            })
        return None

    def all_ranks_succeeded(self, exits: Dict[int, Dict[str, Any]]) -> bool:
        expected = set(self.state["expected_ranks"])
        return bool(expected) and expected <= set(exits) and all(
            exits[r].get("exit_code") == 0 and not exits[r].get("error") for r in expected)

    def terminate_all(self, grace: float) -> None:
        """SIGTERM the job's process group here, wait ``grace``, SIGKILL, then sweep by job id."""
        pgid = os.getpgid(0)
        old = signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            try:
                os.killpg(pgid, signal.SIGTERM)
            except OSError:
                pass
            sweep(self.job_id, signal.SIGTERM)  # processes that left the group (setsid workers)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                if all(p.poll() is not None for p in self.procs) and not processes_with_tag(self.job_id):
                    break
                time.sleep(STOP_POLL_S)
            for pid in group_members(pgid):  # everyone in our group but us
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            sweep(self.job_id, signal.SIGKILL)
            for p in self.procs:
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    pass
            for _ in range(25):  # SIGKILLed processes take a moment to vanish
                if not processes_with_tag(self.job_id):
                    break
                time.sleep(POLL_S)
                sweep(self.job_id, signal.SIGKILL)
        finally:
            signal.signal(signal.SIGTERM, old)

    def stop_asked(self) -> bool:
        """A stop by signal, or one the agent left on disk (it writes the file before it
        signals, and when it found no pid of this host's to signal yet)."""
        if not self.stop_requested and os.path.exists(os.path.join(self.job_dir, STOP_FILE)):
            self.stop_requested = True
        if self.stop_requested and self.stop_reason is None:
            self.stop_reason = "stopped by request"
        return self.stop_requested

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self.stop_requested = True
        if self.stop_reason is None:
            self.stop_reason = "stopped by request"

    def _wakeups(self) -> Optional[int]:
        """A pipe that a signal writes a byte into (SIGCHLD: a rank's wrapper or a launcher
        exited; SIGTERM: stop), so the loop wakes at once instead of at its next poll. None
        where that cannot be set up (then the loop polls, as it always could)."""
        try:
            r, w = os.pipe()
            for fd in (r, w):
                os.set_blocking(fd, False)
            signal.set_wakeup_fd(w)
            signal.signal(signal.SIGCHLD, lambda signum, frame: None)
            return r
        except (OSError, ValueError):
            return None

    def _sleep(self, wake: Optional[int]) -> None:
        if wake is None:
            time.sleep(POLL_S)
            return
        try:
            ready, _, _ = select.select([wake], [], [], POLL_S)
            if ready:
                while os.read(wake, 512):
                    pass
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            time.sleep(POLL_S)

    def stop_grace(self, default: float) -> float:
        """The grace period of a stop: the one the stop asked for (``rigdeck stop --grace``
        writes it into the plan before it signals this host), else the job's own."""
        plan = read_json(os.path.join(self.job_dir, "plan.json")) or {}
        try:
            return float(plan.get("grace_s", default))
        except (TypeError, ValueError):
            return default

    def run(self) -> int:
        try:
            return self._run()
        finally:
            self.remove_containers()  # a stop, a failure or the end: no container stays
            if self.state.get("state") == "succeeded":
                self.drop_memory_snapshots()
                standby.end_all(self.job_dir)  # nothing will start again: no standby waits

    def drop_memory_snapshots(self) -> None:
        """The job's memory snapshots on this host (runtime.Checkpointer.snapshot), once it
        succeeded here: nothing will resume from them. After a failure or a stop they stay (the
        next attempt, here or moved, resumes from them) until the job succeeds or the host
        reboots (a tmpfs)."""
        path = memory_job_dir(self.job_id)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)

    def _run(self) -> int:
        reserve(self.state_path, 65536)  # room for the state (and its cause) on a full disk
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGINT, self._on_sigterm)
        wake = self._wakeups()
        grace = float(self.plan.get("grace_s", 30))
        deadline = self.state["started"] + float(self.plan.get("max_runtime_s", 86400))
        if self.stop_asked():  # stopped before this host began (the stop saw no pid to signal)
            self.save(state="stopped", ended=time.time(), cause={"message": self.stop_reason})
            return 0
        try:
            self.start()
        except Exception as e:  # a launch that cannot start is a failed job, not a crash
            self.log("start failed: %s" % e)
            self.terminate_all(1.0)
            self.save(state="failed", ended=time.time(),
                      cause={"host": self.node["host"], "rank": None, "message": "start failed: %s" % e})
            return 1
        if self.pooled:
            return self.watch_replicas(wake, grace, deadline)
        expected = set(self.state["expected_ranks"])
        watch_only = not self.procs  # a non-primary mpirun host
        seen_start = time.monotonic()
        while True:
            self._resumed()
            if self.stop_asked():
                self.save(state="stopping")
                self.terminate_all(self.stop_grace(grace))
                self.save(state="stopped", ended=time.time(), cause={"message": self.stop_reason})
                return 0
            if time.time() > deadline:
                self.stop_reason = "max_runtime of %gs exceeded" % float(self.plan.get("max_runtime_s") or 0)
                self.stop_requested = True
                continue
            exits = self.rank_exits()
            failure = self.lost_wrapper(exits) or self.first_failure(exits)
            if failure is not None and self.may_heal("exit", failure):
                code = self.heal_in_place("exit", failure, grace)
                if code is not None:
                    return code
                continue
            if failure is not None:
                self.log("rank %s failed: exit %s signal %s"
                         % (failure["rank"], failure["exit_code"], failure["signal"]))
                self.save(state="stopping", cause=failure)
                self.terminate_all(min(grace, 5.0))
                self.save(state="failed", ended=time.time())
                return 1
            launchers_done = all(p.poll() is not None for p in self.procs)
            if self.procs and launchers_done:
                codes = [p.returncode for p in self.procs]
                exits = self.rank_exits()
                if all(c == 0 for c in codes):
                    self.save(state="succeeded", ended=time.time())
                    return 0
                if self.all_ranks_succeeded(exits):  # the launcher died after the work was done
                    bad = next(c for c in codes if c != 0)
                    self.save(state="succeeded", ended=time.time(),
                              note="every rank finished with exit 0; the %s launcher then exited %s"
                                   % (self.launcher, bad))
                    return 0
                failure = self.lost_wrapper(exits) or self.first_failure(exits) or {
                    "rank": None, "host": self.node["host"], "exit_code": next(c for c in codes if c != 0),
                    "signal": None, "tail": tail(os.path.join(self.job_dir, "launcher.log")),
                    "message": "the %s launcher exited %s" % (self.launcher, next(c for c in codes if c != 0)),
                }
                self.save(state="stopping", cause=failure)
                self.terminate_all(min(grace, 5.0))
                self.save(state="failed", ended=time.time())
                return 1
            if watch_only and expected and expected <= set(exits):
                self.save(state="succeeded", ended=time.time())
                return 0
            if watch_only and not exits and time.monotonic() - seen_start > 600 and not processes_with_tag(self.job_id):
                self.save(state="failed", ended=time.time(),
                          cause={"host": self.node["host"], "message": "mpirun never started ranks here"})
                return 1
            bad = self.gpu_faults()
            if bad:  # a GPU of the job failed while its ranks live: move them off it, or stop
                code = self.heal_gpu(bad, grace)
                if code is not None:
                    return code
                continue
            self.watch_progress()
            self.keep_standbys()
            hang = self.state.get("hang")
            if hang is not None and self.may_heal("hang"):
                code = self.heal_in_place("hang", hang, grace)
                if code is not None:
                    return code
                continue
            self._sleep(wake)

    def watch_progress(self) -> Optional[Dict[str, Any]]:
        """The hang rule (agent/hangrule.py) on this host's ranks, at every turn of the loop: a hang
        is recorded once, with the ranks' stacks taken while they live, in ``state.json``'s
        ``hang``. A job this host heals (``heal_in_place``) is restarted here; otherwise the
        controller acts on it at its next look (stops the gang, restarts it from its checkpoint or
        fails it, as ``on_hang`` says), and the ranks are left running for that."""
        if self.state.get("hang") is not None:
            return None
        self.progress.read()
        now = time.monotonic()
        self.hang_watch.observe(now, self.progress.steps.values(), self.progress.sections(), self.progress.ended)
        verdict = self.hang_watch.judge(now) or self.quiet_look(now)
        if verdict is not None:
            from agent import stacks  # (only for a verdict: not in the job host's start)

            ending = stacks.ranks_ending(self.job_dir)
            if ending and all(ending.values()):  # past their last step, on their way out: not hung
                verdict = None
        if not self.whole_job() and (verdict is None or verdict.basis == "quiet"):
            # this host's ranks are asleep, the others' are not seen from here: the controller
            # judges the job once every host says so (tui/control/healing.py)
            self.say_asleep(now)
            return None
        if self.state.get("idle") is not None:
            self.save(idle=None)
        if verdict is None:
            return None
        hang = verdict.to_dict()  # (``stacks`` imported above: a verdict got this far)
        self.log(str(hang["message"]))
        try:
            got = stacks.collect(self.job_dir, self.job_id, why=str(hang["message"]), timeout=3.0)
        except OSError as e:
            self.log("stacks not taken: %s" % e)
            got = {"stacks": []}
        hang.update(at=time.time(), host=self.node["host"], on_hang=self.on_hang,
                    stacks=[{k: s.get(k) for k in ("rank", "pid", "top", "in_collective")}
                            for s in got.get("stacks") or []])
        self.save(hang=hang)
        return hang

    def whole_job(self) -> bool:
        """Whether this host's ranks are all the job's."""
        nodes = self.plan.get("nodes") or []
        world = sum(len(clusterfiles.global_ranks(self.plan, i)) for i in range(len(nodes)))
        return len(self.state.get("expected_ranks") or []) == world

    def quiet_look(self, now: float) -> Optional[hangrule.Verdict]:
        """The quiet rule (agent/hangrule.py) on this host's ranks: each rank's process tree read in
        ``/proc`` at every turn of the loop while the job is in its steps (a few small reads per
        rank). Not for a pool job's replicas or ranks in a container (their pids are another
        namespace's). What it saw, verdict or not, is kept for ``say_asleep`` (``self.quiet``)."""
        self.quiet = None
        typical = hangrule.typical(self.progress.intervals)
        if (self.pooled or self.boxes or typical is None or self.hang_watch.hang_timeout is not None
                or self.hang_watch.section() != hangrule.STEP):
            return None
        readings = self.rank_readings()
        if readings is None:
            return None
        since = self.idle.sample(now, readings)
        # no step for: by the newest step record's own time (this host's clock), which this
        # loop's turns see up to a turn late
        newest = max((t for _, t in self.progress.last_at.values()), default=None)
        age = None if newest is None else max(0.0, time.time() - newest)
        got = self.hang_watch.quiet_since(now, since, typical, age)
        self.quiet = None if got is None else got + (typical,)
        return self.hang_watch.quiet(now, since, typical, age)

    def rank_readings(self) -> Optional[Dict[int, Optional[Tuple[bool, int]]]]:
        """Each of this attempt's ranks here: its process tree's reading (``tree_reading``); None
        until every expected rank has said its pid."""
        expected = set(self.state.get("expected_ranks") or [])
        if set(self.rank_pids) != expected:
            self.rank_pids = {r: int(rec["pid"]) for r, rec in self.rank_records().items()
                              if r in expected and isinstance(rec.get("pid"), int)}
        readings = {r: tree_reading(pid) for r, pid in self.rank_pids.items()}
        if set(readings) != expected:
            return None
        if any(v is None for v in readings.values()):
            self.rank_pids = {}  # a rank gone (or restarted): its pid read again next turn
        return readings

    def say_asleep(self, now: float) -> None:
        """For a job of several hosts: say in ``state.json``'s ``idle`` that every rank here has
        waited asleep with no step for ``QUIET_SAY_SHARE`` of the quiet timeout (the quiet look
        of this turn), with the ranks' stacks, taken then: the controller judges the job hung once
        every host's ranks have waited so for the whole timeout (the daemon's answers count the
        time since this was said), and a host out of reach at once while the others wait so (the
        job waits for it). Said once while it lasts; cleared at the first turn that sees a rank
        awake or a step. The stacks are those of the hang if it becomes one: nothing ran since."""
        q = self.quiet
        if q is None or min(q[0], q[1]) < hangrule.QUIET_SAY_SHARE * q[2]:
            if self.state.get("idle") is not None:
                self.save(idle=None)
            return
        if self.state.get("idle") is not None:
            return
        from agent import stacks

        ending = stacks.ranks_ending(self.job_dir)
        if ending and all(ending.values()):  # past their last step, on their way out: not waiting
            return
        stalled, asleep, timeout, typical = q
        at = time.time() - (time.monotonic() - now)
        why = ("every rank here asleep with no step after step %s for %.1f s (the quiet rule judges the job "
               "hung at %.1f s where every host's ranks wait so)" % (self.hang_watch.last_step, stalled, timeout))
        try:
            got = stacks.collect(self.job_dir, self.job_id, why=why, timeout=2.0)
        except OSError as e:
            self.log("stacks not taken: %s" % e)
            got = {"stacks": []}
        readings = self.rank_readings()
        if readings:
            self.idle.rebase(time.monotonic(), readings)  # the dumps' CPU is not the ranks'
        self.save(idle={"section": hangrule.STEP, "stalled_s": round(stalled, 3), "asleep_s": round(asleep, 3),
                        "timeout_s": timeout, "basis": "quiet", "last_step": self.hang_watch.last_step,
                        "learned_from": typical, "at": at,
                        "stacks": [{k: s.get(k) for k in ("rank", "pid", "top", "in_collective")}
                                   for s in got.get("stacks") or []]})


    # -- healing in place: a job of one host, with nobody watching ------------------------------

    def may_heal(self, kind: str, failure: Optional[Dict[str, Any]] = None) -> bool:
        """Whether this host restarts the job itself: the plan says it heals here, restarts are
        left, no stop was asked, and the fault is one a restart in place may cure (a hang with
        ``on_hang = "restart"``, a rank's failure that ``[restart] on_exit_codes`` allows)."""
        if not self.heals_here or self.heals_left <= 0 or self.stop_requested:
            return False
        if kind == "hang":
            return self.on_hang == "restart"
        if self.on_exit_codes and failure is not None:
            code, sig = failure.get("exit_code"), failure.get("signal")
            return code in self.on_exit_codes or (isinstance(sig, int) and 128 + sig in self.on_exit_codes)
        return True

    def heal_in_place(self, kind: str, what: Dict[str, Any], grace: float,
                      moves: Optional[Dict[int, Tuple[int, int]]] = None) -> Optional[int]:
        """Stop this attempt's ranks and start the next attempt here (its ranks resume from their
        newest checkpoint), keeping the incident in ``state.json``'s ``heals`` for the controller
        that looks next: it adopts each as the job's restart and incident, once. ``moves``: a
        failed GPU's ranks go to the spare claimed for it (``claim_spares``). None: the loop goes
        on (a stop asked meanwhile is the loop's to carry out); else this job host's exit."""
        attempt = int(self.state.get("restart_count") or 0)
        incident = self._incident(kind, what, attempt, moves)
        self.log("%s: healing in place, attempt %d stops, attempt %d starts (%d restart(s) left here)"
                 % (incident["message"], attempt, attempt + 1, self.heals_left - 1))
        self.save(healing=incident)
        self.terminate_all(min(grace, 5.0))
        incident["stopped_at"] = time.time()
        bad = self.gpu_faults_after(kind, incident["detected_at"]) if moves is None else []
        if self.stop_asked():  # the stop wins: this attempt ends stopped, nothing starts
            self._give_back(moves)
            self.save(healing=None)
            return None
        if bad:  # the rank died of its GPU (XID 79 ends the process): not on that card again
            moves = self.claim_spares(bad)
            if moves is None:  # no spare here: the controller moves it
                self.save(healing=None)
                return self.stop_for_gpu(bad[0], grace)
            incident = dict(incident, kind="gpu", **self._gpu_incident(bad, moves))
        if moves:
            self._move(moves, incident)
        heals = list(self.state.get("heals") or []) + [incident]
        try:
            self._next_attempt(attempt + 1, moves)
            self.heals_left -= 1
            incident["started_at"] = time.time()
            self.save(heals=heals, healing=None, hang=None, cause=None, restart_count=attempt + 1)
            self.start()
        except Exception as e:  # the next attempt cannot start: the job fails here, saying why
            self.log("restart in place failed: %s" % e)
            self.terminate_all(1.0)
            self.save(state="failed", ended=time.time(), heals=heals,
                      cause={"host": self.node["host"], "rank": None, "message": "restart in place failed: %s" % e})
            return 1
        return None

    def gpu_faults(self) -> List[Dict[str, Any]]:
        """This job's GPUs here that the daemon judges unhealthy (``gpu-health.json``, written
        only for a job its host heals in place), each once, lowest first."""
        if not self.heals_here:
            return []
        mine = self._gpus()
        found = {}  # type: Dict[int, Dict[str, Any]]
        for g in (read_json(os.path.join(self.job_dir, GPU_HEALTH_FILE)) or {}).get("gpus") or []:
            index = g.get("index") if isinstance(g, dict) else None
            if isinstance(index, int) and not isinstance(index, bool) and g.get("health") == "unhealthy" \
                    and index in mine:
                found.setdefault(index, g)
        return [found[i] for i in sorted(found)]

    def gpu_faults_after(self, kind: str, failed_at: float) -> List[Dict[str, Any]]:
        """``gpu_faults`` once the daemon has judged the GPUs after a rank's failure at
        ``failed_at``: a rank killed by its GPU (a CUDA error at XID 79) can die before the daemon's
        next look says so (``GPU_HEALTH_LAG_S``), and a restart on that card would die again. Only
        a job with GPUs waits, and only as long as no fault has come."""
        bad = self.gpu_faults()
        if kind != "exit" or bad or not self._gpus():
            return bad
        while not bad and time.time() < failed_at + GPU_HEALTH_LAG_S and not self.stop_asked():
            time.sleep(0.2)
            bad = self.gpu_faults()
        return bad

    def heal_gpu(self, bad: List[Dict[str, Any]], grace: float) -> Optional[int]:
        """GPUs of the job failed while its ranks live: with a restart left and a spare GPU for
        each one here (claimed now, before anything stops), the ranks move to the spares and
        restart in place from their checkpoint; else the job stops here for a controller to
        move it (``stop_for_gpu``)."""
        moves = self.claim_spares(bad) if self.may_heal("gpu") else None
        if moves is None:
            return self.stop_for_gpu(bad[0], grace)
        return self.heal_in_place("gpu", {"gpus": bad}, grace, moves)

    def _avoid(self) -> List[int]:
        """GPUs of this host no move may go to: the job's own, those held out here (the
        held-out record), and those the controller had drained when it started the job
        (the plan's ``heal.drained``)."""
        avoid = set(self._gpus())
        avoid.update(gpuhealth.read_held_out(os.path.dirname(os.path.dirname(self.job_dir))))
        for g in (self.plan.get("heal") or {}).get("drained") or []:
            if isinstance(g, int) and not isinstance(g, bool):
                avoid.add(g)
        return sorted(avoid)

    def claim_spares(self, bad: List[Dict[str, Any]]) -> Optional[Dict[int, Tuple[int, int]]]:
        """A spare GPU of this host for each failed one, claimed for this job: ``{failed: (spare,
        its claim's descriptor)}``, or None (nothing claimed) when there are not enough. The
        daemon's ``spare`` list (healthy, no process on it, nobody's claim) says which to try;
        the claim itself decides (agent/claims.py: under the directory's mutex, refused if held),
        so a GPU another job or person takes meanwhile is never taken twice: it is skipped."""
        from agent import claims

        health = read_json(os.path.join(self.job_dir, GPU_HEALTH_FILE)) or {}
        offered = health.get("spare")
        if not isinstance(offered, list):
            offered = []
        avoid = set(self._avoid())
        candidates = sorted({g for g in offered if isinstance(g, int) and not isinstance(g, bool)
                             and g >= 0 and g not in avoid})
        moves = {}  # type: Dict[int, Tuple[int, int]]
        for g in bad:
            while candidates and int(g["index"]) not in moves:
                spare = candidates.pop(0)
                try:
                    (fd,) = claims.claim([spare], self.job_id)
                except claims.ClaimError as e:
                    self.log("spare GPU %d not taken: %s" % (spare, e))
                    continue
                except Exception as e:  # a claim directory gone wrong: no move, the controller's
                    self.log("spare GPU %d not taken: %s" % (spare, e))
                    break
                moves[int(g["index"])] = (spare, fd)
        if len(moves) < len(bad):
            self._give_back(moves)
            self.log("no spare GPU free here for GPU %s" % ", ".join(str(g["index"]) for g in bad))
            return None
        return moves

    def _give_back(self, moves: Optional[Dict[int, Tuple[int, int]]]) -> None:
        """Release the spares claimed for moves that will not happen."""
        for _spare, fd in (moves or {}).values():
            try:
                os.close(fd)
            except OSError:
                pass

    def _move(self, moves: Dict[int, Tuple[int, int]], incident: Dict[str, Any]) -> None:
        """The ranks are stopped: each failed GPU is held out on this host (no rigdeck job is
        placed on it until an undrain clears it; the next controller adopts it as a drain), its
        claim given back, and the spare's claim passed to the next attempt's processes."""
        from agent import claims

        state_dir = os.path.dirname(os.path.dirname(self.job_dir))
        by = "%s's job host" % self.node["host"]
        reasons = incident.get("reasons") or {}
        for old in moves:
            try:
                gpuhealth.hold_out(state_dir, old, str(reasons.get(str(old)) or "unhealthy"),
                                   self.job_id, by, time.time())
            except OSError as e:  # the daemon's sample still calls it unhealthy while the fault lasts
                self.log("GPU %d not recorded as held out: %s" % (old, e))
        keep = []
        for fd in self.claim_fds:
            if claims.claimed_gpu(fd) in moves:
                try:
                    os.close(fd)
                except OSError:
                    pass
            else:
                keep.append(fd)
        self.claim_fds = keep + [fd for _spare, fd in moves.values()]

    def stop_for_gpu(self, gpu: Dict[str, Any], grace: float) -> int:
        """A GPU of the job failed: a restart in place would land on it again, and moving away
        needs the inventory (placement, drains), the controller's. The ranks stop and the job
        fails here naming the GPU; the next controller that looks drains it and restarts the job
        elsewhere (restarts left), as for any rank that died of its GPU."""
        sim = " (simulated)" if gpu.get("simulated") else ""
        message = "%s GPU %s%s: %s; stopped here, left to a controller to move" % (
            self.node["host"], gpu.get("index"), sim, gpu.get("reason") or "unhealthy")
        self.log(message)
        cause = {"kind": "gpu", "host": self.node["host"], "gpu": gpu.get("index"), "rank": None, "message": message}
        self.save(state="stopping", cause=cause)
        self.terminate_all(min(grace, 5.0))
        self.save(state="failed", ended=time.time())
        return 1

    def _incident(self, kind: str, what: Dict[str, Any], attempt: int,
                  moves: Optional[Dict[int, Tuple[int, int]]] = None) -> Dict[str, Any]:
        """What failed, when it was seen, and the newest step this host's ranks reported."""
        now = time.time()
        steps = list(self.progress.steps.values())
        incident = {"attempt": attempt, "kind": kind, "host": self.node["host"], "detected_at": now,
                    "last_step": max(steps) if steps else None}  # type: Dict[str, Any]
        if kind == "gpu":
            incident.update(self._gpu_incident(list(what.get("gpus") or []), moves or {}))
            return incident
        if kind == "hang":
            incident.update({k: what.get(k) for k in ("message", "last_step", "section", "timeout_s")})
            incident.update(detected_at=what.get("at") or now, detect_s=what.get("stalled_s"),
                            stacks=what.get("stacks") or [])
            return incident
        rank = what.get("rank")
        ended = (self.rank_exits().get(int(rank)) or {}).get("ended") if rank is not None else None
        incident.update(rank=what.get("rank"), exit_code=what.get("exit_code"), signal=what.get("signal"),
                        message=_failure_text(what),
                        detect_s=round(max(0.0, now - float(ended)), 3) if isinstance(ended, (int, float)) else None)
        return incident

    def _gpu_incident(self, bad: List[Dict[str, Any]], moves: Dict[int, Tuple[int, int]]) -> Dict[str, Any]:
        """A GPU incident's own fields: the failed GPU (the first), each one's reason, where its
        ranks went (``moved``) and this host's GPUs for the job from now on (``gpus``)."""
        return gpu_move_fields(self.node["host"], bad, {old: new for old, (new, _fd) in moves.items()},
                               self._gpus())

    def _with_env_file(self, plan: Dict[str, Any]) -> Dict[str, Any]:
        """``plan`` with the job's env_from_file values in its ``env``: kept in the job's
        directory (0600) by the agent's start, never in plan.json; read again for every attempt,
        this host's own restarts in place included (a restart through a server brings none)."""
        if plan.get("env_file"):
            plan["env"] = dict(plan.get("env") or {}, **read_env_file(self.job_dir))
        return plan

    def _next_attempt(self, restart_count: int, moves: Optional[Dict[int, Tuple[int, int]]] = None) -> None:
        """Ready the job directory and the plan for the next attempt, as the agent does before a
        start: rank records afresh, the attempt's mark in ``attempts.json``, the plan's
        ``restart_count`` (the ranks' ``RIGDECK_RESTART_COUNT``), a new rendezvous port, and,
        after a GPU moved, this host's ``gpus`` (the ranks' ``CUDA_VISIBLE_DEVICES``)."""
        from agent.jobs import probe_port  # (agent.jobs imports this module)

        for f in glob.glob(os.path.join(self.job_dir, "ranks", "*")):
            os.unlink(f)
        mark_attempt(self.job_dir, restart_count)
        plan = read_json(os.path.join(self.job_dir, "plan.json")) or dict(self.plan)
        plan["restart_count"] = restart_count
        if moves:
            plan = moved_plan(plan, self.node_index, {old: new for old, (new, _fd) in moves.items()})
        plan["master_port"] = probe_port(str(plan["master_addr"]))
        write_json(os.path.join(self.job_dir, "plan.json"), plan)
        self.plan = self._with_env_file(plan)
        self.node = self.plan["nodes"][self.node_index]
        self.procs = []
        self.standbys_started = False
        self.adopted = 0
        self.progress = RankProgress(os.path.join(self.job_dir, "metrics"))
        self.hang_watch = self._new_watch()
        self.idle = hangrule.Idle(self.idle.share, self.idle.hz)
        self.rank_pids = {}
        self.quiet = None

    def _resumed(self) -> None:
        """The first step of an attempt this host started: when its ranks reported it, for the
        incident's cost (read at every turn of the loop until it has come)."""
        heals = self.state.get("heals")
        if not heals or heals[-1].get("resumed_at") is not None:
            return
        self.progress.read()
        if self.progress.first_step_at is not None:
            heals[-1]["resumed_at"] = self.progress.first_step_at
            self.save(heals=heals)

    # -- a pool job's replicas ----------------------------------------------------------------

    def _replica_failure(self, rep: Dict[str, Any],
                         exits: Dict[int, Dict[str, Any]]) -> Optional[Dict[str, Any]]:
        """Why one running replica failed (a rank exited non-zero, was killed, lost its wrapper,
        or its wrappers all ended without every rank's record), or None."""
        ranks = list(rep["ranks"])
        failure = self.lost_wrapper(exits, ranks) or self.first_failure(exits, ranks)
        if failure is None:
            procs = self.replica_procs.get(rep["node_index"]) or []
            if procs and all(p.poll() is not None for p in procs) and not set(ranks) <= set(self.rank_exits()):
                code = next((p.returncode for p in procs if p.returncode), None)
                failure = {"rank": None, "host": self.node["host"], "exit_code": code, "signal": None,
                           "tail": tail(os.path.join(self.job_dir, "launcher.log")),
                           "message": "the rank wrappers of %s %d exited (%s) without recording "
                                      "their ranks' ends" % (rep["pool"], rep["replica"], code)}
        if failure is not None:
            failure.update(pool=rep["pool"], replica=rep["replica"], node_index=rep["node_index"])
        return failure

    def _replica_message(self, rep: Dict[str, Any], failure: Dict[str, Any]) -> str:
        who = "%s %d on %s" % (rep["pool"], rep["replica"], self.node["host"])
        if failure.get("rank") is not None:
            who += " (rank %s)" % failure["rank"]
        if failure.get("signal"):
            how = "was killed by signal %s" % failure["signal"]
        elif failure.get("exit_code") is not None:
            how = "exited %s" % failure["exit_code"]
        else:
            how = "failed"
        text = "%s %s" % (who, how)
        if failure.get("message"):
            text += ": %s" % failure["message"]
        return text

    def stop_replica(self, rep: Dict[str, Any], grace: float) -> None:
        """Stop one replica's ranks here (its wrappers pass SIGTERM on), the others untouched."""
        procs = self.replica_procs.get(rep["node_index"]) or []
        for p in procs:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGTERM)
                except OSError:
                    pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.1)
        tagged = set(processes_with_tag(self.job_id))
        records = self.rank_records()
        for p in procs:
            if p.poll() is None:
                try:
                    p.kill()
                except OSError:
                    pass
        for r in rep["ranks"]:  # a rank that ignored SIGTERM outlives its SIGKILLed wrapper
            pid = (records.get(r) or {}).get("pid")
            if pid in tagged and pid_alive(pid):
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass

    def _end_running(self, state: str, message: str) -> None:
        """The replicas still running (or being stopped) end as ``state``."""
        for rep in self.replicas:
            if rep["state"] in ("running", "stopping"):
                rep.update(state=state, message=message)

    def _stopping_running(self) -> None:
        """Before this host stops its running replicas: they are "stopping", so a rank the stop
        has already ended reads as stopped, not failed, meanwhile (agent.jobs ``status``)."""
        for rep in self.replicas:
            if rep["state"] == "running":
                rep["state"] = "stopping"

    def watch_replicas(self, wake: Optional[int], grace: float, deadline: float) -> int:
        """A pool job's loop. A replica with on_failure "stop" failing fails this host (the gang);
        one with "continue" (an evaluator) failing is stopped and recorded, the rest go on. The
        primary succeeding ends this host "succeeded" (``primary_succeeded``), its other replicas
        stopped; so does every replica ending without a gang-stopping failure."""
        while True:
            if self.stop_asked():
                self._stopping_running()
                self.save(state="stopping", replicas=self.replicas)
                self.terminate_all(self.stop_grace(grace))
                self._end_running("stopped", str(self.stop_reason))
                self.save(state="stopped", ended=time.time(), cause={"message": self.stop_reason},
                          replicas=self.replicas)
                return 0
            if time.time() > deadline:
                self.stop_reason = "max_runtime of %gs exceeded" % float(self.plan.get("max_runtime_s") or 0)
                self.stop_requested = True
                continue
            exits = self.rank_exits()
            changed = False
            for rep in self.replicas:
                if rep["state"] != "running":
                    continue
                failure = self._replica_failure(rep, exits)
                if failure is not None:
                    message = self._replica_message(rep, failure)
                    rep.update(state="failed", exit_code=failure.get("exit_code"),
                               signal=failure.get("signal"), message=message)
                    if rep["on_failure"] == "continue":
                        self.log("%s; the other replicas go on (on_failure = \"continue\")" % message)
                        self.save(replicas=self.replicas)
                        self.stop_replica(rep, min(grace, 5.0))
                        exits = self.rank_exits()
                        changed = True
                        continue
                    self.log("%s: stopping this host's replicas" % message)
                    self._stopping_running()
                    self.save(state="stopping", cause=failure, replicas=self.replicas)
                    self.terminate_all(min(grace, 5.0))
                    self._end_running("stopped", "stopped: %s" % message)
                    self.save(state="failed", ended=time.time(), replicas=self.replicas)
                    return 1
                if set(rep["ranks"]) <= set(exits):  # every rank recorded, none failed
                    rep.update(state="succeeded", exit_code=0, signal=None)
                    changed = True
                    if rep["pool"] == "primary":
                        self.log("the primary succeeded: stopping this host's other replicas")
                        self._stopping_running()
                        self.save(state="stopping", primary_succeeded=True, replicas=self.replicas)
                        if any(r["state"] == "stopping" for r in self.replicas):
                            self.terminate_all(grace)
                        self._end_running("stopped", "stopped: the primary succeeded")
                        self.save(state="succeeded", ended=time.time(), replicas=self.replicas)
                        return 0
            if not any(r["state"] == "running" for r in self.replicas):
                self.save(state="succeeded", ended=time.time(), replicas=self.replicas)
                return 0
            if changed:
                self.save(replicas=self.replicas)
            self._sleep(wake)


def moved_plan(plan: Dict[str, Any], node_index: int, moves: Dict[int, int]) -> Dict[str, Any]:
    """``plan`` with node ``node_index``'s GPUs moved as ``moves`` says (``{failed: spare}``), in
    place, each rank keeping its place in the list (local rank ``l`` runs on ``gpus[l]``)."""
    nodes = [dict(n) for n in plan.get("nodes") or []]
    node = nodes[node_index]
    node["gpus"] = [moves.get(int(g), int(g)) for g in node.get("gpus") or []]
    return dict(plan, nodes=nodes)


def gpu_move_fields(host: str, bad: List[Dict[str, Any]], moves: Dict[int, int],
                    gpus: List[int]) -> Dict[str, Any]:
    """The fields of a GPU incident a job host healed in place (``heals``): ``gpu`` (the first
    failed), ``reasons`` (each failed GPU's, with "(simulated)" for a bed's), ``moved`` (failed
    -> spare), ``gpus`` (the host's GPUs for the job after the move) and the ``message``:
    ``h2 GPU 1 (simulated): XID 79: GPU has fallen off the bus; ranks moved to GPU 3 on h2,
    restart in place``."""
    reasons = {}  # type: Dict[str, str]
    said = []
    for g in bad:
        sim = " (simulated)" if g.get("simulated") else ""
        what = str(g.get("reason") or "unhealthy")
        reasons[str(g["index"])] = what + sim
        said.append("%s GPU %s%s: %s" % (host, g["index"], sim, what))
    to = [moves[int(g["index"])] for g in bad if int(g["index"]) in moves]
    where = "GPU %s" % to[0] if len(to) == 1 else "GPUs %s" % ", ".join(str(t) for t in to)
    return {"gpu": int(bad[0]["index"]) if bad else None, "reasons": reasons,
            "moved": {str(k): v for k, v in sorted(moves.items())},
            "gpus": [moves.get(int(g), int(g)) for g in gpus],
            "message": "%s; ranks moved to %s on %s, restart in place" % ("; ".join(said), where, host)}


def _seconds(value: Any) -> Optional[float]:
    """A ``[health]`` duration from the plan (seconds), or None: not set, learned."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _failure_text(failure: Dict[str, Any]) -> str:
    """A rank's failure in words: ``rank 3 was killed by signal 9``, ``rank 1 exited 2``."""
    if failure.get("message"):
        return str(failure["message"])
    who = "rank %s" % failure.get("rank") if failure.get("rank") is not None else "a rank"
    if failure.get("signal"):
        return "%s was killed by signal %s" % (who, failure["signal"])
    return "%s exited %s" % (who, failure.get("exit_code"))


def _on_failure(node: Dict[str, Any]) -> str:
    """What a replica's failure does: "stop" the gang, or (an evaluator's default) "continue"."""
    value = node.get("on_failure")
    if value in ("stop", "continue"):
        return str(value)
    return "continue" if node.get("pool") == "evaluator" else "stop"


def main(job_dir: str) -> int:
    return JobHost(job_dir).run()
