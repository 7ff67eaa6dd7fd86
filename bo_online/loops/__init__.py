r"""Ask/tell loops: Bayesian optimisation, active learning and streaming regression and
classification.

Each loop writes one record per step to ``<out_dir>/records.jsonl`` as it happens and a checkpoint
regularly (by default at most every 30 s, and always at the end and on SIGINT/SIGTERM);
:func:`resume` continues a run from its directory (e.g. after the process was killed) and yields
the same records an uninterrupted run would have.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from bo_online.loops import history
from bo_online.loops.bayesopt import BayesOptLoop
from bo_online.loops.core import OnlineLoop, RunDirectoryError
from bo_online.loops.history import read_records, without_timing

__all__ = [
    "BayesOptLoop",
    "ActiveLearningLoop",
    "StreamingLoop",
    "OnlineLoop",
    "RunDirectoryError",
    "load_loop",
    "resume",
    "read_records",
    "without_timing",
]


def _loop_classes() -> dict[str, type]:
    from bo_online.loops.active import ActiveLearningLoop
    from bo_online.loops.async_bo import AsyncBayesOptLoop
    from bo_online.loops.streaming import StreamingLoop

    return {
        "bo": BayesOptLoop,
        "bo_async": AsyncBayesOptLoop,
        "active": ActiveLearningLoop,
        "stream": StreamingLoop,
    }


#: the options a resumed run may be given anew (:func:`load_loop`): how it runs, not what it
#: computes
RESUME_OVERRIDES = ("quiet", "executor", "client", "data_dir", "device", "data", "test_mask")


def load_loop(out_dir: str | Path, problem: Any = None, **overrides: Any) -> OnlineLoop:
    r"""Rebuild the loop saved in ``out_dir`` at its last checkpoint.

    Args:
        out_dir: the run directory.
        problem: the problem object, needed only when the run used a user callable.
        **overrides: runtime options that do not change the trajectory: ``quiet``,
            ``executor``, ``client`` (a ``distributed.Client``; asynchronous runs), and
            ``data_dir`` (where pool/stream data are read from), and ``device``: where the
            run continues, instead of its own (a run copied from a GPU machine to one
            without; the steps from there on are computed on that device), and ``data``: the
            new path of a run's own data file (``stream_from_file`` / ``pool_from_file``) that
            was moved or copied elsewhere; it must hold the very bytes the run started on (the
            SHA-256 its checkpoint records), and the run's next checkpoint records the new
            path; likewise ``test_mask``, the new path of its test-mask file. Anything else
            (``model``, ``seed``, a misspelt name) raises ``TypeError``: the run keeps its
            settings.
    """
    unknown = sorted(set(overrides) - set(RESUME_OVERRIDES))
    if unknown:
        # Otherwise the loop's constructor refused them, reported as a damaged checkpoint
        # whose advice (--overwrite) would discard the run.
        raise TypeError(
            f"A resumed run cannot take {', '.join(map(repr, unknown))}: it continues with the "
            "settings it started with (its checkpoint's). Only "
            f"{', '.join(RESUME_OVERRIDES)} can be given (and the steps, to resume()); for "
            "other settings start a new run in another directory."
        )
    if problem is not None and any(overrides.get(k) is not None for k in ("data", "test_mask")):
        raise TypeError(
            "Give either problem= (the run's problem, rebuilt by you) or data= / test_mask= "
            "(the new place of the run's own files), not both: the problem given would be used "
            "and the files ignored."
        )
    out_dir = Path(out_dir)
    if not out_dir.is_dir():  # before the lock, which would create a mistyped directory
        raise FileNotFoundError(
            f"No run directory {str(out_dir)!r}"
            + (" (it is a file)" if out_dir.exists() else "")
            + ": give the directory the run was written to (its --out / out_dir)."
        )
    ckpt_path = out_dir / history.CHECKPOINT_FILE
    # only without a checkpoint: the records of a long stream are not read on every resume
    last = None if ckpt_path.is_file() else history.last_recorded_step(out_dir)
    if last is not None and last > 0:
        raise history.RunFileError(
            f"{str(out_dir)!r} has no checkpoint, though its records go to step {last}: the "
            "checkpoint was removed, so the run cannot be resumed (its records stay readable, "
            "e.g. by bo-online plot). Restore checkpoint.pt from a copy, or start the run again "
            "in another directory (or here with --overwrite, which replaces these records)."
        )
    if not ckpt_path.is_file() and (out_dir / history.RECORDS_FILE).is_file():
        raise history.RunFileError(
            f"{str(out_dir)!r} has no checkpoint: its run was stopped before the first one was "
            "written. Start it again with the same command and --out (nothing is lost)."
        )
    # Lock before anything is read or rewritten: a second resume on a directory in use stops here.
    lock = history.RunLock(out_dir)
    lock.acquire()
    try:
        history.remove_orphans(out_dir)
        ckpt = history.load_checkpoint(ckpt_path)
        classes = _loop_classes()
        if ckpt.get("kind") not in classes:
            raise history.RunFileError(
                f"{str(ckpt_path)!r}: unknown run kind {ckpt.get('kind')!r}."
            )
        # config.json as the checkpoint wrote it, before this call moves anything
        saved = {**ckpt.get("config", {}), "problem": ckpt.get("problem")}
        data = overrides.pop("data", None)
        if data is not None:
            ckpt["problem"] = _relocated_problem(ckpt.get("problem"), data, out_dir)
        mask = overrides.pop("test_mask", None)
        if mask is not None:
            ckpt["problem"] = _relocated_mask(ckpt.get("problem"), mask, out_dir)
        device = overrides.pop("device", None)
        if device is not None:
            ckpt["config"] = {**ckpt["config"], "device": str(device)}
        else:
            _check_stored_device(ckpt["config"].get("device"), out_dir)
        if overrides.get("client") is not None and ckpt["kind"] != "bo_async":
            raise TypeError(
                f"client= is for asynchronous (Dask) runs; the run in {str(out_dir)!r} is of "
                f"kind {ckpt['kind']!r}: resume it without client= (executor= runs its "
                "evaluations in parallel)."
            )
        try:
            loop = classes[ckpt["kind"]].from_checkpoint(
                ckpt, out_dir, problem=problem, **overrides
            )
        except (KeyError, TypeError, IndexError, AttributeError) as e:
            raise history.RunFileError(
                f"The checkpoint {str(ckpt_path)!r} is incomplete or not of this bo-online version "
                f"({type(e).__name__}: {e}); start the run again with --overwrite."
            ) from e
        _warn_edited_config(out_dir, saved)
    except BaseException:
        lock.release()
        raise
    loop._lock = lock
    return loop


def _warn_edited_config(out_dir: Path, saved: dict[str, Any]) -> None:
    r"""Warn, naming the settings, when the run's ``config.json`` disagrees with the
    configuration its checkpoint ``saved`` (edited by hand to change a setting): the run goes
    on with its checkpoint's settings and rewrites the file from them, so the edit would
    otherwise vanish without a word. What the resume itself changes (a device, a data file's
    place, an objective file's new hash) is not compared, nor are keys only one side holds (a
    run saved by another version); an unreadable file is rewritten, as before."""
    try:
        stored = json.loads((out_dir / history.CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(stored, dict):
        return
    current = json.loads(json.dumps(history.to_jsonable(saved)))
    edited = sorted(k for k in set(stored) & set(current) if stored[k] != current[k])
    if edited:
        shown = "; ".join(f"{k}: {current[k]!r} in the checkpoint" for k in edited)
        warnings.warn(
            f"{str(out_dir / history.CONFIG_FILE)!r} differs from the run's checkpoint in "
            f"{', '.join(edited)} ({shown}): a resumed run keeps the settings it started with "
            f"and rewrites {history.CONFIG_FILE} from them, so the edit changes nothing. For "
            "other settings start a new run in another directory.",
            UserWarning,
            stacklevel=3,
        )


def _relocated_problem(spec: Any, data: str | Path, out_dir: Path) -> dict[str, Any]:
    r"""The checkpoint's problem ``spec`` of a run on a data file, pointing at ``data``, the
    file's new place: refused (nothing changed) unless the run is on a data file and ``data``
    holds the bytes it started on (the recorded SHA-256)."""
    from bo_online.userdata import DataFileError

    if not (isinstance(spec, dict) and spec.get("name") == "file"):
        name = spec.get("name") if isinstance(spec, dict) else None
        problem = "was built in Python" if name is None else f"is {name!r}"
        raise DataFileError(
            f"The run in {str(out_dir)!r} is not on a data file of yours (its problem "
            f"{problem}), so --data cannot give it one; resume it without --data"
            + (" (a shared set is found with --data-dir)." if name is not None else ".")
        )
    path = _same_file_moved(data, spec["path"], spec["sha256"], "data file", out_dir)
    return {**spec, "path": str(path)}


def _same_file_moved(new: str | Path, old: str, sha256: str, what: str, out_dir: Path) -> Path:
    r"""``new`` resolved, if it is a file holding the bytes the run in ``out_dir`` started on
    (``sha256``) at ``old``; else a one-line error naming the option that gives ``what``."""
    from bo_online.userdata import DataChangedError, DataFileError, file_sha256

    option = {"data file": "--data", "test-mask file": "--test-mask"}[what]
    path = Path(new).expanduser()
    if not path.is_file():
        raise DataFileError(
            f"{path}: no such file; give {option} the run's {what} in its new place (it "
            f"started on {old})."
        )
    actual = file_sha256(path)
    if actual != sha256:
        raise DataChangedError(
            f"{path} is not the {what} the run in {str(out_dir)!r} started on ({old}): its "
            f"SHA-256 is {actual[:12]}... instead of {sha256[:12]}...; give {option} an "
            "unchanged copy of that file, or start a new run on this one."
        )
    return path.resolve()


def _relocated_mask(spec: Any, mask: str | Path, out_dir: Path) -> dict[str, Any]:
    r"""The checkpoint's problem ``spec`` of a run on a data file with a test-mask file,
    pointing at ``mask``, that file's new place: refused (nothing changed) unless the run has a
    test-mask file and ``mask`` holds the bytes it started on (the recorded SHA-256)."""
    from bo_online.userdata import DataFileError

    recorded = spec.get("test_mask_sha256") if isinstance(spec, dict) else None
    if recorded is None and isinstance(spec, dict) and isinstance(spec.get("test_mask"), str):
        if Path(spec["test_mask"]).is_absolute():  # a file, from before its SHA-256 was stored
            raise DataFileError(
                f"The run in {str(out_dir)!r} recorded no SHA-256 of its test-mask file "
                f"{spec['test_mask']} (it started before bo-online stored one), so a copy "
                "elsewhere cannot be checked; put the file back at that path and resume without "
                "--test-mask."
            )
    if recorded is None:
        raise DataFileError(
            f"The run in {str(out_dir)!r} has no test-mask file (its test rows are a column of "
            "its data file or a random fraction), so --test-mask cannot move one; resume it "
            "without --test-mask."
        )
    path = _same_file_moved(mask, spec["test_mask"], recorded, "test-mask file", out_dir)
    return {**spec, "test_mask": str(path)}


def _check_stored_device(stored: Any, out_dir: Path) -> None:
    r"""Refuse, saying what to do, a run whose own device (``stored``: its configuration's) this
    machine lacks, e.g. a run copied from a GPU machine: the loop would report the device as
    'requested', though the user asked for none."""
    import torch

    try:
        device = torch.device(str(stored))
    except RuntimeError:
        return  # the loop reports it
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device.type != "cuda" or (device.index or 0) < count:
        return
    # the run's own resume command (quoted, with its --objective / --dask), plus the device
    command = f"{history._resume_command_of(out_dir)} --device cpu"
    raise ValueError(
        f"The run in {str(out_dir)!r} ran on {str(stored)!r}, which this machine lacks "
        f"({count} CUDA device(s)); continue it on another device with `{command}` (Python: "
        "device='cpu'), or on a machine that has it."
    )


def resume(
    out_dir: str | Path, steps: int | None = None, problem: Any = None, **overrides: Any
) -> list[dict[str, Any]]:
    r"""Continue the run in ``out_dir`` to its target number of steps (or ``steps``)."""
    loop = load_loop(out_dir, problem=problem, **overrides)
    try:
        return loop.run(steps)
    finally:
        # load_loop's lock is held to exit for a loop the caller steps; this one is done (run
        # releases it too, but not when it refuses its steps before taking the directory)
        if loop._lock is not None:
            loop._lock.release()


def __getattr__(name: str) -> Any:
    if name in ("ActiveLearningLoop", "StreamingLoop"):
        return _loop_classes()["active" if name == "ActiveLearningLoop" else "stream"]
    raise AttributeError(name)
