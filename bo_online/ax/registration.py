r"""Registration with Ax: every bo_online class and its Ax subclass go into Ax's JSON/SQA
registries, and ``fit_botorch_model`` learns to fit :class:`OnlineModel` s."""

from __future__ import annotations

import importlib
from typing import Any, Sequence

from bo_online.ax.store import _LOCK
from bo_online.ax.surrogate import AxOnlineMixin, _resolve, ax_model_class
from bo_online.models.base import OnlineModel

#: Dotted paths of the bo_online surrogates made available to Ax on import (skipped while absent).
DEFAULT_MODEL_PATHS: tuple[str, ...] = (
    "bo_online.models.OnlineExactGP",
    "bo_online.models.WISKI",
    "bo_online.models.TSVGP",
    "bo_online.models.DecoupledSVGP",
    "bo_online.models.QSGP",
)

_REGISTERED: dict[str, type] = {}


def _register_fitting() -> None:
    """Teach Ax's ``fit_botorch_model`` dispatcher to fit :class:`OnlineModel` s (once)."""
    from ax.generators.torch.botorch_modular.utils import fit_botorch_model

    if "bo_online" in getattr(fit_botorch_model, "_bo_online_marker", ""):
        return

    @fit_botorch_model.register(OnlineModel)
    def _fit_online_model(
        model: OnlineModel, mll_class: Any = None, mll_options: dict[str, Any] | None = None
    ) -> None:
        # The model's objective is its own (exact MLL or ELBO from its statistics), so Ax's
        # ``mll_class`` is not used; ``mll_options`` are passed to ``fit`` where it takes them.
        if isinstance(model, AxOnlineMixin):
            model.ax_fit()
        else:
            model.custom_fit(None, **(mll_options or {}))

    fit_botorch_model._bo_online_marker = "bo_online"  # type: ignore[attr-defined]


def register_model_class(model_class: type[OnlineModel] | str) -> type:
    r"""Make one bo_online model class usable by Ax and storable in JSON: registers the class and
    its Ax subclass with Ax's storage registries and returns the Ax subclass."""
    from ax.storage.botorch_modular_registry import register_model

    cls = _resolve(model_class)
    ax_cls = ax_model_class(cls)
    with _LOCK:
        _register_fitting()
        for c in (cls, ax_cls):
            register_model(c)
            _REGISTERED[c.__name__] = c
    return ax_cls


def register_all(paths: Sequence[str] = DEFAULT_MODEL_PATHS) -> dict[str, type]:
    r"""Register every importable class in ``paths`` (dotted); absent ones are skipped.

    Returns:
        ``{base class name: Ax subclass}`` for the classes now available.
    """
    out: dict[str, type] = {}
    for path in paths:
        module_name, _, attr = path.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError):
            continue
        out[cls.__name__] = register_model_class(cls)
    return out
