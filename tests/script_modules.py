r"""Load a script of ``benchmarks/`` or ``experiments/`` as a module, for the tests of that
script."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(folder: str, name: str) -> ModuleType:
    r"""``<folder>/<name>.py`` as the module ``name`` (registered in ``sys.modules``, so that
    its dataclasses and pickling find it)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_benchmark(name: str) -> ModuleType:
    r"""``benchmarks/<name>.py`` as a module (:func:`load_script`)."""
    return load_script("benchmarks", name)


def load_experiment(name: str) -> ModuleType:
    r"""``experiments/<name>.py`` as a module (:func:`load_script`)."""
    return load_script("experiments", name)
