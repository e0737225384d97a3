"""rigdeck runtime: what training ranks import (stdlib only; torch loaded lazily).

- ``cluster_info()``: this rank's place in the job, from rigdeck, torch, SageMaker, Vertex or
  Open MPI variables (``runtime.cluster``)
- ``init_distributed()``, ``ddp()``, ``scaled_lr()``, ``finish()`` (a rank's end),
  ``shutdown_distributed()``, ``exit_process()``
  (``runtime.distributed``)
- ``report()``: metrics lines for the agent (``runtime.metrics``); with ``step=`` it adds
  ``step_time``, and the ``data_time``/``comm_time`` that ``timed()`` and ``comm_timer()``
  measured (``runtime.timing``)
- ``section()``: ``with runtime.section("eval"):`` marks a section of a rank's work, so rigdeck
  judges a hang there against that section's own pace (``runtime.metrics``)
- ``Checkpointer``: checkpoint ownership and atomic saves, each save a ``checkpoint`` section on
  every rank (``runtime.checkpoint``)
- ``shard()``: deterministic data sharding (``runtime.sharding``)
- ``pipeline_stage()``: this rank's pipeline stage from a ``[model_parallel]`` spec: profiling,
  automatic partitioning (``runtime.partition``), a torch.distributed.pipelining schedule
  (``runtime.modelparallel``)

Submodules load on first use, so ``import runtime`` costs next to nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "CheckpointError": "runtime.checkpoint",
    "Checkpointer": "runtime.checkpoint",
    "ClusterInfo": "runtime.cluster",
    "ClusterInfoError": "runtime.cluster",
    "cluster_info": "runtime.cluster",
    "ddp": "runtime.distributed",
    "exit_process": "runtime.distributed",
    "finish": "runtime.distributed",
    "init_distributed": "runtime.distributed",
    "scaled_lr": "runtime.distributed",
    "Reporter": "runtime.metrics",
    "report": "runtime.metrics",
    "section": "runtime.metrics",
    "shard": "runtime.sharding",
    "pipeline_stage": "runtime.modelparallel",
    "PipelineStageRunner": "runtime.modelparallel",
    "timed": "runtime.timing",
    "comm_timer": "runtime.timing",
    "CommTimer": "runtime.timing",
    "shutdown_distributed": "runtime.distributed",
}
__all__ = [
    "CheckpointError",
    "Checkpointer",
    "ClusterInfo",
    "ClusterInfoError",
    "CommTimer",
    "PipelineStageRunner",
    "Reporter",
    "cluster_info",
    "comm_timer",
    "ddp",
    "exit_process",
    "finish",
    "init_distributed",
    "pipeline_stage",
    "report",
    "scaled_lr",
    "section",
    "shard",
    "shutdown_distributed",
    "timed",
]

if TYPE_CHECKING:
    from runtime.checkpoint import Checkpointer, CheckpointError
    from runtime.cluster import ClusterInfo, ClusterInfoError, cluster_info
    from runtime.distributed import (
        ddp,
        exit_process,
        finish,
        init_distributed,
        scaled_lr,
        shutdown_distributed,
    )
    from runtime.metrics import Reporter, report, section
    from runtime.modelparallel import PipelineStageRunner, pipeline_stage
    from runtime.sharding import shard
    from runtime.timing import CommTimer, comm_timer, timed


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_EXPORTS))
