"""The generated sections of BENCHMARKS.md: each benchmark rewrites the text between its own markers."""

from __future__ import annotations

import os


def replace_section(path: str, section: str, start: str, end: str, heading: str = "") -> None:
    """Put ``section`` (text that begins with the marker ``start`` and ends with ``end``) into the
    markdown file ``path`` in place of the text between those markers, or append it (after
    ``heading``, if given) when the file has no such section; a missing file is created."""
    text = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    if start in text and end in text:
        a, b = text.index(start), text.index(end) + len(end)
        text = text[:a] + section + text[b:]
    else:
        text = text.rstrip("\n") + "\n\n" + (f"{heading}\n\n" if heading else "") + section + "\n"
    with open(path, "w") as f:
        f.write(text)
