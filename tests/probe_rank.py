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
    try:
        me = check_views(p)
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
    sys.stdout.write(f"probe rank {rank} ok (world {me['world']}, node {me['node_rank']})\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip the teardown where gloo's threads can abort torch (SIGABRT)
