"""Every chapter ends with what its reader should now understand, before its exercises.

The section is "## What to take away": three to five bullets, in plain words, standing right
before "## Exercises" (or ending the chapter, where it has none). A chapter still being written
is listed in STILL_BEING_WRITTEN until it gets its section; the list may only shrink, so a
chapter that gains the section must leave it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEADING = "## What to take away"
# Chapters without the section yet (issue #40): they have no exercises yet either.
STILL_BEING_WRITTEN: set = set()


def chapters() -> list[Path]:
    """The numbered chapters, a split one (14b) included."""
    return sorted((ROOT / "walkthrough").glob("[0-9][0-9]*-*.md"))


def sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of each ``## `` section, outside code blocks, in page order."""
    text = re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S | re.M)
    parts = re.split(r"^(## .+)$", text, flags=re.M)
    return [(parts[i].strip(), parts[i + 1]) for i in range(1, len(parts), 2)]


def takeaways(page: Path) -> list[str] | None:
    """The bullets of the page's takeaway section (continuation lines joined), or None."""
    found = [body for heading, body in sections(page.read_text()) if heading == HEADING]
    if not found:
        return None
    assert len(found) == 1, f"{page.name}: {len(found)} takeaway sections"
    bullets: list[str] = []
    for line in found[0].strip().splitlines():
        if line.startswith("* "):
            bullets.append(line[2:].strip())
        elif line.startswith("  ") and bullets:
            bullets[-1] += " " + line.strip()
        else:
            raise AssertionError(f"{page.name}: the takeaways hold something besides bullets: {line!r}")
    return bullets


@pytest.mark.parametrize("page", [p for p in chapters() if p.name[:2] not in STILL_BEING_WRITTEN],
                         ids=lambda p: p.name.split("-")[0])
def test_chapter_ends_with_three_to_five_takeaways(page):
    bullets = takeaways(page)
    assert bullets is not None, f"{page.name} has no '{HEADING}' section"
    assert 3 <= len(bullets) <= 5, f"{page.name}: {len(bullets)} takeaways"
    assert len(set(bullets)) == len(bullets), f"{page.name}: a takeaway is repeated"
    headings = [h for h, _ in sections(page.read_text())]
    where = headings.index(HEADING)
    after = headings[where + 1:]
    assert after in ([], ["## Exercises"]), f"{page.name}: the takeaways come before {after}, not the exercises"


def test_chapters_still_being_written_are_listed_only_while_they_lack_it():
    names = {p.name[:2]: p for p in chapters()}
    for number in STILL_BEING_WRITTEN:
        if number in names:
            assert takeaways(names[number]) is None, \
                f"{names[number].name} has its takeaways now: remove it from STILL_BEING_WRITTEN"


def test_the_reader_finds_bullets_and_their_continuations(tmp_path):
    page = tmp_path / "99-x.md"
    page.write_text("# x\n\n## A\n\ntext\n\n## What to take away\n\n* one\n  more\n* two\n* three\n\n"
                    "## Exercises\n\n```text\n## not a heading\n```\n")
    assert takeaways(page) == ["one more", "two", "three"]
