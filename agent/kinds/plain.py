"""A plain job: one node per host, every rank in one world (the kind when no other shape holds).

SageMaker sees one homogeneous instance group; Vertex sees the primary as ``workerpool0`` and the
other nodes as ``workerpool1``, with a ``TF_CONFIG`` (chief and workers) when there are several.
"""
from __future__ import annotations

import os

from agent.kinds.base import Kind, Layout, host_port, plan_node, plan_nodes, unique_hosts, vertex_pool_spec

TYPE_CHECKING = False  # (mypy reads it as True) typing is not imported by a rank's or job's start
if TYPE_CHECKING:
    from typing import Any, Dict

SAGEMAKER_GROUP = "homogeneousCluster"


class Plain(Kind):
    name = "plain"
    shape = True

    def matches(self, plan: Dict[str, Any]) -> bool:
        return True

    def layout(self, plan: Dict[str, Any], node_index: int, job_dir: str) -> Layout:
        nodes = plan_nodes(plan)
        node = plan_node(plan, node_index)
        hosts = unique_hosts(plan)
        endpoints = [host_port(str(n["address"]), int(plan["master_port"])) for n in nodes]
        group = {"instance_group_name": SAGEMAKER_GROUP,
                 "instance_type": str(node.get("instance_type") or "local"), "hosts": list(hosts)}
        # Vertex's numbering: the primary is workerpool0's replica 0, node i workerpool1's i - 1.
        first = node_index == 0
        index = 0 if first else node_index - 1
        command = list(plan.get("command") or [])
        pools = [vertex_pool_spec(nodes[0], 1, command)]
        if len(nodes) > 1:
            pools.append(vertex_pool_spec(nodes[1], len(nodes) - 1, command))
        return Layout(
            files_dir=os.path.abspath(job_dir),
            sm_hosts=list(hosts), groups=[group], current_group=SAGEMAKER_GROUP, group_hosts=list(hosts),
            dist_groups=[SAGEMAKER_GROUP], dist_hosts=list(hosts), is_hetero=False,
            vertex_cluster={"workerpool0": endpoints[:1], "workerpool1": endpoints[1:],
                            "workerpool2": [], "workerpool3": []},
            vertex_task=("workerpool0" if first else "workerpool1", index),
            vertex_pools=pools,
            tf_cluster={"chief": endpoints[:1], "worker": endpoints[1:]} if len(nodes) > 1 else None,
            tf_task=("chief" if first else "worker", index),
        )


KIND = Plain()
