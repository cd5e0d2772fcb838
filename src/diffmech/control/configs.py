"""Configurations of the eigenmode experiments and the systems they run on.

Every choice the reconstruction of the eigenmode paper could not settle (spec section 7) is a field
here: spring factor, squared task term, network variant, steps per epoch, period, effort weight,
gains. Values marked in the field comments follow the paper's public code (2022 scripts unless
said otherwise).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field

import torch

from ..errors import ModelError
from .hamiltonian import HamiltonianSystem
from .potentials import MLPPotential

__all__ = ["EigenmodeConfig", "CONFIGS", "get_config", "smoke_test_note", "build_system", "build_potential"]

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclass
class EigenmodeConfig:
    """One learning run: system, task, loss, network, optimiser, solver."""

    name: str = "main"
    # system
    system: str = "double_pendulum"  # double_pendulum | three_link | iiwa
    masses: tuple[float, ...] = (1.0, 1.0)
    lengths: tuple[float, ...] = (1.0, 1.0)
    stiffness: tuple[float, ...] = (0.0, 0.5)  # k of the paper's table; see spring_factor
    rest: tuple[float, ...] = (0.0, math.pi / 2)  # joint-2 rest angle: right elbow (relative angle)
    spring_factor: str = "code"  # "code": V_s = k (q - rest)^2 (public code); "paper": 1/2 k (q - rest)^2
    gravity: float = 9.81
    joints: tuple[str, ...] | None = None  # free joints of a URDF robot (others locked at 0)
    ee_link: str | None = None
    # task
    q0: tuple[float, ...] = (-0.5, -0.5)
    target_angles: tuple[float, ...] | None = (0.75, 0.75)
    target_position: tuple[float, ...] | None = None  # task-space target (m), overrides target_angles
    period: float = 1.5
    learn_period: bool = False
    period_init: float = 1.0  # initial T when learned (appendix D)
    period_min: float = 0.0
    # loss
    w_task: float = 10.0
    task_squared: bool = True  # the code squares the end-effector distance
    effort: float = 1e-4  # c
    effort_anneal: bool = True  # cyclical 0 -> 1 ramp of the effort weight (code, not in the paper)
    effort_cycles: int = 4
    effort_ratio: float = 0.5
    lambdas: tuple[float, float, float] = (0.05, 0.0005, 0.95)  # q-symmetry, p-antisymmetry, p(T/2) = 0
    rho: float = 1.0
    samples: int = 25  # sample times of the constraint's max-norms, drawn per step
    # network
    hidden: int = 256
    depth: int = 2  # code: 2; paper Table 2: 1
    fourier: bool = True  # code: (sin q, cos q) input; paper Table 2: raw angles
    # initial potential (not in the paper): "default" = PyTorch's initialisation; "linear-mode" = the
    # output layer fitted so that the closed loop cancels the plant potential and oscillates in a
    # quadratic well whose straight-line mode joins q0 and the target configuration in T/2
    # (diffmech.control.warmstart; the target configuration is target_angles, else found by IK)
    init: str = "default"
    init_margin: float = 0.5  # rad around the segment q0 -> target configuration for the fit's samples
    # optimiser
    lr: float = 1e-3
    gamma: float = 0.999  # ExponentialLR, stepped per epoch
    epochs: int = 500
    steps_per_epoch: int = 7  # 2022 code: 7; 2023 code: 1
    # solver
    grid_points: int = 100  # linspace(0, 1, grid_points) plus s = 0.5
    method: str = "midpoint"
    solver: str = "newton"
    adjoint: str = "discrete"
    dtype: str = "float32"
    device: str = "cpu"  # where the system, the flow and the optimiser run ("cuda", "cuda:1", ...)
    native: bool = True  # build the core's native kernels (mass matrix, inverse dynamics) for the field
    seed: int = 0
    # stopping (None: run every epoch): stop once the discrete end-effector error at T/2 is below
    # stop_ee (m) and ||p(T/2)|| below stop_p
    stop_ee: float | None = None
    stop_p: float | None = None
    # Gauss-Newton polish (not in the paper): once the Adam phase's fixed-step end-effector error at
    # T/2 is below polish_from (m), solve the mode's conditions FK(q(T/2)) = x_d and p(T/2) = 0
    # (Lemmas 2.1-2.3: with p(0) = 0 they make the orbit periodic and time-symmetric) by damped
    # minimum-norm Gauss-Newton steps on the potential's parameters, on a more accurate trajectory
    # (polish_method on polish_grid_points), until ||FK - x_d|| < polish_tol[0] (m) and
    # ||p(T/2)|| < polish_tol[1]
    polish: bool = False
    polish_from: float = 0.03
    polish_method: str = "rk4"
    polish_grid_points: int = 200
    polish_tol: tuple[float, float] = (1e-3, 1e-3)
    polish_max_iter: int = 30
    # effort descent after the polish (not in the paper): once the conditions hold, steps that lower
    # the effort T int ||grad V||^2 ds (on the polish trajectory) within the null space of the
    # conditions' Jacobian, each combined with the Gauss-Newton correction of the residual, so the
    # conditions stay within polish_tol (EigenmodeTrainer.descend_effort)
    effort_descent: bool = False
    effort_descent_iter: int = 15
    effort_descent_fraction: float = 0.1  # the first step's predicted relative effort decrease
    effort_descent_corrections: int = 2  # second-order corrections per trial (Gauss-Newton, same Jacobian)
    # stabilisation defaults
    gains: tuple[float, float] = (1.0, 10.0)  # alpha_E, alpha_M
    damping: float = 0.0
    start: tuple[float, ...] | None = None  # perturbed start (q, p); default q0 + 0.7, p = 5
    notes: str = ""
    # A configuration that only checks that the pipeline runs (seconds, a few epochs): its outputs
    # say so, since its errors (metres at the end-effector) are nothing like the paper's millimetres.
    smoke_test: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    def replace(self, **changes) -> EigenmodeConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> EigenmodeConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {}
        for k, v in d.items():
            if k in names:
                kw[k] = tuple(v) if isinstance(v, list) else v
        return cls(**kw)


_MAIN = EigenmodeConfig(notes="Section 5 of the paper: q0 = (-0.5, -0.5), target FK(0.75, 0.75), T = 1.5 s, "
                              "c = 1e-4, 500 epochs of 7 steps (2022 code)")

CONFIGS: dict[str, EigenmodeConfig] = {
    "main": _MAIN,
    "example": _MAIN.replace(name="example", period=1.75, effort=1e-3, epochs=700, steps_per_epoch=1,
                             notes="the 2023 public example: T = 1.75 s, c = 1e-3, 700 epochs of 1 step"),
    "effort-sweep": _MAIN.replace(name="effort-sweep", epochs=100,
                                  notes="appendix B.1: one run per c in {0, 1e-5, ..., 1e-1} (--effort), 100 epochs"),
    "periods": _MAIN.replace(name="periods", epochs=300,
                             notes="appendix B.2: one run per T (--period)"),
    "other-pair": _MAIN.replace(name="other-pair", q0=(0.0, 0.0), target_angles=(1.5, 1.5), period=1.75,
                                notes="appendix C: q0 = (0, 0), target FK(1.5, 1.5), T in {1.75, 2.5, 3.0}"),
    "main-fast": _MAIN.replace(name="main-fast", lr=1e-2, gamma=0.998, epochs=1500, steps_per_epoch=1, polish=True,
                               polish_from=0.1, polish_grid_points=400,
                               notes="the main configuration's task (q0, target, T = 1.5 s, c = 1e-4) trained "
                                     "fast: Adam lr 0.01 decaying 0.998 per step on the midpoint grid until the "
                                     "end-effector error at T/2 is below 10 cm, then the Gauss-Newton polish of "
                                     "the mode's conditions on a 401-point RK4 grid"),
    "learn-period": _MAIN.replace(name="learn-period", learn_period=True, epochs=200,
                                  notes="appendix D: T learned jointly from T = 1.0"),
    "learn-period-c": _MAIN.replace(name="learn-period-c", learn_period=True, epochs=200, q0=(0.0, 0.0),
                                    target_angles=(1.5, 1.5),
                                    notes="appendix D, second pair: q0 = (0, 0), target FK(1.5, 1.5)"),
    "three-link": _MAIN.replace(name="three-link", system="three_link", masses=(1.0, 1.0, 1.0),
                                lengths=(0.7, 0.7, 0.6), stiffness=(0.0, 0.5, 0.5), rest=(0.0, 0.5, 0.5),
                                q0=(-0.4, -0.3, -0.2), target_angles=(0.6, 0.5, 0.4), period=1.8, epochs=300,
                                notes="beyond the paper: a 3-link arm with elastic joints"),
    "iiwa": _MAIN.replace(name="iiwa", system="iiwa", joints=("iiwa_joint_2", "iiwa_joint_4"),
                          ee_link="iiwa_link_ee", stiffness=(0.0, 0.0), rest=(0.0, 0.0), q0=(-0.5, 0.8),
                          target_angles=None, target_position=(0.6, 0.0, 0.95), period=1.5, epochs=300,
                          notes="beyond the paper: iiwa joints 2 and 4 (others locked at 0), task-space target"),
}
CONFIGS["main-fast-effort"] = CONFIGS["main-fast"].replace(
    name="main-fast-effort", effort_descent=True, effort_descent_iter=30,
    notes="main-fast followed by the effort descent in the null space of the mode's conditions")
_FAST = dict(lr=1e-2, gamma=0.998, epochs=1500, steps_per_epoch=1, polish=True, polish_from=0.1, polish_grid_points=400)
CONFIGS.update({
    "three-link-fast": CONFIGS["three-link"].replace(name="three-link-fast", **_FAST,
                                                     notes="the 3-link elastic arm with main-fast's schedule (Adam, "
                                                           "then the Gauss-Newton polish)"),
    "iiwa-fast": CONFIGS["iiwa"].replace(name="iiwa-fast", **_FAST, init="linear-mode",
                                         notes="iiwa joints 2 and 4, task-space target, with main-fast's schedule "
                                               "from the linear-mode initial potential (gravity cancelled, a "
                                               "quadratic well with the straight-line mode q0 -> target "
                                               "configuration of period T)"),
    "tiny": _MAIN.replace(name="tiny", hidden=16, epochs=6, steps_per_epoch=1, grid_points=40, samples=5,
                          smoke_test=True, notes="seconds-long smoke run for tests"),
})
CONFIGS["iiwa-fast-effort"] = CONFIGS["iiwa-fast"].replace(
    name="iiwa-fast-effort", effort_descent=True, effort_descent_iter=30,
    notes="iiwa-fast followed by the effort descent in the null space of the mode's conditions")


SMOKE_TEST_NOTE = ("smoke test: config {name!r} checks that the pipeline runs (a few epochs, a small "
                   "network); its numbers are not the paper's, use 'main' or 'main-fast' for those")


def smoke_test_note(cfg: EigenmodeConfig) -> str | None:
    """The sentence every output of a smoke-test run carries, or ``None`` for a real configuration.

    ``tiny`` counts as one by name as well, for runs resumed from checkpoints written before the
    ``smoke_test`` field existed.
    """
    if cfg.smoke_test or cfg.name == "tiny":
        return SMOKE_TEST_NOTE.format(name=cfg.name)
    return None


def get_config(name: str, **overrides) -> EigenmodeConfig:
    """A copy of ``CONFIGS[name]`` with ``overrides`` applied."""
    if name not in CONFIGS:
        raise KeyError(f"unknown eigenmode config {name!r}; choose from {sorted(CONFIGS)}")
    return CONFIGS[name].replace(**overrides)


def _spring(cfg: EigenmodeConfig) -> list[float]:
    if cfg.spring_factor not in ("code", "paper"):
        raise ModelError(f"spring_factor must be 'code' or 'paper', got {cfg.spring_factor!r}")
    # diffmech's joint spring stores 1/2 k' (q - rest)^2; the code's k (q - rest)^2 is k' = 2 k
    f = 2.0 if cfg.spring_factor == "code" else 1.0
    return [f * k for k in cfg.stiffness]


def build_robot(cfg: EigenmodeConfig, dtype: torch.dtype | None = None):
    """The robot of ``cfg`` (a builder of :mod:`diffmech.model.systems` or a URDF)."""
    from ..model import systems

    dtype = cfg.torch_dtype if dtype is None else dtype
    if cfg.system == "double_pendulum":
        return systems.double_pendulum(cfg.masses, cfg.lengths, stiffness=_spring(cfg), rest=cfg.rest,
                                       bob_radius=0.0, dtype=dtype, gravity=cfg.gravity)
    if cfg.system == "three_link":
        return systems.n_link_pendulum(3, masses=cfg.masses, lengths=cfg.lengths, stiffness=_spring(cfg),
                                       rest=cfg.rest, bob_radius=0.0, dtype=dtype, gravity=cfg.gravity)
    if cfg.system == "iiwa":
        try:
            import diff_robot_data
        except ImportError as exc:  # pragma: no cover - optional data package
            raise ModelError("config 'iiwa' needs the package differentiable-robot-model (diff_robot_data)") from exc
        from .. import load_urdf

        path = os.path.join(list(diff_robot_data.__path__)[0], "kuka_iiwa/urdf/iiwa7.urdf")
        return load_urdf(path, dtype=dtype)
    raise ModelError(f"unknown system {cfg.system!r} (double_pendulum, three_link, iiwa)")


def build_potential(cfg: EigenmodeConfig, n: int, dtype: torch.dtype | None = None) -> MLPPotential:
    dtype = cfg.torch_dtype if dtype is None else dtype
    return MLPPotential(n, hidden=cfg.hidden, depth=cfg.depth, fourier=cfg.fourier, dtype=dtype)


def build_system(cfg: EigenmodeConfig, potential=None, dtype: torch.dtype | None = None) -> HamiltonianSystem:
    """Robot plus (a fresh or the given) control potential, as a :class:`HamiltonianSystem`."""
    robot = build_robot(cfg, dtype)
    n = robot.nq if cfg.joints is None else len(cfg.joints)
    if potential is None:
        potential = build_potential(cfg, n, dtype)
    return HamiltonianSystem(robot, potential, joints=cfg.joints, ee_link=cfg.ee_link)
