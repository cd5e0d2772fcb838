"""Which skips a CI run may contain, and the count of a run's skips by reason.

``.ci/run`` sets ``DIFFMECH_REQUIRE_ORACLES=1``. Under it, ``tests/conftest.py`` turns every skip
whose reason matches none of :data:`ALLOWED` into a failure: a missing reference library
(Pinocchio, MuJoCo, differentiable-robot-model, PyBullet, coal, ...), a missing package of the
``test`` extra, a missing C compiler, robot data or data set. A run that cannot check something
then says so instead of staying green.

``python tests/skip_policy.py JUNIT_XML`` prints the skips of a finished run (pytest's
``--junitxml``) grouped by reason and exits 1 if one of them is not allowed: ``.ci/run``'s check,
which reads pytest's own record of the run and so does not depend on the conftest hook.

Only the standard library here: ``.ci/run`` reads the report without importing torch.
"""

from __future__ import annotations

import ast
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter

# (pattern matched against the skip reason with re.search, why a CI run may skip for it)
ALLOWED: list[tuple[str, str]] = [
    (r"^(needs CUDA|no CUDA device)$", "CI has no GPU"),
    (r"^DIFFMECH_DRM_REPO \(a differentiable-robot-model checkout\) is not set$",
     "opt-in: differentiable-robot-model's own test suite is in no package, only in its git repository; "
     "tests/test_compat_drm.py compares diffmech.compat.drm with the installed library in every run"),
    (r"^chown to another user needs root$",
     "the refusal of kernels owned by another user can only be set up by root; a CI runner that is not "
     "root cannot create the case"),
]


def allowed(reason: str) -> bool:
    return any(re.search(pattern, reason) for pattern, _ in ALLOWED)


def junit_skips(path: str) -> list[tuple[str, str]]:
    """``(test id, reason)`` of each skipped (or xfailed) test and skipped module of a JUnit XML report."""
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}".strip(":")
        for el in case.findall("skipped"):
            reason = el.get("message", "")
            if reason == "collection skipped":
                # pytest writes a skipped module's report as the repr of (path, line, "Skipped: reason")
                try:
                    reason = str(ast.literal_eval(el.text or "")[2])
                except (ValueError, SyntaxError, IndexError, TypeError):
                    reason = (el.text or reason).strip()
                reason = reason.removeprefix("Skipped: ")
            if el.get("type") == "pytest.xfail":
                reason = f"xfail: {reason}"
            out.append((test, reason))
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python tests/skip_policy.py JUNIT_XML", file=sys.stderr)
        return 2
    try:
        skips = junit_skips(argv[0])
    except (OSError, ET.ParseError) as err:
        print(f"skip_policy: no readable test report ({err})", file=sys.stderr)
        return 1
    counts = Counter(reason for _, reason in skips)
    first = {}
    for test, reason in skips:
        first.setdefault(reason, test)
    print(f"skips: {len(skips)}")
    for reason, n in counts.most_common():
        tag = "allowed" if allowed(reason) else "NOT ALLOWED"
        print(f"{n:6d}  [{tag}] {reason}  (e.g. {first[reason]})")
    bad = [r for r in counts if not allowed(r)]
    if bad:
        print(f"skip_policy: {len(bad)} skip reason(s) outside the allow-list of tests/skip_policy.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
