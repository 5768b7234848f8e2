"""Every relative link in README.md and docs/ resolves: the file exists and, for a
``#fragment``, the page has a heading with that GitHub anchor."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.paths import REPO

PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])

#: pages other changes add (issue 30): a link to one of them is tolerated while it does
#: not exist; once it exists its links and anchors are checked like any other page's
PENDING_PAGES = frozenset({"docs/install.md"})

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _without_code(text: str) -> list[str]:
    """The lines of `text` outside fenced code blocks (inline code spans blanked)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            lines.append("")
            continue
        lines.append("" if fenced else re.sub(r"`[^`]*`", "``", line))
    return lines


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors of a Markdown page (duplicates get -1, -2, ...)."""
    found: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(2).strip().lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every relative link of `page`."""
    out = []
    for number, line in enumerate(_without_code(page.read_text()), start=1):
        for target in LINK.findall(line):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                out.append((number, target))
    return out


def test_anchor_slugs_follow_github() -> None:
    page = ("# A\n## `inspect --json`\n## One table: kill, retry\n## 7. How it works\n## A\n```\n# "
            "not a heading\n```\n")
    assert anchors(page) == {"a", "inspect---json", "one-table-kill-retry", "7-how-it-works", "a-1"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for number, target in links(page):
        path_part, _, fragment = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        where = f"{page.relative_to(REPO)}:{number}: {target}"
        if not resolved.exists():
            relative = (resolved.relative_to(REPO).as_posix() if resolved.is_relative_to(REPO)
                        else str(resolved))
            if relative not in PENDING_PAGES:
                broken.append(f"{where} (no such file)")
            continue
        if fragment and resolved.suffix == ".md" and fragment not in anchors(resolved.read_text()):
            broken.append(f"{where} (no heading #{fragment} in {resolved.name})")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_pending_pages_are_linked() -> None:
    """The tolerance list names pages the docs really link to (else it would hide nothing
    and should shrink)."""
    targets = {(page.parent / t.partition("#")[0]).resolve() for page in PAGES for _, t in links(page)}
    assert {(REPO / p).resolve() for p in PENDING_PAGES} <= targets
