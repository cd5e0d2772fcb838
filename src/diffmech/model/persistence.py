"""Saving and loading parameter modules: ``state_dict`` by physical values, pickling of parametrized modules.

A parameter made learnable through a parametrization (``torch.nn.utils.parametrize``) or an inertial
source is stored by torch under its *raw* tensor only (``links.3.parametrizations.mass.original``,
``links.3.inertial_source.theta``); a model that has not made the parameter learnable the same way
cannot read that key. So the modules here write, besides the raw tensors, the *physical value* the
model reads under the parameter's plain key (``links.3.mass``), and loading follows one rule:

* the physical values are what a state dict restores, whatever each side made learnable;
* where the receiving model holds a parameter the same way as the saved one (same parametrization,
  same inertial source), the raw tensors are restored exactly;
* where it holds it differently, the raw tensor is computed from the value (the parametrization's
  ``right_inverse``, the source's ``set_inertial``); a value outside the parametrization's range
  raises :class:`~diffmech.errors.ModelError` naming the key.

Learnability itself (which tensors are parameters, which parametrizations) is not part of a
state dict: load into a model made learnable the same way to keep training it.

Pickling: torch refuses to pickle a parametrized module (its class is made on the fly); the modules
here pickle as their original class plus the parametrizations, and are rebuilt by the public
``register_parametrization`` on unpickling, raw tensors unchanged (``torch.save(robot)`` works).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from ..errors import ModelError

__all__ = ["PhysicalValues", "reconcile_inertial_source"]


def _parametrized(module: nn.Module, name: str) -> bool:
    return parametrize.is_parametrized(module, name)


def _original_names(plist) -> list[str]:
    return ["original"] if plist.is_tensor else [f"original{i}" for i in range(plist.ntensors)]


class PhysicalValues:
    """Mixin for an ``nn.Module`` holding physical parameters named in :attr:`_physical_names`.

    See the module docstring for what its ``state_dict``/``load_state_dict`` and pickling do.
    """

    _physical_names: tuple[str, ...] = ()

    def _derived_value(self, name: str) -> Tensor | None:
        """The value of ``name`` when it is not a plain tensor of the module (a parametrization's
        output, a joint source's), else ``None``."""
        if _parametrized(self, name):
            return getattr(self, name)
        return None

    # ------------------------------------------------------------------ state_dict
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name in self._physical_names:
            with torch.no_grad():
                value = self._derived_value(name)
            if value is not None:
                destination[prefix + name] = value.detach()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        self._reconcile_sources(state_dict, prefix)
        for name in self._physical_names:
            self._reconcile(name, state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def _reconcile_sources(self, sd: dict, prefix: str) -> None:
        """Hook for modules with joint sources of several values (see :class:`LinkParams`)."""

    def _reconcile(self, name: str, sd: dict, prefix: str) -> None:
        """Rewrite the entries of ``sd`` for parameter ``name`` into the keys this module reads."""
        vk = prefix + name
        rp = f"{prefix}parametrizations.{name}."
        raw = [k for k in sd if k.startswith(rp)]
        if not _parametrized(self, name):
            if raw and vk in sd:
                for k in raw:  # the value restores the parameter; its learnability is the receiver's
                    del sd[k]
            return  # else torch loads the value, or reports it missing and the raw tensors unexpected
        if vk not in sd:
            return  # raw tensors only (or nothing): loaded, or reported missing, by torch
        value = sd.pop(vk)
        if raw and (self._keeps_raw(name) or self._raw_reproduces(name, sd, rp, value)):
            return
        plist = self.parametrizations[name]
        for k in raw:
            del sd[k]
        own = plist.state_dict()
        for k in _original_names(plist):
            own.pop(k)
        for k, t in own.items():  # the receiver's own parametrization modules keep their state
            sd[rp + k] = t
        for k, t in self._raw_from_value(name, value, vk).items():
            sd[rp + k] = t

    def _keeps_raw(self, name: str) -> bool:
        return False

    def _raw_reproduces(self, name: str, sd: dict, rp: str, value: Tensor) -> bool:
        """Whether the receiver's parametrization maps the saved raw tensors to the saved value."""
        plist = self.parametrizations[name]
        names = _original_names(plist)
        if any(rp + k not in sd for k in names):
            return True  # incomplete: torch reports the missing keys
        current = [getattr(plist, k) for k in names]
        raws = [sd[rp + k].to(dtype=c.dtype, device=c.device) for k, c in zip(names, current)]
        # A parametrization with tensors of its own (a value source, a learned map) is evaluated
        # with the saved ones, which are what loading restores.
        own = {k[len(rp):]: t for k, t in sd.items() if k.startswith(rp) and k[len(rp):] not in names}
        with torch.no_grad():
            try:
                if own:
                    plist = copy.deepcopy(plist)
                    plist.load_state_dict(own, strict=False)
                x = plist[0](*raws)
                for m in list(plist)[1:]:
                    x = m(x)
            except Exception:  # noqa: BLE001 -- a raw tensor this parametrization cannot read
                return False
        if not isinstance(x, Tensor) or x.shape != value.shape:
            return False
        value = value.to(dtype=x.dtype, device=x.device)
        eps = max(torch.finfo(x.dtype).eps, torch.finfo(sd[rp + names[0]].dtype).eps)
        scale = max(1.0, float(value.abs().max())) if value.numel() else 1.0
        return bool(((x - value).abs() <= 16 * eps * scale).all())

    def _raw_from_value(self, name: str, value: Tensor, key: str) -> dict[str, Tensor]:
        """The raw tensors of the receiver's parametrization of ``name`` that give ``value``."""
        plist = self.parametrizations[name]
        first = getattr(plist, _original_names(plist)[0])
        new = value.to(dtype=first.dtype, device=first.device)
        with torch.no_grad():
            for m in reversed(list(plist)):
                if getattr(m, "computes_value", False):
                    source = type(getattr(m, "source", m)).__name__
                    raise ModelError(f'loading "{key}": this model computes the value with {source}, which cannot be '
                                     "set from a value (load the values before making the parameter learnable, or "
                                     "save from a model made learnable the same way)")
                if hasattr(m, "right_inverse"):
                    try:
                        new = m.right_inverse(new)
                    except NotImplementedError:
                        pass
                    except (ModelError, ValueError, RuntimeError) as e:
                        raise ModelError(f'loading "{key}": the value {value.tolist()} is outside the range of '
                                         f"this model's parametrization {type(m).__name__}: {e}") from None
        if isinstance(new, Tensor):
            return {"original": new}
        return {f"original{i}": t for i, t in enumerate(new)}

    # ------------------------------------------------------------------ pickling
    def __reduce_ex__(self, protocol):
        if not parametrize.is_parametrized(self):
            return super().__reduce_ex__(protocol)
        state = dict(self.__dict__)
        modules = dict(state["_modules"])
        plists = dict(modules.pop("parametrizations").items())
        state["_modules"] = modules
        return _rebuild_parametrized, (parametrize.type_before_parametrizations(self), state, plists)


def _rebuild_parametrized(cls: type, state: dict, plists: dict) -> nn.Module:
    """Unpickle a parametrized module: its plain state, then each parametrization re-registered by
    the public API (with a placeholder) and replaced by the saved one, raw tensors and all."""
    obj = cls.__new__(cls)
    nn.Module.__setstate__(obj, state)
    for name, plist in plists.items():
        first = getattr(plist, _original_names(plist)[0])
        obj.register_buffer(name, torch.empty(0, dtype=first.dtype, device=first.device))
        parametrize.register_parametrization(obj, name, nn.Identity(), unsafe=True)
        obj.parametrizations[name] = plist
    obj.__setstate__(dict(obj.__dict__))  # let the class finish (a robot re-creates its store)
    return obj


def reconcile_inertial_source(link, sd: dict, prefix: str) -> None:
    """Rewrite the entries of ``sd`` for the ``inertial_source`` of ``link`` (a
    :class:`~diffmech.model.parameters.LinkParams`) so that the values ``mass``/``com``/``inertia``
    of the state dict are what the link reads after loading: a receiver without a source drops the
    source's tensors, one with another kind of source (or the same kind whose saved tensors do not
    give these values) gets its tensors from the values by ``set_inertial``."""
    sp = prefix + "inertial_source."
    keys = [k for k in sd if k.startswith(sp)]
    values = [sd.get(prefix + n) for n in ("mass", "com", "inertia")]
    if any(v is None for v in values):
        return  # loaded, or reported missing or unexpected, by torch
    source = link.inertial_source
    if source is None:
        for k in keys:  # the values restore the link; its learnability is the receiver's
            del sd[k]
        return
    if keys and _source_reproduces(source, {k[len(sp):]: sd[k] for k in keys}, values):
        return
    for k in keys:
        del sd[k]
    setter = getattr(source, "set_inertial", None)
    if setter is None:
        raise ModelError(f'loading "{prefix}mass": the inertial source {type(source).__name__} of this model has '
                         "no set_inertial(mass, com, inertia); the state dict's values cannot be loaded into it")
    tmp = copy.deepcopy(source)
    try:
        with torch.no_grad():
            tmp.set_inertial(*values)
    except ModelError as e:
        raise ModelError(f'loading "{prefix}mass": {e}') from None
    for k, t in tmp.state_dict().items():
        sd[sp + k] = t


def _source_reproduces(source: nn.Module, state: dict, values: list) -> bool:
    """Whether ``source`` with the saved ``state`` gives the saved values."""
    tmp = copy.deepcopy(source)
    try:
        tmp.load_state_dict(state)
        with torch.no_grad():
            got = tmp()
    except Exception:  # noqa: BLE001 -- another kind of source: set it from the values instead
        return False
    saved = next(iter(state.values())).dtype
    for g, v in zip(got, values):
        v = v.to(dtype=g.dtype, device=g.device)
        eps = max(torch.finfo(g.dtype).eps, torch.finfo(saved).eps)
        if g.shape != v.shape or not bool(((g - v).abs() <= 16 * eps * max(1.0, float(v.abs().max()))).all()):
            return False
    return True
