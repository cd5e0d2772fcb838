"""Contact: narrow-phase geometry between primitive shapes and the projected Gauss-Seidel solver.

Scenes and time stepping live in :mod:`diffmech.sim` (:class:`~diffmech.sim.Scene`,
:func:`~diffmech.sim.contact_step`); collision shapes in :mod:`diffmech.model.collision`.
"""

from . import geometry
from .pgs import PGSResult, pgs

__all__ = ["geometry", "pgs", "PGSResult"]
