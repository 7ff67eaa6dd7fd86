r"""Update time of DecoupledSVGP over a long stream (capped bases): mean time of updates 1-100 vs
the last 100, at the model's defaults (256 mean / 128 covariance bases, fit on the first points).

The first fit is on ``--n-init`` points (default 300, more than either cap), so the stream starts
with the bases already at their caps: while n is below them the model is the exact GP on its data
and an update is cheaper (the streaming suite's "first 100" block of a stream that starts at 100
points is such a block).

    python benchmarks/bench_decoupled_updates.py [--n 5000] [--dim 4] [--grow]
        [--mean-bases 256 --cov-bases 128]

``--grow`` also times the pre-cap behaviour (exact conditioning that grows the covariance basis
by one per update, ``max_basis_growth`` unbounded) on the first 800 updates, for comparison.
Times are per-update medians within blocks of 100, printed with their min-max over the blocks'
updates; both blocks are measured in the same process.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from bo_online.models import DecoupledSVGP


def _stream(n: int, d: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    X = torch.rand(n, d, generator=g, dtype=torch.float64)
    Y = torch.sin(3 * X).sum(-1, keepdim=True) + 0.1 * torch.randn(
        n, 1, generator=g, dtype=torch.float64
    )
    return X, Y


def _times(model: DecoupledSVGP, X: torch.Tensor, Y: torch.Tensor) -> list[float]:
    out = []
    for i in range(X.shape[0]):
        t0 = time.perf_counter()
        model.update(X[i : i + 1], Y[i : i + 1])
        out.append(time.perf_counter() - t0)
    return out


def _block(ts: list[float]) -> str:
    return (
        f"mean {1e3 * statistics.mean(ts):.3f} ms, median {1e3 * statistics.median(ts):.3f}"
        f" ms (min {1e3 * min(ts):.3f}, max {1e3 * max(ts):.3f})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000, help="updates in the stream (at least 200)")
    ap.add_argument("--dim", type=int, default=4)
    ap.add_argument("--n-init", type=int, default=300)
    ap.add_argument("--grow", action="store_true", help="also time the growing (pre-cap) path")
    ap.add_argument("--mean-bases", type=int, default=256, help="num_mean_bases (model default)")
    ap.add_argument("--cov-bases", type=int, default=128, help="num_cov_bases (model default)")
    args = ap.parse_args()
    if args.n < 200:
        ap.error(
            f"--n must be at least 200 (got {args.n}): the check compares updates 1-100 with the "
            "last 100, two disjoint blocks"
        )
    if args.grow and args.n < 800:
        ap.error(
            f"--grow times the first 800 updates (blocks 1-100 and 701-800); --n must then be "
            f"at least 800, got {args.n}"
        )
    torch.set_num_threads(1)
    X0, Y0 = _stream(args.n_init, args.dim)
    Xs, Ys = _stream(args.n, args.dim, seed=1)
    bases = {"num_mean_bases": args.mean_bases, "num_cov_bases": args.cov_bases}
    m = DecoupledSVGP(X0, Y0, **bases)
    m.fit(max_iter=50)
    ts = _times(m, Xs, Ys)
    first, last = ts[:100], ts[-100:]
    print(
        f"capped (default): {m.num_beta} covariance / {m.num_alpha} mean bases after "
        f"{args.n} updates"
    )
    print(f"  updates 1-100:            {_block(first)}")
    print(f"  updates {args.n - 99}-{args.n}:      {_block(last)}")
    ratio = statistics.mean(last) / statistics.mean(first)
    print(f"  ratio last/first (means): {ratio:.2f}")
    if args.grow:
        g = DecoupledSVGP(X0, Y0, max_basis_growth=10**9, **bases)
        g.fit(max_iter=50)
        g.set_variational_parameters(g.beta_points, g.L, g.a_beta, g.alpha_points, g.a_alpha)
        tg = _times(g, Xs[:800], Ys[:800])
        print(f"growing (exact conditioning, no cap): {g.num_beta} covariance bases after 800")
        print(f"  updates 1-100:   {_block(tg[:100])}")
        print(f"  updates 701-800: {_block(tg[-100:])}")
    ok = ratio < 1.5 and m.num_beta == m.num_cov_bases and m.num_alpha == m.num_mean_bases
    print("CHECK capped update time flat (last/first < 1.5):", "PASS" if ok else "FAIL")


if __name__ == "__main__":
    main()
