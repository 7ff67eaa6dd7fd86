# %% [markdown]
# # Writing a new surrogate against the contract
#
# Every bo_online surrogate subclasses `bo_online.models.base.OnlineModel` (see
# [the model contract](../contract.md)). The base class does the shared work: input validation,
# outcome standardisation, the BoTorch `posterior`, `condition_on_observations`, `update`,
# `fantasize`, the cache mechanism and `state_dict`. A new model implements six hooks:
#
# | hook | what it must do |
# |---|---|
# | `_latent_posterior(X)` | latent `MultivariateNormal` at `batch x q x d` inputs (standardised) |
# | `_noise_variance(X)` | the observation-noise variance at `X` (standardised units) |
# | `_condition(X, Y, noise)` | a new model that also holds `(X, Y)` (`Y` may carry fantasy dims) |
# | `_update(X, Y, noise)` | the same, in place, for a single model |
# | `_rebuild_caches()` | recompute everything that depends on hyperparameters |
# | `fit(...)` | refit the hyperparameters from the model's own statistics |
#
# This tutorial writes Bayesian linear regression on fixed random Fourier features, a model whose
# posterior is a Gaussian we can also compute by hand, and checks one against the other.
#
# Set `BO_ONLINE_TUTORIAL_SMALL=1` to run at toy size.

# %%
import math
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
from botorch.acquisition.logei import qLogExpectedImprovement
from botorch.optim import optimize_acqf
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.distributions import MultivariateNormal
from torch import Tensor

from bo_online.models.base import OnlineModel

SMALL = os.environ.get("BO_ONLINE_TUTORIAL_SMALL") == "1"
FIGURES = Path(os.environ.get("BO_ONLINE_TUTORIAL_FIGURES", "figures"))
FIGURES.mkdir(parents=True, exist_ok=True)
torch.set_num_threads(1)

# %% [markdown]
# ## The model
#
# `f(x) = phi(x)^T w` with `D` random Fourier features `phi(x) = sqrt(2 / D) cos(x Omega + b)`
# (`Omega ~ N(0, 1/l^2)`, `b ~ U(0, 2 pi)`, drawn once and fixed) and prior `w ~ N(0, v I)`; this
# approximates a GP with an RBF kernel of lengthscale `l` and signal variance `v`. With noise
# variance `s2` the weight posterior has precision `P = Phi^T Phi / s2 + I / v` and mean
# `P^-1 Phi^T y / s2`.
#
# What the model keeps follows the contract's split:
#
# * **statistics**, which do not depend on hyperparameters and change only when data arrive:
#   `A = Phi^T Phi` (`D x D`), `c = Phi^T y` (`D`), `y^T y` and `n`. An update adds to them:
#   `O(q D^2)`, independent of `n`;
# * **caches**, which depend on `(s2, v)`: the Cholesky factor of `P` and the weight mean. The
#   base class calls `_rebuild_caches` whenever a hyperparameter value changed.
#
# The hyperparameters `log(s2 - 1e-4)` and `log v` are `torch.nn.Parameter`s, so the cache
# mechanism sees them, and `fit` maximises the log evidence, which is computable from the
# statistics alone.


# %%
class RFFBayesLinear(OnlineModel):
    """Bayesian linear regression on ``num_features`` fixed random Fourier features."""

    def __init__(
        self,
        train_X: Tensor,
        train_Y: Tensor,
        num_features: int = 100,
        lengthscale: float = 0.2,
        seed: int = 0,
    ) -> None:
        d = train_X.shape[-1]
        super().__init__(dim=d, bounds=None, dtype=train_X.dtype, device=train_X.device)
        X = self._checked_training_data(train_X, train_Y, None)  # validates; n x d
        std = train_Y.std() if train_Y.shape[0] > 1 else torch.ones(())
        self.outcome_mean = train_Y.mean(0).to(X)
        self.outcome_std = torch.where(std > 0, std, torch.ones_like(std)).reshape(1).to(X)
        gen = torch.Generator().manual_seed(seed)
        self.register_buffer(
            "omega", torch.randn(d, num_features, generator=gen).to(X) / lengthscale
        )
        self.register_buffer("phase", (2 * math.pi * torch.rand(num_features, generator=gen)).to(X))
        self.log_noise = torch.nn.Parameter(torch.tensor(math.log(0.1)).to(X))
        self.log_prior_var = torch.nn.Parameter(torch.zeros((), dtype=X.dtype, device=X.device))
        self.likelihood = None  # BoTorch's fantasize reads it; no GPyTorch likelihood here
        Phi, y = self.features(X), self._standardize(train_Y.to(X)).squeeze(-1)
        self.register_buffer("A", Phi.mT @ Phi)  # D x D (batch x D x D once conditioned)
        self.register_buffer("c", Phi.mT @ y)  # D (sample x batch x D)
        self.register_buffer("yy", y @ y)
        self.register_buffer("n", torch.tensor(float(X.shape[0])).to(X))
        self.register_buffer("chol_P", None)  # caches, built by _rebuild_caches
        self.register_buffer("w_mean", None)

    def noise_var(self) -> Tensor:
        # A floor keeps the evidence from driving s2 to 0 while D > n (the features interpolate).
        return 1e-4 + self.log_noise.exp()

    def features(self, X: Tensor) -> Tensor:
        D = self.omega.shape[-1]
        return math.sqrt(2.0 / D) * torch.cos(X @ self.omega + self.phase)

    # -------------------------------------------------------------- the six hooks
    def _rebuild_caches(self) -> None:
        s2, v = self.noise_var(), self.log_prior_var.exp()
        eye = torch.eye(self.A.shape[-1], dtype=self.A.dtype, device=self.A.device)
        self.chol_P = torch.linalg.cholesky(self.A / s2 + eye / v)
        self.w_mean = torch.cholesky_solve((self.c / s2).unsqueeze(-1), self.chol_P).squeeze(-1)

    def _latent_posterior(self, X: Tensor) -> MultivariateNormal:
        Phi = self.features(X)  # batch x q x D
        mean = (Phi * self.w_mean.unsqueeze(-2)).sum(-1)
        V = torch.linalg.solve_triangular(self.chol_P, Phi.mT, upper=False)  # batch x D x q
        covar = V.mT @ V + 1e-9 * torch.eye(X.shape[-2], dtype=X.dtype, device=X.device)
        return MultivariateNormal(mean, covar)

    def _noise_variance(self, X: Tensor) -> Tensor:
        return self.noise_var().expand(X.shape[:-1])

    def _add(self, X: Tensor, Y: Tensor, noise: Tensor | None) -> tuple[Tensor, ...]:
        if noise is not None:
            raise ValueError("RFFBayesLinear learns one noise level; do not pass noise.")
        Phi = self.features(X)  # batch x q x D;  Y: (sample x) batch x q
        return (
            self.A + Phi.mT @ Phi,
            self.c + (Phi.mT @ Y.unsqueeze(-1)).squeeze(-1),
            self.yy + (Y * Y).sum(-1),
            self.n + X.shape[-2],
        )

    def _condition(self, X: Tensor, Y: Tensor, noise: Tensor | None) -> "RFFBayesLinear":
        new = self._shallow_copy()  # shares hyperparameter tensors; statistics replaced below
        new.A, new.c, new.yy, new.n = self._add(X, Y, noise)
        new._batch_shape = new.c.shape[:-1]
        new._rebuild_caches()
        new._cache_key = new._current_key()
        return new

    def _update(self, X: Tensor, Y: Tensor, noise: Tensor | None) -> None:
        self.A, self.c, self.yy, self.n = self._add(X, Y, noise)
        self._rebuild_caches()  # O(D^3): fine for a few hundred features

    def log_evidence(self) -> Tensor:
        """log N(y; 0, v Phi Phi^T + s2 I) from the statistics alone (Woodbury and the
        matrix determinant lemma), differentiable in (log s2, log v)."""
        s2, v = self.noise_var(), self.log_prior_var.exp()
        D = self.A.shape[-1]
        L = torch.linalg.cholesky(self.A / s2 + torch.eye(D).to(self.A) / v)
        u = torch.linalg.solve_triangular(L, (self.c / s2).unsqueeze(-1), upper=False)
        quad = self.yy / s2 - (u * u).sum()
        logdet = self.n * s2.log() + D * v.log() + 2 * L.diagonal().log().sum()
        return -0.5 * (quad + logdet + self.n * math.log(2 * math.pi))

    def fit(self, max_iter: int = 100) -> "RFFBayesLinear":
        opt = torch.optim.LBFGS(
            [self.log_noise, self.log_prior_var], max_iter=max_iter, line_search_fn="strong_wolfe"
        )

        def closure() -> Tensor:
            opt.zero_grad()
            loss = -self.log_evidence()
            loss.backward()
            return loss

        opt.step(closure)
        return self  # the changed hyperparameters make the base class rebuild the caches


# %% [markdown]
# ## Checked against a Gaussian computed by hand
#
# Build the model on a few points, fold more in with `update`, and compare its posterior with the
# function-space formulas on all the data, computed densely: with `K = v Phi Phi^T`,
# `mean = K_*X (K + s2 I)^-1 y` and `cov = K_** - K_*X (K + s2 I)^-1 K_X*`, in standardised
# units, then mapped back to the user's units. This is an independent route (no weight posterior,
# no statistics).

# %%
gen = torch.Generator().manual_seed(1)


def objective(X: Tensor) -> Tensor:
    return torch.sin(8 * X[..., 0]) + torch.cos(5 * X[..., 1]) - 2 * (X[..., 0] - 0.6) ** 2


n0, n1 = 10, 30 if SMALL else 80
X_all = torch.rand(n0 + n1, 2, generator=gen, dtype=torch.float64)
Y_all = objective(X_all).unsqueeze(-1) + 0.05 * torch.randn(
    n0 + n1, 1, generator=gen, dtype=torch.float64
)

model = RFFBayesLinear(X_all[:n0], Y_all[:n0], num_features=100 if SMALL else 300)
model.fit()
for i in range(n0, n0 + n1, 5):
    model.update(X_all[i : i + 5], Y_all[i : i + 5])
model.fit()  # refit from the statistics of all the data (no X or y is kept)
print(
    f"noise variance {model.noise_var().item():.4f}, "
    f"prior variance {model.log_prior_var.exp().item():.3f}"
)


def dense_posterior(
    model: RFFBayesLinear, X: Tensor, Y: Tensor, Xs: Tensor
) -> tuple[Tensor, Tensor]:
    with torch.no_grad():
        s2, v = model.noise_var(), model.log_prior_var.exp()
        y = (Y.squeeze(-1) - model.outcome_mean) / model.outcome_std
        F, Fs = model.features(X), model.features(Xs)
        K, Ks, Kss = v * F @ F.T, v * Fs @ F.T, v * Fs @ Fs.T
        G = K + s2 * torch.eye(len(y), dtype=y.dtype)
        mean = Ks @ torch.linalg.solve(G, y)
        cov = Kss - Ks @ torch.linalg.solve(G, Ks.T)
        return mean * model.outcome_std + model.outcome_mean, cov * model.outcome_std**2


X_test = torch.rand(25, 2, generator=gen, dtype=torch.float64)
mean_hand, cov_hand = dense_posterior(model, X_all, Y_all, X_test)
with torch.no_grad():
    post = model.posterior(X_test)
err_mean = float((post.mean.squeeze(-1) - mean_hand).abs().max())
err_cov = float((post.covariance_matrix - cov_hand).abs().max())
print(f"max |mean - by hand| = {err_mean:.2e}, max |cov - by hand| = {err_cov:.2e}")
assert err_mean < 1e-6 and err_cov < 1e-6

# %% [markdown]
# The log evidence from the statistics matches the dense Gaussian log density as well, and
# `condition_on_observations` gives a new model equal to one updated in place, leaving the
# original alone:

# %%
with torch.no_grad():
    s2, v = model.noise_var(), model.log_prior_var.exp()
    y = (Y_all.squeeze(-1) - model.outcome_mean) / model.outcome_std
    F = model.features(X_all)
    dense = torch.distributions.MultivariateNormal(
        torch.zeros_like(y), v * F @ F.T + s2 * torch.eye(len(y), dtype=y.dtype)
    ).log_prob(y)
    print(f"log evidence: statistics {float(model.log_evidence()):.6f}, dense {float(dense):.6f}")
    assert abs(float(model.log_evidence() - dense)) < 1e-6 * abs(float(dense)) + 1e-6

X_new = torch.rand(3, 2, generator=gen, dtype=torch.float64)
Y_new = objective(X_new).unsqueeze(-1)
before = model.posterior(X_test).mean.detach().clone()
conditioned = model.condition_on_observations(X_new, Y_new)
mean_hand, _ = dense_posterior(model, torch.cat([X_all, X_new]), torch.cat([Y_all, Y_new]), X_test)
with torch.no_grad():
    assert torch.allclose(conditioned.posterior(X_test).mean.squeeze(-1), mean_hand, atol=1e-6)
    assert torch.equal(model.posterior(X_test).mean, before)  # the original is untouched
print("condition_on_observations agrees with the dense posterior on all the data")

# %% [markdown]
# ## It is a BoTorch model
#
# Nothing else is needed for BoTorch's acquisition functions: `qLogEI` samples the posterior,
# `optimize_acqf` maximises it, and `update` folds each new point in. `fantasize` (used by
# look-ahead acquisitions such as qKG) works through `_condition` with fantasy dimensions.

# %%
bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
bo = RFFBayesLinear(X_all[:n0], Y_all[:n0], num_features=100 if SMALL else 300)
bo.fit()
X_seen, Y_seen = X_all[:n0], Y_all[:n0]
for step in range(3 if SMALL else 25):
    acqf = qLogExpectedImprovement(bo, best_f=Y_seen.max())
    x, _ = optimize_acqf(acqf, bounds, q=1, num_restarts=4, raw_samples=64)
    y = objective(x).unsqueeze(-1)
    bo.update(x, y)
    X_seen, Y_seen = torch.cat([X_seen, x]), torch.cat([Y_seen, y])
    if (step + 1) % 10 == 0:
        bo.fit()
fantasy = bo.fantasize(X_test[:2], SobolQMCNormalSampler(torch.Size([4])))
print(
    f"best value found {float(Y_seen.max()):.3f}; "
    f"fantasy model batch shape {tuple(fantasy.batch_shape)}"
)

# %%
grid = torch.stack(
    torch.meshgrid(torch.linspace(0, 1, 60), torch.linspace(0, 1, 60), indexing="ij"), -1
)
grid = grid.reshape(-1, 2).double()
with torch.no_grad():
    mean = bo.posterior(grid).mean.reshape(60, 60)
fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
axes[0].contourf(
    grid[:, 0].reshape(60, 60), grid[:, 1].reshape(60, 60), objective(grid).reshape(60, 60), 20
)
axes[0].set_title("objective")
cs = axes[1].contourf(grid[:, 0].reshape(60, 60), grid[:, 1].reshape(60, 60), mean, 20)
axes[1].plot(X_seen[:n0, 0], X_seen[:n0, 1], "w.", label="initial")
axes[1].plot(X_seen[n0:, 0], X_seen[n0:, 1], "r.", label="qLogEI")
axes[1].set_title("RFFBayesLinear posterior mean")
axes[1].legend(loc="lower left")
fig.tight_layout()
fig.savefig(FIGURES / "new_surrogate.png", dpi=110)

# %% [markdown]
# ![The objective and the new surrogate's posterior mean with the points
# BO chose](figures/new_surrogate.png)
#
# To use the model from the loops and the `bo-online` command, add it to
# `bo_online.models.registry.MODEL_PATHS` (`"name": "package.module:Class"`); the loops construct
# every model as `Cls(train_X, train_Y, train_Yvar=None, **options)`, so accept `train_Yvar` there
# (raise a `ValueError` if the model cannot use it). `OnlineExactGP`
# (`bo_online/models/exact.py`) is the reference implementation of the contract.
