"""The on-disk store of native kernels (diffmech.dynamics.kernel_store): damaged, planted or misplaced
files, cache locations that cannot be used, concurrent builds, compilers given with arguments, no
compiler at all, and the cost of a cached load in a fresh process.

Every test keeps its cache under ``tmp_path`` (``$DIFFMECH_CACHE_DIR``, or a passwd home stood in
for), never the user's. The kernel is ``double kernel(double x)`` returning ``2 x``; a result of
``3.0`` for ``1.5`` is the check that the library loaded is a working one.
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
import time
import types
import warnings
from pathlib import Path

import pytest

from diffmech.dynamics import kernel_store as ks
from diffmech.errors import DiffmechError

SOURCE = "double kernel(double x) { return 2.0 * x; }\n"
KEY = "test-kernel-store-double"
SRC_DIR = str(Path(__file__).resolve().parents[1] / "src")

needs_cc = pytest.mark.skipif(not ks.available(), reason="no C compiler")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


class Builds:
    """A ``build`` callback that counts its calls."""

    def __init__(self, source: str = SOURCE, meta: dict | None = None):
        self.source, self.meta, self.n = source, meta if meta is not None else {"what": "double"}, 0

    def __call__(self) -> tuple[str, dict]:
        self.n += 1
        return self.source, self.meta


def run_kernel(lib: ctypes.CDLL, x: float = 1.5) -> float:
    f = lib.kernel
    f.restype, f.argtypes = ctypes.c_double, [ctypes.c_double]
    return f(x)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A fresh cache directory and an empty per-process memo; the kernels directory is returned."""
    monkeypatch.setenv("DIFFMECH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(ks, "_MEMO", {})
    return tmp_path / "cache" / "kernels"


@pytest.fixture
def stored(cache, tmp_path, monkeypatch) -> Path:
    """A cache holding the test kernel that this process has not loaded (as a fresh process finds
    it): built through another directory, then copied. Returns the library's path."""
    monkeypatch.setenv("DIFFMECH_CACHE_DIR", str(tmp_path / "elsewhere"))
    ks.load_kernel(KEY, Builds())
    shutil.copytree(tmp_path / "elsewhere", tmp_path / "cache")
    monkeypatch.setenv("DIFFMECH_CACHE_DIR", str(tmp_path / "cache"))
    ks._MEMO.clear()
    (lib,) = cache.glob("*.so")
    return lib


def kernel_warnings(record) -> list[warnings.WarningMessage]:
    return [w for w in record if issubclass(w.category, ks.KernelCacheWarning)]


# ---------------------------------------------------------------- basics
@needs_cc
def test_build_store_and_memo(cache):
    build = Builds(meta={"shape": (3, 2), "dtype": "float64"})
    lib, meta = ks.load_kernel(KEY, build, name="test double")
    assert run_kernel(lib) == 3.0
    assert meta == {"shape": [3, 2], "dtype": "float64"}  # as read back from JSON on a later load
    assert ks.load_kernel(KEY, build)[0] is lib and build.n == 1  # the per-process memo
    (so,) = cache.glob("*.so")
    record = json.loads(so.with_suffix(".json").read_text())
    assert record["size"] == so.stat().st_size and record["key"] == KEY and record["meta"] == meta
    assert record["compiler"] == ks.compiler_command()
    for p in (cache, cache.parent, so, so.with_suffix(".json")):
        assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, p  # private to the user
    ks._MEMO.clear()  # as a new process: found on disk, build not called
    lib2, meta2 = ks.load_kernel(KEY, build)
    assert build.n == 1 and meta2 == meta and run_kernel(lib2) == 3.0


@needs_cc
def test_compile_error_is_native_unavailable_with_compiler_output(cache):
    with pytest.raises(ks.NativeUnavailable, match=r"(?s)native kernel 'broken'.*compiling.*failed.*error") as err:
        ks.load_kernel("broken", Builds("double kernel(double x) { return x +; }\n"), name="broken")
    assert isinstance(err.value, DiffmechError)
    assert not list(cache.glob("*.so")) and not list(cache.glob("tmp-*"))


@needs_cc
def test_missing_symbol_is_rebuilt_once_then_refused(cache):
    build = Builds("double other(double x) { return x; }\n")
    with pytest.raises(ks.NativeUnavailable, match=r"'nosym'.*\.so.*does not load"):
        ks.load_kernel("nosym", build, name="nosym")
    assert build.n == 1
    with pytest.raises(ks.NativeUnavailable, match=r"'nosym'.*\.so"):  # stored, verified, no symbol: built again
        ks.load_kernel("nosym", build, name="nosym")
    assert build.n == 2


# ---------------------------------------------------------------- damaged files
def _truncate(so: Path) -> None:
    data = so.read_bytes()
    so.unlink()
    so.write_bytes(data[: len(data) // 3])
    so.chmod(0o700)


def _empty(so: Path) -> None:
    so.unlink()
    so.write_bytes(b"")


def _altered(so: Path) -> None:  # same size, one byte changed
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0xFF
    so.unlink()
    so.write_bytes(bytes(data))


def _sidecar_hash(so: Path) -> None:
    side = so.with_suffix(".json")
    record = json.loads(side.read_text())
    record["sha256"] = "0" * 64
    side.write_text(json.dumps(record))


def _no_sidecar(so: Path) -> None:
    so.with_suffix(".json").unlink()


def _sidecar_garbage(so: Path) -> None:
    so.with_suffix(".json").write_bytes(b"\x00{not json")


@needs_cc
@pytest.mark.parametrize("damage", [_truncate, _empty, _altered, _sidecar_hash, _no_sidecar, _sidecar_garbage])
def test_damaged_entry_is_rebuilt_not_loaded(stored, damage):
    damage(stored)
    build = Builds()
    lib, _ = ks.load_kernel(KEY, build)
    assert build.n == 1 and run_kernel(lib) == 3.0
    record = json.loads(stored.with_suffix(".json").read_text())
    assert record["size"] == stored.stat().st_size > 0
    ks._MEMO.clear()  # the rebuilt entry verifies
    ks.load_kernel(KEY, build)
    assert build.n == 1


@needs_cc
def test_file_replaced_after_this_process_loaded_it(cache):
    """The dynamic loader hands back a library by its name: a file rebuilt under a name this process
    loaded before must still be the one that runs."""
    ks.load_kernel(KEY, Builds())
    (so,) = cache.glob("*.so")
    tmp = so.with_name("x")
    tmp.write_bytes(so.read_bytes()[:100])
    os.replace(tmp, so)  # a new file under the old name (the one loaded stays mapped)
    ks._MEMO.clear()
    build = Builds("double kernel(double x) { return 4.0 * x; }\n")  # same key, visibly other code
    lib, _ = ks.load_kernel(KEY, build)
    assert build.n == 1 and run_kernel(lib) == 6.0
    assert not list(cache.glob("tmp-*"))


# ---------------------------------------------------------------- planted files and shared directories
def _chown_so(so: Path) -> None:
    os.chown(so, 12345, 12345)


def _chown_sidecar(so: Path) -> None:
    os.chown(so.with_suffix(".json"), 12345, 12345)


def _world_writable_so(so: Path) -> None:
    so.chmod(0o777)


def _symlinked_so(so: Path) -> None:
    target = so.parent.parent / "planted.so"
    shutil.copy2(so, target)
    so.unlink()
    so.symlink_to(target)


@needs_cc
@pytest.mark.parametrize("plant", [
    pytest.param(_chown_so, marks=needs_root), pytest.param(_chown_sidecar, marks=needs_root),
    _world_writable_so, _symlinked_so])
def test_file_not_private_to_the_user_is_refused(stored, plant):
    plant(stored)  # the content still matches its sidecar: only who can write it is wrong
    build = Builds()
    lib, _ = ks.load_kernel(KEY, build)
    assert build.n == 1 and run_kernel(lib) == 3.0
    st = os.lstat(stored)
    assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


@needs_cc
@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o775])
def test_shared_cache_directory_is_refused_with_one_warning(tmp_path, monkeypatch, mode):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    monkeypatch.setenv("DIFFMECH_CACHE_DIR", str(shared))
    monkeypatch.setattr(ks, "_MEMO", {})
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        lib, _ = ks.load_kernel(KEY, Builds())
        lib2, _ = ks.load_kernel(KEY + "-2", Builds())
        root = ks.cache_root()
    (w,) = kernel_warnings(record)
    assert str(shared) in str(w.message) and "writable by group or others" in str(w.message)
    assert w.filename == __file__  # points at the caller's line, not into diffmech
    assert run_kernel(lib) == 3.0 and run_kernel(lib2) == 3.0
    assert not shared.joinpath("kernels").exists()  # nothing written into the shared directory
    assert root.is_absolute() and not root.is_relative_to(shared)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700 and root.stat().st_uid == os.geteuid()
    assert list(root.glob("*.so"))  # the kernels went to the private directory


@needs_root
def test_cache_directory_of_another_user_is_refused(tmp_path, monkeypatch):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 12345, 12345)
    monkeypatch.setenv("DIFFMECH_CACHE_DIR", str(theirs))
    with pytest.warns(ks.KernelCacheWarning, match="owned by uid 12345"):
        root = ks.cache_root()
    assert not root.is_relative_to(theirs)


@needs_cc
def test_cache_directory_that_cannot_be_created_falls_back(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("DIFFMECH_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(ks, "_MEMO", {})
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        lib, _ = ks.load_kernel(KEY, Builds())
        ks.cache_root()
    (w,) = kernel_warnings(record)
    assert "cannot create it" in str(w.message) and str(blocker / "cache") in str(w.message)
    assert run_kernel(lib) == 3.0


# ---------------------------------------------------------------- location
def test_home_unset_uses_the_password_database(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setattr(ks.pwd, "getpwuid", lambda uid: types.SimpleNamespace(pw_dir=str(home)))
    for var in ("HOME", "DIFFMECH_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    assert ks.cache_root() == home / ".cache" / "diffmech" / "kernels"
    monkeypatch.setenv("HOME", "relative/home")  # not a home either
    assert ks.cache_root() == home / ".cache" / "diffmech" / "kernels"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]  # nothing under the working directory
    for d in (home / ".cache", home / ".cache" / "diffmech", ks.cache_root()):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700


def test_no_home_anywhere_falls_back(tmp_path, monkeypatch):
    def no_entry(uid):
        raise KeyError(uid)

    monkeypatch.setattr(ks.pwd, "getpwuid", no_entry)
    for var in ("HOME", "DIFFMECH_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.warns(ks.KernelCacheWarning, match="password database"):
        root = ks.cache_root()
    assert root.is_absolute() and not root.is_relative_to(tmp_path) and stat.S_IMODE(root.stat().st_mode) == 0o700


def test_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.delenv("DIFFMECH_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert ks.cache_root() == tmp_path / "xdg" / "diffmech" / "kernels"


def test_relative_cache_dir_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DIFFMECH_CACHE_DIR", "rel/cache")
    root = ks.cache_root()
    assert root.is_absolute() and root == tmp_path / "rel" / "cache" / "kernels" and root.is_dir()


# ---------------------------------------------------------------- concurrency and leftovers
def _concurrent_worker(counter: str, barrier, results) -> None:
    def build():
        with open(counter, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(1.0)  # the others reach the lock while this one builds
        return SOURCE, {}

    barrier.wait()
    lib, _ = ks.load_kernel(KEY, build)
    results.put(run_kernel(lib))


@needs_cc
@pytest.mark.slow
def test_concurrent_processes_compile_once(cache, tmp_path):
    counter = tmp_path / "builds.txt"
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_concurrent_worker, args=(str(counter), barrier, results)) for _ in range(3)]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert got == [3.0, 3.0, 3.0]
    assert len(counter.read_text().split()) == 1
    assert len(list(cache.glob("*.so"))) == 1 and not list(cache.glob("tmp-*"))


@needs_cc
def test_concurrent_threads_compile_once(cache):
    build, libs = Builds(), []

    def slow_build():
        time.sleep(0.3)
        return build()

    threads = [threading.Thread(target=lambda: libs.append(ks.load_kernel(KEY, slow_build)[0])) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert build.n == 1 and len(libs) == 3 and all(run_kernel(lib) == 3.0 for lib in libs)


@needs_cc
def test_stale_build_directories_are_removed(cache):
    ks.cache_root()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # reaped: its pid names no process now
    day = 24 * 3600
    dirs = {"dead": cache / f"tmp-{dead.pid}-x", "old": cache / "tmp-1-old", "live": cache / f"tmp-{os.getppid()}-y"}
    for d in dirs.values():
        d.mkdir()
        (d / "kernel.c").write_text("leftover")
    past = time.time() - 2 * day
    os.utime(dirs["old"], (past, past))  # pid 1 is alive, but the directory is two days old
    ks.load_kernel(KEY, Builds())  # a build sweeps
    assert not dirs["dead"].exists() and not dirs["old"].exists()
    assert dirs["live"].exists()  # a build of a living process is left alone


# ---------------------------------------------------------------- compilers
@needs_cc
def test_cc_with_arguments(cache, monkeypatch):
    if shutil.which("env") is None:
        pytest.skip("no env(1)")
    monkeypatch.setenv("CC", "env gcc -DSCALE=3.0")  # as "ccache gcc": a command with arguments
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    cmd = ks.compiler_command()
    assert cmd == [shutil.which("env"), "gcc", "-DSCALE=3.0"]
    lib, _ = ks.load_kernel(KEY, Builds("double kernel(double x) { return SCALE * x; }\n"))
    assert run_kernel(lib) == 4.5  # the argument reached the compiler
    (so,) = cache.glob("*.so")
    assert json.loads(so.with_suffix(".json").read_text())["compiler"] == cmd


def _python(code: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_no_compiler_on_a_stripped_path(tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    env = {"PATH": str(empty), "CC": str(tmp_path / "no-such-cc"), "PYTHONPATH": SRC_DIR,
           "DIFFMECH_CACHE_DIR": str(tmp_path / "cache"), "HOME": str(tmp_path)}
    res = _python("""
        from diffmech.dynamics import kernel_store as ks, native
        assert ks.compiler_command() is None and not ks.available()
        assert native.compiler() is None and not native.available()
        try:
            ks.load_kernel("k", lambda: ("double kernel(double x) { return x; }", {}), name="nocc")
        except ks.NativeUnavailable as err:
            print("refused:", err)
        """, env)
    assert res.returncode == 0, res.stderr
    assert "refused: native kernel 'nocc': no C compiler" in res.stdout


@needs_cc
def test_cached_kernel_loads_fast_in_a_fresh_process(cache):
    ks.load_kernel(KEY, Builds())
    env = {**os.environ, "PYTHONPATH": SRC_DIR, "DIFFMECH_CACHE_DIR": str(cache.parent)}
    res = _python(f"""
        import ctypes, json, time
        from diffmech.dynamics import kernel_store as ks
        def build():
            raise AssertionError("build called for a stored kernel")
        t0 = time.perf_counter()
        lib, meta = ks.load_kernel({KEY!r}, build)
        seconds = time.perf_counter() - t0
        f = lib.kernel
        f.restype, f.argtypes = ctypes.c_double, [ctypes.c_double]
        print(json.dumps({{"seconds": seconds, "result": f(1.5), "meta": meta}}))
        """, env)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    print(f"cached load_kernel in a fresh process: {out['seconds'] * 1e3:.1f} ms")
    assert out["result"] == 3.0 and out["meta"] == {"what": "double"}
    assert out["seconds"] < 0.5
