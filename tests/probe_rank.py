"""Runs inside every rank of a job: do all the cluster views agree, and does gloo work?

Reads every description of the cluster a training script might use -- rigdeck's RIGDECK_*, the
SageMaker tree (through SAGEMAKER_BASE_DIR) and SM_*, Vertex's CLUSTER_SPEC/TF_CONFIG/AIP_*, torch's
variables (from the agent, torchrun or mpirun: OMPI_COMM_WORLD_* stand in when RANK is absent) and
the MPI hostfile -- and checks that they tell the same story. Then it joins a gloo process group
(env://), all-reduces rank+1, all-gathers every rank's view of itself, and writes
``<RIGDECK_JOB_DIR>/probe/rank-<rank>.json``. Exits 1, naming the disagreeing sources on stderr,
when anything disagrees.

Standalone: stdlib + torch. ``PROBE_TIMEOUT_S`` bounds the collectives (default 120).
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import time
import traceback
import zlib
from typing import Any

MISSING = object()


class Probe:
    def __init__(self) -> None:
        self.checks: list[dict[str, Any]] = []
        self.values: dict[str, Any] = {}
        self.env = os.environ

    # -- reading sources ----------------------------------------------------------------------

    def raw(self, name: str) -> Any:
        v = self.env.get(name)
        self.values[name] = v
        return MISSING if v is None else v

    def json_env(self, name: str) -> Any:
        v = self.env.get(name)
        if v is None:
            self.values[name] = None
            return MISSING
        try:
            obj = json.loads(v)
        except ValueError as e:
            self.fail("parse " + name, {name: v}, f"not JSON: {e}")
            return MISSING
        self.values[name] = obj
        return obj

    def int_env(self, name: str) -> Any:
        v = self.raw(name)
        if v is MISSING:
            return MISSING
        try:
            return int(v)
        except ValueError:
            self.fail("parse " + name, {name: v}, "not an integer")
            return MISSING

    def json_file(self, label: str, path: str) -> Any:
        try:
            with open(path) as f:
                obj = json.load(f)
        except (OSError, ValueError) as e:
            self.fail("read " + label, {label: path}, str(e))
            return MISSING
        self.values[label] = obj
        return obj

    # -- checking -----------------------------------------------------------------------------

    def fail(self, name: str, sources: dict[str, Any], why: str) -> None:
        self.checks.append({"check": name, "ok": False, "sources": sources, "why": why})

    def agree(self, name: str, sources: dict[str, Any], optional: tuple[str, ...] = ()) -> Any:
        """Every present source must have the same value; a required source must be present.
        Returns the agreed value (MISSING when none is present)."""
        present = {k: v for k, v in sources.items() if v is not MISSING}
        missing = [k for k, v in sources.items() if v is MISSING and k not in optional]
        shown = {k: (None if v is MISSING else v) for k, v in sources.items()}
        distinct: list[Any] = []
        for v in present.values():
            if v not in distinct:
                distinct.append(v)
        if missing:
            self.fail(name, shown, "missing: " + ", ".join(missing))
        elif len(distinct) > 1:
            self.fail(name, shown, "disagree: " + " vs ".join(
                f"{k}={json.dumps(v, default=str)}" for k, v in present.items()))
        else:
            self.checks.append({"check": name, "ok": True, "sources": shown})
        return distinct[0] if distinct else MISSING

    @property
    def ok(self) -> bool:
        return all(c["ok"] for c in self.checks)


def _split_endpoint(ep: str) -> tuple[str, int]:
    host, _, port = ep.rpartition(":")
    return host.strip("[]"), int(port)


def _get(obj: Any, *keys: Any) -> Any:
    for k in keys:
        try:
            obj = obj[k]
        except (KeyError, IndexError, TypeError):
            return MISSING
    return obj


def _real(path: Any) -> Any:
    return MISSING if path is MISSING or not path else os.path.realpath(path)


def check_views(p: Probe) -> dict[str, Any]:
    """All the agreement checks; returns what the rank is (rank, world, node rank, ...)."""
    env = p.env
    rd_hosts = p.json_env("RIGDECK_HOSTS")
    rd_addrs = p.json_env("RIGDECK_HOST_ADDRS")
    sm_hosts = p.json_env("SM_HOSTS")
    sm_rc = p.json_env("SM_RESOURCE_CONFIG")
    sm_te = p.json_env("SM_TRAINING_ENV")
    sm_hps = p.json_env("SM_HPS")
    cs = p.json_env("CLUSTER_SPEC")
    tf = p.json_env("TF_CONFIG")
    base = p.raw("SAGEMAKER_BASE_DIR")
    config_dir = os.path.join(base, "input", "config") if base is not MISSING else None
    rc = hp_file = idc = MISSING
    if config_dir:
        rc = p.json_file("resourceconfig.json", os.path.join(config_dir, "resourceconfig.json"))
        hp_file = p.json_file("hyperparameters.json",
                              os.path.join(config_dir, "hyperparameters.json"))
        idc = p.json_file("inputdataconfig.json", os.path.join(config_dir, "inputdataconfig.json"))
    else:
        p.fail("SAGEMAKER_BASE_DIR", {"SAGEMAKER_BASE_DIR": None}, "missing")

    hostfile: Any = MISSING
    hf_path = p.raw("RIGDECK_HOSTFILE")
    if hf_path is not MISSING:
        try:
            with open(hf_path) as f:
                hostfile = []
                for line in f:
                    parts = line.split()
                    if parts:
                        slots = [int(x.split("=", 1)[1]) for x in parts[1:]
                                 if x.startswith("slots=")]
                        hostfile.append((parts[0], slots[0] if slots else 1))
            p.values["hostfile"] = hostfile
        except (OSError, ValueError) as e:
            p.fail("read hostfile", {"RIGDECK_HOSTFILE": hf_path}, str(e))

    cs_pool0 = _get(cs, "cluster", "workerpool0")
    cs_pool1 = _get(cs, "cluster", "workerpool1")
    cs_eps = (
        list(cs_pool0) + list(cs_pool1)
        if cs_pool0 is not MISSING and cs_pool1 is not MISSING
        else MISSING
    )
    tf_eps = MISSING
    if tf is not MISSING:
        tf_eps = (list(_get(tf, "cluster", "chief") or [])
                  + list(_get(tf, "cluster", "worker") or []))

    # ---- the host list, one order everywhere ------------------------------------------------
    hosts = p.agree("hosts", {
        "RIGDECK_HOSTS": rd_hosts,
        "SM_HOSTS": sm_hosts,
        "resourceconfig.json hosts": _get(rc, "hosts"),
        "resourceconfig.json instance_groups[0].hosts": _get(rc, "instance_groups", 0, "hosts"),
        "SM_RESOURCE_CONFIG hosts": _get(sm_rc, "hosts"),
        "SM_TRAINING_ENV hosts": _get(sm_te, "hosts"),
        "SM_CURRENT_INSTANCE_GROUP_HOSTS": p.json_env("SM_CURRENT_INSTANCE_GROUP_HOSTS"),
    })
    n_nodes = p.agree("number of nodes", {
        "RIGDECK_NUM_NODES": p.int_env("RIGDECK_NUM_NODES"),
        "len(RIGDECK_HOSTS)": len(hosts) if isinstance(hosts, list) else MISSING,
        "len(RIGDECK_HOST_ADDRS)": len(rd_addrs) if isinstance(rd_addrs, list) else MISSING,
        "hostfile lines": len(hostfile) if hostfile is not MISSING else MISSING,
        "CLUSTER_SPEC workerpool0+1": len(cs_eps) if cs_eps is not MISSING else MISSING,
        "TF_CONFIG chief+worker": len(tf_eps) if tf_eps is not MISSING else MISSING,
    }, optional=("TF_CONFIG chief+worker",))
    p.agree("TF_CONFIG set exactly for multi-node jobs", {
        "multi-node": (n_nodes > 1) if isinstance(n_nodes, int) else MISSING,
        "TF_CONFIG present": tf is not MISSING,
    })
    addrs = p.agree("host addresses", {
        "RIGDECK_HOST_ADDRS": rd_addrs,
        "hostfile": [a for a, _ in hostfile] if hostfile is not MISSING else MISSING,
        "CLUSTER_SPEC": [_split_endpoint(e)[0] for e in cs_eps] if cs_eps is not MISSING
        else MISSING,
        "TF_CONFIG": [_split_endpoint(e)[0] for e in tf_eps] if tf_eps is not MISSING
        else MISSING,
    }, optional=("TF_CONFIG",))

    # ---- this host ----------------------------------------------------------------------------
    current = p.agree("current host", {
        "RIGDECK_CURRENT_HOST": p.raw("RIGDECK_CURRENT_HOST"),
        "SM_CURRENT_HOST": p.raw("SM_CURRENT_HOST"),
        "resourceconfig.json current_host": _get(rc, "current_host"),
        "SM_RESOURCE_CONFIG current_host": _get(sm_rc, "current_host"),
        "SM_TRAINING_ENV current_host": _get(sm_te, "current_host"),
    })
    vertex_rank: Any = MISSING
    task_type, task_index = _get(cs, "task", "type"), _get(cs, "task", "index")
    if task_type == "workerpool0" and task_index == 0:
        vertex_rank = 0
    elif task_type == "workerpool1" and isinstance(task_index, int):
        vertex_rank = 1 + task_index
    elif cs is not MISSING:
        p.fail("CLUSTER_SPEC task", {"CLUSTER_SPEC task": _get(cs, "task")}, "not a training task")
    tf_rank: Any = MISSING
    if tf is not MISSING:
        t, i = _get(tf, "task", "type"), _get(tf, "task", "index")
        if t == "chief" and i == 0:
            tf_rank = 0
        elif t == "worker" and isinstance(i, int):
            tf_rank = 1 + i
        else:
            tf_rank = f"bad task {t}/{i}"
    node_rank = p.agree("node rank", {
        "RIGDECK_NODE_RANK": p.int_env("RIGDECK_NODE_RANK"),
        "index of current host in hosts": (
            hosts.index(current) if isinstance(hosts, list) and current in hosts else MISSING),
        "CLUSTER_SPEC task (0 for workerpool0, else 1+index)": vertex_rank,
        "TF_CONFIG task (0 for chief, else 1+index)": tf_rank,
        "NODE_RANK": p.int_env("NODE_RANK"),
        "GROUP_RANK (torchrun)": p.int_env("GROUP_RANK"),
    }, optional=("TF_CONFIG task (0 for chief, else 1+index)", "NODE_RANK",
                 "GROUP_RANK (torchrun)"))

    # ---- sizes and ranks ----------------------------------------------------------------------
    slots = [s for _, s in hostfile] if hostfile is not MISSING else None
    world = p.agree("world size", {
        "RIGDECK_WORLD_SIZE": p.int_env("RIGDECK_WORLD_SIZE"),
        "WORLD_SIZE": p.int_env("WORLD_SIZE"),
        "OMPI_COMM_WORLD_SIZE": p.int_env("OMPI_COMM_WORLD_SIZE"),
        "sum of hostfile slots": sum(slots) if slots is not None else MISSING,
    }, optional=("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"))
    node_slots = (slots[node_rank] if slots is not None and isinstance(node_rank, int)
                  and 0 <= node_rank < len(slots) else MISSING)
    local_world = p.agree("local world size", {
        "RIGDECK_LOCAL_WORLD_SIZE": p.int_env("RIGDECK_LOCAL_WORLD_SIZE"),
        "LOCAL_WORLD_SIZE": p.int_env("LOCAL_WORLD_SIZE"),
        "OMPI_COMM_WORLD_LOCAL_SIZE": p.int_env("OMPI_COMM_WORLD_LOCAL_SIZE"),
        "hostfile slots of this node": node_slots,
    }, optional=("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"))
    rank = p.agree("global rank", {
        "RANK": p.int_env("RANK"),
        "OMPI_COMM_WORLD_RANK": p.int_env("OMPI_COMM_WORLD_RANK"),
        "RIGDECK_RANK": p.int_env("RIGDECK_RANK"),
    }, optional=("RANK", "OMPI_COMM_WORLD_RANK", "RIGDECK_RANK"))
    if rank is MISSING:
        p.fail("global rank", {"RANK": None, "OMPI_COMM_WORLD_RANK": None}, "no rank variable")
    first = (sum(slots[:node_rank]) if slots is not None and isinstance(node_rank, int)
             else MISSING)
    local_rank = p.agree("local rank", {
        "LOCAL_RANK": p.int_env("LOCAL_RANK"),
        "OMPI_COMM_WORLD_LOCAL_RANK": p.int_env("OMPI_COMM_WORLD_LOCAL_RANK"),
        "RIGDECK_LOCAL_RANK": p.int_env("RIGDECK_LOCAL_RANK"),
        "global rank - first rank of this node": (
            rank - first if isinstance(rank, int) and isinstance(first, int) else MISSING),
    }, optional=("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "RIGDECK_LOCAL_RANK"))
    if isinstance(local_rank, int) and isinstance(local_world, int):
        p.agree("local rank within this node", {
            "0 <= local rank < local world size": 0 <= local_rank < local_world,
            "expected": True,
        })

    # ---- the primary ----------------------------------------------------------------------------
    ep0 = _split_endpoint(cs_pool0[0]) if isinstance(cs_pool0, list) and cs_pool0 else None
    p.agree("master address", {
        "RIGDECK_MASTER_ADDR": p.raw("RIGDECK_MASTER_ADDR"),
        "MASTER_ADDR": p.raw("MASTER_ADDR"),
        "CLUSTER_SPEC workerpool0[0]": ep0[0] if ep0 else MISSING,
        "RIGDECK_HOST_ADDRS[0]": addrs[0] if isinstance(addrs, list) and addrs else MISSING,
        "TF_CONFIG chief[0]": (_split_endpoint(tf_eps[0])[0] if isinstance(tf_eps, list) and tf_eps
                               else MISSING),
    }, optional=("TF_CONFIG chief[0]",))
    p.agree("master port", {
        "RIGDECK_MASTER_PORT": p.int_env("RIGDECK_MASTER_PORT"),
        "MASTER_PORT": p.int_env("MASTER_PORT"),
        "CLUSTER_SPEC workerpool0[0]": ep0[1] if ep0 else MISSING,
    })

    # ---- GPUs, CPUs ---------------------------------------------------------------------------
    gpus_s = p.raw("RIGDECK_GPUS")
    gpus = [g for g in gpus_s.split(",") if g] if gpus_s is not MISSING else []
    p.agree("GPUs of this node", {
        "SM_NUM_GPUS": p.int_env("SM_NUM_GPUS"),
        "len(RIGDECK_GPUS)": len(gpus) if gpus_s is not MISSING else MISSING,
        "SM_TRAINING_ENV num_gpus": _get(sm_te, "num_gpus"),
    })
    cvd = p.raw("CUDA_VISIBLE_DEVICES")
    if gpus:
        allowed = [",".join(gpus)]  # torchrun: the node's list, local rank i uses entry i
        if isinstance(local_rank, int) and local_rank < len(gpus):
            allowed.append(gpus[local_rank])  # direct / mpirun wrapper: the rank's own GPU
        seen = cvd if cvd is not MISSING else None
        p.agree("CUDA_VISIBLE_DEVICES", {
            "CUDA_VISIBLE_DEVICES is the node's list or this rank's GPU": seen in allowed,
            "expected": True,
        })
    p.agree("CPUs of this node", {
        "SM_NUM_CPUS": p.int_env("SM_NUM_CPUS"),
        "SM_TRAINING_ENV num_cpus": _get(sm_te, "num_cpus"),
    })
    p.agree("network interface", {
        "SM_NETWORK_INTERFACE_NAME": p.raw("SM_NETWORK_INTERFACE_NAME"),
        "resourceconfig.json network_interface_name": _get(rc, "network_interface_name"),
        "NCCL_SOCKET_IFNAME": p.raw("NCCL_SOCKET_IFNAME"),
        "GLOO_SOCKET_IFNAME": p.raw("GLOO_SOCKET_IFNAME"),
    }, optional=("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"))

    # ---- job, hyperparameters, channels, directories ----------------------------------------
    p.agree("job id", {
        "RIGDECK_JOB_ID": p.raw("RIGDECK_JOB_ID"),
        "TRAINING_JOB_NAME": p.raw("TRAINING_JOB_NAME"),
        "SM_TRAINING_ENV job_name": _get(sm_te, "job_name"),
        "CLUSTER_SPEC job.job_id": _get(cs, "job", "job_id"),
    })
    if hp_file is not MISSING:
        decoded = {}
        for k, v in hp_file.items():
            if not isinstance(v, str):
                p.fail("hyperparameters.json values", {k: v}, "not a string")
                continue
            try:
                decoded[k] = json.loads(v)
            except ValueError:
                decoded[k] = v
        hps = {k: v for k, v in decoded.items() if not k.startswith("sagemaker_")}
        p.agree("hyperparameters", {
            "hyperparameters.json (decoded)": hps,
            "SM_HPS": sm_hps,
            "SM_TRAINING_ENV hyperparameters": _get(sm_te, "hyperparameters"),
        })
        for k, v in hps.items():
            want = v if isinstance(v, str) else json.dumps(
                v, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
            p.agree("SM_HP_" + k.upper(), {
                "SM_HP_" + k.upper(): p.raw("SM_HP_" + k.upper()),
                "hyperparameters.json": want,
            })
    sm_idc = p.json_env("SM_INPUT_DATA_CONFIG")
    channels = p.agree("channels", {
        "inputdataconfig.json": sorted(idc) if isinstance(idc, dict) else MISSING,
        "SM_CHANNELS": p.json_env("SM_CHANNELS"),
        "SM_INPUT_DATA_CONFIG": sorted(sm_idc) if isinstance(sm_idc, dict) else MISSING,
        "SM_TRAINING_ENV channel_input_dirs": (
            sorted(_get(sm_te, "channel_input_dirs")) if isinstance(
                _get(sm_te, "channel_input_dirs"), dict) else MISSING),
    })
    for ch in channels if isinstance(channels, list) else []:
        d = p.raw("SM_CHANNEL_" + ch.upper())
        p.agree("channel " + ch, {
            "SM_CHANNEL_" + ch.upper(): _real(d),
            "input/data/" + ch: _real(os.path.join(base, "input", "data", ch)),
        })
    if base is not MISSING:
        p.agree("model dir", {
            "SM_MODEL_DIR": _real(p.raw("SM_MODEL_DIR")),
            "AIP_MODEL_DIR": _real(p.raw("AIP_MODEL_DIR")),
            "SAGEMAKER_BASE_DIR/model": _real(os.path.join(base, "model")),
        })
        p.agree("checkpoint dir", {
            "RIGDECK_CHECKPOINT_DIR": _real(p.raw("RIGDECK_CHECKPOINT_DIR")),
            "AIP_CHECKPOINT_DIR": _real(p.raw("AIP_CHECKPOINT_DIR")),
            "SAGEMAKER_BASE_DIR/checkpoints": _real(os.path.join(base, "checkpoints")),
        })
        for var, sub in (("SM_OUTPUT_DATA_DIR", "output/data"), ("SM_OUTPUT_DIR", "output"),
                         ("SM_INPUT_DIR", "input"), ("SM_INPUT_CONFIG_DIR", "input/config"),
                         ("SM_OUTPUT_INTERMEDIATE_DIR", "output/intermediate")):
            p.agree(var, {var: _real(p.raw(var)), "SAGEMAKER_BASE_DIR/" + sub:
                          _real(os.path.join(base, sub))})
    for var in ("SM_MODEL_DIR", "SM_OUTPUT_DATA_DIR", "RIGDECK_METRICS_DIR",
                "RIGDECK_CHECKPOINT_DIR", "RIGDECK_JOB_DIR"):
        d = env.get(var)
        p.agree(var + " is a directory", {var: bool(d) and os.path.isdir(d), "expected": True})

    return {"rank": rank, "world": world, "local_rank": local_rank, "node_rank": node_rank,
            "host": current, "hosts": hosts, "first": first, "local_world": local_world}


# -- a pool job's replica (RIGDECK_POOL set; docs/contracts.md "Worker pools and processing jobs") --

VERTEX_POOLS = {"primary": "workerpool0", "worker": "workerpool1", "parameter_server": "workerpool2",
                "reduction_server": "workerpool2", "evaluator": "workerpool3"}
TF_TASK_TYPES = {"primary": "chief", "worker": "worker", "parameter_server": "ps",
                 "evaluator": "evaluator"}
WORLD_POOLS = ("primary", "worker")
TORCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "RANK",
              "LOCAL_RANK")


def port_free(addr: str, port: int) -> Any:
    """True when ``addr:port`` can be bound here now (no SO_REUSEADDR: strictly free), else why."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.bind((addr, port))
        return True
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    finally:
        s.close()


def check_pool_views(p: Probe) -> dict[str, Any]:
    """Inside one replica of a pool job: CLUSTER_SPEC, TF_CONFIG, resourceconfig.json and SM_*
    agree with each other and with RIGDECK_* (its host, its pool, its index); torch's variables
    only in the world (primary + workers); its own endpoint's port free on its own address."""
    env = p.env
    pool = p.raw("RIGDECK_POOL")
    replica = p.int_env("RIGDECK_POOL_REPLICA")
    in_world = p.raw("RIGDECK_IN_WORLD")
    node_rank = p.int_env("RIGDECK_NODE_RANK")
    rd_hosts = p.json_env("RIGDECK_HOSTS")
    rd_addrs = p.json_env("RIGDECK_HOST_ADDRS")
    cs = p.json_env("CLUSTER_SPEC")
    tf = p.json_env("TF_CONFIG")
    sm_rc = p.json_env("SM_RESOURCE_CONFIG")
    base = p.raw("SAGEMAKER_BASE_DIR")
    rc = MISSING
    if base is not MISSING:
        rc = p.json_file("resourceconfig.json", os.path.join(base, "input", "config", "resourceconfig.json"))
    else:
        p.fail("SAGEMAKER_BASE_DIR", {"SAGEMAKER_BASE_DIR": None}, "missing")
    p.agree("pool known", {"RIGDECK_POOL in the five roles": pool in VERTEX_POOLS, "expected": True})
    n = len(rd_hosts) if isinstance(rd_hosts, list) else MISSING
    p.agree("number of replicas", {
        "RIGDECK_NUM_NODES": p.int_env("RIGDECK_NUM_NODES"),
        "len(RIGDECK_HOSTS)": n,
        "len(RIGDECK_HOST_ADDRS)": len(rd_addrs) if isinstance(rd_addrs, list) else MISSING,
        "CLUSTER_SPEC endpoints": (sum(len(v) for v in cs["cluster"].values())
                                   if isinstance(_get(cs, "cluster"), dict) else MISSING),
        "len(SM_HOSTS)": len(h) if isinstance(h := p.json_env("SM_HOSTS"), list) else MISSING,
        "len(resourceconfig.json hosts)": len(_get(rc, "hosts")) if isinstance(_get(rc, "hosts"), list) else MISSING,
    })
    p.agree("current host", {
        "RIGDECK_CURRENT_HOST": p.raw("RIGDECK_CURRENT_HOST"),
        "RIGDECK_HOSTS[RIGDECK_NODE_RANK]": (rd_hosts[node_rank] if isinstance(rd_hosts, list)
                                             and isinstance(node_rank, int) and 0 <= node_rank < len(rd_hosts)
                                             else MISSING),
    })
    # ---- Vertex: CLUSTER_SPEC -------------------------------------------------------------------
    cluster = _get(cs, "cluster")
    p.agree("CLUSTER_SPEC pools in order", {
        "CLUSTER_SPEC cluster keys": list(cluster) if isinstance(cluster, dict) else MISSING,
        "expected": ["workerpool0", "workerpool1", "workerpool2", "workerpool3"]})
    p.agree("CLUSTER_SPEC task", {
        "CLUSTER_SPEC task type/index": ([_get(cs, "task", "type"), _get(cs, "task", "index")]
                                         if cs is not MISSING else MISSING),
        "RIGDECK_POOL/RIGDECK_POOL_REPLICA": [VERTEX_POOLS.get(str(pool)), replica],
    })
    flat: list[str] = []
    if isinstance(cluster, dict):
        for name in ("workerpool0", "workerpool1", "workerpool2", "workerpool3"):
            flat += list(cluster.get(name) or [])
    p.agree("replica addresses in node order", {
        "CLUSTER_SPEC endpoints (workerpool0..3)": [_split_endpoint(e)[0] for e in flat] if flat else MISSING,
        "RIGDECK_HOST_ADDRS": rd_addrs,
    })
    own = _get(cluster, VERTEX_POOLS.get(str(pool), "?"), replica) if isinstance(replica, int) else MISSING
    own_addr, own_port = _split_endpoint(own) if isinstance(own, str) else (MISSING, MISSING)
    p.agree("own address", {
        "CLUSTER_SPEC own endpoint": own_addr,
        "RIGDECK_HOST_ADDRS[RIGDECK_NODE_RANK]": (rd_addrs[node_rank] if isinstance(rd_addrs, list)
                                                  and isinstance(node_rank, int) and 0 <= node_rank < len(rd_addrs)
                                                  else MISSING),
    })
    same_addr = [_split_endpoint(e) for e in flat if _split_endpoint(e)[0] == own_addr]
    p.agree("no other replica on this address has this port", {
        "replicas on this address with this port": (sum(1 for _a, port in same_addr if port == own_port)
                                                    if flat else MISSING),
        "expected": 1})
    # ---- Vertex: TF_CONFIG ----------------------------------------------------------------------
    tf_type = TF_TASK_TYPES.get(str(pool))
    if pool == "reduction_server":
        p.agree("no TF_CONFIG for a reduction server", {"TF_CONFIG present": tf is not MISSING,
                                                         "expected": False})
    elif isinstance(n, int) and n > 1:
        tfc = _get(tf, "cluster")
        p.agree("TF_CONFIG task", {
            "TF_CONFIG task type/index": ([_get(tf, "task", "type"), _get(tf, "task", "index")]
                                          if tf is not MISSING else MISSING),
            "RIGDECK_POOL/RIGDECK_POOL_REPLICA": [tf_type, replica]})
        groups_now = p.json_env("SM_INSTANCE_GROUPS")
        want: dict[str, Any] = {}
        if isinstance(cluster, dict):
            want["chief"] = cluster.get("workerpool0")
            if cluster.get("workerpool1"):
                want["worker"] = cluster.get("workerpool1")
            if isinstance(groups_now, list) and "parameter_server" in groups_now:
                want["ps"] = cluster.get("workerpool2")
        p.agree("TF_CONFIG cluster (chief/worker/ps, no evaluator)", {
            "TF_CONFIG cluster": tfc if isinstance(tfc, dict) else MISSING,
            "from CLUSTER_SPEC": want if isinstance(cluster, dict) else MISSING})
        if tf is not MISSING:
            p.agree("TF_CONFIG own endpoint", {
                "TF_CONFIG cluster[task]": (_get(tf, "cluster", tf_type, replica)
                                            if tf_type != "evaluator" else own),
                "CLUSTER_SPEC own endpoint": own})
    # ---- SageMaker: heterogeneous cluster -------------------------------------------------------
    algo = f"algo-{node_rank + 1}" if isinstance(node_rank, int) else MISSING
    p.agree("SageMaker current host", {
        "algo-(RIGDECK_NODE_RANK+1)": algo,
        "SM_CURRENT_HOST": p.raw("SM_CURRENT_HOST"),
        "resourceconfig.json current_host": _get(rc, "current_host"),
        "SM_RESOURCE_CONFIG current_host": _get(sm_rc, "current_host")})
    p.agree("SageMaker hosts", {
        "algo-1..N": [f"algo-{k + 1}" for k in range(n)] if isinstance(n, int) else MISSING,
        "SM_HOSTS": p.json_env("SM_HOSTS"),
        "resourceconfig.json hosts": _get(rc, "hosts")})
    p.agree("SageMaker current group", {
        "RIGDECK_POOL": pool,
        "SM_CURRENT_INSTANCE_GROUP": p.raw("SM_CURRENT_INSTANCE_GROUP"),
        "resourceconfig.json current_group_name": _get(rc, "current_group_name")})
    groups = _get(rc, "instance_groups")
    p.agree("SageMaker instance groups", {
        "resourceconfig.json instance_groups names": ([g.get("instance_group_name") for g in groups]
                                                      if isinstance(groups, list) else MISSING),
        "SM_INSTANCE_GROUPS": p.json_env("SM_INSTANCE_GROUPS")})
    groups_dict = p.json_env("SM_INSTANCE_GROUPS_DICT")
    p.agree("SageMaker instance groups dict", {  # a JSON object: its keys come sorted
        "SM_INSTANCE_GROUPS_DICT": groups_dict,
        "resourceconfig.json instance_groups by name": (
            {g.get("instance_group_name"): g for g in groups} if isinstance(groups, list) else MISSING)})
    if isinstance(groups, list) and isinstance(cluster, dict):
        # each group's hosts are the algo names of its pool's replicas, in node order
        k = 0
        got, expect = [], []
        for g in groups:
            name = g.get("instance_group_name")
            count = len(cluster.get(VERTEX_POOLS.get(name, "?")) or [])
            got.append([name, g.get("hosts")])
            expect.append([name, [f"algo-{k + j + 1}" for j in range(count)]])
            k += count
        p.agree("SageMaker groups match the Vertex pools", {"resourceconfig.json instance_groups": got,
                                                             "from CLUSTER_SPEC": expect})
        mine = next((g.get("hosts") for g in groups if g.get("instance_group_name") == pool), MISSING)
        p.agree("SageMaker current group hosts", {
            "SM_CURRENT_INSTANCE_GROUP_HOSTS": p.json_env("SM_CURRENT_INSTANCE_GROUP_HOSTS"),
            "resourceconfig.json group of RIGDECK_POOL": mine})
    p.agree("SageMaker heterogeneous", {"SM_IS_HETERO": p.raw("SM_IS_HETERO"), "expected": "true"})
    # ---- torch: the world is the primary and the workers ----------------------------------------
    member = pool in WORLD_POOLS
    p.agree("in torch's world", {"RIGDECK_IN_WORLD": in_world, "pool is primary/worker": "1" if member else "0"})
    world = rank = local_rank = MISSING
    if member:
        ep0 = (_split_endpoint(cluster["workerpool0"][0])
               if isinstance(cluster, dict) and cluster.get("workerpool0") else None)
        p.agree("master address", {"MASTER_ADDR": p.raw("MASTER_ADDR"),
                                   "RIGDECK_MASTER_ADDR": p.raw("RIGDECK_MASTER_ADDR"),
                                   "CLUSTER_SPEC workerpool0[0]": ep0[0] if ep0 else MISSING})
        p.agree("master port", {"MASTER_PORT": p.int_env("MASTER_PORT"),
                                "RIGDECK_MASTER_PORT": p.int_env("RIGDECK_MASTER_PORT"),
                                "CLUSTER_SPEC workerpool0[0]": ep0[1] if ep0 else MISSING})
        p.agree("node rank", {"NODE_RANK": p.int_env("NODE_RANK"),
                              "0 for the primary, else 1 + replica": (0 if pool == "primary" else 1 + replica)
                              if isinstance(replica, int) else MISSING})
        world = p.agree("world size", {
            "WORLD_SIZE": p.int_env("WORLD_SIZE"),
            "hostfile slots (the world's)": _hostfile_slots(p)})
        rank = p.agree("global rank", {"RANK": p.int_env("RANK"), "RIGDECK_RANK": p.int_env("RIGDECK_RANK")})
        local_rank = p.agree("local rank", {"LOCAL_RANK": p.int_env("LOCAL_RANK"),
                                            "RIGDECK_LOCAL_RANK": p.int_env("RIGDECK_LOCAL_RANK")})
        p.agree("local world size", {"LOCAL_WORLD_SIZE": p.int_env("LOCAL_WORLD_SIZE"),
                                     "RIGDECK_LOCAL_WORLD_SIZE": p.int_env("RIGDECK_LOCAL_WORLD_SIZE")})
    else:
        present = [v for v in TORCH_VARS if v in env]
        p.agree("no torch variables outside the world", {"torch variables set": present, "expected": []})
        local_rank = p.int_env("RIGDECK_LOCAL_RANK")
    p.agree("job id", {"RIGDECK_JOB_ID": p.raw("RIGDECK_JOB_ID"),
                       "TRAINING_JOB_NAME": p.raw("TRAINING_JOB_NAME"),
                       "CLUSTER_SPEC job.job_id": _get(cs, "job", "job_id")})
    # ---- its own endpoint: free on its own host at launch ----------------------------------------
    port_check: Any = None
    if local_rank == 0 and isinstance(own_addr, str) and isinstance(own_port, int):
        port_check = port_free(own_addr, own_port)
        p.agree("own endpoint port free at launch", {f"bind {own_addr}:{own_port}": port_check,
                                                     "expected": True})
    for var in ("RIGDECK_METRICS_DIR", "RIGDECK_JOB_DIR", "SM_MODEL_DIR"):
        p.agree(var + " is a directory", {var: os.path.isdir(env.get(var) or ""), "expected": True})
    return {"rank": rank, "world": world, "local_rank": local_rank, "node_rank": node_rank,
            "host": p.raw("RIGDECK_CURRENT_HOST"), "hosts": rd_hosts,
            "rigdeck_rank": p.int_env("RIGDECK_RANK"), "pool": pool, "replica": replica,
            "in_world": member, "endpoint": own, "port_free": port_check}


def _hostfile_slots(p: Probe) -> Any:
    path = p.raw("RIGDECK_HOSTFILE")
    if path is MISSING:
        return MISSING
    try:
        with open(path) as f:
            return sum(int(x.split("=", 1)[1]) for line in f for x in line.split()[1:]
                       if x.startswith("slots="))
    except (OSError, ValueError) as e:
        p.fail("read hostfile", {"RIGDECK_HOSTFILE": path}, str(e))
        return MISSING


def run_collectives(p: Probe, me: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    rank, world = me["rank"], me["world"]
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(world))
    if "LOCAL_RANK" not in os.environ and isinstance(me["local_rank"], int):
        os.environ["LOCAL_RANK"] = str(me["local_rank"])
    timeout = datetime.timedelta(seconds=float(os.environ.get("PROBE_TIMEOUT_S", "120")))
    t0 = time.monotonic()
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                            timeout=timeout)
    try:
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        expected = world * (world + 1) / 2
        p.agree("all_reduce(rank+1)", {"sum": float(t.item()),
                                       "world*(world+1)/2": float(expected)})
        # all_gather of small int tensors (all_gather_object needs numpy in some torch builds)
        host = me["host"] if isinstance(me["host"], str) else ""
        node_rank = me["node_rank"] if isinstance(me["node_rank"], int) else -1
        mine = torch.tensor([rank, node_rank, zlib.crc32(host.encode())], dtype=torch.int64)
        gathered = [torch.zeros(3, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(gathered, mine)
        peers = [{"rank": int(g[0]), "node_rank": int(g[1]), "host_crc32": int(g[2])}
                 for g in gathered]
        p.agree("every rank once", {"ranks seen": sorted(q["rank"] for q in peers),
                                    "range(world)": list(range(world))})
        hosts = me["hosts"] if isinstance(me["hosts"], list) else []
        wrong = [q for q in peers if not 0 <= q["node_rank"] < len(hosts)
                 or zlib.crc32(str(hosts[q["node_rank"]]).encode()) != q["host_crc32"]]
        p.agree("peers' hosts match their node ranks", {"mismatched peers": wrong, "expected": []})
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return {"sum": float(t.item()), "peers": peers, "seconds": round(time.monotonic() - t0, 3)}


def main() -> int:
    p = Probe()
    pooled = bool(os.environ.get("RIGDECK_POOL"))
    try:
        me = check_pool_views(p) if pooled else check_views(p)
    except Exception:  # a bug or a wholly malformed view: report it, do not hide it
        p.fail("reading the views", {}, traceback.format_exc(limit=-3).strip())
        me = {"rank": MISSING, "world": MISSING}
    collective: Any = None
    if isinstance(me.get("rank"), int) and isinstance(me.get("world"), int):
        try:
            collective = run_collectives(p, me)
        except Exception as e:
            p.fail("gloo collectives", {}, f"{type(e).__name__}: {e}")
    rank = me.get("rank")
    if pooled:  # every replica, in the world or not, reports under its rigdeck rank
        rank = me.get("rigdeck_rank")
    report = {
        "rank": rank if isinstance(rank, int) else None,
        "ok": p.ok,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "failures": [c for c in p.checks if not c["ok"]],
        "checks": p.checks,
        "collective": collective,
        "values": p.values,
        # What a [model_parallel] job's runtime reads (None for other jobs): every launcher must pass it on.
        "model_parallel": os.environ.get("RIGDECK_MODEL_PARALLEL"),
    }
    if pooled:  # a pool job's replica: what it is, its endpoint, whether its port was free
        report["pool"] = {k: (None if me.get(k) is MISSING else me.get(k))
                          for k in ("pool", "replica", "in_world", "endpoint", "port_free", "node_rank", "host")}
        report["torch_rank"] = me.get("rank") if isinstance(me.get("rank"), int) else None
    job_dir = os.environ.get("RIGDECK_JOB_DIR")
    if job_dir:
        out = os.path.join(job_dir, "probe")
        os.makedirs(out, exist_ok=True)
        name = f"rank-{rank}.json" if isinstance(rank, int) else f"rank-unknown-{os.getpid()}.json"
        tmp = os.path.join(out, name + ".tmp")
        with open(tmp, "w") as f:
            json.dump(report, f, indent=1, default=lambda o: None if o is MISSING else str(o))
        os.replace(tmp, os.path.join(out, name))
    if not p.ok:
        for c in report["failures"]:
            names = ", ".join(c["sources"]) or "-"
            who = rank if isinstance(rank, int) else "?"
            sys.stderr.write(f"probe rank {who}: {c['check']}: {c['why']} [sources: {names}]\n")
        return 1
    # one write per line, so that ranks sharing a pipe do not interleave within a line
    sys.stdout.write("step=1 loss=0.0\n")
    sys.stdout.flush()
    if pooled:
        sys.stdout.write(f"probe rank {rank} ok ({me['pool']} {me['replica']} on {me['host']}, "
                         f"in world: {me['in_world']})\n")
    else:
        sys.stdout.write(f"probe rank {rank} ok (world {me['world']}, node {me['node_rank']})\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip the teardown where gloo's threads can abort torch (SIGABRT)
