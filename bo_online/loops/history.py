r"""Run records, checkpoints and the determinism helpers every loop shares.

A run directory holds:

* ``records.jsonl`` -- one JSON object per step, appended (and flushed) as the step ends;
* ``checkpoint.pt`` -- everything needed to continue: the loop's configuration, the data seen,
  the model's ``state_dict`` (with its caches), the RNG states and the records so far. It is
  written to a temporary file and moved into place (``os.replace``), so a run killed at any
  moment -- even by SIGKILL -- leaves either the previous or the new checkpoint, never half of one;
* ``config.json`` -- the configuration, human-readable;
* ``.lock`` -- while a process runs the directory: the holder's pid, host and start time (see
  :func:`RunLock`).

Nothing in a run directory is executed: the checkpoint is read with
``torch.load(..., weights_only=True)`` (tensors and plain containers only), and object-valued
model options are built only from an allow-list (:mod:`bo_online.loops.options`).

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
import pickle
import re
import secrets
import shlex
import tempfile
import warnings
from pathlib import Path
from typing import Any, ClassVar, Iterator

import psutil
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
    "RunFileError",
    "RunLock",
    "remove_orphans",
    "probe_writable",
    "fault_point",
]

RECORDS_FILE = "records.jsonl"
CHECKPOINT_FILE = "checkpoint.pt"
CONFIG_FILE = "config.json"
LOCK_FILE = ".lock"
#: environment variable naming a fault point (see :func:`fault_point`) at which the process
#: kills itself with SIGKILL: the fault-injection hook of the test-suite.
FAULT_ENV = "BO_ONLINE_FAULT_POINT"
#: record fields holding wall-clock measurements (differ between otherwise identical runs).
TIMING_KEYS = (
    "time_fit",
    "time_acquisition",
    "time_evaluation",
    "time_update",
    "time_step",
    "wall_time",
    "time_test",
)


class RunFileError(ValueError):
    """A run directory's file is damaged, unreadable or unwritable (the message names the file
    and what to do)."""


def fault_point(name: str) -> None:
    r"""Fault-injection hook: if ``$BO_ONLINE_FAULT_POINT`` equals ``name``, die at once by
    SIGKILL (no cleanup, as a power cut or ``kill -9`` would). Named points:
    ``checkpoint:open`` (temp file created, empty), ``checkpoint:written`` (temp file complete,
    not yet moved), ``checkpoint:replaced`` (moved into place), ``record:torn`` (half a records
    line written)."""
    if os.environ.get(FAULT_ENV) == name:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


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


def resume_command(out_dir: Path | str, objective: str | None = None) -> str:
    r"""``bo-online resume DIR`` (with ``--objective SPEC`` for a run of a user objective),
    each part quoted so that a shell takes it as one word."""
    given = "" if objective is None else f" --objective {shlex.quote(objective)}"
    return f"bo-online resume {shlex.quote(str(out_dir))}{given}"


def _resume_command_of(out_dir: Path) -> str:
    r"""The command that resumes the run in ``out_dir``, from its configuration: with the
    ``--objective`` of a run of a user objective, and ``--dask`` for an asynchronous run (both
    refused without); plain where the configuration is unreadable."""
    try:
        config = json.loads((out_dir / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = None
    if not isinstance(config, dict):
        return resume_command(out_dir)
    objective = config.get("objective")
    spec = objective.get("objective") if isinstance(objective, dict) else None
    command = resume_command(out_dir, spec if isinstance(spec, str) else None)
    return command + (" --dask local:N" if config.get("kind") == "bo_async" else "")


def _write_error(path: Path, e: OSError) -> RunFileError:
    r"""One line for a failed write into a run directory (full disk, permissions): what to do,
    and whether the run can be resumed (a checkpoint exists) or must be started again."""
    out_dir = path.parent
    then = (
        f"then continue from the last checkpoint with `{_resume_command_of(out_dir)}`"
        if (out_dir / CHECKPOINT_FILE).is_file()
        else "then start the run again (no checkpoint was written yet)"
    )
    return RunFileError(
        f"Cannot write {str(path)!r} ({e.strerror or e}); free space or fix the directory's "
        f"permissions, {then}."
    )


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Append one record as a JSON line and flush it to the OS."""
    line = json.dumps(to_jsonable(record)) + "\n"
    try:
        _append_line(path, line)
    except OSError as e:
        raise _write_error(path, e) from e


def _append_line(path: Path, line: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        if os.environ.get(FAULT_ENV) == "record:torn":
            f.write(line[: len(line) // 2])
            f.flush()
            fault_point("record:torn")
        f.write(line)
        f.flush()


def _new_temp_file(path: Path) -> tuple[int, str]:
    r"""A new, exclusively created temp file beside ``path`` (``.<name>.<random>``): its
    descriptor and name. Created with mode 0666 so the kernel applies the user's umask, as for
    any file the user creates (``tempfile.mkstemp`` would make it private, 0600)."""
    for _ in range(100):
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(6)}")
        try:
            flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_BINARY", 0)
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:  # pragma: no cover - 48 random bits
            continue
    raise FileExistsError(f"No free temporary name beside {str(path)!r}.")  # pragma: no cover


def _atomic_write(path: Path, write: Any, binary: bool) -> None:
    try:
        _atomic_write_io(path, write, binary)
    except OSError as e:
        raise _write_error(path, e) from e


def _atomic_write_io(path: Path, write: Any, binary: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _new_temp_file(path)
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            fault_point(f"{path.stem}:open")
            write(f)
            f.flush()
            os.fsync(f.fileno())
        fault_point(f"{path.stem}:written")
        os.replace(tmp, path)
        fault_point(f"{path.stem}:replaced")
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
        if path.name == RECORDS_FILE and (path.parent / CHECKPOINT_FILE).is_file():
            raise FileNotFoundError(
                f"No records at {str(path)!r}, though the run's checkpoint is there (the file "
                f"was deleted or not copied): `{_resume_command_of(path.parent)}` rewrites it "
                "from the checkpoint."
            )
        raise FileNotFoundError(f"No records at {str(path)!r} (expected a run directory).")
    records = []
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    except (OSError, UnicodeDecodeError) as e:
        raise RunFileError(f"Cannot read the records file {str(path)!r}: {e}.") from e
    for i, line in enumerate(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            # A torn last line (a run killed mid-write) never ends in its newline.
            if i == len(lines) - 1 and not line.endswith("\n"):
                break
            raise _damaged_records(path, i, e.msg) from e
        if not isinstance(record, dict):  # a whole line, but not a record
            raise _damaged_records(path, i, "not a JSON object")
        step = record.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            raise _damaged_records(path, i, "no integer 'step': not a record of a run")
        records.append(record)
    return records


def last_recorded_step(out_dir: Path) -> int | None:
    r"""The last step in ``out_dir``'s records file (None: no records file, or a damaged one).
    The first checkpoint is written right after step 0's record, so records past step 0 in a
    directory without a checkpoint are a run's whose checkpoint was removed, not of a run
    killed before its first one."""
    try:
        records = read_records(out_dir / RECORDS_FILE)
    except (OSError, RunFileError):  # (FileNotFoundError: no records file)
        return None
    return max((r["step"] for r in records), default=None)


def _damaged_records(path: Path, i: int, why: str) -> RunFileError:
    return RunFileError(
        f"The records file {str(path)!r} is damaged at line {i + 1} ({why}); "
        "`bo-online resume` rewrites it from the checkpoint, or restore it from a copy."
    )


def without_timing(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records with the wall-clock fields removed (what two identical runs share)."""
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


def _plain(value: Any, where: str = "checkpoint") -> Any:
    r"""``value`` as what ``torch.load(weights_only=True)`` reads back: tensors, numbers, strings,
    None, and dicts / lists / tuples of them (numpy arrays become tensors). Anything else is a
    bug of the caller and raises ``TypeError`` naming where it sits."""
    if (
        isinstance(value, torch.Tensor)
        or value is None
        or isinstance(value, (bool, int, float, str))
    ):
        return value
    if isinstance(value, dict):
        return {k: _plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        out = [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(out) if isinstance(value, tuple) else out
    if type(value).__module__ == "numpy":
        import numpy as np

        return torch.as_tensor(np.asarray(value)) if np.ndim(value) else value.item()
    if isinstance(value, torch.dtype):
        return value
    raise TypeError(f"{where} holds a {type(value).__name__}, which a checkpoint cannot store.")


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """``torch.save`` of plain data (see :func:`_plain`) to a temporary file, then move it into
    place (atomic)."""
    state = _plain(state)
    _atomic_write(path, lambda f: torch.save(state, f), True)


def load_checkpoint(path: Path, map_location: Any = "cpu") -> dict[str, Any]:
    r"""Read a checkpoint with ``weights_only=True``: tensors and plain containers only, so a
    checkpoint holding anything else (a pickled object, an old-format file) is refused without
    running any of it. Damaged, empty or truncated files raise :class:`RunFileError` naming the
    file and what to do."""
    if not path.is_file():
        raise FileNotFoundError(
            f"No checkpoint at {str(path)!r}: is this a bo-online run directory?"
        )
    what_to_do = "start the run again with --overwrite (or restore the file from a copy)"
    if path.stat().st_size == 0:
        raise RunFileError(f"The checkpoint {str(path)!r} is empty; {what_to_do}.")
    try:
        with warnings.catch_warnings():
            # A file bo-online did not write (a plain pickle) makes torch warn about its pickle
            # protocol before refusing it; the refusal below says what matters.
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        # The safe unpickler refuses a pickled object by naming a disallowed global; anything
        # else it refuses (an unknown opcode in text or random bytes) is a damaged file.
        refused = re.search(r"GLOBAL ([\w.]+)", str(e))
        if refused is None:
            raise RunFileError(
                f"The checkpoint {str(path)!r} is not a checkpoint bo-online wrote (damaged, "
                f"truncated or another file); {what_to_do}."
            ) from e
        raise RunFileError(
            f"Refusing the checkpoint {str(path)!r}: it holds objects other than tensors and "
            f"plain data ({refused.group(1)}), so loading it could run code. If you wrote it "
            f"yourself with an older bo-online, {what_to_do}."
        ) from e
    except Exception as e:  # noqa: BLE001
        # Random bytes can fail anywhere inside the unpickler (IndexError from its stack,
        # TypeError, OverflowError, ...); every failure other than the refusal above means
        # the file is damaged, and the user gets the same one-line message.
        raise RunFileError(
            f"The checkpoint {str(path)!r} is damaged or truncated ({type(e).__name__}); "
            f"{what_to_do}."
        ) from e
    if not isinstance(ckpt, dict) or "config" not in ckpt or "model_state" not in ckpt:
        raise RunFileError(
            f"{str(path)!r} is not a bo-online checkpoint (no config / model state); {what_to_do}."
        )
    return ckpt


#: temp files an interrupted atomic write or write probe leaves in a run directory
ORPHAN_PATTERNS = tuple(
    f".{name}.*" for name in (CHECKPOINT_FILE, RECORDS_FILE, CONFIG_FILE, LOCK_FILE)
) + (".probe.*",)


def remove_orphans(out_dir: Path) -> list[Path]:
    r"""Delete temp files left by an interrupted atomic write (``.checkpoint.pt.*``,
    ``.records.jsonl.*``, ``.config.json.*``, ``..lock.*``) or write probe (``.probe.*``) in
    ``out_dir``; returns what was removed. Only call while holding the directory's
    :class:`RunLock`."""
    removed = []
    for pattern in ORPHAN_PATTERNS:
        for tmp in out_dir.glob(pattern):
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
                removed.append(tmp)
    return removed


def probe_writable(out_dir: Path) -> None:
    r"""Create ``out_dir`` if needed and write, sync and delete a small probe file there, so an
    unwritable directory (or a full disk) is reported before any evaluation."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".probe.", dir=out_dir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(b"\0" * 65536)
                f.flush()
                os.fsync(f.fileno())
        finally:
            os.unlink(tmp)
    except OSError as e:
        raise RunFileError(
            f"Cannot write to the run directory {str(out_dir)!r} ({e.strerror or e}); choose "
            "another --out or fix its permissions / free space."
        ) from e


def _pid_alive(pid: int) -> bool:
    r"""Whether a process ``pid`` runs on this host (psutil: portable; ``os.kill(pid, 0)``, the
    POSIX idiom, sends Ctrl-C to a process group on Windows)."""
    return pid > 0 and psutil.pid_exists(pid)


def _process_identity(pid: int) -> str | None:
    r"""What tells process ``pid`` apart from a later process given the same pid: on Linux the
    boot id and the process's start in clock ticks since boot (``/proc``: unaffected by the
    wall clock, and what locks of earlier versions hold); elsewhere its start time (seconds
    since the epoch, to 10 ms, from psutil). None where it cannot be read (no such process, no
    permission).

    Not psutil's ``create_time()`` on Linux: it adds the boot time as the wall clock now puts
    it, so a clock step (NTP syncing a VM's or container's clock) changed a live holder's
    identity and its lock was taken over as stale."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        pass
    else:
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": state is field 3
        return f"{boot}/{fields[19]}" if len(fields) > 19 else None  # starttime: field 22
    if Path("/proc/self/stat").is_file():  # Linux, and ``pid`` unreadable or gone
        return None
    try:
        return f"{psutil.Process(pid).create_time():.2f}"
    except (psutil.Error, OSError):
        return None


def _lock_text() -> str:
    r"""The content of a lock this process holds: its pid on the first line (what a user reads),
    then the host it runs on and its :func:`_process_identity`."""
    import socket

    lines = [str(os.getpid()), f"host {socket.gethostname()}"]
    identity = _process_identity(os.getpid())
    if identity is not None:
        lines.append(f"process {identity}")
    return "\n".join(lines) + "\n"


def _read_lock(path: Path) -> tuple[int, dict[str, str]] | None:
    r"""The holder a lock file names: its pid (0 for an empty or garbled file: no live holder)
    and the ``host`` / ``process`` it recorded (absent in a lock of an older bo-online, which
    held the pid alone); None if there is no lock file."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return 0, {}  # unreadable: no live holder named
    try:
        pid = int(lines[0].strip()) if lines and lines[0].strip() else 0
    except ValueError:
        return 0, {}
    fields = dict(line.strip().partition(" ")[::2] for line in lines[1:] if line.strip())
    return pid, fields


@contextlib.contextmanager
def _guard(directory: Path) -> Iterator[None]:
    r"""Hold an exclusive OS lock (``fcntl.flock``) on ``directory`` itself for the block: the
    OS releases it if the process dies, so it is never left stale, and it needs no file of its
    own (nothing to remove, no permission to write). The run lock stays a file naming its
    holder's pid (what the messages and a user read); this guard makes checking and taking it
    one step between processes. Where ``fcntl`` or ``flock`` is missing (Windows, some network
    file systems) the block runs unguarded."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - a directory that can be written but not read
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # waits only while another process checks the lock
        except OSError:  # pragma: no cover - e.g. ENOLCK on NFS without a lock daemon
            pass
        yield
    finally:
        os.close(fd)  # releases the flock


class RunLock:
    r"""An advisory lock on a run directory: the file ``.lock`` holding the holder's pid (first
    line), the host it runs on and its start time (:func:`_lock_text`).

    :meth:`acquire` checks and takes it under a short OS-level guard (:func:`_guard`), so one
    process of many racing wins; if it exists and names a live process other than this one, the
    directory is in use and :class:`RunFileError` is raised; a lock left by a dead process
    (killed, crashed), empty or unreadable, is stale and taken over, and so is one whose pid now
    names another process (reused since the crash, or after a reboot). A lock taken on another
    host (a directory on a shared file system, or copied from there) is refused: whether its
    process lives cannot be seen from here. Re-acquiring in the holder is a no-op.

    Several objects of one process (two loops on one run directory) share the lock file; it is
    removed when the last of them releases it (a count per directory in this process), so one
    loop's release does not free the directory while another still holds it.
    """

    #: lock file -> number of this process's RunLock objects holding it
    _holders: ClassVar[dict[Path, int]] = {}

    def __init__(self, out_dir: Path) -> None:
        self.path = Path(out_dir) / LOCK_FILE
        self._key = Path(os.path.abspath(self.path))  # one entry however the directory is named
        self.held = False

    def acquire(self) -> None:
        if self.held:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _guard(self.path.parent):
            # Under the guard, reading the lock and replacing a stale one is one step for every
            # process that goes through here, so two cannot both take a stale lock.
            found = _read_lock(self.path)
            if found is not None:
                holder, fields = found
                if self._foreign(fields):
                    raise RunFileError(
                        f"The run directory {str(self.path.parent)!r} is locked by process "
                        f"{holder} on the host {fields['host']!r} (lock {str(self.path)!r}), "
                        "whose processes this machine cannot see; wait for that run to finish "
                        "or stop it. If no such run is going on (e.g. the directory was copied "
                        "from there), delete the lock file."
                    )
                if holder == os.getpid() and self._same_process(holder, fields):
                    self._held()  # another object of this process holds it (or held it)
                    return
                if _pid_alive(holder) and self._same_process(holder, fields):
                    raise RunFileError(
                        f"The run directory {str(self.path.parent)!r} is in use by process "
                        f"{holder} (lock {str(self.path)!r}); wait for it to finish or stop it. "
                        "If no such run is going on, delete the lock file."
                    )
            # Absent, or stale (its process is gone, or its pid now names another process):
            # written whole (rename), never seen empty.
            _atomic_write(self.path, lambda f: f.write(_lock_text()), False)
        self._held()

    def _held(self) -> None:
        import atexit

        self.held = True
        self._holders[self._key] = self._holders.get(self._key, 0) + 1
        atexit.register(self.release)  # a loop driven by step() holds the lock to exit

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        left = self._holders.get(self._key, 1) - 1
        if left > 0:  # another object of this process still holds the directory
            self._holders[self._key] = left
            return
        self._holders.pop(self._key, None)
        found = _read_lock(self.path)
        if found is not None and found[0] == os.getpid() and self._same_process(*found):
            with contextlib.suppress(OSError):
                self.path.unlink()

    @staticmethod
    def _foreign(fields: dict[str, str]) -> bool:
        """Whether a lock was taken on another host (whose pids say nothing here)."""
        import socket

        return "host" in fields and fields["host"] != socket.gethostname()

    @staticmethod
    def _same_process(pid: int, fields: dict[str, str]) -> bool:
        r"""Whether the process now running as ``pid`` (this one, or a live holder) is the one
        that wrote a lock naming ``pid``: unknown for a lock of an older bo-online (pid alone:
        assumed so), false when the pid has since been reused by another process (a crashed
        run's pid, given to a new process or after a reboot). Where the identity cannot be
        read now, it is assumed to be the one."""
        identity, now = fields.get("process"), _process_identity(pid)
        return identity is None or now is None or identity == now


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
