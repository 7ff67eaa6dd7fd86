r"""Object-valued model options, built only from an allow-list.

A model option may describe an object as ``{"__class__": "module.Class", "args": [...],
"kwargs": {...}}`` (the CLI's ``--model-option key=module.Class(literal args)`` and a run's stored
configuration). Such descriptions come from command lines and from run directories that may have
been received from someone else, so nothing is imported or called unless it passes
:func:`check_options` first:

* ``module`` must be one of :data:`ALLOWED_MODULES` (public modules of bo_online and GPyTorch
  holding projections, kernels, means, priors, constraints and likelihoods), and ``Class`` a
  class there that subclasses the module's base class (e.g. ``gpytorch.kernels.Kernel``) --
  never a function;
* the arguments are JSON literals (numbers, strings, booleans, None, lists, dicts), tensors, or
  nested allowed objects;
* a dict with ``__class__`` has no keys other than ``__class__``, ``args`` and ``kwargs``.

Anything else raises :class:`UnsafeOptionError` (a ``ValueError``) before any object is built.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

__all__ = ["ALLOWED_MODULES", "UnsafeOptionError", "check_options", "instantiate"]

#: module -> (module of the base class, base class name): the only places classes come from.
ALLOWED_MODULES: dict[str, tuple[str, str]] = {
    "bo_online.models.wiski.projection": ("torch.nn", "Module"),
    # the module's old path, which saved run configurations name
    "bo_online.models.projection": ("torch.nn", "Module"),
    "gpytorch.kernels": ("gpytorch.kernels", "Kernel"),
    "gpytorch.means": ("gpytorch.means", "Mean"),
    "gpytorch.priors": ("gpytorch.priors", "Prior"),
    "gpytorch.constraints": ("gpytorch.constraints", "Interval"),
    "gpytorch.likelihoods": ("gpytorch.likelihoods", "Likelihood"),
    # t-SVGP's site likelihoods (Gaussian, Bernoulli, Poisson, Student-t)
    "bo_online.likelihoods": ("bo_online.likelihoods", "SiteLikelihood"),
}
_KEYS = {"__class__", "args", "kwargs"}


class UnsafeOptionError(ValueError):
    """A model option names something outside the allow-list (nothing was run)."""


def _allowed_class(path: Any, where: str) -> type:
    r"""The class ``path`` names, after checking it against the allow-list. Only modules in the
    allow-list are imported; the attribute must be a class deriving from the module's base."""
    allowed = ", ".join(f"{m}.*" for m in ALLOWED_MODULES)
    if not isinstance(path, str):
        raise UnsafeOptionError(f"{where}: __class__ must be a string, got {type(path).__name__}.")
    module_name, _, attribute = path.rpartition(".")
    if (
        module_name not in ALLOWED_MODULES
        or not attribute.isidentifier()
        or attribute.startswith("_")
    ):
        raise UnsafeOptionError(
            f"Cannot import {path!r} for a {where}: it is not an allowed class; model options may "
            f"build only classes from {allowed}."
        )
    module = importlib.import_module(module_name)
    base_module, base_name = ALLOWED_MODULES[module_name]
    base = getattr(importlib.import_module(base_module), base_name)
    cls = getattr(module, attribute, None)
    if cls is None:
        raise UnsafeOptionError(f"{where}: {module_name} has no class {attribute!r}.")
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise UnsafeOptionError(
            f"{where}: {path!r} is not a {base_module}.{base_name} class; model options may build "
            f"only classes from {allowed}."
        )
    return cls


def check_options(value: Any, where: str = "model option") -> None:
    r"""Raise :class:`UnsafeOptionError` unless ``value`` is plain JSON data with object
    descriptions naming only allowed classes. Imports only allow-listed modules; builds nothing."""
    if isinstance(value, dict) and "__class__" in value:
        extra = set(value) - _KEYS
        if extra:
            raise UnsafeOptionError(f"{where}: unexpected keys {sorted(extra)} next to __class__.")
        _allowed_class(value["__class__"], where)
        args, kwargs = value.get("args", []), value.get("kwargs", {})
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise UnsafeOptionError(f"{where}: args must be a list and kwargs a dict.")
        for i, a in enumerate(args):
            check_options(a, f"{where} argument {i}")
        for k, v in kwargs.items():
            check_options(v, f"{where} argument {k}")
    elif isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                raise UnsafeOptionError(f"{where}: keys must be strings, got {k!r}.")
            check_options(v, f"{where} {k!r}" if where == "model option" else f"{where}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_options(v, f"{where}[{i}]")
    elif not (value is None or isinstance(value, (bool, int, float, str, torch.Tensor))):
        raise UnsafeOptionError(
            f"{where}: {type(value).__name__} values are not allowed (JSON data, tensors, or "
            "{'__class__': ...} descriptions of allowed classes only)."
        )


def instantiate(value: Any) -> Any:
    r"""Build the objects described in a (JSON-able) option value, after :func:`check_options`.

    A dict ``{"__class__": "module.Class", "args": [...], "kwargs": {...}}`` becomes
    ``Class(*args, **kwargs)`` (recursively), so options that are objects -- e.g. WISKI's
    ``projection`` module or a GPyTorch kernel -- can be given on the command line and stored in
    a run's config; a fresh object is built whenever the model is (its learnt state comes from
    the checkpoint).
    """
    check_options(value)
    return _build(value)


def _build(value: Any) -> Any:
    if isinstance(value, dict) and "__class__" in value:
        cls = _allowed_class(value["__class__"], "model option")
        args = [_build(a) for a in value.get("args", [])]
        kwargs = {k: _build(v) for k, v in value.get("kwargs", {}).items()}
        try:
            return cls(*args, **kwargs)
        # an allow-listed class given unfit arguments (ScaleKernel(3) raises AttributeError)
        except (TypeError, ValueError, RuntimeError, AttributeError, IndexError, KeyError) as e:
            raise ValueError(f"Cannot build the model option {value['__class__']}: {e}") from e
    if isinstance(value, dict):
        return {k: _build(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_build(v) for v in value]
    return value
