"""On-disk store of native kernels: compile C source once per user and machine, verify before loading.

:func:`load_kernel` maps a caller's key (a cheap identifier of a kernel that determines its source,
e.g. a hash of the robot's structure, the algorithm, its options and the dtype) to a loaded shared
library. The file is named by a digest of that key, the compiler (its command and ``--version``),
the CPU (``platform.machine()`` and the ``/proc/cpuinfo`` flags), the compile flags and
:data:`STORE_FORMAT`, so a kernel found on disk is loaded without generating its source again.
Beside each ``<digest>.so`` a JSON sidecar ``<digest>.json`` records its size and SHA-256, the
caller's metadata, the key, the compiler command and the creation time. Size and hash are checked
before every load: a truncated, empty or altered file is rebuilt, never handed to the dynamic
loader (``dlopen`` of a truncated library can kill the process with a bus error).

The cache is per user. Loading a shared library runs its code (constructors included) inside the
process, with the user's rights: a file that another user can write is code that user can run as
you. Directories are therefore created with mode 0700; a cache directory that is not owned by the
user, or is group- or world-writable, is refused, and so is any file in it not owned by the user or
writable by group or others (treated as absent and rebuilt). Do not point ``$DIFFMECH_CACHE_DIR``
at a directory shared between users.

Location: ``$DIFFMECH_CACHE_DIR``, else ``$XDG_CACHE_HOME/diffmech``, else ``~/.cache/diffmech``
(home from ``$HOME``, or from the password database where ``HOME`` is unset or not absolute),
always made absolute; kernels live in its ``kernels`` subdirectory (:func:`cache_root`). Where
that cannot be created or written, or is refused, the process uses a private temporary directory
(removed at exit) and warns once (:class:`KernelCacheWarning`): kernels are then built again in
every process, but the call works.

Concurrency: a process or thread that builds holds an exclusive ``flock`` on ``<digest>.lock``, so
of several that need the same kernel one compiles and the others wait, then load its result.
Builds run in ``tmp-<pid>-<random>`` directories of the cache root; the ones left by a process that
no longer exists, or older than a day, are removed before the next build (pids are those of this
host: do not share one cache directory between machines or PID namespaces that build at once).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import os
import platform
import re
import secrets
import shlex
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from .. import _log
from .._cache import PrivateTempDir, base_dir
from ..errors import DiffmechError

log = _log.get("kernels")

try:  # POSIX only; elsewhere no native kernels, but the package still imports
    import fcntl
    import pwd
except ImportError:  # pragma: no cover
    fcntl = pwd = None

__all__ = [
    "NativeUnavailable", "NotBuilt", "KernelCacheWarning", "FLAGS", "MVEC_FLAGS", "STORE_FORMAT",
    "compiler_command", "available", "cache_root", "load_kernel",
]

FLAGS = ["-O3", "-march=native", "-fopenmp-simd", "-fno-math-errno", "-std=c11", "-shared", "-fPIC"]
# Tried first: vector sin/cos from glibc's libmvec (the source declares them under DIFFMECH_MVEC);
# without it the kernel is built again with scalar libm calls.
MVEC_FLAGS = ["-DDIFFMECH_MVEC", "-fno-builtin-sin", "-fno-builtin-cos", "-fno-builtin-sinf", "-fno-builtin-cosf",
              "-lmvec"]
# Part of every digest: bump it when the layout of the store or the meaning of a key changes.
STORE_FORMAT = 1
# Build directories older than this are removed whatever their pid says (pids are recycled).
STALE_SECONDS = 24 * 3600

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TMP_NAME = re.compile(r"tmp-(\d+)-")


class NativeUnavailable(DiffmechError):
    """No native kernel: no C compiler, a device other than the CPU, an operation the code generator
    does not know, or a build or load that failed (the callers then use the torch implementation)."""


class NotBuilt(NativeUnavailable):
    """:func:`load_kernel` was asked not to build (``build=None``) and no verified kernel is stored."""


class KernelCacheWarning(UserWarning):
    """The kernel cache directory was refused or cannot be used; this process keeps its kernels in a
    private temporary directory. A ``UserWarning`` rather than a ``RuntimeWarning``: the cause lies in
    the user's environment (a permission, a path, ``$DIFFMECH_CACHE_DIR``) and is theirs to fix;
    results are unaffected, only the build time is paid again in every process."""


class _Refused(Exception):
    """A path of the cache that must not be used (the message says why)."""


# ---------------------------------------------------------------- compiler and machine
def compiler_command() -> list[str] | None:
    """The C compiler command used for native kernels, its first word resolved to an absolute path.

    ``$CC`` split as a shell would (so ``CC="ccache gcc"`` works), then Python's own compiler
    (``sysconfig``'s ``CC``, first word), ``cc``, ``gcc``: the first one found on ``PATH``.

    Returns:
        The command as a list of words, or ``None`` where none of them exists.
    """
    if fcntl is None:  # the store needs flock, uids and dlopen semantics
        return None
    found = _resolve_compiler(os.environ.get("CC"), os.environ.get("PATH"))
    return list(found) if found is not None else None


@functools.lru_cache(maxsize=16)
def _resolve_compiler(cc: str | None, path: str | None) -> tuple[str, ...] | None:
    candidates: list[list[str]] = []
    if cc and cc.strip():
        with contextlib.suppress(ValueError):  # unbalanced quotes: not a command
            candidates.append(shlex.split(cc))
    own = (sysconfig.get_config_var("CC") or "").split()
    candidates += [own[:1], ["cc"], ["gcc"]]
    for words in candidates:
        exe = shutil.which(words[0], path=path) if words else None
        if exe:
            return (os.path.abspath(exe), *words[1:])
    return None


def available() -> bool:
    """Whether native kernels can be built here (a C compiler exists)."""
    return compiler_command() is not None


@functools.lru_cache(maxsize=16)
def _machine_key(cmd: tuple[str, ...]) -> str:
    """What a compiled kernel depends on besides its key: the compiler, the CPU, the flags."""
    try:
        res = subprocess.run([*cmd, "--version"], capture_output=True, text=True, errors="replace", timeout=60,
                             stdin=subprocess.DEVNULL)
        version = f"{res.returncode}\n{res.stdout}\n{res.stderr}"
    except (OSError, subprocess.SubprocessError) as err:  # the compile will say what is wrong
        version = f"unrunnable: {type(err).__name__}"
    cpu = ""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", errors="replace") as f:
            cpu = next((line.strip() for line in f if line.startswith(("flags", "Features"))), "")
    return "\n".join([f"store format {STORE_FORMAT}", shlex.join(cmd), version, platform.machine(), cpu,
                      shlex.join(FLAGS), shlex.join(MVEC_FLAGS)])


@functools.lru_cache(maxsize=4096)
def _digest(key: str, cmd: tuple[str, ...]) -> str:
    return hashlib.sha256(f"{_machine_key(cmd)}\nkey {key}".encode()).hexdigest()[:32]


# ---------------------------------------------------------------- location
_ROOT_LOCK = threading.Lock()
_WARNED: set[str] = set()  # refused locations already warned about
_PROBED: set[str] = set()  # locations where this process could create a file
_FALLBACK = PrivateTempDir("diffmech-kernels-")  # where the configured directory cannot be used


def _configured_dir() -> Path:
    """The kernels directory the environment asks for (absolute; not yet checked)."""
    return base_dir(_home) / "kernels"


def _home() -> str:
    home = os.environ.get("HOME")
    if home and os.path.isabs(home):
        return home
    try:
        home = pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        home = None
    if not home or not os.path.isabs(home):
        raise _Refused(f"HOME is {os.environ.get('HOME')!r} and the password database gives no absolute home "
                       f"for uid {os.getuid()}")
    return home


def _dir_problem(path: Path) -> str | None:
    """Why ``path`` must not hold kernels, or ``None``."""
    try:
        st = os.stat(path)
    except OSError as err:
        return f"cannot stat it: {err.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _make_private_dirs(path: Path) -> None:
    """Create ``path`` and its missing parents, each with mode 0700."""
    missing = []
    p = path
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, 0o700)


def _problem(path: Path) -> tuple[Path, str] | None:
    """Make the kernels directory ``path``; the directory that cannot be used and why, or ``None``."""
    for d in (path.parent, path):  # the cache directory, then the kernels directory inside it
        try:
            _make_private_dirs(d)  # checked before anything is made inside
        except OSError as err:
            return d, f"cannot create it: {err.strerror or err}"
        why = _dir_problem(d)
        if why is not None:
            return d, why
    if str(path) not in _PROBED:  # os.access says yes to root on a read-only mount
        try:
            fd, probe = tempfile.mkstemp(prefix="tmp-probe-", dir=path)
            os.close(fd)
            os.unlink(probe)
        except OSError as err:
            return path, f"cannot write in it: {err.strerror or err}"
        _PROBED.add(str(path))
    return None


def cache_root() -> Path:
    """The directory that holds this user's native kernels: absolute, created with mode 0700, owned by
    the user and not writable by group or others (see the module docstring for where it is).

    Where the configured directory cannot be used, a private temporary directory of this process,
    with one :class:`KernelCacheWarning` per refused location.

    Raises:
        NativeUnavailable: not even a private temporary directory can be made.
    """
    try:
        path = _configured_dir()
        refused = _problem(path)
    except _Refused as err:
        refused = (Path("~/.cache/diffmech"), str(err))
    if refused is None:
        return path
    return _fallback(str(refused[0]), refused[1])


def _fallback(refused: str, why: str) -> Path:
    with _ROOT_LOCK:
        try:
            tmp = _FALLBACK.get()  # mode 0700
        except OSError as err:
            raise NativeUnavailable(f"no usable native kernel cache: {refused} ({why}), and no private "
                                    f"temporary directory ({err})") from None
        if refused not in _WARNED:
            _WARNED.add(refused)
            warnings.warn(f"native kernel cache {refused} not used ({why}); this process keeps its kernels in "
                          f"{tmp} and builds them again. Set $DIFFMECH_CACHE_DIR to a directory that "
                          "only you can write.", KernelCacheWarning, stacklevel=_user_stacklevel())
        return tmp


def _user_stacklevel() -> int:
    """``stacklevel`` for a warning issued by the caller of this function, pointing at the first
    frame outside diffmech (the user's line)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR + os.sep):
        frame, level = frame.f_back, level + 1
    return level


# ---------------------------------------------------------------- files
def _open_own(path: Path) -> tuple[int, os.stat_result]:
    """Open a file of the store for reading, refusing links, non-files and files others can write."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    st = os.fstat(fd)
    why = None
    if not stat.S_ISREG(st.st_mode):
        why = "not a regular file"
    elif st.st_uid != os.geteuid():
        why = f"owned by uid {st.st_uid}, not by this user"
    elif st.st_mode & 0o022:
        why = f"writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    if why is not None:
        os.close(fd)
        raise _Refused(f"{path.name} {why}")
    return fd, st


def _verify(root: Path, digest: str) -> tuple[dict | None, tuple[int, int] | None, str]:
    """The sidecar record of a stored kernel and its library's file identity, if the library matches
    the record; else ``(None, None, why)``."""
    try:
        fd, _ = _open_own(root / f"{digest}.json")
        with os.fdopen(fd, "rb") as f:
            record = json.loads(f.read(1 << 24))
        if not (isinstance(record, dict) and record.get("format") == STORE_FORMAT and record.get("digest") == digest
                and isinstance(record.get("size"), int) and isinstance(record.get("sha256"), str)
                and isinstance(record.get("meta"), dict)):
            return None, None, "sidecar is not a record of this kernel"
        fd, st = _open_own(root / f"{digest}.so")
        with os.fdopen(fd, "rb") as f:
            if st.st_size != record["size"]:
                return None, None, f"library has {st.st_size} bytes, its sidecar says {record['size']}"
            h, n = hashlib.sha256(), 0
            while chunk := f.read(1 << 20):
                h.update(chunk)
                n += len(chunk)
        if n != record["size"] or h.hexdigest() != record["sha256"]:
            return None, None, "library does not match the hash in its sidecar"
        return record, (st.st_dev, st.st_ino), ""
    except FileNotFoundError as err:
        return None, None, f"{Path(err.filename).name} missing"
    except (OSError, ValueError, _Refused) as err:  # unreadable, a link, not JSON, refused
        return None, None, str(err)


@contextlib.contextmanager
def _locked(path: Path, label: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (one open file per holder, so threads exclude each other)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        raise NativeUnavailable(f"{label}: cannot open the lock file {path}: {err.strerror or err}") from None
    try:
        with contextlib.suppress(OSError):  # no flock on this file system: builds may be repeated, not wrong
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OverflowError, ValueError):  # no process can have that number
        return False
    except OSError:  # EPERM: it exists, under another user
        return True
    return True


def _remove_stale(root: Path) -> None:
    """Remove build directories of processes that are gone, or older than :data:`STALE_SECONDS`."""
    now = time.time()
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for entry in entries:
        m = _TMP_NAME.match(entry.name)
        if m is None:
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
            old = now - entry.stat(follow_symlinks=False).st_mtime > STALE_SECONDS
        except OSError:
            continue
        if old or not _pid_alive(int(m.group(1))):
            shutil.rmtree(entry.path, ignore_errors=True)


def _build_dir(root: Path) -> Path:
    path = root / f"tmp-{os.getpid()}-{secrets.token_hex(6)}"
    os.mkdir(path, 0o700)
    return path


def _expected_seconds(root: Path, nbytes: int) -> float | None:
    """The compile time of ``nbytes`` of C predicted from the kernels stored in ``root`` (the median
    rate of the last 32 builds that recorded theirs), ``None`` before any has."""
    rates = []
    try:
        sides = sorted(root.glob("*.json"), key=lambda p: p.stat().st_mtime)[-32:]
    except OSError:
        return None
    for side in sides:
        try:
            rec = json.loads(side.read_text(encoding="utf-8"))
            if rec.get("source_bytes") and rec.get("compile_seconds") is not None:
                rates.append(rec["compile_seconds"] / rec["source_bytes"])
        except (OSError, ValueError, TypeError, AttributeError):
            continue
    if not rates:
        return None
    rates.sort()
    return rates[len(rates) // 2] * nbytes


def _compile_and_store(cmd: tuple[str, ...], source: str, meta: dict, key: str, digest: str, root: Path,
                       label: str, traced: float = 0.0) -> None:
    """Compile ``source`` and move the library and its sidecar into place (each by an atomic rename)."""
    try:
        tmp = _build_dir(root)
    except OSError as err:
        raise NativeUnavailable(f"{label}: cannot make a build directory in {root}: {err.strerror or err}") from None
    try:
        src, out = tmp / "kernel.c", tmp / "kernel.so"
        src.write_text(source, encoding="utf-8")
        res = None
        start = time.perf_counter()
        for extra in (MVEC_FLAGS, []):
            try:
                res = subprocess.run([*cmd, *FLAGS, *extra, str(src), "-o", str(out), "-lm"], capture_output=True,
                                     text=True, errors="replace", stdin=subprocess.DEVNULL)
            except (OSError, subprocess.SubprocessError) as err:
                raise NativeUnavailable(f"{label}: cannot run the C compiler {shlex.join(cmd)}: {err}") from None
            if res.returncode == 0:
                break
        else:
            tail = (res.stderr or res.stdout)[-2000:]
            raise NativeUnavailable(f"{label}: compiling with {shlex.join(cmd)} failed (exit status "
                                    f"{res.returncode}):\n{tail}")
        os.chmod(out, 0o700)  # whatever the umask: the store refuses files others can write
        data = out.read_bytes()
        record = {"format": STORE_FORMAT, "digest": digest, "key": key, "name": label, "size": len(data),
                  "sha256": hashlib.sha256(data).hexdigest(), "compiler": list(cmd), "flags": FLAGS,
                  "created": time.time(), "meta": meta, "source_bytes": len(source),
                  "compile_seconds": time.perf_counter() - start, "trace_seconds": traced}
        side = tmp / "kernel.json"
        fd = os.open(side, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        # Library first: a process killed between the two renames leaves a sidecar that does not
        # match, which the next load rebuilds.
        os.replace(out, root / f"{digest}.so")
        os.replace(side, root / f"{digest}.json")
    except OSError as err:
        raise NativeUnavailable(f"{label}: cannot build or store the kernel in {root}: {err}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------- loading
# A build still running after this many seconds is announced on the ``diffmech.kernels`` logger.
ANNOUNCE_AFTER = 2.0
_MEMO: dict[str, tuple[ctypes.CDLL, dict]] = {}
# Path -> (st_dev, st_ino) of each library this process loaded: the dynamic loader hands back the
# library loaded earlier under the same name even when the file has been replaced since.
_LOADED: dict[str, tuple[int, int]] = {}


def _dlopen(path: Path, ident: tuple[int, int], symbols: Sequence[str], root: Path) -> ctypes.CDLL:
    """Load a verified library and look up ``symbols`` (OSError or AttributeError on failure)."""
    if _LOADED.get(str(path), ident) == ident:
        lib = ctypes.CDLL(str(path))
        _LOADED[str(path)] = ident
    else:  # a newer file under a name loaded before: load it under a name of its own
        tmp = _build_dir(root)
        try:
            alias = tmp / path.name
            try:
                os.link(path, alias)
            except OSError:
                shutil.copyfile(path, alias)
            lib = ctypes.CDLL(str(alias))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    for s in symbols:
        getattr(lib, s)
    return lib


def load_kernel(key: str, build: Callable[[], tuple[str, dict]] | None, *, name: str = "kernel",
                symbols: Sequence[str] = ("kernel",)) -> tuple[ctypes.CDLL, dict]:
    """The native kernel identified by ``key``, from this process's memo, from disk, or built.

    Args:
        key: the caller's identifier of the kernel; it must determine the C source (the store adds
            the compiler, the CPU and the flags).
        build: called only when no verified kernel is stored: returns the C source and a
            JSON-serialisable dict of metadata, stored beside the library and returned with it.
            ``None``: never build; raise :class:`NotBuilt` when nothing is stored.
        name: the kernel in messages (``"iiwa forward_dynamics float64"``).
        symbols: functions the library must export (checked on load).

    Returns:
        ``(library, meta)``: the loaded library (set ``restype``/``argtypes`` of its functions) and
        the metadata ``build`` returned when the kernel was built (as read back from JSON; shared
        between calls, do not modify it).

    Raises:
        NativeUnavailable: no C compiler; the compile failed (the message ends with the compiler's
            error output); a freshly built library does not load; no cache location is usable.
            Exceptions raised by ``build`` (a ``NativeUnavailable`` for source it cannot generate)
            pass through.
    """
    cmd = _resolve_compiler(os.environ.get("CC"), os.environ.get("PATH")) if fcntl is not None else None
    hit = _MEMO.get(_digest(key, cmd)) if cmd is not None else None
    if hit is not None:
        return hit
    label = f"native kernel '{name}'"
    if cmd is None:
        raise NativeUnavailable(f"{label}: no C compiler (looked for $CC, Python's compiler, cc, gcc on PATH)")
    digest = _digest(key, cmd)
    root = cache_root()
    lib_path = root / f"{digest}.so"
    with _locked(root / f"{digest}.lock", label):
        hit = _MEMO.get(digest)  # another thread of this process got here first
        if hit is not None:
            return hit
        record, ident, _ = _verify(root, digest)
        if record is not None:
            try:
                lib = _dlopen(lib_path, ident, symbols, root)
            except (OSError, AttributeError):
                pass  # built again below, once
            else:
                _MEMO[digest] = (lib, record["meta"])
                return _MEMO[digest]
        if build is None:
            raise NotBuilt(f"{label}: not built yet")
        _remove_stale(root)
        with _announced(label, root) as ann:
            return _build_and_load(build, cmd, key, digest, root, label, symbols, ann)


class _Announcer:
    """Says once that a build is running: when it has run :data:`ANNOUNCE_AFTER` seconds, or earlier
    when its compile alone is expected to take longer; then says when it ends."""

    def __init__(self, label: str, root: Path):
        self.label, self.root = label, root
        self.start = time.perf_counter()
        self._lock = threading.Lock()
        self.said = False

    def say(self, detail: str = "") -> None:
        with self._lock:
            if self.said:
                return
            self.said = True
        _log.show()
        log.info("building %s%s (once on this machine; later runs load it from %s)", self.label, detail, self.root)


@contextlib.contextmanager
def _announced(label: str, root: Path) -> Iterator[_Announcer]:
    ann = _Announcer(label, root)
    timer = threading.Timer(ANNOUNCE_AFTER, ann.say)
    timer.daemon = True
    timer.start()
    try:
        yield ann
    finally:
        timer.cancel()
        if ann.said:
            log.info("%s built in %.1f s", label, time.perf_counter() - ann.start)


def _build_and_load(build: Callable[[], tuple[str, dict]], cmd: tuple[str, ...], key: str, digest: str, root: Path,
                    label: str, symbols: Sequence[str], ann: _Announcer) -> tuple[ctypes.CDLL, dict]:
    """The build step of :func:`load_kernel` (called with the kernel's lock held)."""
    lib_path = root / f"{digest}.so"
    built = build()
    if not (isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], str)
            and isinstance(built[1], dict)):
        raise TypeError(f"{label}: build() must return (C source, dict), not {type(built).__name__}")
    source, meta = built
    try:
        meta = json.loads(json.dumps(meta))  # the same value as a later load reads from the sidecar
    except (TypeError, ValueError) as err:
        raise TypeError(f"{label}: build()'s metadata is not JSON-serialisable: {err}") from None
    expected = _expected_seconds(root, len(source))
    if expected is not None and expected >= ANNOUNCE_AFTER:
        ann.say(f": compiling {len(source) // 1024} kB of C, about {expected:.0f} s")
    _compile_and_store(cmd, source, meta, key, digest, root, label, traced=time.perf_counter() - ann.start)
    record, ident, why = _verify(root, digest)
    if record is None:
        raise NativeUnavailable(f"{label}: {lib_path} changed after it was built ({why})")
    try:
        lib = _dlopen(lib_path, ident, symbols, root)
    except (OSError, AttributeError) as err:
        raise NativeUnavailable(f"{label}: {lib_path}, just built, does not load: {err}") from None
    _MEMO[digest] = (lib, record["meta"])
    return _MEMO[digest]
