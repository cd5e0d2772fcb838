"""Shared fixtures: the robots of the test suite and seeded random states.

Robots are named by short keys (``ROBOTS``); :func:`robot_path` resolves a key to its URDF and
skips the test when the package that ships the file is not installed. :func:`get_robot` caches
one float64 model per key for read-only use -- a test that changes a model (parameters, dtype,
device) must work on ``copy.deepcopy(get_robot(key))``.

Every test starts from the same process-wide state, whatever ran before it: the global random
generators (torch, numpy, ``random``) seeded with 0, and the thread count, default dtype, grad
mode, native-kernel mode and ``DIFFMECH_*`` environment variables put back after it.

With ``DIFFMECH_REQUIRE_ORACLES=1`` (``.ci/run`` sets it) a skip is a failure unless its reason
is allowed by ``tests/skip_policy.py`` (no GPU, and two documented opt-in cases).
"""

from __future__ import annotations

import atexit
import functools
import os
import random
import shutil
import tempfile
import warnings

# Before torch and diffmech are imported: the suite never touches the user's caches -- diffmech's
# kernels, torch.compile's (inductor) and Triton's -- but uses a fresh folder per run, or
# $DIFFMECH_TEST_CACHE_DIR to keep them between runs while developing; a timing of the suite is then
# that of a cold cache, as CI sees it. The public functions run the torch code unless a test asks for
# native kernels (kernels.native_mode), so that what a test checks does not depend on which kernels
# earlier tests happened to build.
_run_tmp = tempfile.mkdtemp(prefix="diffmech-test-")
atexit.register(shutil.rmtree, _run_tmp, ignore_errors=True)
_cache = os.environ.get("DIFFMECH_TEST_CACHE_DIR") or _run_tmp
os.environ["DIFFMECH_CACHE_DIR"] = _cache  # the kernels go to its kernels/ subfolder
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_cache, "torchinductor")
os.environ["TRITON_CACHE_DIR"] = os.path.join(_cache, "triton")
# stable-baselines3 otherwise leaves a log folder in /tmp for every model a test trains
os.environ["SB3_LOGDIR"] = os.path.join(_run_tmp, "sb3")
os.environ["DIFFMECH_NATIVE"] = "never"

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import diffmech  # noqa: E402
from diffmech.dynamics import kernels  # noqa: E402
from skip_policy import allowed  # noqa: E402

REQUIRE_ORACLES = os.environ.get("DIFFMECH_REQUIRE_ORACLES") == "1"

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
    """Absolute URDF path of robot ``key``; skips the calling test if its data package is missing
    (a failure under ``DIFFMECH_REQUIRE_ORACLES=1``)."""
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


# ---------------------------------------------------------------- the same start for every test
@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # before the fixtures, module-scoped ones included: their draws are seeded too
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)


@pytest.fixture(autouse=True)
def _restore_process_state():
    """Put back what a test (or a CLI it calls in-process, e.g. ``--threads``) changed process-wide."""
    threads, dtype, grad, warn_always, mode = (torch.get_num_threads(), torch.get_default_dtype(),
                                               torch.is_grad_enabled(), torch.is_warn_always_enabled(),
                                               kernels._MODE[0])
    env = {k: v for k, v in os.environ.items() if k.startswith("DIFFMECH_")}
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    torch.set_default_dtype(dtype)
    torch.set_grad_enabled(grad)
    torch.set_warn_always(warn_always)
    if kernels._MODE[0] != mode:
        kernels.set_native(mode)
    for k in [k for k in os.environ if k.startswith("DIFFMECH_") and k not in env]:
        del os.environ[k]
    os.environ.update(env)


# ---------------------------------------------------------------- DIFFMECH_REQUIRE_ORACLES=1: no silent skips
def _skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


def _fail_skip(report) -> None:
    reason = _skip_reason(report)
    if allowed(reason):
        return
    report.outcome = "failed"
    report.longrepr = (f"DIFFMECH_REQUIRE_ORACLES=1: this skip is a failure -- {reason}\n"
                       "(tests/skip_policy.py lists the only skips allowed then)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_ORACLES and report.skipped and not hasattr(report, "wasxfail"):
        _fail_skip(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    # a module-level importorskip skips the whole file at collection
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_ORACLES and report.skipped:
        _fail_skip(report)
