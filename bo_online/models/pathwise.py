r"""BoTorch's pathwise posterior sampling (Matheron's rule) for bo_online's surrogates.

Importing :mod:`bo_online.models` registers the surrogates with BoTorch's dispatchers, so that
``botorch.sampling.pathwise.draw_matheron_paths``, ``get_matheron_path_model``,
``botorch.acquisition.utils.get_optimal_samples`` (qJointEntropySearch, qPredictiveEntropySearch,
qLowerBoundMaxValueEntropy with optimal samples) and ``PathwiseThompsonSampling`` take them as
they take BoTorch's own GPs. Every path is::

    (f | data)(x) = f(x) + k(x, P) w,          f ~ GP(c, k) (random Fourier features)

with BoTorch's prior sampler (:func:`draw_kernel_feature_paths` on the model's kernel and constant
mean) and an update on points ``P`` through BoTorch's ``_gaussian_update_exact``:

* :class:`~bo_online.models.OnlineExactGP`: ``P`` the training inputs ``X``, ``e ~ N(0, N)``
  and ``w = (K + N)^-1 (y - f(X) - e)`` with the model's own Cholesky factor of ``K + N``
  (inferred, per-point or fixed noise as its posterior has them), also for models made by
  ``condition_on_observations`` and ``fantasize`` (whose paths have the model's batch shape);
* :class:`~bo_online.models.TSVGP`: ``P`` the inducing inputs ``Z``, ``w = K_ZZ^-1 (u - f(Z))``,
  ``u ~ q(u)`` (as BoTorch's path for its variational GPs);
* :class:`~bo_online.models.DecoupledSVGP`: ``P`` the covariance bases ``beta`` and the mean bases
  ``alpha``: with its posterior ``mean(x) = c + k_{x,Z} a`` and ``cov = k - k_{x,beta} L H^-1 L^T
  k_{beta,x}``, ``H = I + L^T K_beta L``, a path is ``f(x) + k_{x,Z} a - k_{x,beta} L H^-1 (L^T
  (f(beta) - c) + e)``, ``e ~ N(0, I)``: the prior conditioned on pseudo-observations ``L^T
  f(beta) + e`` (``e``'s covariance is ``H - L^T K_beta L`` where ``H`` holds a jitter);
* :class:`~bo_online.models.QSGP`: its own weight-space draws (:meth:`QSGP.sample_paths`),
  evaluated with BoTorch's broadcasting;
* ``RefitSingleTaskGP`` (the refit-every-step baseline): the paths of its ``SingleTaskGP``;
* :class:`~bo_online.models.WISKI` and any other :class:`~bo_online.models.OnlineModel`: a
  ``NotImplementedError`` naming what to use instead.

Paths return ``sample_shape x batch_shape x q`` values in the user's outcome units (BoTorch's
shapes: the batch of the inputs broadcasts against ``sample_shape x batch_shape``); the prior
alone, ``draw_kernel_feature_paths(model, sample_shape)``, is in the user's units too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from botorch.sampling.pathwise.features import KernelEvaluationMap
from botorch.sampling.pathwise.paths import GeneralizedLinearPath, PathDict, SamplePath
from botorch.sampling.pathwise.posterior_samplers import DrawMatheronPaths, MatheronPath
from botorch.sampling.pathwise.prior_samplers import (
    DrawKernelFeaturePaths,
    TPathwisePriorSampler,
    _draw_kernel_feature_paths_fallback,
    draw_kernel_feature_paths,
)
from botorch.sampling.pathwise.update_strategies import (
    GaussianUpdate,
    TPathwiseUpdate,
    _gaussian_update_exact,
    gaussian_update,
)
from botorch.sampling.pathwise.utils import TensorTransform, get_input_transform
from linear_operator.operators import DiagLinearOperator, LinearOperator
from torch import Size, Tensor

from bo_online.linalg import psd_cholesky, solve_lower, solve_lower_transpose
from bo_online.models.base import OnlineModel
from bo_online.models.decoupled import DecoupledSVGP
from bo_online.models.decoupled.statistics import site_dtype
from bo_online.models.exact import OnlineExactGP
from bo_online.models.qsgp import QSGP
from bo_online.models.qsgp.sample_paths import weight_path_values
from bo_online.models.singletask import RefitSingleTaskGP
from bo_online.models.tsvgp import TSVGP
from bo_online.models.wiski import WISKI

__all__ = ["OutcomeUnstandardizer", "QSGPPath"]

#: The model whose paths are being drawn in standardised units (inside ``draw_matheron_paths``,
#: as BoTorch removes a model's ``outcome_transform`` there): its prior paths get no output
#: transform, the Matheron path gets one.
_standardized_model: ContextVar[Any] = ContextVar("_standardized_model", default=None)

#: The surrogates whose kernel ``covar_module`` and constant mean ``mean_module`` act on the
#: model's (transformed) inputs, so that BoTorch's random Fourier features are their prior.
_KERNEL_PRIOR_MODELS = (OnlineExactGP, TSVGP, DecoupledSVGP)

_INSTEAD = (
    "Use acquisition functions that read the posterior at finite sets of points instead "
    "(qLogNoisyExpectedImprovement, qUpperConfidenceBound, qMaxValueEntropy with a candidate_set, "
    "Thompson sampling over a candidate set: botorch.generation.MaxPosteriorSampling or "
    "bo_online.acquisition.thompson_sample), or OnlineExactGP, TSVGP, DecoupledSVGP or QSGP, "
    "which support pathwise sampling."
)


class OutcomeUnstandardizer(TensorTransform):
    r"""Maps path values from a model's standardised outcome units back to the user's.

    Args:
        mean: ``m`` outcome means (``outcome_mean``), copied.
        std: ``m`` outcome standard deviations (``outcome_std``), copied.
    """

    def __init__(self, mean: Tensor, std: Tensor) -> None:
        super().__init__()
        self.register_buffer("mean", mean.detach().clone())
        self.register_buffer("std", std.detach().clone())

    def forward(self, values: Tensor) -> Tensor:
        r"""``values``: ``... x q`` (one output) or ``... x m x q`` (``m`` outputs as the last
        batch dim, BoTorch's layout for paths); same shape, in the user's units."""
        if self.mean.numel() == 1:
            return values * self.std + self.mean
        return values * self.std.unsqueeze(-1) + self.mean.unsqueeze(-1)


def _output_transform(model: OnlineModel) -> OutcomeUnstandardizer | None:
    if _standardized_model.get() is model:
        return None
    return OutcomeUnstandardizer(model.outcome_mean, model.outcome_std)


@contextmanager
def _in_standardized_units(model: OnlineModel) -> Iterator[None]:
    token = _standardized_model.set(model)
    try:
        yield
    finally:
        _standardized_model.reset(token)


def _prepared(model: OnlineModel) -> None:
    r"""Eval mode (a ``Normalize`` input transform must not learn from the points a path is
    evaluated at, as in ``posterior``) and current caches."""
    if model.training:
        model.eval()
    transform = get_input_transform(model)
    if transform is not None and transform.training:
        transform.eval()
    model.ensure_caches()


def _draw_standardized(
    model: OnlineModel,
    points: Tensor,
    sample_shape: Size,
    prior_sampler: TPathwisePriorSampler,
    update_strategy: TPathwiseUpdate,
) -> MatheronPath:
    r"""Prior paths (``sample_shape x batch_shape`` of them, in standardised units) and their
    update from the prior's values at ``points`` (``batch x k x d``, transformed inputs)."""
    with _in_standardized_units(model):
        shape = Size(sample_shape) + model.batch_shape
        prior_paths = prior_sampler(model=model, sample_shape=shape)
        sample_values = prior_paths.forward(points)  # ``forward`` bypasses the input transform
        update_paths = update_strategy(model=model, sample_values=sample_values)
    return MatheronPath(
        prior_paths=prior_paths,
        update_paths=update_paths,
        output_transform=OutcomeUnstandardizer(model.outcome_mean, model.outcome_std),
    )


# ---------------------------------------------------------------------------------- prior


@DrawKernelFeaturePaths.register(_KERNEL_PRIOR_MODELS)
def _draw_kernel_feature_paths_online(
    model: OnlineExactGP | TSVGP | DecoupledSVGP, **kwargs: Any
) -> GeneralizedLinearPath:
    r"""Prior paths ``c + phi(x)^T w`` with random Fourier features of ``model.covar_module``:
    ``sample_shape x covar_module.batch_shape x q`` values at ``q x d`` raw inputs."""
    return _draw_kernel_feature_paths_fallback(
        num_inputs=model.dim,  # the kernel's inputs: after the input transform
        mean_module=model.mean_module,
        covar_module=model.covar_module,
        input_transform=get_input_transform(model),
        output_transform=_output_transform(model),
        **kwargs,
    )


@DrawKernelFeaturePaths.register(OnlineModel)
def _draw_kernel_feature_paths_unsupported(model: OnlineModel, **kwargs: Any) -> None:
    raise NotImplementedError(
        f"{type(model).__name__} has no random-feature prior for BoTorch's pathwise sampling. "
        + _INSTEAD
    )


# ---------------------------------------------------------------------------------- exact GP


@DrawMatheronPaths.register(OnlineExactGP)
def _draw_matheron_paths_OnlineExactGP(
    model: OnlineExactGP,
    *,
    sample_shape: Size,
    prior_sampler: TPathwisePriorSampler = draw_kernel_feature_paths,
    update_strategy: TPathwiseUpdate = gaussian_update,
) -> MatheronPath:
    _prepared(model)
    return _draw_standardized(model, model.train_X, sample_shape, prior_sampler, update_strategy)


@GaussianUpdate.register(OnlineExactGP, object)
def _gaussian_update_OnlineExactGP(
    model: OnlineExactGP,
    likelihood: Any,
    *,
    sample_values: Tensor,
    target_values: Tensor | None = None,
    points: Tensor | None = None,
    noise_covariance: Tensor | LinearOperator | None = None,
    scale_tril: Tensor | LinearOperator | None = None,
) -> GeneralizedLinearPath:
    r"""``k(x, X) (K + N)^-1 (y - f(X) - e)`` on the training data in standardised units
    (``sample_values``: ``sample x batch x n`` prior values f(X)), through the model's own
    Cholesky factor of ``K + N`` unless other points, noise or a factor are given."""
    if points is None and noise_covariance is None and scale_tril is None:
        model.ensure_caches()
        scale_tril = model._full_factor()
    if points is None:
        points = model.train_X
    if target_values is None:
        target_values = model.train_y
    if noise_covariance is None:
        noise_covariance = DiagLinearOperator(model._train_noise_diag())
    return _gaussian_update_exact(
        kernel=model.covar_module,
        points=points,
        target_values=target_values,
        sample_values=sample_values,
        noise_covariance=noise_covariance,
        scale_tril=scale_tril,
        input_transform=get_input_transform(model),
    )


# ---------------------------------------------------------------------------------- t-SVGP


@DrawMatheronPaths.register(TSVGP)
def _draw_matheron_paths_TSVGP(
    model: TSVGP,
    *,
    sample_shape: Size,
    prior_sampler: TPathwisePriorSampler = draw_kernel_feature_paths,
    update_strategy: TPathwiseUpdate = gaussian_update,
) -> MatheronPath:
    _prepared(model)
    Z = model.inducing_points.detach()  # m x d, transformed inputs
    return _draw_standardized(model, Z, sample_shape, prior_sampler, update_strategy)


@GaussianUpdate.register(TSVGP, object)
def _gaussian_update_TSVGP(
    model: TSVGP,
    likelihood: Any,
    *,
    sample_values: Tensor,
    target_values: Tensor | None = None,
    **ignore: Any,
) -> GeneralizedLinearPath:
    r"""``k(x, Z) K_ZZ^-1 (u - f(Z))`` with ``u ~ q(u) = N(c + L_K v, L_K B^-1 L_K^T)``
    (``sample_values``: ``sample x batch x (m_out x) m`` prior values f(Z), standardised)."""
    model.ensure_caches()
    L_K = model.chol_K.detach()  # (m_out x) m x m
    if target_values is None:
        # whitened w ~ N(v, B^-1) with B = L_B L_B^T: w = v + L_B^-T eps
        L_B = model._B_factor().cholesky().detach()
        eps = torch.randn_like(sample_values).unsqueeze(-1)
        w = model.v.detach() + solve_lower_transpose(L_B, eps).squeeze(-1)
        target_values = model._const().detach() + (L_K @ w.unsqueeze(-1)).squeeze(-1)
    return _gaussian_update_exact(
        kernel=model.covar_module,
        points=model.inducing_points.detach(),
        target_values=target_values,
        sample_values=sample_values,
        scale_tril=L_K,
        input_transform=get_input_transform(model),
    )


# ---------------------------------------------------------------------------------- decoupled


@DrawMatheronPaths.register(DecoupledSVGP)
def _draw_matheron_paths_DecoupledSVGP(
    model: DecoupledSVGP,
    *,
    sample_shape: Size,
    prior_sampler: TPathwisePriorSampler = draw_kernel_feature_paths,
    update_strategy: TPathwiseUpdate = gaussian_update,
) -> MatheronPath:
    _prepared(model)
    beta = model.beta_points.detach()  # batch x M_beta x d
    return _draw_standardized(model, beta, sample_shape, prior_sampler, update_strategy)


@GaussianUpdate.register(DecoupledSVGP, object)
def _gaussian_update_DecoupledSVGP(
    model: DecoupledSVGP,
    likelihood: Any,
    *,
    sample_values: Tensor,
    **ignore: Any,
) -> SamplePath:
    r"""``k(x, beta) (a_beta - L H^-1 (L^T (f(beta) - c) + e)) + k(x, alpha) a_alpha`` with ``e ~
    N(0, H - L^T K_beta L)`` (``I``, plus ``L^T (j I) L`` where the state's ``H`` holds a jitter
    ``j`` on ``K_beta``: fold mode's 1e-8, kept by the models conditioned on it), so that ``L^T
    f(beta) + e ~ N(0, H)`` (``sample_values``: ``sample x batch x M_beta`` prior values
    f(beta), standardised). ``L`` and ``chol_H`` are the model's (formed from fold mode's
    factors or a fantasy's bordered state on first read, as ``state_dict`` forms them)."""
    model.ensure_caches()
    L, chol_H, beta = model.L.detach(), model.chol_H.detach(), model.beta_points.detach()
    wd = site_dtype(L.dtype)  # L^T K L cancels cond(K_beta)-sized terms: float64 for float32
    Lw, Cw = L.to(wd), chol_H.to(wd)
    E = (
        Cw @ Cw.transpose(-1, -2)
        - Lw.transpose(-1, -2) @ model.covar_module(beta.to(wd)).to_dense().detach() @ Lw
    )
    f = (sample_values - model.mean_module.constant.detach()).to(wd)
    g = (Lw.transpose(-1, -2) @ f.unsqueeze(-1)).squeeze(-1)
    g = g + (psd_cholesky(E) @ torch.randn_like(g).unsqueeze(-1)).squeeze(-1)
    Hinv_g = solve_lower_transpose(Cw, solve_lower(Cw, g.unsqueeze(-1)))
    weight = model.a_beta.detach() - (Lw @ Hinv_g).squeeze(-1).to(L)
    transform = get_input_transform(model)
    paths = {
        "covariance_bases": GeneralizedLinearPath(
            feature_map=KernelEvaluationMap(
                model.covar_module, model.beta_points.detach(), input_transform=transform
            ),
            weight=weight,
        )
    }
    if model.alpha_points.shape[-2] > 0:
        paths["mean_bases"] = GeneralizedLinearPath(
            feature_map=KernelEvaluationMap(
                model.covar_module, model.alpha_points.detach(), input_transform=transform
            ),
            weight=model.a_alpha.detach(),
        )
    return PathDict(paths=paths, join=sum)


# ---------------------------------------------------------------------------------- QSGP


class QSGPPath(SamplePath):
    r"""Draws of :meth:`QSGP.sample_paths` as a BoTorch :class:`SamplePath`: called on raw
    inputs ``batch x q x d``, it returns ``broadcast(batch, sample_shape) x q`` values in the
    user's units (BoTorch's broadcasting, so ``get_optimal_samples`` evaluates path ``i`` at
    its own candidates), where ``QSGPSamplePaths`` evaluates every draw at every input.

    Args:
        model: the QSGP the draws are of (its basis and input transform are read at call time).
        weights: ``sample_shape x m`` basis weights of the draws.
        update_inputs: ``N x d`` points of the kernel regime's pathwise update, or None.
        update_weights: ``sample_shape x N`` weights of that update, or None.
    """

    def __init__(
        self,
        model: QSGP,
        weights: Tensor,
        update_inputs: Tensor | None = None,
        update_weights: Tensor | None = None,
    ) -> None:
        super().__init__()
        self.__dict__["model"] = model  # not a submodule: the path does not own the model
        self.register_buffer("weights", weights)
        self.register_buffer("update_inputs", update_inputs)
        self.register_buffer("update_weights", update_weights)
        self.input_transform = get_input_transform(model)
        self.output_transform = OutcomeUnstandardizer(model.outcome_mean, model.outcome_std)

    def forward(self, x: Tensor) -> Tensor:
        r"""``x``: ``batch x q x d`` transformed inputs; standardised values."""
        return weight_path_values(
            self.model, x, self.weights, self.update_inputs, self.update_weights, outer=False
        )

    def set_ensemble_as_batch(self, ensemble_as_batch: bool) -> None:
        r"""No ensemble dimension: nothing to do."""


@DrawMatheronPaths.register(QSGP)
def _draw_matheron_paths_QSGP(
    model: QSGP,
    *,
    sample_shape: Size,
    prior_sampler: TPathwisePriorSampler = draw_kernel_feature_paths,
    update_strategy: TPathwiseUpdate = gaussian_update,
) -> QSGPPath:
    if prior_sampler is not draw_kernel_feature_paths or update_strategy is not gaussian_update:
        raise NotImplementedError(
            "QSGP's paths are draws of its own weight posterior (QSGP.sample_paths): a "
            "prior_sampler or update_strategy other than BoTorch's defaults is not supported."
        )
    if model.batch_shape != Size():
        raise NotImplementedError(
            "Pathwise sampling of QSGP is for a single model, not a fantasy or conditioned "
            f"batch (batch shape {tuple(model.batch_shape)})."
        )
    _prepared(model)
    sample_shape = Size(sample_shape)
    draws = model.sample_paths(max(sample_shape.numel(), 1))

    def shaped(t: Tensor | None) -> Tensor | None:  # s x k -> sample_shape x k
        return None if t is None else t.reshape(*sample_shape, t.shape[-1])

    return QSGPPath(
        model,
        shaped(draws.weights),
        draws.update_inputs,
        shaped(draws.update_weights),
    )


# ---------------------------------------------------------------------------------- the rest


@DrawMatheronPaths.register(RefitSingleTaskGP)
def _draw_matheron_paths_RefitSingleTaskGP(
    model: RefitSingleTaskGP,
    *,
    sample_shape: Size,
    prior_sampler: TPathwisePriorSampler = draw_kernel_feature_paths,
    update_strategy: TPathwiseUpdate = gaussian_update,
) -> MatheronPath:
    r"""The paths of the ``SingleTaskGP`` it wraps (BoTorch's own)."""
    return DrawMatheronPaths(
        model.model,
        sample_shape=sample_shape,
        prior_sampler=prior_sampler,
        update_strategy=update_strategy,
    )


@DrawMatheronPaths.register(WISKI)
def _draw_matheron_paths_WISKI(model: WISKI, **kwargs: Any) -> None:
    raise NotImplementedError(
        "WISKI has no pathwise (Matheron) sampler: its posterior comes from interpolated grid "
        "statistics, not a kernel and a set of points a path could be conditioned on. " + _INSTEAD
    )


@DrawMatheronPaths.register(OnlineModel)
def _draw_matheron_paths_unsupported(model: OnlineModel, **kwargs: Any) -> None:
    raise NotImplementedError(
        f"{type(model).__name__} does not support BoTorch's pathwise sampling. " + _INSTEAD
    )
