r"""Fitting the decoupled SVGP: the settings dataclass, the default fit (exact marginal
likelihood on a subset, refined on the collapsed bound, bases by pivoted Cholesky, closed-form
``a, B``), and the paper's Adam / L-BFGS training on the ELBO with online basis growth."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Literal

import torch
from torch import Tensor
from typing_extensions import Self

from bo_online.linalg import solve_lower_transpose
from bo_online.models.fitting import (
    Bounds,
    OptimizerSettings,
    minimize_loss,
    project_to_bounds,
    remap_constant_mean,
    resolve_settings,
    sum_log_priors,
    trainable_parameters_and_bounds,
    training_mode,
)

__all__ = ["DecoupledFitMixin", "DecoupledFitSettings"]


@dataclasses.dataclass(frozen=True)
class DecoupledFitSettings(OptimizerSettings):
    r"""Settings of :meth:`DecoupledSVGP.fit <bo_online.models.decoupled.DecoupledSVGP.fit>`
    (the same names and defaults as its keyword arguments).

    Attributes:
        method: ``None`` (``"auto"`` for a Gaussian likelihood when no ``lr`` is given and
            ``max_iter > 0``, else ``"adam"``), ``"auto"``, ``"adam"`` or ``"lbfgs"`` (ELBO, full
            batch).
        max_iter: L-BFGS iterations or Adam steps.
        lr: Adam's initial step ``gamma_0`` for hyperparameters and basis locations (``None``:
            0.01); giving one selects ``"adam"`` under ``method=None``.
        lr_variational: initial Adam step for ``a`` and ``L`` (``None``: ``lr / 10``).
        batch_size: Adam minibatch size (full batch when n is smaller).
        num_kl_columns: columns sampled for ``a^T K_alpha a`` (``None``: exact).
        grow: bases added per Adam step (N_delta) until the caps are reached.
        learn_inducing: move the basis locations (``None``: yes unless bases = data).
        train_hyperparameters: also train the kernel, mean and noise hyperparameters.
        restandardize: first recompute the outcome scaling from the held data.
        compress: bring bases grown by conditioning back to the caps before Adam/L-BFGS.
        init_hyperparameters: if > 0, first fit the hyperparameters by the exact marginal
            likelihood of a random data subset of this size.
        refresh: finish Adam/L-BFGS by re-solving ``a, B`` at their closed-form optimum.
        timeout_sec: wall-clock budget for the optimiser.
    """

    method: Literal["auto", "adam", "lbfgs"] | None = None
    max_iter: int = 200
    lr: float | None = None
    lr_variational: float | None = None
    batch_size: int = 1024
    num_kl_columns: int | None = None
    grow: int = 0
    learn_inducing: bool | None = None
    train_hyperparameters: bool = True
    restandardize: bool = True
    compress: bool = True
    init_hyperparameters: int = 0
    refresh: bool = False
    timeout_sec: float | None = None


class DecoupledFitMixin:
    r"""Hyperparameter and variational training of
    :class:`~bo_online.models.decoupled.DecoupledSVGP`."""

    fit_settings_class = DecoupledFitSettings
    #: held points (a random subset beyond) the collapsed-bound refinement of the default fit
    #: sums over
    COLLAPSED_FIT_POINTS = 2048

    def fit(self, settings: DecoupledFitSettings | None = None, **overrides: Any) -> Self:
        r"""Train ``a, L, beta, alpha`` and the hyperparameters on the data the model holds.

        1. With ``restandardize``, recompute the outcome scaling from the held data (mean
           coefficients rescaled so the mean is unchanged).
        2. With ``compress``, bring bases grown by conditioning back to the caps: keep a diverse
           subset (pivoted Cholesky of the kernel) and warm-start ``a, L`` at the Gaussian
           closed-form optimum on a data subsample. When all data fit in the covariance bases the
           bases are the data and the model starts as the exact GP.
        3. ``method="adam"``: ``max_iter`` Adam steps on the minibatch ELBO with the paper's
           schedule ``lr_t = lr / (1 + 0.1 sqrt(t))``; each step first adds ``grow`` (N_delta) new
           bases from the minibatch while below the caps (``L`` extended by ``N^{-1/2}``, new
           coefficients zero). ``method="lbfgs"``: full-batch L-BFGS-B (small n).
        4. If the bases are exactly all the data (and did not move), finish at the closed-form
           optimum ``a = (K + N)^{-1}(y - c), L = N^{-1/2}`` for the fitted hyperparameters.

        **Default** (``method=None``): ``"auto"`` for a Gaussian likelihood when no Adam step
        size ``lr`` is given and ``max_iter > 0``, else ``"adam"``. ``"auto"`` is
        :meth:`_fit_auto`: L-BFGS on the exact marginal likelihood of all held data when ``n <=
        exact_fit_points`` (default 512), else of a random subset of that size, then, while the
        mean bases are fewer than that subset's points, refined on the collapsed bound of the
        selected bases (:meth:`collapsed_bound`, at most 2,048 held points); then bases by
        pivoted Cholesky of the kernel on the held data and ``a, B`` at their closed-form
        optimum on all held data (fold mode). With ``hyperparameter_refit_growth`` above 1 the
        hyperparameters are kept, once that subset is full, until n has grown by that factor.
        Plain Adam from the median heuristic barely moves the hyperparameters in a BO loop's few
        steps. ``"auto"`` uses ``max_iter`` (L-BFGS iterations), ``train_hyperparameters``,
        ``restandardize`` and ``timeout_sec``; the other options belong to
        ``"adam"``/``"lbfgs"``.

        Options (the fields of :class:`DecoupledFitSettings`, given as ``settings`` or as
        keywords):

        - ``method``: ``None`` (see above), ``"auto"``, ``"adam"`` or ``"lbfgs"`` (ELBO, full
          batch).
        - ``lr``: Adam's initial step ``gamma_0`` for hyperparameters and basis locations.
        - ``lr_variational``: initial step for ``a`` and ``L`` (default ``lr / 10``): a smaller
          one keeps Adam's sign-like first steps from undoing a good warm start of ``a``.
        - ``batch_size``: minibatch size (full batch when n is smaller).
        - ``num_kl_columns``: columns sampled for ``a^T K_alpha a`` (None: exact).
        - ``grow``: bases added per step (N_delta) until the caps are reached.
        - ``learn_inducing``: move the basis locations (default: yes unless bases = data).
        - ``init_hyperparameters``: if > 0, first fit the hyperparameters by the exact marginal
          likelihood (L-BFGS) of a random data subset of this size, O(size^3), and re-solve
          the closed-form warm start of ``a, L``; a common SVGP initialisation that spares
          Adam the slow joint drift of hyperparameters and coefficients.
        - ``refresh``: finish by re-solving ``a`` and ``B`` at their closed-form Gaussian optimum
          for the trained hyperparameters and bases (on ``warm_start_points`` data points,
          O(points * M_alpha^2 + M_alpha^3)); Adam converges slowly in the raw mean-only
          coefficients when ``K_alpha`` is ill-conditioned (the paper's Appendix A.1).
        - ``timeout_sec``: wall-clock budget for the optimiser (Adam stops after the step that
          exceeds it; ``self.last_fit_steps`` records the Adam steps taken), e.g. to
          compare models at equal training time.

        Args:
            settings: a :class:`DecoupledFitSettings` (defaults if omitted).
            **overrides: its fields by name, replacing those of ``settings`` (``None`` keeps the
                setting's value); an unknown name raises ``ValueError`` before anything changes.
        """
        settings = resolve_settings(DecoupledFitSettings, settings, overrides)
        method, max_iter, lr = settings.method, settings.max_iter, settings.lr
        train_hyperparameters, timeout_sec = settings.train_hyperparameters, settings.timeout_sec
        if self.batch_shape != torch.Size():
            raise ValueError("fit() is for a single model, not a fantasy/batched one.")
        if method is None:
            method = "auto" if (lr is None and self._gaussian() and max_iter > 0) else "adam"
        if method not in ("auto", "adam", "lbfgs"):
            raise ValueError(f"Unknown fit method {method!r}; use 'auto', 'adam' or 'lbfgs'.")
        if method == "auto" and not self._gaussian():
            raise ValueError("fit(method='auto') needs a Gaussian likelihood; use 'adam'.")
        lr = 0.01 if lr is None else float(lr)
        settings = dataclasses.replace(settings, method=method, lr=lr)
        self.site_Q, self.site_s = None, None
        if settings.restandardize and self.num_data > 1 and self._gaussian():
            self._restandardize()
        if method == "auto":
            return self._fit_auto(max_iter, train_hyperparameters, timeout_sec)
        bases_are_data = self._bases_are_data()
        grown = self.num_beta > self.num_cov_bases or self.num_alpha > self.num_mean_bases
        if settings.compress and grown:
            with torch.no_grad():
                self._compress()
            bases_are_data = False
        if settings.init_hyperparameters > 0:
            self._init_hyperparameters(settings.init_hyperparameters, bases_are_data)
        learn_inducing = settings.learn_inducing
        if learn_inducing is None:
            learn_inducing = not bases_are_data
        # Training coordinates: the covariance-basis block is whitened by R = chol(K_beta), i.e.
        # L = R^{-T} L0 and a_beta = R^{-T} a0 (the paper's Appendix A.1 "full preconditioner",
        # affordable since M_beta is small); without it Adam is very slow and unstable because
        # B and a_beta carry entries of size cond(K_beta). The mean-only coefficients stay raw
        # (their Jacobi preconditioner is the identity for stationary kernels).
        with torch.no_grad():
            R = self._chol_K(self.beta_points)
            L0 = R.transpose(-1, -2) @ self.L
            a0 = (R.transpose(-1, -2) @ self.a_beta.unsqueeze(-1)).squeeze(-1)
        var = {
            "beta": self.beta_points.detach().clone().requires_grad_(learn_inducing),
            "alpha": self.alpha_points.detach().clone().requires_grad_(learn_inducing),
            "L0": L0.clone().requires_grad_(True),
            "a0": a0.clone().requires_grad_(True),
            "a_alpha": self.a_alpha.detach().clone().requires_grad_(True),
        }
        hyper, bounds = self._hyperparameters_and_bounds()
        if not train_hyperparameters:
            hyper, bounds = {}, {}
        n = self.num_data
        gen = torch.Generator().manual_seed(self.seed + 7919 * n)

        def unwhiten() -> tuple[Tensor, Tensor]:
            R = self._chol_K(var["beta"])
            L = solve_lower_transpose(R, var["L0"])
            a_b = solve_lower_transpose(R, var["a0"].unsqueeze(-1)).squeeze(-1)
            return L, a_b

        def loss(idx: Tensor | None) -> Tensor:
            L, a_b = unwhiten()
            a = torch.cat([a_b, var["a_alpha"]], dim=-1)
            Z = torch.cat([var["beta"], var["alpha"]], dim=-2)
            elbo = self.elbo(idx, settings.num_kl_columns, gen, beta=var["beta"], L=L, a=a, Z=Z)
            return -(elbo + self._log_prior()) / n

        with training_mode(self):
            if method == "lbfgs":
                params = {**{k: v for k, v in var.items() if v.requires_grad}, **hyper}
                minimize_loss(
                    lambda: loss(None),
                    params,
                    method="lbfgs",
                    max_iter=max_iter,
                    timeout_sec=timeout_sec,
                    bounds=bounds,
                )
            elif method == "adam":
                self._adam(var, hyper, bounds, loss, settings, gen)
            else:
                raise ValueError(f"Unknown fit method {method!r}; use 'adam' or 'lbfgs'.")
        with torch.no_grad():
            if bases_are_data and not learn_inducing and self._gaussian():
                self._set_exact_state(self.train_X)
            else:
                L, a_b = unwhiten()
                self.set_variational_parameters(var["beta"], L, a_b, var["alpha"], var["a_alpha"])
                if settings.refresh and self._gaussian():
                    self._warm_start(self.beta_points, self.alpha_points)
        self.invalidate_caches()
        self.ensure_caches()
        return self

    def fit_state_to_hyperparameters(self) -> None:
        r"""``a, B`` (and the bases) at their optimum for the current hyperparameters on the
        held data: the default fit without training the hyperparameters (the exact GP's state
        while the bases are the data). The state built at construction was that of the default
        hyperparameters, so a model that loaded others predicted with a mismatched ``a``."""
        self.fit(train_hyperparameters=False, restandardize=False)

    def _fit_auto(self, max_iter: int, train_hyperparameters: bool, timeout_sec) -> Self:
        r"""The default fit (see :meth:`fit`): exact-marginal-likelihood hyperparameters on (a
        subset of) the held data, bases re-selected by pivoted Cholesky, closed-form ``a, B``."""
        n = self.num_data
        beyond_subset = n > max(self.exact_fit_points, self.num_cov_bases)
        train_hyperparameters = train_hyperparameters and self._hyperparameters_due()
        # Once refined on the collapsed bound, later refits start from there: the subset's
        # exact fit would only pull the hyperparameters back (and double a stream refit's cost).
        if train_hyperparameters and not (beyond_subset and self.collapsed_fit is not None):
            self._exact_hyperparameters(self.exact_fit_points, max_iter, timeout_sec)
        if train_hyperparameters and beyond_subset and self._refines_on_bound():
            # The subset's exact-GP hyperparameters suit an exact GP on that subset (short
            # lengthscales in many dimensions), not the sparse model: with them the prediction
            # is far from every basis and its variance falls back to the prior (pol, 26 inputs,
            # 1,000 points: mean z^2 = 0.10, test NLL +0.7 nats above a t-SVGP). Refine them on
            # the sparse model's own bound over the chosen bases (collapsed, see
            # :meth:`_collapsed_hyperparameters`), then re-select the bases.
            with torch.no_grad():
                beta, alpha = self._select_bases()
            self._collapsed_hyperparameters(torch.cat([beta, alpha], dim=-2), max_iter, timeout_sec)
            self.collapsed_fit = torch.ones((), **self._dtype_device)
        if train_hyperparameters:
            self.hyperparameters_fit_n = torch.tensor(float(n), **self._dtype_device)
        with torch.no_grad():
            if n <= self.num_cov_bases:
                self._set_exact_state(self.train_X)
                self.site_Q, self.site_s = None, None
            else:
                beta, alpha = self._select_bases()
                self._set_sites(beta, alpha)
        self.last_fit_steps = 0
        return self

    def _hyperparameters_due(self) -> bool:
        r"""Whether the default fit trains the hyperparameters (``hyperparameter_refit_growth``):
        always while its objective's subset is not full (n up to ``exact_fit_points``, or up to
        the collapsed bound's :attr:`COLLAPSED_FIT_POINTS` when it refines), then once n has
        grown by that factor since they were last trained. On an unchanging stream a refit
        past that point only redraws a subset of the same size; on pol (26 inputs) one fit on
        a 2,048-point subset took 15 min on one thread."""
        last = self.hyperparameters_fit_n
        if last is None or self.hyperparameter_refit_growth <= 1.0:
            return True
        full = self.COLLAPSED_FIT_POINTS if self._refines_on_bound() else self.exact_fit_points
        n = self.num_data
        return n <= full or n >= self.hyperparameter_refit_growth * float(last)

    def _refines_on_bound(self) -> bool:
        r"""Whether the default fit refines the subset's exact-GP hyperparameters on the
        collapsed bound beyond ``exact_fit_points`` held points: only while the mean bases are
        fewer than the subset's points. With as many bases as the subset has points the sparse
        model resolves what the subset's exact GP resolves, and the bound over all ``M_alpha``
        bases, ``O(2048 M_alpha^2)`` per iteration, would cost far more than the subset's exact
        fit (kin40k, 5,000 rows, 2,048 / 1,024 bases, one thread: 368 s refined for test RMSE
        0.199 / NLL -0.133, 161 s on a 2,048-point subset for 0.188 / -0.096; docs/results.md)."""
        return self.exact_fit_points > self.num_mean_bases

    def _exact_hyperparameters(self, size: int, max_iter: int, timeout_sec) -> None:
        r"""L-BFGS-B on the exact GP marginal likelihood (plus hyperpriors) of a random subset of
        at most ``size`` held points (all of them when n is smaller), warm-started."""
        n = self.num_data
        idx = torch.randperm(n, generator=self._generator)[: min(size, n)]
        sub = self._exact_gp_on(idx)
        # The exact sub-GP's priors would be this model's own, so add them here once, and pass
        # the constraint bounds (BoTorch's default constraints are untransformed).
        self._lbfgs(
            lambda: (
                -(
                    sub.marginal_log_likelihood(include_priors=False)
                    + self._log_prior() / idx.shape[0]
                )
            ),
            max_iter,
            timeout_sec,
        )

    def _lbfgs(self, loss: Callable[[], Tensor], max_iter: int, timeout_sec: float | None) -> None:
        r"""L-BFGS-B on ``loss`` over the hyperparameters, within their constraint bounds, in
        training mode."""
        params, bounds = self._hyperparameters_and_bounds()
        with training_mode(self):
            minimize_loss(
                loss,
                params,
                method="lbfgs",
                max_iter=max_iter,
                timeout_sec=timeout_sec,
                bounds=bounds,
            )

    def _collapsed_hyperparameters(
        self, Z: Tensor, max_iter: int, timeout_sec, size: int | None = None
    ) -> None:
        r"""L-BFGS-B on :meth:`collapsed_bound` for the bases ``Z`` (fixed) over a random subset
        of at most ``size`` held points (default :attr:`COLLAPSED_FIT_POINTS`; plus the
        hyperpriors), warm-started."""
        size = self.COLLAPSED_FIT_POINTS if size is None else size
        n = self.num_data
        idx = torch.randperm(n, generator=self._generator)[: min(size, n)]
        self._lbfgs(
            lambda: -(self.collapsed_bound(Z, idx) + self._log_prior()) / idx.shape[0],
            max_iter,
            timeout_sec,
        )

    def _init_hyperparameters(self, size: int, bases_are_data: bool) -> None:
        r"""Exact-GP marginal likelihood on a random subset (shares this model's kernel,
        likelihood and mean modules), then the closed-form variational warm start."""
        self._exact_hyperparameters(size, max_iter=200, timeout_sec=None)
        with torch.no_grad():
            if bases_are_data and self._gaussian():
                self._set_exact_state(self.train_X)
            else:
                self._warm_start(self.beta_points, self.alpha_points)

    def _log_prior(self) -> Tensor:
        """Sum of the hyperparameter log priors (kernel, likelihood, mean)."""
        return sum_log_priors(
            (self.covar_module, self.likelihood, self.mean_module), self.outcome_mean
        )

    def _hyperparameters_and_bounds(self) -> tuple[dict[str, Tensor], Bounds]:
        r"""The trainable tensors of :meth:`hyperparameters` by name, and the optimiser bounds their
        GPyTorch constraints imply (finite only where a constraint is not enforced by a
        transform, as BoTorch's default lengthscale and noise constraints)."""
        keep = {id(p) for p in self.hyperparameters()}
        params, bounds = trainable_parameters_and_bounds(self)
        params = {k: p for k, p in params.items() if id(p) in keep}
        return params, {k: b for k, b in bounds.items() if k in params}

    def _adam(
        self,
        var: dict[str, Tensor],
        hyper: dict[str, Tensor],
        bounds: Bounds,
        loss: Callable[[Tensor | None], Tensor],
        settings: DecoupledFitSettings,
        gen: torch.Generator,
    ) -> None:
        r"""Adam with the paper's step schedule and online basis growth (Algorithm 1): ``var``
        holds the variational leaves (``beta, alpha, L0, a0, a_alpha``), ``hyper`` the
        hyperparameters, ``bounds`` their optimiser bounds (see :meth:`_hyperparameters_and_bounds`;
        each step is projected into them, as BoTorch's optimisers do), ``loss(idx)`` the
        minibatch objective; ``settings.lr`` is resolved (not ``None``)."""
        import time

        max_iter, lr, batch_size = settings.max_iter, settings.lr, settings.batch_size
        grow, timeout_sec = settings.grow, settings.timeout_sec
        lr_v = 0.1 * lr if settings.lr_variational is None else settings.lr_variational

        coef = [var[k] for k in ("L0", "a0", "a_alpha")]
        locs = [var[k] for k in ("beta", "alpha") if var[k].requires_grad]
        opt = torch.optim.Adam(
            [{"params": coef, "lr": lr_v}, {"params": locs + list(hyper.values()), "lr": lr}]
        )
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: 1.0 / (1.0 + 0.1 * math.sqrt(t)))
        n = self.num_data
        start = time.monotonic()
        self.last_fit_steps = 0  # Adam steps taken (fewer than max_iter when timeout_sec hit)
        for t in range(max_iter):
            idx = None if n <= batch_size else torch.randperm(n, generator=gen)[:batch_size]
            if grow > 0:
                self._grow(var, opt, idx, grow, gen)
            opt.zero_grad()
            value = loss(idx)
            value.backward()
            opt.step()
            project_to_bounds(hyper, bounds)
            sched.step()
            self.last_fit_steps = t + 1
            if timeout_sec is not None and time.monotonic() - start > timeout_sec:
                break

    def _rescale_to_outcome_scaling(self, old_mean: Tensor, old_std: Tensor, ratio: Tensor) -> None:
        r"""Held data (:class:`HeldDataMixin`), the constant mean (kept in the user's units) and
        the mean coefficients ``a_beta``, ``a_alpha`` to the new outcome scaling (see
        :meth:`OnlineModel._rescale_to_outcome_scaling`)."""
        super()._rescale_to_outcome_scaling(old_mean, old_std, ratio)
        remap_constant_mean(
            self.mean_module, old_mean, old_std, self.outcome_mean, self.outcome_std
        )
        self.a_beta, self.a_alpha = self.a_beta * ratio, self.a_alpha * ratio
