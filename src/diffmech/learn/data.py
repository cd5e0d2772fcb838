"""Trajectory data sets for learned dynamics, generated from any :class:`~.systems.System`.

The ground truth follows the seed paper's gym environments: every time step of length ``h`` is a
fresh call of SciPy's ``solve_ivp`` with method RK45 (restarted at each step, so the adaptive step
size starts over) on the robot's forward dynamics, with a control ``u`` held constant. Two
engines give the same numbers:

- ``engine="scipy"`` calls :func:`scipy.integrate.solve_ivp` for each trajectory and step (the
  reference; slow, one robot evaluation per right-hand side call);
- ``engine="batched"`` (default) runs the same algorithm -- SciPy's RK45 tableau, initial step
  selection, error norm and step-size controller -- on all trajectories at once, each with its own
  adaptive steps; the right-hand side is one batched robot call. The tests check it against
  ``solve_ivp`` to round-off.

Layout (the seed's): after drawing the reset state ``x0`` the system is stepped ``n_steps + 2``
times and every post-step state is recorded, so ``obs[:, 0]`` is ``x0`` advanced by one step and
``x0`` itself is kept apart (only the "true energy" uses it). ``u[:, k]`` is the control applied
during the step that produced ``obs[:, k]``. States are ``(q, v)`` in the system's coordinates.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import tempfile
import threading
import warnings
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.integrate
import torch
from torch import Tensor

from .._cache import PrivateTempDir, base_dir
from ..errors import DiffmechError, ModelError, SimulationError
from .systems import System, get_system

__all__ = [
    "Trajectories", "SymoDataset", "gym_np_random", "rk45_step_batched", "simulate", "make_dataset",
    "load_dataset", "step_samples", "StepSamples", "cache_dir", "DatasetFileError", "DataCacheWarning",
]


class DatasetFileError(DiffmechError):
    """A data-set file that is truncated, corrupt or fails its checksum (the message names it)."""


class DataCacheWarning(UserWarning):
    """The symo data-set cache could not be used as configured (a corrupt file rebuilt, or a read-only
    or full directory replaced by a private temporary one); results are unaffected, only the time to
    generate the data is paid again."""

# SciPy's RK45 (Dormand-Prince 5(4)) and its step-size controller constants (scipy.integrate._ivp.rk).
_RK = scipy.integrate.RK45
_SAFETY, _MIN_FACTOR, _MAX_FACTOR = 0.9, 0.2, 10.0
_ERR_EXP = -1.0 / (_RK.error_estimator_order + 1)


def gym_np_random(seed: int) -> np.random.RandomState:
    """The ``RandomState`` that gym < 0.22's ``seeding.np_random(seed)`` returns (``env.seed(seed)``).

    gym hashed the seed with SHA-512, kept 8 bytes (padded to 12 by its ``_bigint_from_bytes``) and
    seeded a legacy Mersenne twister with the resulting 32-bit words.
    """
    seed = int(seed) % 2**64
    digest = hashlib.sha512(str(seed).encode("utf8")).digest()[:8]
    digest += b"\0" * (4 - len(digest) % 4)
    words = struct.unpack(f"{len(digest) // 4}I", digest)
    big = sum(w << (32 * i) for i, w in enumerate(words))
    ints = []
    while big > 0:
        big, mod = divmod(big, 2**32)
        ints.append(mod)
    rng = np.random.RandomState()
    rng.seed(ints or [0])
    return rng


def _rms(x: np.ndarray) -> np.ndarray:
    return np.sqrt(np.mean(x * x, axis=-1))


def rk45_step_batched(fun, y0: np.ndarray, t_bound: float, rtol: float = 1e-3, atol: float = 1e-6,
                      max_attempts: int = 100000, legacy: bool = False) -> np.ndarray:
    """``solve_ivp(fun_b, [0, t_bound], y0[b], method="RK45").y[:, -1]`` for every row ``b`` at once.

    Each row keeps its own time, step size and accept/reject state, exactly as SciPy's ``RK45``
    (same tableau, initial step selection, RMS error norm and controller); every attempt evaluates
    ``fun`` on all rows together.

    Args:
        fun: autonomous right-hand side ``(B, d) -> (B, d)`` (rows independent).
        y0: (B, d) float64 initial states.
        t_bound: integration interval length, s.
        rtol, atol: SciPy's tolerances (defaults as ``solve_ivp``'s).
        legacy: the initial step selection of SciPy before 1.11 (as the seed's data were made), which
            did not clip the trial step ``h0`` to the interval; it differs from current SciPy only
            when ``0.01 |y| / |f|`` exceeds the interval (large states, e.g. fast-spinning pendulums
            after tens of turns).

    Returns:
        (B, d) states at ``t_bound``.
    """
    y = np.array(y0, dtype=np.float64)
    nb, d = y.shape
    A, Bw, E = _RK.A, _RK.B, _RK.E
    f = fun(y)
    # select_initial_step (scipy.integrate._ivp.common), per row
    scale = atol + np.abs(y) * rtol
    d0, d1 = _rms(y / scale), _rms(f / scale)
    h0 = np.where((d0 < 1e-5) | (d1 < 1e-5), 1e-6, 0.01 * d0 / np.where(d1 > 0, d1, 1.0))
    if not legacy:
        h0 = np.minimum(h0, t_bound)
    f1 = fun(y + h0[:, None] * f)
    d2 = _rms((f1 - f) / scale) / h0
    dmax = np.maximum(d1, d2)
    with np.errstate(divide="ignore"):
        h1 = np.where((d1 <= 1e-15) & (d2 <= 1e-15), np.maximum(1e-6, h0 * 1e-3),
                      (0.01 / np.where(dmax > 0, dmax, 1.0)) ** (1.0 / (_RK.error_estimator_order + 1)))
    h_abs = np.minimum(100 * h0, h1)
    if not legacy:
        h_abs = np.minimum(h_abs, t_bound)
    t = np.zeros(nb)
    active = np.ones(nb, dtype=bool)
    new_step = np.ones(nb, dtype=bool)
    rejected = np.zeros(nb, dtype=bool)
    min_step = np.zeros(nb)
    K = np.empty((_RK.n_stages + 1, nb, d))
    for _ in range(max_attempts):
        if not active.any():
            return y
        # start of an accepted step: OdeSolver._step_impl clamps h_abs to min_step
        ms = 10 * np.abs(np.nextafter(t, np.inf) - t)
        min_step = np.where(new_step, ms, min_step)
        h_abs = np.where(new_step & (h_abs < min_step), min_step, h_abs)
        rejected = np.where(new_step, False, rejected)
        if (active & (h_abs < min_step)).any():
            b = int(np.argmax(active & (h_abs < min_step)))
            raise SimulationError(f"rk45_step_batched: step size below the minimum in row {b} at t = {t[b]:.6g}")
        t_new = np.minimum(t + h_abs, t_bound)
        h = t_new - t
        h_abs = np.abs(h)
        K[0] = f
        hc = h[:, None]
        for s in range(1, _RK.n_stages):
            dy = np.tensordot(A[s, :s], K[:s], axes=(0, 0)) * hc
            K[s] = fun(y + dy)
        y_new = y + hc * np.tensordot(Bw, K[:-1], axes=(0, 0))
        f_new = fun(y_new)
        K[-1] = f_new
        sc = atol + np.maximum(np.abs(y), np.abs(y_new)) * rtol
        err = _rms(np.tensordot(E, K, axes=(0, 0)) * hc / sc)
        accept = err < 1
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            grow = np.where(err == 0, _MAX_FACTOR, np.minimum(_MAX_FACTOR, _SAFETY * err**_ERR_EXP))
            grow = np.where(rejected, np.minimum(1.0, grow), grow)
            shrink = np.maximum(_MIN_FACTOR, _SAFETY * err**_ERR_EXP)
            h_abs = np.where(accept, h_abs * grow, h_abs * shrink)
        rejected = rejected | ~accept
        take = accept & active
        t = np.where(take, t_new, t)
        y = np.where(take[:, None], y_new, y)
        f = np.where(take[:, None], f_new, f)
        new_step = accept
        active = active & ~(take & (t >= t_bound))
        if not np.isfinite(y[active]).all():
            b = int(np.argmax(active & ~np.isfinite(y).all(1)))
            raise SimulationError(f"rk45_step_batched: non-finite state in row {b} at t = {t[b]:.6g}")
    raise SimulationError(f"rk45_step_batched: more than {max_attempts} step attempts")


def simulate(system: System, x0, u, h: float, *, rtol: float = 1e-3, atol: float = 1e-6,
             engine: str = "batched", legacy: bool = False) -> np.ndarray:
    """Ground truth: ``T`` steps of length ``h``, each a restarted RK45 solve with the control ``u[:, k]``.

    Args:
        system: the :class:`~.systems.System`.
        x0: (B, 2n) initial states ``(q, v)``.
        u: (B, T, nu) controls, held constant over each step.
        h: time step, s.
        rtol, atol: RK45 tolerances (SciPy's defaults reproduce the seed's data).
        engine: ``"batched"`` or ``"scipy"`` (see the module docstring).
        legacy: the batched engine with SciPy < 1.11's initial step (:func:`rk45_step_batched`).

    Returns:
        (B, T, 2n) float64 states after each step.
    """
    x = np.array(x0, dtype=np.float64)
    u = np.asarray(u, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != 2 * system.n or u.ndim != 3 or u.shape[0] != x.shape[0] \
            or u.shape[2] != system.nu:
        raise ModelError(f"simulate({system.name}): x0 {x.shape} must be (B, {2 * system.n}) and u {u.shape} "
                         f"(B, T, {system.nu})")
    out = np.empty((x.shape[0], u.shape[1], x.shape[1]))
    for k in range(u.shape[1]):
        uk = u[:, k]
        if engine == "batched":
            x = rk45_step_batched(lambda y, uk=uk: system.rhs(y, uk), x, h, rtol, atol, legacy=legacy)
        elif engine == "scipy":
            if legacy:
                raise ModelError("simulate: legacy=True needs engine='batched' (the installed SciPy is current)")
            for b in range(x.shape[0]):
                ub = uk[b:b + 1]
                sol = scipy.integrate.solve_ivp(lambda t, y, ub=ub: system.rhs(y[None], ub)[0], [0.0, h], x[b],
                                                method="RK45", rtol=rtol, atol=atol)
                if sol.status != 0:
                    raise SimulationError(f"simulate({system.name}): solve_ivp failed in trajectory {b}, step {k}: "
                                          f"{sol.message}")
                x[b] = sol.y[:, -1]
        else:
            raise ModelError(f"simulate: engine must be 'batched' or 'scipy', got {engine!r}")
        out[:, k] = x
    return out


@dataclass
class Trajectories:
    """Recorded trajectories: ``x0 (N, 2n)`` reset states, ``obs (N, T, 2n)`` post-step states,
    ``u (N, T, nu)`` controls (float64 NumPy arrays)."""

    x0: np.ndarray
    obs: np.ndarray
    u: np.ndarray

    def __len__(self) -> int:
        return self.obs.shape[0]

    def take(self, idx) -> Trajectories:
        return Trajectories(self.x0[idx], self.obs[idx], self.u[idx])


@dataclass
class SymoDataset:
    """Train pool, test set and unforced integration set of one system and time step."""

    system: str
    h: float
    train: Trajectories
    test: Trajectories
    integration: Trajectories
    meta: dict

    def save(self, path) -> None:
        """Write the data set to ``path`` (``.npz``) atomically: a unique temporary file in the same
        folder, renamed into place, so that concurrent writers and readers never see a partial file;
        the temporary file is removed when the write fails (``OSError`` propagates)."""
        path = Path(path)
        arrays = {f"{split}_{k}": np.ascontiguousarray(getattr(getattr(self, split), k))
                  for split in ("train", "test", "integration") for k in ("x0", "obs", "u")}
        meta = json.dumps({"system": self.system, "h": self.h, **self.meta})
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".part", dir=path.parent)
        os.close(fd)
        try:
            with open(tmp, "wb") as f:
                np.savez_compressed(f, meta=meta, checksum=_checksum(meta, arrays), **arrays)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


_SPLIT_KEYS = tuple(f"{s}_{k}" for s in ("train", "test", "integration") for k in ("x0", "obs", "u"))


def _checksum(meta: str, arrays: dict) -> str:
    """SHA-256 of the metadata and of every array's name, dtype, shape and bytes (zip's CRC covers
    only what is read, and not a file whose end is missing)."""
    h = hashlib.sha256(meta.encode())
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        h.update(f"\0{k}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def load_dataset(path) -> SymoDataset:
    """Read a data set written by :meth:`SymoDataset.save`, its checksum verified.

    Raises:
        DatasetFileError: the file is truncated, corrupt, fails its checksum or lacks an entry
            (files written before checksums existed are read without one).
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            names = set(z.files)
            missing = [k for k in ("meta", *_SPLIT_KEYS) if k not in names]
            if missing:
                raise DatasetFileError(f"{path}: not a symo data set (lacks {', '.join(missing)})")
            meta_s = str(z["meta"])
            arrays = {k: z[k] for k in _SPLIT_KEYS}
            stored = str(z["checksum"]) if "checksum" in names else None
    except DatasetFileError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error, KeyError) as exc:
        raise DatasetFileError(f"{path}: unreadable data set ({type(exc).__name__}: {exc}); the file is truncated "
                               "or corrupt") from None
    if stored is not None and stored != _checksum(meta_s, arrays):
        raise DatasetFileError(f"{path}: the data set fails its checksum (altered or corrupt)")
    try:
        meta = json.loads(meta_s)
        system, h = meta.pop("system"), float(meta.pop("h"))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DatasetFileError(f"{path}: the data set's metadata is unreadable ({exc})") from None
    splits = {s: Trajectories(arrays[f"{s}_x0"], arrays[f"{s}_obs"], arrays[f"{s}_u"])
              for s in ("train", "test", "integration")}
    return SymoDataset(system, h, meta=meta, **splits)


def _draw_reset(system: System, rng) -> np.ndarray:
    p = system.preset
    if p.sampler == "gym_pendulum":
        high = np.array([np.pi, 2 * np.pi])
        x = rng.uniform(low=-high, high=high)
    elif p.sampler == "gym_cartpole":
        xc = rng.uniform(low=p.q_range[0][0], high=p.q_range[0][1])
        xd = rng.uniform(low=p.v_range[0][0], high=p.v_range[0][1])
        th = rng.uniform(low=p.q_range[1][0], high=p.q_range[1][1])
        thd = rng.uniform(low=p.v_range[1][0], high=p.v_range[1][1])
        x = np.array([xc, th, xd, thd])
    else:
        lo = np.array([r[0] for r in p.q_range + p.v_range])
        hi = np.array([r[1] for r in p.q_range + p.v_range])
        x = rng.uniform(low=lo, high=hi)
    x = np.asarray(x, dtype=np.float64)
    return x.astype(np.float32).astype(np.float64) if p.reset_float32 else x


def _valid(system: System, obs: np.ndarray) -> np.ndarray:
    lim = np.asarray(system.preset.max_abs or [np.inf] * obs.shape[-1], dtype=np.float64)
    return (np.abs(obs) < lim - 0.001).all(axis=(1, 2)) & np.isfinite(obs).all(axis=(1, 2))


def _make_split(system: System, seed: int, n: int, n_steps: int, h: float, constant_u: bool, rtol, atol, engine,
                rng_kind: str, legacy: bool = False):
    """The seed's ``get_dataset``/``sample_gym``: controls from ``np.random.seed(seed)``, resets from the env RNG."""
    p = system.preset
    T = n_steps + 2
    if constant_u:
        u_factor = np.random.RandomState(seed).uniform(p.u_range[0], p.u_range[1], (n, system.nu))
        u = np.repeat(u_factor[:, None, :], T, axis=1)
    else:
        u = np.zeros((n, T, system.nu))

    def rng_new():
        return gym_np_random(seed) if rng_kind == "gym" else np.random.default_rng(seed)

    rng = rng_new()
    x0 = np.stack([_draw_reset(system, rng) for _ in range(n)]) if n else np.zeros((0, 2 * system.n))
    n_draws = np.arange(1, n + 1)  # draws consumed up to and including each trajectory
    obs = simulate(system, x0, u, h, rtol=rtol, atol=atol, engine=engine, legacy=legacy)
    for _ in range(1000):
        ok = _valid(system, obs)
        if ok.all():
            return Trajectories(x0, obs, u)
        # the seed redraws an invalid trajectory's reset before moving on: replay the RNG
        i = int(np.argmin(ok))
        rng = rng_new()
        for _ in range(int(n_draws[i])):
            _draw_reset(system, rng)
        x0 = x0.copy()
        x0[i:] = np.stack([_draw_reset(system, rng) for _ in range(n - i)])
        n_draws[i:] += 1
        obs[i:] = simulate(system, x0[i:], u[i:], h, rtol=rtol, atol=atol, engine=engine, legacy=legacy)
    raise SimulationError(f"make_dataset({system.name}): could not draw valid trajectories")


def cache_dir() -> Path:
    """``symo`` in diffmech's cache directory: ``$DIFFMECH_CACHE_DIR/symo``, else
    ``$XDG_CACHE_HOME/diffmech/symo``, else ``~/.cache/diffmech/symo`` (see :mod:`diffmech._cache`)."""
    return base_dir() / "symo"


# Where the cache directory cannot be written (read-only, full, a file in the way), this process
# keeps its data sets in a private temporary directory, removed at exit, and warns once per place.
_CACHE_LOCK = threading.Lock()
_FALLBACK = PrivateTempDir("diffmech-symo-")
_WARNED: set[str] = set()


def _warn_once(what: str, message: str) -> None:
    with _CACHE_LOCK:
        if what in _WARNED:
            return
        _WARNED.add(what)
    warnings.warn(message, DataCacheWarning, stacklevel=3)


def _cached(path: Path) -> SymoDataset | None:
    """The data set stored at ``path`` (or in this process's fallback directory), ``None`` when absent;
    a corrupt file is reported once and treated as absent (the caller rebuilds and replaces it)."""
    places = [path] + ([_FALLBACK.current / path.name] if _FALLBACK.current is not None else [])
    for p in places:
        if not p.is_file():
            continue
        try:
            return load_dataset(p)
        except DatasetFileError as exc:
            _warn_once(f"corrupt:{p}", f"symo data cache: {exc}; generating the data set again and replacing it")
    return None


def _store(ds: SymoDataset, path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        ds.save(path)
        return
    except OSError as err:
        why = err.strerror or str(err)
    tmp = _FALLBACK.get()
    _warn_once(f"dir:{path.parent}", f"symo data cache {path.parent} not used ({why}); this process keeps its data "
               f"sets in {tmp}. Set $DIFFMECH_CACHE_DIR to a writable directory to keep them between runs.")
    try:
        ds.save(tmp / path.name)
    except OSError:
        pass  # not even the temporary directory: the data set is used without being stored


def make_dataset(system: str | System, h: float | None = None, *, seed: int = 0, int_seed: int = 1,
                 n_samples: int = 256, n_steps: int = 32, test_split: float = 0.5, n_int: int = 16,
                 int_steps: int = 500, rtol: float | None = None, atol: float | None = None,
                 engine: str = "batched", rng: str | None = None, legacy: bool | None = None,
                 cache: bool | str | Path = True) -> SymoDataset:
    """The seed's data sets for ``system``: train pool, test set (``test_split``) and integration set.

    ``n_samples`` trajectories of ``n_steps + 2`` observations with one constant control each
    (``u ~ U[u_range]``, drawn by ``np.random.seed(seed)``), the first ``n_samples * (1 -
    test_split)`` the training pool and the rest the test set; ``n_int`` unforced trajectories of
    ``int_steps + 2`` observations from ``int_seed``. With ``rng="gym"`` (default for the seed's
    presets) the initial conditions are those of gym's seeded environment, so ``seed=0,
    int_seed=1`` give the seed paper's data sets exactly; ``rng="numpy"`` uses
    ``np.random.default_rng``.

    Args:
        system: preset name or :class:`~.systems.System` (with a preset for the sampler).
        h: time step (default: the preset's).
        rtol, atol: RK45 tolerances (default: the preset's; SciPy's defaults for the seed's systems).
        engine: ``"batched"`` or ``"scipy"``.
        legacy: SciPy < 1.11's RK45 initial step (default: for the seed's presets, whose data it made;
            it matters only for large states, e.g. one fast-spinning pendulum of the integration set).
        cache: reuse/write a ``.npz`` under :func:`cache_dir` (``True``), a given folder, or ``False``.
    """
    sys_ = get_system(system) if isinstance(system, str) else system
    p = sys_.preset
    if p is None:
        raise ModelError(f"make_dataset({sys_.name}): the system needs a SystemPreset (initial condition ranges)")
    h = p.h if h is None else float(h)
    rtol = p.rtol if rtol is None else rtol
    atol = p.atol if atol is None else atol
    rng = rng or ("gym" if p.sampler.startswith("gym") else "numpy")
    legacy = (p.sampler.startswith("gym") and engine == "batched") if legacy is None else legacy
    key = dict(system=sys_.name, h=h, seed=seed, int_seed=int_seed, n_samples=n_samples, n_steps=n_steps,
               test_split=test_split, n_int=n_int, int_steps=int_steps, rtol=rtol, atol=atol, rng=rng,
               legacy=legacy, version=1)
    path = None
    if cache:
        folder = cache_dir() if cache is True else Path(cache)
        digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
        path = folder / f"{sys_.name}_h{h:g}_{digest}.npz"
        found = _cached(path)
        if found is not None:
            return found
    full = _make_split(sys_, seed, n_samples, n_steps, h, True, rtol, atol, engine, rng, legacy)
    split = int(n_samples * test_split)
    train, test = full.take(slice(0, n_samples - split)), full.take(slice(n_samples - split, n_samples))
    integ = _make_split(sys_, int_seed, n_int, int_steps, h, False, rtol, atol, engine, rng, legacy)
    ds = SymoDataset(sys_.name, h, train, test, integ, meta={k: v for k, v in key.items() if k not in ("system", "h")})
    if path is not None:
        _store(ds, path)
    return ds


@dataclass
class StepSamples:
    """One-step samples ``(obs k, obs k+1) -> obs k+2`` of trajectories, flattened trajectory-major.

    All tensors are (M, n) except ``u_*`` (M, nu): positions ``q_prev, q, q_next``, velocities
    ``v`` (at ``q``) and ``v_next``, controls ``u_prev, u, u_next`` of the steps that produced
    ``q_prev``, ``q`` and ``q_next``. NODE/L-NODE map ``(q, v, u)`` to ``(q_next, v_next)``;
    SyMo/E2E-SyMo map ``(q_prev, q, u_prev, u, u_next)`` to ``q_next``.
    """

    q_prev: Tensor
    q: Tensor
    v: Tensor
    q_next: Tensor
    v_next: Tensor
    u_prev: Tensor
    u: Tensor
    u_next: Tensor

    def __len__(self) -> int:
        return self.q.shape[0]

    def index(self, idx) -> StepSamples:
        return StepSamples(*(getattr(self, f)[idx] for f in self.__dataclass_fields__))

    def to(self, **kw) -> StepSamples:
        return StepSamples(*(getattr(self, f).to(**kw) for f in self.__dataclass_fields__))


def step_samples(traj: Trajectories, n: int, *, dtype=torch.float32, device=None) -> StepSamples:
    """Arrange trajectories into :class:`StepSamples` (the seed's ``arrange_*_dataset``), cast to ``dtype``.

    The seed stores its observations as float32, so the float32 default reproduces its inputs.
    """
    kw = dict(dtype=dtype, device=device)
    obs = torch.as_tensor(traj.obs).to(**kw)
    u = torch.as_tensor(traj.u).to(**kw)
    q, v = obs[..., :n], obs[..., n:]

    def flat(x):
        return x.reshape(-1, x.shape[-1])

    return StepSamples(flat(q[:, :-2]), flat(q[:, 1:-1]), flat(v[:, 1:-1]), flat(q[:, 2:]), flat(v[:, 2:]),
                       flat(u[:, :-2]), flat(u[:, 1:-1]), flat(u[:, 2:]))
