"""Deterministic data sharding: the same split on every host, without communication."""

from __future__ import annotations

import random
from typing import Iterable, List, Optional, TypeVar

T = TypeVar("T")


def shard(items: Iterable[T], rank: Optional[int] = None, world_size: Optional[int] = None, *,
          by: str = "rank", seed: Optional[int] = None) -> List[T]:
    """This rank's (or node's) share of ``items`` (file names, keys): SageMaker's ShardedByS3Key.

    Items are sorted (so every host, whatever order it listed them in, agrees), shuffled with
    ``random.Random(seed)`` when a seed is given, then dealt round-robin: every item lands in
    exactly one shard and shard sizes differ by at most one. ``by="node"`` splits across hosts
    (node rank / node count) instead of ranks. ``rank``/``world_size`` default to
    ``cluster_info()``'s.
    """
    if by not in ("rank", "node"):
        raise ValueError(f"shard(by={by!r}): expected 'rank' or 'node'")
    if rank is None or world_size is None:
        from runtime.cluster import cluster_info

        info = cluster_info()
        if rank is None:
            rank = info.rank if by == "rank" else info.node_rank
        if world_size is None:
            world_size = info.world_size if by == "rank" else info.num_nodes
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"shard: rank {rank} is outside 0..{world_size - 1}")
    ordered = sorted(items)  # type: ignore[type-var]
    if seed is not None:
        random.Random(seed).shuffle(ordered)
    return ordered[rank::world_size]
