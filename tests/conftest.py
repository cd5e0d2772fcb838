"""Shared fixtures: the robots of the test suite and seeded random states.

Robots are named by short keys (``ROBOTS``); :func:`robot_path` resolves a key to its URDF and
skips the test when the package that ships the file is not installed. :func:`get_robot` caches
one float64 model per key for read-only use -- a test that changes a model (parameters, dtype,
device) must work on ``copy.deepcopy(get_robot(key))``.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
import warnings

# Before diffmech is imported: the suite never touches the user's kernel cache (a fresh one per run,
# or $DIFFMECH_TEST_CACHE_DIR to keep kernels between runs while developing), and the public
# functions run the torch code unless a test asks for native kernels (kernels.native_mode), so that
# what a test checks does not depend on which kernels earlier tests happened to build.
if os.environ.get("DIFFMECH_TEST_CACHE_DIR"):
    os.environ["DIFFMECH_CACHE_DIR"] = os.environ["DIFFMECH_TEST_CACHE_DIR"]
else:
    _cache = tempfile.mkdtemp(prefix="diffmech-test-kernels-")
    os.environ["DIFFMECH_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
os.environ["DIFFMECH_NATIVE"] = "never"

import pytest  # noqa: E402
import torch  # noqa: E402

import diffmech  # noqa: E402

ASSETS = os.path.join(os.path.dirname(__file__), "assets")
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")

# key -> (source, relative path, floating_base). Sources: "drm" = differentiable-robot-model's
# diff_robot_data, "pybullet" = pybullet_data, "assets" = tests/assets (written for this suite).
ROBOTS: dict[str, tuple[str, str, bool]] = {
    "iiwa": ("drm", "kuka_iiwa/urdf/iiwa7.urdf", False),
    "panda": ("drm", "panda_description/urdf/panda_no_gripper.urdf", False),
    "allegro": ("drm", "allegro/urdf/allegro_hand_description_left.urdf", False),
    "fetch": ("drm", "fetch_description/urdf/fetch_arm_no_gripper.urdf", False),
    "trifinger": ("drm", "trifinger_edu_description/trifinger_edu.urdf", False),
    "jaco": ("drm", "kinova_description/urdf/jaco_clean.urdf", False),
    "pybullet_kuka": ("pybullet", "kuka_iiwa/model.urdf", False),
    "oblique_chain": ("assets", "oblique_chain.urdf", False),
    "prismatic_mix": ("assets", "prismatic_mix.urdf", False),
    "branching_tree": ("assets", "branching_tree.urdf", False),
    "laikago": ("pybullet", "laikago/laikago_toes_zup.urdf", True),
    "humanoid": ("assets", "humanoid.urdf", True),
    "floating_pair": ("assets", "floating_pair.urdf", True),
}

FLOATING = [k for k, v in ROBOTS.items() if v[2]]


def robot_path(key: str) -> str:
    """Absolute URDF path of robot ``key``; skips the calling test if its data package is missing."""
    source, rel, _ = ROBOTS[key]
    if source == "drm":
        pkg = pytest.importorskip("diff_robot_data")
        root = list(pkg.__path__)[0]
    elif source == "pybullet":
        root = pytest.importorskip("pybullet_data").getDataPath()
    else:
        root = ASSETS
    path = os.path.join(root, rel)
    if not os.path.isfile(path):
        pytest.skip(f"URDF of '{key}' not found at {path}")
    return path


@functools.cache
def _load(key: str) -> diffmech.RobotModel:
    with warnings.catch_warnings():
        # massless links are deliberate in several test robots
        warnings.filterwarnings("ignore", message=".*has no <inertial>.*")
        return diffmech.load_urdf(robot_path(key), floating_base=ROBOTS[key][2])


def load_example(name: str):
    """The module ``examples/<name>.py`` (the examples are scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def get_robot(key: str) -> diffmech.RobotModel:
    """The cached float64 model of robot ``key`` (do not modify it; deep-copy first)."""
    return _load(key)


def random_state(robot: diffmech.RobotModel, batch: tuple[int, ...], seed: int = 0, dtype=torch.float64):
    """Seeded ``(q, v, a, f_ext)`` with shapes ``(*batch, nq)``, ``(*batch, nv)`` x2, ``(*batch, n_links, 6)``.

    ``q`` lies within the joint limits (unit base quaternion for a floating base); velocities,
    accelerations and link wrenches are standard normal.
    """
    g = torch.Generator().manual_seed(seed)
    q = robot.random_configuration(*batch, generator=g).to(dtype)
    v = torch.randn(*batch, robot.nv, generator=g, dtype=torch.float64).to(dtype)
    a = torch.randn(*batch, robot.nv, generator=g, dtype=torch.float64).to(dtype)
    f = torch.randn(*batch, robot.n_links, 6, generator=g, dtype=torch.float64).to(dtype)
    return q, v, a, f


# Measured maxima of the oracle comparisons, printed at the end of the run when
# DIFFMECH_ORACLE_REPORT=1 (test_oracle_pinocchio.py fills it).
ORACLE_ERRORS: dict[tuple[str, str], float] = {}


def pytest_terminal_summary(terminalreporter):
    if not ORACLE_ERRORS or os.environ.get("DIFFMECH_ORACLE_REPORT") != "1":
        return
    tr = terminalreporter
    tr.section("diffmech vs Pinocchio: max relative error over 100 random states")
    robots = sorted({r for r, _ in ORACLE_ERRORS}, key=list(ROBOTS).index)
    for r in robots:
        items = [(k, e) for (rr, k), e in ORACLE_ERRORS.items() if rr == r]
        tr.write_line(f"{r:15s} " + "  ".join(f"{k}={e:.1e}" for k, e in items))
