"""diffmech on a GPU against diffmech on the CPU cores of the same machine, in one run.

Four workloads, each timed on the GPU and on the CPU (one torch thread for small batches, all
cores for large ones; the native kernels of :mod:`diffmech.dynamics.kernels` built and used where
they apply, as a CPU user would):

* **core**: forward kinematics (all links), inverse dynamics (RNEA), the mass matrix (CRBA), forward
  dynamics (``method="auto"``) and the gradient of ``|qdd|^2`` w.r.t. ``(q, v, tau)`` through the
  forward dynamics, on the iiwa (7 joints, fixed base) and the laikago (12 joints, floating base),
  float32 and float64, batches of 1 to 262144 states. Time per call; rate = states per second.
* **learn**: one training step (objective, ``backward()``, Adam) of the four model kinds of
  :mod:`diffmech.learn` (NODE-RK4, L-NODE-RK4, SyMo, E2E-SyMo; width 256, float32, n = 2, the
  cart-pole's size) on minibatches of 512 and 8192 samples.
* **contact**: ``scenes.laikago`` copies in one batch, 50 steps of dt 1e-3, gradient of the
  chassis' final x + z w.r.t. every torque and the drives' stiffness (checkpointed adjoint), as in
  ``bench_contact_batch.py``: forward + backward time per robot-step; MuJoCo's
  ``mjd_transitionFD`` per robot-step on one CPU core beside it where ``mujoco`` is installed.
* **rl**: ``diffmech.rl.Ant`` (float64), ``--ant-steps`` environment steps of N Ants with the
  gradient of the summed reward w.r.t. every action; environment steps per second.

GPU timings synchronise the device before reading the clock; every cell is warmed up first and is
the median of repeated calls (``bench_dynamics.time_call``). A cell whose first call exceeds
``--max-call`` seconds is timed once; a batch past the predicted ``--skip-above`` seconds is skipped.

    python benchmarks/bench_gpu.py                 # needs CUDA; writes results/bench_gpu.json, BENCHMARKS.md
    python benchmarks/bench_gpu.py --quick --device cpu   # the script itself on a CPU machine, seconds
    python benchmarks/bench_gpu.py --from-json benchmarks/results/bench_gpu.json   # re-render the section
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, HERE)

import _machine  # noqa: E402
from _markdown import replace_section  # noqa: E402
from bench_dynamics import diffmech_fn, random_states, time_call  # noqa: E402

MARK_START, MARK_END = "<!-- bench_gpu:start -->", "<!-- bench_gpu:end -->"
ALGOS = ("fk", "rnea", "crba", "aba", "grad")
ALGO_TEXT = {"fk": "FK", "rnea": "RNEA", "crba": "CRBA", "aba": "FD", "grad": "grad FD"}
LEARN_MODELS = ("node-rk4", "lnode-rk4", "symo", "e2e-symo")


def _robot(name: str, dtype, device):
    import warnings

    import diffmech

    if name == "iiwa":
        import diff_robot_data

        path = os.path.join(diff_robot_data.__path__[0], "kuka_iiwa/urdf/iiwa7.urdf")
        fb, ee = False, "iiwa_link_ee"
    else:
        import pybullet_data

        path = os.path.join(pybullet_data.getDataPath(), "laikago", "laikago_toes_zup.urdf")
        fb, ee = True, "toeFL"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = diffmech.load_urdf(path, floating_base=fb, dtype=dtype)
    if ee not in r.link_names:
        ee = r.link_names[-1]
    return r, ee


def _synced(fn, device):
    if torch.device(device).type != "cuda":
        return fn

    def run():
        fn()
        torch.cuda.synchronize()
    return run


def _timed(fn, dev, args, batch: int, max_reps: int = 30):
    """``time_call`` of ``fn`` on ``dev``. GPU: synchronised. CPU: one torch thread below
    ``--thread-batch`` states, all cores from there on (many threads cost more than they give on
    small batches). Returns the timing and the thread count."""
    def timed():
        return time_call(_synced(fn, dev), args.budget, max_call=args.max_call, max_reps=max_reps)
    if dev != "cpu":
        return timed(), torch.get_num_threads()
    n = 1 if batch < args.thread_batch else args.cpu_threads
    torch.set_num_threads(n)
    try:
        return timed(), n
    finally:
        torch.set_num_threads(args.cpu_threads)


def core(args, devices) -> list[dict]:
    from diffmech.dynamics import kernels

    rows = []
    for name in args.robots.split(","):
        for dt_name in args.dtypes.split(","):
            dtype = getattr(torch, dt_name)
            for dev in devices:
                if dev == "cpu" and dt_name not in args.cpu_dtypes.split(","):
                    continue
                host, ee = _robot(name, dtype, dev)
                robot = copy.deepcopy(host).to(dev)
                if dev == "cpu" and not args.no_native:  # what a CPU user runs: the native kernels, built once
                    try:
                        # passive=False too: the cells call the algorithms without the joints' passive forces
                        kernels.prepare(robot, dtypes=(dtype,), passive=(True, False))
                    except Exception as e:  # no C compiler: the CPU cells time the torch code
                        print(f"native kernels not built ({e}); CPU cells run the torch code", flush=True)
                for algo in ALGOS:
                    prev = None
                    for B in [int(b) for b in args.batches.split(",")]:
                        if prev is not None and prev[1] * B / prev[0] > args.skip_above:
                            rows.append(dict(robot=name, dtype=dt_name, device=dev, algo=algo, batch=B, skipped=True))
                            continue
                        q, v, u = (t.to(dev) for t in random_states(host, B))
                        fn = diffmech_fn(robot, algo, "diffmech", q, v, u, ee)
                        t, threads = _timed(fn, dev, args, B)
                        prev = (B, t["seconds"])
                        rows.append(dict(robot=name, dtype=dt_name, device=dev, algo=algo, batch=B, threads=threads,
                                         seconds=t["seconds"], reps=t["reps"], rate=B / t["seconds"]))
                        if args.verbose:
                            print(f"core {name} {dt_name} {dev} {algo} B={B}: {1e3 * t['seconds']:.3f} ms", flush=True)
    return rows


def learn(args, devices) -> list[dict]:
    from diffmech.learn import StepSamples, build_model

    rows = []
    for name in LEARN_MODELS:
        for B in [int(b) for b in args.learn_batches.split(",")]:
            for dev in devices:
                torch.manual_seed(0)
                m = build_model(name, (False, True), 0.05, width=256,
                                input_matrix=torch.tensor([[1.0], [0.0]])).to(dev)
                g = torch.Generator().manual_seed(1)
                qp = torch.randn(B, 2, generator=g)
                q = qp + 0.05 * torch.randn(B, 2, generator=g)
                qn = 2 * q - qp + 1e-3 * torch.randn(B, 2, generator=g)
                u = torch.randn(B, 1, generator=g)
                b = StepSamples(qp, q, (q - qp) / 0.05, qn, (qn - q) / 0.05, u, u, u).to(device=dev)
                opt = torch.optim.Adam(m.parameters(), lr=1e-4)

                def step(m=m, b=b, opt=opt):
                    opt.zero_grad()
                    loss, _ = m.objective(b)
                    loss.backward()
                    opt.step()
                t, threads = _timed(step, dev, args, B)
                rows.append(dict(model=name, batch=B, device=dev, seconds=t["seconds"], reps=t["reps"],
                                 threads=threads))
                if args.verbose:
                    print(f"learn {name} B={B} {dev}: {1e3 * t['seconds']:.2f} ms", flush=True)
    return rows


def contact(args, devices) -> list[dict]:
    import bench_contact

    rows = []
    have_mj = bench_contact.mujoco_laikago() is not None
    if "cpu" in devices and not args.no_native:
        try:
            bench_contact.prepare_kernels()
        except Exception as e:  # no C compiler: the CPU rows time the torch code
            print(f"native kernels not built ({e})", flush=True)
    T = args.contact_steps
    for dev in devices:
        bench_contact.run("laikago", "checkpoint", 3, 1, device=dev)  # first calls off the clock
        for B in [int(b) for b in args.contact_batches.split(",")]:
            if dev == "cpu" and B > args.contact_cpu_max:
                continue
            t0 = time.perf_counter()
            d = bench_contact.run("laikago", "checkpoint", T, B, device=dev)
            rows.append(dict(device=dev, batch=B, T=T, forward_ms_per_step=d["forward_ms_per_step"],
                             backward_ms_per_step=d["backward_ms_per_step"],
                             per_robot_ms=(d["forward_ms_per_step"] + d["backward_ms_per_step"]) / B,
                             param_grad=d["param_grad"]))
            if args.verbose:
                print(f"contact {dev} B={B}: {rows[-1]['per_robot_ms']:.4f} ms per robot-step "
                      f"({time.perf_counter() - t0:.1f} s)", flush=True)
    if have_mj:
        mj = bench_contact.run_mujoco(T, 16)
        rows.append(dict(device="mujoco-cpu", batch=16, T=T, per_robot_ms=mj["fd_ms_per_step"] / 16,
                         step_per_robot_ms=mj["step_ms_per_step"] / 16, mujoco=mj["version"]))
    return rows


def rl(args, devices) -> list[dict]:
    """The Ant (diffmech.rl.Ant, float64): ``--ant-steps`` env steps of N Ants with an action tensor
    that requires grad, then the gradient of the summed reward w.r.t. every action."""
    from diffmech.rl import Ant

    rows = []
    for dev in devices:
        for N in [int(b) for b in args.ant_batches.split(",")]:
            if dev == "cpu" and N > args.contact_cpu_max:
                continue
            env = Ant(N, reset_noise=0.05, seed=0, device=dev)

            def episode(env=env, N=N, dev=dev):
                env.reset()
                a = torch.zeros(args.ant_steps, N, 8, dtype=torch.float64, device=dev, requires_grad=True)
                total = 0.0
                for k in range(args.ant_steps):
                    total = total + env.step(a[k]).reward.sum()
                total.backward()
            episode()  # first calls off the clock
            t, threads = _timed(episode, dev, args, N, max_reps=5)
            rows.append(dict(device=dev, num_envs=N, steps=args.ant_steps, seconds=t["seconds"], threads=threads,
                             env_steps_per_s=N * args.ant_steps / t["seconds"]))
            if args.verbose:
                print(f"rl ant {dev} N={N}: {rows[-1]['env_steps_per_s']:.0f} env steps/s", flush=True)
    return rows


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="the accelerator (default %(default)s)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, writes nothing")
    ap.add_argument("--parts", default="core,learn,contact,rl")
    ap.add_argument("--ant-batches", default="64,1024,8192")
    ap.add_argument("--ant-steps", type=int, default=4)
    ap.add_argument("--robots", default="iiwa,laikago")
    ap.add_argument("--dtypes", default="float32,float64")
    ap.add_argument("--batches", default="1,256,16384,262144")
    ap.add_argument("--cpu-dtypes", default="float64", help="dtypes also timed on the CPU (default %(default)s)")
    ap.add_argument("--learn-batches", default="512,8192")
    ap.add_argument("--contact-batches", default="1,64,1024,4096")
    ap.add_argument("--contact-cpu-max", type=int, default=64, help="largest contact batch timed on the CPU")
    ap.add_argument("--contact-steps", type=int, default=50)
    ap.add_argument("--budget", type=float, default=0.2, help="seconds of timed repetitions per cell")
    ap.add_argument("--max-call", type=float, default=2.0)
    ap.add_argument("--skip-above", type=float, default=4.0, help="skip a batch predicted to take longer (s)")
    ap.add_argument("--no-native", action="store_true", help="CPU cells without the native kernels (torch code)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")
    ap.add_argument("--thread-batch", type=int, default=1024,
                    help="CPU cells below this batch run on one torch thread (default %(default)s)")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "bench_gpu.json"))
    ap.add_argument("--markdown", default=os.path.join(ROOT, "BENCHMARKS.md"), help="'none' skips")
    ap.add_argument("--from-json", default=None)
    ap.add_argument("--section", default="bench_gpu", help="markdown section name (markers <!-- NAME:start -->)")
    ap.add_argument("--verbose", "-v", action="store_true")
    args = ap.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            rep = json.load(f)
        _write_markdown(rep, args.markdown)
        return rep
    if args.quick:
        args.robots, args.dtypes, args.batches, args.budget = "iiwa", "float64", "1,64", 0.05
        args.cpu_dtypes = "float64"
        args.learn_batches, args.contact_batches, args.contact_steps = "64", "1,4", 5
        args.ant_batches, args.ant_steps = "1,2", 2
    threads = args.cpu_threads = args.threads or os.cpu_count()
    torch.set_num_threads(threads)
    devices = [args.device] + (["cpu"] if args.device != "cpu" else [])
    t_start = time.perf_counter()
    rep: dict = {"args": " ".join(sys.argv[1:] if argv is None else argv), "threads": threads,
                 "section": args.section, "raw": os.path.relpath(os.path.abspath(args.json), ROOT),
                 "device": args.device, "python": platform.python_version(), "thread_batch": args.thread_batch,
                 "cpu_dtypes": args.cpu_dtypes,
                 "device_name": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu",
                 "machine": _machine.machine(ROOT, threads, ["src/diffmech", "benchmarks/bench_gpu.py"]),
                 "date": datetime.datetime.now().isoformat(timespec="seconds")}
    parts = args.parts.split(",")
    for part, fn in (("core", core), ("learn", learn), ("contact", contact), ("rl", rl)):
        if part in parts:
            t0 = time.perf_counter()
            rep[part] = fn(args, devices)
            print(f"{part}: {time.perf_counter() - t0:.0f} s", flush=True)
    rep["wall_s"] = time.perf_counter() - t_start
    text = "\n".join(markdown(rep))
    print(text)
    if not args.quick:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(rep, f, indent=2)
        _write_markdown(rep, args.markdown)
    return rep


def _marks(rep: dict) -> tuple[str, str]:
    name = rep.get("section", "bench_gpu")
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def _write_markdown(rep: dict, path: str) -> None:
    if path and path != "none":
        replace_section(path, "\n".join(markdown(rep)), *_marks(rep))


def _fmt_rate(x: float) -> str:
    return f"{x / 1e6:.2f} M/s" if x >= 1e6 else f"{x / 1e3:.1f} k/s" if x >= 1e3 else f"{x:.0f} /s"


def markdown(rep: dict) -> list[str]:
    gpu, m = rep["device"], rep["machine"]
    start, end = _marks(rep)
    lines = [start, "## diffmech on a GPU vs on the CPU cores of the same machine" + rep.get("heading_note", ""), "",
             f"_Generated by `python benchmarks/bench_gpu.py {rep['args']}".rstrip() + f"` on {rep['date']} "
             f"({rep['wall_s']:.0f} s); {rep['device_name']}; CPU: {m['cpu']}, {m['cores']} cores, "
             f"{rep['threads']} torch threads; torch {m['torch']}, commit {m['commit']}._", "",
             "GPU: diffmech's torch code on the device (no native kernels there). CPU: the same machine's cores with "
             "the native kernels built (`kernels.prepare`), as a CPU user would run, on one torch thread below "
             f"{rep.get('thread_batch', 1024)} states and on all cores from there on. Ratio = CPU time / GPU time "
             "(above 1: the GPU is faster). Raw data: `"
             + rep.get("raw", "benchmarks/results/bench_gpu.json") + "`.", ""]
    if rep.get("core"):
        lines += ["### Rigid-body algorithms: states per second", "",
                  "| robot | dtype | algorithm | " + " | ".join(f"B = {b}" for b in _batches(rep)) + " |",
                  "|---|---|---|" + "---:|" * len(_batches(rep))]
        for key in _keys(rep["core"]):
            cells = []
            for B in _batches(rep):
                g = _find(rep["core"], *key, gpu, B)
                c = _find(rep["core"], *key, "cpu", B)
                if g is None or "seconds" not in g:
                    cells.append("-")
                    continue
                txt = f"{_fmt_rate(g['rate'])}"
                if c is not None and "seconds" in c:
                    txt += f" ({c['seconds'] / g['seconds']:.2g}x)"
                cells.append(txt)
            lines.append(f"| {key[0]} | {key[1]} | {ALGO_TEXT[key[2]]} | " + " | ".join(cells) + " |")
        lines += ["", "Each cell: GPU states per second (CPU time / GPU time). No ratio where the CPU cell was not "
                  f"timed (CPU dtypes: {rep.get('cpu_dtypes', 'all')}; or predicted too long).", ""]
    if rep.get("learn"):
        lines += ["### Learned dynamics: one training step (objective, backward, Adam), width 256, float32", "",
                  "| model | batch | GPU ms | CPU ms | CPU / GPU |", "|---|---:|---:|---:|---:|"]
        for r in rep["learn"]:
            if r["device"] != gpu:
                continue
            c = next((x for x in rep["learn"] if x["device"] == "cpu" and x["model"] == r["model"]
                      and x["batch"] == r["batch"]), None)
            lines.append(f"| {r['model']} | {r['batch']} | {1e3 * r['seconds']:.2f} | "
                         + (f"{1e3 * c['seconds']:.2f} | {c['seconds'] / r['seconds']:.2f}x |" if c else "- | - |"))
        lines.append("")
    if rep.get("contact"):
        mj = next((r for r in rep["contact"] if r["device"] == "mujoco-cpu"), None)
        lines += ["### Contact rollouts (laikago, checkpointed gradient): ms per robot-step", "",
                  "| robots | GPU fwd ms/step | GPU bwd ms/step | GPU per robot-step | CPU per robot-step | "
                  "MuJoCo FD per robot-step (1 core) | GPU / MuJoCo FD |", "|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rep["contact"]:
            if r["device"] != gpu:
                continue
            c = next((x for x in rep["contact"] if x["device"] == "cpu" and x["batch"] == r["batch"]), None)
            lines.append(f"| {r['batch']} | {r['forward_ms_per_step']:.2f} | {r['backward_ms_per_step']:.2f} | "
                         f"{r['per_robot_ms']:.4f} | " + (f"{c['per_robot_ms']:.4f}" if c else "-") + " | "
                         + (f"{mj['per_robot_ms']:.3f} | {r['per_robot_ms'] / mj['per_robot_ms']:.3f} |" if mj
                            else "- | - |"))
        lines.append("")
    if rep.get("rl"):
        lines += ["### Reinforcement learning: Ant environment steps per second with the action gradient", "",
                  "`diffmech.rl.Ant` (float64, 5 contact steps of 0.01 s per env step), "
                  f"{rep['rl'][0]['steps']} steps and `backward()` of the summed reward.", "",
                  "| Ants | GPU env steps/s | CPU env steps/s | GPU / CPU |", "|---:|---:|---:|---:|"]
        for r in rep["rl"]:
            if r["device"] != gpu:
                continue
            c = next((x for x in rep["rl"] if x["device"] == "cpu" and x["num_envs"] == r["num_envs"]), None)
            lines.append(f"| {r['num_envs']} | {r['env_steps_per_s']:.0f} | "
                         + (f"{c['env_steps_per_s']:.0f} | {r['env_steps_per_s'] / c['env_steps_per_s']:.2f}x |" if c
                            else "- | - |"))
        lines.append("")
    for note in rep.get("notes", []):
        lines += [f"Note: {note}", ""]
    lines.append(end)
    return lines


def _batches(rep):
    return sorted({r["batch"] for r in rep["core"]})


def _keys(rows):
    seen = []
    for r in rows:
        k = (r["robot"], r["dtype"], r["algo"])
        if k not in seen:
            seen.append(k)
    return seen


def _find(rows, robot, dtype, algo, device, batch):
    return next((r for r in rows if (r["robot"], r["dtype"], r["algo"], r["device"], r["batch"])
                 == (robot, dtype, algo, device, batch)), None)


if __name__ == "__main__":
    main()
