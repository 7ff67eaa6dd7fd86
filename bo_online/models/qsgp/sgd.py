r"""The quadruply stochastic procedure of QSGP (Evans & Nair, "Quadruply Stochastic Gaussian
Processes", 2018, arXiv:1812.03010).

Every step samples training rows once and basis functions three times (Theorems 1-2, Prop. 2;
Theorem 3 for Laplace/logistic likelihoods), adds the Eq. 3 / Prop. 3 control variates, and
updates only the touched variational coordinates with sparse AdaGrad (so a step costs the same
for any ``m``), the hyperparameters with projected Adam, both with exponentially decayed
learning rates and a warm-up freeze of the hyperparameters. The estimators are the pure
functions of :mod:`bo_online.models.qsgp.estimators`.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor
from typing_extensions import Self

from bo_online.models.fitting import project_to_bounds, resolve_settings, training_mode
from bo_online.models.qsgp.estimators import (
    IndexSample,
    control_variate,
    prop2_estimate,
    sample_indices,
    theorem1_estimate,
    theorem2_estimate,
    theorem3_estimate,
)
from bo_online.models.qsgp.fitting import QSGPSGDSettings
from bo_online.models.qsgp.sgd_inputs import ColumnSample, ControlVariateState, VariationalLeaves

__all__ = ["QSGPSGDMixin"]


class QSGPSGDMixin:
    r"""``fit_sgd`` and its one-step loss (a mixin of :class:`QSGP`)."""

    def fit_sgd(self, settings: QSGPSGDSettings | None = None, **overrides: Any) -> Self:
        r"""Run the QSGP SGD (Theorems 1-3, Prop. 2, Eq. 3 / Prop. 3 control variates).

        Args:
            settings: a :class:`~bo_online.models.qsgp.fitting.QSGPSGDSettings` (defaults if
                omitted): steps, row and column sample sizes, control-variate rank, learning
                rates and their decay, the hyperparameters' warm-up freeze, seed, callback.
            **overrides: its fields by name (``max_iter``, ``num_rows``, ``num_cols``,
                ``cv_rank``, ``lr`` ...), replacing those of ``settings``; an unknown name
                raises ``ValueError`` before anything changes.
        """
        settings = resolve_settings(QSGPSGDSettings, settings, overrides)
        max_iter, num_rows, num_cols = settings.max_iter, settings.num_rows, settings.num_cols
        num_diag_cols, num_dense_cols = settings.num_diag_cols, settings.num_dense_cols
        cv_rank, lr, lr_hyper = settings.cv_rank, settings.lr, settings.lr_hyper
        lr_decay_final, freeze_iters = settings.lr_decay_final, settings.freeze_iters
        train_hypers, use_priors = settings.train_hypers, settings.use_priors
        seed, callback, replace_cols = settings.seed, settings.callback, settings.replace_cols
        deadline = None if settings.timeout_sec is None else time.monotonic() + settings.timeout_sec
        n, m, k = self._num_train_rows, self.num_features, self.num_dense
        dd = self._dtype_device
        dev = dd["device"]
        gen = torch.Generator(device=dev).manual_seed(self.seed if seed is None else seed)
        gaussian = self.likelihood_name == "gaussian"
        nr, nc = min(num_rows, n), num_cols
        hypers, bounds = self._trainable_hypers_and_bounds() if train_hypers else ({}, {})
        opt = torch.optim.Adam(list(hypers.values()), lr=lr_hyper) if hypers else None
        gamma = lr_decay_final ** (1.0 / max(max_iter, 1))
        freeze = max_iter // 10 if freeze_iters is None else freeze_iters
        acc_mu = torch.zeros(m, **dd)
        acc_ld = torch.zeros(m, **dd)
        acc_cols = torch.zeros(m, k, **dd)
        use_cv = gaussian and cv_rank > 0
        cv_state = self.control_variate_state(cv_rank, gen) if use_cv else None
        if use_cv:
            a = cv_state.a  # Prop. 3's running products, updated in place below
        with training_mode(self):
            for t in range(max_iter):
                s = sample_indices(
                    n,
                    m,
                    k,
                    nr,
                    nc,
                    num_diag_cols,
                    num_dense_cols,
                    gen,
                    dev,
                    replace_cols=replace_cols,
                )
                hyper_on = opt is not None and t >= freeze
                loss, st = self.stochastic_loss(
                    s,
                    cv_state=cv_state,
                    hyper_grad=hyper_on,
                    use_priors=use_priors,
                )
                U, dr_u = st["U"], st["dr_u"]
                leaves = st["leaves"]
                grads = torch.autograd.grad(
                    loss, leaves + (list(hypers.values()) if hyper_on else []), allow_unused=True
                )
                extras = st
                lr_t = lr * gamma**t
                with torch.no_grad():
                    old_mu, old_cols = (
                        self.var_mean[U].clone(),
                        (self.var_cols[U][:, dr_u].clone() if k else None),
                    )
                    self._adagrad(self.var_mean, acc_mu, U, grads[0], lr_t)
                    self._adagrad(self.var_log_diag, acc_ld, U, grads[1], lr_t)
                    if k and grads[2] is not None:
                        g = grads[2]
                        rows, cols = U.unsqueeze(-1), dr_u.unsqueeze(0)
                        acc_cols[rows, cols] += g.pow(2)
                        step = g / (acc_cols[rows, cols].sqrt() + 1e-10)
                        self.var_cols[rows, cols] -= lr_t * step
                    if hyper_on:
                        for prm, g in zip(hypers.values(), grads[len(leaves) :]):
                            prm.grad = g
                        for group in opt.param_groups:
                            group["lr"] = lr_hyper * gamma**t
                        opt.step()
                        project_to_bounds(hypers, bounds)  # projected Adam
                    if use_cv:  # Prop. 3: a <- a + Phi_{p,U} (v_U - v_U^old)
                        Fp_U = extras["Fp_U"]
                        a[:, 0] += Fp_U @ (self.var_mean[U] - old_mu)
                        if k:
                            dl = self._lower_cols(U, dr_u, self.var_cols[U][:, dr_u] - old_cols)
                            a[:, 1 + dr_u] += Fp_U @ dl
                if callback is not None:
                    callback(t, float(loss.detach()))
                if deadline is not None and time.monotonic() > deadline:
                    break
        return self

    @torch.no_grad()
    def control_variate_state(
        self, cv_rank: int, generator: torch.Generator | None = None
    ) -> ControlVariateState:
        r"""Support rows ``p`` (``n_bar`` drawn without replacement), their inputs, the frozen basis
        hyperparameters (App. F.3) and ``a = Phi_p [mu, l_0..l_{k-1}]`` (``n_bar x (1+k)``, Prop. 3;
        one ``O(n_bar m)`` pass unless ``q(w)`` is still at its zero-mean initialisation), as a
        :class:`~bo_online.models.qsgp.sgd_inputs.ControlVariateState` (a tuple
        ``(p, X_p, frozen, a)``)."""
        n, k = self._num_train_rows, self.num_dense
        dd = self._dtype_device
        p = torch.randperm(n, generator=generator, device=dd["device"])[: min(cv_rank, n)]
        frozen = self.basis.frozen_state()
        Xp = self.train_X[p]
        a = torch.zeros(p.numel(), 1 + k, **dd)
        if bool((self.var_mean != 0).any()) or bool((self.var_cols != 0).any()):
            for idx in self._chunks():
                Fp = self.basis.features(Xp, idx, frozen)
                a[:, 0] += Fp @ self.var_mean[idx]
                if k:
                    a[:, 1:] += Fp @ self._lower_cols(
                        idx, torch.arange(k, device=idx.device), self.var_cols[idx]
                    )
        return ControlVariateState(p, Xp, frozen, a)

    def stochastic_loss(
        self,
        s: IndexSample,
        cv_state: ControlVariateState | tuple | None = None,
        hyper_grad: bool = False,
        use_priors: bool = False,
    ) -> tuple[Tensor, dict]:
        r"""One draw of the negative-ELBO estimator at the index sample ``s``.

        Gaussian likelihood: ``(L_mu + L_Sigma + L_const) / 2`` estimated by Theorems 1-2 and
        Prop. 2 (unbiased for ``-ELBO`` of Eq. 2; with a dense ``S`` the constant ``-log|S|/2``
        is omitted), plus the Eq. 3 control variates when ``cv_state`` is given (the
        :class:`~bo_online.models.qsgp.sgd_inputs.ControlVariateState` of
        :meth:`control_variate_state`, or a tuple ``(p, X_p, frozen, a)``).
        Other likelihoods: ``-`` Theorem 3 + the KL estimate.

        Returns:
            ``(loss, state)``; ``state["leaves"]`` are the gathered variational coordinates
            (``mu[U]``, ``log c[U]``, ``l[U, dr]``) the loss is differentiable in, with ``U``,
            ``dr_u`` and (with control variates) ``Fp_U``.
        """
        sample = ColumnSample.from_index_sample(s)
        leaves = self._variational_leaves(sample)
        cv = None if cv_state is None else ControlVariateState(*cv_state)
        with torch.enable_grad():
            loss, extras = self._step_loss(sample, leaves, hyper_grad, cv, use_priors)
        extras.update(U=sample.U, dr_u=sample.dr_u, leaves=leaves.tensors())
        return loss, extras

    def _variational_leaves(self, sample: ColumnSample) -> VariationalLeaves:
        r"""Copies of ``mu``, ``log c_rr`` and the dense columns' entries at ``sample``'s touched
        columns, as autograd leaves."""
        U = sample.U
        mu_U = self.var_mean[U].clone().requires_grad_(True)
        ld_U = self.var_log_diag[U].clone().requires_grad_(True)
        k = self.num_dense
        cols_U = self.var_cols[U][:, sample.dr_u].clone().requires_grad_(True) if k else None
        return VariationalLeaves(mu_U, ld_U, cols_U)

    @staticmethod
    def _adagrad(param: Tensor, acc: Tensor, U: Tensor, g: Tensor | None, lr: float) -> None:
        r"""Sparse AdaGrad (Duchi et al.) on the coordinates ``U`` only (unique indices)."""
        if g is None:
            return
        acc[U] += g.pow(2)
        param[U] -= lr * g / (acc[U].sqrt() + 1e-10)

    def _step_loss(
        self,
        sample: ColumnSample,
        leaves: VariationalLeaves,
        hyper_on: bool,
        cv: ControlVariateState | None,
        use_priors: bool,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        r"""Negative ELBO estimate of one SGD step (see :mod:`bo_online.models.qsgp.estimators`).

        Args:
            sample: the step's index sample and its touched columns ``U``.
            leaves: ``mu``, ``log c_rr`` and dense-column entries at ``U`` (autograd leaves).
            hyper_on: differentiate in the hyperparameters too (features built with grad).
            cv: the control variates' support (Gaussian likelihood), or None for none.
            use_priors: add the hyperparameters' negative log priors (when ``hyper_on``).

        Returns:
            ``(loss, extras)``: the scalar estimate and, with control variates, ``extras["Fp_U"]``
            (``n_bar x u`` support features at ``U``, for the Prop. 3 update of ``cv.a``).
        """
        s = sample.index
        U, inv_i, inv_j = sample.U, sample.inv_i, sample.inv_j
        inv_r, inv_dr, dr_u, dr_inv = sample.inv_r, sample.inv_dr, sample.dr_u, sample.dr_inv
        mu_U, ld_U, cols_U = leaves.mu, leaves.log_diag, leaves.cols
        basis = self.basis
        k = self.num_dense
        rows = s.rows
        ctx = torch.enable_grad() if hyper_on else torch.no_grad()
        with ctx:
            F_U = basis.features(self.train_X[rows], U)
            y = self.train_y[rows] - self.mean_constant
            if self.likelihood_name == "gaussian":
                w = 1.0 / self._row_noise(rows)
            diagS = basis.diagonal_prior
            S_U = basis.prior_precision_diag(U)
            S_ji = basis.prior_precision_block(U[inv_j], U[inv_i]) if not diagS else None
            S_dr_i = basis.prior_precision_block(s.dr, U[inv_i]) if (not diagS and k) else None
        if sample.all_columns:  # the samples i = j are U itself, no gathers needed
            Fi = Fj = F_U
            mu_i = mu_j = mu_U
        else:
            Fi, Fj = F_U[:, inv_i], F_U[:, inv_j]
            mu_i, mu_j = mu_U[inv_i], mu_U[inv_j]
        F_r, F_dr = F_U[:, inv_r], F_U[:, inv_dr]
        L_U = None
        if k:
            L_U = self._lower_cols(U, dr_u, cols_U)[:, dr_inv]  # |U| x k~
        L_i = L_U[inv_i] if k else None
        L_j = L_U[inv_j] if k else None
        S_i = S_U[inv_i] if diagS else None
        extras: dict[str, Tensor] = {}
        cv_mu = cv_cols = None
        if cv is not None:
            p, a = cv.p, cv.a
            with torch.no_grad():
                Fp_U = basis.features(cv.X_p, U, cv.frozen)
            extras["Fp_U"] = Fp_U
            wp = 1.0 / self._row_noise(p) if not self.fixed_noise else 1.0 / self.train_noise[p]
            in_ij = torch.zeros(U.numel(), dtype=torch.bool, device=U.device)
            in_ij[inv_i] = True
            in_ij[inv_j] = True
            mask = in_ij.to(mu_U).unsqueeze(-1)
            V_U = mu_U.unsqueeze(-1)
            a_sel = a[:, :1]
            if k:
                V_U = torch.cat([V_U, L_U], dim=-1)
                a_sel = torch.cat([a_sel, a[:, 1 + s.dr]], dim=-1)
            a_live = a_sel + Fp_U @ ((V_U - V_U.detach()) * mask)
            Fpi, Fpj = Fp_U[:, inv_i], Fp_U[:, inv_j]
            cvs = control_variate(
                s,
                self._num_train_rows / p.numel(),
                Fpi,
                Fpj,
                wp,
                V_U[inv_i],
                V_U[inv_j],
                a_live,
                int(in_ij.sum()),
            )
            cv_mu, cv_cols = cvs[:1].sum(), (cvs[1:] if k else None)

        def covariance_term(weights: Tensor, cv: Tensor | None = None) -> Tensor:
            # Theorem 2's estimate of the covariance term for row weights ``weights``.
            return theorem2_estimate(
                s,
                F_r,
                weights,
                ld_U[inv_r],
                S_U[inv_r],
                Fi,
                Fj,
                F_dr if k else None,
                ld_U[inv_dr] if k else None,
                S_U[inv_dr] if k else None,
                L_i,
                L_j,
                S_i,
                S_ji,
                S_dr_i,
                cv=cv,
            )

        prior_terms = torch.zeros((), dtype=mu_U.dtype, device=mu_U.device)
        if use_priors and hyper_on:
            prior_terms = -self.log_prior()
        if self.likelihood_name == "gaussian":
            L_mu = theorem1_estimate(s, Fi, Fj, y, w, mu_i, mu_j, S_i, S_ji, cv=cv_mu)
            L_sig = covariance_term(w, cv=cv_cols)
            L_const = prop2_estimate(s, y, w, S_U[inv_i].log() if diagS else None)
            return 0.5 * (L_mu + L_sig + L_const) + prior_terms, extras
        # Theorem 3 (log-concave likelihoods) with the std fix, plus the KL term.
        zero_w = torch.zeros(rows.numel(), dtype=mu_U.dtype, device=mu_U.device)
        scale = self.likelihood.noise.reshape(()) if self.likelihood is not None else zero_w[0]
        ell = theorem3_estimate(
            s,
            self.likelihood_name,
            Fi,
            y,
            mu_i,
            F_r,
            ld_U[inv_r],
            scale,
            F_dr if k else None,
            ld_U[inv_dr] if k else None,
            Fj,
            L_i,
            L_j,
        )
        kl2 = theorem1_estimate(s, Fi, Fj, y, zero_w, mu_i, mu_j, S_i, S_ji)
        kl2 = kl2 + covariance_term(zero_w)
        kl2 = kl2 - s.m - (s.col_scale * S_U[inv_i].log().sum() if diagS else 0.0)
        return -ell + 0.5 * kl2 + prior_terms, extras
