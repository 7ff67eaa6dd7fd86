r"""Small benchmark scripts at tiny sizes or at argument parsing: arguments the measure cannot use
are refused with a parser error that states the minimum, and small sizes that still make sense
run."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from script_modules import load_benchmark
from synthetic_uci import write_uci_like

from bo_online.models.tsvgp import TSVGP


def _yacht_data_dir(root: Path) -> Path:
    r"""A synthetic stand-in for ``uci/yacht`` of its real shape (308 rows x 6 inputs)."""
    return write_uci_like(root, "yacht", n=308, d=6)


def _refused(module, argv: list[str], monkeypatch, capsys) -> str:
    r"""Run ``module.main()`` with ``argv``; assert a parser error (exit status 2), return its
    message."""
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as e:
        module.main()
    assert e.value.code == 2
    return capsys.readouterr().err


# bench_checkpoint.py ------------------------------------------------------------------------------


def test_checkpoint_runs_fewer_steps_than_its_warm_up(tmp_path, monkeypatch, capsys):
    # The warm-up ran 50 steps on a problem that holds only --steps of them: below 50 it raised
    # "steps=50 exceeds the 3 steps the data hold".
    monkeypatch.setenv("BO_ONLINE_DATA_DIR", str(_yacht_data_dir(tmp_path / "data")))
    argv = ["bench_checkpoint.py", "--steps", "3", "--repeats", "1", "--dataset", "yacht"]
    monkeypatch.setattr(sys, "argv", argv)
    load_benchmark("bench_checkpoint").main()
    out = capsys.readouterr().out
    assert "3 steps" in out and "ratio every-step / default" in out


def test_checkpoint_refuses_zero_steps(tmp_path, monkeypatch, capsys):
    # Before: a ValueError from the loop (no stream past the 100 initial points), not a parser
    # error.
    monkeypatch.setenv("BO_ONLINE_DATA_DIR", str(_yacht_data_dir(tmp_path / "data")))
    argv = ["bench_checkpoint.py", "--steps", "0", "--dataset", "yacht"]
    err = _refused(load_benchmark("bench_checkpoint"), argv, monkeypatch, capsys)
    assert "--steps must be at least 1" in err


def test_checkpoint_refuses_zero_repeats(tmp_path, monkeypatch, capsys):
    # Before: both schedules ran no run and statistics.median failed on the empty lists.
    monkeypatch.setenv("BO_ONLINE_DATA_DIR", str(_yacht_data_dir(tmp_path / "data")))
    argv = ["bench_checkpoint.py", "--steps", "3", "--repeats", "0", "--dataset", "yacht"]
    err = _refused(load_benchmark("bench_checkpoint"), argv, monkeypatch, capsys)
    assert "--repeats must be at least 1" in err


# bench_stream_suite.py ----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [1000, 2000])
def test_stream_suite_memory_check_refuses_a_stream_not_past_2000(
    stream, tmp_path, monkeypatch, capsys
):
    # Before: a stream of 1,000 never reached the 2,000-point mark (KeyError '2000' after the
    # child's run); one of 2,000 compared the peak RSS at 2,000 with itself (ratio 1, PASS).
    suite = load_benchmark("bench_stream_suite")
    monkeypatch.setattr(suite, "_child", lambda *a: pytest.fail("a stream ran"))
    argv = ["x", "--memory-check", "--memory-stream", str(stream), "--out", str(tmp_path)]
    err = _refused(suite, argv, monkeypatch, capsys)
    assert "--memory-stream must be above 2000" in err and "at least 2001" in err


def test_stream_suite_memory_check_accepts_a_stream_past_2000(tmp_path, monkeypatch, capsys):
    suite = load_benchmark("bench_stream_suite")
    ran = []

    def child(kind, model, name, path, args):
        ran.append((model, args.stream, args.rss_marks))
        return {"model": model, "set": name, "error": "not run in this test"}

    monkeypatch.setattr(suite, "_child", child)
    argv = ["x", "--memory-check", "--memory-stream", "2001", "--memory-models", "tsvgp"]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(tmp_path)])
    suite.main()
    assert ran == [("tsvgp", 2001, [2000, 2001])]


# bench_decoupled_updates.py -----------------------------------------------------------------------

DECOUPLED_TINY = ["--n-init", "20", "--mean-bases", "8", "--cov-bases", "4"]


@pytest.mark.parametrize("n", [0, 150, 199])
def test_decoupled_updates_refuses_fewer_than_200_updates(n, monkeypatch, capsys):
    # Before: below 200 the blocks "updates 1-100" and "the last 100" overlapped (at 100 they
    # were the same block: ratio 1.00, PASS), and --n 0 crashed in statistics.mean.
    bench = load_benchmark("bench_decoupled_updates")
    monkeypatch.setattr(bench, "DecoupledSVGP", lambda *a, **k: pytest.fail("a model was built"))
    err = _refused(bench, ["x", "--n", str(n), *DECOUPLED_TINY], monkeypatch, capsys)
    assert "--n must be at least 200" in err


def test_decoupled_updates_refuses_grow_below_800_updates(monkeypatch, capsys):
    # Before: --grow timed Xs[:800] whatever --n was, so with --n 300 it timed 300 updates and
    # labelled its second block "701-800".
    bench = load_benchmark("bench_decoupled_updates")
    monkeypatch.setattr(bench, "DecoupledSVGP", lambda *a, **k: pytest.fail("a model was built"))
    err = _refused(bench, ["x", "--n", "300", "--grow", *DECOUPLED_TINY], monkeypatch, capsys)
    assert "--n must then be at least 800" in err


def test_decoupled_updates_runs_200_updates(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["x", "--n", "200", *DECOUPLED_TINY])
    load_benchmark("bench_decoupled_updates").main()
    out = capsys.readouterr().out
    assert "updates 1-100:" in out and "updates 101-200:" in out


# bench_qsgp.py ------------------------------------------------------------------------------------

QSGP_COND_ONLY = ["--skip-steps", "--skip-cv", "--reps", "1"]


@pytest.mark.parametrize("ks", [["100"], ["100", "100"]])
def test_qsgp_refuses_fewer_than_two_distinct_cond_ks(ks, tmp_path, monkeypatch, capsys):
    # Before: the check compared k = 100 with itself (ratios 1.00, PASS).
    bench = load_benchmark("bench_qsgp")
    monkeypatch.setattr(bench, "ROOT", tmp_path)  # where the results would be written
    monkeypatch.setattr(bench, "conditioning_times", lambda *a: pytest.fail("the table ran"))
    err = _refused(bench, ["x", *QSGP_COND_ONLY, "--cond-ks", *ks], monkeypatch, capsys)
    assert "--cond-ks needs at least 2 distinct values" in err


def test_qsgp_refuses_a_non_positive_cond_k(tmp_path, monkeypatch, capsys):
    # Before: a negative k failed inside torch.rand with an unrelated message.
    bench = load_benchmark("bench_qsgp")
    monkeypatch.setattr(bench, "ROOT", tmp_path)
    monkeypatch.setattr(bench, "conditioning_times", lambda *a: pytest.fail("the table ran"))
    err = _refused(bench, ["x", *QSGP_COND_ONLY, "--cond-ks", "-5", "100"], monkeypatch, capsys)
    assert "--cond-ks must be positive" in err


def test_qsgp_cond_ks_sorted_and_deduplicated(tmp_path, monkeypatch, capsys):
    # Before: the table ran k = 300, 100, 100 in that order, and the check compared the last
    # (100) with the first (300): a cost that grows with k passed as a ratio below 1.
    bench = load_benchmark("bench_qsgp")
    monkeypatch.setattr(bench, "ROOT", tmp_path)
    seen = []

    def conditioning_times(ks, reps):
        seen.append(list(ks))
        t = lambda k: SimpleNamespace(median=1e-6 * k, min=1e-6 * k, max=1e-6 * k)  # noqa: E731
        return [{"k": k, "update": t(k), "posterior": t(k)} for k in ks]

    monkeypatch.setattr(bench, "conditioning_times", conditioning_times)
    argv = ["x", *QSGP_COND_ONLY, "--cond-ks", "300", "100", "300", "100"]
    monkeypatch.setattr(sys, "argv", argv)
    bench.main()
    assert seen == [[100, 300]]
    out = capsys.readouterr().out
    assert "k = 300 vs 100" in out and "update 3.00x" in out and "all checks FAIL" in out
    written = json.loads((tmp_path / "benchmarks" / "results" / "bench_qsgp.json").read_text())
    assert written["args"]["cond_ks"] == [100, 300]


# bench_tsvgp.py -----------------------------------------------------------------------------------


def test_tsvgp_ns_sorted_and_deduplicated(tmp_path, monkeypatch, capsys):
    # Before: the update table ran n = 60, 40, 60 in that order, with a row per repeat, and the
    # flatness check compared the last row (60) with the first (60).
    bench = load_benchmark("bench_tsvgp")
    monkeypatch.setattr(bench, "fantasy_table", lambda args: [])  # only the update table
    out = tmp_path / "tsvgp.json"
    argv = ["x", "--ns", "60", "40", "60", "--update-m", "4", "--dim", "2", "--reps", "1"]
    monkeypatch.setattr(sys, "argv", [*argv, "--out", str(out)])
    bench.main()
    written = json.loads(out.read_text())
    assert [r["n"] for r in written["update"]] == [40, 60]
    assert written["settings"]["ns"] == [40, 60]


# bench_tsvgp_bound.py -----------------------------------------------------------------------------


def test_tsvgp_bound_script_times_two_equal_bounds(tmp_path, capsys):
    """The script's two-pass reference is the general ELBO path with the exact sites: equal to
    the one-pass Gaussian bound in value and gradient (several row blocks), and the two timed
    fits from one state land on the same model."""
    bench = load_benchmark("bench_tsvgp_bound")
    g = torch.Generator().manual_seed(0)
    X = torch.rand(300, 3, generator=g, dtype=torch.float64)
    Y = torch.sin(4 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(300, 1, generator=g).double()
    model = TSVGP(X, Y, inducing_points=16)
    model.summary_block_elements = 70 * 16
    model.fit(max_iter=3)
    grads = []
    for bound in (
        model.elbo,
        lambda: bench.two_pass_bound(model)(
            model._kuu_chol(), model.train_X, model.train_y, model.train_noise
        ),
    ):
        model.zero_grad()
        value = bound()
        value.backward()
        grads.append((value.item(), [p.grad.clone() for p in model.parameters()]))
    assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-12)
    for a, b in zip(grads[0][1], grads[1][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
    root = _yacht_data_dir(tmp_path)
    argv = [
        "--dataset",
        "yacht",
        "--rows",
        "150",
        "--test-rows",
        "30",
        "--m",
        "12",
        "--iters",
        "4",
        "--reps",
        "1",
    ]
    times = bench.main([*argv, "--data-dir", str(root)])
    assert len(times["one-pass"]) == len(times["two-pass"]) == 1
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ": fit " in ln]
    assert len(lines) == 2 and lines[0].split("test ")[1] == lines[1].split("test ")[1]


# ab_compare.py ------------------------------------------------------------------------------------


class _FakeWorker:
    r"""A worker process of ``ab_compare.py``: "ready", then one JSON line of timings per "go"."""

    def __init__(self, samples: list[dict[str, float]]) -> None:
        lines = ["ready\n", *(json.dumps(s) + "\n" for s in samples)]
        self.stdout = SimpleNamespace(readline=iter(lines).__next__)
        self.stdin = SimpleNamespace(
            write=lambda text: None, flush=lambda: None, close=lambda: None
        )

    def wait(self) -> int:
        return 0


def test_ab_compare_median_of_an_even_number_of_repetitions(monkeypatch, capsys):
    # The median of 4 repetitions is the mean of the middle two (it printed the upper one), and
    # the A / B ratio divides those medians.
    module = load_benchmark("ab_compare")
    times = {"A": [0.004, 0.001, 0.003, 0.002], "B": [0.010, 0.050, 0.020, 0.060]}
    workers = iter(_FakeWorker([{"update": t} for t in times[k]]) for k in ("A", "B"))
    monkeypatch.setattr(module.subprocess, "Popen", lambda *args, **kwargs: next(workers))
    argv = ["ab_compare.py", "--a", "old", "--b", "new", "--task", "update", "--reps", "4"]
    monkeypatch.setattr(sys, "argv", argv)
    module.main()
    out = capsys.readouterr().out
    median = {k: statistics.median(v) for k, v in times.items()}  # 0.0025 and 0.035 s
    for k in ("A", "B"):
        assert f"  {k}         update: median {1e3 * median[k]:10.4g} ms" in out
    assert f"update: A / B = {median['A'] / median['B']:.2f}" in out  # 0.07 (was 0.06)
