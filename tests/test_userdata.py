"""A user's own data files: reading and checking, the CLI route, resume on the same file only,
and checkpointing by elapsed time."""

from __future__ import annotations

import gzip
import json
import re
import shlex
import warnings

import numpy as np
import pytest
import torch

from bo_online.cli import main
from bo_online.cli.checks import _columns
from bo_online.loops import StreamingLoop, history, load_loop, read_records, without_timing
from bo_online.problems import make_problem, to_unit
from bo_online.userdata import (
    DataChangedError,
    DataFileError,
    pool_from_file,
    problem_from_spec,
    read_table,
    stream_from_file,
)


def _data(n: int = 160, d: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3.0, 5.0, size=(n, d))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.05 * rng.standard_normal(n)
    return X, y


def _write_csv(path, X, y, header=True, extra=None) -> None:
    names = [f"x{j}" for j in range(X.shape[1])] + ["target"]
    lines = [",".join(names)] if header else []
    lines += [",".join(f"{v:.17g}" for v in row) for row in np.column_stack([X, y])]
    if extra:
        lines = lines[: extra[0]] + [extra[1]] + lines[extra[0] :]
    path.write_text("\n".join(lines) + "\n")


def _run(argv: list[str], capsys) -> tuple[int, str]:
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = int(e.code or 0)
    return code, capsys.readouterr().err


def test_an_identifier_warning_suggests_no_text_column_among_the_inputs(tmp_path):
    r"""The warning on a dropped identifier column suggested ``--inputs`` naming every other
    column, a text column too, which that call would then refuse; it names the numeric ones."""
    X, y = _data(n=40, d=2)
    path = tmp_path / "with_text.csv"
    path.write_text(
        "id,x0,colour,x1,target\n"
        + "\n".join(
            f"{i},{a:.17g},{'red' if i % 2 else 'blue'},{b:.17g},{t:.17g}"
            for i, ((a, b), t) in enumerate(zip(X, y))
        )
        + "\n"
    )
    with pytest.warns(UserWarning, match="column 'id' is named as a row identifier") as w:
        with pytest.raises(DataFileError, match="colour"):  # the text column is no input
            stream_from_file(path, seed=0)
    assert "--inputs id,x0,x1." in str(w[0].message), str(w[0].message)
    # and the call the warning suggests runs
    prob = stream_from_file(path, inputs=["id", "x0", "x1"], seed=0)
    assert prob.dim == 3


def test_a_constant_input_column_is_warned_of_with_the_inputs_that_leave_it_out(tmp_path):
    r"""A column of one value was taken as an input without a word (for WISKI a third grid
    dimension on a 2-input problem); it is kept, with a warning naming the ``--inputs`` that
    leave it out, and that call warns nothing."""
    X, y = _data(n=40, d=2)
    path = tmp_path / "constant.csv"
    path.write_text(
        "x0,site,x1,target\n"
        + "\n".join(f"{a:.17g},7,{b:.17g},{t:.17g}" for (a, b), t in zip(X, y))
        + "\n"
    )
    with pytest.warns(UserWarning, match="column 'site' holds one value in every row") as w:
        kept = stream_from_file(path, seed=0)
    assert kept.dim == 3
    assert "--inputs x0,x1." in str(w[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chosen = stream_from_file(path, inputs=["x0", "x1"], seed=0)
    assert chosen.dim == 2
    assert torch.equal(chosen.X_stream, kept.X_stream[:, [0, 2]])


def test_a_column_name_with_spaces_around_it_names_the_column(tmp_path):
    r"""The header's names are read stripped, as ``--inputs`` names are, so ``--target " x1"``
    was refused ("no column ' x1'"); it names column ``x1``, as ``target="x1"`` does."""
    X, y = _data()
    path = tmp_path / "mine.csv"
    _write_csv(path, X, y)
    plain = stream_from_file(path, target="x1", seed=3)
    padded = stream_from_file(path, target=" x1 ", seed=3)
    assert torch.equal(padded.y_stream, plain.y_stream)
    assert torch.equal(padded.X_stream, plain.X_stream)
    held = torch.cat([plain.y_stream.reshape(-1), plain.y_test.reshape(-1)])
    assert torch.equal(held.sort().values, torch.as_tensor(X[:, 1]).sort().values)  # column x1


def test_stream_from_csv_matches_hand_split_and_scaling(tmp_path):
    X, y = _data()
    path = tmp_path / "mine.csv"
    _write_csv(path, X, y)
    prob = stream_from_file(path, test_fraction=0.25, seed=3)
    # the same seeded 75/25 split and arrival order, computed here independently
    n = len(y)
    test = np.zeros(n, bool)
    test[np.random.default_rng(3).permutation(n)[: int(round(0.25 * n))]] = True
    order = np.random.default_rng(3).permutation(int((~test).sum()))
    np.testing.assert_allclose(prob.X_stream.numpy(), X[~test][order], rtol=0, atol=1e-12)
    np.testing.assert_allclose(prob.y_stream.numpy(), y[~test][order], rtol=0, atol=1e-12)
    np.testing.assert_allclose(prob.X_test.numpy(), X[test], rtol=0, atol=1e-12)
    # the loop's unit-cube scaling spans the data's box, like the shipped sets
    U = to_unit(torch.tensor(X), prob.bounds)
    np.testing.assert_allclose(U.min(0).values.numpy(), 0.0, atol=1e-12)
    np.testing.assert_allclose(U.max(0).values.numpy(), 1.0, atol=1e-12)
    assert prob.name == "mine" and prob.spec["path"] == str(path.resolve())


def test_gz_npz_target_and_mask_column(tmp_path):
    X, y = _data(n=50, d=3)
    mask = (np.arange(50) % 5 == 0).astype(float)
    table = np.column_stack([y, X, mask])
    gz = tmp_path / "d.csv.gz"
    with gzip.open(gz, "wt") as f:
        f.write("y,a,b,c,is_test\n" + "\n".join(",".join(f"{v:.17g}" for v in r) for r in table))
    prob = stream_from_file(gz, target="y", test_mask="is_test", shuffle=False)
    np.testing.assert_allclose(prob.X_stream.numpy(), X[mask == 0], atol=1e-12)
    np.testing.assert_allclose(prob.y_test.numpy(), y[mask == 1], atol=1e-12)
    npz = tmp_path / "d.npz"
    np.savez(npz, X=X, y=y, test_mask=mask.astype(bool))
    prob2 = stream_from_file(npz, shuffle=False)
    np.testing.assert_allclose(prob2.X_stream.numpy(), X[mask == 0], atol=1e-12)
    plain, mask_file = tmp_path / "plain.csv", tmp_path / "mask.csv"
    _write_csv(plain, X, y, header=False)
    np.savetxt(mask_file, mask, fmt="%d")
    prob3 = stream_from_file(plain, test_mask=str(mask_file), shuffle=False)
    np.testing.assert_allclose(prob3.y_stream.numpy(), y[mask == 0], atol=1e-12)
    assert prob3.spec["test_mask"] == str(mask_file.resolve())
    np.savetxt(mask_file, mask[:-1], fmt="%d")
    with pytest.raises(DataFileError, match="the test mask holds 49 rows"):
        stream_from_file(plain, test_mask=str(mask_file))
    pool = pool_from_file(gz, target=0, inputs=["a", "c"], test_mask=4)
    np.testing.assert_allclose(pool.X_pool.numpy(), X[mask == 0][:, [0, 2]], atol=1e-12)
    np.testing.assert_allclose(pool.y_test.numpy(), y[mask == 1], atol=1e-12)


def test_test_mask_file_given_as_a_path(tmp_path):
    """A test-mask file given as a pathlib.Path is read like its path string (it was taken for
    a column name: "no column PosixPath(...)") and recorded as the resolved path."""
    X, y = _data(n=40, d=2)
    mask = (np.arange(40) % 4 == 0).astype(int)
    data, mask_file = tmp_path / "d.csv", tmp_path / "mask.csv"
    _write_csv(data, X, y)
    np.savetxt(mask_file, mask, fmt="%d")
    prob = stream_from_file(data, test_mask=mask_file, shuffle=False)
    np.testing.assert_allclose(prob.y_test.numpy(), y[mask == 1], atol=1e-12)
    assert prob.spec["test_mask"] == str(mask_file.resolve())
    json.dumps(prob.spec)  # stored in config.json
    pool = pool_from_file(data, test_mask=mask_file)
    np.testing.assert_allclose(pool.y_pool.numpy(), y[mask == 0], atol=1e-12)


def test_classification_labels_mapped(tmp_path):
    X, _ = _data(n=60, d=2)
    y = np.where(X[:, 0] > 1, 7.0, -2.0)
    path = tmp_path / "c.csv"
    _write_csv(path, X, y)
    prob = stream_from_file(path, task="classification")
    assert set(prob.y_stream.tolist()) <= {0.0, 1.0}
    np.testing.assert_array_equal(prob.y_stream.numpy() == 1.0, prob.X_stream[:, 0].numpy() > 1)
    _write_csv(path, X, X[:, 0])
    with pytest.raises(DataFileError, match="two distinct values in target column"):
        stream_from_file(path, task="classification")


def _write_text_labels(path, X, flags, names, pad="") -> None:
    """A CSV of two inputs and a text label column: ``names[1]`` where ``flags``, else
    ``names[0]``, each after ``pad``."""
    rows = (f"{a!r},{b!r},{pad}{names[int(bool(f))]}" for (a, b), f in zip(X.tolist(), flags))
    path.write_text("x0,x1,label\n" + "\n".join(rows) + "\n")


def test_text_class_labels_are_mapped_in_sorted_order(tmp_path):
    """A classification target of text labels ('yes' / 'no', as most exported tables hold) was
    refused ('not a number; encode the two classes as 0 and 1'). Two text labels now map to 0 /
    1 in alphabetical order, row by row as the same file with 0 / 1 does; a missing label, a
    third label and one class left to train on are refused with the file, line and column."""
    X, _ = _data(n=60, d=2)
    positive = X[:, 0] > 1
    assert 0 < positive.sum() < 60
    text = tmp_path / "text.csv"
    _write_text_labels(text, X, positive, ("no", "yes"), pad=" ")  # cells are stripped
    numeric = tmp_path / "numeric.csv"
    _write_csv(numeric, X, positive.astype(float))
    want = stream_from_file(numeric, task="classification", seed=3)
    got = stream_from_file(text, task="classification", seed=3)
    for name in ("X_stream", "y_stream", "X_test", "y_test"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    np.testing.assert_array_equal(got.y_stream.numpy() == 1.0, got.X_stream[:, 0].numpy() > 1)
    lines = text.read_text().splitlines()
    for i, cell, pattern in (
        (5, "", r"bad.csv: line 5, target column 'label' is empty; drop or fill"),
        (7, "maybe", r"exactly two distinct values in target column 'label', found 3 \('maybe'"),
    ):
        bad = tmp_path / "bad.csv"
        changed = list(lines)
        changed[i - 1] = changed[i - 1].rsplit(",", 1)[0] + "," + cell
        bad.write_text("\n".join(changed) + "\n")
        with pytest.raises(DataFileError, match=pattern):
            stream_from_file(bad, task="classification")
    masked = tmp_path / "masked.csv"  # every 'yes' row held out for testing
    masked.write_text(
        "x0,x1,label,is_test\n"
        + "\n".join(
            f"{a!r},{b!r},{'yes' if p else 'no'},{int(p)}"
            for (a, b), p in zip(X.tolist(), positive)
        )
    )
    with pytest.raises(
        DataFileError, match="every training row of target column 'label' holds 'no'"
    ):
        stream_from_file(masked, target="label", test_mask="is_test", task="classification")


def test_a_classification_stream_cut_to_one_class_is_refused(tmp_path):
    """The one-class check ran on every training row, before --max-stream cut the stream: a file
    sorted by its label, streamed in file order and cut, trained a classifier on one class
    without a word. The cut stream is now checked too."""
    X, _ = _data(n=60, d=2)
    order = np.argsort(X[:, 0])
    X = X[order]
    labels = (X[:, 0] > np.median(X[:, 0])).astype(float)  # sorted: 30 zeros, then 30 ones
    path = tmp_path / "sorted.csv"
    _write_csv(path, X, labels)
    options = dict(task="classification", shuffle=False, test_fraction=0.1, seed=0)
    with pytest.raises(DataFileError, match=r"max_stream=20 \(in file order\) all hold class 0"):
        stream_from_file(path, max_stream=20, **options)
    kept = stream_from_file(path, max_stream=40, **options)  # both classes: accepted
    assert set(kept.y_stream.tolist()) == {0.0, 1.0}
    # text labels are named as the file holds them (the message said 'class 0 of 0 / 1')
    text = tmp_path / "sorted_text.csv"
    _write_text_labels(text, X, labels, ("early", "late"))
    with pytest.raises(DataFileError, match=r"\(in file order\) all hold class 'early': a"):
        stream_from_file(text, max_stream=20, **options)


def test_a_classification_file_names_its_target_column_and_refuses_one_class_to_train_on(
    tmp_path,
):
    """One class in the target column was refused with 'found 1' only (no column, no way out);
    a test mask that took every row of one class left the stream training on the other alone,
    without a word. Both are now one error naming the column and what to do, before a run."""
    X, _ = _data(n=40, d=2)
    path = tmp_path / "c.csv"
    _write_csv(path, X, np.ones(40))
    with pytest.raises(DataFileError, match=r"'target', found 1 \(1\); name a column of two"):
        stream_from_file(path, task="classification")
    labels = (X[:, 0] > 1).astype(float)
    assert 0 < labels.sum() < 40
    rows = ["a,b,y,is_test"] + [
        f"{a!r},{b!r},{c:g},{c:g}" for (a, b), c in zip(X.tolist(), labels.tolist())
    ]
    path.write_text("\n".join(rows) + "\n")  # class 1 exactly the test rows
    before = path.read_bytes()
    with pytest.raises(DataFileError, match="every training row of target column 'y' holds 0"):
        stream_from_file(path, target="y", test_mask="is_test", task="classification")
    assert path.read_bytes() == before


def test_a_classification_error_names_the_default_target_not_a_last_mask_column(tmp_path):
    """With no --target and the test mask the file's last column, the target is the column
    before it; the one-class error named the mask column ('is_test') as the target."""
    X, _ = _data(n=40, d=2)
    path = tmp_path / "c.csv"
    rows = ["a,b,y,is_test"] + [
        f"{a!r},{b!r},1,{int(i % 4 == 0)}" for i, (a, b) in enumerate(X.tolist())
    ]
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(DataFileError, match=r"target column 'y', found 1 \(1\)"):
        stream_from_file(path, test_mask="is_test", task="classification")


@pytest.mark.parametrize(
    "extra, pattern",
    [
        ((3, "1,2,abc,4,5"), r"line 4, column 'x2' \(no. 3\): 'abc' is not a number"),
        ((6, "1,2,,4,5"), r"line 7, column 'x2' \(no. 3\) is empty"),
        ((2, "1,2,nan,4,5"), r"line 3, column 'x2' \(no. 3\) is nan"),
        ((5, "1,2,3"), r"line 6 has 3 fields, expected 5"),
    ],
)
def test_bad_cells_named_by_file_line_column(tmp_path, extra, pattern):
    X, y = _data(n=20)
    path = tmp_path / "bad.csv"
    _write_csv(path, X, y, extra=extra)
    with pytest.raises(DataFileError, match=pattern) as info:
        stream_from_file(path)
    assert str(path) in str(info.value)


def test_unused_text_or_missing_columns_are_ignored(tmp_path):
    """An ID column with text and a column with gaps do no harm when --inputs leaves them out;
    the same cells in a used column (or in the default inputs) are still refused."""
    X, y = _data(n=30)
    path = tmp_path / "ids.csv"
    lines = ["x0,x1,x2,x3,name,notes,target"]
    lines += [
        ",".join([*(f"{v:.17g}" for v in X[i]), f"id{i}", "" if i % 3 else "1.5", f"{y[i]:.17g}"])
        for i in range(30)
    ]
    path.write_text("\n".join(lines) + "\n")
    problem = stream_from_file(path, inputs=["x0", "x1", "x2", "x3"], target="target")
    reference = stream_from_file(_write_plain(tmp_path, X, y))
    torch.testing.assert_close(problem.X_stream, reference.X_stream)
    torch.testing.assert_close(problem.y_test, reference.y_test)
    pool = pool_from_file(path, inputs=[0, 1, 2, 3], target=-1)
    assert pool.X_pool.shape[-1] == 4
    with pytest.raises(
        DataFileError, match=r"line 2, column 'name' \(no. 5\): 'id0' is not a number"
    ):
        stream_from_file(path, target="target")  # default inputs include the text column
    with pytest.raises(DataFileError, match=r"line 3, column 'notes' \(no. 6\) is empty"):
        stream_from_file(path, inputs=["x0", "notes"], target="target")


def test_duplicate_header_names_and_repeated_inputs_are_refused(tmp_path):
    X, y = _data(n=30)
    path = tmp_path / "dup.csv"
    lines = ["a,a,b,c,target"] + [",".join(f"{v:.17g}" for v in [*X[i], y[i]]) for i in range(30)]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFileError, match=r"names column 'a' 2 times, so an input 'a' is ambig"):
        stream_from_file(path, inputs=["a", "b"], target="target")
    problem = stream_from_file(path, inputs=[0, 1, "b"], target="target")  # indices are clear
    assert problem.X_stream.shape[-1] == 3
    with pytest.raises(DataFileError, match=r"input column\(s\) b are given more than once"):
        pool_from_file(path, inputs=["b", "c", "b"], target="target")


def _write_plain(tmp_path, X, y):
    path = tmp_path / "plain.csv"
    _write_csv(path, X, y)
    return path


def test_cli_bad_file_one_line_and_nothing_written(tmp_path, capsys):
    X, y = _data(n=20)
    path = tmp_path / "bad.csv"
    _write_csv(path, X, y, extra=(3, "1,2,abc,4,5"))
    out = tmp_path / "run"
    code, err = _run(["stream", "--data", str(path), "--out", str(out), "-Q"], capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("bo-online: error:")
    assert "line 4" in err and "'x2'" in err and str(path) in err
    assert not out.exists()
    code, err = _run(["stream", "--data", str(path), "--problem", "protein", "-Q"], capsys)
    assert code == 2 and "one of them" in err
    code, err = _run(["stream", "--problem", "protein", "--target", "y", "-Q"], capsys)
    assert code == 2 and "--target only applies" in err
    code, err = _run(["stream", "--data", str(tmp_path / "x.xlsx"), "-Q"], capsys)
    assert code == 2 and "unsupported file type" in err
    # a directory was reported as "no such file"
    (tmp_path / "folder.csv").mkdir()
    code, err = _run(["stream", "--data", str(tmp_path / "folder.csv"), "--out", str(out)], capsys)
    assert code == 2 and "is a directory; name the data file in it" in err
    assert not out.exists()


def test_cli_stream_into_a_dense_model_that_would_outgrow_memory_is_refused(
    tmp_path, capsys, monkeypatch
):
    """A user's file of 100,000 rows streamed into the default exact GP would run for hours and
    be killed for memory long before its end (its n x n factor: 80 GB at n = 100,000). A stream
    whose last n x n matrices cannot fit is now refused before anything runs, naming the size,
    the scalable model and the options that stop earlier; what fits goes on."""
    from bo_online.cli import memory as cli

    X, y = _data(n=160, d=3)
    path = _write_plain(tmp_path, X, y)
    out = tmp_path / "run"
    # 144 stream rows: the exact GP's 4 n x n float64 matrices at n = 144 take 0.66 MB
    monkeypatch.setattr(cli, "_memory_bytes", lambda device="cpu": 500_000)
    for model in ("exact", "singletaskgp"):
        code, err = _run(
            ["stream", "--data", str(path), "--model", model, "--out", str(out), "-Q"], capsys
        )
        assert code == 2 and err.count("\n") == 1, err
        assert f"--model {model} holds an n x n factor" in err and "(n = 144)" in err
        assert "use --model tsvgp" in err and "--max-stream" in err
        assert not out.exists()
    common = ["--data", str(path), "--n-init", "10", "--eval-every", "20", "-Q", "--no-plots"]
    code, err = _run(["stream", *common, "--max-stream", "120", "--out", str(out)], capsys)
    assert code == 0, err  # n = 120: 0.46 MB
    code, err = _run(["stream", *common, "--model", "tsvgp", "--out", str(tmp_path / "t")], capsys)
    assert code == 0, err
    # bo and active likewise, at their last n: 5 (Branin's default design) + 139, and 12 + 6 x 22
    for argv in (
        ["bo", "--problem", "branin", "--steps", "139"],
        ["active", "--pool", str(path), "--n-init", "12", "--steps", "22"],
    ):
        code, err = _run([*argv, "--out", str(tmp_path / "refused"), "-Q"], capsys)
        assert code == 2 and err.count("\n") == 1, err
        assert "(n = 144)" in err and "or stop earlier with --steps." in err
        assert not (tmp_path / "refused").exists()


def test_cli_stream_own_data_resume_identical_and_changed_file_refused(tmp_path, capsys):
    X, y = _data(n=90, d=4)
    path = tmp_path / "mine.csv"
    _write_csv(path, X, y)
    base = [
        "stream",
        "--data",
        str(path),
        "--model",
        "exact",
        "--n-init",
        "20",
        "--eval-every",
        "10",
        "--refit-every",
        "0",
        "--fit-max-iter",
        "5",
        "-Q",
        "--no-plots",
    ]
    full, part = tmp_path / "full", tmp_path / "part"
    main(base + ["--out", str(full)])
    main(base + ["--out", str(part), "--steps", "30"])
    config = json.loads((part / history.CONFIG_FILE).read_text())
    assert (
        config["problem"]["path"] == str(path.resolve()) and len(config["problem"]["sha256"]) == 64
    )
    main(["resume", str(part), "--steps", str(len(read_records(full)) - 1), "-Q", "--no-plots"])
    assert without_timing(read_records(part)) == without_timing(read_records(full))
    # a stream of 90 rows with 10% test: 81 training rows, 20 initial points
    assert read_records(full)[-1]["n"] == 81
    # the file changes: resume refuses with a clear one-line message
    _write_csv(path, X, y + 1.0)
    code, err = _run(["resume", str(part), "--steps", "70", "-Q", "--no-plots"], capsys)
    assert code == 2 and "has changed since the run started" in err


def test_a_run_whose_data_file_moved_resumes_with_data_new_path(tmp_path, capsys):
    """A run folder and its CSV copied elsewhere: resume --data NEW accepts the same bytes
    (records as an uninterrupted run's, the new path stored for later resumes), refuses a file
    that differs without touching the run, and the 'gone' message says how."""
    X, y = _data(n=90, d=4)
    path = tmp_path / "mine.csv"
    _write_csv(path, X, y)
    base = ["stream", "--model", "exact", "--n-init", "20", "--eval-every", "10"]
    base += ["--refit-every", "0", "--fit-max-iter", "5", "-Q", "--no-plots"]
    full, part = tmp_path / "full", tmp_path / "part"
    main(base + ["--data", str(path), "--out", str(full)])
    main(base + ["--data", str(path), "--out", str(part), "--steps", "30"])
    moved = tmp_path / "elsewhere" / "copy.csv"
    moved.parent.mkdir()
    moved.write_bytes(path.read_bytes())
    path.unlink()
    code, err = _run(["resume", str(part), "-Q", "--no-plots"], capsys)
    assert code == 2 and "is gone" in err and "--data NEW_PATH" in err
    before = {p.name: p.read_bytes() for p in part.iterdir() if p.is_file()}
    other = tmp_path / "other.csv"
    _write_csv(other, X, y + 1.0)
    code, err = _run(["resume", str(part), "--data", str(other), "-Q", "--no-plots"], capsys)
    assert code == 2 and "is not the data file the run" in err and str(other) in err
    assert {p.name: p.read_bytes() for p in part.iterdir() if p.is_file()} == before
    code, err = _run(["resume", str(tmp_path / "full"), "--data", str(tmp_path / "no.csv")], capsys)
    assert code == 2 and "no such file" in err
    main(["resume", str(part), "--steps", "40", "--data", str(moved), "-Q", "--no-plots"])
    for f in (part / history.CONFIG_FILE,):
        assert json.loads(f.read_text())["problem"]["path"] == str(moved.resolve())
    assert history.load_checkpoint(part / history.CHECKPOINT_FILE)["problem"]["path"] == str(
        moved.resolve()
    )
    # a later resume finds the file at its new place without --data
    main(["resume", str(part), "--steps", str(len(read_records(full)) - 1), "-Q", "--no-plots"])
    assert without_timing(read_records(part)) == without_timing(read_records(full))
    # Python: load_loop(..., data=...) likewise
    with pytest.raises(DataChangedError, match="is not the data file"):
        load_loop(part, data=other)


def test_a_run_whose_test_mask_file_moved_resumes_with_test_mask_new_path(tmp_path, capsys):
    """A run on a CSV with a test-mask file, both copied elsewhere: `resume --data NEW` alone was
    refused ('the run's test-mask file is gone; put it back'), with no option to name the mask's
    new place. `--test-mask NEW` takes the same bytes (records as an uninterrupted run's, the
    path stored), refuses a mask that differs without touching the run, and is refused for a run
    without a mask file."""
    X, y = _data(n=90, d=3)
    path, mask = tmp_path / "mine.csv", tmp_path / "mask.csv"
    _write_csv(path, X, y)
    np.savetxt(mask, (np.arange(90) % 5 == 0).astype(int), fmt="%d")
    base = ["stream", "--model", "exact", "--n-init", "20", "--eval-every", "10"]
    base += ["--refit-every", "0", "--fit-max-iter", "5", "-Q", "--no-plots"]
    full, part = tmp_path / "full", tmp_path / "part"
    main(base + ["--data", str(path), "--test-mask", str(mask), "--out", str(full)])
    main(
        base + ["--data", str(path), "--test-mask", str(mask), "--out", str(part), "--steps", "30"]
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    new_data, new_mask = elsewhere / "mine.csv", elsewhere / "mask.csv"
    new_data.write_bytes(path.read_bytes())
    new_mask.write_bytes(mask.read_bytes())
    path.unlink()
    mask.unlink()
    resume = ["resume", str(part), "--data", str(new_data), "-Q", "--no-plots"]
    code, err = _run(resume, capsys)
    assert code == 2 and "test-mask file is gone" in err and "--test-mask NEW_PATH" in err
    before = {p.name: p.read_bytes() for p in part.iterdir() if p.is_file()}
    other = tmp_path / "other_mask.csv"
    np.savetxt(other, (np.arange(90) % 4 == 0).astype(int), fmt="%d")
    code, err = _run([*resume, "--test-mask", str(other)], capsys)
    assert code == 2 and "is not the test-mask file the run" in err
    assert {p.name: p.read_bytes() for p in part.iterdir() if p.is_file()} == before
    main([*resume, "--test-mask", str(new_mask), "--steps", "40"])
    problem = json.loads((part / history.CONFIG_FILE).read_text())["problem"]
    assert problem["test_mask"] == str(new_mask.resolve())
    main(["resume", str(part), "--steps", str(len(read_records(full)) - 1), "-Q", "--no-plots"])
    assert without_timing(read_records(part)) == without_timing(read_records(full))
    plain = tmp_path / "plain"
    main(base + ["--data", str(new_data), "--out", str(plain), "--steps", "2"])
    with pytest.raises(DataFileError, match="has no test-mask file"):
        load_loop(plain, test_mask=new_mask)
    with pytest.raises(TypeError, match="not both"):  # the given problem would win
        load_loop(part, problem=object(), data=new_data)
    # a run from before the mask's SHA-256 was stored: told so, not 'has no test-mask file'
    ckpt = history.load_checkpoint(part / history.CHECKPOINT_FILE)
    ckpt["problem"].pop("test_mask_sha256")
    history.save_checkpoint(part / history.CHECKPOINT_FILE, ckpt)
    with pytest.raises(DataFileError, match="recorded no SHA-256 of its test-mask file"):
        load_loop(part, test_mask=new_mask)


def test_cli_active_pool_file(tmp_path, capsys):
    X, y = _data(n=120, d=3)
    path = tmp_path / "pool.csv"
    _write_csv(path, X, y)
    out = tmp_path / "run"
    main(
        [
            "active",
            "--pool",
            str(path),
            "--inputs",
            "x0,x1",
            "--target",
            "target",
            "--test-fraction",
            "0.25",
            "--model",
            "exact",
            "--acq",
            "random",
            "--q",
            "2",
            "--steps",
            "3",
            "--n-init",
            "5",
            "--fit-max-iter",
            "3",
            "--out",
            str(out),
            "-Q",
            "--no-plots",
        ]
    )
    records = read_records(out)
    assert records[-1]["n"] == 11 and records[-1]["rmse"] is not None
    loop = load_loop(out)
    assert loop.problem.X_pool.shape == (90, 2) and loop.problem.X_test.shape == (30, 2)
    code, err = _run(["active", "--pool", str(path), "--inputs", "x0,nope", "-Q"], capsys)
    assert code == 2 and "no column 'nope'" in err
    # more steps than the pool holds: refused before any label (it stopped mid-run)
    more = tmp_path / "more"
    argv = ["active", "--pool", str(path), "--test-fraction", "0.25", "--acq", "random"]
    argv += ["--q", "40", "--n-init", "5", "--steps", "3", "--out", str(more), "-Q"]
    code, err = _run(argv, capsys)
    assert code == 2 and "--steps 3 exceeds the 2 steps the pool allows" in err, err
    assert not more.exists()
    # far more: the pool's limit, not memory (the n of 10**6 steps was said to outgrow it)
    argv[argv.index("--steps") + 1] = "1000000"
    code, err = _run(argv, capsys)
    assert code == 2 and "--steps 1000000 exceeds the 2 steps the pool allows" in err, err


def test_renamed_shipped_set_refused_by_shape(tmp_path):
    """A file put under a shipped set's name must not run as that set."""
    X, y = _data(n=30, d=5)
    (tmp_path / "uci" / "protein").mkdir(parents=True)
    with gzip.open(tmp_path / "uci/protein/data.csv.gz", "wt") as f:
        f.write("\n".join(",".join(map(str, r)) for r in np.column_stack([X, y])))
    with gzip.open(tmp_path / "uci/protein/test_mask.csv.gz", "wt") as f:
        f.write("\n".join(",".join(["0"] * 10) for _ in range(30)))
    with pytest.raises(ValueError, match="is not the protein set"):
        make_problem({"name": "protein"}, data_dir=tmp_path)


def test_fewer_magnetometer_tracks_says_which(tmp_path, capsys):
    (tmp_path / "magnetometer").mkdir()
    for k in (1, 2):
        np.savetxt(tmp_path / f"magnetometer/{k}-loc.csv", np.random.rand(30, 2), delimiter=",")
        np.savetxt(tmp_path / f"magnetometer/{k}-mag.csv", np.random.rand(30, 3), delimiter=",")
    code, err = _run(["active", "--data-dir", str(tmp_path), "-Q"], capsys)
    assert code == 2 and "tracks present: [1, 2]" in err and "--tracks 1,2" in err
    out = tmp_path / "run"
    main(
        [
            "active",
            "--data-dir",
            str(tmp_path),
            "--tracks",
            "1,2",
            "--test-size",
            "20",
            "--acq",
            "random",
            "--steps",
            "1",
            "--n-init",
            "4",
            "--fit-max-iter",
            "2",
            "--out",
            str(out),
            "-Q",
            "--no-plots",
        ]
    )
    assert read_records(out)[-1]["n"] == 10


def test_checkpoint_by_time_resumes_to_identical_records(tmp_path, monkeypatch):
    """Default cadence: checkpoints by elapsed time; records appended after the last one are
    dropped and redone on resume, giving the records of an uninterrupted run."""
    X, y = _data(n=70, d=3)
    path = tmp_path / "s.csv"
    _write_csv(path, X, y)
    prob = stream_from_file(path)
    opts = dict(model="exact", n_init=10, refit_every=3, fit_max_iter=3, eval_every=4)
    ref = StreamingLoop(prob, out_dir=tmp_path / "ref", **opts)
    ref.run(20)
    saves = []
    run = StreamingLoop(prob, out_dir=tmp_path / "cut", checkpoint_seconds=3600.0, **opts)
    original = run.save_checkpoint
    monkeypatch.setattr(run, "save_checkpoint", lambda: (saves.append(run.step_count), original()))
    run.run(12)
    assert saves == [0, 12]  # the initial design and the end only
    # a crash after step 15: records 13..15 are on disk, the checkpoint is at step 12
    run.target_steps = 20
    for _ in range(3):
        run.step()
    assert len(read_records(tmp_path / "cut")) == 16
    resumed = load_loop(tmp_path / "cut")
    # the files are rewritten from the checkpoint once the resumed run goes on (a resume refused
    # before that leaves them as they were), then records 13..15 are redone
    assert resumed.step_count == 12 and len(read_records(tmp_path / "cut")) == 16
    resumed.run(20)
    assert without_timing(read_records(tmp_path / "cut")) == without_timing(
        read_records(tmp_path / "ref")
    )
    assert resumed.elapsed >= resumed.wall_time > 0
    every = StreamingLoop(prob, checkpoint_every=5, out_dir=tmp_path / "every", **opts)
    monkeypatch.setattr(every, "save_checkpoint", lambda: saves.append(("every", every.step_count)))
    every.run(12)
    assert saves[-4:] == [("every", 0), ("every", 5), ("every", 10), ("every", 12)]


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_signal_checkpoints_after_the_step_and_resumes_identically(tmp_path, signame, capsys):
    import os
    import signal

    X, y = _data(n=50, d=2)
    path = tmp_path / "s.csv"
    _write_csv(path, X, y)
    prob = stream_from_file(path)
    opts = dict(model="exact", n_init=10, refit_every=4, fit_max_iter=3, eval_every=3)
    ref = StreamingLoop(prob, out_dir=tmp_path / "ref", **opts)
    ref.run(15)
    run = StreamingLoop(prob, out_dir=tmp_path / "cut", checkpoint_seconds=3600.0, **opts)
    sig = getattr(signal, signame)
    before = signal.getsignal(sig)

    def callback(record):
        if record["step"] == 6:
            os.kill(os.getpid(), sig)

    expected = KeyboardInterrupt if signame == "SIGINT" else SystemExit
    with pytest.raises(expected):
        run.run(15, callback=callback)
    assert signal.getsignal(sig) is before and run.step_count == 6
    # the first signal is acknowledged at once (the step in progress may take long)
    said = "Ctrl-C" if signame == "SIGINT" else signame
    assert f"bo-online: {said} received: stopping after the step" in capsys.readouterr().err
    resumed = load_loop(tmp_path / "cut")
    assert resumed.step_count == 6  # the checkpoint holds step 6: written on the signal
    resumed.run()
    assert without_timing(read_records(tmp_path / "cut")) == without_timing(
        read_records(tmp_path / "ref")
    )


@pytest.mark.parametrize("command", ["stream", "active"])
def test_cli_stream_and_active_pass_their_shared_options_through(tmp_path, capsys, command):
    r"""``--checkpoint-seconds`` and the other shared options reach the loop's configuration for
    the data commands as for ``bo`` (they were once passed by position, and
    ``--checkpoint-seconds`` landed in another parameter and was ignored)."""
    X, y = _data(n=60, d=3)
    path = tmp_path / "mine.csv"
    _write_csv(path, X, y)
    out = tmp_path / "run"
    source = ["--data", str(path)] if command == "stream" else ["--pool", str(path)]
    extra = ["--n-init", "20"]
    if command == "active":
        extra = ["--n-init", "8", "--num-mc-points", "16"]
    argv = [command, *source, "--model", "exact", "--steps", "1", "--q", "2", "--seed", "3"]
    argv += ["--checkpoint-seconds", "7.5", "--fit-max-iter", "4", "--out", str(out), "-Q"]
    main(argv + extra + ["--no-plots"])
    config = json.loads((out / history.CONFIG_FILE).read_text())
    assert config["checkpoint_seconds"] == 7.5
    assert (config["q"], config["seed"], config["fit_max_iter"]) == (2, 3, 4)


def test_a_mask_column_last_is_not_the_default_target(tmp_path):
    """With the test-mask column last, the default target is the last other column (not the
    mask), and naming the mask column as the target is refused."""
    X, y = _data(n=40, d=2)
    mask = (np.arange(40) % 4 == 0).astype(float)
    path = tmp_path / "rows.csv"
    rows = np.column_stack([X, y, mask])
    path.write_text(
        "x1,x2,y,is_test\n" + "\n".join(",".join(f"{v:.17g}" for v in r) for r in rows) + "\n"
    )
    prob = stream_from_file(path, test_mask="is_test", shuffle=False)
    np.testing.assert_allclose(prob.X_stream.numpy(), X[mask == 0], atol=1e-12)
    np.testing.assert_allclose(prob.y_stream.numpy(), y[mask == 0], atol=1e-12)
    np.testing.assert_allclose(prob.y_test.numpy(), y[mask == 1], atol=1e-12)
    with pytest.raises(
        DataFileError, match="'is_test' cannot be both the target and the test mask"
    ):
        stream_from_file(path, target="is_test", test_mask="is_test")


def test_mask_files_are_checked_like_mask_columns_and_on_resume(tmp_path):
    """An .npz's own test_mask must hold 0/1 values; a mask file that is missing is named as a
    missing file; a mask file that changed since the run started is refused on resume."""
    X, y = _data(n=30, d=2)
    for bad in (np.where(np.arange(30) % 3 == 0, np.nan, 0.0), np.where(np.arange(30) % 3, 0, 2.5)):
        np.savez(tmp_path / "m.npz", X=X, y=y, test_mask=bad)
        with pytest.raises(DataFileError, match=r"test mask \(.*\) must hold 0/1 values"):
            stream_from_file(tmp_path / "m.npz")
    plain, mask_file = tmp_path / "plain.csv", tmp_path / "mask.csv"
    _write_csv(plain, X, y, header=False)
    with pytest.raises(DataFileError, match=r"mask\.csv: no such file"):
        stream_from_file(plain, test_mask=str(mask_file))
    np.savetxt(mask_file, (np.arange(30) % 5 == 0).astype(int), fmt="%d")
    prob = stream_from_file(plain, test_mask=str(mask_file))
    assert len(prob.spec["test_mask_sha256"]) == 64
    np.savetxt(mask_file, (np.arange(30) % 3 == 0).astype(int), fmt="%d")
    with pytest.raises(DataChangedError, match=r"mask\.csv has changed since the run started"):
        make_problem(prob.spec)


def test_a_mask_value_other_than_0_or_1_is_reported_where_it_is(tmp_path):
    """A mask file holding a 2 was reported as ``data.csv: the test mask must hold 0/1 values``:
    the data file's name, not the mask's, and neither the value nor its line. Now the mask's
    source (file, column of the data file, or an .npz's array) is named with the first bad
    value and its line (0-based row in an .npz)."""
    X, y = _data(n=30, d=2)
    plain, mask_file = tmp_path / "plain.csv", tmp_path / "mask.csv"
    _write_csv(plain, X, y, header=False)
    mask = (np.arange(30) % 5 == 0).astype(float)
    mask[7] = 2.0  # line 8 of a mask file without a header
    np.savetxt(mask_file, mask, fmt="%g")
    with pytest.raises(DataFileError) as e:
        stream_from_file(plain, test_mask=str(mask_file))
    assert str(e.value) == (
        f"The test mask ({mask_file}) must hold 0/1 values (1 = test row); line 8 holds 2."
    )
    with_column = tmp_path / "col.csv"
    mask[7] = 0.5  # line 9 of the data file, under its header
    _write_csv(with_column, np.column_stack([X, y]), mask)
    with pytest.raises(DataFileError) as e:
        stream_from_file(with_column, target="x2", test_mask="target")
    assert str(e.value) == (
        f"The test mask (column 'target' of {with_column}) must hold 0/1 values (1 = test row); "
        "line 9 holds 0.5."
    )
    np.savez(tmp_path / "m.npz", X=X, y=y, test_mask=mask)
    with pytest.raises(
        DataFileError, match=r"'s test_mask array\) must hold 0/1 .* row 7 \(0-based\) holds 0.5\."
    ):
        stream_from_file(tmp_path / "m.npz")


def test_bom_and_a_first_row_with_an_empty_cell(tmp_path):
    """A UTF-8 byte-order mark (Excel's "CSV UTF-8") is not part of the first column's name or
    value; a headerless file whose first row has an empty cell is data (the cell is reported),
    not a header."""
    X, y = _data(n=20, d=2)
    path = tmp_path / "bom.csv"
    _write_csv(path, X, y)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    prob = stream_from_file(path, inputs=["x0", "x1"], target="target", shuffle=False)
    assert prob.X_stream.shape[0] + prob.X_test.shape[0] == 20
    nohdr = tmp_path / "bom_nohdr.csv"
    _write_csv(nohdr, X, y, header=False)
    nohdr.write_bytes(b"\xef\xbb\xbf" + nohdr.read_bytes())
    prob = stream_from_file(nohdr, shuffle=False)
    assert prob.X_stream.shape[0] + prob.X_test.shape[0] == 20
    empty = tmp_path / "firstempty.csv"
    _write_csv(empty, X, y, header=False)
    lines = empty.read_text().splitlines()
    lines[0] = ",".join(["0.1", "", "0.3"])
    empty.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFileError, match=r"line 1, column '1' \(no\. 2\) is empty"):
        stream_from_file(empty)
    # pandas' to_csv with its index: the header's first cell is empty, the others are the
    # default column names 0, 1, 2: a header all the same
    pandas_like = tmp_path / "pandas.csv"
    rows = [",0,1,2"] + [
        f"{i},{a:.17g},{b:.17g},{c:.17g}" for i, (a, b, c) in enumerate(np.column_stack([X, y]))
    ]
    pandas_like.write_text("\n".join(rows) + "\n")
    prob = stream_from_file(pandas_like, inputs=["0", "1"], target="2", shuffle=False)
    assert prob.X_stream.shape[0] + prob.X_test.shape[0] == 20
    # look-alikes: a headerless two-column file whose first row misses its input is data, and
    # a header of digits int() cannot read is a header, not a traceback
    two = tmp_path / "two.csv"
    two.write_text(",0\n" + "\n".join(f"{a:.6f},{b:.6f}" for a, b in X) + "\n")
    with pytest.raises(DataFileError, match=r"line 1, column '0' \(no\. 1\) is empty"):
        stream_from_file(two)
    odd = tmp_path / "odd.csv"
    odd.write_text(",0,\u00b2\n" + "\n".join(f"{i},{a:.6f},{b:.6f}" for i, (a, b) in enumerate(X)))
    with pytest.warns(UserWarning, match="row numbers"):  # its first column is an index
        prob = stream_from_file(odd)  # a header with an odd name, read as one
    assert prob.X_stream.shape[0] + prob.X_test.shape[0] == 20


def test_a_pandas_index_column_is_no_default_input(tmp_path):
    """A frame written by pandas' to_csv keeps its index as an unnamed first column of row
    numbers; by default it was read as an input (a d + 1 model on row numbers). It is now left
    out with a warning, the problem equals the one from the file without it, and --inputs still
    reaches it."""
    X, y = _data(n=30, d=3)
    plain = tmp_path / "plain.csv"
    _write_csv(plain, X, y)
    indexed = tmp_path / "indexed.csv"
    lines = plain.read_text().splitlines()
    indexed.write_text(
        "\n".join(["," + lines[0]] + [f"{i},{row}" for i, row in enumerate(lines[1:])]) + "\n"
    )
    want = stream_from_file(plain, seed=3)
    with pytest.warns(UserWarning, match="holds the row numbers .*index=False") as caught:
        got = stream_from_file(indexed, seed=3)
    assert caught[0].filename == __file__  # points at the caller's line
    assert got.X_stream.shape[1] == 3
    for name in ("X_stream", "y_stream", "X_test", "y_test"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    with pytest.warns(UserWarning, match="row numbers"):
        pool = pool_from_file(indexed, test_fraction=0.2)
    assert pool.X_pool.shape[-1] == 3
    chosen = stream_from_file(indexed, inputs=["", "x0"], seed=3)  # named: used as asked
    assert chosen.X_stream.shape[1] == 2
    # an unnamed first column that is not 0, 1, 2, ... or 1, 2, 3, ... is data, kept as an input
    shifted = tmp_path / "shifted.csv"
    shifted.write_text(
        "\n".join(["," + lines[0]] + [f"{i + 2},{row}" for i, row in enumerate(lines[1:])]) + "\n"
    )
    assert stream_from_file(shifted, seed=3).X_stream.shape[1] == 4
    # R's write.csv numbers rows from 1; pandas names an index it read back "Unnamed: 0"
    r_style = tmp_path / "r.csv"
    r_style.write_text(
        "\n".join(["," + lines[0]] + [f"{i + 1},{row}" for i, row in enumerate(lines[1:])]) + "\n"
    )
    again = tmp_path / "again.csv"
    again.write_text(indexed.read_text().replace(",x0", "Unnamed: 0,x0", 1))
    for path in (r_style, again):
        with pytest.warns(UserWarning, match="holds the row numbers"):
            assert stream_from_file(path, seed=3).X_stream.shape[1] == 3
    # a series written with its index (t, y): the index is the only input, so it stays
    series = tmp_path / "series.csv"
    series.write_text(",y\n" + "\n".join(f"{i},{v:.6f}" for i, v in enumerate(y)) + "\n")
    assert stream_from_file(series).X_stream.shape[1] == 1
    # a run saved before the rule (its spec has no drop_row_index) is rebuilt as it ran
    spec = dict(got.spec)
    assert spec.pop("drop_row_index") is True
    assert problem_from_spec(spec).X_stream.shape[1] == 4


def test_a_comma_at_the_end_of_every_line_is_no_column(tmp_path):
    """A file whose lines all end in a comma read as one more, empty, column: the default
    target was that column and the run stopped with 'column '' (no. 4) is empty'. It now reads
    as the file without the commas; a comma missing from one line is still a short row."""
    X, y = _data(n=30, d=3)
    plain = tmp_path / "plain.csv"
    _write_csv(plain, X, y)
    lines = plain.read_text().splitlines()
    trailing = tmp_path / "trailing.csv"
    trailing.write_text("\n".join(line + "," for line in lines) + "\n")
    want, got = stream_from_file(plain, seed=1), stream_from_file(trailing, seed=1)
    for name in ("X_stream", "y_stream", "X_test", "y_test"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("\n".join(line + ("," if i != 5 else "") for i, line in enumerate(lines)))
    with pytest.raises(DataFileError, match="line 6 has 4 fields, expected 5"):
        stream_from_file(ragged)


def test_a_text_cell_is_reported_with_advice_for_its_columns_role(tmp_path):
    """Text in the target was answered with advice for an input ('leave it out with --inputs'),
    which cannot help; the advice now fits the role (a regression target must be numeric; text
    class labels are read by --task classification)."""
    X, y = _data(n=20, d=2)
    labels = tmp_path / "labels.csv"
    labels.write_text(
        "x0,x1,label\n"
        + "\n".join(f"{a:.6f},{b:.6f},{'yes' if t > 0 else 'no'}" for (a, b), t in zip(X, y))
    )
    for target in (None, "label"):
        with pytest.raises(DataFileError) as err:
            stream_from_file(labels, target=target)
        assert "line 2, column 'label' (no. 3)" in str(err.value)
        assert "pass --task classification" in str(err.value)
        assert "--inputs" not in str(err.value)
    with pytest.raises(DataFileError, match=r"'(yes|no)' is not a number; only numeric columns .*"):
        stream_from_file(labels, inputs=["x0", "label"], target="x1")
    mask = tmp_path / "mask.csv"
    mask.write_text("\n".join(["1", "0", "x"] + ["0"] * 17))
    plain = tmp_path / "plain.csv"
    _write_csv(plain, X, y)
    with pytest.raises(DataFileError, match=r"'x' is not a number; the test mask must hold 0 or"):
        stream_from_file(plain, test_mask=str(mask))


def test_a_text_target_of_a_pool_is_not_told_of_an_option_active_lacks(tmp_path, capsys):
    """A pool's text target was told "class labels: pass --task classification", an option
    `bo-online active` does not have (it answered "No such option: --task"); a pool's target
    must be numeric, and the message says so without advising that option."""
    X, _ = _data(n=20, d=2)
    path = tmp_path / "labels.csv"
    path.write_text(
        "x0,x1,label\n"
        + "\n".join(f"{a!r},{b!r},{'yes' if a > 1 else 'no'}" for a, b in X.tolist())
        + "\n"
    )
    with pytest.raises(DataFileError, match=r"is not a number; the target of a pool must be"):
        pool_from_file(path)
    with pytest.raises(SystemExit) as code:
        main(["active", "--pool", str(path), "--steps", "1", "-Q", "--no-plots"])
    err = capsys.readouterr().err
    assert code.value.code == 2 and "line 2, column 'label'" in err and "--task" not in err, err


def test_cli_options_for_shipped_sets_are_refused_with_a_users_file(tmp_path, capsys):
    """--tracks / --test-size (the magnetometer pool) with --pool FILE, and --split (the UCI
    sets) with --data FILE, were silently ignored: now one-line errors naming the way on."""
    X, y = _data(n=40, d=2)
    path = tmp_path / "mine.csv"
    _write_csv(path, X, y)
    cases = [
        (["active", "--pool", str(path), "--tracks", "1,2"], "--tracks only applies"),
        (["active", "--pool", str(path), "--test-size", "5"], "--test-size only applies"),
        (["active", "--pool", str(path), "--test-size", "0"], "--test-size only applies"),
        (["active", "--pool", str(path), "--tracks", ""], "--tracks only applies"),
        (["stream", "--data", str(path), "--split", "3"], "--split only applies"),
        (["stream", "--problem", "banana", "--split", "3"], "banana has one fixed split"),
    ]
    for argv, expected in cases:
        code, err = _run(argv + ["--steps", "1", "--out", str(tmp_path / "run")], capsys)
        assert code == 2 and expected in err, err
        assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("model", ["exact", "tsvgp"])
def test_stream_refit_from_current_resumes_as_it_ran(tmp_path, capsys, model):
    """``--refit-from current`` (one warm optimisation step per point, the WISKI paper's
    stream schedule) is stored with the run: a resumed run refits as the unbroken one did, and a
    value outside {auto, current} is refused before anything runs."""
    X, y = _data(n=70, d=4)
    path = tmp_path / "mine.csv"
    _write_csv(path, X, y)
    base = [
        "stream", "--data", str(path), "--model", model, "--n-init", "10", "--eval-every", "10",
        "--refit-every", "1", "--fit-max-iter", "1", "--refit-from", "current", "-Q",
        "--no-plots",
    ]  # fmt: skip
    full, part = tmp_path / "full", tmp_path / "part"
    main(base + ["--out", str(full)])
    main(base + ["--out", str(part), "--steps", "20"])
    assert json.loads((part / history.CONFIG_FILE).read_text())["refit_from"] == "current"
    main(["resume", str(part), "--steps", str(len(read_records(full)) - 1), "-Q", "--no-plots"])
    assert without_timing(read_records(part)) == without_timing(read_records(full))
    assert all(r["refit"] for r in read_records(full))
    bad = [("warm" if a == "current" else a) for a in base]
    code, err = _run(bad + ["--out", str(tmp_path / "bad")], capsys)
    assert code == 2 and "--refit-from must be one of auto, current" in err
    assert not (tmp_path / "bad").exists()


def test_npz_missing_values_count_only_in_used_columns_and_complex_is_refused(tmp_path):
    """As for a CSV, a NaN in a column of an .npz 'data' array that the run leaves out does no
    harm, and one in a used column is refused naming row and column; complex arrays are refused
    (casting them kept the real part silently)."""
    X, y = _data(n=30)
    data = np.column_stack([X[:, :2], np.full(30, np.nan), X[:, 2:], y])
    data[4, 2] = 1.0
    np.savez(tmp_path / "d.npz", data=data)
    problem = stream_from_file(tmp_path / "d.npz", inputs=[0, 1, 3, 4])
    reference = stream_from_file(_write_plain(tmp_path, X, y))
    torch.testing.assert_close(problem.X_stream, reference.X_stream)
    torch.testing.assert_close(problem.y_test, reference.y_test)
    with pytest.raises(DataFileError, match=r"row 0 \(0-based\), column '2' is nan"):
        stream_from_file(tmp_path / "d.npz")
    np.savez(tmp_path / "c.npz", X=X * (1 + 1j), y=y)
    with pytest.raises(DataFileError, match="arrays must be real, got dtype complex128"):
        stream_from_file(tmp_path / "c.npz")


def test_an_input_whose_range_overflows_is_named_not_called_missing(tmp_path, capsys):
    """An input column spanning -1e308 .. 1e308 (every cell finite) was reported as "X contains
    NaN/inf value(s); remove or impute them", naming neither the file nor the column, when
    only its width overflows float64 in the scaling to the unit cube."""
    X, y = _data(n=30, d=2)
    X[:, 1] = np.linspace(-1.5, 1.5, 30) * 1e308
    path = tmp_path / "wide.csv"
    _write_csv(path, X, y)
    with pytest.raises(DataFileError, match=r"wide.csv: input column 'x1' spans .* overflows"):
        stream_from_file(path)
    with pytest.raises(DataFileError, match="'x1'"):
        pool_from_file(path)
    out = tmp_path / "run"
    code, err = _run(["stream", "--data", str(path), "--out", str(out), "-Q"], capsys)
    assert code == 2 and err.count("\n") == 1 and "rescale" in err, err
    assert not out.exists()


def test_a_file_not_in_utf8_is_named_with_its_line_and_what_to_do(tmp_path, capsys):
    """A CSV saved in Latin-1 / Windows-1252 (Excel's plain "CSV" on Windows), an accented
    header such as 'tempér', was refused with the decoder's 'can't decode byte 0xe9 in position
    N' (a position in a read buffer, not the line) and no advice; the message now names the
    line and says to save the file as UTF-8."""
    X, y = _data(n=20, d=2)
    path = tmp_path / "latin1.csv"
    lines = ["x0,x1,tempér"] + [f"{a:.6f},{b:.6f},{t:.6f}" for (a, b), t in zip(X, y)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert stream_from_file(path, target="tempér").X_test.shape == (2, 2)  # UTF-8 reads
    path.write_bytes(("\n".join(lines) + "\n").encode("latin-1"))
    with pytest.raises(DataFileError) as err:
        stream_from_file(path)
    assert str(err.value) == (
        f"{path}: line 1 is not UTF-8 text (byte 0xe9); save the file as UTF-8 (Excel: "
        "'CSV UTF-8'; or iconv -f latin1 -t utf-8)."
    )
    gz = tmp_path / "latin1.csv.gz"
    with gzip.open(gz, "wb") as f:
        f.write(("\n".join(lines[1:12] + ["0.5,0.25,tempér"] + lines[12:]) + "\n").encode("cp1252"))
    with pytest.raises(DataFileError, match=r"latin1\.csv\.gz: line 12 is not UTF-8 text \(byt"):
        pool_from_file(gz)
    out = tmp_path / "run"
    code, err = _run(["stream", "--data", str(path), "--out", str(out), "-Q"], capsys)
    assert code == 2 and err.count("\n") == 1 and "line 1 is not UTF-8" in err, err
    assert not out.exists()


def test_active_with_more_initial_points_than_pool_rows_names_the_file(tmp_path, capsys):
    """`bo-online active --pool small.csv` (default --n-init 10) on a file of 10 rows ended in
    'n_init=10 exceeds the pool size 9.', naming neither the option nor the file; as a stream
    does, it now names both and what to give. With a --pool-size below --n-init, the message
    said the file held only that many pool rows and advised a smaller --n-init alone."""
    X, y = _data(n=10, d=2)
    path = tmp_path / "small.csv"
    _write_csv(path, X, y)
    out = tmp_path / "run"
    code, err = _run(["active", "--pool", str(path), "--out", str(out), "-Q"], capsys)
    assert code == 2 and err == (
        f"bo-online: error: --n-init 10 exceeds the pool: {path} has 9 pool rows (the rows not "
        "held out for testing); give --n-init 9 or fewer.\n"
    )
    assert not out.exists()

    # a --pool-size below --n-init: the file holds enough rows, the option is the limit
    code, err = _run(
        ["active", "--pool", str(path), "--pool-size", "4", "--out", str(out), "-Q"], capsys
    )
    assert code == 2 and err == (
        "bo-online: error: --n-init 10 exceeds the pool: --pool-size keeps 4 points; give "
        "--n-init 4 or fewer, or a larger --pool-size.\n"
    )
    assert not out.exists()


def test_semicolon_file_with_decimal_commas_says_to_save_it_comma_separated(tmp_path):
    """A European Excel CSV ('a;b;target' with decimal commas, '0,5;1,25;3,0') reads as one
    header field and rows split at the decimal commas; it was refused with 'line 2 has 4
    fields, expected 1 (as in line 1).', which does not say what is wrong with the file."""
    X, y = _data(n=20, d=2)
    path = tmp_path / "semi.csv"
    rows = [";".join(f"{v:.4f}".replace(".", ",") for v in r) for r in np.column_stack([X, y])]
    path.write_text("x0;x1;target\n" + "\n".join(rows) + "\n")
    with pytest.raises(DataFileError) as err:
        stream_from_file(path)
    assert str(err.value) == (
        f"{path}: line 2 has 4 fields, expected 1 (as in line 1); fields must be separated by "
        "commas: save a file that uses ';' or tabs as comma-separated CSV, with '.' as the "
        "decimal point."
    )
    _write_csv(path, X, y, extra=(5, "1,2"))  # a short row of a comma-separated file: as before
    with pytest.raises(DataFileError, match=r"line 6 has 2 fields, expected 3 \(as in line 1\)\.$"):
        stream_from_file(path)


def test_npz_with_one_input_saved_as_a_vector_reads_as_one_column(tmp_path):
    """An .npz of one input saved as X of shape (n,) was refused ('X must be n x d and y hold n
    values, got X (40,)'), though y may be n or n x 1; it reads as one input column now. A y
    that is not n values is still refused, with the shape it was saved in (it was reported
    flattened)."""
    X, y = _data(n=40, d=2)
    X = X[:, :1]
    np.savez(tmp_path / "vector.npz", X=X[:, 0], y=y[:, None])
    np.savez(tmp_path / "matrix.npz", X=X, y=y)
    got, want = stream_from_file(tmp_path / "vector.npz"), stream_from_file(tmp_path / "matrix.npz")
    for name in ("X_stream", "y_stream", "X_test", "y_test"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert pool_from_file(tmp_path / "vector.npz").X_pool.shape == (36, 1)
    np.savez(tmp_path / "bad.npz", X=X[:20, 0], y=y.reshape(20, 2))
    with pytest.raises(
        DataFileError, match=r"bad\.npz: X must be .* got X \(20,\) and y \(20, 2\)"
    ):
        stream_from_file(tmp_path / "bad.npz")


def test_a_directory_without_a_data_suffix_is_called_a_directory(tmp_path, capsys):
    """`--data my_data/` (the folder that holds the file) was refused as 'unsupported file type;
    give a .csv, .csv.gz or .npz file', the suffix being checked before the path: a folder is
    now named as one whatever its name, for --data and --pool, and a --test-mask folder too
    (it was 'no such file')."""
    folder = tmp_path / "my_data"
    folder.mkdir()
    with pytest.raises(DataFileError) as err:
        stream_from_file(folder)
    assert str(err.value) == (
        f"{folder} is a directory; name the data file in it (.csv, .csv.gz or .npz)."
    )
    out = tmp_path / "run"
    code, err = _run(["active", "--pool", str(folder), "--out", str(out), "-Q"], capsys)
    assert code == 2 and "my_data is a directory; name the data file in it" in err
    X, y = _data(n=20, d=2)
    _write_csv(tmp_path / "d.csv", X, y)
    masks = tmp_path / "masks.csv"
    masks.mkdir()
    with pytest.raises(DataFileError, match=r"masks\.csv is a directory; name the test-mask file"):
        stream_from_file(tmp_path / "d.csv", test_mask=str(masks))
    assert not out.exists()


def test_a_file_too_small_for_its_test_fraction_says_which_fractions_work(tmp_path, capsys):
    """A file of 4 rows at the default test fraction 0.1 (0 test rows) was refused with 'a test
    fraction of 0.1 leaves no test or no training rows of 4.', and one of a single row the same
    way, neither saying what to do; the message now gives the fractions that work, or says
    that one row is too few."""
    X, y = _data(n=4, d=2)
    path = tmp_path / "four.csv"
    _write_csv(path, X, y)
    with pytest.raises(DataFileError) as err:
        stream_from_file(path)
    assert str(err.value) == (
        f"{path}: a test fraction of 0.1 of its 4 rows leaves no test row or no training row; "
        "give a test fraction (--test-fraction) from 0.25 to 0.75, or mark the test rows "
        "(--test-mask)."
    )
    assert pool_from_file(path, test_fraction=0.25).X_test.shape == (1, 2)
    assert pool_from_file(path, test_fraction=0.75).X_pool.shape == (1, 2)
    one = tmp_path / "one.csv"
    _write_csv(one, X[:1], y[:1])
    out = tmp_path / "run"
    code, err = _run(["stream", "--data", str(one), "--out", str(out), "-Q"], capsys)
    assert code == 2 and err == (
        f"bo-online: error: {one}: holds 1 data row; a run needs at least 2 (one to learn from, "
        "one to test on).\n"
    )
    assert not out.exists()


def test_a_constant_input_column_of_large_values_gets_a_box(tmp_path):
    """A constant input column gets width 1, but at 1e20 (or a constant timestamp in ns,
    1.7e18) lo + 1 rounds back to lo: the box had width 0 and the file was refused with
    "bounds need finite lower < upper", naming neither the file nor the column. Such a column
    now gets a box as every constant column does, and maps to 0 in the unit cube."""
    X, y = _data(n=30, d=2)
    X[:, 1] = 1.7e18
    path = tmp_path / "const.csv"
    _write_csv(path, X, y)
    for problem in (stream_from_file(path), pool_from_file(path)):
        assert bool((problem.bounds[1] > problem.bounds[0]).all())
        X_all = problem.X_stream if hasattr(problem, "X_stream") else problem.X_pool
        U = to_unit(X_all, problem.bounds)
        assert bool((U[:, 1] == 0).all()) and bool(((U >= 0) & (U <= 1)).all())


def test_lines_are_counted_in_the_file_past_quoted_fields_that_span_lines(tmp_path):
    """A quoted notes cell holding a line break (as spreadsheets export them) made every later
    line number count CSV records, not file lines: a bad cell on line 8 was reported on
    line 5, and a short row likewise."""
    X, y = _data(n=6, d=2)
    rows = [f'{a:.6g},{b:.6g},"first\nsecond",{t:.6g}' for (a, b), t in zip(X, y)]
    lines = ["x0,x1,notes,target"] + rows[:3] + ["1,2,ok,abc"] + rows[3:]
    path = tmp_path / "notes.csv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFileError, match=r"line 8, column 'target' \(no. 4\): 'abc'"):
        stream_from_file(path, inputs=["x0", "x1"])
    lines[4] = "1,2"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFileError, match=r"line 8 has 2 fields, expected 4 \(as in line 1\)"):
        stream_from_file(path, inputs=["x0", "x1"])


def test_a_target_too_large_for_the_model_is_named_before_anything_runs(tmp_path, capsys):
    """A target cell of 1e200 (every cell finite) passed the file's checks; the model refused it
    only when that row arrived, mid-stream, with "Y holds values of magnitude up to 1e+200 ...
    Rescale Y", naming neither the file, the line nor the column, after records were written.
    It is refused with the file, line and column before anything runs; class labels may be
    any two values."""
    X, y = _data(n=30, d=2)
    y[20] = -1e200
    path = tmp_path / "huge.csv"
    _write_csv(path, X, y)
    pattern = r"huge.csv: line 22, column 'target' \(no. 3\) is -1e\+200.*rescale"
    for build in (stream_from_file, pool_from_file):
        with pytest.raises(DataFileError, match=pattern):
            build(path)
    labels = np.where(y > 0, 1e200, 0.0)
    _write_csv(path, X, labels)
    assert stream_from_file(path, task="classification").y_stream.max() == 1.0
    _write_csv(path, X, y)
    out = tmp_path / "run"
    argv = ["stream", "--data", str(path), "--n-init", "5", "--out", str(out), "-Q"]
    code, err = _run(argv, capsys)
    assert code == 2 and err.count("\n") == 1 and "line 22" in err, err
    assert not out.exists()


def test_an_npz_mask_file_of_one_vector_is_one_mask_column(tmp_path):
    """A test mask saved as it is held, `np.savez("mask.npz", test_mask=m)` with `m` a vector
    of booleans or 0/1, was refused ("array 'test_mask' must be n x k", or "arrays must be
    numeric, got dtype bool"), though a mask file is "a file with one 0/1 column"."""
    X, y = _data(n=30, d=2)
    data = tmp_path / "data.csv"
    _write_csv(data, X, y)
    test = np.arange(30) % 5 == 0
    for mask in (test, test.astype(np.int64)):
        np.savez(tmp_path / "mask.npz", test_mask=mask)
        prob = stream_from_file(data, test_mask=str(tmp_path / "mask.npz"))
        torch.testing.assert_close(prob.X_test, torch.tensor(X[test]))


def test_an_empty_test_mask_is_named_as_such(tmp_path):
    """`--test-mask ''` was taken for the current directory: ' is a directory; name the
    test-mask file in it', a message that starts with a blank name."""
    X, y = _data(n=20, d=2)
    path = tmp_path / "d.csv"
    _write_csv(path, X, y)
    for empty in ("", "  "):
        with pytest.raises(DataFileError, match=r"^The test mask is empty; give a 0/1 column"):
            stream_from_file(path, test_mask=empty)


# Each file read by numpy's C reader where every cell is a finite number ("fast"), else cell by
# cell ("careful"); both must give the same table, messages and file lines.
_CSV_TEXTS = {
    "plain": ("a,b,c\n1,2,3\n4,5,6\n", "fast"),
    "no header": ("1,2,3\n4,5,6\n", "fast"),
    "CRLF": ("a,b\r\n1,2\r\n3,4\r\n", "fast"),
    "BOM": ("\ufeffa,b\n1,2\n3,4\n", "fast"),
    "spaces": ("a, b\n 1 , 2\n3 ,4 \n", "fast"),
    "quoted": ('a,"b,c"\n"1.5",2\n3,"4"\n', "fast"),
    "blank line": ("a,b\n1,2\n\n3,4\n", "fast"),
    "hard numbers": (
        "a,b\n1e-310,+3\n.5,5.\n4.35000000000000017763568394002504646778106689453125,-0\n"
        "9007199254740993,0.30000000000000004\n",
        "fast",
    ),
    "pandas index": (",0,1\n0,1.5,2\n1,3,4\n", "fast"),
    "one column": ("y\n1\n2\n", "fast"),
    "quoted line break": ('a,b\n"1\n",2\n3,4\n', "fast"),
    "blank spaces line": ("a,b\n1,2\n   \n3,4\n", "careful"),
    "blank lines first": ("\n\na,b\n1,2\n", "careful"),
    "trailing commas": ("a,b,\n1,2,\n3,4,\n", "careful"),
    "hash": ("a,b\n#1,2\n3,4\n", "careful"),
    "nan": ("a,b\n1,nan\n3,4\n", "careful"),
    "inf": ("a,b\n1,inf\n3,4\n", "careful"),
    "empty cell": ("a,b\n1,\n3,4\n", "careful"),
    "short row": ("a,b,c\n1,2,3\n4,5\n", "careful"),
    "long rows": ("a,b\n1,2,3\n4,5,6\n", "careful"),
    "text": ("a,b\n1,x\n3,y\n", "careful"),
    "underscore": ("a,b\n1_0,2\n3,4\n", "careful"),
    "header only": ("a,b\n", "careful"),
    "header over two lines": ('"a\nx",b\n1,2\n', "careful"),
    "semicolons": ("a;b\n1;2\n", "careful"),
}


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("name", sorted(_CSV_TEXTS))
def test_the_fast_csv_reader_gives_the_careful_readers_table(tmp_path, monkeypatch, name, gz):
    """Every cell was parsed by Python, one at a time (a 100,000 x 12 file: about 10 s and 110
    MB, against 1 s and 11 MB by numpy's reader). A file of finite numbers now takes numpy's
    reader; anything else falls back to the careful one, and both give the same values (to
    the bit), columns, problems, text cells and file lines of the rows."""
    from bo_online import userdata

    text, expected = _CSV_TEXTS[name]
    path = tmp_path / ("f.csv.gz" if gz else "f.csv")
    if gz:
        with gzip.open(path, "wb") as f:
            f.write(text.encode("utf-8"))
    else:
        path.write_bytes(text.encode("utf-8"))
    opener = gzip.open if gz else open
    assert (userdata._read_numeric_csv(path, opener) is not None) == (expected == "fast")

    def read():
        try:
            t = userdata._read_csv(path, gz)
        except DataFileError as e:
            return str(e)
        rows = [t.where(r) for r in range(len(t.data))]
        return t.data.tobytes(), t.columns, rows, sorted(t.problems.items()), t.text

    fast = read()
    monkeypatch.setattr(userdata, "_read_numeric_csv", lambda *args: None)
    assert fast == read()


def test_a_damaged_or_truncated_gzip_file_is_one_data_file_error(tmp_path):
    """A .csv.gz cut short (an interrupted download) or with a damaged byte raised gzip's own
    EOFError / zlib.error, a traceback without the file's name."""
    X, y = _data(n=400, d=3)
    whole = tmp_path / "whole.csv"
    _write_csv(whole, X, y)
    packed = gzip.compress(whole.read_bytes())
    cut, damaged = tmp_path / "cut.csv.gz", tmp_path / "damaged.csv.gz"
    cut.write_bytes(packed[: len(packed) // 2])
    flipped = bytearray(packed)
    flipped[40] ^= 0xFF
    damaged.write_bytes(bytes(flipped))
    for path in (cut, damaged):
        with pytest.raises(DataFileError, match=r"the compressed file is damaged or incomplete"):
            stream_from_file(path)


def test_cli_resume_that_would_outgrow_memory_is_refused(tmp_path, capsys, monkeypatch):
    """``bo-online resume --steps`` can extend a dense-model run far past what it started for;
    its last n x n matrices must fit as a new run's must (the check ran only when a run
    started). Refused before the run goes on, with the run's files as they were."""
    from bo_online.cli import memory as cli
    from bo_online.loops import history

    out = tmp_path / "run"
    argv = ["bo", "--problem", "branin", "--steps", "2", "--out", str(out), "-Q", "--no-plots"]
    code, err = _run(argv, capsys)
    assert code == 0, err
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    # the run ends at n = 5 + 2; 139 steps more reach n = 146 (0.68 MB of float64 matrices)
    monkeypatch.setattr(cli, "_memory_bytes", lambda device="cpu": 500_000)
    code, err = _run(["resume", str(out), "--steps", "141", "-Q", "--no-plots"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "--model exact holds an n x n factor" in err and "(n = 146)" in err
    assert "or stop earlier with a smaller --steps." in err
    # (the lock of the loaded run is this process's until it exits, as the command's is)
    assert {f.name: f.read_bytes() for f in out.iterdir() if f.name != ".lock"} == before
    # what fits goes on: one more step ends at n = 8
    code, err = _run(["resume", str(out), "--steps", "3", "-Q", "--no-plots"], capsys)
    assert code == 0, err
    ckpt = history.load_checkpoint(out / history.CHECKPOINT_FILE)
    assert ckpt["step_count"] == 3


def test_a_mask_of_every_row_or_none_names_where_it_came_from_and_what_to_do(tmp_path):
    """A mask marking every row (nothing to learn from) or none (nothing to test on) was
    refused as "DATA: the test mask must mark some but not all rows", naming the data file
    even where the mask came from a file of its own, and not saying which of the two it was."""
    X, y = _data(n=30, d=2)
    path = tmp_path / "d.csv"
    _write_csv(path, X, y)
    mask_file = tmp_path / "all.csv"
    np.savetxt(mask_file, np.ones(30), fmt="%d")
    with pytest.raises(DataFileError, match=r"\(.*all\.csv\) marks all 30 rows of .*d\.csv as"):
        pool_from_file(path, test_mask=str(mask_file))
    np.savez(tmp_path / "m.npz", X=X, y=y, test_mask=np.zeros(30))
    with pytest.raises(
        DataFileError, match=r"\(.*m\.npz's test_mask array\) marks none of the 30 rows"
    ) as info:
        stream_from_file(tmp_path / "m.npz")
    # the array is in the file, not an option to leave out: a test fraction overrides it
    assert "(or give a test fraction (--test-fraction), which ignores the array)" in str(info.value)
    assert stream_from_file(tmp_path / "m.npz", test_fraction=0.1).X_test.shape[0] == 3
    np.savetxt(mask_file, np.zeros(30), fmt="%d")
    with pytest.raises(DataFileError, match=r"none .* \(or leave the mask out: a random tenth"):
        pool_from_file(path, test_mask=str(mask_file))
    col = tmp_path / "c.csv"
    _write_csv(col, X, y, extra=None)
    text = col.read_text().splitlines()
    col.write_text("\n".join([text[0] + ",is_test"] + [r + ",1" for r in text[1:]]) + "\n")
    with pytest.raises(DataFileError, match=r"\(column 'is_test' of .*c\.csv\) marks all 30"):
        stream_from_file(col, target="target", test_mask="is_test")


def test_a_mask_column_wins_over_a_file_of_the_same_name(tmp_path, monkeypatch):
    """``--test-mask is_test`` names a column of the data file; a file called ``is_test`` in the
    working directory (where a run might be resumed from) was read instead, silently moving
    rows between the pool and the test set."""
    X, y = _data(n=30, d=2)
    col = tmp_path / "c.csv"
    _write_csv(col, X, y)
    flags = (np.arange(30) % 5 == 0).astype(int)
    text = col.read_text().splitlines()
    rows = [f"{r},{f}" for r, f in zip(text[1:], flags)]
    col.write_text("\n".join([text[0] + ",is_test", *rows]) + "\n")
    monkeypatch.chdir(tmp_path)
    np.savetxt(tmp_path / "is_test", (np.arange(30) % 2).astype(int), fmt="%d")
    prob = pool_from_file(col, target="target", test_mask="is_test")
    assert prob.X_test.shape[0] == flags.sum() == 6
    np.testing.assert_allclose(prob.y_test.numpy(), y[flags == 1], atol=1e-12)
    assert prob.spec["test_mask"] == "is_test" and "test_mask_sha256" not in prob.spec


def test_cli_resume_memory_check_takes_the_steps_a_stream_can_run(tmp_path, capsys, monkeypatch):
    """The resume's memory check read the target from the checkpoint alone: a --steps beyond
    what a stream holds was refused as a run that 'by its end (n = 1,000,010)' outgrows memory
    (advising --model tsvgp), an n the stream can never reach, instead of naming the stream's
    limit; and a stream driven by ``step()`` from Python (no target in its checkpoint), which a
    resume runs to its end, was not checked at all."""
    from bo_online.cli import memory as cli
    from bo_online.loops.streaming import StreamingLoop

    X, y = _data(n=40, d=2)
    data = tmp_path / "rows.csv"
    _write_csv(data, X, y)
    out = tmp_path / "run"
    loop = StreamingLoop(
        stream_from_file(data, test_fraction=0.25),
        model="exact",
        n_init=10,
        refit_every=0,
        init_fit_max_iter=5,
        out_dir=out,
        quiet=True,
    )
    for _ in range(2):
        loop.step()
    loop.save_checkpoint()
    # 30 stream rows: the run ends at n = 30, 28.8 kB of float64 matrices
    monkeypatch.setattr(cli, "_memory_bytes", lambda device="cpu": 20_000)
    code, err = _run(["resume", str(out), "--steps", "1000000", "-Q", "--no-plots"], capsys)
    assert code == 2 and "exceeds the 20 steps the data hold" in err, err
    code, err = _run(["resume", str(out), "-Q", "--no-plots"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "--model exact holds an n x n factor" in err and "(n = 30)" in err
    # what fits goes on
    code, err = _run(["resume", str(out), "--steps", "3", "-Q", "--no-plots"], capsys)
    assert code == 0, err


def test_a_missing_value_marker_among_text_labels_is_named_as_a_missing_label(tmp_path):
    """A label column of ``yes`` / ``no`` (or 0 / 1) with an ``NA`` or ``null`` cell was
    refused as a column of three classes ("found 3 values ... name a column of two classes"),
    pointing at the column rather than at the row with the missing label."""
    X, _ = _data(n=30, d=2)
    path = tmp_path / "labels.csv"
    for names, marker in ((("no", "yes"), "NA"), (("0", "1"), "NA"), (("b", "a"), " null")):
        _write_text_labels(path, X, np.arange(30) % 2, names)
        lines = path.read_text().splitlines()
        lines[8] = lines[8].rsplit(",", 1)[0] + "," + marker  # data row 7, line 9
        path.write_text("\n".join(lines) + "\n")
        with pytest.raises(
            DataFileError, match=rf"line 9, target column 'label' holds '{marker.strip()}"
        ):
            stream_from_file(path, task="classification")
    # (a "nan" in a column of numbers is a missing number, as before)
    _write_text_labels(path, X, np.arange(30) % 2, ("0", "1"))
    path.write_text(path.read_text().replace(",1\n", ",nan\n", 1))
    with pytest.raises(DataFileError, match=r"column 'label' \(no. 3\) is nan; drop or fill"):
        stream_from_file(path, task="classification")
    # three real classes are still refused as such
    _write_text_labels(path, X, np.arange(30) % 2, ("no", "yes"))
    path.write_text(path.read_text().replace(",no\n", ",maybe\n", 1))
    with pytest.raises(
        DataFileError,
        match=r"found 3 \(.maybe., .no., .yes.; rows: 1, 14, 15; .maybe. first on line 2\)",
    ):
        stream_from_file(path, task="classification")


def test_one_class_beside_a_missing_label_and_three_classes_beside_one_are_told_apart(tmp_path):
    """A label column of one class with ``NA`` cells (two distinct values) was taken as two
    classes, ``NA`` among them, and a model fitted on it; a column of three real classes with a
    ``none`` cell was refused as holding a missing label, when its fault is the third class."""
    X, _ = _data(n=30, d=2)
    path = tmp_path / "labels.csv"
    _write_text_labels(path, X, np.zeros(30, dtype=int), ("yes", "no"))
    lines = path.read_text().splitlines()
    for row in (5, 12, 20):
        lines[row] = lines[row].rsplit(",", 1)[0] + ",NA"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataFileError, match=r"line 6, target column 'label' holds 'NA', a missing"):
        stream_from_file(path, task="classification")
    labels = np.array(["a", "b", "c"], dtype=object)[np.arange(30) % 3]
    labels[4] = "none"
    rows = (f"{a!r},{b!r},{label}" for (a, b), label in zip(X.tolist(), labels))
    path.write_text("x0,x1,label\n" + "\n".join(rows) + "\n")
    with pytest.raises(
        DataFileError,
        match=r"found 4 \(.a., .b., .c., .none.; rows: 10, 9, 10, 1; .none. first on line 6\)",
    ):
        stream_from_file(path, task="classification")


def test_a_stray_third_label_is_named_with_its_line(tmp_path):
    """One row of 0 / 1 labels holding 2 (a typo) was refused as 'found 3 (0, 1, 2; rows: ...)'
    without saying where the 2 is: in a file of thousands of rows the user had to search for it.
    The message names the line of the rarest class's first row (here the 38th data row)."""
    X, _ = _data(n=60, d=2)
    labels = [str(k % 2) for k in range(60)]
    labels[37] = "2"
    rows = (f"{a!r},{b!r},{label}" for (a, b), label in zip(X.tolist(), labels))
    path = tmp_path / "labels.csv"
    path.write_text("x0,x1,label\n" + "\n".join(rows) + "\n")
    lines = path.read_text().splitlines()
    line = next(k + 1 for k, text in enumerate(lines) if text.endswith(",2"))  # by hand
    assert line == 39
    with pytest.raises(DataFileError) as err:
        stream_from_file(path, task="classification")
    assert f"found 3 (0, 1, 2; rows: 30, 29, 1; 2 first on line {line});" in str(err.value)


def test_the_first_bad_cell_is_named_in_file_order_not_by_column_name(tmp_path):
    """Two text columns, 'site' first and 'cat' last, bad on the same line: the message names
    'site' (column 1), the first bad cell in the file, not 'cat' (whose message sorted first).
    (The first column was 'id', now no default input: a row identifier.)"""
    path = tmp_path / "rows.csv"
    path.write_text("site,x,y,cat\nr0,0.5,1.0,a\nr1,0.7,2.0,b\nr2,0.1,0.5,a\n")
    with pytest.raises(DataFileError, match=r"line 2, column 'site' \(no\. 1\): 'r0'"):
        pool_from_file(path, target="y", test_fraction=0.34)  # inputs: site, x, cat
    # the text cells of a later line come after those of an earlier one, whatever the column
    path.write_text("x,z,y,cat\n0.5,1,1.0,a\n0.7,q,2.0,4\n0.1,3,0.5,5\n")
    with pytest.raises(DataFileError, match=r"line 2, column 'cat' \(no\. 4\): 'a'"):
        pool_from_file(path, target="y", test_fraction=0.34)


def test_a_column_name_holding_a_comma_is_named_with_its_index(tmp_path, capsys):
    """--inputs is split at commas, so 'pressure, kPa' arrived as 'pressure' and ' kPa' and
    was refused as "no column 'pressure'", beside a column list that read as one more column;
    the message names the column and the index to give instead, and nothing is written."""
    path = tmp_path / "field.csv"
    rows = ['"temp (C)","pressure, kPa",load'] + [f"{i},{2 * i},{i % 3}" for i in range(12)]
    path.write_text("\n".join(rows) + "\n")
    out = tmp_path / "run"
    argv = ["active", "--pool", str(path), "--inputs", "temp (C),pressure, kPa", "--out", str(out)]
    code, err = _run(argv + ["-Q"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "no column 'pressure' for an input; columns are temp (C), 'pressure, kPa', load" in err
    assert "column 'pressure, kPa' holds a comma" in err and "give it by its index, 1" in err
    assert not out.exists()
    pool = pool_from_file(path, inputs=["temp (C)", "1"], target="load", test_fraction=0.25)
    assert pool.X_pool.shape == (9, 2) and set(pool.X_pool[:, 1].tolist()) <= set(range(0, 24, 2))


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be"])
def test_a_utf16_file_is_told_to_be_converted_from_utf16(tmp_path, capsys, encoding):
    """Excel's 'Unicode text' is UTF-16 with a byte-order mark: it was told to convert from
    Latin-1 (iconv -f latin1), which turns it into text with a NUL byte in every character."""
    path = tmp_path / "unicode.csv"
    text = "a,b,y\n" + "".join(f"{i},{i + 1},{i % 2}\n" for i in range(8))
    data = text.encode(encoding)
    path.write_bytes(data if data[:2] in (b"\xff\xfe", b"\xfe\xff") else b"\xfe\xff" + data)
    with pytest.raises(DataFileError, match=r"is UTF-16 text .* iconv -f utf-16 -t utf-8\)\."):
        pool_from_file(path)
    code, err = _run(["active", "--pool", str(path), "--out", str(tmp_path / "run"), "-Q"], capsys)
    assert code == 2 and "latin1" not in err and not (tmp_path / "run").exists(), err


def test_a_row_of_text_only_is_told_to_be_deleted_not_the_column_encoded(tmp_path, capsys):
    """A units row under the header (or a header repeated where two files were joined) was
    reported as a text cell of the target or an input, with advice to encode or leave out a
    column that is numeric; the message now says that the line holds no number and should go."""
    rows = [f"{i},{20 + i / 2},{3 + i % 3}" for i in range(1, 9)]
    units = tmp_path / "units.csv"
    units.write_text("\n".join(["time,temp,load", "s,C,kN", *rows]) + "\n")
    out = tmp_path / "run"
    code, err = _run(["active", "--pool", str(units), "--out", str(out), "-Q"], capsys)
    assert code == 2 and err.count("\n") == 1 and not out.exists(), err
    assert "line 2, column 'load' (no. 3): 'kN' is not a number; line 2 holds no number" in err
    assert "delete that line." in err and "must be numeric" not in err
    joined = tmp_path / "joined.csv"
    joined.write_text("\n".join(["time,temp,load", *rows, "time,temp,load", *rows]) + "\n")
    with pytest.raises(DataFileError, match=r"line 10, .* line 10 holds no number in any column"):
        stream_from_file(joined, inputs=["time", "temp"], target="load")
    # a row of missing-value markers is missing data, and a text cell beside numbers is a cell
    for bad in ("NA,NA,NA", "s,C,3"):
        path = tmp_path / "bad.csv"
        path.write_text("\n".join(["time,temp,load", bad, *rows]) + "\n")
        with pytest.raises(DataFileError, match="line 2, column ") as info:
            pool_from_file(path)
        assert "holds no number" not in str(info.value)


@pytest.mark.parametrize("marker", ["NA", "N/A", "null", "?"])
@pytest.mark.parametrize("column", ["x", "y"])
def test_a_missing_value_marker_in_a_numeric_column_is_called_missing(tmp_path, marker, column):
    """R's write.csv writes NA for a missing value: such a cell of an input was told to be
    encoded or left out with --inputs, one of the target that the target must be numeric;
    both are now told, as an empty or NaN cell is, to drop or fill the rows."""
    rows = [f"{i},{i % 4},{2 * i}" for i in range(10)]
    rows[3] = f"3,{marker},6" if column == "x" else f"3,3,{marker}"
    path = tmp_path / "from_r.csv"
    path.write_text("\n".join(["t,x,y", *rows]) + "\n")
    pattern = rf"line 5, column '{column}' .*: '{re.escape(marker)}' is not a number; it marks a "
    pattern += "missing value: drop or fill the rows with missing values."
    with pytest.raises(DataFileError, match=pattern) as info:
        pool_from_file(path, target="y")
    assert "encode" not in str(info.value) and "must be numeric" not in str(info.value)
    with pytest.raises(DataFileError, match=pattern):
        stream_from_file(path, target="y")


def test_a_header_of_column_numbers_read_as_data_is_warned_of(tmp_path):
    """pandas' to_csv(index=False) of a data frame with unnamed columns writes the header
    '0,1,2', which holds no text and so is read as a data row (inputs 0, 1, target 2) without
    a word; a warning now says so and what to do. Whole-number data starting 0, 1, 2 is not
    warned of, nor a file with a header of names."""
    X, y = _data(n=12, d=2)
    body = [",".join(f"{v:.6f}" for v in row) for row in np.column_stack([X, y])]
    path = tmp_path / "frame.csv"
    path.write_text("\n".join(["0,1,2", *body]) + "\n")
    with pytest.warns(UserWarning, match=r"its first row \(0, 1, 2\) is read as data.*to_csv"):
        pool = pool_from_file(path, test_fraction=0.25)
    assert pool.X_pool.shape[0] + pool.X_test.shape[0] == 13  # the rule itself is unchanged
    for text in ("0,1,2\n3,4,5\n6,7,9\n2,2,2\n", "a,b,c\n0,1,2\n" + "\n".join(body) + "\n"):
        path.write_text(text)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            pool_from_file(path, test_fraction=0.25)


def test_whole_number_data_starting_0_1_2_with_a_missing_cell_is_not_warned_of(tmp_path):
    """Whole-number data whose first row happens to be 0, 1, 2 is not warned of as a header of
    column numbers, also where a later cell is missing: the check compared the rows below with
    their rounded values by np.array_equal, which takes NaN for unequal to itself, so one empty
    cell made whole numbers count as 'not whole numbers' and the warning told to delete a row
    of data."""
    path = tmp_path / "counts.csv"
    for missing in ("", "NA"):
        path.write_text(f"0,1,2\n3,4,5\n6,{missing},9\n2,2,2\n")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            table = read_table(path)
        assert table.data.shape == (4, 3)  # the first row is data, as before
    # a text cell below is no whole number: pandas' header above whole-number inputs and text
    # labels is still warned of
    path.write_text("0,1,2\n3,4,yes\n6,7,no\n2,2,yes\n")
    with pytest.warns(UserWarning, match=r"its first row \(0, 1, 2\) is read as data"):
        read_table(path)


@pytest.mark.parametrize(
    "title, fields", [("Logger export", 1), ("# exported by the logger, 2026-11-30", 2)]
)
def test_a_title_line_above_the_header_is_told_to_be_deleted(tmp_path, capsys, title, fields):
    """A title or comment line above the column names (as instrument exports write) was
    taken for the header, and the next line reported as 'line 2 has 3 fields, expected 1 (as
    in line 1).', which said nothing of what to do; a row with a field too many further down
    keeps the plain message."""
    rows = [f"{i},{i / 2},{i % 3}" for i in range(8)]
    path = tmp_path / "export.csv"
    path.write_text("\n".join([title, "t,x,y", *rows]) + "\n")
    out = tmp_path / "run"
    code, err = _run(["stream", "--data", str(path), "--out", str(out), "-Q"], capsys)
    assert code == 2 and err.count("\n") == 1 and not out.exists(), err
    assert f"line 2 has 3 fields, expected {fields} (as in line 1); if line 1 is a title" in err
    assert "or comment above the column names, delete it." in err
    path.write_text("\n".join(["t,x,y", *rows[:3], rows[3] + ",", *rows[4:]]) + "\n")
    with pytest.raises(DataFileError, match=r"line 5 has 4 fields, expected 3 \(as in line 1\)\.$"):
        stream_from_file(path)


def test_a_classification_run_records_which_label_is_class_1(tmp_path):
    """A stream of text labels mapped them to 0 / 1 in sorted order, but neither config.json
    nor the records said which label was class 1 (``pred_prob`` is p(class 1)): the reader had
    to know the rule. The problem spec in config.json now holds the two labels in class order,
    and the run resumes from it."""
    X, _ = _data(n=60, d=2)
    positive = X[:, 0] > 1
    text = tmp_path / "text.csv"
    _write_text_labels(text, X, positive, ("yes", "no"))  # 'yes' where x0 > 1: class 1
    prob = stream_from_file(text, task="classification", seed=1)
    assert prob.spec["classes"] == ["no", "yes"]
    np.testing.assert_array_equal(prob.y_stream.numpy() == 0.0, prob.X_stream[:, 0].numpy() > 1)
    numeric = tmp_path / "numeric.csv"
    _write_csv(numeric, X, np.where(positive, 7.0, -2.0))
    assert stream_from_file(numeric, task="classification").spec["classes"] == [-2.0, 7.0]
    assert "classes" not in stream_from_file(numeric).spec  # regression: no classes
    out = tmp_path / "run"
    loop = StreamingLoop(prob, model="tsvgp", n_init=20, refit_every=0, seed=0, out_dir=out)
    loop.run(steps=3)
    config = json.loads((out / history.CONFIG_FILE).read_text())
    assert config["problem"]["classes"] == ["no", "yes"]
    resumed = load_loop(out)  # the spec's labels do not reach the file reader
    assert torch.equal(resumed.problem.y_stream, prob.y_stream)
    assert resumed.problem.spec["classes"] == ["no", "yes"]


def test_npz_text_arrays_and_other_names_are_refused_with_what_to_do(tmp_path):
    """An .npz whose y holds text class labels (np.savez(path, X=X, y=labels), 'no' / 'yes')
    was refused as 'arrays must be numeric, got dtype <U3', and one of other array names as
    "expected arrays X and y ...; found ['inputs', 'target']", neither saying what to do (text
    labels are read from a CSV only, docs/usage.md). Each now says how to save the file."""
    X, y = _data(n=60, d=4)
    labels = np.where(y > np.median(y), "yes", "no")
    for name, y_saved in (("labels", labels), ("bytes", labels.astype("S3"))):
        np.savez(tmp_path / f"{name}.npz", X=X, y=y_saved)
        with pytest.raises(
            DataFileError,
            match=rf"{name}\.npz: array y holds text \(dtype .[US]3\), and an \.npz must hold "
            r"numbers; save two class labels as 0 / 1 \(e\.g\. \(y == 'yes'\)\.astype\(float\)"
            r"\), or write the data as a CSV, whose text labels --task classification reads\.",
        ):
            stream_from_file(tmp_path / f"{name}.npz", task="classification")
    np.savez(tmp_path / "text_inputs.npz", X=np.where(X > 0, "high", "low"), y=y)
    with pytest.raises(DataFileError, match=r"array X holds text .*encode the text inputs"):
        pool_from_file(tmp_path / "text_inputs.npz")
    np.savez(tmp_path / "odd.npz", inputs=X, target=y)
    with pytest.raises(DataFileError, match=r"found \['inputs', 'target'\]: save the inputs as X"):
        stream_from_file(tmp_path / "odd.npz")


def test_a_classification_summary_names_the_classes_and_the_majority_baseline(tmp_path, capsys):
    """The summary of a classification stream on a file said 'test accuracy 0.99' without
    saying which label is class 1 (the one pred_prob is the probability of) or how the classes
    fall in the test rows, so on a set with 1% positives it read as skill when it is what always
    saying 'no' gets. It now names the classes and the test rows of class 1 (counted here from
    the file's own split), and the majority-class accuracy."""
    X, y = _data(n=120, d=4)
    flags = y > np.quantile(y, 0.8)
    path = tmp_path / "labels.csv"
    rows = (",".join(map(repr, x)) + f",{'yes' if f else 'no'}" for x, f in zip(X.tolist(), flags))
    path.write_text("x0,x1,x2,x3,label\n" + "\n".join(rows) + "\n")
    argv = ["stream", "--data", str(path), "--task", "classification", "--model", "tsvgp"]
    argv += ["--n-init", "90", "--steps", "2", "--no-plots", "--out", str(tmp_path / "run")]
    main(argv)
    text = re.sub(r"[│┃]", "|", capsys.readouterr().out)
    test = stream_from_file(path, task="classification").y_test.numpy()
    ones, m = int(test.sum()), len(test)
    assert m == 12 and 0 < ones < m
    assert re.search(r"classes 0 / 1 \(pred_prob: p\(class 1\)\) +\| +'no' / 'yes'", text), text
    assert re.search(rf"test rows of class 1 +\| +{ones} of {m} ", text), text
    assert re.search(rf"majority-class test accuracy +\| +{max(ones, m - ones) / m:.4g} ", text)


def test_a_third_class_is_counted_and_one_only_in_the_test_rows_is_named(tmp_path):
    """A target of three classes was refused as 'found 3 ('a', 'b', 'c'); ... or use --task
    regression', which neither said that 'c' sits in 4 rows, all of them held out for testing
    (a stray label to drop), nor that only two classes are classified (regression on class
    labels is no answer). Each class is now counted (counted here from the labels written),
    with where one is only in test rows, and merging or dropping rows is offered."""
    X, _ = _data(n=60, d=3)
    labels = np.where(X[:, 0] > 1, "b", "a")
    labels[:4] = "c"
    is_test = np.zeros(60, int)
    is_test[:10] = 1
    path = tmp_path / "three.csv"
    rows = (
        ",".join(map(repr, x)) + f",{label},{t}" for x, label, t in zip(X.tolist(), labels, is_test)
    )
    path.write_text("x0,x1,x2,label,is_test\n" + "\n".join(rows) + "\n")
    a, b = int((labels == "a").sum()), int((labels == "b").sum())
    with pytest.raises(DataFileError) as err:
        stream_from_file(path, target="label", test_mask="is_test", task="classification")
    assert (
        f"found 3 ('a', 'b', 'c'; rows: {a}, {b}, 4; 'c' first on line 2; 'c' only in test rows); "
        "only two classes "
        "are classified: drop or merge the rows of the others" in str(err.value)
    ), err.value


def test_number_classes_are_named_in_full_in_the_summary_and_the_messages(tmp_path, capsys):
    """Class labels that are numbers were shown with 5 (summary) or 6 (messages) significant
    digits: codes 1000001 / 1000002 read '1e+06 / 1e+06' in the summary (which is class 1?)
    and '1e+06' in a refusal. They are now written in full, as the file has them."""
    X, y = _data(n=120, d=4)
    flags = y > np.quantile(y, 0.8)
    path = tmp_path / "codes.csv"
    rows = (
        ",".join(map(repr, x)) + f",{1000002 if f else 1000001}" for x, f in zip(X.tolist(), flags)
    )
    path.write_text("x0,x1,x2,x3,label\n" + "\n".join(rows) + "\n")
    argv = ["stream", "--data", str(path), "--task", "classification", "--model", "tsvgp"]
    argv += ["--n-init", "90", "--steps", "1", "--no-plots", "--out", str(tmp_path / "run")]
    main(argv)
    text = re.sub(r"[│┃]", "|", capsys.readouterr().out)
    assert re.search(r"classes 0 / 1 \(pred_prob: p\(class 1\)\) +\| +1000001 / 1000002 ", text)
    third = path.read_text().replace(",1000001\n", ",1000003\n", 1)
    path.write_text(third)
    with pytest.raises(DataFileError, match=r"found 3 \(1000001, 1000002, 1000003; rows"):
        stream_from_file(path, task="classification")


def test_npz_object_arrays_are_refused_with_their_name_and_what_to_do(tmp_path):
    """An .npz array of Python objects (text labels with a None among them, or text and numbers
    in one array) was refused as 'cannot be read as .npz (Object arrays cannot be loaded when
    allow_pickle=False)', which reads as a broken file and says nothing of what to save. It now
    names the array and says to save numbers or write a CSV."""
    X = np.random.default_rng(0).random((20, 2))
    labels = np.array(["no", "yes"] * 9 + [None, "yes"], dtype=object)
    np.savez(tmp_path / "labels.npz", X=X, y=labels)
    with pytest.raises(DataFileError, match=r"array 'y' holds Python objects.*0 / 1.*CSV"):
        stream_from_file(tmp_path / "labels.npz", task="classification")
    np.savez(tmp_path / "mixed.npz", data=np.array([[1.0, "a"]] * 20, dtype=object))
    with pytest.raises(DataFileError, match=r"array 'data' holds Python objects"):
        stream_from_file(tmp_path / "mixed.npz")
    # an .npy under an .npz name was read as a dict of its first row: "array np.float64(0.0)"
    with open(tmp_path / "plain.npz", "wb") as fh:
        np.save(fh, X)
    with pytest.raises(DataFileError, match=r"is not an .npz archive \(np.savez writes one\)"):
        stream_from_file(tmp_path / "plain.npz")


def _with_columns(path, names, columns) -> None:
    """Write a CSV of a header ``names`` over the ``columns`` (each ``n`` values)."""
    rows = [",".join(f"{v:.17g}" for v in row) for row in np.column_stack(columns)]
    path.write_text("\n".join([",".join(names), *rows]) + "\n")


def test_an_identifier_column_is_no_default_input(tmp_path):
    """A CSV with an ``id`` column (1, 2, ..., n) read it as an input: the model fitted the row
    order, without a word. A column named as a row identifier (id, ID, index, row_id, ...) is
    now left out of the default inputs with a warning naming it and the --inputs that keeps it;
    the problem equals the one from the file without the column; named inputs are used as
    given; a run recorded before the rule resumes on its inputs."""
    X, y = _data(n=40, d=2)
    plain = tmp_path / "plain.csv"
    _write_csv(plain, X, y)
    want = stream_from_file(plain, seed=2)
    ids = np.arange(1, 41.0)
    for name in ("id", "ID", "index", "row_id", "Row No."):
        path = tmp_path / "with_id.csv"
        _with_columns(path, [name, "x0", "x1", "target"], [ids, X, y])
        with pytest.warns(UserWarning) as caught:
            got = stream_from_file(path, seed=2)
        assert len(caught) == 1, [str(w.message) for w in caught]
        text = str(caught[0].message)
        assert f"column {name!r} is named as a row identifier" in text, text
        assert f"--inputs {shlex.quote(name + ',x0,x1')}." in text and "\n" not in text, text
        assert caught[0].filename == __file__  # points at the caller's line
        assert got.dim == 2
        for key in ("X_stream", "y_stream", "X_test", "y_test"):
            assert torch.equal(getattr(got, key), getattr(want, key)), (name, key)
    # anywhere in the file, and for a pool; an identifier of text codes is no error either
    middle = tmp_path / "middle.csv"
    codes = [f"A{i:03d}" for i in range(40)]
    middle.write_text(
        "x0,Id,x1,target\n"
        + "\n".join(f"{a:.17g},{c},{b:.17g},{t:.17g}" for (a, b), c, t in zip(X, codes, y))
        + "\n"
    )
    with pytest.warns(UserWarning, match="column 'Id' is named as a row identifier") as w:
        pool = pool_from_file(middle, test_fraction=0.25, seed=2)
    # text codes cannot be an input: no --inputs naming them is suggested
    assert "it holds text, which no model takes as an input" in str(w[0].message)
    assert "--inputs" not in str(w[0].message)
    assert pool.dim == 2
    # named: used as asked, without a warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chosen = stream_from_file(path, inputs=["Row No.", "x0"], seed=2)
    assert chosen.dim == 2
    assert torch.equal(
        torch.sort(torch.cat([chosen.X_stream[:, 0], chosen.X_test[:, 0]])).values,
        torch.as_tensor(ids),
    )
    # the only input: kept (nothing else to learn from), but not silently
    alone = tmp_path / "alone.csv"
    _with_columns(alone, ["id", "target"], [ids, y])
    with pytest.warns(UserWarning, match="'id' looks like a row identifier.*no other input"):
        assert stream_from_file(alone).dim == 1
    # the spec records the rule; a run from before it (no drop_identifiers) keeps the column
    spec = dict(got.spec)
    assert spec.pop("drop_identifiers") is True
    with pytest.warns(UserWarning, match="'Row No.' holds 40 distinct consecutive integers"):
        assert problem_from_spec(spec).dim == 3


def test_an_unnamed_column_of_shuffled_row_numbers_is_no_default_input(tmp_path):
    """A data frame shuffled (df.sample(frac=1)) and written with pandas' to_csv keeps its
    index as an unnamed column of the row numbers out of order; only row numbers in file order
    were left out, so this one was an input. It is now left out too, wherever it is; an
    unnamed column of other numbers stays."""
    X, y = _data(n=30, d=2)
    order = np.random.default_rng(4).permutation(30).astype(np.float64)
    path = tmp_path / "shuffled.csv"
    _with_columns(path, ["x0", "Unnamed: 0", "x1", "target"], [X[:, 0], order, X[:, 1], y])
    with pytest.warns(UserWarning, match="'Unnamed: 0' has no name and holds the row numbers"):
        assert stream_from_file(path).dim == 2
    other = tmp_path / "other.csv"
    _with_columns(other, ["", "x0", "x1", "target"], [order + 0.5, X, y])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert stream_from_file(other).dim == 3


def test_an_input_of_consecutive_integers_is_warned_of(tmp_path):
    """A column of distinct consecutive integers under another name (a row number called
    'sample', say) was used as an input without a word. It is kept (it may be a real input,
    such as a year) but warned of, naming the column and the --inputs that leaves it out."""
    X, y = _data(n=30, d=2)
    sample = np.random.default_rng(5).permutation(30) + 100.0
    path = tmp_path / "sample.csv"
    _with_columns(path, ["sample", "x0", "x1", "target"], [sample, X, y])
    with pytest.warns(UserWarning) as caught:
        prob = stream_from_file(path)
    assert prob.dim == 3
    (text,) = [str(w.message) for w in caught]
    assert "input column 'sample' holds 30 distinct consecutive integers (100 .. 129)" in text
    assert text.endswith("leave it out with --inputs x0,x1."), text
    # named among the inputs: no warning; integer levels that repeat: none either
    levels = tmp_path / "levels.csv"
    _with_columns(levels, ["level", "x0", "x1", "target"], [np.arange(30) % 3, X, y])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert stream_from_file(path, inputs=["sample", "x0", "x1"]).dim == 3
        assert stream_from_file(levels).dim == 3


def test_a_column_named_index_of_measurements_stays_an_input(tmp_path):
    """A column named ``index`` (or ``id``, ``row``) holding fractions, such as a refractive or
    price index, was left out as a row identifier by its name alone: the model lost a real
    input. A row identifier holds text codes or whole numbers, so such a column now stays,
    without a warning, and the problem equals the one read with it named among the inputs;
    whole numbers under the name are still left out; a run recorded before the check resumes
    on the inputs it started with."""
    X, y = _data(n=40, d=2)
    refraction = 1.3 + 0.2 * np.random.default_rng(6).random(40)
    path = tmp_path / "index.csv"
    _with_columns(path, ["index", "x0", "x1", "target"], [refraction, X, y])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = stream_from_file(path, seed=2)
        named = stream_from_file(path, inputs=["index", "x0", "x1"], seed=2)
        pool = pool_from_file(path, seed=2)
    assert got.dim == 3 and pool.dim == 3
    for key in ("X_stream", "y_stream", "X_test", "y_test"):
        assert torch.equal(getattr(got, key), getattr(named, key)), key
    assert got.spec["drop_fractional_identifiers"] is False
    assert problem_from_spec(got.spec).dim == 3
    # whole numbers under the name, in any order: an identifier, left out as before
    whole = tmp_path / "whole.csv"
    codes = np.random.default_rng(7).permutation(40) * 7.0 + 1000.0
    _with_columns(whole, ["index", "x0", "x1", "target"], [codes, X, y])
    with pytest.warns(UserWarning, match="column 'index' is named as a row identifier"):
        assert stream_from_file(whole).dim == 2
    # a run recorded before the check (drop_identifiers, no drop_fractional_identifiers) left
    # the column out: its resume does too
    spec = dict(got.spec)
    del spec["drop_fractional_identifiers"]
    with pytest.warns(UserWarning, match="column 'index' is named as a row identifier"):
        assert problem_from_spec(spec).dim == 2


def _suggested_inputs(message: str) -> list[str] | None:
    """The columns a warning's ``--inputs VALUE.`` gives, as a shell and the CLI read them."""
    words = shlex.split(message.split("--inputs ", 1)[1].rstrip("."))
    assert len(words) == 1, words  # one shell word: the value of --inputs
    return _columns(words[0])


def test_the_suggested_inputs_can_be_pasted(tmp_path):
    """The --inputs a warning suggested could not be used as given: a header naming a column
    twice (x, x) gave '--inputs x,x,id', refused as ambiguous, and a name with a space (x 1)
    gave '--inputs id,x 1,x2', which a shell splits into two arguments ('Got unexpected extra
    argument'). Such columns are now given by index (from the end where the index is another
    column's name) and the value is quoted for a shell; pasted, it selects the columns the
    warning says."""
    X, y = _data(n=40, d=3)
    ids = np.arange(1, 41.0)
    for names in (
        ["x", "x", "id", "target"],
        ["id", "x 1", "x(2)", "target"],
        ["x", "x", "0", "id", "target"],  # the first x's index, 0, is the third column's name
    ):
        path = tmp_path / "cols.csv"
        xs = iter(X.T)
        values = [ids if name == "id" else next(xs) for name in names[:-1]]
        _with_columns(path, names, [*values, y])
        with pytest.warns(UserWarning, match="is named as a row identifier") as caught:
            stream_from_file(path, seed=3)
        (text,) = [str(w.message) for w in caught]
        suggested = _suggested_inputs(text)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            prob = stream_from_file(path, inputs=suggested, seed=3)
        # every input column, the identifier included, in file order
        assert prob.dim == len(values), (names, suggested)
        got = torch.cat([prob.X_stream, prob.X_test])
        want = torch.as_tensor(np.column_stack(values))
        assert torch.equal(torch.sort(got, 0).values, torch.sort(want, 0).values), suggested


def test_cli_notice_of_an_identifier_column(tmp_path, capsys):
    """`bo-online stream --data` / `active --pool` on a CSV with an id column: one line on
    stderr naming the column and --inputs; the run's model has the other inputs only."""
    X, y = _data(n=40, d=2)
    path = tmp_path / "with_id.csv"
    _with_columns(path, ["id", "x0", "x1", "target"], [np.arange(40.0), X, y])
    common = ["--n-init", "10", "--steps", "1", "-Q", "--no-plots"]
    for command, option in (("stream", "--data"), ("active", "--pool")):
        out = tmp_path / command
        extra = ["--q", "1", "--acq", "random"] if command == "active" else []
        code, err = _run([command, option, str(path), *common, *extra, "--out", str(out)], capsys)
        assert code == 0, err
        notices = [line for line in err.splitlines() if "row identifier" in line]
        assert len(notices) == 1 and notices[0].startswith("bo-online: warning: "), err
        assert "column 'id'" in notices[0] and "--inputs id,x0,x1" in notices[0], err
        assert json.loads((out / history.CONFIG_FILE).read_text())["problem"]["drop_identifiers"]
        with pytest.warns(UserWarning, match="column 'id' is named as a row identifier"):
            assert load_loop(out).problem.dim == 2  # a resume reads the file as the run did


def test_a_target_of_two_values_is_not_regressed_on_silently(tmp_path):
    """A 0/1 target column was regressed on as numbers without a word, by a stream whose task
    was left out (the default regression) and by a pool (active learning has no
    classification). Both now warn, naming the column and, for a stream, --task
    classification; an explicit task, and a continuous target, give no warning. The problem
    is the same regression as before (the default task is unchanged)."""
    X, y = _data(n=40, d=2)
    labels = (y > np.median(y)).astype(np.float64)
    path = tmp_path / "labels.csv"
    _with_columns(path, ["x0", "x1", "label"], [X, labels])
    with pytest.warns(UserWarning) as caught:
        prob = stream_from_file(path, seed=1)
    (text,) = [str(w.message) for w in caught]
    assert "target column 'label' holds two distinct values only (0 and 1)" in text, text
    assert "pass --task classification" in text and "\n" not in text, text
    assert caught[0].filename == __file__
    assert prob.task == "regression" and prob.spec["task"] == "regression"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = stream_from_file(path, seed=1, task="regression")
        for key in ("X_stream", "y_stream", "X_test", "y_test"):
            assert torch.equal(getattr(prob, key), getattr(same, key)), key
        assert problem_from_spec(prob.spec).task == "regression"  # a resume: the task is set
        assert stream_from_file(path, task="classification").task == "classification"
    with pytest.warns(UserWarning) as caught:
        pool = pool_from_file(path, target="label", test_fraction=0.25)
    (text,) = [str(w.message) for w in caught]
    assert "target column 'label' holds two distinct values only (0 and 1)" in text, text
    assert "active learning has no classification" in text and "--task classification" in text
    assert torch.equal(torch.unique(pool.y_pool), torch.tensor([0.0, 1.0], dtype=torch.float64))
    # two other numbers are two values all the same; a continuous target: no warning
    _with_columns(path, ["x0", "x1", "label"], [X, 2.5 + 4.0 * labels])
    with pytest.warns(UserWarning, match=r"'label' holds two distinct values only \(2.5 and 6.5"):
        pool_from_file(path)
    _with_columns(path, ["x0", "x1", "target"], [X, y])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stream_from_file(path)
        pool_from_file(path)


def test_cli_notice_of_a_target_of_two_values(tmp_path, capsys):
    """`bo-online stream --data` without --task and `active --pool` on a 0/1 target: one line
    on stderr naming the column (and, for stream, --task classification); none with --task
    given or a continuous target."""
    X, y = _data(n=40, d=2)
    labels = tmp_path / "labels.csv"
    _with_columns(labels, ["x0", "x1", "label"], [X, (y > np.median(y)).astype(np.float64)])
    smooth = tmp_path / "smooth.csv"
    _with_columns(smooth, ["x0", "x1", "target"], [X, y])
    common = ["--n-init", "10", "--steps", "1", "-Q", "--no-plots", "--overwrite"]
    active = ["--q", "1", "--acq", "random"]
    for argv, notice in (
        (["stream", "--data", str(labels)], "pass --task classification"),
        (["active", "--pool", str(labels), *active], "active learning has no classification"),
        (["stream", "--data", str(labels), "--task", "regression"], None),
        (["stream", "--data", str(smooth)], None),
        (["active", "--pool", str(smooth), *active], None),
    ):
        code, err = _run([*argv, *common, "--out", str(tmp_path / "run")], capsys)
        assert code == 0, err
        lines = [line for line in err.splitlines() if "two distinct values" in line]
        if notice is None:
            assert not lines, err
        else:
            assert len(lines) == 1 and lines[0].startswith("bo-online: warning: "), err
            assert "target column 'label'" in lines[0] and notice in lines[0], err
