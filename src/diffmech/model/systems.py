"""Builders for small textbook mechanisms, returned as :class:`~diffmech.RobotModel` s.

All systems here are planar: they move in the world ``x``-``z`` plane, every revolute joint turns
about the world ``+y`` axis, and gravity points along ``-z`` unless ``gravity`` says otherwise.

Sign convention (shared by every builder): a link hangs straight down (along ``-z``) at angle
``0``; a positive angle rotates it right-handedly about ``+y``, which swings a hanging link's tip
towards ``-x``: a link at absolute angle ``theta`` has its tip at
``(-l sin(theta), 0, -l cos(theta))`` relative to its pivot. The potential energy of a mass ``m``
at the end of such a link is ``-m g l cos(theta)``, so the generalised gravity term of
``tau = M(q) a + C(q, v) v + g(q)`` is ``+m g l sin(theta)`` (the torque a motor must apply to
hold the link still), and the unforced joint acceleration is ``-g(q) / M``.

Angles of a chain are *relative*: joint ``i`` measures link ``i`` against link ``i - 1``.

Every builder takes the keyword arguments ``dtype``, ``device`` (as for :class:`RobotModel`) and
``gravity``: either a 3-vector in m/s^2 (world frame) or a number ``g`` meaning ``(0, 0, -g)``.
Each system has a massless root link ``base`` fixed to the world and a massless ``tip`` link
fixed at the end of its last link (a convenient frame for :meth:`RobotModel.link_pose` and
:meth:`RobotModel.jacobian`). Each returned model carries ``robot.actuated_joints``, the joints a
controller is meant to drive (all of them, except for the cart-pole and the acrobot); the
dynamics themselves accept a force on every coordinate.

Joint damping and springs are ordinary joint parameters (``robot.joints[k].damping``,
``.stiffness``, ``.rest``) and can be made learnable like any other with
:meth:`RobotModel.make_link_param_learnable`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..errors import ModelError
from ..robot import RobotModel
from .collision import Shape, set_collision_shapes
from .spec import JointSpec, LinkSpec, RobotSpec

__all__ = ["pendulum", "n_link_pendulum", "double_pendulum", "cartpole", "acrobot", "sphere", "box", "capsule"]

_Y = (0.0, 1.0, 0.0)
_X = (1.0, 0.0, 0.0)


# ---------------------------------------------------------------------------- helpers
def _gravity(gravity, where: str) -> tuple[float, float, float]:
    if isinstance(gravity, (int, float)) and not isinstance(gravity, bool):
        g = (0.0, 0.0, -float(gravity))
    else:
        try:
            g = tuple(float(x) for x in torch.as_tensor(gravity, dtype=torch.float64).reshape(-1).tolist())
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ModelError(f"{where}: gravity must be a number or a 3-vector, got {gravity!r}") from exc
        if len(g) != 3:
            raise ModelError(f"{where}: gravity must be a number or a 3-vector, got {len(g)} values")
    if not all(math.isfinite(x) for x in g):
        raise ModelError(f"{where}: gravity must be finite, got {g}")
    return g  # type: ignore[return-value]


def _per_joint(value, n: int, name: str, where: str, *, positive: bool = False,
               nonnegative: bool = False) -> list[float]:
    """Broadcast a scalar or check a sequence of length ``n``; validate the sign."""
    if isinstance(value, torch.Tensor) and value.dim() == 0:
        value = float(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        vals = [float(value)] * n
    elif isinstance(value, Sequence) or isinstance(value, torch.Tensor):
        vals = [float(x) for x in value]
        if len(vals) != n:
            raise ModelError(f"{where}: '{name}' needs {n} values (one per link/joint), got {len(vals)}")
    else:
        raise ModelError(f"{where}: '{name}' must be a number or a sequence of {n} numbers, got {value!r}")
    for x in vals:
        if not math.isfinite(x):
            raise ModelError(f"{where}: '{name}' must be finite, got {vals}")
        if positive and not x > 0:
            raise ModelError(f"{where}: '{name}' must be positive, got {vals}")
        if nonnegative and x < 0:
            raise ModelError(f"{where}: '{name}' must be non-negative, got {vals}")
    return vals


def _sphere_inertia(mass: float, radius: float):
    i = 0.4 * mass * radius**2
    return ((i, 0.0, 0.0), (0.0, i, 0.0), (0.0, 0.0, i))


def _base() -> LinkSpec:
    return LinkSpec("base", mass=0.0)


def _tip(parent: str, offset: float) -> tuple[LinkSpec, JointSpec]:
    return LinkSpec("tip", mass=0.0), JointSpec("tip_joint", "fixed", parent, "tip", xyz=(0.0, 0.0, -offset))


def _model(spec: RobotSpec, dtype, device) -> RobotModel:
    return RobotModel(spec, dtype=dtype, device=device)


# ---------------------------------------------------------------------------- pendulums
def n_link_pendulum(
    n: int,
    *,
    masses: float | Sequence[float] = 1.0,
    lengths: float | Sequence[float] = 1.0,
    damping: float | Sequence[float] = 0.0,
    stiffness: float | Sequence[float] = 0.0,
    rest: float | Sequence[float] = 0.0,
    bob_radius: float | Sequence[float] | None = None,
    name: str | None = None,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    gravity=(0.0, 0.0, -9.81),
) -> RobotModel:
    """A planar chain of ``n`` pendulum links, each a massless rod with a bob at its end.

    Structure: ``base`` (fixed to the world) -> ``joint1`` -> ``link1`` -> ... -> ``joint<n>`` ->
    ``link<n>`` -> (fixed) ``tip``. ``joint1`` sits at the world origin; ``joint<i+1>`` sits at
    the bob of ``link<i>``, ``lengths[i-1]`` below joint ``i`` in link ``i``'s frame. Each joint is
    ``continuous`` (unbounded) about ``+y``.

    Coordinates: ``q[i]`` is the angle of link ``i+1`` *relative to* link ``i`` (link ``1``:
    relative to straight down), rad; ``q = 0`` hangs straight down; positive angles swing the tip
    towards ``-x`` (see the module docstring). ``v`` are the matching angular rates, rad/s.

    Inertia: each bob is a solid sphere of mass ``masses[i]`` and radius ``bob_radius[i]`` centred
    on the rod's end, so it adds ``0.4 m r^2`` about its centre (default radius
    ``0.01 * length``: almost a point mass, with a strictly positive rotational inertia). Pass
    ``bob_radius=0`` for exact point masses.

    Args:
        n: number of links, >= 1.
        masses: bob masses, kg (one number for all links, or ``n`` numbers).
        lengths: rod lengths (pivot to bob centre), m.
        damping: viscous joint damping, N m s/rad (passive torque ``-d v``).
        stiffness: joint spring stiffness, N m/rad (passive torque ``-k (q - rest)``).
        rest: spring rest angles, rad.
        bob_radius: bob radii, m (see above).
        name: model name (default ``"pendulum"`` for ``n = 1``, else ``"<n>_link_pendulum"``).
        dtype, device: of the model's tensors.
        gravity: 3-vector, m/s^2, or a number ``g`` meaning ``(0, 0, -g)``.

    Returns:
        A :class:`RobotModel` with ``nq = nv = n``.
    """
    where = "n_link_pendulum"
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ModelError(f"{where}: 'n' must be a positive integer, got {n!r}")
    m = _per_joint(masses, n, "masses", where, positive=True)
    lens = _per_joint(lengths, n, "lengths", where, positive=True)
    d = _per_joint(damping, n, "damping", where, nonnegative=True)
    k = _per_joint(stiffness, n, "stiffness", where, nonnegative=True)
    r0 = _per_joint(rest, n, "rest", where)
    radius = [0.01 * length for length in lens] if bob_radius is None else _per_joint(
        bob_radius, n, "bob_radius", where, nonnegative=True)
    links = [_base()]
    joints = []
    parent = "base"
    for i in range(n):
        child = f"link{i + 1}"
        links.append(LinkSpec(child, mass=m[i], com=(0.0, 0.0, -lens[i]), inertia=_sphere_inertia(m[i], radius[i])))
        joints.append(JointSpec(
            f"joint{i + 1}", "continuous", parent, child, xyz=(0.0, 0.0, -lens[i - 1]) if i else (0.0, 0.0, 0.0),
            axis=_Y, damping=d[i], stiffness=k[i], rest=r0[i],
        ))
        parent = child
    tip_link, tip_joint = _tip(parent, lens[-1])
    links.append(tip_link)
    joints.append(tip_joint)
    if name is None:
        name = "pendulum" if n == 1 else f"{n}_link_pendulum"
    spec = RobotSpec(name, links, joints, source=f"diffmech.model.systems.{where}", gravity=_gravity(gravity, where))
    robot = _model(spec, dtype, device)
    robot.actuated_joints = list(robot.joint_names)
    return robot


def pendulum(
    mass: float = 1.0,
    length: float = 1.0,
    damping: float = 0.0,
    *,
    bob_radius: float | None = None,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    gravity=(0.0, 0.0, -9.81),
) -> RobotModel:
    """A simple pendulum: a bob of mass ``mass`` on a massless rod of length ``length``.

    One ``continuous`` joint ``joint1`` about ``+y`` at the world origin; links ``base``,
    ``link1`` (carries the bob at ``(0, 0, -length)``) and ``tip`` (frame at the bob centre).

    Coordinates: ``q = (theta,)``, rad, ``0`` hanging straight down, positive swinging the bob
    towards ``-x``. With bob inertia ``I = 0.4 mass bob_radius^2`` about its centre:
    ``M = mass length^2 + I``, generalised gravity ``g(q) = mass |g| length sin(theta)``
    (so ``tau = M a + g(q) + damping v``), small-angle period
    ``2 pi sqrt(M / (mass |g| length))``.

    Args:
        mass: bob mass, kg.
        length: pivot to bob centre, m.
        damping: viscous joint damping, N m s/rad.
        bob_radius: radius of the (solid sphere) bob, m; default ``0.01 * length``; ``0`` gives
            a point mass.
        dtype, device: of the model's tensors.
        gravity: 3-vector, m/s^2, or a number ``g`` meaning ``(0, 0, -g)``.
    """
    return n_link_pendulum(1, masses=mass, lengths=length, damping=damping, bob_radius=bob_radius,
                           name="pendulum", dtype=dtype, device=device, gravity=gravity)


def double_pendulum(
    masses: Sequence[float] = (1.0, 1.0),
    lengths: Sequence[float] = (1.0, 1.0),
    *,
    stiffness: Sequence[float] = (0.0, 0.0),
    rest: Sequence[float] = (0.0, 0.0),
    damping: float | Sequence[float] = 0.0,
    bob_radius: float | Sequence[float] | None = None,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    gravity=(0.0, 0.0, -9.81),
) -> RobotModel:
    """A double pendulum with optional torsional joint springs.

    The two-link case of :func:`n_link_pendulum` (same link/joint names and conventions):
    ``q = (theta1, theta2)``, ``theta1`` of link 1 against straight down, ``theta2`` of link 2
    relative to link 1, rad. For point masses (``bob_radius=0``), with ``c2 = cos(theta2)``:
    ``M11 = (m1 + m2) l1^2 + m2 l2^2 + 2 m2 l1 l2 c2``, ``M12 = m2 l2^2 + m2 l1 l2 c2``,
    ``M22 = m2 l2^2``.

    Springs: joint ``i`` applies the passive torque ``-stiffness[i] (q[i] - rest[i])``, so
    :meth:`RobotModel.inverse_dynamics` (``passive=True``) returns the rigid-body torque plus
    ``stiffness * (q - rest) + damping * v``. Stiffness and rest angle are stored per joint in
    ``robot.joints[k].stiffness`` / ``.rest`` (``k = 0, 1`` for ``joint1``, ``joint2``) and can be
    made learnable with ``robot.make_link_param_learnable("link1", "stiffness")`` etc.

    Args:
        masses: bob masses ``(m1, m2)``, kg.
        lengths: rod lengths ``(l1, l2)``, m.
        stiffness: joint spring stiffnesses ``(k1, k2)``, N m/rad.
        rest: spring rest angles ``(r1, r2)``, rad.
        damping: viscous damping per joint, N m s/rad.
        bob_radius: bob radii, m (default ``0.01 * length``; ``0`` for point masses).
        dtype, device: of the model's tensors.
        gravity: 3-vector, m/s^2, or a number ``g`` meaning ``(0, 0, -g)``.
    """
    return n_link_pendulum(2, masses=masses, lengths=lengths, damping=damping, stiffness=stiffness, rest=rest,
                           bob_radius=bob_radius, name="double_pendulum", dtype=dtype, device=device,
                           gravity=gravity)


# ---------------------------------------------------------------------------- cart-pole and acrobot
def cartpole(
    cart_mass: float = 1.0,
    pole_mass: float = 0.1,
    pole_length: float = 0.5,
    *,
    damping: Sequence[float] = (0.0, 0.0),
    bob_radius: float | None = None,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    gravity=(0.0, 0.0, -9.81),
) -> RobotModel:
    """A cart on a horizontal rail carrying a pendulum pole.

    Structure: ``base`` -> prismatic ``slider`` along world ``+x`` -> ``cart`` -> continuous
    ``hinge`` about ``+y`` at the cart origin -> ``pole`` (bob at ``(0, 0, -pole_length)``) ->
    ``tip``. Only ``slider`` is usually actuated (``robot.actuated_joints == ["slider"]``);
    the model itself takes a force on every coordinate.

    Coordinates: ``q = (x, theta)``: cart position along ``+x``, m, and pole angle, rad, ``0``
    hanging straight down and ``pi`` upright; positive ``theta`` swings the bob towards ``-x``
    (bob at ``(x - l sin(theta), 0, -l cos(theta))``). ``v = (x_dot, theta_dot)``;
    ``tau = (force on the cart, N; torque on the pole, N m)``.

    Closed form (``mc`` cart mass, ``mp`` pole mass, ``l`` pole length, ``I`` bob inertia about
    its centre, ``s, c = sin(theta), cos(theta)``):
    ``M = [[mc + mp, -mp l c], [-mp l c, mp l^2 + I]]`` and
    ``h(q, v) = (mp l s theta_dot^2, mp |g| l s)``.

    The cart is a 0.2 x 0.1 x 0.1 m uniform box (its rotational inertia never enters the
    dynamics, since it only translates); the pole is a massless rod with a spherical bob of
    radius ``bob_radius`` (default ``0.01 * pole_length``; ``0`` for a point mass).

    Args:
        cart_mass, pole_mass: kg.
        pole_length: hinge to bob centre, m.
        damping: viscous damping ``(slider N s/m, hinge N m s/rad)``.
        bob_radius: m.
        dtype, device: of the model's tensors.
        gravity: 3-vector, m/s^2, or a number ``g`` meaning ``(0, 0, -g)``.
    """
    where = "cartpole"
    mc, mp = _per_joint((cart_mass, pole_mass), 2, "masses", where, positive=True)
    (length,) = _per_joint((pole_length,), 1, "pole_length", where, positive=True)
    d = _per_joint(damping, 2, "damping", where, nonnegative=True)
    (radius,) = _per_joint((0.01 * length if bob_radius is None else bob_radius,), 1, "bob_radius", where,
                           nonnegative=True)
    a, b, c = 0.2, 0.1, 0.1
    box = ((mc * (b * b + c * c) / 12, 0.0, 0.0), (0.0, mc * (a * a + c * c) / 12, 0.0),
           (0.0, 0.0, mc * (a * a + b * b) / 12))
    tip_link, tip_joint = _tip("pole", length)
    spec = RobotSpec(
        "cartpole",
        links=[_base(), LinkSpec("cart", mass=mc, inertia=box),
               LinkSpec("pole", mass=mp, com=(0.0, 0.0, -length), inertia=_sphere_inertia(mp, radius)), tip_link],
        joints=[JointSpec("slider", "prismatic", "base", "cart", axis=_X, damping=d[0]),
                JointSpec("hinge", "continuous", "cart", "pole", axis=_Y, damping=d[1]), tip_joint],
        source=f"diffmech.model.systems.{where}", gravity=_gravity(gravity, where),
    )
    robot = _model(spec, dtype, device)
    robot.actuated_joints = ["slider"]
    return robot


def acrobot(
    masses: Sequence[float] = (1.0, 1.0),
    lengths: Sequence[float] = (1.0, 1.0),
    *,
    com: Sequence[float] | None = None,
    inertias: Sequence[float] | None = None,
    damping: float | Sequence[float] = 0.0,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    gravity=(0.0, 0.0, -9.81),
) -> RobotModel:
    """The acrobot: a two-link planar arm hanging from a passive shoulder, actuated at the elbow.

    Structure: ``base`` -> continuous ``shoulder`` about ``+y`` at the world origin -> ``link1``
    -> continuous ``elbow`` ``lengths[0]`` below the shoulder -> ``link2`` -> ``tip`` (at
    ``lengths[1]`` below the elbow). ``robot.actuated_joints == ["elbow"]``; the model itself
    takes a torque on both joints.

    Coordinates: ``q = (theta1, theta2)``, rad: ``theta1`` of link 1 against straight down,
    ``theta2`` of link 2 relative to link 1; ``0`` hangs down, positive swings towards ``-x``
    (module docstring). Links are solid bodies, unlike the pendulum bobs: by default *thin
    uniform rods*, centre of mass at mid-length, inertia about it
    ``diag(m l^2 / 12, m l^2 / 12, 0)`` (exact for a rod of zero thickness). With ``I_i`` the
    inertia about the centre of mass and ``lc_i`` its distance from the joint (Spong's form):
    ``M11 = I1 + I2 + m1 lc1^2 + m2 (l1^2 + lc2^2 + 2 l1 lc2 c2)``,
    ``M12 = I2 + m2 (lc2^2 + l1 lc2 c2)``, ``M22 = I2 + m2 lc2^2``.

    Args:
        masses: link masses ``(m1, m2)``, kg.
        lengths: link lengths ``(l1, l2)``, m.
        com: distances ``(lc1, lc2)`` of each link's centre of mass below its joint, m
            (default: half the lengths).
        inertias: ``(I1, I2)``, each link's inertia about its centre of mass for rotation in the
            plane (about ``y``), kg m^2; the ``x`` axis gets the same value and ``z`` zero
            (default ``m l^2 / 12``).
        damping: viscous damping per joint, N m s/rad.
        dtype, device: of the model's tensors.
        gravity: 3-vector, m/s^2, or a number ``g`` meaning ``(0, 0, -g)``.
    """
    where = "acrobot"
    m = _per_joint(masses, 2, "masses", where, positive=True)
    lens = _per_joint(lengths, 2, "lengths", where, positive=True)
    lc = [0.5 * x for x in lens] if com is None else _per_joint(com, 2, "com", where)
    inert = [mi * li**2 / 12 for mi, li in zip(m, lens)] if inertias is None else _per_joint(
        inertias, 2, "inertias", where, nonnegative=True)
    d = _per_joint(damping, 2, "damping", where, nonnegative=True)
    rod = lambda i: ((inert[i], 0.0, 0.0), (0.0, inert[i], 0.0), (0.0, 0.0, 0.0))  # noqa: E731
    tip_link, tip_joint = _tip("link2", lens[1])
    spec = RobotSpec(
        "acrobot",
        links=[_base(), LinkSpec("link1", mass=m[0], com=(0.0, 0.0, -lc[0]), inertia=rod(0)),
               LinkSpec("link2", mass=m[1], com=(0.0, 0.0, -lc[1]), inertia=rod(1)), tip_link],
        joints=[JointSpec("shoulder", "continuous", "base", "link1", axis=_Y, damping=d[0]),
                JointSpec("elbow", "continuous", "link1", "link2", xyz=(0.0, 0.0, -lens[0]), axis=_Y, damping=d[1]),
                tip_joint],
        source=f"diffmech.model.systems.{where}", gravity=_gravity(gravity, where),
    )
    robot = _model(spec, dtype, device)
    robot.actuated_joints = ["elbow"]
    return robot


# ---------------------------------------------------------------------------- free rigid bodies
def _free_body(name: str, shape: Shape, mass: float, inertia, dtype, device, gravity) -> RobotModel:
    if not (isinstance(mass, (int, float)) and math.isfinite(mass) and mass > 0):
        raise ModelError(f"{name}: mass must be a positive finite number, got {mass!r}")
    g = _gravity(gravity, name)
    spec = RobotSpec(name, [LinkSpec("body", mass=float(mass), inertia=inertia)], [], gravity=g)
    robot = RobotModel(spec, floating_base=True, dtype=dtype, device=device)
    set_collision_shapes(robot, "body", shape)
    return robot


def sphere(radius: float, mass: float, *, name: str = "sphere", dtype=torch.float64, device=None,
           gravity=9.81) -> RobotModel:
    """A free solid sphere of uniform density: one link ``body`` on a floating base (``nq = 7``,
    ``nv = 6``; ``q = (x, y, z, qx, qy, qz, qw)`` of its centre) with a sphere collision shape.

    Args:
        radius: m. mass: kg.
    """
    shape = Shape("sphere", (radius,))
    return _free_body(name, shape, mass, _sphere_inertia(float(mass), float(radius)), dtype, device, gravity)


def box(size=(1.0, 1.0, 1.0), mass: float = 1.0, *, name: str = "box", dtype=torch.float64, device=None,
        gravity=9.81) -> RobotModel:
    """A free solid box of uniform density, side lengths ``size = (lx, ly, lz)`` m along its body
    axes, centred on the link origin; floating base as :func:`sphere`."""
    shape = Shape("box", tuple(size))
    lx, ly, lz = shape.size
    m = float(mass)
    inertia = ((m * (ly**2 + lz**2) / 12, 0.0, 0.0), (0.0, m * (lx**2 + lz**2) / 12, 0.0),
               (0.0, 0.0, m * (lx**2 + ly**2) / 12))
    return _free_body(name, shape, mass, inertia, dtype, device, gravity)


def capsule(radius: float, length: float, mass: float, *, name: str = "capsule", dtype=torch.float64, device=None,
            gravity=9.81) -> RobotModel:
    """A free solid capsule of uniform density: a cylinder of ``radius`` and ``length`` (m) along
    the body ``z`` axis with a half-sphere on each end, centred on the link origin; floating base
    as :func:`sphere`."""
    shape = Shape("capsule", (radius, length))
    r, h = shape.size
    m = float(mass)
    vc, vs = math.pi * r**2 * h, 4.0 / 3.0 * math.pi * r**3
    mc, ms = m * vc / (vc + vs), m * vs / (vc + vs)
    # cylinder plus two half-spheres whose centres of mass sit 3r/8 beyond the cylinder's ends
    izz = mc * r**2 / 2 + ms * 2 * r**2 / 5
    d = h / 2 + 3 * r / 8
    ixx = mc * (3 * r**2 + h**2) / 12 + ms * (83 * r**2 / 320 + d**2)
    inertia = ((ixx, 0.0, 0.0), (0.0, ixx, 0.0), (0.0, 0.0, izz))
    return _free_body(name, shape, mass, inertia, dtype, device, gravity)
