"""Drop-in replacements for the APIs of other libraries, built on diffmech's core.

* :mod:`diffmech.compat.drm`: differentiable-robot-model (``differentiable_robot_model`` 0.2.3):
  ``DifferentiableRobotModel`` and its ready-made robots, its parametrizations and data helpers.
"""


def __getattr__(name: str):
    if name == "drm":  # ``diffmech.compat.drm`` after ``import diffmech``
        import importlib

        return importlib.import_module(f"{__name__}.drm")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
