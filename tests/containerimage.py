"""The test image for containerised jobs: built once per recipe, cached outside the clone.

    python -m tests.containerimage            # build (if not cached) and load into podman
    python -m tests.containerimage --name     # print the image's name (no build)

The recipe (tests/images/ddp.recipe) says which Debian suite, which Debian packages and which pip
requirements. The image is a Debian rootfs made by mmdebstrap, with the pip requirements
installed into it by this machine's pip (same Python minor as the image's python3, checked),
imported into podman and saved as an archive at ``/var/cache/rigdeck/images/<hash>.tar``, the
hash being that of the recipe and this builder: a recipe change builds a new image, anything
else reuses the archive (a fresh machine builds it once).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RECIPE = Path(__file__).parent / "images" / "ddp.recipe"
CACHE = Path(os.environ.get("RIGDECK_IMAGE_CACHE", "/var/cache/rigdeck/images"))


def recipe() -> dict[str, str]:
    out: dict[str, str] = {}
    for n, line in enumerate(RECIPE.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise SystemExit(f"{RECIPE}:{n}: expected key = value, got {line!r}")
        out[key.strip()] = value.strip()
    for key in ("suite", "variant", "debs", "pip"):
        if key not in out:
            raise SystemExit(f"{RECIPE}: missing {key!r}")
    return out


def digest() -> str:
    h = hashlib.sha256(RECIPE.read_bytes())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:16]


def name() -> str:
    return f"localhost/rigdeck-ddp:{digest()}"


def archive() -> Path:
    return CACHE / f"{digest()}.tar"


def _run(argv: list[str], **kw: object) -> None:
    print("+", " ".join(argv), flush=True)
    subprocess.run(argv, check=True, **kw)  # type: ignore[call-overload]


def _image_python(root: Path) -> str:
    found = sorted(p.name for p in (root / "usr/bin").glob("python3.*") if p.name[8:].isdigit())
    if not found:
        raise SystemExit(f"no python3.N in the image's /usr/bin ({root})")
    return found[-1][len("python"):]


def build() -> Path:
    """Build the archive if it is not cached; return its path. Builders of the same recipe take
    turns (a lock file beside the archive): the suite's container modules run in different
    pytest-xdist workers, and on a fresh machine each would otherwise build the same image at
    once, every one of them paying the whole build on the shared CPUs."""
    target = archive()
    if target.exists():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{digest()}.lock", "w") as lock:
        t0 = time.monotonic()
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():  # another builder made it while this one waited
            print(f"{target} built by another process (waited {time.monotonic() - t0:.0f} s)", flush=True)
            return target
        return _build(target)


def _build(target: Path) -> Path:
    r = recipe()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rigdeck-image-", dir=CACHE) as tmp:
        root = Path(tmp) / "root"
        debs = ",".join(r["debs"].split())
        _run(["mmdebstrap", "--quiet", f"--variant={r['variant']}", f"--include={debs}",
              "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*",
              "--dpkgopt=path-exclude=/usr/share/locale/*", r["suite"], str(root)])
        version = _image_python(root)
        here = f"{sys.version_info[0]}.{sys.version_info[1]}"
        if version != here:
            raise SystemExit(f"the image's python is {version}, this builder's {here}: the pip "
                             "requirements would be built for the wrong Python")
        site = root / f"usr/local/lib/python{version}/dist-packages"
        _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-warn-script-location",
              "--target", str(site), *r["pip"].split()])
        for cache in root.rglob("__pycache__"):
            if "dist-packages" not in str(cache):
                shutil.rmtree(cache, ignore_errors=True)
        rootfs = Path(tmp) / "rootfs.tar"
        _run(["tar", "-C", str(root), "-cf", str(rootfs), "."])
        _run(["podman", "import", "--change", "CMD=/bin/sh", str(rootfs), name()],
             stdout=subprocess.DEVNULL)
        partial = Path(tmp) / "image.tar"
        _run(["podman", "save", "--format", "docker-archive", "-o", str(partial), name()])
        partial.rename(target)
    print(f"built {target} ({target.stat().st_size / 2**20:.0f} MB) in "
          f"{time.monotonic() - t0:.0f} s", flush=True)
    return target


def loaded() -> bool:
    return subprocess.run(["podman", "image", "exists", name()]).returncode == 0


def ensure() -> str:
    """The image built (or taken from the cache) and in this machine's podman store."""
    path = build()
    if not loaded():
        _run(["podman", "load", "--quiet", "-i", str(path)], stdout=subprocess.DEVNULL)
    return name()


if __name__ == "__main__":
    if sys.argv[1:] == ["--name"]:
        print(name())
    else:
        print(ensure())
