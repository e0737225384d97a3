"""Every module of tui/, agent/ and runtime/ has tests a person can find: tests/test_<its name>.py
naming it, or its line in tests/MODULES.toml (which says how the file there reaches it), or a line
there saying why it has none. A module without either fails here, by name; so does a line whose
test file is gone or no longer reaches the module, and a module called untested that a test now
names (it belongs in the map then)."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

from tests.kit import ROOT

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

TESTS = ROOT / "tests"
MAP = TESTS / "MODULES.toml"
PACKAGES = ("tui", "agent", "runtime")


def modules() -> dict[str, Path]:
    """Dotted name -> file, for every module with code (a package's ``__init__`` that is only a
    docstring has nothing to test)."""
    out = {}
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "__pycache__" in path.parts or _empty(path):
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _empty(path: Path) -> bool:
    body = ast.parse(path.read_text()).body
    return all((isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
               or (isinstance(n, ast.ImportFrom) and n.module == "__future__") for n in body)


@cache
def _named(test_file: str) -> tuple[frozenset[str], str]:
    """What ``test_file`` imports (as dotted module names) and its strings but docstrings, joined."""
    tree = ast.parse((TESTS / test_file).read_text())
    imported: set[str] = set()
    strings = []
    # A docstring that names a module says what a test is about, not that it reaches the module.
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module)
            imported.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            strings.append(node.value)
    return frozenset(imported), "\n".join(strings)


def names(test_file: str, module: str, path: Path) -> bool:
    """Whether ``test_file`` names ``module``: imports it or from it, or has its dotted name (a
    ``python -m`` line, a patch target) or its path in a string."""
    imported, strings = _named(test_file)
    if module in imported:
        return True
    dotted = re.compile(r"(?<![\w.])" + re.escape(module) + r"(?![\w])")
    return bool(dotted.search(strings)) or str(path.relative_to(ROOT)) in strings


def own_file(module: str) -> str:
    return f"test_{module.rpartition('.')[2]}.py"


def covered_by_own_file(module: str, path: Path) -> bool:
    own = own_file(module)
    return (TESTS / own).is_file() and names(own, module, path)


@cache
def the_map() -> dict[str, dict[str, object]]:
    with MAP.open("rb") as f:
        return tomllib.load(f)


def test_every_module_has_tests_or_says_why_not() -> None:
    m = the_map()
    listed = set(m["tests"]) | set(m["through"]) | set(m["untested"])
    missing = [mod for mod, path in modules().items() if mod not in listed and not covered_by_own_file(mod, path)]
    assert not missing, (f"no tests/test_<name>.py naming these modules, and no line in {MAP.name}: {missing} "
                         "(write its tests, or map the test files that cover it)")


def test_the_map_names_modules_that_exist_once_each_and_only_where_needed() -> None:
    m, mods = the_map(), modules()
    tables = ("tests", "through", "untested")
    for table in tables:
        gone = sorted(set(m[table]) - set(mods))
        assert not gone, f"[{table}] lists modules that are not there: {gone}"
    for i, a in enumerate(tables):
        for b in tables[i + 1:]:
            both = sorted(set(m[a]) & set(m[b]))
            assert not both, f"in both [{a}] and [{b}]: {both}"
    needless = sorted(mod for mod in set(m["tests"]) | set(m["through"]) if covered_by_own_file(mod, mods[mod]))
    assert not needless, f"{needless}: their own tests/test_<name>.py names them; their lines can go"


def test_each_mapped_test_file_names_its_module() -> None:
    mods = the_map()["tests"]
    paths = modules()
    wrong = []
    for mod, files in mods.items():
        assert isinstance(files, list) and files, f"{mod}: a list of test files"
        for f in files:
            if not (TESTS / f).is_file() or not names(f, mod, paths[mod]):
                wrong.append(f"{mod}: {f}")
    assert not wrong, f"these test files are gone or no longer name the module mapped to them: {wrong}"


def test_each_test_file_that_reaches_a_module_through_another_part_still_does() -> None:
    wrong = []
    for mod, entry in the_map()["through"].items():
        assert isinstance(entry, dict) and set(entry) == {"tests", "via"}, f"{mod}: {{tests = [...], via = '...'}}"
        for f in entry["tests"]:  # type: ignore[attr-defined]
            if not (TESTS / f).is_file() or str(entry["via"]) not in (TESTS / f).read_text():
                wrong.append(f"{mod}: {f} (via {entry['via']!r})")
    assert not wrong, f"these test files are gone or no longer reach the module as the map says: {wrong}"


def test_a_module_called_untested_is_named_by_no_test() -> None:
    paths = modules()
    files = sorted(p.name for p in TESTS.glob("test_*.py"))
    named = {mod: [f for f in files if names(f, mod, paths[mod])] for mod in the_map()["untested"]}
    tested = {mod: fs for mod, fs in named.items() if fs}
    assert not tested, f"tests name these 'untested' modules now; map them instead: {tested}"
