"""Contact rollouts: time per step (forward, backward) and memory kept for the backward pass,
``adjoint="checkpoint"`` vs ``adjoint="autograd"``, and MuJoCo on the same scene.

Scenes: ``scenes.laikago`` (a 25.6 kg quadruped standing on four toe spheres, joints held by the
scene's spring-dampers; one robot, and ten in one batch) and ``scenes.racecar`` (the braked car).
The loss is the chassis' final ``x + z`` summed over the batch; its gradient is taken w.r.t. every
commanded torque and the drives' stiffness (laikago) or the friction (racecar). Memory: the bytes
of the tensors autograd saves for the backward pass (``torch.autograd.graph.saved_tensors_hooks``;
for the checkpointed rollout these are the stored states and warm-start impulses it keeps itself,
its ``saved_state_bytes`` stat), not the process's resident set. Both adjoints run interleaved,
one thread, medians of ``--repeats``; the PGS sweeps run in C (the default), and the robot's mass
matrix and bias forces too (native kernels, :func:`prepare_kernels`).

Peers, in the same run: MuJoCo (the ``mujoco`` package) on the same quadruped -- the same URDF with
the same toe spheres as its only collision geometry (colliding with the ground, not with each other),
a free joint, position actuators with the same gains, the ``implicitfast`` integrator, dt 1e-3 --
``mj_step`` per step (looped over the batch) and ``mjd_transitionFD`` (centred finite differences of
one step w.r.t. state and controls), the cost per step of a finite-difference gradient of a rollout.
MJX (``mujoco-mjx``, JAX's CPU backend, one thread, float64) on that same MuJoCo model: ``jax.grad``
through a ``jax.lax.scan`` of ``mjx.step``, the robots batched by ``jax.vmap``, compile times apart,
its trajectory checked against ``mj_step``'s. ``mujoco-torch``: probed, and skipped with the reason
(see :data:`MUJOCO_TORCH_NOTE`). A peer whose package is missing is skipped with one line saying so
(``pip install -e '.[bench]'`` installs them all). Seed (C++, one robot, Table 1-3): forward 0.2 ms
and backward 1.2 ms per step.

Writes ``benchmarks/results/bench_contact.json`` and a section of BENCHMARKS.md; ``--peers`` measures
a subset (e.g. ``--peers mjx``) into ``benchmarks/results/bench_contact.<peers>.json`` (with a
``--batch`` other than ``1,10``: ``bench_contact.<peers>.batch<batch>.json``) and prints its tables
without touching BENCHMARKS.md.

    python benchmarks/bench_contact.py                 # the whole table: about 80 minutes on 2 busy cores
    python benchmarks/bench_contact.py --peers mjx     # MJX alone (its compiles: about 30 minutes)
    python benchmarks/bench_contact.py --steps 50,200 --batch 1 --repeats 1 --no-write
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import io
import json
import os
import platform
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _machine  # noqa: E402
from _markdown import replace_section  # noqa: E402
from diffmech.sim import rollout, scenes  # noqa: E402

MARK_START, MARK_END = "<!-- bench_contact:start -->", "<!-- bench_contact:end -->"
SEED_FWD_MS, SEED_BWD_MS = 0.2, 1.2


def build(scene_name: str, batch: int, device: str = "cpu"):
    p = torch.tensor(1000.0 if scene_name == "laikago" else 0.3, dtype=torch.float64, device=device,
                     requires_grad=True)
    if scene_name == "laikago":
        scene, q0, v0 = scenes.laikago(1, stiffness=p, device=device)
    else:
        scene, q0, v0 = scenes.racecar(p, device=device)
    return scene, q0.expand(batch, -1).clone(), v0.expand(batch, -1).clone(), p


def prepare_kernels() -> float:
    """Build (or load from the disk store) the native rigid-body kernels of the laikago's tree, as a
    user does once with :func:`diffmech.dynamics.kernels.prepare`: the scene's mass matrix, bias
    forces, link kinematics (poses and contact Jacobians) and the floating base's position update
    then run in C (without them, the torch code: several times slower steps), and the step's whole
    first stage -- free velocity, Cholesky factor, the toes' gaps and contact rows -- as one kernel
    (:func:`diffmech.sim.prepare_ground_kernels`). Returns seconds."""
    from diffmech.dynamics import kernels
    from diffmech.sim import prepare_ground_kernels

    t0 = time.perf_counter()
    scene, _, _ = scenes.laikago(1)
    kernels.prepare(scene.models["laikago0"],
                    algorithms=("inverse_dynamics", "mass_matrix", "kinematics", "advance"))
    prepare_ground_kernels(scene)
    return time.perf_counter() - t0


def _sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def run(scene_name: str, adjoint: str, T: int, batch: int, dt: float = 1e-3, device: str = "cpu") -> dict:
    scene, q0, v0, p = build(scene_name, batch, device)
    tau = torch.zeros(batch, T, scene.nv, dtype=torch.float64, device=device, requires_grad=True)
    saved = [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    st: dict = {}
    _sync(device)
    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        qs, vs = rollout(scene, q0, v0, tau, dt, adjoint=adjoint, stats=st)
    _sync(device)
    t1 = time.perf_counter()
    loss = (qs[:, -1, 0] + qs[:, -1, 2]).sum()
    loss.backward()
    _sync(device)
    t2 = time.perf_counter()
    if adjoint == "checkpoint":  # the Function keeps the states and warm starts itself
        saved[0] += st["saved_state_bytes"]
    return {"forward_ms_per_step": 1e3 * (t1 - t0) / T, "backward_ms_per_step": 1e3 * (t2 - t1) / T,
            "saved_bytes": saved[0], "param_grad": float(p.grad), "final_z": float(qs[0, -1, 2].detach())}


def mujoco_laikago(stiffness=1000.0, damping=20.0, dt=1e-3):
    """The laikago of ``scenes.laikago`` as a MuJoCo model, or ``None`` without ``mujoco``."""
    try:
        import mujoco
        import pybullet_data
        from lxml import etree
    except ImportError:
        return None
    path = os.path.join(pybullet_data.getDataPath(), "laikago", "laikago_toes_zup.urdf")
    root = etree.parse(path).getroot()
    for link in root.findall("link"):
        for el in list(link):
            if el.tag in ("visual", "contact") or (el.tag == "collision" and el.find("geometry/mesh") is not None):
                link.remove(el)
    mj = etree.SubElement(root, "mujoco")
    etree.SubElement(mj, "compiler", discardvisual="true", fusestatic="false", balanceinertia="false")
    spec = mujoco.MjSpec.from_string(etree.tostring(root).decode())
    spec.worldbody.bodies[0].add_freejoint()
    # contacts toe--ground only, as in the scene: the toes collide with the plane, not with each other
    for g in spec.geoms:
        g.contype, g.conaffinity = 1, 0
    spec.worldbody.add_geom(type=mujoco.mjtGeom.mjGEOM_PLANE, size=[5, 5, 0.1], contype=0, conaffinity=1)
    spec.option.timestep = dt
    spec.option.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    for j in spec.joints:
        if j.type == mujoco.mjtJoint.mjJNT_HINGE:
            a = spec.add_actuator()
            a.trntype = mujoco.mjtTrn.mjTRN_JOINT
            a.target = j.name
            a.set_to_position(kp=stiffness, kv=damping)
    m = spec.compile()
    return mujoco, m


def run_mujoco(T: int, batch: int) -> dict | None:
    got = mujoco_laikago()
    if got is None:
        return None
    import numpy as np

    mujoco, m = got
    datas = []
    for _ in range(batch):
        d = mujoco.MjData(m)
        d.qpos[2] = 0.518
        mujoco.mj_forward(m, d)
        datas.append(d)
    t0 = time.perf_counter()
    for _ in range(T):
        for d in datas:
            mujoco.mj_step(m, d)
    t1 = time.perf_counter()
    n = 2 * m.nv + m.na
    A, B = np.zeros((n, n)), np.zeros((n, m.nu))
    reps = max(1, min(T, 200))
    t2 = time.perf_counter()
    for _ in range(reps):
        for d in datas:
            mujoco.mjd_transitionFD(m, d, 1e-6, 1, A, B, None, None)
    t3 = time.perf_counter()
    return {"step_ms_per_step": 1e3 * (t1 - t0) / T, "fd_ms_per_step": 1e3 * (t3 - t2) / reps,
            "final_z": float(datas[0].qpos[2]), "version": mujoco.__version__}


def mujoco_trajectory(T: int, dz: float = 0.0):
    """``qpos`` of ``mj_step`` from the standing pose (raised by ``dz``), zero torque: ``(T, nq)``; the
    reference trajectory."""
    import numpy as np

    mujoco, m = mujoco_laikago()
    d = mujoco.MjData(m)
    d.qpos[2] = 0.518 + dz
    mujoco.mj_forward(m, d)
    out = np.empty((T, m.nq))
    for t in range(T):
        mujoco.mj_step(m, d)
        out[t] = d.qpos
    return out


# XLA's CPU backend, one thread (as torch), float64 (as diffmech and MuJoCo); set before jax is imported.
XLA_ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def import_mjx():
    """``(jax, mjx)`` set up for the benchmark, or ``(None, reason)`` when ``mujoco-mjx`` is missing."""
    if "jax" not in sys.modules:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + XLA_ONE_THREAD).strip()
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # mjx prints that the optional warp is absent
            import jax
            from mujoco import mjx
    except ImportError as e:
        return None, f"mujoco-mjx not installed ({e}); pip install -e '.[bench]'"
    jax.config.update("jax_enable_x64", True)
    return jax, mjx


DROP_DZ = 0.05  # m: the trajectory check also starts the robot this much higher (it falls, lands, settles)


class MJXLaikago:
    """The MuJoCo quadruped of :func:`mujoco_laikago` in MJX (its JAX implementation, CPU, float64).

    ``iterations``: the constraint solver's iterations per step, ``None`` for MuJoCo's (100, Newton,
    early stop at its tolerance; ``jax.lax.while_loop``, which reverse mode cannot differentiate).
    ``jax.grad`` needs ``iterations=1``: MJX then takes one Newton step from the warm start (the
    previous step's accelerations) instead of looping -- the workaround MJX's users are given.

    :meth:`rollout` ``(p, tau, d0) -> qpos (B, T, nq)``: ``tau (B, T, nv)`` generalised forces added at
    each step (``qfrc_applied``, as diffmech's commanded torques), ``p`` the drives' stiffness (the
    position actuators' gain, scalar), the robots batched by ``jax.vmap``.
    """

    def __init__(self, iterations: int | None = None):
        self.jax, self.mjx = import_mjx()
        import jax.numpy as jnp
        import mujoco

        _, m = mujoco_laikago()
        if iterations is not None:
            m.opt.iterations = iterations
        self.m, self.jnp = m, jnp
        self.mx = self.mjx.put_model(m, impl="jax")
        self.d1 = {}
        for dz in (0.0, DROP_DZ):  # standing; dropped from DROP_DZ higher (the trajectory check)
            d = mujoco.MjData(m)
            d.qpos[2] = 0.518 + dz
            mujoco.mj_forward(m, d)
            dx = self.mjx.put_data(m, d, impl="jax")
            # put_data's int32 index arrays come out of a step as int64 under x64: scan needs them equal
            shapes = self.jax.eval_shape(self.mjx.step, self.mx, dx)
            self.d1[dz] = self.jax.tree_util.tree_map(lambda a, sh: jnp.asarray(a, sh.dtype), dx, shapes)

    def initial(self, batch: int, dz: float = 0.0):
        return self.jax.tree_util.tree_map(lambda a: self.jnp.broadcast_to(a, (batch,) + a.shape), self.d1[dz])

    def rollout(self, p, tau, d0):
        jax, jnp, mjx = self.jax, self.jnp, self.mjx
        mx = self.mx.replace(actuator_gainprm=jnp.asarray(self.mx.actuator_gainprm).at[:, 0].set(p),
                             actuator_biasprm=jnp.asarray(self.mx.actuator_biasprm).at[:, 1].set(-p))

        def one(tau1, d):
            def body(d, u):
                d = mjx.step(mx, d.replace(qfrc_applied=u))
                return d, d.qpos

            return jax.lax.scan(body, d, tau1)[1]

        return jax.vmap(one)(tau, d0)

    def loss(self, p, tau, d0):
        qs = self.rollout(p, tau, d0)
        return (qs[:, -1, 0] + qs[:, -1, 2]).sum()


def _timed_compile(fn, *args):
    t0 = time.perf_counter()
    compiled = fn.lower(*args).compile()
    return compiled, time.perf_counter() - t0


def _timed_calls(compiled, args, T: int, repeats: int):
    """``(output, median seconds)`` of ``repeats`` calls, after an untimed one for short rollouts (whose
    per-call overhead would otherwise count)."""
    import jax

    if T < 1000:
        jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times)


def run_mjx(T: int, batch: int, models: dict, ref, repeats: int = 1) -> dict:
    """MJX on the quadruped: forward with MuJoCo's solver settings; forward and ``jax.grad`` (w.r.t. every
    torque and the stiffness) with one solver iteration. Compile times apart. ``ref``: ``mj_step``'s
    trajectories for the check (``{dz: (steps, nq)}``, standing and dropped; compared over the first
    ``min(T, steps)`` steps, the drop with one robot only, reusing the compiled functions)."""
    import numpy as np

    full, one = models["full"], models["one"]
    jax, jnp = one.jax, one.jnp
    p = jnp.asarray(1000.0)
    tau = jnp.zeros((batch, T, one.m.nv))
    d0 = one.initial(batch)
    args = (p, tau, d0)
    out = {"version": _version("mujoco-mjx"), "jax": jax.__version__}
    f_full, out["compile_forward_s"] = _timed_compile(jax.jit(full.rollout), *args)
    qs, dt = _timed_calls(f_full, args, T, repeats)
    out["forward_ms_per_step"] = 1e3 * dt / T
    f_one, out["compile_forward_iter1_s"] = _timed_compile(jax.jit(one.rollout), *args)
    qs1, dt = _timed_calls(f_one, args, T, repeats)
    out["forward_iter1_ms_per_step"] = 1e3 * dt / T
    f_grad, out["compile_grad_s"] = _timed_compile(jax.jit(jax.grad(one.loss, argnums=(0, 1))), *args)
    mem = f_grad.memory_analysis()
    out["grad_temp_bytes"] = getattr(mem, "temp_size_in_bytes", None) if mem is not None else None
    (gp, _), dt = _timed_calls(f_grad, args, T, repeats)
    out["grad_ms_per_step"] = 1e3 * dt / T  # jax.grad runs the forward pass and the backward pass
    out["param_grad"], out["final_z"] = float(gp), float(qs[0, -1, 2])
    n = min(T, len(ref[0.0]))
    out["traj_steps"] = n
    out["traj_max_diff"] = float(np.abs(np.asarray(qs[0, :n]) - ref[0.0][:n]).max())
    out["traj_max_diff_iter1"] = float(np.abs(np.asarray(qs1[0, :n]) - ref[0.0][:n]).max())
    if batch == 1:
        drop = (p, tau, full.initial(1, DROP_DZ))
        out["drop_max_diff"] = float(np.abs(np.asarray(f_full(*drop)[0, :n]) - ref[DROP_DZ][:n]).max())
        out["drop_max_diff_iter1"] = float(np.abs(np.asarray(f_one(*drop)[0, :n]) - ref[DROP_DZ][:n]).max())
    return out


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


PEERS = ("diffmech", "mujoco", "mjx", "mujoco-torch")
MUJOCO_TORCH_NOTE = (
    "mujoco-torch 0.2.0 (its latest release) reads `mujoco.mjtEnableBit.mjENBL_MULTICCD` when it is "
    "imported; MuJoCo turned multi-CCD into a disable flag (`mjDSBL_MULTICCD`) between 3.5 and 3.8, so "
    "mujoco-torch fails to import with this project's mujoco 4.0.0 (and with 3.17.0, which mujoco-mjx "
    "3.17.0 needs, and 3.8.0). Tried with mujoco 3.5.0 and torch 2.13.0 outside the project's "
    "environment: it imports and loads the quadruped, but its `step` fails on the `implicitfast` "
    "integrator (`deriv_smooth_vel` calls `torch.where(dyn_mask, d.act, ctrl)` with `d.act` empty, the "
    "position actuators having no activation state: a size mismatch, 12 vs 0, that no torch accepts); "
    "with the Euler integrator instead it runs eagerly (its 21 steps within 6e-13 of `mj_step`'s, "
    "`backward()` through 20 steps works) at about 1 s per step, forward and backward alike, on the "
    "loaded machine -- not the benchmark's model, so not in the table.")


def mujoco_torch_status() -> str | None:
    """Why ``mujoco-torch`` is not measured (``None`` would mean it imports; it has no runner yet)."""
    try:
        import mujoco_torch  # noqa: F401
    except ImportError:
        return "mujoco-torch not installed; pip install -e '.[bench]'"
    except Exception as e:  # it imports mujoco's enums at import time, and fails on a mujoco it predates
        return (f"mujoco-torch {_version('mujoco-torch')} fails to import with mujoco {_version('mujoco')}: "
                f"{type(e).__name__}: {e}")
    return None


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scene", choices=("laikago", "racecar"), default="laikago")
    ap.add_argument("--steps", default="50,500,5000")
    ap.add_argument("--batch", default="1,10")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--peers", default=",".join(PEERS),
                    help="comma-separated subset of " + ",".join(PEERS) + " (default: all). A subset writes "
                    "benchmarks/results/bench_contact.<peers>.json and prints its tables, BENCHMARKS.md untouched")
    ap.add_argument("--mjx-max-s", type=float, default=120.0,
                    help="skip an MJX cell whose gradient, extrapolated from the previous step count, would "
                    "take longer than this (s), or need more than --mjx-max-gb")
    ap.add_argument("--mjx-max-gb", type=float, default=8.0)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    peers = [x.strip() for x in args.peers.split(",") if x.strip()]
    bad = [x for x in peers if x not in PEERS]
    if bad:
        ap.error(f"unknown peer(s) {bad}; choose from {PEERS}")
    if args.scene != "laikago":  # the peers model the quadruped only
        peers = [x for x in peers if x == "diffmech"]
    torch.set_num_threads(1)
    load0 = os.getloadavg()
    t_start = time.perf_counter()
    prepare_kernels()
    skipped = {}
    if "mujoco" in peers and mujoco_laikago() is None:
        skipped["mujoco"] = "mujoco not installed; pip install -e '.[test]'"
    if "mjx" in peers:
        if mujoco_laikago() is None:
            skipped["mjx"] = "mujoco not installed"
        elif import_mjx()[0] is None:
            skipped["mjx"] = import_mjx()[1]
    if "mujoco-torch" in peers:
        skipped["mujoco-torch"] = mujoco_torch_status() or "mujoco-torch imports, but has no runner here yet"
    for peer, why in skipped.items():
        print(f"{peer}: skipped: {why}", flush=True)
    run_peers = [x for x in peers if x not in skipped]
    if "diffmech" in run_peers:
        for adj in ("checkpoint", "autograd"):  # one-time costs (the solver's kernel, first calls) off the clock
            run(args.scene, adj, 5, 1)
    if "mujoco" in run_peers:
        run_mujoco(5, 1)
    steps = sorted(int(x) for x in args.steps.split(","))
    if "mjx" in run_peers:
        ref = {dz: mujoco_trajectory(max(min(steps[-1], 500), 1), dz) for dz in (0.0, DROP_DZ)}
        mjx_models = {"full": MJXLaikago(), "one": MJXLaikago(iterations=1)}
    rows = []
    for batch in [int(x) for x in args.batch.split(",")]:
        prev_mjx = None
        for T in steps:
            row = {"batch": batch, "T": T}
            msg = [f"B={batch} T={T}:"]
            if "diffmech" in run_peers:
                cell = {"checkpoint": [], "autograd": []}
                for _ in range(args.repeats):
                    for adj in ("checkpoint", "autograd"):
                        cell[adj].append(run(args.scene, adj, T, batch))
                for adj, runs in cell.items():
                    row[adj] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                row["grad_agree"] = abs(row["checkpoint"]["param_grad"] - row["autograd"]["param_grad"]) / max(
                    abs(row["autograd"]["param_grad"]), 1e-300)
                c, a = row["checkpoint"], row["autograd"]
                msg.append(f"checkpoint fwd {c['forward_ms_per_step']:.2f} bwd {c['backward_ms_per_step']:.2f} "
                           f"ms/step, saved {c['saved_bytes'] / 1e6:.3f} MB; autograd fwd "
                           f"{a['forward_ms_per_step']:.2f} bwd {a['backward_ms_per_step']:.2f} ms/step, saved "
                           f"{a['saved_bytes'] / 1e6:.1f} MB; grads agree to {row['grad_agree']:.1e};")
            if "mujoco" in run_peers:
                mj = row["mujoco"] = run_mujoco(T, batch)
                msg.append(f"mujoco step {mj['step_ms_per_step']:.3f} fd {mj['fd_ms_per_step']:.2f} ms/step;")
            if "mjx" in run_peers:
                why = None
                if prev_mjx is not None:
                    est_s = prev_mjx["grad_ms_per_step"] * T / 1e3
                    est_gb = (prev_mjx["grad_temp_bytes"] or 0) / prev_mjx["T"] * T / 1e9
                    if est_s > args.mjx_max_s:
                        why = f"its gradient would take about {est_s:.0f} s (> --mjx-max-s {args.mjx_max_s:.0f})"
                    elif est_gb > args.mjx_max_gb:
                        why = f"its gradient would need about {est_gb:.1f} GB (> --mjx-max-gb {args.mjx_max_gb:.0f})"
                if why:
                    row["mjx"] = {"skipped": why}
                    msg.append(f"mjx skipped: {why}")
                else:
                    try:
                        x = row["mjx"] = run_mjx(T, batch, mjx_models, ref, args.repeats)
                    except Exception as e:  # one failed cell does not lose the run's other measurements
                        x = row["mjx"] = {"skipped": f"failed: {type(e).__name__}: {e}"}
                        msg.append(f"mjx {x['skipped']}")
                if "skipped" not in row.get("mjx", {"skipped": 1}):
                    x["T"] = T
                    prev_mjx = x
                    msg.append(f"mjx fwd {x['forward_ms_per_step']:.3f}, 1 iteration fwd "
                               f"{x['forward_iter1_ms_per_step']:.3f} fwd+bwd {x['grad_ms_per_step']:.3f} ms/step "
                               f"(compile {x['compile_forward_s']:.0f} / {x['compile_forward_iter1_s']:.0f} / "
                               f"{x['compile_grad_s']:.0f} s), max |q - mj_step| over {x['traj_steps']} steps "
                               f"{x['traj_max_diff']:.1e} ({x['traj_max_diff_iter1']:.1e} with 1 iteration)"
                               + (f"; dropped from {DROP_DZ * 100:.0f} cm higher {x['drop_max_diff']:.1e} "
                                  f"({x['drop_max_diff_iter1']:.1e})" if "drop_max_diff" in x else ""))
            rows.append(row)
            print(" ".join(msg), flush=True)
    rep = {"scene": args.scene, "peers": peers, "skipped": skipped, "rows": rows, "load_before": load0,
           "load_after": os.getloadavg(), "wall_s": time.perf_counter() - t_start,
           "machine": _machine.machine(ROOT, 1, ["src/diffmech", "benchmarks/bench_contact.py"],
                                       mujoco=_version("mujoco"), mujoco_mjx=_version("mujoco-mjx"),
                                       jax=_version("jax"), mujoco_torch=_version("mujoco-torch")),
           "date": datetime.datetime.now().isoformat(timespec="seconds"),
           "torch": torch.__version__, "python": platform.python_version(),
           "args": " ".join(sys.argv[1:] if argv is None else argv)}
    full = set(peers) == set(PEERS) or args.scene != "laikago"
    if not args.no_write:
        # a subset of the peers, or of the robot counts, gets a file of its own (runs of other subsets stay)
        name = ("bench_contact.json" if full else "bench_contact." + "+".join(peers)
                + ("" if args.batch == "1,10" else ".batch" + args.batch.replace(",", "+")) + ".json")
        with open(os.path.join(ROOT, "benchmarks", "results", name), "w") as f:
            json.dump(rep, f, indent=2)
    text = "\n".join(markdown(rep))
    if not full:
        print(text)
    if not args.no_write:
        if full:
            replace_section(os.path.join(ROOT, "BENCHMARKS.md"), text, MARK_START, MARK_END)
    return rep


def markdown(rep: dict) -> list[str]:
    load0, mc = rep["load_before"], rep.get("machine", {})
    peers = rep.get("peers", ["diffmech", "mujoco"])
    machine = (f"{mc['cpu']}, {mc['cores']} cores shared with other jobs, commit {mc['commit']}"
               if mc else "2 cores shared with other jobs")
    lines = [MARK_START, "## Contact rollouts", "",
             f"_Generated by `python benchmarks/bench_contact.py{(' ' + rep['args']) if rep['args'] else ''}` on "
             f"{rep['date']} ({rep['wall_s']:.0f} s); {machine}; torch {rep['torch']}, one thread"
             + (f"; mujoco {mc['mujoco']}, mujoco-mjx {mc['mujoco_mjx']} on jax {mc['jax']} (CPU, one thread, "
                "float64)" if mc else "")
             + f"; load average at the start {load0[0]:.1f}, at the end {rep['load_after'][0]:.1f}._", "",
             "> Measured while other jobs loaded the 2 cores: absolute times are inflated and noisy; the libraries "
             "ran one after another within each cell, so their ratios are less affected.", "",
             f"Scene `scenes.{rep['scene']}`, dt 1e-3, float64, zero commanded torque; loss: the chassis' final "
             "x + z summed over the batch, gradient w.r.t. every torque and the drives' stiffness (laikago) or "
             "the friction (racecar). Saved = bytes kept for the backward pass. Per robot = the step's time "
             "divided by the batch. MuJoCo: the same quadruped (same URDF, the toe spheres as its only "
             "collision geometry and colliding with the ground only, position actuators with the same gains, "
             "`implicitfast`), `mj_step` looped over the batch, and `mjd_transitionFD` (one step's derivatives "
             "by centred differences: what a finite-difference gradient of a rollout costs per step). Seed "
             f"(C++, one robot): forward {SEED_FWD_MS} and backward {SEED_BWD_MS} ms per step.", ""]
    if "diffmech" in peers:
        lines += ["| robots | steps | ckpt fwd ms/step | ckpt bwd ms/step | bwd/fwd | ckpt saved (MB) | autograd fwd "
                  "| autograd bwd | autograd saved (MB) | ckpt fwd+bwd per robot (ms) | vs seed (1.4 ms) "
                  "| MuJoCo mj_step per robot (ms) | MuJoCo FD derivs per robot (ms) | ckpt fwd+bwd / MuJoCo FD "
                  "| grad diff (rel) |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rep["rows"]:
            c, a, mj, B = r["checkpoint"], r["autograd"], r.get("mujoco"), r["batch"]
            both = (c["forward_ms_per_step"] + c["backward_ms_per_step"]) / B
            mj_cells = (f"{mj['step_ms_per_step'] / B:.3f} | {mj['fd_ms_per_step'] / B:.2f} | "
                        f"{both / (mj['fd_ms_per_step'] / B):.2g}x" if mj else "- | - | -")
            lines.append(f"| {B} | {r['T']} | {c['forward_ms_per_step']:.3f} | {c['backward_ms_per_step']:.3f} | "
                         f"{c['backward_ms_per_step'] / c['forward_ms_per_step']:.1f} | "
                         f"{c['saved_bytes'] / 1e6:.3f} | {a['forward_ms_per_step']:.2f} | "
                         f"{a['backward_ms_per_step']:.2f} | {a['saved_bytes'] / 1e6:.1f} | {both:.3f} | "
                         f"{both / (SEED_FWD_MS + SEED_BWD_MS):.2g}x | {mj_cells} | {r['grad_agree']:.1e} |")
        lines.append("")
    if any("mjx" in r for r in rep["rows"]):
        lines += mjx_markdown(rep)
    for peer, why in rep.get("skipped", {}).items():
        lines.append(f"- {peer}: not measured: {why}" + (f". {MUJOCO_TORCH_NOTE}" if peer == "mujoco-torch"
                                                          else ""))
    lines.append(MARK_END)
    return lines


def mjx_markdown(rep: dict) -> list[str]:
    lines = ["### MJX: `jax.grad` through `jax.lax.scan` of `mjx.step`", "",
             "The MuJoCo model above in MJX's JAX implementation (`mjx.put_model(m, impl=\"jax\")`), `jax.jit`, "
             "CPU backend, one thread, float64; the robots batched by `jax.vmap`. The torques enter as "
             "`qfrc_applied`, the stiffness as the actuators' gain. *fwd*: MuJoCo's own solver settings "
             "(Newton, up to 100 iterations with early stop): a `jax.lax.while_loop`, which `jax.grad` cannot "
             "reverse. *1 it*: `opt.iterations = 1` (one Newton step from the warm start), the setting MJX "
             "needs for `jax.grad`; *fwd+bwd*: `jax.jit(jax.grad(loss))` with it, the forward pass included. "
             "Compile: lowering and compiling each function once for that shape (off the per-step clock). "
             "Grad temp: XLA's temporary buffers of the compiled gradient (what it keeps for the backward "
             "pass, and scratch). *q diff*: max |qpos - mj_step's qpos| (m, and quaternion and joint "
             "angles in rad) over the first steps (robot 0), standing as timed, and, with one robot, "
             f"dropped from {DROP_DZ * 100:.0f} cm above the standing height (it falls, lands on its "
             "toes and settles: contacts made and broken). "
             "Ratios: diffmech's time (checkpointed adjoint) / MJX's, in the same cell of the same run; "
             "above 1 MJX is faster.", "",
             "| robots | steps | MJX fwd ms/step | MJX fwd, 1 it | MJX fwd+bwd, 1 it | fwd+bwd per robot (ms) "
             "| diffmech fwd / MJX fwd | diffmech fwd+bwd / MJX fwd+bwd | grad temp (MB) "
             "| compile fwd / 1 it / grad (s) | q diff vs mj_step, standing (fwd / 1 it) "
             "| q diff vs mj_step, dropped (fwd / 1 it) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rep["rows"]:
        x, c, B = r.get("mjx"), r.get("checkpoint"), r["batch"]
        if x is None:
            continue
        if "skipped" in x:
            lines.append(f"| {B} | {r['T']} | skipped: {x['skipped']} ||||||||||")
            continue
        if c:
            fwd_ratio = f"{c['forward_ms_per_step'] / x['forward_ms_per_step']:.2g}x"
            both_ratio = f"{(c['forward_ms_per_step'] + c['backward_ms_per_step']) / x['grad_ms_per_step']:.2g}x"
        else:
            fwd_ratio = both_ratio = "-"
        mem = f"{x['grad_temp_bytes'] / 1e6:.1f}" if x.get("grad_temp_bytes") is not None else "n/a"
        lines.append(f"| {B} | {r['T']} | {x['forward_ms_per_step']:.3f} | {x['forward_iter1_ms_per_step']:.3f} | "
                     f"{x['grad_ms_per_step']:.3f} | {x['grad_ms_per_step'] / B:.3f} | {fwd_ratio} | {both_ratio} | "
                     f"{mem} | {x['compile_forward_s']:.0f} / {x['compile_forward_iter1_s']:.0f} / "
                     f"{x['compile_grad_s']:.0f} | {x['traj_max_diff']:.1e} / {x['traj_max_diff_iter1']:.1e} "
                     f"({x['traj_steps']} steps) | "
                     + (f"{x['drop_max_diff']:.1e} / {x['drop_max_diff_iter1']:.1e} |" if "drop_max_diff" in x
                        else "- |"))
    lines.append("")
    return lines


if __name__ == "__main__":
    main()
