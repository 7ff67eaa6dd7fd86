r"""Checks of command-line values before anything runs or is written: counts, seeds, noise,
the output directory, ``--model-option`` literals, refit schedules, data-file options."""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path
from typing import Any

from bo_online.cli.application import CLIError


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise CLIError(message)


def _nonneg(name: str, value: int) -> None:
    _check(value >= 0, f"{name} must be >= 0, got {value}.")


def _positive(name: str, value: int) -> None:
    _check(value >= 1, f"{name} must be >= 1, got {value}.")


def _no_workers_timeout(value: float) -> float | None:
    r"""``--no-workers-timeout SECONDS``: a positive number of seconds, or ``inf`` (None: wait
    for workers forever)."""
    import math

    _check(
        value > 0,  # also refuses NaN
        "--no-workers-timeout must be a positive number of seconds (how long the cluster may "
        f"have no worker while evaluations are in flight) or inf to wait forever, got {value}.",
    )
    return None if math.isinf(value) else float(value)


def _refit_schedule(value: str | None) -> int | str:
    """``--refit-every``: ``auto`` (also when left out) or a cadence in steps (>= 0)."""
    if value is None or value.strip().lower() == "auto":
        return "auto"
    try:
        steps = int(value)
    except ValueError:
        steps = -1
    _check(steps >= 0, f"--refit-every must be 'auto' or an integer >= 0, got {value!r}.")
    return steps


_CALL = re.compile(r"^\s*([A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)+)\s*\((.*)\)\s*$", re.S)


def _parse_call(raw: str) -> dict[str, Any] | None:
    r"""``package.module.Class(1, k=2)`` -> ``{"__class__": ..., "args": [1], "kwargs": {"k": 2}}``
    (arguments must be literals), or None if ``raw`` is not such a call."""
    match = _CALL.match(raw)
    if match is None:
        return None
    try:
        call = ast.parse(f"f({match.group(2)})", mode="eval").body
        args = [ast.literal_eval(a) for a in call.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    except (SyntaxError, ValueError) as e:
        raise CLIError(f"--model-option value {raw!r}: arguments must be literals ({e}).") from e
    return {"__class__": match.group(1), "args": args, "kwargs": kwargs}


def _parse_options(items: list[str] | None) -> dict[str, Any]:
    r"""``--model-option`` values -> the options dict; object values must name allow-listed
    classes (:mod:`bo_online.loops.options`), checked here before anything is imported or built."""
    from bo_online.loops.options import check_options

    options: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        _check(bool(sep) and key.strip() != "", f"--model-option expects key=value, got {item!r}.")
        value = _parse_call(raw)
        if value is None:
            try:
                value = json.loads(raw)
            except json.JSONDecodeError:
                value = {"True": True, "False": False, "None": None}.get(raw, raw)
        options[key.strip()] = value
    check_options(options)
    return options


# Limits checked before any file is written or any evaluation made (see docs/usage.md).
#: largest --dim of a test function: the surrogates and acquisition optimisation here target
#: low/moderate dimension (WISKI projects to <= 3 features); at d > 100 a BO step's optimise_acqf
#: alone takes minutes, so larger d is refused rather than left to run silently.
MAX_DIM = 100


#: largest --q of the bo command: q-batch acquisitions optimise q x d variables jointly and hold
#: raw_samples x q x q covariances; beyond 100 a step takes minutes to hours.
MAX_Q = 100


#: largest observation-noise std: outputs must stay far below the 1e150 standardisation limit.
MAX_NOISE = 1e100


MAX_SEED = 2**63 - 1


#: model options that are sizes: integers >= 1; each m gives m x m matrices in the model.
_SIZE_OPTIONS = (
    "grid_size",
    "inducing_points",
    "num_inducing",
    "num_mean_bases",
    "num_features",
    "num_dense_columns",
)


def _check_beta(beta: float) -> None:
    _check(math.isfinite(beta) and beta >= 0, f"--beta must be a finite number >= 0, got {beta}.")


def _check_noise(noise: float) -> None:
    _check(
        math.isfinite(noise) and 0 <= noise <= MAX_NOISE,
        f"--noise must be a finite std between 0 and {MAX_NOISE:g}, got {noise}.",
    )


def _check_seed(seed: int) -> None:
    _check(0 <= seed <= MAX_SEED, f"--seed must be between 0 and 2**63-1, got {seed}.")


def _check_out(out: Path | None) -> None:
    if out is not None:
        _check(
            not out.exists() or out.is_dir(),
            f"--out {str(out)!r} is an existing file; give a directory.",
        )


def _check_model(name: str) -> None:
    from bo_online.models.registry import get_model_class

    get_model_class(name)  # raises a one-line ModelUnavailableError (a ValueError)


def _columns(raw: str | None) -> list[str] | None:
    """``"a,b,3"`` -> ``["a", "b", "3"]`` (names or indices, resolved against the file)."""
    if raw is None:
        return None
    columns = [c.strip() for c in raw.split(",") if c.strip()]
    _check(bool(columns), f"--inputs expects comma-separated column names or indices, got {raw!r}.")
    return columns


def _tracks(raw: str | None) -> tuple[int, ...]:
    from bo_online.datasets import MAGNETOMETER_TRACKS

    if raw is None:
        return MAGNETOMETER_TRACKS
    try:
        tracks = tuple(int(t) for t in raw.split(",") if t.strip())
    except ValueError:
        raise CLIError(
            f"--tracks expects comma-separated track numbers 1..9, got {raw!r}."
        ) from None
    _check(
        bool(tracks) and all(t in MAGNETOMETER_TRACKS for t in tracks),
        f"--tracks expects comma-separated track numbers 1..9, got {raw!r}.",
    )
    _check(
        len(set(tracks)) == len(tracks),
        f"--tracks lists a track more than once ({raw!r}): name each track once.",
    )
    return tracks


def _file_options(file: Path | None, flag: str, **options: Any) -> None:
    """Options that only make sense with a data file; the fraction's range."""
    if file is None:
        given = [f"--{k.replace('_', '-')}" for k, v in options.items() if v is not None]
        _check(
            not given,
            f"{', '.join(given)} only {'applies' if len(given) == 1 else 'apply'} to "
            f"your own data file ({flag} FILE).",
        )
        return
    _check(
        options.get("test_fraction") is None or options.get("test_mask") is None,
        "Give --test-fraction or --test-mask, not both.",
    )
    fraction = options.get("test_fraction")
    _check(
        fraction is None or 0 < fraction < 1, f"--test-fraction must be in (0, 1), got {fraction}."
    )


def _check_resume_steps_within_data(loop: Any, steps: int | None) -> None:
    r"""Refuse a ``--steps`` beyond what the resumed run's pool or stream holds, in the CLI's
    words (the loop's own error says ``steps=N``, the Python argument)."""
    limit = loop.max_steps()
    _check(
        steps is None or limit is None or steps <= limit,
        f"--steps {steps} exceeds the {limit} steps the data hold "
        f"({loop.config['n_init']} initial points, then --q {loop.config['q']} per step); "
        f"give --steps {limit} or fewer.",
    )


def _check_resume_steps(done: int, steps: int | None) -> None:
    r"""Refuse a ``--steps`` below the ``done`` steps of the run's checkpoint."""
    _check(
        steps is None or steps >= done,
        f"--steps {steps} is below the {done} steps this run has already done; "
        "pass a larger --steps to extend it, or leave it out to finish the original target.",
    )
