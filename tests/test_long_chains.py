"""Long serial chains: index tables that stay O(nv^2), results equal to Pinocchio's, bounded first-call memory.

A dense ``(nv^2, npairs)`` table that placed the CRBA pairs in the mass matrix made the first call's memory
grow with ``nv^4`` (1.1 GB at 100 links, an allocator error at 300). Oracles: Pinocchio on a 300-link 3-D
chain; the sizes of the tables the algorithms build; the peak resident memory of a fresh process.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import diffmech
from diffmech.dynamics import kernels
from diffmech.dynamics._jacobian import jacobian_tables
from oracle import PinOracle, rel_err  # noqa: E402

N = 300
TOL = 1e-9
CRBA_TOL = 1e-8
# The first forward dynamics and mass matrix of the 300-link chain, above what the process held after its
# imports and a warm-up on a 2-link chain: 24 MB measured; the dense table alone would take 30 GB (and
# the old code added 340 MB at 80 links already).
FIRST_CALL_MB = 100


def chain_urdf(n: int) -> str:
    """``n`` revolute links, each 0.1 m above the previous one, axes turning through y, x, z (a 3-D snake)."""
    parts = ['<?xml version="1.0"?><robot name="snake">', '<link name="l0"/>']
    for k in range(1, n + 1):
        m = 1.0 + 0.1 * (k % 3)
        axis = ("0 1 0", "1 0 0", "0 0 1")[k % 3]
        parts.append(
            f'<link name="l{k}"><inertial><origin xyz="0.01 0 0.05" rpy="0 0 0"/><mass value="{m}"/>'
            f'<inertia ixx="{0.01 * m}" ixy="0.0005" ixz="0" iyy="{0.012 * m}" iyz="0" izz="{0.004 * m}"/>'
            f'</inertial></link><joint name="j{k}" type="revolute"><parent link="l{k - 1}"/><child link="l{k}"/>'
            f'<origin xyz="0 0 0.1" rpy="0 0 0.3"/><axis xyz="{axis}"/>'
            f'<limit lower="-3.14" upper="3.14" effort="100" velocity="10"/></joint>')
    parts.append("</robot>")
    return "".join(parts)


@pytest.fixture(scope="module")
def snake(tmp_path_factory):
    path = tmp_path_factory.mktemp("snake") / "snake.urdf"
    path.write_text(chain_urdf(N))
    robot = diffmech.load_urdf(str(path), dtype=torch.float64)
    return robot, PinOracle(robot, str(path))


@pytest.fixture(autouse=True)
def _eager():
    with kernels.native_mode("never"):
        yield


def _tensors(obj):
    """Every tensor in a table bundle (dataclass, named tuple, tuple), recursively."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from _tensors(getattr(obj, f.name))
    elif isinstance(obj, (tuple, list)):
        for x in obj:
            yield from _tensors(x)


def _state(robot, batch: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = 0.6 * (2 * torch.rand(batch, robot.nq, generator=g, dtype=torch.float64) - 1)
    v = torch.randn(batch, robot.nv, generator=g, dtype=torch.float64)
    tau = torch.randn(batch, robot.nv, generator=g, dtype=torch.float64)
    return q, v, tau


@pytest.mark.parametrize("method", ["auto", "aba", "crba"])
def test_forward_dynamics_matches_pinocchio(snake, method):
    """Against Pinocchio's ABA. Solving with the mass matrix (cond(M) ~ 1e8 here) loses digits that ABA
    keeps: Pinocchio's own ``crba`` + solve differs from its ``aba`` by 2e-9 on these states, so
    ``method="crba"`` gets ``CRBA_TOL`` (the default takes ABA on a chain this long)."""
    robot, oracle = snake
    tol = CRBA_TOL if method == "crba" else TOL
    q, v, tau = _state(robot, 2, seed=1)
    qdd = robot.forward_dynamics(q, v, tau, method=method)
    want = np.stack([oracle.aba(*s) for s in zip(q.numpy(), v.numpy(), tau.numpy())])
    assert rel_err(qdd.numpy(), want) < tol
    assert rel_err(robot.forward_dynamics(q[:1], v[:1], tau[:1], method=method).numpy(), want[:1]) < tol


def test_mass_matrix_matches_pinocchio(snake):
    robot, oracle = snake
    q, _, _ = _state(robot, 2, seed=2)
    M = robot.mass_matrix(q)
    assert rel_err(M.numpy(), np.stack([oracle.crba(x) for x in q.numpy()])) < TOL
    torch.testing.assert_close(M, M.transpose(1, 2), rtol=0, atol=0)


def test_tables_stay_quadratic(snake):
    """After the calls above every table the tree keeps has at most 2 nv^2 entries (the pairs of DoFs whose
    mass-matrix entry can be nonzero: all of them on a chain), and the dense scatter matrix is never built."""
    robot, _ = snake
    tree = robot.tree
    q, v, tau = _state(robot, 20)
    robot.forward_dynamics(q, v, tau, method="aba")
    robot.forward_dynamics(q[:1], v[:1], tau[:1], method="crba")
    robot.mass_matrix(q[:1])
    robot.inverse_dynamics(q, v, tau)
    jacobian_tables(tree, torch.float64, torch.device("cpu"))  # small batches of smaller robots take these
    nv = tree.nv
    tables = list(tree._tables.values())
    assert len(tables) >= 3  # the tree's tables, the local-point ones, the Jacobian ones (at least)
    total = 0
    for bundle in tables:
        for t in _tensors(bundle):
            assert t.numel() <= 2 * nv * nv, (type(bundle).__name__, tuple(t.shape))
            total += t.numel()
    assert total <= 12 * nv * nv
    assert tree.tables(torch.float64)._crba_scatter is None


def test_gradients_and_vmap(snake):
    """The gather that places the mass matrix is differentiable and batches under ``torch.func``."""
    robot, _ = snake
    q, v, tau = _state(robot, 2, seed=3)
    q = q.requires_grad_(True)
    M = robot.mass_matrix(q)
    w = torch.randn_like(M)
    (g,) = torch.autograd.grad((M * w).sum(), q)
    # directional derivative against central differences
    d = torch.randn_like(q)
    eps = 1e-6
    with torch.no_grad():
        fd = ((robot.mass_matrix(q + eps * d) - robot.mass_matrix(q - eps * d)) * w).sum() / (2 * eps)
    torch.testing.assert_close((g * d).sum(), fd, rtol=1e-6, atol=1e-6)
    Mv = torch.func.vmap(robot.mass_matrix)(q.detach())
    torch.testing.assert_close(Mv, M.detach(), rtol=1e-10, atol=1e-10)


def test_first_call_memory():
    """The first forward dynamics (batch 1 and 16) and mass matrix of a 300-link chain, in a fresh process,
    add less than ``FIRST_CALL_MB`` to its peak resident memory (``ru_maxrss``; the planar chain of
    ``n_link_pendulum``: the same tables as the 3-D one, without parsing a URDF)."""
    script = textwrap.dedent(f"""
        import resource, torch
        from diffmech.model.systems import n_link_pendulum
        torch.set_num_threads(1)
        s = n_link_pendulum(2)
        z = torch.zeros(1, 2, dtype=torch.float64)
        s.forward_dynamics(z, z, z); s.mass_matrix(z)
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        r = n_link_pendulum({N})
        q = torch.full((1, r.nq), 0.1, dtype=torch.float64)
        r.forward_dynamics(q, q, q); r.mass_matrix(q)
        r.forward_dynamics(q.expand(16, -1), q.expand(16, -1), q.expand(16, -1))
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024)
    """)
    env = dict(os.environ, DIFFMECH_NATIVE="never", OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    added_mb = float(out.stdout.strip().splitlines()[-1])
    assert added_mb < FIRST_CALL_MB, f"first calls added {added_mb:.0f} MB"
