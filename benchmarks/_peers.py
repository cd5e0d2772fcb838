"""Peer libraries for ``bench_dynamics.py``: Pinocchio, differentiable-robot-model, pytorch_kinematics.

Each peer is wrapped so that the benchmark gets zero-argument callables doing exactly one batched
evaluation, built from the same states diffmech sees. Every peer is optional: a missing package
turns its cells into "n/a" instead of stopping the run.

Conventions the wrappers hide:

* Pinocchio is float64 only; its single-state functions run in a Python loop over the batch, and
  its batch API (``rneaInParallel``/``abaInParallel``) takes ``(nq, B)`` column-major arrays. A
  continuous joint is ``(cos, sin)`` in Pinocchio's q and one angle in diffmech's.
* differentiable-robot-model builds every model tensor with an explicit ``dtype=torch.float32``
  and creates scratch tensors with the default dtype; :func:`drm_float64` makes both float64 for
  the duration of a ``with`` block (construction and every call), and restores them afterwards.
* pytorch_kinematics computes FK on the whole tree but Jacobians only for a serial chain, so on a
  branched robot (Allegro) its Jacobian covers the joints of one finger.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import warnings

import numpy as np
import torch

ROBOTS = {
    # name: (path inside diff_robot_data, end-effector link used for Jacobians)
    "iiwa": ("kuka_iiwa/urdf/iiwa7.urdf", "iiwa_link_ee"),
    "allegro": ("allegro/urdf/allegro_hand_description_left.urdf", "link_3.0_tip"),
}


def robot_path(name: str) -> tuple[str, str]:
    """Absolute URDF path and end-effector link of a benchmark robot."""
    import diff_robot_data

    rel, ee = ROBOTS[name]
    return os.path.join(diff_robot_data.__path__[0], rel), ee


def available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def versions() -> dict[str, str]:
    """Versions of the libraries in the comparison (``"missing"`` when not installed)."""
    out = {"torch": torch.__version__}
    for mod, dist in [("pinocchio", "pin"), ("differentiable_robot_model", "differentiable-robot-model"),
                      ("pytorch_kinematics", "pytorch-kinematics"), ("diffmech", "diffmech")]:
        try:
            from importlib.metadata import version

            out[mod] = version(dist)
        except Exception:
            out[mod] = "installed" if available(mod) else "missing"
    return out


# --------------------------------------------------------------------------- Pinocchio


class PinPeer:
    """Pinocchio model of a diffmech robot, with q/v maps from diffmech's joint order.

    Args:
        path: URDF file.
        robot: the diffmech model loaded from the same file (fixed base).
        ee: end-effector frame for the Jacobian.
        threads: threads for the batch API.
    """

    def __init__(self, path: str, robot, ee: str, threads: int = 2):
        import pinocchio as pin

        self.pin = pin
        self.model = pin.buildModelFromUrdf(path)
        self.data = self.model.createData()
        self.threads = threads
        self.fid = self.model.getFrameId(ee, pin.BODY)
        # Per diffmech joint: Pinocchio's q index, whether it is (cos, sin), and its v index.
        self._qi, self._cs, self._vi = [], [], []
        for name in robot.joint_names:
            j = self.model.joints[self.model.getJointId(name)]
            self._qi.append(j.idx_q)
            self._cs.append(j.nq == 2)
            self._vi.append(j.idx_v)
        self.parallel_api = {
            "rnea": getattr(pin, "rneaInParallel", None),
            "aba": getattr(pin, "abaInParallel", None),
        }
        self.pool = pin.ModelPool(self.model, threads) if any(self.parallel_api.values()) else None

    def to_pin(self, q: torch.Tensor, v: torch.Tensor, u: torch.Tensor):
        """diffmech ``(B, n)`` tensors -> Pinocchio ``(B, nq)``, ``(B, nv)``, ``(B, nv)`` float64 arrays."""
        qn, vn, un = (t.detach().double().cpu().numpy() for t in (q, v, u))
        B = qn.shape[0]
        qp = np.zeros((B, self.model.nq))
        vp, up = np.zeros((B, self.model.nv)), np.zeros((B, self.model.nv))
        for k, (qi, cs, vi) in enumerate(zip(self._qi, self._cs, self._vi)):
            if cs:
                qp[:, qi], qp[:, qi + 1] = np.cos(qn[:, k]), np.sin(qn[:, k])
            else:
                qp[:, qi] = qn[:, k]
            vp[:, vi], up[:, vi] = vn[:, k], un[:, k]
        return qp, vp, up

    def from_pin_v(self, x: np.ndarray) -> np.ndarray:
        """Pinocchio ``(..., nv)`` -> diffmech joint order."""
        return x[..., self._vi]

    def loop_fn(self, algo: str, qp: np.ndarray, vp: np.ndarray, up: np.ndarray):
        """A callable running ``algo`` on every row of the given arrays, one state at a time."""
        pin, model, data = self.pin, self.model, self.data
        rows = [(np.ascontiguousarray(qp[i]), np.ascontiguousarray(vp[i]), np.ascontiguousarray(up[i]))
                for i in range(qp.shape[0])]
        fid, frame = self.fid, pin.LOCAL_WORLD_ALIGNED

        if algo == "fk":
            def run():
                for q, _, _ in rows:
                    pin.forwardKinematics(model, data, q)
                    pin.updateFramePlacements(model, data)
        elif algo == "jac":
            def run():
                for q, _, _ in rows:
                    pin.computeFrameJacobian(model, data, q, fid, frame)
        elif algo == "rnea":
            def run():
                for q, v, a in rows:
                    pin.rnea(model, data, q, v, a)
        elif algo == "crba":
            def run():
                for q, _, _ in rows:
                    pin.crba(model, data, q)
        elif algo == "aba":
            def run():
                for q, v, t in rows:
                    pin.aba(model, data, q, v, t)
        elif algo == "grad":
            def run():
                for q, v, t in rows:
                    pin.computeABADerivatives(model, data, q, v, t)
        else:
            raise KeyError(algo)
        return run

    def parallel_fn(self, algo: str, qp: np.ndarray, vp: np.ndarray, up: np.ndarray):
        """A callable for Pinocchio's multi-threaded batch API, or ``None`` if it has none for ``algo``."""
        fn = self.parallel_api.get(algo)
        if fn is None:
            return None
        # (n, B) column-major: each state is one contiguous column, as Eigen expects.
        Q, V, U = (np.asfortranarray(x.T) for x in (qp, vp, up))
        out = np.asfortranarray(np.zeros((self.model.nv, qp.shape[0])))
        pool, threads = self.pool, self.threads

        def run():
            fn(threads, pool, Q, V, U, out)
        return run


# --------------------------------------------------------------------------- differentiable-robot-model


@contextlib.contextmanager
def drm_float64(enabled: bool = True, building: bool = False):
    """Make differentiable-robot-model compute in float64 inside the block.

    It writes ``dtype=torch.float32`` when it builds its parameters (redirected to float64 while
    ``building``) and uses the default dtype for scratch tensors at run time (set to float64).
    Both are restored on exit, so nothing leaks into diffmech's cells.
    """
    if not enabled:
        yield
        return
    old_tensor, old_default = torch.tensor, torch.get_default_dtype()

    def tensor64(*args, **kwargs):
        if kwargs.get("dtype") is torch.float32:
            kwargs["dtype"] = torch.float64
        return old_tensor(*args, **kwargs)

    if building:
        torch.tensor = tensor64
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.tensor = old_tensor
        torch.set_default_dtype(old_default)


class DrmPeer:
    """differentiable-robot-model in the requested dtype (float32 native, float64 via :func:`drm_float64`)."""

    def __init__(self, path: str, ee: str, dtype: torch.dtype):
        import logging

        from differentiable_robot_model import DifferentiableRobotModel

        self.f64 = dtype == torch.float64
        self.ee = ee
        logging.getLogger("urdf_parser_py").setLevel(logging.ERROR)
        with warnings.catch_warnings(), _quiet_stderr(), drm_float64(self.f64, building=True):
            warnings.simplefilter("ignore")
            self.model = DifferentiableRobotModel(path, device="cpu")

    def fn(self, algo: str, q: torch.Tensor, v: torch.Tensor, u: torch.Tensor):
        m, ee, f64 = self.model, self.ee, self.f64
        if algo == "fk":
            # Updates the pose of every body, like diffmech's all-links FK; returns one.
            def op():
                return m.compute_forward_kinematics(q, ee)
        elif algo == "jac":
            def op():
                return m.compute_endeffector_jacobian(q, ee)
        elif algo == "rnea":
            def op():
                return m.compute_inverse_dynamics(q, v, u, use_damping=False)
        elif algo == "crba":
            def op():
                return m.compute_lagrangian_inertia_matrix(q, use_damping=False)
        elif algo == "aba":
            def op():
                return m.compute_forward_dynamics(q, v, u, use_damping=False)
        elif algo == "grad":
            qg, vg, ug = (t.detach().clone().requires_grad_(True) for t in (q, v, u))

            def op():
                qg.grad = vg.grad = ug.grad = None
                m.compute_forward_dynamics(qg, vg, ug, use_damping=False).square().sum().backward()
        else:
            raise KeyError(algo)

        if algo == "grad":
            def run():
                with drm_float64(f64):
                    op()
        else:
            def run():
                with torch.no_grad(), drm_float64(f64):
                    op()
        return run

    def evaluate(self, algo: str, q, v, u):
        """Values for the agreement check (Jacobian as (B, 6, n) rows lin; ang)."""
        with torch.no_grad(), drm_float64(self.f64):
            m = self.model
            if algo == "rnea":
                return m.compute_inverse_dynamics(q, v, u, use_damping=False)
            if algo == "crba":
                return m.compute_lagrangian_inertia_matrix(q, use_damping=False)
            if algo == "aba":
                return m.compute_forward_dynamics(q, v, u, use_damping=False)
            if algo == "jac":
                lin, ang = m.compute_endeffector_jacobian(q, self.ee)
                return torch.cat([lin, ang], dim=-2)
            if algo == "fk":
                return m.compute_forward_kinematics(q, self.ee)[0]
        raise KeyError(algo)


@contextlib.contextmanager
def _quiet_stderr():
    """Silence the URDF parser's C-level 'Unknown tag' chatter while a model is built."""
    try:
        fd = os.dup(2)
    except OSError:
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(fd, 2)
        os.close(fd)
        os.close(devnull)


# --------------------------------------------------------------------------- pytorch_kinematics


class PkPeer:
    """pytorch_kinematics: whole-tree chain for FK, serial chain to ``ee`` for the Jacobian."""

    def __init__(self, path: str, ee: str, dtype: torch.dtype, joint_names: list[str]):
        import pytorch_kinematics as pk

        with open(path) as f:
            text = f.read()
        with warnings.catch_warnings(), _quiet_stderr():
            warnings.simplefilter("ignore")
            self.tree = pk.build_chain_from_urdf(text).to(dtype=dtype)
            self.serial = pk.build_serial_chain_from_urdf(text, ee).to(dtype=dtype)
        pos = {n: i for i, n in enumerate(joint_names)}
        self.tree_cols = [pos[n] for n in self.tree.get_joint_parameter_names()]
        self.serial_cols = [pos[n] for n in self.serial.get_joint_parameter_names()]

    def fn(self, algo: str, q: torch.Tensor):
        if algo == "fk":
            qt = q[:, self.tree_cols].contiguous()

            def run():
                with torch.no_grad():
                    self.tree.forward_kinematics(qt)
        elif algo == "jac":
            qs = q[:, self.serial_cols].contiguous()

            def run():
                with torch.no_grad():
                    self.serial.jacobian(qs)
        else:
            return None
        return run

    def jacobian_full(self, q: torch.Tensor, nv: int) -> torch.Tensor:
        """Serial-chain Jacobian scattered into diffmech's ``(B, 6, nv)`` columns."""
        with torch.no_grad():
            Js = self.serial.jacobian(q[:, self.serial_cols])
        J = Js.new_zeros(q.shape[0], 6, nv)
        J[..., self.serial_cols] = Js
        return J
