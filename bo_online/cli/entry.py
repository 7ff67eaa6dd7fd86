r"""The console-script entry point :func:`main`: runs a command, turns user errors,
interrupts and warnings into one line each on stderr, with the exit status."""

from __future__ import annotations

import itertools
import re
import sys
from typing import Any

import typer

from bo_online.cli import running
from bo_online.cli.application import CLIError, _fail, app
from bo_online.cli.running import _resume_hint, _stopped


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread so that cleanup (workers, lock) runs."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated()


def main(argv: list[str] | None = None) -> None:
    r"""Console-script entry point. User errors (bad options, missing data, unavailable model)
    print ONE line on stderr and exit with status 2; nothing is written before options are
    validated and the surrogate is built."""
    # SIGTERM is raised as an exception in the main thread, so cleanup (worker processes, the
    # run directory's lock) runs as for Ctrl-C.
    import signal
    import threading
    import warnings

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    previous_showwarning, warnings.showwarning = warnings.showwarning, _show_warning
    _SHOWN_WARNINGS.clear()
    try:
        _main(argv)
    finally:
        warnings.showwarning = previous_showwarning
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    r"""A warning during a command as one line on stderr, ``bo-online: warning: ...`` (Python's
    default format adds the package's file, line number and source line, which say nothing to
    a user of the command), each text once per command: a library's warning raised at every
    step (BoTorch's advice on ``--acq ei``, several lines long) filled the terminal."""
    text = " ".join(str(message).split())  # one line: a multi-line text's breaks and tabs
    if (category.__name__, text) in _SHOWN_WARNINGS:
        return
    _SHOWN_WARNINGS.add((category.__name__, text))
    print(f"bo-online: warning: {text} ({category.__name__})", file=sys.stderr)


#: (category, text) of the warnings :func:`_show_warning` has printed in this command
_SHOWN_WARNINGS: set[tuple[str, str]] = set()


#: one ``lo,hi`` pair of ``--bounds`` (``0,1``, ``-5,5``, ``1e-3,2.5``)
_BOUNDS_PAIR = re.compile(r"^[^,\s]+,[^,\s]+$")


def _unquoted_bounds_hint(args: list[str]) -> str:
    r"""For ``--bounds 0,1 -5,5`` written without quotes, which the shell splits: the pairs after
    the first are "unexpected extra argument(s)", or "No such option: -5" where one starts with
    a minus sign, and the line reads as if they were wrong. The quoted form to give instead, or
    ``""`` when ``args`` has no such ``--bounds``."""
    for i, arg in enumerate(args):
        if arg == "--bounds":
            given = args[i + 1 : i + 2]
        elif arg.startswith("--bounds="):
            given = [arg.partition("=")[2]]
        else:
            continue
        rest = args[i + 1 + (arg == "--bounds") :]
        more = list(itertools.takewhile(_BOUNDS_PAIR.match, rest))
        if given and _BOUNDS_PAIR.match(given[0]) and more:
            return f"; --bounds takes one value: quote it, --bounds '{' '.join(given + more)}'"
    return ""


def _main(argv: list[str] | None) -> None:
    # Typer vendors click; its exception classes live here (ClickException, UsageError) and
    # typer.Abort is what click makes of Ctrl-C (KeyboardInterrupt) and of EOFError.
    from typer._click import exceptions as click_exc

    from bo_online.errors import CampaignError, ObjectiveError

    running._ACTIVE_RUN.clear()  # a run of an earlier command in this process is not this one's
    running._ACTIVE_SWEEP.clear()
    try:
        code = app(args=argv, prog_name="bo-online", standalone_mode=False)
    except click_exc.UsageError as e:
        hint = f" (see bo-online {e.ctx.info_name} --help)" if e.ctx is not None else ""
        _fail(
            e.format_message()
            + hint
            + _unquoted_bounds_hint(sys.argv[1:] if argv is None else argv)
        )
    except click_exc.ClickException as e:
        _fail(e.format_message())
    except typer.Abort:
        _fail(_stopped("interrupted"), 130)
    except ObjectiveError as e:  # the user's objective failed mid-run: its state is saved
        _fail(f"{e}; fix the objective, then {_resume_hint()}", 1)
    except CampaignError as e:  # a campaign of a sweep raised: the message says how to go on
        _fail(str(e), 1)
    except (CLIError, ValueError, FileNotFoundError) as e:
        _fail(str(e))
    except OSError as e:  # e.g. a full disk outside the run directory's own writes
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        # a sweep goes on with the same command (a sweep's folder is no run to resume)
        then = (
            _resume_hint()
            if running._ACTIVE_SWEEP
            else "an interrupted run continues with `bo-online resume OUT_DIR`"
        )
        _fail(f"{e.strerror or e}{where}; free space or fix permissions, then try again ({then}).")
    except SystemExit as e:
        if e.code == 128 + 15:  # a loop that stopped on SIGTERM after writing its checkpoint
            _fail(_stopped("terminated"), 143)
        raise
    except (KeyboardInterrupt, _Terminated) as e:
        # 128 + the signal, as for a loop stopped after its step: 143 for SIGTERM, 130 for Ctrl-C
        if isinstance(e, _Terminated):
            _fail(_stopped("terminated"), 143)
        _fail(_stopped("interrupted"), 130)
    if code == 130:  # typer turns Ctrl-C (KeyboardInterrupt) into a return code of 130
        _fail(_stopped("interrupted"), 130)
    if isinstance(code, int) and code:
        raise SystemExit(code)
