"""experiments/bo_long_campaign.py end to end at toy sizes: runs, stops on its time budget,
resumes from the run directories (not restarting), splits over shards and merges."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.figure
import pytest
import torch
from script_modules import load_experiment

from bo_online.loops.history import read_records


@pytest.fixture(scope="module")
def campaign():
    return load_experiment("bo_long_campaign")


TOY = [
    "--functions",
    "levy",
    "--methods",
    "wiski",
    "exact",
    "--seeds",
    "1",
    "--num-restarts",
    "1",
    "--raw-samples",
    "8",
    "--maxiter",
    "3",
    "--fit-max-iter",
    "2",
    "--wiski-grid",
    "6",
    "--no-plots",
]


def test_campaign_runs_stops_on_budget_resumes_and_merges(campaign, tmp_path, capsys):
    out = str(tmp_path / "camp")
    # shard 1/2 of the two runs: only the exact GP, stopped by a tiny budget after its initial
    # design
    campaign.main([*TOY, "--steps", "3", "--budget-s", "1e-9", "--shard", "1/2", "--out", out])
    exact_dir = campaign.run_dir(Path(out), "levy", "exact", 0)
    assert not campaign.run_dir(Path(out), "levy", "wiski", 0).exists()
    first = read_records(exact_dir / "records.jsonl")
    assert [r["step"] for r in first] == [0]
    assert "stopped by the time budget" in capsys.readouterr().out
    # both shards, no budget: the exact run continues from its checkpoint, WISKI starts
    campaign.main([*TOY, "--steps", "3", "--budget-s", "0", "--out", out])
    recs = read_records(exact_dir / "records.jsonl")
    assert [r["step"] for r in recs] == [0, 1, 2, 3]
    assert recs[0]["X"] == first[0]["X"] and recs[0]["wall_time"] == first[0]["wall_time"]
    assert [r["n"] for r in recs] == [5, 8, 11, 14]
    summary = json.loads((Path(out) / "bo_long_campaign.json").read_text())
    f = summary["functions"]["levy"]
    assert f["wiski"]["0"]["steps"] == 3 and f["exact"]["0"]["finished"]
    # the best value is the running minimum of the noiseless values the loop recorded
    best = [min(v for r in recs[: i + 1] for v in r["y_true"]) for i in range(4)]
    assert f["exact"]["0"]["best"] == pytest.approx(best)
    # regret against Levy's optimum (0 at x = 1), for the method and for Sobol
    assert f["exact"]["0"]["regret"] == pytest.approx(best)
    assert f["sobol"]["0"]["regret"] == pytest.approx(f["sobol"]["0"]["best"])
    t = summary["targets"]["levy"]
    assert t["wiski_better_than_sobol"]["pass"] in (True, False)
    assert t["wiski_vs_exact_final"]["pass"] is None  # one seed: no standard error
    assert "Targets (requirement 2)" in capsys.readouterr().out
    # a shorter call after a longer one leaves the runs as they are (a loop refuses to run
    # to fewer steps than it has done)
    stamp = (exact_dir / "records.jsonl").stat().st_mtime_ns
    campaign.main([*TOY, "--steps", "2", "--budget-s", "0", "--out", out])
    assert (exact_dir / "records.jsonl").stat().st_mtime_ns == stamp


def test_the_time_budget_stops_only_methods_whose_step_grows_with_n(campaign, tmp_path, capsys):
    r"""WISKI runs every step whatever the budget (its step is flat in n); the exact GP stops
    at it and the printout says so."""
    out = str(tmp_path / "camp")
    campaign.main([*TOY, "--steps", "2", "--budget-s", "1e-9", "--out", out])
    wiski = read_records(campaign.run_dir(Path(out), "levy", "wiski", 0) / "records.jsonl")
    exact = read_records(campaign.run_dir(Path(out), "levy", "exact", 0) / "records.jsonl")
    assert [r["step"] for r in wiski] == [0, 1, 2]
    assert [r["step"] for r in exact] == [0]
    printed = capsys.readouterr().out.splitlines()
    assert any("OnlineExactGP" in line and "stopped by the time budget" in line for line in printed)
    assert not any("WISKI" in line and "stopped by the time budget" in line for line in printed)


def test_campaign_rejects_bad_shard(campaign, tmp_path):
    with pytest.raises(SystemExit) as e:
        campaign.main([*TOY, "--shard", "2/2", "--out", str(tmp_path)])
    assert e.value.code == 2


def test_campaign_runs_as_tasks_on_a_dask_cluster(campaign, tmp_path):
    """``--dask local:2``: every run is a task on a LocalCluster; the run directories hold the
    same records as an in-process run with the same seeds."""
    args = [*TOY, "--steps", "2", "--budget-s", "0"]
    campaign.main([*args, "--out", str(tmp_path / "local")])
    campaign.main([*args, "--out", str(tmp_path / "dask"), "--dask", "local:2"])
    for method in ("wiski", "exact"):
        a, b = (
            read_records(campaign.run_dir(tmp_path / where, "levy", method, 0) / "records.jsonl")
            for where in ("local", "dask")
        )
        assert [r["step"] for r in b] == [0, 1, 2]
        for ra, rb in zip(a, b):
            assert torch.allclose(
                torch.tensor(ra["X"]), torch.tensor(rb["X"]), rtol=1e-9, atol=1e-12
            )


def test_campaign_tasks_on_a_dask_cluster_get_an_absolute_out(campaign, tmp_path, monkeypatch):
    """`--dask` with a relative --out sent it to the tasks as given: a worker started in another
    folder (dask worker on a shared file system) wrote every run under its own folder, where
    the merge in the driver never looked."""
    import contextlib

    import bo_online.sweep as sweep

    sent = []
    client = type("Client", (), {"upload_file": lambda self, path: None})()
    monkeypatch.setattr(sweep, "dask_client", lambda address: contextlib.nullcontext(client))
    monkeypatch.setattr(sweep, "map_on_cluster", lambda c, f, jobs, on_result: sent.extend(jobs))
    monkeypatch.chdir(tmp_path)
    # one shard of two: it returns without merging
    campaign.main([*TOY, "--out", "runs", "--dask", "local:2", "--shard", "0/2"])
    assert sent and all(Path(job[0].out) == tmp_path / "runs" for job in sent)


def test_summary_regret_is_against_the_functions_optimum(campaign, tmp_path):
    """StyblinskiTang's optimum is -39.166... per input: the Sobol curve's regret is its best
    value minus that optimum (the runs' own regrets come from the loop's records), and the plot
    of such a summary is written."""
    optimum = -39.16616570377142 * 3
    best = [-50.0, -80.0, -110.0]
    recs = [
        {
            "step": i,
            "n": 5 + 3 * i,
            "best_true_value": b,
            "regret": b - optimum,
            "wall_time": float(i),
            "time_fit": 0.1,
            "time_acquisition": 0.2,
            "time_update": 0.01,
        }
        for i, b in enumerate(best)
    ]
    summary = campaign.summarise({"styblinskitang": {"wiski": {0: recs}}}, target_steps=2)
    f = summary["functions"]["styblinskitang"]
    sob = f["sobol"][0]
    assert sob["regret"] == pytest.approx([b - optimum for b in sob["best"]], abs=1e-9)
    assert min(sob["regret"]) > 0
    assert f["wiski"][0]["regret"] == pytest.approx([b - optimum for b in best])
    (path,) = campaign.plot(summary["functions"], tmp_path)
    assert path.name == "styblinskitang.png" and path.stat().st_size > 0


def test_a_run_stopped_by_its_budget_is_checkpointed_where_it_stopped(campaign, tmp_path):
    """The budget stops a run between the loop's periodic checkpoints (every 30 s): its
    checkpoint is written there, so the next call finds the run at its budget and leaves it
    (it resumed from the earlier checkpoint and redid the steps after it, budget and all)."""
    from bo_online.loops.history import load_checkpoint

    out = str(tmp_path / "camp")
    args = [*TOY, "--methods", "exact", "--out", out]
    campaign.main([*args, "--steps", "1", "--budget-s", "0"])
    exact_dir = campaign.run_dir(Path(out), "levy", "exact", 0)
    wall = read_records(exact_dir / "records.jsonl")[-1]["wall_time"]
    # a budget just above the time of the steps done: the next step passes it
    longer = [*args, "--steps", "4", "--budget-s", repr(wall * (1 + 1e-12))]
    campaign.main(longer)
    recs = read_records(exact_dir / "records.jsonl")
    assert [r["step"] for r in recs] == [0, 1, 2]
    ckpt = load_checkpoint(exact_dir / "checkpoint.pt")
    assert ckpt["step_count"] == 2 and ckpt["records"] == recs
    stamp = (exact_dir / "records.jsonl").stat().st_mtime_ns
    campaign.main(longer)
    assert (exact_dir / "records.jsonl").stat().st_mtime_ns == stamp


def test_a_run_is_not_continued_with_other_settings(campaign, tmp_path, capsys):
    """A call whose settings differ from those a run started with is refused before anything
    runs, naming the setting (the run went on with its own settings, while the JSON reported
    the call's)."""
    out = str(tmp_path / "camp")
    args = [*TOY, "--methods", "wiski", "--out", out]
    campaign.main([*args, "--steps", "1"])
    wiski_dir = campaign.run_dir(Path(out), "levy", "wiski", 0)
    before = read_records(wiski_dir / "records.jsonl")
    capsys.readouterr()
    for flag, value, shown in (
        ("--wiski-grid", "7", "'grid_size': 6} -> {'exact_max_n': 0, 'grid_size': 7}"),
        ("--num-restarts", "2", "'num_restarts': 1,"),
    ):
        with pytest.raises(SystemExit) as e:
            campaign.main([*args, "--steps", "2", flag, value])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("bo_long_campaign: error: The run in ") and shown in err
        assert read_records(wiski_dir / "records.jsonl") == before
    campaign.main([*args, "--steps", "2"])  # its own settings: it goes on
    assert [r["step"] for r in read_records(wiski_dir / "records.jsonl")] == [0, 1, 2]


def test_merge_reads_the_runs_at_one_length_and_refuses_mixed_settings(campaign, tmp_path, capsys):
    """``--merge`` alone merges at the longest run's length (it merged at the default 300 steps,
    every run unfinished) and reports the settings the runs were made with (the JSON held the
    merge call's defaults); ``--steps`` reads longer runs at that length; runs of other settings
    under one ``--out`` are refused, naming both."""
    out = str(tmp_path / "camp")
    campaign.main([*TOY, "--steps", "2", "--budget-s", "0", "--out", out])
    campaign.main([*TOY, "--methods", "wiski", "--steps", "3", "--out", out])
    wiski = read_records(campaign.run_dir(Path(out), "levy", "wiski", 0) / "records.jsonl")
    capsys.readouterr()

    campaign.main(["--merge", "--no-plots", "--out", out])
    printed = capsys.readouterr().out
    assert "merging at 3 steps" in printed
    assert "short of 3 steps" in printed and "OnlineExactGP seed 0 (2)" in printed
    summary = json.loads((Path(out) / "bo_long_campaign.json").read_text())
    config = summary["config"]
    assert config["steps"] == 3 and config["methods"] == ["wiski", "exact"]
    assert (config["num_restarts"], config["raw_samples"], config["maxiter"]) == (1, 8, 3)
    assert (config["fit_max_iter"], config["wiski_grid"], config["wiski_exact_max_n"]) == (2, 6, 0)
    f = summary["functions"]["levy"]
    assert f["wiski"]["0"]["finished"] and not f["exact"]["0"]["finished"]

    campaign.main(["--merge", "--no-plots", "--steps", "2", "--out", out])
    f = json.loads((Path(out) / "bo_long_campaign.json").read_text())["functions"]["levy"]
    assert f["wiski"]["0"]["steps"] == 2 and f["exact"]["0"]["finished"]
    best = [min(v for r in wiski[: i + 1] for v in r["y_true"]) for i in range(3)]
    assert f["wiski"]["0"]["best"] == pytest.approx(best)

    capsys.readouterr()
    with pytest.raises(SystemExit) as e:  # runs, then refuses to merge them with the others
        campaign.main(
            [*TOY, "--functions", "ackley", "--methods", "exact", "--steps", "1"]
            + ["--num-restarts", "2", "--budget-s", "0", "--out", out]
        )
    assert "optimizer_options" in str(e.value) and "ackley/exact/seed0" in str(e.value)
    assert "levy/" in str(e.value) and str(e.value).startswith("bo_long_campaign: error:")


def test_a_damaged_run_file_is_one_line(campaign, tmp_path, capsys):
    """A damaged records line stopped the merge, and a truncated checkpoint the run, with a
    traceback; each is one line naming the file and what to do."""
    out = str(tmp_path / "camp")
    args = [*TOY, "--methods", "exact", "--budget-s", "0", "--out", out]
    campaign.main([*args, "--steps", "1"])
    run = campaign.run_dir(Path(out), "levy", "exact", 0)
    records = (run / "records.jsonl").read_text().splitlines(keepends=True)
    (run / "records.jsonl").write_text("garbage\n" + "".join(records[1:]))
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        campaign.main(["--merge", "--no-plots", "--out", out])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert "bo_long_campaign: error: The records file" in err and "damaged at line 1" in err
    checkpoint = run / "checkpoint.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[:3000])
    with pytest.raises(SystemExit) as e:
        campaign.main([*args, "--steps", "2"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert "bo_long_campaign: error: The checkpoint" in err and "damaged or truncated" in err


def test_a_continued_run_moves_to_the_device_given(campaign, tmp_path):
    """``--device`` on a call that continues runs moves them there (it was ignored: a run
    copied from a GPU machine went on asking for its own device); without it a run keeps its
    own. ``cpu:0`` stands for another device on a machine with none but the CPU."""
    out = str(tmp_path / "camp")
    args = [*TOY, "--methods", "exact", "--out", out]
    campaign.main([*args, "--steps", "1"])
    run = campaign.run_dir(Path(out), "levy", "exact", 0)

    def device() -> str:
        return torch.load(run / "checkpoint.pt", weights_only=True)["config"]["device"]

    assert device() == "cpu"
    campaign.main([*args, "--steps", "2", "--device", "cpu:0"])
    assert device() == "cpu:0"
    campaign.main([*args, "--steps", "3"])
    assert device() == "cpu:0"
    assert [r["step"] for r in read_records(run / "records.jsonl")] == [0, 1, 2, 3]


def test_the_plot_says_how_many_seeds_its_means_are_over(campaign, tmp_path, monkeypatch):
    """The legend named the methods but not how many seeds each mean is over (a run stopped by
    its budget, or not run yet, leaves fewer), nor what the band around the mean is."""
    shown = []

    def savefig(fig, *args, **kwargs) -> None:
        ax = fig.axes[0]
        shown.append(([t.get_text() for t in ax.get_legend().get_texts()], ax.get_ylabel()))

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    recs = [
        {"step": i, "n": 5 + 3 * i, "best_true_value": 1.0 - 0.1 * i, "regret": 1.0 - 0.1 * i}
        | {"wall_time": float(i), "time_fit": 0.1, "time_acquisition": 0.2, "time_update": 0.01}
        for i in range(3)
    ]
    runs = {"levy": {"wiski": {0: recs, 1: recs, 2: recs}, "exact": {0: recs}}}
    summary = campaign.summarise(runs, target_steps=2)
    campaign.plot(summary["functions"], tmp_path)
    ((legend, ylabel),) = shown
    assert legend == ["WISKI (3 seeds)", "OnlineExactGP (1 seed)", "Sobol (final, 3 seeds)"]
    assert ylabel == "simple regret (mean over seeds; band: min-max)"
