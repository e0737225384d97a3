"""A pipeline's step that continues from an earlier step (``continue_from``): the earlier step's
checkpoints, staged on this host as ``plan["seed_checkpoint"]``, are copied into the job's
checkpoint dir before its first attempt (a restart keeps what the job wrote since)."""
from __future__ import annotations

from agent.kinds.base import Kind

TYPE_CHECKING = False  # (mypy reads it as True) typing is not imported by a rank's or job's start
if TYPE_CHECKING:
    from typing import Any, Dict


class PipelineStep(Kind):
    name = "pipeline step"

    def matches(self, plan: Dict[str, Any]) -> bool:
        return bool(plan.get("seed_checkpoint"))

    def prepare(self, plan: Dict[str, Any], node_index: int, checkpoint_dir: str) -> None:
        if int(plan.get("restart_count") or 0):
            return
        # agent.artifacts builds on clusterfiles (where a job's checkpoints are): imported here.
        from agent.artifacts import seed_checkpoint

        seed_checkpoint(str(plan["seed_checkpoint"]), checkpoint_dir)


KIND = PipelineStep()
