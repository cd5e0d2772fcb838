"""The contact problem of a step with one mass-matrix block -- its assembly and its reverse pass
(:mod:`diffmech.contact.impulses`) -- as small C kernels.

Per environment, with ``R = 3K`` rows and ``nv`` velocities, the forward kernel forms ``W = M^-1 J^T``
(forward and back substitution with the Cholesky factor), ``A = J W``, the normal velocity before the
step and ``c = J v_free - (b, 0, 0)`` with the normal targets of
:func:`~diffmech.contact.impulses.assemble`; the backward kernels form the cotangents of
:func:`~diffmech.contact.impulses.update_vjp` (the solution's implicit pull-back between them is
:func:`~diffmech.contact.pgs.implicit_vjp`'s). In torch each is a few dozen operations on a few hundred
numbers: with one robot, their dispatch was a third of a step's gradient. Built once per machine
(one C file, about a second); where it cannot run (native kernels off, no compiler, not a CPU
float32/float64 tensor) the callers use the torch code.
"""

from __future__ import annotations

import ctypes
import hashlib
from pathlib import Path

import torch
from torch import Tensor

from ..dynamics import kernels
from ..dynamics.kernel_store import NativeUnavailable, load_kernel

__all__ = ["available", "assemble_native", "apply_native", "backward_native"]

def _template() -> str:
    """The C template (``update.c`` beside this module, shipped as package data)."""
    return Path(__file__).with_name("update.c").read_text()


def _source() -> str:
    template = _template()
    parts = [template.replace("REAL", real).replace("SUFFIX", suffix)
             for real, suffix in (("double", "f64"), ("float", "f32"))]
    return parts[0] + parts[1].split("#include <stdlib.h>", 1)[1]


_LIB: list = []


def _library():
    if not _LIB:
        try:
            source = _source()
            key = "diffmech-contact-update-" + hashlib.sha256(source.encode()).hexdigest()
            lib, _ = load_kernel(key, lambda: (source, {"kernel": "contact update"}),
                                 name="contact update",
                                 symbols=tuple(f"{n}_{s}" for n in ("assemble", "apply", "backward1", "backward2")
                                               for s in ("f64", "f32")))
        except NativeUnavailable:
            lib = None
        else:
            i64, ptr, dbl = ctypes.c_int64, ctypes.c_void_p, ctypes.c_double
            for s in ("f64", "f32"):
                f = getattr(lib, f"assemble_{s}")
                f.restype, f.argtypes = None, [i64] * 3 + [ptr] * 6 + [dbl] * 3 + [ptr] * 6
                f = getattr(lib, f"apply_{s}")
                f.restype, f.argtypes = None, [i64] * 3 + [ptr] * 5
                f = getattr(lib, f"backward1_{s}")
                f.restype, f.argtypes = None, [i64] * 3 + [ptr] * 7
                f = getattr(lib, f"backward2_{s}")
                f.restype, f.argtypes = None, [i64] * 3 + [ptr] * 16 + [dbl] + [ptr] * 6
        _LIB.append(lib)
    return _LIB[0]


def available(x: Tensor) -> bool:
    """Whether the kernels can run on tensors like ``x``."""
    return (x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and kernels.native_allowed()
            and _library() is not None)


def _c(x: Tensor, dtype) -> Tensor:
    if x.dtype is dtype and not x.requires_grad and x.is_contiguous():
        return x  # the common case, checked first: a call at one robot is tens of microseconds
    return x.detach().to(dtype).contiguous()


def assemble_native(J: Tensor, L: Tensor, v: Tensor, v_free: Tensor, phi: Tensor, e: Tensor, dt: float,
                    baumgarte: float, bounce_speed: float) -> tuple[Tensor, ...]:
    """:func:`~diffmech.contact.impulses.assemble` for one block: ``J (B, 3K, nv)``, ``L (B, nv, nv)``,
    ``v, v_free (B, nv)``, ``phi, e (B, K)`` -> ``(A, c, W, vn, bounce (bool), scale)`` (no graph)."""
    B, R, nv = J.shape
    K = R // 3
    dtype = J.dtype
    ins = [_c(x, dtype) for x in (J, L, v, v_free, phi, e)]
    A, c, W = J.new_empty(B, R, R), J.new_empty(B, R), J.new_empty(B, nv, R)
    vn, bounce, scale = J.new_empty(B, K), J.new_empty(B, K), J.new_empty(B, K)
    fn = getattr(_library(), "assemble_f64" if dtype == torch.float64 else "assemble_f32")
    fn(B, nv, K, *[x.data_ptr() for x in ins], float(dt), float(baumgarte), float(bounce_speed),
       *[x.data_ptr() for x in (A, c, W, vn, bounce, scale)])
    return A, c, W, vn, bounce.bool(), scale


def apply_native(W: Tensor, lam: Tensor, v_free: Tensor) -> tuple[Tensor, Tensor]:
    """``u = W lam`` and ``v+ = v_free + u`` (``W (B, nv, 3K)``, ``lam (B, K, 3)``, ``v_free (B, nv)``), no graph:
    the impulses' velocity change, computed by every route of a step the same way (bit for bit)."""
    B, nv, R = W.shape
    dtype = W.dtype
    W_, lam_, vf_ = _c(W, dtype), _c(lam, dtype), _c(v_free, dtype)
    u, v1 = W.new_empty(B, nv), W.new_empty(B, nv)
    getattr(_library(), "apply_f64" if dtype == torch.float64 else "apply_f32")(
        B, nv, R, W_.data_ptr(), lam_.data_ptr(), vf_.data_ptr(), u.data_ptr(), v1.data_ptr())
    return u, v1


def backward_native(g: Tensor, J: Tensor, v: Tensor, v_free: Tensor, phi: Tensor, mu: Tensor, e: Tensor,
                    lam: Tensor, u: Tensor, c: Tensor, W: Tensor, vn: Tensor, bounce: Tensor, scale: Tensor,
                    L: Tensor, dt: float, implicit_vjp) -> tuple[Tensor, ...]:
    """:func:`~diffmech.contact.impulses.update_vjp` for one block (``L (B, nv, nv)``): ``(g_J, g_v,
    g_vf, g_phi, g_mu, g_e, g_L)``, ``g_mu`` ``None`` where no block slides; ``implicit_vjp`` the
    solution's pull-back (:func:`~diffmech.contact.pgs.implicit_vjp`)."""
    B, R, nv = J.shape
    K = R // 3
    dtype = J.dtype
    lib = _library()
    s = "f64" if dtype == torch.float64 else "f32"
    J_, W_, L_, g_ = _c(J, dtype), _c(W, dtype), _c(L, dtype), _c(g, dtype)
    y, g_lam, A = J.new_empty(B, nv), J.new_empty(B, R), J.new_empty(B, R, R)
    getattr(lib, f"backward1_{s}")(B, nv, R, g_.data_ptr(), J_.data_ptr(), W_.data_ptr(), L_.data_ptr(),
                                   y.data_ptr(), g_lam.data_ptr(), A.data_ptr())
    a, d, g_mu = implicit_vjp(lam, A, c, mu, g_lam.reshape(B, K, 3))
    ins = [g_, J_] + [_c(x, dtype) for x in (v, v_free, phi, e, lam.reshape(B, R), u, W_)]
    ins += [_c(x, dtype) for x in (vn, bounce.to(dtype), scale)] + [L_, y, _c(a, dtype)]
    d_ = None if d is None else _c(d, dtype)
    g_J, g_v, g_vf = J.new_empty(B, R, nv), J.new_empty(B, nv), J.new_empty(B, nv)
    g_phi, g_e, g_L = J.new_empty(B, K), J.new_empty(B, K), J.new_empty(B, nv, nv)
    getattr(lib, f"backward2_{s}")(B, nv, K, *[x.data_ptr() for x in ins], 0 if d_ is None else d_.data_ptr(),
                                   float(dt), *[x.data_ptr() for x in (g_J, g_v, g_vf, g_phi, g_e, g_L)])
    return g_J, g_v, g_vf, g_phi, g_mu, g_e, g_L
