"""The ``diffmech`` logger: one line per stage of long work (kernel builds, sweeps, training stages).

Every module logs under ``diffmech.<module>``, so ``logging.getLogger("diffmech").setLevel(logging.WARNING)``
silences them all and ``logging.basicConfig(level=logging.INFO)`` or any handler of the user's takes over.
Until the user configures logging, :func:`show` gives the ``diffmech`` logger a stderr handler at INFO:
work that takes minutes (a first native build, a sweep) must not be silent by default.
"""

from __future__ import annotations

import logging
import sys

ROOT = "diffmech"
_HANDLER: list[logging.Handler] = []


def get(name: str) -> logging.Logger:
    """The logger ``diffmech.<name>``."""
    return logging.getLogger(f"{ROOT}.{name}")


def show() -> None:
    """Make the ``diffmech`` INFO lines visible on stderr, unless the user configured logging
    (a handler on the root or the ``diffmech`` logger, or a level set on ``diffmech``)."""
    logger = logging.getLogger(ROOT)
    if _HANDLER or logger.handlers or logging.getLogger().handlers or logger.level != logging.NOTSET:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", "%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    _HANDLER.append(handler)
