"""Environment steps per second of the n-link reaching task: diffmech with gradients vs MuJoCo.

diffmech: :class:`diffmech.rl.NLinkReach` with ``num_envs`` = 1, 64 and 4096 parallel pendulums
(float32, the task's defaults: dt 1/60 s, semi-implicit Euler, native forward-dynamics kernels on
the CPU), stepped ``--steps`` times (one episode, 100) with an open-loop action tensor that requires
grad, then the gradient of the summed reward w.r.t. every action (``backward()``): *with gradients*
is the time of the forward steps plus the backward pass; *no graph* is the same steps under
:func:`torch.no_grad`. An environment step is one pendulum advanced by one step, so a call of
``env.step`` on ``N`` environments counts ``N`` steps.

MuJoCo: the same pendulum built with ``mujoco.MjSpec`` (hinges about ``+y``, a solid sphere bob of
the same mass and radius at the end of every massless link, motors of gear ``max_torque`` with
controls in ``[-1, 1]``, contacts off, the ``Euler`` integrator -- semi-implicit Euler, as
diffmech's -- dt 1/60 s, float64), the same open-loop controls rolled out by ``mujoco.rollout``
over ``--mj-threads`` threads and over one thread: steps only, no gradients, no reward. Before the
timings, both simulators roll out the same random torques from the same start and the largest
difference of the joint angles (diffmech in float64 there) is recorded.

The Ant (:class:`diffmech.rl.Ant`, float64, frame skip 5 x 0.01 s, hard contacts by projected
Gauss-Seidel) likewise with ``--ant-batches`` parallel Ants and ``--ant-steps`` steps (a fifth of them above
1,024 Ants, whose graph keeps every substep's contact Jacobians), against its
MuJoCo twin (:func:`diffmech.rl.transplant.mujoco_ant`: same geometry, masses, joints and motors,
``Euler``, 0.01 s, soft contacts; each control held for 5 MuJoCo steps) through ``mujoco.rollout``.

Writes ``benchmarks/results/bench_rl.json`` and the "Reinforcement-learning environments" section
of BENCHMARKS.md.

    python benchmarks/bench_rl.py                    # the recorded run (about 3 minutes on 2 busy cores)
    python benchmarks/bench_rl.py --quick            # seconds; writes nothing
    python benchmarks/bench_rl.py --from-json benchmarks/results/bench_rl.json   # re-render the section
    python benchmarks/bench_rl.py --ant-only --repeats 2   # only the Ant rows, into the existing JSON
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, HERE)

import _machine  # noqa: E402
from _markdown import replace_section, stamp  # noqa: E402
from diffmech.rl import Ant, NLinkReach  # noqa: E402

MARK_START, MARK_END = "<!-- bench_rl:start -->", "<!-- bench_rl:end -->"


# ---------------------------------------------------------------------- MuJoCo's pendulum
def mujoco_pendulum(env: NLinkReach):
    """The pendulum of ``env`` as a compiled ``mujoco.MjModel`` (see the module docstring).

    The bobs take their mass and radius from ``env.robot`` (the solid sphere of
    :func:`diffmech.model.systems.n_link_pendulum`, whose rotational inertia ``0.4 m r^2`` MuJoCo
    computes from the sphere geom as well).
    """
    import mujoco

    spec = mujoco.MjSpec()
    spec.modelname = f"{env.links}_link_reach"
    spec.option.timestep = env.dt
    spec.option.gravity = [0.0, 0.0, -9.81]
    spec.option.integrator = mujoco.mjtIntegrator.mjINT_EULER
    spec.option.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_CONTACT)
    parent, pos = spec.worldbody, [0.0, 0.0, 0.0]
    for i in range(env.links):
        mass, com, inertia = (x.detach().double().cpu() for x in env.robot.link_params(f"link{i + 1}").inertial())
        radius = float((inertia[0, 0] / (0.4 * mass)).sqrt())  # the sphere's 0.4 m r^2
        L = -float(com[2])
        body = parent.add_body(name=f"link{i + 1}", pos=pos)
        body.add_joint(name=f"joint{i + 1}", type=mujoco.mjtJoint.mjJNT_HINGE, axis=[0.0, 1.0, 0.0])
        body.add_geom(type=mujoco.mjtGeom.mjGEOM_SPHERE, size=[radius, 0, 0], pos=[0.0, 0.0, -L], mass=float(mass))
        act = spec.add_actuator(name=f"motor{i + 1}", target=f"joint{i + 1}",
                                trntype=mujoco.mjtTrn.mjTRN_JOINT)
        act.gear[0] = float(env.max_torque[i])
        act.ctrllimited = True
        act.ctrlrange = [-1.0, 1.0]
        parent, pos = body, [0.0, 0.0, -L]
    parent.add_site(name="tip", pos=[0.0, 0.0, -L])
    return spec.compile()


def mujoco_state(model, q: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Full physics states ``(B, nstate)`` of ``model`` at joint angles ``q (B, n)``, rates ``v (B, n)``."""
    import mujoco

    data = mujoco.MjData(model)
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    out = np.empty((q.shape[0], mujoco.mj_stateSize(model, spec)))
    for b in range(q.shape[0]):
        data.qpos[:], data.qvel[:] = q[b], v[b]
        mujoco.mj_getState(model, data, out[b], spec)
    return out


def agreement(links: int, steps: int, seed: int = 0) -> dict:
    """The largest ``|q_diffmech - q_mujoco|`` (rad) over ``steps`` steps of the same random controls from
    the task's start (diffmech in float64), and at step 10."""
    import mujoco
    from mujoco import rollout

    env = NLinkReach(links, num_envs=1, dtype=torch.float64)
    model = mujoco_pendulum(env)
    g = torch.Generator().manual_seed(seed)
    a = 2 * torch.rand(steps, 1, links, generator=g, dtype=torch.float64) - 1
    env.reset()
    qs = []
    for k in range(steps):
        qs.append(env.step(a[k]).final_q[0].numpy())
    q0, v0 = env.initial_state(1)
    state, _ = rollout.rollout(model, mujoco.MjData(model), mujoco_state(model, q0.numpy(), v0.numpy()),
                               a.permute(1, 0, 2).numpy())
    q_mj = state[0, :, 1:1 + model.nq]  # mjSTATE_FULLPHYSICS: time, qpos, qvel, ...
    diff = np.abs(np.stack(qs) - q_mj)
    return {"links": links, "steps": steps, "max_abs_q_diff": float(diff.max()),
            "max_abs_q_diff_10": float(diff[:10].max())}


# ---------------------------------------------------------------------- timings
def time_diffmech(env: NLinkReach, actions: torch.Tensor, grad: bool) -> tuple[float, float]:
    """Wall-clock and CPU seconds (the process's, all threads) for ``actions.shape[0]`` steps of every
    environment (and the backward pass when ``grad``)."""
    env.reset()
    t0, c0 = time.perf_counter(), time.process_time()
    if grad:
        a = actions.detach().requires_grad_(True)
        total = 0.0
        for k in range(a.shape[0]):
            total = total + env.step(a[k]).reward.sum()
        total.backward()
        assert a.grad is not None and bool(torch.isfinite(a.grad).all())
    else:
        with torch.no_grad():
            for k in range(actions.shape[0]):
                env.step(actions[k])
    if env.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, time.process_time() - c0


def time_mujoco(model, datas: list, initial: np.ndarray, control: np.ndarray, pool=None) -> tuple[float, float]:
    """Wall-clock and CPU seconds (all threads) of one ``mujoco.rollout`` of ``control (B, T, nu)`` from
    ``initial (B, nstate)``: over the thread pool ``pool`` (a ``mujoco.rollout.Rollout`` made beforehand,
    one ``MjData`` per thread in ``datas``), or on the calling thread when ``pool`` is ``None``."""
    from mujoco import rollout

    state = np.ones((control.shape[0], control.shape[1], initial.shape[1]))  # its pages touched beforehand
    t0, c0 = time.perf_counter(), time.process_time()
    if pool is None:
        rollout.rollout(model, datas[0], initial, control, state=state)
    else:
        pool.rollout(model, datas, initial, control, state=state)
    return time.perf_counter() - t0, time.process_time() - c0


def gymnasium_ant(batch: int):
    """gymnasium's own MuJoCo Ant (``Ant-v5``: its ``ant.xml``, RK4 at 0.01 s, frame skip 5), one
    environment or a ``SyncVectorEnv`` of ``batch``; ``None`` when gymnasium's MuJoCo environments do not
    import (they need the ``mujoco`` and ``imageio`` packages)."""
    try:
        import gymnasium
        if batch == 1:
            return gymnasium.make("Ant-v5")
        return gymnasium.make_vec("Ant-v5", num_envs=batch, vectorization_mode="sync")
    except Exception as e:  # noqa: BLE001 - any import or registration failure means "not installable here"
        print(f"gymnasium's Ant-v5 not available: {type(e).__name__}: {e}", flush=True)
        return None


def time_gymnasium(genv, actions: np.ndarray) -> tuple[float, float]:
    """Wall-clock and CPU seconds of ``actions.shape[0]`` steps of gymnasium's environment ``genv`` (one
    environment: finished episodes reset inside the timing, as a vector environment's autoreset does)."""
    genv.reset(seed=0)
    vector = actions.ndim == 3 and hasattr(genv, "num_envs")
    t0, c0 = time.perf_counter(), time.process_time()
    for k in range(actions.shape[0]):
        if vector:
            genv.step(actions[k])
        else:
            _, _, term, trunc, _ = genv.step(actions[k, 0])
            if term or trunc:
                genv.reset()
    return time.perf_counter() - t0, time.process_time() - c0


def _time_interleaved(env, actions, model, initial, control, mj_threads: int, repeats: int, extra=None):
    """Wall and CPU seconds of each variant -- diffmech with and without gradients, MuJoCo's
    ``rollout`` with a thread pool made once (as a training loop would keep it) and, with more than
    one thread, without one, and the timers in ``extra`` (name -> function) -- after one warm-up call
    each (kernels, thread pools), ``repeats`` times interleaved so that a load change hits every column
    alike."""
    import mujoco
    from mujoco import rollout

    datas = [mujoco.MjData(model) for _ in range(mj_threads)]
    pool = rollout.Rollout(nthread=mj_threads)
    kinds = {"grad": lambda: time_diffmech(env, actions, True),
             "nograd": lambda: time_diffmech(env, actions, False),
             "mujoco": lambda: time_mujoco(model, datas, initial, control, pool),
             "mujoco_1": lambda: time_mujoco(model, datas, initial, control)}
    if mj_threads == 1:
        kinds.pop("mujoco_1")
    kinds.update(extra or {})
    for f in kinds.values():
        f()
    times: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(repeats):
        for k, f in kinds.items():
            w, c = f()
            times[k].append(w)
            cpu[k].append(c)
    pool.close()
    return kinds, times, cpu


def measure(links: int, batch: int, steps: int, repeats: int, mj_threads: int, device: str) -> dict:
    env = NLinkReach(links, num_envs=batch, device=device)
    g = torch.Generator().manual_seed(batch)
    actions = (2 * torch.rand(steps, batch, links, generator=g) - 1).to(env.device)
    model = mujoco_pendulum(env)
    q0, v0 = env.initial_state(batch)
    initial = mujoco_state(model, q0.cpu().double().numpy(), v0.cpu().double().numpy())
    control = np.ascontiguousarray(actions.permute(1, 0, 2).cpu().double().numpy())

    kinds, times, cpu = _time_interleaved(env, actions, model, initial, control, mj_threads, repeats)
    cell = {"links": links, "batch": batch, "steps": steps}
    for k, ts in times.items():
        med = statistics.median(ts)
        cell[f"{k}_s"], cell[f"{k}_all_s"] = med, ts
        cell[f"{k}_steps_per_s"] = batch * steps / med
        cell[f"{k}_cpu_s"], cell[f"{k}_cpu_all_s"] = statistics.median(cpu[k]), cpu[k]
        cell[f"{k}_steps_per_cpu_s"] = batch * steps / max(cell[f"{k}_cpu_s"], 1e-9)
    # the faster MuJoCo variant per cell: a thread pool only pays off on a large batch (and on a loaded
    # machine a pool waits for every one of its threads)
    best = max(("mujoco", "mujoco_1") if "mujoco_1" in kinds else ("mujoco",), key=lambda k: cell[f"{k}_steps_per_s"])
    cell["mujoco_best"] = best
    cell["mujoco_best_steps_per_s"] = cell[f"{best}_steps_per_s"]
    cell["mujoco_over_grad"] = cell["mujoco_best_steps_per_s"] / cell["grad_steps_per_s"]
    cell["mujoco_over_nograd"] = cell["mujoco_best_steps_per_s"] / cell["nograd_steps_per_s"]
    fastest_mj = min(min(times[k]) for k in kinds if k.startswith("mujoco"))
    cell["mujoco_over_grad_fastest"] = min(times["grad"]) / fastest_mj
    cell["grad_over_nograd_time"] = cell["grad_s"] / cell["nograd_s"]
    # per CPU-second, single thread against single thread: what a loaded machine's wall clock blurs
    mj_cpu = "mujoco_1" if "mujoco_1" in kinds else "mujoco"
    cell["mujoco_over_grad_cpu"] = cell[f"{mj_cpu}_steps_per_cpu_s"] / cell["grad_steps_per_cpu_s"]
    return cell


def _summarise(cell: dict, kinds: dict, times: dict, cpu: dict, n_steps: int) -> dict:
    for k, ts in times.items():
        med = statistics.median(ts)
        cell[f"{k}_s"], cell[f"{k}_all_s"] = med, ts
        cell[f"{k}_steps_per_s"] = n_steps / med
        cell[f"{k}_cpu_s"], cell[f"{k}_cpu_all_s"] = statistics.median(cpu[k]), cpu[k]
        cell[f"{k}_steps_per_cpu_s"] = n_steps / max(cell[f"{k}_cpu_s"], 1e-9)
    best = max(("mujoco", "mujoco_1") if "mujoco_1" in kinds else ("mujoco",), key=lambda k: cell[f"{k}_steps_per_s"])
    cell["mujoco_best"] = best
    cell["mujoco_best_steps_per_s"] = cell[f"{best}_steps_per_s"]
    cell["mujoco_over_grad"] = cell["mujoco_best_steps_per_s"] / cell["grad_steps_per_s"]
    cell["mujoco_over_nograd"] = cell["mujoco_best_steps_per_s"] / cell["nograd_steps_per_s"]
    cell["grad_over_nograd_time"] = cell["grad_s"] / cell["nograd_s"]
    mj_cpu = "mujoco_1" if "mujoco_1" in kinds else "mujoco"
    cell["mujoco_over_grad_cpu"] = cell[f"{mj_cpu}_steps_per_cpu_s"] / cell["grad_steps_per_cpu_s"]
    return cell


ANT_BIG = 1024  # more Ants than this: a fifth of the rollout's steps, and no gymnasium vector env


def measure_ant(batch: int, steps: int, repeats: int, mj_threads: int, device: str) -> dict:
    """Env steps per second of ``batch`` Ants for ``steps`` steps: diffmech with gradients and without a graph,
    MuJoCo's twin through ``mujoco.rollout`` (controls held for ``frame_skip`` MuJoCo steps)."""
    import mujoco

    from diffmech.rl.transplant import diffmech_to_mujoco_state, mujoco_ant

    env = Ant(batch, seed=batch, device=device)
    g = torch.Generator().manual_seed(batch)
    actions = (2 * torch.rand(steps, batch, env.act_dim, generator=g, dtype=env.dtype) - 1).to(env.device)
    model = mujoco_ant(env.geometry, timestep=env.sim_dt)
    q0, v0 = env.initial_state(batch)
    qpos, qvel = diffmech_to_mujoco_state(q0.cpu().numpy(), v0.cpu().numpy())
    data = mujoco.MjData(model)
    spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
    initial = np.empty((batch, mujoco.mj_stateSize(model, spec)))
    for b in range(batch):
        mujoco.mj_resetData(model, data)
        data.qpos[:], data.qvel[:] = qpos[b], qvel[b]
        mujoco.mj_getState(model, data, initial[b], spec)
    control = np.ascontiguousarray(np.repeat(actions.permute(1, 0, 2).cpu().numpy(), env.frame_skip, axis=1))
    genv = gymnasium_ant(batch) if batch <= ANT_BIG else None  # thousands of gymnasium envs: not built
    extra = {}
    if genv is not None:
        acts = np.ascontiguousarray(actions.cpu().numpy())
        extra["gymnasium"] = lambda: time_gymnasium(genv, acts)
    kinds, times, cpu = _time_interleaved(env, actions, model, initial, control, mj_threads, repeats, extra)
    if genv is not None:
        genv.close()
    cell = _summarise({"batch": batch, "steps": steps, "frame_skip": env.frame_skip, "sim_dt": env.sim_dt},
                      kinds, times, cpu, batch * steps)
    if "gymnasium" in kinds:
        cell["gymnasium_over_grad"] = cell["gymnasium_steps_per_s"] / cell["grad_steps_per_s"]
        cell["gymnasium_over_grad_cpu"] = cell["gymnasium_steps_per_cpu_s"] / cell["grad_steps_per_cpu_s"]
    return cell


def ant_section(rep: dict) -> list[str]:
    """The Ant's table (empty when the run measured none)."""
    cells = rep.get("ant_cells") or []
    if not cells:
        return []
    mj = rep["mj_threads"]
    a = rep.get("ant_agreement", {})
    lines = ["", "### The Ant", "",
             f"_Measured by `python benchmarks/bench_rl.py{rep.get('ant_args', rep.get('args', ''))}` on "
             f"{rep.get('ant_date', rep['machine']['date'])}; load average (1 min) at its start "
             f"{rep.get('ant_load_before', rep['load_before'])[0]:.1f}._", "",
             f"`diffmech.rl.Ant` (float64, {cells[0]['frame_skip']} substeps of {cells[0]['sim_dt']} s per step, hard "
             "contacts by projected Gauss-Seidel warm-started from the last substep, joint limits), "
             f"{cells[0]['steps']} steps of uniform random actions from the task's start states (the robot drops "
             "0.3 m onto its feet): "
             "*with gradients* = the steps with a graph plus `backward()` of the summed reward to every action. "
             "MuJoCo: the Ant's twin built by `diffmech.rl.transplant.mujoco_ant` (same geometry and masses, `Euler`, "
             f"0.01 s, soft contacts), the same controls held for 5 MuJoCo steps, `mujoco.rollout` on {mj} threads "
             "and on one, no gradients. gymnasium's `Ant-v5` (where it imports): its own model (`ant.xml`: RK4 "
             "at 0.01 s, frame skip 5, another torso and leg geometry, soft contacts), the same actions through "
             "`env.step` (one environment) or a `SyncVectorEnv`, resets included, no gradients: what an RL user "
             "steps today.", "",
             "| Ants | diffmech with gradients (steps/s) | diffmech no graph (steps/s) | "
             f"MuJoCo rollout, {mj} threads (steps/s) | MuJoCo rollout, 1 thread (steps/s) | "
             "MuJoCo (the faster) / diffmech with gradients | MuJoCo / diffmech no graph | "
             "per CPU-second: MuJoCo 1 thread / diffmech with gradients |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    gym = any("gymnasium_steps_per_s" in c for c in cells)
    if gym:
        lines[-2] = lines[-2][:-1] + ("| gymnasium `Ant-v5` (steps/s) | gymnasium / diffmech with gradients | "
                                      "per CPU-second: gymnasium / diffmech with gradients |")
        lines[-1] += "---:|---:|---:|"
    for c in cells:
        one = _rate(c["mujoco_1_steps_per_s"]) if "mujoco_1_steps_per_s" in c else "n/a"
        label = f"{c['batch']}" + (f" ({c['steps']} steps)" if c["steps"] != cells[0]["steps"] else "")
        row = (f"| {label} | {_rate(c['grad_steps_per_s'])} | {_rate(c['nograd_steps_per_s'])} | "
               f"{_rate(c['mujoco_steps_per_s'])} | {one} | {_ratio(c['mujoco_over_grad'])} | "
               f"{_ratio(c['mujoco_over_nograd'])} | {_ratio(c['mujoco_over_grad_cpu'])} |")
        if gym:
            row += (f" {_rate(c['gymnasium_steps_per_s'])} | {_ratio(c['gymnasium_over_grad'])} | "
                    f"{_ratio(c['gymnasium_over_grad_cpu'])} |"
                    if "gymnasium_steps_per_s" in c else " n/a | n/a | n/a |")
        lines.append(row)
    per = ", ".join(f"{c['batch']} Ant(s): {_ratio(c['mujoco_over_grad_cpu'])}" for c in cells)
    cost = ", ".join(f"{c['grad_over_nograd_time']:.1f}x at {c['batch']}" for c in cells)
    lines += ["", f"What the ratios say: per CPU-second MuJoCo (no gradient) takes more Ant steps than diffmech with "
                  f"gradients by {per}; the wall-clock ratios above carry the machine's load. A diffmech step is "
                  "5 contact solves, each a Python-level assembly of the contact rows, a dense Delassus matrix and "
                  "projected Gauss-Seidel sweeps; the batch amortises that dispatch (64 Ants cost a few times one), "
                  f"and the gradient (the backward pass through the implicit contact solution) costs {cost} Ants "
                  "the time of the steps without a graph."]
    skipped = rep.get("ant_skipped")
    if skipped:
        lines += ["", skipped]
    big = [c for c in cells if c["batch"] > ANT_BIG]
    if big:
        lines += ["", f"{', '.join(str(c['batch']) for c in big)} Ants: {big[0]['steps']} steps per rollout, the "
                      "graph of a longer one would keep every substep's contact Jacobian J and M^-1 J^T "
                      "(2 x 4096 x 60 x 14 in float64: 55 MB a substep with 20 candidates); gymnasium's vector env of "
                      "that many Ants is not built (n/a)."]
    if a:
        lines += ["", f"Same robot: under zero action from the same start both fall identically until a foot touches "
                      f"(largest position difference {a['max_abs_dq_before_contact']:.1e} before "
                      f"{a['first_contact_s']:.2f} s); 0.5 s in, the torso stands at {a['final_z_diffmech']:.4f} m in "
                      f"diffmech (hard contacts; the geometry's {a['rest_z_expected']:.4f} m) and "
                      f"{a['final_z_mujoco']:.4f} m in MuJoCo, whose soft contacts let the feet sink and slide."]
    return lines


# ---------------------------------------------------------------------- report
def _rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def _ratio(x: float) -> str:
    return f"{x:,.0f}x" if x >= 10 else f"{x:.2f}x"


def markdown(rep: dict) -> str:
    m = rep["machine"]
    mj = rep["mj_threads"]
    la, lb = rep["load_before"], rep["load_after"]
    lines = [MARK_START, "## Reinforcement-learning environments (n-link reaching)", "",
             f"_Generated by `python benchmarks/bench_rl.py{rep.get('args', '')}` on {m['date']} "
             f"({rep['wall_s']:.0f} s); {m['cpu']}, {m['cores']} cores shared with other jobs, torch {m['torch']}, "
             f"MuJoCo {m.get('mujoco', '?')}, `torch.set_num_threads({m['threads']})`, device {rep['device']}, "
             f"Python {m['python']}, commit {m['commit']}; load average (1 min) at the start {la[0]:.1f}, "
             f"at the end {lb[0]:.1f}._", "",
             "Environment steps per second (pendulums x steps / time) of `diffmech.rl.NLinkReach` (float32, "
             f"dt 1/60 s, "
             f"semi-implicit Euler, native kernels), {rep['steps']} steps of open-loop actions from the task's start: "
             "*with gradients* = the steps with a graph plus `backward()` of the summed reward to every action; "
             "*no graph* = the steps under `torch.no_grad()`. MuJoCo: the same pendulum built with `mujoco.MjSpec` "
             "(same bobs, motors, `Euler` integrator, dt 1/60 s, float64), the same controls through "
             f"`mujoco.rollout` on {mj} threads and on one thread, no gradients. Medians of {rep['repeats']} "
             "interleaved repeats after a warm-up (the JSON keeps every repeat).", "",
             "| links | pendulums | diffmech with gradients (steps/s) | diffmech no graph (steps/s) | "
             f"MuJoCo rollout, {mj} threads (steps/s) | MuJoCo rollout, 1 thread (steps/s) | "
             "MuJoCo (the faster) / diffmech with gradients | same, fastest repeats | "
             "MuJoCo (the faster) / diffmech no graph | with gradients / no graph (time) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in rep["cells"]:
        one = _rate(c["mujoco_1_steps_per_s"]) if "mujoco_1_steps_per_s" in c else "n/a"
        lines.append(f"| {c['links']} | {c['batch']} | {_rate(c['grad_steps_per_s'])} | "
                     f"{_rate(c['nograd_steps_per_s'])} | {_rate(c['mujoco_steps_per_s'])} | {one} | "
                     f"{_ratio(c['mujoco_over_grad'])} | {_ratio(c['mujoco_over_grad_fastest'])} | "
                     f"{_ratio(c['mujoco_over_nograd'])} | {c['grad_over_nograd_time']:.2f} |")
    lines += ["", "The same runs per CPU-second (the process's CPU time, all threads; on a machine shared with other "
                  "jobs the wall clock also counts the time the process waited for a core, longer runs more often, "
                  "so these are the steadier comparison), single thread against single thread:", "",
              "| links | pendulums | diffmech with gradients (steps/CPU-s) | diffmech no graph (steps/CPU-s) | "
              "MuJoCo rollout, 1 thread (steps/CPU-s) | MuJoCo / diffmech with gradients | "
              "MuJoCo / diffmech no graph |",
              "|---:|---:|---:|---:|---:|---:|---:|"]
    for c in rep["cells"]:
        mj_key = "mujoco_1" if "mujoco_1_steps_per_cpu_s" in c else "mujoco"
        mjc = c[f"{mj_key}_steps_per_cpu_s"]
        lines.append(f"| {c['links']} | {c['batch']} | {_rate(c['grad_steps_per_cpu_s'])} | "
                     f"{_rate(c['nograd_steps_per_cpu_s'])} | {_rate(mjc)} | "
                     f"{_ratio(mjc / c['grad_steps_per_cpu_s'])} | {_ratio(mjc / c['nograd_steps_per_cpu_s'])} |")
    big = max(c["batch"] for c in rep["cells"])
    at_big = ", ".join(f"{c['links']} links: {_ratio(c['mujoco_over_grad'])} (per CPU-second "
                       f"{_ratio(c['mujoco_over_grad_cpu'])})" for c in rep["cells"] if c["batch"] == big)
    small = min(c["batch"] for c in rep["cells"])
    at_small = ", ".join(f"{c['links']} links: {_ratio(c['mujoco_over_grad'])} (per CPU-second "
                         f"{_ratio(c['mujoco_over_grad_cpu'])})" for c in rep["cells"] if c["batch"] == small)
    agree = "; ".join(f"{a['links']} links: {a['max_abs_q_diff_10']:.1e} rad over 10 steps, "
                      f"{a['max_abs_q_diff']:.1e} rad over {a['steps']}" for a in rep["agreement"])
    lines += ["", "Same dynamics: the joint angles of diffmech (float64 here) and MuJoCo under the same random "
                  f"controls from the start differ by at most {agree} (the swing is chaotic, so round-off grows "
                  "along the episode).", "",
              "What the ratios say (a ratio below 1: diffmech with gradients takes more steps per second than "
              f"MuJoCo without): at {small} pendulum(s) MuJoCo is ahead by {at_small}; diffmech pays the Python and "
              "torch dispatch of every call, about the same for one pendulum as for thousands, while MuJoCo's C "
              f"loop has no such cost. At {big} pendulums the batch amortises it: {at_big}. MuJoCo computes no "
              "gradient here; a finite-difference gradient of the same rollout would cost it at least `2 x links` "
              "more rollouts per action (see *Contact rollouts* for `mjd_transitionFD`).", "",
              f"Raw data: `{rep.get('json_path', 'benchmarks/results/bench_rl.json')}`."]
    lines += ant_section(rep)
    if not any("gymnasium_steps_per_s" in c for c in rep.get("ant_cells") or []):
        lines += ["", "Not measured: gymnasium's own MuJoCo Ant (it did not import in this run)."]
    lines += ["", "GPU: see *diffmech on a GPU vs on the CPU cores of the same machine*.", MARK_END]
    return "\n".join(lines)


def update_markdown(path: str, section: str) -> None:
    replace_section(path, section, MARK_START, MARK_END)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 links, 1 and 64 pendulums, 20 steps; writes nothing")
    ap.add_argument("--links", default="2,7", help="comma-separated link counts (default %(default)s)")
    ap.add_argument("--batches", default="1,64,4096", help="comma-separated numbers of pendulums (default %(default)s)")
    ap.add_argument("--steps", type=int, default=100, help="steps per rollout (default %(default)s, one episode)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default %(default)s)")
    ap.add_argument("--mj-threads", type=int, default=None, help="mujoco.rollout threads (default: the CPU count)")
    ap.add_argument("--device", default="cpu", help="diffmech's torch device (default %(default)s)")
    ap.add_argument("--json", default=None, help="results file (default benchmarks/results/bench_rl.json)")
    ap.add_argument("--markdown", default=None, help="markdown file to update (default BENCHMARKS.md); 'none' skips")
    ap.add_argument("--from-json", default=None, metavar="JSON", help="only re-render the markdown from a results file")
    ap.add_argument("--ant-batches", default="1,64,4096",
                    help="numbers of Ants (default %(default)s; '' skips the Ant; more than 1024 Ants roll out a "
                    "fifth of --ant-steps, without gymnasium's Ant)")
    ap.add_argument("--ant-steps", type=int, default=20, help="Ant steps per rollout (default %(default)s, 1 s)")
    ap.add_argument("--ant-only", action="store_true",
                    help="measure only the Ant and merge its rows into the existing results file")
    args = ap.parse_args(argv)
    md = args.markdown or ("none" if args.quick else os.path.join(ROOT, "BENCHMARKS.md"))
    if args.from_json:
        with open(args.from_json) as f:
            rep = json.load(f)
        update_markdown(md if md != "none" else os.path.join(ROOT, "BENCHMARKS.md"), markdown(rep))
        return rep
    import mujoco

    t_start, load_before = time.perf_counter(), os.getloadavg()
    torch.set_num_threads(args.threads)
    if args.ant_only:
        return _ant_only(args, argv, md, t_start, load_before)
    links = [2] if args.quick else [int(x) for x in args.links.split(",")]
    batches = [1, 64] if args.quick else [int(x) for x in args.batches.split(",")]
    steps = 20 if args.quick else args.steps
    repeats = 1 if args.quick else args.repeats
    mj_threads = args.mj_threads or os.cpu_count() or 1
    rep = {"steps": steps, "repeats": repeats, "mj_threads": mj_threads, "device": args.device,
           "agreement": [agreement(n, steps) for n in links], "cells": []}
    for a in rep["agreement"]:
        print(f"agreement, {a['links']} links: max |dq| {a['max_abs_q_diff_10']:.1e} (10 steps), "
              f"{a['max_abs_q_diff']:.1e} ({a['steps']} steps)", flush=True)
    for n in links:
        for b in batches:
            c = measure(n, b, steps, repeats, mj_threads, args.device)
            rep["cells"].append(c)
            print(f"links {n} x{b:<5d} grad {_rate(c['grad_steps_per_s']):>10s}  nograd "
                  f"{_rate(c['nograd_steps_per_s']):>10s}  mujoco({mj_threads}) {_rate(c['mujoco_steps_per_s']):>12s}  "
                  f"ratio {_ratio(c['mujoco_over_grad'])} / {_ratio(c['mujoco_over_nograd'])}", flush=True)
    _measure_ants(rep, args, "1" if args.quick else args.ant_batches, 2 if args.quick else args.ant_steps, repeats,
                  mj_threads)
    rep["machine"] = _machine.machine(ROOT, args.threads, ["src", "benchmarks/bench_rl.py"], mujoco=mujoco.__version__)
    json_path = args.json or (None if args.quick else os.path.join(HERE, "results", "bench_rl.json"))
    if json_path == "none":
        json_path = None
    stamp(rep, argv=argv, json_path=json_path, root=ROOT, load_before=load_before, t_start=t_start)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rep, f, indent=1)
    if md != "none":
        update_markdown(md, markdown(rep))
    return rep


def _measure_ants(rep: dict, args, batches: str, steps: int, repeats: int, mj_threads: int) -> None:
    from diffmech.rl.transplant import zero_action_agreement

    rep["ant_cells"] = []
    rep.pop("ant_skipped", None)  # a note of an earlier run of the results file
    if not batches:
        return
    z = zero_action_agreement(0.5)
    rep["ant_agreement"] = {k: v for k, v in z.items() if not isinstance(v, list)}
    for b in (int(x) for x in batches.split(",")):
        # a large batch's graph keeps every substep's J and M^-1 J^T (4096 Ants: up to 55 MB a substep), so
        # it rolls out a fifth of the steps
        c = measure_ant(b, steps if b <= ANT_BIG else max(1, steps // 5), repeats, mj_threads, args.device)
        rep["ant_cells"].append(c)
        print(f"ant x{b:<5d} grad {_rate(c['grad_steps_per_s']):>10s}  nograd {_rate(c['nograd_steps_per_s']):>10s}  "
              f"mujoco({mj_threads}) {_rate(c['mujoco_steps_per_s']):>12s}  ratio {_ratio(c['mujoco_over_grad'])}",
              flush=True)
    if 4096 not in [c["batch"] for c in rep["ant_cells"]]:
        # measured 2026-11-28 (commit 66f5b39) by stepping Ant(N) without a graph, CPU time per substep
        rep["ant_skipped"] = ("4096 Ants not measured: one contact substep (no graph) took 4.0, 19.9 and 61.3 CPU-ms "
                              "for 64, 256 and 1024 Ants here (about 0.05 ms per Ant beyond a few hundred), so 4096 "
                              "Ants with gradients over one 20-step rollout (100 substeps, steps with gradients about "
                              "2.8 times those without at 64 Ants) would take about 1 CPU-minute per repeat, and its "
                              "graph would keep every substep's J and M^-1 J^T (2 x 4096 x 60 x 14 in float64, up to "
                              "55 MB a substep): over 5 GB for the 100 substeps.")


def _ant_only(args, argv, md, t_start, load_before) -> dict:
    json_path = args.json or os.path.join(HERE, "results", "bench_rl.json")
    with open(json_path) as f:
        rep = json.load(f)
    mj_threads = args.mj_threads or os.cpu_count() or 1
    if mj_threads != rep["mj_threads"]:
        raise SystemExit(f"--ant-only: the results file used {rep['mj_threads']} MuJoCo threads, not {mj_threads}")
    _measure_ants(rep, args, args.ant_batches, args.ant_steps, args.repeats, mj_threads)
    rep["ant_args"] = " " + " ".join(sys.argv[1:] if argv is None else argv)
    rep["ant_load_before"] = load_before
    rep["ant_date"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    rep["ant_wall_s"] = time.perf_counter() - t_start
    rep["ant_commit"] = _machine.machine(ROOT, args.threads, ["src", "benchmarks/bench_rl.py"])["commit"]
    with open(json_path, "w") as f:
        json.dump(rep, f, indent=1)
    if md != "none":
        update_markdown(md, markdown(rep))
    return rep


if __name__ == "__main__":
    main()
