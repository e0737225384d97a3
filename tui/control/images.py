"""``rigdeck image push IMAGE [HOSTS]``: a container image of this machine's Podman store put
into each host's, as synced code is shipped (tui/remote/codesync.py).

The image is saved as an OCI directory (``podman save --format oci-dir``): its layers and config
are files named by their SHA-256, so as a tree of the code store every layer is a content, and a
host that holds a layer from an earlier push is not sent it again. Each host is asked first
(``image_have``): one whose agent would already run the image with this id is skipped. The others
get the tree (``code_have``/``code_put``/``code_commit``, packs over SFTP) and load it
(``image_load``: ``podman load``, tagged with the image's name, the id checked).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tui.model.codesync import CodeSpec
from tui.remote import codesync
from tui.remote.transport import TransportError

MAX_IMAGE_FILES = 100_000
MAX_IMAGE_MB = 1 << 20


class ImageError(RuntimeError):
    """The image cannot be pushed (not here, podman missing); the message says why."""


@dataclass(frozen=True)
class ImagePush:
    """What one host got: ``skipped`` (it had the image), else what was sent and loaded; or the
    ``error`` that stopped it."""

    host: str
    skipped: bool = False
    bytes_sent: int = 0
    seconds: float = 0.0
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "skipped": self.skipped, "bytes_sent": self.bytes_sent,
                "seconds": round(self.seconds, 3), "error": self.error}


def local_id(image: str) -> str:
    """The image's id in this machine's Podman store."""
    if shutil.which("podman") is None:
        raise ImageError("no podman on this machine: an image is pushed from its Podman store")
    r = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", image], capture_output=True,
                       text=True, timeout=120, check=False)
    if r.returncode != 0 or not r.stdout.strip():
        raise ImageError(f"no image {image} in this machine's Podman store (podman images)")
    return r.stdout.strip().split(":")[-1]


def _save(image: str, store: codesync.CodeStore) -> str:
    """The image as a tree of ``store`` (its hash)."""
    tmp = Path(tempfile.mkdtemp(prefix="image-", dir=store.root))
    try:
        oci = tmp / "oci"
        r = subprocess.run(["podman", "save", "--format", "oci-dir", "-o", str(oci), image],
                           capture_output=True, text=True, timeout=3600, check=False)
        if r.returncode != 0:
            raise ImageError(f"podman save {image} failed: {r.stderr.strip()[-500:]}")
        spec, _done = store.snapshot(CodeSpec(sync=str(oci), max_files=MAX_IMAGE_FILES, max_mb=MAX_IMAGE_MB),
                                     where=f"image {image}")
        assert spec.tree is not None
        return spec.tree
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def push(ctl: Any, store: codesync.CodeStore, image: str, hosts: Sequence[str],
         progress: Callable[[str, int, int], None] | None = None) -> list[ImagePush]:
    """``image`` onto ``hosts`` (all at once); one result per host, in the order given."""
    want = local_id(image)

    def have(h: str) -> bool | str:
        try:
            return bool(ctl.agent(h).image_have(image=image, id=want, timeout=60).get("have"))
        except (TransportError, OSError) as e:
            return str(e)

    with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        had = dict(zip(hosts, pool.map(have, hosts), strict=True))
    results = {h: ImagePush(h, error=v) for h, v in had.items() if isinstance(v, str)}
    results.update({h: ImagePush(h, skipped=True) for h, v in had.items() if v is True})
    todo = [h for h in hosts if h not in results]
    if todo:
        tree = _save(image, store)
        payloads = codesync.Payloads(store, store.manifest(tree).blobs())

        def one(h: str) -> ImagePush:
            t0 = time.monotonic()
            try:
                shipped = codesync.push(ctl, h, store, tree, progress, payloads)
                ctl.agent(h).image_load(path=shipped.path, image=image, id=want, timeout=1800)
            except (TransportError, OSError) as e:
                return ImagePush(h, error=str(e), seconds=time.monotonic() - t0)
            return ImagePush(h, bytes_sent=shipped.bytes_sent, seconds=time.monotonic() - t0)

        with ThreadPoolExecutor(max_workers=len(todo)) as pool:
            results.update(zip(todo, pool.map(one, todo), strict=True))
    return [results[h] for h in hosts]
