r"""t-SVGP: a sparse variational GP in dual (site) parameters, with additive online conditioning.

``TSVGP`` is the sparse variational GP of Adam, Chang, Khan & Solin, "Dual Parameterization of
Sparse Variational Gaussian Processes" (NeurIPS 2021, arXiv:2111.03412), written in the notation
and sign convention of docs/math.md §2. Every observation ``i`` owns a Gaussian site
``exp(g1_i f_i - beta_i f_i^2 / 2)`` on the latent ``h = f - c`` (``c`` the constant prior mean),
with a POSITIVE site precision ``beta_i``.
The sites enter the posterior only through two m-dimensional summaries::

    lam = sum_i k_u(x_i) g1_i          Lam = sum_i k_u(x_i) beta_i k_u(x_i)^T
    q(u) = N(K (K + Lam)^-1 lam, K (K + Lam)^-1 K)
    mean(x) = c + k_xu (K + Lam)^-1 lam
    cov(x, x') = k(x, x') - k_xu K^-1 k_ux' + k_xu (K + Lam)^-1 k_ux'

so a new observation is folded in by ADDING its site: a rank-q update of a Cholesky factor,
O(m^2 q), independent of n. For a Gaussian likelihood ``g1_i = (y_i - c)/sigma^2``,
``beta_i = 1/sigma^2`` and the model is exactly SGPR (Titsias 2009); for other likelihoods
(Bernoulli probit/logit, Poisson, Student-t: ``bo_online.likelihoods``) the sites come from
natural-gradient E-steps (``alpha_i = E_q[d log p/df]``, ``beta_i = -E_q[d^2 log p/df^2]``,
``g1_i = beta_i m_i + alpha_i``).

Factorisation used (a stable form of "the Cholesky of K + Lam"): with ``L_K L_K^T = K`` and the
whitened ``B = I + L_K^-1 Lam L_K^-T = L_B L_B^T`` (eigenvalues >= 1), ``chol(K + Lam) = L_K L_B``.
The caches are ``L_K``, ``L_B``, ``lam_w = L_K^-1 lam`` and ``v = B^-1 lam_w``; then
``mean(x) = c + a_x^T v`` and ``var(x) = k_xx - |a_x|^2 + |L_B^-1 a_x|^2`` with
``a_x = L_K^-1 k_ux``, and ``KL[q(u) || p(u)] = 1/2 (logdet B + tr B^-1 - m + |v|^2)`` (docs/math.md
§2's KL, whitened).

Learning is variational EM (paper Sec. 3-4): E-steps move the sites by natural gradients
(full batch or minibatch with the N/|B| scaling of Eqs. 22-23); M-steps maximise the TIGHTER bound
of Eq. 15 -- sites frozen per point, q rebuilt from them with the new hyperparameters and inducing
points -- with Adam or L-BFGS. The per-point sites (O(n)) are kept so any refit re-projects them
exactly. For a Gaussian likelihood the E-step is exact in closed form and the M-step objective is
the collapsed SGPR bound.

Use it for BO / active learning when n will grow large (thousands and beyond), when the likelihood
is not Gaussian (binary success/failure, counts, outliers), or when fantasies must be cheap:
``fantasize`` for q points costs O(m^2 q + S m^2) for S samples with a Gaussian likelihood: the
conditioned model keeps its parent's factor ``L_B`` and the q new whitened site columns ``U``, and
solves with ``B + U U^T`` in Woodbury form (``bo_online.linalg.LowRankUpdatedCholesky``);
``update`` (in place) folds the new columns into the factor itself by rank-one updates.

Several outputs (``train_Y`` ``n x m``, Gaussian likelihoods): the outputs are an internal batch
dimension -- per-point tensors ``m x n``, caches ``batch x m x ...`` -- exactly m independent
single-output models computed together (``kl_divergence`` returns the m KLs, ``elbo`` their sum).

``posterior(X, observation_noise=True)``: Gaussian likelihoods add the noise variance. For the
others the returned distribution is still Gaussian: the latent posterior plus ``Var[y | f]``
evaluated at the posterior mean of f (Bernoulli ``p (1 - p)``, Poisson ``exp(m)``, Student-t
``scale^2 nu / (nu - 2)``), i.e. a moment-style approximation of the predictive spread of y, never
the exact (non-Gaussian) predictive distribution.

Modules (one job each; :class:`TSVGP` composes the mixins):

* ``model`` -- :class:`TSVGP`: constructor, data layout (one or several outputs), posterior, state.
* ``sites`` -- per-point data and sites, exact Gaussian sites, the natural-gradient E-step.
* ``caches`` -- the whitened summaries ``lam_w``, ``B = L_B L_B^T`` and ``v``, rebuilt from sites.
* ``bound`` -- the ELBO (M-step objective), log prior, KL and q(u).
* ``conditioning`` -- ``condition_on_observations`` / ``update`` / ``fantasize`` by adding sites.
* ``fitting`` -- :class:`TSVGPFitSettings` and variational EM (``fit``).
* ``inducing`` -- :func:`select_inducing_points` (greedy variance reduction, Sobol fill).
"""

from bo_online.models.tsvgp.fitting import TSVGPFitSettings
from bo_online.models.tsvgp.inducing import select_inducing_points
from bo_online.models.tsvgp.model import DEFAULT_NUM_INDUCING, TSVGP

__all__ = ["DEFAULT_NUM_INDUCING", "TSVGP", "TSVGPFitSettings", "select_inducing_points"]
