"""diffmech.learn: the E2E-SyMo implicit backward pass by directional derivatives of the network
(``LagrangianNet.directional_heads``, ``weighted_del_residual``) against autograd, in float64."""

from __future__ import annotations

import pytest
import torch

from diffmech.learn import E2ESyMo, LagrangianNet, StepSamples

DT = torch.float64
MASKS = [(True,), (False, True), (True, True, False)]


def _batch(n, B=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    q_prev = torch.randn(B, n, generator=g, dtype=DT)
    q = q_prev + 0.05 * torch.randn(B, n, generator=g, dtype=DT)
    q_next = 2 * q - q_prev + 1e-3 * torch.randn(B, n, generator=g, dtype=DT)
    u = torch.randn(B, n, generator=g, dtype=DT)
    return StepSamples(q_prev, q, (q - q_prev) / 0.1, q_next, (q_next - q) / 0.1, u, 0.5 * u, 0.2 * u)


@pytest.mark.parametrize("mask", MASKS)
def test_directional_heads_values_derivatives_and_parameter_gradients(mask):
    """Heads' outputs and their derivative along d against forward-mode AD of the jets' value, and the
    hand-written reverse pass against autograd through the (autograd-traced) first-order jets."""
    torch.manual_seed(4)
    n = len(mask)
    net = LagrangianNet(mask, width=16).double()
    q = torch.randn(2, 5, n, dtype=DT)
    d = torch.randn(2, 5, n, dtype=DT)
    o, od = net.directional_heads(q, d)

    def heads(x):
        return net._head_jet(x, 0)[0]

    o_ref, od_ref = torch.func.jvp(heads, (q,), (d,))
    assert torch.allclose(o, o_ref, atol=1e-13) and torch.allclose(od, od_ref, atol=1e-13)
    go, god = torch.randn_like(o), torch.randn_like(od)
    params = list(net._params())
    g = torch.autograd.grad((o * go).sum() + (od * god).sum(), params)
    out = net._head_jet(q, 1)  # (1 + n, ..., m) with a graph: value and the n first derivatives
    od_jet = (out[1:] * d.movedim(-1, 0)[..., None]).sum(0)
    g_ref = torch.autograd.grad((out[0] * go).sum() + (od_jet * god).sum(), params)
    for a, b in zip(g, g_ref):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("inertia", ["paper", "cholesky"])
@pytest.mark.parametrize("dissipation", [False, True])
def test_weighted_del_residual_is_the_vector_jacobian_product(mask, inertia, dissipation):
    torch.manual_seed(5)
    n = len(mask)
    m = E2ESyMo(mask, 0.1, 12, inertia=inertia, dissipation=dissipation).double()
    b = _batch(n, seed=6)
    lam = torch.randn_like(b.q)
    params = [p for p in m.parameters() if p.numel()]
    args = (b.q_prev, b.q, b.u_prev, b.u, b.u_next)
    s = m.weighted_del_residual(b.q_next, lam, *args)
    g = m.del_residual(b.q_next, *args)
    assert torch.allclose(s, (lam * g).sum(), rtol=1e-13, atol=1e-14)
    gs = torch.autograd.grad(s, params, allow_unused=True)
    gr = torch.autograd.grad(g, params, grad_outputs=lam, allow_unused=True)
    for a, c, p in zip(gs, gr, params):
        a = torch.zeros_like(p) if a is None else a
        c = torch.zeros_like(p) if c is None else c
        assert torch.allclose(a, c, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("mask", MASKS)
def test_e2e_backward_paths_agree(mask):
    """The implicit backward pass by the directional VJP on the jets kept from the forward pass, by the
    directional VJP recomputing them, and by autograd through the DEL residual give one gradient."""
    torch.manual_seed(7)
    n = len(mask)
    b = _batch(n, B=4, seed=8)
    grads = []
    for mode in ("kept", "recomputed", "autograd", "stragglers"):
        torch.manual_seed(7)
        m = E2ESyMo(mask, 0.1, 8, tol=1e-11, max_iter=30).double()
        m.fast_vjp = mode != "autograd"
        if mode == "stragglers":  # two solves merged: the first one's kept jets are not at its roots
            m.straggler_iter = 1
        found = []
        if mode == "recomputed":
            m.net._find_tape = lambda q: None
        elif mode == "kept":
            def counted(q, find=m.net._find_tape, found=found):
                found.append(find(q))
                return found[-1]

            m.net._find_tape = counted
        loss, info = m.objective(b)
        assert info["failures"] == 0
        grads.append(torch.autograd.grad(loss, list(m.parameters())))
        if mode == "kept":
            assert len(found) == 2 and all(f is not None for f in found)  # both midpoints' jets were reused
    for other in grads[1:]:
        for a, c in zip(grads[0], other):
            assert torch.allclose(a, c, rtol=1e-10, atol=1e-14)
    # the kept jets belong to the weights they were computed with: an in-place update retires them
    torch.manual_seed(7)
    m = E2ESyMo(mask, 0.1, 8, tol=1e-11, max_iter=30).double()
    m.objective(b)
    q_mid = 0.5 * (b.q_prev + b.q)
    assert m.net._find_tape(q_mid) is not None
    with torch.no_grad():
        m.net.trunk.l2.weight.add_(0.0)
    assert m.net._find_tape(q_mid) is None
    with torch.no_grad():  # and solves without gradients keep none
        m.predict(b)
    assert m.net._tapes is None


@pytest.mark.parametrize("name", ["node-rk4", "lnode-rk4", "symo", "e2e-symo"])
def test_training_step_on_arrays_large_enough_for_the_sigmoid_tanh(name):
    """Batch x width above the size where tanh is computed through the sigmoid (in place only without a
    graph): the objective's gradient exists, is finite, and the one of the trunk matches float64's."""
    from diffmech.learn import build_model

    grads = {}
    for dtype in (torch.float32, torch.float64):
        torch.manual_seed(11)
        m = build_model(name, (False, True), 0.05, width=256, input_matrix=torch.tensor([[1.0], [0.0]])).to(dtype)
        b = _batch(2, B=32, seed=12)
        b = StepSamples(b.q_prev, b.q, b.v, b.q_next, b.v_next, b.u_prev[:, :1], b.u[:, :1],
                        b.u_next[:, :1]).to(dtype=dtype)
        loss, _ = m.objective(b)
        loss.backward()
        grads[dtype] = next(p for n, p in m.named_parameters() if n.endswith("l2.weight")).grad
    assert torch.isfinite(grads[torch.float32]).all()
    assert torch.allclose(grads[torch.float32].double(), grads[torch.float64], rtol=1e-3,
                          atol=1e-4 * float(grads[torch.float64].abs().max()))
