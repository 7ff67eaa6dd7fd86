"""experiments/stream_uci.py end to end at tiny sizes on a synthetic data directory: jobs run,
split over parts, are reused on a second call, and --merge writes plots and the claim summary."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib.figure
import numpy as np
import pytest
from script_modules import load_experiment
from synthetic_uci import write_uci_like

from bo_online import datasets


def _load_experiment():
    return load_experiment("stream_uci")


def _data_dir(root: Path) -> None:
    write_uci_like(root, "skillcraft", n=60, d=4)
    rng = np.random.default_rng(0)
    (root / "banana").mkdir()
    for split, m in (("train", 40), ("test", 30)):
        Xb = rng.uniform(-2, 2, (m, 2))
        yb = np.where(Xb[:, 0] * Xb[:, 1] > 0, 1, -1)
        np.savetxt(root / f"banana/banana_{split}_x.txt", Xb, delimiter=",")
        np.savetxt(root / f"banana/banana_{split}_y.txt", yb, delimiter=",")


def _main(module, argv, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["stream_uci.py", *argv])
    module.main()


def test_stream_uci_runs_splits_resumes_and_merges(tmp_path, monkeypatch, capsys):
    _data_dir(tmp_path / "data")
    monkeypatch.setitem(datasets.UCI_DATASETS, "skillcraft", (60, 4))  # the synthetic stand-in
    module = _load_experiment()
    out = tmp_path / "out"
    common = [
        "--sets",
        "skillcraft,banana",
        "--models",
        "wiski,exact,tsvgp",
        "--trials",
        "1",
        "--eval-every",
        "5",
        "--m",
        "36",
        "--max-stream",
        "25",
        "--pretrain-iters",
        "2",
        "--hindsight-iters",
        "2",
        "--data-dir",
        str(tmp_path / "data"),
        "--out",
        str(out),
    ]
    _main(module, common + ["--part", "0", "--parts", "2"], monkeypatch)
    first = sorted(p.name for p in out.glob("*.json"))
    _main(module, common + ["--part", "1", "--parts", "2"], monkeypatch)
    files = sorted(p for p in out.glob("*.json"))
    # 3 regression models + 2 classifiers, online and hindsight each
    assert len(files) == 10 and 0 < len(first) < 10
    results = [json.loads(p.read_text()) for p in files]
    assert not [r for r in results if "error" in r], [r["error"] for r in results if "error" in r]
    online = next(
        r
        for r in results
        if r["set"] == "skillcraft" and r["model"] == "tsvgp" and r["kind"] == "online"
    )
    # 25 training rows: pretraining on 5% (2 rows), then one point per step, metrics every 5
    # and at the stream's end (n = 25, off the grid of 5)
    assert online["n_train"] == 25 and online["curve"][0][0] == 2
    assert online["curve"][-1][0] == 25
    stamps = {p.name: p.stat().st_mtime_ns for p in files}
    capsys.readouterr()
    _main(module, common, monkeypatch)  # everything cached: only the merge runs
    assert {
        p.name: p.stat().st_mtime_ns for p in out.glob("*.json") if p.name != "summary.json"
    } == stamps
    text = capsys.readouterr().out
    assert "SVM Guide 1" in text and "the claim that exact overfits less" in text
    summary = json.loads((out / "summary.json").read_text())
    assert (out / "fig3_skillcraft.png").is_file() and (out / "fig4_banana.png").is_file()
    # the printed early-excess numbers are those of the curves, recomputed here
    wiski = [r for r in results if r["set"] == "skillcraft" and r["model"] == "wiski"]
    on = next(r for r in wiski if r["kind"] == "online")["curve"]
    hs = next(r for r in wiski if r["kind"] == "hindsight")["curve"][-1][2]
    early = np.mean([c[2] for c in on[: max(1, len(on) // 4)]])
    assert summary["sets"]["skillcraft"]["models"]["wiski"]["early_excess_nll"] == pytest.approx(
        early - hs
    )


def _result(model, kind, trial, nlls, step=10):
    curve = [[step * (i + 1), 0.5, v] for i, v in enumerate(nlls)]
    return {"set": "elevators", "model": model, "trial": trial, "kind": kind,
            "task": "regression", "metric": "test_rmse", "curve": curve}  # fmt: skip


def _merge_rows(module, out, rows, max_stream=1500):
    """Writes hand-made results under the names a run at this size gives them; merges them."""
    args = argparse.Namespace(out=out, max_stream=max_stream, max_test=1000, m=256)
    for r in rows:
        job = (r["set"], r["model"], r["trial"], r["kind"])
        module._path(out, job, args).write_text(json.dumps(r))
    return module.merge(args)["sets"]["elevators"]["models"]


def test_merge_compares_each_online_trial_with_its_own_hindsight_model(tmp_path):
    """Where a model's online run finished for fewer trials than its hindsight fits, the other
    trials' hindsight models moved its hindsight line and early excess (a mix of trials)."""
    module = _load_experiment()
    result = _result

    rows = [
        result("exact", "online", 0, [1.0, 0.8, 0.6, 0.5]),
        result("exact", "hindsight", 0, [0.4]),
        result("exact", "hindsight", 1, [2.0]),  # its online run never finished
        result("tsvgp", "online", 0, [1.2, 0.9, 0.7, 0.6]),
        result("tsvgp", "online", 1, [1.1, 0.9, 0.7, 0.6]),
        result("tsvgp", "hindsight", 0, [0.5]),
        result("tsvgp", "hindsight", 1, [0.3]),
    ]
    models = _merge_rows(module, tmp_path, rows)
    assert models["exact"]["hindsight_nll"] == pytest.approx(0.4)
    assert models["exact"]["early_excess_nll"] == pytest.approx(1.0 - 0.4)
    # per trial: (1.2 - 0.5) and (1.1 - 0.3), not each against the mean hindsight 0.4
    assert models["tsvgp"]["early_excess_nll"] == pytest.approx(0.75)
    assert models["tsvgp"]["early_excess_nll_se"] == pytest.approx(0.05)


def test_merge_reads_only_the_runs_of_its_size(tmp_path):
    """A small run (--max-stream 600) and a larger one in the same --out: the merge averaged the
    same trial at both sizes as two trials (with one hindsight model for both)."""
    module = _load_experiment()
    _merge_rows(module, tmp_path, [_result("wiski", "online", 0, [2.0] * 8, step=100)], 600)
    rows = [
        _result("wiski", "online", 0, [1.0, 0.8, 0.6, 0.5]),
        _result("wiski", "hindsight", 0, [0.4]),
    ]
    wiski = _merge_rows(module, tmp_path, rows)["wiski"]
    assert wiski["trials"] == 1 and wiski["final_nll"] == pytest.approx(0.5)
    assert wiski["early_excess_nll"] == pytest.approx(1.0 - 0.4)


def test_a_failed_job_runs_again_and_merge_names_it(tmp_path, monkeypatch, capsys):
    """A job that failed (here: no data yet) wrote its error as its result, which every later
    call took for done: never run again, and left out of the merge without a word."""
    module = _load_experiment()
    out = tmp_path / "out"
    argv = ["--sets", "banana", "--models", "tsvgp", "--trials", "1", "--eval-every", "5"]
    argv += ["--m", "9", "--pretrain-iters", "2", "--hindsight-iters", "2", "--out", str(out)]
    _main(module, [*argv, "--data-dir", str(tmp_path / "nothing")], monkeypatch)
    assert "failed: banana tsvgp online trial 0" in capsys.readouterr().out
    _data_dir(tmp_path / "data")
    _main(module, [*argv, "--data-dir", str(tmp_path / "data")], monkeypatch)
    results = [json.loads(p.read_text()) for p in out.glob("banana-*.json")]
    assert len(results) == 2 and all("curve" in r for r in results)
    assert "failed: banana" not in capsys.readouterr().out


def test_a_trial_without_its_hindsight_model_is_left_out_of_the_excess(tmp_path):
    """Trial 1's hindsight fit has not run: its online run was set against trial 0's hindsight
    model (the mean of those there), not its own."""
    module = _load_experiment()
    rows = [
        _result("tsvgp", "online", 0, [1.2, 0.9, 0.7, 0.6]),
        _result("tsvgp", "online", 1, [1.1, 0.9, 0.7, 0.6]),
        _result("tsvgp", "hindsight", 0, [0.5]),
    ]
    tsvgp = _merge_rows(module, tmp_path, rows)["tsvgp"]
    assert tsvgp["early_excess_nll"] == pytest.approx(1.2 - 0.5)
    assert tsvgp["early_excess_trials"] == 1 and tsvgp["trials"] == 2


def test_a_result_made_with_other_settings_is_rerun_and_kept_out_of_the_merge(
    tmp_path, monkeypatch, capsys
):
    """The result files are named by sizes only: a second call with another --eval-every (or
    --pretrain-iters) reused the first call's curves as its own, and a merge mixed curves
    scored every 5 and every 10 points as trials of one curve."""
    _data_dir(tmp_path / "data")
    module = _load_experiment()
    out = tmp_path / "out"
    argv = ["--sets", "banana", "--models", "tsvgp", "--trials", "1", "--m", "9"]
    argv += ["--pretrain-iters", "2", "--hindsight-iters", "2", "--out", str(out)]
    argv += ["--data-dir", str(tmp_path / "data")]
    _main(module, [*argv, "--eval-every", "5"], monkeypatch)
    online = next(out.glob("banana-tsvgp-online-*.json"))
    hindsight = next(out.glob("banana-tsvgp-hindsight-*.json"))
    first_hindsight = hindsight.read_text()
    assert json.loads(online.read_text())["settings"] == {"eval_every": 5, "pretrain_iters": 2}
    capsys.readouterr()
    # merging at other settings leaves the runs out and says with which flags they were made
    _main(module, [*argv, "--eval-every", "10", "--merge"], monkeypatch)
    said = capsys.readouterr().out
    assert "banana tsvgp online trial 0 (eval-every 5, pretrain-iters 2)" in said
    assert json.loads((out / "summary.json").read_text())["sets"]["banana"]["models"] == {}
    # running at them reruns the online job only (the hindsight fit does not depend on it)
    _main(module, [*argv, "--eval-every", "10"], monkeypatch)
    said = capsys.readouterr().out
    assert "rerun, the result there was made with eval-every 5, pretrain-iters 2" in said
    curve = json.loads(online.read_text())["curve"]
    assert [n for n, *_ in curve][:2] == [curve[0][0], curve[0][0] + 10]
    assert hindsight.read_text() == first_hindsight
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temp file left


def test_merge_names_the_jobs_of_a_part_that_has_not_run(tmp_path, capsys):
    """``--parts 2`` puts the online runs in one part and the hindsight fits in the other: a
    merge before the second part ran left the claim out without saying what was missing."""
    module = _load_experiment()
    rows = [
        _result("exact", "online", 0, [1.0, 0.8]),
        _result("exact", "online", 1, [1.0, 0.7]),
        _result("exact", "hindsight", 1, [0.4]),
    ]
    args = argparse.Namespace(out=tmp_path, max_stream=1500, max_test=1000, m=256, trials=3)
    for r in rows:
        module._path(tmp_path, (r["set"], r["model"], r["trial"], r["kind"]), args).write_text(
            json.dumps(r)
        )
    # an exact GP skipped for its size writes a result without job fields: not missing
    skipped = ("elevators", "wiski", 0, "online")
    module._path(tmp_path, skipped, args).write_text(json.dumps({"skipped": "too many rows"}))
    summary = module.merge(args)
    said = capsys.readouterr().out
    expected = [
        ("exact", 0, "hindsight"),
        ("exact", 2, "online"),
        ("exact", 2, "hindsight"),
        ("wiski", 0, "hindsight"),
        ("wiski", 1, "online"),
        ("wiski", 1, "hindsight"),
        ("wiski", 2, "online"),
        ("wiski", 2, "hindsight"),
    ]
    assert summary["missing"] == [
        {"set": "elevators", "model": m, "trial": t, "kind": k} for m, t, k in expected
    ]
    assert "missing, no result file: elevators exact hindsight trial 0; " in said


def test_merge_plot_says_how_many_trials_and_in_what_units(tmp_path, monkeypatch):
    """The legend named the models but not how many trials each mean (and its 2-SE band) is
    over, and the axes did not say the targets are standardised."""
    module = _load_experiment()
    shown = []

    def savefig(fig, *args, **kwargs) -> None:
        legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        shown.append((legend, [ax.get_ylabel() for ax in fig.axes]))

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    rows = [
        _result("tsvgp", "online", 0, [1.2, 0.9]),
        _result("tsvgp", "online", 1, [1.1, 0.9]),
        _result("tsvgp", "hindsight", 0, [0.5]),
        _result("wiski", "online", 0, [1.0, 0.8]),
    ]
    _merge_rows(module, tmp_path, rows)
    ((legend, ylabels),) = shown
    assert legend == ["tsvgp (online, 2 trials)", "tsvgp (hindsight, 1 trial)"] + [
        "wiski (online, 1 trial)"
    ]
    assert ylabels == ["test NLL (standardised targets)", "test RMSE (standardised targets)"]
