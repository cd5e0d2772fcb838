"""``DifferentiableRobotModel``: differentiable-robot-model's robot class on diffmech's core.

The class keeps differentiable-robot-model's (DRM 0.2.3) constructor, method names, argument names and
defaults, and its return conventions: joint vectors in DRM's joint order (the moving joints in the
URDF's order of their child links), world positions and ``(x, y, z, w)`` quaternions with DRM's (and
Bullet's) sign, Jacobians split into ``(J_lin, J_ang)``, ``(n, n)`` mass matrices, float32 by
default. Underneath is a :class:`diffmech.RobotModel` (``model.robot``): every call is one batched
diffmech algorithm (RNEA, CRBA, ABA, forward kinematics), not a loop over bodies.

It reads the URDF as DRM does where DRM's reading differs from diffmech's:

* a link without ``<inertial>`` gets mass 1 kg and inertia ``I`` (1 kg m^2) at its origin (DRM's
  and PyBullet's default; :func:`diffmech.load_urdf` makes it massless);
* a ``<mimic>`` joint is an independent degree of freedom;
* :meth:`DifferentiableRobotModel.get_joint_limits` gives 0 for a missing ``lower``/``upper`` (a
  continuous joint), as the URDF parser DRM uses.

Where DRM computes something other than the rigid-body dynamics of the URDF, the facade computes
the dynamics: prismatic joints slide (DRM turns them about their axis), joint axes need not be
coordinate axes, an ``<inertial>`` ``rpy`` rotates the inertia, and a learnable inertia matrix
enters through its symmetric part (DRM multiplies by the matrix as given). Inputs may have any
batch shape ``(..., n_dofs)``; DRM's ``(n_dofs,)`` and ``(B, n_dofs)`` give DRM's shapes.
Differences in behaviour: ``compute_forward_dynamics`` does not subtract the damping from the
caller's ``f`` in place, and ``compute_forward_dynamics_old`` works (DRM's calls the removed
``torch.solve``).
"""

from __future__ import annotations

import math
import os
import warnings

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from ... import dynamics
from ...errors import ModelError
from ...model.urdf import _parse_urdf
from ...robot import RobotModel

__all__ = [
    "DifferentiableRobotModel",
    "DifferentiableKUKAiiwa",
    "DifferentiableFrankaPanda",
    "DifferentiableTwoLinkRobot",
    "DifferentiableTrifingerEdu",
    "DifferentiableAllegroHand",
    "DifferentiableFetchArm",
    "DifferentiableKinovaJaco",
    "robot_description_folder",
]

# DRM's parameter names (those its make_link_param_learnable accepts).
DRM_PARAMETERS = ("trans", "rot_angles", "joint_damping", "mass", "inertia_mat", "com")


class ParameterNameError(ModelError, AttributeError):
    """An unknown link parameter name (an ``AttributeError`` too, as DRM raises)."""


def robot_description_folder() -> str:
    """The folder of DRM's robot descriptions (the ``diff_robot_data`` package)."""
    try:
        import diff_robot_data
    except ImportError:
        raise ModelError("the ready-made robots read their URDFs from the 'diff_robot_data' package of "
                         "differentiable-robot-model: pip install differentiable-robot-model") from None
    return list(diff_robot_data.__path__)[0]


def _drm_quaternion(R: Tensor) -> Tensor:
    """Rotation ``(..., 3, 3)`` -> unit quaternion ``(..., 4)`` as ``(x, y, z, w)`` with DRM's sign.

    The pivot of the classic conversion (Shoemake's): ``w`` when ``trace(R) > 0``, else the axis of
    the largest diagonal entry (ties to the lower index), and that component is positive -- the sign
    DRM and PyBullet return. Every branch is evaluated on clamped arguments, so gradients are finite.
    """
    r = [[R[..., i, j] for j in range(3)] for i in range(3)]
    tr = r[0][0] + r[1][1] + r[2][2]
    tiny = torch.finfo(R.dtype).tiny
    t = (tr + 1).clamp_min(tiny)
    q_w = torch.stack([r[2][1] - r[1][2], r[0][2] - r[2][0], r[1][0] - r[0][1], t], -1) * (0.5 / t.sqrt())[..., None]
    pivots = []
    for i, j, k in ((0, 1, 2), (1, 2, 0), (2, 0, 1)):
        ti = (r[i][i] - r[j][j] - r[k][k] + 1).clamp_min(tiny)
        comp = [None] * 4
        comp[i], comp[j], comp[k], comp[3] = ti, r[i][j] + r[j][i], r[k][i] + r[i][k], r[k][j] - r[j][k]
        pivots.append(torch.stack(comp, -1) * (0.5 / ti.sqrt())[..., None])
    first = r[1][1] > r[0][0]
    third = r[2][2] > torch.where(first, r[1][1], r[0][0])
    q_axis = torch.where(third[..., None], pivots[2], torch.where(first[..., None], pivots[1], pivots[0]))
    return torch.where((tr > 0)[..., None], q_w, q_axis)


def _urdf_limits(urdf_path) -> dict[str, dict]:
    """``{joint: {"effort", "lower", "upper", "velocity"}}`` as written in the URDF's ``<limit>``
    elements, whatever the joint's type (a continuous joint's too), ``lower``/``upper`` 0 where absent
    -- what DRM's URDF parser returns."""
    from lxml import etree

    parser = etree.XMLParser(recover=True, remove_comments=True)
    text = str(urdf_path)
    root = etree.fromstring(text.encode(), parser) if text.lstrip().startswith("<") else \
        etree.parse(text, parser).getroot()
    out = {}
    for joint in root.findall("joint"):
        lim = joint.find("limit")
        if lim is None:
            continue

        def num(key: str, default: float, lim=lim) -> float:
            v = lim.get(key)
            try:
                return float(v) if v is not None else default
            except ValueError:
                return default

        out[joint.get("name")] = {"effort": num("effort", math.inf), "lower": num("lower", 0.0),
                                  "upper": num("upper", 0.0), "velocity": num("velocity", math.inf)}
    return out


class _GravityView:
    """``robot`` as the algorithm functions see it, with gravity replaced by ``gravity`` (3,).

    Everything but the derived model tensors is the robot's own, so learnable parameters keep their
    gradients; the replaced bundle is reused while the robot's is (cached values stay cached)."""

    def __init__(self, robot: RobotModel, gravity):
        self._robot = robot
        self._gravity = tuple(float(g) for g in gravity)
        self._last: tuple = (None, None)

    def __getattr__(self, name):
        if name == "_robot" or name.startswith("__"):  # not yet set (copying, unpickling)
            raise AttributeError(name)
        return getattr(self._robot, name)

    def model_tensors(self, dtype=None, device=None):
        mt = self._robot.model_tensors(dtype, device)
        if self._last[0] is mt:
            return self._last[1]
        out = mt._replace(gravity=mt.gravity.new_tensor(self._gravity))
        if not any(t.requires_grad for t in mt):  # a bundle with a graph is made anew at every call
            self._last = (mt, out)
        return out

    def __getstate__(self):
        return {"_robot": self._robot, "_gravity": self._gravity, "_last": (None, None)}

    def model_tensors_flat(self, dtype):
        mt = self.model_tensors(dtype, torch.device("cpu"))
        return mt, torch.cat([t.detach().reshape(-1) for t in mt])


class _Inertia:
    """DRM's ``body.inertia``: ``mass() (1,)``, ``com() (1, 3)``, ``inertia_mat() (1, 3, 3)``."""

    def __init__(self, link):
        self._link = link

    def mass(self) -> Tensor:
        return self._link.inertial()[0].reshape(1)

    def com(self) -> Tensor:
        return self._link.inertial()[1].reshape(1, 3)

    def inertia_mat(self) -> Tensor:
        return self._link.inertial()[2].reshape(1, 3, 3)


class _Body:
    """What DRM code reads from ``model._bodies[i]``: the link ``i`` (URDF order) and its parent joint.

    ``name``, ``joint_id`` (= ``i``), ``joint_idx`` (its index in ``q``, or ``None``), ``joint_axis``
    ``(1, 3)``, ``joint_limits``; ``get_joint_limits()``, ``get_joint_damping_const() (1,)``,
    ``trans() (1, 3)``, ``rot_angles() (1, 3)`` and ``inertia`` read the current (possibly learned)
    values.
    """

    def __init__(self, model: DifferentiableRobotModel, i: int, name: str, joint: str | None, dof: int | None,
                 axis, limits):
        self._model = model
        self.name, self.joint_id, self.joint_idx = name, i, dof
        self._joint = joint
        self._axis = tuple(float(a) for a in axis)
        self.joint_limits = limits
        self.inertia = _Inertia(model.robot.link_params(name))

    def _joint_value(self, name: str, shape: tuple) -> Tensor:
        robot = self._model.robot
        if self._joint is None:
            return torch.zeros(shape, dtype=robot.dtype, device=robot.device)
        return getattr(robot.joint_params(self._joint), name).reshape(shape)

    @property
    def joint_axis(self) -> Tensor:
        """(1, 3), in the model's current dtype and on its current device (follows ``.to()``)."""
        robot = self._model.robot
        return torch.tensor([self._axis], dtype=robot.dtype, device=robot.device)

    def get_joint_limits(self):
        return self.joint_limits

    def get_joint_damping_const(self) -> Tensor:
        return self._joint_value("damping", (1,))

    def trans(self) -> Tensor:
        return self._joint_value("origin_xyz", (1, 3))

    def rot_angles(self) -> Tensor:
        return self._joint_value("origin_rpy", (1, 3))

    def __repr__(self) -> str:
        return f"_Body({self.name!r}, joint_idx={self.joint_idx})"


class DifferentiableRobotModel(nn.Module):
    """A robot from a URDF with differentiable-robot-model's API (see the module docstring).

    Args:
        urdf_path: URDF file.
        name: a name for the model.
        device: where the parameters live and the inputs must be (default CPU).
        dtype: the parameters' dtype (not in DRM; default ``torch.get_default_dtype()``, float32).

    Attributes:
        robot: the underlying :class:`diffmech.RobotModel` (its own joint order, ``robot.joint_names``);
            all of diffmech's methods are there.
        name: the name given.
        solve_dtype: forward dynamics of less precise inputs is computed in this dtype (default
            float64) and returned in theirs: a hand's mass matrix (condition number 1e6-1e7 for the
            Jaco's fingers) loses every digit of float32 in the solve. ``None``: the inputs' dtype.
    """

    solve_dtype: torch.dtype | None = torch.float64

    def __init__(self, urdf_path: str, name: str = "", device=None, *, dtype: torch.dtype | None = None):
        super().__init__()
        self.name = name
        dtype = torch.get_default_dtype() if dtype is None else dtype
        device = torch.device(device) if device is not None else torch.device("cpu")
        spec = _parse_urdf(urdf_path, stacklevel=3)
        eye = ((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0))
        for link in spec.links:
            if not link.has_inertial:  # DRM's (and PyBullet's) default, not a massless link
                link.mass, link.com, link.inertia, link.has_inertial = 1.0, (0.0, 0.0, 0.0), eye, True
                warnings.warn(f"{spec.source}: link '{link.name}' has no <inertial>: mass 1 kg and inertia 1 kg m^2 "
                              "at its origin (differentiable-robot-model's and PyBullet's default)", stacklevel=2)
        for joint in spec.joints:
            joint.mimic = None
        self.robot = RobotModel(spec, dtype=dtype, device=device)

        # DRM's order: links as in the file; a degree of freedom per moving joint, by child link.
        parent_joint = {j.child: j for j in spec.joints}
        self._link_order = [link.name for link in spec.links]
        self._name_to_idx_map = {n: i for i, n in enumerate(self._link_order)}
        self._controlled_joints: list[int] = []
        self._bodies: list[_Body] = []
        raw_limits = _urdf_limits(urdf_path)
        dof_joints = []
        for i, lname in enumerate(self._link_order):
            j = parent_joint.get(lname)
            moving = j is not None and j.type != "fixed"
            dof = None
            limits = None
            if moving:
                dof = len(dof_joints)
                dof_joints.append(j.name)
                self._controlled_joints.append(i)
                limits = raw_limits.get(j.name) or {"effort": j.effort, "lower": 0.0, "upper": 0.0,
                                                    "velocity": j.velocity}
            axis = tuple(j.axis) if moving else (0.0, 0.0, 0.0)
            self._bodies.append(_Body(self, i, lname, j.name if j is not None else None, dof, axis, limits))
        self._n_dofs = len(dof_joints)
        native = self.robot.joint_names
        perm = [native.index(n) for n in dof_joints]  # DRM dof i is the robot's joint perm[i]
        identity = perm == list(range(len(perm)))
        self._to_native = None if identity else torch.tensor([perm.index(k) for k in range(len(perm))])
        self._from_native = None if identity else torch.tensor(perm)
        self._fk_order = self._preorder(spec)
        self._state: tuple[Tensor, Tensor] | None = None
        self._no_gravity = _GravityView(self.robot, (0.0, 0.0, 0.0))

    def _preorder(self, spec) -> list[str]:
        """Links in DRM's all-links dictionary order: depth first from the root, children in file order."""
        children: dict[str, list[str]] = {}
        for j in sorted(spec.joints, key=lambda j: self._name_to_idx_map[j.child]):
            children.setdefault(j.parent, []).append(j.child)
        out, stack = [], [self.robot.link_names[0]]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(reversed(children.get(n, [])))
        return out

    # ------------------------------------------------------------------ joint order
    @property
    def _device(self) -> torch.device:
        return self.robot.device

    def _in(self, x: Tensor) -> Tensor:
        if self._to_native is None:
            return x
        return x[..., self._to_native.to(x.device)]

    def _out(self, x: Tensor, dims: int = 1) -> Tensor:
        if self._from_native is None:
            return x
        idx = self._from_native.to(x.device)
        x = x[..., idx]
        return x[..., idx, :] if dims == 2 else x

    def _model(self, include_gravity: bool):
        return self.robot if include_gravity else self._no_gravity

    # ------------------------------------------------------------------ kinematics
    def update_kinematic_state(self, q: Tensor, qd: Tensor) -> None:
        """Keep ``q, qd (..., n_dofs)`` as the state :meth:`iterative_newton_euler` uses."""
        self._state = (q, qd)

    def compute_forward_kinematics(self, q: Tensor, link_name: str, recursive: bool = False
                                   ) -> tuple[Tensor, Tensor]:
        """World position ``(..., 3)`` (m) and orientation ``(..., 4)`` (``x, y, z, w``) of ``link_name``.
        ``recursive`` (DRM's choice of algorithm) gives the same values."""
        p, R = self.robot.link_pose(self._in(q), link_name, form="pos_rot")
        return p, _drm_quaternion(R)

    def compute_forward_kinematics_all_links(self, q: Tensor) -> dict[str, tuple[Tensor, Tensor]]:
        """``{link: (position (B, 3), quaternion (B, 4))}`` for every link (DRM's order; a
        ``(n_dofs,)`` input gives ``B = 1``, as DRM)."""
        if q.dim() == 1:
            q = q[None]
        p, R = self.robot.forward_kinematics(self._in(q), form="pos_rot")
        quat = _drm_quaternion(R)
        index = {n: i for i, n in enumerate(self.robot.link_names)}
        return {n: (p[..., index[n], :], quat[..., index[n], :]) for n in self._fk_order}

    def compute_endeffector_jacobian(self, q: Tensor, link_name: str) -> tuple[Tensor, Tensor]:
        """Linear and angular Jacobians ``(..., 3, n_dofs)`` of ``link_name``'s origin, world axes."""
        J = self._out(self.robot.jacobian(self._in(q), link_name))
        return J[..., :3, :], J[..., 3:, :]

    # ------------------------------------------------------------------ dynamics
    def iterative_newton_euler(self, base_acc, qdd: Tensor | None = None) -> Tensor:
        """Joint forces of the state set by :meth:`update_kinematic_state`, accelerations ``qdd``
        (default zero), with the base accelerating by ``base_acc`` instead of gravity and without
        damping (DRM's recursion, which leaves them in its bodies; here they are returned).

        Args:
            base_acc: the base's spatial acceleration: an object with ``lin``/``ang`` (DRM's
                ``SpatialMotionVec``) or a tensor ``(6,)`` / ``(B, 6)`` (linear; angular). Gravity is
                ``(0, 0, 9.81)`` linear. The angular part must be zero and every row the same.
        """
        if self._state is None:
            raise ModelError(f"{self.name or self.robot.name}: call update_kinematic_state(q, qd) first")
        if hasattr(base_acc, "lin") and hasattr(base_acc, "ang"):
            lin, ang = torch.as_tensor(base_acc.lin), torch.as_tensor(base_acc.ang)
        else:
            acc = torch.as_tensor(base_acc)
            lin, ang = acc[..., :3], acc[..., 3:]
        lin, ang = lin.detach().reshape(-1, 3), ang.detach().reshape(-1, 3)
        if bool((ang != 0).any()) or bool((lin != lin[:1]).any()):
            raise ModelError("iterative_newton_euler: only a base acceleration that is linear and the same for "
                             f"every state is supported, got linear {lin.tolist()}, angular {ang.tolist()}")
        q, qd = self._state
        qdd = torch.zeros_like(qd) if qdd is None else qdd
        view = _GravityView(self.robot, (-lin[0]).tolist())
        return self._out(dynamics.rnea(view, self._in(q), self._in(qd), self._in(qdd), passive=False))

    def compute_inverse_dynamics(self, q: Tensor, qd: Tensor, qdd_des: Tensor, include_gravity: bool = True,
                                 use_damping: bool = True) -> Tensor:
        """Joint torques ``(..., n_dofs)`` that give accelerations ``qdd_des`` (RNEA).

        Args:
            include_gravity: ``False`` for a gravity-compensated robot.
            use_damping: add the joint damping torques ``d qd``.
        """
        model = self._model(include_gravity)
        tau = dynamics.rnea(model, self._in(q), self._in(qd), self._in(qdd_des), passive=use_damping)
        return self._out(tau)

    def compute_non_linear_effects(self, q: Tensor, qd: Tensor, include_gravity: bool = True,
                                   use_damping: bool = True) -> Tensor:
        """Coriolis, centrifugal, gravity (and damping) torques ``(..., n_dofs)``."""
        h = dynamics.bias_forces(self._model(include_gravity), self._in(q), self._in(qd), passive=use_damping)
        return self._out(h)

    def compute_lagrangian_inertia_matrix(self, q: Tensor, include_gravity: bool = True,
                                          use_damping: bool = True) -> Tensor:
        """Mass matrix ``(..., n_dofs, n_dofs)`` (CRBA); the flags, DRM's, do not change it."""
        return self._out(self.robot.mass_matrix(self._in(q)), dims=2)

    def compute_forward_dynamics(self, q: Tensor, qd: Tensor, f: Tensor, include_gravity: bool = True,
                                 use_damping: bool = False) -> Tensor:
        """Joint accelerations ``(..., n_dofs)`` under torques ``f`` (ABA, or CRBA and a solve for small
        batches); ``use_damping`` subtracts ``d qd`` from ``f`` (without changing ``f``). Computed in
        :attr:`solve_dtype` (float64) and returned in the inputs' dtype."""
        q, qd, f, back = self._solve_inputs(q, qd, f)
        qdd = dynamics.forward_dynamics(self._model(include_gravity), self._in(q), self._in(qd), self._in(f),
                                        passive=use_damping)
        return self._out(qdd).to(back)

    def compute_forward_dynamics_old(self, q: Tensor, qd: Tensor, f: Tensor, include_gravity: bool = True,
                                     use_damping: bool = True) -> Tensor:
        """``qdd = M^-1 (f - h)`` by the mass matrix and a solve (DRM's earlier method), in
        :attr:`solve_dtype`."""
        q, qd, f, back = self._solve_inputs(q, qd, f)
        M = self.compute_lagrangian_inertia_matrix(q)
        h = self.compute_non_linear_effects(q, qd, include_gravity, use_damping)
        return torch.linalg.solve(M, (f - h)[..., None])[..., 0].to(back)

    def _solve_inputs(self, q: Tensor, qd: Tensor, f: Tensor):
        """The inputs in :attr:`solve_dtype` where that is more precise than theirs, and their dtype."""
        dt, back = self.solve_dtype, q.dtype
        if dt is None or not back.is_floating_point or torch.finfo(back).bits >= torch.finfo(dt).bits:
            return q, qd, f, back
        return q.to(dt), qd.to(dt), f.to(dt), back

    # ------------------------------------------------------------------ learnable parameters
    def _owner(self, link_name: str, parameter_name: str):
        if link_name not in self._name_to_idx_map:
            raise ModelError(f"{self.name or self.robot.name}: no link '{link_name}'; links: {self._link_order}")
        try:
            return self.robot.param_owner(link_name, parameter_name)
        except ModelError as e:
            raise ParameterNameError(f"{e}; DRM's names: {DRM_PARAMETERS}") from None

    def make_link_param_learnable(self, link_name: str, parameter_name: str,
                                  parametrization: nn.Module | None = None) -> None:
        """Make parameter ``parameter_name`` of ``link_name`` learnable through ``parametrization``.

        Args:
            link_name: a link.
            parameter_name: DRM's ``mass``, ``com``, ``inertia_mat`` (of the link), ``trans``,
                ``rot_angles``, ``joint_damping`` (of the joint above it), or diffmech's names.
            parametrization: a module whose ``forward()`` returns the value (the classes of
                :mod:`diffmech.compat.drm.rigid_body_params` or DRM's own; the value starts where the
                module starts), a diffmech parametrization ``forward(raw)`` (starts at the current
                value), or ``None`` (the value itself becomes an ``nn.Parameter``).
        """
        self._owner(link_name, parameter_name)
        if parametrization is not None:
            parametrization = parametrization.to(self._device)
        self.robot.make_link_param_learnable(link_name, parameter_name, parametrization)

    def _check_learnable(self, link_name: str, parameter_name: str) -> None:
        module, name = self._owner(link_name, parameter_name)
        source = getattr(module, "inertial_source", None) if name in ("mass", "com", "inertia") else None
        if source is None and not parametrize.is_parametrized(module, name) and name not in module._parameters:
            raise ModelError(f"{parameter_name} of {link_name} is not a learnable parameter; "
                             "call make_link_param_learnable first")

    def freeze_learnable_link_param(self, link_name: str, parameter_name: str) -> None:
        """Stop training a learnable parameter (its tensors no longer require gradients)."""
        self._check_learnable(link_name, parameter_name)
        self.robot.freeze_link_param(link_name, parameter_name)

    def unfreeze_learnable_link_param(self, link_name: str, parameter_name: str) -> None:
        """Train a frozen learnable parameter again."""
        self._check_learnable(link_name, parameter_name)
        self.robot.unfreeze_link_param(link_name, parameter_name)

    # ------------------------------------------------------------------ information
    def get_joint_limits(self) -> list[dict]:
        """Per degree of freedom, ``{"effort", "lower", "upper", "velocity"}`` from the URDF (floats)."""
        return [self._bodies[i].get_joint_limits() for i in self._controlled_joints]

    def get_link_names(self) -> list[str]:
        """All links, in the URDF's order."""
        return list(self._link_order)

    def print_link_names(self) -> None:
        """Print the names of all links, one per line."""
        for n in self._link_order:
            print(n)

    def print_learnable_params(self) -> None:
        """Print the name (``link.parameter...``, see ``RobotModel.learnable_parameters``) and value of
        every parameter of the model."""
        for name, param in self.robot.named_parameters():
            print(f"{self.robot._readable_name(name)}: {param}")


# ---------------------------------------------------------------------------- ready-made robots
class _ReadyMade(DifferentiableRobotModel):
    """A robot of DRM's ``diff_robot_data`` package: ``Cls(device=None)``."""

    rel_urdf_path = ""
    default_name = ""

    def __init__(self, device=None, *, dtype: torch.dtype | None = None):
        urdf_path = os.path.join(robot_description_folder(), self.rel_urdf_path)
        super().__init__(urdf_path, self.default_name, device=device, dtype=dtype)
        self.urdf_path = urdf_path
        self.learnable_rigid_body_config = None


class DifferentiableKUKAiiwa(_ReadyMade):
    """KUKA LBR iiwa 7, 7 DoF (``kuka_iiwa/urdf/iiwa7.urdf``)."""

    rel_urdf_path, default_name = "kuka_iiwa/urdf/iiwa7.urdf", "differentiable_kuka_iiwa"


class DifferentiableFrankaPanda(_ReadyMade):
    """Franka Emika Panda without gripper, 7 DoF (``panda_description/urdf/panda_no_gripper.urdf``)."""

    rel_urdf_path, default_name = "panda_description/urdf/panda_no_gripper.urdf", "differentiable_franka_panda"


class DifferentiableTwoLinkRobot(_ReadyMade):
    """A planar two-link arm, 2 DoF (``2link_robot.urdf``)."""

    rel_urdf_path, default_name = "2link_robot.urdf", "diff_2d_robot"


class DifferentiableTrifingerEdu(_ReadyMade):
    """TriFinger Edu, three fingers, 9 DoF (``trifinger_edu_description/trifinger_edu.urdf``)."""

    rel_urdf_path, default_name = "trifinger_edu_description/trifinger_edu.urdf", "trifinger_edu"


class DifferentiableAllegroHand(_ReadyMade):
    """Allegro hand (left), 16 DoF (``allegro/urdf/allegro_hand_description_left.urdf``; not in DRM)."""

    rel_urdf_path, default_name = "allegro/urdf/allegro_hand_description_left.urdf", "differentiable_allegro_hand"


class DifferentiableFetchArm(_ReadyMade):
    """Fetch's arm without gripper, 7 DoF (``fetch_description/urdf/fetch_arm_no_gripper.urdf``; not in DRM)."""

    rel_urdf_path, default_name = "fetch_description/urdf/fetch_arm_no_gripper.urdf", "differentiable_fetch_arm"


class DifferentiableKinovaJaco(_ReadyMade):
    """Kinova Jaco j2n6s300 with three two-joint fingers, 12 DoF (``kinova_description/urdf/jaco_clean.urdf``;
    not in DRM)."""

    rel_urdf_path, default_name = "kinova_description/urdf/jaco_clean.urdf", "differentiable_kinova_jaco"
