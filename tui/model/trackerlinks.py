"""A job's links to experiment trackers (a W&B or MLflow run, TensorBoard), as the faces show them.

The ranks' wrappers find them in what the ranks print (``agent/trackers.py`` owns the patterns and
the kinds); each host's ``job_status`` has the ones its ranks printed (``links``: ``kind``, ``url``,
``rank``, ``time``). ``tracker_links`` joins the hosts' lists: each URL once, the first printed
first, with the host it was printed on.

A URL is drawn in the operator's terminal and made a hyperlink there, so a record is taken only
when it is what the agent writes (agent/trackers.py's ``URL_RE`` and ``KINDS``): an ``http(s)``
URL without spaces, quotes or control characters (nothing in it can start an escape sequence),
one of the kinds; a rank that is no whole number is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.trackers import KINDS, MAX_URL, URL_RE

MAX_LINKS = 32  # per job


@dataclass(frozen=True)
class TrackerLink:
    """One link: its tracker (``wandb``, ``mlflow``, ``tensorboard``), the URL, and which rank on
    which host printed it first."""

    kind: str
    url: str
    rank: int | None
    host: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "url": self.url, "rank": self.rank, "host": self.host}

    @classmethod
    def from_dict(cls, d: Any, host: str | None = None) -> TrackerLink | None:
        """The link a record holds (``host``: where it came from, else the record's own), or
        None for a record that is no link (see the module's docstring)."""
        if not isinstance(d, Mapping):
            return None
        kind, url, rank = d.get("kind"), d.get("url"), d.get("rank")
        host = host if host is not None else d.get("host")
        if not (kind in KINDS and isinstance(url, str) and len(url) <= MAX_URL and URL_RE.fullmatch(url)
                and isinstance(host, str)):
            return None
        if isinstance(rank, bool) or not isinstance(rank, int):
            rank = None
        return cls(kind, url, rank, host)


def _when(rec: Mapping[str, Any]) -> float:
    t = rec.get("time") if isinstance(rec, Mapping) else None
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else 0.0


def tracker_links(states: Mapping[str, Any]) -> tuple[TrackerLink, ...]:
    """The links the job's hosts report (``states``: host -> its job status, anything else for a
    host that did not answer), each URL once: the first printed (by time, then rank), at most
    ``MAX_LINKS``."""
    found: list[tuple[float, int, TrackerLink]] = []
    for host, st in states.items():
        if not isinstance(st, Mapping) or not isinstance(st.get("links"), list):
            continue
        for rec in st["links"]:
            link = TrackerLink.from_dict(rec, host)
            if link is not None:
                found.append((_when(rec), link.rank if link.rank is not None else -1, link))
    out: list[TrackerLink] = []
    seen: set[str] = set()
    for _, _, link in sorted(found, key=lambda f: (f[0], f[1])):
        if link.url not in seen and len(out) < MAX_LINKS:
            seen.add(link.url)
            out.append(link)
    return tuple(out)


def links_json(links: tuple[TrackerLink, ...]) -> list[dict[str, Any]]:
    return [link.to_dict() for link in links]


def links_from_json(items: Any) -> tuple[TrackerLink, ...]:
    """The inverse of ``links_json`` (anything that is no link left out)."""
    links = (TrackerLink.from_dict(d) for d in (items if isinstance(items, list) else ()))
    return tuple(link for link in links if link is not None)
