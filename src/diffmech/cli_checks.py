"""Checks shared by the ``diffmech`` subcommands: option values, output folders, run folders, checkpoints.

The argparse ``type=`` functions (:func:`positive_int`, :func:`finite_float`, ...) reject a bad value
at parse time, so argparse names the option and exits with status 2 before any work. The other
checks raise :class:`UsageError` (the command line asks for something impossible: exit status 2)
or :class:`RunFolderError` / :class:`CheckpointError` (a file or folder on disk is in the way or
unreadable: exit status 1); :func:`diffmech.cli.main` turns them into one line on stderr.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from .errors import DiffmechError

__all__ = ["UsageError", "RunFolderError", "CheckpointError", "positive_int", "nonnegative_int", "int_at_least",
           "finite_float", "positive_float", "nonnegative_float", "out_path", "torch_device", "check_device",
           "check_out_folder", "check_existing_folder", "prepare_run_folder", "load_checkpoint", "RUN_FOLDER_HINT",
           "brief"]


class UsageError(DiffmechError, ValueError):
    """A command line that asks for something impossible (exit status 2, as argparse's errors)."""


class RunFolderError(DiffmechError):
    """An output or input folder that cannot be used as asked (exit status 1)."""


class CheckpointError(DiffmechError):
    """A checkpoint or run file that is missing, truncated or written for another model (exit status 1)."""


# ---------------------------------------------------------------------------- argparse types
def _int(text: str) -> int:
    try:
        return int(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def int_at_least(low: int, what: str | None = None):
    """An argparse type: an integer ``>= low`` (``what`` names it in the error, e.g. "a positive integer")."""
    what = what or f"an integer >= {low}"

    def check(text: str) -> int:
        n = _int(text)
        if n < low:
            raise argparse.ArgumentTypeError(f"expected {what}, got {n}")
        return n
    check.__name__ = what.removeprefix("an ").removeprefix("a ")
    return check


positive_int = int_at_least(1, "a positive integer")
nonnegative_int = int_at_least(0, "an integer >= 0")


def finite_float(text: str) -> float:
    try:
        x = float(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return x


def _finite_float_where(accept, what: str):
    """An argparse type: a finite number for which ``accept(x)`` holds."""
    def check(text: str) -> float:
        x = finite_float(text)
        if not accept(x):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return x
    check.__name__ = what.removeprefix("a ")
    return check


positive_float = _finite_float_where(lambda x: x > 0, "a positive number")
nonnegative_float = _finite_float_where(lambda x: x >= 0, "a number >= 0")


def out_path(text: str) -> str:
    # an empty --out would silently mean the current directory
    if not text or not text.strip():
        raise argparse.ArgumentTypeError("expected a folder name, got an empty string")
    return text


def check_device(text: str) -> str:
    """``text`` if it names a torch device this machine has, else :class:`UsageError`."""
    import torch

    try:
        dev = torch.device(text)
    except (RuntimeError, TypeError, ValueError):
        raise UsageError(f"{text!r} is not a torch device (e.g. cpu, cuda, cuda:1, mps)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"device {text!r}: CUDA is not available on this machine")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UsageError(f"device {text!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise UsageError(f"device {text!r}: MPS is not available on this machine")
    elif dev.type != "cpu":
        raise UsageError(f"device {text!r}: only cpu, cuda and mps are supported")
    return text


def torch_device(text: str) -> str:
    """argparse type of ``--device``."""
    try:
        return check_device(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# ---------------------------------------------------------------------------- folders
def _writable_dir(path: Path) -> str | None:
    # os.access says yes to root on a read-only mount: try to create a file
    try:
        fd, probe = tempfile.mkstemp(prefix=".diffmech-probe-", dir=path)
    except OSError as err:
        return err.strerror or str(err)
    os.close(fd)
    os.unlink(probe)
    return None


def check_out_folder(out: str | Path, option: str = "--out") -> Path:
    """An output folder that exists and is writable, or can be created: not a file, not read-only.

    Nothing is created; the nearest existing ancestor of a missing folder is probed instead.
    """
    if not str(out).strip():
        raise UsageError(f"{option} is empty: give a folder")
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise RunFolderError(f"{option} {out} is a file, not a folder")
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise RunFolderError(f"{option} {out}: {probe} is a file, so the folder cannot be created")
    why = _writable_dir(probe)
    if why is not None:
        where = "" if probe == path else f" ({probe} cannot hold it)"
        raise RunFolderError(f"{option} {out} is not writable{where}: {why}")
    return path


def check_existing_folder(folder: str | Path, what: str, needs: Sequence[str] = ()) -> Path:
    """A folder that exists and holds the files ``needs``; :class:`RunFolderError` naming what is missing."""
    path = Path(folder)
    if not str(folder).strip():
        raise UsageError(f"{what}: empty folder name")
    if not path.exists():
        raise RunFolderError(f"{what} {folder} does not exist")
    if not path.is_dir():
        raise RunFolderError(f"{what} {folder} is a file, not a folder")
    missing = [n for n in needs if not (path / n).is_file()]
    if missing:
        raise RunFolderError(f"{what} {folder} lacks {', '.join(missing)}: not a finished run folder")
    return path


RUN_FOLDER_HINT = "--resume to continue it, --overwrite to replace it, or another --out"


def prepare_run_folder(out: str | Path, *, markers: Iterable[str], remove: Iterable[str] = (), resume: bool = False,
                       overwrite: bool = False, option: str = "--out", can_resume: bool = True) -> Path:
    """Check the run folder ``out`` before any work: writable, and holding no earlier run unless asked.

    A folder with any of the ``markers`` (``checkpoint.pt``, ``metrics.json``, ...) holds a run:
    without ``resume`` or ``overwrite`` that is a :class:`RunFolderError` naming the folder and both
    options. ``overwrite`` removes the markers and the files ``remove`` (the run's own files only,
    never the folder: ``--out`` may be a folder with other things in it).
    """
    if resume and overwrite:
        raise UsageError("--resume and --overwrite exclude each other: continue the run or replace it")
    path = check_out_folder(out, option)
    markers = list(markers)
    found = [m for m in markers if (path / m).exists()]
    if found and not resume:
        if not overwrite:
            hint = RUN_FOLDER_HINT if can_resume else "--overwrite to replace it, or another --out"
            raise RunFolderError(f"{option} {out} already holds a run ({', '.join(found)}); nothing was written. "
                                 f"Give {hint}")
        for m in dict.fromkeys([*markers, *remove]):
            p = path / m
            if not p.exists() and not p.is_symlink():
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
    return path


# ---------------------------------------------------------------------------- checkpoints
def brief(exc: BaseException, lines: int = 3, width: int = 300) -> str:
    """The first lines of an exception's message on one line (torch's state-dict errors put the
    missing and unexpected keys on the lines after a header)."""
    text = " ".join(line.strip() for line in str(exc).strip().splitlines()[:lines] if line.strip())
    text = text or type(exc).__name__
    return text if len(text) <= width else text[: width - 3] + "..."


def load_checkpoint(path: str | Path, *, keys: Sequence[str] = (), what: str = "checkpoint",
                    map_location="cpu") -> dict:
    """``torch.load`` of a diffmech checkpoint, with one clear :class:`CheckpointError` naming the
    file for a missing, truncated or foreign file and for one that lacks the entries ``keys``."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such {what}" if not path.exists() else f"{path} is not a file")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as exc:  # noqa: BLE001 - torch.load raises anything from pickle, zipfile or EOF
        raise CheckpointError(f"{path}: cannot read the {what} ({type(exc).__name__}: {exc}); the file is "
                              "truncated, corrupt or not written by diffmech") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: not a diffmech {what} (a {type(obj).__name__}, not a dict)")
    missing = [k for k in keys if k not in obj]
    if missing:
        raise CheckpointError(f"{path}: not a {what} of this command (lacks {', '.join(missing)})")
    return obj
