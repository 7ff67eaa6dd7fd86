"""A short end-to-end Bayesian-optimisation demo with OnlineExactGP on Branin.

Sobol start, then qLogEI proposals optimised with BoTorch, evaluated, folded in with
``model.update`` (O(n^2) per step) and refitted every few steps. Prints progress, a summary and
where the records went. The ``bo-online`` command replaces this once the loops exist.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from botorch.acquisition import qLogExpectedImprovement
from botorch.optim import optimize_acqf
from botorch.test_functions import Branin
from torch.quasirandom import SobolEngine

from bo_online.models import OnlineExactGP


def main(steps: int = 20, seed: int = 0, out: str = "runs/demo") -> None:
    torch.manual_seed(seed)
    problem = Branin(negate=True).to(torch.float64)
    lower, upper = problem.bounds
    unit = torch.stack([torch.zeros(2), torch.ones(2)]).to(torch.float64)
    X = SobolEngine(2, scramble=True, seed=seed).draw(5).to(torch.float64)
    Y = problem(lower + (upper - lower) * X).unsqueeze(-1)
    model = OnlineExactGP(X, Y, bounds=unit).fit()
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    records = out_dir / "records.jsonl"
    with records.open("w") as f:
        for step in range(steps):
            t0 = time.perf_counter()
            acq = qLogExpectedImprovement(model, best_f=Y.max())
            x, _ = optimize_acqf(acq, bounds=unit, q=1, num_restarts=4, raw_samples=64)
            y = problem(lower + (upper - lower) * x).unsqueeze(-1)
            model.update(x, y)
            X, Y = torch.cat([X, x]), torch.cat([Y, y])
            if (step + 1) % 5 == 0:
                model.fit(max_iter=50)
            regret = float(-Y.max() - (-problem.optimal_value))
            rec = {"step": step, "n": len(Y), "best": float(-Y.max()), "regret": regret,
                   "seconds": time.perf_counter() - t0}
            f.write(json.dumps(rec) + "\n")
            print(f"step {step:3d}  n={rec['n']:3d}  best Branin value {rec['best']:.4f}  regret {regret:.4f}")
    print(f"records: {records}")


if __name__ == "__main__":
    main()
