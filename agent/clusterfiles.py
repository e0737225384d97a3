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
``tests/probe_rank.py`` checks that from inside real ranks. What differs by kind of job (plain,
worker pools, processing, a sweep's trial, a pipeline's step) lives in that kind's module under
``agent/kinds/``: the plan's shape gives this node's :class:`~agent.kinds.base.Layout`, from which
every view here is written, and each kind of the plan adds its own variables and files.

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
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from agent import kinds
from agent.kinds.base import NODE_ENV_FILE, Kind, Layout, rigdeck_env, user_env, world_size, write_json_atomic
from agent.kinds.base import node_gpus as _gpus
from agent.kinds.base import plan_node as _node
from agent.kinds.base import plan_nodes as _nodes
from agent.kinds.pools import VERTEX_POOLS as VERTEX_POOLS  # read here by the tests and the job host
from agent.kinds.pools import is_pool_plan as is_pool_plan

DEFAULT_INTERFACE = "eth0"
LOG_LEVEL = 20  # logging.INFO, the toolkit's default
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


# -- placement --------------------------------------------------------------------------------


def global_ranks(plan: Dict[str, Any], node_index: int) -> List[int]:
    """The global ranks on node ``node_index``: slots of the nodes before it, plus local rank."""
    nodes = _nodes(plan)
    _node(plan, node_index)
    first = sum(int(n["slots"]) for n in nodes[:node_index])
    return list(range(first, first + int(nodes[node_index]["slots"])))


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


def channel_sources(plan: Dict[str, Any]) -> List[str]:
    """The host paths the job's channels link to (``input/data/<ch>``): a ``[container]`` job
    mounts them (ValueError: a bad channel name, as the start itself would find)."""
    return [src for _cfg, src in _channels(plan).values() if src]


# -- kinds: which nodes a host runs, and torch's world ----------------------------------------------


def node_indices(plan: Dict[str, Any]) -> List[int]:
    """The nodes this host runs: ``plan["node_indices"]`` (a pool job may put several replicas on
    one host), else ``[plan["node_index"]]``."""
    got = plan.get("node_indices")
    if got:
        return sorted(int(i) for i in got)
    return [int(plan["node_index"])]


def node_command(plan: Dict[str, Any], node_index: int) -> List[str]:
    """The command of a node: its pool's (``nodes[i]["command"]``), else the job's."""
    own = _node(plan, node_index).get("command")
    return [str(a) for a in (own or plan.get("command") or [])]


def torch_world_size(plan: Dict[str, Any]) -> int:
    """Processes in torch's world: every node's, or a pool job's primary and workers only."""
    shape = kinds.shape_of(plan)
    return sum(int(n["slots"]) for n in _nodes(plan) if shape.in_world(n))


def torch_node_rank(plan: Dict[str, Any], node_index: int) -> int:
    """NODE_RANK: the node index, or in a pool job 0 for the primary and 1 + index for a worker."""
    return kinds.shape_of(plan).node_rank(plan, node_index)


def _torch_rank(plan: Dict[str, Any], node_index: int, local_rank: int) -> int:
    """A world member's torch rank: the slots of the world's nodes before it, plus local rank."""
    shape = kinds.shape_of(plan)
    return sum(int(n["slots"]) for n in _nodes(plan)[:node_index] if shape.in_world(n)) + local_rank


# -- the node's environment -------------------------------------------------------------------


def node_env(plan: Dict[str, Any], node_index: int, job_dir: str,
             iface: Optional[str]) -> Dict[str, str]:
    """Write the cluster files for this node into ``job_dir`` and return the environment common to
    all ranks on this node (everything except per-rank variables: see :func:`rank_env`).

    The plan's shape (``agent.kinds``) lays the node out: a pool job's node is one replica, its
    files in ``<job_dir>/replicas/<role>-<replica>/``; a processing job writes a tree of its own.
    Every view below is written from that layout, and each of the plan's kinds adds its part."""
    shape = kinds.shape_of(plan)
    own = shape.own_env(plan, node_index, job_dir)
    if own is not None:
        return own
    every = [shape] + kinds.traits_of(plan)
    job_dir = os.path.abspath(job_dir)
    layout = shape.layout(plan, node_index, job_dir)
    tree = _make_tree(layout.files_dir, job_dir)
    ckpt_dir, ckpt_owner = _checkpoints(plan, tree)
    for kind in every:
        kind.prepare(plan, node_index, ckpt_dir)
    env = _sagemaker_env(plan, node_index, iface, layout, tree)
    env.update(_rigdeck_env(plan, node_index, job_dir, tree, ckpt_dir, ckpt_owner))
    for kind in every:
        env.update(kind.node_env(plan, node_index, layout))
    env.update(_vertex_env(plan, layout, every, tree, ckpt_dir))
    env.update(_torch_env(plan, node_index, shape, iface))
    # the user's own table on top (the job id is the tag that finds its processes: never theirs)
    env.update(user_env(shape.user_table(plan, _node(plan, node_index))))
    write_json_atomic(os.path.join(layout.files_dir, NODE_ENV_FILE), env)
    return env


class _Tree(NamedTuple):
    """Where one node's files go: its SageMaker tree (under its files dir) and the job's own
    metrics and tensorboard dirs."""

    files_dir: str
    base: str
    input_dir: str
    config_dir: str
    data_dir: str
    model_dir: str
    output_dir: str
    output_data_dir: str
    intermediate_dir: str
    checkpoints: str
    metrics_dir: str
    tensorboard_dir: str
    hostfile: str


def _make_tree(files_dir: str, job_dir: str) -> _Tree:
    os.makedirs(job_dir, exist_ok=True)
    base = os.path.join(files_dir, "sagemaker")
    input_dir = os.path.join(base, "input")
    output_dir = os.path.join(base, "output")
    tree = _Tree(files_dir=files_dir, base=base, input_dir=input_dir,
                 config_dir=os.path.join(input_dir, "config"), data_dir=os.path.join(input_dir, "data"),
                 model_dir=os.path.join(base, "model"), output_dir=output_dir,
                 output_data_dir=os.path.join(output_dir, "data"),
                 intermediate_dir=os.path.join(output_dir, "intermediate"),
                 checkpoints=os.path.join(base, "checkpoints"),
                 metrics_dir=os.path.join(job_dir, "metrics"), tensorboard_dir=os.path.join(job_dir, "tensorboard"),
                 hostfile=os.path.join(files_dir, HOSTFILE))
    for d in (tree.config_dir, tree.data_dir, tree.model_dir, tree.output_data_dir, tree.intermediate_dir,
              tree.metrics_dir, tree.tensorboard_dir):
        os.makedirs(d, exist_ok=True)
    return tree


def _checkpoints(plan: Dict[str, Any], tree: _Tree) -> Tuple[str, str]:
    """(the checkpoint dir the job writes to, its owner): the plan's ``checkpoint.dir``, linked
    from ``sagemaker/checkpoints``, or that directory itself."""
    ckpt_dir, owner = _checkpoint(plan)
    if ckpt_dir:
        os.makedirs(ckpt_dir, exist_ok=True)
        _symlink_atomic(ckpt_dir, tree.checkpoints)
        return ckpt_dir, owner
    _ensure_dir(tree.checkpoints)
    return tree.checkpoints, owner


# -- SageMaker: the files under input/config and SM_* as the toolkit's Environment.to_env_vars() --

# SM_<NAME> in the toolkit's order; each takes the training environment's value of the same name,
# or of the one _SM_FROM names.
_SM_VARS = ("hosts", "network_interface_name", "hps", "user_entry_point", "framework_params", "resource_config",
            "input_data_config", "output_data_dir", "channels", "current_host", "current_instance_type",
            "current_instance_group", "current_instance_group_hosts", "instance_groups", "instance_groups_dict",
            "distribution_instance_groups", "is_hetero", "module_name", "log_level", "framework_module",
            "input_dir", "input_config_dir", "output_dir", "num_cpus", "num_gpus", "num_neurons", "model_dir",
            "module_dir", "training_env", "user_args", "output_intermediate_dir")
_SM_FROM = {"hps": "hyperparameters", "framework_params": "additional_framework_parameters"}


def _sagemaker_config(plan: Dict[str, Any], node_index: int, iface: Optional[str], layout: Layout,
                      tree: _Tree) -> Dict[str, Any]:
    """Write ``input/config`` (resourceconfig, hyperparameters, inputdataconfig), the channels'
    data dirs and the hostfile; returns what the training environment takes from them."""
    node = _node(plan, node_index)
    resource_config = {
        "current_host": layout.sm_hosts[node_index],
        "current_instance_type": str(node.get("instance_type") or "local"),
        "current_group_name": layout.current_group,
        "hosts": list(layout.sm_hosts),
        "instance_groups": layout.groups,
        "network_interface_name": iface or DEFAULT_INTERFACE,
    }
    raw_hps = dict(plan.get("hyperparameters") or {})
    if layout.is_hetero:  # as the SageMaker SDK passes a heterogeneous cluster's distribution groups
        raw_hps.setdefault("sagemaker_distribution_instance_groups", list(layout.dist_groups))
    encoded_hps = _encode_hyperparameters(raw_hps)
    all_hps = _decode_hyperparameters(encoded_hps)
    channels = _channels(plan)
    input_data_config = {name: cfg for name, (cfg, _src) in channels.items()}
    channel_dirs = {}  # type: Dict[str, str]
    for name, (_cfg, src) in channels.items():
        path = os.path.join(tree.data_dir, name)
        if src:
            _symlink_atomic(src, path)
        else:
            _ensure_dir(path)
        channel_dirs[name] = path
    write_json_atomic(os.path.join(tree.config_dir, "resourceconfig.json"), resource_config)
    write_json_atomic(os.path.join(tree.config_dir, "hyperparameters.json"), encoded_hps)
    write_json_atomic(os.path.join(tree.config_dir, "inputdataconfig.json"), input_data_config)
    _write_text_atomic(tree.hostfile, mpi_hostfile(plan))
    return {
        "resource_config": resource_config,
        "hyperparameters": {k: v for k, v in all_hps.items() if not k.startswith("sagemaker_")},
        "additional_framework_parameters": {k: v for k, v in all_hps.items() if k.startswith("sagemaker_")},
        "input_data_config": input_data_config,
        "channel_input_dirs": channel_dirs,
    }


def _training_env(plan: Dict[str, Any], node_index: int, iface: Optional[str], layout: Layout,
                  tree: _Tree, config: Dict[str, Any]) -> Dict[str, Any]:
    """The toolkit's ``SM_TRAINING_ENV``: the whole training environment as one object."""
    node = _node(plan, node_index)
    cpus = node.get("cpus")
    entry_point, module_name = _script(node_command(plan, node_index))
    groups_dict = {str(g["instance_group_name"]): g for g in layout.groups}
    return {
        "additional_framework_parameters": config["additional_framework_parameters"],
        "channel_input_dirs": config["channel_input_dirs"],
        "current_host": layout.sm_hosts[node_index],
        "current_instance_group": layout.current_group,
        "current_instance_group_hosts": list(layout.group_hosts),
        "current_instance_type": str(node.get("instance_type") or "local"),
        "distribution_hosts": list(layout.dist_hosts),
        "distribution_instance_groups": list(layout.dist_groups),
        "framework_module": None,
        "hosts": list(layout.sm_hosts),
        "hyperparameters": config["hyperparameters"],
        "input_config_dir": tree.config_dir,
        "input_data_config": config["input_data_config"],
        "input_dir": tree.input_dir,
        "instance_groups": list(groups_dict),
        "instance_groups_dict": groups_dict,
        "is_hetero": layout.is_hetero,
        "is_master": node_index == 0,
        "is_modelparallel_enabled": False,
        "is_smddpmprun_installed": False,
        "job_name": str(plan["job_id"]),
        "log_level": LOG_LEVEL,
        "master_hostname": layout.sm_hosts[0],
        "model_dir": tree.model_dir,
        "module_dir": str(plan.get("workdir") or ""),
        "module_name": module_name,
        "network_interface_name": iface or DEFAULT_INTERFACE,
        "num_cpus": int(cpus) if cpus is not None else (os.cpu_count() or 1),
        "num_gpus": len(_gpus(node)),
        "num_neurons": 0,
        "output_data_dir": tree.output_data_dir,
        "output_dir": tree.output_dir,
        "output_intermediate_dir": tree.intermediate_dir,
        "resource_config": config["resource_config"],
        "user_entry_point": entry_point,
    }


def _sagemaker_env(plan: Dict[str, Any], node_index: int, iface: Optional[str], layout: Layout,
                   tree: _Tree) -> Dict[str, str]:
    """Write the SageMaker tree's files and return SM_*, SAGEMAKER_BASE_DIR and TRAINING_JOB_NAME."""
    config = _sagemaker_config(plan, node_index, iface, layout, tree)
    training_env = _training_env(plan, node_index, iface, layout, tree, config)
    hps = config["hyperparameters"]
    values = dict(training_env, training_env=training_env, user_args=user_args(hps),
                  channels=sorted(config["channel_input_dirs"]))
    sm = {name: values[_SM_FROM.get(name, name)] for name in _SM_VARS}  # type: Dict[str, Any]
    if layout.is_hetero:
        sm["distribution_hosts"] = list(layout.dist_hosts)
        sm["master_hostname"] = layout.sm_hosts[0]
    for name, path in config["channel_input_dirs"].items():
        sm["channel_%s" % name] = path
    for k, v in hps.items():
        sm["hp_%s" % k] = v
    env = {"SM_%s" % k.upper(): _sm_value(v) for k, v in sm.items()}
    env["SAGEMAKER_BASE_DIR"] = tree.base
    env["TRAINING_JOB_NAME"] = str(plan["job_id"])
    return env


# -- rigdeck, Vertex AI and torch ----------------------------------------------------------------


def _rigdeck_env(plan: Dict[str, Any], node_index: int, job_dir: str, tree: _Tree, ckpt_dir: str,
                 ckpt_owner: str) -> Dict[str, str]:
    env = rigdeck_env(plan, node_index, job_dir, tree.metrics_dir, [str(n["host"]) for n in _nodes(plan)])
    env.update({"RIGDECK_CHECKPOINT_DIR": ckpt_dir, "RIGDECK_CHECKPOINT_OWNER": ckpt_owner,
                "RIGDECK_HOSTFILE": tree.hostfile})
    return env


def _vertex_env(plan: Dict[str, Any], layout: Layout, every: List[Kind], tree: _Tree,
                ckpt_dir: str) -> Dict[str, str]:
    """CLUSTER_SPEC, TF_CONFIG (when the layout has one), AIP_* and cloudml-hypertune's file."""

    def task(kind_index: Tuple[str, int]) -> Dict[str, Any]:
        out = {"type": kind_index[0], "index": kind_index[1]}  # type: Dict[str, Any]
        for kind in every:
            out.update(kind.vertex_task(plan))
        return out

    # A small CustomJobSpec-like description of the job (Vertex puts the job's spec here).
    job = {"job_id": str(plan["job_id"]), "display_name": str(plan.get("name") or plan["job_id"]),
           "worker_pool_specs": layout.vertex_pools}
    cluster_spec = {"cluster": layout.vertex_cluster, "environment": "cloud", "task": task(layout.vertex_task),
                    "job": job}
    env = {"CLUSTER_SPEC": json.dumps(cluster_spec, separators=(",", ":"))}
    if layout.tf_cluster is not None:
        tf_config = {"cluster": layout.tf_cluster, "task": task(layout.tf_task), "environment": "cloud", "job": job}
        env["TF_CONFIG"] = json.dumps(tf_config, separators=(",", ":"))
    env["AIP_MODEL_DIR"] = tree.model_dir
    env["AIP_CHECKPOINT_DIR"] = ckpt_dir
    env["AIP_TENSORBOARD_LOG_DIR"] = tree.tensorboard_dir
    # cloudml-hypertune reports here (it rewrites the whole file on each report); every job gets
    # it, so a script that reports through hypertune works in and out of a sweep alike.
    env["CLOUD_ML_HP_METRIC_FILE"] = os.path.join(tree.metrics_dir, HYPERTUNE_FILE)
    return env


def _torch_env(plan: Dict[str, Any], node_index: int, shape: Kind, iface: Optional[str]) -> Dict[str, str]:
    """torch's world (every node, or the shape's members only), the node's GPUs and interface."""
    node = _node(plan, node_index)
    env = {}  # type: Dict[str, str]
    if shape.in_world(node):
        env.update({
            "MASTER_ADDR": str(plan["master_addr"]),
            "MASTER_PORT": str(int(plan["master_port"])),
            "WORLD_SIZE": str(torch_world_size(plan)),
            "LOCAL_WORLD_SIZE": str(int(node["slots"])),
            "NODE_RANK": str(shape.node_rank(plan, node_index)),
        })
    gpus = _gpus(node)
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    if iface:
        env["NCCL_SOCKET_IFNAME"] = iface
        env["GLOO_SOCKET_IFNAME"] = iface
    return env


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
    if kinds.shape_of(plan).in_world(node):  # a pool job's other replicas are not in torch's world
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


def mpi_hostfile(plan: Dict[str, Any], names: Optional[List[str]] = None) -> str:
    """Open MPI hostfile: one ``<address> slots=<n>`` line per node, in rank order (a pool job:
    the primary and the workers, torch's world); ``names``: each node's name to use instead of
    its address, in the plan's order (Slurm's node names, inside a Slurm allocation)."""
    shape = kinds.shape_of(plan)
    nodes = _nodes(plan)
    return "".join("%s slots=%d\n" % (names[i] if names else n["address"], int(n["slots"]))
                   for i, n in enumerate(nodes) if shape.in_world(n))


def slurm_mpi(plan: Dict[str, Any], env: Dict[str, str], job_dir: str) -> Optional[Tuple[str, Dict[str, str]]]:
    """Inside a Slurm allocation (a job rigdeck launched through sbatch), Open MPI starts its
    daemons with Slurm's own ``srun`` and accepts only the allocation's nodes, by Slurm's names:
    a hostfile of those names (the plan's nodes are the allocation's, in Slurm's order) and
    mpirun's environment with ``SLURM_OVERLAP=1``, so that its daemons' step shares the
    resources of the step that runs rigdeck's job hosts, and the plan's ranks per node as
    ``SLURM_TASKS_PER_NODE``. Every process stays in Slurm's job
    (``scancel`` reaches it) and no ssh between nodes is needed. None outside Slurm, or when
    Slurm's node list does not match the plan."""
    if not plan.get("slurm") or not env.get("SLURM_JOB_NODELIST"):
        return None
    from agent import slurmtext

    try:
        names = slurmtext.hostlist(env["SLURM_JOB_NODELIST"])
    except slurmtext.SlurmTextError:
        return None
    if len(names) != len(_nodes(plan)):
        return None
    path = os.path.join(job_dir, "hostfile.slurm")
    _write_text_atomic(path, mpi_hostfile(plan, names))
    # Open MPI takes each node's slots from Slurm (one task per node in rigdeck's step): the
    # plan's ranks per node instead, as Slurm words it.
    shape = kinds.shape_of(plan)
    tasks = ",".join(str(int(n["slots"])) for n in _nodes(plan) if shape.in_world(n))
    return path, dict(env, SLURM_OVERLAP="1", SLURM_TASKS_PER_NODE=tasks)


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
