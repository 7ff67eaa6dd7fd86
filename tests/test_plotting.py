r"""Plots: each figure shows what its title says -- the plotted data are the records' numbers."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest

from bo_online import plotting
from bo_online.loops.history import append_record, write_json

PNG = b"\x89PNG\r\n\x1a\n"


def _bo_records(scale: float, n0: int = 5):
    recs, wall = [], 0.0
    for step in range(6):
        wall += 0.1 * (step + 1)
        recs.append(
            {
                "step": step,
                "n": n0 + step,
                "best_value": 1.0 + scale / (step + 1),
                "regret": scale / (step + 1),
                "time_step": 0.1 * (step + 1),
                "time_update": 0.01 * (step + 1),
                "wall_time": wall,
            }
        )
    return recs


@pytest.fixture
def captured(monkeypatch):
    figs = []
    real = plotting._save

    def save(fig, out):
        figs.append(fig)
        matplotlib.pyplot.figure(fig.number)
        return real(fig, out)

    monkeypatch.setattr(plotting, "_save", save)
    return figs


def test_progress_plot_data_are_the_records(tmp_path, captured):
    runs = [("a", _bo_records(1.0)), ("b", _bo_records(2.0))]
    out = plotting.plot_progress(runs, tmp_path / "p.png")
    assert out.read_bytes()[:8] == PNG
    ax_step, ax_wall = captured[0].axes
    assert ax_step.get_title() == "Regret vs step" and ax_wall.get_title() == "Regret vs wall time"
    assert ax_step.get_yscale() == "log"
    for line, (_, recs) in zip(ax_step.get_lines(), runs):
        np.testing.assert_allclose(line.get_xdata(), [r["step"] for r in recs])
        np.testing.assert_allclose(line.get_ydata(), [r["regret"] for r in recs])
    for line, (_, recs) in zip(ax_wall.get_lines(), runs):
        np.testing.assert_allclose(line.get_xdata(), [r["wall_time"] for r in recs])
    # without regret in every run, the best value is plotted
    no_regret = [("c", [{**r, "regret": None} for r in _bo_records(1.0)])]
    plotting.plot_progress(no_regret, tmp_path / "q.png")
    assert captured[1].axes[0].get_title() == "Best value vs step"
    np.testing.assert_allclose(
        captured[1].axes[0].get_lines()[0].get_ydata(), [r["best_value"] for r in no_regret[0][1]]
    )
    # a step axis has whole steps only (a short run was labelled 0, 0.5, 1, ...)
    short = [("s", _bo_records(1.0)[:3])]
    plotting.plot_progress(short, tmp_path / "s.png")
    ticks = captured[-1].axes[0].get_xticks()
    assert len(ticks) >= 2 and np.all(ticks == np.round(ticks)), ticks


def test_time_per_step_and_rmse_plots(tmp_path, captured):
    runs = [("exact", _bo_records(1.0)), ("wiski", _bo_records(1.0, n0=50))]
    plotting.plot_time_per_step(runs, tmp_path / "t.png")
    ax = captured[0].axes[0]
    assert ax.get_title() == "Time per step vs n"
    lines = ax.get_lines()
    assert len(lines) == 4  # step and update time for each run
    np.testing.assert_allclose(lines[2].get_xdata(), [r["n"] for r in runs[1][1][1:]])
    np.testing.assert_allclose(lines[0].get_ydata(), [r["time_step"] for r in runs[0][1][1:]])
    np.testing.assert_allclose(lines[1].get_ydata(), [r["time_update"] for r in runs[0][1][1:]])
    al = [
        {"step": s, "n": 10 + 6 * s, "rmse": 10.0 - s, "time_step": 1.0, "time_update": 0.1}
        for s in range(5)
    ]
    plotting.plot_rmse([("qnipv", al)], tmp_path / "r.png")
    ax = captured[1].axes[0]
    assert ax.get_title() == "Test RMSE vs step"
    np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), [r["rmse"] for r in al])


def test_plot_runs_from_directories(tmp_path):
    for name, recs in (("r1", _bo_records(1.0)), ("r2", _bo_records(3.0))):
        d = tmp_path / name
        d.mkdir()
        write_json(d / "config.json", {"model": "exact", "acq": "qucb"})
        for r in recs:
            append_record(d / "records.jsonl", r)
    written = plotting.plot_runs([tmp_path / "r1", tmp_path / "r2"], tmp_path / "plots")
    assert sorted(p.name for p in written) == ["progress.png", "time_per_step.png"]
    for p in written:
        assert p.read_bytes()[:8] == PNG and p.stat().st_size > 5000
    assert plotting.load_runs([tmp_path / "r1"])[0][0] == "r1 (exact/qucb)"
    with pytest.raises(FileNotFoundError):
        plotting.load_runs([tmp_path / "missing"])


@pytest.mark.parametrize("field", ["n", "time_step", "time_update"])
def test_a_record_without_a_plotted_field_is_named_with_its_file_and_line(tmp_path, field):
    r"""`bo-online plot` of a records file where a person deleted or renamed a field raised a
    bare KeyError ('n'); it now names the file, the line and the field, and draws nothing."""
    from bo_online.loops.history import RunFileError

    d = tmp_path / "r1"
    d.mkdir()
    for step, r in enumerate(_bo_records(1.0)):
        if step == 3:
            r["renamed"] = r.pop(field)
        append_record(d / "records.jsonl", r)
    with pytest.raises(RunFileError) as e:
        plotting.plot_runs([d], tmp_path / "plots")
    message = str(e.value)
    assert str(d / "records.jsonl") in message and "line 4" in message
    assert f"no field {field!r}" in message
    assert not (tmp_path / "plots").exists()


def _save_many(path: str, n: int) -> list[str]:
    """Draw and save a plot at ``path`` ``n`` times; the errors raised (a worker process)."""
    errors = []
    for _ in range(n):
        fig, ax = matplotlib.pyplot.subplots()
        ax.plot(range(10))
        try:
            plotting._save(fig, path)
        except Exception as e:  # noqa: BLE001 - counted, the test says which
            errors.append(repr(e))
    return errors


def test_two_processes_saving_the_same_plot_at_once_both_succeed(tmp_path):
    """Both processes of two sweeps (or `bo-online plot`s) on one folder drew through the same
    temp file NAME.part: one moved the other's away, which then failed with FileNotFoundError
    (30 of 60 saves of two processes saving one plot 30 times each)."""
    import multiprocessing

    out = tmp_path / "plots" / "branin.png"
    with multiprocessing.get_context("fork").Pool(2) as pool:
        errors = pool.starmap(_save_many, [(str(out), 8), (str(out), 8)])
    assert errors == [[], []]
    assert out.read_bytes()[:8] == PNG
    assert [p.name for p in out.parent.iterdir()] == ["branin.png"]


def test_a_plot_interrupted_while_saving_leaves_the_previous_one(tmp_path, monkeypatch):
    """The plots were written in place: a run killed while saving one left a truncated image
    (until a later resume drew it again)."""
    runs = [("r1", _bo_records(1.0))]
    out = plotting.plot_progress(runs, tmp_path / "progress.png")
    before = out.read_bytes()
    assert before[:8] == PNG

    def killed(fig, fname, **kwargs):
        with open(fname, "wb") as f:
            f.write(PNG[:4])  # part of an image, then the process is stopped
        raise KeyboardInterrupt

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", killed)
    with pytest.raises(KeyboardInterrupt):
        plotting.plot_progress([("r1", _bo_records(2.0))], out)
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["progress.png"]


def test_a_save_removes_the_temp_files_a_killed_save_of_its_plot_left(tmp_path):
    r"""A save killed before its temp file (``.NAME.<hex>``) was moved left it in the folder
    for good: no later save or `bo-online plot` removed it. The next save of that plot now
    removes those left by dead saves, and leaves a live save's (locked), one just created, and
    other plots' alone."""
    import fcntl
    import os
    import time

    out = tmp_path / "plots" / "progress.png"
    out.parent.mkdir()
    old = time.time() - 60

    def temp(name):
        path = out.parent / name
        path.write_bytes(PNG[:4])
        os.utime(path, (old, old))
        return path

    stale = [temp(".progress.png.0123456789ab"), temp(".progress.png.ba9876543210")]
    live, other = temp(".progress.png.aaaaaaaaaaaa"), temp(".rmse.png.0123456789ab")
    young = out.parent / ".progress.png.bbbbbbbbbbbb"
    young.write_bytes(b"")
    with open(live, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # a save in progress in another process
        plotting.plot_progress([("r1", _bo_records(1.0))], out)
        assert not any(p.exists() for p in stale)
        assert live.exists() and young.exists() and other.exists()
    assert out.read_bytes()[:8] == PNG


def test_a_plot_is_saved_where_the_file_system_has_no_flock(tmp_path, monkeypatch):
    r"""The lock a save holds on its temp file (so that no other save removes it) made every
    plot fail where ``flock`` is refused (``ENOLCK`` on NFS without a lock daemon; the run
    directory's own guard goes on unlocked there): the save now goes on without it, and the
    stale-file sweep, whose ``flock`` fails the same way, removes nothing it cannot lock."""
    import errno
    import fcntl
    import os
    import time

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    out = tmp_path / "plots" / "progress.png"
    out.parent.mkdir()
    other = out.parent / ".progress.png.0123456789ab"  # maybe a live save's: cannot tell
    other.write_bytes(b"")
    old = time.time() - 60
    os.utime(other, (old, old))
    monkeypatch.setattr(fcntl, "flock", no_locks)
    plotting.plot_progress([("r1", _bo_records(1.0))], out)
    assert out.read_bytes()[:8] == PNG and other.exists()
    assert sorted(p.name for p in out.parent.iterdir()) == [other.name, "progress.png"]


def test_time_per_step_leaves_out_failed_evaluations(tmp_path, captured):
    r"""An asynchronous run's failed evaluation is a step of its own that adds no observation:
    its record has the n of the step before and no fit or update (``time_update`` 0). The time
    per step vs n plotted it, a second point at that n whose update time, 0 on the log axis,
    dropped the dashed line off the bottom of the plot; failed evaluations are now left out
    (they cost the surrogate nothing)."""
    recs = _bo_records(1.0)
    failed = {**recs[3], "step": 4, "failed": True, "time_step": 0.002, "time_update": 0.0}
    recs = [*recs[:4], failed, *[{**r, "step": r["step"] + 1} for r in recs[4:]]]
    plotting.plot_time_per_step([("a", recs)], tmp_path / "t.png")
    total, update = captured[0].axes[0].get_lines()
    kept = [r for r in recs if r["step"] > 0 and not r.get("failed")]
    np.testing.assert_allclose(total.get_xdata(), [r["n"] for r in kept])
    np.testing.assert_allclose(total.get_ydata(), [r["time_step"] for r in kept])
    np.testing.assert_allclose(update.get_ydata(), [r["time_update"] for r in kept])


def _visible_y_labels(ax):
    r"""The y tick labels (major and minor) matplotlib draws inside the axis' limits."""
    ax.figure.canvas.draw()
    low, high = ax.get_ylim()
    ticks = ax.yaxis.get_major_ticks() + ax.yaxis.get_minor_ticks()
    return [
        t.label1.get_text()
        for t in ticks
        if t.label1.get_visible() and t.label1.get_text() and low <= t.get_loc() <= high
    ]


def test_log_axes_are_labelled_with_plain_numbers(tmp_path, captured):
    # A regret that stays within a decade (1.45 to 2.2) was labelled '1.5 x 10^0', '2 x 10^0'.
    narrow = [{**r, "regret": 1.45 + 0.75 / (r["step"] + 1)} for r in _bo_records(1.0)]
    plotting.plot_progress([("a", narrow)], tmp_path / "p.png")
    labels = _visible_y_labels(captured[0].axes[0])
    assert len(labels) >= 3, labels
    values = [float(text) for text in labels]  # plain numbers: '1.5', '2'
    assert all(1.4 <= v <= 2.3 for v in values), labels
    # over several decades only the powers of ten are labelled, as plain numbers
    wide = [{**r, "regret": 10.0 ** -r["step"]} for r in _bo_records(1.0)]
    plotting.plot_progress([("b", wide)], tmp_path / "q.png")
    labels = _visible_y_labels(captured[1].axes[0])
    values = [float(text) for text in labels]
    assert len(values) >= 3 and all(np.isclose(np.log10(v), round(np.log10(v))) for v in values)
    assert "1e-05" in labels or "0.0001" in labels, labels
    # the time-per-step plot's log axis too
    plotting.plot_time_per_step([("c", _bo_records(1.0))], tmp_path / "t.png")
    labels = _visible_y_labels(captured[2].axes[0])
    assert labels and all(float(text) > 0 for text in labels), labels


def test_a_plot_that_cannot_be_saved_closes_its_figure(tmp_path):
    """A folder that cannot be made (a file in its place) or a temp file that cannot be opened
    raised before the figure was closed, so a long process (a sweep, a notebook) kept every
    failed figure open in pyplot."""
    import matplotlib.pyplot as plt

    plt.close("all")
    blocked = tmp_path / "plots"
    blocked.write_text("a file where the folder goes")
    with pytest.raises(OSError):
        plotting.plot_progress([("a", _bo_records(1.0))], blocked / "p.png")
    assert plt.get_fignums() == []
