r"""Per-point likelihoods with expected derivatives, for site-based (dual) variational GPs.

A site-based model (``bo_online.models.TSVGP``) needs, for every observation ``y_i`` and the
current Gaussian marginal ``q(f_i) = N(m_i, v_i)`` of the latent function, the expected first and
second derivatives of the log-likelihood (docs/math.md §2, E-step)::

    alpha_i = E_q[d log p(y_i | f) / df]          beta_i = -E_q[d^2 log p(y_i | f) / df^2]

and the expected log-likelihood ``E_q[log p(y_i | f)]`` for the ELBO. All three are computed here by
vectorised Gauss-Hermite quadrature (GPyTorch's ``GaussHermiteQuadrature1D``) on closed-form
derivatives, so every likelihood is handled the same way. ``beta`` is a POSITIVE site precision
(docs/math.md's sign convention) and is clipped at ``beta_min`` (1e-8): for a non-log-concave
likelihood (Student-t) the expected curvature can be negative, which would make the sites improper.

Likelihoods (``y`` as stored by the model):

* :class:`Gaussian` -- homoscedastic noise, learnable (a GPyTorch ``GaussianLikelihood`` holds the
  noise parameter, with BoTorch's default prior); conjugate: the sites are exact.
* :class:`FixedNoiseGaussian` -- per-point known noise variances (passed by the model); conjugate.
* :class:`Bernoulli` -- labels in {0, 1}, probit or logit link.
* :class:`Poisson` -- counts, log link (rate ``exp(f)``).
* :class:`StudentT` -- location ``f``, learnable scale and degrees of freedom (a GPyTorch
  ``StudentTLikelihood`` holds them).

Each also says what "observation noise" means for it (:meth:`SiteLikelihood.noise_variance`) and
how to draw observations given ``f`` (:meth:`SiteLikelihood.sample`, used for fantasies).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.special
import scipy.stats
import torch
from botorch.models.utils.gpytorch_modules import get_gaussian_likelihood_with_lognormal_prior
from gpytorch.distributions import base_distributions
from gpytorch.likelihoods import GaussianLikelihood, StudentTLikelihood
from gpytorch.module import Module
from gpytorch.utils.quadrature import GaussHermiteQuadrature1D
from torch import Tensor

__all__ = [
    "SiteLikelihood",
    "Gaussian",
    "FixedNoiseGaussian",
    "Bernoulli",
    "Poisson",
    "StudentT",
]

#: Gauss-Hermite nodes of :meth:`Bernoulli.predictive_prob` (logit link).
PREDICTIVE_NODES = 128
#: Smallest site precision (docs/math.md §2: clip beta_i >= 1e-8).
BETA_MIN = 1e-8
#: Smallest Gaussian noise variance used to form sites (a zero-noise site has infinite precision).
NOISE_MIN = 1e-8


class SiteLikelihood(Module):
    r"""Base class: a factorised likelihood ``p(y | f) = prod_i p(y_i | f_i)``.

    Subclasses implement :meth:`log_prob`, :meth:`d1`, :meth:`d2` (elementwise in ``y`` and ``f``,
    broadcasting), :meth:`noise_variance`, :meth:`sample_from_uniform` and :meth:`check_targets`.

    Args:
        num_locs: number of Gauss-Hermite nodes (32: exact for polynomials of degree <= 63 and
            accurate to ~1e-9 or better for the likelihoods here at unit-scale variances; 20, as
            GPyTorch uses, leaves errors ~3e-8 for the Student-t).
        beta_min: clip for the expected negative curvature.
    """

    #: conjugate (Gaussian) likelihoods have exact sites independent of the current marginal.
    conjugate: bool = False
    #: whether outcome standardisation makes sense (continuous real-valued targets).
    standardizable: bool = True

    def __init__(self, num_locs: int = 32, beta_min: float = BETA_MIN) -> None:
        super().__init__()
        self.quadrature = GaussHermiteQuadrature1D(num_locs=num_locs)
        # GPyTorch builds the nodes through float32 tensors (errors ~1e-7 even after .double());
        # reset them from NumPy's float64 hermgauss so float64 models integrate to full precision.
        locs, weights = np.polynomial.hermite.hermgauss(num_locs)
        self.quadrature.locations = torch.from_numpy(locs)
        self.quadrature.weights = torch.from_numpy(weights)
        self.beta_min = float(beta_min)

    # ---------------------------------------------------------------- per-likelihood pieces

    def log_prob(self, y: Tensor, f: Tensor, noise: Tensor | None = None) -> Tensor:
        """``log p(y | f)`` elementwise (``y``, ``f``, ``noise`` broadcast)."""
        raise NotImplementedError

    def d1(self, y: Tensor, f: Tensor, noise: Tensor | None = None) -> Tensor:
        """``d log p(y | f) / df`` elementwise."""
        raise NotImplementedError

    def d2(self, y: Tensor, f: Tensor, noise: Tensor | None = None) -> Tensor:
        """``d^2 log p(y | f) / df^2`` elementwise."""
        raise NotImplementedError

    def noise_variance(self, f: Tensor, noise: Tensor | None = None) -> Tensor:
        r"""``Var[y | f]`` at latent values ``f``: what ``posterior(..., observation_noise=True)``
        adds to the latent variance (evaluated at the posterior mean of f)."""
        raise NotImplementedError

    def sample_from_uniform(self, f: Tensor, u: Tensor, noise: Tensor | None = None) -> Tensor:
        r"""Draw ``y ~ p(y | f)`` by inverse-CDF from uniforms ``u`` (same shape as ``f``), so a
        fixed set of uniforms gives deterministic fantasies."""
        raise NotImplementedError

    def check_targets(self, y: Tensor) -> None:
        """Raise ``ValueError`` if ``y`` is not in the likelihood's support."""

    def initial_latent(self, y: Tensor) -> Tensor | None:
        r"""A latent value per target (``y``'s shape) to build the first sites at, or None to
        start from the prior. The E-step's Newton-like site update converges slowly from far
        off where the curvature grows fast (``exp(f)`` for counts), so likelihoods with a
        natural inverse link start near the data."""
        return None

    # ---------------------------------------------------------------- quadrature

    def _expect(self, fn, mean: Tensor, var: Tensor, *others: Tensor | None) -> Tensor:
        # The nodes are laid out along a new leading dim, so mean/var must already carry the
        # full broadcast shape (y may have extra leading sample dims).
        shape = torch.broadcast_shapes(
            mean.shape, var.shape, *(o.shape for o in others if o is not None)
        )
        mean, var = mean.expand(shape), var.expand(shape)
        quad = self.quadrature
        if quad.locations.dtype != mean.dtype or quad.locations.device != mean.device:
            quad.to(dtype=mean.dtype, device=mean.device)
        dist = base_distributions.Normal(mean, var.clamp_min(0.0).sqrt())
        return quad(fn, dist)

    def expected_log_prob(
        self, y: Tensor, mean: Tensor, var: Tensor, noise: Tensor | None = None
    ) -> Tensor:
        r"""``E_{N(f; mean, var)}[log p(y | f)]`` elementwise (differentiable in mean, var and the
        likelihood's parameters)."""
        return self._expect(lambda f: self.log_prob(y, f, noise), mean, var, y, noise)

    def expected_derivatives(
        self, y: Tensor, mean: Tensor, var: Tensor, noise: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        r"""``(alpha, beta)`` with ``alpha = E_q[d log p/df]`` and
        ``beta = max(-E_q[d^2 log p/df^2], beta_min)`` under ``q = N(mean, var)``, elementwise
        (docs/math.md §2, E-step)."""
        alpha = self._expect(lambda f: self.d1(y, f, noise), mean, var, y, noise)
        beta = -self._expect(lambda f: self.d2(y, f, noise), mean, var, y, noise)
        return alpha, beta.clamp_min(self.beta_min)

    def sample(self, f: Tensor, generator: torch.Generator | None = None, noise=None) -> Tensor:
        """Draw ``y ~ p(y | f)`` (fresh uniforms)."""
        u = torch.rand(f.shape, dtype=f.dtype, device=f.device, generator=generator)
        return self.sample_from_uniform(f, u, noise)


class Gaussian(SiteLikelihood):
    r"""Homoscedastic Gaussian noise ``y = f + eps``, ``eps ~ N(0, sigma^2)``; sigma^2 learnable.

    The noise lives in a GPyTorch ``GaussianLikelihood`` (``self.gaussian``; BoTorch's default
    log-normal prior unless one is passed). Conjugate: ``alpha = (y - m)/sigma^2``,
    ``beta = 1/sigma^2`` exactly (quadrature of a linear/constant function is exact).

    Args:
        likelihood: optional GPyTorch ``GaussianLikelihood`` to hold the noise.
    """

    conjugate = True

    def __init__(self, likelihood: GaussianLikelihood | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.gaussian = likelihood or get_gaussian_likelihood_with_lognormal_prior()

    @property
    def noise(self) -> Tensor:
        """The noise variance: a 1-element tensor, or ``m x 1`` for a likelihood with batch shape
        ``[m]`` (one noise per output of a multi-output model)."""
        noise = self.gaussian.noise
        return noise.reshape(1) if noise.numel() == 1 else noise

    def _var(self, noise: Tensor | None) -> Tensor:
        return (self.noise if noise is None else noise).clamp_min(NOISE_MIN)

    def log_prob(self, y, f, noise=None):
        s2 = self._var(noise)
        return -0.5 * ((y - f) ** 2 / s2 + torch.log(2 * math.pi * s2))

    def d1(self, y, f, noise=None):
        return (y - f) / self._var(noise)

    def d2(self, y, f, noise=None):
        return (-1.0 / self._var(noise)).expand(torch.broadcast_shapes(y.shape, f.shape))

    def expected_log_prob(self, y, mean, var, noise=None):
        # Closed form (also what the quadrature returns, to rounding).
        s2 = self._var(noise)
        return -0.5 * (((y - mean) ** 2 + var) / s2 + torch.log(2 * math.pi * s2))

    def noise_variance(self, f, noise=None):
        return self._var(noise).expand(f.shape)

    def sample_from_uniform(self, f, u, noise=None):
        z = torch.special.ndtri(u.clamp(1e-12, 1 - 1e-12))
        return f + self._var(noise).sqrt() * z


class FixedNoiseGaussian(Gaussian):
    r"""Gaussian noise with known per-point variances, passed as ``noise`` by the model.

    Has no parameters; every call must pass ``noise`` (the model stores the training noise).
    """

    def __init__(self, **kwargs) -> None:
        SiteLikelihood.__init__(self, **kwargs)

    @property
    def noise(self) -> Tensor:
        raise ValueError("FixedNoiseGaussian has no noise parameter: pass per-point noise.")

    def _var(self, noise):
        if noise is None:
            raise ValueError(
                "FixedNoiseGaussian needs per-point noise variances (train_Yvar / noise=...)."
            )
        return noise.clamp_min(NOISE_MIN)


class Bernoulli(SiteLikelihood):
    r"""Binary labels ``y in {0, 1}`` with ``p(y = 1 | f) = Phi(f)`` (probit) or ``sigmoid(f)``
    (logit). Log-concave, so ``beta > 0`` always.

    Args:
        link: ``"probit"`` (default) or ``"logit"``.
    """

    standardizable = False

    def __init__(self, link: str = "probit", **kwargs) -> None:
        super().__init__(**kwargs)
        if link not in ("probit", "logit"):
            raise ValueError(f"Bernoulli link must be 'probit' or 'logit', got {link!r}.")
        self.link = link

    def check_targets(self, y: Tensor) -> None:
        if not bool(((y == 0) | (y == 1)).all()):
            raise ValueError(
                "Bernoulli likelihood needs labels in {0, 1} (map -1/+1 labels with (y + 1) / 2)."
            )

    def prob(self, f: Tensor) -> Tensor:
        return torch.special.ndtr(f) if self.link == "probit" else torch.sigmoid(f)

    def predictive_prob(self, mean: Tensor, var: Tensor) -> Tensor:
        r"""``p(y = 1) = E_{N(f; mean, var)}[link(f)]`` elementwise: ``Phi(mean / sqrt(1 + var))``
        for the probit link; for the logit link Gauss-Hermite quadrature with
        :data:`PREDICTIVE_NODES` nodes. The sigmoid's poles at ``+-i pi`` slow the quadrature's
        convergence as the latent sd grows: 32 nodes err by 2e-4 at sd 4, 128 by 3e-8."""
        if self.link == "probit":
            return torch.special.ndtr(mean / torch.sqrt(1.0 + var.clamp_min(0.0)))
        locs, weights = np.polynomial.hermite.hermgauss(PREDICTIVE_NODES)
        like = {"dtype": mean.dtype, "device": mean.device}
        locs, weights = (
            torch.tensor(locs, **like),
            torch.tensor(weights / math.sqrt(math.pi), **like),
        )
        f = mean.unsqueeze(-1) + torch.sqrt(2.0 * var.clamp_min(0.0)).unsqueeze(-1) * locs
        return (torch.sigmoid(f) * weights).sum(-1)

    def log_prob(self, y, f, noise=None):
        s = 2 * y - 1
        if self.link == "probit":
            return torch.special.log_ndtr(s * f)
        return torch.nn.functional.logsigmoid(s * f)

    def _probit_ratio(self, z: Tensor) -> Tensor:
        # phi(z) / Phi(z), computed in log space (stable for very negative z).
        return torch.exp(-0.5 * z * z - 0.5 * math.log(2 * math.pi) - torch.special.log_ndtr(z))

    def d1(self, y, f, noise=None):
        s = 2 * y - 1
        if self.link == "probit":
            return s * self._probit_ratio(s * f)
        return y - torch.sigmoid(f)

    def d2(self, y, f, noise=None):
        if self.link == "probit":
            s = 2 * y - 1
            z = s * f
            r = self._probit_ratio(z)
            return -r * (z + r)
        p = torch.sigmoid(f)
        return (-p * (1 - p)).expand(torch.broadcast_shapes(y.shape, f.shape))

    def noise_variance(self, f, noise=None):
        p = self.prob(f)
        return p * (1 - p)

    def sample_from_uniform(self, f, u, noise=None):
        return (u < self.prob(f)).to(f)


class Poisson(SiteLikelihood):
    r"""Counts ``y in {0, 1, 2, ...}`` with rate ``exp(f)`` (log link); log-concave."""

    standardizable = False

    def check_targets(self, y: Tensor) -> None:
        if not bool(((y >= 0) & (y == torch.round(y))).all()):
            raise ValueError("Poisson likelihood needs non-negative integer counts as targets.")

    def initial_latent(self, y: Tensor) -> Tensor:
        # log(y + 1/2): the log link at each count, finite at y = 0. From the prior (f = 0) the
        # first E-step overshoots to about y for large counts, and each later one comes back by
        # about 1 only (the curvature exp(f) grows as fast as the gradient).
        return torch.log(y + 0.5)

    def log_prob(self, y, f, noise=None):
        return y * f - torch.exp(f) - torch.lgamma(y + 1)

    def d1(self, y, f, noise=None):
        return y - torch.exp(f)

    def d2(self, y, f, noise=None):
        return (-torch.exp(f)).expand(torch.broadcast_shapes(y.shape, f.shape))

    def noise_variance(self, f, noise=None):
        return torch.exp(f)

    def sample_from_uniform(self, f, u, noise=None):
        # Inverse CDF (not differentiable: counts are discrete); SciPy has it, torch does not.
        k = scipy.stats.poisson.ppf(u.detach().cpu().numpy(), torch.exp(f).detach().cpu().numpy())
        return torch.as_tensor(k, dtype=f.dtype, device=f.device)


class StudentT(SiteLikelihood):
    r"""Heavy-tailed noise: ``y = f + scale * t_nu``; scale^2 and nu live in a GPyTorch
    ``StudentTLikelihood`` (``noise`` = scale^2, ``deg_free`` = nu > 2 by its constraint).

    Not log-concave: ``-d^2 log p / df^2`` is negative for residuals beyond ``scale sqrt(nu)``, so
    the expected curvature is clipped at ``beta_min`` (docs/math.md §2).
    """

    def __init__(self, likelihood: StudentTLikelihood | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.student_t = likelihood or StudentTLikelihood()

    @property
    def scale2(self) -> Tensor:
        return self.student_t.noise.reshape(1)

    @property
    def df(self) -> Tensor:
        return self.student_t.deg_free.reshape(1)

    def log_prob(self, y, f, noise=None):
        nu, s2 = self.df, self.scale2
        r2 = (y - f) ** 2
        return (
            torch.lgamma((nu + 1) / 2)
            - torch.lgamma(nu / 2)
            - 0.5 * torch.log(math.pi * nu * s2)
            - (nu + 1) / 2 * torch.log1p(r2 / (nu * s2))
        )

    def d1(self, y, f, noise=None):
        nu, s2 = self.df, self.scale2
        r = y - f
        return (nu + 1) * r / (nu * s2 + r * r)

    def d2(self, y, f, noise=None):
        nu, s2 = self.df, self.scale2
        r2 = (y - f) ** 2
        return (nu + 1) * (r2 - nu * s2) / (nu * s2 + r2) ** 2

    def noise_variance(self, f, noise=None):
        nu = self.df
        return (self.scale2 * nu / (nu - 2)).expand(f.shape)

    def sample_from_uniform(self, f, u, noise=None):
        # Inverse CDF of the standard t (SciPy's stdtrit; torch has none), then location/scale.
        t = scipy.special.stdtrit(float(self.df.detach()), u.detach().cpu().numpy())
        t = torch.as_tensor(t, dtype=f.dtype, device=f.device)
        return f + self.scale2.sqrt() * t
