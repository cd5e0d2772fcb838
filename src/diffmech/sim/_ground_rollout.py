"""A checkpointed rollout's steps, and their reverse, for one robot on the ground, without autograd.

The native route of :mod:`._ground_step` computes a step's numbers in a handful of kernel calls, but
a step still costs some eighty torch operations of glue and, in the backward pass, a replay under
autograd whose graph is then walked by autograd's engine: with one robot that dispatch, not the
arithmetic, was most of a step's gradient. Here a step is one call of a C driver
(:mod:`._ground_driver`) that runs the same kernels -- the stage kernel, the contact selection, the
contact problem's assembly and PGS sweeps, the impulses' velocity change, the position update -- and
its vector-Jacobian product another, from their reverse modes: the position update's kernel, the
contact problem's reverse pass (:func:`~diffmech.contact.update_native.backward_native`'s kernels and
the sweeps' implicit pull-back) and the stage kernel's reverse mode. The cotangents of the scene's
drive gains, shape sizes and contact coefficients are summed over the steps and pulled back to the
user's tensors once, at the end of the backward pass. The same step written in Python on the
kernels' buffers (:meth:`GroundStepper.step`, :meth:`GroundStepper.vjp`) runs where the driver hands
a step back (a base turning a radian or more in one step; a rank-deficient contact problem in the
reverse pass) or cannot be built.

Same operations as :func:`~diffmech.sim.contact_step` on that route: the same trajectory bit for bit
(the contact selection's sums aside, which decide a mask only), the same gradient to rounding
(``tests/test_contact_ground_rollout.py``). Used by the checkpointed adjoint of
:func:`~diffmech.sim.rollout` for torque sequences (not policies) where the route applies and no
robot parameter requires grad; otherwise the steps run as before.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..contact import pgs_native, update_native
from ..contact.pgs import NEWTON_ITERATIONS, implicit_vjp
from ..dynamics import kernels, threads
from ..dynamics.kernel_store import NativeUnavailable
from ..dynamics.kinematics import advance_floating_base
from ..dynamics.lanes import SERIES_BELOW
from . import _ground_driver as _driver
from ._ground_step import GroundPlan, _balls, coefficients, ground_plan
from .scene import Scene

__all__ = ["GroundStepper", "ground_stepper", "native_step", "Impulses"]

CHECK_EVERY = 4  # the PGS convergence test's period, as contact_step's solver call uses it
# Balls x environments: no limit. contact_step's native route stops at _ground_step.MAX_BALL_STATES, where its
# one-thread kernel stops beating the torch step's batched operations on all threads; these steps keep
# winning without its glue (measured, one quadruped's rollout of 100-300 steps, ms per step forward +
# backward, this / the torch step, 2 cores: 10 robots 0.40 / 1.69, 64 robots 1.53 / 3.08, 256 robots
# 6.0 / 8.1, 1024 robots 30.1 / 58.8).
MAX_STATES = None


class Contacts(NamedTuple):
    """What a step kept: the warm start of the next step and the replay of its reverse."""

    slots: np.ndarray  # (K,) int64, each row block's slot: ball b -> b, lower limit j -> nb + j, upper -> nb + nl + j
    lam: Tensor  # (B, K, 3) impulses

    def values(self):  # the tensors a rollout keeps (its saved-bytes stat)
        return (self.lam,)


_EMPTY = np.zeros(0, dtype=np.int64)


def _coef_signature(scene: Scene, plan: GroundPlan) -> tuple:
    """What the balls' friction and restitution are read from: the scene's values and tables (by identity)."""
    return (id(scene.friction), id(scene.restitution), id(scene.pairs), id(scene.link_coefficients.get(plan.name)),
            len(scene.pairs))


class GroundStepper:
    """The steps of one rollout of ``scene`` (one robot on the ground, :func:`ground_stepper`): ``B``
    environments, ``dtype``, time step ``dt`` (s). :meth:`step` is the forward step,
    :meth:`vjp` its reverse; :meth:`parameter_grads` the cotangents of the scene's tensors."""

    def __init__(self, scene: Scene, plan: GroundPlan, B: int, dtype: torch.dtype, dt: float,
                 fields: tuple[int, ...] = ()):
        n = plan.name
        m = scene.models[n]
        self.scene, self.plan, self.B, self.dtype, self.dt = scene, plan, B, dtype, float(dt)
        self.nq, self.nv, self.nb = m.nq, m.nv, len(plan.links)
        nv, nb = self.nv, self.nb
        self.o_L, self.o_phi, self.o_rows = nv, nv + nv * nv, nv + nv * nv + nb
        self.stage = plan.call.kernel(dtype)
        # the reverse mode; with ``fields`` (model tensors that require grad) it also sums their elements'
        # cotangents over the batch, which the steps add up and parameter_grads pulls back once
        self.fields = fields
        self.field_sizes = [plan.call.offsets[i][1] for i in fields]
        self.stage_vjp = plan.call.kernel(dtype, True, fields)
        _, C = m.model_tensors_flat(dtype)
        self.C, self._C_source = C.detach().clone(), C
        with torch.no_grad():
            consts = []
            if plan.n_drives:
                consts.append(torch.cat(scene.drives[n]).to(dtype).expand(B, -1).contiguous())
            balls = plan.balls if plan.balls is not None and not scene.shape_sizes else _balls(scene, plan, dtype)
            consts += [balls.detach().to(dtype).expand(B, -1).contiguous(),
                       torch.full((B, 1), self.dt, dtype=dtype)]
        self.consts = consts
        self.dt_col = consts[-1]
        coef = coefficients(scene, plan, torch.arange(nb), list(range(nb)), 1, self.C)
        self.coef = np.stack([c.detach().to(dtype).reshape(-1).numpy() for c in coef])  # (2, nb)
        self._coef_sig = _coef_signature(scene, plan)
        self._seen: dict = {}  # refresh(): the signatures of the values last read
        self.np_dtype = self.coef.dtype
        # the joint limits (floating-base joints have none)
        lim = m.joint_limits()
        lo, hi = lim["lower"], lim["upper"]
        off = 7 if m.floating_base else 0
        self.off, self.col = off, nv - lo.numel()
        self.lo, self.hi = lo.detach().to(dtype).contiguous(), hi.detach().to(dtype).contiguous()
        self.lon, self.hin = self.lo.numpy(), self.hi.numpy()
        self.nl = lo.numel()
        self.limits = (scene.limits and self.nl == m.nq - off and self.nl > 0
                       and bool(np.isfinite(self.lon).any() or np.isfinite(self.hin).any()))
        # the position update: its kernel and reverse mode where built, else the torch function
        self.advance = self.advance_vjp = None
        if plan.advance is not None:
            try:
                self.advance = plan.advance.kernel(dtype)
                self.advance_vjp = plan.advance.kernel(dtype, True, ())
            except NativeUnavailable:
                self.advance = self.advance_vjp = None
        self.floating = m.floating_base
        self.model = m
        s = "f64" if dtype == torch.float64 else "f32"
        self.iterations, self.tol, self.newton = scene.iterations, scene.tol, NEWTON_ITERATIONS
        self.baumgarte, self.bounce_speed = scene.baumgarte, scene.bounce_speed
        self._s = s
        self.n_slots = nb + 2 * self.nl
        self.reset()
        self.driver = self._driver()

    def _driver(self):
        """The C driver's forward and backward functions and this rollout's :class:`~._ground_driver.Ground`,
        or ``None`` (no driver library, or a kernel the step needs is not built: the Python runs)."""
        lib = _driver.library()
        if lib is None or self.advance is None:  # a fixed base, or no kernel: the torch position update
            return None
        from ..contact.pgs_native import _library as pgs_library
        from ..contact.update_native import _library as update_library

        up, pg, s = update_library(), pgs_library(), self._s
        g = _driver.Ground()
        for name, val in (("B", self.B), ("nq", self.nq), ("nv", self.nv), ("nb", self.nb), ("nl", self.nl),
                          ("off", self.off), ("col", self.col),
                          ("nd", self.consts[0].shape[1] if self.plan.n_drives else 0),
                          ("limits", int(self.limits)), ("iterations", self.iterations),
                          ("check_every", CHECK_EVERY), ("advance", int(self.advance is not None)),
                          ("newton", self.newton), ("n_red", self.g_red.numel())):
            setattr(g, name, int(val))
        for name, val in (("dt", self.dt), ("baumgarte", self.baumgarte), ("bounce_speed", self.bounce_speed),
                          ("tol", self.tol), ("series", SERIES_BELOW)):
            setattr(g, name, float(val))
        # the kernels' compiled functions (LaneKernel._fn, read here rather than given a public accessor:
        # a change to native.py's text invalidates every stored kernel, see kernels.code_version)
        adv = _driver.address(self.advance._fn) if self.advance is not None else None
        adv_vjp = _driver.address(self.advance_vjp._fn) if self.advance_vjp is not None else None
        g.stage, g.stage_vjp = _driver.address(self.stage._fn), _driver.address(self.stage_vjp._fn)
        g.adv, g.adv_vjp = adv, adv_vjp
        for name, lib_, sym in (("assemble", up, "assemble"), ("apply", up, "apply"), ("pgs", pg, "pgs"),
                                ("back1", up, "backward1"), ("vjp", pg, "vjp"), ("back2", up, "backward2")):
            setattr(g, name, _driver.address(getattr(lib_, f"{sym}_{s}")))
        self._coef_t = torch.from_numpy(np.ascontiguousarray(self.coef))
        self._keep = [self.C, self._coef_t, self.lo, self.hi, *self.consts]  # what g points into
        g.C, g.coef, g.lo, g.hi = (x.data_ptr() for x in (self.C, self._coef_t, self.lo, self.hi))
        g.drives = self.consts[0].data_ptr() if self.plan.n_drives else None
        g.balls, g.dtcol = self.consts[-2].data_ptr(), self.consts[-1].data_ptr()
        g.g_red = self.g_red.data_ptr() if self.g_red.numel() else None
        self.ground = g
        self.ground_ref = ctypes.byref(g)
        self._slot_buf = np.zeros(max(self.n_slots, 1), dtype=np.int64)
        self._info_i = np.zeros(4, dtype=np.int64)
        self._info_d = np.zeros(3, dtype=np.float64)
        return getattr(lib, f"forward_{s}"), getattr(lib, f"backward_{s}")

    def reset(self) -> None:
        """Zero the summed cotangents of the scene's tensors (a new backward pass)."""
        width = sum(x.shape[1] for x in self.consts)
        self.g_consts = torch.zeros(width, dtype=torch.float64)
        self.g_mu = np.zeros(self.nb)
        self.g_e = np.zeros(self.nb)
        if not hasattr(self, "g_red"):  # the driver holds its address: zeroed in place from now on
            self.g_red = torch.zeros(sum(self.field_sizes), dtype=torch.float64)
        self.g_red.zero_()

    # ------------------------------------------------------------ the step
    def _stage(self, q: Tensor, v: Tensor, tau: Tensor) -> tuple[list, Tensor]:
        state = [kernels._prep(x, self.dtype) for x in (q, v, tau)] + self.consts
        return state, self.stage(state, self.C)

    def _select(self, out: Tensor, q: Tensor, v: Tensor) -> tuple[np.ndarray, tuple]:
        """The balls and joint limits that can be reached within the step (as contact_step keeps them)."""
        o = out.numpy()
        B, nv, nb, dt = self.B, self.nv, self.nb, self.dt
        rows = o[:, self.o_rows:].reshape(B, nb, 3, nv)
        speed = np.linalg.norm(np.einsum("bkjn,bn->bkj", rows, o[:, :nv]), axis=-1)
        with np.errstate(invalid="ignore"):
            balls = np.flatnonzero((o[:, self.o_phi:self.o_rows] < 2e-3 + 2.0 * dt * speed).any(0))
        limits = []
        if self.limits:
            qn, vn = q.numpy()[:, self.off:], v.numpy()[:, self.col:]
            for sign in (1.0, -1.0):
                with np.errstate(invalid="ignore"):
                    gap = qn - self.lon if sign > 0 else self.hin - qn
                    sel = np.flatnonzero((np.isfinite(gap) & (gap < 2e-3 + 2.0 * dt * np.abs(vn))).any(0))
                if len(sel):
                    limits.append((sign, sel))
        return balls, tuple(limits)

    def _problem(self, out: Tensor, q: Tensor, balls: np.ndarray, limits: tuple
                 ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``J (B, 3K, nv)``, ``phi``, ``mu``, ``e`` ``(B, K)`` of the rows kept."""
        B, nv, nb = self.B, self.nv, self.nb
        o = out.numpy()
        kb = len(balls)
        K = kb + sum(len(j) for _, j in limits)
        J = np.zeros((B, 3 * K, nv), dtype=self.np_dtype)
        phi = np.empty((B, K), dtype=self.np_dtype)
        mu = np.zeros((B, K), dtype=self.np_dtype)
        e = np.zeros((B, K), dtype=self.np_dtype)
        if kb:
            J[:, :3 * kb] = o[:, self.o_rows:].reshape(B, nb, 3, nv)[:, balls].reshape(B, 3 * kb, nv)
            phi[:, :kb] = o[:, self.o_phi:self.o_rows][:, balls]
            mu[:, :kb] = self.coef[0, balls]
            e[:, :kb] = self.coef[1, balls]
        r = kb
        qj = q[:, self.off:]
        for sign, idx in limits:
            k = len(idx)
            J[:, 3 * (r + np.arange(k)), self.col + idx] = sign
            ix = torch.from_numpy(idx)
            phi[:, r:r + k] = (qj[:, ix] - self.lo[ix] if sign > 0 else self.hi[ix] - qj[:, ix]).numpy()
            r += k
        return torch.from_numpy(J), torch.from_numpy(phi), torch.from_numpy(mu), torch.from_numpy(e)

    def _slots(self, balls: np.ndarray, limits: tuple) -> np.ndarray:
        parts = [balls] + [self.nb + (0 if sign > 0 else self.nl) + idx for sign, idx in limits]
        return (np.concatenate(parts) if len(parts) > 1 else balls).astype(np.int64)

    def _rows(self, slots: np.ndarray) -> tuple[np.ndarray, tuple]:
        """The balls and joint limits of ``slots`` (:meth:`_slots`'s inverse)."""
        nb, nl = self.nb, self.nl
        lower, upper = slots[(slots >= nb) & (slots < nb + nl)] - nb, slots[slots >= nb + nl] - nb - nl
        return slots[slots < nb], tuple((sign, j) for sign, j in ((1.0, lower), (-1.0, upper)) if len(j))

    def _advance(self, q: Tensor, v1: Tensor) -> tuple[Tensor, Tensor]:
        if self._kernel_advance(v1):
            out = self.advance([q, kernels._prep(v1, self.dtype), self.dt_col], self.C)
            return out[:, :self.nq], out[:, self.nq:]
        return self._torch_advance(q, v1)

    def _kernel_advance(self, v1: Tensor) -> bool:
        if self.advance is None:
            return False
        w = v1[:, 3:6].numpy()
        return bool(w.shape[0]) and float((w * w).sum(-1).max()) * self.dt * self.dt < SERIES_BELOW

    def _torch_advance(self, q: Tensor, v1: Tensor) -> tuple[Tensor, Tensor]:
        m = self.model
        return advance_floating_base(m, q, v1, self.dt) if self.floating else (m.integrate(q, v1, self.dt), v1)

    def step(self, scene: Scene, q: Tensor, v: Tensor, tau: Tensor, dt: float, info: dict,
             warm: Contacts | dict | None = None) -> tuple[Tensor, Tensor]:
        """One step, no graph; :func:`~diffmech.sim.contact_step`'s signature (``info`` filled as it
        fills it, ``info["lam"]`` a :class:`Contacts`: this step's warm start for the next)."""
        B, nv = self.B, self.nv
        q, v = kernels._prep(q, self.dtype), kernels._prep(v, self.dtype)
        if self.driver is not None:
            return self._driver_step(q, v, kernels._prep(tau, self.dtype), info, warm)
        _, out = self._stage(q, v, tau)
        balls, limits = self._select(out, q, v)
        v_free = out[:, :nv]
        slots = self._slots(balls, limits)
        K = len(slots)
        if not K:
            info.update(candidates=0, iterations=0, residual=0.0, penetration=0.0, fallbacks=0, newton=0,
                        violation=0.0, unconverged=0, lam=Contacts(_EMPTY, out.new_zeros(B, 0, 3)))
            return self._advance(q, v_free)
        J, phi, mu, e = self._problem(out, q, balls, limits)
        L = out[:, self.o_L:self.o_phi].view(B, nv, nv)
        A, c, W, _, _, _ = update_native.assemble_native(J, L, v, v_free, phi, e, self.dt, self.baumgarte,
                                                         self.bounce_speed)
        lam0 = None
        if isinstance(warm, Contacts) and len(warm.slots):
            full = np.zeros((B, self.nb + 2 * self.nl, 3), dtype=self.np_dtype)
            full[:, warm.slots] = warm.lam.numpy()
            lam0 = torch.from_numpy(full[:, slots])
        lam, st = pgs_native.native_sweeps(A, c, mu, self.iterations, self.tol, CHECK_EVERY, lam0, self.newton)
        _, v1 = update_native.apply_native(W, lam, v_free)
        q1, v1 = self._advance(q, v1)
        p = phi.numpy()
        info.update(candidates=K, iterations=st.sweeps, residual=st.residual, fallbacks=0, newton=st.newton,
                    violation=st.violation, unconverged=st.unconverged,
                    penetration=max(float(-p.min()), 0.0) + 0.0, lam=Contacts(slots, lam))
        return q1, v1

    def _driver_step(self, q: Tensor, v: Tensor, tau: Tensor, info: dict, warm) -> tuple[Tensor, Tensor]:
        """:meth:`step` by the C driver (:mod:`._ground_driver`)."""
        B, nq, nv = self.B, self.nq, self.nv
        out = q.new_empty(B, nq + nv)
        v1 = q.new_empty(B, nv)
        lam = q.new_empty(B * 3 * self.n_slots)
        slots = self._slot_buf
        prev = warm if isinstance(warm, Contacts) and len(warm.slots) else None
        status = self.driver[0](self.ground_ref, q.data_ptr(), v.data_ptr(), tau.data_ptr(),
                                0 if prev is None else len(prev.slots),
                                None if prev is None else prev.slots.ctypes.data,
                                None if prev is None else prev.lam.data_ptr(), out.data_ptr(), v1.data_ptr(),
                                slots.ctypes.data, lam.data_ptr(), self._info_i.ctypes.data,
                                self._info_d.ctypes.data)
        K, it = int(self._info_i[0]), int(self._info_i[1])
        info.update(candidates=K, iterations=it, residual=float(self._info_d[0]), fallbacks=0,
                    newton=int(self._info_i[2]), unconverged=int(self._info_i[3]), violation=float(self._info_d[2]),
                    penetration=float(self._info_d[1]) + 0.0,
                    lam=Contacts(slots[:K].copy(), lam[:B * 3 * K].view(B, K, 3).clone()))
        if status == _driver.TORCH_ADVANCE:
            return self._torch_advance(q, v1)
        return out[:, :nq], out[:, nq:]

    # ------------------------------------------------------------ its reverse
    def vjp(self, q: Tensor, v: Tensor, tau: Tensor, kept: Contacts, aq: Tensor, av: Tensor
            ) -> tuple[Tensor, Tensor, Tensor, bool]:
        """The cotangents ``(g_q, g_v, g_tau)`` of the step from ``(q, v)`` under ``tau`` whose contacts
        and impulses were ``kept``, for the cotangents ``aq, av`` of its next state, and whether they are
        all finite; the scene's tensors' cotangents are summed into this stepper (:meth:`parameter_grads`)."""
        B, nv, nb = self.B, self.nv, self.nb
        q, v = kernels._prep(q, self.dtype), kernels._prep(v, self.dtype)
        if self.driver is not None:
            got = self._driver_vjp(q, v, kernels._prep(tau, self.dtype), kept, aq, av)
            if got is not None:
                return got
        state, out = self._stage(q, v, tau)
        v_free = out[:, :nv]
        balls, limits = self._rows(kept.slots)
        K = len(kept.slots)
        if K:
            J, phi, mu, e = self._problem(out, q, balls, limits)
            L = out[:, self.o_L:self.o_phi].view(B, nv, nv)
            A, c, W, vn, bounce, scale = update_native.assemble_native(J, L, v, v_free, phi, e, self.dt,
                                                                       self.baumgarte, self.bounce_speed)
            lam = kept.lam
            u, v1 = update_native.apply_native(W, lam, v_free)
        else:
            v1 = v_free
        g_q_adv, g_v1 = self._advance_vjp(q, v1, aq, av)
        g_out = out.new_zeros(out.shape)
        go = g_out.numpy()
        g_q_lim = None
        g_v = None
        if K:
            g_J, g_v, g_vf, g_phi, g_mu, g_e, g_L = update_native.backward_native(
                g_v1, J, v, v_free, phi, mu, e, lam, u, c, W, vn, bounce, scale, L, self.dt, implicit_vjp)
            go[:, :nv] = g_vf.numpy()
            go[:, self.o_L:self.o_phi] = g_L.reshape(B, -1).numpy()
            kb = len(balls)
            if kb:
                gp = g_phi.numpy()
                go[:, self.o_phi + balls] = gp[:, :kb]
                go[:, self.o_rows:].reshape(B, nb, 3 * nv)[:, balls] = g_J.numpy()[:, :3 * kb].reshape(B, kb, 3 * nv)
                if g_mu is not None:
                    self.g_mu[balls] += g_mu.numpy()[:, :kb].sum(0)
                self.g_e[balls] += g_e.numpy()[:, :kb].sum(0)
                r = kb
            else:
                r = 0
            if limits:
                g_q_lim = np.zeros((B, self.nq), dtype=self.np_dtype)
                gp = g_phi.numpy()
                for sign, idx in limits:
                    k = len(idx)
                    # phi = q_j - lower (sign +1) or upper - q_j (sign -1)
                    np.add.at(g_q_lim, (slice(None), self.off + idx), sign * gp[:, r:r + k])
                    r += k
        else:
            go[:, :nv] = g_v1.numpy()
        g_state = self.stage_vjp(state + [g_out], C=self.C)
        if self.fields:
            g_state, red = g_state
        nq = self.nq
        g_q = g_state[:, :nq] + g_q_adv
        if g_q_lim is not None:
            g_q = g_q + torch.from_numpy(g_q_lim)
        g_vv = g_state[:, nq:nq + nv]
        if g_v is not None:
            g_vv = g_vv + g_v
        g_tau = g_state[:, nq + nv:nq + 2 * nv]
        finite = all(bool(np.isfinite(x.numpy()).all()) for x in (g_q, g_vv, g_tau))
        if finite:  # as the driver: the summed cotangents only from a finite step
            self.g_consts += g_state[:, nq + 2 * nv:].sum(0, dtype=torch.float64)
            if self.fields:
                self.g_red += red.to(torch.float64)
        return g_q, g_vv, g_tau, finite

    def _driver_vjp(self, q: Tensor, v: Tensor, tau: Tensor, kept: Contacts, aq: Tensor, av: Tensor
                    ) -> tuple[Tensor, Tensor, Tensor, bool] | None:
        """:meth:`vjp` by the C driver, or ``None`` where it hands the step back (the position update's
        series does not apply; a rank-deficient contact problem)."""
        B, nq, nv = self.B, self.nq, self.nv
        g_q, g_v, g_tau = q.new_empty(B, nq), q.new_empty(B, nv), q.new_empty(B, nv)
        aq, av = kernels._prep(aq, self.dtype), kernels._prep(av, self.dtype)
        status = self.driver[1](self.ground_ref, q.data_ptr(), v.data_ptr(), tau.data_ptr(), len(kept.slots),
                                kept.slots.ctypes.data, kept.lam.data_ptr(), aq.data_ptr(), av.data_ptr(),
                                g_q.data_ptr(), g_v.data_ptr(), g_tau.data_ptr(), self.g_consts.data_ptr(),
                                self.g_mu.ctypes.data, self.g_e.ctypes.data)
        if status == _driver.NOT_FINITE:
            return g_q, g_v, g_tau, False
        return (g_q, g_v, g_tau, True) if status == _driver.OK else None

    def _advance_vjp(self, q: Tensor, v1: Tensor, aq: Tensor, av: Tensor) -> tuple[Tensor, Tensor]:
        if self._kernel_advance(v1):
            g = torch.cat([aq, av], 1).to(self.dtype)
            got = self.advance_vjp([q, kernels._prep(v1, self.dtype), self.dt_col, g], self.C)
            return got[:, :self.nq], got[:, self.nq:self.nq + self.nv]
        with torch.enable_grad():
            qd, vd = q.detach().requires_grad_(), v1.detach().requires_grad_()
            q1, v1o = self._torch_advance(qd, vd)
            g_q, g_v = torch.autograd.grad((q1, v1o), (qd, vd), (aq, av), allow_unused=True)
        return (torch.zeros_like(q) if g_q is None else g_q), (torch.zeros_like(v1) if g_v is None else g_v)

    def parameter_grads(self, params: Sequence[Tensor]) -> list[Tensor | None]:
        """The cotangents of ``params`` from those of the scene's drive gains, shape sizes and contact
        coefficients summed over the steps reversed since :meth:`reset` (one autograd call)."""
        with torch.enable_grad():  # called in a backward pass: the scene's small graphs are built again here
            return self._parameter_grads(params)

    def _parameter_grads(self, params: Sequence[Tensor]) -> list[Tensor | None]:
        pairs = self.tensors()
        wanted = [p for p in params if p.requires_grad]
        if not pairs or not wanted:
            return [None] * len(params)
        got = iter(torch.autograd.grad([t for t, _ in pairs], wanted, [g() for _, g in pairs], allow_unused=True))
        return [next(got) if p.requires_grad else None for p in params]

    def tensors(self) -> list[tuple[Tensor, Callable[[], Tensor]]]:
        """The scene's tensors that require grad and reach the step -- the drive gains, the balls' sizes,
        the friction and restitution of each ball, the robot's model tensors -- as the scene derives them
        now (with their graphs; call with grad mode on), each with a function reading its cotangent
        from the sums of the reverse steps since :meth:`reset`."""
        scene, plan, dtype, nb = self.scene, self.plan, self.dtype, self.nb
        out = []
        off = 0
        if plan.n_drives:
            drv = torch.cat(scene.drives[plan.name]).to(dtype)
            w = drv.shape[0]
            if drv.requires_grad:
                out.append((drv, lambda o=off, w=w: self.g_consts[o:o + w].to(dtype)))
            off += w
        if scene.shape_sizes:
            balls = _balls(scene, plan, dtype)[0]
            if balls.requires_grad:
                out.append((balls, lambda o=off: self.g_consts[o:o + 4 * nb].to(dtype)))
        # where every coefficient is a number (the plan's constant table) none requires grad
        coef = coefficients(scene, plan, torch.arange(nb), list(range(nb)), 1, self.C) \
            if plan.coef_const is None or self._coef_sig != _coef_signature(scene, plan) else ()
        for c, name in zip(coef, ("g_mu", "g_e")):
            if c.requires_grad:
                out.append((c.reshape(-1), lambda name=name, d=c.dtype: torch.from_numpy(getattr(self, name)).to(d)))
        if self.fields:  # the robot's model tensors, derived from its learnable parameters with a graph
            mt, _ = scene.models[plan.name].model_tensors_flat(dtype)
            o = 0
            for i, size in zip(self.fields, self.field_sizes):
                if mt[i].requires_grad:
                    t = mt[i]
                    out.append((t, lambda o=o, size=size, t=t: self.g_red[o:o + size].view(t.shape).to(t.dtype)))
                o += size
        return out

    def refresh(self) -> None:
        """Read the scene's values into this stepper's buffers again, in place (the driver points at
        them): the robot's constants, the drives, the balls' sizes, friction and restitution, the joint
        limits and the solver's settings -- a stepper kept between steps (:func:`native_step`) sees a
        value the user changed or replaced since."""
        scene, plan, dtype, B = self.scene, self.plan, self.dtype, self.B
        m = scene.models[plan.name]
        with torch.no_grad():
            _, C = m.model_tensors_flat(dtype)
            if C is not self._C_source:
                self.C.copy_(C)
                self._C_source = C
            if plan.n_drives:
                drives = scene.drives[plan.name]
                sig = tuple((id(t), t._version) for t in drives)
                if sig != self._seen.get("drives"):  # a tensor replaced or changed in place
                    self.consts[0].copy_(torch.cat(drives).to(dtype).expand(B, -1))
                    self._seen["drives"] = sig
            if scene.shape_sizes:
                self.consts[-2].copy_(_balls(scene, plan, dtype).to(dtype).expand(B, -1))
            sig = _coef_signature(scene, plan)
            if plan.coef_const is None or sig != self._coef_sig:  # a tensor (may change in place), or replaced
                coef = coefficients(scene, plan, torch.arange(self.nb), list(range(self.nb)), 1, self.C)
                for j, c in enumerate(coef):
                    self.coef[j] = c.detach().to(dtype).reshape(-1).numpy()
                self._coef_sig = sig
            lim = m.joint_limits()
            lo, hi = lim["lower"], lim["upper"]
            sig = (id(lo), lo._version, id(hi), hi._version, scene.limits)
            if sig != self._seen.get("limits"):
                self.lo.copy_(lo), self.hi.copy_(hi)
                self.limits = (scene.limits and self.nl == m.nq - self.off and self.nl > 0
                               and bool(np.isfinite(self.lon).any() or np.isfinite(self.hin).any()))
                self._seen["limits"] = sig
        self.iterations, self.tol = scene.iterations, scene.tol
        self.baumgarte, self.bounce_speed = scene.baumgarte, scene.bounce_speed
        if self.driver is not None:
            g = self.ground
            g.limits, g.iterations = int(self.limits), int(self.iterations)
            g.tol, g.baumgarte, g.bounce_speed = float(self.tol), float(self.baumgarte), float(self.bounce_speed)


def ground_stepper(scene: Scene, q0: Tensor, dt: float, why: list | None = None) -> GroundStepper | None:
    """A :class:`GroundStepper` for a rollout of ``scene`` from ``q0 (B, nq)``, or ``None`` where the
    rollout keeps :func:`~diffmech.sim.contact_step`, with the reason appended to ``why``: a scene the
    native route does not serve (:func:`~diffmech.sim._ground_step.ground_plan`), a joint limit that
    requires grad, the contact problem's C kernels unavailable, or the reverse mode for the robot's
    learnable parameters not built. Call it with grad mode on (not inside an autograd function's
    forward): which of the robot's model tensors require grad decides the stage's reverse mode."""
    why = [] if why is None else why
    if not isinstance(scene, Scene):
        why.append("not a Scene")
        return None
    plan = ground_plan(scene, q0, MAX_STATES, why)
    if plan is None:
        return None
    m = scene.models[plan.name]
    lim = m.joint_limits()
    if lim["lower"].requires_grad or lim["upper"].requires_grad:
        why.append("joint limits require grad")
        return None
    if not update_native.available(q0) or not pgs_native.enabled() or pgs_native._library() is None:
        why.append("the contact kernels cannot be built (no C compiler)")
        return None
    with torch.enable_grad():
        mt, _ = m.model_tensors_flat(q0.dtype)
    wanted = [t.requires_grad for t in mt]
    fields = plan.call.fields_read(wanted) if any(wanted) else ()
    if fields:
        try:
            plan.call.kernel(q0.dtype, True, fields)
        except NativeUnavailable as err:
            why.append("learnable parameters: " + kernels.unavailable_reason(err))
            return None
    return GroundStepper(scene, plan, q0.shape[0], q0.dtype, dt, fields)


# ---------------------------------------------------------------------------- one step as one autograd node
class Impulses(dict):
    """A step's impulses as :func:`~diffmech.sim.contact_step` reports them (``{candidate key: (B, 3)}``),
    carrying the stepper's own form (:class:`Contacts`) so that the next step's warm start skips the
    conversion."""

    contacts: Contacts | None = None


def _keys(stepper: GroundStepper) -> list:
    """The candidate key of every slot: the balls' (as the torch step names them), then the joint limits'
    ``(model, +1.0, joint)`` (lower) and ``(model, -1.0, joint)`` (upper)."""
    got = stepper.__dict__.get("_slot_keys")
    if got is None:
        n = stepper.plan.name
        got = stepper._slot_keys = (list(stepper.plan.keys) + [(n, 1.0, j) for j in range(stepper.nl)]
                                    + [(n, -1.0, j) for j in range(stepper.nl)])
    return got


def _as_impulses(stepper: GroundStepper, c: Contacts) -> Impulses:
    keys = _keys(stepper)
    out = Impulses(zip([keys[s] for s in c.slots.tolist()], c.lam.unbind(1)))
    out.contacts = c
    return out


def _as_contacts(stepper: GroundStepper, warm) -> Contacts | None:
    """The stepper's warm start from a step's reported impulses (its own, or the torch step's keys)."""
    if not warm:
        return None
    c = getattr(warm, "contacts", None)
    if c is not None:
        return c
    index = stepper.__dict__.get("_slot_index")
    if index is None:
        index = stepper._slot_index = {k: s for s, k in enumerate(_keys(stepper))}
    pairs = [(index[k], x) for k, x in warm.items() if k in index]
    if not pairs:
        return None
    return Contacts(np.array([s for s, _ in pairs], dtype=np.int64),
                    torch.stack([x.detach().to(stepper.dtype).expand(stepper.B, 3) for _, x in pairs], 1).contiguous())


class _NativeStep(torch.autograd.Function):
    """One contact step by the stepper (one C call), its reverse another: the cotangents of ``q``, ``v``,
    ``tau`` and of the scene's tensors (:meth:`GroundStepper.tensors`), which autograd carries on to the
    parameters they came from."""

    @staticmethod
    def forward(ctx, stepper, info, warm, getters, q, v, tau, *tensors):
        q1, v1 = stepper.step(stepper.scene, q.detach(), v.detach(), tau.detach(), stepper.dt, info, warm)
        ctx.stepper, ctx.kept, ctx.getters = stepper, info["lam"], getters
        ctx.thread_work = threads.work_of(q, stepper.scene.nv)
        ctx.save_for_backward(q, v, tau)
        return q1, v1

    @staticmethod
    @once_differentiable
    @threads.decided_backward
    def backward(ctx, gq1, gv1):
        q, v, tau = ctx.saved_tensors
        stepper = ctx.stepper
        gq1 = torch.zeros_like(q) if gq1 is None else gq1
        gv1 = torch.zeros_like(v) if gv1 is None else gv1
        stepper.reset()
        gq, gv, gt, finite = stepper.vjp(q.detach(), v.detach(), tau.detach(), ctx.kept, gq1.contiguous(),
                                         gv1.contiguous())
        if not finite:
            from ..errors import SimulationError

            raise SimulationError("contact_step backward: non-finite gradient (of q, v or tau)")
        grads = [g() for g in ctx.getters]
        return (None, None, None, None, gq.to(q.dtype), gv.to(v.dtype), gt.to(tau.dtype), *grads)


_STEPPERS_KEPT = 8  # steppers per plan (batch size, dtype, dt, learnable fields): RL uses one or two


def native_step(scene: Scene, plan: GroundPlan, q: Tensor, v: Tensor, tau: Tensor, dt: float, info: dict,
                warm) -> tuple[Tensor, Tensor] | None:
    """:func:`~diffmech.sim.contact_step` of a scene :func:`ground_plan` serves, as one autograd node over
    the stepper's C calls (:class:`_NativeStep`); ``None`` where it cannot run (a joint limit that requires
    grad, the contact kernels or the learnable parameters' reverse mode not built): the caller's route
    then runs."""
    m = scene.models[plan.name]
    lim = m.joint_limits()
    if lim["lower"].requires_grad or lim["upper"].requires_grad:
        return None
    grad = torch.is_grad_enabled()
    fields: tuple[int, ...] = ()
    if grad:
        mt, _ = m.model_tensors_flat(q.dtype)
        wanted = [t.requires_grad for t in mt]
        fields = plan.call.fields_read(wanted) if any(wanted) else ()
    key = (q.shape[0], q.dtype, float(dt), fields)
    steppers = plan.__dict__.setdefault("steppers", {})
    stepper = steppers.get(key)
    if stepper is None:
        if not update_native.available(q) or not pgs_native.enabled() or pgs_native._library() is None:
            return None
        try:
            if fields:
                plan.call.kernel(q.dtype, True, fields)
            stepper = GroundStepper(scene, plan, q.shape[0], q.dtype, dt, fields)
        except NativeUnavailable:
            return None
        if len(steppers) >= _STEPPERS_KEPT:
            steppers.clear()
        steppers[key] = stepper
    else:
        stepper.refresh()
    w = _as_contacts(stepper, warm)
    pairs = stepper.tensors() if grad else []
    if grad and (q.requires_grad or v.requires_grad or tau.requires_grad or pairs):
        q1, v1 = _NativeStep.apply(stepper, info, w, [g for _, g in pairs], q, v, tau, *[t for t, _ in pairs])
    else:
        q1, v1 = stepper.step(scene, q.detach(), v.detach(), tau.detach(), dt, info, w)
    info["lam"] = _as_impulses(stepper, info["lam"])
    return q1, v1
