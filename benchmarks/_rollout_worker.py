"""One cell of ``bench_rollout.py``, run in a fresh process so its peak memory is its own.

Usage::

    python benchmarks/_rollout_worker.py '{"method": "checkpoint", "robot": "iiwa", "batch": 1, "T": 100}'

prints one JSON line with the forward and backward wall and CPU times (s), the peak
resident-memory growth of the timed forward + backward (bytes), and a fingerprint of the result
(final state, loss, gradient norm) that the driver compares across methods. A JSON list of cells
runs them one after the other in the same process (the quick mode's shortcut: the peak counter is
reset per cell, but memory the allocator kept from an earlier cell can hide part of a later one).

Methods:

* ``checkpoint``: ``diffmech.sim.rollout(..., adjoint="checkpoint", checkpoint_every=k)``;
* ``autograd``: ``diffmech.sim.rollout(..., adjoint="autograd")``;
* ``compiled``: ``diffmech.sim.rollout(..., adjoint="checkpoint", compile=True)``: each step and each
  reverse step is one ``torch.compile``'d function (the warm-up call compiles; its time is reported
  as ``warmup_s``);
* ``drm``: differentiable-robot-model's ``compute_forward_dynamics`` (float64, joint damping on)
  inside the same semi-implicit Euler loop (``v += dt a; q += dt v``), backpropagated by plain
  autograd. Fixed-base robots only: differentiable-robot-model has no floating base.

Every method computes the same loss, the sum of squared generalized positions over all ``T + 1``
states, and the gradient with respect to ``q0``, ``v0`` and the torques ``tau (B, T, nv)``.

Peak memory: after building the model, one short warm-up rollout with backward (which
allocates the lazily built caches and thread pools) and, for diffmech's methods, one rollout of the
measured length (the first call of a given length grows Python's and the allocator's arenas by a few
MiB that every later call reuses), the kernel's peak-RSS
counter is reset (``/proc/self/clear_refs`` = 5, Linux >= 4.0) and the growth is
``VmHWM - VmRSS`` read after the backward pass. Where the reset is not allowed, the growth is
``ru_maxrss`` after minus before (an underestimate if the warm-up peaked higher).
"""

from __future__ import annotations

import gc
import json
import os
import resource
import statistics
import sys
import time
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))

ROBOTS = ("iiwa", "laikago")
METHODS = ("checkpoint", "autograd", "drm", "compiled")


def robot_path(name: str) -> tuple[str, bool]:
    """URDF path and floating-base flag of a benchmark robot."""
    if name == "iiwa":
        import diff_robot_data

        return os.path.join(diff_robot_data.__path__[0], "kuka_iiwa/urdf/iiwa7.urdf"), False
    if name == "laikago":
        import pybullet_data

        return os.path.join(pybullet_data.getDataPath(), "laikago/laikago_toes_zup.urdf"), True
    raise ValueError(f"unknown robot '{name}'; choose from {ROBOTS}")


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _maxrss_bytes() -> int:
    # ru_maxrss is KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def initial_state(robot, batch: int, seed: int):
    """Reproducible ``q0 (batch, nq)``, ``v0 (batch, nv)`` for a benchmark robot.

    Fixed base: a random configuration within the limits, at rest. Floating base: the base at
    the origin with identity orientation, joints at random angles in [-0.3, 0.3] rad, and a small
    random velocity (no contacts and zero torques would otherwise leave the joints still in free
    fall).
    """
    g = torch.Generator().manual_seed(seed)
    dt = robot.dtype
    if not robot.floating_base:
        q0 = robot.random_configuration(batch, generator=g)
        v0 = torch.zeros(batch, robot.nv, dtype=dt)
        return q0, v0
    q0 = robot.neutral_configuration().expand(batch, robot.nq).clone()
    q0[:, 2] = 0.5
    q0[:, 7:] = 0.6 * torch.rand(batch, robot.nq - 7, generator=g, dtype=dt) - 0.3
    v0 = 0.5 * (2 * torch.rand(batch, robot.nv, generator=g, dtype=dt) - 1)
    return q0, v0


def _diffmech_runner(robot, method: str, k: int, dt: float):
    import diffmech.sim

    adjoint = "autograd" if method == "autograd" else "checkpoint"
    compile = method == "compiled"

    def run(q0, v0, tau, stats=None):
        Q, _ = diffmech.sim.rollout(robot, q0, v0, tau, dt, adjoint=adjoint, checkpoint_every=k, stats=stats,
                                    compile=compile)
        return Q

    return run


def _drm_runner(path: str, dt: float):
    import logging

    from differentiable_robot_model import DifferentiableRobotModel

    sys.path.insert(0, HERE)
    from _peers import drm_float64  # the float64 switch shared with bench_dynamics

    logging.getLogger("urdf_parser_py").setLevel(logging.ERROR)
    with warnings.catch_warnings(), drm_float64(True, building=True):
        warnings.simplefilter("ignore")
        model = DifferentiableRobotModel(path, device="cpu")

    def run(q0, v0, tau, stats=None):
        with drm_float64(True):
            q, v = q0, v0
            qs = [q]
            for i in range(tau.shape[1]):
                # compute_forward_dynamics subtracts the damping from its force argument in place:
                # hand it a fresh tensor, not a view of the leaf ``tau``.
                a = model.compute_forward_dynamics(q, v, tau[:, i].clone(), include_gravity=True, use_damping=True)
                v = v + dt * a
                q = q + dt * v
                qs.append(q)
            return torch.stack(qs, 1)

    return run


# A cell whose forward + backward takes less than this is repeated (at most MAX_REPEATS runs in all),
# and its times are the medians.
REPEAT_BUDGET_S = 1.0
MAX_REPEATS = 7


def run_cell(cfg: dict) -> dict:
    """Measure one cell; see the module docstring for ``cfg`` keys and the result."""
    method, robot_name = cfg["method"], cfg["robot"]
    B, T, k = int(cfg.get("batch", 1)), int(cfg["T"]), int(cfg.get("k", 1))
    dt, seed = float(cfg.get("dt", 1e-3)), int(cfg.get("seed", 0))
    torch.set_num_threads(int(cfg.get("threads", 2)))
    if method not in METHODS:
        raise ValueError(f"unknown method '{method}'; choose from {METHODS}")

    import diffmech

    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\._inductor")
    path, floating = robot_path(robot_name)
    robot = diffmech.load_urdf(path, floating_base=floating, dtype=torch.float64)
    if method == "drm":
        if floating:
            raise ValueError("differentiable-robot-model has no floating base")
        run = _drm_runner(path, dt)
    else:
        run = _diffmech_runner(robot, method, k, dt)
    q0, v0 = initial_state(robot, B, seed)

    def cell(steps: int):
        qa = q0.clone().requires_grad_(True)
        va = v0.clone().requires_grad_(True)
        tau = torch.zeros(B, steps, robot.nv, dtype=torch.float64, requires_grad=True)
        stats: dict = {}
        c0, t0 = time.process_time(), time.perf_counter()
        Q = run(qa, va, tau, stats)
        loss = (Q**2).sum()
        c1, t1 = time.process_time(), time.perf_counter()
        loss.backward()
        c2, t2 = time.process_time(), time.perf_counter()
        times = {"forward_s": t1 - t0, "backward_s": t2 - t1, "forward_cpu_s": c1 - c0, "backward_cpu_s": c2 - c1}
        return times, stats, Q.detach()[:, -1], loss.detach(), (qa.grad, va.grad, tau.grad)

    w0 = time.perf_counter()
    cell(min(T, 3))  # warm-up: lazy caches, thread pool (and compilation)
    warmup = time.perf_counter() - w0
    if method != "drm":
        # The first rollout of a given length grows Python's and the allocator's arenas by a few MiB
        # that later calls reuse; a training loop sees the steady state, so measure a repeated call.
        # (DRM's growth is two orders of magnitude larger than this, and its full-length warm-up
        # would cost minutes.)
        cell(T)
    gc.collect()
    reset = _reset_peak()
    rss0 = (_status_kib("VmRSS") or 0) * 1024
    maxrss0 = _maxrss_bytes()
    times, stats, q_last, loss, grads = cell(T)
    if reset and _status_kib("VmHWM") is not None:
        growth = _status_kib("VmHWM") * 1024 - rss0
        how = "VmHWM after clear_refs"
    else:
        growth = _maxrss_bytes() - maxrss0
        how = "ru_maxrss difference"
    # Short cells repeat (the memory comes from the first run): a single run of a few ms is noisy.
    reps = [times]
    spent = times["forward_s"] + times["backward_s"]
    while spent < REPEAT_BUDGET_S and len(reps) < MAX_REPEATS:
        reps.append(cell(T)[0])
        spent += reps[-1]["forward_s"] + reps[-1]["backward_s"]
    times = {key: statistics.median(r[key] for r in reps) for key in reps[0]}
    times["repetitions"] = len(reps)
    gnorm = float(torch.sqrt(sum((g**2).sum() for g in grads)))
    return {
        **cfg, "batch": B, "T": T, "k": k, "dt": dt,
        **times, "warmup_s": warmup, "peak_growth_bytes": int(growth), "memory_method": how,
        "rss_before_bytes": int(rss0), "loss": float(loss), "grad_norm": gnorm,
        "saved_state_bytes": stats.get("saved_state_bytes"), "recomputed_steps": stats.get("recomputed_steps"),
        "q_last": q_last[0].tolist(), "finite": bool(torch.isfinite(q_last).all()) and bool(gnorm == gnorm),
    }


def main(argv: list[str]) -> int:
    """Run the cell (a JSON object) or the cells (a JSON list, in one process) given as the argument."""
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    cells = json.loads(argv[0])
    for cfg in cells if isinstance(cells, list) else [cells]:
        print(json.dumps(run_cell(cfg)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
