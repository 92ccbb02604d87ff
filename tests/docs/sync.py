"""The docs show their Python inline, each block a copy of a snippet that the docs tests run.

A block names its source in its fence's title, which mkdocs-material renders above it::

    ```python title="docs/snippets/tools.py"
    (the whole file, its section markers left out)

    ```python title="docs/snippets/tools.py · loop"
    (the lines between `# --8<-- [start:loop]` and `# --8<-- [end:loop]` in it, dedented)

``tests/docs/test_docs.py`` checks that every block equals its source. After editing a snippet, rewrite the blocks
from the snippets with ``python -m tests.docs.sync`` (or ``make docs-sync``).
"""

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RESYNC = "python -m tests.docs.sync"

_BLOCK = re.compile(r"^```python(?P<info>[^\n]*)\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
_TITLE = re.compile(r'title="(?P<path>docs/snippets/[\w-]+\.py)(?: · (?P<section>[\w-]+))?"')
_MARKER = re.compile(r"^\s*# --8<-- \[(?P<edge>start|end):(?P<name>[\w-]+)\]\s*$")


@dataclass(frozen=True, slots=True)
class Block:
    """A fenced Python block of a docs page."""

    page: Path
    line: int
    """Line of the opening fence, from 1."""
    path: Path | None
    """The snippet its title names; ``None`` when it names none."""
    section: str | None
    """The section of ``path`` it shows; ``None`` for the whole file."""
    body: str
    start: int
    """Offset of ``body`` in the page's text."""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def source(self) -> str:
        """Its title: the snippet, and the section if it shows one."""
        if self.path is None:
            return "no snippet"
        return str(self.path.relative_to(ROOT)) + (f" · {self.section}" if self.section else "")


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def blocks(page: Path) -> list[Block]:
    """The page's top-level ```` ```python ```` blocks, in order."""
    text = page.read_text()
    found = []
    for match in _BLOCK.finditer(text):
        title = _TITLE.search(match["info"])
        found.append(Block(
            page=page,
            line=text.count("\n", 0, match.start()) + 1,
            path=ROOT / title["path"] if title else None,
            section=title["section"] if title else None,
            body=match["body"],
            start=match.start("body"),
        ))
    return found


def shown(path: Path, section: str | None = None) -> str:
    """What a block titled ``path`` (and ``section``) shows: the file, or the section dedented; markers left out.

    Raises:
        LookupError: ``path`` has no such section, or its markers do not pair up.
    """
    lines = path.read_text().splitlines(keepends=True)
    if section is None:
        return "".join(line for line in lines if not _MARKER.match(line))
    edges = {"start": [], "end": []}
    for i, line in enumerate(lines):
        if (marker := _MARKER.match(line)) and marker["name"] == section:
            edges[marker["edge"]].append(i)
    if len(edges["start"]) != 1 or len(edges["end"]) != 1 or edges["start"][0] > edges["end"][0]:
        raise LookupError(f"{path.relative_to(ROOT)} has no section {section!r}: it needs one "
                          f"'# --8<-- [start:{section}]' line and, after it, one '# --8<-- [end:{section}]' line")
    inside = [line for line in lines[edges["start"][0] + 1 : edges["end"][0]] if not _MARKER.match(line)]
    return textwrap.dedent("".join(inside)).strip("\n") + "\n"


def sync() -> list[Path]:
    """Rewrites every titled block of the docs from its snippet; returns the pages that changed."""
    changed = []
    for page in pages():
        text = page.read_text()
        new, end = [], 0
        for block in blocks(page):
            if block.path is None:
                continue
            new += [text[end : block.start], shown(block.path, block.section)]
            end = block.start + len(block.body)
        new.append(text[end:])
        if "".join(new) != text:
            page.write_text("".join(new))
            changed.append(page)
    return changed


if __name__ == "__main__":
    for page in sync():
        print("rewrote", page.relative_to(ROOT))
