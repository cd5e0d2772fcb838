"""What a benchmark records about the machine and the code it measured."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess


def cpu_model() -> str:
    """The CPU's model name (``lscpu``), else what ``platform`` knows."""
    model = platform.processor() or "unknown"
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout.splitlines():
            if line.startswith("Model name"):
                model = line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return model


def commit(root: str, paths: list[str]) -> str:
    """The short commit of ``root``, with ``+dirty`` when any of ``paths`` differs from it."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=root,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", *paths], capture_output=True, text=True,
                               cwd=root, timeout=10).stdout.strip() != ""
    except (OSError, subprocess.SubprocessError):
        return ""
    return rev + ("+dirty" if dirty else "")


def machine(root: str, threads: int, paths: list[str], **versions) -> dict:
    """CPU, cores, torch and Python versions, torch threads, the commit (dirty w.r.t. ``paths``), the
    date, and ``versions`` (peer libraries) as given."""
    import torch

    return {"cpu": cpu_model(), "cores": os.cpu_count(), "torch": torch.__version__, **versions, "threads": threads,
            "python": platform.python_version(), "commit": commit(root, paths),
            "date": datetime.datetime.now().isoformat(timespec="seconds")}
