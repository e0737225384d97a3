"""What a job kind is to the agent: one small interface (:class:`Kind`), the :class:`Layout` a
training kind gives its nodes, and the few plan readers every kind shares.

Kinds come in two sorts. A *shape* says how the job's nodes make a cluster: exactly one holds
for a plan (plain, pools, processing). A *trait* adds to whatever shape the job has (a sweep's
trial, a pipeline's step). ``agent.clusterfiles`` writes the SageMaker, Vertex, torch and MPI
views from the shape's :class:`Layout` and asks every kind of the plan for its additions, so a
new kind is one module here and one line in ``agent/kinds/__init__.py``.

Stdlib only, Python 3.9+. Nothing here imports the rest of the agent: ``clusterfiles`` builds on
the kinds, not the other way round.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

NODE_ENV_FILE = "node_env.json"

# -- the plan, as every kind reads it -------------------------------------------------------------


def plan_nodes(plan: Dict[str, Any]) -> List[Dict[str, Any]]:
    """``plan["nodes"]``, in rank order (the primary first); ValueError when there are none."""
    nodes = plan.get("nodes") or []
    if not nodes:
        raise ValueError("plan has no nodes")
    return nodes


def plan_node(plan: Dict[str, Any], node_index: int) -> Dict[str, Any]:
    nodes = plan_nodes(plan)
    if not 0 <= node_index < len(nodes):
        raise ValueError("node_index %d outside 0..%d" % (node_index, len(nodes) - 1))
    return nodes[node_index]


def node_gpus(node: Dict[str, Any]) -> List[int]:
    return [int(g) for g in (node.get("gpus") or [])]


def world_size(plan: Dict[str, Any]) -> int:
    return sum(int(n["slots"]) for n in plan_nodes(plan))


def rigdeck_env(plan: Dict[str, Any], node_index: int, job_dir: str, metrics_dir: str,
                hosts: List[str]) -> Dict[str, str]:
    """The ``RIGDECK_*`` variables every kind's ranks get: the job, the cluster (``hosts``: the
    nodes' host names, in node order), this node, the rendezvous, the metrics directory, the
    attempt. A kind adds its own beside them."""
    nodes = plan_nodes(plan)
    node = plan_node(plan, node_index)
    job_id = str(plan["job_id"])
    return {
        "RIGDECK_JOB_ID": job_id,
        "RIGDECK_JOB_NAME": str(plan.get("name") or job_id),
        "RIGDECK_JOB_DIR": job_dir,
        "RIGDECK_HOSTS": json.dumps(hosts),
        "RIGDECK_HOST_ADDRS": json.dumps([str(n["address"]) for n in nodes]),
        "RIGDECK_CURRENT_HOST": hosts[node_index],
        "RIGDECK_NODE_RANK": str(node_index),
        "RIGDECK_NUM_NODES": str(len(nodes)),
        "RIGDECK_WORLD_SIZE": str(world_size(plan)),
        "RIGDECK_LOCAL_WORLD_SIZE": str(int(node["slots"])),
        "RIGDECK_MASTER_ADDR": str(plan["master_addr"]),
        "RIGDECK_MASTER_PORT": str(int(plan["master_port"])),
        "RIGDECK_GPUS": ",".join(str(g) for g in node_gpus(node)),
        "RIGDECK_METRICS_DIR": metrics_dir,
        "RIGDECK_RESTART_COUNT": str(int(plan.get("restart_count") or 0)),
        "RIGDECK_LAUNCHER": str(plan.get("launcher") or "direct"),
    }


def unique_hosts(plan: Dict[str, Any]) -> List[str]:
    """The plan's host names, in node order; ValueError when one repeats (only a pool job may put
    two nodes on one host: each is a replica with its own files)."""
    hosts = [str(n["host"]) for n in plan_nodes(plan)]
    if len(set(hosts)) != len(hosts):
        raise ValueError("host names repeat in the plan: %s" % hosts)
    return hosts


def host_port(addr: str, port: int) -> str:
    if ":" in addr and not addr.startswith("["):  # an IPv6 literal
        return "[%s]:%d" % (addr, port)
    return "%s:%d" % (addr, port)


def env_str(value: Any) -> str:
    """A user ``[env]`` value as an environment string (TOML may give ints, floats, bools)."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value)


def user_env(table: Dict[str, Any]) -> Dict[str, str]:
    """The user's ``[env]`` as strings, less RIGDECK_JOB_ID (the tag that finds the job's processes
    is rigdeck's own)."""
    return {str(k): env_str(v) for k, v in table.items() if str(k) != "RIGDECK_JOB_ID"}


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


def vertex_pool_spec(node: Dict[str, Any], count: int, command: List[Any]) -> Dict[str, Any]:
    """One ``worker_pool_specs`` entry of Vertex's CustomJobSpec, from the pool's first node."""
    return {"machine_spec": {"machine_type": str(node.get("instance_type") or "local"),
                             "accelerator_count": len(node_gpus(node))},
            "replica_count": count,
            "container_spec": {"command": [str(a) for a in command]}}


# -- the interface --------------------------------------------------------------------------------


class Layout(NamedTuple):
    """One training node as its shape lays the cluster out; every cloud view is written from it.

    ``files_dir`` holds the node's SageMaker tree and hostfile. The SageMaker fields are the
    toolkit's (``resourceconfig.json`` and ``SM_*``); ``vertex_task``/``tf_task`` are (type,
    index), and ``tf_cluster`` None means the node gets no ``TF_CONFIG``."""

    files_dir: str
    sm_hosts: List[str]
    groups: List[Dict[str, Any]]
    current_group: str
    group_hosts: List[str]
    dist_groups: List[str]
    dist_hosts: List[str]
    is_hetero: bool
    vertex_cluster: Dict[str, List[str]]
    vertex_task: Tuple[str, int]
    vertex_pools: List[Dict[str, Any]]
    tf_cluster: Optional[Dict[str, List[str]]]
    tf_task: Tuple[str, int]


class Kind:
    """One kind of job on a host. Every hook has a neutral default, so a kind writes only what it
    changes. ``shape`` kinds also give :meth:`layout` (or :meth:`own_env`)."""

    name = ""
    shape = False

    def matches(self, plan: Dict[str, Any]) -> bool:
        """Whether ``plan`` is a job of this kind."""
        raise NotImplementedError

    # -- shapes only ------------------------------------------------------------------------

    def own_env(self, plan: Dict[str, Any], node_index: int, job_dir: str) -> Optional[Dict[str, str]]:
        """A shape with a tree of its own (processing) writes it here and returns the node's whole
        environment; None: the training tree, from :meth:`layout`."""
        return None

    def layout(self, plan: Dict[str, Any], node_index: int, job_dir: str) -> Layout:
        """The node's place in the cluster (ValueError naming what is wrong with the plan)."""
        raise NotImplementedError

    def in_world(self, node: Dict[str, Any]) -> bool:
        """Whether ``node``'s ranks are in torch's world (and MPI's hostfile)."""
        return True

    def node_rank(self, plan: Dict[str, Any], node_index: int) -> int:
        """A node's NODE_RANK in torch's world (ValueError for a node outside it)."""
        return node_index

    def user_table(self, plan: Dict[str, Any], node: Dict[str, Any]) -> Dict[str, Any]:
        """The user's ``[env]`` for ``node``, before it becomes strings."""
        return dict(plan.get("env") or {})

    # -- every kind -------------------------------------------------------------------------

    def prepare(self, plan: Dict[str, Any], node_index: int, checkpoint_dir: str) -> None:
        """Files the node needs before its ranks start, once its directories exist."""

    def node_env(self, plan: Dict[str, Any], node_index: int, layout: Layout) -> Dict[str, str]:
        """Variables this kind adds to every rank of the node (after rigdeck's own)."""
        return {}

    def vertex_task(self, plan: Dict[str, Any]) -> Dict[str, Any]:
        """Fields this kind adds to Vertex's ``task`` (CLUSTER_SPEC's and TF_CONFIG's)."""
        return {}
