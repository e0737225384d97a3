"""A sweep's trial: its number (``plan["trial"]``, a string counting from "1") reaches the cloud
contracts, so a script written for Vertex's hyperparameter tuning finds itself: ``task.trial`` in
CLUSTER_SPEC and TF_CONFIG, ``CLOUD_ML_TRIAL_ID``, and rigdeck's RIGDECK_TRIAL/RIGDECK_SWEEP_ID."""
from __future__ import annotations

from agent.kinds.base import Kind, Layout

TYPE_CHECKING = False  # (mypy reads it as True) typing is not imported by a rank's or job's start
if TYPE_CHECKING:
    from typing import Any, Dict, Optional


def trial_of(plan: Dict[str, Any]) -> Optional[str]:
    """The sweep trial this job is, or None."""
    trial = plan.get("trial")
    return None if trial is None or trial == "" else str(trial)


class Trial(Kind):
    name = "trial"

    def matches(self, plan: Dict[str, Any]) -> bool:
        return trial_of(plan) is not None

    def node_env(self, plan: Dict[str, Any], node_index: int, layout: Layout) -> Dict[str, str]:
        trial = str(trial_of(plan))
        env = {"RIGDECK_TRIAL": trial}
        if plan.get("sweep_id"):
            env["RIGDECK_SWEEP_ID"] = str(plan["sweep_id"])
        env["CLOUD_ML_TRIAL_ID"] = trial  # cloudml-hypertune's name for it
        return env

    def vertex_task(self, plan: Dict[str, Any]) -> Dict[str, Any]:
        return {"trial": trial_of(plan)}


KIND = Trial()
