r"""Binary classifiers for the streaming loop, under the loop's model interface.

The streaming loop builds a surrogate as ``Cls(train_X, train_Y, **options)`` (``train_Y``:
``n x 1`` labels in {0, 1}), updates it with ``update(X, Y)``, refits it with
``fit(max_iter=...)`` and checkpoints it with ``state_dict`` / ``load_state_dict``. For a
classification stream it also asks ``predict_proba(X) -> p(y = 1 | x)`` (``n``). Two surrogates
classify:

* ``tsvgp`` -- :class:`TSVGPClassifier`, a :class:`~bo_online.models.TSVGP` with a
  :class:`~bo_online.likelihoods.Bernoulli` likelihood (probit by default). Its predictive
  probability is ``E_{q(f)}[Phi(f)] = Phi(mu / sqrt(1 + s^2))`` for the probit link (closed form);
  for the logit link Gauss-Hermite quadrature (``Bernoulli.predictive_prob``). Its constant
  mean has a weak Gaussian prior (:data:`CONSTANT_PRIOR_SD`), which keeps it finite when every
  label seen so far is one class. Its default kernel has a learned outputscale (the latent scale
  of labels is unknown; ``tsvgp.model.default_covar_module``).
* ``wiski`` -- :class:`WISKIBinaryClassifier`, the two-class
  :class:`~bo_online.models.wiski.classification.WISKIDirichletClassifier` (Milios et al.
  Dirichlet regression); its probability is the (seeded) Monte-Carlo average of the softmax.

:func:`classifier_class` maps a registry name to one of them, with a one-line error for a
surrogate that cannot classify.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

import torch
from gpytorch.priors import NormalPrior
from torch import Tensor

from bo_online.likelihoods import Bernoulli
from bo_online.models.tsvgp import TSVGP
from bo_online.models.wiski import WISKI
from bo_online.models.wiski.classification import WISKIDirichletClassifier, check_num_samples

__all__ = [
    "CONSTANT_PRIOR_SD",
    "TSVGPClassifier",
    "WISKIBinaryClassifier",
    "CLASSIFIERS",
    "classifier_class",
]

#: link -> standard deviation of the ``N(0, sd^2)`` prior on the t-SVGP classifier's constant
#: mean (latent units). With labels of one class only, the maximum of the bound sends the
#: constant to -inf (the fit stopped at -7.3 probit / -12.6 logit on 20 zeros: p(y = 1) ~ 1e-7,
#: which the first positive label then costs 16 nats). Under this prior ``Phi(+-2 sd)`` still
#: spans 3e-5 .. 1 - 3e-5 (probit); the logit scale is 1.7x the probit one.
CONSTANT_PRIOR_SD: dict[str, float] = {"probit": 2.0, "logit": 3.4}


class TSVGPClassifier(TSVGP):
    r"""t-SVGP with a Bernoulli likelihood on labels {0, 1}.

    Args:
        train_X: ``n x d`` inputs (unit cube); train_Y: ``n x 1`` labels in {0, 1}.
        link: ``"probit"`` (default) or ``"logit"``.
        **options: the other :class:`~bo_online.models.TSVGP` options (``inducing_points``, ...).
    """

    def __init__(
        self, train_X: Tensor, train_Y: Tensor, link: str = "probit", **options: Any
    ) -> None:
        if "likelihood" in options:
            raise ValueError(
                "TSVGPClassifier sets its own Bernoulli likelihood; pass link= instead."
            )
        if link not in ("probit", "logit"):  # the option's name, not only the likelihood's
            raise ValueError(
                f"TSVGPClassifier option link must be 'probit' or 'logit', got {link!r}."
            )
        super().__init__(train_X, train_Y, likelihood=Bernoulli(link=link), **options)
        mean = self.mean_module  # a gpytorch ConstantMean: its own parameter and closure
        like = {"dtype": self.inducing_points.dtype, "device": self.inducing_points.device}
        # loc and scale made in the model's dtype (a float default would round 3.4 to float32)
        prior = NormalPrior(torch.zeros((), **like), torch.tensor(CONSTANT_PRIOR_SD[link], **like))
        mean.register_prior("mean_prior", prior, mean._constant_param, mean._constant_closure)

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        # A state saved before the constant had its prior lacks the prior's buffers: this
        # model's own (the same fixed values) stand in for them.
        state = dict(state_dict)
        if "mean_module.raw_constant" in state:
            for name, value in self.mean_module.mean_prior.named_buffers():
                state.setdefault(f"mean_module.mean_prior.{name}", value.clone())
        return super().load_state_dict(state, strict=strict, assign=assign)

    def predict_proba(self, X: Tensor) -> Tensor:
        r"""``p(y = 1 | x)`` for each row of ``X`` (``... x n x d``) -> ``broadcast(..., batch) x
        n`` (``batch``: this model's batch shape, e.g. a fantasy model's): the latent marginal
        ``N(mu, s^2)`` pushed through the link."""
        if X.dim() < 2:  # one point as a d-vector: its probability, 0-d
            return self.predict_proba(X.unsqueeze(0)).squeeze(-1)
        # Marginals only (no n x n covariance): each row a one-point query, the rows as the
        # leading batch dim, ``n x 1... x ... x 1 x d``, padded so that the query's own batch
        # dims still line up with a batched model's (rows as the last batch dim met its batch).
        n, batch = X.shape[-2], X.shape[:-2]
        pad = (1,) * max(len(self.batch_shape) - len(batch), 0)
        Xr = X.movedim(-2, 0).reshape(n, *pad, *batch, 1, X.shape[-1])
        with torch.no_grad():
            post = self.posterior(Xr)  # n x broadcast batch x 1 x 1
            mean = post.mean[..., 0, 0].movedim(0, -1)
            var = post.variance[..., 0, 0].movedim(0, -1)
            return self.likelihood.predictive_prob(mean, var)


class WISKIBinaryClassifier(WISKIDirichletClassifier):
    r"""The WISKI Dirichlet classifier with two classes, labels {0, 1} as ``n x 1``.

    Args:
        train_X: ``n x d`` inputs (unit cube); train_Y: ``n x 1`` labels in {0, 1}.
        num_samples: Monte-Carlo samples of :meth:`predict_proba` (seeded, so deterministic).
        **options: :class:`WISKIDirichletClassifier` options (``alpha_eps``, ``grid_size``, ...).
    """

    def __init__(
        self, train_X: Tensor, train_Y: Tensor, num_samples: int = 256, **options: Any
    ) -> None:
        num_samples = check_num_samples(num_samples)  # before the class models are built
        super().__init__(train_X, _labels(train_Y), num_classes=2, **options)
        self.num_samples = num_samples

    def update(self, X: Tensor, Y: Tensor) -> "WISKIBinaryClassifier":
        return super().update(X, _labels(Y))

    def fit_projection(self, X: Tensor, Y: Tensor, **options: Any) -> "WISKIBinaryClassifier":
        r"""Every class model's input map refit on ``(X, Y)`` (``n x 1`` labels in {0, 1}; see
        :meth:`WISKIDirichletClassifier.fit_projection`)."""
        return super().fit_projection(X, _labels(Y), **options)

    def predict_proba(self, X: Tensor) -> Tensor:
        r"""``p(y = 1 | x)`` for each row of ``X`` (``... x n x d``) -> ``... x n``."""
        # ... x n x 1 x d: each row on its own (marginals), so no joint n x n covariance.
        p = super().predict_proba(X.unsqueeze(-2), num_samples=self.num_samples, seed=0)
        return p[..., 0, 1]

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        # nn.Module.load_state_dict would bypass each WISKI's own load_state_dict (which resizes
        # the grown statistics buffers), so hand every class model its part of the state.
        parts: list[dict[str, Any]] = [{} for _ in self.models]
        for key, value in state_dict.items():
            head, c, rest = (key.split(".", 2) + ["", ""])[:3]
            if head != "models" or not c.isdigit() or int(c) >= len(parts) or not rest:
                raise KeyError(
                    f"Unexpected key {key!r} in a WISKIBinaryClassifier state (keys are "
                    f"'models.<class 0..{len(parts) - 1}>.<name>')."
                )
            parts[int(c)][rest] = value
        # A class model whose part fails to load is left as it was by its own load_state_dict;
        # the ones loaded before it are put back as they were from copies (they kept the new
        # state, so a failed load changed the classifier half way).
        loaded: list[tuple[int, WISKI]] = []
        try:
            for c, (model, part) in enumerate(zip(self.models, parts)):
                backup = copy.deepcopy(model) if c < len(parts) - 1 else None
                model.load_state_dict(part, strict=strict, assign=assign)
                loaded.append((c, backup))
        except Exception:
            for c, backup in loaded:
                self.models[c] = backup
            raise


def _labels(Y: Tensor) -> Tensor:
    r"""Binary labels ``Y`` (``n x 1`` or ``n``, values in {0, 1}) as ``n`` class indices."""
    # One column only: reshape(-1) of an n x 2 tensor made 2n labels, which an X of 2n rows
    # took silently, each label paired with the wrong row.
    if not isinstance(Y, Tensor) or Y.dim() not in (1, 2) or (Y.dim() == 2 and Y.shape[-1] != 1):
        raise ValueError(
            "Binary classification needs labels as an n x 1 (or n) tensor, got "
            f"{tuple(Y.shape) if isinstance(Y, Tensor) else type(Y).__name__}."
        )
    y = Y.reshape(-1)
    if not bool(((y == 0) | (y == 1)).all()):
        raise ValueError("Binary classification needs labels in {0, 1}.")
    return y.long()


#: registry name -> classifier class.
CLASSIFIERS: dict[str, type] = {"tsvgp": TSVGPClassifier, "wiski": WISKIBinaryClassifier}


def classifier_class(name: str) -> type:
    """The classifier for registry name ``name``; a one-line ValueError if it cannot classify."""
    key = name.lower()
    if key not in CLASSIFIERS:
        raise ValueError(
            f"Model {name!r} cannot classify (regression only); for a classification stream "
            f"choose one of {', '.join(CLASSIFIERS)}."
        )
    return CLASSIFIERS[key]
