"""A batched Newton root-find layer whose gradient comes from the implicit function theorem.

``x* = newton_solve(residual_fn, x0, params)`` solves ``residual_fn(x*, *params) = 0``. The forward
pass iterates Newton's method without recording a graph; the backward pass uses that, at a
regular root, ``dx*/dtheta = -J^{-1} dr/dtheta`` with ``J = dr/dx (x*)``. For a cotangent ``g`` of
``x*`` it solves the one linear system ``J^T w = g`` and returns the vector-Jacobian product of the
residual with cotangent ``-w`` for every parameter. Memory and time of the backward pass are thus
independent of the number of Newton iterations.

The same layer serves the variational integrators (:mod:`diffmech.sim.integrators`), E2E-SyMo's
Newton solve and any other converged solver.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from .errors import ConvergenceError, ShapeError

__all__ = ["newton_solve", "NewtonStatus", "batched_jacobian"]

# Armijo constant and number of step halvings of the backtracking line search.
_ARMIJO = 1e-4
_MAX_HALVINGS = 12


class NewtonStatus(NamedTuple):
    """Outcome of :func:`newton_solve` when ``raise_on_failure=False``.

    Attributes:
        converged: (...) bool, whether each batch element met its tolerance.
        residual_norm: (...) infinity norm of the final residual of each batch element.
        iterations: Newton iterations taken (the batch iterates together).
    """

    converged: Tensor
    residual_norm: Tensor
    iterations: int


def batched_jacobian(fn: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """Per-element Jacobians ``J[..., i, j] = d fn(x)[..., i] / d x[..., j]`` of a batched map.

    ``fn`` must act on every batch element independently (``fn(x)[b]`` depends on ``x[b]`` only).
    One forward-mode pass per column, vectorised with ``torch.func.vmap``: the ``j``-th tangent is
    the ``j``-th unit vector in every batch element at once, so the cost is ``n`` forward-mode
    evaluations of the batched function, not ``n x batch``.

    Args:
        fn: map ``(..., n) -> (..., m)``.
        x: (..., n) point.

    Returns:
        (..., m, n) Jacobians.
    """
    n = x.shape[-1]
    basis = torch.eye(n, dtype=x.dtype, device=x.device).reshape(n, *([1] * (x.dim() - 1)), n).expand(n, *x.shape)
    cols = torch.func.vmap(lambda t: torch.func.jvp(fn, (x,), (t,))[1])(basis)  # (n, ..., m)
    return cols.movedim(0, -1)


def _inf_norm(r: Tensor) -> Tensor:
    return r.abs().amax(-1) if r.shape[-1] else r.new_zeros(r.shape[:-1])


def _jac(fn, jacobian, x, params):
    if jacobian is not None:
        return jacobian(x, *params)
    return batched_jacobian(lambda y: fn(y, *params), x)


def _where_batch(mask: Tensor, a: Tensor, b: Tensor) -> Tensor:
    return torch.where(mask[..., None], a, b)


def _newton(fn, jacobian, x0, params, tol, max_iter, line_search, update="newton", approx_jacobian=None):
    """Newton iterations without a graph. Returns ``(x, r, residual_norm, iterations, singular)``.

    ``jacobian`` is the exact Jacobian (None: forward-mode AD); ``approx_jacobian`` an optional
    cheaper stand-in used first. ``update`` is ``"newton"`` (a new matrix every iteration),
    ``"chord"`` (the first one throughout) or ``"broyden"`` (the first one, then Broyden's
    rank-one secant updates). When an iteration of a cheap variant fails to halve the residual,
    the next one starts over from the exact Jacobian at the current point.

    The iterations serve small systems in long sequential loops (one implicit time step each),
    where the cost is the number of tensor operations rather than their size: the convergence
    test follows each new residual, so the final iteration skips the matrix update no further
    iteration would use, and the line search costs one flag until a step is rejected.
    """
    x = x0.detach().clone()
    r = fn(x, *params)
    if r.shape != x.shape:
        raise ShapeError(
            f"newton_solve: residual_fn returned shape {tuple(r.shape)} for x of shape {tuple(x.shape)}; "
            "a square system (..., n) -> (..., n) is required"
        )
    rn = _inf_norm(r)
    singular = torch.zeros_like(rn, dtype=torch.bool)
    done = rn <= tol
    J = None
    exact = approx_jacobian is None
    it = 0
    if bool(done.all()):
        return x, r, rn, it, singular
    while it < max_iter:
        if not bool(torch.isfinite(rn).all()):
            break
        if J is None or update == "newton":
            J = _jac(fn, jacobian if exact else approx_jacobian, x, params)
            lu, piv, info = torch.linalg.lu_factor_ex(J)
            singular = singular | (info != 0)
        dx = torch.linalg.lu_solve(lu, piv, -r[..., None])[..., 0]
        finite = torch.isfinite(dx)
        singular = singular | ~finite.all(-1)
        # Converged elements stay where they are (their step is zeroed), and so do non-finite steps.
        dx = torch.where(finite & ~done[..., None], dx, 0.0)
        x_new = x + dx
        r_new = fn(x_new, *params)
        rn_new = _inf_norm(r_new)
        if line_search:
            # Halve the step of the elements whose residual norm did not decrease enough; keep the
            # best point tried (a root closer than the residual's rounding error stalls Armijo).
            bad = ~(rn_new <= (1 - _ARMIJO) * rn) & ~done
            if bool(bad.any()):
                alpha = torch.ones_like(rn)
                for _ in range(_MAX_HALVINGS):
                    alpha = torch.where(bad, alpha / 2, alpha)
                    x_try = x + alpha[..., None] * dx
                    r_try = fn(x_try, *params)
                    rn_try = _inf_norm(r_try)
                    better = bad & (rn_try < rn_new)
                    x_new = _where_batch(better, x_try, x_new)
                    r_new = _where_batch(better, r_try, r_new)
                    rn_new = torch.where(better, rn_try, rn_new)
                    bad = bad & ~(rn_try <= (1 - _ARMIJO * alpha) * rn)
                    if not bool(bad.any()):
                        break
        done_new = rn_new <= tol
        it += 1
        if bool(done_new.all()):
            x, r, rn, done = x_new, r_new, rn_new, done_new
            break
        slow = ~(rn_new <= 0.5 * rn) & ~done_new
        if (update != "newton" or not exact) and bool(slow.any()):
            exact, J = True, None  # the cheap matrix is not good enough here: refresh exactly
        elif update == "broyden":
            # Smallest change of J that meets the secant condition J (x_new - x) = r_new - r.
            s_ = x_new - x
            ss = (s_ * s_).sum(-1, keepdim=True)
            upd = (r_new - r - (J @ s_[..., None])[..., 0]) / torch.where(ss > 0, ss, 1.0)
            J = J + upd[..., :, None] * s_[..., None, :]
            lu, piv, info = torch.linalg.lu_factor_ex(J)
            singular = singular | (info != 0)
        x, r, rn, done = x_new, r_new, rn_new, done_new
    return x, r, rn, it, singular


def _solve_step(J: Tensor, r: Tensor) -> tuple[Tensor, Tensor]:
    """``dx = -J^{-1} r`` per batch element and a flag for singular ones (a division when ``n = 1``)."""
    if J.shape[-1] == 1:
        d = J[..., 0]
        return -r / d, d[..., 0] == 0
    dx, info = torch.linalg.solve_ex(J, -r)
    return dx, info != 0


def _newton_fused(fn, rj, x0, params, tol, max_iter, line_search, chord=False):
    """Newton iterations with a fused ``(r, J) = rj(x, *params)``. Returns ``(x, r, rn, it, singular, J)``.

    Newton (``chord=False``): every evaluation yields both, so ``J`` is the Jacobian at the returned
    ``x`` (the matrix the implicit backward pass needs at the root) at no extra cost.
    Chord (``chord=True``): new points are evaluated by the residual ``fn`` alone, and the matrix is
    refreshed by ``rj`` only when needed: at the first iteration (none if the initial guess already
    converges) and after an iteration that fails to halve the residual norm. ``J`` is then returned
    only if it was evaluated at the returned ``x``, else ``None``.
    An element whose residual becomes non-finite stops there (not converged); the others go on.
    """
    x = x0.detach().clone()
    if chord:
        r, J = fn(x, *params), None
    else:
        r, J = rj(x, *params)
    if r.shape != x.shape or (J is not None and J.shape != (*x.shape, x.shape[-1])):
        raise ShapeError(
            f"newton_solve: the residual has shape {tuple(r.shape)} and the Jacobian "
            f"{None if J is None else tuple(J.shape)} for x of shape {tuple(x.shape)}; (..., n) and (..., n, n) "
            "are required"
        )
    J_at_x = J is not None
    rn = _inf_norm(r)
    singular = torch.zeros_like(rn, dtype=torch.bool)
    done = rn <= tol
    # elements whose residual is not finite stop where they are (reported as not converged); the
    # others go on
    stop = done | ~torch.isfinite(rn)
    it = 0
    while it < max_iter and not bool(stop.all()):
        if J is None:
            r, J = rj(x, *params)
            J_at_x = True
        dx, sing = _solve_step(J, r)
        finite = torch.isfinite(dx)
        singular = singular | sing | ~finite.all(-1)
        dx = torch.where(finite & ~stop[..., None], dx, 0.0)
        x_new = x + dx
        if chord:
            r_new, J_new = fn(x_new, *params), J
        else:
            r_new, J_new = rj(x_new, *params)
        rn_new = _inf_norm(r_new)
        if line_search:
            bad = ~(rn_new <= (1 - _ARMIJO) * rn) & ~stop
            if bool(bad.any()):
                alpha = torch.ones_like(rn)
                for _ in range(_MAX_HALVINGS):
                    alpha = torch.where(bad, alpha / 2, alpha)
                    x_try = x + alpha[..., None] * dx
                    if chord:
                        r_try = fn(x_try, *params)
                    else:
                        r_try, J_try = rj(x_try, *params)
                        J_new = torch.where((bad & (_inf_norm(r_try) < rn_new))[..., None, None], J_try, J_new)
                    rn_try = _inf_norm(r_try)
                    better = bad & (rn_try < rn_new)
                    x_new = _where_batch(better, x_try, x_new)
                    r_new = _where_batch(better, r_try, r_new)
                    rn_new = torch.where(better, rn_try, rn_new)
                    bad = bad & ~(rn_try <= (1 - _ARMIJO * alpha) * rn)
                    if not bool(bad.any()):
                        break
        it += 1
        done_new = rn_new <= tol
        stop_new = stop | done_new | ~torch.isfinite(rn_new)
        if chord:
            J_at_x = False
            if bool((~(rn_new <= 0.5 * rn) & ~stop_new).any()):
                J_new = None  # the frozen matrix is not good enough here: refresh it at the new point
        x, r, rn, J, done, stop = x_new, r_new, rn_new, J_new, done_new, stop_new
    return x, r, rn, it, singular, (J if J_at_x else None)


def _failure_message(context, rn, tol, it, max_iter, singular) -> str:
    where = f" ({context})" if context else ""
    bad = ~(rn <= tol)
    n_bad = int(bad.sum())
    worst = rn.masked_fill(~bad, -1.0).reshape(-1)
    flat_idx = int(torch.argmax(torch.nan_to_num(worst, nan=float("inf"))))
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat_idx), rn.shape)) if rn.dim() else ()
    worst_val = float(rn.reshape(-1)[flat_idx]) if rn.numel() else float("nan")
    tol_val = float(torch.as_tensor(tol).expand_as(rn).reshape(-1)[flat_idx]) if rn.numel() else float("nan")
    msg = (
        f"newton_solve{where}: did not converge after {it} iterations (max_iter={max_iter}): "
        f"residual norm {worst_val:.3e} > tol {tol_val:.3e}"
    )
    if rn.dim():
        msg += f" at batch element {idx} ({n_bad} of {rn.numel()} elements not converged)"
    if bool(singular.any()):
        msg += "; the Jacobian was singular or non-finite during the iterations"
    if not torch.isfinite(rn).all():
        msg += "; the residual is not finite"
    return msg


class _ImplicitSolve(torch.autograd.Function):
    """Root of ``fn(x, *params)``; backward by the implicit function theorem."""

    @staticmethod
    def forward(ctx, fn, jacobian, opts, x0, n_explicit, *all_params):
        params = all_params[:n_explicit]
        J_root = None
        with torch.no_grad():
            if opts["residual_and_jacobian"] is not None:
                x, _, rn, it, singular, J_root = _newton_fused(fn, opts["residual_and_jacobian"], x0, params,
                                                               opts["tol"], opts["max_iter"], opts["line_search"],
                                                               opts["update"] == "chord")
            else:
                x, _, rn, it, singular = _newton(fn, jacobian, x0, params, opts["tol"], opts["max_iter"],
                                                 opts["line_search"], opts["update"], opts["approx_jacobian"])
        ctx.fn, ctx.jacobian, ctx.n_explicit = fn, jacobian, n_explicit
        ctx.rj = opts["residual_and_jacobian"]
        ctx.wr = opts["weighted_residual"]
        ctx.has_J = J_root is not None
        ctx.save_for_backward(x, *(() if J_root is None else (J_root,)), *all_params)
        ctx.mark_non_differentiable(rn)
        # Python-side results travel back through the (per-call) options dict.
        opts["iterations"], opts["singular"] = it, singular
        return x, rn

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g, _g_rn):
        x, *all_params = ctx.saved_tensors
        J = all_params.pop(0) if ctx.has_J else None
        n_explicit = ctx.n_explicit
        needs = ctx.needs_input_grad[5:]
        out: list[Tensor | None] = [None] * len(all_params)
        if g is None or not any(needs):
            return (None, None, None, None, None, *out)
        explicit = list(all_params[:n_explicit])
        adjoint = list(all_params[n_explicit:])
        with torch.no_grad():
            if J is None:
                J = ctx.rj(x, *explicit)[1] if ctx.rj is not None else _jac(ctx.fn, ctx.jacobian, x, explicit)
            if J.shape[-1] == 1:
                w = g / J[..., 0]
            else:
                w = torch.linalg.solve_ex(J.mT, g)[0]  # J^T w = g
        with torch.enable_grad():
            leaves = [p.detach().requires_grad_(True) if needs[i] else p for i, p in enumerate(explicit)]
            wanted = [i for i in range(len(all_params)) if needs[i]]
            inputs = [leaves[i] if i < n_explicit else adjoint[i - n_explicit] for i in wanted]
            if ctx.wr is not None:
                grads = torch.autograd.grad(ctx.wr(x.detach(), -w, *leaves), inputs, allow_unused=True)
            else:
                r = ctx.fn(x.detach(), *leaves)
                grads = torch.autograd.grad(r, inputs, grad_outputs=-w, allow_unused=True)
        for i, gi in zip(wanted, grads):
            out[i] = gi if gi is not None else torch.zeros_like(all_params[i])
        return (None, None, None, None, None, *out)


def newton_solve(
    residual_fn: Callable[..., Tensor],
    x0: Tensor,
    params: Sequence[Tensor] = (),
    *,
    adjoint_params: Sequence[Tensor] | None = None,
    tol: float | Tensor = 1e-10,
    max_iter: int = 50,
    jacobian: Callable[..., Tensor] | None = None,
    approx_jacobian: Callable[..., Tensor] | None = None,
    line_search: bool = True,
    update: str = "newton",
    raise_on_failure: bool = True,
    context: str = "",
    residual_and_jacobian: Callable[..., tuple[Tensor, Tensor]] | None = None,
    weighted_residual: Callable[..., Tensor] | None = None,
) -> Tensor | tuple[Tensor, NewtonStatus]:
    """Solve ``residual_fn(x, *params) = 0`` for ``x`` by Newton's method, differentiably.

    Forward: Newton iterations on the whole batch without building a graph; the Jacobian
    ``dr/dx`` comes from forward-mode AD (``torch.func.jvp`` vectorised by ``vmap``, one pass per
    unknown) or from ``jacobian``; each step is a batched ``torch.linalg.solve`` with a
    backtracking (Armijo) line search on the residual's infinity norm.
    Backward (implicit function theorem): for the cotangent ``g`` of ``x*``, solve
    ``J(x*)^T w = g`` once and return the VJP of ``residual_fn`` at ``x*`` with cotangent ``-w``
    for every tensor in ``params`` and ``adjoint_params``. No gradient flows to ``x0``: the root
    does not depend on the initial guess. First-order gradients only.

    Args:
        residual_fn: ``r = residual_fn(x, *params)`` with ``x, r (..., n)``. It must treat every
            batch element independently (``r[b]`` depends on ``x[b]`` only; params may be batched
            alike or shared) and be composable with ``torch.func`` transforms (plain tensor code is).
        x0: (..., n) initial guess; the batch shape of the problem.
        params: tensors passed to ``residual_fn`` after ``x``; gradients flow to each of them.
        adjoint_params: tensors that ``residual_fn`` reads without receiving them as arguments
            (e.g. the parameters of a module it captures). Autograd cannot see such captured
            tensors through the root-find, so list them here to receive gradients (the role of
            ``adjoint_params`` in ``torchdiffeq.odeint_adjoint``). Default: the trainable
            parameters of ``residual_fn`` if it is an ``nn.Module``, else none.
        tol: convergence when ``max_i |r_i| <= tol`` for every batch element; a float or a tensor
            broadcastable to the batch shape (per-element tolerances).
        max_iter: Newton iterations allowed.
        jacobian: optional analytic ``J = jacobian(x, *params) -> (..., n, n)``, ``J[..., i, j] =
            dr_i/dx_j``; used in the forward iterations and in the backward solve.
        approx_jacobian: optional cheaper approximation of ``J`` (same signature) that the
            forward iterations start with (a quasi-Newton method: linear convergence whose rate is
            the approximation's relative error). If an iteration fails to halve the residual
            norm, the iterations continue from the exact Jacobian. The backward pass always takes
            the exact one (``jacobian`` or forward-mode AD).
        line_search: halve the step while it does not decrease the residual norm (Armijo).
        update: how the forward iterations refresh the Jacobian: ``"newton"`` (every iteration,
            quadratic convergence), ``"chord"`` (factorise the first one and reuse it: cheaper
            iterations, linear convergence) or ``"broyden"`` (the first one, then Broyden's
            rank-one secant updates: superlinear convergence for the cost of the chord method).
            The cheap variants pay off when ``x0`` is close to the root (e.g. a time step
            started from an explicit predictor); an iteration that fails to halve the residual
            norm makes the next one start over from the exact Jacobian. The backward pass always
            uses the exact Jacobian at the root.
        raise_on_failure: raise :class:`~diffmech.errors.ConvergenceError` when an element did not
            converge (default). If ``False``, return ``(x, NewtonStatus)`` instead and let the
            caller decide.
        context: where the solve happened, quoted in the error message (e.g. ``"step 17"``).
        residual_and_jacobian: optional fused ``(r, J) = residual_and_jacobian(x, *params)``,
            the residual and its Jacobian from one evaluation (e.g. a network's forward pass
            carrying first and second derivatives). With ``update="newton"`` the forward
            iterations evaluate only it, and the Jacobian it returned at the root serves the
            backward pass, which then evaluates ``residual_fn`` once for the vector-Jacobian
            product and builds no further Jacobian. With ``update="chord"`` new points are
            evaluated by ``residual_fn`` alone and the matrix is refreshed by
            ``residual_and_jacobian`` only at the first iteration (not at all if ``x0`` already
            converges) and after an iteration that fails to halve the residual norm: the cheap
            choice for warm-started solves without gradients. ``update="broyden"`` is treated as
            ``"newton"`` here; ``jacobian`` and ``approx_jacobian`` are not used by the forward
            iterations.
        weighted_residual: optional ``s = weighted_residual(x, w, *params)``, the scalar
            ``sum(w * residual_fn(x, *params))`` for a cotangent ``w (..., n)``, differentiable
            w.r.t. the parameters. The backward pass then differentiates it instead of
            ``residual_fn`` (the vector-Jacobian product in a cheaper form, e.g. with the
            contraction by ``w`` taken inside a network's derivatives); gradients w.r.t. ``x`` and
            ``w`` are not needed from it.

    Returns:
        ``x (..., n)``, the root, in ``x0``'s dtype and device; or ``(x, status)`` when
        ``raise_on_failure=False``.

    Raises:
        ConvergenceError: with the residual norm, the iterations and ``context``.
    """
    if not isinstance(x0, Tensor) or x0.dim() < 1:
        raise ShapeError(f"newton_solve: x0 must be a tensor of shape (..., n), got {type(x0).__name__} "
                         f"{tuple(getattr(x0, 'shape', ()))}")
    if max_iter < 0:
        raise ShapeError(f"newton_solve: max_iter must be >= 0, got {max_iter}")
    if update not in ("newton", "chord", "broyden"):
        raise ShapeError(f"newton_solve: update must be 'newton', 'chord' or 'broyden', got {update!r}")
    params = tuple(params)
    if adjoint_params is None:
        adjoint_params = (
            tuple(p for p in residual_fn.parameters() if p.requires_grad) if isinstance(residual_fn, nn.Module) else ()
        )
    adjoint_params = tuple(adjoint_params)
    for name, group in (("params", params), ("adjoint_params", adjoint_params)):
        for i, p in enumerate(group):
            if not isinstance(p, Tensor):
                raise ShapeError(f"newton_solve: {name}[{i}] must be a tensor, got {type(p).__name__}")
    if isinstance(tol, Tensor):
        tol = tol.to(dtype=x0.dtype, device=x0.device)
    opts = {"tol": tol, "max_iter": int(max_iter), "line_search": bool(line_search), "update": update,
            "approx_jacobian": approx_jacobian, "residual_and_jacobian": residual_and_jacobian,
            "weighted_residual": weighted_residual}
    needs_graph = torch.is_grad_enabled() and any(p.requires_grad for p in (*params, *adjoint_params))
    if needs_graph:
        x, rn = _ImplicitSolve.apply(residual_fn, jacobian, opts, x0, len(params), *params, *adjoint_params)
        it, singular = opts["iterations"], opts["singular"]
        converged = rn <= tol
    else:
        with torch.no_grad():
            if residual_and_jacobian is not None:
                x, _, rn, it, singular, _ = _newton_fused(residual_fn, residual_and_jacobian, x0, params, tol,
                                                          max_iter, line_search, update == "chord")
            else:
                x, _, rn, it, singular = _newton(residual_fn, jacobian, x0, params, tol, max_iter, line_search,
                                                 update, approx_jacobian)
        converged = rn <= tol
    status = NewtonStatus(converged=converged, residual_norm=rn.detach(), iterations=it)
    if raise_on_failure:
        if not bool(converged.all()):
            raise ConvergenceError(_failure_message(context, rn.detach(), tol, it, max_iter, singular))
        return x
    return x, status
