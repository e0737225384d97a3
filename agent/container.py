"""A ``[container]`` job on one host: one Podman container holding all of this host's ranks.

The job host starts it (``podman run -d``) before any rank, with the host's network, IPC (so
``/dev/shm`` is the host's) and PID namespace, then starts each rank wrapper (or torchrun) in it
with ``podman exec``: the wrappers run inside exactly as on the host, and because the PID
namespace is the host's, the pids they record, the job host's sweep by ``RIGDECK_JOB_ID``, the
agent's stack dumps (SIGUSR1 to armed pids) and the GPU telemetry's process tags all work as
they do without a container. The container's own process is ``agent hold``: it ends when the
job host does (it watches its pid), so a job host killed outright leaves no container either
(``--rm``); a stop removes it at once (``podman rm -f``).

Paths are mounted at the same paths: the job directory (cluster files, logs, metrics, rank
records), the checkpoint directory, the workdir (the synced code), and the agent itself
(read-only: the rank wrapper, and ``runtime`` that ranks import from it through PYTHONPATH).

Only Podman runs containers; ``docker`` and ``apptainer`` are names a spec may give, refused
here naming what the host has. Stdlib only, Python 3.9+.
"""
from __future__ import annotations

import os
import re
import resource
import secrets
import shutil
import subprocess
import tempfile
import time
from typing import Any, Dict, List, Optional

from agent import filemodes

RUNTIMES = ("podman", "docker", "apptainer")
SUPPORTED = ("podman",)
LABEL = "rigdeck.job"
CHECK_TIMEOUT_S = 60.0
PODMAN_NPROC = 32768  # podman's own RLIMIT_NPROC where it cannot raise it (4.3, without CAP_SYS_RESOURCE)
# Variables of the job host's own environment that describe this host, not the job: the image
# has its own (its PATH finds its python3).
HOST_ONLY = frozenset(("PATH", "HOME", "HOSTNAME", "PWD", "OLDPWD", "SHLVL", "SHELL", "USER", "LOGNAME",
                       "MAIL", "TERM", "LANG", "LC_ALL", "TMPDIR", "LD_LIBRARY_PATH", "LD_PRELOAD",
                       "PYTHONHOME", "VIRTUAL_ENV", "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY",
                       "SSH_AUTH_SOCK", "_", "RIGDECK_CLAIM_FDS",
                       "CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF"))


class ContainerError(Exception):
    """The container could not be made ready; the message names what is missing."""


def present() -> List[str]:
    """The container runtimes this host has on PATH."""
    return [r for r in RUNTIMES if shutil.which(r)]


def is_archive(image: str) -> bool:
    """An absolute path is an image archive on the host (``podman save``'s); anything else is a
    name in the host's image store."""
    return image.startswith("/")


def host_store() -> str:
    """The host's own podman image store (root's, or this user's rootless one)."""
    if os.geteuid() == 0:
        return "/var/lib/containers/storage"
    return os.path.expanduser("~/.local/share/containers/storage")


def _toml_str(text: str) -> str:
    return '"%s"' % text.replace("\\", "\\\\").replace('"', '\\"')


def store_env(state_dir: str) -> Dict[str, str]:
    """The environment that gives podman the agent's own store: containers and their state under
    ``<state_dir>/podman`` (file locks there too), images from there and, read-only, from the
    host's own store (``podman load`` by the operator or ``rigdeck image push``). Hosts that
    share a file system but not a PID namespace (the test bed's) must not share podman's
    container state: a podman of one would find the others' containers' pids missing and
    take them for exited. Writes the two files when they differ."""
    d = filemodes.private_dir(os.path.join(state_dir, "podman"), "the agent's podman store")
    extra = [host_store()] if os.path.isdir(host_store()) else []
    files = {
        "storage.conf": "[storage]\ndriver = \"overlay\"\ngraphroot = %s\nrunroot = %s\n"
                        "[storage.options]\nadditionalimagestores = [%s]\n"
                        % (_toml_str(os.path.join(d, "storage")), _toml_str(os.path.join(d, "run")),
                           ", ".join(_toml_str(x) for x in extra)),
        "containers.conf": "[engine]\ntmp_dir = %s\nlock_type = \"file\"\n" % _toml_str(os.path.join(d, "tmp")),
    }
    for name, text in files.items():
        path = os.path.join(d, name)
        try:
            with open(path) as f:
                same = f.read() == text
        except OSError:
            same = False
        if not same:
            filemodes.write_private(path + ".tmp", text.encode())
            os.replace(path + ".tmp", path)
    return {"CONTAINERS_STORAGE_CONF": os.path.join(d, "storage.conf"),
            "CONTAINERS_CONF": os.path.join(d, "containers.conf")}


def _run(argv: List[str], env: Dict[str, str], timeout: float = CHECK_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=timeout, check=False, env=dict(os.environ, **env))


def image_present(image: str, env: Dict[str, str]) -> bool:
    try:
        return _run(["podman", "image", "exists", image], env).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def check(spec: Dict[str, Any], state_dir: str) -> List[str]:
    """What this host lacks to run the job's container (empty when nothing): the runtime, the
    image, a mount's source. Changes nothing."""
    runtime = str(spec.get("runtime") or "podman")
    have = present()
    if runtime not in have:
        return ["no %s here (container runtimes found: %s)"
                % (runtime, ", ".join(have) or "none of " + ", ".join(RUNTIMES))]
    if runtime not in SUPPORTED:
        return ["runtime %s: rigdeck runs containers with %s only (found here: %s)"
                % (runtime, " or ".join(SUPPORTED), ", ".join(have))]
    problems = []
    image = str(spec.get("image") or "")
    if is_archive(image):
        if not os.path.isfile(image):
            problems.append("no image archive %s here" % image)
    elif not image_present(image, store_env(state_dir)):
        problems.append("image %s is not in podman's image store here (`rigdeck image push %s` or "
                        "`podman load` puts it there)" % (image, image))
    for m in spec.get("mounts") or ():
        src = str(m).split(":")[0]
        if not os.path.exists(src):
            problems.append("no %s here (the source of [container] mount %s)" % (src, m))
    return problems


def name_for(job_id: str, host: str) -> str:
    """The container's name: the job and the host (bed hosts share one image store)."""
    return re.sub(r"[^a-zA-Z0-9_.-]", "-", "rigdeck-%s-%s" % (job_id, host))


def oci_runtime() -> List[str]:
    """``--runtime runc`` where the cgroup hierarchy is hybrid (v1 with a v2 ``unified``
    mount): crun, Podman's default, refuses it ("cgroups in hybrid mode not supported")."""
    hybrid = os.path.isdir("/sys/fs/cgroup/unified") and not os.path.exists("/sys/fs/cgroup/cgroup.controllers")
    if hybrid and shutil.which("runc"):
        return ["--runtime", "runc"]
    return []


def _limit(value: int) -> str:
    return "-1" if value == resource.RLIM_INFINITY else str(value)


def ulimits() -> List[str]:
    """The host's own limits for open files and processes (the engine's defaults may exceed
    what the host allows, and the OCI runtime then refuses to start), and memlock unlimited
    where this host lets the job host raise it (RDMA registers memory), else the host's."""
    out = []
    for name, which in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        soft, hard = resource.getrlimit(which)
        if name == "nproc":  # podman lowers its own to this where it cannot raise it, and the
            # OCI runtime cannot give a container more than podman (then conmon) has
            soft, hard = (min(v, PODMAN_NPROC) if v != resource.RLIM_INFINITY else PODMAN_NPROC
                          for v in (soft, hard))
        out += ["--ulimit", "%s=%s:%s" % (name, _limit(soft), _limit(hard))]
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    try:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        soft = hard = resource.RLIM_INFINITY
    except (ValueError, OSError):
        pass
    return out + ["--ulimit", "memlock=%s:%s" % (_limit(soft), _limit(hard))]


def devices(gpus: List[int], simulated: bool) -> List[str]:
    """``/dev/infiniband`` when the host has it; the job's GPUs by CDI (``nvidia.com/gpu=N``)
    when they are real. Simulated GPUs have no device to pass."""
    out = []
    if os.path.isdir("/dev/infiniband"):
        out += ["--device", "/dev/infiniband"]
    if not simulated:
        for g in gpus:
            out += ["--device", "nvidia.com/gpu=%d" % g]
    return out


def gpu_env(env: Dict[str, str], gpus: List[int], simulated: bool) -> None:
    """Inside a container given GPUs by CDI, CUDA numbers only those, from 0 in PCI order:
    ``CUDA_VISIBLE_DEVICES`` (host indices) becomes their positions among the job's GPUs."""
    if simulated or not gpus or "CUDA_VISIBLE_DEVICES" not in env:
        return
    order = {g: i for i, g in enumerate(sorted(gpus))}
    parts = [p for p in env["CUDA_VISIBLE_DEVICES"].split(",") if p.strip().isdigit()]
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(order.get(int(p), int(p))) for p in parts)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"


def load_archive(path: str, env: Dict[str, str]) -> str:
    """``podman load`` an image archive; returns the image's name (or id) as podman says it."""
    r = _run(["podman", "load", "-i", path], env, timeout=1800)
    if r.returncode != 0:
        raise ContainerError("podman load -i %s failed: %s" % (path, _last(r.stderr)))
    for line in reversed(r.stdout.decode(errors="replace").splitlines()):
        if line.startswith("Loaded image"):
            return line.split(":", 1)[1].strip().split(",")[0].strip()
    raise ContainerError("podman load -i %s said no image name: %s" % (path, _last(r.stdout)))


def _last(data: bytes) -> str:
    lines = [ln for ln in data.decode(errors="replace").splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


class Container:
    """This host's container of one job: started once, ranks exec'd into it, removed at the end."""

    def __init__(self, spec: Dict[str, Any], job_id: str, host: str, job_dir: str):
        self.spec = spec
        self.job_id = job_id
        self.name = name_for(job_id, host)
        self.job_dir = job_dir
        # the job dir is <state dir>/jobs/<job id>
        self.env = store_env(os.path.dirname(os.path.dirname(os.path.abspath(job_dir))))
        self.simulated = bool(os.environ.get("RIGDECK_SIM_GPUS", "").strip() not in ("", "0"))

    def mounts(self, plan: Dict[str, Any], agent_path: str) -> List[str]:
        paths = [self.job_dir, os.path.abspath(plan.get("workdir") or self.job_dir)]
        ckpt = (plan.get("checkpoint") or {}).get("dir")
        if ckpt:
            os.makedirs(ckpt, exist_ok=True)
            paths.append(os.path.abspath(ckpt))
        out = []  # type: List[str]
        seen = set()  # type: set
        for p in paths:
            if p not in seen:
                seen.add(p)
                out += ["--volume", "%s:%s" % (p, p)]
        out += ["--volume", "%s:%s:ro" % (agent_path, agent_path)]
        for m in self.spec.get("mounts") or ():
            out += ["--volume", str(m)]
        return out

    def run_argv(self, plan: Dict[str, Any], agent: List[str], gpus: List[int], jobhost_pid: int) -> List[str]:
        """``podman run`` of the container; ``agent``: how the image's python3 runs the agent."""
        image = str(self.spec["image"])
        return (["podman"] + oci_runtime() + [
            "run", "--detach", "--rm", "--name", self.name, "--label", "%s=%s" % (LABEL, self.job_id),
            "--network=host", "--ipc=host", "--pid=host", "--uts=host", "--env", "RIGDECK_JOB_ID=%s" % self.job_id,
        ] + ulimits() + devices(gpus, self.simulated) + self.mounts(plan, agent[-1])
            + [str(o) for o in self.spec.get("options") or ()]
            + ["--entrypoint", agent[0], image] + agent[1:] + ["hold", "--pid", str(jobhost_pid)])

    def start(self, plan: Dict[str, Any], agent: List[str], gpus: List[int], log: Any) -> None:
        if is_archive(str(self.spec["image"])):
            self.spec = dict(self.spec, image=load_archive(str(self.spec["image"]), self.env))
        self.remove()  # a previous attempt's, if its job host died before removing it
        argv = self.run_argv(plan, agent, gpus, os.getpid())
        log("container: %s" % " ".join(argv))
        r = _run(argv, self.env, timeout=600)
        if r.returncode != 0:
            raise ContainerError("podman run of %s failed: %s" % (self.spec["image"], _last(r.stderr)))
        deadline = time.monotonic() + 60
        while self.pid() is None:
            if time.monotonic() > deadline:
                raise ContainerError("container %s did not start within 60 s" % self.name)
            time.sleep(0.2)

    def pid(self) -> Optional[int]:
        """The host pid of the container's process while it runs."""
        r = _run(["podman", "inspect", "--format", "{{.State.Pid}}", self.name], self.env)
        text = r.stdout.decode(errors="replace").strip()
        return int(text) if r.returncode == 0 and text.isdigit() and int(text) > 0 else None

    def exec_argv(self, env: Dict[str, str], cwd: str, argv: List[str], gpus: List[int]) -> List[str]:
        """``podman exec`` of one wrapper (or launcher). Values reach it through the podman
        client's environment (``--env NAME`` takes the value from there): no value is in an
        argument. The caller passes ``env`` (changed here for GPUs) as the client's."""
        gpu_env(env, gpus, self.simulated)
        env.update(self.env)
        names = sorted(k for k in env if k not in HOST_ONLY)
        out = ["podman", "exec", "--workdir", str(self.spec.get("workdir") or cwd)]
        for k in names:
            out += ["--env", k]
        return out + [self.name] + argv

    def remove(self) -> None:
        remove(self.name, self.env)


def remove(name: str, env: Dict[str, str]) -> None:
    """The container ``name`` gone, running or not (none: nothing to do)."""
    try:
        _run(["podman", "rm", "--force", "--time", "0", "--ignore", name], env, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        pass


def hold(pid: int) -> int:
    """The container's own process: lives while the job host ``pid`` does (the PID namespace is
    the host's), so the container ends with it."""
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return 0
        except PermissionError:
            pass
        time.sleep(1.0)


def image_id(image: str, env: Optional[Dict[str, str]] = None) -> Optional[str]:
    """The image's id (``sha256:...`` less the prefix) in the store ``env`` names (the host's own
    without), or None when it has no such image."""
    try:
        r = _run(["podman", "image", "inspect", "--format", "{{.Id}}", image], env or {})
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = r.stdout.decode(errors="replace").strip()
    return text.split(":")[-1] if r.returncode == 0 and text else None


def image_have(image: str, wanted_id: str, state_dir: str) -> Dict[str, Any]:
    """Whether a job here would run ``image`` with the id ``wanted_id`` (``rigdeck image
    push`` skips a host that has it), and which runtimes the host has."""
    have = present()
    got = image_id(image, store_env(state_dir)) if "podman" in have else None
    return {"have": bool(got) and got == wanted_id.split(":")[-1], "id": got, "runtimes": have}


def image_load(path: str, image: str, wanted_id: str, state_dir: str) -> Dict[str, Any]:
    """Load the OCI directory at ``path`` (a tree of the agent's code store: sent content by
    content, as code is) into the host's own image store, named ``image``; checked to be the
    image ``wanted_id``."""
    code_root = os.path.realpath(os.path.join(state_dir, "code"))
    real = os.path.realpath(path)
    if not real.startswith(code_root + os.sep) or not os.path.isfile(os.path.join(real, "index.json")):
        raise ContainerError("%s is not an image directory of the agent's code store" % path)
    if "podman" not in present():
        raise ContainerError("no podman here (container runtimes found: %s)" % (", ".join(present()) or "none"))
    want = wanted_id.split(":")[-1]
    # podman names an OCI directory's image after its path, which must then be a valid image
    # name: the state dir's ".rigdeck" is not. Loaded through a link of a plain name instead.
    # Every component lower-case letters and digits joined by single '-' (mkdtemp's names may
    # hold '_' next to '-', which a name may not).
    link_dir = os.path.join("/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir(),
                            "rigdeck-image-%d-%s" % (os.getpid(), secrets.token_hex(6)))
    os.mkdir(link_dir, 0o700)
    link = os.path.join(link_dir, "load-%s" % re.sub(r"[^a-z0-9]", "", want.lower())[:12])
    try:
        os.symlink(real, link)
        r = _run(["podman", "load", "--quiet", "-i", link], {}, timeout=1800)
    finally:
        shutil.rmtree(link_dir, ignore_errors=True)
    if r.returncode != 0:
        raise ContainerError("podman load -i %s failed: %s" % (real, _last(r.stderr)))
    loaded = ""
    for line in r.stdout.decode(errors="replace").splitlines():
        if line.startswith("Loaded image"):
            loaded = line.split(":", 1)[1].strip()
    if image_id(want) is None:
        raise ContainerError("podman load -i %s did not give image %s" % (real, want[:12]))
    t = _run(["podman", "tag", want, image], {})
    if t.returncode != 0:
        raise ContainerError("podman tag %s %s failed: %s" % (want[:12], image, _last(t.stderr)))
    if loaded and loaded != image:  # the directory's own name, which nobody asked for
        _run(["podman", "untag", want, loaded], {})
    return {"image": image, "id": want}
