"""The symo data-set cache is as safe as the kernel store (issue 35, item 7): unique temporary names,
atomic rename, a checksum verified on load, a fallback for a read-only or full directory, nothing left
behind on failure."""

from __future__ import annotations

import errno
import multiprocessing as mp
import warnings

import numpy as np
import pytest

from diffmech._cache import PrivateTempDir
from diffmech.learn import data
from diffmech.learn.data import DataCacheWarning, DatasetFileError, load_dataset, make_dataset

TINY = dict(n_samples=8, n_steps=4, n_int=2, int_steps=10)


def _files(folder):
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def _same(a, b) -> bool:
    return all(np.array_equal(getattr(getattr(a, s), k), getattr(getattr(b, s), k))
               for s in ("train", "test", "integration") for k in ("x0", "obs", "u"))


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    # each test sees its own "warn once" state and fallback directory
    monkeypatch.setattr(data, "_WARNED", set())
    monkeypatch.setattr(data, "_FALLBACK", PrivateTempDir("diffmech-symo-test-"))


def test_truncated_file_is_rebuilt_with_one_warning(tmp_path):
    ref = make_dataset("pendulum", cache=tmp_path, **TINY)
    (path,) = tmp_path.glob("*.npz")
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DatasetFileError, match=str(path)):
        load_dataset(path)
    with pytest.warns(DataCacheWarning, match="truncated or corrupt") as rec:
        again = make_dataset("pendulum", cache=tmp_path, **TINY)
    assert len([w for w in rec if issubclass(w.category, DataCacheWarning)]) == 1
    assert _same(ref, again)
    assert _same(ref, load_dataset(path))  # replaced by a good file
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_dataset("pendulum", cache=tmp_path, **TINY)  # and read without a word
    assert _files(tmp_path) == [path.name]


def test_altered_file_fails_its_checksum(tmp_path):
    ds = make_dataset("pendulum", cache=False, **TINY)
    path = tmp_path / "d.npz"
    ds.save(path)
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["train_obs"] = arrays["train_obs"] + 1e-12
    np.savez_compressed(path, **arrays)
    with pytest.raises(DatasetFileError, match="checksum"):
        load_dataset(path)


def test_unwritable_cache_dir_falls_back_with_one_warning(tmp_path, monkeypatch):
    # a read-only directory (as root, chmod does not stop writes: the write itself is made to fail)
    cache = tmp_path / "cache"
    cache.mkdir()
    real = data.tempfile.mkstemp

    def mkstemp(*args, dir=None, **kw):
        if dir is not None and str(dir).startswith(str(cache)):
            raise OSError(errno.EROFS, "Read-only file system")
        return real(*args, dir=dir, **kw)

    monkeypatch.setattr(data.tempfile, "mkstemp", mkstemp)
    with pytest.warns(DataCacheWarning, match="Read-only file system") as rec:
        a = make_dataset("pendulum", cache=cache, **TINY)
        b = make_dataset("pendulum", cache=cache, **TINY)  # found in the fallback, no second warning
    assert len([w for w in rec if issubclass(w.category, DataCacheWarning)]) == 1
    assert _same(a, b)
    assert _files(cache) == []
    assert len(list(data._FALLBACK.current.glob("*.npz"))) == 1


def test_cache_dir_that_is_a_file_falls_back(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.warns(DataCacheWarning, match="not used"):
        ds = make_dataset("pendulum", cache=blocker / "symo", **TINY)
    assert len(ds.train) == 4


def test_full_disk_leaves_no_temporary_file(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    real = np.savez_compressed

    def savez(file, *args, **kw):
        if str(getattr(file, "name", file)).startswith(str(cache)):
            file.write(b"PK\x03\x04 partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(file, *args, **kw)

    monkeypatch.setattr(data.np, "savez_compressed", savez)
    with pytest.warns(DataCacheWarning, match="No space left on device"):
        make_dataset("pendulum", cache=cache, **TINY)
    assert _files(cache) == []  # neither a partial data set nor a temporary file


def _writer(folder: str, barrier) -> str:
    barrier.wait()
    ds = make_dataset("pendulum", cache=folder, **TINY)
    return str(ds.train.obs.sum())


def test_four_concurrent_writers_all_succeed(tmp_path):
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(4)
        with ctx.Pool(4) as pool:
            sums = pool.starmap(_writer, [(str(tmp_path), barrier)] * 4)
    assert len(set(sums)) == 1
    (path,) = tmp_path.glob("*.npz")
    assert _files(tmp_path) == [path.name]  # no temporary files left
    assert str(load_dataset(path).train.obs.sum()) == sums[0]
