"""Contact: narrow-phase geometry between primitive shapes, the projected Gauss-Seidel solver, and
a step's contact problem (assembly, solve, impulse) with its hand-written reverse pass.

Scenes and time stepping live in :mod:`diffmech.sim` (:class:`~diffmech.sim.Scene`,
:func:`~diffmech.sim.contact_step`); collision shapes in :mod:`diffmech.model.collision`.
"""

from . import geometry, impulses
from .pgs import PGSResult, pgs

__all__ = ["geometry", "impulses", "pgs", "PGSResult"]
