r"""Faults and hostile input: nothing runs from a run directory, every fault ends in one clear
line (exit 2) or a clean recovery, CLI values are range-checked up front, numerical edges.

The fault-injection harness kills a forked run with SIGKILL at named points of the checkpoint
write (``$BO_ONLINE_FAULT_POINT``, see :func:`bo_online.loops.history.fault_point`), at random
moments, and in the middle of a records line; each killed run must resume (or restart) to the
records of an uninterrupted run.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from bo_online.cli import main
from bo_online.loops import (
    BayesOptLoop,
    RunDirectoryError,
    history,
    load_loop,
    read_records,
    without_timing,
)
from bo_online.problems import synthetic_problem

FAST = dict(
    n_init=4,
    fit_max_iter=3,
    acq="ts",
    acq_options={"num_candidates": 64},
)
ROOT = Path(__file__).resolve().parents[2]
CLI_FAST = [
    "--n-init",
    "4",
    "--fit-max-iter",
    "2",
    "--num-restarts",
    "2",
    "--raw-samples",
    "16",
    "--acqf-maxiter",
    "5",
    "-Q",
    "--no-plots",
]


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _cli(argv, capsys):
    r"""Run ``bo-online argv`` in-process; (exit code, stderr)."""
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
        raise SystemExit(0)
    return e.value.code, capsys.readouterr().err


def _one_line_error(code, err):
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bo-online: error: "), err


def _reference(steps: int, **kw) -> list[dict]:
    return without_timing(
        BayesOptLoop(synthetic_problem("branin"), seed=3, **FAST, **kw).run(steps)
    )


def _run_in_child(
    out: Path, steps: int, fault: str | None = None, kill_after: float | None = None
) -> int:
    r"""Fork a process running a small BO loop into ``out``; it dies by SIGKILL at ``fault`` (a
    named point) or is killed after ``kill_after`` seconds. Returns the child's wait status."""
    pid = os.fork()
    if pid == 0:  # child: no pytest teardown, leave only through os._exit or a signal
        code = 1
        try:
            if fault is not None:
                os.environ[history.FAULT_ENV] = fault
            BayesOptLoop(synthetic_problem("branin"), seed=3, out_dir=out, **FAST).run(steps)
            code = 0
        finally:
            os._exit(code)
    if kill_after is not None:
        time.sleep(kill_after)
        os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]


def _finish(out: Path, steps: int) -> list[dict]:
    r"""Continue a killed run: resume from its checkpoint, or start it again if it has none."""
    if (out / history.CHECKPOINT_FILE).exists():
        load_loop(out).run(steps)
    else:
        BayesOptLoop(synthetic_problem("branin"), seed=3, out_dir=out, **FAST).run(steps)
    return without_timing(read_records(out))


def _assert_clean(out: Path) -> None:
    assert not list(out.glob(".checkpoint.pt.*")) and not list(out.glob(".records.jsonl.*"))
    assert not (out / history.LOCK_FILE).exists()


# ------------------------------------------------------------------------------ nothing runs


def test_cli_refuses_callables_outside_the_allow_list(tmp_path, capsys):
    sentinel = tmp_path / "pwned"
    out = tmp_path / "run"
    for value in (
        f"os.system('touch {sentinel}')",
        f"subprocess.call(['touch', '{sentinel}'])",
        "torch.nn.Linear(2, 2)",
        "gpytorch.kernels.kernel.sq_dist(1, 2)",
    ):
        code, err = _cli(
            ["bo", "--problem", "branin", "--model-option", f"x={value}", "--out", out, *CLI_FAST],
            capsys,
        )
        _one_line_error(code, err)
        assert "not an allowed class" in err or "not a" in err
    assert not sentinel.exists() and not out.exists()


def _small_run(out: Path) -> None:
    BayesOptLoop(synthetic_problem("branin"), seed=3, out_dir=out, **FAST).run(1)


def test_malicious_config_in_run_directory_is_refused(tmp_path, capsys):
    r"""A run directory whose stored configuration builds ``os.system`` is refused on resume,
    and the call never happens."""
    out, sentinel = tmp_path / "run", tmp_path / "pwned"
    _small_run(out)
    evil = {"x": {"__class__": "os.system", "args": [f"touch {sentinel}"]}}
    ckpt = torch.load(out / history.CHECKPOINT_FILE, weights_only=True)
    ckpt["config"]["model_options"] = evil
    torch.save(ckpt, out / history.CHECKPOINT_FILE)
    cfg = json.loads((out / history.CONFIG_FILE).read_text())
    cfg["model_options"] = evil
    (out / history.CONFIG_FILE).write_text(json.dumps(cfg))
    code, err = _cli(["resume", out, "--steps", "2", "-Q", "--no-plots"], capsys)
    _one_line_error(code, err)
    assert "os.system" in err and "not an allowed class" in err
    code, _ = _cli(["plot", out, "--out", tmp_path / "plots"], capsys)  # plots read JSON only
    assert code == 0
    assert not sentinel.exists()
    assert not (out / history.LOCK_FILE).exists()


class _Payload:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_pickled_payload_in_checkpoint_is_refused(tmp_path, capsys):
    out, sentinel = tmp_path / "run", tmp_path / "pwned"
    _small_run(out)
    ckpt = torch.load(out / history.CHECKPOINT_FILE, weights_only=True)
    ckpt["state"]["payload"] = _Payload(sentinel)
    torch.save(ckpt, out / history.CHECKPOINT_FILE)
    code, err = _cli(["resume", out, "-Q", "--no-plots"], capsys)
    _one_line_error(code, err)
    assert "checkpoint.pt" in err and "Refusing" in err and "system" in err  # names the global
    assert not sentinel.exists()
    # a plain pickle (not a torch zip file) is refused too
    (out / history.CHECKPOINT_FILE).write_bytes(pickle.dumps(_Payload(sentinel)))
    code, err = _cli(["resume", out, "-Q", "--no-plots"], capsys)
    _one_line_error(code, err)
    assert not sentinel.exists()
    # a text file in its place is damaged, not dangerous: no talk of running code
    (out / history.CHECKPOINT_FILE).write_text("garbage\n")
    code, err = _cli(["resume", out, "-Q", "--no-plots"], capsys)
    _one_line_error(code, err)
    assert "is not a checkpoint bo-online wrote" in err and "run code" not in err


def test_checkpoint_holds_only_plain_data(tmp_path):
    _small_run(tmp_path)
    ckpt = torch.load(tmp_path / history.CHECKPOINT_FILE, weights_only=True)  # would raise
    assert torch.is_tensor(ckpt["state"]["noise_generator"])


def test_allowed_objects_still_build():
    from bo_online.loops.options import instantiate

    built = instantiate(
        {
            "k": {
                "__class__": "gpytorch.kernels.ScaleKernel",
                "args": [{"__class__": "gpytorch.kernels.MaternKernel", "kwargs": {"nu": 2.5}}],
            }
        }
    )
    from gpytorch.kernels import MaternKernel, ScaleKernel

    assert isinstance(built["k"], ScaleKernel) and isinstance(built["k"].base_kernel, MaternKernel)
    with pytest.raises(ValueError, match="unexpected keys"):
        instantiate({"__class__": "gpytorch.kernels.RBFKernel", "__reduce__": 1})


def test_likelihoods_build_from_the_allow_list():
    """t-SVGP's site likelihoods (the README's Poisson and Student-t) and GPyTorch's likelihoods
    can be named in model options (before: refused, so no CLI run could use them)."""
    from gpytorch.likelihoods import GaussianLikelihood

    from bo_online.likelihoods import StudentT
    from bo_online.loops.options import UnsafeOptionError, instantiate

    built = instantiate(
        {
            "site": {"__class__": "bo_online.likelihoods.StudentT"},
            "gauss": {
                "__class__": "gpytorch.likelihoods.GaussianLikelihood",
                "kwargs": {
                    "noise_constraint": {
                        "__class__": "gpytorch.constraints.GreaterThan",
                        "args": [1e-3],
                    }
                },
            },
        }
    )
    assert isinstance(built["site"], StudentT) and isinstance(built["gauss"], GaussianLikelihood)
    assert float(built["gauss"].noise_covar.raw_noise_constraint.lower_bound) == pytest.approx(1e-3)
    # what the module merely imports (a GPyTorch class, a module) is not a site likelihood
    for name in ("GaussianLikelihood", "np"):
        with pytest.raises(
            UnsafeOptionError, match="is not a bo_online.likelihoods.SiteLikelihood"
        ):
            instantiate({"x": {"__class__": f"bo_online.likelihoods.{name}"}})


# ------------------------------------------------------------------------------ kills and resume


@pytest.mark.parametrize("fault", ["checkpoint:open", "checkpoint:written", "checkpoint:replaced"])
def test_kill_during_first_checkpoint_restarts(tmp_path, fault):
    r"""Killed while writing the step-0 checkpoint: the directory is restarted (no checkpoint
    yet) or resumed, to the records of an uninterrupted run; temp files and lock are gone."""
    out = tmp_path / "run"
    status = _run_in_child(out, 2, fault=fault)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert (out / history.LOCK_FILE).exists()  # left behind by the dead process: stale
    if fault != "checkpoint:replaced":
        assert len(list(out.glob(".checkpoint.pt.*"))) == 1  # the orphaned temp file
        with pytest.raises(history.RunFileError, match="Start it again"):
            load_loop(out)
    assert _finish(out, 2) == _reference(2)
    _assert_clean(out)


def test_orphaned_temp_files_are_removed(tmp_path):
    out = tmp_path / "run"
    _run_in_child(out, 3, fault="checkpoint:open")  # dies leaving an empty .checkpoint.pt.*
    assert list(out.glob(".checkpoint.pt.*"))
    BayesOptLoop(synthetic_problem("branin"), seed=3, out_dir=out, **FAST).run(1)
    _assert_clean(out)


def test_torn_record_and_random_kills_resume_to_identical_records(tmp_path):
    reference = _reference(4)
    out = tmp_path / "torn"
    _run_in_child(out, 4, fault="record:torn")
    lines = (out / history.RECORDS_FILE).read_text().splitlines(keepends=True)
    assert not lines[-1].endswith("\n")  # half a line
    assert _finish(out, 4) == reference
    gen = torch.Generator().manual_seed(0)
    for i in range(3):
        out = tmp_path / f"kill{i}"
        _run_in_child(out, 4, kill_after=float(0.05 + 1.5 * torch.rand((), generator=gen)))
        assert _finish(out, 4) == reference, i
        _assert_clean(out)


def test_damaged_records_line_names_the_file(tmp_path):
    out = tmp_path / "run"
    BayesOptLoop(synthetic_problem("branin"), seed=3, out_dir=out, **FAST).run(2)
    path = out / history.RECORDS_FILE
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + "{garbage\n" + "".join(lines[2:]))
    with pytest.raises(history.RunFileError, match="records.jsonl.*line 2.*resume"):
        read_records(out)
    load_loop(out).run(2)  # resume rewrites the records from the checkpoint
    assert len(read_records(out)) == 3


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage", "not_a_dict"])
def test_damaged_checkpoint_is_one_line(tmp_path, capsys, damage):
    out = tmp_path / "run"
    _small_run(out)
    path = out / history.CHECKPOINT_FILE
    data = path.read_bytes()
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(np.random.default_rng(0).bytes(len(data)))
    else:
        torch.save([torch.zeros(2)], path)
    code, err = _cli(["resume", out, "-Q", "--no-plots"], capsys)
    _one_line_error(code, err)
    assert "checkpoint.pt" in err and "--overwrite" in err
    assert not (out / history.LOCK_FILE).exists()


def test_any_damaged_checkpoint_bytes_give_run_file_error(tmp_path):
    """Damaged bytes can fail anywhere inside the unpickler (an IndexError from its stack was
    once seen on CI); each of these seeded payloads must become the one RunFileError."""
    path = tmp_path / history.CHECKPOINT_FILE
    torch.save({"config": {"a": 1}, "model_state": {"x": torch.zeros(3)}}, path)
    data = path.read_bytes()
    for seed in range(300):
        rng = np.random.default_rng(seed)
        if seed % 3 == 0:
            payload = rng.bytes(len(data))
        elif seed % 3 == 1:  # a valid file with 20 bytes overwritten
            payload = bytearray(data)
            for i in rng.integers(0, len(payload), 20):
                payload[i] = int(rng.integers(0, 256))
            payload = bytes(payload)
        else:  # a pickle header followed by noise
            payload = b"\x80\x02" + rng.bytes(200)
        path.write_bytes(payload)
        try:
            history.load_checkpoint(path)
        except history.RunFileError:
            pass
        # a payload that happens to load as a valid checkpoint is fine too


# ------------------------------------------------------------------------------ lock


_RACE = r"""
import os, sys, time
from pathlib import Path
from bo_online.loops import history
out = Path(sys.argv[1])
(out / f"ready.{os.getpid()}").touch()
while not (out / "go").exists():  # all start together
    time.sleep(0.001)
try:
    history.RunLock(out).acquire()
except history.RunFileError:
    sys.exit(0)
(out / f"holder.{os.getpid()}").touch()  # took the lock
while not (out / "done").exists():  # hold it until every other child has tried
    time.sleep(0.01)
"""


@pytest.mark.parametrize("stale", ["none", "dead pid", "empty"])
def test_processes_racing_for_a_lock_get_one_holder(tmp_path, stale):
    """Several processes acquiring the same run directory's lock at the same moment (none held,
    a stale one left by a dead process, or an empty lock file): exactly one takes it."""
    out = tmp_path / "run"
    out.mkdir()
    if stale == "dead pid":
        dead = subprocess.Popen(["true"])
        dead.wait()
        (out / history.LOCK_FILE).write_text(str(dead.pid))
    elif stale == "empty":
        (out / history.LOCK_FILE).write_text("")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    children = [
        subprocess.Popen([sys.executable, "-c", _RACE, str(out)], env=env) for _ in range(4)
    ]
    deadline = time.time() + 120
    while len(list(out.glob("ready.*"))) < 4 and time.time() < deadline:
        time.sleep(0.05)
    (out / "go").touch()
    deadline = time.time() + 120  # the children refused the lock exit on their own
    while sum(c.poll() is not None for c in children) < 3 and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # a second holder, if any, has had time to mark itself
    holders = list(out.glob("holder.*"))
    (out / "done").touch()
    assert all(c.wait(timeout=60) == 0 for c in children)
    assert len(holders) == 1, holders


def test_second_run_on_a_directory_in_use_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    _small_run(out)
    holder = subprocess.Popen(["sleep", "30"])
    try:
        (out / history.LOCK_FILE).write_text(str(holder.pid))
        before = (out / history.RECORDS_FILE).read_bytes()
        code, err = _cli(["resume", out, "--steps", "3", "-Q", "--no-plots"], capsys)
        _one_line_error(code, err)
        assert f"in use by process {holder.pid}" in err
        code, err = _cli(
            ["bo", "--problem", "branin", "--out", out, "--overwrite", *CLI_FAST], capsys
        )
        _one_line_error(code, err)
        assert "in use" in err
        assert (out / history.RECORDS_FILE).read_bytes() == before
    finally:
        holder.kill()
        holder.wait()
    # the holder is dead now: its lock is stale and taken over
    load_loop(out).run(2)
    assert len(read_records(out)) == 3
    _assert_clean(out)


def test_a_loop_stepped_after_run_returns_holds_the_lock_and_refuses_a_run_resumed_meanwhile(
    tmp_path,
):
    r"""``run()`` releases the directory's lock when it returns; a loop stepped (or checkpointed,
    or run) again afterwards takes it back, and refuses to write if the run files changed in
    between (here another loop resumed the run): its state is behind them."""
    out = tmp_path / "run"
    loop = BayesOptLoop(synthetic_problem("branin"), seed=3, out_dir=out, quiet=True, **FAST)
    loop.run(2)
    assert not (out / history.LOCK_FILE).exists()
    loop.step()  # nothing changed: it continues, holding the lock again
    assert (out / history.LOCK_FILE).read_text().split()[0] == str(os.getpid())
    loop.run(4)
    assert [r["step"] for r in read_records(out)] == [0, 1, 2, 3, 4]
    assert without_timing(read_records(out)) == _reference(4)

    other = load_loop(out)
    other.run(6)  # the run goes on through another loop (as a resume in another process)
    records = (out / history.RECORDS_FILE).read_bytes()
    for write in (loop.step, loop.save_checkpoint, lambda: loop.run(8)):
        with pytest.raises(
            RunDirectoryError, match="have changed since this loop last wrote or loaded them"
        ):
            write()
        assert (out / history.RECORDS_FILE).read_bytes() == records
        assert not (out / history.LOCK_FILE).exists()
    assert [r["step"] for r in read_records(out)] == list(range(7))

    # the other loop, stepped by the caller, holds the lock: refusing the stale loop keeps it
    other.step()
    with pytest.raises(RunDirectoryError, match="have changed"):
        loop.step()
    assert (out / history.LOCK_FILE).read_text().split()[0] == str(os.getpid())
    other.step()
    assert [r["step"] for r in read_records(out)] == list(range(9))


def test_a_loaded_loop_driven_by_step_writes_its_first_record_once(tmp_path):
    r"""A loaded (resumed) loop's first record rewrote the records file from the checkpoint
    with that record already among its records, then appended it again: step 3 twice."""
    out = tmp_path / "run"
    BayesOptLoop(synthetic_problem("branin"), seed=3, out_dir=out, quiet=True, **FAST).run(2)
    loop = load_loop(out)
    loop.step()
    loop.step()
    assert [r["step"] for r in read_records(out)] == [0, 1, 2, 3, 4]
    assert without_timing(read_records(out)) == without_timing(loop.records)


def test_a_stale_loop_is_refused_before_it_evaluates_a_step(tmp_path):
    r"""A loop whose run files changed after its run() returned was refused only when its
    next record was written: the step's point was evaluated (an objective may be costly) and
    the loop's state advanced past its files for nothing."""
    out = tmp_path / "run"
    loop = BayesOptLoop(synthetic_problem("branin"), seed=3, out_dir=out, quiet=True, **FAST)
    loop.run(2)
    other = load_loop(out)
    other.run(3)
    other._lock.release()
    evaluated = []
    objective = loop._evaluate_pending
    loop._evaluate_pending = lambda: evaluated.append(1) or objective()
    with pytest.raises(
        RunDirectoryError, match="have changed since this loop last wrote or loaded them"
    ):
        loop.step()
    assert not evaluated and loop.step_count == 2 and len(loop.records) == 3


def test_two_loops_of_one_process_on_one_run_do_not_overwrite_each_other(tmp_path):
    r"""Two loops of one process share the directory's lock (it names the process), so the lock
    alone did not keep them apart: loop B, loaded while A's run() had returned, then A running
    on, then B stepped, rewrote the records from its own checkpoint and dropped A's steps
    without a word. B is now refused (the files changed since it loaded them); A's steps stay."""
    out = tmp_path / "run"
    a = BayesOptLoop(synthetic_problem("branin"), seed=3, out_dir=out, quiet=True, **FAST)
    a.run(2)
    b = load_loop(out)
    a.run(4)
    # A's release at the end of its run left the lock file to B, which still held it (it was
    # removed, and another process could have taken the directory)
    assert (out / history.LOCK_FILE).read_text().split()[0] == str(os.getpid())
    with pytest.raises(RunDirectoryError, match="have changed since this loop last wrote"):
        b.step()
    assert not (out / history.LOCK_FILE).exists()  # B, the last holder, gave it up
    assert without_timing(read_records(out)) == _reference(4)
    load_loop(out).run(5)  # what is on disk goes on
    assert without_timing(read_records(out)) == _reference(5)


def test_a_refused_loop_that_held_the_lock_alone_frees_the_directory(tmp_path):
    r"""A loop driven by step() holds the lock to exit; refused because its run files were
    replaced, it left its lock file behind, and every other process was refused the directory
    until this Python session ended."""
    out = tmp_path / "run"
    loop = BayesOptLoop(synthetic_problem("branin"), seed=3, out_dir=out, quiet=True, **FAST)
    loop.step()
    assert (out / history.LOCK_FILE).exists()
    (out / history.RECORDS_FILE).unlink()  # the run files go (a user cleans the folder)
    with pytest.raises(RunDirectoryError, match="have changed"):
        loop.step()
    assert not (out / history.LOCK_FILE).exists()


def test_a_lock_from_another_host_is_refused_and_one_of_a_reused_pid_is_taken_over(
    tmp_path, capsys
):
    r"""A lock taken on another host (a run directory on a shared file system) names a pid this
    machine cannot check: it is refused, not taken over as stale (two runs then wrote one
    directory). On the same host, a lock whose pid now names another process (reused since
    the crash) is stale, while one naming the live process that took it is refused."""
    out = tmp_path / "run"
    _small_run(out)
    before = (out / history.RECORDS_FILE).read_bytes()
    dead = subprocess.Popen(["true"])
    dead.wait()  # no such process here; on the other host it may well run
    other = f"not-{socket.gethostname()}"
    (out / history.LOCK_FILE).write_text(f"{dead.pid}\nhost {other}\n")
    code, err = _cli(["resume", out, "--steps", "3", "-Q", "--no-plots"], capsys)
    _one_line_error(code, err)
    assert f"locked by process {dead.pid} on the host {other!r}" in err
    assert (out / history.RECORDS_FILE).read_bytes() == before
    live = subprocess.Popen(["sleep", "30"])
    try:
        identity = history._process_identity(live.pid)
        if identity is not None:  # the lock tells the process from a later one
            lock = f"{live.pid}\nhost {socket.gethostname()}\nprocess {{}}\n"
            (out / history.LOCK_FILE).write_text(lock.format(identity))
            code, err = _cli(["resume", out, "--steps", "3", "-Q", "--no-plots"], capsys)
            _one_line_error(code, err)
            assert f"in use by process {live.pid}" in err
            assert (out / history.RECORDS_FILE).read_bytes() == before
            # the pid of a process started after the lock was taken: the holder is gone
            (out / history.LOCK_FILE).write_text(lock.format(identity + "0"))
            load_loop(out).run(2)
            assert len(read_records(out)) == 3
    finally:
        live.kill()
        live.wait()
    _assert_clean(out)


def test_records_of_a_run_whose_checkpoint_was_removed_are_not_replaced(tmp_path, capsys):
    r"""A directory with records up to step 2 and no checkpoint (removed, e.g. to save space)
    was taken for a run killed before its first checkpoint: `resume` said "start it again ...
    (nothing is lost)" and a new `bo --out` there replaced the records without --overwrite.
    Both now refuse in one line; --overwrite still starts afresh."""
    out = tmp_path / "run"
    code, err = _cli(["bo", "--problem", "branin", "--steps", "2", "--out", out, *CLI_FAST], capsys)
    assert code == 0, err
    (out / history.CHECKPOINT_FILE).unlink()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code, err = _cli(["resume", out, "-Q", "--no-plots"], capsys)
    _one_line_error(code, err)
    assert "records go to step 2" in err and "nothing is lost" not in err, err
    levy = ["bo", "--problem", "levy", "--steps", "1", "--out", out, *CLI_FAST]
    code, err = _cli(levy, capsys)
    _one_line_error(code, err)
    assert "up to step 2 but no checkpoint" in err and "--overwrite" in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert _cli([*levy, "--overwrite"], capsys)[0] == 0
    assert [r["step"] for r in read_records(out)] == [0, 1]
    _assert_clean(out)


# ------------------------------------------------------------------------------ unwritable / full


def test_unwritable_directory_is_refused_before_any_evaluation(tmp_path):
    (tmp_path / "afile").write_text("x")
    problem = synthetic_problem("branin")
    calls = []
    evaluate = problem.evaluate_true
    problem.evaluate_true = lambda X: calls.append(X) or evaluate(X)
    loop = BayesOptLoop(problem, out_dir=tmp_path / "afile" / "run", **FAST)
    with pytest.raises(history.RunFileError, match="Cannot write to the run directory"):
        loop.run(1)
    assert calls == []


def _disk_full_at_third_line(monkeypatch):
    """Make the third line appended to a run file fail as on a full disk; the real appender."""
    real = history._append_line
    calls = {"n": 0}

    def flaky(path, line):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device")
        real(path, line)

    monkeypatch.setattr(history, "_append_line", flaky)
    return real


def test_full_disk_mid_run_is_one_line_and_resumable(tmp_path, monkeypatch):
    out = tmp_path / "run"
    loop = BayesOptLoop(synthetic_problem("branin"), seed=3, out_dir=out, **FAST)
    real = _disk_full_at_third_line(monkeypatch)
    with pytest.raises(
        history.RunFileError, match="records.jsonl.*No space left.*bo-online resume"
    ):
        loop.run(4)
    monkeypatch.setattr(history, "_append_line", real)
    assert not (out / history.LOCK_FILE).exists()
    load_loop(out).run(4)
    assert without_timing(read_records(out)) == _reference(4)


def test_full_disk_in_a_run_of_a_user_objective_names_its_resume_command(tmp_path, monkeypatch):
    """A failed write into the run directory (full disk) advised `bo-online resume DIR`, which a
    run of a user objective refuses without its --objective. The advice now names it, and the
    command, run as written, finishes the run."""
    import shlex

    from bo_online.cli import main
    from bo_online.objectives import objective_problem

    (tmp_path / "obj.py").write_text("def f(X):\n    return ((X - 0.3) ** 2).sum(-1)\n")
    spec, out = f"{tmp_path / 'obj.py'}:f", tmp_path / "run"
    loop = BayesOptLoop(objective_problem(spec, "0,1 0,1"), seed=3, out_dir=out, **FAST)
    real = _disk_full_at_third_line(monkeypatch)
    with pytest.raises(history.RunFileError, match="No space left") as e:
        loop.run(4)
    monkeypatch.setattr(history, "_append_line", real)
    command = str(e.value).split("`")[1]
    assert command == f"bo-online resume {shlex.quote(str(out))} --objective {shlex.quote(spec)}"
    main([*shlex.split(command)[1:], "--quiet", "--no-plots"])
    assert [r["step"] for r in read_records(out)] == [0, 1, 2, 3, 4]


def test_full_disk_in_an_asynchronous_run_names_its_cluster_option(tmp_path, monkeypatch):
    """The advice after a failed write in an asynchronous (Dask) run was `bo-online resume DIR`,
    which such a run refuses without --dask."""
    out = tmp_path / "run"
    out.mkdir()
    (out / history.CHECKPOINT_FILE).write_bytes(b"")  # (a checkpoint exists: resumable)
    history.write_json(out / history.CONFIG_FILE, {"kind": "bo_async", "objective": None})

    def full(path, line):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(history, "_append_line", full)
    with pytest.raises(history.RunFileError) as e:
        history.append_record(out / history.RECORDS_FILE, {"step": 1})
    command = str(e.value).split("`")[1]
    assert command == f"bo-online resume {out} --dask local:N"


# ------------------------------------------------------------------------------ CLI values


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--beta", "nan"], "--beta"),
        (["--beta", "-5"], "--beta"),
        (["--noise", "1e308"], "--noise"),
        (["--noise", "inf"], "--noise"),
        (["--seed", str(2**70)], "--seed"),
        (["--seed", "-1"], "--seed"),
        (["--problem", "ackley", "--dim", "1000"], "--dim"),
        (["--problem", "ackley", "--q", "1000"], "--q"),
        (["--model", "wiski", "--model-option", "grid_size=100000"], "GB"),
        (["--model", "wiski", "--model-option", "grid_size=abc"], "grid_size"),
        (["--model", "wiski", "--model-option", "grid_size=2.5"], "grid_size"),
        (["--workers", "100000"], "--workers"),
    ],
)
def test_cli_values_are_checked_before_anything_is_written(tmp_path, capsys, args, needle):
    out = tmp_path / "run"
    argv = ["bo", "--problem", "branin", *args, "--out", out, *CLI_FAST]
    if "--problem" in args:
        argv = ["bo", *args, "--out", out, *CLI_FAST]
    t0 = time.perf_counter()
    code, err = _cli(argv, capsys)
    _one_line_error(code, err)
    assert needle in err
    assert not out.exists()
    assert time.perf_counter() - t0 < 5


@pytest.mark.parametrize("command", [["active"], ["stream", "--problem", "elevators"]])
def test_cli_seed_out_of_range_is_refused_before_data_are_read(tmp_path, capsys, command):
    out = tmp_path / "run"
    code, err = _cli(
        [
            *command,
            "--seed",
            str(2**70),
            "--data-dir",
            tmp_path / "none",
            "--out",
            out,
            "-Q",
            "--no-plots",
        ],
        capsys,
    )
    _one_line_error(code, err)
    assert "--seed" in err and not out.exists()


def test_cli_out_naming_a_file_is_refused(tmp_path, capsys):
    out = tmp_path / "file"
    out.write_text("keep me")
    code, err = _cli(["bo", "--problem", "branin", "--out", out, *CLI_FAST], capsys)
    _one_line_error(code, err)
    assert "file" in err and out.read_text() == "keep me"


# ------------------------------------------------------------------------------ workers


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped) counts as ended
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_workers_end_with_the_driver(tmp_path, sig):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    driver = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bo_online.cli",
            "bo",
            "--problem",
            "branin",
            "--workers",
            "2",
            "--steps",
            "10000",
            "--out",
            str(out),
            *CLI_FAST,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 60
        while not (out / history.RECORDS_FILE).exists() and time.time() < deadline:
            time.sleep(0.1)
        workers = _children(driver.pid)
        assert workers, "the driver started no workers"
        driver.send_signal(sig)
        driver.wait(timeout=30)
        deadline = time.time() + 10
        while any(_alive(p) for p in workers) and time.time() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in workers)
        if sig == signal.SIGTERM:
            lines = driver.stderr.read().strip().splitlines()
            assert lines[0].startswith("bo-online: SIGTERM received: stopping after the step")
            assert lines[-1].startswith("bo-online: error: terminated") and "resume" in lines[-1]
            assert "--workers 2" in lines[-1]  # resumed in-process it would evaluate one by one
            assert not (out / history.LOCK_FILE).exists()
    finally:
        if driver.poll() is None:
            driver.kill()


def test_resume_takes_workers_like_bo_and_keeps_the_records(tmp_path, capsys):
    """`bo --workers N` had no counterpart in `resume`: a run started with a process pool went
    on evaluating its batches one point at a time. `resume --workers N` evaluates them in the
    pool again, with the records of an uninterrupted in-process run; it is refused where there
    is no objective to evaluate (a stream) and beside --dask."""
    out, whole = tmp_path / "run", tmp_path / "whole"
    common = ["--problem", "branin", "--q", "2", *CLI_FAST]
    code, err = _cli(["bo", *common, "--steps", "2", "--workers", "2", "--out", out], capsys)
    assert code == 0, err
    code, err = _cli(["resume", out, "--steps", "4", "--workers", "2", "-Q", "--no-plots"], capsys)
    assert code == 0, err
    code, err = _cli(["bo", *common, "--steps", "4", "--out", whole], capsys)
    assert code == 0, err
    assert without_timing(read_records(out)) == without_timing(read_records(whole))
    before = (out / history.RECORDS_FILE).read_bytes()
    for extra, needle in (
        (["--workers", "-1"], "--workers"),
        (["--workers", "2", "--dask", "local:1"], "exclude each other"),
    ):
        code, err = _cli(["resume", out, "--steps", "6", *extra, "-Q", "--no-plots"], capsys)
        _one_line_error(code, err)
        assert needle in err
    assert (out / history.RECORDS_FILE).read_bytes() == before
    stream, rows = tmp_path / "stream", tmp_path / "rows.csv"  # a user's file: no data set
    grid = np.linspace(0.0, 1.0, 40)
    rows.write_text("x,y\n" + "".join(f"{x!r},{math.sin(6 * x)!r}\n" for x in grid.tolist()))
    argv = ["stream", "--data", rows, "--n-init", "10", "-Q", "--no-plots", "--out", stream]
    code, err = _cli(argv, capsys)
    assert code == 0, err
    code, err = _cli(["resume", stream, "--workers", "2", "-Q", "--no-plots"], capsys)
    _one_line_error(code, err)
    assert "of kind 'stream': resume it without --workers" in err


def test_resume_workers_reaches_the_loop(tmp_path, capsys, monkeypatch):
    r"""The records are the same with or without a pool, so comparing them cannot tell whether
    `resume --workers N` evaluates in one: the loaded loop must hold a pool of N processes."""
    import bo_online.loops

    out = tmp_path / "run"
    code, err = _cli(["bo", "--problem", "branin", *CLI_FAST, "--steps", "1", "--out", out], capsys)
    assert code == 0, err
    pools, load = [], bo_online.loops.load_loop

    def spy(*args, **kwargs):
        loop = load(*args, **kwargs)
        pools.append(getattr(loop.executor, "_max_workers", None))
        return loop

    monkeypatch.setattr(bo_online.loops, "load_loop", spy)
    code, err = _cli(["resume", out, "--steps", "2", "--workers", "2", "-Q", "--no-plots"], capsys)
    assert code == 0, err
    assert pools == [2]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_run_names_its_directory_for_resume(tmp_path, sig):
    """Ctrl-C (SIGINT) and SIGTERM end with one line naming the real run directory to resume
    (typer turns Ctrl-C into a return code, which must not end the run silently)."""
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    driver = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bo_online.cli",
            "bo",
            "--problem",
            "branin",
            "--steps",
            "10000",
            "--out",
            str(out),
            *CLI_FAST,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 60
        while not (out / history.RECORDS_FILE).exists() and time.time() < deadline:
            time.sleep(0.1)
        driver.send_signal(sig)
        err = driver.communicate(timeout=60)[1]
        assert driver.returncode == (130 if sig == signal.SIGINT else 143)
        lines = err.strip().splitlines()
        word = "interrupted" if sig == signal.SIGINT else "terminated"
        assert (
            lines[-1] == f"bo-online: error: {word}; continue the run with `bo-online resume {out}`"
        )
        assert (out / history.CHECKPOINT_FILE).exists()
    finally:
        if driver.poll() is None:
            driver.kill()


# ------------------------------------------------------------------------------ numerical edges

MODELS = ["exact", "wiski", "tsvgp", "decoupled", "qsgp"]


def _data(n=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, 2, generator=g, dtype=torch.float64)
    return X, torch.sin(6 * X).sum(-1, keepdim=True)


def _model(name, X, Y, **kw):
    from bo_online.models.registry import get_model_class

    return get_model_class(name)(X, Y, **kw)


@pytest.mark.parametrize("name", MODELS)
def test_noise_below_the_floor_is_raised_to_it(name):
    r"""Noise 1e-300 (constructor and update) gives the same model as noise exactly at the floor
    (1e-6 standardised, i.e. 1e-6 var(Y) in user units), with a NumericalWarning; WISKI then
    refits and predicts finitely (it gave NaN / not-PD before)."""
    from gpytorch.utils.warnings import NumericalWarning

    from bo_online.models.validation import NOISE_FLOOR

    X, Y = _data()
    Xn, Yn = _data(3, seed=1)
    floor = NOISE_FLOOR * Y.var()
    with pytest.warns(NumericalWarning, match="floor"):
        tiny = _model(name, X, Y, train_Yvar=torch.full_like(Y, 1e-300))
    at_floor = _model(name, X, Y, train_Yvar=torch.full_like(Y, float(floor)))
    with pytest.warns(NumericalWarning, match="floor"):
        tiny.update(Xn, Yn, torch.full_like(Yn, 1e-300))
    at_floor.update(Xn, Yn, torch.full_like(Yn, float(NOISE_FLOOR * at_floor.outcome_std.pow(2))))
    Xt = _data(7, seed=2)[0]
    a, b = tiny.posterior(Xt), at_floor.posterior(Xt)
    torch.testing.assert_close(a.mean, b.mean, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(a.variance, b.variance, rtol=1e-8, atol=1e-12)
    if name == "wiski":
        tiny.fit(max_iter=5)
        p = tiny.posterior(Xt)
        assert torch.isfinite(p.mean).all() and torch.isfinite(p.variance).all()


@pytest.mark.parametrize("name", MODELS)
def test_huge_outputs_are_refused_and_the_model_is_unchanged(name):
    X, Y = _data()
    with pytest.raises(ValueError, match="Rescale Y"):
        _model(name, X, Y * 1e160)
    model = _model(name, X, Y)
    Xt = _data(5, seed=2)[0]
    before = model.posterior(Xt).mean.clone()
    with pytest.raises(ValueError, match="Rescale Y"):
        model.update(X[:2], torch.full((2, 1), 1e151, dtype=torch.float64))
    torch.testing.assert_close(model.posterior(Xt).mean, before, rtol=0, atol=0)


@pytest.mark.parametrize("name", MODELS)
def test_inputs_are_cast_to_the_model_dtype(name):
    r"""float32 and int64 inputs give what the same values in float64 give (BoTorch casts)."""
    X, Y = _data()
    model = _model(name, X, Y)
    X32 = _data(5, seed=3)[0].float()
    ref = model.posterior(X32.double())
    got = model.posterior(X32)
    assert got.mean.dtype == torch.float64
    torch.testing.assert_close(got.mean, ref.mean, rtol=0, atol=0)
    Xi = torch.tensor([[0, 1], [1, 0], [1, 1]])
    torch.testing.assert_close(
        model.posterior(Xi).mean, model.posterior(Xi.double()).mean, rtol=0, atol=0
    )
    twin = _model(name, X, Y)
    model.update(X32[:2], Y[:2].float())
    twin.update(X32[:2].double(), Y[:2].float().double())
    torch.testing.assert_close(
        model.posterior(X[:4]).mean, twin.posterior(X[:4]).mean, rtol=0, atol=0
    )


@pytest.mark.parametrize("name", MODELS)
def test_posterior_on_zero_points_is_empty_like_singletaskgp(name):
    from botorch.models import SingleTaskGP

    X, Y = _data()
    model, reference = _model(name, X, Y), SingleTaskGP(X, Y)
    for shape in [(0, 2), (4, 0, 2)]:
        Xe = torch.rand(*shape, dtype=torch.float64)
        got, want = model.posterior(Xe), reference.posterior(Xe)
        assert got.mean.shape == want.mean.shape and got.variance.shape == want.variance.shape
        assert got.mean.numel() == 0


# ------------------------------------------------------------------------------ Ax


def _ax_client(seed: int, name: str, **strategy_options):
    import logging

    from ax.api.client import Client
    from ax.api.configs import RangeParameterConfig
    from botorch.acquisition.logei import qLogExpectedImprovement

    import bo_online.ax as boax

    logging.getLogger("ax").setLevel(logging.ERROR)
    client = Client(random_seed=seed)
    client.configure_experiment(
        parameters=[
            RangeParameterConfig(name=f"x{i}", parameter_type="float", bounds=(0.0, 1.0))
            for i in range(2)
        ],
        name=name,
    )
    client.configure_optimization(objective="-y")
    client.set_generation_strategy(
        boax.make_generation_strategy(
            "OnlineExactGP",
            botorch_acqf_class=qLogExpectedImprovement,
            seed=seed,
            num_initial_trials=3,
            optimizer_options={"num_restarts": 1, "raw_samples": 16, "options": {"maxiter": 10}},
            fit_options={"max_iter": 10},
            **strategy_options,
        )
    )
    return client


def _ax_step(client, value=None):
    ((index, params),) = client.get_next_trials(max_trials=1).items()
    y = (params["x0"] - 0.3) ** 2 + (params["x1"] - 0.6) ** 2 if value is None else value
    client.complete_trial(index, raw_data={"y": y})


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_ax_non_finite_outcome_leaves_trials_generatable(bad):
    r"""One non-finite outcome is left out of the model with a warning; generation goes on, and the
    model holds exactly the finite outcomes."""
    import bo_online.ax as boax

    boax.clear_sessions()
    client = _ax_client(0, "inf")
    for _ in range(4):
        _ax_step(client)
    with warnings_ok():
        _ax_step(client, bad)
        for _ in range(3):
            _ax_step(client)
        client.get_next_trials(max_trials=1)  # a model on all 8 completed trials
    model = client._generation_strategy.adapter.generator.surrogate.model
    assert model.num_data == 7  # 8 trials, the non-finite one left out
    assert torch.isfinite(model.train_targets).all()


def warnings_ok():
    import warnings

    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.simplefilter("ignore")

    class _Exit:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            ctx.__exit__(*exc)

    return _Exit()


def test_ax_inf_outcome_warns():
    import bo_online.ax as boax

    boax.clear_sessions()
    client = _ax_client(1, "warn")
    for _ in range(3):
        _ax_step(client)
    _ax_step(client, float("inf"))
    with pytest.warns(RuntimeWarning, match="non-finite outcome"):
        _ax_step(client)


def test_ax_two_experiments_each_condition_incrementally():
    r"""Two experiments with the same parameter and metric names, interleaved in one process:
    each rebuilds once, then conditions incrementally (no rebuild caused by the other). A
    fixed refit cadence: at the default schedule the exact GP is rebuilt at every trial below
    100 observations, which would hide a rebuild caused by the other experiment."""
    import bo_online.ax as boax

    boax.clear_sessions()
    a, b = _ax_client(0, "a", refit_every=10), _ax_client(1, "b", refit_every=10)
    for _ in range(3):  # Sobol
        _ax_step(a)
        _ax_step(b)
    for _ in range(3):  # model trials, interleaved
        _ax_step(a)
        _ax_step(b)
    stats = boax.session_stats()
    assert stats.rebuilds == 2, list(stats.reasons)
    assert stats.incremental == 4


def test_python_objects_in_model_options_are_refused_before_running(tmp_path):
    r"""From Python, too: an option that is a live object other than data (here a function) is
    refused at construction, before any evaluation or file."""
    with pytest.raises(ValueError, match="not allowed"):
        BayesOptLoop(
            synthetic_problem("branin"), model_options={"x": os.system}, out_dir=tmp_path / "r"
        )
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------------------------------ the directory


def test_a_directory_that_holds_other_files_but_no_run_is_refused_and_kept(tmp_path, capsys):
    """A non-empty directory that holds no bo-online run (a user's project folder) is refused,
    with or without --overwrite, and every file in it stays as it was; an empty directory, or
    one holding a run, is used as before."""
    out = tmp_path / "myproj"
    (out / "plots").mkdir(parents=True)
    (out / "plots" / "figure1.png").write_bytes(b"mine")
    (out / "config.json").write_text('{"mine": 1}')
    for extra in ([], ["--overwrite"]):
        code, err = _cli(["bo", "--problem", "branin", "--out", out, *extra, *CLI_FAST], capsys)
        _one_line_error(code, err)
        assert "holds no bo-online run" in err
        assert (out / "plots" / "figure1.png").read_bytes() == b"mine"
        assert (out / "config.json").read_text() == '{"mine": 1}'
        assert not (out / history.RECORDS_FILE).exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    _small_run(empty)
    assert (empty / history.CHECKPOINT_FILE).exists()
    BayesOptLoop(synthetic_problem("branin"), seed=3, out_dir=empty, overwrite=True, **FAST).run(1)


def test_a_relative_run_directory_stays_put_when_the_objective_changes_directory(
    tmp_path, monkeypatch
):
    """The run directory is fixed when the loop is made: an objective that calls os.chdir
    does not send the checkpoint and records elsewhere."""
    from bo_online.problems import CallableProblem

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(tmp_path)

    def wanders(X):
        os.chdir(elsewhere)
        return ((X - 0.3) ** 2).sum(-1)

    problem = CallableProblem(wanders, [[0, 0], [1, 1]], name="wanders")
    BayesOptLoop(problem, seed=0, out_dir="runs/cd", **FAST).run(2)
    assert (tmp_path / "runs" / "cd" / history.CHECKPOINT_FILE).exists()
    assert not (elsewhere / "runs").exists()


@pytest.mark.parametrize("config", ["[]", "{", '"text"'])
def test_a_damaged_config_is_rewritten_on_resume_and_plot_still_works(tmp_path, capsys, config):
    """config.json is derived from the checkpoint: a damaged one does not stop `resume` (which
    writes it again) or `plot` (which then labels the run by its directory)."""
    out = tmp_path / "run"
    _small_run(out)
    (out / history.CONFIG_FILE).write_text(config)
    code, err = _cli(["plot", out, "--out", tmp_path / "plots"], capsys)
    assert code == 0, err
    code, err = _cli(["resume", out, "--steps", "2", "-Q", "--no-plots"], capsys)
    assert code == 0, err
    assert json.loads((out / history.CONFIG_FILE).read_text())["kind"] == "bo"


@pytest.mark.parametrize("line", ["{}", '{"step": "x"}', "[1, 2]"])
def test_records_that_are_not_a_runs_records_are_one_line_errors(tmp_path, capsys, line):
    """A records line without an integer step (hand-edited) is named as damage, for `plot` as
    for `resume` (which rewrites the records from the checkpoint)."""
    out = tmp_path / "run"
    _small_run(out)
    records = (out / history.RECORDS_FILE).read_text().splitlines()
    (out / history.RECORDS_FILE).write_text("\n".join([line] + records) + "\n")
    code, err = _cli(["plot", out, "--out", tmp_path / "plots"], capsys)
    _one_line_error(code, err)
    assert "damaged at line 1" in err
    code, err = _cli(["resume", out, "--steps", "2", "-Q", "--no-plots"], capsys)
    assert code == 0, err
    assert [r["step"] for r in read_records(out)] == [0, 1, 2]  # rewritten from the checkpoint
    (out / history.RECORDS_FILE).write_text((out / history.RECORDS_FILE).read_text() + line + "\n")
    with pytest.raises(history.RunFileError, match="damaged at line 4"):  # whole last line
        read_records(out)
    text = (out / history.RECORDS_FILE).read_text().splitlines()[:3]
    (out / history.RECORDS_FILE).write_text("\n".join(text + ['{"step": 3, "n"']) + "\n")
    with pytest.raises(history.RunFileError, match="damaged at line 4"):  # ends in its newline
        read_records(out)
    (out / history.RECORDS_FILE).write_text("\n".join(text + ['{"step": 3, "n"']))
    assert len(read_records(out)) == 3  # torn: no newline, the kill came mid-line


def test_resume_with_dask_of_a_run_that_is_not_asynchronous_says_so(tmp_path, capsys):
    """`resume --dask` on a plain run is refused before any cluster starts, saying to resume
    without --dask (not that the checkpoint is damaged); a run whose checkpoint is gone but whose
    records remain (past step 0) is told that it cannot be resumed and what can be done."""
    out = tmp_path / "run"
    _small_run(out)
    code, err = _cli(
        ["resume", out, "--steps", "2", "-Q", "--no-plots", "--dask", "local:1"], capsys
    )
    _one_line_error(code, err)
    assert "not an asynchronous (Dask) run" in err and "without --dask" in err
    assert "--overwrite" not in err
    (out / history.CHECKPOINT_FILE).unlink()
    code, err = _cli(["resume", out, "--steps", "2", "-Q", "--no-plots"], capsys)
    _one_line_error(code, err)
    assert "the checkpoint was removed, so the run cannot be resumed" in err


def test_run_files_get_the_permissions_of_any_file_the_user_creates(tmp_path):
    """Checkpoint, records and configuration are written through private temporary files but
    end with the usual permissions (0666 less the umask), not 0600."""
    out = tmp_path / "run"
    old = os.umask(0o027)
    try:
        _small_run(out)
    finally:
        os.umask(old)
    for name in (history.CHECKPOINT_FILE, history.RECORDS_FILE, history.CONFIG_FILE):
        assert (out / name).stat().st_mode & 0o777 == 0o640, name


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux boot time")
def test_a_live_holder_keeps_its_lock_when_the_wall_clock_steps(tmp_path, monkeypatch):
    r"""A clock step (NTP syncing a VM's clock) after a run took its lock: the holder still
    runs, so its lock is refused, not taken over as stale. psutil's create_time() adds the boot
    time as the clock now puts it, so with it the holder's identity changed and a second run
    took the directory."""
    import psutil._pslinux as pslinux

    out = tmp_path / "run"
    out.mkdir()
    live = subprocess.Popen(["sleep", "30"])
    try:
        identity = history._process_identity(live.pid)
        assert identity is not None
        lock = f"{live.pid}\nhost {socket.gethostname()}\nprocess {identity}\n"
        (out / history.LOCK_FILE).write_text(lock)
        boot_time = pslinux.boot_time
        monkeypatch.setattr(pslinux, "boot_time", lambda: boot_time() + 3.0)  # clock stepped
        with pytest.raises(history.RunFileError, match=f"in use by process {live.pid}"):
            history.RunLock(out).acquire()
        assert (out / history.LOCK_FILE).read_text() == lock
    finally:
        live.kill()
        live.wait()


def test_a_resumed_run_whose_first_rewrite_failed_on_a_full_disk_runs_when_retried(
    tmp_path, monkeypatch
):
    r"""A resumed run rewrites its records, then its configuration, when it goes on; the
    configuration's write failing (a full disk) left the records as this loop had rewritten
    them but unnoted, so run() again, once space was freed, was refused as if the run had gone
    on elsewhere ("the run files ... have changed since this loop last wrote or loaded them")."""
    out = tmp_path / "run"
    BayesOptLoop(synthetic_problem("branin"), seed=3, out_dir=out, quiet=True, **FAST).run(2)
    loop = load_loop(out)
    real = history.write_json

    def full(path, obj):
        raise history._write_error(Path(path), OSError(28, "No space left on device"))

    monkeypatch.setattr(history, "write_json", full)
    with pytest.raises(history.RunFileError, match="No space left"):
        loop.run(4)
    monkeypatch.setattr(history, "write_json", real)
    loop.run(4)  # space freed: the same loop goes on
    assert without_timing(read_records(out)) == _reference(4)
    assert json.loads((out / history.CONFIG_FILE).read_text())["kind"] == "bo"


def test_a_run_retried_after_a_record_write_failed_keeps_every_record(tmp_path, monkeypatch):
    r"""A record whose append failed (a full disk: part of its line written) is a step the loop
    has done; run() again on the same loop, once space was freed, appended the next records
    after the torn line: a records file damaged in its middle (or, with nothing written, a step
    missing). The file is now rewritten whole before the loop writes again."""
    out = tmp_path / "run"
    loop = BayesOptLoop(synthetic_problem("branin"), seed=3, out_dir=out, **FAST)
    real = history._append_line
    calls = {"n": 0}

    def torn(path, line):
        calls["n"] += 1
        if calls["n"] == 3:  # step 2's record: half of it fits on the disk
            real(path, line[: len(line) // 2])
            raise OSError(28, "No space left on device")
        real(path, line)

    monkeypatch.setattr(history, "_append_line", torn)
    with pytest.raises(history.RunFileError, match="No space left"):
        loop.run(4)
    monkeypatch.setattr(history, "_append_line", real)
    loop.run(4)  # space freed: the same loop goes on
    assert without_timing(read_records(out)) == _reference(4)


def test_loading_a_path_that_is_no_directory_creates_nothing(tmp_path):
    r"""load_loop / resume of a mistyped run directory created it (and its parents) to take the
    lock, leaving empty directories behind, and a path naming a file raised a bare
    FileExistsError from that mkdir. Both are now refused with one line, and nothing is made."""
    from bo_online.loops import resume

    missing = tmp_path / "runs" / "typo"
    for call in (load_loop, resume):
        with pytest.raises(FileNotFoundError, match="No run directory"):
            call(missing)
    assert list(tmp_path.iterdir()) == []
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(FileNotFoundError, match="No run directory.*is a file"):
        load_loop(afile)
    assert afile.read_text() == "x"
