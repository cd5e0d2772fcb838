"""3-D views of robots and scenes: animated plotly figures and self-contained HTML pages.

``diffmech.viz.show(robot_or_scene, q_trajectory, path="traj.html")`` writes a page that opens
offline (plotly.js inline): the links' URDF visual meshes (collision shapes where a link has none),
every model of a :class:`diffmech.sim.Scene` and its ground plane, posed by forward kinematics at
each step of the trajectory, with a play button and a time slider. ``diffmech.viz.figure(...)``
returns the ``plotly`` figure itself (for notebooks). Needs the ``viz`` extra
(``pip install 'diffmech[viz]'``: plotly, trimesh, fast-simplification).
"""

from .geometry import LinkMesh, decimate, link_meshes
from .view import figure, show, trajectory

__all__ = ["show", "figure", "trajectory", "link_meshes", "decimate", "LinkMesh"]
