"""Ready-made contact scenes (the seed's, rebuilt from diffmech's own parts).

Each function returns ``(scene, q0, v0)``: a :class:`~diffmech.sim.Scene` and its initial state
``(nq,)``, ``(nv,)`` in the scene's dtype.
"""

from __future__ import annotations

import math
import os
import warnings

import torch

from ..errors import ModelError
from ..model.collision import Shape, collision_shapes, set_collision_shapes
from ..model.spec import JointSpec, LinkSpec, RobotSpec
from ..robot import RobotModel
from .scene import Scene

__all__ = ["racecar", "golf", "laikago", "panda_throw", "panda_throw_torques", "ant", "ANT_START_ANKLE"]


def _box_inertia(m, lx, ly, lz):
    return ((m * (ly**2 + lz**2) / 12, 0.0, 0.0), (0.0, m * (lx**2 + lz**2) / 12, 0.0),
            (0.0, 0.0, m * (lx**2 + ly**2) / 12))


def racecar(friction=0.002, braked: bool = True, *, speed: float = 1.0, dtype=torch.float64, device=None):
    """A four-wheeled car on the ground moving along ``+x`` at ``speed`` m/s.

    The car (built here, with the proportions of PyBullet's ``racecar``): a 4 kg chassis box
    0.5 x 0.25 x 0.08 m and four 0.25 kg wheels (cylinders of radius 0.05 m, 0.04 m wide, axles along
    ``y``, wheelbase 0.34 m, track 0.26 m). ``braked=True`` locks the wheel joints (fixed joints, so
    the ground's sliding friction decelerates the car at ``mu g``); ``braked=False`` lets them turn
    freely (continuous joints), so the car rolls.

    Args:
        friction: Coulomb coefficient of the wheels on the ground (number or one-element tensor;
            a tensor that requires grad receives gradients through a rollout).

    Returns:
        ``(scene, q0, v0)``; the car is the scene's model ``"racecar"`` with a floating base.
    """
    r, w, mw = 0.05, 0.04, 0.25
    lx, ly, lz, mc = 0.5, 0.25, 0.08, 4.0
    iw = mw * (3 * r**2 + w**2) / 12
    wheel_inertia = ((iw, 0.0, 0.0), (0.0, mw * r**2 / 2, 0.0), (0.0, 0.0, iw))
    links = [LinkSpec("chassis", mass=mc, inertia=_box_inertia(mc, lx, ly, lz))]
    joints = []
    names = []
    for fx, sx in (("front", 1), ("rear", -1)):
        for fy, sy in (("left", 1), ("right", -1)):
            n = f"{fx}_{fy}_wheel"
            names.append(n)
            links.append(LinkSpec(n, mass=mw, inertia=wheel_inertia))
            joints.append(JointSpec(f"{n}_joint", "fixed" if braked else "continuous", "chassis", n,
                                    xyz=(0.17 * sx, 0.13 * sy, -0.05), axis=(0.0, 1.0, 0.0)))
    car = RobotModel(RobotSpec("racecar", links, joints), floating_base=True, dtype=dtype, device=device)
    set_collision_shapes(car, "chassis", Shape("box", (lx, ly, lz)))
    for n in names:
        set_collision_shapes(car, n, Shape("cylinder", (r, w), rpy=(math.pi / 2, 0.0, 0.0)))
    scene = Scene({"racecar": car}, friction=friction)
    q0 = scene.neutral_configuration().clone()
    q0[2] = r + 0.05  # wheels on the ground
    v0 = torch.zeros(scene.nv, dtype=dtype, device=device)
    v0[0] = speed
    return scene, q0, v0


def golf(*, restitution: float = 0.5, friction: float = 0.3, loft: float = 0.5, swing_speed: float = 6.0,
         wrist_stiffness: float = 300.0, wrist_damping: float = 2.0, dtype=torch.float64, device=None):
    """A two-joint linkage (an arm and a golf club) in its downswing and a ball on the ground.

    The linkage hangs from a fixed pivot and swings in the ``x``-``z`` plane (joints about ``+y``;
    angle 0 hangs straight down, a positive angle lifts the club towards ``-x``, the swing goes
    towards ``+x``): a 0.3 m upper link (1 kg) from the shoulder to the wrist and a club (0.7 kg: a
    0.2 kg shaft of 0.3 m and a 0.5 kg head at its end). The head's face, its only collision shape,
    is a plate 4 mm thick, 6 cm wide and 5 cm tall, tilted back by ``loft`` rad, so that a ball
    struck on it leaves upwards; hanging straight down, the head's lowest corner is 2 mm above the
    ground (the pivot sits at the height that gives this). The wrist is a spring-damper of the
    scene (``wrist_stiffness`` N m/rad, ``wrist_damping`` N m s/rad about the straight club; see
    :class:`~diffmech.sim.Scene`'s ``drives``): with a free wrist the club folds back under the
    swing's forces and the head passes over the ball. The shoulder is free.

    The ball (radius 2.5 cm, 0.5 kg: the seed's) rests on the ground 5 mm in front of the face of
    the hanging club. Restitution ``restitution`` (0.5, the seed's) and friction ``friction`` for
    every pair.

    Returns:
        ``(scene, q0, v0)``: models ``"club"`` (joints ``shoulder``, ``wrist``) and ``"ball"``
        (floating base); the club starts raised at ``q = (1.2, 0)`` rad and swinging down at
        ``swing_speed`` rad/s (``v = (-swing_speed, 0)``), so that without any joint torque it
        reaches the ball about 0.17 s later and drives it about 1.2 m; the ball at rest.
    """
    from ..model import systems

    l1, l2, r = 0.3, 0.3, 0.025
    hx, hy, hz = 0.004, 0.06, 0.05  # the head's plate: thickness (the face's normal), width, height
    m_shaft, m_head = 0.2, 0.5
    clearance, gap = 0.002, 0.005
    m_club = m_shaft + m_head
    com = -(m_shaft * l2 / 2 + m_head * l2) / m_club
    i_swing = (m_shaft * l2**2 / 12 + m_shaft * (l2 / 2 + com) ** 2
               + m_head * (hx**2 + hz**2) / 12 + m_head * (l2 + com) ** 2)
    i_axial = m_head * (hx**2 + hy**2) / 12 + m_shaft * 1e-4
    links = [LinkSpec("base"),
             LinkSpec("upper", mass=1.0, com=(0.0, 0.0, -l1 / 2), inertia=_box_inertia(1.0, 0.02, 0.02, l1)),
             LinkSpec("club", mass=m_club, com=(0.0, 0.0, com),
                      inertia=((i_swing, 0.0, 0.0), (0.0, i_swing, 0.0), (0.0, 0.0, i_axial)))]
    s, c = math.sin(loft), math.cos(loft)
    head_z = clearance + s * hx / 2 + c * hz / 2  # height of the head's centre, hanging straight down
    joints = [JointSpec("shoulder", "continuous", "base", "upper", xyz=(0.0, 0.0, head_z + l1 + l2),
                        axis=(0.0, 1.0, 0.0)),
              JointSpec("wrist", "continuous", "upper", "club", xyz=(0.0, 0.0, -l1), axis=(0.0, 1.0, 0.0))]
    club = RobotModel(RobotSpec("club", links, joints), dtype=dtype, device=device)
    # rpy (0, -loft, 0) turns the plate's +x normal to (cos loft, 0, sin loft): face forward and up
    set_collision_shapes(club, "club", Shape("box", (hx, hy, hz), xyz=(0.0, 0.0, -l2), rpy=(0.0, -loft, 0.0)))
    ball = systems.sphere(r, 0.5, name="ball", dtype=dtype, device=device)
    opts = dict(dtype=dtype, device=device)
    drives = {"club": {"stiffness": torch.tensor([0.0, wrist_stiffness], **opts),
                       "damping": torch.tensor([0.0, wrist_damping], **opts)}}
    scene = Scene({"club": club, "ball": ball}, friction=friction, restitution=restitution, drives=drives)
    q0 = scene.neutral_configuration().clone()
    q0[0] = 1.2
    # ball centre p with n . (p - head centre) = hx / 2 + r + gap, n = (c, 0, s)
    q0[2] = (hx / 2 + r + gap - s * (r - head_z)) / c
    q0[4] = r
    v0 = torch.zeros(scene.nv, **opts)
    v0[0] = -swing_speed
    return scene, q0, v0


def laikago(n: int = 1, *, stiffness: float = 1000.0, damping: float = 20.0, spacing: float = 1.0,
            dtype=torch.float64, device=None):
    """``n`` Laikago quadrupeds standing on the ground, side by side along ``y``.

    The robot is PyBullet's ``laikago/laikago_toes_zup.urdf`` (from the ``pybullet_data`` package;
    25.6 kg, 12 revolute joints, a floating base), its toes the only collision shapes (spheres of
    radius 3 cm from the URDF; the meshes of the other links are not used for contact) with the
    URDF's lateral friction 1.0. Each joint is held at its neutral angle (legs straight down) by a
    spring-damper of the scene (``stiffness`` N m/rad, ``damping`` N m s/rad; see
    :class:`~diffmech.sim.Scene`'s ``drives``), so under zero commanded torque the robots stand.

    Returns:
        ``(scene, q0, v0)``: models ``"laikago0"`` ... ``"laikago{n-1}"``, each standing with its
        toes on the ground (chassis 0.518 m high), at rest.
    """
    if int(n) != n or n < 1:
        raise ModelError(f"scenes.laikago: n must be a positive integer, got {n!r}")
    try:
        import pybullet_data
    except ImportError:
        raise ModelError("scenes.laikago needs the URDF from the pybullet_data package: pip install pybullet") from None
    from ..robot import load_urdf

    path = os.path.join(pybullet_data.getDataPath(), "laikago", "laikago_toes_zup.urdf")
    models = {}
    for i in range(int(n)):
        with warnings.catch_warnings():  # the meshes it skips for contact are known: say nothing
            warnings.simplefilter("ignore")
            robot = load_urdf(path, floating_base=True, dtype=dtype, device=device)
            collision_shapes(robot, meshes=False)  # its toes only: the meshes are not used for contact
        models[f"laikago{i}"] = robot
    drives = {name: {"stiffness": stiffness, "damping": damping} for name in models}
    scene = Scene(models, drives=drives)
    q0 = scene.neutral_configuration().clone()
    toe = 0.488 + 0.03  # toes 0.488 m below the chassis origin at the neutral angles, radius 3 cm
    for i, name in enumerate(models):
        sl = scene.slices[name]
        q0[sl.start + 1] = i * spacing
        q0[sl.start + 2] = toe
    return scene, q0, torch.zeros(scene.nv, dtype=dtype, device=device)


# ---------------------------------------------------------------------------------- panda_throw
PANDA_THROW_Q = (0.0, -0.3, 0.0, -2.2, 0.0, 1.9, math.pi / 4)  # rad: hand pointing down, 0.5 m above the ground
_PAD_Z = 0.044  # m: the pads' centre on the finger links' z axis (the upper half of the fingertip)
_PAD = (0.02, 0.01, 0.02)  # m: the pad boxes (x: finger width, y: thickness, z: height)


def panda_throw(*, ball_mass: float = 0.05, ball_radius: float = 0.01, grip_force: float = 10.0,
                arm_stiffness=(60.0, 60.0, 60.0, 60.0, 20.0, 20.0, 20.0),
                arm_damping=(10.0, 10.0, 10.0, 10.0, 2.0, 2.0, 2.0),
                friction: float = 0.5, dtype=torch.float64, device=None):
    """A Franka Panda holding a ball between its fingers, ready to throw it.

    The robot is PyBullet's ``franka_panda/panda.urdf`` (``pybullet_data``; its inertias are
    PyBullet's) with 9 degrees of freedom: the 7 arm joints and the two prismatic fingers as
    independent joints (the URDF's ``<mimic>`` is dropped, so each finger has its own coordinate
    and force). Its collision meshes are not used; each finger gets one box pad (2 x 1 x 2 cm, the
    inner face on the finger's sliding plane, so a finger at ``q`` has its face ``q`` from the
    hand's mid-plane) with the URDF's lateral friction 1.0; the other links have no collision
    shapes. The ball (``ball_mass`` kg, radius ``ball_radius`` m, a free body) is held between the
    pads through contact alone. Ground plane friction ``friction``.

    The scene holds everything still under zero commanded torque, by joint drives of the scene
    (see :class:`~diffmech.sim.Scene`'s ``drives``):

    * the arm joints: an impedance ``arm_stiffness`` (N m/rad) and ``arm_damping`` (N m s/rad)
      about targets offset from the start pose by the gravity torques of the arm and the ball, so
      the start pose is an equilibrium; commanded torques act on top of it;
    * the fingers: springs (500 N/m, damping 5 N s/m) whose targets lie ``grip_force / 500`` m
      inside the ball, so each pad squeezes it with ``grip_force`` N.

    :func:`panda_throw_torques` opens the fingers at a chosen step (releasing the ball).

    Returns:
        ``(scene, q0, v0)``: models ``"panda"`` (``q[0:7]`` arm, ``q[7:9]`` fingers) and
        ``"ball"`` (``q[9:16]``, position and quaternion; ``v[9:15]``), at rest in the pose
        :data:`PANDA_THROW_Q` with the hand pointing down and the ball's centre 0.40 m above the
        ground.
    """
    try:
        import pybullet_data
    except ImportError:
        raise ModelError("scenes.panda_throw needs the URDF from the pybullet_data package: "
                         "pip install pybullet") from None
    import dataclasses

    from ..model import systems
    from ..model.urdf import parse_urdf

    if not (ball_radius > 0 and ball_mass > 0 and grip_force > 0):
        raise ModelError(f"scenes.panda_throw: ball_radius, ball_mass and grip_force must be positive, got "
                         f"{ball_radius}, {ball_mass}, {grip_force}")
    if ball_radius > 0.035:
        raise ModelError(f"scenes.panda_throw: the fingers open to 4 cm each; ball_radius {ball_radius} m is too large")
    path = os.path.join(pybullet_data.getDataPath(), "franka_panda", "panda.urdf")
    with warnings.catch_warnings():  # its meshes are not used for contact: nothing to warn about
        warnings.simplefilter("ignore")
        spec = parse_urdf(path)
    spec.joints = [dataclasses.replace(j, mimic=None) for j in spec.joints]
    robot = RobotModel(spec, dtype=dtype, device=device)
    robot.meta["collision"] = {}  # no mesh shapes
    set_collision_shapes(robot, "panda_leftfinger", Shape("box", _PAD, xyz=(0.0, _PAD[1] / 2, _PAD_Z)))
    set_collision_shapes(robot, "panda_rightfinger", Shape("box", _PAD, xyz=(0.0, -_PAD[1] / 2, _PAD_Z)))
    ball = systems.sphere(ball_radius, ball_mass, name="ball", dtype=dtype, device=device)

    opts = dict(dtype=dtype, device=device)
    qa = torch.tensor(PANDA_THROW_Q + (ball_radius, ball_radius), **opts)
    hand = robot.link_names.index("panda_hand")
    finger_origin = 0.0584  # m: the fingers' joint origin on the hand's z axis (URDF)
    offset = torch.tensor([0.0, 0.0, finger_origin + _PAD_Z], **opts)

    def ball_centre(q):
        T = robot.forward_kinematics(q)[hand]
        return T[:3, 3] + T[:3, :3] @ offset

    zero = torch.zeros(9, **opts)
    with torch.no_grad():
        g = robot.inverse_dynamics(qa, zero, zero)
        centre = ball_centre(qa)
    # The ball's weight, carried by the hand: the joint torques J^T (m g e_z) hold it up.
    Jb = torch.autograd.functional.jacobian(ball_centre, qa)  # (3, 9)
    g = g + Jb[2] * ball_mass * 9.81
    kp_f, kd_f = 500.0, 5.0
    kp = torch.cat([torch.as_tensor(arm_stiffness, **opts).expand(7), torch.full((2,), kp_f, **opts)])
    kd = torch.cat([torch.as_tensor(arm_damping, **opts).expand(7), torch.full((2,), kd_f, **opts)])
    if bool((kp[:7] <= 0).any()):
        raise ModelError(f"scenes.panda_throw: arm_stiffness must be positive, got {arm_stiffness}")
    target = torch.cat([qa[:7] + g[:7] / kp[:7], torch.full((2,), ball_radius - grip_force / kp_f, **opts)])
    scene = Scene({"panda": robot, "ball": ball}, friction=friction,
                  drives={"panda": {"stiffness": kp, "damping": kd, "target": target}})
    q0 = scene.neutral_configuration().clone()
    q0[:9] = qa
    q0[9:12] = centre
    return scene, q0, torch.zeros(scene.nv, **opts)


def panda_throw_torques(arm_torques, release_step: int, *, open_force: float = 40.0, nv: int = 15):
    """The scene torques ``(..., T, nv)`` of :func:`panda_throw` from arm torques ``(..., T, 7)``
    (N m, added to the scene's drives): zero finger force before ``release_step``, from it on
    ``open_force`` N opening each finger (more than the grip springs pull back at full opening,
    so the fingers open to their 4 cm limits and let the ball go)."""
    if arm_torques.shape[-1] != 7:
        raise ModelError(f"panda_throw_torques: arm_torques must be (..., T, 7), got {tuple(arm_torques.shape)}")
    fingers = torch.zeros(*arm_torques.shape[:-1], 2, dtype=arm_torques.dtype, device=arm_torques.device)
    fingers[..., int(release_step):, :] = open_force
    rest = torch.zeros(*arm_torques.shape[:-1], nv - 9, dtype=arm_torques.dtype, device=arm_torques.device)
    return torch.cat([arm_torques, fingers, rest], -1)


# ---------------------------------------------------------------------------------- ant
ANT_START_ANKLE = math.radians(40.0)  # rad: the ankles' start angle, inside their 30..70 deg limits


def ant(geometry=None, *, friction: float = 1.0, height: float = 0.75, dtype=torch.float64, device=None):
    """The Ant (:mod:`diffmech.model.ant`) above the ground, ready to fall onto its feet.

    The robot is :func:`diffmech.model.ant.ant_robot` of ``geometry`` (default: the MuJoCo Ant's
    dimensions): a 0.25 m sphere torso and four legs of two capsules each, 0.91 kg in all. Contacts:
    every shape against the ground (Coulomb ``friction``, the MuJoCo Ant's 1.0), no contact between
    the robot's own shapes (as in MuJoCo's Ant). The joints' damping (1 N m s/rad) and motor
    armature (1 kg m^2) are drives of the scene (:class:`~diffmech.sim.Scene`'s ``drives``, no
    stiffness); the joint limits are enforced as unilateral constraints.

    Returns:
        ``(scene, q0, v0)``: the scene's one model ``"ant"``; the torso at ``height`` m (the MuJoCo
        Ant's 0.75), level, the hips at 0 and the ankles at :data:`ANT_START_ANKLE` (40 deg: MuJoCo
        starts them at 0, outside their 30..70 deg range, which its soft limits tolerate and hard
        limits would not), at rest. Under zero torque it drops about 0.3 m onto its feet and settles
        with the ankles on their lower limits, the torso about 0.36 m high.
    """
    from ..model.ant import AntGeometry, ant_robot

    geo = geometry or AntGeometry()
    robot = ant_robot(geo, dtype=dtype, device=device)
    scene = Scene({"ant": robot}, friction=friction,
                  drives={"ant": {"damping": geo.damping, "armature": geo.armature}})
    q0 = scene.neutral_configuration().clone()
    q0[2] = height
    q0[8::2] = ANT_START_ANKLE
    return scene, q0, torch.zeros(scene.nv, dtype=dtype, device=device)
