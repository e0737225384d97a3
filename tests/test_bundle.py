"""The agent zipapp: reproducible, versioned by content, runnable by the oldest Python we support."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests._require import PY39_MISSING, python39, require
from tui.remote.bundle import REPO_ROOT, build_agent, build_bytes, source_version


def test_build_is_reproducible(tmp_path: Path) -> None:
    a = build_agent(tmp_path / "a")
    b = build_agent(tmp_path / "b")
    assert a.version == b.version
    assert a.sha256 == b.sha256
    assert a.path.read_bytes() == b.path.read_bytes()
    assert hashlib.sha256(a.path.read_bytes()).hexdigest() == a.sha256


def test_version_is_content_hash(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(REPO_ROOT / "agent", src / "agent", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO_ROOT / "runtime", src / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    before = source_version(src)
    assert before == source_version(REPO_ROOT)
    (src / "runtime" / "__init__.py").write_text("# changed\n")
    after = source_version(src)
    assert after != before
    v, data = build_bytes(src)
    assert v == after and len(data) > 1000


def test_agent_runs_and_reports_its_version(tmp_path: Path) -> None:
    bundle = build_agent(tmp_path)
    out = subprocess.run(
        [sys.executable, str(bundle.path), "version", "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True, check=True,
        env={**os.environ, "RIGDECK_SIM_GPUS": "3", "PYTHONPATH": ""},
    )
    info = json.loads(out.stdout)
    assert info["version"] == bundle.version
    assert info["cpus"] == os.cpu_count()
    assert info["gpu_source"] in ("simulated", "nvml", "nvidia-smi")
    if info["gpu_source"] == "simulated":
        assert len(info["gpus"]) == 3 and all(g["simulated"] for g in info["gpus"])
    assert info["deployed_version"] is None


def test_install_refuses_a_corrupt_archive(tmp_path: Path) -> None:
    bundle = build_agent(tmp_path)
    part = tmp_path / "upload.part"
    shutil.copy(bundle.path, part)
    res = subprocess.run(
        [sys.executable, str(part), "version", "--install", "--state-dir", str(tmp_path / "s"),
         "--expect-sha256", "0" * 64],
        capture_output=True, text=True,
    )
    assert res.returncode == 3
    assert "sha256 mismatch" in res.stdout
    assert not (tmp_path / "s" / "agent" / "current").exists()


def test_agent_and_runtime_run_on_python39(tmp_path: Path) -> None:
    py39 = python39()
    require(py39, PY39_MISSING)
    assert py39
    files = [str(p) for d in ("agent", "runtime") for p in (REPO_ROOT / d).rglob("*.py")]
    subprocess.run([py39, "-m", "py_compile", *files], check=True)
    bundle = build_agent(tmp_path)
    out = subprocess.run([py39, str(bundle.path), "version"], capture_output=True, text=True, check=True)
    info = json.loads(out.stdout)
    assert info["python"].startswith("3.9.") and info["version"] == bundle.version
