r"""Campaign sweeps on a Dask cluster: problems x models x acquisitions x seeds.

A spec file (TOML, or YAML with PyYAML) lists the campaigns::

    steps = 40                          # BO steps after the initial design
    problems = ["branin", "hartmann3"]  # names, or tables {name = "levy", dim = 3, noise = 0.1}
    models = ["exact", "wiski"]
    acqs = ["qucb", "ts"]
    seeds = [0, 1, 2]

    [options]                           # BayesOptLoop options shared by every campaign
    q = 1
    refit_every = 10
    optimizer_options = {num_restarts = 4, raw_samples = 128}

Each campaign is one Dask task (a synchronous :class:`bo_online.loops.BayesOptLoop`) writing to
``OUT/<problem>-<model>-<acq>-s<seed>``. Running the sweep again skips finished campaigns and
resumes interrupted ones from their checkpoints; adding seeds (or steps) only runs what is new.
At the end :func:`summarize` tabulates final regret per campaign and :func:`plot_sweep` draws, per
problem, mean regret with 2-SE bands over seeds vs evaluations and vs wall time.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import sys
import threading
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bo_online.errors import CampaignError, describe

__all__ = [
    "Campaign",
    "CampaignError",
    "load_spec",
    "campaigns",
    "run_campaign",
    "run_sweep",
    "summarize",
    "write_summary",
    "plot_sweep",
    "dask_client",
    "map_on_cluster",
]

_SPEC_KEYS = {"steps", "problems", "models", "acqs", "seeds", "options"}


@dataclass(frozen=True)
class Campaign:
    """One BO run of a sweep."""

    problem: dict[str, Any]  # {"name", "dim", "noise"}
    model: str
    acq: str
    seed: int
    steps: int
    options: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def name(self) -> str:
        p = self.problem
        tag = p["name"] + (f"{p['dim']}d" if p.get("dim") else "")
        tag += f"-noise{p['noise']:g}" if p.get("noise") else ""
        return f"{tag}-{self.model}-{self.acq}-s{self.seed}"

    @property
    def problem_label(self) -> str:
        return self.name.rsplit(f"-{self.model}-{self.acq}-s", 1)[0]


def load_spec(path: str | os.PathLike) -> dict[str, Any]:
    r"""Read and check a sweep spec (``.toml``, or ``.yaml`` / ``.yml`` with PyYAML)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"No sweep spec at {str(path)!r}.")
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        try:
            spec = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ValueError(f"{path}: invalid YAML: {e}") from e
    else:
        try:
            spec = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: invalid TOML: {e}") from e
    if not isinstance(spec, dict):
        raise ValueError(
            f"{path}: the spec must be a table of steps, problems, models, acqs, seeds."
        )
    unknown = set(spec) - _SPEC_KEYS
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {sorted(unknown)}; known: {sorted(_SPEC_KEYS)}.")
    for key in ("problems", "models", "acqs", "seeds"):
        if not isinstance(spec.get(key), list) or not spec[key]:
            raise ValueError(f"{path}: {key!r} must be a non-empty list.")
    for key in ("models", "acqs"):
        if not all(isinstance(name, str) for name in spec[key]):
            raise ValueError(f"{path}: {key!r} must be a list of names, got {spec[key]!r}.")
    steps = spec.get("steps")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise ValueError(f"{path}: 'steps' must be an integer >= 0, got {steps!r}.")
    if not all(
        isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**63 for s in spec["seeds"]
    ):
        raise ValueError(
            f"{path}: 'seeds' must be integers >= 0 and below 2**63, got {spec['seeds']!r}."
        )
    if not isinstance(spec.get("options", {}), dict):
        raise ValueError(f"{path}: [options] must be a table of BayesOptLoop options.")
    return spec


def _problem(entry: Any) -> dict[str, Any]:
    if isinstance(entry, str):
        return {"name": entry, "dim": None, "noise": 0.0}
    if isinstance(entry, dict) and "name" in entry and set(entry) <= {"name", "dim", "noise"}:
        if not isinstance(entry["name"], str):
            raise ValueError(f"A problem's name must be a string, got {entry['name']!r}.")
        dim = entry.get("dim")
        if dim is not None and (not isinstance(dim, int) or isinstance(dim, bool)):
            raise ValueError(
                f"Problem {entry['name']!r}: give an integer 'dim' (the number of inputs), "
                f"got {dim!r}."
            )
        noise = entry.get("noise", 0.0)
        if not isinstance(noise, (int, float)) or isinstance(noise, bool):
            raise ValueError(
                f"Problem {entry['name']!r}: give a number 'noise' (the standard deviation of "
                f"the observation noise), got {noise!r}."
            )
        if isinstance(noise, int) and abs(noise) > sys.float_info.max:  # TOML/YAML: no limit
            raise ValueError(
                f"Problem {entry['name']!r}: give a number 'noise' (the standard deviation of "
                f"the observation noise) within float range, got an integer beyond it."
            )
        return {"name": entry["name"], "dim": dim, "noise": float(noise)}
    raise ValueError(f"A problem is a name or a table {{name, dim, noise}}, got {entry!r}.")


def campaigns(spec: dict[str, Any]) -> list[Campaign]:
    r"""Every campaign of a spec (problems x models x acqs x seeds); checks names up front."""
    from bo_online.acquisition import ACQ_OPTIONS, ACQUISITIONS, known_acq_options
    from bo_online.models.registry import get_model_class
    from bo_online.problems import synthetic_problem

    problems = [_problem(p) for p in spec["problems"]]
    for p in problems:
        synthetic_problem(p["name"], dim=p["dim"], noise_std=p["noise"])  # raises on bad names
    for m in spec["models"]:
        get_model_class(m)
    for a in spec["acqs"]:
        if a not in ACQUISITIONS or a == "qnipv":
            raise ValueError(f"Unknown acquisition {a!r} in the sweep spec.")
    options = dict(spec.get("options", {}))
    for key in sorted(_TABLE_OPTIONS & set(options)):
        if not isinstance(options[key], dict):
            raise ValueError(
                f"[options] {key} must be a table ({key} = {{name = value, ...}}), "
                f"got {options[key]!r}."
            )
    reserved = sorted(set(options) & _SET_PER_CAMPAIGN)
    if reserved:
        raise ValueError(
            f"[options] sets {reserved}, which the sweep sets per campaign (from problems, "
            "models, acqs, seeds, steps and the output folder); list them there instead."
        )
    # [options] is shared by every campaign: each acquisition takes the acq_options it reads,
    # and a key that none of the spec's acquisitions reads (a misspelling) is refused.
    acq_options = dict(options.get("acq_options", {}))
    read = {k for a in spec["acqs"] for k in known_acq_options(a, acq_options)}
    unread = sorted(set(acq_options) - read)
    if unread:
        raise ValueError(
            f"[options] acq_options {', '.join(map(repr, unread))}: read by none of the "
            f"acquisitions {', '.join(spec['acqs'])}; their options: "
            + "; ".join(f"{a}: {', '.join(ACQ_OPTIONS[a])}" for a in spec["acqs"])
            + "."
        )

    def own(acq: str) -> dict[str, Any]:
        if "acq_options" not in options:
            return options
        return {**options, "acq_options": known_acq_options(acq, acq_options)}

    runs = [
        Campaign(p, m, a, int(s), int(spec["steps"]), own(a))
        for p, m, a, s in itertools.product(problems, spec["models"], spec["acqs"], spec["seeds"])
    ]
    names = [c.name for c in runs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # they would share one run directory
        raise ValueError(
            f"The spec lists the same campaign more than once ({', '.join(twice[:3])}): "
            "remove repeated seeds, models, acquisitions or problems."
        )
    for c in {(json.dumps(c.problem, sort_keys=True), c.model, c.acq): c for c in runs}.values():
        _check_options(c)
    return runs


#: BayesOptLoop options that are tables of named values
_TABLE_OPTIONS = {"acq_options", "optimizer_options", "model_options", "fit_options"}
#: BayesOptLoop arguments a campaign sets itself
_SET_PER_CAMPAIGN = {"problem", "model", "acq", "seed", "out_dir", "overwrite", "quiet", "steps"}


def _campaign_loop(campaign: Campaign) -> Any:
    r"""The campaign's ``BayesOptLoop``, built (not run) on the CPU: the workers may have a
    device this machine lacks ("cuda" is checked there). Nothing is evaluated."""
    from bo_online.loops import BayesOptLoop
    from bo_online.problems import synthetic_problem

    p = campaign.problem
    problem = synthetic_problem(p["name"], dim=p["dim"], noise_std=p["noise"])
    return BayesOptLoop(
        problem,
        model=campaign.model,
        acq=campaign.acq,
        seed=campaign.seed,
        quiet=True,
        **{**campaign.options, "device": "cpu"},
    )


def _check_options(campaign: Campaign) -> None:
    r"""Build (not run) the campaign's loop, so bad ``[options]`` fail before a cluster starts
    (the loop validates and serialises its options at construction; nothing is evaluated)."""
    import torch

    try:
        loop = _campaign_loop(campaign)
        # Model options reach the model only when it is built: build one on a few points.
        X = torch.rand(4, loop.problem.dim, generator=torch.Generator().manual_seed(0))
        loop._build_model(X.to(torch.float64), X.sum(-1, keepdim=True).to(torch.float64))
    except TypeError as e:  # an unknown keyword
        raise ValueError(f"[options] of the sweep spec: {e}{_loop_option_hint(e)}") from e
    except ValueError as e:
        raise ValueError(f"[options] of the sweep spec ({campaign.name}): {e}") from e


def _loop_option_hint(error: TypeError) -> str:
    r"""``" (did you mean 'refit_every'?)"`` when ``error`` is Python's ``unexpected keyword
    argument 'refit_evry'`` and ``BayesOptLoop`` (or the loop it builds on) takes a name close to
    it; else ``""``."""
    import inspect
    import re

    from bo_online.loops import BayesOptLoop
    from bo_online.models.validation import closest_name_hint

    found = re.search(r"unexpected keyword argument '([^']+)'", str(error))
    if found is None:
        return ""
    names = {
        name
        for cls in BayesOptLoop.__mro__
        if "__init__" in vars(cls)
        for name in inspect.signature(vars(cls)["__init__"]).parameters
    }
    names -= {"self", "args", "kwargs"} | _SET_PER_CAMPAIGN
    return closest_name_hint(found.group(1), sorted(names))


def _done_steps(run_dir: Path) -> int | None:
    """Steps finished by the run in ``run_dir`` (None: no run there; -1: a checkpoint without
    its records file, deleted or not copied, which the campaign's resume rewrites from the
    checkpoint, as ``bo-online resume`` does)."""
    from bo_online.loops.history import CHECKPOINT_FILE, RECORDS_FILE, read_records

    if not (run_dir / CHECKPOINT_FILE).is_file():
        return None
    if not (run_dir / RECORDS_FILE).exists():
        return -1
    records = read_records(run_dir)
    return max((r["step"] for r in records), default=0)


#: configuration keys that do not change a campaign's results (or may differ by machine)
_RUNTIME_KEYS = {"checkpoint_every", "checkpoint_seconds", "device"}


def _changed_settings(campaign: Campaign, run_dir: Path) -> list[str]:
    r"""The settings in which the run already in ``run_dir`` differs from ``campaign`` (a
    resumed or skipped run keeps the settings it started with, whatever the spec says now), as
    ``"key: stored -> spec"``. Only keys both configurations hold are compared: a run saved by
    an earlier version lacks the settings added since, which its resume fills with their
    defaults."""
    from bo_online.loops.history import CONFIG_FILE, to_jsonable

    try:
        stored = json.loads((run_dir / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []  # unreadable: resuming it reports the damaged run
    if not isinstance(stored, dict):
        return []
    loop = _campaign_loop(campaign)
    wanted = json.loads(json.dumps(to_jsonable({**loop.config, "problem": loop.problem.spec})))
    keys = sorted((set(wanted) & set(stored)) - _RUNTIME_KEYS)
    return [f"{k}: {stored[k]!r} -> {wanted[k]!r}" for k in keys if wanted[k] != stored[k]]


def run_campaign(campaign: Campaign, run_dir: str | os.PathLike) -> dict[str, Any]:
    r"""Run (or resume) one campaign in ``run_dir``; a Dask task. Returns its summary."""
    import torch

    torch.set_num_threads(1)  # one campaign per worker thread
    with _one_line_warnings(campaign.name):
        return _run_campaign(campaign, Path(run_dir))


#: the campaign each thread of this process runs: a worker of several threads (a ``tcp://``
#: cluster's default) runs several campaigns at once, and the warning display is process-wide
_CAMPAIGN_OF_THREAD: dict[int, str] = {}
#: the warning display that was installed before the first of them started
_DISPLAY_BEFORE: list[Callable[..., None]] = []
#: (campaign, category, text) of the warnings shown while campaigns run in this process
_SHOWN: set[tuple[str, str, str]] = set()
_CAMPAIGN_LOCK = threading.Lock()


@contextlib.contextmanager
def _one_line_warnings(name: str) -> Iterator[None]:
    r"""Warnings while a campaign runs as one line each on stderr, ``bo-online: warning:
    campaign NAME: ... (Category)``, as the CLI prints its own: a worker process of the cluster
    would print Python's default two lines (the package's file and source line) with no word
    of which campaign it came from. Each warning names the campaign of the thread it is raised
    in; the display is restored when the last campaign of the process ends."""
    import warnings

    thread = threading.get_ident()
    with _CAMPAIGN_LOCK:
        if not _CAMPAIGN_OF_THREAD:
            _DISPLAY_BEFORE[:] = [warnings.showwarning]
            warnings.showwarning = _show_campaign_warning
        outer = _CAMPAIGN_OF_THREAD.get(thread)
        _CAMPAIGN_OF_THREAD[thread] = name
    try:
        yield
    finally:
        with _CAMPAIGN_LOCK:
            if outer is None:
                del _CAMPAIGN_OF_THREAD[thread]
            else:
                _CAMPAIGN_OF_THREAD[thread] = outer
            if not _CAMPAIGN_OF_THREAD:
                warnings.showwarning = _DISPLAY_BEFORE.pop()
                _SHOWN.clear()


def _show_campaign_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    r"""The ``warnings.showwarning`` of :func:`_one_line_warnings`: the campaign is the one of
    the calling thread, or the only one running (a thread that campaign started); with none
    to name, the display from before. Each text is shown once per campaign, on one line, as
    the CLI shows its own (a library's advice raised at every step filled the terminal)."""
    with _CAMPAIGN_LOCK:
        name = _CAMPAIGN_OF_THREAD.get(threading.get_ident())
        running = set(_CAMPAIGN_OF_THREAD.values())
        before = _DISPLAY_BEFORE[0] if _DISPLAY_BEFORE else None
    if name is None and len(running) == 1:
        (name,) = running
    if name is None:
        if before is not None:
            before(message, category, filename, lineno, file, line)
        return
    text = " ".join(str(message).split())
    with _CAMPAIGN_LOCK:
        if (name, category.__name__, text) in _SHOWN:
            return
        _SHOWN.add((name, category.__name__, text))
    print(f"bo-online: warning: campaign {name}: {text} ({category.__name__})", file=sys.stderr)


def _run_campaign(campaign: Campaign, run_dir: Path) -> dict[str, Any]:
    r"""The body of :func:`run_campaign`."""
    from bo_online.loops import BayesOptLoop, RunDirectoryError, load_loop
    from bo_online.loops.history import RunFileError
    from bo_online.problems import synthetic_problem

    loop, status = None, "ran"
    if _done_steps(run_dir) is None:
        p = campaign.problem
        try:
            loop = BayesOptLoop(
                synthetic_problem(p["name"], dim=p["dim"], noise_std=p["noise"]),
                model=campaign.model,
                acq=campaign.acq,
                seed=campaign.seed,
                out_dir=run_dir,
                quiet=True,
                **campaign.options,
            )  # not overwrite: records past step 0 without a checkpoint (it was removed) are
            # results, refused; a campaign killed before its first checkpoint starts again
        except RunDirectoryError as e:  # a sweep names its campaigns' directories itself
            if _done_steps(run_dir) is None:
                _raise_advised(e, run_dir)
            # its run appeared since it was looked for (another sweep on this --out started
            # it): continued as a run found, which the lock refuses while that sweep runs it
    if loop is None:
        try:
            loop = load_loop(run_dir, quiet=True)
        except RunFileError as e:
            _raise_advised(e, run_dir)
        status = "resumed"
    records = loop.run(campaign.steps)
    return _summary(campaign, records, status)


def _raise_advised(error: Exception, run_dir: Path) -> None:
    r"""Raise ``error`` with the sweep's advice (:func:`_sweep_advice`), from ``error``; as it
    is where no advice changes (raised ``from`` itself it would be its own ``__cause__``, a
    cycle that the Dask worker reporting the task's error follows forever, its memory growing
    without bound: the sweep hung)."""
    advised = _sweep_advice(error, run_dir)
    if advised is error:
        raise error
    raise advised from error


#: the advice of a run that cannot be resumed (bo-online resume), for an option the sweep lacks
_RESUME_ADVICE = "start the run again with --overwrite"
#: the advice for a run directory that holds other files, for a directory the sweep chose
_NEW_DIRECTORY_ADVICE = "Give a new or empty directory for the run."
#: the advice for records whose checkpoint was removed, an option of ``bo-online bo`` too
_RECORDS_ADVICE = (
    "start the new run in another directory, or replace those records with --overwrite "
    "(overwrite=True in Python)"
)


def _sweep_advice(error: Exception, run_dir: Path) -> Exception:
    r"""``error`` (a campaign's run that cannot be resumed) with its advice to start the run again
    with ``--overwrite``, an option of ``bo-online bo`` that the sweep lacks, replaced by what
    does it for a sweep: deleting the campaign's directory and running the sweep again."""
    message = str(error)
    if _NEW_DIRECTORY_ADVICE in message:  # a directory of other files where a campaign goes
        advice = (
            f"Move those files out of {str(run_dir)!r} (the sweep names its campaigns' "
            "directories) and run the sweep again."
        )
        return type(error)(message.replace(_NEW_DIRECTORY_ADVICE, advice))
    if _RECORDS_ADVICE in message:  # records kept, their checkpoint gone
        advice = (
            "its files are left as they are: restore its checkpoint (to resume it), or move its "
            f"records elsewhere or delete {str(run_dir)!r} (to start it afresh), then run the "
            "sweep again"
        )
        return type(error)(message.replace(_RECORDS_ADVICE, advice))
    if _RESUME_ADVICE not in message:
        return error
    advice = f"delete {str(run_dir)!r} and run the sweep again to start this campaign afresh"
    return type(error)(message.replace(_RESUME_ADVICE, advice))


def _summary(campaign: Campaign, records: list[dict[str, Any]], status: str) -> dict[str, Any]:
    last = records[-1]
    return {
        "campaign": campaign.name,
        "problem": campaign.problem_label,
        "model": campaign.model,
        "acq": campaign.acq,
        "seed": campaign.seed,
        "steps": campaign.steps,
        "evaluations": last["n"],
        "regret": last.get("regret"),
        "wall_time": last.get("wall_time"),
        "status": status,
    }


def run_sweep(
    spec_path: str | os.PathLike, out: str | os.PathLike, client: Any
) -> list[dict[str, Any]]:
    r"""Run every unfinished campaign of the spec as a task on ``client``'s cluster; finished
    ones are skipped. Returns one summary per campaign (``status``: ran, resumed, skipped).

    The first campaign that raises stops the sweep (:class:`CampaignError`): the campaigns not
    started are cancelled, but those running go on to their end on the cluster (Dask cannot
    stop a running task) unless the cluster is closed."""
    from distributed import as_completed

    from bo_online.loops.history import read_records

    # absolute: each campaign's task is given its directory, which a worker started in another
    # folder (``dask worker`` on a shared file system) would read against its own
    out = Path(out).absolute()
    todo = campaigns(load_spec(spec_path))
    summaries: list[dict[str, Any]] = []
    futures = {}
    changed: dict[str, list[str]] = {}
    for c in todo:
        if _done_steps(out / c.name) is not None:
            keys = _changed_settings(c, out / c.name)
            if keys:
                changed[c.name] = keys
    if changed:
        first = next(iter(changed))
        raise ValueError(
            f"{len(changed)} campaign(s) of the spec already ran in {str(out)!r} with other "
            f"settings ({first}: {'; '.join(changed[first])}); a run keeps the settings it started "
            "with, so the sweep would skip or resume them unchanged. Give the sweep another --out, "
            "or delete those campaigns' directories to run them again."
        )
    for c in todo:
        run_dir = out / c.name
        done = _done_steps(run_dir)
        if done is not None and done >= c.steps:
            # a run that went further (the spec's steps lowered since) is read at c.steps, so
            # that every campaign of the table and plots has the spec's budget
            records = [r for r in read_records(run_dir) if r["step"] <= c.steps]
            summaries.append(_summary(c, records, "skipped"))
            continue
        futures[client.submit(run_campaign, c, run_dir, pure=False)] = c
    try:
        for future in as_completed(futures):
            if future.status == "error":  # the first campaign that raised stops the sweep
                raise _campaign_error(futures[future], out, future.exception())
            summaries.append(future.result())
    finally:
        for future in futures:
            future.cancel()
    order = {c.name: i for i, c in enumerate(todo)}
    return sorted(summaries, key=lambda s: order[s["campaign"]])


def _campaign_error(campaign: Campaign, out: Path, error: BaseException) -> CampaignError:
    r"""``error``, raised by ``campaign``'s task, as one message that names the campaign and its
    run directory (the task's own error names neither, nor does Dask's ``KilledWorker``), with
    what to do unless the error already says how to run the sweep again."""
    run_dir = str(out / campaign.name)
    message = f"Campaign {campaign.name} (in {run_dir!r}) failed: {describe(error)}"
    if "run the sweep again" not in message:
        message = message.removesuffix(".")  # a message ending in a full stop: not ".;"
        message += (
            "; the sweep stopped. Fix the cause, then run the sweep again (finished campaigns "
            "are skipped, interrupted ones resumed from their checkpoints)."
        )
    return CampaignError(message, campaign.name)


@contextlib.contextmanager
def dask_client(address: str) -> Iterator[Any]:
    r"""A ``distributed.Client`` for ``local:N`` (a new ``LocalCluster`` of ``N`` single-threaded
    worker processes) or ``tcp://host:port``; closed on exit, with the cluster it started."""
    from bo_online.loops.async_bo import connect

    client = connect(address)
    cluster = client.cluster if address.startswith("local:") else None
    try:
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def map_on_cluster(
    client: Any,
    func: Callable[..., Any],
    jobs: Sequence[tuple[Any, ...]],
    on_result: Callable[[tuple[Any, ...], Any], None] | None = None,
) -> list[Any]:
    r"""``[func(*job) for job in jobs]``, each job a task on ``client``'s cluster (for the
    experiment and benchmark scripts that split runs over workers). ``on_result(job, result)``
    is called as each task finishes; the first task that raises stops the map with its error
    (the other tasks are cancelled). Results come back in job order."""
    from distributed import as_completed

    futures = {client.submit(func, *job, pure=False): i for i, job in enumerate(jobs)}
    results: list[Any] = [None] * len(jobs)
    try:
        for future in as_completed(futures):
            i = futures[future]
            results[i] = future.result()
            if on_result is not None:
                on_result(jobs[i], results[i])
    finally:
        for future in futures:
            future.cancel()
    return results


def summarize(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    r"""Per (problem, model, acq): number of seeds, mean final regret and its standard error
    (NaN for a problem without a known optimum, whose records have no regret)."""
    groups: dict[tuple[str, str, str], list[float]] = {}
    seeds: dict[tuple[str, str, str], int] = {}
    for s in summaries:
        key = (s["problem"], s["model"], s["acq"])
        groups.setdefault(key, [])
        seeds[key] = seeds.get(key, 0) + 1
        if s["regret"] is not None:
            groups[key].append(float(s["regret"]))
    rows = []
    for (problem, model, acq), values in groups.items():
        n = len(values)
        mean = sum(values) / n if n else math.nan
        se = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n) if n > 1 else math.nan
        rows.append(
            {
                "problem": problem,
                "model": model,
                "acq": acq,
                "seeds": seeds[problem, model, acq],
                "mean_regret": mean,
                "se_regret": se,
            }
        )
    return rows


#: The sweep's results file in ``--out``: every campaign's summary and the table over seeds.
SUMMARY_FILE = "summary.json"


def write_summary(summaries: list[dict[str, Any]], out: str | os.PathLike) -> Path:
    r"""Write ``out/summary.json``: ``{"campaigns": [...], "over_seeds": [...]}``, the
    per-campaign summaries of :func:`run_sweep` and the rows of :func:`summarize` (a regret or
    standard error that does not exist, NaN in the rows, is ``null``). The printed tables hold
    the same numbers; this file keeps them for a run with ``--quiet`` or for later reading."""
    from bo_online.loops.history import write_json

    path = Path(out) / SUMMARY_FILE
    write_json(path, {"campaigns": summaries, "over_seeds": summarize(summaries)})
    return path


def _band(curves: list[tuple[Any, Any]], grid: Any) -> tuple[Any, Any, Any]:
    """Mean, 2 SE and the lowest value over seeds of step curves ``(x, y)`` read at ``grid``
    (last value so far)."""
    import numpy as np

    Y = []
    for x, y in curves:
        idx = np.searchsorted(x, grid, side="right") - 1
        Y.append(np.where(idx >= 0, y[np.clip(idx, 0, None)], np.nan))
    Y = np.array(Y)
    n = np.sum(~np.isnan(Y), axis=0)
    mean = np.nanmean(Y, axis=0)
    se = np.where(n > 1, np.nanstd(Y, axis=0, ddof=1) / np.sqrt(np.maximum(n, 1)), 0.0)
    return mean, 2 * se, np.nanmin(Y, axis=0)


def plot_sweep(summaries: list[dict[str, Any]], out: str | os.PathLike) -> list[Path]:
    r"""One PNG per problem: mean regret (2-SE band over seeds) vs evaluations and vs wall time,
    one line per (model, acq), from where every seed has its first record (a seed that ended
    earlier counts with its last value)."""
    import warnings

    import numpy as np

    from bo_online.loops.history import read_records
    from bo_online.plotting import _plain_log_ticks, _save, plt

    out = Path(out)
    written = []
    for problem in dict.fromkeys(s["problem"] for s in summaries):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        rows = [s for s in summaries if s["problem"] == problem]
        # Regret where the problem has a known optimum, else the best value found.
        by_regret = any(s.get("regret") is not None for s in rows)
        key = "regret" if by_regret else "best_true_value"
        for method in dict.fromkeys((s["model"], s["acq"]) for s in rows):
            by_n, by_t = [], []
            for s in rows:
                if (s["model"], s["acq"]) != method:
                    continue
                recs = [
                    r
                    for r in read_records(out / s["campaign"])
                    if r.get(key) is not None and r["step"] <= s.get("steps", math.inf)
                ]
                if not recs:
                    continue
                n = np.array([r["n"] for r in recs], float)
                t = np.array([r["wall_time"] for r in recs], float)
                y = np.array([r[key] for r in recs], float)
                y = np.minimum.accumulate(y) if by_regret else y  # best_true_value is the best
                by_n.append((n, y))
                by_t.append((t, y))
            if not by_n:
                continue
            label = f"{method[0]}/{method[1]} ({len(by_n)} seeds)"
            with warnings.catch_warnings():  # a single seed: no spread (ddof=1)
                warnings.simplefilter("ignore", RuntimeWarning)
                for ax, curves in zip(axes, (by_n, by_t)):
                    # From where every seed has a value: before a slower seed's first record,
                    # the mean would be the faster seeds' alone, jumping as the others arrive.
                    grid = np.linspace(
                        max(c[0][0] for c in curves), max(c[0][-1] for c in curves), 200
                    )
                    mean, band, lowest = _band(curves, grid)
                    (line,) = ax.plot(grid, mean, label=label)
                    # On the log axis a band reaching zero or below (few seeds, spread
                    # regrets) stretched the axis down to its 1e-12 clip and squashed the
                    # curves: it stops at the lowest seed's regret instead.
                    low = np.maximum(mean - band, lowest) if by_regret else mean - band
                    if by_regret:
                        low = np.maximum(low, 1e-12)
                    ax.fill_between(grid, low, mean + band, color=line.get_color(), alpha=0.2)
        for ax, xlabel in zip(axes, ("evaluations", "wall time (s)")):
            if by_regret:
                ax.set_yscale("log")
                _plain_log_ticks(ax)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(f"{'simple regret' if by_regret else 'best value'} (mean, 2 SE)")
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        fig.suptitle(problem)
        written.append(_save(fig, out / "plots" / f"{problem}.png"))
    return written
