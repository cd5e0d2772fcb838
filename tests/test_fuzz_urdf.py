"""Fuzzing the URDF loader: a model that loads is a model that simulates.

A few hundred seeded mutants of the bundled test robots and of ``pybullet_data`` files: numeric
attributes (mass, inertia entries, origins, axes, limits, damping, mimic) set to 0, negated, NaN,
infinite, 1e300 or a random huge or tiny power of ten, and elements deleted. Every mutant must either
load and give finite forward dynamics, inverse dynamics and mass matrix at a random state, or raise a
:class:`~diffmech.errors.DiffmechError`: no other exception, no NaN, no case over 10 s. ``python
tests/test_fuzz_urdf.py [n] [seed] [float32]`` prints the counts by outcome.
"""

from __future__ import annotations

import collections
import contextlib
import glob
import math
import os
import random
import re
import sys
import time
import warnings

import pytest
import torch
from lxml import etree

import diffmech
from diffmech.errors import DiffmechError

ASSETS = os.path.join(os.path.dirname(__file__), "assets")
PYBULLET = ["kuka_iiwa/model.urdf", "laikago/laikago.urdf", "r2d2.urdf", "xarm/xarm6_with_gripper.urdf",
            "cartpole.urdf", "pendulum5.urdf"]
N_MUTANTS = 500
MAX_SECONDS = 10.0

_NUMERIC = {  # element tag -> its numeric attributes
    "mass": ["value"], "inertia": ["ixx", "ixy", "ixz", "iyy", "iyz", "izz"], "origin": ["xyz", "rpy"],
    "axis": ["xyz"], "limit": ["lower", "upper", "effort", "velocity"], "dynamics": ["damping", "friction"],
    "mimic": ["multiplier", "offset"],
}
_DELETABLE = ("inertial", "mass", "inertia", "origin", "axis", "limit", "dynamics", "mimic")

# What a rejection says -> the reason it is counted under (first match).
_REASONS = [
    ("non-finite number", r"is NaN|must be finite|is -?inf"),
    ("magnitude over 1e9", r"exceeds 1e\+09"),
    ("negative value", r"is negative"),
    ("inertia not PSD / not symmetric", r"positive semi-definite|not symmetric"),
    ("DoF without mass (singular M)", r"moves no mass|mass matrix is singular|mass matrix overflows"),
    ("zero or invalid axis", r"axis"),
    ("inverted limits", r"lower limit .* > upper"),
    ("no moving joint", r"no moving joint"),
    ("topology (links, joints, mimic)", r"does not exist|not reachable|two joints|root|mimic|no links|duplicate"),
    ("unparsable (XML, yourdfpy)", r"malformed|cannot parse|not a number|numbers, expected|root element"),
]


def sources() -> list[str]:
    files = sorted(glob.glob(os.path.join(ASSETS, "*.urdf")))
    with contextlib.suppress(ImportError):
        import pybullet_data

        root = pybullet_data.getDataPath()
        files += [os.path.join(root, f) for f in PYBULLET if os.path.exists(os.path.join(root, f))]
        files += sorted(glob.glob(os.path.join(root, "random_urdfs", "00[0-4]", "*.urdf")))
    return files


def _value(rng: random.Random, old: float) -> str:
    choice = rng.randrange(10)
    if choice == 0:
        return "0"
    if choice == 1:
        return repr(-old if old else -1.0)
    if choice == 2:
        return "nan"
    if choice == 3:
        return rng.choice(["inf", "-inf"])
    if choice == 4:
        return rng.choice(["1e300", "-1e300", "1e308"])
    if choice == 5:
        return f"{rng.choice([1, -1]) * 10.0 ** rng.uniform(9, 300):.6g}"  # huge
    if choice == 6:
        return f"{rng.choice([1, -1]) * 10.0 ** rng.uniform(-320, -6):.6g}"  # tiny (denormals too)
    if choice == 7:
        return f"{rng.choice([1e12, 1e15, 1e20, 1e38, 1e39])!r}"
    return f"{old * 10.0 ** rng.uniform(-3, 3):.6g}"  # plausible but rescaled


def mutate(xml: bytes, rng: random.Random) -> tuple[bytes, list[str]]:
    """One mutant of ``xml`` and what was done to it."""
    root = etree.fromstring(xml, etree.XMLParser(remove_comments=True))
    done = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        if rng.random() < 0.15:
            tags = ("joint", "link") if rng.random() < 0.2 else _DELETABLE
            found = [el for el in root.iter(*tags)] or [el for el in root.iter("joint", "link")]
            if not found:
                continue
            el = rng.choice(found)
            el.getparent().remove(el)
            done.append(f"delete <{el.tag}>")
            continue
        found = [(el, a) for el in root.iter(*_NUMERIC) for a in _NUMERIC[el.tag] if el.get(a) is not None]
        if not found:
            continue
        el, attr = rng.choice(found)
        parts = el.get(attr).split()
        k = rng.randrange(len(parts))
        try:
            old = float(parts[k])
        except ValueError:
            old = 1.0
        parts[k] = _value(rng, old)
        el.set(attr, " ".join(parts))
        done.append(f"<{el.tag} {attr}> -> {el.get(attr)!r}")
    return etree.tostring(root), done


def reason(err: Exception) -> str:
    msg = str(err)
    return next((name for name, pat in _REASONS if re.search(pat, msg)), f"other: {msg[:80]}")


def check_mutant(xml: bytes, floating_base: bool, seed: int, dtype: torch.dtype = torch.float64) -> str:
    """``"loaded"`` or ``"rejected: <reason>"``; raises AssertionError on anything else."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            robot = diffmech.load_urdf(xml.decode(), floating_base=floating_base, dtype=dtype)
    except DiffmechError as e:
        return f"rejected: {reason(e)}"
    g = torch.Generator().manual_seed(seed)
    q = robot.random_configuration(generator=g)
    v, tau, a = (torch.randn(robot.nv, generator=g, dtype=robot.dtype) for _ in range(3))
    try:
        out = {"forward_dynamics": robot.forward_dynamics(q, v, tau),
               "inverse_dynamics": robot.inverse_dynamics(q, v, a), "mass_matrix": robot.mass_matrix(q)}
    except DiffmechError as e:
        return f"loaded, dynamics refused: {reason(e)}"
    bad = [k for k, t in out.items() if not bool(torch.isfinite(t).all())]
    assert not bad, f"the model loads but {bad} are not finite at q={q.tolist()}"
    return "loaded"


def run(n: int, seed: int, dtype: torch.dtype = torch.float64) -> tuple[collections.Counter, list[str], float]:
    """Counts by outcome, the failures (mutations and error), and the slowest case in seconds."""
    rng = random.Random(seed)
    files = sources()
    texts = {f: open(f, "rb").read() for f in files}
    counts: collections.Counter = collections.Counter()
    failures: list[str] = []
    slowest = 0.0
    for i in range(n):
        path = rng.choice(files)
        xml, done = mutate(texts[path], rng)
        floating = rng.random() < 0.3 or "random_urdfs" in path
        t0 = time.perf_counter()
        try:
            outcome = check_mutant(xml, floating, seed=i, dtype=dtype)
        except Exception as e:  # noqa: BLE001 - any other exception is what the fuzzing looks for
            outcome = "FAILED"
            failures.append(f"#{i} {os.path.basename(path)} floating={floating} {done}: {type(e).__name__}: {e}")
        dt = time.perf_counter() - t0
        slowest = max(slowest, dt)
        if dt > MAX_SECONDS:
            failures.append(f"#{i} {os.path.basename(path)} {done}: took {dt:.1f} s")
        counts[outcome] += 1
    return counts, failures, slowest


@pytest.mark.slow
def test_every_mutant_loads_and_simulates_or_is_refused():
    t0 = time.perf_counter()
    counts, failures, slowest = run(N_MUTANTS, seed=20240611)
    total = time.perf_counter() - t0
    print(f"\n{N_MUTANTS} mutants in {total:.0f} s (slowest {slowest:.2f} s):")
    for outcome, k in counts.most_common():
        print(f"  {k:4d}  {outcome}")
    assert not failures, "\n".join(failures[:20])
    assert counts["loaded"] > N_MUTANTS // 10  # the mutants are not all trivially refused
    assert math.isfinite(total)


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else N_MUTANTS
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 20240611
    dtype = getattr(torch, sys.argv[3]) if len(sys.argv) > 3 else torch.float64
    t0 = time.perf_counter()
    counts, failures, slowest = run(n, seed, dtype)
    print(f"{n} mutants in {time.perf_counter() - t0:.0f} s (slowest {slowest:.2f} s)")
    for outcome, k in counts.most_common():
        print(f"  {k:4d}  {outcome}")
    print("\n".join(failures))
