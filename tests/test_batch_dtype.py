"""Batch shapes, broadcasting, input immutability, dtypes and devices of every algorithm.

A batched call must equal the per-sample loop for any leading batch shape (including sizes that
coincide with ``nq``/``nv`` -- iiwa has 7 of each -- so a mix-up of batch and state axes
cannot pass), broadcast its inputs, leave them untouched, and follow the inputs' dtype/device.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

import diffmech
from conftest import get_robot, random_state

ROBOT_IDS = ["iiwa", "branching_tree", "humanoid"]
BATCHES = [(), (1,), (3,), (6,), (7,), (2, 5)]
POOL = 10  # samples drawn once; a batch shape uses the first prod(shape) of them


def _last(r):
    return r.link_names[-1]


# name -> (inputs used, function of (robot, inputs dict))
ALGOS = {
    "forward_kinematics": ("q", lambda r, x: r.forward_kinematics(x["q"])),
    "link_pose": ("q", lambda r, x: r.link_pose(x["q"], _last(r))),
    "jacobian": ("q", lambda r, x: r.jacobian(x["q"], _last(r))),
    "jacobian_local": ("q", lambda r, x: r.jacobian(x["q"], _last(r), frame="local")),
    "jacobian_world": ("q", lambda r, x: r.jacobian(x["q"], _last(r), frame="world")),
    "jacobian_point": ("q p", lambda r, x: r.jacobian(x["q"], _last(r), point=x["p"])),
    "rnea": ("q v a", lambda r, x: r.inverse_dynamics(x["q"], x["v"], x["a"])),
    "rnea_fext": ("q v a f", lambda r, x: r.inverse_dynamics(x["q"], x["v"], x["a"], f_ext=x["f"])),
    "crba": ("q", lambda r, x: r.mass_matrix(x["q"])),
    "aba": ("q v a", lambda r, x: r.forward_dynamics(x["q"], x["v"], x["a"])),
    "fd_crba": ("q v a", lambda r, x: r.forward_dynamics(x["q"], x["v"], x["a"], method="crba")),
    "fd_aba": ("q v a", lambda r, x: r.forward_dynamics(x["q"], x["v"], x["a"], method="aba")),
    "aba_fext": ("q v a f", lambda r, x: r.forward_dynamics(x["q"], x["v"], x["a"], f_ext=x["f"])),
    "bias_forces": ("q v", lambda r, x: r.bias_forces(x["q"], x["v"])),
    "generalized_gravity": ("q", lambda r, x: r.generalized_gravity(x["q"])),
    "kinetic_energy": ("q v", lambda r, x: r.kinetic_energy(x["q"], x["v"])),
    "potential_energy": ("q", lambda r, x: r.potential_energy(x["q"])),
    "center_of_mass": ("q", lambda r, x: r.center_of_mass(x["q"])),
    "integrate": ("q v", lambda r, x: r.integrate(x["q"], x["v"], 0.1)),
}
# per-sample trailing shapes, to check the output shapes
_OUT = {
    "forward_kinematics": lambda r: (r.n_links, 4, 4), "link_pose": lambda r: (4, 4),
    "crba": lambda r: (r.nv, r.nv), "kinetic_energy": lambda r: (), "potential_energy": lambda r: (),
    "center_of_mass": lambda r: (3,), "integrate": lambda r: (r.nq,),
}


def out_shape(name, r):
    if name.startswith("jacobian"):
        return (6, r.nv)
    return _OUT.get(name, lambda r: (r.nv,))(r)


def inputs(robot, n: int, dtype=torch.float64, seed: int = 0) -> dict:
    q, v, a, f = random_state(robot, (n,), seed=seed, dtype=dtype)
    g = torch.Generator().manual_seed(seed + 1)
    p = (0.2 * torch.randn(n, 3, generator=g, dtype=torch.float64)).to(dtype)
    return {"q": q, "v": v, "a": a, "f": f, "p": p}


def close(a: torch.Tensor, b: torch.Tensor, rtol: float) -> bool:
    scale = max(float(b.abs().max()), 1e-12)
    return float((a - b).abs().max()) <= rtol * scale


@pytest.fixture(scope="module", params=ROBOT_IDS)
def robot(request):
    return get_robot(request.param)


@pytest.fixture(scope="module")
def pool(robot):
    return inputs(robot, POOL)


@pytest.mark.parametrize("name", list(ALGOS))
def test_batch_shapes_match_loop(robot, pool, name):
    used, fn = ALGOS[name]
    used = used.split()
    per_sample = [fn(robot, {k: pool[k][i] for k in used}) for i in range(POOL)]
    shape = out_shape(name, robot)
    for s in per_sample:
        assert s.shape == shape
    # an unbatched call equals the same sample as a batch of one
    one = fn(robot, {k: pool[k][:1] for k in used})
    assert one.shape == (1, *shape)
    assert close(one[0], per_sample[0], 1e-12)
    for batch in BATCHES[1:]:
        n = math.prod(batch)
        x = {k: pool[k][:n].reshape(*batch, *pool[k].shape[1:]) for k in used}
        out = fn(robot, x)
        assert out.shape == (*batch, *shape), f"{name}: batch {batch} gave {tuple(out.shape)}"
        flat = out.reshape(n, *shape)
        for i in range(n):
            assert close(flat[i], per_sample[i], 1e-12), f"{name}: batch {batch}, sample {i}"


@pytest.mark.parametrize("robot_id", [*ROBOT_IDS, "prismatic_mix"])
def test_small_and_large_batch_paths_agree(robot_id):
    """Small flat batches take batched-matrix code paths (and ``forward_dynamics`` CRBA + LU), large
    ones elementwise paths (and ABA); a large batch equals its samples evaluated one by one."""
    from diffmech.dynamics._common import SMALL_BATCH
    from diffmech.dynamics.aba import AUTO_CRBA_MAX_BATCH

    r = get_robot(robot_id)
    n = max(SMALL_BATCH, AUTO_CRBA_MAX_BATCH) + 3
    x = inputs(r, n, seed=5)
    for name, (used, fn) in ALGOS.items():
        used = used.split()
        out = fn(r, {k: x[k] for k in used})
        # forward dynamics amplify the rounding differences of the two paths by cond(M) (~1e4 here)
        rtol = 1e-11 if name in ("aba", "aba_fext", "fd_crba", "fd_aba") else 1e-12
        for i in range(n):
            one = fn(r, {k: x[k][i:i + 1] for k in used})[0]
            assert close(out[i], one, rtol), f"{name}: sample {i} of a batch of {n} differs from the sample alone"


@pytest.mark.parametrize(
    "name", ["rnea", "rnea_fext", "aba", "fd_crba", "fd_aba", "bias_forces", "kinetic_energy", "integrate",
             "jacobian_point"]
)
def test_broadcasting(robot, pool, name):
    """Inputs with different batch shapes broadcast like torch tensors."""
    used, fn = ALGOS[name]
    used = used.split()
    B = 4
    full = {k: pool[k][:B] for k in used}
    ref = fn(robot, full)
    # one sample of everything but q, shared by the batch of configurations
    shared = {k: (pool[k][:B] if k == "q" else pool[k][0]) for k in used}
    expanded = {k: (pool[k][:B] if k == "q" else pool[k][:1].expand(B, *pool[k].shape[1:])) for k in used}
    assert close(fn(robot, shared), fn(robot, expanded), 1e-13)
    # a single configuration with a batch of the other inputs
    if len(used) > 1:
        single_q = {k: (pool[k][0] if k == "q" else pool[k][:B]) for k in used}
        exp_q = {k: (pool[k][:1].expand(B, -1) if k == "q" else pool[k][:B]) for k in used}
        assert close(fn(robot, single_q), fn(robot, exp_q), 1e-13)
    # outer product of batch shapes: q (2, 1, nq) with the rest (1, 3, ...) -> (2, 3, ...)
    outer = {k: (pool[k][:2, None] if k == "q" else pool[k][None, 2:5]) for k in used}
    out = fn(robot, outer)
    assert out.shape[:2] == (2, 3)
    for i in range(2):
        for j in range(3):
            x = {k: (pool[k][i] if k == "q" else pool[k][2 + j]) for k in used}
            assert close(out[i, j], fn(robot, x), 1e-12)
    assert ref.shape[0] == B


@pytest.mark.parametrize("name", list(ALGOS))
def test_inputs_not_modified(robot, pool, name):
    used, fn = ALGOS[name]
    x = {k: pool[k][:3].clone() for k in used.split()}
    before = {k: (t.clone(), t._version) for k, t in x.items()}
    fn(robot, x)
    for k, t in x.items():
        assert torch.equal(t, before[k][0]), f"{name} modified its input '{k}'"
        assert t._version == before[k][1], f"{name} wrote into its input '{k}' in place"


# float32 accuracy (measured: <= 4e-7 without a solve, <= 8e-5 with one -- forward dynamics
# inherit the conditioning of M)
F32_RTOL = {"aba": 1e-3, "fd_crba": 1e-3, "fd_aba": 1e-3, "aba_fext": 1e-3}


def compare_to_float64(model, key: str, pool64: dict, dtype: torch.dtype) -> None:
    """Every algorithm on ``model`` with ``dtype`` inputs returns ``dtype`` results close to the
    float64 results of the float64 robot ``key``."""
    ref_model = get_robot(key)
    for name, (used, fn) in ALGOS.items():
        used = used.split()
        out = fn(model, {k: pool64[k].to(dtype) for k in used})
        ref = fn(ref_model, {k: pool64[k] for k in used})
        assert out.dtype == dtype, f"{name}: {dtype} inputs gave {out.dtype}"
        rtol = F32_RTOL.get(name, 1e-5) if dtype == torch.float32 else 1e-12
        assert close(out.double(), ref, rtol), f"{name}: {dtype} result too far from float64"


@pytest.mark.parametrize("key", ROBOT_IDS)
def test_float32_inputs_on_float64_model(key):
    r = get_robot(key)
    compare_to_float64(r, key, inputs(r, 5, seed=3), torch.float32)
    assert r.dtype == torch.float64  # the call does not convert the model


@pytest.mark.parametrize("key", ROBOT_IDS)
def test_model_to_float32(key):
    r = copy.deepcopy(get_robot(key)).to(torch.float32)
    assert r.dtype == torch.float32
    assert r.random_configuration(2).dtype == torch.float32
    assert r.neutral_configuration().dtype == torch.float32
    pool64 = inputs(get_robot(key), 5, seed=4)
    compare_to_float64(r, key, pool64, torch.float32)
    # float64 inputs on the float32 model follow the inputs; the parameters were rounded to float32
    for name in ("rnea", "crba", "forward_kinematics", "potential_energy"):
        used, fn = ALGOS[name]
        x = {k: pool64[k] for k in used.split()}
        out = fn(r, x)
        assert out.dtype == torch.float64
        assert close(out, fn(get_robot(key), x), 1e-5)


def test_mixed_dtypes_rejected():
    r = get_robot("iiwa")
    q, v, a, _ = random_state(r, (2,))
    with pytest.raises(diffmech.ShapeError, match="dtype"):
        r.inverse_dynamics(q.float(), v, a)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("key", ROBOT_IDS)
def test_cuda_matches_cpu(key):
    r_cpu = get_robot(key)
    r = copy.deepcopy(r_cpu).to("cuda")
    assert r.device.type == "cuda"
    pool64 = inputs(r_cpu, 5, seed=5)
    for name, (used, fn) in ALGOS.items():
        x = {k: pool64[k].cuda() for k in used.split()}
        out = fn(r, x)
        assert out.device.type == "cuda", name
        assert close(out.cpu(), fn(r_cpu, {k: pool64[k] for k in used.split()}), 1e-10), name
