r"""Cost of checkpointing: a TSVGP stream with a checkpoint after every step vs the default
cadence (by elapsed time, at most every 30 s), interleaved, median of ``--repeats`` runs.

Prints, per cadence, the true elapsed wall time of ``run`` (records and checkpoints written) and
the summed step times, and the ratio of the medians. Data: protein (``BO_ONLINE_DATA_DIR``).

    python benchmarks/bench_checkpoint.py --steps 1400 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from bo_online.loops import StreamingLoop
from bo_online.problems import uci_problem


def one_run(problem, out_dir, checkpoint_every, steps: int) -> tuple[float, float]:
    loop = StreamingLoop(
        problem, model="tsvgp", n_init=100, out_dir=out_dir, checkpoint_every=checkpoint_every
    )
    t0 = time.perf_counter()
    loop.run(steps)
    outside = time.perf_counter() - t0
    assert abs(outside - loop.elapsed) < 0.05 * outside + 0.05, (outside, loop.elapsed)
    return loop.elapsed, loop.wall_time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1400)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dataset", default="protein")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1 (the median of the runs), got {args.repeats}")
    torch.set_num_threads(1)
    problem = uci_problem(args.dataset, max_stream=args.steps + 100, max_test=1000)
    results: dict[str, list[tuple[float, float]]] = {"every step": [], "default (30 s)": []}
    with tempfile.TemporaryDirectory() as tmp:
        # Warm-up: 50 steps, or all of them if fewer (the problem holds only --steps steps).
        one_run(problem, f"{tmp}/warm", None, min(50, args.steps))
        for r in range(args.repeats):  # interleaved
            for name, every in (("every step", 1), ("default (30 s)", None)):
                results[name].append(one_run(problem, f"{tmp}/{r}-{every}", every, args.steps))
                print(
                    f"  run {r} {name}: elapsed {results[name][-1][0]:.2f} s, "
                    f"sum of step times {results[name][-1][1]:.2f} s",
                    flush=True,
                )
    print(f"TSVGP stream on {args.dataset}, {args.steps} steps, q = 1, {args.repeats} runs each")
    print(f"{'cadence':<16} {'elapsed median (min-max) s':>30} {'sum of step times s':>22}")
    for name, rows in results.items():
        el = [e for e, _ in rows]
        st = statistics.median(s for _, s in rows)
        print(
            f"{name:<16} {statistics.median(el):>10.2f} ({min(el):.2f}-{max(el):.2f}) {st:>22.2f}"
        )
    ratio = statistics.median(e for e, _ in results["every step"]) / statistics.median(
        e for e, _ in results["default (30 s)"]
    )
    print(f"ratio every-step / default: {ratio:.2f}x")


if __name__ == "__main__":
    main()
