"""The wheels a rigdeck server is installed from, built on the workstation and cached there.

The server host installs from these alone (``pip install --no-index``): GPU hosts often have no
way to the internet, and the workstation already runs exactly the versions the server needs. So

* rigdeck itself: ``pip wheel --no-deps`` of the source checkout the workstation runs (an
  editable install), or the installed distribution repacked when it was installed from a wheel;
* its runtime dependencies on the server (``SERVER_REQUIREMENTS``: paramiko and what it needs,
  optuna and what it needs (the sweeps run there),
  tomli-w, tomli on Python < 3.11; not textual, rich, psutil or nvidia-ml-py: the server is
  headless and reads telemetry through the agents): each installed distribution of the
  workstation repacked into the wheel it was installed from (its files, its WHEEL tags, a fresh
  RECORD), so no index and no network are needed on either side;
* pip, repacked the same way, which the host runs straight from its wheel
  (``python pip.whl/pip install ...``): the host's Python needs neither pip nor ensurepip.

Wheels are cached under ``~/.cache/rigdeck/server-wheels`` (``$XDG_CACHE_HOME``): a dependency
wheel by its file name (name, version and tags), rigdeck's by its version and a hash of its
sources, so a second setup builds nothing. Repacked wheels are byte-for-byte reproducible.

Binary wheels fit the server host only when its platform is the workstation's (``Platform``:
the same implementation, Python version, OS/architecture and C library, at least as new); that
is the common case (one distribution across a cluster). Where they differ, ``serverhost`` still
ships these wheels but lets the host's own index supply what does not fit.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import cast

from tui.remote.bundle import cache_dir

__all__ = [
    "PLATFORM_PROBE",
    "SERVER_REQUIREMENTS",
    "Platform",
    "WheelError",
    "WheelSet",
    "build_wheels",
    "local_platform",
]

# The distributions rigdeck declares that the server needs (their version specifiers and
# markers come from rigdeck's own metadata).
SERVER_REQUIREMENTS = ("paramiko", "tomli-w", "tomli", "optuna")
PROJECT = "rigdeck"
PROJECT_PACKAGES = ("tui", "agent", "runtime")
PROJECT_FILES = ("pyproject.toml", "README.md", "LICENSE", "setup.cfg", "setup.py", "MANIFEST.in")
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)
# Written by installers, not part of a wheel.
_INSTALLER_FILES = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json", "RECORD.jws", "RECORD.p7s"}
_lock = threading.Lock()


class WheelError(RuntimeError):
    """The wheels for the server could not be made; the message says what and why."""


# ---------------------------------------------------------------------------------------------
# Platforms


@dataclass(frozen=True)
class Platform:
    """What decides whether a binary wheel built for one machine installs on another."""

    implementation: str  # "cpython"
    python: str  # "3.11"
    platform: str  # sysconfig.get_platform(): "linux-x86_64", "macosx-14.0-arm64"
    libc: str  # "glibc", "musl" or "" (not Linux)
    libc_version: str  # "2.36"

    def fits(self, host: Platform) -> bool:
        """Whether wheels installed here install on ``host`` too."""
        if (self.implementation, self.python, self.platform, self.libc) != (
            host.implementation, host.python, host.platform, host.libc
        ):
            return False
        return _version_tuple(host.libc_version) >= _version_tuple(self.libc_version)

    def describe(self) -> str:
        libc = f" {self.libc} {self.libc_version}" if self.libc else ""
        return f"{self.implementation} {self.python} {self.platform}{libc}"

    @classmethod
    def from_json(cls, data: dict[str, str]) -> Platform:
        return cls(**{k: str(data.get(k, "")) for k in cls.__dataclass_fields__})


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"[0-9]+", text))


# Run by the host's Python (3.9+), stdlib only: prints the Platform of that interpreter.
PLATFORM_PROBE = r"""
import json, platform, sys, sysconfig
libc, version = platform.libc_ver() if sys.platform.startswith("linux") else ("", "")
print(json.dumps({"implementation": sys.implementation.name,
                  "python": "{}.{}".format(*sys.version_info[:2]),
                  "platform": sysconfig.get_platform(), "libc": libc, "libc_version": version}))
"""


def local_platform() -> Platform:
    libc, version = platform.libc_ver() if sys.platform.startswith("linux") else ("", "")
    return Platform(sys.implementation.name, "{}.{}".format(*sys.version_info[:2]),
                    sysconfig.get_platform(), libc, version)


# ---------------------------------------------------------------------------------------------
# The wheel set


@dataclass(frozen=True)
class WheelSet:
    """Everything the server host installs from, all files in one cache directory tree."""

    rigdeck: Path
    pip: Path
    dependencies: tuple[Path, ...]  # the closure of SERVER_REQUIREMENTS, pinned
    requirements: tuple[str, ...]  # rigdeck's specifiers for them (for a host's own index)
    version: str  # rigdeck's version
    build: str  # hash of rigdeck's wheel
    platform: Platform  # where the binary ones were built

    @property
    def files(self) -> tuple[Path, ...]:
        return (self.pip, *self.dependencies, self.rigdeck)


def build_wheels(cache: Path | None = None) -> WheelSet:
    """rigdeck, its server-side dependencies and pip as wheels, from the cache when there."""
    root = Path(cache) if cache is not None else cache_dir() / "server-wheels"
    with _lock:
        root.mkdir(parents=True, exist_ok=True)
        pip_wheel = _pip_wheel(root)
        requirements = _project_requirements()
        deps = tuple(_repack_cached(d, root) for d in _closure(requirements))
        own = _project_wheel(root, pip_wheel)
    return WheelSet(
        rigdeck=own,
        pip=pip_wheel,
        dependencies=deps,
        requirements=tuple(requirements),
        version=_wheel_version(own),
        build=_sha256(own)[:16],
        platform=local_platform(),
    )


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _wheel_version(path: Path) -> str:
    return path.name.split("-")[1]


# -- requirements ---------------------------------------------------------------------------


def _packaging() -> tuple[type, type]:
    """(Requirement, Marker) from packaging, or pip's vendored copy of it."""
    try:
        from packaging.markers import Marker
        from packaging.requirements import Requirement
    except ImportError:
        try:
            from pip._vendor.packaging.markers import Marker  # type: ignore[assignment]
            from pip._vendor.packaging.requirements import Requirement  # type: ignore[assignment]
        except ImportError:
            raise WheelError(
                "reading requirements needs the 'packaging' module (or pip) on this machine"
            ) from None
    return Requirement, Marker


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _project_requirements() -> list[str]:
    """rigdeck's own specifiers for SERVER_REQUIREMENTS (e.g. "paramiko>=3.4")."""
    Requirement, _ = _packaging()
    try:
        declared = metadata.requires(PROJECT) or []
    except metadata.PackageNotFoundError:
        declared = []
    wanted = {_canonical(n) for n in SERVER_REQUIREMENTS}
    found = [r for r in declared if _canonical(Requirement(r).name) in wanted]
    if {_canonical(Requirement(r).name) for r in found} != wanted:
        return list(SERVER_REQUIREMENTS)  # rigdeck is not installed: no specifiers to add
    return found


def _closure(requirements: Iterable[str]) -> list[metadata.Distribution]:
    """The installed distributions that ``requirements`` need here, dependencies first-found
    order, each once. Markers are evaluated for this interpreter (the server's, when the wheels
    fit it)."""
    Requirement, _ = _packaging()
    todo = [(Requirement(r), ()) for r in requirements]
    seen: dict[str, metadata.Distribution] = {}
    extras_seen: dict[str, set[str]] = {}
    while todo:
        req, parent_extras = todo.pop(0)
        if req.marker is not None and not any(
            req.marker.evaluate({"extra": e}) for e in ("", *parent_extras)
        ):
            continue
        key = _canonical(req.name)
        extras = set(req.extras)
        if key in seen and extras <= extras_seen[key]:
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            raise WheelError(
                f"{req.name} is not installed here, so there is no wheel of it to ship to the "
                f"server (install rigdeck with its dependencies: pip install -e .)"
            ) from None
        if not req.specifier.contains(dist.version, prereleases=True):
            raise WheelError(f"{req} is needed, but {dist.version} is installed here")
        seen[key] = dist
        extras_seen[key] = extras_seen.get(key, set()) | extras
        todo += [(Requirement(r), tuple(sorted(extras))) for r in (dist.requires or [])]
    return list(seen.values())


# -- repacking installed distributions ------------------------------------------------------


def _wheel_name(dist: metadata.Distribution) -> str:
    text = dist.read_text("WHEEL")
    if not text:
        raise WheelError(
            f"{dist.metadata['Name']} {dist.version} was not installed from a wheel, so it cannot "
            "be repacked for the server; reinstall it with pip"
        )
    tags = [ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Tag:")]
    if not tags:
        raise WheelError(f"{dist.metadata['Name']}: its WHEEL file names no tag")
    parts = [sorted({t.split("-")[i] for t in tags}) for i in range(3)]
    name = re.sub(r"[-_.]+", "_", dist.metadata["Name"])
    version = dist.version.replace("-", "_")
    return f"{name}-{version}-{'.'.join(parts[0])}-{'.'.join(parts[1])}-{'.'.join(parts[2])}.whl"


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def repack(dist: metadata.Distribution, out_dir: Path) -> Path:
    """The wheel ``dist`` was installed from, rebuilt from its installed files."""
    name = _wheel_name(dist)
    files = dist.files
    if not files:
        raise WheelError(f"{dist.metadata['Name']}: no RECORD of its installed files")
    entries: list[tuple[str, bytes, int]] = []
    dist_info = None
    for f in files:
        rel = f.as_posix()
        parts = rel.split("/")
        if rel.startswith("../") or "__pycache__" in parts or rel.endswith(".pyc"):
            continue  # scripts and data outside site-packages (regenerated), bytecode
        if parts[0].endswith(".dist-info"):
            dist_info = parts[0]
            if len(parts) == 2 and parts[1] in _INSTALLER_FILES:
                continue
        path = Path(cast("os.PathLike[str]", dist.locate_file(f)))  # a PathDistribution's: a Path
        try:
            data = path.read_bytes()
            mode = path.stat().st_mode & 0o777
        except OSError as e:
            raise WheelError(f"{dist.metadata['Name']}: cannot read {path}: {e}") from None
        entries.append((rel, data, mode))
    if dist_info is None:
        raise WheelError(f"{dist.metadata['Name']}: no .dist-info directory among its files")
    entries.sort(key=lambda e: (e[0].startswith(dist_info + "/"), e[0]))
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for rel, data, _mode in entries:
        writer.writerow([rel, _record_hash(data), len(data)])
    writer.writerow([f"{dist_info}/RECORD", "", ""])
    entries.append((f"{dist_info}/RECORD", record.getvalue().encode(), 0o644))
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / name
    tmp = target.with_name(f".{name}.tmp-{os.getpid()}")
    with zipfile.ZipFile(tmp, "w") as zf:
        for rel, data, mode in entries:
            info = zipfile.ZipInfo(rel, date_time=_FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (mode | 0o644) << 16
            zf.writestr(info, data)
    os.replace(tmp, target)
    return target


def _repack_cached(dist: metadata.Distribution, root: Path) -> Path:
    target = root / "deps" / _wheel_name(dist)
    if target.exists():
        return target
    return repack(dist, target.parent)


def _pip_wheel(root: Path) -> Path:
    """A pip wheel: this interpreter's pip repacked, else the one ensurepip bundles."""
    try:
        return _repack_cached(metadata.distribution("pip"), root)
    except (metadata.PackageNotFoundError, WheelError):
        pass
    try:
        import ensurepip

        bundled = Path(ensurepip.__file__).parent / "_bundled"
        found = sorted(bundled.glob("pip-*.whl"))
    except ImportError:
        found = []
    found += sorted(Path("/usr/share/python-wheels").glob("pip-*.whl"))
    if not found:
        raise WheelError("no pip here to ship to the server (install pip on this machine)")
    target = root / "deps" / found[-1].name
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(found[-1], target)
    return target


# -- rigdeck's own wheel ----------------------------------------------------------------------


def source_root() -> Path | None:
    """The source checkout this rigdeck runs from (an editable install), or None."""
    root = Path(__file__).resolve().parent.parent.parent
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and re.search(r'(?m)^name\s*=\s*"rigdeck"', pyproject.read_text()):
        return root
    return None


def _source_files(root: Path) -> list[Path]:
    files = [root / name for name in PROJECT_FILES if (root / name).is_file()]
    for pkg in PROJECT_PACKAGES:
        for path in sorted((root / pkg).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                files.append(path)
    return files


def source_hash(root: Path) -> str:
    h = hashlib.sha256()
    for path in _source_files(root):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _project_version() -> str:
    try:
        return metadata.version(PROJECT)
    except metadata.PackageNotFoundError:
        return "0"


def _project_wheel(root: Path, pip_wheel: Path) -> Path:
    src = source_root()
    if src is None:  # installed from a wheel: that wheel again
        try:
            return _repack_cached(metadata.distribution(PROJECT), root)
        except metadata.PackageNotFoundError:
            raise WheelError("rigdeck is neither a source checkout nor installed") from None
    out = root / "rigdeck" / f"{_project_version()}-{source_hash(src)}"
    found = sorted(out.glob("rigdeck-*.whl"))
    if found:
        return found[0]
    with tempfile.TemporaryDirectory(prefix="rigdeck-wheel-") as tmp:
        copy = Path(tmp) / "src"
        for path in _source_files(src):
            dest = copy / path.relative_to(src)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
        built = Path(tmp) / "out"
        _pip(pip_wheel, ["wheel", "--no-deps", "--no-build-isolation", "-w", str(built), str(copy)],
             fallback=["wheel", "--no-deps", "-w", str(built), str(copy)])
        wheels = sorted(built.glob("rigdeck-*.whl"))
        if not wheels:
            raise WheelError(f"pip wheel made no rigdeck wheel from {src}")
        out.mkdir(parents=True, exist_ok=True)
        target = out / wheels[0].name
        shutil.copyfile(wheels[0], target)
    return target


def _pip(pip_wheel: Path, args: Sequence[str], fallback: Sequence[str] | None = None) -> None:
    """Run pip (this interpreter's, else the shipped wheel's) with ``args``; on failure once
    more with ``fallback`` (building with isolation needs an index)."""
    base = [sys.executable, "-m", "pip"]
    try:
        import pip  # noqa: F401
    except ImportError:
        base = [sys.executable, str(pip_wheel / "pip")]
    flags = ["--disable-pip-version-check", "--no-input", "-q"]
    last = ""
    for attempt in (args, fallback):
        if attempt is None:
            continue
        proc = subprocess.run([*base, *attempt[:1], *flags, *attempt[1:]], capture_output=True,
                              text=True, timeout=600, env={**os.environ, "PIP_NO_INPUT": "1"})
        if proc.returncode == 0:
            return
        last = (proc.stderr or proc.stdout).strip()[-1500:]
    raise WheelError(f"pip {' '.join(args[:1])} failed: {last}")

