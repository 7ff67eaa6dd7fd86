r"""Memory of a piece of code, for the tests that check a working set: the peak CPU tensor memory
from the torch profiler's allocation records (:func:`peak_allocated_bytes`: a refit's does not
grow with n) and the largest tensor any op makes (:class:`LargestAllocation`: no ``b x k x k``
per candidate set)."""

from __future__ import annotations

from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode


def peak_allocated_bytes(run: Callable[[], object]) -> int:
    r"""Peak of the running sum of the CPU allocations (signed sizes, in time order) made while
    ``run()`` executes."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
        key=lambda e: e.start_ns(),
    )
    current = peak = 0
    for e in events:
        current += e.nbytes()
        peak = max(peak, current)
    return peak


class LargestAllocation(TorchDispatchMode):
    r"""Within ``with LargestAllocation() as largest:``, ``largest.numel`` is the number of
    elements of the largest tensor any op returns; views of an input (``expand``, ``transpose``,
    ...) allocate nothing and are left out unless ``count_views``."""

    def __init__(self, count_views: bool = False) -> None:
        super().__init__()
        self.count_views = count_views
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.count_views and any(r.alias_info is not None for r in func._schema.returns):
            return out
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out
