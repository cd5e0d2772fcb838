"""Warnings that point at the user's line, however deep in diffmech they are raised."""

from __future__ import annotations

import os
import sys
import warnings

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _inside(frame) -> bool:
    return os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR + os.sep)


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the first frame outside the diffmech package."""
    frame, level = sys._getframe(1), 2  # the caller of warn() is stacklevel 2 of warnings.warn here
    while frame is not None and _inside(frame):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
