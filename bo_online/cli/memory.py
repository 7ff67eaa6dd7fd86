r"""Memory checks before a run starts: the host's (or a CUDA card's) memory against what the
chosen sizes need (grids, features, dense kernel matrices), for new runs, resumes and sweeps."""

from __future__ import annotations

import math
from typing import Any

from bo_online.cli.checks import _SIZE_OPTIONS, _check


def _gpu_index(device: str) -> int | None:
    r"""The index of the CUDA device ``device`` names if this machine has it, else None: a string
    that is no device, or a CUDA device that is absent (``cuda:1`` on a one-GPU machine, or no
    CUDA at all), is refused with its own message once the run is built."""
    import torch

    try:
        where = torch.device(device)
    except RuntimeError:
        return None
    if where.type != "cuda" or not torch.cuda.is_available():
        return None
    index = where.index if where.index is not None else torch.cuda.current_device()
    return index if index < torch.cuda.device_count() else None


def _memory_bytes(device: str = "cpu") -> int:
    r"""Total memory where a run on ``device`` keeps its matrices: the GPU's for a CUDA device
    (a 16 GB card in a 64 GB host is full long before the host is), the host's otherwise."""
    import os

    import torch

    index = _gpu_index(device)
    if index is not None:
        return int(torch.cuda.get_device_properties(index).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 2**40


def _memory_name(device: str) -> str:
    """How the messages name the memory of :func:`_memory_bytes`."""
    return f"the {device} GPU's" if _gpu_index(device) is not None else "this machine's"


def _check_sizes(options: dict[str, Any], dim: int | None, dtype: str, device: str = "cpu") -> None:
    r"""Size options (``grid_size``, inducing points, ...) are positive integers, and the m x m
    matrices they imply fit in memory: estimate 4 m^2 x (8 or 4 bytes), m = prod(grid sizes)."""
    itemsize = 4 if dtype == "float32" else 8
    for key in _SIZE_OPTIONS:
        if key not in options or options[key] is None:
            continue
        value = options[key]
        if key != "grid_size" and isinstance(value, list):
            continue  # explicit points (e.g. inducing point coordinates), not a size
        values = value if isinstance(value, list) else [value]
        _check(
            all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values),
            f"--model-option {key} must be an integer >= 1 (or a list of them), got {value!r}.",
        )
        m = math.prod(values)
        if key == "grid_size" and not isinstance(value, list):
            proj = options.get("projection")
            k = dim if dim is not None and dim <= 3 else 2
            if isinstance(proj, dict):
                kw, args = proj.get("kwargs", {}), proj.get("args", [])
                k = kw.get("out_dim", args[1] if len(args) > 1 else 2)
            m = value ** max(int(k) if isinstance(k, int) else 1, 1)
        need, have = 4 * m * m * itemsize, _memory_bytes(device)
        _check(
            need <= have,
            f"--model-option {key}={value!r} gives m = {m} and needs about {need / 1e9:.3g} GB "
            f"of memory (4 m x m matrices), more than {_memory_name(device)} "
            f"{have / 1e9:.3g} GB; choose a smaller {key}.",
        )


def _check_dense_memory(
    model: str, n: int, dtype: str, stop: str = "--steps", device: str = "cpu"
) -> None:
    r"""A model that holds its ``n`` points' ``n x n`` kernel matrix and factor (the exact GP,
    SingleTaskGP) must fit in memory at the run's last ``n``: estimate 4 n^2 x (8 or 4 bytes),
    as for the grids. A user's file of 100,000 rows streamed into the default exact GP would
    run for hours (its refits are O(n^3)) and be killed for memory long before its end."""
    if model not in ("exact", "singletaskgp"):
        return
    need, have = 4 * n * n * (4 if dtype == "float32" else 8), _memory_bytes(device)
    _check(
        need <= have,
        f"--model {model} holds an n x n factor of the points seen: by the run's end (n = {n:,}) "
        f"about {need / 1e9:,.3g} GB (4 n x n matrices), more than {_memory_name(device)} "
        f"{have / 1e9:.3g} GB; use --model tsvgp (a fixed cost per point), or stop "
        f"earlier with {stop}.",
    )


#: Thompson sampling's joint posterior over ``c`` candidates allocated at its peak about 4
#: (``SingleTaskGP``), 7-8 (the exact GP, WISKI, the decoupled SVGP, QSGP) and 10 (t-SVGP)
#: ``c x c`` matrices (the covariance made dense, its scaling to the outcome's units, the
#: Cholesky factor); the estimate rounds up.
TS_CANDIDATE_MATRICES = 12


def _check_candidates_memory(
    num_candidates: int,
    dtype: str,
    option: str = "--num-candidates",
    where: str = "",
    device: str = "cpu",
) -> None:
    r"""Thompson sampling (``--acq ts``) draws one joint posterior sample over its ``c``
    candidates, whose ``c x c`` covariance and factor must fit in memory: estimate
    :data:`TS_CANDIDATE_MATRICES` ``c^2 x (8 or 4 bytes)``. ``--num-candidates 20000`` needs
    about 26 GB with the exact GP: on a 25 GB machine the run was killed for memory at its first
    step (under a memory limit, a traceback), after its initial design had been evaluated.
    ``option`` names the setting, ``where`` (e.g. the sweep's campaign) ends the message."""
    itemsize = 4 if dtype == "float32" else 8
    c, have = int(num_candidates), _memory_bytes(device)
    need = TS_CANDIDATE_MATRICES * c * c * itemsize
    largest = math.isqrt(have // (TS_CANDIDATE_MATRICES * itemsize))
    _check(
        need <= have,
        f"--acq ts samples jointly over its {c:,} candidates: about {need / 1e9:,.3g} GB "
        f"({TS_CANDIDATE_MATRICES} c x c matrices), more than {_memory_name(device)} "
        f"{have / 1e9:.3g} GB; give {option} {largest:,} or fewer{where}.",
    )


def _check_resume_memory(loop: Any, steps: int | None) -> None:
    r"""A resumed run into a dense model (the exact GP, SingleTaskGP) must fit in memory at its
    last ``n``, as a new run must: ``--steps`` can extend a run far beyond what it was started
    for. The last ``n`` is the checkpoint's plus ``q`` points per step still to run, to the
    steps :meth:`~bo_online.loops.core.OnlineLoop.run` takes (a stream driven by ``step()``
    from Python has no target: it runs to its end). Checked once the run is loaded, which
    writes nothing: a ``--steps`` beyond what a stream or pool holds is left to ``run``, whose
    message names that limit (the ``n`` it implies could not be reached)."""
    target = steps if steps is not None else loop.target_steps
    if target is None:
        target = loop.default_steps()
    limit = loop.max_steps()
    if target is None or not loop.records or (limit is not None and target > limit):
        return
    to_run = max(0, int(target) - loop.step_count)
    n_end = int(loop.records[-1]["n"]) + int(loop.config["q"]) * to_run
    _check_dense_memory(
        loop.config["model"],
        n_end,
        loop.config["dtype"],
        "a smaller --steps",
        device=str(loop.config.get("device", "cpu")),
    )


def _check_campaign_memory(campaign: Any) -> None:
    r"""A sweep's campaign must fit in memory as a ``bo`` run must (a worker that runs out of it
    fails the campaign, hours in for a dense model): a dense model at its last ``n``, Thompson
    sampling's joint posterior over its candidates."""
    options = campaign.options
    dtype = str(options.get("dtype", "float64"))
    candidates = options.get("acq_options", {}).get("num_candidates", 1000)
    if campaign.acq == "ts" and isinstance(candidates, int) and not isinstance(candidates, bool):
        where = f" (campaign {campaign.name})"
        _check_candidates_memory(candidates, dtype, "num_candidates in acq_options", where)
    if campaign.model not in ("exact", "singletaskgp"):
        return
    from bo_online.loops.bayesopt import default_n_init
    from bo_online.problems import synthetic_problem

    p = campaign.problem
    dim = p.get("dim") or synthetic_problem(p["name"]).dim
    n_init = options.get("n_init", default_n_init(dim))
    n = int(n_init) + int(options.get("q", 1)) * campaign.steps
    where = f"a smaller steps in the spec (campaign {campaign.name})"
    _check_dense_memory(campaign.model, n, dtype, where)
