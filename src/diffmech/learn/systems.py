"""Mechanical systems for learned dynamics: a :class:`~diffmech.RobotModel` plus the conventions of a data set.

A :class:`System` wraps any robot model with what a learning experiment needs beyond the dynamics:
the coordinate convention of the data (``q_data = q_robot - angle_offset``), which coordinates are
angles (embedded as ``(cos, sin)`` by the networks), how the control ``u (nu,)`` enters as the
generalised force ``tau = B u``, and how initial conditions are drawn.

Presets (:func:`get_system`):

- ``pendulum``: the seed paper's gym pendulum (``MyPendulum-v0``): a uniform rod, ``m = 1``,
  ``l = 1``, ``g = 9.81``, angle ``0`` upright, ``theta'' = (3 g / 2 l) sin(theta) + 3 u / (m l^2)``.
  Mapped onto :func:`diffmech.model.systems.pendulum` as a bob of mass 1 at ``0.5`` m (the rod's
  centre of mass) whose sphere radius ``sqrt(1 / 4.8)`` m gives the rod's inertia ``1/3`` about the
  pivot; ``theta = q_robot - pi`` (the builder's angle ``0`` hangs down).
- ``cartpole``: the seed's gym cart-pole (``MyCartPole-v0``): cart 1 kg, pole 0.1 kg, half length
  0.5 m (a uniform rod), ``theta = 0`` upright, state order ``(x, theta)``; mapped onto
  :func:`diffmech.model.systems.cartpole` with the bob at 0.5 m, radius ``0.5 / sqrt(1.2)`` m
  (inertia ``m l^2 / 3`` about the centre), ``theta = q_robot - pi``; ``u`` pushes the cart.
- ``damped_pendulum``, ``damped_cartpole``: the same with viscous joint damping (not in the paper).
- ``double_pendulum``: :func:`diffmech.model.systems.double_pendulum` (chaotic), builder angles.
- ``arm3``: a planar 3-DoF arm (thin rods) loaded from a URDF written by :func:`arm3_urdf`.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from ..errors import ModelError
from ..model import systems as _builders

__all__ = ["System", "SystemPreset", "PRESETS", "get_system", "system_from_robot", "detect_angles", "arm3_urdf"]


def detect_angles(robot) -> tuple[bool, ...]:
    """Which coordinates of a fixed-base ``robot`` are revolute (angles), from the public Jacobians.

    A revolute joint contributes angular velocity to the links it moves, a prismatic one does not.
    """
    if robot.floating_base:
        raise ModelError(f"detect_angles: robot '{robot.name}' has a floating base; learned dynamics here need "
                         "a fixed base (pass angle_mask explicitly for other coordinates)")
    q = robot.neutral_configuration()
    ang = torch.zeros(robot.nv, dtype=torch.bool)
    for link in robot.link_names:
        J = robot.jacobian(q, link)
        ang |= (J[3:].abs() > 1e-12).any(0).cpu()
    return tuple(bool(a) for a in ang)


@dataclass(frozen=True)
class SystemPreset:
    """How to build a :class:`System` and draw its data (see the module docstring).

    Attributes:
        name: preset name (the CLI's ``--system``).
        build: returns the float64 robot model.
        angle_offset: ``q_robot = q_data + angle_offset``, rad (per coordinate).
        angle_mask: which coordinates are angles (``None``: revolute joints, see :func:`detect_angles`).
        input_matrix: ``B (nv, nu)``, ``tau = B u``.
        sampler: ``"gym_pendulum"``, ``"gym_cartpole"`` (the seed's draws, in its order) or ``"uniform"``.
        q_range, v_range: per-coordinate ``(low, high)`` of the uniform initial conditions.
        reset_float32: cast the drawn initial state to float32 (the seed's cart-pole does).
        max_abs: per state entry ``(q..., v...)``, trajectories must stay strictly below
            ``max_abs - 0.001`` (the seed's validity filter); ``inf`` for no limit.
        h: default time step, s.
        u_range: constant control per trajectory, ``u ~ U[u_range]`` per input.
        rtol, atol: default SciPy RK45 tolerances of the ground truth.
        lr, width: paper learning rate and hidden width.
        shuffle_e2e: shuffle E2E-SyMo's minibatches (the seed does for the cart-pole).
        coord_names: names of ``q``'s entries, for plots.
    """

    name: str
    build: Callable[[], object]
    angle_offset: tuple[float, ...]
    angle_mask: tuple[bool, ...] | None
    input_matrix: tuple[tuple[float, ...], ...]
    sampler: str
    q_range: tuple[tuple[float, float], ...]
    v_range: tuple[tuple[float, float], ...]
    reset_float32: bool = False
    max_abs: tuple[float, ...] = ()
    h: float = 0.1
    u_range: tuple[float, float] = (-2.0, 2.0)
    rtol: float = 1e-3
    atol: float = 1e-6
    lr: float = 1e-3
    width: int = 256
    shuffle_e2e: bool = False
    coord_names: tuple[str, ...] = ()
    description: str = ""


_PEND_RADIUS = math.sqrt(1 / 4.8)  # 0.4 * 1 * r^2 = 1/12: a bob at 0.5 m with the inertia of a 1 m rod
_POLE_RADIUS = 0.5 / math.sqrt(1.2)  # 0.4 m r^2 = m l^2 / 3 for l = 0.5


def _gym_pendulum(damping: float = 0.0):
    return _builders.pendulum(mass=1.0, length=0.5, damping=damping, bob_radius=_PEND_RADIUS, gravity=9.81)


def _gym_cartpole(damping=(0.0, 0.0)):
    return _builders.cartpole(cart_mass=1.0, pole_mass=0.1, pole_length=0.5, damping=damping,
                              bob_radius=_POLE_RADIUS, gravity=9.81)


def arm3_urdf(lengths: Sequence[float] = (0.5, 0.4, 0.3), masses: Sequence[float] = (1.0, 0.8, 0.5)) -> str:
    """URDF text of a planar 3-DoF arm: three thin uniform rods hanging from revolute joints about ``+y``."""
    links = ['<link name="base"><inertial><mass value="0"/><inertia ixx="0" iyy="0" izz="0" ixy="0" ixz="0" iyz="0"/>'
             '</inertial></link>']
    joints = []
    parent = "base"
    z = 0.0
    for i, (l, m) in enumerate(zip(lengths, masses), start=1):
        izz = m * l * l / 12
        links.append(
            f'<link name="link{i}"><inertial><origin xyz="0 0 {-l / 2}"/><mass value="{m}"/>'
            f'<inertia ixx="{izz}" iyy="{izz}" izz="1e-6" ixy="0" ixz="0" iyz="0"/></inertial></link>')
        joints.append(
            f'<joint name="joint{i}" type="revolute"><parent link="{parent}"/><child link="link{i}"/>'
            f'<origin xyz="0 0 {z}"/><axis xyz="0 1 0"/>'
            f'<limit lower="-1e3" upper="1e3" effort="100" velocity="100"/></joint>')
        parent, z = f"link{i}", -l
    return '<?xml version="1.0"?>\n<robot name="arm3">\n' + "\n".join(links + joints) + "\n</robot>\n"


def _arm3():
    from .. import load_urdf

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "arm3.urdf")
        with open(path, "w") as f:
            f.write(arm3_urdf())
        return load_urdf(path, dtype=torch.float64)


PRESETS: dict[str, SystemPreset] = {
    "pendulum": SystemPreset(
        "pendulum", _gym_pendulum, (math.pi,), (True,), ((1.0,),), "gym_pendulum",
        ((-math.pi, math.pi),), ((-2 * math.pi, 2 * math.pi),), max_abs=(math.inf, 100.0), h=0.1,
        lr=1e-4, width=128, coord_names=("theta",),
        description="seed 000 gym pendulum (uniform rod m = 1, l = 1, theta = 0 upright)"),
    "cartpole": SystemPreset(
        "cartpole", _gym_cartpole, (0.0, math.pi), (False, True), ((1.0,), (0.0,)), "gym_cartpole",
        ((-0.5, 0.5), (-3.14, 3.14)), ((-0.05, 0.05), (-3.0, 3.0)), reset_float32=True,
        max_abs=(200.0, math.inf, math.inf, 100 * math.pi), h=0.05, lr=1e-3, width=256, shuffle_e2e=True,
        coord_names=("x", "theta"),
        description="seed 000 gym cart-pole (cart 1 kg, pole 0.1 kg, half length 0.5 m, theta = 0 upright)"),
    "damped_pendulum": SystemPreset(
        "damped_pendulum", lambda: _gym_pendulum(0.05), (math.pi,), (True,), ((1.0,),), "uniform",
        ((-math.pi, math.pi),), ((-2 * math.pi, 2 * math.pi),), h=0.1, lr=1e-4, width=128,
        coord_names=("theta",), description="the gym pendulum with joint damping 0.05 N m s/rad"),
    "damped_cartpole": SystemPreset(
        "damped_cartpole", lambda: _gym_cartpole((0.1, 0.005)), (0.0, math.pi), (False, True), ((1.0,), (0.0,)),
        "uniform", ((-0.5, 0.5), (-3.14, 3.14)), ((-0.05, 0.05), (-3.0, 3.0)), h=0.05, lr=1e-3, width=256,
        shuffle_e2e=True, coord_names=("x", "theta"),
        description="the gym cart-pole with damping 0.1 N s/m (cart) and 0.005 N m s/rad (pole)"),
    "double_pendulum": SystemPreset(
        "double_pendulum", lambda: _builders.double_pendulum(gravity=9.81), (0.0, 0.0), (True, True),
        ((1.0, 0.0), (0.0, 1.0)), "uniform", ((-math.pi / 2, math.pi / 2),) * 2, ((-1.0, 1.0),) * 2, h=0.05,
        rtol=1e-9, atol=1e-9, lr=1e-3, width=256, coord_names=("theta1", "theta2"),
        description="diffmech double pendulum (point-like bobs 1 kg, rods 1 m), angle 0 hanging"),
    "arm3": SystemPreset(
        "arm3", _arm3, (0.0, 0.0, 0.0), (True, True, True), ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0)),
        # The light outer rod (0.5 kg, 0.3 m: 0.015 kg m^2 about its joint, 0.74 N m of gravity torque at
        # most) spins up under the other presets' constant controls of up to 2 N m (400 rad/s, 16 rad per
        # step of 0.05 s) and whips to 70 rad/s even unforced: controls of at most 0.5 N m and steps of
        # 0.02 s keep a step's turn under about 1 rad, as for the double pendulum at 0.05 s; the chaotic
        # ground truth needs the double pendulum's tolerances.
        "uniform", ((-math.pi / 2, math.pi / 2),) * 3, ((-1.0, 1.0),) * 3, h=0.02, u_range=(-0.5, 0.5),
        rtol=1e-9, atol=1e-9, lr=1e-3, width=256, coord_names=("q1", "q2", "q3"),
        description="planar 3-DoF arm of thin rods loaded from URDF (arm3_urdf), angle 0 hanging"),
}


@dataclass
class System:
    """A robot model with the conventions of a learning data set.

    Attributes:
        name: system name.
        robot: the float64 :class:`~diffmech.RobotModel` (ground truth).
        angle_offset: (n,) ``q_robot = q + angle_offset``.
        angle_mask: (n,) bool, coordinates embedded as ``(cos, sin)``.
        input_matrix: (n, nu) ``tau = B u``.
        preset: the :class:`SystemPreset` it came from (``None`` for :func:`system_from_robot`).
    """

    name: str
    robot: object
    angle_offset: Tensor
    angle_mask: tuple[bool, ...]
    input_matrix: Tensor
    preset: SystemPreset | None = None
    _rhs_cache: dict = field(default_factory=dict, repr=False)

    @property
    def n(self) -> int:
        return int(self.robot.nv)

    @property
    def nu(self) -> int:
        return int(self.input_matrix.shape[1])

    def _t(self, x) -> Tensor:
        return torch.as_tensor(x, dtype=self.robot.dtype, device=self.robot.device)

    def generalized_force(self, u: Tensor) -> Tensor:
        """``tau = B u``: (..., nu) -> (..., n)."""
        B = self.input_matrix.to(dtype=u.dtype, device=u.device)
        return u @ B.T

    def acceleration(self, q: Tensor, v: Tensor, u: Tensor) -> Tensor:
        """True ``q''`` (..., n) in the data's coordinates from ``q, v (..., n)`` and ``u (..., nu)``."""
        q, v, u = self._t(q), self._t(v), self._t(u)
        # ABA: measured 2 ms per call at every batch size here, where "auto" picked CRBA + LU at
        # batch 16-64 and took 16 ms on the 1-DoF pendulum.
        return self.robot.forward_dynamics(q + self.angle_offset, v, self.generalized_force(u), method="aba")

    def energy(self, q: Tensor, v: Tensor) -> Tensor:
        """Total mechanical energy (...,), J (potential up to a constant)."""
        q, v = self._t(q), self._t(v)
        qr = q + self.angle_offset
        return self.robot.kinetic_energy(qr, v) + self.robot.potential_energy(qr)

    def mass_matrix(self, q: Tensor) -> Tensor:
        """True inertia matrix (..., n, n)."""
        return self.robot.mass_matrix(self._t(q) + self.angle_offset)

    def rhs(self, y: np.ndarray, u: np.ndarray) -> np.ndarray:
        """ODE right-hand side for NumPy states ``y (B, 2n)`` and controls ``u (B, nu)`` (float64)."""
        n = self.n
        with torch.no_grad():
            yt = torch.from_numpy(np.ascontiguousarray(y, dtype=np.float64))
            a = self.acceleration(yt[:, :n], yt[:, n:], torch.from_numpy(np.ascontiguousarray(u, dtype=np.float64)))
        return np.concatenate([y[:, n:], a.cpu().numpy()], axis=1)


def system_from_robot(robot, *, name: str | None = None, angle_mask: Sequence[bool] | None = None,
                      angle_offset: Sequence[float] | None = None, input_matrix=None) -> System:
    """A :class:`System` on any fixed-base robot (builder or URDF); default: every joint actuated.

    Args:
        robot: a :class:`~diffmech.RobotModel`; it is cast to float64 for the ground truth.
        name: defaults to ``robot.name``.
        angle_mask: (n,) which coordinates are angles; default: the revolute joints.
        angle_offset: (n,) ``q_robot = q_data + angle_offset``; default zeros.
        input_matrix: (n, nu) ``tau = B u``; default identity.
    """
    robot = robot.to(dtype=torch.float64)
    n = int(robot.nv)
    mask = detect_angles(robot) if angle_mask is None else tuple(bool(a) for a in angle_mask)
    off = torch.zeros(n, dtype=torch.float64) if angle_offset is None else torch.as_tensor(
        angle_offset, dtype=torch.float64)
    B = torch.eye(n, dtype=torch.float64) if input_matrix is None else torch.as_tensor(input_matrix,
                                                                                         dtype=torch.float64)
    if len(mask) != n or off.shape != (n,) or B.dim() != 2 or B.shape[0] != n:
        raise ModelError(f"system_from_robot('{robot.name}'): angle_mask ({len(mask)}), angle_offset "
                         f"{tuple(off.shape)} and input_matrix {tuple(B.shape)} must match nv = {n}")
    return System(name or robot.name, robot, off, mask, B)


def get_system(name: str) -> System:
    """The :class:`System` of preset ``name`` (see :data:`PRESETS`)."""
    if name not in PRESETS:
        raise ModelError(f"unknown system '{name}'; presets: {', '.join(PRESETS)}")
    p = PRESETS[name]
    robot = p.build()
    s = system_from_robot(robot, name=p.name, angle_mask=p.angle_mask, angle_offset=p.angle_offset,
                          input_matrix=p.input_matrix)
    s.preset = p
    return s
