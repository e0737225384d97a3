"""Links to experiment trackers that a rank prints: W&B and MLflow runs, TensorBoard.

The one place that knows what such a line looks like (``links_in``) and where the links a rank
printed are kept: ``links/rank-R.jsonl`` in the job's directory, one record a link, written by
the rank's wrapper as the rank prints (``agent.rankexec.LinkParser``: the controller never reads
a log for them) and read back for ``job_status`` (``read_links``).

What the trackers print (colour codes are taken off before a line is matched):

- **W&B**: ``wandb: 🚀 View run at https://wandb.ai/ENTITY/PROJECT/runs/RUNID`` when a run starts,
  ``wandb: 🚀 View run NAME at: https://...`` when it ends. A self-hosted server has its own host,
  so a link is W&B's by the ``wandb:`` before it (or a ``wandb.ai`` host: a script printing
  ``wandb.run.url``), and a run's by ``/runs/`` in its path. The project and sweep lines
  (``⭐️ View project at``, ``🧹 View sweep at``) are no run: left out.
- **MLflow**: ``🏃 View run NAME at: http://HOST:PORT/#/experiments/EXP/runs/RUNID`` (after the
  logging module's prefix, if any); a run's page is ``.../experiments/EXP/runs/RUNID``, whoever
  printed it. ``🧪 View experiment at:`` is no run: left out.
- **TensorBoard**: a tensorboard.dev experiment (``https://tensorboard.dev/experiment/ID/``), a
  URL that opens one of TensorBoard's dashboards (``http://host:6006/#scalars``), and the line a
  TensorBoard server prints when it starts (``TensorBoard 2.15.1 at http://host:6006/ (Press
  CTRL+C to quit)``).

A URL is taken up to the first space, quote, angle bracket or control character (an escape
sequence cannot ride along into the app), without the punctuation that ends a sentence.

Stdlib only, Python 3.9+.
"""
from __future__ import annotations

import json
import os
import re
import time

TYPE_CHECKING = False  # (mypy reads it as True) typing is not imported by a rank's or job's start
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Optional, Tuple

KINDS = ("wandb", "mlflow", "tensorboard")
LINKS_DIR = "links"  # in the job's directory: rank-R.jsonl, one per rank that printed a link
MAX_URL = 2048  # characters: a longer "URL" is no tracker's
MAX_PER_RANK = 16  # links one rank's wrapper keeps: a rank printing a new URL a step is not read
MAX_LINKS = 32  # links job_status returns (per host)
READ_BYTES = 65536  # of each rank's file: the first links are the ones kept

URL_RE = re.compile(r"https?://[^\s\x00-\x1f\x7f-\x9f'\"<>`\\]+", re.IGNORECASE)
TRAILING = ".,;:!?)]}"  # a sentence's end after a URL, not part of it
WANDB_PREFIX_RE = re.compile(r"(?<![\w.-])wandb:\s", re.IGNORECASE)
WANDB_HOST_RE = re.compile(r"^https?://(?:[\w-]+\.)*wandb\.ai(?::\d+)?/", re.IGNORECASE)
RUN_PATH_RE = re.compile(r"/runs/[^/?#\s]+")
MLFLOW_RUN_RE = re.compile(r"/experiments/[^/?#\s]+/runs/[^/?#\s]+")
MLFLOW_LINE_RE = re.compile(r"\bView run\b.*\bat:\s*$")
TENSORBOARD_DEV_RE = re.compile(r"^https?://tensorboard\.dev/experiment/[^/?#\s]+", re.IGNORECASE)
TENSORBOARD_DASHBOARD_RE = re.compile(r"#(?:scalars|timeseries|images|graphs|distributions|histograms|"
                                      r"hparams|text|pr_curves|projector|custom_scalars)\b")
TENSORBOARD_LINE_RE = re.compile(r"\bTensorBoard \S+ at\s*$")
FILE_RE = re.compile(r"^rank-(\d+)\.jsonl$")


def _kind(before: str, url: str) -> Optional[str]:
    """Which tracker's page ``url`` is, from the URL and what the line says before it."""
    if RUN_PATH_RE.search(url) and (WANDB_PREFIX_RE.search(before) or WANDB_HOST_RE.match(url)):
        return "wandb"
    if MLFLOW_RUN_RE.search(url) or (MLFLOW_LINE_RE.search(before) and RUN_PATH_RE.search(url)):
        return "mlflow"
    if TENSORBOARD_DEV_RE.match(url) or TENSORBOARD_DASHBOARD_RE.search(url) or TENSORBOARD_LINE_RE.search(before):
        return "tensorboard"
    return None


def links_in(line: str) -> List[Tuple[str, str]]:
    """(kind, URL) of each tracker link in one output line (its colour codes taken off), in the
    order they appear."""
    out = []
    for m in URL_RE.finditer(line):
        url = m.group(0).rstrip(TRAILING)
        if len(url) > MAX_URL:
            continue
        kind = _kind(line[: m.start()], url)
        if kind is not None:
            out.append((kind, url))
    return out


def links_path(job_dir: str, rank: int) -> str:
    return os.path.join(job_dir, LINKS_DIR, "rank-%d.jsonl" % rank)


def link_record(kind: str, url: str, rank: int) -> Dict[str, Any]:
    """What ``links/rank-R.jsonl`` keeps of one link: its kind, URL, rank and when it was seen."""
    return {"kind": kind, "url": url, "rank": rank, "time": time.time()}


def _usable(rec: Any) -> bool:
    if not isinstance(rec, dict) or rec.get("kind") not in KINDS:
        return False
    url, rank = rec.get("url"), rec.get("rank")
    return (isinstance(url, str) and len(url) <= MAX_URL and URL_RE.fullmatch(url) is not None
            and isinstance(rank, int) and not isinstance(rank, bool))


def read_link_file(path: str) -> List[Dict[str, Any]]:
    """The records of one rank's links file, from its first ``READ_BYTES`` (a cut last line and
    anything that is no link record are skipped)."""
    try:
        with open(path, "rb") as f:
            data = f.read(READ_BYTES)
    except OSError:
        return []
    out = []
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if _usable(rec):
            out.append({"kind": rec["kind"], "url": rec["url"], "rank": rec["rank"], "time": rec.get("time")})
    return out


def first_seen(records: Iterable[Dict[str, Any]], limit: int = MAX_LINKS) -> List[Dict[str, Any]]:
    """One record per URL, the first one printed (by time, then rank), at most ``limit``."""
    def when(rec: Dict[str, Any]) -> Tuple[float, int]:
        t = rec.get("time")
        return (float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else 0.0, rec["rank"])

    out = []  # type: List[Dict[str, Any]]
    seen = set()  # type: set
    for rec in sorted(records, key=when):
        if rec["url"] not in seen and len(out) < limit:
            seen.add(rec["url"])
            out.append(rec)
    return out


def read_links(job_dir: str) -> List[Dict[str, Any]]:
    """Every link the job's ranks on this host printed (each URL once, first seen first), for
    ``job_status``: ``{"kind", "url", "rank", "time"}``."""
    try:
        names = os.listdir(os.path.join(job_dir, LINKS_DIR))
    except OSError:
        return []
    records = []  # type: List[Dict[str, Any]]
    for name in sorted(names):
        if FILE_RE.match(name):
            records += read_link_file(os.path.join(job_dir, LINKS_DIR, name))
    return first_seen(records)
