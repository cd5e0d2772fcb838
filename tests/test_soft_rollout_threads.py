"""The thread count of the autograd adjoint's backward pass through a ``Scene(solver="mujoco")`` rollout.

torch's engine runs that pass, outside the thread decision of diffmech's calls; the rollout sets it
for the pass (one thread at a small batch, as the checkpointed backward) and gives torch's count back
when the pass leaves the rollout, ends, or raised (then at the next such rollout).
"""

from __future__ import annotations

import pytest
import torch

from diffmech.dynamics import threads
from diffmech.model.systems import sphere
from diffmech.sim import Scene, rollout


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _ball():
    scene = Scene([sphere(0.1, 1.5, gravity=9.81)], solver="mujoco", friction=0.5)
    q0 = torch.tensor([[0.0, 0.0, 0.0999, 0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)  # resting, 0.1 mm deep
    v0 = torch.tensor([[0.3, -0.2, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    return scene, q0, v0


def test_backward_runs_on_one_thread_and_gives_the_count_back(two_threads):
    scene, q0, v0 = _ball()
    tau = torch.zeros(1, 4, scene.nv, dtype=torch.float64, requires_grad=True)
    seen = []

    def unpack(x):  # runs inside the backward pass, where each saved tensor is read
        seen.append(torch.get_num_threads())
        return x

    with torch.autograd.graph.saved_tensors_hooks(lambda x: x, unpack):
        Q, _ = rollout(scene, q0, v0, tau, 0.005, adjoint="autograd")
    (g,) = torch.autograd.grad(Q[..., -1, :3].sum(), [tau])
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == 2 and threads._HELD[0] == 0
    Qc, _ = rollout(scene, q0, v0, tau, 0.005)
    (gc,) = torch.autograd.grad(Qc[..., -1, :3].sum(), [tau])
    assert torch.allclose(g, gc, rtol=1e-9, atol=1e-12)  # the same gradient as the checkpointed adjoint


def test_count_given_back_without_a_grad_input_and_after_a_raising_pass(two_threads):
    scene, q0, v0 = _ball()
    v = v0.clone().requires_grad_()
    Q, _ = rollout(scene, q0, v, torch.zeros(1, 3, scene.nv, dtype=torch.float64), 0.005, adjoint="autograd")
    y = Q[..., -1, 0].sum()
    torch.autograd.grad(y, [v])
    assert torch.get_num_threads() == 2 and threads._HELD[0] == 0
    with pytest.raises(RuntimeError, match="second time"):  # the graph was freed: the pass raises inside
        torch.autograd.grad(y, [v])
    Q, _ = rollout(scene, q0, v0, torch.zeros(1, 3, scene.nv, dtype=torch.float64), 0.005, adjoint="autograd")
    assert torch.get_num_threads() == 2 and threads._HELD[0] == 0
