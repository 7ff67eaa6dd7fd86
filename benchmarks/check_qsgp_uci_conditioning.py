r"""QSGP at its defaults on UCI sets given in raw feature units (as a user's own data arrive):
fit on the first 100 stream rows, then condition on 4 blocks of 100 without a refit; test RMSE
(in units of the stream's target sd) after each, next to an exact GP (fitted on the same 100
rows, updated the same way). Check: QSGP's RMSE after the last block is below its RMSE after the
fit on every set (conditioning helps rather than hurts).

Run:  BO_ONLINE_DATA_DIR=... PYTHONPATH=. python benchmarks/check_qsgp_uci_conditioning.py [sets]
"""

from __future__ import annotations

import sys

import torch

from bo_online.models import QSGP, OnlineExactGP
from bo_online.problems import uci_problem


def rmse_curve(make, X, y, Xt, yt) -> list[float]:
    model = make(X[:100], y[:100])
    model.fit()
    model.eval()
    out = []
    for i in range(100, 600, 100):
        if i > 100:
            model.update(X[i - 100 : i], y[i - 100 : i])
        with torch.no_grad():
            mu = model.posterior(Xt).mean.squeeze(-1)
        out.append(float((mu - yt).pow(2).mean().sqrt() / y.std()))
    return out


def main() -> None:
    torch.set_num_threads(1)
    sets = sys.argv[1:] or ["pol", "kin40k", "protein", "elevators"]
    ok = True
    print(f"{'set':>10} {'model':>6}  test RMSE / sd after fit, +100, +200, +300, +400")
    for name in sets:
        P = uci_problem(name, max_stream=500, max_test=1000)
        X, y, Xt, yt = P.X_stream, P.y_stream.unsqueeze(-1), P.X_test, P.y_test
        for label, make in (("exact", OnlineExactGP), ("qsgp", QSGP)):
            r = rmse_curve(make, X, y, Xt, yt)
            print(f"{name:>10} {label:>6}  " + " ".join(f"{v:.3f}" for v in r), flush=True)
            if label == "qsgp":
                ok &= r[-1] < r[0]
    print(
        f"CHECK QSGP RMSE after conditioning below RMSE after the fit: {'PASS' if ok else 'FAIL'}"
    )


if __name__ == "__main__":
    main()
