"""Who am I in this job: one ``ClusterInfo`` merged from every launcher's variables.

Sources, highest priority first (each one is optional):

1. ``rigdeck``   -- the agent's ``RIGDECK_*`` variables (docs/contracts.md)
2. ``torch``     -- ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``NODE_RANK``
                    (else torchrun's ``GROUP_RANK``), ``MASTER_ADDR``, ``MASTER_PORT``
3. ``SageMaker resourceconfig.json`` -- ``$SAGEMAKER_BASE_DIR`` (default ``/opt/ml``)
                    ``/input/config/resourceconfig.json`` (processing jobs: ``/config/...``)
4. ``SageMaker SM_*`` -- ``SM_HOSTS``, ``SM_CURRENT_HOST``
5. ``Vertex CLUSTER_SPEC`` -- node rank 0 for workerpool0, else 1 + index; hosts =
                    workerpool0 + workerpool1; master = workerpool0[0]
6. ``TF_CONFIG``  -- the same for chief/worker
7. ``Open MPI``   -- ``OMPI_COMM_WORLD_RANK``, ``_SIZE``, ``_LOCAL_RANK``, ``_LOCAL_SIZE``

The first source that gives a field fills it; every later source that also gives it must agree,
or ``ClusterInfoError`` names both variables, both values and both sources. A host list or host
name agrees with the rigdeck one when it names the same hosts by address (``RIGDECK_HOST_ADDRS``).

Some values are *derived* rather than given, and are used only where no source gives the field,
never checked against others: the master taken from a host list (SageMaker, Vertex), Vertex's
port, and Open MPI's node rank and node count (``rank // local size``: true for the usual
by-slot mapping only). ``OMPI_COMM_WORLD_NODE_RANK`` is not a node index (Open MPI documents it
as the rank among this node's processes across all jobs), so it is not used.

A pool job's replica (``RIGDECK_POOL`` set): torch's world is the primary and the workers, the
first replicas in rigdeck's lists, so rigdeck's host lists are cut to them and its world size
(every replica's processes) is left to torch's ``WORLD_SIZE``; the SageMaker files, which name
every replica of the heterogeneous cluster ``algo-N``, are not read. A replica outside the world
(parameter server, reduction server, evaluator) has no rank: ``ClusterInfoError`` says so.

What no source gives comes from the others (``rank = node_rank * local_world_size + local_rank``
and so on), else single-process defaults: world 1, rank 0, master 127.0.0.1:29500.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

DEFAULT_MASTER_PORT = 29500
POLICIES = ("rank0", "per-node", "all", "host:NAME/gpu:I")
_HOST_POLICY = re.compile(r"^host:(?P<host>[^/]+)/gpu:(?P<gpu>\d+)$")

# Fields compared across sources; the rest (role, job id, policy) are first-source-wins.
_CHECKED = {
    "world_size", "rank", "local_rank", "local_world_size", "node_rank", "num_nodes",
    "hosts", "current_host", "master_addr", "master_port",
}


class ClusterInfoError(ValueError):
    """The environment describes the job inconsistently or unreadably."""


@dataclass(frozen=True)
class ClusterInfo:
    """This rank's place in the job (see the module docstring for where each field comes from)."""

    world_size: int
    rank: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    hosts: Tuple[str, ...]
    current_host: str
    master_addr: str
    master_port: int
    device: str
    role: str
    checkpoint_owner: bool
    checkpoint_policy: str
    job_id: Optional[str]
    source: Tuple[str, ...]
    gpu: Optional[int] = None
    """Physical GPU index of this rank (``RIGDECK_GPUS[local_rank]``), None when unknown."""
    host_addrs: Tuple[str, ...] = ()
    gpus: Tuple[int, ...] = ()
    """This host's GPUs given to the job, in local-rank order (``RIGDECK_GPUS``)."""

    @property
    def is_primary(self) -> bool:
        return self.rank == 0

    @property
    def owner_gpu(self) -> int:
        """The ``I`` of ``host:NAME/gpu:I`` for this rank: its physical GPU, else its local rank."""
        return self.gpu if self.gpu is not None else self.local_rank


@dataclass(frozen=True)
class OwnerDecision:
    """Whether this rank writes checkpoints, and whether the policy's owner had to move."""

    owner: bool
    policy: str
    moved_from: Optional[Dict[str, Any]] = None
    reason: Optional[str] = None


# (value, variable it came from, derived?)
_Entry = Tuple[Any, str, bool]


def _int(env: Mapping[str, str], name: str, source: str) -> Optional[int]:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw.strip())
    except ValueError:
        raise ClusterInfoError(f"{name}={raw!r} ({source}): expected an integer") from None


def _json(raw: str, name: str, source: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError as e:
        raise ClusterInfoError(f"{name} ({source}) is not valid JSON: {e}") from None


def _str_list(value: Any, name: str, source: str) -> Tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ClusterInfoError(f"{name} ({source}): expected a JSON list of strings, got {value!r}")
    return tuple(value)


def _put(out: Dict[str, _Entry], field: str, value: Any, var: str, derived: bool = False) -> None:
    if value is not None:
        out[field] = (value, var, derived)


def _from_rigdeck(env: Mapping[str, str]) -> Dict[str, _Entry]:
    src = "rigdeck"
    out: Dict[str, _Entry] = {}
    if "RIGDECK_HOSTS" in env:
        _put(out, "hosts", _str_list(_json(env["RIGDECK_HOSTS"], "RIGDECK_HOSTS", src),
                                     "RIGDECK_HOSTS", src), "RIGDECK_HOSTS")
    if "RIGDECK_HOST_ADDRS" in env:
        _put(out, "host_addrs",
             _str_list(_json(env["RIGDECK_HOST_ADDRS"], "RIGDECK_HOST_ADDRS", src),
                       "RIGDECK_HOST_ADDRS", src), "RIGDECK_HOST_ADDRS")
    _put(out, "current_host", env.get("RIGDECK_CURRENT_HOST") or None, "RIGDECK_CURRENT_HOST")
    for field, var in (("node_rank", "RIGDECK_NODE_RANK"), ("num_nodes", "RIGDECK_NUM_NODES"),
                       ("rank", "RIGDECK_RANK"), ("local_rank", "RIGDECK_LOCAL_RANK"),
                       ("world_size", "RIGDECK_WORLD_SIZE"),
                       ("local_world_size", "RIGDECK_LOCAL_WORLD_SIZE"),
                       ("master_port", "RIGDECK_MASTER_PORT")):
        _put(out, field, _int(env, var, src), var)
    _put(out, "master_addr", env.get("RIGDECK_MASTER_ADDR") or None, "RIGDECK_MASTER_ADDR")
    _put(out, "job_id", env.get("RIGDECK_JOB_ID") or None, "RIGDECK_JOB_ID")
    _put(out, "checkpoint_policy", env.get("RIGDECK_CHECKPOINT_OWNER") or None,
         "RIGDECK_CHECKPOINT_OWNER")
    if "RIGDECK_GPUS" in env:
        raw = env["RIGDECK_GPUS"].strip()
        try:
            gpus = tuple(int(g) for g in raw.split(",")) if raw else ()
        except ValueError:
            raise ClusterInfoError(
                f"RIGDECK_GPUS={raw!r} (rigdeck): expected a comma list of GPU indices") from None
        _put(out, "gpus", gpus, "RIGDECK_GPUS")
    if env.get("RIGDECK_POOL"):
        _world_only(env, out)
    return out


def _world_only(env: Mapping[str, str], out: Dict[str, _Entry]) -> None:
    """A pool job's replica (``RIGDECK_POOL``): rigdeck's host lists and sizes cover every
    replica, torch's world only the primary and the workers, which come first. A training rank's
    view is the world's; a replica outside it has no rank to describe."""
    pool = env.get("RIGDECK_POOL")
    if env.get("RIGDECK_IN_WORLD") != "1":
        raise ClusterInfoError(
            f"this process is {pool} replica {env.get('RIGDECK_POOL_REPLICA', '?')} of a pool job, "
            "outside torch's world (the primary and the workers): it has no rank; read its role from "
            "RIGDECK_POOL, CLUSTER_SPEC or TF_CONFIG")
    spec = _json(env.get("CLUSTER_SPEC") or "{}", "CLUSTER_SPEC", "Vertex CLUSTER_SPEC")
    cluster = spec.get("cluster") if isinstance(spec, dict) else None
    if not isinstance(cluster, dict):
        raise ClusterInfoError(f"RIGDECK_POOL={pool!r} but CLUSTER_SPEC has no 'cluster' object")
    primary, workers = _pools(cluster, "workerpool0", "workerpool1", "CLUSTER_SPEC", "Vertex CLUSTER_SPEC")
    n = len(primary) + len(workers)
    for field in ("hosts", "host_addrs"):
        if field in out:
            value, var, derived = out[field]
            out[field] = (tuple(value[:n]), f"{var}[:{n}]", derived)
    out["num_nodes"] = (n, "CLUSTER_SPEC workerpool0+workerpool1", False)
    out.pop("world_size", None)  # every replica's processes; torch's WORLD_SIZE is the world's


def _from_torch(env: Mapping[str, str]) -> Dict[str, _Entry]:
    src = "torch"
    out: Dict[str, _Entry] = {}
    for field, var in (("rank", "RANK"), ("world_size", "WORLD_SIZE"),
                       ("local_rank", "LOCAL_RANK"), ("local_world_size", "LOCAL_WORLD_SIZE"),
                       ("master_port", "MASTER_PORT")):
        _put(out, field, _int(env, var, src), var)
    node_var = "NODE_RANK" if "NODE_RANK" in env else "GROUP_RANK"
    _put(out, "node_rank", _int(env, node_var, src), node_var)
    _put(out, "master_addr", env.get("MASTER_ADDR") or None, "MASTER_ADDR")
    _put(out, "job_id", env.get("TORCHELASTIC_RUN_ID") or None, "TORCHELASTIC_RUN_ID")
    return out


def _hosts_view(out: Dict[str, _Entry], hosts: Tuple[str, ...], current: Optional[str],
                var_hosts: str, var_current: str) -> None:
    _put(out, "hosts", hosts, var_hosts)
    _put(out, "num_nodes", len(hosts) if hosts else None, f"len({var_hosts})")
    _put(out, "current_host", current, var_current)
    if current is not None and hosts:
        if current not in hosts:
            raise ClusterInfoError(f"{var_current}={current!r} is not in {var_hosts}={list(hosts)}")
        _put(out, "node_rank", hosts.index(current), f"{var_hosts}.index({var_current})")
    if hosts:
        _put(out, "master_addr", hosts[0], f"{var_hosts}[0]", derived=True)


def _from_sagemaker_file(base_dir: str) -> Dict[str, _Entry]:
    out: Dict[str, _Entry] = {}
    for rel in ("input/config/resourceconfig.json", "config/resourceconfig.json"):
        path = os.path.join(base_dir, rel)
        try:
            with open(path, encoding="utf-8") as f:
                raw = f.read()
        except FileNotFoundError:
            continue
        except OSError as e:
            raise ClusterInfoError(f"cannot read {path}: {e}") from None
        src = "SageMaker resourceconfig.json"
        data = _json(raw, path, src)
        if not isinstance(data, dict):
            raise ClusterInfoError(f"{path}: expected a JSON object")
        hosts = _str_list(data.get("hosts", []), f"{path}: hosts", src)
        current = data.get("current_host")
        if current is not None and not isinstance(current, str):
            raise ClusterInfoError(f"{path}: current_host must be a string, got {current!r}")
        _hosts_view(out, hosts, current, "resourceconfig.json hosts",
                    "resourceconfig.json current_host")
        break
    return out


def _from_sagemaker_env(env: Mapping[str, str]) -> Dict[str, _Entry]:
    out: Dict[str, _Entry] = {}
    if "SM_HOSTS" not in env and "SM_CURRENT_HOST" not in env:
        return out
    src = "SageMaker SM_*"
    hosts: Tuple[str, ...] = ()
    if "SM_HOSTS" in env:
        hosts = _str_list(_json(env["SM_HOSTS"], "SM_HOSTS", src), "SM_HOSTS", src)
    _hosts_view(out, hosts, env.get("SM_CURRENT_HOST") or None, "SM_HOSTS", "SM_CURRENT_HOST")
    return out


def _split_addr(entry: str) -> Tuple[str, Optional[int]]:
    host, sep, port = entry.rpartition(":")
    if sep and port.isdigit() and host and not host.endswith(":"):
        return host.strip("[]"), int(port)
    return entry, None


def _pools(cluster: Mapping[str, Any], first: str, rest: str, var: str, src: str,
           ) -> Tuple[List[str], List[str]]:
    a = _str_list(cluster.get(first, []), f"{var} cluster.{first}", src)
    b = _str_list(cluster.get(rest, []), f"{var} cluster.{rest}", src)
    return list(a), list(b)


def _from_task_spec(raw: str, var: str, src: str, first: str, rest: str) -> Dict[str, _Entry]:
    out: Dict[str, _Entry] = {}
    data = _json(raw, var, src)
    if not isinstance(data, dict) or not isinstance(data.get("cluster"), dict):
        raise ClusterInfoError(f"{var} ({src}): expected an object with a 'cluster' object")
    primary, workers = _pools(data["cluster"], first, rest, var, src)
    entries = primary + workers
    hosts = tuple(_split_addr(e)[0] for e in entries)
    task = data.get("task") or {}
    if not isinstance(task, dict):
        raise ClusterInfoError(f"{var} ({src}): 'task' must be an object")
    ttype = task.get("type")
    index = task.get("index", 0)
    if not isinstance(index, int):
        raise ClusterInfoError(f"{var} ({src}): task.index must be an integer, got {index!r}")
    _put(out, "hosts", hosts or None, f"{var} cluster.{first}+{rest}")
    _put(out, "num_nodes", len(hosts) or None, f"{var} cluster.{first}+{rest}")
    if isinstance(ttype, str):
        _put(out, "role", ttype, f"{var} task.type")
    if ttype == first:
        node_rank: Optional[int] = index
    elif ttype == rest:
        # Without a chief (TF_CONFIG may have none) workers count from 0.
        node_rank = (len(primary) + index) if primary else index
    else:
        node_rank = None  # parameter servers, evaluators: not training nodes
    if node_rank is not None:
        label = f"{var} task={ttype}:{index}"
        _put(out, "node_rank", node_rank, label)
        if node_rank < len(hosts):
            _put(out, "current_host", hosts[node_rank], label)
    if entries:
        host, port = _split_addr(entries[0])
        _put(out, "master_addr", host, f"{var} cluster.{first}[0]", derived=True)
        _put(out, "master_port", port, f"{var} cluster.{first}[0]", derived=True)
    return out


def _from_vertex(env: Mapping[str, str]) -> Dict[str, _Entry]:
    if "CLUSTER_SPEC" not in env:
        return {}
    return _from_task_spec(env["CLUSTER_SPEC"], "CLUSTER_SPEC", "Vertex CLUSTER_SPEC",
                           "workerpool0", "workerpool1")


def _from_tf_config(env: Mapping[str, str]) -> Dict[str, _Entry]:
    if "TF_CONFIG" not in env:
        return {}
    return _from_task_spec(env["TF_CONFIG"], "TF_CONFIG", "TF_CONFIG", "chief", "worker")


def _from_openmpi(env: Mapping[str, str]) -> Dict[str, _Entry]:
    src = "Open MPI"
    out: Dict[str, _Entry] = {}
    for field, var in (("rank", "OMPI_COMM_WORLD_RANK"), ("world_size", "OMPI_COMM_WORLD_SIZE"),
                       ("local_rank", "OMPI_COMM_WORLD_LOCAL_RANK"),
                       ("local_world_size", "OMPI_COMM_WORLD_LOCAL_SIZE")):
        _put(out, field, _int(env, var, src), var)
    rank, size, local = (out.get(k, (None,))[0] for k in ("rank", "world_size", "local_world_size"))
    if local:
        if rank is not None:
            _put(out, "node_rank", rank // local, "OMPI_COMM_WORLD_RANK // LOCAL_SIZE", True)
        if size is not None:
            _put(out, "num_nodes", -(-size // local), "OMPI_COMM_WORLD_SIZE / LOCAL_SIZE", True)
    return out


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return json.dumps(list(value))
    return str(value)


def _agree(field: str, have: Any, new: Any, addrs: Tuple[str, ...],
           hosts: Optional[Tuple[str, ...]]) -> bool:
    if have == new:
        return True
    # Cluster files may name hosts by address where rigdeck names them by inventory name.
    if addrs and hosts and len(addrs) == len(hosts):
        to_name = dict(zip(addrs, hosts))  # noqa: B905 (3.9: no strict=)
        if field == "hosts" and isinstance(new, tuple):
            return tuple(to_name.get(h, h) for h in new) == have
        if field == "current_host":
            return to_name.get(new, new) == have
    return False


def _detect_cuda_devices(env: Mapping[str, str]) -> int:
    """How many CUDA devices this process sees, without importing torch."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
        except Exception:  # a broken CUDA install is reported by torch itself later
            return 0
    try:
        present = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return present
    ids = [v for v in visible.split(",") if v.strip()]
    if ids and ids[0].strip().startswith("-"):
        return 0
    return min(len(ids), present)


def resolve_owner(policy: str, info: "ClusterInfo") -> OwnerDecision:
    """Does this rank write checkpoints under ``policy``? Moves a host owner absent from the job."""
    policy = policy.strip()
    if policy == "rank0":
        return OwnerDecision(info.rank == 0, policy)
    if policy == "per-node":
        return OwnerDecision(info.local_rank == 0, policy)
    if policy == "all":
        return OwnerDecision(True, policy)
    m = _HOST_POLICY.match(policy)
    if not m:
        raise ClusterInfoError(
            f"checkpoint owner {policy!r}: expected one of {', '.join(POLICIES)}")
    host, gpu = m.group("host"), int(m.group("gpu"))
    if info.hosts and host not in info.hosts:
        return OwnerDecision(info.rank == 0, policy, moved_from={"host": host, "gpu": gpu},
                             reason=f"host {host} not in this run")
    return OwnerDecision(host == info.current_host and info.owner_gpu == gpu, policy)


def check_policy(policy: str, info: "ClusterInfo") -> None:
    """Raise ClusterInfoError when ``policy`` is malformed, or names a GPU of this host that
    no rank of the job has (then nobody would write checkpoints)."""
    resolve_owner(policy, info)
    m = _HOST_POLICY.match(policy.strip())
    if not m or m.group("host") != info.current_host:
        return
    gpu = int(m.group("gpu"))
    slots = list(info.gpus) if info.gpus else list(range(info.local_world_size))
    if gpu not in slots:
        what = f"GPUs {slots}" if info.gpus else f"local ranks {slots} (no GPUs)"
        raise ClusterInfoError(
            f"checkpoint owner {policy!r}: {info.current_host} runs this job on {what}, "
            f"so no rank would write checkpoints")


def cluster_info(environ: Optional[Mapping[str, str]] = None,
                 sagemaker_base_dir: Optional[str] = None, *,
                 cuda_devices: Optional[int] = None,
                 default_master_port: int = DEFAULT_MASTER_PORT) -> ClusterInfo:
    """This rank's ClusterInfo from whichever sources exist (order: module docstring).

    ``environ`` defaults to ``os.environ``; ``sagemaker_base_dir`` to ``$SAGEMAKER_BASE_DIR`` or
    ``/opt/ml``; ``cuda_devices`` (visible CUDA devices) is detected when None.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    merged = _merge(_sources(env, sagemaker_base_dir or env.get("SAGEMAKER_BASE_DIR") or "/opt/ml"))
    place = _place(merged)
    _check_place(merged, place)
    gpu = _gpu(merged.get("gpus"), place.local_rank)
    n_cuda = _detect_cuda_devices(env) if cuda_devices is None else cuda_devices
    device = f"cuda:{place.local_rank % n_cuda}" if n_cuda > 0 else "cpu"

    policy = merged.get("checkpoint_policy") or "rank0"
    role = merged.get("role") or ("workerpool0" if place.node_rank == 0 else "workerpool1")
    master_port = merged.get("master_port")
    info = ClusterInfo(
        world_size=place.world, rank=place.rank, local_rank=place.local_rank,
        local_world_size=place.local_world, node_rank=place.node_rank, num_nodes=place.num_nodes,
        hosts=place.hosts, current_host=place.current,
        master_addr=merged.get("master_addr") or "127.0.0.1",
        master_port=int(master_port) if master_port is not None else default_master_port,
        device=device, role=role, checkpoint_owner=False, checkpoint_policy=policy,
        job_id=merged.get("job_id"), source=tuple(merged.used) or ("defaults",), gpu=gpu,
        host_addrs=merged.addrs, gpus=merged.get("gpus") or (),
    )
    check_policy(policy, info)
    decision = resolve_owner(policy, info)
    return dataclasses.replace(info, checkpoint_owner=decision.owner)


def _sources(env: Mapping[str, str], base: str) -> Tuple[Tuple[str, Dict[str, _Entry]], ...]:
    """Every source's fields, highest priority first, each read now (a source that cannot be
    read raises here, before any merging)."""
    # A pool job's SageMaker files describe the heterogeneous cluster (every replica, named
    # algo-N), not torch's world: they are not a source of this rank's place in it.
    pooled = bool(env.get("RIGDECK_POOL"))
    return (
        ("rigdeck", _from_rigdeck(env)),
        ("torch", _from_torch(env)),
        ("SageMaker resourceconfig.json", {} if pooled else _from_sagemaker_file(base)),
        ("SageMaker SM_*", {} if pooled else _from_sagemaker_env(env)),
        ("Vertex CLUSTER_SPEC", _from_vertex(env)),
        ("TF_CONFIG", _from_tf_config(env)),
        ("Open MPI", _from_openmpi(env)),
    )


@dataclass
class _Merged:
    """The sources merged: each field's value with the variable and source that gave it (the
    first source that gives it), the sources that gave anything, and the host addresses."""

    fields: Dict[str, Tuple[Any, str, str]]  # field -> (value, var, source)
    used: List[str]
    addrs: Tuple[str, ...]

    def get(self, field: str) -> Any:
        return self.fields[field][0] if field in self.fields else None

    def origin(self, field: str) -> str:
        """The variable and source a field came from, as errors name it."""
        return f"{self.fields[field][1]} ({self.fields[field][2]})"


def _merge(sources: Tuple[Tuple[str, Dict[str, _Entry]], ...]) -> _Merged:
    """First source wins each field; a later source that gives a checked field must agree with
    it. Derived values fill only the fields no source gives, after every given one is in."""
    merged: Dict[str, Tuple[Any, str, str]] = {}
    used: List[str] = []
    addrs: Tuple[str, ...] = ()
    for name, entries in sources:
        if entries:
            used.append(name)
        if "host_addrs" in entries:
            addrs = entries["host_addrs"][0]
        for field, (value, var, derived) in entries.items():
            if derived:
                continue
            if field not in merged:
                merged[field] = (value, var, name)
                continue
            have, have_var, have_src = merged[field]
            hosts = merged.get("hosts", (None,))[0]
            if field in _CHECKED and not _agree(field, have, value, addrs, hosts):
                raise ClusterInfoError(
                    f"{have_var}={_show(have)} ({have_src}) contradicts "
                    f"{var}={_show(value)} ({name})")
    for name, entries in sources:
        for field, (value, var, derived) in entries.items():
            if derived and field not in merged:
                merged[field] = (value, var, name)
    return _Merged(merged, used, addrs)


@dataclass(frozen=True)
class _Place:
    """This rank's place in the job, every number filled in (given, or made from the others)."""

    world: int
    rank: int
    local_world: int
    local_rank: int
    node_rank: int
    num_nodes: int
    hosts_given: Optional[Tuple[str, ...]]  # the host list a source gave, if any
    hosts: Tuple[str, ...]  # that list, or this host alone in a one-node job
    current: str


def _place(merged: _Merged) -> _Place:
    """What no source gives comes from the others (module docstring), else the single-process
    defaults; the current host from the host list at this node's index, else this machine."""
    world, rank = merged.get("world_size"), merged.get("rank")
    local_world, local_rank = merged.get("local_world_size"), merged.get("local_rank")
    node_rank, num_nodes = merged.get("node_rank"), merged.get("num_nodes")
    hosts_v: Optional[Tuple[str, ...]] = merged.get("hosts")
    if num_nodes is None and hosts_v:
        num_nodes = len(hosts_v)
    if local_world is None:
        if world is not None and num_nodes:
            local_world = max(1, world // num_nodes)
        else:
            local_world = world if world is not None else 1
    if num_nodes is None:
        num_nodes = -(-world // local_world) if world is not None else 1
    if local_rank is None:
        local_rank = rank % local_world if rank is not None else 0
    if node_rank is None:
        node_rank = rank // local_world if rank is not None else 0
    if world is None:
        world = num_nodes * local_world
    if rank is None:
        rank = node_rank * local_world + local_rank

    current = merged.get("current_host")
    if current is None:
        current = hosts_v[node_rank] if hosts_v and node_rank < len(hosts_v) else \
            socket.gethostname()
    hosts = tuple(hosts_v) if hosts_v else ((current,) if num_nodes == 1 else ())
    return _Place(world=world, rank=rank, local_world=local_world, local_rank=local_rank,
                  node_rank=node_rank, num_nodes=num_nodes, hosts_given=hosts_v, hosts=hosts,
                  current=current)


def _check_place(merged: _Merged, place: _Place) -> None:
    """Raise ClusterInfoError, naming the variables, when the numbers do not fit together: a
    rank outside its world, a host list of another length than the node count, a current host
    at another index than the node rank."""
    for field, value, bound in (("rank", place.rank, place.world),
                                ("local_rank", place.local_rank, place.local_world),
                                ("node_rank", place.node_rank, place.num_nodes)):
        if not 0 <= value < bound:
            where = merged.origin(field) if field in merged.fields else field
            raise ClusterInfoError(f"{where} = {value} is outside 0..{bound - 1}")
    hosts_v, current, node_rank = place.hosts_given, place.current, place.node_rank
    if hosts_v and len(hosts_v) != place.num_nodes:
        raise ClusterInfoError(
            f"{merged.origin('hosts')} lists {len(hosts_v)} hosts "
            f"but {merged.origin('num_nodes')} is {place.num_nodes}")
    # (Two replicas of a pool job may share a host: then its name alone does not say which.)
    if hosts_v and current in hosts_v and hosts_v.count(current) == 1 \
            and hosts_v.index(current) != node_rank and "current_host" in merged.fields:
        raise ClusterInfoError(
            f"{merged.origin('node_rank')} is {node_rank} but {merged.origin('current_host')} = "
            f"{current!r} is host {hosts_v.index(current)} of {merged.origin('hosts')}")


def _gpu(gpus: Optional[Tuple[int, ...]], local_rank: int) -> Optional[int]:
    """This rank's physical GPU: its local rank's entry of ``RIGDECK_GPUS`` (None without one)."""
    if not gpus:
        return None
    if local_rank >= len(gpus):
        raise ClusterInfoError(
            f"RIGDECK_GPUS lists {len(gpus)} GPUs but the local rank is {local_rank}")
    return gpus[local_rank]
