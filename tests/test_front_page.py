"""The README is a front page (issue 40): at most 120 lines, the two commands unchanged, the sections a new user
needs; everything else is in docs/, each document reachable from docs/README.md, and no link of either is broken."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


def test_the_readme_is_a_front_page_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 120
    assert "make quickstart   # venv + ltbench + Fashion-MNIST" in text and "make test         # venv" in text
    for heading in ("## Two commands on a fresh machine", "## What the quickstart prints", "## Write your own method",
                    "## No ImageNet? Run the headline recipe on a generated tree", "## Commands"):
        assert heading in text
    assert "ltbench check my_methods" in text and "docs/README.md" in text


def test_every_document_is_reachable_from_the_index_and_no_link_is_broken():
    index = (ROOT / "docs" / "README.md").read_text()
    linked = {m.group(1) for m in LINK.finditer(index)}
    documents = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md", "results.template.md"}
    assert documents - linked == set()
    for page in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for m in LINK.finditer(page.read_text()):
            target = m.group(1)
            if "://" in target or target.startswith("mailto:"):
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)}: broken link {target}"
