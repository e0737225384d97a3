"""``rigdeck tensorboard``, the plain part: which bytes of a job's TensorBoard files to fetch, and
where each file goes on the workstation. No I/O.

The hosts list the files TensorBoard reads under each of the job's TensorBoard directories
(``job_tensorboard_files``: path, size, mtime, id: device and inode). The workstation says what
it holds of each (``Have``: the id, mtime and bytes it copied). ``start_offset`` decides from
where to read: event files are only ever appended to, so a file that grew is read from where the
copy ends; a file that shrank, or another file at the same path (a new id), is read again from
byte 0, as is any other file (a plugin's asset) that changed at all.

Each host's files go to ``<local dir>/<host>/<path>``; a host where the job had several
TensorBoard directories (a pool job whose pools set their own) gets one folder per directory,
named after its path.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any

from tui.model.codesync import CodeSyncError, check_path


class TensorboardSyncError(ValueError):
    """A listing or a piece that cannot be taken as it is; the message says why."""


@dataclass(frozen=True)
class RemoteFile:
    """One file as its host lists it."""

    path: str  # relative to its directory, ``/``-separated
    size: int
    mtime_ns: int
    id: str  # device and inode on the host: another id is another file

    @classmethod
    def from_row(cls, row: Any) -> RemoteFile:
        """From a listing's ``[path, size, mtime_ns, id]``; a bad row is an error naming it."""
        if (not isinstance(row, (list, tuple)) or len(row) != 4 or not isinstance(row[0], str)
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in row[1:3])
                or not isinstance(row[3], str)):
            raise TensorboardSyncError(f"a file must be [path, size, mtime_ns, id], not {row!r}")
        return cls(checked_path(row[0]), row[1], row[2], row[3])


@dataclass(frozen=True)
class Have:
    """What the workstation holds of one file: its first ``size`` bytes, as of ``id``/``mtime_ns``."""

    id: str
    size: int
    mtime_ns: int


def checked_path(path: str) -> str:
    """``path`` when it is relative and stays inside its directory (no ``..``, no ``/`` first)."""
    try:
        return check_path(path)
    except CodeSyncError as e:
        raise TensorboardSyncError(str(e)) from None


def appendable(path: str) -> bool:
    """An event file: TensorBoard's writers only ever append to one."""
    return ".tfevents." in posixpath.basename(path)


def start_offset(remote: RemoteFile, have: Have | None) -> int | None:
    """Where to read ``remote`` from, or None when the copy is whole: 0 for a file not held,
    another file at the path, one that shrank, or (not an event file) one changed in any way;
    else the end of the copy when the file grew."""
    if have is None:
        return 0 if remote.size > 0 else None
    if have.id != remote.id or remote.size < have.size:
        return 0
    if appendable(remote.path) or have.mtime_ns == remote.mtime_ns:
        return have.size if remote.size > have.size else None
    return 0


def dir_label(root: str) -> str:
    """A host directory's path as one folder name: ``/data/tb/a`` -> ``data_tb_a``."""
    return "_".join(p for p in root.split("/") if p) or "root"


def local_parts(host: str, root: str, roots: list[str], path: str) -> list[str]:
    """Where ``path`` of ``root`` on ``host`` goes under the local directory, as names:
    ``[host, *path]``, with the directory's label after the host when it has several."""
    if not host or "/" in host or host in (".", ".."):
        raise TensorboardSyncError(f"a host name cannot be a folder name: {host!r}")
    label = [dir_label(root)] if len(roots) > 1 else []
    return [host, *label, *checked_path(path).split("/")]


def have_row(host: str, root: str, path: str, have: Have) -> list[Any]:
    """One entry of the pull's ``have`` (what crosses to the controller)."""
    return [host, root, path, have.id, have.size, have.mtime_ns]


def parse_have(rows: Any) -> dict[tuple[str, str, str], Have]:
    """The pull's ``have`` as (host, dir, path) -> Have; a bad entry is an error naming it."""
    out: dict[tuple[str, str, str], Have] = {}
    for row in rows or ():
        if (not isinstance(row, (list, tuple)) or len(row) != 6 or not all(isinstance(v, str) for v in row[:4])
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in row[4:])):
            raise TensorboardSyncError(f"a have entry must be [host, dir, path, id, size, mtime_ns], not {row!r}")
        out[(row[0], row[1], row[2])] = Have(row[3], row[4], row[5])
    return out
