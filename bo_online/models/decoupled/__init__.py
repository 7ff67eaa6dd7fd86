r"""Decoupled sparse variational GP (Cheng & Boots, 2017) with exact online conditioning.

Paper: Ching-An Cheng and Byron Boots, "Variational Inference for Gaussian Process Models with
Linear Complexity", NeurIPS 2017, arXiv:1711.10127.

``DecoupledSVGP`` approximates the GP posterior with separate bases for the mean and the
covariance (docs/math.md §3, the paper's Eqs. 7-10)::

    mean(x)   = c + k_{x,alpha} a
    cov(x,x') = k(x,x') - k_{x,beta} L H^{-1} L^T k_{beta,x'},      H = I + L^T K_beta L

with ``M_alpha`` mean bases (coefficients ``a``) and ``M_beta`` covariance bases (``B = L L^T``).
Prediction costs O(M_alpha) per point for the mean and O(M_beta^2) for the variance, so the mean
can use many more bases than a coupled SVGP of the same cost.

Design choices (documented because the paper leaves them open):

* **Partially shared bases** (the paper's Appendix A.2): the mean basis is ``[beta; alpha]``, i.e.
  the ``M_beta`` covariance bases are also the first ``M_beta`` mean bases (coefficients
  ``a_beta``), followed by ``M_alpha - M_beta`` mean-only bases ``alpha`` (coefficients
  ``a_alpha``). This is what keeps Gaussian conditioning *closed and exact* at O(M_beta^2 q +
  M_alpha q): the correction ``- k_{x,beta} L H^{-1} L^T K_{beta,X*} c`` folds into ``a_beta``.
  ``num_mean_bases`` counts all ``M_alpha`` mean bases; ``num_mean_bases == num_cov_bases`` is the
  coupled SVGP (alpha = beta).
* ``L`` is a general square ``M_beta x M_beta`` matrix (``B = L L^T`` for any square L); it is
  never initialised to zero (a fixed point of gradient ascent).
* **Conditioning** on ``(X*, y*, noise N*)`` (docs/math.md §3): ``beta' = [beta; X*]``,
  ``L' = blockdiag(L, N*^{-1/2})`` (precisions add), ``H`` grows by a bordered Cholesky
  (``bo_online.linalg.cholesky_append``), and with ``c = (k^(X*,X*) + N*)^{-1} (y* - mean(X*))``:
  ``a_beta' = [a_beta - L H^{-1} L^T K_{beta,X*} c; c]``. Exact (it equals conditioning the
  model's own posterior GP), so noise must be positive. Used for fantasies
  (``condition_on_observations``) and, in :meth:`update`, while the state is not a site optimum
  (set by hand, or bases = data), for at most ``max_basis_growth`` (default 128) bases beyond the
  cap.
* **Capped bases in streams (fold mode)**: after :meth:`fit` (or construction on more points than
  ``num_cov_bases``) the state is the closed-form ELBO optimum of ``a, B`` for fixed bases, kept
  as site statistics ``Q = K_ZX N^{-1} K_XZ`` and ``s = K_ZX N^{-1} (y - c)`` on the mean basis
  ``Z = [beta; alpha]``. :meth:`update` adds the new points' terms to ``Q, s`` and re-solves
  ``a = (K_Z + Q)^{-1} s``, ``B = K_beta^{-1} Q_beta K_beta^{-1}``: the bases never grow, the
  cost is O(M_alpha^3) per update whatever the stream length, and after any chain of updates
  the model equals the same fixed-basis optimum computed in one batch on all held data (the
  collapsed bound of Titsias, "Variational learning of inducing variables in sparse Gaussian
  processes", 2009, in the decoupled parameterisation). Changing hyperparameters by hand drops
  the statistics (back to exact growth until the next fit).
* **What the model keeps to refit**: the observed ``(X, y)`` (and fixed noises) as buffers, O(n)
  memory like an exact GP's data but never used in :meth:`posterior` or conditioning, whose costs
  do not depend on n. :meth:`fit` trains on them.
* Training (:meth:`fit`), default (``method=None`` -> ``"auto"``): L-BFGS-B on the exact GP
  marginal likelihood of the held data (all of it up to ``exact_fit_points = 512``, else a
  random subset of that size, O(512^3) per iteration whatever n), bases re-selected by pivoted
  Cholesky of the fitted kernel on the held data, then the closed-form ``a, B`` (fold mode).
  Plain Adam from the median heuristic, the previous default, barely moved the hyperparameters
  in a BO loop's budget. ``method="adam"`` (or passing ``lr``): Adam on ``a, L, beta, alpha``
  and the hyperparameters with the paper's step size ``gamma_t = gamma_0 / (1 + 0.1 sqrt(t))``,
  unbiased minibatch ELBO (Eq. 10 scaled by ``n / |batch|``, optional column subsampling of
  ``a^T K_alpha a``), online basis growth (``N_delta`` new bases per step from the minibatch, up
  to the caps), median-heuristic lengthscales. The covariance block is trained in whitened
  coordinates ``L = R^{-T} L0``, ``a_beta = R^{-T} a0`` (``R R^T = K_beta``; the paper's
  Appendix A.1 preconditioner). Options: hyperparameters from an exact GP on a data subset, and a
  closed-form (Gaussian) refresh of ``a, B`` after Adam; see :meth:`fit` (its options are the
  fields of ``DecoupledFitSettings``) and ``experiments/decoupled_sinc_kin40k.py`` for why.

Use it when the data outgrow an exact GP (thousands of points and more) and the mean needs more
resolution than the covariance; for small n it starts as the exact GP (bases = data).

Modules: ``model`` (the class), ``bases`` (basis seeding, selection, growth, compression),
``statistics`` (variational state, site statistics, cached factors), ``prediction`` (the
posterior), ``conditioning`` (closed-form folding of new points), ``objectives`` (ELBO, collapsed
bound, exact marginal likelihood), ``fitting`` (``DecoupledFitSettings`` and the fits).
"""

from bo_online.models.decoupled.bases import median_lengthscale, pivoted_cholesky_select
from bo_online.models.decoupled.fitting import DecoupledFitSettings
from bo_online.models.decoupled.model import DecoupledSVGP

__all__ = [
    "DecoupledSVGP",
    "DecoupledFitSettings",
    "median_lengthscale",
    "pivoted_cholesky_select",
]
