"""The documentation: every ```python block of docs/ runs, and the site builds with ``mkdocs build --strict``.

The blocks of one page run in order in one namespace (a page is one script cut into pieces), in a
temporary working directory. A page declares what it needs in HTML comments, which the site does
not show:

- ``<!-- docs-test: slow -->``: the page takes more than about 10 s (marked ``slow``);
- ``<!-- docs-test: requires MODULE -->``: skipped when ``MODULE`` cannot be imported (a failure under
  ``DIFFMECH_REQUIRE_ORACLES=1``, as in CI).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
DIRECTIVE = re.compile(r"<!--\s*docs-test:\s*(\w+)\s*([^>]*?)\s*-->")


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(line, code)`` of each fenced ```python block, ``line`` the 1-based line of its first code line."""
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in FENCE.finditer(text)]


def directives(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, arg in DIRECTIVE.findall(text):
        out.setdefault(name, []).extend(arg.split())
    return out


def _pages() -> list:
    params = []
    for path in sorted(DOCS.rglob("*.md")):
        text = path.read_text(encoding="utf-8")
        if not python_blocks(text):
            continue
        marks = [pytest.mark.slow] if "slow" in directives(text) else []
        params.append(pytest.param(path, marks=marks, id=str(path.relative_to(DOCS))))
    return params


def test_block_extraction():
    text = ("# t\n\n```python\na = 1\n```\n\n```bash\nls\n```\n\n```python\nb = a + 1\n```\n"
            "<!-- docs-test: requires x y -->\n")
    assert python_blocks(text) == [(4, "a = 1\n"), (12, "b = a + 1\n")]
    assert directives(text) == {"requires": ["x", "y"]}


def test_pages_have_code():
    # the tutorials and the migration pages are checked by running them: each must have code
    for name in ("getting-started.md", "coming-from-drm.md", "coming-from-pinocchio.md"):
        assert python_blocks((DOCS / name).read_text(encoding="utf-8")), name
    tutorials = sorted((DOCS / "tutorials").glob("*.md"))
    assert len(tutorials) >= 7
    for path in tutorials:
        assert python_blocks(path.read_text(encoding="utf-8")), path.name


@pytest.mark.parametrize("path", _pages())
def test_page_runs(path: Path, tmp_path, monkeypatch):
    text = path.read_text(encoding="utf-8")
    for module in directives(text).get("requires", []):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{path.name} needs {module}")
    monkeypatch.chdir(tmp_path)  # files a page writes land in a temporary folder
    namespace = {"__name__": "__docs__"}
    import matplotlib
    import torch

    matplotlib.use("Agg")
    dtype, grad = torch.get_default_dtype(), torch.is_grad_enabled()
    warn_always = torch.is_warn_always_enabled()  # set below for the requires-grad check
    try:
        with warnings.catch_warnings():
            # a page shows what a user sees; warnings it triggers on purpose do not fail the test
            warnings.simplefilter("ignore")
            # ... except torch's warning for float() of a tensor that requires grad: a page that
            # prints a loss must show the warning-free spelling (loss.item()) users copy. torch
            # gives it once per process; warn_always makes every page's float() raise it.
            warnings.filterwarnings("error", message="Converting a tensor with requires_grad=True to a scalar",
                                    category=UserWarning)
            torch.set_warn_always(True)
            for line, code in python_blocks(text):
                # pad with blank lines so that a traceback's line numbers are those of the .md file
                compiled = compile("\n" * (line - 1) + code, str(path), "exec")
                exec(compiled, namespace)
    finally:
        # the next tests of this process must not see what a page changed process-wide
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)
        torch.set_warn_always(warn_always)


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    pytest.importorskip("material")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    # The README's command, with the site in a temporary folder. No -q: it lowers mkdocs's log level
    # below WARNING, and --strict then counts no warnings at all.
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                        "-d", str(tmp_path / "site")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log
    # --strict aborts on the warnings mkdocs counts; a plugin that prints one past its logger must fail too
    assert not re.search(r"^\s*(WARNING|ERROR)\b", log, re.M), log
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "api" / "sim" / "index.html").is_file()
