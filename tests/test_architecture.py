"""The import rules that keep the three packages apart (ARCHITECTURE.md, 'Rules')."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

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


def test_controller_side_imports_no_textual() -> None:
    code = (
        "import sys, tui.controller, tui.transport, tui.inventory, tui.bundle, tui.cli\n"
        "bad = [m for m in sys.modules if m.split('.')[0] == 'textual']\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_app_never_touches_paramiko() -> None:
    assert "paramiko" not in _imports(ROOT / "tui" / "app.py")
