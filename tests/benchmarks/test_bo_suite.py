r"""The BO suite script end to end at a tiny size, the loop's "auto" refit schedule, starting
from user data, user objectives on the CLI, and option checks before any evaluation."""

from __future__ import annotations

import hashlib
import json
import runpy
import sys
from pathlib import Path

import pytest
import torch
from script_modules import load_benchmark
from torch.quasirandom import SobolEngine

from bo_online.loops import BayesOptLoop, load_loop
from bo_online.problems import CallableProblem, from_unit, synthetic_problem


def _bench():
    return load_benchmark("bench_bo_suite")


def test_suite_script_end_to_end_small(tmp_path, capsys):
    bench = _bench()
    argv = [
        "--functions",
        "branin",
        "--methods",
        "sobol,botorch,exact",
        "--seeds",
        "2",
        "--steps",
        "2",
        "--q",
        "1",
        "--out",
        str(tmp_path),
    ]
    summary = bench.main(argv)
    out = capsys.readouterr().out
    # the Sobol method's regret, recomputed by hand: the loop's scrambled Sobol sequence
    p = synthetic_problem("branin")
    for seed in (0, 1):
        X = from_unit(
            SobolEngine(2, scramble=True, seed=seed).draw(5 + 2, dtype=torch.float64), p.bounds
        )
        best = p.evaluate_true(X).cummin(0).values - 0.39788735772973816
        saved = json.loads((tmp_path / "q1" / "branin" / f"sobol_seed{seed}.json").read_text())
        assert saved["regret"] == pytest.approx(best.tolist(), abs=1e-12)
        # every method starts from the same design: identical regret over the first 5 points
        for m in ("botorch", "exact"):
            r = json.loads((tmp_path / "q1" / "branin" / f"{m}_seed{seed}.json").read_text())
            assert r["regret"][:5] == pytest.approx(saved["regret"][:5])
            assert len(r["regret"]) == 7 and len(r["time_per_step"]) == 2
            assert all(x >= 0 for x in r["regret"])
    table = summary["table"]["branin"]
    finals = [
        json.loads((tmp_path / "q1" / "branin" / f"exact_seed{s}.json").read_text())["final_regret"]
        for s in (0, 1)
    ]
    assert table["exact"]["mean"] == pytest.approx(sum(finals) / 2)
    assert table["exact"]["time_ratio_median"] > 0
    assert any(c["target"].startswith("exact not worse than botorch") for c in summary["checks"])
    assert ("PASS" in out or "FAIL" in out) and (tmp_path / "regret_q1_branin.png").is_file()
    # resumable: a second call reruns nothing (files untouched) and merges the same table
    stamp = (tmp_path / "q1" / "branin" / "exact_seed0.json").stat().st_mtime_ns
    again = bench.main(argv + ["--no-plot"])
    assert (tmp_path / "q1" / "branin" / "exact_seed0.json").stat().st_mtime_ns == stamp
    assert again["table"]["branin"]["exact"]["mean"] == table["exact"]["mean"]


@pytest.mark.parametrize("function, q", [("branin", 1), ("branin", 3), ("levy3", 1)])
def test_exact_loop_follows_the_botorch_reference_under_common_random_numbers(function, q):
    """The exact GP loop at its defaults is BoTorch's procedure (SingleTaskGP refit from its
    defaults every step, the same acquisition and optimize_acqf settings): with the reference's
    restarts and MC samples drawn from the loop's streams, both propose the same points, so the
    regret curves agree (LogEI and qUCB on Branin, qLogNEI on the noisy Levy). Over longer runs
    round-off differences between the two fits can move a multimodal acquisition's optimum
    (qLogNEI, q = 3, on Levy: the third step differs)."""
    bench = _bench()
    problem = bench.make_problem(function)
    reference, _ = bench.run_botorch(problem, 0, 3, q)
    ours, _, _ = bench.run_loop(problem, "exact", 0, 3, q)
    assert len(ours) == len(reference) == bench.n_init_of(problem) + 3 * q
    assert ours == pytest.approx(reference, rel=1e-4, abs=1e-6)


def test_functions_beyond_the_seven_run_only_when_named(tmp_path):
    """ackley10 / levy10 / rosenbrock8 are problems of that many inputs, run by name (one Sobol
    step here, to the same regret bookkeeping as the seven), and never by default."""
    bench = _bench()
    assert [bench.make_problem(f).dim for f in ("ackley10", "levy10", "rosenbrock8")] == [10, 10, 8]
    assert not set(bench.EXTRA_FUNCTIONS) & set(bench.FUNCTIONS)
    argv = ["--functions", "ackley10", "--methods", "sobol", "--seeds", "1", "--steps", "1"]
    result = bench.main(argv + ["--out", str(tmp_path), "--no-plot"])
    assert list(result["table"]) == ["ackley10"]
    record = json.loads((tmp_path / "q1" / "ackley10" / "sobol_seed0.json").read_text())
    assert len(record["regret"]) == bench.n_init_of(bench.make_problem("ackley10")) + 1
    with pytest.raises(SystemExit, match="ackley10"):
        bench.main(["--functions", "ackley12", "--out", str(tmp_path)])


def test_merge_from_an_earlier_run_keeps_each_time_ratio_in_its_own_process(tmp_path):
    """A rerun of one method (with its own BoTorch reference) in ``new`` merged with an earlier
    run's other methods in ``old``: each result comes from the first folder that has it, each
    time ratio divides by the reference run of the result's own process."""
    bench = _bench()

    def write(folder, method, seed, final, time_per_step, process):
        path = bench.result_path(folder, "branin", 1, method, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            json.dumps(
                {
                    "method": method,
                    "seed": seed,
                    "regret": [final],
                    "final_regret": final,
                    "mean_time_per_step": time_per_step,
                    "process": process,
                }
            )
        )

    old, new = tmp_path / "old", tmp_path / "new"
    for seed in (0, 1):
        write(old, "botorch", seed, 1.0 + seed, 2.0, f"old{seed}")
        write(old, "exact", seed, 9.0, 2.0, f"old{seed}")  # replaced by the rerun
        write(old, "tsvgp", seed, 0.5 + seed, 3.0, f"old{seed}")
        write(new, "botorch", seed, 1.0 + seed, 4.0, f"new{seed}")
        write(new, "exact", seed, 0.25 * (1 + seed), 2.0, f"new{seed}")
    argv = ["--functions", "branin", "--methods", "botorch,exact,tsvgp", "--seeds", "2"]
    summary = bench.main([*argv, "--q", "1", "--out", str(new), "--merge", "--no-plot"])
    without = summary["table"]["branin"]
    assert "tsvgp" not in without and without["exact"]["mean"] == pytest.approx(0.375)
    more = ["--merge-from", str(old)]
    table = bench.main([*argv, "--q", "1", "--out", str(new), "--merge", "--no-plot", *more])
    table = table["table"]["branin"]
    assert table["exact"]["mean"] == pytest.approx(0.375)  # the rerun's, not the old 9.0
    assert table["exact"]["time_ratio_median"] == pytest.approx(0.5)  # 2.0 / its own 4.0
    assert table["tsvgp"]["mean"] == pytest.approx(1.0)
    assert table["tsvgp"]["time_ratio_median"] == pytest.approx(1.5)  # 3.0 / the old 2.0
    assert json.loads((new / "summary_q1.json").read_text())["table"]["branin"]["tsvgp"]


def _branin_loop(**kw):
    return BayesOptLoop(
        synthetic_problem("branin"),
        acq="logei",
        seed=0,
        fit_max_iter=5,
        init_fit_max_iter=10,
        optimizer_options={"num_restarts": 2, "raw_samples": 32, "maxiter": 20},
        **kw,
    )


def test_auto_refit_schedule():
    # exact GP (fit cost grows with n): every step while n <= AUTO_REFIT_SMALL_N, then when n
    # has grown by AUTO_REFIT_GROWTH since the last fit
    loop = _branin_loop(model="exact")
    assert loop.config["refit_every"] == "auto"
    loop.AUTO_REFIT_SMALL_N, loop.AUTO_REFIT_GROWTH = 6, 0.5
    records = loop.run(8)
    expected, last = [], 5
    for n in range(6, 14):
        due = n <= 6 or n >= 1.5 * last
        last = n if due else last
        expected.append(due)
    assert [r["refit"] for r in records[1:]] == expected
    assert all((r["time_fit"] > 0) == r["refit"] for r in records[1:])
    # a surrogate whose refit costs the same at every n (QSGP) refits every step
    loop = _branin_loop(model="qsgp")
    loop.AUTO_REFIT_SMALL_N, loop.AUTO_REFIT_GROWTH = 6, 0.5
    assert all(r["refit"] for r in loop.run(8)[1:])
    # t-SVGP and the decoupled SVGP: a warm-started refit sums their bound over every point
    # held, so their refits thin out on the exact GP's spacing
    for model in ("tsvgp", "decoupled"):
        loop = _branin_loop(model=model)
        loop.AUTO_REFIT_SMALL_N, loop.AUTO_REFIT_GROWTH = 6, 0.5
        records = loop.run(8)
        assert [r["refit"] for r in records[1:]] == expected, model
        assert all((r["time_fit"] > 0) == r["refit"] for r in records[1:]), model
    # an explicit refit_every still overrides
    assert [r["refit"] for r in _branin_loop(model="exact", refit_every=2).run(4)[1:]] == [
        False,
        True,
        False,
        True,
    ]
    with pytest.raises(ValueError, match="refit_every"):
        _branin_loop(model="exact", refit_every="sometimes")
    # fit_max_iter = 0: no refit happens, so none is recorded (nor timed) under any schedule
    for every in ("auto", 1):
        records = BayesOptLoop(
            synthetic_problem("branin"),
            acq="logei",
            seed=0,
            fit_max_iter=0,
            refit_every=every,
            optimizer_options={"num_restarts": 2, "raw_samples": 32, "maxiter": 20},
        ).run(2)
        assert [r["refit"] for r in records[1:]] == [False, False], every
        assert all(r["time_fit"] == 0 for r in records[1:]), every


def test_initial_data_and_ask_tell_without_objective(tmp_path):
    f = lambda X: ((X - 0.3) ** 2).sum(-1)  # noqa: E731
    X0 = torch.rand(6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    loop = BayesOptLoop(
        CallableProblem(None, [[0, 0], [1, 1]]),
        initial_data=(X0, f(X0)),
        n_init=0,
        model="exact",
        acq="logei",
        seed=0,
        optimizer_options={"num_restarts": 2, "raw_samples": 32},
    )
    for _ in range(2):
        X = loop.ask()
        loop.tell(X, f(X))  # the loop never calls an objective itself
    assert loop.X.shape == (8, 2) and torch.equal(loop.X[:6], X0)
    assert loop.records[-1]["best_value"] == pytest.approx(float(f(loop.X).min()))
    with pytest.raises(ValueError, match="no objective"):
        BayesOptLoop(CallableProblem(None, [[0], [1]]), model="exact").run(1)
    with pytest.raises(ValueError, match="initial_data"):
        BayesOptLoop(CallableProblem(None, [[0], [1]]), n_init=0)
    # user data + Sobol points, stored and resumed
    p = synthetic_problem("branin")
    Xu = torch.tensor([[0.0, 5.0], [5.0, 5.0]], dtype=torch.float64)
    loop = _branin_loop(
        model="exact", initial_data=(Xu, p.evaluate_true(Xu)), n_init=3, out_dir=tmp_path / "run"
    )
    loop.run(2)
    assert loop.records[0]["n"] == 5 and torch.equal(loop.X[:2], Xu)
    resumed = load_loop(tmp_path / "run")
    resumed.run(3)
    full = _branin_loop(model="exact", initial_data=(Xu, p.evaluate_true(Xu)), n_init=3)
    full.run(3)
    assert torch.allclose(resumed.X, full.X)


def test_object_options_with_out_dir_fail_before_any_evaluation(tmp_path):
    from bo_online.models.wiski.projection import TanhProjection

    calls = []
    problem = CallableProblem(lambda X: calls.append(1) or X.sum(-1), [[0] * 4, [1] * 4])
    # A live object cannot be stored in the run's config (nor rebuilt from it safely): it is
    # refused when the loop is constructed, before any evaluation or file.
    with pytest.raises(ValueError, match="not allowed"):
        BayesOptLoop(
            problem,
            model="wiski",
            out_dir=tmp_path / "run",
            model_options={"projection": TanhProjection(4, out_dim=2)},
        )
    assert not calls and not (tmp_path / "run").exists()


def test_cli_user_objective_and_resume(tmp_path, capsys):
    from bo_online.cli import main

    (tmp_path / "obj.py").write_text("def f(X):\n    return -((X - 0.25) ** 2).sum(-1)\n")
    spec = f"{tmp_path / 'obj.py'}:f"
    run = tmp_path / "run"
    main(
        [
            "bo",
            "--objective",
            spec,
            "--bounds",
            "0,1 -1,1",
            "--maximize",
            "--steps",
            "2",
            "--out",
            str(run),
            "-Q",
            "--no-plots",
            "--num-restarts",
            "2",
            "--raw-samples",
            "32",
        ]
    )
    config = json.loads((run / "config.json").read_text())
    assert config["objective"] == {
        "objective": spec,
        "bounds": [[0.0, 1.0], [-1.0, 1.0]],
        "maximize": True,
        "noise_std": 0.0,
        "objective_sha256": hashlib.sha256((tmp_path / "obj.py").read_bytes()).hexdigest(),
    }
    for argv, message in (
        (["resume", str(run), "-Q", "--no-plots"], "pass --objective"),
        (["resume", str(run), "--objective", "os.path:join", "-Q", "--no-plots"], "differs"),
        (["bo", "--objective", spec, "-Q"], "needs --bounds"),
        (["bo", "--objective", spec, "--bounds", "1,0", "-Q"], "lo < hi"),
        (["bo", "--problem", "branin", "--objective", spec, "-Q"], "exactly one"),
    ):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and message in capsys.readouterr().err
    main(["resume", str(run), "--steps", "3", "--objective", spec, "-Q", "--no-plots"])
    lines = (run / "records.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])
    assert last["step"] == 3 and last["best_value"] <= 0


def test_exact_refit_reaches_botorchs_fit_from_a_poor_warm_start():
    # independent reference: BoTorch's SingleTaskGP fit from its defaults on the same data
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import SingleTaskGP
    from botorch.models.transforms.outcome import Standardize
    from gpytorch.mlls import ExactMarginalLogLikelihood

    from bo_online.problems import to_unit

    p = synthetic_problem("styblinskitang", dim=4)
    # a modest warm-started refit budget (2 iterations) cannot leave a poor basin; the fit from
    # the defaults gets the initial fit's budget
    loop = BayesOptLoop(
        p,
        model="exact",
        acq="logei",
        seed=0,
        n_init=16,
        fit_max_iter=2,
        init_fit_max_iter=200,
        optimizer_options={"num_restarts": 2, "raw_samples": 32, "maxiter": 20},
    )
    loop.run(1)
    # a poor basin: lengthscales so short that the kernel is flat (no gradient to climb out)
    loop.model.covar_module.initialize(lengthscale=torch.full((1, 4), 0.005, dtype=torch.float64))
    loop.model.likelihood.initialize(noise=torch.tensor([0.006], dtype=torch.float64))
    loop._fit(loop.config["fit_max_iter"])
    U, Y = to_unit(loop.X, p.bounds), -loop.y.reshape(-1, 1)
    ref = SingleTaskGP(U, Y, outcome_transform=Standardize(m=1))
    mll = ExactMarginalLogLikelihood(ref.likelihood, ref)
    fit_gpytorch_mll(mll)
    ref.train()
    with torch.no_grad():
        ref_value = float(mll(ref(*ref.train_inputs), ref.train_targets))
        ref.covar_module.initialize(
            lengthscale=loop.model.covar_module.lengthscale.detach().clone()
        )
        ref.likelihood.initialize(noise=loop.model.likelihood.noise.detach().clone())
        ours = float(mll(ref(*ref.train_inputs), ref.train_targets))
    assert ours >= ref_value - 1e-3, (ours, ref_value)


def test_cli_names_every_problem_and_rejects_bad_dims(capsys):
    from bo_online.cli import main
    from bo_online.cli.options import _PROBLEM_HELP
    from bo_online.problems import SYNTHETIC_PROBLEMS

    assert all(name in _PROBLEM_HELP for name in SYNTHETIC_PROBLEMS)
    with pytest.raises(SystemExit) as e:
        main(["bo", "--problem", "powell", "--dim", "5", "-Q"])
    assert e.value.code == 2 and "multiple of 4" in capsys.readouterr().err


def test_suite_jobs_on_a_dask_cluster_equal_the_in_process_run(tmp_path):
    """``--dask local:2`` runs each (function, seed) as a task on a LocalCluster; the results
    equal those of the in-process run (same seeds, one thread)."""
    bench = _bench()
    common = [
        "--functions",
        "branin",
        "--methods",
        "sobol,exact",
        "--seeds",
        "2",
        "--steps",
        "2",
        "--no-plot",
    ]
    bench.main([*common, "--out", str(tmp_path / "local")])
    bench.main([*common, "--out", str(tmp_path / "dask"), "--dask", "local:2"])
    for seed in (0, 1):
        for method in ("sobol", "exact"):
            a, b = (
                json.loads(
                    (tmp_path / where / "q1" / "branin" / f"{method}_seed{seed}.json").read_text()
                )
                for where in ("local", "dask")
            )
            assert a["regret"] == pytest.approx(b["regret"], rel=1e-9, abs=1e-12)


def test_suite_tasks_on_a_dask_cluster_get_an_absolute_out(tmp_path, monkeypatch):
    """`--dask` with a relative --out (the default, benchmarks/results/bo_suite) sent it to the
    tasks as given: a worker started in another folder (dask worker on a shared file system)
    wrote every result under its own folder, and the merge in the driver found none."""
    import contextlib

    import bo_online.sweep as sweep

    bench = _bench()
    sent = []
    client = type("Client", (), {"upload_file": lambda self, path: None})()
    monkeypatch.setattr(sweep, "dask_client", lambda address: contextlib.nullcontext(client))
    monkeypatch.setattr(sweep, "map_on_cluster", lambda c, f, jobs, on_result: sent.extend(jobs))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()  # the merge that follows writes its summary there
    argv = ["--functions", "branin", "--methods", "sobol", "--seeds", "2", "--steps", "1"]
    bench.main([*argv, "--out", "results", "--dask", "local:2", "--no-plot"])
    assert [job[0] for job in sent] == [tmp_path / "results"] * 2


def _write_result(bench, folder, function, method, seed, final=None, error=None, **extra):
    path = bench.result_path(folder, function, 1, method, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"method": method, "seed": seed, "steps": 30, "q": 1}
    if error:
        record["error"] = error
    else:
        record |= {"regret": [final], "final_regret": final, "mean_time_per_step": 1.0}
        record |= {"process": f"p{seed}", **extra}
    path.write_text(json.dumps(record))


def test_a_method_failing_on_some_seeds_fails_its_targets(tmp_path):
    """exact failed on every seed (its 'not worse than botorch' check was skipped), t-SVGP on
    two of four (judged on the other two, it passed all three checks); wiski was not run (it
    passed 'within 1.5x on >= 0 of 0 functions')."""
    bench = _bench()
    for s in range(4):
        _write_result(bench, tmp_path, "branin", "sobol", s, 10.0 + s)
        _write_result(bench, tmp_path, "branin", "botorch", s, 1.0 + 0.1 * s)
        _write_result(bench, tmp_path, "branin", "exact", s, error="RuntimeError: boom")
        if s < 2:
            _write_result(bench, tmp_path, "branin", "tsvgp", s, 1.0 + 0.1 * s)
        else:
            _write_result(bench, tmp_path, "branin", "tsvgp", s, error="RuntimeError: boom")
    argv = ["--functions", "branin", "--methods", "sobol,botorch,exact,tsvgp,wiski"]
    summary = bench.main([*argv, "--seeds", "4", "--out", str(tmp_path), "--merge", "--no-plot"])
    checks = {c["target"]: c["pass"] for c in summary["checks"]}
    assert checks == {
        "exact not worse than botorch by > 2 SE on branin": False,
        "tsvgp not worse than botorch by > 2 SE on branin": False,
        "exact beats sobol by > 2 SE on branin": False,
        "tsvgp beats sobol by > 2 SE on branin": False,
        "tsvgp within 1.5x of botorch's mean on >= 1 of 1 functions": False,
    }


def test_the_1_5x_target_compares_means_over_the_seeds_both_methods_have(tmp_path, capsys):
    """With a seed missing for one method (no result file), 'within 1.5x of botorch's mean'
    compared wiski's mean over seeds 0-2 with botorch's over 0-3: botorch's bad seed 3
    (regret 10) raised its mean to 3.25 and wiski's 2.0 passed, though on the seeds both ran
    wiski's mean is twice botorch's (2.0 against 1.0)."""
    bench = _bench()
    for s in range(4):
        _write_result(bench, tmp_path, "branin", "botorch", s, 10.0 if s == 3 else 1.0)
        if s < 3:
            _write_result(bench, tmp_path, "branin", "wiski", s, 2.0)
    argv = ["--functions", "branin", "--methods", "botorch,wiski", "--seeds", "4"]
    summary = bench.main([*argv, "--out", str(tmp_path), "--merge", "--no-plot"])
    assert "missing, no result file: branin wiski seed 3" in capsys.readouterr().out
    checks = {c["target"]: (c["pass"], c["detail"]) for c in summary["checks"]}
    assert checks == {
        "wiski within 1.5x of botorch's mean on >= 1 of 1 functions": (False, "within on 0: -")
    }
    # with seed 3 there, the means over all four seeds are compared: 2.0 against 3.25
    _write_result(bench, tmp_path, "branin", "wiski", 3, 2.0)
    summary = bench.main([*argv, "--out", str(tmp_path), "--merge", "--no-plot"])
    assert [c["pass"] for c in summary["checks"]] == [True]


def test_merge_of_a_folder_that_does_not_exist_is_one_line(tmp_path, capsys):
    """`--merge --out TYPO` printed a table of nothing, every result "missing", then a
    FileNotFoundError traceback writing TYPO/summary_q1.json; a --merge-from folder that does
    not exist was passed over without a word."""
    bench = _bench()
    _write_result(bench, tmp_path / "runs", "branin", "sobol", 0, 1.0)
    argv = ["--functions", "branin", "--methods", "sobol", "--seeds", "1", "--merge"]
    for where in (["--out", str(tmp_path / "typo")], ["--merge-from", str(tmp_path / "typo")]):
        with pytest.raises(SystemExit) as e:
            bench.main([*argv, "--out", str(tmp_path / "runs"), *where, "--no-plot"])
        assert str(e.value) == (
            f"bench_bo_suite: error: no results folder {str(tmp_path / 'typo')!r}; give the "
            "--out (and --merge-from) of the runs to merge."
        )
    assert not (tmp_path / "typo").exists()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["q1"]
    summary = bench.main([*argv, "--out", str(tmp_path / "runs"), "--no-plot"])
    assert summary["table"]["branin"]["sobol"]["finals"] == {0: 1.0}


def test_merge_reads_a_longer_run_at_the_steps_merged(tmp_path):
    """A rerun with fewer steps keeps the longer runs already there (run_job skips them): the
    merge read their final regret after more steps than the others' and the plot of curves of
    two lengths failed (ValueError: expected sequence of length 8 at dim 1 (got 7))."""
    bench = _bench()
    argv = ["--functions", "branin", "--methods", "sobol", "--q", "1", "--out", str(tmp_path)]
    bench.main([*argv, "--seeds", "1", "--steps", "3", "--no-plot"])
    summary = bench.main([*argv, "--seeds", "2", "--steps", "2"])
    p = synthetic_problem("branin")
    finals = []
    for seed in (0, 1):
        U = SobolEngine(2, scramble=True, seed=seed).draw(5 + 2, dtype=torch.float64)
        finals.append(p.regret(float(p.evaluate_true(from_unit(U, p.bounds)).min())))
    assert summary["table"]["branin"]["sobol"]["finals"] == pytest.approx(dict(enumerate(finals)))
    assert (tmp_path / "regret_q1_branin.png").is_file()


def test_merge_leaves_out_a_run_shorter_than_the_steps_merged(tmp_path, capsys):
    """A run shorter than --steps (an earlier run's, where a longer rerun was stopped or merged
    from --merge-from) was read as finished: its final regret after fewer steps than the
    others', and the regret plot failed on curves of two lengths."""
    bench = _bench()
    bench.run_job(tmp_path, "branin", "sobol", 0, 2, 1, "p0")
    bench.run_job(tmp_path, "branin", "sobol", 1, 3, 1, "p1")
    argv = ["--functions", "branin", "--methods", "sobol", "--q", "1", "--out", str(tmp_path)]
    summary = bench.main([*argv, "--seeds", "2", "--steps", "3", "--merge"])
    assert summary["table"]["branin"]["sobol"]["seeds"] == 1
    assert set(summary["table"]["branin"]["sobol"]["finals"]) == {1}
    assert "shorter than --steps 3: branin sobol seed 0 (2 steps)" in capsys.readouterr().out
    assert (tmp_path / "regret_q1_branin.png").is_file()


def test_merge_without_steps_reads_the_runs_at_their_own_length_and_lists_missing_seeds(
    tmp_path, capsys
):
    """A merge without --steps read every result at the default 30 steps: a 3-step suite was
    left out whole as 'shorter than --steps 30', and a seed with no result file at all was not
    mentioned (the table silently averaged fewer seeds)."""
    bench = _bench()
    for seed in (0, 1):
        bench.run_job(tmp_path, "branin", "sobol", seed, 3, 1, f"p{seed}")
    bench.run_job(tmp_path, "branin", "sobol", 2, 2, 1, "p2")  # the odd one out
    argv = ["--functions", "branin", "--methods", "sobol", "--q", "1", "--out", str(tmp_path)]
    summary = bench.main([*argv, "--seeds", "4", "--merge", "--no-plot"])
    out = capsys.readouterr().out
    assert "merging at 3 steps" in out
    assert set(summary["table"]["branin"]["sobol"]["finals"]) == {0, 1}
    assert "shorter than --steps 3: branin sobol seed 2 (2 steps)" in out
    assert summary["missing"] == ["branin sobol seed 3"]
    assert "missing, no result file: branin sobol seed 3" in out
    p = synthetic_problem("branin")
    U = SobolEngine(2, scramble=True, seed=1).draw(5 + 3, dtype=torch.float64)
    final = p.regret(float(p.evaluate_true(from_unit(U, p.bounds)).min()))
    assert summary["table"]["branin"]["sobol"]["finals"][1] == pytest.approx(final)


def test_merge_summary_is_strict_json_where_a_standard_error_does_not_exist(tmp_path):
    """One seed has no standard error (NaN): summary_q1.json held a bare NaN, which strict
    JSON readers (JavaScript, jq) refuse. It is null there, the other numbers unchanged."""
    bench = _bench()
    for method, final in (("botorch", 1.0), ("exact", 0.5)):
        path = bench.result_path(tmp_path, "branin", 1, method, 0)
        path.parent.mkdir(parents=True, exist_ok=True)
        result = {"method": method, "seed": 0, "regret": [final], "final_regret": final}
        path.write_text(json.dumps({**result, "mean_time_per_step": 1.0, "process": "p0"}))
    argv = ["--functions", "branin", "--methods", "botorch,exact", "--seeds", "1", "--q", "1"]
    bench.main([*argv, "--out", str(tmp_path), "--merge", "--no-plot"])

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    saved = json.loads((tmp_path / "summary_q1.json").read_text(), parse_constant=refuse)
    exact = saved["table"]["branin"]["exact"]
    assert exact["mean"] == pytest.approx(0.5) and exact["se"] is None


def test_the_script_exits_with_status_1_when_a_target_check_fails(tmp_path, monkeypatch, capsys):
    """docs/results.md: a script exits with status 1 when its check fails; the suite's --merge
    printed FAIL and exited with 0. A check that cannot be judged (N/A) is no failure."""
    bench = _bench()

    def status(seeds: int) -> int:
        argv = ["bench_bo_suite.py", "--functions", "branin", "--methods", "botorch,exact"]
        argv += ["--seeds", str(seeds), "--out", str(tmp_path), "--merge", "--no-plot"]
        monkeypatch.setattr(sys, "argv", argv)
        with pytest.raises(SystemExit) as e:
            runpy.run_path(str(Path(bench.__file__)), run_name="__main__")
        return e.value.code

    for s in range(3):  # exact worse than botorch by 1.0 +- 0.1 on every seed: FAIL
        _write_result(bench, tmp_path, "branin", "botorch", s, 1.0 + 0.1 * s)
        _write_result(bench, tmp_path, "branin", "exact", s, 2.0 + 0.2 * s)
    assert status(3) == 1
    assert "FAIL  exact not worse than botorch by > 2 SE on branin" in capsys.readouterr().out
    assert status(1) == 0  # one seed: N/A
    assert "N/A   exact not worse than botorch" in capsys.readouterr().out
    for s in range(3):  # the same values: PASS
        _write_result(bench, tmp_path, "branin", "exact", s, 1.0 + 0.1 * s)
    assert status(3) == 0
    assert "PASS  exact not worse than botorch" in capsys.readouterr().out
