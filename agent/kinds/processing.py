"""A processing job (``kind = "processing"``): SageMaker Processing's tree instead of a training
cluster: no SageMaker training tree, no CLUSTER_SPEC or TF_CONFIG, only the usual RIGDECK_*."""
from __future__ import annotations

import os
import re
import shutil

from agent.kinds.base import (
    NODE_ENV_FILE,
    Kind,
    node_gpus,
    plan_node,
    plan_nodes,
    rigdeck_env,
    unique_hosts,
    user_env,
    write_json_atomic,
)

TYPE_CHECKING = False  # (mypy reads it as True) typing is not imported by a rank's or job's start
if TYPE_CHECKING:
    from typing import Any, Dict, Optional

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


def _link_shard(name: str, entry: Dict[str, Any], source: str, path: str, current: str) -> None:
    """ShardedByKey: a directory of links to this host's listed files, each at its relative path."""
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


def _link_input(plan: Dict[str, Any], i: int, entry: Dict[str, Any], input_root: str, current: str) -> None:
    name = _io_name("inputs", i, entry)
    source = os.path.expanduser(str(entry.get("source") or ""))
    if not source:
        raise ValueError("plan processing.inputs[%d].source: missing (input %r)" % (i, name))
    if not os.path.isabs(source):
        source = os.path.normpath(os.path.join(plan.get("workdir") or os.getcwd(), source))
    if not os.path.isdir(source):
        raise ValueError("processing input %r: source %s is not a directory on %s" % (name, source, current))
    dist = str(entry.get("distribution") or "FullyReplicated")
    path = os.path.join(input_root, name)
    _clear_input(path)
    if dist == "FullyReplicated":
        os.symlink(source, path)
    elif dist == "ShardedByKey":
        _link_shard(name, entry, source, path, current)
    else:
        raise ValueError("plan processing.inputs[%d].distribution: expected FullyReplicated or "
                         "ShardedByKey, got %r" % (i, dist))


def processing_tree(plan: Dict[str, Any], node_index: int, job_dir: str) -> str:
    """SageMaker Processing's tree in ``<job_dir>/processing``: ``input/<name>`` (FullyReplicated:
    a link to the source dir; ShardedByKey: a directory of links to this host's shard, each at its
    relative path), empty ``output/<name>`` dirs, and ``config/resourceconfig.json`` with only
    ``current_host`` and ``hosts``. Raises ValueError naming what is missing."""
    nodes = plan_nodes(plan)
    plan_node(plan, node_index)
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
        _link_input(plan, i, entry, input_root, current)
    for i, entry in enumerate(spec.get("outputs") or []):
        os.makedirs(os.path.join(output_root, _io_name("outputs", i, entry)), exist_ok=True)
    write_json_atomic(os.path.join(config_dir, "resourceconfig.json"), {"current_host": current, "hosts": hosts})
    return root


def processing_env(plan: Dict[str, Any], node_index: int, job_dir: str) -> Dict[str, str]:
    """A processing job's node: its tree (:func:`processing_tree`) and the usual RIGDECK_*."""
    node = plan_node(plan, node_index)
    job_dir = os.path.abspath(job_dir)
    hosts = unique_hosts(plan)
    gpus = node_gpus(node)
    metrics_dir = os.path.join(job_dir, "metrics")
    os.makedirs(metrics_dir, exist_ok=True)
    root = processing_tree(plan, node_index, job_dir)
    env = rigdeck_env(plan, node_index, job_dir, metrics_dir, hosts)
    env["RIGDECK_JOB_KIND"] = "processing"
    env["RIGDECK_PROCESSING_DIR"] = root
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    env.update(user_env(dict(plan.get("env") or {})))
    write_json_atomic(os.path.join(job_dir, NODE_ENV_FILE), env)
    return env


class Processing(Kind):
    name = "processing"
    shape = True

    def matches(self, plan: Dict[str, Any]) -> bool:
        return plan.get("kind") == "processing"

    def own_env(self, plan: Dict[str, Any], node_index: int, job_dir: str) -> Optional[Dict[str, str]]:
        return processing_env(plan, node_index, job_dir)


KIND = Processing()
