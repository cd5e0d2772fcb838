"""Batched inverse kinematics: Levenberg-Marquardt on a link pose, joint limits, restarts, and an
implicit-function-theorem gradient with respect to the target.

The problem, for each target ``T* = (R*, p*)``::

    minimise_q  1/2 |r(q)|^2,   r(q) = sqrt(W) (p* - p(q);  log(R* R(q)^T))

with ``p(q), R(q)`` the world pose of the link (:meth:`RobotModel.link_pose`), the orientation
error the world-frame rotation vector of ``R* R^T`` (:func:`diffmech.spatial.so3_log`) and ``W`` a
diagonal weight on the six world axes. Its Jacobian is ``dr/dq = -A`` with
``A = sqrt(W) [J_lin; Jlog(e_rot) J_ang]``, ``J`` the world-aligned link Jacobian
(:meth:`RobotModel.jacobian`) and ``Jlog`` the inverse right Jacobian of SO(3)
(:func:`diffmech.spatial.so3_jlog`), so the steps stay exact Gauss-Newton steps for large rotation
errors.

Each step solves ``(A^T A + lambda I) dq = A^T r`` (or the equivalent ``m x m`` system when there
are fewer residuals than joints), with joints at a limit whose descent direction points outwards
held fixed, and the result clipped to the limits (a projected step; joints without limits --
continuous ones -- are never clipped). With the adaptive schedule (Madsen, Nielsen & Tingleff,
*Methods for non-linear least squares problems*, 2004, Sec. 3.2) a step is kept only if the cost
falls, and ``lambda`` follows the ratio of actual to predicted decrease. The whole batch iterates
together; elements that finish leave the batch. An attempt fails when its cost has not halved over
``_STALL_WINDOW`` steps (a local minimum, often made by the limits, or a singular configuration); its
target then starts several random configurations in parallel, which cost little: at small batches a
step costs about as much for a few hundred elements as for one. The first attempt to converge wins.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from ..errors import ModelError, OptionError, ShapeError
from ..spatial import so3_jlog, so3_log

__all__ = ["IKResult", "inverse_kinematics", "solve_ik"]

MODES = {"pose": (0, 1, 2, 3, 4, 5), "position": (0, 1, 2), "orientation": (3, 4, 5)}
SCHEDULES = ("adaptive", "constant")

# An attempt gives up when its cost has not halved over this many steps (a local minimum or a
# crawl along a limit): the next start is cheaper than the rest of the iteration budget.
_STALL_WINDOW = 10
_STALL_FACTOR = 0.5
# A step is kept when the actual decrease is at least this fraction of the predicted one.
_ACCEPT_RATIO = 1e-4
_LAMBDA_MAX = 1e10


class IKResult(NamedTuple):
    """Outcome of :func:`solve_ik`; every field has the batch shape ``(...)`` of the targets.

    Attributes:
        q: (..., nq) solution: the converged attempt, or the attempt with the lowest weighted cost
            where none converged. Differentiable with respect to the target (see :func:`solve_ik`).
        converged: (...) bool, position and orientation errors within tolerance.
        position_error: (...) m, norm of the position error over the weighted axes (0 when the mode
            has no position part).
        orientation_error: (...) rad, rotation angle of the orientation error over the weighted axes
            (0 when the mode has no orientation part).
        iterations: (...) int64, rounds of the solver until the target was solved or given up: the
            steps of its first attempt plus those of the restarts that followed (restarts run in
            parallel, so this is the solver's latency for the target, at most ``max_iterations``).
        attempts: (...) int64, starts used (1: the first start sufficed).
    """

    q: Tensor
    converged: Tensor
    position_error: Tensor
    orientation_error: Tensor
    iterations: Tensor
    attempts: Tensor


def inverse_kinematics(robot, link: str | int, target: Tensor, *, q0: Tensor | None = None,
                       **options) -> tuple[Tensor, Tensor]:
    """Joint configurations that place ``link`` at ``target``: ``q, converged = inverse_kinematics(...)``.

    Batched damped least squares (Levenberg-Marquardt) on the link pose with joint limits and random
    restarts; differentiable with respect to ``target`` at the solution. All keyword options are
    those of :func:`solve_ik`, which also returns the errors, iteration and attempt counts.

    Args:
        robot: a fixed- or floating-base :class:`~diffmech.RobotModel`.
        link: name or index of the link whose frame is placed.
        target: (..., 4, 4) world poses ``T_world_link`` to reach.
        q0: optional (..., nq) first start (broadcast to the batch); default: the middle of the
            joint limits.

    Returns:
        q: (..., nq), same dtype/device as ``target``.
        converged: (...) bool; unreachable targets give ``False`` (no exception).
    """
    res = solve_ik(robot, link, target, q0=q0, **options)
    return res.q, res.converged


def solve_ik(
    robot,
    link: str | int,
    target: Tensor,
    *,
    q0: Tensor | None = None,
    mode: str = "pose",
    weights: Sequence[float] | Tensor = (1.0, 1.0),
    tol_position: float = 1e-4,
    tol_orientation: float = 1e-3,
    max_iterations: int = 100,
    restarts: int = 16,
    parallel_restarts: int = 8,
    damping: float = 0.1,
    damping_schedule: str = "adaptive",
    respect_limits: bool = True,
    generator: torch.Generator | None = None,
    grad_damping: float = 0.0,
) -> IKResult:
    """Inverse kinematics of one link for a batch of target poses.

    Args:
        robot: a :class:`~diffmech.RobotModel` (fixed or floating base).
        link: name or index of the link whose frame (origin and axes) is placed.
        target: (..., 4, 4) world poses ``T_world_link``; its dtype and device are those of the
            computation and of ``q``.
        q0: optional (..., nq) first start, broadcast to the batch and clipped to the joint limits.
            Default: the middle of each joint's limits (0 for a joint without limits; identity base
            at the origin for a floating base).
        mode: ``"pose"`` (position and orientation), ``"position"`` or ``"orientation"``.
        weights: ``(w_position, w_orientation)`` or a tensor broadcastable to ``(..., 6)`` of
            non-negative weights on the world axes (linear x, y, z; angular x, y, z). An axis with
            weight 0 is left free and not tested for convergence. Weights set the compromise when a
            target is out of reach; at a reachable target they change the path, not the solution.
        tol_position: m, largest accepted position error (norm over the weighted axes).
        tol_orientation: rad, largest accepted rotation angle of the orientation error.
        max_iterations: rounds of the solver (steps, counting the first evaluation of each restart as
            one); every target, restarts included, is finished within this many.
        restarts: further starts for targets whose attempt fails, from
            ``robot.random_configuration(restarts, *batch, generator=generator)`` (one call, drawn
            before solving, so the starts do not depend on which targets fail; restart ``k`` of target
            ``b`` starts from draw ``[k, b]``). The first start that converges wins; among several that
            converge in the same round, the one with the lowest cost.
        parallel_restarts: restarts run together for one target when its current attempts have failed.
        damping: initial ``lambda`` of ``(A^T A + lambda I) dq = A^T r`` (in the units of ``A^T A``:
            m^2 for position rows, rad^2 for orientation rows, times the weights).
        damping_schedule: ``"adaptive"`` (Levenberg-Marquardt: a step is kept only if the cost
            falls; lambda shrinks after good steps and grows after rejected ones) or ``"constant"``
            (classic damped least squares: every step is taken with the fixed ``damping``).
        respect_limits: keep every joint within its position limits (projected steps). Joints
            without limits (continuous) are never clipped.
        generator: random generator for the restart configurations (reproducible results).
        grad_damping: damping ``mu`` of the gradient's pseudo-inverse ``A^T (A A^T + mu I)^-1``;
            0 uses the exact Moore-Penrose pseudo-inverse.

    Returns:
        An :class:`IKResult` (``q``, ``converged``, errors, iterations, attempts), each with the
        batch shape ``(...)`` of ``target``.

    Gradient:
        ``q`` is differentiable with respect to ``target`` and to the robot's parameters (not to
        ``weights`` or ``q0``) through the implicit function theorem at the returned solution: ``r(q*(T), T) = 0`` gives
        ``dq* = A^+ (dr/dT) dT`` with ``A^+`` the pseudo-inverse of the weighted Jacobian ``A`` at
        ``q*``. For a non-redundant problem (as many independent residuals as joints) this is the
        exact derivative of the solution. For a redundant one the solution set is a manifold and
        the gradient is that of the minimum-norm joint motion that follows the target to first
        order (no motion along the null space, which the target does not determine); with
        ``grad_damping > 0`` the damped least-squares motion. Joints at a limit are held fixed. No
        iteration is recorded by autograd: memory and time of the backward pass do not depend on
        the number of iterations. Where ``converged`` is False the same formula is a Gauss-Newton
        approximation of the derivative of a least-squares minimum.

    Raises:
        ShapeError: ``target``, ``q0`` or ``weights`` of a wrong shape or type (naming it).
        ModelError: unknown ``link``.
        OptionError: unknown ``mode`` or ``damping_schedule``.
    """
    li = robot.link_index(link)
    if robot.tree.n_ball:
        # the solver steps every coordinate as one angle; a ball joint's quaternion would leave the sphere
        balls = [n for n, k in zip(robot.tree.joint_names, robot.tree.joint_types) if k == "ball"]
        raise ModelError(f"inverse_kinematics: '{robot.name}' has ball joints {balls}, which the solver "
                         "does not support yet")
    if mode not in MODES:
        raise OptionError(f"inverse_kinematics: unknown mode {mode!r}; choose from {tuple(MODES)}")
    if damping_schedule not in SCHEDULES:
        raise OptionError(f"inverse_kinematics: unknown damping_schedule {damping_schedule!r}; "
                          f"choose from {SCHEDULES}")
    if not isinstance(target, Tensor) or not target.dtype.is_floating_point:
        raise ShapeError(f"inverse_kinematics: 'target' must be a floating-point tensor of shape (..., 4, 4), "
                         f"got {type(target).__name__}" + (f" of dtype {target.dtype}" if isinstance(target, Tensor)
                                                           else ""))
    if target.dim() < 2 or tuple(target.shape[-2:]) != (4, 4):
        raise ShapeError(f"inverse_kinematics: 'target' must have shape (..., 4, 4), got {tuple(target.shape)}")
    if max_iterations < 0 or restarts < 0 or parallel_restarts < 1:
        raise OptionError(f"inverse_kinematics: max_iterations ({max_iterations}) and restarts ({restarts}) "
                          f"must be >= 0 and parallel_restarts ({parallel_restarts}) >= 1")
    batch = tuple(target.shape[:-2])
    B = 1
    for s in batch:
        B *= s
    kw = dict(dtype=target.dtype, device=target.device)
    rows = MODES[mode]
    w6 = _weights(weights, batch, kw)  # (B or 1, 6)
    if (w6[:, list(rows)] <= 0).all():
        raise OptionError(f"inverse_kinematics: every weight of mode {mode!r} is zero; nothing to solve")
    Tt = target.reshape(B, 4, 4)
    lo, hi = _limits(robot, kw, respect_limits)
    starts = _starts(robot, q0, batch, B, restarts, generator, lo, hi, kw)
    problem = _Problem(robot, li, Tt.detach(), w6.detach(), rows, lo, hi, damping, damping_schedule,
                       tol_position, tol_orientation)
    with torch.no_grad():
        out = problem.run(starts, max_iterations, parallel_restarts)
    q = out["q"]
    needs_grad = torch.is_grad_enabled() and (
        target.requires_grad or any(p.requires_grad for p in robot.parameters()))
    if needs_grad:
        q = _implicit_step(problem, q, Tt, w6.detach(), grad_damping)
    return IKResult(
        q.reshape(*batch, robot.nq), out["converged"].reshape(batch), out["perr"].reshape(batch),
        out["rerr"].reshape(batch), out["iterations"].reshape(batch), out["attempts"].reshape(batch))


# ----------------------------------------------------------------------------- inputs
def _weights(weights, batch: tuple[int, ...], kw: dict) -> Tensor:
    if isinstance(weights, Tensor):
        w = weights.to(**kw)
        if w.dim() == 0 or w.shape[-1] != 6:
            raise ShapeError(f"inverse_kinematics: 'weights' as a tensor must have shape (..., 6) broadcastable "
                             f"to {(*batch, 6)}, got {tuple(weights.shape)}")
        try:
            w = w.expand(*batch, 6) if w.dim() > 1 else w
        except RuntimeError:
            raise ShapeError(f"inverse_kinematics: 'weights' of shape {tuple(weights.shape)} does not broadcast "
                             f"to {(*batch, 6)}") from None
        w = w.reshape(-1, 6)
    else:
        try:
            wp, wr = (float(x) for x in weights)
        except (TypeError, ValueError):
            raise ShapeError(f"inverse_kinematics: 'weights' must be a pair (w_position, w_orientation) or a "
                             f"(..., 6) tensor, got {weights!r}") from None
        w = torch.tensor([[wp] * 3 + [wr] * 3], **kw)
    if not torch.isfinite(w).all() or (w < 0).any():
        raise ShapeError("inverse_kinematics: 'weights' must be finite and non-negative")
    return w


def _limits(robot, kw: dict, respect: bool) -> tuple[Tensor, Tensor]:
    """``(nv,)`` lower and upper bounds on the joint coordinates (``-inf/inf`` for the base and
    unlimited joints); in the tangent layout, which equals ``q``'s for the joints."""
    nb = robot.nv - len(robot.joint_names)
    inf = torch.full((nb,), float("inf"), **kw)
    if respect:
        lim = robot.joint_limits()
        lo, hi = lim["lower"].to(**kw), lim["upper"].to(**kw)
        # rounded inwards, so that a solution at a limit is within the limit in float64 as well
        lo = torch.where(lo.double() < lim["lower"].to(lo.device), torch.nextafter(lo, torch.full_like(lo, 1.0)), lo)
        hi = torch.where(hi.double() > lim["upper"].to(hi.device), torch.nextafter(hi, torch.full_like(hi, -1.0)), hi)
        return torch.cat([-inf, lo]), torch.cat([inf, hi])
    full = torch.full((robot.nv,), float("inf"), **kw)
    return -full, full


def _starts(robot, q0, batch, B, restarts, generator, lo, hi, kw) -> Tensor:
    """``(1 + restarts, B, nq)`` start configurations."""
    nb_q = robot.nq - len(robot.joint_names)
    jl, jh = lo[robot.nv - len(robot.joint_names):], hi[robot.nv - len(robot.joint_names):]
    if q0 is None:
        mid = torch.where(torch.isfinite(jl) & torch.isfinite(jh), 0.5 * (jl + jh), torch.zeros_like(jl))
        first = torch.cat([robot.neutral_configuration().to(**kw)[:nb_q], mid]).expand(B, robot.nq)
    else:
        if not isinstance(q0, Tensor):
            q0 = torch.as_tensor(q0, **kw)
        if q0.dim() == 0 or q0.shape[-1] != robot.nq:
            raise ShapeError(f"inverse_kinematics: 'q0' must have shape (..., {robot.nq}) broadcastable to "
                             f"{(*batch, robot.nq)}, got {tuple(q0.shape)}")
        try:
            first = q0.detach().to(**kw).expand(*batch, robot.nq).reshape(B, robot.nq)
        except RuntimeError:
            raise ShapeError(f"inverse_kinematics: 'q0' of shape {tuple(q0.shape)} does not broadcast to "
                             f"{(*batch, robot.nq)}") from None
        first = torch.cat([first[:, :nb_q], torch.minimum(torch.maximum(first[:, nb_q:], jl), jh)], -1)
    if restarts == 0:
        return first[None]
    rand = robot.random_configuration(restarts, *batch, generator=generator).to(**kw).reshape(restarts, B, robot.nq)
    return torch.cat([first[None], rand])


# ----------------------------------------------------------------------------- the solver
class _Problem:
    """The residual, its Jacobian and the Levenberg-Marquardt loop for flat ``(B, ...)`` batches."""

    def __init__(self, robot, li, Tt, w6, rows, lo, hi, damping, schedule, tol_p, tol_r):
        self.robot, self.li = robot, li
        self.rows = list(rows)
        self.use_p, self.use_r = rows[0] < 3, rows[-1] >= 3
        self.Rt, self.pt = Tt[:, :3, :3], Tt[:, :3, 3]
        self.sw = w6.sqrt()[:, self.rows]  # (B or 1, m)
        self.mask_p, self.mask_r = (w6[:, :3] > 0), (w6[:, 3:] > 0)
        self.lo, self.hi = lo, hi
        self.lam0, self.adaptive = float(damping), schedule == "adaptive"
        self.tol_p, self.tol_r = float(tol_p), float(tol_r)
        self.nb = robot.nv - len(robot.joint_names)  # base velocity coordinates (6 or 0)
        eps = torch.finfo(Tt.dtype).eps
        self.lam_min = max(float(eps) ** 0.75, 1e-12)  # keeps the normal matrix factorisable
        self.at_bound = 16 * float(eps)
        self.lo_j, self.hi_j = lo[self.nb:], hi[self.nb:]
        self.lo_in, self.hi_in = self.lo_j + self.at_bound, self.hi_j - self.at_bound

    # residual r = sqrt(W) e and the errors tested for convergence
    def errors(self, q: Tensor, sel: Tensor | None):
        T = self.robot.link_pose(q, self.li)
        R, p = T[:, :3, :3], T[:, :3, 3]
        pick = (lambda x: x if x.shape[0] == 1 or sel is None else x[sel])
        parts, perr, rerr, e_r = [], q.new_zeros(q.shape[0]), q.new_zeros(q.shape[0]), None
        if self.use_p:
            e_p = pick(self.pt) - p
            parts.append(e_p)
            perr = (e_p * pick(self.mask_p)).norm(dim=-1)
        if self.use_r:
            e_r = so3_log(pick(self.Rt) @ R.transpose(-1, -2))
            parts.append(e_r)
            rerr = (e_r * pick(self.mask_r)).norm(dim=-1)
        r = torch.cat(parts, -1) * pick(self.sw)
        return r, perr, rerr, e_r

    def weighted_jacobian(self, q: Tensor, e_r: Tensor | None, sel: Tensor | None) -> Tensor:
        """``A = sqrt(W) [J_lin; Jlog(e_r) J_ang]`` restricted to the mode's rows, ``(B, m, nv)``."""
        J = self.robot.jacobian(q, self.li)
        blocks = []
        if self.use_p:
            blocks.append(J[:, :3])
        if self.use_r:
            blocks.append(so3_jlog(e_r) @ J[:, 3:])
        sw = self.sw if self.sw.shape[0] == 1 or sel is None else self.sw[sel]
        return torch.cat(blocks, -2) * sw[..., None]

    def step(self, q: Tensor, r: Tensor, A: Tensor, lam: Tensor) -> tuple[Tensor, Tensor]:
        """Projected Levenberg-Marquardt step ``dq (B, nv)`` and its predicted cost decrease ``(B,)``.

        A joint at a limit whose steepest-descent direction points outwards is held (its column of
        ``A`` zeroed); the step is then clipped to the limits. A failed factorisation gives a
        non-finite or useless step, which the caller rejects like any step that does not pay.
        """
        m, n = A.shape[-2:]
        nb = self.nb
        g = torch.bmm(r[:, None, :], A)[:, 0]  # A^T r: the descent direction of 1/2 |r|^2
        qj, gj = q[:, q.shape[1] - (n - nb):], g[:, nb:]
        blocked = ((qj <= self.lo_in) & (gj < 0)) | ((qj >= self.hi_in) & (gj > 0))
        if nb:
            blocked = torch.nn.functional.pad(blocked, (nb, 0))
        Af = A.masked_fill(blocked[:, None, :], 0.0)
        AfT = Af.transpose(-1, -2)
        if m < n:
            H = torch.bmm(Af, AfT)
            H.diagonal(dim1=-2, dim2=-1).add_(lam[:, None])
            L, _ = torch.linalg.cholesky_ex(H)
            dq = torch.bmm(AfT, torch.cholesky_solve(r[..., None], L))[..., 0]
        else:
            H = torch.bmm(AfT, Af)
            H.diagonal(dim1=-2, dim2=-1).add_(lam[:, None])
            L, _ = torch.linalg.cholesky_ex(H)
            dq = torch.cholesky_solve(torch.bmm(AfT, r[..., None]), L)[..., 0]
        # clip to the limits (the base has none): the step actually taken
        if nb:
            dq = torch.cat([dq[:, :nb], torch.clamp(qj + dq[:, nb:], self.lo_j, self.hi_j) - qj], -1)
        else:
            dq = torch.clamp(q + dq, self.lo_j, self.hi_j) - q
        Adq = torch.bmm(A, dq[..., None])[..., 0]
        return dq, (Adq * (r - 0.5 * Adq)).sum(-1)

    def move(self, q: Tensor, dq: Tensor) -> Tensor:
        return q + dq if self.nb == 0 else self.robot.integrate(q, dq)

    def run(self, starts: Tensor, max_iterations: int, group: int) -> dict:
        """Iterate until every target has converged or used its starts or the step budget.

        The first start of every target runs first; a target whose attempt fails spawns its next
        ``group`` starts, which run in parallel (at small batches a step costs about the same for
        one element as for a few hundred). Every target shares one clock: ``max_iterations`` rounds.
        """
        n_starts, B, nq = starts.shape
        dev, dt = starts.device, starts.dtype
        inf = float("inf")

        def full(n, v, dtype=dt):
            return torch.full((n,), v, dtype=dtype, device=dev)

        # per target
        best_q = starts[0].clone()
        best_cost, best_perr, best_rerr = full(B, inf), full(B, inf), full(B, inf)
        conv_t = torch.zeros(B, dtype=torch.bool, device=dev)
        over_t = torch.zeros(B, dtype=torch.bool, device=dev)
        iters_t = full(B, max_iterations, torch.long)
        next_start = full(B, 1, torch.long)
        # per element (compacted as elements finish, extended as restarts spawn)
        own = torch.arange(B, device=dev)
        q_trial = starts[0].clone()
        force = torch.ones(B, dtype=torch.bool, device=dev)  # the trial is a fresh start: take it
        q, r, A = q_trial, None, None
        cost, perr, rerr, pred = full(B, inf), full(B, inf), full(B, inf), full(B, 1.0)
        lam, nu, cost_win = full(B, self.lam0), full(B, 2.0), full(B, inf)
        it = full(B, 0, torch.long)  # steps since the element's start
        k = 0
        while own.numel():
            sel = own if self.sw.shape[0] > 1 or self.Rt.shape[0] > 1 else None
            r_t, perr_t, rerr_t, e_r = self.errors(q_trial, sel)
            A_t = self.weighted_jacobian(q_trial, e_r, sel)
            cost_t = 0.5 * (r_t * r_t).sum(-1)
            if self.adaptive:
                rho = (cost - cost_t) / pred
                accept = force | (torch.isfinite(cost_t) & (pred > 0) & (rho > _ACCEPT_RATIO))
                shrink = torch.clamp(1 - (2 * rho - 1) ** 3, min=1 / 3, max=1.0)
                lam = torch.where(accept, lam * shrink, lam * nu).clamp(min=self.lam_min)
                nu = torch.where(accept, torch.full_like(nu, 2.0), nu * 2)
                lam = torch.where(force, torch.full_like(lam, self.lam0), lam)
            else:
                accept = force | torch.isfinite(cost_t)
            a1 = accept[:, None]
            q = torch.where(a1, q_trial, q)
            r = r_t if r is None else torch.where(a1, r_t, r)
            A = A_t if A is None else torch.where(a1[..., None], A_t, A)
            cost = torch.where(accept, cost_t, cost)
            perr = torch.where(accept, perr_t, perr)
            rerr = torch.where(accept, rerr_t, rerr)
            cost_win = torch.where(force, cost, cost_win)
            conv = (perr <= self.tol_p) & (rerr <= self.tol_r)
            # an attempt fails when its cost has not halved over a window (or cannot move)
            window_end = (it > 0) & (it % _STALL_WINDOW == 0)
            stalled = window_end & (cost > _STALL_FACTOR * cost_win)
            cost_win = torch.where(window_end, cost, cost_win)
            failed = ~conv & (stalled | (lam > _LAMBDA_MAX) | ~torch.isfinite(cost) | (k >= max_iterations))
            any_conv, any_failed = bool(conv.any()), bool(failed.any())
            spawn = None
            if any_conv:  # the lowest-cost one of the siblings that converge in this round
                self._keep_best(conv, own, cost, perr, rerr, q, best_q, best_cost, best_perr, best_rerr, None)
                conv_t[own[conv]] = True
                iters_t[own[conv]] = k
            if any_failed:
                self._keep_best(failed, own, cost, perr, rerr, q, best_q, best_cost, best_perr, best_rerr, conv_t)
            if any_conv or any_failed:
                keep = ~(conv | failed | conv_t[own])
                own, q, r, A, cost, perr, rerr, lam, nu, it, cost_win = (
                    x[keep] for x in (own, q, r, A, cost, perr, rerr, lam, nu, it, cost_win))
                # targets left without a running attempt: spawn the next starts, or give up
                alive = torch.bincount(own, minlength=B) > 0
                idle = ~alive & ~conv_t & ~over_t
                spawn = idle & (next_start < n_starts) & (k < max_iterations)
                give_up = idle & ~spawn
                over_t |= give_up
                iters_t = torch.where(give_up, torch.full_like(iters_t, k), iters_t)
            if own.numel():
                dq, pred = self.step(q, r, A, lam)
                q_trial = self.move(q, dq)
            else:
                q_trial, pred = q, pred[:0]
            force = torch.zeros_like(own, dtype=torch.bool)
            it = it + 1
            if spawn is not None and bool(spawn.any()):
                tn = spawn.nonzero()[:, 0]
                s_idx = next_start[tn, None] + torch.arange(group, device=dev)
                valid = s_idx < n_starts
                own_new = tn[:, None].expand_as(s_idx)[valid]
                s_new = s_idx[valid]
                next_start[tn] = (next_start[tn] + group).clamp(max=n_starts)
                q_new = starts[s_new, own_new]
                m = own_new.numel()
                own = torch.cat([own, own_new])
                q_trial = torch.cat([q_trial, q_new])
                q = torch.cat([q, q_new])
                if r is not None:
                    r = torch.cat([r, r.new_zeros(m, r.shape[1])])
                    A = torch.cat([A, A.new_zeros(m, *A.shape[1:])])
                force = torch.cat([force, torch.ones(m, dtype=torch.bool, device=dev)])
                cost, perr, rerr = (torch.cat([x, full(m, inf)]) for x in (cost, perr, rerr))
                pred = torch.cat([pred, full(m, 1.0)])
                lam, nu, cost_win = torch.cat([lam, full(m, self.lam0)]), torch.cat([nu, full(m, 2.0)]), \
                    torch.cat([cost_win, full(m, inf)])
                it = torch.cat([it, full(m, 0, torch.long)])
            k += 1
        return {"q": best_q, "converged": conv_t, "perr": best_perr, "rerr": best_rerr,
                "iterations": iters_t, "attempts": next_start}

    @staticmethod
    def _keep_best(mask, own, cost, perr, rerr, q, best_q, best_cost, best_perr, best_rerr, skip):
        """Store, per target, the lowest-cost element of ``mask``: always (``skip=None``: converged ones), or if
        it beats the stored one and its target is not in ``skip``."""
        o, c = own[mask], cost[mask]
        lowest = torch.full_like(best_cost, float("inf")).scatter_reduce(0, o, c, "amin")
        better = torch.ones_like(best_cost, dtype=torch.bool) if skip is None else (lowest < best_cost) & ~skip
        win = mask.clone()
        win[mask] = (c <= lowest[o]) & better[o]
        w = own[win]
        best_q[w], best_cost[w], best_perr[w], best_rerr[w] = q[win], cost[win], perr[win], rerr[win]


# ----------------------------------------------------------------------------- the gradient
def _implicit_step(problem: _Problem, q_star: Tensor, Tt: Tensor, w6: Tensor, mu: float) -> Tensor:
    """``q* + A^+ (r(q*, T) - r(q*, T).detach())``: the value of ``q*``, the implicit derivative."""
    qs = q_star.detach()
    with torch.no_grad():
        _, _, _, e_r = problem.errors(qs, None)
        A = problem.weighted_jacobian(qs, e_r, None)
        n = A.shape[-1]
        qj = qs[:, qs.shape[1] - (n - problem.nb):]
        lo, hi = problem.lo[problem.nb:], problem.hi[problem.nb:]
        at = (qj <= lo + problem.at_bound) | (qj >= hi - problem.at_bound)
        held = torch.cat([torch.zeros_like(at[:, :1]).expand(-1, problem.nb), at], -1)
        A = A * (~held)[:, None, :].to(A.dtype)
        if mu > 0:
            m = A.shape[-2]
            G = A @ A.transpose(-1, -2) + mu * torch.eye(m, dtype=A.dtype, device=A.device)
            P = A.transpose(-1, -2) @ torch.linalg.solve(G, torch.eye(m, dtype=A.dtype, device=A.device))
        else:
            P = torch.linalg.pinv(A)
    grad_problem = _Problem(problem.robot, problem.li, Tt, w6, problem.rows, problem.lo, problem.hi,
                            problem.lam0, "adaptive", problem.tol_p, problem.tol_r)
    r, _, _, _ = grad_problem.errors(qs, None)
    dq = (P @ (r - r.detach())[..., None])[..., 0]
    return problem.move(qs, dq)
