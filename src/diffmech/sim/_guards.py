"""Checks that make a rollout fail loudly: non-finite inputs, states and gradients, and divergence.

Every check works on chunks of steps (one host synchronisation per chunk, none per step) and, when
something is wrong, locates the first culprit exactly and raises a
:class:`~diffmech.errors.SimulationError` that names the step, the time, the batch element and the
quantity.

Divergence. For the exact dynamics the kinetic energy obeys ``T_k = T_0 + W_k - D_k``: ``W_k`` is the
work of every force but the damping (controls, gravity, springs, external forces) and ``D_k >= 0``
what the damping dissipated. Hence ``T_k <= T_0 + sum_j |w_j|`` with ``w_j`` the work of step ``j``.
An unstable integration breaks this bound by orders of magnitude within a few steps, long before
anything overflows; a sane one stays near it (a consistent scheme's energy error is a small
fraction of the energy exchanged). The monitor evaluates, per chunk and batched over its states,
``T_k = 1/2 v_k . M(q_k) v_k`` and ``w_j = dt F_j . (v_j + v_{j+1}) / 2`` with the generalized force
``F_j = u_j - ID(q_j, 0, 0, f_ext_j)`` (controls minus gravity and springs, plus the external
forces), and raises when ``T_k > max_energy_growth (T_0 + sum_{j<k} |w_j| + E_floor)``. To keep
its cost at a few percent of the steps' even for large batches, it first evaluates every 16th
state (the work of each window of 16 steps from its middle step); any alarm (or a non-finite
state) makes it evaluate every state of the chunk, which locates the first culprit exactly, also
when the state has overflowed later in the chunk.
``E_floor`` is the kinetic energy of the robot's total mass at 1 mm/s, so that rounding noise
about a state of rest never counts.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..errors import SimulationError
from ..model.validate import MAX_MAGNITUDE
from ..robot import RobotModel
from .integrators import Integrator

__all__ = ["ForwardMonitor", "GradCheck", "check_initial_state", "check_tensor_controls", "dof_name",
           "quaternion_coords", "DEFAULT_MAX_ENERGY_GROWTH", "QUATERNION_TOLERANCE"]

DEFAULT_MAX_ENERGY_GROWTH = 1e3
# |norm - 1| accepted for an initial quaternion: float32 rounding and a few digits typed by hand pass,
# a zero or unnormalised quaternion (which would rotate and scale the body) does not
QUATERNION_TOLERANCE = 1e-4
_FLOOR_SPEED = 1e-3  # m/s: the speed of the floor energy
_STRIDE = 16  # states between the sampled energy checks of a chunk (every state once one raises an alarm)


def _joint_of(robot: RobotModel, i: int, ball_width: int) -> str:
    """``joint '<name>'`` of coordinate ``i`` after the base's, a ball joint spanning ``ball_width``."""
    if robot.tree.n_ball:
        names = [n for n, t in zip(robot.joint_names, robot.joint_types)
                 for _ in range(ball_width if t == "ball" else 1)]
        return f"joint '{names[i]}'"
    return f"joint '{robot.joint_names[i]}'"


def dof_name(robot: RobotModel, i: int) -> str:
    """The velocity coordinate ``i`` in words: a joint, or a component of the base twist."""
    if robot.floating_base:
        if i < 6:
            return f"base twist component {i}"
        i -= 6
    return _joint_of(robot, i, 3)


def coord_name(robot: RobotModel, i: int) -> str:
    """The configuration coordinate ``i`` in words."""
    if robot.floating_base:
        if i < 7:
            return f"base {'position' if i < 3 else 'quaternion'} coordinate {i if i < 3 else i - 3}"
        i -= 7
    return _joint_of(robot, i, 4)


def element(batch: tuple[int, ...], b: int) -> str:
    """``" in batch element (i, j)"`` for flat index ``b`` of ``batch`` (empty without a batch)."""
    if not batch:
        return ""
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(b), batch))
    return f" in batch element {idx}"


def quaternion_coords(robot: RobotModel) -> list[int]:
    """The first configuration coordinate of each unit quaternion of ``robot``'s ``q`` (the floating
    base's, then each ball joint's), in the order of ``q``."""
    out = [3] if robot.floating_base else []
    if robot.tree.n_ball:
        i = 7 if robot.floating_base else 0
        for t in robot.joint_types:
            if t == "ball":
                out.append(i)
            i += 4 if t == "ball" else 1
    return out


Part = tuple  # (model name or None, robot, offset of its q in the state, offset of its v)


def _where(part: Part) -> str:
    return f"model '{part[0]}', " if part[0] is not None else ""


def _why(value: float) -> str:
    return "is not finite" if not math.isfinite(value) else f"is beyond {MAX_MAGNITUDE:g} in magnitude (SI units?)"


def _locate(parts: list, i: int, which: str) -> tuple[Part, int]:
    """The part holding coordinate ``i`` of the stacked ``q`` (``which="q"``) or ``v``, and ``i`` within it."""
    for part in reversed(parts):
        off = part[2] if which == "q" else part[3]
        if i >= off:
            return part, i - off
    raise AssertionError(i)


def check_initial_state(batch, q0: Tensor, v0: Tensor, parts: list | None = None, robot: RobotModel | None = None,
                        where: str = "rollout") -> None:
    """Raise a :class:`~diffmech.errors.SimulationError` naming the argument, the batch element, the model
    and the coordinate if the initial state ``q0 (B, nq)``, ``v0 (B, nv)`` holds a non-finite value, a
    value beyond :data:`~diffmech.model.validate.MAX_MAGNITUDE`, or a quaternion that is not of unit norm
    (to :data:`QUATERNION_TOLERANCE`). ``parts`` lists the models stacked in the state as
    ``(name, robot, q offset, v offset)``; one robot alone: ``robot=``."""
    if parts is None:
        parts = [(None, robot, 0, 0)]
    for name, x, which in (("q0", q0, "q"), ("v0", v0, "v")):
        bad = ~(torch.isfinite(x) & (x.abs() <= MAX_MAGNITUDE))
        if bool(bad.any()):
            b, i = bad.nonzero()[0].tolist()
            part, j = _locate(parts, i, which)
            what = coord_name(part[1], j) if which == "q" else dof_name(part[1], j)
            value = x[b, i].item()
            raise SimulationError(f"{where}: the initial state '{name}' {_why(value)}{element(batch, b)}: "
                                  f"{_where(part)}{what} = {value:g}")
    for part in parts:
        for s in quaternion_coords(part[1]):
            norm = q0[:, part[2] + s:part[2] + s + 4].norm(dim=-1)
            bad = (norm - 1).abs() > QUATERNION_TOLERANCE
            if bool(bad.any()):
                b = int(bad.nonzero()[0, 0])
                what = coord_name(part[1], s).replace(" coordinate 0", "")
                raise SimulationError(
                    f"{where}: 'q0' holds a quaternion of norm {norm[b].item():.6g}{element(batch, b)}: "
                    f"{_where(part)}{what} (coordinates {s}..{s + 3} of its q, (x, y, z, w)); give a unit quaternion")


def check_tensor_controls(robot: RobotModel | None, batch, dt: float, tau: Tensor | None, f_ext: Tensor | None,
                          parts: list | None = None, where: str = "rollout") -> None:
    """Raise if the torques ``(B, T, nv)`` or link forces ``(B, T, n_links, 6)`` hold a non-finite value
    or one beyond :data:`~diffmech.model.validate.MAX_MAGNITUDE` (one synchronisation each), naming the
    first step, element and joint or link (and the model, for a scene: ``parts`` as in
    :func:`check_initial_state`)."""
    if parts is None:
        parts = [(None, robot, 0, 0)]
    if tau is not None:
        bad = ~(torch.isfinite(tau) & (tau.abs() <= MAX_MAGNITUDE))
        if bool(bad.any()):
            b, k, i = (bad.nonzero()[0]).tolist()
            part, j = _locate(parts, i, "v")
            value = tau[b, k, i].item()
            raise SimulationError(f"{where}: 'tau' {_why(value)} at step {k} (t = {k * dt:.6g} s){element(batch, b)}, "
                                  f"{_where(part)}{dof_name(part[1], j)}: {value:g}")
    if f_ext is not None and not bool(torch.isfinite(f_ext).all()):
        b, k, link, c = ((~torch.isfinite(f_ext)).nonzero()[0]).tolist()
        raise SimulationError(f"{where}: 'f_ext' is not finite at step {k} (t = {k * dt:.6g} s){element(batch, b)}, "
                              f"link '{robot.link_names[link]}', component {c}: {f_ext[b, k, link, c].item()}")


class ForwardMonitor:
    """Chunked checks of a rollout's forward pass: finite states and policy outputs, and the energy
    bound of the module docstring (off with ``max_growth=None``)."""

    def __init__(self, robot: RobotModel, integ: Integrator, dt: float, passive: bool, batch: tuple[int, ...],
                 q0: Tensor, v0: Tensor, max_growth: float | None):
        self.robot, self.integ, self.dt, self.passive, self.batch = robot, integ, dt, passive, batch
        self.max_growth = max_growth
        self.max_ratio: Tensor | None = None
        if max_growth is None:
            return
        with torch.no_grad():
            mt = robot.model_tensors(q0.dtype, q0.device)
            self.floor = 0.5 * mt.link_mass.detach().sum() * _FLOOR_SPEED**2
            self.budget = self._kinetic(q0, v0)  # (B,) T_0 + sum of |w_j| so far
        self.max_ratio = self.budget.new_zeros(())

    def _kinetic(self, q: Tensor, v: Tensor) -> Tensor:
        return self.robot.kinetic_energy(q, v)

    def check(self, qs: Tensor, vs: Tensor, us: Tensor | None, fes: Tensor | None, first: int,
              check_u: bool) -> None:
        """Check states ``first .. first + n - 1``.

        Args:
            qs, vs: (B, n + 1, ·) the states ``first - 1 .. first + n - 1`` (the last checked one first).
            us: (B, n, nv) the controls of the steps into them (``first - 1 ..``); their finiteness is
                checked when ``check_u`` (policy outputs; a torque tensor is checked up front).
            fes: (B, n, n_links, 6) the external forces of those steps, or None.
        """
        with torch.no_grad():
            bad = ~(torch.isfinite(qs[:, 1:]).all(-1) & torch.isfinite(vs[:, 1:]).all(-1))  # (B, n)
            bad_u = ~torch.isfinite(us).all(-1) if check_u else None
            if bad_u is not None:
                bad = bad | bad_u
            ratio = cum = None
            if self.max_growth is not None:
                # Sampled first (every _STRIDE-th state: a few percent of the steps' cost); on any
                # alarm, every state of the chunk, which locates the first culprit exactly.
                ratio, cum = self._ratio(qs, vs, us, fes, _STRIDE)
                if bool(bad.any()) or not bool((ratio <= self.max_growth).all()):
                    ratio, cum = self._ratio(qs, vs, us, fes, 1)
                    bad = bad | ~(ratio <= self.max_growth)  # NaN counts
            if not bool(bad.any()):
                if ratio is not None:
                    self.budget = cum[:, -1]
                    self.max_ratio = torch.maximum(self.max_ratio, ratio.amax())
                return
            j = int(bad.any(0).nonzero()[0, 0])
            b = int(bad[:, j].nonzero()[0, 0])
            n_bad = int(bad[:, j].sum())
        state, k = first + j, first + j - 1  # the state reached by step k
        where = f"at step {k} (state {state}, t = {state * self.dt:.6g} s){element(self.batch, b)}"
        others = f" ({n_bad} of {bad.shape[0]} batch elements)" if self.batch else ""
        if bad_u is not None and bool(bad_u[b, j]):
            u = us[b, j]
            i = int((~torch.isfinite(u)).nonzero()[0, 0])
            raise SimulationError(f"rollout: the policy returned a non-finite value at step {k} (t = {k * self.dt:.6g} "
                                  f"s){element(self.batch, b)}{others}, {dof_name(self.robot, i)}: {u[i].item()}")
        if not (bool(torch.isfinite(qs[b, j + 1]).all()) and bool(torch.isfinite(vs[b, j + 1]).all())):
            raise SimulationError(
                f"rollout: non-finite state {where}{others}; the step is too large for the dynamics, "
                f"the controls are not finite or the model is degenerate{self._suggestion(qs[b, j], vs[b, j])}")
        v = vs[b, j + 1]
        i = int(v.abs().argmax())
        raise SimulationError(
            f"rollout: the simulation diverged {where}{others}: the kinetic energy {self._t[b, j].item():.3g} J "
            f"exceeds max_energy_growth = {self.max_growth:g} times the energy the system received "
            f"({cum[b, j].item():.3g} J: the initial kinetic energy plus the work of the controls, gravity, springs "
            f"and external forces so far); the fastest coordinate is {dof_name(self.robot, i)} at v = {v[i].item():.3g}"
            f"{self._suggestion(qs[b, j], vs[b, j])}; or pass max_energy_growth=None to turn this check off")

    def _ratio(self, qs, vs, us, fes, stride: int) -> tuple[Tensor, Tensor]:
        """``T / (budget + floor)`` at the ends of windows of ``stride`` steps and the budgets there,
        each ``(B, n_windows)``; the work of a window is its middle step's times its length (exact
        with ``stride = 1``)."""
        robot = self.robot
        B, n1, nq = qs.shape
        n, nv = n1 - 1, robot.nv
        starts = torch.arange(0, n, stride, device=qs.device)
        length = (starts + stride).clamp_max(n) - starts
        mid, end = starts + (length - 1) // 2, starts + length
        nw = starts.shape[0]
        q_mid = qs[:, mid].reshape(B * nw, nq)
        fe = None if fes is None else fes[:, mid].reshape(B * nw, *fes.shape[2:])
        # The torques that hold each window's middle state at rest (gravity, springs): the public
        # call, which also maps the generalised coordinates of mimic joints.
        zero = q_mid.new_zeros(B * nw, nv)
        hold = robot.inverse_dynamics(q_mid, zero, zero, f_ext=fe, passive=self.passive).reshape(B, nw, nv)
        vbar = 0.5 * (vs[:, mid] + vs[:, mid + 1])
        w = (self.dt * length) * ((us[:, mid] - hold) * vbar).sum(-1).abs()  # (B, nw)
        cum = self.budget[:, None] + torch.cumsum(w, 1)
        self._t = self._kinetic(qs[:, end].reshape(B * nw, nq), vs[:, end].reshape(B * nw, nv)).reshape(B, nw)
        return self._t / (cum + self.floor), cum

    def _suggestion(self, q: Tensor, v: Tensor) -> str:
        """Where the dynamics linearized at the last sane state ``(q, v)`` put the stability limit."""
        from .stability import stable_dt

        if not (bool(torch.isfinite(q).all()) and bool(torch.isfinite(v).all())):
            return ""
        try:
            at_state = stable_dt(self.robot, q[None], v[None], integrator=self.integ, passive=self.passive)
            at_rest = stable_dt(self.robot, q[None], integrator=self.integ, passive=self.passive)
        except Exception:  # noqa: BLE001 - a suggestion must never hide the error it decorates
            return ""
        if not math.isfinite(at_state):
            return ""
        return (f". The step dt = {self.dt:g} s is too large for these dynamics: diffmech.sim.stable_dt suggests "
                f"dt <= {at_state:.2g} s for '{self.integ.name}' at the state before (the dynamics linearized there; "
                f"{at_rest:.2g} s at rest in that configuration); pass a smaller dt")


class GradCheck:
    """Chunked checks of a rollout's backward pass (see :func:`diffmech.sim.rollout`).

    Reverse passes accumulate per chunk, ask :meth:`finite` once (one synchronisation), and on
    failure replay the chunk from its saved start with :meth:`step` after every step, which
    raises naming the step and the input whose gradient went bad.
    """

    def __init__(self, robot: RobotModel, batch: tuple[int, ...], dt: float, param_names: list[str]):
        self.robot, self.batch, self.dt, self.param_names = robot, batch, dt, param_names

    @staticmethod
    def finite(*tensors: Tensor | None) -> bool:
        flags = [torch.isfinite(t).all() for t in tensors if t is not None]
        return not flags or bool(torch.stack(flags).all())

    def incoming(self, gQ: Tensor, gV: Tensor) -> None:
        """The loss's gradients w.r.t. the returned trajectory ``(B, T + 1, ·)``."""
        for name, g, coord in (("q", gQ, coord_name), ("v", gV, dof_name)):
            if not bool(torch.isfinite(g).all()):
                b, s, i = ((~torch.isfinite(g)).nonzero()[0]).tolist()
                raise SimulationError(
                    f"rollout backward: the gradient of the loss w.r.t. the returned '{name}' at state {s} "
                    f"(t = {s * self.dt:.6g} s){element(self.batch, b)}, {coord(self.robot, i)}, is not finite "
                    f"({g[b, s, i].item()}): the loss produced it, not the rollout")

    def step(self, k: int, parts: list[tuple[str, Tensor | None]], after: Tensor | None = None) -> None:
        """Raise if a cotangent produced by reverse step ``k`` is not finite. ``parts``: ``(name, tensor)``
        with per-batch-element rows ``(B, ·)`` for the state and controls, anything for parameters;
        ``after``: the (finite) adjoint of the state after the step, ``(B, nq + nv)``."""
        bad = [(name, t) for name, t in parts if t is not None and not bool(torch.isfinite(t).all())]
        if not bad:
            return
        names = ", ".join(f"'{name}'" if name in ("q", "v", "tau", "f_ext") else name for name, _ in bad)
        where = ""
        name, t = bad[0]
        if t.dim() == 2 and t.shape[0] == max(math.prod(self.batch), 1) and name in ("q", "v", "tau", "f_ext"):
            b = int((~torch.isfinite(t)).any(-1).nonzero()[0, 0])
            where = element(self.batch, b)
        size = float(after.abs().max()) if after is not None else 0.0
        if size > 1e-3 * torch.finfo(after.dtype).max:
            why = (f"the gradient overflowed: it had grown to {size:.3g} at the state after this step (a rollout that "
                   "amplifies perturbations this much is unstable or chaotic at this dt; see max_energy_growth and "
                   "diffmech.sim.stable_dt)")
        else:
            why = ("the Jacobian of this step (or of the policy at its state) is not finite there: extreme states or "
                   "controls (see max_energy_growth and diffmech.sim.stable_dt) or a policy whose derivative is "
                   "undefined at this state are the usual causes")
        raise SimulationError(f"rollout backward: the gradient w.r.t. {names} at step {k} (t = {k * self.dt:.6g} s)"
                              f"{where} is not finite, while the gradient w.r.t. the state after it was finite: {why}")

    def chunk_failed(self, k0: int, k1: int) -> SimulationError:
        return SimulationError(f"rollout backward: a gradient became non-finite between steps {k0} and {k1 - 1} "
                               f"(t = {k0 * self.dt:.6g} .. {(k1 - 1) * self.dt:.6g} s), but replaying those steps "
                               "did not reproduce it (is the policy deterministic?)")
