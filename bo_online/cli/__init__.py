r"""The ``bo-online`` command: BO, active-learning and streaming runs, resume, sweeps and plots.

Examples::

    bo-online bo --problem branin --model exact --acq logei --steps 25 --out runs/branin
    bo-online bo --problem levy --dim 3 --noise 10 --model wiski --acq qucb --q 3 \
        --steps 1500 --out runs/levy-wiski
    bo-online active --problem magnetometer --model exact --q 6 --steps 50 --out runs/mag
    bo-online stream --problem protein --model exact --steps 2000 --out runs/protein
    bo-online resume runs/levy-wiski
    bo-online plot runs/levy-wiski runs/levy-exact --out plots/levy

Bad options print one line (``bo-online: error: ...``) and exit with status 2 before anything is
written.

One module per command (``bo``, ``active``, ``stream``, ``resume``, ``sweep``, ``plot``), each
registering on the Typer application of :mod:`bo_online.cli.application`; the checks, memory
checks, running and summary helpers they share have modules of their own, and
:mod:`bo_online.cli.entry` holds the entry point.
"""

from __future__ import annotations

# Importing the command modules registers their commands on the application, in this order
# (the order of the help's command list).
# isort: off
from bo_online.cli import bo  # noqa: F401
from bo_online.cli import active  # noqa: F401
from bo_online.cli import stream  # noqa: F401
from bo_online.cli import resume  # noqa: F401
from bo_online.cli import sweep  # noqa: F401
from bo_online.cli import plot  # noqa: F401

# isort: on
from bo_online.cli.application import CLIError, app
from bo_online.cli.entry import main

__all__ = ["CLIError", "app", "main"]
