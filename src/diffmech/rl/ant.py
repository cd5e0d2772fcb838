"""The Ant locomotion task: MuJoCo's ``Ant`` (v4/v5 semantics) on diffmech's contact simulator.

:class:`Ant` is a :class:`~diffmech.rl.env.DiffEnv` over the scene of :func:`diffmech.sim.scenes.ant`
(a 0.91 kg robot: a sphere torso, four legs of two capsules, eight motors of gear 150 N m), stepped
by :func:`diffmech.sim.contact_step` (hard frictional contact by projected Gauss-Seidel, gradients
by the implicit function theorem at the contact solution), so rewards and observations carry
gradients w.r.t. actions and states like the other tasks.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor

from ..dynamics import kernels
from ..dynamics.kernel_store import NativeUnavailable
from ..dynamics.kernel_store import available as native_available
from ..errors import OptionError
from ..sim import prepare_ground_kernels
from ..sim.contact_step import contact_step
from .env import DiffEnv

__all__ = ["Ant"]


class Ant(DiffEnv):
    """Make the Ant run along ``+x``.

    Timing: the simulator steps ``sim_dt`` = 0.01 s (the MuJoCo Ant's ``timestep``; diffmech's
    semi-implicit Euler with velocity-level contacts where MuJoCo's file uses RK4 with soft
    contacts) and one environment step is ``frame_skip`` = 5 of them, ``dt = 0.05`` s as in
    gymnasium's ``Ant-v4``/``v5`` (an action is held for 0.05 s). At 0.01 s the contacts of a
    random-action gait penetrate at most about 1 cm; 0.025 s steps reach 2.5 cm and 0.05 s steps
    18 cm, so the simulator step stays at 0.01 s and a larger ``dt`` costs more substeps.

    Action ``(N, 8)`` in ``[-1, 1]`` (clamped): joint torques ``150 a`` N m in the joint order
    of :func:`diffmech.model.ant.ant_robot` (hip, ankle of front_left, front_right, back_left,
    back_right), held over the step.

    Observation ``(N, 27)``, MuJoCo's layout (``qpos`` without ``x, y``, then ``qvel``): torso height
    ``z`` (m, index 0), torso orientation as a unit quaternion ``(w, x, y, z)`` (indices 1-4), 8 joint
    angles (rad, 5-12), the torso's linear velocity in world axes (m/s, 13-15), its angular velocity
    in torso axes (rad/s, 16-18), 8 joint rates (rad/s, 19-26).

    The quaternion's ``w`` comes first here although diffmech's ``q`` stores it last
    (``q[3:7]`` is ``(x, y, z, w)``, see the conventions page): the observation follows MuJoCo's
    ``qpos`` and gymnasium's ``Ant-v5``, so that a policy trained here reads the same vector there
    (:mod:`diffmech.rl.transplant`). ``obs[:, 1:5]`` is ``q[:, [6, 3, 4, 5]]``.

    Reward of a step (gymnasium ``Ant-v5``, without its contact cost):
    ``(x_1 - x_0) / dt + healthy_reward * healthy(s_1) - ctrl_cost_weight * |a|^2``, with ``x`` the
    torso's ``x`` before and after the step and ``healthy`` true while the state is finite and the
    torso's height lies in ``healthy_z_range`` (0.2, 1.0) m (``Ant-v4`` pays the healthy reward on
    the terminating step too; v5 and this task do not). The episode terminates when the state is
    not healthy and is truncated after ``horizon`` steps (1000, 50 s, as gymnasium's).

    Start: the scene's pose (torso 0.75 m up and level, hips 0, ankles 40 deg; see
    :func:`diffmech.sim.scenes.ant`) plus ``reset_noise`` uniform on every position coordinate (the
    quaternion re-normalised) and ``reset_noise`` times a standard normal on every velocity, as
    gymnasium's Ant (0.1).

    Args:
        num_envs: parallel environments.
        frame_skip, sim_dt: substeps per step and their length, s.
        horizon: steps per episode.
        ctrl_cost_weight, healthy_reward, healthy_z_range, reset_noise: the task's constants above.
        geometry: :class:`diffmech.model.ant.AntGeometry` (default the MuJoCo Ant's).
        friction: Coulomb coefficient of the feet on the ground.
        iterations: projected Gauss-Seidel sweeps per substep (the solver starts from the last
            substep's impulses while stepping).
        contact_solver, smoothing, friction_smoothing: the scene's contact model (:class:`~diffmech.sim.Scene`):
            ``"pgs"`` (hard contacts, default) or ``"smooth"`` (the relaxed problem, whose gradients see
            contacts about to be made or broken), with its ``kappa`` and ``eps``.
        device, dtype: of the simulation (float64 by default: float32 contact impulses of a light robot
            under 150 N m motors lose too many digits for the finite-difference tests).
        seed: of the start states.
        native: run the contact step's rigid-body terms (mass matrix, bias forces, link poses and
            Jacobians) as native kernels, built once per machine (:func:`diffmech.dynamics.kernels.prepare`,
            seconds) and loaded from the disk store afterwards; ``None`` (default): on the CPU where a C
            compiler is found. Without them the same terms run as torch code, about 4x slower for 64 Ants
            with gradients.
    """

    def __init__(self, num_envs: int = 1, *, frame_skip: int = 5, sim_dt: float = 0.01, horizon: int = 1000,
                 ctrl_cost_weight: float = 0.5, healthy_reward: float = 1.0,
                 healthy_z_range: tuple[float, float] = (0.2, 1.0), reset_noise: float = 0.1, geometry=None,
                 friction: float = 1.0, iterations: int = 50, contact_solver: str = "pgs",
                 smoothing: float = 1e-6, friction_smoothing: float = 1e-4,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float64, seed: int | None = None,
                 native: bool | None = None):
        from ..model.ant import AntGeometry
        from ..sim.scenes import ant

        if isinstance(frame_skip, bool) or not isinstance(frame_skip, int) or frame_skip < 1:
            raise OptionError(f"Ant: frame_skip must be a positive integer, got {frame_skip!r}")
        if not (isinstance(sim_dt, (int, float)) and math.isfinite(sim_dt) and sim_dt > 0):
            raise OptionError(f"Ant: sim_dt must be a positive number, got {sim_dt!r}")
        lo, hi = (float(x) for x in healthy_z_range)
        if not lo < hi:
            raise OptionError(f"Ant: healthy_z_range must be (low, high) with low < high, got {healthy_z_range!r}")
        for name, val in (("ctrl_cost_weight", ctrl_cost_weight), ("reset_noise", reset_noise)):
            if not (isinstance(val, (int, float)) and math.isfinite(val) and val >= 0):
                raise OptionError(f"Ant: {name} must be a non-negative number, got {val!r}")
        if not (isinstance(healthy_reward, (int, float)) and math.isfinite(healthy_reward)):
            raise OptionError(f"Ant: healthy_reward must be a number, got {healthy_reward!r}")
        if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
            raise OptionError(f"Ant: iterations must be a positive integer, got {iterations!r}")
        self.geometry = geometry or AntGeometry()
        self.scene, q0, v0 = ant(self.geometry, friction=friction, dtype=dtype, device=device)
        self.scene.iterations = iterations
        if contact_solver not in ("pgs", "smooth"):
            raise OptionError(f"Ant: contact_solver must be 'pgs' or 'smooth', got {contact_solver!r}")
        if not (isinstance(smoothing, (int, float)) and isinstance(friction_smoothing, (int, float))
                and smoothing > 0 and friction_smoothing > 0):
            raise OptionError(f"Ant: smoothing and friction_smoothing must be positive numbers, got {smoothing!r}, "
                              f"{friction_smoothing!r}")
        self.scene.solver = contact_solver
        self.scene.smoothing, self.scene.friction_smoothing = float(smoothing), float(friction_smoothing)
        self.q_start, self.v_start = q0, v0
        self.frame_skip, self.sim_dt = frame_skip, float(sim_dt)
        self.ctrl_cost_weight, self.healthy_reward = float(ctrl_cost_weight), float(healthy_reward)
        self.healthy_z_range = (lo, hi)
        self.reset_noise = float(reset_noise)
        self._warm: dict = {}  # the contact impulses of the last substep of step()
        self._stepping = False
        # substeps x environments in step() whose smooth contact problem had no root found (the hard
        # solution stood in; see diffmech.sim.contact_step)
        self.contact_fallbacks = 0
        robot = self.scene.models["ant"]
        if native is None:
            native = torch.device(device or "cpu").type == "cpu" and native_available()
        if native:
            try:
                kernels.prepare(robot, algorithms=("inverse_dynamics", "mass_matrix", "kinematics", "advance"),
                                dtypes=(dtype,))
                if kernels.native_allowed():  # the step's first stage in one kernel (see sim.prepare_ground_kernels)
                    prepare_ground_kernels(self.scene, dtypes=(dtype,))
            except NativeUnavailable as err:  # no compiler, a failed build: the torch code does the same
                warnings.warn(f"Ant: native kernels unavailable ({err}); the contact step runs as torch code",
                              RuntimeWarning, stacklevel=2)
        super().__init__(robot, num_envs, dt=frame_skip * self.sim_dt, horizon=horizon, max_torque=self.geometry.gear,
                         integrator=None, compile=False, seed=seed, act_dim=robot.nv - 6)

    # ------------------------------------------------------------------ the task
    def initial_state(self, n: int) -> tuple[Tensor, Tensor]:
        q = self.q_start.expand(n, -1).clone()
        v = self.v_start.expand(n, -1).clone()
        if self.reset_noise > 0:
            g, z = self.generator, dict(dtype=self.dtype)  # drawn on the CPU: the same resets on every device
            u = torch.rand(n, q.shape[1], generator=g, **z).to(self.device)
            q = q + self.reset_noise * (2 * u - 1)
            quat = q[:, 3:7] / q[:, 3:7].norm(dim=-1, keepdim=True)
            q = torch.cat([q[:, :3], quat, q[:, 7:]], -1)
            v = v + self.reset_noise * torch.randn(n, v.shape[1], generator=g, **z).to(self.device)
        return q, v

    def healthy(self, q: Tensor, v: Tensor) -> Tensor:
        """``(B,)`` bool: the state is finite and the torso's height in ``healthy_z_range``."""
        z = q[:, 2]
        finite = torch.isfinite(q).all(-1) & torch.isfinite(v).all(-1)
        return finite & (z > self.healthy_z_range[0]) & (z < self.healthy_z_range[1])

    def observe(self, q: Tensor, v: Tensor, t: Tensor) -> Tensor:
        from ..spatial import quat_to_matrix

        quat = q[:, 3:7]
        R = quat_to_matrix(quat / quat.norm(dim=-1, keepdim=True))
        lin_world = (R @ v[:, :3, None])[..., 0]  # diffmech keeps the base's linear velocity in torso axes
        # w first although q holds (x, y, z, w): MuJoCo's qpos order, so policies transfer to Ant-v5
        wxyz = torch.cat([quat[:, 3:], quat[:, :3]], -1)
        return torch.cat([q[:, 2:3], wxyz, q[:, 7:], lin_world, v[:, 3:]], -1)

    def reward(self, q: Tensor, v: Tensor, q1: Tensor, v1: Tensor, action: Tensor) -> Tensor:
        forward = (q1[:, 0] - q[:, 0]) / self.dt
        alive = self.healthy(q1, v1).to(q1.dtype) * self.healthy_reward
        return forward + alive - self.ctrl_cost_weight * action.square().sum(-1)

    def terminal(self, q1: Tensor, v1: Tensor) -> Tensor:
        return ~self.healthy(q1, v1)

    def draw_points(self, q: Tensor) -> Tensor:
        """``(B, 25, 3)``: from the torso's centre out along each leg (hip, ankle, the foot's end
        sphere) and back, leg after leg, drawn as one polyline."""
        T = self.robot.forward_kinematics(q)
        names = self.robot.link_names
        centre = T[..., names.index("torso"), :3, 3]
        pts = [centre]
        for leg in ("front_left", "front_right", "back_right", "back_left"):
            shin = T[..., names.index(f"{leg}_shin"), :, :]
            hip, ankle = T[..., names.index(f"{leg}_thigh"), :3, 3], shin[..., :3, 3]
            foot = ankle + shin[..., :3, :3] @ shin.new_tensor(self._foot_offset(leg))
            pts += [hip, ankle, foot, ankle, hip, centre]
        return torch.stack(pts, -2)

    def _foot_offset(self, leg: str) -> tuple[float, float, float]:
        from ..model.ant import LEGS

        sx, sy = next((a, b) for n, a, b in LEGS if n == leg)
        s = self.geometry.shin_length / math.sqrt(2.0)
        return (sx * s, sy * s, 0.0)

    # ------------------------------------------------------------------ the mechanics
    def simulate(self, q: Tensor, v: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """``frame_skip`` contact steps of ``sim_dt`` under the torques of ``action (B, 8)``."""
        a = action.clamp(-1.0, 1.0) * self.max_torque
        tau = torch.cat([a.new_zeros(a.shape[0], 6), a], -1)
        stepping = self._stepping
        for _ in range(self.frame_skip):
            info: dict | None = {} if stepping else None
            q, v = contact_step(self.scene, q, v, tau, self.sim_dt, info, warm=self._warm if stepping else None)
            if stepping:
                self._warm = info["lam"]
                self.contact_fallbacks += info["fallbacks"]
        return q, v

    def step(self, action: Tensor):
        # While stepping the stored states, each substep's solver starts from the last one's impulses
        # (fewer sweeps); transition() at other states starts cold. The solution and its gradient do not
        # depend on the start (the implicit gradient at the converged impulses).
        self._stepping = True
        try:
            return super().step(action)
        finally:
            self._stepping = False

    def reset(self, seed: int | None = None) -> Tensor:
        self._warm = {}
        return super().reset(seed)
