"""A ``[container]`` table as checked: the image a job's ranks run in, and the runtime.

A job spec's ``[container]`` (tui.model.jobspec) is every host's container of the job; a worker
pool's ``container`` (tui.model.poolspec) is that pool's, over the job's; a pipeline step's
``container`` (tui.model.pipelinespec) is that step's job's. The checks of its fields are the job
spec's (``tui.model.jobspec.parse_container``); this module holds only the value, so that the
pool and pipeline models can carry it without importing the job spec. docs/containers.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CONTAINER_RUNTIMES", "ContainerSpec"]

CONTAINER_RUNTIMES = ("podman", "docker", "apptainer")


@dataclass(frozen=True)
class ContainerSpec:
    """``[container]``: every host runs its ranks in one container of ``image`` (a name in the
    host's image store, or an archive path on the host: ``podman save``'s, ``docker save``'s;
    for Apptainer a SIF file or sandbox directory), with ``runtime``.
    ``mounts``: ``"SRC:DST"`` or ``"SRC:DST:ro"`` (absolute paths on the host and inside);
    ``workdir``: where ranks start inside (default: the job's workdir, mounted at its own path);
    ``options``: more options for the runtime's ``run``, as they are (an argv, no shell)."""

    image: str
    runtime: str = "podman"
    mounts: tuple[str, ...] = ()
    workdir: str | None = None
    options: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"image": self.image, "runtime": self.runtime, "mounts": list(self.mounts),
                "workdir": self.workdir, "options": list(self.options)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ContainerSpec:
        return cls(image=str(d["image"]), runtime=str(d.get("runtime") or "podman"),
                   mounts=tuple(d.get("mounts") or ()), workdir=d.get("workdir"),
                   options=tuple(d.get("options") or ()))
