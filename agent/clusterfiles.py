"""Cluster description files: one ordered host list, many views (ARCHITECTURE.md "Cluster files").

From the job plan (``docs/contracts.md``: ``plan["nodes"]`` in rank order, primary first) the agent
on each host writes, into the job directory:

- a SageMaker tree under ``<job_dir>/sagemaker`` (``SAGEMAKER_BASE_DIR``): ``input/config/``
  ``resourceconfig.json``, ``hyperparameters.json``, ``inputdataconfig.json``, ``input/data/<ch>``,
  ``model/``, ``output/{data,intermediate}/`` and ``checkpoints/``, plus the ``SM_*`` variables the
  sagemaker-training toolkit derives from them (``Environment.to_env_vars()``);
- Vertex AI's ``CLUSTER_SPEC`` and (multi-node only) ``TF_CONFIG`` (with ``task.trial`` for a
  sweep's trial), ``AIP_*`` directories, and ``CLOUD_ML_HP_METRIC_FILE``/``CLOUD_ML_TRIAL_ID`` for
  cloudml-hypertune;
- torch's ``MASTER_ADDR``/``MASTER_PORT``/``WORLD_SIZE``/``LOCAL_WORLD_SIZE``/``NODE_RANK`` and
  ``CUDA_VISIBLE_DEVICES`` (per-rank ``RANK``/``LOCAL_RANK`` come from :func:`rank_env`, torchrun or
  mpirun);
- an Open MPI hostfile (``ip slots=N``) and ``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME``;
- ``node_env.json``: the whole environment :func:`node_env` returned, so a rank started on this host
  by another host's launcher (mpirun's daemons) can take this host's values (:func:`load_node_env`).

Every view is computed from the same ordered list, so they agree by construction;
``tests/probe_rank.py`` checks that from inside real ranks.

Stdlib only, Python 3.9+. No shell anywhere.
"""
from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import socket
import struct
import subprocess
from typing import Any, Dict, List, Optional, Tuple

SAGEMAKER_GROUP = "homogeneousCluster"
DEFAULT_INTERFACE = "eth0"
LOG_LEVEL = 20  # logging.INFO, the toolkit's default
NODE_ENV_FILE = "node_env.json"
HOSTFILE = "hostfile"
HYPERTUNE_FILE = "hypertune.metrics"  # in metrics/: where CLOUD_ML_HP_METRIC_FILE points

# inputdataconfig.json entries (SageMaker developer guide; toolkit environment.py docstrings)
_CHANNEL_DEFAULTS = {
    "TrainingInputMode": "File",
    "S3DistributionType": "FullyReplicated",
    "RecordWrapperType": "None",
}
_CHANNEL_KEYS = ("ContentType", "TrainingInputMode", "S3DistributionType", "RecordWrapperType",
                 "CompressionType")
_PYTHON_RE = re.compile(r"^python(\d+(\.\d+)?)?$")


# -- small helpers ----------------------------------------------------------------------------


def _compact(obj: Any) -> str:
    """The toolkit's encoding of a non-string value (``mapping.to_env_vars``)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _sm_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("latin1")
    if isinstance(value, str):
        return value
    return _compact(value)


def _env_str(value: Any) -> str:
    """A user ``[env]`` value as an environment string (TOML may give ints, floats, bools)."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value)


def write_json_atomic(path: str, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path``: temp file in the same directory, fsync, rename."""
    d = os.path.dirname(path) or "."
    os.makedirs(d, exist_ok=True)
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_text_atomic(path: str, text: str) -> None:
    tmp = "%s.tmp-%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _symlink_atomic(target: str, link: str) -> None:
    """Make ``link`` a symlink to ``target`` (replacing an old link or an empty directory)."""
    if os.path.islink(link):
        if os.readlink(link) == target:
            return
    elif os.path.isdir(link):
        try:
            os.rmdir(link)
        except OSError as e:
            msg = "cannot link %s to %s: it is a non-empty directory" % (link, target)
            raise OSError(msg) from e
    tmp = "%s.tmp-%d" % (link, os.getpid())
    try:
        os.unlink(tmp)
    except OSError:
        pass
    os.symlink(target, tmp)
    os.replace(tmp, link)


def _ensure_dir(path: str) -> None:
    """A directory at ``path`` (a symlink left from an earlier run that pointed elsewhere goes)."""
    if os.path.islink(path):
        os.unlink(path)
    os.makedirs(path, exist_ok=True)


def _host_port(addr: str, port: int) -> str:
    if ":" in addr and not addr.startswith("["):  # an IPv6 literal
        return "[%s]:%d" % (addr, port)
    return "%s:%d" % (addr, port)


# -- placement --------------------------------------------------------------------------------


def _nodes(plan: Dict[str, Any]) -> List[Dict[str, Any]]:
    nodes = plan.get("nodes") or []
    if not nodes:
        raise ValueError("plan has no nodes")
    return nodes


def _node(plan: Dict[str, Any], node_index: int) -> Dict[str, Any]:
    nodes = _nodes(plan)
    if not 0 <= node_index < len(nodes):
        raise ValueError("node_index %d outside 0..%d" % (node_index, len(nodes) - 1))
    return nodes[node_index]


def global_ranks(plan: Dict[str, Any], node_index: int) -> List[int]:
    """The global ranks on node ``node_index``: slots of the nodes before it, plus local rank."""
    nodes = _nodes(plan)
    _node(plan, node_index)
    first = sum(int(n["slots"]) for n in nodes[:node_index])
    return list(range(first, first + int(nodes[node_index]["slots"])))


def world_size(plan: Dict[str, Any]) -> int:
    return sum(int(n["slots"]) for n in _nodes(plan))


def _gpus(node: Dict[str, Any]) -> List[int]:
    return [int(g) for g in (node.get("gpus") or [])]


def _checkpoint(plan: Dict[str, Any]) -> Tuple[Optional[str], str]:
    ck = plan.get("checkpoint") or {}
    d = ck.get("dir") or None
    if d:
        d = os.path.expanduser(str(d))
        if not os.path.isabs(d):
            d = os.path.join(plan.get("workdir") or os.getcwd(), d)
        d = os.path.normpath(d)
    return d, str(ck.get("owner") or "rank0")


def checkpoint_dir(plan: Dict[str, Any]) -> Optional[str]:
    """The plan's ``checkpoint.dir`` as a job sees it (absolute; a relative one is under its
    workdir), or None when the job keeps its checkpoints in ``sagemaker/checkpoints``."""
    return _checkpoint(plan)[0]


def _script(command: List[str]) -> Tuple[Optional[str], Optional[str]]:
    """(user_entry_point, module_name) of the command: ``python x.py`` -> (x.py, x), ``python -m m``
    -> (m, m), any other program -> (its path, its name without ``.py``)."""
    if not command:
        return None, None
    args = [str(a) for a in command]
    if _PYTHON_RE.match(os.path.basename(args[0])):
        i = 1
        while i < len(args):
            a = args[i]
            if a == "-m" and i + 1 < len(args):
                return args[i + 1], args[i + 1]
            if a.startswith("-m") and len(a) > 2:
                return a[2:], a[2:]
            if a == "-c" or a.startswith("-c"):
                return None, None
            if a in ("-W", "-X", "--check-hash-based-pycs"):
                i += 2
                continue
            if a.startswith("-"):
                i += 1
                continue
            break
        else:
            return None, None
        script = args[i]
    else:
        script = args[0]
    name = os.path.basename(script)
    return script, name[:-3] if name.endswith(".py") else name


# -- SageMaker --------------------------------------------------------------------------------


def _encode_hyperparameters(hps: Dict[str, Any]) -> Dict[str, str]:
    """As the SageMaker Python SDK does (``_json_encode_hyperparameters``): every value
    JSON-encoded, so the toolkit's ``json.loads`` gives each one back with its type."""
    return {str(k): json.dumps(v, default=str) for k, v in hps.items()}


def _decode_hyperparameters(encoded: Dict[str, str]) -> Dict[str, Any]:
    """The toolkit's ``read_hyperparameters``: ``json.loads`` each value (the raw string if that
    fails)."""
    out = {}  # type: Dict[str, Any]
    for k, v in encoded.items():
        try:
            out[k] = json.loads(v)
        except (ValueError, TypeError):
            out[k] = v
    return out


def _cmd_arg_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict):
        return ",".join("%s=%s" % (k, v) for k, v in sorted(value.items()))
    return str(value)


def user_args(hps: Dict[str, Any]) -> List[str]:
    """The toolkit's ``mapping.to_cmd_args``: sorted keys, ``--key value`` (``-k`` for one
    letter)."""
    out = []  # type: List[str]
    for k in sorted(hps):
        name = str(k)
        out.append(("--%s" % name) if len(name) > 1 else ("-%s" % name))
        out.append(_cmd_arg_value(hps[k]))
    return out


def _channels(plan: Dict[str, Any]) -> Dict[str, Tuple[Dict[str, str], Optional[str]]]:
    """``plan["channels"]``: name -> a host path (str), or a table with ``path`` and any of the
    inputdataconfig keys, or nothing (an empty directory). Returns name -> (config, source path)."""
    out = {}  # type: Dict[str, Tuple[Dict[str, str], Optional[str]]]
    for name, value in (plan.get("channels") or {}).items():
        name = str(name)
        if not name or "/" in name or name in (".", ".."):
            raise ValueError("bad channel name %r" % name)
        config = dict(_CHANNEL_DEFAULTS)
        source = None  # type: Optional[str]
        if isinstance(value, str):
            source = value
        elif isinstance(value, dict):
            source = value.get("path") or value.get("dir") or None
            for key in _CHANNEL_KEYS:
                if value.get(key) is not None:
                    config[key] = str(value[key])
        if source:
            source = os.path.expanduser(str(source))
            if not os.path.isabs(source):
                source = os.path.normpath(os.path.join(plan.get("workdir") or os.getcwd(), source))
        out[name] = (config, source)
    return out


# -- worker pools (a pool job's plan: every node is one replica of one pool) --------------------

# Vertex's pools, in order: workerpool0 the primary, 1 the workers, 2 parameter servers or
# Reduction Server replicas, 3 the evaluators.
POOL_ORDER = ("primary", "worker", "parameter_server", "reduction_server", "evaluator")
VERTEX_POOLS = {"primary": "workerpool0", "worker": "workerpool1", "parameter_server": "workerpool2",
                "reduction_server": "workerpool2", "evaluator": "workerpool3"}
VERTEX_POOL_NAMES = ("workerpool0", "workerpool1", "workerpool2", "workerpool3")
# TF_CONFIG's task type of each pool; reduction servers get no TF_CONFIG at all.
TF_TASK_TYPES = {"primary": "chief", "worker": "worker", "parameter_server": "ps",
                 "evaluator": "evaluator"}
TF_CLUSTER_KEYS = (("chief", "primary"), ("worker", "worker"), ("ps", "parameter_server"))
WORLD_POOLS = ("primary", "worker")  # torch's world: the primary and the workers
REPLICAS_DIR = "replicas"


def is_pool_plan(plan: Dict[str, Any]) -> bool:
    """A job of ``[[pools]]``: its nodes carry ``pool`` (role) and ``replica``."""
    return any(isinstance(n, dict) and n.get("pool") is not None for n in plan.get("nodes") or [])


def node_indices(plan: Dict[str, Any]) -> List[int]:
    """The nodes this host runs: ``plan["node_indices"]`` (a pool job may put several replicas on
    one host), else ``[plan["node_index"]]``."""
    got = plan.get("node_indices")
    if got:
        return sorted(int(i) for i in got)
    return [int(plan["node_index"])]


def check_pools(plan: Dict[str, Any]) -> None:
    """A pool plan the agent can use, or ValueError saying what is wrong with which node."""
    nodes = _nodes(plan)
    seen = {}  # type: Dict[Tuple[str, int], int]
    ports = {}  # type: Dict[Tuple[str, int], int]
    primaries = []
    for i, n in enumerate(nodes):
        role = n.get("pool")
        if role not in VERTEX_POOLS:
            raise ValueError("plan nodes[%d].pool: expected one of %s, got %r"
                             % (i, ", ".join(POOL_ORDER), role))
        rep = n.get("replica")
        if not isinstance(rep, int) or isinstance(rep, bool) or rep < 0:
            raise ValueError("plan nodes[%d].replica: expected an integer >= 0, got %r" % (i, rep))
        if (role, rep) in seen:
            raise ValueError("plan nodes[%d]: %s %d is nodes[%d] already" % (i, role, rep, seen[(role, rep)]))
        seen[(role, rep)] = i
        port = n.get("port")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise ValueError("plan nodes[%d].port: expected a port number, got %r" % (i, port))
        key = (str(n.get("address")), port)
        if key in ports:
            raise ValueError("plan nodes[%d].port: %s:%d is nodes[%d]'s already"
                             % (i, key[0], port, ports[key]))
        ports[key] = i
        if role == "primary":
            primaries.append(i)
    if len(primaries) != 1:
        raise ValueError("plan: expected exactly one primary node, got %d" % len(primaries))
    if "parameter_server" in (n["pool"] for n in nodes) and "reduction_server" in (n["pool"] for n in nodes):
        raise ValueError("plan: parameter_server and reduction_server nodes both (both are workerpool2)")


def _pool_nodes(plan: Dict[str, Any]) -> Dict[str, List[int]]:
    """role -> indices of its nodes, by replica index."""
    out = {}  # type: Dict[str, List[int]]
    nodes = _nodes(plan)
    for i, n in enumerate(nodes):
        out.setdefault(str(n["pool"]), []).append(i)
    for members in out.values():
        members.sort(key=lambda i: int(nodes[i]["replica"]))
    return out


def replica_name(node: Dict[str, Any]) -> str:
    return "%s-%d" % (node["pool"], int(node["replica"]))


def replica_dir(job_dir: str, node: Dict[str, Any]) -> str:
    """Where one replica's own files go: ``<job_dir>/replicas/<role>-<replica>``."""
    return os.path.join(os.path.abspath(job_dir), REPLICAS_DIR, replica_name(node))


def algo_names(plan: Dict[str, Any]) -> List[str]:
    """SageMaker's host names: ``algo-1``... one per node in plan order."""
    return ["algo-%d" % (k + 1) for k in range(len(_nodes(plan)))]


def node_command(plan: Dict[str, Any], node_index: int) -> List[str]:
    """The command of a node: its pool's (``nodes[i]["command"]``), else the job's."""
    own = _node(plan, node_index).get("command")
    return [str(a) for a in (own or plan.get("command") or [])]


def _endpoint(node: Dict[str, Any], default_port: int) -> str:
    port = node.get("port")
    return _host_port(str(node["address"]), int(port) if port is not None else default_port)


def vertex_cluster(plan: Dict[str, Any]) -> Dict[str, List[str]]:
    """CLUSTER_SPEC's ``cluster`` of a pool job: workerpool0..3, each replica's own port."""
    nodes = _nodes(plan)
    by_pool = _pool_nodes(plan)
    out = {name: [] for name in VERTEX_POOL_NAMES}  # type: Dict[str, List[str]]
    for role in POOL_ORDER:
        for i in by_pool.get(role, []):
            out[VERTEX_POOLS[role]].append(_endpoint(nodes[i], int(plan["master_port"])))
    return out


def tf_cluster(plan: Dict[str, Any]) -> Dict[str, List[str]]:
    """TF_CONFIG's ``cluster`` of a pool job: chief, worker, ps (only present ones; evaluators and
    reduction servers are never in it)."""
    nodes = _nodes(plan)
    by_pool = _pool_nodes(plan)
    out = {}  # type: Dict[str, List[str]]
    for key, role in TF_CLUSTER_KEYS:
        if by_pool.get(role):
            out[key] = [_endpoint(nodes[i], int(plan["master_port"])) for i in by_pool[role]]
    return out


def _in_world(node: Dict[str, Any]) -> bool:
    return node.get("pool") is None or node.get("pool") in WORLD_POOLS


def torch_world_size(plan: Dict[str, Any]) -> int:
    """Processes in torch's world: every node's, or a pool job's primary and workers only."""
    return sum(int(n["slots"]) for n in _nodes(plan) if _in_world(n))


def torch_node_rank(plan: Dict[str, Any], node_index: int) -> int:
    """NODE_RANK: the node index, or in a pool job 0 for the primary and 1 + index for a worker."""
    node = _node(plan, node_index)
    if node.get("pool") is None:
        return node_index
    if node["pool"] == "primary":
        return 0
    if node["pool"] == "worker":
        return 1 + int(node["replica"])
    raise ValueError("%s is not in torch's world" % replica_name(node))


def _torch_rank(plan: Dict[str, Any], node_index: int, local_rank: int) -> int:
    """A world member's torch rank: the slots of the world's nodes before it, plus local rank."""
    nodes = _nodes(plan)
    return sum(int(n["slots"]) for n in nodes[:node_index] if _in_world(n)) + local_rank


# -- processing jobs --------------------------------------------------------------------------

PROCESSING_DIR = "processing"
_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def _io_name(kind: str, i: int, entry: Dict[str, Any]) -> str:
    name = str(entry.get("name") or "")
    if not _NAME_RE.match(name) or name in (".", ".."):
        raise ValueError("plan processing.%s[%d].name: expected 1-64 of [A-Za-z0-9._-], got %r"
                         % (kind, i, entry.get("name")))
    return name


def _safe_relpath(rel: str) -> bool:
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def _clear_input(path: str) -> None:
    """Remove an input left by an earlier attempt: a link, or a tree of links we made."""
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)  # links inside are removed, never followed


def processing_tree(plan: Dict[str, Any], node_index: int, job_dir: str) -> str:
    """SageMaker Processing's tree in ``<job_dir>/processing``: ``input/<name>`` (FullyReplicated:
    a link to the source dir; ShardedByKey: a directory of links to this host's shard, each at its
    relative path), empty ``output/<name>`` dirs, and ``config/resourceconfig.json`` with only
    ``current_host`` and ``hosts``. Raises ValueError naming what is missing."""
    nodes = _nodes(plan)
    _node(plan, node_index)
    hosts = [str(n["host"]) for n in nodes]
    current = hosts[node_index]
    spec = plan.get("processing") or {}
    root = os.path.join(os.path.abspath(job_dir), PROCESSING_DIR)
    input_root = os.path.join(root, "input")
    output_root = os.path.join(root, "output")
    config_dir = os.path.join(root, "config")
    for d in (input_root, output_root, config_dir):
        os.makedirs(d, exist_ok=True)
    for i, entry in enumerate(spec.get("inputs") or []):
        name = _io_name("inputs", i, entry)
        source = os.path.expanduser(str(entry.get("source") or ""))
        if not source:
            raise ValueError("plan processing.inputs[%d].source: missing (input %r)" % (i, name))
        if not os.path.isabs(source):
            source = os.path.normpath(os.path.join(plan.get("workdir") or os.getcwd(), source))
        if not os.path.isdir(source):
            raise ValueError("processing input %r: source %s is not a directory on %s"
                             % (name, source, current))
        dist = str(entry.get("distribution") or "FullyReplicated")
        path = os.path.join(input_root, name)
        _clear_input(path)
        if dist == "FullyReplicated":
            os.symlink(source, path)
        elif dist == "ShardedByKey":
            os.makedirs(path)
            for rel in entry.get("files") or []:
                rel = str(rel)
                if not _safe_relpath(rel):
                    raise ValueError("processing input %r: listed file %r is not a relative path "
                                     "inside its source" % (name, rel))
                src = os.path.join(source, rel)
                if not os.path.isfile(src):
                    raise ValueError("processing input %r: listed file %r is missing under %s on %s"
                                     % (name, rel, source, current))
                link = os.path.join(path, rel)
                os.makedirs(os.path.dirname(link), exist_ok=True)
                os.symlink(src, link)
        else:
            raise ValueError("plan processing.inputs[%d].distribution: expected FullyReplicated or "
                             "ShardedByKey, got %r" % (i, dist))
    for i, entry in enumerate(spec.get("outputs") or []):
        os.makedirs(os.path.join(output_root, _io_name("outputs", i, entry)), exist_ok=True)
    write_json_atomic(os.path.join(config_dir, "resourceconfig.json"),
                      {"current_host": current, "hosts": hosts})
    return root


def processing_env(plan: Dict[str, Any], node_index: int, job_dir: str) -> Dict[str, str]:
    """A processing job's node: its tree (:func:`processing_tree`) and the usual RIGDECK_* (no
    SageMaker training tree, no CLUSTER_SPEC/TF_CONFIG)."""
    nodes = _nodes(plan)
    node = _node(plan, node_index)
    job_dir = os.path.abspath(job_dir)
    job_id = str(plan["job_id"])
    hosts = [str(n["host"]) for n in nodes]
    if len(set(hosts)) != len(hosts):
        raise ValueError("host names repeat in the plan: %s" % hosts)
    gpus = _gpus(node)
    metrics_dir = os.path.join(job_dir, "metrics")
    os.makedirs(metrics_dir, exist_ok=True)
    root = processing_tree(plan, node_index, job_dir)
    env = {
        "RIGDECK_JOB_ID": job_id,
        "RIGDECK_JOB_NAME": str(plan.get("name") or job_id),
        "RIGDECK_JOB_DIR": job_dir,
        "RIGDECK_JOB_KIND": "processing",
        "RIGDECK_PROCESSING_DIR": root,
        "RIGDECK_HOSTS": json.dumps(hosts),
        "RIGDECK_HOST_ADDRS": json.dumps([str(n["address"]) for n in nodes]),
        "RIGDECK_CURRENT_HOST": hosts[node_index],
        "RIGDECK_NODE_RANK": str(node_index),
        "RIGDECK_NUM_NODES": str(len(nodes)),
        "RIGDECK_WORLD_SIZE": str(world_size(plan)),
        "RIGDECK_LOCAL_WORLD_SIZE": str(int(node["slots"])),
        "RIGDECK_MASTER_ADDR": str(plan["master_addr"]),
        "RIGDECK_MASTER_PORT": str(int(plan["master_port"])),
        "RIGDECK_GPUS": ",".join(str(g) for g in gpus),
        "RIGDECK_METRICS_DIR": metrics_dir,
        "RIGDECK_RESTART_COUNT": str(int(plan.get("restart_count") or 0)),
        "RIGDECK_LAUNCHER": str(plan.get("launcher") or "direct"),
    }  # type: Dict[str, str]
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    for k, v in (plan.get("env") or {}).items():
        if str(k) == "RIGDECK_JOB_ID":
            continue
        env[str(k)] = _env_str(v)
    write_json_atomic(os.path.join(job_dir, NODE_ENV_FILE), env)
    return env


# -- the node's environment -------------------------------------------------------------------


def node_env(plan: Dict[str, Any], node_index: int, job_dir: str,
             iface: Optional[str]) -> Dict[str, str]:
    """Write the cluster files for this node into ``job_dir`` and return the environment common to
    all ranks on this node (everything except per-rank variables: see :func:`rank_env`).

    A pool job's node is one replica: its files go to ``<job_dir>/replicas/<role>-<replica>/``
    (:func:`replica_dir`); a processing job gets :func:`processing_env` instead."""
    if plan.get("kind") == "processing":
        return processing_env(plan, node_index, job_dir)
    nodes = _nodes(plan)
    node = _node(plan, node_index)
    pooled = is_pool_plan(plan)
    job_dir = os.path.abspath(job_dir)
    job_id = str(plan["job_id"])
    hosts = [str(n["host"]) for n in nodes]
    addrs = [str(n["address"]) for n in nodes]
    current = hosts[node_index]
    if pooled:
        check_pools(plan)
        files_dir = replica_dir(job_dir, node)
        role = str(node["pool"])
        in_world = role in WORLD_POOLS
    else:
        if len(set(hosts)) != len(hosts):
            raise ValueError("host names repeat in the plan: %s" % hosts)
        files_dir = job_dir
        role = None
        in_world = True
    world = world_size(plan)
    slots = int(node["slots"])
    gpus = _gpus(node)
    master_addr = str(plan["master_addr"])
    master_port = int(plan["master_port"])
    ckpt_dir, ckpt_owner = _checkpoint(plan)
    cpus = node.get("cpus")
    num_cpus = int(cpus) if cpus is not None else (os.cpu_count() or 1)
    instance_type = str(node.get("instance_type") or "local")
    command = node_command(plan, node_index)

    # ---- the SageMaker view of the cluster: one homogeneous group, or one group per pool ----
    if pooled:
        sm_hosts = algo_names(plan)
        by_pool = _pool_nodes(plan)
        groups = []  # type: List[Dict[str, Any]]
        for pool_role in POOL_ORDER:
            members = by_pool.get(pool_role)
            if members:
                groups.append({"instance_group_name": pool_role,
                               "instance_type": str(nodes[members[0]].get("instance_type") or "local"),
                               "hosts": [sm_hosts[i] for i in members]})
        current_group = str(role)
        group_hosts = [sm_hosts[i] for i in by_pool[current_group]]
        dist_groups = [g["instance_group_name"] for g in groups
                       if g["instance_group_name"] in WORLD_POOLS]
        dist_hosts = [h for g in groups if g["instance_group_name"] in WORLD_POOLS
                      for h in g["hosts"]]
        is_hetero = True
    else:
        sm_hosts = list(hosts)
        groups = [{"instance_group_name": SAGEMAKER_GROUP, "instance_type": instance_type,
                   "hosts": list(hosts)}]
        current_group = SAGEMAKER_GROUP
        group_hosts = list(hosts)
        dist_groups = [SAGEMAKER_GROUP]
        dist_hosts = list(hosts)
        is_hetero = False
    sm_current = sm_hosts[node_index]
    groups_dict = {str(g["instance_group_name"]): g for g in groups}

    # ---- directories and files --------------------------------------------------------------
    os.makedirs(job_dir, exist_ok=True)
    base = os.path.join(files_dir, "sagemaker")
    input_dir = os.path.join(base, "input")
    config_dir = os.path.join(input_dir, "config")
    data_dir = os.path.join(input_dir, "data")
    model_dir = os.path.join(base, "model")
    output_dir = os.path.join(base, "output")
    output_data_dir = os.path.join(output_dir, "data")
    intermediate_dir = os.path.join(output_dir, "intermediate")
    sm_ckpt = os.path.join(base, "checkpoints")
    metrics_dir = os.path.join(job_dir, "metrics")
    tensorboard_dir = os.path.join(job_dir, "tensorboard")
    for d in (config_dir, data_dir, model_dir, output_data_dir, intermediate_dir, metrics_dir,
              tensorboard_dir):
        os.makedirs(d, exist_ok=True)
    if ckpt_dir:
        os.makedirs(ckpt_dir, exist_ok=True)
        _symlink_atomic(ckpt_dir, sm_ckpt)
        checkpoint_dir = ckpt_dir
    else:
        _ensure_dir(sm_ckpt)
        checkpoint_dir = sm_ckpt
    seed = plan.get("seed_checkpoint")
    if seed and not int(plan.get("restart_count") or 0):
        # A pipeline's continue_from: the earlier step's checkpoints (a tree staged on this
        # host), copied before the first attempt; a file the dir already has is kept.
        from agent.artifacts import seed_checkpoint

        seed_checkpoint(str(seed), checkpoint_dir)

    resource_config = {
        "current_host": sm_current,
        "current_instance_type": instance_type,
        "current_group_name": current_group,
        "hosts": list(sm_hosts),
        "instance_groups": groups,
        "network_interface_name": iface or DEFAULT_INTERFACE,
    }
    raw_hps = dict(plan.get("hyperparameters") or {})
    if pooled:  # as the SageMaker SDK passes a heterogeneous cluster's distribution groups
        raw_hps.setdefault("sagemaker_distribution_instance_groups", list(dist_groups))
    encoded_hps = _encode_hyperparameters(raw_hps)
    all_hps = _decode_hyperparameters(encoded_hps)
    hps = {k: v for k, v in all_hps.items() if not k.startswith("sagemaker_")}
    framework_params = {k: v for k, v in all_hps.items() if k.startswith("sagemaker_")}

    channels = _channels(plan)
    input_data_config = {name: cfg for name, (cfg, _src) in channels.items()}
    channel_dirs = {}  # type: Dict[str, str]
    for name, (_cfg, src) in channels.items():
        path = os.path.join(data_dir, name)
        if src:
            _symlink_atomic(src, path)
        else:
            _ensure_dir(path)
        channel_dirs[name] = path

    write_json_atomic(os.path.join(config_dir, "resourceconfig.json"), resource_config)
    write_json_atomic(os.path.join(config_dir, "hyperparameters.json"), encoded_hps)
    write_json_atomic(os.path.join(config_dir, "inputdataconfig.json"), input_data_config)
    hostfile = os.path.join(files_dir, HOSTFILE)
    _write_text_atomic(hostfile, mpi_hostfile(plan))

    # ---- SageMaker: SM_* as the toolkit's Environment.to_env_vars() ---------------------------
    entry_point, module_name = _script(command)
    module_dir = str(plan.get("workdir") or "")
    training_env = {
        "additional_framework_parameters": framework_params,
        "channel_input_dirs": channel_dirs,
        "current_host": sm_current,
        "current_instance_group": current_group,
        "current_instance_group_hosts": list(group_hosts),
        "current_instance_type": instance_type,
        "distribution_hosts": list(dist_hosts),
        "distribution_instance_groups": list(dist_groups),
        "framework_module": None,
        "hosts": list(sm_hosts),
        "hyperparameters": hps,
        "input_config_dir": config_dir,
        "input_data_config": input_data_config,
        "input_dir": input_dir,
        "instance_groups": list(groups_dict),
        "instance_groups_dict": groups_dict,
        "is_hetero": is_hetero,
        "is_master": node_index == 0,
        "is_modelparallel_enabled": False,
        "is_smddpmprun_installed": False,
        "job_name": job_id,
        "log_level": LOG_LEVEL,
        "master_hostname": sm_hosts[0],
        "model_dir": model_dir,
        "module_dir": module_dir,
        "module_name": module_name,
        "network_interface_name": iface or DEFAULT_INTERFACE,
        "num_cpus": num_cpus,
        "num_gpus": len(gpus),
        "num_neurons": 0,
        "output_data_dir": output_data_dir,
        "output_dir": output_dir,
        "output_intermediate_dir": intermediate_dir,
        "resource_config": resource_config,
        "user_entry_point": entry_point,
    }
    sm = {
        "hosts": list(sm_hosts),
        "network_interface_name": iface or DEFAULT_INTERFACE,
        "hps": hps,
        "user_entry_point": entry_point,
        "framework_params": framework_params,
        "resource_config": resource_config,
        "input_data_config": input_data_config,
        "output_data_dir": output_data_dir,
        "channels": sorted(channel_dirs),
        "current_host": sm_current,
        "current_instance_type": instance_type,
        "current_instance_group": current_group,
        "current_instance_group_hosts": list(group_hosts),
        "instance_groups": list(groups_dict),
        "instance_groups_dict": groups_dict,
        "distribution_instance_groups": list(dist_groups),
        "is_hetero": is_hetero,
        "module_name": module_name,
        "log_level": LOG_LEVEL,
        "framework_module": None,
        "input_dir": input_dir,
        "input_config_dir": config_dir,
        "output_dir": output_dir,
        "num_cpus": num_cpus,
        "num_gpus": len(gpus),
        "num_neurons": 0,
        "model_dir": model_dir,
        "module_dir": module_dir,
        "training_env": training_env,
        "user_args": user_args(hps),
        "output_intermediate_dir": intermediate_dir,
    }  # type: Dict[str, Any]
    if pooled:
        sm["distribution_hosts"] = list(dist_hosts)
        sm["master_hostname"] = sm_hosts[0]
    for name, path in channel_dirs.items():
        sm["channel_%s" % name] = path
    for k, v in hps.items():
        sm["hp_%s" % k] = v

    env = {}  # type: Dict[str, str]
    for k, v in sm.items():
        env["SM_%s" % k.upper()] = _sm_value(v)
    env["SAGEMAKER_BASE_DIR"] = base
    env["TRAINING_JOB_NAME"] = job_id

    # ---- rigdeck -----------------------------------------------------------------------------
    env.update({
        "RIGDECK_JOB_ID": job_id,
        "RIGDECK_JOB_NAME": str(plan.get("name") or job_id),
        "RIGDECK_JOB_DIR": job_dir,
        "RIGDECK_HOSTS": json.dumps(hosts),
        "RIGDECK_HOST_ADDRS": json.dumps(addrs),
        "RIGDECK_CURRENT_HOST": current,
        "RIGDECK_NODE_RANK": str(node_index),
        "RIGDECK_NUM_NODES": str(len(nodes)),
        "RIGDECK_WORLD_SIZE": str(world),
        "RIGDECK_LOCAL_WORLD_SIZE": str(slots),
        "RIGDECK_MASTER_ADDR": master_addr,
        "RIGDECK_MASTER_PORT": str(master_port),
        "RIGDECK_GPUS": ",".join(str(g) for g in gpus),
        "RIGDECK_METRICS_DIR": metrics_dir,
        "RIGDECK_CHECKPOINT_DIR": checkpoint_dir,
        "RIGDECK_CHECKPOINT_OWNER": ckpt_owner,
        "RIGDECK_RESTART_COUNT": str(int(plan.get("restart_count") or 0)),
        "RIGDECK_LAUNCHER": str(plan.get("launcher") or "direct"),
        "RIGDECK_HOSTFILE": hostfile,
    })
    if pooled:
        env.update({
            "RIGDECK_POOL": str(role),
            "RIGDECK_POOL_REPLICA": str(int(node["replica"])),
            "RIGDECK_IN_WORLD": "1" if in_world else "0",
            "RIGDECK_REPLICA_DIR": files_dir,
        })
    trial = _trial(plan)
    if trial is not None:
        env["RIGDECK_TRIAL"] = trial
        if plan.get("sweep_id"):
            env["RIGDECK_SWEEP_ID"] = str(plan["sweep_id"])

    # ---- Vertex AI ---------------------------------------------------------------------------
    job_desc = _vertex_job(plan, nodes)
    if pooled:
        cluster_spec = {
            "cluster": vertex_cluster(plan),
            "environment": "cloud",
            "task": _vertex_task(VERTEX_POOLS[str(role)], int(node["replica"]), trial),
            "job": job_desc,
        }  # type: Dict[str, Any]
        env["CLUSTER_SPEC"] = json.dumps(cluster_spec, separators=(",", ":"))
        tf_type = TF_TASK_TYPES.get(str(role))
        if len(nodes) > 1 and tf_type is not None:
            tf_config = {
                "cluster": tf_cluster(plan),
                "task": _vertex_task(tf_type, int(node["replica"]), trial),
                "environment": "cloud",
                "job": job_desc,
            }
            env["TF_CONFIG"] = json.dumps(tf_config, separators=(",", ":"))
    else:
        endpoints = [_host_port(a, master_port) for a in addrs]
        cluster_spec = {
            "cluster": {"workerpool0": endpoints[:1], "workerpool1": endpoints[1:],
                        "workerpool2": [], "workerpool3": []},
            "environment": "cloud",
            "task": _vertex_task("workerpool0" if node_index == 0 else "workerpool1",
                                 0 if node_index == 0 else node_index - 1, trial),
            "job": job_desc,
        }
        env["CLUSTER_SPEC"] = json.dumps(cluster_spec, separators=(",", ":"))
        if len(nodes) > 1:
            tf_config = {
                "cluster": {"chief": endpoints[:1], "worker": endpoints[1:]},
                "task": _vertex_task("chief" if node_index == 0 else "worker",
                                     0 if node_index == 0 else node_index - 1, trial),
                "environment": "cloud",
                "job": job_desc,
            }
            env["TF_CONFIG"] = json.dumps(tf_config, separators=(",", ":"))
    env["AIP_MODEL_DIR"] = model_dir
    env["AIP_CHECKPOINT_DIR"] = checkpoint_dir
    env["AIP_TENSORBOARD_LOG_DIR"] = tensorboard_dir
    # cloudml-hypertune reports here (it rewrites the whole file on each report); every job gets
    # it, so a script that reports through hypertune works in and out of a sweep alike.
    env["CLOUD_ML_HP_METRIC_FILE"] = os.path.join(metrics_dir, HYPERTUNE_FILE)
    if trial is not None:
        env["CLOUD_ML_TRIAL_ID"] = trial

    # ---- torch: the world is every node, or a pool job's primary + workers only ----------------
    if in_world:
        env.update({
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "WORLD_SIZE": str(torch_world_size(plan)),
            "LOCAL_WORLD_SIZE": str(slots),
            "NODE_RANK": str(torch_node_rank(plan, node_index)),
        })
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    if iface:
        env["NCCL_SOCKET_IFNAME"] = iface
        env["GLOO_SOCKET_IFNAME"] = iface

    # ---- the user's own table on top (a pool's over the job's; the job id is the tag that finds
    # its processes) ------------------------------------------------------------------------------
    user = dict(plan.get("env") or {})
    if pooled:
        user.update(node.get("env") or {})
    for k, v in user.items():
        if str(k) == "RIGDECK_JOB_ID":
            continue
        env[str(k)] = _env_str(v)

    write_json_atomic(os.path.join(files_dir, NODE_ENV_FILE), env)
    return env


def _trial(plan: Dict[str, Any]) -> Optional[str]:
    """The sweep trial this job is (``plan["trial"]``, a string counting from "1"), or None."""
    trial = plan.get("trial")
    return None if trial is None or trial == "" else str(trial)


def _vertex_task(kind: str, index: int, trial: Optional[str]) -> Dict[str, Any]:
    """Vertex's ``task`` object; ``trial`` is there only in hyperparameter tuning."""
    task = {"type": kind, "index": index}  # type: Dict[str, Any]
    if trial is not None:
        task["trial"] = trial
    return task


def _vertex_job(plan: Dict[str, Any], nodes: List[Dict[str, Any]]) -> Dict[str, Any]:
    """A small CustomJobSpec-like description of the job (Vertex puts the job's spec here). A pool
    job's ``worker_pool_specs`` has all four entries, ``{}`` for an absent pool."""

    def pool(node: Dict[str, Any], count: int, command: List[Any]) -> Dict[str, Any]:
        return {"machine_spec": {"machine_type": str(node.get("instance_type") or "local"),
                                 "accelerator_count": len(_gpus(node))},
                "replica_count": count,
                "container_spec": {"command": [str(a) for a in command]}}

    job_command = list(plan.get("command") or [])
    if is_pool_plan(plan):
        by_pool = _pool_nodes(plan)
        specs = []  # type: List[Dict[str, Any]]
        for name in VERTEX_POOL_NAMES:
            members = [i for role in POOL_ORDER if VERTEX_POOLS[role] == name
                       for i in by_pool.get(role, [])]
            if not members:
                specs.append({})
                continue
            first = nodes[members[0]]
            specs.append(pool(first, len(members), first.get("command") or job_command))
        pools = specs
    else:
        pools = [pool(nodes[0], 1, job_command)]
        if len(nodes) > 1:
            pools.append(pool(nodes[1], len(nodes) - 1, job_command))
    return {"job_id": str(plan["job_id"]), "display_name": str(plan.get("name") or plan["job_id"]),
            "worker_pool_specs": pools}


def rank_env(plan: Dict[str, Any], node_index: int, local_rank: int) -> Dict[str, str]:
    """Per-rank variables for the ``direct`` launcher: RANK, LOCAL_RANK, RIGDECK_RANK,
    RIGDECK_LOCAL_RANK, and CUDA_VISIBLE_DEVICES = that rank's one physical GPU (when the node has
    GPUs)."""
    ranks = global_ranks(plan, node_index)
    if not 0 <= local_rank < len(ranks):
        raise ValueError("local_rank %d outside 0..%d" % (local_rank, len(ranks) - 1))
    rank = ranks[local_rank]
    node = _node(plan, node_index)
    env = {"RIGDECK_RANK": str(rank), "RIGDECK_LOCAL_RANK": str(local_rank)}
    if _in_world(node):  # a pool job's other replicas are not in torch's world: no RANK for them
        env["RANK"] = str(_torch_rank(plan, node_index, local_rank))
        env["LOCAL_RANK"] = str(local_rank)
    gpus = _gpus(node)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = str(gpus[local_rank % len(gpus)])
    return env


def load_node_env(job_dir: str) -> Optional[Dict[str, str]]:
    """The environment :func:`node_env` wrote for this host into ``job_dir`` (None if absent).

    For ranks that another host's launcher started here (mpirun exports the primary's values of
    host-specific variables such as RIGDECK_CURRENT_HOST, SM_CURRENT_HOST, NODE_RANK): the rank
    wrapper can lay these over its environment."""
    try:
        with open(os.path.join(job_dir, NODE_ENV_FILE)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    return {str(k): str(v) for k, v in data.items()}


# -- MPI ----------------------------------------------------------------------------------------


def mpi_hostfile(plan: Dict[str, Any]) -> str:
    """Open MPI hostfile: one ``<address> slots=<n>`` line per node, in rank order (a pool job:
    the primary and the workers, torch's world)."""
    return "".join("%s slots=%d\n" % (n["address"], int(n["slots"])) for n in _nodes(plan)
                   if _in_world(n))


_MPI_MAJOR = {}  # type: Dict[str, Optional[int]]


def mpirun_major_version(mpirun: str = "mpirun") -> Optional[int]:
    """Open MPI's major version from ``mpirun --version`` (None when unknown)."""
    if mpirun in _MPI_MAJOR:
        return _MPI_MAJOR[mpirun]
    major = None  # type: Optional[int]
    try:
        out = subprocess.run([mpirun, "--version"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, universal_newlines=True, timeout=10).stdout
        m = re.search(r"\(Open MPI\)\s+(\d+)\.", out) or re.search(r"Open MPI.*?(\d+)\.\d+", out)
        if m:
            major = int(m.group(1))
    except (OSError, subprocess.SubprocessError):
        pass
    _MPI_MAJOR[mpirun] = major
    return major


def mpirun_argv(plan: Dict[str, Any], env_names: List[str], iface: Optional[str], hostfile: str,
                mpirun: str = "mpirun", version: Optional[int] = None) -> List[str]:
    """Open MPI's mpirun command for the primary, in the spirit of SageMaker's toolkit (``mpi.py``).

    ``--hostfile H -np WORLD --allow-run-as-root --tag-output -bind-to none -map-by slot``, the
    toolkit's MCA settings (the interface ones only when ``iface`` is known), ``-x NAME`` for every
    name in ``env_names``, then ``plan["mpi"]["custom_options"]``, then ``plan["command"]`` (always
    the tail of the list). Open MPI 5 (PRRTE) gets its own spelling; ``version`` (the major
    version) is asked of ``mpirun --version`` when not given. An argument list, for no shell."""
    if version is None:
        version = mpirun_major_version(mpirun) or 4
    argv = [mpirun, "--hostfile", hostfile, "-np", str(world_size(plan)), "--allow-run-as-root",
            "--tag-output"]
    if version >= 5:
        argv += ["--bind-to", "none", "--map-by", "slot"]
        if iface:
            argv += ["--mca", "btl_tcp_if_include", iface, "--prtemca", "oob_tcp_if_include", iface]
        argv += ["--prtemca", "plm_ssh_no_tree_spawn", "1", "--mca", "pml", "ob1"]
        # PRRTE ends the whole job when a process exits non-zero by default.
    else:
        argv += ["-bind-to", "none", "-map-by", "slot"]
        if iface:
            argv += ["-mca", "btl_tcp_if_include", iface, "-mca", "oob_tcp_if_include", iface]
        argv += ["-mca", "plm_rsh_no_tree_spawn", "1", "-mca", "pml", "ob1",
                 "-mca", "btl", "^openib", "-mca", "orte_abort_on_non_zero_status", "1"]
    seen = set()
    for name in env_names:
        if name and name not in seen:
            seen.add(name)
            argv += ["-x", name]
    argv += [str(o) for o in ((plan.get("mpi") or {}).get("custom_options") or [])]
    argv += [str(a) for a in (plan.get("command") or [])]
    return argv


# -- network interface ------------------------------------------------------------------------


def _run(argv: List[str]) -> Optional[str]:
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           universal_newlines=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout if p.returncode == 0 else None


def _ip_tool() -> Optional[str]:
    for cand in (shutil.which("ip"), "/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def _local_addresses() -> Dict[str, str]:
    """address (normalized) -> interface name, for every address on this host's interfaces."""
    out = {}  # type: Dict[str, str]
    ip = _ip_tool()
    text = _run([ip, "-o", "addr", "show"]) if ip else None
    if text:
        for line in text.splitlines():
            parts = line.split()
            for fam in ("inet", "inet6"):
                if fam in parts and len(parts) > parts.index(fam) + 1:
                    addr = parts[parts.index(fam) + 1].split("/")[0].split("%")[0]
                    name = parts[1].split("@")[0]
                    out.setdefault(addr, name)
        if out:
            return out
    # No `ip`: IPv4 through ioctl(SIOCGIFADDR), IPv6 from /proc/net/if_inet6.
    try:
        import fcntl

        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            for _idx, name in socket.if_nameindex():
                try:
                    req = struct.pack("256s", name.encode()[:15])
                    res = fcntl.ioctl(s.fileno(), 0x8915, req)  # SIOCGIFADDR
                    out.setdefault(socket.inet_ntoa(res[20:24]), name)
                except OSError:
                    pass
        finally:
            s.close()
    except (ImportError, OSError):
        pass
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6:
                    raw = parts[0]
                    addr = str(ipaddress.IPv6Address(int(raw, 16)))
                    out.setdefault(addr, parts[5])
    except (OSError, ValueError):
        pass
    return out


def _proc_route_iface(addr: str, path: str = "/proc/net/route") -> Optional[str]:
    """The interface of the most specific IPv4 route in /proc/net/route that covers ``addr``
    (the default route when nothing narrower does)."""
    try:
        target = struct.unpack("<I", socket.inet_aton(addr))[0]
    except OSError:
        target = None
    best = None  # type: Optional[Tuple[int, int, str]]
    try:
        with open(path) as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        p = line.split()
        if len(p) < 8:
            continue
        try:
            dest, flags, metric, mask = int(p[1], 16), int(p[3], 16), int(p[6]), int(p[7], 16)
        except ValueError:
            continue
        if not flags & 0x1:  # RTF_UP
            continue
        if target is None:
            if dest != 0 or mask != 0:
                continue
        elif target & mask != dest:
            continue
        prefix = bin(mask).count("1")
        key = (prefix, -metric, p[0])
        if best is None or key[:2] > best[:2]:
            best = key
    return best[2] if best else None


def route_source(peer: str) -> Optional[str]:
    """The address this host's packets to ``peer`` leave from (``ip route get``'s ``src``): the
    one ``peer`` can reach this host at, where a second interface (``docker0``, a VPN) may hold
    addresses that sort first. A name is resolved here, as ``peer``'s own hosts would. None when
    there is no route. Nothing is sent: connecting a UDP socket only asks the kernel's routing."""
    addr = str(peer).strip().strip("[]")
    try:
        infos = socket.getaddrinfo(addr, 9, 0, socket.SOCK_DGRAM)
    except OSError:
        return None
    for family, _, _, _, sockaddr in infos:
        s = socket.socket(family, socket.SOCK_DGRAM)
        try:
            s.connect(sockaddr)
            return str(s.getsockname()[0]).split("%")[0]
        except OSError:
            continue
        finally:
            s.close()
    return None


def route_interface(addr: str) -> Optional[str]:
    """The network interface this host uses to reach ``addr`` (for NCCL_SOCKET_IFNAME and
    GLOO_SOCKET_IFNAME): the interface that owns ``addr`` if it is one of ours, else the ``dev`` of
    ``ip -o route get <addr>``; else the most specific route (the default one at worst) in
    /proc/net/route; None if unknown."""
    addr = str(addr).strip().strip("[]")
    try:
        norm = str(ipaddress.ip_address(addr.split("%")[0]))
    except ValueError:
        try:  # a name: the address it resolves to
            norm = str(socket.getaddrinfo(addr, None)[0][4][0]).split("%")[0]
        except (OSError, IndexError):
            return None
    owned = _local_addresses().get(norm)
    if owned:
        return owned
    ip = _ip_tool()
    if ip:
        text = _run([ip, "-o", "route", "get", norm])
        if text:
            parts = text.split()
            if "dev" in parts and len(parts) > parts.index("dev") + 1:
                return parts[parts.index("dev") + 1]
    if ":" not in norm:
        return _proc_route_iface(norm)
    return None
