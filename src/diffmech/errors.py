"""Exceptions raised by diffmech. Every message names the culprit (file, link, joint or tensor)."""

from __future__ import annotations


class DiffmechError(Exception):
    """Base class of every error diffmech raises on purpose."""


class ModelError(DiffmechError, ValueError):
    """An invalid robot description: topology, inertia, joint data."""


class URDFError(ModelError):
    """A URDF file that cannot be turned into a robot model."""


class ShapeError(DiffmechError, ValueError):
    """A tensor whose shape, dtype or device does not fit the model."""


class ConvergenceError(DiffmechError, RuntimeError):
    """An iterative solver that did not reach its tolerance."""


class SimulationError(DiffmechError, RuntimeError):
    """A rollout that produced non-finite states or could not be continued."""


class OptionError(DiffmechError, ValueError):
    """An option that is not one of its allowed values (an algorithm, method, frame, integrator or
    adjoint name, ...)."""


class NativeRouteError(DiffmechError, RuntimeError):
    """A call that would leave the native route while ``DIFFMECH_NATIVE=require`` (or
    ``set_native("require")``) forbids it; the message says which call and why."""
