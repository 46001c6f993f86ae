"""The relative links between README.md, docs/ and bench/ point at files (and headings) that exist.

The front door links into docs/ and bench/README.md, and those link to each other; a moved or
renamed section should fail here rather than leave a dead link."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DOCS = [
    ROOT / "README.md",
    ROOT / "bench" / "README.md",
    ROOT / "bench" / "traces" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(markdown: str) -> str:
    """``markdown`` without fenced blocks and inline code, where brackets are not links."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M))


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the headings: lower case, punctuation dropped, spaces to hyphens."""
    return {
        re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in prose(markdown).splitlines()
        if line.startswith("#")
    }


def dead_links(doc: Path, root: Path = ROOT) -> list[str]:
    dead = []
    for target in LINK.findall(prose(doc.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            dead.append(f"{doc.relative_to(root)}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            dead.append(f"{doc.relative_to(root)}: {target} (no such heading)")
    return dead


def test_the_check_finds_a_dead_file_and_a_dead_heading(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# B\n\n## The local cluster: a real node\n")
    doc = tmp_path / "a.md"
    doc.write_text(
        "[ok](b.md#the-local-cluster-a-real-node) [gone](c.md) [no heading](b.md#nope)\n"
        "`[code](x.md)` [web](https://example.com)\n```\n[fenced](y.md)\n```\n"
    )
    assert dead_links(doc, tmp_path) == ["a.md: c.md (no such file)", "a.md: b.md#nope (no such heading)"]


def test_docs_links_resolve() -> None:
    assert (ROOT / "docs").is_dir()
    dead = [line for doc in DOCS for line in dead_links(doc)]
    assert dead == []
