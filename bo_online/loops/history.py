r"""Run records, checkpoints and the determinism helpers every loop shares.

A run directory holds:

* ``records.jsonl`` -- one JSON object per step, appended (and flushed) as the step ends;
* ``checkpoint.pt`` -- everything needed to continue: the loop's configuration, the data seen,
  the model's ``state_dict`` (with its caches), the RNG states and the records so far. It is
  written to a temporary file and moved into place (``os.replace``), so a run killed at any
  moment -- even by SIGKILL -- leaves either the previous or the new checkpoint, never half of one;
* ``config.json`` -- the configuration, human-readable.

On resume the records file is rewritten from the checkpoint (a step whose record was appended but
whose checkpoint was not yet written is simply redone), so the records of a resumed run equal
those of an uninterrupted one.

Determinism: each step's random draws (acquisition restarts, MC samplers, Thompson candidates)
come from the global torch RNG re-seeded from ``(seed, step, phase)`` inside
``torch.random.fork_rng`` (so the caller's RNG is left alone); observation noise comes from a
dedicated ``torch.Generator`` whose state is checkpointed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator

import torch

__all__ = [
    "RECORDS_FILE",
    "CHECKPOINT_FILE",
    "CONFIG_FILE",
    "TIMING_KEYS",
    "append_record",
    "rewrite_records",
    "read_records",
    "without_timing",
    "save_checkpoint",
    "load_checkpoint",
    "step_seed",
    "seeded",
    "write_json",
]

RECORDS_FILE = "records.jsonl"
CHECKPOINT_FILE = "checkpoint.pt"
CONFIG_FILE = "config.json"
#: record fields holding wall-clock measurements (differ between otherwise identical runs).
TIMING_KEYS = (
    "time_fit",
    "time_acquisition",
    "time_evaluation",
    "time_update",
    "time_step",
    "wall_time",
)


def to_jsonable(value: Any) -> Any:
    """Tensors to (nested) lists, non-finite floats to None: what a JSON record holds."""
    if isinstance(value, torch.Tensor):
        return to_jsonable(value.detach().cpu().tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Append one record as a JSON line and flush it to the OS."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(to_jsonable(record)) + "\n")
        f.flush()


def _atomic_write(path: Path, write: Any, binary: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def rewrite_records(path: Path, records: list[dict[str, Any]]) -> None:
    """Replace the records file atomically with ``records``."""
    _atomic_write(
        path, lambda f: f.writelines(json.dumps(to_jsonable(r)) + "\n" for r in records), False
    )


def write_json(path: Path, obj: Any) -> None:
    _atomic_write(path, lambda f: json.dump(to_jsonable(obj), f, indent=2), False)


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    r"""Records of a run: ``path`` is a run directory or a ``.jsonl`` file. A torn last line (a
    run killed mid-write) is ignored."""
    path = Path(path)
    if path.is_dir():
        path = path / RECORDS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"No records at {str(path)!r} (expected a run directory).")
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return records


def without_timing(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records with the wall-clock fields removed (what two identical runs share)."""
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """``torch.save`` to a temporary file, then move it into place (atomic)."""
    _atomic_write(path, lambda f: torch.save(state, f), True)


def load_checkpoint(path: Path, map_location: Any = "cpu") -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(
            f"No checkpoint at {str(path)!r}: is this a bo-online run directory?"
        )
    return torch.load(path, map_location=map_location, weights_only=False)


def step_seed(seed: int, step: int, phase: str) -> int:
    """A 63-bit seed derived from ``(seed, step, phase)`` (stable across runs and platforms)."""
    digest = hashlib.sha256(f"{seed}/{step}/{phase}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@contextlib.contextmanager
def seeded(seed: int, step: int, phase: str, device: torch.device) -> Iterator[None]:
    """Run the block with the global torch RNG seeded from ``(seed, step, phase)``, restoring
    the caller's RNG state afterwards."""
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(step_seed(seed, step, phase))
        yield
