"""The thread decision of diffmech.dynamics.threads: one thread for small calls or a busy machine,
torch's setting for large work on spare cores, the user's choice where given, and torch's count given
back on return."""

from __future__ import annotations

import pytest
import torch

import diffmech
from diffmech.dynamics import threads
from diffmech.errors import OptionError
from diffmech.sim import rollout

F64 = torch.float64


@pytest.fixture
def two_threads():
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    policy = threads.set_threads("auto")
    yield
    threads.set_threads(policy)
    torch.set_num_threads(old)


class _Model:
    nv = 7


@threads.decided
def _seen(model, q):
    return torch.get_num_threads()


def test_small_calls_run_on_one_thread_and_give_the_count_back(two_threads, monkeypatch):
    monkeypatch.setattr(threads, "_spare_cores", lambda: 2.0)  # an idle machine
    assert _seen(_Model(), torch.zeros(64, 7)) == 1  # 64 x 49 < SMALL_WORK
    assert _seen(_Model(), q=torch.zeros(64, 7)) == 1  # by name too
    assert torch.get_num_threads() == 2
    big = torch.zeros(threads.SMALL_WORK // 49 + 1, 7)
    assert _seen(_Model(), big) == 2  # enough work, a core to spare: torch's setting
    monkeypatch.setattr(threads, "_spare_cores", lambda: 0.2)  # busy: one thread at any size
    assert _seen(_Model(), big) == 1
    assert _seen(_Model(), torch.zeros(1 << 16, 7)) == 1
    assert torch.get_num_threads() == 2


def test_policies(two_threads, monkeypatch):
    monkeypatch.setattr(threads, "_spare_cores", lambda: 2.0)
    threads.set_threads("torch")
    assert _seen(_Model(), torch.zeros(1, 7)) == 2
    threads.set_threads(3)
    assert _seen(_Model(), torch.zeros(1, 7)) == 3
    assert torch.get_num_threads() == 2
    for bad in (0, -1, "fast", 1.5, True):
        with pytest.raises(OptionError, match="set_threads"):
            threads.set_threads(bad)


def test_holds_nest_and_restore(two_threads):
    with threads.hold(1):
        assert torch.get_num_threads() == 1
        with threads.one_thread():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError):
        with threads.hold(1):
            raise RuntimeError("inside")
    assert torch.get_num_threads() == 2


def test_public_calls_and_backward_restore_the_count_and_agree(two_threads):
    """forward dynamics and a checkpointed rollout with its backward: the same numbers whatever the
    thread count (to rounding), and torch's count unchanged afterwards."""
    robot = diffmech.systems.n_link_pendulum(5)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(16, 5, generator=g, dtype=F64)
    v = torch.randn(16, 5, generator=g, dtype=F64)
    tau = torch.randn(16, 50, 5, generator=g, dtype=F64, requires_grad=True)
    out = {}
    for policy in ("auto", 2):
        threads.set_threads(policy)
        a = robot.forward_dynamics(q, v, tau[:, 0])
        Q, V = rollout(robot, q, v, tau, 1e-3)
        (gt,) = torch.autograd.grad((Q[:, -1] ** 2).sum(), tau)
        assert torch.get_num_threads() == 2
        out[policy] = (a.detach(), Q.detach(), gt)
    for x, y in zip(out["auto"], out[2]):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-14)


def test_environment_variable(monkeypatch):
    for raw, want in (("auto", "auto"), ("torch", "torch"), ("4", 4)):
        monkeypatch.setenv("DIFFMECH_THREADS", raw)
        assert threads._from_environment() == want
    monkeypatch.setenv("DIFFMECH_THREADS", "lots")
    with pytest.warns(UserWarning, match="DIFFMECH_THREADS"):
        assert threads._from_environment() == "auto"
