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


def stamp(rep: dict, *, argv, json_path: str | None, root: str, load_before, t_start: float) -> None:
    """Record in ``rep`` how the run was made: load before and after, wall time, the arguments as
    typed (empty for a plain run) and where its JSON goes (relative to the repository ``root``)."""
    import sys
    import time

    rep["load_before"], rep["load_after"] = load_before, os.getloadavg()
    rep["wall_s"] = time.perf_counter() - t_start
    rep["args"] = "" if argv is None and len(sys.argv) == 1 else " " + " ".join(sys.argv[1:] if argv is None else argv)
    if json_path:
        rep["json_path"] = os.path.relpath(json_path, root)


def publish(rep: dict, json_path: str | None, md_path: str | None, section, update) -> None:
    """Print each of ``rep["targets"]`` with its verdict, write ``rep`` as JSON to ``json_path`` and
    ``update(md_path, section(rep))`` into the markdown file; a ``None`` path skips that output."""
    import json

    for t in rep.get("targets", []):
        print(f"{t['target']}: {t['measured']} -> {'met' if t['met'] else 'NOT met'}")
    if json_path:
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        with open(json_path, "w") as f:
            json.dump(rep, f, indent=2, default=float)
    if md_path:
        update(md_path, section(rep))
