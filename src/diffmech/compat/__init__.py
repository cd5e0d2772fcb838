"""Drop-in replacements for the APIs of other libraries, built on diffmech's core.

* :mod:`diffmech.compat.drm`: differentiable-robot-model (``differentiable_robot_model`` 0.2.3):
  ``DifferentiableRobotModel`` and its ready-made robots, its parametrizations and data helpers.
"""
