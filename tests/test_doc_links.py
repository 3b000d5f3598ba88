"""Every relative link in the README and docs/ reaches a file, and a `#section` a heading in it.

Headings become anchors as GitHub makes them: lower case, punctuation dropped, spaces turned
into hyphens, a repeated heading numbered (`-1`, `-2`). Code blocks are skipped on both sides.
"""

import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
CODE = re.compile(r"```.*?```", re.S)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    return CODE.sub("", text)


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives a markdown text's headings."""
    seen: Counter[str] = Counter()
    found = set()
    for heading in re.findall(r"^#{1,6} (.+?)\s*#*$", prose(text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        found.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return found


def links() -> list[tuple[str, Path, str]]:
    """(where, target file, anchor) for every relative link."""
    found = []
    for document in DOCUMENTS:
        for target in LINK.findall(prose(document.read_text())):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            found.append(
                (f"{document.relative_to(REPO)}: {target}", document.parent / path if path else document, anchor)
            )
    return found


LINKS = links()


def test_the_anchor_rule_gives_githubs_anchors_for_known_headings() -> None:
    text = "# Results (2026-11-26)\n## Fits: a N^b, and L\n## Fits: a N^b, and L\n```bash\n# not a heading\n```\n"
    assert anchors(text) == {"results-2026-11-26", "fits-a-nb-and-l", "fits-a-nb-and-l-1"}
    assert len(LINKS) >= 50  # the docs link to each other; an empty list would check nothing


def test_every_relative_link_reaches_its_file_and_heading() -> None:
    broken = [
        where
        for where, target, anchor in LINKS
        if not target.exists() or anchor and target.suffix == ".md" and anchor not in anchors(target.read_text())
    ]
    assert broken == [], "links to no file or no heading: " + "; ".join(broken)
