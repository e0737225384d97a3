"""A ``[container]`` job on one host: one container holding all of this host's ranks, run by
Podman, Docker or Apptainer (``runtime``).

The job host starts it (``podman run -d``, ``docker run -d``, ``apptainer instance start``)
before any rank, with the host's network, IPC (so ``/dev/shm`` is the host's) and PID
namespace, then starts each rank wrapper (or torchrun) in it (``podman exec``, ``docker exec``,
``apptainer exec instance://``): the wrappers run inside exactly as on the host, and because the
PID namespace is the host's, the pids they record, the job host's sweep by ``RIGDECK_JOB_ID``,
the agent's stack dumps (SIGUSR1 to armed pids) and the GPU telemetry's process tags all work
as they do without a container. The container's own process is ``agent hold``: it ends when the
job host does (it watches its pid), so a job host killed outright leaves no container either
(``--rm``, and the agent's sweep removes it by name); a stop removes it at once.

Paths are mounted at the same paths: the job directory (cluster files, logs, metrics, rank
records), the checkpoint directory, the workdir (the synced code), and the agent itself
(read-only: the rank wrapper, and ``runtime`` that ranks import from it through PYTHONPATH).

Podman gets a store of the agent's own (``store_env``). Docker is whichever daemon the agent's
environment names (``DOCKER_HOST``, else the default socket): the inventory's ``env`` gives an
agent another one. A runtime run by an account other than root needs what rootless containers
need (``rootless_problems``); ``check`` names what is missing before anything starts.
Stdlib only, Python 3.9+.
"""
from __future__ import annotations

import json
import os
import pwd
import re
import resource
import shutil
import subprocess
import time

from agent import filemodes

TYPE_CHECKING = False  # (mypy reads it as True) typing is not imported by a rank's or job's start
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

RUNTIMES = ("podman", "docker", "apptainer")
SUPPORTED = RUNTIMES
LABEL = "rigdeck.job"
CHECK_TIMEOUT_S = 60.0
PODMAN_NPROC = 32768  # podman's own RLIMIT_NPROC where it cannot raise it (4.3, without CAP_SYS_RESOURCE)
# Variables of the job host's own environment that describe this host, not the job: the image
# has its own (its PATH finds its python3), and the runtimes' own settings stay with the client.
HOST_ONLY = frozenset(("PATH", "HOME", "HOSTNAME", "PWD", "OLDPWD", "SHLVL", "SHELL", "USER", "LOGNAME",
                       "MAIL", "TERM", "LANG", "LC_ALL", "TMPDIR", "LD_LIBRARY_PATH", "LD_PRELOAD",
                       "PYTHONHOME", "VIRTUAL_ENV", "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY",
                       "SSH_AUTH_SOCK", "_", "RIGDECK_CLAIM_FDS", "XDG_RUNTIME_DIR",
                       "CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF",
                       "DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CONFIG", "DOCKER_CERT_PATH",
                       "DOCKER_TLS_VERIFY", "DOCKER_API_VERSION"))
SUBID_FILES = ("/etc/subuid", "/etc/subgid")
SUBID_COUNT = 65536  # what usermod is told to add: a Debian image's ids fit in it


class ContainerError(Exception):
    """The container could not be made ready; the message names what is missing."""


def present() -> List[str]:
    """The container runtimes this host has on PATH."""
    return [r for r in RUNTIMES if shutil.which(r)]


def is_archive(image: str) -> bool:
    """An absolute path is an image file on the host (``podman save``'s or ``docker save``'s
    archive; Apptainer's SIF file or sandbox directory); anything else is a name in the host's
    image store."""
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


# -- rootless ------------------------------------------------------------------------------------

def _account() -> Tuple[str, int]:
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name, uid
    except KeyError:  # a uid without a passwd entry
        return str(uid), uid


def _subid_ranges(path: str, name: str, uid: int) -> Tuple[List[Tuple[int, int]], int]:
    """The ranges ``path`` gives the account (by name or uid) and the first id past every
    range it gives anybody (where a new range can start)."""
    mine, end = [], 100000
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        parts = line.strip().split(":")
        if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
            continue
        start, count = int(parts[1]), int(parts[2])
        end = max(end, start + count)
        if parts[0] in (name, str(uid)) and count > 0:
            mine.append((start, count))
    return mine, end


def rootless_problems(runtime: str, env: Optional[Dict[str, str]] = None,
                      subid_files: Tuple[str, str] = SUBID_FILES) -> List[str]:
    """What a rootless ``runtime`` lacks for this account (empty as root, and for runtimes that
    need nothing of the account): Podman's user namespace needs subordinate uid and gid ranges
    for it (``/etc/subuid``, ``/etc/subgid``) and a runtime directory of its own
    (``XDG_RUNTIME_DIR``: a directory it owns, only it may enter). Each problem names the
    account, what is missing and what fixes it (the controller adds the host's name)."""
    if os.geteuid() == 0 or runtime != "podman":
        return []
    env = dict(os.environ) if env is None else env
    name, uid = _account()
    problems = []
    missing, free = [], 100000
    for path in subid_files:
        mine, end = _subid_ranges(path, name, uid)
        free = max(free, end)
        if not mine:
            missing.append(path)
    if missing:
        flags = " ".join("--add-sub%ss %d-%d" % ("uid" if p.endswith("uid") else "gid", free, free + SUBID_COUNT - 1)
                         for p in missing)
        problems.append("account %s has no subordinate id range in %s: rootless %s needs one for its user "
                        "namespace (as root: `usermod %s %s`)" % (name, " and ".join(missing), runtime, flags, name))
    xdg = env.get("XDG_RUNTIME_DIR", "")
    why = ""
    if not xdg:
        why = "XDG_RUNTIME_DIR is not set"
    else:
        try:
            st = os.stat(xdg)
            if st.st_uid != uid or (st.st_mode & 0o077) or not os.access(xdg, os.W_OK | os.X_OK):
                why = "XDG_RUNTIME_DIR %s is not a directory of its own (owner uid %d, mode %o)" % (
                    xdg, st.st_uid, st.st_mode & 0o7777)
        except OSError as e:
            why = "XDG_RUNTIME_DIR %s: %s" % (xdg, e.strerror or e)
    if why:
        problems.append("account %s: %s: rootless %s keeps its runtime state there (a login through "
                        "systemd-logind makes /run/user/%d; as root: `loginctl enable-linger %s`, or give the "
                        "agent XDG_RUNTIME_DIR, a directory of %s's with mode 0700, in the inventory's env)"
                        % (name, why, runtime, uid, name, name))
    return problems


# -- the preflight -------------------------------------------------------------------------------

def check(spec: Dict[str, Any], state_dir: str) -> List[str]:
    """What this host lacks to run the job's container (empty when nothing): the runtime, what a
    rootless one needs, the runtime's daemon, the image, a mount's source. Changes nothing."""
    runtime = str(spec.get("runtime") or "podman")
    have = present()
    if runtime not in have:
        return ["no %s here (container runtimes found: %s)"
                % (runtime, ", ".join(have) or "none of " + ", ".join(RUNTIMES))]
    if runtime not in SUPPORTED:
        return ["runtime %s: rigdeck runs containers with %s only (found here: %s)"
                % (runtime, " or ".join(SUPPORTED), ", ".join(have))]
    problems = rootless_problems(runtime)
    if problems:
        return problems
    engine = engine_for(runtime, state_dir)
    down = engine.unreachable()
    if down:
        return [down]
    image = str(spec.get("image") or "")
    if is_archive(image):
        if not os.path.exists(image):
            problems.append("no image %s %s here" % ("file" if runtime == "apptainer" else "archive", image))
    elif runtime == "apptainer":
        problems.append("image %s: apptainer runs an image file (a SIF file or a sandbox directory at an "
                        "absolute path on the host), not a name" % image)
    elif not engine.image_present(image):
        problems.append("image %s is not in %s's image store here (%s puts it there)"
                        % (image, runtime, "`rigdeck image push %s` or `podman load`" % image
                           if runtime == "podman" else "`docker load`"))
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


def ulimits(nproc_cap: Optional[int] = PODMAN_NPROC) -> List[str]:
    """The host's own limits for open files and processes (the engine's defaults may exceed
    what the host allows, and the OCI runtime then refuses to start), and memlock unlimited
    where this host lets the job host raise it (RDMA registers memory), else the host's.
    ``nproc_cap``: the most processes the engine itself can give (Podman's; None: no cap)."""
    out = []
    for name, which in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        soft, hard = resource.getrlimit(which)
        if name == "nproc" and nproc_cap is not None:  # podman lowers its own to this where it
            # cannot raise it, and the OCI runtime cannot give a container more than podman (then conmon) has
            soft, hard = (min(v, nproc_cap) if v != resource.RLIM_INFINITY else nproc_cap
                          for v in (soft, hard))
        out += ["--ulimit", "%s=%s:%s" % (name, _limit(soft), _limit(hard))]
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    try:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        soft = hard = resource.RLIM_INFINITY
    except (ValueError, OSError):
        pass
    return out + ["--ulimit", "memlock=%s:%s" % (_limit(soft), _limit(hard))]


def infiniband() -> List[str]:
    """``/dev/infiniband`` when the host has it (RDMA)."""
    return ["--device", "/dev/infiniband"] if os.path.isdir("/dev/infiniband") else []


def devices(gpus: List[int], simulated: bool) -> List[str]:
    """Podman's: ``/dev/infiniband`` when the host has it; the job's GPUs by CDI
    (``nvidia.com/gpu=N``) when they are real. Simulated GPUs have no device to pass."""
    out = infiniband()
    if not simulated:
        for g in gpus:
            out += ["--device", "nvidia.com/gpu=%d" % g]
    return out


def docker_devices(gpus: List[int], simulated: bool) -> List[str]:
    """Docker's: ``/dev/infiniband`` when the host has it; the job's GPUs when they are real,
    as ``--gpus "device=0,2"`` (the NVIDIA Container Toolkit's hook; the value's quotes are
    Docker's own: unquoted, its comma would end the option's first field)."""
    out = infiniband()
    if gpus and not simulated:
        out += ["--gpus", '"device=%s"' % ",".join(str(g) for g in sorted(gpus))]
    return out


def gpu_env(env: Dict[str, str], gpus: List[int], simulated: bool) -> None:
    """Inside a container given only the job's GPUs (CDI, ``--gpus``), CUDA numbers only those,
    from 0 in PCI order: ``CUDA_VISIBLE_DEVICES`` (host indices) becomes their positions among
    the job's GPUs."""
    if simulated or not gpus or "CUDA_VISIBLE_DEVICES" not in env:
        return
    order = {g: i for i, g in enumerate(sorted(gpus))}
    parts = [p for p in env["CUDA_VISIBLE_DEVICES"].split(",") if p.strip().isdigit()]
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(order.get(int(p), int(p))) for p in parts)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"


def load_archive(path: str, env: Dict[str, str]) -> str:
    """``podman load`` an image archive; returns the image's name (or id) as podman says it."""
    return _load("podman", path, env)


def _load(client: str, path: str, env: Dict[str, str]) -> str:
    r = _run([client, "load", "-i", path], env, timeout=1800)
    if r.returncode != 0:
        raise ContainerError("%s load -i %s failed: %s" % (client, path, _last(r.stderr)))
    for line in reversed(r.stdout.decode(errors="replace").splitlines()):
        if line.startswith("Loaded image"):  # "Loaded image: NAME" or docker's "Loaded image ID: sha256:..."
            return line.split(": ", 1)[1].strip().split(",")[0].strip()
    raise ContainerError("%s load -i %s said no image name: %s" % (client, path, _last(r.stdout)))


def _last(data: bytes) -> str:
    lines = [ln for ln in data.decode(errors="replace").splitlines() if ln.strip()]
    return lines[-1] if lines else "(no output)"


# -- the runtimes --------------------------------------------------------------------------------

class Engine:
    """One runtime's commands. ``env``: what its client is run with besides the agent's own
    environment."""

    name = ""

    def __init__(self, state_dir: str):
        self.state_dir = state_dir
        self.env = {}  # type: Dict[str, str]

    def unreachable(self) -> str:
        """Why the runtime cannot be used here ("" when it can): a daemon that does not answer."""
        return ""

    def image_present(self, image: str) -> bool:
        raise NotImplementedError

    def load(self, path: str) -> str:
        raise NotImplementedError

    def run_argv(self, name: str, job_id: str, image: str, mounts: List[str], gpus: List[int],
                 simulated: bool, options: List[str], agent: List[str], jobhost_pid: int) -> List[str]:
        raise NotImplementedError

    def pid(self, name: str) -> Optional[int]:
        """The container's main process (Podman's and Docker's ``inspect``)."""
        return self._inspect_pid(name)

    def exec_argv(self, name: str, env: Dict[str, str], workdir: str, argv: List[str],
                  gpus: List[int], simulated: bool) -> List[str]:
        """A wrapper started in the container (Podman's and Docker's ``exec``)."""
        gpu_env(env, gpus, simulated)
        return self._exec_with_names(name, env, workdir, argv)

    def remove(self, name: str) -> None:
        raise NotImplementedError

    def _inspect_pid(self, name: str) -> Optional[int]:
        r = _run([self.name, "inspect", "--format", "{{.State.Pid}}", name], self.env)
        text = r.stdout.decode(errors="replace").strip()
        return int(text) if r.returncode == 0 and text.isdigit() and int(text) > 0 else None

    def _exec_with_names(self, name: str, env: Dict[str, str], workdir: str, argv: List[str]) -> List[str]:
        """``podman exec``/``docker exec``: values reach it through the client's environment
        (``--env NAME`` takes the value from there): no value is in an argument."""
        env.update(self.env)
        out = [self.name, "exec", "--workdir", workdir]
        for k in sorted(k for k in env if k not in HOST_ONLY):
            out += ["--env", k]
        return out + [name] + argv


class Podman(Engine):
    """Podman with the agent's own store (``store_env``)."""

    name = "podman"

    def __init__(self, state_dir: str):
        super().__init__(state_dir)
        self.env = store_env(state_dir)

    def image_present(self, image: str) -> bool:
        return image_present(image, self.env)

    def load(self, path: str) -> str:
        return _load("podman", path, self.env)

    def run_argv(self, name: str, job_id: str, image: str, mounts: List[str], gpus: List[int],
                 simulated: bool, options: List[str], agent: List[str], jobhost_pid: int) -> List[str]:
        return (["podman"] + oci_runtime() + [
            "run", "--detach", "--rm", "--name", name, "--label", "%s=%s" % (LABEL, job_id),
            "--network=host", "--ipc=host", "--pid=host", "--uts=host", "--env", "RIGDECK_JOB_ID=%s" % job_id,
        ] + ulimits() + devices(gpus, simulated) + _volumes(mounts) + options
            + ["--entrypoint", agent[0], image] + agent[1:] + ["hold", "--pid", str(jobhost_pid)])

    def remove(self, name: str) -> None:
        try:
            _run(["podman", "rm", "--force", "--time", "0", "--ignore", name], self.env, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            pass


class Docker(Engine):
    """The Docker daemon the agent's environment names (``DOCKER_HOST``, else the default
    socket). Run by an account other than root, a daemon of root's runs the container as that
    account (``--user``), so the job's files stay its own; a rootless daemon's root is the
    account already."""

    name = "docker"

    def __init__(self, state_dir: str):
        super().__init__(state_dir)
        self._rootless = None  # type: Optional[bool]

    def _info(self) -> Tuple[Optional[List[str]], str]:
        """The daemon's security options, or None and why it did not answer."""
        try:
            r = _run(["docker", "info", "--format", "{{json .SecurityOptions}}"], self.env)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, str(e)
        if r.returncode != 0:
            return None, _last(r.stderr)
        try:
            got = json.loads(r.stdout.decode(errors="replace") or "null")
        except ValueError:
            return None, _last(r.stdout)
        return [str(x) for x in got or ()], ""

    def unreachable(self) -> str:
        options, why = self._info()
        if options is None:
            name, _ = _account()
            return ("the Docker daemon does not answer account %s at %s: %s (start dockerd; an account "
                    "other than root needs the docker group, `usermod -aG docker %s`, or a rootless daemon "
                    "of its own named by DOCKER_HOST in the inventory's env)"
                    % (name, os.environ.get("DOCKER_HOST") or "the default socket", why, name))
        self._rootless = any("rootless" in o for o in options)
        return ""

    def image_present(self, image: str) -> bool:
        try:
            return _run(["docker", "image", "inspect", "--format", "{{.Id}}", image], self.env).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def load(self, path: str) -> str:
        return _load("docker", path, self.env)

    def user(self) -> List[str]:
        """``--user uid:gid`` for an account other than root on root's daemon."""
        if os.geteuid() == 0:
            return []
        if self._rootless is None:
            self.unreachable()
        return [] if self._rootless else ["--user", "%d:%d" % (os.geteuid(), os.getegid())]

    def run_argv(self, name: str, job_id: str, image: str, mounts: List[str], gpus: List[int],
                 simulated: bool, options: List[str], agent: List[str], jobhost_pid: int) -> List[str]:
        return (["docker", "run", "--detach", "--rm", "--name", name, "--label", "%s=%s" % (LABEL, job_id),
                 "--network=host", "--ipc=host", "--pid=host", "--uts=host",
                 "--env", "RIGDECK_JOB_ID=%s" % job_id] + self.user()
                + ulimits(nproc_cap=None) + docker_devices(gpus, simulated) + _volumes(mounts) + options
                + ["--entrypoint", agent[0], image] + agent[1:] + ["hold", "--pid", str(jobhost_pid)])

    def remove(self, name: str) -> None:
        try:  # a container already gone is said on stderr, nothing more
            _run(["docker", "rm", "--force", name], self.env, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            pass


class Apptainer(Engine):
    """Apptainer: one instance of an image file (SIF or sandbox directory) per host. Its
    defaults are the host's network, IPC and PID namespaces and the host's ``/dev``;
    ``--nv`` binds the host's NVIDIA driver and devices (all of them: CUDA_VISIBLE_DEVICES
    keeps the host's numbers). ``--cleanenv``: the ranks get only what the job gives them,
    passed as ``APPTAINERENV_<NAME>`` in the client's environment (no value in an argument)."""

    name = "apptainer"

    def image_present(self, image: str) -> bool:
        return os.path.exists(image)

    def load(self, path: str) -> str:
        return path  # an image file is run where it is

    def run_argv(self, name: str, job_id: str, image: str, mounts: List[str], gpus: List[int],
                 simulated: bool, options: List[str], agent: List[str], jobhost_pid: int) -> List[str]:
        out = ["apptainer", "instance", "start", "--cleanenv", "--env", "RIGDECK_JOB_ID=%s" % job_id]
        if gpus and not simulated:
            out.append("--nv")
        for m in mounts:
            out += ["--bind", m]
        return out + options + [image, name]

    def pid(self, name: str) -> Optional[int]:
        try:
            r = _run(["apptainer", "instance", "list", "--json", name], self.env)
            got = json.loads(r.stdout.decode(errors="replace") or "{}") if r.returncode == 0 else {}
        except (OSError, subprocess.TimeoutExpired, ValueError):
            return None
        for inst in got.get("instances") or ():
            if inst.get("instance") == name and int(inst.get("pid") or 0) > 0:
                return int(inst["pid"])
        return None

    def exec_argv(self, name: str, env: Dict[str, str], workdir: str, argv: List[str],
                  gpus: List[int], simulated: bool) -> List[str]:
        for k in [k for k in env if k not in HOST_ONLY and not k.startswith("APPTAINER")]:
            env["APPTAINERENV_" + k] = env[k]
        return ["apptainer", "exec", "--cleanenv", "--pwd", workdir, "instance://" + name] + argv

    def remove(self, name: str) -> None:
        try:
            _run(["apptainer", "instance", "stop", "--force", name], self.env, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            pass


ENGINES = {"podman": Podman, "docker": Docker, "apptainer": Apptainer}


def engine_for(runtime: str, state_dir: str) -> Engine:
    return ENGINES[runtime](state_dir)


def _volumes(mounts: List[str]) -> List[str]:
    out = []  # type: List[str]
    for m in mounts:
        out += ["--volume", m]
    return out


class Container:
    """This host's container of one job: started once, ranks exec'd into it, removed at the end."""

    def __init__(self, spec: Dict[str, Any], job_id: str, host: str, job_dir: str):
        self.spec = spec
        self.job_id = job_id
        self.name = name_for(job_id, host)
        self.job_dir = job_dir
        self.runtime = str(spec.get("runtime") or "podman")
        # the job dir is <state dir>/jobs/<job id>
        self.engine = engine_for(self.runtime, os.path.dirname(os.path.dirname(os.path.abspath(job_dir))))
        self.env = self.engine.env
        self.simulated = bool(os.environ.get("RIGDECK_SIM_GPUS", "").strip() not in ("", "0"))

    def mount_list(self, plan: Dict[str, Any], agent_path: str) -> List[str]:
        """Every bind mount as ``SRC:DST[:ro]``: the job's own paths at their own paths, the
        agent read-only, then the spec's."""
        paths = [self.job_dir, os.path.abspath(plan.get("workdir") or self.job_dir)]
        ckpt = (plan.get("checkpoint") or {}).get("dir")
        if ckpt:
            os.makedirs(ckpt, exist_ok=True)
            paths.append(os.path.abspath(ckpt))
        out = []  # type: List[str]
        for p in paths:
            if "%s:%s" % (p, p) not in out:
                out.append("%s:%s" % (p, p))
        out.append("%s:%s:ro" % (agent_path, agent_path))
        return out + [str(m) for m in self.spec.get("mounts") or ()]

    def mounts(self, plan: Dict[str, Any], agent_path: str) -> List[str]:
        return _volumes(self.mount_list(plan, agent_path))

    def run_argv(self, plan: Dict[str, Any], agent: List[str], gpus: List[int], jobhost_pid: int) -> List[str]:
        """The runtime's start of the container; ``agent``: how the image's python3 runs the agent."""
        return self.engine.run_argv(self.name, self.job_id, str(self.spec["image"]),
                                    self.mount_list(plan, agent[-1]), gpus, self.simulated,
                                    [str(o) for o in self.spec.get("options") or ()], agent, jobhost_pid)

    def start(self, plan: Dict[str, Any], agent: List[str], gpus: List[int], log: Any) -> None:
        if is_archive(str(self.spec["image"])):
            self.spec = dict(self.spec, image=self.engine.load(str(self.spec["image"])))
        self.remove()  # a previous attempt's, if its job host died before removing it
        argv = self.run_argv(plan, agent, gpus, os.getpid())
        log("container: %s" % " ".join(argv))
        r = _run(argv, self.env, timeout=600)
        if r.returncode != 0:
            raise ContainerError("%s run of %s failed: %s" % (self.runtime, self.spec["image"], _last(r.stderr)))
        deadline = time.monotonic() + 60
        while self.pid() is None:
            if time.monotonic() > deadline:
                raise ContainerError("container %s did not start within 60 s" % self.name)
            time.sleep(0.2)

    def pid(self) -> Optional[int]:
        """The host pid of the container's process while it runs."""
        return self.engine.pid(self.name)

    def exec_argv(self, env: Dict[str, str], cwd: str, argv: List[str], gpus: List[int]) -> List[str]:
        """The runtime's exec of one wrapper (or launcher) in the container. The caller passes
        ``env`` (changed here: GPUs, the runtime's own settings) as the client's environment:
        values reach the process through it, none is in an argument."""
        return self.engine.exec_argv(self.name, env, str(self.spec.get("workdir") or cwd), argv, gpus,
                                     self.simulated)

    def remove(self) -> None:
        self.engine.remove(self.name)


def remove(name: str, env: Dict[str, str], runtime: str = "podman", state_dir: str = "") -> None:
    """The container ``name`` gone, running or not (none: nothing to do). ``env``: Podman's
    store (``store_env``); the other runtimes need none."""
    engine = engine_for(runtime, state_dir) if runtime != "podman" else None
    if engine is not None:
        engine.remove(name)
        return
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
    import secrets  # (here: the job host's start does not load images)
    import tempfile

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
