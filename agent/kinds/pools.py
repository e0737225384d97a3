"""A job of worker pools (``[[pools]]``): every node of the plan is one replica of one pool.

Vertex's pools, in order: workerpool0 the primary, 1 the workers, 2 parameter servers or Reduction
Server replicas, 3 the evaluators. SageMaker sees a heterogeneous cluster, one instance group per
pool, with the primary and the workers as its distribution groups; torch's world is the primary
and the workers only. A replica's files go to ``<job_dir>/replicas/<role>-<replica>``, so one host
may run several.
"""
from __future__ import annotations

import os

from agent.kinds.base import Kind, Layout, host_port, plan_node, plan_nodes, vertex_pool_spec

TYPE_CHECKING = False  # (mypy reads it as True) typing is not imported by a rank's or job's start
if TYPE_CHECKING:
    from typing import Any, Dict, List, Tuple

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


def _role_replica(i: int, n: Dict[str, Any]) -> Tuple[str, int]:
    role = n.get("pool")
    if role not in VERTEX_POOLS:
        raise ValueError("plan nodes[%d].pool: expected one of %s, got %r" % (i, ", ".join(POOL_ORDER), role))
    rep = n.get("replica")
    if not isinstance(rep, int) or isinstance(rep, bool) or rep < 0:
        raise ValueError("plan nodes[%d].replica: expected an integer >= 0, got %r" % (i, rep))
    return str(role), rep


def _port(i: int, n: Dict[str, Any]) -> int:
    port = n.get("port")
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise ValueError("plan nodes[%d].port: expected a port number, got %r" % (i, port))
    return port


def check_pools(plan: Dict[str, Any]) -> None:
    """A pool plan the agent can use, or ValueError saying what is wrong with which node."""
    nodes = plan_nodes(plan)
    seen = {}  # type: Dict[Tuple[str, int], int]
    ports = {}  # type: Dict[Tuple[str, int], int]
    primaries = []
    for i, n in enumerate(nodes):
        role, rep = _role_replica(i, n)
        if (role, rep) in seen:
            raise ValueError("plan nodes[%d]: %s %d is nodes[%d] already" % (i, role, rep, seen[(role, rep)]))
        seen[(role, rep)] = i
        key = (str(n.get("address")), _port(i, n))
        if key in ports:
            raise ValueError("plan nodes[%d].port: %s:%d is nodes[%d]'s already" % (i, key[0], key[1], ports[key]))
        ports[key] = i
        if role == "primary":
            primaries.append(i)
    if len(primaries) != 1:
        raise ValueError("plan: expected exactly one primary node, got %d" % len(primaries))
    if "parameter_server" in (n["pool"] for n in nodes) and "reduction_server" in (n["pool"] for n in nodes):
        raise ValueError("plan: parameter_server and reduction_server nodes both (both are workerpool2)")


def pool_nodes(plan: Dict[str, Any]) -> Dict[str, List[int]]:
    """role -> indices of its nodes, by replica index."""
    out = {}  # type: Dict[str, List[int]]
    nodes = plan_nodes(plan)
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
    return ["algo-%d" % (k + 1) for k in range(len(plan_nodes(plan)))]


def _endpoint(node: Dict[str, Any], default_port: int) -> str:
    port = node.get("port")
    return host_port(str(node["address"]), int(port) if port is not None else default_port)


def vertex_cluster(plan: Dict[str, Any]) -> Dict[str, List[str]]:
    """CLUSTER_SPEC's ``cluster`` of a pool job: workerpool0..3, each replica's own port."""
    nodes = plan_nodes(plan)
    by_pool = pool_nodes(plan)
    out = {name: [] for name in VERTEX_POOL_NAMES}  # type: Dict[str, List[str]]
    for role in POOL_ORDER:
        for i in by_pool.get(role, []):
            out[VERTEX_POOLS[role]].append(_endpoint(nodes[i], int(plan["master_port"])))
    return out


def tf_cluster(plan: Dict[str, Any]) -> Dict[str, List[str]]:
    """TF_CONFIG's ``cluster`` of a pool job: chief, worker, ps (only present ones; evaluators and
    reduction servers are never in it)."""
    nodes = plan_nodes(plan)
    by_pool = pool_nodes(plan)
    out = {}  # type: Dict[str, List[str]]
    for key, role in TF_CLUSTER_KEYS:
        if by_pool.get(role):
            out[key] = [_endpoint(nodes[i], int(plan["master_port"])) for i in by_pool[role]]
    return out


def vertex_pools(plan: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The job's ``worker_pool_specs``: all four entries, ``{}`` for an absent pool."""
    nodes = plan_nodes(plan)
    by_pool = pool_nodes(plan)
    specs = []  # type: List[Dict[str, Any]]
    for name in VERTEX_POOL_NAMES:
        members = [i for role in POOL_ORDER if VERTEX_POOLS[role] == name for i in by_pool.get(role, [])]
        if not members:
            specs.append({})
            continue
        first = nodes[members[0]]
        specs.append(vertex_pool_spec(first, len(members), first.get("command") or list(plan.get("command") or [])))
    return specs


def torch_node_rank(plan: Dict[str, Any], node_index: int) -> int:
    """NODE_RANK in a pool job: 0 for the primary, 1 + index for a worker."""
    node = plan_node(plan, node_index)
    if node["pool"] == "primary":
        return 0
    if node["pool"] == "worker":
        return 1 + int(node["replica"])
    raise ValueError("%s is not in torch's world" % replica_name(node))


class Pools(Kind):
    name = "pools"
    shape = True

    def matches(self, plan: Dict[str, Any]) -> bool:
        return is_pool_plan(plan)

    def in_world(self, node: Dict[str, Any]) -> bool:
        return node.get("pool") in WORLD_POOLS

    def node_rank(self, plan: Dict[str, Any], node_index: int) -> int:
        return torch_node_rank(plan, node_index)

    def user_table(self, plan: Dict[str, Any], node: Dict[str, Any]) -> Dict[str, Any]:
        table = dict(plan.get("env") or {})
        table.update(node.get("env") or {})  # the pool's table over the job's
        return table

    def layout(self, plan: Dict[str, Any], node_index: int, job_dir: str) -> Layout:
        check_pools(plan)
        nodes = plan_nodes(plan)
        node = plan_node(plan, node_index)
        role = str(node["pool"])
        replica = int(node["replica"])
        sm_hosts = algo_names(plan)
        by_pool = pool_nodes(plan)
        groups = [{"instance_group_name": r, "instance_type": str(nodes[by_pool[r][0]].get("instance_type") or "local"),
                   "hosts": [sm_hosts[i] for i in by_pool[r]]} for r in POOL_ORDER if by_pool.get(r)]
        world_groups = [g for g in groups if g["instance_group_name"] in WORLD_POOLS]
        tf_type = TF_TASK_TYPES.get(role)
        return Layout(
            files_dir=replica_dir(job_dir, node),
            sm_hosts=sm_hosts, groups=groups, current_group=role,
            group_hosts=[sm_hosts[i] for i in by_pool[role]],
            dist_groups=[str(g["instance_group_name"]) for g in world_groups],
            dist_hosts=[h for g in world_groups for h in g["hosts"]],
            is_hetero=True,
            vertex_cluster=vertex_cluster(plan),
            vertex_task=(VERTEX_POOLS[role], replica),
            vertex_pools=vertex_pools(plan),
            tf_cluster=tf_cluster(plan) if len(nodes) > 1 and tf_type is not None else None,
            tf_task=(str(tf_type), replica),
        )

    def node_env(self, plan: Dict[str, Any], node_index: int, layout: Layout) -> Dict[str, str]:
        node = plan_node(plan, node_index)
        return {
            "RIGDECK_POOL": str(node["pool"]),
            "RIGDECK_POOL_REPLICA": str(int(node["replica"])),
            "RIGDECK_IN_WORLD": "1" if self.in_world(node) else "0",
            "RIGDECK_REPLICA_DIR": layout.files_dir,
        }


KIND = Pools()
