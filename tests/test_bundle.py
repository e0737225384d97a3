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


def test_the_unpacked_copy_holds_the_archive_byte_compiled_and_is_remade_when_changed(tmp_path: Path) -> None:
    """Job hosts and rank wrappers start from it: the archive's bytes, with bytecode that is
    checked against the source at every import, made again when a file differs."""
    import zipfile

    from agent.paths import is_unpacked, self_command, unpack, unpacked_command

    bundle = build_agent(tmp_path)
    d = Path(unpack(str(bundle.path)))
    assert d == bundle.path.parent / "unpacked" and is_unpacked(str(d))
    with zipfile.ZipFile(bundle.path) as zf:
        names = [i.filename for i in zf.infolist() if not i.is_dir()]
        assert all((d / n).read_bytes() == zf.read(n) for n in names)
    pyc = list((d / "agent" / "__pycache__").glob("jobhost.*.pyc"))
    assert pyc, "the copy is byte-compiled"
    flags = int.from_bytes(pyc[0].read_bytes()[4:8], "little")
    assert flags == 0b11, "checked-hash bytecode: the source is checked at every import"
    # Runs as the zipapp does, with no site, and knows itself as the command to start again.
    out = subprocess.run([sys.executable, "-S", str(d), "version"], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": ""})
    assert json.loads(out.stdout)["version"] == bundle.version
    me = subprocess.run([sys.executable, "-S", str(d / "__main__.py")], capture_output=True, text=True)
    assert me.returncode != 0  # run from the directory, not a file inside it
    probe = subprocess.run(
        [sys.executable, "-S", "-c", "import sys, json; sys.argv=[sys.argv[1]]; sys.path.insert(0, sys.argv[0]); "
         "from agent.paths import self_command; print(json.dumps(self_command()))", str(d)],
        capture_output=True, text=True, check=True)
    assert json.loads(probe.stdout) == [sys.executable, str(d)]
    assert self_command()[1:] == ["-m", "agent"]  # this test runs from the source tree
    # A changed file (damage, or someone's edit) is put back as the archive has it.
    target = d / "agent" / "jobhost.py"
    good = target.read_bytes()
    target.write_bytes(b"raise SystemExit('tampered')\n")
    assert unpack(str(bundle.path)) == str(d)
    assert target.read_bytes() == good
    assert not list(d.parent.glob("unpacked.*")), "no temporary or old copies left behind"
    # Not a zipapp: nothing to unpack. A zipapp that cannot be unpacked: run it as it is.
    assert unpacked_command([sys.executable, "-m", "agent"]) == [sys.executable, "-m", "agent"]
    missing = [sys.executable, str(tmp_path / "missing.pyz")]
    assert unpacked_command(missing) == missing
    assert unpacked_command([sys.executable, str(bundle.path)]) == [sys.executable, str(d)]


def test_the_unpacked_copy_runs_on_python39(tmp_path: Path) -> None:
    py39 = python39()
    require(py39, PY39_MISSING)
    assert py39
    bundle = build_agent(tmp_path)
    out = subprocess.run([py39, "-c", "import sys; sys.path.insert(0, sys.argv[1]); from agent.paths import unpack; "
                          "print(unpack(sys.argv[2]))", str(bundle.path), str(bundle.path)],
                         capture_output=True, text=True, check=True)
    d = out.stdout.strip()
    assert list(Path(d, "agent", "__pycache__").glob("*.cpython-39.pyc"))
    info = json.loads(subprocess.run([py39, "-S", d, "version"], capture_output=True, text=True, check=True).stdout)
    assert info["python"].startswith("3.9.") and info["version"] == bundle.version
