"""Where diffmech keeps what it writes between runs (native kernels, generated data sets), and the
private temporary directory a process falls back to when that place cannot be used.

Location: ``$DIFFMECH_CACHE_DIR``, else ``$XDG_CACHE_HOME/diffmech`` (an absolute ``XDG_CACHE_HOME``),
else ``~/.cache/diffmech``; each user of it keeps a subdirectory (``kernels``, ``symo``). The rules for
trusting a directory differ by user (the kernel store loads code from it, so it checks ownership and
modes; the data cache checks a checksum per file) and stay with them.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = ["base_dir", "PrivateTempDir"]


def base_dir(home: Callable[[], str] | None = None) -> Path:
    """The configured cache directory, absolute (not created, not checked). ``home`` returns the
    user's home directory (default ``os.path.expanduser("~")``); it is called only when neither
    variable is set."""
    env = os.environ.get("DIFFMECH_CACHE_DIR")
    if env:
        base = os.path.expanduser(env)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        if xdg and os.path.isabs(xdg):
            base = os.path.join(xdg, "diffmech")
        else:
            base = os.path.join(home() if home is not None else os.path.expanduser("~"), ".cache", "diffmech")
    return Path(os.path.abspath(base))


class PrivateTempDir:
    """A temporary directory of this process (mode 0700), made on first use, made again if something
    removed it, and removed at exit -- by the process that made it, not by a forked child that
    inherited the exit handler."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self._path: Path | None = None
        self._lock = threading.Lock()

    @property
    def current(self) -> Path | None:
        """The directory if one was made (it may have been removed since), else ``None``."""
        return self._path

    def get(self) -> Path:
        """The directory, made now if needed. Raises ``OSError`` where none can be made."""
        with self._lock:
            if self._path is None or not self._path.is_dir():
                self._path = Path(tempfile.mkdtemp(prefix=self.prefix))
                atexit.register(_remove, self._path, os.getpid())
            return self._path


def _remove(path: Path, pid: int) -> None:
    if os.getpid() == pid:
        shutil.rmtree(path, ignore_errors=True)
