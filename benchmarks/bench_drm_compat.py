"""differentiable-robot-model's example training loops: on ``diffmech.compat.drm`` and on DRM itself.

The loops of DRM's examples, written once and run with either package's classes (the model, its
parametrizations), on the same data, from the same seeds, for the same number of epochs:

- ``id`` -- ``learn_dynamics_iiwa.py``: the iiwa's link 1 mass (``PositiveScalar``), rotational inertia
  (``UnconstrainedTensor(3, 3)``) and joint translation (``UnconstrainedTensor(1, 3)``) from the torques
  of a sine motion of all joints (``generate_sine_motion_inverse_dynamics_data``, ``--n-id`` samples, dt
  1/250 s, 0.05 Hz), batches of 100 in order, Adam (lr 1e-2), loss: squared torque error over the
  torques' variance; ``--epochs-id`` epochs (DRM's default: 10 epochs of 1000 samples).
- ``fd`` -- ``learn_forward_dynamics_iiwa.py``: mass, centre of mass and inertia of link 1 from the
  accelerations (``compute_forward_dynamics(..., use_damping=True)``), 0.1 Hz; ``--epochs-fd`` epochs of
  ``--n-fd`` samples (DRM's default, 100 epochs of 10000 samples, would take DRM most of an hour here).
- ``fk`` -- ``learn_kinematics_of_iiwa.py``: translation and rotation of joint 1 from 100 end-effector
  positions (``generate_random_forward_kinematics_data``), full batch, Adam (lr 1e-3), mean squared
  error; ``--steps-fk`` steps (DRM's default: 3000).

The data come from DRM's ground-truth ``DifferentiableKUKAiiwa`` and DRM's generators, once, for
every variant. Variants: *DRM* (differentiable-robot-model 0.2.3, float32); *facade* (the default
``diffmech.compat.drm.DifferentiableRobotModel``: diffmech's torch code, forward dynamics solved in
float64 and returned in float32); *facade, native kernels* (the same under
``diffmech.dynamics.kernels.native_mode("build")``: C kernels of the algorithms and their reverse
modes; built or found on disk before the timing, the first call's time reported apart). Each repeat
runs the variants of a loop one after another; times are medians over repeats, on ``--threads``
threads. Every model gets one untimed warm-up call first.

    python benchmarks/bench_drm_compat.py --quick    # seconds; writes only where --json/--markdown say
    python benchmarks/bench_drm_compat.py            # the run in BENCHMARKS.md and results/bench_drm_compat.json
    python benchmarks/bench_drm_compat.py --from-json benchmarks/results/bench_drm_compat.json   # re-render
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import io
import json
import logging
import os
import statistics
import sys
import time
import warnings

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _markdown, when imported by a test

import _machine  # noqa: E402
from _markdown import publish, replace_section, stamp  # noqa: E402
from diffmech.compat import drm as facade  # noqa: E402
from diffmech.dynamics import kernels  # noqa: E402

MARK_START, MARK_END = "<!-- bench_drm_compat:start -->", "<!-- bench_drm_compat:end -->"
URDF = "kuka_iiwa/urdf/iiwa7.urdf"
LOOPS = {
    "id": "inverse dynamics (`learn_dynamics_iiwa`)",
    "fd": "forward dynamics (`learn_forward_dynamics_iiwa`)",
    "fk": "kinematics (`learn_kinematics_of_iiwa`)",
}
VARIANTS = {"drm": "DRM 0.2.3", "facade": "facade", "native": "facade, native kernels"}


@contextlib.contextmanager
def _quiet():
    """DRM prints a line per link and its URDF parser warns about unknown tags."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def _packages(variant: str):
    """(robot class, parametrizations module) of a variant."""
    if variant == "drm":
        import differentiable_robot_model.rigid_body_params as params
        from differentiable_robot_model.robot_model import DifferentiableRobotModel

        return DifferentiableRobotModel, params
    return facade.DifferentiableRobotModel, facade.rigid_body_params


def make_data(args) -> dict:
    """The three loops' data, from DRM's ground truth and generators (same seeds as its examples)."""
    import diff_robot_data
    from differentiable_robot_model import data_utils
    from differentiable_robot_model.robot_model import DifferentiableKUKAiiwa

    logging.getLogger("urdf_parser_py").setLevel(logging.ERROR)
    with _quiet():
        gt = DifferentiableKUKAiiwa()
    np.random.seed(1)
    torch.manual_seed(0)
    with torch.no_grad():
        out = {
            "id": data_utils.generate_sine_motion_inverse_dynamics_data(gt, n_data=args.n_id, dt=1 / 250, freq=0.05),
            "fd": data_utils.generate_sine_motion_forward_dynamics_data(gt, n_data=args.n_fd, dt=1 / 250, freq=0.1),
            "fk": data_utils.generate_random_forward_kinematics_data(gt, n_data=100, ee_name="iiwa_link_ee"),
        }
    out["path"] = os.path.join(list(diff_robot_data.__path__)[0], URDF)
    return out


def build(loop: str, variant: str, path: str, seed: int):
    """The learnable model of ``loop`` (DRM's parametrizations of its example), seeded."""
    cls, params = _packages(variant)
    torch.manual_seed(seed)
    with _quiet():
        model = cls(path, name="kuka_iiwa")
    if loop == "id":
        learn = [("mass", params.PositiveScalar()), ("inertia_mat", params.UnconstrainedTensor(dim1=3, dim2=3)),
                 ("trans", params.UnconstrainedTensor(dim1=1, dim2=3))]
    elif loop == "fd":
        learn = [("mass", params.PositiveScalar()), ("com", params.UnconstrainedTensor(dim1=1, dim2=3)),
                 ("inertia_mat", params.UnconstrainedTensor(dim1=3, dim2=3))]
    else:
        learn = [("trans", params.UnconstrainedTensor(dim1=1, dim2=3)),
                 ("rot_angles", params.UnconstrainedTensor(dim1=1, dim2=3))]
    for name, module in learn:
        model.make_link_param_learnable("iiwa_link_1", name, module)
    return model


def loss_fn(loop: str, model, batch, var):
    if loop == "id":
        q, qd, qdd, tau = batch
        return (((model.compute_inverse_dynamics(q=q, qd=qd, qdd_des=qdd, include_gravity=True) - tau) ** 2)
                / var).mean()
    if loop == "fd":
        q, qd, qdd, tau = batch
        pred = model.compute_forward_dynamics(q=q, qd=qd, f=tau, include_gravity=True, use_damping=True)
        return (((pred - qdd) ** 2) / var).mean()
    q, ee = batch
    pos, _ = model.compute_forward_kinematics(q=q, link_name="iiwa_link_ee")
    return torch.nn.functional.mse_loss(pos, ee)


def batches(loop: str, data: dict) -> list:
    if loop == "fk":
        return [(data["fk"]["q"], data["fk"]["ee_pos"])]
    ds = data[loop]
    return list(torch.utils.data.DataLoader(dataset=ds, batch_size=100, shuffle=False))


def run_loop(loop: str, variant: str, data: dict, args) -> dict:
    """One training run: build, warm up (untimed), train; the wall time and the losses."""
    model = build(loop, variant, data["path"], args.seed)
    lr = 1e-3 if loop == "fk" else 1e-2
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    var = None if loop == "fk" else data[loop].var()
    bs = batches(loop, data)
    epochs = {"id": args.epochs_id, "fd": args.epochs_fd, "fk": args.steps_fk}[loop]
    mode = kernels.native_mode("build") if variant == "native" else contextlib.nullcontext()
    with mode, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DRM's quaternion converts a tensor that requires grad to a float
        t0 = time.perf_counter()
        loss_fn(loop, model, bs[0], var).backward()  # warm-up (with native kernels: built or loaded here)
        first_call = time.perf_counter() - t0
        opt.zero_grad()
        losses = []
        t0 = time.perf_counter()
        for _ in range(epochs):
            ep = []
            for batch in bs:
                opt.zero_grad()
                loss = loss_fn(loop, model, batch, var)
                loss.backward()
                opt.step()
                ep.append(loss.item())
            losses.append(float(np.mean(ep)))
        wall = time.perf_counter() - t0
    return {"wall_s": wall, "steps": epochs * len(bs), "first_call_s": first_call, "losses": losses}


def machine(threads: int) -> dict:
    try:
        drm_version = importlib.metadata.version("differentiable-robot-model")
    except importlib.metadata.PackageNotFoundError:
        drm_version = "n/a"
    return _machine.machine(ROOT, threads, ["src/diffmech", "benchmarks/bench_drm_compat.py"], drm=drm_version)


def markdown(rep: dict) -> str:
    mc, a = rep["machine"], rep["settings"]
    load = (f"load average (1/5/15 min) at the start {' / '.join(f'{x:.1f}' for x in rep['load_before'])}, "
            f"at the end {' / '.join(f'{x:.1f}' for x in rep['load_after'])}")
    lines = [MARK_START, "## differentiable-robot-model's training loops on `diffmech.compat.drm`", "",
             f"_Generated by `python benchmarks/bench_drm_compat.py{rep.get('args', '')}` on {mc['date']} "
             f"({rep['wall_s']:.0f} s); {mc['cpu']}, {mc['cores']} cores shared with other jobs, torch {mc['torch']}, "
             f"differentiable-robot-model {mc['drm']}, `torch.set_num_threads({mc['threads']})`, Python "
             f"{mc['python']}, commit {mc['commit']}; {load}._", ""]
    if max(rep["load_before"][0], rep["load_after"][0]) > 1.5:
        lines += ["> Measured while other jobs loaded the 2 cores: absolute times are inflated; the variants ran "
                  "one after another within each repeat, so their ratios are less affected.", ""]
    lines += [
        "DRM's example scripts' loops, written once and run with either package's classes, on the same data "
        "(DRM's ground-truth iiwa and its generators), from the same seeds, for the same epochs (script: "
        "`benchmarks/bench_drm_compat.py`). *id*: link 1's mass, inertia and joint translation from torques, "
        f"{a['n_id']} sine-motion samples, batches of 100, {a['epochs_id']} epochs; *fd*: link 1's mass, centre of "
        f"mass and inertia from accelerations, {a['n_fd']} samples, {a['epochs_fd']} epochs; *fk*: joint 1's "
        f"translation and rotation from 100 end-effector positions, {a['steps_fk']} full-batch steps. Adam; "
        "each model warmed up by one untimed call. *facade*: `diffmech.compat.drm` as it comes (torch code, "
        "forward dynamics solved in float64); *native kernels*: the same with "
        "`diffmech.dynamics.kernels.native_mode(\"build\")` (kernels built or loaded in the warm-up call, "
        f"whose time is the last column). Medians of {a['repeats']} repeats.", "",
        "| loop | optimiser steps | DRM (s) | facade (s) | facade, native kernels (s) | DRM / facade | "
        "DRM / facade native | ms per step: DRM / facade / native | loss, first -> last epoch: DRM | facade | "
        "first call, native (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def cell(x, fmt="{:.2f}"):
        return fmt.format(x) if x is not None else "n/a"

    def ms(x):
        return f"{1e3 * x['wall_s'] / x['steps']:.1f}" if x else "n/a"

    def losses(x):
        return f"{x['losses'][0]:.3g} -> {x['losses'][-1]:.3g}" if x else "n/a"

    for loop, label in LOOPS.items():
        r = rep["results"].get(loop)
        if not r:
            continue
        d, f, n = r.get("drm"), r.get("facade"), r.get("native")
        lines.append(
            f"| {label} | {f['steps']} | {cell(d and d['wall_s'])} | {cell(f['wall_s'])} | "
            f"{cell(n and n['wall_s'])} | {cell(d and d['wall_s'] / f['wall_s'], '{:.1f}x')} | "
            f"{cell(d and n and d['wall_s'] / n['wall_s'], '{:.1f}x')} | {ms(d)} / {ms(f)} / {ms(n)} | "
            f"{losses(d)} | {losses(f)} | {cell(n and n['first_call_s'], '{:.1f}')} |")
    lines += ["",
              "Losses are the mean over each epoch's batches (the last repeat). They differ where the two compute "
              "different things: a learnable inertia enters DRM as given and diffmech through its symmetric part, "
              "and DRM's examples start it at a random `UnconstrainedTensor(3, 3)` (non-symmetric, indefinite), "
              "so the forward-dynamics loop starts from an unphysical link whose accelerations already differ at "
              "the first batch; the facade's float32 forward dynamics is also solved in float64. Where the "
              "inertia is symmetric the two take the "
              "same steps (`tests/test_compat_drm.py`). *first call, native*: building the kernels (or loading "
              "them from the disk cache) for this loop's algorithm and gradients; the kinematics loop has none.",
              "",
              f"Raw data: `{rep.get('json_path', 'benchmarks/results/bench_drm_compat.json')}`.", MARK_END]
    return "\n".join(lines)


def update_markdown(path: str, section: str) -> None:
    """Replace this benchmark's section of ``path`` between its markers (append if absent)."""
    replace_section(path, section, MARK_START, MARK_END)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: one short epoch per loop, one repeat, no native kernels, writes nothing")
    ap.add_argument("--loops", default="id,fd,fk")
    ap.add_argument("--variants", default="drm,facade,native")
    ap.add_argument("--n-id", type=int, default=1000)
    ap.add_argument("--epochs-id", type=int, default=10)
    ap.add_argument("--n-fd", type=int, default=2000)
    ap.add_argument("--epochs-fd", type=int, default=5)
    ap.add_argument("--steps-fk", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None, help="results file (default benchmarks/results/bench_drm_compat.json; "
                                                 "with --quick: none)")
    ap.add_argument("--markdown", default=None, help="file whose bench_drm_compat section is rewritten (default "
                                                     "BENCHMARKS.md; with --quick: none); 'none' skips")
    ap.add_argument("--from-json", default=None, help="re-render the markdown from a results file, measure nothing")
    args = ap.parse_args(argv)
    json_path = args.json or (None if args.quick else os.path.join(ROOT, "benchmarks", "results",
                                                                  "bench_drm_compat.json"))
    md_path = None if args.markdown == "none" else (args.markdown or (None if args.quick else
                                                                      os.path.join(ROOT, "BENCHMARKS.md")))
    if args.from_json:
        with open(args.from_json) as f:
            rep = json.load(f)
        if md_path:
            update_markdown(md_path, markdown(rep))
        return rep
    variants = [v for v in args.variants.split(",") if v]
    if args.quick:
        args.n_id, args.epochs_id, args.n_fd, args.epochs_fd, args.steps_fk, args.repeats = 500, 1, 500, 1, 5, 1
        variants = [v for v in variants if v != "native"]
    try:
        import differentiable_robot_model  # noqa: F401
    except ImportError:
        raise SystemExit("bench_drm_compat needs differentiable-robot-model "
                         "(pip install differentiable-robot-model)") from None
    torch.set_num_threads(args.threads)
    t_start, load_before = time.perf_counter(), os.getloadavg()
    data = make_data(args)
    loops = [x for x in args.loops.split(",") if x]
    runs: dict = {loop: {v: [] for v in variants} for loop in loops}
    for rep_i in range(args.repeats):
        for loop in loops:
            for v in variants:
                r = run_loop(loop, v, data, args)
                runs[loop][v].append(r)
                print(f"repeat {rep_i + 1}: {loop} {v}: {r['wall_s']:.2f} s for {r['steps']} steps, "
                      f"loss {r['losses'][0]:.3g} -> {r['losses'][-1]:.3g}", flush=True)
    results = {}
    for loop in loops:
        results[loop] = {}
        for v, rs in runs[loop].items():
            results[loop][v] = {
                "label": VARIANTS[v], "wall_s": statistics.median(r["wall_s"] for r in rs),
                "wall_s_all": [r["wall_s"] for r in rs], "steps": rs[0]["steps"],
                "first_call_s": rs[0]["first_call_s"], "losses": rs[-1]["losses"], "final_loss": rs[-1]["losses"][-1]}
    rep = {"machine": machine(args.threads), "results": results,
           "settings": {k: getattr(args, k) for k in ("n_id", "epochs_id", "n_fd", "epochs_fd", "steps_fk",
                                                      "repeats", "seed")}}
    stamp(rep, argv=argv, json_path=json_path, root=ROOT, load_before=load_before, t_start=t_start)
    for loop, r in results.items():
        if "drm" in r and "facade" in r:
            print(f"{loop}: DRM {r['drm']['wall_s']:.2f} s, facade {r['facade']['wall_s']:.2f} s "
                  f"({r['drm']['wall_s'] / r['facade']['wall_s']:.1f}x)"
                  + (f", native {r['native']['wall_s']:.2f} s" if "native" in r else ""))
    publish(rep, json_path, md_path, markdown, update_markdown)
    return rep


if __name__ == "__main__":
    main()
