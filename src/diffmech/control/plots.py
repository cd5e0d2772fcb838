"""Figures and animations of learned modes and their stabilisation (matplotlib, PNG and GIF)."""

from __future__ import annotations

import os

import numpy as np
import torch

from .hamiltonian import HamiltonianSystem

__all__ = ["plot_training", "plot_mode", "plot_potential", "plot_control", "plot_stabilization", "plot_multipliers",
           "plot_efficiency", "animate", "chain_points"]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return path


def chain_points(system: HamiltonianSystem, q: np.ndarray) -> np.ndarray:
    """World ``(x, z)`` of every link origin along the trajectory, ``(K, n_links, 2)`` (planar view)."""
    with torch.no_grad():
        qt = torch.as_tensor(q, dtype=system.dtype, device=system.device)
        T = system.robot.forward_kinematics(system.full_configuration(qt))
    pos = T[..., :3, 3].cpu().double().numpy()
    return pos[..., [0, 2]]


def plot_training(history: list[dict], path: str) -> str:
    plt = _plt()
    steps = np.array([h["step"] for h in history])
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.4))
    for key in ("total", "task", "constraint"):
        ax[0].semilogy(steps, np.maximum([h[key] for h in history], 1e-12), label=key)
    ax[0].set_xlabel("step")
    ax[0].legend()
    ax[0].set_title("loss terms")
    ax[1].semilogy(steps, [h["ee_error"] for h in history])
    ax[1].axhline(0.01, color="k", lw=0.8, ls="--")
    ax[1].set_title("end-effector error at T/2 (m, fixed-step)")
    ax[1].set_xlabel("step")
    ax[2].plot(steps, [h["effort"] for h in history], label="effort")
    ax2 = ax[2].twinx()
    ax2.plot(steps, [h["period"] for h in history], color="C3", label="period")
    ax[2].set_title("effort (left), period T (right, s)")
    ax[2].set_xlabel("step")
    return _save(fig, path)


def plot_mode(system: HamiltonianSystem, traj: dict, target, path: str, *, q0=None) -> str:
    """Joint angles and momenta over one period, and the end-effector path with the target."""
    plt = _plt()
    t, q, p, ee = traj["t"], traj["q"], traj["p"], traj["ee"]
    n = q.shape[1]
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.6))
    for i in range(n):
        ax[0].plot(t, q[:, i], label=f"q{i + 1}")
        ax[1].plot(t, p[:, i], label=f"p{i + 1}")
    T = t[-1]
    for a in ax[:2]:
        a.axvline(T / 2, color="k", lw=0.8, ls="--")
        a.set_xlabel("t (s)")
        a.legend()
    ax[0].set_title("configuration (rad)")
    ax[1].set_title("momentum")
    pts = chain_points(system, q)
    ih = len(t) // 2
    for k, style in ((0, "0.6"), (ih, "C1")):
        ax[2].plot(np.r_[0.0, pts[k, :, 0]], np.r_[0.0, pts[k, :, 1]], "-o", color=style, ms=3)
    ax[2].plot(ee[:, 0], ee[:, 2], "C0", label="end effector")
    if target is not None:
        tg = np.asarray(target)
        ax[2].plot(tg[0], tg[2], "r*", ms=12, label="target")
    ax[2].set_aspect("equal")
    ax[2].set_xlabel("x (m)")
    ax[2].set_ylabel("z (m)")
    ax[2].legend(loc="best", fontsize=8)
    ax[2].set_title("end-effector path (grey: t=0, orange: T/2)")
    return _save(fig, path)


def plot_potential(system: HamiltonianSystem, traj: dict, path: str, *, span: float = 1.0, res: int = 121) -> str:
    """``V_theta`` (and ``H`` level sets of the closed loop) over the first two coordinates, orbit on top."""
    plt = _plt()
    q = traj["q"]
    lo, hi = q.min(0) - span, q.max(0) + span
    a = np.linspace(lo[0], hi[0], res)
    b = np.linspace(lo[1], hi[1], res)
    A, Bm = np.meshgrid(a, b)
    Q = np.tile(q.mean(0), (res * res, 1))
    Q[:, 0], Q[:, 1] = A.ravel(), Bm.ravel()
    with torch.no_grad():
        Qt = torch.as_tensor(Q, dtype=system.dtype, device=system.device)
        V = system.control_potential(Qt).cpu().double().numpy().reshape(res, res)
        U = (system.plant_potential(Qt) + system.control_potential(Qt)).cpu().double().numpy().reshape(res, res)
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.3))
    panels = ((ax[0], V, "learned potential V_theta (J)"), (ax[1], U, "closed-loop potential U + V_theta (J)"))
    for axis, Z, title in panels:
        cs = axis.contourf(A, Bm, Z, levels=30, cmap="viridis")
        fig.colorbar(cs, ax=axis)
        axis.plot(q[:, 0], q[:, 1], "w-", lw=2)
        axis.plot(q[0, 0], q[0, 1], "wo")
        axis.plot(q[len(q) // 2, 0], q[len(q) // 2, 1], "r*", ms=12)
        axis.set_xlabel("q1 (rad)")
        axis.set_ylabel("q2 (rad)")
        axis.set_title(title)
    return _save(fig, path)


def plot_control(traj: dict, path: str) -> str:
    plt = _plt()
    t, u, ell = traj["t"], traj["u"], traj["effort"]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.4))
    for i in range(u.shape[1]):
        ax[0].plot(t, u[:, i], label=f"u{i + 1}")
    ax[0].set_title("control force u = -grad V_theta (N m)")
    ax[0].set_xlabel("t (s)")
    ax[0].legend()
    ax[1].plot(t, ell)
    ax[1].set_title("effort int ||u||^2 dt")
    ax[1].set_xlabel("t (s)")
    return _save(fig, path)


def plot_stabilization(runs: dict[str, dict], E_target: float, path: str) -> str:
    """Energy, distances to the orbit and injected power for several simulations."""
    plt = _plt()
    fig, ax = plt.subplots(1, 4, figsize=(17, 3.6))
    for name, r in runs.items():
        t = r["t"]
        ax[0].plot(t, r["H"], label=name)
        ax[1].semilogy(t, np.maximum(r["dist_q"], 1e-12), label=name)
        ax[2].semilogy(t, np.maximum(r["dist_p"], 1e-12), label=name)
        ax[3].plot(t, r["power_E"] + r["power_M"], label=name)
    ax[0].axhline(E_target, color="k", ls="--", lw=0.8, label="E*")
    ax[0].set_title("H_theta (J)")
    ax[1].set_title("distance to orbit in q (rad)")
    ax[2].set_title("distance to orbit in p")
    ax[3].set_title("power injected by u_E + u_M (W)")
    for a in ax:
        a.set_xlabel("t (s)")
    ax[0].legend(fontsize=7)
    return _save(fig, path)


def plot_multipliers(mults: dict[str, np.ndarray], path: str) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.2, 4.2))
    th = np.linspace(0, 2 * np.pi, 200)
    ax.plot(np.cos(th), np.sin(th), "k-", lw=0.8)
    ax.plot(0.5 * np.cos(th), 0.5 * np.sin(th), "k:", lw=0.6)
    for (name, m), mk in zip(mults.items(), ("o", "x", "+", "s")):
        m = np.asarray(m)
        ax.plot(m.real, m.imag, mk, ms=8, label=name, fillstyle="none")
    ax.set_aspect("equal")
    ax.set_xlim(-1.2, 1.2)
    ax.set_ylim(-1.2, 1.2)
    ax.legend(fontsize=7)
    ax.set_title("cycle multipliers")
    return _save(fig, path)


def plot_efficiency(t: np.ndarray, curves: dict[str, np.ndarray], path: str, ylabel: str) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name, c in curves.items():
        ax.plot(t, c, label=name)
    ax.set_xlabel("t (s)")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    return _save(fig, path)


def animate(system: HamiltonianSystem, q: np.ndarray, path: str, *, t: np.ndarray | None = None, target=None,
            orbit_q: np.ndarray | None = None, frames: int = 60, fps: int = 20, title: str = "") -> str:
    """A GIF of the arm moving through configurations ``q (K, n)`` (planar x-z view)."""
    plt = _plt()
    from matplotlib.animation import FuncAnimation, PillowWriter

    idx = np.linspace(0, len(q) - 1, min(frames, len(q))).astype(int)
    pts = chain_points(system, q[idx])
    reach = np.abs(pts).max() * 1.1 + 0.1
    fig, ax = plt.subplots(figsize=(3.6, 3.6))
    ax.set_xlim(-reach, reach)
    ax.set_ylim(-reach, reach)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    if orbit_q is not None:
        ee_orbit = chain_points(system, orbit_q)[:, -1]
        ax.plot(ee_orbit[:, 0], ee_orbit[:, 1], "0.7", lw=1)
    if target is not None:
        tg = np.asarray(target)
        ax.plot(tg[0], tg[2], "r*", ms=10)
    (line,) = ax.plot([], [], "-o", color="C0", lw=2.5, ms=4)
    (trail,) = ax.plot([], [], "C1", lw=1)
    label = ax.text(0.02, 0.95, "", transform=ax.transAxes, fontsize=8)
    ax.set_title(title, fontsize=9)

    def update(k):
        P = pts[k]
        line.set_data(np.r_[0.0, P[:, 0]], np.r_[0.0, P[:, 1]])
        trail.set_data(pts[: k + 1, -1, 0], pts[: k + 1, -1, 1])
        if t is not None:
            label.set_text(f"t = {t[idx[k]]:.2f} s")
        return line, trail, label

    anim = FuncAnimation(fig, update, frames=len(idx), blit=True)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    anim.save(path, writer=PillowWriter(fps=fps), dpi=60)
    plt.close(fig)
    return path
