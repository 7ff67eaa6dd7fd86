"""The BO loop's surrogate fits against plain BoTorch / an exact GP on the same data.

A BoTorch user compares our loop with ``SingleTaskGP`` refit by ``fit_gpytorch_mll`` every step;
the exact GP is the same model class and t-SVGP / the decoupled SVGP hold every point as an
inducing / basis point at small n, so their fitted hyperparameters and posteriors must match an
exact GP's there (any gap is a fit defect, not a modelling choice).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms.outcome import Standardize
from gpytorch.mlls import ExactMarginalLogLikelihood

from bo_online.loops import BayesOptLoop
from bo_online.models import OnlineExactGP
from bo_online.models.decoupled import DecoupledSVGP
from bo_online.models.tsvgp import TSVGP
from bo_online.problems import synthetic_problem

DT = torch.float64
FAST_OPT = {"num_restarts": 2, "raw_samples": 32, "maxiter": 20}


def _data(n: int, d: int = 3, seed: int = 0, noise_std: float = 0.05):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=DT)
    Y = torch.sin(6 * X).sum(-1, keepdim=True) + noise_std * torch.randn(
        n, 1, generator=g, dtype=DT
    )
    return X, Y


def _reference(X, Y) -> tuple[SingleTaskGP, float]:
    """SingleTaskGP (Standardize) fitted from its defaults by fit_gpytorch_mll; its MLL per
    point."""
    ref = SingleTaskGP(X, Y, outcome_transform=Standardize(m=1))
    mll = ExactMarginalLogLikelihood(ref.likelihood, ref)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit_gpytorch_mll(mll)
    ref.train()
    with torch.no_grad():
        value = float(mll(ref(*ref.train_inputs), ref.train_targets))
    ref.eval()
    return ref, value


def test_exact_fit_from_defaults_equals_singletaskgp_fit_gpytorch_mll():
    X, Y = _data(20)
    ref, ref_mll = _reference(X, Y)
    ours = OnlineExactGP(X, Y).fit(max_iter=200)
    assert float(ours.marginal_log_likelihood()) == pytest.approx(ref_mll, abs=1e-5)
    assert torch.allclose(ours.covar_module.lengthscale, ref.covar_module.lengthscale, rtol=1e-3)
    assert float(ours.likelihood.noise) == pytest.approx(float(ref.likelihood.noise), rel=1e-2)
    Xt = torch.rand(6, 3, dtype=DT)
    p, r = ours.posterior(Xt), ref.posterior(Xt)
    assert torch.allclose(p.mean, r.mean, atol=1e-4)
    assert torch.allclose(p.variance, r.variance, rtol=1e-3, atol=1e-7)


@pytest.mark.parametrize("model", ["exact", "tsvgp", "decoupled"])
def test_loop_fit_is_at_least_as_good_as_botorch_on_the_loop_data(model):
    """After a few BO steps (refits from the defaults: at this n every surrogate here is the
    exact GP on its data), the loop's surrogate reaches at least the marginal likelihood of
    SingleTaskGP refit from its defaults on the same data."""
    loop = BayesOptLoop(
        synthetic_problem("hartmann6"), model=model, acq="logei", seed=1, optimizer_options=FAST_OPT
    )
    records = loop.run(2)
    assert all(r["refit"] for r in records)
    assert all(r["time_fit"] > 0 for r in records)
    X, Y = loop._training_data()
    _, ref_mll = _reference(X, Y)
    assert float(loop.model.marginal_log_likelihood()) >= ref_mll - 1e-4


def test_tsvgp_fit_at_small_n_is_the_exact_gp_fit():
    """n <= m: the inducing points are re-selected on the data and held fixed, so the collapsed
    bound is the exact marginal likelihood and the fit equals the exact GP's (after an update
    too, whose points were not among the initial inducing inputs)."""
    X, Y = _data(25)
    ex = OnlineExactGP(X[:10], Y[:10]).fit()
    ts = TSVGP(X[:10], Y[:10]).fit()
    ex.update(X[10:], Y[10:])
    ts.update(X[10:], Y[10:])
    ex.fit()
    ts.fit()
    assert torch.allclose(ts.covar_module.lengthscale, ex.covar_module.lengthscale, rtol=1e-4)
    assert float(ts.likelihood.noise) == pytest.approx(float(ex.likelihood.noise), rel=1e-4)
    assert float(ts.marginal_log_likelihood()) == pytest.approx(
        float(ex.marginal_log_likelihood()), abs=1e-6
    )
    # every data point is an inducing input
    gap = (ts.train_X.unsqueeze(-2) - ts.inducing_points.unsqueeze(-3)).abs().amax(-1)
    assert float(gap.min(-1).values.max()) == 0.0
    Xt = torch.rand(8, 3, dtype=DT)
    p, r = ts.posterior(Xt), ex.posterior(Xt)
    assert torch.allclose(p.mean, r.mean, atol=1e-5)
    assert torch.allclose(p.variance, r.variance, rtol=1e-4, atol=1e-8)


@pytest.mark.parametrize("fixed_noise", [False, True])
def test_tsvgp_exact_objective_equals_its_bound_and_a_dense_gaussian(fixed_noise):
    """While n <= m the fit maximises ``exact_log_marginal`` (O(n^3)) instead of the collapsed
    bound over all m inducing inputs: the two agree there, and both equal log N(y | c, K + S)
    written out by hand."""
    X, Y = _data(20)
    noise = torch.full_like(Y, 0.02) + 0.01 * torch.rand_like(Y) if fixed_noise else None
    ts = TSVGP(X, Y, train_Yvar=noise).fit(max_iter=5)
    exact = float(ts.exact_log_marginal())
    assert float(ts.elbo()) == pytest.approx(exact, abs=1e-6)
    with torch.no_grad():
        y = ts.train_y
        s2 = (
            noise.squeeze(-1) / ts.outcome_std**2
            if fixed_noise
            else ts.likelihood.noise.expand(y.shape)
        )
        K = ts.covar_module(ts.train_X).to_dense() + torch.diag(s2)
        mean = ts.mean_module.constant.expand(y.shape)
        dense = torch.distributions.MultivariateNormal(mean, K).log_prob(y)
    assert exact == pytest.approx(float(dense), abs=1e-8)


def test_tsvgp_beyond_m_still_learns_inducing_points():
    X, Y = _data(40)
    ts = TSVGP(X, Y, inducing_points=8)
    Z0 = ts.inducing_points.detach().clone()
    ts.fit(max_iter=20)
    assert not torch.allclose(ts.inducing_points.detach(), Z0)


def test_decoupled_objective_is_the_exact_marginal_likelihood():
    X, Y = _data(25)
    ex = OnlineExactGP(X[:10], Y[:10]).fit()
    dec = DecoupledSVGP(X[:10], Y[:10]).fit()
    ex.update(X[10:], Y[10:])
    dec.update(X[10:], Y[10:])
    ex.fit()
    dec.fit()
    assert torch.allclose(dec.covar_module.lengthscale, ex.covar_module.lengthscale, rtol=1e-3)
    assert float(dec.marginal_log_likelihood()) == pytest.approx(
        float(ex.marginal_log_likelihood()), abs=1e-6
    )


def test_decoupled_default_fit_starts_where_the_exact_gp_does():
    """Five Branin points have two local optima of the marginal likelihood: started from the
    median heuristic the decoupled fit ended in the lower one (lengthscales 0.74 / 0.10 against
    0.10 / 0.27), and a BO run on these points stalled at regret 1.5 for 16 steps. From BoTorch's
    start (the default) it reaches the exact GP's optimum."""
    from botorch.test_functions import Branin
    from torch.quasirandom import SobolEngine

    U = SobolEngine(2, scramble=True, seed=3).draw(5, dtype=DT)
    f = Branin()
    Y = -f(f.bounds[0] + (f.bounds[1] - f.bounds[0]) * U).unsqueeze(-1)
    ex = OnlineExactGP(U, Y).fit(max_iter=50)
    dec = DecoupledSVGP(U, Y).fit(max_iter=50)
    assert torch.allclose(dec.covar_module.lengthscale, ex.covar_module.lengthscale, rtol=1e-4)
    assert float(dec.likelihood.noise) == pytest.approx(float(ex.likelihood.noise), rel=1e-4)
    Xt = torch.rand(6, 2, dtype=DT, generator=torch.Generator().manual_seed(1))
    p, r = dec.posterior(Xt), ex.posterior(Xt)
    assert torch.allclose(p.mean, r.mean, rtol=1e-4, atol=1e-6)
    assert torch.allclose(p.variance, r.variance, rtol=1e-4, atol=1e-8)
    median = DecoupledSVGP(U, Y, lengthscale_init="median").fit(max_iter=50)
    assert float(median.marginal_log_likelihood()) < float(ex.marginal_log_likelihood()) - 0.01


def test_restart_from_defaults_schedule():
    """Which refits start from the defaults. Rebuilt, not warm-started
    (``test_exact_loop_refit_is_botorch_refit_...``): the exact GP always; t-SVGP and the
    decoupled SVGP while they are the exact GP on their data (Gaussian likelihood, every point
    an inducing input / covariance basis: n <= 128 at the defaults). Warm-started and compared
    with a fit from the defaults while n <= 100: QSGP, and t-SVGP / the decoupled SVGP where they
    are not the exact GP."""
    from bo_online.likelihoods import Bernoulli

    problem = synthetic_problem("branin")
    for model, restart in (
        ("exact", (False, False)),
        ("tsvgp", (True, False)),
        ("decoupled", (True, False)),
        ("qsgp", (True, False)),
        ("wiski", (False, False)),
    ):
        loop = BayesOptLoop(problem, model=model, acq="logei", seed=0)
        n = loop.AUTO_REFIT_SMALL_N
        assert (loop._restart_due(n), loop._restart_due(n + 1)) == restart, model

    X = torch.rand(130, 2, generator=torch.Generator().manual_seed(0), dtype=DT)
    Y = torch.sin(6 * X).sum(-1, keepdim=True)
    labels = (Y > 0).to(DT)
    exact_on_data = {
        "exact": (OnlineExactGP(X, Y), True),
        "tsvgp, n = 128": (TSVGP(X[:128], Y[:128]), True),
        "tsvgp, n = 129": (TSVGP(X[:129], Y[:129]), False),
        "tsvgp, m = 16": (TSVGP(X[:40], Y[:40], inducing_points=16), False),
        "tsvgp, Bernoulli": (TSVGP(X[:40], labels[:40], likelihood=Bernoulli()), False),
        "decoupled, n = 128": (DecoupledSVGP(X[:128], Y[:128]), True),
        "decoupled, n = 129": (DecoupledSVGP(X[:129], Y[:129]), False),
        "decoupled, 16 bases": (DecoupledSVGP(X[:40], Y[:40], num_cov_bases=16), False),
    }
    for case, (surrogate, rebuilt) in exact_on_data.items():
        loop = BayesOptLoop(problem, model=case.split(",")[0], acq="logei", seed=0)
        loop.model = surrogate
        assert loop._rebuild_due() is rebuilt, case


def test_exact_loop_refit_is_botorch_refit_even_where_the_warm_mode_has_higher_likelihood():
    """Levy 3-D, 30 noisy points: started near an interpolating mode (one very short
    lengthscale, tiny noise) the exact GP's fit stays there, with a higher marginal likelihood
    than the fit from the defaults reaches; BO with that mode stalled (Levy, q = 3, seed 10:
    regret 8.76 after 90 evaluations, 0.097 refitting from the defaults). The loop's refit
    must be BoTorch's, SingleTaskGP fitted from its defaults, whatever the current model."""
    from botorch.test_functions import Levy

    levy = Levy(dim=3)
    g = torch.Generator().manual_seed(2)
    X = torch.rand(30, 3, generator=g, dtype=DT)
    fx = levy(levy.bounds[0] + (levy.bounds[1] - levy.bounds[0]) * X)
    Y = -(fx + torch.randn(30, generator=g, dtype=DT)).unsqueeze(-1)
    warm = OnlineExactGP(X, Y)
    warm.covar_module.lengthscale = torch.tensor([0.05, 0.3, 5.0], dtype=DT)
    warm.likelihood.noise = 0.005
    warm.fit(max_iter=200)
    ref, ref_mll = _reference(X, Y)
    # the premise: the warm mode is a different optimum with the higher likelihood
    assert float(warm.marginal_log_likelihood()) > ref_mll + 0.2
    assert float(warm.likelihood.noise) < 0.1 * float(ref.likelihood.noise)

    # (any 3-D problem: the loop's data are replaced by these)
    loop = BayesOptLoop(synthetic_problem("hartmann3"), model="exact", acq="logei", seed=0)
    loop._training_data = lambda: (X, Y)
    for init_fit_max_iter in (loop.config["init_fit_max_iter"], 0):
        # a refit from the defaults gets at least the refit's own budget
        loop.config["init_fit_max_iter"] = init_fit_max_iter
        loop.model, loop.step_count = warm, 5
        loop._fit(loop.config["fit_max_iter"])
        assert loop.model is not warm
        assert float(loop.model.marginal_log_likelihood()) == pytest.approx(ref_mll, abs=1e-4)
        lengthscale = loop.model.covar_module.lengthscale
        assert torch.allclose(lengthscale, ref.covar_module.lengthscale, rtol=1e-3)
        assert float(loop.model.likelihood.noise) == pytest.approx(
            float(ref.likelihood.noise), rel=1e-2
        )

    # t-SVGP and the decoupled SVGP hold every point as an inducing / covariance basis at this
    # n, so their model is the exact GP's: their refit there is BoTorch's too, although the
    # warm mode has the higher likelihood
    for name, cls in (("tsvgp", TSVGP), ("decoupled", DecoupledSVGP)):
        warm_online = cls(X, Y)
        warm_online.covar_module.lengthscale = torch.tensor([0.05, 0.3, 5.0], dtype=DT)
        gaussian = getattr(warm_online.likelihood, "gaussian", warm_online.likelihood)
        gaussian.noise = 0.005  # (t-SVGP's site likelihood wraps a GPyTorch Gaussian)
        warm_online.fit(max_iter=200)
        assert float(warm_online.marginal_log_likelihood()) > ref_mll + 0.2, name
        loop = BayesOptLoop(synthetic_problem("hartmann3"), model=name, acq="logei", seed=0)
        loop._training_data = lambda: (X, Y)
        loop.model, loop.step_count = warm_online, 5
        loop._fit(loop.config["fit_max_iter"])
        assert loop.model is not warm_online, name
        assert float(loop.model.marginal_log_likelihood()) == pytest.approx(ref_mll, abs=1e-4)
        lengthscale = loop.model.covar_module.lengthscale
        assert torch.allclose(lengthscale, ref.covar_module.lengthscale, rtol=1e-3), name
        assert float(loop.model.likelihood.noise) == pytest.approx(
            float(ref.likelihood.noise), rel=1e-2
        )

    # with fewer inducing inputs than points t-SVGP is not the exact GP: warm-started, and a
    # fit from the defaults replaces it only where its likelihood is higher
    options = {"inducing_points": 8}
    loop = BayesOptLoop(
        synthetic_problem("hartmann3"), model="tsvgp", acq="logei", seed=0, model_options=options
    )
    loop._training_data = lambda: (X, Y)
    loop.config.update(fit_max_iter=1, init_fit_max_iter=100)
    poor = TSVGP(X, Y, **options)  # far from its optimum, and one warm iteration
    poor.covar_module.lengthscale = 5.0
    poor.likelihood.gaussian.noise = 2.0
    loop.model, loop.step_count = poor, 5
    loop._fit(1)
    from_defaults = TSVGP(X, Y, **options).fit(max_iter=100)
    assert loop.model is not poor
    assert float(loop.model.marginal_log_likelihood()) == pytest.approx(
        float(from_defaults.marginal_log_likelihood()), abs=1e-8
    )
    loop.config["init_fit_max_iter"] = 3  # a fit from the defaults that stops short
    converged = TSVGP(X, Y, **options).fit(max_iter=300)
    loop.model = converged
    loop._fit(1)
    assert loop.model is converged


def _qsgp_posterior_error(sampling: str, d: int = 4, seeds: int = 3) -> tuple[float, float]:
    """QSGP (m = 512 RFF, fixed hyperparameters) against the exact GP of the kernel its features
    approximate, on n = 20 points: RMSE of the posterior mean and mean abs error of the posterior
    sd over 300 test points, both relative to the data's sd (averaged over seeds)."""
    from bo_online.models.qsgp import QSGP

    mean_err, sd_err = 0.0, 0.0
    for seed in range(seeds):
        g = torch.Generator().manual_seed(seed)
        X = torch.rand(20, d, generator=g, dtype=DT)
        Y = torch.sin(5 * X).sum(-1, keepdim=True)
        Xt = torch.rand(300, d, generator=g, dtype=DT)
        model = QSGP(X, Y, num_features=512, exact_max_n=0)
        model.basis.sampling, model.basis._freq_cache = sampling, None
        model.basis.kernel.base_kernel.lengthscale = 0.3
        model.likelihood.noise = 1e-3
        with torch.no_grad():
            model.set_optimal_variational()
            model.invalidate_caches()
            mean, var = model.predict(Xt)
            k, ys = model.basis.kernel, model.train_y
            K = k(X).to_dense() + 1e-3 * torch.eye(20, dtype=DT)
            Ks = k(Xt, X).to_dense()
            ex_mean = (Ks @ torch.linalg.solve(K, ys)) * model.outcome_std + model.outcome_mean
            ex_var = (1 - (Ks * torch.linalg.solve(K, Ks.T).T).sum(-1)) * model.outcome_std**2
        mean_err += float((mean - ex_mean).pow(2).mean().sqrt() / Y.std()) / seeds
        sd_err += float((var.sqrt() - ex_var.clamp_min(0).sqrt()).abs().mean() / Y.std()) / seeds
    return mean_err, sd_err


def test_qsgp_small_n_posterior_against_exact_gp():
    """At BO sizes the default (quasi-Monte Carlo, paired) features give a posterior close to
    the exact GP's, closer than i.i.d. random features at the same m (4-D, n = 20, m = 512)."""
    qmc_mean, qmc_sd = _qsgp_posterior_error("qmc")
    rnd_mean, rnd_sd = _qsgp_posterior_error("random")
    assert qmc_mean < 0.1 and qmc_sd < 0.02
    assert qmc_mean < 0.7 * rnd_mean and qmc_sd < rnd_sd


def test_refit_from_current_continues_from_the_current_values(monkeypatch):
    """``refit_from="current"``: every refit is a warm fit of at most ``fit_max_iter``
    iterations from the current hyperparameters, on every surrogate -- no rebuild from the
    defaults (the exact GP; t-SVGP while it is the exact GP on its data), no comparison with a
    fit from the defaults (t-SVGP with fewer inducing inputs than points). Each refit equals
    the same model fitted by hand for one iteration; under ``"auto"`` the same calls rebuild."""
    import copy

    from botorch.test_functions import Levy

    levy = Levy(dim=3)
    g = torch.Generator().manual_seed(2)
    X = torch.rand(30, 3, generator=g, dtype=DT)
    fx = levy(levy.bounds[0] + (levy.bounds[1] - levy.bounds[0]) * X)
    Y = -(fx + torch.randn(30, generator=g, dtype=DT)).unsqueeze(-1)
    cases = {
        "exact": OnlineExactGP(X, Y),
        "tsvgp": TSVGP(X, Y),  # every point an inducing input: the exact GP on its data
        "tsvgp, m = 8": TSVGP(X, Y, inducing_points=8),
    }
    for case, model in cases.items():
        model.covar_module.lengthscale = torch.tensor([0.05, 0.3, 5.0], dtype=DT)
        by_hand = copy.deepcopy(model).fit(max_iter=1)
        for refit_from, kept in (("current", True), ("auto", False)):
            loop = BayesOptLoop(
                synthetic_problem("hartmann3"),
                model=case.split(",")[0],
                model_options={"inducing_points": 8} if "m = 8" in case else None,
                acq="logei",
                seed=0,
                refit_from=refit_from,
            )
            loop._training_data = lambda: (X, Y)
            loop.model, loop.step_count = copy.deepcopy(model), 5
            start = loop.model
            loop._fit(1)
            if kept:
                assert loop.model is start, case
                assert torch.allclose(
                    loop.model.covar_module.lengthscale,
                    by_hand.covar_module.lengthscale,
                    rtol=1e-10,
                ), case
            elif case != "tsvgp, m = 8":  # (there "auto" keeps whichever fits better)
                assert loop.model is not start, case
        # the one iteration moved the hyperparameters (the test compares something)
        assert not torch.allclose(
            by_hand.covar_module.lengthscale, model.covar_module.lengthscale
        ), case

    # t-SVGP with fewer inducing inputs than points: "auto" tries a fit from the defaults at
    # this n, "current" never does
    calls = []
    monkeypatch.setattr(BayesOptLoop, "_restart_from_defaults", lambda self, data: calls.append(1))
    for refit_from, expected in (("current", []), ("auto", [1])):
        calls.clear()
        loop = BayesOptLoop(
            synthetic_problem("hartmann3"),
            model="tsvgp",
            model_options={"inducing_points": 8},
            acq="logei",
            seed=0,
            refit_from=refit_from,
        )
        loop._training_data = lambda: (X, Y)
        loop.model, loop.step_count = copy.deepcopy(cases["tsvgp, m = 8"]), 5
        loop._fit(1)
        assert calls == expected, refit_from


def test_refit_from_current_fits_wiskis_projection_from_the_current_map(monkeypatch):
    """Above 6 inputs WISKI learns a projection. Under ``"auto"`` a refit re-derives it from the
    data (an exact GP fitted on up to 400 points: seconds, whatever ``fit_max_iter``); under
    ``"current"`` it continues the joint fit of map and kernel from the current map (the WISKI
    paper's online step), equal to ``fit_projection(..., joint=True)`` by hand."""
    import copy

    from bo_online.models.wiski import WISKI
    from bo_online.models.wiski.projection import TanhProjection

    g = torch.Generator().manual_seed(0)
    X = torch.rand(60, 8, generator=g, dtype=DT)
    Y = (torch.sin(4 * X[:, :2]).sum(-1) + X[:, 2:].sum(-1)).unsqueeze(-1)
    loop = BayesOptLoop(
        synthetic_problem("levy", dim=8),
        model="wiski",
        acq="logei",
        seed=0,
        refit_every=1,
        fit_max_iter=1,
        refit_from="current",
    )
    loop._training_data = lambda: (X, Y)
    loop.model = WISKI(X, Y, **{**WISKI.loop_default_options(8), "exact_max_n": 0})
    loop._fit(20)  # the initial fit: the map from the data, then the kernel
    assert loop._refits_projection()
    by_hand = copy.deepcopy(loop.model)
    by_hand.fit_projection(X, Y, max_iter=1, method="lbfgs", joint=True)

    def no_rederivation(*args, **kwargs):
        raise AssertionError("the map was re-derived from the data")

    monkeypatch.setattr(TanhProjection, "init_from_data", no_rederivation)
    loop.step_count = 5
    before = loop.model.projection.linear.weight.detach().clone()
    loop._fit(1)
    after = loop.model.projection.linear.weight.detach()
    assert not torch.allclose(after, before)  # the step moved the map
    assert torch.allclose(after, by_hand.projection.linear.weight, rtol=1e-10, atol=1e-12)
    Xt = torch.rand(7, 8, generator=g, dtype=DT)
    assert torch.allclose(
        loop.model.posterior(Xt).mean, by_hand.posterior(Xt).mean, rtol=1e-9, atol=1e-12
    )

    loop.config["refit_from"] = "auto"
    with pytest.raises(AssertionError, match="re-derived"):
        loop._fit(1)
