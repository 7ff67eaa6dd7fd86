r"""Surrogates by name: the one place loops and the CLI look models up.

Each entry maps a short name to a dotted path (``module:attribute``), imported only when asked for,
so surrogates living in optional or not-yet-installed modules never break the others. Every class
is constructed as ``Cls(train_X, train_Y, train_Yvar=None, **options)`` (``train_X``: ``n x d`` in
the unit cube, ``train_Y``: ``n x 1``), refit with ``fit(max_iter=...)`` and updated in place with
``update(X, Y)``; see :class:`bo_online.models.base.OnlineModel`.
"""

from __future__ import annotations

import importlib

__all__ = ["MODEL_PATHS", "ModelUnavailableError", "available_models", "get_model_class"]

#: name -> "module:attribute" of the class.
MODEL_PATHS: dict[str, str] = {
    "exact": "bo_online.models.exact:OnlineExactGP",
    "wiski": "bo_online.models:WISKI",
    "tsvgp": "bo_online.models:TSVGP",
    "decoupled": "bo_online.models:DecoupledSVGP",
    "qsgp": "bo_online.models:QSGP",
    "singletaskgp": "bo_online.models.singletask:RefitSingleTaskGP",
}


class ModelUnavailableError(ValueError):
    """The requested surrogate is unknown or cannot be imported in this installation."""


def _import(path: str) -> type:
    module_name, _, attribute = path.partition(":")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attribute)
    except AttributeError as e:
        raise ImportError(f"{module_name} has no attribute {attribute!r}") from e


def get_model_class(name: str) -> type:
    r"""The surrogate class registered as ``name`` (case-insensitive).

    Raises:
        ModelUnavailableError: unknown name, or the class cannot be imported (the message says
            why and which models are available).
    """
    key = name.lower()
    if key not in MODEL_PATHS:
        raise ModelUnavailableError(
            f"Unknown model {name!r}; choose one of {', '.join(available_models())}."
        )
    try:
        return _import(MODEL_PATHS[key])
    except ImportError as e:
        raise ModelUnavailableError(
            f"Model {key!r} ({MODEL_PATHS[key].replace(':', '.')}) is not available in this "
            f"installation ({e}); available: {', '.join(available_models())}."
        ) from e


def available_models() -> list[str]:
    """Names of the registered surrogates that import successfully, in registry order."""
    names = []
    for key, path in MODEL_PATHS.items():
        try:
            _import(path)
        except ImportError:
            continue
        names.append(key)
    return names
