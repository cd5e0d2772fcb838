"""The one set of checks for every way parameter values enter a robot model.

A URDF or MJCF file, a builder of :mod:`diffmech.model.systems` (all three through
:class:`~diffmech.model.spec.RobotSpec` and :class:`~diffmech.model.parameters.RobotParameters`),
``load_state_dict`` and the initial value of :meth:`~diffmech.RobotModel.make_link_param_learnable`
are checked here, by the same rules, and a failure is a :class:`~diffmech.errors.ModelError` that
names the link or joint and the value. The rules (also in ``docs/conventions.md``, "Model
validity"):

1. Every number is finite and at most :data:`MAX_MAGNITUDE` in magnitude (position limits,
   velocity and effort limits may be infinite: no limit). Beyond it no robot is physical in SI
   units, and products of three such numbers (a mass times a squared distance) would leave float32.
2. Masses are ``>= 0``; rotational inertias are symmetric and positive semi-definite. The triangle
   inequalities of the principal moments are *not* required: published URDFs violate them (xarm6,
   mini_cheetah, fetch, allegro: 35 links of pybullet_data and diff_robot_data) and still simulate.
   Damping and friction are ``>= 0``; velocity and effort limits are ``>= 0``.
3. The model simulates: its mass matrix at the neutral configuration is positive definite. Every
   degree of freedom moves some mass or inertia (a massless leaf link on a revolute joint does
   not: refused; on a fixed joint it is welded and harmless), and no combination of degrees of
   freedom moves nothing (two coaxial joints joined by a massless link; a floating base whose
   total inertia is singular, as ``pybullet_data/random_urdfs/*`` with ``izz="0"``). In numbers:
   each diagonal entry of ``M`` exceeds :data:`MIN_RELATIVE_DIAGONAL` times the largest, and the
   smallest eigenvalue of ``D^-1/2 M D^-1/2`` (``D = diag(M)``) exceeds :data:`MIN_SCALED_EIGENVALUE`.

Values learned during training (parametrised or not) are not re-checked at every call beyond
finiteness (:meth:`RobotParameters.model_tensors` refuses non-finite ones): a parametrisation
from :mod:`diffmech.model.params` keeps them physical by construction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from ..errors import ModelError

__all__ = ["MAX_MAGNITUDE", "MIN_RELATIVE_DIAGONAL", "MIN_SCALED_EIGENVALUE", "check_number", "check_link_values",
           "check_joint_values", "check_spec_values", "check_mass_matrix", "check_spec_mass_matrix",
           "validate_parameters"]

MAX_MAGNITUDE = 1e9
MIN_RELATIVE_DIAGONAL = 1e-12
MIN_SCALED_EIGENVALUE = 1e-10


def _fmt(x) -> str:
    return repr(float(x)) if isinstance(x, (int, float)) else repr(x)


def check_number(where: str, what: str, value, *, nonnegative: bool = False, infinite: bool = False) -> None:
    """Raise :class:`ModelError` ``"{where}: {what} {value} ..."`` unless ``value`` is a number, not NaN,
    finite (unless ``infinite``), at most :data:`MAX_MAGNITUDE` in magnitude where finite, and ``>= 0``
    when ``nonnegative``."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ModelError(f"{where}: {what} is not a number: {value!r}") from None
    if math.isnan(x):
        raise ModelError(f"{where}: {what} is NaN")
    if math.isinf(x):
        if not infinite:
            raise ModelError(f"{where}: {what} is {x} (must be finite)")
    elif abs(x) > MAX_MAGNITUDE:
        raise ModelError(f"{where}: {what} {x!r} exceeds {MAX_MAGNITUDE:g} in magnitude (no physical robot in SI "
                         "units; the dynamics would overflow)")
    if nonnegative and x < 0:
        raise ModelError(f"{where}: {what} {x!r} is negative")


def _check_vector(where: str, what: str, values) -> None:
    for i, x in enumerate(values):
        check_number(where, f"{what}[{i}]", x)


def check_link_values(where: str, mass, com: Sequence, inertia: Sequence[Sequence]) -> None:
    """Rules 1 and 2 for one link's inertial: ``where`` names it (``"robot.urdf: link 'hand'"``)."""
    check_number(where, "mass", mass, nonnegative=True)
    _check_vector(where, "centre of mass", com)
    rows = [list(map(float, r)) for r in inertia]
    if len(rows) != 3 or any(len(r) != 3 for r in rows):
        raise ModelError(f"{where}: inertia must be 3x3, got {inertia!r}")
    names = ("xx", "xy", "xz"), ("yx", "yy", "yz"), ("zx", "zy", "zz")
    for i in range(3):
        for j in range(3):
            check_number(where, f"inertia i{names[i][j]}", rows[i][j])
    scale = max(1.0, max(abs(x) for r in rows for x in r))
    if any(abs(rows[i][j] - rows[j][i]) > 1e-12 * scale for i in range(3) for j in range(i)):
        raise ModelError(f"{where}: inertia is not symmetric: {rows}")
    eig = torch.linalg.eigvalsh(torch.tensor(rows, dtype=torch.float64))
    top = float(eig.abs().max())
    if float(eig[0]) < -1e-9 * max(top, 1e-300):
        raise ModelError(f"{where}: inertia is not positive semi-definite (principal moments "
                         f"{[float(f'{float(e):.6g}') for e in eig]}): {rows}")


def check_joint_values(where: str, **values) -> None:
    """Rule 1 (and 2 for ``damping``, ``friction``, ``velocity``, ``effort``) for one joint's numbers,
    given by name (``xyz=(...)``, ``damping=0.1``, ``lower=-inf``, ...). Position limits may be
    infinite (no limit), as may velocity and effort limits."""
    for what, v in values.items():
        if what in ("xyz", "rpy", "axis", "origin_xyz", "origin_rpy"):
            _check_vector(where, {"xyz": "origin xyz", "rpy": "origin rpy"}.get(what, what), v)
            continue
        nonneg = what in ("damping", "friction", "velocity", "effort")
        check_number(where, what.replace("_", " "), v, nonnegative=nonneg,
                     infinite=what in ("lower", "upper", "velocity", "effort"))


def check_spec_values(spec) -> None:
    """Rules 1 and 2 on every link and joint of a :class:`~diffmech.model.spec.RobotSpec`."""
    src = spec.source
    for link in spec.links:
        check_link_values(f"{src}: link '{link.name}'", link.mass, link.com, link.inertia)
    for j in spec.joints:
        where = f"{src}: joint '{j.name}'"
        check_joint_values(where, xyz=j.xyz, rpy=j.rpy, damping=j.damping, friction=j.friction,
                           stiffness=j.stiffness, rest=j.rest, velocity=j.velocity, effort=j.effort)
        if j.type in ("revolute", "continuous", "prismatic"):
            check_joint_values(where, axis=j.axis)
        if j.type != "fixed":
            check_joint_values(where, lower=j.lower, upper=j.upper)
        if j.mimic is not None:
            check_joint_values(where, mimic_multiplier=j.mimic[1], mimic_offset=j.mimic[2])
    for g, x in enumerate(spec.gravity):
        check_number(src, f"gravity[{g}]", x)


def _skew(p: torch.Tensor) -> torch.Tensor:
    z = torch.zeros_like(p[..., 0])
    x, y, w = p.unbind(-1)
    return torch.stack([torch.stack([z, -w, y], -1), torch.stack([w, z, -x], -1), torch.stack([-y, x, z], -1)], -2)


def _dof_names(tree) -> list[str]:
    names = [f"the floating base's {'linear' if i < 3 else 'angular'} velocity {'xyz'[i % 3]}"
             for i in range(6 * tree.nfree)]
    seen: dict[int, int] = {}
    for b, k in enumerate(tree.body_joint):
        j = tree.all_joint_names[k]
        if tree.body_kinds[b] == "ball":
            seen[k] = seen.get(k, -1) + 1
            names.append(f"joint '{j}' (ball, about {'xyz'[seen[k]]})")
        else:
            names.append(f"joint '{j}'")
    return names


def _ancestors(tree) -> torch.Tensor:
    """``anc[j, i]``: body ``i`` is body ``j`` or an ancestor of it (a parent comes before its children)."""
    anc = np.zeros((tree.nb, tree.nb), dtype=bool)
    for i, p in enumerate(tree.body_parent):
        if p >= 0:
            anc[i] = anc[p]
        anc[i, i] = True
    return torch.from_numpy(anc)


def neutral_mass_matrix(tree, mass, com, inertia, xyz, rpy) -> tuple[torch.Tensor, list[int]]:
    """The mass matrix at the neutral configuration, float64, in the generalised velocities, and the
    body that each joint-space degree of freedom moves.

    Args: ``mass (nl,)``, ``com (nl, 3)``, ``inertia (nl, 3, 3)`` in the order of ``tree.link_names``,
    ``xyz``, ``rpy (nJ, 3)`` in the order of ``tree.all_joint_names`` (joint ``k``'s child is link ``k + 1``).

    At the neutral configuration every link frame is its joints' placements composed, the root at
    the world origin; spatial vectors are ``(linear; angular)`` at the world origin.
    """
    from ..spatial import rpy_to_matrix

    f64 = dict(dtype=torch.float64)
    mass, com, inertia = (torch.as_tensor(x, **f64) for x in (mass, com, inertia))
    xyz, rpy = torch.as_tensor(xyz, **f64).reshape(-1, 3), torch.as_tensor(rpy, **f64).reshape(-1, 3)
    nl = len(tree.link_names)
    Rj = rpy_to_matrix(rpy)
    R = [torch.eye(3, **f64)] + [None] * (nl - 1)
    p = [torch.zeros(3, **f64)] + [None] * (nl - 1)
    for i in range(1, nl):  # depth-first order: a parent comes first
        pl = tree.link_parent[i]
        R[i] = R[pl] @ Rj[i - 1]
        p[i] = p[pl] + R[pl] @ xyz[i - 1]
    R, p = torch.stack(R), torch.stack(p)
    c = p + (R @ com[..., None])[..., 0]  # centres of mass in the world
    Ic = R @ (0.5 * (inertia + inertia.transpose(-1, -2))) @ R.transpose(-1, -2)
    cx = _skew(c)
    m = mass[:, None, None]
    I6 = torch.cat([torch.cat([m * torch.eye(3, **f64), -m * cx], -1),
                    torch.cat([m * cx, Ic - m * cx @ cx], -1)], -2)  # (nl, 6, 6) at the world origin
    nb = tree.nb
    C = torch.zeros(nb, 6, 6, **f64)
    for i in range(nl):
        if tree.link_body[i] >= 0:
            C[tree.link_body[i]] += I6[i]
    for b in range(nb - 1, -1, -1):  # composites: children come after their parent
        if tree.body_parent[b] >= 0:
            C[tree.body_parent[b]] += C[b]
    nfree = tree.nfree
    S, dof_body = [], []
    if nfree:
        S += list(torch.eye(6, **f64))
        dof_body += [0] * 6
    for b in range(nfree, nb):
        k = tree.body_joint[b - nfree]
        link = k + 1
        a = R[link] @ torch.tensor(tree.axes[b - nfree], **f64)
        if tree.body_kinds[b - nfree] == "prismatic":
            S.append(torch.cat([a, torch.zeros(3, **f64)]))
        else:
            S.append(torch.cat([torch.linalg.cross(p[link], a), a]))
        dof_body.append(b)
    S = torch.stack(S)  # (nv, 6)
    body = torch.tensor(dof_body)
    F = (C[body] @ S[..., None])[..., 0]
    Mf = S @ F.T  # (i, j): S_i . C_{body j} S_j, the entry where body(i) is body(j) or above it
    anc = _ancestors(tree)
    A = anc[body][:, body].T
    M = torch.where(A, Mf, torch.where(A.T, Mf.T, torch.zeros((), **f64)))
    coords = tree.coords
    if coords is not None:
        G = torch.zeros(M.shape[0], coords.nv, **f64)
        G[torch.arange(M.shape[0]), torch.tensor(coords.v_src)] = torch.tensor(coords.v_scale, **f64)
        M = G.T @ M @ G
    return M, dof_body


def check_mass_matrix(where: str, tree, mass, com, inertia, xyz, rpy) -> None:
    """Rule 3: raise :class:`ModelError` unless the neutral mass matrix is positive definite, naming
    the degree(s) of freedom and the links they carry with their masses."""
    if tree.nv == 0:  # a static model: no mass matrix, nothing that could fail to move
        return
    M, dof_body = neutral_mass_matrix(tree, mass, com, inertia, xyz, rpy)
    D = M.diagonal()
    names = _dof_names(tree) if tree.coords is None else (
        [f"the floating base's velocity {i}" for i in range(6 * tree.nfree)]
        + [f"joint '{n}'" for n in tree.coords.joint_names])
    if not bool(torch.isfinite(M).all()):
        raise ModelError(f"{where}: the mass matrix overflows (entries {float(M.abs().nan_to_num(math.inf).max()):g})")
    top = float(D.max()) if D.numel() else 0.0
    bad = (D <= MIN_RELATIVE_DIAGONAL * top) | (D <= 0)
    if bool(bad.any()):
        d = int(bad.nonzero()[0, 0])
        raise ModelError(f"{where}: {names[d]} moves no mass or inertia (mass matrix entry {float(D[d]):.3g}, "
                         f"largest {top:.3g}); {_carried(tree, dof_body, d, mass, inertia)}. Give the moving links "
                         "mass and inertia, or make the joint fixed")
    s = D.rsqrt()
    Ms = s[:, None] * M * s[None, :]
    shifted = Ms - MIN_SCALED_EIGENVALUE * torch.eye(Ms.shape[0], dtype=Ms.dtype)
    if int(torch.linalg.cholesky_ex(shifted).info) == 0:  # cheaper than eigh on long chains
        return
    eig, vec = torch.linalg.eigh(Ms)
    if float(eig[0]) <= MIN_SCALED_EIGENVALUE:
        v = vec[:, 0].abs()
        involved = [names[i] for i in v.argsort(descending=True)[:4].tolist() if float(v[i]) > 0.05]
        raise ModelError(f"{where}: the mass matrix is singular (smallest scaled eigenvalue {float(eig[0]):.3g}): "
                         f"a motion of {' and '.join(involved)} together moves no mass or inertia, as coaxial joints "
                         f"joined by a massless link do; {_carried(tree, dof_body, int(v.argmax()), mass, inertia)}")


def _carried(tree, dof_body, d, mass, inertia) -> str:
    """The links that degree of freedom ``d`` (joint space) moves, with their masses and inertias."""
    if tree.coords is not None:
        d = tree.coords.v_src.index(d) if d in tree.coords.v_src else d
    b = dof_body[min(d, len(dof_body) - 1)]
    anc = _ancestors(tree)
    links = [i for i in range(len(tree.link_names)) if tree.link_body[i] >= 0 and anc[tree.link_body[i], b]]
    m = torch.as_tensor(mass, dtype=torch.float64)
    inertia = torch.as_tensor(inertia, dtype=torch.float64)
    parts = []
    for i in links[:4]:
        diag = [float(f"{float(x):.3g}") for x in inertia[i].diagonal()]
        parts.append(f"'{tree.link_names[i]}' (mass {float(m[i]):.3g}, inertia diagonal {diag})")
    more = f" and {len(links) - 4} more" if len(links) > 4 else ""
    return "the links it moves: " + ", ".join(parts) + more


def check_spec_mass_matrix(spec, tree) -> None:
    """Rule 3 on a :class:`RobotSpec` whose :class:`KinematicTree` is ``tree`` (rules 1 and 2 are
    :func:`check_spec_values`, which the tree applies)."""
    by_link = {link.name: link for link in spec.links}
    by_joint = {j.name: j for j in spec.joints}
    links = [by_link[n] for n in tree.link_names]
    joints = [by_joint[n] for n in tree.all_joint_names]
    check_mass_matrix(spec.source, tree, [x.mass for x in links], [x.com for x in links], [x.inertia for x in links],
                      [j.xyz for j in joints] or torch.zeros(0, 3), [j.rpy for j in joints] or torch.zeros(0, 3))


def validate_parameters(robot, context: str, links: Sequence[int] | None = None,
                        override: tuple[str, int, torch.Tensor] | None = None) -> None:
    """Every rule on the current values of a :class:`RobotParameters` (after ``load_state_dict``, a
    new learnable value, ...); ``context`` says which (``"load_state_dict"``). ``links`` limits rules 1
    and 2 to those links and the joints above them; ``override = (kind, index, value)`` checks the
    model as if raw parameter ``kind`` (``"mass"``, ``"origin_xyz"``, ...) of link or joint ``index``
    were ``value``."""
    if robot._dm_gen.n != robot._layout_gen:  # what model_tensors does first: see values assigned since
        robot._relayout(adopt=False)
    with torch.no_grad():
        raw = robot.raw_parameters()
    raw = type(raw)(*[t.detach().to(device="cpu", dtype=torch.float64) for t in raw])
    if override is not None:
        kind, index, value = override
        t = getattr(raw, kind).clone()
        t[index] = value.detach().to(device="cpu", dtype=torch.float64)
        raw = raw._replace(**{kind: t})
    # the model uses the symmetric part (an unconstrained learned 3x3 drifts off symmetry)
    raw = raw._replace(inertia=0.5 * (raw.inertia + raw.inertia.transpose(-1, -2)))
    where = f"{robot.name} ({context})"
    idx = range(len(robot.link_names)) if links is None else links
    for i in idx:
        check_link_values(f"{where}: link '{robot.link_names[i]}'", float(raw.mass[i]), raw.com[i].tolist(),
                          raw.inertia[i].tolist())
        if i == 0:
            continue
        k = i - 1
        check_joint_values(f"{where}: joint '{robot.all_joint_names[k]}'", xyz=raw.origin_xyz[k].tolist(),
                           rpy=raw.origin_rpy[k].tolist(), damping=float(raw.damping[k]),
                           friction=float(raw.friction[k]), stiffness=float(raw.stiffness[k]),
                           rest=float(raw.rest[k]))
    for g, x in enumerate(raw.gravity.tolist()):
        check_number(where, f"gravity[{g}]", x)
    check_mass_matrix(where, robot.tree, raw.mass, raw.com, raw.inertia, raw.origin_xyz, raw.origin_rpy)
