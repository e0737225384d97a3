"""The README and the pages under docs/ link to things that exist, and stay a guide.

Every relative link (``[text](path)``, ``![alt](path)``) must name a file or directory of the
repository, and every ``#anchor`` (in the page, or ``page.md#anchor``) a heading of that page, by
GitHub's rule for heading ids. Links inside code (fenced blocks, ``inline``) are text, not links.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The README is the guide; the details live in docs/. Past this size it is a manual again.
README_MAX_BYTES = 30_000

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+).*?\1")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def _pages() -> list[Path]:
    """The Markdown a reader follows: the top-level files, docs/ and the examples' READMEs."""
    pages = sorted(ROOT.glob("*.md")) + sorted((ROOT / "docs").glob("*.md"))
    return pages + sorted((ROOT / "examples").glob("*/README.md"))


def _prose(text: str) -> list[str]:
    """The page's lines outside fenced code blocks (a ``#`` there is a comment, not a heading)."""
    lines: list[str] = []
    fence = ""
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = ""
            continue
        if m:
            fence = m.group(1)
            continue
        lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's id for a heading: its text, lowercased, punctuation but ``-`` and ``_`` dropped,
    each space a ``-``. Link targets and formatting marks go; what they enclose stays."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every id a link may name on ``page``; a repeated heading gets ``-1``, ``-2``... as on GitHub."""
    seen: dict[str, int] = {}
    ids: set[str] = set()
    for line in _prose(page.read_text()):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        ids.add(base if n == 0 else f"{base}-{n}")
    return ids


def links(page: Path) -> list[str]:
    found: list[str] = []
    for line in _prose(page.read_text()):
        found += LINK.findall(INLINE_CODE.sub("", line))
    return found


def broken(page: Path, root: Path = ROOT) -> list[str]:
    """The links on ``page`` that lead nowhere (or out of ``root``), each with why."""
    bad: list[str] = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: are not ours to check
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif not dest.is_relative_to(root):
            bad.append(f"{target}: outside the repository")
        elif anchor:
            if dest.suffix != ".md":
                bad.append(f"{target}: an anchor into a file that is not Markdown")
            elif unquote(anchor) not in anchors(dest):
                bad.append(f"{target}: no such heading in {dest.relative_to(root)}")
    return bad


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(page: Path) -> None:
    assert broken(page) == []


def test_the_readme_is_a_guide_into_every_docs_page() -> None:
    readme = ROOT / "README.md"
    assert readme.stat().st_size <= README_MAX_BYTES
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in links(readme) if t.partition("#")[0]}
    # A page nothing links to is lost to a newcomer.
    assert [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked] == []
    # The two commands (CI runs the README's test command, .ci/run) stay in the guide.
    assert "make run" in readme.read_text() and "make test" in readme.read_text()


def test_the_slug_rule_matches_github() -> None:
    assert slug("Diagnostics: `rigdeck doctor`") == "diagnostics-rigdeck-doctor"
    assert slug("`--json` output of every command (the CLI's stable contract)") == (
        "--json-output-of-every-command-the-clis-stable-contract")
    assert slug("The server's directory on its host (`[server] state_dir`, default `~/.rigdeck/server`)") == (
        "the-servers-directory-on-its-host-server-state_dir-default-rigdeckserver")
    assert slug("Set-up: two commands") == "set-up-two-commands"
    assert slug("A [link](x.md) in a heading") == "a-link-in-a-heading"


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Top\n\n[ok](#top) [gone](missing.md) [bad anchor](#nowhere) `[code](nope.md)`\n"
                    "```\n[fenced](nope.md)\n# not a heading\n```\n[self](page.md#top) [no](page.md#not-a-heading)\n")
    assert broken(page, tmp_path) == ["missing.md: no such file", "#nowhere: no such heading in page.md",
                            "page.md#not-a-heading: no such heading in page.md"]
