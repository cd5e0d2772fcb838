"""MuJoCo's per-body quantities (``xpos``, ``xipos``, ``subtree_com``, ``cinert``, ``cvel``,
``cfrc_ext``) of a scene from :meth:`diffmech.sim.Scene.from_mjcf`, from diffmech's kinematics.

The MJCF reader (:mod:`diffmech.model.mjcf`) turns each MuJoCo body into a link of the same name
whose frame may sit at a hinge's anchor instead of the body origin; :class:`MjBodies` measures that
fixed offset once (MuJoCo's ``mj_kinematics`` at ``qpos0`` against diffmech's forward kinematics) and
then gives, for diffmech states ``q (B, nq)``, ``v (B, nv)``, the quantities MuJoCo keeps in
``mjData``, in MuJoCo's body order (body 0 the world), world frame, SI units, differentiable.
Bodies welded to the world (the scene's ``static`` model) keep their pose at ``qpos0``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..dynamics.kinematics import poses_and_world_jacobians
from ..errors import ModelError
from ..model.mjcf import _name, mjcf_state_to_diffmech

__all__ = ["MjBodies", "normalize_free_quaternions"]


def normalize_free_quaternions(scene, q: Tensor) -> Tensor:
    """``q (B, nq)`` with every floating base's quaternion scaled to unit length (MuJoCo keeps an
    unnormalised ``qpos`` quaternion and normalises a copy for its kinematics)."""
    parts = []
    for n in scene.names:
        mdl, sq = scene.models[n], scene.slices[n]
        qm = q[..., sq]
        if mdl.floating_base:
            quat = qm[..., 3:7]
            qm = torch.cat([qm[..., :3], quat / quat.norm(dim=-1, keepdim=True), qm[..., 7:]], -1)
        parts.append(qm)
    return torch.cat(parts, -1)


class MjBodies:
    """Body kinematics of a scene in MuJoCo's terms.

    Args:
        m: the compiled ``mujoco.MjModel`` of the scene's file.
        scene: the :class:`~diffmech.sim.Scene` from ``Scene.from_mjcf`` of the same file.

    Raises:
        ModelError: a moving body of ``m`` has no link of its name in the scene.
    """

    def __init__(self, m, scene):
        import mujoco

        self.scene = scene
        self.nbody = int(m.nbody)
        opts = dict(dtype=scene.dtype, device=scene.device)
        d = mujoco.MjData(m)
        mujoco.mj_kinematics(m, d)
        mujoco.mj_comPos(m, d)
        q0, _ = mjcf_state_to_diffmech(scene, torch.as_tensor(m.qpos0))
        q0 = normalize_free_quaternions(scene, q0.to(torch.float64)[None].to(scene.device))
        self.groups = []  # (model name, body ids, link indices, offset rotation (L,3,3), offset translation (L,3))
        placed: set[int] = set()
        for n in scene.names:
            mdl = scene.models[n]
            if mdl.nq == 0:
                continue
            names = list(mdl.link_names)
            bodies, links = [], []
            for b in range(1, self.nbody):
                bname = _name(m, "body", b)
                if bname in names and b not in placed:
                    bodies.append(b)
                    links.append(names.index(bname))
            if not bodies:
                continue
            T = mdl.forward_kinematics(q0[:, scene.slices[n]].to(mdl.dtype))[0].detach().cpu().double().numpy()
            R_off, p_off = [], []
            for b, li in zip(bodies, links):
                Rl, pl = T[li, :3, :3], T[li, :3, 3]
                Rb = np.asarray(d.xmat[b]).reshape(3, 3)
                R_off.append(Rl.T @ Rb)
                p_off.append(Rl.T @ (np.asarray(d.xpos[b]) - pl))
            placed.update(bodies)
            self.groups.append((n, bodies, links, torch.tensor(np.array(R_off), **opts),
                                torch.tensor(np.array(p_off), **opts)))
        rootid = np.asarray(m.body_rootid)
        fixed = [b for b in range(self.nbody) if b not in placed]
        for b in fixed:
            if b and int(m.body_dofnum[b]) or (b and any(int(m.body_dofnum[c]) for c in range(1, b + 1)
                                                         if self._is_ancestor(m, c, b))):
                raise ModelError(f"MjBodies: body {_name(m, 'body', b)!r} moves "
                                 "but has no link of its name in the scene")
        self.fixed = fixed
        self.fixed_pos = torch.tensor(np.asarray(d.xpos)[fixed], **opts)
        self.fixed_mat = torch.tensor(np.asarray(d.xmat)[fixed].reshape(-1, 3, 3), **opts)
        self.mass = torch.tensor(np.asarray(m.body_mass), **opts)
        self.inertia = torch.tensor(np.asarray(m.body_inertia), **opts)
        self.ipos = torch.tensor(np.asarray(m.body_ipos), **opts)
        iq = np.asarray(m.body_iquat)
        self.irot = torch.tensor(np.array([_quat_mat(x) for x in iq]), **opts)
        self.rootid = torch.tensor(rootid, dtype=torch.long, device=scene.device)
        # subtree membership weighted by mass: subtree_com = W @ xipos / W.sum(-1)
        W = np.zeros((self.nbody, self.nbody))
        for c in range(self.nbody):
            b = c
            while True:
                W[b, c] = m.body_mass[c]
                if b == 0:
                    break
                b = int(m.body_parentid[b])
        self.subtree_w = torch.tensor(W, **opts)

    @staticmethod
    def _is_ancestor(m, a: int, b: int) -> bool:
        while b:
            if b == a:
                return True
            b = int(m.body_parentid[b])
        return False

    # ------------------------------------------------------------------ poses and velocities
    def poses(self, q: Tensor, jacobians: bool = False):
        """World poses of all bodies.

        Args:
            q: (B, nq) diffmech configuration (floating-base quaternions need not be unit).
            jacobians: also return ``S (B, nbody, 6, nv)``, each body's spatial velocity Jacobian at the
                world origin in world axes (rows: linear; angular), zero for fixed bodies.

        Returns:
            ``xpos (B, nbody, 3)`` (m), ``xmat (B, nbody, 3, 3)`` (body to world) and, with
            ``jacobians``, ``S``.
        """
        scene = self.scene
        q = normalize_free_quaternions(scene, q)
        B = q.shape[0]
        pos = [None] * self.nbody
        mat = [None] * self.nbody
        jac = [None] * self.nbody
        for k, b in enumerate(self.fixed):
            pos[b] = self.fixed_pos[k].expand(B, 3)
            mat[b] = self.fixed_mat[k].expand(B, 3, 3)
        for n, bodies, links, R_off, p_off in self.groups:
            mdl = scene.models[n]
            qm = q[:, scene.slices[n]]
            if jacobians:
                T, S = poses_and_world_jacobians(mdl, qm, links)
                T = T[:, links]
            else:
                T = mdl.forward_kinematics(qm)[:, links]
            R = T[..., :3, :3] @ R_off
            p = T[..., :3, 3] + (T[..., :3, :3] @ p_off[..., None])[..., 0]
            for i, b in enumerate(bodies):
                pos[b], mat[b] = p[:, i], R[:, i]
                if jacobians:
                    full = q.new_zeros(B, 6, scene.nv)
                    full[..., scene.vslices[n]] = S[:, i]
                    jac[b] = full
        xpos, xmat = torch.stack(pos, 1), torch.stack(mat, 1)
        if not jacobians:
            return xpos, xmat
        z = q.new_zeros(B, 6, scene.nv)
        return xpos, xmat, torch.stack([z if j is None else j for j in jac], 1)

    def xipos(self, xpos: Tensor, xmat: Tensor) -> tuple[Tensor, Tensor]:
        """Centres of mass ``(B, nbody, 3)`` and principal inertia frames ``(B, nbody, 3, 3)``."""
        return xpos + (xmat @ self.ipos[..., None])[..., 0], xmat @ self.irot

    def subtree_com(self, xipos: Tensor) -> Tensor:
        """``(B, nbody, 3)``: the centre of mass of each body's subtree (MuJoCo's ``subtree_com``;
        a massless subtree gets its body's ``xipos``, as MuJoCo)."""
        W = self.subtree_w
        tot = W.sum(-1)
        com = (W @ xipos) / tot.clamp_min(1e-300)[:, None]
        return torch.where((tot > 0)[:, None], com, xipos)

    def cinert(self, xipos: Tensor, ximat: Tensor, subtree_com: Tensor) -> Tensor:
        """MuJoCo's ``cinert (B, nbody, 10)``: each body's inertia about its tree's centre of mass
        (``subtree_com`` of its root body), world axes: ``I_xx, I_yy, I_zz, I_xy, I_xz, I_yz`` (kg m^2),
        ``mass * offset`` (kg m, 3), ``mass`` (kg)."""
        d = xipos - subtree_com[:, self.rootid]
        m = self.mass[:, None]
        I = ximat @ (self.inertia[..., None] * ximat.transpose(-1, -2))
        d2 = d.square()
        diag = torch.stack([I[..., 0, 0] + self.mass * (d2[..., 1] + d2[..., 2]),
                            I[..., 1, 1] + self.mass * (d2[..., 0] + d2[..., 2]),
                            I[..., 2, 2] + self.mass * (d2[..., 0] + d2[..., 1])], -1)
        off = torch.stack([I[..., 0, 1] - self.mass * d[..., 0] * d[..., 1],
                           I[..., 0, 2] - self.mass * d[..., 0] * d[..., 2],
                           I[..., 1, 2] - self.mass * d[..., 1] * d[..., 2]], -1)
        return torch.cat([diag, off, m * d, self.mass[:, None].expand_as(d[..., :1])], -1)

    def cvel(self, S: Tensor, v: Tensor, subtree_com: Tensor) -> Tensor:
        """MuJoCo's ``cvel (B, nbody, 6)``: each body's angular velocity and the linear velocity of its
        point at its tree's centre of mass, world axes (rad/s, m/s); ``S`` from :meth:`poses`."""
        tw = (S @ v[:, None, :, None])[..., 0]  # (B, nbody, 6): linear at the world origin; angular
        w = tw[..., 3:]
        c = subtree_com[:, self.rootid]
        return torch.cat([w, tw[..., :3] + torch.linalg.cross(w, c)], -1)

    def cfrc_ext(self, pos: Tensor, frame: Tensor, force: Tensor, body1: Tensor, body2: Tensor,
                 subtree_com: Tensor, active: Tensor | None = None) -> Tensor:
        """MuJoCo's ``cfrc_ext (B, nbody, 6)`` of contacts (``mj_rnePostConstraint``).

        Each contact's force on body 2 (minus on body 1) as a torque about the subtree centre of mass
        of that body's root, then the force (world axes, N m and N); the world body gets nothing.

        Args:
            pos: (B, K, 3) contact points; frame: (B, K, 3, 3) rows normal, tangent1, tangent2.
            force: (B, K, 6) contact-frame force (normal, tangents) and torque (torsional, rolling),
                the result of MuJoCo's ``mj_contactForce``.
            body1, body2: (K,) MuJoCo body ids of the contact's geoms.
            subtree_com: (B, nbody, 3) from :meth:`subtree_com`.
            active: (B, K) bool, contacts that exist (others add nothing).
        """
        Ft = frame.transpose(-1, -2)
        f = (Ft @ force[..., :3, None])[..., 0]
        t = (Ft @ force[..., 3:, None])[..., 0]
        if active is not None:
            f, t = f * active[..., None], t * active[..., None]
        out = pos.new_zeros(pos.shape[0], self.nbody, 6)
        for body, sign in ((body1, -1.0), (body2, 1.0)):
            c = subtree_com[:, self.rootid[body]]
            wrench = torch.cat([t + torch.linalg.cross(pos - c, f, dim=-1), f], -1)
            out = out.index_add(1, body, sign * wrench)
        out = torch.cat([torch.zeros_like(out[:, :1]), out[:, 1:]], 1)
        return out


def _quat_mat(wxyz) -> np.ndarray:
    w, x, y, z = (float(a) for a in wxyz)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                     [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                     [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])
