"""MuJoCo's inertia-box fluid model (``<option density viscosity wind>``) as generalized forces.

MuJoCo (``mj_inertiaBoxFluidModel``) replaces every body of positive mass by the uniform box of the
same mass and principal inertia (half-sizes from ``body_inertia / body_mass``) and applies, at its
centre of mass and in its principal-inertia frame, with the velocity ``(w, u)`` of the body relative
to the wind:

* viscous (Stokes) drag of the sphere of diameter ``d`` the box's mean side:
  torque ``-pi d^3 mu w``, force ``-3 pi d mu u`` (``mu`` the option's ``viscosity``, Pa s);
* quadratic drag of the box in a fluid of ``density`` ``rho`` (kg/m^3): force
  ``-rho/2 A_i |u_i| u_i`` with ``A_i`` the face normal to axis ``i``, torque
  ``-rho/64 s_i (s_j^4 + s_k^4) |w_i| w_i`` (``s`` the box's full side lengths).

:class:`InertiaBoxFluid` evaluates these for diffmech states of a scene from
:meth:`~diffmech.sim.Scene.from_mjcf` and maps them to generalized forces ``(B, nv)`` in diffmech's
``v`` coordinates (a floating base's linear row is along the body axes, where MuJoCo's ``qfrc_fluid``
has world axes; joints are the same numbers). Everything is differentiable in ``q`` and ``v``.
:func:`fluid_model` builds it from the compiled MuJoCo model, or returns ``None`` where the file has
no fluid.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from ..errors import ModelError
from .mj_bodies import MjBodies

__all__ = ["InertiaBoxFluid", "fluid_model"]

_MINVAL = 1e-15  # MuJoCo's mjMINVAL: bodies lighter than this feel no fluid


def fluid_model(m, scene, bodies: MjBodies | None = None) -> InertiaBoxFluid | None:
    """The fluid forces of a compiled ``mujoco.MjModel`` ``m`` on ``scene`` (from the same file), or
    ``None`` when ``m.opt.density`` and ``m.opt.viscosity`` are both zero (MuJoCo applies none then).

    Raises:
        ModelError: a geom asks for MuJoCo's ellipsoid fluid model (``fluidshape="ellipsoid"``),
            which this module does not have.
    """
    if not m.opt.density and not m.opt.viscosity:
        return None
    return InertiaBoxFluid(m, scene, bodies)


class InertiaBoxFluid:
    """The inertia-box fluid forces of a scene (see the module).

    Args:
        m: compiled ``mujoco.MjModel`` of the scene's file (its ``opt.density``, ``opt.viscosity``,
            ``opt.wind`` and body inertias are read once).
        scene: the :class:`~diffmech.sim.Scene` of ``Scene.from_mjcf`` of the same file.
        bodies: an :class:`~diffmech.sim.mj_bodies.MjBodies` of the pair, to share (built if omitted).
    """

    def __init__(self, m, scene, bodies: MjBodies | None = None):
        for g in range(m.ngeom):
            if m.geom_fluid[g, 0] > 0:
                import mujoco

                name = mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_GEOM, g) or f"geom{g}"
                raise ModelError(f"InertiaBoxFluid: geom {name!r} uses MuJoCo's ellipsoid fluid model "
                                 "(fluidshape='ellipsoid'); only the inertia-box model is implemented")
        self.bodies = bodies if bodies is not None else MjBodies(m, scene)
        self.scene = scene
        opts = dict(dtype=scene.dtype, device=scene.device)
        ids = [b for b in range(1, m.nbody) if m.body_mass[b] >= _MINVAL]
        self.ids = torch.tensor(ids, dtype=torch.long, device=scene.device)
        I = np.asarray(m.body_inertia)[ids]
        mass = np.asarray(m.body_mass)[ids]
        box = np.stack([np.sqrt(np.maximum(_MINVAL, I[:, 1] + I[:, 2] - I[:, 0]) / mass * 6.0),
                        np.sqrt(np.maximum(_MINVAL, I[:, 0] + I[:, 2] - I[:, 1]) / mass * 6.0),
                        np.sqrt(np.maximum(_MINVAL, I[:, 0] + I[:, 1] - I[:, 2]) / mass * 6.0)], -1)
        rho, mu = float(m.opt.density), float(m.opt.viscosity)
        diam = box.mean(-1)
        # per body and axis: force = -(lin_visc u + lin_quad |u| u), torque = -(ang_visc w + ang_quad |w| w)
        lin_visc = np.repeat((3.0 * math.pi * diam * mu)[:, None], 3, 1) if mu > 0 else np.zeros_like(box)
        ang_visc = np.repeat((math.pi * diam**3 * mu)[:, None], 3, 1) if mu > 0 else np.zeros_like(box)
        b4 = box**4
        lin_quad = 0.5 * rho * np.stack([box[:, 1] * box[:, 2], box[:, 0] * box[:, 2], box[:, 0] * box[:, 1]], -1)
        ang_quad = rho / 64.0 * np.stack([box[:, 0] * (b4[:, 1] + b4[:, 2]), box[:, 1] * (b4[:, 0] + b4[:, 2]),
                                          box[:, 2] * (b4[:, 0] + b4[:, 1])], -1)
        self.lin_visc, self.ang_visc = torch.tensor(lin_visc, **opts), torch.tensor(ang_visc, **opts)
        self.lin_quad, self.ang_quad = torch.tensor(lin_quad, **opts), torch.tensor(ang_quad, **opts)
        self.wind = torch.tensor(np.asarray(m.opt.wind, dtype=np.float64), **opts)

    def forces(self, q: Tensor, v: Tensor) -> Tensor:
        """Generalized fluid forces ``(B, nv)`` (N, N m) at diffmech states ``q (B, nq)``, ``v (B, nv)``."""
        mb = self.bodies
        xpos, xmat, S = mb.poses(q, jacobians=True)
        xipos, ximat = mb.xipos(xpos, xmat)
        i = self.ids
        c, R, S = xipos[:, i], ximat[:, i], S[:, i]  # (B, n, 3), (B, n, 3, 3), (B, n, 6, nv)
        tw = (S @ v[:, None, :, None])[..., 0]
        w_world = tw[..., 3:]
        u_world = tw[..., :3] + torch.linalg.cross(w_world, c, dim=-1) - self.wind
        Rt = R.transpose(-1, -2)
        w = (Rt @ w_world[..., None])[..., 0]
        u = (Rt @ u_world[..., None])[..., 0]
        torque = -(self.ang_visc * w + self.ang_quad * w.abs() * w)
        force = -(self.lin_visc * u + self.lin_quad * u.abs() * u)
        f = (R @ force[..., None])[..., 0]
        t = (R @ torque[..., None])[..., 0] + torch.linalg.cross(c, f, dim=-1)  # about the world origin
        return ((S[..., :3, :].transpose(-1, -2) @ f[..., None]) + (S[..., 3:, :].transpose(-1, -2) @ t[..., None])
                )[..., 0].sum(1)
