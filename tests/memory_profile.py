r"""Peak CPU tensor memory of a piece of code, from the torch profiler's allocation records; the
tests that check a refit's working set does not grow with n use it."""

from __future__ import annotations

from typing import Callable

from torch.profiler import ProfilerActivity, profile


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
