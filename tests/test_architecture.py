"""The import rules that keep the three packages apart (ARCHITECTURE.md, 'Rules')."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_agent_and_runtime_never_import_tui() -> None:
    for pkg in ("agent", "runtime"):
        for path in (ROOT / pkg).rglob("*.py"):
            assert "tui" not in _imports(path), path


def test_runtime_never_imports_agent_internals() -> None:
    for path in (ROOT / "runtime").rglob("*.py"):
        assert "agent" not in _imports(path), path


def test_agent_imports_only_stdlib_at_top_level() -> None:
    allowed_optional = {"psutil", "pynvml"}  # imported inside functions, guarded
    for path in (ROOT / "agent").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = (
                    [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                )
                for m in mods:
                    top = m.split(".")[0]
                    assert top in sys.stdlib_module_names or top in ("agent", "__future__"), (path, m)
                    assert top not in allowed_optional, (path, m)


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(exe), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=120)


def test_room_contracts_hold() -> None:
    """pyproject's import-linter contracts: the rooms of tui/ and the three packages."""
    res = _lint_imports(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "BROKEN" not in res.stdout and " KEPT" in res.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("tui/model/state.py", "import paramiko", "model is plain data"),
        ("tui/control/jobs.py", "import textual.app", "control is headless"),
        ("runtime/metrics.py", "import agent.protocol", "the runtime never imports the agent"),
        ("tui/app/shell.py", "from tui.control.jobs import JobManager", "the faces reach the controller only"),
        ("tui/cli/main.py", "import paramiko", "the faces reach the controller only"),
    ],
)
def test_a_wrong_import_breaks_a_contract(tmp_path: Path, module: str, line: str, contract: str) -> None:
    """The contracts can fail: the same tree with one forbidden import added does not pass."""
    copy = tmp_path / "tree"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", ".venv", ".tools", "__pycache__",
                                                             "screenshots", "bench", "tests", "*.egg-info"))
    target = copy / module
    target.write_text(target.read_text() + f"\n{line}  # a deliberately wrong import\n")
    env_path = f"{copy}"
    res = subprocess.run([str(Path(sys.executable).with_name("lint-imports")), "--no-cache"], cwd=copy,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": env_path})
    assert res.returncode != 0
    assert f"{contract}" in res.stdout and "BROKEN" in res.stdout, res.stdout
