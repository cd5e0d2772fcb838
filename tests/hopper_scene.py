"""A small test robot for the contact step's one-robot ground route (``diffmech.sim._ground_step``,
``diffmech.sim._ground_rollout``): a floating body on two one-joint legs with sphere feet and a capsule
on its back (it lands on it when tipped) -- both kinds of ball, drives, joint limits, and small
kernels to build."""

from __future__ import annotations

import torch

import diffmech
from diffmech.model.collision import Shape, set_collision_shapes
from diffmech.sim import Scene

F64 = torch.float64

URDF = """<robot name="hopper">
  <link name="body"><inertial><origin xyz="0 0 0.02"/><mass value="2"/>
    <inertia ixx="0.02" iyy="0.03" izz="0.04" ixy="0.001" ixz="0" iyz="0"/></inertial>
  </link>
  <link name="left"><inertial><origin xyz="0 0 -0.1"/><mass value="0.3"/>
    <inertia ixx="0.002" iyy="0.002" izz="0.0005" ixy="0" ixz="0" iyz="0"/></inertial>
    <collision><origin xyz="0 0 -0.2"/><geometry><sphere radius="0.03"/></geometry></collision></link>
  <link name="right"><inertial><origin xyz="0 0 -0.1"/><mass value="0.3"/>
    <inertia ixx="0.002" iyy="0.002" izz="0.0005" ixy="0" ixz="0" iyz="0"/></inertial>
    <collision><origin xyz="0 0 -0.2"/><geometry><sphere radius="0.03"/></geometry></collision></link>
  <joint name="hip_l" type="revolute"><parent link="body"/><child link="left"/><origin xyz="0.1 0.08 0"/>
    <axis xyz="0 1 0"/><limit lower="-0.6" upper="0.03" effort="50" velocity="10"/></joint>
  <joint name="hip_r" type="revolute"><parent link="body"/><child link="right"/><origin xyz="-0.1 -0.08 0"/>
    <axis xyz="0 1 0"/><limit lower="-0.6" upper="0.6" effort="50" velocity="10"/></joint>
</robot>"""


def make_scene(kp=None, friction=0.6, radius=None, restitution=0.0):
    robot = diffmech.load_urdf(URDF, floating_base=True)
    # URDF has no capsule: the one on the body's back (along x) is set by hand
    set_collision_shapes(robot, "body", Shape("capsule", (0.04, 0.3), xyz=(0.0, 0.0, 0.08), rpy=(0.0, 1.5707963, 0.0)))
    kp = torch.tensor(40.0, dtype=F64) if kp is None else kp
    sizes = None if radius is None else {("hopper", "left"): radius}
    return Scene([robot], friction=friction, restitution=restitution,
                 drives={"hopper": {"stiffness": kp, "damping": 1.5, "armature": 0.01}}, sizes=sizes)


def start_state(scene, B=2):
    q = scene.neutral_configuration().expand(B, -1).clone()
    q[:, 2] = 0.26  # env 0: feet 3 cm above the ground
    if B > 1:
        q[1, 2] = 0.14  # env 1: upside down, its back's capsule 2 cm above the ground
        q[1, 3:7] = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64)
    v = torch.zeros(B, scene.nv, dtype=F64)
    v[:, 0] = torch.tensor([0.4, -0.2], dtype=F64)[:B]
    v[:, 6] = 3.0  # the left hip swings into its upper limit
    return q, v


