"""Job kinds on a host: one module each, behind :class:`agent.kinds.base.Kind`.

A new kind is a module with a ``KIND`` and one line in ``KINDS``. The first shape that matches a
plan is its shape (``plain`` matches every plan, so it comes last of them); every trait that
matches adds to it, in this order.
"""
from __future__ import annotations

from agent.kinds import pipeline, plain, pools, processing, trial
from agent.kinds.base import Kind

TYPE_CHECKING = False  # (mypy reads it as True) typing is not imported by a rank's or job's start
if TYPE_CHECKING:
    from typing import Any, Dict, List

KINDS = (
    processing.KIND,
    pools.KIND,
    plain.KIND,
    trial.KIND,
    pipeline.KIND,
)


def shape_of(plan: Dict[str, Any]) -> Kind:
    """The one shape of ``plan``."""
    return next(k for k in KINDS if k.shape and k.matches(plan))


def traits_of(plan: Dict[str, Any]) -> List[Kind]:
    """The traits ``plan`` has, in registry order."""
    return [k for k in KINDS if not k.shape and k.matches(plan)]
